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
 * - tensor-core flash kernel (bf16/fp16, dh 32/64/96/128 templated): 8 warps
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

template <typename T, int DH>
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
    auto kern = k_att_tc<T, DH>;
    CU_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)att_cfg<DH>::SMEM),
           "attention: shared memory limit");
    float scale_log2 = (float)(1.4426950408889634 / sqrt((double)DH));
    dim3 grid((unsigned)cap, (unsigned)heads);
    kern<<<grid, 256, att_cfg<DH>::SMEM, s->st>>>(q, k, v, off, tiles, ntiles, heads * DH,
                                                  scale_log2, o);
    return cu_check_launch(err, "attention (tensor cores)");
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
            switch (dh) {
            case 32: return launch_tc<T, 32>(s, qt, kt, vt, off, nu, map, nc, tq, heads, ot, err);
            case 64: return launch_tc<T, 64>(s, qt, kt, vt, off, nu, map, nc, tq, heads, ot, err);
            case 96: return launch_tc<T, 96>(s, qt, kt, vt, off, nu, map, nc, tq, heads, ot, err);
            case 128: return launch_tc<T, 128>(s, qt, kt, vt, off, nu, map, nc, tq, heads, ot, err);
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
    if (nc <= 0 || tq <= 0 || heads <= 0 || dh <= 0)
        return 0;
    if (nu <= 0) {
        bk_seterr(err, "attention: %d candidates but no users", nc);
        return -1;
    }
    if (cu_check(cudaSetDevice(cu_impl(s->be)->ordinal), err, "cudaSetDevice"))
        return -1;
    int rc = 0;
    CU_DISPATCH(cu_dt(s), rc = attention_t<T>(s, q, k, v, offsets, nu, map, nc, tq, heads, dh, o,
                                              err));
    return rc;
}
