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
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/latch.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"

#include "idempotency.h"

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

Datum
idem_await(PG_FUNCTION_ARGS)
{
	text	   *key = idem_arg_key(fcinfo, 0, "idempotency key");
	text	   *scope = idem_arg_scope(fcinfo, 1);
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	MemoryContext caller_cxt = CurrentMemoryContext;
	MemoryContext round_cxt;
	TimestampTz deadline;
	long		sleep_ms = AWAIT_FIRST_SLEEP_MS;
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
	for (;;)
	{
		long		remaining_ms;

		MemoryContextReset(round_cxt);
		idem_store_fetch(&store, scope, key, true, &rec, round_cxt);
		if (!owner_at_work(&rec) || IsolationUsesXactSnapshot())
			break;
		remaining_ms = TimestampDifferenceMilliseconds(GetCurrentTimestamp(), deadline);
		if (remaining_ms <= 0)
			break;
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 Min(sleep_ms, remaining_ms), PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
		sleep_ms = Min(sleep_ms * 2, AWAIT_MAX_SLEEP_MS);
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
