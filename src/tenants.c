/*-------------------------------------------------------------------------
 *
 * tenants.c
 *		idem_role_tenants(): the tenants idem_tenant_members allows the
 *		current role.
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
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "catalog/pg_type.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

#include "pg_compat.h"

PG_FUNCTION_INFO_V1(idem_role_tenants);

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
