#!/usr/bin/python3
"""The checks of the end-to-end test, in TAP.

    check.py DSN LOGDIR

  1. every committed emit was applied exactly once;
  2. no emit of a rolled-back transaction was delivered;
  3. per key, the consumers applied the messages in emit order;
  4. no stale relay's ack was accepted: every ack a relay logged as accepted
     carries the token under which the message was finally published, and
     the stalled relay's ack was refused (at least one IK002);
  5. every committed message is published (none pending, in flight or dead).
"""
import collections
import os
import glob
import sys

import psycopg

dsn, logdir = sys.argv[1:3]
db = psycopg.connect(dsn, autocommit=True)
emits = {r[0]: (r[1], r[2]) for r in db.execute("SELECT id, key, n FROM emits")}
rolled = {r[0] for r in db.execute("SELECT id FROM rolled_back")}
applied = db.execute("SELECT msg_id, key, n FROM applied ORDER BY order_no").fetchall()
outbox = {r[0]: (r[1], r[2]) for r in db.execute("SELECT id, status::text, token FROM idem_outbox")}

acks = stale = claims = 0
bad_acks = []
for path in glob.glob(logdir + "/relay-*.events"):
    for line in open(path):
        kind, token, _, *ids = line.split()
        if kind == "claim":
            claims += 1
        elif kind == "stale":
            stale += 1
        elif kind == "ack":
            acks += 1
            for i in ids:
                final = outbox.get(__import__("uuid").UUID(i))
                if final is None or final[1] != int(token):
                    bad_acks.append((i, token, final))
duplicates = sum(1 for p in glob.glob(logdir + "/consumer-*.events") for _ in open(p))

tests = []


def check(ok, name, detail=""):
    tests.append(ok)
    print("%sok %d - %s" % ("" if ok else "not ", len(tests), name), flush=True)
    if not ok and detail:
        for line in str(detail).splitlines()[:20]:
            print("# " + line)


times = collections.Counter(m for m, _, _ in applied)
missing = [m for m in emits if times[m] == 0]
twice = [m for m, c in times.items() if c > 1]
stray = [m for m in times if m not in emits]
print("1..5")
check(not missing and not twice and not stray and len(emits) > 0,
      "every committed emit applied exactly once (%d emits, %d applied)" % (len(emits), len(applied)),
      "missing %s\ntwice %s\nnot emitted %s" % (missing[:5], twice[:5], stray[:5]))
delivered_rolled = [m for m in rolled if times[m] or m in outbox]
check(not delivered_rolled and len(rolled) > 0,
      "no rolled-back emit delivered or left in the outbox (%d rolled back)" % len(rolled),
      delivered_rolled[:5])
by_key = collections.defaultdict(list)
for m, key, n in applied:
    by_key[key].append(n)
emitted_by_key = collections.defaultdict(list)
for key, n in emits.values():
    emitted_by_key[key].append(n)
out_of_order = [k for k in emitted_by_key if by_key[k] != sorted(emitted_by_key[k])]
check(not out_of_order,
      "per key, the consumer applied messages in emit order (%d keys)" % len(emitted_by_key),
      "\n".join("%s: applied %s, emitted %s" % (k, by_key[k][:20], sorted(emitted_by_key[k])[:20])
                for k in out_of_order[:3]))
check(not bad_acks and acks > 0 and stale > 0,
      "no stale relay's ack accepted (%d acks accepted, %d stale acks refused with IK002)" % (acks, stale),
      bad_acks[:5])
statuses = collections.Counter(outbox[m][0] if m in outbox else "missing" for m in emits)
check(statuses == collections.Counter({"published": len(emits)}),
      "every committed message is published: %s" % dict(statuses))
print("# claims %d, duplicates dropped by the inbox %d" % (claims, duplicates))
# the counters, where the server keeps them (the C edition, preloaded; the
# SQL edition has none: README, "What needs the C library")
if os.environ.get("IDEM_EDITION", "c") != "sql":
    for counter, value in db.execute("SELECT counter, value FROM idem_stats() WHERE counter LIKE 'outbox%'"):
        print("# %s %d" % (counter, value))
print("Result: %s" % ("PASS" if all(tests) and len(tests) == 5 else "FAIL"))
sys.exit(0 if all(tests) else 1)
