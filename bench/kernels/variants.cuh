/* variants.cuh - the kernel variants that live only in the benchmark.
 *
 * Why this exists: production (kernels/cuda) keeps the fastest kernel of
 * each IKBO op and the fallbacks some shape, dtype or alignment needs.
 * The versions that lost, and the timing diagnostics (wrong results by
 * design), sit beside their benchmark in numbered files, llm.c dev/cuda
 * style, each with a top comment saying what it tried and what it
 * measured (bench/kernels/NOTES.md has the whole history). They are
 * compiled into bench_kernels only (tests/gpu/build.sh, the Makefile),
 * which times them beside production. The numbers are the old
 * IKBO_CUDA_LCE variant numbers, so bench/RESULTS.md still reads right.
 *
 * Every LCE entry has cuda_lce's signature (bf16/fp16 only; -1 with err set
 * for a shape its kernel does not take); attention_v3 that of
 * cuda_attention plus the features to switch off.
 */
#ifndef IKBO_BENCH_VARIANTS_CUH
#define IKBO_BENCH_VARIANTS_CUH

#include "kernels/cuda/lce_kern.cuh" /* lce_ws_shape; includes cuda_internal.h */

#define LCE_VARIANT_ARGS                                                                    \
    bk_stream *s, const void *eu, int nu, const void *ec, int nc, const int32_t *map,       \
        const bk_weight *w_user, const bk_weight *w_cand, int ku, int kc, int m, int d,     \
        void *z, bk_err *err
typedef int (*lce_variant_fn)(LCE_VARIANT_ARGS);

int lce_v6(LCE_VARIANT_ARGS);  /* the older wgmma kernel k_lce_wg (lost)                */
int lce_v7(LCE_VARIANT_ARGS);  /* diagnostic: k_lce_wg without the user term            */
int lce_v8(LCE_VARIANT_ARGS);  /* diagnostic: k_lce_wg without the epilogue             */
int lce_v9(LCE_VARIANT_ARGS);  /* k_lce_ws without clusters everywhere (lost)           */
int lce_v10(LCE_VARIANT_ARGS); /* diagnostic: k_lce_ws without the epilogue             */
int lce_v13(LCE_VARIANT_ARGS); /* k_lce_ws with clusters of 4, W and E multicast (lost) */
int lce_v14(LCE_VARIANT_ARGS); /* k_lce_ws with the fp32 user term (lost, 2026-12-04)    */
int lce_v15(LCE_VARIANT_ARGS); /* k_lce_ws with the shuffle-staged epilogue             */

/* k_att_wg with features off (diagnostic): any of the letters 'p' (no
 * ping-pong between the consumer warpgroups), 'o' (no overlap of softmax
 * with the warpgroup's own P V), 'f' (no L2 prefetch of the next Q), 's'
 * (4-byte output stores where 16-byte ones could be used); or one of the
 * bounds 'x' (no softmax), 'k' (no K/V copies), 'xk', 'e' (no
 * exponentials); or a trace, 't', 'tx', 'tk' or 'tp' (attention_trace_report
 * prints it, and writes each record to `raw` unless NULL). dh 64/128. */
int attention_v3(bk_stream *s, const char *off, const void *q, const void *k, const void *v,
                 const int64_t *offsets, int nu, const int32_t *map, int nc, int tq, int heads,
                 int dh, void *o, bk_err *err);
int attention_trace_report(const char *raw, bk_err *err);

/* Shared by the k_lce_ws variants: whether k_lce_ws takes the call
 * (lce_kern.cuh's lce_ws_shape, production's rule without the alignment,
 * which the benchmark's buffers always have). */
static inline int lce_ws_takes(bk_stream *s, int kc, int m, int d, const char *name, bk_err *err)
{
    if (lce_ws_shape(cu_dt(s), kc, m, d))
        return 1;
    bk_seterr(err, "%s: bf16/fp16 with M, D >= 64, D %% 8 == 0 and Kc > 0 only", name);
    return 0;
}

#endif
