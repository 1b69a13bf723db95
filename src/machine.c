/*-------------------------------------------------------------------------
 *
 * machine.c
 *		State machine definitions: a per-backend cache, and the triggers
 *		that refuse moves a machine does not contain.
 *
 * Definitions live in idem_machines and idem_machine_moves.  Each backend
 * compiles a machine on first use into a sorted array of states and a move
 * matrix, so the trigger costs a hash lookup and a binary search per row and
 * reads no table in the steady state.
 *
 * An attachment is two row triggers (idem_attach_machine):
 *	 - idem_enforce_transition, BEFORE INSERT OR UPDATE: every UPDATE is
 *	   checked as the move from the old row's state to the new row's; so is
 *	   the INSERT half of an UPDATE that moves a row to another partition,
 *	   recognised by a note the source partition's trigger leaves and the
 *	   destination's verifies against the old version in the heap ("Rows in
 *	   flight" below).  Another INSERT is only a proposal at this point (INSERT
 *	   ... ON CONFLICT fires it before the conflict check), so a row that is
 *	   not in an initial state passes when the second trigger exists and fires
 *	   whenever this one does.
 *	 - idem_enforce_initial_state, AFTER INSERT, WHEN idem_inserted_unchecked:
 *	   the WHEN clause runs as each row is stored.  For a row that arrived by
 *	   row movement it checks the move again if the row is stored in another
 *	   state than the one checked; the trigger fires for the other rows that
 *	   are not in an initial state, and refuses them.
 * An attachment made by 0.1.0 without the second trigger works as before:
 * the BEFORE trigger refuses every INSERT that is not in an initial state.
 * The notes are per backend and live for one command: the one whose rows
 * are being written, by the active snapshot's command ID; a note vouches only
 * for a clone of the trigger that left it.  No lock is taken besides an
 * AccessShareLock on the source partition (held already by the UPDATE) to
 * read the moved row's old version.
 *
 * Invalidation: a statement trigger on both tables (idem_machines_changed)
 * sends a relcache invalidation for idem_machines, which every backend
 * receives at its next AcceptInvalidationMessages (and the changing backend
 * at its next command); the relcache callback drops every compiled machine.
 * The trigger calls AcceptInvalidationMessages once per statement, so a
 * redefinition applies in every session from the first statement that starts
 * after it committed, even inside an open transaction.  Machines are loaded
 * with the latest snapshot, not the transaction's, for the same reason (and
 * so that a REPEATABLE READ transaction cannot put an old definition into the
 * shared cache); like a catalog, a definition is not versioned by snapshot.
 *
 * Reading the definitions needs no privilege: like a constraint, a machine
 * governs writers who may not read its definition.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/nbtree.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/indexing.h"
#include "catalog/pg_am.h"
#include "catalog/pg_trigger.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"
#include "parser/parse_coerce.h"
#include "storage/bufmgr.h"
#include "storage/proc.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

#include "extension_objects.h"
#include "idempotency.h"
#include "machine.h"
#include "pg_compat.h"
#include "record_store.h"

PG_FUNCTION_INFO_V1(idem_machines_changed);
PG_FUNCTION_INFO_V1(idem_enforce_transition);
PG_FUNCTION_INFO_V1(idem_trigger_arg);
PG_FUNCTION_INFO_V1(idem_inserted_unchecked);
PG_FUNCTION_INFO_V1(idem_enforce_initial_state);

typedef struct MachineEntry
{
	char		name[NAMEDATALEN];	/* hash key */
	IdemMachine *machine;		/* NULL: no such machine */
} MachineEntry;

/*
 * Compiled machines, each in its own memory context.  An invalidation can
 * arrive in the middle of a caller's use of a machine (any catalog access
 * may accept invalidations), so a flush does not free machines at once: it
 * moves their contexts to the graveyard, which the next idem_machine_get
 * empties.  A pointer from idem_machine_get therefore stays valid until the
 * next call of idem_machine_get.
 */
static HTAB *machine_cache = NULL;
static List *graveyard = NIL;
static Oid	machines_relid = InvalidOid;
static uint64 machine_generation = 1;

static void
machine_cache_flush(void)
{
	if (machine_cache != NULL)
	{
		HASH_SEQ_STATUS status;
		MachineEntry *entry;
		MemoryContext old = MemoryContextSwitchTo(CacheMemoryContext);

		hash_seq_init(&status, machine_cache);
		while ((entry = hash_seq_search(&status)) != NULL)
			if (entry->machine != NULL)
				graveyard = lappend(graveyard, entry->machine->cxt);
		MemoryContextSwitchTo(old);
		hash_destroy(machine_cache);
	}
	machine_cache = NULL;
	machine_generation++;
}

static void
empty_graveyard(void)
{
	ListCell   *lc;

	foreach(lc, graveyard)
		MemoryContextDelete((MemoryContext) lfirst(lc));
	list_free(graveyard);
	graveyard = NIL;
}

static void
machine_relcache_callback(Datum arg, Oid relid)
{
	if (relid == InvalidOid || relid == machines_relid)
		machine_cache_flush();
}

/* strcmp for bsearch/qsort over an array of C strings */
static int
compare_states(const void *a, const void *b)
{
	return strcmp(*(char *const *) a, *(char *const *) b);
}

int
idem_machine_state_index(const IdemMachine *machine, const char *state)
{
	char	  **found;

	found = bsearch(&state, machine->states, machine->nstates, sizeof(char *),
					compare_states);
	return found ? (int) (found - machine->states) : -1;
}

static void
text_array_to_cstrings(Datum array, char ***items, int *nitems)
{
	Datum	   *elems;
	bool	   *nulls;
	int			n;

	deconstruct_array(DatumGetArrayTypeP(array), TEXTOID, -1, false, TYPALIGN_INT,
					  &elems, &nulls, &n);
	*items = palloc(sizeof(char *) * Max(n, 1));
	*nitems = 0;
	for (int i = 0; i < n; i++)
		if (!nulls[i])			/* idem_define_machine stores none; skip hand-made ones */
			(*items)[(*nitems)++] = TextDatumGetCString(elems[i]);
}

/*
 * Compile machine "name" from the tables, in a memory context of its own;
 * NULL if there is no such machine.
 */
static IdemMachine *
machine_load(const IdemObjects *objects, const char *name)
{
	Relation	machines;
	Relation	moves;
	Snapshot	snapshot;
	SysScanDesc scan;
	ScanKeyData skey;
	HeapTuple	tuple;
	IdemMachine *machine = NULL;
	MemoryContext cxt;
	MemoryContext old;
	bool		isnull;

	/*
	 * Lock first, snapshot second: opening the tables accepts pending
	 * invalidations, and the snapshot must be at least as new as they are.
	 */
	machines = table_open(objects->machines, AccessShareLock);
	moves = table_open(objects->moves, AccessShareLock);
	snapshot = RegisterSnapshot(GetLatestSnapshot());
	ScanKeyInit(&skey, 1, BTEqualStrategyNumber, F_TEXTEQ, CStringGetTextDatum(name));

	/* under the caller's context until complete, so that an error frees it */
	cxt = AllocSetContextCreate(CurrentMemoryContext, "idempotency state machine",
								ALLOCSET_SMALL_SIZES);
	old = MemoryContextSwitchTo(cxt);

	scan = systable_beginscan(machines, idem_primary_key(machines), true, snapshot, 1, &skey);
	tuple = systable_getnext(scan);
	if (HeapTupleIsValid(tuple))
	{
		Datum		initial;

		machine = palloc0(sizeof(IdemMachine));
		machine->cxt = cxt;
		strlcpy(machine->name, name, NAMEDATALEN);
		text_array_to_cstrings(heap_getattr(tuple, 2, RelationGetDescr(machines), &isnull),
							   &machine->states, &machine->nstates);
		/* idem_define_machine refuses more; a hand-edited row may have them */
		if (machine->nstates > IDEM_MAX_MACHINE_STATES)
			ereport(ERROR,
					(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
					 errmsg("state machine \"%s\" has %d states, more than the %d allowed",
							name, machine->nstates, IDEM_MAX_MACHINE_STATES)));
		qsort(machine->states, machine->nstates, sizeof(char *), compare_states);
		machine->initial = palloc0(sizeof(bool) * Max(machine->nstates, 1));
		machine->moves = palloc0(mul_size(sizeof(bool),
										  Max((Size) machine->nstates * machine->nstates, 1)));

		initial = heap_getattr(tuple, 3, RelationGetDescr(machines), &isnull);
		if (!isnull)
		{
			char	  **items;
			int			nitems;

			text_array_to_cstrings(initial, &items, &nitems);
			for (int i = 0; i < nitems; i++)
			{
				int			s = idem_machine_state_index(machine, items[i]);

				if (s >= 0)
				{
					machine->initial[s] = true;
					machine->has_initial = true;
				}
			}
		}
	}
	systable_endscan(scan);

	if (machine != NULL)
	{
		scan = systable_beginscan(moves, idem_primary_key(moves), true, snapshot, 1, &skey);
		while (HeapTupleIsValid(tuple = systable_getnext(scan)))
		{
			char	   *from = TextDatumGetCString(heap_getattr(tuple, 2, RelationGetDescr(moves), &isnull));
			char	   *to = TextDatumGetCString(heap_getattr(tuple, 3, RelationGetDescr(moves), &isnull));
			int			f = idem_machine_state_index(machine, from);
			int			t = idem_machine_state_index(machine, to);

			/* moves always name states; a hand-edited table may not */
			if (f >= 0 && t >= 0)
				machine->moves[f * machine->nstates + t] = true;
		}
		systable_endscan(scan);
	}
	MemoryContextSwitchTo(old);

	UnregisterSnapshot(snapshot);
	table_close(moves, AccessShareLock);
	table_close(machines, AccessShareLock);
	if (machine == NULL)
		MemoryContextDelete(cxt);
	else
		MemoryContextSetParent(cxt, CacheMemoryContext);
	return machine;
}

/*
 * The compiled machine "name", or NULL when there is none.  The pointer
 * stays valid until the next call; callers that keep it longer compare
 * idem_machine_generation() and call again when it changed.
 */
IdemMachine *
idem_machine_get(Oid fn_oid, const char *name)
{
	const IdemObjects *objects = idem_objects(fn_oid);
	static bool callback_registered = false;
	MachineEntry *entry;
	IdemMachine *machine;
	bool		found;

	if (!callback_registered)
	{
		CacheRegisterRelcacheCallback(machine_relcache_callback, (Datum) 0);
		callback_registered = true;
	}
	empty_graveyard();
	if (machines_relid != objects->machines)
	{
		machine_cache_flush();
		machines_relid = objects->machines;
	}
	if (strlen(name) >= NAMEDATALEN)
		return NULL;			/* idem_define_machine allows no such name */

	if (machine_cache != NULL)
	{
		entry = hash_search(machine_cache, name, HASH_FIND, &found);
		if (found)
			return entry->machine;
	}

	machine = machine_load(objects, name);

	/* created after the load, which may have flushed the cache */
	if (machine_cache == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = NAMEDATALEN;
		ctl.entrysize = sizeof(MachineEntry);
		ctl.hcxt = CacheMemoryContext;
		machine_cache = hash_create("idempotency state machines", 16, &ctl,
									HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
	}
	entry = hash_search(machine_cache, name, HASH_ENTER, &found);
	entry->machine = machine;
	return machine;
}

uint64
idem_machine_generation(void)
{
	return machine_generation;
}

/*
 * "from" -> "to" as the detail of an error: the allowed moves from "from".
 */
static char *
idem_machine_moves_from(const IdemMachine *machine, int from)
{
	StringInfoData buf;
	bool		any = false;

	initStringInfo(&buf);
	for (int t = 0; t < machine->nstates; t++)
	{
		if (!machine->moves[from * machine->nstates + t])
			continue;
		appendStringInfo(&buf, "%s\"%s\"", any ? ", " : "", machine->states[t]);
		any = true;
	}
	return buf.data;
}

/*
 * AFTER ... FOR EACH STATEMENT trigger on idem_machines and
 * idem_machine_moves: tell every backend to drop its compiled machines.
 */
Datum
idem_machines_changed(PG_FUNCTION_ARGS)
{
	const IdemObjects *objects = idem_objects(fcinfo->flinfo->fn_oid);

	if (!CALLED_AS_TRIGGER(fcinfo) ||
		!TRIGGER_FIRED_FOR_STATEMENT(((TriggerData *) fcinfo->context)->tg_event))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("idem_machines_changed() must be called as a statement trigger")));
	CacheInvalidateRelcacheByRelid(objects->machines);
	PG_RETURN_POINTER(NULL);
}

/*
 * idem_trigger_arg(tgargs, n): argument n (from 1) of pg_trigger.tgargs,
 * where the arguments are stored NUL-terminated one after the other.
 */
Datum
idem_trigger_arg(PG_FUNCTION_ARGS)
{
	bytea	   *args = PG_GETARG_BYTEA_PP(0);
	int			n = PG_GETARG_INT32(1);
	const char *p = VARDATA_ANY(args);
	const char *end = p + VARSIZE_ANY_EXHDR(args);

	for (int i = 1; p < end; i++)
	{
		const char *nul = memchr(p, '\0', end - p);
		int			len = nul ? nul - p : end - p;

		if (i == n)
		{
			/* tgargs holds text in the database encoding; any other bytea may not */
			if (!pg_verify_mbstr(GetDatabaseEncoding(), p, len, true))
				ereport(ERROR,
						(errcode(ERRCODE_CHARACTER_NOT_IN_REPERTOIRE),
						 errmsg("trigger argument %d is not valid in the database encoding", n)));
			PG_RETURN_TEXT_P(cstring_to_text_with_len(p, len));
		}
		p += len + 1;
	}
	PG_RETURN_NULL();
}

/*
 * What the triggers keep per trigger, for the life of the backend: which
 * column, how to read it as text, whether the rows it lets in are checked
 * again after the insert, and the compiled machine.  A relcache invalidation
 * of the table (ALTER TABLE, a renamed column, a trigger created, dropped or
 * disabled) marks it stale; a change of the machine shows in
 * idem_machine_generation().  fn_extra points at the entry, so the rows of a
 * statement skip even the lookup.
 *
 * A state is the column's value cast to text, exactly as "column::text"
 * would cast it (which is what attach validates and idem_transition
 * compares): char(n) loses its padding, boolean reads "true", an enum its
 * label.
 */
typedef struct TriggerState
{
	Oid			tgoid;			/* hash key */
	Oid			relid;
	bool		valid;
	AttrNumber	attnum;
	Oid			typid;			/* of the column */
	CoercionPathType to_text;	/* RELABELTYPE: the value is text already */
	FmgrInfo	cast;			/* FUNC: the cast function; COERCEVIAIO: output */
	bool		checked_after;	/* an AFTER INSERT check fires with this trigger */
	Oid			attachment;		/* the trigger it is a clone of, or itself */
	uint64		generation;
	IdemMachine *machine;
} TriggerState;

static HTAB *trigger_states = NULL;

static void
trigger_states_invalidate(Datum arg, Oid relid)
{
	HASH_SEQ_STATUS status;
	TriggerState *state;

	if (trigger_states == NULL)
		return;
	hash_seq_init(&status, trigger_states);
	while ((state = hash_seq_search(&status)) != NULL)
		if (relid == InvalidOid || state->relid == relid)
			state->valid = false;
}
static void
prepare_text_cast(TriggerState *state, Oid typid, MemoryContext cxt)
{
	Oid			funcid = InvalidOid;
	bool		varlena;

	state->to_text = find_coercion_pathway(TEXTOID, typid, COERCION_EXPLICIT, &funcid);
	switch (state->to_text)
	{
		case COERCION_PATH_RELABELTYPE:
			break;
		case COERCION_PATH_FUNC:
			if (get_func_nargs(funcid) == 1)
			{
				fmgr_info_cxt(funcid, &state->cast, cxt);
				break;
			}
			/* a cast taking a typmod: the output function gives the same text */
			state->to_text = COERCION_PATH_COERCEVIAIO;
			getTypeOutputInfo(typid, &funcid, &varlena);
			fmgr_info_cxt(funcid, &state->cast, cxt);
			break;
		default:
			state->to_text = COERCION_PATH_COERCEVIAIO;
			getTypeOutputInfo(typid, &funcid, &varlena);
			fmgr_info_cxt(funcid, &state->cast, cxt);
			break;
	}
}


static char *
column_state(TriggerState *state, HeapTuple tuple, TupleDesc desc, AttrNumber attnum,
			 bool *isnull)
{
	Datum		value = heap_getattr(tuple, attnum, desc, isnull);

	if (*isnull)
		return NULL;
	switch (state->to_text)
	{
		case COERCION_PATH_RELABELTYPE:
			return TextDatumGetCString(value);
		case COERCION_PATH_FUNC:
			return TextDatumGetCString(FunctionCall1(&state->cast, value));
		default:
			return OutputFunctionCall(&state->cast, value);
	}
}

static char *
state_value(TriggerState *state, HeapTuple tuple, TupleDesc desc, bool *isnull)
{
	return column_state(state, tuple, desc, state->attnum, isnull);
}

/*
 * Does rel have the AFTER INSERT trigger idem_enforce_initial_state for the
 * machine and column of "trigger", firing whenever "trigger" fires?  Only
 * then may the BEFORE INSERT trigger let a row pass that is not in an initial
 * state: an attachment made by 0.1.0, or one whose AFTER trigger was dropped
 * or disabled, keeps refusing such rows at once.
 */
static bool
has_insert_check(Relation rel, Trigger *trigger, Oid enforce_fn)
{
	TriggerDesc *trigdesc = rel->trigdesc;
	Oid			namespace = get_func_namespace(enforce_fn);

	for (int i = 0; trigdesc != NULL && i < trigdesc->numtriggers; i++)
	{
		Trigger    *after = &trigdesc->triggers[i];
		char	   *fname;

		if (!TRIGGER_FOR_ROW(after->tgtype) || !TRIGGER_FOR_AFTER(after->tgtype) ||
			!TRIGGER_FOR_INSERT(after->tgtype) || after->tgnargs != 2 ||
			strcmp(after->tgargs[0], trigger->tgargs[0]) != 0 ||
			strcmp(after->tgargs[1], trigger->tgargs[1]) != 0)
			continue;
		if (after->tgenabled != TRIGGER_FIRES_ALWAYS && after->tgenabled != trigger->tgenabled)
			continue;
		fname = get_func_name(after->tgfoid);
		if (fname != NULL && strcmp(fname, "idem_enforce_initial_state") == 0 &&
			get_func_namespace(after->tgfoid) == namespace)
			return true;
	}
	return false;
}

/*
 * The trigger at the top of the tgparentid chain of a cloned trigger: the
 * trigger of the partitioned table the machine was attached to.  Its OID
 * names the attachment (machine, column and partition tree) in row notes.
 */
static Oid
root_trigger(Oid tgoid)
{
	Relation	tgrel = table_open(TriggerRelationId, AccessShareLock);

	for (;;)
	{
		ScanKeyData skey;
		SysScanDesc scan;
		HeapTuple	tuple;
		Oid			parent = InvalidOid;

		ScanKeyInit(&skey, Anum_pg_trigger_oid, BTEqualStrategyNumber, F_OIDEQ,
					ObjectIdGetDatum(tgoid));
		scan = systable_beginscan(tgrel, TriggerOidIndexId, true, NULL, 1, &skey);
		tuple = systable_getnext(scan);
		if (HeapTupleIsValid(tuple))
			parent = ((Form_pg_trigger) GETSTRUCT(tuple))->tgparentid;
		systable_endscan(scan);
		if (!OidIsValid(parent))
			break;
		tgoid = parent;
	}
	table_close(tgrel, AccessShareLock);
	return tgoid;
}

/*
 * The state of one trigger (both functions share the cache): validated
 * against the table, with its machine compiled.
 */
static TriggerState *
trigger_state(FunctionCallInfo fcinfo, TriggerData *trigdata, const char *fname)
{
	Trigger    *trigger = trigdata->tg_trigger;
	Relation	rel = trigdata->tg_relation;
	TupleDesc	desc = RelationGetDescr(rel);
	TriggerState *state;

	if (trigger->tgnargs != 2)
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("trigger \"%s\" of table \"%s\" must pass %s a machine and a column",
						trigger->tgname, RelationGetRelationName(rel), fname)));

	idem_machine_refresh();

	state = (TriggerState *) fcinfo->flinfo->fn_extra;
	if (state == NULL || state->tgoid != trigger->tgoid)
	{
		bool		found;

		if (trigger_states == NULL)
		{
			HASHCTL		ctl;

			ctl.keysize = sizeof(Oid);
			ctl.entrysize = sizeof(TriggerState);
			ctl.hcxt = CacheMemoryContext;
			trigger_states = hash_create("idempotency trigger states", 16, &ctl,
										 HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
			CacheRegisterRelcacheCallback(trigger_states_invalidate, (Datum) 0);
		}
		state = hash_search(trigger_states, &trigger->tgoid, HASH_ENTER, &found);
		if (!found)
			state->valid = false;
		fcinfo->flinfo->fn_extra = state;
	}
	if (!state->valid || state->relid != RelationGetRelid(rel))
	{
		state->relid = RelationGetRelid(rel);
		state->machine = NULL;
		state->attnum = SPI_fnumber(desc, trigger->tgargs[1]);
		if (state->attnum <= 0)
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_COLUMN),
					 errmsg("column \"%s\" of relation \"%s\" does not exist",
							trigger->tgargs[1], RelationGetRelationName(rel)),
					 errhint("Trigger \"%s\" names it: detach the machine with that column name, then attach it again.",
							 trigger->tgname)));
		state->typid = TupleDescAttr(desc, state->attnum - 1)->atttypid;
		prepare_text_cast(state, state->typid, CacheMemoryContext);
		state->checked_after = has_insert_check(rel, trigger, fcinfo->flinfo->fn_oid);
		state->attachment = trigger->tgisclone ? root_trigger(trigger->tgoid) : trigger->tgoid;
		state->valid = true;
	}
	if (state->machine == NULL || state->generation != idem_machine_generation())
	{
		state->machine = idem_machine_get(fcinfo->flinfo->fn_oid, trigger->tgargs[0]);
		state->generation = idem_machine_generation();
		if (state->machine == NULL)
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_OBJECT),
					 errmsg("state machine \"%s\" does not exist", trigger->tgargs[0]),
					 errdetail("Trigger \"%s\" of table \"%s\" enforces it.",
							   trigger->tgname, RelationGetRelationName(rel))));
	}
	return state;
}
/*
 * Accept the invalidations of other sessions once per statement: a machine
 * redefined and committed elsewhere applies from our next statement, even in
 * a transaction that takes no new lock (which is when invalidations would
 * otherwise arrive).
 */
void
idem_machine_refresh(void)
{
	static TimestampTz last_statement = 0;
	static LocalTransactionId last_xact = InvalidLocalTransactionId;
	TimestampTz statement = GetCurrentStatementStartTimestamp();

	if (statement != last_statement || IDEM_MY_LXID != last_xact)
	{
		AcceptInvalidationMessages();
		last_statement = statement;
		last_xact = IDEM_MY_LXID;
	}
}


static void
report_invalid_move(const IdemMachine *machine, const char *relname, const char *column,
					const char *from, const char *to)
{
	int			f = from ? idem_machine_state_index(machine, from) : -1;
	int			t = to ? idem_machine_state_index(machine, to) : -1;
	char	   *moves;

	if (to == NULL && from == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_INVALID_TRANSITION),
				 errmsg("invalid initial state NULL in column \"%s\" of table \"%s\"",
						column, relname),
				 errdetail("NULL is not a state of state machine \"%s\".", machine->name)));
	if (to == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_INVALID_TRANSITION),
				 errmsg("invalid transition from \"%s\" to NULL in column \"%s\" of table \"%s\"",
						from, column, relname),
				 errdetail("NULL is not a state of state machine \"%s\".", machine->name)));
	if (t < 0 && from == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_INVALID_TRANSITION),
				 errmsg("invalid initial state \"%s\" in column \"%s\" of table \"%s\"",
						to, column, relname),
				 errdetail("\"%s\" is not a state of state machine \"%s\".", to, machine->name)));
	if (t < 0)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_INVALID_TRANSITION),
				 errmsg("invalid transition from \"%s\" to \"%s\" in column \"%s\" of table \"%s\"",
						from, to, column, relname),
				 errdetail("\"%s\" is not a state of state machine \"%s\".", to, machine->name)));
	if (from == NULL)
	{
		StringInfoData initial;

		initStringInfo(&initial);
		for (int i = 0; i < machine->nstates; i++)
			if (machine->initial[i])
				appendStringInfo(&initial, "%s\"%s\"", initial.len ? ", " : "",
								 machine->states[i]);
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_INVALID_TRANSITION),
				 errmsg("invalid initial state \"%s\" in column \"%s\" of table \"%s\"",
						to, column, relname),
				 errdetail("State machine \"%s\" starts in %s only.", machine->name, initial.data)));
	}
	if (f < 0)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_INVALID_TRANSITION),
				 errmsg("invalid transition from \"%s\" to \"%s\" in column \"%s\" of table \"%s\"",
						from, to, column, relname),
				 errdetail("\"%s\" is not a state of state machine \"%s\".", from, machine->name)));

	moves = idem_machine_moves_from(machine, f);
	ereport(ERROR,
			(errcode(ERRCODE_IDEM_INVALID_TRANSITION),
			 errmsg("invalid transition from \"%s\" to \"%s\" in column \"%s\" of table \"%s\"",
					from, to, column, relname),
			 moves[0] ?
			 errdetail("State machine \"%s\" allows from \"%s\" only: %s.", machine->name, from, moves) :
			 errdetail("\"%s\" is a terminal state of state machine \"%s\".", from, machine->name)));
}

/*
 * A state is allowed for a new row: an initial state, or any state when the
 * machine declares none.  NULL never is.
 */
static bool
initial_allowed(const IdemMachine *machine, const char *to)
{
	int			t;

	if (to == NULL)
		return false;
	t = idem_machine_state_index(machine, to);
	return t >= 0 && (!machine->has_initial || machine->initial[t]);
}

/*
 * The rules of an UPDATE from "from" to "to": staying in the same value is
 * always allowed (the idempotent no-op), so is NULL to NULL; from NULL is
 * entering the machine (an initial state); anything else must be a move.
 */
static void
check_move(const IdemMachine *machine, const char *relname, const char *column,
		   const char *from, const char *to)
{
	int			f;
	int			t;

	if (from == NULL && to == NULL)
		return;
	if (to == NULL)
		report_invalid_move(machine, relname, column, from, NULL);
	if (from != NULL && strcmp(from, to) == 0)
		return;
	t = idem_machine_state_index(machine, to);
	if (t < 0)
		report_invalid_move(machine, relname, column, from, to);
	if (from == NULL)
	{
		if (!initial_allowed(machine, to))
			report_invalid_move(machine, relname, column, NULL, to);
		return;
	}
	f = idem_machine_state_index(machine, from);
	if (f < 0 || !machine->moves[f * machine->nstates + t])
		report_invalid_move(machine, relname, column, from, to);
}

/*
 * Rows in flight between two triggers of one row.
 *
 * An UPDATE that moves a row to another partition is a DELETE from the old
 * partition and an INSERT into the new one: the BEFORE UPDATE trigger of the
 * old partition sees the move (old state, new state), then the BEFORE INSERT
 * trigger of the new partition sees a new row.  Core tells that trigger
 * nothing about where the row comes from, so the BEFORE UPDATE trigger of a
 * partition leaves a note, "leaving": the old version's partition and TID,
 * the command that is updating it, and per column the attachment (the
 * partitioned table's trigger the partition's trigger is a clone of).  The
 * BEFORE INSERT trigger of another partition takes its column from the note
 * only if all of these hold:
 *	 - same transaction and same command: the command ID of the active
 *	   snapshot, which is the one the executor stamps on the rows it writes
 *	   (es_output_cid).  Every later statement, be it in the same simple
 *	   query, DO block or function, runs under a later command ID, so a note
 *	   dies with the command that left it even when no INSERT took it (the
 *	   destination's trigger skipped by an earlier trigger returning NULL, or
 *	   disabled);
 *	 - same trigger depth (a statement run by some trigger in between is
 *	   another command anyway);
 *	 - same attachment: the source's trigger and this one are clones of the
 *	   same trigger, so the row left a partition of the same tree, governed
 *	   by the same machine on the same column.  A trigger someone put on a
 *	   table of their own vouches for nothing else;
 *	 - the old version is really gone to another partition, by this command:
 *	   deleted by this transaction with this command ID, its t_ctid marked as
 *	   moved.
 * Then it checks the move from the old version's state to the state the row
 * arrives in (the destination's own BEFORE triggers that sort earlier may
 * have changed it) instead of an initial state.  An UPDATE that stays in its
 * partition leaves an old version whose t_ctid points at the new one, so its
 * note never vouches for an INSERT; a note is taken once per column, and the
 * next row's UPDATE replaces it.
 *
 * What remains: within one command, a data-modifying CTE that moves a row
 * whose destination trigger does not run (skipped or disabled) and inserts
 * another row into a third partition of the same tree; that INSERT is then
 * checked as a move from the moved row's old state.  It takes a BEFORE
 * INSERT trigger of the table's owner that drops rows, and UPDATE on the
 * table (the moved row's states are the writer's to change anyway).
 *
 * The AFTER INSERT check (idem_enforce_initial_state, below) fires for the
 * moved row too; the BEFORE INSERT trigger leaves it the note "arrived", the
 * partition, command and, per column, the move it checked.  The check's WHEN
 * clause (idem_inserted_unchecked), evaluated as the row is stored, takes it
 * at the depth just above, and checks the move again from the same old state
 * if the row is stored in another state than the one checked: BEFORE INSERT
 * triggers of the destination that sort after ours may change it.
 *
 * A note holds the columns of a few machines per table; a row governed by
 * more is refused at its destination rather than let in unchecked.  The
 * strings of the arrived note live in a context of its own, reset whenever
 * a note for another row starts.
 */
#define MAX_NOTED_COLUMNS 8

typedef struct NotedColumn
{
	NameData	column;
	Oid			attachment;		/* "leaving": the root trigger */
	AttrNumber	attnum;			/* "leaving": in the source partition */
	char	   *from;			/* "arrived": the move checked (NULL: NULL) */
	char	   *to;
} NotedColumn;

typedef struct RowNote
{
	LocalTransactionId lxid;
	CommandId	cid;			/* of the command that wrote it */
	int			depth;			/* pg_trigger_depth() of the trigger that wrote it */
	Oid			relid;
	ItemPointerData tid;		/* "leaving": the old version */
	int			ncolumns;
	NotedColumn columns[MAX_NOTED_COLUMNS];
	MemoryContext cxt;			/* "arrived": of from and to */
} RowNote;

static RowNote leaving;
static RowNote arrived;

static int
trigger_depth(void)
{
	return DatumGetInt32(DirectFunctionCall1(pg_trigger_depth, (Datum) 0));
}

/* The command whose rows are being written: see "Rows in flight". */
static CommandId
current_command(void)
{
	return ActiveSnapshotSet() ? GetActiveSnapshot()->curcid : InvalidCommandId;
}

static bool
note_is_current(const RowNote *note)
{
	return note->ncolumns > 0 && note->lxid == IDEM_MY_LXID &&
		note->cid == current_command() && note->cid != InvalidCommandId;
}

/* The entry of column in a note, for the caller to fill */
static NotedColumn *
note_add(RowNote *note, int depth, Oid relid, ItemPointer tid, const char *column)
{
	if (!note_is_current(note) || note->depth != depth || note->relid != relid ||
		(tid != NULL && !ItemPointerEquals(&note->tid, tid)))
	{
		note->lxid = IDEM_MY_LXID;
		note->cid = current_command();
		note->depth = depth;
		note->relid = relid;
		if (tid != NULL)
			note->tid = *tid;
		else
			ItemPointerSetInvalid(&note->tid);
		note->ncolumns = 0;
		if (note->cxt != NULL)
			MemoryContextReset(note->cxt);
	}
	for (int i = 0; i < note->ncolumns; i++)
		if (strcmp(NameStr(note->columns[i].column), column) == 0)
			return &note->columns[i];
	if (note->ncolumns >= MAX_NOTED_COLUMNS)
		return NULL;
	namestrcpy(&note->columns[note->ncolumns].column, column);
	return &note->columns[note->ncolumns++];
}

/* Remove column from the note into *taken; was it there? */
static bool
note_take(RowNote *note, const char *column, NotedColumn *taken)
{
	for (int i = 0; i < note->ncolumns; i++)
		if (strcmp(NameStr(note->columns[i].column), column) == 0)
		{
			if (taken != NULL)
				*taken = note->columns[i];
			note->columns[i] = note->columns[--note->ncolumns];
			return true;
		}
	return false;
}

static char *
note_strdup(const char *value)
{
	if (value == NULL)
		return NULL;
	if (arrived.cxt == NULL)
		arrived.cxt = AllocSetContextCreate(TopMemoryContext, "idempotency row notes",
											ALLOCSET_SMALL_SIZES);
	return MemoryContextStrdup(arrived.cxt, value);
}

/*
 * Has the old version the note "leaving" names moved to another partition,
 * by this command?  If so, *from is its state (NULL for NULL).  Only heap
 * partitions say so; a row leaving any other kind is checked as new.  The
 * note is of this command, which still holds its partition open and locked,
 * so the partition and the version's block exist.
 */
static bool
moved_from(TriggerState *state, const NotedColumn *noted, char **from)
{
	Relation	source = try_table_open(leaving.relid, AccessShareLock);
	HeapTupleData tuple;
	HeapTuple	copy = NULL;
	Buffer		buffer = InvalidBuffer;
	bool		isnull;

	if (source == NULL)
		return false;
	if (source->rd_rel->relam == HEAP_TABLE_AM_OID &&
		noted->attnum > 0 && noted->attnum <= RelationGetDescr(source)->natts &&
		TupleDescAttr(RelationGetDescr(source), noted->attnum - 1)->atttypid == state->typid)
	{
		tuple.t_self = leaving.tid;
		if (heap_fetch(source, SnapshotAny, &tuple, &buffer, true))
		{
			HeapTupleHeader header = tuple.t_data;

			LockBuffer(buffer, BUFFER_LOCK_SHARE);
			if (!(header->t_infomask & HEAP_XMAX_INVALID) &&
				!HEAP_XMAX_IS_LOCKED_ONLY(header->t_infomask) &&
				TransactionIdIsCurrentTransactionId(HeapTupleHeaderGetUpdateXid(header)) &&
				ItemPointerIndicatesMovedPartitions(&header->t_ctid) &&
				HeapTupleHeaderGetCmax(header) == leaving.cid)
				copy = heap_copytuple(&tuple);
			LockBuffer(buffer, BUFFER_LOCK_UNLOCK);
		}
		if (BufferIsValid(buffer))
			ReleaseBuffer(buffer);
	}
	if (copy != NULL)
		*from = column_state(state, copy, RelationGetDescr(source), noted->attnum, &isnull);
	table_close(source, AccessShareLock);
	return copy != NULL;
}

/*
 * BEFORE INSERT OR UPDATE ... FOR EACH ROW trigger,
 * idem_enforce_transition(machine, column).
 *
 * UPDATE: check_move, from the old row's state to the new row's.
 *
 * INSERT: the row that arrives in a partition by an UPDATE's row movement is
 * checked as the move it is (see "Rows in flight").  Any other row must start
 * in an initial state, but the trigger does not know whether it will be
 * inserted: INSERT ... ON CONFLICT fires it on the proposed row, before the
 * conflict check, and then a conflict turns the statement into an UPDATE of
 * the existing row (checked as such by this trigger) or into nothing.  So a
 * row that is not in an initial state passes here when the AFTER INSERT
 * trigger idem_enforce_initial_state will check it if it is really inserted;
 * without that trigger (attachments made by 0.1.0 and not updated), it is
 * refused here, as before.
 */
Datum
idem_enforce_transition(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	Trigger    *trigger;
	Relation	rel;
	TupleDesc	desc;
	TriggerState *state;
	const char *column;
	char	   *to;
	char	   *from;
	bool		isnull;

	if (!CALLED_AS_TRIGGER(fcinfo) || !TRIGGER_FIRED_BEFORE(trigdata->tg_event) ||
		!TRIGGER_FIRED_FOR_ROW(trigdata->tg_event) ||
		!(TRIGGER_FIRED_BY_INSERT(trigdata->tg_event) ||
		  TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event)))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("idem_enforce_transition must be fired BEFORE INSERT OR UPDATE FOR EACH ROW")));
	trigger = trigdata->tg_trigger;
	rel = trigdata->tg_relation;
	desc = RelationGetDescr(rel);
	state = trigger_state(fcinfo, trigdata, "idem_enforce_transition");
	column = trigger->tgargs[1];

	if (TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event))
	{
		from = state_value(state, trigdata->tg_trigtuple, desc, &isnull);
		to = state_value(state, trigdata->tg_newtuple, desc, &isnull);
		check_move(state->machine, RelationGetRelationName(rel), column, from, to);
		/* the row may be about to move to another partition */
		if (rel->rd_rel->relispartition)
		{
			NotedColumn *noted = note_add(&leaving, trigger_depth(), RelationGetRelid(rel),
										  &trigdata->tg_trigtuple->t_self, column);

			if (noted != NULL)
			{
				noted->attachment = state->attachment;
				noted->attnum = state->attnum;
			}
		}
		return PointerGetDatum(trigdata->tg_newtuple);
	}

	to = state_value(state, trigdata->tg_trigtuple, desc, &isnull);
	if (rel->rd_rel->relispartition && (note_is_current(&leaving) || note_is_current(&arrived)))
	{
		int			depth = trigger_depth();
		NotedColumn noted;

		/* a note of this trigger's column from an earlier row is void */
		if (arrived.depth == depth && arrived.relid == RelationGetRelid(rel))
			note_take(&arrived, column, NULL);
		if (note_is_current(&leaving) && leaving.depth == depth &&
			leaving.relid != RelationGetRelid(rel) &&
			note_take(&leaving, column, &noted) && noted.attachment == state->attachment)
		{
			from = NULL;
			if (moved_from(state, &noted, &from))
			{
				NotedColumn *checked;

				check_move(state->machine, RelationGetRelationName(rel), column, from, to);
				checked = note_add(&arrived, depth, RelationGetRelid(rel), NULL, column);
				if (checked != NULL)
				{
					checked->from = note_strdup(from);
					checked->to = note_strdup(to);
				}
				return PointerGetDatum(trigdata->tg_trigtuple);
			}
			leaving.ncolumns = 0;	/* an UPDATE that did not move its row */
		}
	}
	if (!initial_allowed(state->machine, to) && !state->checked_after)
		report_invalid_move(state->machine, RelationGetRelationName(rel), column, NULL, to);
	return PointerGetDatum(trigdata->tg_trigtuple);
}

/*
 * idem_inserted_unchecked(machine, column, relation, state): the WHEN clause
 * of the AFTER INSERT check, evaluated as each row is inserted (before the
 * next row's triggers fire).  For a row that arrived by row movement (the
 * BEFORE INSERT trigger checked the move, and left the note "arrived" at the
 * depth just below ours), false; but if "state", the state stored, is not
 * the state checked, the move from the same old state to it is checked here.
 * For any other row, true when "state" is not allowed for a new row.  So
 * the check's event is queued only for the rows it refuses.
 */
Datum
idem_inserted_unchecked(PG_FUNCTION_ARGS)
{
	typedef struct
	{
		uint64		generation;
		IdemMachine *machine;
		Size		namelen;
		char		name[NAMEDATALEN];	/* the machine name looked up */
	}			Cached;
	Cached	   *cached = (Cached *) fcinfo->flinfo->fn_extra;
	text	   *machine_name;
	char	   *state;
	NotedColumn checked;
	bool		moved;

	if (PG_ARGISNULL(0) || PG_ARGISNULL(1) || PG_ARGISNULL(2))
		PG_RETURN_BOOL(true);
	moved = note_is_current(&arrived) && arrived.relid == PG_GETARG_OID(2) &&
		arrived.depth == trigger_depth() + 1 &&
		note_take(&arrived, NameStr(*PG_GETARG_NAME(1)), &checked);
	state = PG_ARGISNULL(3) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(3));
	if (moved && (state == NULL ? checked.to == NULL :
				  checked.to != NULL && strcmp(state, checked.to) == 0))
		PG_RETURN_BOOL(false);

	/* the name is the same on every row: compare it rather than copy it */
	if (cached == NULL)
		cached = fcinfo->flinfo->fn_extra =
			MemoryContextAllocZero(fcinfo->flinfo->fn_mcxt, sizeof(Cached));
	machine_name = PG_GETARG_TEXT_PP(0);
	if (cached->generation != idem_machine_generation() ||
		cached->namelen != VARSIZE_ANY_EXHDR(machine_name) ||
		memcmp(cached->name, VARDATA_ANY(machine_name), cached->namelen) != 0)
	{
		char	   *name = text_to_cstring(machine_name);

		cached->machine = idem_machine_get(fcinfo->flinfo->fn_oid, name);
		cached->generation = idem_machine_generation();
		cached->namelen = Min(strlen(name), NAMEDATALEN - 1);
		memcpy(cached->name, name, cached->namelen);
		if (cached->machine == NULL || strlen(name) >= NAMEDATALEN)
			cached->generation = 0; /* look it up again next time */
	}
	if (cached->machine == NULL)
		PG_RETURN_BOOL(true);	/* the trigger reports it */
	if (moved)
	{

		check_move(cached->machine, get_rel_name(PG_GETARG_OID(2)), NameStr(*PG_GETARG_NAME(1)),
				   checked.from, state);
		PG_RETURN_BOOL(false);
	}
	PG_RETURN_BOOL(!initial_allowed(cached->machine, state));
}

/*
 * AFTER INSERT ... FOR EACH ROW trigger idem_enforce_initial_state(machine,
 * column), WHEN (idem_inserted_unchecked(...)): a row really inserted
 * (COPY, INSERT, the insert path of INSERT ... ON CONFLICT) must start in an
 * initial state.  It fires at the end of the statement, on the row as it was
 * stored.
 */
Datum
idem_enforce_initial_state(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	TriggerState *state;
	char	   *to;
	bool		isnull;

	if (!CALLED_AS_TRIGGER(fcinfo) || !TRIGGER_FIRED_AFTER(trigdata->tg_event) ||
		!TRIGGER_FIRED_FOR_ROW(trigdata->tg_event) ||
		!TRIGGER_FIRED_BY_INSERT(trigdata->tg_event))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("idem_enforce_initial_state must be fired AFTER INSERT FOR EACH ROW")));
	state = trigger_state(fcinfo, trigdata, "idem_enforce_initial_state");
	to = state_value(state, trigdata->tg_trigtuple, RelationGetDescr(trigdata->tg_relation),
					 &isnull);
	if (!initial_allowed(state->machine, to))
		report_invalid_move(state->machine, RelationGetRelationName(trigdata->tg_relation),
							trigdata->tg_trigger->tgargs[1], NULL, to);
	return PointerGetDatum(NULL);
}
