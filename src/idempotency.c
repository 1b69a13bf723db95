/*-------------------------------------------------------------------------
 *
 * idempotency.c
 *		Module entry point and the idempotency.* settings.
 *
 * The library may be loaded on first use: everything but the statistics and
 * the purge worker works so.  Loaded through shared_preload_libraries, it
 * also reserves shared memory for the statistics (stats.c) and registers
 * the purge launcher (worker.c).  The settings are defined in _PG_init, and
 * the prefix "idempotency" is reserved so that a misspelled setting is
 * reported instead of silently ignored.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>

#include "miscadmin.h"
#include "utils/guc.h"
#include "utils/varlena.h"

#include "idempotency.h"
#include "stats.h"
#include "worker.h"

PG_MODULE_MAGIC;

/* Lease of a claim that passes lease => NULL. */
int			idem_default_lease_ms = 30 * 1000;

/* How long a finished record is kept when the claim passes retention => NULL. */
int			idem_retention_s = 24 * 60 * 60;

/* Longest key and scope, in bytes (Stripe allows 255 characters). */
int			idem_max_key_length = 255;

/* The outbox (outbox.c and the relay functions of the install script). */
int			idem_outbox_max_attempts = 10;
int			idem_outbox_retention_s = 24 * 60 * 60;
bool		idem_outbox_notify = true;

/* off: every write of the records and the inbox runs its SQL statement */
bool		idem_direct_writes = true;
static int	idem_outbox_stuck_after_s = 5 * 60;

/* Backends of a database that may wait in idem_await at once (await.c). */
int			idem_max_waiters = 4;

/* idempotency.scope: read by SQL (the tenant policies), not by C */
static char *idem_session_scope = NULL;

/* The purge worker (worker.c), when the library is preloaded. */
int			idem_purge_interval_s = 60;
int			idem_purge_batch_size = 10000;
char	   *idem_purge_databases = NULL;

void		_PG_init(void);

/* idempotency.databases must parse as a list of names, as the launcher reads it. */
static bool
check_database_list(char **newval, void **extra, GucSource source)
{
	char	   *copy = pstrdup(*newval);
	List	   *names;
	bool		ok = SplitIdentifierString(copy, ',', &names);

	list_free(names);
	pfree(copy);
	if (!ok)
		GUC_check_errdetail("List syntax is invalid.");
	return ok;
}

void
_PG_init(void)
{
	DefineCustomIntVariable("idempotency.default_lease",
							"Lease given to a claim that passes no lease.",
							NULL,
							&idem_default_lease_ms,
							30 * 1000,
							1,
							INT_MAX,
							PGC_USERSET,
							GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.retention",
							"How long a finished record is kept when the claim passes no retention.",
							"Counted from completion; until then the record is kept.",
							&idem_retention_s,
							24 * 60 * 60,
							1,
							INT_MAX,
							PGC_USERSET,
							GUC_UNIT_S,
							NULL, NULL, NULL);

	/*
	 * Read by the PL/pgSQL relay functions through current_setting();
	 * defined here for its range and its reserved name.
	 */
	DefineCustomIntVariable("idempotency.outbox_max_attempts",
							"Times a message is handed out before a failure makes it dead.",
							"After that many claims, a nack or an expired lease makes the message dead.",
							&idem_outbox_max_attempts,
							10,
							1,
							1000000,
							PGC_USERSET,
							0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.outbox_retention",
							"How long a published outbox message is kept before idem_purge removes it.",
							"Counted from publication. Pending, in-flight and dead messages are never purged.",
							&idem_outbox_retention_s,
							24 * 60 * 60,
							1,
							INT_MAX,
							PGC_USERSET,
							GUC_UNIT_S,
							NULL, NULL, NULL);

	/* read by the view idem_stuck through current_setting() */
	DefineCustomIntVariable("idempotency.outbox_stuck_after",
							"Age after which idem_stuck lists an outbox message not yet published.",
							NULL,
							&idem_outbox_stuck_after_s,
							5 * 60,
							1,
							INT_MAX,
							PGC_USERSET,
							GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomBoolVariable("idempotency.direct_writes",
							 "Whether claims, completions and inbox accepts skip SPI where they can.",
							 "Off: each write runs its SQL statement through SPI, as before 0.2.0 (for comparison).",
							 &idem_direct_writes,
							 true,
							 PGC_USERSET,
							 0,
							 NULL, NULL, NULL);

	DefineCustomBoolVariable("idempotency.outbox_notify",
							 "Whether idem_outbox_emit notifies relays on channel idem_outbox at commit.",
							 "Off: relays find new messages only by polling.",
							 &idem_outbox_notify,
							 true,
							 PGC_USERSET,
							 0,
							 NULL, NULL, NULL);

	/*
	 * The upper bound keeps (scope, key) well inside the largest B-tree index
	 * entry (about 2700 bytes).
	 */
	DefineCustomIntVariable("idempotency.max_key_length",
							"Longest idempotency key and scope accepted, in bytes.",
							NULL,
							&idem_max_key_length,
							255,
							1,
							1024,
							PGC_SUSET,
							0,
							NULL, NULL, NULL);

	/*
	 * Superuser-only, so that ALTER DATABASE and ALTER ROLE can set it per
	 * pool while an application cannot raise its own limit.
	 */
	DefineCustomIntVariable("idempotency.max_waiters",
							"Backends of a database that may wait in idem_await at the same time.",
							"Beyond it, idem_await answers at once. 0: it never waits. "
							"Counted only when the library is in shared_preload_libraries.",
							&idem_max_waiters,
							4,
							0,
							INT_MAX,
							PGC_SUSET,
							0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.purge_interval",
							"Time between two runs of the purge worker; 0 pauses it.",
							"Needs the library in shared_preload_libraries.",
							&idem_purge_interval_s,
							60,
							0,
							INT_MAX / 1000,
							PGC_SIGHUP,
							GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomStringVariable("idempotency.databases",
							   "Databases the purge worker purges, separated by commas.",
							   "Needs the library in shared_preload_libraries.",
							   &idem_purge_databases,
							   "",
							   PGC_SIGHUP,
							   GUC_LIST_INPUT,
							   check_database_list, NULL, NULL);

	DefineCustomIntVariable("idempotency.purge_batch_size",
							"Rows the purge worker deletes per table and transaction.",
							NULL,
							&idem_purge_batch_size,
							10000,
							1,
							INT_MAX,
							PGC_SIGHUP,
							0,
							NULL, NULL, NULL);

	/*
	 * Read only by the tenant-isolation policies of the install script,
	 * through current_setting(); defined here so that a typo in the name is
	 * an error rather than a placeholder that isolates nothing.
	 */
	DefineCustomStringVariable("idempotency.scope",
							   "The tenant whose records and messages this session may see and write.",
							   "Applies when tenant isolation is on (idem_tenant_isolation). "
							   "Empty: none at all.",
							   &idem_session_scope,
							   "",
							   PGC_USERSET,
							   0,
							   NULL, NULL, NULL);

	MarkGUCPrefixReserved("idempotency");

	if (process_shared_preload_libraries_in_progress)
	{
		idem_stats_preload();
		idem_worker_preload();
	}
	else if (idem_purge_databases[0] != '\0')
	{
		/*
		 * Every backend that loads the library gets here, and without
		 * preloading there is no shared memory to remember that one of them
		 * said it already: at LOG, a busy server would log this once per
		 * connection.  DEBUG1 keeps it for whoever looks; a DBA sees the
		 * missing launcher in pg_stat_activity.
		 */
		ereport(DEBUG1,
				(errmsg("idempotency.databases is set, but no purge worker runs"),
				 errdetail("The purge worker starts only when the server loads the library at start."),
				 errhint("Add idempotency to shared_preload_libraries and restart the server, or purge with pg_cron.")));
	}
}
