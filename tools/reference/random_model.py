#!/usr/bin/python3
"""Random valid `ikbo-model/1` models of any shape, for numerics tests of the
C engine against the reference interpreter.

    random_model.py --out DIR/<name>/<version> --seed S [shape flags]

The architecture generalizes MODEL_FORMAT.md's reference model:
  user:      one embedding_bag per user sparse feature (pooling random),
             user.dense -> linear(relu) -> linear -> reshape into
             --user-dense-tokens tokens, history_embedding + mean_pool,
             stacked into E_user [Ku, D]
             (Ku = user sparse + user dense tokens + 1 with history)
  candidate: one embedding_bag per candidate sparse feature,
             candidate.dense -> linear(relu) -> reshape into
             --cand-dense-tokens tokens, stacked into X [Tq, D];
             target_attention(X, history) stacked after X (with history)
             (Kc = Tq, or 2*Tq with history)
  then lce -> flatten -> --mlp-layers hidden linear layers -> logits [T].
--add vector adds a user [D] embedding to a candidate [D] embedding,
--add tokens adds user [K, D] tokens (from user.dense) to the candidate dense
tokens, --add both does both and a user+user add. --vector-operands adds a
target_attention whose query is a candidate [D] vector and a second lce with
[D] operands (a [D] counts as one token, as in stack).

Weights are drawn so activations stay O(1), then the logits layer is rescaled
on a random request so every task's logits have mean ~0 and std ~1: no
sigmoid saturation, so relative-error comparisons of scores are meaningful.
"""
import argparse
import math
import os
import random
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export  # noqa: E402
import ikbo_ref  # noqa: E402
import make_request  # noqa: E402


def build_spec(a):
    """Model.json dict for the parsed CLI options `a` (randomness from a.seed)."""
    rng = random.Random(a.seed)
    D = a.dim
    lo, hi = (int(x) for x in a.rows.split("-"))
    uf = ["uf%d" % i for i in range(a.user_sparse)]
    cf = ["cf%d" % i for i in range(a.cand_sparse)]
    tables = {}
    for f in uf + cf:
        tables["t_" + f] = {"rows": rng.randint(lo, hi), "dim": D}
    inputs = {"user": {"dense": a.user_dense, "sparse": uf}, "candidate": {"dense": a.cand_dense, "sparse": cf}}
    history = not a.no_history
    if history:
        inputs["user"]["history"] = {"max_len": a.max_len, "actions": a.actions}
        htable = "t_" + cf[0] if cf else "t_hist"   # share the item table when there is one
        tables.setdefault(htable, {"rows": rng.randint(lo, hi), "dim": D})
    L = []

    def lin(name, inp, out, act):
        layer = {"name": name, "op": "linear", "input": inp, "out": out}
        if act is not None:                          # None: key omitted (= "none")
            layer["activation"] = act
        L.append(layer)

    # ---- user side
    u_tokens = []
    for f in uf:
        L.append({"name": "u_" + f, "op": "embedding_bag", "input": "user.sparse." + f,
                  "table": "t_" + f, "pooling": rng.choice(["sum", "mean"])})
        u_tokens.append("u_" + f)
    if a.user_dense and a.user_dense_tokens:
        lin("u_d1", "user.dense", a.mlp_width, "relu")
        lin("u_d2", "u_d1", a.user_dense_tokens * D, rng.choice(["none", None]))
        L.append({"name": "u_dtok", "op": "reshape", "input": "u_d2", "tokens": a.user_dense_tokens})
        u_tokens.append("u_dtok")
    if history:
        L.append({"name": "hist", "op": "history_embedding", "input": "user.history", "table": htable})
        L.append({"name": "hist_mean", "op": "mean_pool", "input": "hist"})
        u_tokens.append("hist_mean")
    if a.add == "both" and uf and history:
        L.append({"name": "u_mix", "op": "add", "a": "u_" + uf[0], "b": "hist_mean"})   # user + user
        u_tokens[0] = "u_mix"
    if not u_tokens:
        raise SystemExit("random_model: the user side has no tokens (need user sparse, dense tokens or history)")
    L.append({"name": "e_user", "op": "stack", "inputs": u_tokens})

    # ---- candidate side
    c_tokens = []
    for f in cf:
        L.append({"name": "c_" + f, "op": "embedding_bag", "input": "candidate.sparse." + f,
                  "table": "t_" + f, "pooling": rng.choice(["sum", "sum", "mean"])})
        c_tokens.append("c_" + f)
    if a.cand_dense and a.cand_dense_tokens:
        lin("c_d1", "candidate.dense", a.cand_dense_tokens * D, "relu")
        L.append({"name": "c_dtok", "op": "reshape", "input": "c_d1", "tokens": a.cand_dense_tokens})
        c_tokens.append("c_dtok")
    if not c_tokens:
        raise SystemExit("random_model: the candidate side has no tokens")
    if a.add in ("vector", "both"):
        user_vec = ("u_" + uf[-1]) if uf else ("hist_mean" if history else None)
        cand_vec = [t for t in c_tokens if t.startswith("c_cf")]
        if user_vec is None or not cand_vec:
            raise SystemExit("random_model: --add vector needs a user [D] vector and a candidate sparse feature")
        # the "inputs": [a, b] form here, "a"/"b" elsewhere: both are accepted
        L.append({"name": "c_vmix", "op": "add", "inputs": [user_vec, cand_vec[0]]})   # user first
        c_tokens[c_tokens.index(cand_vec[0])] = "c_vmix"
    if a.add in ("tokens", "both"):
        if not (a.user_dense and "c_dtok" in c_tokens):
            raise SystemExit("random_model: --add tokens needs user dense and candidate dense tokens")
        lin("u_t1", "user.dense", a.cand_dense_tokens * D, "sigmoid")
        L.append({"name": "u_ttok", "op": "reshape", "input": "u_t1", "tokens": a.cand_dense_tokens})
        L.append({"name": "c_tmix", "op": "add", "a": "c_dtok", "b": "u_ttok"})         # candidate first
        c_tokens[c_tokens.index("c_dtok")] = "c_tmix"
    L.append({"name": "x_cand", "op": "stack", "inputs": c_tokens})
    cand_vec = c_tokens[0] if cf else None         # a candidate [D] vector
    user_vec = "hist_mean" if history else ("u_" + uf[0] if uf else None)
    if a.vector_operands and (cand_vec is None or user_vec is None):
        raise SystemExit("random_model: --vector-operands needs a candidate sparse feature and a user [D] vector")
    e_cand = ["x_cand"]
    if history:
        L.append({"name": "ta", "op": "target_attention", "query": "x_cand", "history": "hist",
                  "heads": a.heads, "head_dim": a.head_dim})
        e_cand.append("ta")
        if a.vector_operands:                      # a [D] query is one query token
            L.append({"name": "ta_v", "op": "target_attention", "query": cand_vec, "history": "hist",
                      "heads": a.heads, "head_dim": a.head_dim})
            e_cand.append("ta_v")
    if len(e_cand) > 1:
        L.append({"name": "e_cand", "op": "stack", "inputs": e_cand})

    # ---- interaction and top MLP
    L.append({"name": "lce", "op": "lce", "user": "e_user", "candidate": "e_cand" if len(e_cand) > 1 else "x_cand",
              "out_tokens": a.out_tokens})
    z = "lce"
    if a.vector_operands:                          # [D] operands count as one token each
        L.append({"name": "lce_v", "op": "lce", "user": user_vec, "candidate": cand_vec, "out_tokens": 2})
        L.append({"name": "z", "op": "stack", "inputs": ["lce", "lce_v"]})
        z = "z"
    L.append({"name": "flat", "op": "flatten", "input": z})
    prev = "flat"
    for i in range(a.mlp_layers):
        act = "sigmoid" if (i == 1 and a.mlp_layers > 2) else "relu"
        lin("top%d" % (i + 1), prev, a.mlp_width, act)
        prev = "top%d" % (i + 1)
    lin("logits", prev, a.tasks, rng.choice(["none", None]))
    output = {"logits": "logits", "tasks": ["task%d" % t for t in range(a.tasks)]}
    if rng.random() < 0.7:
        output["score_weights"] = [round(rng.uniform(0.25, 1.5), 3) for _ in range(a.tasks)]
    return {"format": "ikbo-model/1", "name": a.name,
            "description": "random test model (tools/reference/random_model.py --seed %d)" % a.seed,
            "inputs": inputs, "tables": tables, "layers": L, "output": output}


def init_weights(m, seed):
    """O(1)-activation init (float64 module)."""
    g = torch.Generator()
    g.manual_seed(seed)
    plan = m.plan
    acts = {layer["name"]: layer.get("activation", "none") for layer in plan.layers if layer["op"] == "linear"}
    with torch.no_grad():
        for name, shape in plan.param_shapes.items():
            layer, param = name.rsplit(".", 1)
            r = torch.randn(shape, generator=g, dtype=torch.float64)
            if layer == "tables":
                std = 1.0
            elif param in ("action", "position"):
                std = 0.5
            elif param == "weight":
                std = math.sqrt((2.0 if acts[layer] == "relu" else 1.0) / shape[1])
            elif param == "bias":
                std = 0.1
            elif param in ("w_user", "w_cand"):
                std = 1.0 / math.sqrt(plan.param_shapes[layer + ".w_user"][1] + plan.param_shapes[layer + ".w_cand"][1])
            else:                                   # wq wk wv [H*dh, D], wo [D, H*dh]
                std = 1.0 / math.sqrt(shape[1])
            m.param(name).copy_(r * std)


def calibrate(m, seed, model_name):
    """Rescales the logits layer so each task's logits ~ N(~0, 1) on a random request."""
    rng = random.Random(seed)
    req = make_request.generate(m.plan, seed, [rng.randint(1, 40) for _ in range(12)], model=model_name)
    batch = export.batch_from_request(m.plan, req)
    w, b = m.param("logits.weight"), m.param("logits.bias")
    with torch.no_grad():
        z = m(batch) - b                            # [C, T] without bias
        mean, std = z.mean(0), z.std(0).clamp(min=1e-3)
        w.div_(std.unsqueeze(1))
        b.copy_(-mean / std + 0.3 * torch.randn(b.shape, generator=torch.Generator().manual_seed(seed),
                                                dtype=b.dtype))


def make(a):
    """Builds, calibrates and writes the model of options `a`; returns the loaded model."""
    spec = build_spec(a)
    m = export.IkboModule(spec, dtype=torch.float64)
    init_weights(m, a.seed)
    calibrate(m, a.seed, a.name)
    return export.save(m, a.out, dtype=a.dtype, metadata={"seed": a.seed})


def parser():
    ap = argparse.ArgumentParser(description="Write a random valid ikbo-model/1 model.")
    ap.add_argument("--out", required=True, help="version directory to write, e.g. /tmp/m/rand/1")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default=None, help="model name (default: the parent directory's name)")
    ap.add_argument("--dim", type=int, default=16, help="token width D")
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=8)
    ap.add_argument("--user-dense", type=int, default=5)
    ap.add_argument("--cand-dense", type=int, default=3)
    ap.add_argument("--user-sparse", type=int, default=2, help="number of user sparse features")
    ap.add_argument("--cand-sparse", type=int, default=2, help="number of candidate sparse features")
    ap.add_argument("--rows", default="10-3000", help="table rows, MIN-MAX")
    ap.add_argument("--user-dense-tokens", type=int, default=1, help="tokens from user.dense (Ku)")
    ap.add_argument("--cand-dense-tokens", type=int, default=1, help="tokens from candidate.dense (Kc)")
    ap.add_argument("--out-tokens", type=int, default=4, help="LCE out_tokens M")
    ap.add_argument("--mlp-layers", type=int, default=2, help="hidden layers of the top MLP")
    ap.add_argument("--mlp-width", type=int, default=32)
    ap.add_argument("--tasks", type=int, default=2)
    ap.add_argument("--no-history", action="store_true")
    ap.add_argument("--max-len", type=int, default=16)
    ap.add_argument("--actions", type=int, default=3)
    ap.add_argument("--add", choices=["none", "vector", "tokens", "both"], default="none")
    ap.add_argument("--vector-operands", action="store_true",
                    help="also a target_attention with a [D] query and an lce with [D] operands")
    ap.add_argument("--dtype", choices=export.DTYPES, default="F32")
    return ap


def main(argv=None):
    a = parser().parse_args(argv)
    if a.name is None:
        a.name = os.path.basename(os.path.dirname(os.path.abspath(a.out)))
    model = make(a)
    p = model.plan
    print("%s: %d layers, %d weights, D=%d, Ku=%d, Kc=%d" % (
        a.out, len(p.layers), len(p.param_shapes), a.dim, p.param_shapes["lce.w_user"][1],
        p.param_shapes["lce.w_cand"][1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
