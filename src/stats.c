/*-------------------------------------------------------------------------
 *
 * stats.c
 *		Counters of what the extension did, in shared memory.
 *
 * The counters exist only when the library is in shared_preload_libraries:
 * shared memory is reserved at server start (shmem_request_hook) and set up
 * by shmem_startup_hook, both chaining the previous hook, as in
 * pg_stat_statements.  On the hot path a count is one atomic add on a
 * counter of its own; without preloading it is a test of a NULL pointer.
 * Counters count calls as they happen, not committed outcomes: a claim that
 * answered 'new' in a transaction that then rolled back was still a claim.
 * They survive until a restart or idem_stats_reset().
 *
 * The same shared memory holds the waiter slots of idem_await: how many
 * backends of each database wait in it now, so that no more than
 * idempotency.max_waiters do (await.c).  Taking a slot compares and
 * increments a database's count under a spinlock; the table has room for
 * IDEM_WAIT_DATABASES databases with waiters at the same time, and a waiter
 * of one more database does not wait.  The number waiting now is the last
 * row of idem_stats(), await_waiting, which idem_stats_reset() leaves alone.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "funcapi.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "stats.h"

PG_FUNCTION_INFO_V1(idem_stats);
PG_FUNCTION_INFO_V1(idem_stats_reset);

static const char *const counter_names[IDEM_NUM_COUNTERS] = {
	[IDEM_COUNT_CLAIM_NEW] = "claims_new",
	[IDEM_COUNT_CLAIM_REPLAY] = "claims_replay",
	[IDEM_COUNT_CLAIM_IN_PROGRESS] = "claims_in_progress",
	[IDEM_COUNT_CLAIM_TAKEOVER] = "claims_takeover",
	[IDEM_COUNT_CLAIM_UNKNOWN] = "claims_unknown",
	[IDEM_COUNT_FINGERPRINT_CONFLICT] = "fingerprint_conflicts",
	[IDEM_COUNT_STALE_TOKEN] = "stale_tokens",
	[IDEM_COUNT_COMPLETED] = "completions",
	[IDEM_COUNT_FAILED] = "failures",
	[IDEM_COUNT_MARKED_UNKNOWN] = "marked_unknown",
	[IDEM_COUNT_RESOLVED] = "resolved",
	[IDEM_COUNT_TRANSITION_APPLIED] = "transitions_applied",
	[IDEM_COUNT_TRANSITION_ALREADY] = "transitions_already",
	[IDEM_COUNT_TRANSITION_REJECTED] = "transitions_rejected",
	[IDEM_COUNT_INBOX_ACCEPTED] = "inbox_accepted",
	[IDEM_COUNT_INBOX_DUPLICATE] = "inbox_duplicates",
	[IDEM_COUNT_PURGED] = "purged_rows",
	[IDEM_COUNT_AWAIT_REFUSED] = "await_refused",
	[IDEM_COUNT_OUTBOX_EMITTED] = "outbox_emitted",
	[IDEM_COUNT_OUTBOX_PUBLISHED] = "outbox_published",
	[IDEM_COUNT_OUTBOX_RETRIED] = "outbox_retried",
	[IDEM_COUNT_OUTBOX_TAKEN_OVER] = "outbox_taken_over",
	[IDEM_COUNT_OUTBOX_DEAD] = "outbox_dead",
};

/* Databases that can have waiters in idem_await at the same time. */
#define IDEM_WAIT_DATABASES	64

typedef struct IdemWaitEntry
{
	Oid			dbid;			/* meaningful only while waiting > 0 */
	uint32		waiting;
} IdemWaitEntry;

typedef struct IdemShared
{
	pg_atomic_uint64 counters[IDEM_NUM_COUNTERS];
	pg_atomic_uint64 reset_at;	/* TimestampTz of the last reset */
	slock_t		wait_lock;		/* protects waits[] */
	IdemWaitEntry waits[IDEM_WAIT_DATABASES];
} IdemShared;

static IdemShared *shared = NULL;

/* The entry of waits[] whose slot this backend holds, or -1. */
static int	my_wait_entry = -1;
static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

static void
stats_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(MAXALIGN(sizeof(IdemShared)));
}

static void
stats_shmem_startup(void)
{
	bool		found;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	shared = ShmemInitStruct("idempotency", sizeof(IdemShared), &found);
	if (!found)
	{
		for (int i = 0; i < IDEM_NUM_COUNTERS; i++)
			pg_atomic_init_u64(&shared->counters[i], 0);
		pg_atomic_init_u64(&shared->reset_at, (uint64) GetCurrentTimestamp());
		SpinLockInit(&shared->wait_lock);
		for (int i = 0; i < IDEM_WAIT_DATABASES; i++)
		{
			shared->waits[i].dbid = InvalidOid;
			shared->waits[i].waiting = 0;
		}
	}
	LWLockRelease(AddinShmemInitLock);
}

/* Called from _PG_init while shared_preload_libraries is processed. */
void
idem_stats_preload(void)
{
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = stats_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = stats_shmem_startup;
}

void
idem_count_add(IdemCounter counter, uint64 n)
{
	if (shared != NULL)
		pg_atomic_fetch_add_u64(&shared->counters[counter], n);
}

/*
 * Take a waiter slot of the current database if fewer than limit backends of
 * it hold one.  Without shared memory there is nothing to count in: the
 * caller decides what that means.  A backend holds at most one slot.
 */
IdemWaiterSlot
idem_waiter_acquire(int limit)
{
	int			entry = -1;

	if (shared == NULL)
		return IDEM_WAITER_UNLIMITED;
	Assert(my_wait_entry < 0);
	if (limit <= 0)
		return IDEM_WAITER_FULL;

	SpinLockAcquire(&shared->wait_lock);
	for (int i = 0; i < IDEM_WAIT_DATABASES; i++)
	{
		IdemWaitEntry *e = &shared->waits[i];

		if (e->waiting > 0 && e->dbid == MyDatabaseId)
		{
			entry = i;
			break;
		}
		if (e->waiting == 0 && entry < 0)
			entry = i;			/* the first free one, if the database has none */
	}
	if (entry >= 0 && shared->waits[entry].waiting < (uint32) limit)
	{
		shared->waits[entry].dbid = MyDatabaseId;
		shared->waits[entry].waiting++;
		my_wait_entry = entry;
	}
	SpinLockRelease(&shared->wait_lock);

	return my_wait_entry >= 0 ? IDEM_WAITER_TAKEN : IDEM_WAITER_FULL;
}

/* Give back this backend's waiter slot; a no-op when it holds none. */
void
idem_waiter_release(void)
{
	if (my_wait_entry < 0)
		return;
	SpinLockAcquire(&shared->wait_lock);
	Assert(shared->waits[my_wait_entry].waiting > 0);
	shared->waits[my_wait_entry].waiting--;
	SpinLockRelease(&shared->wait_lock);
	my_wait_entry = -1;
}

static void
require_shared(void)
{
	if (shared == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idempotency statistics are not available"),
				 errdetail("They are kept in shared memory, which the library reserves only when the server loads it at start."),
				 errhint("Add idempotency to shared_preload_libraries and restart the server.")));
}

/* idem_stats() -> TABLE (counter text, value bigint, since timestamptz) */
Datum
idem_stats(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Datum		since;

	require_shared();
	InitMaterializedSRF(fcinfo, 0);
	since = TimestampTzGetDatum((TimestampTz) pg_atomic_read_u64(&shared->reset_at));
	for (int i = 0; i < IDEM_NUM_COUNTERS; i++)
	{
		Datum		values[3] = {
			CStringGetTextDatum(counter_names[i]),
			Int64GetDatum((int64) pg_atomic_read_u64(&shared->counters[i])),
			since
		};
		bool		nulls[3] = {false, false, false};

		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}

	/* not a counter: how many backends wait in idem_await now */
	{
		uint64		waiting = 0;
		Datum		values[3];
		bool		nulls[3] = {false, false, false};

		SpinLockAcquire(&shared->wait_lock);
		for (int i = 0; i < IDEM_WAIT_DATABASES; i++)
			waiting += shared->waits[i].waiting;
		SpinLockRelease(&shared->wait_lock);

		values[0] = CStringGetTextDatum("await_waiting");
		values[1] = Int64GetDatum((int64) waiting);
		values[2] = since;
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}

Datum
idem_stats_reset(PG_FUNCTION_ARGS)
{
	require_shared();
	for (int i = 0; i < IDEM_NUM_COUNTERS; i++)
		pg_atomic_write_u64(&shared->counters[i], 0);
	pg_atomic_write_u64(&shared->reset_at, (uint64) GetCurrentTimestamp());
	PG_RETURN_VOID();
}
