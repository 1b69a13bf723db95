/*-------------------------------------------------------------------------
 *
 * idempotency.h
 *		Declarations shared by the modules of the idempotency extension.
 *
 * The extension keeps one row per (scope, key) in @extschema@.idempotency_records.
 * Every module reads and writes that table through the prepared statements of
 * record_store.c, so privileges, row-level security and triggers apply as they
 * would to the caller's own SQL.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEMPOTENCY_H
#define IDEMPOTENCY_H

#include "postgres.h"

#include "access/attnum.h"
#include "datatype/timestamp.h"
#include "executor/spi.h"
#include "fmgr.h"

/*
 * SQLSTATEs of the extension's own errors, class "IK" (idempotency key).
 * Class I is implementation-defined, so they cannot collide with the standard.
 */
#define ERRCODE_IDEM_FINGERPRINT_MISMATCH	MAKE_SQLSTATE('I','K','0','0','1')
#define ERRCODE_IDEM_STALE_TOKEN			MAKE_SQLSTATE('I','K','0','0','2')
#define ERRCODE_IDEM_INVALID_STATE			MAKE_SQLSTATE('I','K','0','0','3')
#define ERRCODE_IDEM_KEY_NOT_FOUND			MAKE_SQLSTATE('I','K','0','0','4')
#define ERRCODE_IDEM_INVALID_TRANSITION		MAKE_SQLSTATE('I','K','0','0','5')

/* Largest fingerprint accepted: a SHA-512 digest. */
#define IDEM_MAX_FINGERPRINT_BYTES	64

/* GUCs (idempotency.c) */
extern int	idem_default_lease_ms;
extern int	idem_retention_s;
extern int	idem_max_key_length;
extern int	idem_outbox_max_attempts;
extern int	idem_outbox_retention_s;
extern bool idem_outbox_notify;
extern bool idem_direct_writes;

/*
 * Record statuses, in the order of the idem_status enum labels.
 */
typedef enum IdemStatus
{
	IDEM_PROCESSING,
	IDEM_SUCCEEDED,
	IDEM_FAILED,
	IDEM_UNKNOWN,
	IDEM_NUM_STATUSES
} IdemStatus;

extern const char *const idem_status_names[IDEM_NUM_STATUSES];

/*
 * Columns of idempotency_records, in table order.  Every statement of
 * record_store.c returns exactly these columns in this order.  The first
 * IDEM_BASE_COLUMNS are 0.1.0's, at attribute numbers 1 to 17; 0.2.0 added
 * response_headers with ALTER TABLE, so it comes after them (after any
 * attribute dropped before the update, too) and may be missing: the library
 * still serves 0.1.0's table, whose records then read it as NULL (see
 * IdemObjects.records_headers).
 */
typedef enum IdemColumn
{
	COL_SCOPE,
	COL_KEY,
	COL_FINGERPRINT,
	COL_TOKEN,
	COL_LEASE_EXPIRES_AT,
	COL_CREATED_AT,
	COL_UPDATED_AT,
	COL_COMPLETED_AT,
	COL_EXPIRES_AT,
	COL_PURGE_AFTER,
	COL_STATUS,
	COL_ATTEMPTS,
	COL_RESPONSE_CODE,
	COL_RETRYABLE,
	COL_RECOVERY_POINT,
	COL_RESULT,
	COL_ERROR,
	COL_RESPONSE_HEADERS,		/* 0.2.0; attribute records_headers */
	IDEM_NUM_COLUMNS
} IdemColumn;

#define IDEM_BASE_COLUMNS COL_RESPONSE_HEADERS

/* One record as read back from the table; by-reference values are copied. */
typedef struct IdemRecord
{
	bool		found;
	Datum		values[IDEM_NUM_COLUMNS];
	bool		nulls[IDEM_NUM_COLUMNS];
	IdemStatus	status;			/* decoded COL_STATUS */
} IdemRecord;

/* The prepared statements of record_store.c. */
typedef enum IdemStatement
{
	STMT_SELECT,				/* $1 scope, $2 key */
	STMT_SELECT_FOR_UPDATE,		/* same, waiting for row locks */
	STMT_SELECT_SKIP_LOCKED,	/* same, skipping a locked row */
	STMT_INSERT,				/* new record unless the key exists */
	STMT_RETOKEN,				/* move a new record to a later token epoch */
	STMT_REUSE,					/* an absent-equivalent row becomes new */
	STMT_TAKEOVER,				/* next owner of an abandoned/failed row */
	STMT_COMPLETE,
	STMT_FAIL,
	STMT_CHECKPOINT,
	STMT_RELEASE,
	STMT_MARK_UNKNOWN,
	STMT_RESOLVE,
	STMT_INBOX_INSERT,			/* $1 consumer, $2 message, $3 expiry */
	STMT_INBOX_REVIVE,			/* same, $4 now: an expired message again */
	STMT_INBOX_EXISTS,			/* $1 consumer, $2 message */
	STMT_STREAM_ADVANCE,		/* $1 consumer, $2 stream, $3 seq, $4 now */
	STMT_STREAM_LOCK,			/* $1 consumer, $2 stream */
	STMT_STREAM_INSERT,			/* $1 consumer, $2 stream, $3 seq, $4 now */
	STMT_STREAM_SET,			/* $1 consumer, $2 stream, $3 seq, $4 now */
	STMT_PURGE_RECORDS,			/* $1 now, $2 batch size */
	STMT_PURGE_INBOX,			/* $1 now, $2 batch size */
	STMT_OUTBOX_INSERT,			/* see outbox.c */
	STMT_PURGE_OUTBOX,			/* $1 published before, $2 batch size */
	IDEM_NUM_STATEMENTS
} IdemStatement;

/* The extension's own objects (extension_objects.c). */
typedef struct IdemObjects
{
	uint64		generation;		/* grows when a reload finds a change */
	Oid			namespace;		/* @extschema@ */
	NameData	namespace_name; /* its name, which the statements embed */
	/* tables; their indexes are found from their relcache entries */
	Oid			records;		/* idempotency_records */
	AttrNumber	records_headers;	/* its response_headers (0.2.0), or 0 */
	Oid			machines;		/* idem_machines */
	Oid			moves;			/* idem_machine_moves */
	Oid			inbox;			/* idem_inbox */
	Oid			token_epoch;	/* the sequence idem_token_epoch */
	Oid			outbox_seq;		/* idem_outbox_seq; InvalidOid at SQL 0.1.0 */
	Oid			enforce_fn;		/* idem_enforce_transition() */
	Oid			status_type;	/* idem_status and its labels */
	Oid			status_labels[IDEM_NUM_STATUSES];
} IdemObjects;

extern const IdemObjects *idem_objects(Oid fn_oid);
extern const IdemObjects *idem_objects_current(void);
extern Oid	idem_objects_outbox_seq(void);

/*
 * One SQL-callable function's use of the store.  It lives on that function's
 * stack, so an error (which unwinds SPI at abort) leaves nothing stale behind,
 * and a call nested in another (a trigger claiming a key) has its own.
 */
typedef struct IdemStore
{
	bool		spi_connected;	/* SPI_connect is done lazily, at first need */
	bool		for_write;		/* the call may write the records it reads */
} IdemStore;

/* record_store.c */
extern void idem_store_open(IdemStore *store, Oid fn_oid);
extern void idem_store_close(IdemStore *store);
extern bool idem_store_exec(IdemStore *store, IdemStatement stmt, Datum *args,
							const char *nulls, bool read_only, IdemRecord *rec,
							MemoryContext copy_to);
extern bool idem_store_fetch(IdemStore *store, text *scope, text *key,
							 bool fresh_snapshot, IdemRecord *rec,
							 MemoryContext copy_to);
/* idem_store_tenant_check: may the first key column be used under isolation? */
typedef enum IdemTenantCheck
{
	IDEM_TENANT_NO_RLS,			/* row-level security is not in force */
	IDEM_TENANT_INSIDE,			/* in the tenant of idempotency.scope */
	IDEM_TENANT_OUTSIDE,		/* outside it: the INSERT's check fails */
	IDEM_TENANT_UNKNOWN			/* policies of others: only the executor knows */
} IdemTenantCheck;

extern IdemTenantCheck idem_store_tenant_check(Oid heap, text *key1);
extern bool idem_store_insert_in_progress(Oid heap, text *key1, text *key2);
extern Oid	idem_primary_key(Relation heap);
extern AttrNumber idem_check_record_shape(TupleDesc desc);
extern void idem_put_record(ReturnSetInfo *rsinfo, IdemRecord *rec);
extern void idem_store_retire_plan(SPIPlanPtr plan);
extern uint64 idem_store_processed(void);
extern int	idem_execute_without_seqscan(SPIPlanPtr plan, Datum *args, const char *nulls,
										 bool read_only, long count);
extern int64 idem_store_first_token(void);
extern bool idem_store_insert_new(IdemStore *store, Datum *args);
extern bool idem_store_inbox_insert(IdemStore *store, Datum *args);
extern bool idem_store_update_owned(IdemStore *store, IdemStatement stmt, Datum *args,
									const char *nulls);
extern bool idem_store_exec_scalar(IdemStore *store, IdemStatement stmt, Datum *args,
								   const char *nulls, Datum *value);
extern Datum idem_status_datum(IdemStatus status);

/* direct_write.c: INSERT ... ON CONFLICT DO NOTHING without SPI */
typedef enum IdemDirectResult
{
	IDEM_DIRECT_REFUSED,		/* not for this caller or table: use SPI */
	IDEM_DIRECT_WRITTEN,
	IDEM_DIRECT_NOT_WRITTEN		/* the key exists, no row matched, or a
								 * trigger skipped the row */
} IdemDirectResult;

typedef bool (*IdemFillRow) (TupleDesc desc, Datum *values, bool *nulls, bool *given,
							 void *arg);
extern IdemDirectResult idem_direct_insert(Oid relid, IdemFillRow fill, void *arg);
typedef bool (*IdemUpdateRow) (TupleDesc desc, Datum *values, bool *nulls, void *arg);
/* Are the table's columns of the types update reads and writes? */
typedef bool (*IdemCheckRowType) (TupleDesc desc);
extern IdemDirectResult idem_direct_update(Oid relid, Datum key1, Datum key2,
										   const AttrNumber *cols, int ncols,
										   IdemCheckRowType check,
										   IdemUpdateRow update, void *arg);

/* A compiled state machine (machine.c). */
/*
 * The most states a machine may have.  A compiled machine keeps its moves as
 * an nstates x nstates matrix in every backend that uses it (1 MB at this
 * size); business processes have tens of states.
 */
#define IDEM_MAX_MACHINE_STATES 1000

typedef struct IdemMachine
{
	MemoryContext cxt;			/* holds the machine and everything below */
	char		name[NAMEDATALEN];
	int			nstates;
	char	  **states;			/* sorted by strcmp */
	bool	   *initial;		/* per state */
	bool		has_initial;	/* false: a row may start in any state */
	bool	   *moves;			/* [from * nstates + to] */
} IdemMachine;

/* machine.c */
extern IdemMachine *idem_machine_get(Oid fn_oid, const char *name);
extern uint64 idem_machine_generation(void);
extern void idem_machine_refresh(void);
extern int	idem_machine_state_index(const IdemMachine *machine, const char *state);
extern char *idem_machine_moves_from(const IdemMachine *machine, int from);

/* Counters of stats.c, in shared memory when the library is preloaded. */
typedef enum IdemCounter
{
	IDEM_COUNT_CLAIM_NEW,
	IDEM_COUNT_CLAIM_REPLAY,
	IDEM_COUNT_CLAIM_IN_PROGRESS,
	IDEM_COUNT_CLAIM_TAKEOVER,
	IDEM_COUNT_CLAIM_UNKNOWN,
	IDEM_COUNT_FINGERPRINT_CONFLICT,
	IDEM_COUNT_STALE_TOKEN,
	IDEM_COUNT_COMPLETED,
	IDEM_COUNT_FAILED,
	IDEM_COUNT_MARKED_UNKNOWN,
	IDEM_COUNT_RESOLVED,
	IDEM_COUNT_TRANSITION_APPLIED,
	IDEM_COUNT_TRANSITION_ALREADY,
	IDEM_COUNT_TRANSITION_REJECTED,
	IDEM_COUNT_INBOX_ACCEPTED,
	IDEM_COUNT_INBOX_DUPLICATE,
	IDEM_COUNT_PURGED,
	IDEM_COUNT_AWAIT_REFUSED,
	IDEM_COUNT_OUTBOX_EMITTED,
	IDEM_COUNT_OUTBOX_PUBLISHED,
	IDEM_COUNT_OUTBOX_RETRIED,
	IDEM_COUNT_OUTBOX_TAKEN_OVER,
	IDEM_COUNT_OUTBOX_DEAD,
	IDEM_NUM_COUNTERS
} IdemCounter;

/* stats.c */
extern void idem_stats_preload(void);
extern void idem_count_add(IdemCounter counter, uint64 n);
#define idem_count(counter) idem_count_add((counter), 1)

/*
 * stats.c: the waiter slots of idem_await (idempotency.max_waiters), per
 * database, in shared memory when the library is preloaded.
 */
extern int	idem_max_waiters;
typedef enum IdemWaiterSlot
{
	IDEM_WAITER_TAKEN,			/* a slot is ours: release it */
	IDEM_WAITER_FULL,			/* max_waiters wait already: do not wait */
	IDEM_WAITER_UNLIMITED		/* no shared memory: the limit cannot apply */
} IdemWaiterSlot;
extern IdemWaiterSlot idem_waiter_acquire(int limit);
extern void idem_waiter_release(void);

/* worker.c */
extern int	idem_purge_interval_s;
extern int	idem_purge_batch_size;
extern char *idem_purge_databases;
extern void idem_worker_preload(void);

/* validation.c */
extern text *idem_arg_key(FunctionCallInfo fcinfo, int argno, const char *what);
extern text *idem_arg_scope(FunctionCallInfo fcinfo, int argno);
extern TimestampTz idem_retention_expiry(FunctionCallInfo fcinfo, int argno,
										 TimestampTz now);
extern bytea *idem_arg_fingerprint(FunctionCallInfo fcinfo, int argno);
extern int64 idem_arg_token(FunctionCallInfo fcinfo, int argno);
extern void idem_arg_not_null(FunctionCallInfo fcinfo, int argno, const char *name);
extern Datum idem_arg_headers(FunctionCallInfo fcinfo, int argno);
extern TimestampTz idem_add_interval(TimestampTz base, Interval *span,
									 const char *name);

/*
 * removal.c: idem_claim's reuse of a record is no removal.  begin saves the
 * announcement in force into *saved and end puts it back, so a claim nested
 * in a trigger of the reuse does not disarm the outer one; end must run
 * however the reuse ends (PG_FINALLY).
 */
typedef struct IdemRemovalReuse
{
	text	   *scope;			/* NULL: nothing announced */
	text	   *key;
	int64		token;			/* of the row the reuse deletes */
	LocalTransactionId lxid;
} IdemRemovalReuse;

extern void idem_removal_reuse_begin(IdemRemovalReuse *saved, text *scope, text *key,
									 int64 token);
extern void idem_removal_reuse_end(const IdemRemovalReuse *saved);

/* fingerprint.c */
extern bytea *idem_sha256(const char *data, size_t len);

/* version.c: false when it could not check (in an extension script) */
extern bool idem_version_check(Oid fn_oid);

#endif							/* IDEMPOTENCY_H */
