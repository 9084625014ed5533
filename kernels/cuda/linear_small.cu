/* linear_small.cu - linear at a few rows (the user side of a one-user
 * batch): y = act(x W^T + b) as one pass over W.
 *
 * Why this exists: at 1 to 16 rows a linear is a read of its weight, and
 * cuBLASLt's kernels for these shapes left most of HBM idle: the bench
 * model's user MLP [1, 32] x [32, 300800] took 18-26 us on the H200 for a
 * 19 MB weight (floor 4.5 us), the largest single loss of a 1 x 70 batch.
 * Here one thread owns one output column n: it streams W's row n (16-byte
 * loads; consecutive threads read consecutive rows, so a warp reads one
 * contiguous span of W) against x held in shared memory, keeps one fp32
 * accumulator per row, and applies bias and activation before its stores.
 * With few outputs (fewer column blocks than SMs) each row gets its own
 * blocks instead (W is small then, and read once per row from L2): 16 x
 * [64 -> 32] took 13.7 us with one block doing all 16 rows.
 *
 * Used by cuda_linear (backend_cuda.cu) when cu_linear_small_fits: rows <=
 * CU_SMALL_ROWS, x fits in shared memory, and either W's rows are short
 * (in <= 128) or its outputs many (>= 32768); W's rows are 16-byte aligned
 * with zero columns up to ld (bk_weight's layout), so a row is read in
 * whole 16-byte vectors. Accumulation runs in increasing k per output.
 */
#include "kernels/cuda/cuda_internal.h"

#define SMALL_BLOCK 128
#define SMALL_X_FLOATS 8192 /* x in shared memory: rows * ld(W) floats, 32 KiB */

int cu_linear_small_fits(int rows, const bk_weight *w)
{
    /* A thread per output column: the GPU fills when the outputs are many,
     * or each thread's row of W is short (cuBLASLt splits K instead). */
    return rows >= 1 && rows <= CU_SMALL_ROWS && (size_t)rows * w->ld <= SMALL_X_FLOATS &&
           (w->cols <= 128 || w->rows >= 32768);
}

/* Block (column block, row group): rows row0 .. row0 + R - 1 of x (fewer at
 * the end) in shared memory, read back as float4 (four k per load; at 16
 * rows x 300800 outputs this took 32.6 -> 27.0 us profiled, far less than
 * the 4x fewer shared-memory loads predicted: bench/kernels/NOTES.md). */
template <typename T, int R>
__global__ void __launch_bounds__(SMALL_BLOCK)
    k_linear_small(const T *__restrict__ x, int ldx, int rows, const T *__restrict__ w, int ldw,
                   int in, int out, const T *__restrict__ bias, int act, T *__restrict__ y, int ldy)
{
    extern __shared__ float4 xs4[]; /* [R][ldw / 4], zero past in */
    float *xs = (float *)xs4;
    const int row0 = blockIdx.y * R, nr = rows - row0 < R ? rows - row0 : R;
    for (int i = threadIdx.x; i < nr * ldw; i += blockDim.x) {
        int r = i / ldw, k = i - r * ldw;
        xs[i] = k < in ? cu_tof<T>(x[(size_t)(row0 + r) * ldx + k]) : 0.0f;
    }
    __syncthreads();
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= out)
        return;
    constexpr int V = 16 / sizeof(T); /* elements per 16-byte load */
    const int ld4 = ldw / 4;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++)
        acc[r] = 0.0f;
    const uint4 *wr = (const uint4 *)(w + (size_t)n * ldw);
    for (int k0 = 0; k0 < in; k0 += V) {
        uint4 raw = __ldg(wr + k0 / V);
        const T *v = (const T *)&raw;
#pragma unroll
        for (int q = 0; q < V / 4; q++) {
            const float w0 = cu_tof<T>(v[4 * q]), w1 = cu_tof<T>(v[4 * q + 1]),
                        w2 = cu_tof<T>(v[4 * q + 2]), w3 = cu_tof<T>(v[4 * q + 3]);
#pragma unroll
            for (int r = 0; r < R; r++)
                if (r < nr) {
                    float4 xv = xs4[r * ld4 + k0 / 4 + q];
                    acc[r] += w0 * xv.x;
                    acc[r] += w1 * xv.y;
                    acc[r] += w2 * xv.z;
                    acc[r] += w3 * xv.w;
                }
        }
    }
    float b = bias ? cu_tof<T>(bias[n]) : 0.0f;
#pragma unroll
    for (int r = 0; r < R; r++)
        if (r < nr) {
            float v = acc[r] + b;
            y[(size_t)(row0 + r) * ldy + n] =
                cu_fromf<T>(act == BK_ACT_NONE ? v : cu_act_f(v, act));
        }
}

/* One launch: column blocks of SMALL_BLOCK outputs x row groups of R rows. */
template <typename T, int R>
static void launch(bk_stream *s, const void *x, int ldx, int rows, const bk_weight *w,
                   const bk_weight *bias, enum bk_act act, void *y, int ldy)
{
    dim3 grid((unsigned)((w->rows + SMALL_BLOCK - 1) / SMALL_BLOCK), (unsigned)((rows + R - 1) / R));
    size_t smem = (size_t)(rows < R ? rows : R) * w->ld * sizeof(float);
    k_linear_small<T, R><<<grid, SMALL_BLOCK, smem, s->st>>>(
        (const T *)x, ldx, rows, (const T *)w->data, w->ld, w->cols, w->rows,
        bias ? (const T *)bias->data : NULL, (int)act, (T *)y, ldy);
}

int cu_linear_small(bk_stream *s, const void *x, int ldx, int rows, const bk_weight *w,
                    const bk_weight *bias, enum bk_act act, void *y, int ldy, bk_err *err)
{
    /* Few outputs (fewer column blocks than SMs): a block per row, so the
     * rows' chains run on separate SMs instead of one thread's 16. */
    const bool few_out = (w->rows + SMALL_BLOCK - 1) / SMALL_BLOCK < cu_impl(s->be)->sm_count;
    CU_DISPATCH(cu_dt(s), {
        if (rows == 1 || few_out)
            launch<T, 1>(s, x, ldx, rows, w, bias, act, y, ldy);
        else if (rows <= 4)
            launch<T, 4>(s, x, ldx, rows, w, bias, act, y, ldy);
        else
            launch<T, CU_SMALL_ROWS>(s, x, ldx, rows, w, bias, act, y, ldy);
    });
    return cu_check_launch(s, err, "linear (few rows)");
}
