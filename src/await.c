/*-------------------------------------------------------------------------
 *
 * await.c
 *		idem_await(): wait for another owner's work to finish.
 *
 * A service that receives a duplicate while the first request is still
 * processing can wait for the first one's result instead of answering 409.
 * idem_await re-reads the record until no owner is at work on it any more
 * (it finished, was released, is gone, or its lease expired: then claim it)
 * or the timeout passes, and returns it as idem_lookup would, except for the
 * fencing token, which only owners learn.
 *
 * Waiting holds no lock an owner needs: each read is a plain snapshot read,
 * the only lock is the AccessShareLock every reader of the table holds.
 * Between reads the backend sleeps on its latch, starting at 1 ms and
 * doubling up to 100 ms, so a short piece of work is seen almost at once and
 * a long one costs a read every 100 ms, not a busy loop; a cancel or
 * terminate request interrupts the sleep.  Under REPEATABLE READ and
 * SERIALIZABLE the transaction's snapshot cannot show the owner finishing,
 * so idem_await reads once and returns.
 *
 * Nor does waiting gather memory, however long it lasts: each read's
 * allocations are freed before the next (a memory context reset per read,
 * and the SPI connection ended after each read that needed one: under
 * row-level security, or for a role without table-level SELECT).  Before,
 * each read through SPI kept its result until the call returned, about
 * 8 kB a read, 290 MB an hour.
 *
 * A waiter holds a connection, and behind a small pool (PgBouncer's
 * default_pool_size) the waiters can take every connection the owner needs
 * to finish, so that all of them time out.  So at most
 * idempotency.max_waiters backends of a database wait at once: one more
 * reads once and returns the record as it is, still processing, for the
 * caller to answer 409 with Retry-After; await_refused counts those.  The
 * slot (stats.c) is taken after the first read shows an owner at work and
 * given back however the wait ends: by PG_ENSURE_ERROR_CLEANUP on an error
 * (a cancel, statement_timeout) and on process exit (pg_terminate_backend).
 * Without preloading there is no shared memory to count in: the limit
 * cannot apply, except that 0 still means no waiting.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"

#include "idempotency.h"
#include "record_store.h"
#include "stats.h"
#include "validation.h"

PG_FUNCTION_INFO_V1(idem_await);

#define AWAIT_FIRST_SLEEP_MS	1
#define AWAIT_MAX_SLEEP_MS		100

/*
 * Is an owner still at work?  A released record is done with, and an
 * abandoned one (lease expired) will not finish by itself: the caller should
 * claim it (a takeover) rather than wait.
 */
static bool
owner_at_work(IdemRecord *rec)
{
	return rec->found && rec->status == IDEM_PROCESSING &&
		!rec->nulls[COL_LEASE_EXPIRES_AT] &&
		DatumGetTimestampTz(rec->values[COL_LEASE_EXPIRES_AT]) > GetCurrentTimestamp();
}

/* Gives back the waiter slot when the wait ends by an error or an exit. */
static void
release_waiter_slot(int code, Datum arg)
{
	idem_waiter_release();
}

/*
 * May this backend wait?  Takes a waiter slot when it may and shared memory
 * counts them; the caller releases it.
 */
static bool
may_wait(void)
{
	static bool said_unlimited = false;

	switch (idem_waiter_acquire(idem_max_waiters))
	{
		case IDEM_WAITER_TAKEN:
			return true;
		case IDEM_WAITER_FULL:
			idem_count(IDEM_COUNT_AWAIT_REFUSED);
			return false;
		case IDEM_WAITER_UNLIMITED:
			break;
	}
	if (idem_max_waiters == 0)
		return false;
	if (!said_unlimited)
	{
		/* once per backend: every one that loads the library would say it */
		ereport(DEBUG1,
				(errmsg("idempotency.max_waiters does not apply"),
				 errdetail("Waiters are counted in shared memory, which the library reserves only when the server loads it at start."),
				 errhint("Add idempotency to shared_preload_libraries and restart the server.")));
		said_unlimited = true;
	}
	return true;
}

/*
 * One read of the record into *rec, whose values are copied into round_cxt.
 * Everything the read allocates goes there too, or into SPI's memory, which
 * the read frees by ending its connection: however many polls a wait takes
 * (one every 100 ms), its memory stays flat once round_cxt is reset.  An
 * SPI connection per poll costs little beside the sleep between polls.
 */
static void
read_record(IdemStore *store, text *scope, text *key, IdemRecord *rec,
			MemoryContext round_cxt)
{
	MemoryContext old = MemoryContextSwitchTo(round_cxt);

	idem_store_fetch(store, scope, key, true, rec, round_cxt);
	idem_store_disconnect(store);
	MemoryContextSwitchTo(old);
}

/*
 * Re-read the record into *rec until no owner is at work on it or the
 * deadline passes.  *rec holds a first read that showed an owner at work.
 */
static void
wait_for_owner(IdemStore *store, text *scope, text *key, TimestampTz deadline,
			   IdemRecord *rec, MemoryContext round_cxt)
{
	long		sleep_ms = AWAIT_FIRST_SLEEP_MS;

	for (;;)
	{
		long		remaining_ms;

		remaining_ms = TimestampDifferenceMilliseconds(GetCurrentTimestamp(), deadline);
		if (remaining_ms <= 0)
			break;
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 Min(sleep_ms, remaining_ms), PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
		sleep_ms = Min(sleep_ms * 2, AWAIT_MAX_SLEEP_MS);

		MemoryContextReset(round_cxt);
		read_record(store, scope, key, rec, round_cxt);
		if (!owner_at_work(rec))
			break;
	}
}

Datum
idem_await(PG_FUNCTION_ARGS)
{
	text	   *key = idem_arg_key(fcinfo, 0, "idempotency key");
	text	   *scope = idem_arg_scope(fcinfo, 1);
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	MemoryContext caller_cxt = CurrentMemoryContext;
	MemoryContext round_cxt;
	TimestampTz deadline;
	IdemStore	store;
	IdemRecord	rec;

	idem_arg_not_null(fcinfo, 2, "timeout");
	{
		TimestampTz now = GetCurrentTimestamp();
		Interval   *timeout = PG_GETARG_INTERVAL_P(2);

		/* a zero timeout is a plain read; a negative one is an error */
		deadline = DatumGetTimestampTz(DirectFunctionCall2(timestamptz_pl_interval,
														   TimestampTzGetDatum(now),
														   IntervalPGetDatum(timeout)));
		if (deadline < now)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("timeout must not be negative"),
					 errdetail("The interval given was \"%s\".",
							   DatumGetCString(DirectFunctionCall1(interval_out,
																   IntervalPGetDatum(timeout))))));
	}

	InitMaterializedSRF(fcinfo, 0);
	/* before waiting: the SPI path would not notice an added column */
	idem_check_record_shape(rsinfo->setDesc);
	idem_store_open(&store, fcinfo->flinfo->fn_oid);
	round_cxt = AllocSetContextCreate(CurrentMemoryContext, "idem_await round",
									  ALLOCSET_DEFAULT_SIZES);
	read_record(&store, scope, key, &rec, round_cxt);
	if (owner_at_work(&rec) && !IsolationUsesXactSnapshot() &&
		deadline > GetCurrentTimestamp() && may_wait())
	{
		PG_ENSURE_ERROR_CLEANUP(release_waiter_slot, (Datum) 0);
		{
			wait_for_owner(&store, scope, key, deadline, &rec, round_cxt);
		}
		PG_END_ENSURE_ERROR_CLEANUP(release_waiter_slot, (Datum) 0);
		idem_waiter_release();
	}
	idem_store_close(&store);

	if (rec.found)
	{
		MemoryContext old = MemoryContextSwitchTo(caller_cxt);

		/* a waiter is no owner: it does not learn the fencing token */
		rec.nulls[COL_TOKEN] = true;

		idem_put_record(rsinfo, &rec);
		MemoryContextSwitchTo(old);
	}
	MemoryContextDelete(round_cxt);
	return (Datum) 0;
}
