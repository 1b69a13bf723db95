"""CPU time per message of the variants of inbox_cpu.sql (see inbox_cpu).

usage: inbox_cpu.py PSQL BATCHES ROUNDS VARIANT,VARIANT...
One psql session; the backend's user + system time (/proc/PID/stat) around
each call of bench_VARIANT(BATCHES, base), variants in turn each round.
Prints every round, the medians, and each median against the first variant's.
"""
import os
import statistics
import subprocess
import sys

psql, batches, rounds, variants = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split(",")
session = subprocess.Popen([psql, "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)


def query(sql):
    session.stdin.write(sql + "\n\\echo __end__\n")
    session.stdin.flush()
    lines = []
    while True:
        line = session.stdout.readline()
        if not line:
            sys.exit("psql ended")
        if line.strip() == "__end__":
            return lines
        lines.append(line.strip())


pid = int(query("SELECT pg_backend_pid();")[0])
ticks = os.sysconf("SC_CLK_TCK")


def cpu_seconds():
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / ticks


query("SET synchronous_commit = off;")
base = 0
per_message = {v: [] for v in variants}
for r in range(1, rounds + 1):
    for v in variants:
        query(f"SELECT bench_{v}(1, {base});")      # plans made, caches warm
        base += 2
        before = cpu_seconds()
        query(f"SELECT bench_{v}({batches}, {base});")
        per_message[v].append((cpu_seconds() - before) / (batches * 100) * 1e6)
        base += batches + 1
        print(f"round {r} {v}: {per_message[v][-1]:.2f} us of CPU per message", flush=True)
median = {v: statistics.median(x) for v, x in per_message.items()}
for v in variants:
    print(f"median {v}: {median[v]:.2f} us of CPU per message")
for v in variants[1:]:
    print(f"{v} / {variants[0]}: {median[v] / median[variants[0]]:.2f} "
          f"(the CPU cost of {v} per message, in units of {variants[0]}'s)")
