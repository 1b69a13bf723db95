#!/usr/bin/env python3
"""Generates the SQL edition's scripts from the C edition's upgrade chain.

The SQL edition is the C edition's install script with each C function's
declaration kept (name, argument names, defaults, result, volatility,
strictness, parallel safety, rows) and only its `AS 'MODULE_PATHNAME', ...
LANGUAGE C` replaced by a body from sql/edition/bodies/*.sql, with
`SET search_path = pg_catalog, pg_temp` unless the body sets it.  Every table,
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
    generate.py pgtle CHAIN...       pg_tle registration (pgtle.install_extension)
    generate.py plain CHAIN...       psql -v schema=NAME -f, without an extension
    generate.py keys CHAIN...        the keys the bodies must provide
"""
import glob
import os
import re
import sys

ALLOW_MISSING = False
HERE = os.path.dirname(os.path.abspath(__file__))
VERSION_RE = re.compile(r'idempotency--(?:[0-9.]+--)?([0-9.]+)\.sql$')

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


def c_declarations(text):
    """Yields (start, end, key, header, attributes) of each C declaration."""
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
        if not tail or tail.end() - 1 != end_stmt:
            continue  # not a C function: a PL/pgSQL or SQL one
        types = [t for t in map(arg_type, split_top(args)) if t is not None]
        key = '%s(%s)' % (m.group(1), ', '.join(types))
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
            m = re.match(r'LANGUAGE\s+(plpgsql|sql)\b(.*?)\n\s*AS\s+(.*?);?\s*$', block, re.S | re.I)
            if not m:
                fail('%s: the body of %s is not "LANGUAGE plpgsql|sql ... AS ...;"' % (name, key))
            bodies[key] = (m.group(1), m.group(2).strip(), m.group(3).rstrip(), name)
    return bodies, internal


def edition_script(chain):
    bodies, internal = read_bodies()
    used = set()
    out = []
    for path in chain:
        text = open(path).read()
        # psql's guard lines: the server drops them from extension scripts
        text = re.sub(r'^\\echo .*$\n?', '', text, flags=re.M)
        pos = 0
        for start, end, key, header, attrs in c_declarations(text):
            if key not in bodies:
                if not ALLOW_MISSING:
                    fail('no body for %s (declared in %s)' % (key, path))
                # development only (--allow-missing): never committed
                bodies[key] = ('plpgsql', '', "$missing$BEGIN RAISE EXCEPTION 'not yet in the SQL edition: %s' USING ERRCODE = '0A000'; END$missing$" % key, path)
            language, extra, body, _ = bodies[key]
            used.add(key)
            attrs = [a for a in attrs]
            # the house rule (README "How the functions run"): every SQL and
            # PL/pgSQL function pins search_path; a body may pin it itself
            if not re.search(r'\bSET\s+search_path\b', extra, re.I):
                extra = (extra + ' ' if extra else '') + 'SET search_path = pg_catalog, pg_temp'
            options = ' '.join([language] + attrs + [extra])
            out.append(text[pos:start])
            out.append('%s\nLANGUAGE %s\nAS %s;' % (header, options, body))
            pos = end
        out.append(text[pos:])
    unused = sorted(set(bodies) - used)
    if unused:
        fail('bodies without a C declaration: %s (in %s)' % (
            ', '.join(unused), ', '.join(sorted({bodies[k][3] for k in unused}))))
    script = ''.join(out)
    if re.search(r"LANGUAGE\s+C\b|MODULE_PATHNAME", script, re.I):
        fail('LANGUAGE C or MODULE_PATHNAME left in the output')
    head = ('-- The SQL edition of idempotency %s, generated by sql/edition/generate.py\n'
            '-- from %s and sql/edition/bodies/*.sql.  Do not edit.\n\n') % (
                version_of(chain), ', '.join(os.path.basename(p) for p in chain))
    internal_sql = ''
    if internal:
        internal_sql = ('/* The SQL edition\'s own helpers (sql/edition/bodies). */\n\n'
                        + '\n\n'.join(internal) + '\n\n')
    return head, internal_sql + script


def version_of(chain):
    m = VERSION_RE.search(chain[-1])
    if not m:
        fail('cannot tell the version from %s' % chain[-1])
    return m.group(1)


def dollar_tag(text, base):
    tag = base
    while ('$%s$' % tag) in text:
        tag += '_'
    return '$%s$' % tag


def main():
    if len(sys.argv) < 3:
        fail('usage: generate.py extension|pgtle|plain|keys CHAIN...')
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
    head, script = edition_script(chain)
    version = version_of(chain)
    if mode == 'extension':
        sys.stdout.write(head + '\\echo Use "CREATE EXTENSION idempotency" to load this file. \\quit\n\n' + script)
    elif mode == 'pgtle':
        tag = dollar_tag(script, 'idempotency_sql_edition')
        sys.stdout.write(head +
            '-- Registers the SQL edition with pg_tle; then CREATE EXTENSION idempotency.\n'
            '-- Run as a role with pgtle_admin:  psql -f %s\n\n'
            "SELECT pgtle.install_extension(\n"
            "    'idempotency',\n    '%s',\n"
            "    'idempotency primitives inside the database transaction (SQL edition)',\n"
            "%s\n%s%s,\n    '{}');\n" % (os.path.basename(sys.argv[0]), version, tag, script, tag))
    elif mode == 'plain':
        tag = dollar_tag(script, 'idempotency_sql_edition')
        sys.stdout.write(plain_script(head, script, tag, version))
    else:
        fail('unknown mode ' + mode)


def plain_script(head, script, tag, version):
    return head + PLAIN % {'tag': tag, 'script': script, 'version': version}


PLAIN = r"""-- Installs the SQL edition without CREATE EXTENSION, into one schema that
-- the installing role owns:
--     psql -v ON_ERROR_STOP=1 -v schema=idempotency -f idempotency--%(version)s.plain.sql
\if :{?schema}
\else
\echo 'usage: psql -v schema=NAME -f this file (the schema must exist and be yours)'
\quit
\endif
SELECT set_config('idempotency.install_schema', :'schema', false);
%(plain_body)s
"""

if __name__ == '__main__':
    main()
