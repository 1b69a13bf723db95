#!/usr/bin/env python3
"""Generates the SQL edition's scripts from the C edition's upgrade chain.

The SQL edition is the C edition's install script with each C function's
declaration kept (name, argument names, defaults, result, volatility,
strictness, parallel safety, rows) and only its `AS 'MODULE_PATHNAME', ...
LANGUAGE C` replaced by a body from sql/edition/bodies/*.sql, with
`SET search_path = pg_catalog, pg_temp` unless the body sets it or is
SQL-standard (`LANGUAGE sql` then `RETURN ...` or `BEGIN ATOMIC ... END`,
bound at creation).  Every table,
view, policy, grant and PL/pgSQL function therefore has one definition, the
chain's.  A bodies file holds blocks, each headed by the declaration's key:

    --@ idem_release(text, bigint, text)
    LANGUAGE plpgsql [SECURITY DEFINER] [SET search_path = ...]
    AS $body$ ... $body$;

and may hold a block headed `--@ internal`: plain SQL (functions the bodies
share, PL/pgSQL only, since they are created before the tables they use),
placed at the top of the script.

It fails on a C declaration without a body, a body without a declaration, a
key given twice, or any `LANGUAGE C` / MODULE_PATHNAME left in the output.

    generate.py extension CHAIN...   the extension script (CREATE EXTENSION)
    generate.py update CHAIN...      the update script of the chain's last step
                                     (one after 0.3.0: ALTER EXTENSION ... UPDATE)
    generate.py pgtle CHAIN...       pg_tle registration (pgtle.install_extension,
                                     install_update_path for the later steps)
    generate.py plain CHAIN...       psql -v schema=NAME -f, without an extension,
                                     recording the version, updating in place
    generate.py keys CHAIN...        the keys the bodies must provide
    --allow-missing (any mode)       a missing body raises 0A000 (development only)

"Versions" below says how a version after 0.3.0 is carried by each script.
"""
import glob
import os
import re
import sys

ALLOW_MISSING = False
HERE = os.path.dirname(os.path.abspath(__file__))

C_DECL = re.compile(
    r"CREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION\s+@extschema@\.(\w+)\s*\(",
    re.I)
C_TAIL = re.compile(
    r"AS\s+'MODULE_PATHNAME'\s*,\s*'\w+'\s*LANGUAGE\s+C\b([^;]*);", re.I)


def fail(msg):
    sys.exit('sql/edition/generate.py: ' + msg)


def split_top(s):
    """Splits s at commas outside parentheses and quotes."""
    parts, depth, cur, quote = [], 0, '', False
    for ch in s:
        if ch == "'":
            quote = not quote
        elif not quote and ch == '(':
            depth += 1
        elif not quote and ch == ')':
            depth -= 1
        if ch == ',' and depth == 0 and not quote:
            parts.append(cur)
            cur = ''
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return parts


def arg_type(arg):
    a = re.split(r'\s+DEFAULT\s+|\s*=\s*', arg.strip(), maxsplit=1, flags=re.I)[0]
    words = a.split()
    if words and words[0].upper() in ('IN', 'OUT', 'INOUT', 'VARIADIC'):
        if words[0].upper() == 'OUT':
            return None
        words = words[1:]
    if len(words) < 2:
        fail('an argument without a name: %r' % arg)
    return ' '.join(words[1:]).replace('@extschema@.', '')


def c_declarations(text, others=False):
    """Yields (start, end, key, header, attributes) of each C declaration;
    with others, (start, None, key, None, None) of every other function's."""
    for m in C_DECL.finditer(text):
        # the argument list: up to the matching parenthesis
        depth, i = 1, m.end()
        while depth:
            if text[i] == '(':
                depth += 1
            elif text[i] == ')':
                depth -= 1
            i += 1
        args = text[m.end():i - 1]
        end_stmt = text.index(';', i)
        tail = C_TAIL.search(text, i)
        types = [t for t in map(arg_type, split_top(args)) if t is not None]
        key = '%s(%s)' % (m.group(1), ', '.join(types))
        if not tail or tail.end() - 1 != end_stmt:
            # not a C function: a PL/pgSQL or SQL one
            if others:
                yield m.start(), None, key, None, None
            continue
        header = text[m.start():tail.start()].rstrip()
        yield m.start(), tail.end(), key, header, tail.group(1).split()


def read_bodies():
    bodies, internal, seen = {}, [], {}
    for path in sorted(glob.glob(os.path.join(HERE, 'bodies', '*.sql'))):
        name = os.path.relpath(path, os.path.dirname(os.path.dirname(HERE)))
        blocks = re.split(r'^--@[ \t]*(.*)$', open(path).read(), flags=re.M)
        for key, block in zip(blocks[1::2], blocks[2::2]):
            key = key.strip()
            if key == 'internal':
                internal.append('-- from %s\n%s' % (name, block.strip()))
                continue
            if key in seen:
                fail('%s: a second body for %s (the first in %s)' % (name, key, seen[key]))
            seen[key] = name
            # comment lines before LANGUAGE are the reader's, not the script's
            block = re.sub(r'\A(\s*--[^\n]*\n)*', '', block).strip()
            # AS '...' / AS $x$...$x$, or a SQL-standard body (RETURN / BEGIN ATOMIC)
            m = re.match(r'LANGUAGE\s+(plpgsql|sql)\b(.*?)\n\s*((?:AS|RETURN|BEGIN\s+ATOMIC)\s+.*?);?\s*$',
                         block, re.S | re.I)
            if not m:
                fail('%s: the body of %s is not "LANGUAGE plpgsql|sql ... AS ...;"' % (name, key))
            bodies[key] = (m.group(1), m.group(2).strip(), m.group(3).rstrip(), name)
    return bodies, internal


# ---------------------------------------------------------------------------
# Versions.  The SQL edition starts at FIRST: its install script is the whole
# chain up to FIRST (0.1.0, then each update), as the C edition's is.  Every
# later step of the chain (idempotency--A--B.sql, A >= FIRST) is an update of
# the SQL edition too, made by update_script(): the step with its bodies, then
# every function that the step does not declare again re-created with its
# current body (CREATE OR REPLACE, where the function exists), since a body
# may change in a release whose C declaration does not, which the C edition
# picks up by loading a new library and the SQL edition only by an update
# script.  The internal helpers come first, as CREATE OR REPLACE (a helper
# whose result type changes needs a new name).  So every install and every
# update leaves exactly the functions a fresh install of that version has.
#
# How each way of installing carries them (for FIRST alone there is no update):
#   extension   idempotency--V.sql (the whole chain) and, by mode "update",
#               idempotency--A--B.sql per later step: the files of a server
#               that installs the SQL edition from files (the tests' trees).
#   pgtle       one re-runnable registration: pgtle.install_extension(V, the
#               whole chain) where the extension is not registered yet, else
#               pgtle.install_extension_version_sql(V, ...) where V is not;
#               pgtle.install_update_path(A, B, update) for every later step
#               not registered yet (so a database registered at any earlier
#               version can ALTER EXTENSION idempotency UPDATE); then
#               pgtle.set_default_version(V), never to an older version.
#   plain       one DO block that reads the version recorded in the schema's
#               table idem_installation and runs the whole chain (nothing
#               recorded), nothing (V recorded), the update steps from the
#               recorded version to V in order (older), or refuses (newer).
# ---------------------------------------------------------------------------
FIRST = '0.3.0'
STEP_RE = re.compile(r'idempotency--(?:([0-9.]+)--)?([0-9.]+)\.sql$')


def step_of(path):
    m = STEP_RE.search(path)
    if not m:
        fail('cannot tell the version from %s' % path)
    return m.group(1), m.group(2)


def version_key(v):
    return tuple(int(x) for x in v.split('.'))


def version_of(chain):
    return step_of(chain[-1])[1]


def dollar_tag(text, base):
    tag = base
    while ('$%s$' % tag) in text:
        tag += '_'
    return '$%s$' % tag


def chain_text(path):
    # psql's guard lines: the server drops them from extension scripts
    return re.sub(r'^\\echo .*$\n?', '', open(path).read(), flags=re.M)


class Edition:
    """The bodies, and the chain's files with their C declarations replaced."""

    def __init__(self, chain):
        self.chain = chain
        self.bodies, self.internal = read_bodies()
        self.used = set()
        self.full = self.internal_sql() + ''.join(self.substitute(p) for p in chain)
        unused = sorted(set(self.bodies) - self.used)
        if unused:
            fail('bodies without a C declaration: %s (in %s)' % (
                ', '.join(unused), ', '.join(sorted({self.bodies[k][3] for k in unused}))))
        check_output(self.full)
        self.version = version_of(chain)
        if version_key(self.version) < version_key(FIRST):
            fail('the SQL edition starts at %s, the chain ends at %s' % (FIRST, self.version))
        # the steps after FIRST: (from, to, update script)
        self.updates = []
        for i, path in enumerate(chain):
            a, b = step_of(path)
            if a is not None and version_key(a) >= version_key(FIRST):
                self.updates.append((a, b, self.update_script(chain[:i + 1])))

    def body(self, key, path):
        if key not in self.bodies:
            if not ALLOW_MISSING:
                fail('no body for %s (declared in %s)' % (key, path))
            # development only (--allow-missing): never committed
            self.bodies[key] = ("plpgsql", "", "AS $missing$BEGIN RAISE EXCEPTION 'not yet in the SQL edition: %s' USING ERRCODE = '0A000'; END$missing$" % key, path)
        return self.bodies[key]

    def definition(self, key, header, attrs, path):
        language, extra, body, _ = self.body(key, path)
        self.used.add(key)
        # the house rule (README "How the functions run"): every SQL and
        # PL/pgSQL function pins search_path; a body may pin it itself
        # (not a SQL-standard body: its names are bound at creation)
        standard = re.match(r'(RETURN|BEGIN\s+ATOMIC)\b', body, re.I)
        if not standard and not re.search(r'\bSET\s+search_path\b', extra, re.I):
            extra = (extra + ' ' if extra else '') + 'SET search_path = pg_catalog, pg_temp'
        options = ' '.join([language] + attrs + ([extra] if extra else []))
        # the version of the code, which is these bodies (idem_version)
        body = body.replace('@edition_version@', version_of(self.chain))
        return '%s\nLANGUAGE %s\n%s;' % (header, options, body)

    def substitute(self, path):
        text = chain_text(path)
        out, pos = [], 0
        for start, end, key, header, attrs in c_declarations(text):
            out.append(text[pos:start])
            out.append(self.definition(key, header, attrs, path))
            pos = end
        out.append(text[pos:])
        return ''.join(out)

    def internal_sql(self, replace=False):
        if not self.internal:
            return ''
        blocks = self.internal
        if replace:
            # in an update they run again: only statements that can
            blocks = [re.sub(r'^CREATE\s+FUNCTION\b', 'CREATE OR REPLACE FUNCTION', b, flags=re.M | re.I)
                      for b in blocks]
            for statement in statements('\n'.join(blocks)):
                code = re.sub(r'(?s)/\*.*?\*/|--[^\n]*', '', statement).strip()
                if not re.match(r'(CREATE\s+OR\s+REPLACE\s+FUNCTION|COMMENT\s+ON|GRANT|REVOKE)\b', code, re.I):
                    fail('internal: a statement that an update cannot run again: %r' % code[:80])
        return ('/* The SQL edition\'s own helpers (sql/edition/bodies). */\n\n'
                + '\n\n'.join(blocks) + '\n\n')

    def update_script(self, chain):
        step = chain[-1]
        script = self.internal_sql(replace=True) + self.substitute(step)
        declared_now = {d[2] for d in c_declarations(chain_text(step))}
        # the last declaration of each function before the step, if C's
        latest = {}
        for path in chain[:-1]:
            for _, end, key, header, attrs in c_declarations(chain_text(path), others=True):
                if end is None:
                    latest.pop(key, None)
                else:
                    latest[key] = (header, attrs, path)
        refresh = []
        for key in sorted(set(latest) - declared_now):
            header, attrs, path = latest[key]
            header = re.sub(r'\ACREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION', 'CREATE OR REPLACE FUNCTION', header)
            create = self.definition(key, header, attrs, path)
            inner = dollar_tag(create, 'create')
            outer = dollar_tag(create + inner, 'refresh')
            refresh.append(
                "DO %s\nBEGIN\n"
                "    IF pg_catalog.to_regprocedure('@extschema@.%s') IS NOT NULL THEN\n"
                "        EXECUTE %s\n%s\n%s;\n    END IF;\nEND\n%s;\n" % (
                    outer, key, inner, create, inner, outer))
        if refresh:
            script += ('\n\n/* The functions this step does not declare again, with their bodies '
                       'of this version (generate.py, "Versions"). */\n\n' + '\n'.join(refresh))
        check_output(script)
        return script

    def head(self, what):
        return ('-- The SQL edition of idempotency %s%s, generated by sql/edition/generate.py\n'
                '-- from %s and sql/edition/bodies/*.sql.  Do not edit.\n\n') % (
                    self.version, what, ', '.join(os.path.basename(p) for p in self.chain))


def check_output(script):
    if re.search(r"LANGUAGE\s+C\b|MODULE_PATHNAME", script, re.I):
        fail('LANGUAGE C or MODULE_PATHNAME left in the output')


def main():
    if len(sys.argv) < 3:
        fail('usage: generate.py [--allow-missing] extension|update|pgtle|plain|keys CHAIN...')
    global ALLOW_MISSING
    args = sys.argv[1:]
    if '--allow-missing' in args:
        args.remove('--allow-missing')
        ALLOW_MISSING = True
    mode, chain = args[0], args[1:]
    if mode == 'keys':
        for path in chain:
            for _, _, key, _, _ in c_declarations(open(path).read()):
                print('%s\t%s' % (key, os.path.basename(path)))
        return
    ed = Edition(chain)
    if mode == 'extension':
        sys.stdout.write(ed.head('') + '\\echo Use "CREATE EXTENSION idempotency" to load this file. \\quit\n\n'
                         + ed.full)
    elif mode == 'update':
        if not ed.updates or ed.updates[-1][1] != ed.version:
            fail('mode update: the chain must end with a step after %s' % FIRST)
        a, b, script = ed.updates[-1]
        sys.stdout.write(ed.head(' (update from %s)' % a)
                         + '\\echo Use "ALTER EXTENSION idempotency UPDATE TO \'%s\'" to load this file. \\quit\n\n' % b
                         + script)
    elif mode == 'pgtle':
        sys.stdout.write(pgtle_script(ed))
    elif mode == 'plain':
        sys.stdout.write(plain_script(ed))
    else:
        fail('unknown mode ' + mode)


# ---------------------------------------------------------------------------
# pg_tle
# ---------------------------------------------------------------------------
DESCRIPTION = 'idempotency keys, leases and fencing tokens whose guarantees live in the transaction (SQL edition)'


def pgtle_script(ed):
    v = ed.version
    literals = ed.full + ''.join(u[2] for u in ed.updates)
    tag = dollar_tag(literals, 'idempotency_sql_edition')
    steps = []
    for i, (a, b, script) in enumerate(ed.updates):
        t = dollar_tag(literals, 'idempotency_%s_%s' % (a.replace('.', '_'), b.replace('.', '_')))
        steps.append(
            "    IF NOT EXISTS (SELECT FROM pgtle.extension_update_paths('idempotency') p\n"
            "                    WHERE p.source = '%(a)s' AND p.target = '%(b)s' AND p.path = '%(a)s--%(b)s') THEN\n"
            "        PERFORM pgtle.install_update_path('idempotency', '%(a)s', '%(b)s', %(t)s\n%(s)s%(t)s);\n"
            "    END IF;\n" % {'a': a, 'b': b, 't': t, 's': script})
    outer = dollar_tag(literals + tag + ''.join(steps), 'register')
    return ed.head(' for pg_tle') + PGTLE % {
        'v': v, 'tag': tag, 'outer': outer, 'full': ed.full, 'steps': ''.join(steps),
        'description': DESCRIPTION, 'file': 'idempotency--%s.pgtle.sql' % v}


PGTLE = r"""-- Registers the SQL edition with pg_tle (Trusted Language Extensions: Amazon
-- RDS and Aurora, Supabase), as a role with pgtle_admin (no superuser needed):
--     psql -v ON_ERROR_STOP=1 -f %(file)s
-- then, in the database, by a role that may create in the schema:
--     CREATE EXTENSION idempotency SCHEMA idempotency;
-- The registration can be run again: it adds only what is missing.  A later
-- version's script adds that version and the update paths to it, so that
-- ALTER EXTENSION idempotency UPDATE updates a database created at any earlier
-- version; it never makes an older version the default.
DO %(outer)s
DECLARE
    script constant text := %(tag)s
%(full)s%(tag)s;
    current_default text;
BEGIN
    IF pg_catalog.to_regnamespace('pgtle') IS NULL THEN
        RAISE EXCEPTION 'pg_tle is not installed in database "%%"', pg_catalog.current_database()
            USING ERRCODE = 'undefined_object',
                  HINT = 'Preload it (shared_preload_libraries, on RDS the parameter group) and run CREATE EXTENSION pg_tle first.';
    END IF;
    IF NOT EXISTS (SELECT FROM pgtle.available_extensions() e WHERE e.name = 'idempotency') THEN
        PERFORM pgtle.install_extension('idempotency', '%(v)s',
            '%(description)s', script);
        RAISE NOTICE 'idempotency %(v)s (SQL edition) registered with pg_tle: CREATE EXTENSION idempotency';
    ELSIF NOT EXISTS (SELECT FROM pgtle.available_extension_versions() e
                       WHERE e.name = 'idempotency' AND e.version = '%(v)s') THEN
        PERFORM pgtle.install_extension_version_sql('idempotency', '%(v)s', script);
        RAISE NOTICE 'idempotency %(v)s (SQL edition) registered with pg_tle beside the versions there';
    ELSE
        RAISE NOTICE 'idempotency %(v)s (SQL edition) is already registered with pg_tle';
    END IF;
%(steps)s    SELECT e.default_version INTO current_default
      FROM pgtle.available_extensions() e WHERE e.name = 'idempotency';
    IF pg_catalog.string_to_array(current_default, '.')::integer[]
       OPERATOR(pg_catalog.<) pg_catalog.string_to_array('%(v)s', '.')::integer[] THEN
        PERFORM pgtle.set_default_version('idempotency', '%(v)s');
    END IF;
END
%(outer)s;
"""


# ---------------------------------------------------------------------------
# Plain SQL
# ---------------------------------------------------------------------------
# What only an extension has, and what a plain install does instead:
# - pg_extension_config_dump marks a member table for pg_dump; without an
#   extension pg_dump dumps every table anyway: the calls are left out.
# - the extension's members (pg_depend, deptype 'e'), which idem_revoke_all
#   walks: in a plain install they are the schema's functions, tables, views
#   and sequences whose names start with idem_ or idempotency_ (every object
#   of the chain is named so).
# Any other membership query left in the chain's text fails the generation.
# A body (sql/edition/bodies) that queries the membership finds nothing in a
# plain install; where that is not the right answer, the body must also look
# for the plain install (the table idem_installation of @extschema@).
CONFIG_DUMP = re.compile(
    r"^SELECT\s+pg_catalog\.pg_extension_config_dump\s*\((?:[^;']|'(?:[^']|'')*')*\)\s*;[ \t]*\n?",
    re.M | re.I)
MEMBERS = re.compile(
    r"FROM pg_catalog\.pg_depend d JOIN pg_catalog\.pg_(proc|class) (\w) ON \2\.oid OPERATOR\(pg_catalog\.=\) d\.objid"
    r"\s+WHERE d\.classid OPERATOR\(pg_catalog\.=\) 'pg_catalog\.pg_\1'::pg_catalog\.regclass"
    r"\s+AND d\.refclassid OPERATOR\(pg_catalog\.=\) 'pg_catalog\.pg_extension'::pg_catalog\.regclass"
    r"\s+AND d\.refobjid OPERATOR\(pg_catalog\.=\) \(SELECT e\.oid FROM pg_catalog\.pg_extension e"
    r"\s+WHERE e\.extname OPERATOR\(pg_catalog\.=\) 'idempotency'\)"
    r"\s+AND d\.deptype OPERATOR\(pg_catalog\.=\) 'e'")
MEMBERSHIP_LEFT = re.compile(r"deptype\s*(?:OPERATOR\(pg_catalog\.=\)|=)\s*'e'|pg_extension_config_dump", re.I)


def plain_members(m):
    catalog, alias = m.group(1), m.group(2)
    prefix = 'pro' if catalog == 'proc' else 'rel'
    return ("FROM pg_catalog.pg_%(c)s %(a)s\n"
            "        WHERE %(a)s.%(p)snamespace OPERATOR(pg_catalog.=) '@extschema@'::pg_catalog.regnamespace\n"
            "          AND %(a)s.%(p)sname OPERATOR(pg_catalog.~) '^(idem|idempotency)_'  -- plain install: no extension"
            % {'c': catalog, 'a': alias, 'p': prefix})


def plain_transform(script):
    script = CONFIG_DUMP.sub('', script)
    return MEMBERS.sub(plain_members, script)


def plain_check_chain(chain):
    for path in chain:
        script = plain_transform(chain_text(path))
        left = MEMBERSHIP_LEFT.search(script)
        if left:
            line = script.count('\n', 0, left.start()) + 1
            fail('plain: %s queries the extension\'s membership in a way generate.py cannot rewrite '
                 '(%r, see plain_transform)' % (path, script.splitlines()[line - 1].strip()))


DOLLAR = re.compile(r'\$([A-Za-z_\x80-\uffff][A-Za-z_0-9\x80-\uffff]*)?\$')


def statements(sql):
    """Splits sql at the semicolons that end statements: not those in
    comments, quoted strings or identifiers, or dollar-quoted bodies.
    Statements that are only comments are left out."""
    out, start, i, n = [], 0, 0, len(sql)
    only_comments = True
    while i < n:
        c = sql[i]
        if sql.startswith('--', i):
            j = sql.find('\n', i)
            i = n if j < 0 else j + 1
            continue
        if sql.startswith('/*', i):
            depth, i = 1, i + 2
            while depth and i < n:
                if sql.startswith('/*', i):
                    depth, i = depth + 1, i + 2
                elif sql.startswith('*/', i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
            continue
        if c.isspace():
            i += 1
            continue
        only_comments = False
        if c == "'":
            escapes = i > 0 and sql[i - 1] in 'eE' and (i < 2 or not (sql[i - 2].isalnum() or sql[i - 2] == '_'))
            i += 1
            while i < n:
                if escapes and sql[i] == '\\':
                    i += 2
                elif sql[i] == "'":
                    if sql.startswith("''", i):
                        i += 2
                    else:
                        break
                else:
                    i += 1
            i += 1
        elif c == '"':
            j = sql.find('"', i + 1)
            while j >= 0 and sql.startswith('""', j):
                j = sql.find('"', j + 2)
            i = n if j < 0 else j + 1
        elif c == '$' and not (i > 0 and (sql[i - 1].isalnum() or sql[i - 1] == '_')):
            m = DOLLAR.match(sql, i)
            if m:
                j = sql.find(m.group(0), m.end())
                if j < 0:
                    fail('an unterminated dollar quote %s' % m.group(0))
                i = j + len(m.group(0))
            else:
                i += 1
        elif c == ';':
            if not only_comments:
                out.append(sql[start:i + 1])
            start, i, only_comments = i + 1, i + 1, True
        else:
            i += 1
    if not only_comments:
        fail('a statement without its semicolon at the end: %r' % sql[start:start + 200])
    return out


# Where the plain script's literals are cut into statements, each EXECUTEd
# alone: an error then quotes the one statement that failed.
STATEMENT_SEPARATOR = '\n--@@ idempotency plain: the next statement @@--\n'


def plain_literal(script):
    parts = [p.strip('\n') for p in statements(script)]
    if any(STATEMENT_SEPARATOR.strip() in p for p in parts):
        fail('plain: the statement separator occurs in the script')
    return STATEMENT_SEPARATOR.join(parts) + '\n'


def plain_script(ed):
    plain_check_chain(ed.chain)
    full = plain_literal(plain_transform(ed.full))
    updates = [(a, b, plain_literal(plain_transform(s))) for a, b, s in ed.updates]
    literals = full + ''.join(u[2] for u in updates)
    tag = dollar_tag(literals, 'idempotency_sql_edition')
    steps = []
    for a, b, script in updates:
        t = dollar_tag(literals, 'idempotency_%s_%s' % (a.replace('.', '_'), b.replace('.', '_')))
        steps.append("        ('%s', '%s', %s\n%s%s)" % (a, b, t, script, t))
    outer = dollar_tag(literals + tag + ''.join(steps), 'idempotency_plain')
    if steps:
        step_values = 'VALUES\n' + ',\n'.join(steps)
    else:
        step_values = 'SELECT NULL::text, NULL::text, NULL::text WHERE false'
    return ed.head(' without an extension') + PLAIN % {
        'v': ed.version, 'tag': tag, 'outer': outer, 'full': full, 'steps': step_values,
        'separator': "E'%s'" % STATEMENT_SEPARATOR.replace('\n', '\\n'),
        'file': 'idempotency--%s.plain.sql' % ed.version}


PLAIN = r"""-- Installs the SQL edition without CREATE EXTENSION (Cloud SQL, AlloyDB,
-- Azure, Neon, any PostgreSQL), into a schema that exists and that the
-- installing role may create in (its own, typically; no superuser needed):
--     psql -v ON_ERROR_STOP=1 -v schema=idempotency -f %(file)s
-- The table idem_installation of that schema records each version installed.
-- Run again, the script does nothing; a later version's script updates the
-- schema in place to its version; an older one refuses.  As CREATE EXTENSION
-- does, it runs with search_path set to the schema, client_min_messages at
-- least "warning" and check_function_bodies off, in one transaction; two runs
-- at once take turns.
\if :{?schema}
\else
\echo 'usage: psql -v ON_ERROR_STOP=1 -v schema=NAME -f %(file)s (the schema must exist)'
DO $$BEGIN RAISE EXCEPTION 'the psql variable "schema" is not set: nothing installed'; END$$;
\quit
\endif
-- (not under "idempotency.": the C edition's library reserves that prefix)
SELECT pg_catalog.set_config('idempotency_plain.schema', :'schema', false) AS idempotency_plain_schema \gset
DO %(outer)s
DECLARE
    this_version constant text := '%(v)s';
    full_script constant text := %(tag)s
%(full)s%(tag)s;
    schema_name constant text := pg_catalog.current_setting('idempotency_plain.schema');
    schema_oid oid;
    schema_ident text;
    installed text;
    ext record;
    step record;
    steps integer := 0;
    statement text;
    separator constant text := %(separator)s;
    old_path constant text := pg_catalog.current_setting('search_path');
    old_messages constant text := pg_catalog.current_setting('client_min_messages');
    old_check constant text := pg_catalog.current_setting('check_function_bodies');
BEGIN
    PERFORM pg_catalog.set_config('idempotency_plain.schema', '', false);
    -- as CREATE EXTENSION refuses them (@extschema@ is quoted into literals)
    IF schema_name OPERATOR(pg_catalog.~) '["$''\\]' THEN
        RAISE EXCEPTION 'invalid character in schema name "%%": must not contain any of ""$''\"', schema_name
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT n.oid INTO schema_oid FROM pg_catalog.pg_namespace n
     WHERE n.nspname OPERATOR(pg_catalog.=) schema_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'schema "%%" does not exist', schema_name
            USING ERRCODE = 'invalid_schema_name',
                  HINT = 'Create it first, owned by the role that installs: CREATE SCHEMA ... AUTHORIZATION ...';
    END IF;
    IF NOT pg_catalog.has_schema_privilege(schema_oid, 'CREATE') THEN
        RAISE EXCEPTION 'permission denied for schema %%', schema_name
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Install as the schema''s owner, or as a role with CREATE on it.';
    END IF;
    schema_ident := pg_catalog.quote_ident(schema_name);
    SELECT e.extname, e.extversion INTO ext FROM pg_catalog.pg_extension e
     WHERE e.extname OPERATOR(pg_catalog.=) 'idempotency' AND e.extnamespace OPERATOR(pg_catalog.=) schema_oid;
    IF FOUND THEN
        RAISE EXCEPTION 'extension "idempotency" %% is installed in schema "%%"', ext.extversion, schema_name
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Update it with ALTER EXTENSION idempotency UPDATE, not with this script.';
    END IF;
    -- one run at a time per schema
    PERFORM pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended('idempotency plain install ' OPERATOR(pg_catalog.||) schema_name, 0));

    IF pg_catalog.to_regclass(schema_ident OPERATOR(pg_catalog.||) '.idem_installation') IS NOT NULL THEN
        EXECUTE pg_catalog.format('SELECT i.version FROM %%s.idem_installation i ORDER BY i.step DESC LIMIT 1', schema_ident)
           INTO installed;
        IF installed IS NULL THEN
            RAISE EXCEPTION 'schema "%%" has an empty idem_installation: the version installed is unknown', schema_name
                USING ERRCODE = 'object_not_in_prerequisite_state';
        END IF;
    ELSIF pg_catalog.to_regclass(schema_ident OPERATOR(pg_catalog.||) '.idempotency_records') IS NOT NULL THEN
        RAISE EXCEPTION 'schema "%%" holds idempotency''s tables but no record of the version installed (idem_installation)', schema_name
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Install into another schema, or drop what is there first.';
    END IF;

    IF installed OPERATOR(pg_catalog.=) this_version THEN
        RAISE NOTICE 'idempotency %% (SQL edition) is already installed in schema "%%": nothing to do', this_version, schema_name;
        RETURN;
    END IF;
    IF pg_catalog.string_to_array(installed, '.')::integer[]
       OPERATOR(pg_catalog.>) pg_catalog.string_to_array(this_version, '.')::integer[] THEN
        RAISE EXCEPTION 'idempotency %% is installed in schema "%%", a later version than this script''s %%', installed, schema_name, this_version
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'A version is never downgraded: run the script of version ' OPERATOR(pg_catalog.||) installed OPERATOR(pg_catalog.||) ' or later.';
    END IF;

    -- as CREATE EXTENSION runs its script
    PERFORM pg_catalog.set_config('search_path', schema_ident, true);
    PERFORM pg_catalog.set_config('check_function_bodies', 'off', true);
    IF old_messages OPERATOR(pg_catalog.=) ANY ('{debug5,debug4,debug3,debug2,debug1,log,notice,info}') THEN
        PERFORM pg_catalog.set_config('client_min_messages', 'warning', true);
    END IF;
    IF installed IS NULL THEN
        EXECUTE pg_catalog.format('CREATE TABLE %%s.idem_installation (
                step integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                version text NOT NULL,
                edition text NOT NULL,
                previous_version text,
                installed_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
                installed_by name NOT NULL DEFAULT CURRENT_USER)', schema_ident);
        EXECUTE pg_catalog.format('COMMENT ON TABLE %%s.idem_installation IS %%L', schema_ident,
            'the versions of idempotency installed into this schema by its plain scripts, the last one current');
        EXECUTE pg_catalog.format('REVOKE ALL ON TABLE %%s.idem_installation FROM PUBLIC', schema_ident);
        EXECUTE pg_catalog.format('GRANT SELECT ON TABLE %%s.idem_installation TO PUBLIC', schema_ident);
        FOREACH statement IN ARRAY pg_catalog.string_to_array(full_script, separator) LOOP
            EXECUTE pg_catalog.replace(statement, '@extschema@', schema_ident);
        END LOOP;
        EXECUTE pg_catalog.format('INSERT INTO %%s.idem_installation (version, edition) VALUES (%%L, %%L)',
            schema_ident, this_version, 'sql');
    ELSE
        -- the update steps, from the version installed to this one
        LOOP
            SELECT s.a, s.b, s.script INTO step FROM (%(steps)s) s(a, b, script)
             WHERE s.a OPERATOR(pg_catalog.=) installed;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'no update path from idempotency %% to %%', installed, this_version
                    USING ERRCODE = 'object_not_in_prerequisite_state';
            END IF;
            FOREACH statement IN ARRAY pg_catalog.string_to_array(step.script, separator) LOOP
                EXECUTE pg_catalog.replace(statement, '@extschema@', schema_ident);
            END LOOP;
            EXECUTE pg_catalog.format('INSERT INTO %%s.idem_installation (version, edition, previous_version) VALUES (%%L, %%L, %%L)',
                schema_ident, step.b, 'sql', installed);
            installed := step.b;
            steps := steps + 1;
            EXIT WHEN installed OPERATOR(pg_catalog.=) this_version;
        END LOOP;
    END IF;
    PERFORM pg_catalog.set_config('search_path', old_path, true);
    PERFORM pg_catalog.set_config('client_min_messages', old_messages, true);
    PERFORM pg_catalog.set_config('check_function_bodies', old_check, true);
    IF steps OPERATOR(pg_catalog.=) 0 THEN
        RAISE NOTICE 'idempotency %% (SQL edition) installed in schema "%%"', this_version, schema_name;
    ELSE
        RAISE NOTICE 'idempotency updated to %% (SQL edition) in schema "%%"', this_version, schema_name;
    END IF;
END
%(outer)s;
"""

if __name__ == '__main__':
    main()
