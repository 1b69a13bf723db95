/*-------------------------------------------------------------------------
 *
 * upgrade.c
 *		What the update scripts need that SQL cannot do.
 *
 * PostgreSQL records every GRANT and REVOKE run inside an extension script
 * as the initial privileges of the object (pg_init_privs): the whole ACL
 * the statement leaves, whoever it names.  pg_dump writes out only what
 * differs from those, and the CREATE EXTENSION of a restore makes only what
 * the script makes, so a role named there is left out of every later dump:
 * after a restore it has lost the privilege.  A fresh install names only
 * the owner and PUBLIC there; the grants to other roles must be ordinary
 * grants, made as if no script were running.
 *
 * idem_copy_function_grants (0.1.0 to 0.2.0): a function whose argument
 * list changes is a new function, which gets the old one's grants.
 *
 * idem_make_grants_ordinary (0.2.0 to 0.3.0, the last call of the update
 * and of the install script): whatever GRANTs an update ran (0.2.0's
 * outbox and batch inbox privileges for roles of idem_grant), and whatever
 * ordinary grants an update's GRANT or REVOKE on an older object swept
 * into its initial privileges, become ordinary grants again.  For each
 * member whose initial privileges name another role (or a grantor other
 * than the owner), the ACL is brought inside the script to the initial
 * privileges without those roles, so that PostgreSQL records that, then
 * outside it back to what it was.  A table-level REVOKE also revokes the
 * columns' privileges and records theirs, so a table's columns follow it.
 * Only grants made by the owner can be made again; an object whose ACL
 * holds a grant made by another role (with its grant option) stops the
 * update, rather than lose that grant to a REVOKE ... CASCADE.
 *
 * Everything goes through PostgreSQL's own GRANT and REVOKE, which keep
 * pg_shdepend in order (the initial privileges' role dependencies too,
 * from 17 on).  Both functions are created by an update script, called and
 * dropped again in it, and refuse to run anywhere else.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "catalog/objectaddress.h"
#include "catalog/pg_class.h"
#include "catalog/pg_namespace.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "lib/stringinfo.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/regproc.h"
#include "utils/syscache.h"

PG_FUNCTION_INFO_V1(idem_copy_function_grants);
PG_FUNCTION_INFO_V1(idem_make_grants_ordinary);

/*
 * Run the GRANT and REVOKE statements, recorded as initial privileges of
 * the extension (initial) or as if no extension script were running (see
 * the file's comment).  On its own, so that nothing the caller changed is
 * live across the longjmp.
 */
static void
run_grants(List *statements, bool initial)
{
	bool		saved_creating_extension = creating_extension;

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	PG_TRY();
	{
		ListCell   *lc;

		creating_extension = initial;
		foreach(lc, statements)
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

static void
refuse_outside_script(const char *function)
{
	if (!creating_extension || !superuser())
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("%s may only be called by the extension's update script", function)));
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

	refuse_outside_script("idem_copy_function_grants");

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

	run_grants(grants, false);
	PG_RETURN_VOID();
}

/*
 * One ACL of a member of the extension: the object's (attnum 0) or one of
 * its columns'.  The ACL and the initial privileges as they were before
 * idem_make_grants_ordinary changed anything.
 */
typedef struct Grants
{
	int			n;
	AclItem    *items;
} Grants;

typedef struct GrantSlot
{
	Oid			classid;
	Oid			objid;
	int32		attnum;
	Oid			owner;
	Grants		acl;			/* the default ACL's items if NULL */
	Grants		initial;		/* pg_init_privs */
} GrantSlot;

/* The keywords of the privilege bits, as GRANT takes them */
static const struct
{
	AclMode		mode;
	const char *keyword;
}			privilege_keywords[] =
{
	{ACL_INSERT, "INSERT"},
	{ACL_SELECT, "SELECT"},
	{ACL_UPDATE, "UPDATE"},
	{ACL_DELETE, "DELETE"},
	{ACL_TRUNCATE, "TRUNCATE"},
	{ACL_REFERENCES, "REFERENCES"},
	{ACL_TRIGGER, "TRIGGER"},
	{ACL_EXECUTE, "EXECUTE"},
	{ACL_USAGE, "USAGE"},
	{ACL_CREATE, "CREATE"},
	{ACL_CREATE_TEMP, "TEMPORARY"},
	{ACL_CONNECT, "CONNECT"},
	{ACL_SET, "SET"},
	{ACL_ALTER_SYSTEM, "ALTER SYSTEM"},
#ifdef ACL_MAINTAIN
	{ACL_MAINTAIN, "MAINTAIN"},
#endif
};

/* The items of an ACL (none for NULL) */
static Grants
acl_items(Acl *acl)
{
	Grants		grants = {0, NULL};
	Datum	   *items;
	int16		typlen;
	bool		typbyval;
	char		typalign;

	if (acl == NULL)
		return grants;
	get_typlenbyvalalign(ACLITEMOID, &typlen, &typbyval, &typalign);
	deconstruct_array(acl, ACLITEMOID, typlen, typbyval, typalign, &items, NULL, &grants.n);
	grants.items = palloc(Max(grants.n, 1) * sizeof(AclItem));
	for (int i = 0; i < grants.n; i++)
		grants.items[i] = *(AclItem *) DatumGetPointer(items[i]);
	return grants;
}

/* The item of grantee granted by grantor, or NULL */
static const AclItem *
acl_find(Grants grants, Oid grantee, Oid grantor)
{
	for (int i = 0; i < grants.n; i++)
	{
		if (grants.items[i].ai_grantee == grantee && grants.items[i].ai_grantor == grantor)
			return &grants.items[i];
	}
	return NULL;
}

/* Whether two ACLs hold the same items, in any order */
static bool
acl_same_items(Grants a, Grants b)
{
	if (a.n != b.n)
		return false;
	for (int i = 0; i < a.n; i++)
	{
		const AclItem *other = acl_find(b, a.items[i].ai_grantee, a.items[i].ai_grantor);

		if (other == NULL || other->ai_privs != a.items[i].ai_privs)
			return false;
	}
	return true;
}

static char *
acl_text(Grants grants)
{
	StringInfoData buf;

	initStringInfo(&buf);
	appendStringInfoChar(&buf, '{');
	for (int i = 0; i < grants.n; i++)
		appendStringInfo(&buf, "%s%s", i > 0 ? "," : "",
						 DatumGetCString(DirectFunctionCall1(aclitemout,
															 PointerGetDatum(&grants.items[i]))));
	appendStringInfoChar(&buf, '}');
	return buf.data;
}

/*
 * The initial privileges a fresh install has: the items of the owner and
 * of PUBLIC that the owner granted.
 */
static Grants
fresh_initial(Grants initial, Oid owner)
{
	Grants		kept = {0, palloc(Max(initial.n, 1) * sizeof(AclItem))};

	for (int i = 0; i < initial.n; i++)
	{
		const AclItem *item = &initial.items[i];

		if ((item->ai_grantee == owner || item->ai_grantee == ACL_ID_PUBLIC) &&
			item->ai_grantor == owner)
			kept.items[kept.n++] = *item;
	}
	return kept;
}

/* The ACL of a slot's object or column now, and its owner */
static Grants
current_acl(Oid classid, Oid objid, int32 attnum, Oid *owner)
{
	HeapTuple	tuple;
	Datum		datum;
	bool		isnull;
	ObjectType	objtype;
	Acl		   *acl;

	switch (classid)
	{
		case RelationRelationId:
			tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(objid));
			if (!HeapTupleIsValid(tuple))
				elog(ERROR, "cache lookup failed for relation %u", objid);
			*owner = ((Form_pg_class) GETSTRUCT(tuple))->relowner;
			objtype = ((Form_pg_class) GETSTRUCT(tuple))->relkind == RELKIND_SEQUENCE ?
				OBJECT_SEQUENCE : OBJECT_TABLE;
			if (attnum != 0)
			{
				ReleaseSysCache(tuple);
				tuple = SearchSysCache2(ATTNUM, ObjectIdGetDatum(objid), Int16GetDatum(attnum));
				if (!HeapTupleIsValid(tuple))
					elog(ERROR, "cache lookup failed for attribute %d of relation %u", attnum, objid);
				datum = SysCacheGetAttr(ATTNUM, tuple, Anum_pg_attribute_attacl, &isnull);
				acl = isnull ? NULL : DatumGetAclPCopy(datum);
				ReleaseSysCache(tuple);
				return acl_items(acl);
			}
			datum = SysCacheGetAttr(RELOID, tuple, Anum_pg_class_relacl, &isnull);
			break;
		case ProcedureRelationId:
			tuple = SearchSysCache1(PROCOID, ObjectIdGetDatum(objid));
			if (!HeapTupleIsValid(tuple))
				elog(ERROR, "cache lookup failed for function %u", objid);
			*owner = ((Form_pg_proc) GETSTRUCT(tuple))->proowner;
			objtype = OBJECT_FUNCTION;
			datum = SysCacheGetAttr(PROCOID, tuple, Anum_pg_proc_proacl, &isnull);
			break;
		case TypeRelationId:
			tuple = SearchSysCache1(TYPEOID, ObjectIdGetDatum(objid));
			if (!HeapTupleIsValid(tuple))
				elog(ERROR, "cache lookup failed for type %u", objid);
			*owner = ((Form_pg_type) GETSTRUCT(tuple))->typowner;
			objtype = OBJECT_TYPE;
			datum = SysCacheGetAttr(TYPEOID, tuple, Anum_pg_type_typacl, &isnull);
			break;
		case NamespaceRelationId:
			tuple = SearchSysCache1(NAMESPACEOID, ObjectIdGetDatum(objid));
			if (!HeapTupleIsValid(tuple))
				elog(ERROR, "cache lookup failed for schema %u", objid);
			*owner = ((Form_pg_namespace) GETSTRUCT(tuple))->nspowner;
			objtype = OBJECT_SCHEMA;
			datum = SysCacheGetAttr(NAMESPACEOID, tuple, Anum_pg_namespace_nspacl, &isnull);
			break;
		default:
			{
				ObjectAddress address = {classid, objid, attnum};

				ereport(ERROR,
						(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
						 errmsg("cannot make the initial privileges of %s ordinary grants",
								getObjectDescription(&address, false))));
			}
	}
	acl = isnull ? acldefault(objtype, *owner) : DatumGetAclPCopy(datum);
	ReleaseSysCache(tuple);
	return acl_items(acl);
}

/* What GRANT and REVOKE name the slot's object as: "TABLE s.t" */
static char *
grant_target(const GrantSlot *slot)
{
	switch (slot->classid)
	{
		case RelationRelationId:
			return psprintf("%s %s",
							get_rel_relkind(slot->objid) == RELKIND_SEQUENCE ? "SEQUENCE" : "TABLE",
							quote_qualified_identifier(get_namespace_name(get_rel_namespace(slot->objid)),
													   get_rel_name(slot->objid)));
		case ProcedureRelationId:
			return psprintf("ROUTINE %s", format_procedure_qualified(slot->objid));
		case TypeRelationId:
			return psprintf("TYPE %s", format_type_be_qualified(slot->objid));
		case NamespaceRelationId:
			return psprintf("SCHEMA %s", quote_identifier(get_namespace_name(slot->objid)));
	}
	elog(ERROR, "unexpected class %u", slot->classid);
	return NULL;				/* keep compiler quiet */
}

/* The privileges of a mode as GRANT lists them, each for the column if any */
static char *
privilege_list(AclMode mode, const char *column)
{
	StringInfoData buf;

	initStringInfo(&buf);
	for (size_t i = 0; i < lengthof(privilege_keywords); i++)
	{
		if ((mode & privilege_keywords[i].mode) == 0)
			continue;
		mode &= ~privilege_keywords[i].mode;
		appendStringInfo(&buf, "%s%s%s%s%s", buf.len > 0 ? ", " : "", privilege_keywords[i].keyword,
						 column ? " (" : "", column ? column : "", column ? ")" : "");
	}
	if (mode != 0)
		elog(ERROR, "unrecognized privilege bits %x", (unsigned int) mode);
	return buf.data;
}

static const char *
grantee_name(Oid grantee)
{
	return grantee == ACL_ID_PUBLIC ? "PUBLIC" : quote_identifier(GetUserNameFromId(grantee, false));
}

/*
 * The statements that bring the slot's ACL from "from" to "to", granted by
 * the owner, a role at a time: what a role holds and should not is revoked
 * (its grant options alone, if it keeps the privileges), what it should
 * hold and does not is granted.  What a role keeps is granted even if it
 * holds it already, so that a "to" with items always gets a statement.
 */
static List *
acl_statements(List *statements, const GrantSlot *slot, const char *target,
			   const char *column, Grants from, Grants to)
{
	Oid		   *grantees = palloc(Max(from.n + to.n, 1) * sizeof(Oid));
	int			ngrantees = 0;

	for (int i = 0; i < from.n; i++)
		grantees[ngrantees++] = from.items[i].ai_grantee;
	for (int i = 0; i < to.n; i++)
		if (acl_find(from, to.items[i].ai_grantee, slot->owner) == NULL)
			grantees[ngrantees++] = to.items[i].ai_grantee;

	for (int i = 0; i < ngrantees; i++)
	{
		const AclItem *have = acl_find(from, grantees[i], slot->owner);
		const AclItem *want = acl_find(to, grantees[i], slot->owner);
		AclMode		have_privs = have ? ACLITEM_GET_PRIVS(*have) : ACL_NO_RIGHTS;
		AclMode		have_goptions = have ? ACLITEM_GET_GOPTIONS(*have) : ACL_NO_RIGHTS;
		AclMode		want_privs = want ? ACLITEM_GET_PRIVS(*want) : ACL_NO_RIGHTS;
		AclMode		want_goptions = want ? ACLITEM_GET_GOPTIONS(*want) : ACL_NO_RIGHTS;
		const char *name = grantee_name(grantees[i]);

		if ((have_privs & ~want_privs) != 0)
			statements = lappend(statements,
								 psprintf("REVOKE %s ON %s FROM %s",
										  privilege_list(have_privs & ~want_privs, column), target, name));
		if ((have_goptions & want_privs & ~want_goptions) != 0)
			statements = lappend(statements,
								 psprintf("REVOKE GRANT OPTION FOR %s ON %s FROM %s",
										  privilege_list(have_goptions & want_privs & ~want_goptions, column),
										  target, name));
		if ((want_privs & ~want_goptions) != 0)
			statements = lappend(statements,
								 psprintf("GRANT %s ON %s TO %s",
										  privilege_list(want_privs & ~want_goptions, column), target, name));
		if (want_goptions != 0)
			statements = lappend(statements,
								 psprintf("GRANT %s ON %s TO %s WITH GRANT OPTION",
										  privilege_list(want_goptions, column), target, name));
	}
	return statements;
}

/*
 * Give the slot the initial privileges "initial" and then its ACL back, as
 * it was before (see the file's comment).
 */
static void
make_slot_ordinary(const GrantSlot *slot, Grants initial)
{
	char	   *target = grant_target(slot);
	const char *column = NULL;
	Oid			owner;
	List	   *statements;
	Grants		now;

	if (slot->attnum != 0)
		column = quote_identifier(get_attname(slot->objid, slot->attnum, false));

	/*
	 * Inside the script: the ACL becomes "initial".  Each statement records
	 * the ACL it leaves, and the last leaves "initial"; when that has no
	 * items, one more statement makes sure something is recorded: for a
	 * column a grant and a revoke (only a revoke that changes the column
	 * records, and then no initial privileges), for an object the revoke
	 * of what PUBLIC does not hold.
	 */
	now = current_acl(slot->classid, slot->objid, slot->attnum, &owner);
	statements = acl_statements(NIL, slot, target, column, now, initial);
	if (initial.n > 0)
		;						/* its items are granted: a statement */
	else if (column != NULL)
	{
		statements = lappend(statements, psprintf("GRANT SELECT (%s) ON %s TO PUBLIC", column, target));
		statements = lappend(statements, psprintf("REVOKE SELECT (%s) ON %s FROM PUBLIC", column, target));
	}
	else
		statements = lappend(statements, psprintf("REVOKE ALL ON %s FROM PUBLIC", target));
	run_grants(statements, true);

	/* Outside the script: the ACL as it was */
	now = current_acl(slot->classid, slot->objid, slot->attnum, &owner);
	run_grants(acl_statements(NIL, slot, target, column, now, slot->acl), false);

	now = current_acl(slot->classid, slot->objid, slot->attnum, &owner);
	if (!acl_same_items(now, slot->acl))
		elog(ERROR, "privileges on %s%s%s changed from %s to %s", target,
			 column ? " column " : "", column ? column : "", acl_text(slot->acl), acl_text(now));
}

/*
 * A slot whose ACL holds a grant not made by the owner cannot be revoked
 * and granted again: refuse.
 */
static void
check_grantors(const GrantSlot *slot)
{
	for (int i = 0; i < slot->acl.n; i++)
	{
		const AclItem *item = &slot->acl.items[i];
		ObjectAddress address = {slot->classid, slot->objid, slot->attnum};

		if (item->ai_grantor == slot->owner)
			continue;
		ereport(ERROR,
				(errcode(ERRCODE_DEPENDENT_OBJECTS_STILL_EXIST),
				 errmsg("cannot make the initial privileges of %s ordinary grants",
						getObjectDescription(&address, false)),
				 errdetail("Role \"%s\" granted privileges on it to %s, which the update would have to revoke.",
						   GetUserNameFromId(item->ai_grantor, false),
						   item->ai_grantee == ACL_ID_PUBLIC ? "PUBLIC" :
						   psprintf("role \"%s\"", GetUserNameFromId(item->ai_grantee, false))),
				 errhint("Revoke the privileges that role \"%s\" granted on it, update the extension, and grant them again.",
						 GetUserNameFromId(item->ai_grantor, false))));
	}
}

/*
 * idem_make_grants_ordinary(): for every member of the extension being
 * updated, and each of its columns, turn the grants to roles other than
 * the owner and PUBLIC that its initial privileges hold into ordinary
 * grants (see the file's comment).
 */
Datum
idem_make_grants_ordinary(PG_FUNCTION_ARGS)
{
	MemoryContext caller = CurrentMemoryContext;
	Oid			argtypes[1] = {OIDOID};
	Datum		args[1];
	GrantSlot  *slots;
	int			nslots;
	bool		table_done = false;

	refuse_outside_script("idem_make_grants_ordinary");

	/*
	 * The members with initial privileges, and the columns of member
	 * relations with privileges or initial privileges; each object before
	 * its columns.
	 */
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	args[0] = ObjectIdGetDatum(CurrentExtensionObject);
	if (SPI_execute_with_args(
							  "SELECT s.classid, s.objid, s.attnum, i.initprivs"
							  "  FROM (SELECT d.classid, d.objid, 0 AS attnum, false AS has_acl"
							  "          FROM pg_catalog.pg_depend d"
							  "         WHERE d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass"
							  "           AND d.refobjid OPERATOR(pg_catalog.=) $1"
							  "           AND d.deptype OPERATOR(pg_catalog.=) 'e'"
							  "        UNION ALL"
							  "        SELECT d.classid, d.objid, a.attnum, a.attacl IS NOT NULL"
							  "          FROM pg_catalog.pg_depend d"
							  "          JOIN pg_catalog.pg_attribute a ON a.attrelid OPERATOR(pg_catalog.=) d.objid"
							  "         WHERE d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass"
							  "           AND d.refobjid OPERATOR(pg_catalog.=) $1"
							  "           AND d.deptype OPERATOR(pg_catalog.=) 'e'"
							  "           AND d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass"
							  "           AND a.attnum OPERATOR(pg_catalog.>) 0 AND NOT a.attisdropped) s"
							  "  LEFT JOIN pg_catalog.pg_init_privs i"
							  "    ON i.classoid OPERATOR(pg_catalog.=) s.classid"
							  "   AND i.objoid OPERATOR(pg_catalog.=) s.objid"
							  "   AND i.objsubid OPERATOR(pg_catalog.=) s.attnum"
							  " WHERE i.initprivs IS NOT NULL OR s.has_acl"
							  " ORDER BY s.classid, s.objid, s.attnum",
							  1, argtypes, args, NULL, true, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not read the initial privileges of the extension's members");
	nslots = SPI_processed;
	slots = MemoryContextAllocZero(caller, Max(nslots, 1) * sizeof(GrantSlot));
	for (int i = 0; i < nslots; i++)
	{
		HeapTuple	row = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;
		Datum		initial;
		MemoryContext spi = MemoryContextSwitchTo(caller);

		slots[i].classid = DatumGetObjectId(SPI_getbinval(row, desc, 1, &isnull));
		slots[i].objid = DatumGetObjectId(SPI_getbinval(row, desc, 2, &isnull));
		slots[i].attnum = DatumGetInt32(SPI_getbinval(row, desc, 3, &isnull));
		initial = SPI_getbinval(row, desc, 4, &isnull);
		slots[i].initial = acl_items(isnull ? NULL : DatumGetAclPCopy(initial));
		slots[i].acl = current_acl(slots[i].classid, slots[i].objid, slots[i].attnum, &slots[i].owner);
		MemoryContextSwitchTo(spi);
	}
	SPI_finish();

	for (int i = 0; i < nslots; i++)
	{
		GrantSlot  *slot = &slots[i];
		Grants		initial = fresh_initial(slot->initial, slot->owner);
		bool		change = initial.n != slot->initial.n;

		if (slot->attnum == 0)
			table_done = change;

		/*
		 * A column of a table whose privileges changed inside the script
		 * has lost those privileges and recorded the rest as its initial
		 * ones (a table-level REVOKE revokes the columns' too).
		 */
		if (!change && !(slot->attnum != 0 && table_done && slot->acl.n > 0 &&
						 i > 0 && slots[i - 1].objid == slot->objid))
			continue;
		check_grantors(slot);
		make_slot_ordinary(slot, initial);
	}
	PG_RETURN_VOID();
}
