/*-------------------------------------------------------------------------
 *
 * version.c
 *		The build's identity, and the check that the installed SQL objects
 *		are a version this library knows.
 *
 * The library and the SQL objects are installed separately (make install
 * copies both; ALTER EXTENSION UPDATE moves only the objects), so a database
 * can hold objects older or newer than the library that serves them.  The
 * library keeps working for every SQL version it lists in
 * supported_sql_versions: each of them only calls C functions this library
 * still has, with the arguments of that version.  An older one still lacks
 * what later versions fixed, so the first call of a session says so once
 * (WARNING, hint ALTER EXTENSION idempotency UPDATE).  A version the library
 * does not list (newer SQL objects on an older library) may call functions
 * or expect tables this library knows nothing of: every call is refused
 * until the matching library is installed.
 *
 * The check runs where the extension's objects are looked up
 * (extension_objects.c): when they are loaded, and again at the first call
 * after any function of the database was created, replaced or altered.
 * ALTER EXTENSION UPDATE sends no invalidation of its own (pg_extension has
 * no syscache in PostgreSQL 15), but every update script changes functions,
 * so a session that was open during the update says at its next call what a
 * new session would.  An update that changed no function would go unseen
 * until the objects are reloaded; reading pg_extension at every call, or
 * every transaction, would cost an index scan on the hot path.  Not in the
 * extension's own scripts (CREATE and ALTER EXTENSION run them while
 * pg_extension is being changed): the next call outside them checks.  Background workers skip the
 * warning: each purge run is a new process and would repeat it every
 * interval; the sessions of the database report it.
 *
 * The Makefile passes IDEM_LIBRARY_VERSION (EXTVERSION) and IDEM_BUILD_ID
 * (git describe --always --dirty of the checkout built, when the source
 * directory is the top of a git work tree; else the id of the last build
 * that had one, else a fallback that says so).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "catalog/dependency.h"
#include "catalog/indexing.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_proc.h"
#include "commands/extension.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/rel.h"

#include "pg_compat.h"
#include "version.h"

#ifndef IDEM_LIBRARY_VERSION
#error "IDEM_LIBRARY_VERSION must be defined by the Makefile"
#endif
#ifndef IDEM_BUILD_ID
#define IDEM_BUILD_ID "unknown (git describe unavailable)"
#endif

/* The versions of the SQL objects this library serves, oldest first. */
static const char *const supported_sql_versions[] = {"0.1.0", "0.2.0", IDEM_LIBRARY_VERSION};

PG_FUNCTION_INFO_V1(idem_version);

/*
 * extversion of the extension that owns function fn_oid, palloc'd; NULL when
 * the function belongs to none.
 */
static char *
installed_version(Oid fn_oid)
{
	Oid			ext = getExtensionOfObject(ProcedureRelationId, fn_oid);
	Relation	rel;
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tuple;
	char	   *version = NULL;

	if (!OidIsValid(ext))
		return NULL;
	rel = table_open(ExtensionRelationId, AccessShareLock);
	ScanKeyInit(&key, Anum_pg_extension_oid, BTEqualStrategyNumber, F_OIDEQ,
				ObjectIdGetDatum(ext));
	scan = systable_beginscan(rel, ExtensionOidIndexId, true, NULL, 1, &key);
	tuple = systable_getnext(scan);
	if (HeapTupleIsValid(tuple))
	{
		bool		isnull;
		Datum		value = heap_getattr(tuple, Anum_pg_extension_extversion,
										 RelationGetDescr(rel), &isnull);

		if (!isnull)
			version = text_to_cstring(DatumGetTextPP(value));
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return version;
}

/*
 * Refuse SQL objects of a version this library does not know; warn once per
 * backend about an older one it still serves.  fn_oid: the SQL function
 * being called.  Returns false when it did not look (in an extension's
 * script), so that the caller asks again later.
 */
bool
idem_version_check(Oid fn_oid)
{
	static bool warned = false;
	char	   *version;

	if (creating_extension)
		return false;
	version = installed_version(fn_oid);
	if (version == NULL || strcmp(version, IDEM_LIBRARY_VERSION) == 0)
		return true;

	for (size_t i = 0; i < lengthof(supported_sql_versions); i++)
	{
		if (strcmp(version, supported_sql_versions[i]) != 0)
			continue;
		if (!warned && !IDEM_AM_BACKGROUND_WORKER())
			ereport(WARNING,
					(errcode(ERRCODE_WARNING),
					 errmsg("extension \"idempotency\" is at version \"%s\", older than its library (version \"%s\")",
							version, IDEM_LIBRARY_VERSION),
					 errdetail("The library still serves version \"%s\", but what later versions added or fixed in the SQL objects is missing until the extension is updated.",
							   version),
					 errhint("Run ALTER EXTENSION idempotency UPDATE in this database.")));
		warned = true;
		return true;
	}

	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("extension \"idempotency\" is at version \"%s\", which its library (version \"%s\") does not support",
					version, IDEM_LIBRARY_VERSION),
			 errdetail("The library serves versions \"%s\" to \"%s\" of the SQL objects.",
					   supported_sql_versions[0],
					   supported_sql_versions[lengthof(supported_sql_versions) - 1]),
			 errhint("Install the library of idempotency %s (make install from that release) and start new sessions; a preloaded library needs a server restart.",
					 version)));
}

/* idem_version(): what is installed and what serves it. */
Datum
idem_version(PG_FUNCTION_ARGS)
{
	TupleDesc	tupdesc;
	Datum		values[4];
	bool		nulls[4] = {false, false, false, false};
	char	   *version;

	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");

	version = installed_version(fcinfo->flinfo->fn_oid);
	if (version != NULL)
		values[0] = CStringGetTextDatum(version);
	else
		nulls[0] = true;
	values[1] = CStringGetTextDatum(IDEM_LIBRARY_VERSION);
	values[2] = CStringGetTextDatum(IDEM_BUILD_ID);
	values[3] = Int32GetDatum(PG_MAJORVERSION_NUM);

	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
}
