#!/usr/bin/python3
"""Trains the reference models of zoo.py (DLRM, DCNv2, MMoE, and the
sequence models seq and hstu) on the demo's synthetic click/like task and
writes models/<name>/1.

    tools/reference/train_zoo.py [--models dlrm,dcn,mmoe,seq,hstu] [--seed 7] [--epochs 2] [--out models]

The world, users, candidates and labels are train_demo.py's (same generator
and seed). DLRM, DCNv2 and MMoE see the demo's features except the history:
user dense 8, country, lang (an empty bag when the user sends none);
candidate dense 4, item, author. seq and hstu see the history too (the most
recent 32 events with their actions; the demo keeps 64). The item table
starts from train_demo.svd_item_init (its first 16 components), everything
else from PyTorch's default init. Adam, batch 512 (for seq and hstu: 64 whole
users x their 8 candidates, so the user-side transformer runs once per user
and batch), BCE on click and like, the last epoch at lr * 0.3. For each
model: held-out AUC, the version directory (zoo.export_module), a random
example request, and zoo.check of the written directory (module vs the
reference interpreter).

Held-out AUC (click / like; 24,000 examples of 3,000 other users), --seed 7
--epochs 2: dlrm 0.621 / 0.645, dcn 0.689 / 0.700, mmoe 0.674 / 0.692,
seq 0.711 / 0.724, hstu 0.713 / 0.727 (the demo model: 0.728 / 0.739). About 1 minute
of training per sequence model on one core, after the SVD init (about 2-4
minutes, shared by all models of a run).
"""
import argparse
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_request  # noqa: E402
import train_demo  # noqa: E402
import zoo  # noqa: E402


def _bags(lists):
    lens = [len(x) for x in lists]
    offs = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
    ids = np.concatenate([np.asarray(x, dtype=np.int64) for x in lists]) if sum(lens) else np.zeros(0, np.int64)
    return torch.from_numpy(ids), torch.from_numpy(offs)


def module_batch(users, ex, rows, history=None):
    """The zoo modules' arguments for example rows: each distinct user once
    (history = max_len: the sequence models' (ids, actions, lengths) of the
    most recent max_len events too)."""
    uniq, index = np.unique(ex["uidx"][rows], return_inverse=True)
    us = {"country": _bags([[c] for c in users["country"][uniq]]),
          "lang": _bags([[] if users["lang_missing"][u] else [users["lang"][u]] for u in uniq])}
    cs = {"item": _bags([[i] for i in ex["item"][rows]]), "author": _bags([[a] for a in ex["author"][rows]])}
    args = (torch.from_numpy(users["dense"][uniq]).float(), us, torch.from_numpy(ex["cdense"][rows]).float(), cs,
            torch.from_numpy(index.astype(np.int64)))
    if not history:
        return args
    kept = users["hlen"][uniq]                      # train_demo keeps the most recent <= 64, oldest first
    lens = np.minimum(kept, history)
    L = max(1, int(lens.max()))
    at = np.minimum((kept - lens)[:, None] + np.arange(L)[None, :], users["hist_ids"].shape[1] - 1)
    ids = np.take_along_axis(users["hist_ids"][uniq], at, 1)
    acts = np.take_along_axis(users["hist_act"][uniq], at, 1)
    return args + ((torch.from_numpy(ids), torch.from_numpy(acts), torch.from_numpy(lens.astype(np.int64))),)


def predict(m, users, ex, history, bs=4096):
    n = len(ex["uidx"])
    with torch.no_grad():
        return torch.cat([torch.sigmoid(m(*module_batch(users, ex, np.arange(i, min(i + bs, n)), history)))
                          for i in range(0, n, bs)]).numpy()


def train(name, args, data, item_init):
    tr_users, va_users, tr, va = data
    torch.manual_seed(args.seed)
    m = zoo.MODELS[name][0]()
    with torch.no_grad():
        m.cand_emb["item"].weight.copy_(item_init)
    opt = torch.optim.Adam(m.parameters(), lr=args.lr)
    labels = torch.from_numpy(tr["labels"])
    rng = np.random.default_rng(args.seed)
    n, t0 = len(tr["uidx"]), time.time()
    hist = zoo.HIST_MAX_LEN if name in zoo.SEQ_MODELS else None
    for epoch in range(args.epochs):
        for g in opt.param_groups:
            g["lr"] = args.lr * (0.3 if epoch == args.epochs - 1 and epoch > 0 else 1.0)
        if hist:    # the sequence models: batches of whole users (64 users x 8 candidates), so the
            # user-side transformer runs once per user and batch, as in serving
            up = rng.permutation(n // args.per_user)
            perm = (up[:, None] * args.per_user + np.arange(args.per_user)).ravel()
        else:
            perm = rng.permutation(n)
        total = 0.0
        for i in range(0, n, args.batch):
            rows = perm[i:i + args.batch]
            loss = torch.nn.functional.binary_cross_entropy_with_logits(m(*module_batch(tr_users, tr, rows, hist)),
                                                                        labels[rows])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * len(rows)
        p = predict(m, va_users, va, hist)
        print("%s epoch %d: train loss %.4f, held-out AUC click %.4f like %.4f (%.0fs)" % (
            name, epoch + 1, total / n, train_demo.auc(p[:, 0], va["labels"][:, 0]),
            train_demo.auc(p[:, 1], va["labels"][:, 1]), time.time() - t0), flush=True)
    return m


def main(argv=None):
    ap = argparse.ArgumentParser(description="Train the zoo models on the demo's synthetic task.")
    ap.add_argument("--models", default="dlrm,dcn,mmoe,seq,hstu")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "models"))
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--users", type=int, default=24000)
    ap.add_argument("--per-user", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--lr", type=float, default=3e-3)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    rng = np.random.default_rng(args.seed)
    world = train_demo.World(rng)
    tr_users = train_demo.make_users(world, rng, args.users)
    va_users = train_demo.make_users(world, rng, max(1000, args.users // 8))
    tr = train_demo.make_examples(world, tr_users, rng, args.per_user)
    va = train_demo.make_examples(world, va_users, rng, args.per_user)
    item_init = train_demo.svd_item_init(tr_users)[:, :zoo.D]
    rc = 0
    for name in args.models.split(","):
        m = train(name, args, (tr_users, va_users, tr, va), item_init)
        vdir = os.path.join(os.path.abspath(args.out), name, "1")
        loaded = zoo.export_module(m, name, vdir, "trained by train_zoo.py --seed %d --epochs %d" % (
            args.seed, args.epochs), metadata={"zoo": name, "trained_by": "tools/reference/train_zoo.py"})
        req = make_request.generate(loaded.plan, args.seed, [6, 4, 9], model=name, model_version=1)
        with open(os.path.join(os.path.abspath(args.out), name, "example_request.json"), "w") as f:
            f.write(zoo.export._fmt(req, 0) + "\n")
        err = zoo.check(vdir)
        print("%s: wrote %s; module vs interpreter %.1e" % (name, vdir, err), flush=True)
        rc |= err > 1e-12
    return rc


if __name__ == "__main__":
    sys.exit(main())
