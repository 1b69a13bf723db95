#!/usr/bin/env python3
"""A fake payment provider on 127.0.0.1 for test/clients: charges at most once
per payment id, declines amounts of 9000 and more, and on a first call times
out sometimes (seeded): it decides (charge or not, half each), then answers
only after PROVIDER_DELAY seconds (2.5, or the environment's PROVIDER_DELAY),
longer than the services wait.

A payment id whose last "."-separated part is a marker gets that behaviour
instead, always (no random timeout):
  ok       as usual
  post503  POST charges, then answers 503 (a charge may hide behind a 5xx)
  get503   as post503, and every GET of it answers 503
  garbage  POST charges, then answers 201 with a body that is not JSON
  hangup   POST charges, then closes the connection without an answer
  cutoff   POST charges, then sends half its body and closes the connection
  bad400   POST answers 400 (a refusal), charges nothing
  slow     the first POST charges, then answers only after PROVIDER_DELAY
  lost     the first POST charges nothing, and answers only after
           PROVIDER_DELAY (the request was lost); later ones as usual

  POST /charges  {"payment_id": ..., "amount": ...}  201 {"charge_id", "amount"},
                 200 for a repeated id (the same charge), 402 for a decline
                 (it de-duplicates by payment id, as real providers do by
                 their idempotency key: the services rely on it)
  GET  /charges/<payment_id>                        200 the charge, or 404
  GET  /stats                                       {"calls": {id: n}, "charges": {id: charge}}

Usage: fake_provider.py PORT [SEED]"""
import json
import os
import random
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SEED = sys.argv[2] if len(sys.argv) > 2 else "1"
TIMEOUT_RATE = 0.3
PROVIDER_DELAY = float(os.environ.get("PROVIDER_DELAY", "2.5"))
MARKERS = {"ok", "post503", "get503", "garbage", "hangup", "cutoff", "bad400", "slow", "lost"}
lock = threading.Lock()
calls = {}      # payment id -> number of POST /charges
charges = {}    # payment id -> {"charge_id", "amount"}


def marker(pid):
    m = pid.rsplit(".", 1)[-1]
    return m if "." in pid and m in MARKERS else None


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def send(self, status, body):
        self.send_raw(status, json.dumps(body).encode())

    def send_raw(self, status, data, ctype="application/json"):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/stats":
            with lock:
                return self.send(200, {"calls": calls, "charges": charges})
        if self.path.startswith("/charges/"):
            pid = urllib.parse.unquote(self.path[len("/charges/"):])
            if marker(pid) == "get503":
                return self.send(503, {"error": "unavailable"})
            with lock:
                charge = charges.get(pid)
            return self.send(200, charge) if charge else self.send(404, {"error": "no such charge"})
        self.send(404, {"error": "not found"})

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        pid, amount = req["payment_id"], req["amount"]
        mark = marker(pid)
        with lock:
            calls[pid] = n = calls.get(pid, 0) + 1
            if mark == "bad400":
                status, body = 400, {"error": "invalid_request"}
            elif mark == "lost" and n == 1:
                status, body = 504, {"error": "lost"}
            elif pid in charges:
                status, body = 200, charges[pid]
            elif amount >= 9000:
                status, body = 402, {"decline_code": "insufficient_funds"}
            else:
                status, body = 201, {"charge_id": "ch_%d" % (len(charges) + 1), "amount": amount}
            rng = random.Random("%s:%s:%d" % (SEED, pid, n))
            timeout = mark is None and n == 1 and status != 402 and rng.random() < TIMEOUT_RATE
            charge = random.Random("%s:%s:charge" % (SEED, pid)).random() < 0.5
            if mark in ("slow", "lost") and n == 1:
                timeout = charge = True   # a lost request's status is no charge
            if status == 201 and (not timeout or charge):
                charges[pid] = body
        if timeout:
            time.sleep(PROVIDER_DELAY)    # the caller has given up by now
        try:
            if mark in ("post503", "get503"):
                self.send(503, {"error": "unavailable"})
            elif mark == "garbage":
                self.send_raw(201, b"<html>Service Temporarily Overloaded</html>", "text/html")
            elif mark == "hangup":
                self.close_connection = True    # no status line: the caller sees the socket close
            elif mark == "cutoff":
                data = json.dumps(body).encode()
                self.send_response(201)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data[:len(data) // 2])
                self.close_connection = True
            else:
                self.send(status, body)
        except BrokenPipeError:
            pass                          # it had given up


if __name__ == "__main__":
    ThreadingHTTPServer.request_queue_size = 128  # listen backlog: bursts of duplicates
    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
    server.daemon_threads = True
    server.serve_forever()
