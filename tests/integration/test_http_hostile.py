#!/usr/bin/python3
"""The HTTP endpoint against hostile or unusual clients, over raw sockets so
each check sees the exact bytes on the wire:
  - HEAD answers GET's status and headers, Content-Length included, and no
    body: a keep-alive connection reads the next response right."""
import json
import select
import signal
import socket
import time

from ikbo_itest import Daemon, check, check_eq, make_request, metric, model_repo, run

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


def wait_for(cond, what, timeout=60):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if cond():
            return
        time.sleep(0.01)
    raise AssertionError("timed out waiting for " + what)


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


if __name__ == "__main__":
    run([test_head_then_get_keepalive], daemon=D, repo=REPO)
