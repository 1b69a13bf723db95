/*-------------------------------------------------------------------------
 *
 * record_store.h
 *		Reads and writes of the extension's tables (record_store.c).
 *
 * A SQL-callable function opens one IdemStore on its own stack
 * (idem_store_open), runs the prepared statements of IdemStatement with
 * idem_store_exec and reads a record with idem_store_fetch, and closes it on
 * its success path (idem_store_close).  SPI is connected at the first need;
 * an error unwinds it at abort, so nothing stale is left, and a call nested
 * in another has its own store.  A record's by-reference values are copied
 * into the caller's copy_to context, so they outlive the store.
 *
 * Locks are the executor's: each statement takes the row locks its SQL says
 * (see IdemStatement).  The direct read of idem_store_fetch takes
 * RowExclusiveLock on the records when the store is for_write and the caller
 * may insert (AccessShareLock otherwise) and AccessShareLock on the primary
 * key, kept to the end of the transaction as the executor's are.  Plans are
 * prepared once per backend for a generation of the extension's objects; a
 * plan that a nested call may still execute is retired
 * (idem_store_retire_plan) and freed only when no call of the store runs.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_RECORD_STORE_H
#define IDEM_RECORD_STORE_H

#include "access/attnum.h"
#include "access/tupdesc.h"
#include "executor/spi.h"
#include "nodes/execnodes.h"
#include "utils/relcache.h"

#include "idempotency.h"

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
extern void idem_store_disconnect(IdemStore *store);
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
extern void idem_store_require_tenant(Oid heap, text *scope, const char *call);
extern bool idem_store_insert_in_progress(Oid heap, text *key1, text *key2);
extern Oid	idem_primary_key(Relation heap);
extern AttrNumber idem_check_record_shape(TupleDesc desc);
extern void idem_put_record(ReturnSetInfo *rsinfo, IdemRecord *rec);
extern void idem_store_retire_plan(SPIPlanPtr plan);
extern uint64 idem_store_processed(void);
extern int	idem_execute_without_seqscan(SPIPlanPtr plan, Datum *args, const char *nulls,
										 bool read_only, long count);
extern bool idem_store_insert_new(IdemStore *store, Datum *args);
extern bool idem_store_inbox_insert(IdemStore *store, Datum *args);
extern bool idem_store_update_owned(IdemStore *store, IdemStatement stmt, Datum *args,
									const char *nulls);
extern bool idem_store_exec_scalar(IdemStore *store, IdemStatement stmt, Datum *args,
								   const char *nulls, Datum *value);
extern Datum idem_status_datum(IdemStatus status);

#endif							/* IDEM_RECORD_STORE_H */
