/* lce_kern.cuh - the LCE kernel templates that production and the kernel
 * benchmark both instantiate.
 *
 * Why this exists: lce.cu serves LCE with the warp-specialized wgmma kernel
 * (k_lce_ws) where it applies; the variants of it that lost or that are
 * timing diagnostics (no clusters, clusters of 4, no epilogue) differ only
 * in template parameters, and bench/kernels/lce_v9.cu, lce_v10.cu and
 * lce_v13.cu instantiate them from here, so no kernel body is written
 * twice and the serving library carries only the instantiations it uses.
 * The older wgmma kernel (bench/kernels/lce_v6.cu) reuses the fragment-order
 * user term and lce_frag. Include after cuda_internal.h; every function is
 * a template or static, so each including file gets its own copy.
 *
 * The user term never takes the [M, D] layout: the user GEMM (MODE_USER)
 * writes each tile's fp32 accumulators as they sit in registers ("fragment
 * order": the four values of chunk q of thread x at [(tile * BNM/8 + q) *
 * 256 + x], stored as yterm<YT> says), and the candidate GEMM (MODE_ADD)
 * adds the same tile of its user, Yf[map[b]] - coalesced loads, no index
 * math, one fp32 sum per output. Both launches must use the same BNM. MODE_PLAIN: no user term.
 */
#ifndef IKBO_LCE_KERN_CUH
#define IKBO_LCE_KERN_CUH

#include <type_traits>

#include "kernels/cuda/cuda_internal.h"
#include "kernels/cuda/mma_util.cuh"
#include "kernels/cuda/tma_util.cuh"
#include "kernels/cuda/wgmma_gen.cuh"

/* Whether k_lce_ws takes an LCE of this dtype and shape (alignment aside):
 * bf16/fp16, M and D at least one wgmma tile (M is wgmma's N, 64 d rows
 * per warpgroup), D % 8 == 0, and candidate tokens (Kc = 0 has no E for
 * TMA to map). Production's choice (lce.cu lce_use_ws) and the bench
 * variants of k_lce_ws both ask this. */
static inline bool lce_ws_shape(enum cu_dtype dt, int kc, int m, int d)
{
    return dt != CU_F32 && m >= 64 && d >= 64 && d % 8 == 0 && kc > 0;
}

enum { MODE_USER = 0, MODE_ADD = 1, MODE_PLAIN = 2 };
/* k_lce_ws's epilogue: none (bench lce_v10's timing diagnostic, wrong
 * results), the accumulators staged by lane shuffles and 4-byte shared
 * stores (bench lce_v15), or by stmatrix.trans (production). */
enum { EPI_NONE = 0, EPI_SHFL = 1, EPI_STM = 2 };

/* Epilogue helper of the wgmma kernels. In an m64nN fp32 accumulator
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

/* ------------------------------------------- wgmma, warp-specialized */

/* The transposed product Z[b]^T = E[b]^T W^T, so that the awkward M (433)
 * is wgmma's N (any multiple of 8 up to 256: 2 x 224 covers 433 with 3%
 * padding) and D is the warpgroups' 64-row dimension, arranged so that the
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
 *   order, loaded under the last MMAs) are rounded, staged half a tile at a
 *   time in a 128B-swizzled buffer of the warpgroup's own, and written with
 *   one TMA tensor store per half (rows past M clipped by TMA); meanwhile the
 *   producer is already filling the ring with the next tile's slices.
 *   (A fifth ring stage in place of the staging buffers, with stores from
 *   registers, measured slower: bench/kernels/NOTES.md.)
 * Persistent CTAs walk tiles blockIdx.x, + gridDim.x, ...; tile order
 * (m tile fastest, then d block, then batch item) keeps W and the current
 * candidates' E in L2. */
/* The user term's storage, four values per thread per 16-byte chunk q of
 * the fragment order: the activation dtype (YT = T, production: half the
 * bytes of fp32 through L2, for one more rounding, of the user term before
 * the fp32 sum) or fp32 (YT = float: bench lce_v14, production until
 * 2026-12-04, 8% slower). */
template <typename YT> struct yterm {
    typedef uint2 raw;
    static __device__ __forceinline__ raw load(const YT *y, size_t i)
    {
        return __ldg((const uint2 *)y + i);
    }
    static __device__ __forceinline__ float4 val(raw r)
    {
        float2 a = unpack2<YT>(r.x), b = unpack2<YT>(r.y);
        return make_float4(a.x, a.y, b.x, b.y);
    }
    static __device__ __forceinline__ void store(YT *y, size_t i, const float *a)
    {
        ((uint2 *)y)[i] = make_uint2(pack2<YT>(a[0], a[1]), pack2<YT>(a[2], a[3]));
    }
};
template <> struct yterm<float> {
    typedef float4 raw;
    static __device__ __forceinline__ raw load(const float *y, size_t i)
    {
        return __ldg((const float4 *)y + i);
    }
    static __device__ __forceinline__ float4 val(raw r) { return r; }
    static __device__ __forceinline__ void store(float *y, size_t i, const float *a)
    {
        ((float4 *)y)[i] = make_float4(a[0], a[1], a[2], a[3]);
    }
};

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

/* EPI: the epilogue (EPI_NONE, EPI_SHFL, EPI_STM above). CL: CTAs per
 * cluster (1, 2; 4 only from bench/kernels/lce_v13.cu). */
template <typename T, int MODE, int BNM, int EPI, int CL, typename YT>
__global__ void __launch_bounds__(384, 1)
k_lce_ws(const __grid_constant__ CUtensorMap tw, const __grid_constant__ CUtensorMap te,
         const __grid_constant__ CUtensorMap tz, int K, int M, int D, YT *__restrict__ yf,
         const int32_t *__restrict__ map, int ntiles)
{
    typedef yterm<YT> YV;
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
    /* The user GEMM lets the candidate GEMM (its programmatic dependent,
     * launch_ws) start at once: that one needs the user term only in its
     * epilogue. */
    if (MODE == MODE_USER)
        pdl_trigger();

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
        const size_t ysrc =
            MODE == MODE_ADD ? (size_t)((map[b] * DT + dt) * MT + mt) * NQ * 256 + ct : 0;
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
        typename YV::raw u[NQ / 2];
        if (MODE == MODE_ADD && EPI != EPI_NONE) {
            if (i == 0)
                pdl_wait(); /* the user GEMM's tiles are written */
#pragma unroll
            for (int q = 0; q < NQ / 2; q++)
                u[q] = YV::load(yf, ysrc + (size_t)q * 256);
        }
        wg_wait<0>();
        wg_fence_regs<BNM / 2>(acc);
        if (lane == 0)
            release(prev);

        if (EPI == EPI_NONE) {
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
            const size_t dst = (size_t)tile * NQ * 256 + ct;
#pragma unroll
            for (int q = 0; q < NQ; q++)
                YV::store(yf, dst + (size_t)q * 256, acc + 4 * q);
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
                    const float4 uv = YV::val(u[q]);
                    acc[c] += uv.x;
                    acc[c + 1] += uv.y;
                    acc[c + 2] += uv.z;
                    acc[c + 3] += uv.w;
                }
                if (r == 0) {
#pragma unroll
                    for (int q = 0; q < NQ / 2; q++)
                        u[q] = YV::load(yf, ysrc + (size_t)(NQ / 2 + q) * 256);
                }
            }
            /* The staging buffer is free once the last store read it. */
            if (lead)
                bulk_wait_read<0>();
            named_bar_sync(1 + cw, 128);
            if constexpr (EPI == EPI_STM) {
                /* Matrix (j, h): d rows 16 wq + 8h .. + 7 of m columns 8j ..
                 * 8j + 7; transposed, each m row gets 16 bytes of d. */
#pragma unroll
                for (int j = r * (NQ / 2); j < (r + 1) * (NQ / 2); j += 2) {
                    uint32_t p[4];
#pragma unroll
                    for (int k = 0; k < 4; k++) {
                        const int jj = j + (k >> 1), h = k & 1;
                        p[k] = pack2<T>(acc[4 * jj + 2 * h], acc[4 * jj + 2 * h + 1]);
                    }
                    const int k = lane >> 3, ml = 8 * (j + (k >> 1)) + (lane & 7) - r * HALF;
                    stmatrix_x4_trans(stg + ml * 128 + (((2 * wq + (k & 1)) ^ (ml & 7)) << 4), p);
                }
            } else {
#pragma unroll
                for (int j = r * (NQ / 2); j < (r + 1) * (NQ / 2); j++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        float p0, p1;
                        col_pair(acc, j, h, g, p0, p1);
                        int ml = 8 * j + 2 * t + (g & 1) - r * HALF;
                        int dl = wq * 16 + (g & ~1) + 8 * h;
                        *(uint32_t *)(stg + ml * 128 + (((dl >> 3) ^ (ml & 7)) << 4) +
                                      (dl & 7) * 2) = pack2<T>(p0, p1);
                    }
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

/* Tensor maps of one warp-specialized launch: W [M, ldw] K-major in 64 x
 * BNM / cl boxes (cl = CTAs per cluster sharing the W tile); E [nb, K, D]
 * in 64 d x 64 k boxes; Z [nb, M, D] in 64 d x BNM/2 boxes (all
 * 128B-swizzled). */
template <typename T>
static int lce_tmaps(const T *w, int ldw, const T *e, int nb, int K, int M, int D, const T *z,
                     int bnm, int cl, CUtensorMap *tw, CUtensorMap *te, CUtensorMap *tz,
                     bk_err *err)
{
    const CUtensorMapDataType dt = cu_tmap_dtype<T>();
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

/* The instantiation of k_lce_ws for cl CTAs per cluster (cl <= CLMAX). */
template <typename T, int MODE, int BNM, int EPI, int CLMAX, typename YT>
static void *ws_kernel(int cl)
{
    if constexpr (CLMAX >= 4)
        if (cl == 4)
            return (void *)k_lce_ws<T, MODE, BNM, EPI, 4, YT>;
    if constexpr (CLMAX >= 2)
        if (cl == 2)
            return (void *)k_lce_ws<T, MODE, BNM, EPI, 2, YT>;
    return (void *)k_lce_ws<T, MODE, BNM, EPI, 1, YT>;
}

/* One k_lce_ws launch (K > 0: a K of 0 has no tensor to map). Clusters
 * share operand tiles through TMA multicast. CLMAX = 2 (production): where
 * D has an even number of 128-wide blocks, pairs of d blocks share W, 0.44
 * -> 0.38 ms at the seed shape on the H200 (bench/RESULTS.md), else no
 * cluster. CLMAX = 4 (bench lce_v13) also pairs m tiles where M has an even
 * number of them (W and E shared); CLMAX = 1 (bench lce_v9) never clusters.
 * EPI: the epilogue (EPI_NONE: bench lce_v10's diagnostic). */
template <typename T, int MODE, int BNM, int EPI = EPI_STM, int CLMAX = 2, typename YT = T>
static int launch_ws(bk_stream *s, const T *w, int ldw, const T *e, int nb, int K, int M, int D,
                     YT *yf, const int32_t *map, T *z, bk_err *err)
{
    const int DT = (D + 127) / 128, MT = (M + BNM - 1) / BNM;
    const int cl = CLMAX == 1 || DT % 2 != 0 ? 1 : CLMAX == 4 && MT % 2 == 0 ? 4 : 2;
    typedef void (*kern_t)(CUtensorMap, CUtensorMap, CUtensorMap, int, int, int, YT *,
                           const int32_t *, int);
    kern_t kern = (kern_t)ws_kernel<T, MODE, BNM, EPI, CLMAX, YT>(cl);
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
    /* The candidate GEMM after a user GEMM is its programmatic dependent:
     * its mainloop runs on the SMs the (usually small) user GEMM leaves
     * free, and it waits for the user term before its first epilogue. */
    const bool pdl = MODE == MODE_ADD;
    long grid = ntiles < sms ? ntiles : sms, units = ntiles;
    if (cl > 1) {
        static int fit[5]; /* per instantiation and cluster size; benign race, same value */
        if (!fit[cl])
            fit[cl] = max_clusters((const void *)kern, lcews_cfg<BNM>::THREADS, smem, sms, cl);
        if (fit[cl] <= 0) {
            bk_seterr(err, "lce: no cluster of %d %zu-byte CTAs fits on the device", cl, smem);
            return -1;
        }
        units = ntiles / cl;
        grid = cl * (units < fit[cl] ? units : fit[cl]);
    }
    cudaLaunchAttribute at[2];
    cudaLaunchConfig_t cfg = cluster_cfg(at, cl, (unsigned)grid, lcews_cfg<BNM>::THREADS, smem,
                                         s->st, pdl);
    const char *what = cl > 1 ? "lce (wgmma, warp-specialized, clusters)"
                              : "lce (wgmma, warp-specialized)";
    CU_TRY(cudaLaunchKernelEx(&cfg, kern, tw, te, tz, K, M, D, yf, map, (int)units), what);
    return cu_check_launch(s, err, what);
}

/* Both GEMMs of one LCE on a fragment-order kernel: the user term at U rows
 * (MODE_USER, stream scratch in YT), then the candidate GEMM adding it
 * (MODE_ADD); without user tokens the candidate GEMM alone (MODE_PLAIN).
 * launch(mode, w, ldw, e, nb, K, yf, map, z) issues one GEMM (mode an
 * std::integral_constant): production's launch_ws, or a bench variant. */
template <typename T, int BNM, typename YT = float, class Launch>
static int lce_frag(bk_stream *s, const T *eu, int nu, const T *ec, int nc, const int32_t *map,
                    const bk_weight *w_user, const bk_weight *w_cand, int ku, int kc, int m, int d,
                    T *z, Launch launch, bk_err *err)
{
    typedef std::integral_constant<int, MODE_USER> user_t;
    typedef std::integral_constant<int, MODE_ADD> add_t;
    typedef std::integral_constant<int, MODE_PLAIN> plain_t;
    const T *wu = (const T *)w_user->data, *wc = (const T *)w_cand->data;
    if (ku > 0) {
        size_t tiles = (size_t)((m + BNM - 1) / BNM) * ((d + 127) / 128) * nu;
        if (cu_scratch_get(s, &s->lce_y, tiles * 256 * (BNM / 2) * sizeof(YT), err))
            return -1;
        YT *yf = (YT *)s->lce_y.p;
        if (launch(user_t(), wu, w_user->ld, eu, nu, ku, yf, nullptr, nullptr))
            return -1;
        return launch(add_t(), wc, w_cand->ld, ec, nc, kc, yf, map, z);
    }
    return launch(plain_t(), wc, w_cand->ld, ec, nc, kc, (YT *)nullptr, nullptr, z);
}

/* Calls f(std::integral_constant<int, BNM>()) with the wgmma N tile (M
 * columns of the transposed product) that covers m with the least padding:
 * 224 (M = 433 in two tiles), 128 or 64. */
template <class F> static int lce_bnm(int m, F f)
{
    if (m > 128)
        return f(std::integral_constant<int, 224>());
    if (m > 64)
        return f(std::integral_constant<int, 128>());
    return f(std::integral_constant<int, 64>());
}

/* A whole LCE call on k_lce_ws (bf16/fp16; the caller checked that it
 * applies: lce.cu's lce_use_ws). Production: EPI_STM, CLMAX = 2, YT = T; the bench
 * variants lce_v9, v10, v13, v14, v15 change one parameter each. */
template <typename T, int EPI = EPI_STM, int CLMAX = 2, typename YT = T>
static int lce_ws_run(bk_stream *s, const void *eu, int nu, const void *ec, int nc,
                      const int32_t *map, const bk_weight *w_user, const bk_weight *w_cand, int ku,
                      int kc, int m, int d, void *z, bk_err *err)
{
    return lce_bnm(m, [&](auto bnm) {
        constexpr int BNM = decltype(bnm)::value;
        auto launch = [&](auto mode, const T *w, int ldw, const T *e, int nb, int K, YT *yf,
                          const int32_t *mp, T *zz) {
            return launch_ws<T, decltype(mode)::value, BNM, EPI, CLMAX, YT>(
                s, w, ldw, e, nb, K, m, d, yf, mp, zz, err);
        };
        return lce_frag<T, BNM, YT>(s, (const T *)eu, nu, (const T *)ec, nc, map, w_user, w_cand,
                                    ku, kc, m, d, (T *)z, launch, err);
    });
}

#endif
