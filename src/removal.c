/*-------------------------------------------------------------------------
 *
 * removal.c
 *		Keep fencing tokens from repeating, whatever removes a record.
 *
 * The first token of a new record is epoch * 2^shift + 1, the epoch being
 * the last value of the sequence idem_token_epoch (tokens.c).  A
 * key claimed again after its record went must get tokens above every token
 * issued for it before, so every removal of a record whose token belongs to
 * the current epoch must advance the epoch before the removal commits.
 * idem_purge does so in its statement; the triggers of this file do it for
 * everything else, and refuse the one removal that cannot be fenced:
 *
 *	 - idem_records_removed, BEFORE DELETE FOR EACH ROW: when the old row's
 *	   token is of the current epoch (or later), nextval.  A row of an older
 *	   epoch needs nothing: the next claim's tokens are above it already.  So
 *	   a statement spends at most one epoch however many rows it deletes, and
 *	   a purge (which advanced the epoch first) spends none here.  BEFORE,
 *	   not AFTER: an AFTER row trigger queues an event per row and fetches
 *	   the row again at the end of the statement, memory and time that grow
 *	   with a bulk DELETE or a purge.  A row whose deletion then does not
 *	   happen (another trigger skips it, the statement fails) has spent an
 *	   epoch for nothing, as a rolled-back deletion does.
 *	 - idem_records_truncated, AFTER TRUNCATE FOR EACH STATEMENT: nextval.
 *	 - idem_records_rekeyed, BEFORE UPDATE OF scope, key FOR EACH ROW:
 *	   refuses an UPDATE that changes either.  Moving a record to another
 *	   key removes the old key (whose next claim would repeat its token) and
 *	   gives the new key a token that may be below one issued for it before;
 *	   the extension itself never does it.
 *
 * All three are ENABLE ALWAYS: a session with session_replication_role =
 * replica (the logical replication apply worker, some restore tools)
 * removes records as surely as any other.
 *
 * The reuse of a record by idem_claim (a DELETE and INSERT of the key in one
 * statement, the token growing by one) is no removal: claim.c announces it
 * with idem_removal_reuse_begin/end around the statement, naming the key and
 * the token of the row it deletes.  The trigger lets exactly that row be,
 * once, in the transaction that announced it; end runs however the
 * statement ends (PG_FINALLY), so an error caught by a savepoint leaves
 * nothing armed for a later DELETE of the key, and the announcement never
 * outlives the claim's memory it points into.
 *
 * The epoch is read and advanced without checking the deleting role's
 * privileges on the sequence (nextval_internal, and pg_sequence_last_value
 * as the sequence's owner): the advance is part of the deletion, which the
 * role is allowed, not a right of its own, so a role may delete records
 * with DELETE on the table and nothing on the sequence, and nothing is
 * SECURITY DEFINER.  A claim, which hands the epoch out, reads it with the
 * claimant's privileges.  Nobody can call the functions (no EXECUTE for
 * PUBLIC; a trigger's firing checks none), and they refuse to run on any
 * table but the records.  The columns are found by name, so that ALTER TABLE
 * ADD COLUMN does not move them; a renamed one is reported as missing.
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
#include "catalog/pg_class.h"
#include "catalog/pg_collation.h"
#include "catalog/pg_type.h"
#include "commands/sequence.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "storage/proc.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/syscache.h"

#include "extension_objects.h"
#include "pg_compat.h"
#include "removal.h"
#include "tokens.h"

PG_FUNCTION_INFO_V1(idem_records_removed);
PG_FUNCTION_INFO_V1(idem_records_truncated);
PG_FUNCTION_INFO_V1(idem_records_rekeyed);

/* The row idem_claim is reusing, while its statement runs. */
static IdemRemovalReuse reuse;

/* The epoch read last, valid in the one statement that read it. */
static int64 known_epoch;
static LocalTransactionId known_lxid = InvalidLocalTransactionId;
static CommandId known_cid;

void
idem_removal_reuse_begin(IdemRemovalReuse *saved, text *scope, text *key, int64 token)
{
	*saved = reuse;
	reuse.scope = scope;
	reuse.key = key;
	reuse.token = token;
	reuse.lxid = IDEM_MY_LXID;
}

void
idem_removal_reuse_end(const IdemRemovalReuse *saved)
{
	reuse = *saved;
}

/*
 * Refuse a call that is not the trigger "expected" on the records: fired as
 * described (ok) and on table idempotency_records.
 */
static const IdemObjects *
check_trigger(FunctionCallInfo fcinfo, const char *name, const char *expected, bool ok)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	const IdemObjects *objects;

	if (!CALLED_AS_TRIGGER(fcinfo) || !ok)
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("%s() must be called as %s trigger", name, expected)));
	objects = idem_objects(fcinfo->flinfo->fn_oid);
	if (RelationGetRelid(trigdata->tg_relation) != objects->records)
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("%s() may only be a trigger of table idempotency_records", name),
				 errdetail("It fired on table \"%s\".",
						   RelationGetRelationName(trigdata->tg_relation))));
	return objects;
}

#define FIRED_AS(trigdata, when, level, event) \
	(TRIGGER_FIRED_##when((trigdata)->tg_event) && \
	 TRIGGER_FIRED_FOR_##level((trigdata)->tg_event) && \
	 TRIGGER_FIRED_BY_##event((trigdata)->tg_event))

/* Column "name" of the records, of type "type": by name, never by position. */
static Datum
record_column(TriggerData *trigdata, HeapTuple tuple, const char *name, Oid type,
			  bool *isnull)
{
	TupleDesc	tupdesc = RelationGetDescr(trigdata->tg_relation);
	int			attnum = SPI_fnumber(tupdesc, name);

	if (attnum <= 0 || TupleDescAttr(tupdesc, attnum - 1)->atttypid != type)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("table \"idempotency_records\" has no column \"%s\" of type %s",
						name, format_type_be(type)),
				 errdetail("The triggers that keep fencing tokens from repeating read it by name."),
				 errhint("Give the column back its name and type.")));
	return heap_getattr(tuple, attnum, tupdesc, isnull);
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
	HeapTuple	old;
	Datum		token;
	bool		isnull;
	int64		epoch;

	objects = check_trigger(fcinfo, "idem_records_removed", "a BEFORE DELETE FOR EACH ROW",
							CALLED_AS_TRIGGER(fcinfo) &&
							FIRED_AS(trigdata, BEFORE, ROW, DELETE));
	old = trigdata->tg_trigtuple;

	token = record_column(trigdata, old, "token", INT8OID, &isnull);
	if (isnull)
		return PointerGetDatum(old);	/* NOT NULL: only a hand-made table */
	epoch = idem_token_epoch_of(objects, DatumGetInt64(token));

	if (reuse.scope != NULL && reuse.lxid == IDEM_MY_LXID &&
		reuse.token == DatumGetInt64(token))
	{
		bool		scope_null;
		bool		key_null;
		Datum		scope = record_column(trigdata, old, "scope", TEXTOID, &scope_null);
		Datum		key = record_column(trigdata, old, "key", TEXTOID, &key_null);

		if (!scope_null && !key_null &&
			same_text(scope, reuse.scope) && same_text(key, reuse.key))
		{
			/* idem_claim puts it back, token + 1; once */
			reuse.scope = reuse.key = NULL;
			return PointerGetDatum(old);
		}
	}

	if (known_lxid != IDEM_MY_LXID || known_cid != GetCurrentCommandId(false) ||
		epoch >= known_epoch)
	{
		known_epoch = idem_token_epoch_now(objects);
		known_lxid = IDEM_MY_LXID;
		known_cid = GetCurrentCommandId(false);
	}
	if (epoch >= known_epoch)
		known_epoch = idem_token_epoch_advance(objects);

	return PointerGetDatum(old);
}

Datum
idem_records_truncated(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	const IdemObjects *objects;

	objects = check_trigger(fcinfo, "idem_records_truncated", "an AFTER TRUNCATE",
							CALLED_AS_TRIGGER(fcinfo) &&
							FIRED_AS(trigdata, AFTER, STATEMENT, TRUNCATE));
	(void) idem_token_epoch_advance(objects);
	return PointerGetDatum(NULL);
}

Datum
idem_records_rekeyed(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	HeapTuple	old;
	HeapTuple	new;
	Datum		old_scope;
	Datum		old_key;
	Datum		new_scope;
	Datum		new_key;
	bool		nulls[4];

	(void) check_trigger(fcinfo, "idem_records_rekeyed", "a BEFORE UPDATE FOR EACH ROW",
						 CALLED_AS_TRIGGER(fcinfo) &&
						 FIRED_AS(trigdata, BEFORE, ROW, UPDATE));
	old = trigdata->tg_trigtuple;
	new = trigdata->tg_newtuple;
	old_scope = record_column(trigdata, old, "scope", TEXTOID, &nulls[0]);
	old_key = record_column(trigdata, old, "key", TEXTOID, &nulls[1]);
	new_scope = record_column(trigdata, new, "scope", TEXTOID, &nulls[2]);
	new_key = record_column(trigdata, new, "key", TEXTOID, &nulls[3]);

	/* NULL: the columns' NOT NULL constraints refuse it after this */
	if (nulls[0] || nulls[1] || nulls[2] || nulls[3] ||
		(same_text(new_scope, DatumGetTextPP(old_scope)) &&
		 same_text(new_key, DatumGetTextPP(old_key))))
		return PointerGetDatum(new);

	ereport(ERROR,
			(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
			 errmsg("cannot change the scope or key of an idempotency record"),
			 errdetail("Key \"%s\" in scope \"%s\" would become key \"%s\" in scope \"%s\".",
					   TextDatumGetCString(old_key), TextDatumGetCString(old_scope),
					   TextDatumGetCString(new_key), TextDatumGetCString(new_scope)),
			 errhint("Fencing tokens of a key must never repeat: delete the record and claim the new key instead.")));
	pg_unreachable();
}
