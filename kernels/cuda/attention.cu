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
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_internal.h"
#include "kernels/cuda/mma_util.cuh"
#include "kernels/cuda/tma_util.cuh"
#include "kernels/cuda/wgmma_gen.cuh"

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

/* Warp-specialized, persistent, ping-pong (the FA3 recipe):
 * - 384 threads: warpgroup 0 is the producer (56 registers), warpgroups 1
 *   and 2 are consumers (224 registers) that each own 64 query rows of a
 *   128-row tile. One CTA per SM loops
 *   over (tile, head) work items w = blockIdx.x, + gridDim.x, ... in tile
 *   table order (w = tile * heads + head), so the CTAs in flight cover a
 *   few users' K/V at a time and share it through L2.
 * - The producer copies K/V blocks of 128 keys into a ring of STAGES
 *   shared stages with cp.async (zero-filling keys past L_u, so nothing
 *   past a user's history, or past the tensor, is read) and the tile's Q
 *   (rows past the tile zero-filled); each copy batch completes on a
 *   "full" mbarrier through cp.async.mbarrier.arrive.noinc. Consumers free
 *   a stage through its "empty" mbarrier once their P V on it is done, and
 *   Q through "qempty" after the tile's last S GEMM; no block barrier.
 * - Each consumer iteration is one turn on the tensor cores:
 *     S_j = Q K_j^T (commit);  O += P_{j-1} V_{j-1} (commit)
 *   then the exponentials of S_j while that P V still runs, then (P V
 *   done) the rescale of O and P_j packed for the next turn. Turns
 *   alternate between the two warpgroups through named barriers 1 and 2,
 *   so one's softmax runs under the other's GEMMs (and under its own
 *   P V). A tile takes nkb + 1 turns (S_0 alone, P V alone last);
 *   both warpgroups always take the same turns (rows past the tile are
 *   computed on zero Q and not stored), so the alternation never stalls.
 *   S = Q K^T: wgmma m64n128k16, A = Q and B = K both K-major 128B-swizzled
 *   shared tiles; O += P V: wgmma m64n{DH}k16, A = P in registers (the S
 *   accumulator layout repacked to bf16/fp16), B = V read MN-major (the
 *   descriptor's transpose bit) from its swizzled tile.
 * Tiles are stored as DH/64 column blocks of [rows][64] (128-byte rows).
 * lbo_v / sbo_v: byte offsets of V's MN-major descriptor (column-block
 * stride and 8-key-group stride); passed in so a test can confirm them. */
/* 2^x on the special-function unit alone (exp2f adds a denormal-range
 * fix-up: three more instructions per element); x <= 0 here, -inf -> 0. */
__device__ __forceinline__ float att_ex2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* tanh on the special-function unit (max relative error about 2^-11: below
 * the bf16/fp16 rounding of P it feeds). HSTU's silu as
 * x sigmoid(x) = h + h tanh(h), h = x / 2: one SFU op per element, as
 * softmax's exp2, instead of exp2 and a reciprocal. */
__device__ __forceinline__ float att_tanh(float x)
{
    float y;
    asm("tanh.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* One butterfly step of a transpose across lanes l and l ^ m: the lane
 * with the bit set (hi) trades its x for its partner's y, the other trades
 * its y for the partner's x. */
__device__ __forceinline__ void lane_swap(uint32_t &x, uint32_t &y, bool hi, int m)
{
    uint32_t s = __shfl_xor_sync(0xffffffffu, hi ? x : y, m);
    if (hi)
        x = s;
    else
        y = s;
}

template <int DH> struct attw_cfg {
    static constexpr int BM = 128, BN = 128, STAGES = DH == 128 ? 3 : 4, NT = 384;
    static constexpr int Q_BYTES = BM * DH * 2, KV_BYTES = BN * DH * 2;
    static constexpr size_t BAR_OFS = (size_t)Q_BYTES + 2 * (size_t)STAGES * KV_BYTES;
    static constexpr size_t SMEM = 1024 + BAR_OFS + (2 * STAGES + 2) * 8;
};

#define ATTW_PP_BAR 1 /* named barriers 1, 2: consumer warpgroup 0, 1's turn */
#define ATTW_PREFETCH_Q 1 /* flags: the next tile's Q rows into L2 */
#define ATTW_VEC_STORE 2  /* flags: o is 16-byte aligned, store 16 bytes at a time */

/* The wgmma kernel's arguments. A tile's .w bit 0 marks a self-attention
 * tile (queries qs, output os, rows = the user's events; t = .w >> 1 its
 * index in the user); other tiles are target tiles (q, o). */
template <typename T> struct attw_args {
    const T *q, *k, *v, *qs;
    T *o, *os;
    const int64_t *off;
    const int4 *tiles;
    const int *ntiles;
    int heads, flags;
    int causal, silu;   /* self tiles: keys j <= i; silu(q.k / sqrt(dh)) / n weights */
    float scale_log2;   /* log2(e) / sqrt(dh) */
    float scale;        /* 1 / sqrt(dh) */
    uint32_t lbo_v, sbo_v;
};

/* Key blocks a tile reads: all of its user's, or, causal self tile t,
 * blocks 0..t (the last one the diagonal). */
__device__ __forceinline__ int attw_nkb(int4 ti, int L, int causal, int bn)
{
    const int nkb = (L + bn - 1) / bn;
    return (ti.w & 1) && causal ? min(nkb, (ti.w >> 1) + 1) : nkb;
}

template <typename T, int DH, bool PP, bool OV>
__global__ void __launch_bounds__(384, 1)
k_att_wg(const __grid_constant__ attw_args<T> a)
{
    const T *__restrict__ q = a.q, *__restrict__ k = a.k, *__restrict__ v = a.v;
    const int64_t *__restrict__ off = a.off;
    const int4 *__restrict__ tiles = a.tiles;
    const int heads = a.heads, flags = a.flags;
    const float scale_log2 = a.scale_log2;
    typedef attw_cfg<DH> CFG;
    constexpr int BM = CFG::BM, BN = CFG::BN, ST = CFG::STAGES, CH = DH / 8;
    static_assert(BM == BN, "Q and K/V tiles share the copy layout");
    const int hd = heads * DH;
    /* Launched as the tile table's programmatic dependent: wait for it (a
     * no-op when launched plainly). */
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    const long W = (long)*a.ntiles * heads;

    extern __shared__ unsigned char smem_raw[];
    unsigned char *Qs = (unsigned char *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    unsigned char *Ks = Qs + CFG::Q_BYTES;            /* [ST][KV_BYTES] */
    unsigned char *Vs = Ks + ST * CFG::KV_BYTES;      /* [ST][KV_BYTES] */
    uint64_t *full = (uint64_t *)(Qs + CFG::BAR_OFS); /* [ST] */
    uint64_t *empty = full + ST;                      /* [ST] */
    uint64_t *qfull = empty + ST, *qempty = qfull + 1;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

    if (tid == 0) {
        for (int i = 0; i < ST; i++) {
            mbar_init(&full[i], 128); /* the producer warpgroup's threads */
            mbar_init(&empty[i], 8); /* lane 0 of each consumer warp */
        }
        mbar_init(qfull, 128);
        mbar_init(qempty, 8);
        mbar_fence_init();
    }
    __syncthreads();

    if (warp < 4) {
        /* ---- producer: chunk lc of rows lr, lr + RSTEP, ...; RSTEP is a
         * multiple of 8, so one swizzle phase per thread ---- */
        setmaxnreg_dec<56>();
        constexpr int RSTEP = 128 / CH, NR = BN / RSTEP;
        static_assert(RSTEP % 8 == 0, "fixed swizzle phase per thread");
        const int lr = tid / CH, lc = tid % CH;
        const uint32_t lso = (lc >> 3) * (BN * 128) + sw128(lr, lc & 7);
        int it = 0, qt = 0;
        for (long w = blockIdx.x; w < W; w += gridDim.x) {
            const int4 ti = tiles[w / heads];
            const int h = (int)(w % heads);
            const int64_t kv0 = off[ti.z];
            const int L = (int)(off[ti.z + 1] - kv0);
            const int nkb = attw_nkb(ti, L, a.causal, BN);
            if (nkb == 0)
                continue;
            const T *kb_ = k + (size_t)kv0 * hd + h * DH + lc * 8;
            const T *vb_ = v + (size_t)kv0 * hd + h * DH + lc * 8;
            for (int kb = 0; kb < nkb; kb++, it++) {
                const int st = it % ST;
                mbar_wait(&empty[st], ((it / ST) & 1) ^ 1);
                unsigned char *kd = Ks + st * CFG::KV_BYTES, *vd = Vs + st * CFG::KV_BYTES;
#pragma unroll
                for (int n = 0; n < NR; n++) {
                    const int j = kb * BN + lr + n * RSTEP;
                    const bool ok = j < L;
                    const size_t g = ok ? (size_t)j * hd : 0;
                    const uint32_t so = lso + n * RSTEP * 128;
                    cp_async16(kd + so, kb_ + g, ok);
                    cp_async16(vd + so, vb_ + g, ok);
                }
                cp_async_mbar_arrive_noinc(&full[st]);
                if (kb == 0) {
                    /* Q after the first K/V block: that one only needed a
                     * free stage, Q waits for the last tile's last S. */
                    mbar_wait(qempty, (qt & 1) ^ 1);
                    const T *qsrc = (ti.w & 1) ? a.qs : q;
                    const T *qb = qsrc + h * DH + lc * 8;
#pragma unroll
                    for (int n = 0; n < NR; n++) {
                        const int row = ti.x + lr + n * RSTEP;
                        const bool ok = row < ti.y;
                        cp_async16(Qs + lso + n * RSTEP * 128, ok ? qb + (size_t)row * hd : qsrc, ok);
                    }
                    cp_async_mbar_arrive_noinc(qfull);
                    qt++;
                    /* The next work item's Q rows into L2 (one row each),
                     * so its copy into shared memory waits on L2, not HBM. */
                    const long w2 = w + gridDim.x;
                    if ((flags & ATTW_PREFETCH_Q) && w2 < W) {
                        const int4 tn = tiles[w2 / heads];
                        const int row = tn.x + tid;
                        if (row < tn.y)
                            bulk_prefetch_l2(((tn.w & 1) ? a.qs : q) + (size_t)row * hd +
                                                 (int)(w2 % heads) * DH,
                                             DH * 2);
                    }
                }
            }
        }
        cp_async_commit();
        cp_async_wait<0>();
        return;
    }

    /* ---- consumers ---- */
    setmaxnreg_inc<224>();
    const int wg = (warp >> 2) - 1, wq = warp & 3, g = lane >> 2, t = lane & 3;
    const bool lead = lane == 0;
    const int my_bar = ATTW_PP_BAR + wg, other_bar = ATTW_PP_BAR + (wg ^ 1);
    const unsigned char *Qw = Qs + wg * 64 * 128;
    int it = 0, qt = 0;
    if (PP && wg == 1)
        named_bar_arrive(ATTW_PP_BAR, 256); /* warpgroup 0 takes the first turn */
    auto turn_begin = [&]() {
        if (PP)
            named_bar_sync(my_bar, 256);
    };
    auto turn_end = [&]() {
        if (PP)
            named_bar_arrive(other_bar, 256);
    };

    float oacc[DH / 2], s[BN / 2];
    uint32_t pa[BN / 16][4];
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.0f, 0.0f};

    /* s = 0, before the turn's wgmma.fence. */
    auto zero_s = [&]() {
#pragma unroll
        for (int i = 0; i < BN / 2; i++)
            s[i] = 0.0f;
    };
    /* S += Q K^T (issued, not committed). */
    auto issue_s = [&](const unsigned char *Kb) {
#pragma unroll
        for (int kk = 0; kk < DH / 16; kk++) {
            uint64_t da = wg_desc(Qw + (kk >> 2) * (BM * 128) + (kk & 3) * 32, 16, 1024);
            uint64_t db = wg_desc(Kb + (kk >> 2) * (BN * 128) + (kk & 3) * 32, 16, 1024);
            wgmma_ss<T, BN, 0>::run(s, da, db);
        }
    };
    auto issue_pv = [&](const unsigned char *Vb) {
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++)
            wgmma_rs<T, DH, 1>::run(oacc, pa[kk], wg_desc(Vb + kk * 16 * 128, a.lbo_v, a.sbo_v));
    };
    /* Online softmax of block kb (base 2), in two parts so that the first
     * can run while this warpgroup's previous P V is still on the tensor
     * cores: softmax_p turns s into P in place (masked keys -> 0) and
     * updates mrow, lrow; softmax_o (after that P V is done) rescales oacc
     * and packs P into pa.
     * s[4j + x]: row wq*16 + g (+8 for x >= 2), key 8j + 2t + (x & 1).
     * Every block has at least one valid key, so the max is finite. */
    float corr[2];
    /* diag: the causal block of a self tile (key kk > row rl masked, both
     * relative to the block); silu: HSTU weights, no running max. */
    auto softmax_p = [&](int kb, int L, bool diag, bool silu) {
        if ((kb + 1) * BN > L || diag) {
            const int rl = wg * 64 + wq * 16 + g;
#pragma unroll
            for (int j = 0; j < BN / 8; j++)
#pragma unroll
                for (int x = 0; x < 4; x++) {
                    const int kk = 8 * j + 2 * t + (x & 1);
                    if (kb * BN + kk >= L || (diag && kk > rl + 8 * (x >> 1)))
                        s[4 * j + x] = -INFINITY;
                }
        }
        if (silu) {
            /* p = silu(s / sqrt(dh)); the division by n comes at the end. */
#pragma unroll
            for (int i = 0; i < BN / 2; i++) {
                const float h2 = s[i] * (0.5f * a.scale);
                s[i] = s[i] == -INFINITY ? 0.0f : fmaf(h2, att_tanh(h2), h2);
            }
            corr[0] = corr[1] = 1.0f;
            return;
        }
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int j = 0; j < BN / 8; j++) {
            mx[0] = fmaxf(mx[0], fmaxf(s[4 * j], s[4 * j + 1]));
            mx[1] = fmaxf(mx[1], fmaxf(s[4 * j + 2], s[4 * j + 3]));
        }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            float mnew = fmaxf(mrow[r], mx[r] * scale_log2);
            corr[r] = att_ex2(mrow[r] - mnew);
            mrow[r] = mnew;
        }
        float ls[2] = {0.0f, 0.0f};
#pragma unroll
        for (int j = 0; j < BN / 8; j++)
#pragma unroll
            for (int x = 0; x < 4; x++) {
                float p = att_ex2(fmaf(s[4 * j + x], scale_log2, -mrow[x >> 1]));
                s[4 * j + x] = p;
                ls[x >> 1] += p;
            }
        lrow[0] = fmaf(lrow[0], corr[0], ls[0]);
        lrow[1] = fmaf(lrow[1], corr[1], ls[1]);
    };
    auto softmax_o = [&]() {
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
#pragma unroll
        for (int j = 0; j < BN / 8; j++) {
            pa[j >> 1][(j & 1) * 2] = pack2<T>(s[4 * j], s[4 * j + 1]);
            pa[j >> 1][(j & 1) * 2 + 1] = pack2<T>(s[4 * j + 2], s[4 * j + 3]);
        }
    };

    /* The next work item's tile and history length are loaded a tile ahead. */
    int4 ti_n = make_int4(0, 0, 0, 0);
    int L_n = 0;
    if ((long)blockIdx.x < W) {
        ti_n = tiles[blockIdx.x / heads];
        L_n = (int)(off[ti_n.z + 1] - off[ti_n.z]);
    }
    for (long w = blockIdx.x; w < W; w += gridDim.x) {
        const int4 ti = ti_n;
        const int h = (int)(w % heads);
        const int L = L_n;
        const bool self_t = ti.w & 1, silu = self_t && a.silu;
        const int nkb = attw_nkb(ti, L, a.causal, BN);
        /* causal self tiles end on their diagonal block */
        const bool diag_last = self_t && a.causal;
        const long w2 = w + gridDim.x;
        if (w2 < W)
            ti_n = tiles[w2 / heads];
#pragma unroll
        for (int i = 0; i < DH / 2; i++)
            oacc[i] = 0.0f;
        mrow[0] = mrow[1] = -INFINITY;
        lrow[0] = lrow[1] = 0.0f;
        if (nkb > 0) {
            mbar_wait(qfull, qt & 1);
            /* turn 0: S_0 */
            mbar_wait(&full[it % ST], (it / ST) & 1);
            zero_s();
            turn_begin();
            wg_fence();
            wg_fence_regs<BN / 2>(s);
            issue_s(Ks + (it % ST) * CFG::KV_BYTES);
            wg_commit();
            turn_end();
            wg_wait<0>();
            wg_fence_regs<BN / 2>(s);
            if (nkb == 1 && lead)
                mbar_arrive(qempty);
            softmax_p(0, L, diag_last && nkb == 1, silu);
            softmax_o();
            /* turns 1 .. nkb-1: S_j and P_{j-1} V_{j-1} */
            for (int kb = 1; kb < nkb; kb++) {
                const int sp = it % ST;
                it++;
                const int sn = it % ST;
                mbar_wait(&full[sn], (it / ST) & 1);
                zero_s();
                turn_begin();
                wg_fence();
                wg_fence_regs<DH / 2>(oacc);
                wg_fence_regs<BN / 2>(s);
                issue_s(Ks + sn * CFG::KV_BYTES);
                if (OV)
                    wg_commit();
                issue_pv(Vs + sp * CFG::KV_BYTES);
                wg_commit();
                turn_end();
                if (OV) {
                    wg_wait<1>(); /* S_j done; P_{j-1} V_{j-1} may still run */
                    wg_fence_regs<BN / 2>(s);
                } else {
                    wg_wait<0>();
                    wg_fence_regs<BN / 2>(s);
                    wg_fence_regs<DH / 2>(oacc);
                }
                if (kb == nkb - 1 && lead)
                    mbar_arrive(qempty);
                if (kb == 1 && w2 < W)
                    L_n = (int)(off[ti_n.z + 1] - off[ti_n.z]);
                softmax_p(kb, L, diag_last && kb == nkb - 1, silu);
                if (OV) {
                    wg_wait<0>();
                    wg_fence_regs<DH / 2>(oacc);
                }
                if (lead)
                    mbar_arrive(&empty[sp]);
                softmax_o();
            }
            /* turn nkb: P V of the last block */
            const int sp = it % ST;
            it++;
            turn_begin();
            wg_fence();
            wg_fence_regs<DH / 2>(oacc);
            issue_pv(Vs + sp * CFG::KV_BYTES);
            wg_commit();
            turn_end();
            if (nkb == 1 && w2 < W)
                L_n = (int)(off[ti_n.z + 1] - off[ti_n.z]);
            wg_wait<0>();
            wg_fence_regs<DH / 2>(oacc);
            if (lead)
                mbar_arrive(&empty[sp]);
            qt++;
        } else if (w2 < W) {
            L_n = (int)(off[ti_n.z + 1] - off[ti_n.z]);
        }

        float inv[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float l = lrow[r];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            inv[r] = silu ? 1.0f / (float)L : l > 0.0f ? 1.0f / l : 0.0f;
        }
        if (flags & ATTW_VEC_STORE) {
            /* 16-byte stores: the quad (t = 0..3) holds 4 chunks of 8
             * columns as a 4 x 4 matrix of words (thread t, word b = its
             * columns 2t, 2t+1 of chunk 4a + b); two butterfly exchanges
             * transpose it so thread t holds all of chunk 4a + t. A quarter
             * of the store instructions of the 4-byte path below. */
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int row = ti.x + wg * 64 + wq * 16 + g + r * 8;
                T *orow = (self_t ? a.os : a.o) + (size_t)row * hd + h * DH;
#pragma unroll
                for (int a = 0; a < DH / 32; a++) {
                    uint32_t w4[4];
#pragma unroll
                    for (int b = 0; b < 4; b++) {
                        const int j = 4 * a + b;
                        w4[b] = pack2<T>(oacc[4 * j + 2 * r] * inv[r], oacc[4 * j + 2 * r + 1] * inv[r]);
                    }
                    const bool o1 = t & 1, o2 = t & 2;
                    lane_swap(w4[0], w4[1], o1, 1);
                    lane_swap(w4[2], w4[3], o1, 1);
                    lane_swap(w4[0], w4[2], o2, 2);
                    lane_swap(w4[1], w4[3], o2, 2);
                    if (row < ti.y)
                        *(uint4 *)(orow + 8 * (4 * a + t)) = make_uint4(w4[0], w4[1], w4[2], w4[3]);
                }
            }
        } else {
#pragma unroll
            for (int r = 0; r < 2; r++) {
                int row = ti.x + wg * 64 + wq * 16 + g + r * 8;
                if (row >= ti.y)
                    continue;
                T *orow = (self_t ? a.os : a.o) + (size_t)row * hd + h * DH;
#pragma unroll
                for (int j = 0; j < DH / 8; j++)
                    *(uint32_t *)(orow + j * 8 + 2 * t) =
                        pack2<T>(oacc[4 * j + 2 * r] * inv[r], oacc[4 * j + 2 * r + 1] * inv[r]);
            }
        }
    }
    /* Warpgroup 1's arrivals at barrier 1 outnumber warpgroup 0's waits by
     * the opening one: take it, so no barrier is left half-arrived. */
    if (PP && wg == 0)
        named_bar_sync(ATTW_PP_BAR, 256);
}

/* ------------------------------------------------------------------ SIMT */

#define SIMT_MAX_DH 256

/* One warp per (query row, head); lane owns head columns lane, lane+32, ...
 * Target rows (nu_self = 0): user map[row / tq], all its keys, softmax.
 * Self rows (nu_self = nu): the user whose events hold the row (binary
 * search of off), keys j <= the row's position when causal, softmax or
 * silu(s) / n. */
template <typename T>
__global__ void __launch_bounds__(256)
k_att_simt(const T *__restrict__ q, const T *__restrict__ k, const T *__restrict__ v,
           const int64_t *__restrict__ off, const int32_t *__restrict__ map, long rows, int tq,
           int heads, int dh, float scale, T *__restrict__ o, int nu_self, int causal, int silu)
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
#pragma unroll
    for (int i = 0; i < SIMT_MAX_DH / 32; i++) {
        int c = lane + 32 * i;
        if (c < dh)
            o[row * hd + h * dh + c] = cu_fromf<T>(acc[i] * inv);
    }
}

/* ------------------------------------------------------------------ host */

/* One attention launch: a target part (q, map, nc, tq -> o), a self part
 * (qs over ev event rows -> os), or both (a fused self + target launch). */
template <typename T> struct att_job {
    const T *q, *k, *v, *qs;
    T *o, *os;
    const int64_t *off;
    const int32_t *map;
    int nu, nc, tq, heads, causal, silu;
    int64_t ev; /* event rows: self part sizing */
};

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
        k_att_simt<T><<<(unsigned)blocks, 256, 0, s->st>>>(j.qs, j.k, j.v, j.off, NULL, (long)j.ev,
                                                            1, j.heads, dh, scale, j.os, j.nu,
                                                            j.causal, j.silu);
        if (cu_check_launch(s, err, "self_attention (SIMT)"))
            return -1;
    }
    if (j.q && j.nc > 0) {
        if (simt_blocks((long)j.nc * j.tq, j.heads, err, &blocks))
            return -1;
        k_att_simt<T><<<(unsigned)blocks, 256, 0, s->st>>>(j.q, j.k, j.v, j.off, j.map,
                                                            (long)j.nc * j.tq, j.tq, j.heads, dh,
                                                            scale, j.o, 0, 0, 0);
        if (cu_check_launch(s, err, "attention (SIMT)"))
            return -1;
    }
    return 0;
}

/* Builds the tile table(s) into the stream's scratch: target tiles first,
 * then self tiles (longest first). *ntiles gets the total. */
template <typename T>
static int build_tiles(bk_stream *s, const att_job<T> &j, int4 **tiles_out, int **ntiles_out,
                       long *cap_out, bk_err *err)
{
    long rows = j.q ? (long)j.nc * j.tq : 0;
    long cap_t = j.q ? rows / ATT_BM + (j.nu < j.nc ? j.nu : j.nc) + 1 : 0;
    long cap_s = j.qs ? (long)(j.ev / ATT_BM) + j.nu + 1 : 0;
    long cap = cap_t + cap_s;
    if (cap > INT32_MAX / 2 || (j.qs && j.ev > INT32_MAX)) {
        bk_seterr(err, "attention: %ld query rows are too many for one launch",
                  rows + (long)j.ev);
        return -1;
    }
    if (cu_scratch_get(s, &s->att_tile, 16 + (size_t)cap * sizeof(int4), err))
        return -1;
    int *cnt = (int *)s->att_tile.p; /* [0] total, [1] target tiles of a fused launch */
    int4 *tiles = (int4 *)((char *)s->att_tile.p + 16);
    const bool both = j.q && j.qs;
    if (j.q) {
        const int map_smem = j.nc <= ATT_MAP_SMEM;
        k_att_tiles<<<1, 1024, map_smem ? (size_t)j.nc * sizeof(int) : 0, s->st>>>(
            j.map, j.nc, j.tq, ATT_BM, tiles, both ? cnt + 1 : cnt, (int)cap_t, map_smem);
        if (cu_check_launch(s, err, "attention tile table"))
            return -1;
    }
    if (j.qs) {
        k_att_self_tiles<<<1, 1024, 0, s->st>>>(j.off, j.nu, j.causal, tiles, cnt, (int)cap,
                                                 both ? cnt + 1 : NULL);
        if (cu_check_launch(s, err, "self_attention tile table"))
            return -1;
    }
    *tiles_out = tiles;
    *ntiles_out = cnt;
    *cap_out = cap;
    return 0;
}

/* The wgmma kernel (WG = 1, Hopper, dh 64/128) over the tile table, or the
 * mma.sync one (WG = 0; target part only). */
template <typename T, int DH, int WG>
static int launch_tc(bk_stream *s, const att_job<T> &j, bk_err *err)
{
    int4 *tiles;
    int *ntiles;
    long cap;
    if (build_tiles(s, j, &tiles, &ntiles, &cap, err))
        return -1;
    const double rs = 1.0 / sqrt((double)DH);
    float scale_log2 = (float)(1.4426950408889634 * rs);
    if constexpr (WG && (DH == 64 || DH == 128)) {
        /* IKBO_ATT_WG_DIAG (diagnostics; timing comparisons): 'p' no
         * ping-pong between the consumer warpgroups, 'o' no overlap of
         * softmax with the warpgroup's own P V, 'f' no L2 prefetch of Q, 's'
         * 4-byte output stores even where 16-byte ones could be used. */
        const char *dg = cu_impl(s->be)->att_diag; /* read at backend creation */
        bool no_pp = strchr(dg, 'p'), no_ov = strchr(dg, 'o');
        bool al16 = ((uintptr_t)j.o | (uintptr_t)j.os) % 16 == 0;
        int flags = (strchr(dg, 'f') ? 0 : ATTW_PREFETCH_Q) |
                    (al16 && !strchr(dg, 's') ? ATTW_VEC_STORE : 0);
        auto kern = no_pp ? (no_ov ? k_att_wg<T, DH, false, false> : k_att_wg<T, DH, false, true>)
                          : (no_ov ? k_att_wg<T, DH, true, false> : k_att_wg<T, DH, true, true>);
        if (cu_smem_limit(s, (const void *)kern, (int)attw_cfg<DH>::SMEM, err))
            return -1;
        /* V is MN-major: 64-column blocks BN*128 bytes apart (LBO), 8-key
         * groups 1024 bytes apart (SBO); the swapped assignment was checked
         * on the H200 and faults. */
        attw_args<T> a = {};
        a.q = j.q, a.k = j.k, a.v = j.v, a.qs = j.qs, a.o = j.o, a.os = j.os, a.off = j.off;
        a.tiles = tiles, a.ntiles = ntiles, a.heads = j.heads, a.flags = flags;
        a.causal = j.causal, a.silu = j.silu, a.scale_log2 = scale_log2, a.scale = (float)rs;
        a.lbo_v = attw_cfg<DH>::BN * 128, a.sbo_v = 1024;
        /* Persistent: one CTA per SM (or per work item, if fewer). */
        long work = cap * j.heads, sms = cu_impl(s->be)->sm_count;
        unsigned pgrid = (unsigned)(work < sms ? work : sms);
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute at;
        at.id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at.val.programmaticStreamSerializationAllowed = 1;
        cfg.gridDim = dim3(pgrid);
        cfg.blockDim = dim3(attw_cfg<DH>::NT);
        cfg.dynamicSmemBytes = attw_cfg<DH>::SMEM;
        cfg.stream = s->st;
        cfg.attrs = &at;
        cfg.numAttrs = 1;
        CU_TRY(cudaLaunchKernelEx(&cfg, kern, a), "attention (wgmma)");
        return cu_check_launch(s, err, "attention (wgmma)");
    } else {
        auto kern = k_att_tc<T, DH>;
        if (cu_smem_limit(s, (const void *)kern, (int)att_cfg<DH>::SMEM, err))
            return -1;
        dim3 grid((unsigned)cap, (unsigned)j.heads);
        kern<<<grid, 256, att_cfg<DH>::SMEM, s->st>>>(j.q, j.k, j.v, j.off, tiles, ntiles,
                                                      j.heads * DH, scale_log2, j.o);
        return cu_check_launch(s, err, "attention (tensor cores)");
    }
}

/* Chooses the kernel: wgmma for dh 64/128 at bf16/fp16 (both parts in one
 * launch), mma.sync for the target part at dh 32/96 (IKBO_CUDA_ATTN=2: at
 * 64/128 too), SIMT otherwise (fp32, other head sizes, unaligned operands;
 * IKBO_CUDA_ATTN=1 forces it). */
template <typename T>
static int attention_t(bk_stream *s, const att_job<T> &j, int dh, bk_err *err)
{
    int variant = cu_impl(s->be)->att_variant;
    bool al = (((uintptr_t)j.q | (uintptr_t)j.qs | (uintptr_t)j.k | (uintptr_t)j.v) & 15) == 0 &&
              (((uintptr_t)j.o | (uintptr_t)j.os) & 3) == 0;
    if constexpr (sizeof(T) == 2) {
        if (variant != 1 && al) {
            bool wgv = variant != 2 && (dh == 64 || dh == 128);
            if (wgv)
                return dh == 64 ? launch_tc<T, 64, 1>(s, j, err) : launch_tc<T, 128, 1>(s, j, err);
            if (!j.qs) {
                switch (dh) {
                case 32: return launch_tc<T, 32, 0>(s, j, err);
                case 64: return launch_tc<T, 64, 0>(s, j, err);
                case 96: return launch_tc<T, 96, 0>(s, j, err);
                case 128: return launch_tc<T, 128, 0>(s, j, err);
                default: break;
                }
            }
        }
    }
    return launch_simt<T>(s, j, dh, err);
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
    CU_DISPATCH(cu_dt(s), {
        att_job<T> j = {};
        j.q = (const T *)q, j.k = (const T *)k, j.v = (const T *)v, j.o = (T *)o;
        j.off = offsets, j.map = map, j.nu = nu, j.nc = nc, j.tq = tq, j.heads = heads;
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
    if (cu_enter(s, err))
        return -1;
    int rc = 0;
    CU_DISPATCH(cu_dt(s), {
        att_job<T> j = {};
        j.k = (const T *)a->k, j.v = (const T *)a->v, j.off = a->offsets, j.nu = a->nu;
        j.heads = a->heads, j.causal = a->causal, j.silu = a->kind == BK_ATT_SILU;
        if (self_part)
            j.qs = (const T *)a->q, j.os = (T *)a->o, j.ev = a->events;
        if (tgt_part)
            j.q = (const T *)a->tq, j.o = (T *)a->to, j.map = a->map, j.nc = a->nc,
            j.tq = a->tq_tokens;
        rc = attention_t<T>(s, j, a->dh, err);
    });
    return rc;
}
