/* attention.cu - IKBO target attention on the GPU.
 *
 * For candidate c, query row i, head h (u = map[c], keys = u's events):
 *   o[c*tq+i, h] = softmax_j(q[c*tq+i, h] . k_j[h] / sqrt(dh)) v_j[h]
 *
 * Why this exists: the broadcast formulation copies each user's K/V to every
 * candidate and runs attention per candidate, moving the history once per
 * candidate. Here candidates are grouped by user (map is non-decreasing), so
 * the query rows of one user's candidates are one contiguous block of rows:
 * IKBO attention is varlen attention whose query sequence is all of a user's
 * candidates. A tile of 128 query rows holds 2 candidates at tq = 64 or 32 at
 * tq = 4; tiles never straddle users, and each K/V block a tile loads into
 * shared memory serves every candidate in it.
 *
 * Kernels
 * - tile table (one small block): per-user candidate runs -> tiles of at
 *   most 128 query rows {row0, row_end, user}; runs on the device because
 *   map lives there.
 * - wgmma flash kernel (Hopper, bf16/fp16, dh 64/128): see k_att_wg.
 * - mma.sync flash kernel (bf16/fp16, dh 32/64/96/128 templated): 8 warps
 *   of 16 query rows, keys in blocks of 64, double-buffered cp.async K/V,
 *   online softmax in fp32 (base 2), P kept in registers as the A operand
 *   of P V; no [rows, L] scores in memory; keys past L_u masked.
 * - SIMT kernel (fp32 mode, other head sizes, unaligned operands): one warp
 *   per (query row, head), same online softmax.
 * A user with no events gives zeros.
 */
#include <math.h>

#include "kernels/cuda/cuda_internal.h"
#include "kernels/cuda/mma_util.cuh"
#include "kernels/cuda/wgmma_gen.cuh"

#define ATT_BM 128 /* query rows per tile */
#define ATT_BN 64  /* keys per block      */

/* ------------------------------------------------------------ tile table */

/* One block. A run is a maximal range of candidates with one user; each run
 * gives ceil(run_rows / bm) tiles. Runs are found where map changes, their
 * ends by binary search (map is sorted), and tile slots by a block scan. */
__global__ void __launch_bounds__(1024)
k_att_tiles(const int32_t *__restrict__ map, int nc, int tq, int bm, int4 *__restrict__ tiles,
            int *__restrict__ ntiles, int cap)
{
    __shared__ int warp_sum[32];
    __shared__ int carry_s;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = blockDim.x >> 5;
    if (tid == 0)
        carry_s = 0;
    __syncthreads();
    for (int base = 0; base < nc; base += blockDim.x) {
        int c = base + tid, cnt = 0, end = 0, u = 0;
        if (c < nc) {
            u = map[c];
            if (c == 0 || map[c - 1] != u) {
                int lo = c + 1, hi = nc; /* first index with map > u */
                while (lo < hi) {
                    int mid = (lo + hi) >> 1;
                    if (map[mid] > u)
                        hi = mid;
                    else
                        lo = mid + 1;
                }
                end = lo;
                long rows = (long)(end - c) * tq;
                cnt = (int)((rows + bm - 1) / bm);
            }
        }
        int v = cnt;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            int n = __shfl_up_sync(0xffffffffu, v, o);
            if (lane >= o)
                v += n;
        }
        if (lane == 31)
            warp_sum[warp] = v;
        __syncthreads();
        if (warp == 0) {
            int s = lane < nwarps ? warp_sum[lane] : 0;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                int n = __shfl_up_sync(0xffffffffu, s, o);
                if (lane >= o)
                    s += n;
            }
            warp_sum[lane] = s;
        }
        __syncthreads();
        int first = carry_s + (warp ? warp_sum[warp - 1] : 0) + v - cnt;
        int row_end = end * tq;
        for (int i = 0; i < cnt && first + i < cap; i++) {
            int r0 = c * tq + i * bm;
            tiles[first + i] = make_int4(r0, min(r0 + bm, row_end), u, 0);
        }
        __syncthreads();
        if (tid == 0)
            carry_s += warp_sum[nwarps - 1];
        __syncthreads();
    }
    if (tid == 0)
        *ntiles = carry_s < cap ? carry_s : cap;
}

/* ------------------------------------------------------ tensor-core flash */

template <int DH> struct att_cfg {
    static constexpr int LD = DH + 8; /* padded rows: ldmatrix conflict-free */
    static constexpr size_t SMEM = (size_t)(ATT_BM + 4 * ATT_BN) * LD * 2;
};

template <typename T, int DH>
__global__ void __launch_bounds__(256, 1)
k_att_tc(const T *__restrict__ q, const T *__restrict__ k, const T *__restrict__ v,
         const int64_t *__restrict__ off, const int4 *__restrict__ tiles,
         const int *__restrict__ ntiles, int hd, float scale_log2, T *__restrict__ o)
{
    constexpr int BM = ATT_BM, BN = ATT_BN, LD = att_cfg<DH>::LD, NT = 256, CH = DH / 8;
    if ((int)blockIdx.x >= *ntiles)
        return;
    const int4 ti = tiles[blockIdx.x];
    const int row0 = ti.x, row_end = ti.y, u = ti.z, h = blockIdx.y;
    const int64_t kv0 = off[u];
    const int L = (int)(off[u + 1] - kv0);

    extern __shared__ __align__(16) unsigned char smem_raw[];
    T *Qs = (T *)smem_raw;
    T *Ks = Qs + BM * LD;
    T *Vs = Ks + 2 * BN * LD;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

    for (int i = tid; i < BM * CH; i += NT) {
        int r = i / CH, c = i % CH, row = row0 + r;
        bool ok = row < row_end;
        const T *src = ok ? q + (size_t)row * hd + h * DH + c * 8 : q;
        cp_async16(Qs + r * LD + c * 8, src, ok);
    }
    auto load_kv = [&](int buf, int kb) {
        T *kd = Ks + buf * BN * LD, *vd = Vs + buf * BN * LD;
        for (int i = tid; i < BN * CH; i += NT) {
            int r = i / CH, c = i % CH, j = kb * BN + r;
            bool ok = j < L;
            size_t g = ok ? (size_t)(kv0 + j) * hd + h * DH + c * 8 : 0;
            cp_async16(kd + r * LD + c * 8, k + g, ok);
            cp_async16(vd + r * LD + c * 8, v + g, ok);
        }
    };
    const int nkb = (L + BN - 1) / BN;
    if (nkb > 0)
        load_kv(0, 0);
    cp_async_commit();

    float oacc[DH / 8][4];
#pragma unroll
    for (int j = 0; j < DH / 8; j++)
#pragma unroll
        for (int x = 0; x < 4; x++)
            oacc[j][x] = 0.0f;
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.0f, 0.0f};
    uint32_t qf[DH / 16][4];
    const int g = lane >> 2, t = lane & 3;

    for (int kb = 0; kb < nkb; kb++) {
        cp_async_wait<0>();
        __syncthreads();
        if (kb == 0) {
#pragma unroll
            for (int ks = 0; ks < DH / 16; ks++)
                ldmatrix_x4(qf[ks], Qs + (warp * 16 + (lane & 15)) * LD + ks * 16 + (lane >> 4) * 8);
        }
        if (kb + 1 < nkb)
            load_kv((kb + 1) & 1, kb + 1);
        cp_async_commit();
        const T *Kb = Ks + (kb & 1) * BN * LD;
        const T *Vb = Vs + (kb & 1) * BN * LD;

        /* S = Q K^T for this warp's 16 rows and BN keys. */
        float s[BN / 8][4];
#pragma unroll
        for (int j = 0; j < BN / 8; j++)
#pragma unroll
            for (int x = 0; x < 4; x++)
                s[j][x] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < DH / 16; ks++)
#pragma unroll
            for (int nj = 0; nj < BN / 8; nj += 2) {
                uint32_t t4[4];
                int key = nj * 8 + (lane >> 4) * 8 + (lane & 7);
                int col = ks * 16 + ((lane >> 3) & 1) * 8;
                ldmatrix_x4(t4, Kb + key * LD + col);
                uint32_t b0[2] = {t4[0], t4[1]}, b1[2] = {t4[2], t4[3]};
                mma16816<T>(s[nj], qf[ks], b0);
                mma16816<T>(s[nj + 1], qf[ks], b1);
            }
        if ((kb + 1) * BN > L) {
#pragma unroll
            for (int nj = 0; nj < BN / 8; nj++)
#pragma unroll
                for (int x = 0; x < 4; x++) {
                    int key = kb * BN + nj * 8 + 2 * t + (x & 1);
                    if (key >= L)
                        s[nj][x] = -INFINITY;
                }
        }

        /* Online softmax, base 2; rows g (x = 0, 1) and g + 8 (x = 2, 3).
         * Every block has at least one valid key, so the max is finite. */
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nj = 0; nj < BN / 8; nj++) {
            mx[0] = fmaxf(mx[0], fmaxf(s[nj][0], s[nj][1]));
            mx[1] = fmaxf(mx[1], fmaxf(s[nj][2], s[nj][3]));
        }
        float corr[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            float mnew = fmaxf(mrow[r], mx[r] * scale_log2);
            corr[r] = exp2f(mrow[r] - mnew);
            mrow[r] = mnew;
            lrow[r] *= corr[r];
        }
#pragma unroll
        for (int j = 0; j < DH / 8; j++) {
            oacc[j][0] *= corr[0];
            oacc[j][1] *= corr[0];
            oacc[j][2] *= corr[1];
            oacc[j][3] *= corr[1];
        }
#pragma unroll
        for (int nj = 0; nj < BN / 8; nj++) {
            s[nj][0] = exp2f(s[nj][0] * scale_log2 - mrow[0]);
            s[nj][1] = exp2f(s[nj][1] * scale_log2 - mrow[0]);
            s[nj][2] = exp2f(s[nj][2] * scale_log2 - mrow[1]);
            s[nj][3] = exp2f(s[nj][3] * scale_log2 - mrow[1]);
            lrow[0] += s[nj][0] + s[nj][1];
            lrow[1] += s[nj][2] + s[nj][3];
        }

        /* O += P V: P's accumulator layout is the A operand's. */
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) {
            uint32_t pa[4];
            pa[0] = pack2<T>(s[2 * kk][0], s[2 * kk][1]);
            pa[1] = pack2<T>(s[2 * kk][2], s[2 * kk][3]);
            pa[2] = pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            pa[3] = pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
            for (int dj = 0; dj < DH / 8; dj += 2) {
                uint32_t t4[4];
                int r = kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7);
                int c = dj * 8 + (lane >> 4) * 8;
                ldmatrix_x4_trans(t4, Vb + r * LD + c);
                uint32_t b0[2] = {t4[0], t4[1]}, b1[2] = {t4[2], t4[3]};
                mma16816<T>(oacc[dj], pa, b0);
                mma16816<T>(oacc[dj + 1], pa, b1);
            }
        }
    }
    cp_async_wait<0>();

    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float l = lrow[r];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        inv[r] = l > 0.0f ? 1.0f / l : 0.0f;
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int row = row0 + warp * 16 + g + r * 8;
        if (row >= row_end)
            continue;
        T *orow = o + (size_t)row * hd + h * DH;
#pragma unroll
        for (int dj = 0; dj < DH / 8; dj++)
            *(uint32_t *)(orow + dj * 8 + 2 * t) =
                pack2<T>(oacc[dj][2 * r] * inv[r], oacc[dj][2 * r + 1] * inv[r]);
    }
}

/* -------------------------------------------------------- wgmma (Hopper) */

/* Two warpgroups of 64 query rows share each K/V block of 128 keys:
 *   S = Q K^T  wgmma m64n128k16, A = Q and B = K both K-major (head dim
 *              contiguous) 128B-swizzled shared tiles;
 *   O += P V   wgmma m64n{DH}k16, A = P in registers (the S accumulator
 *              layout repacked to bf16/fp16), B = V read MN-major (the
 *              descriptor's transpose bit) from its swizzled tile.
 * Tiles are stored as DH/64 column blocks of [rows][64] (128-byte rows).
 * lbo_v / sbo_v: byte offsets of V's MN-major descriptor (column-block
 * stride and 8-key-group stride); passed in so a test can confirm them. */
template <int DH> struct attw_cfg {
    static constexpr int BM = 128, BN = 128;
    static constexpr int Q_BYTES = BM * DH * 2, KV_BYTES = BN * DH * 2;
    static constexpr size_t SMEM = (size_t)Q_BYTES + 4 * KV_BYTES + 1024;
};

template <typename T, int DH>
__global__ void __launch_bounds__(256, 1)
k_att_wg(const T *__restrict__ q, const T *__restrict__ k, const T *__restrict__ v,
         const int64_t *__restrict__ off, const int4 *__restrict__ tiles,
         const int *__restrict__ ntiles, int hd, float scale_log2, T *__restrict__ o,
         uint32_t lbo_v, uint32_t sbo_v)
{
    typedef attw_cfg<DH> CFG;
    constexpr int BM = CFG::BM, BN = CFG::BN, CH = DH / 8;
    if ((int)blockIdx.x >= *ntiles)
        return;
    const int4 ti = tiles[blockIdx.x];
    const int row0 = ti.x, row_end = ti.y, u = ti.z, h = blockIdx.y;
    const int64_t kv0 = off[u];
    const int L = (int)(off[u + 1] - kv0);

    extern __shared__ unsigned char smem_raw[];
    unsigned char *Qs = (unsigned char *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    unsigned char *Ks = Qs + CFG::Q_BYTES;          /* [2][KV_BYTES] */
    unsigned char *Vs = Ks + 2 * CFG::KV_BYTES;     /* [2][KV_BYTES] */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wg = warp >> 2, wq = warp & 3, g = lane >> 2, t = lane & 3;

    /* Chunk c of row r of a [rows][DH] tile: column block c / 8, swizzled. */
    for (int i = tid; i < BM * CH; i += 256) {
        int r = i / CH, c = i % CH, row = row0 + r;
        bool ok = row < row_end;
        cp_async16(Qs + (c >> 3) * (BM * 128) + sw128(r, c & 7),
                   ok ? q + (size_t)row * hd + h * DH + c * 8 : q, ok);
    }
    /* This thread's chunks of a K/V block: rows tid / CH + n * (256 / CH),
     * chunk tid % CH - fixed offsets, only the key index moves. */
    constexpr int RSTEP = 256 / CH;
    static_assert(RSTEP % 8 == 0 && BN % RSTEP == 0, "fixed swizzle phase per thread");
    const int lr = tid / CH, lc = tid % CH;
    const uint32_t lso = (lc >> 3) * (BN * 128) + sw128(lr, lc & 7);
    const T *kbase = k + (size_t)kv0 * hd + h * DH + lc * 8;
    const T *vbase = v + (size_t)kv0 * hd + h * DH + lc * 8;
    auto load_kv = [&](int buf, int kb) {
        unsigned char *kd = Ks + buf * CFG::KV_BYTES, *vd = Vs + buf * CFG::KV_BYTES;
#pragma unroll
        for (int n = 0; n < BN / RSTEP; n++) {
            int j = kb * BN + lr + n * RSTEP;
            bool ok = j < L;
            size_t gofs = ok ? (size_t)j * hd : 0;
            /* rows lr + n*RSTEP keep lr's swizzle phase (RSTEP % 8 == 0) */
            uint32_t so = lso + n * RSTEP * 128;
            cp_async16(kd + so, ok ? kbase + gofs : k, ok);
            cp_async16(vd + so, ok ? vbase + gofs : v, ok);
        }
    };
    const int nkb = (L + BN - 1) / BN;
    if (nkb > 0)
        load_kv(0, 0);
    cp_async_commit();

    float oacc[DH / 2], s[BN / 2];
#pragma unroll
    for (int i = 0; i < DH / 2; i++)
        oacc[i] = 0.0f;
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.0f, 0.0f};

    for (int kb = 0; kb < nkb; kb++) {
        cp_async_wait<0>();
        __syncthreads();
        const unsigned char *Kb = Ks + (kb & 1) * CFG::KV_BYTES;
        const unsigned char *Vb = Vs + (kb & 1) * CFG::KV_BYTES;

#pragma unroll
        for (int i = 0; i < BN / 2; i++)
            s[i] = 0.0f;
        wg_fence();
        wg_fence_regs<BN / 2>(s);
#pragma unroll
        for (int kk = 0; kk < DH / 16; kk++) {
            uint64_t da = wg_desc(Qs + (kk >> 2) * (BM * 128) + wg * 64 * 128 + (kk & 3) * 32, 16, 1024);
            uint64_t db = wg_desc(Kb + (kk >> 2) * (BN * 128) + (kk & 3) * 32, 16, 1024);
            wgmma_ss<T, BN, 0>::run(s, da, db);
        }
        wg_commit();
        /* The next block's copies issue while the tensor cores work; the
         * buffer they fill was last read before this iteration's barrier. */
        if (kb + 1 < nkb)
            load_kv((kb + 1) & 1, kb + 1);
        cp_async_commit();
        wg_wait<0>();
        wg_fence_regs<BN / 2>(s);

        /* s[4j + x]: row wq*16 + g (+8 for x >= 2), key 8j + 2t + (x & 1). */
        if ((kb + 1) * BN > L) {
#pragma unroll
            for (int j = 0; j < BN / 8; j++)
#pragma unroll
                for (int x = 0; x < 4; x++)
                    if (kb * BN + 8 * j + 2 * t + (x & 1) >= L)
                        s[4 * j + x] = -INFINITY;
        }
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int j = 0; j < BN / 8; j++) {
            mx[0] = fmaxf(mx[0], fmaxf(s[4 * j], s[4 * j + 1]));
            mx[1] = fmaxf(mx[1], fmaxf(s[4 * j + 2], s[4 * j + 3]));
        }
        float corr[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            float mnew = fmaxf(mrow[r], mx[r] * scale_log2);
            corr[r] = exp2f(mrow[r] - mnew);
            mrow[r] = mnew;
            lrow[r] *= corr[r];
        }
        /* Once the row maxima settle, most blocks change none of them. */
        if (__any_sync(0xffffffffu, corr[0] != 1.0f || corr[1] != 1.0f)) {
#pragma unroll
            for (int j = 0; j < DH / 8; j++) {
                oacc[4 * j] *= corr[0];
                oacc[4 * j + 1] *= corr[0];
                oacc[4 * j + 2] *= corr[1];
                oacc[4 * j + 3] *= corr[1];
            }
        }
        uint32_t pa[BN / 16][4];
#pragma unroll
        for (int j = 0; j < BN / 8; j++) {
            float p0 = exp2f(s[4 * j] * scale_log2 - mrow[0]);
            float p1 = exp2f(s[4 * j + 1] * scale_log2 - mrow[0]);
            float p2 = exp2f(s[4 * j + 2] * scale_log2 - mrow[1]);
            float p3 = exp2f(s[4 * j + 3] * scale_log2 - mrow[1]);
            lrow[0] += p0 + p1;
            lrow[1] += p2 + p3;
            pa[j >> 1][(j & 1) * 2] = pack2<T>(p0, p1);
            pa[j >> 1][(j & 1) * 2 + 1] = pack2<T>(p2, p3);
        }
        wg_fence();
        wg_fence_regs<DH / 2>(oacc);
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++)
            wgmma_rs<T, DH, 1>::run(oacc, pa[kk], wg_desc(Vb + kk * 16 * 128, lbo_v, sbo_v));
        wg_commit();
        wg_wait<0>();
        wg_fence_regs<DH / 2>(oacc);
    }
    cp_async_wait<0>();

    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float l = lrow[r];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        inv[r] = l > 0.0f ? 1.0f / l : 0.0f;
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int row = row0 + wg * 64 + wq * 16 + g + r * 8;
        if (row >= row_end)
            continue;
        T *orow = o + (size_t)row * hd + h * DH;
#pragma unroll
        for (int j = 0; j < DH / 8; j++)
            *(uint32_t *)(orow + j * 8 + 2 * t) =
                pack2<T>(oacc[4 * j + 2 * r] * inv[r], oacc[4 * j + 2 * r + 1] * inv[r]);
    }
}

/* ------------------------------------------------------------------ SIMT */

#define SIMT_MAX_DH 256

/* One warp per (query row, head); lane owns head columns lane, lane+32, ... */
template <typename T>
__global__ void __launch_bounds__(256)
k_att_simt(const T *__restrict__ q, const T *__restrict__ k, const T *__restrict__ v,
           const int64_t *__restrict__ off, const int32_t *__restrict__ map, long rows, int tq,
           int heads, int dh, float scale, T *__restrict__ o)
{
    long wid = (blockIdx.x * (long)blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (wid >= rows * heads)
        return;
    const long row = wid / heads;
    const int h = (int)(wid - row * heads);
    const int hd = heads * dh;
    const int u = map[row / tq];
    const int64_t kv0 = off[u], L = off[u + 1] - kv0;
    float qv[SIMT_MAX_DH / 32], acc[SIMT_MAX_DH / 32];
#pragma unroll
    for (int i = 0; i < SIMT_MAX_DH / 32; i++) {
        int c = lane + 32 * i;
        qv[i] = c < dh ? cu_tof<T>(q[row * hd + h * dh + c]) : 0.0f;
        acc[i] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int64_t j = 0; j < L; j++) {
        const T *kr = k + (size_t)(kv0 + j) * hd + h * dh;
        const T *vr = v + (size_t)(kv0 + j) * hd + h * dh;
        float sdot = 0.0f;
#pragma unroll
        for (int i = 0; i < SIMT_MAX_DH / 32; i++) {
            int c = lane + 32 * i;
            if (c < dh)
                sdot = fmaf(qv[i], cu_tof<T>(kr[c]), sdot);
        }
#pragma unroll
        for (int x = 16; x > 0; x >>= 1)
            sdot += __shfl_xor_sync(0xffffffffu, sdot, x);
        sdot *= scale;
        float mnew = fmaxf(m, sdot);
        float corr = expf(m - mnew), p = expf(sdot - mnew);
        l = l * corr + p;
#pragma unroll
        for (int i = 0; i < SIMT_MAX_DH / 32; i++) {
            int c = lane + 32 * i;
            if (c < dh)
                acc[i] = acc[i] * corr + p * cu_tof<T>(vr[c]);
        }
        m = mnew;
    }
    float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
    for (int i = 0; i < SIMT_MAX_DH / 32; i++) {
        int c = lane + 32 * i;
        if (c < dh)
            o[row * hd + h * dh + c] = cu_fromf<T>(acc[i] * inv);
    }
}

/* ------------------------------------------------------------------ host */

/* Builds the tile table, then runs the tensor-core kernel: wgmma (WG = 1,
 * Hopper) or mma.sync (WG = 0). */
template <typename T, int DH, int WG>
static int launch_tc(bk_stream *s, const T *q, const T *k, const T *v, const int64_t *off, int nu,
                     const int32_t *map, int nc, int tq, int heads, T *o, bk_err *err)
{
    long rows = (long)nc * tq;
    long cap = rows / ATT_BM + (nu < nc ? nu : nc) + 1;
    if (cap > INT32_MAX / 2) {
        bk_seterr(err, "attention: %ld query rows are too many for one launch", rows);
        return -1;
    }
    if (cu_scratch_get(s, &s->att_tile, 16 + (size_t)cap * sizeof(int4), err))
        return -1;
    int *ntiles = (int *)s->att_tile.p;
    int4 *tiles = (int4 *)((char *)s->att_tile.p + 16);
    k_att_tiles<<<1, 1024, 0, s->st>>>(map, nc, tq, ATT_BM, tiles, ntiles, (int)cap);
    if (cu_check_launch(err, "attention tile table"))
        return -1;
    float scale_log2 = (float)(1.4426950408889634 / sqrt((double)DH));
    dim3 grid((unsigned)cap, (unsigned)heads);
    if constexpr (WG && (DH == 64 || DH == 128)) {
        auto kern = k_att_wg<T, DH>;
        if (cu_smem_limit(s, (const void *)kern, (int)attw_cfg<DH>::SMEM, err))
            return -1;
        /* V is MN-major: 64-column blocks BN*128 bytes apart (LBO), 8-key
         * groups 1024 bytes apart (SBO); the swapped assignment was checked
         * on the H200 and faults. */
        uint32_t lbo = attw_cfg<DH>::BN * 128, sbo = 1024;
        kern<<<grid, 256, attw_cfg<DH>::SMEM, s->st>>>(q, k, v, off, tiles, ntiles, heads * DH,
                                                       scale_log2, o, lbo, sbo);
        return cu_check_launch(err, "attention (wgmma)");
    } else {
        auto kern = k_att_tc<T, DH>;
        if (cu_smem_limit(s, (const void *)kern, (int)att_cfg<DH>::SMEM, err))
            return -1;
        kern<<<grid, 256, att_cfg<DH>::SMEM, s->st>>>(q, k, v, off, tiles, ntiles, heads * DH,
                                                      scale_log2, o);
        return cu_check_launch(err, "attention (tensor cores)");
    }
}

template <typename T>
static int attention_t(bk_stream *s, const void *q, const void *k, const void *v,
                       const int64_t *off, int nu, const int32_t *map, int nc, int tq, int heads,
                       int dh, void *o, bk_err *err)
{
    int variant = cu_impl(s->be)->att_variant;
    bool al = (((uintptr_t)q | (uintptr_t)k | (uintptr_t)v) & 15) == 0 && ((uintptr_t)o & 3) == 0;
    if constexpr (sizeof(T) == 2) {
        if (variant != 1 && al) {
            const T *qt = (const T *)q, *kt = (const T *)k, *vt = (const T *)v;
            T *ot = (T *)o;
            /* Variants: 0 automatic (wgmma for dh 64/128), 1 SIMT, 2 mma.sync,
             */
            bool wgv = variant != 2;
            switch (dh) {
            case 32: return launch_tc<T, 32, 0>(s, qt, kt, vt, off, nu, map, nc, tq, heads, ot, err);
            case 64:
                return wgv ? launch_tc<T, 64, 1>(s, qt, kt, vt, off, nu, map, nc, tq, heads, ot, err)
                           : launch_tc<T, 64, 0>(s, qt, kt, vt, off, nu, map, nc, tq, heads, ot, err);
            case 96: return launch_tc<T, 96, 0>(s, qt, kt, vt, off, nu, map, nc, tq, heads, ot, err);
            case 128:
                return wgv ? launch_tc<T, 128, 1>(s, qt, kt, vt, off, nu, map, nc, tq, heads, ot, err)
                           : launch_tc<T, 128, 0>(s, qt, kt, vt, off, nu, map, nc, tq, heads, ot, err);
            default: break;
            }
        }
    }
    if (dh > SIMT_MAX_DH) {
        bk_seterr(err, "attention: head_dim %d exceeds the CUDA backend's limit of %d", dh,
                  SIMT_MAX_DH);
        return -1;
    }
    long warps = (long)nc * tq * heads;
    long blocks = (warps + 7) / 8;
    if (blocks >= (1L << 31)) {
        bk_seterr(err, "attention: %ld (row, head) pairs are too many for one launch", warps);
        return -1;
    }
    k_att_simt<T><<<(unsigned)blocks, 256, 0, s->st>>>(
        (const T *)q, (const T *)k, (const T *)v, off, map, (long)nc * tq, tq, heads, dh,
        (float)(1.0 / sqrt((double)dh)), (T *)o);
    return cu_check_launch(err, "attention (SIMT)");
}

int cuda_attention(bk_stream *s, const void *q, const void *k, const void *v,
                   const int64_t *offsets, int nu, const int32_t *map, int nc, int tq, int heads,
                   int dh, void *o, bk_err *err)
{
    cu_prof_scope prof_(s, "attention");
    if (nc <= 0 || tq <= 0 || heads <= 0 || dh <= 0)
        return 0;
    if (nu <= 0) {
        bk_seterr(err, "attention: %d candidates but no users", nc);
        return -1;
    }
    if (cu_enter(s, err))
        return -1;
    int rc = 0;
    CU_DISPATCH(cu_dt(s), rc = attention_t<T>(s, q, k, v, offsets, nu, map, nc, tq, heads, dh, o,
                                              err));
    return rc;
}
