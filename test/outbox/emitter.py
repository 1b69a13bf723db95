#!/usr/bin/python3
"""The emitting application of the end-to-end test.

    emitter.py NAME DSN TRANSACTIONS SEED

Each business transaction locks one key's row of e2e_keys, advances its
sequence number, emits the messages (one with idem_outbox_emit, or three
with idem_outbox_emit_batch) and records them in emits, all in one
transaction.  One transaction in ten rolls back after emitting; its ids go
to rolled_back afterwards, on a second connection.  A lost connection (the
test terminates backends) is reconnected; a transaction whose COMMIT had no
answer is whatever the database says it is (emits is written in it).
"""
import random
import sys
import time

import psycopg
import psycopg.types.json

name, dsn, transactions, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rng = random.Random(seed)


class RollBack(Exception):
    pass


def main():
    db = side = None
    done = 0
    while done < transactions:
        try:
            if db is None or db.closed:
                db = psycopg.connect(dsn, autocommit=True, application_name="e2e-emitter-" + name)
                side = psycopg.connect(dsn, autocommit=True, application_name="e2e-emitter-side-" + name)
            key = "k%d" % rng.randint(1, 40)
            count = 3 if rng.random() < 0.3 else 1
            ids = []
            try:
                with db.transaction():
                    (n,) = db.execute("UPDATE e2e_keys SET n = n + %s WHERE key = %s RETURNING n",
                                      (count, key)).fetchone()
                    ns = list(range(n - count + 1, n + 1))
                    payloads = [psycopg.types.json.Jsonb({"key": key, "n": i}) for i in ns]
                    if count == 1:
                        ids = [db.execute("SELECT idem_outbox_emit('e2e', %s, %s, 'Bumped')",
                                          (key, payloads[0])).fetchone()[0]]
                    else:
                        (ids,) = db.execute("SELECT idem_outbox_emit_batch('e2e', %s, %s)",
                                            ([key] * count, payloads)).fetchone()
                    for mid, i in zip(ids, ns):
                        db.execute("INSERT INTO emits (id, key, n) VALUES (%s, %s, %s)", (mid, key, i))
                    if rng.random() < 0.1:
                        raise RollBack()
            except RollBack:
                for mid in ids:
                    side.execute("INSERT INTO rolled_back (id) VALUES (%s)", (mid,))
            done += 1
        except psycopg.Error as e:
            print("emitter %s: %r" % (name, e), file=sys.stderr, flush=True)
            for c in (db, side):
                try:
                    c.close()
                except Exception:
                    pass
            db = side = None
            time.sleep(0.2)


if __name__ == "__main__":
    main()
