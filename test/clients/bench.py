#!/usr/bin/env python3
"""Replay throughput of the Python service without and with the Redis cache
(test/clients/run --bench runs it): KEYS finished orders per service, then
CLIENTS processes, each on one keep-alive connection, replay random ones of
them for SECONDS; requests/s and latencies per variant, and every answer
checked (201, Idempotent-Replayed, the first answer's body).  A third run
replays through the cached service with Redis stopped (the bypass).
Usage: bench.py python=URL pycache=URL  (env BENCH_SECONDS, BENCH_CLIENTS)"""
import http.client
import json
import multiprocessing
import os
import random
import sys
import time
import urllib.parse

import cache_checks

KEYS = 200
SECONDS = float(os.environ.get("BENCH_SECONDS", "5"))
CLIENTS = int(os.environ.get("BENCH_CLIENTS", "4"))


def request(conn, key, body):
    conn.request("POST", "/orders", body=json.dumps(body),
                 headers={"Content-Type": "application/json", "X-Tenant": "t1",
                          "Idempotency-Key": '"%s"' % key})
    r = conn.getresponse()
    return r.status, r.getheader("Idempotent-Replayed"), r.getheader("X-Cache"), json.loads(r.read())


def client(args):
    url, keys, seed = args
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    rng = random.Random(seed)
    lat, bad, hits = [], 0, 0
    stop = time.monotonic() + SECONDS
    while time.monotonic() < stop:
        key, body, first = rng.choice(keys)
        t = time.monotonic()
        try:
            status, replayed, xcache, got = request(conn, key, body)
        except (OSError, http.client.HTTPException):
            conn.close()
            conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
            bad += 1
            continue
        lat.append(time.monotonic() - t)
        bad += not (status == 201 and replayed == "true" and got == first)
        hits += xcache == "hit"
    conn.close()
    return lat, bad, hits


def prepare(url, prefix):
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    keys = []
    for i in range(KEYS):
        key, body = "%s-%d" % (prefix, i), {"sku": "B%d" % i, "qty": 1 + i % 5}
        status, _, _, first = request(conn, key, body)
        assert status == 201, (key, status, first)
        keys.append((key, body, first))
    conn.close()
    return keys


def run(label, url, keys):
    with multiprocessing.Pool(CLIENTS) as pool:
        results = pool.map(client, [(url, keys, i) for i in range(CLIENTS)])
    lat = sorted(x for r in results for x in r[0])
    bad, hits = sum(r[1] for r in results), sum(r[2] for r in results)
    n = len(lat)
    print("%-28s %7.0f replays/s  p50 %5.1f ms  p99 %5.1f ms  %6d replays, %d from Redis, %d wrong"
          % (label, n / SECONDS, 1000 * lat[n // 2], 1000 * lat[int(n * 0.99)], n, hits, bad), flush=True)
    return bad


def main():
    urls = dict(a.split("=", 1) for a in sys.argv[1:])
    print("# %d finished keys per service, %d clients with keep-alive, %.0f s each"
          % (KEYS, CLIENTS, SECONDS), flush=True)
    plain = prepare(urls["python"], "bench-python")
    cached = prepare(urls["pycache"], "bench-pycache")
    bad = run("without the cache", urls["python"], plain)
    bad += run("with the cache (Redis)", urls["pycache"], cached)
    cache_checks.redis_kill()
    try:
        bad += run("with the cache, Redis down", urls["pycache"], cached)
    finally:
        cache_checks.redis_start()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
