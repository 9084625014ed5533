#!/usr/bin/python3
"""Integration test of build/echo_server, the transport floor bench/e2e/run.sh
measures ikbo-serve against (bench/e2e/echo_server.c).

    IKBO_BUILD=build IKBO_ROOT=. /usr/bin/python3 tests/integration/test_echo.py

Why: the floor is only a floor if the echo answers what ikbo-serve answers,
byte for byte in size, and if ikbo-loadgen accepts its answers. So, on the
CPU (the demo model; no GPU), with every wait bounded:
  1. flags: --help lists every flag; a missing or bad flag, an unreadable or
     unparsable --model-info exits 2 with one line naming it;
  2. ModelInfo: the echo answers the bytes it was given, verbatim, from a
     file (--model-info) or asked from ikbo-serve (--model-info-from);
  3. size: the same requests (ids as ikbo-loadgen makes them, request r of
     --distinct) to ikbo-serve and to the echo: the same response size, and
     the same model, version, tasks, ids, indices and unique_users; ours is
     the same size for the request's packed encoding;
  4. ikbo-loadgen: a short closed-loop run against the echo, packed and
     classic encoding, has only OK calls that pass its verification (one finite score per candidate); a run whose
     shape does not match --cands fails verification (exit 1), so the check
     is real;
  5. SIGTERM with calls in flight: exit 0 within a bounded time;
  6. --send-from thread (answers sent by one sender thread): the same
     answers, and the same clean exit under load;
  7. --answer-after-us N: the same, and no call answered sooner than N us
     after it was sent (the client's shortest latency); SIGTERM with calls
     still waiting for their time answers them and exits 0.
"""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ikbo_itest as it  # noqa: E402

sys.path.insert(0, os.path.join(it.ROOT, "tools"))
import rank_client  # noqa: E402  (to_packed: the packed encoding of a request)

ECHO = os.path.join(it.BUILD, "echo_server")
LOADGEN = os.path.join(it.BUILD, "ikbo-loadgen")
USERS, CANDS_PER_USER, DISTINCT = 2, 3, 4
WORK = tempfile.mkdtemp(prefix="ikbo-echo-")

repo, dirs = it.model_repo()
daemon = it.Daemon(repo)
state = {}


def raw_call(target, method, body, timeout=10):
    """The response bytes of one unary call, undecoded."""
    import grpc
    with grpc.insecure_channel(target) as ch:
        return ch.unary_unary(method)(body, timeout=timeout)


class Echo:
    """build/echo_server on a free port, its listening line awaited."""

    def __init__(self, *args, timeout=10):
        self.log_path = os.path.join(WORK, "echo-%d.log" % len(os.listdir(WORK)))
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen([ECHO, "--listen", "127.0.0.1:0"] + list(args),
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + timeout
        while time.time() < deadline:
            m = re.search(r"listening grpc=(\S+)", self.logs())
            if m:
                self.target = m.group(1)
                return
            if self.proc.poll() is not None:
                raise AssertionError("echo_server exited %d: %s" % (self.proc.returncode, self.logs()))
            time.sleep(0.02)
        self.proc.kill()
        raise AssertionError("echo_server not listening within %ds: %s" % (timeout, self.logs()))

    def logs(self):
        with open(self.log_path) as f:
            return f.read()

    def stop(self, timeout=10):
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError("echo_server did not exit within %ds of SIGTERM" % timeout)
        self.log.close()
        if rc != 0:  # what it said last, for the failure that follows
            sys.stderr.write("---- echo_server log (tail), exit %d ----\n%s\n"
                             % (rc, "\n".join(self.logs().splitlines()[-20:])))
        return rc


def echo_args(**over):
    a = {"--model-info": state["info_path"], "--cands": str(USERS * CANDS_PER_USER),
         "--users": str(USERS), "--distinct": str(DISTINCT), "--threads": "2"}
    a.update(over)
    return [x for k, v in a.items() if v is not None for x in (k, v)]


def test_model_info_file():
    body = it.pb.ModelInfoRequest(model="demo").SerializeToString()
    info = raw_call("127.0.0.1:%d" % daemon.grpc_port, "/ikbo.v1.Ranker/ModelInfo", body)
    state["info"] = info
    state["info_path"] = os.path.join(WORK, "model-info.pb")
    with open(state["info_path"], "wb") as f:
        f.write(info)
    d = it.pb.ModelInfoResponse.FromString(info).models
    it.check_eq([m.name for m in d], ["demo"], "models described")


def test_flags():
    out = subprocess.run([ECHO, "--help"], capture_output=True, text=True, timeout=10)
    it.check_eq(out.returncode, 0, "--help exit status")
    for flag in ("--listen", "--threads", "--model-info", "--model-info-from", "--model", "--cands",
                 "--tasks", "--users", "--distinct", "--max-message-bytes", "--send-from",
                 "--answer-after-us", "--help"):
        it.check(flag in out.stdout, "--help does not list %s" % flag)
    garbage = os.path.join(WORK, "garbage.pb")
    with open(garbage, "wb") as f:
        f.write(b"\xff\xff\xff\xff")
    bad = [([], "give one of --model-info FILE and --model-info-from ADDR"),
           (echo_args(**{"--model-info-from": "127.0.0.1:1"}), "give one of"),
           (["--model-info", state["info_path"]], "--cands N is required"),
           (echo_args(**{"--cands": "-1"}), "--cands: expected an integer"),
           (echo_args(**{"--threads": "0"}), "--threads: expected an integer"),
           (echo_args(**{"--bogus": "1"}), "unknown flag '--bogus'"),
           (echo_args(**{"--send-from": "nobody"}), "--send-from: expected worker or thread, got 'nobody'"),
           (echo_args(**{"--answer-after-us": "-1"}), "--answer-after-us: expected an integer 0..10000000"),
           (echo_args(**{"--answer-after-us": "5", "--send-from": "worker"}),
            "--answer-after-us: answers wait in the sender thread"),
           (echo_args(**{"--model-info": os.path.join(WORK, "absent.pb")}), "absent.pb: No such file"),
           (echo_args(**{"--model-info": garbage}), "not a serialized ikbo.v1.ModelInfoResponse"),
           (echo_args(**{"--model": "nosuch"}), "no model 'nosuch'"),
           (echo_args(**{"--listen": "256.1.1.1:1"}), "cannot listen on 256.1.1.1:1")]
    # gRPC core may log its own lines first; ours is the last, and the only one.
    for args, want in bad:
        out = subprocess.run([ECHO] + args, capture_output=True, text=True, timeout=10)
        lines = out.stderr.splitlines()
        ours = [x for x in lines if x.startswith("echo_server")]
        it.check(out.returncode == 2 and len(ours) == 1 and lines[-1] == ours[0] and want in ours[0],
                 "echo_server %s: want exit 2 and one line with %r, got %d: %r"
                 % (" ".join(args), want, out.returncode, out.stderr))
    readme = open(os.path.join(it.ROOT, "README.md")).read()
    for flag in ("--listen", "--threads", "--model-info", "--model-info-from", "--model", "--cands",
                 "--tasks", "--users", "--distinct", "--max-message-bytes", "--send-from",
                 "--answer-after-us"):
        it.check("`%s" % flag in readme, "README.md does not document echo_server %s" % flag)


def loadgen_like_request(r):
    """Request r of ikbo-loadgen's distinct set, as far as the answer's size
    goes: candidate i has id r * 10^7 + i."""
    req = it.make_request(dirs["demo"], users=USERS, cands_per_user=CANDS_PER_USER, seed=r + 1)
    req.pop("requestId")
    for i, c in enumerate(req["candidates"]):
        c["id"] = r * 10 ** 7 + i
    return it.to_proto(req).SerializeToString()


def test_same_size_as_ours():
    echo = Echo(*echo_args())
    from_daemon = Echo(*echo_args(**{"--model-info": None}), "--model-info-from",
                       "127.0.0.1:%d" % daemon.grpc_port, "--model", "demo")
    try:
        info = raw_call(echo.target, "/ikbo.v1.Ranker/ModelInfo", b"")
        it.check(info == state["info"], "ModelInfo: the echo's answer is not the --model-info bytes")
        info = raw_call(from_daemon.target, "/ikbo.v1.Ranker/ModelInfo", b"")
        it.check(info == state["info"], "ModelInfo: --model-info-from's answer is not the daemon's")
        it.check_eq(from_daemon.stop(), 0, "echo_server (--model-info-from) exit status")
        for r in range(DISTINCT):  # a fresh echo answers its responses in order
            body = loadgen_like_request(r)
            ours = raw_call("127.0.0.1:%d" % daemon.grpc_port, "/ikbo.v1.Ranker/Rank", body)
            got = raw_call(echo.target, "/ikbo.v1.Ranker/Rank", body)
            it.check_eq(len(got), len(ours), "request %d: response bytes (echo vs ikbo-serve)" % r)
            packed = rank_client.to_packed(rank_client.ranker_pb2.RankRequest.FromString(body))
            ours_packed = raw_call("127.0.0.1:%d" % daemon.grpc_port, "/ikbo.v1.Ranker/Rank",
                                   packed.SerializeToString())
            it.check_eq(len(ours_packed), len(ours), "request %d: response bytes (packed vs classic)" % r)
            o, e = it.pb.RankResponse.FromString(ours), it.pb.RankResponse.FromString(got)
            for f in ("model", "model_version", "tasks", "unique_users", "request_id"):
                it.check_eq(getattr(e, f), getattr(o, f), "request %d: %s" % (r, f))
            it.check_eq([(s.id, s.index, len(s.task_scores)) for s in e.scores],
                        [(s.id, s.index, len(s.task_scores)) for s in o.scores],
                        "request %d: (id, index, task scores) per score" % r)
        state["bytes"] = len(ours)
    finally:
        it.check_eq(echo.stop(), 0, "echo_server exit status")
    print("     %d-byte answers from both, %d users x %d candidates" % (state["bytes"], USERS, CANDS_PER_USER))


def loadgen(target, cands_per_user, duration="0.5", encoding="classic"):
    out = subprocess.run([LOADGEN, "--target", target, "--model", "demo", "--encoding", encoding,
                          "--users", str(USERS),
                          "--candidates", str(cands_per_user), "--distinct", str(DISTINCT),
                          "--concurrency", "2", "--warmup", "0", "--duration", duration,
                          "--connect-timeout-ms", "5000", "--json"],
                         capture_output=True, text=True, timeout=60)
    it.check(out.returncode in (0, 1), "ikbo-loadgen exit %d: %s" % (out.returncode, out.stderr))
    return out.returncode, json.loads(out.stdout)


def connected(port, pid):
    """Whether the network namespace of process pid has an established TCP
    connection to port (/proc/PID/net/tcp and tcp6: remote address, state
    01): loadgen's Rank channel is up (its ModelInfo channel came first)."""
    want = ":%04X" % port
    rows = []
    for table in ("tcp", "tcp6"):
        try:
            with open("/proc/%d/net/%s" % (pid, table)) as f:
                rows += [line.split() for line in f.readlines()[1:]]
        except OSError:
            pass
    return any(r[2].endswith(want) and r[3] == "01" for r in rows)


ANSWER_AFTER_US = 30000


def test_loadgen_accepts():
    for label, over in (("--send-from worker", {"--send-from": "worker"}),
                        ("--send-from thread", {"--send-from": "thread"}),
                        ("--answer-after-us %d" % ANSWER_AFTER_US, {"--answer-after-us": str(ANSWER_AFTER_US)})):
        codes, ok_per_s, min_ms = loadgen_run(label, over)
        print("     %s: %d OK calls, %.0f calls/s, shortest %.2f ms" % (label, codes["OK"], ok_per_s, min_ms))
        if "--answer-after-us" in over:
            it.check(min_ms >= ANSWER_AFTER_US / 1e3,
                     "--answer-after-us %d: a call was answered after %.3f ms" % (ANSWER_AFTER_US, min_ms))


def loadgen_run(label, over):
    echo = Echo(*echo_args(**over))
    min_ms = float("inf")
    try:
        for encoding in ("packed", "classic"):
            rc, j = loadgen(echo.target, CANDS_PER_USER, encoding=encoding)
            codes, ok_per_s = j["codes"], j["measured"]["ok_per_s"]
            it.check(rc == 0 and set(codes) == {"OK"} and codes["OK"] > 0,
                     "ikbo-loadgen --encoding %s against the echo (%s): exit %d, codes %r, "
                     "first error %r" % (encoding, label, rc, codes, j.get("first_error")))
            min_ms = min(min_ms, j["measured"]["latency_all_ms"]["min"])
        # One candidate per user more than --cands allows for: verification fails.
        rc, j = loadgen(echo.target, CANDS_PER_USER + 1, duration="0.2")
        it.check(rc == 1 and "verification" in (j.get("first_error") or ""),
                 "a shape that does not match --cands: want exit 1 and a verification error, got %d %r"
                 % (rc, j.get("first_error")))
        # SIGTERM while a client is connected and sending.
        lg = subprocess.Popen([LOADGEN, "--target", echo.target, "--model", "demo", "--users", str(USERS),
                               "--candidates", str(CANDS_PER_USER), "--concurrency", "8", "--warmup", "0",
                               "--duration", "30", "--connections", "1"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
        try:
            port = int(echo.target.rsplit(":", 1)[1])
            deadline = time.time() + 10
            while not connected(port, lg.pid):
                it.check(time.time() < deadline, "ikbo-loadgen did not connect to the echo within 10 s")
                time.sleep(0.02)
            it.check_eq(echo.stop(), 0, "echo_server exit status after SIGTERM under load")
        finally:
            lg.kill()
            lg.wait()
    finally:
        if echo.proc.poll() is None:
            echo.stop()
    return codes, ok_per_s, min_ms


if __name__ == "__main__":
    it.run([test_model_info_file, test_flags, test_same_size_as_ours, test_loadgen_accepts],
           daemon=daemon, repo=repo)
