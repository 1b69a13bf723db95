// An HTTP API with the IETF "Idempotency-Key HTTP Header Field" draft on top
// of the idempotency extension: Node.js's http module and node-postgres
// (pg), a small pool (through PgBouncer).  The same endpoints and answers as
// test/clients/python/service.py:
//   POST /orders     one transaction: claim, INSERT the order, complete, COMMIT
//   POST /payments   multi-phase: claim, checkpoint, call the provider,
//                    then complete / fail, or mark unknown
//   POST /reconcile  resolves unknown payments by asking the provider
// An answer's headers (Location, Content-Type, X-Request-Id) are saved with
// its status and body, and a replay sends them again.
// Tenants as in service.py: X-Tenant names the account, whose keys live in
// the scope named by the tenant, passed as an argument by a role allowed its
// tenants (42501 for another: 403); the reconciler is a global_reconciler
// role.
// Environment: IDEM_DSN, RECONCILE_DSN, PROVIDER_URL, PORT.  Tables:
// test/clients/schema.sql.
'use strict';
const crypto = require('crypto');
const http = require('http');
const { Pool } = require('pg');

// node-postgres uses unnamed statements unless a query has a name, so it
// works behind PgBouncer's transaction pooling as it is.
const pool = new Pool({ connectionString: dsnToUrl(process.env.IDEM_DSN), max: 4 });
const reconcilePool = new Pool({
  connectionString: dsnToUrl(process.env.RECONCILE_DSN || process.env.IDEM_DSN), max: 1 });
const PROVIDER = process.env.PROVIDER_URL;
const BROKEN = process.env.IDEM_CLIENTS_BREAK === '1'; // tests only: skip the claim
// The draft's key is an RFC 8941 sf-string: "..." of printable ASCII.
const KEY = /^"([\x20\x21\x23-\x5b\x5d-\x7e]{1,255})"$/;
const TENANT = /^[a-z0-9][a-z0-9_-]{0,62}$/;
// node-postgres sends parameters untyped: cast the body to jsonb.
const CLAIM = `SELECT outcome, token, status, response_code, result, error, lease_expires_at,
                      response_headers
                 FROM idem_claim($1, idem_request_fingerprint('POST', $2, $3::jsonb), lease => $4, scope => $5)`;

function dsnToUrl(dsn) {
  const kv = Object.fromEntries(dsn.split(/\s+/).map((p) => p.split('=')));
  return `postgresql://${kv.user}@${kv.host}:${kv.port}/${kv.dbname}`;
}

const answer = (status, body, headers = {}, ctype = 'application/json') => ({ status, body, headers, ctype });
// The headers of an answer that is saved: given again by every replay.
function firstHeaders(location) {
  const headers = { 'Content-Type': 'application/json', 'X-Request-Id': crypto.randomUUID() };
  if (location) headers.Location = location;
  return headers;
}
const problem = (status, title, detail, headers) =>
  answer(status, { type: 'about:blank', title, status, detail }, headers, 'application/problem+json');

async function claim(db, scope, key, path, body, lease = null) {
  if (BROKEN) return { outcome: 'new', token: null };
  return (await db.query(CLAIM, [key, path, JSON.stringify(body), lease, scope])).rows[0];
}

function notOwner(row) {
  if (row.outcome === 'replay') {
    const body = row.status === 'succeeded' ? row.result : row.error;
    return answer(row.response_code, body, { ...row.response_headers, 'Idempotent-Replayed': 'true' });
  }
  if (row.outcome === 'unknown') return answer(202, { status: 'pending', detail: 'being reconciled' });
  // in_progress: the first request is still running
  const left = row.lease_expires_at ? (row.lease_expires_at - Date.now()) / 1000 : 1;
  return problem(409, 'Request in progress',
    'A request with this Idempotency-Key is being processed; retry later.',
    { 'Retry-After': String(Math.max(1, Math.ceil(left))) });
}

async function orders(tenant, key, body) {
  const scope = tenant;
  const db = await pool.connect();
  try {
    await db.query('BEGIN');
    const row = await claim(db, scope, key, '/orders', body);
    if (row.outcome !== 'new' && row.outcome !== 'takeover') {
      await db.query('COMMIT');
      return notOwner(row);
    }
    const order = (await db.query(
      'INSERT INTO orders (tenant, idem_key, sku, qty) VALUES ($1, $2, $3, $4) RETURNING id',
      [tenant, key, body.sku, body.qty])).rows[0];
    const result = { order_id: Number(order.id), sku: body.sku, qty: body.qty };
    const headers = firstHeaders(`/orders/${result.order_id}`);
    if (!BROKEN) {
      await db.query('SELECT idem_complete($1, $2, $3::jsonb, 201, headers => $4::jsonb, scope => $5)',
        [key, row.token, result, headers, scope]);
    }
    await db.query('COMMIT'); // only now is the answer true
    return answer(201, result, headers);
  } catch (e) {
    await db.query('ROLLBACK').catch(() => {});
    throw e;
  } finally {
    db.release();
  }
}

function provider(method, path, body, timeout = 1000) {
  return new Promise((resolve, reject) => {
    const req = http.request(PROVIDER + path, { method, timeout,
      headers: { 'Content-Type': 'application/json' } }, (res) => {
      let data = '';
      res.on('data', (c) => { data += c; });
      res.on('end', () => resolve([res.statusCode, JSON.parse(data)]));
    });
    req.on('timeout', () => req.destroy(Object.assign(new Error('timeout'), { timeout: true })));
    req.on('error', reject);
    req.end(body ? JSON.stringify(body) : undefined);
  });
}

// The provider's id of the payment: a key names an intent per tenant.
const paymentId = (tenant, key) => `${tenant}:${key}`;

async function payments(tenant, key, body) {
  const scope = tenant;
  let row = await claim(pool, scope, key, '/payments', body, '10 seconds');
  if (row.outcome === 'in_progress') {
    // wait for the first request's answer, then claim again; beyond
    // idempotency.max_waiters idem_await answers at once (then 409)
    await pool.query("SELECT 1 FROM idem_await($1, $2, '3 seconds')", [key, scope]);
    row = await claim(pool, scope, key, '/payments', body, '10 seconds');
  }
  if (row.outcome !== 'new' && row.outcome !== 'takeover') return notOwner(row);
  const token = row.token;
  if (!BROKEN) {
    await pool.query("SELECT idem_checkpoint($1, $2, 'provider-call', extend_lease => '10 seconds', " +
      'scope => $3)', [key, token, scope]);
  }
  let status, charge;
  try {
    [status, charge] = await provider('POST', '/charges', { payment_id: paymentId(tenant, key), amount: body.amount });
  } catch (e) {
    // the charge may or may not have happened: never retry blindly
    if (!BROKEN) {
      await pool.query('SELECT idem_mark_unknown($1, $2, $3::jsonb, scope => $4)',
        [key, token, { reason: 'provider timeout' }, scope]);
    }
    return answer(202, { status: 'pending', detail: 'being reconciled' });
  }
  if (status === 402) {
    const headers = firstHeaders();
    if (!BROKEN) {
      await pool.query('SELECT idem_fail($1, $2, $3::jsonb, retryable => false, response_code => 402, ' +
        'headers => $4::jsonb, scope => $5)', [key, token, charge, headers, scope]);
    }
    return answer(402, charge, headers);
  }
  const result = { payment_id: key, charge_id: charge.charge_id, amount: charge.amount };
  const headers = firstHeaders(`/payments/${charge.charge_id}`);
  const db = await pool.connect();
  try {
    await db.query('BEGIN');
    await db.query('INSERT INTO payments (tenant, idem_key, charge_id, amount) VALUES ($1, $2, $3, $4)',
      [tenant, key, charge.charge_id, charge.amount]);
    if (!BROKEN) {
      await db.query('SELECT idem_complete($1, $2, $3::jsonb, 201, headers => $4::jsonb, scope => $5)',
        [key, token, result, headers, scope]);
    }
    await db.query('COMMIT');
  } catch (e) {
    await db.query('ROLLBACK').catch(() => {});
    throw e;
  } finally {
    db.release();
  }
  return answer(201, result, headers);
}

async function reconcile() {
  // settles every tenant's unknown payments from the provider's own records
  // (as RECONCILE_DSN's role, a global_reconciler)
  const done = { succeeded: [], retry: [] };
  const unknown = await reconcilePool.query(
    "SELECT scope, key FROM idempotency_records WHERE status = 'unknown'");
  for (const { scope, key } of unknown.rows) {
    const tenant = scope;
    const pid = paymentId(tenant, key);
    const [status, charge] = await provider('GET', '/charges/' + encodeURIComponent(pid));
    const db = await reconcilePool.connect();
    try {
      await db.query('BEGIN');
      if (status === 200) { // it happened: save the effect and the answer
        const result = { payment_id: key, charge_id: charge.charge_id, amount: charge.amount };
        await db.query('INSERT INTO payments (tenant, idem_key, charge_id, amount) VALUES ($1, $2, $3, $4)',
          [tenant, key, charge.charge_id, charge.amount]);
        await db.query("SELECT idem_resolve($1, 'succeeded', $2::jsonb, 201, headers => $3::jsonb, scope => $4)",
          [key, result, firstHeaders(`/payments/${charge.charge_id}`), scope]);
        done.succeeded.push(pid);
      } else { // it did not: the next request does the work
        await db.query("SELECT idem_resolve($1, 'failed', $2::jsonb, retryable => true, scope => $3)",
          [key, { reason: 'no charge at the provider' }, scope]);
        done.retry.push(pid);
      }
      await db.query('COMMIT');
    } catch (e) {
      await db.query('ROLLBACK').catch(() => {});
      throw e;
    } finally {
      db.release();
    }
  }
  return answer(200, done);
}

async function handle(req, data) {
  if (req.method !== 'POST') return problem(405, 'Method Not Allowed', req.method);
  if (req.url === '/reconcile') return reconcile();
  if (req.url !== '/orders' && req.url !== '/payments') return problem(404, 'Not Found', req.url);
  const tenant = req.headers['x-tenant'] || '';
  if (!TENANT.test(tenant)) return problem(400, 'X-Tenant missing or malformed', 'Send X-Tenant: <account>.');
  const m = KEY.exec(req.headers['idempotency-key'] || '');
  if (!m) {
    return problem(400, 'Idempotency-Key missing or malformed',
      'Send Idempotency-Key: "<1 to 255 printable characters>".');
  }
  let body;
  try { body = JSON.parse(data); } catch (e) { return problem(400, 'Bad Request', 'The body is not JSON.'); }
  try {
    return await (req.url === '/orders' ? orders : payments)(tenant, m[1], body);
  } catch (e) {
    if (e.code === 'IK001') { // the key was used for another request
      return problem(422, 'Idempotency-Key reused', 'This Idempotency-Key was used for a different request.');
    }
    if (e.code === '42501') { // the database refused the tenant: the role is not allowed it
      return problem(403, 'Forbidden', 'This account may not use this tenant.');
    }
    if (e.code === 'IK002') {
      // Our lease ran out and another request took the key over: it owns
      // the work now, and a retry gets its answer.
      return problem(409, 'Request superseded',
        'Another attempt with this Idempotency-Key took over; retry later.', { 'Retry-After': '1' });
    }
    throw e;
  }
}

http.createServer((req, res) => {
  let data = '';
  req.on('data', (c) => { data += c; });
  req.on('end', async () => {
    let a;
    try {
      a = await handle(req, data);
    } catch (e) {
      console.error(e);
      a = problem(500, 'Internal Server Error', e.code || 'error');
    }
    const out = JSON.stringify(a.body);
    res.writeHead(a.status, { 'Content-Type': a.ctype, 'Content-Length': Buffer.byteLength(out), ...a.headers });
    res.end(out);
  });
}).listen(Number(process.env.PORT), '127.0.0.1', 511);
