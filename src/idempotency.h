/*-------------------------------------------------------------------------
 *
 * idempotency.h
 *		What every module of the idempotency extension shares: the
 *		extension's SQLSTATEs, the general settings and the record statuses.
 *
 * The extension keeps one row per (scope, key) in @extschema@.idempotency_records.
 * Every module reads and writes that table through the prepared statements of
 * record_store.c (record_store.h), so privileges, row-level security and
 * triggers apply as they would to the caller's own SQL.  Each module's own
 * offer is in its header: record_store.h, extension_objects.h, version.h,
 * machine.h, stats.h, worker.h, validation.h, removal.h, fingerprint.h;
 * pg_compat.h has the differences between PostgreSQL versions.
 *
 * Like PostgreSQL's own headers, this one and the modules' expect postgres.h
 * to be included first.  The settings are defined and registered by
 * idempotency.c (_PG_init) and change only at a configuration reload or a
 * SET, between calls.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEMPOTENCY_H
#define IDEMPOTENCY_H

/*
 * SQLSTATEs of the extension's own errors, class "IK" (idempotency key).
 * Class I is implementation-defined, so they cannot collide with the standard.
 */
#define ERRCODE_IDEM_FINGERPRINT_MISMATCH	MAKE_SQLSTATE('I','K','0','0','1')
#define ERRCODE_IDEM_STALE_TOKEN			MAKE_SQLSTATE('I','K','0','0','2')
#define ERRCODE_IDEM_INVALID_STATE			MAKE_SQLSTATE('I','K','0','0','3')
#define ERRCODE_IDEM_KEY_NOT_FOUND			MAKE_SQLSTATE('I','K','0','0','4')
#define ERRCODE_IDEM_INVALID_TRANSITION		MAKE_SQLSTATE('I','K','0','0','5')

/* GUCs (idempotency.c) */
extern int	idem_default_lease_ms;
extern int	idem_retention_s;
extern int	idem_max_key_length;
extern int	idem_outbox_max_attempts;
extern int	idem_outbox_retention_s;
extern bool idem_outbox_notify;
extern bool idem_direct_writes;

/*
 * Record statuses, in the order of the idem_status enum labels.
 */
typedef enum IdemStatus
{
	IDEM_PROCESSING,
	IDEM_SUCCEEDED,
	IDEM_FAILED,
	IDEM_UNKNOWN,
	IDEM_NUM_STATUSES
} IdemStatus;

extern const char *const idem_status_names[IDEM_NUM_STATUSES];

#endif							/* IDEMPOTENCY_H */
