/*-------------------------------------------------------------------------
 *
 * tenants.c
 *		idem_role_tenants(): the tenants idem_tenant_members allows the
 *		current role; idem_refuse_stale_snapshot(): the snapshot check of
 *		the triggers that rebuild the policies of the tenants and of the
 *		global reconcilers.
 *
 * Under tenant isolation the policy idem_tenant_members of the records and
 * the inbox accepts a row whose tenant is one of this function's answer, and
 * the C tenant check of a claim (record_store.c) asks it too.  Both run as
 * whoever works on the records, but the table is the extension owner's and
 * a role may learn only its own tenants: so the function reads the table
 * itself, by its primary key (role, tenant), with no privilege of the caller
 * and no row-level security on the table (which would break backups taken
 * by a role that reads all data).  PUBLIC has no privilege on the table.
 *
 * The role is current_user (GetUserId), exactly: not the roles it is a
 * member of, so SET ROLE to a tenant's role gives that role's tenants.  The
 * table keeps roles as regrole (their OID), so a new role of a dropped
 * role's name gets none of its tenants.  Read with the statement's
 * snapshot, as a STABLE function's SQL would.
 *
 * idem_refuse_stale_snapshot(table): the check the triggers that rebuild the
 * policies from idem_tenant_members and idem_global_reconcilers make once
 * they hold the lock that lets one rebuild run at a time (sql/, section
 * "tenants" of 0.2.0--0.3.0).  Under READ COMMITTED the statements after the
 * lock have a new snapshot and see what the rebuild before committed.  Under
 * REPEATABLE READ and SERIALIZABLE the snapshot may be older than that
 * commit: the rebuild would then make the policies from a list without the
 * other transaction's rows, so it fails with 40001 instead.  Every version of
 * every row is compared under the statement's snapshot and a new one: the
 * tables hold a row per role (and tenant).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_class.h"
#include "catalog/pg_type.h"
#include "executor/tuptable.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

#include "pg_compat.h"

PG_FUNCTION_INFO_V1(idem_role_tenants);
PG_FUNCTION_INFO_V1(idem_refuse_stale_snapshot);

Datum
idem_role_tenants(PG_FUNCTION_ARGS)
{
	Oid			nsp = get_func_namespace(fcinfo->flinfo->fn_oid);
	Oid			relid = get_relname_relid("idem_tenant_members", nsp);
	Relation	rel;
	Oid			pkey;
	AttrNumber	role_att;
	AttrNumber	tenant_att;
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tuple;
	Snapshot	snapshot;
	ArrayBuildState *tenants = initArrayResult(TEXTOID, CurrentMemoryContext, false);

	if (!OidIsValid(relid))
		elog(ERROR, "table idem_tenant_members of the extension is missing");
	rel = table_open(relid, AccessShareLock);
	pkey = idem_primary_key_index(rel);
	role_att = get_attnum(relid, "role");
	tenant_att = get_attnum(relid, "tenant");
	if (!OidIsValid(pkey) || role_att != 1 || tenant_att == InvalidAttrNumber)
		elog(ERROR, "table idem_tenant_members of the extension is not as it was created");

	snapshot = RegisterSnapshot(ActiveSnapshotSet() ? GetActiveSnapshot() : GetTransactionSnapshot());
	ScanKeyInit(&key, role_att, BTEqualStrategyNumber, F_OIDEQ,
				ObjectIdGetDatum(GetUserId()));
	/* by the primary key: in its order, the role's tenants sorted */
	scan = systable_beginscan(rel, pkey, true, snapshot, 1, &key);
	while (HeapTupleIsValid(tuple = systable_getnext(scan)))
	{
		bool		isnull;
		Datum		tenant = heap_getattr(tuple, tenant_att, RelationGetDescr(rel), &isnull);

		if (!isnull)
			accumArrayResult(tenants, tenant, false, TEXTOID, CurrentMemoryContext);
	}
	systable_endscan(scan);
	UnregisterSnapshot(snapshot);
	table_close(rel, AccessShareLock);

	PG_RETURN_DATUM(makeArrayResult(tenants, CurrentMemoryContext));
}

Datum
idem_refuse_stale_snapshot(PG_FUNCTION_ARGS)
{
	Oid			relid = PG_GETARG_OID(0);
	Relation	rel;
	Snapshot	seen;
	Snapshot	latest;
	TableScanDesc scan;
	TupleTableSlot *slot;
	bool		stale = false;

	/* only the extension's own tables: it reads them without privileges */
	if (get_rel_relkind(relid) != RELKIND_RELATION ||
		get_rel_namespace(relid) != get_func_namespace(fcinfo->flinfo->fn_oid))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("relation with OID %u is not a table of the extension", relid)));
	/* under READ COMMITTED each statement has a new snapshot */
	if (!IsolationUsesXactSnapshot())
		PG_RETURN_VOID();

	rel = table_open(relid, AccessShareLock);
	seen = RegisterSnapshot(ActiveSnapshotSet() ? GetActiveSnapshot() : GetTransactionSnapshot());
	latest = RegisterSnapshot(GetLatestSnapshot());
	slot = table_slot_create(rel, NULL);
	scan = table_beginscan(rel, SnapshotAny, 0, NULL);
	while (!stale && table_scan_getnextslot(scan, ForwardScanDirection, slot))
		stale = table_tuple_satisfies_snapshot(rel, slot, seen) !=
			table_tuple_satisfies_snapshot(rel, slot, latest);
	table_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	UnregisterSnapshot(latest);
	UnregisterSnapshot(seen);

	if (stale)
		ereport(ERROR,
				(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
				 errmsg("could not serialize access due to concurrent update of table \"%s\"",
						RelationGetRelationName(rel)),
				 errdetail("Another transaction changed the table after this transaction's snapshot was taken."),
				 errhint("Retry the transaction.")));
	table_close(rel, AccessShareLock);
	PG_RETURN_VOID();
}
