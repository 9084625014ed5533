/* lce_v17.cu - LCE on k_lce_ws with consumer warpgroup 1 trailing
 * warpgroup 0 by 1, 2 or 3 K slices on every tile. Benchmark only.
 *
 * What is tried: production's two consumer warpgroups read each slice of
 * the shared ring together, so both run their epilogue (user term, Z
 * staging, TMA store: ~0.045 ms of 0.333 at bf16 ratio 70) at the same
 * time and the tensor cores idle meanwhile. A warpgroup alone keeps them
 * busy, so if one trails the other by as many slices as an epilogue lasts,
 * each epilogue runs under the other's last wgmmas and W stays shared (a
 * ping-pong of separate tiles would double W's or E's L2 reads per FLOP).
 * The cost: the slots the trail holds are not prefetch depth any more.
 * Prediction and outcome: bench/kernels/NOTES.md, 2026-12-04 (seventh
 * session). The template is production's (kernels/cuda/lce_kern.cuh, LAG).
 */
#include "bench/kernels/variants.cuh"
#include "kernels/cuda/lce_kern.cuh"

template <int LAG> static int lce_v17_lag(LCE_VARIANT_ARGS)
{
    if (!lce_ws_takes(s, kc, m, d, "lce_v17", err))
        return -1;
    auto f = cu_dt(s) == CU_BF16 ? lce_ws_run<__nv_bfloat16, EPI_STM, 2, __nv_bfloat16, LAG>
                                 : lce_ws_run<__half, EPI_STM, 2, __half, LAG>;
    return f(s, eu, nu, ec, nc, map, w_user, w_cand, ku, kc, m, d, z, err);
}

int lce_v17_1(LCE_VARIANT_ARGS) { return lce_v17_lag<1>(s, eu, nu, ec, nc, map, w_user, w_cand, ku, kc, m, d, z, err); }
int lce_v17_2(LCE_VARIANT_ARGS) { return lce_v17_lag<2>(s, eu, nu, ec, nc, map, w_user, w_cand, ku, kc, m, d, z, err); }
int lce_v17_3(LCE_VARIANT_ARGS) { return lce_v17_lag<3>(s, eu, nu, ec, nc, map, w_user, w_cand, ku, kc, m, d, z, err); }
