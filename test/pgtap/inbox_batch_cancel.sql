-- A batch accept can be cancelled however long its array: the loops over
-- the ids (their checks, the probes of wait => false) check for interrupts.
-- An array of 3,000,000 ids already in key order (no sort) with
-- wait => false probes the primary key once per id, for seconds; under a
-- statement_timeout of 200 ms the call must end with 57014 well within a
-- second of its start, not after the whole loop.  Everything is rolled back.
BEGIN;
SELECT plan(2);

CREATE TEMP TABLE big_batch AS
SELECT array_agg(lpad(i::text, 9, '0') ORDER BY i) AS ids FROM generate_series(1, 3000000) i;

-- the milliseconds from the call to its cancellation, or NULL if not cancelled
CREATE FUNCTION pg_temp.cancelled_after(ids text[]) RETURNS double precision
LANGUAGE plpgsql AS $$
DECLARE
    t0 timestamptz := clock_timestamp();
BEGIN
    PERFORM count(*) FROM idem_inbox_accept_many('ib.cancel', ids, wait => false);
    RETURN NULL;
EXCEPTION WHEN query_canceled THEN
    RETURN extract(epoch FROM clock_timestamp() - t0) * 1000;
END
$$;

SET LOCAL statement_timeout = '200ms';
CREATE TEMP TABLE cancelled AS SELECT pg_temp.cancelled_after(ids) AS ms FROM big_batch;
RESET statement_timeout;

SELECT isnt((SELECT ms FROM cancelled), NULL, 'statement_timeout cancels a batch of 3,000,000 ids with wait => false');
SELECT cmp_ok((SELECT ms FROM cancelled), '<', 1000::double precision,
              'within a second of its start, not after its loop over the ids');

SELECT * FROM finish();
ROLLBACK;
