#!/usr/bin/python3
"""Table of a bench/e2e/run.sh results directory (markdown on stdout) and
results.json beside the inputs.

    /usr/bin/python3 bench/e2e/report.py build/e2e/<run> [--compute-metric NAME]
    /usr/bin/python3 bench/e2e/report.py build/e2e/<run> --forward-mean-us TAG
        (run.sh --echo-delay: one point's forward mean per request, us)

Per mode and point: throughput at saturation (closed loop), p50/p99 at the
open-loop rate, mean server time per request (ikbo_request_duration_seconds,
receipt to response built, from /metrics deltas around the open-loop run),
mean client latency, and, when /metrics has a forward-pass time histogram
(--compute-metric, or auto-detected: a histogram named like *forward*,
*compute* or *engine* in seconds), the server overhead: the share of the
client-observed request latency spent outside the forward pass, 1 -
compute / latency (means). Without such a metric the overhead column is
"n/a" and the table says so.

The floor (issue 18), where run.sh also ran build/echo_server (TAG.echo-
closed.json, TAG.echo-open.json): per point, our open-loop client latency,
the forward time per request (quantiles interpolated in the compute
histogram's buckets, so approximate; the mean is exact), the echo's
open-loop latency at the same rate with the same request bodies, and the
ratio (client - forward) / echo at p50, p99 and the mean: 1.0 would be a
server whose every cost outside the forward pass is the transport's.

With run.sh --echo-delay (TAG.echo-delay-open.json), the floor at equal
concurrency: the echo again, answering each call after the point's forward
mean (echo_server --answer-after-us, from its sender thread), so as many
calls are in flight as ours at the same rate. Its transport = its client
latency - that delay; the ratio (client - forward) / (its client - delay),
means. Where this ratio is near 1 and the plain one is not, the gap is
what the transport costs with more calls in flight, not the server's work.

Right after it, the breakdown of each point's mean open-loop client latency
(every point, echo or not; each part a /metrics delta sum over the server's
request count, like the forward time, so the four add up to the client
mean): queue = ikbo_queue_seconds (submit to the compute start of its
batch), forward, rest of server = ikbo_request_duration_seconds - queue -
forward (validation, plan, hand-offs, response), of it the prepare =
ikbo_request_prepare_seconds (validation and plan alone), outside server =
client - server duration (gRPC transport, its threads, decode, pack, the
client and its send lag); "n/a" where a histogram is missing. Beside them,
two spans the server measures around its duration, each its own
histogram's mean: gRPC receive = ikbo_grpc_receive_seconds (a worker taking
the call off its queue to the request submitted) and gRPC send =
ikbo_grpc_send_seconds (the answer handed to the send path to gRPC core
reporting the send done; it can end after the client has the answer). The batcher observes queue and
forward for scored requests only, the duration for all: with failed calls
the rest holds theirs. A request split over batches waits until its last
batch starts, so its queue holds the earlier batches' forward: the rest
comes out low then (negative at worst).
"""
import argparse
import glob
import json
import os
import re
import sys


def parse_prom(path):
    """{(name, frozenset(labels)): value}, {name: type}."""
    vals, types = {}, {}
    with open(path) as f:
        for line in f:
            m = re.match(r"^# TYPE (\S+) (\S+)", line)
            if m:
                types[m.group(1)] = m.group(2)
                continue
            m = re.match(r"^([A-Za-z_:][\w:]*)(?:\{(.*)\})? (\S+)$", line.strip())
            if m:
                labels = frozenset(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
                vals[(m.group(1), labels)] = float(m.group(3))
    return vals, types


def hist_delta(before, after, name, model):
    """(sum delta, count delta) of histogram `name` over series with model=model."""
    s = c = 0.0
    for (n, labels), v in after.items():
        d = dict(labels)
        if d.get("model", model) != model:
            continue
        if n == name + "_sum":
            s += v - before.get((n, labels), 0.0)
        elif n == name + "_count":
            c += v - before.get((n, labels), 0.0)
    return s, c


def hist_quantile(before, after, name, model, q):
    """The q-quantile of histogram `name` (series with model=model) over the
    window between two snapshots, interpolated linearly inside its bucket
    (Prometheus's histogram_quantile); the largest finite bound when it falls
    in the +Inf bucket; None without observations."""
    cum = {}
    for (n, labels), v in after.items():
        d = dict(labels)
        if n != name + "_bucket" or d.get("model", model) != model:
            continue
        le = float(d["le"])
        cum[le] = cum.get(le, 0.0) + v - before.get((n, labels), 0.0)
    bounds = sorted(cum)
    if not bounds or cum[bounds[-1]] <= 0:
        return None
    rank = q * cum[bounds[-1]]
    lo, below = 0.0, 0.0
    for le in bounds:
        if cum[le] >= rank:
            if le == float("inf"):
                return lo
            return lo + (le - lo) * ((rank - below) / (cum[le] - below) if cum[le] > below else 1.0)
        lo, below = le, cum[le]
    return lo


def detect_compute(types):
    # Per request (what the request waited for), before the per-batch one.
    if types.get("ikbo_request_compute_seconds") == "histogram":
        return "ikbo_request_compute_seconds"
    for name, t in types.items():
        if t == "histogram" and name != "ikbo_request_duration_seconds" and \
                re.search(r"(forward|compute|engine)", name) and name.endswith("seconds"):
            return name
    return None


def request_count(before, after, model):
    """Requests the server counted between the snapshots."""
    return hist_delta(before, after, "ikbo_request_duration_seconds", model)[1]


def per_request_ms(before, after, name, model, scount):
    """Histogram `name`'s time per request the server counted (scount), ms;
    None without the histogram, its samples or requests."""
    if not name:
        return None
    hsum, hcount = hist_delta(before, after, name, model)
    return 1e3 * hsum / scount if scount and hcount else None


def open_snapshots(d, tag):
    """The /metrics snapshots around a point's open-loop run: before, after, types."""
    before, types = parse_prom(os.path.join(d, tag + ".open.before.prom"))
    after, types2 = parse_prom(os.path.join(d, tag + ".open.after.prom"))
    types.update(types2)
    return before, after, types


def fmt(x, spec="%.2f"):
    return "n/a" if x is None else spec % x


# An echo p99 past this many times its p50, and past DISTURBED_MIN_MS, marks
# the host as disturbed during that point (the echo's p99 sat at 1.5-6x its
# p50 in the H100/H200 runs of bench/RESULTS.md; 87-116x in a disturbed one).
DISTURBED_TAIL = 20.0
DISTURBED_MIN_MS = 1.0


def floor_row(d, tag, before, after, compute_name, model, om, compute_ms):
    """The floor figures of one point, or None when the echo did not run."""
    eo_path = os.path.join(d, tag + ".echo-open.json")
    if not os.path.exists(eo_path):
        return None
    eo = json.load(open(eo_path))
    ec_path = os.path.join(d, tag + ".echo-closed.json")
    ec = json.load(open(ec_path)) if os.path.exists(ec_path) else None
    lat, elat = om["latency_ms"], eo["measured"]["latency_ms"]
    f = {"echo_rate": eo["rate"], "echo_calls": elat["count"],
         "echo_sat_rps": ec["measured"]["ok_per_s"] if ec else None,
         "echo_errors": sum(v for k, v in eo["codes"].items() if k != "OK") +
         (sum(v for k, v in ec["codes"].items() if k != "OK") if ec else 0)}
    for stat, q in (("p50", 0.5), ("p99", 0.99), ("mean", None)):
        client = lat[stat] if lat["count"] else None
        echo = elat[stat] if elat["count"] else None
        if q is None:
            fwd = compute_ms
        else:
            fq = hist_quantile(before, after, compute_name, model, q) if compute_name else None
            fwd = None if fq is None else 1e3 * fq
        f["client_" + stat], f["echo_" + stat], f["forward_" + stat] = client, echo, fwd
        # A forward quantile over the client's is the buckets' coarseness
        # (or too few calls), not a measurement: no ratio then.
        f["ratio_" + stat] = ((client - fwd) / echo if None not in (client, fwd, echo) and echo > 0
                              and fwd < client else None)
    # The echo does no work, so a tail far past its median is the host's
    # (other tenants, CPU frequency, interrupts), not the transport's: such
    # a point's latencies and ratios are flagged (floor_table).
    f["disturbed"] = bool(f["echo_p50"] and f["echo_p99"] is not None and
                          f["echo_p99"] > max(DISTURBED_TAIL * f["echo_p50"], DISTURBED_MIN_MS))
    dpath = os.path.join(d, tag + ".echo-delay-open.json")
    f["delayed"] = None
    if os.path.exists(dpath) and compute_ms is not None and f["client_mean"] is not None:
        dj = json.load(open(dpath))
        dl = dj["measured"]["latency_ms"]
        delay = float(open(os.path.join(d, tag + ".echo-delay-us")).read()) / 1e3
        transport = dl["mean"] - delay if dl["count"] else None
        f["delayed"] = {"delay_ms": delay, "p50": dl["p50"], "p99": dl["p99"], "mean": dl["mean"],
                        "transport_ms": transport, "errors": sum(v for k, v in dj["codes"].items() if k != "OK"),
                        "ratio": ((f["client_mean"] - compute_ms) / transport
                                  if transport and transport > 0 else None)}
    return f


def floor_table(rows):
    """The floor table's lines (empty when no point ran the echo)."""
    fr = [r for r in rows if r["floor"]]
    if not fr:
        return []
    out = ["| mode | users/req | cands/user | open-loop req/s | client p50 / p99 / mean ms "
           "| forward p50 / p99 / mean ms | echo p50 / p99 / mean ms | (client - forward) / echo p50 "
           "| p99 | mean | echo saturation req/s |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    trio = lambda f, k: " / ".join(fmt(f[k + "_" + s]) for s in ("p50", "p99", "mean"))
    for r in fr:
        f = r["floor"]
        out.append("| %s | %d | %d | %.2f | %s | %s | %s | %s | %s | %s | %s |" % (
            r["mode"], r["users"], r["cands"], r["open_rate"], trio(f, "client"), trio(f, "forward"),
            trio(f, "echo"), fmt(f["ratio_p50"], "%.2fx"), fmt(f["ratio_p99"], "%.2fx"),
            fmt(f["ratio_mean"], "%.2fx"), fmt(f["echo_sat_rps"], "%.1f")))
    out.append("")
    for r in fr:
        f = r["floor"]
        if f["disturbed"]:
            out.append("- host disturbed at %s %d x %d: the echo's p99 %.2f ms is %.0fx its p50 %.2f ms "
                       "(flagged past %.0fx and %.1f ms); this point's latencies and ratios are not "
                       "comparable with other runs" % (r["mode"], r["users"], r["cands"], f["echo_p99"],
                                                      f["echo_p99"] / f["echo_p50"], f["echo_p50"],
                                                      DISTURBED_TAIL, DISTURBED_MIN_MS))
    if any(r["floor"]["disturbed"] for r in fr):
        out.append("")
    dr = [r for r in fr if r["floor"]["delayed"]]
    if dr:
        out += ["| mode | users/req | cands/user | echo answers after ms | delayed echo p50 / p99 / mean ms "
                "| its transport (mean - delay) ms | (client - forward) / that, means |",
                "|---|---:|---:|---:|---:|---:|---:|"]
        for r in dr:
            g = r["floor"]["delayed"]
            out.append("| %s | %d | %d | %.3f | %s / %s / %s | %s | %s |" % (
                r["mode"], r["users"], r["cands"], g["delay_ms"], fmt(g["p50"]), fmt(g["p99"]),
                fmt(g["mean"]), fmt(g["transport_ms"], "%.3f"), fmt(g["ratio"], "%.2fx")))
        out.append("")
    return out


def breakdown_table(rows):
    """The client-latency breakdown's lines (means, ms, share of the client's)."""
    out = ["| mode | users/req | cands/user | open-loop req/s | client mean ms | queue ms | forward ms "
           "| rest of server ms | of which prepare ms | outside server ms | gRPC receive / send ms |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    part = lambda r, x: "n/a" if x is None else (
        "%.3f (%.0f%%)" % (x, 100 * x / r["client_ms"]) if r["client_ms"] else "%.3f" % x)
    for r in rows:
        out.append("| %s | %d | %d | %.2f | %s | %s | %s | %s | %s | %s | %s / %s |" % (
            r["mode"], r["users"], r["cands"], r["open_rate"], fmt(r["client_ms"], "%.3f"),
            part(r, r["queue_ms"]), part(r, r["compute_ms"]), part(r, r["server_rest_ms"]),
            part(r, r["prepare_ms"]), part(r, r["outside_server_ms"]),
            fmt(r["grpc_receive_ms"], "%.3f"), fmt(r["grpc_send_ms"], "%.3f")))
    out.append("")
    return out


def forward_mean_us(d, tag, compute_name, model):
    """--forward-mean-us TAG: the forward mean per request of one run, in us,
    printed for bench/e2e/run.sh (the delayed echo's answer time)."""
    try:
        before, after, types = open_snapshots(d, tag)
    except OSError as e:
        print("report.py: %s: %s" % (tag, e), file=sys.stderr)
        return 2
    ms = per_request_ms(before, after, compute_name or detect_compute(types), model,
                        request_count(before, after, model))
    if ms is None:
        print("report.py: %s: no forward time in its /metrics snapshots" % tag, file=sys.stderr)
        return 2
    print("%d" % round(1e3 * ms))
    return 0


def busiest_threads(d, tag):
    """Server threads over 20% of a core at saturation, then the loadgen's
    total (bench/e2e/thread_cpu.py's file for the point), or None."""
    tpath = os.path.join(d, tag + ".closed.threads.json")
    if not os.path.exists(tpath):
        return None
    procs = json.load(open(tpath))["processes"]
    busiest = ", ".join("%s %.0f%%" % (t["thread"], t["cpu_pct"])
                        for t in procs[0]["threads"] if t["cpu_pct"] >= 20) or "none over 20%"
    if len(procs) > 1:
        busiest += "; loadgen %.0f%%" % procs[1]["cpu_pct"]
    return busiest


def point_row(d, tag, compute_name, model):
    """One point (TAG = mode-uU-cC): its closed and open loadgen runs and
    /metrics snapshots as one row of the tables and of results.json."""
    mode, u, c = re.match(r"^(\w+)-u(\d+)-c(\d+)$", tag).groups()
    cj = json.load(open(os.path.join(d, tag + ".closed.json")))
    oj = json.load(open(os.path.join(d, tag + ".open.json")))
    before, after, _ = open_snapshots(d, tag)
    ssum, scount = hist_delta(before, after, "ikbo_request_duration_seconds", model)
    server_ms = 1e3 * ssum / scount if scount else None
    compute_ms = per_request_ms(before, after, compute_name, model, scount)
    queue_ms = per_request_ms(before, after, "ikbo_queue_seconds", model, scount)
    prepare_ms = per_request_ms(before, after, "ikbo_request_prepare_seconds", model, scount)
    # server-wide, unlabelled: the run's model is the only one called
    grpc_ms = {}
    for k in ("receive", "send"):
        gsum, gcount = hist_delta(before, after, "ikbo_grpc_%s_seconds" % k, None)
        grpc_ms[k] = 1e3 * gsum / gcount if gcount else None
    om = oj["measured"]
    client_ms = om["latency_ms"]["mean"] if om["latency_ms"]["count"] else None
    overhead = (1 - compute_ms / client_ms) if (compute_ms is not None and client_ms) else None
    outside_server = (1 - server_ms / client_ms) if (server_ms is not None and client_ms) else None
    server_rest_ms = (server_ms - queue_ms - compute_ms
                      if None not in (server_ms, queue_ms, compute_ms) else None)
    outside_server_ms = client_ms - server_ms if None not in (client_ms, server_ms) else None
    errors = sum(v for k, v in cj["codes"].items() if k != "OK") + \
        sum(v for k, v in oj["codes"].items() if k != "OK")
    floor = floor_row(d, tag, before, after, compute_name, model, om, compute_ms)
    return dict(mode=mode, users=int(u), cands=int(c), cands_per_req=cj["shape"]["mean_candidates"],
                concurrency=cj["concurrency"], sat_rps=cj["measured"]["ok_per_s"],
                sat_cps=cj["measured"]["candidates_per_s"],
                sat_p50=cj["measured"]["latency_ms"]["p50"],
                open_rate=oj["rate"], open_calls=om["latency_ms"]["count"],
                p50=om["latency_ms"]["p50"], p99=om["latency_ms"]["p99"],
                p999=om["latency_ms"]["p999"], send_lag_p99=om["send_lag_ms"]["p99"],
                server_ms=server_ms, client_ms=client_ms, compute_ms=compute_ms,
                overhead=overhead, outside_server=outside_server, queue_ms=queue_ms,
                server_rest_ms=server_rest_ms, prepare_ms=prepare_ms,
                grpc_receive_ms=grpc_ms["receive"], grpc_send_ms=grpc_ms["send"],
                outside_server_ms=outside_server_ms, errors=errors,
                unsent=oj.get("unsent", 0), busiest=busiest_threads(d, tag), floor=floor)


def header_lines(run, model):
    return ["Date %s, commit %s, device %s, model `%s` (%s), host %s (%d CPUs, load average %s at start)."
            % (run["date"], run["commit"], run["device"], model, run["models"], run["host"], run["cpus"],
               run["loadavg"]), "",
            "Command: `%s` (server threads %d, closed loop %s in flight, open loop at %.0f%% of "
            "saturation, %.1f s warm-up, %.1f s measured per run, %s encoding)."
            % (run["command"].strip(), run["server_threads"], run["concurrency"], 100 * run["fraction"],
               run["warmup_s"], run["duration_s"], run.get("encoding", "classic")), ""]


def points_table(rows):
    out = ["| mode | users/req | cands/user | cands/req | in flight | saturation req/s | saturation cands/s "
           "| open-loop req/s | p50 ms | p99 ms | calls | server ms | client ms | outside server | forward ms "
           "| overhead |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        out.append("| %s | %d | %d | %.0f | %d | %.1f | %.0f | %.2f | %s | %s | %d | %s | %s | %s | %s | %s |" % (
            r["mode"], r["users"], r["cands"], r["cands_per_req"], r["concurrency"], r["sat_rps"], r["sat_cps"], r["open_rate"],
            fmt(r["p50"]), fmt(r["p99"]), r["open_calls"], fmt(r["server_ms"]), fmt(r["client_ms"]),
            fmt(None if r["outside_server"] is None else 100 * r["outside_server"], "%.0f%%"),
            fmt(r["compute_ms"]), fmt(None if r["overhead"] is None else 100 * r["overhead"], "%.1f%%")))
    return out + [""]


def modes_table(rows):
    """IKBO against broadcast at each point that has both."""
    by = {(r["mode"], r["users"], r["cands"]): r for r in rows}
    pts = sorted({(r["users"], r["cands"]) for r in rows})
    if not any(("ikbo",) + p in by and ("broadcast",) + p in by for p in pts):
        return []
    out = ["| users/req | cands/user | IKBO cands/s | broadcast cands/s | IKBO / broadcast "
           "| IKBO p99 ms | broadcast p99 ms |",
           "|---:|---:|---:|---:|---:|---:|---:|"]
    for p in pts:
        i, b = by.get(("ikbo",) + p), by.get(("broadcast",) + p)
        if i and b:
            out.append("| %d | %d | %.0f | %.0f | %.2fx | %.2f | %.2f |" % (
                p[0], p[1], i["sat_cps"], b["sat_cps"], i["sat_cps"] / b["sat_cps"] if b["sat_cps"] else 0,
                i["p99"], b["p99"]))
    return out + [""]


def threads_table(rows):
    if not any(r["busiest"] for r in rows):
        return []
    out = ["| mode | users/req | cands/user | threads at saturation (CPU % of one core) |",
           "|---|---:|---:|---|"]
    for r in rows:
        out.append("| %s | %d | %d | %s |" % (r["mode"], r["users"], r["cands"], r["busiest"] or "n/a"))
    return out + [""]


def where(rows):
    return ", ".join("%s u%d c%d" % (r["mode"], r["users"], r["cands"]) for r in rows)


def notes(rows, compute_name):
    """The notes under the tables: what each column measures, and what went
    wrong where."""
    out = []
    if compute_name is None:
        out.append("forward ms and overhead n/a: the daemon's /metrics has no forward-pass (compute) time "
                   "histogram, so the share of latency outside the forward pass cannot be measured from "
                   "outside. What is measured: \"server ms\" = mean ikbo_request_duration_seconds (receipt "
                   "to response built, forward pass included), \"client ms\" = loadgen's mean latency "
                   "from the intended send time, and \"outside server\" = 1 - server / client: the share "
                   "spent in gRPC transport, waiting for a server worker and the client. The server "
                   "overhead is at least that share.")
    else:
        out.append("forward ms: %s per request (mean); overhead = 1 - forward / client latency (means)."
                   % compute_name)
    if any(r["floor"] for r in rows):
        out.append("floor: build/echo_server (bench/e2e/echo_server.c) on the same host, with the "
                   "daemon's gRPC threads and an answer of our size, driven by the same loadgen "
                   "(threads, request bodies, closed-loop concurrency, open-loop rate and length); "
                   "forward = %s per request, p50/p99 interpolated in its buckets (approximate); "
                   "ratio = (client - forward) / echo latency, n/a where the interpolated forward "
                   "quantile is not below the client's (buckets too coarse, or too few calls for a "
                   "p99: see calls)." % (compute_name or "n/a"))
        bad_echo = [r for r in rows if r["floor"] and (r["floor"]["echo_errors"] or (
            r["floor"]["delayed"] and r["floor"]["delayed"]["errors"]))]
        if bad_echo:
            out.append("failed echo calls at: %s (see TAG.echo-*.json)." % where(bad_echo))
    out.append("client latency breakdown (means per request, share of the client's): queue = "
               "ikbo_queue_seconds, forward = %s, rest of server = ikbo_request_duration_seconds - "
               "queue - forward (validation, plan, hand-offs, response), of which prepare = "
               "ikbo_request_prepare_seconds (validation and plan), outside server = client - "
               "server (transport, gRPC, decode, pack, client, send lag); the server's means "
               "include the warm-up calls, the client's do not." % (compute_name or "n/a"))
    bad = [r for r in rows if r["errors"] or r["unsent"]]
    if bad:
        out.append("failed or unsent calls at: %s (see the per-run JSON)." % where(bad))
    lag = max((r["send_lag_p99"] for r in rows), default=0)
    out.append("client send lag p99 (open loop, worst point): %.2f ms (counted in the latencies)." % lag)
    return ["- " + n for n in out]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--compute-metric", default=None)
    ap.add_argument("--forward-mean-us", metavar="TAG", default=None)
    a = ap.parse_args()
    run = json.load(open(os.path.join(a.dir, "run.json")))
    model = run["model"]
    compute_name = a.compute_metric or run.get("compute_metric") or None
    if a.forward_mean_us:
        return forward_mean_us(a.dir, a.forward_mean_us, compute_name, model)
    tags = [os.path.basename(p)[:-len(".closed.json")]
            for p in sorted(glob.glob(os.path.join(a.dir, "*.closed.json")))]
    rows = []
    for tag in tags:
        if compute_name is None:    # from the first point whose /metrics has one
            compute_name = detect_compute(open_snapshots(a.dir, tag)[2])
        rows.append(point_row(a.dir, tag, compute_name, model))
    order = {"ikbo": 0, "broadcast": 1}
    rows.sort(key=lambda r: (order.get(r["mode"], 9), r["users"], r["cands"]))
    out = (header_lines(run, model) + points_table(rows) + modes_table(rows) + floor_table(rows)
           + breakdown_table(rows) + threads_table(rows) + notes(rows, compute_name))
    print("\n".join(out))
    with open(os.path.join(a.dir, "results.json"), "w") as f:
        json.dump({"run": run, "compute_metric": compute_name, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
