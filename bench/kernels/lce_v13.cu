/* lce_v13.cu - LCE on k_lce_ws with clusters of 4 (lost). Benchmark only.
 *
 * What it tries: where D has an even number of 128-wide blocks and M an
 * even number of tiles, a cluster of 4 CTAs takes 2 d blocks x 2 m tiles;
 * W halves are multicast to the pair of one m tile and E halves (one
 * warpgroup's 64 d each) to the pair of one d block, so both operands'
 * L2 reads halve (production's clusters of 2 share W only).
 * What it measured (H200, bf16, C 1024, M 433, D 256, ratio 70): predicted
 * ~0.32 ms; measured 0.39-0.41 ms, 0.390 in the 2026-12-01 final call,
 * against 0.376 ms for clusters of 2. Not profiled. (bench/kernels/NOTES.md.)
 * The template is production's (kernels/cuda/lce_kern.cuh, CLMAX = 4).
 */
#include "bench/kernels/variants.cuh"
#include "kernels/cuda/lce_kern.cuh"

int lce_v13(LCE_VARIANT_ARGS)
{
    if (!lce_ws_takes(s, kc, m, d, "lce_v13", err))
        return -1;
    auto f = cu_dt(s) == CU_BF16 ? lce_ws_run<__nv_bfloat16, EPI_STM, 4>
                                 : lce_ws_run<__half, EPI_STM, 4>;
    return f(s, eu, nu, ec, nc, map, w_user, w_cand, ku, kc, m, d, z, err);
}
