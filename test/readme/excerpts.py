#!/usr/bin/env python3
"""The README's excerpts of tested code are the tested code.

A fenced block of README.md (or of sql/README.md, the reference) right
after a line

    <!-- excerpt: test/clients/python/service.py -->

must be a piece of that file: its lines, with the block's common indentation
taken off, appear in the file in that order as consecutive lines (with the
same relative indentation), except where the block has a line that is only
`...` (or a comment `# ...` / `// ...`), which stands for any number of
lines left out.  The services under test/clients run in test/clients/run, so
an example in the README that no longer matches the code that runs fails
here.  TAP on stdout, one line per excerpt.
Usage: excerpts.py [README.md]"""
import os
import re
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
MARK = re.compile(r"^<!-- excerpt: (\S+) -->$")
ELISION = re.compile(r"^\s*(?:\.\.\.|# \.\.\.|// \.\.\.)\s*$")


def excerpts(readme):
    """(line number, path, block lines) of every marked block."""
    lines = open(readme, encoding="utf-8").read().split("\n")
    i = 0
    while i < len(lines):
        m = MARK.match(lines[i])
        i += 1
        if not m:
            continue
        if i >= len(lines) or not lines[i].startswith("```"):
            yield i, m.group(1), None
            continue
        start = i
        i += 1
        block = []
        while i < len(lines) and not lines[i].startswith("```"):
            block.append(lines[i])
            i += 1
        yield start + 1, m.group(1), block


def dedent(lines):
    width = min((len(l) - len(l.lstrip(" ")) for l in lines if l.strip()), default=0)
    return [l[width:] for l in lines]


def pieces(block):
    """The block split at its elisions, each piece dedented on its own."""
    out, cur = [], []
    for line in block:
        if ELISION.match(line):
            if cur:
                out.append(cur)
            cur = []
        else:
            cur.append(line)
    if cur:
        out.append(cur)
    return [dedent(p) for p in out]


def find(piece, lines, start):
    """The first index >= start where piece matches lines, up to a common
    indentation of the file's lines; None if nowhere."""
    n = len(piece)
    for i in range(start, len(lines) - n + 1):
        window = lines[i:i + n]
        if dedent(window) == piece and all((w.strip() == "") == (p.strip() == "")
                                           for w, p in zip(window, piece)):
            return i + n
    return None


def check(path, block):
    """None if the block is an excerpt of path, else why not."""
    if block is None:
        return "the marker is not followed by a fenced block"
    full = os.path.join(ROOT, path)
    if not os.path.isfile(full):
        return "no file %s" % path
    lines = [l.rstrip() for l in open(full, encoding="utf-8").read().split("\n")]
    at = 0
    for piece in pieces([l.rstrip() for l in block]):
        found = find(piece, lines, at)
        if found is None:
            return "not in %s (after line %d): %s" % (path, at, piece[0].strip())
        at = found
    return None


def main():
    readme = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "README.md")
    reference = os.path.join(os.path.dirname(os.path.abspath(readme)), "sql", "README.md")
    found = [("README", *e) for e in excerpts(readme)]
    if os.path.exists(reference):
        found += [("sql/README.md", *e) for e in excerpts(reference)]
    print("1..%d" % max(1, len(found)))
    if not found:
        print("not ok 1 - %s has no excerpts" % readme)
        return 1
    failed = 0
    for n, (where, line, path, block) in enumerate(found, 1):
        why = check(path, block)
        print("%sok %d - %s line %d is an excerpt of %s" % ("not " if why else "", n, where, line, path))
        if why:
            failed += 1
            print("# " + why)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
