/*-------------------------------------------------------------------------
 *
 * extension_objects.h
 *		The OIDs of the extension's own objects (extension_objects.c).
 *
 * idem_objects(fn_oid) finds them from the schema of the SQL function being
 * called, loading them (and running the SQL version check) when a syscache
 * callback has marked them stale; idem_objects_current returns the objects
 * loaded earlier in the same call.  The pointer is to a per-backend copy,
 * valid for the rest of the call: the OIDs of a running call's objects cannot
 * change under it, since it holds locks on them.  Caches derived from the
 * objects compare "generation", which grows only when a reload finds
 * something different.  No index OIDs: callers find an index from its
 * table's relcache entry, under the lock they hold on the table.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_EXTENSION_OBJECTS_H
#define IDEM_EXTENSION_OBJECTS_H

#include "access/attnum.h"
#include "idempotency.h"

/* The extension's own objects (extension_objects.c). */
typedef struct IdemObjects
{
	uint64		generation;		/* grows when a reload finds a change */
	Oid			namespace;		/* @extschema@ */
	NameData	namespace_name; /* its name, which the statements embed */
	/* tables; their indexes are found from their relcache entries */
	Oid			records;		/* idempotency_records */
	AttrNumber	records_headers;	/* its response_headers (0.2.0), or 0 */
	Oid			machines;		/* idem_machines */
	Oid			moves;			/* idem_machine_moves */
	Oid			inbox;			/* idem_inbox */
	Oid			token_epoch;	/* the sequence idem_token_epoch */
	Oid			token_timeline; /* idem_token_timeline; InvalidOid before SQL 0.3.0 */
	Oid			outbox_seq;		/* idem_outbox_seq; InvalidOid at SQL 0.1.0 */
	Oid			enforce_fn;		/* idem_enforce_transition() */
	Oid			status_type;	/* idem_status and its labels */
	Oid			status_labels[IDEM_NUM_STATUSES];
} IdemObjects;

extern const IdemObjects *idem_objects(Oid fn_oid);
extern const IdemObjects *idem_objects_current(void);
extern Oid	idem_objects_outbox_seq(void);

#endif							/* IDEM_EXTENSION_OBJECTS_H */
