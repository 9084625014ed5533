#!/usr/bin/python3
"""Random valid RankRequest (proto3 JSON) for a model: test input that
exercises the awkward cases of serving, not realistic traffic.

    make_request.py MODEL_DIR --seed S --users U --cands-per-user SPEC [-o FILE]

SPEC: "N" (every user N candidates), "A-B" (uniform per user) or "a,b,c"
(one count per user; sets --users when that is omitted).

What it produces (all deterministic in --seed):
  - candidates of a user NOT contiguous in request order (shuffled; --no-shuffle
    keeps them grouped), uneven counts per user;
  - users listed in shuffled order; some with an empty key (dedup by content);
  - --dup-users N extra user entries that copy an earlier user exactly (same
    key, same content) and own some of its candidates: the server should
    dedup them;
  - --same-key-users N users that reuse another user's key with different
    content: DIFFERENT users per the API contract;
  - --unused-users N users that no candidate references;
  - sparse features: some absent (empty bag), some explicitly empty, bags of
    1-4 ids, sometimes one id twice; ids mostly in [0, 3*rows), some negative, some huge int64
    (INT64_MIN/MAX too); int64 values are JSON numbers or strings (both are
    valid proto3 JSON): beyond 2^53 mostly strings, some exact numbers;
  - history (models with history): a mix of empty, shorter than max_len,
    exactly max_len and longer than max_len (--history sets the kinds of the
    first users, in order); actions random in [0, actions)
    or omitted (all action 0);
  - dense values with 4 decimals; --snake writes original field names instead
    of lowerCamelCase.
"""
import argparse
import copy
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ikbo_ref  # noqa: E402

INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1
EXACT_DOUBLE = 1 << 53


def _table_rows(plan):
    """Sparse input reference -> rows of the table its embedding_bag reads
    (to pick ids that hit rows directly or wrap)."""
    rows = {}
    for layer in plan.layers:
        if layer["op"] in ("embedding_bag", "history_embedding"):
            rows[layer["input"]] = plan.tables[layer["table"]][0]
    return rows


class _Gen:
    def __init__(self, plan, seed):
        self.plan = plan
        self.rng = random.Random(seed)
        self.rows = _table_rows(plan)

    def rand_id(self, rows):
        r = self.rng.random()
        if r < 0.75:
            return self.rng.randrange(0, 3 * rows)
        if r < 0.85:
            return -self.rng.randrange(1, 3 * rows + 1)
        if r < 0.95:
            return self.rng.randint(INT64_MIN, INT64_MAX)
        return self.rng.choice([INT64_MIN, INT64_MAX, EXACT_DOUBLE + 1, -EXACT_DOUBLE - 1])

    def enc_int(self, v):
        """proto3 JSON int64: a number or a decimal string. Values a double
        cannot hold are usually strings (what proto3 JSON writers emit) and
        sometimes exact JSON numbers (a parser must not go through double)."""
        if self.rng.random() < (0.7 if abs(v) > EXACT_DOUBLE else 0.15):
            return str(v)
        return v

    def dense(self, n):
        return [round(self.rng.gauss(0.0, 1.0), 4) for _ in range(n)]

    def sparse(self, side, features, empty=False):
        out = []
        for f in features:
            mode = self.rng.random()
            if empty:
                mode *= 0.25                          # only the two empty forms
            if mode < 0.15:
                continue                              # absent -> empty bag
            if mode < 0.25:
                out.append({"name": f, "ids": []})    # explicitly empty
                continue
            rows = self.rows.get("%s.sparse.%s" % (side, f), 1000)
            ids = [self.rand_id(rows) for _ in range(self.rng.randint(1, 4))]
            if self.rng.random() < 0.1:
                ids.append(ids[0])                    # a repeated id counts twice
            out.append({"name": f, "ids": [self.enc_int(i) for i in ids]})
        self.rng.shuffle(out)                         # order of features is free
        return out

    def history(self, kind):
        h = self.plan.history
        n = {"empty": 0, "short": self.rng.randint(1, max(1, h["max_len"] - 1)),
             "exact": h["max_len"], "long": h["max_len"] + self.rng.randint(1, h["max_len"] + 5)}[kind]
        rows = self.rows.get("user.history", 1000)
        ids = [self.enc_int(self.rand_id(rows)) for _ in range(n)]
        acts = [] if self.rng.random() < 0.3 else [self.rng.randrange(h["actions"]) for _ in range(n)]
        return ids, acts


def parse_counts(spec, users, rng):
    """--cands-per-user SPEC -> list of counts."""
    if "," in spec:
        counts = [int(x) for x in spec.split(",")]
        if users is not None and users != len(counts):
            raise ValueError("--cands-per-user lists %d counts for %d users" % (len(counts), users))
        return counts
    users = 3 if users is None else users
    if "-" in spec:
        lo, hi = (int(x) for x in spec.split("-"))
        return [rng.randint(lo, hi) for _ in range(users)]
    return [int(spec)] * users


HISTORY_KINDS = ("empty", "long", "short", "exact")


def generate(plan, seed, counts, dup_users=1, same_key_users=1, unused_users=0,
             snake=False, shuffle=True, empty=False, model="", model_version=0,
             history=HISTORY_KINDS):
    """A RankRequest dict for `plan` (an ikbo_ref.Plan).

    counts: candidates per distinct user (each >= 1). empty=True gives every
    user an empty history and every bag empty or absent. history: the history
    kinds of the first distinct users in order (empty, long = past max_len,
    short, exact = max_len), random kinds after them."""
    g = _Gen(plan, seed)
    rng = g.rng

    def new_user(i, key):
        u = {"key": key, "dense": g.dense(plan.user_dense), "sparse": g.sparse("user", plan.user_sparse, empty)}
        if plan.history:
            kind = "empty" if empty else history[i] if i < len(history) else rng.choice(HISTORY_KINDS)
            u["history_ids"], u["history_actions"] = g.history(kind)
        return u

    users = []          # entries; owner[i] = distinct user id of entry i
    owner = []
    for i in range(len(counts)):
        users.append(new_user(i, "" if rng.random() < 0.3 else "u%d-%d" % (seed, i)))
        owner.append(i)
    counts = list(counts)
    keyed = [i for i, u in enumerate(users) if u["key"]]
    for _ in range(same_key_users if keyed else 0):
        twin = new_user(len(users), users[rng.choice(keyed)]["key"])
        users.append(twin)
        owner.append(len(counts))
        counts.append(rng.randint(1, 5))
    for _ in range(dup_users):
        src = rng.randrange(len(counts))
        users.append(copy.deepcopy(users[owner.index(src)]))
        owner.append(src)
    for i in range(unused_users):
        users.append(new_user(len(users) + i, "unused-%d-%d" % (seed, i)))
        owner.append(None)

    # Shuffle the user list, then point each candidate at an entry of its user.
    perm = list(range(len(users)))
    rng.shuffle(perm)
    users = [users[p] for p in perm]
    owner = [owner[p] for p in perm]
    entries = {}
    for e, o in enumerate(owner):
        entries.setdefault(o, []).append(e)
    cands = []
    for o, n in enumerate(counts):
        for _ in range(n):
            cid = g.rand_id(1 << 40) if rng.random() < 0.3 else rng.randrange(1, 1 << 40)
            cands.append({"id": g.enc_int(cid), "user": rng.choice(entries[o]),
                          "dense": g.dense(plan.cand_dense), "sparse": g.sparse("candidate", plan.cand_sparse, empty)})
    if shuffle:
        rng.shuffle(cands)
    req = {"model": model, "model_version": model_version, "users": users, "candidates": cands,
           "top_k": rng.choice([0, 0, 1, 5]), "request_id": "req-%d" % seed}
    return req if snake else camel_case(req)


def camel_case(req):
    """Renames the original proto field names to lowerCamelCase."""
    ren = {"model_version": "modelVersion", "top_k": "topK", "request_id": "requestId",
           "history_ids": "historyIds", "history_actions": "historyActions"}
    if isinstance(req, dict):
        return {ren.get(k, k): camel_case(v) for k, v in req.items()}
    if isinstance(req, list):
        return [camel_case(v) for v in req]
    return req


def model_identity(model_dir):
    """(name, version) of a <repo>/<name>/<version> directory."""
    d = os.path.abspath(model_dir)
    base = os.path.basename(d)
    return os.path.basename(os.path.dirname(d)), int(base) if base.isdigit() else 0


def main(argv=None):
    ap = argparse.ArgumentParser(description="Write a random valid RankRequest JSON for a model.")
    ap.add_argument("model_dir")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--users", type=int, default=None, help="distinct users (default 3, or the length of the list)")
    ap.add_argument("--cands-per-user", default="1-20", help='"N", "A-B" or "a,b,c"')
    ap.add_argument("--dup-users", type=int, default=1, help="extra entries copying a user (same key and content)")
    ap.add_argument("--same-key-users", type=int, default=1, help="users reusing a key with different content")
    ap.add_argument("--unused-users", type=int, default=0, help="users no candidate references")
    ap.add_argument("--empty", action="store_true", help="empty histories and empty/absent bags everywhere")
    ap.add_argument("--history", default=",".join(HISTORY_KINDS),
                    help="history kinds of the first users: empty, long (> max_len), short, exact (= max_len)")
    ap.add_argument("--snake", action="store_true", help="original (snake_case) field names")
    ap.add_argument("--no-shuffle", action="store_true", help="keep each user's candidates contiguous")
    ap.add_argument("-o", "--output", default="-")
    args = ap.parse_args(argv)
    with open(os.path.join(args.model_dir, "model.json")) as f:
        plan = ikbo_ref.analyze(json.load(f), args.model_dir)
    counts = parse_counts(args.cands_per_user, args.users, random.Random(args.seed ^ 0x5EED))
    name, version = model_identity(args.model_dir)
    req = generate(plan, args.seed, counts, dup_users=args.dup_users, same_key_users=args.same_key_users,
                   unused_users=args.unused_users, snake=args.snake, shuffle=not args.no_shuffle,
                   empty=args.empty, model=name, model_version=version, history=args.history.split(","))
    text = json.dumps(req) + "\n"
    if args.output == "-":
        sys.stdout.write(text)
    else:
        with open(args.output, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
