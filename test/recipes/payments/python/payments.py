#!/usr/bin/env python3
"""POST /payments: a charge at a payment provider, at most once per
Idempotency-Key, with psycopg 3 behind PgBouncer in transaction mode.

  1. claim the key in autocommit: the claim commits alone, and no transaction
     stays open across the provider call;
  2. checkpoint 'provider-call', extending the lease past the call's timeout;
  3. call the provider outside any transaction, the key as its payment id;
  4. complete with the payment row in one transaction (201), fail on a
     refusal (4xx: saved and replayed), or mark unknown when no answer tells
     (202);
  5. a reconciler thread in every instance settles the unknown payments by
     asking the provider.
Environment: IDEM_DSN (libpq), PROVIDER_URL, PORT, PROVIDER_TIMEOUT (seconds,
5), RECONCILE_AFTER (30), RECONCILE_EVERY (10).  Table: ../schema.sql."""
import http.client
import json
import os
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psycopg
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

PROVIDER = os.environ["PROVIDER_URL"]
PROVIDER_TIMEOUT = float(os.environ.get("PROVIDER_TIMEOUT", "5"))
# The lease outlasts the provider call: until it runs out a retry gets 409,
# never a takeover that calls the provider while this call may still land.
LEASE = PROVIDER_TIMEOUT + 10
RECONCILE_AFTER = float(os.environ.get("RECONCILE_AFTER", "30"))
RECONCILE_EVERY = float(os.environ.get("RECONCILE_EVERY", "10"))
KEY = re.compile(r'^"([\x20\x21\x23-\x5b\x5d-\x7e]{1,255})"$')  # Idempotency-Key: "..."
# PgBouncer, transaction mode: prepare_threshold=None, or psycopg prepares a
# query on its 5th run on one server connection, and the next transaction
# may get another (42P05, 26000); autocommit: a statement is a transaction.
pool = ConnectionPool(os.environ["IDEM_DSN"], min_size=1, max_size=4,
                      kwargs={"prepare_threshold": None, "autocommit": True})


def provider(method, path, body=None):
    """(status, the JSON body or None).  Raises when no whole answer came
    within PROVIDER_TIMEOUT: then the charge may or may not exist."""
    req = urllib.request.Request(PROVIDER + path, method=method, headers={"Content-Type": "application/json"},
                                 data=json.dumps(body).encode() if body else None)
    try:
        with urllib.request.urlopen(req, timeout=PROVIDER_TIMEOUT) as r:
            status, data = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, data = e.code, e.read()
    try:
        return status, json.loads(data)
    except ValueError:
        return status, None


def charge_of(status, body):
    ok = status in (200, 201) and isinstance(body, dict) and isinstance(body.get("charge_id"), str)
    return body if ok else None


def pay(key, body):
    """(status, body, replayed) of POST /payments."""
    with pool.connection() as conn:
        outcome, token, code, saved = conn.execute(
            "SELECT outcome, token, response_code, coalesce(result, error)"
            "  FROM idem_claim(%s, idem_request_fingerprint('POST', '/payments', %s),"
            "                  lease => make_interval(secs => %s), scope => 'payments')",
            (key, Jsonb(body), LEASE)).fetchone()
        if outcome == "replay":
            return code, saved, True
        if outcome == "unknown":            # the reconciler settles it
            return 202, {"status": "pending"}, False
        if outcome == "in_progress":        # another request holds the lease
            return 409, {"error": "in progress"}, False
        # new, or takeover (a lease ran out, or the reconciler found no
        # charge): charging again under the same payment id is safe, since
        # the provider answers a repeated id with its first charge
        conn.execute("SELECT idem_checkpoint(%s, %s, 'provider-call', scope => 'payments',"
                     " extend_lease => make_interval(secs => %s))", (key, token, LEASE))
    try:    # no transaction open and no connection held meanwhile
        status, answer = provider("POST", "/charges", {"payment_id": key, "amount": body["amount"]})
    except (OSError, http.client.HTTPException):    # timeout, reset, half a body
        status, answer = None, None
    with pool.connection() as conn:
        if charge := charge_of(status, answer):
            result = {"payment_id": key, "charge_id": charge["charge_id"], "amount": charge["amount"]}
            with conn.transaction():    # the saved answer and the payment row commit together
                conn.execute("SELECT idem_complete(%s, %s, %s, 201, scope => 'payments')",
                             (key, token, Jsonb(result)))
                conn.execute("INSERT INTO charges (key, charge_id, amount) VALUES (%s, %s, %s)",
                             (key, charge["charge_id"], charge["amount"]))
            return 201, result, False
        if status is not None and 400 <= status < 500 and status != 429:
            # a refusal (402: declined): saved, so that a retry gets it again
            error = answer if isinstance(answer, dict) else {"error": "refused"}
            conn.execute("SELECT idem_fail(%s, %s, %s, retryable => false, scope => 'payments',"
                         " response_code => %s)", (key, token, Jsonb(error), status))
            return status, error, False
        # no answer, a 5xx or 429, a body that is no charge: it may have charged
        conn.execute("SELECT idem_mark_unknown(%s, %s, %s, scope => 'payments')",
                     (key, token, Jsonb({"provider_status": status})))
        return 202, {"status": "pending"}, False


def reconcile():
    """Settles the unknown payments older than RECONCILE_AFTER (a POST that
    timed out may land late) from the provider's records.  Every instance
    runs it: a second idem_resolve of a key waits for the first's
    transaction, then gets IK003 (so it comes before the INSERT)."""
    with pool.connection() as conn:
        keys = conn.execute("SELECT key FROM idempotency_records WHERE scope = 'payments'"
                            " AND status = 'unknown' AND recovery_point = 'provider-call'"
                            " AND updated_at < now() - make_interval(secs => %s)", (RECONCILE_AFTER,)).fetchall()
    for (key,) in keys:
        try:
            status, answer = provider("GET", "/charges/" + urllib.parse.quote(key, safe=""))
        except (OSError, http.client.HTTPException):
            continue                        # ask again next time
        try:
            with pool.connection() as conn, conn.transaction():
                if charge := charge_of(status, answer):   # it happened: save the answer, and it
                    result = {"payment_id": key, "charge_id": charge["charge_id"], "amount": charge["amount"]}
                    conn.execute("SELECT idem_resolve(%s, 'succeeded', %s, 201, 'payments')", (key, Jsonb(result)))
                    conn.execute("INSERT INTO charges (key, charge_id, amount) VALUES (%s, %s, %s)",
                                 (key, charge["charge_id"], charge["amount"]))
                elif status == 404:         # it did not: the client's retry charges
                    conn.execute("SELECT idem_resolve(%s, 'failed', '{\"error\": \"no charge\"}',"
                                 " scope => 'payments', retryable => true)", (key,))
                # anything else (a 5xx): left for the next run
        except psycopg.Error as e:
            if e.sqlstate != "IK003":       # IK003: another instance settled it first
                raise


def reconciler():
    while True:
        time.sleep(RECONCILE_EVERY)
        try:
            reconcile()
        except Exception as e:              # the database is away: next time
            print("reconcile:", e, flush=True)


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        key = KEY.match(self.headers.get("Idempotency-Key", ""))
        try:
            body = json.loads(data)
        except ValueError:
            body = None
        if self.path != "/payments":
            return self.send(404, {"error": "not found"})
        if not key or not isinstance(body, dict) or type(body.get("amount")) is not int:
            return self.send(400, {"error": 'send Idempotency-Key: "..." and {"amount": <int>}'})
        try:
            self.send(*pay(key.group(1), body))
        except psycopg.Error as e:
            if e.sqlstate == "IK001":       # the key came with another request
                self.send(422, {"error": "Idempotency-Key reused for another request"})
            elif e.sqlstate == "IK002":     # our lease ran out, another attempt took over
                self.send(409, {"error": "superseded"})
            else:
                self.send(500, {"error": e.sqlstate})

    def send(self, status, body, replayed=False):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if replayed:
            self.send_header("Idempotent-Replayed", "true")
        if status == 409:
            self.send_header("Retry-After", "1")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    threading.Thread(target=reconciler, daemon=True).start()
    ThreadingHTTPServer.request_queue_size = 64     # bursts of duplicates
    ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), Handler).serve_forever()
