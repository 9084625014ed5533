#!/usr/bin/env python3
"""sdpa_target.py - PyTorch's SDPA baselines for IKBO target attention.

Why this exists: issue 17 asks for our target attention's TFLOP/s beside
what a user would run instead, PyTorch's scaled_dot_product_attention with
the cuDNN and flash backends, at every shape, in the same device call, as
ours / cuDNN. The shapes are bench_kernels.cu's attention sweep (--only
attsweep; the formulas of att_ratios/att_lengths are repeated here and must
stay the same): H = 2, fp16, 32 users,
  uniform  64 candidates each, every history L events;
  uneven   1 .. 500 candidates (1 and 500 included), histories L/4 .. 7L/4;
Tq = 64, 32, 8; dh = 128 and 64 (uneven: 128).
The baselines take the packed form (DEVICE.md): each user's candidates'
queries are one query sequence over that user's keys, n_u Tq rows against
L_u keys. Forms:
  dense   uniform only: one batched call [U, H, n Tq, dh] x [U, H, L, dh];
  varlen  uneven: the backend's own cumulative-length entry point
          (aten._flash_attention_forward / aten._cudnn_attention_forward),
          only real rows and keys;
  nested  uneven: jagged nested tensors (torch.nested, NJT) through
          scaled_dot_product_attention, where the backend takes them;
  padded  uneven: [U, H, max n_u Tq, dh] x [U, H, max L_u, dh] padded, the
          padding keys unmasked (a correct padded call also needs a mask,
          so this time is a lower bound for that form).
TFLOP/s always count only the real work, 4 H dh Tq sum_u n_u L_u. Times:
median of 20 CUDA-event intervals after 3 warm-up calls (sdpa_self.py).

    sdpa_target.py [--ours BENCH_LOG]

With --ours, reads bench_kernels' "ATTS ..." lines from BENCH_LOG and prints
ours / cuDNN (the fastest cuDNN form of the shape) and ours / flash, last.
"""
import argparse
import re
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
import torch.nn.functional as F

from sdpa_self import median_ms

U, H = 32, 2
BACKENDS = (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION))


def ratios(uneven):
    if not uneven:
        return [64] * U
    r, s = [], 5
    for u in range(U):
        s = (s * 1103515245 + 12345) & 0xFFFFFFFF
        r.append(1 if u == 0 else 500 if u == 1 else 1 + (s >> 8) % 500)
    return r


def lengths(L, uneven):
    return [L // 4 + ((37 * u) % U) * 3 * L // (2 * (U - 1)) if uneven else L for u in range(U)]


def rand(g, *shape):
    return torch.rand(*shape, device="cuda", dtype=torch.float16, generator=g) * 3 - 1.5


def run(name, backend, form, rows, keys, dh):
    """ms of one call over users with `rows` query rows and `keys` keys each."""
    g = torch.Generator(device="cuda").manual_seed(7)
    if form in ("dense", "padded"):
        q = rand(g, U, H, max(rows), dh)
        k, v = rand(g, U, H, max(keys), dh), rand(g, U, H, max(keys), dh)
        with sdpa_kernel(backend):
            return median_ms(lambda: F.scaled_dot_product_attention(q, k, v))
    q = rand(g, sum(rows), H, dh)
    k, v = rand(g, sum(keys), H, dh), rand(g, sum(keys), H, dh)
    oq = torch.tensor([0] + rows, device="cuda").cumsum(0)
    ok = torch.tensor([0] + keys, device="cuda").cumsum(0)
    if form == "nested":
        nq = torch.nested.nested_tensor_from_jagged(q, oq, min_seqlen=min(rows), max_seqlen=max(rows)).transpose(1, 2)
        nk, nv = (torch.nested.nested_tensor_from_jagged(x, ok, min_seqlen=min(keys), max_seqlen=max(keys))
                  .transpose(1, 2) for x in (k, v))
        with sdpa_kernel(backend):
            return median_ms(lambda: F.scaled_dot_product_attention(nq, nk, nv))
    cq, ck = oq.to(torch.int32), ok.to(torch.int32)
    if name == "flash":
        fn = lambda: torch.ops.aten._flash_attention_forward(q, k, v, cq, ck, max(rows), max(keys),  # noqa: E731
                                                              0.0, False, False)
    else:
        fn = lambda: torch.ops.aten._cudnn_attention_forward(q, k, v, None, cq, ck, max(rows), max(keys),  # noqa: E731
                                                              False, 0.0, False, False)
    return median_ms(fn)


def shapes():
    for L in (512, 1024, 2048):
        for tq in (64, 32, 8):
            for dh in (128, 64):
                yield ("uniform", L, tq, dh)
            yield ("uneven", L, tq, 128)


def baselines():
    """{(shape, backend): (TFLOP/s, form)} of each backend's fastest form."""
    best = {}
    for shape in shapes():
        kind, L, tq, dh = shape
        n, keys = ratios(kind == "uneven"), lengths(L, kind == "uneven")
        rows = [x * tq for x in n]
        work = 4.0 * H * dh * sum(r * k for r, k in zip(rows, keys))
        forms = ("dense",) if kind == "uniform" else ("varlen", "nested", "padded")
        for name, be in BACKENDS:
            for form in forms:
                try:
                    ms = run(name, be, form, rows, keys, dh)
                except Exception as e:  # a backend that does not take this form or shape
                    msg = str(e).strip().splitlines()[0][:120] if str(e).strip() else type(e).__name__
                    print("SDPA %s %s %s L %d Tq %d dh %d: n/a (%s)" % (name, form, kind, L, tq, dh, msg))
                    continue
                tf = work / (ms * 1e-3) / 1e12
                print("SDPA %s %s %s L %d Tq %d dh %d: %.4f ms %.1f TFLOP/s" % (name, form, kind, L, tq, dh, ms, tf))
                if tf > best.get((shape, name), (0, ""))[0]:
                    best[(shape, name)] = (tf, form)
            sys.stdout.flush()
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ours", help="bench_kernels log with ATTS lines")
    a = ap.parse_args()
    print("torch %s, cuDNN %s, %s" % (torch.__version__, torch.backends.cudnn.version(), torch.cuda.get_device_name()))
    best = baselines()
    if not a.ours:
        return 0
    ours = {}
    pat = r"ATTS fp16 (\w+) L (\d+) Tq (\d+) dh (\d+) U \d+ C \d+: ours [\d.]+ ms ([\d.]+) TFLOP/s"
    for line in open(a.ours):
        m = re.match(pat, line)
        if m:
            ours[(m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4)))] = float(m.group(5))
    print("\n==== target attention fp16, 32 users, H 2 (TFLOP/s of real work; baseline: fastest form) ====")
    print("%-8s %5s %3s %4s | %6s | %-15s | %-15s | %s" % ("shape", "L", "Tq", "dh", "ours", "cuDNN (form)",
                                                          "flash (form)", "ours/cuDNN  ours/flash"))
    for shape in shapes():
        o = ours.get(shape, 0)
        c, f = best.get((shape, "cudnn"), (0, "n/a")), best.get((shape, "flash"), (0, "n/a"))
        ratio = lambda b: "%.2fx" % (o / b[0]) if o and b[0] else "n/a"  # noqa: E731
        print("%-8s %5d %3d %4d | %6.1f | %6.1f %-8s | %6.1f %-8s | %-10s %s" % (
            shape + (o, c[0], c[1], f[0], f[1], ratio(c), ratio(f))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
