#!/usr/bin/python3
"""Hostile input on the gRPC endpoint: oversized request metadata.

The daemon's batcher is held: a batch closes only at BATCH candidates (or
after 10 s), so a 15-candidate request stays queued, in flight, until the
test sends the candidates that fill the batch. That makes "calls in flight on
the connection" a condition the test sets up, not timing it hopes for; a
75-candidate request is a batch by itself and is answered at once."""
import time

import grpc

from ikbo_itest import Daemon, check, check_eq, make_request, metric, model_repo, run, to_proto

REPO, DIRS = model_repo()
DEMO = DIRS["demo"]
BATCH = 75
HELD = {"max_batch_candidates": BATCH, "max_batch_users": 100000, "max_queue_delay_us": 10000000}
D = Daemon(REPO, batching=HELD)


def small(seed):
    """15 candidates: waits in the held queue."""
    return to_proto(make_request(DEMO, users=3, cands_per_user=5, seed=seed))


def full(seed):
    """BATCH candidates: a batch by itself, answered at once."""
    return to_proto(make_request(DEMO, users=3, cands_per_user=BATCH // 3, seed=seed))


def wait_until(cond, what, timeout=20):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError("timed out after %ds waiting for %s" % (timeout, what))


def queued():
    return metric(D.metrics(), "ikbo_queue_requests", model="demo")


# ---------------------------------------------------------------- metadata

def test_metadata_over_limit_fails_alone():
    """16 KiB of metadata on one call of a channel carrying 4 others in flight:
    that call alone gets RESOURCE_EXHAUSTED naming the limit; the others and
    the next call on the same channel are answered OK."""
    ch = grpc.insecure_channel("127.0.0.1:%d" % D.grpc_port)
    try:
        stub = D.rank_stub(ch)
        stub(full(1), timeout=20)  # the connection is up
        inflight = [stub.future(small(10 + i), timeout=60) for i in range(4)]
        wait_until(lambda: queued() == 4, "4 calls queued")
        big = stub.future(small(20), metadata=[("x-big", "a" * 16384)], timeout=60)
        err = big.exception(timeout=30)
        check(err is not None, "16 KiB of metadata was accepted")
        check_eq(err.code(), grpc.StatusCode.RESOURCE_EXHAUSTED, "oversized metadata")
        check("limits.max_metadata_bytes" in err.details() and "8192" in err.details(),
              err.details())
        check_eq(queued(), 4.0, "calls still queued after the refusal")
        ended = [f for f in inflight if f.done()]
        check(not ended, "in-flight calls ended with the refusal: %r" % [f.exception() for f in ended])
        # 6 KiB is under the limit; its 15 candidates fill the batch.
        nxt = stub(small(30), metadata=[("x-ok", "b" * 6000)], timeout=30)
        check_eq(len(nxt.scores), 15, "next call's scores")
        for f in inflight:
            check_eq(len(f.result(timeout=30).scores), 15, "in-flight call's scores")
    finally:
        ch.close()
    wait_until(lambda: queued() == 0, "queue empty")


def test_metadata_limit_configurable():
    """limits.max_metadata_bytes above core's default 8 KiB: 16 KiB passes
    (core's own limit is set above ours), 40 KiB is refused by the daemon."""
    with Daemon(REPO, limits={"max_metadata_bytes": 32768}) as d:
        r = d.rank_stub()(full(2), metadata=[("x-big", "a" * 16384)], timeout=20)
        check_eq(len(r.scores), BATCH, "16 KiB under a 32 KiB limit")
        try:
            d.rank_stub()(full(2), metadata=[("x-big", "a" * 40000)], timeout=20)
            raise AssertionError("40 KiB of metadata was accepted")
        except grpc.RpcError as e:
            check_eq(e.code(), grpc.StatusCode.RESOURCE_EXHAUSTED, "40 KiB")
            check("32768" in e.details(), e.details())
        check_eq(len(d.rank(full(3), timeout=20).scores), BATCH, "next call")


if __name__ == "__main__":
    run([test_metadata_over_limit_fails_alone, test_metadata_limit_configurable], daemon=D,
        repo=REPO)
