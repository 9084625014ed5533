#!/usr/bin/python3
"""Hot reload with the real daemon and grpcio clients ranking continuously:
(1) version 2 copied in slowly (model.json first, weights in chunks) while
clients send requests: never loaded half-written, zero failed requests,
responses switch to model_version 2 within one poll interval (+ the load)
of the copy finishing, and never back; version 1 is
retired. (2) a corrupted version 3 (truncated safetensors), a bad model.json
and a shape mismatch appear: version 2 keeps serving, /v1/models, logs and
metrics name the file and problem, health stays SERVING; fixing version 3
in place loads it. (3) with polling off, SIGHUP rescans. (4) admin load
(pinning an older version) and unload, errors, loopback-only access."""
import json
import os
import shutil
import signal
import socket
import time
import urllib.error
import urllib.request

from ikbo_itest import Daemon, check, check_eq, make_request, metric, run, score_offline
from reload_common import (Load, install, model_dir, models, new_repo, slow_copy, version_state,
                           wait_for)

POLL_MS, SETTLE_MS = 500, 300
TMP = []


def daemon(repo, **cfg):
    conf = {"repository_poll_ms": POLL_MS, "repository_settle_ms": SETTLE_MS, "threads": 4}
    conf.update(cfg)
    d = Daemon(repo, **conf)
    TMP.append((d, repo))
    return d


def close(d, repo):
    check_eq(d.stop(), 0, "daemon exit status")
    d.close()
    shutil.rmtree(repo, ignore_errors=True)


def close_scores(got, want, what):
    check_eq(len(got), len(want), what + " length")
    for i, (g, w) in enumerate(zip(got, want)):
        check(abs(g - w) <= 1e-5 * max(1.0, abs(w)), "%s[%d]: %r vs %r" % (what, i, g, w))


S = {}


def test_new_version_under_load():
    repo = new_repo(a=["a1"])
    d = daemon(repo)
    S["d"], S["repo"] = d, repo
    load = Load(d, "a", model_dir("a1"))
    S["load"] = load
    wait_for(lambda: load.count() >= 20, 10, "traffic on version 1")
    t_done = slow_copy(repo, "a", 2, "a2")
    wait_for(lambda: any(r[2] == 2 for r in load.snapshot()), 10, "a response from version 2")
    wait_for(lambda: sum(r[2] == 2 for r in load.snapshot()) >= 20, 20, "20 answers from version 2")
    res = load.snapshot()
    errors = [r for r in res if r[3]]
    check_eq(errors[:3], [], "failed requests")
    t_switch = min(r[1] for r in res if r[2] == 2)
    late_v1 = [r for r in res if r[2] == 1 and r[0] > t_switch]
    check_eq(late_v1[:3], [], "version 1 answers to requests sent after the switch")
    check(set(r[2] for r in res) == {1, 2}, "versions seen: %s" % set(r[2] for r in res))
    st = version_state(d, "a", 2)
    check_eq(st, ("READY", ""), "version 2")
    load_s = [v for v in models(d)["a"]["versions"] if v["version"] == 2][0]["load_seconds"]
    latency = t_switch - t_done
    # At rest SETTLE_MS after the last write (< POLL_MS): the next poll, or
    # the settle deadline, loads it: within one poll interval (+ the load).
    bound = max(POLL_MS, SETTLE_MS) / 1000.0 + load_s + 0.25
    print("     switch %.3fs after the copy finished (poll %d ms, settle %d ms, load %.3fs, %d "
          "requests, 0 failed)" % (latency, POLL_MS, SETTLE_MS, load_s, len(res)))
    check(latency <= bound, "switched %.3fs after the copy finished; bound %.3fs" % (latency, bound))
    check(version_state(d, "a", 1)[0] == "UNLOADED", "version 1 retired: %s" % (version_state(d, "a", 1),))
    logs = d.logs()
    check("model_load model=a version=2 state=FAILED" not in logs, "half-written copy was loaded")
    check("model_load model=a version=2 state=READY" in logs, "load logged")
    check("model_unload model=a version=1" in logs, "retirement logged")
    m = d.metrics()
    check_eq(metric(m, "ikbo_model_load_failures_total", model="a"), 0, "load failures")
    check_eq(metric(m, "ikbo_model_loaded", model="a", version="2", state="READY"), 1, "gauge")
    # Version 2 answers are version 2's model (the reference scorer agrees).
    req = make_request(model_dir("a2"), users=2, cands_per_user=3, seed=7, model="a")
    got = d.rank(req)
    check_eq(got.model_version, 2, "model_version")
    close_scores([s.score for s in got.scores], score_offline(model_dir("a2"), req)[0], "scores")


def test_corrupted_version_keeps_serving():
    d, repo, load = S["d"], S["repo"], S["load"]
    n0 = load.count()
    # 3: truncated weights (copied in atomically, so it is complete and loads).
    v3 = os.path.join(repo, "a", ".3.incoming")
    shutil.copytree(model_dir("a3"), v3)
    w = os.path.join(v3, "weights.safetensors")
    size = os.path.getsize(w)
    with open(w, "r+b") as f:
        f.truncate(size // 3)
    os.rename(v3, os.path.join(repo, "a", "3"))
    st = wait_for(lambda: (version_state(d, "a", 3) or ("",))[0] == "FAILED" and version_state(d, "a", 3),
                  10, "version 3 FAILED")
    msg = st[1]
    check("a/3/weights.safetensors" in msg and "out of bounds" in msg, "message: " + msg)
    # 4: bad JSON; 5: model.json of another shape over a's weights.
    v4 = os.path.join(repo, "a", ".4.incoming")
    shutil.copytree(model_dir("a2"), v4)
    with open(os.path.join(v4, "model.json"), "w") as f:
        f.write('{"format": "ikbo-model/1", "inputs": {')
    os.rename(v4, os.path.join(repo, "a", "4"))
    v5 = os.path.join(repo, "a", ".5.incoming")
    shutil.copytree(model_dir("a2"), v5)
    shutil.copy(os.path.join(model_dir("b1"), "model.json"), os.path.join(v5, "model.json"))
    os.rename(v5, os.path.join(repo, "a", "5"))
    wait_for(lambda: all((version_state(d, "a", v) or ("",))[0] == "FAILED" for v in (4, 5)), 10,
             "versions 4 and 5 FAILED")
    m4, m5 = version_state(d, "a", 4)[1], version_state(d, "a", 5)[1]
    check("a/4/model.json" in m4 and "JSON" in m4, "bad JSON message: " + m4)
    check("a/5/" in m5 and "weights.safetensors" in m5, "shape mismatch message: " + m5)
    check_eq(version_state(d, "a", 2), ("READY", ""), "version 2 still READY")
    wait_for(lambda: load.count() > n0 + 20, 10, "traffic")
    res = load.snapshot()[n0:]
    check_eq([r for r in res if r[3]][:3], [], "failed requests")
    check_eq(set(r[2] for r in res), {2}, "versions answering")
    check_eq(d.health("a").status, 1, "health SERVING")
    check_eq(d.http("GET", "/readyz")[0], 200, "/readyz")
    code, detail = d.rank_error(dict(make_request(model_dir("a2"), seed=3, model="a"), modelVersion=3))
    check_eq(code, "NOT_FOUND", "explicit version 3")
    check("version 3 not found (ready: 2)" in detail, detail)
    logs = d.logs()
    check(" error model_load model=a version=3 state=FAILED" in logs, "failure logged")
    check("out of bounds" in logs, "engine message in the log")
    m = d.metrics()
    check_eq(metric(m, "ikbo_model_load_failures_total", model="a"), 3, "load failures")
    check_eq(metric(m, "ikbo_model_loaded", model="a", version="3", state="FAILED"), 1, "gauge")
    # Unchanged failed versions are not retried on every poll.
    time.sleep(2 * POLL_MS / 1000.0)
    check_eq(metric(d.metrics(), "ikbo_model_load_failures_total", model="a"), 3, "no retry")
    # Fixing version 3 in place (the file changes): retried after it settles.
    tmpw = os.path.join(repo, "a", "3", ".weights.tmp")
    shutil.copy(os.path.join(model_dir("a3"), "weights.safetensors"), tmpw)
    os.rename(tmpw, os.path.join(repo, "a", "3", "weights.safetensors"))
    # 5 is newer and FAILED, so latest-1 serves 3 now.
    wait_for(lambda: any(r[2] == 3 for r in load.snapshot()), 10, "version 3 answers")
    res = load.stop()
    check_eq([r for r in res if r[3]][:3], [], "failed requests over the whole run")
    check_eq(version_state(d, "a", 2)[0], "UNLOADED", "version 2 retired")
    print("     %d requests over both tests, 0 failed" % len(res))
    close(d, repo)


def test_sighup_rescans_when_polling_is_off():
    repo = new_repo(a=["a1"])
    d = daemon(repo, repository_poll_ms=0)
    install(repo, "a", 2, "a2")
    time.sleep(1.0)
    check_eq(d.rank(make_request(model_dir("a1"), seed=5, model="a")).model_version, 1,
             "no polling: still version 1")
    check(version_state(d, "a", 2) is None, "version 2 not seen yet")
    d.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: version_state(d, "a", 2) == ("READY", ""), 10, "version 2 after SIGHUP")
    check_eq(d.rank(make_request(model_dir("a1"), seed=5, model="a")).model_version, 2, "after SIGHUP")
    check("reload_requested" in d.logs(), "SIGHUP logged")
    S["d2"], S["repo2"] = d, repo


def post(d, path, host="127.0.0.1"):
    req = urllib.request.Request("http://%s:%d%s" % (host, d.http_port, path), data=b"", method="POST",
                                 headers={"X-Ikbo-Admin": "1"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def test_admin_load_unload():
    d, repo = S["d2"], S["repo2"]
    req = make_request(model_dir("a1"), seed=9, model="a")
    code, body = post(d, "/v1/models/a/load?version=1")
    check_eq((code, body), (202, {"model": "a", "version": 1, "status": "load requested"}), "load v1")
    wait_for(lambda: version_state(d, "a", 1) == ("READY", ""), 10, "pinned version 1")
    check_eq(d.rank(dict(req, modelVersion=1)).model_version, 1, "explicit version 1")
    check_eq(d.rank(req).model_version, 2, "newest is still 2")
    code, body = post(d, "/v1/models/a/unload?version=1")
    check_eq(code, 200, "unload v1")
    check_eq([(v["version"], v["state"]) for v in body["versions"]], [(2, "READY"), (1, "UNLOADED")],
             "versions after unload")
    check_eq(d.rank_error(dict(req, modelVersion=1))[0], "NOT_FOUND", "unloaded version")
    check_eq(d.rank(req).model_version, 2, "version 2 serves on")
    # A plain load reloads version 2 (a fresh load swapped in) with no gap.
    load = Load(d, "a", model_dir("a1"), threads=2)
    wait_for(lambda: load.count() > 10, 10, "traffic")
    n_loads = d.logs().count("model_load model=a version=2 state=READY")
    check_eq(post(d, "/v1/models/a/load")[0], 202, "reload")
    wait_for(lambda: d.logs().count("model_load model=a version=2 state=READY") > n_loads, 10, "reload")
    n = load.count()
    wait_for(lambda: load.count() > n + 10, 10, "traffic after the reload")
    check_eq(load.errors()[:3], [], "failed requests across the reload")
    load.stop()
    # Errors.
    check_eq(post(d, "/v1/models/nope/load")[0], 404, "unknown model")
    check_eq(post(d, "/v1/models/a/load?version=9")[0], 404, "unknown version")
    code, body = post(d, "/v1/models/a/load?version=x")
    check_eq((code, body["error"]["code"]), (400, "INVALID_ARGUMENT"), "bad version")
    check_eq(post(d, "/v1/models/a/load?verzion=1")[0], 400, "unknown parameter")
    check_eq(post(d, "/v1/models/a/unload?version=7")[0], 404, "unload of a version not loaded")
    check_eq(d.http("GET", "/v1/models/a/load")[0], 405, "GET on an admin route")
    code, body = post(d, "/v1/models/a/b/load")  # a name cannot hold '/': no such route
    check_eq((code, body["error"]["message"]), (404, "no route for /v1/models/a/b/load"),
             "a name with '/'")
    close(d, repo)


def local_address():
    """A non-loopback address of this machine, or None."""
    for probe in ("10.255.255.254", "192.0.2.254", "198.51.100.1"):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            s.connect((probe, 9))  # UDP: no packet is sent; picks the outgoing address
            ip = s.getsockname()[0]
            if not ip.startswith("127.") and ip != "0.0.0.0":
                return ip
        except OSError:
            pass
        finally:
            s.close()
    return None


def test_admin_is_loopback_only():
    ip = local_address()
    repo = new_repo(a=["a1"])
    d = daemon(repo, http_listen="0.0.0.0:0", repository_poll_ms=0, wait_ready=False)
    line = [l for l in d.logs().splitlines() if " info listening " in l][0]
    d.http_port = int(line.split("http=")[1].split()[0].rsplit(":", 1)[1])
    d.wait_ready()
    if ip:
        code, body = post(d, "/v1/models/a/load", host=ip)
        check_eq((code, body["error"]["code"]), (403, "PERMISSION_DENIED"), "remote admin call")
        check("loopback" in body["error"]["message"], body)
    else:
        print("     (no non-loopback address: the remote case is skipped)")
    check_eq(post(d, "/v1/models/a/load")[0], 202, "loopback admin call")
    close(d, repo)
    repo = new_repo(a=["a1"])
    d = daemon(repo, admin_http="off", repository_poll_ms=0)
    code, body = post(d, "/v1/models/a/unload")
    check_eq((code, body["error"]["code"]), (403, "PERMISSION_DENIED"), "admin_http off")
    check_eq(d.rank(make_request(model_dir("a1"), seed=5, model="a")).model_version, 1, "still serving")
    close(d, repo)


def cleanup():
    for d, repo in TMP:
        if d.proc.poll() is None:
            d.stop()
        d.close()
        shutil.rmtree(repo, ignore_errors=True)


if __name__ == "__main__":
    for k in ("a1", "a2", "a3", "b1"):
        model_dir(k)  # generate (once) before any timing starts
    try:
        run([test_new_version_under_load, test_corrupted_version_keeps_serving,
             test_sighup_rescans_when_polling_is_off, test_admin_load_unload,
             test_admin_is_loopback_only])
    finally:
        cleanup()
