/*-------------------------------------------------------------------------
 *
 * claim.c
 *		idem_claim(): take ownership of an idempotency key, or learn its fate.
 *
 * A claim reads the record first (idem_store_fetch: a primary-key lookup
 * without the executor where privileges allow), so a replay costs one index
 * probe and writes nothing.  That read takes RowExclusiveLock on the table
 * (where the caller may insert; a hot standby grants it too), the lock its
 * writes need: asking for it only after reading under AccessShareLock would
 * deadlock with REINDEX TABLE, which holds ShareLock on the table while it
 * waits for the index.  Only when the key must change hands does it write:
 *
 *	 - no row: INSERT ... ON CONFLICT DO NOTHING.  A concurrent uncommitted
 *	   claim of the same key makes the INSERT wait for that transaction, as
 *	   any unique index does; with wait => false a dirty probe of the primary
 *	   key answers in_progress instead.  If the INSERT finds a committed row
 *	   it inserted nothing and the claim reads again.
 *	 - a row that must be taken over (lease expired, retryable failure) or
 *	   reused (released, or finished and past its retention): lock it with
 *	   SELECT ... FOR NO KEY UPDATE (SKIP LOCKED when wait => false), decide
 *	   again on the locked, newest version, and only then UPDATE it.  Of any
 *	   number of racing takeovers exactly one sees the expired lease after
 *	   taking the lock; the others see the winner's live lease.
 *
 * Under READ COMMITTED every statement takes a fresh snapshot, so the loop
 * converges; under REPEATABLE READ and SERIALIZABLE a row changed or
 * inserted after the transaction's snapshot raises 40001 from the executor
 * (the caller retries the transaction).  The fencing token of a key only
 * ever grows, including when a released or expired record is reused, so an
 * owner that lost its lease can never complete a newer owner's work.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "funcapi.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/guc.h"
#include "utils/rls.h"
#include "utils/timestamp.h"
#include "utils/typcache.h"

#include "extension_objects.h"
#include "idempotency.h"
#include "record_store.h"
#include "removal.h"
#include "stats.h"
#include "tokens.h"
#include "validation.h"

PG_FUNCTION_INFO_V1(idem_claim);

/* Rounds of read-then-write before giving up with 40001; each needs a race. */
#define MAX_CLAIM_ROUNDS 8

typedef enum ClaimOutcome
{
	OUTCOME_NEW,
	OUTCOME_REPLAY,
	OUTCOME_IN_PROGRESS,
	OUTCOME_TAKEOVER,
	OUTCOME_UNKNOWN,
	/* decisions that need the row locked first */
	NEEDS_REUSE,
	NEEDS_TAKEOVER
} ClaimOutcome;

static const char *const outcome_names[] = {
	"new", "replay", "in_progress", "takeover", "unknown"
};

/*
 * Attributes of the claim's result row, the type idem_claim_result; 0.1.0's
 * type lacks the last (0.2.0 added it with ALTER TYPE ... ADD ATTRIBUTE).
 */
enum
{
	OUT_OUTCOME,
	OUT_TOKEN,
	OUT_STATUS,
	OUT_RESPONSE_CODE,
	OUT_RESULT,
	OUT_ERROR,
	OUT_RECOVERY_POINT,
	OUT_LEASE_EXPIRES_AT,
	OUT_ATTEMPTS,
	OUT_EXPIRES_AT,
	OUT_RESPONSE_HEADERS,
	NUM_OUT_COLUMNS
};

static bool
fingerprint_matches(IdemRecord *rec, bytea *fingerprint)
{
	bytea	   *stored = DatumGetByteaPP(rec->values[COL_FINGERPRINT]);

	return VARSIZE_ANY_EXHDR(stored) == VARSIZE_ANY_EXHDR(fingerprint) &&
		memcmp(VARDATA_ANY(stored), VARDATA_ANY(fingerprint),
			   VARSIZE_ANY_EXHDR(fingerprint)) == 0;
}

static void
check_fingerprint(IdemRecord *rec, bytea *fingerprint, text *key, text *scope)
{
	if (!fingerprint_matches(rec, fingerprint))
	{
		idem_count(IDEM_COUNT_FINGERPRINT_CONFLICT);
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_FINGERPRINT_MISMATCH),
				 errmsg("idempotency key \"%s\" was already used for a different request",
						text_to_cstring(key)),
				 errdetail("The request fingerprint differs from the one stored for this key in scope \"%s\".",
						   text_to_cstring(scope)),
				 errhint("Use a new idempotency key for a different request.")));
	}
}

/*
 * What a claim arriving at "now" makes of an existing record.  A finished
 * record past its retention, and a released one, count as absent.  Work that
 * may have had effects never does: an abandoned record (expired lease) is
 * taken over, so its next owner sees the recovery point, however old it is,
 * and an unknown outcome waits for idem_resolve.
 */
static ClaimOutcome
classify(IdemRecord *rec, bytea *fingerprint, TimestampTz now,
		 text *key, text *scope)
{
	bool		retained = DatumGetTimestampTz(rec->values[COL_EXPIRES_AT]) > now;

	switch (rec->status)
	{
		case IDEM_PROCESSING:
			if (rec->nulls[COL_LEASE_EXPIRES_AT])
				return NEEDS_REUSE; /* released by its owner */
			check_fingerprint(rec, fingerprint, key, scope);
			if (DatumGetTimestampTz(rec->values[COL_LEASE_EXPIRES_AT]) > now)
				return OUTCOME_IN_PROGRESS;
			return NEEDS_TAKEOVER;	/* abandoned: possibly half done */
		case IDEM_SUCCEEDED:
			if (!retained)
				return NEEDS_REUSE;
			check_fingerprint(rec, fingerprint, key, scope);
			return OUTCOME_REPLAY;
		case IDEM_FAILED:
			if (!retained)
				return NEEDS_REUSE;
			check_fingerprint(rec, fingerprint, key, scope);
			return DatumGetBool(rec->values[COL_RETRYABLE]) ? NEEDS_TAKEOVER : OUTCOME_REPLAY;
		case IDEM_UNKNOWN:
			check_fingerprint(rec, fingerprint, key, scope);
			return OUTCOME_UNKNOWN;
		default:
			elog(ERROR, "unrecognized idempotency status %d", (int) rec->status);
	}
	pg_unreachable();
}

/* The record STMT_INSERT has just written, without reading it back. */
static void
new_record(IdemRecord *rec, text *scope, text *key, bytea *fingerprint, int64 token,
		   TimestampTz lease_expires_at, TimestampTz now, TimestampTz expires_at)
{
	memset(rec->nulls, true, sizeof(rec->nulls));
#define SET_COLUMN(col, value) (rec->values[col] = (value), rec->nulls[col] = false)
	SET_COLUMN(COL_SCOPE, PointerGetDatum(scope));
	SET_COLUMN(COL_KEY, PointerGetDatum(key));
	SET_COLUMN(COL_FINGERPRINT, PointerGetDatum(fingerprint));
	SET_COLUMN(COL_TOKEN, Int64GetDatum(token));
	SET_COLUMN(COL_LEASE_EXPIRES_AT, TimestampTzGetDatum(lease_expires_at));
	SET_COLUMN(COL_CREATED_AT, TimestampTzGetDatum(now));
	SET_COLUMN(COL_UPDATED_AT, TimestampTzGetDatum(now));
	SET_COLUMN(COL_EXPIRES_AT, TimestampTzGetDatum(expires_at));
	SET_COLUMN(COL_STATUS, idem_status_datum(IDEM_PROCESSING));
	SET_COLUMN(COL_ATTEMPTS, Int32GetDatum(1));
	SET_COLUMN(COL_RETRYABLE, BoolGetDatum(false));
#undef SET_COLUMN
	rec->status = IDEM_PROCESSING;
	rec->found = true;
}

/*
 * The expiry a takeover stores: created_at + retention, so that completion
 * (which shifts it by the time since created_at) lands on completion +
 * retention.  The retention is the claim's own when given, else the one the
 * record was kept with: after a retryable failure that is expires_at -
 * completed_at, before any completion expires_at - created_at.
 */
static TimestampTz
takeover_expiry(IdemRecord *rec, bool retention_given, int64 retention_us)
{
	TimestampTz created = DatumGetTimestampTz(rec->values[COL_CREATED_AT]);
	TimestampTz expires = DatumGetTimestampTz(rec->values[COL_EXPIRES_AT]);

	if (!retention_given)
	{
		TimestampTz since = rec->nulls[COL_COMPLETED_AT] ? created :
			DatumGetTimestampTz(rec->values[COL_COMPLETED_AT]);

		retention_us = expires - since;
	}
	return created + retention_us;
}

/*
 * The result row's descriptor, built once per backend: building it from the
 * function's declaration on every call costs a catalog lookup and a
 * descriptor per claim.  It depends on the function (a different OID, a
 * re-created extension, builds it again) and on its row type, which ALTER
 * EXTENSION UPDATE to 0.2.0 gives an attribute: the type cache's identifier
 * of the type's descriptor tells (a hash lookup).  *natts: 0.1.0's count or
 * NUM_OUT_COLUMNS.
 */
static TupleDesc
claim_result_desc(FunctionCallInfo fcinfo, int *natts)
{
	static TupleDesc desc = NULL;
	static Oid	desc_fn_oid = InvalidOid;
	static uint64 desc_identifier = 0;
	TupleDesc	tupdesc;
	TypeCacheEntry *type;
	MemoryContext old;

	if (desc != NULL && desc_fn_oid == fcinfo->flinfo->fn_oid)
	{
		type = lookup_type_cache(desc->tdtypeid, TYPECACHE_TUPDESC);
		if (type->tupDesc_identifier == desc_identifier)
		{
			*natts = desc->natts;
			return desc;
		}
	}

	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");
	if (tupdesc->natts != NUM_OUT_COLUMNS && tupdesc->natts != OUT_RESPONSE_HEADERS)
		elog(ERROR, "idem_claim must return %d columns", NUM_OUT_COLUMNS);

	old = MemoryContextSwitchTo(TopMemoryContext);
	if (desc != NULL)
		FreeTupleDesc(desc);
	desc = BlessTupleDesc(CreateTupleDescCopy(tupdesc));
	desc_fn_oid = fcinfo->flinfo->fn_oid;
	type = lookup_type_cache(desc->tdtypeid, TYPECACHE_TUPDESC);
	desc_identifier = type->tupDesc_identifier;
	MemoryContextSwitchTo(old);
	*natts = desc->natts;
	return desc;
}

/*
 * The result row.  Only an owner (new, takeover) learns the token: a fencing
 * token handed to a competitor would let it complete someone else's work.
 */
static Datum
claim_result(FunctionCallInfo fcinfo, ClaimOutcome outcome, IdemRecord *rec)
{
	TupleDesc	tupdesc;
	int			natts;
	Datum		values[NUM_OUT_COLUMNS];
	bool		nulls[NUM_OUT_COLUMNS];
	static const struct
	{
		int			out;
		IdemColumn	col;
	}			copied[] = {
		{OUT_STATUS, COL_STATUS},
		{OUT_RESPONSE_CODE, COL_RESPONSE_CODE},
		{OUT_RESULT, COL_RESULT},
		{OUT_ERROR, COL_ERROR},
		{OUT_RECOVERY_POINT, COL_RECOVERY_POINT},
		{OUT_LEASE_EXPIRES_AT, COL_LEASE_EXPIRES_AT},
		{OUT_ATTEMPTS, COL_ATTEMPTS},
		{OUT_EXPIRES_AT, COL_EXPIRES_AT},
		{OUT_RESPONSE_HEADERS, COL_RESPONSE_HEADERS},
	};

	tupdesc = claim_result_desc(fcinfo, &natts);

	memset(nulls, true, sizeof(nulls));
	values[OUT_OUTCOME] = CStringGetTextDatum(outcome_names[outcome]);
	nulls[OUT_OUTCOME] = false;

	if (rec->found)
	{
		for (size_t i = 0; i < lengthof(copied); i++)
		{
			if (copied[i].out >= natts)
				continue;

			values[copied[i].out] = rec->values[copied[i].col];
			nulls[copied[i].out] = rec->nulls[copied[i].col];
		}
		if (outcome == OUTCOME_NEW || outcome == OUTCOME_TAKEOVER)
		{
			values[OUT_TOKEN] = rec->values[COL_TOKEN];
			nulls[OUT_TOKEN] = false;
		}
	}
	else
	{
		/* an uncommitted claim of another transaction: it is processing */
		values[OUT_STATUS] = idem_status_datum(IDEM_PROCESSING);
		nulls[OUT_STATUS] = false;
	}

	return HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls));
}

/*
 * Reuse the locked record rec (STMT_REUSE with args) as a new claim of the
 * key.  The key is never absent, so no epoch is spent: the removal trigger
 * is told which row's DELETE is no removal (removal.c), and told again,
 * however the statement ends, that it is over.  Returns false if the row
 * was not there.
 */
static bool
reuse_record(IdemStore *store, Datum *args, text *scope, text *key, IdemRecord *rec,
			 MemoryContext copy_to)
{
	IdemRemovalReuse saved;
	volatile bool reused = false;

	idem_removal_reuse_begin(&saved, scope, key, DatumGetInt64(rec->values[COL_TOKEN]));
	PG_TRY();
	{
		reused = idem_store_exec(store, STMT_REUSE, args, NULL, false, rec, copy_to);
	}
	PG_FINALLY();
	{
		idem_removal_reuse_end(&saved);
	}
	PG_END_TRY();
	return reused;
}

Datum
idem_claim(PG_FUNCTION_ARGS)
{
	text	   *key = idem_arg_key(fcinfo, 0, "idempotency key");
	bytea	   *fingerprint = idem_arg_fingerprint(fcinfo, 1);
	text	   *scope = idem_arg_scope(fcinfo, 3);
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz lease_expires_at;
	TimestampTz expires_at;
	bool		retention_given = !PG_ARGISNULL(4);
	bool		wait;
	MemoryContext caller_cxt = CurrentMemoryContext;
	Datum		new_args[7];
	IdemStore	store;
	IdemRecord	rec;
	ClaimOutcome outcome = OUTCOME_IN_PROGRESS;
	Datum		result;
	int			round;

	if (PG_ARGISNULL(2))
		lease_expires_at = now + (int64) idem_default_lease_ms * USECS_PER_SEC / 1000;
	else
		lease_expires_at = idem_add_interval(now, PG_GETARG_INTERVAL_P(2), "lease");
	expires_at = idem_retention_expiry(fcinfo, 4, now);
	idem_arg_not_null(fcinfo, 5, "wait");
	wait = PG_GETARG_BOOL(5);

	/* the arguments of STMT_INSERT and STMT_REUSE ($7, the token, set there);
	 * the first two serve the key lookups */
	new_args[0] = PointerGetDatum(scope);
	new_args[1] = PointerGetDatum(key);
	new_args[2] = PointerGetDatum(fingerprint);
	new_args[3] = TimestampTzGetDatum(lease_expires_at);
	new_args[4] = TimestampTzGetDatum(now);
	new_args[5] = TimestampTzGetDatum(expires_at);

	idem_store_open(&store, fcinfo->flinfo->fn_oid);
	store.for_write = true;

	/*
	 * Under tenant isolation a scope outside the session's tenant could only
	 * fail the INSERT's policy check, after a read that finds nothing: say
	 * why at once.
	 */
	idem_store_require_tenant(idem_objects_current()->records, scope, "claim");

	for (round = 0; round < MAX_CLAIM_ROUNDS; round++)
	{
		if (!idem_store_fetch(&store, scope, key, true, &rec, caller_cxt))
		{
			int64		token;

			if (!wait && idem_store_insert_in_progress(idem_objects_current()->records,
													   scope, key))
			{
				outcome = OUTCOME_IN_PROGRESS;
				break;
			}
			token = idem_token_first(idem_objects_current());
			new_args[6] = Int64GetDatum(token);
			if (idem_store_insert_new(&store, new_args))
			{
				int64		later = idem_token_first(idem_objects_current());

				if (later != token)
				{
					/* a purge advanced the epoch while we inserted: move up */
					Datum		retoken[3] = {new_args[0], new_args[1], Int64GetDatum(later)};

					idem_store_exec(&store, STMT_RETOKEN, retoken, NULL, false, NULL, NULL);
					token = later;
				}
				new_record(&rec, scope, key, fingerprint, token,
						   lease_expires_at, now, expires_at);
				outcome = OUTCOME_NEW;
				break;
			}
			continue;			/* committed by someone else meanwhile */
		}

		outcome = classify(&rec, fingerprint, now, key, scope);
		if (outcome != NEEDS_REUSE && outcome != NEEDS_TAKEOVER)
			break;

		/* Lock the newest version and decide again on it. */
		if (!idem_store_exec(&store, wait ? STMT_SELECT_FOR_UPDATE : STMT_SELECT_SKIP_LOCKED,
							 new_args, NULL, false, &rec, caller_cxt))
		{
			/*
			 * Locked by another writer, or deleted meanwhile.  The committed
			 * version is about to be replaced, so none of it is reported:
			 * the answer is the same as for an uncommitted new claim.
			 */
			if (!wait && idem_store_fetch(&store, scope, key, true, &rec, caller_cxt))
			{
				rec.found = false;
				outcome = OUTCOME_IN_PROGRESS;
				break;
			}
			continue;
		}
		outcome = classify(&rec, fingerprint, now, key, scope);
		if (outcome == NEEDS_REUSE)
		{
			new_args[6] = Int64GetDatum(idem_token_next(idem_objects_current(),
														DatumGetInt64(rec.values[COL_TOKEN])));
			if (!reuse_record(&store, new_args, scope, key, &rec, caller_cxt))
				elog(ERROR, "locked idempotency record vanished");
			outcome = OUTCOME_NEW;
		}
		else if (outcome == NEEDS_TAKEOVER)
		{
			Datum		args[6] = {
				PointerGetDatum(scope), PointerGetDatum(key),
				TimestampTzGetDatum(lease_expires_at), TimestampTzGetDatum(now),
				TimestampTzGetDatum(takeover_expiry(&rec, retention_given,
													expires_at - now)),
				Int64GetDatum(idem_token_next(idem_objects_current(),
											  DatumGetInt64(rec.values[COL_TOKEN])))
			};

			if (!idem_store_exec(&store, STMT_TAKEOVER, args, NULL, false, &rec, caller_cxt))
				elog(ERROR, "locked idempotency record vanished");
			outcome = OUTCOME_TAKEOVER;
		}
		break;
	}

	/*
	 * A policy that lets us insert a key but hides its row makes every round
	 * fail the same way: say so instead of blaming concurrency.
	 */
	if (round == MAX_CLAIM_ROUNDS &&
		check_enable_rls(idem_objects_current()->records, InvalidOid, true) == RLS_ENABLED)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("idempotency key \"%s\" exists in scope \"%s\", but row-level security hides it",
						text_to_cstring(key), text_to_cstring(scope)),
				 errdetail("The claim's INSERT conflicts with a row that the policies on idempotency_records do not let this role read."),
				 errhint("Check idempotency.scope and the policies of idempotency_records.")));
	if (round == MAX_CLAIM_ROUNDS)
		ereport(ERROR,
				(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
				 errmsg("could not claim idempotency key \"%s\" because of concurrent changes",
						text_to_cstring(key)),
				 errhint("Retry the transaction.")));

	idem_count(outcome == OUTCOME_NEW ? IDEM_COUNT_CLAIM_NEW :
			   outcome == OUTCOME_REPLAY ? IDEM_COUNT_CLAIM_REPLAY :
			   outcome == OUTCOME_TAKEOVER ? IDEM_COUNT_CLAIM_TAKEOVER :
			   outcome == OUTCOME_UNKNOWN ? IDEM_COUNT_CLAIM_UNKNOWN :
			   IDEM_COUNT_CLAIM_IN_PROGRESS);

	/* rec's values live in caller_cxt; the result row must too */
	idem_store_close(&store);
	result = claim_result(fcinfo, outcome, &rec);
	PG_RETURN_DATUM(result);
}
