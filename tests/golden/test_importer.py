#!/usr/bin/python3
"""Test of tools/importer (`make golden` runs it; a few seconds).

Differential and error tests of the torch.fx importer (tools/importer/README.md):
  - a small module written here (a user bag and dense MLP, a candidate bag,
    cat([u[cand_user], c, cand_dense]) -> Linear -> ReLU -> Linear) imported
    with ikbo_import.import_module: model.json is "planning": "auto" with
    exactly the layers expected, and the reference interpreter's scores of
    the written model equal the module's (ikbo_import.compare, <= 1e-9);
  - the CLI on the module written to a temporary FILE.py with a factory:
    exit 0 and the directory written; a factory FILE.py lacks -> exit 2
    naming it; --inputs of a missing file -> exit 2; a forward() that fails on
    the example inputs -> exit 2 with one line;
  - DLRM's dot interaction (bmm + triu_indices offset 1, and 0: "self": true);
  - UnsupportedNode: torch.exp, nn.EmbeddingBag(mode="max"), gelu(approximate=
    "tanh"), x[:, 2:5] and nn.Dropout are refused with fx_trace.UnsupportedNode naming the
    node, this file and the exact line of the offending source (found with
    inspect) and the reason, from Python and through the CLI (exit 2, the same
    one line); a forward() with the wrong number of arguments is a ValueError
    naming the convention;
  - ImportMismatch: compare() of the imported module is <= 1e-9, and raises
    ImportMismatch once one of the module's weights is perturbed;
  - dtype BF16: the import succeeds (the self-check rounds the module's
    weights first), the weights are stored as BF16, and the unrounded module
    does differ from the written model (so the rounding is what makes it pass).
  - the counts convention (map_form="counts", --map counts): Small and a
    sequence model (Hist: self-attention, target attention, DIN, the last
    event) written with cand_counts - each broadcast x.repeat_interleave(
    cand_counts, dim=0), torch.repeat_interleave(x, cand_counts, dim=0), or an
    index by the map torch.repeat_interleave(torch.arange(U), cand_counts) /
    torch.arange(U).repeat_interleave(cand_counts) - pass their self-check
    (grouped requests), write the model of their index twins bit for bit, score
    as the twin on a grouped request, and fail compare() once perturbed;
  - refused with the exact message (node, this file's line, reason): cand_counts
    used otherwise, the map used otherwise, x[:, None].expand(U, n, D).reshape(
    U * n, D) (uniform counts only), user_dense.expand(C, -1) (one user only),
    x.repeat_interleave(2, dim=0); the CLI's --map counts (the index twin's
    model) and the counts module without it (exit 2);
  - F.scaled_dot_product_attention, only where torch has it (>= 2.0; SKIPPED
    with the reason printed otherwise): Hist with its self-attention (attn_mask
    the causal or plain history mask; is_causal=True) and target attention
    (attn_mask mask[cand_user]) through SDPA, index and counts, writes the model
    of its written-out twin bit for bit; dropout_p and a missing mask refused
    with the exact message.

    tests/golden/test_importer.py        exit 0 when every check passes
"""
import inspect
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
IMPORTER = os.path.join(REPO, "tools", "importer", "ikbo_import.py")
sys.path.insert(0, os.path.join(REPO, "tools", "importer"))
import fx_trace  # noqa: E402
import ikbo_import  # noqa: E402

THIS = os.path.abspath(__file__)
TOL = 1e-9
TASKS = ["click", "like"]
INPUTS = {"user": {"dense": 6, "sparse": ["country"]}, "candidate": {"dense": 3, "sparse": ["item"]}}
FAILS = []


def ok(cond, what):
    print("  %-72s %s" % (what, "ok" if cond else "FAIL"), flush=True)
    if not cond:
        FAILS.append(what)
    return cond


# ------------------------------------------------------------ modules

class Small(nn.Module):
    """User bag + dense MLP, candidate bag, the broadcast concat, a two-layer head."""

    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(int(seed))
        self.user_bag = nn.EmbeddingBag(50, 8, mode="mean")
        self.user_mlp = nn.Sequential(nn.Linear(6, 8), nn.ReLU())
        self.cand_bag = nn.EmbeddingBag(100, 8, mode="sum")
        self.hidden = nn.Linear(8 + 8 + 8 + 3, 16)
        self.head = nn.Linear(16, 2)

    def forward(self, user_dense, user_sparse, cand_dense, cand_sparse, cand_user):
        ids, offsets = user_sparse["country"]
        u = torch.cat([self.user_bag(ids % 50, offsets), self.user_mlp(user_dense)], dim=1)
        cids, coffsets = cand_sparse["item"]
        c = self.cand_bag(cids % 100, coffsets)
        x = torch.cat([u[cand_user], c, cand_dense], dim=1)
        return self.head(torch.relu(self.hidden(x)))


# The refused modules: each forward has one offending line, marked `# BAD` (the
# test finds its number with inspect).

class Exp(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(6 + 3, 2)

    def forward(self, user_dense, user_sparse, cand_dense, cand_sparse, cand_user):
        x = torch.cat([user_dense[cand_user], cand_dense], dim=1)
        return self.head(torch.exp(x))  # BAD


class MaxBag(nn.Module):
    def __init__(self):
        super().__init__()
        self.bag = nn.EmbeddingBag(100, 3, mode="max")
        self.head = nn.Linear(3 + 3, 2)

    def forward(self, user_dense, user_sparse, cand_dense, cand_sparse, cand_user):
        ids, offsets = cand_sparse["item"]
        c = self.bag(ids % 100, offsets)  # BAD
        return self.head(torch.cat([c, cand_dense], dim=1))


class TanhGelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 5)
        self.head = nn.Linear(5, 2)

    def forward(self, user_dense, user_sparse, cand_dense, cand_sparse, cand_user):
        h = F.gelu(self.lin(cand_dense), approximate="tanh")  # BAD
        return self.head(h)


class Slice(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(3 + 3, 2)

    def forward(self, user_dense, user_sparse, cand_dense, cand_sparse, cand_user):
        u = user_dense[cand_user]
        return self.head(torch.cat([u[:, 2:5], cand_dense], dim=1))  # BAD


class Dropout(nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.1)
        self.head = nn.Linear(3, 2)

    def forward(self, user_dense, user_sparse, cand_dense, cand_sparse, cand_user):
        return self.head(self.drop(cand_dense))  # BAD


class Dot(nn.Module):
    """DLRM's interaction over [user vector, candidate vector, candidate bag] tokens."""

    def __init__(self, offset):
        super().__init__()
        self.offset = offset
        self.user = nn.Linear(6, 8)
        self.cand = nn.Linear(3, 8)
        self.bag = nn.EmbeddingBag(100, 8, mode="sum")
        self.head = nn.Linear(3 if offset else 6, 2)

    def forward(self, user_dense, user_sparse, cand_dense, cand_sparse, cand_user):
        ids, offsets = cand_sparse["item"]
        t = torch.stack([self.user(user_dense)[cand_user], self.cand(cand_dense), self.bag(ids % 100, offsets)], dim=1)
        z = torch.bmm(t, t.transpose(1, 2))
        i, j = torch.triu_indices(t.shape[1], t.shape[1], self.offset)
        return self.head(z[:, i, j])


class NoMap(nn.Module):
    """Four arguments: the candidate -> user map is missing."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(3, 2)

    def forward(self, user_dense, user_sparse, cand_dense, cand_sparse):
        return self.head(cand_dense)


class ExtraHistory(NoMap):
    """Six arguments, but the inputs have no history."""

    def forward(self, user_dense, user_sparse, cand_dense, cand_sparse, cand_user, history):
        return self.head(cand_dense)


class BadShape(NoMap):
    """A forward() that fails on the example inputs (a wrong Linear width)."""

    def forward(self, user_dense, user_sparse, cand_dense, cand_sparse, cand_user):
        return self.head(user_dense[cand_user])


# (class, node name, reason fragment)
REFUSED = [(Exp, "exp", "no op of ikbo-model/1 computes this"),
           (MaxBag, "bag", "nn.EmbeddingBag: mode sum or mean"),
           (TanhGelu, "gelu", "gelu(approximate='tanh'): the format's gelu is the exact (erf) form"),
           (Slice, "getitem_1", "indexing: supported are x[cand_user]"),
           (Dropout, "dropout", "no op of ikbo-model/1 computes this")]     # the line in forward, not torch's


def bad_line(cls, method="forward"):
    """(number, code) in this file of the line of cls.<method> marked `# BAD`."""
    lines, start = inspect.getsourcelines(getattr(cls, method))
    hits = [(start + i, s.strip()) for i, s in enumerate(lines) if s.rstrip().endswith("# BAD")]
    assert len(hits) == 1, cls
    return hits[0]


# ------------------------------------------------------------ the counts convention (--map counts)

class SmallCounts(Small):
    """Small under the counts convention: the broadcast is u.repeat_interleave(cand_counts, dim=0)."""

    def forward(self, user_dense, user_sparse, cand_dense, cand_sparse, cand_counts):
        ids, offsets = user_sparse["country"]
        u = torch.cat([self.user_bag(ids % 50, offsets), self.user_mlp(user_dense)], dim=1)
        cids, coffsets = cand_sparse["item"]
        c = self.cand_bag(cids % 100, coffsets)
        x = torch.cat([u.repeat_interleave(cand_counts, dim=0), c, cand_dense], dim=1)
        return self.head(torch.relu(self.hidden(x)))


H_INPUTS = {"user": {"dense": 6, "sparse": ["country"], "history": {"max_len": 8, "actions": 3}},
            "candidate": {"dense": 3, "sparse": ["item"]}}
D = 8
# the broadcast of user tensor x by m (cand_user or cand_counts): Hist's k-th broadcast is SPELLINGS[form][k % n]
SPELLINGS = {
    "index": (lambda x, m: x[m], lambda x, m: x.index_select(0, m)),
    "counts": (lambda x, m: x.repeat_interleave(m, dim=0), lambda x, m: torch.repeat_interleave(x, m, dim=0),
               lambda x, m: x[torch.repeat_interleave(torch.arange(m.shape[0]), m)],
               lambda x, m: x.index_select(0, torch.arange(m.shape[0]).repeat_interleave(m))),
}


class Hist(nn.Module):
    """A sequence model: history embedding, a self-attention over it (causal or not), the last event,
    a target attention of the candidate's item over the user's attended history (own weights), DIN
    pooling of the history by the item, a user linear, a head. `form` is the forward()'s 5th argument
    ("index": cand_user, "counts": cand_counts), each broadcast spelled as SPELLINGS[form] in turn;
    `attn` "written" (README.md's written-out attention) or "sdpa" (F.scaled_dot_product_attention,
    the causal mask as `keep`, or with causal="is_causal" as is_causal=True)."""

    def __init__(self, form="index", attn="written", causal=True, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.spell, self.attn, self.causal, self.heads, self.dh = SPELLINGS[form], attn, causal, 2, 4
        self.item, self.action, self.pos = nn.Embedding(100, D), nn.Embedding(3, D), nn.Embedding(8, D)
        self.wq, self.wk, self.wv = (nn.Linear(D, 8, bias=False) for _ in range(3))
        self.wo = nn.Linear(8, D, bias=False)
        self.ta = nn.ModuleDict({k: nn.Linear(D, 8, bias=False) for k in ("wq", "wk", "wv")})
        self.ta["wo"] = nn.Linear(8, D, bias=False)
        self.cand_bag = nn.EmbeddingBag(100, D, mode="sum")
        self.din = nn.Sequential(nn.Linear(4 * D, 8), nn.ReLU(), nn.Linear(8, 1))
        self.user = nn.Linear(6, D)
        self.head = nn.Linear(5 * D + 3, 2)

    def bcast(self, x, m):
        self.k += 1
        return self.spell[(self.k - 1) % len(self.spell)](x, m)

    def split(self, x):
        return x.reshape(x.shape[0], x.shape[1], self.heads, self.dh).transpose(1, 2)

    def attend(self, q, k, v, keep, causal):
        if self.attn == "sdpa" and causal == "is_causal":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        if self.attn == "sdpa":
            return F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        s = q @ k.transpose(-1, -2) / math.sqrt(self.dh)
        return (F.softmax(s.masked_fill(~keep, -1e30), dim=-1) * keep) @ v

    def forward(self, user_dense, user_sparse, cand_dense, cand_sparse, m, history):
        self.k = 0
        ids, acts, lens = history
        U, L = ids.shape
        h = self.item(ids % 100) + self.action(acts) + self.pos.weight[:L]
        mask = torch.arange(L)[None, :] < lens[:, None]
        keep = mask[:, None, None, :]
        if self.causal:
            keep = mask[:, None, None, :] & torch.ones(L, L, dtype=torch.bool).tril()
        o = self.attend(self.split(self.wq(h)), self.split(self.wk(h)), self.split(self.wv(h)), keep, self.causal)
        x = h + self.wo(o.transpose(1, 2).reshape(U, L, -1))
        last = x[torch.arange(U), (lens - 1).clamp(min=0)] * (lens > 0)[:, None]
        cids, coffsets = cand_sparse["item"]
        qv = self.cand_bag(cids % 100, coffsets)
        C = qv.shape[0]
        ac, mc = self.bcast(x, m), self.bcast(mask, m)[:, None, None, :]
        ta = self.ta
        o = self.attend(self.split(ta["wq"](qv[:, None])), self.split(ta["wk"](ac)), self.split(ta["wv"](ac)), mc,
                        False)
        t = ta["wo"](o.transpose(1, 2).reshape(C, 1, -1)).flatten(1)
        hc, cm = self.bcast(h, m), self.bcast(mask, m)
        qe = qv[:, None].expand_as(hc)
        s = self.din(torch.cat([qe, hc, qe - hc, qe * hc], dim=-1)).squeeze(-1)
        d = ((F.softmax(s.masked_fill(~cm, -1e30), dim=1) * cm)[..., None] * hc).sum(1)
        u = self.bcast(torch.cat([self.user(user_dense), last], dim=1), m)
        return self.head(torch.cat([u, t, d, qv, cand_dense], dim=1))


# Refused under --map counts (or index), one `# BAD` line each; the exact reasons are in REFUSED_MAP.

class CountsMisused(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(3 + 1, 2)

    def forward(self, user_dense, user_sparse, cand_dense, cand_sparse, cand_counts):
        n = cand_counts[:, None].float()  # BAD
        return self.head(torch.cat([cand_dense, n.repeat_interleave(cand_counts, dim=0)], dim=1))


class CountsPerCandidate(nn.Module):
    """Each candidate's count of its user's candidates as a feature: no op of the format computes it."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(3, 2)

    def forward(self, user_dense, user_sparse, cand_dense, cand_sparse, cand_counts):
        n = cand_counts.repeat_interleave(cand_counts)[:, None]  # BAD
        return self.head(cand_dense / n)


class MapMisused(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(6 + 3 + 1, 2)

    def forward(self, user_dense, user_sparse, cand_dense, cand_sparse, cand_counts):
        m = torch.arange(user_dense.shape[0]).repeat_interleave(cand_counts)
        f = m[:, None].double()  # BAD
        return self.head(torch.cat([user_dense[m], cand_dense, f], dim=1))


class ExpandUniform(nn.Module):
    """Each user repeated n = C // U times: the broadcast for uniform counts only."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(6 + 3, 2)

    def forward(self, user_dense, user_sparse, cand_dense, cand_sparse, cand_counts):
        U, n = user_dense.shape[0], cand_dense.shape[0] // user_dense.shape[0]
        u = user_dense[:, None].expand(U, n, 6).reshape(U * n, 6)  # BAD
        return self.head(torch.cat([u, cand_dense], dim=1))


class ExpandOneUser(nn.Module):
    """user_dense [1, 6] expanded to the candidates: right for a request of one user only."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(6 + 3, 2)

    def forward(self, user_dense, user_sparse, cand_dense, cand_sparse, cand_user):
        u = user_dense.expand(cand_dense.shape[0], -1)  # BAD
        return self.head(torch.cat([u, cand_dense], dim=1))


class RepeatUniform(ExpandUniform):
    def forward(self, user_dense, user_sparse, cand_dense, cand_sparse, cand_counts):
        u = user_dense.repeat_interleave(2, dim=0)  # BAD
        return self.head(torch.cat([u, cand_dense], dim=1))


USES = "(forward()'s 5th argument) may be used only as "
# (class, map_form, node, op target, the reason after the source line)
REFUSED_MAP = [
    (CountsMisused, "counts", "getitem", "call_function getitem",
     "cand_counts " + USES + "the repeats of x.repeat_interleave(cand_counts, dim=0) / torch.repeat_interleave(x, "
     "cand_counts, dim=0), or in the map torch.repeat_interleave(torch.arange(U), cand_counts) "
     "(tools/importer/README.md)"),
    (CountsPerCandidate, "counts", "repeat_interleave", "call_method repeat_interleave",
     "cand_counts " + USES + "the repeats of x.repeat_interleave(cand_counts, dim=0) / torch.repeat_interleave(x, "
     "cand_counts, dim=0), or in the map torch.repeat_interleave(torch.arange(U), cand_counts) "
     "(tools/importer/README.md)"),
    (MapMisused, "counts", "getitem_1", "call_function getitem",
     "the candidate -> user map made from cand_counts may only index a user tensor: x[m] or x.index_select(0, m)"),
    (ExpandUniform, "counts", "reshape", "call_method reshape",
     "a reshape that changes the rows (4 -> 8): x[:, None].expand(U, n, D).reshape(U * n, D) repeats each user "
     "n times, which is the broadcast only when every user has exactly n candidates (and they are grouped by "
     "user); requests have any counts: broadcast with x.repeat_interleave(cand_counts, dim=0)"),
    (ExpandOneUser, "index", "expand", "call_method expand",
     "expand of one row to 3 rows is the broadcast only when the request has one user, and requests have "
     "several: broadcast with x[cand_user]"),
    (RepeatUniform, "counts", "repeat_interleave", "call_method repeat_interleave",
     "repeat_interleave: repeating every row 2 times is the broadcast only when every user has exactly that many "
     "candidates; with forward() taking cand_counts (--map counts) the broadcast is "
     "x.repeat_interleave(cand_counts, dim=0)"),
]


class SdpaDropout(Hist):
    def attend(self, q, k, v, keep, causal):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep, dropout_p=0.1)  # BAD


class SdpaNoMask(Hist):
    def attend(self, q, k, v, keep, causal):
        return F.scaled_dot_product_attention(q, k, v)  # BAD


REFUSED_SDPA = [
    (SdpaDropout, "scaled_dot_product_attention: dropout_p 0, no enable_gqa and the default scale 1/sqrt(head_dim) "
     "only"),
    (SdpaNoMask, "scaled_dot_product_attention over a padded history needs attn_mask = the history mask "
     "(mask[:, None, None, :], `& torch.ones(L, L, dtype=torch.bool).tril()` for causal; mask[cand_user][:, None, "
     "None, :] for candidate queries) or is_causal=True alone"),
]

# ------------------------------------------------------------ helpers

def cli(*args):
    r = subprocess.run([sys.executable, IMPORTER] + list(args), capture_output=True, text=True, timeout=120)
    return r.returncode, r.stdout, r.stderr


def one_line(err):
    return len(err.strip().splitlines()) == 1 and "Traceback" not in err


def safetensors_dtypes(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    return {v["dtype"] for k, v in header.items() if k != "__metadata__"}


# ------------------------------------------------------------ checks

def case_api(tmp):
    out = os.path.join(tmp, "small", "1")
    m = Small()
    model = ikbo_import.import_module(m, INPUTS, TASKS, out, score_weights=[1, 0.5], name="small")
    with open(os.path.join(out, "model.json")) as f:
        spec = json.load(f)
    ok(spec.get("planning") == "auto" and spec["format"] == "ikbo-model/1" and spec["name"] == "small",
       "api: model.json ikbo-model/1, planning auto, name")
    got = [(l["name"], l["op"], l.get("input", l.get("inputs")), l.get("activation")) for l in spec["layers"]]
    want = [("user_bag", "embedding_bag", "user.sparse.country", None),
            ("user_mlp_0", "linear", "user.dense", "relu"),                  # nn.Linear + nn.ReLU fused
            ("cat", "concat", ["user_bag", "user_mlp_0"], None),
            ("cand_bag", "embedding_bag", "candidate.sparse.item", None),
            ("cat_1", "concat", ["cat", "cand_bag", "candidate.dense"], None),  # u[cand_user]: u itself
            ("hidden", "linear", "cat_1", "relu"),                           # torch.relu fused
            ("head", "linear", "hidden", "none")]
    if not ok(got == want, "api: layers %s" % ", ".join("%s:%s" % (n, o) for n, o, _, _ in want)):
        print("      got %s" % got)
    ok([l.get("pooling") for l in spec["layers"] if l["op"] == "embedding_bag"] == ["mean", "sum"] and
       spec["tables"] == {"country": {"rows": 50, "dim": 8}, "item": {"rows": 100, "dim": 8}},
       "api: bag pooling mean/sum, tables country [50, 8], item [100, 8]")
    ok(spec["output"] == {"logits": "head", "tasks": TASKS, "score_weights": [1, 0.5]},
       "api: output logits head, tasks, score_weights")
    err = ikbo_import.compare(m, model)
    ok(err <= TOL, "api: ikbo_ref scores vs module scores, max rel %.2e" % err)
    return m, model


def case_mismatch(m, model):
    err = ikbo_import.compare(m, model)
    ok(err <= TOL, "mismatch: unperturbed compare() %.2e <= 1e-9" % err)
    with torch.no_grad():
        m.user_mlp[0].weight[0, 0] += 0.25
    try:
        ikbo_import.compare(m, model)
        raised = None
    except ikbo_import.ImportMismatch as e:
        raised = e
    ok(raised is not None and "max relative score error" in str(raised),
       "mismatch: a perturbed user weight -> ImportMismatch")


def case_dtype(tmp):
    out = os.path.join(tmp, "bf16", "1")
    try:
        model = ikbo_import.import_module(Small(seed=3), INPUTS, TASKS, out, dtype="BF16")
        e = None
    except Exception as x:          # noqa: BLE001 (the row says what)
        model, e = None, x
    ok(e is None, "dtype: import_module(dtype='BF16') passes its self-check%s" % (": %s" % e if e else ""))
    if e is not None:
        return
    ok(safetensors_dtypes(os.path.join(out, "weights.safetensors")) == {"BF16"}, "dtype: weights stored as BF16")
    unrounded = Small(seed=3).double().eval()
    try:
        ikbo_import.compare(unrounded, model)
        differs = False
    except ikbo_import.ImportMismatch:
        differs = True
    ok(differs, "dtype: the unrounded module differs from the BF16 model (ImportMismatch)")


def case_dot(tmp):
    for offset in (1, 0):
        out = os.path.join(tmp, "dot%d" % offset, "1")
        try:
            ikbo_import.import_module(Dot(offset), INPUTS, TASKS, out)
            with open(os.path.join(out, "model.json")) as f:
                layer = [l for l in json.load(f)["layers"] if l["op"] == "dot_interaction"]
            e = None
        except Exception as x:      # noqa: BLE001
            layer, e = [], x
        want = [{"name": "dot_interaction", "op": "dot_interaction", "inputs": ["user", "cand", "bag"],
                 **({} if offset else {"self": True})}]
        if not ok(layer == want, "dot interaction, triu_indices(K, K, %d): one dot_interaction%s, self-check"
                  % (offset, "" if offset else " self: true")):
            print("      got %s %s" % (layer, e))


def case_refused(tmp):
    for cls, node, why in REFUSED:
        line = bad_line(cls)[0]
        try:
            ikbo_import.import_module(cls(), INPUTS, TASKS, os.path.join(tmp, "bad", cls.__name__))
            e = None
        except Exception as x:      # noqa: BLE001
            e = x
        msg = str(e)
        where = "at %s:%d `" % (os.path.basename(THIS), line)
        good = (type(e) is fx_trace.UnsupportedNode and msg.startswith("node %r (" % node) and where in msg
                and why in msg)
        if not ok(good, "unsupported %s: UnsupportedNode node %r at line %d: %s" % (cls.__name__, node, line,
                                                                                  why[:24])):
            print("      got %s: %s" % (type(e).__name__, msg))
        rc, _, err = cli("%s:%s" % (THIS, cls.__name__), os.path.join(tmp, "bad_cli", cls.__name__),
                         "--inputs", os.path.join(tmp, "inputs.json"), "--tasks", ",".join(TASKS))
        if not ok(rc == 2 and one_line(err) and err.strip() == "ikbo_import: " + msg,
                  "unsupported %s via the CLI: exit 2, the same one line" % cls.__name__):
            print("      rc %d, stderr %r" % (rc, err[-500:]))
    for cls, n in ((NoMap, 4), (ExtraHistory, 6)):
        try:
            ikbo_import.import_module(cls(), INPUTS, TASKS, os.path.join(tmp, "bad", cls.__name__))
            e = None
        except Exception as x:      # noqa: BLE001
            e = x
        msg = str(e)
        good = (type(e) is ValueError and ("forward() takes %d arguments, expected 5" % n) in msg
                and "(user_dense, user_sparse, cand_dense, cand_sparse, cand_user)" in msg)
        if not ok(good, "forward() of %d arguments: ValueError naming the convention" % n):
            print("      got %s: %s" % (type(e).__name__, msg[:300]))


def case_cli(tmp):
    inputs = os.path.join(tmp, "inputs.json")
    src = os.path.join(tmp, "small_model.py")
    with open(src, "w") as f:
        f.write("import torch\nimport torch.nn as nn\n\n\n%s\n\ndef make(seed):\n    return Small(seed)\n"
                % inspect.getsource(Small))
    out = os.path.join(tmp, "cli", "1")
    rc, stdout, err = cli(src + ":make", out, "--inputs", inputs, "--tasks", "click,like", "--arg", "7",
                          "--score-weights", "1,0.5", "--name", "small_cli", "--description", "from the test",
                          "--dtype", "F16")
    written = os.path.isfile(os.path.join(out, "model.json")) and os.path.isfile(os.path.join(out,
                                                                                              "weights.safetensors"))
    if not ok(rc == 0 and written and "written (planning auto)" in stdout, "cli: exit 0, %s written" % "cli/1"):
        print("      rc %d, stderr %r" % (rc, err[-500:]))
    if written:
        with open(os.path.join(out, "model.json")) as f:
            spec = json.load(f)
        ok(spec["name"] == "small_cli" and spec["description"] == "from the test" and spec["planning"] == "auto"
           and spec["output"]["score_weights"] == [1, 0.5] and spec["output"]["tasks"] == TASKS
           and safetensors_dtypes(os.path.join(out, "weights.safetensors")) == {"F16"},
           "cli: --name, --description, --score-weights, --tasks, --dtype F16 as given")
    rc, _, err = cli(src + ":no_such_factory", os.path.join(tmp, "cli", "2"), "--inputs", inputs,
                     "--tasks", "click,like")
    ok(rc == 2 and one_line(err) and "no_such_factory" in err, "cli: a bad factory name -> exit 2 naming it")
    rc, _, err = cli(src + ":make", os.path.join(tmp, "cli", "3"), "--inputs", os.path.join(tmp, "missing.json"),
                     "--tasks", "click,like", "--arg", "1")
    ok(rc == 2 and one_line(err) and "missing.json" in err, "cli: --inputs of a missing file -> exit 2")
    rc, _, err = cli("%s:BadShape" % THIS, os.path.join(tmp, "cli", "4"), "--inputs", inputs,
                     "--tasks", "click,like")
    if not ok(rc == 2 and one_line(err) and "BadShape.forward" in err,
              "cli: a forward() failing on the example inputs -> exit 2, one line"):
        print("      rc %d, stderr %r" % (rc, err[-500:]))



def same_model(a, b):
    """The two written models (ikbo_ref.Model) are one: model.json and every tensor, bit for bit."""
    return a.spec == b.spec and sorted(a.w) == sorted(b.w) and all(torch.equal(a.w[k], b.w[k]) for k in a.w)


def attempt(f, *args, **kwargs):
    """(f's result, None) or (None, the exception it raised)."""
    try:
        return f(*args, **kwargs), None
    except Exception as x:          # noqa: BLE001 (the callers' rows say what)
        return None, x


def twins(tmp, tag, inputs, index_module, other, other_form, name):
    """Imports `index_module` (index convention) and `other` (map_form other_form) with the same name:
    (index model, other model), each through its self-check; None where an import failed (printed)."""
    models = []
    for m, form in ((index_module, "index"), (other, other_form)):
        model, e = attempt(ikbo_import.import_module, m, inputs, TASKS, os.path.join(tmp, tag, form, "1"),
                           name=name, description=name, map_form=form)
        if not ok(e is None, "%s: %s (%s%s) imported, self-check <= 1e-9" % (
                tag, type(m).__name__, form, ", " + m.attn if hasattr(m, "attn") else "")):
            print("      %s: %s" % (type(e).__name__, e))
        models.append(model)
    return models


def case_counts(tmp):
    """--map counts: modules broadcasting with repeat_interleave / the map made from counts import to the
    same model as their index twins, and score the same on a grouped request."""
    for tag, inputs, a, b in (("counts_small", INPUTS, Small(seed=5), SmallCounts(seed=5)),
                              ("counts_hist", H_INPUTS, Hist("index", seed=6), Hist("counts", seed=6))):
        mi, mc = twins(tmp, tag, inputs, a, b, "counts", tag)
        if mi is None or mc is None:
            continue
        ok(same_model(mi, mc), "%s: the written model equals the index twin's (model.json, tensors)" % tag)
        req = ikbo_import.ordered(ikbo_import.make_request.generate(mc.plan, 42, [2, 5, 1, 3]), "counts")
        si = zoo_scores(a, mc.plan, req, "index")
        sc = zoo_scores(b, mc.plan, req, "counts")
        err = max(abs(x - y) / max(abs(y), 1e-6) for x, y in zip(si, sc))
        ok(len(si) == len(sc) == len(req["candidates"]) and err <= TOL,
           "%s: module scores (grouped request, cand_counts) = index twin's (cand_user), %.1e" % (tag, err))
        err = ikbo_import.compare(b, mc, map_form="counts")
        with torch.no_grad():
            next(b.parameters()).mul_(1.5)
        _, e = attempt(ikbo_import.compare, b, mc, map_form="counts")
        ok(err <= TOL and isinstance(e, ikbo_import.ImportMismatch),
           "%s: compare(map_form='counts') %.1e; ImportMismatch once a weight is perturbed" % (tag, err))


def zoo_scores(m, plan, req, form):
    return ikbo_import.zoo.module_scores(m, plan, req, inputs=lambda p, r: ikbo_import.module_args(p, r, form))


def case_refused_map(tmp):
    """Misuses of cand_counts / the map, and expand or repeat_interleave that is the broadcast only for
    uniform counts or one user: UnsupportedNode, the exact message (node, this file's line, reason)."""
    for cls, form, node, what, why in REFUSED_MAP:
        line, code = bad_line(cls)
        want = "node %r (%s) at %s:%d `%s`: %s" % (node, what, os.path.basename(THIS), line, code, why)
        _, e = attempt(ikbo_import.import_module, cls(), INPUTS, TASKS, os.path.join(tmp, "bad", cls.__name__),
                       map_form=form)
        if not ok(type(e) is fx_trace.UnsupportedNode and str(e) == want,
                  "refused %s (%s): node %r at line %d, the exact reason" % (cls.__name__, form, node, line)):
            print("      got  %s: %s\n      want %s" % (type(e).__name__, e, want))


def case_cli_map(tmp):
    """--map counts through the CLI; the counts module without it fails (exit 2, one line)."""
    inputs = os.path.join(tmp, "inputs.json")
    out = os.path.join(tmp, "cli_counts", "1")
    rc, stdout, err = cli("%s:SmallCounts" % THIS, out, "--inputs", inputs, "--tasks", "click,like", "--map",
                          "counts", "--name", "small", "--description", "small")
    if not ok(rc == 0 and "written (planning auto)" in stdout, "cli --map counts: exit 0, written, self-checked"):
        print("      rc %d, stderr %r" % (rc, err[-500:]))
        return
    ref = ikbo_import.import_module(Small(), INPUTS, TASKS, os.path.join(tmp, "cli_counts_twin", "1"), name="small",
                                     description="small")
    ok(same_model(ikbo_import.ikbo_ref.load_model(out), ref), "cli --map counts: the model of the index twin")
    rc, _, err = cli("%s:SmallCounts" % THIS, os.path.join(tmp, "cli_counts", "2"), "--inputs", inputs,
                     "--tasks", "click,like")
    if not ok(rc == 2 and one_line(err) and "SmallCounts.forward failed on the example inputs" in err,
              "cli: the counts module without --map counts -> exit 2, one line"):
        print("      rc %d, stderr %r" % (rc, err[-500:]))


def case_sdpa(tmp):
    """F.scaled_dot_product_attention (torch >= 2.0): self-attention (attn_mask keep, causal or not;
    is_causal=True) and target attention import to the written-out twin's model; misuse refused."""
    if not hasattr(F, "scaled_dot_product_attention"):
        print("  sdpa: SKIPPED: torch %s has no F.scaled_dot_product_attention (torch >= 2.0; run this file "
              "with a torch 2.x Python)" % torch.__version__)
        return
    for form, causal in (("index", True), ("index", False), ("index", "is_causal"), ("counts", True)):
        tag = "sdpa_%s_%s" % (form, causal)
        mw, ms = twins(tmp, tag, H_INPUTS, Hist("index", "written", bool(causal), seed=7),
                       Hist(form, "sdpa", causal, seed=7), form, tag)
        if mw is not None and ms is not None:
            kinds = [(l["op"], l.get("causal")) for l in ms.spec["layers"] if "attention" in l["op"]]
            ok(same_model(mw, ms) and kinds == [("self_attention", bool(causal)), ("target_attention", None),
                                                ("din_attention", None)],
               "%s: self_attention (causal %s), target_attention: the written-out twin's model" % (tag, bool(causal)))
    for cls, why in REFUSED_SDPA:
        line, code = bad_line(cls, "attend")
        want = "node 'scaled_dot_product_attention' (call_function scaled_dot_product_attention) at %s:%d `%s`: %s" \
            % (os.path.basename(THIS), line, code, why)
        _, e = attempt(ikbo_import.import_module, cls(), H_INPUTS, TASKS, os.path.join(tmp, "bad", cls.__name__))
        if not ok(type(e) is fx_trace.UnsupportedNode and str(e) == want, "refused %s: the exact reason"
                  % cls.__name__):
            print("      got  %s: %s\n      want %s" % (type(e).__name__, e, want))

def main():
    print("test_importer: tools/importer (import_module, the CLI, refusals, the self-check)")
    with tempfile.TemporaryDirectory(prefix="ikbo-importer-") as tmp:
        with open(os.path.join(tmp, "inputs.json"), "w") as f:
            json.dump(INPUTS, f)
        m, model = case_api(tmp)
        case_mismatch(m, model)
        case_dtype(tmp)
        case_dot(tmp)
        case_refused(tmp)
        case_cli(tmp)
        case_counts(tmp)
        case_refused_map(tmp)
        case_cli_map(tmp)
        case_sdpa(tmp)
    print("test_importer: %s" % ("ok" if not FAILS else "FAILED (%d)" % len(FAILS)))
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
