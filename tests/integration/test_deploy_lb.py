#!/usr/bin/python3
"""Scale-out behind a real gRPC load balancer: two ikbo-serve replicas on
loopback behind Debian's HAProxy and, separately, Debian's nginx, each
configured by deploy/lb/render.sh from its template in deploy/lb/, and a
grpcio client using deploy/lb/client_service_config.json (round_robin,
retry UNAVAILABLE and CANCELLED: Rank is idempotent).

HAProxy (the recommended balancer; it health-checks /readyz):
  - the rendered config passes `haproxy -c`; health answers SERVING through it;
  - a few hundred Rank calls all succeed, one score per candidate, and both
    replicas' /metrics count OK calls that add up to the calls made;
  - one replica gets SIGTERM mid-run with no warning to the balancer: no call
    fails, it exits 0, every call issued after it exited is served by the
    other replica; the balancer's log says how many answers were retried;
  - with no replica left the client gets UNAVAILABLE at once.
nginx (no active health checks in open-source nginx):
  - `nginx -t`, health, calls reach both replicas as above;
  - rolling restart the way nginx needs it: re-render without the replica,
    `nginx -s reload`, then SIGTERM it mid-run: no call fails, the rest go to
    the other replica;
  - with no replica left nginx answers grpc-status 14 from its error_page.

The balancers run as children of this test with temporary files (no system
service). A balancer that is not installed is skipped with a message.
"""
import collections
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deploy_common as dc  # noqa: E402

import grpc  # noqa: E402

LB = os.path.join(dc.DEPLOY, "lb")
N_WARM = 300      # calls with both replicas up
DRAIN_AT = 100    # calls completed before replica A is stopped
AFTER_EXIT = 40   # calls issued after A exited, before the drain run ends
CONCURRENCY = 8


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def render(kind, listen, replicas):
    """deploy/lb/render.sh output for these Daemons."""
    specs = ["127.0.0.1:%d:%d" % (d.grpc_port, d.http_port) for d in replicas]
    return dc.run(["sh", os.path.join(LB, "render.sh"), kind, "--listen", listen,
                   "--workers", "2"] + specs).stdout


def wait_port(port, proc, what, timeout=10):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise AssertionError("%s exited %d" % (what, proc.returncode))
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError("%s did not listen on port %d" % (what, port))


class Balancer:
    """A balancer process on a temp dir: start(), log(), stop()."""

    def __init__(self, kind, replicas):
        self.kind = kind
        self.exe = dc.which(kind)
        self.dir = tempfile.mkdtemp(prefix="ikbo-%s-" % kind)
        os.chmod(self.dir, 0o755)  # nginx workers run as nobody when we are root
        self.port = free_port()
        self.addr = "127.0.0.1:%d" % self.port
        self.conf = os.path.join(self.dir, "nginx.conf" if kind == "nginx" else "haproxy.cfg")
        self.write_conf(replicas)
        self.proc = None
        self.stderr_path = os.path.join(self.dir, "stderr.log")

    def write_conf(self, replicas):
        with open(self.conf, "w") as f:
            f.write(render(self.kind, self.addr, replicas))

    def check_config(self):
        if self.kind == "nginx":
            for d in ("logs", "tmp"):
                os.makedirs(os.path.join(self.dir, d), exist_ok=True)
            p = dc.run([self.exe, "-t", "-p", self.dir, "-c", self.conf, "-e", "stderr"])
        else:
            p = dc.run([self.exe, "-c", "-f", self.conf])
        return ((p.stderr + p.stdout).strip().splitlines() or ["ok"])[-1]

    def start(self):
        if self.kind == "nginx":
            cmd = [self.exe, "-p", self.dir, "-c", self.conf, "-e", "stderr", "-g", "daemon off;"]
        else:
            cmd = [self.exe, "-f", self.conf, "-db"]
        self.err = open(self.stderr_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.err, stderr=subprocess.STDOUT)
        wait_port(self.port, self.proc, self.kind)

    def reload(self, replicas):
        """New replica list: nginx re-reads its config on SIGHUP, old workers
        finish their calls."""
        self.write_conf(replicas)
        dc.run([self.exe, "-t", "-p", self.dir, "-c", self.conf, "-e", "stderr"])
        self.proc.send_signal(signal.SIGHUP)

    def calls(self):
        """[(servers tried, grpc-status seen in the headers or "")] per Rank
        call in log order. HAProxy: the server name (replicaN), a header
        status only for trailers-only answers. nginx: the addresses tried
        and the final grpc-status (header or trailer)."""
        out = []
        if self.kind == "nginx":
            with open(os.path.join(self.dir, "logs", "access.log")) as f:
                for line in f:
                    m = re.search(r"Rank status=(\d+) upstream=(.*) upstream_status=.* "
                                  r"grpc_status=(\S*) grpc_trailer=(\S*) rt=", line)
                    if m:
                        tried = [x.strip() for x in m.group(2).split(",")]
                        gs = m.group(4) if m.group(4) != "-" else m.group(3)
                        if m.group(1) != "200":
                            gs = "http-" + m.group(1)
                        out.append((tried, gs))
        else:
            with open(self.stderr_path) as f:
                for line in f:
                    # ... ikbo_grpc ikbo_replicas/replica1 0/0/0/1/1 200 123 - - ---- ... {14} "POST ...Rank..."
                    m = re.search(r" ikbo_replicas/(\S+) \S+ (\d+) .* \{([^}]*)\} \"POST \S*/Rank ", line)
                    if m:
                        gs = m.group(3) if m.group(2) == "200" else "http-" + m.group(2)
                        out.append(([m.group(1)], gs))
        return out

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT if self.kind == "nginx" else signal.SIGUSR1)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc:
            self.err.close()

    def cleanup(self):
        self.stop()
        if not os.environ.get("IKBO_KEEP"):
            shutil.rmtree(self.dir, ignore_errors=True)

    def logs(self):
        text = ""
        for p in (self.stderr_path, os.path.join(self.dir, "logs", "error.log")):
            if os.path.exists(p):
                text += open(p).read()[-4000:]
        return text


def channel(addr, retries=True):
    with open(os.path.join(LB, "client_service_config.json")) as f:
        sc = json.load(f)
    opts = [("grpc.enable_retries", 1 if retries else 0)]
    if retries:
        opts.append(("grpc.service_config", json.dumps(sc)))
    return grpc.insecure_channel(addr, options=opts)


def rank_stub(ch):
    R = dc.pb()
    return ch.unary_unary("/ikbo.v1.Ranker/Rank", request_serializer=R.RankRequest.SerializeToString,
                          response_deserializer=R.RankResponse.FromString)


def run_calls(call, reqs, n=None, until=None, on_done=None, limit_s=120):
    """Rank calls over CONCURRENCY threads: n of them, or, with until, as
    many as it takes for until() to hold (checked before each call is
    issued; bounded by limit_s, past which the test fails naming what it
    waited for). on_done(count) runs after each completed call. Returns
    (calls issued, [(index, code, detail)] of the failures)."""
    failures = []
    lock = threading.Lock()
    state = {"issued": 0, "done": 0, "stop": False}
    t_end = time.time() + limit_s

    def next_index():
        with lock:
            if state["stop"]:
                return None
            if (n is not None and state["issued"] >= n) or (until is not None and until()):
                state["stop"] = True
                return None
            if time.time() > t_end:
                state["stop"] = True
                raise AssertionError("%s not reached in %d s (%d calls issued)" % (
                    getattr(until, "__doc__", None) or "the call count", limit_s, state["issued"]))
            state["issued"] += 1
            return state["issued"] - 1

    def one(i):
        req = reqs[i % len(reqs)]
        try:
            resp = call(req)
            assert len(resp.scores) == len(req.candidates), \
                "call %d: %d scores for %d candidates" % (i, len(resp.scores), len(req.candidates))
            assert resp.model == "demo"
        except grpc.RpcError as e:
            with lock:
                failures.append((i, e.code().name, e.details()))
        with lock:
            state["done"] += 1
            c = state["done"]
        if on_done:
            on_done(c)

    def worker():
        while True:
            i = next_index()
            if i is None:
                return
            one(i)

    with ThreadPoolExecutor(CONCURRENCY) as ex:
        for f in [ex.submit(worker) for _ in range(CONCURRENCY)]:
            f.result()
    return state["issued"], failures


class Scenario:
    """Two replicas and one balancer in front of them."""

    def __init__(self, kind):
        self.kind = kind
        repo, vdir = dc.model_repo()
        self.a = self.b = self.lb = None
        try:
            self.a = dc.Daemon(repo, {"drain_timeout_ms": 5000})
            self.b = dc.Daemon(repo, {"drain_timeout_ms": 5000})
            self.a.wait_ready()
            self.b.wait_ready()
            self.lb = Balancer(kind, [self.a, self.b])
        except BaseException:
            self.cleanup(True)
            raise
        # Requests big enough that calls are in flight when SIGTERM lands.
        self.reqs = [dc.make_request(vdir, seed, users=8, cands_per_user=24) for seed in range(16)]
        # Server names in the balancer's log.
        if kind == "nginx":
            self.name = {self.a.grpc_addr: "A", self.b.grpc_addr: "B"}
        else:
            self.name = {"replica1": "A", "replica2": "B"}

    def cleanup(self, failed):
        for label, d in (("A", self.a), ("B", self.b)):
            if d is not None:
                if failed:
                    print("--- replica %s log (tail)\n%s" % (label, d.logs()[-2500:]))
                d.cleanup()
        if self.lb is not None:
            if failed:
                print("--- %s log (tail)\n%s" % (self.kind, self.lb.logs()))
            self.lb.cleanup()

    # ---- checks

    def check_config_and_start(self):
        note = self.lb.check_config()
        self.lb.start()
        return note

    def check_health(self):
        H = dc.hpb()
        ch = channel(self.lb.addr)
        check = ch.unary_unary("/grpc.health.v1.Health/Check",
                               request_serializer=H.HealthCheckRequest.SerializeToString,
                               response_deserializer=H.HealthCheckResponse.FromString)
        t0 = time.time()
        while True:  # HAProxy may still be running its first health checks
            try:
                for svc in ("", "demo"):
                    r = check(H.HealthCheckRequest(service=svc), timeout=5)
                    assert r.status == H.HealthCheckResponse.SERVING, "Check(%r) = %s" % (svc, r.status)
                break
            except grpc.RpcError:
                if time.time() - t0 > 5:
                    raise
                time.sleep(0.1)
        ch.close()

    def check_both_serve(self):
        a0, b0 = self.a.ok_requests(), self.b.ok_requests()
        ch = channel(self.lb.addr)
        stub = rank_stub(ch)
        _, fails = run_calls(lambda r: stub(r, timeout=20), self.reqs, n=N_WARM)
        ch.close()
        assert not fails, "%d of %d calls failed, first: %s" % (len(fails), N_WARM, fails[:3])
        da, db = self.a.ok_requests() - a0, self.b.ok_requests() - b0
        assert da > 0 and db > 0, "replica OK counts: A +%d, B +%d" % (da, db)
        assert da + db == N_WARM, "replicas counted %d OK calls, client made %d" % (da + db, N_WARM)
        return "%d calls OK; replica A served %d, replica B %d" % (N_WARM, da, db)

    def check_stop_a_mid_run(self, before_sigterm=None):
        """Calls until replica A has exited and AFTER_EXIT calls were issued
        after that (bounded in time, never a fixed count: how long the drain
        takes depends on the machine); after DRAIN_AT of them completed,
        before_sigterm() (if any) then SIGTERM to replica A."""
        b0 = self.b.ok_requests()
        log0 = len(self.lb.calls())
        ch = channel(self.lb.addr)
        stub = rank_stub(ch)
        fired = threading.Event()
        lock = threading.Lock()
        after_exit = [0]

        def on_done(count):
            if count >= DRAIN_AT and not fired.is_set():
                with lock:
                    if fired.is_set():
                        return
                    fired.set()
                if before_sigterm:
                    before_sigterm()
                self.a.proc.send_signal(signal.SIGTERM)

        def call(req):
            if self.a.proc.poll() is not None:
                with lock:
                    after_exit[0] += 1
            return stub(req, timeout=20)

        def enough():
            return after_exit[0] >= AFTER_EXIT
        enough.__doc__ = "replica A's exit followed by %d calls" % AFTER_EXIT

        t0 = time.time()
        n_calls, fails = run_calls(call, self.reqs, until=enough, on_done=on_done)
        took = time.time() - t0
        ch.close()
        rc = self.a.stop(timeout=15)
        assert not fails, "%d of %d calls failed across the drain, first: %s" % (
            len(fails), n_calls, fails[:5])
        assert rc == 0, "stopped replica exited %s" % rc
        alog = self.a.logs()
        assert " draining " in alog and " drained " in alog, "replica A log shows no drain"
        m = re.search(r" drained (\S+)", alog)
        drain = m.group(1) if m else "?"
        db = self.b.ok_requests() - b0
        assert after_exit[0] > 0, "no call was issued after replica A exited: test too short"
        assert db >= after_exit[0], "%d calls issued after A exited, B served only %d" % (
            after_exit[0], db)

        ok = collections.Counter()
        retried = collections.Counter()
        moved = 0
        for tried, gs in self.lb.calls()[log0:]:
            who = self.name.get(tried[-1], tried[-1])
            if len(tried) > 1:
                moved += 1
            if gs in ("", "0"):
                ok[who] += 1
            else:
                retried["%s from %s" % (gs, who)] += 1
        assert ok["A"] + ok["B"] == n_calls, "%s logged %d OK calls (%s), client made %d" % (
            self.kind, ok["A"] + ok["B"], dict(ok), n_calls)
        assert ok["B"] == db, "%s says B answered %d OK, B's /metrics says %d" % (self.kind, ok["B"], db)
        return ("%d calls OK in %.1fs across SIGTERM of replica A (exit 0, drain %s); A served %d, "
                "B %d; %d calls issued after A exited, all served by B; %d moved to the other "
                "replica by the balancer; answers the client retried: %s"
                % (n_calls, took, drain, ok["A"], ok["B"], after_exit[0], moved,
                   ", ".join("%s x%d" % kv for kv in sorted(retried.items())) or "none"))

    def nginx_take_out_a(self):
        """Re-render without replica A, reload nginx, and wait until calls go
        to B only (old workers finish their calls and close the client's
        connection; the client reconnects to the new workers)."""
        n0 = len(self.lb.calls())
        self.lb.reload([self.b])
        t0 = time.time()
        while time.time() - t0 < 10:
            recent = self.lb.calls()[n0:]
            if len(recent) >= 20 and all(self.name.get(t[-1]) == "B" for t, _ in recent[-20:]):
                return
            time.sleep(0.02)
        raise AssertionError("nginx still sends calls to replica A 10 s after the reload")

    def check_no_replica_left(self):
        self.b.stop(timeout=15)
        time.sleep(0.5)  # HAProxy: let a health check see it
        ch = channel(self.lb.addr, retries=False)
        t0 = time.time()
        try:
            rank_stub(ch)(self.reqs[0], timeout=10)
            raise AssertionError("Rank succeeded with no replica running")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.UNAVAILABLE, "got %s: %s" % (e.code(), e.details())
            detail = e.details()
        finally:
            ch.close()
        if self.kind == "nginx":
            assert "load balancer" in (detail or ""), "not nginx's error_page: %r" % detail
        return "UNAVAILABLE in %.2fs: %s" % (time.time() - t0, detail)


def scenario(r, kind):
    if not dc.which(kind):
        r.skipped += 1
        print("SKIP %s: %s is not installed (Debian package %s; `make deps` installs it as root)"
              % (kind, kind, kind))
        return
    s = None
    failed0 = r.failed
    try:
        s = Scenario(kind)
        if not r.check("%s: config check, started" % kind, s.check_config_and_start):
            return
        if not r.check("%s: grpc.health.v1 Check through the balancer" % kind, s.check_health):
            return
        r.check("%s: %d Rank calls reach both replicas" % (kind, N_WARM), s.check_both_serve)
        if kind == "haproxy":
            r.check("haproxy: SIGTERM to one replica mid-run, no call fails", s.check_stop_a_mid_run)
        else:
            r.check("nginx: rolling restart (drop replica from upstream, reload, SIGTERM) mid-run, "
                    "no call fails", s.check_stop_a_mid_run, s.nginx_take_out_a)
        r.check("%s: no replica left, UNAVAILABLE" % kind, s.check_no_replica_left)
    except Exception:  # setup failed
        import traceback
        traceback.print_exc()
        r.failed += 1
    finally:
        if s is not None:
            s.cleanup(r.failed > failed0)


def main():
    r = dc.Runner("test_deploy_lb")
    scenario(r, "haproxy")
    scenario(r, "nginx")
    if r.passed == 0 and r.failed == 0:
        print("test_deploy_lb: neither haproxy nor nginx could be run; nothing was checked")
    r.finish()


if __name__ == "__main__":
    main()
