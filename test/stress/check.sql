-- The invariants of the stress run; each row is a count that must be 0.
SELECT 'keys with more than one business row' AS violation, count(*) AS n
  FROM (SELECT key FROM stress_business GROUP BY key HAVING count(*) > 1) d
UNION ALL
SELECT 'succeeded records without the business row of their token', count(*)
  FROM idempotency_records r
 WHERE r.status = 'succeeded'
   AND NOT EXISTS (SELECT 1 FROM stress_business b WHERE b.key = r.key AND b.token = r.token)
UNION ALL
SELECT 'business rows without a succeeded record of their token', count(*)
  FROM stress_business b
 WHERE NOT EXISTS (SELECT 1 FROM idempotency_records r
                    WHERE r.key = b.key AND r.status = 'succeeded' AND r.token = b.token)
UNION ALL
SELECT 'results that are not their own token''s', count(*)
  FROM idempotency_records r
 WHERE r.status = 'succeeded' AND (r.result ->> 'token')::bigint <> r.token;
