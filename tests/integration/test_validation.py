#!/usr/bin/python3
"""Every validation rule, on both transports: the exact gRPC status code, the
HTTP status and JSON error body, and a message that names the field. The
daemon runs with small limits so each limit is cheap to exceed."""
import copy
import json

import grpc

from ikbo_itest import (Daemon, check, check_eq, metric, make_request, model_inputs, model_repo,
                        run, to_proto)

REPO, DIRS = model_repo()
DEMO, NOHIST = DIRS["demo"], DIRS["nohist"]
LIMITS = {"max_users": 4, "max_candidates": 30, "max_ids_per_bag": 8, "max_history": 20,
          "max_sparse_features": 4, "max_message_bytes": 20000}
D = Daemon(REPO, limits=LIMITS)
HTTP_OF = {"INVALID_ARGUMENT": 400, "NOT_FOUND": 404, "RESOURCE_EXHAUSTED": 429,
           "DEADLINE_EXCEEDED": 504, "UNAVAILABLE": 503, "INTERNAL": 500}


def base(model="demo"):
    return make_request(DEMO if model == "demo" else NOHIST, users=2, cands_per_user=2, seed=3,
                        model=model, history_len=4)


def user_sparse_name():
    return base()["users"][0]["sparse"][0]["name"]


def rule(mutate, code, field, model="demo"):
    return (mutate, code, field, model)


def m_no_users(r):
    r["users"] = []
    r["candidates"] = []


def m_no_cands(r):
    r["candidates"] = []


def m_many_users(r):
    r["users"] = [copy.deepcopy(r["users"][0]) for _ in range(LIMITS["max_users"] + 1)]


def m_many_cands(r):
    c = r["candidates"][0]
    r["candidates"] = [dict(copy.deepcopy(c), id=i) for i in range(LIMITS["max_candidates"] + 1)]


def m_user_dense_len(r):
    r["users"][1]["dense"].append(0.5)


def m_user_dense_nan(r):
    r["users"][0]["dense"][2] = "NaN"


def m_cand_dense_len(r):
    r["candidates"][2]["dense"] = r["candidates"][2]["dense"][:-1]


def m_cand_dense_inf(r):
    r["candidates"][1]["dense"][0] = "Infinity"


def m_user_sparse_unknown(r):
    r["users"][0]["sparse"][0]["name"] = "no_such_feature"


def m_cand_sparse_dup(r):
    sp = r["candidates"][0]["sparse"]
    r["candidates"][0]["sparse"] = [sp[0], copy.deepcopy(sp[0])] + sp[1:]


def m_bag_too_long(r):
    r["candidates"][0]["sparse"][0]["ids"] = list(range(LIMITS["max_ids_per_bag"] + 1))


def m_many_features(r):
    r["users"][0]["sparse"] = [{"name": "f%d" % i, "ids": [1]}
                               for i in range(LIMITS["max_sparse_features"] + 1)]


def m_cand_user_range(r):
    r["candidates"][3]["user"] = 9


def m_history_no_model(r):
    r["users"][0]["historyIds"] = [1, 2]


def m_history_too_long(r):
    n = LIMITS["max_history"] + 1
    r["users"][0]["historyIds"] = list(range(n))
    r["users"][0]["historyActions"] = [0] * n


def m_actions_len(r):
    r["users"][0]["historyActions"] = r["users"][0]["historyActions"][:-1]


def m_action_range(r):
    r["users"][0]["historyActions"][1] = 1000


def m_negative_version(r):
    r["modelVersion"] = -1


RULES = [
    (m_no_users, "INVALID_ARGUMENT", "users", "demo"),
    (m_no_cands, "INVALID_ARGUMENT", "candidates", "demo"),
    (m_many_users, "RESOURCE_EXHAUSTED", "max_users", "demo"),
    (m_many_cands, "RESOURCE_EXHAUSTED", "max_candidates", "demo"),
    (m_user_dense_len, "INVALID_ARGUMENT", "users[1].dense", "demo"),
    (m_user_dense_nan, "INVALID_ARGUMENT", "users[0].dense[2]", "demo"),
    (m_cand_dense_len, "INVALID_ARGUMENT", "candidates[2].dense", "demo"),
    (m_cand_dense_inf, "INVALID_ARGUMENT", "candidates[1].dense[0]", "demo"),
    (m_user_sparse_unknown, "INVALID_ARGUMENT", "users[0].sparse[0].name", "demo"),
    (m_cand_sparse_dup, "INVALID_ARGUMENT", "candidates[0].sparse[1].name", "demo"),
    (m_bag_too_long, "RESOURCE_EXHAUSTED", "candidates[0].sparse[0].ids", "demo"),
    (m_many_features, "RESOURCE_EXHAUSTED", "users[0].sparse", "demo"),
    (m_cand_user_range, "INVALID_ARGUMENT", "candidates[3].user", "demo"),
    (m_history_no_model, "INVALID_ARGUMENT", "users[0].history_ids", "nohist"),
    (m_history_too_long, "RESOURCE_EXHAUSTED", "users[0].history_ids", "demo"),
    (m_actions_len, "INVALID_ARGUMENT", "users[0].history_actions", "demo"),
    (m_action_range, "INVALID_ARGUMENT", "users[0].history_actions[1]", "demo"),
    (m_negative_version, "INVALID_ARGUMENT", "model_version", "demo"),
]


def test_base_requests_are_valid():
    for model in ("demo", "nohist"):
        r = base(model)
        check_eq(len(D.rank(r).scores), 4, model)
        code, _ = D.http("POST", "/v1/models/%s:rank" % model, r)
        check_eq(code, 200, "HTTP " + model)


# What a rule needs from the demo model; a rule the model cannot express is
# skipped (with a line saying so) instead of failing.
NEEDS = {
    m_user_dense_nan: lambda u, c: u.get("dense", 0) >= 3,
    m_cand_dense_len: lambda u, c: c.get("dense", 0) >= 1,
    m_cand_dense_inf: lambda u, c: c.get("dense", 0) >= 1,
    m_user_sparse_unknown: lambda u, c: len(u.get("sparse", [])) >= 1,
    m_cand_sparse_dup: lambda u, c: len(c.get("sparse", [])) >= 1,
    m_bag_too_long: lambda u, c: len(c.get("sparse", [])) >= 1,
    m_history_too_long: lambda u, c: "history" in u,
    m_actions_len: lambda u, c: "history" in u,
    m_action_range: lambda u, c: "history" in u,
}


def test_every_rule_grpc_and_http():
    m0 = D.metrics()
    counts = {}
    inputs = model_inputs(DEMO)
    for mutate, code, field, model in RULES:
        need = NEEDS.get(mutate)
        if model == "demo" and need and not need(inputs["user"], inputs["candidate"]):
            print("  (skipped %s: the demo model has no such input)" % mutate.__name__)
            continue
        r = base(model)
        mutate(r)
        what = "%s (%s)" % (mutate.__name__, field)
        got_code, msg = D.rank_error(r)
        check_eq(got_code, code, what + " gRPC code")
        check(field in msg, "%s: message %r does not name %r" % (what, msg, field))
        status, body = D.http("POST", "/v1/models/%s:rank" % model, r)
        check_eq(status, HTTP_OF[code], what + " HTTP status")
        err = json.loads(body)["error"]
        check_eq(err["code"], code, what + " JSON code")
        check_eq(err["message"], msg, what + " same message on both transports")
        counts[code] = counts.get(code, 0) + 2
    m1 = D.metrics()
    for code, n in counts.items():
        # model="" counts requests whose model did not resolve (model_version -1).
        got = sum(metric(m1, "ikbo_requests_total", model=m, code=code) -
                  metric(m0, "ikbo_requests_total", model=m, code=code)
                  for m in ("demo", "nohist", ""))
        check_eq(got, n, "ikbo_requests_total{code=%s}" % code)


def test_empty_model_name():
    r = base()
    r["model"] = ""
    code, msg = D.rank_error(r)
    check_eq(code, "INVALID_ARGUMENT", "code")
    check("model" in msg, msg)


def test_oversize_message():
    r = base()
    r["candidates"][0]["dense"] = [0.25] * 6000  # > max_message_bytes = 20000
    try:
        D.rank(to_proto(r))
        raise AssertionError("expected RESOURCE_EXHAUSTED")
    except grpc.RpcError as e:
        check_eq(e.code(), grpc.StatusCode.RESOURCE_EXHAUSTED, "gRPC oversize")
    status, _ = D.http("POST", "/v1/models/demo:rank", r)
    check_eq(status, 413, "HTTP oversize body")
    check_eq(len(D.rank(base()).scores), 4, "still serving")


def test_http_json_errors():
    cases = [
        (b"{not json", "invalid JSON"),
        (json.dumps(dict(base(), bogus=1)).encode(), "bogus"),
        (json.dumps(dict(base(), topK="x")).encode(), "topK"),
        (json.dumps(dict(base(), model="nohist")).encode(), "model"),
    ]
    for body, needle in cases:
        status, out = D.http("POST", "/v1/models/demo:rank", body)
        check_eq(status, 400, needle)
        err = json.loads(out)["error"]
        check_eq(err["code"], "INVALID_ARGUMENT", needle)
        check(needle in err["message"], "%r not in %r" % (needle, err["message"]))
    status, out = D.http("POST", "/v1/models/nope:rank", dict(base(), model=""))
    check_eq(status, 404, "unknown model over HTTP")
    check_eq(json.loads(out)["error"]["message"], "model 'nope' not found", "message")


if __name__ == "__main__":
    run([test_base_requests_are_valid, test_every_rule_grpc_and_http, test_empty_model_name,
         test_oversize_message, test_http_json_errors], daemon=D, repo=REPO)
