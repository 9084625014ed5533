#!/usr/bin/python3
"""The packed request encoding end to end: each client's packed request gets
the same answer from a real ikbo-serve as the classic one.

    IKBO_BUILD=build IKBO_ROOT=. /usr/bin/python3 tests/integration/test_packed_e2e.py

Part of `make integration` (and so of `make test`).

Checks:
  - grpcio: requests of the demo and no-history models (several shapes,
    interleaved candidates, repeated users for dedup, top_k, 60 random
    ones with the optional columns' cases) in both
    encodings (tools/rank_client.py's to_packed) get byte-identical
    RankResponses; so do the ghz bench data files (bench.json's classic,
    bench-packed.json's packed data) on a model with the bench inputs;
  - tools/rank_client.py with and without --packed prints the same answer;
  - invalid requests get the same status and message in both encodings
    (ranker.proto: errors name the entity as the classic fields do);
  - ikbo-loadgen --encoding packed: every call OK with one finite score per
    candidate (its --verify), as many as the server counted.
"""
import json
import os
import subprocess
import sys

import random

from ikbo_itest import (BUILD, PY, ROOT, Daemon, check, check_eq, make_request, metric, model_inputs,
                        model_repo, pb, run, to_proto)

sys.path.insert(0, os.path.join(ROOT, "tools"))
os.environ["IKBO_BUILD"] = BUILD
import rank_client  # noqa: E402
import test_loadgen  # noqa: E402  (its bench-inputs model writer)
from google.protobuf import json_format  # noqa: E402
from packed_common import first_difference, logical  # noqa: E402

REPO, DIRS = model_repo()
test_loadgen.write_bench_inputs_model(os.path.join(REPO, "bench", "1"))
MAX_IDS, MAX_CANDIDATES = 3, 1200  # above what the answer checks send, so the error checks can cross them
D = Daemon(REPO, limits={"max_ids_per_bag": MAX_IDS, "max_candidates": MAX_CANDIDATES})
LOADGEN = os.path.join(BUILD, "ikbo-loadgen")
CLIENT = os.path.join(ROOT, "tools", "rank_client.py")


def packed_of(req):
    """req (a dict or message) in the packed encoding, as ikbo_itest's
    message type, checked to carry the same logical request."""
    classic = to_proto(req) if isinstance(req, dict) else req
    packed = pb.RankRequest.FromString(rank_client.to_packed(classic).SerializeToString())
    d = first_difference(logical(classic), logical(packed))
    check(d is None, "to_packed changed the request: %s" % d)
    return classic, packed


def assert_same_answer(req, what):
    classic, packed = packed_of(req)
    a, b = D.rank(classic), D.rank(packed)
    check(len(a.scores) > 0 or len(classic.candidates) == 0, "%s: no scores" % what)
    if a.SerializeToString(deterministic=True) != b.SerializeToString(deterministic=True):
        diff = first_difference(json_format.MessageToDict(a), json_format.MessageToDict(b), "response")
        raise AssertionError("%s: packed answer differs: %s" % (what, diff))


def test_demo_shapes():
    for seed, (users, cpu) in enumerate([(1, 1), (3, 5), (7, 13), (16, 70)]):
        req = make_request(DIRS["demo"], users=users, cands_per_user=cpu, seed=seed + 1)
        assert_same_answer(req, "demo %d x %d" % (users, cpu))


def test_dedup_and_top_k():
    req = make_request(DIRS["demo"], users=4, cands_per_user=6, seed=7)
    req["users"][2] = dict(req["users"][0])         # same key and content: one row
    req["users"][3] = dict(req["users"][1], key="")  # by content
    req["topK"] = 5
    classic, packed = packed_of(req)
    a, b = D.rank(classic), D.rank(packed)
    check_eq(b.unique_users, a.unique_users, "unique_users")
    check_eq(b.SerializeToString(deterministic=True), a.SerializeToString(deterministic=True), "answer")
    check_eq(len(a.scores), 5, "top_k")


def random_demo_request(rng, inputs):
    """A valid demo request with the cases the packed columns fill in: empty
    and repeated keys, users without history or without actions next to
    users with them, absent and empty bags, features in varying order."""
    ui, ci = inputs["user"], inputs["candidate"]
    hist = ui["history"]

    def bags(names):
        out = []
        for name in rng.sample(names, len(names)):
            r = rng.random()
            if r >= 0.2:
                out.append({"name": name, "ids": [] if r < 0.35 else
                            [rng.randrange(0, 10**6) for _ in range(rng.randrange(1, MAX_IDS + 1))]})
        return out

    users = []
    for i in range(rng.randrange(1, 7)):
        if users and rng.random() < 0.2:
            users.append(dict(rng.choice(users)))  # a repeat: dedup
            continue
        n = rng.choice([0, 1, rng.randrange(1, hist["max_len"] + 1)])
        u = {"key": rng.choice(["", "k%d" % i]), "dense": [rng.uniform(-1, 1) for _ in range(ui["dense"])],
             "sparse": bags(ui.get("sparse", [])), "historyIds": [rng.randrange(0, 10**9) for _ in range(n)]}
        if n and rng.random() < 0.6:
            u["historyActions"] = [rng.randrange(0, hist["actions"]) for _ in range(n)]
        users.append(u)
    cands = [{"id": rng.randrange(0, 10**12), "user": rng.randrange(len(users)),
              "dense": [rng.uniform(-1, 1) for _ in range(ci["dense"])], "sparse": bags(ci.get("sparse", []))}
             for _ in range(rng.randrange(1, 60))]
    return {"model": "demo", "users": users, "candidates": cands, "topK": rng.choice([0, 0, 3])}


def test_random_demo_requests():
    rng, inputs = random.Random(18), model_inputs(DIRS["demo"])
    for i in range(60):
        assert_same_answer(random_demo_request(rng, inputs), "random demo request %d" % i)


def test_no_history_model():
    req = make_request(DIRS["nohist"], users=3, cands_per_user=4, seed=3, model="nohist")
    assert_same_answer(req, "nohist 3 x 4")


def test_ghz_bench_data():
    reqs = {}
    for name in ("bench", "bench-packed"):
        cfg = json.load(open(os.path.join(ROOT, "deploy", "ghz", name + ".json")))
        reqs[name] = json_format.Parse(open(os.path.join(ROOT, cfg["data-file"])).read(), pb.RankRequest())
    a, b = D.rank(reqs["bench"]), D.rank(reqs["bench-packed"])
    check_eq(len(b.scores), 70, "bench-packed scores")
    check_eq(b.SerializeToString(deterministic=True), a.SerializeToString(deterministic=True),
             "bench-packed answer vs bench")


def test_rank_client_cli():
    path = os.path.join(ROOT, "models", "demo", "example_request.json")
    out = []
    for extra in ([], ["--packed"]):
        r = subprocess.run([PY, CLIENT, "--target", "127.0.0.1:%d" % D.grpc_port] + extra + [path],
                           capture_output=True, text=True, timeout=60, env=dict(os.environ, IKBO_BUILD=BUILD))
        check(r.returncode == 0, "rank_client %s: rc %d: %s" % (extra, r.returncode, r.stderr))
        out.append(r.stdout)
    check_eq(out[1], out[0], "rank_client --packed output")


def test_same_errors():
    """Errors about an entity's values read the same in both encodings.
    (Errors about the packed columns themselves, a column's byte count or a
    PackedSparse's name, name packed_users/packed_candidates instead.)"""
    base = make_request(DIRS["demo"], users=3, cands_per_user=2, seed=9)

    def changed(edit):
        req = json.loads(json.dumps(base))
        edit(req)
        return req

    cases = [
        ("NaN candidate dense", "INVALID_ARGUMENT",
         changed(lambda r: r["candidates"][3]["dense"].__setitem__(1, "NaN"))),
        ("Inf user dense", "INVALID_ARGUMENT", changed(lambda r: r["users"][1]["dense"].__setitem__(0, "Infinity"))),
        ("user index", "INVALID_ARGUMENT", changed(lambda r: r["candidates"][4].__setitem__("user", 9))),
        ("action range", "INVALID_ARGUMENT", changed(lambda r: r["users"][0]["historyActions"].__setitem__(0, 99))),
        ("ids per bag", "RESOURCE_EXHAUSTED",
         changed(lambda r: r["candidates"][2]["sparse"][0].__setitem__("ids", list(range(MAX_IDS + 1))))),
        ("candidates", "RESOURCE_EXHAUSTED",
         changed(lambda r: r["candidates"].extend([r["candidates"][0]] * MAX_CANDIDATES))),
    ]
    for what, code, req in cases:
        classic, packed = packed_of(req)
        a, b = D.rank_error(classic), D.rank_error(packed)
        check_eq(a[0], code, what + " (classic)")
        check_eq(b, a, what + ": packed status and message")


def test_loadgen_packed():
    before = D.metrics()
    r = subprocess.run([LOADGEN, "--json", "--target", "127.0.0.1:%d" % D.grpc_port, "--model", "demo",
                        "--encoding", "packed", "--users", "4", "--candidates", "1..40", "--repeat-users",
                        "0.5", "--user-pool", "6", "--shuffle", "--concurrency", "2", "--warmup", "0.2",
                        "--duration", "1", "--distinct", "16"], capture_output=True, text=True, timeout=60)
    check(r.returncode == 0, "loadgen --encoding packed: rc %d\n%s%s" % (r.returncode, r.stderr, r.stdout[-2000:]))
    j = json.loads(r.stdout)
    check_eq(j["shape"]["encoding"], "packed", "loadgen encoding")
    check(j["codes"] == {"OK": j["sent"]} and j["invalid_responses"] == 0, "loadgen codes %s" % j["codes"])
    after = D.metrics()
    served = metric(after, "ikbo_requests_total", model="demo", code="OK") - \
        metric(before, "ikbo_requests_total", model="demo", code="OK")
    check_eq(int(served), j["sent"], "server OK count vs loadgen sent")


if __name__ == "__main__":
    run([test_demo_shapes, test_dedup_and_top_k, test_random_demo_requests, test_no_history_model, test_ghz_bench_data,
         test_rank_client_cli, test_same_errors, test_loadgen_packed], daemon=D, repo=REPO)
