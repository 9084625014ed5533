/* lce_v14.cu - LCE on k_lce_ws with the user term stored in fp32: production
 * until 2026-12-04, lost to storing it in the activation dtype. Benchmark
 * only.
 *
 * What was tried: the epilogue reads each candidate tile's user term from
 * L2 (fp32: 0.45 GB at C 1120, M 433, D 256); lce_v10 put the epilogue at
 * ~0.09 ms of production's 0.37. Stored in bf16/fp16 (production now), it
 * is half the bytes, for one more rounding (of the user term, before the
 * fp32 sum). Predicted (H200, bf16, ratio 70) 0.369 -> 0.340-0.355 ms;
 * measured 0.370 -> 0.340 (ratio 2: 0.581 -> 0.531, 10: 0.401 -> 0.377,
 * 1000: 0.368 -> 0.341; fp16 ratio 70: 0.370 -> 0.350), Z moved by 2.3e-3
 * relative in bf16 and 2.8e-4 in fp16 (bench/RESULTS.md 2026-12-04).
 * This file keeps the fp32 user term timed beside production.
 * The template is production's (kernels/cuda/lce_kern.cuh, YT = float).
 */
#include "bench/kernels/variants.cuh"
#include "kernels/cuda/lce_kern.cuh"

int lce_v14(LCE_VARIANT_ARGS)
{
    if (!lce_ws_takes(s, kc, m, d, "lce_v14", err))
        return -1;
    auto f = cu_dt(s) == CU_BF16 ? lce_ws_run<__nv_bfloat16, EPI_STM, 2, float>
                                 : lce_ws_run<__half, EPI_STM, 2, float>;
    return f(s, eu, nu, ec, nc, map, w_user, w_cand, ku, kc, m, d, z, err);
}
