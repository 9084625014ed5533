/* linear_wr.cu - linear_grouped with W resident in shared memory: y =
 * act(x W^T + b) for in <= 256 over many rows in evenly strided groups (the
 * target attention's query read from, and its output written into, their
 * tokens of E_cand).
 *
 * Why this exists: at in = 256 a linear over tens of thousands of rows does
 * ~0.5 FLOP per byte it moves, so it is bound by HBM, and cuBLASLt's
 * strided batch over the groups (K = 256 is four 64-deep slices: a
 * prologue, a short mainloop and an epilogue per group, nothing overlapped
 * across them) ran the bench model's Q and Wo projections (1120 groups of
 * 64 x 256 > 256) at 1.60x their floors, 56.3 us against 35.1, on the H200
 * (bench/RESULTS.md). Here W (at most 256 outputs x 256 k, 128 KiB) is
 * loaded into shared memory once per persistent CTA, and the rows stream
 * past it:
 * - warpgroup 0 is the producer: one thread loads the CTA's W block, then
 *   (after griddepcontrol.wait: the W load overlaps the previous kernel's
 *   tail, x may be its output) TMA-loads 64-row x tiles (3D map: k, row in
 *   group, group), 128B-swizzled, K-major, into a ring of WR_STAGES slots
 *   with full/empty mbarriers; a slot's full barrier is one of two, by
 *   the consumer that takes the tile (below);
 * - warpgroups 1 and 2 are consumers taking the CTA's tiles in turn: 64
 *   rows x 256 outputs each, both operands from shared memory (two
 *   m64n128k16 wgmmas per 16-deep step), the slot released as soon as its
 *   MMAs complete; then bias, ReLU, rounding, a transpose inside each lane
 *   quad, and 16-byte stores straight from registers (no shared staging:
 *   W and the ring take the SM's shared memory), so one consumer's
 *   epilogue runs under the other's MMAs and the producer's loads.
 * A CTA keeps one 256-output block of W: with more outputs, CTA i serves
 * block i % NB and every NB-th row tile.
 * Measured (bench/RESULTS.md, 2026-12-05): Q and Wo 56.3 -> 49.9 us in the
 * forward. The plain joint K/V projection (16384 x 256 > 512, two output
 * blocks) lost to cuBLASLt there (15.9 against 15.2 us), so plain linear
 * stays on cuBLASLt.
 *
 * Used by cuda_linear_grouped (backend_cuda.cu) where cu_linear_wr_fits:
 * bf16/fp16, 0 < in <= 256, out % 8 == 0, at least WR_MIN_ROWS rows in
 * all, x, y, W 16-byte aligned with row and group strides in whole 16-byte
 * units; act NONE or RELU (bk_grouped_check). Accumulation is fp32 in the
 * tensor cores, k in increasing 16-deep steps.
 */

#include "kernels/cuda/cuda_internal.h"
#include "kernels/cuda/mma_util.cuh"
#include "kernels/cuda/tma_util.cuh"
#include "kernels/cuda/wgmma_gen.cuh"
#include "kernels/cuda/wr_ring.h"

#define WR_BM 64         /* rows per tile (one consumer warpgroup)        */
#define WR_BN 256        /* outputs per CTA (W rows resident)             */
#define WR_KMAX 256      /* in at most: four 64-deep slices               */
#define WR_MIN_ROWS 1024 /* below, a launch of persistent CTAs is mostly W */
#define WR_W_BYTES (WR_BN * WR_KMAX * 2)
#define WR_X_BYTES (WR_BM * WR_KMAX * 2)
static_assert(WR_CONSUMERS == 2, "k_linear_wr: warpgroups 1 and 2 consume (384 threads a CTA)");
#define WR_BAR_OFF (WR_W_BYTES + WR_STAGES * WR_X_BYTES)
#define WR_SMEM (1024 + WR_BAR_OFF + (WR_FULL + WR_STAGES + 1) * 8)

int cu_linear_wr_fits(enum cu_dtype dt, int rows, const bk_weight *w, const void *x, int ldx,
                      int64_t gx, const void *y, int ldy, int64_t gy)
{
    const uintptr_t al = (uintptr_t)x | (uintptr_t)y | (uintptr_t)w->data;
    return dt != CU_F32 && rows >= WR_MIN_ROWS && w->cols > 0 && w->cols <= WR_KMAX &&
           w->rows % 8 == 0 && w->ld % 8 == 0 && ldx % 8 == 0 && ldy % 8 == 0 && gx % 8 == 0 &&
           gy % 8 == 0 && (al & 15) == 0;
}

/* The ring's schedule (slot, barrier and parity of each tile) is wr_ring.h's,
 * checked on the CPU against every order the loads can land in
 * (tests/unit/test_wr_ring.c). It has a full barrier per (slot, consumer)
 * pair. With one per slot, consecutive phases of a slot's barrier belonged to
 * different consumers. A consumer waiting for tile i (phase k) while the
 * other's tile i - 3 (phase k - 1) had not landed then saw parity k & 1 as
 * complete, read the slot early, and the ring's phases drifted. Under the
 * daemon's concurrent batches that lost the device within seconds
 * ("unspecified launch failure", H100, 2026-12-05, bench/RESULTS.md). */

/* Tile t of the CTA's row tiles: group t / rb, rows 64 (t % rb) ..; tile i
 * of this CTA is t = blockIdx.x / nb + i * (gridDim.x / nb). */
template <typename T, int KT, bool RELU>
__global__ void __launch_bounds__(384, 1)
k_linear_wr(const __grid_constant__ CUtensorMap tw, const __grid_constant__ CUtensorMap tx, int g,
            int rb, int ntiles, int nb, int out, const T *__restrict__ bias, T *__restrict__ y,
            int ldy, int64_t gy)
{
    extern __shared__ unsigned char smem_raw[];
    unsigned char *smem = (unsigned char *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    unsigned char *Ws = smem, *Xs = smem + WR_W_BYTES;
    uint64_t *full = (uint64_t *)(smem + WR_BAR_OFF), *empty = full + WR_FULL,
             *wbar = empty + WR_STAGES;
    const int tid = threadIdx.x, lane = tid & 31;
    const int nblk = (int)blockIdx.x % nb, per = (int)gridDim.x / nb, t0 = (int)blockIdx.x / nb;
    const int mine = t0 < ntiles ? (ntiles - 1 - t0) / per + 1 : 0;
    const int n0 = nblk * WR_BN;
    /* Whether the block's second 128 outputs exist (its MMAs run anyway, on
     * the zeros TMA wrote for W rows past out: no branch between wgmmas). */
    const bool two = n0 + 128 < out;

    if (tid == 0) {
        for (int i = 0; i < WR_FULL; i++)
            mbar_init(&full[i], 1);
        for (int i = 0; i < WR_STAGES; i++)
            mbar_init(&empty[i], 4); /* lane 0 of each warp of the consuming warpgroup */
        mbar_init(wbar, 1);
        mbar_fence_init();
    }
    __syncthreads();
    pdl_trigger();

    if (tid < 128) {
        /* ---- producer: one thread; the warpgroup gives registers back ---- */
        setmaxnreg_dec<40>();
        if (tid != 0)
            return;
        tma_prefetch_desc(&tw);
        tma_prefetch_desc(&tx);
        mbar_expect_tx(wbar, KT * WR_BN * 128);
        for (int ks = 0; ks < KT; ks++)
            tma_load_2d(Ws + ks * WR_BN * 128, &tw, wbar, ks * 64, n0);
        pdl_wait(); /* x may be the previous kernel's output */
        for (int i = 0; i < mine; i++) {
            const int slot = wr_slot(i), t = t0 + i * per;
            mbar_wait(&empty[slot], wr_empty_parity(i));
            uint64_t *f = &full[wr_full_bar(i)];
            mbar_expect_tx(f, KT * WR_BM * 128);
            for (int ks = 0; ks < KT; ks++)
                tma_load_3d(Xs + slot * WR_X_BYTES + ks * WR_BM * 128, &tx, f, ks * 64,
                            (t % rb) * WR_BM, t / rb);
        }
        return;
    }

    /* ---- consumers: warpgroup cw takes the CTA's tiles cw, cw + 2, ... ---- */
    setmaxnreg_inc<232>();
    const int cw = (tid - 128) >> 7, wq = ((tid - 128) >> 5) & 3, gq = lane >> 2, tq = lane & 3;
    float acc[128];
    mbar_wait(wbar, 0);
    for (int i = cw; i < mine; i += WR_CONSUMERS) { /* wr_consumer(i) == cw */
        const int slot = wr_slot(i), t = t0 + i * per;
#pragma unroll
        for (int q = 0; q < 128; q++)
            acc[q] = 0.0f;
        mbar_wait(&full[wr_full_bar(i)], wr_full_parity(i));
        const unsigned char *As = Xs + slot * WR_X_BYTES;
        wg_fence();
        wg_fence_regs<128>(acc);
#pragma unroll
        for (int kk = 0; kk < 4 * KT; kk++) {
            const uint64_t ad = wg_desc(As + (kk >> 2) * (WR_BM * 128) + (kk & 3) * 32, 16, 1024);
            const unsigned char *Wk = Ws + (kk >> 2) * (WR_BN * 128) + (kk & 3) * 32;
            wgmma_ss<T, 128, 0>::run(acc, ad, wg_desc(Wk, 16, 1024));
            wgmma_ss<T, 128, 0>::run(acc + 64, ad, wg_desc(Wk + 128 * 128, 16, 1024));
        }
        wg_commit();
        wg_wait<0>();
        wg_fence_regs<128>(acc);
        if (lane == 0)
            mbar_arrive(&empty[slot]);

        /* Rows 16 wq + gq (+ 8) of the tile; accumulator j of half h holds
         * columns n0 + 128 h + 8 j + 2 tq, + 1. Four n8 blocks at a time are
         * transposed inside the quad, so lane tq stores 8 columns of a row. */
        const int r0 = (t % rb) * WR_BM + 16 * wq + gq;
        T *yg = y + (size_t)(t / rb) * gy;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            if (h == 1 && !two)
                break;
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const int nq = n0 + 128 * h + 32 * q;
                float2 bv[4];
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const int c = nq + 8 * j + 2 * tq;
                    bv[j] = bias && c < out ? make_float2(cu_tof<T>(bias[c]), cu_tof<T>(bias[c + 1]))
                                            : make_float2(0.0f, 0.0f);
                }
#pragma unroll
                for (int hr = 0; hr < 2; hr++) {
                    uint32_t v[4];
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        const float *a = acc + 64 * h + 4 * (4 * q + j) + 2 * hr;
                        float p0 = a[0] + bv[j].x, p1 = a[1] + bv[j].y;
                        if (RELU) {
                            p0 = fmaxf(p0, 0.0f);
                            p1 = fmaxf(p1, 0.0f);
                        }
                        v[j] = pack2<T>(p0, p1);
                    }
                    quad_transpose(v, tq);
                    const int r = r0 + 8 * hr, n = nq + 8 * tq;
                    if (r < g && n < out)
                        *(uint4 *)(yg + (size_t)r * ldy + n) = make_uint4(v[0], v[1], v[2], v[3]);
                }
            }
        }
    }
}

/* Tensor maps: W [out, ld] K-major in 64 k x 256 row boxes; x [groups, g,
 * ldx] in 64 k x 64 row x 1 group boxes (rows past g and k past in read as
 * zeros), both 128B-swizzled. */
template <typename T>
static int wr_tmaps(const bk_weight *w, const void *x, int ldx, int64_t gx, int groups, int g,
                    CUtensorMap *tw, CUtensorMap *tx, bk_err *err)
{
    const CUtensorMapDataType dt = cu_tmap_dtype<T>();
    const uint64_t es = sizeof(T);
    uint64_t wd[2] = {(uint64_t)w->cols, (uint64_t)w->rows}, ws[1] = {(uint64_t)w->ld * es};
    uint32_t wb[2] = {64, WR_BN};
    uint64_t xd[3] = {(uint64_t)w->cols, (uint64_t)g, (uint64_t)groups},
             xs[2] = {(uint64_t)ldx * es, (uint64_t)gx * es};
    uint32_t xb[3] = {64, WR_BM, 1};
    int rc = cu_tmap_encode(tw, dt, 2, w->data, wd, ws, wb, CU_TENSOR_MAP_SWIZZLE_128B);
    if (!rc)
        rc = cu_tmap_encode(tx, dt, 3, x, xd, xs, xb, CU_TENSOR_MAP_SWIZZLE_128B);
    if (rc) {
        bk_seterr(err, "linear (W resident): encoding a TMA tensor map failed (CUresult %d; %d "
                  "groups of %d rows, in %d, out %d)", rc, groups, g, w->cols, w->rows);
        return -1;
    }
    return 0;
}

template <typename T, int KT>
static int wr_launch(bk_stream *s, const void *x, int ldx, int64_t gx, int groups, int g,
                     const bk_weight *w, const bk_weight *bias, bool relu, void *y, int ldy,
                     int64_t gy, bk_err *err)
{
    auto kern = relu ? k_linear_wr<T, KT, true> : k_linear_wr<T, KT, false>;
    CUtensorMap tw, tx;
    if (wr_tmaps<T>(w, x, ldx, gx, groups, g, &tw, &tx, err) ||
        cu_smem_limit(s, (const void *)kern, WR_SMEM, err))
        return -1;
    const int rb = (g + WR_BM - 1) / WR_BM, nb = (w->rows + WR_BN - 1) / WR_BN;
    const long ntiles = (long)groups * rb;
    if (ntiles >= (1L << 30) || nb > cu_impl(s->be)->sm_count) {
        bk_seterr(err, "linear (W resident): %d groups of %d rows x %d outputs is too large for "
                  "one launch", groups, g, w->rows);
        return -1;
    }
    const int sms = cu_impl(s->be)->sm_count;
    long per = sms / nb;
    if (per > ntiles)
        per = ntiles;
    cudaLaunchAttribute at[2];
    cudaLaunchConfig_t cfg = cluster_cfg(at, 1, (unsigned)(per * nb), 384, WR_SMEM, s->st, true);
    const char *what = "linear (W resident, wgmma)";
    CU_TRY(cudaLaunchKernelEx(&cfg, kern, tw, tx, g, rb, (int)ntiles, nb, w->rows,
                              bias ? (const T *)bias->data : (const T *)nullptr, (T *)y, ldy, gy),
           what);
    return cu_check_launch(s, err, what);
}

int cu_linear_wr(bk_stream *s, const void *x, int ldx, int64_t gx, int groups, int g,
                 const bk_weight *w, const bk_weight *bias, enum bk_act act, void *y, int ldy,
                 int64_t gy, bk_err *err)
{
    const int kt = (w->cols + 63) / 64;
    const bool relu = act == BK_ACT_RELU;
    switch (cu_dt(s)) {
#define WR_CASE(DT, TY)                                                                       \
    case DT:                                                                                  \
        return kt == 1   ? wr_launch<TY, 1>(s, x, ldx, gx, groups, g, w, bias, relu, y, ldy, gy, err) \
               : kt == 2 ? wr_launch<TY, 2>(s, x, ldx, gx, groups, g, w, bias, relu, y, ldy, gy, err) \
               : kt == 3 ? wr_launch<TY, 3>(s, x, ldx, gx, groups, g, w, bias, relu, y, ldy, gy, err) \
                         : wr_launch<TY, 4>(s, x, ldx, gx, groups, g, w, bias, relu, y, ldy, gy, err);
        WR_CASE(CU_BF16, __nv_bfloat16)
        WR_CASE(CU_F16, __half)
#undef WR_CASE
    case CU_F32:
        break;
    }
    bk_seterr(err, "linear (W resident): fp32 is not served here");
    return -1;
}
