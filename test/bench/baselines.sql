-- The two baselines the benchmark compares the extension with, written as a
-- careful developer would without it.
--
-- (a) raw SQL: the statements an application sends itself (see raw_*.sql);
--     this is its table.
CREATE TABLE raw_keys (
    key           text PRIMARY KEY,
    fingerprint   bytea NOT NULL,
    status        text NOT NULL,
    token         bigint NOT NULL DEFAULT 1,
    locked_until  timestamptz,
    response      jsonb,
    response_code int,
    created_at    timestamptz NOT NULL DEFAULT now(),
    completed_at  timestamptz
);

-- (b) PL/pgSQL: the same semantics as idem_claim / idem_complete (outcomes,
--     fingerprint check, leases, fencing token), in a table of its own.
CREATE TABLE plpgsql_keys (
    scope         text NOT NULL DEFAULT '',
    key           text NOT NULL,
    fingerprint   bytea NOT NULL,
    status        text NOT NULL,
    token         bigint NOT NULL,
    lease_expires_at timestamptz,
    recovery_point text,
    result        jsonb,
    response_code int,
    error         jsonb,
    attempts      int NOT NULL,
    created_at    timestamptz NOT NULL,
    updated_at    timestamptz NOT NULL,
    completed_at  timestamptz,
    expires_at    timestamptz NOT NULL,
    PRIMARY KEY (scope, key)
);
-- The same semantics include removing expired keys without reading the whole
-- table, as idem_purge does through its index on purge_after.  expires_at is
-- set once, at the claim, so this index costs the completions no HOT update.
CREATE INDEX ON plpgsql_keys (expires_at);

CREATE FUNCTION plpgsql_claim(p_key text, p_fingerprint bytea, p_lease interval,
                              p_scope text DEFAULT '',
                              OUT outcome text, OUT token bigint, OUT status text,
                              OUT result jsonb, OUT response_code int)
LANGUAGE plpgsql AS $$
DECLARE
    r plpgsql_keys;
BEGIN
    LOOP
        SELECT * INTO r FROM plpgsql_keys k WHERE k.scope = p_scope AND k.key = p_key;
        IF NOT FOUND THEN
            INSERT INTO plpgsql_keys (scope, key, fingerprint, status, token, lease_expires_at,
                                      attempts, created_at, updated_at, expires_at)
            VALUES (p_scope, p_key, p_fingerprint, 'processing', 1, clock_timestamp() + p_lease,
                    1, clock_timestamp(), clock_timestamp(), clock_timestamp() + interval '1 day')
            ON CONFLICT DO NOTHING;
            IF FOUND THEN
                outcome := 'new'; token := 1; status := 'processing';
                RETURN;
            END IF;
            CONTINUE;
        END IF;
        IF r.fingerprint <> p_fingerprint THEN
            RAISE EXCEPTION 'idempotency key "%" was already used for a different request', p_key
                USING ERRCODE = 'IK001';
        END IF;
        IF r.status IN ('succeeded', 'failed') THEN
            outcome := 'replay'; status := r.status; result := r.result;
            response_code := r.response_code;
            RETURN;
        END IF;
        IF r.lease_expires_at > clock_timestamp() THEN
            outcome := 'in_progress'; status := r.status;
            RETURN;
        END IF;
        UPDATE plpgsql_keys k SET token = k.token + 1, attempts = k.attempts + 1,
               lease_expires_at = clock_timestamp() + p_lease, updated_at = clock_timestamp()
         WHERE k.scope = p_scope AND k.key = p_key AND k.token = r.token
               AND k.status = 'processing' AND k.lease_expires_at <= clock_timestamp()
        RETURNING k.token INTO token;
        IF FOUND THEN
            outcome := 'takeover'; status := 'processing';
            RETURN;
        END IF;
    END LOOP;
END $$;

CREATE FUNCTION plpgsql_complete(p_key text, p_token bigint, p_result jsonb,
                                 p_response_code int, p_scope text DEFAULT '')
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE plpgsql_keys k SET status = 'succeeded', result = p_result,
           response_code = p_response_code, completed_at = clock_timestamp(),
           updated_at = clock_timestamp(), lease_expires_at = NULL
     WHERE k.scope = p_scope AND k.key = p_key AND k.token = p_token AND k.status = 'processing';
    IF NOT FOUND THEN
        RAISE EXCEPTION 'token % is not the current fencing token of idempotency key "%"',
            p_token, p_key USING ERRCODE = 'IK002';
    END IF;
END $$;

-- (4) the state machine trigger against no trigger and a PL/pgSQL trigger
CREATE TABLE upd_plain (id int PRIMARY KEY, status text NOT NULL, n int NOT NULL);
INSERT INTO upd_plain SELECT g, 'A', 0 FROM generate_series(1, 10000) g;
CREATE TABLE upd_machine (LIKE upd_plain INCLUDING ALL);
INSERT INTO upd_machine SELECT * FROM upd_plain;
CREATE TABLE upd_plpgsql (LIKE upd_plain INCLUDING ALL);
INSERT INTO upd_plpgsql SELECT * FROM upd_plain;
SELECT idem_define_machine('bench_ab', '{"A": ["B"], "B": ["A"]}');
SELECT idem_attach_machine('upd_machine', 'status', 'bench_ab');
CREATE TABLE plpgsql_moves (from_state text, to_state text, PRIMARY KEY (from_state, to_state));
INSERT INTO plpgsql_moves VALUES ('A', 'B'), ('B', 'A');
CREATE FUNCTION plpgsql_enforce() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status IS DISTINCT FROM OLD.status
       AND NOT EXISTS (SELECT 1 FROM plpgsql_moves m
                       WHERE m.from_state = OLD.status AND m.to_state = NEW.status) THEN
        RAISE EXCEPTION 'invalid transition from "%" to "%"', OLD.status, NEW.status;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER enforce BEFORE UPDATE ON upd_plpgsql
    FOR EACH ROW EXECUTE FUNCTION plpgsql_enforce();

-- (5) the raw inbox a developer would write
CREATE TABLE raw_inbox (consumer text, message_id text, received_at timestamptz DEFAULT now(),
                        PRIMARY KEY (consumer, message_id));

-- (6) the outbox: a business row updated with each emit, and the raw outbox a
-- developer would write, equivalent to idem_outbox: the same columns,
-- defaults drawn by the INSERT (id, seq, times), the same indexes and
-- fillfactor; its INSERT is all an emit does, without checks or NOTIFY.
-- Its id is time-ordered like ours (a UUID of version 7, so that the primary
-- key grows at its right edge, not at random pages): PostgreSQL 18's
-- uuidv7(), which is C and builds the same bytes as ours; before 18, which
-- has none, the expression a developer would write, inlined into the
-- INSERT: 16 random bytes (gen_random_uuid, as ours draws them), the first 6
-- replaced by the milliseconds of clock_timestamp(), the version bits set to
-- 7 (a v4's variant is already v7's).  Ours also orders ids within a
-- millisecond; this one does not, which moves no index entry off the last page.
DO $do$
BEGIN
    IF current_setting('server_version_num')::int >= 180000 THEN
        EXECUTE $f$CREATE FUNCTION raw_uuidv7() RETURNS uuid LANGUAGE sql VOLATILE
                   AS 'SELECT uuidv7()'$f$;
    ELSE
        EXECUTE $f$CREATE FUNCTION raw_uuidv7() RETURNS uuid LANGUAGE sql VOLATILE AS $b$
            SELECT encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid())
                              placing substring(int8send((date_part('epoch', clock_timestamp()) * 1000)::bigint) FROM 3)
                              FROM 1 FOR 6), 52, 1), 53, 1), 'hex')::uuid
        $b$
        $f$;
    END IF;
END
$do$;
CREATE TABLE bench_accounts (id integer PRIMARY KEY, n bigint NOT NULL DEFAULT 0) WITH (fillfactor = 50);
INSERT INTO bench_accounts (id) SELECT g FROM generate_series(1, 10000) g;
CREATE TABLE raw_outbox (LIKE idem_outbox INCLUDING DEFAULTS INCLUDING CONSTRAINTS) WITH (fillfactor = 90);
CREATE SEQUENCE raw_outbox_seq;
ALTER TABLE raw_outbox ALTER id SET DEFAULT raw_uuidv7(),
    ALTER seq SET DEFAULT nextval('raw_outbox_seq'),
    ALTER created_at SET DEFAULT clock_timestamp(),
    ALTER available_at SET DEFAULT clock_timestamp(),
    ALTER updated_at SET DEFAULT clock_timestamp(),
    ADD PRIMARY KEY (id);
CREATE INDEX ON raw_outbox (available_at, seq) WHERE available_at IS NOT NULL;
-- like idem_outbox_key: the scope is part of the key
CREATE INDEX ON raw_outbox (aggregatetype, aggregateid, scope, seq) WHERE available_at IS NOT NULL;
CREATE INDEX ON raw_outbox USING brin (created_at) WITH (pages_per_range = 16);

-- (2) replay: 10000 finished keys in each implementation
SELECT count(*) FROM (
    SELECT idem_complete('r' || g, (SELECT c.token FROM idem_claim('r' || g, '\x01'::bytea, '1 hour',
                                                                     retention => '1 day') c),
                         '{"order_id": 1}', 201)
    FROM generate_series(1, 10000) g) x;
INSERT INTO raw_keys (key, fingerprint, status, response, response_code, completed_at)
SELECT 'r' || g, '\x01', 'succeeded', '{"order_id": 1}', 201, now() FROM generate_series(1, 10000) g;
SELECT count(*) FROM (
    SELECT plpgsql_complete('r' || g, (plpgsql_claim('r' || g, '\x01'::bytea, '1 hour')).token,
                            '{"order_id": 1}', 201)
    FROM generate_series(1, 10000) g) x;
ANALYZE;

-- (7) the purge rate, timed in the server
CREATE FUNCTION bench_purge_rate(batch_size int) RETURNS numeric LANGUAGE plpgsql AS $$
DECLARE
    started timestamptz := clock_timestamp();
    purged bigint := idem_purge(batch_size);
BEGIN
    RETURN round(purged / greatest(extract(epoch FROM clock_timestamp() - started), 0.000001));
END $$;
