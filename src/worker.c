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
 * A run never waits for a lock on the extension's tables, so that a lock
 * held in one database (LOCK TABLE, VACUUM FULL, a pg_repack swap) cannot
 * stall the databases after it: each transaction first takes
 * RowExclusiveLock on idempotency_records and idem_inbox without waiting
 * (idem_purge's own requests for them are then no-ops), and if one is
 * taken by someone else, the run ends "busy" and the next round tries
 * again.  A run's statements also have a lock_timeout, for the locks
 * idem_purge takes on anything else (rows locked by a trigger, the epoch's
 * sequence); a run that times out ends "busy" too.
 *
 * Each run reports how it ended in WorkerShared (shared memory, under its
 * spinlock).  Run ids come from a counter there, so that they never repeat
 * across launcher restarts; the launcher stores the id of the run it waits
 * for, and only that run may write the outcome.  A run records its PID there
 * while it goes: a launcher starts no run while one is going, and a run
 * that starts after its launcher gave up on it (its id is no longer the
 * current one) exits at once.  So runs never overlap, even those of a
 * launcher that has exited.
 *
 * Logging: the launcher keeps, per listed name, its last state (purged,
 * missing, no connections, invalid, no extension, failed, no worker slot,
 * busy), and logs a state only when it changes: one LOG line, not one per
 * interval.  A run that fails with an ERROR catches it, logs it, and
 * reports it by a key (SQLSTATE and message); the launcher hands the key of
 * the last failure to the next run in that database, which logs the same
 * error again only at DEBUG1.  A database busy PURGE_BUSY_LOG_ROUNDS rounds
 * in a row is in state busy, said once at LOG (each busy run at DEBUG1), so
 * that a lock taken for a moment is no news.  The states are forgotten when the list
 * changes.
 *
 * Interrupts: every wait of the launcher (its main loop, the wait for a run)
 * goes through launcher_interrupts(), which absorbs ProcSignalBarriers (DROP
 * DATABASE, ALTER DATABASE SET TABLESPACE and DROP TABLESPACE wait for them),
 * answers pg_log_backend_memory_contexts and sinval catch-up requests.  The
 * launcher ignores SIGINT: it runs no statement, so there is nothing to
 * cancel, and a cancel pending while it logs would turn the next ereport
 * into an ERROR (errfinish checks for interrupts).  A run is cancelled with
 * pg_cancel_backend of its own PID.  SIGTERM (a shutdown, or
 * pg_terminate_backend) ends the launcher between runs, or terminates the
 * run it waits for, waits for it to end and then exits, with exit code 1 so
 * that the postmaster starts it again unless the server is shutting down.
 * A run ends on SIGTERM like any backend.
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
#include "common/hashfn.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lmgr.h"
#include "storage/proc.h"
#include "storage/shmem.h"
#include "storage/sinval.h"
#include "storage/spin.h"
#include "tcop/tcopprot.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/varlena.h"
#include "utils/wait_event.h"

#include "worker.h"

PGDLLEXPORT void idem_launcher_main(Datum arg);
PGDLLEXPORT void idem_purge_main(Datum arg);

/* Most transactions (of one batch per table each) of one purge run. */
#define PURGE_RUN_MAX_BATCHES 10

/* Busy rounds in a row after which a database's lock is said at LOG. */
#define PURGE_BUSY_LOG_ROUNDS 5

/* A run's lock_timeout: a run waits for no lock for long. */
#define PURGE_LOCK_TIMEOUT "1s"

/* How a run ended, as it reports it to the launcher. */
typedef enum PurgeOutcome
{
	PURGE_FAILED = 0,			/* no report: a FATAL, a crash, terminated */
	PURGE_NOT_STARTED,			/* no worker slot was free */
	PURGE_DONE,					/* a transaction found less than a full batch */
	PURGE_BOUNDED,				/* stopped after PURGE_RUN_MAX_BATCHES */
	PURGE_NO_EXTENSION,			/* the database has no extension idempotency */
	PURGE_BUSY,					/* a table was locked by someone else */
	PURGE_ERROR					/* an ERROR, logged; error_key says which */
} PurgeOutcome;

/* In shared memory, under mutex. */
typedef struct WorkerShared
{
	slock_t		mutex;
	uint32		last_run_id;	/* the last run id handed out */
	uint32		run_id;			/* the run the launcher waits for, or 0 */
	PurgeOutcome outcome;		/* how it ended */
	uint32		error_key;		/* for PURGE_ERROR: which error */
	pid_t		run_pid;		/* a run going (any launcher's), or 0 */
} WorkerShared;

/* What the launcher hands a run, in bgw_extra. */
typedef struct PurgeRunArgs
{
	Oid			dboid;
	uint32		run_id;
	uint32		quiet_error_key;	/* the last run's error: log it at DEBUG1 */
	char		dbname[NAMEDATALEN];
} PurgeRunArgs;

StaticAssertDecl(sizeof(PurgeRunArgs) <= BGW_EXTRALEN,
				 "PurgeRunArgs must fit in bgw_extra");

/* The last state of a listed database, as the launcher saw it. */
typedef enum DbState
{
	DB_UNSEEN = 0,
	DB_PURGED,
	DB_MISSING,
	DB_NO_CONNECTIONS,
	DB_INVALID,
	DB_NO_EXTENSION,
	DB_FAILED,
	DB_NO_SLOT,
	DB_BUSY						/* locked PURGE_BUSY_LOG_ROUNDS rounds in a row */
} DbState;

typedef struct DbStatus
{
	char		name[NAMEDATALEN];
	DbState		state;
	uint32		error_key;		/* for DB_FAILED */
	int			busy_rounds;	/* busy runs in a row */
} DbStatus;

static WorkerShared *worker_shared = NULL;
static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

/* Launcher state: per-name states, and memory reset every round. */
static List *db_states = NIL;
static MemoryContext launcher_cxt = NULL;
static MemoryContext round_cxt = NULL;

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
		worker_shared->last_run_id = 0;
		worker_shared->run_id = 0;
		worker_shared->outcome = PURGE_FAILED;
		worker_shared->error_key = 0;
		worker_shared->run_pid = 0;
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

	/*
	 * pg_upgrade starts the old and the new server in binary-upgrade mode,
	 * where nothing but pg_upgrade may write (it turns autovacuum off for
	 * that reason): no launcher there, as pg_cron does.
	 */
	if (IsBinaryUpgrade)
		return;

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
	MemoryContext old = CurrentMemoryContext;

	/* ProcSignalBarriers, pg_log_backend_memory_contexts */
	CHECK_FOR_INTERRUPTS();

	/*
	 * Read the invalidation messages that queued up while we slept.  It may
	 * run a transaction, which leaves CurrentMemoryContext in
	 * TopMemoryContext.
	 */
	ProcessCatchupInterrupt();
	MemoryContextSwitchTo(old);
}

/*
 * Reload the configuration.  True if the list or the interval changed: the
 * launcher then starts a round at once.  A new list forgets the states.
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

/* The state kept for a listed name, made on first use. */
static DbStatus *
get_status(const char *name)
{
	DbStatus   *status;
	MemoryContext old;
	ListCell   *lc;

	foreach(lc, db_states)
	{
		status = (DbStatus *) lfirst(lc);
		if (strcmp(status->name, name) == 0)
			return status;
	}
	old = MemoryContextSwitchTo(launcher_cxt);
	status = palloc0(sizeof(DbStatus));
	strlcpy(status->name, name, NAMEDATALEN);
	status->state = DB_UNSEEN;
	db_states = lappend(db_states, status);
	MemoryContextSwitchTo(old);
	return status;
}

/*
 * Log the state of a listed database when it changes.  error_key: for
 * DB_FAILED, which error (a different one is a change too).
 */
static void
note_state(DbStatus *status, DbState state, uint32 error_key)
{
	const char *name = status->name;

	if (state != DB_FAILED)
		error_key = 0;
	if (status->state == state && status->error_key == error_key)
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
			/* dropdb marks the row invalid before it removes the files */
			ereport(LOG,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("idempotency purge skips database \"%s\", which is invalid",
							name),
					 errdetail("It is being dropped, or a DROP DATABASE of it was interrupted."),
					 errhint("If it is not being dropped, drop it with DROP DATABASE, or remove it from idempotency.databases.")));
			break;
		case DB_NO_EXTENSION:
			ereport(LOG,
					(errcode(ERRCODE_UNDEFINED_OBJECT),
					 errmsg("idempotency purge skips database \"%s\", which does not have the extension idempotency",
							name),
					 errhint("Run CREATE EXTENSION idempotency in that database, or remove it from idempotency.databases.")));
			break;
		case DB_FAILED:
			ereport(LOG,
					(errmsg("idempotency purge of database \"%s\" failed", name),
					 errdetail("The purge run logged the error above. Later runs that fail with the same error log it at DEBUG1 only, until a run succeeds.")));
			break;
		case DB_BUSY:
			ereport(LOG,
					(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
					 errmsg("idempotency purge could not lock the tables of database \"%s\" in %d rounds in a row",
							name, status->busy_rounds),
					 errdetail("A session holds a lock on idempotency_records or idem_inbox that conflicts with deleting rows. Each round tries again."),
					 errhint("Look for the lock in pg_locks.")));
			break;
		case DB_NO_SLOT:
			ereport(LOG,
					(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
					 errmsg("could not start the idempotency purge of database \"%s\"", name),
					 errdetail("No background worker slot is free. Each round tries again; the launcher says when a run purges the database again."),
					 errhint("You might need to increase max_worker_processes (which needs a server restart).")));
			break;
	}
	status->state = state;
	status->error_key = error_key;
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
	MemoryContext old = CurrentMemoryContext;
	Relation	rel;
	TableScanDesc scan;
	ScanKeyData key;
	HeapTuple	tuple;
	DbState		state = DB_MISSING;

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

	/* the commit leaves us in TopMemoryContext: back to the round's */
	CommitTransactionCommand();
	MemoryContextSwitchTo(old);
	return state;
}

/*
 * Wait until no purge run is going, a previous launcher's included.  False
 * if a shutdown request came meanwhile.
 */
static bool
wait_for_other_run(void)
{
	bool		said = false;

	for (;;)
	{
		pid_t		pid;

		SpinLockAcquire(&worker_shared->mutex);
		pid = worker_shared->run_pid;
		SpinLockRelease(&worker_shared->mutex);
		if (pid == 0)
			return true;
		/*
		 * The run clears run_pid as it exits, and a crash reinitializes
		 * shared memory, so this is only a safeguard.  (Not
		 * BackendPidGetProc: a run sets run_pid before it is in the
		 * ProcArray.)
		 */
		if (kill(pid, 0) != 0 && errno == ESRCH)
		{
			SpinLockAcquire(&worker_shared->mutex);
			if (worker_shared->run_pid == pid)
				worker_shared->run_pid = 0;
			SpinLockRelease(&worker_shared->mutex);
			return true;
		}
		if (ShutdownRequestPending)
			return false;
		if (!said)
			ereport(LOG,
					(errmsg("idempotency purge launcher waits for the purge run with PID %d of a previous launcher to end",
							(int) pid)));
		said = true;

		/* its end sets no latch of ours: look again every second */
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 1000L, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		launcher_interrupts();
	}
}

/*
 * Start a purge run in one database and wait for it to end.  *error_key is
 * set for PURGE_ERROR.
 */
static PurgeOutcome
run_purge(Oid dboid, DbStatus *status, uint32 *error_key)
{
	BackgroundWorker worker;
	BackgroundWorkerHandle *handle;
	PurgeRunArgs args;
	PurgeOutcome outcome;
	bool		terminated = false;

	if (!wait_for_other_run())
		return PURGE_FAILED;

	memset(&args, 0, sizeof(args));
	args.dboid = dboid;
	args.quiet_error_key = status->state == DB_FAILED ? status->error_key : 0;
	strlcpy(args.dbname, status->name, NAMEDATALEN);

	SpinLockAcquire(&worker_shared->mutex);
	/* 0 stands for no run */
	if (++worker_shared->last_run_id == 0)
		worker_shared->last_run_id = 1;
	args.run_id = worker_shared->last_run_id;
	worker_shared->run_id = args.run_id;
	worker_shared->outcome = PURGE_FAILED;
	worker_shared->error_key = 0;
	SpinLockRelease(&worker_shared->mutex);

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = BGW_NEVER_RESTART;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "idempotency");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "idem_purge_main");
	snprintf(worker.bgw_name, BGW_MAXLEN, "idempotency purge %s", status->name);
	snprintf(worker.bgw_type, BGW_MAXLEN, "idempotency purge");
	memcpy(worker.bgw_extra, &args, sizeof(args));
	worker.bgw_notify_pid = MyProcPid;

	if (!RegisterDynamicBackgroundWorker(&worker, &handle))
		return PURGE_NOT_STARTED;

	/*
	 * Like WaitForBackgroundWorkerShutdown, with the launcher's interrupts.
	 * The postmaster sets our latch when the run starts and when it ends
	 * (bgw_notify_pid).  A shutdown request terminates the run (or withdraws
	 * it if not started yet), and waits for it to end: the launcher leaves
	 * no run behind.
	 */
	for (;;)
	{
		pid_t		pid;
		BgwHandleStatus bgw_status = GetBackgroundWorkerPid(handle, &pid);

		if (bgw_status == BGWH_STOPPED || bgw_status == BGWH_POSTMASTER_DIED)
			break;
		if (ShutdownRequestPending && !terminated)
		{
			TerminateBackgroundWorker(handle);
			terminated = true;
		}

		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_EXIT_ON_PM_DEATH, 0,
						 PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		launcher_interrupts();
	}
	pfree(handle);

	SpinLockAcquire(&worker_shared->mutex);
	outcome = worker_shared->run_id == args.run_id ? worker_shared->outcome : PURGE_FAILED;
	*error_key = worker_shared->error_key;
	worker_shared->run_id = 0;
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
		DbStatus   *status;
		Oid			dboid = InvalidOid;
		DbState		state;
		uint32		error_key = 0;

		if (ShutdownRequestPending)
			break;
		if (ConfigReloadPending && launcher_reload())
		{
			again = true;
			break;
		}

		status = get_status(name);
		state = lookup_database(name, &dboid);
		if (state == DB_PURGED)
		{
			PurgeOutcome outcome = run_purge(dboid, status, &error_key);

			if (outcome != PURGE_BUSY)
				status->busy_rounds = 0;
			switch (outcome)
			{
				case PURGE_DONE:
					break;
				case PURGE_BOUNDED:
					again = true;
					break;
				case PURGE_NO_EXTENSION:
					state = DB_NO_EXTENSION;
					break;
				case PURGE_ERROR:
					state = DB_FAILED;
					break;
				case PURGE_NOT_STARTED:
					state = DB_NO_SLOT;
					break;
				case PURGE_BUSY:
					/* a lock taken for a moment is no news */
					status->busy_rounds++;
					ereport(DEBUG1,
							(errmsg_internal("idempotency purge found the tables of database \"%s\" locked",
											 name)));
					if (status->busy_rounds < PURGE_BUSY_LOG_ROUNDS)
						continue;
					state = DB_BUSY;
					break;
				case PURGE_FAILED:
					/* a FATAL or a termination, logged by the run */
					continue;
			}
		}
		note_state(status, state, error_key);
	}
	return again;
}

void
idem_launcher_main(Datum arg)
{
	TimestampTz next_run = GetCurrentTimestamp();
	bool		said_recovery = false;

	/*
	 * No SIGINT: bgworker.c sets StatementCancelHandler for a worker with a
	 * database connection, but the launcher runs no statement, and a cancel
	 * pending while it logs would become an ERROR in errfinish's
	 * CHECK_FOR_INTERRUPTS.  ProcSignals (barriers, catch-up, memory context
	 * logging) come by SIGUSR1.
	 */
	pqsignal(SIGINT, SIG_IGN);
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
report_outcome(uint32 run_id, PurgeOutcome outcome, uint32 error_key)
{
	SpinLockAcquire(&worker_shared->mutex);
	if (worker_shared->run_id == run_id)
	{
		worker_shared->outcome = outcome;
		worker_shared->error_key = error_key;
	}
	SpinLockRelease(&worker_shared->mutex);
}

/* At the run's exit, however it ends: no run is going any more. */
static void
run_exit(int code, Datum arg)
{
	SpinLockAcquire(&worker_shared->mutex);
	if (worker_shared->run_pid == MyProcPid)
		worker_shared->run_pid = 0;
	SpinLockRelease(&worker_shared->mutex);
}

/* Take a lock on a table of the extension if nobody is in the way. */
static bool
lock_if_free(Oid nsp, const char *relname)
{
	Oid			relid = get_relname_relid(relname, nsp);

	/* a missing table is for idem_purge to report */
	return !OidIsValid(relid) || ConditionalLockRelationOid(relid, RowExclusiveLock);
}

/*
 * One transaction of a purge run: one batch per table.  Returns the rows
 * deleted, or -1 if the database has no extension idempotency, or -2 if a
 * table is locked by someone else.
 */
static int64
purge_one_batch(void)
{
	Oid			nsp = InvalidOid;
	char	   *nspname;
	int64		purged = -1;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	SPI_connect();
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, "idempotency purge");

	if (SPI_execute("SELECT e.extnamespace FROM pg_catalog.pg_extension e "
					"WHERE e.extname OPERATOR(pg_catalog.=) 'idempotency'",
					true, 1) == SPI_OK_SELECT && SPI_processed == 1)
	{
		bool		isnull;

		nsp = DatumGetObjectId(SPI_getbinval(SPI_tuptable->vals[0],
											 SPI_tuptable->tupdesc, 1, &isnull));
	}

	if (!OidIsValid(nsp))
		purged = -1;
	else if (!lock_if_free(nsp, "idempotency_records") ||
			 !lock_if_free(nsp, "idem_inbox") ||
			 !lock_if_free(nsp, "idem_outbox"))
		purged = -2;
	else if ((nspname = get_namespace_name(nsp)) == NULL)
		purged = -1;			/* the schema was dropped after the look-up */
	else
	{
		char	   *sql = psprintf("SELECT %s.idem_purge(%d, 1)",
								   quote_identifier(nspname),
								   idem_purge_batch_size);
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

/* Which error: its SQLSTATE and its message, never 0. */
static uint32
error_key_of(ErrorData *edata)
{
	uint32		key = (uint32) edata->sqlerrcode;

	if (edata->message)
		key ^= hash_bytes((const unsigned char *) edata->message,
						  strlen(edata->message));
	return key == 0 ? 1 : key;
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
	/* volatile: set inside PG_TRY, read after it */
	volatile PurgeOutcome outcome = PURGE_DONE;
	volatile uint32 error_key = 0;
	volatile int64 total = 0;
	volatile int batches = 0;
	bool		current;

	memcpy(&args, MyBgworkerEntry->bgw_extra, sizeof(args));

	/*
	 * Signals are still blocked: a run whose launcher gave up on it before it
	 * started (it exited, or a newer run is current) does nothing; else it
	 * says that it is going until it exits.
	 */
	SpinLockAcquire(&worker_shared->mutex);
	current = worker_shared->run_id == args.run_id && worker_shared->run_pid == 0;
	if (current)
		worker_shared->run_pid = MyProcPid;
	SpinLockRelease(&worker_shared->mutex);
	if (!current)
		proc_exit(0);
	before_shmem_exit(run_exit, (Datum) 0);

	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnectionByOid(args.dboid, InvalidOid, 0);
	SetConfigOption("lock_timeout", PURGE_LOCK_TIMEOUT, PGC_SUSET, PGC_S_OVERRIDE);

	/*
	 * An ERROR is caught, so that the same error every interval is logged
	 * once: the launcher hands the next run the key of this one's.
	 */
	PG_TRY();
	{
		for (;;)
		{
			int64		purged = purge_one_batch();

			CHECK_FOR_INTERRUPTS();
			if (purged == -2)
			{
				outcome = PURGE_BUSY;
				break;
			}
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
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		HOLD_INTERRUPTS();
		MemoryContextSwitchTo(TopMemoryContext);
		edata = CopyErrorData();

		/*
		 * A lock_timeout on a lock other than the tables' (a row lock taken
		 * by a trigger, the epoch's sequence) is the same as a table found
		 * locked: busy, not failed.
		 */
		if (edata->sqlerrcode == ERRCODE_LOCK_NOT_AVAILABLE)
			outcome = PURGE_BUSY;
		else
		{
			outcome = PURGE_ERROR;
			error_key = error_key_of(edata);
		}
		if (outcome == PURGE_ERROR && error_key != args.quiet_error_key)
			EmitErrorReport();
		AbortOutOfAnyTransaction();
		FlushErrorState();
		if (outcome == PURGE_BUSY || error_key == args.quiet_error_key)
		{
			/* busy, or the launcher said this one already */
			edata->elevel = DEBUG1;
			ThrowErrorData(edata);
		}
		RESUME_INTERRUPTS();
	}
	PG_END_TRY();
	report_outcome(args.run_id, outcome, error_key);

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
