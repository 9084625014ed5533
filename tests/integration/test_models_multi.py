#!/usr/bin/python3
"""Several models in one daemon: (4) two models with different shapes (a: with
history, 5+3 dense; b: no history, 7+2 dense, one task, width 8) served at
once, each scoring like the reference scorer; per-model version policy and
per-model config.json serving overrides; a model directory added later is
found by polling. (3) unloading a model over the admin endpoint: its
requests get NOT_FOUND and its health NOT_SERVING, the other model is
unaffected (no failed request while it happens), /readyz stays ready;
loading it again brings it back. Models added and removed while serving;
a broken new one does not make /readyz fail."""
import json
import os
import shutil
import threading

from ikbo_itest import Daemon, check, check_eq, make_request, metric, run, score_offline
from reload_common import Load, install, model_dir, models, new_repo, version_state, wait_for

S = {}


def post(path):
    code, body = S["d"].http("POST", path, body=b"", headers={"X-Ikbo-Admin": "1"})
    return code, json.loads(body or b"{}")


def close_scores(got, want, what):
    check_eq(len(got), len(want), what + " length")
    for i, (g, w) in enumerate(zip(got, want)):
        check(abs(g - w) <= 1e-5 * max(1.0, abs(w)), "%s[%d]: %r vs %r" % (what, i, g, w))


def setup():
    repo = new_repo(a=["a1", "a2"], b=["b1"])
    with open(os.path.join(repo, "b", "config.json"), "w") as f:
        json.dump({"serving": {"max_batch_candidates": 64, "mode": "broadcast"}}, f)
    S["repo"] = repo
    # a keeps both versions (policy), b the newest one (the default).
    S["d"] = Daemon(repo, threads=4, repository_poll_ms=300, repository_settle_ms=200,
                    model_policy={"a": {"versions": [1, 2]}})


def test_two_models_different_shapes():
    d = S["d"]
    ms = models(d)
    check_eq(sorted(ms), ["a", "b"], "models")
    check_eq([(v["version"], v["state"]) for v in ms["a"]["versions"]], [(2, "READY"), (1, "READY")],
             "a's versions (policy [1, 2])")
    check_eq([(v["version"], v["state"]) for v in ms["b"]["versions"]], [(1, "READY")], "b")
    check_eq(ms["a"]["inputs"]["user"]["dense"], 5, "a user dense")
    check_eq(ms["b"]["inputs"]["user"]["dense"], 7, "b user dense")
    check("history" in ms["a"]["inputs"]["user"] and "history" not in ms["b"]["inputs"]["user"],
          "history only in a")
    check_eq(len(ms["b"]["tasks"]), 1, "b tasks")
    # b's config.json overrides: visible per version, and the mode took effect.
    sv = ms["b"]["versions"][0]["serving"]
    check_eq((sv["max_batch_candidates"], sv["mode"], sv["device"]), (64, "broadcast", "cpu"),
             "b serving")
    check_eq(ms["b"]["mode"], "broadcast", "b mode")
    check_eq(ms["a"]["versions"][0]["serving"]["mode"], "ikbo", "a mode")
    for name, key, version in (("a", "a2", 0), ("a", "a1", 1), ("b", "b1", 0)):
        req = make_request(model_dir(key), users=3, cands_per_user=4, seed=31, model=name)
        req["modelVersion"] = version
        got = d.rank(req)
        check_eq(got.model, name, "model")
        want_v = version or (2 if name == "a" else 1)
        check_eq(got.model_version, want_v, "version")
        args = ["--mode", "broadcast"] if name == "b" else []
        close_scores([s.score for s in got.scores], score_offline(model_dir(key), req, args)[0],
                     "%s v%d scores" % (name, want_v))
    # A request shaped for a is refused by b with a precise reason.
    bad = make_request(model_dir("a1"), seed=32, model="b")
    code, detail = d.rank_error(bad)
    check_eq(code, "INVALID_ARGUMENT", "a-shaped request to b")
    # Concurrent traffic to both, no failures.
    la = Load(d, "a", model_dir("a2"), threads=2)
    lb = Load(d, "b", model_dir("b1"), threads=2)
    wait_for(lambda: la.count() > 30 and lb.count() > 30, 15, "traffic to both")
    ra, rb = la.stop(), lb.stop()
    check_eq([r for r in ra + rb if r[3]][:3], [], "failures")
    check_eq({r[2] for r in ra}, {2}, "a answers")
    check_eq({r[2] for r in rb}, {1}, "b answers")


def test_unload_one_model():
    d = S["d"]
    la = Load(d, "a", model_dir("a2"), threads=3)
    wait_for(lambda: la.count() > 20, 10, "traffic to a")
    n0 = la.count()
    code, body = post("/v1/models/b/unload")
    check_eq(code, 200, "unload b")
    check_eq(body.get("unloaded"), True, "unloaded flag")
    check_eq([v["state"] for v in body["versions"]], ["UNLOADED"], "b's versions")
    code, detail = d.rank_error(make_request(model_dir("b1"), seed=33, model="b"))
    check_eq(code, "NOT_FOUND", "rank on an unloaded model")
    check("model 'b' is unloaded" in detail, detail)
    check_eq(d.health("b").status, 2, "health NOT_SERVING for b")
    check_eq(d.health("a").status, 1, "health SERVING for a")
    check_eq(d.health("").status, 1, "server health")
    check_eq(d.http("GET", "/readyz")[0], 200, "/readyz stays ready")
    m = d.metrics()
    check_eq(metric(m, "ikbo_model_loaded", model="b", version="1", state="UNLOADED"), 1, "gauge")
    # Polling does not bring an unloaded model back.
    import time
    time.sleep(0.8)
    check_eq(d.rank_error(make_request(model_dir("b1"), seed=34, model="b"))[0], "NOT_FOUND",
             "still unloaded after polls")
    wait_for(lambda: la.count() > n0 + 30, 10, "traffic to a during the unload")
    check_eq(la.errors()[:3], [], "a's failures while b unloads")
    # Load it again.
    check_eq(post("/v1/models/b/load")[0], 202, "load b")
    wait_for(lambda: version_state(d, "b", 1) == ("READY", ""), 10, "b READY again")
    check_eq(d.rank(make_request(model_dir("b1"), seed=35, model="b")).model_version, 1, "b serves")
    check_eq(d.health("b").status, 1, "b SERVING again")
    ra = la.stop()
    check_eq([r for r in ra if r[3]][:3], [], "a's failures over the whole test")
    check("model_unload model=b version=1 reason=\"admin request\"" in d.logs(), "unload logged")


def test_new_model_directory_is_found():
    d = S["d"]
    install(S["repo"], "c", 3, "b1")
    wait_for(lambda: version_state(d, "c", 3) == ("READY", ""), 10, "model c found by polling")
    check_eq(d.rank(make_request(model_dir("b1"), seed=36, model="c")).model_version, 3, "c serves")
    check_eq(d.health("c").status, 1, "c SERVING")
    # A broken new model shows FAILED but does not take the server out of
    # rotation (/readyz counts models added later once they have loaded).
    dst = os.path.join(S["repo"], "d", ".1")
    shutil.copytree(model_dir("b1"), dst)
    with open(os.path.join(dst, "weights.safetensors"), "r+b") as f:
        f.truncate(1000)
    os.rename(dst, os.path.join(S["repo"], "d", "1"))
    wait_for(lambda: (version_state(d, "d", 1) or ("",))[0] == "FAILED", 10, "model d FAILED")
    check_eq(d.http("GET", "/readyz")[0], 200, "/readyz with a broken new model")
    check_eq(d.health("d").status, 2, "d NOT_SERVING")
    shutil.rmtree(os.path.join(S["repo"], "d"))
    # Removing it: it goes away (health then answers NOT_FOUND for the name).
    shutil.rmtree(os.path.join(S["repo"], "c"))
    wait_for(lambda: "c" not in models(d), 10, "model c gone")
    check_eq(d.rank_error(make_request(model_dir("b1"), seed=37, model="c"))[0], "NOT_FOUND", "c")


if __name__ == "__main__":
    for k in ("a1", "a2", "b1"):
        model_dir(k)
    setup()
    run([test_two_models_different_shapes, test_unload_one_model, test_new_model_directory_is_found],
        daemon=S["d"], repo=S["repo"])
