#!/usr/bin/python3
"""Self-test of the reference for the ranking ops (run by golden.py first).

The C engine is checked against tools/reference/ikbo_ref.py, so the
reference itself needs a check that does not share its code: for each new op
(activation, layer_norm, concat, mul, token_linear, dot_interaction, cross
full and low rank, mixture, pool, linear over tokens and jagged, add/mul over
jagged; the sequence ops self_attention, target_attention shared_with and
din_attention through a request, two users of different history lengths; and
"planning": "auto" models mixing user and candidate inputs in stack, concat,
linear, token_linear, layer_norm, activation, dot_interaction, cross, mixture
and the attention queries) a tiny model is run through the interpreter (forward_one) and through
the batched IkboModule, and compared with the value of naive numpy loops
written here from MODEL_FORMAT.md; then analyze() must refuse each bad model
of BAD_MODELS with a message naming the layer.

    tests/golden/test_ref_ops.py        exit 0 when every case passes
"""
import math
import os
import sys

import numpy as np
import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tools", "reference"))
import export  # noqa: E402
import ikbo_ref  # noqa: E402

RNG = np.random.default_rng(7)
UD, CD, D = 6, 4, 3          # user dense, candidate dense, token width


def _spec(layers, logits, history=False):
    user = {"dense": UD}
    if history:
        user["history"] = {"max_len": 5, "actions": 2}
    return {"format": "ikbo-model/1", "inputs": {"user": user, "candidate": {"dense": CD}},
            "tables": {"t": {"rows": 7, "dim": D}} if history else {},
            "layers": layers, "output": {"logits": logits, "tasks": ["t%d" % i for i in range(_T[0])]}}


_T = [1]


def _act(x, fn):
    out = np.empty_like(x)
    for i, v in np.ndenumerate(x):
        out[i] = {"relu": max(v, 0.0), "sigmoid": 1 / (1 + math.exp(-v)), "tanh": math.tanh(v),
                  "silu": v / (1 + math.exp(-v)), "gelu": 0.5 * v * (1 + math.erf(v / math.sqrt(2))),
                  "none": v}[fn]
    return out


def _run(spec, weights, user, cand, hist=None):
    """-> (interpreter logits, IkboModule logits) for one candidate."""
    plan = ikbo_ref.analyze(spec)
    w = {n: torch.tensor(weights[n], dtype=torch.float64) for n in plan.param_shapes}
    model = ikbo_ref.Model(None, spec, plan, w, {})
    ids, acts = hist or ([], [])
    u = {"dense": torch.tensor(user), "sparse": {}, "hist_ids": ids, "hist_actions": acts}
    c = {"dense": torch.tensor(cand), "sparse": {}}
    a = ikbo_ref.forward_one(model, u, c).numpy()
    m = export.IkboModule(spec, dtype=torch.float64)
    with torch.no_grad():
        for n, t in w.items():
            m.param(n).copy_(t)
        batch = {"user.dense": torch.tensor(user)[None], "candidate.dense": torch.tensor(cand)[None]}
        if spec["inputs"]["user"].get("history"):
            n = len(ids)
            batch["user.history"] = (torch.tensor([ids + [0]], dtype=torch.int64)[:, :n + 1],
                                     torch.tensor([acts + [0]], dtype=torch.int64)[:, :n + 1],
                                     torch.tensor([[True] * n + [False]]))    # one padded slot
        b = m(batch)[0].numpy()
    return a, b


def _check(name, spec, weights, expect, hist=None, user=None, cand=None):
    user = RNG.normal(size=UD) if user is None else user
    cand = RNG.normal(size=CD) if cand is None else cand
    want = expect(user, cand)
    a, b = _run(spec, weights, user, cand, hist)
    err = max(np.abs(a - want).max(), np.abs(b - want).max()) / max(1.0, np.abs(want).max())
    ok = err < 1e-12
    print("  %-26s %.1e %s" % (name, err, "ok" if ok else "FAIL: ref %s module %s want %s" % (a, b, want)))
    return ok


def _lin(name, inp, out, act=None):
    l = {"name": name, "op": "linear", "input": inp, "out": out}
    if act:
        l["activation"] = act
    return l


def _w(*shape):
    return RNG.normal(size=shape)


def case_activations():
    oks = []
    for fn in ("relu", "gelu", "silu", "tanh", "sigmoid"):
        W, B = _w(1, CD), _w(1)
        spec = _spec([{"name": "a", "op": "activation", "input": "candidate.dense", "fn": fn},
                      _lin("lg", "a", 1)], "lg")
        oks.append(_check("activation " + fn, spec, {"lg.weight": W, "lg.bias": B},
                          lambda u, c: W @ _act(c, fn) + B))
        W1, B1 = _w(2, UD), _w(2)
        spec = _spec([_lin("h", "user.dense", 2, fn), _lin("hc", "candidate.dense", 2),
                      {"name": "s", "op": "add", "a": "h", "b": "hc"}, _lin("lg", "s", 1)], "lg")
        W2, B2 = _w(2, CD), _w(2)
        oks.append(_check("linear activation " + fn, spec,
                          {"h.weight": W1, "h.bias": B1, "hc.weight": W2, "hc.bias": B2, "lg.weight": W[:, :2], "lg.bias": B[:1]},
                          lambda u, c: W[:, :2] @ (_act(W1 @ u + B1, fn) + W2 @ c + B2) + B[:1]))
    return all(oks)


def _naive_layer_norm(x, g, b, eps):
    n = len(x)
    mean = sum(x) / n
    var = sum((v - mean) ** 2 for v in x) / n
    return np.array([(x[i] - mean) / math.sqrt(var + eps) * g[i] + b[i] for i in range(n)])


def case_tokens():
    """reshape -> token_linear -> linear over tokens -> layer_norm -> pool fn -> logits."""
    oks = []
    K, M, O = 2, 3, 4
    for fn in ("mean", "sum", "max", "last"):
        Tw, Lw, Lb, G, Bb, W, B = _w(M, K), _w(O, CD // K), _w(O), _w(O), _w(O), _w(1, O), _w(1)
        spec = _spec([{"name": "r", "op": "reshape", "input": "candidate.dense", "tokens": K},
                      {"name": "tl", "op": "token_linear", "input": "r", "out_tokens": M},
                      _lin("tk", "tl", O, "gelu"),
                      {"name": "ln", "op": "layer_norm", "input": "tk", "eps": 0.01},
                      {"name": "p", "op": "pool", "input": "ln", "fn": fn}, _lin("lg", "p", 1)], "lg")

        def expect(u, c):
            X = c.reshape(K, CD // K)
            Z = np.array([[sum(Tw[m, k] * X[k, d] for k in range(K)) for d in range(CD // K)] for m in range(M)])
            H = np.array([_act(Lw @ Z[m] + Lb, "gelu") for m in range(M)])
            N = np.array([_naive_layer_norm(H[m], G, Bb, 0.01) for m in range(M)])
            p = {"mean": N.sum(0) / M, "sum": N.sum(0), "max": N.max(0), "last": N[-1]}[fn]
            return W @ p + B
        oks.append(_check("token path pool " + fn, spec,
                          {"tl.weight": Tw, "tk.weight": Lw, "tk.bias": Lb, "ln.weight": G, "ln.bias": Bb,
                           "lg.weight": W, "lg.bias": B}, expect))
    return all(oks)


def case_jagged():
    """history -> linear over events (silu) -> layer_norm -> mul/add jagged -> pool fn; empty history too."""
    oks = []
    O = 2
    for fn in ("mean", "sum", "max", "last"):
        for hist in (([3, 9, 1], [0, 1, 1]), ([], [])):
            T, Ac, Po = _w(7, D), _w(2, D), _w(5, D)
            Lw, Lb, G, Bb, W, B = _w(O, D), _w(O), _w(O), _w(O), _w(1, O), _w(1)
            Wc, Bc = _w(O, CD), _w(O)
            spec = _spec([{"name": "h", "op": "history_embedding", "input": "user.history", "table": "t"},
                          _lin("hl", "h", O, "silu"),
                          {"name": "ln", "op": "layer_norm", "input": "hl"},
                          {"name": "m", "op": "mul", "inputs": ["ln", "hl"]},
                          {"name": "s", "op": "add", "a": "m", "b": "hl"},
                          {"name": "p", "op": "pool", "input": "s", "fn": fn},
                          _lin("c", "candidate.dense", O),
                          {"name": "x", "op": "mul", "a": "p", "b": "c"},
                          _lin("lg", "x", 1)], "lg", history=True)

            def expect(u, c, hist=hist):
                ids, acts = hist
                rows = []
                for t, (i, a) in enumerate(zip(ids, acts)):
                    e = T[i % 7] + Ac[a] + Po[t]
                    hl = _act(Lw @ e + Lb, "silu")
                    rows.append(_naive_layer_norm(hl, G, Bb, 1e-5) * hl + hl)
                if not rows:
                    p = np.zeros(O)
                else:
                    R = np.array(rows)
                    p = {"mean": R.sum(0) / len(R), "sum": R.sum(0), "max": R.max(0), "last": R[-1]}[fn]
                return W @ (p * (Wc @ c + Bc)) + B
            oks.append(_check("jagged pool %s L=%d" % (fn, len(hist[0])), spec,
                              {"tables.t": T, "h.action": Ac, "h.position": Po, "hl.weight": Lw, "hl.bias": Lb,
                               "ln.weight": G, "ln.bias": Bb, "c.weight": Wc, "c.bias": Bc,
                               "lg.weight": W, "lg.bias": B}, expect, hist=hist))
    return all(oks)


def case_dot_concat():
    """dot_interaction over interleaved user/candidate [D] and [K, D] inputs, self on/off; concat."""
    oks = []
    for self_ in (False, True):
        Wu, Bu, Wc, Bc = _w(2 * D, UD), _w(2 * D), _w(D, CD), _w(D)
        k = 3
        npairs = k * (k + 1) // 2 if self_ else k * (k - 1) // 2
        W, B = _w(1, D + npairs), _w(1)
        spec = _spec([_lin("u", "user.dense", 2 * D), {"name": "ut", "op": "reshape", "input": "u", "tokens": 2},
                      _lin("c", "candidate.dense", D, "tanh"),
                      {"name": "di", "op": "dot_interaction", "inputs": ["ut", "c"], "self": self_}
                      if self_ else {"name": "di", "op": "dot_interaction", "inputs": ["ut", "c"]},
                      {"name": "cc", "op": "concat", "inputs": ["c", "di"]}, _lin("lg", "cc", 1)], "lg")

        def expect(u, c, self_=self_):
            ut = (Wu @ u + Bu).reshape(2, D)
            cv = np.tanh(Wc @ c + Bc)
            T = [ut[0], ut[1], cv]
            pairs = [sum(T[i][d] * T[j][d] for d in range(D))
                     for i in range(3) for j in range(3) if (j >= i if self_ else j > i)]
            return W @ np.concatenate([cv, pairs]) + B
        oks.append(_check("dot_interaction self=%s" % self_, spec,
                          {"u.weight": Wu, "u.bias": Bu, "c.weight": Wc, "c.bias": Bc, "lg.weight": W, "lg.bias": B},
                          expect))
    return all(oks)


def case_cross_mixture():
    """cross full and low rank, then a mixture of 3 experts; 2 tasks via concat of [1]."""
    F_, R, E = CD, 2, 3
    CW, CB, U_, V_, CB2 = _w(F_, F_), _w(F_), _w(F_, R), _w(R, F_), _w(F_)
    EW, EB, GW, GB = [_w(2, F_) for _ in range(E)], [_w(2) for _ in range(E)], _w(E, F_), _w(E)
    T0, T0b, T1, T1b = _w(1, 2), _w(1), _w(1, 2), _w(1)
    layers = [{"name": "x1", "op": "cross", "x0": "candidate.dense", "input": "candidate.dense"},
              {"name": "x2", "op": "cross", "x0": "candidate.dense", "input": "x1", "rank": R}]
    w = {"x1.weight": CW, "x1.bias": CB, "x2.u": U_, "x2.v": V_, "x2.bias": CB2,
         "g.weight": GW, "g.bias": GB, "t0.weight": T0, "t0.bias": T0b, "t1.weight": T1, "t1.bias": T1b}
    for e in range(E):
        layers.append(_lin("e%d" % e, "x2", 2, "relu"))
        w["e%d.weight" % e], w["e%d.bias" % e] = EW[e], EB[e]
    layers += [_lin("g", "x2", E), {"name": "mx", "op": "mixture", "experts": ["e0", "e1", "e2"], "gate": "g"},
               _lin("t0", "mx", 1), _lin("t1", "mx", 1), {"name": "lg", "op": "concat", "inputs": ["t0", "t1"]}]
    _T[0] = 2
    spec = _spec(layers, "lg")
    _T[0] = 1

    def expect(u, c):
        x1 = c * (CW @ c + CB) + c
        x2 = c * (U_ @ (V_ @ x1) + CB2) + x1
        ex = [np.maximum(EW[e] @ x2 + EB[e], 0) for e in range(E)]
        gl = GW @ x2 + GB
        g = np.exp(gl - gl.max())
        g = g / g.sum()
        mx = sum(g[e] * ex[e] for e in range(E))
        return np.concatenate([T0 @ mx + T0b, T1 @ mx + T1b])
    return _check("cross + mixture", spec, w, expect)


# ---------------------------------------------------------------- sequence ops
# These go through a RankRequest (parse_request's max_len cut; the batched
# module with two users of different lengths, so its padding masks are used).

MAX_LEN = 5                  # _spec(history=True): max_len 5, actions 2, table t [7, D]
OTHER_HIST = ([4, 0, 6, 2, 5, 1], [1, 0, 1, 1, 0, 0])     # the second user: longer than max_len


def _f32(x):
    return np.asarray(x, dtype=np.float32).astype(np.float64)


def _run_req(spec, weights, users, cands):
    """users: [(dense, ids, acts)], cands: [(dense, user)] -> (ref logits [C, T], module logits [C, T])."""
    plan = ikbo_ref.analyze(spec)
    w = {n: torch.tensor(weights[n], dtype=torch.float64) for n in plan.param_shapes}
    model = ikbo_ref.Model(None, spec, plan, w, {})
    req = {"users": [{"dense": [float(v) for v in d], "historyIds": list(i), "historyActions": list(a)}
                     for d, i, a in users],
           "candidates": [{"id": k, "user": u, "dense": [float(v) for v in d]} for k, (d, u) in enumerate(cands)]}
    us, cs = ikbo_ref.parse_request(plan, req)
    a = np.stack([ikbo_ref.forward_one(model, us[c["user"]], c).numpy() for c in cs])
    m = export.IkboModule(spec, dtype=torch.float64)
    with torch.no_grad():
        for n, t in w.items():
            m.param(n).copy_(t)
        b = m(export.batch_from_request(plan, req)).numpy()
    return a, b


def _check_seq(name, spec, weights, expect, hist):
    """expect(user dense, cand dense, kept ids, kept actions) -> logits; candidate 0 of the user with
    `hist`, candidate 1 of a second user with OTHER_HIST."""
    users = [(_f32(RNG.normal(size=UD)),) + tuple(hist), (_f32(RNG.normal(size=UD)),) + OTHER_HIST]
    cands = [(_f32(RNG.normal(size=CD)), 0), (_f32(RNG.normal(size=CD)), 1)]
    want = np.stack([expect(users[u][0], c, list(users[u][1])[-MAX_LEN:], list(users[u][2])[-MAX_LEN:])
                     for c, u in cands])
    a, b = _run_req(spec, weights, users, cands)
    err = max(np.abs(a - want).max(), np.abs(b - want).max()) / max(1.0, np.abs(want).max())
    ok = err < 1e-12
    print("  %-26s %.1e %s" % (name, err, "ok" if ok else "FAIL: ref %s module %s want %s" % (a, b, want)))
    return ok


HISTS = {0: ([], []), 1: ([3], [1]), MAX_LEN: ([3, 9, 1, 0, 12], [0, 1, 1, 0, 1]),
         7: ([8, 3, 9, 1, 0, 12, 5], [1, 1, 0, 1, 1, 0, 0])}


def _hist_rows(T, Ac, Po, ids, acts):
    return np.array([T[i % 7] + Ac[a] + Po[t] for t, (i, a) in enumerate(zip(ids, acts))]).reshape(-1, D)


def _naive_self_attention(X, Wq, Wk, Wv, Wo, H, dh, causal, kind):
    n = len(X)
    out = np.zeros((n, D))
    for i in range(n):
        cat = np.zeros(H * dh)
        for h in range(H):
            rows = slice(h * dh, (h + 1) * dh)
            q = Wq[rows] @ X[i]
            js = range(i + 1) if causal else range(n)
            sc = [sum(q[e] * (Wk[rows] @ X[j])[e] for e in range(dh)) / math.sqrt(dh) for j in js]
            if kind == "softmax":
                mx = max(sc)
                ex = [math.exp(v - mx) for v in sc]
                wts = [v / sum(ex) for v in ex]
            else:
                wts = [v / (1 + math.exp(-v)) / n for v in sc]        # n = the kept event count
            cat[rows] = sum(wt * (Wv[rows] @ X[j]) for wt, j in zip(wts, js))
        out[i] = Wo @ cat
    return out


def _naive_target_attention(q, X, Wq, Wk, Wv, Wo, H, dh):
    if len(X) == 0:
        return np.zeros(D)
    cat = np.zeros(H * dh)
    for h in range(H):
        rows = slice(h * dh, (h + 1) * dh)
        sc = [(Wq[rows] @ q) @ (Wk[rows] @ x) / math.sqrt(dh) for x in X]
        ex = [math.exp(v - max(sc)) for v in sc]
        cat[rows] = sum(e / sum(ex) * (Wv[rows] @ x) for e, x in zip(ex, X))
    return Wo @ cat


def _sa_weights(H, dh):
    return {"tables.t": _w(7, D), "h.action": _w(2, D), "h.position": _w(MAX_LEN, D),
            "sa.wq": _w(H * dh, D), "sa.wk": _w(H * dh, D), "sa.wv": _w(H * dh, D), "sa.wo": _w(D, H * dh)}


def case_self_attention():
    """history -> self_attention (causal on/off, softmax/silu) -> sum(sa * h), last, mean pools -> mixed
    with the candidate by mul; L = 0, 1, max_len and longer than max_len."""
    oks = []
    H, dh = 2, 2
    for causal in (True, False):
        for kind in ("softmax", "silu"):
            for L, hist in HISTS.items():
                w = _sa_weights(H, dh)
                w.update({"u.weight": _w(D, 3 * D), "u.bias": _w(D), "c.weight": _w(D, CD), "c.bias": _w(D),
                          "lg.weight": _w(1, D), "lg.bias": _w(1)})
                sa = {"name": "sa", "op": "self_attention", "input": "h", "heads": H, "head_dim": dh}
                if not causal or RNG.random() < 0.5:            # causal true: sometimes by default
                    sa["causal"] = causal
                if kind == "silu" or RNG.random() < 0.5:
                    sa["kind"] = kind
                spec = _spec([{"name": "h", "op": "history_embedding", "input": "user.history", "table": "t"}, sa,
                              {"name": "m", "op": "mul", "inputs": ["sa", "h"]},
                              {"name": "p1", "op": "pool", "input": "m", "fn": "sum"},
                              {"name": "p2", "op": "pool", "input": "sa", "fn": "last"},
                              {"name": "p3", "op": "pool", "input": "sa", "fn": "mean"},
                              {"name": "pc", "op": "concat", "inputs": ["p1", "p2", "p3"]},
                              _lin("u", "pc", D), _lin("c", "candidate.dense", D),
                              {"name": "x", "op": "mul", "a": "u", "b": "c"}, _lin("lg", "x", 1)], "lg",
                             history=True)

                def expect(u, c, ids, acts, w=w, causal=causal, kind=kind):
                    X = _hist_rows(w["tables.t"], w["h.action"], w["h.position"], ids, acts)
                    S = _naive_self_attention(X, w["sa.wq"], w["sa.wk"], w["sa.wv"], w["sa.wo"], H, dh, causal, kind)
                    n = len(X)
                    p1 = (S * X).sum(0) if n else np.zeros(D)
                    p2 = S[-1] if n else np.zeros(D)
                    p3 = S.sum(0) / n if n else np.zeros(D)
                    uu = w["u.weight"] @ np.concatenate([p1, p2, p3]) + w["u.bias"]
                    return w["lg.weight"] @ (uu * (w["c.weight"] @ c + w["c.bias"])) + w["lg.bias"]
                oks.append(_check_seq("self_attn %s causal=%d L=%d" % (kind, causal, L), spec, w, expect, hist))
    return all(oks)


def case_shared_target_attention():
    """target_attention shared_with a self_attention (silu and causal there: the target part is still
    softmax without mask); [D] and [2, D] queries; the SA output also used."""
    oks = []
    H, dh = 3, 2
    for kind, causal in (("silu", True), ("softmax", False)):
        for tq in (1, 2):
            for L, hist in HISTS.items():
                w = _sa_weights(H, dh)
                w.update({"q.weight": _w(tq * D, CD), "q.bias": _w(tq * D), "lg.bias": _w(1),
                          "ln.weight": _w(D), "ln.bias": _w(D)})
                layers = [{"name": "h", "op": "history_embedding", "input": "user.history", "table": "t"},
                          {"name": "ln", "op": "layer_norm", "input": "h"},
                          {"name": "sa", "op": "self_attention", "input": "ln", "heads": H, "head_dim": dh,
                           "causal": causal, "kind": kind},
                          {"name": "sp", "op": "pool", "input": "sa", "fn": "last"},
                          _lin("q", "candidate.dense", tq * D)]
                if tq == 2:
                    layers.append({"name": "qt", "op": "reshape", "input": "q", "tokens": 2})
                layers += [{"name": "ta", "op": "target_attention", "query": "qt" if tq == 2 else "q",
                            "history": "ln", "shared_with": "sa"},
                           {"name": "tf", "op": "flatten", "input": "ta"},
                           _lin("sl", "sp", tq * D),                # the SA output joins through add
                           {"name": "x", "op": "add", "a": "tf", "b": "sl"},
                           {"name": "cc", "op": "concat", "inputs": ["x", "tf"]}]
                w.update({"sl.weight": _w(tq * D, D), "sl.bias": _w(tq * D), "lg.weight": _w(1, 2 * tq * D)})
                layers.append(_lin("lg", "cc", 1))
                spec = _spec(layers, "lg", history=True)

                def expect(u, c, ids, acts, w=w, tq=tq, kind=kind, causal=causal):
                    X = _hist_rows(w["tables.t"], w["h.action"], w["h.position"], ids, acts)
                    N = np.array([_naive_layer_norm(x, w["ln.weight"], w["ln.bias"], 1e-5) for x in X]).reshape(-1, D)
                    S = _naive_self_attention(N, w["sa.wq"], w["sa.wk"], w["sa.wv"], w["sa.wo"], H, dh, causal, kind)
                    sp = S[-1] if len(S) else np.zeros(D)
                    Q = (w["q.weight"] @ c + w["q.bias"]).reshape(tq, D)
                    tf = np.concatenate([_naive_target_attention(Q[k], N, w["sa.wq"], w["sa.wk"], w["sa.wv"],
                                                                 w["sa.wo"], H, dh) for k in range(tq)])
                    x = tf + w["sl.weight"] @ sp + w["sl.bias"]
                    return w["lg.weight"] @ np.concatenate([x, tf]) + w["lg.bias"]
                oks.append(_check_seq("shared ta %s Tq=%d L=%d" % (kind, tq, L), spec, w, expect, hist))
    return all(oks)


def case_din_attention():
    """din_attention over the history embeddings, every activation, normalize softmax/none, each L."""
    oks = []
    H1 = 4
    for act in ("relu", "none", "sigmoid", "gelu", "silu", "tanh"):
        for norm in ("softmax", "none"):
            for L, hist in HISTS.items():
                if act not in ("relu", "gelu") and L in (1, 7):       # every act at L = 0 and max_len
                    continue
                w = {"tables.t": _w(7, D), "h.action": _w(2, D), "h.position": _w(MAX_LEN, D),
                     "q.weight": _w(D, CD), "q.bias": _w(D), "din.w1": _w(H1, 4 * D), "din.b1": _w(H1),
                     "din.w2": _w(1, H1), "din.b2": _w(1), "lg.weight": _w(1, D), "lg.bias": _w(1)}
                din = {"name": "din", "op": "din_attention", "query": "q", "history": "h", "hidden": H1}
                if act != "relu" or RNG.random() < 0.5:
                    din["activation"] = act
                if norm != "softmax" or RNG.random() < 0.5:
                    din["normalize"] = norm
                spec = _spec([{"name": "h", "op": "history_embedding", "input": "user.history", "table": "t"},
                              _lin("q", "candidate.dense", D), din, _lin("lg", "din", 1)], "lg", history=True)

                def expect(u, c, ids, acts, w=w, act=act, norm=norm):
                    X = _hist_rows(w["tables.t"], w["h.action"], w["h.position"], ids, acts)
                    q = w["q.weight"] @ c + w["q.bias"]
                    s = []
                    for x in X:
                        z = _act(w["din.w1"] @ np.concatenate([q, x, q - x, q * x]) + w["din.b1"], act)
                        s.append(sum(w["din.w2"][0, k] * z[k] for k in range(H1)) + w["din.b2"][0])
                    if norm == "softmax" and s:
                        ex = [math.exp(v - max(s)) for v in s]
                        s = [e / sum(ex) for e in ex]
                    out = sum((a * x for a, x in zip(s, X)), np.zeros(D))
                    return w["lg.weight"] @ out + w["lg.bias"]
                oks.append(_check_seq("din %s %s L=%d" % (act, norm, L), spec, w, expect, hist))
    return all(oks)


# ---------------------------------------------------------------- "planning": "auto"
# Broadcast form (MODEL_FORMAT.md, "Automatic planning"): any op may mix user
# and candidate inputs, a user operand meaning its copy at each of its user's
# candidates. Two users, one candidate each (_check_seq), so a wrong user row
# shows; the expectations are plain loops over one candidate and its user.

def _auto(layers, logits, tasks=1):
    _T[0] = tasks
    spec = _spec(layers, logits, history=True)
    _T[0] = 1
    spec["planning"] = "auto"
    return spec


def _weights(spec):
    """Random weights of every tensor the spec declares (shapes from analyze)."""
    return {n: _w(*s) for n, s in ikbo_ref.analyze(spec).param_shapes.items()}


def _L(w, name, x, act="none"):
    """Naive nn.Linear of layer `name` on one vector."""
    return _act(np.array([sum(w[name + ".weight"][o, i] * x[i] for i in range(len(x))) + w[name + ".bias"][o]
                          for o in range(len(w[name + ".bias"]))]), act)


def _auto_base():
    """u1 [D], ut [2, D] (user); c1 [D], ct [2, D] (candidate); h the history."""
    return [{"name": "h", "op": "history_embedding", "input": "user.history", "table": "t"},
            _lin("u1", "user.dense", D), _lin("u2", "user.dense", 2 * D, "tanh"),
            {"name": "ut", "op": "reshape", "input": "u2", "tokens": 2},
            _lin("c1", "candidate.dense", D), _lin("c2", "candidate.dense", 2 * D, "relu"),
            {"name": "ct", "op": "reshape", "input": "c2", "tokens": 2}]


def _base_vals(w, u, c):
    return {"u1": _L(w, "u1", u), "ut": _L(w, "u2", u, "tanh").reshape(2, D),
            "c1": _L(w, "c1", c), "ct": _L(w, "c2", c, "relu").reshape(2, D)}


def _tl(W, T):
    return np.array([[sum(W[m, k] * T[k][d] for k in range(len(T))) for d in range(D)] for m in range(len(W))])


def _dots(T, self_):
    return [sum(T[i][d] * T[j][d] for d in range(D)) for i in range(len(T)) for j in range(len(T))
            if (j >= i if self_ else j > i)]


def _cross(x0, Wm, b, x):
    return np.array([x0[i] * (sum(Wm[i, j] * x[j] for j in range(len(x))) + b[i]) + x[i] for i in range(len(x))])


def _mix(gate, experts):
    g = np.exp(gate - gate.max())
    g = g / g.sum()
    return sum(g[e] * experts[e] for e in range(len(experts)))


def _auto_models():
    """[(name, layers, logits, tasks, expect(w, u, c, X) -> logits)]; X the kept history rows."""
    B = _auto_base()
    stack_tl = [{"name": "st", "op": "stack", "inputs": ["u1", "ct", "ut"]},
                {"name": "tl", "op": "token_linear", "input": "st", "out_tokens": 3},
                {"name": "fl", "op": "flatten", "input": "tl"}, _lin("lg", "fl", 1)]

    def e_stack_tl(w, u, c, X):
        v = _base_vals(w, u, c)
        T = [v["u1"], v["ct"][0], v["ct"][1], v["ut"][0], v["ut"][1]]
        return _L(w, "lg", _tl(w["tl.weight"], T).reshape(-1))
    out = [("stack u/c/u -> token_linear", B + stack_tl, "lg", 1, e_stack_tl)]
    for act in ("none", "relu"):
        def e_cat_lin(w, u, c, X, act=act):
            v = _base_vals(w, u, c)
            return _L(w, "lg", _L(w, "l", np.concatenate([u, c, v["u1"], v["c1"]]), act))
        out.append(("concat u/c/u/c -> linear " + act,
                    B + [{"name": "cc", "op": "concat", "inputs": ["user.dense", "candidate.dense", "u1", "c1"]},
                         _lin("l", "cc", 3, act), _lin("lg", "l", 1)], "lg", 1, e_cat_lin))

    def e_norm_act(w, u, c, X):
        v = _base_vals(w, u, c)
        cc = np.concatenate([v["u1"], c])
        return _L(w, "lg", _naive_layer_norm(cc, w["ln.weight"], w["ln.bias"], 1e-5) + _act(cc, "silu"))
    out.append(("layer_norm + activation of mixed concat",
                B + [{"name": "cc", "op": "concat", "inputs": ["u1", "candidate.dense"]},
                     {"name": "ln", "op": "layer_norm", "input": "cc"},
                     {"name": "ac", "op": "activation", "input": "cc", "fn": "silu"},
                     {"name": "s", "op": "add", "a": "ln", "b": "ac"}, _lin("lg", "s", 1)], "lg", 1, e_norm_act))
    for self_ in (False, True):
        def e_dot(w, u, c, X, self_=self_):
            v = _base_vals(w, u, c)
            T = [v["ut"][0], v["ut"][1], v["c1"], v["u1"]]
            return _L(w, "lg", np.array(_dots(T, self_) + _dots([v["u1"], v["ct"][0], v["ct"][1]], self_)))
        di = {"name": "di", "op": "dot_interaction", "inputs": ["st"], "self": self_}
        out.append(("mixed stack -> dot self=%s" % self_,
                    B + [{"name": "st", "op": "stack", "inputs": ["ut", "c1", "u1"]}, di,
                         {"name": "d2", "op": "dot_interaction", "inputs": ["u1", "ct"], "self": self_},
                         {"name": "cc", "op": "concat", "inputs": ["di", "d2"]}, _lin("lg", "cc", 1)],
                    "lg", 1, e_dot))

    def e_cross(w, u, c, X):
        uc = _L(w, "ux", u)
        x1 = _cross(uc, w["x1.weight"], w["x1.bias"], c)
        x2 = _cross(c, w["x2.u"] @ w["x2.v"], w["x2.bias"], uc)
        return _L(w, "lg", np.concatenate([x1, x2]))
    out.append(("cross user x0 / user input",
                B + [_lin("ux", "user.dense", CD),
                     {"name": "x1", "op": "cross", "x0": "ux", "input": "candidate.dense"},
                     {"name": "x2", "op": "cross", "x0": "candidate.dense", "input": "ux", "rank": 2},
                     {"name": "cc", "op": "concat", "inputs": ["x1", "x2"]}, _lin("lg", "cc", 1)], "lg", 1, e_cross))

    def e_mixture(w, u, c, X):
        v = _base_vals(w, u, c)
        m1 = _mix(_L(w, "g1", c), [v["u1"], v["c1"], _L(w, "e2", u)])
        m2 = _mix(_L(w, "g2", u), [v["c1"], _L(w, "e3", c)])
        return np.concatenate([_L(w, "t0", m1), _L(w, "t1", m2)])
    out.append(("mixture user experts / user gate",
                B + [_lin("e2", "user.dense", D), _lin("e3", "candidate.dense", D),
                     _lin("g1", "candidate.dense", 3), _lin("g2", "user.dense", 2),
                     {"name": "m1", "op": "mixture", "experts": ["u1", "c1", "e2"], "gate": "g1"},
                     {"name": "m2", "op": "mixture", "experts": ["c1", "e3"], "gate": "g2"},
                     _lin("t0", "m1", 1), _lin("t1", "m2", 1),
                     {"name": "lg", "op": "concat", "inputs": ["t0", "t1"]}], "lg", 2, e_mixture))

    def e_shared(w, u, c, X):
        v = _base_vals(w, u, c)
        T = [v["u1"], v["ct"][0], v["ct"][1]]
        z = _tl(w["tl.weight"], T).reshape(-1)
        cc = np.concatenate([u, v["c1"]])
        fl = np.concatenate(T)
        return _L(w, "lg", np.concatenate([z, fl, _L(w, "a", cc, "relu"), _L(w, "b", cc)]))
    out.append(("one stack flatten+token_linear, one concat two linears",
                B + [{"name": "st", "op": "stack", "inputs": ["u1", "ct"]},
                     {"name": "tl", "op": "token_linear", "input": "st", "out_tokens": 2},
                     {"name": "tf", "op": "flatten", "input": "tl"}, {"name": "fl", "op": "flatten", "input": "st"},
                     {"name": "cc", "op": "concat", "inputs": ["user.dense", "c1"]},
                     _lin("a", "cc", 2, "relu"), _lin("b", "cc", 3),
                     {"name": "all", "op": "concat", "inputs": ["tf", "fl", "a", "b"]}, _lin("lg", "all", 1)],
                "lg", 1, e_shared))

    def e_attn(w, u, c, X):
        v = _base_vals(w, u, c)
        Q = [v["u1"], v["c1"]]                           # a mixed stack as the query
        ta = np.concatenate([_naive_target_attention(q, X, w["ta.wq"], w["ta.wk"], w["ta.wv"], w["ta.wo"], 2, 2)
                             for q in Q])
        q = v["u1"] * v["c1"]
        s = [sum(w["din.w2"][0, k] * z[k] for k in range(3)) + w["din.b2"][0]
             for z in (_act(w["din.w1"] @ np.concatenate([q, x, q - x, q * x]) + w["din.b1"], "relu") for x in X)]
        a = np.exp(np.array(s) - max(s)) / np.exp(np.array(s) - max(s)).sum() if s else []
        din = sum((ai * x for ai, x in zip(a, X)), np.zeros(D))
        return _L(w, "lg", np.concatenate([ta, din, (v["ut"] * v["ct"]).reshape(-1)]))
    out.append(("attention, mixed query; mul of tokens",
                B + [{"name": "qs", "op": "stack", "inputs": ["u1", "c1"]},
                     {"name": "ta", "op": "target_attention", "query": "qs", "history": "h", "heads": 2,
                      "head_dim": 2},
                     {"name": "taf", "op": "flatten", "input": "ta"},
                     {"name": "q", "op": "mul", "a": "u1", "b": "c1"},
                     {"name": "din", "op": "din_attention", "query": "q", "history": "h", "hidden": 3},
                     {"name": "m", "op": "mul", "a": "ut", "b": "ct"}, {"name": "mf", "op": "flatten", "input": "m"},
                     {"name": "all", "op": "concat", "inputs": ["taf", "din", "mf"]}, _lin("lg", "all", 1)],
                "lg", 1, e_attn))
    return out


def case_auto():
    """Each broadcast-form model vs plain loops, L = 0 and max_len (the second user longer); then the
    same layers without "planning" refused (naming a layer), and a bad "planning" value refused."""
    oks = []
    for name, layers, logits, tasks, expect in _auto_models():
        spec = _auto(layers, logits, tasks)
        for L in (0, MAX_LEN):
            w = _weights(spec)

            def ex(u, c, ids, acts, w=w, expect=expect):
                return expect(w, u, c, _hist_rows(w["tables.t"], w["h.action"], w["h.position"], ids, acts))
            oks.append(_check_seq("auto %s L=%d" % (name, L), spec, w, ex, HISTS[L]))
        manual = dict(spec)
        del manual["planning"]
        try:
            ikbo_ref.analyze(manual)
            print("  refuse manual %-40s FAIL: accepted" % name)
            oks.append(False)
        except ikbo_ref.ModelError as e:
            ok = "mixes user and candidate" in str(e) and "layer '" in str(e)
            print("  refuse manual %-40s %s" % (name, "ok" if ok else "FAIL: %s" % e))
            oks.append(ok)
    spec = _auto(_auto_models()[0][1], "lg")
    for bad in ("manual", "Auto", True, None, ["auto"]):
        spec["planning"] = bad
        try:
            ikbo_ref.analyze(spec)
            print("  refuse planning %-12r FAIL: accepted" % (bad,))
            oks.append(False)
        except ikbo_ref.ModelError as e:
            ok = "planning" in str(e) and repr(bad) in str(e)
            print("  refuse planning %-12r %s" % (bad, "ok" if ok else "FAIL: %s" % e))
            oks.append(ok)
    return all(oks)


def case_empty_batch():
    """Every history of the batch empty (the module's padded width is 0): each pool fn gives zeros,
    as in the interpreter."""
    oks = []
    for fn in ("mean", "sum", "max", "last"):
        spec = _spec([{"name": "h", "op": "history_embedding", "input": "user.history", "table": "t"},
                      {"name": "p", "op": "pool", "input": "h", "fn": fn}, _lin("c", "candidate.dense", D),
                      {"name": "x", "op": "add", "a": "p", "b": "c"}, _lin("lg", "x", 1)], "lg", history=True)
        w = _weights(spec)
        users = [(_f32(RNG.normal(size=UD)), [], []), (_f32(RNG.normal(size=UD)), [], [])]
        cands = [(_f32(RNG.normal(size=CD)), 0), (_f32(RNG.normal(size=CD)), 1)]
        want = np.stack([w["lg.weight"] @ (w["c.weight"] @ c + w["c.bias"]) + w["lg.bias"] for c, _ in cands])
        a, b = _run_req(spec, w, users, cands)
        err = max(np.abs(a - want).max(), np.abs(b - want).max()) / max(1.0, np.abs(want).max())
        ok = err < 1e-12
        print("  %-26s %.1e %s" % ("all-empty pool " + fn, err, "ok" if ok else "FAIL: %s %s %s" % (a, b, want)))
        oks.append(ok)
    return all(oks)


def _bad(name, layers, needle, history=False):
    spec = _spec(layers, layers[-1]["name"], history)
    try:
        ikbo_ref.analyze(spec)
    except ikbo_ref.ModelError as e:
        ok = needle in str(e)
        print("  refuse %-19s %s" % (name, "ok" if ok else "FAIL: %s" % e))
        return ok
    print("  refuse %-19s FAIL: accepted" % name)
    return False


def case_refusals():
    c1 = _lin("lg", "c", 1)
    hist = {"name": "h", "op": "history_embedding", "input": "user.history", "table": "t"}
    u = _lin("u", "user.dense", CD)
    cases = [
        ("mixed concat", [u, {"name": "c", "op": "concat", "inputs": ["u", "candidate.dense"]}, c1], "layer 'c'"),
        ("mixed cross", [u, {"name": "c", "op": "cross", "x0": "u", "input": "candidate.dense"}, c1], "layer 'c'"),
        ("mixed mixture", [u, _lin("g", "candidate.dense", 2),
                           {"name": "c", "op": "mixture", "experts": ["u", "candidate.dense"], "gate": "g"}, c1],
         "layer 'c'"),
        ("unknown key", [{"name": "c", "op": "pool", "input": "candidate.dense", "fn": "sum", "axis": 0}, c1],
         "unknown key"),
        ("pool of a vector", [{"name": "c", "op": "pool", "input": "candidate.dense", "fn": "sum"}, c1], "layer 'c'"),
        ("missing fn", [{"name": "c", "op": "activation", "input": "candidate.dense"}, c1], "missing key"),
        ("bad fn", [{"name": "c", "op": "activation", "input": "candidate.dense", "fn": "none"}, c1], "layer 'c'"),
        ("one token, no self", [{"name": "c", "op": "dot_interaction", "inputs": ["candidate.dense"]}, c1],
         "layer 'c'"),
        ("dot of jagged", [hist, {"name": "c", "op": "dot_interaction", "inputs": ["h", "h"]}, c1], "layer 'c'"),
        ("gate size", [{"name": "c", "op": "mixture", "experts": ["candidate.dense"], "gate": "candidate.dense"},
                       c1], "layer 'c'"),
        ("mul shapes", [u, {"name": "c", "op": "mul", "a": "u", "b": "user.dense"}, c1], "layer 'c'"),
        ("jagged mul mixed", [hist, _lin("hc", "candidate.dense", D),
                              {"name": "r", "op": "reshape", "input": "hc", "tokens": 1},
                              {"name": "c", "op": "mul", "a": "h", "b": "r"}, c1], "layer 'c'"),
        ("eps <= 0", [{"name": "c", "op": "layer_norm", "input": "candidate.dense", "eps": 0}, c1], "layer 'c'"),
        ("concat of tokens", [{"name": "r", "op": "reshape", "input": "candidate.dense", "tokens": 2},
                              {"name": "c", "op": "concat", "inputs": ["r"]}, c1], "layer 'c'"),
        ("token_linear jagged", [hist, {"name": "c", "op": "token_linear", "input": "h", "out_tokens": 2}, c1],
         "layer 'c'"),
        # an op that is not a string: a refusal naming it, not a TypeError (unhashable in the op table)
        ("op a list", [{"name": "c", "op": ["linear"], "input": "candidate.dense", "out": 2}, c1],
         "layer 'c': unknown op ['linear']"),
        ("op an object", [{"name": "c", "op": {}, "input": "candidate.dense"}, c1], "unknown op {}"),
    ]
    oks = [_bad(n, layers, needle, history=(layers[0] is hist)) for n, layers, needle in cases]

    # Sequence ops: each message must name the layer ('c').
    ln = {"name": "ln", "op": "layer_norm", "input": "h"}
    sa = {"name": "sa", "op": "self_attention", "input": "ln", "heads": 1, "head_dim": 2}
    q = _lin("q", "candidate.dense", D)
    ut = _lin("ut", "user.dense", D)

    def sa_c(**kw):
        l = {"name": "c", "op": "self_attention", "input": "h", "heads": 2, "head_dim": 2}
        l.update(kw)
        return [hist, l, {"name": "cp", "op": "pool", "input": "c", "fn": "sum"}, q,
                {"name": "lg", "op": "mul", "a": "cp", "b": "q"}]

    def din_c(**kw):
        l = {"name": "c", "op": "din_attention", "query": "q", "history": "h", "hidden": 3}
        l.update(kw)
        return [hist, q, ut, {"name": "ur", "op": "reshape", "input": "ut", "tokens": 1}, l, c1]

    def ta_c(**kw):
        l = {"name": "c", "op": "target_attention", "query": "q", "history": "ln", "shared_with": "sa"}
        l.update(kw)
        return [hist, ln, sa, q, l, {"name": "cf", "op": "flatten", "input": "c"}, _lin("lg", "cf", 1)]

    k = [hist, {"name": "tk", "op": "reshape", "input": "user.dense", "tokens": 2}]
    seq_cases = [
        ("sa of tokens", k + [{"name": "c", "op": "self_attention", "input": "tk", "heads": 1, "head_dim": 2}, c1]),
        ("sa of a vector", [hist, {"name": "c", "op": "self_attention", "input": "user.dense", "heads": 1,
                                   "head_dim": 2}, c1]),
        ("sa missing heads", [hist, {"name": "c", "op": "self_attention", "input": "h", "head_dim": 2}, c1]),
        ("sa head_dim 0", sa_c(head_dim=0)),
        ("sa heads true", sa_c(heads=True)),
        ("sa kind relu", sa_c(kind="relu")),
        ("sa causal 1", sa_c(causal=1)),
        ("sa unknown key", sa_c(mask="causal")),
        ("din query user", din_c(query="ut")),
        ("din query tokens", [hist, _lin("q2", "candidate.dense", 2 * D),
                              {"name": "q", "op": "reshape", "input": "q2", "tokens": 2},
                              {"name": "c", "op": "din_attention", "query": "q", "history": "h", "hidden": 3}, c1]),
        ("din history vector", din_c(history="ut")),
        ("din history tokens", din_c(history="ur")),
        ("din width", [hist, _lin("q", "candidate.dense", D + 1),
                       {"name": "c", "op": "din_attention", "query": "q", "history": "h", "hidden": 3}, c1]),
        ("din hidden 0", din_c(hidden=0)),
        ("din missing hidden", [hist, q, {"name": "c", "op": "din_attention", "query": "q", "history": "h"}, c1]),
        ("din activation", din_c(activation="softmax")),
        ("din normalize", din_c(normalize="sum")),
        ("ta shared + heads", ta_c(heads=1)),
        ("ta shared + head_dim", ta_c(head_dim=2)),
        ("ta shared not sa", ta_c(shared_with="ln")),
        ("ta shared unknown", ta_c(shared_with="nope")),
        ("ta shared later", [hist, ln, q, {"name": "c", "op": "target_attention", "query": "q", "history": "ln",
                                           "shared_with": "sa"}, sa,
                             {"name": "cf", "op": "flatten", "input": "c"}, _lin("lg", "cf", 1)]),
        ("ta shared other hist", ta_c(history="h")),
        ("ta shared sa output", [hist, ln, sa, q, {"name": "c", "op": "target_attention", "query": "q",
                                                   "history": "sa", "shared_with": "sa"}, c1]),
        ("ta no heads", [hist, q, {"name": "c", "op": "target_attention", "query": "q", "history": "h",
                                   "head_dim": 2}, c1]),
    ]
    for n, layers in seq_cases:
        oks.append(_bad(n, layers, "layer 'c'", history=True))
    return all(oks)


def main():
    print("test_ref_ops: reference ops vs naive loops")
    oks = [f() for f in (case_activations, case_tokens, case_jagged, case_dot_concat, case_cross_mixture,
                         case_self_attention, case_shared_target_attention, case_din_attention, case_auto,
                         case_empty_batch,
                         case_refusals)]
    print("test_ref_ops: %s" % ("ok" if all(oks) else "FAILED"))
    return 0 if all(oks) else 1


if __name__ == "__main__":
    sys.exit(main())
