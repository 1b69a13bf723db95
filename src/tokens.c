/*-------------------------------------------------------------------------
 *
 * tokens.c
 *		Fencing tokens that never repeat: the epoch, a key's first token and
 *		the token that replaces one.
 *
 * A token is epoch * 2^shift + n.  The epoch is the last value of the
 * sequence idem_token_epoch; a key's first token is n = 1 of the current
 * epoch, and each takeover, release and reuse gives the next one.  A token
 * must never be issued twice for a key, so whatever could make a key start
 * again below a token issued for it moves the epoch on first:
 *
 *	 - a removal of a record of the current epoch (idem_purge, the triggers of
 *	   removal.c): the key's next first token is above the removed one;
 *	 - a key that used up the 2^shift - 1 tokens of its epoch: the next one
 *	   is the first token of a new epoch (idem_token_next), never one that
 *	   would belong to an epoch not yet begun;
 *	 - a new timeline: after a promotion (or recovery to a point in time)
 *	   the server may have lost commits the old primary acknowledged, with
 *	   the tokens they issued.  Before the first token of a timeline, the
 *	   epoch jumps by IDEM_EPOCHS_PER_TIMELINE, more than any number of
 *	   advances the old primary can have made beyond what reached the
 *	   standby, and the sequence idem_token_timeline records the timeline.
 *	   idem_token_next takes a token of an older epoch to the first token of
 *	   the current one, so a takeover after a promotion cannot repeat a
 *	   takeover the old primary made and lost either.  This happens in the
 *	   backend that issues the first token, with or without the worker.
 *
 * The shift is 16 from SQL 0.3.0 on: 2^47 epochs, so that no workload
 * exhausts them (10,000 epoch-spending statements a second last 445
 * years, promotions spend 2^24 each).  SQL 0.1.0 and 0.2.0 issued
 * epoch * 2^32 + n, with 2^31 epochs; the update to 0.3.0 moves the epoch
 * above every token issued so far, so that today's tokens stay valid and
 * the next ones are above them.  The library serves both: the timeline's
 * sequence, new in 0.3.0, says which scheme a database has.
 *
 * At the limit of the sequence, whatever needs a new epoch fails with an
 * error that says what to do, rather than repeat a token.
 *
 * The epoch is advanced as the sequence's owner, and read so by deletions:
 * they spend it as part of what the role is allowed to do, not as a right
 * of its own (removal.c).  A claim, which hands the epoch out, reads it with
 * the claimant's privileges (PUBLIC may read it), as the hot path always
 * has: no owner switch per new key.  The move on a new timeline is serialised
 * by a session lock on idem_token_timeline, held only for the move: two
 * backends moving at once could otherwise set the epoch back below an
 * advance made in between.  Both sequences are changed without being
 * transactional; the WAL of the first token's commit includes them.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xlog.h"
#include "catalog/pg_class.h"
#include "commands/sequence.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "utils/fmgrprotos.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"

#include "tokens.h"

/* shifts of the two schemes */
#define SHIFT_SINCE_0_3 16
#define SHIFT_BEFORE_0_3 32

/* the jump of the epoch on a new timeline */
#define IDEM_EPOCHS_PER_TIMELINE (INT64CONST(1) << 24)

/* the timeline whose move this backend has seen done */
static TimeLineID timeline_checked = 0;

int
idem_token_shift(const IdemObjects *objects)
{
	return OidIsValid(objects->token_timeline) ? SHIFT_SINCE_0_3 : SHIFT_BEFORE_0_3;
}

int64
idem_token_epoch_of(const IdemObjects *objects, int64 token)
{
	return token >> idem_token_shift(objects);
}

/* the largest epoch whose tokens fit in a bigint */
static int64
epoch_limit(const IdemObjects *objects)
{
	return PG_INT64_MAX >> idem_token_shift(objects);
}

static Oid
owner_of(Oid relation)
{
	HeapTuple	tuple;
	Oid			owner;

	tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(relation));
	if (!HeapTupleIsValid(tuple))
		elog(ERROR, "cache lookup failed for relation %u", relation);
	owner = ((Form_pg_class) GETSTRUCT(tuple))->relowner;
	ReleaseSysCache(tuple);
	return owner;
}

/* last_value of a sequence, read as the caller; 0 before its first nextval */
static int64
last_value(Oid sequence)
{
	LOCAL_FCINFO(fcinfo, 1);
	Datum		last;

	InitFunctionCallInfoData(*fcinfo, NULL, 1, InvalidOid, NULL, NULL);
	fcinfo->args[0].value = ObjectIdGetDatum(sequence);
	fcinfo->args[0].isnull = false;
	last = pg_sequence_last_value(fcinfo);
	return fcinfo->isnull ? 0 : DatumGetInt64(last);
}

/* the same, read as the sequence's owner */
static int64
last_value_as_owner(Oid sequence)
{
	LOCAL_FCINFO(fcinfo, 1);
	Oid			save_userid;
	int			save_sec_context;
	Datum		last;

	/* an error restores the user id with the (sub)transaction's abort */
	GetUserIdAndSecContext(&save_userid, &save_sec_context);
	SetUserIdAndSecContext(owner_of(sequence), save_sec_context |
						   SECURITY_LOCAL_USERID_CHANGE | SECURITY_RESTRICTED_OPERATION);
	InitFunctionCallInfoData(*fcinfo, NULL, 1, InvalidOid, NULL, NULL);
	fcinfo->args[0].value = ObjectIdGetDatum(sequence);
	fcinfo->args[0].isnull = false;
	last = pg_sequence_last_value(fcinfo);
	SetUserIdAndSecContext(save_userid, save_sec_context);
	return fcinfo->isnull ? 0 : DatumGetInt64(last);
}

static void
setval_as_owner(Oid sequence, int64 value)
{
	Oid			save_userid;
	int			save_sec_context;

	GetUserIdAndSecContext(&save_userid, &save_sec_context);
	SetUserIdAndSecContext(owner_of(sequence), save_sec_context |
						   SECURITY_LOCAL_USERID_CHANGE | SECURITY_RESTRICTED_OPERATION);
	DirectFunctionCall2(setval_oid, ObjectIdGetDatum(sequence), Int64GetDatum(value));
	SetUserIdAndSecContext(save_userid, save_sec_context);
}

/* Refuse, saying what to do, when the epoch cannot move "by" more. */
void
idem_token_epoch_require_room(const IdemObjects *objects, int64 epoch, int64 by)
{
	if (epoch > epoch_limit(objects) - by)
		ereport(ERROR,
				(errcode(ERRCODE_SEQUENCE_GENERATOR_LIMIT_EXCEEDED),
				 errmsg("the fencing tokens of idempotency records are used up"),
				 errdetail("The token epoch (sequence \"idem_token_epoch\") is at %lld of %lld; moving it on would need %lld more, and without it a token could repeat.",
						   (long long) epoch, (long long) epoch_limit(objects),
						   (long long) by),
				 errhint("Stop every client that may still hold a fencing token, delete the records, and only then lower \"idem_token_epoch\" with setval.")));
}

/* The epoch, read by a claimant or as the owner. */
static int64
epoch_read(const IdemObjects *objects, bool as_owner)
{
	int64		epoch = as_owner ? last_value_as_owner(objects->token_epoch) :
		last_value(objects->token_epoch);

	/*
	 * The update to 0.3.0, committed since this session loaded the objects
	 * (in a transaction that held its locks on the records throughout).
	 * Reading the sequence locked it, which waited for the update's ALTER
	 * SEQUENCE or took in its invalidations, so the look-up sees the new
	 * sequence; the rescaled epoch alone may still fit the old scheme.
	 */
	if (epoch > epoch_limit(objects) ||
		(!OidIsValid(objects->token_timeline) &&
		 OidIsValid(get_relname_relid("idem_token_timeline", objects->namespace))))
		ereport(ERROR,
				(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
				 errmsg("the fencing tokens of idempotency records changed their scheme during this transaction"),
				 errdetail("ALTER EXTENSION idempotency UPDATE moved the token epoch to %lld.",
						   (long long) epoch),
				 errhint("Retry the transaction.")));
	return epoch;
}

int64
idem_token_epoch_now(const IdemObjects *objects)
{
	return epoch_read(objects, true);
}

int64
idem_token_epoch_advance(const IdemObjects *objects)
{
	idem_token_epoch_require_room(objects, idem_token_epoch_now(objects), 1);
	return nextval_internal(objects->token_epoch, false);
}

/*
 * Before the first token of a timeline, move the epoch on (see the file's
 * comment).  Outside recovery only: a standby issues no token.
 */
static void
check_timeline(const IdemObjects *objects)
{
	TimeLineID	timeline;
	LockRelId	lock;

	if (!OidIsValid(objects->token_timeline) || RecoveryInProgress())
		return;
	timeline = GetWALInsertionTimeLine();
	if (timeline == timeline_checked)
		return;
	if (last_value_as_owner(objects->token_timeline) == (int64) timeline)
	{
		timeline_checked = timeline;
		return;
	}

	lock.dbId = MyDatabaseId;
	lock.relId = objects->token_timeline;
	LockRelationIdForSession(&lock, ShareUpdateExclusiveLock);
	PG_TRY();
	{
		/* another backend may have moved it while we waited */
		if (last_value_as_owner(objects->token_timeline) != (int64) timeline)
		{
			int64		epoch = idem_token_epoch_now(objects);

			idem_token_epoch_require_room(objects, epoch, IDEM_EPOCHS_PER_TIMELINE);
			setval_as_owner(objects->token_epoch, epoch + IDEM_EPOCHS_PER_TIMELINE);
			setval_as_owner(objects->token_timeline, (int64) timeline);
			ereport(LOG,
					(errmsg("idempotency token epoch moved from %lld to %lld for timeline %u",
							(long long) epoch,
							(long long) (epoch + IDEM_EPOCHS_PER_TIMELINE), timeline),
					 errdetail("Tokens issued on an earlier timeline whose commits were lost must not repeat.")));
		}
	}
	PG_FINALLY();
	{
		UnlockRelationIdForSession(&lock, ShareUpdateExclusiveLock);
	}
	PG_END_TRY();
	timeline_checked = timeline;
}

int64
idem_token_first(const IdemObjects *objects)
{
	check_timeline(objects);
	return (epoch_read(objects, false) << idem_token_shift(objects)) + 1;
}

int64
idem_token_next(const IdemObjects *objects, int64 old)
{
	int			shift = idem_token_shift(objects);
	int64		epoch;
	int64		first;

	check_timeline(objects);
	epoch = epoch_read(objects, false);
	first = (epoch << shift) + 1;
	if (old < first)
		return first;
	if (old < PG_INT64_MAX && ((old + 1) >> shift) <= epoch)
		return old + 1;

	/* the key used up its epoch, or its token is ahead of the sequence */
	epoch = idem_token_epoch_advance(objects);
	first = (epoch << shift) + 1;
	if (first <= old)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("the token epoch is behind the tokens of the idempotency records"),
				 errdetail("A record holds token %lld, and epoch %lld starts at %lld.",
						   (long long) old, (long long) epoch, (long long) first),
				 errhint("The sequence \"idem_token_epoch\" was lowered: raise it above every record's token shifted right by %d bits.",
						 shift)));
	return first;
}
