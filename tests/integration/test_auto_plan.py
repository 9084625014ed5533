#!/usr/bin/python3
"""An auto-planned model served end to end: models/demo_auto/1 (the demo
written as a plain PyTorch module, tools/reference/plain_models.py, imported
by tools/importer: its lce is a token_linear `mix` over a mixed stack, as
the module computes it) is deployed next to the hand-written demo. Checks: the daemon serves it with the demo's scores
(1e-6 relative); GET /v1/models/{name} carries the plan report (planning
auto, the token_linear run as lce, no gather), GET /v1/models the same,
gRPC ModelInfo the summary; build/ikbo-plan prints the same plan as text and
JSON, and a broken auto model fails to load with an error naming its layer
(ikbo-plan exit 2, the daemon's version FAILED with the same message)."""
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.environ.get("IKBO_ROOT", "."), "tools", "reference"))
from ikbo_itest import BUILD, ROOT, Daemon, check, check_eq, make_request, run, to_proto  # noqa: E402
from broadcast_form import convert  # noqa: E402

PLAN = os.path.join(BUILD, "ikbo-plan")
DEMO = os.path.join(ROOT, "models", "demo", "1")
S = {}


def setup():
    repo = tempfile.mkdtemp(prefix="ikbo-auto-")
    os.symlink(os.path.dirname(DEMO), os.path.join(repo, "demo"))
    os.symlink(os.path.join(ROOT, "models", "demo_auto"), os.path.join(repo, "demo_auto"))
    convert(DEMO, os.path.join(repo, "broken", "1"), out_tokens=3)
    S["repo"] = repo
    S["d"] = Daemon(repo, threads=2, wait_ready=False)
    # /readyz stays not ready (broken FAILED): wait for the three loads instead.
    deadline = time.time() + 60
    while True:
        try:
            states = {m["name"]: m["versions"][0]["state"] for m in http_json("/v1/models")["models"]
                      if m["versions"]}
        except Exception:  # not listening yet
            states = {}
        if states.get("demo") == "READY" and states.get("demo_auto") == "READY" and \
                states.get("broken") == "FAILED":
            return
        if time.time() > deadline:
            raise AssertionError("models not loaded within 60 s: %r\n%s" % (states, S["d"].logs()))
        time.sleep(0.1)


def test_scores_like_the_hand_written_model():
    req = make_request(DEMO, users=4, cands_per_user=9, seed=5)
    want = S["d"].rank(to_proto(req))
    req["model"] = "demo_auto"
    got = S["d"].rank(to_proto(req))
    check_eq(len(got.scores), len(want.scores), "scores")
    for g, w in zip(got.scores, want.scores):
        check_eq(g.id, w.id, "order")
        check(abs(g.score - w.score) <= 1e-6 * max(1e-6, abs(w.score)), "%r vs %r" % (g.score, w.score))


def http_json(path):
    code, body = S["d"].http("GET", path)
    check_eq(code, 200, path)
    return json.loads(body)


def test_plan_in_models_endpoint():
    m = http_json("/v1/models/demo_auto")
    plan = m["versions"][0]["plan"]
    check_eq(plan["planning"], "auto", "planning")
    ops = {e["name"]: e for e in plan["executed"]}
    check_eq(ops["mix"]["op"], "lce", "token_linear runs as lce")
    check(ops["mix"]["mixed"], "lce reads user rows through the map")
    check("cat_3" not in ops, "the mixed stack is never built")
    check_eq(plan["gathers"], [], "gathers")
    lce = [l for l in plan["layers"] if l["name"] == "mix"][0]
    check_eq(lce["rewrite"], "type1", "rewrite")
    check(lce["split"].startswith("weight [6, 13] -> user tokens 5"), lce["split"])
    demo = http_json("/v1/models/demo")["versions"][0]["plan"]
    check_eq(demo["planning"], "manual", "the hand-written model")
    check_eq(round(demo["totals"]["flops_per_candidate"][1]),
             round(plan["totals"]["flops_per_candidate"][1]), "same work as planned")
    listed = {x["name"]: x for x in http_json("/v1/models")["models"]}
    check_eq(listed["demo_auto"]["versions"][0]["plan"], plan, "the list shows the same plan")


def test_plan_in_model_info():
    info = S["d"].model_info("demo_auto")
    p = info.models[0].versions[0].plan
    check_eq(p.planning, "auto", "planning")
    check_eq(p.rewritten, 1, "rewritten")
    check_eq(p.gathers, 0, "gathers")
    check(p.flops_per_candidate_after < p.flops_per_candidate_before, "fewer FLOPs")
    check_eq(p.plan_ratio, 70.0, "ratio")


def test_ikbo_plan_cli():
    d = os.path.join(S["repo"], "demo_auto", "1")
    out = subprocess.run([PLAN, d], capture_output=True, text=True, check=True).stdout
    check("planning auto, 19 layers in model.json" in out, out[:200])
    check("  mix: weight [6, 13] -> user tokens 5, candidate tokens 8" in out, out)
    j = json.loads(subprocess.run([PLAN, "--json", "--ratio", "10", d], capture_output=True,
                                  text=True, check=True).stdout)
    check_eq(j["ratio"], 10.0, "ratio")
    served = http_json("/v1/models/demo_auto")["versions"][0]["plan"]
    check_eq([e["op"] for e in j["executed"]], [e["op"] for e in served["executed"]], "same plan")
    bad = subprocess.run([PLAN, os.path.join(S["repo"], "broken", "1")], capture_output=True, text=True)
    check_eq(bad.returncode, 2, "exit status")
    check("layer 'lce'" in bad.stderr, bad.stderr)
    bad = subprocess.run([PLAN, "--ratio", "0", d], capture_output=True, text=True)
    check_eq(bad.returncode, 2, "bad ratio")


def test_broken_auto_model_fails_naming_its_layer():
    v = http_json("/v1/models/broken")["versions"][0]
    check_eq(v["state"], "FAILED", "state")
    check("layer 'lce'" in v["message"], v["message"])


if __name__ == "__main__":
    setup()
    run([test_scores_like_the_hand_written_model, test_plan_in_models_endpoint,
         test_plan_in_model_info, test_ikbo_plan_cli, test_broken_auto_model_fails_naming_its_layer],
        daemon=S["d"], repo=S["repo"])
