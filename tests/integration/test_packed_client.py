#!/usr/bin/python3
"""tools/rank_client.py's packed conversion (to_packed) and
deploy/ghz/make_data.py --packed: the packed request carries the same
logical request as the classic one. No server is needed.

    IKBO_BUILD=build IKBO_ROOT=. /usr/bin/python3 tests/integration/test_packed_client.py

The packed columns are read back by packed_common.logical(), which decodes
them on its own from ranker.proto's rules; "same" means equal after its
normalization (absent feature = empty bag, no actions = zeros, ...).
Requests are compared after a trip through the wire format and through
proto3 JSON (ghz's data-file form, bytes as base64) too.
"""
import json
import os
import random
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.environ.get("IKBO_ROOT") or os.path.join(HERE, "..", ".."))
BUILD = os.path.abspath(os.environ.get("IKBO_BUILD") or os.path.join(ROOT, "build"))
os.environ["IKBO_BUILD"] = BUILD  # rank_client finds build/gen/py through it
sys.path.insert(0, os.path.join(ROOT, "tools"))

import rank_client  # noqa: E402  (imports grpc, then build/gen/py)
from google.protobuf import json_format  # noqa: E402
from ikbo_itest import check, check_eq, run  # noqa: E402
from packed_common import first_difference, logical  # noqa: E402

pb = rank_client.ranker_pb2
PY = "/usr/bin/python3"
CLIENT = os.path.join(ROOT, "tools", "rank_client.py")
MAKE_DATA = os.path.join(ROOT, "deploy", "ghz", "make_data.py")


def parse(text):
    return json_format.Parse(text, pb.RankRequest())


def assert_same(classic, packed, what):
    check(not packed.users and not packed.candidates, "%s: packed request has classic entities" % what)
    check(packed.HasField("packed_users") and packed.HasField("packed_candidates"),
          "%s: both packed messages must be present" % what)
    want = logical(classic)
    for form, req in (("message", packed),
                      ("wire", pb.RankRequest.FromString(packed.SerializeToString())),
                      ("json", parse(json_format.MessageToJson(packed)))):
        d = first_difference(want, logical(req))
        check(d is None, "%s (%s): %s" % (what, form, d))


def random_request(rng):
    """A classic request with the awkward cases: empty and repeated keys,
    features absent / empty / in varying order, users with and without
    history and actions, extreme ids, NaN/-0/Inf dense values."""
    ud, cd = rng.randrange(0, 4), rng.randrange(0, 3)
    ufeat, cfeat = ["country", "lang", "os"][:rng.randrange(0, 4)], ["item", "author"][:rng.randrange(0, 3)]
    special = [float("nan"), -0.0, float("inf"), 1e-45, 3.4e38]

    def dense(n):
        return [rng.choice(special) if rng.random() < 0.1 else rng.uniform(-1, 1) for _ in range(n)]

    def bags(names):
        out = []
        for name in rng.sample(names, len(names)):
            r = rng.random()
            if r < 0.25:
                continue  # absent
            ids = [] if r < 0.4 else [rng.choice([-2**63, 2**63 - 1, 0, rng.randrange(-10**12, 10**12)])
                                      for _ in range(rng.randrange(1, 5))]
            out.append(pb.SparseFeature(name=name, ids=ids))
        return out

    with_keys = rng.random() < 0.6
    req = pb.RankRequest(model=rng.choice(["demo", "bench", ""]), model_version=rng.randrange(0, 3),
                         top_k=rng.randrange(0, 5), request_id=rng.choice(["", "r-%d" % rng.randrange(99)]))
    n_users = rng.randrange(0, 5)
    for i in range(n_users):
        u = req.users.add(key=("k%d" % rng.randrange(3)) if with_keys and rng.random() < 0.8 else "",
                          dense=dense(ud), sparse=bags(ufeat))
        h = rng.choice([0, 0, 1, 5])
        u.history_ids.extend(rng.randrange(-10**15, 10**15) for _ in range(h))
        if h and rng.random() < 0.5:
            u.history_actions.extend(rng.randrange(-3, 7) for _ in range(h))
    for j in range(rng.randrange(0, 9)):
        req.candidates.add(id=rng.choice([0, -1, 2**63 - 1, rng.randrange(10**9)]),
                           user=rng.randrange(0, max(n_users, 1) + 1), dense=dense(cd), sparse=bags(cfeat))
    return req


def test_example_request():
    path = os.path.join(ROOT, "models", "demo", "example_request.json")
    req = parse(open(path).read())
    assert_same(req, rank_client.to_packed(req), path)


def test_random_requests():
    rng = random.Random(18)
    for i in range(400):
        req = random_request(rng)
        assert_same(req, rank_client.to_packed(req), "random request %d" % i)


def test_optional_columns():
    """The proto's "empty = ..." columns are left empty only when they may be."""
    req = parse(json.dumps({"model": "m", "users": [{"dense": [1]}, {"dense": [2]}],
                            "candidates": [{"user": 1, "dense": []}]}))
    p = rank_client.to_packed(req)
    pu, pc = p.packed_users, p.packed_candidates
    check_eq((pu.count, len(pu.keys), pu.history_lengths, pu.history_ids, pu.history_actions, len(pu.sparse)),
             (2, 0, b"", b"", b"", 0), "no keys, no history columns, no features")
    check_eq((pc.count, pc.ids, pc.users, pc.dense), (1, b"\0" * 8, b"\1\0\0\0", b""), "candidate columns")
    req = parse(json.dumps({"users": [{"key": "a", "historyIds": [5, 6]}, {"historyIds": [7], "historyActions": [2]},
                                      {}], "candidates": []}))
    pu = rank_client.to_packed(req).packed_users
    check_eq(list(pu.keys), ["a", "", ""], "keys listed when any is set")
    check_eq(pu.history_lengths, bytes([2, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]), "history lengths")
    check_eq(pu.history_actions, bytes([0] * 8 + [2, 0, 0, 0]), "actions zero-filled for a user without them")
    empty = rank_client.to_packed(pb.RankRequest(model="m"))
    check(empty.HasField("packed_users") and empty.HasField("packed_candidates"),
          "a request with no entities still has both packed messages")


def test_rejected_shapes():
    cases = [
        ({"users": [{"dense": [1, 2]}, {"dense": [1]}]}, "users[1].dense: 1 values, users[0] has 2"),
        ({"candidates": [{"dense": []}, {"dense": [3]}]}, "candidates[1].dense: 1 values, candidates[0] has 0"),
        ({"candidates": [{"sparse": [{"name": "a", "ids": [1]}, {"name": "b"}, {"name": "a"}]}]},
         "candidates[0].sparse[2]: feature 'a' is also sparse[0]"),
        ({"users": [{"historyIds": [1, 2], "historyActions": [1]}]},
         "users[0].history_actions: 1 values for 2 history ids"),
        ({"users": [{"historyActions": [1]}]}, "users[0].history_actions: 1 values for 0 history ids"),
    ]
    for doc, msg in cases:
        try:
            rank_client.to_packed(parse(json.dumps(doc)))
        except ValueError as e:
            check(msg in str(e), "%s: message %r lacks %r" % (doc, str(e), msg))
            continue
        raise AssertionError("%s: packed without an error" % doc)
    packed = rank_client.to_packed(parse(json.dumps({"users": [{"key": "a"}]})))
    check(rank_client.to_packed(packed) is packed, "an already packed request is sent as it is")
    both = pb.RankRequest()
    both.CopyFrom(packed)
    both.users.add()
    try:
        rank_client.to_packed(both)
        raise AssertionError("packed + classic users accepted")
    except ValueError as e:
        check("both packed and classic" in str(e), str(e))


def test_cli():
    r = subprocess.run([PY, CLIENT, "--help"], capture_output=True, text=True, timeout=30)
    check(r.returncode == 0 and "--packed" in r.stdout, "--help lists --packed: %s" % r.stdout)
    # conversion errors come before any call: exit 1 with the field named, no server needed
    r = subprocess.run([PY, CLIENT, "--packed", "--target", "127.0.0.1:1", "-"], capture_output=True, text=True,
                       timeout=30, input=json.dumps({"model": "demo", "users": [{"dense": [1]}, {"dense": []}]}),
                       env=dict(os.environ, IKBO_BUILD=BUILD))
    check(r.returncode == 1 and "users[1].dense" in r.stderr, "rc %d stderr %r" % (r.returncode, r.stderr))


def test_make_data_packed():
    """make_data.py --packed writes the same request as without it, and the
    committed ghz packed data is what it writes."""
    with tempfile.TemporaryDirectory() as tmp:
        for preset, committed in (("bench", "bench_packed_request.json"), ("demo", None)):
            classic_path, packed_path = os.path.join(tmp, "c.json"), os.path.join(tmp, "p.json")
            for args, out in (([], classic_path), (["--packed"], packed_path)):
                r = subprocess.run([PY, MAKE_DATA, "--preset", preset, "--users", "3", "--seed", "5", "-o", out]
                                   + args, capture_output=True, text=True, timeout=60,
                                   env=dict(os.environ, IKBO_BUILD=BUILD))
                check(r.returncode == 0, "make_data %s %s: %s" % (preset, args, r.stderr))
            classic, packed = parse(open(classic_path).read()), parse(open(packed_path).read())
            check(packed.HasField("packed_users") and not packed.users, "%s --packed is packed" % preset)
            d = first_difference(logical(classic), logical(packed))
            check(d is None, "make_data %s: %s" % (preset, d))
            if committed:
                r = subprocess.run([PY, MAKE_DATA, "--preset", preset, "--packed", "-o", packed_path],
                                   capture_output=True, text=True, timeout=60, env=dict(os.environ, IKBO_BUILD=BUILD))
                check(r.returncode == 0, r.stderr)
                path = os.path.join(ROOT, "deploy", "ghz", "data", committed)
                check(open(path).read() == open(packed_path).read(),
                      "%s is not what make_data.py --preset %s --packed writes" % (path, preset))


if __name__ == "__main__":
    run([test_example_request, test_random_requests, test_optional_columns, test_rejected_shapes, test_cli,
         test_make_data_packed])
