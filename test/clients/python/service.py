#!/usr/bin/env python3
"""An HTTP API with the IETF "Idempotency-Key HTTP Header Field" draft on top
of the idempotency extension: the Python standard library's HTTP server and
psycopg 3, one connection per request (through PgBouncer).

  POST /orders     one transaction: claim, INSERT the order, complete, COMMIT
  POST /payments   multi-phase: claim (autocommit), checkpoint, call the
                   payment provider, then complete / fail, or mark unknown
  POST /reconcile  resolves unknown payments by asking the provider

An answer's headers (Location, Content-Type, X-Request-Id) are saved with its
status and body, and a replay sends them again.

Tenants: X-Tenant stands for the account an authenticated request belongs
to, and its keys live in the scope named by the tenant (one scope for all
endpoints: a key reused on another endpoint is a conflict, 422, not a second
intent).  Tenant isolation is on, and the service's role (api) is allowed
its tenants by idem_grant_tenant: every call names its scope as an argument,
so nothing is SET on a pooled connection, and the database refuses a tenant
the role is not allowed (42501, answered 403).  The reconciler runs
as a role of kind global_reconciler (RECONCILE_DSN), which sees the unknown
records of every tenant.

Environment: IDEM_DSN, RECONCILE_DSN, PROVIDER_URL, PORT.  Tables: test/clients/schema.sql.
With REDIS_URL, replays may be answered from Redis: idem_cache.py (its rules),
cached() below; GET /cache shows its counters, and IDEM_CACHE_TRACE=1 adds
an X-Cache header (hit, miss, bypass) for the tests."""
import json
import math
import os
import re
import time
import uuid
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime, timezone
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
# The draft's key is an RFC 8941 sf-string: "..." of printable ASCII.
KEY = re.compile(r'^"([\x20\x21\x23-\x5b\x5d-\x7e]{1,255})"$')
TENANT = re.compile(r'^[a-z0-9][a-z0-9_-]{0,62}$')
CLAIM = """SELECT outcome, token, status, response_code, result, error, lease_expires_at,
                  response_headers, extract(epoch FROM expires_at - clock_timestamp())::float8 AS expires_in
             FROM idem_claim(%s, idem_request_fingerprint('POST', %s, %s), lease => %s, scope => %s)"""


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
        body = row["result"] if row["status"] == "succeeded" else row["error"]
        return Answer(row["response_code"], body,
                      dict(row["response_headers"] or {}, **{"Idempotent-Replayed": "true"}),
                      kept_until=row["kept_until"])
    if row["outcome"] == "unknown":
        return Answer(202, {"status": "pending", "detail": "being reconciled"})
    # in_progress: the first request is still running
    wait = 1
    if row["lease_expires_at"]:
        left = (row["lease_expires_at"] - datetime.now(timezone.utc)).total_seconds()
        wait = max(1, math.ceil(left))
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
    req = urllib.request.Request(PROVIDER + path, method=method,
                                 data=json.dumps(body).encode() if body else None,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def payment_id(tenant, key):
    """The provider's id of the payment: a key names an intent per tenant."""
    return tenant + ":" + key


def payments(tenant, key, body):
    scope = tenant
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
        if not BROKEN:
            conn.execute("SELECT idem_checkpoint(%s, %s, 'provider-call', extend_lease => '10 seconds',"
                         " scope => %s)", (key, token, scope))
        try:
            status, charge = provider("POST", "/charges", {"payment_id": payment_id(tenant, key),
                                                           "amount": body.get("amount")})
        except (TimeoutError, urllib.error.URLError):
            # the charge may or may not have happened: never retry blindly
            if not BROKEN:
                conn.execute("SELECT idem_mark_unknown(%s, %s, %s, scope => %s)",
                             (key, token, Jsonb({"reason": "provider timeout"}), scope))
            return Answer(202, {"status": "pending", "detail": "being reconciled"})
        if status == 402:
            headers = first_headers()
            if not BROKEN:
                conn.execute("SELECT idem_fail(%s, %s, %s, retryable => false, response_code => 402, "
                             "headers => %s, scope => %s)", (key, token, Jsonb(charge), Jsonb(headers), scope))
            return Answer(402, charge, headers, kept_until=row["kept_until"])
        result = {"payment_id": key, "charge_id": charge["charge_id"], "amount": charge["amount"]}
        headers = first_headers("/payments/" + charge["charge_id"])
        with conn.transaction():
            conn.execute("INSERT INTO payments (tenant, idem_key, charge_id, amount) VALUES (%s, %s, %s, %s)",
                         (tenant, key, charge["charge_id"], charge["amount"]))
            if not BROKEN:
                conn.execute("SELECT idem_complete(%s, %s, %s, 201, headers => %s, scope => %s)",
                             (key, token, Jsonb(result), Jsonb(headers), scope))
        return Answer(201, result, headers, kept_until=row["kept_until"])


def reconcile():
    """Settles every tenant's unknown payments from the provider's own
    records (as RECONCILE_DSN's role, a global_reconciler)."""
    done = {"succeeded": [], "retry": []}
    with connect(RECONCILE_DSN) as conn:
        unknown = conn.execute("SELECT scope, key FROM idempotency_records WHERE status = 'unknown'").fetchall()
        for scope, key in [(r["scope"], r["key"]) for r in unknown]:
            tenant = scope
            pid = payment_id(tenant, key)
            status, charge = provider("GET", "/charges/" + urllib.parse.quote(pid, safe=""))
            with conn.transaction():
                if status == 200:   # it happened: save the effect and the answer
                    result = {"payment_id": key, "charge_id": charge["charge_id"],
                              "amount": charge["amount"]}
                    conn.execute("INSERT INTO payments (tenant, idem_key, charge_id, amount)"
                                 " VALUES (%s, %s, %s, %s)", (tenant, key, charge["charge_id"], charge["amount"]))
                    conn.execute("SELECT idem_resolve(%s, 'succeeded', %s, 201, headers => %s, scope => %s)",
                                 (key, Jsonb(result),
                                  Jsonb(first_headers("/payments/" + charge["charge_id"])), scope))
                    done["succeeded"].append(pid)
                else:               # it did not: the next request does the work
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
            elif e.sqlstate == "42501":
                # the database refused the tenant: the role is not allowed it
                answer = problem(403, "Forbidden", "This account may not use this tenant.")
            elif e.sqlstate == "IK002":
                # Our lease ran out and another request took the key over: it
                # owns the work now, and a retry gets its answer.
                answer = problem(409, "Request superseded",
                                 "Another attempt with this Idempotency-Key took over; retry later.",
                                 {"Retry-After": "1"})
            else:
                answer = problem(500, "Internal Server Error", e.sqlstate or "database error")
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
                           'Send Idempotency-Key: "<1 to 255 printable characters>".')
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
        data = json.dumps(a.body).encode()
        self.send_response(a.status)
        if "Content-Type" not in a.headers:
            self.send_header("Content-Type", a.ctype)
        self.send_header("Content-Length", str(len(data)))
        for name, value in a.headers.items():
            for v in value if isinstance(value, list) else [value]:
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
