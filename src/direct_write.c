/*-------------------------------------------------------------------------
 *
 * direct_write.c
 *		INSERT ... ON CONFLICT (primary key) DO NOTHING into one of the
 *		extension's own tables, without SPI or the planner.
 *
 * The claim of a new key and the inbox's accept of a new message each
 * insert one row whose every value the C code already holds.  Through SPI
 * that row costs a plan-cache check, executor startup and shutdown of an
 * INSERT plan (ModifyTable over Result), a snapshot and portal; here it
 * costs what the executor's own ExecInsert does for such a plan, done the
 * way the logical replication apply worker does it (worker.c,
 * execReplication.c): a ResultRelInfo and an EState for the one row,
 * BEFORE ROW triggers, constraints, then the speculative insertion of
 * nodeModifyTable.c's ExecInsert with the primary key as the arbiter
 * index, index entries, AFTER ROW triggers queued between
 * AfterTriggerBeginQuery and AfterTriggerEndQuery and fired at the end of
 * the call as at the end of the SPI statement.  The heap and index access
 * methods write the same WAL and take the same locks (including SERIALIZABLE's
 * predicate locks), so replication and recovery see no difference.
 *
 * Concurrency is ExecInsert's: ExecCheckIndexConstraints waits for an
 * uncommitted inserter of the same key (so a claim still waits for a
 * concurrent claim's transaction), a committed row is the conflict that DO
 * NOTHING skips (under REPEATABLE READ and SERIALIZABLE a row the snapshot
 * does not see raises 40001, as ExecCheckTIDVisible does), and a race lost
 * between the check and the index insertion kills our speculative tuple and
 * checks again.  The claim, whose own read has just found no record, skips
 * the first check in READ COMMITTED when the primary key is the table's
 * only unique index: a new key then costs two probes of the primary key (the
 * claim's read and the index insertion), as many as the check and the
 * insertion of a plain INSERT ... ON CONFLICT (see insert_speculative and
 * has_other_unique_index).
 *
 * The fast path is taken only where it provably behaves as the SPI
 * statement would (and idempotency.direct_writes is on, the default); everywhere else the caller runs its SPI statement, so
 * every error (42501 for a missing privilege, row-level security, 25006 in
 * a read-only transaction) comes from the executor exactly as before:
 *
 *	 - the user holds INSERT and SELECT on the whole table (column privileges
 *	   alone, or none, go through SPI) and no ExecutorCheckPerms_hook is
 *	   installed (sepgsql and the like see every statement);
 *	 - row-level security does not apply to the user (check_enable_rls
 *	   answers RLS_NONE: tenant isolation keeps its SPI path);
 *	 - the transaction may write and is not in parallel mode;
 *	 - the table is a plain table without statement-level INSERT triggers or
 *	   transition tables (which only a statement fires) and without stored
 *	   generated columns.
 *
 * Columns the caller does not give get their defaults, evaluated as the
 * INSERT would (build_column_default: the column's DEFAULT or its type's).
 *
 * Locking: RowExclusiveLock on the table, as the INSERT takes; the caller
 * has usually taken it already for its read (see record_store.c, read_lock).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/nbtree.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/transam.h"
#include "access/xact.h"
#include "catalog/pg_trigger.h"
#include "commands/trigger.h"
#include "executor/executor.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "optimizer/optimizer.h"
#include "rewrite/rewriteHandler.h"
#include "storage/lmgr.h"
#include "utils/acl.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/rls.h"
#include "utils/snapmgr.h"

#include "direct_write.h"
#include "idempotency.h"
#include "pg_compat.h"
#include "record_store.h"

/*
 * May this user's INSERT ... ON CONFLICT DO NOTHING into relid skip the
 * executor's statement machinery?  The checks that need no lock.
 */
static bool
direct_insert_allowed(Oid relid)
{
	if (!idem_direct_writes || XactReadOnly || IsInParallelMode() ||
		ExecutorCheckPerms_hook != NULL)
		return false;
	if (pg_class_aclmask(relid, GetUserId(), ACL_INSERT | ACL_SELECT, ACLMASK_ALL) !=
		(ACL_INSERT | ACL_SELECT))
		return false;
	return check_enable_rls(relid, InvalidOid, true) == RLS_NONE;
}

/* The checks on the opened table. */
static bool
relation_allows_direct_insert(Relation rel)
{
	TriggerDesc *trigdesc = rel->trigdesc;
	TupleConstr *constr = RelationGetDescr(rel)->constr;

	if (rel->rd_rel->relkind != RELKIND_RELATION)
		return false;
	if (trigdesc != NULL &&
		(trigdesc->trig_insert_before_statement || trigdesc->trig_insert_after_statement ||
		 trigdesc->trig_insert_instead_row || trigdesc->trig_insert_new_table))
		return false;
	return !idem_has_generated(constr);
}

/*
 * A column the row does not give whose type is a domain: the INSERT would
 * check the domain's constraints on its default (or NULL), which
 * build_column_default alone does not.
 */
static bool
has_domain_column_not_given(TupleDesc desc, const bool *given)
{
	for (int i = 0; i < desc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);

		if (!given[i] && !att->attisdropped && get_typtype(att->atttypid) == TYPTYPE_DOMAIN)
			return true;
	}
	return false;
}

/*
 * The start of the one-row statement: a command and a snapshot of its own,
 * as SPI would run it, and the executor state with rel as its result
 * relation (its indexes opened, for speculative insertion if asked).
 * Returns in the executor state's memory, which the caller leaves.
 */
static EState *
direct_statement_begin(Relation rel, bool speculative, ResultRelInfo **rri)
{
	EState	   *estate;

	CommandCounterIncrement();
	PushActiveSnapshot(GetTransactionSnapshot());

	estate = CreateExecutorState();
	MemoryContextSwitchTo(estate->es_query_cxt);
	estate->es_snapshot = GetActiveSnapshot();
	estate->es_output_cid = GetCurrentCommandId(true);
	*rri = makeNode(ResultRelInfo);
	InitResultRelInfo(*rri, rel, 0, NULL, 0);
	estate->es_opened_result_relations = list_make1(*rri);
	ExecOpenIndices(*rri, speculative);
	return estate;
}

/* Its end: the executor state freed, the snapshot popped, rel closed. */
static void
direct_statement_end(EState *estate, Relation rel)
{
	ExecCloseResultRelations(estate);
	ExecResetTupleTable(estate->es_tupleTable, false);
	FreeExecutorState(estate);
	PopActiveSnapshot();
	table_close(rel, NoLock);
}

/*
 * A committed conflicting row must be visible to a transaction snapshot
 * (REPEATABLE READ, SERIALIZABLE), unless this transaction wrote it: as
 * ExecCheckTIDVisible in nodeModifyTable.c.
 */
static void
check_conflict_visible(EState *estate, ResultRelInfo *rri, ItemPointer tid)
{
	Relation	rel = rri->ri_RelationDesc;
	TupleTableSlot *slot;
	Datum		xmin;
	bool		isnull;

	if (!IsolationUsesXactSnapshot())
		return;
	slot = ExecGetReturningSlot(estate, rri);
	if (!table_tuple_fetch_row_version(rel, tid, SnapshotAny, slot))
		elog(ERROR, "failed to fetch conflicting tuple for ON CONFLICT");
	if (!table_tuple_satisfies_snapshot(rel, slot, estate->es_snapshot))
	{
		xmin = slot_getsysattr(slot, MinTransactionIdAttributeNumber, &isnull);
		Assert(!isnull);
		if (!TransactionIdIsCurrentTransactionId(DatumGetTransactionId(xmin)))
			ereport(ERROR,
					(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
					 errmsg("could not serialize access due to concurrent update")));
	}
	ExecClearTuple(slot);
}

/*
 * Has the table a unique or exclusion index besides the arbiter?  Such an
 * index is checked at insertion with UNIQUE_CHECK_YES, which waits for an
 * uncommitted duplicate and then raises 23505 instead of letting DO NOTHING
 * skip the row; only the check before the insertion waits without raising.
 * The copy of the primary key that REINDEX CONCURRENTLY builds is one.
 */
static bool
has_other_unique_index(ResultRelInfo *rri)
{
	Oid			arbiter = linitial_oid(rri->ri_onConflictArbiterIndexes);

	for (int i = 0; i < rri->ri_NumIndices; i++)
	{
		IndexInfo  *info = rri->ri_IndexRelationInfo[i];

		if ((info->ii_Unique || info->ii_ExclusionOps != NULL) &&
			RelationGetRelid(rri->ri_IndexRelationDescs[i]) != arbiter)
			return true;
	}
	return false;
}

/*
 * ExecInsert's speculative insertion, for a slot the BEFORE ROW triggers
 * have passed.  Returns false on a committed conflict (nothing inserted).
 *
 * check_first false skips the check before the first attempt: the caller's
 * snapshot has just seen no row with the key.  That check only spares the
 * heap insertion of a row that would conflict; the index insertion's own
 * unique check still finds any conflict (then the tuple is killed and the
 * retry checks first, waiting for an uncommitted inserter as ExecInsert
 * does), so skipping it is one index probe less for a new key.
 */
static bool
insert_speculative(EState *estate, ResultRelInfo *rri, TupleTableSlot *slot,
				   bool check_first)
{
	Relation	rel = rri->ri_RelationDesc;
	List	   *arbiters = rri->ri_onConflictArbiterIndexes;
	List	   *recheck;
	ItemPointerData conflict_tid;
	ItemPointerData no_tid;
	bool		spec_conflict;
	uint32		spec_token;

	ItemPointerSetInvalid(&no_tid);

	for (;;)
	{
		CHECK_FOR_INTERRUPTS();
		spec_conflict = false;
		/* waits for an uncommitted inserter of the key */
		if (check_first &&
			!idem_check_index_constraints(rri, slot, estate, &conflict_tid, &no_tid,
										  arbiters))
		{
			check_conflict_visible(estate, rri, &conflict_tid);
			return false;
		}
		check_first = true;

		spec_token = SpeculativeInsertionLockAcquire(GetCurrentTransactionId());
		table_tuple_insert_speculative(rel, slot, estate->es_output_cid, 0, NULL,
									   spec_token);
		recheck = idem_insert_index_tuples(rri, slot, estate, true, &spec_conflict,
										   arbiters);
		table_tuple_complete_speculative(rel, slot, spec_token, !spec_conflict);
		SpeculativeInsertionLockRelease(GetCurrentTransactionId());
		if (!spec_conflict)
			break;
		/* lost a race after the check: look again, now finding the row */
		list_free(recheck);
	}

	ExecARInsertTriggers(estate, rri, slot, recheck, NULL);
	list_free(recheck);
	return true;
}

/*
 * Insert one row into relid unless its primary key exists.  fill sets the
 * values of the columns it knows in values/nulls (indexed by attribute
 * number - 1) and marks them in given; the others get their defaults.  fill
 * returns false when the table lacks a column it needs: then nothing is
 * written and the answer is IDEM_DIRECT_REFUSED.  seen_absent: the caller's
 * snapshot has just found no row with the key (see insert_speculative).
 */
IdemDirectResult
idem_direct_insert(Oid relid, IdemFillRow fill, void *arg, bool seen_absent)
{
	Relation	rel;
	TupleDesc	desc;
	EState	   *estate;
	ResultRelInfo *rri;
	TupleTableSlot *slot;
	MemoryContext old;
	bool	   *given;
	bool		inserted = false;

	if (!direct_insert_allowed(relid))
		return IDEM_DIRECT_REFUSED;
	rel = table_open(relid, RowExclusiveLock);
	if (!relation_allows_direct_insert(rel))
	{
		table_close(rel, NoLock);
		return IDEM_DIRECT_REFUSED;
	}
	desc = RelationGetDescr(rel);
	CheckCmdReplicaIdentity(rel, CMD_INSERT);

	old = CurrentMemoryContext;
	estate = direct_statement_begin(rel, true, &rri);
	rri->ri_onConflictArbiterIndexes = list_make1_oid(idem_primary_key(rel));

	slot = table_slot_create(rel, &estate->es_tupleTable);
	ExecClearTuple(slot);
	given = palloc0(sizeof(bool) * desc->natts);
	for (int i = 0; i < desc->natts; i++)
	{
		slot->tts_values[i] = (Datum) 0;
		slot->tts_isnull[i] = true;
	}
	MemoryContextSwitchTo(old);
	if (!fill(desc, slot->tts_values, slot->tts_isnull, given, arg) ||
		has_domain_column_not_given(desc, given))
	{
		/*
		 * not the columns or types the caller knows (an administrator
		 * changed the table): let the statement decide, with its casts
		 */
		direct_statement_end(estate, rel);
		return IDEM_DIRECT_REFUSED;
	}
	old = MemoryContextSwitchTo(GetPerTupleMemoryContext(estate));
	for (int i = 0; i < desc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);
		Expr	   *defexpr;

		if (given[i] || att->attisdropped)
			continue;

		/*
		 * Without a DEFAULT of its own or an identity, a column of a built-in
		 * type is NULL: no built-in base type has a default (only domains
		 * do, and a domain column not given was refused above), so the
		 * catalog look-up of build_column_default is spared.
		 */
		if (!att->atthasdef && !att->attidentity && att->atttypid < FirstNormalObjectId)
			continue;
		defexpr = (Expr *) build_column_default(rel, i + 1);
		if (defexpr != NULL)
			slot->tts_values[i] = ExecEvalExpr(ExecPrepareExpr(defexpr, estate),
											   GetPerTupleExprContext(estate),
											   &slot->tts_isnull[i]);
	}
	MemoryContextSwitchTo(old);
	ExecStoreVirtualTuple(slot);
	slot->tts_tableOid = relid;

	AfterTriggerBeginQuery();
	if (rri->ri_TrigDesc == NULL || !rri->ri_TrigDesc->trig_insert_before_row ||
		ExecBRInsertTriggers(estate, rri, slot))
	{
		if (desc->constr != NULL)
			ExecConstraints(rri, slot, estate);
		/*
		 * Under REPEATABLE READ and SERIALIZABLE the check comes first all
		 * the same: a row committed after the snapshot then raises the 40001
		 * of ExecCheckTIDVisible, before anything is written, as the INSERT
		 * does (the index insertion would raise SERIALIZABLE's own 40001).
		 */
		inserted = insert_speculative(estate, rri, slot,
									  !seen_absent || IsolationUsesXactSnapshot() ||
									  has_other_unique_index(rri));
	}
	AfterTriggerEndQuery(estate);

	direct_statement_end(estate, rel);
	/* later statements of this call see the row, as after SPI's statement */
	CommandCounterIncrement();
	return inserted ? IDEM_DIRECT_WRITTEN : IDEM_DIRECT_NOT_WRITTEN;
}

/*
 * UPDATE ... WHERE primary key = (key1, key2) AND <quals>, as the executor
 * runs it for one row, through ExecSimpleRelationUpdate.
 *
 * The row is found by an index scan of the primary key in a fresh snapshot
 * (after CommandCounterIncrement, as SPI's statement), then locked
 * (FOR NO KEY UPDATE strength, as the UPDATE itself would lock it; the
 * records' BEFORE UPDATE trigger makes the executor take this very lock,
 * so the WAL is the same).  Under READ COMMITTED the lock follows the
 * update chain to the newest version, and the quals are checked again on
 * it, as EvalPlanQual would; under REPEATABLE READ and SERIALIZABLE a row
 * changed since the snapshot raises 40001, as ExecUpdate does.
 *
 * update sees the locked row's values (deformed) and either returns false
 * (the quals fail: nothing is updated) or changes them in place.  cols lists
 * the attribute numbers it may change: a trigger for UPDATE OF one of them
 * needs the executor's updated-columns set, so such a table goes through
 * SPI (IDEM_DIRECT_REFUSED), as does every caller that direct_insert_allowed
 * would refuse, here for UPDATE and SELECT.
 */
static bool
relation_allows_direct_update(Relation rel, const AttrNumber *cols, int ncols)
{
	TriggerDesc *trigdesc = rel->trigdesc;
	TupleConstr *constr = RelationGetDescr(rel)->constr;

	if (rel->rd_rel->relkind != RELKIND_RELATION)
		return false;
	if (idem_has_generated(constr))
		return false;
	if (trigdesc == NULL)
		return true;
	if (trigdesc->trig_update_before_statement || trigdesc->trig_update_after_statement ||
		trigdesc->trig_update_instead_row || trigdesc->trig_update_new_table ||
		trigdesc->trig_update_old_table)
		return false;
	for (int i = 0; i < trigdesc->numtriggers; i++)
	{
		Trigger    *trigger = &trigdesc->triggers[i];

		if (!TRIGGER_FOR_UPDATE(trigger->tgtype))
			continue;
		for (int a = 0; a < trigger->tgnattr; a++)
			for (int c = 0; c < ncols; c++)
				if (trigger->tgattr[a] == cols[c])
					return false;
	}
	return true;
}

/* newslot's values from oldslot's, changed by update; false: the quals fail */
static bool
apply_update(TupleDesc desc, TupleTableSlot *oldslot, TupleTableSlot *newslot,
			 EState *estate, IdemUpdateRow update, void *arg)
{
	MemoryContext old;
	bool		matched;

	slot_getallattrs(oldslot);
	ExecClearTuple(newslot);
	memcpy(newslot->tts_values, oldslot->tts_values, sizeof(Datum) * desc->natts);
	memcpy(newslot->tts_isnull, oldslot->tts_isnull, sizeof(bool) * desc->natts);
	old = MemoryContextSwitchTo(GetPerTupleMemoryContext(estate));
	matched = update(desc, newslot->tts_values, newslot->tts_isnull, arg);
	MemoryContextSwitchTo(old);
	return matched;
}

IdemDirectResult
idem_direct_update(Oid relid, Datum key1, Datum key2, const AttrNumber *cols, int ncols,
				   IdemCheckRowType check, IdemUpdateRow update, void *arg)
{
	Relation	rel;
	Relation	index;
	TupleDesc	desc;
	EState	   *estate;
	EPQState	epqstate;
	ResultRelInfo *rri;
	TupleTableSlot *oldslot;
	TupleTableSlot *newslot;
	ScanKeyData skey[2];
	IndexScanDesc scan;
	TM_FailureData tmfd;
	TM_Result	res;
	MemoryContext old;
	bool		found;
	bool		updated = false;

	if (!idem_direct_writes || XactReadOnly || IsInParallelMode() ||
		ExecutorCheckPerms_hook != NULL)
		return IDEM_DIRECT_REFUSED;
	if (pg_class_aclmask(relid, GetUserId(), ACL_UPDATE | ACL_SELECT, ACLMASK_ALL) !=
		(ACL_UPDATE | ACL_SELECT) ||
		check_enable_rls(relid, InvalidOid, true) != RLS_NONE)
		return IDEM_DIRECT_REFUSED;
	rel = table_open(relid, RowExclusiveLock);
	if (!relation_allows_direct_update(rel, cols, ncols) ||
		(check != NULL && !check(RelationGetDescr(rel))))
	{
		table_close(rel, NoLock);
		return IDEM_DIRECT_REFUSED;
	}
	desc = RelationGetDescr(rel);
	CheckCmdReplicaIdentity(rel, CMD_UPDATE);

	old = CurrentMemoryContext;
	estate = direct_statement_begin(rel, false, &rri);
	idem_epq_init(&epqstate, estate);
	oldslot = table_slot_create(rel, &estate->es_tupleTable);
	newslot = table_slot_create(rel, &estate->es_tupleTable);
	MemoryContextSwitchTo(old);

	index = index_open(idem_primary_key(rel), AccessShareLock);
	ScanKeyInit(&skey[0], 1, BTEqualStrategyNumber, F_TEXTEQ, key1);
	ScanKeyInit(&skey[1], 2, BTEqualStrategyNumber, F_TEXTEQ, key2);
	scan = idem_index_beginscan(rel, index, estate->es_snapshot, 2, 0);
	index_rescan(scan, skey, 2, NULL, 0);
	found = index_getnext_slot(scan, ForwardScanDirection, oldslot);
	index_endscan(scan);
	index_close(index, NoLock);

	/*
	 * The quals on the version the snapshot sees first, as the scan's quals
	 * are: a row that does not match is not locked (nor waited for).
	 */
	if (found)
		found = apply_update(desc, oldslot, newslot, estate, update, arg);
	if (found)
	{
		res = table_tuple_lock(rel, &oldslot->tts_tid, estate->es_snapshot, oldslot,
							   estate->es_output_cid, LockTupleNoKeyExclusive,
							   LockWaitBlock,
							   IsolationUsesXactSnapshot() ? 0 :
							   TUPLE_LOCK_FLAG_FIND_LAST_VERSION,
							   &tmfd);
		switch (res)
		{
			case TM_Ok:
				break;
			case TM_SelfModified:
				/* as ExecUpdate: changed by a later command of ours (a trigger) */
				if (tmfd.cmax != estate->es_output_cid)
					ereport(ERROR,
							(errcode(ERRCODE_TRIGGERED_DATA_CHANGE_VIOLATION),
							 errmsg("tuple to be updated was already modified by an operation triggered by the current command"),
							 errhint("Consider using an AFTER trigger instead of a BEFORE trigger to propagate changes to other rows.")));
				found = false;
				break;
			case TM_Updated:
				if (IsolationUsesXactSnapshot())
					ereport(ERROR,
							(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
							 errmsg("could not serialize access due to concurrent update")));
				elog(ERROR, "unexpected table_tuple_lock status: %u", res);
				break;
			case TM_Deleted:
				if (IsolationUsesXactSnapshot())
					ereport(ERROR,
							(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
							 errmsg("could not serialize access due to concurrent delete")));
				found = false;	/* deleted meanwhile: the UPDATE matches nothing */
				break;
			default:
				elog(ERROR, "unexpected table_tuple_lock status: %u", res);
		}
	}

	/*
	 * The locked version is the newest (READ COMMITTED follows the update
	 * chain): the quals again on it, as EvalPlanQual would, and the new row
	 * from it.
	 */
	if (found)
		updated = apply_update(desc, oldslot, newslot, estate, update, arg);
	if (updated)
	{
		ExecStoreVirtualTuple(newslot);
		AfterTriggerBeginQuery();
		ExecSimpleRelationUpdate(rri, estate, &epqstate, oldslot, newslot);
		AfterTriggerEndQuery(estate);
		/* the update gives newslot the new version's TID; a trigger's skip does not */
		updated = ItemPointerIsValid(&newslot->tts_tid) &&
			!ItemPointerEquals(&newslot->tts_tid, &oldslot->tts_tid);
	}

	EvalPlanQualEnd(&epqstate);
	direct_statement_end(estate, rel);
	CommandCounterIncrement();
	return updated ? IDEM_DIRECT_WRITTEN : IDEM_DIRECT_NOT_WRITTEN;
}
