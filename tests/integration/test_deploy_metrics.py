#!/usr/bin/python3
"""The monitoring files in deploy/ against the metrics the daemon really
exports.

Starts build/ikbo-serve on a repository with the demo model and a broken
model (so a version is FAILED), sends Rank traffic (OK, NOT_FOUND,
INVALID_ARGUMENT), health checks and HTTP requests, scrapes /metrics and
parses it with prometheus_client. Then:
  - every ikbo_* metric named by the Grafana dashboard, the alert rules, the
    prometheus-adapter rule and the HPA is exported, and every label they
    match on or group by is a label the daemon sets (or job/instance/le);
  - the scrape passes `promtool check metrics`;
  - `promtool test rules` passes the alert rule unit tests;
  - a real Prometheus (Debian's) runs deploy/prometheus/prometheus.yml and
    ikbo-alerts.yml against the daemon: every dashboard query and the
    adapter's query evaluate without error, every alert rule evaluates with
    health "ok", and IkboModelLoadFailed fires for the broken model.
Each tool that is not installed is a SKIP with a message.
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deploy_common as dc  # noqa: E402

import grpc  # noqa: E402
import yaml  # noqa: E402

PROM_DIR = os.path.join(dc.DEPLOY, "prometheus")
DASHBOARD = os.path.join(dc.DEPLOY, "grafana", "ikbo-serve.json")
ALERTS = os.path.join(PROM_DIR, "ikbo-alerts.yml")
ADAPTER = os.path.join(PROM_DIR, "adapter-values.yaml")
HPA = os.path.join(dc.DEPLOY, "k8s", "hpa.yaml")

# Labels Prometheus itself attaches or histogram buckets carry.
TARGET_LABELS = {"job", "instance", "le"}
# Labels the Kubernetes scrape adds (adapter rule): not from the daemon.
K8S_LABELS = {"namespace", "pod"}
NON_IKBO = {"up"}  # metrics that are not the daemon's but may be queried
GRAFANA_VARS = {"$__rate_interval": "1m", "$__interval": "15s", "$job": ".*", "$instance": ".*",
                "$model": ".*"}


class State:
    pass


S = State()


# ---------------------------------------------------------------- queries

def dashboard_queries():
    """[(where, PromQL)] from panels and template variables."""
    with open(DASHBOARD) as f:
        d = json.load(f)
    out = []

    def panels(ps):
        for p in ps:
            yield p
            yield from panels(p.get("panels", []))
    for p in panels(d.get("panels", [])):
        for t in p.get("targets", []):
            if t.get("expr"):
                out.append(("panel %r" % p.get("title"), t["expr"]))
    for v in d.get("templating", {}).get("list", []):
        q = v.get("query")
        if isinstance(q, dict):
            q = q.get("query")
        if v.get("type") == "query" and q:
            m = re.match(r"label_values\((.*),\s*(\w+)\)\s*$", q)
            out.append(("variable %r" % v["name"], m.group(1) if m else q))
    return out


def alert_queries():
    with open(ALERTS) as f:
        doc = yaml.safe_load(f)
    return [("rule %s" % r.get("alert") or r.get("record"), r["expr"])
            for g in doc["groups"] for r in g["rules"]]


def adapter_queries():
    with open(ADAPTER) as f:
        doc = yaml.safe_load(f)
    out = []
    for r in doc["rules"]["custom"]:
        out.append(("adapter seriesQuery", r["seriesQuery"]))
        series = re.match(r"\s*([a-zA-Z_:][a-zA-Z0-9_:]*)", r["seriesQuery"]).group(1)
        q = (r["metricsQuery"].replace("<<.Series>>", series)
             .replace("<<.LabelMatchers>>", 'job="ikbo-serve"').replace("<<.GroupBy>>", "instance"))
        out.append(("adapter metricsQuery", q))
    return out


def hpa_metrics():
    with open(HPA) as f:
        doc = yaml.safe_load(f)
    return [m["pods"]["metric"]["name"] for m in doc["spec"]["metrics"] if m["type"] == "Pods"]


def substitute(expr):
    for k in sorted(GRAFANA_VARS, key=len, reverse=True):
        expr = expr.replace(k, GRAFANA_VARS[k])
    return expr


def strip_strings(expr):
    return re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)


def metric_names(expr):
    """ikbo_* (and other known) metric names in a PromQL expression."""
    e = strip_strings(expr)
    names = set(re.findall(r"\b(ikbo_[a-zA-Z0-9_:]+)", e))
    names |= {n for n in NON_IKBO if re.search(r"\b%s\s*[{\[]" % n, e)}
    return names


def selectors(expr):
    """[(metric, {label names matched})] for each metric{...} selector."""
    out = []
    for m in re.finditer(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^}]*)\}", expr):
        labels = set(re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", strip_strings(m.group(2))))
        out.append((m.group(1), labels))
    return out


def grouping_labels(expr):
    labels = set()
    for m in re.finditer(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", expr):
        labels |= {x.strip() for x in m.group(1).split(",") if x.strip()}
    return labels


def all_queries():
    return ([(w, substitute(q)) for w, q in dashboard_queries()] + alert_queries() + adapter_queries())


# ---------------------------------------------------------------- daemon

def setup():
    repo = tempfile.mkdtemp(prefix="ikbo-metrics-repo-")
    _, vdir = dc.model_repo()
    os.symlink(os.path.dirname(vdir), os.path.join(repo, "demo"))
    os.makedirs(os.path.join(repo, "broken", "1"))
    with open(os.path.join(repo, "broken", "1", "model.json"), "w") as f:
        f.write('{"format": "ikbo-model/1", "not_a_key": 1}\n')
    S.repo = repo
    S.vdir = vdir
    S.d = dc.Daemon(repo, {"threads": 2})
    t0 = time.time()
    while time.time() - t0 < 30:  # /readyz stays 503 (broken model): wait for both loads
        states = {(lbl.get("model"), lbl.get("state"))
                  for _, lbl, _v in S.d.metrics().get("ikbo_model_loaded", [])}
        if ("demo", "READY") in states and ("broken", "FAILED") in states:
            break
        time.sleep(0.05)
    else:
        raise AssertionError("models not loaded: %s\n%s" % (states, S.d.logs()))
    traffic()


def traffic():
    R, H = dc.pb(), dc.hpb()
    ch = grpc.insecure_channel(S.d.grpc_addr)
    rank = ch.unary_unary("/ikbo.v1.Ranker/Rank", request_serializer=R.RankRequest.SerializeToString,
                          response_deserializer=R.RankResponse.FromString)
    for seed in range(20):
        rank(dc.make_request(S.vdir, seed, users=1 + seed % 4, cands_per_user=1 + seed), timeout=10)
    bad = dc.make_request(S.vdir, 99)
    bad.model = "nope"
    try:
        rank(bad, timeout=10)
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.NOT_FOUND, e
    bad = dc.make_request(S.vdir, 98)
    bad.candidates[0].user = 1000
    try:
        rank(bad, timeout=10)
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
    check = ch.unary_unary("/grpc.health.v1.Health/Check",
                           request_serializer=H.HealthCheckRequest.SerializeToString,
                           response_deserializer=H.HealthCheckResponse.FromString)
    check(H.HealthCheckRequest(service=""), timeout=5)
    ch.close()
    dc.http_get(S.d.url("/v1/models"))
    dc.http_get(S.d.url("/healthz"))


# ---------------------------------------------------------------- checks

def check_names_exported():
    fams = S.d.metrics()
    exported = set(fams)
    labels_of = {}
    for fam, samples in fams.items():
        for name, lbl, _ in samples:
            exported.add(name)
            labels_of.setdefault(name, set()).update(lbl)
            labels_of.setdefault(fam, set()).update(lbl)
    all_labels = set().union(*labels_of.values()) | TARGET_LABELS | K8S_LABELS
    queries = all_queries()
    used = set(hpa_metrics())
    problems = []
    for where, q in queries:
        names = metric_names(q)
        if not names:
            problems.append("%s queries no ikbo_* metric: %s" % (where, q))
        used |= names
        for metric, lbls in selectors(q):
            if metric in labels_of:
                unknown = lbls - labels_of[metric] - TARGET_LABELS - K8S_LABELS
                if unknown:
                    problems.append("%s: %s has no label(s) %s (it has %s)"
                                    % (where, metric, sorted(unknown), sorted(labels_of[metric])))
        unknown = grouping_labels(q) - all_labels
        if unknown:
            problems.append("%s groups by unknown label(s) %s" % (where, sorted(unknown)))
    missing = sorted(n for n in used if n.startswith("ikbo_") and n not in exported)
    if missing:
        problems.append("not exported by ikbo-serve: %s (exported: %s)" % (missing, sorted(exported)))
    assert not problems, "\n".join(problems)
    return "%d queries use %d metric names, all exported: %s" % (
        len(queries), len(used), ", ".join(sorted(used)))


def check_promtool_metrics():
    promtool = dc.need_tool("promtool", "prometheus")
    p = subprocess.run([promtool, "check", "metrics"], input=S.d.metrics_text(), capture_output=True,
                       text=True, timeout=30)
    assert p.returncode == 0 and not p.stdout.strip(), "promtool check metrics:\n%s%s" % (p.stdout, p.stderr)


def check_promtool_test_rules():
    promtool = dc.need_tool("promtool", "prometheus")
    p = dc.run([promtool, "test", "rules", os.path.join(PROM_DIR, "ikbo-alerts_test.yml")])
    return p.stdout.strip().splitlines()[-1].strip()


def prom_get(port, path, **params):
    url = "http://127.0.0.1:%d%s?%s" % (port, path, urllib.parse.urlencode(params))
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:
        body = e.read()
        try:
            return json.loads(body)
        except ValueError:  # e.g. 503 "Service Unavailable" while Prometheus starts
            return {"status": "http-%d" % e.code, "error": body[:200].decode("latin-1")}


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def check_real_prometheus():
    prom = dc.need_tool("prometheus", "prometheus")
    tmp = tempfile.mkdtemp(prefix="ikbo-prom-")
    try:
        with open(os.path.join(PROM_DIR, "prometheus.yml")) as f:
            conf = yaml.safe_load(f)
        conf["global"]["scrape_interval"] = "1s"
        conf["global"]["evaluation_interval"] = "1s"
        conf["rule_files"] = [os.path.join(PROM_DIR, r) for r in conf["rule_files"]]
        job = [j for j in conf["scrape_configs"] if j["job_name"] == "ikbo-serve"]
        assert job, "prometheus.yml has no ikbo-serve job"
        job[0]["static_configs"] = [{"targets": ["127.0.0.1:%d" % S.d.http_port]}]
        cpath = os.path.join(tmp, "prometheus.yml")
        with open(cpath, "w") as f:
            yaml.safe_dump(conf, f)
        port = free_port()
        log = open(os.path.join(tmp, "prometheus.log"), "w")
        p = subprocess.Popen([prom, "--config.file=" + cpath, "--storage.tsdb.path=" + os.path.join(tmp, "data"),
                              "--web.listen-address=127.0.0.1:%d" % port, "--log.level=warn"],
                             stdout=log, stderr=subprocess.STDOUT)
        try:
            t0 = time.time()
            while True:
                if p.poll() is not None:
                    raise AssertionError("prometheus exited %d:\n%s" % (
                        p.returncode, open(os.path.join(tmp, "prometheus.log")).read()))
                try:
                    r = prom_get(port, "/api/v1/query", query="ikbo_build_info")
                    if r.get("status") == "success" and r["data"]["result"]:
                        break
                except OSError:
                    pass
                if time.time() - t0 > 20:
                    raise AssertionError("prometheus scraped nothing from the daemon in 20 s")
                time.sleep(0.2)
            traffic()   # more samples so rate() has something to chew on
            time.sleep(2.5)
            problems, with_data = [], 0
            queries = all_queries()
            for where, q in queries:
                r = prom_get(port, "/api/v1/query", query=q)
                if r.get("status") != "success":
                    problems.append("%s: %s\n    %s" % (where, r.get("error"), q))
                elif r["data"]["result"]:
                    with_data += 1
            t0 = time.time()
            while True:  # alert rules evaluated, and the load-failure alert firing (bounded)
                rules = prom_get(port, "/api/v1/rules")["data"]["groups"]
                rs = [r for g in rules for r in g["rules"]]
                firing = {(r["name"], a["labels"].get("model"), a["state"])
                          for r in rs for a in r.get("alerts", [])}
                evaluated = rs and all(r.get("lastEvaluation", "").startswith("20") for r in rs)
                if evaluated and ("IkboModelLoadFailed", "broken", "firing") in firing:
                    break
                if time.time() - t0 > 30:
                    break
                time.sleep(0.2)
            for r in rs:
                if r.get("health") != "ok":
                    problems.append("rule %s: health %s: %s" % (r["name"], r.get("health"), r.get("lastError")))
            if ("IkboModelLoadFailed", "broken", "firing") not in firing:
                problems.append("IkboModelLoadFailed is not firing for model 'broken': %s" % sorted(firing))
            assert not problems, "\n".join(problems)
            return ("%d queries evaluated by Prometheus (%d with data), %d alert rules healthy, "
                    "firing: %s" % (len(queries), with_data, len(rs),
                                    sorted({n for n, _m, st in firing if st == "firing"})))
        finally:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            log.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    r = dc.Runner("test_deploy_metrics")
    try:
        setup()
        r.check("dashboard, alert, adapter and HPA metric names are exported", check_names_exported)
        r.check("promtool check metrics on a real scrape", check_promtool_metrics)
        r.check("promtool test rules deploy/prometheus/ikbo-alerts_test.yml", check_promtool_test_rules)
        r.check("real Prometheus evaluates every query and rule against the daemon", check_real_prometheus)
    except Exception:
        import traceback
        traceback.print_exc()
        r.failed += 1
    finally:
        d = getattr(S, "d", None)
        if d is not None:
            if r.failed:
                print("--- daemon log (tail)\n" + d.logs()[-3000:])
            d.cleanup()
        if getattr(S, "repo", None):
            shutil.rmtree(S.repo, ignore_errors=True)
    r.finish()


if __name__ == "__main__":
    main()
