/* lce_v9.cu - LCE on k_lce_ws without clusters (lost). Benchmark only.
 *
 * What it tries: production's warp-specialized wgmma kernel (TMA producer
 * thread, 4 x 44 KiB mbarrier ring, two consumer warpgroups with A = E^T
 * MN-major from shared memory, one wgmma group in flight, TMA tensor stores
 * of half tiles) with one CTA per cluster everywhere: each CTA loads its own
 * W tile, so W crosses L2 once per 128-wide d block.
 * What it measured (H200, bf16, C 1024, M 433, D 256, ratio 70): 0.44 ms
 * when it was new (2026-12-01), 0.436 ms in the final call, against 0.376
 * ms for production's 2-CTA clusters that share W through TMA multicast
 * (where D has an even number of 128-wide blocks; production runs this
 * same instantiation, CL = 1, where that number is odd). ncu showed the
 * mainloop bound by L2 delivery (~7 TB/s, 35% of warp samples at the full
 * barrier), which is what the clusters relieved. (bench/kernels/NOTES.md.)
 * The template is production's (kernels/cuda/lce_kern.cuh, CLMAX = 1).
 */
#include "bench/kernels/variants.cuh"
#include "kernels/cuda/lce_kern.cuh"

int lce_v9(LCE_VARIANT_ARGS)
{
    if (!lce_ws_takes(s, kc, m, d, "lce_v9", err))
        return -1;
    auto f = cu_dt(s) == CU_BF16 ? lce_ws_run<__nv_bfloat16, EPI_STM, 1>
                                 : lce_ws_run<__half, EPI_STM, 1>;
    return f(s, eu, nu, ec, nc, map, w_user, w_cand, ku, kc, m, d, z, err);
}
