#!/usr/bin/python3
"""No leak across 100 load/unload cycles, on the real daemon under valgrind
memcheck: 100 admin unload/load cycles of model a (each with a Rank on the
fresh version, so a batcher is made and reaped per version) while a grpcio
client ranks a and another model b. The daemon must exit 0 with no
definite or indirect leak and no memory error (valgrind --error-exitcode),
b must never fail, and a may only answer NOT_FOUND/UNAVAILABLE while it is
out. Without valgrind the cycles run natively (a note says so).

Resident memory is printed but not judged: glibc's per-thread arenas keep
freed pages, so RSS drifts without a leak; valgrind is the judge. The
registry alone: IKBO_TEST_FILTER=test_load_unload_cycles valgrind
--leak-check=full build/tests/test_registry."""
import os
import shutil
import stat
import tempfile
import time

import ikbo_itest
from ikbo_itest import Daemon, check, check_eq, make_request, run
from reload_common import Load, model_dir, new_repo, version_state, wait_for

CYCLES = 100
S = {}


class SlowDaemon(Daemon):
    """Valgrind takes ~20 s to start the CUDA-linked binary."""

    def _wait_listening(self, timeout=15):
        return super()._wait_listening(timeout=120)


ADMIN = {"X-Ikbo-Admin": "1"}  # the admin routes refuse calls without it (README)


def wrapper(tmp):
    """An ikbo-serve that runs under valgrind, its report in tmp/vg.log."""
    path = os.path.join(tmp, "ikbo-serve-vg")
    with open(path, "w") as f:
        f.write('#!/bin/sh\nexec valgrind -q --leak-check=full --errors-for-leak-kinds=definite,indirect '
                '--show-leak-kinds=definite,indirect --error-exitcode=3 --num-callers=24 '
                '--log-file=%s "%s" "$@"\n' % (os.path.join(tmp, "vg.log"), ikbo_itest.SERVE))
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    return path


def rss_kib(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def test_daemon_load_unload_cycles():
    tmp = tempfile.mkdtemp(prefix="ikbo-leaks-")
    S["tmp"] = tmp
    vg = shutil.which("valgrind")
    serve = ikbo_itest.SERVE
    if vg:
        ikbo_itest.SERVE = wrapper(tmp)
    else:
        print("     valgrind not installed: the cycles run without the leak check")
    repo = new_repo(a=["a1"], b=["b1"])
    S["repo"] = repo
    t_start = time.time()
    try:
        d = SlowDaemon(repo, threads=2, repository_poll_ms=0, wait_ready=False)
    finally:
        ikbo_itest.SERVE = serve
    S["d"] = d
    d.wait_ready(timeout=120)
    t_ready = time.time()
    lb = Load(d, "b", model_dir("b1"), threads=1)
    la = Load(d, "a", model_dir("a1"), threads=1)
    req = make_request(model_dir("a1"), seed=41, model="a")
    rss = []
    for i in range(CYCLES):
        if i in (10, CYCLES - 1):
            rss.append(rss_kib(d.proc.pid))
        code, _ = d.http("POST", "/v1/models/a/unload", body=b"", headers=ADMIN)
        check_eq(code, 200, "unload %d" % i)
        if i % 10 == 0:
            check_eq(d.rank_error(req, timeout=30)[0], "NOT_FOUND", "unloaded a, cycle %d" % i)
        code, _ = d.http("POST", "/v1/models/a/load", body=b"", headers=ADMIN)
        check_eq(code, 202, "load %d" % i)
        wait_for(lambda: version_state(d, "a", 1) == ("READY", ""), 30, "a READY, cycle %d" % i,
                 step=0.01)
        check_eq(d.rank(req, timeout=30).model_version, 1, "a serves, cycle %d" % i)
    t_cycles = time.time()
    rb, ra = lb.stop(), la.stop()
    check_eq([r for r in rb if r[3]][:3], [], "b failed while a cycled")
    odd = [r for r in ra if r[3] and not r[3].startswith(("NOT_FOUND", "UNAVAILABLE"))]
    check_eq(odd[:3], [], "a's errors other than NOT_FOUND/UNAVAILABLE")
    logs = d.logs()
    check_eq(logs.count("model_load model=a version=1 state=READY"), CYCLES + 1, "loads logged")
    rc = d.stop(timeout=60)
    print("     start %.1fs, %d cycles %.1fs, exit %.1fs; %d + %d requests; RSS %d -> %d KiB "
          "(not judged)" % (t_ready - t_start, CYCLES, t_cycles - t_ready, time.time() - t_cycles,
                            len(ra), len(rb), rss[0], rss[1]))
    report = ""
    if vg:
        with open(os.path.join(tmp, "vg.log")) as f:
            report = f.read()
    check_eq(rc, 0, "daemon exit status (3 = valgrind found a leak or memory error):\n" + report[-6000:])
    if vg:
        check(report.strip() == "", "valgrind report:\n" + report[-6000:])


if __name__ == "__main__":
    for k in ("a1", "b1"):
        model_dir(k)
    try:
        run([test_daemon_load_unload_cycles])
    finally:
        if "d" in S:
            S["d"].close()
        for k in ("repo", "tmp"):
            if k in S:
                shutil.rmtree(S[k], ignore_errors=True)
