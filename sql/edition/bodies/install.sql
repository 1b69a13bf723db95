-- Bodies of the functions the install script itself calls or fires
-- (generate.py says how this file is read).

--@ idem_machines_changed()
-- The C edition invalidates the triggers' cached machines here; the SQL
-- edition caches nothing, so only the protocol is checked.
LANGUAGE plpgsql
AS $body$
BEGIN
    IF TG_LEVEL IS DISTINCT FROM 'STATEMENT' THEN
        RAISE EXCEPTION 'idem_machines_changed() must be called as a statement trigger'
            USING ERRCODE = '39P01';
    END IF;
    RETURN NULL;
END
$body$;

--@ idem_trigger_arg(bytea, integer)
-- pg_trigger.tgargs holds the arguments NUL-terminated one after the other.
LANGUAGE plpgsql
AS $body$
DECLARE
    args bytea := tgargs;
    nul integer;
    arg bytea;
BEGIN
    FOR i IN 1 .. n LOOP
        IF pg_catalog.length(args) = 0 THEN
            RETURN NULL;
        END IF;
        nul := pg_catalog.position(args, '\x00'::bytea);
        IF nul = 0 THEN
            arg := args;
            args := ''::bytea;
        ELSE
            arg := pg_catalog.substr(args, 1, nul - 1);
            args := pg_catalog.substr(args, nul + 1);
        END IF;
        IF i = n THEN
            BEGIN
                RETURN pg_catalog.convert_from(arg, pg_catalog.getdatabaseencoding());
            EXCEPTION WHEN character_not_in_repertoire OR untranslatable_character THEN
                RAISE EXCEPTION 'trigger argument % is not valid in the database encoding', n
                    USING ERRCODE = '22021';
            END;
        END IF;
    END LOOP;
    RETURN NULL;
END
$body$;

--@ idem_copy_function_grants(regprocedure, regprocedure)
-- Grants on "to" the EXECUTE privileges that roles other than the owner of
-- "from" hold on it, with their grant options.  Created, called and dropped
-- by the script (src/upgrade.c says why).
LANGUAGE plpgsql
AS $body$
DECLARE
    item record;
BEGIN
    FOR item IN
        SELECT a.grantee, a.is_grantable
          FROM pg_catalog.pg_proc p,
               pg_catalog.aclexplode(coalesce(p.proacl, pg_catalog.acldefault('f', p.proowner))) a
         WHERE p.oid = from_function AND a.grantee <> p.proowner AND a.privilege_type = 'EXECUTE'
    LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %s%s', to_function::pg_catalog.text,
            CASE WHEN item.grantee = 0 THEN 'PUBLIC'
                 ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(item.grantee)) END,
            CASE WHEN item.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
END
$body$;

--@ idem_make_grants_ordinary()
-- The C edition's update turns grants that an update script made to other
-- roles into ordinary grants (src/upgrade.c).  The SQL edition is only ever
-- installed fresh at 0.3.0 or later, whose script grants to no role but the
-- owner and PUBLIC; that is checked, so a later change cannot slip by.
LANGUAGE plpgsql
AS $body$
DECLARE
    other text;
BEGIN
    SELECT pg_catalog.format('%s %s', i.classoid::pg_catalog.regclass, i.objoid)
      INTO other
      FROM pg_catalog.pg_init_privs i,
           pg_catalog.aclexplode(i.initprivs) a
     WHERE i.privtype = 'e'
       AND (i.classoid, i.objoid) IN
           (SELECT d.classid, d.objid FROM pg_catalog.pg_depend d
             WHERE d.refclassid = 'pg_catalog.pg_extension'::pg_catalog.regclass
               AND d.deptype = 'e'
               AND d.refobjid = (SELECT e.oid FROM pg_catalog.pg_extension e
                                  WHERE e.extname = 'idempotency'))
       AND a.grantee <> 0
       AND a.grantee <> (SELECT e.extowner FROM pg_catalog.pg_extension e
                          WHERE e.extname = 'idempotency')
     LIMIT 1;
    IF other IS NOT NULL THEN
        RAISE EXCEPTION 'the install script granted to a role other than the owner and PUBLIC (%)', other
            USING ERRCODE = 'XX000';
    END IF;
END
$body$;
