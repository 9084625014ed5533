#!/usr/bin/python3
"""PyTorch importer: a ranking nn.Module written the usual way -> an
ikbo-model/1 version directory in broadcast form ("planning": "auto").

    tools/importer/ikbo_import.py FILE.py:FACTORY OUT_DIR --inputs INPUTS.json
        --tasks click,like [--arg A]... [--score-weights 1,0.5] [--name N]
        [--description TEXT] [--dtype F32|F16|BF16] [--map index|counts]

FACTORY is a callable in FILE.py (dotted: `Class.method` works) returning
the module with its weights, called with the --arg strings; INPUTS.json is
the model's `inputs` block (MODEL_FORMAT.md), or a model version directory
whose model.json's inputs are taken. Exit status 2 with one line on stderr
on any error (an unsupported node: its name and source line). From Python:
`import_module(module, inputs, tasks, out_dir, ...)`.

Why this exists: teams write ranking models with user tensors broadcast to
the candidates (`u[cand_user]`; with --map counts, for candidates grouped by
user, `u.repeat_interleave(cand_counts, dim=0)`) before they meet candidate
tensors; the
engine's automatic planner (engine/auto_plan.c) takes exactly that form.
This tool traces the module with torch.fx (fx_trace.py), walks the graph
from the output and writes one layer per op of the format - plain ops here,
multi-node subgraphs (attention, DIN, pools, the history embedding, dot
interaction, cross, mixture) in patterns.py - with the weights under the
format's names. A node it cannot express is an error naming the node and
its source line (fx_trace.UnsupportedNode). The written model is then run by
the reference interpreter (tools/reference/ikbo_ref.py) beside the module on
random requests and refused if they differ (> 1e-9 relative, float64).

The forward() convention, the supported subset and the names written are in
tools/importer/README.md.
"""
import argparse
import copy
import importlib.util
import json
import os
import sys

import torch
import torch.fx as fx

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "reference"))
import export  # noqa: E402
import ikbo_ref  # noqa: E402
import make_request  # noqa: E402
import zoo  # noqa: E402
import patterns  # noqa: E402
from fx_trace import UnsupportedNode, trace  # noqa: E402
from nodes import ACTIVATIONS, View  # noqa: E402

ROLES = ("user_dense", "user_sparse", "cand_dense", "cand_sparse", "cand_user", "history")
# the forward()'s 5th argument: the map itself, or candidates per user (candidates grouped by user)
MAP_FORMS = {"index": "cand_user", "counts": "cand_counts"}
CHECK_TOL = 1e-9
ROUNDING = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
# example and check requests: candidates per user; the first users' histories empty, long, short, exact
EXAMPLE_COUNTS = [3, 1, 5, 2]
CHECK_COUNTS = ([1], [4, 1, 7, 2, 3])
# when the example fails: requests of uniform counts, then of one user (the module assumes one of them)
DIAGNOSIS_COUNTS = ([2, 2, 2, 2], [3])


class ImportMismatch(ValueError):
    """The written model does not compute what the module computes."""


def roles(map_form):
    if map_form not in MAP_FORMS:
        raise ValueError("map_form: %r, expected one of %s" % (map_form, ", ".join(MAP_FORMS)))
    return ROLES[:4] + (MAP_FORMS[map_form],) + ROLES[5:]


def input_plan(inputs):
    """An ikbo_ref.Plan holding only the inputs (enough for requests and module arguments)."""
    p = ikbo_ref.Plan()
    u, c = inputs["user"], inputs["candidate"]
    p.user_dense, p.user_sparse, p.history = u.get("dense", 0), list(u.get("sparse", [])), u.get("history")
    p.cand_dense, p.cand_sparse = c.get("dense", 0), list(c.get("sparse", []))
    return p


def ordered(request, map_form):
    """The request as the convention orders it: under "counts" its candidates sorted by user, stably."""
    if map_form == "index":
        return request
    r = dict(request)
    r["candidates"] = sorted(request["candidates"], key=lambda c: c["user"])
    return r


def module_args(plan, request, map_form="index"):
    """The forward() arguments for a request (the convention of README.md; zoo.feature_inputs);
    map_form "counts": cand_counts [U] in place of cand_user, the request grouped by user."""
    args = zoo.feature_inputs(plan, request, plan.user_sparse, plan.cand_sparse)
    if map_form == "index":
        return args
    cand_user = args[4]
    if bool((cand_user[1:] < cand_user[:-1]).any()):
        raise ValueError("map_form counts: the request's candidates are not grouped by user")
    counts = torch.bincount(cand_user, minlength=args[0].shape[0])
    return args[:4] + (counts,) + args[5:]


class Converter:
    """One traced module -> layers and tensors. Not thread-safe; one use."""

    def __init__(self, traced, inputs, map_form="index"):
        self.t, self.g, self.inputs = traced, View(traced), inputs
        self.map_form, names = map_form, roles(map_form)
        ph = traced.placeholders
        want = len(names) if inputs["user"].get("history") else len(names) - 1
        if len(ph) != want:
            raise ValueError("forward() takes %d arguments, expected %d: (%s) - tools/importer/README.md"
                             % (len(ph), want, ", ".join(names[:want])))
        self.role = {p: r for p, r in zip(ph, names)}
        self.map = ph[4]
        self.layers, self.tensors, self.tables, self.table_of = [], {}, {}, {}
        self.memo, self.names, self.seq = {}, set(), set()
        self._check_map_uses()

    # ---- the map argument: cand_user (index) or cand_counts (counts)

    def _live(self):
        """The nodes the output depends on."""
        live, todo = set(), [self.t.output]
        while todo:
            n = todo.pop()
            if n not in live:
                live.add(n)
                todo += n.all_input_nodes
        return live

    def _check_map_uses(self):
        """Every live use of the map argument is one the importer reads as the broadcast
        (README.md); any other is an UnsupportedNode naming that use."""
        g, live, arg = self.g, self._live(), MAP_FORMS[self.map_form]
        if self.map_form == "index":
            allowed = "only as an index of a user tensor: x[cand_user] or x.index_select(0, cand_user)"
        else:
            allowed = ("only as the repeats of x.repeat_interleave(cand_counts, dim=0) / torch.repeat_interleave("
                       "x, cand_counts, dim=0), or in the map torch.repeat_interleave(torch.arange(U), cand_counts)")
        for u in self.map.users:
            if u in live and g.is_(self._repeated(u), "arange") and not self.is_map(u):
                raise UnsupportedNode(u, "the map torch.repeat_interleave(torch.arange(U), cand_counts) takes U as "
                                      "user_dense.shape[0], cand_counts.shape[0] or a history tensor's shape[0]")
            if u not in live or self.is_shape(u) or self.bcast_base(u) is not None:
                continue
            if not self.is_map(u):
                raise UnsupportedNode(u, "%s (forward()'s 5th argument) may be used %s (tools/importer/README.md)"
                                      % (arg, allowed))
            for v in u.users:
                if v in live and not self.is_shape(v) and self.bcast_base(v) is None:
                    raise UnsupportedNode(v, "the candidate -> user map made from cand_counts may only index "
                                          "a user tensor: x[m] or x.index_select(0, m)")

    def is_shape(self, n):
        """n reads only a shape: x.shape, x.size(...)."""
        g = self.g
        return g.is_(n, "size") or (g.is_(n, "getattr") and n.args[1] == "shape")

    def _user_rows(self, s):
        """s is U: x.shape[0], x.size(0) or x.size()[0] with x user_dense, cand_counts or a history tensor."""
        g, ix = self.g, self.g.index(s)
        if g.is_(s, "size") and g.arg(s, 1, "dim") == 0:
            x = s.args[0]
        elif ix and ix[1] == (0,) and (g.is_(ix[0], "getattr") and ix[0].args[1] == "shape"
                                       or g.is_(ix[0], "size") and g.arg(ix[0], 1, "dim") is None):
            x = ix[0].args[0]
        else:
            return False
        return self.role.get(x) in ("user_dense", "cand_counts") or any(self.is_history(x, k) for k in range(3))

    def _repeated(self, n):
        """x for n = x.repeat_interleave(cand_counts, dim=0) or torch.repeat_interleave(x, cand_counts, dim=0)
        (dim may be left out for a 1-d x) under the counts convention; None otherwise."""
        g = self.g
        if self.map_form != "counts" or not g.is_(n, "repeat_interleave") or g.arg(n, 1, "repeats") is not self.map:
            return None
        x, dim = n.args[0], g.arg(n, 2, "dim")
        if x is self.map:
            return None
        rank = len(g.shape(x) or ())
        return x if dim in (0, -rank) or (dim is None and rank == 1) else None

    def is_map(self, n):
        """n is the candidate -> user map: cand_user; under counts torch.repeat_interleave(cand_counts),
        torch.repeat_interleave(torch.arange(U), cand_counts) or torch.arange(U).repeat_interleave(cand_counts)."""
        g = self.g
        if self.map_form == "index":
            return n is self.map
        if not g.is_(n, "repeat_interleave"):
            return False
        if n.args[0] is self.map and g.arg(n, 1, "repeats") is None:
            return True
        a = self._repeated(n)
        if not g.is_(a, "arange") or n.args[0] is self.map:
            return False
        ends = list(a.args[1:] if len(a.args) == 2 and g.const(a.args[0]) == 0 else a.args)
        return len(ends) == 1 and self._user_rows(ends[0]) and set(a.kwargs) <= {"dtype", "device"}

    # ---- helpers for the matchers

    def is_history(self, n, k):
        """n is history[k] (0 ids, 1 actions, 2 lengths)."""
        ix = self.g.index(n)
        return bool(ix) and self.role.get(ix[0]) == "history" and ix[1] == (k,)

    def bcast_base(self, n):
        """x for the broadcast of a user tensor x to the candidates: x[m], x[m, :], x.index_select(0, m)
        with m the map (is_map), or (counts) x.repeat_interleave(cand_counts, dim=0); else None."""
        g = self.g
        ix = g.index(n)
        if ix and ix[1] and isinstance(ix[1][0], fx.Node) and self.is_map(ix[1][0]) and \
                all(i == slice(None) or i is Ellipsis for i in ix[1][1:]):
            return ix[0]
        if g.is_(n, "index_select") and g.arg(n, 1, "dim") == 0 and isinstance(g.arg(n, 2, "index"), fx.Node) \
                and self.is_map(g.arg(n, 2, "index")):
            return n.args[0]
        x = self._repeated(n)
        return None if x is None or self.is_map(n) else x

    def layer(self, node, op, /, seq=False, hint=None, **fields):
        """Appends a layer named `hint` or after the node; returns its (unique) name."""
        name = base = hint or node.name.strip("_") or "layer"
        k = 1
        while name in self.names:
            k += 1
            name = "%s_%d" % (base, k)
        self.names.add(name)
        self.layers.append(dict({"name": name, "op": op}, **fields))
        if seq:
            self.seq.add(name)
        return name

    def weight(self, layer, key, t, zeros=None):
        if t is None:
            t = torch.zeros(zeros)
        self.tensors["%s.%s" % (layer, key)] = t.detach().to(torch.float64).clone()

    def table(self, w, hint):
        """The table name of an embedding weight (one per tensor: shared weights share a table)."""
        if id(w) not in self.table_of:
            name, k = hint, 1
            while name in self.tables:
                k += 1
                name = "%s_%d" % (hint, k)
            self.table_of[id(w)] = name
            self.tables[name] = {"rows": w.shape[0], "dim": w.shape[1]}
            self.tensors["tables." + name] = w.detach().to(torch.float64).clone()
        return self.table_of[id(w)]

    def _parts(self, n):
        """The nodes a token block written as torch.cat(dim=1) / torch.stack(dim=1)
        is made of, a nested block used only here spliced in (one stack, not two)."""
        g = self.g
        if g.is_(n, "cat") and g.dim(n, 1) == 1 and len(g.shape(n)) == 3:
            parts = [g.strip_unsqueeze(p) for p in n.args[0]]
        elif g.is_(n, "stack") and g.dim(n, 1) == 1 and len(g.shape(n)) == 3:
            parts = list(n.args[0])
        else:
            return [n]
        out = []
        for p in parts:
            nested = p is not n and len(p.users) == 1 and p not in self.memo and self._parts(p) != [p]
            out += self._parts(p) if nested else [p]
        return out

    def token_parts(self, n):
        """The references of a token block's parts (stack, dot_interaction)."""
        parts = self._parts(n)
        refs = [self.emit(p) for p in parts]
        for p, r in zip(parts, refs):
            if r in self.seq:
                raise UnsupportedNode(p, "a history sequence cannot be a token of a stack")
        return refs

    # ---- emission

    def emit(self, n):
        """The model reference computing node n (memoised)."""
        if n not in self.memo:
            self.memo[n] = self._emit(n)
        return self.memo[n]

    def _emit(self, n):
        if n.op == "placeholder":
            r = self.role[n]
            if r in ("user_dense", "cand_dense"):
                return ("user" if r == "user_dense" else "candidate") + ".dense"
            raise UnsupportedNode(n, "the argument %s is used as a tensor (tools/importer/README.md)" % r)
        b = self.bcast_base(n)
        if b is not None:
            return self.emit(b)           # broadcast form: a user operand means its copy at each candidate
        k = self.g.kind(n)
        for m in patterns.MATCHERS.get(k, ()):
            ref = m(self, n)
            if ref is not None:
                return ref
        f = getattr(self, "op_" + k, None) if k and k.isidentifier() else None
        if k in ACTIVATIONS:
            f = self.op_activation
        if f is None:
            raise UnsupportedNode(n, "no op of ikbo-model/1 computes this (supported: tools/importer/README.md)")
        return f(n)

    def _seq(self, name, *inputs):
        if any(i in self.seq for i in inputs):
            self.seq.add(name)
        return name

    def _vec_or_tokens(self, n, x, what):
        if len(self.g.shape(x)) not in (2, 3):
            raise UnsupportedNode(n, "%s of a %d-d tensor: the format's rows are [F], [K, D] or a history"
                                  % (what, len(self.g.shape(x))))

    def op_linear(self, n, activation="none", node=None):
        m, x = self.g.module(n), n.args[0]
        self._vec_or_tokens(n, x, "nn.Linear")
        xr = self.emit(x)
        name = self.layer(node or n, "linear", input=xr, out=m.out_features, activation=activation)
        self.weight(name, "weight", m.weight)
        self.weight(name, "bias", m.bias, zeros=m.out_features)
        return self._seq(name, xr)

    def op_activation(self, n):
        g, k, x = self.g, self.g.kind(n), n.args[0]
        gelu = g.module(n).approximate if n.op == "call_module" and k == "gelu" else \
            g.arg(n, 1, "approximate", "none") if k == "gelu" else "none"
        if gelu != "none":
            raise UnsupportedNode(n, "gelu(approximate=%r): the format's gelu is the exact (erf) form" % gelu)
        if g.is_(x, "linear") and len(x.users) == 1 and x not in self.memo:
            return self.op_linear(x, activation=k, node=x)
        xr = self.emit(x)
        return self._seq(self.layer(n, "activation", input=xr, fn=k), xr)

    def op_embedding_bag(self, n):
        g, m = self.g, self.g.module(n)
        ids, offsets = n.args[0], g.arg(n, 1, "offsets")
        if m.mode not in ("sum", "mean") or g.arg(n, 2, "per_sample_weights") is not None or \
                m.padding_idx is not None or m.max_norm is not None:
            raise UnsupportedNode(n, "nn.EmbeddingBag: mode sum or mean, no per-sample weights, padding_idx "
                                  "or max_norm (mode %r)" % m.mode)
        if g.is_(ids, "mod") and g.const(ids.args[1]) == m.num_embeddings:
            ids = ids.args[0]                       # the format's row rule, spelled out
        a, b = g.index(ids), g.index(offsets)
        ok = a and b and a[1] == (0,) and b[1] == (1,) and a[0] is b[0] and g.index(a[0])
        src = g.index(a[0]) if ok else None
        role = self.role.get(src[0]) if src else None
        if role not in ("user_sparse", "cand_sparse") or len(src[1]) != 1:
            raise UnsupportedNode(n, "nn.EmbeddingBag must take (ids, offsets) = user_sparse[f] or cand_sparse[f]")
        side, f = ("user", "candidate")[role == "cand_sparse"], src[1][0]
        if f not in self.inputs[side].get("sparse", []):
            raise UnsupportedNode(n, "sparse feature %r is not in inputs.%s.sparse" % (f, side))
        return self.layer(n, "embedding_bag", input="%s.sparse.%s" % (side, f), table=self.table(m.weight, f),
                          pooling=m.mode)

    def op_embedding(self, n):
        raise UnsupportedNode(n, "nn.Embedding is supported as the history's item, action and position "
                              "embeddings summed (history_embedding); use nn.EmbeddingBag for sparse features")

    def op_layer_norm(self, n):
        m, x = self.g.module(n), n.args[0]
        if len(m.normalized_shape) != 1 or m.normalized_shape[0] != self.g.shape(x)[-1]:
            raise UnsupportedNode(n, "nn.LayerNorm over the last dim only")
        xr = self.emit(x)
        fields = {} if m.eps == 1e-5 else {"eps": m.eps}
        name = self.layer(n, "layer_norm", input=xr, **fields)
        d = m.normalized_shape[0]
        self.weight(name, "weight", m.weight if m.elementwise_affine else torch.ones(d))
        self.weight(name, "bias", m.bias, zeros=d)
        return self._seq(name, xr)

    def _elementwise(self, n, op):
        a, b = n.args[0], n.args[1]
        sa, sb = self.g.shape(a), self.g.shape(b)
        if sa is None or sb is None or sa[1:] != sb[1:] or len(n.args) > 2 or n.kwargs:
            raise UnsupportedNode(n, "%s of two tensors of one shape (rows aside) only, got %s and %s"
                                  % (op, sa, sb))
        ra, rb = self.emit(a), self.emit(b)
        return self._seq(self.layer(n, op, inputs=[ra, rb]), ra, rb)

    def op_add(self, n):
        return self._elementwise(n, "add")

    def op_mul(self, n):
        return self._elementwise(n, "mul")

    def op_cat(self, n):
        g = self.g
        rank, d = len(g.shape(n)), g.dim(n, 1)
        if rank == 2 and d == 1:
            return self.layer(n, "concat", inputs=[self._vector(p) for p in n.args[0]])
        if rank == 3 and d == 1:
            return self.layer(n, "stack", inputs=self.token_parts(n))
        raise UnsupportedNode(n, "torch.cat of [N, F] vectors (dim 1: concat) or [N, K, D] tokens (dim 1: stack)")

    def _vector(self, p):
        r = self.emit(p)
        if len(self.g.shape(p)) != 2 or r in self.seq:
            raise UnsupportedNode(p, "concat takes [N, F] vectors")
        return r

    def op_stack(self, n):
        if self.g.dim(n, 1) != 1 or any(len(self.g.shape(p)) != 2 for p in n.args[0]):
            raise UnsupportedNode(n, "torch.stack of [N, D] vectors along dim 1 only")
        return self.layer(n, "stack", inputs=self.token_parts(n))

    def op_getitem(self, n):
        g = self.g
        ix = g.index(n)
        s = g.shape(ix[0])
        if s and len(s) == 3 and s[1] == 1 and ix[1] == (slice(None), 0):
            return self.layer(n, "flatten", input=self.emit(ix[0]))
        raise UnsupportedNode(n, "indexing: supported are x[cand_user] (the broadcast), v[:, None] where a "
                              "vector joins tokens, t[:, 0] of one token and the patterns of README.md")

    def op_reshape(self, n):
        g = self.g
        si, so = g.shape(n.args[0]), g.shape(n)
        if so[0] != si[0]:
            raise UnsupportedNode(n, "a reshape that changes the rows (%d -> %d)%s" % (si[0], so[0], (
                ": x[:, None].expand(U, n, D).reshape(U * n, D) repeats each user n times, which is the broadcast "
                "only when every user has exactly n candidates (and they are grouped by user); requests have any "
                "counts: broadcast with " + self.spelling()) if g.is_(n.args[0], "expand") else ""))
        xr = self.emit(n.args[0])
        if xr not in self.seq and len(si) == 2 and len(so) == 3:
            return self.layer(n, "reshape", input=xr, tokens=so[1])
        if xr not in self.seq and len(si) == 3 and len(so) == 2:
            return self.layer(n, "flatten", input=xr)
        raise UnsupportedNode(n, "reshape [N, F] -> [N, K, F/K] (tokens) or [N, K, D] -> [N, K*D] only")

    def op_flatten(self, n):
        g = self.g
        if g.arg(n, 1, "start_dim", 0) != 1 or g.arg(n, 2, "end_dim", -1) not in (-1, 2) or \
                len(g.shape(n.args[0])) != 3:
            raise UnsupportedNode(n, "flatten(1) of [N, K, D] tokens only")
        return self.op_reshape(n)

    def spelling(self):
        """How this convention broadcasts a user tensor x (for messages)."""
        return "x[cand_user]" if self.map_form == "index" else "x.repeat_interleave(cand_counts, dim=0)"

    def op_expand(self, n):
        si, so = self.g.shape(n.args[0]), self.g.shape(n)
        if si[0] == 1 and so[0] != 1:
            raise UnsupportedNode(n, "expand of one row to %d rows is the broadcast only when the request has one "
                                  "user, and requests have several: broadcast with %s" % (so[0], self.spelling()))
        raise UnsupportedNode(n, "expand is supported as DIN's query expanded over the history only "
                              "(q[:, None].expand_as(h[cand_user]), README.md); no op of the format repeats values")

    def op_repeat_interleave(self, n):
        reps = self.g.arg(n, 1, "repeats")
        why = ("repeating every row %d times is the broadcast only when every user has exactly that many "
               "candidates" % reps if isinstance(reps, int) else "not the broadcast of a user tensor")
        raise UnsupportedNode(n, "repeat_interleave: %s; with forward() taking cand_counts (--map counts) the "
                              "broadcast is x.repeat_interleave(cand_counts, dim=0)" % why)

    def op_matmul(self, n):
        g = self.g
        w, x = n.args
        pw = g.param(w)
        if pw is None or pw.dim() != 2 or len(g.shape(x)) != 3 or pw.shape[1] != g.shape(x)[1]:
            raise UnsupportedNode(n, "matmul: a weight [M, K] @ tokens [N, K, D] (token_linear) or the patterns "
                                  "of README.md (attention, dot interaction)")
        name = self.layer(n, "token_linear", input=self.token_ref(x), out_tokens=pw.shape[0],
                          hint=w.target.replace(".", "_"))
        self.weight(name, "weight", pw)
        return name

    def token_ref(self, x):
        r = self.emit(x)
        if r in self.seq:
            raise UnsupportedNode(x, "a history sequence where tokens are expected")
        return r

    def op_sum(self, n):
        g = self.g
        if g.dim(n, 1) != 1 or len(g.shape(n.args[0])) != 3 or g.arg(n, 2, "keepdim", False):
            raise UnsupportedNode(n, "sum over the tokens (dim 1) of [N, K, D] only")
        return self.layer(n, "pool", input=self.token_ref(n.args[0]), fn="sum")

    def output(self):
        out = self.t.output.args[0]
        if not hasattr(out, "op"):
            raise ValueError("forward() must return one tensor: the logits [C, T]")
        return self.emit(out)


def _load_inputs(arg):
    if os.path.isdir(arg):
        arg = os.path.join(arg, "model.json")
    with open(arg) as f:
        d = json.load(f)
    return d["inputs"] if "inputs" in d else d


def import_module(module, inputs, tasks, out, score_weights=None, name=None, description=None, dtype="F32",
                  check=True, seed=1, map_form="index"):
    """Traces `module`, writes OUT/model.json and OUT/weights.safetensors and
    (check=True) compares the written model with the module; returns the
    ikbo_ref.Model. map_form: forward()'s 5th argument, "index" (cand_user)
    or "counts" (cand_counts, candidates grouped by user). Raises
    UnsupportedNode, ImportMismatch or ValueError."""
    roles(map_form)
    module = module.double().eval()
    plan0 = input_plan(inputs)
    example = make_request.generate(plan0, seed, EXAMPLE_COUNTS, unused_users=0)
    try:
        traced = trace(module, module_args(plan0, ordered(example, map_form), map_form))
    except ValueError as e:
        _diagnose(module, inputs, plan0, seed, map_form, e)
    cv = Converter(traced, inputs, map_form)
    logits = cv.output()
    spec = {"format": "ikbo-model/1", "name": name or type(module).__name__.lower(),
            "description": description or "%s imported from PyTorch (tools/importer)" % type(module).__name__,
            "planning": "auto", "inputs": inputs, "tables": cv.tables, "layers": cv.layers,
            "output": {"logits": logits, "tasks": list(tasks)}}
    if score_weights is not None:
        spec["output"]["score_weights"] = list(score_weights)
    model = export.write_model(out, spec, cv.tensors, dtype, metadata={"importer": type(module).__name__})
    if check:
        compare(_rounded(module, dtype), model, seed, map_form)
    return model


def _diagnose(module, inputs, plan, seed, map_form, error):
    """The forward() failed on the example request (`error`): if it runs on a request whose users all have
    the same number of candidates, or on one of one user, it assumes that; the node that does is named
    (an UnsupportedNode) where the converter finds it. Always raises."""
    for counts in DIAGNOSIS_COUNTS:
        req = make_request.generate(plan, seed, counts, dup_users=0, same_key_users=0, unused_users=0)
        try:
            traced = trace(module, module_args(plan, ordered(req, map_form), map_form))
        except ValueError:
            continue
        Converter(traced, inputs, map_form).output()
        raise ValueError("%s (it runs on a request of %s: it assumes that)" % (
            error, "one user" if len(counts) == 1 else "users with the same number of candidates")) from error
    raise error


def _rounded(module, dtype):
    """A copy of module with its parameters rounded as written in `dtype` (float64 again)."""
    m = copy.deepcopy(module)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(p.to(ROUNDING[dtype]).to(torch.float64))
    return m


def compare(module, model, seed=1, map_form="index"):
    """Max relative score error, module vs the written model (ikbo_ref); raises ImportMismatch above CHECK_TOL.
    `module` holds the weights as written (import_module rounds them first). Under map_form "counts" the
    requests' candidates are grouped by user (stably; both score them in that order)."""
    reqs = [ordered(make_request.generate(model.plan, seed + 100 + i, counts), map_form)
            for i, counts in enumerate(CHECK_COUNTS)]
    worst = zoo.max_score_error(module, model, reqs, inputs=lambda plan, req: module_args(plan, req, map_form))
    if worst > CHECK_TOL:
        raise ImportMismatch("the written model differs from the module: max relative score error %.3g > %g "
                             "(a pattern the importer matched computes something else: please report)"
                             % (worst, CHECK_TOL))
    return worst


def _factory(spec):
    path, _, attr = spec.rpartition(":")
    if not path or not attr:
        raise ValueError("module: expected FILE.py:FACTORY, got %r" % spec)
    s = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(path))[0], path)
    if s is None:
        raise ValueError("module: cannot load %s" % path)
    mod = importlib.util.module_from_spec(s)
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    s.loader.exec_module(mod)
    obj = mod
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError("module: %s has no %r" % (path, attr))
        obj = getattr(obj, part)
    return obj


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("module", help="FILE.py:FACTORY (a callable returning the nn.Module with its weights)")
    ap.add_argument("out", help="the model version directory to write")
    ap.add_argument("--inputs", required=True, help="inputs JSON (MODEL_FORMAT.md) or a model directory")
    ap.add_argument("--tasks", required=True, help="comma-separated task names (the logits' columns)")
    ap.add_argument("--arg", action="append", default=[], help="an argument of FACTORY (repeatable)")
    ap.add_argument("--score-weights", default=None, help="comma-separated, one per task")
    ap.add_argument("--name", default=None, help="model.json's name (default: the class name)")
    ap.add_argument("--description", default=None, help="model.json's description")
    ap.add_argument("--dtype", default="F32", choices=export.DTYPES)
    ap.add_argument("--map", default="index", choices=sorted(MAP_FORMS), dest="map_form",
                    help="forward()'s 5th argument: index (cand_user [C], default) or counts (cand_counts [U], "
                    "candidates grouped by user)")
    a = ap.parse_args(argv)
    try:
        module = _factory(a.module)(*a.arg)
        sw = [float(x) for x in a.score_weights.split(",")] if a.score_weights else None
        import_module(module, _load_inputs(a.inputs), a.tasks.split(","), a.out, score_weights=sw, name=a.name,
                      description=a.description, dtype=a.dtype, map_form=a.map_form)
    except (ValueError, OSError, KeyError) as e:
        print("ikbo_import: %s" % e, file=sys.stderr)
        return 2
    print("%s: written (planning auto); plan: build/ikbo-plan %s" % (a.out, a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
