/* lce.cu - IKBO linear compression embedding on the GPU.
 *
 *   Z[c] = W_user @ Eu[map[c]] + W_cand @ Ec[c]
 *   Eu [U, Ku, D], Ec [C, Kc, D], W_user [M, Ku], W_cand [M, Kc], Z [C, M, D]
 *
 * Why this exists: the broadcast formulation copies every user's [Ku, D]
 * block to each of its candidates and runs one GEMM over K = Ku + Kc. The
 * user term only depends on the user, so it is computed once per user
 * (stream scratch at U rows), and the candidate GEMM adds it to its
 * accumulators through map[c]: no [C, Ku, D] copy and no [C, M, D] user-term
 * buffer ever exist. Both GEMMs are the same batched kernel (one W for the
 * whole batch, one E block per batch item).
 *
 * Kernels (which one serves a call: the table above lce_use_ws, the one
 * place it is chosen, from the shape, dtype and alignment alone):
 * - warp-specialized wgmma (Hopper), k_lce_ws in lce_kern.cuh: a TMA
 *   producer thread and two consumer warpgroups, W shared by 2-CTA clusters
 *   where D has an even number of 128-wide blocks; the user term is kept in
 *   the accumulator fragment order, stored in the activation dtype.
 * - mma.sync m16n8k16 (k_lce_tc): 4-stage cp.async pipeline, padded shared
 *   rows for conflict-free ldmatrix; user term dense [U, M, D] fp32, added
 *   in the epilogue.
 * - SIMT (k_lce_simt): 64 x 64 tiles, fp32 FMA.
 * The variants that lost or are timing diagnostics (the older wgmma kernel,
 * k_lce_ws without clusters, with clusters of 4, without epilogue) live in
 * bench/kernels/lce_v*.cu, timed by bench_kernels beside these.
 *
 * Numerics: user and candidate partial sums are each accumulated in fp32 and
 * added in fp32 before the rounding of Z to the activation dtype. k_lce_ws
 * stores the user term in the activation dtype (one more rounding, of the
 * user part alone: bf16 Z moved by 2.3e-3 relative, fp16 by 2.8e-4, for
 * 8% less time, bench/RESULTS.md 2026-12-04); the other kernels keep it
 * in fp32.
 */
#include "kernels/cuda/lce_kern.cuh"

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
/* 64 x 128, for narrow D. */
typedef lce_cfg<2, 4, 2, 4, 2> cfg_s;

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

/* ------------------------------------------------------- kernel choice */

/* Which kernel serves an LCE call, the one place it is chosen:
 *
 *   dtype      when                                        kernel
 *   bf16/fp16  M >= 64, D >= 64, D % 8 == 0, Kc > 0;       k_lce_ws for both GEMMs
 *              Eu, Ec, W_user, W_cand, Z 16-byte aligned   (lce_kern.cuh; 2-CTA
 *                                                          clusters where D/128 is even)
 *   bf16/fp16  otherwise, per GEMM: D % 8 == 0, E and W    k_lce_tc (mma.sync): 64 x 128
 *              16-byte aligned, the output 8-byte aligned  tiles for D <= 128, 112 x 256
 *                                                          above
 *   any        otherwise (fp32, D % 8 != 0, unaligned)     k_lce_simt
 *
 * M or D below 64 would leave most of a wgmma tile idle (64 d rows per
 * warpgroup, M is wgmma's N). Kc = 0 (Z is the user term alone) has no E
 * for TMA to map, so it takes mma.sync. A test or benchmark may force a
 * fallback on one backend (bk_cuda_force_path, cuda_paths.h); nothing on
 * the serving path does, and no environment variable does.
 */
static bool lce_use_ws(bk_stream *s, const void *eu, const void *ec, const bk_weight *w_user,
                       const bk_weight *w_cand, int kc, int m, int d, const void *z)
{
    return cu_impl(s->be)->force_lce == CU_PATH_AUTO && lce_ws_shape(cu_dt(s), kc, m, d) &&
           aligned16(eu) && aligned16(ec) && aligned16(z) && aligned16(w_user->data) &&
           aligned16(w_cand->data);
}

static bool lce_use_mma(bk_stream *s, const void *e, const void *w, int d, const void *out)
{
    return cu_dt(s) != CU_F32 && cu_impl(s->be)->force_lce != CU_PATH_SIMT && d % 8 == 0 &&
           aligned16(e) && aligned16(w) && ((uintptr_t)out & 7) == 0;
}

/* One batched GEMM on mma.sync or SIMT: Z[b] = W @ E[b] (+ Y[map[b]]),
 * Y dense fp32 [*, M, D]. */
template <typename T, typename OutT, bool ADD>
static int lce_gemm(bk_stream *s, const bk_weight *wt, const T *e, int nb, int K, int M, int D,
                    const float *y, const int32_t *map, OutT *z, bk_err *err)
{
    const T *w = (const T *)wt->data;
    long blocks_max = (long)((M + 63) / 64) * ((D + 63) / 64) * nb;
    if (blocks_max >= (1L << 31)) {
        bk_seterr(err, "lce: %d x %d x %d is too large for one launch", nb, M, D);
        return -1;
    }
    if constexpr (sizeof(T) == 2) {
        if (lce_use_mma(s, e, w, D, z)) {
            if (D <= 128)
                return launch_tc<T, OutT, ADD, cfg_s>(s, w, wt->ld, e, nb, K, M, D, y, map, z, err);
            return launch_tc<T, OutT, ADD, cfg_l>(s, w, wt->ld, e, nb, K, M, D, y, map, z, err);
        }
    }
    k_lce_simt<T, OutT, ADD><<<(unsigned)blocks_max, 256, 0, s->st>>>(w, wt->ld, e, nb, K, M, D, y,
                                                                      map, z);
    return cu_check_launch(s, err, "lce (SIMT)");
}

template <typename T>
static int lce_t(bk_stream *s, const void *eu, int nu, const void *ec, int nc, const int32_t *map,
                 const bk_weight *w_user, const bk_weight *w_cand, int ku, int kc, int m, int d,
                 void *z, bk_err *err)
{
    if constexpr (sizeof(T) == 2) {
        if (lce_use_ws(s, eu, ec, w_user, w_cand, kc, m, d, z))
            return lce_ws_run<T>(s, eu, nu, ec, nc, map, w_user, w_cand, ku, kc, m, d, z, err);
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
    if (prof_.on()) {
        /* The user GEMM U x Ku and the candidate GEMM C x Kc into [C, M, D];
         * E_user, E_cand, both W, Z and the map once (the user term's
         * round trip is this implementation's, not compulsory). */
        const double es = (double)s->be->act_size, uk = ku > 0 ? (double)nu * ku : 0;
        prof_.work(2.0 * m * d * (uk + (double)nc * kc),
                   ((uk + (double)nc * kc) * d + (double)m * (ku + kc) + (double)nc * m * d) * es +
                       (ku > 0 ? nc * (double)sizeof *map : 0));
    }
    if (cu_enter(s, err))
        return -1;
    int rc = 0;
    CU_DISPATCH(cu_dt(s), rc = lce_t<T>(s, eu, nu, ec, nc, map, w_user, w_cand, ku, kc, m, d, z,
                                        err));
    return rc;
}
