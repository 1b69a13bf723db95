#!/usr/bin/python3
"""The consumer of the end-to-end test: RabbitMQ (pika) into PostgreSQL.

    consumer.py NAME DSN AMQP_PORT QUEUES LOG

It consumes every queue e2e.N; each is a single-active-consumer queue, so
one consumer at a time gets a queue's messages, in order.  Each message is
taken into one business transaction: idem_inbox_accept('e2e', message id),
and when that says the message is new, its effect (a row of applied).  The
broker's ack follows the commit.  On any error the consumer drops its
broker connection, so that every unacknowledged message goes back to its
queue in order, and starts again: it never applies a message after one it
could not apply.  Duplicates (redeliveries the inbox recognised) are
written to LOG.
"""
import json
import sys
import time

import pika
import psycopg

name, dsn, amqp_port, queues, log_path = sys.argv[1:6]
queues = int(queues)
log = open(log_path, "a", buffering=1)


def main():
    db = None
    while True:
        broker = None
        try:
            if db is None or db.closed:
                db = psycopg.connect(dsn, autocommit=True, application_name="e2e-consumer-" + name)
            broker = pika.BlockingConnection(pika.ConnectionParameters(
                "127.0.0.1", int(amqp_port), heartbeat=10, connection_attempts=1, socket_timeout=5))
            ch = broker.channel()
            ch.basic_qos(prefetch_count=20)

            def on_message(ch, method, props, body):
                msg = json.loads(body)
                with db.transaction():
                    (first,) = db.execute("SELECT idem_inbox_accept('e2e', %s)",
                                          (props.message_id,)).fetchone()
                    if first:
                        db.execute("INSERT INTO applied (msg_id, key, n, consumer) VALUES (%s, %s, %s, %s)",
                                   (props.message_id, msg["key"], msg["n"], name))
                # committed: now the broker may forget the message
                ch.basic_ack(method.delivery_tag)
                if not first:
                    log.write("duplicate %s\n" % props.message_id)

            for q in range(queues):
                qn = "e2e.%d" % q
                ch.queue_declare(qn, durable=True, arguments={"x-single-active-consumer": True})
                ch.basic_consume(qn, on_message, auto_ack=False)
            ch.start_consuming()
        except (pika.exceptions.AMQPError, OSError) as e:
            print("consumer %s: broker: %r" % (name, e), file=sys.stderr, flush=True)
        except psycopg.Error as e:
            print("consumer %s: database: %r" % (name, e), file=sys.stderr, flush=True)
            try:
                db.close()
            except Exception:
                pass
            db = None
        try:
            if broker is not None and broker.is_open:
                broker.close()      # the unacknowledged messages go back, in order
        except Exception:
            pass
        time.sleep(0.5)


if __name__ == "__main__":
    main()
