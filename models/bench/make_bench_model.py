#!/usr/bin/python3
"""Writes the bench model: an `ikbo-model/1` model at the seed-scale shapes of
DESIGN.md, with random weights (so it is generated, never committed).

    /usr/bin/python3 models/bench/make_bench_model.py              # seed scale -> models/bench/1
    /usr/bin/python3 models/bench/make_bench_model.py --small      # CPU-sized  -> models/bench/1
    /usr/bin/python3 models/bench/make_bench_model.py --out /tmp/m/bench/1 --dtype BF16

Seed scale (default): D=256; LCE M=433 out tokens, Ku=1178 user tokens and
Kc=866 candidate tokens, each padded to a multiple of 8 (1184, 872) with
tokens whose LCE weights are zero (--no-pad keeps 1178/866); target attention
H=2, dh=128, Tq=64 query tokens over a history of max_len L=1024 (--max-len
512 or 2048 for the other attention points). Weights F16 by default
(~50 MB on disk, small enough to carry to a GPU machine; the engine converts
at load). Widths that DESIGN.md does not fix (the user MLP's hidden width,
table rows) are kept small so the file stays small.

Architecture (the reference architecture of MODEL_FORMAT.md, widened):
  user:      hist_mean + one embedding_bag per user sparse feature +
             user.dense -> linear(relu) -> linear -> reshape into the rest of
             the Ku tokens                                  E_user [Ku, D]
  candidate: item and author embedding_bags + candidate.dense -> linear(relu)
             -> reshape into Tq-2 tokens                     X [Tq, D]
             target_attention(X, history)                    [Tq, D]
             candidate.dense -> linear(relu) -> reshape into the rest of Kc
             E_cand = stack(X, attention, rest)              [Kc, D]
  lce(E_user, E_cand, M) -> flatten -> linear(top width, relu) -> logits [2]

--small is the same architecture at CPU size (D=32, Ku=48, Kc=40, M=16,
H=2, dh=16, Tq=8, L=64). Every shape has a flag; the printed summary gives
the resulting Ku, Kc and parameter count.
"""
import argparse
import math
import os
import random
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tools", "reference"))
import export  # noqa: E402
import make_request  # noqa: E402
import random_model  # noqa: E402

SEED_SCALE = dict(dim=256, ku=1178, kc=866, out_tokens=433, heads=2, head_dim=128, tq=64,
                  max_len=1024, actions=4, user_dense=64, user_sparse=8, cand_dense=16,
                  hidden=32, top_width=64, item_rows=5000, author_rows=2000, user_rows=1000)
SMALL = dict(dim=32, ku=48, kc=40, out_tokens=16, heads=2, head_dim=16, tq=8,
             max_len=64, actions=4, user_dense=16, user_sparse=2, cand_dense=8,
             hidden=32, top_width=64, item_rows=5000, author_rows=500, user_rows=100)


def pad8(k):
    return (k + 7) // 8 * 8


def build_spec(a):
    D = a.dim
    ku = pad8(a.ku) if a.pad else a.ku
    kc = pad8(a.kc) if a.pad else a.kc
    uf = ["uf%d" % i for i in range(a.user_sparse)]
    u_dense_tokens = ku - len(uf) - 1                       # hist_mean is one token
    c_dense_tokens = a.tq - 2                               # item and author are two
    c_rest_tokens = kc - 2 * a.tq                           # after X and the attention output
    if u_dense_tokens < 1 or c_dense_tokens < 1 or c_rest_tokens < 1:
        raise SystemExit("make_bench_model: need Ku > user sparse + 1, Tq > 2 and Kc > 2*Tq "
                         "(got Ku=%d, Tq=%d, Kc=%d)" % (ku, a.tq, kc))
    if a.heads * a.head_dim != D:
        print("note: heads*head_dim = %d != D = %d" % (a.heads * a.head_dim, D), file=sys.stderr)
    tables = {"item": {"rows": a.item_rows, "dim": D}, "author": {"rows": a.author_rows, "dim": D}}
    for f in uf:
        tables["t_" + f] = {"rows": a.user_rows, "dim": D}
    L = [{"name": "hist", "op": "history_embedding", "input": "user.history", "table": "item"},
         {"name": "hist_mean", "op": "mean_pool", "input": "hist"}]
    for f in uf:
        L.append({"name": "u_" + f, "op": "embedding_bag", "input": "user.sparse." + f,
                  "table": "t_" + f, "pooling": "sum"})
    L += [{"name": "u_d1", "op": "linear", "input": "user.dense", "out": a.hidden, "activation": "relu"},
          {"name": "u_d2", "op": "linear", "input": "u_d1", "out": u_dense_tokens * D, "activation": "none"},
          {"name": "u_dtok", "op": "reshape", "input": "u_d2", "tokens": u_dense_tokens},
          # the dense tokens last, so the zero-weight padding columns are theirs
          {"name": "e_user", "op": "stack", "inputs": ["hist_mean"] + ["u_" + f for f in uf] + ["u_dtok"]},
          {"name": "c_item", "op": "embedding_bag", "input": "candidate.sparse.item", "table": "item", "pooling": "sum"},
          {"name": "c_author", "op": "embedding_bag", "input": "candidate.sparse.author", "table": "author", "pooling": "sum"},
          {"name": "c_d1", "op": "linear", "input": "candidate.dense", "out": c_dense_tokens * D, "activation": "relu"},
          {"name": "c_dtok", "op": "reshape", "input": "c_d1", "tokens": c_dense_tokens},
          {"name": "x_cand", "op": "stack", "inputs": ["c_item", "c_author", "c_dtok"]},
          {"name": "ta", "op": "target_attention", "query": "x_cand", "history": "hist",
           "heads": a.heads, "head_dim": a.head_dim},
          {"name": "c_r1", "op": "linear", "input": "candidate.dense", "out": c_rest_tokens * D, "activation": "relu"},
          {"name": "c_rest", "op": "reshape", "input": "c_r1", "tokens": c_rest_tokens},
          {"name": "e_cand", "op": "stack", "inputs": ["x_cand", "ta", "c_rest"]},
          {"name": "lce", "op": "lce", "user": "e_user", "candidate": "e_cand", "out_tokens": a.out_tokens},
          {"name": "flat", "op": "flatten", "input": "lce"},
          {"name": "top1", "op": "linear", "input": "flat", "out": a.top_width, "activation": "relu"},
          {"name": "logits", "op": "linear", "input": "top1", "out": 2, "activation": "none"}]
    desc = ("bench model, random weights (models/bench/make_bench_model.py%s --seed %d): D=%d, "
            "LCE M=%d Ku=%d Kc=%d (unpadded %d/%d), attention H=%d dh=%d Tq=%d L=%d"
            % (" --small" if a.small else "", a.seed, D, a.out_tokens, ku, kc, a.ku, a.kc,
               a.heads, a.head_dim, a.tq, a.max_len))
    return {"format": "ikbo-model/1", "name": a.name, "description": desc,
            "inputs": {"user": {"dense": a.user_dense, "sparse": uf,
                                "history": {"max_len": a.max_len, "actions": a.actions}},
                       "candidate": {"dense": a.cand_dense, "sparse": ["item", "author"]}},
            "tables": tables, "layers": L,
            "output": {"logits": "logits", "tasks": ["click", "like"], "score_weights": [1.0, 0.5]}}


def make(a):
    spec = build_spec(a)
    m = export.IkboModule(spec, dtype=torch.float64)
    random_model.init_weights(m, a.seed)
    ku = m.plan.param_shapes["lce.w_user"][1]
    kc = m.plan.param_shapes["lce.w_cand"][1]
    with torch.no_grad():                                  # K padding: zero LCE weights
        m.param("lce.w_user")[:, a.ku:].zero_()
        m.param("lce.w_cand")[:, a.kc:].zero_()
    # Logits ~ N(0, 1) on a small random request (what random_model.calibrate
    # does, with fewer candidates: at seed scale the float64 forward is slow).
    rng = random.Random(a.seed)
    req = make_request.generate(m.plan, a.seed, [rng.randint(2, 4) for _ in range(3)], model=a.name)
    batch = export.batch_from_request(m.plan, req)
    w, b = m.param("logits.weight"), m.param("logits.bias")
    with torch.no_grad():
        z = m(batch) - b
        mean, std = z.mean(0), z.std(0).clamp(min=1e-3)
        w.div_(std.unsqueeze(1))
        b.copy_(-mean / std)
    export.save(m, a.out, dtype=a.dtype, metadata={"seed": str(a.seed)})
    n = sum(int(math.prod(s)) for s in m.plan.param_shapes.values())
    return ku, kc, n


def main(argv=None):
    ap = argparse.ArgumentParser(description="Write the bench model (random weights) at seed scale or --small.")
    ap.add_argument("--out", default=os.path.join(ROOT, "models", "bench", "1"),
                    help="version directory to write (default models/bench/1)")
    ap.add_argument("--name", default=None, help="model name (default: the parent directory's name)")
    ap.add_argument("--small", action="store_true", help="CPU-sized shapes instead of seed scale")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", choices=export.DTYPES, default="F16")
    ap.add_argument("--no-pad", dest="pad", action="store_false",
                    help="keep Ku/Kc as given instead of padding them to a multiple of 8")
    for k in SEED_SCALE:
        ap.add_argument("--" + k.replace("_", "-"), type=int, default=None,
                        help="default %d (--small: %d)" % (SEED_SCALE[k], SMALL[k]))
    a = ap.parse_args(argv)
    base = SMALL if a.small else SEED_SCALE
    for k, v in base.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    if a.name is None:
        a.name = os.path.basename(os.path.dirname(os.path.abspath(a.out)))
    ku, kc, n = make(a)
    size = os.path.getsize(os.path.join(a.out, "weights.safetensors"))
    print("%s: D=%d Ku=%d Kc=%d M=%d H=%d dh=%d Tq=%d L=%d, %.1fM parameters, %.0f MB %s"
          % (a.out, a.dim, ku, kc, a.out_tokens, a.heads, a.head_dim, a.tq, a.max_len, n / 1e6,
             size / 1e6, a.dtype))
    return 0


if __name__ == "__main__":
    sys.exit(main())
