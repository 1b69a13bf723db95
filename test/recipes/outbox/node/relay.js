// Recipe: an outbox relay to RabbitMQ, with publisher confirms, in Node.js
// (node-postgres, amqplib).  The same relay as ../python/relay.py, whose
// comment says why each step is there:
//
//   IDEM_DSN="host=... dbname=shop user=api password=..." AMQP_URL=amqp://... \
//       RELAY=relay-1 LEASE=30 node relay.js
//
// Claim a batch; publish each message to the stream its topic names, the
// AMQP messageId set to the outbox id (the consumer's inbox drops copies by
// it), each after the previous one's confirm; ack the batch with the claim's fencing
// token (IK002, IK003: taken over or dead, not ours any more); nack what the
// broker refused, and the later messages of its key.  The broker or the database gone: the process ends and its
// supervisor restarts it; the leases of its batch run out and another relay
// publishes it again.
//
// Behind PgBouncer in transaction mode: queries without a name (no
// server-side prepared statement), each statement its own transaction, no
// LISTEN (a pooled connection cannot keep it): it polls.
'use strict';
const { Client } = require('pg');
const amqp = require('amqplib');

// node-postgres reads no keyword DSN ("host=... dbname=..."): its fields by name
const dsn = Object.fromEntries(process.env.IDEM_DSN.trim().split(/\s+/).map((kv) => kv.split(/=(.*)/s, 2)));
const RELAY = process.env.RELAY || 'relay-1';
const LEASE = Number(process.env.LEASE || 30); // seconds, well above a batch's publishing time
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function main() {
  const db = new Client({ host: dsn.host, port: dsn.port, database: dsn.dbname, user: dsn.user, password: dsn.password });
  await db.connect();
  const broker = await amqp.connect(process.env.AMQP_URL);
  // gone: exit before a confirm callback's 'channel closed' could be taken for a refusal
  broker.on('close', () => { console.error('the broker closed the connection'); process.exit(1); });
  const channel = await broker.createConfirmChannel();
  const returned = new Set(); // mandatory and unroutable: returned before its confirm
  channel.on('return', (m) => returned.add(m.properties.messageId));

  for (;;) {
    const { rows: batch } = await db.query(
      'SELECT id, aggregatetype, aggregateid, type, payload, token FROM idem_outbox_claim($1, 100, make_interval(secs => $2))',
      [RELAY, LEASE]);
    if (batch.length === 0) {
      await sleep(200);
      continue;
    }
    const token = batch[0].token; // one claim, one fencing token
    returned.clear();
    // one message at a time, each after the previous one's confirm: once the
    // broker refused a message, the later ones of its key must not go (per
    // key order), and a pipelined one could already be there
    const refusedKeys = new Set();
    const published = [];
    for (const m of batch) {
      const key = JSON.stringify([m.aggregatetype, m.aggregateid]);
      const refused = refusedKeys.has(key) ? 'an earlier message refused' : await new Promise((resolve) => {
        channel.publish('', m.aggregatetype, Buffer.from(JSON.stringify(m.payload)), {
          messageId: m.id, type: m.type ?? undefined, persistent: true, mandatory: true,
          contentType: 'application/json',
        }, (err) => resolve(err ? 'nacked by the broker' : returned.has(m.id) ? 'unroutable' : null));
      });
      if (refused) {
        refusedKeys.add(key);
        await db.query('SELECT idem_outbox_nack($1, $2, $3)', [m.id, token, { error: refused }]);
      } else {
        published.push(m.id);
      }
    }
    try {
      await db.query('SELECT idem_outbox_ack($1, $2)', [published, token]);
    } catch (e) {
      if (e.code !== 'IK002' && e.code !== 'IK003') throw e;
    }
  }
}

main().catch((e) => { console.error(e); process.exit(1); });
