#!/usr/bin/env python3
"""Recipe: emit each event in the business transaction (the transactional outbox).

    IDEM_DSN="host=... dbname=shop user=api password=..." TOPIC=orders python3 orders.py FIRST LAST

Places the orders o-FIRST .. o-LAST, then pays them, then ships them.  Each
change commits with its event in one transaction, or neither does: no event
announces a change that rolled back, and none is lost if the process dies
after the commit (as one published to the broker after COMMIT would be).
The topic names the RabbitMQ stream the relay (relay.py) publishes to; the
key, the order, keeps one order's events in the order they were emitted.

Behind PgBouncer in transaction mode: autocommit with explicit transactions,
prepare_threshold=None (no server-side prepared statements), no session
state."""
import os
import sys

import psycopg
from psycopg.types.json import Jsonb

TOPIC = os.environ.get("TOPIC", "orders")
STEPS = [("OrderPlaced", "INSERT INTO order_status (id, status) VALUES (%s, 'placed')"),
         ("OrderPaid", "UPDATE order_status SET status = 'paid' WHERE id = %s"),
         ("OrderShipped", "UPDATE order_status SET status = 'shipped' WHERE id = %s")]

db = psycopg.connect(os.environ["IDEM_DSN"], autocommit=True, prepare_threshold=None)
ids = [f"o-{i}" for i in range(int(sys.argv[1]), int(sys.argv[2]) + 1)]
for n, (event, change) in enumerate(STEPS, 1):
    for order_id in ids:
        with db.transaction():                    # the change and its event: both or neither
            db.execute(change, (order_id,))
            db.execute("SELECT idem_outbox_emit(%s, %s, %s, type => %s)",
                       (TOPIC, order_id, Jsonb({"order": order_id, "n": n}), event))
