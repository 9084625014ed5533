#!/usr/bin/python3
"""Test of bench/kernels/spills.sh, the ptxas registers-and-spills
comparison read before a kernel change goes to the device (README.md). No
GPU and no CUDA toolkit: a stand-in nvcc (NVCC=...), which fails unless
given the scratch Makefile's `nvcc-flags`, prints ptxas's -v lines for the
kernels a source file declares in comments ("// kernel NAME REGS
STACK STORES LOADS"), in the order and format ptxas uses, and fails on a
file holding "// broken". The tool runs from a copy inside a scratch git
repository, so that its ref is that repository's commit.

    IKBO_ROOT=. /usr/bin/python3 tests/integration/test_spills.py

Cases: the tree equal to the ref (exit 0, nothing listed; SPILLS_ALL=1
lists every instance as same); one kernel's spills changed (exit 1, that
kernel named with both figures, the other not listed); a kernel only in
the tree (exit 1, "-" for the ref); a file added and one deleted (their
kernels against "-"); a kernel whose parameters changed paired with its
old name; a ref that is not a commit, a file on neither side
and a failed compile (exit 2, named).
"""
import os
import shutil
import subprocess
import sys
import tempfile

from itest_run import check, check_eq, run_tests, summary

ROOT = os.path.abspath(os.environ.get("IKBO_ROOT") or
                       os.path.join(os.path.dirname(__file__), "..", ".."))
TOOL = os.path.join(ROOT, "bench", "kernels", "spills.sh")
WORK = None

FAKE_NVCC = r"""#!/usr/bin/python3
import sys
if "-DFLAGS_FROM_MAKEFILE" not in sys.argv or "-MMD" in sys.argv:
    sys.stderr.write("fake nvcc: not called with make nvcc-flags' flags: %r\n" % sys.argv)
    sys.exit(1)
src = [a for a in sys.argv[1:] if a.endswith(".cu")][0]
text = open(src).read()
if "// broken" in text:
    sys.stderr.write(src + "(1): error: this file does not compile\n")
    sys.exit(1)
sys.stderr.write("ptxas info    : 0 bytes gmem\n")
for line in text.splitlines():
    w = line.split()
    if w[:2] != ["//", "kernel"]:
        continue
    name, regs, stack, st, ld = w[2:7]
    sys.stderr.write("ptxas info    : Compiling entry function '%s' for 'sm_90a'\n" % name)
    sys.stderr.write("ptxas info    : Function properties for %s\n" % name)
    sys.stderr.write("    %s bytes stack frame, %s bytes spill stores, %s bytes spill loads\n"
                     % (stack, st, ld))
    sys.stderr.write("ptxas info    : Used %s registers, used 1 barriers\n" % regs)
    sys.stderr.write("ptxas info    : Compile time = 1.0 ms\n")
"""

A_CU = """// kernel _Z5k_attv 168 56 48 48
// kernel _Z5k_simv 46 0 0 0
"""
B_CU = """// kernel _Z5k_mlpv 90 0 0 0
"""


def sh(*args, cwd=None):
    subprocess.run(list(args), cwd=cwd, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)


def write(rel, text):
    p = os.path.join(WORK, "repo", rel)
    os.makedirs(os.path.dirname(p), exist_ok=True)
    with open(p, "w") as f:
        f.write(text)


def setup():
    repo = os.path.join(WORK, "repo")
    if os.path.exists(repo):
        shutil.rmtree(repo)
    os.makedirs(os.path.join(repo, "bench", "kernels"))
    shutil.copy(TOOL, os.path.join(repo, "bench", "kernels", "spills.sh"))
    write("kernels/cuda/a.cu", A_CU)
    write("kernels/cuda/b.cu", B_CU)
    write("Makefile", "nvcc-flags:\n\t@echo -O3 -DFLAGS_FROM_MAKEFILE\n")
    sh("git", "init", "-q", repo)
    sh("git", "-C", repo, "add", "-A")
    sh("git", "-C", repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    nvcc = os.path.join(WORK, "nvcc")
    with open(nvcc, "w") as f:
        f.write(FAKE_NVCC)
    os.chmod(nvcc, 0o755)


def tool(*args, **env):
    e = dict(os.environ, NVCC=os.path.join(WORK, "nvcc"), **env)
    p = subprocess.run(["bash", os.path.join(WORK, "repo", "bench", "kernels", "spills.sh")] +
                       list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       universal_newlines=True, env=e)
    return p.returncode, p.stdout, p.stderr


def line_of(out, kernel):
    for line in out.splitlines():
        if line.split() and line.split()[-1] == kernel:
            return line
    return None


def test_unchanged():
    setup()
    rc, out, err = tool()
    check_eq(rc, 0, "unchanged: exit status (%s)" % err)
    check("0 of 3 kernel instances differ" in out, out)
    check(line_of(out, "_Z5k_attv") is None, out)
    rc, out, _ = tool(SPILLS_ALL="1")
    check_eq(rc, 0, "SPILLS_ALL: exit status")
    for k in ("_Z5k_attv", "_Z5k_simv", "_Z5k_mlpv"):
        line = line_of(out, k)
        check(line is not None and line.split()[0] == "same", out)


def test_spills_changed():
    setup()
    write("kernels/cuda/a.cu", A_CU.replace("168 56 48 48", "168 56 52 52"))
    rc, out, _ = tool()
    check_eq(rc, 1, "changed: exit status")
    line = line_of(out, "_Z5k_attv")
    check(line is not None, out)
    check_eq(line.split()[:3], ["differs", "168/56/48+48", "168/56/52+52"], "changed: the line")
    check(line_of(out, "_Z5k_simv") is None, out)
    check("1 of 3 kernel instances differ" in out, out)
    rc, out, _ = tool("kernels/cuda/b.cu")
    check_eq(rc, 0, "only b.cu, unchanged: exit status")
    check("0 of 1 kernel instances differ" in out, out)


def test_new_kernel():
    setup()
    write("kernels/cuda/b.cu", B_CU + "// kernel _Z5k_newv 64 0 0 0\n")
    rc, out, _ = tool("--ref", "HEAD", "kernels/cuda/b.cu")
    check_eq(rc, 1, "new kernel: exit status")
    line = line_of(out, "_Z5k_newv")
    check(line is not None and line.split()[:3] == ["differs", "-/-/-+-", "64/0/0+0"], out)


def test_file_on_one_side():
    setup()
    write("kernels/cuda/c.cu", "// kernel _Z5k_addv 32 0 0 0\n")
    os.remove(os.path.join(WORK, "repo", "kernels", "cuda", "b.cu"))
    rc, out, err = tool("kernels/cuda/a.cu", "kernels/cuda/b.cu", "kernels/cuda/c.cu")
    check_eq(rc, 1, "added and deleted files: exit status (%s)" % err)
    added, gone = line_of(out, "_Z5k_addv"), line_of(out, "_Z5k_mlpv")
    check(added is not None and added.split()[:3] == ["differs", "-/-/-+-", "32/0/0+0"], out)
    check(gone is not None and gone.split()[:3] == ["differs", "90/0/0+0", "-/-/-+-"], out)
    check("2 of 4 kernel instances differ" in out, out)


def test_parameters_changed():
    setup()
    write("kernels/cuda/b.cu", "// kernel _Z8k_att_tcI6__halfLi128EEvPKT_i 200 0 0 0\n"
          "// kernel _Z8k_att_tcI6__halfLi64EEvPKT_i 137 0 0 0\n")
    sh("git", "-C", os.path.join(WORK, "repo"), "-c", "user.name=t", "-c", "user.email=t@t",
       "commit", "-qam", "two instances")
    # A parameter added renames both; one of them spills now.
    write("kernels/cuda/b.cu", "// kernel _Z8k_att_tcI6__halfLi128EEvPKT_il 200 8 4 4\n"
          "// kernel _Z8k_att_tcI6__halfLi64EEvPKT_il 137 0 0 0\n")
    rc, out, err = tool("kernels/cuda/b.cu")
    check_eq(rc, 1, "parameters changed: exit status (%s)" % err)
    check("1 of 2 kernel instances differ" in out, out)
    line = [l for l in out.splitlines() if "Li128" in l]
    check(len(line) == 1 and line[0].split()[:3] == ["differs", "200/0/0+0", "200/8/4+4"] and
          line[0].endswith("_Z8k_att_tcI6__halfLi128EEvPKT_il (parameters changed)"), out)
    check("Li64" not in out, out)


def test_bad_input():
    setup()
    rc, _, err = tool("--ref", "nosuchref")
    check_eq(rc, 2, "bad ref: exit status")
    check("nosuchref is not a commit" in err, err)
    rc, _, err = tool("kernels/cuda/absent.cu")
    check_eq(rc, 2, "absent file: exit status")
    check("kernels/cuda/absent.cu is neither at HEAD nor in the tree" in err, err)
    write("kernels/cuda/a.cu", A_CU + "// broken\n")
    rc, _, err = tool()
    check_eq(rc, 2, "failed compile: exit status")
    check("compiling kernels/cuda/a.cu" in err and "does not compile" in err, err)


def main():
    global WORK
    with tempfile.TemporaryDirectory(prefix="ikbo-spills-") as WORK:
        tests = [test_unchanged, test_spills_changed, test_new_kernel, test_file_on_one_side,
                 test_parameters_changed, test_bad_input]
        failed, t_all = run_tests(tests)
        rc = summary(len(tests), failed, t_all)
    sys.exit(rc)


if __name__ == "__main__":
    main()
