#!/usr/bin/python3
"""Writes ghz request data: one RankRequest in proto3 JSON (the form ghz's
"data-file" takes) that fits a model's inputs.

    /usr/bin/python3 deploy/ghz/make_data.py --preset demo  -o deploy/ghz/data/demo_request.json
    /usr/bin/python3 deploy/ghz/make_data.py --preset bench -o deploy/ghz/data/bench_request.json
    /usr/bin/python3 deploy/ghz/make_data.py --model-json models/foo/1/model.json --users 2 --cands-per-user 10
    /usr/bin/python3 deploy/ghz/make_data.py --preset bench --packed -o deploy/ghz/data/bench_packed_request.json

Presets: demo = the inputs of models/demo/1 (those of MODEL_FORMAT.md's
example: user dense 8, sparse country/lang, history max_len 64 with 4
actions; candidate dense 4, sparse item/author), read from
models/demo/1/model.json when it exists; bench = the seed-scale bench model's
inputs (models/bench/make_bench_model.py), bench-small = its --small inputs.
Content is deterministic in --seed: dense values in [-1, 1) with 4 decimals,
one id per sparse bag, full-length histories, distinct user keys.

--packed writes the same request (same seed, same content) in the packed
encoding (RankRequest.packed_users/packed_candidates; in proto3 JSON their
bytes fields are base64), converted by tools/rank_client.py's to_packed; it
needs the Python messages `make` generates (build/gen/py, or $IKBO_BUILD).
"""
import argparse
import json
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

DEMO_INPUTS = {"user": {"dense": 8, "sparse": ["country", "lang"], "history": {"max_len": 64, "actions": 4}},
               "candidate": {"dense": 4, "sparse": ["item", "author"]}}


def bench_inputs(small):
    sys.path.insert(0, os.path.join(ROOT, "models", "bench"))
    import make_bench_model as mb  # noqa: E402
    a = argparse.Namespace(**(mb.SMALL if small else mb.SEED_SCALE))
    a.pad, a.small, a.seed, a.name = True, small, 0, "bench"
    return mb.build_spec(a)["inputs"]


def preset_inputs(name):
    if name == "demo":
        path = os.path.join(ROOT, "models", "demo", "1", "model.json")
        if os.path.exists(path):
            with open(path) as f:
                return json.load(f)["inputs"]
        return DEMO_INPUTS
    return bench_inputs(name == "bench-small")


def make_request(inputs, model, users, cands_per_user, history, seed):
    rng = random.Random(seed)
    ui, ci = inputs["user"], inputs["candidate"]

    def dense(n):
        return [round(rng.uniform(-1, 1), 4) for _ in range(n)]

    def bags(names):
        return [{"name": f, "ids": [rng.randrange(100000)]} for f in names]

    out_users = []
    for u in range(users):
        user = {"key": "ghz-user-%d" % u, "dense": dense(ui.get("dense", 0)), "sparse": bags(ui.get("sparse", []))}
        h = ui.get("history")
        if h:
            n = h["max_len"] if history is None else history
            user["historyIds"] = [rng.randrange(100000) for _ in range(n)]
            if h.get("actions", 0) > 0:
                user["historyActions"] = [rng.randrange(h["actions"]) for _ in range(n)]
        out_users.append(user)
    cands = []
    for u in range(users):
        for _ in range(cands_per_user):
            cands.append({"id": len(cands) + 1, "user": u, "dense": dense(ci.get("dense", 0)),
                          "sparse": bags(ci.get("sparse", []))})
    return {"model": model, "users": out_users, "candidates": cands}


def classic_text(req):
    # one candidate per line: readable, diffable, still small
    return "{\n  \"model\": %s,\n  \"users\": [\n%s\n  ],\n  \"candidates\": [\n%s\n  ]\n}\n" % (
        json.dumps(req["model"]),
        ",\n".join("    " + json.dumps(u, separators=(", ", ": ")) for u in req["users"]),
        ",\n".join("    " + json.dumps(c, separators=(", ", ": ")) for c in req["candidates"]))


def packed_text(req):
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import rank_client  # noqa: E402  (grpc, then the generated messages)
    from google.protobuf import json_format  # noqa: E402
    msg = json_format.ParseDict(req, rank_client.ranker_pb2.RankRequest())
    packed = json_format.MessageToDict(rank_client.to_packed(msg))
    return json.dumps(packed, indent=2) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description="Write a ghz data file (RankRequest, proto3 JSON) for a model.")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--preset", choices=["demo", "bench", "bench-small"])
    src.add_argument("--model-json", help="a model.json whose inputs the request must fit")
    ap.add_argument("--model", help="RankRequest.model (default: the preset name, or the model's directory name)")
    ap.add_argument("--users", type=int, default=None, help="users per request (default demo 4, bench 1)")
    ap.add_argument("--cands-per-user", type=int, default=70)
    ap.add_argument("--history", type=int, default=None, help="events per user (default: max_len)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--packed", action="store_true",
                    help="write the request in the packed (columnar) encoding")
    ap.add_argument("-o", "--out", default="-")
    a = ap.parse_args(argv)
    if a.preset:
        inputs = preset_inputs(a.preset)
        model = a.model or ("bench" if a.preset.startswith("bench") else a.preset)
        users = a.users or (4 if a.preset == "demo" else 1)
    else:
        with open(a.model_json) as f:
            inputs = json.load(f)["inputs"]
        model = a.model or os.path.basename(os.path.dirname(os.path.dirname(os.path.abspath(a.model_json))))
        users = a.users or 1
    req = make_request(inputs, model, users, a.cands_per_user, a.history, a.seed)
    text = packed_text(req) if a.packed else classic_text(req)
    if a.out == "-":
        sys.stdout.write(text)
    else:
        with open(a.out, "w") as f:
            f.write(text)
        print("%s: %d users x %d candidates for model %s" % (a.out, users, a.cands_per_user, model))
    return 0


if __name__ == "__main__":
    sys.exit(main())
