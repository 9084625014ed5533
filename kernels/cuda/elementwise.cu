/* elementwise.cu - the CUDA activation and mul ops, and linear's
 * activation pass.
 *
 * Why this exists: DLRM/DCNv2/MMoE models apply activations as their own
 * layers and DCNv2's cross multiplies (x0 * (W x + b) + x); both are one
 * pass over memory, so the kernels move 16-byte vectors where the pointers
 * and widths allow and fall back to single elements otherwise. The same
 * activation kernel runs after linear's GEMM for what cuBLASLt's epilogues
 * lack: sigmoid, tanh, silu, and gelu in the exact erf form (cuBLASLt's
 * GELU epilogue is the tanh approximation).
 *
 * Numerics: every element is computed in fp32 from its inputs and rounded
 * once to the activation dtype.
 */
#include "kernels/cuda/cuda_internal.h"

/* Flat: n elements (x, out contiguous). Vectorized when VEC. */
template <typename T, bool VEC>
__global__ void k_act_flat(const T *x, size_t n, int act, T *out)
{
    constexpr int V = VEC ? cu_vec<T>::V : 1;
    size_t units = n / V;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < units;
         i += (size_t)gridDim.x * blockDim.x) {
        float f[V];
        if constexpr (VEC) {
            cu_vec<T>::load(x + i * V, f);
        } else {
            f[0] = cu_tof<T>(x[i]);
        }
#pragma unroll
        for (int k = 0; k < V; k++)
            f[k] = cu_act_f(f[k], act);
        if constexpr (VEC) {
            cu_vec<T>::store(out + i * V, f);
        } else {
            out[i] = cu_fromf<T>(f[0]);
        }
    }
    /* The tail past the last whole vector: one thread per element. */
    size_t tail = units * V, t = tail + blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (VEC && t < n)
        out[t] = cu_fromf<T>(cu_act_f(cu_tof<T>(x[t]), act));
}

/* Pitched, in place: rows x width with row stride ldy (linear's output). */
template <typename T>
__global__ void k_act_rows(T *y, int ldy, size_t rows, int width, int act)
{
    size_t total = rows * (size_t)width;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / width, j = i - r * width;
        T *p = y + r * ldy + j;
        *p = cu_fromf<T>(cu_act_f(cu_tof<T>(*p), act));
    }
}

static bool act_known(enum bk_act act) { return act > BK_ACT_NONE && act < BK_ACT_COUNT; }

/* Launches the activation over `rows` rows of `width` (stride ld); ld ==
 * width takes the flat, vectorized kernel. */
static int act_launch(bk_stream *s, const void *x, int ld, size_t rows, int width,
                      enum bk_act act, void *out, bk_err *err, const char *what)
{
    size_t n = rows * (size_t)width;
    if (ld == width) {
        bool vec = cu_aligned16(x) && cu_aligned16(out) && n >= 64;
        size_t units = vec ? n / (16 / s->be->act_size) : n;
        unsigned grid = cu_grid_for(units, 256);
        CU_DISPATCH(cu_dt(s), {
            if (vec)
                k_act_flat<T, true><<<grid, 256, 0, s->st>>>((const T *)x, n, (int)act, (T *)out);
            else
                k_act_flat<T, false><<<grid, 256, 0, s->st>>>((const T *)x, n, (int)act, (T *)out);
        });
    } else {
        /* Pitched is only ever in place (linear). */
        CU_DISPATCH(cu_dt(s), (k_act_rows<T><<<cu_grid_for(n, 256), 256, 0, s->st>>>(
                                  (T *)out, ld, rows, width, (int)act)));
    }
    return cu_check_launch(s, err, what);
}

int cu_act_rows(bk_stream *s, void *y, int ldy, int rows, int width, enum bk_act act,
                bk_err *err)
{
    if (rows <= 0 || width <= 0 || act == BK_ACT_NONE)
        return 0;
    return act_launch(s, y, ldy, (size_t)rows, width, act, y, err, "linear activation");
}

int cuda_activation(bk_stream *s, const void *x, size_t n, enum bk_act act, void *out,
                    bk_err *err)
{
    cu_prof_scope prof_(s, "activation");
    if (!act_known(act)) {
        bk_seterr(err, "activation: unknown function %d", (int)act);
        return -1;
    }
    if (n == 0)
        return 0;
    if (prof_.on()) /* x read, out written */
        prof_.work(0, 2.0 * n * s->be->act_size);
    if (cu_enter(s, err))
        return -1;
    return act_launch(s, x, 1, n, 1, act, out, err, "activation");
}

/* y[r, :] = a[r, :] + b[map ? map[r] : r, :] over rows x width, each operand
 * with its own row stride; a NULL or b NULL reads as zeros, y may be a. */
template <typename T>
__global__ void k_add_rows(const T *a, int lda, const T *__restrict__ b, int ldb,
                           const int32_t *__restrict__ map, T *y, int ldy, size_t rows, int width)
{
    const size_t total = rows * (size_t)width;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t r = i / width, j = i - r * width, rb = map ? (size_t)map[r] : r;
        const float va = a ? cu_tof<T>(a[r * lda + j]) : 0.f;
        const float vb = b ? cu_tof<T>(b[rb * ldb + j]) : 0.f;
        y[r * ldy + j] = cu_fromf<T>(va + vb);
    }
}

int cu_add_rows(bk_stream *s, const void *a, int lda, const void *b, int ldb,
                const int32_t *map, void *y, int ldy, int rows, int width, const char *what,
                bk_err *err)
{
    if (rows <= 0 || width <= 0)
        return 0;
    const size_t total = (size_t)rows * width;
    CU_DISPATCH(cu_dt(s), (k_add_rows<T><<<cu_grid_for(total, 256), 256, 0, s->st>>>(
                              (const T *)a, lda, (const T *)b, ldb, map, (T *)y, ldy,
                              (size_t)rows, width)));
    return cu_check_launch(s, err, what);
}

/* out[r, :] = a[r, :] * b[map ? map[r] : r, :] (+ c[r, :]), in units of V
 * elements (width % V == 0 and every pointer 16-byte aligned when V > 1). */
template <typename T, bool VEC>
__global__ void k_mul(const T *a, const T *__restrict__ b, const int32_t *__restrict__ map,
                      const T *c, size_t n, int width, T *out)
{
    constexpr int V = VEC ? cu_vec<T>::V : 1;
    const int wu = width / V;
    const size_t total = n * (size_t)wu;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / wu, j = (i - r * wu) * V;
        size_t rb = map ? (size_t)map[r] : r;
        size_t ia = r * width + j, ib = rb * width + j;
        float fa[V], fb[V], fc[V];
        if constexpr (VEC) {
            cu_vec<T>::load(a + ia, fa);
            cu_vec<T>::load(b + ib, fb);
            if (c) cu_vec<T>::load(c + ia, fc);
        } else {
            fa[0] = cu_tof<T>(a[ia]);
            fb[0] = cu_tof<T>(b[ib]);
            if (c) fc[0] = cu_tof<T>(c[ia]);
        }
#pragma unroll
        for (int k = 0; k < V; k++)
            fa[k] = c ? fa[k] * fb[k] + fc[k] : fa[k] * fb[k];
        if constexpr (VEC) {
            cu_vec<T>::store(out + ia, fa);
        } else {
            out[ia] = cu_fromf<T>(fa[0]);
        }
    }
}

int cuda_mul(bk_stream *s, const void *a, const void *b, const int32_t *map, const void *c, int n,
             int width, void *out, bk_err *err)
{
    cu_prof_scope prof_(s, "mul");
    if (n <= 0 || width <= 0)
        return 0;
    cu_prof_jag j; /* a, c, out at n rows, b at its distinct rows, the map */
    if (prof_.on() && !cu_prof_jagged(s, NULL, map, n, &j))
        prof_.work(0, ((c ? 3.0 : 2.0) * n + j.users) * width * s->be->act_size +
                          (map ? n * (double)sizeof *map : 0));
    if (cu_enter(s, err))
        return -1;
    int v = 16 / (int)s->be->act_size;
    bool vec = width % v == 0 && cu_aligned16(a) && cu_aligned16(b) && cu_aligned16(out) &&
               (!c || cu_aligned16(c));
    size_t units = (size_t)n * (vec ? width / v : width);
    unsigned grid = cu_grid_for(units, 256);
    CU_DISPATCH(cu_dt(s), {
        if (vec)
            k_mul<T, true><<<grid, 256, 0, s->st>>>((const T *)a, (const T *)b, map, (const T *)c,
                                                     (size_t)n, width, (T *)out);
        else
            k_mul<T, false><<<grid, 256, 0, s->st>>>((const T *)a, (const T *)b, map,
                                                      (const T *)c, (size_t)n, width, (T *)out);
    });
    return cu_check_launch(s, err, "mul");
}
