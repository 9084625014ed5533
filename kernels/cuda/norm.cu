/* norm.cu - the CUDA layer_norm op.
 *
 * Why this exists: MMoE/DCNv2 towers normalize every row of an activation
 * (each token, each history event). One warp per row, fused: the row is
 * read once into registers (16-byte vectors, when it fits in NV vectors a
 * lane; longer rows are re-read from cache per pass), then the mean, the
 * biased variance as the mean of squared deviations (two passes, fp32),
 * and the scaled, shifted output. The warp's shuffle reductions run in a
 * fixed order that depends only on dim, so a row's result does not depend
 * on the batch around it.
 */
#include "kernels/cuda/cuda_internal.h"

#define LN_WARPS 8 /* rows per block */
#define LN_NV 8    /* 16-byte vectors a lane keeps in registers */

__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* CACHED: dim <= 32 * V * LN_NV and 16-byte vectors (dim % V == 0, aligned
 * rows); else element by element with the row re-read in each pass. */
template <typename T, bool CACHED>
__global__ void __launch_bounds__(32 * LN_WARPS)
k_layer_norm(const T *x, size_t rows, int dim, const T *__restrict__ w, const T *__restrict__ b,
             float eps, T *out)
{
    constexpr int V = cu_vec<T>::V;
    const int lane = threadIdx.x & 31;
    const size_t r = (size_t)blockIdx.x * LN_WARPS + (threadIdx.x >> 5);
    if (r >= rows)
        return;
    const T *xr = x + r * dim;
    T *orow = out + r * dim;
    const float inv = 1.0f / (float)dim;
    if constexpr (CACHED) {
        float f[LN_NV][V];
        float s = 0.0f;
#pragma unroll
        for (int q = 0; q < LN_NV; q++) {
            int j = (q * 32 + lane) * V;
            if (j < dim) {
                cu_vec<T>::load(xr + j, f[q]);
#pragma unroll
                for (int k = 0; k < V; k++)
                    s += f[q][k];
            }
        }
        const float mean = warp_sum(s) * inv;
        float ss = 0.0f;
#pragma unroll
        for (int q = 0; q < LN_NV; q++)
            if ((q * 32 + lane) * V < dim) {
#pragma unroll
                for (int k = 0; k < V; k++) {
                    float d = f[q][k] - mean;
                    ss += d * d;
                }
            }
        const float rstd = 1.0f / sqrtf(warp_sum(ss) * inv + eps);
#pragma unroll
        for (int q = 0; q < LN_NV; q++) {
            int j = (q * 32 + lane) * V;
            if (j < dim) {
                float fw[V], fb[V];
                cu_vec<T>::load(w + j, fw);
                cu_vec<T>::load(b + j, fb);
#pragma unroll
                for (int k = 0; k < V; k++)
                    f[q][k] = (f[q][k] - mean) * rstd * fw[k] + fb[k];
                cu_vec<T>::store(orow + j, f[q]);
            }
        }
    } else {
        float s = 0.0f;
        for (int j = lane; j < dim; j += 32)
            s += cu_tof<T>(xr[j]);
        const float mean = warp_sum(s) * inv;
        float ss = 0.0f;
        for (int j = lane; j < dim; j += 32) {
            float d = cu_tof<T>(xr[j]) - mean;
            ss += d * d;
        }
        const float rstd = 1.0f / sqrtf(warp_sum(ss) * inv + eps);
        for (int j = lane; j < dim; j += 32)
            orow[j] = cu_fromf<T>((cu_tof<T>(xr[j]) - mean) * rstd * cu_tof<T>(w[j]) +
                                  cu_tof<T>(b[j]));
    }
}

int cuda_layer_norm(bk_stream *s, const void *x, int rows, int dim, const bk_weight *w,
                    const bk_weight *b, float eps, void *out, bk_err *err)
{
    cu_prof_scope prof_(s, "layer_norm");
    if (rows <= 0 || dim <= 0)
        return 0;
    if (!w || !b || w->rows * w->cols != dim || b->rows * b->cols != dim || w->rows != 1 ||
        b->rows != 1) {
        bk_seterr(err, "layer_norm: weight [%d, %d] and bias [%d, %d] do not match dim %d",
                  w ? w->rows : 0, w ? w->cols : 0, b ? b->rows : 0, b ? b->cols : 0, dim);
        return -1;
    }
    if (!(eps > 0.0f)) {
        bk_seterr(err, "layer_norm: eps %g is not positive", (double)eps);
        return -1;
    }
    if (prof_.on()) /* x, out; w and b once */
        prof_.work(0, (2.0 * rows * dim + 2.0 * dim) * s->be->act_size);
    if (cu_enter(s, err))
        return -1;
    const int v = 16 / (int)s->be->act_size;
    const bool cached = dim % v == 0 && dim <= 32 * v * LN_NV && cu_aligned16(x) &&
                        cu_aligned16(out);
    const unsigned grid = (unsigned)(((size_t)rows + LN_WARPS - 1) / LN_WARPS);
    CU_DISPATCH(cu_dt(s), {
        if (cached)
            k_layer_norm<T, true><<<grid, 32 * LN_WARPS, 0, s->st>>>(
                (const T *)x, (size_t)rows, dim, (const T *)w->data, (const T *)b->data, eps,
                (T *)out);
        else
            k_layer_norm<T, false><<<grid, 32 * LN_WARPS, 0, s->st>>>(
                (const T *)x, (size_t)rows, dim, (const T *)w->data, (const T *)b->data, eps,
                (T *)out);
    });
    return cu_check_launch(s, err, "layer_norm");
}
