"""torch.fx tracing of a ranking module for the importer (ikbo_import.py).

Why this file exists: torch.fx's symbolic tracer is the front end the
importer is specified with, but Debian's torch 1.13 on Python 3.11 cannot
trace code ranking models are written with: it cannot unpack a Proxy
(`ids, offsets = sparse[f]`, `U, L = ids.shape`: its bytecode check predates
3.11's instruction offsets) and factory functions given traced sizes
(`torch.arange(L)`, `torch.triu_indices(K, K, 1)`) reject a Proxy. This
tracer fixes both, keeps the layers the model format has (nn.Linear,
nn.EmbeddingBag, nn.Embedding, nn.LayerNorm, the activations) as leaf calls,
records each node's source line, and runs the graph once on example inputs
so every node has a concrete value (shapes for the converter).

Not thread-safe: `trace` patches torch's factory functions while it runs.
"""
import contextlib
import dis
import inspect
import os
import re
import traceback

import torch
import torch.fx as fx
import torch.nn as nn

LEAF_MODULES = (nn.Linear, nn.EmbeddingBag, nn.Embedding, nn.LayerNorm,
                nn.ReLU, nn.GELU, nn.SiLU, nn.Tanh, nn.Sigmoid)
# torch functions that take sizes (ints) a traced module computes from shapes
FACTORIES = ("arange", "ones", "zeros", "full", "eye", "triu_indices", "tril_indices")
_FX_DIR = os.path.dirname(fx.__file__)
_TORCH_DIR = os.path.dirname(torch.__file__)
_HERE = os.path.abspath(__file__)


class UnsupportedNode(ValueError):
    """A node of the traced graph the importer cannot express; the message
    names the node and the source line it came from."""

    def __init__(self, node, why):
        self.node, self.why = node, why
        super().__init__("node %r (%s %s) at %s: %s" % (node.name, node.op, target_name(node), source(node), why))


def target_name(node):
    t = node.target
    if isinstance(t, str):
        return t
    return getattr(t, "__name__", str(t))


def source(node):
    """'file.py:LINE `code`' of the user code that created the node, or '?'."""
    st = getattr(node, "stack_trace", None) or ""
    frames = re.findall(r'File "([^"]+)", line (\d+), in \S+\n\s*(.*)', st)
    frames = [f for f in frames if not f[0].startswith(_TORCH_DIR) and os.path.abspath(f[0]) != _HERE]  # fx, overrides, this tracer
    if not frames:
        return "?"
    path, line, code = frames[0]                      # innermost first
    return "%s:%s `%s`" % (os.path.basename(path), line, code.strip())


class _Tracer(fx.Tracer):
    """Records each node's stack itself, innermost frame first, the same on
    every torch: fx's own recording differs (torch 1.13 keeps every user
    frame innermost first; torch 2.x keeps only the frames of functions
    named `forward`, outermost first, so a node made in a helper method
    would point at its caller)."""

    def is_leaf_module(self, m, qualname):
        return isinstance(m, LEAF_MODULES)

    def create_proxy(self, *args, **kwargs):
        proxy = super().create_proxy(*args, **kwargs)
        stack = traceback.StackSummary.extract(traceback.walk_stack(None))
        proxy.node.stack_trace = "".join(stack.format())
        return proxy



def _proxy_iter(proxy):
    """Proxy.__iter__ for `a, b = proxy`: the caller's frame is at an
    UNPACK_SEQUENCE of n (torch 1.13 reads the instruction at f_lasti // 2,
    which Python 3.11's offsets break); anything else is fx's TraceError."""
    f = inspect.currentframe().f_back
    while f is not None and f.f_code.co_filename.startswith(_FX_DIR):
        f = f.f_back
    if f is not None:
        for inst in dis.get_instructions(f.f_code):
            if inst.offset == f.f_lasti and inst.opname == "UNPACK_SEQUENCE":
                return iter([proxy[i] for i in range(inst.argval)])
    return proxy.tracer.iter(proxy)


def _has_proxy(v):
    if isinstance(v, fx.Proxy):
        return True
    if isinstance(v, (list, tuple)):
        return any(_has_proxy(x) for x in v)
    if isinstance(v, dict):
        return any(_has_proxy(x) for x in v.values())
    return False


@contextlib.contextmanager
def _tracing_patches():
    saved = {n: getattr(torch, n) for n in FACTORIES}
    saved_iter = fx.Proxy.__iter__

    def wrap(fn):
        def call(*args, **kwargs):
            if _has_proxy(args) or _has_proxy(kwargs):
                p = next(x for x in list(args) + list(kwargs.values()) if _has_proxy(x))
                while not isinstance(p, fx.Proxy):
                    p = next(x for x in p if _has_proxy(x))
                return p.tracer.create_proxy("call_function", fn, args, kwargs)
            return fn(*args, **kwargs)
        return call

    try:
        for n, fn in saved.items():
            setattr(torch, n, wrap(fn))
        fx.Proxy.__iter__ = _proxy_iter
        yield
    finally:
        fx.Proxy.__iter__ = saved_iter
        for n, fn in saved.items():
            setattr(torch, n, fn)


class _Recorder(fx.Interpreter):
    def __init__(self, gm):
        super().__init__(gm)
        self.values = {}

    def run_node(self, n):
        v = super().run_node(n)
        self.values[n] = v
        return v


class Traced:
    """The graph module, its nodes in order, each node's value on the
    example inputs, and the parameters by qualified name."""

    def __init__(self, module, gm, values):
        self.module, self.gm, self.values = module, gm, values
        self.nodes = list(gm.graph.nodes)
        self.modules = dict(gm.named_modules())
        self.placeholders = [n for n in self.nodes if n.op == "placeholder"]
        self.output = next(n for n in self.nodes if n.op == "output")


def trace(module, example_args):
    """Traces `module` and runs it once on `example_args` (no grad)."""
    tracer = _Tracer()
    with _tracing_patches():
        try:
            graph = tracer.trace(module)
        except Exception as e:
            raise ValueError("torch.fx could not trace %s.forward: %s: %s" % (type(module).__name__,
                                                                           type(e).__name__, e)) from e
    gm = fx.GraphModule(tracer.root, graph)
    rec = _Recorder(gm)
    if sum(n.op == "placeholder" for n in graph.nodes) != len(example_args):
        return Traced(module, gm, rec.values)       # not run: the converter names the forward() convention
    with torch.no_grad():
        try:
            rec.run(*example_args)
        except Exception as e:
            raise ValueError("%s.forward failed on the example inputs: %s: %s" % (
                type(module).__name__, type(e).__name__, (str(e).splitlines() or [""])[0])) from e
    return Traced(module, gm, rec.values)
