#!/usr/bin/env python3
"""The README's SQL and shell examples run, and show what they print.

Every fenced block of README.md and of sql/README.md (the SQL reference)
whose language is `sql` or `sh` runs
against the cluster that PGHOST, PGPORT and PGUSER point at (test/readme/run
starts a throwaway one, the library preloaded; with IDEM_EDITION=sql, one of
the SQL edition, as a role that is no superuser):

- Each file runs top to bottom in one database, as a reader would: the
  README in `shop`, which its own first shell lines create (with the
  extension, in schema idem on the database's search_path); sql/README.md
  in `reference`, created here the same way.  The `sql` blocks of a
  chapter (a `## ` heading) run in order in one psql session, opened at its
  first `sql` block, so a transaction opened in one block goes on in the
  next; `sh` blocks run with bash (-e, pipefail) from the top of the
  checkout, with PGDATABASE set to the file's database, each in a process
  group of its own that is killed when the block ends (services it started
  in the background go with it).  The ports 8090 to 8092 of the examples
  are replaced by free ones.
- A `text` block right after a block that runs is what that block prints:
  its lines must appear, in that order and one after the other, in the
  block's output (psql -q, no footers, no CONTEXT lines; trailing blanks do
  not count).  Every ERROR line the block prints must be among the lines
  shown.  A block without a `text` block must print no ERROR (and a shell
  block must exit with 0).
- The line just before a fence may be an HTML comment that says otherwise:
      <!-- not run: REASON -->                 the block is not run
      <!-- excerpt: PATH -->                   checked by excerpts.py instead
      <!-- output not compared: REASON -->     (before a text block) it runs,
                                               its output is not compared
      <!-- c-edition-only: REASON -->          not run against the SQL edition
                                               (IDEM_EDITION=sql); it may stand
                                               on the line above another marker
  Nothing an example needs may be hidden: a `<!-- setup: ... -->` marker
  fails the check (what an example needs is a block of its own).
  A block in another language (python, javascript) must be an excerpt or
  marked not run; a `text` block or a bare one (a signature, a diagram) is
  not run.

The SQL reference (sql/README.md) must name every function, table, view,
sequence, type and setting of the extension (as expected/surface.out lists
them), and the README's Errors table (or Troubleshooting, for the purge
worker's log lines) every SQLSTATE the C code raises.

Every internal link of README.md (`](#anchor)`) must name a heading of it,
and every relative link of README.md, sql/README.md, test/README.md and
src/README.md must name a file of the checkout (and, with an anchor, a
heading of it).
These two checks do not depend on the edition: IDEM_EDITION=sql leaves them
to the C edition's run.

TAP on stdout, one line per block that runs and one per link check.
Usage: examples.py [README.md]"""
import os
import re
import select
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
HEADING = re.compile(r"^(#{1,6}) (.*)$")
MARKER = re.compile(r"^<!-- (not run|excerpt|output not compared|setup|c-edition-only):\s*(.*?)\s*-->$",
                    re.S)
RUN = {"sql": "sql", "sh": "sh"}
# IDEM_EDITION=sql (test/lib.sh): the cluster has the SQL edition, and the
# blocks marked c-edition-only do not run
SQL_EDITION = os.environ.get("IDEM_EDITION", "c") == "sql"
END = "@@idem-readme-example-end@@"
TIMEOUT = 120
README_DB = "shop"           # the database the README's first lines create
REFERENCE_DB = "reference"   # sql/README.md's, made with the extension


class Block:
    def __init__(self, line, lang, text, chapter, marker, c_only=None):
        self.line, self.lang, self.text, self.chapter = line, lang, text, chapter
        self.marker = marker      # (kind, argument) or None
        self.c_only = c_only      # why the SQL edition cannot run it, or None
        self.output = None        # the text block that follows
        self.output_marker = None
        self.where = "README"     # the file, as the TAP lines name it


def parse(path, where="README"):
    """The fenced blocks of the file, each with its chapter and marker."""
    lines = open(path, encoding="utf-8").read().split("\n")
    blocks, chapter, i = [], "", 0
    while i < len(lines):
        line = lines[i]
        h = HEADING.match(line)
        if h and len(h.group(1)) <= 2:
            chapter = h.group(2)
        f = FENCE.match(line)
        if not f:
            i += 1
            continue
        # the markers: HTML comments, one after the other, ending on the
        # line before the fence
        markers, end = [], i
        while end > 0 and lines[end - 1].rstrip().endswith("-->"):
            j = end - 1
            while j > 0 and not lines[j].lstrip().startswith("<!--"):
                j -= 1
            m = MARKER.match("\n".join(l.strip() for l in lines[j:end]).strip())
            if not m:
                break
            markers.append((m.group(1), m.group(2)))
            end = j
        marker = next((m for m in markers if m[0] != "c-edition-only"), None)
        c_only = next((m[1] for m in markers if m[0] == "c-edition-only"), None)
        start, indent = i, len(f.group(1))
        i += 1
        body = []
        while i < len(lines) and not lines[i].lstrip().startswith("```"):
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
            i += 1
        i += 1
        blocks.append(Block(start + 1, f.group(2), "\n".join(body), chapter, marker, c_only))
        blocks[-1].where = where
    # a text block right after a block (blank lines and a marker between)
    for prev, b in zip(blocks, blocks[1:]):
        if b.lang == "text" and prev.lang in RUN and prev.output is None:
            between = lines[prev.line + len(prev.text.split("\n")) + 1:b.line - 1]
            if all(not l.strip() or l.lstrip().startswith("<!--") or l.rstrip().endswith("-->")
                   for l in between):
                prev.output = b
                prev.output_marker = b.marker
    return blocks


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Psql:
    """One psql session; run() sends a block and returns what it printed."""
    def __init__(self, db):
        self.p = subprocess.Popen(
            ["psql", "-X", "-q", "-P", "footer=off", "-v", "ON_ERROR_STOP=0",
             "-v", "VERBOSITY=default", "-v", "SHOW_CONTEXT=never", "-d", db],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            bufsize=0)
        self.buf = b""

    def run(self, sql):
        self.p.stdin.write((sql + "\n\\echo " + END + "\n").encode())
        self.p.stdin.flush()
        deadline = time.time() + TIMEOUT
        while (END + "\n").encode() not in self.buf:
            left = deadline - time.time()
            if left <= 0 or not select.select([self.p.stdout], [], [], left)[0]:
                return None
            chunk = os.read(self.p.stdout.fileno(), 65536)
            if not chunk:
                return None
            self.buf += chunk
        out, self.buf = self.buf.split((END + "\n").encode(), 1)
        text = out.decode("utf-8", "replace")
        return re.sub(r"(?m)^psql:<stdin>:\d+: ", "", text)

    def close(self):
        try:
            self.p.stdin.close()
            self.p.wait(timeout=30)
        except Exception:
            self.p.kill()


def run_shell(script, db, ports):
    for example, port in ports.items():
        script = script.replace(str(example), str(port))
    env = dict(os.environ, PGDATABASE=db)
    # the output into a file: a service the block leaves in the background
    # keeps a pipe open, and the block ends when bash exits
    with tempfile.TemporaryFile() as out:
        p = subprocess.Popen(["bash", "-e", "-o", "pipefail", "-c", script], cwd=ROOT, env=env,
                             stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                             start_new_session=True)
        try:
            status = p.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            status = -1
        try:
            os.killpg(p.pid, 9)
        except ProcessLookupError:
            pass
        out.seek(0)
        text = out.read().decode("utf-8", "replace")
    return status, text + ("\n(timed out)" if status == -1 else "")


def trimmed(text):
    lines = [l.rstrip() for l in text.split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    while lines and not lines[0]:
        lines.pop(0)
    return lines


def compare(block, out):
    """None if out is what the block shows (or may print), else why not."""
    got = trimmed(out)
    errors = [l for l in got if re.match(r"^(ERROR|FATAL|PANIC):", l)]
    if block.output is None or (block.output_marker or ("",))[0] == "output not compared":
        shown = [] if block.output is None else trimmed(block.output.text)
        unexpected = [e for e in errors if e not in shown]
        return "it printed %s" % unexpected[0] if unexpected else None
    want = trimmed(block.output.text)
    unexpected = [e for e in errors if e not in want]
    if unexpected:
        return "it printed %s" % unexpected[0]
    n = len(want)
    # psql shows a value of several lines with a "+" at the end of each but
    # the last: the README may show the value itself
    unwrapped = [re.sub(r"^ ", "", re.sub(r"\s*\+$", "", l)) for l in got]
    if not any(lines[i:i + n] == want for lines in (got, unwrapped)
               for i in range(len(lines) - n + 1)):
        return "its output is not the one shown"
    return None


def slug(title):
    s = re.sub(r"[^\w\- ]", "", title.strip().lower())
    return s.replace(" ", "-")


def anchors(path):
    out, seen, fence = set(), {}, False
    for line in open(path, encoding="utf-8").read().split("\n"):
        if line.startswith("```"):
            fence = not fence
        h = None if fence else HEADING.match(line)
        if h:
            a = slug(h.group(2))
            seen[a] = seen.get(a, -1) + 1
            out.add(a if seen[a] == 0 else "%s-%d" % (a, seen[a]))
    return out


def check_links(path):
    """Links of the file that lead nowhere."""
    text = open(path, encoding="utf-8").read()
    text = re.sub(r"(?ms)^```.*?^```", "", text)
    here = os.path.dirname(path)
    bad = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        full = os.path.normpath(os.path.join(here, file)) if file else path
        if not os.path.exists(full):
            bad.append(target)
        elif anchor and full.endswith(".md") and anchor not in anchors(full):
            bad.append(target)
    return bad


def check_reference(readme, reference_path):
    """(ok, what, why) for the objects, settings and SQLSTATEs the SQL
    reference and the README's Errors must name: the extension's members and
    settings as expected/surface.out lists them, and the SQLSTATEs the C
    code raises (by errcodes.h)."""
    reference = open(reference_path, encoding="utf-8").read() if os.path.exists(
        reference_path) else ""
    surface = open(os.path.join(ROOT, "expected", "surface.out"), encoding="utf-8").read()
    members = re.findall(r"(?m)^ (function|table|view|sequence|type) (\w+)", surface)
    settings = sorted(set(re.findall(r"(?m)^ (idempotency\.\w+) +\|", surface)))
    named = lambda name: re.search(r"(?<![\w.])" + re.escape(name) + r"(?![\w])", reference)
    results = []
    for kinds, what in ((("function",), "function"), (("table", "view", "sequence", "type"),
                                                      "table, view, sequence and type")):
        names = sorted(set(n for k, n in members if k in kinds))
        missing = [n for n in names if not named(n)]
        results.append((not missing and bool(names),
                        "the SQL reference names every %s of the extension (%d)" % (what, len(names)),
                        missing and ("not in the SQL reference: %s" % ", ".join(missing), "")))
    missing = [s for s in settings if not named(s)]
    results.append((not missing and bool(settings),
                    "the SQL reference names every setting (%d)" % len(settings),
                    missing and ("not in the SQL reference: %s" % ", ".join(missing), "")))
    # SQLSTATEs: ours (IK...) and PostgreSQL's that the C code raises
    codes = {}
    try:
        inc = subprocess.run(["pg_config", "--includedir-server"], capture_output=True,
                             text=True, check=True).stdout.strip()
        for name, chars in re.findall(r"#define (ERRCODE_\w+)\s+MAKE_SQLSTATE\(([^)]*)\)",
                                      open(os.path.join(inc, "utils", "errcodes.h")).read()):
            codes[name] = "".join(re.findall(r"'(.)'", chars))
    except (OSError, subprocess.CalledProcessError):
        pass
    header = open(os.path.join(ROOT, "src", "idempotency.h"), encoding="utf-8").read()
    for name, chars in re.findall(r"#define (ERRCODE_\w+)\s+MAKE_SQLSTATE\(([^)]*)\)", header):
        codes[name] = "".join(re.findall(r"'(.)'", chars))
    raised = set()
    for f in os.listdir(os.path.join(ROOT, "src")):
        if f.endswith(".c"):
            raised.update(re.findall(r"errcode\((ERRCODE_\w+)\)",
                                     open(os.path.join(ROOT, "src", f), encoding="utf-8").read()))
    # the README's Errors and Troubleshooting, and the reference's Errors in
    # full with the purge worker's log lines
    text = open(readme, encoding="utf-8").read()
    errors = "".join(text[text.find(h):] for h in ("### Errors", "### Troubleshooting") if h in text)
    errors += "".join(reference[reference.find(h):] for h in (
        "## Errors in full", "#### The purge worker's log lines") if h in reference)
    unknown = sorted(n for n in raised if n not in codes)
    missing = sorted("%s (%s)" % (codes[n], n) for n in raised if n in codes
                     and "`%s`" % codes[n] not in errors)
    results.append((not missing and not unknown and bool(raised),
                    "the Errors (README and sql/README.md) name every SQLSTATE the C code raises (%d)" % len(raised),
                    (missing or unknown) and ("missing: %s" % ", ".join(missing + unknown), "")))
    return results


def main():
    readme = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "README.md")
    reference = os.path.join(os.path.dirname(os.path.abspath(readme)), "sql", "README.md")
    blocks = parse(readme) + (parse(reference, "sql/README.md") if os.path.exists(reference) else [])
    ports = {8090: free_port(), 8091: free_port(), 8092: free_port()}
    results = []     # (ok, description, why)
    for b in blocks:
        if b.lang in RUN and b.marker and b.marker[0] == "not run" and not b.marker[1]:
            results.append((False, "%s line %d: a block not run says why" % (b.where, b.line),
                            "<!-- not run: --> without a reason"))
        if b.c_only is not None and not b.c_only:
            results.append((False, "%s line %d: a block of the C edition only says why" % (b.where, b.line),
                            "<!-- c-edition-only: --> without a reason"))
    for b in blocks:
        if b.lang not in RUN and b.lang not in ("", "text") and not (
                b.marker and b.marker[0] in ("not run", "excerpt")):
            results.append((False, "%s line %d: a %s block is run, an excerpt, or marked" % (
                b.where, b.line, b.lang), "an example in %s that is neither an excerpt of tested code nor "
                "marked <!-- not run: REASON -->" % b.lang))
    c_only = [b for b in blocks if b.lang in RUN and b.c_only is not None
              and not (b.marker and b.marker[0] in ("not run", "excerpt"))]
    for b in blocks:
        if b.marker and b.marker[0] == "setup":
            results.append((False, "%s line %d: no setup hidden from the reader" % (b.where, b.line),
                            "<!-- setup: --> hides what the example needs: show it in a block"))
    # one database per file, top to bottom: the README's is the one its own
    # first lines create (shop); the reference's is made here, with the
    # extension
    for where, db, made_here in (("README", README_DB, False), ("sql/README.md", REFERENCE_DB, True)):
        runs = [b for b in blocks if b.where == where and b.lang in RUN
                and not (b.marker and b.marker[0] in ("not run", "excerpt", "setup"))
                and not (SQL_EDITION and b in c_only)]
        if made_here and runs:
            subprocess.run(["psql", "-X", "-q", "-d", "postgres", "-c", 'CREATE DATABASE "%s"' % db],
                           check=True)
            # as the README's Install makes shop: the schema idem on the
            # database's search_path
            subprocess.run(["psql", "-X", "-q", "-d", db, "-c", "CREATE SCHEMA idem",
                            "-c", "CREATE EXTENSION idempotency SCHEMA idem",
                            "-c", 'ALTER DATABASE "%s" SET search_path = "$user", public, idem' % db],
                           check=True)
        psql, chapter = None, None
        for b in runs:
            # a session per chapter, opened at its first SQL block (after the
            # shell lines that create the database and set its search_path)
            if b.chapter != chapter and psql:
                psql.close()
                psql = None
            chapter = b.chapter
            what = "%s line %d runs (%s, %s)" % (b.where, b.line, b.lang, chapter)
            if b.lang == "sql":
                psql = psql or Psql(db)
                out = psql.run(b.text)
                why = "no answer within %d s" % TIMEOUT if out is None else compare(b, out)
                if out is None:   # a session stuck in a wait: start again
                    psql.p.kill()
                    psql = None
            else:
                status, out = run_shell(b.text, db, ports)
                why = compare(b, out)
                if why is None and status != 0:
                    why = "it exited with status %d" % status
            results.append((why is None, what, why and (why, out)))
        if psql:
            psql.close()
    # what does not depend on the edition: in the C edition's run only
    if not SQL_EDITION:
        results.extend(check_reference(readme, reference))
        for path in ("README.md", "sql/README.md", "test/README.md", "src/README.md"):
            full = os.path.join(ROOT, path)
            if os.path.exists(full):
                bad = check_links(full)
                results.append((not bad, "every link of %s leads somewhere" % path,
                                bad and ("links to nowhere: %s" % ", ".join(bad), "")))
    print("1..%d" % len(results))
    for k, (ok, what, why) in enumerate(results, 1):
        print("%sok %d - %s" % ("" if ok else "not ", k, what))
        if not ok:
            reason, out = why if isinstance(why, tuple) else (why, "")
            print("# " + reason)
            for line in (out or "").split("\n")[-40:]:
                print("#   " + line)
    if SQL_EDITION:
        for b in c_only:
            print("# %s line %d (%s, %s): c-edition-only: %s" % (b.where, b.line, b.lang, b.chapter,
                                                                 b.c_only))
    skipped = [b for b in blocks if b.lang in RUN and b.marker and b.marker[0] == "not run"]
    print("# %s: %d blocks ran, %d not run (marked), %d c-edition-only%s, %d excerpts (excerpts.py)" % (
        "SQL edition" if SQL_EDITION else "C edition",
        sum(1 for r in results if " line " in r[1] and " runs (" in r[1]),
        len(skipped), len(c_only), " (not run)" if SQL_EDITION else " (run)",
        sum(1 for b in blocks if b.marker and b.marker[0] == "excerpt")))
    return 0 if all(ok for ok, _, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
