#!/usr/bin/python3
"""Dynamic batching end to end: 32+ concurrent real gRPC clients (plus two
HTTP clients) for a few seconds against the CPU daemon. Every call gets its
own scores, bitwise equal to build/ikbo-score on the same request, or an
explicit status; /metrics shows batches that merged several requests and,
since users repeat across requests, fewer unique users per batch than the
requests brought. A second daemon with tiny batch limits chunks most
requests and must answer just as exactly.
"""
import collections
import json
import random
import threading
import time

import grpc

from ikbo_itest import (Daemon, check, check_eq, f32, make_request, metric, model_repo, pb, run,
                        score_offline, to_proto)

REPO, DIRS = model_repo()
DEMO = DIRS["demo"]
N_GRPC, N_HTTP, SECONDS = 32, 2, 3.0
MIN_CALLS = 200  # answered calls the hammer waits for past SECONDS on a slow machine
ALLOWED = {"RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED", "UNAVAILABLE"}


def build_requests():
    """24 requests over a pool of 2 shared users (same key and content in
    every request that has them); 7/8 of the requests have a single shared
    user, the others a shared user and one of their own. Expected scores
    from ikbo-score."""
    pool = make_request(DEMO, users=2, cands_per_user=1, seed=900, key_prefix="shared")["users"]
    reqs = []
    rng = random.Random(4)
    for i in range(24):
        own = make_request(DEMO, users=1, cands_per_user=rng.randrange(3, 40), seed=1000 + i,
                           key_prefix="own%d_" % i)
        if i % 8:
            users = [pool[i % 2]]
        else:
            users = [pool[i % 2]] + own["users"]
        cands = own["candidates"]
        for c in cands:
            c["user"] = rng.randrange(len(users))
        req = {"model": "demo", "users": users, "candidates": cands, "requestId": "b%d" % i}
        scores, task_scores = score_offline(DEMO, req)
        reqs.append((req, to_proto(req), scores, task_scores))
    return reqs


REQS = build_requests()


def check_response(resp, i):
    req, _, scores, task_scores = REQS[i]
    if len(resp.scores) != len(req["candidates"]):
        return "request %d: %d scores for %d candidates" % (i, len(resp.scores), len(req["candidates"]))
    for k, s in enumerate(resp.scores):
        if s.index != k or s.id != int(req["candidates"][k]["id"]):
            return "request %d: score %d is for index %d id %d" % (i, k, s.index, s.id)
        if f32(s.score) != f32(scores[k]) or \
                [f32(x) for x in s.task_scores] != [f32(x) for x in task_scores[k]]:
            return "request %d candidate %d: %r != offline %r" % (i, k, s.score, scores[k])
    if resp.request_id != req["requestId"]:
        return "request %d: request_id %r" % (i, resp.request_id)
    return None


def hammer(d):
    """Returns (Counter of codes, list of errors)."""
    codes, errors, lock = collections.Counter(), [], threading.Lock()
    t_min, t_max = time.time() + SECONDS, time.time() + SECONDS + 60

    def running():
        """At least SECONDS and MIN_CALLS answered calls (however slow the
        machine), at most SECONDS + 60."""
        now = time.time()
        with lock:
            n = sum(codes.values())
        return now < t_max and (now < t_min or n < MIN_CALLS)

    def grpc_client(t):
        ch = grpc.insecure_channel("127.0.0.1:%d" % d.grpc_port)
        stub = d.rank_stub(ch)
        rng = random.Random(t)
        while running():
            i = rng.randrange(len(REQS))
            try:
                err = check_response(stub(REQS[i][1], timeout=20), i)
                code = "OK" if err is None else "WRONG"
            except grpc.RpcError as e:
                code, err = e.code().name, None
                if code not in ALLOWED or not e.details():
                    err = "request %d: %s %r" % (i, code, e.details())
            with lock:
                codes[code] += 1
                if err:
                    errors.append(err)
        ch.close()

    def http_client(t):
        rng = random.Random(100 + t)
        while running():
            i = rng.randrange(len(REQS))
            status, body = d.http("POST", "/v1/models/demo:rank", REQS[i][0])
            err = None
            if status == 200:
                out = json.loads(body)
                _, _, scores, _ = REQS[i]
                got = [f32(s["score"]) for s in out["scores"]]
                if got != [f32(x) for x in scores]:
                    err = "HTTP request %d: scores differ from offline" % i
            elif status not in (429, 503, 504):
                err = "HTTP request %d: status %d %r" % (i, status, body[:200])
            with lock:
                codes["HTTP_%d" % status] += 1
                if err:
                    errors.append(err)

    ts = [threading.Thread(target=grpc_client, args=(t,)) for t in range(N_GRPC)] + \
         [threading.Thread(target=http_client, args=(t,)) for t in range(N_HTTP)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(SECONDS + 90)
        check(not t.is_alive(), "a client hung")
    return codes, errors


def hist(m, name, model="demo"):
    """(count, sum, {le: cumulative count}) of a histogram series."""
    buckets = {dict(k[1])["le"]: v for k, v in m.items()
               if k[0] == name + "_bucket" and dict(k[1]).get("model") == model}
    return metric(m, name + "_count", model=model), metric(m, name + "_sum", model=model), buckets


def delta_hist(m0, m1, name):
    c0, s0, b0 = hist(m0, name)
    c1, s1, b1 = hist(m1, name)
    return c1 - c0, s1 - s0, {le: b1[le] - b0.get(le, 0) for le in b1}


def run_daemon(batching, label):
    d = Daemon(REPO, threads=4, batching=batching)
    try:
        m0 = d.metrics()
        codes, errors = hammer(d)
        m1 = d.metrics()
        ok = codes["OK"] + codes["HTTP_200"]
        print("  %s: codes %s" % (label, dict(codes)))
        check_eq(errors[:5], [], "wrong answers or unexpected statuses")
        check(ok > 50, "enough answered calls (%d)" % ok)
        check(codes["OK"] >= 0.9 * sum(v for k, v in codes.items() if not k.startswith("HTTP")),
              "most gRPC calls answered OK: %s" % dict(codes))
        n_b, n_req, req_b = delta_hist(m0, m1, "ikbo_batch_requests")
        _, n_users, _ = delta_hist(m0, m1, "ikbo_batch_users")
        _, n_cands, _ = delta_hist(m0, m1, "ikbo_batch_candidates")
        req_users = metric(m1, "ikbo_request_unique_users_sum") - metric(m0, "ikbo_request_unique_users_sum")
        req_ok = metric(m1, "ikbo_requests_total", model="demo", code="OK") - \
            metric(m0, "ikbo_requests_total", model="demo", code="OK")
        merged = n_b - req_b.get("1", req_b.get("1.0", 0))
        print("  %s: %d batches, %d request slots (%.2f per batch, %d batches merged >1), "
              "%d batch users vs %d request users, %.1f candidates per batch"
              % (label, n_b, n_req, n_req / max(n_b, 1), merged, n_users, req_users,
                 n_cands / max(n_b, 1)))
        check_eq(req_ok, ok, "server OK count == client OK count")
        return n_b, n_req, merged, n_users, req_users
    finally:
        d.close()


def test_default_limits():
    n_b, n_req, merged, n_users, req_users = run_daemon({"max_queue_delay_us": 2000}, "defaults")
    check(merged > 0, "batches merged more than one request")
    check(n_req > n_b, "more requests than batches")
    check(n_users < req_users, "cross-request dedup: %d batch users < %d request users"
          % (n_users, req_users))
    check(n_users < n_req, "users repeat: fewer unique users (%d) than requests (%d) in batches"
          % (n_users, n_req))


def test_tiny_limits_chunk():
    # most requests exceed 16 candidates / 2 users and are chunked by user row
    n_b, n_req, merged, n_users, req_users = run_daemon(
        {"max_batch_candidates": 16, "max_batch_users": 2, "max_queue_delay_us": 200,
         "instances": 2}, "tiny limits")
    check(n_b > 0, "batches ran")


def test_server_keys_reach_the_load():
    # graphs is read when a version loads (its contexts record graphs), not
    # by the batcher: the server config's batching block must reach the
    # registry too (it did not: the load saw graphs -1 and used 16). A
    # version's serving block in /v1/models is what its load resolved.
    d = Daemon(REPO, threads=2, batching={"graphs": 5, "gpu_spin_us": 7})
    try:
        code, body = d.http("GET", "/v1/models/demo")
        check_eq(code, 200, "/v1/models/demo")
        serving = json.loads(body)["versions"][0]["serving"]
        check_eq((serving["graphs"], serving["gpu_spin_us"]), (5, 7), "the loaded version's serving")
    finally:
        d.close()


if __name__ == "__main__":
    run([test_default_limits, test_tiny_limits_chunk, test_server_keys_reach_the_load], repo=REPO)
