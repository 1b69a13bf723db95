/*-------------------------------------------------------------------------
 *
 * removal.c
 *		Keep fencing tokens from repeating, whatever removes a record.
 *
 * The first token of a new record is epoch * 2^32 + 1, the epoch being the
 * last value of the sequence idem_token_epoch (idem_store_first_token).  A
 * key claimed again after its record went must get tokens above every token
 * issued for it before, so every removal of a record whose token belongs to
 * the current epoch must advance the epoch before the removal commits.
 * idem_purge does so in its statement; the two triggers of this file do it
 * for everything else:
 *
 *	 - idem_records_removed, AFTER DELETE FOR EACH ROW: when the old row's
 *	   token is of the current epoch (or later), nextval.  A row of an older
 *	   epoch needs nothing: the next claim's tokens are above it already.  So
 *	   a statement spends at most one epoch however many rows it deletes, and
 *	   a purge (which advanced the epoch first) spends none here.  The reuse
 *	   of a record by idem_claim (a DELETE and INSERT of the key in one
 *	   statement, the token growing by one) is no removal: claim.c announces
 *	   it with idem_removal_reuse_begin/end and the trigger lets that key be.
 *	 - idem_records_truncated, AFTER TRUNCATE FOR EACH STATEMENT: nextval.
 *
 * The sequence is advanced without checking the deleting role's privileges
 * on it (nextval_internal): the advance is part of the deletion, which the
 * role is allowed, not a right of its own, so the client kind keeps only
 * SELECT on the sequence, and nothing is SECURITY DEFINER.  Nobody can call
 * the functions (no EXECUTE for PUBLIC; a trigger's firing checks none),
 * and they refuse to run on any table but the records.
 *
 * The sequence is not transactional: a deletion rolled back has spent an
 * epoch and changed nothing else.  Concurrent claims are safe because the
 * advance happens before the deleting transaction commits: a claim that
 * finds the key absent has read the new epoch, and a claim whose INSERT
 * waited for the deleter reads the epoch again after it (STMT_RETOKEN).  The
 * epoch is read without a lock; it only grows, except by a DBA's setval,
 * which is why it is never cached beyond one statement.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "catalog/pg_collation.h"
#include "commands/sequence.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "storage/proc.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"

#include "idempotency.h"

PG_FUNCTION_INFO_V1(idem_records_removed);
PG_FUNCTION_INFO_V1(idem_records_truncated);

/* The key idem_claim is reusing, in the transaction that announced it. */
static text *reuse_scope;
static text *reuse_key;
static LocalTransactionId reuse_lxid = InvalidLocalTransactionId;

/* The epoch read last, valid in the one statement that read it. */
static int64 known_epoch;
static LocalTransactionId known_lxid = InvalidLocalTransactionId;
static CommandId known_cid;

void
idem_removal_reuse_begin(text *scope, text *key)
{
	reuse_scope = scope;
	reuse_key = key;
	reuse_lxid = MyProc->lxid;
}

void
idem_removal_reuse_end(void)
{
	reuse_lxid = InvalidLocalTransactionId;
	reuse_scope = reuse_key = NULL;
}

static int64
epoch_now(Oid sequence)
{
	LOCAL_FCINFO(fcinfo, 1);
	Datum		last;

	InitFunctionCallInfoData(*fcinfo, NULL, 1, InvalidOid, NULL, NULL);
	fcinfo->args[0].value = ObjectIdGetDatum(sequence);
	fcinfo->args[0].isnull = false;
	last = pg_sequence_last_value(fcinfo);
	return fcinfo->isnull ? 0 : DatumGetInt64(last);
}

static void
check_trigger(FunctionCallInfo fcinfo, const char *name, bool row, const IdemObjects **objects)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;

	if (!CALLED_AS_TRIGGER(fcinfo) || !TRIGGER_FIRED_AFTER(trigdata->tg_event) ||
		(row ? !TRIGGER_FIRED_FOR_ROW(trigdata->tg_event) ||
		 !TRIGGER_FIRED_BY_DELETE(trigdata->tg_event)
		 : !TRIGGER_FIRED_FOR_STATEMENT(trigdata->tg_event) ||
		 !TRIGGER_FIRED_BY_TRUNCATE(trigdata->tg_event)))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("%s() must be called as an AFTER %s trigger", name,
						row ? "DELETE FOR EACH ROW" : "TRUNCATE")));
	*objects = idem_objects(fcinfo->flinfo->fn_oid);
	if (RelationGetRelid(trigdata->tg_relation) != (*objects)->records)
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("%s() may only be a trigger of table idempotency_records", name),
				 errdetail("It fired on table \"%s\".",
						   RelationGetRelationName(trigdata->tg_relation))));
}

static bool
same_text(Datum value, text *expected)
{
	return DatumGetBool(DirectFunctionCall2Coll(texteq, C_COLLATION_OID, value,
												PointerGetDatum(expected)));
}

Datum
idem_records_removed(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	const IdemObjects *objects;
	TupleDesc	tupdesc;
	HeapTuple	old;
	Datum		token;
	bool		isnull;
	int64		epoch;

	check_trigger(fcinfo, "idem_records_removed", true, &objects);
	tupdesc = RelationGetDescr(trigdata->tg_relation);
	old = trigdata->tg_trigtuple;

	/* columns by name: ALTER TABLE ADD COLUMN must not move them */
	token = heap_getattr(old, SPI_fnumber(tupdesc, "token"), tupdesc, &isnull);
	if (isnull)
		PG_RETURN_POINTER(NULL);	/* NOT NULL: only a hand-made table */
	epoch = DatumGetInt64(token) >> 32;

	if (reuse_lxid == MyProc->lxid && reuse_key != NULL)
	{
		Datum		scope = heap_getattr(old, SPI_fnumber(tupdesc, "scope"), tupdesc, &isnull);
		Datum		key = heap_getattr(old, SPI_fnumber(tupdesc, "key"), tupdesc, &isnull);

		if (same_text(scope, reuse_scope) && same_text(key, reuse_key))
			PG_RETURN_POINTER(NULL);	/* idem_claim puts it back, token + 1 */
	}

	if (known_lxid != MyProc->lxid || known_cid != GetCurrentCommandId(false) ||
		epoch >= known_epoch)
	{
		known_epoch = epoch_now(objects->token_epoch);
		known_lxid = MyProc->lxid;
		known_cid = GetCurrentCommandId(false);
	}
	if (epoch >= known_epoch)
		known_epoch = nextval_internal(objects->token_epoch, false);

	PG_RETURN_POINTER(NULL);
}

Datum
idem_records_truncated(PG_FUNCTION_ARGS)
{
	const IdemObjects *objects;

	check_trigger(fcinfo, "idem_records_truncated", false, &objects);
	(void) nextval_internal(objects->token_epoch, false);
	PG_RETURN_POINTER(NULL);
}
