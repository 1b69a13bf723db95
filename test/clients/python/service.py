#!/usr/bin/env python3
"""An HTTP API with the IETF "Idempotency-Key HTTP Header Field" draft on top
of the idempotency extension: the Python standard library's HTTP server and
psycopg 3, one connection per request (through PgBouncer).

  POST /orders     one transaction: claim, INSERT the order, complete, COMMIT
  POST /payments   multi-phase: claim (autocommit), checkpoint, call the
                   payment provider, then complete / fail, or mark unknown
  POST /reconcile  resolves unknown payments by asking the provider, once
                   they are RECONCILE_AFTER seconds old

An answer's headers (Location, Content-Type, X-Request-Id) are saved with its
status and body, and a replay sends them again.

Tenants: X-Tenant stands for the account an authenticated request belongs
to, and its keys live in the scope named by the tenant (one scope for all
endpoints: a key reused on another endpoint is a conflict, 422, not a second
intent).  Tenant isolation is on, and the service's role (api) is allowed
its tenants by idem_grant_tenant: every call names its scope as an argument,
so nothing is SET on a pooled connection, and the database refuses a tenant
the role is not allowed (42501, answered 403).  That is all the database
refuses: one role serves t1 and t2, so keeping t1 away from t2's keys is
this code's job, and X-Tenant must come from the request's authentication,
never from what the client says (per-tenant roles make the database do it:
README, "Tenant isolation").  The reconciler runs
as a role of kind global_reconciler (RECONCILE_DSN), which sees the unknown
records of every tenant.

Environment: IDEM_DSN, RECONCILE_DSN, PROVIDER_URL, PORT, RECONCILE_AFTER
(seconds, 30 by default).  Tables: test/clients/schema.sql.
With REDIS_URL, replays may be answered from Redis: idem_cache.py (its rules),
cached() below; GET /cache shows its counters, and IDEM_CACHE_TRACE=1 adds
an X-Cache header (hit, miss, bypass) for the tests."""
import json
import math
import os
import re
import sys
import time
import uuid
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

import idem_cache

DSN = os.environ["IDEM_DSN"]
RECONCILE_DSN = os.environ.get("RECONCILE_DSN", DSN)
PROVIDER = os.environ["PROVIDER_URL"]
BROKEN = os.environ.get("IDEM_CLIENTS_BREAK") == "1"  # tests only: skip the claim
CACHE = idem_cache.from_env()   # None without REDIS_URL
RECONCILE_AFTER = float(os.environ.get("RECONCILE_AFTER", "30"))
# The draft's key is an RFC 8941 sf-string.  Accepted: "..." of 1 to 255
# printable ASCII characters except " and \ (an sf-string with the escapes
# \" or \\ is refused with 400, not unescaped).
KEY = re.compile(r'^"([\x20\x21\x23-\x5b\x5d-\x7e]{1,255})"$')
TENANT = re.compile(r'^[a-z0-9][a-z0-9_-]{0,62}$')
# Both durations on the server's clock (no comparison with this host's).
CLAIM = """SELECT outcome, token, status, response_code, result, error, recovery_point, response_headers,
                  extract(epoch FROM lease_expires_at - clock_timestamp())::float8 AS lease_left,
                  extract(epoch FROM expires_at - clock_timestamp())::float8 AS expires_in
             FROM idem_claim(%s, idem_request_fingerprint('POST', %s, %s), lease => %s, scope => %s)"""
# The one 42501 that means "not your tenant": the claim's refusal of a scope
# (src/claim.c).  Any other 42501 (a missing grant) is the server's fault.
TENANT_REFUSED = re.compile(r'^scope ".*" does not belong to the tenant of this session$', re.S)
# Headers the server sets itself, for this connection and this body: never
# sent from a saved answer.  The extension refuses them in new records, but
# a record of an older version or edited by hand may have them.
OWN_HEADERS = {"content-length", "transfer-encoding", "connection", "keep-alive", "te", "trailer", "upgrade"}
HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
HEADER_VALUE = re.compile(r"^[\x20-\x7e\t]*$")


class Answer:
    """An HTTP answer: status, JSON body, headers.  kept_until: set only on a
    finished, committed answer, which the cache may keep until then."""
    def __init__(self, status, body, headers=None, ctype="application/json", kept_until=None):
        self.status, self.body, self.headers, self.ctype = status, body, headers or {}, ctype
        self.kept_until, self.trace = kept_until, None


def first_headers(location=None):
    """The headers of an answer that is saved: given again by every replay."""
    headers = {"Content-Type": "application/json", "X-Request-Id": str(uuid.uuid4())}
    if location:
        headers["Location"] = location
    return headers


def problem(status, title, detail, headers=None):
    """An RFC 7807 problem (its Content-Type is set by send)."""
    return Answer(status, {"type": "about:blank", "title": title, "status": status,
                           "detail": detail}, headers, "application/problem+json")


def connect(dsn=DSN):
    # prepare_threshold=None: psycopg otherwise turns a query run 5 times
    # into a named prepared statement ("_pg3_0") of one server connection.
    # Behind PgBouncer in transaction mode the next transaction may get
    # another server connection, which lacks it or already has one of that
    # name (42P05).  autocommit: each statement is its own transaction
    # unless inside conn.transaction().
    return psycopg.connect(dsn, prepare_threshold=None, autocommit=True, row_factory=dict_row)


def claim(conn, scope, key, path, body, lease=None):
    if BROKEN:
        return {"outcome": "new", "token": None, "kept_until": None}
    sent = time.monotonic()
    row = conn.execute(CLAIM, (key, path, Jsonb(body), lease, scope)).fetchone()
    row["kept_until"] = idem_cache.kept_until(sent, row["expires_in"])
    return row


def not_owner(row):
    """The answer for a claim that did not make us the owner."""
    if row["outcome"] == "replay":
        succeeded = row["status"] == "succeeded"
        code = row["response_code"]
        if code is None:    # saved without one (0.1.0 data, or no code passed)
            code = 200 if succeeded else 500
        return Answer(code, row["result"] if succeeded else row["error"],
                      dict(row["response_headers"] or {}, **{"Idempotent-Replayed": "true"}),
                      kept_until=row["kept_until"])
    if row["outcome"] == "unknown":
        return Answer(202, {"status": "pending", "detail": "being reconciled"})
    # in_progress: the first request is still running (lease_left is NULL
    # while the other claim is not committed)
    wait = 1
    if row["lease_left"] is not None:
        wait = max(1, math.ceil(row["lease_left"]))
    return problem(409, "Request in progress",
                   "A request with this Idempotency-Key is being processed; retry later.",
                   {"Retry-After": str(wait)})


def orders(tenant, key, body):
    scope = tenant
    with connect() as conn:
        with conn.transaction():
            row = claim(conn, scope, key, "/orders", body)
            if row["outcome"] not in ("new", "takeover"):
                return not_owner(row)
            order = conn.execute(
                "INSERT INTO orders (tenant, idem_key, sku, qty) VALUES (%s, %s, %s, %s) RETURNING id",
                (tenant, key, body.get("sku"), body.get("qty"))).fetchone()
            result = {"order_id": order["id"], "sku": body.get("sku"), "qty": body.get("qty")}
            headers = first_headers("/orders/%d" % order["id"])
            if not BROKEN:
                conn.execute("SELECT idem_complete(%s, %s, %s, 201, headers => %s, scope => %s)",
                             (key, row["token"], Jsonb(result), Jsonb(headers), scope))
        # committed: only now is the answer true
        return Answer(201, result, headers, kept_until=row["kept_until"])


def provider(method, path, body=None, timeout=1.0):
    """(status, the JSON body or None if it is not JSON).  Raises when no
    whole answer came: a timeout, a refused or closed connection, half a body."""
    req = urllib.request.Request(PROVIDER + path, method=method,
                                 data=json.dumps(body).encode() if body else None,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, data = resp.status, resp.read()
    except urllib.error.HTTPError as e:
        with e:
            status, data = e.code, e.read()
    try:
        return status, json.loads(data)
    except ValueError:
        return status, None


def is_charge(charge):
    return isinstance(charge, dict) and isinstance(charge.get("charge_id"), str) and \
        isinstance(charge.get("amount"), int)


def payment_id(tenant, key):
    """The provider's id of the payment: a key names an intent per tenant."""
    return tenant + ":" + key


def look_up(pid):
    """What the provider knows of a payment: ("charged", charge), ("none",
    None) for a definite 404, or ("unsure", None) for anything else (5xx,
    429, no answer, a body that is not a charge)."""
    try:
        status, charge = provider("GET", "/charges/" + urllib.parse.quote(pid, safe=""))
    except Exception:
        return "unsure", None
    if status == 200 and is_charge(charge):
        return "charged", charge
    return ("none", None) if status == 404 else ("unsure", None)


def payments(tenant, key, body):
    """A charge at the provider, once per key.  The claim and the lease keep
    two requests from charging at the same time; that the charge happens at
    most once also relies on the provider de-duplicating by payment_id (as
    real providers do by their idempotency key): a POST that timed out may
    still land after a takeover's, and the provider must answer both with
    the same charge."""
    scope = tenant
    pid = payment_id(tenant, key)
    with connect() as conn:
        row = claim(conn, scope, key, "/payments", body, "10 seconds")
        if row["outcome"] == "in_progress":
            # wait for the first request's answer, then claim again; beyond
            # idempotency.max_waiters idem_await answers at once (then 409)
            conn.execute("SELECT 1 FROM idem_await(%s, %s, '3 seconds')", (key, scope))
            row = claim(conn, scope, key, "/payments", body, "10 seconds")
        if row["outcome"] not in ("new", "takeover"):
            return not_owner(row)
        token = row["token"]
        status, charge = None, None
        if row["outcome"] == "takeover" and row.get("recovery_point") == "provider-call":
            # an earlier attempt may have charged: ask before charging again
            found, charge = look_up(pid)
            if found == "charged":
                status = 200
            elif found == "unsure":
                return unknown(conn, scope, key, token, "provider lookup failed")
        if status is None:
            if not BROKEN:
                conn.execute("SELECT idem_checkpoint(%s, %s, 'provider-call', extend_lease => '10 seconds',"
                             " scope => %s)", (key, token, scope))
            try:
                status, charge = provider("POST", "/charges", {"payment_id": pid, "amount": body.get("amount")})
            except Exception:
                # a timeout, a reset, a closed connection, half a body: the
                # charge may or may not have happened, never retry blindly
                return unknown(conn, scope, key, token, "no answer from the provider")
        if status in (200, 201) and is_charge(charge):  # 200: the charge of a repeated id
            return charged(conn, tenant, scope, key, token, charge, row["kept_until"])
        if 400 <= status < 500 and status != 429:
            # a definite refusal (402 a decline): saved, and replayed; a 429
            # (rate limit) is no refusal and goes on as unknown below
            error = charge if isinstance(charge, dict) else {"error": "refused by the provider"}
            headers = first_headers()
            if not BROKEN:
                conn.execute("SELECT idem_fail(%s, %s, %s, retryable => false, response_code => %s, "
                             "headers => %s, scope => %s)",
                             (key, token, Jsonb(error), status, Jsonb(headers), scope))
            return Answer(status, error, headers, kept_until=row["kept_until"])
        # 5xx, or an answer that is not a charge: maybe charged, maybe not
        return unknown(conn, scope, key, token, "provider answered %d" % status)


def unknown(conn, scope, key, token, reason):
    """The outcome is unknown: the reconciler settles it."""
    if not BROKEN:
        conn.execute("SELECT idem_mark_unknown(%s, %s, %s, scope => %s)",
                     (key, token, Jsonb({"reason": reason}), scope))
    return Answer(202, {"status": "pending", "detail": "being reconciled"})


def charged(conn, tenant, scope, key, token, charge, kept_until):
    """The charge happened: the payment row and the answer commit together."""
    result = {"payment_id": key, "charge_id": charge["charge_id"], "amount": charge["amount"]}
    headers = first_headers("/payments/" + charge["charge_id"])
    with conn.transaction():
        conn.execute("INSERT INTO payments (tenant, idem_key, charge_id, amount) VALUES (%s, %s, %s, %s)",
                     (tenant, key, charge["charge_id"], charge["amount"]))
        if not BROKEN:
            conn.execute("SELECT idem_complete(%s, %s, %s, 201, headers => %s, scope => %s)",
                         (key, token, Jsonb(result), Jsonb(headers), scope))
    return Answer(201, result, headers, kept_until=kept_until)


def reconcile():
    """Settles the unknown payments of every tenant from the provider's own
    records (as RECONCILE_DSN's role, a global_reconciler).  Only payments
    that reached the provider call, and only once RECONCILE_AFTER seconds
    passed: a POST that timed out may still land at the provider."""
    done = {"succeeded": [], "retry": [], "left": []}
    with connect(RECONCILE_DSN) as conn:
        unknown = conn.execute(
            "SELECT scope, key, split_part(scope, '/', 1) AS tenant FROM idempotency_records"
            " WHERE status = 'unknown' AND recovery_point = 'provider-call'"
            "   AND updated_at < now() - make_interval(secs => %s)", (RECONCILE_AFTER,)).fetchall()
        for scope, key, tenant in [(r["scope"], r["key"], r["tenant"]) for r in unknown]:
            pid = payment_id(tenant, key)
            found, charge = look_up(pid)
            if found == "unsure":   # a 5xx, no answer: ask again next time
                done["left"].append(pid)
                continue
            with conn.transaction():
                if found == "charged":  # it happened: save the effect and the answer
                    result = {"payment_id": key, "charge_id": charge["charge_id"],
                              "amount": charge["amount"]}
                    conn.execute("INSERT INTO payments (tenant, idem_key, charge_id, amount)"
                                 " VALUES (%s, %s, %s, %s)", (tenant, key, charge["charge_id"], charge["amount"]))
                    conn.execute("SELECT idem_resolve(%s, 'succeeded', %s, 201, headers => %s, scope => %s)",
                                 (key, Jsonb(result),
                                  Jsonb(first_headers("/payments/" + charge["charge_id"])), scope))
                    done["succeeded"].append(pid)
                else:                   # a definite 404: the next request does the work
                    conn.execute("SELECT idem_resolve(%s, 'failed', %s, retryable => true, scope => %s)",
                                 (key, Jsonb({"reason": "no charge at the provider"}), scope))
                    done["retry"].append(pid)
    return Answer(200, done)


def cached(endpoint, tenant, path, key, raw, body):
    """The endpoint's answer, or its replay from the cache (idem_cache.py).
    The endpoint returns after its COMMIT, its connection closed: only then
    is a finished answer (kept_until set) copied to the cache."""
    ckey = CACHE.key(tenant, path, key, raw)
    entry, state = CACHE.get(ckey)
    if entry:
        a = Answer(entry["status"], entry["body"], entry["headers"], entry["ctype"])
    else:
        a = endpoint(tenant, key, body)
        if a.kept_until is not None:
            CACHE.fill(ckey, a.status, a.body, a.headers, a.ctype, a.kept_until)
    a.trace = state
    return a


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # TCP_NODELAY: the headers and the body are two writes; on a keep-alive
    # connection Nagle would hold the body until the client's delayed ACK (40 ms)
    disable_nagle_algorithm = True

    def log_message(self, *args):
        pass

    def do_POST(self):
        try:
            answer = self.handle_post()
        except psycopg.Error as e:
            if e.sqlstate == "IK001":   # the key was used for another request
                answer = problem(422, "Idempotency-Key reused",
                                 "This Idempotency-Key was used for a different request.")
            elif e.sqlstate == "42501" and TENANT_REFUSED.match(e.diag.message_primary or ""):
                # the claim refused the tenant: the role is not allowed it
                answer = problem(403, "Forbidden", "This account may not use this tenant.")
            elif e.sqlstate == "IK002":
                # Our lease ran out and another request took the key over: it
                # owns the work now, and a retry gets its answer.
                answer = problem(409, "Request superseded",
                                 "Another attempt with this Idempotency-Key took over; retry later.",
                                 {"Retry-After": "1"})
            else:
                answer = problem(500, "Internal Server Error", e.sqlstate or "database error")
        except Exception as e:      # a bug: answer, and keep serving
            print("service: %r" % e, file=sys.stderr, flush=True)
            answer = problem(500, "Internal Server Error", "error")
        self.send(answer)

    def handle_post(self):
        data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path == "/reconcile":
            return reconcile()
        if self.path not in ("/orders", "/payments"):
            return problem(404, "Not Found", self.path)
        tenant = self.headers.get("X-Tenant", "")
        if not TENANT.match(tenant):
            return problem(400, "X-Tenant missing or malformed", "Send X-Tenant: <account>.")
        m = KEY.match(self.headers.get("Idempotency-Key", ""))
        if not m:
            return problem(400, "Idempotency-Key missing or malformed",
                           'Send Idempotency-Key: "<1 to 255 printable characters, no quote or backslash>".')
        try:
            body = json.loads(data)
        except ValueError:
            return problem(400, "Bad Request", "The body is not JSON.")
        endpoint = orders if self.path == "/orders" else payments
        if CACHE is None:
            return endpoint(tenant, m.group(1), body)
        return cached(endpoint, tenant, self.path, m.group(1), data, body)

    def do_GET(self):
        if CACHE is None:   # as without this method
            return self.send_error(501, "Unsupported method ('GET')")
        if self.path == "/cache":
            with CACHE.lock:
                return self.send(Answer(200, dict(CACHE.stats)))
        self.send(problem(404, "Not Found", self.path))

    def send(self, a):
        headers = [(name, v) for name, value in a.headers.items() if name.lower() not in OWN_HEADERS
                   for v in (value if isinstance(value, list) else [value])]
        if not all(HEADER_NAME.match(n) and isinstance(v, str) and HEADER_VALUE.match(v) for n, v in headers):
            # http.server sends a CR LF in a value as it is, which would split
            # the answer: a saved header that is not valid HTTP is a 500
            a, headers = problem(500, "Internal Server Error", "invalid saved answer"), []
        data = json.dumps(a.body).encode()
        self.send_response(a.status)
        if not any(n.lower() == "content-type" for n, _ in headers):
            self.send_header("Content-Type", a.ctype)
        self.send_header("Content-Length", str(len(data)))
        for name, v in headers:
            self.send_header(name, v)
        if a.trace and CACHE is not None and CACHE.trace:
            self.send_header("X-Cache", a.trace)
        self.end_headers()
        self.wfile.write(data)


if __name__ == "__main__":
    ThreadingHTTPServer.request_queue_size = 128  # listen backlog: bursts of duplicates
    server = ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), Handler)
    server.daemon_threads = True
    server.serve_forever()
