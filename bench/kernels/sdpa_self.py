#!/usr/bin/env python3
"""sdpa_self.py - PyTorch's SDPA baselines for self-attention over jagged histories.

Why this exists: issue 15 asks for our self_attention kernel's TFLOP/s beside
what a user would run instead - PyTorch's scaled_dot_product_attention with
the cuDNN backend, and flash - on the same jagged histories, in the same
device call. The histories are bench_kernels.cu's (bench_self_attention): 64
users, lengths L/4 + ((37 u) mod 64) * 3L/126 for mean L = 512, 1024, 2048,
H = 2, dh = 128, fp16. Each backend runs in the forms it takes:
  varlen  its own packed entry point with cumulative sequence lengths
          (aten._flash_attention_forward / aten._cudnn_attention_forward):
          only real rows and keys;
  nested  a jagged nested tensor (torch.nested.nested_tensor_from_jagged,
          seqlens cached) through scaled_dot_product_attention;
  padded  [64, H, L_max, dh] padded to the longest history. Causal: exact
          for the real rows (a real row never sees a padding key). Full:
          the padding keys take part (the work a padded call does anyway);
  dense   every user at the mean length, no padding: the backend's own
          rate on this shape without jaggedness (a reference, not a
          baseline for the jagged problem).
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


def inputs(form, lens, g):
    dev, dt = "cuda", torch.float16
    if form in ("padded", "dense"):
        lm = max(lens)
        return [torch.rand(U, H, lm, DH, device=dev, dtype=dt, generator=g) * 3 - 1.5 for _ in range(3)]
    total = sum(lens)
    return [torch.rand(total, H, DH, device=dev, dtype=dt, generator=g) * 3 - 1.5 for _ in range(3)]


def run(backend, form, lens, causal):
    """ms of one call; form: nested (NJT over the packed rows, its seqlens
    cached), varlen (the backend's own cu_seqlens entry point), padded, dense
    (every user at the mean L: the backend's rate without padding)."""
    g = torch.Generator(device="cuda").manual_seed(7)
    if form == "dense":
        lens = [sum(lens) // len(lens)] * len(lens)
    q, k, v = inputs(form, lens, g)
    if form in ("padded", "dense"):
        with sdpa_kernel(backend):
            return median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal)))
    off = torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), device="cuda")
    lm = max(lens)
    if form == "nested":
        nj = [torch.nested.nested_tensor_from_jagged(x, off, min_seqlen=min(lens), max_seqlen=lm).transpose(1, 2)
              for x in (q, k, v)]
        with sdpa_kernel(backend):
            return median_ms(lambda: F.scaled_dot_product_attention(*nj, is_causal=bool(causal)))
    cu = off.to(torch.int32)
    if backend == SDPBackend.FLASH_ATTENTION:
        fn = lambda: torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, lm, lm, 0.0, bool(causal), False)  # noqa: E731
    else:
        fn = lambda: torch.ops.aten._cudnn_attention_forward(q, k, v, None, cu, cu, lm, lm, False, 0.0,  # noqa: E731
                                                              bool(causal), False)
    return median_ms(fn)


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
                for form in ("varlen", "nested", "padded", "dense"):
                    try:
                        ms = run(be, form, lens, causal)
                        n = sum(lens) // len(lens)
                        tf = (work([n] * U, causal) if form == "dense" else fl) / (ms * 1e-3) / 1e12
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
    forms = ("varlen", "nested", "padded")
    print("%-5s %-6s %6s | cuDNN %-22s | flash %-22s | %-13s %s" % (
        "L", "causal", "ours", " / ".join(forms), " / ".join(forms), "dense cuDNN/flash", "ours/cuDNN(best jagged)"))

    def f(x):
        return "%6.1f" % x if x else "%6s" % "n/a"
    for L in (512, 1024, 2048):
        for causal in (1, 0):
            o = ours.get((L, causal), 0)
            c = [base.get((L, causal, "cudnn", x), 0) for x in forms]
            fl = [base.get((L, causal, "flash", x), 0) for x in forms]
            dc, df = base.get((L, causal, "cudnn", "dense"), 0), base.get((L, causal, "flash", "dense"), 0)
            best = max(c)
            print("%-5d %-6d %6.1f | %s | %s | %s %s %s" % (
                L, causal, o, " ".join(f(x) for x in c), " ".join(f(x) for x in fl), f(dc), f(df),
                "%.2fx" % (o / best) if best and o else "n/a"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
