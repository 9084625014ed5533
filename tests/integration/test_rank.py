#!/usr/bin/python3
"""Rank end to end over gRPC (and the HTTP JSON twin): scores identical to
build/ikbo-score on the same JSON, dedup by key and by content, top_k, model
and version resolution, deadlines, ModelInfo, unknown methods."""
import copy
import json
import threading
import time

import grpc

from ikbo_itest import (Daemon, check, check_eq, f32, metric, model_inputs, model_repo,
                        make_request, pb, run, score_offline, to_proto)

REPO, DIRS = model_repo()
DEMO = DIRS["demo"]
VERSION = int(DEMO.rstrip("/").split("/")[-1])
D = Daemon(REPO)


def assert_same_as_offline(resp, req):
    scores, task_scores = score_offline(DEMO, req)
    check_eq(len(resp.scores), len(req["candidates"]), "number of scores")
    for i, s in enumerate(resp.scores):
        check_eq(s.index, i, "index")
        check_eq(s.id, int(req["candidates"][i]["id"]), "id")
        check_eq(f32(s.score), f32(scores[i]), "score of candidate %d" % i)
        check_eq([f32(x) for x in s.task_scores], [f32(x) for x in task_scores[i]],
                 "task_scores of candidate %d" % i)


def test_scores_match_offline():
    for seed, (users, cpu) in enumerate([(1, 1), (3, 5), (7, 13), (2, 40)]):
        req = make_request(DEMO, users=users, cands_per_user=cpu, seed=seed + 1)
        resp = D.rank(req)
        check_eq(resp.model, "demo", "model")
        check_eq(resp.model_version, VERSION, "model_version")
        check_eq(resp.request_id, req["requestId"], "request_id")
        check_eq(resp.unique_users, users, "unique_users")
        check(len(resp.tasks) >= 1, "tasks")
        assert_same_as_offline(resp, req)


def test_example_request_matches_offline():
    import json
    import os
    # models/demo/<N> -> models/demo/example_request.json (committed with the demo)
    path = os.path.join(os.path.dirname(DEMO.rstrip("/")), "example_request.json")
    check(os.path.exists(path), "%s exists" % path)
    with open(path) as f:
        req = json.load(f)
    req["topK"] = 0
    req.pop("top_k", None)
    assert_same_as_offline(D.rank(req), req)


def test_http_rank_matches_offline():
    import json
    req = make_request(DEMO, users=2, cands_per_user=4, seed=42)
    code, body = D.http("POST", "/v1/models/demo:rank", req)
    check_eq(code, 200, "HTTP status")
    out = json.loads(body)
    scores, task_scores = score_offline(DEMO, req)
    check_eq(len(out["scores"]), len(scores), "n scores")
    for i, s in enumerate(out["scores"]):
        check_eq(s.get("index", 0), i, "index")
        check_eq(f32(s["score"]), f32(scores[i]), "score %d" % i)
        check_eq([f32(x) for x in s["taskScores"]], [f32(x) for x in task_scores[i]], "tasks")
    check_eq(out["uniqueUsers"], 2, "uniqueUsers")


def test_dedup_by_key():
    req = make_request(DEMO, users=2, cands_per_user=3, seed=5)
    u0, u1 = req["users"]
    same = copy.deepcopy(u0)                 # same key, same content -> same row
    other = copy.deepcopy(u0)                # same key, different content -> own row
    other["dense"] = [x + 0.5 for x in other["dense"]] or other["dense"]
    if other["dense"] == u0["dense"]:
        other["sparse"] = [{"name": f["name"], "ids": f["ids"] + [7]} for f in u0["sparse"]]
    req["users"] = [u0, u1, same, other]
    base = list(req["candidates"])
    for c in base[:2]:
        for uidx in (2, 3):
            cc = copy.deepcopy(c)
            cc["user"] = uidx if c["user"] == 0 else c["user"]
            cc["id"] = c["id"] + 100 * uidx
            req["candidates"].append(cc)
    resp = D.rank(req)
    check_eq(resp.unique_users, 3, "unique_users (u0 == same; other differs)")
    assert_same_as_offline(resp, req)
    by_id = {s.id: s.score for s in resp.scores}
    for c in base[:2]:
        if c["user"] == 0:
            check_eq(f32(by_id[c["id"] + 200]), f32(by_id[c["id"]]), "dup user scores equal")


def test_dedup_by_content():
    req = make_request(DEMO, users=3, cands_per_user=2, seed=6)
    for u in req["users"]:
        u["key"] = ""
    req["users"][2] = copy.deepcopy(req["users"][0])  # identical content, no key
    resp = D.rank(req)
    check_eq(resp.unique_users, 2, "unique_users by content")
    assert_same_as_offline(resp, req)
    # Same content under different keys stays apart (keys are identities).
    req["users"][0]["key"] = "a"
    req["users"][2]["key"] = "b"
    check_eq(D.rank(req).unique_users, 3, "unique_users with distinct keys")


def test_top_k():
    req = make_request(DEMO, users=3, cands_per_user=6, seed=7)
    full = D.rank(req)
    ranked = sorted(full.scores, key=lambda s: (-s.score, s.index))
    for k in (1, 5, len(full.scores), len(full.scores) + 10):
        req["topK"] = k
        resp = D.rank(req)
        want = ranked[:k]
        check_eq([(s.index, s.id, f32(s.score)) for s in resp.scores],
                 [(s.index, s.id, f32(s.score)) for s in want], "top_k=%d" % k)
        check_eq(resp.unique_users, 3, "unique_users with top_k")


def test_model_not_found():
    req = make_request(DEMO, seed=8)
    req["model"] = "nope"
    code, msg = D.rank_error(req)
    check_eq(code, "NOT_FOUND", "code")
    check_eq(msg, "model 'nope' not found", "message")
    req["model"] = ""
    code, msg = D.rank_error(req)
    check_eq(code, "INVALID_ARGUMENT", "empty model")
    check("model" in msg, msg)


def test_version_not_found():
    req = make_request(DEMO, seed=9)
    req["modelVersion"] = VERSION + 6
    code, msg = D.rank_error(req)
    check_eq(code, "NOT_FOUND", "code")
    check_eq(msg, "model 'demo' version %d not found (ready: %d)" % (VERSION + 6, VERSION),
             "message")
    req["modelVersion"] = VERSION
    check_eq(D.rank(req).model_version, VERSION, "explicit version")


def test_deadline_exceeded():
    big = to_proto(make_request(DEMO, users=50, cands_per_user=200, seed=10, history_len=60))
    # A deadline too short for the request: the client sees DEADLINE_EXCEEDED.
    try:
        D.rank(big, timeout=0.0005)
        raise AssertionError("expected DEADLINE_EXCEEDED")
    except grpc.RpcError as e:
        check_eq(e.code(), grpc.StatusCode.DEADLINE_EXCEEDED, "tiny timeout")
    # The server-side check, deterministically: an HTTP deadline of 0 ms
    # (same rank path as gRPC) has passed before anything is scored.
    req = make_request(DEMO, seed=12)
    m0 = D.metrics()
    before = metric(m0, "ikbo_requests_total", model="demo", code="DEADLINE_EXCEEDED")
    code, body = D.http("POST", "/v1/models/demo:rank", req, {"X-Request-Timeout-Ms": "0"})
    check_eq(code, 504, "HTTP status")
    check_eq(json.loads(body)["error"]["code"], "DEADLINE_EXCEEDED", "error code")
    after = metric(D.metrics(), "ikbo_requests_total", model="demo", code="DEADLINE_EXCEEDED")
    check_eq(after - before, 1, "counted once")
    check_eq(metric(D.metrics(), "ikbo_request_candidates_count"),
             metric(m0, "ikbo_request_candidates_count"), "nothing was scored")
    code, _ = D.http("POST", "/v1/models/demo:rank", req, {"X-Request-Timeout-Ms": "5000"})
    check_eq(code, 200, "generous deadline")
    code, _ = D.http("POST", "/v1/models/demo:rank", req, {"X-Request-Timeout-Ms": "soon"})
    check_eq(code, 400, "bad header")
    check_eq(D.health("").status, 1, "still serving")


def test_model_info():
    info = D.model_info("")
    names = [m.name for m in info.models]
    check_eq(names, ["demo", "nohist"], "models")
    m = D.model_info("demo").models[0]
    inp = model_inputs(DEMO)
    check_eq(m.user_dense, inp["user"].get("dense", 0), "user_dense")
    check_eq(list(m.user_sparse), inp["user"].get("sparse", []), "user_sparse")
    check_eq(m.candidate_dense, inp["candidate"].get("dense", 0), "candidate_dense")
    check_eq(list(m.candidate_sparse), inp["candidate"].get("sparse", []), "candidate_sparse")
    if "history" in inp["user"]:
        check(m.HasField("history"), "history present")
        check_eq(m.history.max_len, inp["user"]["history"]["max_len"], "max_len")
    check(len(m.tasks) >= 1 and len(m.score_weights) == len(m.tasks), "tasks and weights")
    check_eq([(v.version, v.state) for v in m.versions], [(VERSION, "READY")], "versions")
    check_eq((m.mode, m.device), ("ikbo", "cpu"), "mode, device")
    nh = D.model_info("nohist").models[0]
    check(not nh.HasField("history"), "nohist has no history")
    try:
        D.model_info("nope")
        raise AssertionError("expected NOT_FOUND")
    except grpc.RpcError as e:
        check_eq(e.code(), grpc.StatusCode.NOT_FOUND, "unknown model")
        check_eq(e.details(), "model 'nope' not found", "message")


def test_unknown_method():
    for path in ("/ikbo.v1.Ranker/Nope", "/grpc.health.v1.Health/Watch", "/x.Y/Z"):
        stub = D.chan().unary_unary(path, request_serializer=lambda b: b,
                                    response_deserializer=lambda b: b)
        try:
            stub(b"", timeout=5)
            raise AssertionError("expected UNIMPLEMENTED for " + path)
        except grpc.RpcError as e:
            check_eq(e.code(), grpc.StatusCode.UNIMPLEMENTED, path)
    check_eq(D.health("").status, 1, "still serving")


def test_garbage_message():
    stub = D.chan().unary_unary("/ikbo.v1.Ranker/Rank", request_serializer=lambda b: b,
                                response_deserializer=lambda b: b)
    try:
        stub(b"\xff\xff\xff\xff\x0f", timeout=5)
        raise AssertionError("expected INVALID_ARGUMENT")
    except grpc.RpcError as e:
        check_eq(e.code(), grpc.StatusCode.INVALID_ARGUMENT, "garbage")
        check("RankRequest" in e.details(), e.details())


def test_metrics_count_requests():
    m0 = D.metrics()
    n_ok, n_nf = 5, 3
    req = make_request(DEMO, users=2, cands_per_user=3, seed=12)
    for _ in range(n_ok):
        D.rank(req)
    bad = dict(req, model="nope")
    for _ in range(n_nf):
        D.rank_error(bad)
    m1 = D.metrics()
    check_eq(metric(m1, "ikbo_requests_total", model="demo", code="OK") -
             metric(m0, "ikbo_requests_total", model="demo", code="OK"), n_ok, "OK count")
    check_eq(metric(m1, "ikbo_requests_total", model="", code="NOT_FOUND") -
             metric(m0, "ikbo_requests_total", model="", code="NOT_FOUND"), n_nf, "NOT_FOUND")
    check_eq(metric(m1, "ikbo_request_candidates_count") -
             metric(m0, "ikbo_request_candidates_count"), n_ok, "candidates histogram count")
    check_eq(metric(m1, "ikbo_request_candidates_sum") -
             metric(m0, "ikbo_request_candidates_sum"), 6 * n_ok, "candidates sum")
    check_eq(metric(m1, "ikbo_request_unique_users_sum") -
             metric(m0, "ikbo_request_unique_users_sum"), 2 * n_ok, "unique users sum")
    check_eq(metric(m1, "ikbo_request_duration_seconds_count", model="demo") -
             metric(m0, "ikbo_request_duration_seconds_count", model="demo"), n_ok,
             "duration count")
    check_eq(metric(m1, "ikbo_grpc_requests_total", method="/ikbo.v1.Ranker/Rank", code="OK") -
             metric(m0, "ikbo_grpc_requests_total", method="/ikbo.v1.Ranker/Rank", code="OK"),
             n_ok, "grpc transport count")
    check(metric(m1, "ikbo_broadcast_bytes_avoided_total", model="demo") >
          metric(m0, "ikbo_broadcast_bytes_avoided_total", model="demo"), "bytes avoided grows")
    check_eq(metric(m1, "ikbo_inflight_requests"), 0, "inflight back to 0")


if __name__ == "__main__":
    run([test_scores_match_offline, test_example_request_matches_offline,
         test_http_rank_matches_offline, test_dedup_by_key, test_dedup_by_content,
         test_top_k, test_model_not_found, test_version_not_found, test_deadline_exceeded,
         test_model_info, test_unknown_method, test_garbage_message,
         test_metrics_count_requests], daemon=D, repo=REPO)
