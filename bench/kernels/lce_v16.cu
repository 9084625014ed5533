/* lce_v16.cu - LCE on k_lce_ws with each cluster walking one contiguous
 * run of candidates for a fixed (m tile, d block), the user term kept in
 * registers while the run stays on one user. Benchmark only: it lost.
 *
 * What it tries: production's persistent CTAs take tiles strided over the
 * grid (tile k, k + grid, ...), so each tile loads its user's term (in T,
 * 57 KB a tile from L2; 0.23 GB at C 1120). Walking contiguous candidates,
 * a cluster meets a new user about once per 70 tiles at ratio 70, and the
 * load is skipped otherwise; the clusters of the other m tile walk the
 * same candidates at the same pace, so E still crosses HBM once.
 * Prediction (H200, bf16, ratio 70): 0.333 -> 0.318-0.325 ms; at ratio 2
 * (a new user every other tile) no gain. Measured (8ad5792, beside
 * production in one run): ratio 70 0.339 vs 0.338, 2 0.551 vs 0.540, 10
 * 0.384 vs 0.374, 1000 0.336 vs 0.336, fp16 0.356 vs 0.357: no gain, a
 * loss at small ratios. With the user term in T its loads were already
 * hidden under the last wgmmas; what is left of the epilogue is Z's
 * staging and store (bench/kernels/NOTES.md, 2026-12-04).
 * The template is production's (kernels/cuda/lce_kern.cuh, UC = true).
 */
#include "bench/kernels/variants.cuh"
#include "kernels/cuda/lce_kern.cuh"

int lce_v16(LCE_VARIANT_ARGS)
{
    if (!lce_ws_takes(s, kc, m, d, "lce_v16", err))
        return -1;
    auto f = cu_dt(s) == CU_BF16 ? lce_ws_run<__nv_bfloat16, EPI_STM, 2, __nv_bfloat16, true>
                                 : lce_ws_run<__half, EPI_STM, 2, __half, true>;
    return f(s, eu, nu, ec, nc, map, w_user, w_cand, ku, kc, m, d, z, err);
}
