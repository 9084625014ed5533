/* attention_v3.cu - the wgmma attention kernel with its features switched
 * off one at a time: timing diagnostics (the former IKBO_ATT_WG_DIAG
 * letters). Benchmark only.
 *
 * What it tries: production's k_att_wg (kernels/cuda/att_wg.cuh: producer
 * warpgroup with a cp.async + mbarrier ring, two consumer warpgroups,
 * persistent over (tile, head) work items) without
 *   p  the named-barrier ping-pong between the consumer warpgroups,
 *   o  the overlap of a warpgroup's softmax with its own P V,
 *   f  the L2 prefetch of the next work item's Q rows,
 *   s  the 16-byte output stores (production keeps the 4-byte ones only
 *      where o is not 16-byte aligned);
 * and, by exact name, the bounds (everything else production's):
 *   x  no softmax: S is packed as P as it is (ATTW_DG_NO_SOFTMAX), the
 *      time of the GEMMs, copies and turns alone,
 *   k  no K/V copies: the producer marks each block full at once
 *      (ATTW_DG_NO_KV), the time without waiting for K/V,
 *   xk both,
 *   e  the softmax without its exponentials (ATTW_DG_NO_EX2: P is the
 *      exponent itself), the share of the special-function unit;
 * and the traces:
 *   t  production, CTA 0 recording when each step of its consumers' turns
 *      ends (ATTW_DG_TRACE); attention_trace_report prints the mean
 *      cycles of each step; tx, tk, tp: the trace of x, k and of p.
 * The candidates of 2026-12-04 that lost or were neutral (a quarter of the
 * exponentials on the FMA pipe, 708c23f; the row max as a tree, 110f9b7,
 * or exchanged on a vote, 3f2a22c) left the kernel; those commits rerun
 * them (bench/RESULTS.md).
 * What it measured (H200, fp16, C 2048, H 2, dh 128, Tq 64, ratio 64): the
 * kernel with all four went from 320 (the earlier non-specialized wgmma
 * kernel) to 471 TFLOP/s at L = 1024 (commit 0a0ad84); 16-byte stores took
 * L = 512 from 383 to 402 TFLOP/s, L = 1024 470 -> 472, L = 2048 520 -> 530
 * (commit 0ff1a91). The times of p, o and f alone were not recorded;
 * bench_kernels (--only att) prints each letter's now.
 * The template is production's; PP, OV and the flags are its parameters.
 */
#include <stdio.h>
#include <string.h>

#include "bench/kernels/variants.cuh"
#define IKBO_ATT_TRACE /* this file's k_att_wg records ATTW_DG_TRACE's steps */
#include "kernels/cuda/att_wg.cuh"

template <typename T, int DH>
static int att_diag(bk_stream *s, const char *off, const att_job<T> &j, bk_err *err)
{
    /* The bounds, candidates and traces, by their exact names. */
    typedef int (*wg_fn)(bk_stream *, const att_job<T> &, int, bk_err *);
    static const struct {
        const char *name;
        wg_fn fn;
    } named[] = {
        {"x", launch_wg<T, DH, true, true, ATTW_DG_NO_SOFTMAX>},
        {"k", launch_wg<T, DH, true, true, ATTW_DG_NO_KV>},
        {"xk", launch_wg<T, DH, true, true, ATTW_DG_NO_SOFTMAX | ATTW_DG_NO_KV>},
        {"e", launch_wg<T, DH, true, true, ATTW_DG_NO_EX2>},
        {"t", launch_wg<T, DH, true, true, ATTW_DG_TRACE>},
        {"tx", launch_wg<T, DH, true, true, ATTW_DG_TRACE | ATTW_DG_NO_SOFTMAX>},
        {"tk", launch_wg<T, DH, true, true, ATTW_DG_TRACE | ATTW_DG_NO_KV>},
        {"tp", launch_wg<T, DH, false, true, ATTW_DG_TRACE>},
    };
    const int flags0 = attw_flags(j);
    for (const auto &d : named)
        if (!strcmp(off, d.name))
            return d.fn(s, j, flags0, err);
    /* Features off: any of p, o, f, s. */
    const bool no_pp = strchr(off, 'p'), no_ov = strchr(off, 'o');
    int flags = flags0;
    if (strchr(off, 'f'))
        flags &= ~ATTW_PREFETCH_Q;
    if (strchr(off, 's'))
        flags &= ~ATTW_VEC_STORE;
    if (no_pp)
        return no_ov ? launch_wg<T, DH, false, false>(s, j, flags, err)
                     : launch_wg<T, DH, false, true>(s, j, flags, err);
    return no_ov ? launch_wg<T, DH, true, false>(s, j, flags, err)
                 : launch_wg<T, DH, true, true>(s, j, flags, err);
}

template <typename T>
static int att_diag_t(bk_stream *s, const char *off, const void *q, const void *k, const void *v,
                      const int64_t *offsets, int nu, const int32_t *map, int nc, int tq,
                      int heads, int dh, void *o, bk_err *err)
{
    att_job<T> j = {};
    j.q = (const T *)q, j.k = (const T *)k, j.v = (const T *)v, j.o = (T *)o;
    j.off = offsets, j.map = map, j.nu = nu, j.nc = nc, j.tq = tq, j.heads = heads;
    j.ldkv = heads * dh, j.go = (int64_t)tq * heads * dh; /* packed */
    return dh == 64 ? att_diag<T, 64>(s, off, j, err) : att_diag<T, 128>(s, off, j, err);
}

int attention_v3(bk_stream *s, const char *off, const void *q, const void *k, const void *v,
                 const int64_t *offsets, int nu, const int32_t *map, int nc, int tq, int heads,
                 int dh, void *o, bk_err *err)
{
    if (cu_dt(s) == CU_F32 || (dh != 64 && dh != 128) || nc <= 0 || nu <= 0) {
        bk_seterr(err, "attention_v3: bf16/fp16, dh 64 or 128, candidates and users only");
        return -1;
    }
    auto f = cu_dt(s) == CU_BF16 ? att_diag_t<__nv_bfloat16> : att_diag_t<__half>;
    return f(s, off, q, k, v, offsets, nu, map, nc, tq, heads, dh, o, err);
}

/* Steps of ATTW_DG_TRACE's record, in the order a turn takes them. */
static const char *const tr_name[] = {"",           "top (after the last turn)", "K/V wait",
                                      "turn wait",  "issue",                    "S wait",
                                      "softmax end", "P V wait",                "rescale, pack",
                                      "item start", "Q wait",                   "epilogue",
                                      "softmax max", "softmax exp and sums"};
static_assert(sizeof tr_name / sizeof *tr_name == ATTW_TR_STEPS, "a name for each step");

int attention_trace_report(const char *raw, bk_err *err)
{
    static unsigned long long h[2][ATT_TRACE_N];
    int n[2];
    if (cudaMemcpyFromSymbol(h, att_trace, sizeof h) != cudaSuccess ||
        cudaMemcpyFromSymbol(n, att_trace_n, sizeof n) != cudaSuccess) {
        bk_seterr(err, "attention_trace_report: reading the trace failed");
        return -1;
    }
    FILE *f = raw ? fopen(raw, "w") : NULL;
    double sum[ATTW_TR_STEPS] = {0}, period = 0;
    long cnt[ATTW_TR_STEPS] = {0}, np = 0;
    for (int wg = 0; wg < 2; wg++) {
        const int m = n[wg] < ATT_TRACE_N ? n[wg] : ATT_TRACE_N;
        unsigned long long last_top = 0;
        for (int i = 0; i < m; i++) {
            const int st = (int)(h[wg][i] & 15);
            const unsigned long long t = h[wg][i] >> 4;
            if (f)
                fprintf(f, "%d %d %llu\n", wg, st, t);
            if (st <= 0 || st >= ATTW_TR_STEPS)
                continue;
            if (i > 0) {
                sum[st] += (double)(t - (h[wg][i - 1] >> 4));
                cnt[st]++;
            }
            if (st == ATTW_TR_TOP) {
                if (last_top && (h[wg][i - 1] & 15) == ATTW_TR_END) {
                    period += (double)(t - last_top);
                    np++;
                }
                last_top = t;
            }
            if (st == ATTW_TR_ITEM)
                last_top = 0;
        }
    }
    if (f)
        fclose(f);
    printf("    trace (CTA 0, cycles a step, mean over %ld turns of both warpgroups; turn period %.0f):\n",
           cnt[ATTW_TR_TOP], np ? period / np : 0.0);
    for (int st = 1; st < ATTW_TR_STEPS; st++)
        printf("      %-28s %8.0f  (%ld)\n", tr_name[st], cnt[st] ? sum[st] / cnt[st] : 0.0, cnt[st]);
    return 0;
}
