#!/usr/bin/python3
"""Process lifecycle and operations: --help/--version, config errors (one
line, exit 2), a model that fails to load (logged, visible in /v1/models,
/readyz, metrics and health; the daemon still serves the others), SIGHUP,
the listening line, log formats and levels, a busy port."""
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import grpc

from ikbo_itest import (SERVE, Daemon, check, check_eq, metric, make_request, model_repo, run)

REPO, DIRS = model_repo()
DEMO = DIRS["demo"]


def serve(*args, timeout=20):
    return subprocess.run([SERVE] + list(args), capture_output=True, text=True, timeout=timeout)


def test_help_and_version():
    p = serve("--help")
    check_eq(p.returncode, 0, "--help exit")
    check("--config" in p.stdout and "--threads" in p.stdout, "help lists flags")
    p = serve("--version")
    check_eq(p.returncode, 0, "--version exit")
    check(p.stdout.startswith("ikbo-serve "), p.stdout)


def one_line_exit_2(p, needle):
    check_eq(p.returncode, 2, "exit status for %r" % needle)
    lines = p.stderr.strip().splitlines()
    check_eq(len(lines), 1, "one line: %r" % p.stderr)
    check(lines[0].startswith("ikbo-serve: ") and needle in lines[0], lines[0])


def test_config_errors():
    tmp = tempfile.mkdtemp(prefix="ikbo-itest-")
    try:
        one_line_exit_2(serve("--bogus"), "--bogus")
        one_line_exit_2(serve("--threads", "zero"), "threads")
        cfg = os.path.join(tmp, "bad.json")
        with open(cfg, "w") as f:
            f.write('{"threads": "two"}')
        one_line_exit_2(serve("--config", cfg), "threads")
        with open(cfg, "w") as f:
            f.write('{"limits": {"max_userz": 3}}')
        one_line_exit_2(serve("--config", cfg), "max_userz")
        one_line_exit_2(serve("--config", os.path.join(tmp, "missing.json")), "missing.json")
        one_line_exit_2(serve("--models", os.path.join(tmp, "no-repo"), "--grpc", "127.0.0.1:0",
                              "--http", "127.0.0.1:0"), "no-repo")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_failed_model_is_visible_and_others_serve():
    repo = tempfile.mkdtemp(prefix="ikbo-repo-")
    os.symlink(os.path.dirname(DEMO), os.path.join(repo, "demo"))
    os.makedirs(os.path.join(repo, "broken", "3"))
    with open(os.path.join(repo, "broken", "3", "model.json"), "w") as f:
        f.write('{"format": "ikbo-model/1", "inputs": ')  # truncated JSON
    d = Daemon(repo, wait_ready=False, models=["demo", "broken", "ghost"])
    try:
        # Models load one after another, in no promised order: wait for all three.
        t_end = time.time() + 15
        while time.time() < t_end and not all(
                "model_load model=%s " % n in d.logs() for n in ("broken", "demo", "ghost")):
            time.sleep(0.05)
        logs = d.logs()
        check(" error model_load model=broken version=3 state=FAILED" in logs, "load failure logged")
        check(" error model_load model=ghost state=FAILED" in logs, "missing model logged")
        code, body = d.http("GET", "/readyz")
        check_eq(code, 503, "/readyz")
        check(b"broken" in body or b"ghost" in body, body)
        models = {m["name"]: m for m in json.loads(d.http("GET", "/v1/models")[1])["models"]}
        check_eq(sorted(models), ["broken", "demo", "ghost"], "models listed")
        v = models["broken"]["versions"][0]
        check_eq((v["version"], v["state"]), (3, "FAILED"), "broken version")
        check("model.json" in v["message"], "message names the file: " + v["message"])
        check_eq(models["ghost"]["versions"][0]["state"], "FAILED", "ghost")
        check_eq(models["demo"]["versions"][0]["state"], "READY", "demo")
        m = d.metrics()
        check_eq(metric(m, "ikbo_model_loaded", model="broken", version="3", state="FAILED"), 1,
                 "metric for the failed model")
        check_eq(d.health("broken").status, 2, "health NOT_SERVING for broken")
        check_eq(d.health("demo").status, 1, "health SERVING for demo")
        code, msg = d.rank_error(make_request(DEMO, seed=61, model="broken"))
        check_eq(code, "UNAVAILABLE", "rank on a failed model")
        check("broken" in msg and "FAILED" in msg, msg)
        check_eq(len(d.rank(make_request(DEMO, seed=62)).scores), 15, "demo still serves")
        check_eq(d.stop(), 0, "exit status")
    finally:
        d.close()
        shutil.rmtree(repo, ignore_errors=True)


def test_sighup_listening_line_and_port_zero():
    d = Daemon(REPO, grpc_listen="127.0.0.1:0", http_listen="127.0.0.1:0", wait_ready=False)
    try:
        line = [l for l in d.logs().splitlines() if " info listening " in l][0]
        fields = dict(kv.split("=", 1) for kv in line.split()[3:])
        gport, hport = int(fields["grpc"].split(":")[1]), int(fields["http"].split(":")[1])
        check(gport > 0 and hport > 0, line)
        d.grpc_port, d.http_port = gport, hport
        d.wait_ready()
        d.proc.send_signal(signal.SIGHUP)
        t_end = time.time() + 5
        while "reload_requested" not in d.logs() and time.time() < t_end:
            time.sleep(0.02)
        check("reload_requested" in d.logs(), "SIGHUP logged")
        check_eq(len(d.rank(make_request(DEMO, seed=63)).scores), 15, "serves after SIGHUP")
        check_eq(d.stop(), 0, "exit status")
    finally:
        d.close()


def test_json_logs_and_level():
    d = Daemon(REPO, log={"level": "info", "format": "json"})
    try:
        d.rank(make_request(DEMO, seed=64, key_prefix='q"\\'))
        req = make_request(DEMO, seed=64)
        req["requestId"] = 'id with "quotes" and\nnewline'
        d.rank(req)
        check_eq(d.stop(), 0, "exit")
        events = []
        for line in d.logs().splitlines():
            if line.startswith("{"):
                o = json.loads(line)  # every line is one JSON object
                check({"ts", "level", "event"} <= set(o), line)
                events.append(o)
        ranks = [o for o in events if o["event"] == "rank"]
        check_eq(len(ranks), 2, "rank events")
        check_eq(ranks[1]["request_id"], 'id with "quotes" and\nnewline', "escaped request id")
        check_eq((ranks[0]["model"], ranks[0]["code"]), ("demo", "OK"), "fields")
        check(isinstance(ranks[0]["ms"], (int, float)), "ms is a number")
    finally:
        d.close()
    d = Daemon(REPO, log={"level": "warn", "format": "plain"}, wait_ready=False)
    try:
        # With level warn the listening line is filtered: wait on /readyz only.
        d.wait_ready()
        d.rank(make_request(DEMO, seed=65))
        check_eq(d.stop(), 0, "exit")
        check(" info " not in d.logs(), "no info lines at level warn")
    finally:
        d.close()


def test_grpc_args_env():
    """IKBO_GRPC_ARGS (server/grpc_args.h): a malformed entry stops the
    start with one line naming it; a valid one serves."""
    env = dict(os.environ, IKBO_GRPC_ARGS="grpc.http2.lookahead_bytes=lots")
    p = subprocess.run([SERVE, "--models", REPO, "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0"],
                       capture_output=True, text=True, timeout=20, env=env)
    check(p.returncode != 0, "exit %d" % p.returncode)
    check("IKBO_GRPC_ARGS: 'grpc.http2.lookahead_bytes=lots' is not key=integer" in p.stderr,
          p.stderr[-400:])
    old = os.environ.get("IKBO_GRPC_ARGS")
    os.environ["IKBO_GRPC_ARGS"] = "grpc.http2.lookahead_bytes=1048576,grpc.http2.bdp_probe=0"
    try:
        with Daemon(REPO) as d:
            check_eq(len(d.rank(make_request(DEMO, seed=64)).scores), 15, "serves with the args")
    finally:
        if old is None:
            del os.environ["IKBO_GRPC_ARGS"]
        else:
            os.environ["IKBO_GRPC_ARGS"] = old


def test_port_in_use():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    port = s.getsockname()[1]
    try:
        p = serve("--models", REPO, "--grpc", "127.0.0.1:%d" % port, "--http", "127.0.0.1:0")
        check(p.returncode not in (0, 2) and p.returncode > 0, "exit %d" % p.returncode)
        check("127.0.0.1:%d" % port in p.stderr, "names the address: " + p.stderr[-400:])
    finally:
        s.close()


if __name__ == "__main__":
    run([test_help_and_version, test_config_errors, test_failed_model_is_visible_and_others_serve,
         test_sighup_listening_line_and_port_zero, test_json_logs_and_level, test_grpc_args_env,
         test_port_in_use],
        repo=REPO)
