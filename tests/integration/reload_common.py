"""Shared pieces of the model-repository tests (test_reload.py,
test_models_multi.py, test_reload_leaks.py): cached random models, a scratch
repository, version directories copied in the ways operators copy them, a
background client that ranks continuously and records every answer, and
small waits. Built on ikbo_itest.py (the daemon, requests, checks)."""
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time

import grpc

from ikbo_itest import BUILD, PY, ROOT, make_request, pb, to_proto

# name -> random_model.py flags. "a"'s seeds give three versions with the same
# inputs and different weights; "b" has other shapes (no history, other
# widths, one task).
MODELS = {
    "a1": (21, []),
    "a2": (22, []),
    "a3": (23, []),
    "b1": (24, ["--no-history", "--user-dense", "7", "--cand-dense", "2", "--dim", "8",
                "--tasks", "1", "--user-sparse", "1", "--cand-sparse", "3"]),
}


def model_dir(key):
    """A cached version directory (model.json + weights.safetensors)."""
    cache = os.path.join(BUILD, "itest", "reload")
    out = os.path.join(cache, key)
    if not os.path.exists(os.path.join(out, "model.json")):
        os.makedirs(cache, exist_ok=True)
        seed, extra = MODELS[key]
        tmp = out + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        subprocess.run([PY, os.path.join(ROOT, "tools", "reference", "random_model.py"), "--out",
                        tmp, "--seed", str(seed)] + extra, check=True, stdout=subprocess.DEVNULL)
        os.rename(tmp, out)
    return out


def new_repo(**versions):
    """A scratch repository: new_repo(a=["a1"], b=["b1"]) makes a/1 from
    a1 and b/1 from b1."""
    repo = tempfile.mkdtemp(prefix="ikbo-reload-repo-")
    for name, keys in versions.items():
        for i, key in enumerate(keys, 1):
            install(repo, name, i, key, atomic=True)
    return repo


def install(repo, name, version, key, atomic=True):
    """Copies a cached model in as <repo>/<name>/<version>. atomic: copy to a
    dot-directory beside it and rename (the recommended way)."""
    src = model_dir(key)
    dst = os.path.join(repo, name, str(version))
    os.makedirs(os.path.join(repo, name), exist_ok=True)
    if atomic:
        tmp = os.path.join(repo, name, ".%d.incoming" % version)
        shutil.copytree(src, tmp)
        os.rename(tmp, dst)
    else:
        shutil.copytree(src, dst)
    return dst


def slow_copy(repo, name, version, key, chunks=5, pause=0.12):
    """The unfriendly way: model.json first, then the weights in chunks with
    pauses (a slow copy still in progress). Returns the time the last byte
    was written."""
    src = model_dir(key)
    dst = os.path.join(repo, name, str(version))
    os.makedirs(dst)
    shutil.copy(os.path.join(src, "model.json"), dst)
    with open(os.path.join(src, "weights.safetensors"), "rb") as f:
        data = f.read()
    step = (len(data) + chunks - 1) // chunks
    with open(os.path.join(dst, "weights.safetensors"), "wb") as f:
        for i in range(0, len(data), step):
            f.write(data[i:i + step])
            f.flush()
            os.fsync(f.fileno())
            time.sleep(pause)
    return time.time()


def wait_for(fn, timeout, what, step=0.02):
    t_end = time.time() + timeout
    while True:
        v = fn()
        if v:
            return v
        if time.time() > t_end:
            raise AssertionError("timed out after %.1fs waiting for %s" % (timeout, what))
        time.sleep(step)


def models(d):
    code, body = d.http("GET", "/v1/models")
    assert code == 200, (code, body)
    return {m["name"]: m for m in json.loads(body)["models"]}


def version_state(d, name, version):
    """(state, message) of a model version in /v1/models, or None."""
    m = models(d).get(name)
    for v in (m or {}).get("versions", []):
        if v["version"] == version:
            return v["state"], v["message"]
    return None


class Load:
    """Clients ranking one model continuously on their own channels; every
    answer is recorded as (t_start, t_end, model_version or None, error)."""

    def __init__(self, d, name, version_dir, threads=4, model_version=0):
        self.d = d
        self.name = name
        self.stop_ev = threading.Event()
        self.lock = threading.Lock()
        self.results = []
        self.threads = []
        for i in range(threads):
            req = make_request(version_dir, users=2, cands_per_user=4, seed=100 + i, model=name)
            req["modelVersion"] = model_version
            t = threading.Thread(target=self._run, args=(to_proto(req),), daemon=True)
            self.threads.append(t)
        for t in self.threads:
            t.start()

    def _run(self, req):
        ch = grpc.insecure_channel("127.0.0.1:%d" % self.d.grpc_port)
        stub = ch.unary_unary("/ikbo.v1.Ranker/Rank", request_serializer=pb.RankRequest.SerializeToString,
                              response_deserializer=pb.RankResponse.FromString)
        while not self.stop_ev.is_set():
            t0 = time.time()
            try:
                r = stub(req, timeout=10)
                rec = (t0, time.time(), r.model_version, None)
            except grpc.RpcError as e:
                rec = (t0, time.time(), None, "%s: %s" % (e.code().name, e.details()))
            with self.lock:
                self.results.append(rec)
        ch.close()

    def snapshot(self):
        with self.lock:
            return list(self.results)

    def count(self):
        with self.lock:
            return len(self.results)

    def stop(self):
        self.stop_ev.set()
        for t in self.threads:
            t.join(15)
        return self.snapshot()

    def errors(self):
        return [r for r in self.snapshot() if r[3]]
