"""The checks of the hot-result cache (python/idem_cache.py), run by
driver.py against the Python service started with REDIS_URL and
IDEM_CACHE_TRACE=1 (its answers carry X-Cache: hit, miss or bypass).

What they show: replays are served from Redis, and no answer differs from
the database's, whatever happens to Redis.  A key reused with another body
gets 422 while the cache holds the key; a key in progress gets 409, never a
cached answer; an entry never outlives its record; a hung Redis costs a
socket timeout, not the answer; under duplicate load
while Redis is SIGKILLed, restarted and FLUSHALLed, every key has one
business effect and one answer; with Redis down the service answers from
the database alone.

Environment: REDIS_PORT, REDIS_DIR (redis.pid there), REDIS_START (a shell
command that starts redis-server in the foreground), IDEM_DSN_DIRECT."""
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import redis

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "python"))
import idem_cache  # noqa: E402  (the service's own cache key, to look at an entry)

PLAN = 16
RDB = redis.Redis(port=int(os.environ.get("REDIS_PORT", "0") or 0), socket_timeout=2)


def redis_kill():
    """SIGKILL the redis-server of REDIS_DIR/redis.pid, and wait until it is gone."""
    pid = int(open(os.path.join(os.environ["REDIS_DIR"], "redis.pid")).read())
    os.kill(pid, signal.SIGKILL)
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        try:
            if open("/proc/%d/stat" % pid).read().split(")")[-1].split()[0] == "Z":
                break   # a zombie of ours: gone for the clients
        except FileNotFoundError:
            break
        time.sleep(0.05)


def redis_signal(sig):
    os.kill(int(open(os.path.join(os.environ["REDIS_DIR"], "redis.pid")).read()), sig)


def redis_start():
    """Starts redis-server again (empty: no persistence) and waits for PING."""
    # its own session: the trap of test/clients/run stops it by its pid file
    subprocess.Popen(["bash", "-c", os.environ["REDIS_START"]], start_new_session=True,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        try:
            if RDB.ping():
                return
        except redis.RedisError:
            time.sleep(0.05)
    raise RuntimeError("redis-server did not start")


def entry_of(path, key, body):
    """The raw bytes driver.post sends give the service's cache key (its
    requests are in tenant t1 by default, the scope of the tenant's keys)."""
    return idem_cache.cache_key("idem:", path, key, json.dumps(body).encode(), scope="t1")


def cache(a):
    return a["headers"].get("X-Cache")


def same(a, b):
    return (a["status"], a["body"]) == (b["status"], b["body"])


def check(name, url, db, ok, post, burst, settle, final):
    pre = name + "-c-"
    obody = lambda k: {"sku": "C" + k[-3:], "qty": len(k)}
    stats = lambda: json.load(urllib.request.urlopen(url + "/cache", timeout=5))

    # 1. the owner's answer is copied after its COMMIT: the next send is a hit
    warm = k = pre + "warm"
    got = [post(url + "/orders", obody(k), k) for _ in range(3)]
    ok(got[0]["status"] == 201 and not got[0]["replayed"] and
       all(same(a, got[0]) and a["replayed"] and cache(a) == "hit" for a in got[1:]),
       "%s: a replay is served from the cache, equal to the first answer" % name,
       [(a["status"], cache(a), a["replayed"]) for a in got])

    # 2. the cache holds k: another body or endpoint with k still gets the database's 422
    other = [post(url + "/orders", dict(obody(k), qty=99), k), post(url + "/orders", {}, k),
             post(url + "/payments", obody(k), k)]
    again = post(url + "/orders", obody(k), k)
    ok(RDB.exists(entry_of("/orders", k, obody(k))) and
       all(a["status"] == 422 and cache(a) != "hit" for a in other) and
       cache(again) == "hit" and same(again, got[0]),
       "%s: a key the cache holds, reused with another body or endpoint, gets 422" % name,
       [(a["status"], cache(a)) for a in other + [again]])

    # 3. in progress: the driver owns the key (a committed claim, a live lease)
    k = pre + "held"
    row = db.execute("SELECT token FROM idem_claim(%s, idem_request_fingerprint('POST', '/orders', %s::jsonb), scope => 't1',"
                     " lease => '60 seconds')", (k, json.dumps(obody(k)))).fetchone()
    held = [post(url + "/orders", obody(k), k) for _ in range(4)]
    ok(all(a["status"] == 409 and "Retry-After" in a["headers"] and cache(a) != "hit" for a in held) and
       not RDB.exists(entry_of("/orders", k, obody(k))),
       "%s: a key in progress gets 409, never cached" % name, [(a["status"], cache(a)) for a in held])
    result = {"order_id": -1, "sku": "by the driver", "qty": 0}
    db.execute("SELECT idem_complete(%s, %s, %s::jsonb, 201, scope => 't1')", (k, row[0], json.dumps(result)))
    after = [post(url + "/orders", obody(k), k) for _ in range(3)]
    ok(all(a["status"] == 201 and a["body"] == result and a["replayed"] for a in after) and
       cache(after[0]) == "miss" and cache(after[-1]) == "hit" and
       not db.execute("SELECT 1 FROM orders WHERE idem_key = %s", (k,)).fetchall(),
       "%s: once completed, the database's replay, then the same from the cache" % name,
       [(a["status"], a["body"], cache(a)) for a in after])

    # 4. an entry never outlives its record: a record kept 3 seconds
    k = pre + "short"
    row = db.execute("SELECT token FROM idem_claim(%s, idem_request_fingerprint('POST', '/orders', %s::jsonb), scope => 't1',"
                     " retention => '3 seconds')", (k, json.dumps(obody(k)))).fetchone()
    db.execute("SELECT idem_complete(%s, %s, %s::jsonb, 201, scope => 't1')", (k, row[0], json.dumps(result)))
    first = [post(url + "/orders", obody(k), k) for _ in range(2)]
    pttl = RDB.pttl(entry_of("/orders", k, obody(k)))
    left = db.execute("SELECT extract(epoch FROM expires_at - clock_timestamp()) * 1000"
                      " FROM idempotency_records WHERE key = %s", (k,)).fetchone()[0]
    ok(cache(first[-1]) == "hit" and 0 < pttl < left,
       "%s: the entry's TTL is shorter than what the record has left" % name,
       {"pttl_ms": pttl, "record_left_ms": float(left), "answers": [cache(a) for a in first]})
    time.sleep(max(0.0, float(left) / 1000) + 0.2)
    later = post(url + "/orders", obody(k), k)
    rows = db.execute("SELECT count(*) FROM orders WHERE idem_key = %s", (k,)).fetchone()[0]
    ok(later["status"] == 201 and not later["replayed"] and cache(later) == "miss" and rows == 1,
       "%s: after the record expired, the key is new again, not a cached replay" % name,
       {"answer": (later["status"], later["body"], cache(later)), "rows": rows})

    # 5. a hung Redis (SIGSTOP): the socket timeout sends the request to the database
    redis_signal(signal.SIGSTOP)
    try:
        hung = [post(url + "/orders", obody(warm), warm, timeout=10) for _ in range(3)]
    finally:
        redis_signal(signal.SIGCONT)
    time.sleep(idem_cache.RETRY)    # the service's pause after a failure
    ok(all(same(a, got[0]) and a["replayed"] and cache(a) == "bypass" for a in hung),
       "%s: with Redis hung, replays come from the database, equal to the first answer" % name,
       [(a["status"], cache(a)) for a in hung])

    chaos(name, url, db, ok, post, settle, final, stats)
    redis_down(name, url, db, ok, post, burst, obody)


def chaos(name, url, db, ok, post, settle, final, stats):
    """Duplicate load for about 10 s while Redis is killed, restarted, flushed."""
    pre = name + "-x-"
    okeys = [pre + "order-%d" % i for i in range(30)]
    pkeys = [pre + "pay-%d" % i for i in range(12)]
    obody = lambda k: {"sku": "X" + k[-2:], "qty": int(k.rsplit("-", 1)[1]) + 1}
    amount = lambda k: 9500 if int(k.rsplit("-", 1)[1]) % 5 == 2 else 50 * (int(k.rsplit("-", 1)[1]) + 1)
    pbody = lambda k: {"amount": amount(k), "currency": "EUR"}
    body = lambda k: obody(k) if k in okeys else pbody(k)
    path = lambda k: "/orders" if k in okeys else "/payments"
    keys = okeys + pkeys
    random.Random(7).shuffle(keys)
    length = 10.0
    start_at = {k: i * 0.6 * length / len(keys) for i, k in enumerate(keys)}   # new keys keep coming
    answers = {k: [] for k in keys}
    reused = []
    lock = threading.Lock()
    # (time, phase): warm, down (killed), restarted, flushed, killed and restarted at once
    phases = [(0.0, "warm"), (2.0, "down"), (3.5, "restarted"), (5.5, "flushed"), (7.5, "rekilled")]
    t0 = time.monotonic()

    def worker(seed):
        rng = random.Random(seed)
        while time.monotonic() - t0 < length:
            now = time.monotonic() - t0
            k = rng.choice([k for k in keys if start_at[k] <= now])
            with lock:
                done = any(final(a) for a in answers[k])
            if done and rng.random() < 0.1:     # the key is finished: another body must get 422
                a = post(url + path(k), dict(body(k), note="other"), k, timeout=10)
                with lock:
                    reused.append(a)
            else:
                a = post(url + path(k), body(k), k, timeout=10)
                with lock:
                    answers[k].append(a)

    def chaos_monkey():
        for at, phase in phases[1:]:
            time.sleep(max(0.0, t0 + at - time.monotonic()))
            if phase in ("down", "rekilled"):
                redis_kill()
            if phase in ("restarted", "rekilled"):
                redis_start()
            if phase == "flushed":
                RDB.flushall()
    before = stats()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    threads.append(threading.Thread(target=chaos_monkey))
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    # settle: unknown payments reconciled, every key to a final answer
    settle(url + "/orders", {k: answers[k] for k in okeys}, obody)
    settle(url + "/payments", {k: answers[k] for k in pkeys}, pbody, until=(201, 402, 422, 202))
    # the reconciler takes unknown payments once RECONCILE_AFTER seconds old
    time.sleep(float(os.environ.get("RECONCILE_AFTER", "30")) + 0.5)
    retry = set()
    for _ in range(2):
        rec = post(url + "/reconcile", {}, tenant=None)
        # the provider knows a payment as tenant:key (the services' payment_id)
        retry |= {p.split(":", 1)[1] for p in (rec["body"].get("retry", []) if rec["status"] == 200 else [])}
        settle(url + "/payments", {k: answers[k] for k in pkeys}, pbody)
    after = stats()
    n = sum(map(len, answers.values()))
    print("# %s: %d requests under Redis kills and flushes, %d with another body; cache %s"
          % (name, n, len(reused), {s: after[s] - before[s] for s in after}), flush=True)

    rows = dict(db.execute("SELECT idem_key, count(*) FROM orders WHERE idem_key LIKE %s GROUP BY 1",
                           (pre + "%",)).fetchall())
    ok(all(rows.get(k) == 1 for k in okeys),
       "%s: under Redis kills and flushes, one order row per key" % name, rows)

    bad = {}
    for k, got in answers.items():
        fin = [a for a in got if final(a)]
        if not fin or any(not same(a, fin[0]) for a in fin) or \
                sum(not a["replayed"] for a in fin) > 1 or any(cache(a) == "hit" and not a["replayed"] for a in fin):
            bad[k] = [(a["status"], a["replayed"], cache(a)) for a in fin]
    ok(not bad, "%s: under Redis kills and flushes, every final answer equals the first, "
       "at most one not Idempotent-Replayed" % name, bad)

    ok(reused and all(a["status"] == 422 and cache(a) != "hit" for a in reused),
       "%s: under Redis kills and flushes, a finished key with another body gets 422 (%d)"
       % (name, len(reused)), [(a["status"], cache(a)) for a in reused])

    late = []
    for k, got in answers.items():
        done = min([a["got"] for a in got if final(a)] or [float("inf")])
        late += [k for a in got if a["status"] == 409 and (a["sent"] > done or cache(a) == "hit")]
    ok(not late, "%s: under Redis kills and flushes, 409 only while the first request runs" % name, late)

    def phase_of(t):
        return [p for at, p in phases if at <= t - t0][-1]
    seen = {p: {} for _, p in phases}
    for got in answers.values():
        for a in got:
            if a["got"] - t0 < length and phase_of(a["sent"]) == phase_of(a["got"]):
                c = seen[phase_of(a["sent"])]
                c[cache(a)] = c.get(cache(a), 0) + 1
    ok(all(seen[p].get("hit") for p in ("warm", "restarted", "flushed", "rekilled")) and
       seen["down"].get("bypass") and not seen["down"].get("hit"),
       "%s: the cache served replays before the kill, after each restart and after the flush, "
       "and was bypassed while down" % name, seen)
    print("# %s: X-Cache by phase %s" % (name, seen), flush=True)

    with urllib.request.urlopen(os.environ["PROVIDER_URL"] + "/stats") as r:
        pstats = json.load(r)
    declined = [k for k in pkeys if amount(k) >= 9000]
    prow = {k: (c, a) for k, c, a in db.execute(
        "SELECT idem_key, charge_id, amount FROM payments WHERE idem_key LIKE %s", (pre + "%",)).fetchall()}
    nrows = dict(db.execute("SELECT idem_key, count(*) FROM payments WHERE idem_key LIKE %s GROUP BY 1",
                            (pre + "%",)).fetchall())
    calls = {k: pstats["calls"].get("t1:" + k) for k in pkeys}
    expect = {k: 1 + (k in retry) for k in pkeys}
    ok(all(nrows.get(k, 0) == (k not in declined) for k in pkeys) and
       all(prow[k] == (pstats["charges"]["t1:" + k]["charge_id"], amount(k)) for k in prow) and
       all(answers[k][-1]["status"] == (402 if k in declined else 201) for k in pkeys) and
       calls == expect,
       "%s: under Redis kills and flushes, one charge and one payment row per key, "
       "the provider called once per attempt" % name,
       {"rows": nrows, "calls": calls, "expected": expect, "last": {k: answers[k][-1]["status"] for k in pkeys}})


def redis_down(name, url, db, ok, post, burst, obody):
    """Redis stopped: the database answers alone; then Redis is back."""
    pre = name + "-d-"
    keys = [pre + "order-%d" % i for i in range(6)]
    redis_kill()
    try:
        answers = burst(url + "/orders", keys, obody)
        for k in keys:
            answers[k] += [post(url + "/orders", obody(k), k) for _ in range(2)]
        other = [post(url + "/orders", dict(obody(k), qty=0), k) for k in keys]
    finally:
        redis_start()
    rows = dict(db.execute("SELECT idem_key, count(*) FROM orders WHERE idem_key LIKE %s GROUP BY 1",
                           (pre + "%",)).fetchall())
    bad = {}
    for k, got in answers.items():
        fin = [a for a in got if a["status"] not in (409, 202)]
        if rows.get(k) != 1 or not fin or any(not same(a, fin[0]) for a in fin) or \
                sum(not a["replayed"] for a in fin) != 1 or any(cache(a) == "hit" for a in got):
            bad[k] = [(a["status"], a["replayed"], cache(a)) for a in got]
    ok(not bad, "%s: with Redis down, one order per key and every replay equal, from the database" % name,
       {"rows": rows, "bad": bad})
    ok(all(a["status"] == 422 and cache(a) != "hit" for a in other),
       "%s: with Redis down, 422 for a key reused with another body" % name,
       [(a["status"], cache(a)) for a in other])
    # back: the service reconnects (after its pause of idem_cache.RETRY)
    k = keys[0]
    back = []
    for _ in range(50):
        back.append(post(url + "/orders", obody(k), k))
        if cache(back[-1]) == "hit":
            break
        time.sleep(0.1)
    first = [a for a in answers[k] if a["status"] not in (409, 202)][:1]
    ok(cache(back[-1]) == "hit" and first and all(same(a, first[0]) and a["replayed"] for a in back),
       "%s: once Redis is back, replays are served from the cache again" % name,
       [(a["status"], cache(a)) for a in back])

