/*-------------------------------------------------------------------------
 *
 * transition.c
 *		idem_transition(): compare-and-set of a state column governed by a
 *		state machine, addressed by primary key.
 *
 *	  UPDATE t SET col = to WHERE pk = key AND col::text = ANY (from_states)
 *												AND col::text <> to
 *
 * is a compare-and-set: of any number of concurrent callers moving one row
 * to the same state, the first UPDATE wins; the others wait for its row lock
 * and, under READ COMMITTED, re-check the newest version, which no longer
 * matches.  They then read the row: already in the target state gives
 * 'already', anything else 'rejected'.  Under REPEATABLE READ and
 * SERIALIZABLE the losers get 40001 instead.
 *
 * The statements run through SPI as the caller, so table privileges,
 * row-level security and the enforcing trigger all apply.  They are built
 * from the catalog, never from caller text: the table and columns are
 * quoted identifiers, the key and states travel as parameters, the casts
 * and the primary key's equality operators are schema-qualified (as the
 * foreign-key triggers build theirs).  Plans are prepared once per table
 * and state column, and prepared again when a name, the column's type or
 * the primary key changed.
 *
 * The statements name the table with ONLY, and a table with inheritance
 * children is refused: the machine's trigger fires for the parent's own rows
 * only, so a child's row would move unchecked.  Partitioned tables are
 * governed whole (their partitions carry clones of the triggers).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "catalog/pg_inherits.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/relcache.h"
#include "utils/syscache.h"

#include "extension_objects.h"
#include "machine.h"
#include "pg_compat.h"
#include "record_store.h"
#include "stats.h"

PG_FUNCTION_INFO_V1(idem_transition_text);
PG_FUNCTION_INFO_V1(idem_transition_array);

typedef struct PlanKey
{
	Oid			relid;
	AttrNumber	attnum;
} PlanKey;

/*
 * The statements of one (table, state column).  They embed the names of the
 * schema, table and columns, the column's type and the primary key, so they
 * are rebuilt when any of those changed (the plan cache itself replans for
 * other changes).  REINDEX CONCURRENTLY gives the primary key a new OID and
 * so costs one rebuild per session.  Old plans may be executing in an outer
 * call (a trigger on the table may call idem_transition), so they are handed
 * to record_store.c, which frees them once no call runs; a call holds the
 * store open for that reason.
 */
typedef struct PlanSignature
{
	Oid			namespace;
	NameData	relname;
	NameData	column;
	Oid			column_type;
	int32		column_typmod;
	Oid			pkey;
} PlanSignature;

typedef struct PlanEntry
{
	PlanKey		key;
	PlanSignature signature;
	int			nkeys;			/* primary key columns */
	SPIPlanPtr	update;			/* $1 to, $2.. key, $n from[] */
	SPIPlanPtr	select;			/* $1.. key */
} PlanEntry;

static HTAB *plan_cache = NULL;

static void
plan_signature(Relation rel, AttrNumber attnum, PlanSignature *signature)
{
	Form_pg_attribute att = TupleDescAttr(RelationGetDescr(rel), attnum - 1);

	memset(signature, 0, sizeof(PlanSignature));
	signature->namespace = RelationGetNamespace(rel);
	namestrcpy(&signature->relname, RelationGetRelationName(rel));
	namestrcpy(&signature->column, NameStr(att->attname));
	signature->column_type = att->atttypid;
	signature->column_typmod = att->atttypmod;
	signature->pkey = idem_primary_key_index(rel);
}

/* The enforcing trigger of rel for state_column (or the only one). */
static Trigger *
find_attachment(Relation rel, Oid enforce_fn, const char *state_column)
{
	TriggerDesc *trigdesc = rel->trigdesc;
	Trigger    *match = NULL;
	int			count = 0;

	for (int i = 0; trigdesc != NULL && i < trigdesc->numtriggers; i++)
	{
		Trigger    *trigger = &trigdesc->triggers[i];

		if (trigger->tgfoid != enforce_fn || trigger->tgnargs != 2)
			continue;
		if (state_column != NULL && strcmp(trigger->tgargs[1], state_column) != 0)
			continue;
		match = trigger;
		count++;
	}
	if (count == 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 state_column ?
				 errmsg("column \"%s\" of table \"%s\" has no state machine",
						state_column, RelationGetRelationName(rel)) :
				 errmsg("table \"%s\" has no state machine", RelationGetRelationName(rel)),
				 errhint("Attach one with idem_attach_machine().")));
	if (count > 1)
		ereport(ERROR,
				(errcode(ERRCODE_AMBIGUOUS_COLUMN),
				 errmsg("table \"%s\" has more than one state machine",
						RelationGetRelationName(rel)),
				 errhint("Name the column with state_column => ...")));
	return match;
}

/* "pk1 OPERATOR(...) $2::type AND ..." from the primary key index */
static int
append_key_condition(StringInfo buf, Relation rel, int first_param)
{
	Oid			pk_oid = idem_primary_key_index(rel);
	Relation	index;
	int			nkeys;

	if (!OidIsValid(pk_oid))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("table \"%s\" has no primary key", RelationGetRelationName(rel)),
				 errhint("idem_transition addresses rows by primary key.")));
	index = index_open(pk_oid, AccessShareLock);
	nkeys = IndexRelationGetNumberOfKeyAttributes(index);
	for (int i = 0; i < nkeys; i++)
	{
		AttrNumber	attnum = index->rd_index->indkey.values[i];
		Form_pg_attribute att = TupleDescAttr(RelationGetDescr(rel), attnum - 1);
		Oid			opcintype = index->rd_opcintype[i];
		Oid			eq = get_opfamily_member(index->rd_opfamily[i], opcintype, opcintype,
											 BTEqualStrategyNumber);
		char		param[16];

		if (!OidIsValid(eq))
			elog(ERROR, "missing equality operator for primary key column %d", i + 1);
		snprintf(param, sizeof(param), "$%d", first_param + i);
		if (i > 0)
			appendStringInfoString(buf, " AND ");
		/* the key arrives as text and is cast to the column's type */
		generate_operator_clause(buf, quote_identifier(NameStr(att->attname)),
								 att->atttypid, eq, param, TEXTOID);
	}
	index_close(index, AccessShareLock);
	return nkeys;
}

static PlanEntry *
prepare_plans(Relation rel, AttrNumber attnum)
{
	PlanKey		key;
	PlanSignature signature;
	PlanEntry  *entry;
	bool		found;
	const char *table;
	const char *column;
	const char *column_type;
	StringInfoData cond;
	StringInfoData sql;
	Oid		   *argtypes;

	/* the key is hashed as bytes (HASH_BLOBS): its padding must be zero too */
	memset(&key, 0, sizeof(key));
	key.relid = RelationGetRelid(rel);
	key.attnum = attnum;

	if (plan_cache == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = sizeof(PlanKey);
		ctl.entrysize = sizeof(PlanEntry);
		ctl.hcxt = CacheMemoryContext;
		plan_cache = hash_create("idempotency transition plans", 16, &ctl,
								 HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	}
	plan_signature(rel, attnum, &signature);
	entry = hash_search(plan_cache, &key, HASH_FIND, &found);
	if (found && memcmp(&entry->signature, &signature, sizeof(PlanSignature)) == 0)
		return entry;
	if (found)
	{
		idem_store_retire_plan(entry->update);
		idem_store_retire_plan(entry->select);
		hash_search(plan_cache, &key, HASH_REMOVE, NULL);
	}

	/* ONLY: the rows of inheritance children are not governed (transition()) */
	table = psprintf("%s%s", rel->rd_rel->relkind != RELKIND_PARTITIONED_TABLE ? "ONLY " : "",
					 quote_qualified_identifier(get_namespace_name(RelationGetNamespace(rel)),
												RelationGetRelationName(rel)));
	column = quote_identifier(NameStr(TupleDescAttr(RelationGetDescr(rel), attnum - 1)->attname));
	column_type = format_type_extended(TupleDescAttr(RelationGetDescr(rel), attnum - 1)->atttypid,
									   TupleDescAttr(RelationGetDescr(rel), attnum - 1)->atttypmod,
									   FORMAT_TYPE_TYPEMOD_GIVEN | FORMAT_TYPE_FORCE_QUALIFY);

	initStringInfo(&cond);
	{
		int			nkeys = append_key_condition(&cond, rel, 2);
		SPIPlanPtr	update;
		SPIPlanPtr	select;

		argtypes = palloc(sizeof(Oid) * (nkeys + 2));
		argtypes[0] = TEXTOID;
		for (int i = 0; i < nkeys; i++)
			argtypes[i + 1] = TEXTOID;
		argtypes[nkeys + 1] = TEXTARRAYOID;

		initStringInfo(&sql);
		appendStringInfo(&sql,
						 "UPDATE %s SET %s = CAST($1 AS %s) WHERE %s AND "
						 "CAST(%s AS pg_catalog.text) OPERATOR(pg_catalog.=) ANY ($%d) AND "
						 "CAST(%s AS pg_catalog.text) OPERATOR(pg_catalog.<>) $1",
						 table, column, column_type, cond.data, column, nkeys + 2, column);
		update = SPI_prepare(sql.data, nkeys + 2, argtypes);
		if (update == NULL)
			elog(ERROR, "SPI_prepare failed for \"%s\": %s", sql.data,
				 SPI_result_code_string(SPI_result));

		/* the SELECT numbers the key from $1 */
		resetStringInfo(&cond);
		append_key_condition(&cond, rel, 1);
		resetStringInfo(&sql);
		appendStringInfo(&sql, "SELECT CAST(%s AS pg_catalog.text) FROM %s WHERE %s",
						 column, table, cond.data);
		select = SPI_prepare(sql.data, nkeys, argtypes + 1);
		if (select == NULL)
			elog(ERROR, "SPI_prepare failed for \"%s\": %s", sql.data,
				 SPI_result_code_string(SPI_result));

		if (SPI_keepplan(update) != 0 || SPI_keepplan(select) != 0)
			elog(ERROR, "SPI_keepplan failed");
		entry = hash_search(plan_cache, &key, HASH_ENTER, &found);
		entry->signature = signature;
		entry->nkeys = nkeys;
		entry->update = update;
		entry->select = select;
	}
	return entry;
}

static char *
describe_key(Datum *keys, int nkeys)
{
	StringInfoData buf;

	initStringInfo(&buf);
	for (int i = 0; i < nkeys; i++)
		appendStringInfo(&buf, "%s%s", i ? ", " : "", TextDatumGetCString(keys[i]));
	return buf.data;
}

/*
 * idem_transition(table regclass, key text | text[], to_state text,
 *				   from_states text[] DEFAULT NULL, state_column name DEFAULT NULL)
 *	  -> 'applied' | 'already' | 'rejected'
 *
 * from_states NULL means every state with a move to to_state.
 */
static Datum transition(FunctionCallInfo fcinfo, bool key_is_array);

Datum
idem_transition_text(PG_FUNCTION_ARGS)
{
	return transition(fcinfo, false);
}

Datum
idem_transition_array(PG_FUNCTION_ARGS)
{
	return transition(fcinfo, true);
}

static Datum
transition(FunctionCallInfo fcinfo, bool key_is_array)
{
	Oid			relid;
	const IdemObjects *objects;
	Relation	rel;
	Trigger    *trigger;
	char	   *machine_name;
	char	   *column_name;
	AttrNumber	attnum;
	IdemMachine *machine;
	char	   *to_state;
	int			to;
	Datum		from_array;
	Datum	   *keys;
	int			nkeys;
	PlanEntry  *plans;
	SPIPlanPtr	update_plan;
	SPIPlanPtr	select_plan;
	Datum	   *args;
	char	   *nulls;
	const char *outcome;
	int			ret;
	IdemStore	store;

	for (int i = 0; i < 3; i++)
		if (PG_ARGISNULL(i))
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("%s must not be null",
							i == 0 ? "table_name" : i == 1 ? "key" : "to_state")));
	relid = PG_GETARG_OID(0);
	to_state = text_to_cstring(PG_GETARG_TEXT_PP(2));
	/* open only to defer the freeing of plans (see PlanSignature) */
	idem_store_open(&store, fcinfo->flinfo->fn_oid);
	objects = idem_objects_current();
	/* see redefinitions committed since our last statement, as the trigger does */
	idem_machine_refresh();

	/*
	 * The statements check every privilege they need, but opening the table
	 * takes a lock: a caller who may not update it must not get that far.
	 */
	if (pg_class_aclcheck(relid, GetUserId(), ACL_UPDATE) != ACLCHECK_OK &&
		pg_attribute_aclcheck_all(relid, GetUserId(), ACL_UPDATE, ACLMASK_ANY) != ACLCHECK_OK)
		aclcheck_error(ACLCHECK_NO_PRIV, get_relkind_objtype(get_rel_relkind(relid)),
					   get_rel_name(relid));
	/* the lock of the UPDATE that follows, taken first: see read_lock() */
	rel = table_open(relid, RowExclusiveLock);
	trigger = find_attachment(rel, objects->enforce_fn,
							  PG_ARGISNULL(4) ? NULL : NameStr(*PG_GETARG_NAME(4)));
	/* copies: the relcache may rebuild rel's triggers at the next lock */
	machine_name = pstrdup(trigger->tgargs[0]);
	column_name = pstrdup(trigger->tgargs[1]);

	/*
	 * The machine's triggers fire for the rows of this table only, not for
	 * those of its inheritance children (idem_attach_machine refuses a parent,
	 * but children may come later).  The statements say ONLY as well, for a
	 * child added while we run.
	 */
	if (rel->rd_rel->relkind != RELKIND_PARTITIONED_TABLE && rel->rd_rel->relhassubclass &&
		find_inheritance_children(relid, NoLock) != NIL)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("table \"%s\" has inheritance children", RelationGetRelationName(rel)),
				 errdetail("State machine \"%s\" governs the rows of table \"%s\" only, not those of its children.",
						   machine_name, RelationGetRelationName(rel)),
				 errhint("Attach the machine to each child table, and call idem_transition on the child that holds the row.")));
	attnum = SPI_fnumber(RelationGetDescr(rel), column_name);
	if (attnum <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_COLUMN),
				 errmsg("column \"%s\" of relation \"%s\" does not exist",
						column_name, RelationGetRelationName(rel))));

	machine = idem_machine_get(fcinfo->flinfo->fn_oid, machine_name);
	if (machine == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("state machine \"%s\" does not exist", machine_name)));
	to = idem_machine_state_index(machine, to_state);
	if (to < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("\"%s\" is not a state of state machine \"%s\"", to_state, machine_name)));

	if (!PG_ARGISNULL(3))
		from_array = PG_GETARG_DATUM(3);
	else
	{
		ArrayBuildState *from = initArrayResult(TEXTOID, CurrentMemoryContext, false);

		for (int f = 0; f < machine->nstates; f++)
			if (machine->moves[f * machine->nstates + to])
				accumArrayResult(from, CStringGetTextDatum(machine->states[f]), false,
								 TEXTOID, CurrentMemoryContext);
		from_array = makeArrayResult(from, CurrentMemoryContext);
	}

	if (key_is_array)
	{
		ArrayType  *key_array = PG_GETARG_ARRAYTYPE_P(1);
		bool	   *key_nulls;

		if (ARR_NDIM(key_array) > 1)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("key must be a one-dimensional array"),
					 errhint("Pass the primary key's values in primary key order, as in ARRAY['a', '1'].")));
		deconstruct_array(key_array, TEXTOID, -1, false, TYPALIGN_INT,
						  &keys, &key_nulls, &nkeys);
		for (int i = 0; i < nkeys; i++)
			if (key_nulls[i])
				ereport(ERROR,
						(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
						 errmsg("key must not contain nulls")));
	}
	else
	{
		keys = palloc(sizeof(Datum));
		keys[0] = PG_GETARG_DATUM(1);
		nkeys = 1;
	}

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	plans = prepare_plans(rel, attnum);
	if (nkeys != plans->nkeys)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg_plural("the primary key of table \"%s\" has %d column, but the key has %d values",
							   "the primary key of table \"%s\" has %d columns, but the key has %d values",
							   plans->nkeys, RelationGetRelationName(rel), plans->nkeys, nkeys),
				 errhint("Pass a key of several columns as text[], in primary key order.")));

	args = palloc(sizeof(Datum) * (nkeys + 2));
	nulls = palloc0(nkeys + 3);
	memset(nulls, ' ', nkeys + 2);
	args[0] = CStringGetTextDatum(to_state);
	memcpy(args + 1, keys, sizeof(Datum) * nkeys);
	args[nkeys + 1] = from_array;

	/*
	 * Copies: a nested idem_transition run by a trigger of the UPDATE may
	 * replace this table's cache entry and reuse its slot.
	 */
	update_plan = plans->update;
	select_plan = plans->select;
	ret = idem_execute_without_seqscan(update_plan, args, nulls, false, 0);
	if (ret != SPI_OK_UPDATE)
		elog(ERROR, "SPI_execute_plan failed: %s", SPI_result_code_string(ret));
	if (SPI_processed > 0)
		outcome = "applied";
	else
	{
		bool		isnull;
		Datum		current;

		ret = idem_execute_without_seqscan(select_plan, args + 1, nulls + 1, false, 1);
		if (ret != SPI_OK_SELECT)
			elog(ERROR, "SPI_execute_plan failed: %s", SPI_result_code_string(ret));
		if (SPI_processed == 0)
			ereport(ERROR,
					(errcode(ERRCODE_NO_DATA_FOUND),
					 errmsg("no row of table \"%s\" has key (%s)",
							RelationGetRelationName(rel), describe_key(keys, nkeys))));
		current = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
		outcome = (!isnull && strcmp(TextDatumGetCString(current), to_state) == 0)
			? "already" : "rejected";
	}
	SPI_finish();
	table_close(rel, NoLock);
	idem_store_close(&store);
	idem_count(outcome[0] == 'a' && outcome[1] == 'p' ? IDEM_COUNT_TRANSITION_APPLIED :
			   outcome[0] == 'a' ? IDEM_COUNT_TRANSITION_ALREADY :
			   IDEM_COUNT_TRANSITION_REJECTED);
	PG_RETURN_TEXT_P(cstring_to_text(outcome));
}
