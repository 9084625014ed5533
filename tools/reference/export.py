#!/usr/bin/python3
"""Exporter: define an `ikbo-model/1` model in PyTorch and write it as a model
version directory (model.json + weights.safetensors).

A model is its model.json dict (inputs, tables, ordered layer specs, output;
see shared/MODEL_FORMAT.md) plus one torch tensor per weight. `IkboModule`
turns such a spec into an nn.Module whose parameters are exactly the format's
weights (`<layer>.<param>`, `tables.<name>`) and whose forward is a batched,
differentiable implementation of the same semantics (used to train the demo
model; the per-candidate float64 interpreter in ikbo_ref.py stays the
independent check, and tests/golden/golden.py checks that the two agree).

    import export
    spec = {"format": "ikbo-model/1", "inputs": {...}, "tables": {...},
            "layers": [...], "output": {...}}
    m = export.IkboModule(spec, seed=0)            # params with default init
    with torch.no_grad(): m.param("top1.weight").mul_(0.5)   # or set your own
    logits = m(export.batch_from_request(m.plan, request))   # [C, T]
    export.save(m, "models/mymodel/1", dtype="F32")          # F32 | F16 | BF16

`write_model(dir, spec, tensors, dtype)` writes a spec with a plain
{name: tensor} dict instead. Both validate the written files by loading them
with the reference interpreter, so an exported model is a valid model.
"""
import copy
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ikbo_ref  # noqa: E402
import safetensors_io  # noqa: E402

DTYPES = ("F32", "F16", "BF16")


def _pkey(name):
    # nn.ParameterDict keys may not contain '.'; layer names never contain '__'
    # in practice, and the mapping is only internal.
    return name.replace(".", "__")


class IkboModule(torch.nn.Module):
    """nn.Module for a model.json spec; parameters named as in the format."""

    def __init__(self, spec, seed=None, dtype=torch.float32):
        super().__init__()
        self.spec = copy.deepcopy(spec)
        self.plan = ikbo_ref.analyze(self.spec, "spec")
        self._ops = {layer["name"]: layer["op"] for layer in self.spec["layers"]}
        gen = torch.Generator()
        gen.manual_seed(0 if seed is None else seed)
        self.params = torch.nn.ParameterDict()
        for name, shape in self.plan.param_shapes.items():
            self.params[_pkey(name)] = torch.nn.Parameter(self._init(name, shape, gen).to(dtype))

    def _init(self, name, shape, gen):
        """Default init (PyTorch-like); callers may overwrite any parameter."""
        layer, param = name.rsplit(".", 1)
        op = None if name.startswith("tables.") else self._ops[layer]
        if name.startswith("tables.") or param in ("action", "position"):
            return torch.randn(shape, generator=gen) * 0.05
        if op == "layer_norm":                      # near the identity, as nn.LayerNorm starts
            base = 1.0 if param == "weight" else 0.0
            return base + (torch.rand(shape, generator=gen) * 2 - 1) * 0.1
        if op == "cross":                           # DCNv2: fan-in F for W, u @ v, b
            f = shape[0]
            return (torch.rand(shape, generator=gen) * 2 - 1) / math.sqrt(f)
        if op == "din_attention":                   # w1/b1 and w2/b2 as two nn.Linear
            fan_in = self.plan.param_shapes[layer + (".w1" if param in ("w1", "b1") else ".w2")][1]
            return (torch.rand(shape, generator=gen) * 2 - 1) / math.sqrt(fan_in)
        if param in ("weight", "bias"):
            fan_in = self.plan.param_shapes[layer + ".weight"][1]
            bound = 1.0 / math.sqrt(fan_in)
            return (torch.rand(shape, generator=gen) * 2 - 1) * bound
        if param in ("w_user", "w_cand"):
            k = self.plan.param_shapes[layer + ".w_user"][1] + self.plan.param_shapes[layer + ".w_cand"][1]
            return torch.randn(shape, generator=gen) / math.sqrt(k)
        # attention projections wq wk wv [H*dh, D], wo [D, H*dh]
        return torch.randn(shape, generator=gen) / math.sqrt(shape[1])

    def param(self, name):
        """The parameter of format weight `name` (e.g. "top1.weight")."""
        return self.params[_pkey(name)]

    def tensors(self):
        """{format weight name: detached tensor}."""
        return {name: self.param(name).detach() for name in self.plan.param_shapes}

    def forward(self, batch):
        """Batched forward at candidate batch size (user features broadcast).

        batch (see batch_from_request), B rows:
          "user.dense" [B, Fu], "candidate.dense" [B, Fc]     float
          "<side>.sparse.<f>": (ids int64 [B, n], mask bool [B, n])  padded bags
          "user.history": (ids int64 [B, L], actions int64 [B, L], mask bool [B, L])
              the most recent <= max_len events, oldest first, left-aligned
        returns logits [B, T]. Every tensor has B rows, so a user operand of a
        candidate op is already broadcast: a "planning": "auto" model's mixed
        ops (MODEL_FORMAT.md, "Automatic planning") need nothing more."""
        env = {}
        P = self.param

        def get(r):
            return env[r] if r in env else batch[r]

        for layer in self.plan.layers:
            op, name = layer["op"], layer["name"]
            if op == "embedding_bag":
                ids, mask = get(layer["input"])
                table = P("tables." + layer["table"])
                e = table[torch.remainder(ids, table.shape[0])] * mask.unsqueeze(-1).to(table.dtype)
                y = e.sum(1)
                if layer["pooling"] == "mean":
                    y = y / mask.sum(1, keepdim=True).clamp(min=1).to(y.dtype)
            elif op == "history_embedding":
                ids, acts, mask = get(layer["input"])
                table = P("tables." + layer["table"])
                L = ids.shape[1]
                e = (table[torch.remainder(ids, table.shape[0])] + P(name + ".action")[acts]
                     + P(name + ".position")[:L].unsqueeze(0))
                y = (e * mask.unsqueeze(-1).to(e.dtype), mask)
            elif op == "mean_pool":
                x, mask = get(layer["input"])            # padding need not be zero (after linear)
                y = (x * mask.unsqueeze(-1).to(x.dtype)).sum(1) / mask.sum(1, keepdim=True).clamp(min=1).to(x.dtype)
            elif op == "linear":                       # last dim of [F], [K, F] or jagged
                y = _on_values(get(layer["input"]), lambda x: _activate(
                    F.linear(x, P(name + ".weight"), P(name + ".bias")), layer.get("activation", "none")))
            elif op == "reshape":
                x = get(layer["input"])
                y = x.reshape(x.shape[0], layer["tokens"], -1)
            elif op == "stack":
                y = torch.cat([v.unsqueeze(1) if v.dim() == 2 else v
                               for v in (get(r) for r in layer["inputs"])], dim=1)
            elif op == "flatten":
                x = get(layer["input"])
                y = x.reshape(x.shape[0], -1)
            elif op == "target_attention":
                q = get(layer["query"])
                q = q.unsqueeze(1) if q.dim() == 2 else q           # a [D] query is one token
                h, mask = get(layer["history"])
                B, tq, _ = q.shape
                wn, H, dh = ikbo_ref.attention_params(self.plan, layer)   # own or shared_with weights
                Q = F.linear(q, P(wn + ".wq")).reshape(B, tq, H, dh).transpose(1, 2)
                K = F.linear(h, P(wn + ".wk")).reshape(B, -1, H, dh).transpose(1, 2)
                V = F.linear(h, P(wn + ".wv")).reshape(B, -1, H, dh).transpose(1, 2)
                m = mask[:, None, None, :]
                S = (Q @ K.transpose(-1, -2) / math.sqrt(dh)).masked_fill(~m, -1e30)
                # Rows with no events get a uniform softmax zeroed by the mask:
                # L = 0 -> zero output, without NaN in forward or backward.
                A = torch.softmax(S, dim=-1) * m.to(S.dtype)
                O = (A @ V).transpose(1, 2).reshape(B, tq, H * dh)
                y = F.linear(O, P(wn + ".wo"))
            elif op == "lce":
                eu, ec = get(layer["user"]), get(layer["candidate"])
                eu = eu.unsqueeze(1) if eu.dim() == 2 else eu       # a [D] operand is one token
                ec = ec.unsqueeze(1) if ec.dim() == 2 else ec
                y = (torch.einsum("mk,bkd->bmd", P(name + ".w_user"), eu)
                     + torch.einsum("mk,bkd->bmd", P(name + ".w_cand"), ec))
            elif op in ("add", "mul"):
                a, b = ikbo_ref.add_operands(layer)
                va, vb = get(a), get(b)
                f = torch.add if op == "add" else torch.mul
                y = (f(va[0], vb[0]), va[1]) if isinstance(va, tuple) else f(va, vb)
            else:
                y = _ranking_op(layer, get, P)
            env[name] = y
        return env[self.plan.logits]


def _activate(y, act):
    if act == "relu":
        return torch.relu(y)
    if act == "sigmoid":
        return torch.sigmoid(y)
    if act == "gelu":
        return F.gelu(y)                            # exact (erf) form by default
    if act == "silu":
        return F.silu(y)
    if act == "tanh":
        return torch.tanh(y)
    return y


def _on_values(v, f):
    """f applied to a tensor, or to the values of a jagged (values, mask) pair."""
    return (f(v[0]), v[1]) if isinstance(v, tuple) else f(v)


def _tok(v):
    return v.unsqueeze(1) if v.dim() == 2 else v   # a [B, D] vector is one token


def _ranking_op(layer, get, P):
    """The ranking-architecture ops, batched over B candidate rows."""
    op, name = layer["op"], layer["name"]
    if op == "activation":
        return _on_values(get(layer["input"]), lambda x: _activate(x, layer["fn"]))
    if op == "layer_norm":
        x = get(layer["input"])
        w, b = P(name + ".weight"), P(name + ".bias")
        return _on_values(x, lambda t: F.layer_norm(t, (t.shape[-1],), w, b, layer.get("eps", 1e-5)))
    if op == "concat":
        return torch.cat([get(r) for r in layer["inputs"]], dim=1)
    if op == "token_linear":
        return torch.einsum("mk,bkd->bmd", P(name + ".weight"), _tok(get(layer["input"])))
    if op == "dot_interaction":
        t = torch.cat([_tok(get(r)) for r in layer["inputs"]], dim=1)
        k = t.shape[1]
        i, j = torch.triu_indices(k, k, 0 if layer.get("self", False) else 1)
        return torch.bmm(t, t.transpose(1, 2))[:, i, j]
    if op == "cross":
        x0, x = get(layer["x0"]), get(layer["input"])
        if "rank" in layer:
            wx = F.linear(F.linear(x, P(name + ".v")), P(name + ".u"), P(name + ".bias"))
        else:
            wx = F.linear(x, P(name + ".weight"), P(name + ".bias"))
        return x0 * wx + x
    if op == "mixture":
        g = torch.softmax(get(layer["gate"]), dim=1)
        ex = torch.stack([get(r) for r in layer["experts"]], dim=1)   # [B, E, F]
        return (g.unsqueeze(-1) * ex).sum(1)
    if op == "pool":
        v = get(layer["input"])
        x, mask = v if isinstance(v, tuple) else (v, torch.ones(v.shape[:2], dtype=torch.bool))
        if x.shape[1] == 0:                                         # every history of the batch empty
            return x.new_zeros((x.shape[0], x.shape[2]))
        m = mask.unsqueeze(-1).to(x.dtype)
        n = mask.sum(1, keepdim=True)
        fn = layer["fn"]
        if fn == "sum":
            return (x * m).sum(1)
        if fn == "mean":
            return (x * m).sum(1) / n.clamp(min=1).to(x.dtype)
        if fn == "max":
            y = x.masked_fill(~mask.unsqueeze(-1), float("-inf")).max(1).values
            return torch.where(n > 0, y, torch.zeros_like(y))
        last = (n.squeeze(1) - 1).clamp(min=0)                      # left-aligned events
        y = x[torch.arange(x.shape[0]), last]
        return torch.where(n > 0, y, torch.zeros_like(y))
    if op == "self_attention":
        h, mask = get(layer["input"])
        B, L, _ = h.shape
        H, dh = layer["heads"], layer["head_dim"]
        Q = F.linear(h, P(name + ".wq")).reshape(B, L, H, dh).transpose(1, 2)
        K = F.linear(h, P(name + ".wk")).reshape(B, L, H, dh).transpose(1, 2)
        V = F.linear(h, P(name + ".wv")).reshape(B, L, H, dh).transpose(1, 2)
        S = Q @ K.transpose(-1, -2) / math.sqrt(dh)                   # [B, H, L, L]
        keep = mask[:, None, None, :]                                  # real keys (left-aligned)
        if layer.get("causal", True):
            keep = keep & torch.ones((L, L), dtype=torch.bool).tril()
        if layer.get("kind", "softmax") == "softmax":
            # Padded query rows keep a finite (unused) output; no NaN anywhere.
            A = torch.softmax(S.masked_fill(~keep, -1e30), dim=-1) * keep.to(S.dtype)
        else:                                                          # silu / n_u (the user's event count)
            n = mask.sum(1).clamp(min=1).to(S.dtype)[:, None, None, None]
            A = F.silu(S) * keep.to(S.dtype) / n
        O = (A @ V).transpose(1, 2).reshape(B, L, H * dh)
        return (F.linear(O, P(name + ".wo")), mask)
    if op == "din_attention":
        q = get(layer["query"])
        h, mask = get(layer["history"])
        qe = q.unsqueeze(1).expand_as(h)
        x = torch.cat([qe, h, qe - h, qe * h], dim=-1)                 # [B, L, 4D]
        z = _activate(F.linear(x, P(name + ".w1"), P(name + ".b1")), layer.get("activation", "relu"))
        s = F.linear(z, P(name + ".w2"), P(name + ".b2")).squeeze(-1)  # [B, L]
        m = mask.to(s.dtype)
        if layer.get("normalize", "softmax") == "softmax":
            a = torch.softmax(s.masked_fill(~mask, -1e30), dim=1) * m   # L = 0 -> zeros
        else:
            a = s * m
        return (a.unsqueeze(-1) * h).sum(1)
    raise AssertionError(op)


def batch_from_request(plan, request, dtype=torch.float64):
    """RankRequest dict -> the batch of IkboModule.forward (one row per
    candidate, in request order, user features copied to each row)."""
    users, cands = ikbo_ref.parse_request(plan, request)
    B = len(cands)
    batch = {}
    if plan.user_dense:
        batch["user.dense"] = torch.stack([users[c["user"]]["dense"] for c in cands]).to(dtype).reshape(B, -1)
    if plan.cand_dense:
        batch["candidate.dense"] = torch.stack([c["dense"] for c in cands]).to(dtype).reshape(B, -1)

    def pad(rows):
        n = max([len(r) for r in rows] + [0])
        ids = torch.zeros((B, n), dtype=torch.int64)
        mask = torch.zeros((B, n), dtype=torch.bool)
        for b, r in enumerate(rows):
            ids[b, :len(r)] = torch.tensor(r, dtype=torch.int64)
            mask[b, :len(r)] = True
        return ids, mask

    for f in plan.user_sparse:
        batch["user.sparse." + f] = pad([users[c["user"]]["sparse"][f] for c in cands])
    for f in plan.cand_sparse:
        batch["candidate.sparse." + f] = pad([c["sparse"][f] for c in cands])
    if plan.history:
        ids, mask = pad([users[c["user"]]["hist_ids"] for c in cands])
        acts, _ = pad([users[c["user"]]["hist_actions"] for c in cands])
        batch["user.history"] = (ids, acts, mask)
    return batch


def score_request(model, request):
    """RankRequest dict -> {"scores", "task_scores"} (ikbo_ref.score_request's
    form) from the batched IkboModule in float64 with the weights of an
    ikbo_ref.Model: the fast reference for large requests."""
    m = IkboModule(model.spec, dtype=torch.float64)
    with torch.no_grad():
        for n, t in model.w.items():
            m.param(n).copy_(t)
        p = torch.sigmoid(m(batch_from_request(model.plan, request)))
    sw = torch.tensor(model.plan.score_weights, dtype=torch.float64)
    return {"scores": (p * sw).sum(1).tolist(), "task_scores": p.tolist()}


def _fmt(v, indent, key=None):
    """Compact pretty JSON: a value fitting on its line stays on one line;
    every layer spec is one line, as in MODEL_FORMAT.md."""
    one = json.dumps(v)
    if not isinstance(v, (dict, list)) or not v or len(one) + indent <= 96:
        return one
    pad = " " * (indent + 2)
    if isinstance(v, list):
        if key == "layers":
            return "[\n" + ",\n".join(pad + json.dumps(x) for x in v) + "\n" + " " * indent + "]"
        return "[\n" + ",\n".join(pad + _fmt(x, indent + 2) for x in v) + "\n" + " " * indent + "]"
    return ("{\n" + ",\n".join("%s%s: %s" % (pad, json.dumps(k), _fmt(x, indent + 2, k)) for k, x in v.items())
            + "\n" + " " * indent + "}")


def format_model_json(spec):
    """model.json text, keys in the order of MODEL_FORMAT.md's example."""
    order = ["format", "name", "description", "planning", "inputs", "tables", "layers", "output", "serving"]
    keys = [k for k in order if k in spec] + [k for k in spec if k not in order]
    return _fmt({k: spec[k] for k in keys}, 0) + "\n"


def write_model(out_dir, spec, tensors, dtype="F32", metadata=None):
    """Writes out_dir/model.json and out_dir/weights.safetensors and validates
    them with the reference loader; returns the loaded ikbo_ref.Model."""
    if dtype not in DTYPES:
        raise ValueError("dtype must be one of %s" % ", ".join(DTYPES))
    plan = ikbo_ref.analyze(spec, "spec")
    missing = set(plan.param_shapes) - set(tensors)
    extra = set(tensors) - set(plan.param_shapes)
    if missing or extra:
        raise ValueError("weights do not match the spec: missing %s, extra %s" % (sorted(missing), sorted(extra)))
    for n, shape in plan.param_shapes.items():
        if tuple(tensors[n].shape) != tuple(shape):
            raise ValueError("weight %s has shape %s, expected %s" % (n, list(tensors[n].shape), list(shape)))
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "model.json"), "w") as f:
        f.write(format_model_json(spec))
    meta = {"format": "pt", "producer": "ikbo-serve tools/reference/export.py"}
    meta.update(metadata or {})
    safetensors_io.save(os.path.join(out_dir, "weights.safetensors"), tensors, dtype=dtype, metadata=meta)
    return ikbo_ref.load_model(out_dir)


def save(module, out_dir, dtype="F32", metadata=None):
    """Writes an IkboModule as a model version directory."""
    return write_model(out_dir, module.spec, module.tensors(), dtype=dtype, metadata=metadata)
