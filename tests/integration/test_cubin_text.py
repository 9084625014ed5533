#!/usr/bin/python3
"""Test of bench/kernels/cubin_text.py, the per-function machine-code
comparison behind "the device code is byte-identical" claims (NOTES.md,
RESULTS.md). No GPU: host objects built by gcc with -ffunction-sections have
the same .text.<function> layout as a cubin, so they stand in for two builds
of a kernel file.

    IKBO_ROOT=. /usr/bin/python3 tests/integration/test_cubin_text.py

Cases: the same source with functions reordered and a comment added (same
code, exit 0); one function's body changed (exit 1, that function named);
a function renamed, unpaired (exit 1) and paired back by --rename (exit 0);
a function missing (exit 1); a file that is not ELF and a bad --rename
(exit 2, named).
"""
import os
import subprocess
import sys
import tempfile

from itest_run import check, check_eq, run_tests, summary

ROOT = os.path.abspath(os.environ.get("IKBO_ROOT") or
                       os.path.join(os.path.dirname(__file__), "..", ".."))
TOOL = os.path.join(ROOT, "bench", "kernels", "cubin_text.py")
WORK = None

BASE = """int scale(int x) { return 3 * x + 1; }
int mix(int a, int b) { return (a ^ b) * 7 - (a >> 2); }
"""
REORDERED = """/* the same functions, in the other order */
int mix(int a, int b) { return (a ^ b) * 7 - (a >> 2); }
int scale(int x) { return 3 * x + 1; }
"""
CHANGED = """int scale(int x) { return 3 * x + 1; }
int mix(int a, int b) { return (a ^ b) * 9 - (a >> 3); }
"""
RENAMED = """int scale_v2(int x) { return 3 * x + 1; }
int mix(int a, int b) { return (a ^ b) * 7 - (a >> 2); }
"""
MISSING = """int scale(int x) { return 3 * x + 1; }
"""


def obj(name, src):
    c = os.path.join(WORK, name + ".c")
    o = os.path.join(WORK, name + ".o")
    with open(c, "w") as f:
        f.write(src)
    subprocess.run(["gcc", "-O2", "-ffunction-sections", "-fno-asynchronous-unwind-tables",
                    "-c", c, "-o", o], check=True)
    return o


def tool(*args):
    p = subprocess.run([sys.executable, TOOL] + list(args), stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, universal_newlines=True)
    return p.returncode, p.stdout, p.stderr


def verdict(out, fn):
    for line in out.splitlines():
        if line.split() and line.split()[-1] == fn:
            return line.rsplit(None, 1)[0].strip()
    raise AssertionError("no line for %s in:\n%s" % (fn, out))


def test_same_code_reordered():
    rc, out, err = tool(obj("base", BASE), obj("reordered", REORDERED))
    check_eq(rc, 0, "reordered: exit status (%s)" % err)
    check(verdict(out, "scale").startswith("same") and verdict(out, "mix").startswith("same"), out)
    check("2 of 2 functions identical" in out, out)


def test_changed_body():
    rc, out, _ = tool(obj("base", BASE), obj("changed", CHANGED))
    check_eq(rc, 1, "changed: exit status")
    check(verdict(out, "mix").startswith("differs"), out)
    check(verdict(out, "scale").startswith("same"), out)
    check("NOT the same code" in out, out)


def test_renamed():
    a, b = obj("base", BASE), obj("renamed", RENAMED)
    rc, out, _ = tool(a, b)
    check_eq(rc, 1, "renamed, unpaired: exit status")
    check_eq(verdict(out, "scale"), "only in A", "renamed, unpaired: scale")
    check_eq(verdict(out, "scale_v2"), "only in B", "renamed, unpaired: scale_v2")
    rc, out, err = tool(a, b, "--rename", "_v2$=")
    check_eq(rc, 0, "renamed, paired by --rename: exit status (%s)" % err)
    check(verdict(out, "scale").startswith("same"), out)


def test_missing():
    rc, out, _ = tool(obj("base", BASE), obj("missing", MISSING))
    check_eq(rc, 1, "missing: exit status")
    check_eq(verdict(out, "mix"), "only in A", "missing: mix")


def test_bad_input():
    junk = os.path.join(WORK, "junk.o")
    with open(junk, "w") as f:
        f.write("not an object\n" * 8)
    rc, _, err = tool(obj("base", BASE), junk)
    check_eq(rc, 2, "not ELF: exit status")
    check("junk.o: not an ELF file" in err, err)
    rc, _, err = tool(obj("base", BASE), os.path.join(WORK, "absent.o"))
    check_eq(rc, 2, "absent file: exit status")
    check("absent.o" in err, err)
    rc, _, err = tool(obj("base", BASE), obj("base2", BASE), "--rename", "nothing")
    check_eq(rc, 2, "bad --rename: exit status")
    check("PATTERN=REPLACEMENT" in err, err)


def main():
    global WORK
    with tempfile.TemporaryDirectory(prefix="ikbo-cubin-text-") as WORK:
        tests = [test_same_code_reordered, test_changed_body, test_renamed, test_missing,
                 test_bad_input]
        failed, t_all = run_tests(tests)
        rc = summary(len(tests), failed, t_all)
    sys.exit(rc)


if __name__ == "__main__":
    main()
