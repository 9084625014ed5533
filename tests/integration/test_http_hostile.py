#!/usr/bin/python3
"""The HTTP endpoint against hostile or unusual clients, over raw sockets so
each check sees the exact bytes on the wire:
  - HEAD answers GET's status and headers, Content-Length included, and no
    body: a keep-alive connection reads the next response right;
  - the admin routes refuse what a browser page of another site can send
    (no X-Ikbo-Admin header, a foreign Origin, Sec-Fetch-Site cross-site);
  - :rank does not hold the HTTP thread: /metrics and /healthz answer while
    a 10,000-candidate rank is in flight; a client that disconnects mid-rank
    and a stop with a rank in flight leave the daemon sound;
  - chunked request bodies: chunk extensions are read (200), a malformed
    chunk size or overlong chunk data is 400, not 413."""
import json
import select
import signal
import socket

from ikbo_itest import Daemon, check, check_eq, make_request, metric, model_repo, run
from reload_common import wait_for

REPO, DIRS = model_repo()
DEMO = DIRS["demo"]
D = Daemon(REPO)
BIG = make_request(DEMO, users=10, cands_per_user=1000, seed=31)  # 10,000 candidates


# ---------------------------------------------------------------- raw HTTP/1.1

class Conn:
    """One keep-alive connection; responses parsed by Content-Length only
    (the server always sends it), so a missing one or a stray body shows."""

    def __init__(self, port=None, timeout=30):
        self.s = socket.create_connection(("127.0.0.1", port or D.http_port), timeout=timeout)
        self.buf = b""

    def send(self, data):
        self.s.sendall(data)

    def request(self, method, path, body=b"", headers=()):
        head = "%s %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n" % (method, path, D.http_port)
        for k, v in headers:
            head += "%s: %s\r\n" % (k, v)
        if body or method == "POST":
            head += "Content-Length: %d\r\n" % len(body)
        self.send(head.encode() + b"\r\n" + body)

    def _fill(self):
        data = self.s.recv(65536)
        if not data:
            raise AssertionError("connection closed; unread: %r" % self.buf[:200])
        self.buf += data

    def readable(self):
        """Whether response bytes are waiting (no wait)."""
        return bool(self.buf) or bool(select.select([self.s], [], [], 0)[0])

    def response(self, head_only=False):
        """(status, {lower-case header: value}, body)."""
        while b"\r\n\r\n" not in self.buf:
            self._fill()
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        check(len(parts) >= 2 and parts[0] == "HTTP/1.1" and parts[1].isdigit(),
              "bad status line %r" % lines[0])
        hdrs = {}
        for ln in lines[1:]:
            k, _, v = ln.partition(":")
            hdrs[k.strip().lower()] = v.strip()
        check("content-length" in hdrs, "no Content-Length in %r" % lines)
        n = 0 if head_only else int(hdrs["content-length"])
        while len(self.buf) < n:
            self._fill()
        body, self.buf = self.buf[:n], self.buf[n:]
        return int(parts[1]), hdrs, body

    def closed_by_peer(self, timeout=10):
        """True once the server closed the connection (bounded wait)."""
        self.s.settimeout(timeout)
        try:
            while True:
                if not self.s.recv(65536):
                    return True
        except (ConnectionResetError, socket.timeout):
            return False

    def close(self):
        self.s.close()


def inflight():
    return metric(D.metrics(), "ikbo_inflight_requests")


# ---------------------------------------------------------------- HEAD

def test_head_then_get_keepalive():
    c = Conn()
    for path in ("/healthz", "/readyz", "/v1/models", "/v1/models/demo", "/metrics",
                 "/v1/models/nope"):
        c.request("HEAD", path)
        hs, hh, hb = c.response(head_only=True)
        c.request("GET", path)
        gs, gh, gb = c.response()
        check_eq(hs, gs, path + " status")
        check_eq(hh.get("content-type"), gh.get("content-type"), path + " content-type")
        if path != "/metrics":  # its counters move between the two calls
            check_eq(int(hh["content-length"]), len(gb), path + " HEAD Content-Length")
    check_eq((gs, json.loads(gb)["error"]["code"]), (404, "NOT_FOUND"), "last GET parsed")
    # Nothing stray after the last response: a HEAD body would be here.
    c.request("GET", "/healthz")
    check_eq(c.response()[::2], (200, b"ok\n"), "the connection is still in step")
    c.close()


def test_path_with_nul_refused():
    """A %00 in the path is refused, not cut short at the NUL (the model name
    `demo\0x` must not reach `demo`, as over gRPC)."""
    c = Conn()
    body = json.dumps(make_request(DEMO, users=1, cands_per_user=2, seed=37)).encode()
    for method, path, b in (("POST", "/v1/models/demo%00x:rank", body), ("GET", "/healthz%00", b""),
                            ("POST", "/v1/models/demo%00x/unload", b"")):
        c.request(method, path, b, headers=(("X-Ikbo-Admin", "1"),))
        status, _, out = c.response()
        check_eq(status, 400, path)
        check("path: contains NUL" in json.loads(out)["error"]["message"], "%s: %r" % (path, out))
    check_eq(demo_state(), ("READY", False), "demo still served")
    c.close()


# ---------------------------------------------------------------- admin

def admin(path, headers):
    c = Conn()
    c.request("POST", path, b"", headers)
    status, _, body = c.response()
    c.close()
    return status, json.loads(body or b"{}")


def demo_state():
    code, body = D.http("GET", "/v1/models/demo")
    check_eq(code, 200, "GET demo")
    m = json.loads(body)
    return m["versions"][0]["state"], m.get("unloaded", False)


def test_admin_refuses_cross_site():
    browser = [("Origin", "http://evil.example"), ("Content-Type", "text/plain")]
    cases = [
        ("browser form/fetch, simple request", browser, "X-Ikbo-Admin"),
        ("no marker header, no Origin", [], "X-Ikbo-Admin"),
        ("marker header, foreign Origin", browser + [("X-Ikbo-Admin", "1")], "Origin"),
        ("marker header, Origin of another port",
         [("Origin", "http://127.0.0.1:1"), ("X-Ikbo-Admin", "1")], "Origin"),
        ("marker header, Sec-Fetch-Site cross-site",
         [("Sec-Fetch-Site", "cross-site"), ("X-Ikbo-Admin", "1")], "Sec-Fetch-Site"),
        ("marker header, Sec-Fetch-Site same-site",
         [("Sec-Fetch-Site", "same-site"), ("X-Ikbo-Admin", "1")], "Sec-Fetch-Site"),
    ]
    for what, headers, named in cases:
        for verb in ("unload", "load"):
            status, body = admin("/v1/models/demo/" + verb, headers)
            check_eq(status, 403, what + " " + verb)
            check_eq(body["error"]["code"], "PERMISSION_DENIED", what)
            check(named in body["error"]["message"], "%s: %r" % (what, body))
    check_eq(demo_state(), ("READY", False), "demo still served")
    req = make_request(DEMO, seed=32)
    check_eq(D.http("POST", "/v1/models/demo:rank", req)[0], 200, "demo still ranks")


def test_admin_same_origin_allowed():
    own = "http://127.0.0.1:%d" % D.http_port
    for headers in ([("X-Ikbo-Admin", "1")],
                    [("X-Ikbo-Admin", "1"), ("Origin", own), ("Sec-Fetch-Site", "same-origin")]):
        status, body = admin("/v1/models/nohist/load", headers)
        check_eq((status, body.get("status")), (202, "load requested"), repr(headers))


# ---------------------------------------------------------------- async :rank

def test_probes_answer_while_rank_computes():
    body = json.dumps(BIG).encode()
    for attempt in range(20):
        a = Conn(timeout=120)
        a.request("POST", "/v1/models/demo:rank", body)
        # /metrics answers while the rank is in flight (its own gauge says so).
        wait_for(lambda: inflight() >= 1, 60, "the big rank to be in flight (/metrics blocked?)")
        b = Conn()
        b.request("GET", "/healthz")
        check_eq(b.response()[::2], (200, b"ok\n"), "/healthz")
        b.close()
        still = inflight() >= 1 and not a.readable()
        status, _, out = a.response()
        a.close()
        check_eq(status, 200, "big rank: %r" % out[:200])
        check_eq(len(json.loads(out)["scores"]), 10000, "scores")
        if still:  # /healthz was answered between two moments the rank was in flight
            return
    raise AssertionError("the rank never outlived a /healthz call in 20 attempts")


def test_client_disconnects_mid_rank():
    body = json.dumps(BIG).encode()
    a = Conn()
    a.request("POST", "/v1/models/demo:rank", body)
    wait_for(lambda: inflight() >= 1, 60, "the big rank to be in flight")
    a.s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    a.close()  # RST
    wait_for(lambda: inflight() == 0, 60, "the abandoned rank to finish")
    check(D.proc.poll() is None, "daemon died")
    req = make_request(DEMO, seed=34)
    check_eq(D.http("POST", "/v1/models/demo:rank", req)[0], 200, "next rank")
    check_eq(D.http("GET", "/healthz"), (200, b"ok\n"), "next probe")


def test_stop_with_rank_in_flight():
    """SIGTERM while an HTTP rank is queued (the batcher holds it up to 2 s
    for more work): the drain lets it finish and answer 200, then the daemon
    exits 0. It used to be cancelled as soon as the gRPC side had drained."""
    d = Daemon(REPO, drain_timeout_ms=20000,
               batching={"max_batch_candidates": 100000, "max_batch_users": 100000,
                         "max_queue_delay_us": 2000000})
    try:
        body = json.dumps(make_request(DEMO, users=2, cands_per_user=3, seed=36)).encode()
        a = socket.create_connection(("127.0.0.1", d.http_port), timeout=60)
        a.sendall(b"POST /v1/models/demo:rank HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
                  % len(body) + body)
        wait_for(lambda: metric(d.metrics(), "ikbo_inflight_requests") >= 1, 60, "rank queued")
        d.proc.send_signal(signal.SIGTERM)
        data = b""
        while b"\r\n\r\n" not in data:
            more = a.recv(65536)
            check(more, "connection closed with no answer")
            data += more
        check(data.startswith(b"HTTP/1.1 200 "), "queued rank answered %r" % data[:300])
        a.close()
        check_eq(d.proc.wait(60), 0, "exit status with a rank in flight")
    finally:
        d.close()


# ---------------------------------------------------------------- chunked

def chunked_post(c, path, chunks, tail=b"0\r\n\r\n", extra_headers=()):
    head = ("POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n" % path)
    for k, v in extra_headers:
        head += "%s: %s\r\n" % (k, v)
    c.send(head.encode() + b"\r\n" + b"".join(chunks) + tail)


def chunk(data, ext=b""):
    return b"%x%s\r\n%s\r\n" % (len(data), ext, data)


def test_chunked_extensions_accepted():
    req = make_request(DEMO, users=2, cands_per_user=3, seed=33)
    body = json.dumps(req).encode()
    parts = [body[i:i + 97] for i in range(0, len(body), 97)]
    exts = [b";name=value", b";a", b" ;q=\"x;y\"", b";n1=v1;n2", b""]
    c = Conn()
    chunked_post(c, "/v1/models/demo:rank",
                 [chunk(p, exts[i % len(exts)]) for i, p in enumerate(parts)],
                 tail=b"0;last=1\r\nX-Trailer: t\r\n\r\n")
    status, _, out = c.response()
    check_eq(status, 200, "chunked with extensions: %r" % out[:300])
    check_eq(len(json.loads(out)["scores"]), 6, "scores")
    # Byte by byte across reads: the decoder keeps partial lines.
    chunked_post(c, "/v1/models/demo:rank", [], tail=b"")
    for b in b"".join(chunk(p, b";k=v") for p in parts) + b"0\r\n\r\n":
        c.send(bytes([b]))
    check_eq(c.response()[0], 200, "chunked, one byte per send")
    # Keep-alive still in step after chunked bodies.
    c.request("GET", "/healthz")
    check_eq(c.response()[::2], (200, b"ok\n"), "next request on the connection")
    c.close()


def test_chunked_malformed_is_400():
    cases = [
        ("non-hex size", [b"zz\r\n{}\r\n"]),
        ("size then garbage", [b"5x\r\nhello\r\n"]),
        ("empty size line", [b"\r\nhello\r\n"]),
        ("empty extension name", [b"5;\r\nhello\r\n"]),
        ("data longer than its size", [b"2\r\nhello\r\n"]),
        ("size overflow", [b"10000000000000000\r\nhello\r\n"]),
    ]
    for what, chunks in cases:
        c = Conn()
        chunked_post(c, "/v1/models/demo:rank", chunks)
        status, hdrs, body = c.response()
        check_eq(status, 400, what)
        err = json.loads(body)["error"]
        check_eq(err["code"], "INVALID_ARGUMENT", what)
        check("chunk" in err["message"], "%s: %r" % (what, err))
        check_eq(hdrs.get("connection"), "close", what)
        check(c.closed_by_peer(), what + ": connection left open")
        c.close()
    # Pipelined on one connection: the requests before the malformed one are
    # answered as usual (a Content-Length body, then a valid chunked one).
    req = json.dumps(make_request(DEMO, seed=35)).encode()
    c = Conn()
    c.request("POST", "/v1/models/demo:rank", req)
    chunked_post(c, "/v1/models/demo:rank", [chunk(req, b";x=1")])
    chunked_post(c, "/v1/models/demo:rank", [b"q\r\n"])
    check_eq(c.response()[0], 200, "pipelined Content-Length request")
    check_eq(c.response()[0], 200, "pipelined valid chunked request")
    check_eq(c.response()[0], 400, "pipelined malformed chunked request")
    check(c.closed_by_peer(), "connection left open after the malformed request")
    c.close()
    # A body over the limit is still 413 (evhttp's own check).
    c = Conn()
    chunked_post(c, "/v1/models/demo:rank", [b"%x\r\n" % (64 << 20)], tail=b"")
    check_eq(c.response(head_only=True)[0], 413, "oversized chunk")
    c.close()


def test_chunked_error_header_not_forgeable():
    c = Conn()
    c.request("GET", "/healthz", headers=[("X-Ikbo-Chunked", "1")])
    check_eq(c.response()[::2], (200, b"ok\n"), "client-sent decoder header is dropped")
    c.close()


if __name__ == "__main__":
    run([test_head_then_get_keepalive, test_path_with_nul_refused, test_admin_refuses_cross_site,
         test_admin_same_origin_allowed, test_probes_answer_while_rank_computes,
         test_client_disconnects_mid_rank, test_stop_with_rank_in_flight,
         test_chunked_extensions_accepted, test_chunked_malformed_is_400,
         test_chunked_error_header_not_forgeable], daemon=D, repo=REPO)
