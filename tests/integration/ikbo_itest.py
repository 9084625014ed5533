"""Shared plumbing for the daemon integration tests (tests/integration/test_*.py).

Each test file starts the real build/ikbo-serve on free ports with a temporary
config, talks to it with grpcio and urllib, and exits nonzero on failure.
Run with /usr/bin/python3 (Debian's python3-grpcio, python3-protobuf,
python3-prometheus-client) and IKBO_BUILD=<build dir>, IKBO_ROOT=<repo root>.

The model: models/demo/<N> when the repository has it, else a small random
model made once with tools/reference/random_model.py under
$IKBO_BUILD/itest/models (so a fresh checkout can run these tests too). A
second model without history ("nohist") is always generated there.
"""
import importlib.util
import json
import os
import random
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.error
import urllib.request

import grpc
from google.protobuf import json_format

from itest_run import check, check_eq, run_tests, summary  # noqa: F401 (re-exported)

ROOT = os.path.abspath(os.environ.get("IKBO_ROOT") or
                       os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.path.abspath(os.environ.get("IKBO_BUILD") or os.path.join(ROOT, "build"))
SERVE = os.path.join(BUILD, "ikbo-serve")
SCORE = os.path.join(BUILD, "ikbo-score")
PY = "/usr/bin/python3"


def _load(name, rel):
    """Imports a generated *_pb2.py by path: build/gen/py/grpc/... would
    otherwise collide with the grpc package itself."""
    path = os.path.join(BUILD, "gen", "py", rel)
    if not os.path.exists(path):
        raise SystemExit("missing %s: run `make` (protoc --python_out=build/gen/py)" % path)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


pb = _load("ranker_pb2", "ikbo/v1/ranker_pb2.py")
hpb = _load("health_pb2", "grpc/health/v1/health_pb2.py")


# ---------------------------------------------------------------- models

def _gen_model(out, seed, extra=()):
    if os.path.exists(os.path.join(out, "model.json")):
        return
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    cmd = [PY, os.path.join(ROOT, "tools", "reference", "random_model.py"), "--out", tmp,
           "--seed", str(seed)] + list(extra)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    os.rename(tmp, out)


def _latest_version(model_dir):
    vs = [int(d) for d in os.listdir(model_dir)
          if d.isdigit() and os.path.exists(os.path.join(model_dir, d, "model.json"))]
    return max(vs) if vs else None


def model_repo():
    """A repository dir with models demo (history) and nohist (no history),
    as symlinks into cached model dirs. Returns (repo, {name: version_dir})."""
    cache = os.path.join(BUILD, "itest", "models")
    os.makedirs(cache, exist_ok=True)
    demo = os.path.join(ROOT, "models", "demo")  # committed with the repository
    nohist = os.path.join(cache, "nohist")
    os.makedirs(nohist, exist_ok=True)
    _gen_model(os.path.join(nohist, "1"), 12, ["--no-history", "--tasks", "1"])
    repo = tempfile.mkdtemp(prefix="ikbo-repo-")
    os.symlink(demo, os.path.join(repo, "demo"))
    os.symlink(nohist, os.path.join(repo, "nohist"))
    dirs = {"demo": os.path.join(demo, str(_latest_version(demo))),
            "nohist": os.path.join(nohist, "1")}
    return repo, dirs


def model_inputs(version_dir):
    with open(os.path.join(version_dir, "model.json")) as f:
        return json.load(f)["inputs"]


# ---------------------------------------------------------------- requests

def make_request(version_dir, users=3, cands_per_user=5, seed=1, model="demo",
                 history_len=6, key_prefix="u"):
    """A valid RankRequest as a proto3-JSON dict for the model at version_dir.
    User i's candidates are interleaved (not grouped) to exercise grouping."""
    rng = random.Random(seed)
    inp = model_inputs(version_dir)
    ui, ci = inp["user"], inp["candidate"]
    hist = ui.get("history")
    us = []
    for i in range(users):
        u = {"key": "%s%d" % (key_prefix, i),
             "dense": [round(rng.uniform(-1, 1), 4) for _ in range(ui.get("dense", 0))],
             "sparse": [{"name": n, "ids": [rng.randrange(-10**6, 10**6) for _ in range(rng.randrange(0, 4))]}
                        for n in ui.get("sparse", [])]}
        if hist:
            n = history_len
            u["historyIds"] = [rng.randrange(0, 10**9) for _ in range(n)]
            u["historyActions"] = [rng.randrange(0, hist.get("actions", 1)) for _ in range(n)]
        us.append(u)
    cs = []
    for k in range(cands_per_user):
        for i in range(users):
            cs.append({"id": 1000 * i + k + 1, "user": i,
                       "dense": [round(rng.uniform(-1, 1), 4) for _ in range(ci.get("dense", 0))],
                       "sparse": [{"name": n, "ids": [rng.randrange(0, 10**6) for _ in range(rng.randrange(1, 3))]}
                                  for n in ci.get("sparse", [])]})
    return {"model": model, "users": us, "candidates": cs, "requestId": "req-%d" % seed}


def to_proto(req_dict):
    return json_format.Parse(json.dumps(req_dict), pb.RankRequest())


def score_offline(version_dir, req_dict, args=()):
    """build/ikbo-score on the same JSON: (scores, task_scores) in request order.
    args: extra flags (--device cuda:0, --mode broadcast)."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(req_dict, f)
        path = f.name
    try:
        out = subprocess.run([SCORE] + list(args) + [version_dir, path], check=True, capture_output=True,
                             text=True).stdout
    finally:
        os.unlink(path)
    d = json.loads(out)
    return d["scores"], d["task_scores"]


def f32(x):
    """The float32 bit pattern of x, for exact comparisons."""
    return struct.unpack("<I", struct.pack("<f", x))[0]


# ---------------------------------------------------------------- daemon

def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Daemon:
    """build/ikbo-serve with a temp config on free ports."""

    def __init__(self, repo, wait_ready=True, extra_args=(), **cfg):
        self.tmp = tempfile.mkdtemp(prefix="ikbo-itest-")
        self.grpc_port = free_port()
        self.http_port = free_port()
        conf = {"grpc_listen": "127.0.0.1:%d" % self.grpc_port,
                "http_listen": "127.0.0.1:%d" % self.http_port,
                "model_repository": repo, "threads": 2,
                "log": {"level": "info", "format": "plain"}, "drain_timeout_ms": 5000}
        conf.update(cfg)
        self.config_path = os.path.join(self.tmp, "server.json")
        with open(self.config_path, "w") as f:
            json.dump(conf, f)
        self.log_path = os.path.join(self.tmp, "serve.log")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen([SERVE, "--config", self.config_path] + list(extra_args),
                                     stdout=self.log, stderr=subprocess.STDOUT)
        self.channel = None
        self.tls = "tls" in cfg and cfg["tls"]
        self._wait_listening()
        if wait_ready:
            self.wait_ready()

    # -- lifecycle
    def _wait_listening(self, timeout=15):
        t0 = time.time()
        while time.time() - t0 < timeout:
            if self.proc.poll() is not None:
                raise AssertionError("daemon exited %d:\n%s" % (self.proc.returncode, self.logs()))
            if " listening " in self.logs() or '"event":"listening"' in self.logs():
                return
            if self.http("GET", "/healthz")[0] == 200:  # log level above info
                return
            time.sleep(0.05)
        raise AssertionError("daemon did not listen within %ds:\n%s" % (timeout, self.logs()))

    def wait_ready(self, timeout=30):
        t0 = time.time()
        while time.time() - t0 < timeout:
            code, _ = self.http("GET", "/readyz")
            if code == 200:
                return
            time.sleep(0.05)
        raise AssertionError("not ready within %ds:\n%s" % (timeout, self.logs()))

    def logs(self):
        with open(self.log_path) as f:
            return f.read()

    def stop(self, sig=signal.SIGTERM, timeout=20):
        if self.channel:
            self.channel.close()
            self.channel = None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError("daemon did not exit within %ds:\n%s" % (timeout, self.logs()))
        self.log.close()
        return rc

    def close(self):
        if self.proc.poll() is None:
            self.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if exc[0] is not None:
            sys.stderr.write("---- daemon log ----\n%s\n" % self.logs())
        self.close()

    # -- gRPC
    def chan(self):
        if self.channel is None:
            self.channel = grpc.insecure_channel("127.0.0.1:%d" % self.grpc_port)
        return self.channel

    def rank_stub(self, channel=None):
        return (channel or self.chan()).unary_unary(
            "/ikbo.v1.Ranker/Rank", request_serializer=pb.RankRequest.SerializeToString,
            response_deserializer=pb.RankResponse.FromString)

    def rank(self, req, timeout=10, channel=None):
        if isinstance(req, dict):
            req = to_proto(req)
        return self.rank_stub(channel)(req, timeout=timeout)

    def rank_error(self, req, timeout=10):
        """(code name, details) of a Rank call that must fail."""
        try:
            self.rank(req, timeout=timeout)
        except grpc.RpcError as e:
            return e.code().name, e.details()
        raise AssertionError("Rank succeeded, expected an error")

    def model_info(self, name=""):
        stub = self.chan().unary_unary(
            "/ikbo.v1.Ranker/ModelInfo", request_serializer=pb.ModelInfoRequest.SerializeToString,
            response_deserializer=pb.ModelInfoResponse.FromString)
        return stub(pb.ModelInfoRequest(model=name), timeout=10)

    def health(self, service=""):
        stub = self.chan().unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=hpb.HealthCheckRequest.SerializeToString,
            response_deserializer=hpb.HealthCheckResponse.FromString)
        return stub(hpb.HealthCheckRequest(service=service), timeout=10)

    # -- HTTP
    def http(self, method, path, body=None, headers=None):
        """(status, body bytes); never raises on HTTP errors."""
        data = None
        if body is not None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
        req = urllib.request.Request("http://127.0.0.1:%d%s" % (self.http_port, path),
                                     data=data, method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=15) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()
        except (urllib.error.URLError, ConnectionError) as e:
            return -1, str(e).encode()

    def metrics(self):
        """{(sample name, frozenset(labels.items())): value} from /metrics."""
        from prometheus_client.parser import text_string_to_metric_families
        code, body = self.http("GET", "/metrics")
        assert code == 200, code
        out = {}
        for fam in text_string_to_metric_families(body.decode()):
            for s in fam.samples:
                out[(s.name, frozenset(s.labels.items()))] = s.value
        return out


def metric(m, name, **labels):
    return m.get((name, frozenset(labels.items())), 0.0)


# ---------------------------------------------------------------- runner

def run(tests, daemon=None, repo=None):
    """Runs test functions in order, one line each; then stops the daemon
    (its exit status must be 0) and removes the temp repository. Exits 1 on
    any failure."""
    failed, t_all = run_tests(tests)
    if daemon is not None:
        try:
            rc = daemon.stop()
            if rc != 0:
                failed += 1
                print("FAIL daemon exit status %d" % rc)
        except Exception:
            failed += 1
            print("FAIL stopping the daemon\n%s" % traceback.format_exc())
        if failed:
            print("---- daemon log (tail) ----\n%s" % daemon.logs()[-6000:])
        daemon.close()
    if repo:
        shutil.rmtree(repo, ignore_errors=True)
    sys.exit(summary(len(tests), failed, t_all))
