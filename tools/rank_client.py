#!/usr/bin/python3
"""rank_client.py - send a RankRequest (proto3 JSON) to ikbo-serve over gRPC.

Why this exists: the smallest real client of the API, for trying a server by
hand and as the README's grpcio example. It uses the Python messages that
`make` generates from proto/ (build/gen/py) and Debian's python3-grpcio, so
run it with /usr/bin/python3.

    tools/rank_client.py models/demo/example_request.json
    tools/rank_client.py --target 127.0.0.1:50051 --timeout 2 req.json
    tools/rank_client.py --info demo          # ModelInfo
"""
import argparse
import os
import sys

import grpc  # before build/gen/py joins sys.path (it holds a grpc/ folder of its own)
from google.protobuf import json_format

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.environ.get("IKBO_BUILD", os.path.join(ROOT, "build")), "gen", "py"))
from ikbo.v1 import ranker_pb2  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description="Send a RankRequest (JSON) to ikbo-serve over gRPC.")
    ap.add_argument("request", nargs="?", help="RankRequest in the proto3 JSON mapping ('-' = stdin)")
    ap.add_argument("--target", default="127.0.0.1:50051", help="gRPC address (default %(default)s)")
    ap.add_argument("--timeout", type=float, default=5.0, help="deadline in seconds (default %(default)s)")
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
            call = ch.unary_unary("/ikbo.v1.Ranker/Rank",
                                  request_serializer=ranker_pb2.RankRequest.SerializeToString,
                                  response_deserializer=ranker_pb2.RankResponse.FromString)
            resp = call(req, timeout=a.timeout)
    except grpc.RpcError as e:
        print(f"rank_client: {e.code().name}: {e.details()}", file=sys.stderr)
        return 2
    except (OSError, json_format.ParseError) as e:
        print(f"rank_client: {e}", file=sys.stderr)
        return 1
    print(json_format.MessageToJson(resp, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
