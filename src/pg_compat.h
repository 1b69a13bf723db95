/*-------------------------------------------------------------------------
 *
 * pg_compat.h
 *		Every PostgreSQL major-version difference the extension's C code
 *		meets, in one place.  Supported: 15, 17, 18.
 *
 * Each entry names the version that changed the API; the rest of the code
 * uses only the idem_ / IDEM_ names below, never PG_VERSION_NUM.  The
 * macros expand at their use, so a file includes the PostgreSQL header the
 * expansion needs (storage/proc.h, miscadmin.h, access/genam.h,
 * utils/relcache.h) as it did before.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_PG_COMPAT_H
#define IDEM_PG_COMPAT_H

#include "postgres.h"

#if PG_VERSION_NUM < 150000
#error "idempotency needs PostgreSQL 15 or later"
#endif

/*
 * 16 moved the varlena macros (VARDATA, VARSIZE_ANY_EXHDR, ...) out of
 * postgres.h into varatt.h; a file that uses them and gets varatt.h from no
 * other header it includes includes this one.
 */
#if PG_VERSION_NUM >= 160000
#include "varatt.h"
#endif

/*
 * 17 moved the backend's local transaction id into PGPROC.vxid (with the
 * proc number), so that a VirtualTransactionId can be read as one struct.
 */
#if PG_VERSION_NUM >= 170000
#define IDEM_MY_LXID	(MyProc->vxid.lxid)
#else
#define IDEM_MY_LXID	(MyProc->lxid)
#endif

/*
 * 17 removed the IsBackgroundWorker flag; the backend type says the same
 * (parallel workers are background workers in both).
 */
#if PG_VERSION_NUM >= 170000
#define IDEM_AM_BACKGROUND_WORKER()	AmBackgroundWorkerProcess()
#else
#define IDEM_AM_BACKGROUND_WORKER()	(IsBackgroundWorker)
#endif

/*
 * 18 gave index_beginscan an IndexScanInstrumentation argument (for
 * EXPLAIN's index search counts); the extension's scans are not
 * instrumented.
 */
#if PG_VERSION_NUM >= 180000
#define idem_index_beginscan(heap, index, snapshot, nkeys, norderbys) \
	index_beginscan((heap), (index), (snapshot), NULL, (nkeys), (norderbys))
#else
#define idem_index_beginscan(heap, index, snapshot, nkeys, norderbys) \
	index_beginscan((heap), (index), (snapshot), (nkeys), (norderbys))
#endif

/*
 * 18's relcache also remembers a deferrable primary key, and
 * RelationGetPrimaryKeyIndex returns it only when asked (deferrable_ok).
 * Before 18 a deferrable primary key was never returned: false keeps that.
 */
#if PG_VERSION_NUM >= 180000
#define idem_primary_key_index(rel)	RelationGetPrimaryKeyIndex((rel), false)
#else
#define idem_primary_key_index(rel)	RelationGetPrimaryKeyIndex(rel)
#endif

/*
 * 17 gave LockHeldByMe an orstronger argument; false asks about the mode
 * itself, as before.
 */
#if PG_VERSION_NUM >= 170000
#define idem_lock_held_by_me(tag, mode)	LockHeldByMe((tag), (mode), false)
#else
#define idem_lock_held_by_me(tag, mode)	LockHeldByMe((tag), (mode))
#endif

/*
 * 16 gave ExecInsertIndexTuples an onlySummarizing argument (HOT updates
 * that change only summarizing indexes' columns); an insert updates all.
 */
#if PG_VERSION_NUM >= 160000
#define idem_insert_index_tuples(rri, slot, estate, nodup, conflict, arbiters) \
	ExecInsertIndexTuples((rri), (slot), (estate), false, (nodup), (conflict), \
						  (arbiters), false)
#else
#define idem_insert_index_tuples(rri, slot, estate, nodup, conflict, arbiters) \
	ExecInsertIndexTuples((rri), (slot), (estate), false, (nodup), (conflict), \
						  (arbiters))
#endif

/*
 * 16 gave EvalPlanQualInit the list of result relations.  The direct
 * update never rechecks through EPQ (it holds the row lock before the
 * executor's trigger code looks), but ExecSimpleRelationUpdate wants one.
 */
#if PG_VERSION_NUM >= 160000
#define idem_epq_init(epqstate, estate) \
	EvalPlanQualInit((epqstate), (estate), NULL, NIL, -1, NIL)
#else
#define idem_epq_init(epqstate, estate) \
	EvalPlanQualInit((epqstate), (estate), NULL, NIL, -1)
#endif

/*
 * 18 gave ExecCheckIndexConstraints the TID of a tuple to ignore (ON
 * CONFLICT DO UPDATE of a row moved by a concurrent update); an insert has
 * none.
 */
#if PG_VERSION_NUM >= 180000
#define idem_check_index_constraints(rri, slot, estate, conflict_tid, no_tid, arbiters) \
	ExecCheckIndexConstraints((rri), (slot), (estate), (conflict_tid), (no_tid), \
							  (arbiters))
#else
#define idem_check_index_constraints(rri, slot, estate, conflict_tid, no_tid, arbiters) \
	((void) (no_tid), \
	 ExecCheckIndexConstraints((rri), (slot), (estate), (conflict_tid), (arbiters)))
#endif

/*
 * 18 added virtual generated columns; like stored ones they need the
 * executor's expression machinery, which the direct writes leave to SPI.
 */
#if PG_VERSION_NUM >= 180000
#define idem_has_generated(constr) \
	((constr) != NULL && ((constr)->has_generated_stored || (constr)->has_generated_virtual))
#else
#define idem_has_generated(constr) \
	((constr) != NULL && (constr)->has_generated_stored)
#endif

#endif							/* IDEM_PG_COMPAT_H */
