#!/usr/bin/python3
"""Random valid `ikbo-model/1` models of the ranking architectures (DLRM,
DCNv2, MMoE) and the sequence models (transformer, HSTU), for numerics
tests of the C engine against the reference.

    random_family.py --family dlrm|dcn|mmoe|seq|hstu --seed S --out DIR/<name>/<version>

Every shape is drawn from the seed: widths, feature counts, depths, token
orders, activations, ranks, experts and tasks. The families use every op of
MODEL_FORMAT.md's "Ops for real ranking architectures" (the sequence ops in
seq and hstu), with user-only parts in the user domain and the mixing ops (mul,
dot_interaction, add, lce) reading user rows through the map:
  dlrm  bottom MLPs on user and candidate dense, embedding bags, a
        dot_interaction over user and candidate vectors and tokens in a random
        interleaved order (self on or off), concat with the candidate bottom
        and a user*candidate mul, top MLP.
  dcn   candidate embeddings and dense concatenated, plus a user projection
        added through the map; full-rank and low-rank cross layers,
        layer_norm, a deep tower with gelu/silu/tanh, concat, logits.
  mmoe  a shared bottom (token_linear over candidate tokens, pool, mul with a
        user vector, activation), E experts, one softmax gate per task
        (mixture), per-task towers, task logits by concat.
  seq   a history (max_len 4..24, 1..4 actions) through 1-2 pre-LN
        transformer blocks (layer_norm -> self_attention, random heads 1..3,
        head_dim 4/8/16, causal or not -> add -> layer_norm -> linear
        gelu/silu -> linear -> add), pooled last and/or mean; a
        target_attention shared_with one block's self_attention (query a
        candidate [D] vector or 2 projected tokens); a din_attention over
        the history (random activation and normalize); user vectors meet
        candidate ones through mul, add, lce and dot_interaction.
  hstu  the same with self_attention kind "silu".
The logits layer is rescaled (random_model.calibrate) so that sigmoid does
not saturate and relative errors of scores are meaningful.
"""
import argparse
import os
import random
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export  # noqa: E402
import random_model  # noqa: E402

ACTS = ("relu", "gelu", "silu", "tanh", "sigmoid")


class _Spec:
    """Builds a model.json dict layer by layer."""

    def __init__(self, rng, name, D):
        self.rng, self.D, self.layers = rng, D, []
        self.ud, self.cd = rng.randint(2, 9), rng.randint(2, 7)
        self.us = ["u%d" % i for i in range(rng.randint(1, 3))]
        self.cs = ["c%d" % i for i in range(rng.randint(1, 3))]
        self.tables = {"t_" + f: {"rows": rng.randint(5, 800), "dim": D} for f in self.us + self.cs}
        self.name = name
        self.history = None                         # {"max_len", "actions"} for the sequence families

    def add(self_, **layer):                        # noqa: N805 ("self" is a layer key)
        self_.layers.append(layer)
        return layer["name"]

    def act(self):
        return self.rng.choice(ACTS)

    def embeddings(self, side):
        feats = self.us if side == "user" else self.cs
        return [self.add(name="e_" + f, op="embedding_bag", input="%s.sparse.%s" % (side, f),
                         table="t_" + f, pooling=self.rng.choice(("sum", "mean"))) for f in feats]

    def mlp(self, prefix, x, widths, last_act="none"):
        for i, w in enumerate(widths):
            x = self.add(name="%s%d" % (prefix, i), op="linear", input=x, out=w,
                         activation=self.act() if i + 1 < len(widths) else last_act)
        return x

    def spec(self, logits, tasks):
        return {"format": "ikbo-model/1", "name": self.name,
                "description": "random %s model (tools/reference/random_family.py)" % self.name,
                "inputs": {"user": dict({"dense": self.ud, "sparse": self.us},
                                        **({"history": self.history} if self.history else {})),
                           "candidate": {"dense": self.cd, "sparse": self.cs}},
                "tables": self.tables, "layers": self.layers,
                "output": {"logits": logits, "tasks": ["task%d" % t for t in range(tasks)]}}


def dlrm(rng, name):
    D = rng.choice((4, 8, 16))
    s = _Spec(rng, name, D)
    ue, ce = s.embeddings("user"), s.embeddings("candidate")
    ub = s.mlp("ubot", "user.dense", [rng.randint(8, 32), D], last_act=s.act())
    cb = s.mlp("cbot", "candidate.dense", [rng.randint(8, 32), D], last_act=s.act())
    parts = ue + ce + [ub, cb]
    if rng.random() < 0.7:                           # some multi-token inputs too
        ut = s.add(name="ut_lin", op="linear", input="user.dense", out=2 * D)
        parts.append(s.add(name="ut", op="reshape", input=ut, tokens=2))
    if rng.random() < 0.5:
        parts.append(s.add(name="cstack", op="stack", inputs=ce + [cb]))
    rng.shuffle(parts)
    self_ = rng.random() < 0.5
    dot = s.add(name="dot", op="dot_interaction", inputs=parts, **({"self": True} if self_ else {}))
    uc = s.add(name="uc", op="mul", inputs=[ub, cb] if rng.random() < 0.5 else [cb, ub])
    x = s.add(name="x", op="concat", inputs=[dot, cb, uc])
    tasks = rng.randint(1, 3)
    top = s.mlp("top", x, [rng.randint(8, 48)] * rng.randint(1, 2))
    return s.spec(s.add(name="logits", op="linear", input=top, out=tasks), tasks)


def dcn(rng, name):
    D = rng.choice((4, 8))
    s = _Spec(rng, name, D)
    ue, ce = s.embeddings("user"), s.embeddings("candidate")
    cd_out = rng.randint(3, 12)
    cdl = s.add(name="cd", op="linear", input="candidate.dense", out=cd_out, activation=s.act())
    x_c = s.add(name="x_c", op="concat", inputs=ce + [cdl])
    u = s.add(name="u", op="concat", inputs=ue + ["user.dense"])
    width = len(s.cs) * D + cd_out                   # x_c: the embeddings and cd
    up = s.add(name="u_proj", op="linear", input=u, out=width)
    x0 = s.add(name="x0", op="add", inputs=[x_c, up] if rng.random() < 0.5 else [up, x_c])
    x = x0
    for i in range(rng.randint(2, 3)):
        kw = {"rank": rng.randint(1, 4)} if i % 2 == 1 else {}
        x = s.add(name="cross%d" % i, op="cross", x0=x0, input=x, **kw)
        if rng.random() < 0.6:
            x = s.add(name="ln%d" % i, op="layer_norm", input=x, eps=rng.choice((1e-5, 1e-3)))
    deep = s.mlp("deep", x0, [rng.randint(8, 32), rng.randint(8, 32)], last_act=s.act())
    if rng.random() < 0.5:
        deep = s.add(name="deep_act", op="activation", input=deep, fn=s.act())
    h = s.add(name="h", op="concat", inputs=[x, deep])
    tasks = rng.randint(1, 3)
    return s.spec(s.add(name="logits", op="linear", input=h, out=tasks), tasks)


def mmoe(rng, name):
    D = rng.choice((4, 8, 16))
    s = _Spec(rng, name, D)
    ue, ce = s.embeddings("user"), s.embeddings("candidate")
    ct = s.add(name="ctok", op="stack", inputs=ce + [s.add(name="cdl", op="linear", input="candidate.dense", out=D)])
    mixed = s.add(name="ctl", op="token_linear", input=ct, out_tokens=rng.randint(1, 4))
    pooled = s.add(name="cpool", op="pool", input=mixed, fn=rng.choice(("mean", "sum", "max", "last")))
    uvec = s.add(name="uvec", op="linear", input=s.add(name="ucat", op="concat", inputs=ue + ["user.dense"]),
                 out=D, activation=s.act())
    inter = s.add(name="inter", op="mul", inputs=[uvec, pooled])
    bottom = s.add(name="bottom", op="concat", inputs=[pooled, inter] + ce)
    shared = s.add(name="shared_act", op="activation", input=s.mlp("shared", bottom, [rng.randint(8, 32)]),
                   fn=s.act())
    E, tasks = rng.randint(1, 5), rng.randint(2, 3)
    F = rng.randint(4, 16)
    experts = [s.mlp("exp%d_" % e, shared, [rng.randint(8, 24), F], last_act=s.act()) for e in range(E)]
    logits = []
    for t in range(tasks):
        g = s.add(name="gate%d" % t, op="linear", input=shared, out=E)
        m = s.add(name="mix%d" % t, op="mixture", experts=experts, gate=g)
        logits.append(s.mlp("tower%d_" % t, m, [rng.randint(4, 16), 1]))
    return s.spec(s.add(name="logits", op="concat", inputs=logits), tasks)


def seq(rng, name, kind="softmax"):
    D = rng.choice((8, 16))
    s = _Spec(rng, name, D)
    s.history = {"max_len": rng.randint(4, 24), "actions": rng.randint(1, 4)}
    ue, ce = s.embeddings("user"), s.embeddings("candidate")
    x = s.add(name="hist", op="history_embedding", input="user.history", table="t_" + s.cs[0])
    blocks = []                                      # (layer_norm name = the attention's input, attention)
    for b in range(rng.randint(1, 2)):               # pre-LN transformer blocks over the history
        ln = s.add(name="b%d_ln1" % b, op="layer_norm", input=x)
        kw = {"causal": rng.random() < 0.6}
        if kw["causal"] and rng.random() < 0.5:      # sometimes the defaults (causal, softmax) by omission
            del kw["causal"]
        if kind != "softmax" or rng.random() < 0.5:
            kw["kind"] = kind
        sa = s.add(name="b%d_attn" % b, op="self_attention", input=ln, heads=rng.randint(1, 3),
                   head_dim=rng.choice((4, 8, 16)), **kw)
        blocks.append((ln, sa))
        r = s.add(name="b%d_res1" % b, op="add", inputs=[x, sa])
        ln2 = s.add(name="b%d_ln2" % b, op="layer_norm", input=r)
        f = s.add(name="b%d_ff1" % b, op="linear", input=ln2, out=rng.randint(D, 3 * D),
                  activation=rng.choice(("gelu", "silu")))
        f = s.add(name="b%d_ff2" % b, op="linear", input=f, out=D)
        x = s.add(name="b%d_out" % b, op="add", inputs=[r, f])
    pools = [s.add(name="pool_" + fn, op="pool", input=x, fn=fn)
             for fn in rng.choice((("last",), ("mean",), ("last", "mean")))]
    # Candidate side: a [D] query or 2 tokens projected from the candidate features.
    cdl = s.add(name="cdl", op="linear", input="candidate.dense", out=D, activation=s.act())
    if rng.random() < 0.5:
        q = ce[0]
    else:
        q = s.add(name="ctok", op="reshape", tokens=2,
                  input=s.add(name="cq", op="linear", input=s.add(name="ccat", op="concat", inputs=ce + [cdl]),
                              out=2 * D))
    ln, sa = rng.choice(blocks)
    ta = s.add(name="ta", op="target_attention", query=q, history=ln, shared_with=sa)
    din = s.add(name="din", op="din_attention", query=rng.choice(ce + [cdl]), hidden=rng.randint(2, 16),
                history=rng.choice(["hist", x]), activation=rng.choice(("none",) + ACTS),
                normalize=rng.choice(("softmax", "none")))
    # User vectors meet candidate ones only through mixing ops.
    uvec = s.add(name="uvec", op="linear", input=s.add(name="ucat", op="concat", inputs=pools + ue + ["user.dense"]),
                 out=D, activation=s.act())
    m = s.add(name="u_din", op="mul", inputs=[uvec, din] if rng.random() < 0.5 else [din, uvec])
    a = s.add(name="u_cdl", op="add", inputs=[cdl, pools[0]] if rng.random() < 0.5 else [pools[0], cdl])
    lce = s.add(name="lce", op="lce", user=s.add(name="utok", op="stack", inputs=pools + ue),
                candidate=s.add(name="ctoks", op="stack", inputs=[ta, din] + ce), out_tokens=rng.randint(1, 4))
    dot = s.add(name="dot", op="dot_interaction", inputs=[uvec, ta, cdl] + ue)
    h = s.add(name="h", op="concat", inputs=[m, a, s.add(name="lce_flat", op="flatten", input=lce), dot])
    tasks = rng.randint(1, 3)
    top = s.mlp("top", h, [rng.randint(8, 32)])
    return s.spec(s.add(name="logits", op="linear", input=top, out=tasks), tasks)


def hstu(rng, name):
    return seq(rng, name, kind="silu")


FAMILIES = {"dlrm": dlrm, "dcn": dcn, "mmoe": mmoe, "seq": seq, "hstu": hstu}


def make(family, seed, out, name=None, dtype="F32"):
    """Builds, calibrates and writes one random model; returns the loaded model."""
    name = name or os.path.basename(os.path.dirname(os.path.abspath(out)))
    spec = FAMILIES[family](random.Random(seed), name)
    m = export.IkboModule(spec, seed=seed, dtype=torch.float64)
    _calibrate(m, seed, name, spec)
    return export.save(m, out, dtype=dtype, metadata={"seed": seed, "family": family})


def _calibrate(m, seed, name, spec):
    """random_model.calibrate on the last linear layer(s) feeding the logits."""
    if spec["output"]["logits"] == "logits" and any(l["name"] == "logits" and l["op"] == "linear"
                                                    for l in spec["layers"]):
        random_model.calibrate(m, seed, name)


def main(argv=None):
    ap = argparse.ArgumentParser(description="Write a random ikbo-model/1 model of a ranking architecture.")
    ap.add_argument("--family", choices=sorted(FAMILIES), required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True, help="version directory to write")
    ap.add_argument("--name", default=None)
    ap.add_argument("--dtype", choices=export.DTYPES, default="F32")
    a = ap.parse_args(argv)
    model = make(a.family, a.seed, a.out, a.name, a.dtype)
    print("%s: %s, %d layers, %d weights" % (a.out, a.family, len(model.plan.layers), len(model.plan.param_shapes)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
