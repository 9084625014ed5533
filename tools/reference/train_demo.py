#!/usr/bin/python3
"""Trains the demo model served by `make run` (models/demo/1) on a synthetic
click/like task, so the demo returns meaningful scores without PyTorch.

    tools/reference/train_demo.py [--out models/demo] [--seed 7] [--epochs 3]

The model is exactly the reference architecture of MODEL_FORMAT.md (same layer
names and shapes). The synthetic world (all drawn from --seed):
  - 5000 items in 16 topic clusters, each with a popularity; 500 authors, each
    writing mostly in one cluster, with a quality; 64 countries each with a
    language (16) and a regional taste per cluster.
  - a user has a latent interest mix over the clusters (Dirichlet 0.25: a few
    favourite topics) that the model never sees directly: it is revealed by
    the user's history (items drawn from the interests, with actions
    view/click/like/share more engaged on favourite topics), and noisily by
    3 of the 8 dense features (the others: activity, account age, noise).
    10% of users have no history, many have more than max_len = 64 events.
  - candidates: half from the user's topics, half popularity-drawn; dense
    features: popularity, freshness, a noisy author quality, noise.
  - click ~ Bernoulli(sigmoid(-1.2 + 0.9 log(16 interest[cluster] + 0.1)
                               + 0.4 popularity + regional taste + 0.6 (freshness - 0.5)))
    like = click AND Bernoulli(sigmoid(-0.5 + 0.8 author quality + 0.5 log(...)))
    (so like is correlated with click and rarer).
Training: Adam (lr 3e-3, the last epoch at 1e-3), batch 512, BCE on both tasks, the
item table warm-started from a truncated SVD of the item x user history
matrix (see svd_item_init), everything else from the exporter's default init.
It prints held-out AUC per task next to a random-score baseline and the
oracle (the true probabilities) ceiling, writes models/demo/1/{model.json,
weights.safetensors} (F32) and models/demo/example_request.json, and checks
the written model with the reference interpreter.
"""
import argparse
import json
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export  # noqa: E402
import ikbo_ref  # noqa: E402

# MODEL_FORMAT.md's example, verbatim (plus the optional name/description).
DEMO_SPEC = {
    "format": "ikbo-model/1",
    "name": "demo",
    "description": "Reference architecture trained on a synthetic click/like task (tools/reference/train_demo.py)",
    "inputs": {
        "user": {"dense": 8, "sparse": ["country", "lang"], "history": {"max_len": 64, "actions": 4}},
        "candidate": {"dense": 4, "sparse": ["item", "author"]},
    },
    "tables": {
        "item": {"rows": 5000, "dim": 32},
        "author": {"rows": 500, "dim": 32},
        "country": {"rows": 64, "dim": 32},
        "lang": {"rows": 16, "dim": 32},
    },
    "layers": [
        {"name": "u_country", "op": "embedding_bag", "input": "user.sparse.country", "table": "country", "pooling": "sum"},
        {"name": "u_lang", "op": "embedding_bag", "input": "user.sparse.lang", "table": "lang", "pooling": "mean"},
        {"name": "u_dense1", "op": "linear", "input": "user.dense", "out": 64, "activation": "relu"},
        {"name": "u_dense2", "op": "linear", "input": "u_dense1", "out": 64, "activation": "none"},
        {"name": "u_dense", "op": "reshape", "input": "u_dense2", "tokens": 2},
        {"name": "hist", "op": "history_embedding", "input": "user.history", "table": "item"},
        {"name": "hist_mean", "op": "mean_pool", "input": "hist"},
        {"name": "e_user", "op": "stack", "inputs": ["u_country", "u_lang", "u_dense", "hist_mean"]},
        {"name": "c_item", "op": "embedding_bag", "input": "candidate.sparse.item", "table": "item", "pooling": "sum"},
        {"name": "c_author", "op": "embedding_bag", "input": "candidate.sparse.author", "table": "author", "pooling": "sum"},
        {"name": "c_dense1", "op": "linear", "input": "candidate.dense", "out": 64, "activation": "relu"},
        {"name": "c_dense", "op": "reshape", "input": "c_dense1", "tokens": 2},
        {"name": "x_cand", "op": "stack", "inputs": ["c_item", "c_author", "c_dense"]},
        {"name": "ta", "op": "target_attention", "query": "x_cand", "history": "hist", "heads": 2, "head_dim": 16},
        {"name": "e_cand", "op": "stack", "inputs": ["x_cand", "ta"]},
        {"name": "lce", "op": "lce", "user": "e_user", "candidate": "e_cand", "out_tokens": 6},
        {"name": "flat", "op": "flatten", "input": "lce"},
        {"name": "top1", "op": "linear", "input": "flat", "out": 64, "activation": "relu"},
        {"name": "logits", "op": "linear", "input": "top1", "out": 2, "activation": "none"},
    ],
    "output": {"logits": "logits", "tasks": ["click", "like"], "score_weights": [1.0, 0.5]},
}

N_ITEMS, N_AUTHORS, N_COUNTRY, N_LANG, N_CLUSTERS = 5000, 500, 64, 16, 16
MAX_LEN, N_ACTIONS = 64, 4
MAX_EVENTS = 120            # users have up to this many events (> MAX_LEN: truncation)


class World:
    """The latent structure shared by all users (items, authors, countries)."""

    def __init__(self, rng):
        self.item_cluster = rng.integers(N_CLUSTERS, size=N_ITEMS)
        self.item_pop = rng.normal(size=N_ITEMS)
        self.author_cluster = np.arange(N_AUTHORS) % N_CLUSTERS
        self.author_quality = rng.normal(size=N_AUTHORS)
        by_cluster = [np.flatnonzero(self.author_cluster == k) for k in range(N_CLUSTERS)]
        own = np.array([rng.choice(by_cluster[k]) for k in self.item_cluster])
        self.item_author = np.where(rng.random(N_ITEMS) < 0.9, own, rng.integers(N_AUTHORS, size=N_ITEMS))
        self.country_lang = np.where(rng.random(N_COUNTRY) < 0.8, np.arange(N_COUNTRY) // 4,
                                     rng.integers(N_LANG, size=N_COUNTRY))
        self.country_taste = rng.normal(scale=0.5, size=(N_COUNTRY, N_CLUSTERS))
        self.country_weight = 1.0 / np.arange(1, N_COUNTRY + 1) ** 0.8
        self.country_weight /= self.country_weight.sum()
        self.proj = rng.normal(size=(3, N_CLUSTERS))
        # per cluster: its items and their popularity-proportional sampling weights
        self.cluster_items = [np.flatnonzero(self.item_cluster == k) for k in range(N_CLUSTERS)]
        self.cluster_p = [np.exp(0.8 * self.item_pop[ix]) / np.exp(0.8 * self.item_pop[ix]).sum()
                          for ix in self.cluster_items]
        self.global_p = np.exp(0.8 * self.item_pop) / np.exp(0.8 * self.item_pop).sum()

    def items_from(self, rng, clusters):
        """One popularity-weighted item of each given cluster."""
        out = np.empty(len(clusters), dtype=np.int64)
        for k in range(N_CLUSTERS):
            at = np.flatnonzero(clusters == k)
            cdf = np.cumsum(self.cluster_p[k])
            j = np.minimum(np.searchsorted(cdf, rng.random(len(at))), len(cdf) - 1)
            out[at] = self.cluster_items[k][j]
        return out


def sample_rows(rng, p):
    """One categorical draw per row of the probability matrix p."""
    cdf = np.cumsum(p, axis=1)
    return np.minimum((rng.random(len(p))[:, None] > cdf).sum(1), p.shape[1] - 1)


def make_users(world, rng, n):
    """Users: latent interests, country/lang, dense features, history."""
    theta = rng.dirichlet(np.full(N_CLUSTERS, 0.25), size=n)
    country = rng.choice(N_COUNTRY, size=n, p=world.country_weight)
    lang = world.country_lang[country]
    hlen = np.where(rng.random(n) < 0.1, 0, rng.integers(1, MAX_EVENTS + 1, size=n))
    # All events of all users at once, user by user, oldest first.
    ev_user = np.repeat(np.arange(n), hlen)
    start = np.concatenate([[0], np.cumsum(hlen)])
    clusters = sample_rows(rng, (0.9 * theta + 0.1 / N_CLUSTERS)[ev_user])
    items = world.items_from(rng, clusters)
    s = N_CLUSTERS * theta[ev_user, clusters]          # 1 = average interest
    logits = np.stack([np.zeros_like(s), s - 1.5, s - 2.5, s - 3.5], axis=1)
    p = np.exp(logits - logits.max(1, keepdims=True))
    acts = sample_rows(rng, p / p.sum(1, keepdims=True))
    hist_ids = np.zeros((n, MAX_LEN), dtype=np.int64)
    hist_act = np.zeros((n, MAX_LEN), dtype=np.int64)
    full_hist = []
    for u in range(n):
        ev_i, ev_a = items[start[u]:start[u + 1]], acts[start[u]:start[u + 1]]
        full_hist.append((ev_i, ev_a))
        keep = min(hlen[u], MAX_LEN)                  # the most recent MAX_LEN, oldest first
        hist_ids[u, :keep] = ev_i[hlen[u] - keep:]
        hist_act[u, :keep] = ev_a[hlen[u] - keep:]
    dense = np.zeros((n, 8), dtype=np.float32)
    dense[:, 0] = np.log1p(hlen) / 3
    dense[:, 1:4] = theta @ world.proj.T * 4 + rng.normal(scale=0.5, size=(n, 3))
    dense[:, 4] = rng.random(n)
    dense[:, 5:8] = rng.normal(size=(n, 3))
    lang_missing = rng.random(n) < 0.05               # some users send no lang: empty bag
    return {"theta": theta, "country": country, "lang": lang, "lang_missing": lang_missing,
            "hlen": np.minimum(hlen, MAX_LEN), "hist_ids": hist_ids, "hist_act": hist_act,
            "dense": dense, "full_hist": full_hist}


def make_examples(world, users, rng, per_user):
    """Candidates and labels; one row per (user, candidate)."""
    n = len(users["country"])
    uidx = np.repeat(np.arange(n), per_user)
    m = len(uidx)
    theta = users["theta"][uidx]
    from_interest = rng.random(m) < 0.5
    clusters = sample_rows(rng, theta)
    item = np.where(from_interest, world.items_from(rng, clusters),
                    rng.choice(N_ITEMS, size=m, p=world.global_p))
    k = world.item_cluster[item]
    author = world.item_author[item]
    fresh = rng.random(m)
    cdense = np.stack([world.item_pop[item], fresh, world.author_quality[author] + rng.normal(scale=0.5, size=m),
                       rng.normal(size=m)], axis=1).astype(np.float32)
    aff = np.log(N_CLUSTERS * theta[np.arange(m), k] + 0.1)
    z_click = -1.2 + 0.9 * aff + 0.4 * world.item_pop[item] + world.country_taste[users["country"][uidx], k] \
        + 0.6 * (fresh - 0.5)
    z_like = -0.5 + 0.8 * world.author_quality[author] + 0.5 * aff
    p_click = 1 / (1 + np.exp(-z_click))
    p_like_given_click = 1 / (1 + np.exp(-z_like))
    click = rng.random(m) < p_click
    like = click & (rng.random(m) < p_like_given_click)
    return {"uidx": uidx, "item": item, "author": author, "cdense": cdense,
            "labels": np.stack([click, like], 1).astype(np.float32),
            "oracle": np.stack([p_click, p_click * p_like_given_click], 1)}


def svd_item_init(users):
    """Unit-norm item vectors from a truncated SVD of the item x user matrix
    of (log) history counts: items that share users share topics. Without
    this warm start the item table memorizes per-item click rates long before
    the history/candidate interaction emerges (held-out click AUC ~0.58)."""
    n = len(users["country"])
    mask = np.arange(MAX_LEN)[None, :] < users["hlen"][:, None]
    rows = torch.from_numpy(users["hist_ids"][mask])
    cols = torch.from_numpy(np.broadcast_to(np.arange(n)[:, None], mask.shape)[mask].copy())
    A = torch.zeros(N_ITEMS, n)
    A.index_put_((rows, cols), torch.ones(len(rows)), accumulate=True)
    U, S, _ = torch.svd_lowrank(torch.log1p(A), q=32, niter=6)
    E = U * S
    return E / E.norm(dim=1, keepdim=True).clamp(min=1e-6)


def batch(users, ex, rows):
    """IkboModule batch for example rows (user features broadcast per row)."""
    u = ex["uidx"][rows]
    t = torch.from_numpy
    lang_mask = ~users["lang_missing"][u]
    hlen = users["hlen"][u]
    L = max(1, int(hlen.max()))
    hmask = np.arange(L)[None, :] < hlen[:, None]
    ones = torch.ones((len(rows), 1), dtype=torch.bool)
    return {
        "user.dense": t(users["dense"][u]),
        "user.sparse.country": (t(users["country"][u][:, None]), ones),
        "user.sparse.lang": (t(users["lang"][u][:, None]), t(lang_mask[:, None])),
        "user.history": (t(users["hist_ids"][u, :L]), t(users["hist_act"][u, :L]), t(hmask)),
        "candidate.dense": t(ex["cdense"][rows]),
        "candidate.sparse.item": (t(ex["item"][rows][:, None]), ones),
        "candidate.sparse.author": (t(ex["author"][rows][:, None]), ones),
    }


def auc(scores, labels):
    """ROC AUC by the rank-sum formula, ties given half credit."""
    scores = np.asarray(scores, dtype=np.float64)
    labels = np.asarray(labels).astype(bool)
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    s = scores[order]
    i = 0
    while i < len(s):                                   # average ranks over ties
        j = i
        while j + 1 < len(s) and s[j + 1] == s[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    npos, nneg = labels.sum(), (~labels).sum()
    return (ranks[labels].sum() - npos * (npos + 1) / 2) / (npos * nneg)


def predict(model, users, ex, bs=4096):
    out = []
    with torch.no_grad():
        for i in range(0, len(ex["uidx"]), bs):
            out.append(torch.sigmoid(model(batch(users, ex, np.arange(i, min(i + bs, len(ex["uidx"])))))))
    return torch.cat(out).numpy()


def example_request(world, users, rng):
    """A small readable request: two users, one of them listed twice by key."""
    def user_json(u, key, n_hist):
        items, acts = users["full_hist"][u]
        items, acts = items[-n_hist:], acts[-n_hist:]
        return {"key": key, "dense": [round(float(x), 3) for x in users["dense"][u]],
                "sparse": [{"name": "country", "ids": [int(users["country"][u])]},
                           {"name": "lang", "ids": [int(users["lang"][u])]}],
                "historyIds": [int(x) for x in items], "historyActions": [int(x) for x in acts]}
    # Two users with clearly different favourite topics and some history.
    cands = [u for u in range(len(users["country"])) if len(users["full_hist"][u][0]) >= 12]
    a = cands[0]
    fav_a = int(np.argmax(users["theta"][a]))
    b = next(u for u in cands[1:] if int(np.argmax(users["theta"][u])) != fav_a
             and users["theta"][u][fav_a] < 0.05)
    fav_b = int(np.argmax(users["theta"][b]))
    alice, bob = user_json(a, "alice", 12), user_json(b, "bob", 8)

    def cand(cid, user, item):
        return {"id": cid, "user": user,
                "dense": [round(float(world.item_pop[item]), 3), 0.5,
                          round(float(world.author_quality[world.item_author[item]]), 3), 0.0],
                "sparse": [{"name": "item", "ids": [int(item)]},
                           {"name": "author", "ids": [int(world.item_author[item])]}]}
    top = lambda k, j: int(world.cluster_items[k][np.argsort(-world.item_pop[world.cluster_items[k]])[j]])  # noqa: E731
    candidates = [
        cand(101, 0, top(fav_a, 0)),     # alice, her favourite topic
        cand(102, 0, top(fav_b, 0)),     # alice, bob's favourite topic
        cand(201, 1, top(fav_b, 1)),     # bob, his favourite topic
        cand(202, 1, top(fav_a, 1)),     # bob, alice's favourite topic
        cand(103, 2, top(fav_a, 2)),     # alice again (users[2] repeats users[0] by key)
        cand(203, 1, top(fav_b, 2)),     # bob
    ]
    return {"model": "demo", "modelVersion": 1, "users": [alice, bob, dict(alice)],
            "candidates": candidates, "topK": 0, "requestId": "example-1"}


def main():
    ap = argparse.ArgumentParser(description="Train and export the demo model.")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "models", "demo"))
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--users", type=int, default=24000, help="training users")
    ap.add_argument("--per-user", type=int, default=8, help="candidates per user")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--lr", type=float, default=3e-3)
    args = ap.parse_args()
    torch.set_num_threads(1)                          # measured faster than 2 here (small ops)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    t0 = time.time()
    world = World(rng)
    tr_users = make_users(world, rng, args.users)
    va_users = make_users(world, rng, max(1000, args.users // 8))
    tr = make_examples(world, tr_users, rng, args.per_user)
    va = make_examples(world, va_users, rng, args.per_user)
    print("data: %d train / %d held-out examples, click rate %.3f, like rate %.3f (%.0fs)" % (
        len(tr["uidx"]), len(va["uidx"]), tr["labels"][:, 0].mean(), tr["labels"][:, 1].mean(), time.time() - t0))

    model = export.IkboModule(DEMO_SPEC, seed=args.seed)
    with torch.no_grad():
        model.param("tables.item").copy_(svd_item_init(tr_users))
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    labels = torch.from_numpy(tr["labels"])
    n = len(tr["uidx"])
    for epoch in range(args.epochs):
        perm = rng.permutation(n)
        total = 0.0
        for g in opt.param_groups:                      # the last epoch at lr * 0.3
            g["lr"] = args.lr * (0.3 if epoch == args.epochs - 1 and epoch > 0 else 1.0)
        for i in range(0, n, args.batch):
            rows = perm[i:i + args.batch]
            logits = model(batch(tr_users, tr, rows))
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels[rows])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * len(rows)
        p = predict(model, va_users, va)
        print("epoch %d: train loss %.4f, held-out AUC click %.4f like %.4f (%.0fs)" % (
            epoch + 1, total / n, auc(p[:, 0], va["labels"][:, 0]), auc(p[:, 1], va["labels"][:, 1]),
            time.time() - t0))

    p = predict(model, va_users, va)
    rand = np.random.default_rng(args.seed + 1).random(p.shape)
    print("held-out AUC     click   like")
    for name, s in (("model", p), ("random", rand), ("oracle", va["oracle"])):
        print("  %-8s     %.4f  %.4f" % (name, auc(s[:, 0], va["labels"][:, 0]), auc(s[:, 1], va["labels"][:, 1])))

    vdir = os.path.join(os.path.abspath(args.out), "1")
    loaded = export.save(model, vdir, dtype="F32", metadata={"trained_by": "tools/reference/train_demo.py --seed %d" % args.seed})
    req = example_request(world, va_users, np.random.default_rng(args.seed + 2))
    with open(os.path.join(os.path.abspath(args.out), "example_request.json"), "w") as f:
        f.write(export._fmt(req, 0) + "\n")
    # The written files, read back by the reference interpreter, must give
    # what the trained module gives.
    ref = ikbo_ref.score_request(loaded, req)
    with torch.no_grad():
        mine = torch.sigmoid(model.double()(export.batch_from_request(loaded.plan, req)))
    diff = float(np.abs(np.array(ref["task_scores"]) - mine.numpy()).max())
    print("wrote %s (%d bytes of weights); example request scores %s (reference vs module: %.1e)" % (
        vdir, os.path.getsize(os.path.join(vdir, "weights.safetensors")),
        ["%.4f" % s for s in ref["scores"]], diff))
    if diff > 1e-6:
        print("train_demo: the exported model disagrees with the trained module", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
