/* lce.cu - IKBO linear compression embedding on the GPU.
 *
 *   Z[c] = W_user @ Eu[map[c]] + W_cand @ Ec[c]
 *   Eu [U, Ku, D], Ec [C, Kc, D], W_user [M, Ku], W_cand [M, Kc], Z [C, M, D]
 *
 * Why this exists: the broadcast formulation copies every user's [Ku, D]
 * block to each of its candidates and runs one GEMM over K = Ku + Kc. The
 * user term only depends on the user, so it is computed once per user
 * (stream scratch at U rows, fp32), and the candidate GEMM adds it to its
 * accumulators through map[c]: no [C, Ku, D] copy and no [C, M, D] user-term
 * buffer ever exist. Both GEMMs are the same batched kernel (one W for the
 * whole batch, one E block per batch item).
 *
 * Kernels, fastest first (IKBO_CUDA_LCE picks one for tests and benches):
 * - warp-specialized wgmma (Hopper, bf16/fp16, M >= 64 and D >= 64,
 *   D % 8 == 0, 16-byte aligned operands): see k_lce_ws; a TMA producer
 *   thread and two consumer warpgroups, W shared by 2-CTA clusters where D
 *   has an even number of 128-wide blocks; the user term is kept in the
 *   accumulator fragment order and added before the one rounding.
 * - the older wgmma kernel (same conditions): see k_lce_wg; copies issued
 *   by the compute warps, block-wide barrier per slice; the user term seeds
 *   the candidate accumulators. It also serves launches with K = 0.
 * - mma.sync m16n8k16 (bf16/fp16, D % 8 == 0): 4-stage cp.async pipeline,
 *   padded shared rows for conflict-free ldmatrix; user term dense
 *   [U, M, D] fp32, added in the epilogue.
 * - SIMT (fp32 mode, odd D): 64 x 64 tiles, fp32 FMA.
 *
 * Numerics: user and candidate partial sums are each accumulated in fp32 and
 * added in fp32 before the one rounding to the activation dtype.
 */
#include <type_traits>

#include "kernels/cuda/cuda_internal.h"
#include "kernels/cuda/mma_util.cuh"
#include "kernels/cuda/tma_util.cuh"
#include "kernels/cuda/wgmma_gen.cuh"

/* ---------------------------------------------------------- tensor cores */

/* Block tile BM x BN of Z[b] (M rows x D columns), warps WARPS_M x WARPS_N,
 * each warp MI m16-tiles x NI n8-tiles. */
template <int WARPS_M_, int WARPS_N_, int MI_, int NI_, int MINB_> struct lce_cfg {
    static constexpr int WARPS_M = WARPS_M_, WARPS_N = WARPS_N_, MI = MI_, NI = NI_;
    static constexpr int MINB = MINB_; /* blocks per SM the register budget aims at */
    static constexpr int BM = WARPS_M * MI * 16;
    static constexpr int BN = WARPS_N * NI * 8;
    static constexpr int BK = 32;
    static constexpr int STAGES = 4;
    static constexpr int THREADS = WARPS_M * WARPS_N * 32;
    static constexpr int LDA = BK + 8; /* padded rows: 80 B, ldmatrix conflict-free */
    static constexpr int LDB = BN + 8; /* (BN + 8) * 2 B = 16 mod 128 */
    static constexpr int A_ELEMS = BM * LDA;
    static constexpr int B_ELEMS = BK * LDB;
    static constexpr int STAGE_ELEMS = A_ELEMS + B_ELEMS;
    static constexpr size_t SMEM = (size_t)STAGES * STAGE_ELEMS * 2;
    static_assert(NI % 2 == 0, "B fragments are loaded two n8-tiles at a time");
};

/* Z[b] = W @ E[b] (+ Y[map[b]]): W [M, ldw] (zero columns past K), E[b] at
 * e + b*K*D, rows of D elements; Z[b] at z + b*M*D; Y fp32 [*, M, D]. */
template <typename T, typename OutT, bool ADD, class CFG>
__global__ void __launch_bounds__(CFG::THREADS, CFG::MINB)
k_lce_tc(const T *__restrict__ w, int ldw, const T *__restrict__ e, int nb, int K, int M, int D,
         const float *__restrict__ y, const int32_t *__restrict__ map, OutT *__restrict__ z)
{
    constexpr int BM = CFG::BM, BN = CFG::BN, BK = CFG::BK, STAGES = CFG::STAGES;
    constexpr int LDA = CFG::LDA, LDB = CFG::LDB, NT = CFG::THREADS;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T *smem = (T *)smem_raw;

    const int mt = (M + BM - 1) / BM, ntl = (D + BN - 1) / BN;
    long bid = blockIdx.x;
    const int tm = (int)(bid % mt);
    bid /= mt;
    const int tn = (int)(bid % ntl);
    const int b = (int)(bid / ntl);
    if (b >= nb)
        return;
    const int m0 = tm * BM, n0 = tn * BN;
    const T *eb = e + (size_t)b * K * D;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp / CFG::WARPS_N, wn = warp % CFG::WARPS_N;

    auto load_stage = [&](int stage, int kt) {
        T *As = smem + stage * CFG::STAGE_ELEMS;
        T *Bs = As + CFG::A_ELEMS;
        const int k0 = kt * BK;
        /* A: BM rows x BK/8 chunks of W. */
        for (int i = tid; i < BM * (BK / 8); i += NT) {
            int r = i / (BK / 8), c = i % (BK / 8);
            int gm = m0 + r, gk = k0 + c * 8;
            bool ok = gm < M && gk < ldw;
            const T *src = ok ? w + (size_t)gm * ldw + gk : w;
            cp_async16(As + r * LDA + c * 8, src, ok);
        }
        /* B: BK rows x BN/8 chunks of E[b]. */
        for (int i = tid; i < BK * (BN / 8); i += NT) {
            int r = i / (BN / 8), c = i % (BN / 8);
            int gk = k0 + r, gn = n0 + c * 8;
            bool ok = gk < K && gn < D;
            const T *src = ok ? eb + (size_t)gk * D + gn : e;
            cp_async16(Bs + r * LDB + c * 8, src, ok);
        }
    };

    constexpr int CMI = CFG::MI, CNI = CFG::NI;
    float acc[CMI][CNI][4];
#pragma unroll
    for (int i = 0; i < CMI; i++)
#pragma unroll
        for (int j = 0; j < CNI; j++)
#pragma unroll
            for (int q = 0; q < 4; q++)
                acc[i][j][q] = 0.0f;

    const int ktiles = (K + BK - 1) / BK;
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < ktiles)
            load_stage(s, s);
        cp_async_commit();
    }

    for (int kt = 0; kt < ktiles; kt++) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        {
            int nk = kt + STAGES - 1;
            if (nk < ktiles)
                load_stage(nk % STAGES, nk);
            cp_async_commit();
        }
        const T *As = smem + (kt % STAGES) * CFG::STAGE_ELEMS;
        const T *Bs = As + CFG::A_ELEMS;
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            uint32_t af[CMI][4], bf[CNI][2];
#pragma unroll
            for (int i = 0; i < CMI; i++) {
                int r = wm * CMI * 16 + i * 16 + (lane & 15);
                int c = kk + (lane >> 4) * 8;
                ldmatrix_x4(af[i], As + r * LDA + c);
            }
#pragma unroll
            for (int j = 0; j < CNI; j += 2) {
                int r = kk + ((lane >> 3) & 1) * 8 + (lane & 7);
                int c = wn * CNI * 8 + j * 8 + (lane >> 4) * 8;
                uint32_t t4[4];
                ldmatrix_x4_trans(t4, Bs + r * LDB + c);
                bf[j][0] = t4[0];
                bf[j][1] = t4[1];
                bf[j + 1][0] = t4[2];
                bf[j + 1][1] = t4[3];
            }
#pragma unroll
            for (int i = 0; i < CMI; i++)
#pragma unroll
                for (int j = 0; j < CNI; j++)
                    mma16816<T>(acc[i][j], af[i], bf[j]);
        }
    }
    cp_async_wait<0>();

    /* Epilogue: add the user term through the map, round once, store pairs. */
    const int g = lane >> 2, t = lane & 3;
    const float *yb = ADD ? y + (size_t)map[b] * M * D : nullptr;
    OutT *zb = z + (size_t)b * M * D;
#pragma unroll
    for (int i = 0; i < CMI; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int gm = m0 + wm * CMI * 16 + i * 16 + g + h * 8;
            if (gm >= M)
                continue;
#pragma unroll
            for (int j = 0; j < CNI; j++) {
                int gn = n0 + wn * CNI * 8 + j * 8 + 2 * t;
                if (gn >= D)
                    continue;
                float v0 = acc[i][j][2 * h], v1 = acc[i][j][2 * h + 1];
                size_t off = (size_t)gm * D + gn;
                if (ADD) {
                    float2 u = *(const float2 *)(yb + off);
                    v0 += u.x;
                    v1 += u.y;
                }
                if constexpr (sizeof(OutT) == 4) {
                    *(float2 *)((float *)zb + off) = make_float2(v0, v1);
                } else {
                    *(uint32_t *)(zb + off) = pack2<T>(v0, v1);
                }
            }
        }
}

/* 112 x 256: M = 433 needs 4 row tiles (3% padding), D = 256 one column tile. */
typedef lce_cfg<1, 8, 7, 4, 1> cfg_l;
/* 128 x 128. */
typedef lce_cfg<2, 4, 4, 4, 1> cfg_m;
/* 64 x 128, for narrow D. */
typedef lce_cfg<2, 4, 2, 4, 2> cfg_s;

/* --------------------------------------------------------------- wgmma */

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
 * The user term never takes the [M, D] layout: the user GEMM (MODE_USER)
 * writes each tile's fp32 accumulators as they sit in registers ("fragment
 * order": 16-byte chunk q of thread x at [(tile * BNM/8 + q) * 256 + x]),
 * and the candidate GEMM (MODE_ADD) starts each tile's accumulators from the
 * same tile of its user, Yf[map[b]] - coalesced 16-byte loads, no index
 * math, one fp32 sum per output. Both launches must use the same BNM.
 * The candidate epilogue stages the bf16/fp16 tile in the ring slot it just
 * consumed (two halves) and writes Z with coalesced 16-byte stores. */
enum { MODE_USER = 0, MODE_ADD = 1, MODE_PLAIN = 2 };

/* Epilogue helper of both wgmma kernels. In an m64nN fp32 accumulator
 * fragment, lanes g and g^1 (g = lane / 4) hold rows d, d+1 of columns m,
 * m+1 (n8 block j, row half h); one swap gives each lane (d, d+1) of one
 * column: m = 8j + 2t + (g & 1), d = 16 * warp + (g & ~1) + 8h. */
__device__ __forceinline__ void col_pair(const float *acc, int j, int h, int g, float &p0,
                                         float &p1)
{
    float v0 = acc[4 * j + 2 * h], v1 = acc[4 * j + 2 * h + 1];
    float recv = __shfl_xor_sync(0xffffffffu, (g & 1) ? v0 : v1, 4);
    p0 = (g & 1) ? recv : v0;
    p1 = (g & 1) ? v1 : recv;
}

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

/* ------------------------------------------- wgmma, warp-specialized */

/* The same transposed product as k_lce_wg (Z[b]^T = E[b]^T W^T: D is the
 * warpgroups' 64-row dimension, M is wgmma's N), restructured so that the
 * tensor cores never wait on a block-wide barrier:
 * - warpgroup 0 is the producer: one thread issues TMA loads of each 64-deep
 *   K slice (W tile BNM x 64, 128B-swizzled, K-major; E tile 64 k x 64 d per
 *   consumer, 128B-swizzled, d innermost) into a ring of STAGES slots, each
 *   with a "full" mbarrier (TMA transaction bytes) and an "empty" one
 *   (one arrival per consumer warp);
 * - warpgroups 1 and 2 are consumers, 64 d rows each of a 128 x BNM tile:
 *   both operands straight from shared memory (A = E^T read MN-major by its
 *   descriptor, no ldmatrix), one wgmma group in flight while the previous
 *   slot is released, so loads, barriers and MMAs overlap;
 * - epilogue per consumer: accumulators plus the user term (fragment
 *   order, as in k_lce_wg, loaded under the last MMAs) are rounded, staged half a tile at a
 *   time in a 128B-swizzled buffer of the warpgroup's own, and written with
 *   one TMA tensor store per half (rows past M clipped by TMA); meanwhile the
 *   producer is already filling the ring with the next tile's slices.
 *   (A fifth ring stage in place of the staging buffers, with stores from
 *   registers, measured slower: bench/kernels/NOTES.md.)
 * Persistent CTAs walk tiles blockIdx.x, + gridDim.x, ...; tile order
 * (m tile fastest, then d block, then batch item) keeps W and the current
 * candidates' E in L2. */
template <int BNM> struct lcews_cfg {
    static constexpr int BK = 64, STAGES = 4, THREADS = 384;
    static constexpr int W_BYTES = BNM * 128;     /* BNM rows of 64 k       */
    static constexpr int E_BYTES = 64 * 128;      /* 64 k rows of 64 d      */
    static constexpr int STAGE_BYTES = W_BYTES + 2 * E_BYTES;
    static constexpr int HALF = BNM / 2;          /* output rows per store  */
    static constexpr int STG_BYTES = HALF * 128;  /* one half tile, 64 d    */
    static constexpr int STG_OFF = STAGES * STAGE_BYTES;
    static constexpr int BAR_OFF = STG_OFF + 2 * ((STG_BYTES + 1023) & ~1023);
    static constexpr size_t SMEM = (size_t)BAR_OFF + 2 * STAGES * 8 + 1024;
    static_assert(STAGE_BYTES % 1024 == 0, "stages stay 1024-aligned (128B swizzle)");
    static_assert(HALF % 8 == 0 && HALF <= 256, "a half tile is one TMA box");
};

template <typename T, int MODE, int BNM, bool EPI, int CL>
__global__ void __launch_bounds__(384, 1)
k_lce_ws(const __grid_constant__ CUtensorMap tw, const __grid_constant__ CUtensorMap te,
         const __grid_constant__ CUtensorMap tz, int K, int M, int D, float *__restrict__ yf,
         const int32_t *__restrict__ map, int ntiles)
{
    typedef lcews_cfg<BNM> CFG;
    constexpr int STAGES = CFG::STAGES, NQ = BNM / 8, HALF = CFG::HALF;
    extern __shared__ unsigned char smem_raw[];
    unsigned char *smem =
        (unsigned char *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    uint64_t *full = (uint64_t *)(smem + CFG::BAR_OFF), *empty = full + STAGES;

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int MT = (M + BNM - 1) / BNM, DT = (D + 127) / 128;
    const int KT = K > 0 ? (K + 63) / 64 : 1;
    /* CL = 2: a cluster of two CTAs takes the two d blocks of one (b, m
     * tile) "unit"; each CTA loads half of the W tile and multicasts it to
     * both, so W crosses L2 once per unit. CL = 4: two d blocks x two m
     * tiles; rank bit 0 picks the d block, bit 1 the m tile; W halves go to
     * the CTA pair of one m tile, E halves (one warpgroup's 64 d each) to
     * the pair of one d block. ntiles counts units. */
    const int rank = CL > 1 ? (int)cluster_rank() : 0;
    const int dr = rank & 1, mr = rank >> 1;
    const int unit0 = (int)blockIdx.x / CL, nunits = (int)gridDim.x / CL;
    const int mine = unit0 < ntiles ? (ntiles - 1 - unit0) / nunits + 1 : 0;
    auto decode = [&](int i, int &mt, int &dt, int &b) {
        int tt = unit0 + i * nunits;
        if (CL == 4) {
            mt = 2 * (tt % (MT / 2)) + mr;
            tt /= MT / 2;
        } else {
            mt = tt % MT;
            tt /= MT;
        }
        dt = CL > 1 ? 2 * (tt % (DT / 2)) + dr : tt % DT;
        b = CL > 1 ? tt / (DT / 2) : tt / DT;
    };

    if (tid == 0) {
        for (int i = 0; i < STAGES; i++) {
            mbar_init(&full[i], 1);
            /* lane 0 of each consumer warp of every CTA this one writes to */
            mbar_init(&empty[i], CL == 4 ? 24 : 8 * CL);
        }
        mbar_fence_init();
    }
    if (CL > 1)
        cluster_sync();
    else
        __syncthreads();

    if (warp < 4) {
        /* ---- producer: one thread; the warpgroup gives registers back ---- */
        setmaxnreg_dec<40>();
        if (tid != 0)
            return;
        tma_prefetch_desc(&tw);
        tma_prefetch_desc(&te);
        int slot = 0;
        uint32_t phase = 0;
        for (int i = 0; i < mine; i++) {
            int mt, dt, b;
            decode(i, mt, dt, b);
            const int m0 = mt * BNM, d0 = dt * 128;
            for (int ks = 0; ks < KT; ks++) {
                mbar_wait(&empty[slot], phase ^ 1);
                unsigned char *Ws = smem + slot * CFG::STAGE_BYTES;
                mbar_expect_tx(&full[slot], CFG::STAGE_BYTES);
                if (CL > 1)
                    tma_load_2d_mc(Ws + dr * (CFG::W_BYTES / 2), &tw, &full[slot], ks * 64,
                                   m0 + dr * (BNM / 2), (uint16_t)(3u << (2 * mr)));
                else
                    tma_load_2d(Ws, &tw, &full[slot], ks * 64, m0);
                if (CL == 4) {
                    tma_load_3d_mc(Ws + CFG::W_BYTES + mr * CFG::E_BYTES, &te, &full[slot],
                                   d0 + 64 * mr, ks * 64, b, (uint16_t)(5u << dr));
                } else {
                    tma_load_3d(Ws + CFG::W_BYTES, &te, &full[slot], d0, ks * 64, b);
                    tma_load_3d(Ws + CFG::W_BYTES + CFG::E_BYTES, &te, &full[slot], d0 + 64,
                                ks * 64, b);
                }
                if (++slot == STAGES) {
                    slot = 0;
                    phase ^= 1;
                }
            }
        }
        return;
    }

    /* ---- consumers: warpgroup cw (0/1) owns d rows d0 + 64 cw .. + 63 ---- */
    setmaxnreg_inc<232>();
    const int ct = tid - 128, cw = ct >> 7, wq = (ct >> 5) & 3, g = lane >> 2, t = lane & 3;
    const bool lead = (ct & 127) == 0;
    unsigned char *stg = smem + CFG::STG_OFF + cw * ((CFG::STG_BYTES + 1023) & ~1023);
    if (MODE != MODE_USER && lead)
        tma_prefetch_desc(&tz);
    float acc[BNM / 2];
    int slot = 0;
    uint32_t phase = 0;
    /* A slot is free once every consumer warp that reads it (both CTAs'
     * with CL = 2: the W half of each came from both producers) is done. */
    auto release = [&](int sl) {
        mbar_arrive(&empty[sl]);
        if (CL > 1)
            mbar_arrive_cluster(&empty[sl], (uint32_t)(rank ^ 1));
        if (CL == 4)
            mbar_arrive_cluster(&empty[sl], (uint32_t)(rank ^ 2));
    };
    for (int i = 0; i < mine; i++) {
        int mt, dt, b;
        decode(i, mt, dt, b);
        const int tile = (b * DT + dt) * MT + mt;
        /* The user term's tile (fragment order) is added after the MMAs, its
         * loads issued under the last slice's wgmmas and the first half's
         * stores, so no tile starts waiting on them. */
        const float4 *ysrc =
            MODE == MODE_ADD ? (const float4 *)yf + (size_t)((map[b] * DT + dt) * MT + mt) * NQ * 256 + ct
                             : nullptr;
#pragma unroll
        for (int q = 0; q < BNM / 2; q++)
            acc[q] = 0.0f;
        int prev = -1;
        for (int ks = 0; ks < KT; ks++) {
            mbar_wait(&full[slot], phase);
            const unsigned char *Ws = smem + slot * CFG::STAGE_BYTES;
            const unsigned char *Es = Ws + CFG::W_BYTES + cw * CFG::E_BYTES;
            wg_fence();
            wg_fence_regs<BNM / 2>(acc);
#pragma unroll
            for (int kk = 0; kk < 4; kk++)
                wgmma_ss_ta<T, BNM>::run(acc, wg_desc(Es + kk * 2048, 8192, 1024),
                                         wg_desc(Ws + kk * 32, 16, 1024));
            wg_commit();
            wg_wait<1>();
            wg_fence_regs<BNM / 2>(acc);
            if (prev >= 0 && lane == 0)
                release(prev);
            prev = slot;
            if (++slot == STAGES) {
                slot = 0;
                phase ^= 1;
            }
        }
        float4 u[NQ / 2];
        if (MODE == MODE_ADD && EPI) {
#pragma unroll
            for (int q = 0; q < NQ / 2; q++)
                u[q] = __ldg(ysrc + (size_t)q * 256);
        }
        wg_wait<0>();
        wg_fence_regs<BNM / 2>(acc);
        if (lane == 0)
            release(prev);

        if (!EPI) {
            /* Keeps the accumulators live (K < 0 never happens). */
            float sum = 0.0f;
#pragma unroll
            for (int q = 0; q < BNM / 2; q++)
                sum += acc[q];
            if (K < 0)
                yf[ct] = sum;
            continue;
        }
        if (MODE == MODE_USER) {
            float4 *dst = (float4 *)yf + (size_t)tile * NQ * 256 + ct;
#pragma unroll
            for (int q = 0; q < NQ; q++)
                dst[(size_t)q * 256] =
                    make_float4(acc[4 * q], acc[4 * q + 1], acc[4 * q + 2], acc[4 * q + 3]);
            continue;
        }
        const int dc = dt * 128 + cw * 64, m0 = mt * BNM;
        if (dc >= D)
            continue; /* a d block narrower than 128: this half is all padding */
#pragma unroll
        for (int r = 0; r < 2; r++) {
            if (MODE == MODE_ADD) {
#pragma unroll
                for (int q = 0; q < NQ / 2; q++) {
                    const int c = 4 * (r * (NQ / 2) + q);
                    acc[c] += u[q].x;
                    acc[c + 1] += u[q].y;
                    acc[c + 2] += u[q].z;
                    acc[c + 3] += u[q].w;
                }
                if (r == 0) {
#pragma unroll
                    for (int q = 0; q < NQ / 2; q++)
                        u[q] = __ldg(ysrc + (size_t)(NQ / 2 + q) * 256);
                }
            }
            /* The staging buffer is free once the last store read it. */
            if (lead)
                bulk_wait_read<0>();
            named_bar_sync(1 + cw, 128);
#pragma unroll
            for (int j = r * (NQ / 2); j < (r + 1) * (NQ / 2); j++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    float p0, p1;
                    col_pair(acc, j, h, g, p0, p1);
                    int ml = 8 * j + 2 * t + (g & 1) - r * HALF;
                    int dl = wq * 16 + (g & ~1) + 8 * h;
                    *(uint32_t *)(stg + ml * 128 + (((dl >> 3) ^ (ml & 7)) << 4) + (dl & 7) * 2) =
                        pack2<T>(p0, p1);
                }
            fence_proxy_async();
            named_bar_sync(1 + cw, 128);
            if (lead) {
                tma_store_3d(&tz, stg, dc, m0 + r * HALF, b);
                bulk_commit();
            }
        }
    }
    if (MODE != MODE_USER && lead)
        bulk_wait<0>();
    /* No CTA of a cluster leaves while its peer may still arrive on its
     * barriers. */
    if (CL > 1)
        cluster_sync();
}

/* ---------------------------------------------------------------- SIMT */

/* Any dtype, any shape: 64 x 64 tile of Z[b], 16-deep K slices in shared
 * memory, 4 x 4 outputs per thread, fp32 accumulate. */
template <typename T, typename OutT, bool ADD>
__global__ void __launch_bounds__(256)
k_lce_simt(const T *__restrict__ w, int ldw, const T *__restrict__ e, int nb, int K, int M, int D,
           const float *__restrict__ y, const int32_t *__restrict__ map, OutT *__restrict__ z)
{
    __shared__ float As[16][64 + 1]; /* [k][m] */
    __shared__ float Bs[16][64 + 1]; /* [k][d] */
    const int mt = (M + 63) / 64, ntl = (D + 63) / 64;
    long bid = blockIdx.x;
    const int tm = (int)(bid % mt);
    bid /= mt;
    const int tn = (int)(bid % ntl);
    const int b = (int)(bid / ntl);
    if (b >= nb)
        return;
    const int m0 = tm * 64, n0 = tn * 64, tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const T *eb = e + (size_t)b * K * D;
    float acc[4][4] = {};
    for (int k0 = 0; k0 < K; k0 += 16) {
        for (int i = tid; i < 16 * 64; i += 256) {
            int mm = i >> 4, kk = i & 15;
            int gm = m0 + mm, gk = k0 + kk;
            As[kk][mm] = gm < M && gk < K ? cu_tof<T>(w[(size_t)gm * ldw + gk]) : 0.0f;
            int dd = i & 63, kb = i >> 6;
            int gn = n0 + dd, gk2 = k0 + kb;
            Bs[kb][dd] = gk2 < K && gn < D ? cu_tof<T>(eb[(size_t)gk2 * D + gn]) : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < 16; kk++) {
            float a[4], bv[4];
#pragma unroll
            for (int i = 0; i < 4; i++) a[i] = As[kk][ty + 16 * i];
#pragma unroll
            for (int j = 0; j < 4; j++) bv[j] = Bs[kk][tx + 16 * j];
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] = fmaf(a[i], bv[j], acc[i][j]);
        }
        __syncthreads();
    }
    const float *yb = ADD ? y + (size_t)map[b] * M * D : nullptr;
    OutT *zb = z + (size_t)b * M * D;
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int gm = m0 + ty + 16 * i, gn = n0 + tx + 16 * j;
            if (gm < M && gn < D) {
                size_t off = (size_t)gm * D + gn;
                float v = acc[i][j] + (ADD ? yb[off] : 0.0f);
                zb[off] = cu_fromf<OutT>(v);
            }
        }
}

/* ---------------------------------------------------------------- host */

static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }


template <typename T, typename OutT, bool ADD, class CFG>
static int launch_tc(bk_stream *s, const T *w, int ldw, const T *e, int nb, int K, int M, int D,
                     const float *y, const int32_t *map, OutT *z, bk_err *err)
{
    auto kern = k_lce_tc<T, OutT, ADD, CFG>;
    if (cu_smem_limit(s, (const void *)kern, (int)CFG::SMEM, err))
        return -1;
    long blocks = (long)((M + CFG::BM - 1) / CFG::BM) * ((D + CFG::BN - 1) / CFG::BN) * nb;
    kern<<<(unsigned)blocks, CFG::THREADS, CFG::SMEM, s->st>>>(w, ldw, e, nb, K, M, D, y, map, z);
    return cu_check_launch(s, err, "lce (tensor cores)");
}

template <typename T, int MODE, int BNM>
static int launch_wg(bk_stream *s, const T *w, int ldw, const T *e, int nb, int K, int M, int D,
                     float *yf, const int32_t *map, T *z, bk_err *err)
{
    /* Variant 8 is a timing diagnostic with wrong results (bench only): no
     * epilogue stores. */
    auto kern = cu_impl(s->be)->lce_variant == 8 ? k_lce_wg<T, MODE, BNM, false>
                                                  : k_lce_wg<T, MODE, BNM, true>;
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

/* Tensor maps of one warp-specialized launch: W [M, ldw] K-major in 64 x
 * BNM / cl boxes (cl = CTAs per cluster sharing the W tile); E [nb, K, D]
 * in 64 d x 64 k boxes; Z [nb, M, D] in 64 d x BNM/2 boxes (all
 * 128B-swizzled). */
template <typename T>
static int lce_tmaps(const T *w, int ldw, const T *e, int nb, int K, int M, int D, const T *z,
                     int bnm, int cl, CUtensorMap *tw, CUtensorMap *te, CUtensorMap *tz,
                     bk_err *err)
{
    CUtensorMapDataType dt = std::is_same<T, __half>::value ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                             : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    const uint64_t es = sizeof(T);
    uint64_t wd[2] = {(uint64_t)ldw, (uint64_t)M}, ws[1] = {ldw * es};
    uint32_t wb[2] = {64, (uint32_t)(bnm / cl)};
    uint64_t ed[3] = {(uint64_t)D, (uint64_t)K, (uint64_t)nb}, est[2] = {D * es, (uint64_t)K * D * es};
    uint32_t eb[3] = {64, 64, 1};
    int rc = cu_tmap_encode(tw, dt, 2, w, wd, ws, wb, CU_TENSOR_MAP_SWIZZLE_128B);
    if (!rc)
        rc = cu_tmap_encode(te, dt, 3, e, ed, est, eb, CU_TENSOR_MAP_SWIZZLE_128B);
    if (!rc && z) {
        uint64_t zd[3] = {(uint64_t)D, (uint64_t)M, (uint64_t)nb},
                 zs[2] = {D * es, (uint64_t)M * D * es};
        uint32_t zb[3] = {64, (uint32_t)(bnm / 2), 1};
        rc = cu_tmap_encode(tz, dt, 3, z, zd, zs, zb, CU_TENSOR_MAP_SWIZZLE_128B);
    }
    if (rc) {
        bk_seterr(err, "lce: encoding a TMA tensor map failed (CUresult %d; %d x %d x %d, K %d)",
                  rc, nb, M, D, K);
        return -1;
    }
    return 0;
}

/* How many clusters of `cl` CTAs of `kern` fit on the device at once (the
 * persistent grid's size), asked once per kernel. */
static int max_clusters(const void *kern, size_t smem, int sms, int cl)
{
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at;
    at.id = cudaLaunchAttributeClusterDimension;
    at.val.clusterDim.x = (unsigned)cl;
    at.val.clusterDim.y = 1;
    at.val.clusterDim.z = 1;
    cfg.gridDim = dim3((unsigned)(sms / cl * cl));
    cfg.blockDim = dim3(384);
    cfg.dynamicSmemBytes = smem;
    cfg.attrs = &at;
    cfg.numAttrs = 1;
    int n = 0;
    if (cudaOccupancyMaxActiveClusters(&n, kern, &cfg) != cudaSuccess || n <= 0) {
        (void)cudaGetLastError();
        n = 0;
    }
    return n;
}

template <typename T, int MODE, int BNM, bool EPI>
static void *ws_kernel(int cl)
{
    return cl == 4   ? (void *)k_lce_ws<T, MODE, BNM, EPI, 4>
           : cl == 2 ? (void *)k_lce_ws<T, MODE, BNM, EPI, 2>
                     : (void *)k_lce_ws<T, MODE, BNM, EPI, 1>;
}

template <typename T, int MODE, int BNM>
static int launch_ws(bk_stream *s, const T *w, int ldw, const T *e, int nb, int K, int M, int D,
                     float *yf, const int32_t *map, T *z, bk_err *err)
{
    const int variant = cu_impl(s->be)->lce_variant, DT = (D + 127) / 128;
    const int MT = (M + BNM - 1) / BNM;
    /* Clusters share operand tiles through TMA multicast: where D has an
     * even number of 128-wide blocks, pairs of d blocks share W (auto, 10,
     * 11): 0.44 -> 0.38 ms at the seed shape on the H200 (bench/RESULTS.md);
     * variant 13 also pairs m tiles (clusters of 4, W and E shared); 9 never.
     * Variant 10 is a timing diagnostic with wrong results (bench only): no
     * epilogue. */
    const int cl = variant == 9         ? 1
                   : DT % 2 != 0         ? 1
                   : variant == 13       ? (MT % 2 == 0 ? 4 : 2)
                                         : 2;
    typedef void (*kern_t)(CUtensorMap, CUtensorMap, CUtensorMap, int, int, int, float *,
                           const int32_t *, int);
    kern_t kern = (kern_t)(variant == 10 ? ws_kernel<T, MODE, BNM, false>(cl)
                                         : ws_kernel<T, MODE, BNM, true>(cl));
    const size_t smem = lcews_cfg<BNM>::SMEM;
    long ntiles = (long)MT * DT * nb;
    if (ntiles >= (1L << 30)) {
        bk_seterr(err, "lce: %d x %d x %d is too large for one launch", nb, M, D);
        return -1;
    }
    CUtensorMap tw, te, tz;
    if (lce_tmaps<T>(w, ldw, e, nb, K, M, D, MODE == MODE_USER ? nullptr : z, BNM, cl > 1 ? 2 : 1,
                     &tw, &te, &tz, err))
        return -1;
    if (MODE == MODE_USER)
        tz = te; /* unused */
    if (cu_smem_limit(s, (const void *)kern, (int)smem, err))
        return -1;
    const int sms = cu_impl(s->be)->sm_count;
    if (cl == 1) {
        unsigned grid = (unsigned)(ntiles < sms ? ntiles : sms);
        kern<<<grid, lcews_cfg<BNM>::THREADS, smem, s->st>>>(tw, te, tz, K, M, D, yf, map,
                                                              (int)ntiles);
        return cu_check_launch(s, err, "lce (wgmma, warp-specialized)");
    }
    static int fit[5]; /* per instantiation and cluster size; benign race, same value */
    if (!fit[cl])
        fit[cl] = max_clusters((const void *)kern, smem, sms, cl);
    if (fit[cl] <= 0) {
        bk_seterr(err, "lce: no cluster of %d %zu-byte CTAs fits on the device", cl, smem);
        return -1;
    }
    long units = ntiles / cl;
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at;
    at.id = cudaLaunchAttributeClusterDimension;
    at.val.clusterDim.x = (unsigned)cl;
    at.val.clusterDim.y = 1;
    at.val.clusterDim.z = 1;
    cfg.gridDim = dim3((unsigned)(cl * (units < fit[cl] ? units : fit[cl])));
    cfg.blockDim = dim3(lcews_cfg<BNM>::THREADS);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s->st;
    cfg.attrs = &at;
    cfg.numAttrs = 1;
    CU_TRY(cudaLaunchKernelEx(&cfg, kern, tw, te, tz, K, M, D, yf, map, (int)units),
           "lce (wgmma, warp-specialized, clusters)");
    return cu_check_launch(s, err, "lce (wgmma, warp-specialized, clusters)");
}

/* Both GEMMs on wgmma: the user term in fragment order (see k_lce_wg). */
template <typename T, int BNM>
static int lce_wg(bk_stream *s, const T *eu, int nu, const T *ec, int nc, const int32_t *map,
                  const bk_weight *w_user, const bk_weight *w_cand, int ku, int kc, int m, int d,
                  T *z, bk_err *err)
{
    const T *wu = (const T *)w_user->data, *wc = (const T *)w_cand->data;
    const int variant = cu_impl(s->be)->lce_variant;
    /* The warp-specialized kernel (auto, 9, 10) or the older one (6, 7, 8). */
    const bool ws = variant == 0 || variant >= 9;
    auto launch = [&](auto mode, const T *w, int ldw, const T *e, int nb, int K, float *yf,
                      const int32_t *mp, T *zz) {
        constexpr int MODE = decltype(mode)::value;
        /* K = 0 has no tensor to map: the older kernel (same fragment order
         * of the user term) writes the user term or zeros. */
        return ws && K > 0 ? launch_ws<T, MODE, BNM>(s, w, ldw, e, nb, K, m, d, yf, mp, zz, err)
                  : launch_wg<T, MODE, BNM>(s, w, ldw, e, nb, K, m, d, yf, mp, zz, err);
    };
    typedef std::integral_constant<int, MODE_USER> user_t;
    typedef std::integral_constant<int, MODE_ADD> add_t;
    typedef std::integral_constant<int, MODE_PLAIN> plain_t;
    if (ku > 0 && variant != 7) {
        size_t tiles = (size_t)((m + BNM - 1) / BNM) * ((d + 127) / 128) * nu;
        if (cu_scratch_get(s, &s->lce_y, tiles * 256 * (BNM / 2) * sizeof(float), err))
            return -1;
        float *yf = (float *)s->lce_y.p;
        if (launch(user_t(), wu, w_user->ld, eu, nu, ku, yf, nullptr, nullptr))
            return -1;
        return launch(add_t(), wc, w_cand->ld, ec, nc, kc, yf, map, z);
    }
    /* No user tokens (or variant 7, a diagnostic that skips the user term). */
    return launch(plain_t(), wc, w_cand->ld, ec, nc, kc, nullptr, nullptr, z);
}

/* One batched GEMM on mma.sync or SIMT: Z[b] = W @ E[b] (+ Y[map[b]]),
 * Y dense fp32 [*, M, D]. */
template <typename T, typename OutT, bool ADD>
static int lce_gemm(bk_stream *s, const bk_weight *wt, const T *e, int nb, int K, int M, int D,
                    const float *y, const int32_t *map, OutT *z, bk_err *err)
{
    const T *w = (const T *)wt->data;
    int variant = cu_impl(s->be)->lce_variant;
    long blocks_max = (long)((M + 63) / 64) * ((D + 63) / 64) * nb;
    if (blocks_max >= (1L << 31)) {
        bk_seterr(err, "lce: %d x %d x %d is too large for one launch", nb, M, D);
        return -1;
    }
    bool tc = sizeof(T) == 2 && variant != 1 && D % 8 == 0 && aligned16(e) && aligned16(w) &&
              ((uintptr_t)z & 7) == 0;
    if constexpr (sizeof(T) == 2) {
        if (tc) {
            if (variant == 4)
                return launch_tc<T, OutT, ADD, cfg_m>(s, w, wt->ld, e, nb, K, M, D, y, map, z, err);
            if (variant == 5 || (variant != 3 && D <= 128))
                return launch_tc<T, OutT, ADD, cfg_s>(s, w, wt->ld, e, nb, K, M, D, y, map, z, err);
            return launch_tc<T, OutT, ADD, cfg_l>(s, w, wt->ld, e, nb, K, M, D, y, map, z, err);
        }
    }
    k_lce_simt<T, OutT, ADD><<<(unsigned)blocks_max, 256, 0, s->st>>>(w, wt->ld, e, nb, K, M, D, y,
                                                                      map, z);
    return cu_check_launch(s, err, "lce (SIMT)");
}

/* Variants (IKBO_CUDA_LCE): 0 automatic (warp-specialized wgmma where M and
 * D are large enough, with W shared by 2-CTA clusters where D has an even
 * number of 128-wide blocks; else mma.sync), 1 SIMT, 2 mma.sync (automatic
 * tile), 3/4/5 mma.sync 112x256 / 128x128 / 64x128, 6 the older wgmma kernel
 * (k_lce_wg) wherever it applies, 9 the warp-specialized one without
 * clusters wherever it applies, 11 the same with clusters, 13 with
 * clusters of 4 where M also has an even number of tiles; 7, 8 and 10 are bench-only timing diagnostics with wrong results
 * (k_lce_wg without the user term / without the epilogue; k_lce_ws without
 * the epilogue). */
template <typename T>
static int lce_t(bk_stream *s, const void *eu, int nu, const void *ec, int nc, const int32_t *map,
                 const bk_weight *w_user, const bk_weight *w_cand, int ku, int kc, int m, int d,
                 void *z, bk_err *err)
{
    if constexpr (sizeof(T) == 2) {
        int variant = cu_impl(s->be)->lce_variant;
        bool ok = d % 8 == 0 && aligned16(eu) && aligned16(ec) && aligned16(z) &&
                  aligned16(w_user->data) && aligned16(w_cand->data);
        if (ok && (variant >= 6 || (variant == 0 && m >= 64 && d >= 64))) {
            const T *eut = (const T *)eu, *ect = (const T *)ec;
            if (m > 128)
                return lce_wg<T, 224>(s, eut, nu, ect, nc, map, w_user, w_cand, ku, kc, m, d,
                                      (T *)z, err);
            if (m > 64)
                return lce_wg<T, 128>(s, eut, nu, ect, nc, map, w_user, w_cand, ku, kc, m, d,
                                      (T *)z, err);
            return lce_wg<T, 64>(s, eut, nu, ect, nc, map, w_user, w_cand, ku, kc, m, d, (T *)z,
                                 err);
        }
    }
    if (ku > 0) {
        /* The user term once per user, fp32, at U rows. */
        size_t bytes = (size_t)nu * m * d * sizeof(float);
        if (cu_scratch_get(s, &s->lce_y, bytes, err))
            return -1;
        float *y = (float *)s->lce_y.p;
        if (lce_gemm<T, float, false>(s, w_user, (const T *)eu, nu, ku, m, d, nullptr, nullptr, y,
                                      err))
            return -1;
        return lce_gemm<T, T, true>(s, w_cand, (const T *)ec, nc, kc, m, d, y, map, (T *)z, err);
    }
    return lce_gemm<T, T, false>(s, w_cand, (const T *)ec, nc, kc, m, d, nullptr, nullptr, (T *)z,
                                 err);
}

int cuda_lce(bk_stream *s, const void *eu, int nu, const void *ec, int nc, const int32_t *map,
             const bk_weight *w_user, const bk_weight *w_cand, int ku, int kc, int m, int d,
             void *z, bk_err *err)
{
    cu_prof_scope prof_(s, "lce");
    if (nc <= 0 || m <= 0 || d <= 0)
        return 0;
    if (ku < 0 || kc < 0 || w_user->rows != m || w_user->cols != ku || w_cand->rows != m ||
        w_cand->cols != kc) {
        bk_seterr(err, "lce: weights [%d, %d] and [%d, %d] do not match M %d, Ku %d, Kc %d",
                  w_user->rows, w_user->cols, w_cand->rows, w_cand->cols, m, ku, kc);
        return -1;
    }
    if (ku > 0 && nu <= 0) {
        bk_seterr(err, "lce: %d candidates but no users", nc);
        return -1;
    }
    if (cu_enter(s, err))
        return -1;
    int rc = 0;
    CU_DISPATCH(cu_dt(s), rc = lce_t<T>(s, eu, nu, ec, nc, map, w_user, w_cand, ku, kc, m, d, z,
                                        err));
    return rc;
}
