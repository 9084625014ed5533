#!/usr/bin/python3
"""Each op's GPU time per build, from ab_device.sh's phases.log.

Why this exists: ab_device.sh's table gives each run's totals (ops wall,
ratio to the floors), and a change that gains in one op and loses in
another shows there only as a smaller gain. In the thirty-fifth session
the wo composition took 29 us out and the attention kernel lost 15 us to
an unrelated spill; the totals said -16 us, and only reading the runs'
logs op by op found why. This prints, per batch shape, each op's median
GPU time over the runs of each build, and names the ops that moved
against the first build by more than both thresholds.

    bench/kernels/phases_ops.py PHASES_LOG [--min-us 2] [--min-pct 5] [--all]

PHASES_LOG holds runs headed "=== BUILD.N" (ab_device.sh's keep), each a
batch_phases output with its profile tables. Prints one line per shape
and moved op ("16x70 attention: A 144.1, B 158.7 (+10.1%)"), or every op
with --all, then "N ops moved". Exit 0 whether or not ops moved; 2 when
the log has no profiled runs or cannot be read.
"""
import argparse
import re
import statistics
import sys

RUN = re.compile(r"^=== (\S+)\.(\d+)\s*$")
SHAPE = re.compile(r"^== shape (\S+) ")


def parse(lines):
    """{shape: {op: {build: [gpu us, ...]}}} and the builds in first-seen
    order."""
    table, builds = {}, []
    build = shape = None
    for line in lines:
        m = RUN.match(line)
        if m:
            build, shape = m.group(1), None
            if build not in builds:
                builds.append(build)
            continue
        m = SHAPE.match(line)
        if m:
            shape = m.group(1)
            continue
        if build is None or shape is None or not line.startswith("  ") or line.startswith("   "):
            continue
        w = line.split()
        # "  NAME... calls host gpu floor Nx" or "  NAME... calls host gpu - transfer"
        if len(w) < 6 or not (w[-1].endswith("x") or w[-1] == "transfer"):
            continue
        try:
            float(w[-4])
            gpu = float(w[-3])
        except ValueError:
            continue
        op = " ".join(w[:-5])
        table.setdefault(shape, {}).setdefault(op, {}).setdefault(build, []).append(gpu)
    return table, builds


def moved(table, builds, min_us, min_pct, show_all):
    """Lines for the ops that moved against builds[0] (or all ops)."""
    out, n = [], 0
    base = builds[0]
    for shape in table:
        for op, per in table[shape].items():
            med = {b: statistics.median(per[b]) for b in builds if b in per}
            a = med.get(base)
            worst = 0.0
            for b, v in med.items():
                if b != base and a is not None and abs(v - a) >= min_us and \
                        abs(v - a) >= min_pct / 100.0 * a:
                    worst = max(worst, abs(v - a))
            if worst:
                n += 1
            if worst or show_all:
                parts = []
                for b in builds:
                    if b not in med:
                        continue
                    s = "%s %.1f" % (b, med[b])
                    if b != base and a:
                        s += " (%+.1f%%)" % (100.0 * (med[b] - a) / a)
                    parts.append(s)
                out.append("%s %s: %s" % (shape, op, ", ".join(parts)))
    return out, n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("log")
    ap.add_argument("--min-us", type=float, default=2.0)
    ap.add_argument("--min-pct", type=float, default=5.0)
    ap.add_argument("--all", action="store_true")
    a = ap.parse_args()
    try:
        with open(a.log) as f:
            table, builds = parse(f)
    except OSError as e:
        print("phases_ops: %s" % e, file=sys.stderr)
        return 2
    if not table:
        print("phases_ops: %s has no profiled runs (=== BUILD.N, then batch_phases' op tables)"
              % a.log, file=sys.stderr)
        return 2
    lines, n = moved(table, builds, a.min_us, a.min_pct, a.all)
    for line in lines:
        print(line)
    print("%d ops moved against %s (by %.3g us and %.3g%% or more)" % (n, builds[0], a.min_us,
                                                                       a.min_pct))
    return 0


if __name__ == "__main__":
    sys.exit(main())
