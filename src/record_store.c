/*-------------------------------------------------------------------------
 *
 * record_store.c
 *		Prepared statements over @extschema@.idempotency_records.
 *
 * Every read and write of a record goes through one of the statements below,
 * executed with SPI.  That keeps the table an ordinary table: the caller's
 * privileges, row-level security and triggers apply, and the statements get
 * the executor's unique-index, row-locking and EvalPlanQual behaviour under
 * every isolation level.  The exceptions do the same without SPI where that
 * is provably the same: the primary-key read (idem_store_fetch), the new
 * record's INSERT, idem_complete's UPDATE and the inbox's INSERT
 * (direct_write.c, which says when it applies; otherwise the statement runs).
 *
 * Each statement is prepared once per backend, on first use, and kept with
 * SPI_keepplan.  The SQL is search_path-proof: the table is qualified with
 * the extension's schema and every operator is spelled OPERATOR(pg_catalog.x),
 * so objects planted in another schema on the caller's search_path are never
 * resolved.  The schema is found from the OID of the calling function (the
 * functions live in @extschema@).  A change to that schema or to the
 * extension's status type (DROP and CREATE EXTENSION, ALTER SCHEMA ... RENAME)
 * invalidates the cache through a syscache callback, and the next call
 * prepares again.  Changes to the table itself need nothing from us: the plan
 * cache re-plans saved plans when a relation they use changes (REINDEX,
 * VACUUM FULL, CLUSTER, pg_repack, ANALYZE).
 *
 * Old plans are not freed at once.  A call of the store may run a trigger or
 * a function that calls the store again (nesting), and the inner call may be
 * the one to find the objects changed while the outer call is executing one
 * of the old plans.  So plans of an older generation (and idem_transition's
 * replaced plans) are retired, and freed only when no call of the store is
 * running: when the outermost call closes, or at its next open after an
 * error skipped the close (the count of running calls starts again from
 * zero at the end of every transaction; no call spans one).
 *
 * The direct reads (idem_store_fetch, idem_store_insert_in_progress) find
 * the primary key from the table's relcache entry, never from a cached OID:
 * REINDEX CONCURRENTLY gives the index a new OID, and the relcache entry of
 * the table, which we hold locked, names the current one.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/nbtree.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_collation.h"
#include "catalog/pg_operator.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "lib/stringinfo.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/fmgrprotos.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "optimizer/cost.h"
#include "parser/parse_func.h"
#include "rewrite/rowsecurity.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/rls.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

#include "direct_write.h"
#include "extension_objects.h"
#include "idempotency.h"
#include "pg_compat.h"
#include "record_store.h"

const char *const idem_status_names[IDEM_NUM_STATUSES] = {
	"processing", "succeeded", "failed", "unknown"
};

/*
 * The columns, in IdemColumn order, as every statement returns them.  "@H@"
 * stands for response_headers, or NULL where the table has none (0.1.0).
 */
#define RECORD_COLUMNS \
	"scope, key, fingerprint, token, lease_expires_at, created_at, updated_at, " \
	"completed_at, expires_at, purge_after, status, attempts, response_code, retryable, " \
	"recovery_point, result, error, @H@"

#define EQ " OPERATOR(pg_catalog.=) "
#define BY_KEY " WHERE scope" EQ "$1 AND key" EQ "$2 "
/* owned: processing and not released (a released record has no lease) */
#define IS_OWNED " AND status" EQ "'processing' AND lease_expires_at IS NOT NULL"
/*
 * Retention counts from completion.  While a record is processing,
 * expires_at - created_at is its retention; finishing shifts the deadline by
 * the time the work took, which makes it completion + retention.
 */
#define SHIFT_EXPIRY(now) \
	"expires_at = expires_at OPERATOR(pg_catalog.+) (" now " OPERATOR(pg_catalog.-) created_at)"

/*
 * In sql, "@S@" stands for the quoted schema, "@H@" as above, and the text
 * between "@H{" and "}@" is kept only where the table has response_headers
 * (a parameter it alone uses is then unused, which SPI_prepare allows).
 */
#define MAX_STATEMENT_ARGS 10

typedef struct StatementSpec
{
	const char *sql;
	int			nargs;
	Oid			argtypes[MAX_STATEMENT_ARGS];	/* InvalidOid = the idem_status type */
} StatementSpec;

static const StatementSpec statement_specs[IDEM_NUM_STATEMENTS] = {
	[STMT_SELECT] = {
		"SELECT " RECORD_COLUMNS " FROM @S@.idempotency_records" BY_KEY,
		2, {TEXTOID, TEXTOID}
	},
	[STMT_SELECT_FOR_UPDATE] = {
		"SELECT " RECORD_COLUMNS " FROM @S@.idempotency_records" BY_KEY
		"FOR NO KEY UPDATE",
		2, {TEXTOID, TEXTOID}
	},
	[STMT_SELECT_SKIP_LOCKED] = {
		"SELECT " RECORD_COLUMNS " FROM @S@.idempotency_records" BY_KEY
		"FOR NO KEY UPDATE SKIP LOCKED",
		2, {TEXTOID, TEXTOID}
	},
	/*
	 * $3 fingerprint, $4 lease expiry, $5 now, $6 expiry, $7 first token
	 * (idem_token_first).
	 */
	[STMT_INSERT] = {
		"INSERT INTO @S@.idempotency_records (scope, key, fingerprint, token, "
		"lease_expires_at, created_at, updated_at, expires_at, purge_after, status, "
		"attempts) VALUES ($1, $2, $3, $7, $4, $5, $5, $6, $6, 'processing', 1) "
		"ON CONFLICT (scope, key) DO NOTHING",
		7, {TEXTOID, TEXTOID, BYTEAOID, TIMESTAMPTZOID, TIMESTAMPTZOID, TIMESTAMPTZOID,
		INT8OID}
	},
	/* $3 token: a new record of this transaction moves to a later epoch */
	[STMT_RETOKEN] = {
		"UPDATE @S@.idempotency_records SET token = $3" BY_KEY,
		3, {TEXTOID, TEXTOID, INT8OID}
	},
	/*
	 * Same arguments, $7 the next token (idem_token_next).  The old row goes
	 * and a new one comes in one statement: the records' state machine has
	 * no move from a finished status back to processing, and a new row is
	 * what an absent record is.  The token keeps growing, so old owners stay
	 * fenced off.
	 */
	[STMT_REUSE] = {
		"WITH old AS (DELETE FROM @S@.idempotency_records" BY_KEY "RETURNING token) "
		"INSERT INTO @S@.idempotency_records (scope, key, fingerprint, token, "
		"lease_expires_at, created_at, updated_at, expires_at, purge_after, status, "
		"attempts) SELECT $1, $2, $3, GREATEST(old.token OPERATOR(pg_catalog.+) 1, $7), "
		"$4, $5, $5, $6, $6, 'processing', 1 FROM old RETURNING " RECORD_COLUMNS,
		7, {TEXTOID, TEXTOID, BYTEAOID, TIMESTAMPTZOID, TIMESTAMPTZOID, TIMESTAMPTZOID,
		INT8OID}
	},
	/*
	 * $3 lease expiry, $4 now, $5 expiry (created_at + retention), $6 the
	 * next token (idem_token_next of the locked row's)
	 */
	[STMT_TAKEOVER] = {
		"UPDATE @S@.idempotency_records SET "
		"token = GREATEST(token OPERATOR(pg_catalog.+) 1, $6), lease_expires_at = $3, "
		"updated_at = $4, completed_at = NULL, status = 'processing', "
		"attempts = attempts OPERATOR(pg_catalog.+) 1, response_code = NULL, "
		"@H{response_headers = NULL, }@"
		"retryable = false, expires_at = $5, purge_after = $5"
		BY_KEY "RETURNING " RECORD_COLUMNS,
		6, {TEXTOID, TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID, TIMESTAMPTZOID, INT8OID}
	},
	/* $3 token, $4 result, $5 response code, $6 now, $7 headers */
	[STMT_COMPLETE] = {
		"UPDATE @S@.idempotency_records SET status = 'succeeded', result = $4, "
		"response_code = $5, @H{response_headers = $7, }@error = NULL, "
		"completed_at = $6, updated_at = $6, lease_expires_at = NULL, " SHIFT_EXPIRY("$6")
		BY_KEY "AND token" EQ "$3" IS_OWNED,
		7, {TEXTOID, TEXTOID, INT8OID, JSONBOID, INT4OID, TIMESTAMPTZOID, JSONBOID}
	},
	/* $3 token, $4 error, $5 retryable, $6 response code, $7 now, $8 headers */
	[STMT_FAIL] = {
		"UPDATE @S@.idempotency_records SET status = 'failed', error = $4, "
		"retryable = $5, response_code = $6, @H{response_headers = $8, }@result = NULL, "
		"completed_at = $7, updated_at = $7, lease_expires_at = NULL, " SHIFT_EXPIRY("$7")
		BY_KEY "AND token" EQ "$3" IS_OWNED,
		8, {TEXTOID, TEXTOID, INT8OID, JSONBOID, BOOLOID, INT4OID, TIMESTAMPTZOID, JSONBOID}
	},
	/* $3 token, $4 recovery point or NULL, $5 lease expiry or NULL, $6 now */
	[STMT_CHECKPOINT] = {
		"UPDATE @S@.idempotency_records SET "
		"recovery_point = COALESCE($4, recovery_point), "
		"lease_expires_at = COALESCE($5, lease_expires_at), updated_at = $6"
		BY_KEY "AND token" EQ "$3" IS_OWNED " RETURNING " RECORD_COLUMNS,
		6, {TEXTOID, TEXTOID, INT8OID, TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID}
	},
	/*
	 * $3 token, $4 now, $5 the next token: changing the token fences off the
	 * releasing owner
	 */
	[STMT_RELEASE] = {
		"UPDATE @S@.idempotency_records SET "
		"token = GREATEST(token OPERATOR(pg_catalog.+) 1, $5), lease_expires_at = NULL, "
		"updated_at = $4"
		BY_KEY "AND token" EQ "$3" IS_OWNED,
		5, {TEXTOID, TEXTOID, INT8OID, TIMESTAMPTZOID, INT8OID}
	},
	/* $3 token, $4 detail, $5 now */
	[STMT_MARK_UNKNOWN] = {
		"UPDATE @S@.idempotency_records SET status = 'unknown', error = $4, "
		"lease_expires_at = NULL, updated_at = $5"
		BY_KEY "AND token" EQ "$3" IS_OWNED,
		5, {TEXTOID, TEXTOID, INT8OID, JSONBOID, TIMESTAMPTZOID}
	},
	/*
	 * $3 status, $4 result, $5 error, $6 response code, $7 retryable, $8 now,
	 * $9 headers
	 */
	[STMT_RESOLVE] = {
		"UPDATE @S@.idempotency_records SET status = $3, result = $4, error = $5, "
		"response_code = $6, @H{response_headers = $9, }@retryable = $7, "
		"completed_at = $8, updated_at = $8, " SHIFT_EXPIRY("$8")
		BY_KEY "AND status" EQ "'unknown'",
		9, {TEXTOID, TEXTOID, InvalidOid, JSONBOID, JSONBOID, INT4OID, BOOLOID,
		TIMESTAMPTZOID, JSONBOID}
	},
	[STMT_INBOX_INSERT] = {
		"INSERT INTO @S@.idem_inbox (consumer, message_id, expires_at) "
		"VALUES ($1, $2, $3) ON CONFLICT (consumer, message_id) DO NOTHING",
		3, {TEXTOID, TEXTOID, TIMESTAMPTZOID}
	},
	/* a message past its retention counts as new: the row lock decides who */
	[STMT_INBOX_REVIVE] = {
		"UPDATE @S@.idem_inbox SET expires_at = $3 "
		"WHERE consumer" EQ "$1 AND message_id" EQ "$2 "
		"AND expires_at OPERATOR(pg_catalog.<=) $4",
		4, {TEXTOID, TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID}
	},
	[STMT_INBOX_EXISTS] = {
		"SELECT 1 FROM @S@.idem_inbox WHERE consumer" EQ "$1 AND message_id" EQ "$2",
		2, {TEXTOID, TEXTOID}
	},
	/* the common case, seq = watermark + 1, in one statement */
	[STMT_STREAM_ADVANCE] = {
		"UPDATE @S@.idem_inbox_streams SET watermark = $3, updated_at = $4 "
		"WHERE consumer" EQ "$1 AND stream" EQ "$2 "
		"AND watermark" EQ "($3 OPERATOR(pg_catalog.-) 1)",
		4, {TEXTOID, TEXTOID, INT8OID, TIMESTAMPTZOID}
	},
	[STMT_STREAM_LOCK] = {
		"SELECT watermark FROM @S@.idem_inbox_streams "
		"WHERE consumer" EQ "$1 AND stream" EQ "$2 FOR UPDATE",
		2, {TEXTOID, TEXTOID}
	},
	[STMT_STREAM_INSERT] = {
		"INSERT INTO @S@.idem_inbox_streams (consumer, stream, watermark, updated_at) "
		"VALUES ($1, $2, $3, $4) ON CONFLICT (consumer, stream) DO NOTHING",
		4, {TEXTOID, TEXTOID, INT8OID, TIMESTAMPTZOID}
	},
	[STMT_STREAM_SET] = {
		"UPDATE @S@.idem_inbox_streams SET watermark = $3, updated_at = $4 "
		"WHERE consumer" EQ "$1 AND stream" EQ "$2",
		4, {TEXTOID, TEXTOID, INT8OID, TIMESTAMPTZOID}
	},

	/*
	 * Purge: lock a batch of expired rows, skipping rows that a claim or an
	 * accept holds, and delete exactly those.  Work that may have had effects
	 * (processing, unknown) is never purged.
	 */
	/*
	 * Records: finished ones, and released ones (given up before any
	 * effect), past their expiry.  They are found through the index on
	 * purge_after (<= expires_at, see the install script); a record whose
	 * purge_after has passed but whose completion moved expires_at later
	 * (work that took long) is read again by each batch until it expires.
	 * The statement advances the token epoch ($3, the sequence's OID: never
	 * a name pasted into a literal) when, and only when, it has rows to
	 * delete; the sequence is not transactional, so the new epoch is visible
	 * before the deletion is (see STMT_INSERT).
	 */
	[STMT_PURGE_RECORDS] = {
		"WITH doomed AS (SELECT ctid FROM @S@.idempotency_records "
		"WHERE purge_after OPERATOR(pg_catalog.<=) $1 "
		"AND expires_at OPERATOR(pg_catalog.<=) $1 "
		"AND (status OPERATOR(pg_catalog.=) ANY ('{succeeded,failed}') "
		"OR (status OPERATOR(pg_catalog.=) 'processing' AND lease_expires_at IS NULL)) "
		"LIMIT $2 FOR UPDATE SKIP LOCKED), "
		"epoch AS (SELECT pg_catalog.nextval($3) "
		"FROM (SELECT FROM doomed LIMIT 1) any_doomed) "
		"DELETE FROM @S@.idempotency_records "
		"WHERE ctid OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT ctid FROM doomed)) "
		"AND EXISTS (SELECT FROM epoch)",
		3, {TIMESTAMPTZOID, INT4OID, REGCLASSOID}
	},
	[STMT_PURGE_INBOX] = {
		"DELETE FROM @S@.idem_inbox WHERE ctid OPERATOR(pg_catalog.=) ANY (ARRAY("
		"SELECT ctid FROM @S@.idem_inbox "
		"WHERE expires_at OPERATOR(pg_catalog.<=) $1 "
		"LIMIT $2 FOR UPDATE SKIP LOCKED))",
		2, {TIMESTAMPTZOID, INT4OID}
	},

	/*
	 * $1 id, $2 now, $3 available at, $4 scope, $5 topic, $6 key, $7 type,
	 * $8 headers, $9 payload.  seq comes from the column's default
	 * (nextval of idem_outbox_seq), drawn after outbox.c locked the key.
	 */
	[STMT_OUTBOX_INSERT] = {
		"INSERT INTO @S@.idem_outbox (id, created_at, available_at, updated_at, "
		"scope, aggregatetype, aggregateid, type, headers, payload) "
		"VALUES ($1, $2, $3, $2, $4, $5, $6, $7, $8, $9)",
		9, {UUIDOID, TIMESTAMPTZOID, TIMESTAMPTZOID, TEXTOID, TEXTOID,
		TEXTOID, TEXTOID, JSONBOID, JSONBOID}
	},

	/*
	 * Outbox: published messages whose publication (updated_at) is older
	 * than $1 = now - idempotency.outbox_retention, found through the BRIN
	 * index on created_at (created_at <= updated_at).  Pending, in-flight
	 * and dead messages are never purged.  A message a relay holds (a
	 * repeated ack) is skipped.
	 */
	[STMT_PURGE_OUTBOX] = {
		"DELETE FROM @S@.idem_outbox WHERE ctid OPERATOR(pg_catalog.=) ANY (ARRAY("
		"SELECT ctid FROM @S@.idem_outbox "
		"WHERE created_at OPERATOR(pg_catalog.<=) $1 "
		"AND status OPERATOR(pg_catalog.=) 'published' "
		"AND updated_at OPERATOR(pg_catalog.<=) $1 "
		"LIMIT $2 FOR UPDATE SKIP LOCKED))",
		2, {TIMESTAMPTZOID, INT4OID}
	},
};

/*
 * Prepared plans, for the generation of extension objects they were made
 * for; "objects" is set by idem_store_open for the duration of a call.
 * retired_plans (in TopMemoryContext) wait for active_calls to reach zero.
 */
static SPIPlanPtr plans[IDEM_NUM_STATEMENTS];
static uint64 plans_generation = 0;
static const IdemObjects *objects;
static List *retired_plans = NIL;
static int	active_calls = 0;

/* A plan that may still be executing in an outer call: free it later. */
void
idem_store_retire_plan(SPIPlanPtr plan)
{
	MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);

	retired_plans = lappend(retired_plans, plan);
	MemoryContextSwitchTo(old);
}

static void
free_retired_plans(void)
{
	ListCell   *lc;

	Assert(active_calls == 0);
	foreach(lc, retired_plans)
		SPI_freeplan((SPIPlanPtr) lfirst(lc));
	list_free(retired_plans);
	retired_plans = NIL;
}

static void
store_xact_callback(XactEvent event, void *arg)
{
	/* an error skips idem_store_close; no call outlives its transaction */
	if (event == XACT_EVENT_COMMIT || event == XACT_EVENT_ABORT ||
		event == XACT_EVENT_PREPARE || event == XACT_EVENT_PARALLEL_COMMIT ||
		event == XACT_EVENT_PARALLEL_ABORT)
		active_calls = 0;
}

static void
retire_plans(void)
{
	for (int i = 0; i < IDEM_NUM_STATEMENTS; i++)
	{
		if (plans[i] != NULL)
			idem_store_retire_plan(plans[i]);
		plans[i] = NULL;
	}
}

static char *
statement_sql(const char *template)
{
	const char *schema = quote_identifier(NameStr(objects->namespace_name));
	bool		headers = objects->records_headers != InvalidAttrNumber;
	bool		skipping = false;
	StringInfoData buf;
	const char *p;

	initStringInfo(&buf);
	for (p = template; *p; p++)
	{
		if (strncmp(p, "@H{", 3) == 0)
		{
			skipping = !headers;
			p += 2;
		}
		else if (strncmp(p, "}@", 2) == 0)
		{
			skipping = false;
			p += 1;
		}
		else if (skipping)
			continue;
		else if (strncmp(p, "@S@", 3) == 0)
		{
			appendStringInfoString(&buf, schema);
			p += 2;
		}
		else if (strncmp(p, "@H@", 3) == 0)
		{
			appendStringInfoString(&buf, headers ? "response_headers" : "NULL::pg_catalog.jsonb");
			p += 2;
		}
		else
			appendStringInfoChar(&buf, *p);
	}
	return buf.data;
}

static SPIPlanPtr
statement_plan(IdemStatement stmt)
{
	const StatementSpec *spec = &statement_specs[stmt];
	Oid			argtypes[MAX_STATEMENT_ARGS];
	SPIPlanPtr	plan;

	if (plans[stmt] != NULL)
		return plans[stmt];

	for (int i = 0; i < spec->nargs; i++)
		argtypes[i] = OidIsValid(spec->argtypes[i]) ? spec->argtypes[i] : objects->status_type;

	plan = SPI_prepare(statement_sql(spec->sql), spec->nargs, argtypes);
	if (plan == NULL)
		elog(ERROR, "SPI_prepare failed for idempotency statement %d: %s",
			 (int) stmt, SPI_result_code_string(SPI_result));
	if (SPI_keepplan(plan) != 0)
		elog(ERROR, "SPI_keepplan failed for idempotency statement %d", (int) stmt);
	plans[stmt] = plan;
	return plan;
}

/*
 * Make sure the statement cache belongs to the schema of the function being
 * called.  No SPI connection yet: a replay that reads directly never needs
 * one.  Every open is paired with idem_store_close on the success path.
 */
void
idem_store_open(IdemStore *store, Oid fn_oid)
{
	static bool callback_registered = false;

	if (!callback_registered)
	{
		RegisterXactCallback(store_xact_callback, NULL);
		callback_registered = true;
	}
	if (active_calls == 0 && retired_plans != NIL)
		free_retired_plans();

	store->spi_connected = false;
	store->for_write = false;
	objects = idem_objects(fn_oid);
	if (plans_generation != objects->generation)
	{
		retire_plans();
		plans_generation = objects->generation;
	}
	active_calls++;
}

void
idem_store_close(IdemStore *store)
{
	if (store->spi_connected)
		SPI_finish();
	store->spi_connected = false;
	if (active_calls > 0 && --active_calls == 0 && retired_plans != NIL)
		free_retired_plans();
}

/*
 * End the store's SPI connection, if any, and so free all of SPI's memory
 * (its result tables live until SPI_finish); the next statement connects
 * again.  A loop of reads that lasts (idem_await's polls) calls this after
 * each, so that its memory stays flat.  CurrentMemoryContext becomes the one
 * current at the connect.
 */
void
idem_store_disconnect(IdemStore *store)
{
	if (store->spi_connected)
		SPI_finish();
	store->spi_connected = false;
}

Datum
idem_status_datum(IdemStatus status)
{
	return ObjectIdGetDatum(objects->status_labels[status]);
}

static IdemStatus
status_from_datum(Datum value)
{
	Oid			label = DatumGetObjectId(value);

	for (int i = 0; i < IDEM_NUM_STATUSES; i++)
		if (objects->status_labels[i] == label)
			return (IdemStatus) i;
	elog(ERROR, "unrecognized idem_status label %u", label);
	pg_unreachable();
}

/*
 * Refuse a row type of idempotency_records that is not the one of the install
 * script (a column added with ALTER TABLE): the store reads and returns
 * records by column position.  The 17 columns of 0.1.0 come first; after
 * them may come dropped attributes (a column added and dropped again, which
 * is harmless) and response_headers, which 0.2.0 added (in a database still
 * on 0.1.0 it is missing).  Returns its attribute number, or 0.  desc is the
 * table's, or the row type of a function returning the table's rows; either
 * costs nothing to get, and the loop reads the attributes' flags only.  The
 * statements of the SPI path name their columns, so they do not see an
 * added column; the direct read and idem_lookup/idem_await would.
 */
AttrNumber
idem_check_record_shape(TupleDesc desc)
{
	int			live = 0;
	bool		in_place = desc->natts >= IDEM_BASE_COLUMNS;
	AttrNumber	headers = InvalidAttrNumber;

	for (int i = 0; i < desc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);

		if (att->attisdropped)
		{
			if (i < IDEM_BASE_COLUMNS)
				in_place = false;
			continue;
		}
		live++;
		if (i < IDEM_BASE_COLUMNS)
			continue;
		if (headers == InvalidAttrNumber && att->atttypid == JSONBOID &&
			strcmp(NameStr(att->attname), "response_headers") == 0)
			headers = i + 1;
		else
			in_place = false;
	}
	if (!in_place)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("table \"idempotency_records\" does not have the columns that extension \"idempotency\" expects"),
				 errdetail("The table has %d columns, and the extension expects its %d columns in the order of its install script.",
						   live, IDEM_BASE_COLUMNS + (headers != InvalidAttrNumber ? 1 : 0)),
				 errhint("Drop the columns added to idempotency_records, and keep such data in a table of your own keyed by (scope, key).")));
	return headers;
}

/*
 * Return rec as a row of rsinfo's materialized result, whose row type is
 * idempotency_records: the columns of 0.1.0 in place, response_headers at
 * its attribute number if the row type has it, NULL for the dropped
 * attributes.  The caller has checked the row type with
 * idem_check_record_shape before reading.
 */
void
idem_put_record(ReturnSetInfo *rsinfo, IdemRecord *rec)
{
	TupleDesc	desc = rsinfo->setDesc;
	AttrNumber	headers = idem_check_record_shape(desc);
	Datum	   *values = palloc(sizeof(Datum) * desc->natts);
	bool	   *nulls = palloc(sizeof(bool) * desc->natts);

	memcpy(values, rec->values, sizeof(Datum) * IDEM_BASE_COLUMNS);
	memcpy(nulls, rec->nulls, sizeof(bool) * IDEM_BASE_COLUMNS);
	for (int i = IDEM_BASE_COLUMNS; i < desc->natts; i++)
	{
		values[i] = (Datum) 0;
		nulls[i] = true;
	}
	if (headers != InvalidAttrNumber)
	{
		values[headers - 1] = rec->values[COL_RESPONSE_HEADERS];
		nulls[headers - 1] = rec->nulls[COL_RESPONSE_HEADERS];
	}
	tuplestore_putvalues(rsinfo->setResult, desc, values, nulls);
}

/*
 * Copy a deformed row's by-reference values into copy_to and decode it.
 * desc describes the first IDEM_BASE_COLUMNS; response_headers is jsonb.
 */
static void
record_keep(IdemRecord *rec, TupleDesc desc, MemoryContext copy_to)
{
	MemoryContext old = MemoryContextSwitchTo(copy_to);

	for (int i = 0; i < IDEM_NUM_COLUMNS; i++)
	{
		bool		byval = false;
		int			len = -1;

		if (i < IDEM_BASE_COLUMNS)
		{
			byval = TupleDescAttr(desc, i)->attbyval;
			len = TupleDescAttr(desc, i)->attlen;
		}
		if (!rec->nulls[i] && !byval)
			rec->values[i] = datumCopy(rec->values[i], false, len);
	}
	MemoryContextSwitchTo(old);

	rec->status = status_from_datum(rec->values[COL_STATUS]);
	rec->found = true;
}

/*
 * Every statement here looks rows up by primary key (purge: by purge_after),
 * and so do idem_transition's (transition.c).  A generic plan made while the
 * table was nearly empty (a new install, or just after a purge and VACUUM)
 * would scan it sequentially, and stay cached while the table grows: a bulk
 * claim in one transaction then turns quadratic.  So these statements are
 * executed, and hence planned, with sequential scans discouraged; the
 * setting is restored however the statement ends.
 */
int
idem_execute_without_seqscan(SPIPlanPtr plan, Datum *args, const char *nulls,
							 bool read_only, long count)
{
	bool		saved_enable_seqscan = enable_seqscan;
	int			ret;

	enable_seqscan = false;
	PG_TRY();
	{
		ret = SPI_execute_plan(plan, args, nulls, read_only, count);
	}
	PG_FINALLY();
	{
		enable_seqscan = saved_enable_seqscan;
	}
	PG_END_TRY();
	return ret;
}

/*
 * Run a statement.  When it returns a row and rec is given, the row is
 * copied into rec, its by-reference values allocated in copy_to so that they
 * outlive SPI_finish.  Returns whether a row came back.
 *
 * read_only runs the statement in the caller's snapshot (for STABLE callers);
 * otherwise each statement takes a fresh snapshot under READ COMMITTED, which
 * the claim's retry loop relies on to see a row that a concurrent claim has
 * just committed.
 */
bool
idem_store_exec(IdemStore *store, IdemStatement stmt, Datum *args,
				const char *nulls, bool read_only, IdemRecord *rec,
				MemoryContext copy_to)
{
	SPIPlanPtr	plan;
	int			ret;
	TupleDesc	desc;

	if (!store->spi_connected)
	{
		if (SPI_connect() != SPI_OK_CONNECT)
			elog(ERROR, "SPI_connect failed");
		store->spi_connected = true;
	}
	plan = statement_plan(stmt);

	ret = idem_execute_without_seqscan(plan, args, nulls, read_only, 0);
	if (ret < 0)
		elog(ERROR, "SPI_execute_plan failed for idempotency statement %d: %s",
			 (int) stmt, SPI_result_code_string(ret));

	if (rec != NULL)
		rec->found = false;
	if (SPI_processed == 0)
		return false;
	if (rec == NULL)
		return true;

	desc = SPI_tuptable->tupdesc;
	Assert(desc->natts == IDEM_NUM_COLUMNS);
	heap_deform_tuple(SPI_tuptable->vals[0], desc, rec->values, rec->nulls);
	record_keep(rec, desc, copy_to);
	return true;
}

/*
 * Can this user read the table without the executor?  Only with a plain
 * table-level SELECT privilege and no row-level security in force: then the
 * executor would return exactly the row the index does.  Everyone else goes
 * through SPI, which applies column privileges and policies.
 */
static bool
direct_read_allowed(AclMode *held)
{
	*held = pg_class_aclmask(objects->records, GetUserId(), ACL_SELECT | ACL_INSERT,
							 ACLMASK_ALL);
	return (*held & ACL_SELECT) != 0 &&
		check_enable_rls(objects->records, InvalidOid, true) != RLS_ENABLED;
}

/*
 * The lock a direct read takes on a table that the call may write next.  A
 * writer that read under AccessShareLock and then asks for RowExclusiveLock
 * deadlocks with REINDEX TABLE, which takes ShareLock on the table (granted
 * beside our AccessShareLock) and then waits for AccessExclusiveLock on the
 * index we are reading.  So a writer takes its write lock first, when it may
 * write (its INSERT would need the privilege anyway).  A hot standby grants
 * RowExclusiveLock too (only stronger modes are refused in recovery), so a
 * claim that only replays still works there.
 */
static LOCKMODE
read_lock(bool for_write, AclMode held)
{
	return for_write && (held & ACL_INSERT) != 0 ? RowExclusiveLock : AccessShareLock;
}

/*
 * Read the record of (scope, key): the claim's and the lookup's first step,
 * so its cost is the cost of a replay.  Where direct_read_allowed(), this is
 * a primary-key index scan without the executor; it sees what a SELECT run
 * through SPI would see: with fresh_snapshot, the snapshot SPI takes for a
 * volatile function (after CommandCounterIncrement, so earlier calls in the
 * same statement are visible; a new one per call under READ COMMITTED),
 * otherwise the caller's active snapshot.  The index and heap access methods
 * take the predicate locks that SERIALIZABLE needs.
 */
bool
idem_store_fetch(IdemStore *store, text *scope, text *key, bool fresh_snapshot,
				 IdemRecord *rec, MemoryContext copy_to)
{
	Relation	heap;
	Relation	index;
	Snapshot	snapshot;
	ScanKeyData skey[2];
	IndexScanDesc scan;
	TupleTableSlot *slot;
	AclMode		held;
	LOCKMODE	lockmode;
	AttrNumber	headers;

	if (!direct_read_allowed(&held))
	{
		Datum		by_key[2] = {PointerGetDatum(scope), PointerGetDatum(key)};

		return idem_store_exec(store, STMT_SELECT, by_key, NULL, !fresh_snapshot,
							   rec, copy_to);
	}

	if (fresh_snapshot)
	{
		CommandCounterIncrement();
		snapshot = RegisterSnapshot(GetTransactionSnapshot());
	}
	else
		snapshot = RegisterSnapshot(GetActiveSnapshot());

	lockmode = read_lock(store->for_write, held);
	heap = table_open(objects->records, lockmode);
	headers = idem_check_record_shape(RelationGetDescr(heap));
	index = index_open(idem_primary_key(heap), AccessShareLock);
	ScanKeyInit(&skey[0], 1, BTEqualStrategyNumber, F_TEXTEQ, PointerGetDatum(scope));
	ScanKeyInit(&skey[1], 2, BTEqualStrategyNumber, F_TEXTEQ, PointerGetDatum(key));

	slot = table_slot_create(heap, NULL);
	scan = idem_index_beginscan(heap, index, snapshot, 2, 0);
	index_rescan(scan, skey, 2, NULL, 0);
	rec->found = index_getnext_slot(scan, ForwardScanDirection, slot);
	if (rec->found)
	{
		slot_getallattrs(slot);
		memcpy(rec->values, slot->tts_values, sizeof(Datum) * IDEM_BASE_COLUMNS);
		memcpy(rec->nulls, slot->tts_isnull, sizeof(bool) * IDEM_BASE_COLUMNS);
		rec->values[COL_RESPONSE_HEADERS] = (Datum) 0;
		rec->nulls[COL_RESPONSE_HEADERS] = true;
		if (headers != InvalidAttrNumber)
		{
			rec->values[COL_RESPONSE_HEADERS] = slot->tts_values[headers - 1];
			rec->nulls[COL_RESPONSE_HEADERS] = slot->tts_isnull[headers - 1];
		}
		record_keep(rec, RelationGetDescr(heap), copy_to);
	}
	index_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	index_close(index, NoLock);
	table_close(heap, NoLock);
	UnregisterSnapshot(snapshot);
	return rec->found;
}

/*
 * The primary key of one of the extension's tables, opened by the caller:
 * from its relcache entry, which REINDEX CONCURRENTLY keeps current (the
 * swap of old and new index invalidates it, and the old index is dropped
 * only after every lock on the table taken before the swap is gone).  After
 * the first call of a relcache entry's life this reads a field.
 */
Oid
idem_primary_key(Relation heap)
{
	Oid			pkey = idem_primary_key_index(heap);

	if (!OidIsValid(pkey))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("table \"%s\" of extension \"idempotency\" has no primary key",
						RelationGetRelationName(heap)),
				 errhint("Reinstall the extension with DROP EXTENSION idempotency; CREATE EXTENSION idempotency;.")));
	return pkey;
}

/*
 * The rule of idem_scope_in_tenant and idem_consumer_in_scope, without the
 * cost of calling a SQL function: the value is the tenant in
 * idempotency.scope, or starts with it and '/'; nothing belongs to an empty
 * or unset tenant.  (Byte order is collation "C", in which the function's
 * range is this prefix.)
 */
static bool
in_tenant(text *value)
{
	const char *tenant = GetConfigOption("idempotency.scope", true, false);
	size_t		tenant_len;
	size_t		len = VARSIZE_ANY_EXHDR(value);
	const char *data = VARDATA_ANY(value);

	if (tenant == NULL || tenant[0] == '\0')
		return false;
	tenant_len = strlen(tenant);
	if (len < tenant_len || memcmp(data, tenant, tenant_len) != 0)
		return false;
	return len == tenant_len || data[tenant_len] == '/';
}

/*
 * Is this policy idem_tenant as the extension makes it: permissive, for all
 * commands and PUBLIC, checking the same test on new rows as on old ones?
 * The test is fn(column) (0.1.0), or (0.2.0) fn(column) OR the role's
 * tenants:
 *
 *     fn(column) OR split_part(column, '/', 1) = ANY ((SELECT roles_fn()))::text[]
 *
 * *role_arm says which.
 */
static bool
is_call_on_column(Expr *expr, Oid fn, AttrNumber column)
{
	FuncExpr   *call = (FuncExpr *) expr;
	Var		   *arg;

	if (call == NULL || !IsA(call, FuncExpr) || call->funcid != fn ||
		list_length(call->args) != 1)
		return false;
	arg = (Var *) linitial(call->args);
	return IsA(arg, Var) && arg->varno == 1 && arg->varlevelsup == 0 &&
		arg->varattno == column;
}

/* split_part(column, '/', 1) = ANY ((SELECT roles_fn()))::text[] */
static bool
is_role_tenants_test(Expr *expr, Oid roles_fn, AttrNumber column)
{
	ScalarArrayOpExpr *saop = (ScalarArrayOpExpr *) expr;
	FuncExpr   *split;
	Var		   *var;
	Const	   *sep;
	Const	   *field;
	SubLink    *sublink;
	Query	   *query;
	TargetEntry *entry;
	FuncExpr   *call;

	if (!OidIsValid(roles_fn) || saop == NULL || !IsA(saop, ScalarArrayOpExpr) ||
		!saop->useOr || saop->opno != TextEqualOperator ||
		list_length(saop->args) != 2)
		return false;
	split = (FuncExpr *) linitial(saop->args);
	if (!IsA(split, FuncExpr) || split->funcid != F_SPLIT_PART ||
		list_length(split->args) != 3)
		return false;
	var = (Var *) linitial(split->args);
	sep = (Const *) lsecond(split->args);
	field = (Const *) lthird(split->args);
	if (!IsA(var, Var) || var->varno != 1 || var->varlevelsup != 0 ||
		var->varattno != column)
		return false;
	if (!IsA(sep, Const) || sep->constisnull || sep->consttype != TEXTOID ||
		strcmp(TextDatumGetCString(sep->constvalue), "/") != 0)
		return false;
	if (!IsA(field, Const) || field->constisnull || field->consttype != INT4OID ||
		DatumGetInt32(field->constvalue) != 1)
		return false;
	sublink = (SubLink *) lsecond(saop->args);
	if (!IsA(sublink, SubLink) || sublink->subLinkType != EXPR_SUBLINK ||
		sublink->testexpr != NULL)
		return false;
	query = (Query *) sublink->subselect;
	if (query == NULL || !IsA(query, Query) || query->commandType != CMD_SELECT ||
		query->rtable != NIL ||
		(query->jointree != NULL && (query->jointree->fromlist != NIL ||
									 query->jointree->quals != NULL)) ||
		query->hasAggs || query->hasSubLinks || query->hasTargetSRFs ||
		query->cteList != NIL || query->groupClause != NIL ||
		query->havingQual != NULL || query->limitCount != NULL ||
		query->limitOffset != NULL || list_length(query->targetList) != 1)
		return false;
	entry = (TargetEntry *) linitial(query->targetList);
	call = (FuncExpr *) entry->expr;
	return IsA(call, FuncExpr) && call->funcid == roles_fn && call->args == NIL;
}

static bool
is_for_all_permissive(RowSecurityPolicy *policy)
{
	return policy->permissive && policy->polcmd == '*';
}

static bool
is_tenant_policy(RowSecurityPolicy *policy, Oid fn, AttrNumber column)
{
	Datum	   *roles;
	int			nroles;

	if (!is_for_all_permissive(policy))
		return false;
	deconstruct_array(policy->roles, OIDOID, sizeof(Oid), true, TYPALIGN_INT,
					  &roles, NULL, &nroles);
	if (nroles != 1 || DatumGetObjectId(roles[0]) != ACL_ID_PUBLIC)
		return false;
	/* both: a narrower USING would hide rows the probe could report */
	return is_call_on_column(policy->qual, fn, column) &&
		is_call_on_column(policy->with_check_qual, fn, column);
}

/*
 * Is this the policy idem_tenant_members as its trigger makes it, and does
 * it apply to the current user (as in rewrite/rowsecurity.c)?
 */
static bool
is_members_policy(RowSecurityPolicy *policy, Oid roles_fn, AttrNumber column,
				  bool *applies)
{
	Datum	   *roles;
	int			nroles;
	int			i;

	if (!is_for_all_permissive(policy) ||
		!is_role_tenants_test(policy->qual, roles_fn, column) ||
		!is_role_tenants_test(policy->with_check_qual, roles_fn, column))
		return false;
	deconstruct_array(policy->roles, OIDOID, sizeof(Oid), true, TYPALIGN_INT,
					  &roles, NULL, &nroles);
	*applies = false;
	for (i = 0; i < nroles; i++)
	{
		Oid			role = DatumGetObjectId(roles[i]);

		if (role == ACL_ID_PUBLIC || has_privs_of_role(GetUserId(), role))
			*applies = true;
	}
	return true;
}

/*
 * Is the value's text before its first '/' one of the tenants that
 * roles_fn() (idem_role_tenants) allows the current role?  The function is
 * the policy's own, called the same way, so the answers agree.
 */
static bool
in_role_tenants(text *value, Oid roles_fn)
{
	size_t		len = VARSIZE_ANY_EXHDR(value);
	const char *data = VARDATA_ANY(value);
	const char *slash = memchr(data, '/', len);
	size_t		first = slash ? (size_t) (slash - data) : len;
	ArrayType  *tenants;
	Datum	   *elems;
	bool	   *nulls;
	int			n;
	int			i;

	tenants = DatumGetArrayTypeP(OidFunctionCall0Coll(roles_fn, DEFAULT_COLLATION_OID));
	deconstruct_array(tenants, TEXTOID, -1, false, TYPALIGN_INT, &elems, &nulls, &n);
	for (i = 0; i < n; i++)
	{
		text	   *t;

		if (nulls[i])
			continue;
		t = DatumGetTextPP(elems[i]);
		if (VARSIZE_ANY_EXHDR(t) == first && memcmp(VARDATA_ANY(t), data, first) == 0)
			return true;
	}
	return false;
}

/*
 * Under row-level security, does the first key column (a record's or an
 * outbox message's scope, an inbox message's consumer) belong to the tenant
 * in idempotency.scope, or
 * (0.2.0) to one of the tenants idem_tenant_members allows the current role?
 *
 * This can be told only while the policies are the extension's: idem_tenant
 * as it comes (its check is the SQL function named here, whose rule
 * in_tenant() repeats, on that column:
 * idem_scope_in_tenant for records and the outbox, idem_consumer_in_scope
 * for the inbox),
 * and besides it only permissive policies for SELECT, UPDATE or DELETE, such
 * as the global reconcilers' (they may widen what a role sees, never narrow
 * what it may insert), and restrictive ones for UPDATE or DELETE, which
 * touch neither what a role inserts nor what it sees (the global
 * reconcilers' unknown-only policy).  An INSERT's checks then pass exactly
 * when the function says yes.  With other policies (a restrictive one per role, say)
 * the answer is IDEM_TENANT_UNKNOWN, and the executor decides as before.
 */
IdemTenantCheck
idem_store_tenant_check(Oid heap_oid, text *key1)
{
	Relation	heap;
	const char *fn_name;
	const char *column_name;
	Oid			argtypes[1] = {TEXTOID};
	Oid			fn;
	Oid			roles_fn;
	AttrNumber	column;
	bool		tenant_policy = false;
	bool		role_arm = false;
	bool		others = false;
	ListCell   *lc;

	if (check_enable_rls(heap_oid, InvalidOid, true) != RLS_ENABLED)
		return IDEM_TENANT_NO_RLS;

	/* the outbox's policies are the records' (0.2.0), on its scope */
	if (heap_oid == objects->records ||
		heap_oid == get_relname_relid("idem_outbox", objects->namespace))
	{
		fn_name = "idem_scope_in_tenant";
		column_name = "scope";
	}
	else if (heap_oid == objects->inbox)
	{
		fn_name = "idem_consumer_in_scope";
		column_name = "consumer";
	}
	else
		return IDEM_TENANT_UNKNOWN;

	fn = LookupFuncName(list_make2(makeString(pstrdup(NameStr(objects->namespace_name))),
								   makeString(pstrdup(fn_name))),
						1, argtypes, true);
	roles_fn = LookupFuncName(list_make2(makeString(pstrdup(NameStr(objects->namespace_name))),
										 makeString(pstrdup("idem_role_tenants"))),
							  0, argtypes, true);
	column = get_attnum(heap_oid, column_name);
	if (!OidIsValid(fn) || column == InvalidAttrNumber)
		return IDEM_TENANT_UNKNOWN;

	heap = table_open(heap_oid, AccessShareLock);
	if (heap->rd_rsdesc != NULL)
	{
		foreach(lc, heap->rd_rsdesc->policies)
		{
			RowSecurityPolicy *policy = (RowSecurityPolicy *) lfirst(lc);
			bool		applies;

			if (!tenant_policy && is_tenant_policy(policy, fn, column))
				tenant_policy = true;
			else if (is_members_policy(policy, roles_fn, column, &applies))
				role_arm = role_arm || applies;
			else if (policy->polcmd == ACL_UPDATE_CHR ||
					 policy->polcmd == ACL_DELETE_CHR)
				continue;
			else if (!policy->permissive || policy->polcmd != ACL_SELECT_CHR)
				others = true;
		}
	}
	table_close(heap, AccessShareLock);
	if (!tenant_policy || others)
		return IDEM_TENANT_UNKNOWN;

	if (in_tenant(key1))
		return IDEM_TENANT_INSIDE;
	if (role_arm && in_role_tenants(key1, roles_fn))
		return IDEM_TENANT_INSIDE;
	return IDEM_TENANT_OUTSIDE;
}

/*
 * Refuse at once a scope outside the session's tenant, which could only fail
 * the INSERT's policy check, and only after the reads and locks before it
 * (a claim's read, an emit's locks, which others may wait for).  The error
 * is about the caller's own setting and scope, not about any row.  call
 * names the function for the hint ("claim", "emit").
 */
void
idem_store_require_tenant(Oid heap_oid, text *scope, const char *call)
{
	const char *tenant;

	if (idem_store_tenant_check(heap_oid, scope) != IDEM_TENANT_OUTSIDE)
		return;
	tenant = GetConfigOption("idempotency.scope", true, false);
	ereport(ERROR,
			(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
			 errmsg("scope \"%s\" does not belong to the tenant of this session",
					text_to_cstring(scope)),
			 tenant == NULL || tenant[0] == '\0' ?
			 errdetail("idempotency.scope is not set.") :
			 errdetail("idempotency.scope is \"%s\": its scopes are \"%s\" and those that start with \"%s/\".",
					   tenant, tenant, tenant),
			 errhint("Set idempotency.scope with SET LOCAL or set_config(..., true) in the transaction of the %s, or allow the role the tenant with idem_grant_tenant.",
					 call)));
}

/*
 * Does another transaction hold an uncommitted insert (or delete) of this
 * two-column key in this primary key?  A claim or an inbox accept with
 * wait => false asks this before inserting, so that it can answer at once
 * instead of waiting on the primary key the way INSERT ... ON CONFLICT would.
 * It probes the primary key with a dirty snapshot, as the executor's own
 * unique checks do.
 *
 * The answer must reveal nothing the blocking INSERT would not.  So the
 * caller needs both INSERT and SELECT on the table (a role with SELECT
 * alone would learn of rows that no SELECT shows it, and its INSERT is
 * refused), and row-level security must not be in force for it: a policy
 * could forbid it that key (the INSERT's WITH CHECK would fail before
 * waiting), and we cannot evaluate the policy on a row not yet inserted.
 * Otherwise this answers false without looking, and the caller goes on as
 * with wait => true: its INSERT waits like any other, or is refused.
 *
 * The exception is tenant isolation with only the extension's policies
 * (idem_store_tenant_check): the INSERT's check is then whether the first key
 * column belongs to the caller's tenant.  When it does, the INSERT would pass
 * its check and wait for this very row, which has the same first column and
 * so is the caller's to read once committed; the probe tells no more than
 * the wait would.  When it does not, no row of the key is the caller's
 * business, and this answers false without looking: the INSERT fails its
 * check at once.
 */
bool
idem_store_insert_in_progress(Oid heap_oid, text *key1, text *key2)
{
	Relation	heap;
	Relation	index;
	SnapshotData dirty;
	ScanKeyData skey[2];
	IndexScanDesc scan;
	TupleTableSlot *slot;
	bool		in_progress = false;

	/* both: pg_class_aclcheck would accept either */
	if (pg_class_aclmask(heap_oid, GetUserId(), ACL_INSERT | ACL_SELECT, ACLMASK_ALL) !=
		(ACL_INSERT | ACL_SELECT))
		return false;
	switch (idem_store_tenant_check(heap_oid, key1))
	{
		case IDEM_TENANT_NO_RLS:
		case IDEM_TENANT_INSIDE:
			break;
		case IDEM_TENANT_OUTSIDE:
		case IDEM_TENANT_UNKNOWN:
			return false;
	}

	/* the caller inserts next: its lock first (see read_lock) */
	heap = table_open(heap_oid, RowExclusiveLock);
	index = index_open(idem_primary_key(heap), AccessShareLock);

	InitDirtySnapshot(dirty);
	ScanKeyInit(&skey[0], 1, BTEqualStrategyNumber, F_TEXTEQ, PointerGetDatum(key1));
	ScanKeyInit(&skey[1], 2, BTEqualStrategyNumber, F_TEXTEQ, PointerGetDatum(key2));

	slot = table_slot_create(heap, NULL);
	scan = idem_index_beginscan(heap, index, &dirty, 2, 0);
	index_rescan(scan, skey, 2, NULL, 0);
	while (index_getnext_slot(scan, ForwardScanDirection, slot))
	{
		if ((TransactionIdIsValid(dirty.xmin) &&
			 !TransactionIdIsCurrentTransactionId(dirty.xmin)) ||
			(TransactionIdIsValid(dirty.xmax) &&
			 !TransactionIdIsCurrentTransactionId(dirty.xmax)))
		{
			in_progress = true;
			break;
		}
	}
	index_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);

	index_close(index, AccessShareLock);
	table_close(heap, NoLock);
	return in_progress;
}

/*
 * Are the records' columns of the types the install script gave them (no
 * typmod, no domain)?  The writes without SPI store C values by position;
 * a column whose type an administrator changed needs the statement's casts,
 * typmod rounding and domain checks, so then the statement runs instead.
 * The shape (names and positions) is checked first.
 */
static bool
records_have_native_types(TupleDesc desc)
{
	static const Oid types[IDEM_BASE_COLUMNS] = {
		[COL_SCOPE] = TEXTOID, [COL_KEY] = TEXTOID, [COL_FINGERPRINT] = BYTEAOID,
		[COL_TOKEN] = INT8OID, [COL_LEASE_EXPIRES_AT] = TIMESTAMPTZOID,
		[COL_CREATED_AT] = TIMESTAMPTZOID, [COL_UPDATED_AT] = TIMESTAMPTZOID,
		[COL_COMPLETED_AT] = TIMESTAMPTZOID, [COL_EXPIRES_AT] = TIMESTAMPTZOID,
		[COL_PURGE_AFTER] = TIMESTAMPTZOID, [COL_STATUS] = InvalidOid,
		[COL_ATTEMPTS] = INT4OID, [COL_RESPONSE_CODE] = INT4OID,
		[COL_RETRYABLE] = BOOLOID, [COL_RECOVERY_POINT] = TEXTOID,
		[COL_RESULT] = JSONBOID, [COL_ERROR] = JSONBOID
	};
	AttrNumber	headers = idem_check_record_shape(desc);

	/* response_headers as the statements were prepared for (not dropped since) */
	if (headers != objects->records_headers)
		return false;
	for (int i = 0; i < IDEM_BASE_COLUMNS; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);
		Oid			type = i == COL_STATUS ? objects->status_type : types[i];

		if (att->atttypid != type || att->atttypmod != -1)
			return false;
	}
	if (headers != InvalidAttrNumber)
	{
		Form_pg_attribute att = TupleDescAttr(desc, headers - 1);

		if (att->atttypid != JSONBOID || att->atttypmod != -1)
			return false;
	}
	return true;
}

/*
 * An INSERT ... ON CONFLICT DO NOTHING of stmt: without SPI where
 * direct_write.c allows it, otherwise the statement.  Returns whether a row
 * was inserted.
 */
static bool
insert_direct_or_exec(IdemStore *store, Oid relid, IdemFillRow fill, IdemStatement stmt,
					  Datum *args, bool seen_absent)
{
	switch (idem_direct_insert(relid, fill, args, seen_absent))
	{
		case IDEM_DIRECT_WRITTEN:
			return true;
		case IDEM_DIRECT_NOT_WRITTEN:
			return false;
		case IDEM_DIRECT_REFUSED:
			break;
	}
	return idem_store_exec(store, stmt, args, NULL, false, NULL, NULL);
}

/*
 * The new record of STMT_INSERT, by position, after the shape check.  args
 * as STMT_INSERT's.
 */
static bool
fill_new_record(TupleDesc desc, Datum *values, bool *nulls, bool *given, void *arg)
{
	Datum	   *args = (Datum *) arg;

	if (!records_have_native_types(desc))
		return false;
#define SET_COLUMN(col, value) \
	(values[col] = (value), nulls[col] = false, given[col] = true)
	SET_COLUMN(COL_SCOPE, args[0]);
	SET_COLUMN(COL_KEY, args[1]);
	SET_COLUMN(COL_FINGERPRINT, args[2]);
	SET_COLUMN(COL_TOKEN, args[6]);
	SET_COLUMN(COL_LEASE_EXPIRES_AT, args[3]);
	SET_COLUMN(COL_CREATED_AT, args[4]);
	SET_COLUMN(COL_UPDATED_AT, args[4]);
	SET_COLUMN(COL_EXPIRES_AT, args[5]);
	SET_COLUMN(COL_PURGE_AFTER, args[5]);
	SET_COLUMN(COL_STATUS, idem_status_datum(IDEM_PROCESSING));
	SET_COLUMN(COL_ATTEMPTS, Int32GetDatum(1));
#undef SET_COLUMN
	return true;
}

/*
 * STMT_INSERT: a new record unless the key exists.  Without SPI where
 * direct_write.c allows it, otherwise the statement.  Returns whether a row
 * was inserted.
 */
bool
idem_store_insert_new(IdemStore *store, Datum *args)
{
	/* the claim inserts only after its read found no record */
	return insert_direct_or_exec(store, objects->records, fill_new_record, STMT_INSERT, args,
								 true);
}

/*
 * STMT_INBOX_INSERT's row, its columns found by name: args[0] consumer,
 * args[1] message id, args[2] expiry.
 */
static bool
fill_inbox_row(TupleDesc desc, Datum *values, bool *nulls, bool *given, void *arg)
{
	static const char *const names[3] = {"consumer", "message_id", "expires_at"};
	static const Oid types[3] = {TEXTOID, TEXTOID, TIMESTAMPTZOID};
	Datum	   *args = (Datum *) arg;
	int			found = 0;

	for (int i = 0; i < desc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);

		if (att->attisdropped)
			continue;
		for (int c = 0; c < 3; c++)
		{
			if (strcmp(NameStr(att->attname), names[c]) == 0)
			{
				/* a changed type needs the statement's cast */
				if (att->atttypid != types[c] || att->atttypmod != -1)
					return false;
				values[i] = args[c];
				nulls[i] = false;
				given[i] = true;
				found++;
			}
		}
	}
	return found == 3;
}

/* STMT_INBOX_INSERT, without SPI where direct_write.c allows it. */
bool
idem_store_inbox_insert(IdemStore *store, Datum *args)
{
	/* a duplicate is the common case: checked before anything is written */
	return insert_direct_or_exec(store, objects->inbox, fill_inbox_row, STMT_INBOX_INSERT, args,
								 false);
}

/* STMT_COMPLETE's arguments, for complete_record */
typedef struct CompleteArgs
{
	Datum	   *args;
	const char *nulls;
	AttrNumber	headers;		/* response_headers, or 0 */
} CompleteArgs;

static bool
same_text(Datum a, Datum b)
{
	return DatumGetBool(DirectFunctionCall2Coll(texteq, C_COLLATION_OID, a, b));
}

/*
 * STMT_COMPLETE on the locked, newest version of the row: its WHERE clause,
 * then its SET list, with the same functions the SQL calls (the expiry
 * shift is timestamptz - timestamptz + interval, in the session's time
 * zone).
 */
static bool
complete_record(TupleDesc desc, Datum *values, bool *nulls, void *arg)
{
	CompleteArgs *c = (CompleteArgs *) arg;
	Datum	   *args = c->args;
	bool		has_nulls = c->nulls != NULL;
	Datum		took;

	if (nulls[COL_SCOPE] || nulls[COL_KEY] || nulls[COL_TOKEN] || nulls[COL_STATUS] ||
		!same_text(values[COL_SCOPE], args[0]) || !same_text(values[COL_KEY], args[1]) ||
		DatumGetInt64(values[COL_TOKEN]) != DatumGetInt64(args[2]) ||
		DatumGetObjectId(values[COL_STATUS]) != objects->status_labels[IDEM_PROCESSING] ||
		nulls[COL_LEASE_EXPIRES_AT])
		return false;

#define SET_COLUMN(col, value, isnull) (values[col] = (value), nulls[col] = (isnull))
	SET_COLUMN(COL_STATUS, idem_status_datum(IDEM_SUCCEEDED), false);
	SET_COLUMN(COL_RESULT, args[3], has_nulls && c->nulls[3] == 'n');
	SET_COLUMN(COL_RESPONSE_CODE, args[4], has_nulls && c->nulls[4] == 'n');
	if (c->headers != InvalidAttrNumber)
		SET_COLUMN(c->headers - 1, args[6], has_nulls && c->nulls[6] == 'n');
	SET_COLUMN(COL_ERROR, (Datum) 0, true);
	SET_COLUMN(COL_COMPLETED_AT, args[5], false);
	SET_COLUMN(COL_UPDATED_AT, args[5], false);
	SET_COLUMN(COL_LEASE_EXPIRES_AT, (Datum) 0, true);
	if (nulls[COL_EXPIRES_AT] || nulls[COL_CREATED_AT])
		SET_COLUMN(COL_EXPIRES_AT, (Datum) 0, true);
	else
	{
		took = DirectFunctionCall2(timestamp_mi, args[5], values[COL_CREATED_AT]);
		SET_COLUMN(COL_EXPIRES_AT,
				   DirectFunctionCall2(timestamptz_pl_interval, values[COL_EXPIRES_AT], took),
				   false);
	}
#undef SET_COLUMN
	return true;
}

/*
 * An owner's UPDATE without RETURNING (idem_complete's STMT_COMPLETE):
 * without SPI where direct_write.c allows it.  Returns whether the row
 * matched.
 */
bool
idem_store_update_owned(IdemStore *store, IdemStatement stmt, Datum *args,
						const char *nulls)
{
	if (stmt == STMT_COMPLETE)
	{
		CompleteArgs c = {args, nulls, objects->records_headers};
		AttrNumber	cols[9] = {
			COL_STATUS + 1, COL_RESULT + 1, COL_RESPONSE_CODE + 1, COL_ERROR + 1,
			COL_COMPLETED_AT + 1, COL_UPDATED_AT + 1, COL_LEASE_EXPIRES_AT + 1,
			COL_EXPIRES_AT + 1, c.headers
		};

		switch (idem_direct_update(objects->records, args[0], args[1], cols,
								   c.headers != InvalidAttrNumber ? 9 : 8,
								   records_have_native_types, complete_record, &c))
		{
			case IDEM_DIRECT_WRITTEN:
				return true;
			case IDEM_DIRECT_NOT_WRITTEN:
				return false;
			case IDEM_DIRECT_REFUSED:
				break;
		}
	}
	return idem_store_exec(store, stmt, args, nulls, false, NULL, NULL);
}

/*
 * Run a statement that returns one column of a pass-by-value type; *value
 * gets it from the first row.  Returns whether a row came back.
 */
bool
idem_store_exec_scalar(IdemStore *store, IdemStatement stmt, Datum *args,
					   const char *nulls, Datum *value)
{
	bool		isnull;

	if (!idem_store_exec(store, stmt, args, nulls, false, NULL, NULL))
		return false;
	*value = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	return !isnull;
}

/* How many rows the last statement of idem_store_exec touched. */
uint64
idem_store_processed(void)
{
	return SPI_processed;
}
