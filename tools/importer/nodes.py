"""A read-only view of a traced graph for the importer's matchers.

Why this file exists: the same computation reaches the graph in several
spellings (`a + b`, `torch.add(a, b)`, `a.add(b)`; `F.relu`, `torch.relu`,
`x.relu()`, `nn.ReLU`; `x[:, None]` and `x.unsqueeze(1)`;
`x.repeat_interleave(r, dim=0)` and `torch.repeat_interleave(x, r, dim=0)`;
`F.scaled_dot_product_attention`, "sdpa", where torch has it). The matchers ask
`kind(n)` for one canonical name and read arguments by position or keyword,
so each pattern is written once. Everything here is a pure function of the
traced graph (fx_trace.Traced).
"""
import math
import operator

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.fx as fx

_FUNCTIONS = {
    operator.add: "add", torch.add: "add", operator.mul: "mul", torch.mul: "mul",
    operator.sub: "sub", torch.sub: "sub", operator.truediv: "div", torch.div: "div",
    operator.matmul: "matmul", torch.matmul: "matmul", torch.bmm: "matmul",
    operator.getitem: "getitem", torch.cat: "cat", torch.concat: "cat", torch.stack: "stack",
    F.softmax: "softmax", torch.softmax: "softmax", torch.relu: "relu", F.relu: "relu",
    torch.sigmoid: "sigmoid", F.gelu: "gelu", F.silu: "silu", torch.tanh: "tanh",
    torch.transpose: "transpose", torch.reshape: "reshape", torch.flatten: "flatten",
    torch.unsqueeze: "unsqueeze", torch.squeeze: "squeeze", torch.sum: "sum",
    torch.masked_fill: "masked_fill", operator.invert: "not", torch.logical_not: "not",
    operator.and_: "and", torch.logical_and: "and", operator.lt: "lt", operator.gt: "gt",
    torch.lt: "lt", torch.gt: "gt", torch.clamp: "clamp", torch.index_select: "index_select",
    operator.mod: "mod", torch.remainder: "mod", torch.tril: "tril", torch.arange: "arange",
    torch.ones: "ones", torch.triu_indices: "triu_indices", getattr: "getattr",
    torch.repeat_interleave: "repeat_interleave",
}
if hasattr(F, "scaled_dot_product_attention"):         # torch >= 2.0
    _FUNCTIONS[F.scaled_dot_product_attention] = "sdpa"
_METHODS = {"add": "add", "mul": "mul", "sub": "sub", "div": "div", "matmul": "matmul", "bmm": "matmul",
            "softmax": "softmax", "relu": "relu", "sigmoid": "sigmoid", "tanh": "tanh",
            "transpose": "transpose", "reshape": "reshape", "view": "reshape", "flatten": "flatten",
            "unsqueeze": "unsqueeze", "squeeze": "squeeze", "sum": "sum", "masked_fill": "masked_fill",
            "logical_not": "not", "clamp": "clamp", "clamp_min": "clamp", "index_select": "index_select",
            "expand": "expand", "expand_as": "expand", "tril": "tril", "remainder": "mod", "__getitem__": "getitem",
            "repeat_interleave": "repeat_interleave", "size": "size"}
_MODULES = ((nn.Linear, "linear"), (nn.EmbeddingBag, "embedding_bag"), (nn.Embedding, "embedding"),
            (nn.LayerNorm, "layer_norm"), (nn.ReLU, "relu"), (nn.GELU, "gelu"), (nn.SiLU, "silu"),
            (nn.Tanh, "tanh"), (nn.Sigmoid, "sigmoid"))
ACTIVATIONS = ("relu", "gelu", "silu", "tanh", "sigmoid")


class View:
    def __init__(self, traced):
        self.t = traced

    def module(self, n):
        return self.t.modules[n.target] if n.op == "call_module" else None

    def kind(self, n):
        """Canonical op name of node n, or None for a value that is not a node."""
        if not isinstance(n, fx.Node):
            return None
        if n.op == "call_module":
            m = self.module(n)
            for cls, name in _MODULES:
                if isinstance(m, cls):
                    return name
            return "module:" + type(m).__name__
        if n.op == "call_function":
            return _FUNCTIONS.get(n.target, "function:" + getattr(n.target, "__name__", str(n.target)))
        if n.op == "call_method":
            return _METHODS.get(n.target, "method:" + n.target)
        return n.op                                     # placeholder, get_attr, output

    def is_(self, n, *kinds):
        return self.kind(n) in kinds

    @staticmethod
    def arg(n, i, key=None, default=None):
        if i < len(n.args):
            return n.args[i]
        return n.kwargs.get(key, default) if key else default

    def val(self, x):
        """The example value of a node (a constant stays itself)."""
        return self.t.values[x] if isinstance(x, fx.Node) else x

    def shape(self, x):
        v = self.val(x)
        return tuple(v.shape) if isinstance(v, torch.Tensor) else None

    def const(self, x):
        """x as a Python number if it is one (or a node of constant value), else None."""
        v = self.val(x)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
        return None

    def dim(self, n, i, key="dim", default=None):
        """A dim argument made non-negative: for the rank of n's first input,
        or of n itself when that input is a list (torch.cat, torch.stack)."""
        d = self.arg(n, i, key, default)
        rank = len(self.shape(n.args[0]) if isinstance(n.args[0], fx.Node) else self.shape(n))
        return d + rank if isinstance(d, int) and d < 0 else d

    def param(self, n):
        """The tensor of a get_attr node (a parameter or buffer), else None."""
        if not isinstance(n, fx.Node) or n.op != "get_attr":
            return None
        obj = self.t.gm
        for part in n.target.split("."):
            obj = getattr(obj, part)
        return obj

    # ---- indexing spelled in several ways

    def index(self, n):
        """(base, index tuple) of `base[idx]` (getitem); None otherwise."""
        if not self.is_(n, "getitem"):
            return None
        idx = n.args[1]
        return n.args[0], idx if isinstance(idx, tuple) else (idx,)

    def unsqueezed(self, n):
        """(base, shape of base) when n only adds size-1 dims to base
        (x[:, None], x[..., None], x[:, None, None, :], x.unsqueeze(d)); else None."""
        if self.is_(n, "unsqueeze"):
            return n.args[0]
        ix = self.index(n)
        if ix is None or not any(i is None for i in ix[1]):
            return None
        if all(i is None or i is Ellipsis or (isinstance(i, slice) and i == slice(None)) for i in ix[1]):
            return ix[0]
        return None

    def strip_unsqueeze(self, n):
        while True:
            b = self.unsqueezed(n)
            if b is None:
                return n
            n = b

    @staticmethod
    def is_scale(value, dh):
        return value is not None and math.isclose(value, math.sqrt(dh), rel_tol=1e-12)
