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


def _analyze_ranking_op(p, layer, lw, ref, srcs, fail, pos_int):
    """Shape of one of the ranking-architecture ops (MODEL_FORMAT.md, "Ops for
    real ranking architectures"); registers its weights in p.param_shapes."""
    op, name = layer["op"], layer["name"]

    def tokens_of(s, what):
        if s[0] == "vec":
            return 1, s[1]
        if s[0] == "tok":
            return s[1], s[2]
        fail("%s: %s must be [D] or [K, D], got %s" % (lw, what, shape_str(s)))

    if op == "activation":
        d, s = ref("input")
        srcs.append((d, s))
        if layer["fn"] not in ACTIVATIONS[1:]:
            fail("%s: fn must be one of %s, got %r" % (lw, ", ".join(ACTIVATIONS[1:]), layer["fn"]))
        if s[0] not in ("vec", "tok", "jag"):
            fail("%s: input is %s" % (lw, shape_str(s)))
        return s
    if op == "layer_norm":
        d, s = ref("input")
        srcs.append((d, s))
        eps = layer.get("eps", 1e-5)
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not (eps > 0) or not math.isfinite(eps):
            fail("%s: eps must be a positive number, got %r" % (lw, eps))
        if s[0] not in ("vec", "tok", "jag"):
            fail("%s: input is %s" % (lw, shape_str(s)))
        p.param_shapes[name + ".weight"] = (s[-1],)
        p.param_shapes[name + ".bias"] = (s[-1],)
        return s
    if op == "concat":
        names = layer["inputs"]
        if not isinstance(names, list) or not names:
            fail("%s: inputs must be a non-empty list" % lw)
        f = 0
        for r in names:
            d, s = ref("inputs", r)
            srcs.append((d, s))
            if s[0] != "vec":
                fail("%s: input %r is %s; concat takes [F] vectors" % (lw, r, shape_str(s)))
            f += s[1]
        return ("vec", f)
    if op == "token_linear":
        d, s = ref("input")
        srcs.append((d, s))
        k, dim = tokens_of(s, "input")
        m = pos_int(layer["out_tokens"], "%s: out_tokens" % lw)
        p.param_shapes[name + ".weight"] = (m, k)
        return ("tok", m, dim)
    if op == "dot_interaction":
        names = layer["inputs"]
        if not isinstance(names, list) or not names:
            fail("%s: inputs must be a non-empty list" % lw)
        self_ = layer.get("self", False)
        if not isinstance(self_, bool):
            fail("%s: self must be true or false" % lw)
        k, dim = 0, None
        for r in names:
            d, s = ref("inputs", r)
            srcs.append((d, s))
            ki, w = tokens_of(s, "input %r" % r)
            if dim is not None and w != dim:
                fail("%s: input %r has width %d, others %d" % (lw, r, w, dim))
            k, dim = k + ki, w
        if k > MAX_DOT_TOKENS or k < (1 if self_ else 2):
            fail("%s: %d tokens (need 2..%d, or 1 with self)" % (lw, k, MAX_DOT_TOKENS))
        return ("vec", k * (k + 1) // 2 if self_ else k * (k - 1) // 2)
    if op == "cross":
        d0, s0 = ref("x0")
        d1, s1 = ref("input")
        srcs += [(d0, s0), (d1, s1)]
        if s0[0] != "vec" or s0 != s1:
            fail("%s: x0 and input must be [F] vectors of one F, got %s and %s" % (lw, shape_str(s0), shape_str(s1)))
        f = s0[1]
        if "rank" in layer:
            r = pos_int(layer["rank"], "%s: rank" % lw)
            p.param_shapes[name + ".u"] = (f, r)
            p.param_shapes[name + ".v"] = (r, f)
        else:
            p.param_shapes[name + ".weight"] = (f, f)
        p.param_shapes[name + ".bias"] = (f,)
        return s0
    if op == "mixture":
        names = layer["experts"]
        if not isinstance(names, list) or not 1 <= len(names) <= MAX_EXPERTS:
            fail("%s: experts must list 1..%d layers" % (lw, MAX_EXPERTS))
        f = None
        for r in names:
            d, s = ref("experts", r)
            srcs.append((d, s))
            if s[0] != "vec" or (f is not None and s[1] != f):
                fail("%s: expert %r is %s; experts are [F] vectors of one F" % (lw, r, shape_str(s)))
            f = s[1]
        dg, sg = ref("gate")
        srcs.append((dg, sg))
        if sg != ("vec", len(names)):
            fail("%s: gate must be a [%d] vector, got %s" % (lw, len(names), shape_str(sg)))
        return ("vec", f)
    if op == "pool":
        d, s = ref("input")
        srcs.append((d, s))
        if layer["fn"] not in POOL_FNS:
            fail("%s: fn must be one of %s, got %r" % (lw, ", ".join(POOL_FNS), layer["fn"]))
        if s[0] not in ("tok", "jag"):
            fail("%s: input must be [K, D] tokens or jagged, got %s" % (lw, shape_str(s)))
        return ("vec", s[-1])
    if op == "self_attention":
        d, s = ref("input")
        srcs.append((d, s))
        if d != "user" or s[0] != "jag":
            fail("%s: input must be a user jagged sequence, got %s %s" % (lw, d, shape_str(s)))
        heads = pos_int(layer["heads"], "%s: heads" % lw)
        hd = pos_int(layer["head_dim"], "%s: head_dim" % lw)
        if not isinstance(layer.get("causal", True), bool):
            fail("%s: causal must be true or false, got %r" % (lw, layer["causal"]))
        if layer.get("kind", "softmax") not in ATTENTION_KINDS:
            fail("%s: kind must be one of %s, got %r" % (lw, ", ".join(ATTENTION_KINDS), layer["kind"]))
        dim = s[1]
        for w in ("wq", "wk", "wv"):
            p.param_shapes["%s.%s" % (name, w)] = (heads * hd, dim)
        p.param_shapes[name + ".wo"] = (dim, heads * hd)
        return s
    if op == "din_attention":
        dq, sq = ref("query")
        dh_, sh = ref("history")
        srcs += [(dq, sq), (dh_, sh)]
        if dq != "candidate" or sq[0] != "vec":
            fail("%s: query must be a candidate [D] vector, got %s %s" % (lw, dq, shape_str(sq)))
        if dh_ != "user" or sh[0] != "jag":
            fail("%s: history must be a user jagged sequence, got %s %s" % (lw, dh_, shape_str(sh)))
        if sh[1] != sq[1]:
            fail("%s: history width %d differs from query width %d" % (lw, sh[1], sq[1]))
        h1 = pos_int(layer["hidden"], "%s: hidden" % lw)
        if layer.get("activation", "relu") not in ACTIVATIONS:
            fail("%s: activation must be one of %s, got %r" % (lw, ", ".join(ACTIVATIONS), layer["activation"]))
        if layer.get("normalize", "softmax") not in DIN_NORMALIZE:
            fail("%s: normalize must be one of %s, got %r" % (lw, ", ".join(DIN_NORMALIZE), layer["normalize"]))
        dim = sq[1]
        p.param_shapes[name + ".w1"] = (h1, 4 * dim)
        p.param_shapes[name + ".b1"] = (h1,)
        p.param_shapes[name + ".w2"] = (1, h1)
        p.param_shapes[name + ".b2"] = (1,)
        return sq
    raise AssertionError(op)


def attention_params(plan, layer):
    """(weight-owning layer name, heads, head_dim) of a target_attention: its
    own, or those of the self_attention layer it is shared_with."""
    if "shared_with" in layer:
        sa = next(l for l in plan.layers if l["name"] == layer["shared_with"])
        return sa["name"], sa["heads"], sa["head_dim"]
    return layer["name"], layer["heads"], layer["head_dim"]


def analyze(spec, where="model.json"):
    """Validates a parsed model.json against ikbo-model/1 and infers shapes.

    Raises ModelError("<where>: ...") naming the layer and the problem."""
    def fail(msg):
        raise ModelError("%s: %s" % (where, msg))

    def pos_int(v, what):
        if not _is_int(v) or v <= 0:
            fail("%s must be a positive integer, got %r" % (what, v))
        return v

    def keys_ok(obj, required, optional, what):
        if not isinstance(obj, dict):
            fail("%s must be an object" % what)
        unknown = set(obj) - required - optional
        if unknown:
            fail("%s: unknown key(s) %s" % (what, ", ".join(sorted(unknown))))
        missing = required - set(obj)
        if missing:
            fail("%s: missing key(s) %s" % (what, ", ".join(sorted(missing))))

    p = Plan()
    keys_ok(spec, TOP_REQUIRED, TOP_KEYS - TOP_REQUIRED, "top level")
    if spec["format"] != FORMAT:
        fail("format is %r, expected %r" % (spec["format"], FORMAT))
    for k in ("name", "description"):
        if k in spec and not isinstance(spec[k], str):
            fail("%s must be a string" % k)
    if "serving" in spec and not isinstance(spec["serving"], dict):
        fail("serving must be an object")
    if "planning" in spec and spec["planning"] not in PLANNINGS:
        fail("planning must be %s (or absent), got %r" % (" or ".join('"%s"' % v for v in PLANNINGS),
                                                         spec["planning"]))
    p.planning = spec.get("planning")

    # ---- inputs
    inputs = spec["inputs"]
    keys_ok(inputs, set(), {"user", "candidate"}, "inputs")
    u = inputs.get("user", {})
    c = inputs.get("candidate", {})
    keys_ok(u, set(), {"dense", "sparse", "history"}, "inputs.user")
    keys_ok(c, set(), {"dense", "sparse"}, "inputs.candidate")
    for side, obj in (("user", u), ("candidate", c)):
        dense = obj.get("dense", 0)
        if not _is_int(dense) or dense < 0:
            fail("inputs.%s.dense must be a non-negative integer, got %r" % (side, dense))
        sparse = obj.get("sparse", [])
        if not isinstance(sparse, list) or not all(isinstance(s, str) and s for s in sparse):
            fail("inputs.%s.sparse must be a list of non-empty names" % side)
        if len(set(sparse)) != len(sparse):
            fail("inputs.%s.sparse has a duplicate name" % side)
        if side == "user":
            p.user_dense, p.user_sparse = dense, list(sparse)
        else:
            p.cand_dense, p.cand_sparse = dense, list(sparse)
    if "history" in u:
        h = u["history"]
        keys_ok(h, {"max_len", "actions"}, set(), "inputs.user.history")
        p.history = {"max_len": pos_int(h["max_len"], "inputs.user.history.max_len"),
                     # optional, default 1 (models/README.md, Extensions)
                     "actions": pos_int(h.get("actions", 1), "inputs.user.history.actions")}

    # Input references and their shapes.
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

    # ---- tables
    tables = spec["tables"]
    if not isinstance(tables, dict):
        fail("tables must be an object")
    for name, t in tables.items():
        keys_ok(t, {"rows", "dim"}, set(), "tables.%s" % name)
        p.tables[name] = (pos_int(t["rows"], "tables.%s.rows" % name),
                          pos_int(t["dim"], "tables.%s.dim" % name))
        p.param_shapes["tables." + name] = p.tables[name]

    # ---- layers
    layers = spec["layers"]
    if not isinstance(layers, list) or not layers:
        fail("layers must be a non-empty list")
    for i, layer in enumerate(layers):
        if not isinstance(layer, dict):
            fail("layers[%d] must be an object" % i)
        name = layer.get("name")
        if not isinstance(name, str) or not name or "." in name:
            fail("layers[%d]: name must be a non-empty string without '.', got %r" % (i, name))
        lw = "layer %r" % name
        if name in p.nodes:
            fail("%s: duplicate name" % lw)
        op = layer.get("op")
        if op not in LAYER_KEYS:
            fail("%s: unknown op %r" % (lw, op))
        req, opt = LAYER_KEYS[op]
        keys_ok(layer, req | {"name", "op"}, opt, lw)

        def ref(key, value=None):
            r = layer[key] if value is None else value
            if not isinstance(r, str) or r not in p.nodes:
                fail("%s: %s %r is not an input or an earlier layer" % (lw, key, r))
            return p.nodes[r]

        def table(key="table"):
            t = layer[key]
            if not isinstance(t, str) or t not in p.tables:
                fail("%s: unknown table %r" % (lw, t))
            return t

        srcs = []           # (domain, shape) of every input, for the domain rule
        if op == "embedding_bag":
            d, s = ref("input")
            srcs.append((d, s))
            if s[0] != "sparse":
                fail("%s: input must be a sparse input (user.sparse.<f> or candidate.sparse.<f>)" % lw)
            t = table()
            if layer["pooling"] not in POOLINGS:
                fail("%s: pooling must be sum or mean, got %r" % (lw, layer["pooling"]))
            out = ("vec", p.tables[t][1])
        elif op == "history_embedding":
            d, s = ref("input")
            srcs.append((d, s))
            if s[0] != "history":
                fail("%s: input must be user.history" % lw)
            t = table()
            dim = p.tables[t][1]
            p.param_shapes[name + ".action"] = (p.history["actions"], dim)
            p.param_shapes[name + ".position"] = (p.history["max_len"], dim)
            out = ("jag", dim)
        elif op == "mean_pool":
            d, s = ref("input")
            srcs.append((d, s))
            if s[0] != "jag":
                fail("%s: input must be a jagged history sequence, got %s" % (lw, shape_str(s)))
            out = ("vec", s[1])
        elif op == "linear":
            d, s = ref("input")
            srcs.append((d, s))
            if s[0] not in ("vec", "tok", "jag"):
                fail("%s: input must be [F], [K, F] or jagged [L, F], got %s" % (lw, shape_str(s)))
            n = pos_int(layer["out"], "%s: out" % lw)
            act = layer.get("activation", "none")
            if act not in ACTIVATIONS:
                fail("%s: activation must be one of %s, got %r" % (lw, ", ".join(ACTIVATIONS), act))
            fin = s[-1]
            p.param_shapes[name + ".weight"] = (n, fin)
            p.param_shapes[name + ".bias"] = (n,)
            out = s[:-1] + (n,)
        elif op == "reshape":
            d, s = ref("input")
            srcs.append((d, s))
            if s[0] != "vec":
                fail("%s: input must be a [F] vector, got %s" % (lw, shape_str(s)))
            k = pos_int(layer["tokens"], "%s: tokens" % lw)
            if s[1] % k:
                fail("%s: %d features do not split into %d tokens" % (lw, s[1], k))
            out = ("tok", k, s[1] // k)
        elif op == "stack":
            names = layer["inputs"]
            if not isinstance(names, list) or not names:
                fail("%s: inputs must be a non-empty list" % lw)
            k, dim = 0, None
            for r in names:
                d, s = ref("inputs", r)
                srcs.append((d, s))
                if s[0] == "vec":
                    k, w = k + 1, s[1]
                elif s[0] == "tok":
                    k, w = k + s[1], s[2]
                else:
                    fail("%s: input %r is %s, not [D] or [K, D]" % (lw, r, shape_str(s)))
                if dim is not None and w != dim:
                    fail("%s: input %r has width %d, others %d" % (lw, r, w, dim))
                dim = w
            out = ("tok", k, dim)
        elif op == "flatten":
            d, s = ref("input")
            srcs.append((d, s))
            if s[0] != "tok":
                fail("%s: input must be [K, D] tokens, got %s" % (lw, shape_str(s)))
            out = ("vec", s[1] * s[2])
        elif op == "target_attention":
            dq, sq = ref("query")
            dh_, sh = ref("history")
            srcs += [(dq, sq), (dh_, sh)]
            if sq[0] == "vec":                      # a [D] query is one token
                sq = ("tok", 1, sq[1])
            if dq != "candidate" or sq[0] != "tok":
                fail("%s: query must be candidate [Tq, D] tokens or a [D] vector, got %s %s"
                     % (lw, dq, shape_str(sq)))
            if dh_ != "user" or sh[0] != "jag":
                fail("%s: history must be a user jagged sequence, got %s %s" % (lw, dh_, shape_str(sh)))
            if sh[1] != sq[2]:
                fail("%s: history width %d differs from query width %d" % (lw, sh[1], sq[2]))
            dim = sq[2]
            if "shared_with" in layer:
                sw = layer["shared_with"]
                if "heads" in layer or "head_dim" in layer:
                    fail("%s: heads and head_dim come from the shared_with layer; remove them" % lw)
                sa = next((l for l in p.layers if l["name"] == sw), None) if isinstance(sw, str) else None
                if sa is None or sa["op"] != "self_attention":
                    fail("%s: shared_with %r is not an earlier self_attention layer" % (lw, sw))
                if layer["history"] != sa["input"]:
                    fail("%s: history %r must be the input of shared_with layer %r (%r)"
                         % (lw, layer["history"], sw, sa["input"]))
            else:
                missing = {"heads", "head_dim"} - set(layer)
                if missing:
                    fail("%s: missing key(s) %s" % (lw, ", ".join(sorted(missing))))
                heads = pos_int(layer["heads"], "%s: heads" % lw)
                hd = pos_int(layer["head_dim"], "%s: head_dim" % lw)
                for w in ("wq", "wk", "wv"):
                    p.param_shapes["%s.%s" % (name, w)] = (heads * hd, dim)
                p.param_shapes[name + ".wo"] = (dim, heads * hd)
            out = ("tok", sq[1], dim)
        elif op == "lce":
            du, su = ref("user")
            dc, sc = ref("candidate")
            srcs += [(du, su), (dc, sc)]
            su = ("tok", 1, su[1]) if su[0] == "vec" else su     # a [D] operand is one token
            sc = ("tok", 1, sc[1]) if sc[0] == "vec" else sc
            if du != "user" or su[0] != "tok":
                fail("%s: user must be user [Ku, D] tokens or a [D] vector, got %s %s" % (lw, du, shape_str(su)))
            if dc != "candidate" or sc[0] != "tok":
                fail("%s: candidate must be candidate [Kc, D] tokens or a [D] vector, got %s %s"
                     % (lw, dc, shape_str(sc)))
            if su[2] != sc[2]:
                fail("%s: user width %d differs from candidate width %d" % (lw, su[2], sc[2]))
            m = pos_int(layer["out_tokens"], "%s: out_tokens" % lw)
            p.param_shapes[name + ".w_user"] = (m, su[1])
            p.param_shapes[name + ".w_cand"] = (m, sc[1])
            out = ("tok", m, su[2])
        elif op in ("add", "mul"):
            names = add_operands(layer)
            if names is None:
                fail("%s: %s takes \"a\" and \"b\", or \"inputs\": [a, b] (exactly one form)" % (lw, op))
            da, sa = ref("a", names[0])
            db, sb = ref("b", names[1])
            srcs += [(da, sa), (db, sb)]
            if sa[0] not in ("vec", "tok", "jag") or sa != sb or (sa[0] == "jag" and da != db):
                fail("%s: operands must have equal shapes, got %s and %s"
                     % (lw, shape_str(sa), shape_str(sb)))
            out = sa
        else:
            out = _analyze_ranking_op(p, layer, lw, ref, srcs, fail, pos_int)
        domains = {d for d, _ in srcs}
        if len(domains) > 1 and op not in MIXING_OPS and p.planning != "auto":
            fail("%s: op %s mixes user and candidate inputs (only %s may, or any op in a model with"
                 " \"planning\": \"auto\")" % (lw, op, ", ".join(sorted(MIXING_OPS))))
        domain = "candidate" if "candidate" in domains else "user"
        p.nodes[name] = (domain, out)
        p.layers.append(layer)

    # ---- output
    o = spec["output"]
    keys_ok(o, {"logits", "tasks"}, {"score_weights"}, "output")
    if not isinstance(o["logits"], str) or o["logits"] not in p.nodes or o["logits"].startswith(("user.", "candidate.")):
        fail("output.logits %r is not a layer" % (o["logits"],))
    d, s = p.nodes[o["logits"]]
    if d != "candidate" or s[0] != "vec":
        fail("output.logits %r must be a candidate [T] vector, got %s %s" % (o["logits"], d, shape_str(s)))
    t = s[1]
    tasks = o["tasks"]
    if not isinstance(tasks, list) or len(tasks) != t or not all(isinstance(x, str) and x for x in tasks):
        fail("output.tasks must list %d task names (logits has %d)" % (t, t))
    if len(set(tasks)) != len(tasks):
        fail("output.tasks has a duplicate name")
    sw = o.get("score_weights", [1.0] * t)
    if (not isinstance(sw, list) or len(sw) != t
            or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in sw)):
        fail("output.score_weights must be %d finite numbers" % t)
    p.logits, p.tasks, p.score_weights = o["logits"], list(tasks), [float(x) for x in sw]
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
