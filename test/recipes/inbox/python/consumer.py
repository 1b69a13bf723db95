#!/usr/bin/env python3
"""Recipe: a RabbitMQ consumer that applies each message once, through the inbox.

    IDEM_DSN="host=... dbname=shop user=api password=..." AMQP_URL=amqp://... \
        STREAMS=orders.0,orders.1 CONSUMER=billing python3 consumer.py

It reads RabbitMQ streams (queues of type stream, RabbitMQ's partitions: each
message numbered by its offset) and takes each message in one transaction
with its effect, then acks it:

  1. idem_inbox_accept_seq(consumer, stream, offset): the stream's watermark
     is the consumer's position, committed with the effect.  A restart reads
     on from watermark + 1; an offset read again is a 'duplicate'.
  2. idem_inbox_accept(consumer, message id): a producer's copies.  An outbox
     relay that dies between publishing and its ack publishes again: the same
     id at a new offset (ids are kept for idempotency.retention, 24 h).
  3. the business change.

The trap: accept_gap => true (a stream's offsets skip where retention removed
messages before they were read, as a Kafka partition's skip after compaction)
moves the watermark over a gap, so a stream's messages must commit in offset
order.  A pool of workers that commits offset 1210 before 1208 makes 1208 a
'duplicate', skipped without a word.  So each stream's messages are applied
one at a time, in the order they arrive; for more throughput, more streams.
(Two instances on one stream, as during a deploy, are safe: each commits in
order, and what one applied is a duplicate for the other.)

Behind PgBouncer in transaction mode: autocommit with explicit transactions,
prepare_threshold=None (no server-side prepared statements), no session
state.  Any error ends the process: restarted by its supervisor, it reads on
from the watermarks, and what it had not committed comes again."""
import json
import os

import pika
import psycopg

CONSUMER = os.environ.get("CONSUMER", "billing")
STREAMS = os.environ["STREAMS"].split(",")

db = psycopg.connect(os.environ["IDEM_DSN"], autocommit=True, prepare_threshold=None)
channel = pika.BlockingConnection(pika.URLParameters(os.environ["AMQP_URL"])).channel()
channel.basic_qos(prefetch_count=100)     # a stream consumer must have a prefetch


def on_message(stream, delivery, props, body):
    offset = props.headers["x-stream-offset"]
    with db.transaction():
        (seen,) = db.execute("SELECT idem_inbox_accept_seq(%s, %s, %s, accept_gap => true)",
                             (CONSUMER, stream, offset)).fetchone()
        if seen == "gap":
            print(f"{stream}: offsets before {offset} were removed unread", flush=True)
        if seen != "duplicate":
            (first,) = db.execute("SELECT idem_inbox_accept(%s, %s)",
                                  (CONSUMER, props.message_id)).fetchone()
            if first:
                event = json.loads(body)      # the business change, in the same transaction
                db.execute("INSERT INTO order_events (consumer, order_id, n, message_id, stream, stream_offset)"
                           " VALUES (%s, %s, %s, %s, %s, %s)",
                           (CONSUMER, event["order"], event["n"], props.message_id, stream, offset))
    channel.basic_ack(delivery.delivery_tag)  # after the commit: duplicates too


for stream in STREAMS:
    channel.queue_declare(stream, durable=True, arguments={"x-queue-type": "stream"})
    (mark,) = db.execute("SELECT idem_inbox_watermark(%s, %s)", (CONSUMER, stream)).fetchone()
    channel.basic_consume(
        stream, lambda _ch, delivery, props, body, s=stream: on_message(s, delivery, props, body),
        arguments={"x-stream-offset": "first" if mark is None else mark + 1})
channel.start_consuming()
