/* mlp2.cu - backend.h's mlp2 on the GPU: y = act2(add + act1(x W1^T + b1)
 * W2^T + addu[map]) with the hidden layer kept in registers.
 *
 * Why this exists: the fold's candidate MLP part (engine/fold.h) is c_r1 of
 * the bench model, 1120 x [16 -> 190464] with ReLU read only through the
 * folded [64, 190464] weight: stored, its hidden layer is 427 MB written
 * and read back (~310 us on an H100); here it never leaves the SM (117 us
 * in bench/kernels/fmlp_proto.cu, v1; NOTES.md "c_r1 through the fold").
 *
 * Two kernels (bf16/fp16, in <= 16), each a CTA over a block of rows by a
 * slice of the hidden layer by 64 outputs, NS stages of 128 hidden units
 * (W1's [128, 16], b1 and W2's [64, 128] staged by cp.async, zero-filled
 * past the weights). Per chunk each warp makes its rows' hidden values,
 * H = x W1^T + b1 on tensor cores (mma.sync, one k-step, b1 as the
 * accumulator), then act1 and the rounding to T that linear's store applies
 * (one conversion), in registers as the A operand of Y += H W2^T. k_mlp2
 * (below 256 rows: 16 rows a warp, 8 warps) runs that product on mma.sync
 * too; k_mlp2_wgo (from 256 rows: 2 warpgroups of 64 rows) on wgmma in its
 * RS form, W2 in shared memory 128-byte swizzled, the next chunk's hidden
 * values made while this chunk's wgmma run (bench/RESULTS.md has each
 * step's figures). Where W1a exists both products run on wgmma instead
 * (k_mlp2_wgh, "both products on wgmma" below: H from W1a, W1 with b1 as a
 * column, made once per weight); the kernels above serve graphs captured
 * before W1a exists. Row blocks take even shares of the rows.
 * Each slice writes fp32 partials to the stream's scratch; k_mlp2_sum adds
 * add, the slices in a fixed order for a given slice count (every row
 * alike) and addu, then applies act2. Elsewhere (fp32, in > 16) the
 * composition through a scratch of MLP2_CHUNK hidden units: linear into
 * it, linear out of it into a second scratch, added; then addu and act2.
 */
#include "kernels/cuda/cuda_internal.h"
#include "kernels/cuda/mma_util.cuh"
#include "kernels/cuda/tma_util.cuh"
#include "kernels/cuda/wgmma_gen.cuh"

#define MLP2_HC 128     /* hidden units a chunk */
#define MLP2_NO 64      /* outputs a CTA */
#define MLP2_W2P 136    /* W2 chunk row pitch in shared memory: conflict-free ldmatrix */
#define MLP2_CHUNK 8192 /* the composition's hidden units a step */

template <typename T> struct mlp2_stage {
    T w1[MLP2_HC * 16];        /* [j][k] */
    T w2[MLP2_NO * MLP2_W2P];  /* [n][j] */
    T b1[MLP2_HC];
};

/* Chunk j0's W1 rows ([128][16]; ld1 8: the second half zero) and b1 into
 * shared memory by NT threads (zeros past the weights). */
template <typename T, int NT>
__device__ __forceinline__ void mlp2_load_w1(T *w1s, T *b1s, const T *W1, int ld1, const T *b1,
                                             int hid, int j0, int tid)
{
#pragma unroll
    for (int c = tid; c < 2 * MLP2_HC; c += NT) {
        const int j = c >> 1, h = c & 1;
        const bool ok = j0 + j < hid && h * 8 < ld1;
        cp_async16(&w1s[j * 16 + h * 8], ok ? W1 + (size_t)(j0 + j) * ld1 + h * 8 : W1, ok);
    }
    if (tid < MLP2_HC / 8) {
        const bool ok = b1 && j0 + tid * 8 < ((hid + 7) & ~7);
        cp_async16(&b1s[tid * 8], ok ? b1 + j0 + tid * 8 : W1, ok);
    }
}

/* Chunk j0's weights into a stage by NT threads (zeros past the weights);
 * W2's 64 rows of 128 at pitch MLP2_W2P. */
template <typename T, int NT>
__device__ __forceinline__ void mlp2_load(mlp2_stage<T> *s, const T *W1, int ld1, const T *b1,
                                          const T *W2, int ld2, int hid, int out, int n0, int j0,
                                          int tid)
{
    mlp2_load_w1<T, NT>(s->w1, s->b1, W1, ld1, b1, hid, j0, tid);
#pragma unroll
    for (int c = tid; c < MLP2_NO * (MLP2_HC / 8); c += NT) {
        const int n = c >> 4, q = c & 15;
        const bool ok = n0 + n < out && j0 + q * 8 < ld2;
        cp_async16(&s->w2[n * MLP2_W2P + q * 8], ok ? W2 + (size_t)(n0 + n) * ld2 + j0 + q * 8 : W2,
                   ok);
    }
}

/* W1's B fragments for the chunk's hidden units 16kk.. (two n-tiles of 8)
 * and their b1 pairs (zeros without b1). */
struct mlp2_w1f {
    uint32_t bw[4];
    float2 bb[2];
};

template <typename T>
__device__ __forceinline__ mlp2_w1f mlp2_w1frag(const T *w1s, const T *b1s, int kk, int lane,
                                                bool has_b1)
{
    const int mi = lane >> 3, rr = lane & 7, t = lane & 3;
    mlp2_w1f f;
    ldmatrix_x4(f.bw, &w1s[(16 * kk + (mi >> 1) * 8 + rr) * 16 + (mi & 1) * 8]);
#pragma unroll
    for (int q = 0; q < 2; q++)
        f.bb[q] = has_b1 ? unpack2<T>(*(const uint32_t *)&b1s[16 * kk + 8 * q + 2 * t])
                         : make_float2(0.f, 0.f);
    return f;
}

/* One m-tile's 16 hidden units: x's A fragment times W1's fragments with
 * b1 in the accumulator, then act1 (RELU: in the conversion) and the
 * rounding to T that linear's store applies (its epilogue: the sum, then
 * the bias), packed as the A fragment of the second product. */
template <typename T, bool RELU>
__device__ __forceinline__ void mlp2_h16(const mlp2_w1f &f, const uint32_t a[4], uint32_t p[4])
{
#pragma unroll
    for (int q = 0; q < 2; q++) {
        float h[4];
        const uint32_t b2[2] = {f.bw[2 * q], f.bw[2 * q + 1]};
        mma16816_c<T>(h, a, b2, f.bb[q]);
        p[2 * q] = RELU ? pack2_relu<T>(h[0], h[1]) : pack2<T>(h[0], h[1]);
        p[2 * q + 1] = RELU ? pack2_relu<T>(h[2], h[3]) : pack2<T>(h[2], h[3]);
    }
}

/* One m-tile's 16 rows x 64 outputs of fp32 partials (mma's C layout, n-tile
 * i in y[i]) into the slice's [rows, out] block; rows from rend and outputs
 * from out are not written. */
__device__ __forceinline__ void mlp2_store_part(float *pp, const float (*y)[4], int r0, int rend,
                                                int n0, int out, int lane)
{
    const int g = lane >> 2, t = lane & 3, ra = r0 + g, rb = ra + 8;
#pragma unroll
    for (int i = 0; i < MLP2_NO / 8; i++) {
        const int n = n0 + 8 * i + 2 * t;
#pragma unroll
        for (int e = 0; e < 2; e++) {
            if (n + e >= out) continue;
            if (ra < rend) pp[(size_t)ra * out + n + e] = y[i][e];
            if (rb < rend) pp[(size_t)rb * out + n + e] = y[i][2 + e];
        }
    }
}

/* x's A fragment for the 16 rows from r0 (T's bits; elements past in or
 * rows from rend are zero). */
__device__ __forceinline__ void mlp2_xfrag(const void *x, int ldx, int in, int r0, int rend,
                                           int lane, uint32_t a[4])
{
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int q = 0; q < 4; q++) {
        const int row = r0 + g + 8 * (q & 1), k = 2 * t + 8 * (q >> 1);
        const uint16_t *xr = (const uint16_t *)x + (size_t)row * ldx;
        const uint32_t lo = row < rend && k < in ? xr[k] : 0u;
        const uint32_t hi = row < rend && k + 1 < in ? xr[k + 1] : 0u;
        a[q] = lo | hi << 16;
    }
}

/* NW warps of RT m-tiles (16 rows each) over rows [blockIdx.x rows_cta, +
 * rows_cta) (rows_cta a multiple of 16 RT; warps past it only load, so a grid
 * of balanced row blocks does little padded work); a slice of per_slice
 * chunks; 64 outputs; NS stages of weights in flight. */
template <typename T, int RT, int NW, int NS>
__global__ void __launch_bounds__(32 * NW, RT * NW > 16 ? 1 : 2)
k_mlp2(const T *__restrict__ x, int ldx, int in, int rows, int rows_cta, const T *W1, int ld1,
       const T *b1, int relu, const T *W2, int ld2, int hid, int out, float *part, int per_slice)
{
    extern __shared__ __align__(128) unsigned char smem_raw[];
    mlp2_stage<T> *st = (mlp2_stage<T> *)smem_raw;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int rend = min(rows, (blockIdx.x + 1) * rows_cta);
    const int r0 = blockIdx.x * rows_cta + warp * 16 * RT, n0 = blockIdx.z * MLP2_NO;
    const bool on = r0 < rend; /* a warp past its block's rows only loads */
    const int nchunks = (hid + MLP2_HC - 1) / MLP2_HC;
    const int c0 = blockIdx.y * per_slice, c1 = min(nchunks, c0 + per_slice);
    uint32_t a[RT][4];
#pragma unroll
    for (int r = 0; r < RT; r++) mlp2_xfrag(x, ldx, in, r0 + 16 * r, rend, lane, a[r]);
    float y[RT][MLP2_NO / 8][4];
#pragma unroll
    for (int r = 0; r < RT; r++)
#pragma unroll
        for (int i = 0; i < MLP2_NO / 8; i++) y[r][i][0] = y[r][i][1] = y[r][i][2] = y[r][i][3] = 0.f;
#pragma unroll
    for (int i = 0; i < NS - 1; i++) {
        if (c0 + i < c1)
            mlp2_load<T, 32 * NW>(&st[i], W1, ld1, b1, W2, ld2, hid, out, n0, (c0 + i) * MLP2_HC,
                                  tid);
        cp_async_commit();
    }
    const int mi = lane >> 3, rr = lane & 7;
    for (int c = c0; c < c1; c++) {
        cp_async_wait<NS - 2>(); /* chunk c is in; every warp is past chunk c - 1 */
        __syncthreads();
        if (c + NS - 1 < c1)
            mlp2_load<T, 32 * NW>(&st[(c - c0 + NS - 1) % NS], W1, ld1, b1, W2, ld2, hid, out, n0,
                                  (c + NS - 1) * MLP2_HC, tid);
        cp_async_commit();
        const mlp2_stage<T> *s = &st[(c - c0) % NS];
        if (!on) continue;
#pragma unroll
        for (int kk = 0; kk < MLP2_HC / 16; kk++) {
            const mlp2_w1f f = mlp2_w1frag<T>(s->w1, s->b1, kk, lane, b1);
            uint32_t p[RT][4];
#pragma unroll
            for (int r = 0; r < RT; r++) {
                if (relu)
                    mlp2_h16<T, true>(f, a[r], p[r]);
                else
                    mlp2_h16<T, false>(f, a[r], p[r]);
            }
#pragma unroll
            for (int nn = 0; nn < MLP2_NO / 16; nn++) {
                uint32_t bq[4];
                ldmatrix_x4(bq, &s->w2[(16 * nn + (mi >> 1) * 8 + rr) * MLP2_W2P + 16 * kk +
                                       (mi & 1) * 8]);
                const uint32_t blo[2] = {bq[0], bq[1]}, bhi[2] = {bq[2], bq[3]};
#pragma unroll
                for (int r = 0; r < RT; r++) {
                    mma16816<T>(y[r][2 * nn], p[r], blo);
                    mma16816<T>(y[r][2 * nn + 1], p[r], bhi);
                }
            }
        }
    }
    float *pp = part + (size_t)blockIdx.y * rows * out;
#pragma unroll
    for (int r = 0; r < RT; r++) mlp2_store_part(pp, y[r], r0 + 16 * r, rend, n0, out, lane);
}

/* The wgmma kernels' stage: W2's chunk [64][128] K-major as two
 * 128-byte-swizzled halves of 64 columns (what a wgmma descriptor reads,
 * mma_util.cuh wg_desc), then W1's chunk and b1 as k_mlp2 holds them. */
template <typename T> struct __align__(1024) mlp2_wg_stage {
    T w2[2 * MLP2_NO * 64];
    T w1[MLP2_HC * 16];
    T b1[MLP2_HC];
};

/* A thread's share of every chunk's copies into a stage: NT threads (a
 * multiple of 128) copy W2's 64 x 16 pieces of 16 bytes (piece k of thread
 * tid: row n = tid / 16 + k NT / 16, column q = tid % 16, so its swizzled
 * place and whether row n0 + n exists never change), W1's 256 and b1's 16.
 * Only W2's source and place are kept (registers are short in k_mlp2_wgo);
 * the rest is a few operations on tid a chunk. */
template <typename T, int NT> struct mlp2_wg_copy {
    static_assert(NT % 128 == 0, "whole warpgroups (a piece's column, tid % 16, never changes)");
    static constexpr int P2 = MLP2_NO * (MLP2_HC / 8); /* W2's 16-byte pieces a chunk */
    static constexpr int K2 = (P2 + NT - 1) / NT, K1 = (2 * MLP2_HC + NT - 1) / NT;
    const T *w2; /* chunk 0's source of piece 0 */
    int w2d;     /* piece 0's place in the stage */

    __device__ __forceinline__ mlp2_wg_copy(const T *W2, int ld2, int n0, int tid)
    {
        const int n = tid >> 4, q = tid & 15;
        w2d = (q >> 3) * MLP2_NO * 64 + n * 64 + (((q & 7) ^ (n & 7)) << 3); /* n % 8 is k's */
        w2 = W2 + (size_t)(n0 + n) * ld2 + q * 8;
    }

    /* Chunk j0's W2 into w2s (the swizzled halves; zeros past W2: those
     * copies read nothing and name `valid`, any mapped address). */
    __device__ __forceinline__ void load_w2(T *w2s, const T *valid, int ld2, int out, int n0, int j0,
                                            int tid) const
    {
        const bool okj = j0 + (tid & 15) * 8 < ld2;
        const int rows2 = out - n0 - (tid >> 4);
#pragma unroll
        for (int k = 0; k < K2; k++) {
            if (P2 % NT && tid + k * NT >= P2) break; /* NT not dividing P2 (3 warpgroups) */
            const bool ok = okj && k * (NT / 16) < rows2;
            cp_async16(&w2s[w2d + k * (NT / 16) * 64], ok ? w2 + (size_t)k * (NT / 16) * ld2 + j0 : valid,
                       ok);
        }
    }

    /* Chunk j0's weights into stage s (zeros past the weights). */
    __device__ __forceinline__ void load(mlp2_wg_stage<T> *s, const T *W1, int ld1, const T *b1,
                                         int ld2, int hid, int out, int n0, int j0, int tid) const
    {
        load_w2(s->w2, W1, ld2, out, n0, j0, tid);
#pragma unroll
        for (int k = 0; k < K1; k++) {
            const int c = tid + k * NT, j = c >> 1;
            if (c < 2 * MLP2_HC) {
                const bool ok = j0 + j < hid && (c & 1) * 8 < ld1;
                cp_async16(&s->w1[c * 8], ok ? W1 + (size_t)(j0 + j) * ld1 + (c & 1) * 8 : W1, ok);
            }
        }
        if (tid < MLP2_HC / 8) {
            const bool ok = b1 && j0 + tid * 8 < ((hid + 7) & ~7);
            cp_async16(&s->b1[tid * 8], ok ? b1 + j0 + tid * 8 : W1, ok);
        }
    }
};

/* All 8 hidden-unit m-tiles of a chunk from stage s into pk. */
template <typename T, bool RELU>
__device__ __forceinline__ void mlp2_wg_h(const mlp2_wg_stage<T> *s, const uint32_t a[4], int lane,
                                          bool has_b1, uint32_t (*pk)[4])
{
#pragma unroll
    for (int kk = 0; kk < MLP2_HC / 16; kk++)
        mlp2_h16<T, RELU>(mlp2_w1frag<T>(s->w1, s->b1, kk, lane, has_b1), a, pk[kk]);
}

/* Y += P W2^T for one chunk: 8 wgmma m64n64k16, P from registers, W2 from
 * the stage's swizzled halves (one descriptor, advanced by its address
 * field); issued and committed, not waited for. */
template <typename T>
__device__ __forceinline__ void mlp2_wg_mma(const T *w2s, uint32_t (*pk)[4], float (*y)[4])
{
    const uint64_t d0 = wg_desc(w2s, 16, 1024);
    wg_fence();
    wg_fence_regs<MLP2_NO / 2>(&y[0][0]);
#pragma unroll
    for (int kk = 0; kk < MLP2_HC / 16; kk++) /* bytes >> 4: half kk / 4, 32 bytes a k-step */
        wgmma_rs<T, MLP2_NO, 0>::run(&y[0][0], pk[kk],
                                     d0 + (uint64_t)(((kk >> 2) * MLP2_NO * 64 * 2 + (kk & 3) * 32) >> 4));
    wg_commit();
}

/* One turn of k_mlp2_wgo for chunk cc (its P in pc): its wgmma issued, chunk
 * cc - 1's awaited, chunk cc + 1 awaited in shared memory, chunk cc + NS - 1
 * loaded into chunk cc - 1's stage, and chunk cc + 1's P made into pn while
 * chunk cc's wgmma run (past the slice's end from a stale stage, unused). */
template <typename T, int NWG, int NS, bool RELU>
__device__ __forceinline__ void mlp2_wgo_turn(mlp2_wg_stage<T> *st, int cc, int c0, int c1,
                                              uint32_t (*pc)[4], uint32_t (*pn)[4], float (*y)[4],
                                              const uint32_t a[4], const mlp2_wg_copy<T, 128 * NWG> &cp,
                                              const T *W1, int ld1, const T *b1, int ld2, int hid,
                                              int out, int n0, int tid, int lane)
{
    mlp2_wg_mma<T>(st[(cc - c0) % NS].w2, pc, y);
    wg_wait<1>(); /* chunk cc - 1's wgmma are done: its P set and stage are free */
    wg_fence_regs<MLP2_NO / 2>(&y[0][0]);
    cp_async_wait<NS - 3>(); /* chunk cc + 1 is in */
    fence_proxy_async();
    __syncthreads();
    if (cc + NS - 1 < c1)
        cp.load(&st[(cc - c0 + NS - 1) % NS], W1, ld1, b1, ld2, hid, out, n0,
                (cc + NS - 1) * MLP2_HC, tid);
    cp_async_commit();
    mlp2_wg_h<T, RELU>(&st[(cc + 1 - c0) % NS], a, lane, b1, pn);
}

/* As k_mlp2 with the second product (80% of the FLOPs) on wgmma: NWG
 * warpgroups of 64 rows (rows_cta a multiple of 64), each warp making its 16
 * rows' hidden values with mma.sync as k_mlp2 does, the warpgroup
 * multiplying them on from registers (wgmma's RS form, m64n64k16, W2 from
 * shared memory). Chunk c + 1's hidden values are made, into a second
 * register set of P, while chunk c's wgmma run (FlashAttention-3's overlap of
 * softmax with the GEMMs); the warpgroup waits one group behind, and a stage
 * is refilled only after every warpgroup's wgmma on it have completed, so NS
 * - 2 chunks load ahead (NS >= 3). A warpgroup past the block's rows computes
 * on zeros rather than branching around wgmma (ptxas serializes wgmma in a
 * divergent path) and stores nothing. */
template <typename T, int NWG, int NS, bool RELU>
__global__ void __launch_bounds__(128 * NWG, NWG >= 3 ? 1 : 2)
k_mlp2_wgo(const T *__restrict__ x, int ldx, int in, int rows, int rows_cta, const T *W1, int ld1,
           const T *b1, const T *W2, int ld2, int hid, int out, float *part, int per_slice)
{
    static_assert(NS >= 3, "a stage in use by wgmma, one being made, one loading");
    extern __shared__ unsigned char smem_raw[];
    mlp2_wg_stage<T> *st =
        (mlp2_wg_stage<T> *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int rend = min(rows, (blockIdx.x + 1) * rows_cta);
    const int r0 = blockIdx.x * rows_cta + (warp >> 2) * 64 + (warp & 3) * 16;
    const int n0 = blockIdx.z * MLP2_NO;
    const int nchunks = (hid + MLP2_HC - 1) / MLP2_HC;
    const int c0 = blockIdx.y * per_slice, c1 = min(nchunks, c0 + per_slice);
    const mlp2_wg_copy<T, 128 * NWG> cp(W2, ld2, n0, tid);
    uint32_t a[4];
    mlp2_xfrag(x, ldx, in, r0, rend, lane, a);
    float y[MLP2_NO / 8][4];
#pragma unroll
    for (int i = 0; i < MLP2_NO / 8; i++) y[i][0] = y[i][1] = y[i][2] = y[i][3] = 0.f;
#pragma unroll
    for (int i = 0; i < NS - 1; i++) {
        if (c0 + i < c1) cp.load(&st[i], W1, ld1, b1, ld2, hid, out, n0, (c0 + i) * MLP2_HC, tid);
        cp_async_commit();
    }
    uint32_t p0[MLP2_HC / 16][4], p1[MLP2_HC / 16][4];
    cp_async_wait<NS - 2>(); /* chunk c0 */
    fence_proxy_async();
    __syncthreads();
    mlp2_wg_h<T, RELU>(&st[0], a, lane, b1, p0);
    int c = c0;
    for (; c + 1 < c1; c += 2) {
        mlp2_wgo_turn<T, NWG, NS, RELU>(st, c, c0, c1, p0, p1, y, a, cp, W1, ld1, b1, ld2, hid,
                                        out, n0, tid, lane);
        mlp2_wgo_turn<T, NWG, NS, RELU>(st, c + 1, c0, c1, p1, p0, y, a, cp, W1, ld1, b1, ld2, hid,
                                        out, n0, tid, lane);
    }
    if (c < c1) mlp2_wg_mma<T>(st[(c - c0) % NS].w2, p0, y);
    wg_wait<0>();
    wg_fence_regs<MLP2_NO / 2>(&y[0][0]);
    mlp2_store_part(part + (size_t)blockIdx.y * rows * out, y, r0, rend, n0, out, lane);
}

/* ---- both products on wgmma: k_mlp2_wgh (overlapped below 256 rows) ----
 *
 * The hidden values H = [x | 1 | 0] [W1 | b1 | 0]^T come from wgmma
 * m64n64k16 in its RS form: x's fragments with a ones column at `in` (made
 * once, kept in registers) against W1a, W1 with b1 as column `in` and zeros
 * to 16 KS columns (KS = 2 at in = 16, else 1), from shared memory swizzled
 * at its row width (64 or 32 bytes). So b1 costs a k-step of tensor work at
 * in = 16 (none below) instead of fragment loads and moves, W1 is read by
 * the tensor core instead of ldmatrix, and H's accumulators become P, the A
 * fragments of Y += P W2^T, by one cvt (with ReLU) a pair (FA3's S -> P).
 * On an H100 at 1120 rows: 75 us against k_mlp2_wgo's 99.5; at 70 rows,
 * overlapped, 17.9 against k_mlp2's 22.5 (bench/RESULTS.md). W1a is built
 * once per W1 (mlp2_w1a). A chunk's H is its two halves of 64 hidden units
 * into two accumulator sets in one wgmma group (one set reused for both
 * halves, each waited for, ran wrong: ptxas dropped the first half's
 * wgmma). */
template <typename T, int KS> struct __align__(1024) mlp2_wgh_stage {
    T w2[2 * MLP2_NO * 64];
    T w1a[MLP2_HC * 16 * KS];
};

/* W1a[j] = [W1[j, :in], b1[j] (0 without b1), 0 ...] of 16 KS columns. */
template <typename T>
__global__ void k_mlp2_w1a(const T *W1, int ld1, const T *b1, int in, int hid, int ka, T *w1a)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (size_t)hid * ka;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t j = i / ka;
        const int k = (int)(i % ka);
        w1a[i] = k < in ? W1[j * ld1 + k] : k == in && b1 ? b1[j] : cu_fromf<T>(0.f);
    }
}

/* x's A fragment for k-step ks of [x | 1 | 0] (rows from rend: zeros). */
template <typename T>
__device__ __forceinline__ void mlp2_xfrag_aug(const T *x, int ldx, int in, int r0, int rend,
                                               int lane, int ks, uint32_t a[4])
{
    const T onev = cu_fromf<T>(1.f);
    const uint32_t one = *(const uint16_t *)&onev;
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int q = 0; q < 4; q++) {
        const int row = r0 + g + 8 * (q & 1), k = 16 * ks + 2 * t + 8 * (q >> 1);
        const uint16_t *xr = (const uint16_t *)x + (size_t)row * ldx;
        uint32_t v[2];
#pragma unroll
        for (int e = 0; e < 2; e++)
            v[e] = row >= rend ? 0u : k + e < in ? xr[k + e] : k + e == in ? one : 0u;
        a[q] = v[0] | v[1] << 16;
    }
}

/* W1a's K-major wgmma descriptor: rows of 32 KS bytes swizzled at that
 * width (layout 2: 64 bytes, 3: 32), 8-row groups 256 KS bytes apart. */
template <int KS> __device__ __forceinline__ uint64_t mlp2_w1a_desc(const void *smem)
{
    return ((uint64_t)(smem_u32(smem) & 0x3FFFF) >> 4) | (1ull << 16) |
           ((uint64_t)((256 * KS) >> 4) << 32) | ((KS == 2 ? 2ull : 3ull) << 62);
}

/* Chunk j0's W2 and W1a into stage s by the CTA's NT threads (W1a's
 * 16-byte pieces swizzled as mlp2_w1a_desc reads them; zeros past hid). */
template <typename T, int NT, int KS>
__device__ __forceinline__ void mlp2_wgh_load(mlp2_wgh_stage<T, KS> *s, const mlp2_wg_copy<T, NT> &cp,
                                              const T *W1a, const T *W2, int ld2, int hid, int out,
                                              int n0, int j0, int tid)
{
    constexpr int KA = 16 * KS, P1 = MLP2_HC * 2 * KS;
    cp.load_w2(s->w2, W2, ld2, out, n0, j0, tid);
#pragma unroll
    for (int k = 0; k < (P1 + NT - 1) / NT; k++) {
        const int pc = tid + k * NT, j = pc / (2 * KS), c = pc % (2 * KS);
        if (pc < P1) {
            const int sw = KS == 2 ? (j >> 1) & 3 : (j >> 2) & 1;
            const bool ok = j0 + j < hid;
            cp_async16(&s->w1a[j * KA + ((c ^ sw) << 3)], ok ? W1a + (size_t)(j0 + j) * KA + c * 8 : W1a,
                       ok);
        }
    }
}

/* H of stage s's chunk (both halves, KS k-steps each) issued as one wgmma
 * group into h, not waited for. */
template <typename T, int KS>
__device__ __forceinline__ void mlp2_wgh_h(const mlp2_wgh_stage<T, KS> *s, const uint32_t (*xa)[4],
                                           float (*h)[32])
{
    wg_fence();
    wg_fence_regs<32>(h[0]);
    wg_fence_regs<32>(h[1]);
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
        const uint64_t dh = mlp2_w1a_desc<KS>(&s->w1a[hh * 64 * 16 * KS]);
#pragma unroll
        for (int ks = 0; ks < KS; ks++) wgmma_rs<T, 64, 0>::run(h[hh], xa[ks], dh + 2 * ks, ks);
    }
    wg_commit();
}

/* h (waited for) packed as P, act1 (RELU) in the conversion. */
template <typename T, bool RELU>
__device__ __forceinline__ void mlp2_wgh_p(float (*h)[32], uint32_t (*pk)[4])
{
    wg_fence_regs<32>(h[0]);
    wg_fence_regs<32>(h[1]);
#pragma unroll
    for (int hh = 0; hh < 2; hh++)
#pragma unroll
        for (int kk = 0; kk < 4; kk++)
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const float a = h[hh][8 * kk + 2 * q], b = h[hh][8 * kk + 2 * q + 1];
                pk[4 * hh + kk][q] = RELU ? pack2_relu<T>(a, b) : pack2<T>(a, b);
            }
}

/* A warpgroup kernel's place: its rows [r0, + 16) of the block's [.., rend),
 * outputs from n0, chunks [c0, c1) of its slice. */
struct mlp2_blk {
    int tid, lane, rend, r0, n0, c0, c1;
};
__device__ __forceinline__ mlp2_blk mlp2_block(int rows, int rows_cta, int hid, int per_slice)
{
    mlp2_blk b;
    b.tid = threadIdx.x;
    b.lane = b.tid & 31;
    const int warp = b.tid >> 5, nchunks = (hid + MLP2_HC - 1) / MLP2_HC;
    b.rend = min(rows, (int)(blockIdx.x + 1) * rows_cta);
    b.r0 = blockIdx.x * rows_cta + (warp >> 2) * 64 + (warp & 3) * 16;
    b.n0 = blockIdx.z * MLP2_NO;
    b.c0 = blockIdx.y * per_slice;
    b.c1 = min(nchunks, b.c0 + per_slice);
    return b;
}

/* x's fragments for every k-step of [x | 1 | 0]. */
template <typename T, int KS>
__device__ __forceinline__ void mlp2_xfrags_aug(const T *x, int ldx, int in, const mlp2_blk &b,
                                                uint32_t (*xa)[4])
{
#pragma unroll
    for (int ks = 0; ks < KS; ks++) mlp2_xfrag_aug<T>(x, ldx, in, b.r0, b.rend, b.lane, ks, xa[ks]);
}

/* Diagnostics of k_mlp2_wgh's bounds (its DG bits; bench/kernels/fmlp_proto.cu
 * times them, production runs DG = 0): each takes one part of a chunk's work
 * away, so its result is wrong and only its time means anything. */
#define MLP2_DG_NO_LOAD 1 /* stages loaded once (the prefill), never refilled */
#define MLP2_DG_NO_H 2    /* H's wgmma not issued (P from zeros) */
#define MLP2_DG_NO_Y 4    /* Y's wgmma not issued */
#define MLP2_DG_NO_P 8    /* H not converted to P (P stays zero) */

/* k_mlp2_wgh's ring of NS stages, on mbarriers rather than a CTA barrier a
 * chunk. That barrier was the kernel's top stall under ncu, but this ring
 * measured the same (H100: 74.5 us at 1120 rows, 17.2 at 70, either way;
 * bench/RESULTS.md 2026-12-07), so the stall was not what bounds it. Chunk
 * j of the slice lives in stage j % NS; empty[s] completes when every
 * warp's wait has retired the Y that read it (its lane 0). A refill of the
 * stage of chunk i - 2 with chunk i + NS - 2 follows chunk i's Y, so a
 * warpgroup runs up to a chunk ahead of the slowest. Every thread waits on
 * empty[] before a refill (thread 0 alone waiting, with the other warps
 * running on to full[], left warp 0's warpgroup carrying the ring's waits:
 * 7 us slower at 1120 rows, NOTES.md, thirtieth session). Two ways to fill:
 * - cp.async (MLP2_FILL_CP): every thread copies its share of the stage's
 *   16-byte pieces and arrives on full[s] once they land (NT arrivals).
 * - TMA (MLP2_FILL_TMA): thread 0 arrives on full[s] with the stage's
 *   bytes and issues three tensor copies (W2's two 128B-swizzled halves,
 *   W1a swizzled at its row width; zeros past hid and out), which complete
 *   full[s]; the consumers' copy instructions go. H100, 1120 rows: 74-75
 *   -> 66-68 us; 70 rows (the overlapped form): 18.7-20.1 -> 20.2-20.5,
 *   so that form keeps cp.async (mlp2_production).
 * The barriers live in static shared memory. */
#define MLP2_FILL_CP 0
#define MLP2_FILL_TMA 1
template <typename T, int NT, int NS, int KS, int FILL, int DG = 0> struct mlp2_ring {
    static constexpr bool TMA = FILL == MLP2_FILL_TMA;
    mlp2_wgh_stage<T, KS> *st;
    uint64_t *full, *empty;
    const mlp2_wg_copy<T, NT> &cp;
    const T *W1a, *W2;
    const CUtensorMap *tw2, *tw1a; /* TMA: mlp2_wgh_tmaps' maps */
    int ld2, hid, out, n0, c0, n, tid, lane;

    static constexpr uint32_t TX = (2 * MLP2_NO * 64 + MLP2_HC * 16 * KS) * sizeof(T);
    static constexpr int FULL = TMA ? 1 : NT; /* full[]'s arrivals a fill */

    /* Chunk j into its stage and the arrival on its full[] (TMA: thread 0's). */
    __device__ __forceinline__ void load(int j) const
    {
        uint64_t *f = &full[j % NS];
        const bool copy = !(DG & MLP2_DG_NO_LOAD) || j < NS - 2;
        const int j0 = (c0 + j) * MLP2_HC;
        if constexpr (TMA) {
            if (tid != 0) return;
            if (!copy) {
                mbar_arrive(f);
                return;
            }
            mlp2_wgh_stage<T, KS> *s = &st[j % NS];
            mbar_expect_tx(f, TX);
            tma_load_2d(s->w2, tw2, f, j0, n0);
            tma_load_2d(s->w2 + MLP2_NO * 64, tw2, f, j0 + 64, n0);
            tma_load_2d(s->w1a, tw1a, f, 0, j0);
        } else {
            if (copy) mlp2_wgh_load<T, NT, KS>(&st[j % NS], cp, W1a, W2, ld2, hid, out, n0, j0, tid);
            cp_async_mbar_arrive_noinc(f);
        }
    }
    __device__ __forceinline__ void prefill() const
    {
        if (TMA && tid == 0) {
            tma_prefetch_desc(tw2);
            tma_prefetch_desc(tw1a);
        }
        for (int j = 0; j < NS - 2 && j < n; j++) load(j);
    }
    /* Chunk j's stage, landed and visible to wgmma (cp.async's writes are
     * the generic proxy's, fenced for the async one). */
    __device__ __forceinline__ const mlp2_wgh_stage<T, KS> *ready(int j) const
    {
        mbar_wait(&full[j % NS], (j / NS) & 1);
        if constexpr (!TMA) fence_proxy_async();
        return &st[j % NS];
    }
    /* After chunk i's Y is issued, with chunk i - 1's Y retired by this
     * warp's last wait: that stage freed, chunk i + NS - 2 loaded. */
    __device__ __forceinline__ void advance(int i) const
    {
        if (i > 0 && lane == 0) mbar_arrive(&empty[(i - 1) % NS]);
        if (i + NS - 2 < n) {
            if (i >= 2) mbar_wait(&empty[(i - 2) % NS], ((i - 2) / NS) & 1);
            load(i + NS - 2);
        }
    }
};

/* k_mlp2_wgh's tensor maps for the TMA ring: W2 [out, hid] at ld2 in 64 x
 * 64 boxes, 128B-swizzled (a stage's half); W1a [hid, 16 KS] in 128-row
 * boxes swizzled at its row width (64 or 32 bytes, mlp2_w1a_desc's
 * layout). Out-of-bounds elements read as zeros. 0 or a CUresult. */
template <typename T, int KS>
static int mlp2_wgh_tmaps(const T *W1a, const T *W2, int ld2, int hid, int out, CUtensorMap *tw2,
                          CUtensorMap *tw1a)
{
    const uint64_t d2[2] = {(uint64_t)hid, (uint64_t)out}, s2[1] = {(uint64_t)ld2 * sizeof(T)};
    const uint64_t d1[2] = {16u * KS, (uint64_t)hid}, s1[1] = {16u * KS * sizeof(T)};
    const uint32_t b2[2] = {64, MLP2_NO}, b1[2] = {16u * KS, MLP2_HC};
    int rc = cu_tmap_encode(tw2, cu_tmap_dtype<T>(), 2, W2, d2, s2, b2, CU_TENSOR_MAP_SWIZZLE_128B);
    if (!rc)
        rc = cu_tmap_encode(tw1a, cu_tmap_dtype<T>(), 2, W1a, d1, s1, b1,
                            KS == 2 ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_32B);
    return rc;
}

/* NWG warpgroups of 64 rows over block b's slice. A warpgroup past the
 * block's rows computes on zeros and stores nothing.
 * OVL false (from 256 rows): a chunk is H (waited for: the wait also
 * retires the previous chunk's Y, so P is free), then Y += P W2^T (8
 * wgmma, not waited for).
 * OVL true (below 256 rows, where every slice is short and one chunk's
 * chain is what the SM waits on): chunk i + 1's H under chunk i's Y
 * (k_mlp2_wgo's overlap), two P sets, so one CTA an SM; the wait leaves
 * only Y(i) in flight. H past the slice's end is not issued.
 * FILL: how the ring fills its stages (mlp2_ring's MLP2_FILL_*; tw2 and
 * tw1a are mlp2_wgh_tmaps' maps, unread by the cp.async fill). */
template <typename T, int NWG, int NS, int KS, bool RELU, bool OVL, int FILL, int DG = 0>
__global__ void __launch_bounds__(128 * NWG, NWG >= 3 || OVL ? 1 : 2)
k_mlp2_wgh(const T *__restrict__ x, int ldx, int in, int rows, int rows_cta, const T *W1a,
           const T *W2, int ld2, int hid, int out, float *part, int per_slice,
           const __grid_constant__ CUtensorMap tw2, const __grid_constant__ CUtensorMap tw1a)
{
    static_assert(NS >= (OVL ? 4 : 3) && (KS == 1 || KS == 2),
                  "stages: Y's, (OVL: H's,) one retiring, one loading");
    constexpr int NT = 128 * NWG;
    extern __shared__ unsigned char smem_raw[];
    __shared__ uint64_t full[NS], empty[NS];
    auto *st = (mlp2_wgh_stage<T, KS> *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    const mlp2_blk b = mlp2_block(rows, rows_cta, hid, per_slice);
    if (b.tid == 0) {
        for (int i = 0; i < NS; i++) {
            mbar_init(&full[i], mlp2_ring<T, NT, NS, KS, FILL, DG>::FULL);
            mbar_init(&empty[i], NT / 32);
        }
        mbar_fence_init();
    }
    __syncthreads();
    const mlp2_wg_copy<T, NT> cp(W2, ld2, b.n0, b.tid);
    const mlp2_ring<T, NT, NS, KS, FILL, DG> ring = {st,  full, empty, cp,  W1a, W2,   &tw2,
                                                    &tw1a, ld2, hid, out, b.n0, b.c0, b.c1 - b.c0,
                                                    b.tid, b.lane};
    const int n = ring.n;
    uint32_t xa[KS][4];
    mlp2_xfrags_aug<T, KS>(x, ldx, in, b, xa);
    ring.prefill();
    float y[MLP2_NO / 8][4] = {}, h[2][32] = {};
    /* a chunk's three steps, each skipped by its DG bit */
    auto p_zero = [](uint32_t (*pk)[4]) {
        for (int k = 0; k < MLP2_HC / 16; k++) pk[k][0] = pk[k][1] = pk[k][2] = pk[k][3] = 0u;
    };
    auto hs = [&](const mlp2_wgh_stage<T, KS> *s) {
        if constexpr (!(DG & MLP2_DG_NO_H)) mlp2_wgh_h<T, KS>(s, xa, h);
    };
    auto ps = [&](uint32_t (*pk)[4]) {
        if constexpr (!(DG & MLP2_DG_NO_P)) mlp2_wgh_p<T, RELU>(h, pk);
    };
    auto ys = [&](const mlp2_wgh_stage<T, KS> *s, uint32_t (*pk)[4]) {
        if constexpr (!(DG & MLP2_DG_NO_Y)) mlp2_wg_mma<T>(s->w2, pk, y);
    };
    if constexpr (OVL) {
        uint32_t p0[MLP2_HC / 16][4], p1[MLP2_HC / 16][4];
        if constexpr (DG & MLP2_DG_NO_P) {
            p_zero(p0);
            p_zero(p1);
        }
        auto turn = [&](int i, uint32_t (*pc)[4], uint32_t (*pn)[4]) {
            if (i + 1 < n) hs(ring.ready(i + 1));
            ys(&st[i % NS], pc);
            wg_wait<1>(); /* H(i + 1) and Y(i - 1) done */
            if (i + 1 < n) ps(pn);
            ring.advance(i);
        };
        if (n > 0) {
            hs(ring.ready(0));
            wg_wait<0>();
            ps(p0);
        }
        int i = 0;
        for (; i + 1 < n; i += 2) {
            turn(i, p0, p1);
            turn(i + 1, p1, p0);
        }
        if (i < n) turn(i, p0, p1);
    } else {
        uint32_t pk[MLP2_HC / 16][4];
        if constexpr (DG & MLP2_DG_NO_P) p_zero(pk);
        for (int i = 0; i < n; i++) {
            const mlp2_wgh_stage<T, KS> *s = ring.ready(i);
            hs(s);
            wg_wait<0>(); /* H(i) and Y(i - 1) done */
            ps(pk);
            ys(s, pk);
            ring.advance(i);
        }
    }
    wg_wait<0>();
    wg_fence_regs<MLP2_NO / 2>(&y[0][0]);
    mlp2_store_part(part + (size_t)blockIdx.y * rows * out, y, b.r0, b.rend, b.n0, out, b.lane);
}

/* y[r, n] = act2(add[r, n] + the S slices' partials + addu[map[r], n]): W
 * warps (1, 2, 4 or 8) share 32 outputs, warp w summing the slices s = w mod
 * W in order, then the first adds the W sums in warp order to add, then
 * addu (a fixed order for a given S and W, every row alike), then act2,
 * one rounding. Many outputs keep every SM busy with W = 1; few need the
 * split (mlp2_sum_ways). */
struct mlp2_tail {
    const void *add, *addu;
    const int32_t *map;
    int ldadd, act2;
};

template <typename T, int W>
__global__ void __launch_bounds__(256) k_mlp2_sum(const float *part, int S, mlp2_tail t, T *y,
                                                  int ldy, int rows, int out)
{
    static_assert(W == 1 || W == 2 || W == 4 || W == 8, "W divides a block's 8 warps");
    __shared__ float accw[8][32];
    const size_t total = (size_t)rows * out, step = (size_t)256 / W;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, way = warp % W;
    for (size_t b0 = (size_t)blockIdx.x * step; b0 < total; b0 += (size_t)gridDim.x * step) {
        const size_t i = b0 + (size_t)(warp / W) * 32 + lane;
        float acc = 0.f;
        if (i < total) {
#pragma unroll 4
            for (int sl = way; sl < S; sl += W) acc += part[(size_t)sl * total + i];
        }
        if (W > 1) {
            accw[warp][lane] = acc;
            __syncthreads();
            if (way == 0)
#pragma unroll
                for (int w = 1; w < W; w++) acc += accw[warp + w][lane];
        }
        if (way == 0 && i < total) {
            const size_t r = i / out, n = i % out;
            float v = (t.add ? cu_tof<T>(((const T *)t.add)[r * t.ldadd + n]) : 0.f) + acc;
            if (t.addu) v += cu_tof<T>(((const T *)t.addu)[(size_t)(t.map ? t.map[r] : r) * out + n]);
            y[r * ldy + n] = cu_fromf<T>(cu_act_f(v, t.act2));
        }
        if (W > 1) __syncthreads();
    }
}

/* The sum's split: the fewest ways that give every SM 16 warps (on an H200,
 * bench/RESULTS.md: 1120 x 64 outputs over 29 slices 8.6 us with 1 way, 10.0
 * with 8; 70 x 64 over 248 slices 8.7 us with 8, 17.3 with 1). */
static int mlp2_sum_ways(size_t outputs, int sm_count)
{
    const size_t warps = (outputs + 31) / 32;
    int w = 1;
    while (w < 8 && warps * w < (size_t)16 * sm_count) w *= 2;
    return w;
}

template <typename T>
static void mlp2_sum(int ways, cudaStream_t st, const float *part, int S, const mlp2_tail &t, T *y,
                     int ldy, int rows, int out)
{
    const unsigned g = cu_grid_for(((size_t)rows * out * ways + 255) / 256, 1);
    switch (ways) {
    case 1: k_mlp2_sum<T, 1><<<g, 256, 0, st>>>(part, S, t, y, ldy, rows, out); break;
    case 2: k_mlp2_sum<T, 2><<<g, 256, 0, st>>>(part, S, t, y, ldy, rows, out); break;
    case 4: k_mlp2_sum<T, 4><<<g, 256, 0, st>>>(part, S, t, y, ldy, rows, out); break;
    default: k_mlp2_sum<T, 8><<<g, 256, 0, st>>>(part, S, t, y, ldy, rows, out); break;
    }
}

/* The composition for what k_mlp2 does not take: MLP2_CHUNK hidden units at
 * a time through linear (views of W1's rows, b1's and W2's columns), the
 * step's product into yc, added to y (add first). */
static int mlp2_composed(bk_stream *s, const void *x, int ldx, int rows, const bk_weight *w1,
                         const bk_weight *b1, enum bk_act act1, const bk_weight *w2,
                         const void *add, int ldadd, void *y, int ldy, bk_err *err)
{
    const int hid = w1->rows, out = w2->rows, as = (int)s->be->act_size;
    const int cn_max = hid < MLP2_CHUNK ? hid : MLP2_CHUNK;
    const size_t hbytes = (size_t)rows * cn_max * as, ybytes = (size_t)rows * out * as;
    if (cu_scratch_get(s, &s->mlp2_part, hbytes + ybytes, err)) return -1;
    char *h = (char *)s->mlp2_part.p, *yc = h + hbytes;
    if (hid == 0) return cu_add_rows(s, add, ldadd, NULL, 0, NULL, y, ldy, rows, out, "mlp2", err);
    for (int j0 = 0; j0 < hid; j0 += MLP2_CHUNK) {
        const int cn = hid - j0 < MLP2_CHUNK ? hid - j0 : MLP2_CHUNK;
        bk_weight v1 = {cn, w1->cols, w1->ld, (char *)w1->data + (size_t)j0 * w1->ld * as, 0};
        bk_weight vb = {1, cn, cn, b1 ? (char *)b1->data + (size_t)j0 * as : NULL, 0};
        bk_weight v2 = {out, cn, w2->ld, (char *)w2->data + (size_t)j0 * as, 0};
        if (cuda_linear(s, x, ldx, rows, &v1, b1 ? &vb : NULL, act1, h, cn_max, err) ||
            cuda_linear(s, h, cn_max, rows, &v2, NULL, BK_ACT_NONE, yc, out, err))
            return -1;
        const void *base = j0 ? y : add;
        if (cu_add_rows(s, base, j0 ? ldy : ldadd, yc, out, NULL, y, ldy, rows, out, "mlp2 add", err))
            return -1;
    }
    return 0;
}

/* A launch's shape: CTAs of `units` row units of `unit` rows (k_mlp2: a
 * warp's 16 RT rows; k_mlp2_wgo (wg): a warpgroup's 64), NS stages; rb row
 * blocks of rows_cta rows (balanced: the last block is not mostly padding),
 * zt output tiles, S slices of per chunks, at most cps CTAs an SM. */
struct mlp2_plan {
    int unit, units, ns, wg, rb, rows_cta, zt, S, per;
    int ks;  /* k_mlp2_wgh: W1a's k-steps (1 or 2); 0: the other kernels */
    int ovl; /* k_mlp2_wgh's overlapped form */
};

static mlp2_plan mlp2_plan_for(int rows, int hid, int out, int sm_count, int unit, int units,
                               int ns, int wg, int cps)
{
    mlp2_plan p = {unit, units, ns, wg, 0, 0, 0, 0, 0, 0, 0};
    const int cap = unit * units, nchunks = (hid + MLP2_HC - 1) / MLP2_HC;
    p.rb = (rows + cap - 1) / cap;
    p.rows_cta = ((rows + p.rb - 1) / p.rb + unit - 1) / unit * unit;
    p.zt = (out + MLP2_NO - 1) / MLP2_NO;
    int S = cps * sm_count / (p.rb * p.zt); /* one wave */
    S = S < 1 ? 1 : S > nchunks ? nchunks : S;
    p.per = (nchunks + S - 1) / S;
    p.S = (nchunks + p.per - 1) / p.per;
    return p;
}

static_assert(sizeof(mlp2_stage<__half>) == sizeof(mlp2_stage<__nv_bfloat16>) &&
                  sizeof(mlp2_wg_stage<__half>) == sizeof(mlp2_wg_stage<__nv_bfloat16>),
              "one stage size");

/* Dynamic shared memory: the stages (the wgmma kernels' aligned to 1 KiB in it). */
static size_t mlp2_smem(const mlp2_plan &p)
{
    if (p.ks)
        return (size_t)p.ns * (p.ks == 2 ? sizeof(mlp2_wgh_stage<__half, 2>)
                                         : sizeof(mlp2_wgh_stage<__half, 1>)) + 1024;
    return p.wg ? (size_t)p.ns * sizeof(mlp2_wg_stage<__half>) + 1024
                : (size_t)p.ns * sizeof(mlp2_stage<__half>);
}

/* Production's shapes (bench/RESULTS.md). With W1a (bf16 or fp16, in <=
 * 16): from 256 rows k_mlp2_wgh, 3 warpgroups of 64 rows, 4 stages filled
 * by TMA, one CTA an SM; below, its overlapped form (OVL), 2 warpgroups, 5
 * stages filled by cp.async (H100: 66-68 and 17-20 us at 1120 and 70
 * rows). Without (a graph captured before
 * W1a was built): from 256 rows k_mlp2_wgo, 2 warpgroups, 4
 * stages; below, k_mlp2 with 16 rows a warp, 8 warps, 4 stages; ~2 CTAs an
 * SM. mlp2_launch instantiates these from the same constants, so the plan
 * and the launched kernel cannot disagree. */
#define MLP2_PROD_NWG 2  /* k_mlp2_wgo's warpgroups */
#define MLP2_PROD_NW 8   /* k_mlp2's warps (one m-tile each) */
#define MLP2_PROD_NS 4   /* stages, both */
#define MLP2_WGH_NWG 3   /* k_mlp2_wgh's warpgroups */
#define MLP2_WGH_NS 4    /* its stages */
#define MLP2_WGHO_NWG 2  /* the overlapped form's */
#define MLP2_WGHO_NS 5
#define MLP2_WGH_FILL MLP2_FILL_TMA  /* how each form fills its stages (mlp2_ring) */
#define MLP2_WGHO_FILL MLP2_FILL_CP

static mlp2_plan mlp2_production(int rows, int hid, int out, int sm_count, int ks)
{
    mlp2_plan p;
    if (ks && rows >= 256)
        p = mlp2_plan_for(rows, hid, out, sm_count, 64, MLP2_WGH_NWG, MLP2_WGH_NS, 1, 1);
    else if (ks) {
        p = mlp2_plan_for(rows, hid, out, sm_count, 64, MLP2_WGHO_NWG, MLP2_WGHO_NS, 1, 1);
        p.ovl = 1;
    }
    else if (rows >= 256)
        return mlp2_plan_for(rows, hid, out, sm_count, 64, MLP2_PROD_NWG, MLP2_PROD_NS, 1, 2);
    else
        return mlp2_plan_for(rows, hid, out, sm_count, 16, MLP2_PROD_NW, MLP2_PROD_NS, 0, 2);
    p.ks = ks;
    return p;
}

template <typename T, int RT, int NW, int NS>
static void mlp2_run(const mlp2_plan &p, cudaStream_t st, const T *x, int ldx, int in, int rows,
                     const T *W1, int ld1, const T *b1, int relu, const T *W2, int ld2, int hid,
                     int out, float *part)
{
    k_mlp2<T, RT, NW, NS><<<dim3(p.rb, p.S, p.zt), 32 * NW, mlp2_smem(p), st>>>(
        x, ldx, in, rows, p.rows_cta, W1, ld1, b1, relu, W2, ld2, hid, out, part, p.per);
}

/* k_mlp2_wgo's instance for act1 (relu or none). */
template <typename T, int NWG, int NS> static const void *mlp2_wgo_fn(int relu)
{
    return relu ? (const void *)k_mlp2_wgo<T, NWG, NS, true>
                : (const void *)k_mlp2_wgo<T, NWG, NS, false>;
}

template <typename T, int NWG, int NS>
static void mlp2_run_wgo(const mlp2_plan &p, cudaStream_t st, const T *x, int ldx, int in,
                         int rows, const T *W1, int ld1, const T *b1, int relu, const T *W2,
                         int ld2, int hid, int out, float *part)
{
    auto k = relu ? k_mlp2_wgo<T, NWG, NS, true> : k_mlp2_wgo<T, NWG, NS, false>;
    k<<<dim3(p.rb, p.S, p.zt), 128 * NWG, mlp2_smem(p), st>>>(
        x, ldx, in, rows, p.rows_cta, W1, ld1, b1, W2, ld2, hid, out, part, p.per);
}

/* The kernel mlp2_run_wgh launches for plan p. */
template <typename T, int KS, bool RELU> static const void *mlp2_wgh_fn(const mlp2_plan &p)
{
    return !p.ovl
               ? (const void *)k_mlp2_wgh<T, MLP2_WGH_NWG, MLP2_WGH_NS, KS, RELU, false, MLP2_WGH_FILL>
               : (const void *)k_mlp2_wgh<T, MLP2_WGHO_NWG, MLP2_WGHO_NS, KS, RELU, true, MLP2_WGHO_FILL>;
}

/* k_mlp2_wgh (overlapped below 256 rows), as mlp2_production planned; 0 or
 * a CUresult from encoding its tensor maps. */
template <typename T, int KS, bool RELU>
static int mlp2_run_wgh(const mlp2_plan &p, cudaStream_t st, const T *x, int ldx, int in, int rows,
                        const T *W1a, const T *W2, int ld2, int hid, int out, float *part)
{
    CUtensorMap tw2 = {}, tw1a = {};
    const int fill = p.ovl ? MLP2_WGHO_FILL : MLP2_WGH_FILL;
    const int rc = fill == MLP2_FILL_TMA ? mlp2_wgh_tmaps<T, KS>(W1a, W2, ld2, hid, out, &tw2, &tw1a)
                                         : 0;
    if (rc) return rc;
    const dim3 g(p.rb, p.S, p.zt);
    if (!p.ovl)
        k_mlp2_wgh<T, MLP2_WGH_NWG, MLP2_WGH_NS, KS, RELU, false, MLP2_WGH_FILL>
            <<<g, 128 * MLP2_WGH_NWG, mlp2_smem(p), st>>>(x, ldx, in, rows, p.rows_cta, W1a, W2, ld2,
                                                         hid, out, part, p.per, tw2, tw1a);
    else
        k_mlp2_wgh<T, MLP2_WGHO_NWG, MLP2_WGHO_NS, KS, RELU, true, MLP2_WGHO_FILL>
            <<<g, 128 * MLP2_WGHO_NWG, mlp2_smem(p), st>>>(x, ldx, in, rows, p.rows_cta, W1a, W2,
                                                          ld2, hid, out, part, p.per, tw2, tw1a);
    return 0;
}

/* The kernel mlp2_launch runs for plan p. */
template <typename T>
static const void *mlp2_fn(const mlp2_plan &p, int relu)
{
    if (p.ks == 2) return relu ? mlp2_wgh_fn<T, 2, true>(p) : mlp2_wgh_fn<T, 2, false>(p);
    if (p.ks == 1) return relu ? mlp2_wgh_fn<T, 1, true>(p) : mlp2_wgh_fn<T, 1, false>(p);
    return p.wg ? mlp2_wgo_fn<T, MLP2_PROD_NWG, MLP2_PROD_NS>(relu)
                : (const void *)k_mlp2<T, 1, MLP2_PROD_NW, MLP2_PROD_NS>;
}

/* W1a = [W1 | b1 | 0] of 16 ks columns for w1 and b1, in T: built by the
 * first call that needs it (on its stream, which is then synchronized, so
 * every stream sees it whole), kept in w1->aug and freed with w1 (a weight
 * is immutable once loaded). *out stays NULL, and the caller runs the
 * kernels without W1a, while the stream captures a graph and W1a is not
 * built yet (no allocation there), or when w1 was augmented with another
 * b1. -1 on a CUDA error (err set). */
template <typename T>
static int mlp2_w1a(bk_stream *s, const bk_weight *w1, const bk_weight *b1, int ks, const T **out,
                    bk_err *err)
{
    cuda_backend *cb = cu_impl(s->be);
    bk_weight *w = (bk_weight *)w1; /* aug: w1's cache, under the lock */
    const void *key = b1 ? b1->data : NULL;
    const int ka = 16 * ks;
    int rc = 0;
    *out = NULL;
    pthread_mutex_lock(&cb->lock);
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (!w->aug && cudaStreamIsCapturing(s->st, &cs) == cudaSuccess &&
        cs == cudaStreamCaptureStatusNone) {
        const size_t bytes = (size_t)w1->rows * ka * sizeof(T);
        void *p = cu_dev_malloc(s->be, bytes, err);
        if (!p) {
            rc = -1;
        } else {
            k_mlp2_w1a<T><<<cu_grid_for(((size_t)w1->rows * ka + 255) / 256, 1), 256, 0, s->st>>>(
                (const T *)w1->data, w1->ld, b1 ? (const T *)b1->data : NULL, w1->cols, w1->rows,
                ka, (T *)p);
            if (cu_check_launch(s, err, "mlp2 W1a") ||
                cu_check(cudaStreamSynchronize(s->st), err, "mlp2 W1a")) {
                cudaFree(p);
                rc = -1;
            } else {
                w->aug = p;
                w->aug_key = key;
                w->aug_bytes = bytes;
                bk_ledger_weights(&cb->ledger, bytes, 0);
            }
        }
    }
    if (w->aug && w->aug_key == key) *out = (const T *)w->aug;
    pthread_mutex_unlock(&cb->lock);
    return rc;
}

/* mlp2's compulsory work for the profile (its addend's linear is profiled
 * as a linear of its own). */
static void mlp2_work(cu_prof_scope &prof, int rows, int in, int hid, int out, size_t act_size)
{
    if (prof.on())
        prof.work(2.0 * rows * hid * (in + out),
                  ((double)rows * (in + out) + (double)hid * (in + out + 1)) * act_size);
}

/* SMs the hidden layer's kernel leaves to the addend's linear when the two
 * run side by side (mlp2_launch). The kernel is one wave of one CTA an SM;
 * the linear (the fold's other parts: 1120 x [32768 -> 64] at the bench
 * model's 16 x 70) is memory-bound on the whole GPU (38 us) and needs only
 * a share of its SMs' time, so on a few SMs it ends about when the kernel,
 * slowed by their share, does. The linear is planned for those SMs
 * (cuBLASLt's SM count target); planned for the whole GPU, its grid queued
 * behind the kernel's and took 82 us beside it. 14 was the best of 8, 14,
 * 20 and 24 on the H100 (bench/RESULTS.md, thirty-third session), where the
 * linear took 71 us, as the two's SM time says (bench/kernels/NOTES.md);
 * cuBLASLt's pick is not monotonic in the target (24 SMs: 108 us; 20: 61;
 * 8: 157). */
#ifndef MLP2_ADDEND_SMS /* (a -D for a timing build only) */
#define MLP2_ADDEND_SMS 14
#endif
/* Rows from which the two run side by side; below it the linear runs after
 * the kernel on the stream, on the whole GPU. At 70 rows the pair was 9 us
 * faster alone, but the daemon's four instances at 1 x 70 served 9-12%
 * fewer candidates/s (why is not established; the linear planned for 14
 * SMs takes 24 us there against 13 on all); at 1120 rows 3.5-5.7% more
 * (bench/RESULTS.md, thirty-third session). Nothing was measured between:
 * 256 is where the kernel's plan changes form (mlp2_production). */
#define MLP2_BESIDE_MIN_ROWS 256

/* Production's kernel (mlp2_production's plan), the addend's linear and
 * k_mlp2_sum, in T (bf16 or fp16). With an addend of MLP2_BESIDE_MIN_ROWS
 * rows or more, the kernel, planned for MLP2_ADDEND_SMS fewer SMs, is
 * launched on the stream, so its one-CTA-an-SM grid is dispatched as soon
 * as the stream's previous op ends, and the linear (cuBLASLt planned for
 * MLP2_ADDEND_SMS SMs, into y) on the stream's lane, which waits for that
 * same point by an event and so starts a moment later, on the SMs the
 * kernel left; the sum waits for both. (The other way round, the linear on
 * the stream took every SM first: bench/RESULTS.md, thirty-second session.)
 * A lane's own call (no lane of its own) runs them in turn on the same
 * plan, so a result never depends on where it ran. Fewer rows: the kernel
 * and the linear in turn on the stream, each on the whole GPU. */
template <typename T>
static int mlp2_launch(bk_stream *s, const void *x, int ldx, int in, int rows, const bk_weight *w1,
                       const bk_weight *b1, int relu, const bk_weight *w2,
                       const bk_mlp2_addend *a, mlp2_tail t, void *y, int ldy, bk_err *err)
{
    const int out = w2->rows, hid = w1->rows, ks = in < 16 ? 1 : 2;
    const T *w1a = NULL;
    if (mlp2_w1a<T>(s, w1, b1, ks, &w1a, err)) return -1;
    const int beside = a && rows >= MLP2_BESIDE_MIN_ROWS ? MLP2_ADDEND_SMS : 0;
    const int sms = cu_impl(s->be)->sm_count - beside;
    const mlp2_plan p = mlp2_production(rows, hid, out, sms > 8 ? sms : 8, w1a ? ks : 0);
    bk_stream *ln = beside && !s->owner ? s->be->lane(s, err) : NULL;
    if ((beside && !s->owner && !ln) || (ln && s->be->lane_wait(ln, s, err)) ||
        cu_scratch_get(s, &s->mlp2_part, (size_t)p.S * rows * out * sizeof(float), err) ||
        cu_smem_limit(s, mlp2_fn<T>(p, relu), (int)mlp2_smem(p), err))
        return -1;
    float *part = (float *)s->mlp2_part.p;
    const T *W2 = (const T *)w2->data;
    {
        cu_prof_scope prof_(s, "mlp2");
        mlp2_work(prof_, rows, in, hid, out, s->be->act_size);
        if (p.ks) {
            auto run = p.ks == 2 ? (relu ? mlp2_run_wgh<T, 2, true> : mlp2_run_wgh<T, 2, false>)
                                 : (relu ? mlp2_run_wgh<T, 1, true> : mlp2_run_wgh<T, 1, false>);
            const int rc = run(p, s->st, (const T *)x, ldx, in, rows, w1a, W2, w2->ld, hid, out,
                               part);
            if (rc) {
                bk_seterr(err, "mlp2: encoding a TMA tensor map failed (CUresult %d; hidden %d, "
                          "out %d, W2's ld %d)", rc, hid, out, w2->ld);
                return -1;
            }
        } else {
            auto run = p.wg ? mlp2_run_wgo<T, MLP2_PROD_NWG, MLP2_PROD_NS>
                            : mlp2_run<T, 1, MLP2_PROD_NW, MLP2_PROD_NS>;
            run(p, s->st, (const T *)x, ldx, in, rows, (const T *)w1->data, w1->ld,
                b1 ? (const T *)b1->data : NULL, relu, W2, w2->ld, hid, out, part);
        }
        if (cu_check_launch(s, err, "mlp2")) return -1;
    }
    if (a) {
        if (cu_linear_on_sms(ln ? ln : s, beside, a->x, a->ldx, rows, a->w, a->b, BK_ACT_NONE,
                             y, ldy, err))
            return -1;
        t.add = y;
        t.ldadd = ldy;
    }
    if (ln && s->be->lane_wait(s, ln, err)) return -1;
    cu_prof_scope prof_(s, "mlp2");
    prof_.work(0, 0); /* the sum's share of mlp2's one floor (above) */
    mlp2_sum<T>(mlp2_sum_ways((size_t)rows * out, cu_impl(s->be)->sm_count), s->st, part, p.S, t,
                (T *)y, ldy, rows, out);
    return cu_check_launch(s, err, "mlp2 sum");
}

int cuda_mlp2(bk_stream *s, const void *x, int ldx, int rows, const bk_weight *w1,
              const bk_weight *b1, enum bk_act act1, const bk_weight *w2,
              const bk_mlp2_addend *a, const void *addu, const int32_t *map, enum bk_act act2,
              void *y, int ldy, bk_err *err)
{
    if (a && !a->w) {
        bk_seterr(err, "mlp2: the addend's weight is NULL");
        return -1;
    }
    if (bk_mlp2_check(w1 && w2, rows, w1 ? w1->cols : 0, w1 ? w1->rows : 0, w2 ? w2->rows : 0,
                      w2 ? w2->cols : 0, b1 ? (int64_t)b1->rows * b1->cols : -1, act1, act2, ldx,
                      ldy, a ? a->w->cols : -1, a ? a->w->rows : 0, a ? a->ldx : 0,
                      a && a->b ? (int64_t)a->b->rows * a->b->cols : -1, err))
        return -1;
    const int in = w1->cols, hid = w1->rows, out = w2->rows;
    if (rows == 0 || out == 0) return 0;
    if (cu_enter(s, err)) return -1;
    const enum cu_dtype dt = cu_dt(s);
    if (dt == CU_F32 || w1->ld > BK_MLP2_FUSED_MAX_IN || hid == 0) {
        /* the addend into y, then the composition adds to it in place */
        if (a && cuda_linear(s, a->x, a->ldx, rows, a->w, a->b, BK_ACT_NONE, y, ldy, err))
            return -1;
        cu_prof_scope prof_(s, "mlp2");
        mlp2_work(prof_, rows, in, hid, out, s->be->act_size);
        if (mlp2_composed(s, x, ldx, rows, w1, b1, act1, w2, a ? y : NULL, ldy, y, ldy, err) ||
            (addu && cu_add_rows(s, y, ldy, addu, out, map, y, ldy, rows, out, "mlp2 addu", err)))
            return -1;
        return act2 == BK_ACT_NONE ? 0 : cu_act_rows(s, y, ldy, rows, out, act2, err);
    }
    const int relu = act1 == BK_ACT_RELU;
    const mlp2_tail t = {NULL, addu, map, 0, (int)act2};
    return dt == CU_BF16
               ? mlp2_launch<__nv_bfloat16>(s, x, ldx, in, rows, w1, b1, relu, w2, a, t, y, ldy, err)
               : mlp2_launch<__half>(s, x, ldx, in, rows, w1, b1, relu, w2, a, t, y, ldy, err);
}
