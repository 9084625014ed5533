/* attention.cu - IKBO target attention on the GPU.
 *
 * For candidate c, query row i, head h (u = map[c], keys = u's events):
 *   o[c*tq+i, h] = softmax_j(q[c*tq+i, h] . k_j[h] / sqrt(dh)) v_j[h]
 * with o's row c*tq+i at c*go + i*H*dh: candidate c's tq rows are one
 * packed span, spans go apart (backend.h; every kernel's epilogue writes
 * through att_orow, att_wg.cuh).
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
 * - wgmma flash kernel (Hopper, bf16/fp16, dh 64/128): k_att_wg in
 *   att_wg.cuh; its timing diagnostics (ping-pong, softmax overlap, Q
 *   prefetch or 16-byte stores switched off) are bench/kernels/
 *   attention_v3.cu.
 * - mma.sync flash kernel (bf16/fp16, dh 32/64/96/128 templated): 8 warps
 *   of 16 query rows, keys in blocks of 64, double-buffered cp.async K/V,
 *   online softmax in fp32 (base 2), P kept in registers as the A operand
 *   of P V; no [rows, L] scores in memory; keys past L_u masked.
 * - SIMT kernel (fp32 mode, other head sizes, unaligned operands): one warp
 *   per (query row, head), same online softmax.
 * A user with no events gives zeros. Which kernel serves a call: the table
 * above attention_t, from the shape, dtype and alignment alone.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/att_wg.cuh"

#define ATT_BM 128 /* query rows per tile */
#define ATT_BN 64  /* keys per block      */

/* ------------------------------------------------------------ tile table */

/* One block. A run is a maximal range of candidates with one user; each run
 * gives ceil(run_rows / bm) tiles. Runs are found where map changes, their
 * ends by binary search (map is sorted), and tile slots by a block scan.
 * With map_smem (nc <= ATT_MAP_SMEM) the map is first copied to shared
 * memory, so the searches' dependent loads do not go to L2 (at C = 2048 the
 * table took a visible share of the attention op: bench/kernels/NOTES.md).
 * The attention kernel is launched as its programmatic dependent: it may
 * start (barrier setup) while this runs and waits for it before reading the
 * table (griddepcontrol). */
#define ATT_MAP_SMEM 12288 /* ints: 48 KiB, the default dynamic limit */
__global__ void __launch_bounds__(1024)
k_att_tiles(const int32_t *__restrict__ map_g, int nc, int tq, int bm, int4 *__restrict__ tiles,
            int *__restrict__ ntiles, int cap, int map_smem)
{
    extern __shared__ int map_s[];
    __shared__ int warp_sum[32];
    __shared__ int carry_s;
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = blockDim.x >> 5;
    const int32_t *map = map_g;
    if (map_smem) {
        for (int i = tid; i < nc; i += blockDim.x)
            map_s[i] = map_g[i];
        map = map_s;
    }
    if (tid == 0)
        carry_s = 0;
    __syncthreads();
    for (int b0 = 0; b0 < nc; b0 += blockDim.x) {
        int c = b0 + tid, cnt = 0, end = 0, u = 0;
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

/* Self-attention tiles (one block): user u's events split into tiles of
 * ATT_BM rows from its first event, so tile t of a user holds positions
 * [t*BM, (t+1)*BM) and, causal, needs key blocks 0..t only. Tiles are
 * written longest first (a counting sort by key blocks: LPT order for the
 * persistent kernel, which takes work items in table order), as {row0,
 * row_end, user, 1 | t << 1}, after `*base` target tiles when fused (a
 * target tile reads all of its user's keys: as much as that user's most
 * expensive self tile, so target tiles go first). Slot order within a cost
 * is arbitrary; each tile's result does not depend on it. */
#define ATT_SELF_BUCKETS 64
__global__ void __launch_bounds__(1024)
k_att_self_tiles(const int64_t *__restrict__ off, int nu, int causal, int4 *__restrict__ tiles,
                 int *__restrict__ nself, int cap, const int *__restrict__ base)
{
    __shared__ int cnt[ATT_SELF_BUCKETS], cur[ATT_SELF_BUCKETS];
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
    const int tid = threadIdx.x;
    if (tid < ATT_SELF_BUCKETS)
        cnt[tid] = 0;
    __syncthreads();
    for (int u = tid; u < nu; u += blockDim.x) {
        const int L = (int)(off[u + 1] - off[u]), nt = (L + ATT_BM - 1) / ATT_BM;
        for (int t = 0; t < nt; t++)
            atomicAdd(&cnt[min(causal ? t + 1 : nt, ATT_SELF_BUCKETS) - 1], 1);
    }
    __syncthreads();
    if (tid == 0) {
        int start = base ? *base : 0; /* after the target tiles of a fused launch */
        for (int b = ATT_SELF_BUCKETS - 1; b >= 0; b--) {
            cur[b] = start;
            start += cnt[b];
        }
        *nself = start < cap ? start : cap;
    }
    __syncthreads();
    for (int u = tid; u < nu; u += blockDim.x) {
        const int64_t e0 = off[u], e1 = off[u + 1];
        const int nt = (int)((e1 - e0 + ATT_BM - 1) / ATT_BM);
        for (int t = 0; t < nt; t++) {
            const int pos = atomicAdd(&cur[min(causal ? t + 1 : nt, ATT_SELF_BUCKETS) - 1], 1);
            const int64_t r0 = e0 + (int64_t)t * ATT_BM;
            if (pos < cap)
                tiles[pos] = make_int4((int)r0, (int)min(r0 + ATT_BM, e1), u, 1 | (t << 1));
        }
    }
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
         const int *__restrict__ ntiles, int hd, int ldkv, float scale_log2, T *__restrict__ o,
         int tq, int64_t go)
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
            size_t g = ok ? (size_t)(kv0 + j) * ldkv + h * DH + c * 8 : 0;
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
        T *orow = att_orow(o, row, tq, go, hd) + h * DH;
#pragma unroll
        for (int dj = 0; dj < DH / 8; dj++)
            *(uint32_t *)(orow + dj * 8 + 2 * t) =
                pack2<T>(oacc[dj][2 * r] * inv[r], oacc[dj][2 * r + 1] * inv[r]);
    }
}

/* ------------------------------------------------------------------ SIMT */

#define SIMT_MAX_DH 256

/* One warp per (query row, head); lane owns head columns lane, lane+32, ...
 * Target rows (nu_self = 0): user map[row / tq], all its keys, softmax;
 * output spans go apart (att_orow). Self rows (nu_self = nu; tq 1, go hd:
 * packed): the user whose events hold the row (binary search of off), keys
 * j <= the row's position when causal, softmax or silu(s) / n. */
template <typename T>
__global__ void __launch_bounds__(256)
k_att_simt(const T *__restrict__ q, const T *__restrict__ k, const T *__restrict__ v,
           const int64_t *__restrict__ off, const int32_t *__restrict__ map, long rows, int tq,
           int heads, int dh, int ldkv, float scale, T *__restrict__ o, int64_t go, int nu_self,
           int causal, int silu)
{
    long wid = (blockIdx.x * (long)blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (wid >= rows * heads)
        return;
    const long row = wid / heads;
    const int h = (int)(wid - row * heads);
    const int hd = heads * dh;
    int u;
    if (nu_self) {
        int lo = 0, hi = nu_self - 1; /* the last u with off[u] <= row */
        while (lo < hi) {
            int mid = (lo + hi + 1) >> 1;
            if (off[mid] <= row)
                lo = mid;
            else
                hi = mid - 1;
        }
        u = lo;
    } else {
        u = map[row / tq];
    }
    const int64_t kv0 = off[u], L = off[u + 1] - kv0;
    const int64_t lim = nu_self && causal ? row - kv0 + 1 : L;
    float qv[SIMT_MAX_DH / 32], acc[SIMT_MAX_DH / 32];
#pragma unroll
    for (int i = 0; i < SIMT_MAX_DH / 32; i++) {
        int c = lane + 32 * i;
        qv[i] = c < dh ? cu_tof<T>(q[row * hd + h * dh + c]) : 0.0f;
        acc[i] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int64_t j = 0; j < lim; j++) {
        const T *kr = k + (size_t)(kv0 + j) * ldkv + h * dh;
        const T *vr = v + (size_t)(kv0 + j) * ldkv + h * dh;
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
        float corr = 1.0f, p;
        if (silu) {
            p = sdot / (1.0f + expf(-sdot));
        } else {
            float mnew = fmaxf(m, sdot);
            corr = expf(m - mnew);
            p = expf(sdot - mnew);
            l = l * corr + p;
            m = mnew;
        }
#pragma unroll
        for (int i = 0; i < SIMT_MAX_DH / 32; i++) {
            int c = lane + 32 * i;
            if (c < dh)
                acc[i] = acc[i] * corr + p * cu_tof<T>(vr[c]);
        }
    }
    float inv = silu ? (L > 0 ? 1.0f / (float)L : 0.0f) : l > 0.0f ? 1.0f / l : 0.0f;
    T *orow = att_orow(o, row, tq, go, hd) + h * dh;
#pragma unroll
    for (int i = 0; i < SIMT_MAX_DH / 32; i++) {
        int c = lane + 32 * i;
        if (c < dh)
            orow[c] = cu_fromf<T>(acc[i] * inv);
    }
}

/* ------------------------------------------------------------------ host */

/* Blocks of 8 warps for rows x heads warps, or -1 when too many. */
static int simt_blocks(long rows, int heads, bk_err *err, long *blocks)
{
    long warps = rows * heads;
    *blocks = (warps + 7) / 8;
    if (*blocks >= (1L << 31)) {
        bk_seterr(err, "attention: %ld (row, head) pairs are too many for one launch", warps);
        return -1;
    }
    return 0;
}

template <typename T>
static int launch_simt(bk_stream *s, const att_job<T> &j, int dh, bk_err *err)
{
    if (dh > SIMT_MAX_DH) {
        bk_seterr(err, "attention: head_dim %d exceeds the CUDA backend's limit of %d", dh,
                  SIMT_MAX_DH);
        return -1;
    }
    const float scale = (float)(1.0 / sqrt((double)dh));
    long blocks;
    if (j.qs && j.ev > 0) {
        if (simt_blocks((long)j.ev, j.heads, err, &blocks))
            return -1;
        k_att_simt<T><<<(unsigned)blocks, 256, 0, s->st>>>(
            j.qs, j.k, j.v, j.off, NULL, (long)j.ev, 1, j.heads, dh, j.ldkv, scale, j.os,
            (int64_t)j.heads * dh, j.nu, j.causal, j.silu);
        if (cu_check_launch(s, err, "self_attention (SIMT)"))
            return -1;
    }
    if (j.q && j.nc > 0) {
        if (simt_blocks((long)j.nc * j.tq, j.heads, err, &blocks))
            return -1;
        k_att_simt<T><<<(unsigned)blocks, 256, 0, s->st>>>(j.q, j.k, j.v, j.off, j.map,
                                                            (long)j.nc * j.tq, j.tq, j.heads, dh,
                                                            j.ldkv, scale, j.o, j.go, 0, 0, 0);
        if (cu_check_launch(s, err, "attention (SIMT)"))
            return -1;
    }
    return 0;
}

int cu_att_tiles(bk_stream *s, bool target, bool self, const int32_t *map, int nc, int tq,
                 const int64_t *off, int nu, int causal, int64_t ev, int4 **tiles_out,
                 int **ntiles_out, long *cap_out, bk_err *err)
{
    long rows = target ? (long)nc * tq : 0;
    long cap_t = target ? rows / ATT_BM + (nu < nc ? nu : nc) + 1 : 0;
    long cap_s = self ? (long)(ev / ATT_BM) + nu + 1 : 0;
    long cap = cap_t + cap_s;
    if (cap > INT32_MAX / 2 || (self && ev > INT32_MAX)) {
        bk_seterr(err, "attention: %ld query rows are too many for one launch", rows + (long)ev);
        return -1;
    }
    if (cu_scratch_get(s, &s->att_tile, 16 + (size_t)cap * sizeof(int4), err))
        return -1;
    int *cnt = (int *)s->att_tile.p; /* [0] total, [1] target tiles of a fused launch */
    int4 *tiles = (int4 *)((char *)s->att_tile.p + 16);
    const bool both = target && self;
    if (target) {
        const int map_smem = nc <= ATT_MAP_SMEM;
        k_att_tiles<<<1, 1024, map_smem ? (size_t)nc * sizeof(int) : 0, s->st>>>(
            map, nc, tq, ATT_BM, tiles, both ? cnt + 1 : cnt, (int)cap_t, map_smem);
        if (cu_check_launch(s, err, "attention tile table"))
            return -1;
    }
    if (self) {
        k_att_self_tiles<<<1, 1024, 0, s->st>>>(off, nu, causal, tiles, cnt, (int)cap,
                                                 both ? cnt + 1 : NULL);
        if (cu_check_launch(s, err, "self_attention tile table"))
            return -1;
    }
    *tiles_out = tiles;
    *ntiles_out = cnt;
    *cap_out = cap;
    return 0;
}

/* The mma.sync kernel over the target tile table (no self part). */
template <typename T, int DH>
static int launch_mma(bk_stream *s, const att_job<T> &j, bk_err *err)
{
    int4 *tiles;
    int *ntiles;
    long cap;
    if (cu_att_tiles(s, true, false, j.map, j.nc, j.tq, j.off, j.nu, 0, 0, &tiles, &ntiles, &cap,
                     err))
        return -1;
    float scale_log2 = (float)(1.4426950408889634 / sqrt((double)DH));
    auto kern = k_att_tc<T, DH>;
    if (cu_smem_limit(s, (const void *)kern, (int)att_cfg<DH>::SMEM, err))
        return -1;
    dim3 grid((unsigned)cap, (unsigned)j.heads);
    kern<<<grid, 256, att_cfg<DH>::SMEM, s->st>>>(j.q, j.k, j.v, j.off, tiles, ntiles,
                                                  j.heads * DH, j.ldkv, scale_log2, j.o, j.tq,
                                                  j.go);
    return cu_check_launch(s, err, "attention (tensor cores)");
}

/* Which kernel serves an attention call (target, self, or both fused), the
 * one place it is chosen:
 *
 *   dtype      when                                           kernel
 *   bf16/fp16  dh 64 or 128; q, qs, k, v 16-byte aligned,     k_att_wg (att_wg.cuh), both
 *              o, os and every candidate's span (go) 4-byte   parts in one launch; 16-byte
 *              aligned                                        stores where o, os and the
 *                                                             spans are 16-byte aligned,
 *                                                             4-byte ones otherwise
 *   bf16/fp16  target part only, dh 32, 96 (or 64, 128 when   k_att_tc (mma.sync)
 *              forced), same alignment
 *   any        otherwise (fp32, other dh <= 256, a self part  k_att_simt
 *              at other dh, unaligned operands)
 *
 * A test or benchmark may force a fallback on one backend
 * (bk_cuda_force_path, cuda_paths.h); nothing on the serving path does.
 */
template <typename T>
static int attention_t(bk_stream *s, const att_job<T> &j, int dh, bk_err *err)
{
    const int force = cu_impl(s->be)->force_att;
    bool al = (((uintptr_t)j.q | (uintptr_t)j.qs | (uintptr_t)j.k | (uintptr_t)j.v) & 15) == 0 &&
              (((uintptr_t)j.o | (uintptr_t)j.os) & 3) == 0 && j.ldkv * sizeof(T) % 16 == 0 &&
              j.go * sizeof(T) % 4 == 0; /* the tensor-core epilogues store pairs */
    if constexpr (sizeof(T) == 2) {
        if (force != CU_PATH_SIMT && al) {
            if (force == CU_PATH_AUTO && dh == 64)
                return launch_wg<T, 64>(s, j, attw_flags(j), err);
            if (force == CU_PATH_AUTO && dh == 128)
                return launch_wg<T, 128>(s, j, attw_flags(j), err);
            if (!j.qs) {
                switch (dh) {
                case 32: return launch_mma<T, 32>(s, j, err);
                case 64: return launch_mma<T, 64>(s, j, err);
                case 96: return launch_mma<T, 96>(s, j, err);
                case 128: return launch_mma<T, 128>(s, j, err);
                default: break;
                }
            }
        }
    }
    return launch_simt<T>(s, j, dh, err);
}

/* Profile work of an attention call (cu_prof_scope::work), from the actual
 * per-user lengths L_u (cu_prof_jagged; none when off or map is not in
 * this batch's uploads). Per head, with r = heads * dh:
 *   self part (self: its events, causal or not): QK^T and PV over each
 *     user's L_u^2 pairs (L_u (L_u + 1) / 2 causal): 4 dh FLOPs a pair;
 *     q, k, v read and o written once: 4 events r elements;
 *   target part (nc candidates of tq queries): candidate c's tq queries
 *     over its user's L keys: 4 tq L dh a candidate; q read and o written
 *     at nc tq rows; k and v of the distinct users read once (already
 *     counted when the self part reads them all); the map.
 * Plus the offsets. The softmax (or silu) is not a dominant term. */
static void att_work(bk_stream *s, cu_prof_scope &pr, const int64_t *off, int nu, bool self,
                     int causal, const int32_t *map, int nc, int tq, int heads, int dh)
{
    cu_prof_jag js, jt;
    if ((self && cu_prof_jagged(s, off, NULL, nu, &js)) ||
        (nc > 0 && cu_prof_jagged(s, off, map, nc, &jt)))
        return;
    const double r = (double)heads * dh, es = (double)s->be->act_size;
    double flops = 0, elems = 0, idx = (nu + 1.0) * sizeof *off;
    if (self) {
        flops += 4.0 * r * (causal ? js.tri : js.sq);
        elems += 4.0 * js.urows * r;
    }
    if (nc > 0) {
        flops += 4.0 * r * tq * jt.pairs;
        elems += 2.0 * nc * tq * r + (self ? 0 : 2.0 * jt.urows * r);
        idx += nc * (double)sizeof *map;
    }
    pr.work(flops, elems * es + idx);
}

int cuda_attention(bk_stream *s, const void *q, const void *k, const void *v, int ldkv,
                   const int64_t *offsets, int nu, const int32_t *map, int nc, int tq, int heads,
                   int dh, void *o, int64_t go, bk_err *err)
{
    cu_prof_scope prof_(s, "attention");
    if (nc <= 0 || tq <= 0 || heads <= 0 || dh <= 0)
        return 0;
    if (bk_bad_stride("attention", "K/V row stride", ldkv, "heads * head_dim",
                      (int64_t)heads * dh, err) ||
        bk_bad_stride("attention", "output candidate stride go", go, "tq * heads * head_dim",
                      (int64_t)tq * heads * dh, err))
        return -1;
    if (nu <= 0) {
        bk_seterr(err, "attention: %d candidates but no users", nc);
        return -1;
    }
    if (prof_.on())
        att_work(s, prof_, offsets, nu, false, 0, map, nc, tq, heads, dh);
    if (cu_enter(s, err))
        return -1;
    int rc = 0;
    CU_DISPATCH(cu_dt(s), {
        att_job<T> j = {};
        j.q = (const T *)q, j.k = (const T *)k, j.v = (const T *)v, j.o = (T *)o;
        j.off = offsets, j.map = map, j.nu = nu, j.nc = nc, j.tq = tq, j.heads = heads;
        j.ldkv = ldkv, j.go = go;
        rc = attention_t<T>(s, j, dh, err);
    });
    return rc;
}

int cuda_self_attention(bk_stream *s, const bk_seq_att *a, bk_err *err)
{
    cu_prof_scope prof_(s, a->tq ? "self_attention+target" : "self_attention");
    if (a->heads <= 0 || a->dh <= 0 || a->nu < 0 || a->events < 0 ||
        (a->tq && (a->nc < 0 || a->tq_tokens < 0))) {
        bk_seterr(err, "self_attention: bad sizes nu %d events %lld heads %d dh %d", a->nu,
                  (long long)a->events, a->heads, a->dh);
        return -1;
    }
    if (a->kind != BK_ATT_SOFTMAX && a->kind != BK_ATT_SILU) {
        bk_seterr(err, "self_attention: unknown kind %d", (int)a->kind);
        return -1;
    }
    const bool self_part = a->q && a->events > 0 && a->nu > 0;
    const bool tgt_part = a->tq && a->nc > 0 && a->tq_tokens > 0;
    if (!self_part && !tgt_part)
        return 0;
    if (tgt_part && a->nu <= 0) {
        bk_seterr(err, "self_attention: %d candidates but no users", a->nc);
        return -1;
    }
    if (prof_.on())
        att_work(s, prof_, a->offsets, a->nu, self_part, a->causal, tgt_part ? a->map : NULL,
                 tgt_part ? a->nc : 0, a->tq_tokens, a->heads, a->dh);
    if (cu_enter(s, err))
        return -1;
    int rc = 0;
    CU_DISPATCH(cu_dt(s), {
        att_job<T> j = {};
        j.k = (const T *)a->k, j.v = (const T *)a->v, j.off = a->offsets, j.nu = a->nu;
        j.heads = a->heads, j.causal = a->causal, j.silu = a->kind == BK_ATT_SILU;
        j.ldkv = a->heads * a->dh;
        if (self_part)
            j.qs = (const T *)a->q, j.os = (T *)a->o, j.ev = a->events;
        if (tgt_part)
            j.q = (const T *)a->tq, j.o = (T *)a->to, j.map = a->map, j.nc = a->nc,
            j.tq = a->tq_tokens, j.go = (int64_t)a->tq_tokens * a->heads * a->dh; /* packed */
        rc = attention_t<T>(s, j, a->dh, err);
    });
    return rc;
}
