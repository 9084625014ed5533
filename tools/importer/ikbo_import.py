#!/usr/bin/python3
"""PyTorch importer: a ranking nn.Module written the usual way -> an
ikbo-model/1 version directory in broadcast form ("planning": "auto").

    tools/importer/ikbo_import.py FILE.py:FACTORY OUT_DIR --inputs INPUTS.json
        --tasks click,like [--arg A]... [--score-weights 1,0.5] [--name N]
        [--description TEXT] [--dtype F32|F16|BF16]

FACTORY is a callable in FILE.py (dotted: `Class.method` works) returning
the module with its weights, called with the --arg strings; INPUTS.json is
the model's `inputs` block (MODEL_FORMAT.md), or a model version directory
whose model.json's inputs are taken. Exit status 2 with one line on stderr
on any error (an unsupported node: its name and source line). From Python:
`import_module(module, inputs, tasks, out_dir, ...)`.

Why this exists: teams write ranking models with user tensors broadcast to
the candidates (`u[cand_user]`) before they meet candidate tensors; the
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
CHECK_TOL = 1e-9
ROUNDING = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
# example and check requests: candidates per user; the first users' histories empty, long, short, exact
EXAMPLE_COUNTS = [3, 1, 5, 2]
CHECK_COUNTS = ([1], [4, 1, 7, 2, 3])


class ImportMismatch(ValueError):
    """The written model does not compute what the module computes."""


def input_plan(inputs):
    """An ikbo_ref.Plan holding only the inputs (enough for requests and module arguments)."""
    p = ikbo_ref.Plan()
    u, c = inputs["user"], inputs["candidate"]
    p.user_dense, p.user_sparse, p.history = u.get("dense", 0), list(u.get("sparse", [])), u.get("history")
    p.cand_dense, p.cand_sparse = c.get("dense", 0), list(c.get("sparse", []))
    return p


def module_args(plan, request):
    """The forward() arguments for a request (the convention of README.md; zoo.feature_inputs)."""
    return zoo.feature_inputs(plan, request, plan.user_sparse, plan.cand_sparse)


class Converter:
    """One traced module -> layers and tensors. Not thread-safe; one use."""

    def __init__(self, traced, inputs):
        self.t, self.g, self.inputs = traced, View(traced), inputs
        ph = traced.placeholders
        want = len(ROLES) if inputs["user"].get("history") else len(ROLES) - 1
        if len(ph) != want:
            raise ValueError("forward() takes %d arguments, expected %d: (%s) - tools/importer/README.md"
                             % (len(ph), want, ", ".join(ROLES[:want])))
        self.role = {p: r for p, r in zip(ph, ROLES)}
        self.map = ph[4]
        self.layers, self.tensors, self.tables, self.table_of = [], {}, {}, {}
        self.memo, self.names, self.seq = {}, set(), set()

    # ---- helpers for the matchers

    def is_history(self, n, k):
        """n is history[k] (0 ids, 1 actions, 2 lengths)."""
        ix = self.g.index(n)
        return bool(ix) and self.role.get(ix[0]) == "history" and ix[1] == (k,)

    def bcast_base(self, n):
        """x for n = x[cand_user] or x.index_select(0, cand_user); else None."""
        g = self.g
        ix = g.index(n)
        if ix and ix[1] == (self.map,):
            return ix[0]
        if g.is_(n, "index_select") and g.arg(n, 1, "dim") == 0 and g.arg(n, 2, "index") is self.map:
            return n.args[0]
        return None

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
                  check=True, seed=1):
    """Traces `module`, writes OUT/model.json and OUT/weights.safetensors and
    (check=True) compares the written model with the module; returns the
    ikbo_ref.Model. Raises UnsupportedNode, ImportMismatch or ValueError."""
    module = module.double().eval()
    plan0 = input_plan(inputs)
    example = make_request.generate(plan0, seed, EXAMPLE_COUNTS, unused_users=0)
    cv = Converter(trace(module, module_args(plan0, example)), inputs)
    logits = cv.output()
    spec = {"format": "ikbo-model/1", "name": name or type(module).__name__.lower(),
            "description": description or "%s imported from PyTorch (tools/importer)" % type(module).__name__,
            "planning": "auto", "inputs": inputs, "tables": cv.tables, "layers": cv.layers,
            "output": {"logits": logits, "tasks": list(tasks)}}
    if score_weights is not None:
        spec["output"]["score_weights"] = list(score_weights)
    model = export.write_model(out, spec, cv.tensors, dtype, metadata={"importer": type(module).__name__})
    if check:
        compare(_rounded(module, dtype), model, seed)
    return model


def _rounded(module, dtype):
    """A copy of module with its parameters rounded as written in `dtype` (float64 again)."""
    m = copy.deepcopy(module)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(p.to(ROUNDING[dtype]).to(torch.float64))
    return m


def compare(module, model, seed=1):
    """Max relative score error, module vs the written model (ikbo_ref); raises ImportMismatch above CHECK_TOL.
    `module` holds the weights as written (import_module rounds them first)."""
    reqs = [make_request.generate(model.plan, seed + 100 + i, counts) for i, counts in enumerate(CHECK_COUNTS)]
    worst = zoo.max_score_error(module, model, reqs, inputs=module_args)
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
    a = ap.parse_args(argv)
    try:
        module = _factory(a.module)(*a.arg)
        sw = [float(x) for x in a.score_weights.split(",")] if a.score_weights else None
        import_module(module, _load_inputs(a.inputs), a.tasks.split(","), a.out, score_weights=sw, name=a.name,
                      description=a.description, dtype=a.dtype)
    except (ValueError, OSError, KeyError) as e:
        print("ikbo_import: %s" % e, file=sys.stderr)
        return 2
    print("%s: written (planning auto); plan: build/ikbo-plan %s" % (a.out, a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
