#!/usr/bin/python3
"""Reference interpreter of the `ikbo-model/1` format (shared/MODEL_FORMAT.md).

This is the independent check of the C engine's numerics: it is written from
the format document only, evaluates every candidate NAIVELY (each candidate
with its own user's features, the plain broadcast semantics, no dedup, no
user/candidate split) in float64, and validates models strictly.

CLI:
    ikbo_ref.py MODEL_DIR REQUEST.json [--mode ikbo|broadcast]
prints {"scores": [...], "task_scores": [[...], ...]} in request order
(`--mode` is accepted and ignored so this script can stand in for the C
`ikbo-score` binary in tests/golden/golden.py). topK is ignored.

Where MODEL_FORMAT.md leaves room, this file decides as the C engine does
(listed in models/README.md): `add` operands as "a"/"b" or "inputs": [a, b];
a [D] vector is one token for stack, the attention query and lce operands;
head h owns columns [h*dh, (h+1)*dh); dense request values are rounded to
float32 first; a missing activation is "none"; history sent to a model
without history, a sparse feature given twice, unknown fields are invalid.

A model with `"planning": "auto"` (MODEL_FORMAT.md, "Automatic planning") may
mix user and candidate inputs in any op, meaning each user operand is first
copied to its user's candidates. The naive per-candidate evaluation here is
exactly that broadcast form, so such a model differs only in validation: the
mixing rule is lifted; every op keeps its own domain rules (a target_attention
query is a candidate tensor, a history is the user's, lce's operands are
user and candidate). Any other "planning" value is a load error.

Module use:
    model = load_model(dir); out = score_request(model, request_dict)
    analyze(spec) -> Plan   (shape/domain inference; also used by export.py)
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_io  # noqa: E402

FORMAT = "ikbo-model/1"
TOP_KEYS = {"format", "inputs", "tables", "layers", "output", "name", "description", "serving", "planning"}
TOP_REQUIRED = {"format", "inputs", "tables", "layers", "output"}
ACTIVATIONS = ("none", "relu", "sigmoid", "gelu", "silu", "tanh")
POOLINGS = ("sum", "mean")
POOL_FNS = ("mean", "sum", "max", "last")
ATTENTION_KINDS = ("softmax", "silu")
DIN_NORMALIZE = ("softmax", "none")
MAX_DOT_TOKENS = 256
MAX_EXPERTS = 64

# op -> (required keys, optional keys), besides "name" and "op".
LAYER_KEYS = {
    "embedding_bag": ({"input", "table", "pooling"}, set()),
    "history_embedding": ({"input", "table"}, set()),
    "mean_pool": ({"input"}, set()),
    "linear": ({"input", "out"}, {"activation"}),
    "reshape": ({"input", "tokens"}, set()),
    "stack": ({"inputs"}, set()),
    "flatten": ({"input"}, set()),
    # heads/head_dim are required unless "shared_with" names a self_attention
    # layer (then they must be absent); checked in analyze().
    "target_attention": ({"query", "history"}, {"heads", "head_dim", "shared_with"}),
    "lce": ({"user", "candidate", "out_tokens"}, set()),
    # add: operands as "a" and "b" (the op table's wording) or "inputs": [a, b]
    # (like stack); the C engine accepts both forms, so does this file.
    "add": (set(), {"a", "b", "inputs"}),
    # Ops for real ranking architectures (MODEL_FORMAT.md, added 2026-12-01).
    "activation": ({"input", "fn"}, set()),
    "layer_norm": ({"input"}, {"eps"}),
    "concat": ({"inputs"}, set()),
    "mul": (set(), {"a", "b", "inputs"}),
    "token_linear": ({"input", "out_tokens"}, set()),
    "dot_interaction": ({"inputs"}, {"self"}),
    "cross": ({"x0", "input"}, {"rank"}),
    "mixture": ({"experts", "gate"}, set()),
    "pool": ({"input", "fn"}, set()),
    # Sequence ops (issue 15).
    "self_attention": ({"input", "heads", "head_dim"}, {"causal", "kind"}),
    "din_attention": ({"query", "history", "hidden"}, {"activation", "normalize"}),
}
# "planning" values (MODEL_FORMAT.md, "Automatic planning"): with "auto" any op
# may mix domains (broadcast form); absent, only MIXING_OPS may.
PLANNINGS = ("auto",)
# Ops allowed to take inputs from both domains (MODEL_FORMAT.md).
MIXING_OPS = {"target_attention", "lce", "add", "mul", "dot_interaction", "din_attention"}

INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1


class ModelError(ValueError):
    """A model that the format refuses (message names file, layer, problem)."""


class RequestError(ValueError):
    """A request that is invalid input for the model (message names the field)."""


# --------------------------------------------------------------------------
# Shapes. A node is (domain, shape); shape is one of
#   ("vec", F)        a [F] vector
#   ("tok", K, D)     K tokens of width D
#   ("jag", D)        jagged [L_u, D] history sequence
#   ("sparse", name)  a raw sparse input (only embedding_bag reads it)
#   ("history",)      the raw user history (only history_embedding reads it)
# --------------------------------------------------------------------------

def shape_str(s):
    if s[0] == "vec":
        return "[%d]" % s[1]
    if s[0] == "tok":
        return "[%d, %d]" % (s[1], s[2])
    if s[0] == "jag":
        return "jagged [L, %d]" % s[1]
    if s[0] == "sparse":
        return "sparse ids"
    return "history"


class Plan:
    """Result of validating model.json: per-node domain and shape, and the
    exact set of weight tensors (name -> shape) the safetensors file must hold."""

    def __init__(self):
        self.user_dense = 0
        self.user_sparse = []
        self.history = None        # {"max_len", "actions"} or None
        self.cand_dense = 0
        self.cand_sparse = []
        self.tables = {}           # name -> (rows, dim)
        self.layers = []           # the layer dicts, in order
        self.nodes = {}            # reference -> (domain, shape)
        self.param_shapes = {}     # weight name -> tuple shape
        self.logits = None
        self.tasks = []
        self.score_weights = []
        self.planning = None       # "auto" or None (the key absent)


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def add_operands(layer):
    """[a, b] of an add layer, or None when neither or both forms are given."""
    if "inputs" in layer:
        ins = layer["inputs"]
        if "a" in layer or "b" in layer or not isinstance(ins, list) or len(ins) != 2:
            return None
        return ins
    if "a" in layer and "b" in layer:
        return [layer["a"], layer["b"]]
    return None


class _Check:
    """The error helpers of one analyze() call: every message starts with the
    file (or other source) named `where`."""

    def __init__(self, where):
        self.where = where

    def fail(self, msg):
        raise ModelError("%s: %s" % (self.where, msg))

    def pos_int(self, v, what):
        if not _is_int(v) or v <= 0:
            self.fail("%s must be a positive integer, got %r" % (what, v))
        return v

    def keys_ok(self, obj, required, optional, what):
        if not isinstance(obj, dict):
            self.fail("%s must be an object" % what)
        unknown = set(obj) - required - optional
        if unknown:
            self.fail("%s: unknown key(s) %s" % (what, ", ".join(sorted(unknown))))
        missing = required - set(obj)
        if missing:
            self.fail("%s: missing key(s) %s" % (what, ", ".join(sorted(missing))))


class _Layer:
    """One layer being analyzed: its references resolve against the plan's
    nodes so far, and every input read is recorded (with its domain) in
    `srcs` for the domain rule."""

    def __init__(self, ck, p, layer):
        self.ck, self.p, self.layer = ck, p, layer
        self.name, self.op = layer["name"], layer["op"]
        self.lw = "layer %r" % self.name
        self.srcs = []      # (domain, shape) of every input

    def fail(self, msg):
        self.ck.fail("%s: %s" % (self.lw, msg))

    def pos_int(self, key):
        return self.ck.pos_int(self.layer[key], "%s: %s" % (self.lw, key))

    def ref(self, key, value=None):
        """(domain, shape) of the node named by layer[key] (or by value, an
        element of that key's list)."""
        r = self.layer[key] if value is None else value
        if not isinstance(r, str) or r not in self.p.nodes:
            self.fail("%s %r is not an input or an earlier layer" % (key, r))
        node = self.p.nodes[r]
        self.srcs.append(node)
        return node

    def names(self, key):
        """layer[key], a non-empty list of references."""
        names = self.layer[key]
        if not isinstance(names, list) or not names:
            self.fail("%s must be a non-empty list" % key)
        return names

    def table(self, key="table"):
        t = self.layer[key]
        if not isinstance(t, str) or t not in self.p.tables:
            self.fail("unknown table %r" % (t,))
        return t

    def choice(self, key, allowed, default=None, what=None):
        v = self.layer.get(key, default) if default is not None else self.layer[key]
        if v not in allowed:
            self.fail("%s must be one of %s, got %r" % (what or key, ", ".join(allowed), v))
        return v

    def weight(self, suffix, shape):
        self.p.param_shapes["%s.%s" % (self.name, suffix)] = shape

    def tokens_of(self, s, what):
        """(K, D) of a [D] vector (one token) or [K, D] tokens."""
        if s[0] == "vec":
            return 1, s[1]
        if s[0] == "tok":
            return s[1], s[2]
        self.fail("%s must be [D] or [K, D], got %s" % (what, shape_str(s)))

    def attention_weights(self, dim):
        heads, hd = self.pos_int("heads"), self.pos_int("head_dim")
        for w in ("wq", "wk", "wv"):
            self.weight(w, (heads * hd, dim))
        self.weight("wo", (dim, heads * hd))


# ---- shape rules, one per op (SHAPE_RULES below): each takes the _Layer,
# ---- checks the op's keys and inputs, registers its weights and returns the
# ---- output shape.

def _shape_embedding_bag(c):
    _, s = c.ref("input")
    if s[0] != "sparse":
        c.fail("input must be a sparse input (user.sparse.<f> or candidate.sparse.<f>)")
    t = c.table()
    if c.layer["pooling"] not in POOLINGS:
        c.fail("pooling must be sum or mean, got %r" % (c.layer["pooling"],))
    return ("vec", c.p.tables[t][1])


def _shape_history_embedding(c):
    _, s = c.ref("input")
    if s[0] != "history":
        c.fail("input must be user.history")
    dim = c.p.tables[c.table()][1]
    c.weight("action", (c.p.history["actions"], dim))
    c.weight("position", (c.p.history["max_len"], dim))
    return ("jag", dim)


def _shape_mean_pool(c):
    _, s = c.ref("input")
    if s[0] != "jag":
        c.fail("input must be a jagged history sequence, got %s" % shape_str(s))
    return ("vec", s[1])


def _shape_linear(c):
    _, s = c.ref("input")
    if s[0] not in ("vec", "tok", "jag"):
        c.fail("input must be [F], [K, F] or jagged [L, F], got %s" % shape_str(s))
    n = c.pos_int("out")
    c.choice("activation", ACTIVATIONS, default="none")
    c.weight("weight", (n, s[-1]))
    c.weight("bias", (n,))
    return s[:-1] + (n,)


def _shape_reshape(c):
    _, s = c.ref("input")
    if s[0] != "vec":
        c.fail("input must be a [F] vector, got %s" % shape_str(s))
    k = c.pos_int("tokens")
    if s[1] % k:
        c.fail("%d features do not split into %d tokens" % (s[1], k))
    return ("tok", k, s[1] // k)


def _same_width(c, names, tokens):
    """(total tokens, width) of the inputs `names` (layer key "inputs"), each
    read in turn and sized by tokens(name, shape); they must share a width."""
    k, dim = 0, None
    for r in names:
        _, s = c.ref("inputs", r)
        ki, w = tokens(r, s)
        if dim is not None and w != dim:
            c.fail("input %r has width %d, others %d" % (r, w, dim))
        k, dim = k + ki, w
    return k, dim


def _shape_stack(c):
    def tokens(r, s):
        if s[0] not in ("vec", "tok"):
            c.fail("input %r is %s, not [D] or [K, D]" % (r, shape_str(s)))
        return c.tokens_of(s, "input %r" % r)
    k, dim = _same_width(c, c.names("inputs"), tokens)
    return ("tok", k, dim)


def _shape_flatten(c):
    _, s = c.ref("input")
    if s[0] != "tok":
        c.fail("input must be [K, D] tokens, got %s" % shape_str(s))
    return ("vec", s[1] * s[2])


def _shape_target_attention(c):
    dq, sq = c.ref("query")
    dh, sh = c.ref("history")
    if sq[0] == "vec":                      # a [D] query is one token
        sq = ("tok", 1, sq[1])
    if dq != "candidate" or sq[0] != "tok":
        c.fail("query must be candidate [Tq, D] tokens or a [D] vector, got %s %s" % (dq, shape_str(sq)))
    if dh != "user" or sh[0] != "jag":
        c.fail("history must be a user jagged sequence, got %s %s" % (dh, shape_str(sh)))
    if sh[1] != sq[2]:
        c.fail("history width %d differs from query width %d" % (sh[1], sq[2]))
    layer = c.layer
    if "shared_with" in layer:
        sw = layer["shared_with"]
        if "heads" in layer or "head_dim" in layer:
            c.fail("heads and head_dim come from the shared_with layer; remove them")
        sa = next((l for l in c.p.layers if l["name"] == sw), None) if isinstance(sw, str) else None
        if sa is None or sa["op"] != "self_attention":
            c.fail("shared_with %r is not an earlier self_attention layer" % (sw,))
        if layer["history"] != sa["input"]:
            c.fail("history %r must be the input of shared_with layer %r (%r)"
                   % (layer["history"], sw, sa["input"]))
    else:
        missing = {"heads", "head_dim"} - set(layer)
        if missing:
            c.fail("missing key(s) %s" % ", ".join(sorted(missing)))
        c.attention_weights(sq[2])
    return ("tok", sq[1], sq[2])


def _shape_lce(c):
    du, su = c.ref("user")
    dc, sc = c.ref("candidate")
    su = ("tok", 1, su[1]) if su[0] == "vec" else su     # a [D] operand is one token
    sc = ("tok", 1, sc[1]) if sc[0] == "vec" else sc
    if du != "user" or su[0] != "tok":
        c.fail("user must be user [Ku, D] tokens or a [D] vector, got %s %s" % (du, shape_str(su)))
    if dc != "candidate" or sc[0] != "tok":
        c.fail("candidate must be candidate [Kc, D] tokens or a [D] vector, got %s %s" % (dc, shape_str(sc)))
    if su[2] != sc[2]:
        c.fail("user width %d differs from candidate width %d" % (su[2], sc[2]))
    m = c.pos_int("out_tokens")
    c.weight("w_user", (m, su[1]))
    c.weight("w_cand", (m, sc[1]))
    return ("tok", m, su[2])


def _shape_add(c):
    names = add_operands(c.layer)
    if names is None:
        c.fail("%s takes \"a\" and \"b\", or \"inputs\": [a, b] (exactly one form)" % c.op)
    da, sa = c.ref("a", names[0])
    db, sb = c.ref("b", names[1])
    if sa[0] not in ("vec", "tok", "jag") or sa != sb or (sa[0] == "jag" and da != db):
        c.fail("operands must have equal shapes, got %s and %s" % (shape_str(sa), shape_str(sb)))
    return sa


def _shape_elementwise(c):
    """activation and layer_norm: any [F], [K, F] or jagged input, same shape out."""
    _, s = c.ref("input")
    if c.op == "activation":
        c.choice("fn", ACTIVATIONS[1:])
    else:
        eps = c.layer.get("eps", 1e-5)
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not (eps > 0) or not math.isfinite(eps):
            c.fail("eps must be a positive number, got %r" % (eps,))
    if s[0] not in ("vec", "tok", "jag"):
        c.fail("input is %s" % shape_str(s))
    if c.op == "layer_norm":
        c.weight("weight", (s[-1],))
        c.weight("bias", (s[-1],))
    return s


def _shape_concat(c):
    f = 0
    for r in c.names("inputs"):
        _, s = c.ref("inputs", r)
        if s[0] != "vec":
            c.fail("input %r is %s; concat takes [F] vectors" % (r, shape_str(s)))
        f += s[1]
    return ("vec", f)


def _shape_token_linear(c):
    _, s = c.ref("input")
    k, dim = c.tokens_of(s, "input")
    m = c.pos_int("out_tokens")
    c.weight("weight", (m, k))
    return ("tok", m, dim)


def _shape_dot_interaction(c):
    names = c.names("inputs")
    self_ = c.layer.get("self", False)
    if not isinstance(self_, bool):
        c.fail("self must be true or false")
    k, _ = _same_width(c, names, lambda r, s: c.tokens_of(s, "input %r" % r))
    if k > MAX_DOT_TOKENS or k < (1 if self_ else 2):
        c.fail("%d tokens (need 2..%d, or 1 with self)" % (k, MAX_DOT_TOKENS))
    return ("vec", k * (k + 1) // 2 if self_ else k * (k - 1) // 2)


def _shape_cross(c):
    _, s0 = c.ref("x0")
    _, s1 = c.ref("input")
    if s0[0] != "vec" or s0 != s1:
        c.fail("x0 and input must be [F] vectors of one F, got %s and %s" % (shape_str(s0), shape_str(s1)))
    f = s0[1]
    if "rank" in c.layer:
        r = c.pos_int("rank")
        c.weight("u", (f, r))
        c.weight("v", (r, f))
    else:
        c.weight("weight", (f, f))
    c.weight("bias", (f,))
    return s0


def _shape_mixture(c):
    names = c.layer["experts"]
    if not isinstance(names, list) or not 1 <= len(names) <= MAX_EXPERTS:
        c.fail("experts must list 1..%d layers" % MAX_EXPERTS)
    f = None
    for r in names:
        _, s = c.ref("experts", r)
        if s[0] != "vec" or (f is not None and s[1] != f):
            c.fail("expert %r is %s; experts are [F] vectors of one F" % (r, shape_str(s)))
        f = s[1]
    _, sg = c.ref("gate")
    if sg != ("vec", len(names)):
        c.fail("gate must be a [%d] vector, got %s" % (len(names), shape_str(sg)))
    return ("vec", f)


def _shape_pool(c):
    _, s = c.ref("input")
    c.choice("fn", POOL_FNS)
    if s[0] not in ("tok", "jag"):
        c.fail("input must be [K, D] tokens or jagged, got %s" % shape_str(s))
    return ("vec", s[-1])


def _shape_self_attention(c):
    d, s = c.ref("input")
    if d != "user" or s[0] != "jag":
        c.fail("input must be a user jagged sequence, got %s %s" % (d, shape_str(s)))
    c.pos_int("heads")
    c.pos_int("head_dim")
    if not isinstance(c.layer.get("causal", True), bool):
        c.fail("causal must be true or false, got %r" % (c.layer["causal"],))
    c.choice("kind", ATTENTION_KINDS, default="softmax")
    c.attention_weights(s[1])
    return s


def _shape_din_attention(c):
    dq, sq = c.ref("query")
    dh, sh = c.ref("history")
    if dq != "candidate" or sq[0] != "vec":
        c.fail("query must be a candidate [D] vector, got %s %s" % (dq, shape_str(sq)))
    if dh != "user" or sh[0] != "jag":
        c.fail("history must be a user jagged sequence, got %s %s" % (dh, shape_str(sh)))
    if sh[1] != sq[1]:
        c.fail("history width %d differs from query width %d" % (sh[1], sq[1]))
    h1 = c.pos_int("hidden")
    c.choice("activation", ACTIVATIONS, default="relu")
    c.choice("normalize", DIN_NORMALIZE, default="softmax")
    dim = sq[1]
    c.weight("w1", (h1, 4 * dim))
    c.weight("b1", (h1,))
    c.weight("w2", (1, h1))
    c.weight("b2", (1,))
    return sq


# op -> shape rule; one entry per op of LAYER_KEYS (checked below).
SHAPE_RULES = {
    "embedding_bag": _shape_embedding_bag,
    "history_embedding": _shape_history_embedding,
    "mean_pool": _shape_mean_pool,
    "linear": _shape_linear,
    "reshape": _shape_reshape,
    "stack": _shape_stack,
    "flatten": _shape_flatten,
    "target_attention": _shape_target_attention,
    "lce": _shape_lce,
    "add": _shape_add,
    "activation": _shape_elementwise,
    "layer_norm": _shape_elementwise,
    "concat": _shape_concat,
    "mul": _shape_add,
    "token_linear": _shape_token_linear,
    "dot_interaction": _shape_dot_interaction,
    "cross": _shape_cross,
    "mixture": _shape_mixture,
    "pool": _shape_pool,
    "self_attention": _shape_self_attention,
    "din_attention": _shape_din_attention,
}
assert set(SHAPE_RULES) == set(LAYER_KEYS), "SHAPE_RULES and LAYER_KEYS name different ops"


def attention_params(plan, layer):
    """(weight-owning layer name, heads, head_dim) of a target_attention: its
    own, or those of the self_attention layer it is shared_with."""
    if "shared_with" in layer:
        sa = next(l for l in plan.layers if l["name"] == layer["shared_with"])
        return sa["name"], sa["heads"], sa["head_dim"]
    return layer["name"], layer["heads"], layer["head_dim"]


def _analyze_top(ck, p, spec):
    ck.keys_ok(spec, TOP_REQUIRED, TOP_KEYS - TOP_REQUIRED, "top level")
    if spec["format"] != FORMAT:
        ck.fail("format is %r, expected %r" % (spec["format"], FORMAT))
    for k in ("name", "description"):
        if k in spec and not isinstance(spec[k], str):
            ck.fail("%s must be a string" % k)
    if "serving" in spec and not isinstance(spec["serving"], dict):
        ck.fail("serving must be an object")
    if "planning" in spec and spec["planning"] not in PLANNINGS:
        ck.fail("planning must be %s (or absent), got %r" % (" or ".join('"%s"' % v for v in PLANNINGS),
                                                            spec["planning"]))
    p.planning = spec.get("planning")


def _analyze_inputs(ck, p, inputs):
    """inputs: the user's and candidate's dense width, sparse names and
    history; registers the input references as nodes."""
    ck.keys_ok(inputs, set(), {"user", "candidate"}, "inputs")
    u = inputs.get("user", {})
    c = inputs.get("candidate", {})
    ck.keys_ok(u, set(), {"dense", "sparse", "history"}, "inputs.user")
    ck.keys_ok(c, set(), {"dense", "sparse"}, "inputs.candidate")
    for side, obj in (("user", u), ("candidate", c)):
        dense = obj.get("dense", 0)
        if not _is_int(dense) or dense < 0:
            ck.fail("inputs.%s.dense must be a non-negative integer, got %r" % (side, dense))
        sparse = obj.get("sparse", [])
        if not isinstance(sparse, list) or not all(isinstance(s, str) and s for s in sparse):
            ck.fail("inputs.%s.sparse must be a list of non-empty names" % side)
        if len(set(sparse)) != len(sparse):
            ck.fail("inputs.%s.sparse has a duplicate name" % side)
        if side == "user":
            p.user_dense, p.user_sparse = dense, list(sparse)
        else:
            p.cand_dense, p.cand_sparse = dense, list(sparse)
    if "history" in u:
        h = u["history"]
        ck.keys_ok(h, {"max_len", "actions"}, set(), "inputs.user.history")
        p.history = {"max_len": ck.pos_int(h["max_len"], "inputs.user.history.max_len"),
                     # optional, default 1 (models/README.md, Extensions)
                     "actions": ck.pos_int(h.get("actions", 1), "inputs.user.history.actions")}
    if p.user_dense:
        p.nodes["user.dense"] = ("user", ("vec", p.user_dense))
    if p.cand_dense:
        p.nodes["candidate.dense"] = ("candidate", ("vec", p.cand_dense))
    for f in p.user_sparse:
        p.nodes["user.sparse." + f] = ("user", ("sparse", f))
    for f in p.cand_sparse:
        p.nodes["candidate.sparse." + f] = ("candidate", ("sparse", f))
    if p.history:
        p.nodes["user.history"] = ("user", ("history",))


def _analyze_tables(ck, p, tables):
    if not isinstance(tables, dict):
        ck.fail("tables must be an object")
    for name, t in tables.items():
        ck.keys_ok(t, {"rows", "dim"}, set(), "tables.%s" % name)
        p.tables[name] = (ck.pos_int(t["rows"], "tables.%s.rows" % name),
                          ck.pos_int(t["dim"], "tables.%s.dim" % name))
        p.param_shapes["tables." + name] = p.tables[name]


def _analyze_layer(ck, p, i, layer):
    """layers[i]: its name and keys, its op's shape rule, the domain rule;
    adds it to the plan."""
    if not isinstance(layer, dict):
        ck.fail("layers[%d] must be an object" % i)
    name = layer.get("name")
    if not isinstance(name, str) or not name or "." in name:
        ck.fail("layers[%d]: name must be a non-empty string without '.', got %r" % (i, name))
    lw = "layer %r" % name
    if name in p.nodes:
        ck.fail("%s: duplicate name" % lw)
    op = layer.get("op")
    if not isinstance(op, str) or op not in LAYER_KEYS:
        ck.fail("%s: unknown op %r" % (lw, op))
    req, opt = LAYER_KEYS[op]
    ck.keys_ok(layer, req | {"name", "op"}, opt, lw)
    c = _Layer(ck, p, layer)
    out = SHAPE_RULES[op](c)
    domains = {d for d, _ in c.srcs}
    if len(domains) > 1 and op not in MIXING_OPS and p.planning != "auto":
        ck.fail("%s: op %s mixes user and candidate inputs (only %s may, or any op in a model with"
                " \"planning\": \"auto\")" % (lw, op, ", ".join(sorted(MIXING_OPS))))
    p.nodes[name] = ("candidate" if "candidate" in domains else "user", out)
    p.layers.append(layer)


def _analyze_output(ck, p, o):
    ck.keys_ok(o, {"logits", "tasks"}, {"score_weights"}, "output")
    if not isinstance(o["logits"], str) or o["logits"] not in p.nodes or o["logits"].startswith(("user.", "candidate.")):
        ck.fail("output.logits %r is not a layer" % (o["logits"],))
    d, s = p.nodes[o["logits"]]
    if d != "candidate" or s[0] != "vec":
        ck.fail("output.logits %r must be a candidate [T] vector, got %s %s" % (o["logits"], d, shape_str(s)))
    t = s[1]
    tasks = o["tasks"]
    if not isinstance(tasks, list) or len(tasks) != t or not all(isinstance(x, str) and x for x in tasks):
        ck.fail("output.tasks must list %d task names (logits has %d)" % (t, t))
    if len(set(tasks)) != len(tasks):
        ck.fail("output.tasks has a duplicate name")
    sw = o.get("score_weights", [1.0] * t)
    if (not isinstance(sw, list) or len(sw) != t
            or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in sw)):
        ck.fail("output.score_weights must be %d finite numbers" % t)
    p.logits, p.tasks, p.score_weights = o["logits"], list(tasks), [float(x) for x in sw]


def analyze(spec, where="model.json"):
    """Validates a parsed model.json against ikbo-model/1 and infers shapes.

    Raises ModelError("<where>: ...") naming the layer and the problem."""
    ck = _Check(where)
    p = Plan()
    _analyze_top(ck, p, spec)
    _analyze_inputs(ck, p, spec["inputs"])
    _analyze_tables(ck, p, spec["tables"])
    layers = spec["layers"]
    if not isinstance(layers, list) or not layers:
        ck.fail("layers must be a non-empty list")
    for i, layer in enumerate(layers):
        _analyze_layer(ck, p, i, layer)
    _analyze_output(ck, p, spec["output"])
    return p


class Model:
    """A loaded model: its directory, model.json, Plan and float64 weights."""

    def __init__(self, directory, spec, plan, weights, dtypes):
        self.dir = directory
        self.spec = spec
        self.plan = plan
        self.w = weights          # name -> float64 tensor
        self.dtypes = dtypes      # name -> stored dtype (torch)


def load_model(directory):
    """Loads and validates <directory>/model.json + weights.safetensors."""
    mpath = os.path.join(directory, "model.json")
    wpath = os.path.join(directory, "weights.safetensors")
    try:
        with open(mpath) as f:
            spec = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ModelError("%s: %s" % (mpath, e))
    plan = analyze(spec, mpath)
    try:
        raw, _meta = safetensors_io.load(wpath)
    except OSError as e:
        raise ModelError("%s: %s" % (wpath, e))
    except ValueError as e:
        raise ModelError(str(e))
    for name, shape in plan.param_shapes.items():
        if name not in raw:
            raise ModelError("%s: missing tensor %r %s" % (wpath, name, list(shape)))
        if tuple(raw[name].shape) != tuple(shape):
            raise ModelError("%s: tensor %r has shape %s, expected %s"
                             % (wpath, name, list(raw[name].shape), list(shape)))
    extra = sorted(set(raw) - set(plan.param_shapes))
    if extra:
        raise ModelError("%s: unexpected tensor(s) %s" % (wpath, ", ".join(extra)))
    weights = {}
    for name, t in raw.items():
        w = t.to(torch.float64)
        if not torch.isfinite(w).all():
            raise ModelError("%s: tensor %r has non-finite values" % (wpath, name))
        weights[name] = w
    return Model(directory, spec, plan, weights, {n: t.dtype for n, t in raw.items()})


# --------------------------------------------------------------------------
# Requests (proto3 JSON mapping of ikbo.v1.RankRequest)
# --------------------------------------------------------------------------

def _field(obj, camel, snake, default, where):
    """Reads a field by its lowerCamelCase or original name (not both)."""
    if camel in obj and snake != camel and snake in obj:
        raise RequestError("%s: both %s and %s given" % (where, camel, snake))
    v = obj.get(camel, obj.get(snake, default))
    return default if v is None else v


def _known(obj, names, where):
    if not isinstance(obj, dict):
        raise RequestError("%s must be an object" % where)
    unknown = set(obj) - names
    if unknown:
        raise RequestError("%s: unknown field(s) %s" % (where, ", ".join(sorted(unknown))))


def _int(v, where, lo, hi):
    """proto3 JSON integer: a number or a decimal string."""
    if isinstance(v, bool):
        raise RequestError("%s: %r is not an integer" % (where, v))
    if isinstance(v, str):
        try:
            v = int(v.strip(), 10)
        except ValueError:
            raise RequestError("%s: %r is not an integer" % (where, v))
    elif isinstance(v, float):
        if not v.is_integer():
            raise RequestError("%s: %r is not an integer" % (where, v))
        v = int(v)
    elif not isinstance(v, int):
        raise RequestError("%s: %r is not an integer" % (where, v))
    if not lo <= v <= hi:
        raise RequestError("%s: %d out of range" % (where, v))
    return v


def _floats(vs, n, where):
    """Dense features, rounded to float32 first (the wire type is proto float)."""
    if not isinstance(vs, list):
        raise RequestError("%s must be a list" % where)
    if len(vs) != n:
        raise RequestError("%s has %d values, the model expects %d" % (where, len(vs), n))
    out = []
    for i, v in enumerate(vs):
        if isinstance(v, str):
            try:
                v = float(v)
            except ValueError:
                raise RequestError("%s[%d]: %r is not a number" % (where, i, v))
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise RequestError("%s[%d]: %r is not a number" % (where, i, v))
        f = float(np.float32(v))
        if not math.isfinite(f):
            raise RequestError("%s[%d]: %r is not finite" % (where, i, v))
        out.append(f)
    return torch.tensor(out, dtype=torch.float64)


def _sparse(lst, features, where):
    """-> {feature: [int ids]}; absent features are empty bags."""
    if not isinstance(lst, list):
        raise RequestError("%s must be a list" % where)
    bags = {f: [] for f in features}
    seen = set()
    for i, s in enumerate(lst):
        w = "%s[%d]" % (where, i)
        _known(s, {"name", "ids"}, w)
        name = s.get("name") or ""
        if name not in bags:
            raise RequestError("%s.name: unknown feature %r" % (w, name))
        if name in seen:
            raise RequestError("%s.name: feature %r given twice" % (w, name))
        seen.add(name)
        ids = s.get("ids") or []
        if not isinstance(ids, list):
            raise RequestError("%s.ids must be a list" % w)
        bags[name] = [_int(x, "%s.ids[%d]" % (w, j), INT64_MIN, INT64_MAX) for j, x in enumerate(ids)]
    return bags


def parse_request(plan, req):
    """Validates a RankRequest dict -> (users, candidates) in plain Python form."""
    _known(req, {"model", "modelVersion", "model_version", "users", "candidates",
                 "topK", "top_k", "requestId", "request_id"}, "request")
    users_in = _field(req, "users", "users", [], "request")
    cands_in = _field(req, "candidates", "candidates", [], "request")
    if not isinstance(users_in, list) or not isinstance(cands_in, list):
        raise RequestError("request: users and candidates must be lists")
    users = []
    for i, u in enumerate(users_in):
        w = "users[%d]" % i
        _known(u, {"key", "dense", "sparse", "historyIds", "history_ids",
                   "historyActions", "history_actions"}, w)
        dense = _floats(_field(u, "dense", "dense", [], w), plan.user_dense, w + ".dense")
        sparse = _sparse(_field(u, "sparse", "sparse", [], w), plan.user_sparse, w + ".sparse")
        hids = _field(u, "historyIds", "history_ids", [], w)
        hacts = _field(u, "historyActions", "history_actions", [], w)
        if not isinstance(hids, list) or not isinstance(hacts, list):
            raise RequestError("%s: history_ids and history_actions must be lists" % w)
        hids = [_int(x, "%s.history_ids[%d]" % (w, j), INT64_MIN, INT64_MAX) for j, x in enumerate(hids)]
        hacts = [_int(x, "%s.history_actions[%d]" % (w, j), -(1 << 31), (1 << 31) - 1)
                 for j, x in enumerate(hacts)]
        if hacts and len(hacts) != len(hids):
            raise RequestError("%s.history_actions has %d values for %d history_ids" % (w, len(hacts), len(hids)))
        if not hacts:
            hacts = [0] * len(hids)     # missing actions count as action 0
        if (hids or hacts) and not plan.history:
            raise RequestError("%s.history_ids: the model takes no history" % w)
        if plan.history:
            for j, a in enumerate(hacts):
                if not 0 <= a < plan.history["actions"]:
                    raise RequestError("%s.history_actions[%d]: %d not in [0, %d)"
                                       % (w, j, a, plan.history["actions"]))
            keep = plan.history["max_len"]                  # the most recent events (max_len > 0)
            hids, hacts = hids[-keep:], hacts[-keep:]
        users.append({"dense": dense, "sparse": sparse, "hist_ids": hids, "hist_actions": hacts})
    cands = []
    for i, c in enumerate(cands_in):
        w = "candidates[%d]" % i
        _known(c, {"id", "user", "dense", "sparse"}, w)
        cid = _int(_field(c, "id", "id", 0, w), w + ".id", INT64_MIN, INT64_MAX)
        uidx = _int(_field(c, "user", "user", 0, w), w + ".user", 0, (1 << 32) - 1)
        if uidx >= len(users):
            raise RequestError("%s.user: %d out of range (%d users)" % (w, uidx, len(users)))
        dense = _floats(_field(c, "dense", "dense", [], w), plan.cand_dense, w + ".dense")
        sparse = _sparse(_field(c, "sparse", "sparse", [], w), plan.cand_sparse, w + ".sparse")
        cands.append({"id": cid, "user": uidx, "dense": dense, "sparse": sparse})
    return users, cands


# --------------------------------------------------------------------------
# Forward pass: one candidate at a time, float64, plain semantics.
# --------------------------------------------------------------------------

def row_of(i, rows):
    """Embedding row of id i (C's truncating % made non-negative; in Python
    `%` is already floored, the formula is kept verbatim from the spec)."""
    return ((i % rows) + rows) % rows


def _act(x, a):
    if a == "relu":
        return torch.relu(x)
    if a == "sigmoid":
        return torch.sigmoid(x)
    if a == "gelu":                                 # exact, erf form
        return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))
    if a == "silu":
        return x * torch.sigmoid(x)
    if a == "tanh":
        return torch.tanh(x)
    return x


def _tokens(v):
    """A [D] vector as one token, tokens as they are."""
    return v.unsqueeze(0) if v.dim() == 1 else v


def _pool(x, fn):
    if x.shape[0] == 0:
        return torch.zeros(x.shape[1], dtype=torch.float64)
    if fn == "mean":
        return x.mean(dim=0)
    if fn == "sum":
        return x.sum(dim=0)
    if fn == "max":
        return x.max(dim=0).values
    return x[-1]                                    # last


def _ranking_op(layer, get, W):
    """One ranking-architecture op for one candidate (float64), from the spec."""
    op, name = layer["op"], layer["name"]
    if op == "activation":
        return _act(get(layer["input"]), layer["fn"])
    if op == "layer_norm":
        x = get(layer["input"])
        mean = x.mean(dim=-1, keepdim=True)
        var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)      # biased
        return (x - mean) / torch.sqrt(var + layer.get("eps", 1e-5)) * W[name + ".weight"] + W[name + ".bias"]
    if op == "concat":
        return torch.cat([get(r) for r in layer["inputs"]])
    if op == "mul":
        a, b = add_operands(layer)
        return get(a) * get(b)
    if op == "token_linear":
        return W[name + ".weight"] @ _tokens(get(layer["input"]))
    if op == "dot_interaction":
        t = torch.cat([_tokens(get(r)) for r in layer["inputs"]], dim=0)
        k = t.shape[0]
        g = t @ t.T
        lo = 0 if layer.get("self", False) else 1
        return torch.stack([g[i, j] for i in range(k) for j in range(i + lo, k)])
    if op == "cross":
        x0, x = get(layer["x0"]), get(layer["input"])
        w = W[name + ".u"] @ W[name + ".v"] if "rank" in layer else W[name + ".weight"]
        return x0 * (w @ x + W[name + ".bias"]) + x
    if op == "mixture":
        g = torch.softmax(get(layer["gate"]), dim=0)
        y = torch.zeros_like(get(layer["experts"][0]))
        for e, r in enumerate(layer["experts"]):
            y = y + g[e] * get(r)
        return y
    if op == "pool":
        return _pool(get(layer["input"]), layer["fn"])
    if op == "self_attention":
        return _self_attention(get(layer["input"]), W[name + ".wq"], W[name + ".wk"], W[name + ".wv"],
                               W[name + ".wo"], layer["heads"], layer["head_dim"],
                               layer.get("causal", True), layer.get("kind", "softmax"))
    if op == "din_attention":
        q, h = get(layer["query"]), get(layer["history"])
        n = h.shape[0]
        if n == 0:
            return torch.zeros(q.shape[0], dtype=torch.float64)
        qe = q.unsqueeze(0).expand(n, -1)
        x = torch.cat([qe, h, qe - h, qe * h], dim=1)                # [n, 4D]
        z = _act(x @ W[name + ".w1"].T + W[name + ".b1"], layer.get("activation", "relu"))
        s = (z @ W[name + ".w2"].T + W[name + ".b2"]).reshape(n)     # one score per event
        a = torch.softmax(s, dim=0) if layer.get("normalize", "softmax") == "softmax" else s
        return a @ h
    raise AssertionError(op)


def _self_attention(h, wq, wk, wv, wo, heads, dh, causal, kind):
    """One user's self-attention over its n kept events: [n, D] -> [n, D]."""
    n, dim = h.shape
    if n == 0:
        return torch.zeros((0, dim), dtype=torch.float64)
    # Head j owns columns [j*dh, (j+1)*dh) of Q, K, V and of concat(O).
    Q = (h @ wq.T).reshape(n, heads, dh).transpose(0, 1)
    K = (h @ wk.T).reshape(n, heads, dh).transpose(0, 1)
    V = (h @ wv.T).reshape(n, heads, dh).transpose(0, 1)
    S = Q @ K.transpose(1, 2) / math.sqrt(dh)                       # [H, n, n]
    keep = torch.ones((n, n), dtype=torch.bool)
    if causal:
        keep = torch.tril(keep)                                     # key j <= query i
    if kind == "softmax":
        A = torch.softmax(S.masked_fill(~keep, float("-inf")), dim=-1)
    else:                                                           # silu (HSTU): / n, not / (i + 1)
        A = torch.where(keep, S * torch.sigmoid(S), torch.zeros_like(S)) / n
    O = (A @ V).transpose(0, 1).reshape(n, heads * dh)
    return O @ wo.T


def forward_one(model, user, cand):
    """Logits [T] (float64) for one candidate with its user's features."""
    p, W = model.plan, model.w
    env = {}

    def get(r):
        if r in env:
            return env[r]
        side, rest = r.split(".", 1)
        src = user if side == "user" else cand
        if rest == "dense":
            return src["dense"]
        if rest == "history":
            return src["hist_ids"], src["hist_actions"]
        return src["sparse"][rest[len("sparse."):]]

    for layer in p.layers:
        op, name = layer["op"], layer["name"]
        if op == "embedding_bag":
            ids = get(layer["input"])
            table = W["tables." + layer["table"]]
            rows, dim = table.shape
            y = torch.zeros(dim, dtype=torch.float64)
            for i in ids:
                y = y + table[row_of(i, rows)]
            if layer["pooling"] == "mean" and ids:
                y = y / len(ids)
        elif op == "history_embedding":
            ids, acts = get(layer["input"])        # already the most recent max_len
            table = W["tables." + layer["table"]]
            rows, dim = table.shape
            act_t, pos_t = W[name + ".action"], W[name + ".position"]
            y = torch.zeros((len(ids), dim), dtype=torch.float64)
            for t, (i, a) in enumerate(zip(ids, acts)):
                y[t] = table[row_of(i, rows)] + act_t[a] + pos_t[t]
        elif op == "mean_pool":
            x = get(layer["input"])
            y = x.mean(dim=0) if x.shape[0] > 0 else torch.zeros(x.shape[1], dtype=torch.float64)
        elif op == "linear":                           # last dim of [F], [K, F] or [L, F]
            x = get(layer["input"])
            y = _act(x @ W[name + ".weight"].T + W[name + ".bias"], layer.get("activation", "none"))
        elif op == "reshape":
            y = get(layer["input"]).reshape(layer["tokens"], -1)
        elif op == "stack":
            parts = [get(r) for r in layer["inputs"]]
            y = torch.cat([v.unsqueeze(0) if v.dim() == 1 else v for v in parts], dim=0)
        elif op == "flatten":
            y = get(layer["input"]).reshape(-1)
        elif op == "target_attention":
            q, h = get(layer["query"]), get(layer["history"])
            q = q.unsqueeze(0) if q.dim() == 1 else q           # a [D] query is one token
            wn, heads, dh = attention_params(p, layer)   # own weights or the shared_with layer's
            tq, dim = q.shape
            if h.shape[0] == 0:
                y = torch.zeros((tq, dim), dtype=torch.float64)
            else:
                # Head j owns columns [j*dh, (j+1)*dh) of Q, K, V and of concat(O).
                # Softmax, no mask, whatever the shared layer's kind and causal.
                Q = (q @ W[wn + ".wq"].T).reshape(tq, heads, dh).transpose(0, 1)
                K = (h @ W[wn + ".wk"].T).reshape(-1, heads, dh).transpose(0, 1)
                V = (h @ W[wn + ".wv"].T).reshape(-1, heads, dh).transpose(0, 1)
                A = torch.softmax(Q @ K.transpose(1, 2) / math.sqrt(dh), dim=-1)
                O = (A @ V).transpose(0, 1).reshape(tq, heads * dh)
                y = O @ W[wn + ".wo"].T
        elif op == "lce":
            eu, ec = get(layer["user"]), get(layer["candidate"])
            eu = eu.unsqueeze(0) if eu.dim() == 1 else eu       # a [D] operand is one token
            ec = ec.unsqueeze(0) if ec.dim() == 1 else ec
            y = W[name + ".w_user"] @ eu + W[name + ".w_cand"] @ ec
        elif op == "add":
            a, b = add_operands(layer)
            y = get(a) + get(b)
        else:  # the ranking-architecture ops; analyze() refuses unknown ones
            y = _ranking_op(layer, get, W)
        env[name] = y
    return env[p.logits]


def score_request(model, request):
    """RankRequest dict -> {"scores": [float], "task_scores": [[float]]} in
    request order (topK ignored)."""
    users, cands = parse_request(model.plan, request)
    sw = torch.tensor(model.plan.score_weights, dtype=torch.float64)
    scores, task_scores = [], []
    for c in cands:
        logits = forward_one(model, users[c["user"]], c)
        probs = torch.sigmoid(logits)
        scores.append(float((sw * probs).sum()))
        task_scores.append([float(x) for x in probs])
    return {"scores": scores, "task_scores": task_scores}


def main(argv=None):
    ap = argparse.ArgumentParser(description="Score a RankRequest JSON with the ikbo-model/1 reference interpreter.")
    ap.add_argument("model_dir", help="model version directory holding model.json and weights.safetensors")
    ap.add_argument("request", help="RankRequest as proto3 JSON ('-' for stdin)")
    ap.add_argument("--mode", default="ikbo", help="ignored (lets this script stand in for ikbo-score)")
    args = ap.parse_args(argv)
    try:
        model = load_model(args.model_dir)
        if args.request == "-":
            req = json.load(sys.stdin)
        else:
            with open(args.request) as f:
                req = json.load(f)
        out = score_request(model, req)
    except (ModelError, RequestError, OSError, json.JSONDecodeError) as e:
        print("ikbo_ref: %s" % e, file=sys.stderr)
        return 2
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
