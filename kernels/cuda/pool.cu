/* pool.cu - the CUDA pool op (sum, mean, max, last) over tokens or jagged
 * events; mean_pool is pool's jagged mean.
 *
 * Why this exists: DLRM-style models reduce a row's tokens or a user's
 * history events to one vector. Two layouts, three kernels:
 * - jagged (offsets): a user's events can number thousands, so a block
 *   (row, 32 columns) has PL_LANES lanes per column, lane y taking events
 *   y, y + PL_LANES, ... with four loads in flight, and the lanes are
 *   combined in shared memory (one block per row with one thread per column
 *   serialized a 1024-event history into 1024 dependent steps);
 * - jagged, vector path (rows of whole 16-byte chunks, x and out aligned):
 *   the same split with 16-byte loads, PV_TPE threads a chunk row and
 *   PV_LANES event lanes a block, PV_IN loads in flight a thread (the
 *   scalar kernel's 2-byte loads kept the bench model's 16 x 1024 x 256
 *   mean at 8.8 us for 8 MB);
 * - tokens: k is small (a few to a few dozen), so one thread per output
 *   vector of 16 bytes (or element) walks the k tokens in order.
 * Empty segments give zeros for every fn. Accumulation in fp32; the order
 * depends only on the segment length, never on the batch.
 */
#include <math.h>

#include "kernels/cuda/cuda_internal.h"

#define PL_LANES 16

__device__ __forceinline__ float pool_step(float a, float v, int fn)
{
    return fn == BK_POOL_MAX ? fmaxf(a, v) : a + v;
}

/* Block (row, 32 columns), 32 x PL_LANES threads. */
template <typename T>
__global__ void k_pool_jagged(const T *__restrict__ x, const int64_t *__restrict__ off, int dim,
                              int fn, T *__restrict__ out, int ldo)
{
    __shared__ float part[PL_LANES][33];
    const int r = blockIdx.x, j = blockIdx.y * 32 + threadIdx.x, ty = threadIdx.y;
    const int64_t s = off[r], e = off[r + 1];
    if (fn == BK_POOL_LAST) {
        if (ty == 0 && j < dim)
            out[(size_t)r * ldo + j] = e > s ? x[(e - 1) * dim + j] : cu_fromf<T>(0.0f);
        return;
    }
    const float id = fn == BK_POOL_MAX ? -INFINITY : 0.0f;
    float a0 = id, a1 = id, a2 = id, a3 = id;
    if (j < dim) {
        int64_t i = s + ty;
        for (; i + 3 * PL_LANES < e; i += 4 * PL_LANES) {
            a0 = pool_step(a0, cu_tof<T>(x[i * dim + j]), fn);
            a1 = pool_step(a1, cu_tof<T>(x[(i + PL_LANES) * dim + j]), fn);
            a2 = pool_step(a2, cu_tof<T>(x[(i + 2 * PL_LANES) * dim + j]), fn);
            a3 = pool_step(a3, cu_tof<T>(x[(i + 3 * PL_LANES) * dim + j]), fn);
        }
        for (; i < e; i += PL_LANES)
            a0 = pool_step(a0, cu_tof<T>(x[i * dim + j]), fn);
    }
    part[ty][threadIdx.x] = pool_step(pool_step(a0, a1, fn), pool_step(a2, a3, fn), fn);
    __syncthreads();
    if (ty == 0 && j < dim) {
        float acc = id;
#pragma unroll
        for (int k = 0; k < PL_LANES; k++)
            acc = pool_step(acc, part[k][threadIdx.x], fn);
        if (e == s)
            acc = 0.0f;
        else if (fn == BK_POOL_MEAN)
            acc /= (float)(e - s);
        out[(size_t)r * ldo + j] = cu_fromf<T>(acc);
    }
}

/* Vector jagged path: block (row, PV_TPE * V columns), PV_TPE threads per
 * event each owning one 16-byte chunk, PV_LANES event lanes (lane y takes
 * events y, y + PV_LANES, ..., PV_IN at a time). The lanes are combined
 * in a fixed tree (shuffles within a warp, then the warps in order), so
 * the order depends only on the row's length. */
#define PV_TPE 4
#define PV_LANES 128
#define PV_IN 8
template <typename T>
__global__ void __launch_bounds__(PV_TPE * PV_LANES)
k_pool_jagged_vec(const T *__restrict__ x, const int64_t *__restrict__ off, int dim, int fn,
                  T *__restrict__ out, int ldo)
{
    constexpr int V = cu_vec<T>::V, WL = 32 / PV_TPE; /* event lanes a warp */
    __shared__ float part[PV_LANES / WL][PV_TPE * V];
    const int r = blockIdx.x, c = (int)threadIdx.x % PV_TPE, y = (int)threadIdx.x / PV_TPE;
    const int j = ((int)blockIdx.y * PV_TPE + c) * V;
    const int64_t s = off[r], e = off[r + 1];
    const float id = fn == BK_POOL_MAX ? -INFINITY : 0.0f;
    float acc[V];
#pragma unroll
    for (int q = 0; q < V; q++)
        acc[q] = id;
    if (j < dim) {
        for (int64_t i0 = s + y; i0 < e; i0 += (int64_t)PV_IN * PV_LANES) {
            uint4 raw[PV_IN];
#pragma unroll
            for (int u = 0; u < PV_IN; u++) /* every load issued before any is used */
                if (i0 + (int64_t)u * PV_LANES < e)
                    raw[u] = __ldg((const uint4 *)(x + (i0 + (int64_t)u * PV_LANES) * dim + j));
#pragma unroll
            for (int u = 0; u < PV_IN; u++)
                if (i0 + (int64_t)u * PV_LANES < e) {
                    float f[V];
                    cu_vec<T>::load((const T *)&raw[u], f);
#pragma unroll
                    for (int q = 0; q < V; q++)
                        acc[q] = pool_step(acc[q], f[q], fn);
                }
        }
    }
    /* The warp's WL event lanes of this chunk: lanes c, c + PV_TPE, ... */
#pragma unroll
    for (int m = PV_TPE; m < 32; m <<= 1)
#pragma unroll
        for (int q = 0; q < V; q++)
            acc[q] = pool_step(acc[q], __shfl_xor_sync(0xffffffffu, acc[q], m), fn);
    const int w = (int)threadIdx.x / 32;
    if ((int)threadIdx.x % 32 < PV_TPE)
#pragma unroll
        for (int q = 0; q < V; q++)
            part[w][c * V + q] = acc[q];
    __syncthreads();
    if (threadIdx.x < PV_TPE && j < dim) {
        float a[V];
#pragma unroll
        for (int q = 0; q < V; q++) {
            a[q] = id;
            for (int k = 0; k < PV_LANES / WL; k++)
                a[q] = pool_step(a[q], part[k][c * V + q], fn);
            a[q] = e == s ? 0.0f : fn == BK_POOL_MEAN ? a[q] / (float)(e - s) : a[q];
        }
        cu_vec<T>::store(out + (size_t)r * ldo + j, a);
    }
}

/* Tokens: x [n, k*d]; one thread per V-wide piece of an output row. */
template <typename T, bool VEC>
__global__ void k_pool_tokens(const T *__restrict__ x, size_t n, int k, int d, int fn,
                              T *__restrict__ out, int ldo)
{
    constexpr int V = VEC ? cu_vec<T>::V : 1;
    const int du = d / V;
    const size_t total = n * (size_t)du;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / du;
        int j = (int)(i - r * du) * V;
        const T *xr = x + r * (size_t)k * d + j;
        float acc[V], f[V];
        int t0 = fn == BK_POOL_LAST ? k - 1 : 0;
#pragma unroll
        for (int q = 0; q < V; q++)
            acc[q] = fn == BK_POOL_MAX ? -INFINITY : 0.0f;
        for (int t = t0; t < k; t++) {
            if constexpr (VEC) {
                cu_vec<T>::load(xr + (size_t)t * d, f);
            } else {
                f[0] = cu_tof<T>(xr[(size_t)t * d]);
            }
#pragma unroll
            for (int q = 0; q < V; q++)
                acc[q] = pool_step(acc[q], f[q], fn);
        }
#pragma unroll
        for (int q = 0; q < V; q++)
            acc[q] = k == 0 ? 0.0f : fn == BK_POOL_MEAN ? acc[q] / (float)k : acc[q];
        if constexpr (VEC) {
            cu_vec<T>::store(out + r * ldo + j, acc);
        } else {
            out[r * ldo + j] = cu_fromf<T>(acc[0]);
        }
    }
}

int cuda_pool(bk_stream *s, const void *x, const int64_t *offsets, int n, int k, int d,
              enum bk_pool fn, void *out, int ld, bk_err *err)
{
    cu_prof_scope prof_(s, "pool");
    if (fn != BK_POOL_SUM && fn != BK_POOL_MEAN && fn != BK_POOL_MAX && fn != BK_POOL_LAST) {
        bk_seterr(err, "pool: unknown function %d", (int)fn);
        return -1;
    }
    if (!offsets && k < 0) {
        bk_seterr(err, "pool: %d tokens", k);
        return -1;
    }
    if (bk_bad_stride("pool", "output row stride", ld, "dim", d, err))
        return -1;
    if (n <= 0 || d <= 0)
        return 0;
    cu_prof_jag j;
    if (prof_.on() && !cu_prof_jagged(s, offsets, NULL, n, &j)) {
        /* Jagged: each row's events (LAST: one per non-empty row) and the
         * offsets; tokens: k tokens a row (LAST: one). Then n output rows. */
        const double in_rows = offsets ? (fn == BK_POOL_LAST ? j.nonempty : j.pairs)
                                       : (double)n * (fn == BK_POOL_LAST ? (k > 0) : k);
        prof_.work(0, (in_rows + n) * d * s->be->act_size +
                          (offsets ? (n + 1.0) * sizeof *offsets : 0));
    }
    if (cu_enter(s, err))
        return -1;
    const int v = 16 / (int)s->be->act_size;
    const bool vec = d % v == 0 && ld % v == 0 && cu_aligned16(x) && cu_aligned16(out);
    if (offsets && vec && fn != BK_POOL_LAST) {
        dim3 grid((unsigned)n, (unsigned)((d + PV_TPE * v - 1) / (PV_TPE * v)));
        CU_DISPATCH(cu_dt(s), (k_pool_jagged_vec<T><<<grid, PV_TPE * PV_LANES, 0, s->st>>>(
                                  (const T *)x, offsets, d, (int)fn, (T *)out, ld)));
        return cu_check_launch(s, err, "pool (jagged, 16-byte)");
    }
    if (offsets) {
        dim3 grid((unsigned)n, (unsigned)((d + 31) / 32)), block(32, PL_LANES);
        CU_DISPATCH(cu_dt(s), (k_pool_jagged<T><<<grid, block, 0, s->st>>>(
                                  (const T *)x, offsets, d, (int)fn, (T *)out, ld)));
        return cu_check_launch(s, err, "pool (jagged)");
    }
    const size_t units = (size_t)n * (vec ? d / v : d);
    const unsigned grid = cu_grid_for(units, 256);
    CU_DISPATCH(cu_dt(s), {
        if (vec)
            k_pool_tokens<T, true><<<grid, 256, 0, s->st>>>((const T *)x, (size_t)n, k, d,
                                                             (int)fn, (T *)out, ld);
        else
            k_pool_tokens<T, false><<<grid, 256, 0, s->st>>>((const T *)x, (size_t)n, k, d,
                                                              (int)fn, (T *)out, ld);
    });
    return cu_check_launch(s, err, "pool (tokens)");
}
