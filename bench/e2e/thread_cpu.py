#!/usr/bin/env python3
"""thread_cpu.py - CPU time per thread of running processes over a window.

Why this exists: at saturation the end-to-end benchmark must say which
thread is the bottleneck (a gRPC worker, an execution instance, a completion
thread, gRPC's own event-engine threads, the load generator). The server
names its threads (ikbo-grpcN, ikbo-instN, ikbo-doneN, ikbo-http, ...), so
/proc/<pid>/task/<tid>/{comm,stat} is enough; no profiler is needed on the
GPU machine.

  thread_cpu.py --seconds 2 --json out.json PID [PID ...]

Prints, per process, each thread name's CPU use in percent of one core over
the window (user + system, threads of one name summed, their count shown),
busiest first. Threads that start or end inside the window count from when
they were seen. Exit 0; 2 on bad arguments or when no process exists.
"""
import argparse
import json
import os
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")


def sample(pid):
    """{tid: (comm, cpu_seconds)} for one process; {} when it is gone."""
    out = {}
    base = "/proc/%d/task" % pid
    try:
        tids = os.listdir(base)
    except OSError:
        return out
    for tid in tids:
        try:
            with open("%s/%s/stat" % (base, tid)) as f:
                st = f.read()
        except OSError:
            continue
        # comm is in parentheses and may hold spaces: split after the last ')'.
        lp, rp = st.index("("), st.rindex(")")
        comm = st[lp + 1:rp]
        fields = st[rp + 2:].split()
        utime, stime = int(fields[11]), int(fields[12])  # stat fields 14, 15
        out[int(tid)] = (comm, (utime + stime) / TICK)
    return out


def main():
    ap = argparse.ArgumentParser(description="CPU time per thread over a window")
    ap.add_argument("pids", nargs="+", type=int)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--json", help="also write the result here")
    a = ap.parse_args()
    if a.seconds <= 0:
        print("thread_cpu.py: --seconds must be > 0", file=sys.stderr)
        return 2
    before = {p: sample(p) for p in a.pids}
    if not any(before.values()):
        print("thread_cpu.py: no such process: %s" % a.pids, file=sys.stderr)
        return 2
    t0 = time.monotonic()
    time.sleep(a.seconds)
    after = {p: sample(p) for p in a.pids}
    wall = time.monotonic() - t0
    result = {"seconds": round(wall, 3), "processes": []}
    for p in a.pids:
        names = {}
        for tid, (comm, cpu) in after[p].items():
            prev = before[p][tid][1] if tid in before[p] else 0.0
            d = names.setdefault(comm, [0.0, 0])
            d[0] += cpu - prev
            d[1] += 1
        try:
            with open("/proc/%d/comm" % p) as f:
                pname = f.read().strip()
        except OSError:
            pname = "?"
        rows = sorted(({"thread": n, "threads": c, "cpu_pct": round(100 * s / wall, 1)}
                       for n, (s, c) in names.items()), key=lambda r: -r["cpu_pct"])
        total = round(sum(r["cpu_pct"] for r in rows), 1)
        result["processes"].append({"pid": p, "name": pname, "cpu_pct": total, "threads": rows})
        print("%s (pid %d): %.1f%% of one core over %.2f s" % (pname, p, total, wall))
        for r in rows:
            if r["cpu_pct"] >= 0.5:
                print("  %-18s x%-3d %6.1f%%" % (r["thread"], r["threads"], r["cpu_pct"]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
