#!/usr/bin/python3
"""Self-test of the reference for the ranking ops (run by golden.py first).

The C engine is checked against tools/reference/ikbo_ref.py, so the
reference itself needs a check that does not share its code: for each new op
(activation, layer_norm, concat, mul, token_linear, dot_interaction, cross
full and low rank, mixture, pool, linear over tokens and jagged, add/mul over
jagged) a tiny model is run through the interpreter (forward_one) and through
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
    ]
    return all([_bad(n, layers, needle, history=(layers[0] is hist)) for n, layers, needle in cases])


def main():
    print("test_ref_ops: reference ops vs naive loops")
    oks = [f() for f in (case_activations, case_tokens, case_jagged, case_dot_concat, case_cross_mixture,
                         case_refusals)]
    print("test_ref_ops: %s" % ("ok" if all(oks) else "FAILED"))
    return 0 if all(oks) else 1


if __name__ == "__main__":
    sys.exit(main())
