"""Medians, ratios and plots of a benchmark run (see run).

usage: report.py RAW_CSV OUT_DIR MACHINE_DESCRIPTION
Writes OUT_DIR/results.md and, for gnuplot, OUT_DIR/plot.gp with its data.
"""
import csv
import statistics
import sys
from collections import defaultdict

raw_csv, out, machine = sys.argv[1:4]
tps = defaultdict(list)
latency = defaultdict(list)     # (variant, sync, records) -> ms
relay = defaultdict(list)       # (sync, relays) -> messages per second
extra = {}
with open(raw_csv) as f:
    for row in csv.DictReader(f):
        if row["workload"] == "relay":
            relay[(row["synchronous_commit"], int(row["clients"]))].append(float(row["value"]))
            continue
        if row["workload"] in ("purge", "bytes"):
            extra[(row["workload"], row["variant"])] = float(row["value"])
            continue
        if row["workload"] == "latency":
            latency[(row["variant"], row["synchronous_commit"], int(row["clients"]))].append(
                float(row["value"]))
            continue
        key = (row["workload"], row["variant"], row["synchronous_commit"], int(row["clients"]))
        tps[key].append(float(row["value"]))
median = {k: statistics.median(v) for k, v in tps.items()}
# the rounds, for ratios of runs next to each other in time: on a shared
# machine the load changes between rounds more than within one
rounds = defaultdict(dict)      # (workload, variant, sync, clients) -> round -> tps
cpu_rounds = defaultdict(dict)  # the same -> round -> the cluster's CPU us per transaction
with open(raw_csv) as f:
    for row in csv.DictReader(f):
        if row["workload"] not in ("relay", "purge", "bytes", "latency"):
            key = (row["workload"], row["variant"], row["synchronous_commit"], int(row["clients"]))
            rounds[key][row["round"]] = float(row["value"])
            if row.get("cpu_us") and float(row["cpu_us"]) > 0:
                cpu_rounds[key][row["round"]] = float(row["cpu_us"])


def round_ratios(ours_key, base_key):
    """ours / baseline of each round, in the order of the rounds"""
    a, b = rounds.get(ours_key, {}), rounds.get(base_key, {})
    return [a[r] / b[r] for r in sorted(a, key=int) if r in b and b[r] > 0]


def cpu_ratios(ours_key, base_key):
    """baseline's CPU per transaction / ours, per round: > 1 when ours is cheaper"""
    a, b = cpu_rounds.get(ours_key, {}), cpu_rounds.get(base_key, {})
    return [b[r] / a[r] for r in sorted(a, key=int) if r in b]
latency = {k: statistics.median(v) for k, v in latency.items()}

# workload -> (ours, [(baseline, sync, target ratio, what the target says)]):
# the targets of issue 17, checked at every client count
comparisons = {
    "new": ("ours", [("raw", {"off": (0.95, ">= 0.95 x raw SQL"),
                              "on": (0.97, ">= 0.97 x raw SQL")}),
                     ("plpgsql", {"off": (1.3, ">= 1.3 x PL/pgSQL")}),
                     ("ours_spi", {})]),
    "replay": ("ours", [("raw", {"off": (1.1, ">= 1.1 x a bare primary-key SELECT")}),
                        ("plpgsql", {})]),
    "hot": ("ours", [("raw", {}), ("plpgsql", {})]),
    "update": ("machine", [("plain", {"off": (0.97, "trigger costs <= 3% of UPDATE throughput")}),
                           ("plpgsql", {})]),
    "inbox": ("ours", [("raw", {"off": (0.95, ">= 0.95 x INSERT ... ON CONFLICT DO NOTHING")}),
                       ("ours_spi", {})]),
    # 100 messages per transaction in every variant: the tps ratio is the
    # ratio per message
    "inbox_batch": ("ours", [("raw", {"off": (0.95, ">= 0.95 x INSERT ... SELECT unnest ... RETURNING")}),
                             ("singles", {"off": (10, ">= 10 x 100 single accepts")})]),
    # 100 sequence numbers of one stream per transaction in both variants
    "inbox_seq": ("batch", [("loop", {"off": (1.0, "> 1 x a loop of single accepts: worth a batch form")})]),
    "outbox": ("ours", [("raw", {"off": (0.95, ">= 0.95 x a raw INSERT into an equivalent table")})]),
}

# The SQL edition (variant "sql": the same workload files in a database where
# the edition is installed by its plain script): its targets of issue 26 are
# against the C edition ("ours") by CPU per call.
sql_edition = {
    "new": [("ours", {"off": (0.7, ">= 0.7 x the C edition"), "on": (0.7, ">= 0.7 x the C edition")}),
            ("raw", {}), ("plpgsql", {})],
    "replay": [("ours", {"off": (0.7, ">= 0.7 x the C edition"), "on": (0.7, ">= 0.7 x the C edition")}),
               ("raw", {}), ("plpgsql", {})],
    "inbox": [("ours", {"off": (0.8, ">= 0.8 x the C edition")}), ("raw", {})],
    "inbox_batch": [("ours", {"off": (0.8, ">= 0.8 x the C edition")}), ("raw", {})],
    "outbox": [("ours", {"off": (0.8, ">= 0.8 x the C edition")}), ("raw", {})],
}

lines = [f"Machine: {machine}.", "",
         "Median transactions per second of the rounds; ratio = the median of the rounds' "
         "ours / baseline (each round runs the variants one after the other), with the "
         "lowest and highest round in brackets: their spread is the noise. "
         "By CPU = the median of the rounds' baseline / ours of the cluster's CPU time per "
         "transaction (microseconds, from /proc; pgbench and the wire left out): steadier on "
         "a shared machine, and the cost the targets are about.", "",
         "| workload | sync commit | clients | ours | baseline | baseline tps | ratio (rounds) "
         "| CPU us ours / baseline | by CPU (rounds) | target |",
         "|---|---|---|---|---|---|---|---|---|---|"]
def comparison_rows(workload, ours, baselines):
    rows = []
    for (w, v, sync, clients) in sorted(k for k in median if k[0] == workload and k[1] == ours):
        for base, targets in baselines:
            b = median.get((workload, base, sync, clients))
            if b is None:
                continue
            ratios = round_ratios((w, v, sync, clients), (workload, base, sync, clients))
            if not ratios:
                continue
            ratio = statistics.median(ratios)
            by_cpu = cpu_ratios((w, v, sync, clients), (workload, base, sync, clients))
            cpu_ratio = statistics.median(by_cpu) if by_cpu else None
            verdict = ""
            if sync in targets:
                target, text = targets[sync]
                verdict = f"{text}: {'met' if ratio >= target else 'NOT met'}"
                if cpu_ratio is not None:
                    verdict += f" ({'met' if cpu_ratio >= target else 'NOT met'} by CPU)"
            cpu_cells = "| |"
            if cpu_ratio is not None:
                ours_us = statistics.median(cpu_rounds[(w, v, sync, clients)].values())
                base_us = statistics.median(cpu_rounds[(workload, base, sync, clients)].values())
                cpu_cells = (f"| {ours_us:.0f} / {base_us:.0f} | {cpu_ratio:.2f} "
                             f"({min(by_cpu):.2f}-{max(by_cpu):.2f}) |")
            rows.append(f"| {workload} | {sync} | {clients} | {median[(w, v, sync, clients)]:.0f} "
                        f"| {base} | {b:.0f} | {ratio:.2f} ({min(ratios):.2f}-{max(ratios):.2f}) "
                        f"{cpu_cells} {verdict} |")
    return rows


for workload, (ours, baselines) in comparisons.items():
    lines += comparison_rows(workload, ours, baselines)
if any(k[1] == "sql" for k in median):
    lines += ["", "The SQL edition (its functions in PL/pgSQL, installed without the library), "
              "against the C edition (ours) and the baselines:", "",
              "| workload | sync commit | clients | SQL edition | baseline | baseline tps | ratio (rounds) "
              "| CPU us SQL edition / baseline | by CPU (rounds) | target |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for workload, baselines in sql_edition.items():
        lines += comparison_rows(workload, "sql", baselines)

plain = {k[2]: median[k] for k in median if k[0] == "update" and k[1] == "plain"}
machine_t = {k[2]: median[k] for k in median if k[0] == "update" and k[1] == "machine"}
plpgsql_t = {k[2]: median[k] for k in median if k[0] == "update" and k[1] == "plpgsql"}
if plain:
    lines += ["", "| trigger cost | sync commit | machine trigger | PL/pgSQL trigger | ours / PL/pgSQL cost |",
              "|---|---|---|---|---|"]
for sync in sorted(plain):
    if sync in machine_t and sync in plpgsql_t:
        c_ours = 1 - machine_t[sync] / plain[sync]
        c_pl = 1 - plpgsql_t[sync] / plain[sync]
        share = c_ours / c_pl if c_pl > 0 else float("nan")
        lines.append(f"| UPDATE | {sync} | {c_ours:.1%} | {c_pl:.1%} | {share:.2f} (target <= 0.33) |")

if relay:
    emit_rate = median.get(("outbox", "ours", "off", 1))
    lines += ["", "Outbox relay (claim + ack, batches of 100; median messages per second):", "",
              "| sync commit | relays | messages/s | / single-client emit rate |", "|---|---|---|---|"]
    for (sync, relays) in sorted(relay):
        rate = statistics.median(relay[(sync, relays)])
        verdict = ""
        if emit_rate:
            verdict = f"{rate / emit_rate:.1f}"
            if sync == "off":
                verdict += f" (target >= 2: {'met' if rate / emit_rate >= 2 else 'NOT met'})"
        lines.append(f"| {sync} | {relays} | {rate:.0f} | {verdict} |")

if ("purge", "rows_per_second") in extra:
    new_rate = median.get(("new", "ours", "off", 1))
    rate = extra[("purge", "rows_per_second")]
    lines += ["", f"Purge: {rate:.0f} rows/s"
              + (f" = {rate / new_rate:.1f} x the single-client new-claim rate (target >= 10)"
                 if new_rate else "")]
ours_b = extra.get(("bytes", "idempotency_records"))
pl_b = extra.get(("bytes", "plpgsql_keys"))
if ours_b and pl_b:
    lines += [f"Bytes per finished record (heap + indexes + TOAST): ours {ours_b:.0f}, "
              f"PL/pgSQL baseline {pl_b:.0f}, ratio {ours_b / pl_b:.2f} "
              f"(target <= 1.0: {'met' if ours_b / pl_b <= 1.0 else 'NOT met'})"]
record_counts = sorted({k[2] for k in latency})
if record_counts:
    lines += ["", "Claim latency (one client, median ms per transaction) against the records "
              "in the table:", "",
              "| claim | sync commit | " + " | ".join(f"{n:,} records" for n in record_counts)
              + f" | {record_counts[-1]:,} / {record_counts[0]:,} |",
              "|---|---|" + "---|" * (len(record_counts) + 1)]
    for variant in ("replay", "new"):
        for sync in ("off", "on"):
            row = [latency.get((variant, sync, n)) for n in record_counts]
            if None in row:
                continue
            ratio = row[-1] / row[0]
            verdict = f" (target <= 1.2: {'met' if ratio <= 1.2 else 'NOT met'})" if sync == "off" else ""
            lines.append(f"| {variant} | {sync} | " + " | ".join(f"{ms:.3f}" for ms in row)
                         + f" | {ratio:.2f}{verdict} |")
with open(f"{out}/results.md", "w") as f:
    f.write("\n".join(lines) + "\n")

# throughput against clients, sync off, for new / replay / hot
plots = []
for workload in ("new", "replay", "hot"):
    variants = sorted({k[1] for k in median if k[0] == workload})
    clients = sorted({k[3] for k in median if k[0] == workload and k[2] == "off"})
    if len(clients) < 2:
        continue
    with open(f"{out}/{workload}.dat", "w") as f:
        f.write("# clients " + " ".join(variants) + "\n")
        for c in clients:
            f.write(f"{c} " + " ".join(f"{median.get((workload, v, 'off', c), 0):.0f}"
                                      for v in variants) + "\n")
    series = ", ".join(f"'{workload}.dat' using 1:{i + 2} with linespoints title '{v}'"
                       for i, v in enumerate(variants))
    plots.append(f"set output '{workload}.png'\nset title '{workload} (synchronous_commit off)'\n"
                 f"plot {series}\n")
if len(record_counts) >= 2:
    with open(f"{out}/latency.dat", "w") as f:
        f.write("# records replay new (ms, synchronous_commit off)\n")
        for n in record_counts:
            f.write(f"{n} {latency.get(('replay', 'off', n), 0):.4f} "
                    f"{latency.get(('new', 'off', n), 0):.4f}\n")
    plots.append("set output 'latency.png'\nset title 'claim latency (synchronous_commit off)'\n"
                 "set xlabel 'records in the table'\nset ylabel 'ms'\nset logscale x\n"
                 "plot 'latency.dat' using 1:2 with linespoints title 'replay', "
                 "'latency.dat' using 1:3 with linespoints title 'new key'\n")
if plots:
    with open(f"{out}/plot.gp", "w") as f:
        f.write("set terminal png size 800,500 noenhanced\nset yrange [0:*]\nset xlabel 'clients'\nset ylabel 'tps'\n"
                "set key left top\n" + "".join(plots))
