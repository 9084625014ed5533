#!/usr/bin/python3
"""rank_client.py - send a RankRequest (proto3 JSON) to ikbo-serve over gRPC.

Why this exists: the smallest real client of the API, for trying a server by
hand and as the README's grpcio example. It uses the Python messages that
`make` generates from proto/ (build/gen/py) and Debian's python3-grpcio, so
run it with /usr/bin/python3.

    tools/rank_client.py models/demo/example_request.json
    tools/rank_client.py --target 127.0.0.1:50051 --timeout 2 req.json
    tools/rank_client.py --packed models/demo/example_request.json   # packed encoding
    tools/rank_client.py --info demo          # ModelInfo

--packed sends the same request in the packed (columnar) encoding of
ranker.proto: to_packed() below moves users and candidates into
packed_users/packed_candidates (little-endian fixed-width numbers in bytes
fields). deploy/ghz/make_data.py uses to_packed() too.
"""
import argparse
import os
import struct
import sys

import grpc  # before build/gen/py joins sys.path (it holds a grpc/ folder of its own)
from google.protobuf import json_format

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.environ.get("IKBO_BUILD", os.path.join(ROOT, "build")), "gen", "py"))
from ikbo.v1 import ranker_pb2  # noqa: E402


def _le(fmt, values):
    values = list(values)
    return struct.pack("<%d%s" % (len(values), fmt), *values)


def _dense(entities, what):
    """The dense rows of entities, row-major float32; every row one width."""
    width = len(entities[0].dense) if entities else 0
    for i, e in enumerate(entities):
        if len(e.dense) != width:
            raise ValueError("%s[%d].dense: %d values, %s[0] has %d (the packed encoding takes one width)"
                             % (what, i, len(e.dense), what, width))
    return _le("f", (x for e in entities for x in e.dense))


def _sparse(out, entities, what):
    """One PackedSparse per feature name (first appearance order) into out;
    an entity without the feature gets an empty bag."""
    names, bags = [], []
    for i, e in enumerate(entities):
        bag = {}
        for j, sf in enumerate(e.sparse):
            if sf.name in bag:
                k = [s.name for s in e.sparse].index(sf.name)
                raise ValueError("%s[%d].sparse[%d]: feature '%s' is also sparse[%d] (the packed encoding "
                                 "has one bag per feature)" % (what, i, j, sf.name, k))
            bag[sf.name] = sf.ids
            if sf.name not in names:
                names.append(sf.name)
        bags.append(bag)
    for name in names:
        col = [b.get(name, ()) for b in bags]
        out.add(name=name, lengths=_le("I", (len(ids) for ids in col)),
                ids=_le("q", (x for ids in col for x in ids)))


def _pack_users(pu, users):
    pu.count = len(users)
    if any(u.key for u in users):
        pu.keys.extend(u.key for u in users)
    pu.dense = _dense(users, "users")
    _sparse(pu.sparse, users, "users")
    for i, u in enumerate(users):
        if u.history_actions and len(u.history_actions) != len(u.history_ids):
            raise ValueError("users[%d].history_actions: %d values for %d history ids"
                             % (i, len(u.history_actions), len(u.history_ids)))
    if any(u.history_ids for u in users):
        pu.history_lengths = _le("I", (len(u.history_ids) for u in users))
        pu.history_ids = _le("q", (x for u in users for x in u.history_ids))
        if any(u.history_actions for u in users):
            pu.history_actions = _le("i", (a for u in users
                                           for a in (u.history_actions or [0] * len(u.history_ids))))


def to_packed(req):
    """A RankRequest carrying req's users and candidates in the packed
    encoding (model, model_version, top_k, request_id copied). A request
    already packed is returned as it is. Raises ValueError, naming the field
    and index, for what the packed encoding cannot carry: dense rows of
    different widths, a feature twice in one entity, history_actions that
    are not one per history id."""
    if req.HasField("packed_users") or req.HasField("packed_candidates"):
        if req.users or req.candidates:
            raise ValueError("request has both packed and classic users/candidates")
        return req
    out = ranker_pb2.RankRequest(model=req.model, model_version=req.model_version, top_k=req.top_k,
                                 request_id=req.request_id)
    out.packed_users.SetInParent()
    out.packed_candidates.SetInParent()
    _pack_users(out.packed_users, req.users)
    pc, cands = out.packed_candidates, req.candidates
    pc.count = len(cands)
    pc.ids = _le("q", (c.id for c in cands))
    pc.users = _le("I", (c.user for c in cands))
    pc.dense = _dense(cands, "candidates")
    _sparse(pc.sparse, cands, "candidates")
    return out


def main():
    ap = argparse.ArgumentParser(description="Send a RankRequest (JSON) to ikbo-serve over gRPC.")
    ap.add_argument("request", nargs="?", help="RankRequest in the proto3 JSON mapping ('-' = stdin)")
    ap.add_argument("--target", default="127.0.0.1:50051", help="gRPC address (default %(default)s)")
    ap.add_argument("--timeout", type=float, default=5.0, help="deadline in seconds (default %(default)s)")
    ap.add_argument("--packed", action="store_true",
                    help="send users and candidates in the packed (columnar) encoding; same answer")
    ap.add_argument("--info", metavar="MODEL", nargs="?", const="",
                    help="call ModelInfo instead (empty = every model)")
    a = ap.parse_args()

    ch = grpc.insecure_channel(a.target)
    try:
        if a.info is not None:
            call = ch.unary_unary("/ikbo.v1.Ranker/ModelInfo",
                                  request_serializer=ranker_pb2.ModelInfoRequest.SerializeToString,
                                  response_deserializer=ranker_pb2.ModelInfoResponse.FromString)
            resp = call(ranker_pb2.ModelInfoRequest(model=a.info), timeout=a.timeout)
        else:
            if not a.request:
                ap.error("a request file is required (or --info)")
            text = sys.stdin.read() if a.request == "-" else open(a.request).read()
            req = json_format.Parse(text, ranker_pb2.RankRequest())
            if a.packed:
                req = to_packed(req)
            call = ch.unary_unary("/ikbo.v1.Ranker/Rank",
                                  request_serializer=ranker_pb2.RankRequest.SerializeToString,
                                  response_deserializer=ranker_pb2.RankResponse.FromString)
            resp = call(req, timeout=a.timeout)
    except grpc.RpcError as e:
        print(f"rank_client: {e.code().name}: {e.details()}", file=sys.stderr)
        return 2
    except (OSError, ValueError, json_format.ParseError) as e:
        print(f"rank_client: {e}", file=sys.stderr)
        return 1
    print(json_format.MessageToJson(resp, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
