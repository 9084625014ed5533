#!/usr/bin/python3
"""grpc.health.v1 Check and the HTTP endpoints: /healthz, /readyz,
/v1/models, /metrics (parsed with prometheus_client, counts checked
exactly, model memory by kind), POST :rank, unknown paths and methods."""
import json
import os

import grpc

from ikbo_itest import (Daemon, check, check_eq, metric, make_request, model_inputs, model_repo,
                        run)

REPO, DIRS = model_repo()
DEMO = DIRS["demo"]
VERSION = int(DEMO.rstrip("/").split("/")[-1])
D = Daemon(REPO)
SERVING, NOT_SERVING = 1, 2


def test_health_check():
    check_eq(D.health("").status, SERVING, "''")
    check_eq(D.health("demo").status, SERVING, "demo")
    check_eq(D.health("nohist").status, SERVING, "nohist")
    try:
        D.health("nope")
        raise AssertionError("expected NOT_FOUND")
    except grpc.RpcError as e:
        check_eq(e.code(), grpc.StatusCode.NOT_FOUND, "unknown service")
        check("nope" in e.details(), e.details())


def test_healthz_readyz():
    check_eq(D.http("GET", "/healthz"), (200, b"ok\n"), "/healthz")
    check_eq(D.http("GET", "/readyz"), (200, b"ready\n"), "/readyz")


def test_models_json():
    code, body = D.http("GET", "/v1/models")
    check_eq(code, 200, "status")
    models = json.loads(body)["models"]
    check_eq([m["name"] for m in models], ["demo", "nohist"], "names")
    demo = models[0]
    inp = model_inputs(DEMO)
    check_eq(demo["inputs"]["user"]["dense"], inp["user"].get("dense", 0), "user dense")
    check_eq(demo["inputs"]["user"]["sparse"], inp["user"].get("sparse", []), "user sparse")
    check_eq(demo["inputs"]["candidate"]["sparse"], inp["candidate"].get("sparse", []), "cand")
    if "history" in inp["user"]:
        check_eq(demo["inputs"]["user"]["history"]["max_len"], inp["user"]["history"]["max_len"],
                 "history")
    check(len(demo["tasks"]) >= 1, "tasks")
    check_eq(len(demo["score_weights"]), len(demo["tasks"]), "score_weights")
    v = demo["versions"][0]
    check_eq((v["version"], v["state"], v["message"]), (VERSION, "READY", ""), "version")
    check(v["load_seconds"] >= 0, "load_seconds")
    check_eq((demo["mode"], demo["device"]), ("ikbo", "cpu"), "mode/device")
    check("history" not in models[1]["inputs"]["user"], "nohist history")
    code, body = D.http("GET", "/v1/models/demo")
    check_eq(code, 200, "one model")
    check_eq(json.loads(body), demo, "same description")
    code, body = D.http("GET", "/v1/models/nope")
    check_eq(code, 404, "unknown model")
    check_eq(json.loads(body)["error"], {"code": "NOT_FOUND", "message": "model 'nope' not found"},
             "error body")


def test_rank_over_http():
    req = make_request(DEMO, users=2, cands_per_user=3, seed=21)
    req["topK"] = 2
    code, body = D.http("POST", "/v1/models/demo:rank", req)
    check_eq(code, 200, "status")
    out = json.loads(body)
    check_eq((out["model"], out["modelVersion"], out["uniqueUsers"]), ("demo", str(VERSION), 2),
             "response")
    check_eq(len(out["scores"]), 2, "top_k")
    check(out["scores"][0]["score"] >= out["scores"][1]["score"], "sorted")
    # Model name from the path when the body omits it.
    del req["model"]
    check_eq(D.http("POST", "/v1/models/demo:rank", req)[0], 200, "model from path")
    code, body = D.http("POST", "/v1/models/demo:rank", {"model": "demo", "users": []})
    check_eq(code, 400, "invalid")
    err = json.loads(body)["error"]
    check_eq(err["code"], "INVALID_ARGUMENT", "code")
    check("users" in err["message"], err["message"])
    code, body = D.http("POST", "/v1/models/nope:rank", req)
    check_eq(code, 404, "unknown model")
    check_eq(json.loads(body)["error"]["code"], "NOT_FOUND", "code")


def test_unknown_paths():
    for path in ("/", "/nope", "/v1/modelz", "/v1/models/demo/extra", "/metrics/x"):
        code, body = D.http("GET", path)
        check_eq(code, 404, path)
        check_eq(json.loads(body)["error"]["code"], "NOT_FOUND", path)
    code, body = D.http("GET", "/v1/models/demo:rank")
    check_eq(code, 405, "GET on :rank")
    check("error" in json.loads(body), "JSON body")
    code, _ = D.http("POST", "/metrics", b"")
    check_eq(code, 405, "POST /metrics")


def test_metrics_exposition():
    from prometheus_client.parser import text_string_to_metric_families
    code, body = D.http("GET", "/metrics")
    check_eq(code, 200, "status")
    text = body.decode()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    for name, typ in [("ikbo_requests", "counter"), ("ikbo_request_duration_seconds", "histogram"),
                      ("ikbo_request_candidates", "histogram"),
                      ("ikbo_request_unique_users", "histogram"),
                      ("ikbo_inflight_requests", "gauge"), ("ikbo_model_loaded", "gauge"),
                      ("ikbo_build_info", "gauge"), ("ikbo_broadcast_bytes_avoided", "counter"),
                      ("ikbo_grpc_requests", "counter"), ("ikbo_http_requests", "counter")]:
        check(name in fams, "family %s missing" % name)
        check_eq(fams[name].type, typ, name)
    check("# TYPE ikbo_requests_total counter" in text, "counter TYPE line names _total")
    check('le="+Inf"' in text, "+Inf bucket")
    m = D.metrics()
    check_eq(metric(m, "ikbo_model_loaded", model="demo", version=str(VERSION), state="READY"), 1,
             "model_loaded")
    check(any(k[0] == "ikbo_build_info" and v == 1 for k, v in m.items()), "build_info")


def test_metrics_count_exactly():
    req = make_request(DEMO, users=3, cands_per_user=4, seed=22)
    m0 = D.metrics()
    n_grpc, n_http, n_bad = 4, 3, 2
    for _ in range(n_grpc):
        D.rank(req)
    for _ in range(n_http):
        check_eq(D.http("POST", "/v1/models/demo:rank", req)[0], 200, "http rank")
    for _ in range(n_bad):
        check_eq(D.http("POST", "/v1/models/demo:rank", {"model": "demo"})[0], 400, "bad")
    for _ in range(2):
        D.health("demo")
    m1 = D.metrics()

    def delta(name, **labels):
        return metric(m1, name, **labels) - metric(m0, name, **labels)

    ok = n_grpc + n_http
    check_eq(delta("ikbo_requests_total", model="demo", code="OK"), ok, "OK")
    check_eq(delta("ikbo_requests_total", model="demo", code="INVALID_ARGUMENT"), n_bad, "bad")
    check_eq(delta("ikbo_request_duration_seconds_count", model="demo"), ok + n_bad, "durations")
    check_eq(delta("ikbo_request_duration_seconds_bucket", model="demo", le="+Inf"), ok + n_bad,
             "+Inf bucket")
    check_eq(delta("ikbo_request_candidates_count"), ok, "candidates count")
    check_eq(delta("ikbo_request_candidates_sum"), 12 * ok, "candidates sum")
    check_eq(delta("ikbo_request_candidates_bucket", le="8"), 0, "le=8")
    check_eq(delta("ikbo_request_candidates_bucket", le="16"), ok, "le=16")
    check_eq(delta("ikbo_request_unique_users_sum"), 3 * ok, "unique users")
    check_eq(delta("ikbo_grpc_requests_total", method="/ikbo.v1.Ranker/Rank", code="OK"), n_grpc,
             "grpc Rank")
    check_eq(delta("ikbo_grpc_requests_total", method="/grpc.health.v1.Health/Check", code="OK"),
             2, "grpc Check")
    check_eq(delta("ikbo_http_requests_total", path="/v1/models/{name}:rank", code="200"), n_http,
             "http 200")
    check_eq(delta("ikbo_http_requests_total", path="/v1/models/{name}:rank", code="400"), n_bad,
             "http 400")
    # The first scrape itself is counted by the second.
    check_eq(delta("ikbo_http_requests_total", path="/metrics", code="200"), 1, "scrape")
    check(delta("ikbo_broadcast_bytes_avoided_total", model="demo") > 0, "bytes avoided")
    # On the CPU there are no batch graphs: every scored batch counts as "none".
    batches = delta("ikbo_batch_compute_seconds_count", model="demo")
    check(batches > 0, "batches scored")
    check_eq(delta("ikbo_batch_graphs_total", model="demo", use="none"), batches,
             "batch graphs: none on the cpu")
    check_eq(delta("ikbo_batch_graphs_total", model="demo", use="replayed"), 0, "no replays")


def test_model_memory_metrics():
    """ikbo_model_memory_bytes{model,version,device,kind}: the engine's byte
    accounting per READY version, refreshed at every scrape."""
    from prometheus_client.parser import text_string_to_metric_families
    D.rank(make_request(DEMO, users=2, cands_per_user=5, seed=23))
    code, body = D.http("GET", "/metrics")
    check_eq(code, 200, "status")
    fams = {f.name: f for f in text_string_to_metric_families(body.decode())}
    fam = fams.get("ikbo_model_memory_bytes")
    check(fam is not None, "family ikbo_model_memory_bytes missing")
    check_eq(fam.type, "gauge", "type")
    check("GPU memory" in fam.documentation and "host memory" in fam.documentation,
          "HELP says what memory: %r" % fam.documentation)
    by = {}
    for s in fam.samples:
        check_eq(set(s.labels), {"model", "version", "device", "kind"}, "labels")
        by[(s.labels["model"], s.labels["version"], s.labels["device"], s.labels["kind"])] = s.value
    kinds = {"weights", "user", "candidate", "broadcast", "index"}
    demo = {k[3]: v for k, v in by.items() if k[:3] == ("demo", str(VERSION), "cpu")}
    check_eq(set(demo), kinds, "demo's kinds")
    weights = demo["weights"]
    size = os.path.getsize(os.path.join(DEMO, "weights.safetensors"))
    # The file is fp32; the CPU backend holds the fp32 copy plus, once a
    # linear layer ran, the GEMM's packed copy of its weight: at most twice.
    check(0 < weights <= 2 * size, "weights %s bytes, file %d" % (weights, size))
    check(demo["candidate"] > 0 and demo["user"] > 0 and demo["index"] > 0,
          "workspace after scoring: %s" % demo)
    check_eq(demo["broadcast"], 0, "IKBO mode materializes no broadcast copy")
    check({k[3] for k in by if k[0] == "nohist"} == kinds, "nohist listed too: %s" % sorted(by))


if __name__ == "__main__":
    run([test_health_check, test_healthz_readyz, test_models_json, test_rank_over_http,
         test_unknown_paths, test_metrics_exposition, test_metrics_count_exactly,
         test_model_memory_metrics],
        daemon=D, repo=REPO)
