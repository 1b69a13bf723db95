// POST /payments: a charge at a payment provider, at most once per
// Idempotency-Key, with node-postgres behind PgBouncer in transaction mode.
//   1. claim the key in autocommit: the claim commits alone, and no
//      transaction stays open across the provider call;
//   2. checkpoint 'provider-call', extending the lease past the call's timeout;
//   3. call the provider outside any transaction, the key as its payment id;
//   4. complete with the payment row in one transaction (201), fail on a
//      refusal (4xx: saved and replayed), or mark unknown when no answer
//      tells (202);
//   5. a reconciler timer in every instance settles the unknown payments by
//      asking the provider.
// Environment: IDEM_DSN (libpq), PROVIDER_URL, PORT, PROVIDER_TIMEOUT
// (seconds, 5), RECONCILE_AFTER (30), RECONCILE_EVERY (10).  Table: ../schema.sql.
'use strict';
const http = require('http');
const { Pool } = require('pg');

const env = process.env;
const PROVIDER_TIMEOUT = Number(env.PROVIDER_TIMEOUT || 5);
// The lease outlasts the provider call: until it runs out a retry gets 409,
// never a takeover that calls the provider while this call may still land.
const LEASE = PROVIDER_TIMEOUT + 10;
const RECONCILE_AFTER = Number(env.RECONCILE_AFTER || 30);
const RECONCILE_EVERY = Number(env.RECONCILE_EVERY || 10);
const KEY = /^"([\x20\x21\x23-\x5b\x5d-\x7e]{1,255})"$/; // Idempotency-Key: "..."
// IDEM_DSN is libpq's "host=... port=... dbname=... user=... password=..."
// (no quoted values here): node-postgres takes its parts.
const dsn = Object.fromEntries(env.IDEM_DSN.trim().split(/\s+/).map((kv) => kv.split(/=(.*)/s, 2)));
// PgBouncer, transaction mode: node-postgres prepares on the server only a
// query given a name, so give none; a transaction is one client's (pool.connect).
const pool = new Pool({ host: dsn.host, port: Number(dsn.port || 5432), database: dsn.dbname,
  user: dsn.user, password: dsn.password, max: 4 });

// [status, the JSON body or null]; rejects when no whole answer came within
// PROVIDER_TIMEOUT: then the charge may or may not exist.
async function provider(method, path, body) {
  const res = await fetch(env.PROVIDER_URL + path, { method, headers: { 'Content-Type': 'application/json' },
    body: body && JSON.stringify(body), signal: AbortSignal.timeout(PROVIDER_TIMEOUT * 1000) });
  const text = await res.text();
  try { return [res.status, JSON.parse(text)]; } catch (e) { return [res.status, null]; }
}
const chargeOf = (status, c) =>
  ((status === 200 || status === 201) && c && typeof c.charge_id === 'string' ? c : null);

async function transaction(work) {
  const db = await pool.connect();
  try {
    await db.query('BEGIN');
    await work(db);
    await db.query('COMMIT');
  } catch (e) {
    await db.query('ROLLBACK').catch(() => {});
    throw e;
  } finally {
    db.release();
  }
}

// [status, body, replayed] of POST /payments.  node-postgres sends
// parameters untyped: cast JSON to jsonb.
async function pay(key, body) {
  const { rows: [c] } = await pool.query(`SELECT outcome, token, response_code, coalesce(result, error) AS body
      FROM idem_claim($1, idem_request_fingerprint('POST', '/payments', $2::jsonb),
                      lease => make_interval(secs => $3), scope => 'payments')`, [key, body, LEASE]);
  if (c.outcome === 'replay') return [c.response_code, c.body, true];
  if (c.outcome === 'unknown') return [202, { status: 'pending' }]; // the reconciler settles it
  if (c.outcome === 'in_progress') return [409, { error: 'in progress' }]; // another request holds the lease
  // new, or takeover (a lease ran out, or the reconciler found no charge):
  // charging again under the same payment id is safe, since the provider
  // answers a repeated id with its first charge
  await pool.query(`SELECT idem_checkpoint($1, $2, 'provider-call', scope => 'payments',
      extend_lease => make_interval(secs => $3))`, [key, c.token, LEASE]);
  let status = null, answer = null;
  try { // no transaction open and no connection held meanwhile
    [status, answer] = await provider('POST', '/charges', { payment_id: key, amount: body.amount });
  } catch (e) { /* a timeout, a reset, half a body */ }
  const charge = chargeOf(status, answer);
  if (charge) {
    const result = { payment_id: key, charge_id: charge.charge_id, amount: charge.amount };
    await transaction(async (db) => { // the saved answer and the payment row commit together
      await db.query("SELECT idem_complete($1, $2, $3::jsonb, 201, scope => 'payments')", [key, c.token, result]);
      await db.query('INSERT INTO charges (key, charge_id, amount) VALUES ($1, $2, $3)',
        [key, charge.charge_id, charge.amount]);
    });
    return [201, result];
  }
  if (status >= 400 && status < 500 && status !== 429) {
    // a refusal (402: declined): saved, so that a retry gets it again
    const error = answer && typeof answer === 'object' ? answer : { error: 'refused' };
    await pool.query(`SELECT idem_fail($1, $2, $3::jsonb, retryable => false, scope => 'payments',
        response_code => $4)`, [key, c.token, error, status]);
    return [status, error];
  }
  // no answer, a 5xx or 429, a body that is no charge: it may have charged
  await pool.query("SELECT idem_mark_unknown($1, $2, $3::jsonb, scope => 'payments')",
    [key, c.token, { provider_status: status }]);
  return [202, { status: 'pending' }];
}

// Settles the unknown payments older than RECONCILE_AFTER (a POST that timed
// out may land late) from the provider's records.  Every instance runs it:
// a second idem_resolve of a key waits for the first's transaction, then gets
// IK003 (so it comes before the INSERT).
async function reconcile() {
  const { rows } = await pool.query(`SELECT key FROM idempotency_records WHERE scope = 'payments'
      AND status = 'unknown' AND recovery_point = 'provider-call'
      AND updated_at < now() - make_interval(secs => $1)`, [RECONCILE_AFTER]);
  for (const { key } of rows) {
    let status, answer;
    try { [status, answer] = await provider('GET', '/charges/' + encodeURIComponent(key)); } catch (e) { continue; }
    const charge = chargeOf(status, answer);
    if (!charge && status !== 404) continue; // a 5xx: left for the next run
    await transaction(async (db) => {
      if (charge) { // it happened: save the answer, and it
        const result = { payment_id: key, charge_id: charge.charge_id, amount: charge.amount };
        await db.query("SELECT idem_resolve($1, 'succeeded', $2::jsonb, 201, 'payments')", [key, result]);
        await db.query('INSERT INTO charges (key, charge_id, amount) VALUES ($1, $2, $3)',
          [key, charge.charge_id, charge.amount]);
      } else { // it did not: the client's retry charges
        await db.query(`SELECT idem_resolve($1, 'failed', '{"error": "no charge"}', scope => 'payments',
            retryable => true)`, [key]);
      }
    }).catch((e) => { if (e.code !== 'IK003') throw e; }); // IK003: another instance settled it first
  }
}
function reconciler() { // one run after the other, never two at once
  setTimeout(() => reconcile().catch((e) => console.error('reconcile:', e.message)).finally(reconciler),
    RECONCILE_EVERY * 1000);
}

async function handle(req, data) {
  const key = KEY.exec(req.headers['idempotency-key'] || '');
  let body = null;
  try { body = JSON.parse(data); } catch (e) { /* 400 below */ }
  if (req.method !== 'POST' || req.url !== '/payments') return [404, { error: 'not found' }];
  if (!key || !body || !Number.isInteger(body.amount)) {
    return [400, { error: 'send Idempotency-Key: "..." and {"amount": <int>}' }];
  }
  try {
    return await pay(key[1], body);
  } catch (e) {
    if (e.code === 'IK001') return [422, { error: 'Idempotency-Key reused for another request' }];
    if (e.code === 'IK002') return [409, { error: 'superseded' }]; // our lease ran out, another took over
    console.error(e);
    return [500, { error: e.code || 'error' }];
  }
}

http.createServer((req, res) => {
  let data = '';
  req.on('data', (chunk) => { data += chunk; });
  req.on('end', async () => {
    const [status, body, replayed] = await handle(req, data);
    const headers = { 'Content-Type': 'application/json' };
    if (replayed) headers['Idempotent-Replayed'] = 'true';
    if (status === 409) headers['Retry-After'] = '1';
    res.writeHead(status, headers).end(JSON.stringify(body));
  });
}).listen(Number(env.PORT), '127.0.0.1');
reconciler();
