/*-------------------------------------------------------------------------
 *
 * stats.h
 *		The counters and idem_await's waiter slots (stats.c).
 *
 * Both live in shared memory, which idem_stats_preload requests from
 * _PG_init when the library is in shared_preload_libraries; without it a
 * count does nothing and the waiter limit cannot apply.  A count is one
 * atomic add, of calls as they happen (a rolled-back claim still counts);
 * the waiter slots are taken and released under a spinlock, and a slot
 * taken must be released however the wait ends.  Nothing survives a
 * restart.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_STATS_H
#define IDEM_STATS_H

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

#endif							/* IDEM_STATS_H */
