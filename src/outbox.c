/*-------------------------------------------------------------------------
 *
 * outbox.c
 *		The transactional outbox: emitting messages in the caller's
 *		transaction.
 *
 * idem_outbox_emit is one INSERT into @extschema@.idem_outbox, through a
 * statement prepared once per backend (record_store.c, STMT_OUTBOX_INSERT),
 * so that emitting costs about what the INSERT costs: the row commits or
 * rolls back with the business change, and privileges, row-level security
 * and triggers apply as to the caller's own INSERT.  The id is a UUID of
 * version 7 (a millisecond timestamp, then random bits), so that the primary
 * key grows at its right edge like a sequence instead of at random pages.
 * The order of emits is the seq column, drawn from idem_outbox_seq by the
 * column's default during the INSERT (from 0.3.0 idem_outbox_next_seq(),
 * below): per (scope, topic, key), relays hand messages out in seq order
 * (the claim's head-of-line rule, in the install script).
 *
 * Tenants: under tenant isolation an emit to a scope outside the caller's
 * tenant is refused with 42501 (as a claim is) before it takes any lock, so
 * that one tenant cannot make another's emits wait (check_tenant).
 *
 * Locking: before its INSERT, an emit takes a transaction-level lock on its
 * (scope, topic, key), an advisory lock of class OUTBOX_KEY_LOCK_CLASS.  So
 * two transactions that emit to one key are serialized until the first
 * ends, and per key the order of seq is the order of commits: a snapshot
 * that sees a message sees every earlier message of its key.  Without it a
 * later seq could commit first, be handed out, and then fence in the
 * earlier one for ever (the claim waits behind the earlier one, which waits
 * behind the one in flight).  A batch takes the locks of its keys in the
 * order of their hashes, so that two batches never deadlock each other;
 * idem_outbox_retry takes both locks an emit of its key takes before it
 * draws the message's new seq.  A row inserted into the table directly (an
 * ORM's) takes them too, in the trigger idem_outbox_order, and draws its seq
 * again after them (see "The order trigger" below): the order holds for
 * every row that enters the table, not only for emits.
 *
 * The shared lock table is small (max_locks_per_transaction locks per
 * connection, shared by all), so a bulk emit does not lock each of its
 * keys: a transaction whose first emit is a batch of more than
 * OUTBOX_BULK_KEYS distinct keys locks every key of the scope at once.
 * Every emit holds its scope's lock (class OUTBOX_SCOPE_LOCK_CLASS, keyed
 * by a hash of the scope) in RowExclusiveLock, which emitters share; the
 * bulk emit takes it in ExclusiveLock, which waits for the other
 * transactions that emitted to the scope to end and keeps new ones out
 * until this one ends, and then needs no key lock of the scope.  Other
 * scopes (other tenants) do not wait for it, unless their hash collides.
 * Only a transaction's first emit may wait for that: a later one would wait
 * for a whole scope while holding locks, and could deadlock; it takes the
 * scope's lock only if it is free at once (see lock_scope_first).
 *
 * Relays are woken by NOTIFY idem_outbox, '' (idempotency.outbox_notify).
 * Async_Notify keeps a notification per distinct (channel, payload) and
 * subtransaction level and merges them at subcommit, so however many
 * messages a transaction emits, its commit sends one notification, and a
 * rolled-back one (or subtransaction) sends none; a repeated call costs a
 * small allocation and a comparison with the one pending notification.
 *
 * The relay functions (claim, ack, nack, retry) are PL/pgSQL batch
 * statements in the install script; idem_outbox_counted gives them the
 * counters of idem_stats.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/nbtree.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "commands/async.h"
#include "commands/trigger.h"
#include "common/hashfn.h"
#include "miscadmin.h"
#include "storage/lock.h"
#include "storage/proc.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

#include "extension_objects.h"
#include "idempotency.h"
#include "pg_compat.h"
#include "record_store.h"
#include "stats.h"
#include "validation.h"

PG_FUNCTION_INFO_V1(idem_outbox_emit);
PG_FUNCTION_INFO_V1(idem_outbox_emit_batch);
PG_FUNCTION_INFO_V1(idem_outbox_counted);
PG_FUNCTION_INFO_V1(idem_outbox_lock_key);

/* The channel relays LISTEN on. */
#define OUTBOX_CHANNEL "idem_outbox"

/* Most messages one idem_outbox_emit_batch call takes. */
#define OUTBOX_MAX_BATCH 100000

/*
 * The objsubid of the key locks in pg_locks (locktype advisory), apart from
 * the classes 1 and 2 of pg_advisory_lock, so that an application's own
 * advisory locks never wait for an emit's.
 */
#define OUTBOX_KEY_LOCK_CLASS 7457

/* The objsubid of the scope locks, each the lock on all keys of a scope. */
#define OUTBOX_SCOPE_LOCK_CLASS 7458

/*
 * A transaction's first emit with more distinct keys than this locks every
 * key of the scope at once instead of each.
 */
#define OUTBOX_BULK_KEYS 256

/*
 * The most bytes topic, key and scope may have together.  The index
 * idem_outbox_key holds all three and seq in one entry, and a B-tree entry
 * may take at most about a third of a page (BTMaxItemSize, computed here
 * from BLCKSZ as every supported version does: 2704 bytes of an 8 kB
 * page), or the INSERT fails with a raw 54000.  The entry adds to the
 * values its header (8 bytes), a 4-byte length word per value, up to 13
 * bytes of alignment and seq (8): 41 bytes, and this keeps 63 more as a
 * margin (2600 bytes of values at 8 kB).  Each alone is at most
 * max_key_length, up to 1024 bytes, so the three can reach 3072.
 */
#define OUTBOX_BTREE_MAX_ITEM \
	MAXALIGN_DOWN((BLCKSZ - \
				   MAXALIGN(SizeOfPageHeaderData + 3 * sizeof(ItemIdData) + \
							3 * sizeof(ItemPointerData)) - \
				   MAXALIGN(sizeof(BTPageOpaqueData))) / 3)
#define OUTBOX_MAX_KEY_BYTES ((int) OUTBOX_BTREE_MAX_ITEM - 104)

static uint64
scope_hash(text *scope)
{
	return hash_bytes_extended((const unsigned char *) VARDATA_ANY(scope),
							   VARSIZE_ANY_EXHDR(scope), 0);
}

/*
 * The same (scope, topic, key) always hashes the same within a server; the
 * scope's own hash is its seed, computed once per call.
 */
static uint64
key_lock_hash(uint64 scope_seed, text *topic, text *key)
{
	uint64		hash;

	hash = hash_bytes_extended((const unsigned char *) VARDATA_ANY(topic),
							   VARSIZE_ANY_EXHDR(topic), scope_seed);
	return hash_bytes_extended((const unsigned char *) VARDATA_ANY(key),
							   VARSIZE_ANY_EXHDR(key), hash);
}

/*
 * Whether this transaction holds an outbox lock yet (an emit's, a bulk
 * emit's or idem_outbox_lock_key's), and the subtransaction level that took
 * the first one: its rollback gives back every outbox lock of the
 * transaction, its commit hands them to its parent.
 */
static bool outbox_locked_in_xact = false;
static int	outbox_locked_level = 0;

static void
outbox_xact_callback(XactEvent event, void *arg)
{
	if (event == XACT_EVENT_COMMIT || event == XACT_EVENT_ABORT ||
		event == XACT_EVENT_PREPARE || event == XACT_EVENT_PARALLEL_COMMIT ||
		event == XACT_EVENT_PARALLEL_ABORT)
		outbox_locked_in_xact = false;
}

static void
outbox_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
						SubTransactionId parentSubid, void *arg)
{
	int			level = GetCurrentTransactionNestLevel();

	if (!outbox_locked_in_xact || outbox_locked_level < level)
		return;
	if (event == SUBXACT_EVENT_ABORT_SUB)
		outbox_locked_in_xact = false;
	else if (event == SUBXACT_EVENT_COMMIT_SUB)
		outbox_locked_level = level - 1;
}

/*
 * The scope's lock, before any key lock of the scope: returns true when
 * this transaction holds it in ExclusiveLock, and then takes no key lock of
 * the scope.  It escalates only at the transaction's first emit (when it
 * holds no outbox lock yet), for a batch of more than OUTBOX_BULK_KEYS
 * distinct keys.  A transaction that already emitted holds locks that
 * others may wait for: upgrading its scope lock then could deadlock with
 * another transaction doing the same, and waiting for a whole other scope
 * while holding them could deadlock with any emitter of that scope that
 * waits for one of them.  Such a transaction takes the scope's lock only if
 * it is free at once, and otherwise a key lock per key however many it
 * emits to, and so waits only for the keys it emits to, as single emits
 * do.
 *
 * Two scopes whose hashes collide share one lock.  That costs only waits: a
 * bulk emit to one also waits for and holds off the emits of the other;
 * every emit of a scope still takes that scope's lock, so a bulk emit
 * excludes them all.  Waits (deadlock_timeout and lock_timeout apply) are
 * for the transactions that emitted and have not ended; every lock is held
 * until this transaction ends, and a repeated lock is found in the
 * backend's own lock table.
 */
static bool
lock_scope_first(uint64 hash, int new_keys)
{
	static bool callback_registered = false;
	LOCKTAG		tag;
	bool		first = !outbox_locked_in_xact;

	if (!callback_registered)
	{
		RegisterXactCallback(outbox_xact_callback, NULL);
		RegisterSubXactCallback(outbox_subxact_callback, NULL);
		callback_registered = true;
	}
	if (first)
	{
		outbox_locked_in_xact = true;
		outbox_locked_level = GetCurrentTransactionNestLevel();
	}
	SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, (uint32) (hash >> 32), (uint32) hash,
						 OUTBOX_SCOPE_LOCK_CLASS);
	if (idem_lock_held_by_me(&tag, ExclusiveLock))
		return true;
	if (new_keys > OUTBOX_BULK_KEYS)
	{
		if (first)
		{
			(void) LockAcquire(&tag, ExclusiveLock, false, false);
			return true;
		}
		/*
		 * Later in the transaction, only if nobody else holds the scope's
		 * lock: granted without a wait, it closes no cycle of waits.
		 * Otherwise a key lock per key, lest a big batch fill the shared
		 * lock table.
		 */
		if (LockAcquire(&tag, ExclusiveLock, false, true) != LOCKACQUIRE_NOT_AVAIL)
			return true;
	}
	(void) LockAcquire(&tag, RowExclusiveLock, false, false);
	return false;
}

static void
lock_key(uint64 hash)
{
	LOCKTAG		tag;

	SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, (uint32) (hash >> 32), (uint32) hash,
						 OUTBOX_KEY_LOCK_CLASS);
	(void) LockAcquire(&tag, ExclusiveLock, false, false);
}

static void
lock_one_key(text *scope, text *topic, text *key)
{
	uint64		seed = scope_hash(scope);

	if (!lock_scope_first(seed, 1))
		lock_key(key_lock_hash(seed, topic, key));
}

static int
compare_hashes(const void *a, const void *b)
{
	uint64		x = *(const uint64 *) a;
	uint64		y = *(const uint64 *) b;

	return (x > y) - (x < y);
}

/* A topic, key or type: not empty, and no longer than max_key_length. */
static text *
check_name(text *value, const char *what)
{
	int			len = VARSIZE_ANY_EXHDR(value);

	if (len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must not be empty", what)));
	if (len > idem_max_key_length)
		ereport(ERROR,
				(errcode(ERRCODE_STRING_DATA_RIGHT_TRUNCATION),
				 errmsg("%s is too long", what),
				 errdetail("It is %d bytes long; idempotency.max_key_length is %d.",
						   len, idem_max_key_length)));
	return value;
}

/* topic, key and scope together fit an entry of the index idem_outbox_key. */
static void
check_key_bytes(text *topic, text *key, text *scope)
{
	int			len = VARSIZE_ANY_EXHDR(topic) + VARSIZE_ANY_EXHDR(key) +
		VARSIZE_ANY_EXHDR(scope);

	if (len > OUTBOX_MAX_KEY_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_STRING_DATA_RIGHT_TRUNCATION),
				 errmsg("topic, key and scope are too long together"),
				 errdetail("They are %d bytes long together; the limit is %d bytes.",
						   len, OUTBOX_MAX_KEY_BYTES)));
}

static void
check_headers(Jsonb *headers)
{
	if (!JB_ROOT_IS_OBJECT(headers) || JB_ROOT_IS_SCALAR(headers))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("headers must be a JSON object"),
				 errhint("Pass NULL for a message without headers.")));
}

/* now + delay; a NULL delay is none, a negative one an error. */
static TimestampTz
available_at(FunctionCallInfo fcinfo, int argno, TimestampTz now)
{
	Interval   *delay;
	TimestampTz result;

	if (PG_ARGISNULL(argno))
		return now;
	delay = PG_GETARG_INTERVAL_P(argno);
	result = DatumGetTimestampTz(DirectFunctionCall2(timestamptz_pl_interval,
													 TimestampTzGetDatum(now),
													 IntervalPGetDatum(delay)));
	if (result < now)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("delay must not be negative"),
				 errdetail("The interval given was \"%s\".",
						   DatumGetCString(DirectFunctionCall1(interval_out,
															   IntervalPGetDatum(delay))))));
	/* from PostgreSQL 17 an interval may be infinite: never due */
	if (TIMESTAMP_NOT_FINITE(result))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("delay must be finite")));
	return result;
}

/*
 * A version 7 UUID (RFC 9562): 48 bits of Unix time in milliseconds, the
 * version, 12 bits of the sub-millisecond fraction, the variant and 62
 * random bits.  One backend's ids always grow (RFC 9562's method 3): when
 * the clock gives no later time than the last id's (a batch has one time;
 * the clock has microseconds; it may step back), the fraction counts on
 * from the last id's.
 */
static pg_uuid_t *
new_uuid_v7(TimestampTz now)
{
	static uint64 last_ms = 0;
	static uint32 last_fraction = 0;
	pg_uuid_t  *uuid = palloc(sizeof(pg_uuid_t));
	int64		unix_us = now + (int64) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * USECS_PER_DAY;
	uint64		unix_ms = (uint64) (unix_us / 1000);
	uint32		fraction = (uint32) ((unix_us % 1000) * 4096 / 1000);

	if (unix_ms < last_ms || (unix_ms == last_ms && fraction <= last_fraction))
	{
		unix_ms = last_ms;
		fraction = last_fraction + 1;
		if (fraction > 4095)
		{
			unix_ms++;
			fraction = 0;
		}
	}
	last_ms = unix_ms;
	last_fraction = fraction;

	if (!pg_strong_random(uuid->data, UUID_LEN))
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("could not generate random values")));
	for (int i = 0; i < 6; i++)
		uuid->data[i] = (unsigned char) (unix_ms >> (40 - 8 * i));
	uuid->data[6] = (unsigned char) (0x70 | (fraction >> 8));
	uuid->data[7] = (unsigned char) fraction;
	uuid->data[8] = (unsigned char) ((uuid->data[8] & 0x3F) | 0x80);
	return uuid;
}

/*
 * One INSERT.  topic, key and payload are checked; type and headers may be
 * NULL (Datum 0).
 */
static pg_uuid_t *
emit_one(IdemStore *store, text *scope, text *topic, text *key, Datum payload,
		 text *type, Jsonb *headers, TimestampTz now, TimestampTz available)
{
	pg_uuid_t  *id = new_uuid_v7(now);
	Datum		args[9];
	char		nulls[9];

	memset(nulls, ' ', sizeof(nulls));
	args[0] = UUIDPGetDatum(id);
	args[1] = TimestampTzGetDatum(now);
	args[2] = TimestampTzGetDatum(available);
	args[3] = PointerGetDatum(scope);
	args[4] = PointerGetDatum(topic);
	args[5] = PointerGetDatum(key);
	args[6] = PointerGetDatum(type);
	args[7] = PointerGetDatum(headers);
	args[8] = payload;
	if (type == NULL)
		nulls[6] = 'n';
	if (headers == NULL)
		nulls[7] = 'n';
	idem_store_exec(store, STMT_OUTBOX_INSERT, args, nulls, false, NULL, NULL);
	return id;
}

static void
check_outbox_installed(void)
{
	if (!OidIsValid(idem_objects_outbox_seq()))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("the outbox of extension \"idempotency\" is not installed"),
				 errhint("Run ALTER EXTENSION idempotency UPDATE in this database.")));
}

/*
 * Under tenant isolation, refuse a scope outside the caller's tenant before
 * any lock: its INSERT would fail the policy's check anyway, but only after
 * the emit took the scope's and keys' locks, which the tenant's own emits
 * then waited for (a bulk emit's scope lock waits for them all, and every
 * later emit of the scope queues behind it).  Without row-level security in
 * force this is a catalog lookup and a flag read (idem_store_tenant_check).
 */
static void
check_tenant(text *scope)
{
	idem_store_require_tenant(get_relname_relid("idem_outbox", idem_objects_current()->namespace),
							  scope, "emit");
}

static void
notify_relays(void)
{
	if (idem_outbox_notify)
		Async_Notify(OUTBOX_CHANNEL, "");
}

/*
 * idem_outbox_emit(topic, key, payload, type, headers, scope, delay) -> id
 */
Datum
idem_outbox_emit(PG_FUNCTION_ARGS)
{
	text	   *topic;
	text	   *key;
	text	   *type = NULL;
	Jsonb	   *headers = NULL;
	text	   *scope;
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz available;
	IdemStore	store;
	pg_uuid_t  *id;

	idem_arg_not_null(fcinfo, 0, "topic");
	topic = check_name(PG_GETARG_TEXT_PP(0), "topic");
	idem_arg_not_null(fcinfo, 1, "key");
	key = check_name(PG_GETARG_TEXT_PP(1), "key");
	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("payload must not be null"),
				 errhint("Pass 'null'::jsonb for a message without a payload.")));
	if (!PG_ARGISNULL(3))
		type = check_name(PG_GETARG_TEXT_PP(3), "type");
	if (!PG_ARGISNULL(4))
	{
		headers = PG_GETARG_JSONB_P(4);
		check_headers(headers);
	}
	scope = idem_arg_scope(fcinfo, 5);
	check_key_bytes(topic, key, scope);
	available = available_at(fcinfo, 6, now);

	/* in the caller's memory, not SPI's (see idem_outbox_emit_batch) */
	id = palloc(sizeof(pg_uuid_t));
	idem_store_open(&store, fcinfo->flinfo->fn_oid);
	check_outbox_installed();
	check_tenant(scope);
	lock_one_key(scope, topic, key);
	*id = *emit_one(&store, scope, topic, key, PG_GETARG_DATUM(2), type, headers,
					now, available);
	idem_store_close(&store);
	notify_relays();
	idem_count(IDEM_COUNT_OUTBOX_EMITTED);
	PG_RETURN_UUID_P(id);
}

/* The elements of a one-dimensional array argument, or NULL when it is NULL. */
static int
array_arg(FunctionCallInfo fcinfo, int argno, const char *what, Oid elemtype,
		  Datum **values, bool **nulls)
{
	ArrayType  *array;
	int			n;

	*values = NULL;
	*nulls = NULL;
	if (PG_ARGISNULL(argno))
		return -1;
	array = PG_GETARG_ARRAYTYPE_P(argno);
	if (ARR_NDIM(array) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be a one-dimensional array", what)));
	deconstruct_array(array, elemtype, -1, false, TYPALIGN_INT, values, nulls, &n);
	return n;
}

static void
check_same_length(const char *what, int n, int nkeys)
{
	if (n >= 0 && n != nkeys)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("%s must have as many elements as keys", what),
				 errdetail("keys has %d elements and %s %d.", nkeys, what, n)));
}

/*
 * idem_outbox_emit_batch(topic, keys, payloads, types, headers, scope, delay)
 * -> ids, in the order of keys.  Everything is checked before the first
 * INSERT; one notification for all.
 */
Datum
idem_outbox_emit_batch(PG_FUNCTION_ARGS)
{
	text	   *topic;
	Datum	   *keys,
			   *payloads,
			   *types,
			   *headers;
	bool	   *key_nulls,
			   *payload_nulls,
			   *type_nulls,
			   *header_nulls;
	int			n,
				npayloads,
				ntypes,
				nheaders;
	text	   *scope;
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz available;
	IdemStore	store;
	Datum	   *ids;
	pg_uuid_t  *id_values;

	idem_arg_not_null(fcinfo, 0, "topic");
	topic = check_name(PG_GETARG_TEXT_PP(0), "topic");
	idem_arg_not_null(fcinfo, 1, "keys");
	idem_arg_not_null(fcinfo, 2, "payloads");
	n = array_arg(fcinfo, 1, "keys", TEXTOID, &keys, &key_nulls);
	npayloads = array_arg(fcinfo, 2, "payloads", JSONBOID, &payloads, &payload_nulls);
	ntypes = array_arg(fcinfo, 3, "types", TEXTOID, &types, &type_nulls);
	nheaders = array_arg(fcinfo, 4, "headers", JSONBOID, &headers, &header_nulls);
	if (n > OUTBOX_MAX_BATCH)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("a batch of %d messages is more than the %d allowed", n, OUTBOX_MAX_BATCH),
				 errhint("Emit them in several calls in the same transaction.")));
	check_same_length("payloads", npayloads, n);
	check_same_length("types", ntypes, n);
	check_same_length("headers", nheaders, n);
	scope = idem_arg_scope(fcinfo, 5);
	available = available_at(fcinfo, 6, now);

	for (int i = 0; i < n; i++)
	{
		CHECK_FOR_INTERRUPTS();
		if (key_nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("keys must not contain nulls")));
		keys[i] = PointerGetDatum(check_name(DatumGetTextPP(keys[i]), "key"));
		check_key_bytes(topic, DatumGetTextPP(keys[i]), scope);
		if (payload_nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("payloads must not contain nulls"),
					 errhint("Pass 'null'::jsonb for a message without a payload.")));
		if (types != NULL && !type_nulls[i])
			types[i] = PointerGetDatum(check_name(DatumGetTextPP(types[i]), "type"));
		if (headers != NULL && !header_nulls[i])
		{
			headers[i] = PointerGetDatum(DatumGetJsonbP(headers[i]));
			check_headers(DatumGetJsonbP(headers[i]));
		}
	}

	/*
	 * The ids are copied here, in the caller's memory: emit_one's come from
	 * the memory of SPI after the first INSERT, which idem_store_close frees.
	 */
	ids = palloc(sizeof(Datum) * Max(n, 1));
	id_values = palloc(sizeof(pg_uuid_t) * Max(n, 1));
	idem_store_open(&store, fcinfo->flinfo->fn_oid);
	check_outbox_installed();
	check_tenant(scope);
	if (n > 0)
	{
		uint64	   *hashes = palloc(sizeof(uint64) * n);
		uint64		seed = scope_hash(scope);
		int			distinct = 0;

		for (int i = 0; i < n; i++)
			hashes[i] = key_lock_hash(seed, topic, DatumGetTextPP(keys[i]));
		qsort(hashes, n, sizeof(uint64), compare_hashes);
		for (int i = 0; i < n; i++)
			if (i == 0 || hashes[i] != hashes[i - 1])
				hashes[distinct++] = hashes[i];
		if (!lock_scope_first(seed, distinct))
			for (int i = 0; i < distinct; i++)
				lock_key(hashes[i]);
		pfree(hashes);
	}
	for (int i = 0; i < n; i++)
	{
		text	   *type = (types == NULL || type_nulls[i]) ? NULL : DatumGetTextPP(types[i]);
		Jsonb	   *header = (headers == NULL || header_nulls[i]) ? NULL : DatumGetJsonbP(headers[i]);

		id_values[i] = *emit_one(&store, scope, topic, DatumGetTextPP(keys[i]),
								 payloads[i], type, header, now, available);
		ids[i] = UUIDPGetDatum(&id_values[i]);
		CHECK_FOR_INTERRUPTS();
	}
	idem_store_close(&store);
	if (n > 0)
	{
		notify_relays();
		idem_count_add(IDEM_COUNT_OUTBOX_EMITTED, (uint64) n);
	}
	PG_RETURN_ARRAYTYPE_P(construct_array(ids, n, UUIDOID, UUID_LEN, false, TYPALIGN_CHAR));
}

/*
 * idem_outbox_counted(counter, n): the relay functions' counts.  STRICT; an
 * unrecognized name is an error, so that a misspelt call in the install
 * script shows in the tests.
 */
Datum
idem_outbox_counted(PG_FUNCTION_ARGS)
{
	char	   *counter = text_to_cstring(PG_GETARG_TEXT_PP(0));
	int64		n = PG_GETARG_INT64(1);
	IdemCounter which;

	if (strcmp(counter, "published") == 0)
		which = IDEM_COUNT_OUTBOX_PUBLISHED;
	else if (strcmp(counter, "retried") == 0)
		which = IDEM_COUNT_OUTBOX_RETRIED;
	else if (strcmp(counter, "dead") == 0)
		which = IDEM_COUNT_OUTBOX_DEAD;
	else if (strcmp(counter, "taken_over") == 0)
		which = IDEM_COUNT_OUTBOX_TAKEN_OVER;
	else
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("unrecognized outbox counter \"%s\"", counter)));
	if (n < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("n must not be negative")));
	idem_count_add(which, (uint64) n);
	PG_RETURN_VOID();
}

/*
 * idem_outbox_lock_key(scope, topic, key): the emits' lock on a key, for
 * idem_outbox_retry, which draws a new seq for a dead message.  STRICT.
 * A role may call it directly: the tenant is checked first, as an emit's.
 */
Datum
idem_outbox_lock_key(PG_FUNCTION_ARGS)
{
	text	   *scope = PG_GETARG_TEXT_PP(0);
	IdemStore	store;

	idem_store_open(&store, fcinfo->flinfo->fn_oid);
	check_tenant(scope);
	idem_store_close(&store);
	lock_one_key(scope, PG_GETARG_TEXT_PP(1), PG_GETARG_TEXT_PP(2));
	PG_RETURN_VOID();
}

/*
 * The order trigger: every row that enters idem_outbox gets its seq as an
 * emit's does, also one that an application (an ORM) inserts directly.
 *
 * seq's default is idem_outbox_next_seq(), nextval of idem_outbox_seq that
 * also remembers the value it drew, so that the trigger can tell a seq the
 * default drew for the row (the column left out, or DEFAULT) from one the
 * row brings: defaults are evaluated row by row, just before the row's
 * BEFORE triggers.  idem_outbox_order is a BEFORE INSERT trigger for each
 * row, enabled ALWAYS (it fires also under session_replication_role =
 * replica).  For a row whose seq the default drew it makes sure that the
 * transaction holds its key's lock, the lock an emit takes (lock_scope_first
 * and lock_key, under the same rules), and if it had to take it, draws seq
 * again after it, so that per key seq order is commit order whoever
 * inserts.  A row that brings its own seq keeps it and takes no lock: a
 * restore (COPY of a dump), a copy between shards, logical replication, an
 * owner's row written by hand, rows whose order was settled where they came
 * from (and a restore of millions of rows would fill the shared lock
 * table).  An emitter may not write seq (its INSERT privilege leaves the
 * column out), so its rows always take the lock.  A seq that equals the
 * value the default drew last is taken for a drawn one: the mistake can only
 * cost a lock and a new seq.
 *
 * An emit locks its key before its INSERT, so the default draws its seq
 * after the lock and the trigger, finding the lock held (two hashes and a
 * lookup in the backend's own lock table), leaves the row as it is: the
 * emit does not pay for a copy of its row.  So does a direct INSERT of a key
 * the transaction holds already.  Otherwise, under tenant isolation the
 * row's scope is checked before any lock: the policies' WITH CHECK runs only
 * after BEFORE triggers, and a row of another tenant's scope must not wait
 * for that tenant's emits (it would learn of them) before it is refused.
 * (Policies other than the extension's cannot be told in advance: then the
 * lock is taken and the executor decides, as before.)
 *
 * An INSERT of many rows locks their keys one row at a time, in the order
 * of its rows, not of the keys' hashes as a batch emit does: two such
 * INSERTs of the same keys in different orders can deadlock (one is
 * cancelled, 40P01), as two transactions updating the same rows in
 * different orders can.  Past OUTBOX_BULK_KEYS key locks in a transaction
 * the trigger takes a row's scope lock instead if it is free at once, so
 * that a big INSERT ... SELECT does not fill the shared lock table while
 * the scope is quiet.  A row whose seq is drawn notifies the relays, as an
 * emit does (one notification per transaction); one that brings its seq
 * does not: a restore has no relays to wake, and logical replication may
 * apply it in a prepared transaction, which may not have notified.
 */
PG_FUNCTION_INFO_V1(idem_outbox_next_seq);
PG_FUNCTION_INFO_V1(idem_outbox_order);

/* The seq idem_outbox_next_seq drew last, in the transaction default_lxid. */
static LocalTransactionId default_lxid = InvalidLocalTransactionId;
static int64 default_seq = 0;

/* The trigger's key locks while the transaction holds outbox locks. */
static int	order_keys = 0;

/* The attribute numbers the trigger reads, for the table order_relid. */
static Oid	order_relid = InvalidOid;
static AttrNumber order_seq_att,
			order_scope_att,
			order_topic_att,
			order_key_att;

static int64
draw_seq(Oid fn_oid)
{
	Oid			seq_oid;

	(void) idem_objects(fn_oid);
	seq_oid = idem_objects_outbox_seq();
	if (!OidIsValid(seq_oid))
		elog(ERROR, "sequence idem_outbox_seq of extension \"idempotency\" is missing");
	default_seq = DatumGetInt64(DirectFunctionCall1(nextval_oid, ObjectIdGetDatum(seq_oid)));
	default_lxid = IDEM_MY_LXID;
	return default_seq;
}

/*
 * idem_outbox_next_seq(): the default of idem_outbox.seq.  The caller needs
 * USAGE on idem_outbox_seq, as for nextval.
 */
Datum
idem_outbox_next_seq(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT64(draw_seq(fcinfo->flinfo->fn_oid));
}

static bool
is_column(TupleDesc desc, AttrNumber attnum, const char *name)
{
	Form_pg_attribute att;

	if (attnum <= 0 || attnum > desc->natts)
		return false;
	att = TupleDescAttr(desc, attnum - 1);
	return !att->attisdropped && strcmp(NameStr(att->attname), name) == 0;
}

static AttrNumber
column_of(Relation rel, const char *name, Oid type)
{
	TupleDesc	desc = RelationGetDescr(rel);

	for (int i = 0; i < desc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);

		if (!att->attisdropped && strcmp(NameStr(att->attname), name) == 0 &&
			att->atttypid == type)
			return (AttrNumber) (i + 1);
	}
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("table \"%s\" has no column \"%s\" of type %s",
					RelationGetRelationName(rel), name, format_type_be(type)),
			 errhint("The trigger function idem_outbox_order is for the table idem_outbox of extension \"idempotency\".")));
	pg_unreachable();
}

/* Looked up by name once per backend and table, checked at each row. */
static void
order_columns(Relation rel)
{
	TupleDesc	desc = RelationGetDescr(rel);

	if (order_relid == RelationGetRelid(rel) &&
		is_column(desc, order_seq_att, "seq") &&
		is_column(desc, order_scope_att, "scope") &&
		is_column(desc, order_topic_att, "aggregatetype") &&
		is_column(desc, order_key_att, "aggregateid"))
		return;
	order_relid = InvalidOid;
	order_seq_att = column_of(rel, "seq", INT8OID);
	order_scope_att = column_of(rel, "scope", TEXTOID);
	order_topic_att = column_of(rel, "aggregatetype", TEXTOID);
	order_key_att = column_of(rel, "aggregateid", TEXTOID);
	order_relid = RelationGetRelid(rel);
}

/* Does this transaction hold the lock an emit of the key takes? */
static bool
key_locked_by_me(uint64 seed, uint64 hash)
{
	LOCKTAG		tag;

	SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, (uint32) (hash >> 32), (uint32) hash,
						 OUTBOX_KEY_LOCK_CLASS);
	if (idem_lock_held_by_me(&tag, ExclusiveLock))
		return true;
	SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, (uint32) (seed >> 32), (uint32) seed,
						 OUTBOX_SCOPE_LOCK_CLASS);
	return idem_lock_held_by_me(&tag, ExclusiveLock);
}

/* Is the row's scope outside the caller's tenants, as far as we can tell? */
static bool
outside_tenant(Oid fn_oid, Relation rel, text *scope)
{
	IdemStore	store;
	IdemTenantCheck check;

	idem_store_open(&store, fn_oid);
	check = idem_store_tenant_check(RelationGetRelid(rel), scope);
	idem_store_close(&store);
	return check == IDEM_TENANT_OUTSIDE;
}

static text *
text_column(HeapTuple tuple, TupleDesc desc, AttrNumber attnum)
{
	bool		isnull;
	Datum		value = heap_getattr(tuple, attnum, desc, &isnull);

	return isnull ? NULL : DatumGetTextPP(value);
}

/*
 * idem_outbox_order(): BEFORE INSERT ON idem_outbox FOR EACH ROW.
 */
Datum
idem_outbox_order(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	Relation	rel;
	HeapTuple	tuple;
	TupleDesc	desc;
	bool		isnull;
	Datum		seq;
	text	   *scope;
	text	   *topic;
	text	   *key;
	uint64		seed;
	uint64		hash;
	int			seq_col;

	if (!CALLED_AS_TRIGGER(fcinfo) || !TRIGGER_FIRED_BEFORE(trigdata->tg_event) ||
		!TRIGGER_FIRED_FOR_ROW(trigdata->tg_event) ||
		!TRIGGER_FIRED_BY_INSERT(trigdata->tg_event))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("function idem_outbox_order must be fired BEFORE INSERT FOR EACH ROW")));
	rel = trigdata->tg_relation;
	tuple = trigdata->tg_trigtuple;
	desc = RelationGetDescr(rel);
	order_columns(rel);

	/* a seq of the row's own: kept (a NULL one is drawn as a default) */
	seq = heap_getattr(tuple, order_seq_att, desc, &isnull);
	if (!isnull && (default_lxid != IDEM_MY_LXID || DatumGetInt64(seq) != default_seq))
		return PointerGetDatum(tuple);
	default_lxid = InvalidLocalTransactionId;
	notify_relays();

	/* NOT NULL columns: a NULL goes on to the executor's own error */
	scope = text_column(tuple, desc, order_scope_att);
	topic = text_column(tuple, desc, order_topic_att);
	key = text_column(tuple, desc, order_key_att);
	if (scope == NULL || topic == NULL || key == NULL)
		return PointerGetDatum(tuple);

	seed = scope_hash(scope);
	hash = key_lock_hash(seed, topic, key);
	if (key_locked_by_me(seed, hash))
	{
		/* drawn under the lock already (an emit's row) */
		if (!isnull)
			return PointerGetDatum(tuple);
	}
	else
	{
		if (outside_tenant(fcinfo->flinfo->fn_oid, rel, scope))
			return PointerGetDatum(tuple);	/* the policy refuses it */
		if (!outbox_locked_in_xact)
			order_keys = 0;
		/* past the bulk size: the scope's lock, if it is free at once */
		if (!lock_scope_first(seed, order_keys < OUTBOX_BULK_KEYS ? 1 : order_keys + 1))
		{
			lock_key(hash);
			order_keys++;
		}
	}

	/* after the lock */
	seq = Int64GetDatum(draw_seq(fcinfo->flinfo->fn_oid));
	default_lxid = InvalidLocalTransactionId;
	seq_col = order_seq_att;
	isnull = false;
	return PointerGetDatum(heap_modify_tuple_by_cols(tuple, desc, 1, &seq_col, &seq, &isnull));
}
