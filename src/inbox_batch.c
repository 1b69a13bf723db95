/*-------------------------------------------------------------------------
 *
 * inbox_batch.c
 *		idem_inbox_accept_many and idem_inbox_accept_seq_many: the consumer
 *		inbox for a batch of messages, in one call.
 *
 * idem_inbox_accept_many(consumer, message_ids[], retention, wait) returns
 * the ids that are new to the consumer, each once, in the order of their
 * first appearance in the array.  It arbitrates exactly as idem_inbox_accept
 * (inbox.c) does for each id, with a statement per step for the whole batch
 * instead of one per message:
 *
 *	1. INSERT ... SELECT unnest($2) ON CONFLICT DO NOTHING RETURNING: the new
 *	   ids.  A conflict with another transaction's uncommitted insert (or
 *	   delete) waits for it on the primary key, as any unique index makes it:
 *	   when that commits, the id is a duplicate (or, deleted, is inserted);
 *	   when it rolls back, this insert goes in.
 *	2. For the ids left, UPDATE ... WHERE expires_at <= now: a message past
 *	   its retention counts as new again, under its row lock.
 *	3. For the ids left, SELECT: the live duplicates.
 *	Ids still left vanished in between (a purge committed): another round.
 *
 * Deadlocks: the ids are sorted (in the byte order of collation "C", the
 * primary key's) and made unique before the INSERT, which inserts them in
 * array order; the UPDATE's index scan walks them in the same order.  So two
 * batches that overlap wait for each other's ids in one order, and the one
 * that comes second waits for the first instead of both waiting for each
 * other.  (Several single accepts in one transaction, in an order of the
 * caller's, are the caller's business, as before.)
 *
 * Every check of the arguments, the elements' included, runs before
 * anything is written: a bad element refuses the whole batch.  With
 * wait => false the primary key is probed for every id first (as the single
 * accept probes its one), and an id another transaction holds refuses the
 * batch with 55P03 before anything is inserted.  The loops over the
 * elements check for interrupts, so that a call with a huge array can be
 * cancelled (statement_timeout, pg_cancel_backend) while it checks or probes.
 *
 * idem_inbox_accept_seq_many(consumer, stream, seqs[], accept_gap) gives
 * each number the outcome idem_inbox_accept_seq would give it, called for
 * each in array order: it locks the stream's watermark row once (or inserts
 * it), decides in memory, and updates the row once (see below).
 *
 * The statements are prepared once per backend and kept, like those of
 * record_store.c, for the generation of the extension's objects they were
 * made for; older ones are retired through idem_store_retire_plan, which
 * frees them when no call of the store is running.  The call opens the
 * store for that bookkeeping (and for the probe), and connects SPI itself.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/rls.h"
#include "utils/timestamp.h"

#include "extension_objects.h"
#include "idempotency.h"
#include "record_store.h"
#include "stats.h"
#include "validation.h"

PG_FUNCTION_INFO_V1(idem_inbox_accept_many);
PG_FUNCTION_INFO_V1(idem_inbox_accept_seq_many);

/* Rounds before 40001, as in inbox.c; each needs a purge in between. */
#define MAX_BATCH_ROUNDS 8

#define EQ " OPERATOR(pg_catalog.=) "

typedef enum BatchStatement
{
	BATCH_INSERT,				/* $1 consumer, $2 ids, $3 expiry */
	BATCH_REVIVE,				/* $1 consumer, $2 ids, $3 expiry, $4 now */
	BATCH_EXISTS,				/* $1 consumer, $2 ids */
	BATCH_NUM_STATEMENTS
} BatchStatement;

/* "%s" is the quoted schema. */
static const char *const batch_sql[BATCH_NUM_STATEMENTS] = {
	[BATCH_INSERT] =
	"INSERT INTO %s.idem_inbox (consumer, message_id, expires_at) "
	"SELECT $1, m.id, $3 FROM pg_catalog.unnest($2) AS m(id) "
	"ON CONFLICT (consumer, message_id) DO NOTHING RETURNING message_id",
	[BATCH_REVIVE] =
	"UPDATE %s.idem_inbox SET expires_at = $3 "
	"WHERE consumer" EQ "$1 AND message_id" EQ "ANY ($2) "
	"AND expires_at OPERATOR(pg_catalog.<=) $4 RETURNING message_id",
	[BATCH_EXISTS] =
	"SELECT message_id FROM %s.idem_inbox "
	"WHERE consumer" EQ "$1 AND message_id" EQ "ANY ($2)",
};

static const int batch_nargs[BATCH_NUM_STATEMENTS] = {3, 4, 2};
static const Oid batch_argtypes[4] = {TEXTOID, TEXTARRAYOID, TIMESTAMPTZOID, TIMESTAMPTZOID};

static SPIPlanPtr batch_plans[BATCH_NUM_STATEMENTS];
static uint64 batch_generation = 0;

/* One distinct id of the batch. */
typedef enum IdState
{
	ID_PENDING,
	ID_ACCEPTED,
	ID_DUPLICATE
} IdState;

typedef struct BatchId
{
	const char *data;
	int			len;
	int			pos;			/* of its first appearance in the array */
	IdState		state;
	Datum		datum;
} BatchId;

/* The primary key's order: collation "C" is bytes, then length. */
static int
id_cmp_bytes(const char *a, int alen, const char *b, int blen)
{
	int			r = memcmp(a, b, Min(alen, blen));

	if (r != 0)
		return r;
	return (alen > blen) - (alen < blen);
}

static int
batch_id_cmp(const void *a, const void *b)
{
	const BatchId *x = (const BatchId *) a;
	const BatchId *y = (const BatchId *) b;
	int			r = id_cmp_bytes(x->data, x->len, y->data, y->len);

	return r != 0 ? r : (x->pos > y->pos) - (x->pos < y->pos);
}

/* The distinct id equal to id, in ids[] sorted by batch_id_cmp; or NULL. */
static BatchId *
batch_find(BatchId *ids, int nids, text *id)
{
	const char *data = VARDATA_ANY(id);
	int			len = VARSIZE_ANY_EXHDR(id);
	int			lo = 0;
	int			hi = nids - 1;

	while (lo <= hi)
	{
		int			mid = lo + (hi - lo) / 2;
		int			c = id_cmp_bytes(data, len, ids[mid].data, ids[mid].len);

		if (c == 0)
			return &ids[mid];
		if (c < 0)
			hi = mid - 1;
		else
			lo = mid + 1;
	}
	return NULL;
}

static SPIPlanPtr
batch_plan(BatchStatement stmt, const IdemObjects *objects)
{
	SPIPlanPtr	plan;
	char	   *sql;

	if (batch_generation != objects->generation)
	{
		for (int i = 0; i < BATCH_NUM_STATEMENTS; i++)
		{
			if (batch_plans[i] != NULL)
				idem_store_retire_plan(batch_plans[i]);
			batch_plans[i] = NULL;
		}
		batch_generation = objects->generation;
	}
	if (batch_plans[stmt] != NULL)
		return batch_plans[stmt];

	sql = psprintf(batch_sql[stmt], quote_identifier(NameStr(objects->namespace_name)));
	plan = SPI_prepare(sql, batch_nargs[stmt], (Oid *) batch_argtypes);
	if (plan == NULL)
		elog(ERROR, "SPI_prepare failed for inbox batch statement %d: %s",
			 (int) stmt, SPI_result_code_string(SPI_result));
	if (SPI_keepplan(plan) != 0)
		elog(ERROR, "SPI_keepplan failed for inbox batch statement %d", (int) stmt);
	batch_plans[stmt] = plan;
	return plan;
}

/*
 * Run one statement over the pending ids (indexes into ids[], in key order)
 * and give every id it returns the state "to"; returns how many it did.
 * The pending list is compacted to the ids still pending.  as_given is the
 * caller's array when it is in key order without repeats already: while
 * every id is pending it is passed as it is, without building another.
 */
static int
batch_step(BatchStatement stmt, const IdemObjects *objects, Datum *args,
		   BatchId *ids, int nids, int *pending, int *npending, IdState to,
		   ArrayType *as_given)
{
	Datum	   *elems = NULL;
	int			done = 0;
	int			ret;
	int			kept = 0;

	if (as_given != NULL && *npending == nids)
		args[1] = PointerGetDatum(as_given);
	else
	{
		elems = palloc(sizeof(Datum) * *npending);
		for (int i = 0; i < *npending; i++)
			elems[i] = ids[pending[i]].datum;
		args[1] = PointerGetDatum(construct_array(elems, *npending, TEXTOID, -1, false,
												  TYPALIGN_INT));
	}
	ret = idem_execute_without_seqscan(batch_plan(stmt, objects), args, NULL, false, 0);
	if (ret < 0)
		elog(ERROR, "SPI_execute_plan failed for inbox batch statement %d: %s",
			 (int) stmt, SPI_result_code_string(ret));

	if (stmt == BATCH_INSERT && SPI_processed == (uint64) *npending)
	{
		/* the common case: every id was new */
		for (int i = 0; i < *npending; i++)
			ids[pending[i]].state = to;
		done = *npending;
	}
	else
	{
		for (uint64 r = 0; r < SPI_processed; r++)
		{
			bool		isnull;
			Datum		value = SPI_getbinval(SPI_tuptable->vals[r], SPI_tuptable->tupdesc,
											  1, &isnull);
			BatchId    *found;

			if (isnull)
				continue;
			found = batch_find(ids, nids, DatumGetTextPP(value));
			if (found != NULL && found->state == ID_PENDING)
			{
				found->state = to;
				done++;
			}
		}
	}
	SPI_freetuptable(SPI_tuptable);
	if (elems != NULL)
	{
		pfree(DatumGetPointer(args[1]));
		pfree(elems);
	}

	for (int i = 0; i < *npending; i++)
		if (ids[pending[i]].state == ID_PENDING)
			pending[kept++] = pending[i];
	*npending = kept;
	return done;
}

/*
 * idem_inbox_accept_many(consumer, message_ids, retention, wait) -> SETOF
 * text: the ids new to the consumer.
 */
Datum
idem_inbox_accept_many(PG_FUNCTION_ARGS)
{
	text	   *consumer = idem_arg_key(fcinfo, 0, "consumer");
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	ArrayType  *array;
	Datum	   *elems;
	bool	   *elem_nulls;
	int			nelems;
	int			lbound;
	BatchId    *ids;
	int			nids = 0;
	int		   *pending;
	int			npending;
	bool	   *accepted_at;
	int			naccepted = 0;
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz expires_at;
	Datum		args[4];
	const IdemObjects *objects;
	IdemStore	store;
	bool		in_order = true;

	/* the arguments, every element included, before anything is written */
	idem_arg_not_null(fcinfo, 1, "message_ids");
	array = PG_GETARG_ARRAYTYPE_P(1);
	if (ARR_NDIM(array) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("message_ids must be a one-dimensional array"),
				 errdetail("The array given has %d dimensions.", ARR_NDIM(array))));
	lbound = ARR_NDIM(array) == 1 ? ARR_LBOUND(array)[0] : 1;
	deconstruct_array(array, TEXTOID, -1, false, TYPALIGN_INT, &elems, &elem_nulls, &nelems);

	ids = palloc(sizeof(BatchId) * Max(nelems, 1));
	for (int i = 0; i < nelems; i++)
	{
		text	   *id;
		int			len;

		CHECK_FOR_INTERRUPTS();
		if (elem_nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("message id must not be null"),
					 errdetail("Element %d of message_ids is null.", lbound + i)));
		id = DatumGetTextPP(elems[i]);
		len = VARSIZE_ANY_EXHDR(id);
		if (len == 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("message id must not be empty"),
					 errdetail("Element %d of message_ids is empty.", lbound + i)));
		if (len > idem_max_key_length)
			ereport(ERROR,
					(errcode(ERRCODE_STRING_DATA_RIGHT_TRUNCATION),
					 errmsg("message id is too long"),
					 errdetail("Element %d of message_ids is %d bytes long; idempotency.max_key_length is %d.",
							   lbound + i, len, idem_max_key_length)));
		ids[i].data = VARDATA_ANY(id);
		ids[i].len = len;
		ids[i].pos = i;
		ids[i].state = ID_PENDING;
		ids[i].datum = PointerGetDatum(id);
	}
	expires_at = idem_retention_expiry(fcinfo, 2, now);
	idem_arg_not_null(fcinfo, 3, "wait");

	InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC);
	if (nelems == 0)
		PG_RETURN_NULL();

	/* key order, each id once (its first appearance: pos breaks ties) */
	for (int i = 1; i < nelems && in_order; i++)
		in_order = id_cmp_bytes(ids[i - 1].data, ids[i - 1].len, ids[i].data, ids[i].len) < 0;
	if (!in_order)
		qsort(ids, nelems, sizeof(BatchId), batch_id_cmp);
	for (int i = 0; i < nelems; i++)
		if (nids == 0 || id_cmp_bytes(ids[i].data, ids[i].len,
									  ids[nids - 1].data, ids[nids - 1].len) != 0)
			ids[nids++] = ids[i];

	idem_store_open(&store, fcinfo->flinfo->fn_oid);
	objects = idem_objects_current();

	/* as the single accept: refuse at once, before inserting anything */
	if (!PG_GETARG_BOOL(3))
	{
		for (int i = 0; i < nids; i++)
		{
			text	   *id = DatumGetTextPP(ids[i].datum);

			CHECK_FOR_INTERRUPTS();
			if (idem_store_insert_in_progress(objects->inbox, consumer, id))
				ereport(ERROR,
						(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
						 errmsg("message \"%s\" of consumer \"%s\" is held by another transaction",
								text_to_cstring(id), text_to_cstring(consumer)),
						 errdetail("Another transaction is accepting it, or purging it."),
						 errhint("Retry after that transaction ends, or call with wait => true to wait for it.")));
		}
	}

	pending = palloc(sizeof(int) * nids);
	for (int i = 0; i < nids; i++)
		pending[i] = i;
	npending = nids;

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	store.spi_connected = true; /* idem_store_close finishes it */

	args[0] = PointerGetDatum(consumer);
	args[2] = TimestampTzGetDatum(expires_at);
	args[3] = TimestampTzGetDatum(now);
	for (int round = 0;; round++)
	{
		naccepted += batch_step(BATCH_INSERT, objects, args, ids, nids,
								pending, &npending, ID_ACCEPTED, in_order ? array : NULL);
		if (npending == 0)
			break;
		naccepted += batch_step(BATCH_REVIVE, objects, args, ids, nids,
								pending, &npending, ID_ACCEPTED, in_order ? array : NULL);
		if (npending == 0)
			break;
		batch_step(BATCH_EXISTS, objects, args, ids, nids, pending, &npending, ID_DUPLICATE,
				   NULL);
		if (npending == 0)
			break;

		/* purged since the INSERT looked: insert those again */
		if (round == MAX_BATCH_ROUNDS)
		{
			text	   *id = DatumGetTextPP(ids[pending[0]].datum);

			if (OidIsValid(objects->inbox) &&
				check_enable_rls(objects->inbox, InvalidOid, true) == RLS_ENABLED)
				ereport(ERROR,
						(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
						 errmsg("message \"%s\" of consumer \"%s\" exists, but row-level security hides it",
								text_to_cstring(id), text_to_cstring(consumer)),
						 errdetail("The INSERT conflicts with a row of idem_inbox that its policies do not let this role read."),
						 errhint("Check idempotency.scope and the policies of idem_inbox.")));
			ereport(ERROR,
					(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
					 errmsg("could not accept message \"%s\" because of concurrent changes",
							text_to_cstring(id)),
					 errhint("Retry the transaction.")));
		}
		CHECK_FOR_INTERRUPTS();
	}
	idem_store_close(&store);

	idem_count_add(IDEM_COUNT_INBOX_ACCEPTED, (uint64) naccepted);
	idem_count_add(IDEM_COUNT_INBOX_DUPLICATE, (uint64) (nids - naccepted));

	/* the new ids, in the order of their first appearance */
	accepted_at = palloc0(sizeof(bool) * nelems);
	for (int i = 0; i < nids; i++)
		if (ids[i].state == ID_ACCEPTED)
			accepted_at[ids[i].pos] = true;
	for (int pos = 0; pos < nelems; pos++)
	{
		bool		isnull = false;

		if (accepted_at[pos])
			tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, &elems[pos], &isnull);
	}
	PG_RETURN_NULL();
}

/*
 * idem_inbox_accept_seq_many(consumer, stream, seqs, accept_gap) -> TABLE
 * (seq, outcome): each sequence number's outcome, in array order, exactly
 * as idem_inbox_accept_seq called for each in turn would give it.  The
 * watermark row is locked once (or inserted by the first number, which
 * starts a new stream), the outcomes are worked out in memory, and the row
 * is updated once, with the last watermark.  Only one row is locked, so
 * batches of a stream cannot deadlock among themselves.
 */
Datum
idem_inbox_accept_seq_many(PG_FUNCTION_ARGS)
{
	text	   *consumer = idem_arg_key(fcinfo, 0, "consumer");
	text	   *stream = idem_arg_key(fcinfo, 1, "stream");
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	ArrayType  *array;
	Datum	   *elems;
	bool	   *elem_nulls;
	int			nelems;
	int			lbound;
	bool		accept_gap;
	const char **outcomes;
	int64		watermark = 0;
	int64		locked = 0;
	bool		have_row = false;
	int			first = 0;		/* the first number not decided yet */
	uint64		accepted = 0;
	uint64		duplicates = 0;
	Datum		args[4];
	IdemStore	store;
	int16		typlen;
	bool		typbyval;
	char		typalign;

	idem_arg_not_null(fcinfo, 2, "seqs");
	array = PG_GETARG_ARRAYTYPE_P(2);
	if (ARR_NDIM(array) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("seqs must be a one-dimensional array"),
				 errdetail("The array given has %d dimensions.", ARR_NDIM(array))));
	lbound = ARR_NDIM(array) == 1 ? ARR_LBOUND(array)[0] : 1;
	get_typlenbyvalalign(INT8OID, &typlen, &typbyval, &typalign);
	deconstruct_array(array, INT8OID, typlen, typbyval, typalign, &elems, &elem_nulls, &nelems);
	for (int i = 0; i < nelems; i++)
	{
		CHECK_FOR_INTERRUPTS();
		if (elem_nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("seq must not be null"),
					 errdetail("Element %d of seqs is null.", lbound + i)));
		if (DatumGetInt64(elems[i]) < 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("sequence number must not be negative"),
					 errdetail("Element %d of seqs is %lld.", lbound + i,
							   (long long) DatumGetInt64(elems[i]))));
	}
	idem_arg_not_null(fcinfo, 3, "accept_gap");
	accept_gap = PG_GETARG_BOOL(3);

	InitMaterializedSRF(fcinfo, 0);
	if (nelems == 0)
		PG_RETURN_NULL();

	args[0] = PointerGetDatum(consumer);
	args[1] = PointerGetDatum(stream);
	args[3] = TimestampTzGetDatum(GetCurrentTimestamp());
	outcomes = palloc(sizeof(char *) * nelems);

	idem_store_open(&store, fcinfo->flinfo->fn_oid);
	for (int round = 0; !have_row; round++)
	{
		Datum		value;

		if (round == MAX_BATCH_ROUNDS)
		{
			Oid			streams = get_relname_relid("idem_inbox_streams",
													get_rel_namespace(idem_objects_current()->inbox));

			if (OidIsValid(streams) &&
				check_enable_rls(streams, InvalidOid, true) == RLS_ENABLED)
				ereport(ERROR,
						(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
						 errmsg("stream \"%s\" of consumer \"%s\" exists, but row-level security hides it",
								text_to_cstring(stream), text_to_cstring(consumer)),
						 errdetail("The INSERT conflicts with a row of idem_inbox_streams that its policies do not let this role read."),
						 errhint("Check idempotency.scope and the policies of idem_inbox_streams.")));
			ereport(ERROR,
					(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
					 errmsg("could not accept sequence number %lld of stream \"%s\" because of concurrent changes",
							(long long) DatumGetInt64(elems[0]), text_to_cstring(stream)),
					 errhint("Retry the transaction.")));
		}
		if (idem_store_exec_scalar(&store, STMT_STREAM_LOCK, args, NULL, &value))
		{
			watermark = locked = DatumGetInt64(value);
			have_row = true;
			break;
		}
		/* a new stream: its first number starts it, as in inbox.c */
		args[2] = elems[0];
		if (idem_store_exec(&store, STMT_STREAM_INSERT, args, NULL, false, NULL, NULL))
		{
			watermark = locked = DatumGetInt64(elems[0]);
			outcomes[0] = "new";
			accepted++;
			first = 1;
			have_row = true;
		}
		/* else created concurrently: lock it and look again */
	}

	for (int i = first; i < nelems; i++)
	{
		int64		seq = DatumGetInt64(elems[i]);

		CHECK_FOR_INTERRUPTS();
		if (seq <= watermark)
		{
			outcomes[i] = "duplicate";
			duplicates++;
		}
		else if (seq == watermark + 1 || accept_gap)
		{
			outcomes[i] = (seq == watermark + 1) ? "new" : "gap";
			watermark = seq;
			accepted++;
		}
		else
			outcomes[i] = "gap";	/* refused: counted nowhere */
	}
	if (watermark != locked)
	{
		args[2] = Int64GetDatum(watermark);
		idem_store_exec(&store, STMT_STREAM_SET, args, NULL, false, NULL, NULL);
	}
	idem_store_close(&store);

	idem_count_add(IDEM_COUNT_INBOX_ACCEPTED, accepted);
	idem_count_add(IDEM_COUNT_INBOX_DUPLICATE, duplicates);

	for (int i = 0; i < nelems; i++)
	{
		Datum		values[2];
		bool		nulls[2] = {false, false};

		values[0] = elems[i];
		values[1] = CStringGetTextDatum(outcomes[i]);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	PG_RETURN_NULL();
}
