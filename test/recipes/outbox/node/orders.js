// Recipe: emit each event in the business transaction (the transactional
// outbox), in Node.js (node-postgres).  The same program as
// ../python/orders.py, whose comment says why:
//
//   IDEM_DSN="host=... dbname=shop user=api password=..." TOPIC=orders node orders.js FIRST LAST
//
// Places the orders o-FIRST .. o-LAST, then pays them, then ships them; each
// change commits with its event, or neither does.
//
// Behind PgBouncer in transaction mode: queries without a name (so no
// server-side prepared statement), BEGIN and COMMIT on one pooled client, no
// session state.
'use strict';
const { Client } = require('pg');

// node-postgres reads no keyword DSN ("host=... dbname=..."): its fields by name
const dsn = Object.fromEntries(process.env.IDEM_DSN.trim().split(/\s+/).map((kv) => kv.split(/=(.*)/s, 2)));
const TOPIC = process.env.TOPIC || 'orders';
const STEPS = [
  ['OrderPlaced', "INSERT INTO order_status (id, status) VALUES ($1, 'placed')"],
  ['OrderPaid', "UPDATE order_status SET status = 'paid' WHERE id = $1"],
  ['OrderShipped', "UPDATE order_status SET status = 'shipped' WHERE id = $1"],
];

async function main() {
  const db = new Client({ host: dsn.host, port: dsn.port, database: dsn.dbname, user: dsn.user, password: dsn.password });
  await db.connect();
  const [first, last] = process.argv.slice(2).map(Number);
  for (const [i, [event, change]] of STEPS.entries()) {
    for (let o = first; o <= last; o++) {
      const orderId = `o-${o}`;
      await db.query('BEGIN'); // the change and its event: both or neither
      try {
        await db.query(change, [orderId]);
        await db.query('SELECT idem_outbox_emit($1, $2, $3, type => $4)',
          [TOPIC, orderId, { order: orderId, n: i + 1 }, event]);
        await db.query('COMMIT');
      } catch (e) {
        await db.query('ROLLBACK');
        throw e;
      }
    }
  }
  await db.end();
}

main().catch((e) => { console.error(e); process.exit(1); });
