#!/usr/bin/python3
"""Golden numerics test of the C engine (run by `make test`).

    tests/golden/golden.py --score-bin build/ikbo-score [--work DIR] [--tol 1e-5]

For the shipped models (demo, dlrm, dcn, mmoe), random models of the ranking
architectures (tools/reference/random_family.py: DLRM, DCNv2, MMoE), and several randomly shaped models (different D,
heads, head_dim, K sizes, layer counts, weight dtypes F32/F16/BF16; `add` of
user [D] into candidate [D], user tokens into candidate tokens and user+user;
one model without history; [D] vectors as attention query and lce operands),
and several random requests each (one user
with one candidate; uneven candidates per user, interleaved, with duplicate
users and a same-key/different-content user; a user with 1000 candidates;
empty histories and bags; histories longer than max_len), it runs

    SCORE_BIN --mode ikbo|broadcast MODEL_DIR REQ.json

which must print {"scores": [...], "task_scores": [[...], ...]} in request
order and exit 0, and compares every score and task score with the reference
interpreter (tools/reference/ikbo_ref.py, float64): relative error
|c - r| / max(|r|, 1e-6) <= tol. It first runs tests/golden/test_ref_ops.py (the reference's ranking ops
against naive numpy loops) and checks that the reference's two
implementations (naive per-candidate, batched nn.Module) agree.

Prints one row per (model, request, mode) and exits 1 on any failure.
Random models and requests go under --work (default: a temp dir, removed
afterwards); all seeds are fixed, so runs are reproducible. To test this
script without the C binary: --score-bin tools/reference/ikbo_ref.py.
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tools", "reference"))
import export  # noqa: E402
import ikbo_ref  # noqa: E402
import make_request  # noqa: E402
import random_family  # noqa: E402
import random_model  # noqa: E402

# Random model shapes: name -> random_model.py flags. Keep them small enough
# that an fp32 engine stays well inside the tolerance (~1e-6 measured with
# fp32 PyTorch), but varied: D, heads x head_dim != D, Ku/Kc, depth, dtype.
RANDOM_MODELS = {
    "rand_a": "--seed 101 --dim 16 --heads 2 --head-dim 8 --add vector --mlp-layers 2",
    "rand_b": ("--seed 202 --dim 24 --no-history --add tokens --user-dense-tokens 3 --cand-dense-tokens 2 "
               "--mlp-layers 1 --tasks 1 --dtype BF16"),
    "rand_c": ("--seed 303 --dim 8 --heads 3 --head-dim 5 --add both --mlp-layers 4 --max-len 40 --actions 5 "
               "--user-sparse 4 --cand-sparse 3 --out-tokens 9 --rows 1-500 --dtype F16"),
    "rand_d": ("--seed 404 --dim 40 --heads 4 --head-dim 12 --user-sparse 1 --cand-sparse 1 --user-dense-tokens 2 "
               "--cand-dense-tokens 3 --out-tokens 3 --mlp-layers 2 --mlp-width 48 --tasks 3 --max-len 7 --actions 2 "
               "--vector-operands"),
    # lce out_tokens well above its tokens and a narrow top: the engine folds
    # lce -> flat -> top1 (engine/fold.h), both sides in rand_fold, the
    # candidate side alone in rand_fold_u (12 user dense tokens); the
    # reference computes the chain as written.
    "rand_fold": "--seed 505 --dim 16 --heads 2 --head-dim 8 --out-tokens 16 --mlp-layers 2 --mlp-width 8",
    "rand_fold_u": ("--seed 606 --dim 16 --heads 2 --head-dim 8 --out-tokens 6 --mlp-layers 2 --mlp-width 16 "
                    "--user-dense-tokens 12"),
    # no history: lce.candidate is X itself, whose dense part (a ReLU linear
    # of the 4 candidate dense inputs, reshaped) the fold computes with mlp2.
    "rand_fold_m": ("--seed 707 --dim 16 --no-history --cand-sparse 2 --cand-dense-tokens 4 --out-tokens 16 "
                    "--mlp-layers 2 --mlp-width 8"),
}

# Random models of the ranking architectures (random_family.py): name ->
# (family, seed, weight dtype); three per family, every non-sequence op of
# MODEL_FORMAT.md's "Ops for real ranking architectures" among them.
RANDOM_FAMILIES = {
    "dlrm_a": ("dlrm", 11, "F32"), "dlrm_b": ("dlrm", 14, "BF16"), "dlrm_c": ("dlrm", 13, "F32"),
    "dcn_a": ("dcn", 21, "F32"), "dcn_b": ("dcn", 22, "F16"), "dcn_c": ("dcn", 23, "F32"),
    "mmoe_a": ("mmoe", 31, "F32"), "mmoe_b": ("mmoe", 32, "BF16"), "mmoe_c": ("mmoe", 33, "F32"),
    "seq_a": ("seq", 41, "F32"), "seq_b": ("seq", 42, "BF16"), "seq_c": ("seq", 43, "F32"),
    "hstu_a": ("hstu", 51, "F32"), "hstu_b": ("hstu", 52, "F16"), "hstu_c": ("hstu", 53, "F32"),
}
# The shipped models; a missing directory is a failure.
SHIPPED = ("demo", "dlrm", "dcn", "mmoe", "seq", "hstu")

# Requests: name -> make_request.generate keyword arguments (counts = candidates
# per distinct user).
REQUESTS = {
    "single": dict(counts=[1], dup_users=0, same_key_users=0),
    "uneven": dict(counts=[3, 17, 1, 40, 8, 2], dup_users=2, same_key_users=1, unused_users=1, snake=True),
    "big": dict(counts=[1000, 7, 2], dup_users=1, same_key_users=1, history=("long", "empty", "exact")),
    "empty": dict(counts=[3, 1, 4], dup_users=1, same_key_users=0, empty=True),
    "grouped": dict(counts=[5, 5, 5, 1], dup_users=0, same_key_users=1, shuffle=False, snake=True),
}
MODES = ("ikbo", "broadcast")


def rel_err(c, r):
    return abs(c - r) / max(abs(r), 1e-6)


def compare(out, ref, ntasks):
    """-> (max relative error, where it is); inf and the problem when the
    output does not have the expected form."""
    if not isinstance(out, dict) or "scores" not in out or "task_scores" not in out:
        return math.inf, "output lacks scores/task_scores"
    s, ts = out["scores"], out["task_scores"]
    n = len(ref["scores"])
    if len(s) != n or len(ts) != n:
        return math.inf, "%d scores / %d task_scores for %d candidates" % (len(s), len(ts), n)
    worst, where = 0.0, None
    for i in range(n):
        if not isinstance(ts[i], list) or len(ts[i]) != ntasks:
            return math.inf, "candidate %d: task_scores %r, expected %d values" % (i, ts[i], ntasks)
        pairs = [(s[i], ref["scores"][i], "score")] + [
            (ts[i][t], ref["task_scores"][i][t], "task %d" % t) for t in range(ntasks)]
        for c, r, what in pairs:
            if not isinstance(c, (int, float)) or isinstance(c, bool) or not math.isfinite(c):
                return math.inf, "candidate %d %s: %r" % (i, what, c)
            e = rel_err(c, r)
            if e > worst:
                worst, where = e, "candidate %d %s: got %.9g, reference %.9g" % (i, what, c, r)
    return worst, where


def run_bin(score_bin, mode, model_dir, req_path, timeout):
    """-> (parsed stdout or None, error text or None, seconds)."""
    t0 = time.time()
    try:
        p = subprocess.run([score_bin, "--mode", mode, model_dir, req_path],
                           capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, str(e), time.time() - t0
    dt = time.time() - t0
    if p.returncode != 0:
        return None, "exit %d: %s" % (p.returncode, p.stderr.strip()[-400:]), dt
    try:
        return json.loads(p.stdout), None, dt
    except json.JSONDecodeError as e:
        return None, "stdout is not JSON (%s): %r" % (e, p.stdout[:200]), dt


def selfcheck(model, req):
    """Max relative error between the naive float64 interpreter and the
    batched nn.Module in float64 (both in tools/reference)."""
    import torch
    ref = ikbo_ref.score_request(model, req)
    m = export.IkboModule(model.spec, dtype=torch.float64)
    with torch.no_grad():
        for n, t in model.w.items():
            m.param(n).copy_(t)
        p = torch.sigmoid(m(export.batch_from_request(model.plan, req)))
    sw = torch.tensor(model.plan.score_weights, dtype=torch.float64)
    out = {"scores": (p * sw).sum(1).tolist(), "task_scores": p.tolist()}
    return compare(out, ref, len(model.plan.tasks))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--score-bin", required=True, help="the C scorer, e.g. build/ikbo-score")
    ap.add_argument("--work", default=None, help="directory for random models/requests (kept)")
    ap.add_argument("--tol", type=float, default=1e-5, help="max relative error")
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated --mode values")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per scorer run")
    ap.add_argument("--only", default="", help="comma-separated model names to check (default: all)")
    args = ap.parse_args()
    score_bin = os.path.abspath(args.score_bin) if os.path.exists(args.score_bin) else args.score_bin
    work = args.work or tempfile.mkdtemp(prefix="ikbo-golden-")
    os.makedirs(work, exist_ok=True)
    modes = [m for m in args.modes.split(",") if m]
    rows, failures = [], 0

    def row(model, req, mode, n, err, problem, secs=None):
        nonlocal failures
        ok = err <= (1e-9 if mode == "selfcheck" else args.tol)     # hard problems have err = inf
        if not ok:
            failures += 1
        rows.append((model, req, mode, str(n), "%.2e" % err if math.isfinite(err) else "-",
                     "" if secs is None else "%.2f" % secs, "ok" if ok else "FAIL"))
        print("  %-8s %-8s %-10s %5s  %-9s %-6s %s" % rows[-1], flush=True)
        if not ok and problem:
            print("      %s" % problem, flush=True)

    # The reference's own ranking ops against naive numpy loops comes first.
    ops = subprocess.run([sys.executable, os.path.join(REPO, "tests", "golden", "test_ref_ops.py")],
                         capture_output=True, text=True)
    row("ref_ops", "-", "selfcheck", 0, 0.0 if ops.returncode == 0 else math.inf,
        (ops.stdout + ops.stderr).strip()[-2000:])

    # Models: the shipped ones plus the random ones.
    models = [(n, os.path.join(REPO, "models", n, "1")) for n in SHIPPED]
    for name, flags in RANDOM_MODELS.items():
        out = os.path.join(work, "models", name, "1")
        a = random_model.parser().parse_args(flags.split() + ["--out", out, "--name", name])
        random_model.make(a)
        models.append((name, out))
    for name, (family, seed, dtype) in RANDOM_FAMILIES.items():
        out = os.path.join(work, "models", name, "1")
        random_family.make(family, seed, out, name, dtype)
        models.append((name, out))

    if args.only:
        keep = set(args.only.split(","))
        models = [(n, d) for n, d in models if n in keep]
    print("golden: scorer %s, tol %g, work %s" % (score_bin, args.tol, work))
    print("  %-8s %-8s %-10s %5s  %-9s %-6s %s" % ("model", "request", "mode", "cands", "max_rel", "secs", ""))
    for mi, (mname, mdir) in enumerate(models):
        try:
            model = ikbo_ref.load_model(mdir)
        except (ikbo_ref.ModelError, OSError) as e:
            row(mname, "-", "load", 0, math.inf, str(e))
            continue
        name, version = make_request.model_identity(mdir)
        reqs = []
        for ri, (rname, kw) in enumerate(REQUESTS.items()):
            kw = dict(kw)
            counts = kw.pop("counts")
            req = make_request.generate(model.plan, 1000 * (mi + 1) + ri, counts, model=name,
                                        model_version=version, **kw)
            reqs.append((rname, req))
        example = os.path.join(REPO, "models", mname, "example_request.json")
        if mname in SHIPPED and os.path.exists(example):
            with open(example) as f:
                reqs.append(("example", json.load(f)))
        for rname, req in reqs:
            path = os.path.join(work, "req_%s_%s.json" % (mname, rname))
            with open(path, "w") as f:
                json.dump(req, f)
            ncand = len(req["candidates"])
            ref = ikbo_ref.score_request(model, req)
            if rname == "uneven":
                err, problem = selfcheck(model, req)
                row(mname, rname, "selfcheck", ncand, err, problem)
            for mode in modes:
                out, error, secs = run_bin(score_bin, mode, mdir, path, args.timeout)
                if error:
                    row(mname, rname, mode, ncand, math.inf, error, secs)
                    continue
                err, problem = compare(out, ref, len(model.plan.tasks))
                row(mname, rname, mode, ncand, err, problem, secs)

    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    print("golden: %d checks, %d failed" % (len(rows), failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
