#!/usr/bin/python3
"""Soak: the real daemon under mixed load, model churn and admin calls for a
while, judged on failed calls, counter agreement and resource growth.

Why it exists: unit and integration tests each exercise one feature for
seconds; leaks, fd or thread growth and rare races between the request path,
the repository poller, SIGHUP and the admin endpoints show only when all of
them run together for a long time. bench/soak.sh is the entry point; this
file does the work (Debian's /usr/bin/python3: grpcio, protobuf,
prometheus_client; plumbing from tests/integration/ikbo_itest.py).

What runs, for --minutes M (default 30), on the CPU, a scratch repository
with demo/1 and demo2/1 (copies of models/demo/1):
  clients (closed loop, bounded: the machine may have 2 cores)
    lg-single   build/ikbo-loadgen, 1 user x 10..500 candidates, 2 in flight
    lg-many     build/ikbo-loadgen, 16 users x 5..40 candidates, 30% repeated
                users, shuffled, 1 in flight
    lg-open     build/ikbo-loadgen, open loop 4 req/s Poisson, 4 users x
                10,70,300 candidates, top_k 50, at most 4 in flight
    grpcio      Python grpcio, 1 in flight, alternates demo and demo2
    http        Python urllib on POST /v1/models/{name}:rank, 1 in flight,
                alternates demo and demo2
    loadgen runs in segments (new process, new connections each time) so
    connection churn is part of the soak; the loadgens target demo only
    (loadgen needs a READY model at start).
  operator, one cycle per --period-s (60 s) at fixed offsets:
    0.10  a new demo version N+1 (every third one the unfriendly way:
          model.json first, the weights a settle time later in chunks,
          stalling once half-way);
          wait until it is READY (bounded); delete versions <= N+1-3
    0.35  SIGHUP
    0.50  admin unload of demo2; 0.70 admin load of demo2, wait READY
  sampler, every --sample-s (5 s): VmRSS, open fds, threads of the daemon,
  ikbo_requests_total by code.

Expected codes (anything else fails the soak):
  OK             everything on demo, always: a version switch under
                 latest:1 swaps READY versions with no gap and requests
                 ask for version 0 (the newest READY one).
  NOT_FOUND      demo2 only, for calls overlapping the window from the
                 unload request to the moment GET /v1/models/demo2 shows it
                 READY again: "model 'demo2' is unloaded" (README, admin).
  UNAVAILABLE    demo2 only, same window: after the load request the model
                 is no longer unloaded but has no READY version yet ("model
                 'demo2' is loading"), and a call that took the version just
                 before the unload may meet its stopping batcher.
  not expected   RESOURCE_EXHAUSTED: the clients can queue at most
                 `bound_candidates()` candidates and a handful of requests,
                 far below the admission limits (32768 candidates, 1024
                 requests; the script checks this at start), so admission
                 control cannot fire. DEADLINE_EXCEEDED: deadlines are 60 s,
                 a call that slow is a stall. CANCELLED, INTERNAL, ...: bugs.
Also judged: the server's ikbo_requests_total summed per code equals the
clients' counts per code (after all clients stopped); every pushed version
reaches READY; calls started after version N was seen READY answer with
version >= N; the daemon exits 0 on SIGTERM.

Resources (rule robust to noise and to the allocator keeping freed pages):
the run is split in thirds; the first third is warm-up. Pass when
  max RSS(last third)  <= 1.05 * max RSS(second third) + slack
  (slack 4 MiB; 16 MiB for runs under 10 minutes, whose last third holds
  a version switch or an admin load and no steady state: each new version
  brings new threads, and a thread's first batches can leave several MiB
  in a fresh glibc arena: bench/RESULTS.md "Soak (CPU)")
  max fds(last third)  <= max fds(second third) + 8
  max threads(last)    <= max threads(second third) + 6
(a version switch briefly adds 3 threads, a demo2 load another 3; a sampled
moment may catch them). The least-squares RSS slope over the second half is
reported, not judged.

Output: a table on stdout; under --out: samples.csv, summary.md,
summary.json, clients.json, serve.log (the daemon's log less its OK rank
lines). Exit 0 on pass, 1 naming each failed check, 2 on a
setup error.
"""
import argparse
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "integration"))
import grpc  # noqa: E402

import ikbo_itest  # noqa: E402
from ikbo_itest import Daemon, make_request, pb, to_proto  # noqa: E402

DEADLINE_S = 60
SETTLE_MS = 1000
WAIT_S = 90  # bound on each wait for a condition (a version READY, ...)
OUT_CODES = ("NOT_FOUND", "UNAVAILABLE")  # demo2, inside an unload window
LOADGENS = [  # name, flags; each also gets --target, --model demo, timing
    ("lg-single", ["--users", "1", "--candidates", "10..500", "--concurrency", "2"]),
    ("lg-many", ["--users", "16", "--candidates", "5..40", "--repeat-users", "0.3",
                 "--user-pool", "200", "--shuffle", "--concurrency", "1"]),
    ("lg-open", ["--users", "4", "--candidates", "10,70,300", "--top-k", "50", "--rate", "4",
                 "--poisson", "--max-inflight", "4"]),
]
PY_SHAPES = [(1, 30), (3, 12), (8, 6), (2, 40)]  # (users, candidates per user), py clients


def bound_candidates():
    """Most candidates the clients can have queued at once on demo: per
    loadgen users x the largest candidates per user x calls in flight, plus
    one call of each Python client."""
    def flag(flags, name):
        return flags[flags.index(name) + 1] if name in flags else None
    n = 0
    for _, f in LOADGENS:
        most = max(int(x) for x in flag(f, "--candidates").replace("..", ",").split(","))
        inflight = flag(f, "--concurrency") or flag(f, "--max-inflight")
        n += int(flag(f, "--users")) * most * int(inflight)
    return n + 2 * max(u * c for u, c in PY_SHAPES)


class Failures:
    """The failed checks, in order; echo prints each as it happens."""

    def __init__(self, echo=True):
        self.lock = threading.Lock()
        self.items = []
        self.echo = echo

    def add(self, msg):
        with self.lock:
            self.items.append(msg)
        if self.echo:
            print("FAIL %s" % msg, flush=True)


# ---------------------------------------------------------------- repository

def version_dir(repo, name, v):
    return os.path.join(repo, name, str(v))


def push_version(repo, name, v, src, unfriendly):
    """Copies src in as version v: atomically (dot-directory + rename), or
    unfriendly: model.json first, the weights more than a settle time later,
    in chunks with one stall longer than the settle time half-way (a slow
    copy the poller sees at rest twice: no weights, then truncated ones;
    both loads fail, the finished copy must load)."""
    dst = version_dir(repo, name, v)
    if not unfriendly:
        tmp = os.path.join(repo, name, ".%d.incoming" % v)
        shutil.copytree(src, tmp)
        os.rename(tmp, dst)
        return
    os.makedirs(dst)
    shutil.copy(os.path.join(src, "model.json"), dst)
    time.sleep(1.5 * SETTLE_MS / 1000)
    with open(os.path.join(src, "weights.safetensors"), "rb") as f:
        data = f.read()
    step = len(data) // 4 + 1
    with open(os.path.join(dst, "weights.safetensors"), "wb") as f:
        for k, i in enumerate(range(0, len(data), step)):
            f.write(data[i:i + step])
            f.flush()
            time.sleep(1.5 * SETTLE_MS / 1000 if k == 1 else 0.3)


def prune(repo, name, newest, keep=3):
    for d in os.listdir(os.path.join(repo, name)):
        if d.isdigit() and int(d) <= newest - keep:
            shutil.rmtree(os.path.join(repo, name, d), ignore_errors=True)


# ---------------------------------------------------------------- daemon access

def admin(d, name, action):
    """The one admin call: POST /v1/models/{name}/{load|unload}. Returns the
    HTTP status. Headers for the admin endpoints' cross-origin hardening."""
    code, body = d.http("POST", "/v1/models/%s/%s" % (name, action), body=b"{}",
                        headers={"Content-Type": "application/json", "X-Ikbo-Admin": "1"})
    return code, body


def state_of(d, name, v):
    code, body = d.http("GET", "/v1/models/%s" % name)
    if code != 200:
        return None
    doc = json.loads(body)
    ms = doc.get("models", [doc])
    for m in ms:
        for ver in m.get("versions", []):
            if ver.get("version") == v:
                return ver.get("state")
    return None


def wait_state(d, name, v, want, fails, what):
    t_end = time.time() + WAIT_S
    while time.time() < t_end:
        if state_of(d, name, v) == want:
            return time.time()
        time.sleep(0.1)
    fails.add("%s: %s version %d not %s within %ds (now %s)" % (what, name, v, want, WAIT_S,
                                                                state_of(d, name, v)))
    return None


def proc_stats(pid):
    st = {"rss_kib": 0, "threads": 0, "fds": 0}
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    st["rss_kib"] = int(line.split()[1])
                elif line.startswith("Threads:"):
                    st["threads"] = int(line.split()[1])
        st["fds"] = len(os.listdir("/proc/%d/fd" % pid))
    except OSError:
        pass
    return st


def server_codes(d):
    """ikbo_requests_total summed over models, by code."""
    out = {}
    for (name, labels), val in d.metrics().items():
        if name == "ikbo_requests_total":
            code = dict(labels).get("code", "?")
            out[code] = out.get(code, 0) + int(val)
    return out


# ---------------------------------------------------------------- clients

class Record:
    """Calls of one client: counts by code and model, and the calls that
    need a closer look (errors; versions) with their times."""

    def __init__(self, name):
        self.name = name
        self.lock = threading.Lock()
        self.codes = {}          # code -> n
        self.by_model = {}       # (model, code) -> n
        self.calls = []          # (t0, t1, model, code, version) of the Python clients
        self.notes = []

    def add(self, t0, t1, model, code, version=None):
        with self.lock:
            self.codes[code] = self.codes.get(code, 0) + 1
            k = "%s %s" % (model, code)
            self.by_model[k] = self.by_model.get(k, 0) + 1
            self.calls.append((t0, t1, model, code, version))

    def add_counts(self, model, codes):
        with self.lock:
            for code, n in codes.items():
                self.codes[code] = self.codes.get(code, 0) + n
                k = "%s %s" % (model, code)
                self.by_model[k] = self.by_model.get(k, 0) + n

    def total(self):
        with self.lock:
            return sum(self.codes.values())


def loadgen_loop(d, name, flags, segment_s, t_end, stop, rec, fails):
    """build/ikbo-loadgen in segments (to t_end, then 2 s ones) until stop
    is set; codes summed."""
    seed = 1
    lg = os.path.join(ikbo_itest.BUILD, "ikbo-loadgen")
    while not stop.is_set():
        dur = round(min(segment_s, max(2.0, t_end - time.time())), 1)
        cmd = [lg, "--target", "127.0.0.1:%d" % d.grpc_port, "--model", "demo", "--warmup", "0",
               "--duration", str(dur), "--timeout-ms", str(DEADLINE_S * 1000),
               "--connect-timeout-ms", str(WAIT_S * 1000), "--seed", str(seed), "--json"] + flags
        seed += 1
        p = subprocess.run(cmd, capture_output=True, text=True,
                           timeout=dur + 2 * DEADLINE_S + WAIT_S)
        try:
            out = json.loads(p.stdout)
        except ValueError:
            fails.add("%s: loadgen exit %d, no JSON: %s" % (name, p.returncode, p.stderr.strip()[-300:]))
            stop.wait(1)
            continue
        rec.add_counts("demo", out["codes"])
        if out.get("invalid_responses") or out.get("unsent"):
            fails.add("%s: %s invalid answers, %s unsent" % (name, out.get("invalid_responses"),
                                                             out.get("unsent")))
        if out.get("first_error"):
            rec.notes.append(out["first_error"])


def py_requests(model, seed):
    src = os.path.join(ikbo_itest.ROOT, "models", "demo", "1")
    reqs = []
    for i, (u, c) in enumerate(PY_SHAPES):
        r = make_request(src, users=u, cands_per_user=c, seed=seed + i, model=model,
                         history_len=8 + 8 * i)
        reqs.append(r)
    return reqs


def grpc_loop(d, stop, rec):
    ch = grpc.insecure_channel("127.0.0.1:%d" % d.grpc_port)
    stub = ch.unary_unary("/ikbo.v1.Ranker/Rank", request_serializer=pb.RankRequest.SerializeToString,
                          response_deserializer=pb.RankResponse.FromString)
    reqs = [(m, to_proto(r)) for m in ("demo", "demo2") for r in py_requests(m, 500)]
    i = 0
    while not stop.is_set():
        model, req = reqs[i % len(reqs)]
        i += 1
        t0 = time.time()
        try:
            r = stub(req, timeout=DEADLINE_S)
            rec.add(t0, time.time(), model, "OK", r.model_version)
        except grpc.RpcError as e:
            rec.add(t0, time.time(), model, e.code().name)
            rec.notes.append("%s %s: %s" % (model, e.code().name, e.details()))
    ch.close()


def http_loop(d, stop, rec):
    reqs = [(m, json.dumps(r).encode()) for m in ("demo", "demo2") for r in py_requests(m, 700)]
    i = 0
    while not stop.is_set():
        model, body = reqs[i % len(reqs)]
        i += 1
        t0 = time.time()
        url = "http://127.0.0.1:%d/v1/models/%s:rank" % (d.http_port, model)
        q = urllib.request.Request(url, data=body, method="POST",
                                   headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(q, timeout=DEADLINE_S) as resp:
                doc = json.loads(resp.read())
            rec.add(t0, time.time(), model, "OK", int(doc.get("modelVersion", 0)))
        except urllib.error.HTTPError as e:
            try:
                err = json.loads(e.read())["error"]
                code, msg = err["code"], err["message"]
            except (ValueError, KeyError, TypeError):
                code, msg = "HTTP_%d" % e.code, ""
            rec.add(t0, time.time(), model, code)
            rec.notes.append("%s %s: %s" % (model, code, msg))
        except (urllib.error.URLError, OSError) as e:
            rec.add(t0, time.time(), model, "TRANSPORT")
            rec.notes.append("%s transport: %s" % (model, e))


# ---------------------------------------------------------------- operator

class Operator:
    """Version pushes, SIGHUP, demo2 unload/load, one cycle per period;
    records what it did and when (windows, READY times)."""

    def __init__(self, d, repo, period_s, fails, log):
        self.d, self.repo, self.period, self.fails, self.log = d, repo, period_s, fails, log
        self.src = os.path.join(ikbo_itest.ROOT, "models", "demo", "1")
        self.version = 1
        self.ready_at = {1: 0.0}   # demo version -> time it was seen READY
        self.windows = []          # [t_unload_sent, t_ready_again or None] for demo2
        self.counts = {"versions": 0, "unfriendly": 0, "sighup": 0, "unload": 0, "load": 0}

    def cycle(self, t_start):
        def at(frac):
            delay = t_start + frac * self.period - time.time()
            if delay > 0:
                time.sleep(delay)
        at(0.10)
        v = self.version + 1
        unfriendly = v % 3 == 2
        push_version(self.repo, "demo", v, self.src, unfriendly)
        self.counts["versions"] += 1
        self.counts["unfriendly"] += unfriendly
        t = wait_state(self.d, "demo", v, "READY", self.fails, "push")
        self.log("demo version %d pushed (%s)%s" % (v, "unfriendly" if unfriendly else "atomic",
                                                    ", READY" if t else ""))
        if t:
            self.ready_at[v] = t
        self.version = v
        prune(self.repo, "demo", v)
        at(0.35)
        os.kill(self.d.proc.pid, signal.SIGHUP)
        self.counts["sighup"] += 1
        at(0.50)
        self.windows.append([time.time(), None])
        code, body = admin(self.d, "demo2", "unload")
        self.counts["unload"] += 1
        if code != 200:
            self.fails.add("admin unload demo2: HTTP %d %s" % (code, body[:200]))
        at(0.70)
        code, body = admin(self.d, "demo2", "load")
        self.counts["load"] += 1
        if code != 202:
            self.fails.add("admin load demo2: HTTP %d %s" % (code, body[:200]))
        t = wait_state(self.d, "demo2", 1, "READY", self.fails, "admin load")
        self.windows[-1][1] = t
        self.log("demo2 unloaded and loaded again%s" % (", READY" if t else ""))

    def run(self, t0, t_end, stop):
        """Cycle k starts at t0 + k * period (later if the previous one
        overran), for every k with a start before t_end; then waits for t_end."""
        k = 0
        while t0 + k * self.period < t_end and not stop.is_set():
            self.cycle(max(time.time(), t0 + k * self.period))
            k += 1
            stop.wait(max(0.0, min(t_end, t0 + k * self.period) - time.time()))


# ---------------------------------------------------------------- sampler

CSV_COLUMNS = ["t_s", "rss_kib", "fds", "threads", "server_calls", "server_codes"]


def sample_loop(d, t0, every_s, stop, samples, csv_path):
    """Samples until stop is set; each row also goes to csv_path as it is
    taken (a long soak shows its progress, and what it had if it dies)."""
    f = open(csv_path, "w", newline="")
    w = csv.writer(f)
    w.writerow(CSV_COLUMNS)
    while True:
        st = proc_stats(d.proc.pid)
        try:
            codes = server_codes(d)
        except Exception as e:  # a scrape that failed is shown, not fatal here
            codes = {"scrape_error": 1}
            print("sampler: %s" % e, flush=True)
        st["t"] = round(time.time() - t0, 1)
        st["server_calls"] = sum(codes.values())
        st["server_codes"] = codes
        samples.append(st)
        w.writerow([st["t"], st["rss_kib"], st["fds"], st["threads"], st["server_calls"],
                    json.dumps(codes, sort_keys=True)])
        f.flush()
        if stop.wait(every_s):
            f.close()
            return


# ---------------------------------------------------------------- judging

def in_window(t0, t1, windows):
    return any(t1 >= w0 and (w1 is None or t0 <= w1) for w0, w1 in windows)


def judge_calls(recs, op, fails):
    """Every call's code against the expected ones (top comment); versions
    never older than one already seen READY."""
    for rec in recs:
        bad = {}
        for (t0, t1, model, code, version) in rec.calls:
            if code == "OK":
                newest = max(v for v, t in op.ready_at.items() if t <= t0)
                if model == "demo" and version < newest:
                    k = "demo OK from version %s after %d was READY" % (version, newest)
                    bad[k] = bad.get(k, 0) + 1
                continue
            if model == "demo2" and code in OUT_CODES and in_window(t0, t1, op.windows):
                continue
            k = "%s %s" % (model, code)
            bad[k] = bad.get(k, 0) + 1
        if not rec.calls:  # a loadgen: counts only
            bad = {k: n for k, n in rec.by_model.items() if not k.endswith(" OK")}
        for k, n in sorted(bad.items()):
            fails.add("%s: %d unexpected: %s (first notes: %s)" % (rec.name, n, k, rec.notes[:2]))
        if not rec.total():
            fails.add("%s: made no calls" % rec.name)


def judge_counts(server, recs, fails):
    clients = {}
    for rec in recs:
        for code, n in rec.codes.items():
            clients[code] = clients.get(code, 0) + n
    for code in sorted(set(server) | set(clients)):
        if server.get(code, 0) != clients.get(code, 0):
            fails.add("ikbo_requests_total{code=%s} = %d, the clients counted %d" %
                      (code, server.get(code, 0), clients.get(code, 0)))
    return clients


def rss_slope_mib_per_h(samples):
    half = samples[len(samples) // 2:]
    if len(half) < 2:
        return 0.0
    xs = [s["t"] / 3600 for s in half]
    ys = [s["rss_kib"] / 1024 for s in half]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else 0.0


def rss_slack_kib(minutes):
    return 4096 if minutes >= 10 else 16384


def judge_resources(samples, slack_kib, fails):
    """The thirds rule of the top comment. Returns a one-line verdict."""
    T = samples[-1]["t"] if samples else 0
    mid = [s for s in samples if T / 3 <= s["t"] < 2 * T / 3]
    last = [s for s in samples if s["t"] >= 2 * T / 3]
    if len(mid) < 2 or len(last) < 2:
        fails.add("resources: too few samples (%d, %d) in the second and last thirds" %
                  (len(mid), len(last)))
        return "no verdict"
    rules = [("rss_kib", lambda m: 1.05 * m + slack_kib, "RSS KiB"), ("fds", lambda m: m + 8, "fds"),
             ("threads", lambda m: m + 6, "threads")]
    parts = []
    for key, limit, what in rules:
        m2, m3 = max(s[key] for s in mid), max(s[key] for s in last)
        parts.append("%s max %d -> %d (limit %d)" % (what, m2, m3, limit(m2)))
        if m3 > limit(m2):
            fails.add("%s grew: max of the last third %d > limit %d (second third max %d)" %
                      (what, m3, limit(m2), m2))
    return "; ".join(parts)


# ---------------------------------------------------------------- report

def keep_log(src, dst):
    """The daemon's log without the OK rank lines (about 1 MB a minute)."""
    with open(src, errors="replace") as f, open(dst, "w") as o:
        for line in f:
            if not (" info rank " in line and " code=OK " in line):
                o.write(line)


def table_rows(samples, max_rows=32):
    step = max(1, (len(samples) + max_rows - 1) // max_rows)
    picked = samples[::step]
    if samples and picked[-1] is not samples[-1]:
        picked.append(samples[-1])
    return [(s["t"], "%.1f" % (s["rss_kib"] / 1024), s["fds"], s["threads"], s["server_calls"],
             s["server_calls"] - s["server_codes"].get("OK", 0)) for s in picked]


def write_report(out, args, samples, recs, server, op, verdict, slope, fails, rc):
    with open(os.path.join(out, "clients.json"), "w") as f:
        json.dump({r.name: {"codes": r.codes, "by_model": r.by_model, "notes": r.notes[:20]}
                   for r in recs}, f, indent=1, sort_keys=True)
    L = ["| t (s) | RSS (MiB) | fds | threads | calls (server) | not OK (so far) |", "|---|---|---|---|---|---|"]
    L += ["| %s | %s | %s | %s | %s | %s |" % r for r in table_rows(samples)]
    L += ["", "| client | calls by model and code |", "|---|---|"]
    L += ["| %s | %s |" % (r.name, ", ".join("%s %d" % kv for kv in sorted(r.by_model.items())))
          for r in recs]
    L += ["", "server ikbo_requests_total by code: %s" % json.dumps(server, sort_keys=True),
          "operator: %s" % json.dumps(op.counts, sort_keys=True),
          "resources (second third -> last third): %s" % verdict,
          "RSS slope over the second half: %.2f MiB/h (reported, not judged)" % slope,
          "daemon exit status on SIGTERM: %s" % rc,
          "verdict: %s" % ("PASS" if not fails.items else "FAIL: " + "; ".join(fails.items))]
    text = "\n".join(L) + "\n"
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump({"minutes": args.minutes, "operator": op.counts, "server_codes": server,
                   "clients": {r.name: r.codes for r in recs}, "resources": verdict,
                   "rss_slope_mib_per_h": slope, "exit_status": rc, "failures": fails.items,
                   "samples": len(samples)}, f, indent=1, sort_keys=True)
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(text)
    print(text, flush=True)


# ---------------------------------------------------------------- main

def parse_args(argv):
    ap = argparse.ArgumentParser(description="Soak the daemon (see the top comment of %s)." % __file__)
    ap.add_argument("--minutes", type=float, default=30, help="how long the load runs (default 30)")
    ap.add_argument("--out", default=None, help="output folder (default: a new /tmp/ikbo-soak-*)")
    ap.add_argument("--period-s", type=float, default=60, help="operator cycle (default 60)")
    ap.add_argument("--sample-s", type=float, default=None,
                    help="sampling interval (default 5, 2 for runs under 5 minutes)")
    a = ap.parse_args(argv)
    if not a.minutes > 0 or not a.period_s >= 10:
        ap.error("--minutes must be > 0 and --period-s >= 10")
    if a.sample_s is None:
        a.sample_s = 2.0 if a.minutes < 5 else 5.0
    return a


def make_repo():
    repo = tempfile.mkdtemp(prefix="ikbo-soak-repo-")
    src = os.path.join(ikbo_itest.ROOT, "models", "demo", "1")
    for name in ("demo", "demo2"):
        os.makedirs(os.path.join(repo, name))
        shutil.copytree(src, version_dir(repo, name, 1))
    return repo


def guarded(fn, name, fails, *args):
    """A client thread's body: an exception is a failure, never a client
    that silently stopped."""
    try:
        fn(*args)
    except Exception as e:
        fails.add("client %s stopped on %s: %s" % (name, type(e).__name__, e))


def start_clients(d, t_end, segment_s, stop, fails):
    recs, threads = [], []
    for name, flags in LOADGENS:
        rec = Record(name)
        threads.append(threading.Thread(target=guarded, args=(loadgen_loop, name, fails, d, name, flags,
                                                              segment_s, t_end, stop, rec, fails)))
        recs.append(rec)
    for name, fn in (("grpcio", grpc_loop), ("http", http_loop)):
        rec = Record(name)
        threads.append(threading.Thread(target=guarded, args=(fn, name, fails, d, stop, rec)))
        recs.append(rec)
    for t in threads:
        t.daemon = True
        t.start()
    return recs, threads


def soak(a, out, fails):
    repo = make_repo()
    d = Daemon(repo, repository_poll_ms=500, repository_settle_ms=SETTLE_MS, drain_timeout_ms=10000,
               log={"level": "info", "format": "plain"})
    t0 = time.time()

    def log(msg):
        print("%7.1fs %s" % (time.time() - t0, msg), flush=True)
    try:
        t_end = t0 + 60 * a.minutes
        stop = threading.Event()
        recs, threads = start_clients(d, t_end, min(60.0, max(10.0, 15 * a.minutes)), stop, fails)
        samples = []
        sampler = threading.Thread(target=sample_loop,
                                   args=(d, t0, a.sample_s, stop, samples,
                                         os.path.join(out, "samples.csv")), daemon=True)
        sampler.start()
        op = Operator(d, repo, a.period_s, fails, log)
        op.run(t0, t_end, stop)
        log("load phase over; stopping the clients")
        stop.set()
        for t in threads:
            t.join(2 * DEADLINE_S + WAIT_S)
            if t.is_alive():
                fails.add("a client did not stop within %ds" % (2 * DEADLINE_S + WAIT_S))
        sampler.join(WAIT_S)
        server = server_codes(d)
        judge_calls(recs, op, fails)
        judge_counts(server, recs, fails)
        verdict = judge_resources(samples, rss_slack_kib(a.minutes), fails)
        rc = d.stop(timeout=30)
        if rc != 0:
            fails.add("daemon exit status %s on SIGTERM" % rc)
        keep_log(d.log_path, os.path.join(out, "serve.log"))
        write_report(out, a, samples, recs, server, op, verdict, rss_slope_mib_per_h(samples),
                     fails, rc)
    finally:
        d.close()
        shutil.rmtree(repo, ignore_errors=True)


def main(argv):
    a = parse_args(argv)
    if bound_candidates() >= 32768:
        print("setup: the clients could queue %d candidates, over the admission limit" %
              bound_candidates(), file=sys.stderr)
        return 2
    out = a.out or tempfile.mkdtemp(prefix="ikbo-soak-")
    os.makedirs(out, exist_ok=True)
    fails = Failures()
    print("soak: %.1f min, output in %s" % (a.minutes, out), flush=True)
    try:
        soak(a, out, fails)
    except AssertionError as e:  # Daemon: did not start or get ready
        print("setup: %s" % e, file=sys.stderr)
        return 2
    if fails.items:
        print("soak FAILED (%d): %s" % (len(fails.items), "; ".join(fails.items[:10])), flush=True)
        return 1
    print("soak PASSED", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
