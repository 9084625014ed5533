#!/usr/bin/python3
"""TLS on the gRPC port with a self-signed certificate made here with
`openssl req -x509`, and mutual TLS with a client CA: the right credentials
score, the wrong ones are refused."""
import os
import shutil
import subprocess
import tempfile

import grpc

from ikbo_itest import Daemon, check, check_eq, make_request, model_repo, run

REPO, DIRS = model_repo()
DEMO = DIRS["demo"]
TMP = tempfile.mkdtemp(prefix="ikbo-tls-")


def self_signed(name, cn, san):
    key, crt = os.path.join(TMP, name + ".key"), os.path.join(TMP, name + ".crt")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key,
                    "-out", crt, "-days", "2", "-subj", "/CN=" + cn, "-addext",
                    "subjectAltName=" + san], check=True, capture_output=True)
    return key, crt


SERVER_KEY, SERVER_CRT = self_signed("server", "localhost", "DNS:localhost,IP:127.0.0.1")
CLIENT_KEY, CLIENT_CRT = self_signed("client", "ikbo-test-client", "DNS:client")
OTHER_KEY, OTHER_CRT = self_signed("other", "someone-else", "DNS:other")


def read(p):
    with open(p, "rb") as f:
        return f.read()


def rank_over(d, creds):
    ch = grpc.secure_channel("localhost:%d" % d.grpc_port, creds)
    try:
        return d.rank(make_request(DEMO, seed=51), channel=ch, timeout=10)
    finally:
        ch.close()


def refused(fn):
    try:
        fn()
    except grpc.RpcError as e:
        return e.code()
    raise AssertionError("call succeeded, expected a refusal")


def test_tls():
    d = Daemon(REPO, tls={"cert_file": SERVER_CRT, "key_file": SERVER_KEY})
    try:
        resp = rank_over(d, grpc.ssl_channel_credentials(root_certificates=read(SERVER_CRT)))
        check_eq(len(resp.scores), 15, "scores over TLS")
        # A client that does not trust the certificate, and a plaintext client.
        code = refused(lambda: rank_over(d, grpc.ssl_channel_credentials(
            root_certificates=read(OTHER_CRT))))
        check_eq(code, grpc.StatusCode.UNAVAILABLE, "untrusted server cert")
        code = refused(lambda: d.rank(make_request(DEMO, seed=52), timeout=5))
        check_eq(code, grpc.StatusCode.UNAVAILABLE, "plaintext client")
        check(" tls=on" in d.logs(), "listening line says tls=on")
        check_eq(d.stop(), 0, "exit status")
    finally:
        d.close()


def test_mutual_tls():
    d = Daemon(REPO, tls={"cert_file": SERVER_CRT, "key_file": SERVER_KEY,
                          "client_ca_file": CLIENT_CRT})
    try:
        good = grpc.ssl_channel_credentials(root_certificates=read(SERVER_CRT),
                                            private_key=read(CLIENT_KEY),
                                            certificate_chain=read(CLIENT_CRT))
        check_eq(len(rank_over(d, good).scores), 15, "scores over mutual TLS")
        no_cert = grpc.ssl_channel_credentials(root_certificates=read(SERVER_CRT))
        check_eq(refused(lambda: rank_over(d, no_cert)), grpc.StatusCode.UNAVAILABLE,
                 "no client certificate")
        wrong = grpc.ssl_channel_credentials(root_certificates=read(SERVER_CRT),
                                             private_key=read(OTHER_KEY),
                                             certificate_chain=read(OTHER_CRT))
        check_eq(refused(lambda: rank_over(d, wrong)), grpc.StatusCode.UNAVAILABLE,
                 "client certificate from an untrusted CA")
        check(" tls=mutual" in d.logs(), "listening line says tls=mutual")
        check_eq(d.stop(), 0, "exit status")
    finally:
        d.close()


def test_unreadable_cert_is_a_startup_error():
    tmp = tempfile.mkdtemp(prefix="ikbo-itest-")
    cfg = os.path.join(tmp, "c.json")
    with open(cfg, "w") as f:
        f.write('{"model_repository": "%s", "grpc_listen": "127.0.0.1:0", '
                '"http_listen": "127.0.0.1:0", "tls": {"cert_file": "/nonexistent.crt", '
                '"key_file": "%s"}}' % (REPO, SERVER_KEY))
    from ikbo_itest import SERVE
    p = subprocess.run([SERVE, "--config", cfg], capture_output=True, text=True, timeout=20)
    shutil.rmtree(tmp, ignore_errors=True)
    check_eq(p.returncode, 2, "exit status of a config error")
    check_eq(len(p.stderr.strip().splitlines()), 1, "one line")
    check("/nonexistent.crt" in p.stderr, "the error names the file: %r" % p.stderr[-500:])


if __name__ == "__main__":
    try:
        run([test_tls, test_mutual_tls, test_unreadable_cert_is_a_startup_error], repo=REPO)
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
