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
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "funcapi.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "idempotency.h"

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
};

typedef struct IdemShared
{
	pg_atomic_uint64 counters[IDEM_NUM_COUNTERS];
	pg_atomic_uint64 reset_at;	/* TimestampTz of the last reset */
} IdemShared;

static IdemShared *shared = NULL;
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
