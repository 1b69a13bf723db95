// An HTTP API with the IETF "Idempotency-Key HTTP Header Field" draft on top
// of the idempotency extension: Node.js's http module and node-postgres
// (pg), a small pool (through PgBouncer).  The same endpoints and answers as
// test/clients/python/service.py:
//   POST /orders     one transaction: claim, INSERT the order, complete, COMMIT
//   POST /payments   multi-phase: claim, checkpoint, call the provider,
//                    then complete / fail, or mark unknown
//   POST /reconcile  resolves unknown payments by asking the provider, once
//                    they are RECONCILE_AFTER seconds old
// An answer's headers (Location, Content-Type, X-Request-Id) are saved with
// its status and body, and a replay sends them again.
// Tenants as in service.py: X-Tenant names the account, whose keys live in
// the scope named by the tenant, passed as an argument by a role allowed its
// tenants (42501 for another: 403); the reconciler is a global_reconciler
// role.  With one role for all tenants the database refuses only tenants
// outside its list: keeping t1 from t2 is this code's job, and X-Tenant must
// come from the request's authentication (or use per-tenant roles).
// Environment: IDEM_DSN, RECONCILE_DSN, PROVIDER_URL, PORT, RECONCILE_AFTER
// (seconds, 30 by default).  Tables: test/clients/schema.sql.
'use strict';
const crypto = require('crypto');
const http = require('http');
const { Pool } = require('pg');

// node-postgres uses unnamed statements unless a query has a name, so it
// works behind PgBouncer's transaction pooling as it is.
const pool = new Pool({ ...dsnConfig(process.env.IDEM_DSN), max: 4 });
const reconcilePool = new Pool({ ...dsnConfig(process.env.RECONCILE_DSN || process.env.IDEM_DSN), max: 1 });
const PROVIDER = process.env.PROVIDER_URL;
const BROKEN = process.env.IDEM_CLIENTS_BREAK === '1'; // tests only: skip the claim
const RECONCILE_AFTER = Number(process.env.RECONCILE_AFTER || 30);
// The draft's key is an RFC 8941 sf-string.  Accepted: "..." of 1 to 255
// printable ASCII characters except " and \ (the escapes \" and \\ get 400).
const KEY = /^"([\x20\x21\x23-\x5b\x5d-\x7e]{1,255})"$/;
const TENANT = /^[a-z0-9][a-z0-9_-]{0,62}$/;
// node-postgres sends parameters untyped: cast the body to jsonb.  The
// lease's rest on the server's clock (no comparison with this host's).
const CLAIM = `SELECT outcome, token, status, response_code, result, error, recovery_point, response_headers,
                      extract(epoch FROM lease_expires_at - clock_timestamp())::float8 AS lease_left
                 FROM idem_claim($1, idem_request_fingerprint('POST', $2, $3::jsonb), lease => $4, scope => $5)`;
// The one 42501 that means "not your tenant": the claim's refusal of a scope
// (src/claim.c).  Any other 42501 (a missing grant) is the server's fault.
const TENANT_REFUSED = /^scope ".*" does not belong to the tenant of this session$/s;
// Headers the server sets itself, for this connection and this body: never
// sent from a saved answer (the extension refuses them in new records; a
// record of an older version or edited by hand may have them).
const OWN_HEADERS = new Set(['content-length', 'transfer-encoding', 'connection', 'keep-alive', 'te',
  'trailer', 'upgrade']);

// IDEM_DSN is libpq's "key=value ..." without quotes, as service.py takes
// it; node-postgres takes each key left out (host, port: README "An HTTP
// endpoint") from PGHOST, PGPORT, ... as libpq does.
function dsnConfig(dsn) {
  const kv = Object.fromEntries(dsn.trim().split(/\s+/).map((p) => [p.slice(0, p.indexOf('=')), p.slice(p.indexOf('=') + 1)]));
  return { host: kv.host, port: kv.port, database: kv.dbname, user: kv.user, password: kv.password };
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
    const succeeded = row.status === 'succeeded';
    // no code saved (0.1.0 data, or none passed): 200 or 500
    const code = row.response_code ?? (succeeded ? 200 : 500);
    return answer(code, succeeded ? row.result : row.error,
      { ...row.response_headers, 'Idempotent-Replayed': 'true' });
  }
  if (row.outcome === 'unknown') return answer(202, { status: 'pending', detail: 'being reconciled' });
  // in_progress: the first request is still running (lease_left is null
  // while the other claim is not committed)
  const left = row.lease_left ?? 1;
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

// [status, the JSON body or null if it is not JSON]; rejects when no whole
// answer came: a timeout, a refused or closed connection, half a body.
function provider(method, path, body, timeout = 1000) {
  return new Promise((resolve, reject) => {
    const req = http.request(PROVIDER + path, { method, timeout,
      headers: { 'Content-Type': 'application/json' } }, (res) => {
      let data = '';
      res.setEncoding('utf8');
      res.on('data', (c) => { data += c; });
      res.on('error', reject); // the connection closed in the middle of the body
      res.on('end', () => {
        let parsed = null;
        try { parsed = JSON.parse(data); } catch (e) { /* not JSON: the caller decides */ }
        resolve([res.statusCode, parsed]);
      });
    });
    req.on('timeout', () => req.destroy(Object.assign(new Error('timeout'), { timeout: true })));
    req.on('error', reject);
    req.end(body ? JSON.stringify(body) : undefined);
  });
}

const isCharge = (c) => c !== null && typeof c === 'object' && typeof c.charge_id === 'string' &&
  Number.isInteger(c.amount);

// The provider's id of the payment: a key names an intent per tenant.
const paymentId = (tenant, key) => `${tenant}:${key}`;

// What the provider knows of a payment: ['charged', charge], ['none'] for a
// definite 404, or ['unsure'] for anything else (5xx, 429, no answer, a body
// that is not a charge).
async function lookUp(pid) {
  let status, charge;
  try {
    [status, charge] = await provider('GET', '/charges/' + encodeURIComponent(pid));
  } catch (e) {
    return ['unsure'];
  }
  if (status === 200 && isCharge(charge)) return ['charged', charge];
  return [status === 404 ? 'none' : 'unsure'];
}

// A charge at the provider, once per key.  The claim and the lease keep two
// requests from charging at the same time; that the charge happens at most
// once also relies on the provider de-duplicating by payment_id (as real
// providers do by their idempotency key): a POST that timed out may still
// land after a takeover's, and the provider must answer both with the same
// charge.
async function payments(tenant, key, body) {
  const scope = tenant;
  const pid = paymentId(tenant, key);
  let row = await claim(pool, scope, key, '/payments', body, '10 seconds');
  if (row.outcome === 'in_progress') {
    // wait for the first request's answer, then claim again; beyond
    // idempotency.max_waiters idem_await answers at once (then 409)
    await pool.query("SELECT 1 FROM idem_await($1, $2, '3 seconds')", [key, scope]);
    row = await claim(pool, scope, key, '/payments', body, '10 seconds');
  }
  if (row.outcome !== 'new' && row.outcome !== 'takeover') return notOwner(row);
  const token = row.token;
  let status, charge;
  if (row.outcome === 'takeover' && row.recovery_point === 'provider-call') {
    // an earlier attempt may have charged: ask before charging again
    const [found, known] = await lookUp(pid);
    if (found === 'charged') [status, charge] = [200, known];
    else if (found === 'unsure') return unknown(scope, key, token, 'provider lookup failed');
  }
  if (status === undefined) {
    if (!BROKEN) {
      await pool.query("SELECT idem_checkpoint($1, $2, 'provider-call', extend_lease => '10 seconds', " +
        'scope => $3)', [key, token, scope]);
    }
    try {
      [status, charge] = await provider('POST', '/charges', { payment_id: pid, amount: body.amount });
    } catch (e) {
      // a timeout, a reset, a closed connection, half a body: the charge
      // may or may not have happened, never retry blindly
      return unknown(scope, key, token, 'no answer from the provider');
    }
  }
  if ((status === 200 || status === 201) && isCharge(charge)) { // 200: the charge of a repeated id
    return charged(tenant, scope, key, token, charge);
  }
  if (status >= 400 && status < 500 && status !== 429) {
    // a definite refusal (402 a decline): saved, and replayed; a 429
    // (rate limit) is no refusal and goes on as unknown below
    const error = charge !== null && typeof charge === 'object' ? charge : { error: 'refused by the provider' };
    const headers = firstHeaders();
    if (!BROKEN) {
      await pool.query('SELECT idem_fail($1, $2, $3::jsonb, retryable => false, response_code => $4, ' +
        'headers => $5::jsonb, scope => $6)', [key, token, error, status, headers, scope]);
    }
    return answer(status, error, headers);
  }
  // 5xx, or an answer that is not a charge: maybe charged, maybe not
  return unknown(scope, key, token, `provider answered ${status}`);
}

// The outcome is unknown: the reconciler settles it.
async function unknown(scope, key, token, reason) {
  if (!BROKEN) {
    await pool.query('SELECT idem_mark_unknown($1, $2, $3::jsonb, scope => $4)',
      [key, token, { reason }, scope]);
  }
  return answer(202, { status: 'pending', detail: 'being reconciled' });
}

// The charge happened: the payment row and the answer commit together.
async function charged(tenant, scope, key, token, charge) {
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
  // settles the unknown payments of every tenant from the provider's own
  // records (as RECONCILE_DSN's role, a global_reconciler); only payments
  // that reached the provider call, and only once RECONCILE_AFTER seconds
  // passed: a POST that timed out may still land at the provider
  const done = { succeeded: [], retry: [], left: [] };
  const unknown = await reconcilePool.query(
    "SELECT scope, key, split_part(scope, '/', 1) AS tenant FROM idempotency_records" +
    " WHERE status = 'unknown' AND recovery_point = 'provider-call'" +
    '   AND updated_at < now() - make_interval(secs => $1)', [RECONCILE_AFTER]);
  for (const { scope, key, tenant } of unknown.rows) {
    const pid = paymentId(tenant, key);
    const [found, charge] = await lookUp(pid);
    if (found === 'unsure') { // a 5xx, no answer: ask again next time
      done.left.push(pid);
      continue;
    }
    const db = await reconcilePool.connect();
    try {
      await db.query('BEGIN');
      if (found === 'charged') { // it happened: save the effect and the answer
        const result = { payment_id: key, charge_id: charge.charge_id, amount: charge.amount };
        await db.query('INSERT INTO payments (tenant, idem_key, charge_id, amount) VALUES ($1, $2, $3, $4)',
          [tenant, key, charge.charge_id, charge.amount]);
        await db.query("SELECT idem_resolve($1, 'succeeded', $2::jsonb, 201, headers => $3::jsonb, scope => $4)",
          [key, result, firstHeaders(`/payments/${charge.charge_id}`), scope]);
        done.succeeded.push(pid);
      } else { // a definite 404: the next request does the work
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
      'Send Idempotency-Key: "<1 to 255 printable characters, no quote or backslash>".');
  }
  let body;
  try { body = JSON.parse(data); } catch (e) { return problem(400, 'Bad Request', 'The body is not JSON.'); }
  try {
    return await (req.url === '/orders' ? orders : payments)(tenant, m[1], body);
  } catch (e) {
    if (e.code === 'IK001') { // the key was used for another request
      return problem(422, 'Idempotency-Key reused', 'This Idempotency-Key was used for a different request.');
    }
    if (e.code === '42501' && TENANT_REFUSED.test(e.message)) { // the claim refused the tenant
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

// The answer with its headers, but none of OWN_HEADERS: Node sets those.
// writeHead throws on a status or header it refuses (a saved value with a
// control character): then a 500, never an exception out of the server.
function send(res, a) {
  const out = JSON.stringify(a.body);
  const headers = {};
  for (const [name, value] of Object.entries(a.headers)) {
    if (!OWN_HEADERS.has(name.toLowerCase())) headers[name] = value;
  }
  if (!Object.keys(headers).some((n) => n.toLowerCase() === 'content-type')) headers['Content-Type'] = a.ctype;
  headers['Content-Length'] = Buffer.byteLength(out);
  try {
    res.writeHead(a.status, headers);
  } catch (e) {
    console.error(e);
    const p = JSON.stringify(problem(500, 'Internal Server Error', 'invalid saved answer').body);
    res.writeHead(500, { 'Content-Type': 'application/problem+json', 'Content-Length': Buffer.byteLength(p) });
    res.end(p);
    return;
  }
  res.end(out);
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
    send(res, a);
  });
}).listen(Number(process.env.PORT), '127.0.0.1', 511);
