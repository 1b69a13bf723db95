"""A hot-result cache in Redis for the replays of service.py, on when
REDIS_URL is set (redis://127.0.0.1:PORT/0).  Without it service.py never
imports redis and behaves as without this file.

The database stays the only source of truth.  The cache holds copies of
finished answers and may lose them at any moment (TTL, FLUSHALL, a restart,
a dead server): a miss always goes to the database, which answers as if
there were no cache.  These rules keep a hit from ever saying what the
database would not:

1. Only finished outcomes, only after they committed.  service.py marks an
   answer cacheable (Answer.kept_until) only for the owner's answer of a
   committed completion (201 after COMMIT returned; a non-retryable 402 from
   idem_fail in autocommit) and for a `replay` read from the database; it
   fills after the endpoint function returned, when its transaction block
   and its connection are closed, so a fill cannot happen inside the
   transaction.  Never cached: 409 (in progress, or a superseded owner),
   202 (unknown), 422, 4xx/5xx errors, and retryable failures, which the
   service never answers with (the next claim is a takeover that redoes the
   work).  A finished record does not change until it expires, so neither
   does its answer; nothing ever fills a key that is in progress.

2. The cache key binds the whole request, not just the Idempotency-Key: the
   SHA-256 of (scope, method, path, key, the body's raw bytes).  The
   database's fingerprint (idem_request_fingerprint) hashes the canonical
   jsonb text; computing that here would mean reproducing jsonb's key order
   and number forms exactly, and asking the database for it costs the round
   trip the cache is there to save.  The raw bytes are exact in the one
   direction that matters: two requests with the same bytes parse to the
   same body, so the database gives them the same fingerprint and the same
   replay.  Any other request (another body, another endpoint, or even the
   same JSON spaced differently) has another cache key, misses, and is
   answered by the database: 422 for a different request, a replay for an
   equal one.  A cached entry for key K therefore never answers a request
   with K and another body.

3. TTL = min(IDEM_CACHE_TTL, the record's remaining retention - MARGIN).
   The remaining retention is the claim's expires_at - clock_timestamp(), a
   duration on the server's clock (no clock comparison between hosts),
   counted from just before the claim was sent (kept_until below), which
   can only make it shorter.  Finishing a record only moves expires_at
   later.  So every entry expires before its record does: the cache never
   answers for a key that the database has forgotten (and would claim as
   new, possibly for another request).  A record deleted by hand before its
   expiry is still answered from the cache for at most IDEM_CACHE_TTL, and
   so are a tenant's replays after idem_revoke_tenant took the tenant from
   the service's role (a hit never asks the database); delete the entries
   too (FLUSHALL), or keep the TTL short.

4. Redis failures (refused, timeout, a reset, a garbled entry) bypass the
   cache: the request goes to the database.  Socket timeouts are short
   (IDEM_CACHE_TIMEOUT, 0.1 s) so a hung Redis costs a request at most that
   much, and after a failure the cache is skipped for RETRY seconds, then
   tried again (redis-py's pool reconnects)."""
import hashlib
import json
import os
import struct
import sys
import threading
import time

MARGIN = 1.0    # seconds: Redis counts the TTL from its receipt of the SET
RETRY = 1.0     # seconds without Redis after a failure


def kept_until(sent, expires_in):
    """The monotonic time until which the answer of a claim sent at `sent`
    (time.monotonic()) stays true: its record lives at least that long."""
    return None if expires_in is None else sent + float(expires_in)


def cache_key(prefix, path, idem_key, raw, scope="", method="POST"):
    """Rule 2: the cache key of one exact request (length-prefixed fields, so
    that no two different requests hash the same input)."""
    h = hashlib.sha256(b"idem-cache-1")
    for part in (scope.encode(), method.encode(), path.encode(), idem_key.encode(), raw):
        h.update(struct.pack(">I", len(part)))
        h.update(part)
    return prefix + h.hexdigest()


class Cache:
    def __init__(self, url, ttl, timeout, prefix="idem:", trace=False):
        import redis    # python3-redis; only when the cache is on
        from redis.backoff import NoBackoff
        from redis.retry import Retry
        # No retries: redis-py 6 (Debian 13) retries 3 times with 1 to 10 s
        # of backoff by default, which would stall a request on a dead Redis.
        self.client = redis.Redis.from_url(url, socket_timeout=timeout,
                                           socket_connect_timeout=timeout,
                                           retry_on_timeout=False, retry=Retry(NoBackoff(), 0))
        self.ttl, self.prefix, self.trace = ttl, prefix, trace
        self.lock = threading.Lock()
        self.down_until = 0.0
        self.stats = {"hits": 0, "misses": 0, "fills": 0, "errors": 0, "bypassed": 0}

    def count(self, what):
        with self.lock:
            self.stats[what] += 1

    def failed(self, what, e):
        with self.lock:
            self.stats["errors"] += 1
            first = self.down_until == 0.0
            self.down_until = time.monotonic() + RETRY
        if first:
            print("idem_cache: %s failed (%s); bypassing Redis" % (what, e), file=sys.stderr, flush=True)

    def key(self, scope, path, idem_key, raw):
        return cache_key(self.prefix, path, idem_key, raw, scope=scope)

    def get(self, ckey):
        """(entry or None, "hit" | "miss" | "bypass")."""
        if time.monotonic() < self.down_until:
            self.count("bypassed")
            return None, "bypass"
        try:
            data = self.client.get(ckey)
            entry = json.loads(data) if data is not None else None
            # an entry names its own key: a reply read on a confused
            # connection could otherwise answer for another request
            if entry is not None and (entry.get("v") != 1 or entry.get("key") != ckey):
                entry = None
        except Exception as e:      # rule 4: whatever went wrong, the database answers
            self.failed("GET", e)
            return None, "bypass"
        with self.lock:
            self.down_until = 0.0
        self.count("hits" if entry else "misses")
        return entry, "hit" if entry else "miss"

    def fill(self, ckey, status, body, headers, ctype, until):
        """Saves a finished answer (rule 1: the caller has committed) as its
        replay, for at most the life its record has left (rule 3)."""
        ms = int(min(self.ttl, until - time.monotonic() - MARGIN) * 1000)
        if ms <= 0 or time.monotonic() < self.down_until:
            return
        entry = {"v": 1, "key": ckey, "status": status, "body": body, "ctype": ctype,
                 "headers": dict(headers, **{"Idempotent-Replayed": "true"})}
        try:
            self.client.set(ckey, json.dumps(entry), px=ms)
        except Exception as e:
            self.failed("SET", e)
            return
        self.count("fills")


def from_env():
    """The cache configured by the environment, or None when REDIS_URL is unset."""
    url = os.environ.get("REDIS_URL")
    if not url:
        return None
    return Cache(url, ttl=float(os.environ.get("IDEM_CACHE_TTL", "300")),
                 timeout=float(os.environ.get("IDEM_CACHE_TIMEOUT", "0.1")),
                 prefix=os.environ.get("IDEM_CACHE_PREFIX", "idem:"),
                 trace=os.environ.get("IDEM_CACHE_TRACE") == "1")
