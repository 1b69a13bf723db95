#!/usr/bin/python3
"""The reference outbox relay: PostgreSQL (psycopg 3) to RabbitMQ (pika).

    relay.py NAME DSN AMQP_PORT QUEUES LEASE_SECONDS LOG [STALL_SECONDS]

It LISTENs on idem_outbox, claims batches of 100, publishes each message
with publisher confirms (persistent, mandatory) to the queue of its key
(crc32(key) % QUEUES, so that one key always goes to one queue), and acks
the batch once the broker confirmed every message.  What it does:

  - a broker that refuses a message (a nack, or no queue for it): the
    message is nacked, with the broker's answer, and backs off, and so are
    the later messages of its key in the batch, unpublished (a queue that
    comes back between two publications must not get the second first);
  - the broker unreachable, or the connection lost: the batch is dropped
    unacked and the relay reconnects; the leases run out and a relay takes
    the messages over (published again: the consumer's inbox drops the copy);
  - the database connection lost: the same, after reconnecting;
  - an ack refused with IK002: the lease ran out and another relay took the
    batch over; this relay's publications were copies, and it goes on.

Every claim, ack and refused ack is written to LOG as a line
"claim|ack|stale TOKEN COUNT IDS..." for the test's checks.  STALL_SECONDS
(for the test only): once, between publishing a batch and acking it, the
relay sleeps that long, like a relay in a long GC pause, so that its lease
runs out and another relay takes the batch over.
"""
import json
import select
import sys
import time
import zlib

import pika
import psycopg
import psycopg.types.json

name, dsn, amqp_port, queues, lease, log_path = sys.argv[1:7]
queues, lease = int(queues), float(lease)
stall = [float(sys.argv[7])] if len(sys.argv) > 7 else []
log = open(log_path, "a", buffering=1)


def queue_of(key):
    return "e2e.%d" % (zlib.crc32(key.encode()) % queues)


def connect_broker():
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", int(amqp_port), heartbeat=10, blocked_connection_timeout=10,
        connection_attempts=1, socket_timeout=5))
    ch = conn.channel()
    ch.confirm_delivery()
    for q in range(queues):
        ch.queue_declare("e2e.%d" % q, durable=True, arguments={"x-single-active-consumer": True})
    return conn, ch


def connect_db():
    db = psycopg.connect(dsn, autocommit=True, application_name="e2e-relay-" + name)
    db.execute("LISTEN idem_outbox")
    return db


def wait_for_emit(db, timeout):
    """Sleep until a NOTIFY idem_outbox arrives, or timeout."""
    pg = db.pgconn
    if select.select([pg.socket], [], [], timeout)[0]:
        pg.consume_input()
        while pg.notifies() is not None:
            pass


def relay_batch(db, ch):
    rows = db.execute(
        "SELECT id, aggregatetype, aggregateid, type, payload, headers, token"
        " FROM idem_outbox_claim(%s, 100, make_interval(secs => %s))", (name, lease)).fetchall()
    if not rows:
        return 0
    token = rows[0][6]
    log.write("claim %d %d %s\n" % (token, len(rows), " ".join(str(r[0]) for r in rows)))
    published = []
    refused = set()   # (topic, key): per key order, nothing goes after a refused message
    for (mid, topic, key, mtype, payload, headers, _) in rows:
        if (topic, key) in refused:
            db.execute("SELECT idem_outbox_nack(%s, %s, %s)",
                       (mid, token, psycopg.types.json.Jsonb({"error": "an earlier message of its key was refused"})))
            continue
        try:
            ch.basic_publish(
                "", queue_of(key), json.dumps(payload).encode(),
                pika.BasicProperties(message_id=str(mid), type=mtype, delivery_mode=2,
                                     content_type="application/json",
                                     headers=dict(headers or {}, topic=topic, key=key)),
                mandatory=True)
            published.append(mid)
        except (pika.exceptions.NackError, pika.exceptions.UnroutableError) as e:
            refused.add((topic, key))
            db.execute("SELECT idem_outbox_nack(%s, %s, %s)",
                       (mid, token, psycopg.types.json.Jsonb({"error": repr(e)})))
    if published and stall:
        time.sleep(stall.pop())
    if published:
        try:
            n = db.execute("SELECT idem_outbox_ack(%s, %s)", (published, token)).fetchone()[0]
            log.write("ack %d %d %s\n" % (token, n, " ".join(str(m) for m in published)))
        except psycopg.Error as e:
            # IK002: another relay took them over; IK003: the last lease
            # ran out and the message is dead.  Either way, not ours.
            if e.sqlstate not in ("IK002", "IK003"):
                raise
            log.write("stale %d %d %s\n" % (token, len(published), " ".join(str(m) for m in published)))
    return len(rows)


def main():
    db = broker = ch = None
    while True:
        try:
            if db is None or db.closed:
                db = connect_db()
            if broker is None or not broker.is_open:
                broker, ch = connect_broker()
            if relay_batch(db, ch) == 0:
                wait_for_emit(db, 0.5)
        except (pika.exceptions.AMQPError, OSError) as e:
            # the batch stays claimed: its leases run out, another claim takes it
            print("relay %s: broker: %r" % (name, e), file=sys.stderr, flush=True)
            try:
                if broker is not None and broker.is_open:
                    broker.close()
            except Exception:
                pass
            broker = None
            time.sleep(0.5)
        except psycopg.Error as e:
            print("relay %s: database: %r" % (name, e), file=sys.stderr, flush=True)
            try:
                db.close()
            except Exception:
                pass
            db = None
            time.sleep(0.5)


if __name__ == "__main__":
    main()
