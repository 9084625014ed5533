#!/usr/bin/python3
"""Writes the hand-made seed corpora of the fuzz targets (tests/fuzz/corpus/).

Why this exists: a fuzzer starts far deeper from a few valid inputs of
different shapes than from nothing; this script is how the committed seeds
were made, so they can be re-made after a format change:

    IKBO_BUILD=build /usr/bin/python3 tests/fuzz/make_seeds.py

(needs build/gen/py from `make`, and build/fuzz_loader for the loader seed).
Seeds it writes (file names start with "seed-"; inputs libFuzzer found and
-merge=1 kept have hash names):
  rank_wire/     RankRequests from tools/reference/make_request.py for the
                 demo model, canonical (protobuf's own serializer) and
                 re-encoded the other ways protobuf allows: repeated scalars
                 unpacked, singular fields repeated, a message split in two
  request_json/  models/demo/example_request.json and make_request.py
                 requests (lowerCamelCase and snake_case, empty bags, dup and
                 same-key users, int64 as strings); some of them in the packed
                 encoding (packed-*: protobuf's JSON, base64 standard and
                 URL-safe unpadded, and one with both encodings)
  config/        config/server.json and configs using every key
  loader/        `fuzz_loader --seed-out` (model.json NUL safetensors)
"""
import json
import os
import struct
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("IKBO_BUILD", os.path.join(ROOT, "build"))
CORPUS = os.path.join(ROOT, "tests", "fuzz", "corpus")
DEMO = os.path.join(ROOT, "models", "demo", "1")
sys.path.insert(0, os.path.join(BUILD, "gen", "py"))

from google.protobuf import json_format  # noqa: E402
from ikbo.v1 import ranker_pb2  # noqa: E402


def write(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def make_request(*args):
    cmd = [sys.executable, os.path.join(ROOT, "tools", "reference", "make_request.py"), DEMO]
    return subprocess.run(cmd + list(args), check=True, capture_output=True, text=True).stdout


# ---- a minimal wire re-encoder (for the non-canonical encodings) ----

# field number -> "msg:<name>" | "packed:<f|q|i>" (float, int64, int32) | "scalar" | "string"
SCHEMA = {
    "req": {1: "string", 2: "scalar", 3: "msg:user", 4: "msg:cand", 5: "scalar", 6: "string"},
    "user": {1: "string", 2: "packed:f", 3: "msg:sparse", 4: "packed:q", 5: "packed:i"},
    "cand": {1: "scalar", 2: "scalar", 3: "packed:f", 4: "msg:sparse"},
    "sparse": {1: "string", 2: "packed:q"},
}


def varint(v):
    v &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def read_varint(b, i):
    x = s = 0
    while True:
        c = b[i]
        i += 1
        x |= (c & 0x7F) << s
        s += 7
        if c < 0x80:
            return x, i


def fields(b):
    """(number, wire type, raw value bytes or int) of a canonical message."""
    i = 0
    while i < len(b):
        k, i = read_varint(b, i)
        num, wt = k >> 3, k & 7
        if wt == 0:
            v, i = read_varint(b, i)
        elif wt == 2:
            n, i = read_varint(b, i)
            v, i = b[i:i + n], i + n
        elif wt == 5:
            v, i = b[i:i + 4], i + 4
        else:
            raise ValueError("unexpected wire type %d" % wt)
        yield num, wt, v


def reencode(b, msg, repeat_singular):
    """Repeated scalars unpacked; with repeat_singular, every singular
    scalar/string is written twice (a zero first: the last one wins)."""
    out = bytearray()
    for num, wt, v in fields(b):
        kind = SCHEMA[msg][num]
        if kind.startswith("msg:"):
            body = reencode(v, kind[4:], repeat_singular)
            out += varint(num << 3 | 2) + varint(len(body)) + body
        elif kind.startswith("packed:") and wt == 2:
            j = 0
            while j < len(v):
                if kind == "packed:f":
                    out += varint(num << 3 | 5) + v[j:j + 4]
                    j += 4
                else:
                    x, j = read_varint(v, j)
                    out += varint(num << 3 | 0) + varint(x)
        elif wt == 0:
            if repeat_singular:
                out += varint(num << 3) + varint(0)
            out += varint(num << 3) + varint(v)
        else:
            if repeat_singular:
                out += varint(num << 3 | 2) + varint(0)
            out += varint(num << 3 | wt) + (varint(len(v)) if wt == 2 else b"") + v
    return bytes(out)


def wire_seeds(requests):
    for name, text in requests:
        msg = json_format.Parse(text, ranker_pb2.RankRequest())
        b = msg.SerializeToString()
        write("rank_wire", name + ".pb", b)
    # The smallest one, re-encoded the other ways.
    name, text = requests[0]
    b = json_format.Parse(text, ranker_pb2.RankRequest()).SerializeToString()
    write("rank_wire", name + "-unpacked.pb", reencode(b, "req", False))
    write("rank_wire", name + "-repeated.pb", reencode(b, "req", True))
    # Split: the message's fields in two halves, concatenated (= merged).
    fs = list(fields(b))
    half = len(fs) // 2
    enc = lambda part: b"".join(  # noqa: E731
        varint(n << 3 | wt) + (varint(len(v)) + v if wt == 2 else (varint(v) if wt == 0 else v))
        for n, wt, v in part)
    write("rank_wire", name + "-split.pb", enc(fs[half:]) + enc(fs[:half]))
    write("rank_wire", "empty.pb", b"")


def requests():
    with open(os.path.join(ROOT, "models", "demo", "example_request.json")) as f:
        example = f.read()
    return [
        ("small", make_request("--seed", "1", "--users", "1", "--cands-per-user", "2")),
        ("example", example),
        ("dups", make_request("--seed", "2", "--users", "3", "--cands-per-user", "1-3",
                              "--dup-users", "1", "--same-key-users", "1", "--unused-users", "1")),
        ("snake", make_request("--seed", "3", "--users", "2", "--cands-per-user", "2",
                               "--snake", "--history", "long,exact")),
        ("empty-bags", make_request("--seed", "4", "--users", "2", "--cands-per-user", "1",
                                    "--empty")),
    ]


# ---- the packed encoding (RankRequest.packed_users / packed_candidates) ----

def to_packed(msg):
    """The same users and candidates as PackedUsers / PackedCandidates
    (little-endian columns; absent features as empty bags)."""
    le = lambda fmt, xs: struct.pack("<%d%s" % (len(xs), fmt), *xs)  # noqa: E731
    out = ranker_pb2.RankRequest(model=msg.model, model_version=msg.model_version,
                                 top_k=msg.top_k, request_id=msg.request_id)

    def columns(packed, rows):
        names = []
        for r in rows:
            names += [f.name for f in r.sparse if f.name not in names]
        for name in names:
            bags = [next((list(f.ids) for f in r.sparse if f.name == name), []) for r in rows]
            packed.sparse.add(name=name, lengths=le("I", [len(b) for b in bags]),
                              ids=le("q", [i for b in bags for i in b]))
        packed.count = len(rows)
        packed.dense = le("f", [x for r in rows for x in r.dense])

    u = out.packed_users
    columns(u, msg.users)
    if any(x.key for x in msg.users):
        u.keys.extend(x.key for x in msg.users)
    if any(x.history_ids for x in msg.users):
        u.history_lengths = le("I", [len(x.history_ids) for x in msg.users])
        u.history_ids = le("q", [i for x in msg.users for i in x.history_ids])
    if any(x.history_actions for x in msg.users):
        u.history_actions = le("i", [a for x in msg.users for a in
                                     (x.history_actions or [0] * len(x.history_ids))])
    c = out.packed_candidates
    columns(c, msg.candidates)
    c.ids = le("q", [x.id for x in msg.candidates])
    c.users = le("I", [x.user for x in msg.candidates])
    return out


PACKED_BYTES = {"dense", "lengths", "ids", "users", "history_lengths", "history_ids",
                "history_actions", "historyLengths", "historyIds", "historyActions"}


def url_unpadded(obj):
    """Every base64 value of a packed request's JSON in the URL-safe alphabet
    without padding (both are valid proto3 JSON)."""
    if isinstance(obj, dict):
        return {k: (v.rstrip("=").replace("+", "-").replace("/", "_")
                    if isinstance(v, str) and k in PACKED_BYTES else url_unpadded(v))
                for k, v in obj.items()}
    if isinstance(obj, list):
        return [url_unpadded(v) for v in obj]
    return obj


def packed_json_seeds(reqs):
    """request_json/ only: rank_wire's seeds stay classic until the fast
    decoder reads fields 7 and 8."""
    for name, text in reqs[:3]:
        msg = to_packed(json_format.Parse(text, ranker_pb2.RankRequest()))
        write("request_json", "packed-" + name + ".json", json_format.MessageToJson(msg))
    msg = to_packed(json_format.Parse(reqs[3][1], ranker_pb2.RankRequest()))
    snake = json_format.MessageToDict(msg, preserving_proto_field_name=True)
    write("request_json", "packed-snake-url.json", json.dumps(url_unpadded(snake)))
    # Both encodings at once (the validator refuses it; the mapper maps it).
    both = json.loads(reqs[0][1])
    both.update(json_format.MessageToDict(to_packed(json_format.Parse(reqs[0][1],
                                                                      ranker_pb2.RankRequest()))))
    write("request_json", "packed-and-classic.json", json.dumps(both))


def config_seeds():
    with open(os.path.join(ROOT, "config", "server.json")) as f:
        write("config", "server.json", f.read())
    full = {
        "grpc_listen": "0.0.0.0:50051", "http_listen": "[::1]:8080",
        "model_repository": "/srv/models", "models": ["demo", "bench"], "device": "cuda:0",
        "mode": "broadcast", "threads": 8,
        "limits": {"max_users": 16, "max_candidates": 100, "max_ids_per_bag": 8,
                   "max_history": 64, "max_sparse_features": 4, "max_message_bytes": 65536},
        "log": {"level": "debug", "format": "json"}, "drain_timeout_ms": 0,
        "tls": {"cert_file": "a.crt", "key_file": "a.key", "client_ca_file": "ca.crt"},
        "batching": {"max_batch_candidates": 4096, "max_batch_users": 256,
                     "max_queue_delay_us": 200, "instances": 2,
                     "max_queue_candidates": 65536, "max_queue_requests": 100},
        "repository_poll_ms": 0, "repository_settle_ms": 500,
        "version_policy": {"versions": [1, 3]},
        "model_policy": {"demo": {"latest": 2}, "bench": {"versions": [7]}},
        "admin_http": "off",
    }
    write("config", "full.json", json.dumps(full, indent=1))
    write("config", "nulls.json", json.dumps({"tls": None, "models": None,
                                               "version_policy": {"latest": 64},
                                               "admin_http": "any", "mode": "ikbo"}))
    write("config", "empty.json", "{}")


def main():
    reqs = requests()
    wire_seeds(reqs)
    for name, text in reqs:
        write("request_json", name + ".json", text)
    packed_json_seeds(reqs)
    config_seeds()
    loader = os.path.join(BUILD, "fuzz_loader")
    os.makedirs(os.path.join(CORPUS, "loader"), exist_ok=True)
    subprocess.run([loader, "--seed-out", os.path.join(CORPUS, "loader", "seed-model")],
                   check=True)


if __name__ == "__main__":
    main()
