/*-------------------------------------------------------------------------
 *
 * idempotency.c
 *		Module entry point and the idempotency.* settings.
 *
 * The library needs no shared memory and may be loaded on first use; the
 * settings are defined in _PG_init, and the prefix "idempotency" is reserved
 * so that a misspelled setting is reported instead of silently ignored.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>

#include "utils/guc.h"

#include "idempotency.h"

PG_MODULE_MAGIC;

/* Lease of a claim that passes lease => NULL. */
int			idem_default_lease_ms = 30 * 1000;

/* How long a finished record is kept when the claim passes retention => NULL. */
int			idem_retention_s = 24 * 60 * 60;

/* Longest key and scope, in bytes (Stripe allows 255 characters). */
int			idem_max_key_length = 255;

void		_PG_init(void);

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

	MarkGUCPrefixReserved("idempotency");
}
