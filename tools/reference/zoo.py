#!/usr/bin/python3
"""The reference ranking models - DLRM, DCNv2, MMoE and the sequence models
SeqModel (transformer) and HSTUModel - as PyTorch modules written the usual
way, and their conversion to `ikbo-model/1`.

    zoo.py export MODEL OUT_DIR [--seed S]     # MODEL: dlrm, dcn, mmoe, seq, hstu
    zoo.py check MODEL_DIR [--requests N]      # module vs reference interpreter

Each module takes the features a feed service has - user dense and sparse
features, candidate dense and sparse features - and the candidate -> user
index, and does what PyTorch ranking code does: user tensors are broadcast to
the candidates with `u[cand_user]` before they meet candidate tensors. The
converters write the equivalent model.json by hand (no tracing: that is the
automatic importer of a later issue), with every user-only computation in the
user domain and the meeting points expressed with the ops that read user rows
through the map:
  - DLRM's dot interaction over [user vectors, candidate vectors] is
    `dot_interaction` over user and candidate inputs directly;
  - a `torch.cat([u[cand_user], c])` consumed by an nn.Linear is the same
    linear split by columns: `linear(u)` at U (bias-free) `add`ed through the
    map to `linear(c)` at C;
  - DCNv2's cross network needs x0 = cat(u[cand_user], c) itself; it is
    written exactly as two zero-padded placements (`linear` with a 0/1
    weight, no bias) added through the map: x * 1 + 0 * y is exact in
    floating point;
  - the sequence models take the history as a padded (ids, actions,
    lengths) batch per user (nn.Embedding for items - the candidates' item
    table, shared -, actions and positions); their transformer blocks
    (nn.LayerNorm, bias-free nn.Linear q/k/v/o, explicit q k^T with a causal
    mask) are `layer_norm`, `self_attention`, `add`, `linear` at U; the
    candidates' target attention over `K = wk(ln1(h))[cand_user]` with the
    first block's projections is `target_attention` `shared_with` that
    block's `self_attention`; DIN pooling over `h[cand_user]` is
    `din_attention`.
`export` writes random weights (seeded, PyTorch default init, the logits
calibrated so that scores do not saturate); the shipped models are trained
by train_zoo.py, which uses export_module. `check` draws random requests (make_request.py) and
compares the module's float64 scores with the interpreter's on the exported
directory (pass: <= 1e-12 relative).
"""
import argparse
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export  # noqa: E402
import ikbo_ref  # noqa: E402
import make_request  # noqa: E402

USER_SPARSE = {"country": 64, "lang": 16}
CAND_SPARSE = {"item": 5000, "author": 500}
USER_DENSE, CAND_DENSE, D = 8, 4, 16
W = 1               # hidden-width multiplier
HIST_MAX_LEN, HIST_ACTIONS = 32, 4     # the sequence models' history (the demo's actions; max_len 64 there)


ATT_HEAD_DIM, DIN_HIDDEN = 8, 16      # the sequence models' attention head size, DIN's hidden units


def bench_scale():
    """The same architectures at a GPU-bound scale (bench/RESULTS.md): 4 user
    and 8 candidate sparse features of 4000 rows, width 64, dense 32/16,
    hidden layers 8x wider; the sequence models over 512-event histories
    with 2 heads of 64 and DIN hidden 64. Not shipped: written on the GPU
    machine."""
    global USER_SPARSE, CAND_SPARSE, USER_DENSE, CAND_DENSE, D, W, HIST_MAX_LEN, ATT_HEAD_DIM, DIN_HIDDEN
    USER_SPARSE = {"u%d" % i: 4000 for i in range(4)}
    CAND_SPARSE = {"c%d" % i: 4000 for i in range(8)}
    USER_DENSE, CAND_DENSE, D, W = 32, 16, 64, 8
    HIST_MAX_LEN, ATT_HEAD_DIM, DIN_HIDDEN = 512, 64, 64


class _Features(nn.Module):
    """Embedding bags of the user and candidate sparse features."""

    def __init__(self):
        super().__init__()
        self.user_emb = nn.ModuleDict({f: nn.EmbeddingBag(n, D, mode="sum") for f, n in USER_SPARSE.items()})
        self.cand_emb = nn.ModuleDict({f: nn.EmbeddingBag(n, D, mode="sum") for f, n in CAND_SPARSE.items()})

    @staticmethod
    def bag(emb, ids_offsets):
        ids, offsets = ids_offsets
        return emb(ids % emb.num_embeddings, offsets)   # the format's row rule

    def user(self, sparse):
        return [self.bag(self.user_emb[f], sparse[f]) for f in USER_SPARSE]

    def cand(self, sparse):
        return [self.bag(self.cand_emb[f], sparse[f]) for f in CAND_SPARSE]


class DLRM(_Features):
    """Bottom MLPs, pairwise dot interaction of all vectors, top MLP."""

    def __init__(self, tasks=2):
        super().__init__()
        self.user_bottom = nn.Sequential(nn.Linear(USER_DENSE, 32 * W), nn.ReLU(), nn.Linear(32 * W, D), nn.ReLU())
        self.cand_bottom = nn.Sequential(nn.Linear(CAND_DENSE, 32 * W), nn.ReLU(), nn.Linear(32 * W, D), nn.ReLU())
        k = 2 + len(USER_SPARSE) + len(CAND_SPARSE)
        self.top = nn.Sequential(nn.Linear(k * (k - 1) // 2 + D, 64 * W), nn.ReLU(), nn.Linear(64 * W, tasks))

    def forward(self, user_dense, user_sparse, cand_dense, cand_sparse, cand_user):
        u = torch.stack([self.user_bottom(user_dense)] + self.user(user_sparse), dim=1)
        cb = self.cand_bottom(cand_dense)
        c = torch.stack([cb] + self.cand(cand_sparse), dim=1)
        t = torch.cat([u[cand_user], c], dim=1)                    # [C, K, D]
        z = torch.bmm(t, t.transpose(1, 2))
        i, j = torch.triu_indices(t.shape[1], t.shape[1], 1)
        return self.top(torch.cat([z[:, i, j], cb], dim=1))


class DCNv2(_Features):
    """Cross network (full rank, low rank, full rank) with layer norms beside
    a deep tower, over x0 = [user features, candidate features]."""

    def __init__(self, tasks=2, rank=8):
        super().__init__()
        fu, fc = len(USER_SPARSE) * D + USER_DENSE, len(CAND_SPARSE) * D + CAND_DENSE
        self.f = f = fu + fc
        self.cross_w = nn.ModuleList([nn.Linear(f, f), nn.Linear(f, f)])
        self.cross_v = nn.Linear(f, rank, bias=False)
        self.cross_u = nn.Linear(rank, f)
        self.norm = nn.ModuleList([nn.LayerNorm(f), nn.LayerNorm(f)])
        self.deep = nn.Sequential(nn.Linear(f, 64 * W), nn.GELU(), nn.Linear(64 * W, 32 * W), nn.SiLU())
        self.head = nn.Linear(f + 32 * W, tasks)

    def forward(self, user_dense, user_sparse, cand_dense, cand_sparse, cand_user):
        xu = torch.cat(self.user(user_sparse) + [user_dense], dim=1)
        xc = torch.cat(self.cand(cand_sparse) + [cand_dense], dim=1)
        x0 = torch.cat([xu[cand_user], xc], dim=1)
        x = self.norm[0](x0 * self.cross_w[0](x0) + x0)
        x = self.norm[1](x0 * self.cross_u(self.cross_v(x)) + x)
        x = x0 * self.cross_w[1](x) + x
        return self.head(torch.cat([x, self.deep(x0)], dim=1))


class MMoE(_Features):
    """Shared bottom over [user, candidate] features, 4 experts, a softmax gate
    and a tower per task (click, like), task logits concatenated."""

    def __init__(self, tasks=2, experts=4):
        super().__init__()
        fu, fc = len(USER_SPARSE) * D + USER_DENSE, len(CAND_SPARSE) * D + CAND_DENSE
        self.fu = fu
        self.bottom = nn.Linear(fu + fc, 64 * W)
        self.experts = nn.ModuleList([nn.Sequential(nn.Linear(64 * W, 32 * W), nn.ReLU(), nn.Linear(32 * W, 16 * W),
                                                    nn.ReLU()) for _ in range(experts)])
        self.gates = nn.ModuleList([nn.Linear(64 * W, experts) for _ in range(tasks)])
        self.towers = nn.ModuleList([nn.Sequential(nn.Linear(16 * W, 16 * W), nn.SiLU(), nn.Linear(16 * W, 1))
                                     for _ in range(tasks)])

    def forward(self, user_dense, user_sparse, cand_dense, cand_sparse, cand_user):
        xu = torch.cat(self.user(user_sparse) + [user_dense], dim=1)
        xc = torch.cat(self.cand(cand_sparse) + [cand_dense], dim=1)
        h = torch.relu(self.bottom(torch.cat([xu[cand_user], xc], dim=1)))
        ex = torch.stack([e(h) for e in self.experts], dim=1)     # [C, E, F]
        out = []
        for gate, tower in zip(self.gates, self.towers):
            g = F.softmax(gate(h), dim=1)
            out.append(tower((g.unsqueeze(-1) * ex).sum(1)))
        return torch.cat(out, dim=1)


class _Heads:
    """Mixin: multi-head attention helpers for a module with `heads`, `dh` and
    bias-free nn.Linear `wq`, `wk`, `wv` (D -> H*dh) and `wo` (H*dh -> D)
    (_Block here, plain_models.TargetAttention)."""

    def split(self, x):                                  # [N, T, H*dh] -> [N, H, T, dh]
        return x.reshape(x.shape[0], x.shape[1], self.heads, self.dh).transpose(1, 2)

    def target(self, q, a, mask):
        """Candidates' queries q [C, Tq, D] over their users' (padded)
        history a [C, L, D] (mask [C, L]); softmax, no causal mask; a user
        without events gives zeros."""
        C, tq, _ = q.shape
        s = self.split(self.wq(q)) @ self.split(self.wk(a)).transpose(-1, -2) / math.sqrt(self.dh)
        m = mask[:, None, None, :]
        att = F.softmax(s.masked_fill(~m, -1e30), dim=-1) * m
        return self.wo((att @ self.split(self.wv(a))).transpose(1, 2).reshape(C, tq, -1))


class _Block(_Heads, nn.Module):
    """Pre-LN transformer block over a padded, left-aligned history [U, L, D]:
    x + attn(ln1(x)), then + ff2(act(ff1(ln2(.)))). Causal; attention
    `softmax` or HSTU's `silu` (pointwise silu(q.k/sqrt(dh)) / n_u)."""

    def __init__(self, kind, heads, head_dim, ff, ff_act):
        super().__init__()
        self.kind, self.heads, self.dh = kind, heads, head_dim
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.wq, self.wk, self.wv = (nn.Linear(D, heads * head_dim, bias=False) for _ in range(3))
        self.wo = nn.Linear(heads * head_dim, D, bias=False)
        self.ff1, self.ff2 = nn.Linear(D, ff), nn.Linear(ff, D)
        self.ff_act = ff_act

    def attention(self, a, mask):
        U, L, _ = a.shape
        q, k, v = self.split(self.wq(a)), self.split(self.wk(a)), self.split(self.wv(a))
        s = q @ k.transpose(-1, -2) / math.sqrt(self.dh)                    # [U, H, L, L]
        keep = mask[:, None, None, :] & torch.ones(L, L, dtype=torch.bool).tril()
        if self.kind == "softmax":
            att = F.softmax(s.masked_fill(~keep, -1e30), dim=-1) * keep
        else:
            n = mask.sum(1).clamp(min=1)[:, None, None, None]
            att = F.silu(s) * keep / n
        return self.wo((att @ v).transpose(1, 2).reshape(U, L, -1))

    # target(q, a, mask) (_Heads): the candidates' queries over their users' ln1(history)
    # with this block's projections.

    def forward(self, x, mask):
        a = self.ln1(x)
        x = x + self.attention(a, mask)
        return x + self.ff2(self.ff_act(self.ff1(self.ln2(x)))), a


class _SeqBase(_Features):
    """A sequence ranking model over the user's history (item + action +
    position embeddings; the item table is the candidates' `item` table):
    transformer block(s), the last event's output as the user's sequence
    vector; a target attention of the candidate's item over the first
    block's ln1(history) with that block's own attention weights; DIN
    pooling of the raw history embeddings by the candidate's item; a top
    MLP over [user features, candidate features]."""
    KIND, BLOCKS, FF_ACT = "softmax", 1, "gelu"

    def __init__(self, tasks=2, heads=2, head_dim=None, din_hidden=None):
        super().__init__()
        head_dim = head_dim or ATT_HEAD_DIM
        din_hidden = din_hidden or DIN_HIDDEN
        first = list(CAND_SPARSE)[0]                                    # "item" (the bench scale: "c0")
        self.hist_item = nn.Embedding(CAND_SPARSE[first], D)
        self.hist_item.weight = self.cand_emb[first].weight             # one table
        self.hist_action = nn.Embedding(HIST_ACTIONS, D)
        self.hist_pos = nn.Embedding(HIST_MAX_LEN, D)
        act = nn.GELU() if self.FF_ACT == "gelu" else nn.SiLU()
        self.blocks = nn.ModuleList([_Block(self.KIND, heads, head_dim, 2 * D, act) for _ in range(self.BLOCKS)])
        self.user_dense = nn.Linear(USER_DENSE, D)
        self.cand_dense = nn.Linear(CAND_DENSE, D)
        self.din = nn.Sequential(nn.Linear(4 * D, din_hidden), nn.ReLU(), nn.Linear(din_hidden, 1))
        self.fu = (2 + len(USER_SPARSE)) * D
        fc = (6 + len(CAND_SPARSE)) * D
        self.top = nn.Sequential(nn.Linear(self.fu + fc, 64 * W), nn.ReLU(), nn.Linear(64 * W, tasks))

    def forward(self, user_dense, user_sparse, cand_dense, cand_sparse, cand_user, history):
        ids, acts, lens = history                   # [U, L] oldest first, left-aligned; [U]
        U, L = ids.shape
        mask = torch.arange(L)[None, :] < lens[:, None]
        h = self.hist_item(ids % self.hist_item.num_embeddings) + self.hist_action(acts) + self.hist_pos.weight[:L]
        x, a0 = h, None
        for blk in self.blocks:
            x, a = blk(x, mask)
            a0 = a if a0 is None else a0
        last = x[torch.arange(U), (lens - 1).clamp(min=0)] * (lens > 0)[:, None]
        u = torch.cat([last] + self.user(user_sparse) + [torch.relu(self.user_dense(user_dense))], dim=1)
        c_parts = self.cand(cand_sparse)
        item = c_parts[0]
        cm = mask[cand_user]
        ta = self.blocks[0].target(item[:, None], a0[cand_user], cm)[:, 0]
        hc = h[cand_user]                                                   # [C, L, D]
        qe = item[:, None].expand_as(hc)
        s = self.din(torch.cat([qe, hc, qe - hc, qe * hc], dim=-1)).squeeze(-1)
        w = F.softmax(s.masked_fill(~cm, -1e30), dim=1) * cm
        din = (w[..., None] * hc).sum(1)
        # the candidate's item against the user's sequence: attention outputs and products
        c = torch.cat(c_parts + [torch.relu(self.cand_dense(cand_dense)), ta, din, ta * item, din * item,
                                 last[cand_user] * item], dim=1)
        return self.top(torch.cat([u[cand_user], c], dim=1))


class SeqModel(_SeqBase):
    """One pre-LN transformer block (softmax attention, 2 heads x 8, causal,
    gelu feed-forward 32)."""
    KIND, BLOCKS, FF_ACT = "softmax", 1, "gelu"


class HSTUModel(_SeqBase):
    """HSTU-style: two pre-LN blocks of pointwise silu attention normalised
    by the user's event count (causal), silu feed-forward."""
    KIND, BLOCKS, FF_ACT = "silu", 2, "silu"


# ------------------------------------------------------------ conversion

def _inputs(history=False):
    user = {"dense": USER_DENSE, "sparse": list(USER_SPARSE)}
    if history:
        user["history"] = {"max_len": HIST_MAX_LEN, "actions": HIST_ACTIONS}
    return {"user": user, "candidate": {"dense": CAND_DENSE, "sparse": list(CAND_SPARSE)}}


def _tables():
    return {f: {"rows": n, "dim": D} for f, n in {**USER_SPARSE, **CAND_SPARSE}.items()}


def _bags(m, layers, w):
    for side, feats, embs in (("user", USER_SPARSE, m.user_emb), ("candidate", CAND_SPARSE, m.cand_emb)):
        for f in feats:
            layers.append({"name": "e_" + f, "op": "embedding_bag", "input": "%s.sparse.%s" % (side, f),
                           "table": f, "pooling": "sum"})
            w["tables." + f] = embs[f].weight
    return ["e_" + f for f in USER_SPARSE], ["e_" + f for f in CAND_SPARSE]


def _linear(layers, w, name, x, lin, act="none"):
    layers.append({"name": name, "op": "linear", "input": x, "out": lin.out_features, "activation": act})
    w[name + ".weight"] = lin.weight
    w[name + ".bias"] = lin.bias if lin.bias is not None else torch.zeros(lin.out_features)
    return name


def _split_linear(layers, w, name, u, c, lin, fu, act):
    """nn.Linear over cat([u[map], c]) as linear(u) (no bias) + linear(c) through the map."""
    n = lin.out_features
    layers.append({"name": name + "_u", "op": "linear", "input": u, "out": n})
    layers.append({"name": name + "_c", "op": "linear", "input": c, "out": n})
    w[name + "_u.weight"], w[name + "_u.bias"] = lin.weight[:, :fu], torch.zeros(n)
    w[name + "_c.weight"], w[name + "_c.bias"] = lin.weight[:, fu:], lin.bias
    layers.append({"name": name + "_sum", "op": "add", "inputs": [name + "_c", name + "_u"]})
    if act == "none":
        return name + "_sum"
    layers.append({"name": name, "op": "activation", "input": name + "_sum", "fn": act})
    return name


def _placed(layers, w, name, x, fin, f, col):
    """x [fin] placed at columns [col, col + fin) of a zero [f] vector (exact)."""
    p = torch.zeros(f, fin)
    p[col:col + fin] = torch.eye(fin)
    layers.append({"name": name, "op": "linear", "input": x, "out": f})
    w[name + ".weight"], w[name + ".bias"] = p, torch.zeros(f)
    return name


def convert_dlrm(m):
    L, w = [], {}
    ue, ce = _bags(m, L, w)
    ub = _linear(L, w, "ubot0", "user.dense", m.user_bottom[0], "relu")
    ub = _linear(L, w, "ubot1", ub, m.user_bottom[2], "relu")
    cb = _linear(L, w, "cbot0", "candidate.dense", m.cand_bottom[0], "relu")
    cb = _linear(L, w, "cbot1", cb, m.cand_bottom[2], "relu")
    L.append({"name": "dot", "op": "dot_interaction", "inputs": [ub] + ue + [cb] + ce})
    L.append({"name": "x", "op": "concat", "inputs": ["dot", cb]})
    top = _linear(L, w, "top0", "x", m.top[0], "relu")
    _linear(L, w, "logits", top, m.top[2])
    return L, w, ["click", "like"]


def convert_dcn(m):
    L, w = [], {}
    ue, ce = _bags(m, L, w)
    L.append({"name": "xu", "op": "concat", "inputs": ue + ["user.dense"]})
    L.append({"name": "xc", "op": "concat", "inputs": ce + ["candidate.dense"]})
    fu = len(USER_SPARSE) * D + USER_DENSE
    _placed(L, w, "xu_at", "xu", fu, m.f, 0)
    _placed(L, w, "xc_at", "xc", m.f - fu, m.f, fu)
    L.append({"name": "x0", "op": "add", "inputs": ["xc_at", "xu_at"]})
    L.append({"name": "cross0", "op": "cross", "x0": "x0", "input": "x0"})
    w["cross0.weight"], w["cross0.bias"] = m.cross_w[0].weight, m.cross_w[0].bias
    L.append({"name": "ln0", "op": "layer_norm", "input": "cross0"})
    w["ln0.weight"], w["ln0.bias"] = m.norm[0].weight, m.norm[0].bias
    L.append({"name": "cross1", "op": "cross", "x0": "x0", "input": "ln0", "rank": m.cross_v.out_features})
    w["cross1.u"], w["cross1.v"], w["cross1.bias"] = m.cross_u.weight, m.cross_v.weight, m.cross_u.bias
    L.append({"name": "ln1", "op": "layer_norm", "input": "cross1"})
    w["ln1.weight"], w["ln1.bias"] = m.norm[1].weight, m.norm[1].bias
    L.append({"name": "cross2", "op": "cross", "x0": "x0", "input": "ln1"})
    w["cross2.weight"], w["cross2.bias"] = m.cross_w[1].weight, m.cross_w[1].bias
    d = _linear(L, w, "deep0", "x0", m.deep[0], "gelu")
    d = _linear(L, w, "deep1", d, m.deep[2], "silu")
    L.append({"name": "h", "op": "concat", "inputs": ["cross2", d]})
    _linear(L, w, "logits", "h", m.head)
    return L, w, ["click", "like"]


def convert_mmoe(m):
    L, w = [], {}
    ue, ce = _bags(m, L, w)
    L.append({"name": "xu", "op": "concat", "inputs": ue + ["user.dense"]})
    L.append({"name": "xc", "op": "concat", "inputs": ce + ["candidate.dense"]})
    h = _split_linear(L, w, "bottom", "xu", "xc", m.bottom, m.fu, "relu")
    experts = []
    for e, ex in enumerate(m.experts):
        x = _linear(L, w, "exp%d_0" % e, h, ex[0], "relu")
        experts.append(_linear(L, w, "exp%d_1" % e, x, ex[2], "relu"))
    logits = []
    for t, (gate, tower) in enumerate(zip(m.gates, m.towers)):
        g = _linear(L, w, "gate%d" % t, h, gate)
        L.append({"name": "mix%d" % t, "op": "mixture", "experts": experts, "gate": g})
        x = _linear(L, w, "tower%d_0" % t, "mix%d" % t, tower[0], "silu")
        logits.append(_linear(L, w, "tower%d_1" % t, x, tower[2]))
    L.append({"name": "logits", "op": "concat", "inputs": logits})
    return L, w, ["click", "like"][:len(m.towers)]


def _ln(layers, w, name, x, ln):
    layers.append({"name": name, "op": "layer_norm", "input": x})
    w[name + ".weight"], w[name + ".bias"] = ln.weight, ln.bias
    return name


def convert_seq(m):
    L, w = [], {}
    ue, ce = _bags(m, L, w)
    L.append({"name": "hist", "op": "history_embedding", "input": "user.history", "table": list(CAND_SPARSE)[0]})
    w["hist.action"], w["hist.position"] = m.hist_action.weight, m.hist_pos.weight
    x = "hist"
    for b, blk in enumerate(m.blocks):
        a = _ln(L, w, "b%d_ln1" % b, x, blk.ln1)
        L.append({"name": "b%d_attn" % b, "op": "self_attention", "input": a, "heads": blk.heads,
                  "head_dim": blk.dh, "causal": True, "kind": blk.kind})
        for p in ("wq", "wk", "wv", "wo"):
            w["b%d_attn.%s" % (b, p)] = getattr(blk, p).weight
        L.append({"name": "b%d_res" % b, "op": "add", "inputs": [x, "b%d_attn" % b]})
        f = _ln(L, w, "b%d_ln2" % b, "b%d_res" % b, blk.ln2)
        f = _linear(L, w, "b%d_ff1" % b, f, blk.ff1, m.FF_ACT)
        f = _linear(L, w, "b%d_ff2" % b, f, blk.ff2)
        L.append({"name": "b%d_out" % b, "op": "add", "inputs": ["b%d_res" % b, f]})
        x = "b%d_out" % b
    L.append({"name": "seq_last", "op": "pool", "input": x, "fn": "last"})
    ud = _linear(L, w, "u_dense", "user.dense", m.user_dense, "relu")
    cd = _linear(L, w, "c_dense", "candidate.dense", m.cand_dense, "relu")
    L.append({"name": "ta", "op": "target_attention", "query": ce[0], "history": "b0_ln1", "shared_with": "b0_attn"})
    L.append({"name": "ta_flat", "op": "flatten", "input": "ta"})
    L.append({"name": "din", "op": "din_attention", "query": ce[0], "history": "hist",
              "hidden": m.din[0].out_features, "activation": "relu", "normalize": "softmax"})
    w["din.w1"], w["din.b1"], w["din.w2"], w["din.b2"] = m.din[0].weight, m.din[0].bias, m.din[2].weight, m.din[2].bias
    L.append({"name": "xu", "op": "concat", "inputs": ["seq_last"] + ue + [ud]})
    L.append({"name": "ta_x_item", "op": "mul", "inputs": ["ta_flat", ce[0]]})
    L.append({"name": "din_x_item", "op": "mul", "inputs": ["din", ce[0]]})
    L.append({"name": "seq_x_item", "op": "mul", "inputs": ["seq_last", ce[0]]})     # through the map
    L.append({"name": "xc", "op": "concat", "inputs": ce + [cd, "ta_flat", "din", "ta_x_item", "din_x_item",
                                                           "seq_x_item"]})
    top = _split_linear(L, w, "top0", "xu", "xc", m.top[0], m.fu, "relu")
    _linear(L, w, "logits", top, m.top[2])
    return L, w, ["click", "like"]


MODELS = {"dlrm": (DLRM, convert_dlrm, "DLRM: bottom MLPs, dot interaction, top MLP"),
          "dcn": (DCNv2, convert_dcn, "DCNv2: full and low-rank cross layers, layer_norm, deep tower"),
          "mmoe": (MMoE, convert_mmoe, "MMoE: shared bottom, 4 experts, softmax gates, 2 task towers"),
          "seq": (SeqModel, convert_seq, "sequence model: a pre-LN transformer block over the history, "
                  "target attention sharing its weights, DIN pooling, top MLP"),
          "hstu": (HSTUModel, convert_seq, "HSTU-style: two pre-LN blocks of silu attention over the history, "
                   "target attention sharing the first block's weights, DIN pooling, top MLP")}
SEQ_MODELS = ("seq", "hstu")          # take the history (the modules' last argument)


def module_inputs(plan, request):
    """A RankRequest dict as the modules' arguments (float64): user and
    candidate dense [U, .] / [C, .], sparse {feature: (ids, offsets)} as
    nn.EmbeddingBag takes them, and the candidate -> user index [C]."""
    return feature_inputs(plan, request, USER_SPARSE, CAND_SPARSE)


def feature_inputs(plan, request, user_sparse, cand_sparse):
    """module_inputs for the given user and candidate sparse feature names
    (plain_models.module_inputs passes a model.json's own lists)."""
    users, cands = ikbo_ref.parse_request(plan, request)

    def bags(rows, feats):
        out = {}
        for f in feats:
            lens = [len(r["sparse"][f]) for r in rows]
            ids = [i for r in rows for i in r["sparse"][f]]
            offs = [sum(lens[:k]) for k in range(len(rows))]
            out[f] = (torch.tensor(ids, dtype=torch.int64), torch.tensor(offs, dtype=torch.int64))
        return out

    args = (torch.stack([u["dense"].to(torch.float64) for u in users]), bags(users, user_sparse),
            torch.stack([c["dense"].to(torch.float64) for c in cands]), bags(cands, cand_sparse),
            torch.tensor([c["user"] for c in cands], dtype=torch.int64))
    if not plan.history:
        return args
    # history: (ids, actions) [U, L] padded, oldest first, left-aligned (the kept events), lengths [U]
    lens = [len(u["hist_ids"]) for u in users]
    L = max(lens + [1])
    ids = torch.zeros((len(users), L), dtype=torch.int64)
    acts = torch.zeros((len(users), L), dtype=torch.int64)
    for i, u in enumerate(users):
        ids[i, :lens[i]] = torch.tensor(u["hist_ids"], dtype=torch.int64)
        acts[i, :lens[i]] = torch.tensor(u["hist_actions"], dtype=torch.int64)
    return args + ((ids, acts, torch.tensor(lens, dtype=torch.int64)),)


def module_scores(m, plan, request, inputs=None):
    """The module's float64 scores for a RankRequest dict, in request order;
    `inputs(plan, request)` builds the module's arguments (default
    module_inputs)."""
    with torch.no_grad():
        p = torch.sigmoid(m(*(inputs or module_inputs)(plan, request)))
    return (p * torch.tensor(plan.score_weights, dtype=torch.float64)).sum(1)


def export_model(name, out, seed=0):
    """A randomly initialised, calibrated model of architecture `name`."""
    torch.manual_seed(seed)
    m = MODELS[name][0]().double()
    return export_module(m, name, out, "random weights, seed %d%s" % (seed, ", bench scale" if W > 1 else ""),
                         calibrate_seed=seed)


def export_module(m, name, out, how, calibrate_seed=None, metadata=None):
    """Writes module m (of architecture `name`) as an ikbo-model/1 version
    directory; `how` goes into the description. With calibrate_seed the last
    layers are first rescaled (random weights only)."""
    _, conv, desc = MODELS[name]
    m = m.double()
    layers, w, tasks = conv(m)
    spec = {"format": "ikbo-model/1", "name": name,
            "description": "%s (tools/reference/zoo.py, %s)" % (desc, how),
            "inputs": _inputs(history=name in SEQ_MODELS), "tables": _tables(), "layers": layers,
            "output": {"logits": "logits", "tasks": tasks}}
    if calibrate_seed is not None:
        _calibrate(m, spec, w, name, calibrate_seed)
    tensors = {k: v.detach().to(torch.float32) for k, v in w.items()}
    return export.write_model(out, spec, tensors, "F32", metadata=metadata or {"zoo": name})


def _calibrate(m, spec, w, name, seed):
    """Scales the last linear layer of each task so its logits are ~N(0, 1) on
    a random request (no sigmoid saturation)."""
    plan = ikbo_ref.analyze(spec, "zoo")
    req = make_request.generate(plan, seed + 1, [30] * 8, model=name)
    last = [l["name"] for l in spec["layers"] if l["op"] == "linear" and
            (l["name"] == "logits" or (l["name"].startswith("tower") and l["name"].endswith("_1")))]
    for t, n in enumerate(last):
        weight, bias = w[n + ".weight"], w[n + ".bias"]
        with torch.no_grad():
            z = m(*module_inputs(plan, req))
            z = (z[:, [t]] if len(last) > 1 else z) - bias
            mean, std = z.mean(0), z.std(0).clamp(min=1e-3)
            weight.div_(std.unsqueeze(1))
            bias.copy_(-mean / std)


def check(model_dir, n_requests=5):
    """Max relative error of scores, module (given the exported weights) vs
    the reference interpreter, on random requests."""
    ref = ikbo_ref.load_model(model_dir)
    name = ref.spec.get("name")
    if "bench scale" in ref.spec["description"]:
        bench_scale()
    cls, conv, _ = MODELS[name]
    m = cls().double()
    _, w, _ = conv(m)
    with torch.no_grad():
        # w holds the module's parameters or views of them (split linears are
        # column slices); the placement matrices are fresh tensors, unused.
        for k, t in w.items():
            t.copy_(ref.w[k].reshape(t.shape))
    reqs = [make_request.generate(ref.plan, 500 + s, [1, 7, 40, 3][: 1 + s % 4], model=name)
            for s in range(n_requests)]
    return max_score_error(m, ref, reqs)


def max_score_error(m, ref, requests, inputs=None):
    """Max relative error of module m's float64 scores (module_scores, `inputs`
    building its arguments) against the reference interpreter's on the loaded
    model `ref`, over RankRequest dicts; inf when the counts differ or a
    score is not a number (NaN compares false: it would pass unseen)."""
    worst = 0.0
    for req in requests:
        got = module_scores(m, ref.plan, req, inputs=inputs).tolist()
        exp = ikbo_ref.score_request(ref, req)["scores"]
        if len(got) != len(exp):
            return float("inf")
        errs = [abs(a - b) / max(abs(b), 1e-6) for a, b in zip(got, exp)]
        if any(e != e for e in errs):
            return float("inf")
        worst = max([worst] + errs)
    return worst


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export", help="write a model version directory")
    e.add_argument("model", choices=sorted(MODELS))
    e.add_argument("out")
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--bench", action="store_true", help="the GPU-bound benchmark scale (see bench_scale)")
    c = sub.add_parser("check", help="module vs the reference interpreter on random requests")
    c.add_argument("model_dir")
    c.add_argument("--requests", type=int, default=5)
    a = ap.parse_args(argv)
    if a.cmd == "export":
        if a.bench:
            bench_scale()
        export_model(a.model, a.out, a.seed)
        print("%s: written" % a.out)
        return 0
    err = check(a.model_dir, a.requests)
    print("%s: module vs interpreter max relative error %.2e" % (a.model_dir, err))
    return 0 if err <= 1e-12 else 1


if __name__ == "__main__":
    sys.exit(main())
