"""Multi-node patterns of ranking code, each recognised as one op of the format.

Why this file exists: some ops of ikbo-model/1 are written in PyTorch as a
small subgraph, not one call: the history embedding (three embeddings
summed), masked mean and last pooling over a padded history, DLRM's
`bmm(t, t^T)[:, triu]`, DCNv2's `x0 * W(x) + x`, MMoE's softmax-weighted
expert sum, attention written as `softmax(Q K^T / sqrt(dh)) V` over a padded
history (self-attention, softmax or HSTU's silu; target attention of
candidates over `h[cand_user]`; or F.scaled_dot_product_attention, torch >=
2.0, in place of the written-out weights) and DIN's MLP-scored pooling. Each matcher
looks at the node where its subgraph ends and either returns the layer it
emitted or None (not this pattern: the converter tries the next, then the
plain op). A matcher checks every node it consumes; what it does not
recognise is left to the plain ops, which name the node they cannot express.

MATCHERS maps the kind of the end node to its matchers, in order.
"""
import collections

from fx_trace import UnsupportedNode
from nodes import ACTIVATIONS

NEG = -1e9          # a masked score must be at most this before the softmax

Split = collections.namedtuple("Split", "linear source heads head_dim")
Attention = collections.namedtuple("Attention", "kind causal query source mods heads head_dim mask")


# ------------------------------------------------------------ masks

def _user_mask(cv, n):
    """n is `arange(L)[None, :] < lens[:, None]` (or `lens[:, None] > arange(L)[None, :]`)."""
    g = cv.g
    if g.is_(n, "lt"):
        a, b = n.args
    elif g.is_(n, "gt"):
        b, a = n.args
    else:
        return False
    return g.is_(g.strip_unsqueeze(a), "arange") and cv.is_history(g.strip_unsqueeze(b), 2)


def _tril_ones(cv, n):
    g = cv.g
    return g.is_(n, "tril") and g.is_(n.args[0], "ones") and g.arg(n, 1, "diagonal", 0) == 0


def mask(cv, n):
    """(at candidates, causal) when n is the history mask, broadcast to the
    candidates through the map or not, with size-1 dims added and optionally
    `& ones(L, L).tril()`; None otherwise."""
    g, causal = cv.g, False
    if g.is_(n, "and"):
        a, b = n.args
        if _tril_ones(cv, b):
            n, causal = a, True
        elif _tril_ones(cv, a):
            n, causal = b, True
        else:
            return None
    base = g.strip_unsqueeze(n)
    bc = cv.bcast_base(base)
    if bc is not None:
        base = g.strip_unsqueeze(bc)
    return (bc is not None, causal) if _user_mask(cv, base) else None


def _masked_softmax(cv, n):
    """n = softmax(s.masked_fill(~m, NEG), dim=-1) * m -> (s, mask(m)); None otherwise."""
    g = cv.g
    if not g.is_(n, "mul"):
        return None
    for sm, m in (n.args, n.args[::-1]):
        if not g.is_(sm, "softmax") or not g.is_(sm.args[0], "masked_fill"):
            continue
        if g.dim(sm, 1) != len(g.shape(sm)) - 1:
            continue
        mf = sm.args[0]
        fill = g.const(g.arg(mf, 2, "value"))
        notm = g.arg(mf, 1, "mask")
        if fill is None or fill > NEG or not g.is_(notm, "not"):
            continue
        info_m, info_n = mask(cv, m), mask(cv, notm.args[0])
        if info_m is not None and info_m == info_n:
            return mf.args[0], info_m
    return None


# ------------------------------------------------------------ attention

def _split(cv, n):
    """n = Linear(x).reshape(N, T, H, dh).transpose(1, 2) -> Split; None otherwise."""
    g = cv.g
    if not g.is_(n, "transpose") or sorted(n.args[1:3]) != [1, 2]:
        return None
    r = n.args[0]
    if not g.is_(r, "reshape") or not g.is_(r.args[0], "linear") or len(g.shape(r)) != 4:
        return None
    _, _, h, dh = g.shape(r)
    return Split(r.args[0], r.args[0].args[0], h, dh)


def _scores(cv, s):
    """s = (Q @ K^T) / sqrt(dh) -> (split q, split k); None otherwise."""
    g = cv.g
    if not g.is_(s, "div") or not g.is_(s.args[0], "matmul"):
        return None
    q, kt = s.args[0].args
    if not g.is_(kt, "transpose") or sorted(d % 4 for d in kt.args[1:3]) != [2, 3]:
        return None
    sq, sk = _split(cv, q), _split(cv, kt.args[0])
    if sq is None or sk is None or not g.is_scale(g.const(s.args[1]), sq.head_dim):
        return None
    return sq, sk


def _silu_weights(cv, att):
    """att = silu(s) * keep / n_u, n_u = mask.sum(1).clamp(min=1) -> (s, mask info); None otherwise."""
    g = cv.g
    if not g.is_(att, "div") or not g.is_(att.args[0], "mul"):
        return None
    n = g.strip_unsqueeze(att.args[1])
    if not (g.is_(n, "clamp") and g.arg(n, 1, "min") == 1 and g.is_(n.args[0], "sum")
            and g.dim(n.args[0], 1) == 1 and mask(cv, n.args[0].args[0]) == (False, False)):
        return None
    for a, m in (att.args[0].args, att.args[0].args[::-1]):
        if g.is_(a, "silu") and mask(cv, m) is not None:
            return a.args[0], mask(cv, m)
    return None


def _written_out(cv, av):
    """av = A @ V, A the attention weights written out (softmax or silu) -> (q, k, v splits, kind, mask info)."""
    att, v = cv.g.arg(av, 0), cv.g.arg(av, 1)
    w, kind = _masked_softmax(cv, att), "softmax"
    if w is None:
        w, kind = _silu_weights(cv, att), "silu"
    qk = None if w is None else _scores(cv, w[0])
    return None if qk is None else (qk[0], qk[1], _split(cv, v), kind, w[1])


def _sdpa(cv, n):
    """n = F.scaled_dot_product_attention(q, k, v, attn_mask=the history mask (mask(); as the written-out
    forms' keep) or is_causal=True alone) -> (q, k, v splits, "softmax", mask info); None otherwise."""
    g = cv.g
    am, drop, causal = g.arg(n, 3, "attn_mask"), g.arg(n, 4, "dropout_p", 0.0), g.arg(n, 5, "is_causal", False)
    scale, sq, sk, sv = g.arg(n, 6, "scale"), _split(cv, n.args[0]), _split(cv, n.args[1]), _split(cv, n.args[2])
    if sq is None or sk is None or sv is None:
        return None
    if drop != 0 or g.arg(n, 7, "enable_gqa") or scale is not None and not g.is_scale(1 / scale, sq.head_dim):
        raise UnsupportedNode(n, "scaled_dot_product_attention: dropout_p 0, no enable_gqa and the default scale "
                              "1/sqrt(head_dim) only")
    info = (False, True) if am is None and causal is True else mask(cv, am) if causal is False else None
    if info is None:
        raise UnsupportedNode(n, "scaled_dot_product_attention over a padded history needs attn_mask = the history "
                              "mask (mask[:, None, None, :], `& torch.ones(L, L, dtype=torch.bool).tril()` for causal;"
                              " mask[cand_user][:, None, None, :] for candidate queries) or is_causal=True alone")
    return sq, sk, sv, "softmax", info


def parse_attention(cv, n):
    """n = Linear_o((O.transpose(1, 2)).reshape(N, T, H*dh)), O = A @ V with A the attention weights
    written out, or O = F.scaled_dot_product_attention(Q, K, V, ...) -> Attention; None when n is not an
    attention output."""
    g = cv.g
    x = n.args[0]
    if not (g.is_(x, "reshape") and g.is_(x.args[0], "transpose") and sorted(x.args[0].args[1:3]) == [1, 2]):
        return None
    o = x.args[0].args[0]
    parts = _written_out(cv, o) if g.is_(o, "matmul") else _sdpa(cv, o) if g.is_(o, "sdpa") else None
    if parts is None or parts[2] is None:
        return None
    sq, sk, sv, kind, info = parts
    if sk.source is not sv.source or len({(sq.heads, sq.head_dim), (sk.heads, sk.head_dim), (sv.heads, sv.head_dim)}) > 1:
        return None
    mods = tuple(g.module(l) for l in (sq.linear, sk.linear, sv.linear, n))
    if any(m.bias is not None for m in mods):
        raise UnsupportedNode(n, "attention projections must be bias-free nn.Linear (the format's wq/wk/wv/wo)")
    return Attention(kind, info[1], sq.source, sv.source, mods, sv.heads, sv.head_dim, info)


def _prefix(n):
    """The attention module's path ('blocks.0.wo' -> 'blocks_0'), naming its layer."""
    return n.target.rpartition(".")[0].replace(".", "_") or "attention"


def _attn_weights(cv, name, mods):
    for key, m in zip(("wq", "wk", "wv", "wo"), mods):
        cv.weight(name, key, m.weight)


def attention(cv, n):
    a = parse_attention(cv, n)
    if a is None:
        return None
    history = cv.bcast_base(a.source)
    if a.query is a.source and history is None and a.mask[0] is False:
        name = cv.layer(n, "self_attention", input=cv.emit(a.source), heads=a.heads, head_dim=a.head_dim,
                        causal=a.causal, kind=a.kind, seq=True, hint=_prefix(n) + "_attn")
        _attn_weights(cv, name, a.mods)
        return name
    if history is None or a.mask != (True, False) or a.kind != "softmax":
        raise UnsupportedNode(n, "attention of candidates must be softmax over their users' history "
                              "(keys/values from h[cand_user], the mask through the map, no causal mask)")
    hist = cv.emit(history)
    query = cv.emit(cv.g.strip_unsqueeze(a.query))
    for other in cv.t.nodes:                       # the self-attention with the same weights over the same history
        if other is not n and cv.g.is_(other, "linear") and cv.g.module(other) is a.mods[3]:
            b = parse_attention(cv, other)
            if b is not None and b.mods == a.mods and b.source is history and b.query is history:
                return cv.layer(n, "target_attention", query=query, history=hist, shared_with=cv.emit(other),
                                hint=_prefix(n) + "_target")
    name = cv.layer(n, "target_attention", query=query, history=hist, heads=a.heads, head_dim=a.head_dim,
                    hint=_prefix(n))
    _attn_weights(cv, name, a.mods)
    return name


# ------------------------------------------------------------ DIN

def _din_scores(cv, s, history):
    """s = Linear2(act(Linear1(cat([q, h, q - h, q * h], -1)))).squeeze(-1) -> (q, act, lin1, lin2)."""
    g = cv.g
    if not g.is_(s, "squeeze") or not g.is_(s.args[0], "linear"):
        return None
    l2, a = s.args[0], s.args[0].args[0]
    if not g.is_(a, *ACTIVATIONS) or not g.is_(a.args[0], "linear") or g.module(l2).out_features != 1:
        return None
    l1, cat = a.args[0], a.args[0].args[0]
    if not g.is_(cat, "cat") or g.dim(cat, 1) != len(g.shape(cat)) - 1 or len(cat.args[0]) != 4:
        return None
    qe, h, d, p = cat.args[0]

    def query(x):
        x = x.args[0] if g.is_(x, "expand") else x
        return g.strip_unsqueeze(x)

    def hist(x):
        return cv.bcast_base(x) is history

    ok = (hist(h) and g.is_(d, "sub") and g.is_(p, "mul") and hist(d.args[1]) and hist(p.args[1])
          and query(d.args[0]) is query(qe) and query(p.args[0]) is query(qe))
    return (query(qe), g.kind(a), g.module(l1), g.module(l2)) if ok else None


def din(cv, n):
    g = cv.g
    if g.dim(n, 1) != 1 or not g.is_(n.args[0], "mul") or len(g.shape(n.args[0])) != 3:
        return None
    for w, hc in (n.args[0].args, n.args[0].args[::-1]):
        history = cv.bcast_base(hc)
        if history is None or g.unsqueezed(w) is None:
            continue
        w = g.unsqueezed(w)
        sm, normalize = _masked_softmax(cv, w), "softmax"
        if sm is None and g.is_(w, "mul"):
            for s, m in (w.args, w.args[::-1]):
                if mask(cv, m) == (True, False):
                    sm, normalize = (s, (True, False)), "none"
        if sm is None or sm[1] != (True, False):
            continue
        sc = _din_scores(cv, sm[0], history)
        if sc is None:
            continue
        q, act, l1, l2 = sc
        name = cv.layer(n, "din_attention", hint="din", query=cv.emit(q), history=cv.emit(history),
                        hidden=l1.out_features, activation=act, normalize=normalize)
        for key, t in (("w1", l1.weight), ("b1", l1.bias), ("w2", l2.weight), ("b2", l2.bias)):
            cv.weight(name, key, t)
        return name
    return None


# ------------------------------------------------------------ pools, history, interactions

def history_embedding(cv, n):
    """item(ids % rows) + action(acts) + position.weight[:L] (any order) -> history_embedding."""
    g = cv.g
    terms, stack = [], [n]
    while stack:
        x = stack.pop()
        if g.is_(x, "add") and (x is n or len(x.users) == 1):
            stack += list(x.args[:2])
        else:
            terms.append(x)
    if len(terms) != 3:
        return None
    item = action = position = None
    for t in terms:
        if g.is_(t, "embedding"):
            ids = t.args[0]
            if g.is_(ids, "mod") and g.const(ids.args[1]) == g.module(t).num_embeddings:
                ids = ids.args[0]
            if cv.is_history(ids, 0):
                item = g.module(t)
            elif cv.is_history(ids, 1):
                action = g.module(t)
        ix = g.index(t)
        if ix and g.param(ix[0]) is not None and len(ix[1]) == 1 and isinstance(ix[1][0], slice) \
                and ix[1][0].start in (None, 0) and ix[1][0].step is None:
            position = g.param(ix[0])
    if item is None or action is None or position is None:
        return None
    h = cv.inputs["user"].get("history")
    if h is None:
        raise UnsupportedNode(n, "a history embedding, but inputs.user has no history")
    if action.num_embeddings != h["actions"] or tuple(position.shape) != (h["max_len"], item.embedding_dim):
        raise UnsupportedNode(n, "history embeddings: action rows %d (inputs: %d), position %s (inputs: [%d, %d])"
                              % (action.num_embeddings, h["actions"], list(position.shape), h["max_len"],
                                 item.embedding_dim))
    name = cv.layer(n, "history_embedding", hint="history", input="user.history",
                    table=cv.table(item.weight, "history"), seq=True)
    cv.weight(name, "action", action.weight)
    cv.weight(name, "position", position)
    return name


def mean_pool(cv, n):
    """(h * mask[..., None]).sum(1) / lens.clamp(min=1)[:, None] -> mean_pool(h)."""
    g = cv.g
    s, d = n.args[0], g.strip_unsqueeze(n.args[1])
    if not (g.is_(s, "sum") and g.dim(s, 1) == 1 and g.is_(s.args[0], "mul") and g.is_(d, "clamp")
            and g.arg(d, 1, "min") == 1 and cv.is_history(d.args[0], 2)):
        return None
    for x, m in (s.args[0].args, s.args[0].args[::-1]):
        if mask(cv, m) == (False, False):
            return cv.layer(n, "mean_pool", hint="mean_pool", input=cv.emit(x))
    return None


def pool_last(cv, n):
    """x[arange(U), (lens - 1).clamp(min=0)] * (lens > 0)[:, None] -> pool last."""
    g = cv.g
    for sel, valid in (n.args, n.args[::-1]):
        ix, v = g.index(sel), g.strip_unsqueeze(valid)
        if ix is None or len(ix[1]) != 2 or not (g.is_(v, "gt") and cv.is_history(v.args[0], 2)
                                                 and g.const(v.args[1]) == 0):
            continue
        rows, last = ix[1]
        if g.is_(rows, "arange") and g.is_(last, "clamp") and g.arg(last, 1, "min") == 0 \
                and g.is_(last.args[0], "sub") and cv.is_history(last.args[0].args[0], 2) \
                and g.const(last.args[0].args[1]) == 1:
            return cv.layer(n, "pool", hint="pool_last", input=cv.emit(ix[0]), fn="last")
    return None


def dot_interaction(cv, n):
    """bmm(t, t^T)[:, i, j] with (i, j) = triu_indices(K, K, 1 or 0) -> dot_interaction over t's parts."""
    g = cv.g
    ix = g.index(n)
    if ix is None or len(ix[1]) != 3 or ix[1][0] != slice(None):
        return None
    z, i, j = ix[0], ix[1][1], ix[1][2]
    if not (g.is_(z, "matmul") and g.index(i) and g.index(j)):
        return None
    tri = i.args[0]
    if not (g.is_(tri, "triu_indices") and j.args[0] is tri and g.index(i)[1] == (0,) and g.index(j)[1] == (1,)):
        return None
    t, tt = z.args
    if not (g.is_(tt, "transpose") and tt.args[0] is t and sorted(d % 3 for d in tt.args[1:3]) == [1, 2]):
        return None
    k = g.shape(t)[1]
    offset = g.arg(tri, 2, "offset", 0)
    if list(tri.args[:2]) and [g.val(a) for a in tri.args[:2]] != [k, k] or offset not in (0, 1):
        raise UnsupportedNode(n, "dot interaction: triu_indices(K, K, 1) (or 0) over the K = %d tokens" % k)
    fields = {"self": True} if offset == 0 else {}
    return cv.layer(n, "dot_interaction", hint="dot_interaction", inputs=cv.token_parts(t), **fields)


def cross(cv, n):
    """x0 * W(x) + x (W: nn.Linear, or u(v(x)) low rank) -> cross."""
    g = cv.g
    for m, x in (n.args, n.args[::-1]):
        if not g.is_(m, "mul") or len(g.shape(n)) != 2:
            continue
        for x0, w in (m.args, m.args[::-1]):
            if not g.is_(w, "linear") or len(w.users) != 1:
                continue
            lu = g.module(w)
            if w.args[0] is x:
                name = cv.layer(n, "cross", hint="cross", x0=cv.emit(x0), input=cv.emit(x))
                cv.weight(name, "weight", lu.weight)
                cv.weight(name, "bias", lu.bias, zeros=lu.out_features)
                return name
            v = w.args[0]
            if g.is_(v, "linear") and v.args[0] is x and g.module(v).bias is None and len(v.users) == 1:
                lv = g.module(v)
                name = cv.layer(n, "cross", hint="cross", x0=cv.emit(x0), input=cv.emit(x), rank=lv.out_features)
                cv.weight(name, "u", lu.weight)
                cv.weight(name, "v", lv.weight)
                cv.weight(name, "bias", lu.bias, zeros=lu.out_features)
                return name
    return None


def mixture(cv, n):
    """(softmax(gate, dim=1).unsqueeze(-1) * stack(experts, dim=1)).sum(1) -> mixture."""
    g = cv.g
    if g.dim(n, 1) != 1 or not g.is_(n.args[0], "mul"):
        return None
    for gw, ex in (n.args[0].args, n.args[0].args[::-1]):
        sm = g.unsqueezed(gw)
        if sm is None or not g.is_(sm, "softmax") or g.dim(sm, 1) != 1 or not g.is_(ex, "stack") \
                or g.dim(ex, 1) != 1:
            continue
        return cv.layer(n, "mixture", hint="mixture", experts=[cv.emit(e) for e in ex.args[0]],
                        gate=cv.emit(sm.args[0]))
    return None


MATCHERS = {"linear": (attention,), "add": (history_embedding, cross), "mul": (pool_last,),
            "div": (mean_pool,), "sum": (mixture, din), "getitem": (dot_interaction,)}
