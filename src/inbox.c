/*-------------------------------------------------------------------------
 *
 * inbox.c
 *		The consumer inbox: de-duplication of delivered messages inside the
 *		business transaction.
 *
 * idem_inbox_accept inserts (consumer, message_id) with ON CONFLICT DO
 * NOTHING.  The de-dup row commits or rolls back with the caller's business
 * change.  A concurrent delivery of the same message waits on the primary
 * key for the first transaction, as any unique index makes it: when that
 * commits, the second answers false; when it rolls back, the second inserts
 * and answers true.  With wait => false a dirty probe of the primary key
 * refuses at once instead, with 55P03 (lock_not_available), the SQLSTATE of
 * NOWAIT.  A message past its retention counts as new again (its row is
 * revived, under its row lock), exactly as if idem_purge had removed it.
 *
 * idem_inbox_accept_seq keeps O(1) state per (consumer, stream): the highest
 * sequence number accepted.  seq <= watermark is a duplicate; watermark + 1
 * advances it in one UPDATE (the common case); a larger jump is a gap, which
 * advances the watermark only when the caller accepts gaps.  The watermark
 * row's lock orders concurrent calls; under REPEATABLE READ and SERIALIZABLE
 * a concurrent change gives 40001.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/rls.h"
#include "utils/timestamp.h"

#include "extension_objects.h"
#include "record_store.h"
#include "stats.h"
#include "validation.h"

/*
 * Rounds that keep failing the same way under row-level security mean that a
 * policy lets us insert the row but hides it: say so instead of blaming
 * concurrency (as idem_claim does).
 */
static bool
hidden_by_rls(Oid relid)
{
	return OidIsValid(relid) && check_enable_rls(relid, InvalidOid, true) == RLS_ENABLED;
}

PG_FUNCTION_INFO_V1(idem_inbox_accept);
PG_FUNCTION_INFO_V1(idem_inbox_accept_seq);

/* Rounds of read-then-write before 40001; each needs a concurrent change. */
#define MAX_SEQ_ROUNDS 8

Datum
idem_inbox_accept(PG_FUNCTION_ARGS)
{
	text	   *consumer = idem_arg_key(fcinfo, 0, "consumer");
	text	   *message_id = idem_arg_key(fcinfo, 1, "message id");
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz expires_at = idem_retention_expiry(fcinfo, 2, now);
	Datum		args[4] = {
		PointerGetDatum(consumer), PointerGetDatum(message_id),
		TimestampTzGetDatum(expires_at), TimestampTzGetDatum(now)
	};
	const IdemObjects *objects;
	IdemStore	store;
	bool		accepted;

	idem_arg_not_null(fcinfo, 3, "wait");
	idem_store_open(&store, fcinfo->flinfo->fn_oid);
	objects = idem_objects_current();

	/*
	 * The probe reads the index directly; it answers only callers that the
	 * INSERT would tell as much (see idem_store_insert_in_progress).
	 */
	if (!PG_GETARG_BOOL(3) &&
		idem_store_insert_in_progress(objects->inbox, consumer, message_id))
		ereport(ERROR,
				(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
				 errmsg("message \"%s\" of consumer \"%s\" is held by another transaction",
						text_to_cstring(message_id), text_to_cstring(consumer)),
				 errdetail("Another transaction is accepting it, or purging it."),
				 errhint("Retry after that transaction ends, or call with wait => true to wait for it.")));

	/*
	 * Not inserted: the message is there, or it expired and this call revives
	 * it.  When the row vanished in between (a purge committed), insert again.
	 */
	for (int round = 0;; round++)
	{
		if (idem_store_inbox_insert(&store, args) ||
			idem_store_exec(&store, STMT_INBOX_REVIVE, args, NULL, false, NULL, NULL))
		{
			accepted = true;
			break;
		}
		if (idem_store_exec(&store, STMT_INBOX_EXISTS, args, NULL, false, NULL, NULL))
		{
			accepted = false;	/* a live duplicate */
			break;
		}
		if (round == MAX_SEQ_ROUNDS && hidden_by_rls(objects->inbox))
			ereport(ERROR,
					(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
					 errmsg("message \"%s\" of consumer \"%s\" exists, but row-level security hides it",
							text_to_cstring(message_id), text_to_cstring(consumer)),
					 errdetail("The INSERT conflicts with a row of idem_inbox that its policies do not let this role read."),
					 errhint("Check idempotency.scope and the policies of idem_inbox.")));
		if (round == MAX_SEQ_ROUNDS)
			ereport(ERROR,
					(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
					 errmsg("could not accept message \"%s\" because of concurrent changes",
							text_to_cstring(message_id)),
					 errhint("Retry the transaction.")));
		/* purged since the INSERT looked: insert again */
	}
	idem_store_close(&store);
	idem_count(accepted ? IDEM_COUNT_INBOX_ACCEPTED : IDEM_COUNT_INBOX_DUPLICATE);
	PG_RETURN_BOOL(accepted);
}

/*
 * idem_inbox_accept_seq(consumer, stream, seq, accept_gap) -> 'new' |
 * 'duplicate' | 'gap'.  The first message of a stream starts it.
 */
Datum
idem_inbox_accept_seq(PG_FUNCTION_ARGS)
{
	text	   *consumer = idem_arg_key(fcinfo, 0, "consumer");
	text	   *stream = idem_arg_key(fcinfo, 1, "stream");
	int64		seq;
	bool		accept_gap;
	Datum		args[4];
	IdemStore	store;
	const char *outcome = NULL;

	idem_arg_not_null(fcinfo, 2, "seq");
	idem_arg_not_null(fcinfo, 3, "accept_gap");
	seq = PG_GETARG_INT64(2);
	accept_gap = PG_GETARG_BOOL(3);
	if (seq < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("sequence number must not be negative"),
				 errdetail("The sequence number given was %lld.", (long long) seq)));

	args[0] = PointerGetDatum(consumer);
	args[1] = PointerGetDatum(stream);
	args[2] = Int64GetDatum(seq);
	args[3] = TimestampTzGetDatum(GetCurrentTimestamp());

	idem_store_open(&store, fcinfo->flinfo->fn_oid);
	if (seq > 0 && idem_store_exec(&store, STMT_STREAM_ADVANCE, args, NULL, false, NULL, NULL))
		outcome = "new";

	for (int round = 0; outcome == NULL; round++)
	{
		Datum		watermark;

		if (round == MAX_SEQ_ROUNDS &&
			hidden_by_rls(get_relname_relid("idem_inbox_streams",
											get_rel_namespace(idem_objects_current()->inbox))))
			ereport(ERROR,
					(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
					 errmsg("stream \"%s\" of consumer \"%s\" exists, but row-level security hides it",
							text_to_cstring(stream), text_to_cstring(consumer)),
					 errdetail("The INSERT conflicts with a row of idem_inbox_streams that its policies do not let this role read."),
					 errhint("Check idempotency.scope and the policies of idem_inbox_streams.")));
		if (round == MAX_SEQ_ROUNDS)
			ereport(ERROR,
					(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
					 errmsg("could not accept sequence number %lld of stream \"%s\" because of concurrent changes",
							(long long) seq, text_to_cstring(stream)),
					 errhint("Retry the transaction.")));

		if (!idem_store_exec_scalar(&store, STMT_STREAM_LOCK, args, NULL, &watermark))
		{
			if (idem_store_exec(&store, STMT_STREAM_INSERT, args, NULL, false, NULL, NULL))
				outcome = "new";
			continue;			/* created concurrently: lock it and look again */
		}
		if (seq <= DatumGetInt64(watermark))
			outcome = "duplicate";
		else
		{
			outcome = (seq == DatumGetInt64(watermark) + 1) ? "new" : "gap";
			if (outcome[0] == 'n' || accept_gap)
				idem_store_exec(&store, STMT_STREAM_SET, args, NULL, false, NULL, NULL);
		}
	}
	idem_store_close(&store);
	if (outcome[0] == 'd')
		idem_count(IDEM_COUNT_INBOX_DUPLICATE);
	else if (outcome[0] == 'n' || accept_gap)
		idem_count(IDEM_COUNT_INBOX_ACCEPTED);	/* a refused gap is neither */
	PG_RETURN_TEXT_P(cstring_to_text(outcome));
}
