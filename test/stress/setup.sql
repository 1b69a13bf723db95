-- The business table and the owner's actions of the stress run: each owner
-- writes its business row in the transaction of its idem_complete, so a
-- stale token (IK002) rolls the row back with the completion.
CREATE EXTENSION IF NOT EXISTS idempotency;
CREATE TABLE stress_business (key text NOT NULL, token bigint NOT NULL,
                              at timestamptz NOT NULL DEFAULT clock_timestamp());

CREATE FUNCTION stress_complete(k text, tok bigint) RETURNS int LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO stress_business (key, token) VALUES (k, tok);
    PERFORM idem_complete(k, tok, jsonb_build_object('token', tok));
    RETURN 1;
EXCEPTION WHEN SQLSTATE 'IK002' THEN
    RETURN 0;                           -- fenced off: the business row goes too
END $$;

CREATE FUNCTION stress_fail(k text, tok bigint) RETURNS int LANGUAGE plpgsql AS $$
BEGIN
    PERFORM idem_fail(k, tok, '{"error": "retry me"}', retryable => true);
    RETURN 1;
EXCEPTION WHEN SQLSTATE 'IK002' THEN
    RETURN 0;
END $$;

CREATE FUNCTION stress_checkpoint(k text, tok bigint) RETURNS int LANGUAGE plpgsql AS $$
BEGIN
    PERFORM idem_checkpoint(k, tok, 'half way');
    RETURN 1;
EXCEPTION WHEN SQLSTATE 'IK002' THEN
    RETURN 0;
END $$;
