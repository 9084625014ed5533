"""The integration tests' runner and checks, without the daemon plumbing.

Why this exists: ikbo_itest.py needs grpcio and the generated protobuf
modules; tests that need neither (test_e2e_report.py reads files only)
share these few lines with it instead of copying them. Pure Python, no
third-party imports.
"""
import time
import traceback


def check(cond, msg="check failed"):
    if not cond:
        raise AssertionError(msg)


def check_eq(got, want, what=""):
    if got != want:
        raise AssertionError("%s: got %r, want %r" % (what, got, want))


def run_tests(tests):
    """Runs test functions in order, one PASS/FAIL line each; returns
    (failures, start time)."""
    failed = 0
    t_all = time.time()
    for t in tests:
        t0 = time.time()
        try:
            t()
            print("PASS %-40s %.2fs" % (t.__name__, time.time() - t0), flush=True)
        except Exception:
            failed += 1
            print("FAIL %s\n%s" % (t.__name__, traceback.format_exc()), flush=True)
    return failed, t_all


def summary(n, failed, t_all):
    """The last line of a test file's output; its exit status."""
    print("%d/%d passed in %.1fs" % (n - failed, n, time.time() - t_all))
    return 1 if failed else 0
