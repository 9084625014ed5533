#!/usr/bin/python3
"""Reproducer for the soak's RSS finding: the daemon's resident memory grows
with every model version switch, while its live heap does not.

The daemon (CPU, demo model, scratch repository) serves two grpcio clients
(closed loop, 1 in flight each, 20 ms pause); the script pushes --versions
new versions of demo (atomic copy + rename, one every ~2 s once READY) and
prints VmRSS after each. Then, with gdb present, it asks the idle daemon's
glibc for malloc_trim(0) and malloc_stats(): arenas, bytes taken from the
system and bytes in use. Compare with MALLOC_ARENA_MAX=1 in the environment
(inherited by the daemon).

    IKBO_BUILD=$PWD/build IKBO_ROOT=$PWD bench/soak/version_rss.py --versions 15
    MALLOC_ARENA_MAX=1 IKBO_BUILD=$PWD/build IKBO_ROOT=$PWD bench/soak/version_rss.py --versions 15
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "integration"))
import grpc  # noqa: E402

import ikbo_itest  # noqa: E402
from ikbo_itest import Daemon, make_request, pb, to_proto  # noqa: E402

SRC = os.path.join(ikbo_itest.ROOT, "models", "demo", "1")


def client(d, stop):
    ch = grpc.insecure_channel("127.0.0.1:%d" % d.grpc_port)
    stub = ch.unary_unary("/ikbo.v1.Ranker/Rank", request_serializer=pb.RankRequest.SerializeToString,
                          response_deserializer=pb.RankResponse.FromString)
    reqs = [to_proto(make_request(SRC, users=u, cands_per_user=c, seed=u))
            for u, c in ((1, 500), (16, 40), (4, 300))]
    i = 0
    while not stop.is_set():
        stub(reqs[i % len(reqs)], timeout=60)
        i += 1
        time.sleep(0.02)
    ch.close()


def rss_mib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) // 1024
    return 0


def ready(d, v):
    code, body = d.http("GET", "/v1/models/demo")
    return code == 200 and any(x["version"] == v and x["state"] == "READY"
                               for x in json.loads(body)["versions"])


def push_versions(d, repo, n):
    out = [rss_mib(d.proc.pid)]
    for v in range(2, n + 2):
        tmp = os.path.join(repo, "demo", ".%d.incoming" % v)
        shutil.copytree(SRC, tmp)
        os.rename(tmp, os.path.join(repo, "demo", str(v)))
        t_end = time.time() + 60
        while not ready(d, v):
            if time.time() > t_end:
                raise SystemExit("version %d not READY within 60 s" % v)
            time.sleep(0.05)
        time.sleep(2)
        shutil.rmtree(os.path.join(repo, "demo", str(v - 2)), ignore_errors=True)
        out.append(rss_mib(d.proc.pid))
    return out


def glibc_view(d):
    """malloc_trim(0), then malloc_stats() (printed to the daemon's stderr,
    its log): RSS before/after the trim and the stats' totals."""
    if not shutil.which("gdb"):
        return "no gdb: malloc_stats not taken"
    before = rss_mib(d.proc.pid)
    for call in ("call (int) malloc_trim(0)", "call (void) malloc_stats()"):
        subprocess.run(["gdb", "-p", str(d.proc.pid), "-batch", "-ex", call], capture_output=True,
                       timeout=120)
    time.sleep(0.5)
    logs = d.logs()
    stats = logs[logs.find("Arena 0:"):]
    arenas = stats.count("Arena ")
    total = stats[stats.find("Total"):].split("\n")[1:3]
    return "idle RSS %d MiB, after malloc_trim(0) %d MiB; %d arenas; total %s" % (
        before, rss_mib(d.proc.pid), arenas, ", ".join(" ".join(t.split()) for t in total))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--versions", type=int, default=15)
    a = ap.parse_args()
    repo = tempfile.mkdtemp(prefix="ikbo-version-rss-")
    os.makedirs(os.path.join(repo, "demo"))
    shutil.copytree(SRC, os.path.join(repo, "demo", "1"))
    d = Daemon(repo, repository_poll_ms=200, repository_settle_ms=300,
               log={"level": "warn", "format": "plain"})
    stop = threading.Event()
    ts = [threading.Thread(target=client, args=(d, stop), daemon=True) for _ in range(2)]
    try:
        for t in ts:
            t.start()
        time.sleep(3)
        series = push_versions(d, repo, a.versions)
        stop.set()
        for t in ts:
            t.join(60)
        time.sleep(1)
        print("MALLOC_ARENA_MAX=%s: VmRSS MiB at start and after each version: %s" %
              (os.environ.get("MALLOC_ARENA_MAX", "unset"), series))
        print(glibc_view(d))
        print("daemon exit status %d" % d.stop())
    finally:
        stop.set()
        d.close()
        shutil.rmtree(repo, ignore_errors=True)


if __name__ == "__main__":
    main()
