#!/usr/bin/env python3
"""The driver of test/clients/run: concurrent duplicate requests through each
service, then checks of the answers, the business rows and the provider.
Then, one at a time: the provider's surprises (fake_provider.py's markers),
records the driver writes itself (a takeover past the provider call, an
unknown record in a sub-scope, one not at the provider call, one too young
to reconcile, no response code, hand-edited headers) and a missing grant.
TAP on stdout.  Usage: driver.py NAME=URL... (env PROVIDER_URL,
IDEM_DSN_DIRECT, RECONCILE_AFTER as the services'; IDEM_CACHE_SERVICE=NAME:
that service has the Redis cache, cache_checks.py)"""
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request

import psycopg

PROVIDER = os.environ["PROVIDER_URL"]
RECONCILE_AFTER = float(os.environ.get("RECONCILE_AFTER", "30"))
DUPS, ORDER_KEYS, PAYMENT_KEYS = 8, 12, 16
CHECKS = 26     # per service
SURPRISES = ("post503", "get503", "garbage", "hangup", "cutoff", "bad400")
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
    except Exception as e:          # no answer, or a broken one: a failure of every check of the key
        status, hdrs, data = 0, {}, json.dumps(str(e)).encode()
    try:
        body = json.loads(data)
    except ValueError:
        body = data.decode("latin-1")
    return {"sent": sent, "got": time.monotonic(), "status": status, "headers": hdrs, "length": len(data),
            "body": body, "replayed": hdrs.get("Idempotent-Replayed") == "true"}


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


def provider_post(pid, amount):
    """A charge made at the provider by the driver itself (pid ends in .ok)."""
    req = urllib.request.Request(PROVIDER + "/charges", method="POST",
                                 data=json.dumps({"payment_id": pid, "amount": amount}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.load(r)


def own(db, scope, key, path, body, lease="10 seconds", checkpoint=None, unknown=False):
    """A record the driver writes itself, as a service would: a claim,
    maybe a checkpoint, maybe marked unknown.  Its token."""
    token = db.execute("SELECT token FROM idem_claim(%s, idem_request_fingerprint('POST', %s, %s::jsonb),"
                       " lease => %s::interval, scope => %s)",
                       (key, path, json.dumps(body), lease, scope)).fetchone()[0]
    if checkpoint:
        db.execute("SELECT idem_checkpoint(%s, %s, %s, scope => %s)", (key, token, checkpoint, scope))
    if unknown:
        db.execute("SELECT idem_mark_unknown(%s, %s, '{\"reason\": \"by the driver\"}', scope => %s)",
                   (key, token, scope))
    return token


def record(db, scope, key):
    """(status, response_code, retryable) of a record; Nones if there is none."""
    return db.execute("SELECT status::text, response_code, retryable FROM idempotency_records"
                      " WHERE scope = %s AND key = %s", (scope, key)).fetchone() or (None, None, None)


def check_service(name, url, db):
    pre = name + "-"
    bad = [post(url + "/orders", {"sku": "x"}),
           post(url + "/orders", {"sku": "x"}, raw_key="unquoted"),
           post(url + "/orders", {"sku": "x"}, raw_key='""'),
           post(url + "/orders", {"sku": "x"}, raw_key='"a\\"b"'),
           post(url + "/orders", {"sku": "x"}, key="k" * 256)]
    ok(all(a["status"] == 400 and a["headers"].get("Content-Type") == "application/problem+json"
           for a in bad), "%s: 400 problem+json for a missing, unquoted, empty, escaped or too long key" % name,
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

    # records for the reconciler, older than RECONCILE_AFTER when it runs:
    # an unknown payment in a sub-scope of t2, charged at the provider (its
    # tenant is the scope's text before the "/"), and an unknown record
    # that never reached the provider call (not a payment to reconcile)
    q = name + "."
    legacy, stray = q + "legacy.ok", q + "order-unknown"
    legacy_charge = provider_post("t2:" + legacy, 700)
    own(db, "t2/legacy", legacy, "/payments", {"amount": 700}, checkpoint="provider-call", unknown=True)
    own(db, "t1", stray, "/orders", {"sku": "u"}, unknown=True)

    t0 = time.monotonic()
    orders = burst(url + "/orders", okeys, obody)
    payments = burst(url + "/payments", pkeys, pbody, ptenant)
    settle(url + "/orders", orders, obody)
    settle(url + "/payments", payments, pbody, until=(201, 402, 422, 202), tenant_of=ptenant)
    pending = [k for k, got in payments.items() if any(a["status"] == 202 for a in got)]
    burst_of = {k: [a["status"] for a in got] for k, got in payments.items()}

    # the provider's surprises, one key each (fake_provider.py's markers)
    skey = {m: q + "s." + m for m in SURPRISES}
    sbody = {"amount": 300, "currency": "EUR"}
    surprised = {m: [post(url + "/payments", sbody, k)] for m, k in skey.items()}
    surprised["bad400"].append(post(url + "/payments", sbody, skey["bad400"]))
    alive = post(url + "/orders", {"sku": "alive"}, q + "alive")
    srec = {m: record(db, "t1", k) for m, k in skey.items()}
    ok(all(surprised[m][0]["status"] == 202 and srec[m][0] == "unknown"
           for m in SURPRISES if m != "bad400") and
       [(a["status"], a["replayed"]) for a in surprised["bad400"]] == [(400, False), (400, True)] and
       surprised["bad400"][0]["body"] == surprised["bad400"][1]["body"] == {"error": "invalid_request"} and
       srec["bad400"] == ("failed", 400, False) and alive["status"] == 201,
       "%s: a provider's 5xx, a body that is not JSON, a closed connection or half a body leave the "
       "payment unknown (202); its 400 is saved and replayed; the service keeps serving" % name,
       {"answers": {m: [(a["status"], a["body"]) for a in got] for m, got in surprised.items()},
        "records": srec, "next": alive["status"]})

    # an owner that died after the provider call: its lease runs out, and
    # the next request takes over (the provider charged one of the two)
    tk_charged, tk_none = q + "tk-charged.ok", q + "tk-none.ok"
    tk_charge = provider_post("t1:" + tk_charged, 400)
    for k in (tk_charged, tk_none):
        own(db, "t1", k, "/payments", {"amount": 400}, lease="1 second", checkpoint="provider-call")

    # the unknown payments are old enough now (and the leases above gone);
    # then one more, too young: the reconciler must leave it alone
    time.sleep(max(RECONCILE_AFTER, 1.0) + 0.5)
    young = q + "young.ok"
    own(db, "t1", young, "/payments", {"amount": 500}, checkpoint="provider-call", unknown=True)
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
    resolved = rec["body"] if rec["status"] == 200 else {}
    resolved = {w: resolved.get(w, []) for w in ("succeeded", "retry", "left")}
    every = set(resolved["succeeded"]) | set(resolved["retry"]) | set(resolved["left"])
    mine = {p for p in set(resolved["succeeded"]) | set(resolved["retry"]) if p.split(":", 1)[1].startswith(pre)}
    ok(rec["status"] == 200 and pending and mine == {pid(k) for k in pending} and
       all(p in stats["charges"] for p in resolved["succeeded"]) and
       not db.execute("SELECT 1 FROM idempotency_records WHERE status = 'unknown' AND key LIKE %s",
                      (pre + "%",)).fetchall(),
       "%s: the reconciler (global_reconciler) resolved every unknown payment of both tenants "
       "(%d in t1, %d in t2) as the provider says"
       % (name, sum(ptenant(k) == "t1" for k in pending), sum(ptenant(k) == "t2" for k in pending)),
       {"reconcile": rec["body"], "pending": pending, "answers": burst_of})
    prow = db.execute("SELECT tenant, charge_id FROM payments WHERE idem_key = %s", (legacy,)).fetchall()
    ok(resolved["succeeded"].count("t2:" + legacy) == 1 and prow == [("t2", legacy_charge["charge_id"])] and
       record(db, "t2/legacy", legacy)[0] == "succeeded" and
       record(db, "t1", stray)[0] == "unknown" and not any(stray in p for p in every),
       "%s: the reconciler takes the tenant of a sub-scope before its '/', and only payments "
       "that reached the provider call" % name,
       {"reconcile": rec["body"], "rows": prow, "legacy": record(db, "t2/legacy", legacy),
        "stray": record(db, "t1", stray)})
    ok(record(db, "t1", young)[0] == "unknown" and not any(young in p for p in every),
       "%s: the reconciler leaves an unknown payment younger than RECONCILE_AFTER (%g s)"
       % (name, RECONCILE_AFTER), {"reconcile": rec["body"], "young": record(db, "t1", young)})
    again = post(url + "/payments", sbody, skey["get503"])
    ok(resolved["left"].count("t1:" + skey["get503"]) == 1 and
       not any(skey["get503"] in p for p in resolved["succeeded"] + resolved["retry"]) and
       record(db, "t1", skey["get503"])[0] == "unknown" and again["status"] == 202 and
       stats["calls"].get("t1:" + skey["get503"]) == 1,
       "%s: a 5xx to the reconciler's lookup leaves the payment unknown (left), never handed back for a redo"
       % name, {"reconcile": rec["body"], "record": record(db, "t1", skey["get503"]),
                "next": again["status"], "calls": stats["calls"].get("t1:" + skey["get503"])})
    charged = ("post503", "garbage", "hangup", "cutoff")
    later = {m: post(url + "/payments", sbody, skey[m]) for m in charged}
    with urllib.request.urlopen(PROVIDER + "/stats") as r:
        stats2 = json.load(r)
    ok(all(later[m]["status"] == 201 and later[m]["replayed"] and
           later[m]["body"].get("charge_id") == stats2["charges"]["t1:" + skey[m]]["charge_id"] and
           stats2["calls"]["t1:" + skey[m]] == 1 for m in charged),
       "%s: reconciled, those payments answer the provider's one charge" % name,
       {m: (later[m]["status"], later[m]["body"], stats2["calls"].get("t1:" + skey[m])) for m in charged})

    # the takeovers past the provider call look the charge up before charging
    took = {k: post(url + "/payments", {"amount": 400}, k) for k in (tk_charged, tk_none)}
    with urllib.request.urlopen(PROVIDER + "/stats") as r:
        stats2 = json.load(r)
    ok(took[tk_charged]["status"] == 201 and
       took[tk_charged]["body"].get("charge_id") == tk_charge["charge_id"] and
       took[tk_none]["status"] == 201 and
       took[tk_none]["body"].get("charge_id") == stats2["charges"].get("t1:" + tk_none, {}).get("charge_id") and
       [stats2["calls"].get("t1:" + k) for k in (tk_charged, tk_none)] == [1, 1],
       "%s: a takeover past the provider call asks the provider first: a charge found is completed, "
       "not charged again; none found, it charges once" % name,
       {k: (a["status"], a["body"], stats2["calls"].get("t1:" + k)) for k, a in took.items()})

    # a record saved without a response code (0.1.0 data, or none passed)
    nok, nfail = q + "nocode-ok", q + "nocode-fail"
    db.execute("SELECT idem_complete(%s, %s, '{\"done\": true}', scope => 't1')",
               (nok, own(db, "t1", nok, "/orders", {"sku": "n"})))
    db.execute("SELECT idem_fail(%s, %s, '{\"failed\": true}', retryable => false, scope => 't1')",
               (nfail, own(db, "t1", nfail, "/orders", {"sku": "n"})))
    got = [post(url + "/orders", {"sku": "n"}, k) for k in (nok, nfail)]
    ok([(a["status"], a["body"], a["replayed"]) for a in got] ==
       [(200, {"done": True}, True), (500, {"failed": True}, True)],
       "%s: a replay of a record without a response code is 200 for a success, 500 for a failure" % name,
       [(a["status"], a["body"]) for a in got])

    # a 42501 that is not the claim's tenant refusal: a missing grant
    db.execute("REVOKE INSERT ON orders FROM api")
    try:
        denied = post(url + "/orders", {"sku": "g"}, q + "no-grant")
    finally:
        db.execute("GRANT INSERT ON orders TO api")
    ok(denied["status"] == 500 and record(db, "t1", q + "no-grant")[0] is None,
       "%s: a permission error other than the tenant refusal is a 500, not a 403" % name,
       (denied["status"], denied["body"]))

    # saved headers edited by hand: the server's own are never sent, and a
    # value that is not valid HTTP (CR LF) is a 500, never a split answer
    hown, hbad = q + "hdr-own", q + "hdr-bad"
    for k in (hown, hbad):
        db.execute("SELECT idem_complete(%s, %s, '{\"h\": 1}', 201, headers => '{\"X-Request-Id\": \"r1\"}',"
                   " scope => 't1')", (k, own(db, "t1", k, "/orders", {"sku": "h"})))
    db.execute("""UPDATE idempotency_records SET response_headers = response_headers ||
                  '{"Content-Length": "999", "Transfer-Encoding": "chunked", "Connection": "x-saved"}'
                  WHERE scope = 't1' AND key = %s""", (hown,))
    db.execute("""UPDATE idempotency_records SET response_headers = '{"X-Bad": "a\\r\\nX-Injected: yes"}'
                  WHERE scope = 't1' AND key = %s""", (hbad,))
    h1, h2 = (post(url + "/orders", {"sku": "h"}, k, timeout=5) for k in (hown, hbad))
    h3 = post(url + "/orders", {"sku": "h"}, hown, timeout=5)
    ok(h1["status"] == 201 and h1["body"] == {"h": 1} and header(h1, "X-Request-Id") == "r1" and
       header(h1, "Content-Length") == str(h1["length"]) and
       header(h1, "Transfer-Encoding") is None and header(h1, "Connection") != "x-saved" and
       h2["status"] == 500 and header(h2, "X-Injected") is None and
       header(h2, "Content-Type") == "application/problem+json" and h3["status"] == 201,
       "%s: a replay never sends a saved Content-Length, Transfer-Encoding or Connection; a saved "
       "header with CR LF is a 500" % name,
       [(a["status"], a["headers"], a["body"]) for a in (h1, h2, h3)])

    # what the driver left unknown on purpose is settled by hand
    db.execute("SELECT idem_resolve(key, 'failed', '{\"reason\": \"driver cleanup\"}', scope => scope)"
               " FROM idempotency_records WHERE status = 'unknown' AND key LIKE %s", (q + "%",))
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
