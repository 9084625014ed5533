#!/usr/bin/python3
"""Test of bench/kernels/phases_ops.py, which names the ops whose GPU time
moved between builds in ab_device.sh's phases.log. No GPU: the log is
written here in batch_phases' format (a run header, shape lines, the
profile table with op names of several words, transfer rows, the totals).

    IKBO_ROOT=. /usr/bin/python3 tests/integration/test_phases_ops.py

Cases: an op that moved in B is named with both medians and its change,
an op within the thresholds is not, and the medians are over the runs
(one outlier run does not move an op); per shape; --all prints every op;
a log without runs, and a missing file, exit 2 with a message.
"""
import os
import subprocess
import sys
import tempfile

from itest_run import check, check_eq, run_tests, summary

ROOT = os.path.abspath(os.environ.get("IKBO_ROOT") or
                       os.path.join(os.path.dirname(__file__), "..", ".."))
TOOL = os.path.join(ROOT, "bench", "kernels", "phases_ops.py")
WORK = None

HEADER = """batch_phases: models/bench/1 on cuda:0, ikbo mode, 10 warm-up + 100 timed batches per shape
== shape 16x70 (C 1120): ikbo_score mean 475.3 us, p50 472.4, p90 495.2 (score[0] 0.52712)
cuda profile: 100 batches, per batch; floor = max(FLOPs / gemm, bytes / copy)
  gated: each batch queued whole before the GPU starts it (0 of 110 gates opened)
  op                             calls    host us     gpu us   floor us  x floor
  upload                           1.0       27.6       19.6          - transfer
"""
ROWS_16 = """  linear grouped 71680x256>256     1.0        8.6       {lin}       24.6    1.27x
  attention                        1.0       20.0      {att}       95.5    1.68x
"""
# The profile's timeline (one line a call, indented by 4): not op rows
# (test_thresholds_and_all: --all names none of its lines).
MID = """  ops gpu us 470.7 | sum of floors us 219.8 | ratio 2.14x | ops wall us 351.4 / sum of floors 1.60x
  timeline: the calls in issue order, us after the first op's start, mean of 100 batches (0 others called other ops); wait: since the stream's previous call
      # on    op                              start      end      gpu     wait
      0 main  upload                          -22.0     -1.4     20.6        -
      9 main  attention                        95.7   1095.6    999.9     31.9
     12 lane  linear 1120x32768>64            241.4    309.3     67.8    138.2
   profiled: ikbo_score wall mean 705.2 us (the profile's events add to it)
== shape 1x70 (C 70): ikbo_score mean 143.9 us, p50 144.3, p90 157.6 (score[0] 0.50763)
  op                             calls    host us     gpu us   floor us  x floor
"""
ROWS_1 = """  attention                        1.0       11.9       {att1}        6.0    4.24x
  ops gpu us 146.5 | sum of floors us 23.2 | ratio 6.31x | ops wall us 127.6 / sum of floors 5.50x
"""


def run_text(build, n, lin, att, att1):
    return ("=== %s.%d\n" % (build, n) + HEADER + ROWS_16.format(lin=lin, att=att) + MID +
            ROWS_1.format(att1=att1))


def log(name, text):
    p = os.path.join(WORK, name)
    with open(p, "w") as f:
        f.write(text)
    return p


def tool(*args):
    p = subprocess.run([sys.executable, TOOL] + list(args), stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, universal_newlines=True)
    return p.returncode, p.stdout, p.stderr


def two_builds():
    # A's attention 144 at 16 x 70 (one outlier run at 170), B's 159; the
    # linear 31.0-31.4 in both; at 1 x 70 the attention 24.0 against 23.0
    # (1 us: under --min-us 2).
    runs = [("A", 1, 31.2, 144.1, 24.0), ("B", 1, 31.0, 159.0, 23.0),
            ("A", 2, 31.4, 170.0, 24.1), ("B", 2, 31.3, 158.7, 23.1),
            ("A", 3, 31.1, 143.9, 23.9), ("B", 3, 31.2, 159.3, 22.9)]
    return log("phases.log", "".join(run_text(*r) for r in runs))


def test_moved_op_named():
    rc, out, err = tool(two_builds())
    check_eq(rc, 0, "exit status (%s)" % err)
    check("16x70 attention: A 144.1, B 159.0 (+10.3%)" in out, out)
    check("linear grouped" not in out, out)
    check("1x70 attention" not in out, out)
    check("1 ops moved against A" in out, out)


def test_thresholds_and_all():
    p = two_builds()
    rc, out, _ = tool(p, "--min-us", "0.5")
    check_eq(rc, 0, "--min-us 0.5: exit status")
    check("1x70 attention: A 24.0, B 23.0 (-4.2%)" not in out, out)  # 4.2% < 5%
    rc, out, _ = tool(p, "--min-us", "0.5", "--min-pct", "4")
    check("1x70 attention: A 24.0, B 23.0 (-4.2%)" in out, out)
    check("2 ops moved" in out, out)
    rc, out, _ = tool(p, "--all")
    check_eq(rc, 0, "--all: exit status")
    for op in ("16x70 upload:", "16x70 linear grouped 71680x256>256:", "16x70 attention:",
               "1x70 attention:"):
        check(op in out, "--all lacks %s:\n%s" % (op, out))
    check(" main " not in out and " lane " not in out, "--all read the timeline:\n" + out)


def test_bad_input():
    rc, _, err = tool(log("empty.log", "no runs here\n"))
    check_eq(rc, 2, "no runs: exit status")
    check("has no profiled runs" in err, err)
    rc, _, err = tool(os.path.join(WORK, "absent.log"))
    check_eq(rc, 2, "absent: exit status")
    check("absent.log" in err, err)


def main():
    global WORK
    with tempfile.TemporaryDirectory(prefix="ikbo-phases-ops-") as WORK:
        tests = [test_moved_op_named, test_thresholds_and_all, test_bad_input]
        failed, t_all = run_tests(tests)
        rc = summary(len(tests), failed, t_all)
    sys.exit(rc)


if __name__ == "__main__":
    main()
