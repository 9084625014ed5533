#!/usr/bin/python3
"""Device faults, injected with IKBO_FAULT (kernels/fault.h), against the
real daemon:
  - an allocation that fails while a new model version loads: that version
    is FAILED with the backend's message, the previous version keeps
    serving, and the next version loads and serves;
  - a stream wait that fails mid-batch: exactly that call is answered
    INTERNAL, every later call is scored, the server stays ready, and
    /metrics counts the INTERNAL;
  - (CUDA only) a kernel launch that fails mid-batch: the same;
  - a device lost mid-batch (a fault that leaves it unusable, such as a
    CUDA kernel's illegal address): that call is answered UNAVAILABLE
    naming it, none after it is scored, and the server logs device_lost,
    drains and exits 3 so that its supervisor starts a new process;
  - a hung device (a stream wait that never returns): the watchdog finds
    the batch past batching.batch_timeout_ms and the process exits 3 at
    once (the hung call's client sees the connection go), also when a
    SIGTERM's drain has already begun (its teardown would wait on the hung
    batch for good);
  - a malformed IKBO_FAULT: every load fails naming it, /readyz says why.
On the CPU in `make test`; on the GPU machine with IKBO_TEST_DEVICE=cuda:0
(tests/gpu/run_faults.sh)."""
import contextlib
import os
import re
import shutil
import tempfile
import time

from ikbo_itest import ROOT, Daemon, check, check_eq, make_request, run, to_proto
from reload_common import version_state, wait_for

DEVICE = os.environ.get("IKBO_TEST_DEVICE", "cpu")
DEMO = os.path.join(ROOT, "models", "demo", "1")


def repo_with(*versions):
    repo = tempfile.mkdtemp(prefix="ikbo-faults-repo-")
    for v in versions:
        install(repo, v)
    return repo


def install(repo, version):
    """models/demo/1 as demo/<version>, atomically (copy beside, rename)."""
    tmp = os.path.join(repo, "demo", ".%d.incoming" % version)
    shutil.copytree(DEMO, tmp)
    os.rename(tmp, os.path.join(repo, "demo", str(version)))


@contextlib.contextmanager
def serving(fault, wait_ready=True, **cfg):
    """(repo, daemon): a repository with demo/1 and a daemon with
    IKBO_FAULT=fault in its environment only (and cfg in its config); the
    daemon's log tail is printed when the body fails, and both are cleaned
    up."""
    repo = repo_with(1)
    old = os.environ.get("IKBO_FAULT")
    os.environ["IKBO_FAULT"] = fault
    try:
        d = Daemon(repo, device=DEVICE, repository_poll_ms=100, wait_ready=wait_ready, **cfg)
    finally:
        if old is None:
            del os.environ["IKBO_FAULT"]
        else:
            os.environ["IKBO_FAULT"] = old
    try:
        yield repo, d
    except Exception:
        print(d.logs()[-4000:])
        raise
    finally:
        d.close()
        shutil.rmtree(repo, ignore_errors=True)


def request(seed):
    return to_proto(make_request(DEMO, users=2, cands_per_user=6, seed=seed))


def test_failed_load_keeps_previous_version():
    # Backend 1 is version 1; the second backend created (version 2's load)
    # fails its 2nd allocation; version 3's load is backend 3 and succeeds.
    with serving("alloc:2@2") as (repo, d):
        check_eq(d.rank(request(1)).model_version, 1, "version 1 serves")
        install(repo, 2)
        st = wait_for(lambda: version_state(d, "demo", 2) if (version_state(d, "demo", 2) or ("",))[0]
                      in ("FAILED", "READY") else None, 20, "version 2 to finish loading")
        check_eq(st[0], "FAILED", "version 2 state")
        check("injected by IKBO_FAULT" in st[1] and "out of" in st[1], "load message: %r" % st[1])
        # ... naming the weight whose upload failed: on the CPU every weight is
        # its own allocation, and demo's second is its second table (a GPU
        # sub-allocates weights from blocks, so its 2nd may be another one).
        check(DEVICE != "cpu" or "loading weights on cpu: tables.author: out of" in st[1],
              "load message does not name the weight: %r" % st[1])
        for seed in range(2, 6):
            check_eq(d.rank(request(seed)).model_version, 1, "version 1 still serves")
        check_eq(d.http("GET", "/readyz")[0], 200, "/readyz while version 2 failed")
        install(repo, 3)
        wait_for(lambda: version_state(d, "demo", 3) == ("READY", ""), 20, "version 3 READY")
        check_eq(d.rank(request(7)).model_version, 3, "version 3 serves")
        check_eq(d.stop(), 0, "exit status")


def internal_count(d):
    """ikbo_requests_total{model="demo",code="INTERNAL"} (a regex, not
    prometheus_client: the GPU machine runs this test too)."""
    code, body = d.http("GET", "/metrics")
    check_eq(code, 200, "/metrics")
    for line in body.decode().splitlines():
        if line.startswith("ikbo_requests_total{") and 'model="demo"' in line and \
                'code="INTERNAL"' in line:
            return float(re.split(r"\s+", line.strip())[-1])
    return 0.0


def one_failed_batch(fault):
    """Sequential calls (one batch each) on a daemon with `fault` armed on
    its only backend: exactly one INTERNAL naming the injection, every call
    after it scored. Batch graphs off: on CUDA a failed graph replay or
    recording falls back to running the batch normally (engine.c
    score_graphed), which succeeds, so with graphs on the failure would
    never reach a call."""
    with serving(fault, batching={"graphs": 0}) as (_, d):
        codes = []
        for seed in range(24):
            req = request(seed)
            try:
                resp = d.rank(req)
                check_eq(len(resp.scores), len(req.candidates), "scores")
                codes.append("OK")
            except Exception as e:  # grpc.RpcError
                code, detail = e.code().name, e.details()
                check_eq(code, "INTERNAL", "failed call's code")
                check("injected by IKBO_FAULT" in detail, "failed call's message: %r" % detail)
                codes.append(code)
        check_eq(codes.count("INTERNAL"), 1, "failed calls (%s)" % codes)
        check(codes.index("INTERNAL") < len(codes) - 1, "a call followed the failed one")
        check_eq(d.http("GET", "/readyz")[0], 200, "/readyz after the failed batch")
        check_eq(internal_count(d), 1, "ikbo_requests_total{code=\"INTERNAL\"}")
        check_eq(d.stop(), 0, "exit status")


def test_failed_stream_wait_fails_one_batch():
    # The load's warm-up batch waits once; the 8th wait is a request's.
    one_failed_batch("sync:8@1")


def test_failed_launch_fails_one_batch():
    if not DEVICE.startswith("cuda"):
        print("     (launch faults exist on CUDA only; IKBO_TEST_DEVICE=%s)" % DEVICE)
        return
    one_failed_batch("launch:40@1")


def exits_3(d, after, logged, t0):
    """The daemon exits by itself with status 3 (bounded wait: only a server
    that never exits fails it), its log holding every string of logged;
    prints how long after t0 (time.time()) it was gone (bench/RESULTS.md)."""
    try:
        rc = d.proc.wait(20)
    except Exception:
        raise AssertionError("the server did not exit within 20 s of %s:\n%s" % (after, d.logs()))
    print("     exit %.2f s after %s" % (time.time() - t0, after))
    check_eq(rc, 3, "exit status after %s" % after)
    logs = d.logs()
    missing = [s for s in logged if s not in logs]
    check(not missing, "not logged after %s: %s\n%s" % (after, missing, logs[-2000:]))


def test_lost_device_stops_the_server():
    # As sync:8@1, the 8th stream wait (the 7th request's) finds the device
    # lost; every later wait would too.
    with serving("lost:8@1") as (_, d):
        codes, detail, t_lost = [], None, None
        for seed in range(12):
            try:
                d.rank(request(seed), timeout=5)
                codes.append("OK")
            except Exception as e:  # grpc.RpcError
                codes.append(e.code().name)
                detail = detail or e.details()
                t_lost = t_lost or time.time()
        check_eq(codes[:7], ["OK"] * 6 + ["UNAVAILABLE"], "calls up to the lost one")
        check(all(c == "UNAVAILABLE" for c in codes[7:]), "calls after the loss: %s" % codes)
        check("the device is lost" in detail and "injected by IKBO_FAULT" in detail and
              "the server is stopping" in detail, "lost call's message: %r" % detail)
        exits_3(d, "a lost device", ("device_lost", "device lost", "exit 3"), t_lost)


def test_hung_device_exits():
    # The 8th stream wait (the 7th request's) never returns. The watchdog
    # looks once a second (the reaper's rounds), so the exit comes 0.3 to
    # ~1.3 s after the hang; the bounds below only catch a server that
    # never exits.
    with serving("hang:8@1", batching={"batch_timeout_ms": 300}) as (_, d):
        for seed in range(6):
            d.rank(request(seed), timeout=5)
        t_hung = time.time()
        try:
            d.rank(request(6), timeout=30)
            raise AssertionError("the hung call was answered")
        except AssertionError:
            raise
        except Exception as e:  # grpc.RpcError: the connection went with the process
            check_eq(e.code().name, "UNAVAILABLE", "the hung call's code (%s)" % e.details())
            print("     the hung call's error %.2f s after it was sent" % (time.time() - t_hung))
        exits_3(d, "a hung device", ("device_lost", "the device is hung", "exit 3 (device hung)"), t_hung)


def test_sigterm_while_hung_exits():
    # SIGTERM once the 7th call is in flight (it hangs whether the drain
    # finds it queued or computing: queued work is answered before the
    # batchers stop). The drain gives up on it after 300 ms; the watchdog
    # must still end the process once the batch is past 1.5 s.
    import signal
    from ikbo_itest import metric
    with serving("hang:8@1", batching={"batch_timeout_ms": 1500}, drain_timeout_ms=300) as (_, d):
        for seed in range(6):
            d.rank(request(seed), timeout=5)
        hung = d.rank_stub().future(request(6), timeout=30)
        wait_for(lambda: metric(d.metrics(), "ikbo_inflight_requests") >= 1, 10, "the 7th call in flight")
        t_term = time.time()
        d.proc.send_signal(signal.SIGTERM)
        exits_3(d, "SIGTERM with a hung batch", ("draining", "the device is hung", "exit 3 (device hung)"),
                t_term)
        check(hung.exception(timeout=10) is not None, "the hung call was answered")


def test_malformed_fault_spec():
    with serving("alloc:zero", wait_ready=False) as (_, d):
        st = wait_for(lambda: version_state(d, "demo", 1) if (version_state(d, "demo", 1) or ("",))[0]
                      == "FAILED" else None, 20, "version 1 FAILED")
        check("IKBO_FAULT: rule \"alloc:zero\"" in st[1], "message: %r" % st[1])
        code, body = d.http("GET", "/readyz")
        check_eq(code, 503, "/readyz")
        check_eq(d.stop(), 0, "exit status")


if __name__ == "__main__":
    run([test_failed_load_keeps_previous_version, test_failed_stream_wait_fails_one_batch,
         test_failed_launch_fails_one_batch, test_lost_device_stops_the_server,
         test_hung_device_exits, test_sigterm_while_hung_exits, test_malformed_fault_spec])
