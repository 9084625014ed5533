/* lce_v10.cu - LCE on k_lce_ws without its epilogue: a timing diagnostic,
 * wrong results by design. Benchmark only.
 *
 * What it tries: production's kernel and launch (2-CTA clusters) with
 * EPI_NONE, so the consumers neither add the user term nor store Z (they
 * only keep their accumulators live); the time is the mainloop's, the
 * difference to production the epilogue's.
 * What it measured (H200, bf16, C 1024, M 433, D 256, ratio 70; floor
 * 0.25-0.26 ms): 0.39 ms without clusters (1.53x floor), 0.34 with the
 * first clusters, 0.29-0.31 ms (1.17-1.21x floor) once the user term moved
 * after the MMAs, against 0.376 ms with the epilogue: the epilogue (the
 * fp32 user term, 0.45 GB, and Z, 0.23 GB, through L2) is the largest cost
 * left. (bench/kernels/NOTES.md, bench/RESULTS.md 2026-12-01.)
 * The template is production's (kernels/cuda/lce_kern.cuh, EPI_NONE).
 */
#include "bench/kernels/variants.cuh"
#include "kernels/cuda/lce_kern.cuh"

int lce_v10(LCE_VARIANT_ARGS)
{
    if (!lce_ws_takes(s, kc, m, d, "lce_v10", err))
        return -1;
    auto f = cu_dt(s) == CU_BF16 ? lce_ws_run<__nv_bfloat16, EPI_NONE, 2>
                                 : lce_ws_run<__half, EPI_NONE, 2>;
    return f(s, eu, nu, ec, nc, map, w_user, w_cand, ku, kc, m, d, z, err);
}
