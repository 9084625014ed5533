#!/usr/bin/python3
"""Test of bench/e2e/report.py's arithmetic on a results directory made by
hand (no daemon, no build outputs; well under a second).

    IKBO_ROOT=. /usr/bin/python3 tests/integration/test_e2e_report.py

Why: the e2e tables are where the server's overhead is read off, and a
wrong delta or division there would go unnoticed on real runs (nothing to
compare with). So one point (ikbo, 2 users x 5 candidates) whose files have
the names and formats bench/e2e/run.sh writes, with round numbers that can
be checked by hand:

  open loop, /metrics deltas for model "demo" (after - before): 1000
  requests, 100 of them rejected, so the batcher's histograms count 900
    ikbo_request_duration_seconds  sum 0.4 s   count 1000  -> server 0.400 ms
    ikbo_request_compute_seconds   sum 0.3 s   count 900   -> forward 0.300 ms
        (over the server's 1000 requests, not its own 900: 0.333 would be wrong)
        buckets: 750 in (0.25, 0.5] ms, 141 in (0.5, 1] ms, 9 in (1, 2.5] ms
        -> p50 0.25 + 0.25 * 450 / 750 = 0.40 ms (interpolated), p99 1.00 ms
    ikbo_queue_seconds             sum 0.02 s  count 900   -> queue 0.020 ms
    ikbo_request_prepare_seconds   sum 0.012 s count 900   -> prepare 0.012 ms
    ikbo_grpc_receive_seconds, ikbo_grpc_send_seconds (no model label)
                                   sum 0.01 s / 0.03 s, count 1000 each
                                   -> gRPC receive 0.010, send 0.030 ms
  loadgen open loop: 800 calls measured, client mean 0.6, p50 0.6, p99 2.5 ms
  echo open loop:    mean 0.2, p50 0.1, p99 0.6 ms
  delayed echo (run.sh --echo-delay: TAG.echo-delay-us "300", answers after
  0.3 ms): mean 0.55, p50 0.5, p99 1.5 ms -> its transport 0.55 - 0.3 =
  0.250 ms, (client - forward) / that = (0.6 - 0.3) / 0.25 = 1.20x

Expected: the breakdown row queue 0.020 (3%), forward 0.300 (50%), rest of
server 0.400 - 0.020 - 0.300 = 0.080 (13%) of which prepare 0.012 (2%),
outside server 0.600 - 0.400 =
0.200 (33%); the floor row (client - forward) / echo = (0.6 - 0.4) / 0.1 =
2.00x at p50, (2.5 - 1.0) / 0.6 = 2.50x at p99, (0.6 - 0.3) / 0.2 = 1.50x
for the mean; the saturation row (server 0.40, client 0.60, outside server
33%, overhead 1 - 0.3 / 0.6 = 50.0%), the 100 failed calls noted; the
threads table; results.json with the same numbers.

Traps in the same files, each of which would move those numbers:
  - series labelled model="other" (a model the run is not about) with
    large deltas in all three histograms: report.py must count only the
    run's model; the same directory reported for model "other" gives that
    model's own figures (1000 / 500 / 300 ms), so the filter cuts both ways;
  - a per-batch ikbo_batch_compute_seconds histogram, typed before the
    per-request one: the forward time must be the per-request one;
  - the closed loop's /metrics snapshots (TAG.closed.before/after.prom, a
    window with 2 ms per request), and a TAG.closed-c4.json: only the
    open-loop snapshots count, and only TAG.closed.json is a point.
report.py --forward-mean-us TAG prints the forward mean per request in
us, 300, which run.sh passes to echo_server --answer-after-us.
A second directory without ikbo_queue_seconds, ikbo_request_prepare_seconds
and the gRPC spans (an older daemon): those print "n/a" and are null in
results.json, forward and outside are unchanged.

Self-contained on purpose: ikbo_itest imports grpcio and the generated
protobuf modules under $IKBO_BUILD, which this test does not need.
"""
import json
import math
import os
import re
import subprocess
import sys
import tempfile

from itest_run import check, check_eq, run_tests, summary

ROOT = os.path.abspath(os.environ.get("IKBO_ROOT") or
                       os.path.join(os.path.dirname(__file__), "..", ".."))
REPORT = os.path.join(ROOT, "bench", "e2e", "report.py")
TAG = "ikbo-u2-c5"
WORK = None  # the TemporaryDirectory's path, set in main()
_reports = {}


# ---------------------------------------------------------------- the inputs

def hist(name, model, total, count, buckets=()):
    """Prometheus text lines of one histogram series: buckets is a list of
    (le, cumulative count) below +Inf; model None = an unlabelled series."""
    lab = 'model="%s",' % model if model else ""
    tail = '{model="%s"}' % model if model else ""
    out = ['%s_bucket{%sle="%s"} %r' % (name, lab, le, n) for le, n in buckets]
    out.append('%s_bucket{%sle="+Inf"} %r' % (name, lab, count))
    out.append('%s_sum%s %r' % (name, tail, total))
    out.append('%s_count%s %r' % (name, tail, count))
    return out


# Cumulative (sum s, count[, bucket counts at LES]) of each series at three
# /metrics snapshots: S0 before the closed loop, S1 after it (also the open
# loop's "before"), S2 after the open loop. Open-loop window S1 -> S2 for
# "demo": 1000 requests, 100 of them rejected (RESOURCE_EXHAUSTED), so 900
# scored ones in the queue and forward histograms; forward buckets 750 in
# (0.25, 0.5] ms, 141 in (0.5, 1] ms, 9 in (1, 2.5] ms. The closed loop's
# window S0 -> S1 has other means (2 ms per request), the other model's
# series slow everything down (all its forward calls over 2.5 ms).
LES = ("0.00025", "0.0005", "0.001", "0.0025")
SNAP = {
    ("ikbo_request_duration_seconds", "demo"): [(0.2, 100), (1.0, 500), (1.4, 1500)],
    ("ikbo_queue_seconds", "demo"): [(0.002, 90), (0.01, 450), (0.03, 1350)],
    ("ikbo_request_prepare_seconds", "demo"): [(0.001, 90), (0.005, 450), (0.017, 1350)],
    ("ikbo_request_prepare_seconds", "other"): [(0.1, 40), (0.2, 50), (0.5, 60)],
    ("ikbo_request_compute_seconds", "demo"): [(0.1, 90, (20, 60, 88, 90)), (0.5, 450, (100, 300, 440, 450)),
                                               (0.8, 1350, (100, 1050, 1331, 1350))],
    ("ikbo_batch_compute_seconds", "demo"): [(1.0, 100), (4.0, 300), (13.0, 500)],
    ("ikbo_request_duration_seconds", "other"): [(15.0, 40), (20.0, 50), (30.0, 60)],
    ("ikbo_queue_seconds", "other"): [(0.5, 40), (1.0, 50), (4.0, 60)],
    ("ikbo_request_compute_seconds", "other"): [(8.0, 40, (0, 0, 0, 0)), (10.0, 50, (0, 0, 0, 0)),
                                                (15.0, 60, (0, 0, 0, 0))],
}


def prom(snap, queue=True):
    """The daemon's /metrics text at snapshot snap (0, 1, 2); without
    ikbo_queue_seconds when not queue."""
    def series(name):
        out = ["# TYPE %s histogram" % name]
        for model in ("demo", "other"):
            v = SNAP.get((name, model))
            if v:
                v = v[snap]
                out += hist(name, model, v[0], v[1], list(zip(LES, v[2])) if len(v) > 2 else ())
        return out

    n = SNAP[("ikbo_request_duration_seconds", "demo")][snap][1]
    out = ["# HELP ikbo_requests_total Requests by model and status.",
           "# TYPE ikbo_requests_total counter",
           'ikbo_requests_total{model="demo",code="OK"} %d' % (n * 9 // 10),
           'ikbo_requests_total{model="demo",code="RESOURCE_EXHAUSTED"} %d' % (n // 10),
           'ikbo_requests_total{model="other",code="OK"} %d' % SNAP[("ikbo_queue_seconds", "other")][snap][1]]
    out += series("ikbo_request_duration_seconds")
    out += ["# TYPE ikbo_inflight_requests gauge", "ikbo_inflight_requests 0",
            "# TYPE ikbo_model_loaded gauge",
            'ikbo_model_loaded{model="demo",version="1",state="READY"} 1',
            'ikbo_model_loaded{model="other",version="3",state="READY"} 1',
            "# TYPE ikbo_build_info gauge", 'ikbo_build_info{version="0.1.0"} 1']
    if queue:
        out += series("ikbo_queue_seconds")
        out += series("ikbo_request_prepare_seconds")
        # the gRPC spans, server-wide: 1000 calls, 10 ms and 30 ms in all
        for name, sums in (("ikbo_grpc_receive_seconds", (0.001, 0.004, 0.014)),
                           ("ikbo_grpc_send_seconds", (0.003, 0.012, 0.042))):
            out += ["# TYPE %s histogram" % name] + hist(name, None, sums[snap], n)
    out += series("ikbo_batch_compute_seconds")  # per batch, typed first: not the forward time per request
    out += series("ikbo_request_compute_seconds")
    out += ["# TYPE ikbo_rejected_total counter",
            'ikbo_rejected_total{model="demo",reason="queue_full"} %d' % (n // 10)]
    return "\n".join(out) + "\n"


def latency(count, mean, p50, p99):
    return {"count": count, "min": min(p50, mean) / 2, "mean": mean, "p50": p50,
            "p90": (p50 + p99) / 2, "p99": p99, "p999": p99 * 1.5, "max": p99 * 2}


def loadgen(loop, ok_per_s, lat, rate=None, concurrency=None, send_lag_p99=None, failed=0):
    """ikbo-loadgen --json output (the fields report.py reads, and some):
    lat["count"] measured calls after a warm-up of a quarter as many, a
    tenth of all calls failed when failed."""
    sent = lat["count"] * 5 // 4
    codes = lambda n: {"OK": n - n // 10, "RESOURCE_EXHAUSTED": n // 10} if failed else {"OK": n}
    j = {"target": "127.0.0.1:1", "model": "demo", "model_version": 1, "server_mode": "ikbo",
         "device": "cpu", "loop": loop, "threads": 1, "connections": 1, "warmup_s": 1.0,
         "duration_s": 4.0, "elapsed_s": 5.0, "timeout_ms": 60000, "verify": True,
         "shape": {"users": 2, "candidates": "5", "history": "64", "encoding": "classic",
                   "mean_candidates": 10.0, "mean_request_bytes": 1000.0},
         "sent": sent, "codes": codes(sent), "invalid_responses": 0,
         "measured": {"requests": lat["count"], "codes": codes(lat["count"]), "invalid_responses": 0,
                      "requests_per_s": ok_per_s, "ok_per_s": ok_per_s, "candidates_per_s": 10 * ok_per_s,
                      "latency_ms": lat, "latency_all_ms": lat},
         "first_error": "RESOURCE_EXHAUSTED: queue full" if failed else None}
    if loop == "open":
        j.update(rate=rate, arrivals="uniform", max_inflight=10000, scheduled=sent, unsent=0)
        j["measured"]["send_lag_ms"] = latency(lat["count"], 0.01, 0.01, send_lag_p99)
    else:
        j["concurrency"] = concurrency
    return j


RUN = {"command": "bench/e2e/run.sh --modes ikbo --users 2 --cands 5 --out X", "date": "2026-01-02T03:04:05Z",
       "commit": "0000000", "host": "synthetic", "cpus": 2, "loadavg": "0.00 0.00 0.00", "device": "cpu",
       "model": "demo", "models": "/nowhere/models", "server_threads": 2, "concurrency": "4",
       "loadgen_threads": 1, "fraction": 0.5, "warmup_s": 1, "duration_s": 4, "compute_metric": "",
       "echo": "/nowhere/echo_server", "encoding": "classic"}


def make_dir(name, queue=True, model="demo", delayed=True, echo_p99=0.6):
    """A bench/e2e/run.sh results directory with the one point TAG."""
    d = os.path.join(WORK, name)
    os.makedirs(d)

    def put(fname, content):
        with open(os.path.join(d, fname), "w") as f:
            f.write(content if isinstance(content, str) else json.dumps(content, indent=2))

    put("run.json", dict(RUN, model=model))
    put(TAG + ".closed.json", loadgen("closed", 2000.0, latency(8000, 1.9, 1.5, 6.0), concurrency=4))
    # The lesser closed-loop runs of a concurrency list: not points.
    put(TAG + ".closed-c4.json", loadgen("closed", 1500.0, latency(6000, 2.5, 2.0, 9.0), concurrency=4))
    put(TAG + ".closed.before.prom", prom(0, queue))
    put(TAG + ".closed.after.prom", prom(1, queue))
    put(TAG + ".closed.threads.json", {"seconds": 3.0, "processes": [
        {"pid": 1, "name": "ikbo-serve", "cpu_pct": 95.0,
         "threads": [{"thread": "ikbo-inst0", "threads": 1, "cpu_pct": 75.0},
                     {"thread": "ikbo-grpc0", "threads": 1, "cpu_pct": 20.0},
                     {"thread": "ikbo-grpc1", "threads": 1, "cpu_pct": 19.9}]},
        {"pid": 2, "name": "ikbo-loadgen", "cpu_pct": 30.0, "threads": []}]})
    put(TAG + ".open.json", loadgen("open", 720.0, latency(800, 0.6, 0.6, 2.5), rate=800.0,
                                    send_lag_p99=0.05, failed=True))
    put(TAG + ".open.before.prom", prom(1, queue))
    put(TAG + ".open.after.prom", prom(2, queue))
    put(TAG + ".echo-closed.json", loadgen("closed", 5000.0, latency(20000, 0.7, 0.5, 3.0), concurrency=4))
    put(TAG + ".echo-open.json", loadgen("open", 800.0, latency(800, 0.2, 0.1, echo_p99), rate=800.0,
                                         send_lag_p99=0.04))
    if delayed:
        put(TAG + ".echo-delay-us", "300\n")
        put(TAG + ".echo-delay-open.json", loadgen("open", 800.0, latency(800, 0.55, 0.5, 1.5), rate=800.0,
                                                   send_lag_p99=0.04))
    return d


def run_report(*args):
    """report.py with args: its CompletedProcess (text stdout and stderr)."""
    return subprocess.run([sys.executable, REPORT] + list(args), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, timeout=30)


def report(name, **kw):
    """(stdout, results.json) of report.py on make_dir(name, **kw), once."""
    if name not in _reports:
        d = make_dir(name, **kw)
        p = run_report(d)
        check(p.returncode == 0, "report.py %s: exit %d\n%s" % (name, p.returncode, p.stderr))
        check(not p.stderr.strip(), "report.py %s wrote to stderr:\n%s" % (name, p.stderr))
        with open(os.path.join(d, "results.json")) as f:
            _reports[name] = (p.stdout, json.load(f))
    return _reports[name]


def table(out, column):
    """The rows of the markdown table that has a column named `column`, as
    dicts header -> cell text; [] without such a table."""
    lines = out.splitlines()
    for i, line in enumerate(lines):
        heads = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and column in heads and i + 1 < len(lines) and lines[i + 1].startswith("|---"):
            rows = []
            for row in lines[i + 2:]:
                if not row.startswith("|"):
                    break
                cells = [c.strip() for c in row.strip().strip("|").split("|")]
                check(len(cells) == len(heads), "row %r does not match header %r" % (row, line))
                rows.append(dict(zip(heads, cells)))
            return rows
    return []


def one(out, column, what):
    """The only row of the table with a column named `column`."""
    rows = table(out, column)
    check(len(rows) == 1, "%s: want 1 row, got %d in\n%s" % (what, len(rows), out))
    return rows[0]


# ---------------------------------------------------------------- checks

def check_cells(row, want, what):
    for k, v in want.items():
        check_eq(row.get(k), v, "%s, column %r" % (what, k))


def check_near(got, want, what, tol=1e-9):
    ok = (got is None and want is None) or (
        got is not None and want is not None and math.isclose(got, want, rel_tol=tol, abs_tol=tol))
    check(ok, "%s: got %r, want %r" % (what, got, want))


def the_row(res, what):
    check_eq(len(res["rows"]), 1, what + ": rows in results.json")
    r = res["rows"][0]
    check_eq((r["mode"], r["users"], r["cands"]), ("ikbo", 2, 5), what + ": the point")
    return r


def test_breakdown():
    out, res = report("full")
    row = one(out, "queue ms", "breakdown table")
    check_cells(row, {"mode": "ikbo", "users/req": "2", "cands/user": "5", "open-loop req/s": "800.00",
                      "client mean ms": "0.600", "queue ms": "0.020 (3%)", "forward ms": "0.300 (50%)",
                      "rest of server ms": "0.080 (13%)", "of which prepare ms": "0.012 (2%)",
                      "outside server ms": "0.200 (33%)", "gRPC receive / send ms": "0.010 / 0.030"},
                "breakdown row")
    r = the_row(res, "full")
    want = {"client_ms": 0.6, "server_ms": 0.4, "queue_ms": 0.02, "compute_ms": 0.3, "server_rest_ms": 0.08,
            "prepare_ms": 0.012, "outside_server_ms": 0.2, "grpc_receive_ms": 0.01, "grpc_send_ms": 0.03}
    for k, v in want.items():
        check_near(r[k], v, "results.json " + k)
    check_near(r["queue_ms"] + r["compute_ms"] + r["server_rest_ms"] + r["outside_server_ms"], r["client_ms"],
               "the four parts add up to the client mean")
    check_eq(res["compute_metric"], "ikbo_request_compute_seconds", "results.json compute_metric")
    check_eq(res["run"], RUN, "results.json run (run.json verbatim)")
    print("     queue %.3f + forward %.3f + rest %.3f + outside %.3f = client %.3f ms" % (
        r["queue_ms"], r["compute_ms"], r["server_rest_ms"], r["outside_server_ms"], r["client_ms"]))


def test_floor():
    out, res = report("full")
    row = one(out, "(client - forward) / echo p50", "floor table")
    check_cells(row, {"mode": "ikbo", "users/req": "2", "cands/user": "5", "open-loop req/s": "800.00",
                      "client p50 / p99 / mean ms": "0.60 / 2.50 / 0.60",
                      "forward p50 / p99 / mean ms": "0.40 / 1.00 / 0.30",
                      "echo p50 / p99 / mean ms": "0.10 / 0.60 / 0.20",
                      "(client - forward) / echo p50": "2.00x", "p99": "2.50x", "mean": "1.50x",
                      "echo saturation req/s": "5000.0"}, "floor row")
    f = the_row(res, "full")["floor"]
    want = {"client_p50": 0.6, "client_p99": 2.5, "client_mean": 0.6, "forward_p50": 0.4, "forward_p99": 1.0,
            "forward_mean": 0.3, "echo_p50": 0.1, "echo_p99": 0.6, "echo_mean": 0.2, "ratio_p50": 2.0,
            "ratio_p99": 2.5, "ratio_mean": 1.5, "echo_sat_rps": 5000.0, "echo_rate": 800.0}
    for k, v in want.items():
        check_near(f[k], v, "results.json floor " + k)
    check_eq((f["echo_calls"], f["echo_errors"]), (800, 0), "results.json floor echo calls, errors")
    check("- floor: build/echo_server" in out, "the floor's note is missing")
    check(f["disturbed"] is False and "host disturbed" not in out,
          "an echo p99 of 6x its p50 flagged as a disturbed host")


def test_floor_disturbed():
    # The echo's p99 at 12.8 ms against its p50 of 0.1 (a run seen on 2026-12-06).
    out, res = report("disturbed", echo_p99=12.8)
    check(the_row(res, "disturbed")["floor"]["disturbed"] is True, "results.json floor.disturbed")
    check("- host disturbed at ikbo 2 x 5: the echo's p99 12.80 ms is 128x its p50 0.10 ms" in out,
          "no disturbed-host line under the floor table:\n" + out)
    # Past 20x but under 1 ms: not flagged.
    out, res = report("tail", echo_p99=0.9)
    check(the_row(res, "tail")["floor"]["disturbed"] is False and "host disturbed" not in out,
          "an echo p99 of 0.9 ms flagged as a disturbed host")


def test_saturation():
    out, res = report("full")
    row = one(out, "saturation req/s", "saturation table")
    check_cells(row, {"mode": "ikbo", "users/req": "2", "cands/user": "5", "cands/req": "10", "in flight": "4",
                      "saturation req/s": "2000.0", "saturation cands/s": "20000",
                      "open-loop req/s": "800.00", "p50 ms": "0.60", "p99 ms": "2.50", "calls": "800",
                      "server ms": "0.40", "client ms": "0.60", "outside server": "33%",
                      "forward ms": "0.30", "overhead": "50.0%"}, "saturation row")
    r = the_row(res, "full")
    check_near(r["overhead"], 0.5, "results.json overhead")
    check_near(r["outside_server"], 1 / 3, "results.json outside_server")
    check_eq((r["errors"], r["unsent"], r["open_calls"]), (100, 0, 800), "results.json errors, unsent, open_calls")
    check("- failed or unsent calls at: ikbo u2 c5 (see the per-run JSON)." in out,
          "no note of the open loop's 100 failed calls:\n" + out)
    row = one(out, "threads at saturation (CPU % of one core)", "threads table")
    check_eq(row["threads at saturation (CPU % of one core)"], "ikbo-inst0 75%, ikbo-grpc0 20%; loadgen 30%",
             "threads at saturation")
    check("client send lag p99 (open loop, worst point): 0.05 ms" in out, "send lag note:\n" + out)


def test_other_model():
    # The "full" point's figures above already exclude model="other"'s
    # series; reported for that model instead, its own deltas: 10 s, 5 s and
    # 3 s over 10 requests.
    out, res = report("other", model="other")
    r = the_row(res, "model other")
    want = {"server_ms": 1000.0, "compute_ms": 500.0, "queue_ms": 300.0, "server_rest_ms": 200.0,
            "prepare_ms": 30.0, "outside_server_ms": 0.6 - 1000.0}
    for k, v in want.items():
        check_near(r[k], v, "model other: results.json " + k)
    # All of its forward observations are over 2.5 ms: the quantiles fall in
    # +Inf and come out as the largest finite bound, 2.5 ms; none below the
    # client's (p50 0.6, p99 2.5, mean 0.6 ms): no ratio.
    f = r["floor"]
    check_near(f["forward_p50"], 2.5, "model other: forward p50")
    check_near(f["forward_p99"], 2.5, "model other: forward p99")
    check((f["ratio_p50"], f["ratio_p99"], f["ratio_mean"]) == (None, None, None),
          "model other: ratios %r, want null" % ((f["ratio_p50"], f["ratio_p99"], f["ratio_mean"]),))
    row = one(out, "(client - forward) / echo p50", "model other: floor table")
    check_cells(row, {"forward p50 / p99 / mean ms": "2.50 / 2.50 / 500.00",
                      "(client - forward) / echo p50": "n/a", "p99": "n/a", "mean": "n/a"},
                "model other: floor row")


def test_floor_delayed():
    out, res = report("full")
    row = one(out, "its transport (mean - delay) ms", "delayed floor table")
    check_cells(row, {"mode": "ikbo", "users/req": "2", "cands/user": "5", "echo answers after ms": "0.300",
                      "delayed echo p50 / p99 / mean ms": "0.50 / 1.50 / 0.55",
                      "its transport (mean - delay) ms": "0.250",
                      "(client - forward) / that, means": "1.20x"}, "delayed floor row")
    g = the_row(res, "full")["floor"]["delayed"]
    want = {"delay_ms": 0.3, "p50": 0.5, "p99": 1.5, "mean": 0.55, "transport_ms": 0.25, "ratio": 1.2}
    for k, v in want.items():
        check_near(g[k], v, "results.json floor.delayed " + k)
    check_eq(g["errors"], 0, "results.json floor.delayed errors")
    # Without the delayed echo's files: no third table, and null in results.json.
    out, res = report("nodelay", delayed=False)
    check_eq(table(out, "its transport (mean - delay) ms"), [], "delayed floor table without its files")
    check(the_row(res, "nodelay")["floor"]["delayed"] is None, "results.json floor.delayed without its files")


def test_forward_mean_us():
    d = os.path.join(WORK, "full")
    report("full")
    p = run_report(d, "--forward-mean-us", TAG)
    check_eq((p.returncode, p.stdout), (0, "300\n"), "report.py --forward-mean-us (stderr %r)" % p.stderr)
    p = run_report(d, "--forward-mean-us", "ikbo-u9-c9")
    check(p.returncode == 2 and not p.stdout and p.stderr.startswith("report.py: ikbo-u9-c9: ")
          and "ikbo-u9-c9.open.before.prom" in p.stderr,
          "--forward-mean-us of a point that did not run: exit %d, %r, %r" % (p.returncode, p.stdout, p.stderr))


def test_no_queue_histogram():
    out, res = report("noqueue", queue=False)
    row = one(out, "queue ms", "breakdown table without queue")
    check_cells(row, {"client mean ms": "0.600", "queue ms": "n/a", "forward ms": "0.300 (50%)",
                      "rest of server ms": "n/a", "of which prepare ms": "n/a",
                      "outside server ms": "0.200 (33%)", "gRPC receive / send ms": "n/a / n/a"},
                "breakdown row without ikbo_queue_seconds")
    r = the_row(res, "noqueue")
    check(r["queue_ms"] is None and r["server_rest_ms"] is None and r["prepare_ms"] is None,
          "results.json without queue: queue_ms %r, server_rest_ms %r, prepare_ms %r, want null" % (
              r["queue_ms"], r["server_rest_ms"], r["prepare_ms"]))
    check_near(r["compute_ms"], 0.3, "results.json without queue: compute_ms")
    check_near(r["outside_server_ms"], 0.2, "results.json without queue: outside_server_ms")
    with open(os.path.join(WORK, "noqueue", "results.json")) as f:
        raw = f.read()
    check(re.search(r'"queue_ms": null', raw) and re.search(r'"server_rest_ms": null', raw),
          "results.json without queue: queue_ms / server_rest_ms not written as null")


def main():
    global WORK
    with tempfile.TemporaryDirectory(prefix="ikbo-e2e-report-") as WORK:
        tests = [test_breakdown, test_floor, test_floor_disturbed, test_saturation, test_other_model,
                 test_no_queue_histogram, test_floor_delayed, test_forward_mean_us]
        failed, t_all = run_tests(tests)
        rc = summary(len(tests), failed, t_all)
    sys.exit(rc)


if __name__ == "__main__":
    main()
