#!/usr/bin/python3
"""Hostile wire bytes over real gRPC (grpcio, hand-built request bytes) and the
same content over HTTP/JSON: a model name with an embedded NUL, a request_id
that is not UTF-8, and field numbers past protobuf's 2^29-1. Each is refused
with INVALID_ARGUMENT naming the field, on the fast RankRequest decoder and on
the protobuf-c fallback (reached by adding an unknown field, which the fast
decoder declines), and for ModelInfo and Health Check too. Valid requests are
still served afterwards, and the daemon exits cleanly."""
import json

import grpc

from ikbo_itest import Daemon, check, check_eq, make_request, model_repo, run, to_proto

REPO, DIRS = model_repo()
DEMO = DIRS["demo"]
D = Daemon(REPO)
PH = "PHPHPHPHP"  # 9 bytes, overwritten in the serialized message


def varint(v):
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


# An unknown field (number 100, varint 1): protobuf allows it, the fast
# decoder declines it, so the request goes through protobuf-c and its check.
UNKNOWN = varint(100 << 3) + varint(1)


def base():
    """A valid request as a proto3-JSON dict, with the original field name
    request_id (so both transports name it the same)."""
    r = make_request(DEMO, users=2, cands_per_user=2, seed=5)
    r["request_id"] = r.pop("requestId")
    return r


def raw(method):
    return D.chan().unary_unary(method, request_serializer=lambda b: b,
                                response_deserializer=lambda b: b)


def call_error(method, data):
    """(code name, details) of a call that must fail."""
    try:
        raw(method)(data, timeout=10)
    except grpc.RpcError as e:
        return e.code().name, e.details()
    raise AssertionError("%s succeeded on %r..., expected an error" % (method, data[:40]))


def with_bytes(req, field, bad):
    """req (a proto3-JSON dict) serialized, with `field` (a top-level string
    field, proto name) holding the 9 bytes `bad`."""
    assert len(bad) == len(PH)
    r = dict(req)
    r[field] = PH
    data = to_proto(r).SerializeToString()
    check_eq(data.count(PH.encode()), 1, "placeholder count")
    return data.replace(PH.encode(), bad)


def rank_refused(data, want):
    """Refused with `want` by the fast decoder and by the fallback."""
    for label, d in (("fast", data), ("fallback", data + UNKNOWN)):
        code, msg = call_error("/ikbo.v1.Ranker/Rank", d)
        check_eq((code, msg), ("INVALID_ARGUMENT", want), label)


def test_nul_in_model_name():
    data = with_bytes(base(), "model", b"demo\0evil")
    rank_refused(data, "model: string contains NUL at byte 4")
    # The same content over HTTP: the same answer.
    body = dict(base(), model="demo\0evil")
    status, out = D.http("POST", "/v1/models/demo:rank", body)
    check_eq(status, 400, "HTTP status")
    check_eq(json.loads(out)["error"], {"code": "INVALID_ARGUMENT",
                                        "message": "model: string contains NUL at byte 4"})


def test_invalid_utf8_request_id():
    data = with_bytes(base(), "request_id", b"req-\xff1234")
    rank_refused(data, "request_id: string is not valid UTF-8 at byte 4")
    data = with_bytes(base(), "request_id", b"req-\xed\xa0\x80ab")  # a surrogate
    rank_refused(data, "request_id: string is not valid UTF-8 at byte 4")
    # A NUL there too, with the same words on both transports.
    rank_refused(with_bytes(base(), "request_id", b"req-\0abcd"),
                 "request_id: string contains NUL at byte 4")
    body = json.dumps(dict(base(), request_id="req-\0abcd")).encode()
    status, out = D.http("POST", "/v1/models/demo:rank", body)
    check_eq((status, json.loads(out)["error"]["message"]),
             (400, "request_id: string contains NUL at byte 4"), "HTTP NUL request_id")
    # Not UTF-8 over HTTP: the body is not JSON, refused as such.
    body = json.dumps(dict(base(), request_id=PH)).encode().replace(PH.encode(), b"req-\xff1234")
    status, out = D.http("POST", "/v1/models/demo:rank", body)
    err = json.loads(out)["error"]
    check_eq((status, err["code"]), (400, "INVALID_ARGUMENT"), "HTTP invalid UTF-8")
    check(err["message"].startswith("invalid JSON at line 1"), err["message"])


def test_bad_strings_deeper():
    """A user key and a sparse feature name: the path with indices."""
    r = base()
    r["users"][1]["key"] = PH
    data = to_proto(r).SerializeToString().replace(PH.encode(), b"ab\xc0\x80cdefg")
    rank_refused(data, "users[1].key: string is not valid UTF-8 at byte 2")
    r = base()
    check(r["candidates"][1].get("sparse"), "the demo model has candidate sparse features")
    r["candidates"][1]["sparse"][0]["name"] = PH
    data = to_proto(r).SerializeToString().replace(PH.encode(), b"item\0xxxx")
    rank_refused(data, "candidates[1].sparse[0].name: string contains NUL at byte 4")


def test_field_number_out_of_range():
    good = to_proto(base()).SerializeToString()
    for num in (1 << 29, (1 << 32) - 1):
        data = good + varint(num << 3) + varint(1)
        code, msg = call_error("/ikbo.v1.Ranker/Rank", data)
        check_eq((code, msg), ("INVALID_ARGUMENT",
                               "request: field number %d is outside 1..536870911" % num), str(num))
    # Field 0 written in two bytes (protobuf-c takes it as an unknown field).
    code, msg = call_error("/ikbo.v1.Ranker/Rank", good + b"\x80\x00\x01")
    check_eq((code, msg), ("INVALID_ARGUMENT", "request: field number 0 is outside 1..536870911"),
             "field 0")
    # The largest valid number is an unknown field like any other: served.
    resp = raw("/ikbo.v1.Ranker/Rank")(good + varint(((1 << 29) - 1) << 3) + varint(1), timeout=10)
    check(len(resp) > 0, "empty response")


def test_model_info_and_health():
    mi = varint(1 << 3 | 2) + varint(9) + b"demo\0evil"
    check_eq(call_error("/ikbo.v1.Ranker/ModelInfo", mi),
             ("INVALID_ARGUMENT", "model: string contains NUL at byte 4"), "ModelInfo")
    check_eq(call_error("/ikbo.v1.Ranker/ModelInfo", varint(1 << 3 | 2) + varint(2) + b"\xc3("),
             ("INVALID_ARGUMENT", "model: string is not valid UTF-8 at byte 0"), "ModelInfo")
    hc = varint(1 << 3 | 2) + varint(6) + b"demo\0x"
    check_eq(call_error("/grpc.health.v1.Health/Check", hc),
             ("INVALID_ARGUMENT", "service: string contains NUL at byte 4"), "Health")
    check_eq(call_error("/grpc.health.v1.Health/Check", varint(1 << 32 | 0) + varint(1)),
             ("INVALID_ARGUMENT", "request: field number 536870912 is outside 1..536870911"),
             "Health field number")
    check_eq(D.model_info("demo").models[0].name, "demo", "ModelInfo still answers")
    check_eq(D.health("demo").status, 1, "Health still answers")  # SERVING


def test_still_serving():
    resp = D.rank(base())
    check_eq(resp.request_id, "req-5", "request_id")
    check(len(resp.scores) == 4, "scores")


if __name__ == "__main__":
    run([test_nul_in_model_name, test_invalid_utf8_request_id, test_bad_strings_deeper,
         test_field_number_out_of_range, test_model_info_and_health, test_still_serving],
        daemon=D, repo=REPO)
