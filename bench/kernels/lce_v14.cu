/* lce_v14.cu - LCE on k_lce_ws with the user term stored in the activation
 * dtype (bf16/fp16) instead of fp32. Benchmark only until it wins.
 *
 * What it tries: the epilogue reads each candidate tile's user term from L2
 * (fp32: 0.45 GB at C 1120, M 433, D 256); lce_v10 put the epilogue at
 * ~0.07 ms of production's 0.37. Stored in T, the user term is half the
 * bytes; the cost is one more rounding (the user term's, before the fp32
 * sum), so Z differs from production by about one unit in the last place.
 * Prediction (H200, bf16, ratio 70): 0.369 -> 0.340-0.355 ms.
 * The template is production's (kernels/cuda/lce_kern.cuh, YT = T).
 */
#include "bench/kernels/variants.cuh"
#include "kernels/cuda/lce_kern.cuh"

int lce_v14(LCE_VARIANT_ARGS)
{
    if (!lce_ws_takes(s, kc, m, d, "lce_v14", err))
        return -1;
    auto f = cu_dt(s) == CU_BF16 ? lce_ws_run<__nv_bfloat16, true, 2, __nv_bfloat16>
                                 : lce_ws_run<__half, true, 2, __half>;
    return f(s, eu, nu, ec, nc, map, w_user, w_cand, ku, kc, m, d, z, err);
}
