#!/usr/bin/python3
"""Random valid `"planning": "auto"` (broadcast-form) models, for the golden
test of the engine's automatic IKBO planner (tests/golden/golden_auto.py).

    random_auto.py --seed S OUT_DIR [--name NAME] [--dtype F32]

A broadcast-form model may feed a user tensor to any op (MODEL_FORMAT.md,
"Automatic planning"); the engine must compute that function, rewriting what
can be rewritten and gathering the rest. Each model is a random selection (in
random order, random widths, activations and operand orders) of these blocks,
all reading the same user and candidate vectors and tokens, whose candidate
outputs meet in one final mixed concat -> top MLP -> logits:

  rewritable (MODEL_FORMAT.md's rewrites 1-4):
    user_only     a user-only subgraph (concat, linear, layer_norm, activation)
    stack_tl      mixed stack, tokens interleaved user/candidate/user... -> token_linear
    concat_lin    mixed concat, parts interleaved -> linear (with or without activation)
    stack_dot     mixed stack -> dot_interaction (self true or false), and mixed inputs direct
    add_mul       add / mul of a user and a candidate operand, vectors and tokens
    attention     target_attention / din_attention over the user history (history models)
  not rewritable (rewrite 5: an explicit gather):
    cross_user    cross with a user x0, or a user input
    mixture_user  mixture with user experts, or a user gate
    norm_mixed    layer_norm / activation of a mixed concat
    stack_two     one mixed stack consumed by flatten and by token_linear
    concat_two    one mixed concat consumed by two linears

`make(seed, out)` returns (loaded model, list of the blocks used); BLOCKS lists
them all. Weights are F32 (the IkboModule's default init from the seed,
embeddings scaled to std 1), the logits layer calibrated as random_model.py
does; the top MLP ends in none or tanh, so the logits are not a large constant
plus a small varying part (an fp32 engine's relative error stays ~1e-6).
"""
import argparse
import os
import random
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export  # noqa: E402
import random_family  # noqa: E402
import random_model  # noqa: E402

REWRITABLE = ("user_only", "stack_tl", "concat_lin", "stack_dot", "add_mul", "attention")
GATHERED = ("cross_user", "mixture_user", "norm_mixed", "stack_two", "concat_two")
BLOCKS = REWRITABLE + GATHERED


class _Ctx:
    """The model under construction: a random_family._Spec plus the user and
    candidate operands every block draws from, and the outputs collected."""

    def __init__(self, rng, name):
        self.rng = rng
        self.s = random_family._Spec(rng, name, rng.choice((4, 8, 12, 16)))
        self.D = self.s.D
        if rng.random() < 0.75:
            self.s.history = {"max_len": rng.randint(3, 20), "actions": rng.randint(1, 4)}
        self.outs = []                               # [F] vectors (either domain) for the final concat

    def add(self_, **layer):                        # noqa: N805 ("self" is a layer key)
        return self_.s.add(**layer)

    def operands(self):
        """User and candidate [D] vectors and [K, D] tokens (built once)."""
        s, D, rng = self.s, self.D, self.rng
        self.uv = s.embeddings("user") + [s.mlp("ubot", "user.dense", [rng.randint(D, 3 * D), D], s.act())]
        self.cv = s.embeddings("candidate") + [s.mlp("cbot", "candidate.dense", [D], s.act())]
        self.ut = [self.tokens("ut", "user.dense", rng.randint(1, 3))]
        self.ct = [self.tokens("ct", "candidate.dense", rng.randint(1, 3))]
        self.hist = None
        if s.history:
            self.hist = self.add(name="hist", op="history_embedding", input="user.history", table="t_" + s.cs[0])
            self.uv.append(self.add(name="hist_mean", op="pool", input=self.hist,
                                    fn=rng.choice(("mean", "last", "max", "sum"))))

    def tokens(self, name, src, k):
        lin = self.add(name=name + "_lin", op="linear", input=src, out=k * self.D, activation=self.s.act())
        return self.add(name=name, op="reshape", input=lin, tokens=k)

    def interleave(self, users, cands, n):
        """n operands alternating user/candidate (random start), drawn from the lists."""
        first = self.rng.random() < 0.5
        return [self.rng.choice(users if (i % 2 == 0) == first else cands) for i in range(n)]

    def uniq(self, names):
        return list(dict.fromkeys(names))


def _user_only(c, p):
    s = c.s
    u = c.add(name=p + "cat", op="concat", inputs=c.uniq(c.uv + ["user.dense"]))
    h = c.add(name=p + "lin", op="linear", input=u, out=c.D, activation=s.act())
    h = c.add(name=p + "ln", op="layer_norm", input=h)
    if c.rng.random() < 0.5:
        h = c.add(name=p + "act", op="activation", input=h, fn=s.act())
    c.uv.append(h)                                   # later blocks may read it
    c.outs.append(h)


def _stack_tl(c, p):
    parts = c.interleave(c.uv + c.ut, c.cv + c.ct, c.rng.randint(3, 5))
    st = c.add(name=p + "st", op="stack", inputs=parts)
    z = c.add(name=p + "tl", op="token_linear", input=st, out_tokens=c.rng.randint(1, 4))
    if c.rng.random() < 0.5:                         # linear over the tokens
        z = c.add(name=p + "tok", op="linear", input=z, out=c.D, activation=c.s.act())
    c.outs.append(c.add(name=p + "fl", op="flatten", input=z))


def _concat_lin(c, p):
    parts = c.uniq(c.interleave(c.uv + ["user.dense"], c.cv + ["candidate.dense"], c.rng.randint(2, 5)))
    cc = c.add(name=p + "cc", op="concat", inputs=parts)
    act = c.rng.choice(("none", "relu", "gelu", "silu", "tanh", "sigmoid"))
    c.outs.append(c.add(name=p + "lin", op="linear", input=cc, out=c.rng.randint(3, 16), activation=act))


def _stack_dot(c, p):
    st = c.add(name=p + "st", op="stack", inputs=c.interleave(c.uv + c.ut, c.cv + c.ct, c.rng.randint(2, 4)))
    kw = {"self": True} if c.rng.random() < 0.5 else {}
    c.outs.append(c.add(name=p + "dot", op="dot_interaction", inputs=[st], **kw))
    kw = {"self": True} if c.rng.random() < 0.5 else {}
    direct = c.interleave(c.uv + c.ut, c.cv + c.ct, c.rng.randint(2, 4))
    c.outs.append(c.add(name=p + "dot2", op="dot_interaction", inputs=direct, **kw))


def _add_mul(c, p):
    rng = c.rng
    for op in ("add", "mul"):
        pair = [rng.choice(c.uv), rng.choice(c.cv)]
        rng.shuffle(pair)
        c.outs.append(c.add(name="%s%s" % (p, op), op=op, inputs=pair))
    k = rng.randint(1, 3)                            # tokens: user [k, D] with candidate [k, D]
    u2 = c.tokens(p + "uk", "user.dense", k)
    c2 = c.tokens(p + "ck", "candidate.dense", k)
    op = rng.choice(("add", "mul"))
    t = c.add(name=p + "tok", op=op, **({"a": u2, "b": c2} if rng.random() < 0.5 else {"a": c2, "b": u2}))
    c.outs.append(c.add(name=p + "tokf", op="flatten", input=t))


def _attention(c, p):
    if c.hist is None:
        return False
    rng, s = c.rng, c.s
    h = c.hist
    if rng.random() < 0.5:                           # a user-side transform of the history first
        h = c.add(name=p + "hln", op="layer_norm", input=h)
    if rng.random() < 0.5:
        sa = c.add(name=p + "sa", op="self_attention", input=h, heads=rng.randint(1, 2),
                   head_dim=rng.choice((4, 8)), causal=rng.random() < 0.5)
        c.uv.append(c.add(name=p + "sap", op="pool", input=sa, fn=rng.choice(("last", "mean"))))
    q = rng.choice(c.cv + c.ct)
    if rng.random() < 0.4:                           # a mixed stack as the query
        q = c.add(name=p + "qs", op="stack", inputs=c.interleave(c.uv, c.cv, 2))
    ta = c.add(name=p + "ta", op="target_attention", query=q, history=h, heads=rng.randint(1, 3),
               head_dim=rng.choice((4, 8)))
    c.outs.append(c.add(name=p + "taf", op="flatten", input=ta))
    dq = rng.choice(c.cv)
    if rng.random() < 0.4:                           # a mixed query: user * candidate
        dq = c.add(name=p + "dq", op="mul", inputs=[rng.choice(c.uv), dq])
    c.outs.append(c.add(name=p + "din", op="din_attention", query=dq, history=h, hidden=rng.randint(2, 12),
                        activation=s.act(), normalize=rng.choice(("softmax", "none"))))
    return True


def _cross_user(c, p):
    rng = c.rng
    u, v = rng.choice(c.uv), rng.choice(c.cv)
    x0, x = (u, v) if rng.random() < 0.6 else (v, u)
    kw = {"rank": rng.randint(1, 3)} if rng.random() < 0.5 else {}
    y = c.add(name=p + "x1", op="cross", x0=x0, input=x, **kw)
    y = c.add(name=p + "x2", op="cross", x0=u, input=y)  # a user x0 again, candidate input
    c.outs.append(y)


def _mixture_user(c, p):
    rng = c.rng
    n = rng.randint(2, 4)
    experts = c.interleave(c.uv, c.cv, n)
    gsrc = rng.choice(c.cv + ["candidate.dense"])
    gate = c.add(name=p + "g1", op="linear", input=gsrc, out=n)
    c.outs.append(c.add(name=p + "m1", op="mixture", experts=experts, gate=gate))
    cands = c.uniq([rng.choice(c.cv) for _ in range(rng.randint(1, 3))])
    ugate = c.add(name=p + "g2", op="linear", input=rng.choice(c.uv + ["user.dense"]), out=len(cands))
    c.outs.append(c.add(name=p + "m2", op="mixture", experts=cands, gate=ugate))


def _norm_mixed(c, p):
    cc = c.add(name=p + "cc", op="concat", inputs=c.uniq(c.interleave(c.uv, c.cv, c.rng.randint(2, 4))))
    c.outs.append(c.add(name=p + "ln", op="layer_norm", input=cc, eps=c.rng.choice((1e-5, 1e-3))))
    c.outs.append(c.add(name=p + "act", op="activation", input=cc, fn=c.s.act()))


def _stack_two(c, p):
    st = c.add(name=p + "st", op="stack", inputs=c.interleave(c.uv + c.ut, c.cv + c.ct, c.rng.randint(2, 4)))
    c.outs.append(c.add(name=p + "fl", op="flatten", input=st))
    tl = c.add(name=p + "tl", op="token_linear", input=st, out_tokens=c.rng.randint(1, 3))
    c.outs.append(c.add(name=p + "tlf", op="flatten", input=tl))


def _concat_two(c, p):
    cc = c.add(name=p + "cc", op="concat",
               inputs=c.uniq(c.interleave(c.uv + ["user.dense"], c.cv + ["candidate.dense"], c.rng.randint(2, 4))))
    for i in range(2):
        c.outs.append(c.add(name="%sl%d" % (p, i), op="linear", input=cc, out=c.rng.randint(2, 10),
                            activation=c.s.act()))


BUILDERS = {"user_only": _user_only, "stack_tl": _stack_tl, "concat_lin": _concat_lin, "stack_dot": _stack_dot,
            "add_mul": _add_mul, "attention": _attention, "cross_user": _cross_user,
            "mixture_user": _mixture_user, "norm_mixed": _norm_mixed, "stack_two": _stack_two,
            "concat_two": _concat_two}


def build_spec(seed, name):
    """-> (model.json dict, the blocks used in order) for a seed."""
    rng = random.Random(seed)
    c = _Ctx(rng, name)
    c.operands()
    blocks = [b for b in BLOCKS if rng.random() < 0.7]
    rng.shuffle(blocks)
    if "user_only" in blocks:                        # first, so later blocks may read its output
        blocks.remove("user_only")
        blocks.insert(0, "user_only")
    used = []
    for i, b in enumerate(blocks):
        if BUILDERS[b](c, "b%d_" % i) is not False:
            used.append(b)
    # The final mixed concat: every block's output plus a user vector, in random order.
    outs = c.uniq(c.outs + [rng.choice(c.uv)])
    rng.shuffle(outs)
    x = c.add(name="final", op="concat", inputs=outs)
    top = c.s.mlp("top", x, [rng.randint(8, 32)] * rng.randint(1, 2), last_act=rng.choice(("none", "tanh")))
    tasks = rng.randint(1, 3)
    spec = c.s.spec(c.add(name="logits", op="linear", input=top, out=tasks), tasks)
    spec["planning"] = "auto"
    spec["description"] = "random broadcast-form model (tools/reference/random_auto.py --seed %d): %s" % (
        seed, ", ".join(used))
    if rng.random() < 0.6:
        spec["output"]["score_weights"] = [round(rng.uniform(0.25, 1.5), 3) for _ in range(tasks)]
    return spec, used


def make(seed, out, name=None, dtype="F32"):
    """Builds, calibrates and writes one model; returns (loaded model, blocks used)."""
    name = name or os.path.basename(os.path.dirname(os.path.abspath(out)))
    spec, used = build_spec(seed, name)
    m = export.IkboModule(spec, seed=seed, dtype=torch.float64)
    with torch.no_grad():                            # embeddings O(1) (std 1, as random_model.py's),
        for n in m.plan.param_shapes:                # not the default 0.05: varied logits, little cancellation
            if n.startswith("tables.") or n.endswith((".action", ".position")):
                m.param(n).mul_(20.0)
    random_model.calibrate(m, seed, name)
    return export.save(m, out, dtype=dtype, metadata={"seed": seed, "generator": "random_auto"}), used


def main(argv=None):
    ap = argparse.ArgumentParser(description="Write a random broadcast-form (\"planning\": \"auto\") model.")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("out", help="version directory to write, e.g. /tmp/m/auto/1")
    ap.add_argument("--name", default=None, help="model name (default: the parent directory's name)")
    ap.add_argument("--dtype", choices=export.DTYPES, default="F32")
    a = ap.parse_args(argv)
    model, used = make(a.seed, a.out, a.name, a.dtype)
    print("%s: %d layers, %d weights, D=%d, blocks %s" % (
        a.out, len(model.plan.layers), len(model.plan.param_shapes),
        next(iter(model.plan.tables.values()))[1], ", ".join(used)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
