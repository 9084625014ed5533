#!/usr/bin/python3
"""The hand-written IKBO models - the demo (models/demo/1) and the bench model
(models/bench/make_bench_model.py) - as PyTorch modules written the usual
way (broadcast form), for the torch.fx importer's twin tests.

    plain_models.py check MODEL_DIR [--requests N]    # module vs reference interpreter

Both are one family (MODEL_FORMAT.md's reference architecture):
  user:      one nn.EmbeddingBag per user sparse feature, a dense MLP reshaped
             into tokens, the mean of the history (item + action + position
             embeddings; the item table is the candidates' item bag's table)
             -> E_user [Ku, D]
  candidate: bags and a dense MLP reshaped into tokens -> X [Tq, D];
             TargetAttention(X, history[cand_user]) [Tq, D]; (bench only) a
             second dense MLP reshaped into the rest tokens
             -> E_cand [Kc, D]
  LCE as a plain token mix of the concatenation: mix [M, Ku + Kc] @
  cat([E_user[cand_user], E_cand]) -> flatten -> top MLP -> logits [C, T].
The model.json gives the feature lists, pooling, widths, token counts and
the order of each stack's parts; from_model_dir builds the module and loads
the directory's weights (every tensor used, the LCE's w_user | w_cand as one
mix). A user tensor meets candidate tensors only as `x[cand_user]`: what
golden_auto.py imports with tools/importer and compares with the hand-written
model. `check` compares the module's float64 scores with the interpreter's
(pass: <= 1e-12 relative).
"""
import argparse
import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ikbo_ref  # noqa: E402
import make_request  # noqa: E402
import zoo  # noqa: E402


def module_inputs(plan, request):
    """A RankRequest dict as the modules' arguments (zoo.module_inputs with
    the model's own sparse feature lists; the history as (ids, actions,
    lengths))."""
    return zoo.feature_inputs(plan, request, plan.user_sparse, plan.cand_sparse)


def module_scores(m, plan, request):
    """The module's float64 scores for a RankRequest dict, in request order."""
    return zoo.module_scores(m, plan, request, inputs=module_inputs)


class TargetAttention(zoo._Heads, nn.Module):
    """Target attention of candidate queries [C, Tq, D] over their users'
    padded history [C, L, D] (mask [C, L]): bias-free q/k/v/o projections,
    `heads` heads of `head_dim`, softmax, no causal mask; the body is
    zoo._Heads.target (shared with zoo's transformer block)."""

    def __init__(self, heads, head_dim, d):
        super().__init__()
        self.heads, self.dh = heads, head_dim
        self.wq, self.wk, self.wv = (nn.Linear(d, heads * head_dim, bias=False) for _ in range(3))
        self.wo = nn.Linear(heads * head_dim, d, bias=False)

    def forward(self, q, a, mask):
        return self.target(q, a, mask)


class _Spec:
    """The layers of a model.json by name, with the family's lookups; any
    surprise is a ValueError naming the layer."""

    def __init__(self, spec, what):
        self.spec, self.what = spec, what
        self.layers = {l["name"]: l for l in spec["layers"]}
        self.used = set()

    def fail(self, msg):
        raise ValueError("%s: %s" % (self.what, msg))

    def get(self, name, *ops):
        layer = self.layers.get(name)
        if layer is None or layer["op"] not in ops:
            self.fail("expected %s %r, found %s" % (" or ".join(ops), name, layer and layer["op"]))
        self.used.add(name)
        return layer

    def one(self, op):
        ls = [l for l in self.spec["layers"] if l["op"] == op]
        if len(ls) != 1:
            self.fail("expected one %s layer, found %d" % (op, len(ls)))
        self.used.add(ls[0]["name"])
        return ls[0]

    def bags(self, side):
        """[(feature, layer)]: the embedding_bag layers of a side, in model.json order."""
        out = [(l["input"].split(".", 2)[2], l) for l in self.spec["layers"]
               if l["op"] == "embedding_bag" and l["input"].startswith(side + ".sparse.")]
        feats = [f for f, _ in out]
        if len(set(feats)) != len(feats):
            self.fail("a %s feature with two embedding_bag layers" % side)
        self.used.update(l["name"] for _, l in out)
        return out

    def chain(self, name, source):
        """The linear layers (in order) from `source` to the layer `name`."""
        out = []
        while name != source:
            layer = self.get(name, "linear")
            if layer.get("activation", "none") not in ("relu", "none"):
                self.fail("layer %r: activation %r" % (name, layer["activation"]))
            out.append(layer)
            name = layer["input"]
        return out[::-1]


class _LceRanker(nn.Module):
    """The family of the demo and bench models (module docstring); REST: the
    candidate stack has the extra dense "rest" tokens (the bench model)."""
    REST = False

    def __init__(self, spec, what="model.json"):
        super().__init__()
        p = _Spec(spec, "%s (%s)" % (what, type(self).__name__))
        inputs = spec["inputs"]
        self.sources = []                   # (parameter name, safetensors tensor name)
        tables = {}                         # table name -> the first bag's weight (tables are shared)

        def bags(side):
            emb, names = nn.ModuleDict(), {}
            for f, layer in p.bags(side):
                rows, dim = spec["tables"][layer["table"]]["rows"], spec["tables"][layer["table"]]["dim"]
                emb[f] = nn.EmbeddingBag(rows, dim, mode=layer["pooling"])
                if layer["table"] in tables:
                    emb[f].weight = tables[layer["table"]]
                else:
                    tables[layer["table"]] = emb[f].weight
                    self.sources.append(("%s_emb.%s.weight" % (side[:4], f), "tables." + layer["table"]))
                names[f] = layer["name"]
            return emb, names

        def mlp(attr, layers, fin):
            mods = []
            for layer in layers:
                self.sources += [("%s.%d.weight" % (attr, len(mods)), layer["name"] + ".weight"),
                                 ("%s.%d.bias" % (attr, len(mods)), layer["name"] + ".bias")]
                mods.append(nn.Linear(fin, layer["out"]))
                fin = layer["out"]
                if layer.get("activation", "none") == "relu":
                    mods.append(nn.ReLU())
            return nn.Sequential(*mods)

        def tokens(attr, name, side):
            """The reshape `name` of a linear chain over SIDE.dense -> (nn.Sequential self.ATTR, tokens)."""
            r = p.get(name, "reshape")
            return mlp(attr, p.chain(r["input"], side + ".dense"), inputs[side]["dense"]), r["tokens"]

        def op(name):                       # None for an input reference
            return p.layers.get(name, {}).get("op")

        def vector(name):
            return op(name) in ("embedding_bag", "mean_pool")

        def groups(stack):
            """A stack's inputs as [(names, is_vector)]: runs of vectors (torch.stack), token blocks."""
            out = []
            for n in stack["inputs"]:
                if vector(n) and out and out[-1][1]:
                    out[-1][0].append(n)
                else:
                    out.append(([n], vector(n)))
            return out

        self.user_emb, self.user_bag = bags("user")
        self.cand_emb, self.cand_bag = bags("candidate")
        hist = p.one("history_embedding")
        h = inputs["user"]["history"]
        rows, dim = spec["tables"][hist["table"]]["rows"], spec["tables"][hist["table"]]["dim"]
        self.hist_item = nn.Embedding(rows, dim)
        if hist["table"] in tables:         # the candidates' item table
            self.hist_item.weight = tables[hist["table"]]
        else:
            self.sources.append(("hist_item.weight", "tables." + hist["table"]))
        self.hist_action = nn.Embedding(h["actions"], dim)
        self.hist_pos = nn.Embedding(h["max_len"], dim)
        self.sources += [("hist_action.weight", hist["name"] + ".action"),
                         ("hist_pos.weight", hist["name"] + ".position")]
        pool = p.one("mean_pool")
        if pool["input"] != hist["name"]:
            p.fail("mean_pool %r is not over %r" % (pool["name"], hist["name"]))
        self.hist_mean = pool["name"]

        lce = p.one("lce")
        e_user, e_cand = p.get(lce["user"], "stack"), p.get(lce["candidate"], "stack")
        att = p.one("target_attention")
        if att["history"] != hist["name"] or "shared_with" in att:
            p.fail("target_attention %r: expected its own weights over %r" % (att["name"], hist["name"]))
        x_cand = p.get(att["query"], "stack")
        # the dense token blocks: one in E_user, one in X, and (REST) one more in E_cand
        u_tok = [n for n in e_user["inputs"] if op(n) == "reshape"]
        x_tok = [n for n in x_cand["inputs"] if op(n) == "reshape"]
        rest = [n for n in e_cand["inputs"] if n not in (x_cand["name"], att["name"])]
        if len(u_tok) != 1 or len(x_tok) != 1 or len(rest) != int(self.REST) or \
                e_cand["inputs"][:2] != [x_cand["name"], att["name"]]:
            p.fail("stacks %r %s, %r %s, %r %s do not have this architecture"
                   % (e_user["name"], e_user["inputs"], x_cand["name"], x_cand["inputs"],
                      e_cand["name"], e_cand["inputs"]))
        self.user_tokens = u_tok[0]
        self.user_dense, self.user_ntok = tokens("user_dense", u_tok[0], "user")
        self.cand_tokens = x_tok[0]
        self.cand_dense, self.cand_ntok = tokens("cand_dense", x_tok[0], "candidate")
        self.ta = TargetAttention(att["heads"], att["head_dim"], dim)
        self.sources += [("ta.%s.weight" % w, "%s.%s" % (att["name"], w)) for w in ("wq", "wk", "wv", "wo")]
        self.ta_name, self.x_name = att["name"], x_cand["name"]
        self.rest_tokens = rest[0] if rest else None
        self.cand_rest, self.rest_ntok = tokens("cand_rest", rest[0], "candidate") if rest else (None, 0)
        known = {**{v: "user" for v in self.user_bag.values()}, **{v: "cand" for v in self.cand_bag.values()},
                 self.hist_mean: "user", self.user_tokens: "user", self.cand_tokens: "cand"}
        for s, side in ((e_user, "user"), (x_cand, "cand")):
            bad = [n for n in s["inputs"] if known.get(n) != side]
            if bad:
                p.fail("stack %r: unexpected inputs %s" % (s["name"], bad))
        self.user_stack, self.x_stack, self.cand_stack = groups(e_user), groups(x_cand), groups(e_cand)

        self.lce = lce["name"]
        def ntok(n):
            layer = p.layers[n]
            return (1 if vector(n) else layer["tokens"] if op(n) == "reshape" else
                    ntok(layer["query"]) if op(n) == "target_attention" else sum(map(ntok, layer["inputs"])))

        self.mix = nn.Parameter(torch.zeros(lce["out_tokens"], ntok(e_user["name"]) + ntok(e_cand["name"])))
        logits = spec["output"]["logits"]
        flat = p.one("flatten")
        if flat["input"] != lce["name"]:
            p.fail("flatten %r is not of %r" % (flat["name"], lce["name"]))
        top = p.chain(logits, flat["name"])
        if not top or top[-1].get("activation", "none") != "none":
            p.fail("expected linear layers from %r to the logits %r" % (flat["name"], logits))
        self.top = mlp("top", top, lce["out_tokens"] * dim)
        left = sorted(set(p.layers) - p.used)
        if left:
            p.fail("layers this architecture does not have: %s" % ", ".join(left))

    @staticmethod
    def bag(emb, ids_offsets):
        ids, offsets = ids_offsets
        return emb(ids % emb.num_embeddings, offsets)   # the format's row rule

    @staticmethod
    def join(groups, parts):
        """A stack of parts in model.json order: runs of [N, D] vectors by torch.stack, a lone
        vector as v[:, None], [N, K, D] token blocks as they are, the pieces by torch.cat."""
        pieces = [torch.stack([parts[n] for n in names], dim=1) if vec and len(names) > 1
                  else parts[names[0]][:, None] if vec else parts[names[0]] for names, vec in groups]
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=1)

    def forward(self, user_dense, user_sparse, cand_dense, cand_sparse, cand_user, history):
        ids, acts, lens = history                   # [U, L] oldest first, left-aligned; [U]
        U, L = ids.shape
        mask = torch.arange(L)[None, :] < lens[:, None]
        h = self.hist_item(ids % self.hist_item.num_embeddings) + self.hist_action(acts) + self.hist_pos.weight[:L]
        # user parts, by model.json layer name
        u = {self.user_bag[f]: self.bag(emb, user_sparse[f]) for f, emb in self.user_emb.items()}
        u[self.hist_mean] = (h * mask[..., None]).sum(1) / lens.clamp(min=1)[:, None]
        ud = self.user_dense(user_dense)
        u[self.user_tokens] = ud.reshape(ud.shape[0], self.user_ntok, -1)
        e_user = self.join(self.user_stack, u)                              # [U, Ku, D]
        # candidate parts
        c = {self.cand_bag[f]: self.bag(emb, cand_sparse[f]) for f, emb in self.cand_emb.items()}
        cd = self.cand_dense(cand_dense)
        c[self.cand_tokens] = cd.reshape(cd.shape[0], self.cand_ntok, -1)
        x_cand = self.join(self.x_stack, c)                                 # [C, Tq, D]
        c[self.x_name] = x_cand
        c[self.ta_name] = self.ta(x_cand, h[cand_user], mask[cand_user])
        if self.cand_rest is not None:
            cr = self.cand_rest(cand_dense)
            c[self.rest_tokens] = cr.reshape(cr.shape[0], self.rest_ntok, -1)
        e_cand = self.join(self.cand_stack, c)                              # [C, Kc, D]
        e = torch.cat([e_user[cand_user], e_cand], dim=1)                   # [C, Ku + Kc, D]
        z = torch.matmul(self.mix, e)                                       # [C, M, D]
        return self.top(z.flatten(1))                                       # [C, T]

    @classmethod
    def from_model_dir(cls, mdir):
        """The float64 module (eval mode) of a hand-written model directory, with its weights."""
        ref = ikbo_ref.load_model(mdir)
        m = cls(ref.spec, os.path.join(mdir, "model.json")).double()
        used = {m.lce + ".w_user", m.lce + ".w_cand"}
        with torch.no_grad():
            for key, name in m.sources:
                m.get_parameter(key).copy_(ref.w[name])
                used.add(name)
            m.mix.copy_(torch.cat([ref.w[m.lce + ".w_user"], ref.w[m.lce + ".w_cand"]], 1))
        left = sorted(set(ref.w) - used)
        if left:
            raise ValueError("%s: tensors %s have no place in %s" % (mdir, ", ".join(left), cls.__name__))
        return m.eval()


class DemoModel(_LceRanker):
    """models/demo/1: E_cand = [X, attention]."""
    REST = False


class BenchModel(_LceRanker):
    """make_bench_model.py's model: E_cand = [X, attention, rest tokens]."""
    REST = True


def module_for(mdir):
    """The module of whichever class fits the directory's model."""
    errors = []
    for cls in (DemoModel, BenchModel):
        try:
            return cls.from_model_dir(mdir)
        except ValueError as e:
            errors.append(str(e))
    raise ValueError("; ".join(errors))


# (counts, generate() keywords): several sizes; a single candidate; empty histories and bags
CHECK_REQUESTS = [([1], dict(dup_users=0, same_key_users=0)),
                  ([1, 7, 40, 3], {}),
                  ([3, 2], dict(empty=True)),
                  ([1], dict(dup_users=0, same_key_users=0, history=("long",))),
                  ([5, 1, 9], dict(unused_users=2, history=("exact", "short", "empty"))),
                  ([2, 12], dict(history=("short", "long")))]


def check(model_dir, n_requests=6, module=None):
    """Max relative error of scores, module (the directory's weights) vs the
    reference interpreter, on random requests (seeds 700.., CHECK_REQUESTS in turn)."""
    ref = ikbo_ref.load_model(model_dir)
    m = module if module is not None else module_for(model_dir)
    name, version = make_request.model_identity(model_dir)
    reqs = []
    for s in range(n_requests):
        counts, kw = CHECK_REQUESTS[s % len(CHECK_REQUESTS)]
        reqs.append(make_request.generate(ref.plan, 700 + s, counts, model=name, model_version=version, **kw))
    return zoo.max_score_error(m, ref, reqs, inputs=module_inputs)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="module vs the reference interpreter on random requests")
    c.add_argument("model_dir")
    c.add_argument("--requests", type=int, default=6)
    a = ap.parse_args(argv)
    try:
        m = module_for(a.model_dir)
    except (ValueError, ikbo_ref.ModelError) as e:
        print("plain_models: %s" % e, file=sys.stderr)
        return 2
    err = check(a.model_dir, a.requests, module=m)
    print("%s: %s vs interpreter max relative error %.2e" % (a.model_dir, type(m).__name__, err))
    return 0 if err <= 1e-12 else 1


if __name__ == "__main__":
    sys.exit(main())
