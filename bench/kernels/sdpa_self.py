#!/usr/bin/env python3
"""sdpa_self.py - PyTorch's SDPA baselines for self-attention over jagged histories.

Why this exists: issue 15 asks for our self_attention kernel's TFLOP/s beside
what a user would run instead - PyTorch's scaled_dot_product_attention with
the cuDNN backend, and flash - on the same jagged histories, in the same
device call. The histories are bench_kernels.cu's (bench_self_attention): 64
users, lengths L/4 + ((37 u) mod 64) * 3L/126 for mean L = 512, 1024, 2048,
H = 2, dh = 128, fp16. Each backend runs in two forms where it takes them:
  nested  a jagged nested tensor (torch.nested, layout=torch.jagged): only
          real rows and keys;
  padded  [64, H, L_max, dh] padded to the longest history. Causal: exact
          for the real rows (a real row never sees a padding key). Full:
          the padding keys take part (the work a padded call does anyway).
TFLOP/s always count only the real work: 4 dh H sum_u L_u^2 (full) or
4 dh H sum_u L_u (L_u + 1) / 2 (causal). Times: median of 20 CUDA-event
intervals after 3 warm-up calls.

    sdpa_self.py [--ours BENCH_LOG]

With --ours, reads bench_kernels' "SELF fp16 ..." lines from BENCH_LOG and
prints ours / cuDNN (the faster cuDNN form) per point, last.
"""
import argparse
import re
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
import torch.nn.functional as F

U, H, DH = 64, 2, 128


def lengths(L):
    return [L // 4 + ((37 * u) % 64) * 3 * L // 126 for u in range(U)]


def work(lens, causal):
    return sum(n * (n + 1) / 2 if causal else n * n for n in lens) * 4.0 * DH * H


def median_ms(fn, warm=3, reps=20):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2]


def run(backend, form, lens, causal):
    g = torch.Generator(device="cuda").manual_seed(7)
    dev, dt = "cuda", torch.float16
    if form == "padded":
        lm = max(lens)
        q, k, v = (torch.rand(U, H, lm, DH, device=dev, dtype=dt, generator=g) * 3 - 1.5 for _ in range(3))
    else:
        parts = [[(torch.rand(n, H, DH, device=dev, dtype=dt, generator=g) * 3 - 1.5) for n in lens]
                 for _ in range(3)]
        q, k, v = (torch.nested.nested_tensor(p, layout=torch.jagged).transpose(1, 2) for p in parts)
    with sdpa_kernel(backend):
        return median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ours", help="bench_kernels log with SELF lines")
    a = ap.parse_args()
    print("torch %s, %s" % (torch.__version__, torch.cuda.get_device_name()))
    base = {}
    for L in (512, 1024, 2048):
        lens = lengths(L)
        for causal in (1, 0):
            fl = work(lens, causal)
            for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
                for form in ("nested", "padded"):
                    try:
                        ms = run(be, form, lens, causal)
                        tf = fl / (ms * 1e-3) / 1e12
                        base[(L, causal, name, form)] = tf
                        print("SDPA %s %s L %d causal %d: %.4f ms %.1f TFLOP/s" % (name, form, L, causal, ms, tf))
                    except Exception as e:  # a backend that does not take this form
                        msg = str(e).strip().splitlines()[0][:140] if str(e).strip() else type(e).__name__
                        print("SDPA %s %s L %d causal %d: n/a (%s)" % (name, form, L, causal, msg))
    if not a.ours:
        return 0
    ours = {}
    for line in open(a.ours):
        m = re.match(r"SELF fp16 L (\d+) causal (\d) softmax ours ([\d.]+) ms ([\d.]+) TFLOP/s", line)
        if m:
            ours[(int(m.group(1)), int(m.group(2)))] = float(m.group(4))
    print("\n==== self_attention fp16, 64 users, H 2, dh 128 (TFLOP/s of real work) ====")
    print("%-6s %-6s %7s %13s %13s %13s %13s %9s" % ("L", "causal", "ours", "cudnn nested", "cudnn padded",
                                                     "flash nested", "flash padded", "ours/cuDNN"))

    def f(x):
        return "%13.1f" % x if x else "%13s" % "n/a"
    for L in (512, 1024, 2048):
        for causal in (1, 0):
            o = ours.get((L, causal), 0)
            c = [base.get((L, causal, "cudnn", x), 0) for x in ("nested", "padded")]
            fl = [base.get((L, causal, "flash", x), 0) for x in ("nested", "padded")]
            best = max(c)
            print("%-6d %-6d %7.1f %s %s %s %s %9s" % (L, causal, o, f(c[0]), f(c[1]), f(fl[0]), f(fl[1]),
                                                      "%.2fx" % (o / best) if best and o else "n/a"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
