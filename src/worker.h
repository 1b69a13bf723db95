/*-------------------------------------------------------------------------
 *
 * worker.h
 *		The purge worker's settings and its registration (worker.c).
 *
 * idem_worker_preload registers the purge launcher from _PG_init, only when
 * the library is in shared_preload_libraries.  The settings are PGC_SIGHUP,
 * defined by idempotency.c: the launcher reads them again between runs, and
 * a run reads the batch size when it starts.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_WORKER_H
#define IDEM_WORKER_H

/* worker.c */
extern int	idem_purge_interval_s;
extern int	idem_purge_batch_size;
extern char *idem_purge_databases;
extern void idem_worker_preload(void);

#endif							/* IDEM_WORKER_H */
