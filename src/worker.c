/*-------------------------------------------------------------------------
 *
 * worker.c
 *		The purge worker: idem_purge every idempotency.purge_interval in the
 *		databases listed in idempotency.databases.
 *
 * Only with the library in shared_preload_libraries.  A launcher (a static
 * background worker, restarted by the postmaster if it crashes) connects to
 * no database, and shows in pg_stat_activity as "idempotency purge
 * launcher".  Every interval it starts, one database at a time, a short
 * dynamic worker that connects to that database, calls idem_purge in
 * transactions of one batch per table until nothing expired is left, and
 * exits.  A database without the extension is skipped quietly.  The launcher
 * waits for each run to end before it starts the next, so runs never
 * overlap.
 *
 * The settings are PGC_SIGHUP: on SIGHUP the launcher reloads the
 * configuration and uses the new list and interval at once; an interval of 0
 * pauses purging.  SIGTERM (a shutdown, or pg_terminate_backend) ends the
 * launcher after the current run; the postmaster starts it again unless the
 * server is shutting down.  A purge run is cancelled like any backend.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/proc.h"
#include "tcop/tcopprot.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/varlena.h"
#include "utils/wait_event.h"

#include "idempotency.h"

PGDLLEXPORT void idem_launcher_main(Datum arg);
PGDLLEXPORT void idem_purge_main(Datum arg);

void
idem_worker_preload(void)
{
	BackgroundWorker worker;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = 10;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "idempotency");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "idem_launcher_main");
	snprintf(worker.bgw_name, BGW_MAXLEN, "idempotency purge launcher");
	snprintf(worker.bgw_type, BGW_MAXLEN, "idempotency purge launcher");
	RegisterBackgroundWorker(&worker);
}

/* Start a purge run in database dbname and wait for it to end. */
static void
run_purge(const char *dbname)
{
	BackgroundWorker worker;
	BackgroundWorkerHandle *handle;
	pid_t		pid;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = BGW_NEVER_RESTART;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "idempotency");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "idem_purge_main");
	snprintf(worker.bgw_name, BGW_MAXLEN, "idempotency purge %s", dbname);
	snprintf(worker.bgw_type, BGW_MAXLEN, "idempotency purge");
	strlcpy(worker.bgw_extra, dbname, BGW_EXTRALEN);
	worker.bgw_notify_pid = MyProcPid;

	if (!RegisterDynamicBackgroundWorker(&worker, &handle))
	{
		ereport(LOG,
				(errmsg("could not start the idempotency purge of database \"%s\"", dbname),
				 errhint("Raise max_worker_processes.")));
		return;
	}
	if (WaitForBackgroundWorkerStartup(handle, &pid) != BGWH_STARTED)
		return;
	(void) WaitForBackgroundWorkerShutdown(handle);
}

void
idem_launcher_main(Datum arg)
{
	TimestampTz next_run = GetCurrentTimestamp();

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, SignalHandlerForShutdownRequest);
	BackgroundWorkerUnblockSignals();

	/*
	 * Connected to no database, like the logical replication launcher: it
	 * reads no table, but shows in pg_stat_activity, and the postmaster's
	 * SIGUSR1 about its purge runs reaches it (a worker without a connection
	 * ignores SIGUSR1, and would wait for a run's end forever).
	 */
	BackgroundWorkerInitializeConnection(NULL, NULL, 0);

	ereport(LOG, (errmsg("idempotency purge launcher started")));

	while (!ShutdownRequestPending)
	{
		long		sleep_ms;

		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
			next_run = GetCurrentTimestamp();	/* a new interval applies now */
		}

		if (idem_purge_interval_s > 0 && GetCurrentTimestamp() >= next_run)
		{
			char	   *databases = pstrdup(idem_purge_databases);
			List	   *names;
			ListCell   *lc;

			if (!SplitIdentifierString(databases, ',', &names))
				ereport(LOG,
						(errmsg("invalid list syntax in idempotency.databases: \"%s\"",
								idem_purge_databases)));
			else
				foreach(lc, names)
				{
					if (ShutdownRequestPending)
						break;
					run_purge((const char *) lfirst(lc));
				}
			list_free(names);
			pfree(databases);
			next_run = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
												   (int64) idem_purge_interval_s * 1000);
		}

		/* a signal that came during a run: its latch wake-up was used up */
		if (ShutdownRequestPending || ConfigReloadPending)
			continue;

		sleep_ms = idem_purge_interval_s > 0
			? Max(TimestampDifferenceMilliseconds(GetCurrentTimestamp(), next_run), 1)
			: 60 * 1000;		/* paused: wake up only to notice a SIGHUP */
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 sleep_ms, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
	/*
	 * Exit code 1: the postmaster restarts the launcher after
	 * bgw_restart_time, unless the server is shutting down.  Exit code 0
	 * would unregister it for good, after a pg_terminate_backend too.
	 */
	ereport(LOG, (errmsg("idempotency purge launcher shutting down")));
	proc_exit(1);
}

/*
 * One purge run in one database: batches in transactions of their own, so
 * that no lock or snapshot is held for long.
 */
void
idem_purge_main(Datum arg)
{
	char		dbname[BGW_EXTRALEN];
	int64		total = 0;
	bool		more = true;

	strlcpy(dbname, MyBgworkerEntry->bgw_extra, sizeof(dbname));
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnection(dbname, NULL, 0);

	while (more)
	{
		char	   *schema = NULL;

		SetCurrentStatementStartTimestamp();
		StartTransactionCommand();
		SPI_connect();
		PushActiveSnapshot(GetTransactionSnapshot());
		pgstat_report_activity(STATE_RUNNING, "idempotency purge");

		if (SPI_execute("SELECT n.nspname FROM pg_catalog.pg_extension e "
						"JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) e.extnamespace "
						"WHERE e.extname OPERATOR(pg_catalog.=) 'idempotency'",
						true, 1) == SPI_OK_SELECT && SPI_processed == 1)
			schema = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);

		more = false;
		if (schema != NULL)
		{
			char	   *sql = psprintf("SELECT %s.idem_purge(%d, 1)",
									   quote_identifier(schema), idem_purge_batch_size);
			bool		isnull;
			int64		purged;

			if (SPI_execute(sql, false, 1) != SPI_OK_SELECT || SPI_processed != 1)
				elog(ERROR, "idempotency purge query failed");
			purged = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
												 SPI_tuptable->tupdesc, 1, &isnull));
			total += purged;
			more = purged > 0;
		}

		SPI_finish();
		PopActiveSnapshot();
		CommitTransactionCommand();
		pgstat_report_activity(STATE_IDLE, NULL);
		CHECK_FOR_INTERRUPTS();
	}
	if (total > 0)
		ereport(DEBUG1,
				(errmsg("idempotency purge removed %lld rows in database \"%s\"",
						(long long) total, dbname)));
	proc_exit(0);
}
