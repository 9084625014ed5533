/* mixture.cu - the CUDA mixture op (MMoE/PLE expert gating).
 *
 * Why this exists: an MMoE tower mixes E expert outputs with a per-row
 * softmax gate. Fused in one kernel: a warp per row computes the softmax
 * (max-subtracted, fp32; lane l holds experts l and l + 32), then walks the
 * row's width in 16-byte vectors (or elements), summing g_e * expert_e in
 * increasing e, the gate weights read from the warp's shared slots. The expert pointers
 * travel by value in the launch (at most BK_MIX_MAX_EXPERTS), so nothing
 * is allocated or copied per call.
 */
#include <math.h>

#include "kernels/cuda/cuda_internal.h"

#define MX_WARPS 8 /* rows per block */

struct mix_experts {
    const void *p[BK_MIX_MAX_EXPERTS];
};

template <typename T, bool VEC>
__global__ void __launch_bounds__(32 * MX_WARPS)
k_mixture(mix_experts ex, int E, const T *__restrict__ gate, size_t n, int width,
          T *__restrict__ out)
{
    constexpr int V = VEC ? cu_vec<T>::V : 1;
    const int lane = threadIdx.x & 31;
    const size_t r = (size_t)blockIdx.x * MX_WARPS + (threadIdx.x >> 5);
    if (r >= n)
        return;
    const T *g = gate + r * E;
    float g0 = lane < E ? cu_tof<T>(g[lane]) : -INFINITY;
    float g1 = lane + 32 < E ? cu_tof<T>(g[lane + 32]) : -INFINITY;
    float m = fmaxf(g0, g1);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    g0 = lane < E ? expf(g0 - m) : 0.0f;
    g1 = lane + 32 < E ? expf(g1 - m) : 0.0f;
    float sum = g0 + g1;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        sum += __shfl_xor_sync(0xffffffffu, sum, o);
    const float inv = 1.0f / sum;
    __shared__ float gw[MX_WARPS][BK_MIX_MAX_EXPERTS];
    float *gr = gw[threadIdx.x >> 5];
    gr[lane] = g0 * inv;
    gr[lane + 32] = g1 * inv;
    __syncwarp();
    for (int j = lane * V; j < width; j += 32 * V) {
        float acc[V], f[V];
#pragma unroll
        for (int q = 0; q < V; q++)
            acc[q] = 0.0f;
        for (int e = 0; e < E; e++) {
            const float ge = gr[e];
            const T *x = (const T *)ex.p[e] + r * width + j;
            if constexpr (VEC) {
                cu_vec<T>::load(x, f);
            } else {
                f[0] = cu_tof<T>(*x);
            }
#pragma unroll
            for (int q = 0; q < V; q++)
                acc[q] = fmaf(ge, f[q], acc[q]);
        }
        if constexpr (VEC) {
            cu_vec<T>::store(out + r * width + j, acc);
        } else {
            out[r * width + j] = cu_fromf<T>(acc[0]);
        }
    }
}

int cuda_mixture(bk_stream *s, const void *const *experts, int n_experts, const void *gate, int n,
                 int width, void *out, bk_err *err)
{
    cu_prof_scope prof_(s, "mixture");
    if (n_experts < 1 || n_experts > BK_MIX_MAX_EXPERTS) {
        bk_seterr(err, "mixture: %d experts (1..%d)", n_experts, BK_MIX_MAX_EXPERTS);
        return -1;
    }
    if (n <= 0 || width <= 0)
        return 0;
    mix_experts ex;
    const int v = 16 / (int)s->be->act_size;
    bool vec = width % v == 0 && cu_aligned16(out);
    for (int e = 0; e < n_experts; e++) {
        if (!experts[e]) {
            bk_seterr(err, "mixture: expert %d has no tensor", e);
            return -1;
        }
        ex.p[e] = experts[e];
        vec = vec && cu_aligned16(experts[e]);
    }
    if (prof_.on()) /* every expert's rows and the gate read, out written */
        prof_.work(0, ((double)n_experts * n * width + (double)n * n_experts + (double)n * width) *
                          s->be->act_size);
    if (cu_enter(s, err))
        return -1;
    const unsigned grid = (unsigned)(((size_t)n + MX_WARPS - 1) / MX_WARPS);
    CU_DISPATCH(cu_dt(s), {
        if (vec)
            k_mixture<T, true><<<grid, 32 * MX_WARPS, 0, s->st>>>(ex, n_experts, (const T *)gate,
                                                                  (size_t)n, width, (T *)out);
        else
            k_mixture<T, false><<<grid, 32 * MX_WARPS, 0, s->st>>>(ex, n_experts, (const T *)gate,
                                                                   (size_t)n, width, (T *)out);
    });
    return cu_check_launch(s, err, "mixture");
}
