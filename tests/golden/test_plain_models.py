#!/usr/bin/python3
"""Test of tools/reference/plain_models.py (`make golden` runs it; a few seconds).

The broadcast-form modules of the hand-written models must compute exactly
what the hand-written model computes:
  - DemoModel.from_model_dir(models/demo/1) and BenchModel.from_model_dir of a
    fresh `make_bench_model.py --small --dtype F32`: float64, eval mode, the
    history's item table the candidates' item bag's weight, logits [C, T],
    scores vs the reference interpreter (ikbo_ref.score_request) on
    plain_models.CHECK_REQUESTS (a single candidate with an empty and with a
    long history, several users of uneven counts, all-empty histories and
    bags, unused users) <= 1e-12 relative;
  - each class refuses the other's directory (ValueError);
  - zoo after its refactor (feature_inputs, the shared _Heads.target):
    module_inputs is feature_inputs with zoo's lists, and `zoo.py check` of
    models/seq/1 and models/hstu/1 still passes.

    tests/golden/test_plain_models.py        exit 0 when every case passes
"""
import os
import subprocess
import sys
import tempfile

import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tools", "reference"))
import ikbo_ref  # noqa: E402
import make_request  # noqa: E402
import plain_models  # noqa: E402
import zoo  # noqa: E402

TOL = 1e-12
FAILS = []


def ok(cond, what):
    print("  %-60s %s" % (what, "ok" if cond else "FAIL"), flush=True)
    if not cond:
        FAILS.append(what)


def case_model(cls, mdir, label):
    m = cls.from_model_dir(mdir)
    ok(not m.training and all(p.dtype == torch.float64 for p in m.parameters()),
       "%s: float64, eval mode" % label)
    ok(m.hist_item.weight is m.cand_emb["item"].weight, "%s: history item table is cand_emb['item']" % label)
    ref = ikbo_ref.load_model(mdir)
    req = make_request.generate(ref.plan, 11, [3, 1, 4])
    with torch.no_grad():
        z = m(*plain_models.module_inputs(ref.plan, req))
    ok(tuple(z.shape) == (len(req["candidates"]), len(ref.plan.tasks)), "%s: logits [C, T]" % label)
    n = len(plain_models.CHECK_REQUESTS)
    err = plain_models.check(mdir, n, module=m)
    ok(err <= TOL, "%s: scores vs interpreter, %d requests, max rel %.2e" % (label, n, err))
    return m


def refuses(cls, mdir, label):
    try:
        cls.from_model_dir(mdir)
    except ValueError as e:
        ok("do not have this architecture" in str(e), "%s refuses %s" % (cls.__name__, label))
        return
    ok(False, "%s refuses %s" % (cls.__name__, label))


def case_zoo():
    seq = os.path.join(REPO, "models", "seq", "1")
    ref = ikbo_ref.load_model(seq)
    req = make_request.generate(ref.plan, 3, [2, 5])
    a = zoo.module_inputs(ref.plan, req)
    b = zoo.feature_inputs(ref.plan, req, list(zoo.USER_SPARSE), list(zoo.CAND_SPARSE))
    same = all(torch.equal(x, y) for x, y in zip(torch.utils._pytree.tree_flatten(a)[0],
                                                 torch.utils._pytree.tree_flatten(b)[0]))
    ok(same and len(a) == 6, "zoo.module_inputs = feature_inputs(zoo's lists)")
    for name in ("seq", "hstu"):
        err = zoo.check(os.path.join(REPO, "models", name, "1"))
        ok(err <= TOL, "zoo.py check models/%s/1: max rel %.2e" % (name, err))


def main():
    print("test_plain_models: plain (broadcast-form) demo and bench modules vs the interpreter")
    demo = os.path.join(REPO, "models", "demo", "1")
    with tempfile.TemporaryDirectory(prefix="ikbo-plain-") as tmp:
        bench = os.path.join(tmp, "bench", "1")
        subprocess.run([sys.executable, os.path.join(REPO, "models", "bench", "make_bench_model.py"), "--small",
                        "--dtype", "F32", "--out", bench], check=True, capture_output=True)
        case_model(plain_models.DemoModel, demo, "demo")
        case_model(plain_models.BenchModel, bench, "bench (small)")
        refuses(plain_models.BenchModel, demo, "the demo")
        refuses(plain_models.DemoModel, bench, "the bench model")
    case_zoo()
    print("test_plain_models: %s" % ("ok" if not FAILS else "FAILED (%d)" % len(FAILS)))
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
