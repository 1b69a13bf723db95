/*-------------------------------------------------------------------------
 *
 * upgrade.c
 *		What the update scripts need that SQL cannot do.
 *
 * A function whose argument list changes is a new function: the update
 * script creates the new one and drops the old.  The grants the old one had
 * (idem_grant's, or a DBA's own) must pass to the new one, and they must
 * stay grants made after the extension was installed.  PostgreSQL records
 * every GRANT run inside an extension script as an initial privilege of the
 * extension (pg_init_privs), and pg_dump writes out only what differs from
 * those, so a plain GRANT in the script would leave the roles out of every
 * later dump: after a restore they would have lost the function.  So the
 * grants are copied here, with the extension machinery told for their
 * duration that no script is running; PostgreSQL's own GRANT keeps the
 * role dependencies (pg_shdepend) in order.
 *
 * idem_copy_function_grants is created by the update script, called and
 * dropped again in it, and refuses to run anywhere else.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/regproc.h"
#include "utils/syscache.h"

PG_FUNCTION_INFO_V1(idem_copy_function_grants);

/*
 * Run the GRANT statements as if no extension script were running, so that
 * they are not recorded as initial privileges (see the file's comment).  On
 * its own, so that nothing the caller changed is live across the longjmp.
 */
static void
run_outside_script(List *grants)
{
	bool		saved_creating_extension = creating_extension;

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	PG_TRY();
	{
		ListCell   *lc;

		creating_extension = false;
		foreach(lc, grants)
		{
			if (SPI_execute((const char *) lfirst(lc), false, 0) != SPI_OK_UTILITY)
				elog(ERROR, "could not run \"%s\"", (const char *) lfirst(lc));
		}
	}
	PG_FINALLY();
	{
		creating_extension = saved_creating_extension;
	}
	PG_END_TRY();
	SPI_finish();
}

/*
 * idem_copy_function_grants(from regprocedure, to regprocedure): grant on
 * "to" the EXECUTE privileges that roles other than the owner of "from"
 * hold on it (with their grant options).  The grantor is the owner, as for
 * any grant a superuser makes.
 */
Datum
idem_copy_function_grants(PG_FUNCTION_ARGS)
{
	Oid			from = PG_GETARG_OID(0);
	Oid			to = PG_GETARG_OID(1);
	HeapTuple	tuple;
	Datum		acl_datum;
	bool		isnull;
	Oid			owner;
	Acl		   *acl;
	Datum	   *items;
	int			nitems;
	int16		typlen;
	bool		typbyval;
	char		typalign;
	List	   *grants = NIL;

	if (!creating_extension || !superuser())
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("idem_copy_function_grants may only be called by the extension's update script")));

	tuple = SearchSysCache1(PROCOID, ObjectIdGetDatum(from));
	if (!HeapTupleIsValid(tuple))
		elog(ERROR, "cache lookup failed for function %u", from);
	owner = ((Form_pg_proc) GETSTRUCT(tuple))->proowner;
	acl_datum = SysCacheGetAttr(PROCOID, tuple, Anum_pg_proc_proacl, &isnull);
	acl = isnull ? acldefault(OBJECT_FUNCTION, owner) : DatumGetAclPCopy(acl_datum);
	ReleaseSysCache(tuple);

	get_typlenbyvalalign(ACLITEMOID, &typlen, &typbyval, &typalign);
	deconstruct_array(acl, ACLITEMOID, typlen, typbyval, typalign, &items, NULL, &nitems);
	for (int i = 0; i < nitems; i++)
	{
		AclItem    *item = (AclItem *) DatumGetPointer(items[i]);
		Oid			grantee = item->ai_grantee;

		if (grantee == owner || (ACLITEM_GET_PRIVS(*item) & ACL_EXECUTE) == 0)
			continue;
		grants = lappend(grants,
						 psprintf("GRANT EXECUTE ON FUNCTION %s TO %s%s",
								  format_procedure_qualified(to),
								  grantee == ACL_ID_PUBLIC ? "PUBLIC" :
								  quote_identifier(GetUserNameFromId(grantee, false)),
								  (ACLITEM_GET_GOPTIONS(*item) & ACL_EXECUTE) != 0 ?
								  " WITH GRANT OPTION" : ""));
	}

	run_outside_script(grants);
	PG_RETURN_VOID();
}
