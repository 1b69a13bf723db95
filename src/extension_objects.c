/*-------------------------------------------------------------------------
 *
 * extension_objects.c
 *		The OIDs of the extension's own tables, indexes and types.
 *
 * The objects live in the schema chosen at CREATE EXTENSION (@extschema@),
 * found from the OID of the SQL function being called, since every function
 * of the extension lives there too.  They are looked up once per backend and
 * kept until a syscache callback reports a change to that schema or to the
 * idem_status type: DROP and CREATE EXTENSION (new OIDs), ALTER SCHEMA
 * RENAME.  Other schemas and types come and go all the time (every CREATE
 * TEMP TABLE makes a type) and do not cost a reload.  A change to any
 * function costs the version check again (version.c), and a reload: an
 * update script changes functions, and may add an object whose presence
 * changes what the library does (idem_token_timeline, tokens.c) without
 * invalidating anything watched here.  Modules that derive
 * their own caches from these objects compare "generation" to know when to
 * rebuild them; it grows only when a reload finds something different, so
 * that a GRANT on the schema (which invalidates it too) costs a reload here
 * but no statement is prepared again.
 *
 * The attribute number of the records' response_headers is kept too: it is
 * 0 in a database still on 0.1.0, whose table lacks the column, until ALTER
 * EXTENSION UPDATE adds it.  That ALTER TABLE invalidates the table's
 * relcache entry, and so do ANALYZE, VACUUM and GRANTs on it: each costs a
 * reload, which finds the same objects and keeps the generation unless the
 * column came or went.
 *
 * Only OIDs that stay the same for the life of the objects are kept here:
 * those of tables, the sequence, the type and the function.  Index OIDs are
 * not: REINDEX CONCURRENTLY replaces an index by a new one with a new OID.
 * Callers find a table's primary key from the table's relcache entry
 * (RelationGetPrimaryKeyIndex), which relcache invalidation keeps current,
 * under the lock they hold on the table.  VACUUM FULL, CLUSTER and pg_repack
 * change relfilenodes, never OIDs.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_enum.h"
#include "catalog/pg_type.h"
#include "nodes/makefuncs.h"
#include "parser/parse_func.h"
#include "utils/builtins.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"

#include "extension_objects.h"
#include "idempotency.h"
#include "version.h"

static IdemObjects objects;
static bool objects_valid = false;
static bool version_valid = false;
static uint32 namespace_hash;
static uint32 status_type_hash;

/* The records table changed (ALTER TABLE ... ADD COLUMN of an update). */
static void
records_invalidate(Datum arg, Oid relid)
{
	if (!OidIsValid(relid) || relid == objects.records)
		objects_valid = false;
}

static void
objects_invalidate(Datum arg, int cacheid, uint32 hashvalue)
{
	uint32		ours = (cacheid == NAMESPACEOID) ? namespace_hash : status_type_hash;

	if (hashvalue == 0 || hashvalue == ours)
		objects_valid = false;
}

/*
 * Any function created, replaced or altered: perhaps by an update script of
 * the extension, which changes its version (version.c) and may add objects:
 * both are looked at again (a reload that finds the same objects keeps the
 * generation).
 */
static void
version_invalidate(Datum arg, int cacheid, uint32 hashvalue)
{
	version_valid = false;
}

static Oid
relation_in(Oid nsp, const char *name)
{
	Oid			relid = get_relname_relid(name, nsp);

	if (!OidIsValid(relid))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("relation \"%s\" of extension \"idempotency\" does not exist in schema \"%s\"",
						name, get_namespace_name(nsp)),
				 errhint("Reinstall the extension with DROP EXTENSION idempotency; CREATE EXTENSION idempotency;.")));
	return relid;
}

static void
objects_load(Oid fn_oid)
{
	static bool callbacks_registered = false;
	Oid			nsp;
	IdemObjects loaded;

	if (!callbacks_registered)
	{
		CacheRegisterSyscacheCallback(NAMESPACEOID, objects_invalidate, (Datum) 0);
		CacheRegisterSyscacheCallback(TYPEOID, objects_invalidate, (Datum) 0);
		CacheRegisterSyscacheCallback(PROCOID, version_invalidate, (Datum) 0);
		CacheRegisterRelcacheCallback(records_invalidate, (Datum) 0);
		callbacks_registered = true;
	}

	nsp = get_func_namespace(fn_oid);
	if (!OidIsValid(nsp))
		elog(ERROR, "cache lookup failed for function %u", fn_oid);
	version_valid = idem_version_check(fn_oid);

	/* zeroed whole, padding included: it is compared with memcmp below */
	memset(&loaded, 0, sizeof(loaded));
	loaded.namespace = nsp;
	namestrcpy(&loaded.namespace_name, get_namespace_name(nsp));
	loaded.records = relation_in(nsp, "idempotency_records");
	/* a dropped column has another name; 0 when missing (0.1.0) */
	loaded.records_headers = get_attnum(loaded.records, "response_headers");
	loaded.machines = relation_in(nsp, "idem_machines");
	loaded.moves = relation_in(nsp, "idem_machine_moves");
	loaded.inbox = relation_in(nsp, "idem_inbox");
	loaded.token_epoch = relation_in(nsp, "idem_token_epoch");
	/* SQL 0.1.0 and 0.2.0 have none: their tokens are epoch * 2^32 + n (tokens.c) */
	loaded.token_timeline = get_relname_relid("idem_token_timeline", nsp);
	/* SQL 0.1.0 has no outbox; its functions say so (outbox.c) */
	loaded.outbox_seq = get_relname_relid("idem_outbox_seq", nsp);

	loaded.enforce_fn = LookupFuncName(list_make2(makeString(get_namespace_name(nsp)),
												  makeString("idem_enforce_transition")),
									   0, NULL, false);

	loaded.status_type = GetSysCacheOid2(TYPENAMENSP, Anum_pg_type_oid,
										 CStringGetDatum("idem_status"),
										 ObjectIdGetDatum(nsp));
	if (!OidIsValid(loaded.status_type))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("type \"idem_status\" does not exist in schema \"%s\"",
						get_namespace_name(nsp)),
				 errhint("Reinstall the extension with DROP EXTENSION idempotency; CREATE EXTENSION idempotency;.")));
	for (int i = 0; i < IDEM_NUM_STATUSES; i++)
	{
		loaded.status_labels[i] = GetSysCacheOid2(ENUMTYPOIDNAME, Anum_pg_enum_oid,
												  ObjectIdGetDatum(loaded.status_type),
												  CStringGetDatum(idem_status_names[i]));
		if (!OidIsValid(loaded.status_labels[i]))
			elog(ERROR, "label \"%s\" of type idem_status is missing",
				 idem_status_names[i]);
	}

	/* the same objects under the same names: callers' caches stay valid */
	loaded.generation = objects.generation;
	if (memcmp(&loaded, &objects, sizeof(IdemObjects)) != 0)
		loaded.generation++;
	objects = loaded;
	namespace_hash = GetSysCacheHashValue1(NAMESPACEOID, ObjectIdGetDatum(nsp));
	status_type_hash = GetSysCacheHashValue1(TYPEOID, ObjectIdGetDatum(objects.status_type));
	objects_valid = true;
}

/* The extension's objects, as seen from the SQL function fn_oid. */
const IdemObjects *
idem_objects(Oid fn_oid)
{
	if (!objects_valid || !version_valid)
		objects_load(fn_oid);
	return &objects;
}

/*
 * The sequence idem_outbox_seq, whose presence says that the outbox is
 * installed.  A session that loaded the objects before ALTER EXTENSION
 * UPDATE created the outbox looks it up again instead of believing it
 * absent.  The update to 0.2.0 alters idempotency_records, which
 * invalidates the loaded objects anyway (TAP 009's session open across the
 * update passes either way); this is for an update that touches no object
 * whose invalidation we watch.
 */
Oid
idem_objects_outbox_seq(void)
{
	if (!OidIsValid(objects.outbox_seq) && objects_valid)
		objects.outbox_seq = get_relname_relid("idem_outbox_seq", objects.namespace);
	return objects.outbox_seq;
}

/*
 * The objects last loaded, for callers that loaded them earlier in this
 * call: an invalidation since then may have marked them stale, but the OIDs
 * of a running call's objects cannot change under it (it holds locks).
 */
const IdemObjects *
idem_objects_current(void)
{
	return &objects;
}
