/* linear_tk.cu - linear with short input rows (in <= 64) and many outputs:
 * y = act(x W^T + b) on tensor cores, bound by the bytes it moves.
 *
 * Why this exists: with in <= 64 a linear does almost no arithmetic per
 * byte: at few rows it is a read of W, at many a write of its output. On the
 * H200 (bench/RESULTS.md) the bench model's user MLP, [16, 32] x [32,
 * 300800] (19 MB of W, floor ~7 us), took 27 us in linear_small.cu and
 * 19.6 us in cuBLAS; here 13-14 us. Its candidate token linear, [1120, 16]
 * x [16, 15872], 21 us against cuBLAS's 24.
 * Two kernels, both a warp per strip of 32 output columns, W's rows loaded
 * straight into mma.sync B fragments (8-byte loads, a warp reading one
 * contiguous span of W), each row's 32 columns written as four 16-byte
 * stores after a transpose inside each lane quad (tk_tile: no shared
 * memory, no barrier, every byte of y written once in whole sectors):
 * - k_linear_tk (at most 16 rows, or in > 16): a warp keeps x's fragments
 *   for 16 x MI rows in registers and takes 1 to 8 strips, chosen per
 *   launch so the grid's last wave is not nearly empty (tk_grid.h).
 * - k_linear_tr, the row sweep (in <= 16, more rows): a warp keeps 1 to 4
 *   adjacent strips' W and walks a chunk of row tiles, adjacent warps on
 *   adjacent columns, all in one wave, so the stores move down y's rows
 *   together (tk_grid.h). Measured (H100, 2026-12-06, bench/RESULTS.md):
 *   c_r1 (1120 x [16 -> 190464], 427 MB) 166.5 -> 145.9 us in the bench
 *   model's forward (1.16x -> 1.01x its floor), the token linear 1120 x
 *   [16 -> 15872] 19.8 -> 16.5; at 1 x 70 20.8 -> 14.9 and 8.7 -> 6.7. In
 *   k_linear_tk each short block reloaded x and, per strip, W: dependent
 *   loads under the write stream.
 * The k order inside a 16-deep step is permuted (lane t takes k 4t .. 4t+3
 * of both x and W, where mma.m16n8k16's layout says 2t, 2t+1, 2t+8, 2t+9):
 * the same permutation on both operands leaves the product unchanged, and
 * lets each lane read four consecutive k of a W row in one load.
 *
 * A y larger than L2 is stored with the evict-first hint: the write stream
 * otherwise pushed W's lines out of L2, and each strip's W load waited on
 * HBM (c_r1, 1120 x [16 -> 190464], 426 MB, in write_patterns: 157-163 us
 * without the hint, 118 with it, the stores alone 104-107; in bench_ops
 * 124.5 against cuBLAS's 160, in the bench model's forward 143 against
 * cuBLASLt's 156; bench/kernels/NOTES.md).
 *
 * Used by cuda_linear (backend_cuda.cu) when cu_linear_tk_fits: bf16/fp16,
 * W's ld <= 64 (W's columns past `in` are zero: bk_weight's layout), at
 * most 16 rows, or in <= 16, or TK_MAX_OUTPUTS outputs in all, at least
 * TK_MIN_OUT outputs in whole 16-byte chunks, y 16-byte aligned with ldy a
 * multiple of 8. x may have any stride and alignment (k_linear_tk loads
 * its fragments once per warp, element by element; the sweep per tile, as
 * 8-byte pairs where x is 8-byte aligned with ldx and in multiples of 4).
 * Accumulation is fp32 inside the tensor cores, in their order.
 */
#include "kernels/cuda/cuda_internal.h"
#include "kernels/cuda/mma_util.cuh"
#include "kernels/cuda/tk_grid.h" /* TK_WARPS, the strips a warp takes, the sweep */

#define TK_MAX_LD 64  /* W's row length at most (4 mma k-steps)         */
#define TK_MIN_OUT 256
#define TK_MAX_ROWS (65535 * 32) /* k_linear_tk: row tiles in grid.y (32 rows at least) */
/* Beyond 16 rows at in > 16, at most this many outputs (the large writes
 * were measured at in 16 only, bench_ops: 1120 x [16 -> 15872] 18.6-22.1
 * us against cuBLAS's 24-26.5, 70 x [16 -> 190464] 22.2-22.9 against
 * 22.7-28.5, and with the evict-first stores 1120 x [16 -> 190464] 124.5
 * against 160). */
#define TK_MAX_OUTPUTS (1L << 25)

int cu_linear_tk_fits(enum cu_dtype dt, int rows, const bk_weight *w, const void *y, int ldy)
{
    return dt != CU_F32 && rows >= 1 && rows <= TK_MAX_ROWS &&
           (rows <= 16 || w->ld <= 16 || (long)rows * w->rows <= TK_MAX_OUTPUTS) &&
           w->ld % 8 == 0 && w->ld <= TK_MAX_LD && w->rows >= TK_MIN_OUT && w->rows % 8 == 0 &&
           ldy % 8 == 0 &&
           ((uintptr_t)y & 15) == 0 && ((uintptr_t)w->data & 7) == 0;
}

/* Element (r, k) of x as the low or high half of a fragment register. */
template <typename T>
__device__ __forceinline__ uint32_t x_pair(const T *x, int ldx, int rows, int in, int r, int k)
{
    float a = 0.0f, b = 0.0f;
    if (r < rows) {
        const T *p = x + (size_t)r * ldx;
        if (k < in)
            a = cu_tof<T>(p[k]);
        if (k + 1 < in)
            b = cu_tof<T>(p[k + 1]);
    }
    return pack2<T>(a, b);
}

/* One strip's operands: B fragments of its four n8 blocks (lane (g, t)
 * holds W row n0 + 8j + g, k 16ks + 4t .. + 3) and lane t's bias pairs. */
template <typename T, int KS> struct tk_strip {
    uint2 b[4][KS];
    float bias[4][2];
};

template <typename T, int KS>
__device__ __forceinline__ void tk_load(tk_strip<T, KS> &o, const T *__restrict__ w, int ldw,
                                        const T *__restrict__ bias, int out, int n0, int g, int t)
{
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int n = n0 + 8 * j + g, nb = n0 + 8 * j + 2 * t;
#pragma unroll
        for (int ks = 0; ks < KS; ks++) {
            const int k = 16 * ks + 4 * t;
            o.b[j][ks] = n < out && k < ldw ? __ldg((const uint2 *)(w + (size_t)n * ldw + k))
                                            : make_uint2(0u, 0u);
        }
        o.bias[j][0] = bias && nb < out ? cu_tof<T>(bias[nb]) : 0.0f;
        o.bias[j][1] = bias && nb + 1 < out ? cu_tof<T>(bias[nb + 1]) : 0.0f;
    }
}

/* OPT bits. The TK_DIAG_ ones are timing diagnostics (bench/kernels/
 * write_patterns.cu; never in production, wrong results): no W or bias
 * loads (fragments from the strip index), no x loads, no MMAs (the bias
 * alone is stored); the stores stay. */
enum { TK_DIAG_NO_W = 1, TK_DIAG_NO_X = 2, TK_DIAG_NO_MMA = 4 };
/* TK_STREAM (production, where y is larger than L2): y's stores carry the
 * evict-first hint (st.global.cs), so the write stream does not push W's
 * lines out of L2 (measured: bench/kernels/NOTES.md, 2026-12-04). */
enum { TK_STREAM = 8 };

/* tk_load, or with TK_DIAG_NO_W fragments made from the strip index. */
template <typename T, int KS, int OPT>
__device__ __forceinline__ void tk_load_opt(tk_strip<T, KS> &o, const T *__restrict__ w, int ldw,
                                            const T *__restrict__ bias, int out, int n0, int g,
                                            int t)
{
    if constexpr (!(OPT & TK_DIAG_NO_W)) {
        tk_load(o, w, ldw, bias, out, n0, g, t);
    } else {
#pragma unroll
        for (int j = 0; j < 4; j++) {
#pragma unroll
            for (int ks = 0; ks < KS; ks++)
                o.b[j][ks] = make_uint2(n0 + j, n0 ^ j);
            o.bias[j][0] = (float)(n0 & 7);
            o.bias[j][1] = (float)(j + t);
        }
    }
}

/* One 16-row tile (rows r0 ..) of one strip (columns n0 .. + 31): the
 * MMAs over a's KS k-steps, then rows g and g + 8 get bias, activation and
 * packing, and a transpose inside each lane quad so lane t holds columns n0
 * + 8t .. + 7: one 16-byte store a row (evict-first with TK_STREAM). */
template <typename T, int KS, bool RELU, int OPT>
__device__ __forceinline__ void tk_tile(const uint32_t (&a)[KS][4], const tk_strip<T, KS> &s,
                                        T *__restrict__ y, int ldy, int rows, int out, int r0,
                                        int n0, int g, int t)
{
    float c[4][4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
#pragma unroll
        for (int q = 0; q < 4; q++)
            c[j][q] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < KS; ks++) {
            const uint32_t bb[2] = {s.b[j][ks].x, s.b[j][ks].y};
            if constexpr ((OPT & TK_DIAG_NO_MMA) != 0)
                c[j][ks & 3] += __uint_as_float(a[ks][j] ^ bb[0]);
            else
                mma16816<T>(c[j], a[ks], bb);
        }
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        uint32_t v[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float p0 = c[j][2 * h] + s.bias[j][0], p1 = c[j][2 * h + 1] + s.bias[j][1];
            if (RELU) {
                p0 = fmaxf(p0, 0.0f);
                p1 = fmaxf(p1, 0.0f);
            }
            v[j] = pack2<T>(p0, p1);
        }
        quad_transpose(v, t);
        const int r = r0 + g + 8 * h, n = n0 + 8 * t;
        if (r < rows && n < out) {
            const uint4 o = make_uint4(v[0], v[1], v[2], v[3]);
            if constexpr ((OPT & TK_STREAM) != 0)
                __stcs((uint4 *)(y + (size_t)r * ldy + n), o);
            else
                *(uint4 *)(y + (size_t)r * ldy + n) = o;
        }
    }
}

/* Block (strip group, row tile of 16 x MI rows); KS = 16-deep k-steps;
 * each warp takes spw strips of 32 columns, TK_WARPS apart (tk_grid.h);
 * RELU fused, other activations run as a pass afterwards. (The first
 * version inlined every activation at each site of a fully unrolled strip
 * loop, ~12k PTX lines a kernel, and took ~13 us per strip: c_r1 467 us.
 * With ReLU alone and the loop rolled, 159 us; the instruction cache was
 * the suspect, not profiled.) MINB (blocks an SM, so registers) defaults to
 * production's; bench/kernels/write_patterns.cu times others. */
template <typename T, int KS, int MI, bool RELU, int MINB = 4, int OPT = 0>
__global__ void __launch_bounds__(TK_WARPS * 32, MINB)
    k_linear_tk(const T *__restrict__ x, int ldx, int rows, const T *__restrict__ w, int ldw,
                int in, int out, const T *__restrict__ bias, T *__restrict__ y, int ldy, int spw)
{
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int r0 = blockIdx.y * 16 * MI, strips = (out + 31) / 32;
    uint32_t a[MI][KS][4];
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int ks = 0; ks < KS; ks++) {
            const int k = 16 * ks + 4 * t, r = r0 + 16 * i + g;
            if constexpr ((OPT & TK_DIAG_NO_X) != 0) {
                a[i][ks][0] = a[i][ks][1] = a[i][ks][2] = a[i][ks][3] = (uint32_t)(r * 0x10001 + k);
            } else {
                a[i][ks][0] = x_pair(x, ldx, rows, in, r, k);
                a[i][ks][1] = x_pair(x, ldx, rows, in, r + 8, k);
                a[i][ks][2] = x_pair(x, ldx, rows, in, r, k + 2);
                a[i][ks][3] = x_pair(x, ldx, rows, in, r + 8, k + 2);
            }
        }
    /* The next strip's W and bias are loaded before this one's MMAs and
     * stores (at 64 k the registers go to x's fragments instead). */
    constexpr bool PF = KS <= 2;
    tk_strip<T, KS> cur, nxt;
    auto load = [&](tk_strip<T, KS> &o, int n0) {
        tk_load_opt<T, KS, OPT>(o, w, ldw, bias, out, n0, g, t);
    };
    load(cur, (int)tk_strip_of(blockIdx.x, warp, 0, spw) * 32);
#pragma unroll 1
    for (int sp = 0; sp < spw; sp++) {
        const int strip = (int)tk_strip_of(blockIdx.x, warp, sp, spw);
        if (strip >= strips)
            break;
        if (!PF && sp > 0)
            load(cur, strip * 32);
        if (PF && sp + 1 < spw)
            load(nxt, (int)tk_strip_of(blockIdx.x, warp, sp + 1, spw) * 32);
        const int n0 = strip * 32;
#pragma unroll
        for (int i = 0; i < MI; i++)
            tk_tile<T, KS, RELU, OPT>(a[i], cur, y, ldy, rows, out, r0 + 16 * i, n0, g, t);
        if (PF)
            cur = nxt;
    }
}

/* The row sweep (in <= 16, more than 16 rows; tk_grid.h says why): warp
 * gw takes column group gw % col_groups (SPW adjacent strips, their W and
 * bias loaded once) and row chunk gw / col_groups, and walks the chunk's
 * row tiles, loading each tile's x fragment (x is small and read by every
 * warp: it stays in L1/L2) one tile ahead of its MMAs and stores. vec: x's
 * rows read as 8-byte pairs (x 8-byte aligned, ldx and in multiples of
 * 4), else element by element. */
template <typename T, bool RELU, int OPT, int SPW>
__global__ void __launch_bounds__(TK_WARPS * 32, 4)
    k_linear_tr(const T *__restrict__ x, int ldx, int rows, const T *__restrict__ w, int ldw,
                int in, int out, const T *__restrict__ bias, T *__restrict__ y, int ldy, int vec,
                int col_groups, int chunk_tiles, int warps)
{
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int gw = blockIdx.x * TK_WARPS + (threadIdx.x >> 5);
    if (gw >= warps)
        return;
    const tk_sweep sw = {SPW, col_groups, chunk_tiles, warps};
    long strip0, tile0;
    tk_sweep_place(&sw, gw, &strip0, &tile0);
    const int n0 = (int)strip0 * 32, rt0 = (int)tile0;
    const int rt1 = min(rt0 + chunk_tiles, (rows + 15) / 16);
    auto frag = [&](uint32_t (&a)[1][4], int rt) {
        const int r = rt * 16 + g;
        if constexpr ((OPT & TK_DIAG_NO_X) != 0) {
            a[0][0] = a[0][1] = a[0][2] = a[0][3] = (uint32_t)(r * 0x10001 + 4 * t);
        } else if (vec) {
            uint2 lo = make_uint2(0u, 0u), hi = make_uint2(0u, 0u);
            if (4 * t < in) {
                if (r < rows)
                    lo = __ldg((const uint2 *)(x + (size_t)r * ldx + 4 * t));
                if (r + 8 < rows)
                    hi = __ldg((const uint2 *)(x + (size_t)(r + 8) * ldx + 4 * t));
            }
            a[0][0] = lo.x;
            a[0][1] = hi.x;
            a[0][2] = lo.y;
            a[0][3] = hi.y;
        } else {
            a[0][0] = x_pair(x, ldx, rows, in, r, 4 * t);
            a[0][1] = x_pair(x, ldx, rows, in, r + 8, 4 * t);
            a[0][2] = x_pair(x, ldx, rows, in, r, 4 * t + 2);
            a[0][3] = x_pair(x, ldx, rows, in, r + 8, 4 * t + 2);
        }
    };
    tk_strip<T, 1> s[SPW];
#pragma unroll
    for (int j = 0; j < SPW; j++)
        tk_load_opt<T, 1, OPT>(s[j], w, ldw, bias, out, n0 + 32 * j, g, t);
    uint32_t a[1][4], an[1][4] = {};
    frag(a, rt0);
#pragma unroll 1
    for (int rt = rt0; rt < rt1; rt++) {
        if (rt + 1 < rt1)
            frag(an, rt + 1);
#pragma unroll
        for (int j = 0; j < SPW; j++)
            tk_tile<T, 1, RELU, OPT>(a, s[j], y, ldy, rows, out, rt * 16, n0 + 32 * j, g, t);
#pragma unroll
        for (int q = 0; q < 4; q++)
            a[0][q] = an[0][q];
    }
}

/* Resident blocks an SM of kern (its registers decide: no shared memory),
 * asked once per instantiation; 1 if the query fails (the grid is then
 * sized as if one block fit, which only costs speed). */
static int tk_blocks_per_sm(const void *kern)
{
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kern, TK_WARPS * 32, 0) != cudaSuccess) {
        (void)cudaGetLastError();
        n = 1;
    }
    return n > 0 ? n : 1;
}

template <typename T, int KS, int MI, int OPT = 0>
static void launch(bk_stream *s, const void *x, int ldx, int rows, const bk_weight *w,
                   const bk_weight *bias, bool relu, void *y, int ldy)
{
    auto k0 = k_linear_tk<T, KS, MI, false, 4, OPT>, k1 = k_linear_tk<T, KS, MI, true, 4, OPT>;
    auto k = relu ? k1 : k0;
    static const int per_sm[2] = {tk_blocks_per_sm((const void *)k0),
                                  tk_blocks_per_sm((const void *)k1)};
    const long strips = (w->rows + 31) / 32, row_tiles = (rows + 16 * MI - 1) / (16 * MI);
    const int spw = tk_strips_per_warp(strips, row_tiles,
                                       (long)cu_impl(s->be)->sm_count * per_sm[relu]);
    dim3 grid((unsigned)tk_col_blocks(strips, spw), (unsigned)row_tiles);
    const T *b = bias ? (const T *)bias->data : NULL;
    k<<<grid, TK_WARPS * 32, 0, s->st>>>((const T *)x, ldx, rows, (const T *)w->data, w->ld,
                                         w->cols, w->rows, b, (T *)y, ldy, spw);
}

/* The row sweep's launch (tk_grid.h chooses strips a warp and row chunks
 * from each instantiation's resident blocks); force_spw > 0 imposes the
 * strips a warp (bench/kernels/write_patterns.cu). Host-only arguments, so
 * write_patterns launches it as production does. */
template <typename T, int OPT>
static void tr_launch(cudaStream_t st, int sm_count, const T *x, int ldx, int rows, const T *w,
                      int ldw, int in, int out, const T *bias, bool relu, T *y, int ldy,
                      int force_spw = 0)
{
    typedef void (*kern)(const T *, int, int, const T *, int, int, int, const T *, T *, int, int,
                         int, int, int);
    static const kern ks[2][TK_SWEEP_MAX_SPW + 1] = {
        {NULL, k_linear_tr<T, false, OPT, 1>, k_linear_tr<T, false, OPT, 2>,
         k_linear_tr<T, false, OPT, 3>, k_linear_tr<T, false, OPT, 4>},
        {NULL, k_linear_tr<T, true, OPT, 1>, k_linear_tr<T, true, OPT, 2>,
         k_linear_tr<T, true, OPT, 3>, k_linear_tr<T, true, OPT, 4>}};
    struct occ {
        long n[2][TK_SWEEP_MAX_SPW + 1];
    };
    static const occ per_sm = [] { /* asked once, thread-safe */
        occ o = {};
        for (int r = 0; r < 2; r++)
            for (int spw = 1; spw <= TK_SWEEP_MAX_SPW; spw++)
                o.n[r][spw] = tk_blocks_per_sm((const void *)ks[r][spw]);
        return o;
    }();
    long slots[TK_SWEEP_MAX_SPW + 1] = {0};
    for (int spw = 1; spw <= TK_SWEEP_MAX_SPW; spw++)
        slots[spw] = sm_count * per_sm.n[relu][spw] * TK_WARPS;
    const tk_sweep sw = tk_sweep_choose((out + 31) / 32, (rows + 15) / 16, slots, force_spw);
    const int vec = ((uintptr_t)x & 7) == 0 && ldx % 4 == 0 && in % 4 == 0;
    ks[relu][sw.spw]<<<(unsigned)((sw.warps + TK_WARPS - 1) / TK_WARPS), TK_WARPS * 32, 0, st>>>(
        x, ldx, rows, w, ldw, in, out, bias, y, ldy, vec, (int)sw.col_groups, (int)sw.chunk_tiles,
        (int)sw.warps);
}

template <typename T, int OPT>
static void launch_tr(bk_stream *s, const void *x, int ldx, int rows, const bk_weight *w,
                      const bk_weight *bias, bool relu, void *y, int ldy)
{
    tr_launch<T, OPT>(s->st, cu_impl(s->be)->sm_count, (const T *)x, ldx, rows,
                      (const T *)w->data, w->ld, w->cols, w->rows,
                      bias ? (const T *)bias->data : NULL, relu, (T *)y, ldy);
}

/* Rows per warp in k_linear_tk: one m16 tile for a few rows (W-read
 * bound: more tiles would only multiply zeros), else two at 32 to 64 k
 * (registers); at 16 k and more than 16 rows, the row sweep. Evict-first
 * stores where y is larger than L2. */
template <typename T, int KS>
static void launch_ks(bk_stream *s, const void *x, int ldx, int rows, const bk_weight *w,
                      const bk_weight *bias, bool relu, void *y, int ldy)
{
    const bool stream = (double)rows * w->rows * sizeof(T) > (double)cu_impl(s->be)->l2_bytes;
    if (rows <= 16) {
        launch<T, KS, 1>(s, x, ldx, rows, w, bias, relu, y, ldy);
    } else if constexpr (KS == 1) {
        if (stream)
            launch_tr<T, TK_STREAM>(s, x, ldx, rows, w, bias, relu, y, ldy);
        else
            launch_tr<T, 0>(s, x, ldx, rows, w, bias, relu, y, ldy);
    } else if (stream) {
        launch<T, KS, 2, TK_STREAM>(s, x, ldx, rows, w, bias, relu, y, ldy);
    } else {
        launch<T, KS, 2>(s, x, ldx, rows, w, bias, relu, y, ldy);
    }
}

int cu_linear_tk(bk_stream *s, const void *x, int ldx, int rows, const bk_weight *w,
                 const bk_weight *bias, enum bk_act act, void *y, int ldy, bk_err *err)
{
    const int ks = (w->ld + 15) / 16;
    const bool relu = act == BK_ACT_RELU;
    switch (cu_dt(s)) {
#define TK_CASE(DT, TY)                                                        \
    case DT:                                                                   \
        if (ks <= 1)                                                           \
            launch_ks<TY, 1>(s, x, ldx, rows, w, bias, relu, y, ldy);          \
        else if (ks == 2)                                                      \
            launch_ks<TY, 2>(s, x, ldx, rows, w, bias, relu, y, ldy);          \
        else                                                                   \
            launch_ks<TY, 4>(s, x, ldx, rows, w, bias, relu, y, ldy);          \
        break;
        TK_CASE(CU_BF16, __nv_bfloat16)
        TK_CASE(CU_F16, __half)
#undef TK_CASE
    case CU_F32:
        bk_seterr(err, "linear (short rows): fp32 is not served here");
        return -1;
    }
    if (cu_check_launch(s, err, "linear (short rows, tensor cores)"))
        return -1;
    return act == BK_ACT_NONE || relu ? 0 : cu_act_rows(s, y, ldy, rows, w->rows, act, err);
}
