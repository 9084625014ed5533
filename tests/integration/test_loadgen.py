#!/usr/bin/python3
"""Integration test of ikbo-loadgen and the ghz payloads against a real
ikbo-serve on the CPU (free ports, temporary model repository).

    IKBO_BUILD=build IKBO_ROOT=. /usr/bin/python3 tests/integration/test_loadgen.py

Checks, in order (each prints one line; any failure exits 1, nothing is
skipped):
  1. `ikbo-loadgen --self-test` (histogram precision, distributions, JSON
     spec, request bodies, classic and packed encodings compared) and
     --help listing every flag;
  2. a 2.5 s closed-loop run whose candidates straddle the daemon's
     limits.max_candidates, so answers are a mix of OK and
     RESOURCE_EXHAUSTED: loadgen's --json counts by status must equal the
     server's ikbo_requests_total{model,code} (and the gRPC method counter);
  3. a 1 s open-loop run: every scheduled request sent, counted and OK;
  4. clean errors: unknown model, nothing listening;
  5. every ghz config in deploy/ghz: ghz's config keys only, files exist;
     the classic data files, parsed as proto3 JSON into RankRequest, score
     OK through the grpcio client (ghz itself is not installed here); a
     packed one (NAME-packed.json) carries the same logical request as its
     classic twin NAME.json (packed_common.logical) and gets a byte-identical
     answer.

Models: models/demo/1 when it exists, else a random model with the demo's
architecture (MODEL_FORMAT.md's example; said so on stdout); for the bench
payload, a tiny model with exactly the seed-scale bench model's inputs.
"""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.abspath(os.environ.get("IKBO_ROOT") or os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.path.abspath(os.environ.get("IKBO_BUILD") or os.path.join(ROOT, "build"))
SERVE = os.path.join(BUILD, "ikbo-serve")
LOADGEN = os.path.join(BUILD, "ikbo-loadgen")
GEN_PY = os.path.join(BUILD, "gen", "py")
MAX_CANDIDATES = 300

# The keys ghz's config struct reads (runner/config.go's JSON tags, listed
# with their source revision in ghz_config_go.txt); ghz ignores any other key
# silently, so a misspelled one (the shipped configs once said "skip-first",
# and ghz counted the warm-up calls) only shows up here.
GHZ_KEYS = {line.strip() for line in open(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                        "ghz_config_go.txt"))
            if line.strip() and not line.startswith("#")}

T0 = time.time()


def ok(msg):
    print("ok   %5.1fs  %s" % (time.time() - T0, msg), flush=True)


def fail(msg):
    print("FAIL %5.1fs  %s" % (time.time() - T0, msg), flush=True)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def run(args, timeout=30):
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout)


def write_bench_inputs_model(out):
    """A model with exactly the seed-scale bench model's inputs, tiny inside
    (payload checks only), at out (a version directory). Also used by
    e2e_packed.py."""
    sys.path.insert(0, os.path.join(ROOT, "tools", "reference"))
    sys.path.insert(0, os.path.join(ROOT, "models", "bench"))
    import make_bench_model
    make_bench_model.main(["--out", out, "--dtype", "F32",
                           "--dim", "16", "--ku", "24", "--kc", "40", "--out-tokens", "4",
                           "--head-dim", "8", "--tq", "8", "--hidden", "8", "--top-width", "8",
                           "--item-rows", "100", "--author-rows", "100", "--user-rows", "10"])


def make_models(repo):
    demo = os.path.join(ROOT, "models", "demo", "1")  # committed with the repository
    os.makedirs(os.path.join(repo, "demo"))
    os.symlink(demo, os.path.join(repo, "demo", "1"))
    ok("demo model: models/demo/1")
    write_bench_inputs_model(os.path.join(repo, "bench", "1"))
    ok("bench-inputs model written")


def metrics(http):
    with urllib.request.urlopen("http://%s/metrics" % http, timeout=5) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r'^(\w+)\{(.*)\} (\S+)$', line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2)))
        out.setdefault(m.group(1), []).append((labels, float(m.group(3))))
    return out


def series(mx, name, **want):
    """{label value of the one free label: value} for series matching want."""
    res = {}
    for labels, v in mx.get(name, []):
        if all(labels.get(k) == x for k, x in want.items()):
            free = [k for k in labels if k not in want]
            res[labels[free[0]] if free else ""] = v
    return res


def start_daemon(work, repo):
    cfg = os.path.join(work, "server.json")
    with open(cfg, "w") as f:
        json.dump({"limits": {"max_candidates": MAX_CANDIDATES}, "threads": 2}, f)
    log = open(os.path.join(work, "serve.log"), "w+")
    p = subprocess.Popen([SERVE, "--config", cfg, "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0",
                          "--models", repo], stdout=log, stderr=subprocess.STDOUT)
    grpc_addr = http_addr = None
    deadline = time.time() + 15
    while time.time() < deadline:
        if p.poll() is not None:
            log.seek(0)
            fail("ikbo-serve exited with %s:\n%s" % (p.returncode, log.read()))
        log.seek(0)
        text = log.read()
        m = re.search(r"listening grpc=(\S+) http=(\S+)", text)
        if m:
            grpc_addr, http_addr = m.group(1), m.group(2)
            try:
                with urllib.request.urlopen("http://%s/readyz" % http_addr, timeout=2) as r:
                    if r.status == 200:
                        return p, grpc_addr, http_addr
            except OSError:
                pass
        time.sleep(0.05)
    log.seek(0)
    p.kill()
    fail("ikbo-serve not ready after 15 s:\n%s" % log.read())


def loadgen_json(args, expect_rc):
    r = run([LOADGEN, "--json"] + args)
    check(r.returncode == expect_rc, "loadgen %s: exit %d, expected %d\nstderr: %s\nstdout: %s"
          % (" ".join(args), r.returncode, expect_rc, r.stderr, r.stdout[:2000]))
    try:
        return json.loads(r.stdout)
    except ValueError:
        fail("loadgen --json output does not parse:\n%s" % r.stdout[:2000])


def test_closed_loop_counts(grpc_addr, http_addr):
    before = metrics(http_addr)
    b_req = series(before, "ikbo_requests_total", model="demo")
    j = loadgen_json(["--target", grpc_addr, "--model", "demo", "--users", "1",
                      "--candidates", "%d..%d" % (MAX_CANDIDATES - 60, MAX_CANDIDATES + 60),
                      "--concurrency", "4", "--threads", "2", "--warmup", "0.5", "--duration", "2",
                      "--distinct", "16"], expect_rc=1)
    codes = j["codes"]
    check(codes.get("OK", 0) > 0 and codes.get("RESOURCE_EXHAUSTED", 0) > 0,
          "expected a mix of OK and RESOURCE_EXHAUSTED, got %s" % codes)
    check(sum(codes.values()) == j["sent"], "sent %d != sum of codes %s" % (j["sent"], codes))
    check("max_candidates" in (j["first_error"] or "") or "candidates" in (j["first_error"] or ""),
          "first_error should name the limit: %r" % j["first_error"])
    m = j["measured"]
    check(m["requests"] > 0 and sum(m["codes"].values()) == m["requests"], "measured counts %s" % m)
    check(m["latency_ms"]["count"] == m["codes"].get("OK", 0) and
          0 < m["latency_ms"]["p50"] <= m["latency_ms"]["p99"] <= m["latency_ms"]["max"],
          "latency summary %s" % m["latency_ms"])
    check(j["invalid_responses"] == 0, "invalid responses: %d" % j["invalid_responses"])
    after = metrics(http_addr)
    a_req = series(after, "ikbo_requests_total", model="demo")
    server = {c: int(a_req.get(c, 0) - b_req.get(c, 0)) for c in set(a_req) | set(b_req)}
    server = {c: n for c, n in server.items() if n}
    check(server == codes, "server ikbo_requests_total{model=demo} by code %s != loadgen codes %s"
          % (server, codes))
    g = series(after, "ikbo_grpc_requests_total", method="/ikbo.v1.Ranker/Rank")
    gb = series(before, "ikbo_grpc_requests_total", method="/ikbo.v1.Ranker/Rank")
    gd = {c: int(g.get(c, 0) - gb.get(c, 0)) for c in g if g.get(c, 0) - gb.get(c, 0)}
    check(gd == codes, "server ikbo_grpc_requests_total{Rank} %s != loadgen codes %s" % (gd, codes))
    ok("closed loop: sent %d, codes %s == server /metrics; %.0f req/s, p50 %.2f ms, p99 %.2f ms"
       % (j["sent"], codes, m["requests_per_s"], m["latency_ms"]["p50"], m["latency_ms"]["p99"]))


def test_open_loop(grpc_addr, http_addr):
    before = series(metrics(http_addr), "ikbo_requests_total", model="demo")
    j = loadgen_json(["--target", grpc_addr, "--model", "demo", "--users", "2", "--candidates", "10,30",
                      "--repeat-users", "0.5", "--user-pool", "4", "--rate", "80", "--poisson",
                      "--warmup", "0.25", "--duration", "1"], expect_rc=0)
    check(j["loop"] == "open" and j["sent"] == j["scheduled"] and j["unsent"] == 0,
          "open loop sent %s of %s scheduled, unsent %s" % (j["sent"], j["scheduled"], j["unsent"]))
    check(j["codes"] == {"OK": j["sent"]}, "open loop codes %s" % j["codes"])
    check(j["measured"]["send_lag_ms"]["count"] > 0, "open loop reports the send lag")
    after = series(metrics(http_addr), "ikbo_requests_total", model="demo")
    check(int(after.get("OK", 0) - before.get("OK", 0)) == j["sent"], "server OK delta != sent")
    ok("open loop: %d scheduled = sent = server OK; p50 %.2f ms p99 %.2f ms, send lag p99 %.2f ms"
       % (j["sent"], j["measured"]["latency_ms"]["p50"], j["measured"]["latency_ms"]["p99"],
          j["measured"]["send_lag_ms"]["p99"]))


def test_errors(grpc_addr):
    r = run([LOADGEN, "--target", grpc_addr, "--model", "no-such-model", "--duration", "1"])
    check(r.returncode == 2 and "not found" in r.stderr and "no-such-model" in r.stderr,
          "unknown model: exit %d, stderr %r" % (r.returncode, r.stderr))
    port = free_port()
    r = run([LOADGEN, "--target", "127.0.0.1:%d" % port, "--connect-timeout-ms", "300", "--duration", "1"])
    check(r.returncode == 2 and "cannot connect" in r.stderr,
          "nothing listening: exit %d, stderr %r" % (r.returncode, r.stderr))
    r = run([LOADGEN, "--concurrency", "zero"])
    check(r.returncode == 2 and "--concurrency" in r.stderr, "bad flag value: %r" % r.stderr)
    r = run([LOADGEN, "--bogus"])
    check(r.returncode == 2 and "unknown flag" in r.stderr, "unknown flag: %r" % r.stderr)
    ok("clean errors: unknown model, nothing listening, bad flag value, unknown flag (exit 2)")


def ghz_config(name, proto):
    """deploy/ghz/NAME.json checked against ghz's keys and the repository;
    returns (config, its data file path)."""
    cfg_path = os.path.join(ROOT, "deploy", "ghz", name + ".json")
    cfg = json.load(open(cfg_path))
    unknown = set(cfg) - GHZ_KEYS
    check(not unknown, "%s: keys ghz's config struct does not have (ignored by ghz): %s"
          % (cfg_path, sorted(unknown)))
    check(cfg.get("skipFirst", 0) > 0, "%s: no skipFirst: ghz would count the warm-up calls" % cfg_path)
    check(cfg.get("insecure") is True and cfg.get("host"), "%s: insecure/host" % cfg_path)
    check(os.path.exists(os.path.join(ROOT, cfg["proto"])), "%s: proto %s missing" % (cfg_path, cfg["proto"]))
    pkg, svc, meth = cfg["call"].rsplit(".", 2)
    check(pkg == "ikbo.v1" and re.search(r"service %s\s*\{[^}]*rpc %s\(" % (svc, meth), proto),
          "%s: call %s not in ranker.proto" % (cfg_path, cfg["call"]))
    return cfg, os.path.join(ROOT, cfg["data-file"])


def test_ghz_payloads(grpc_addr):
    sys.path.insert(0, GEN_PY)
    import grpc
    from google.protobuf import json_format
    from ikbo.v1 import ranker_pb2
    from packed_common import first_difference, is_packed, logical
    proto = open(os.path.join(ROOT, "proto", "ikbo", "v1", "ranker.proto")).read()
    ch = grpc.insecure_channel(grpc_addr, options=[("grpc.max_receive_message_length", -1)])
    rank = ch.unary_unary("/ikbo.v1.Ranker/Rank", request_serializer=ranker_pb2.RankRequest.SerializeToString,
                          response_deserializer=ranker_pb2.RankResponse.FromString)
    names = sorted((f[:-5] for f in os.listdir(os.path.join(ROOT, "deploy", "ghz")) if f.endswith(".json")),
                   key=lambda n: (n.endswith("-packed"), n))  # classic twins first
    check({"demo", "bench", "bench-packed"} <= set(names), "ghz configs: %s" % names)
    classic, answers = {}, {}
    for name in names:
        cfg, data_path = ghz_config(name, proto)
        req = json_format.Parse(open(data_path).read(), ranker_pb2.RankRequest())  # strict: unknown fields fail
        model = name[:-len("-packed")] if name.endswith("-packed") else name
        check(req.model == model, "%s: model %r" % (data_path, req.model))
        check(is_packed(req) == (model != name), "%s: packed iff the config is NAME-packed" % data_path)
        try:
            resp = rank(req, timeout=30)
        except grpc.RpcError as e:
            fail("%s: Rank failed: %s: %s" % (data_path, e.code(), e.details()))
        if model == name:
            classic[name], answers[name] = req, resp.SerializeToString(deterministic=True)
            check(len(resp.scores) == len(req.candidates) and resp.unique_users == len(req.users),
                  "%s: %d scores for %d candidates, %d unique users" % (data_path, len(resp.scores),
                                                                        len(req.candidates), resp.unique_users))
            ok("ghz %s: config keys documented, %s (%d users, %d candidates) -> OK, %d scores"
               % (name, cfg["data-file"], len(req.users), len(req.candidates), len(resp.scores)))
            continue
        check(model in classic, "%s: no classic twin %s.json" % (name, model))
        d = first_difference(logical(classic[model]), logical(req))
        check(d is None, "%s is not the request of %s.json: %s" % (data_path, model, d))
        check(resp.SerializeToString(deterministic=True) == answers[model],
              "%s: the answer differs from %s.json's" % (data_path, model))
        ok("ghz %s: config keys documented, %s = %s.json's request, packed (%d users, %d candidates) -> "
           "the same answer" % (name, cfg["data-file"], model, req.packed_users.count, req.packed_candidates.count))
    ch.close()


def main():
    for path in (SERVE, LOADGEN, os.path.join(GEN_PY, "ikbo", "v1", "ranker_pb2.py")):
        check(os.path.exists(path), "%s is missing (run make)" % path)
    r = run([LOADGEN, "--self-test"])
    check(r.returncode == 0, "self-test:\n%s%s" % (r.stdout, r.stderr))
    ok(r.stdout.strip())
    r = run([LOADGEN, "--help"])
    src = open(os.path.join(ROOT, "tools", "loadgen", "main.c")).read()
    flags = set(re.findall(r'"(--[a-z][a-z-]*)"', src))
    missing = [f for f in sorted(flags) if f not in r.stdout]
    check(r.returncode == 0 and len(flags) > 25 and not missing, "--help misses %s" % missing)
    ok("--help lists all %d flags" % len(flags))
    work = tempfile.mkdtemp(prefix="ikbo-loadgen-test-")
    proc = None
    try:
        repo = os.path.join(work, "repo")
        make_models(repo)
        proc, grpc_addr, http_addr = start_daemon(work, repo)
        ok("ikbo-serve ready: grpc %s http %s" % (grpc_addr, http_addr))
        test_closed_loop_counts(grpc_addr, http_addr)
        test_open_loop(grpc_addr, http_addr)
        test_errors(grpc_addr)
        test_ghz_payloads(grpc_addr)
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(work, ignore_errors=True)
    print("test_loadgen: all passed in %.1f s" % (time.time() - T0))


if __name__ == "__main__":
    main()
