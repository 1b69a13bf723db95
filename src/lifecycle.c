/*-------------------------------------------------------------------------
 *
 * lifecycle.c
 *		What an owner does with a claimed key, and how outcomes are read.
 *
 * idem_complete, idem_fail, idem_checkpoint, idem_release and
 * idem_mark_unknown act only for the current owner: each is one UPDATE whose
 * WHERE clause requires the caller's fencing token and status 'processing'.
 * The row lock of that UPDATE orders it against a concurrent takeover; under
 * READ COMMITTED the loser re-checks the newest row version and matches
 * nothing, under REPEATABLE READ / SERIALIZABLE it gets 40001.  When nothing
 * matched, the record is read to say why (no such key, stale token, wrong
 * status).  Repeating a complete, fail or mark_unknown that already took
 * effect with the same token and the same values succeeds without change, so
 * a client may retry it after a lost reply.
 *
 * idem_resolve settles an unknown outcome after the caller reconciled it with
 * the authoritative system; it needs no token, since the owner that marked
 * the outcome unknown has given up ownership.
 *
 * idem_complete, idem_fail and idem_resolve save the answer's headers too
 * (0.2.0: their last argument, "headers"); 0.1.0's declarations have no
 * such argument and its table no such column, and the library serves both.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "funcapi.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"

#include "extension_objects.h"
#include "idempotency.h"
#include "record_store.h"
#include "stats.h"
#include "tokens.h"
#include "validation.h"

PG_FUNCTION_INFO_V1(idem_complete);
PG_FUNCTION_INFO_V1(idem_fail);
PG_FUNCTION_INFO_V1(idem_checkpoint);
PG_FUNCTION_INFO_V1(idem_release);
PG_FUNCTION_INFO_V1(idem_mark_unknown);
PG_FUNCTION_INFO_V1(idem_resolve);
PG_FUNCTION_INFO_V1(idem_lookup);

/* The values an owner's call wants to have stored, to recognise a repeat. */
typedef struct OwnerWrite
{
	IdemStatus	status;			/* the status the call moves the record to */
	Datum		result;			/* jsonb compared with COL_RESULT, or 0 */
	Datum		error;			/* jsonb compared with COL_ERROR, or 0 */
	Datum		headers;		/* jsonb compared with COL_RESPONSE_HEADERS, or 0 */
	bool		compare_code;
	Datum		response_code;
	bool		code_null;
	bool		retryable;
} OwnerWrite;

static bool
jsonb_same(Datum stored, bool stored_null, Datum wanted)
{
	if (stored_null || wanted == (Datum) 0)
		return stored_null && wanted == (Datum) 0;
	return DatumGetBool(DirectFunctionCall2(jsonb_eq, stored, wanted));
}

static bool
is_repeat(IdemRecord *rec, const OwnerWrite *write)
{
	if (write == NULL || rec->status != write->status)
		return false;
	if (write->status == IDEM_FAILED &&
		DatumGetBool(rec->values[COL_RETRYABLE]) != write->retryable)
		return false;
	if (write->compare_code &&
		(rec->nulls[COL_RESPONSE_CODE] != write->code_null ||
		 (!write->code_null &&
		  DatumGetInt32(rec->values[COL_RESPONSE_CODE]) != DatumGetInt32(write->response_code))))
		return false;
	return jsonb_same(rec->values[COL_RESULT], rec->nulls[COL_RESULT], write->result) &&
		jsonb_same(rec->values[COL_ERROR], rec->nulls[COL_ERROR], write->error) &&
		jsonb_same(rec->values[COL_RESPONSE_HEADERS], rec->nulls[COL_RESPONSE_HEADERS],
				   write->headers);
}

/*
 * An owner's UPDATE matched nothing: explain why, or return quietly if the
 * call is a repeat of one that already took effect.
 */
static void
explain_owner_miss(IdemStore *store, text *scope, text *key, int64 token, const char *action,
				   const OwnerWrite *write)
{
	IdemRecord	rec;
	int64		current;
	bool		released;

	if (!idem_store_fetch(store, scope, key, true, &rec, CurrentMemoryContext))
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_KEY_NOT_FOUND),
				 errmsg("idempotency key \"%s\" does not exist", text_to_cstring(key)),
				 errdetail("No record has this key in scope \"%s\".", text_to_cstring(scope)),
				 errhint("Claim the key with idem_claim() first.")));

	/*
	 * Release moved the token past the owner's, so the current token of a
	 * released record is one nobody was given.
	 */
	current = DatumGetInt64(rec.values[COL_TOKEN]);
	released = rec.status == IDEM_PROCESSING && rec.nulls[COL_LEASE_EXPIRES_AT];
	if (token != current || released)
	{
		idem_count(IDEM_COUNT_STALE_TOKEN);
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_STALE_TOKEN),
				 errmsg("token %lld is not the current fencing token of idempotency key \"%s\"",
						(long long) token, text_to_cstring(key)),
				 token < current ?
				 errdetail("The key was taken over or released after this token was issued.") :
				 errdetail("No such token was issued for this key."),
				 errhint("Do not apply this attempt's outcome; claim the key again to learn its state.")));
	}

	if (token == current && is_repeat(&rec, write))
		return;

	ereport(ERROR,
			(errcode(ERRCODE_IDEM_INVALID_STATE),
			 errmsg("cannot %s idempotency key \"%s\" because it is not in progress",
					action, text_to_cstring(key)),
			 errdetail("Its status is \"%s\".", idem_status_names[rec.status])));
}

/*
 * Headers to save need the column: 0.2.0's functions on a table without it
 * (dropped by hand) would lose them without a word.
 */
static void
check_headers_column(Datum headers)
{
	if (headers != (Datum) 0 && idem_objects_current()->records_headers == InvalidAttrNumber)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("table \"idempotency_records\" has no column \"response_headers\""),
				 errdetail("The headers could not be saved."),
				 errhint("Reinstall the extension with DROP EXTENSION idempotency; CREATE EXTENSION idempotency;.")));
}

/* Run an owner's statement; args[0..2] are scope, key, token. */
static void
owner_update(FunctionCallInfo fcinfo, IdemStatement stmt, Datum *args,
			 const char *nulls, const char *action, const OwnerWrite *write,
			 IdemRecord *rec)
{
	MemoryContext caller_cxt = CurrentMemoryContext;
	IdemStore	store;

	idem_store_open(&store, fcinfo->flinfo->fn_oid);
	if (write != NULL)
		check_headers_column(write->headers);
	if (!(rec == NULL ? idem_store_update_owned(&store, stmt, args, nulls) :
		  idem_store_exec(&store, stmt, args, nulls, false, rec, caller_cxt)))
		explain_owner_miss(&store, DatumGetTextPP(args[0]), DatumGetTextPP(args[1]),
						   DatumGetInt64(args[2]), action, write);
	idem_store_close(&store);
}

/* A nullable jsonb argument as a datum, or 0 for NULL. */
static Datum
jsonb_arg_or_zero(FunctionCallInfo fcinfo, int argno)
{
	return PG_ARGISNULL(argno) ? (Datum) 0 : PointerGetDatum(PG_GETARG_JSONB_P(argno));
}

Datum
idem_complete(PG_FUNCTION_ARGS)
{
	text	   *key = idem_arg_key(fcinfo, 0, "idempotency key");
	int64		token = idem_arg_token(fcinfo, 1);
	text	   *scope = idem_arg_scope(fcinfo, 4);
	OwnerWrite	write = {IDEM_SUCCEEDED, jsonb_arg_or_zero(fcinfo, 2), (Datum) 0,
		idem_arg_headers(fcinfo, 5),
		true, PG_ARGISNULL(3) ? (Datum) 0 : PG_GETARG_DATUM(3), PG_ARGISNULL(3), false};
	Datum		args[7] = {
		PointerGetDatum(scope), PointerGetDatum(key), Int64GetDatum(token),
		write.result, write.response_code, TimestampTzGetDatum(GetCurrentTimestamp()),
		write.headers
	};
	char		nulls[8] = "       ";

	nulls[3] = PG_ARGISNULL(2) ? 'n' : ' ';
	nulls[4] = PG_ARGISNULL(3) ? 'n' : ' ';
	nulls[6] = write.headers == (Datum) 0 ? 'n' : ' ';
	owner_update(fcinfo, STMT_COMPLETE, args, nulls, "complete", &write, NULL);
	idem_count(IDEM_COUNT_COMPLETED);
	PG_RETURN_VOID();
}

Datum
idem_fail(PG_FUNCTION_ARGS)
{
	text	   *key = idem_arg_key(fcinfo, 0, "idempotency key");
	int64		token = idem_arg_token(fcinfo, 1);
	text	   *scope = idem_arg_scope(fcinfo, 4);
	OwnerWrite	write;
	Datum		args[8];
	char		nulls[9] = "        ";

	idem_arg_not_null(fcinfo, 2, "error");
	idem_arg_not_null(fcinfo, 3, "retryable");
	write = (OwnerWrite) {
		IDEM_FAILED, (Datum) 0, PG_GETARG_DATUM(2), idem_arg_headers(fcinfo, 6),
		true, PG_ARGISNULL(5) ? (Datum) 0 : PG_GETARG_DATUM(5), PG_ARGISNULL(5),
		PG_GETARG_BOOL(3)
	};
	args[0] = PointerGetDatum(scope);
	args[1] = PointerGetDatum(key);
	args[2] = Int64GetDatum(token);
	args[3] = write.error;
	args[4] = BoolGetDatum(write.retryable);
	args[5] = write.response_code;
	args[6] = TimestampTzGetDatum(GetCurrentTimestamp());
	args[7] = write.headers;
	nulls[5] = write.code_null ? 'n' : ' ';
	nulls[7] = write.headers == (Datum) 0 ? 'n' : ' ';
	owner_update(fcinfo, STMT_FAIL, args, nulls, "fail", &write, NULL);
	idem_count(IDEM_COUNT_FAILED);
	PG_RETURN_VOID();
}

Datum
idem_checkpoint(PG_FUNCTION_ARGS)
{
	text	   *key = idem_arg_key(fcinfo, 0, "idempotency key");
	int64		token = idem_arg_token(fcinfo, 1);
	text	   *scope = idem_arg_scope(fcinfo, 4);
	TimestampTz now = GetCurrentTimestamp();
	Datum		args[6];
	char		nulls[7] = "      ";
	IdemRecord	rec;

	args[0] = PointerGetDatum(scope);
	args[1] = PointerGetDatum(key);
	args[2] = Int64GetDatum(token);
	args[3] = PG_ARGISNULL(2) ? (Datum) 0 : PG_GETARG_DATUM(2);
	nulls[3] = PG_ARGISNULL(2) ? 'n' : ' ';
	if (PG_ARGISNULL(3))
	{
		args[4] = (Datum) 0;
		nulls[4] = 'n';
	}
	else
		args[4] = TimestampTzGetDatum(idem_add_interval(now, PG_GETARG_INTERVAL_P(3),
														"extend_lease"));
	args[5] = TimestampTzGetDatum(now);

	owner_update(fcinfo, STMT_CHECKPOINT, args, nulls, "checkpoint", NULL, &rec);
	PG_RETURN_DATUM(rec.values[COL_LEASE_EXPIRES_AT]);
}

Datum
idem_release(PG_FUNCTION_ARGS)
{
	text	   *key = idem_arg_key(fcinfo, 0, "idempotency key");
	int64		token = idem_arg_token(fcinfo, 1);
	text	   *scope = idem_arg_scope(fcinfo, 2);
	Datum		args[5] = {
		PointerGetDatum(scope), PointerGetDatum(key), Int64GetDatum(token),
		TimestampTzGetDatum(GetCurrentTimestamp()), (Datum) 0
	};

	args[4] = Int64GetDatum(idem_token_next(idem_objects(fcinfo->flinfo->fn_oid), token));
	owner_update(fcinfo, STMT_RELEASE, args, NULL, "release", NULL, NULL);
	PG_RETURN_VOID();
}

Datum
idem_mark_unknown(PG_FUNCTION_ARGS)
{
	text	   *key = idem_arg_key(fcinfo, 0, "idempotency key");
	int64		token = idem_arg_token(fcinfo, 1);
	text	   *scope = idem_arg_scope(fcinfo, 3);
	OwnerWrite	write;
	Datum		args[5];

	idem_arg_not_null(fcinfo, 2, "detail");
	write = (OwnerWrite) {IDEM_UNKNOWN, (Datum) 0, PG_GETARG_DATUM(2), (Datum) 0, false, 0, true, false};
	args[0] = PointerGetDatum(scope);
	args[1] = PointerGetDatum(key);
	args[2] = Int64GetDatum(token);
	args[3] = write.error;
	args[4] = TimestampTzGetDatum(GetCurrentTimestamp());
	owner_update(fcinfo, STMT_MARK_UNKNOWN, args, NULL, "mark unknown", &write, NULL);
	idem_count(IDEM_COUNT_MARKED_UNKNOWN);
	PG_RETURN_VOID();
}

/*
 * idem_resolve(key, status, result, response_code, scope, retryable[, headers]):
 * 'succeeded' saves result as the result; 'failed' saves it as the error, and
 * retryable => true lets the next claim take the key over and redo the work
 * (use it when reconciliation proved the effect did not happen).
 */
Datum
idem_resolve(PG_FUNCTION_ARGS)
{
	text	   *key = idem_arg_key(fcinfo, 0, "idempotency key");
	text	   *scope = idem_arg_scope(fcinfo, 4);
	IdemStatus	target = IDEM_NUM_STATUSES;
	bool		retryable;
	Datum		payload = jsonb_arg_or_zero(fcinfo, 2);
	Datum		headers = idem_arg_headers(fcinfo, 6);
	Datum		args[9];
	char		nulls[10] = "         ";
	IdemStore	store;
	IdemRecord	rec;

	idem_arg_not_null(fcinfo, 1, "status");
	idem_arg_not_null(fcinfo, 5, "retryable");
	retryable = PG_GETARG_BOOL(5);

	idem_store_open(&store, fcinfo->flinfo->fn_oid);
	for (int i = 0; i < IDEM_NUM_STATUSES; i++)
		if (PG_GETARG_DATUM(1) == idem_status_datum((IdemStatus) i))
			target = (IdemStatus) i;
	if (target != IDEM_SUCCEEDED && target != IDEM_FAILED)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("cannot resolve an unknown outcome to status \"%s\"",
						target < IDEM_NUM_STATUSES ? idem_status_names[target] : "?"),
				 errhint("Resolve it to \"succeeded\" or \"failed\".")));
	if (target == IDEM_SUCCEEDED && retryable)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("a succeeded outcome cannot be retryable"),
				 errhint("Pass retryable => true only with status \"failed\".")));
	check_headers_column(headers);

	args[0] = PointerGetDatum(scope);
	args[1] = PointerGetDatum(key);
	args[2] = PG_GETARG_DATUM(1);
	args[3] = target == IDEM_SUCCEEDED ? payload : (Datum) 0;
	args[4] = target == IDEM_FAILED ? payload : (Datum) 0;
	args[5] = PG_ARGISNULL(3) ? (Datum) 0 : PG_GETARG_DATUM(3);
	args[6] = BoolGetDatum(retryable);
	args[7] = TimestampTzGetDatum(GetCurrentTimestamp());
	args[8] = headers;
	nulls[3] = args[3] == (Datum) 0 ? 'n' : ' ';
	nulls[8] = headers == (Datum) 0 ? 'n' : ' ';
	nulls[4] = args[4] == (Datum) 0 ? 'n' : ' ';
	nulls[5] = PG_ARGISNULL(3) ? 'n' : ' ';

	if (!idem_store_exec(&store, STMT_RESOLVE, args, nulls, false, NULL, CurrentMemoryContext))
	{
		if (!idem_store_fetch(&store, scope, key, true, &rec, CurrentMemoryContext))
			ereport(ERROR,
					(errcode(ERRCODE_IDEM_KEY_NOT_FOUND),
					 errmsg("idempotency key \"%s\" does not exist", text_to_cstring(key)),
					 errdetail("No record has this key in scope \"%s\".",
							   text_to_cstring(scope))));
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_INVALID_STATE),
				 errmsg("idempotency key \"%s\" has no unknown outcome to resolve",
						text_to_cstring(key)),
				 errdetail("Its status is \"%s\".", idem_status_names[rec.status])));
	}
	idem_store_close(&store);
	idem_count(IDEM_COUNT_RESOLVED);
	PG_RETURN_VOID();
}

/*
 * idem_lookup(key, scope): the record as stored, expired or not; no row when
 * there is none.  Read-only, so it runs on a hot standby.
 */
Datum
idem_lookup(PG_FUNCTION_ARGS)
{
	text	   *key = idem_arg_key(fcinfo, 0, "idempotency key");
	text	   *scope = idem_arg_scope(fcinfo, 1);
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	MemoryContext caller_cxt = CurrentMemoryContext;
	IdemStore	store;
	IdemRecord	rec;

	InitMaterializedSRF(fcinfo, 0);
	/* before reading: the SPI path would not notice an added column */
	idem_check_record_shape(rsinfo->setDesc);

	idem_store_open(&store, fcinfo->flinfo->fn_oid);
	idem_store_fetch(&store, scope, key, false, &rec, caller_cxt);
	idem_store_close(&store);

	if (rec.found)
		idem_put_record(rsinfo, &rec);
	return (Datum) 0;
}
