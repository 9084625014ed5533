"""Shared plumbing for the deploy/ tests (tests/integration/test_deploy*.py).

Run with /usr/bin/python3 (Debian's python3-grpcio, python3-protobuf,
python3-prometheus-client, python3-yaml) and IKBO_BUILD=<build dir>,
IKBO_ROOT=<repo root>, as `make integration` does.

What is here: a small check runner that prints one PASS/FAIL/SKIP line per
check (a SKIP always says why) and a closing "N passed, N failed" line; the
model repository the tests serve (models/demo when it is there, else a small
random model made once with tools/reference/random_model.py); valid
RankRequests for a model; and Daemon, the real build/ikbo-serve on ports
picked by the kernel (port 0, read back from its "listening" log line).
"""
import importlib.util
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.error
import urllib.request

ROOT = os.path.abspath(os.environ.get("IKBO_ROOT") or
                       os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.path.abspath(os.environ.get("IKBO_BUILD") or os.path.join(ROOT, "build"))
SERVE = os.path.join(BUILD, "ikbo-serve")
DEPLOY = os.path.join(ROOT, "deploy")
PY = "/usr/bin/python3"


# ---------------------------------------------------------------- runner

class Skip(Exception):
    """Raised by a check that cannot run here; the message says why."""


class Runner:
    def __init__(self, name):
        self.name = name
        self.passed = self.failed = self.skipped = 0

    def check(self, title, fn, *args):
        """Runs fn(*args); False when it failed (the caller may stop)."""
        t0 = time.time()
        try:
            note = fn(*args)
        except Skip as e:
            self.skipped += 1
            print("SKIP %s: %s" % (title, e), flush=True)
            return True
        except Exception:  # noqa: BLE001 - any failure is reported, the rest still run
            self.failed += 1
            print("FAIL %s (%.1fs)" % (title, time.time() - t0), flush=True)
            traceback.print_exc()
            sys.stdout.flush()
            return False
        self.passed += 1
        print("PASS %s (%.1fs)%s" % (title, time.time() - t0, (": " + note) if note else ""),
              flush=True)
        return True

    def finish(self):
        line = "%s: %d passed, %d failed" % (self.name, self.passed, self.failed)
        if self.skipped:
            line += ", %d skipped" % self.skipped
        print(line, flush=True)
        sys.exit(1 if self.failed else 0)


def which(name):
    """A command's path, also looking in the sbin directories (daemons like
    nginx and haproxy live there; a non-login PATH may lack them)."""
    return shutil.which(name) or shutil.which(name, path="/usr/local/sbin:/usr/sbin:/sbin")


def need_tool(name, package):
    """The path of a command, or Skip naming the Debian package that has it."""
    path = which(name)
    if not path:
        raise Skip("%s not found (Debian package %s; `make deps` installs it as root)"
                   % (name, package))
    return path


def run(cmd, timeout=30, **kw):
    """Runs cmd; AssertionError with its output when it exits nonzero."""
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    if p.returncode != 0:
        raise AssertionError("%s exited %d\nstdout:\n%s\nstderr:\n%s"
                             % (" ".join(cmd), p.returncode, p.stdout, p.stderr))
    return p


# ---------------------------------------------------------------- protos

def _load(name, rel):
    path = os.path.join(BUILD, "gen", "py", rel)
    if not os.path.exists(path):
        raise SystemExit("missing %s: run `make` first" % path)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_pb = {}


def pb():
    """ranker_pb2 (loaded by path: build/gen/py/grpc would shadow grpcio)."""
    if "r" not in _pb:
        _pb["r"] = _load("deploy_ranker_pb2", "ikbo/v1/ranker_pb2.py")
    return _pb["r"]


def hpb():
    if "h" not in _pb:
        _pb["h"] = _load("deploy_health_pb2", "grpc/health/v1/health_pb2.py")
    return _pb["h"]


# ---------------------------------------------------------------- models

def _latest_version(model_dir):
    vs = [int(d) for d in os.listdir(model_dir)
          if d.isdigit() and os.path.exists(os.path.join(model_dir, d, "model.json"))]
    return max(vs) if vs else None


def model_repo():
    """(repository dir holding only model "demo", that version's dir): the
    shipped models/demo when present (linked into a repository of its own,
    so other models under models/ are not loaded), else a random model made
    once and cached."""
    demo = os.path.join(ROOT, "models", "demo")
    if os.path.isdir(demo) and _latest_version(demo):
        repo = os.path.join(BUILD, "deploy-test", "repo")
        os.makedirs(repo, exist_ok=True)
        link = os.path.join(repo, "demo")
        if not os.path.islink(link) or os.readlink(link) != demo:
            if os.path.islink(link):
                os.unlink(link)
            os.symlink(demo, link)
        return repo, os.path.join(demo, str(_latest_version(demo)))
    repo = os.path.join(BUILD, "deploy-test", "models")
    vdir = os.path.join(repo, "demo", "1")
    if not os.path.exists(os.path.join(vdir, "model.json")):
        tmp = vdir + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(os.path.dirname(vdir), exist_ok=True)
        subprocess.run([PY, os.path.join(ROOT, "tools", "reference", "random_model.py"),
                        "--out", tmp, "--seed", "8", "--name", "demo"],
                       check=True, stdout=subprocess.DEVNULL)
        os.rename(tmp, vdir)
    return repo, vdir


def make_request(version_dir, seed, users=3, cands_per_user=8):
    """A valid RankRequest (proto) for the model in version_dir."""
    with open(os.path.join(version_dir, "model.json")) as f:
        inp = json.load(f)["inputs"]
    rng = random.Random(seed)
    ui, ci = inp["user"], inp["candidate"]
    hist = ui.get("history")
    R = pb()
    req = R.RankRequest(model="demo", request_id="deploy-%d" % seed)
    for i in range(users):
        u = req.users.add(key="u%d-%d" % (seed, i))
        u.dense.extend(rng.uniform(-1, 1) for _ in range(ui.get("dense", 0)))
        for n in ui.get("sparse", []):
            u.sparse.add(name=n, ids=[rng.randrange(0, 10**6) for _ in range(rng.randrange(1, 4))])
        if hist:
            n = rng.randrange(1, 8)
            u.history_ids.extend(rng.randrange(0, 10**9) for _ in range(n))
            u.history_actions.extend(rng.randrange(0, hist.get("actions", 1)) for _ in range(n))
    for k in range(cands_per_user):
        for i in range(users):
            c = req.candidates.add(id=1000 * i + k + 1, user=i)
            c.dense.extend(rng.uniform(-1, 1) for _ in range(ci.get("dense", 0)))
            for n in ci.get("sparse", []):
                c.sparse.add(name=n, ids=[rng.randrange(0, 10**6) for _ in range(rng.randrange(1, 3))])
    return req


# ---------------------------------------------------------------- daemon

def http_get(url, timeout=5):
    """(status, body text); HTTP errors are returned, not raised."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


class Daemon:
    """build/ikbo-serve with a temp config on kernel-picked loopback ports.
    config_file: a config to use as the base (e.g. a shipped one); the
    listen addresses, model repository and device are then set by flags,
    which take precedence over the file (server/config.h)."""

    def __init__(self, repo, config=None, config_file=None, device="cpu"):
        self.tmp = tempfile.mkdtemp(prefix="ikbo-deploy-")
        if config_file is None:
            conf = {"grpc_listen": "127.0.0.1:0", "http_listen": "127.0.0.1:0",
                    "model_repository": repo, "threads": 4, "drain_timeout_ms": 5000}
            conf.update(config or {})
            config_file = os.path.join(self.tmp, "server.json")
            with open(config_file, "w") as f:
                json.dump(conf, f)
        self.log_path = os.path.join(self.tmp, "serve.log")
        self.log = open(self.log_path, "w")
        cmd = [SERVE, "--config", config_file, "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0",
               "--models", repo, "--device", device]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        self.grpc_port = self.http_port = None
        try:
            self._wait_listening()
        except BaseException:
            self.cleanup()  # the caller gets no object to clean up
            raise

    def logs(self):
        with open(self.log_path) as f:
            return f.read()

    def _wait_listening(self, timeout=20):
        t0 = time.time()
        while time.time() - t0 < timeout:
            logs = self.logs()
            # log.format plain or json
            m = (re.search(r" listening grpc=\S+:(\d+) http=\S+:(\d+)", logs) or
                 re.search(r'"event":"listening","grpc":"[^"]*:(\d+)","http":"[^"]*:(\d+)"', logs))
            if m:
                self.grpc_port, self.http_port = int(m.group(1)), int(m.group(2))
                return
            if self.proc.poll() is not None:
                raise AssertionError("ikbo-serve exited %d before listening:\n%s"
                                     % (self.proc.returncode, self.logs()))
            time.sleep(0.05)
        raise AssertionError("ikbo-serve did not log 'listening' in %ds:\n%s" % (timeout, self.logs()))

    @property
    def grpc_addr(self):
        return "127.0.0.1:%d" % self.grpc_port

    def url(self, path):
        return "http://127.0.0.1:%d%s" % (self.http_port, path)

    def wait_ready(self, timeout=30):
        t0 = time.time()
        while time.time() - t0 < timeout:
            if http_get(self.url("/readyz"))[0] == 200:
                return
            if self.proc.poll() is not None:
                raise AssertionError("ikbo-serve exited %d:\n%s" % (self.proc.returncode, self.logs()))
            time.sleep(0.05)
        raise AssertionError("not ready after %ds:\n%s" % (timeout, self.logs()))

    def metrics_text(self):
        st, body = http_get(self.url("/metrics"))
        assert st == 200, "/metrics gave %d" % st
        return body

    def metrics(self):
        """{family name: [(sample name, labels, value)]} parsed by prometheus_client."""
        from prometheus_client.parser import text_string_to_metric_families
        out = {}
        for fam in text_string_to_metric_families(self.metrics_text()):
            # prometheus_client strips _total from counter family names.
            name = fam.name + "_total" if fam.type == "counter" else fam.name
            out[name] = [(s.name, s.labels, s.value) for s in fam.samples]
        return out

    def ok_requests(self):
        """Sum of ikbo_requests_total{code="OK"}."""
        return sum(v for n, l, v in self.metrics().get("ikbo_requests_total", [])
                   if l.get("code") == "OK")

    def stop(self, sig=signal.SIGTERM, timeout=20):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError("ikbo-serve did not exit %ds after signal %d:\n%s"
                                     % (timeout, sig, self.logs()))
        self.log.close()
        return self.proc.returncode

    def cleanup(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if not self.log.closed:
            self.log.close()
        shutil.rmtree(self.tmp, ignore_errors=True)
