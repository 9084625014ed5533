#!/usr/bin/python3
"""Golden test of automatic IKBO planning (issue 16; `make golden` runs it).

    tests/golden/golden_auto.py --score-bin build/ikbo-score --plan-bin build/ikbo-plan
                                [--work DIR] [--tol 1e-5] [--twin-tol 1e-6] [--require-all]

(a) random broadcast-form models (tools/reference/random_auto.py, SEEDS:
    every rewrite of MODEL_FORMAT.md's "Automatic planning" and every
    gathered use among them, checked) x golden.py's requests:
    `SCORE_BIN --mode ikbo|broadcast MODEL_DIR REQ.json` against the
    reference (export.IkboModule in float64), relative error <= --tol; the
    reference's naive interpreter against its batched module on one request;
    `PLAN_BIN --json`: the layers planned as gathers are exactly the cross and
    mixture layers with a user operand (everything else rewritten or read
    through the map).
(b) twins: the demo model, the small bench model and zoo's dlrm, dcn, mmoe,
    seq and hstu, each hand-written (zoo.export_module, make_bench_model.py)
    and imported from the same PyTorch module with tools/importer's
    `ikbo_import.import_module` (broadcast form): the scorer's scores of the
    twin and of the hand-written model agree within --twin-tol relative, both
    modes; `PLAN_BIN --json` shows the twin auto-planned, no gather, and the
    same multiset of IKBO ops (the executed ops with "mixed": true among
    IKBO_OPS) as the hand-written model.

A piece that is not there (the importer, plain_models' modules, a --plan-bin
that is not an ikbo-plan) prints "SKIP: <why>" on its row; with
--require-all such a row is a failure. Prints one row per check and exits 1
on any failure. To test this script without the C engine:
--score-bin tools/reference/ikbo_ref.py (the plan rows then skip).
"""
import argparse
import collections
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "tools", "reference"))
sys.path.insert(0, os.path.join(REPO, "tools", "importer"))
import golden  # noqa: E402  (its requests, comparison and scorer runner)
import export  # noqa: E402
import ikbo_ref  # noqa: E402
import make_request  # noqa: E402
import random_auto  # noqa: E402

# Seeds of random_auto.py: shapes (D 4..16, with and without history, 1-3
# tasks) and block selections vary; together they hold every block (checked).
SEEDS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10)
# Requests of golden.REQUESTS for the twins (the big one only for (a)).
TWIN_REQUESTS = ("single", "uneven", "empty", "grouped")
ZOO_TWINS = ("dlrm", "dcn", "mmoe", "seq", "hstu")
TWIN_SEED = 5


class Skip(Exception):
    """A piece of the test that is not available (the row says why)."""


class Rows:
    """The printed table and the failure count."""

    def __init__(self, require_all):
        self.require_all, self.n, self.failures = require_all, 0, 0
        print("  %-10s %-8s %-10s %5s  %-9s %s" % ("model", "request", "check", "cands", "max_rel", ""))

    def add(self, model, req, check, n, err, tol, problem=None):
        ok = err <= tol
        self.n += 1
        self.failures += not ok
        print("  %-10s %-8s %-10s %5s  %-9s %s" % (model, req, check, n, "%.2e" % err if math.isfinite(err) else "-",
                                                  "ok" if ok else "FAIL"), flush=True)
        if not ok and problem:
            print("      %s" % problem, flush=True)

    def skip(self, model, check, why):
        self.n += 1
        self.failures += self.require_all
        print("  %-10s %-8s %-10s %5s  %-9s %s" % (model, "-", check, "-", "-",
                                                  ("FAIL (--require-all): " if self.require_all else "") +
                                                  "SKIP: " + why), flush=True)

    def fail(self, model, check, problem):
        self.add(model, "-", check, 0, math.inf, 0.0, problem)


def requests(model, mdir, salt, names):
    """[(name, request dict)] from golden.REQUESTS for a loaded model."""
    name, version = make_request.model_identity(mdir)
    out = []
    for ri, rname in enumerate(names):
        kw = dict(golden.REQUESTS[rname])
        counts = kw.pop("counts")
        out.append((rname, make_request.generate(model.plan, 1000 * salt + ri, counts, model=name,
                                                 model_version=version, **kw)))
    return out


def write_request(work, tag, req):
    path = os.path.join(work, "req_%s.json" % tag)
    with open(path, "w") as f:
        json.dump(req, f)
    return path


def check_random(args, rows, work):
    """(a): random broadcast-form models against the reference, both modes."""
    used = set()
    for seed in SEEDS:
        mname = "auto_%d" % seed
        mdir = os.path.join(work, "models", mname, "1")
        model, blocks = random_auto.make(seed, mdir, mname)
        used.update(blocks)
        for rname, req in requests(model, mdir, seed, golden.REQUESTS):
            path = write_request(work, "%s_%s" % (mname, rname), req)
            ref = export.score_request(model, req)
            n = len(req["candidates"])
            if rname == "uneven":
                err, problem = golden.selfcheck(model, req)
                rows.add(mname, rname, "selfcheck", n, err, 1e-9, problem)
            for mode in args.modes:
                out, error, _ = golden.run_bin(args.score_bin, mode, mdir, path, args.timeout)
                if error:
                    rows.add(mname, rname, mode, n, math.inf, args.tol, error)
                    continue
                err, problem = golden.compare(out, ref, len(model.plan.tasks))
                rows.add(mname, rname, mode, n, err, args.tol, problem)
        check_random_plan(args, rows, mname, mdir, model)
    missing = [b for b in random_auto.BLOCKS if b not in used]
    rows.add("auto_*", "-", "coverage", len(SEEDS), math.inf if missing else 0.0, 0.0,
             "blocks no seed uses: %s" % ", ".join(missing))


def expected_gathers(model):
    """Layers that must gather (MODEL_FORMAT.md, rewrite 5): in these models only cross and mixture
    take a user operand that no rewrite or map read serves (the reference's domains say which)."""
    nodes = model.plan.nodes
    out = set()
    for layer in model.plan.layers:
        if layer["op"] == "cross":
            ins = [layer["x0"], layer["input"]]
        elif layer["op"] == "mixture":
            ins = layer["experts"] + [layer["gate"]]
        else:
            continue
        if nodes[layer["name"]][0] == "candidate" and any(nodes[r][0] == "user" for r in ins):
            out.add(layer["name"])
    return out


def check_random_plan(args, rows, mname, mdir, model):
    """PLAN_BIN --json of a random model: auto-planned, and the layers planned as gathers are exactly
    expected_gathers (a rewritable use gathered, or a gather not reported, fails)."""
    if not usable_plan_bin(args):
        rows.skip(mname, "plan", "no ikbo-plan (--plan-bin %s)" % args.plan_bin)
        return
    try:
        plan = plan_json(args.plan_bin, mdir, args.timeout)
    except (ValueError, OSError, subprocess.TimeoutExpired) as e:
        rows.fail(mname, "plan", str(e))
        return
    got = {l["name"] for l in plan["layers"] if l["rewrite"] == "gather"}
    want = expected_gathers(model)
    users = {n for n, (d, _) in model.plan.nodes.items() if d == "user"}
    problems = []
    if plan.get("planning") != "auto":
        problems.append("planning %r, expected 'auto'" % plan.get("planning"))
    if got != want:
        problems.append("gather layers %s, expected %s" % (sorted(got), sorted(want)))
    if not {g["layer"] for g in plan["gathers"]} <= want or not {g["input"] for g in plan["gathers"]} <= users:
        problems.append("gathers %s" % [(g["layer"], g["input"]) for g in plan["gathers"]])
    if bool(plan["gathers"]) != bool(want):
        problems.append("%d gathers listed for %d gathering layers" % (len(plan["gathers"]), len(want)))
    rows.add(mname, "-", "plan", len(want), math.inf if problems else 0.0, 0.0, "; ".join(problems))


# ---------------------------------------------------------------- (b) twins

def importer():
    try:
        import ikbo_import
    except ImportError as e:
        raise Skip("importer not available (tools/importer/ikbo_import.py: %s)" % e)
    return ikbo_import


def plain_module(cls_name, mdir):
    """plain_models.<cls_name>.from_model_dir(mdir): the plain module computing a hand-written model."""
    try:
        import plain_models
    except ImportError as e:
        raise Skip("plain_models not available (tools/reference/plain_models.py: %s)" % e)
    cls = getattr(plain_models, cls_name, None)
    if cls is None:
        raise Skip("plain_models has no %s" % cls_name)
    return cls.from_model_dir(mdir)


def zoo_case(name, work):
    """(hand-written dir, module): zoo's module with random weights, written by hand (zoo.export_module)."""
    import torch
    import zoo
    torch.manual_seed(TWIN_SEED)
    m = zoo.MODELS[name][0]().double()
    hand = os.path.join(work, "hand", name, "1")
    zoo.export_module(m, name, hand, "random weights, seed %d" % TWIN_SEED, calibrate_seed=TWIN_SEED)
    return hand, m


def bench_case(work):
    hand = os.path.join(work, "hand", "bench", "1")
    subprocess.run([sys.executable, os.path.join(REPO, "models", "bench", "make_bench_model.py"), "--small",
                    "--dtype", "F32", "--out", hand], check=True, capture_output=True)
    return hand, plain_module("BenchModel", hand)


def twin_cases(work):
    """[(name, builder)]; builder() -> (hand-written dir, module) or raises Skip."""
    demo = os.path.join(REPO, "models", "demo", "1")
    cases = [("demo", lambda: (demo, plain_module("DemoModel", demo))), ("bench", lambda: bench_case(work))]
    return cases + [(n, lambda n=n: zoo_case(n, work)) for n in ZOO_TWINS]


def make_twin(name, hand, module, work):
    """Imports `module` as the broadcast-form twin of the hand-written model at `hand`."""
    imp = importer()
    spec = ikbo_ref.load_model(hand).spec
    out = os.path.join(work, "twin", name, "1")
    o = spec["output"]
    imp.import_module(module, spec["inputs"], o["tasks"], out, score_weights=o.get("score_weights"), name=name)
    return out


def plan_json(plan_bin, mdir, timeout):
    p = subprocess.run([plan_bin, "--json", mdir], capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise ValueError("%s --json %s: exit %d: %s" % (plan_bin, mdir, p.returncode, p.stderr.strip()[-300:]))
    return json.loads(p.stdout)


# The ops that compute with user rows read through the map. A mixed add or
# concat that only assembles a candidate row from user parts is not compared:
# it is how each model spells the user term (the hand-written DCN places x0
# with two linears and an add; its twin's concat reads the user part through
# the map; a linear over a mixed concat becomes an add of its two halves).
IKBO_OPS = ("lce", "dot_interaction", "target_attention", "din_attention", "mul")


def ikbo_ops(plan):
    return collections.Counter(e["op"] for e in plan["executed"] if e["mixed"] and e["op"] in IKBO_OPS)


def usable_plan_bin(args):
    return bool(args.plan_bin) and os.path.exists(args.plan_bin) and not args.plan_bin.endswith(".py")


def check_plans(args, rows, name, hand, twin):
    if not usable_plan_bin(args):
        rows.skip(name, "plan", "no ikbo-plan (--plan-bin %s)" % args.plan_bin)
        return
    try:
        ph, pt = plan_json(args.plan_bin, hand, args.timeout), plan_json(args.plan_bin, twin, args.timeout)
    except (ValueError, OSError, subprocess.TimeoutExpired) as e:
        rows.fail(name, "plan", str(e))
        return
    problems = []
    if pt.get("planning") != "auto":
        problems.append("twin planning %r, expected 'auto'" % pt.get("planning"))
    if pt["gathers"]:
        problems.append("twin gathers: %s" % "; ".join("%s <- %s (%s)" % (g["layer"], g["input"], g["reason"])
                                                      for g in pt["gathers"]))
    oh, ot = ikbo_ops(ph), ikbo_ops(pt)
    if oh != ot:
        problems.append("IKBO ops differ: hand-written %s, twin %s" % (dict(oh), dict(ot)))
    rows.add(name, "-", "plan", sum(ot.values()), math.inf if problems else 0.0, 0.0, "; ".join(problems))


def check_twin(args, rows, work, name, build):
    try:
        importer()                                  # the first piece missing is the one named
        hand, module = build()
        twin = make_twin(name, hand, module, work)
    except Skip as e:
        rows.skip(name, "twin", str(e))
        return
    except Exception as e:                          # the importer's error names the node: show it
        rows.fail(name, "import", "%s: %s" % (type(e).__name__, e))
        return
    try:
        model = ikbo_ref.load_model(twin)
    except ikbo_ref.ModelError as e:
        rows.fail(name, "load", str(e))
        return
    for rname, req in requests(model, twin, 77, TWIN_REQUESTS):
        path = write_request(work, "twin_%s_%s" % (name, rname), req)
        n = len(req["candidates"])
        for mode in args.modes:
            outs = [golden.run_bin(args.score_bin, mode, d, path, args.timeout) for d in (twin, hand)]
            error = outs[0][1] or outs[1][1]
            if error:
                rows.add(name, rname, mode, n, math.inf, args.twin_tol, error)
                continue
            err, problem = golden.compare(outs[0][0], outs[1][0], len(model.plan.tasks))
            rows.add(name, rname, mode, n, err, args.twin_tol, problem and "twin vs hand-written " + problem)
    check_plans(args, rows, name, hand, twin)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--score-bin", required=True, help="the C scorer, e.g. build/ikbo-score")
    ap.add_argument("--plan-bin", default=None, help="the planner report, e.g. build/ikbo-plan")
    ap.add_argument("--work", default=None, help="directory for models/requests (kept)")
    ap.add_argument("--tol", type=float, default=1e-5, help="max relative error vs the reference, (a)")
    ap.add_argument("--twin-tol", type=float, default=1e-6, help="max relative error twin vs hand-written, (b)")
    ap.add_argument("--modes", default=",".join(golden.MODES), help="comma-separated --mode values")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per binary run")
    ap.add_argument("--require-all", action="store_true", help="a skipped piece is a failure")
    ap.add_argument("--only", default="", help="comma-separated: random, twins or twin names")
    args = ap.parse_args()
    args.modes = [m for m in args.modes.split(",") if m]
    for k in ("score_bin", "plan_bin"):
        v = getattr(args, k)
        if v and os.path.exists(v):
            setattr(args, k, os.path.abspath(v))
    only = set(filter(None, args.only.split(",")))
    work = args.work or tempfile.mkdtemp(prefix="ikbo-golden-auto-")
    os.makedirs(work, exist_ok=True)
    print("golden_auto: scorer %s, planner %s, tol %g, twin tol %g, work %s"
          % (args.score_bin, args.plan_bin, args.tol, args.twin_tol, work))
    rows = Rows(args.require_all)
    if not only or "random" in only:
        check_random(args, rows, work)
    for name, build in twin_cases(work):
        if not only or "twins" in only or name in only:
            check_twin(args, rows, work, name, build)
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    print("golden_auto: %d checks, %d failed" % (rows.n, rows.failures))
    return 1 if rows.failures else 0


if __name__ == "__main__":
    sys.exit(main())
