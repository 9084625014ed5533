#!/usr/bin/python3
"""kernels/cuda/wgmma_gen.cuh is what kernels/cuda/gen_wgmma.py writes.

The header is committed (the GPU build does not run Python) and says
"GENERATED ... do not edit"; this keeps the two in step, so that an edit
to either alone fails here, not on a GPU. Also checks each specialization's
asm statement against the instruction's operand count: N/2 accumulators,
then RS's four A registers or SS's A descriptor, B's descriptor and the
scale-d predicate's operand, which setp must name.

    IKBO_ROOT=. /usr/bin/python3 tests/integration/test_gen_wgmma.py
"""
import os
import re
import subprocess
import sys

from itest_run import check, check_eq, run_tests, summary

ROOT = os.path.abspath(os.environ.get("IKBO_ROOT") or
                       os.path.join(os.path.dirname(__file__), "..", ".."))
GEN = os.path.join(ROOT, "kernels", "cuda", "gen_wgmma.py")
HEADER = os.path.join(ROOT, "kernels", "cuda", "wgmma_gen.cuh")


def generated():
    r = subprocess.run([sys.executable, GEN], capture_output=True, text=True, timeout=60)
    check_eq(r.returncode, 0, "gen_wgmma.py exit status (stderr: %s)" % r.stderr.strip())
    return r.stdout


def test_header_is_generated():
    with open(HEADER) as f:
        committed = f.read()
    got = generated()
    if got != committed:
        a, b = got.splitlines(), committed.splitlines()
        line = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        raise AssertionError("wgmma_gen.cuh differs from gen_wgmma.py's output at line %d "
                             "(regenerate: python3 kernels/cuda/gen_wgmma.py > "
                             "kernels/cuda/wgmma_gen.cuh)" % (line + 1))


def test_operands():
    text = generated()
    specs = re.findall(r"template <> struct (wgmma_\w+)<[^,]+, (\d+)(?:, \d)?> \{(.*?)\n\};",
                       text, re.S)
    check(len(specs) == 2 * (3 * 2 + 1 * 2 + 3), "specializations: %d" % len(specs))
    for kind, n, body in specs:
        nd = int(n) // 2
        pred = int(re.search(r"setp\.ne\.b32 p, %(\d+), 0", body).group(1))
        outs = len(re.findall(r'"\+f"\(d\[\d+\]\)', body))
        ins = len(re.findall(r'"[rl]"\(', body))
        check_eq(outs, nd, "%s<%s> accumulators" % (kind, n))
        check_eq(ins, 6 if kind == "wgmma_rs" else 3, "%s<%s> inputs" % (kind, n))
        check_eq(pred, nd + ins - 1, "%s<%s> predicate operand" % (kind, n))
        acc = re.search(r'"\{(%[\d,%]*)\}', body).group(1).split(",")
        check_eq(acc, ["%%%d" % i for i in range(nd)], "%s<%s> accumulator list" % (kind, n))


def main():
    tests = [test_header_is_generated, test_operands]
    failed, t_all = run_tests(tests)
    return summary(len(tests), failed, t_all)


if __name__ == "__main__":
    sys.exit(main())
