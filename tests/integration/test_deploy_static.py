#!/usr/bin/python3
"""Static checks of deploy/ with the real tools, plus the daemon accepting
every config file deploy/ ships.

  - yamllint (deploy/yamllint.yaml) on every YAML file under deploy/;
  - Kubernetes: `kubectl kustomize deploy/k8s` renders the kustomization and
    `kubectl label --local` decodes every object (kubectl's client side,
    offline: no cluster, so no server-side schema validation), every YAML
    file in deploy/k8s is in the kustomization, and the objects agree with
    each other and with the daemon: one GPU per pod, gRPC probes on the
    gRPC port for a served model, grace period >= preStop + drain timeout,
    config from the ConfigMap, models from a volume, selectors that select;
  - every shipped server.json (ConfigMap, Docker, systemd) starts the real
    daemon (addresses, model repository and device overridden by flags);
  - promtool check config / check rules on deploy/prometheus;
  - systemd-analyze verify on deploy/systemd/ikbo-serve.service and its
    hardening and stop/reload settings;
  - the Dockerfile: CUDA devel and runtime stages, COPY sources exist and are
    not excluded by its .dockerignore, non-root USER, EXPOSE and HEALTHCHECK
    match its server.json, the make targets it runs exist; `docker build
    --check` only where a Docker engine answers;
  - the Grafana dashboard is well-formed.
A missing tool is a SKIP that names the Debian package.
"""
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deploy_common as dc  # noqa: E402

import yaml  # noqa: E402

K8S = os.path.join(dc.DEPLOY, "k8s")
OFFLINE_ENV = dict(os.environ, KUBECONFIG=os.path.join(tempfile.gettempdir(), "ikbo-no-kubeconfig"))


# ---------------------------------------------------------------- yaml

def check_yamllint():
    tool = dc.need_tool("yamllint", "yamllint")
    p = dc.run([tool, "-f", "parsable", "-c", os.path.join(dc.DEPLOY, "yamllint.yaml"), dc.DEPLOY])
    assert not p.stdout.strip(), "yamllint:\n" + p.stdout
    files = [os.path.join(d, f) for d, _, fs in os.walk(dc.DEPLOY) for f in fs
             if f.endswith((".yaml", ".yml"))]
    return "%d YAML files clean" % len(files)


# ---------------------------------------------------------------- kubernetes

def k8s_objects():
    with open(os.path.join(K8S, "kustomization.yaml")) as f:
        kust = yaml.safe_load(f)
    objs = []
    for r in kust["resources"]:
        with open(os.path.join(K8S, r)) as f:
            objs += [o for o in yaml.safe_load_all(f) if o]
    return kust, objs


def one(objs, kind, name=None):
    found = [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, "expected one %s %s, found %d" % (kind, name or "", len(found))
    return found[0]


def check_kubectl():
    tool = dc.need_tool("kubectl", "kubernetes-client")
    kust, objs = k8s_objects()
    listed = set(kust["resources"])
    on_disk = {f for f in os.listdir(K8S) if f.endswith((".yaml", ".yml")) and f != "kustomization.yaml"}
    assert on_disk == listed, "deploy/k8s files not in kustomization.yaml: %s; listed but missing: %s" % (
        sorted(on_disk - listed), sorted(listed - on_disk))
    p = dc.run([tool, "kustomize", K8S], env=OFFLINE_ENV, timeout=60)
    rendered = [o for o in yaml.safe_load_all(p.stdout) if o]
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(p.stdout)
        path = f.name
    try:
        q = dc.run([tool, "label", "--local", "-f", path, "-o", "name", "ikbo-check=1"],
                   env=OFFLINE_ENV, timeout=60)
    finally:
        os.unlink(path)
    names = q.stdout.split()
    assert len(names) == len(objs) == len(rendered), "kubectl decoded %d objects, files hold %d: %s" % (
        len(names), len(objs), names)
    return "kustomize rendered and kubectl decoded %d objects: %s" % (len(names), " ".join(names))


def container_port(c, name):
    ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    assert name in ports, "container has no port named %s: %s" % (name, ports)
    return ports[name]


def listen_port(addr):
    return int(addr.rsplit(":", 1)[1])


def check_k8s_consistency():
    _, objs = k8s_objects()
    dep = one(objs, "Deployment")
    cm = one(objs, "ConfigMap")
    conf = json.loads(cm["data"]["server.json"])
    pod = dep["spec"]["template"]
    labels = pod["metadata"]["labels"]
    spec = pod["spec"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items(), "Deployment selector"
    assert len(spec["containers"]) == 1
    c = spec["containers"][0]
    res = c["resources"]
    for part in ("requests", "limits"):
        assert str(res[part].get("nvidia.com/gpu")) == "1", "nvidia.com/gpu %s must be 1: %s" % (part, res)
    assert "cpu" in res["requests"] and "memory" in res["requests"], "requests need cpu and memory"
    assert conf["device"].startswith("cuda"), "ConfigMap device %s on a GPU pod" % conf["device"]

    grpc_port = container_port(c, "grpc")
    http_port = container_port(c, "http")
    assert listen_port(conf["grpc_listen"]) == grpc_port, "grpc_listen vs container port"
    assert listen_port(conf["http_listen"]) == http_port, "http_listen vs container port"
    assert not conf["grpc_listen"].startswith("127."), "a pod must listen beyond loopback"
    for probe in ("readinessProbe", "livenessProbe"):
        g = c[probe].get("grpc")
        assert g, "%s must be a gRPC (grpc.health.v1) probe: %s" % (probe, c[probe])
        assert g["port"] == grpc_port, "%s port %s != gRPC port %d" % (probe, g["port"], grpc_port)
    served = conf.get("models") or ["demo"]
    assert c["readinessProbe"]["grpc"].get("service") in served, \
        "readiness must wait for a served model (%s), got %r" % (served, c["readinessProbe"]["grpc"].get("service"))

    # Termination: grace >= preStop + drain_timeout_ms + 2 s margin.
    pre = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
    pre_s = int(pre[1]) if len(pre) == 2 and pre[0] == "sleep" else 0
    drain_s = conf.get("drain_timeout_ms", 10000) / 1000.0
    grace = spec["terminationGracePeriodSeconds"]
    assert grace >= pre_s + drain_s + 2, "terminationGracePeriodSeconds %s < preStop %s + drain %s + 2" % (
        grace, pre_s, drain_s)

    # Config from the ConfigMap, at the path the args name; models from a volume.
    args = c.get("args", [])
    cfg_path = args[args.index("--config") + 1]
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    vols = {v["name"]: v for v in spec["volumes"]}
    cfg_vol = [n for n, v in vols.items() if v.get("configMap", {}).get("name") == cm["metadata"]["name"]]
    assert cfg_vol and os.path.join(mounts[cfg_vol[0]]["mountPath"], "server.json") == cfg_path, \
        "--config %s is not the ConfigMap's server.json" % cfg_path
    model_mount = [m for m in c["volumeMounts"] if m["mountPath"] == conf["model_repository"]]
    assert model_mount, "model_repository %s is not a mounted volume" % conf["model_repository"]
    mv = vols[model_mount[0]["name"]]
    assert "persistentVolumeClaim" in mv, "model repository volume is not a PVC: %s" % mv
    one(objs, "PersistentVolumeClaim", mv["persistentVolumeClaim"]["claimName"])

    sc = dict(spec.get("securityContext", {}), **c.get("securityContext", {}))
    assert sc.get("runAsNonRoot") is True and sc.get("runAsUser", 0) != 0, "must run as non-root"
    assert sc.get("allowPrivilegeEscalation") is False

    # Services select the pods; the headless one has no cluster IP.
    svcs = [o for o in objs if o["kind"] == "Service"]
    headless = [s for s in svcs if s["spec"].get("clusterIP") == "None"]
    regular = [s for s in svcs if s["spec"].get("clusterIP") != "None"]
    assert len(headless) == 1 and len(regular) == 1, "want one headless and one regular Service"
    for s in svcs:
        assert s["spec"]["selector"].items() <= labels.items(), "Service %s selects no pod" % s["metadata"]["name"]
        for p in s["spec"]["ports"]:
            container_port(c, p["targetPort"])
    assert [p["targetPort"] for p in headless[0]["spec"]["ports"]] == ["grpc"]

    hpa = one(objs, "HorizontalPodAutoscaler")
    ref = hpa["spec"]["scaleTargetRef"]
    assert (ref["kind"], ref["name"]) == ("Deployment", dep["metadata"]["name"])
    metrics = [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"]
    assert metrics == ["ikbo_inflight_requests"], "HPA metrics: %s" % metrics
    assert hpa["spec"]["minReplicas"] >= 2
    target = float([m["pods"]["target"]["averageValue"] for m in hpa["spec"]["metrics"]][0])
    # In flight includes queued requests: the target must stay well below what
    # admission control lets queue, or the HPA would only react to refusals.
    assert 0 < target < conf.get("batching", {}).get("max_queue_requests", 1024), \
        "HPA in-flight target %s must be below the queue limit" % target

    pdb = one(objs, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items(), "PDB selects no pod"

    sm = one(objs, "ServiceMonitor")
    sel = sm["spec"]["selector"]["matchLabels"]
    picked = [s for s in svcs if sel.items() <= s["metadata"].get("labels", {}).items()]
    assert picked == regular, "ServiceMonitor must select only the regular Service, got %s" % [
        s["metadata"]["name"] for s in picked]
    port_names = {p["name"] for p in regular[0]["spec"]["ports"]}
    for ep in sm["spec"]["endpoints"]:
        assert ep["port"] in port_names and ep["path"] == "/metrics"
    return ("GPU 1, gRPC probes on %d (readiness: model %r), grace %ss >= preStop %ss + drain %gs + 2s"
            % (grpc_port, c["readinessProbe"]["grpc"]["service"], grace, pre_s, drain_s))


# ---------------------------------------------------------------- configs

def shipped_configs():
    _, objs = k8s_objects()
    cm = one(objs, "ConfigMap")
    tmp = tempfile.mkdtemp(prefix="ikbo-cm-")
    cm_path = os.path.join(tmp, "server.json")
    with open(cm_path, "w") as f:
        f.write(cm["data"]["server.json"])
    return tmp, [("deploy/k8s/configmap.yaml", cm_path),
            ("deploy/docker/server.json", os.path.join(dc.DEPLOY, "docker", "server.json")),
            ("deploy/systemd/server.json", os.path.join(dc.DEPLOY, "systemd", "server.json"))]


def check_configs_start_daemon():
    repo, _ = dc.model_repo()
    notes = []
    tmp, configs = shipped_configs()
    try:
        for name, path in configs:
            d = dc.Daemon(repo, config_file=path)
            try:
                d.wait_ready()
                rc = d.stop()
                assert rc == 0, "%s: daemon exited %d after SIGTERM:\n%s" % (name, rc, d.logs())
            except Exception:
                print(d.logs())
                raise
            finally:
                d.cleanup()
            notes.append(name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return "ready and drained with " + ", ".join(notes)


# ---------------------------------------------------------------- prometheus

def check_promtool():
    tool = dc.need_tool("promtool", "prometheus")
    prom = os.path.join(dc.DEPLOY, "prometheus")
    a = dc.run([tool, "check", "config", os.path.join(prom, "prometheus.yml")])
    b = dc.run([tool, "check", "rules", os.path.join(prom, "ikbo-alerts.yml")])
    return " / ".join([x.strip() for x in a.stdout.splitlines() if "valid" in x][:1] +
                      [b.stdout.strip().splitlines()[-1].strip()])


# ---------------------------------------------------------------- systemd

def unit_settings(path):
    s = {}
    for line in open(path):
        line = line.strip()
        if line and not line.startswith(("#", ";", "[")) and "=" in line:
            k, v = line.split("=", 1)
            s.setdefault(k.strip(), []).append(v.strip())
    return s


def check_systemd():
    unit = os.path.join(dc.DEPLOY, "systemd", "ikbo-serve.service")
    s = unit_settings(unit)
    want = {"ProtectSystem": "strict", "NoNewPrivileges": "yes", "Restart": "on-failure",
            "KillSignal": "SIGTERM"}
    for k, v in want.items():
        assert s.get(k) == [v], "%s=%s expected, got %s" % (k, v, s.get(k))
    assert s.get("DynamicUser") == ["yes"] or s.get("User"), "DynamicUser=yes or a dedicated User="
    assert s.get("ExecReload") == ["/bin/kill -HUP $MAINPID"], s.get("ExecReload")
    exec_start = shlex.split(s["ExecStart"][0])
    cfg = exec_start[exec_start.index("--config") + 1]
    assert cfg == "/etc/ikbo-serve/server.json", cfg
    with open(os.path.join(dc.DEPLOY, "systemd", "server.json")) as f:
        conf = json.load(f)
    drain_s = conf.get("drain_timeout_ms", 10000) / 1000.0
    stop_s = float(s["TimeoutStopSec"][0].rstrip("s"))
    assert stop_s >= drain_s + 2, "TimeoutStopSec %s < drain %gs + 2s" % (stop_s, drain_s)

    tool = dc.need_tool("systemd-analyze", "systemd")
    with tempfile.TemporaryDirectory() as tmp:
        # verify wants ExecStart to exist: point it at the built binary.
        text = open(unit).read().replace("/usr/local/bin/ikbo-serve", dc.SERVE)
        copy = os.path.join(tmp, "ikbo-serve.service")
        with open(copy, "w") as f:
            f.write(text)
        p = subprocess.run([tool, "verify", copy], capture_output=True, text=True, timeout=60)
    out = "\n".join(line for line in (p.stdout + p.stderr).splitlines()
                    if "ikbo-serve.service" in line or "Unknown" in line or "rror" in line)
    assert p.returncode == 0 and not out, "systemd-analyze verify:\n%s%s" % (p.stdout, p.stderr)
    return "hardened, TimeoutStopSec %gs >= drain %gs + 2s; systemd-analyze verify clean" % (stop_s, drain_s)


# ---------------------------------------------------------------- docker

def dockerfile_instructions(path):
    out, cur = [], ""
    for raw in open(path):
        line = raw.rstrip("\n")
        if not cur and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if cur and line.lstrip().startswith("#"):
            continue
        if line.endswith("\\"):
            cur += line[:-1] + " "
            continue
        cur += line
        word, _, rest = cur.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        cur = ""
    return out


def dockerignore_patterns():
    p = os.path.join(dc.DEPLOY, "docker", "Dockerfile.dockerignore")
    return [x.strip() for x in open(p) if x.strip() and not x.startswith("#")]


def check_dockerfile():
    path = os.path.join(dc.DEPLOY, "docker", "Dockerfile")
    ins = dockerfile_instructions(path)
    args = {}
    for w, rest in ins:
        if w == "ARG" and "=" in rest:
            k, v = rest.split("=", 1)
            args[k] = v
    froms = [re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), r) for w, r in ins if w == "FROM"]
    assert len(froms) == 2, "want a build and a runtime stage: %s" % froms
    assert froms[0].startswith("nvidia/cuda:") and "-devel-" in froms[0] and " AS build" in froms[0], froms[0]
    assert froms[1].startswith("nvidia/cuda:") and "-runtime-" in froms[1], froms[1]
    ignore = dockerignore_patterns()
    copies = {}
    for w, rest in ins:
        if w != "COPY" or rest.startswith("--from"):
            continue
        parts = rest.split()
        for src in parts[:-1]:
            assert os.path.exists(os.path.join(dc.ROOT, src)), "COPY source %s does not exist" % src
            assert not any(src == p or src.startswith(p.rstrip("/") + "/") for p in ignore), \
                "COPY source %s is excluded by Dockerfile.dockerignore" % src
            copies[src] = parts[-1]
    assert "models/demo" in copies, "the demo model is not baked in"
    users = [r for w, r in ins if w == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root"), "final USER must be non-root: %s" % users
    with open(os.path.join(dc.DEPLOY, "docker", "server.json")) as f:
        conf = json.load(f)
    exposed = {int(p.split("/")[0]) for w, r in ins if w == "EXPOSE" for p in r.split()}
    want = {listen_port(conf["grpc_listen"]), listen_port(conf["http_listen"])}
    assert exposed == want, "EXPOSE %s != ports in server.json %s" % (sorted(exposed), sorted(want))
    hc = [r for w, r in ins if w == "HEALTHCHECK"]
    assert hc and "/healthz" in hc[0] and ":%d/" % listen_port(conf["http_listen"]) in hc[0], hc
    cmd = json.loads([r for w, r in ins if w == "CMD"][-1])
    cfg = cmd[cmd.index("--config") + 1]
    assert copies.get("deploy/docker/server.json") == cfg, "CMD --config %s is not the copied server.json" % cfg
    assert any(w == "VOLUME" and "/models" in r for w, r in ins), "no model repository VOLUME"
    assert conf["model_repository"] == "/models"
    stop = [r for w, r in ins if w == "STOPSIGNAL"]
    assert stop == ["SIGTERM"], stop
    # The make targets the build stage runs exist (make -n runs nothing).
    for target in ("deps-build", "build/ikbo-serve"):
        dc.run(["make", "-n", "-C", dc.ROOT, "CUDA=1", target], timeout=60)
    return "stages %s -> %s; ports %s; user %s" % (froms[0].split()[0], froms[1], sorted(exposed), users[-1])


def check_docker_lint():
    tool = dc.which("docker")
    if not tool:
        raise dc.Skip("no docker command here (no Docker engine runs on these machines); the "
                      "Dockerfile is checked statically above")
    p = subprocess.run([tool, "info"], capture_output=True, text=True, timeout=30)
    if p.returncode != 0:
        raise dc.Skip("no Docker engine answers here (`docker info` failed); the Dockerfile is "
                      "checked statically above")
    dc.run([tool, "build", "--check", "-f", os.path.join(dc.DEPLOY, "docker", "Dockerfile"), dc.ROOT],
           timeout=300)


# ---------------------------------------------------------------- grafana

def check_dashboard():
    with open(os.path.join(dc.DEPLOY, "grafana", "ikbo-serve.json")) as f:
        d = json.load(f)
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids)), "duplicate panel ids"
    n = 0
    for p in d["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, "panel %r wider than the grid" % p["title"]
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["targets"], "panel %r has no query" % p["title"]
        n += len(p["targets"])
    names = [v["name"] for v in d["templating"]["list"]]
    assert names[0] == "datasource" and {"job", "instance", "model"} <= set(names), names
    return "%d panels, %d queries" % (len(d["panels"]), n)


def main():
    r = dc.Runner("test_deploy_static")
    r.check("yamllint deploy/", check_yamllint)
    r.check("kubectl kustomize + offline decode of deploy/k8s", check_kubectl)
    r.check("Kubernetes objects agree with each other and the daemon", check_k8s_consistency)
    r.check("every shipped server.json starts the daemon", check_configs_start_daemon)
    r.check("promtool check config / rules", check_promtool)
    r.check("systemd unit settings and systemd-analyze verify", check_systemd)
    r.check("Dockerfile (static)", check_dockerfile)
    r.check("docker build --check", check_docker_lint)
    r.check("Grafana dashboard JSON", check_dashboard)
    r.finish()


if __name__ == "__main__":
    main()
