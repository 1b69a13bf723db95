/*-------------------------------------------------------------------------
 *
 * purge.c
 *		idem_purge(): remove what retention no longer keeps.
 *
 * One mechanism for every table with an expires_at column: finished records
 * (succeeded, failed, or released before any effect) and inbox messages, and
 * for the outbox's published messages, whose retention
 * (idempotency.outbox_retention) counts from publication; each purged in at most max_batches
 * batches per call.  Each batch locks up to batch_size
 * expired rows with FOR UPDATE SKIP LOCKED and deletes exactly those, so a
 * purge never waits for, nor blocks, a claim or an accept that holds a row:
 * a claim reusing an expired record keeps it, and a claim that arrives while
 * purge holds the row waits for the purge and then finds the key absent.
 * Records that may stand for work with effects (processing, unknown) are
 * never purged, whatever their expiry.  Inbox watermarks are never purged,
 * nor outbox messages that are pending, in flight or dead.
 * A batch that deletes records first advances the token epoch, so that a
 * key claimed again after its record went gets tokens no earlier owner held.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/lsyscache.h"
#include "utils/timestamp.h"

#include "extension_objects.h"
#include "idempotency.h"
#include "record_store.h"
#include "stats.h"
#include "tokens.h"
#include "validation.h"

PG_FUNCTION_INFO_V1(idem_purge);

static bool
outbox_purgeable(void)
{
	Oid			outbox;

	if (!OidIsValid(idem_objects_outbox_seq()))
		return false;
	outbox = get_relname_relid("idem_outbox", idem_objects_current()->namespace);
	return OidIsValid(outbox) &&
		pg_class_aclcheck(outbox, GetUserId(), ACL_DELETE) == ACLCHECK_OK;
}

static const IdemStatement purge_statements[] = {STMT_PURGE_RECORDS, STMT_PURGE_INBOX,
												 STMT_PURGE_OUTBOX};

Datum
idem_purge(PG_FUNCTION_ARGS)
{
	int32		batch_size;
	int32		max_batches = -1;
	int64		purged = 0;
	IdemStore	store;

	idem_arg_not_null(fcinfo, 0, "batch_size");
	batch_size = PG_GETARG_INT32(0);
	if (batch_size <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("batch_size must be positive"),
				 errdetail("The value given was %d.", batch_size)));
	if (!PG_ARGISNULL(1))
	{
		max_batches = PG_GETARG_INT32(1);
		if (max_batches <= 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("max_batches must be positive"),
					 errdetail("The value given was %d.", max_batches)));
	}

	idem_store_open(&store, fcinfo->flinfo->fn_oid);
	for (size_t t = 0; t < lengthof(purge_statements); t++)
	{
		int32		batches = 0;

		/*
		 * SQL 0.1.0 has no outbox.  A caller who may not delete from it
		 * (a role granted the records and the inbox by hand before 0.2.0)
		 * purges the rest, as before.
		 */
		if (purge_statements[t] == STMT_PURGE_OUTBOX && !outbox_purgeable())
			continue;

		for (;;)
		{
			TimestampTz now = GetCurrentTimestamp();
			Datum		args[3] = {
				TimestampTzGetDatum(now), Int32GetDatum(batch_size),
				ObjectIdGetDatum(idem_objects_current()->token_epoch)
			};
			uint64		deleted;

			if (max_batches >= 0 && batches >= max_batches)
				break;
			/* its nextval at the limit would say less */
			if (purge_statements[t] == STMT_PURGE_RECORDS)
				idem_token_epoch_require_room(idem_objects_current(),
											  idem_token_epoch_now(idem_objects_current()), 1);
			/* the outbox counts its retention from publication */
			if (purge_statements[t] == STMT_PURGE_OUTBOX)
				args[0] = TimestampTzGetDatum(now - (int64) idem_outbox_retention_s * USECS_PER_SEC);
			idem_store_exec(&store, purge_statements[t], args, NULL, false, NULL, NULL);
			deleted = idem_store_processed();
			purged += deleted;
			batches++;
			CHECK_FOR_INTERRUPTS();
			if (deleted < (uint64) batch_size)
				break;			/* this table has no more expired rows */
		}
	}
	idem_store_close(&store);
	idem_count_add(IDEM_COUNT_PURGED, (uint64) purged);
	PG_RETURN_INT64(purged);
}
