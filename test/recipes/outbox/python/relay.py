#!/usr/bin/env python3
"""Recipe: an outbox relay to RabbitMQ, with publisher confirms.

    IDEM_DSN="host=... dbname=shop user=api password=..." AMQP_URL=amqp://... \
        RELAY=relay-1 LEASE=30 python3 relay.py

Claims a batch of messages (SKIP LOCKED: run as many relays as you like),
publishes each to the stream its topic names, with the AMQP message_id set to
the outbox id, waits for the broker's confirm of each, then acks the batch
with the claim's fencing token.  A relay that dies between publishing and its
ack leaves the batch in flight; once the lease has run out, another relay
claims it and publishes it again, the same ids: the consumer's inbox
(../../inbox) drops the copies by message_id.  So: at least once from here,
exactly once in effect there.

  - the broker refuses a message (nack, or no queue for it): nacked here, and
    retried later with back-off (outbox_max_attempts, then 'dead'), and the
    later messages of its key in the batch with it, unpublished (per key order);
  - the ack refused with IK002 (the lease ran out, another relay took the
    batch over) or IK003 (dead): not ours any more, the batch is dropped;
  - the broker or the database gone: the process ends, its supervisor
    restarts it, and the leases of what it had claimed run out.

Behind PgBouncer in transaction mode: each statement in autocommit, no
transaction open while the broker is talked to, prepare_threshold=None; no
LISTEN (a pooled connection cannot keep it): it polls."""
import json
import os
import time

import pika
import psycopg
from psycopg.types.json import Jsonb

RELAY = os.environ.get("RELAY", "relay-1")
LEASE = float(os.environ.get("LEASE", "30"))    # well above a batch's publishing time

db = psycopg.connect(os.environ["IDEM_DSN"], autocommit=True, prepare_threshold=None)
channel = pika.BlockingConnection(pika.URLParameters(os.environ["AMQP_URL"])).channel()
channel.confirm_delivery()           # basic_publish returns once the broker confirmed

while True:
    batch = db.execute("SELECT id, aggregatetype, aggregateid, type, payload, token"
                       " FROM idem_outbox_claim(%s, 100, make_interval(secs => %s))", (RELAY, LEASE)).fetchall()
    if not batch:
        time.sleep(0.2)
        continue
    token = batch[0][5]              # one claim, one fencing token
    published, refused = [], set()
    for msg_id, topic, key, event_type, payload, _ in batch:
        if (topic, key) in refused:  # per key order: nothing after a refused message
            db.execute("SELECT idem_outbox_nack(%s, %s, %s)", (msg_id, token, Jsonb({"error": "an earlier message refused"})))
            continue
        try:
            channel.basic_publish("", topic, json.dumps(payload).encode(), pika.BasicProperties(
                message_id=str(msg_id), type=event_type, delivery_mode=2, content_type="application/json"),
                mandatory=True)
            published.append(msg_id)
        except (pika.exceptions.NackError, pika.exceptions.UnroutableError) as e:
            refused.add((topic, key))
            db.execute("SELECT idem_outbox_nack(%s, %s, %s)", (msg_id, token, Jsonb({"error": repr(e)})))
    try:
        db.execute("SELECT idem_outbox_ack(%s, %s)", (published, token))
    except psycopg.Error as e:
        if e.sqlstate not in ("IK002", "IK003"):
            raise
