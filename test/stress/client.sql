-- One request of the stress run: claim a random key with a 1 ms lease, so
-- that owners are taken over all the time, pause, then complete, fail
-- (retryably) or just checkpoint and vanish.
\set k random(1, :keys)
\set action random(1, 4)
\set pause random(0, 2000)
SELECT token AS tok, (outcome IN ('new', 'takeover'))::int AS owner
  FROM idem_claim('stress-' || :k, idem_fingerprint('request ' || :k), '1 ms') \gset
\if :owner
\sleep :pause us
\if :action = 1
SELECT stress_complete('stress-' || :k, :tok);
\elif :action = 2
SELECT stress_fail('stress-' || :k, :tok);
\else
SELECT stress_checkpoint('stress-' || :k, :tok);
\endif
\endif
