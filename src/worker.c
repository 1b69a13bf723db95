/*-------------------------------------------------------------------------
 *
 * worker.c
 *		The purge worker: idem_purge every idempotency.purge_interval in the
 *		databases listed in idempotency.databases.
 *
 * Only with the library in shared_preload_libraries.  A launcher (a static
 * background worker, restarted by the postmaster if it exits) connects to no
 * database, and shows in pg_stat_activity as "idempotency purge launcher".
 * Every interval it goes through the list (a round): for each name it looks
 * the database up in pg_database (a shared catalog), and if it exists and
 * accepts connections, starts a purge run, a short dynamic worker that
 * connects to it by OID, calls idem_purge in transactions of one batch per
 * table, and exits.  The launcher waits for each run to end before it starts
 * the next, so runs never overlap.
 *
 * A run is bounded: it ends when a transaction finds less than a full batch,
 * or after PURGE_RUN_MAX_BATCHES transactions, so that a database where rows
 * expire faster than one run purges them cannot starve the databases after
 * it.  A run that stopped at the bound makes the launcher start the next
 * round at once instead of after the interval: a backlog is worked off in
 * turns, database after database.
 *
 * Each run reports how it ended (WorkerShared, in shared memory: runs never
 * overlap, so one slot, tagged with the run's number, is enough).  The
 * launcher keeps, per listed name, why it was last skipped (missing, no
 * connections, invalid, no extension), and logs a skip only when that
 * reason changes: one LOG line, not one per interval.  The states are
 * forgotten when the list changes.
 *
 * Interrupts: every wait of the launcher (its main loop, the wait for a run)
 * goes through launcher_interrupts(), which absorbs ProcSignalBarriers (DROP
 * DATABASE, ALTER DATABASE SET TABLESPACE and DROP TABLESPACE wait for them),
 * answers pg_log_backend_memory_contexts and sinval catch-up requests, and
 * drops a cancel request: the launcher runs no statement, so there is
 * nothing to cancel (a run is cancelled with pg_cancel_backend of its own
 * PID).  SIGTERM (a shutdown, or pg_terminate_backend) ends the launcher
 * between runs with exit code 1, so that the postmaster starts it again
 * unless the server is shutting down.  A run ends on SIGTERM or a cancel
 * like any backend.
 *
 * The settings are PGC_SIGHUP.  The launcher reloads between runs; a new
 * list or interval ends the round, and a new one starts at once.  A run
 * reads idempotency.purge_batch_size when it starts.
 *
 * On a hot standby the launcher runs (BgWorkerStart_ConsistentState) but
 * starts no run while recovery lasts, and says so once; after a promotion
 * its next round purges.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/skey.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/pg_database.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/proc.h"
#include "storage/shmem.h"
#include "storage/sinval.h"
#include "storage/spin.h"
#include "tcop/tcopprot.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/varlena.h"
#include "utils/wait_event.h"

#include "idempotency.h"

PGDLLEXPORT void idem_launcher_main(Datum arg);
PGDLLEXPORT void idem_purge_main(Datum arg);

/* Most transactions (of one batch per table each) of one purge run. */
#define PURGE_RUN_MAX_BATCHES 10

/* How a run ended, as it reports it to the launcher. */
typedef enum PurgeOutcome
{
	PURGE_FAILED = 0,			/* no report: an error, a cancel, a crash */
	PURGE_NOT_STARTED,			/* no worker slot was free */
	PURGE_DONE,					/* a transaction found less than a full batch */
	PURGE_BOUNDED,				/* stopped after PURGE_RUN_MAX_BATCHES */
	PURGE_NO_EXTENSION			/* the database has no extension idempotency */
} PurgeOutcome;

/* In shared memory: the outcome of the run the launcher waits for. */
typedef struct WorkerShared
{
	slock_t		mutex;
	uint32		run_id;			/* the run whose outcome is kept */
	PurgeOutcome outcome;
} WorkerShared;

/* What the launcher hands a run, in bgw_extra. */
typedef struct PurgeRunArgs
{
	Oid			dboid;
	uint32		run_id;
	char		dbname[NAMEDATALEN];
} PurgeRunArgs;

StaticAssertDecl(sizeof(PurgeRunArgs) <= BGW_EXTRALEN,
				 "PurgeRunArgs must fit in bgw_extra");

/* Why the launcher last skipped a listed database (or that it did not). */
typedef enum DbState
{
	DB_UNSEEN = 0,
	DB_PURGED,
	DB_MISSING,
	DB_NO_CONNECTIONS,
	DB_INVALID,
	DB_NO_EXTENSION
} DbState;

typedef struct DbStatus
{
	char		name[NAMEDATALEN];
	DbState		state;
} DbStatus;

static WorkerShared *worker_shared = NULL;
static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

/* Launcher state: per-name skip states, and memory reset every round. */
static List *db_states = NIL;
static MemoryContext launcher_cxt = NULL;
static MemoryContext round_cxt = NULL;
static uint32 run_counter = 0;

static void
worker_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(MAXALIGN(sizeof(WorkerShared)));
}

static void
worker_shmem_startup(void)
{
	bool		found;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();
	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	worker_shared = ShmemInitStruct("idempotency purge worker",
									sizeof(WorkerShared), &found);
	if (!found)
	{
		SpinLockInit(&worker_shared->mutex);
		worker_shared->run_id = 0;
		worker_shared->outcome = PURGE_FAILED;
	}
	LWLockRelease(AddinShmemInitLock);
}

void
idem_worker_preload(void)
{
	BackgroundWorker worker;

	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = worker_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = worker_shmem_startup;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	/* also on a hot standby, to say once that it does not purge there */
	worker.bgw_start_time = BgWorkerStart_ConsistentState;
	worker.bgw_restart_time = 10;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "idempotency");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "idem_launcher_main");
	snprintf(worker.bgw_name, BGW_MAXLEN, "idempotency purge launcher");
	snprintf(worker.bgw_type, BGW_MAXLEN, "idempotency purge launcher");
	RegisterBackgroundWorker(&worker);
}

/*
 * The launcher's interrupts, handled the way the autovacuum launcher does,
 * after every wake-up of every wait.
 */
static void
launcher_interrupts(void)
{
	/* no statement runs here, so a cancel request has nothing to cancel */
	QueryCancelPending = false;

	/* ProcSignalBarriers, pg_log_backend_memory_contexts */
	CHECK_FOR_INTERRUPTS();

	/* read the invalidation messages that queued up while we slept */
	ProcessCatchupInterrupt();
}

/*
 * Reload the configuration.  True if the list or the interval changed: the
 * launcher then starts a round at once.  A new list forgets the skip states.
 */
static bool
launcher_reload(void)
{
	char	   *old_list = MemoryContextStrdup(launcher_cxt, idem_purge_databases);
	int			old_interval = idem_purge_interval_s;
	bool		new_list;

	ConfigReloadPending = false;
	ProcessConfigFile(PGC_SIGHUP);

	new_list = strcmp(old_list, idem_purge_databases) != 0;
	pfree(old_list);
	if (new_list)
	{
		list_free_deep(db_states);
		db_states = NIL;
	}
	return new_list || old_interval != idem_purge_interval_s;
}

/* Log the state of a listed database when it changes (the skip reasons). */
static void
note_state(const char *name, DbState state)
{
	DbStatus   *status = NULL;
	ListCell   *lc;

	foreach(lc, db_states)
	{
		if (strcmp(((DbStatus *) lfirst(lc))->name, name) == 0)
		{
			status = (DbStatus *) lfirst(lc);
			break;
		}
	}
	if (status == NULL)
	{
		MemoryContext old = MemoryContextSwitchTo(launcher_cxt);

		status = palloc0(sizeof(DbStatus));
		strlcpy(status->name, name, NAMEDATALEN);
		status->state = DB_UNSEEN;
		db_states = lappend(db_states, status);
		MemoryContextSwitchTo(old);
	}
	if (status->state == state)
		return;

	switch (state)
	{
		case DB_UNSEEN:
			break;
		case DB_PURGED:
			if (status->state != DB_UNSEEN)
				ereport(LOG,
						(errmsg("idempotency purge resumes in database \"%s\"", name)));
			break;
		case DB_MISSING:
			ereport(LOG,
					(errcode(ERRCODE_UNDEFINED_DATABASE),
					 errmsg("idempotency purge skips database \"%s\", which does not exist",
							name),
					 errhint("Create the database, or remove it from idempotency.databases.")));
			break;
		case DB_NO_CONNECTIONS:
			ereport(LOG,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("idempotency purge skips database \"%s\", which does not allow connections",
							name),
					 errhint("Allow connections with ALTER DATABASE ... ALLOW_CONNECTIONS true, or remove it from idempotency.databases.")));
			break;
		case DB_INVALID:
			ereport(LOG,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("idempotency purge skips database \"%s\", which is invalid",
							name),
					 errdetail("A DROP DATABASE of it was interrupted."),
					 errhint("Drop it with DROP DATABASE, or remove it from idempotency.databases.")));
			break;
		case DB_NO_EXTENSION:
			ereport(LOG,
					(errcode(ERRCODE_UNDEFINED_OBJECT),
					 errmsg("idempotency purge skips database \"%s\", which does not have the extension idempotency",
							name),
					 errhint("Run CREATE EXTENSION idempotency in that database, or remove it from idempotency.databases.")));
			break;
	}
	status->state = state;
}

/*
 * Look a database up by name in pg_database, as the autovacuum launcher
 * reads it: a shared catalog, readable without a database connection.
 * Returns its state: DB_MISSING, DB_INVALID, DB_NO_CONNECTIONS, or
 * DB_PURGED with *dboid set (it can be purged).
 */
static DbState
lookup_database(const char *name, Oid *dboid)
{
	Relation	rel;
	TableScanDesc scan;
	ScanKeyData key;
	HeapTuple	tuple;
	DbState		state = DB_MISSING;

	/* no cancel in here: launcher_interrupts() drops it afterwards */
	HOLD_CANCEL_INTERRUPTS();
	StartTransactionCommand();
	(void) GetTransactionSnapshot();

	rel = table_open(DatabaseRelationId, AccessShareLock);
	ScanKeyInit(&key, Anum_pg_database_datname, BTEqualStrategyNumber, F_NAMEEQ,
				CStringGetDatum(name));
	scan = table_beginscan_catalog(rel, 1, &key);
	tuple = heap_getnext(scan, ForwardScanDirection);
	if (HeapTupleIsValid(tuple))
	{
		Form_pg_database db = (Form_pg_database) GETSTRUCT(tuple);

		*dboid = db->oid;
		if (database_is_invalid_form(db))
			state = DB_INVALID;
		else if (!db->datallowconn)
			state = DB_NO_CONNECTIONS;
		else
			state = DB_PURGED;
	}
	table_endscan(scan);
	table_close(rel, AccessShareLock);

	CommitTransactionCommand();
	RESUME_CANCEL_INTERRUPTS();
	return state;
}

/* Start a purge run in one database and wait for it to end. */
static PurgeOutcome
run_purge(Oid dboid, const char *dbname)
{
	BackgroundWorker worker;
	BackgroundWorkerHandle *handle;
	PurgeRunArgs args;
	PurgeOutcome outcome;

	memset(&args, 0, sizeof(args));
	args.dboid = dboid;
	args.run_id = ++run_counter;
	strlcpy(args.dbname, dbname, NAMEDATALEN);

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = BGW_NEVER_RESTART;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "idempotency");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "idem_purge_main");
	snprintf(worker.bgw_name, BGW_MAXLEN, "idempotency purge %s", dbname);
	snprintf(worker.bgw_type, BGW_MAXLEN, "idempotency purge");
	memcpy(worker.bgw_extra, &args, sizeof(args));
	worker.bgw_notify_pid = MyProcPid;

	SpinLockAcquire(&worker_shared->mutex);
	worker_shared->run_id = args.run_id;
	worker_shared->outcome = PURGE_FAILED;
	SpinLockRelease(&worker_shared->mutex);

	if (!RegisterDynamicBackgroundWorker(&worker, &handle))
	{
		ereport(LOG,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("could not start the idempotency purge of database \"%s\"", dbname),
				 errhint("Raise max_worker_processes.")));
		return PURGE_NOT_STARTED;
	}

	/*
	 * Like WaitForBackgroundWorkerShutdown, with the launcher's interrupts.
	 * The postmaster sets our latch when the run starts and when it ends
	 * (bgw_notify_pid).  A shutdown request waits for the run (it is
	 * bounded), except for one not started yet, which is withdrawn.
	 */
	for (;;)
	{
		pid_t		pid;
		BgwHandleStatus status = GetBackgroundWorkerPid(handle, &pid);

		if (status == BGWH_STOPPED || status == BGWH_POSTMASTER_DIED)
			break;
		if (status == BGWH_NOT_YET_STARTED && ShutdownRequestPending)
			TerminateBackgroundWorker(handle);

		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_EXIT_ON_PM_DEATH, 0,
						 PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		launcher_interrupts();
	}
	pfree(handle);

	SpinLockAcquire(&worker_shared->mutex);
	outcome = worker_shared->run_id == args.run_id ? worker_shared->outcome : PURGE_FAILED;
	SpinLockRelease(&worker_shared->mutex);
	return outcome;
}

/*
 * One round: a run in each listed database, in the order of the list.
 * Returns true if the next round should start at once: a run stopped at its
 * bound, or a reload changed the list or the interval.
 */
static bool
purge_round(void)
{
	char	   *databases = pstrdup(idem_purge_databases);
	List	   *names;
	ListCell   *lc;
	bool		again = false;

	if (!SplitIdentifierString(databases, ',', &names))
	{
		/* the check hook refuses such a list: cannot happen */
		ereport(LOG,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid list syntax in idempotency.databases: \"%s\"",
						idem_purge_databases)));
		return false;
	}

	foreach(lc, names)
	{
		const char *name = (const char *) lfirst(lc);
		Oid			dboid = InvalidOid;
		DbState		state;

		if (ShutdownRequestPending)
			break;
		if (ConfigReloadPending && launcher_reload())
		{
			again = true;
			break;
		}

		state = lookup_database(name, &dboid);
		if (state == DB_PURGED)
		{
			switch (run_purge(dboid, name))
			{
				case PURGE_NO_EXTENSION:
					state = DB_NO_EXTENSION;
					break;
				case PURGE_BOUNDED:
					again = true;
					break;
				case PURGE_DONE:
					break;
				case PURGE_FAILED:
				case PURGE_NOT_STARTED:
					continue;	/* logged already; try again next round */
			}
		}
		note_state(name, state);
	}
	return again;
}

void
idem_launcher_main(Datum arg)
{
	TimestampTz next_run = GetCurrentTimestamp();
	bool		said_recovery = false;

	/*
	 * SIGINT keeps the StatementCancelHandler that bgworker.c sets for a
	 * worker with a database connection: launcher_interrupts() drops the
	 * request.
	 */
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, SignalHandlerForShutdownRequest);
	BackgroundWorkerUnblockSignals();

	/*
	 * Connected to no database, like the logical replication launcher: it
	 * reads only pg_database, shows in pg_stat_activity, and gets the
	 * postmaster's SIGUSR1 about its runs and ProcSignals (a worker without
	 * a connection ignores SIGUSR1).
	 */
	BackgroundWorkerInitializeConnection(NULL, NULL, 0);

	launcher_cxt = AllocSetContextCreate(TopMemoryContext,
										 "idempotency purge launcher",
										 ALLOCSET_SMALL_SIZES);
	round_cxt = AllocSetContextCreate(launcher_cxt,
									  "idempotency purge round",
									  ALLOCSET_DEFAULT_SIZES);

	ereport(LOG, (errmsg("idempotency purge launcher started")));

	for (;;)
	{
		long		sleep_ms;

		launcher_interrupts();
		if (ShutdownRequestPending)
			break;
		if (ConfigReloadPending && launcher_reload())
			next_run = GetCurrentTimestamp();	/* the new settings apply now */

		if (idem_purge_interval_s > 0 && GetCurrentTimestamp() >= next_run)
		{
			bool		again = false;

			if (RecoveryInProgress())
			{
				if (!said_recovery)
					ereport(LOG,
							(errmsg("idempotency purge launcher does not purge while the server is in recovery"),
							 errdetail("A standby receives the primary's purges through replication. Purging starts after a promotion.")));
				said_recovery = true;
			}
			else
			{
				MemoryContext old;

				if (said_recovery)
					ereport(LOG,
							(errmsg("idempotency purge launcher starts purging after the end of recovery")));
				said_recovery = false;

				old = MemoryContextSwitchTo(round_cxt);
				again = purge_round();
				MemoryContextSwitchTo(old);
				MemoryContextReset(round_cxt);
			}
			next_run = again ? GetCurrentTimestamp()
				: TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
											  (int64) idem_purge_interval_s * 1000);
			continue;			/* interrupts first, then maybe sleep */
		}

		sleep_ms = idem_purge_interval_s > 0
			? Max(TimestampDifferenceMilliseconds(GetCurrentTimestamp(), next_run), 1)
			: 60 * 1000;		/* paused: only a signal matters */
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

/* Report how this run ended, if the launcher still waits for it. */
static void
report_outcome(uint32 run_id, PurgeOutcome outcome)
{
	SpinLockAcquire(&worker_shared->mutex);
	if (worker_shared->run_id == run_id)
		worker_shared->outcome = outcome;
	SpinLockRelease(&worker_shared->mutex);
}

/*
 * One transaction of a purge run: one batch per table.  Returns the rows
 * deleted, or -1 if the database has no extension idempotency.
 */
static int64
purge_one_batch(void)
{
	char	   *schema = NULL;
	int64		purged = -1;

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

	if (schema != NULL)
	{
		char	   *sql = psprintf("SELECT %s.idem_purge(%d, 1)",
								   quote_identifier(schema), idem_purge_batch_size);
		bool		isnull;

		if (SPI_execute(sql, false, 1) != SPI_OK_SELECT || SPI_processed != 1)
			elog(ERROR, "idempotency purge query failed");
		purged = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
											 SPI_tuptable->tupdesc, 1, &isnull));
	}

	SPI_finish();
	PopActiveSnapshot();
	CommitTransactionCommand();
	pgstat_report_activity(STATE_IDLE, NULL);
	return purged;
}

/*
 * One purge run in one database: batches in transactions of their own, so
 * that no lock or snapshot is held for long, and at most
 * PURGE_RUN_MAX_BATCHES of them.
 */
void
idem_purge_main(Datum arg)
{
	PurgeRunArgs args;
	PurgeOutcome outcome = PURGE_DONE;
	int64		total = 0;
	int			batches = 0;

	memcpy(&args, MyBgworkerEntry->bgw_extra, sizeof(args));
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnectionByOid(args.dboid, InvalidOid, 0);

	for (;;)
	{
		int64		purged = purge_one_batch();

		CHECK_FOR_INTERRUPTS();
		if (purged < 0)
		{
			/* no extension, or it was dropped during the run */
			if (batches == 0)
				outcome = PURGE_NO_EXTENSION;
			break;
		}
		total += purged;
		batches++;
		/* a table with less than a full batch has nothing more expired */
		if (purged < idem_purge_batch_size)
			break;
		if (batches >= PURGE_RUN_MAX_BATCHES)
		{
			outcome = PURGE_BOUNDED;
			break;
		}
	}
	report_outcome(args.run_id, outcome);

	if (total > 0)
		ereport(DEBUG1,
				(errmsg("idempotency purge removed %lld rows in database \"%s\"",
						(long long) total, args.dbname),
				 outcome == PURGE_BOUNDED
				 ? errdetail("The run stopped after %d transactions; the next round starts at once.",
							 batches)
				 : 0));
	proc_exit(0);
}
