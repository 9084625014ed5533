/* lce_v15.cu - LCE on k_lce_ws with the epilogue staged by lane shuffles
 * and 4-byte shared stores: production until 2026-12-04. Benchmark only.
 *
 * What was tried: k_lce_ws's accumulators hold d rows x m columns, Z wants
 * m rows of d; the old epilogue swapped values between lane pairs (one
 * shuffle per pair of outputs) and wrote 4 bytes a store, 56 shuffles and
 * 56 stores per thread per tile. stmatrix.trans (production now) writes
 * four transposed 8 x 8 blocks per instruction from the fragments as they
 * are: 14 instructions per thread per tile, no shuffle.
 * Prediction and outcome: bench/kernels/NOTES.md, 2026-12-04.
 * The template is production's (kernels/cuda/lce_kern.cuh, EPI_SHFL).
 */
#include "bench/kernels/variants.cuh"
#include "kernels/cuda/lce_kern.cuh"

int lce_v15(LCE_VARIANT_ARGS)
{
    if (!lce_ws_takes(s, kc, m, d, "lce_v15", err))
        return -1;
    auto f = cu_dt(s) == CU_BF16 ? lce_ws_run<__nv_bfloat16, EPI_SHFL, 2>
                                 : lce_ws_run<__half, EPI_SHFL, 2>;
    return f(s, eu, nu, ec, nc, map, w_user, w_cand, ku, kc, m, d, z, err);
}
