-- Included by the pg_regress tests (pg_regress runs from the top of the tree).
-- Errors are shown as "ERROR:  <SQLSTATE>: <message>" with their DETAIL and
-- HINT: like VERBOSITY verbose, without the LOCATION line (source line numbers).
\set SHOW_CONTEXT never
CREATE FUNCTION pg_temp.expect_error(sql text) RETURNS void LANGUAGE plpgsql AS $f$
DECLARE
    st text;
    msg text;
    det text;
    hnt text;
BEGIN
    BEGIN
        EXECUTE sql;
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT,
                                det = PG_EXCEPTION_DETAIL, hnt = PG_EXCEPTION_HINT;
    END;
    IF st IS NULL THEN
        RAISE EXCEPTION 'statement did not fail: %', sql;
    END IF;
    msg := st || ': ' || msg;
    IF det <> '' AND hnt <> '' THEN
        RAISE EXCEPTION USING ERRCODE = st, MESSAGE = msg, DETAIL = det, HINT = hnt;
    ELSIF det <> '' THEN
        RAISE EXCEPTION USING ERRCODE = st, MESSAGE = msg, DETAIL = det;
    ELSIF hnt <> '' THEN
        RAISE EXCEPTION USING ERRCODE = st, MESSAGE = msg, HINT = hnt;
    ELSE
        RAISE EXCEPTION USING ERRCODE = st, MESSAGE = msg;
    END IF;
END
$f$;
