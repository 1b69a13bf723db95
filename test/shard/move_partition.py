#!/usr/bin/python3
"""Move one partition of a sharded deployment to another shard (issue 16,
README "Scaling out", "Moving a partition").

The partition map is the proxies' (the foreign server "idempotency" of
idempotency_router, the same on every proxy); the source is the shard the
partition is on now, the target another shard of the map, or with
--new-shard a shard the map does not hold yet (a new node, set up as the
others: the extension at the source's version in the same schema, the
business tables and functions, the grants).  A new shard is first checked
not to be a shard of the map under another spelling: a session on it must
not show in any shard's pg_stat_activity (PL/Proxy tells shards apart by
the connection string only).
While clients keep calling through the proxies:

  1. freeze   on the source, in one transaction: triggers per table that
              refuse every INSERT, UPDATE and DELETE of a row of the
              partition with SQLSTATE 40001 (retryable: the caller retries
              the call, which runs on the target once the map is switched;
              a purge there fails so until the cleanup has removed the
              rows).  One move of a partition runs at a time: an advisory
              lock on the source, held for the run.
              Creating them waits for the transactions that are writing
              those tables and holds back new writers for that moment, so
              once it commits no row of the partition changes on the source
              any more.  The wait is bounded: the tables' locks are taken in
              one statement under --lock-timeout (2s) as a whole, then the
              transaction rolls back and, after a growing pause, tries again
              (--lock-retries, 4 more times; a deadlock too); after the last
              try the script fails with nothing changed and names the
              sessions that hold locks on the tables (an idle-in-transaction
              writer, say).
              The trigger functions run in every writer's session: their
              schema idem_move is made by the mover, and one that exists
              and is not the mover's or a superuser's (or a function in
              it, or another role's right to create objects in it) is
              refused.
              The outbox's fence is gentler to relays: a claim on the source
              skips the partition's messages (they are not handed out there
              again; the claim goes on with the shard's other messages),
              while an emit, an ack, a nack or a retry of one of them is
              refused with 40001 like any other write.
  2. copy     the partition's rows of every table (the records, the inbox,
              the inbox streams, the outbox in every status, and the
              business tables named with --table) to the target in one
              transaction, column by name (the source's columns; the
              target's table must have each of them, in any order, and may
              have more, which get their defaults); then the target's
              token epoch raised to the source's (tokens of keys the
              target claims anew stay above every token the source
              issued), the target's outbox sequences
              raised to the source's (a claim there draws a fencing token
              above every token the source's relays hold, and a message
              emitted there goes after the moved messages of its key), and
              any fence of an earlier move of the partition away from the
              target dropped (the unfreeze on the target).  In-flight
              messages keep their token and lease: the target's relays take
              them over when the lease runs out, with a larger token.  The
              target's relays are notified (NOTIFY idem_outbox).  The target
              must hold no row of the partition yet (but see the rerun
              below).
  3. switch   every proxy's map: ALTER SERVER idempotency (through
              idem_router_set_partition); PL/Proxy reads it at the next call
              of every session.  Every proxy must be named (--proxy, once
              each): the fence refuses writes only, so a proxy left behind
              would send reads (idem_lookup, idem_await) to the source, which
              answers "nothing" after the cleanup.
  4. clean    delete the partition's rows on the source.  The fence stays:
              a write that still reaches the source (a stale owner on the
              shard directly, a proxy left unnamed) is refused, so no key
              is ever claimed on two shards and a stale owner can complete
              nothing there (reads are not fenced: see step 3).  Tokens
              stay fenced: a record moves with its token, and on the
              target an owner call matches
              only that token.  The source's outbox keeps no copy of a
              moved message, so its relays cannot publish one again; a
              relay that held a lease there when the partition froze gets
              40001 and then IK004 for its ack, and the target's relay
              publishes those messages again after the lease: a duplicate,
              as after any take-over, which the consumer's inbox drops.

The freeze window (from the fence's commit to the switch's) is printed.
A failure leaves the partition frozen on the source: run again after fixing
the cause.  The freeze records a run id on the source (idem_move.frozen,
kept while the fence stays) and the copy records it on the target with the
rows (idem_move.switched, deleted when the run ends).  The rerun finds the
source frozen for the partition (by this script's triggers, enabled,
calling its functions) and then either a proxy points at the target
already, or the target recorded the copy of the run that froze the source:
the copy committed and the target is the partition's shard (its relays,
its purge and, once a proxy switched, its callers may have changed the rows
since), so the copy is skipped and the proxies not yet switched are
switched; or neither: no caller can have written the target's rows of the
partition, which are an interrupted or older copy, so they are deleted and
copied again in the copy's transaction.
Rows of the partition on the target while the source is not frozen for it
are refused.  (For the tests, IDEM_MOVE_TEST_FAIL=after-copy stops the run
between the copy and the switch, IDEM_MOVE_TEST_FAIL=after-first-switch
after one proxy's switch.)

  test/shard/move_partition.py --proxy DSN [--proxy DSN ...] --partition N
      --to SHARD [--new-shard] [--table TABLE:SCOPE_COLUMN ...]
      [--lock-timeout 2s] [--lock-retries 4]

SHARD is a connection string exactly as in the map (idem_router_partitions()
on the proxy), or the new shard's as it will be written there.  The shards'
connection strings are used as they are, with the user of the environment
(PGUSER); the script needs superuser rights on
the shards (triggers on the extension's tables, session_replication_role
for the copy, which keeps the records' triggers from judging copied rows as
new ones).
"""

import argparse
import os
import secrets
import sys
import time

import psycopg
from psycopg import sql

# The advisory lock class of a move (its key: the partition), on the source.
MOVE_LOCK_CLASS = 7459
# The extension's own tables and the column that routes their rows.
OWN_TABLES = [("idempotency_records", "scope"), ("idem_inbox", "consumer"),
              ("idem_inbox_streams", "consumer")]
# The outbox (SQL 0.2.0), and its sequences: fencing tokens and emit order.
OUTBOX = ("idem_outbox", "scope")
OUTBOX_SEQUENCES = ["idem_outbox_token", "idem_outbox_seq"]

# The fence's functions run in every writer's session on the source: the
# schema that holds them, and they, must be the mover's or a superuser's,
# and no one else may create objects in it.  A schema of that name that
# someone else made beforehand is refused, not trusted.
UNTRUSTED = """
SELECT format('schema idem_move is owned by %s', n.nspowner::regrole)
  FROM pg_namespace n JOIN pg_roles r ON r.oid = n.nspowner
 WHERE n.nspname = 'idem_move' AND NOT (r.rolsuper OR r.rolname = current_user)
UNION ALL
SELECT format('function %s is owned by %s', p.oid::regprocedure, p.proowner::regrole)
  FROM pg_proc p JOIN pg_roles r ON r.oid = p.proowner
 WHERE p.pronamespace = 'idem_move'::regnamespace AND NOT (r.rolsuper OR r.rolname = current_user)
UNION ALL
SELECT format('%s may create objects in schema idem_move',
              CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END)
  FROM pg_namespace n, aclexplode(n.nspacl) a
 WHERE n.nspname = 'idem_move' AND a.privilege_type = 'CREATE' AND a.grantee <> n.nspowner
UNION ALL
SELECT format('table %s is owned by %s', c.oid::regclass, c.relowner::regrole)
  FROM pg_class c JOIN pg_roles r ON r.oid = c.relowner
 WHERE c.relnamespace = 'idem_move'::regnamespace AND NOT (r.rolsuper OR r.rolname = current_user)
UNION ALL
SELECT format('%s may write table %s', CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END,
              c.oid::regclass)
  FROM pg_class c, aclexplode(c.relacl) a
 WHERE c.relnamespace = 'idem_move'::regnamespace AND a.grantee <> c.relowner
   AND a.privilege_type IN ('INSERT', 'UPDATE', 'DELETE', 'TRUNCATE')
"""

# The move's own bookkeeping, in schema idem_move: on the source, the run
# that froze the partition (kept while the fence stays); on the target, that
# run's copy committed there and its switch may have begun (deleted when the
# run ends).  The shared run id keeps a target's record of another run from
# passing for this one's.
BOOKKEEPING = """
CREATE TABLE IF NOT EXISTS idem_move.frozen (partition integer, partitions integer, run text NOT NULL,
                                             PRIMARY KEY (partition, partitions));
CREATE TABLE IF NOT EXISTS idem_move.switched (partition integer, partitions integer, run text NOT NULL,
                                               PRIMARY KEY (partition, partitions));
REVOKE ALL ON idem_move.frozen, idem_move.switched FROM PUBLIC;
"""

# The fence, one trigger function for every table and operation.  The
# outbox's fence (a fourth argument) is gentler to relays: a relay's claim
# (a message made in_flight) skips the row, so the source hands no message
# of the partition out again and its relays go on with the shard's other
# messages.  Deletions are refused like any other write: a business row's
# would be lost (the copy has the row), a claim's reuse of a record is a
# write of the key, and a purge's is retried by the purge once the
# partition is gone; the move's own cleanup deletes them (idem_move.cleanup).
REFUSE = """
CREATE OR REPLACE FUNCTION idem_move.refuse() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF TG_OP = 'DELETE' AND current_setting('idem_move.cleanup', true) = 'on' THEN
        RETURN OLD;
    END IF;
    IF TG_OP = 'UPDATE' AND TG_NARGS > 3 THEN
        -- (nested: only the outbox has the column)
        IF NEW.status::text = 'in_flight' THEN
            RETURN NULL;
        END IF;
    END IF;
    RAISE EXCEPTION 'partition % of % has moved to another shard', TG_ARGV[0], TG_ARGV[1]
        USING ERRCODE = 'serialization_failure',
              DETAIL = format('Table %s, row of %s.', TG_TABLE_NAME, TG_ARGV[2]),
              HINT = 'Retry the call: the proxy sends it to the partition''s new shard.';
END $$;
"""


def fence_name(partition, partitions):
    return "idem_move_p%d_of_%d" % (partition, partitions)


def ext_schema(conn):
    row = conn.execute("SELECT n.nspname FROM pg_extension e JOIN pg_namespace n"
                       " ON n.oid = e.extnamespace WHERE e.extname = 'idempotency'").fetchone()
    if row is None:
        raise SystemExit("move_partition: no extension idempotency on shard %r"
                         % conn.info.dsn)
    return row[0]


def ext_version(conn):
    return conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'idempotency'").fetchone()[0]


def has_outbox(conn, schema):
    return conn.execute("SELECT to_regclass(%s) IS NOT NULL",
                        (schema + "." + OUTBOX[0],)).fetchone()[0]


def tables_of(conn, schema, extra, outbox):
    """(qualified table, routing column) of every table to move."""
    own = OWN_TABLES + ([OUTBOX] if outbox else [])
    out = [(sql.Identifier(schema, t), c) for t, c in own]
    for spec in extra:
        table, _, column = spec.partition(":")
        if not column:
            raise SystemExit("move_partition: --table needs TABLE:SCOPE_COLUMN, not %r" % spec)
        oid = conn.execute("SELECT to_regclass(%s)::oid", (table,)).fetchone()[0]
        if oid is None:
            raise SystemExit("move_partition: no table %s on the source" % table)
        nsp, rel = conn.execute("SELECT n.nspname, c.relname FROM pg_class c"
                                " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = %s",
                                (oid,)).fetchone()
        out.append((sql.Identifier(nsp, rel), column))
    return out


COLUMNS = ("SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0"
           " AND NOT attisdropped AND attgenerated = '' ORDER BY attnum")


def columns_of(src, dst, tables):
    """Each table's columns on the source, by name (a COPY without a column
    list would pair them by position: a business table created with its
    columns in another order on the target would get its values in the
    wrong columns).  The target must have every one of them."""
    out = []
    for table, column in tables:
        name = table.as_string(src)
        cols = [r[0] for r in src.execute(COLUMNS, (name,)).fetchall()]
        if dst.execute("SELECT to_regclass(%s)", (name,)).fetchone()[0] is None:
            raise SystemExit("move_partition: no table %s on the target" % name)
        theirs = {r[0] for r in dst.execute(COLUMNS, (name,)).fetchall()}
        missing = [c for c in cols if c not in theirs]
        if missing:
            raise SystemExit("move_partition: the target's table %s lacks column%s %s of the"
                             " source's: add %s there first"
                             % (name, "s" if len(missing) > 1 else "", ", ".join(missing),
                                "them" if len(missing) > 1 else "it"))
        out.append((table, column, sql.SQL(", ").join(map(sql.Identifier, cols))))
    return out


def in_partition(schema, column, partition, partitions, row=None):
    """The condition of a row of the partition (of the trigger's row NEW)."""
    col = sql.Identifier(row, column) if row else sql.Identifier(column)
    return sql.SQL("({}.idem_route_hash({}) & {}) = {}").format(
        sql.Identifier(schema), col, sql.Literal(partitions - 1), sql.Literal(partition))


def blockers(conn, tables):
    """The sessions holding a lock on one of the tables, for the message of
    a freeze that could not take its locks."""
    return conn.execute(
        "SELECT string_agg(format('pid %%s (%%s, %%s, since %%s)', a.pid, a.usename, a.state,"
        "                         date_trunc('second', a.xact_start)), ', ' ORDER BY a.pid)"
        "  FROM pg_stat_activity a"
        " WHERE a.pid <> pg_backend_pid() AND a.pid IN (SELECT l.pid FROM pg_locks l"
        "   WHERE l.granted AND l.database = (SELECT oid FROM pg_database"
        "                                      WHERE datname = current_database())"
        "     AND l.relation = ANY (%s::regclass[]))",
        ([t.as_string(conn) for t, _ in tables],)).fetchone()[0]


def with_lock_timeout(conn, a, what, tables, work, after_failure):
    """Run work() in one transaction of conn under lock_timeout, again after
    a back-off when a lock is not granted in time (or a deadlock cancels
    it): a DDL lock (CREATE TRIGGER's, DROP TRIGGER's) waits for every open
    writer of its table, an idle-in-transaction one too, and every later
    writer of the table queues behind it, so an unbounded wait would stall
    the whole shard.  Each try rolls back whole."""
    for attempt in range(1, a.lock_retries + 2):
        try:
            with conn.transaction():
                conn.execute("SELECT set_config('lock_timeout', %s, true)", (a.lock_timeout,))
                return work()
        except (psycopg.errors.LockNotAvailable, psycopg.errors.DeadlockDetected,
                LockTimedOut) as e:
            held = blockers(conn, tables) or "none now"
            if attempt > a.lock_retries:
                raise SystemExit("move_partition: %s: no lock within lock_timeout %s in %d tries"
                                 " (%s); %s. Sessions holding locks on the tables: %s. End them,"
                                 " or run again at a quieter time"
                                 % (what, a.lock_timeout, attempt,
                                    e.diag.message_primary if isinstance(e, psycopg.Error)
                                    else e,
                                    after_failure, held))
            delay = min(0.5 * 2 ** (attempt - 1), 8.0)
            print("move_partition: %s: no lock within lock_timeout %s (try %d of %d; held by %s);"
                  " again in %.1f s" % (what, a.lock_timeout, attempt, a.lock_retries + 1, held,
                                        delay), flush=True)
            time.sleep(delay)
    raise AssertionError("with_lock_timeout: no try ran")


class LockTimedOut(Exception):
    """The freeze's LOCK TABLE ran out of its time."""


def lock_all(conn, tables, lock_timeout):
    """Every table's SHARE ROW EXCLUSIVE lock (CREATE TRIGGER's) in one
    statement, bounded as a whole by lock_timeout: taken one by one, the
    locks already held would hold writers back while a later one waits."""
    saved = conn.execute("SELECT current_setting('statement_timeout')").fetchone()[0]
    conn.execute("SELECT set_config('statement_timeout', %s, true)", (lock_timeout,))
    try:
        conn.execute(sql.SQL("LOCK TABLE {} IN SHARE ROW EXCLUSIVE MODE").format(
            sql.SQL(", ").join(t for t, _ in tables)))
    except psycopg.errors.QueryCanceled as e:
        raise LockTimedOut(e.diag.message_primary)
    conn.execute("SELECT set_config('statement_timeout', %s, true)", (saved,))


def fenced_triggers(conn, name, tables):
    """How many of this move's fence triggers the tables carry, each
    enabled and calling a function of idem_move: two per table when the
    partition is frozen."""
    return conn.execute(
        "SELECT count(*) FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid"
        "  JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE t.tgname IN (%s, %s) AND t.tgenabled <> 'D' AND n.nspname = 'idem_move'"
        "   AND p.proname = 'refuse'"
        "   AND t.tgrelid = ANY (%s::regclass[])",
        (name, name + "_delete", [t.as_string(conn) for t, _ in tables])).fetchone()[0]


def prepare_schema(conn, where):
    """The schema idem_move and its bookkeeping, refused unless only the
    mover or a superuser can change them (their functions run in writers'
    sessions, their tables decide a rerun)."""
    with conn.transaction():
        conn.execute("CREATE SCHEMA IF NOT EXISTS idem_move")
        untrusted = [r[0] for r in conn.execute(UNTRUSTED).fetchall()]
        if untrusted:
            raise SystemExit("move_partition: the %s's schema idem_move is not only yours or a"
                             " superuser's: %s. Nothing was changed; drop it, or make it yours"
                             % (where, "; ".join(untrusted)))
        conn.execute(BOOKKEEPING)


def run_of(conn, table, partition, partitions):
    """The run recorded in idem_move.frozen or idem_move.switched, or None."""
    row = conn.execute(sql.SQL("SELECT run FROM idem_move.{} WHERE partition = %s"
                               " AND partitions = %s").format(sql.Identifier(table)),
                       (partition, partitions)).fetchone()
    return row[0] if row else None


def read_maps(proxies):
    """Each proxy's partition map, as {partition: connstr}; they must have
    the same number of partitions."""
    maps = [dict(c.execute("SELECT partition, connstr FROM idem_router_partitions()").fetchall())
            for c in proxies]
    if len({len(m) for m in maps}) != 1 or not maps[0]:
        raise SystemExit("move_partition: the proxies' maps differ in their number of partitions"
                         " (or one has none): %s" % ", ".join(str(len(m)) for m in maps))
    return maps


def check_new_shard(target, maps):
    """A new shard must be another database than every shard of the maps,
    however its connection string is spelled: PL/Proxy tells shards apart
    by the string only, so one shard under two spellings would hold
    partitions under two names (and RUN ON ALL would count it twice).  The
    check: a session on the target, in an open transaction (so that a pooler
    in between keeps its server connection) under an application_name of
    its own, must not be seen in any shard's pg_stat_activity of its
    database.  (A clone of a shard, with its system identifier and paths,
    is a new shard all the same.)"""
    probe = "idem-move-probe-" + secrets.token_hex(8)
    with psycopg.connect(target, autocommit=True, application_name="idem-move") as mine:
        with mine.transaction():
            mine.execute("SELECT set_config('application_name', %s, true)", (probe,))
            for shard in sorted({v for m in maps for v in m.values() if v != target}):
                try:
                    with psycopg.connect(shard, autocommit=True, connect_timeout=10,
                                         application_name="idem-move") as c:
                        seen = c.execute("SELECT EXISTS (SELECT FROM pg_stat_activity"
                                         " WHERE application_name = %s"
                                         "   AND datname = current_database())",
                                         (probe,)).fetchone()[0]
                except psycopg.Error as e:
                    raise SystemExit("move_partition: cannot check that the new shard is not"
                                     " shard %r of the map: %s" % (shard, str(e).strip()))
                if seen:
                    raise SystemExit("move_partition: the new shard %r is shard %r of the map,"
                                     " spelled differently (a session on it shows there): name"
                                     " it as in the map, without --new-shard" % (target, shard))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--proxy", required=True, action="append",
                   help="libpq connection string of a proxy database; give every proxy, each"
                        " with its own --proxy")
    p.add_argument("--partition", type=int, required=True)
    p.add_argument("--to", required=True, help="the target shard, as in the partition map")
    p.add_argument("--new-shard", action="store_true",
                   help="the target is a shard the map does not hold yet")
    p.add_argument("--table", action="append", default=[],
                   help="a business table and its routing column, TABLE:SCOPE_COLUMN")
    p.add_argument("--lock-timeout", default="2s",
                   help="how long the freeze (and the copy's unfreeze) waits for each lock"
                        " before it rolls back and tries again (default 2s)")
    p.add_argument("--lock-retries", type=int, default=4,
                   help="how many times it tries again, with a growing pause (default 4)")
    a = p.parse_args()
    if a.lock_retries < 0:
        p.error("--lock-retries must not be negative")

    proxies = [psycopg.connect(d, autocommit=True, application_name="idem-move") for d in a.proxy]
    maps = read_maps(proxies)
    partitions = len(maps[0])
    entries = [m.get(a.partition) for m in maps]
    if None in entries:
        raise SystemExit("move_partition: the map has no partition %d" % a.partition)
    # A proxy may point at the target already (an earlier run switched it).
    sources = set(entries) - {a.to}
    if not sources:
        raise SystemExit("move_partition: partition %d is on that shard already" % a.partition)
    if len(sources) > 1:
        raise SystemExit("move_partition: the proxies disagree on the shard of partition %d: %s"
                         % (a.partition, ", ".join(sorted(sources))))
    source = sources.pop()
    # The target as a shard of a map, other than as this partition's entry.
    known = any(v == a.to for m in maps for k, v in m.items() if k != a.partition)
    if a.new_shard and known:
        raise SystemExit("move_partition: %r is a shard of the map already: leave out --new-shard"
                         % a.to)
    if not a.new_shard and not known:
        raise SystemExit("move_partition: %r is not a shard of the map (name it as in"
                         " idem_router_partitions(), or pass --new-shard to grow onto a new shard)"
                         % a.to)
    if a.new_shard:
        check_new_shard(a.to, maps)
    name = fence_name(a.partition, partitions)

    src = psycopg.connect(source, autocommit=True, application_name="idem-move")
    # One move of the partition at a time: a second run that read the maps
    # before the first switched would copy again over the writes made on the
    # target since.  Held on the source until the end of the run; the maps
    # are read again under it.
    if not src.execute("SELECT pg_try_advisory_lock(%s, %s)",
                       (MOVE_LOCK_CLASS, a.partition)).fetchone()[0]:
        raise SystemExit("move_partition: another move of partition %d from this source is"
                         " running; nothing was changed" % a.partition)
    if [m.get(a.partition) for m in read_maps(proxies)] != entries:
        raise SystemExit("move_partition: the map of partition %d changed while this run"
                         " started (another move?); nothing was changed: run again"
                         % a.partition)
    try:
        timeout = src.execute("SELECT set_config('lock_timeout', %s, false)",
                              (a.lock_timeout,)).fetchone()[0]
    except psycopg.Error as e:
        raise SystemExit("move_partition: --lock-timeout %r: %s"
                         % (a.lock_timeout, e.diag.message_primary))
    src.execute("RESET lock_timeout")
    if timeout == "0":
        raise SystemExit("move_partition: --lock-timeout must be more than 0 (0 waits for ever)")
    dst = psycopg.connect(a.to, autocommit=True, application_name="idem-move")
    schema = ext_schema(src)
    if ext_schema(dst) != schema:
        raise SystemExit("move_partition: the extension is in another schema on the target")
    if a.new_shard and ext_version(dst) != ext_version(src):
        raise SystemExit("move_partition: the new shard has idempotency %s, the source %s: install"
                         " the same version" % (ext_version(dst), ext_version(src)))
    outbox = has_outbox(src, schema)
    if outbox and not has_outbox(dst, schema):
        raise SystemExit("move_partition: the source has the outbox and the target does not"
                         " (update the extension there to 0.2.0)")
    tables = tables_of(src, schema, a.table, outbox)
    columns = columns_of(src, dst, tables)
    outbox_table = sql.Identifier(schema, OUTBOX[0])

    # A rerun after a failure: the source frozen for the partition (by this
    # script's fence), and either a proxy points at the target already (the
    # switch of another failed): the partition's shard already, whose rows
    # its callers may have changed since, so the copy is skipped; or none
    # does: then no caller can have written the target's rows of the
    # partition, which are an interrupted run's copy (perhaps changed since
    # by the target's relays and purge), and the copy is made again in
    # their place.  Rows of the partition on a target without that fence on
    # the source are not ours to build on.
    prepare_schema(src, "source")
    prepare_schema(dst, "target")
    frozen_run = run_of(src, "frozen", a.partition, partitions)
    switched_run = run_of(dst, "switched", a.partition, partitions)
    switched_one = a.to in entries or (switched_run is not None and switched_run == frozen_run)
    held = {table.as_string(dst): dst.execute(sql.SQL("SELECT count(*) FROM {} WHERE {}").format(
        table, in_partition(schema, column, a.partition, partitions))).fetchone()[0]
        for table, column in tables}
    frozen_before = (fenced_triggers(src, name, tables) == 2 * len(tables)
                     and frozen_run is not None)
    run = frozen_run if frozen_before else secrets.token_hex(8)
    if (any(held.values()) or switched_one) and not frozen_before:
        where = ", ".join("%s %d" % kv for kv in held.items() if kv[1])
        raise SystemExit("move_partition: %s, and the partition is not frozen on the source:"
                         " not an interrupted move; nothing was changed"
                         % ("the target holds rows of partition %d already (%s)"
                            % (a.partition, where) if where else
                            "a proxy points partition %d at the target already" % a.partition))
    resume = switched_one
    recopy = not switched_one and any(held.values())
    if resume:
        print("move_partition: resuming: partition %d is frozen on the source and a proxy points"
              " at the target already (or a run began to switch): the copy is skipped"
              % a.partition, flush=True)
    elif recopy:
        print("move_partition: resuming: partition %d is frozen on the source and no proxy points"
              " at the target: its rows there (%s) are an interrupted copy, made again"
              % (a.partition, ", ".join("%s %d" % kv for kv in held.items() if kv[1])),
              flush=True)

    # 1. freeze: the tables' locks first, in one statement bounded as a
    # whole; then CREATE OR REPLACE TRIGGER, which needs no more (a DROP
    # TRIGGER, even IF EXISTS, would take ACCESS EXCLUSIVE and hold back the
    # readers too).  Run again on a rerun: it changes nothing then.
    def freeze():
        lock_all(src, tables, a.lock_timeout)
        src.execute(REFUSE)
        src.execute("INSERT INTO idem_move.frozen VALUES (%s, %s, %s) ON CONFLICT (partition,"
                    " partitions) DO UPDATE SET run = excluded.run", (a.partition, partitions, run))
        for table, column in tables:
            args = sql.SQL(", ").join(
                [sql.Literal(str(a.partition)), sql.Literal(str(partitions)), sql.Literal(column)]
                + ([sql.Literal("outbox")] if table == outbox_table else []))
            for trigger, when, row in ((name, "INSERT OR UPDATE", "new"),
                                       (name + "_delete", "DELETE", "old")):
                src.execute(sql.SQL(
                    "CREATE OR REPLACE TRIGGER {} BEFORE {} ON {} FOR EACH ROW WHEN ({})"
                    " EXECUTE FUNCTION idem_move.refuse({})").format(
                        sql.Identifier(trigger), sql.SQL(when), table,
                        in_partition(schema, column, a.partition, partitions, row), args))
    started = time.monotonic()
    if not resume:
        with_lock_timeout(src, a, "the freeze on the source", tables, freeze,
                          "nothing was changed there (the transaction rolled back)")
    frozen = time.monotonic()

    # 2. copy, and the unfreeze on the target, in one transaction there
    copied = {}

    def copy():
        dst.execute("SET LOCAL session_replication_role = replica")
        for table, column in tables:
            n = dst.execute(sql.SQL("DELETE FROM {} WHERE {}").format(
                table, in_partition(schema, column, a.partition, partitions))).rowcount
            if n and not recopy:
                raise SystemExit("move_partition: the target holds rows of partition %d in %s"
                                 " already" % (a.partition, table.as_string(dst)))
        for table, column, cols in columns:
            with src.cursor().copy(sql.SQL("COPY (SELECT {} FROM {} WHERE {}) TO STDOUT").format(
                    cols, table, in_partition(schema, column, a.partition, partitions))) as out, \
                    dst.cursor().copy(sql.SQL("COPY {} ({}) FROM STDIN").format(table, cols)) as into:
                for data in out:
                    into.write(data)
            n = dst.execute(sql.SQL("SELECT count(*) FROM {} WHERE {}").format(
                table, in_partition(schema, column, a.partition, partitions))).fetchone()[0]
            copied[table.as_string(dst)] = n
        # The sequences after the rows, so that nothing the source issued
        # before the copy's snapshot is missed.  The token epoch: tokens of
        # keys the target claims anew stay above every token the source
        # issued.  The outbox's fencing tokens and emit order: the source's
        # last values bound every token and seq of the partition's messages,
        # since the fence holds back every claim, emit and retry of them
        # there.  setval stays raised if this transaction fails: harmless,
        # they only need to grow.
        for seq in ["idem_token_epoch"] + (OUTBOX_SEQUENCES if outbox else []):
            qualified = sql.Identifier(schema, seq).as_string(dst)
            last = "SELECT coalesce(pg_sequence_last_value(%s::regclass), 0)"
            src_last = src.execute(last, (qualified,)).fetchone()[0]
            if src_last > dst.execute(last, (qualified,)).fetchone()[0]:
                dst.execute("SELECT setval(%s::regclass, %s)", (qualified, src_last))
        # The unfreeze on the target (a fence of an earlier move of the
        # partition away from it) last: DROP TRIGGER's ACCESS EXCLUSIVE lock
        # holds back every reader of the table until the commit.
        for table, column in tables:
            for trigger in (name, name + "_delete"):
                if dst.execute("SELECT EXISTS (SELECT FROM pg_trigger WHERE tgrelid = %s::regclass"
                               " AND tgname = %s)", (table.as_string(dst), trigger)).fetchone()[0]:
                    dst.execute(sql.SQL("DROP TRIGGER {} ON {}").format(sql.Identifier(trigger),
                                                                       table))
        dst.execute("DELETE FROM idem_move.frozen WHERE partition = %s AND partitions = %s",
                    (a.partition, partitions))
        # with the rows: the copy committed, and the switch may begin
        dst.execute("INSERT INTO idem_move.switched VALUES (%s, %s, %s) ON CONFLICT (partition,"
                    " partitions) DO UPDATE SET run = excluded.run", (a.partition, partitions, run))
        if outbox and copied[outbox_table.as_string(dst)]:
            dst.execute("NOTIFY idem_outbox")

    if resume:
        copied = held
    else:
        with_lock_timeout(dst, a, "the copy to the target", tables, copy,
                          "the partition stays frozen on the source: run the move again")
    if os.environ.get("IDEM_MOVE_TEST_FAIL") == "after-copy":
        raise SystemExit("move_partition: stopped between the copy and the switch"
                         " (IDEM_MOVE_TEST_FAIL=after-copy, for the tests): run again to resume")

    # 3. switch every proxy (before the cleanup: a proxy left behind would
    # send reads, which the fence does not refuse, to the emptied source)
    # Each proxy's map read again just before: one proxy named twice (or
    # under two spellings) was switched a moment ago.
    for proxy in proxies:
        m = read_maps([proxy])[0]
        if m[a.partition] != a.to:
            proxy.execute("SELECT idem_router_set_partition(%s, %s, new_shard => %s)",
                          (a.partition, a.to, a.to not in m.values()))
            if os.environ.get("IDEM_MOVE_TEST_FAIL") == "after-first-switch":
                raise SystemExit("move_partition: stopped after the switch of one proxy"
                                 " (IDEM_MOVE_TEST_FAIL=after-first-switch, for the tests):"
                                 " run again to resume")
    switched = time.monotonic()

    # 4. clean up the source (the fence stays; its deletions let this
    # transaction's through)
    deleted = 0
    with src.transaction():
        src.execute("SET LOCAL idem_move.cleanup = 'on'")
        for table, column in tables:
            deleted += src.execute(sql.SQL("DELETE FROM {} WHERE {}").format(
                table, in_partition(schema, column, a.partition, partitions))).rowcount
    dst.execute("DELETE FROM idem_move.switched WHERE partition = %s AND partitions = %s",
                (a.partition, partitions))
    print("move_partition: partition %d of %d moved: %s; freeze window %.0f ms (fence %.0f ms,"
          " copy and switch %.0f ms%s); %d rows deleted on the source"
          % (a.partition, partitions, ", ".join("%s %d" % kv for kv in copied.items()),
             (switched - frozen) * 1000, (frozen - started) * 1000, (switched - frozen) * 1000,
             "; this run's part only: the freeze began in an earlier run" if resume else "",
             deleted), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
