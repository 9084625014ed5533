#!/usr/bin/python3
"""The packed request encoding end to end: each client's packed request gets
the same answer from a real ikbo-serve as the classic one.

    IKBO_BUILD=build IKBO_ROOT=. /usr/bin/python3 tests/integration/e2e_packed.py

Not in `make test` yet (its name is not test_*.py, so `make integration`
does not pick it up): it can only pass once the server decodes
RankRequest.packed_users/packed_candidates (issue 18, "The path"). Rename
it to test_packed_e2e.py, or list it, to wire it in.

Checks:
  - grpcio: requests of the demo and no-history models (several shapes,
    interleaved candidates, repeated users for dedup, top_k) in both
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

from ikbo_itest import (BUILD, PY, ROOT, Daemon, check, check_eq, make_request, metric, model_repo, pb,
                        run, to_proto)

sys.path.insert(0, os.path.join(ROOT, "tools"))
os.environ["IKBO_BUILD"] = BUILD
import rank_client  # noqa: E402
import test_loadgen  # noqa: E402  (its bench-inputs model writer)
from google.protobuf import json_format  # noqa: E402
from packed_common import first_difference, logical  # noqa: E402

REPO, DIRS = model_repo()
test_loadgen.write_bench_inputs_model(os.path.join(REPO, "bench", "1"))
D = Daemon(REPO)
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
    base = make_request(DIRS["demo"], users=3, cands_per_user=2, seed=9)
    nan = json.loads(json.dumps(base))
    nan["candidates"][3]["dense"][1] = "NaN"
    bad_user = json.loads(json.dumps(base))
    bad_user["candidates"][4]["user"] = 9
    for what, req in (("NaN dense", nan), ("user index", bad_user)):
        classic, packed = packed_of(req)
        a, b = D.rank_error(classic), D.rank_error(packed)
        check_eq(a[0], "INVALID_ARGUMENT", what + " (classic)")
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
    run([test_demo_shapes, test_dedup_and_top_k, test_no_history_model, test_ghz_bench_data,
         test_rank_client_cli, test_same_errors, test_loadgen_packed], daemon=D, repo=REPO)
