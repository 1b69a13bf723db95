-- Response headers (0.2.0): idem_complete, idem_fail and idem_resolve save
-- the answer's headers, and every replay gives back exactly what was saved:
-- the claim's row, idem_lookup and idem_await.  A takeover clears them with
-- the rest of the outcome, a new claim of a record past its retention starts
-- without them, a stale owner cannot write them, and invalid headers are
-- refused (22023) with nothing written.  Keys are prefixed "rh.".
BEGIN;
SELECT plan(39);

\set hdrs '''{"Location": "/orders/7", "Content-Type": "application/json", "X-Request-Id": "r-1", "Set-Cookie": ["a=1", "b=2"]}'''

-- complete with headers; replayed by the claim, idem_lookup and idem_await -------------------
SELECT is((SELECT token FROM idem_claim('rh.c', '\xaa'::bytea, '1 hour')), 1::bigint, 'claimed');
SELECT lives_ok(format($$SELECT idem_complete('rh.c', 1, '{"id": 7}', 201, headers => %s)$$, :'hdrs'),
                'complete with headers');
SELECT results_eq($$SELECT outcome, response_code, result, response_headers FROM idem_claim('rh.c', '\xaa'::bytea)$$,
                  format($$VALUES ('replay', 201, '{"id": 7}'::jsonb, %s::jsonb)$$, :'hdrs'),
                  'the replay''s row carries the saved status, body and headers');
SELECT is((SELECT response_headers::text FROM idem_claim('rh.c', '\xaa'::bytea)),
          (:hdrs)::jsonb::text, 'the same headers, text for text');
SELECT is((SELECT response_headers -> 'Set-Cookie' FROM idem_claim('rh.c', '\xaa'::bytea)),
          '["a=1", "b=2"]'::jsonb, 'a header with several values keeps them in order');
SELECT is((SELECT response_headers FROM idem_lookup('rh.c')), (:hdrs)::jsonb, 'idem_lookup returns them');
SELECT is((SELECT response_headers FROM idem_await('rh.c', '', '0 s')), (:hdrs)::jsonb, 'idem_await too');
SELECT is((SELECT ARRAY(SELECT jsonb_object_keys(response_headers) ORDER BY 1) FROM idem_lookup('rh.c')),
          '{Content-Type,Location,Set-Cookie,X-Request-Id}'::text[], 'names keep their case');

-- a repeat of the same complete succeeds; other headers are another outcome --------------------
SELECT lives_ok(format($$SELECT idem_complete('rh.c', 1, '{"id": 7}', 201, headers => %s)$$, :'hdrs'),
                'complete repeated with the same headers succeeds');
SELECT throws_ok($$SELECT idem_complete('rh.c', 1, '{"id": 7}', 201, headers => '{"Location": "/orders/8"}')$$,
                 'IK003', NULL, 'complete repeated with other headers: IK003');
SELECT throws_ok($$SELECT idem_complete('rh.c', 1, '{"id": 7}', 201)$$,
                 'IK003', NULL, 'complete repeated without the headers: IK003');
SELECT is((SELECT response_headers FROM idem_lookup('rh.c')), (:hdrs)::jsonb, 'the saved headers are unchanged');

-- no headers: NULL -----------------------------------------------------------------------------
SELECT lives_ok($$SELECT idem_complete('rh.none', (SELECT token FROM idem_claim('rh.none', '\xaa'::bytea)), '{}', 200)$$,
                'complete without headers');
SELECT is((SELECT response_headers FROM idem_claim('rh.none', '\xaa'::bytea)), NULL::jsonb,
          'the replay has no headers');

-- fail with headers ---------------------------------------------------------------------------
SELECT lives_ok($$SELECT idem_fail('rh.f', (SELECT token FROM idem_claim('rh.f', '\xaa'::bytea)),
                                   '{"reason": "declined"}', retryable => false, response_code => 402,
                                   headers => '{"Retry-After": "120", "X-Request-Id": "r-2"}')$$,
                'fail with headers');
SELECT results_eq($$SELECT outcome, status::text, response_code, error, response_headers
                      FROM idem_claim('rh.f', '\xaa'::bytea)$$,
                  $$VALUES ('replay', 'failed', 402, '{"reason": "declined"}'::jsonb,
                            '{"Retry-After": "120", "X-Request-Id": "r-2"}'::jsonb)$$,
                  'the replay of a failure carries its headers');

-- a takeover of a retryable failure clears them; the stale owner cannot write them ---------------
SELECT lives_ok($$SELECT idem_fail('rh.t', (SELECT token FROM idem_claim('rh.t', '\xaa'::bytea)),
                                   '{"reason": "timeout"}', retryable => true, response_code => 503,
                                   headers => '{"Retry-After": "1"}')$$,
                'a retryable failure with headers');
SELECT is((SELECT response_headers FROM idem_lookup('rh.t')), '{"Retry-After": "1"}'::jsonb, 'saved');
SELECT results_eq($$SELECT outcome, token, response_code, response_headers FROM idem_claim('rh.t', '\xaa'::bytea)$$,
                  $$VALUES ('takeover', 2::bigint, NULL::integer, NULL::jsonb)$$,
                  'the takeover''s row has no headers of the failed attempt');
SELECT is((SELECT response_headers FROM idem_lookup('rh.t')), NULL::jsonb, 'and neither has the record');
SELECT throws_ok($$SELECT idem_complete('rh.t', 1, '{}', 200, headers => '{"Location": "/stale"}')$$,
                 'IK002', NULL, 'the stale owner cannot complete with headers: IK002');
SELECT is((SELECT response_headers FROM idem_lookup('rh.t')), NULL::jsonb, 'nothing written');
SELECT lives_ok($$SELECT idem_complete('rh.t', 2, '{"id": 9}', 201, headers => '{"Location": "/orders/9"}')$$,
                'the new owner completes with its headers');
SELECT is((SELECT response_headers FROM idem_claim('rh.t', '\xaa'::bytea)), '{"Location": "/orders/9"}'::jsonb,
          'and the replay has the new owner''s headers');

-- a record past its retention is claimed anew, without the old headers --------------------------
SELECT lives_ok($$SELECT idem_complete('rh.old', (SELECT token FROM idem_claim('rh.old', '\xaa'::bytea,
                                                      retention => '1 millisecond')),
                                       '{}', 200, headers => '{"Location": "/old"}')$$,
                'complete with headers and a short retention');
SELECT pg_sleep(0.01);
SELECT results_eq($$SELECT outcome, response_headers FROM idem_claim('rh.old', '\xaa'::bytea)$$,
                  $$VALUES ('new', NULL::jsonb)$$, 'claimed anew: no headers');

-- resolve with headers ------------------------------------------------------------------------
SELECT lives_ok($$SELECT idem_mark_unknown('rh.u', (SELECT token FROM idem_claim('rh.u', '\xaa'::bytea)),
                                           '{"gateway": "no reply"}')$$, 'an unknown outcome');
SELECT lives_ok($$SELECT idem_resolve('rh.u', 'succeeded', '{"id": 11}', 201,
                                      headers => '{"Location": "/orders/11"}')$$,
                'resolved to succeeded with headers');
SELECT results_eq($$SELECT outcome, response_code, result, response_headers FROM idem_claim('rh.u', '\xaa'::bytea)$$,
                  $$VALUES ('replay', 201, '{"id": 11}'::jsonb, '{"Location": "/orders/11"}'::jsonb)$$,
                  'the replay carries the reconciler''s headers');
SELECT lives_ok($$SELECT idem_mark_unknown('rh.u2', (SELECT token FROM idem_claim('rh.u2', '\xaa'::bytea)),
                                           '{"gateway": "no reply"}')$$, 'another unknown outcome');
SELECT lives_ok($$SELECT idem_resolve('rh.u2', 'failed', '{"reason": "declined"}', 402,
                                      headers => '{"X-Request-Id": "r-3"}')$$,
                'resolved to failed with headers');
SELECT is((SELECT response_headers FROM idem_lookup('rh.u2')), '{"X-Request-Id": "r-3"}'::jsonb, 'saved');

-- invalid headers: 22023, nothing written -------------------------------------------------------
SELECT is((SELECT token FROM idem_claim('rh.bad', '\xaa'::bytea, '1 hour')), 1::bigint, 'claimed');
SELECT throws_ok($$SELECT idem_complete('rh.bad', 1, '{}', 200, headers => '["Location", "/x"]')$$,
                 '22023', 'headers must be a JSON object', 'complete: an array is refused');
SELECT throws_ok($$SELECT idem_complete('rh.bad', 1, '{}', 200, headers => '{"X-Count": 2}')$$,
                 '22023', 'value of header "X-Count" must be a string or an array of strings',
                 'complete: a number is refused');
SELECT throws_ok($$SELECT idem_fail('rh.bad', 1, '{}', headers => '{"": "x"}')$$,
                 '22023', 'header name must not be empty', 'fail: an empty name is refused');
SELECT throws_ok($$SELECT idem_fail('rh.bad', 1, '{}', headers => '{"Vary": ["Accept", 1]}')$$,
                 '22023', 'value of header "Vary" must be a string or an array of strings',
                 'fail: an array with a number is refused');
SELECT throws_ok($$SELECT idem_resolve('rh.u', 'succeeded', headers => '{"Bad Name": "x"}')$$,
                 '22023', 'invalid header name "Bad Name"', 'resolve: checked before the record is read');
SELECT results_eq($$SELECT status::text, result, response_code, response_headers FROM idem_lookup('rh.bad')$$,
                  $$VALUES ('processing', NULL::jsonb, NULL::integer, NULL::jsonb)$$,
                  'the refused calls wrote nothing');

SELECT * FROM finish();
ROLLBACK;
