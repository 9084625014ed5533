#!/usr/bin/python3
"""The soak's short version: bench/soak.sh --minutes 1 on the real daemon
(mixed loadgen, grpcio and HTTP load; a new model version, a SIGHUP, an
admin unload and load of demo2; every call's code, the server's counters
against the clients' and resource growth judged by the script). Fails when
the soak fails, or when it did not do each of those things at least once.

Before that, the soak's judges are fed made-up evidence that must fail
(a NOT_FOUND outside an unload window, counters that disagree, RSS that
grows), so a soak that passes is not a soak that cannot fail.

    IKBO_BUILD=build IKBO_ROOT=. /usr/bin/python3 tests/integration/test_soak.py

Speed: the soak waits on conditions with bounds (bench/soak/soak.py
WAIT_S); the run here is bounded at 15 minutes in all."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.environ.get("IKBO_ROOT") or os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bench", "soak"))
import soak  # noqa: E402
from ikbo_itest import BUILD, check, check_eq, run  # noqa: E402


class FakeOp:
    ready_at = {1: 0.0, 2: 50.0}
    windows = [[100.0, 110.0]]


def judged(fn, *args):
    fails = soak.Failures(echo=False)
    fn(*args, fails)
    return fails.items


def test_judges_can_fail():
    ok = soak.Record("py")
    ok.add(1, 2, "demo", "OK", 1)
    ok.add(60, 61, "demo", "OK", 2)
    ok.add(105, 106, "demo2", "NOT_FOUND")
    ok.add(99, 101, "demo2", "UNAVAILABLE")
    check_eq(judged(soak.judge_calls, [ok], FakeOp), [], "expected codes only")
    bad = soak.Record("py")
    bad.add(120, 121, "demo2", "NOT_FOUND")   # after the window closed
    bad.add(105, 106, "demo", "NOT_FOUND")    # the always-loaded model
    bad.add(60, 61, "demo", "OK", 1)          # version 2 was READY at 50
    bad.add(10, 11, "demo", "RESOURCE_EXHAUSTED")
    check_eq(len(judged(soak.judge_calls, [bad], FakeOp)), 4, "unexpected codes: %s" %
             judged(soak.judge_calls, [bad], FakeOp))
    lg = soak.Record("lg")
    lg.add_counts("demo", {"OK": 10, "DEADLINE_EXCEEDED": 1})
    check_eq(len(judged(soak.judge_calls, [lg], FakeOp)), 1, "loadgen counts")
    check_eq(judged(soak.judge_counts, {"OK": 10, "DEADLINE_EXCEEDED": 1}, [lg]), [], "equal counts")
    check_eq(len(judged(soak.judge_counts, {"OK": 11, "DEADLINE_EXCEEDED": 1}, [lg])), 1, "OK off by one")

    def series(rss):
        return [{"t": float(i), "rss_kib": r, "fds": 20, "threads": 20} for i, r in enumerate(rss)]
    flat = [50000 + (i % 3) * 500 for i in range(30)]
    check_eq(judged(soak.judge_resources, series(flat), 4096), [], "flat RSS")
    grow = [50000 + 1000 * i for i in range(30)]  # ~1 MiB a sample
    check_eq(len(judged(soak.judge_resources, series(grow), 4096)), 1, "growing RSS")
    check_eq(soak.rss_slack_kib(1), 16384, "a one-minute run's slack")


def test_soak_one_minute():
    out = tempfile.mkdtemp(prefix="ikbo-soak-test-")
    try:
        env = dict(os.environ, IKBO_BUILD=BUILD, IKBO_ROOT=ROOT)
        p = subprocess.run([os.path.join(ROOT, "bench", "soak.sh"), "--minutes", "1", "--out", out],
                           env=env, capture_output=True, text=True, timeout=900)
        print(p.stdout[-3000:], p.stderr[-2000:])
        check_eq(p.returncode, 0, "bench/soak.sh --minutes 1 exit status")
        with open(os.path.join(out, "summary.json")) as f:
            s = json.load(f)
        for what in ("versions", "unfriendly", "sighup", "unload", "load"):
            check(s["operator"][what] >= 1, "the soak did no %s: %s" % (what, s["operator"]))
        for name, codes in s["clients"].items():
            check(codes.get("OK", 0) > 0, "client %s had no OK call: %s" % (name, codes))
        check(os.path.getsize(os.path.join(out, "samples.csv")) > 0, "samples.csv")
    finally:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    run([test_judges_can_fail, test_soak_one_minute])
