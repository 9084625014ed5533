/* lce_v6.cu - LCE on the older Hopper wgmma kernel, k_lce_wg (lost), and
 * its two timing diagnostics, v7 and v8. Benchmark only.
 *
 * What it tries: the transposed product Z^T = E^T W^T on wgmma m64nNk16
 * (N = 224 covers M = 433 in two tiles), A = E^T from registers
 * (ldmatrix.trans), B = W from a 128B-swizzled shared tile, a 4-stage
 * cp.async ring issued by the compute warps themselves (one block barrier
 * per 64-deep K slice), persistent CTAs, the user term in fragment order
 * seeding the accumulators, a shared-memory-staged epilogue with bulk
 * stores.
 * What it measured (H200, bf16, C 1024, M 433, D 256, ratio 70; floor
 * 0.25-0.26 ms): 1.12 ms first, 0.67 with the fragment-order user term and
 * staged 16-byte stores, 0.63 with the next slice's copies issued under the
 * running wgmmas; 0.635 ms in the 2026-12-01 final call, against 0.376 ms
 * for production's warp-specialized k_lce_ws (TMA producer, mbarrier ring,
 * 2-CTA clusters). Diagnostics (wrong results, timing only): v7 skips the
 * user term (0.609 ms), v8 the epilogue stores (0.442 ms): the epilogue
 * cost ~0.2 ms that the compute warps could not overlap, which is what
 * k_lce_ws fixed. Production served K = 0 launches (no candidate tokens)
 * with this kernel until it moved here; those now take mma.sync.
 * (bench/kernels/NOTES.md, bench/RESULTS.md 2026-11-29 and 2026-12-01.)
 */
#include "bench/kernels/variants.cuh"
#include "kernels/cuda/lce_kern.cuh"

/* Hopper kernel: the transposed product Z[b]^T = E[b]^T W^T, so that the
 * awkward M (433) is wgmma's N (any multiple of 8 up to 256: 2 x 224 covers
 * 433 with 3% padding) and D is the warpgroups' 64-row dimension.
 *   A = E[b]^T (64 d x 16 k per warpgroup): registers, loaded with
 *       ldmatrix.trans from the [k][d] shared tile (padded rows);
 *   B = W^T (16 k x BNM m): W's rows are K-contiguous, so B is K-major and
 *       read straight from a 128B-swizzled shared tile by its descriptor.
 * Block: 2 warpgroups (128 d rows) x BNM m columns; K in slices of 64 through
 * a 4-stage cp.async ring. Persistent: each block walks tiles blockIdx.x,
 * + gridDim.x, ... and the ring runs on across tile boundaries, so the next
 * tile's first slices load while this tile's epilogue stores.
 *
 * The user term is in fragment order (kernels/cuda/lce_kern.cuh); the
 * candidate GEMM (MODE_ADD) starts each tile's accumulators from it. The
 * candidate epilogue stages the bf16/fp16 tile in the ring slot it just
 * consumed (two halves) and writes Z with coalesced 16-byte bulk stores.
 * K = 0 works (the user term or zeros are written). */
template <int BNM> struct lcew_cfg {
    static constexpr int BD = 128, BK = 64, STAGES = 4, THREADS = 256;
    static constexpr int LDE = BD + 8;                  /* [k][d] rows, 272 B */
    static constexpr int LDO = BD + 8;                  /* epilogue rows      */
    static constexpr int W_BYTES = BNM * 128;           /* BNM rows of 64 k   */
    static constexpr int E_BYTES = BK * LDE * 2;        /* 17 KiB             */
    static constexpr int STAGE_BYTES = W_BYTES + E_BYTES;
    static constexpr size_t SMEM = (size_t)STAGES * STAGE_BYTES + 1024;
    static_assert(W_BYTES % 1024 == 0 && E_BYTES % 1024 == 0, "stages stay 1024-aligned");
    static_assert(BNM % 32 == 0 || BNM == 224, "W rows split evenly over 256 threads");
    static_assert((BNM / 2) * LDO * 2 <= STAGE_BYTES, "half an output tile fits a ring slot");
};

template <typename T, int MODE, int BNM, bool EPI = true>
__global__ void __launch_bounds__(256, 1)
k_lce_wg(const T *__restrict__ w, int ldw, const T *__restrict__ e, int nb, int K, int M, int D,
         float *__restrict__ yf, const int32_t *__restrict__ map, T *__restrict__ z, int ntiles)
{
    typedef lcew_cfg<BNM> CFG;
    constexpr int BD = CFG::BD, BK = CFG::BK, STAGES = CFG::STAGES, LDE = CFG::LDE;
    constexpr int LDO = CFG::LDO, NQ = BNM / 8; /* 16-byte accumulator chunks per thread */
    extern __shared__ unsigned char smem_raw[];
    unsigned char *smem =
        (unsigned char *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wg = warp >> 2, wq = warp & 3, g = lane >> 2, t = lane & 3;
    const int MT = (M + BNM - 1) / BNM, DT = (D + BD - 1) / BD;
    const int KT = K > 0 ? (K + BK - 1) / BK : 1;
    const int mine = ((int)blockIdx.x < ntiles) ? (ntiles - 1 - (int)blockIdx.x) / (int)gridDim.x + 1 : 0;
    const int total = mine * KT;

    struct cursor {
        int ks, i, tile, m0, d0, b;
    };
    auto decode = [&](cursor &c) {
        int tt = (int)blockIdx.x + c.i * (int)gridDim.x;
        c.tile = tt;
        c.m0 = (tt % MT) * BNM;
        tt /= MT;
        c.d0 = (tt % DT) * BD;
        c.b = tt / DT;
    };
    auto advance = [&](cursor &c) {
        if (++c.ks == KT) {
            c.ks = 0;
            c.i++;
            decode(c);
        }
    };

    /* This thread's fixed share of each slice: W rows (tid/8) + 32n, chunk
     * tid%8 (swizzle constant per thread); E rows (tid/16) + 16n, chunk tid%16. */
    const int wr = tid >> 3, wc = tid & 7, er = tid >> 4, ec = tid & 15;
    const uint32_t woff = wr * 128 + ((wc ^ (wr & 7)) << 4);
    const uint32_t eoff = (er * LDE + ec * 8) * 2;
    auto load = [&](const cursor &c, int slot) {
        unsigned char *Ws = smem + slot * CFG::STAGE_BYTES;
        unsigned char *Es = Ws + CFG::W_BYTES;
        const int k0 = c.ks * BK;
        const bool kw = k0 + wc * 8 < ldw;
        const T *ws = w + (size_t)(c.m0 + wr) * ldw + k0 + wc * 8;
#pragma unroll
        for (int n = 0; n < BNM / 32; n++) {
            bool ok = kw && c.m0 + wr + 32 * n < M;
            cp_async16(Ws + woff + n * 4096, ok ? ws + (size_t)32 * n * ldw : w, ok);
        }
        const bool dk = c.d0 + ec * 8 < D;
        const T *es = e + ((size_t)c.b * K + k0 + er) * D + c.d0 + ec * 8;
#pragma unroll
        for (int n = 0; n < BK / 16; n++) {
            bool ok = dk && k0 + er + 16 * n < K;
            cp_async16(Es + eoff + n * 16 * LDE * 2, ok ? es + (size_t)16 * n * D : e, ok);
        }
    };

    float acc[BNM / 2];
    /* Accumulators start at the user term (MODE_ADD) or zero. */
    auto init_acc = [&](const cursor &c) {
        if (MODE == MODE_ADD) {
            int ut = (map[c.b] * DT + c.d0 / BD) * MT + c.m0 / BNM;
            const float4 *src = (const float4 *)yf + (size_t)ut * NQ * 256 + tid;
#pragma unroll
            for (int q = 0; q < NQ; q++) {
                float4 v4 = src[(size_t)q * 256];
                acc[4 * q] = v4.x;
                acc[4 * q + 1] = v4.y;
                acc[4 * q + 2] = v4.z;
                acc[4 * q + 3] = v4.w;
            }
        } else {
#pragma unroll
            for (int i = 0; i < BNM / 2; i++)
                acc[i] = 0.0f;
        }
    };

    cursor L = {0, 0, 0, 0, 0, 0}, C = {0, 0, 0, 0, 0, 0};
    decode(L);
    decode(C);
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < total) {
            load(L, s);
            advance(L);
        }
        cp_async_commit();
    }
    if (total > 0)
        init_acc(C);

    bool stored = false; /* bulk stores read a ring slot that is refilled next */
    for (int it = 0; it < total; it++) {
        cp_async_wait<STAGES - 2>();
        if (MODE != MODE_USER && stored) {
            bulk_wait_read<0>();
            stored = false;
        }
        __syncthreads();
        const int slot = it % STAGES;
        unsigned char *Ws = smem + slot * CFG::STAGE_BYTES;
        const T *Es = (const T *)(Ws + CFG::W_BYTES);
        uint32_t af[BK / 16][4];
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++)
            ldmatrix_x4_trans(af[kk], Es + (kk * 16 + (lane >> 4) * 8 + (lane & 7)) * LDE +
                                          wg * 64 + wq * 16 + ((lane >> 3) & 1) * 8);
        wg_fence();
        wg_fence_regs<BNM / 2>(acc);
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++)
            wgmma_rs<T, BNM, 0>::run(acc, af[kk], wg_desc(Ws + kk * 32, 16, 1024));
        wg_commit();
        /* Copies for slice it + 3 issue while the tensor cores work: its slot
         * was last read by slice it - 1, finished before the barrier above. */
        if (it + STAGES - 1 < total) {
            load(L, (it + STAGES - 1) % STAGES);
            advance(L);
        }
        cp_async_commit();
        wg_wait<0>();
        wg_fence_regs<BNM / 2>(acc);

        if (C.ks != KT - 1) {
            C.ks++;
            continue;
        }
        if (EPI && MODE == MODE_USER) {
            float4 *dst = (float4 *)yf + (size_t)C.tile * NQ * 256 + tid;
#pragma unroll
            for (int q = 0; q < NQ; q++)
                dst[(size_t)q * 256] =
                    make_float4(acc[4 * q], acc[4 * q + 1], acc[4 * q + 2], acc[4 * q + 3]);
        } else if (EPI) {
            /* Both warpgroups are past this slot's wgmma; the next write to
             * it is the prefetch after the next iteration's barrier, which
             * the bulk copies' reads of it precede (bulk_wait_read there). */
            __syncthreads();
            T *zb = z + (size_t)C.b * M * D;
            const uint32_t row_bytes = (uint32_t)min(BD, D - C.d0) * 2;
#pragma unroll
            for (int r = 0; r < 2; r++) {
                if (r) {
                    bulk_wait_read<0>();
                    __syncthreads();
                }
#pragma unroll
                for (int j = r * (BNM / 16); j < (r + 1) * (BNM / 16); j++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        float p0, p1;
                        col_pair(acc, j, h, g, p0, p1);
                        int ml = 8 * j + 2 * t + (g & 1) - r * (BNM / 2);
                        int dl = wg * 64 + wq * 16 + (g & ~1) + 8 * h;
                        *(uint32_t *)(Ws + (ml * LDO + dl) * 2) = pack2<T>(p0, p1);
                    }
                fence_proxy_async();
                __syncthreads();
                /* One thread per output row: Z[b][m][d0 .. d0+128) is one
                 * contiguous run of 256 bytes. */
                if (tid < BNM / 2) {
                    int gm = C.m0 + r * (BNM / 2) + tid;
                    if (gm < M)
                        bulk_store(zb + (size_t)gm * D + C.d0, Ws + tid * LDO * 2, row_bytes);
                }
                bulk_commit();
            }
            stored = true;
        }
        advance(C);
        if (it + 1 < total)
            init_acc(C);
    }
    cp_async_wait<0>();
    if (MODE != MODE_USER)
        bulk_wait<0>();
}

template <typename T, int MODE, int BNM, bool EPI>
static int launch_wg(bk_stream *s, const T *w, int ldw, const T *e, int nb, int K, int M, int D,
                     float *yf, const int32_t *map, T *z, bk_err *err)
{
    auto kern = k_lce_wg<T, MODE, BNM, EPI>;
    if (cu_smem_limit(s, (const void *)kern, (int)lcew_cfg<BNM>::SMEM, err))
        return -1;
    long ntiles = (long)((M + BNM - 1) / BNM) * ((D + 127) / 128) * nb;
    if (ntiles >= (1L << 30)) {
        bk_seterr(err, "lce: %d x %d x %d is too large for one launch", nb, M, D);
        return -1;
    }
    int sms = cu_impl(s->be)->sm_count;
    unsigned grid = (unsigned)(ntiles < sms ? ntiles : sms);
    kern<<<grid, 256, lcew_cfg<BNM>::SMEM, s->st>>>(w, ldw, e, nb, K, M, D, yf, map, z,
                                                    (int)ntiles);
    return cu_check_launch(s, err, "lce (wgmma)");
}

/* EPI = false: v8; user = false: v7 (Z = W_cand Ec alone). */
template <bool EPI, bool USER>
static int lce_wg_run(const char *name, LCE_VARIANT_ARGS)
{
    if (!lce_ws_takes(s, kc, m, d, name, err))
        return -1;
    auto run = [&](auto t) {
        typedef decltype(t) T;
        return lce_bnm(m, [&](auto bnm) {
            constexpr int BNM = decltype(bnm)::value;
            auto launch = [&](auto mode, const T *w, int ldw, const T *e, int nb, int K,
                              float *yf, const int32_t *mp, T *zz) {
                return launch_wg<T, decltype(mode)::value, BNM, EPI>(s, w, ldw, e, nb, K, m, d,
                                                                     yf, mp, zz, err);
            };
            return lce_frag<T, BNM>(s, (const T *)eu, nu, (const T *)ec, nc, map, w_user, w_cand,
                                    USER ? ku : 0, kc, m, d, (T *)z, launch, err);
        });
    };
    return cu_dt(s) == CU_BF16 ? run(__nv_bfloat16()) : run(__half());
}

int lce_v6(LCE_VARIANT_ARGS)
{
    return lce_wg_run<true, true>("lce_v6", s, eu, nu, ec, nc, map, w_user, w_cand, ku, kc, m, d,
                                  z, err);
}

int lce_v7(LCE_VARIANT_ARGS)
{
    return lce_wg_run<true, false>("lce_v7", s, eu, nu, ec, nc, map, w_user, w_cand, ku, kc, m, d,
                                   z, err);
}

int lce_v8(LCE_VARIANT_ARGS)
{
    return lce_wg_run<false, true>("lce_v8", s, eu, nu, ec, nc, map, w_user, w_cand, ku, kc, m, d,
                                   z, err);
}
