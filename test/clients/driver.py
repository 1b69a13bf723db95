#!/usr/bin/env python3
"""The driver of test/clients/run: concurrent duplicate requests through each
service, then checks of the answers, the business rows and the provider.
TAP on stdout.  Usage: driver.py NAME=URL... (env PROVIDER_URL, IDEM_DSN_DIRECT;
IDEM_CACHE_SERVICE=NAME: that service has the Redis cache, cache_checks.py)"""
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request

import psycopg

PROVIDER = os.environ["PROVIDER_URL"]
DUPS, ORDER_KEYS, PAYMENT_KEYS = 8, 12, 16
CHECKS = 17     # per service
tests = []


def ok(cond, name, diag=None):
    tests.append(bool(cond))
    print("%sok %d - %s" % ("" if cond else "not ", len(tests), name), flush=True)
    if not cond and diag:
        print("# " + str(diag)[:2000].replace("\n", "\n# "), flush=True)


def post(url, body, key=None, raw_key=None, timeout=20, tenant="t1"):
    headers = {"Content-Type": "application/json"}
    if tenant is not None:
        headers["X-Tenant"] = tenant
    if key is not None:
        headers["Idempotency-Key"] = '"%s"' % key
    if raw_key is not None:
        headers["Idempotency-Key"] = raw_key
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
    sent = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, hdrs, data = r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        status, hdrs, data = e.code, dict(e.headers), e.read()
    except OSError as e:            # no answer: a failure of every check of the key
        status, hdrs, data = 0, {}, json.dumps(str(e)).encode()
    return {"sent": sent, "got": time.monotonic(), "status": status, "headers": hdrs,
            "body": json.loads(data), "replayed": hdrs.get("Idempotent-Replayed") == "true"}


def burst(url, keys, body_of, tenant_of=lambda k: "t1"):
    """DUPS concurrent requests per key, all keys at once; answers per key."""
    answers = {k: [] for k in keys}
    start = threading.Barrier(len(keys) * DUPS)

    def one(k):
        start.wait()
        answers[k].append(post(url, body_of(k), k, tenant=tenant_of(k)))
    threads = [threading.Thread(target=one, args=(k,)) for k in keys for _ in range(DUPS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return answers


def settle(url, answers, body_of, until=(201, 402, 422), tenant_of=lambda k: "t1"):
    """Repeats each key until its answer is final (not 409, not 202)."""
    for k, got in answers.items():
        for _ in range(60):
            if got and got[-1]["status"] in until:
                break
            time.sleep(0.25)
            got.append(post(url, body_of(k), k, tenant=tenant_of(k)))


def final(a):
    return a["status"] not in (409, 202)


def first_final(got):
    return next((a for a in got if final(a)), {"body": {}})


def header(a, name):
    """A header of an answer, by its case-insensitive name."""
    return next((v for n, v in a["headers"].items() if n.lower() == name.lower()), None)


def same_headers(answers, location):
    """Keys whose final answers do not all carry the first one's Location,
    X-Request-Id and Content-Type (a 201's Location from location(body)), or
    that have more than one answer without Idempotent-Replayed: true."""
    bad = {}
    for k, got in answers.items():
        fin = [a for a in got if final(a)]
        seen = [(header(a, "Location"), header(a, "X-Request-Id"), header(a, "Content-Type"))
                for a in fin]
        first = [a for a in fin if not a["replayed"]]
        # (answers are in the order they came back: a replay may beat the first)
        if (not fin or any(h != seen[0] for h in seen) or not seen[0][1] or len(first) > 1 or
                (fin[0]["status"] == 201 and seen[0][0] != location(fin[0]["body"]))):
            bad[k] = [(a["status"], a["replayed"]) + h for a, h in zip(fin, seen)]
    return bad


def check_service(name, url, db):
    pre = name + "-"
    bad = [post(url + "/orders", {"sku": "x"}),
           post(url + "/orders", {"sku": "x"}, raw_key="unquoted"),
           post(url + "/orders", {"sku": "x"}, raw_key='""'),
           post(url + "/orders", {"sku": "x"}, key="k" * 256)]
    ok(all(a["status"] == 400 and a["headers"].get("Content-Type") == "application/problem+json"
           for a in bad), "%s: 400 problem+json for a missing, unquoted, empty or too long key" % name,
       [(a["status"], a["headers"].get("Content-Type")) for a in bad])
    bad = [post(url + "/orders", {"sku": "x"}, key=pre + "no-tenant", tenant=None),
           post(url + "/orders", {"sku": "x"}, key=pre + "bad-tenant", tenant="T1/orders")]
    ok(all(a["status"] == 400 and a["headers"].get("Content-Type") == "application/problem+json"
           for a in bad), "%s: 400 problem+json for a missing or malformed X-Tenant" % name,
       [(a["status"], a["headers"].get("Content-Type")) for a in bad])

    okeys = [pre + "order-%d" % i for i in range(ORDER_KEYS)]
    obody = lambda k: {"sku": "A" + k[-2:], "qty": int(k.rsplit("-", 1)[1]) + 1}
    pkeys = [pre + "pay-%d" % i for i in range(PAYMENT_KEYS)]
    amount = lambda k: 9500 if int(k.rsplit("-", 1)[1]) % 7 == 3 else 100 * (int(k.rsplit("-", 1)[1]) + 1)
    pbody = lambda k: {"amount": amount(k), "currency": "EUR"}
    # payments alternate between the tenants; the provider knows them by
    # tenant and key (the services' payment_id)
    ptenant = lambda k: "t%d" % (1 + int(k.rsplit("-", 1)[1]) % 2)
    pid = lambda k: ptenant(k) + ":" + k

    t0 = time.monotonic()
    orders = burst(url + "/orders", okeys, obody)
    payments = burst(url + "/payments", pkeys, pbody, ptenant)
    settle(url + "/orders", orders, obody)
    settle(url + "/payments", payments, pbody, until=(201, 402, 422, 202), tenant_of=ptenant)
    pending = [k for k, got in payments.items() if any(a["status"] == 202 for a in got)]
    burst_of = {k: [a["status"] for a in got] for k, got in payments.items()}
    rec = post(url + "/reconcile", {}, tenant=None)
    settle(url + "/payments", payments, pbody, tenant_of=ptenant)
    print("# %s: %d order and %d payment requests in %.1f s, %d payments unknown"
          % (name, sum(map(len, orders.values())), sum(map(len, payments.values())),
             time.monotonic() - t0, len(pending)), flush=True)

    rows = dict(db.execute("SELECT idem_key, count(*) FROM orders WHERE tenant = 't1' AND idem_key LIKE %s"
                           " GROUP BY 1", (pre + "%",)).fetchall())
    ok(all(rows.get(k) == 1 for k in okeys), "%s: one order row per key (%d keys x %d duplicates)"
       % (name, ORDER_KEYS, DUPS), rows)

    for label, answers in (("orders", orders), ("payments", payments)):
        bad = {}
        for k, got in answers.items():
            fin = [(a["status"], a["body"]) for a in got if final(a)]
            if not fin or any(f != fin[0] for f in fin):
                bad[k] = fin
        ok(not bad, "%s: every final answer of a %s key equals the first" % (name, label), bad)
        firsts = {k: sum(1 for a in got if final(a) and not a["replayed"]) for k, got in answers.items()}
        ok(all(n <= 1 for n in firsts.values()) and
           all(n == 1 for k, n in firsts.items() if k not in pending),
           "%s: %s: one first answer per key, every other is Idempotent-Replayed" % (name, label), firsts)
        late = []
        for k, got in answers.items():
            done = min([a["got"] for a in got if final(a)] or [float("inf")])
            late += [k for a in got if a["status"] == 409 and
                     (a["sent"] > done or "Retry-After" not in a["headers"])]
        ok(not late, "%s: %s: 409 with Retry-After, and only while the first request runs (%d 409s)"
           % (name, label, sum(a["status"] == 409 for got in answers.values() for a in got)), late)

    for label, answers, location in (
            ("orders", orders, lambda body: "/orders/%s" % body.get("order_id")),
            ("payments", payments, lambda body: "/payments/%s" % body.get("charge_id"))):
        bad = same_headers(answers, location)
        ok(not bad, "%s: %s: a replay gives back the first answer's Location, X-Request-Id and "
           "Content-Type, with Idempotent-Replayed: true" % (name, label), bad)

    declined = [k for k in pkeys if amount(k) >= 9000]
    ok(all(payments[k][-1]["status"] == 402 for k in declined) and
       all(payments[k][-1]["status"] == 201 for k in pkeys if k not in declined),
       "%s: payments end 201, or 402 for a decline" % name,
       {k: payments[k][-1]["status"] for k in pkeys})

    changed = [post(url + "/orders", dict(obody(k), qty=99), k) for k in okeys[::3]]
    crossed = [post(url + "/payments", obody(k), k, tenant="t1") for k in okeys[1::3]]
    ok(all(a["status"] == 422 and a["headers"].get("Content-Type") == "application/problem+json"
           for a in changed + crossed),
       "%s: 422 for a key reused with another body or on another endpoint" % name,
       [a["status"] for a in changed + crossed])

    # the same key in another tenant is another intent, not a replay; a
    # tenant the services' role is not allowed is refused by the database
    again = okeys[::4]
    other = {k: post(url + "/orders", obody(k), k, tenant="t2") for k in again}
    mine = {k: post(url + "/orders", obody(k), k) for k in again}
    t2rows = dict(db.execute("SELECT idem_key, count(*) FROM orders WHERE tenant = 't2' AND idem_key LIKE %s"
                             " GROUP BY 1", (pre + "%",)).fetchall())
    ok(all(other[k]["status"] == 201 and not other[k]["replayed"] and t2rows.get(k) == 1 and
           other[k]["body"]["order_id"] != first_final(orders[k])["body"].get("order_id") and
           mine[k]["replayed"] and mine[k]["body"] == first_final(orders[k])["body"] for k in again),
       "%s: the same key in another tenant is a new order of that tenant; the first tenant's replays "
       "are unchanged" % name,
       {k: (other[k]["status"], other[k]["replayed"], t2rows.get(k), mine[k]["replayed"]) for k in again})
    refused = [post(url + path, body, pre + "t3-" + path[1:], tenant="t3")
               for path, body in (("/orders", {"sku": "x"}), ("/payments", {"amount": 100}))]
    ok(all(a["status"] == 403 and a["headers"].get("Content-Type") == "application/problem+json"
           for a in refused) and
       not db.execute("SELECT 1 FROM idempotency_records WHERE scope = 't3' AND key LIKE %s",
                      (pre + "%",)).fetchall() and
       not db.execute("SELECT 1 FROM orders WHERE tenant = 't3'").fetchall(),
       "%s: 403 for a tenant the role is not allowed, and nothing written" % name,
       [(a["status"], a["body"]) for a in refused])

    with urllib.request.urlopen(PROVIDER + "/stats") as r:
        stats = json.load(r)
    resolved = rec["body"] if rec["status"] == 200 else {"succeeded": [], "retry": []}
    mine = set(resolved["succeeded"]) | set(resolved["retry"])
    ok(rec["status"] == 200 and pending and mine == {pid(k) for k in pending} and
       all(p in stats["charges"] for p in resolved["succeeded"]) and
       not db.execute("SELECT 1 FROM idempotency_records WHERE status = 'unknown' AND key LIKE %s",
                      (pre + "%",)).fetchall(),
       "%s: the reconciler (global_reconciler) resolved every unknown payment of both tenants "
       "(%d in t1, %d in t2) as the provider says"
       % (name, sum(ptenant(k) == "t1" for k in pending), sum(ptenant(k) == "t2" for k in pending)),
       {"reconcile": rec["body"], "pending": pending, "answers": burst_of})
    prow = {k: (c, a) for k, c, a in db.execute(
        "SELECT idem_key, charge_id, amount FROM payments WHERE idem_key LIKE %s", (pre + "%",)).fetchall()}
    nrows = dict(db.execute("SELECT idem_key, count(*) FROM payments WHERE idem_key LIKE %s GROUP BY 1",
                            (pre + "%",)).fetchall())
    tenants = dict(db.execute("SELECT idem_key, min(tenant) FROM payments WHERE idem_key LIKE %s GROUP BY 1",
                              (pre + "%",)).fetchall())
    expect_calls = {k: 1 + (pid(k) in resolved["retry"]) for k in pkeys}
    ok(all(nrows.get(k, 0) == (k not in declined) for k in pkeys) and
       all(tenants[k] == ptenant(k) for k in tenants) and
       all(prow[k] == (stats["charges"][pid(k)]["charge_id"], amount(k)) for k in prow) and
       all(payments[k][-1]["body"].get("charge_id") == stats["charges"][pid(k)]["charge_id"]
           for k in pkeys if k not in declined) and
       {k: stats["calls"].get(pid(k)) for k in pkeys} == expect_calls,
       "%s: one charge and one payment row per key, in its tenant, the provider called once per attempt"
       % name,
       {"rows": nrows, "calls": {k: stats["calls"].get(pid(k)) for k in pkeys}, "expected": expect_calls})


def main():
    services = [a.split("=", 1) for a in sys.argv[1:]]
    cached = os.environ.get("IDEM_CACHE_SERVICE")
    cached = cached if cached in dict(services) else None
    if cached:
        import cache_checks
    plan = CHECKS * len(services) + (cache_checks.PLAN if cached else 0)
    print("1..%d" % plan, flush=True)
    with psycopg.connect(os.environ["IDEM_DSN_DIRECT"], autocommit=True) as db:
        for name, url in services:
            check_service(name, url, db)
        if cached:
            cache_checks.check(cached, dict(services)[cached], db, ok, post, burst, settle, final)
    failed = tests.count(False)
    print("Result: %s" % ("PASS" if failed == 0 and len(tests) == plan else "FAIL"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
