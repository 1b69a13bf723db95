/*-------------------------------------------------------------------------
 *
 * machine.c
 *		State machine definitions: a per-backend cache, and the trigger
 *		idem_enforce_transition that refuses moves a machine does not contain.
 *
 * Definitions live in idem_machines and idem_machine_moves.  Each backend
 * compiles a machine on first use into a sorted array of states and a move
 * matrix, so the trigger costs a hash lookup and a binary search per row and
 * reads no table in the steady state.
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
#include "access/htup_details.h"
#include "access/nbtree.h"
#include "access/table.h"
#include "access/xact.h"
#include "commands/trigger.h"
#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"
#include "parser/parse_coerce.h"
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

#include "idempotency.h"

PG_FUNCTION_INFO_V1(idem_machines_changed);
PG_FUNCTION_INFO_V1(idem_enforce_transition);
PG_FUNCTION_INFO_V1(idem_trigger_arg);

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
char *
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
 * What the trigger keeps per trigger, for the life of the backend: which
 * column, how to read it as text, and the compiled machine.  A relcache
 * invalidation of the table (ALTER TABLE, a renamed column) marks it stale;
 * a change of the machine shows in idem_machine_generation().  fn_extra
 * points at the entry, so the rows of a statement skip even the lookup.
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
	CoercionPathType to_text;	/* RELABELTYPE: the value is text already */
	FmgrInfo	cast;			/* FUNC: the cast function; COERCEVIAIO: output */
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
state_value(TriggerState *state, HeapTuple tuple, TupleDesc desc, bool *isnull)
{
	Datum		value = heap_getattr(tuple, state->attnum, desc, isnull);

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

	if (statement != last_statement || MyProc->lxid != last_xact)
	{
		AcceptInvalidationMessages();
		last_statement = statement;
		last_xact = MyProc->lxid;
	}
}

static void
report_invalid_move(TriggerState *state, Relation rel, const char *column,
					const char *from, const char *to)
{
	IdemMachine *machine = state->machine;
	int			f = from ? idem_machine_state_index(machine, from) : -1;
	int			t = to ? idem_machine_state_index(machine, to) : -1;
	char	   *moves;

	if (to == NULL && from == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_INVALID_TRANSITION),
				 errmsg("invalid initial state NULL in column \"%s\" of table \"%s\"",
						column, RelationGetRelationName(rel)),
				 errdetail("NULL is not a state of state machine \"%s\".", machine->name)));
	if (to == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_INVALID_TRANSITION),
				 errmsg("invalid transition from \"%s\" to NULL in column \"%s\" of table \"%s\"",
						from, column, RelationGetRelationName(rel)),
				 errdetail("NULL is not a state of state machine \"%s\".", machine->name)));
	if (t < 0 && from == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_INVALID_TRANSITION),
				 errmsg("invalid initial state \"%s\" in column \"%s\" of table \"%s\"",
						to, column, RelationGetRelationName(rel)),
				 errdetail("\"%s\" is not a state of state machine \"%s\".", to, machine->name)));
	if (t < 0)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_INVALID_TRANSITION),
				 errmsg("invalid transition from \"%s\" to \"%s\" in column \"%s\" of table \"%s\"",
						from, to, column, RelationGetRelationName(rel)),
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
						to, column, RelationGetRelationName(rel)),
				 errdetail("State machine \"%s\" starts in %s only.", machine->name, initial.data)));
	}
	if (f < 0)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_INVALID_TRANSITION),
				 errmsg("invalid transition from \"%s\" to \"%s\" in column \"%s\" of table \"%s\"",
						from, to, column, RelationGetRelationName(rel)),
				 errdetail("\"%s\" is not a state of state machine \"%s\".", from, machine->name)));

	moves = idem_machine_moves_from(machine, f);
	ereport(ERROR,
			(errcode(ERRCODE_IDEM_INVALID_TRANSITION),
			 errmsg("invalid transition from \"%s\" to \"%s\" in column \"%s\" of table \"%s\"",
					from, to, column, RelationGetRelationName(rel)),
			 moves[0] ?
			 errdetail("State machine \"%s\" allows from \"%s\" only: %s.", machine->name, from, moves) :
			 errdetail("\"%s\" is a terminal state of state machine \"%s\".", from, machine->name)));
}

/*
 * BEFORE INSERT OR UPDATE ... FOR EACH ROW trigger,
 * idem_enforce_transition(machine, column).
 *
 * INSERT, or UPDATE from NULL: the value must be an initial state (any state
 * when the machine declares none).  UPDATE: staying in the same value is
 * always allowed (the idempotent no-op); any other change must be a move of
 * the machine.  NULL is not a state: no row may move to NULL.
 */
Datum
idem_enforce_transition(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	Trigger    *trigger;
	Relation	rel;
	TupleDesc	desc;
	TriggerState *state;
	HeapTuple	result;
	char	   *to;
	char	   *from = NULL;
	bool		to_null;
	bool		from_null = true;
	int			f;
	int			t;

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
	if (trigger->tgnargs != 2)
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("trigger \"%s\" of table \"%s\" must pass idem_enforce_transition a machine and a column",
						trigger->tgname, RelationGetRelationName(rel))));

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
		prepare_text_cast(state, TupleDescAttr(desc, state->attnum - 1)->atttypid,
						  CacheMemoryContext);
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

	if (TRIGGER_FIRED_BY_INSERT(trigdata->tg_event))
		result = trigdata->tg_trigtuple;
	else
	{
		result = trigdata->tg_newtuple;
		from = state_value(state, trigdata->tg_trigtuple, desc, &from_null);
	}
	to = state_value(state, result, desc, &to_null);

	if (from_null && to_null && TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event))
		return PointerGetDatum(result);
	if (to_null)
		report_invalid_move(state, rel, trigger->tgargs[1], from, NULL);
	if (!from_null && strcmp(from, to) == 0)
		return PointerGetDatum(result); /* the idempotent no-op */

	t = idem_machine_state_index(state->machine, to);
	if (t < 0)
		report_invalid_move(state, rel, trigger->tgargs[1], from, to);
	if (from_null)
	{
		if (state->machine->has_initial && !state->machine->initial[t])
			report_invalid_move(state, rel, trigger->tgargs[1], NULL, to);
		return PointerGetDatum(result);
	}
	f = idem_machine_state_index(state->machine, from);
	if (f < 0 || !state->machine->moves[f * state->machine->nstates + t])
		report_invalid_move(state, rel, trigger->tgargs[1], from, to);
	return PointerGetDatum(result);
}
