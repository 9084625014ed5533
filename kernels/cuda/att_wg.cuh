/* att_wg.cuh - the warp-specialized wgmma attention kernel template, which
 * production and the kernel benchmark both instantiate.
 *
 * Why this exists: attention.cu serves target and self attention at dh 64
 * and 128 (bf16/fp16) with k_att_wg, ping-pong and softmax overlap on. The
 * timing diagnostics that switch those features off (the former
 * IKBO_ATT_WG_DIAG letters) differ only in template parameters and launch
 * flags; bench/kernels/attention_v3.cu instantiates them from here, so the
 * kernel body is written once and the serving library carries only the
 * instantiation it uses. Include after cuda_internal.h.
 */
#ifndef IKBO_ATT_WG_CUH
#define IKBO_ATT_WG_CUH

#include <math.h>

#include "kernels/cuda/cuda_internal.h"
#include "kernels/cuda/mma_util.cuh"
#include "kernels/cuda/tma_util.cuh"
#include "kernels/cuda/wgmma_gen.cuh"

/* One attention launch: a target part (q, map, nc, tq -> o), a self part
 * (qs over ev event rows -> os), or both (a fused self + target launch). */
template <typename T> struct att_job {
    const T *q, *k, *v, *qs;
    T *o, *os;
    const int64_t *off;
    const int32_t *map;
    int nu, nc, tq, heads, causal, silu;
    int ldkv; /* K/V row stride in elements (>= heads * dh) */
    int64_t ev; /* event rows: self part sizing */
    int64_t go; /* target part: elements between candidates' output spans (>= tq * heads * dh) */
};

/* Target query row `row` = c * tq + i's output row: candidate c's span at
 * o + c * go, its rows hd apart (backend.h's attention). go = tq * hd is
 * packed; self rows are packed (tq 1, go hd). Epilogues only: one division
 * a row, in the row's own type R (int in the tensor-core kernels, whose
 * rows are ints; long in the SIMT one). Not in 64 bits for an int row: in
 * k_att_wg that form spilled one more register and the attention took 10%
 * longer at the bench model's 16 x 70 (bench/RESULTS.md, thirty-fifth
 * session). */
template <typename T, typename R>
__device__ __forceinline__ T *att_orow(T *o, R row, int tq, int64_t go, int hd)
{
    const R c = row / (R)tq;
    return o + c * go + (int64_t)(row - c * (R)tq) * hd;
}

/* Builds the tile table(s) of a launch into the stream's scratch: target
 * tiles of at most 128 query rows first, then self tiles (longest first).
 * *ntiles (device) gets the total, *cap the table's capacity. attention.cu. */
int cu_att_tiles(bk_stream *s, bool target, bool self, const int32_t *map, int nc, int tq,
                 const int64_t *off, int nu, int causal, int64_t ev, int4 **tiles, int **ntiles,
                 long *cap, bk_err *err);

/* -------------------------------------------------------- wgmma (Hopper) */

/* Warp-specialized, persistent, ping-pong (the FA3 recipe):
 * - 384 threads: warpgroup 0 is the producer (56 registers), warpgroups 1
 *   and 2 are consumers (224 registers; ATTW_PRODUCER_REGS) that each own
 *   64 query rows of a 128-row tile. One CTA per SM loops
 *   over (tile, head) work items w = blockIdx.x, + gridDim.x, ... in tile
 *   table order (w = tile * heads + head), so the CTAs in flight cover a
 *   few users' K/V at a time and share it through L2.
 * - The producer copies K/V blocks of 128 keys into a ring of STAGES
 *   shared stages: a whole block (inside the user's history) by TMA, one
 *   thread issuing the boxes with the transaction bytes (ATTW_TMA_KV);
 *   the partial last block with cp.async, zero-filling keys past L_u, so
 *   nothing past a user's history, or past the tensor, is read; and the
 *   tile's Q (rows past the tile zero-filled) with cp.async. Each block
 *   completes on a "full" mbarrier of 128 arrivals (the TMA thread's
 *   arrive.expect_tx and 127 plain ones, or each thread's
 *   cp.async.mbarrier.arrive.noinc). Consumers free
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

/* Registers a thread after setmaxnreg: the CTA is launched with 168 a
 * thread (384 threads, one CTA an SM), and what the producer's 128 threads
 * give back the consumers' 256 take, exactly: (168 - P) 128 = (C - 168) 256.
 * At P = 56 ptxas reports 48 bytes of spills in the dh 128 instances, all
 * in the producer: fewer producer registers spill more though the
 * consumers gain them (P = 40: 216 bytes), and P = 72 (C = 216) spills
 * none (ptxas -v; bench/kernels/spills.sh), and times the same as 56 (the
 * spills are off the K/V issue path: bench/RESULTS.md, thirty-sixth
 * session); a -D build of this file sets another P. */
#ifndef ATTW_PRODUCER_REGS
#define ATTW_PRODUCER_REGS 56
#endif
#define ATTW_CONSUMER_REGS (168 + (168 - ATTW_PRODUCER_REGS) / 2)
static_assert(ATTW_PRODUCER_REGS % 8 == 0 && ATTW_CONSUMER_REGS % 8 == 0 &&
                  ATTW_PRODUCER_REGS >= 24 && ATTW_CONSUMER_REGS <= 256,
              "setmaxnreg: multiples of 8 in [24, 256], the producer's and consumers' sum kept");

#define ATTW_PP_BAR 1 /* named barriers 1, 2: consumer warpgroup 0, 1's turn */
#define ATTW_MAX_SLACK 8.0f /* log2 of how far P may exceed 1 (softmax_p) */
#define ATTW_PREFETCH_Q 1 /* flags: the next tile's Q rows into L2 */
#define ATTW_VEC_STORE 2  /* flags: o is 16-byte aligned, store 16 bytes at a time */
#define ATTW_TMA_KV 4     /* flags: whole K/V blocks by TMA (a.tk, a.tv), partial ones by cp.async */
/* Timing diagnostics (k_att_wg's DG; wrong results by design, benchmark
 * only): the consumers skip the softmax (S packed as P as it is), or the
 * producer marks K/V blocks full without copying them. */
#define ATTW_DG_NO_SOFTMAX 1
#define ATTW_DG_NO_KV 2
#define ATTW_DG_NO_EX2 4 /* the softmax without its exponentials (MUFU): P = the exponent */
#define ATTW_DG_TRACE 8  /* CTA 0 records when each step of its turns ends (att_trace) */

#ifdef IKBO_ATT_TRACE
/* ATTW_DG_TRACE's record (benchmark only: the translation unit that defines
 * IKBO_ATT_TRACE gets its own copy): per consumer warpgroup of CTA 0, lane
 * 0 of its first warp writes clock64() << 4 | step, steps ATTW_TR_*. */
#define ATT_TRACE_N 8192
__device__ unsigned long long att_trace[2][ATT_TRACE_N];
__device__ int att_trace_n[2];
#endif
enum {
    ATTW_TR_TOP = 1,   /* a turn's code starts (before its K/V wait) */
    ATTW_TR_FULL,      /* its K/V block is there */
    ATTW_TR_TURN,      /* the turn is this warpgroup's (named barrier) */
    ATTW_TR_ISSUED,    /* its GEMMs are issued */
    ATTW_TR_S,         /* S is done */
    ATTW_TR_SOFTMAX,   /* P is made */
    ATTW_TR_PV,        /* the previous block's P V is done */
    ATTW_TR_END,       /* O rescaled, P packed: the turn's code ends */
    ATTW_TR_ITEM,      /* a work item starts (before its Q wait) */
    ATTW_TR_Q,         /* its Q is there */
    ATTW_TR_STORED,    /* its output is stored */
    ATTW_TR_MAX,       /* inside the softmax: the block's row max is known */
    ATTW_TR_EXP,       /* inside the softmax: P and its row sums are made */
    ATTW_TR_STEPS
};

/* The wgmma kernel's arguments. A tile's .w bit 0 marks a self-attention
 * tile (queries qs, output os, rows = the user's events; t = .w >> 1 its
 * index in the user); other tiles are target tiles (q, o). */
template <typename T> struct attw_args {
    CUtensorMap tk, tv; /* ATTW_TMA_KV: K, V as [rows][heads * dh] at ldkv, 64 x BN boxes, 128B swizzle */
    const T *q, *k, *v, *qs;
    T *o, *os;
    const int64_t *off;
    const int4 *tiles;
    const int *ntiles;
    int heads, flags, ldkv;
    int tq;             /* target tiles: rows per candidate, output spans go apart (att_orow) */
    int64_t go;
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

template <typename T, int DH, bool PP, bool OV, int DG>
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
    const int hd = heads * DH, ldkv = a.ldkv;
    /* Launched as the tile table's programmatic dependent: wait for it (a
     * no-op when launched plainly). */
    pdl_wait();
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
        if ((flags & ATTW_TMA_KV) && tid == 0) {
            tma_prefetch_desc(&a.tk);
            tma_prefetch_desc(&a.tv);
        }
        /* ---- producer: chunk lc of rows lr, lr + RSTEP, ...; RSTEP is a
         * multiple of 8, so one swizzle phase per thread ---- */
        setmaxnreg_dec<ATTW_PRODUCER_REGS>();
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
            const T *kb_ = k + (size_t)kv0 * ldkv + h * DH + lc * 8;
            const T *vb_ = v + (size_t)kv0 * ldkv + h * DH + lc * 8;
            for (int kb = 0; kb < nkb; kb++, it++) {
                const int st = it % ST;
                mbar_wait(&empty[st], ((it / ST) & 1) ^ 1);
                unsigned char *kd = Ks + st * CFG::KV_BYTES, *vd = Vs + st * CFG::KV_BYTES;
                if (DG & ATTW_DG_NO_KV) {
                    mbar_arrive(&full[st]);
                } else if ((flags & ATTW_TMA_KV) && (kb + 1) * BN <= L) {
                    /* A whole block: one thread issues TMA loads (DH / 64
                     * boxes each of K and V, the smem layout sw128 gives),
                     * the others only arrive, so "full" still counts 128
                     * arrivals, plus the transaction bytes. */
                    if (tid == 0) {
                        mbar_expect_tx(&full[st], 2 * CFG::KV_BYTES);
                        const int row = (int)(kv0 + (int64_t)kb * BN);
#pragma unroll
                        for (int cb = 0; cb < DH / 64; cb++) {
                            tma_load_2d(kd + cb * (BN * 128), &a.tk, &full[st], h * DH + cb * 64, row);
                            tma_load_2d(vd + cb * (BN * 128), &a.tv, &full[st], h * DH + cb * 64, row);
                        }
                    } else {
                        mbar_arrive(&full[st]);
                    }
                } else {
                    /* The last, partial block: cp.async zero-fills keys
                     * past L_u (TMA would read the next user's). */
#pragma unroll
                    for (int n = 0; n < NR; n++) {
                        const int j = kb * BN + lr + n * RSTEP;
                        const bool ok = j < L;
                        const size_t g = ok ? (size_t)j * ldkv : 0;
                        const uint32_t so = lso + n * RSTEP * 128;
                        cp_async16(kd + so, kb_ + g, ok);
                        cp_async16(vd + so, vb_ + g, ok);
                    }
                    cp_async_mbar_arrive_noinc(&full[st]);
                }
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
    setmaxnreg_inc<ATTW_CONSUMER_REGS>();
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
    /* ATTW_DG_TRACE: one record per step (nothing in production) */
    int tr_n = 0;
    auto mark = [&](int step) {
#ifdef IKBO_ATT_TRACE
        if ((DG & ATTW_DG_TRACE) && blockIdx.x == 0 && wq == 0 && lead) {
            if (tr_n < ATT_TRACE_N)
                att_trace[wg][tr_n] = ((unsigned long long)clock64() << 4) | (unsigned)step;
            att_trace_n[wg] = ++tr_n;
        }
#else
        (void)step;
        (void)tr_n;
#endif
    };
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.0f, 0.0f};

    /* s = 0, before the turn's wgmma.fence. */
    auto zero_s = [&]() {
#pragma unroll
        for (int i = 0; i < BN / 2; i++)
            s[i] = 0.0f;
    };
    /* Descriptors made once: a step within a tile or a stage adds its byte
     * offset / 16 to the start-address field (bits 0-13), which cannot
     * carry out, every address being inside shared memory. Made per call,
     * they cost ~100 instructions a warp a block (the shared window's base
     * recomputed each time), a sixth of the consumer's issue slots. */
    const uint64_t qd0 = wg_desc(Qw, 16, 1024), kd0 = wg_desc(Ks, 16, 1024);
    const uint64_t vd0 = wg_desc(Vs, a.lbo_v, a.sbo_v);
    constexpr uint32_t STAGE16 = CFG::KV_BYTES >> 4;
    /* S += Q K^T on stage st (issued, not committed). */
    auto issue_s = [&](int st) {
        const uint64_t kd = kd0 + st * STAGE16;
#pragma unroll
        for (int kk = 0; kk < DH / 16; kk++)
            wgmma_ss<T, BN, 0>::run(s, qd0 + (((kk >> 2) * (BM * 128) + (kk & 3) * 32) >> 4),
                                    kd + (((kk >> 2) * (BN * 128) + (kk & 3) * 32) >> 4));
    };
    auto issue_pv = [&](int st) {
        const uint64_t vd = vd0 + st * STAGE16;
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++)
            wgmma_rs<T, DH, 1>::run(oacc, pa[kk], vd + ((kk * 16 * 128) >> 4));
    };
    /* Online softmax of block kb (base 2), in two parts so that the first
     * can run while this warpgroup's previous P V is still on the tensor
     * cores: softmax_p turns s into P in place (masked keys -> 0) and
     * updates mrow, lrow; softmax_o (after that P V is done) rescales oacc
     * and packs P into pa.
     * s[4j + x]: row wq*16 + g (+8 for x >= 2), key 8j + 2t + (x & 1).
     * Every block has at least one valid key, so the max is finite. */
    float corr[2] = {1.0f, 1.0f};
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
            /* The running max moves only when the block's max passes it by
             * more than ATTW_MAX_SLACK (base 2): P and the row sum then use
             * a max up to 2^8 below the true one, the same for both, so the
             * result is unchanged (P <= 2^8 rounds to bf16/fp16 with the
             * same relative error), and most blocks skip O's rescale. The
             * first block always moves it (from -inf). */
            const float mb = mx[r] * scale_log2;
            if (mb > mrow[r] + ATTW_MAX_SLACK) {
                corr[r] = att_ex2(mrow[r] - mb);
                mrow[r] = mb;
            } else {
                corr[r] = 1.0f;
            }
        }
        mark(ATTW_TR_MAX);
        float ls[2] = {0.0f, 0.0f};
#pragma unroll
        for (int j = 0; j < BN / 8; j++)
#pragma unroll
            for (int x = 0; x < 4; x++) {
                const float e = fmaf(s[4 * j + x], scale_log2, -mrow[x >> 1]);
                float p = (DG & ATTW_DG_NO_EX2) ? e : att_ex2(e);
                s[4 * j + x] = p;
                ls[x >> 1] += p;
            }
        mark(ATTW_TR_EXP);
        lrow[0] = fmaf(lrow[0], corr[0], ls[0]);
        lrow[1] = fmaf(lrow[1], corr[1], ls[1]);
    };
    auto softmax_o = [&]() {
        /* Once the row maxima settle (within the slack), most blocks
         * change none of them. */
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
            mark(ATTW_TR_ITEM);
            mbar_wait(qfull, qt & 1);
            mark(ATTW_TR_Q);
            /* turn 0: S_0 */
            mbar_wait(&full[it % ST], (it / ST) & 1);
            zero_s();
            turn_begin();
            wg_fence();
            wg_fence_regs<BN / 2>(s);
            issue_s(it % ST);
            wg_commit();
            turn_end();
            wg_wait<0>();
            wg_fence_regs<BN / 2>(s);
            if (nkb == 1 && lead)
                mbar_arrive(qempty);
            if (!(DG & ATTW_DG_NO_SOFTMAX))
                softmax_p(0, L, diag_last && nkb == 1, silu);
            softmax_o();
            /* turns 1 .. nkb-1: S_j and P_{j-1} V_{j-1} */
            for (int kb = 1; kb < nkb; kb++) {
                const int sp = it % ST;
                it++;
                const int sn = it % ST;
                mark(ATTW_TR_TOP);
                mbar_wait(&full[sn], (it / ST) & 1);
                mark(ATTW_TR_FULL);
                zero_s();
                turn_begin();
                mark(ATTW_TR_TURN);
                wg_fence();
                wg_fence_regs<DH / 2>(oacc);
                wg_fence_regs<BN / 2>(s);
                issue_s(sn);
                if (OV)
                    wg_commit();
                issue_pv(sp);
                wg_commit();
                turn_end();
                mark(ATTW_TR_ISSUED);
                if (OV) {
                    wg_wait<1>(); /* S_j done; P_{j-1} V_{j-1} may still run */
                    wg_fence_regs<BN / 2>(s);
                    mark(ATTW_TR_S);
                } else {
                    wg_wait<0>();
                    wg_fence_regs<BN / 2>(s);
                    wg_fence_regs<DH / 2>(oacc);
                }
                if (kb == nkb - 1 && lead)
                    mbar_arrive(qempty);
                if (kb == 1 && w2 < W)
                    L_n = (int)(off[ti_n.z + 1] - off[ti_n.z]);
                if (!(DG & ATTW_DG_NO_SOFTMAX))
                    softmax_p(kb, L, diag_last && kb == nkb - 1, silu);
                mark(ATTW_TR_SOFTMAX);
                if (OV) {
                    wg_wait<0>();
                    wg_fence_regs<DH / 2>(oacc);
                }
                mark(ATTW_TR_PV);
                if (lead)
                    mbar_arrive(&empty[sp]);
                softmax_o();
                mark(ATTW_TR_END);
            }
            /* turn nkb: P V of the last block */
            const int sp = it % ST;
            it++;
            turn_begin();
            wg_fence();
            wg_fence_regs<DH / 2>(oacc);
            issue_pv(sp);
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
                T *orow = (self_t ? a.os + (size_t)row * hd : att_orow(a.o, row, a.tq, a.go, hd)) +
                          h * DH;
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
                T *orow = (self_t ? a.os + (size_t)row * hd : att_orow(a.o, row, a.tq, a.go, hd)) +
                          h * DH;
#pragma unroll
                for (int j = 0; j < DH / 8; j++)
                    *(uint32_t *)(orow + j * 8 + 2 * t) =
                        pack2<T>(oacc[4 * j + 2 * r] * inv[r], oacc[4 * j + 2 * r + 1] * inv[r]);
            }
        }
        mark(ATTW_TR_STORED);
    }
    /* Warpgroup 1's arrivals at barrier 1 outnumber warpgroup 0's waits by
     * the opening one: take it, so no barrier is left half-arrived. */
    if (PP && wg == 0)
        named_bar_sync(ATTW_PP_BAR, 256);
}

/* Production's launch flags: Q prefetch always, 16-byte stores where o (and
 * os) are 16-byte aligned, and so is every candidate's span (go). */
template <typename T> static int attw_flags(const att_job<T> &j)
{
    bool al16 = ((uintptr_t)j.o | (uintptr_t)j.os) % 16 == 0 && j.go * sizeof(T) % 16 == 0;
    return ATTW_PREFETCH_Q | (al16 ? ATTW_VEC_STORE : 0) | ATTW_TMA_KV;
}

/* One k_att_wg launch over the tile table (dh = DH, 64 or 128). Production:
 * PP and OV on, flags attw_flags(j), DG 0; bench/kernels/attention_v3.cu
 * turns them off one at a time for timing, and runs the DG diagnostics. */
template <typename T, int DH, bool PP = true, bool OV = true, int DG = 0>
static int launch_wg(bk_stream *s, const att_job<T> &j, int flags, bk_err *err)
{
    static_assert(DH == 64 || DH == 128, "k_att_wg is written for dh 64 and 128");
    int4 *tiles;
    int *ntiles;
    long cap;
    if (cu_att_tiles(s, j.q != nullptr, j.qs != nullptr, j.map, j.nc, j.tq, j.off, j.nu, j.causal,
                     j.ev, &tiles, &ntiles, &cap, err))
        return -1;
    const double rs = 1.0 / sqrt((double)DH);
    auto kern = k_att_wg<T, DH, PP, OV, DG>;
    if (cu_smem_limit(s, (const void *)kern, (int)attw_cfg<DH>::SMEM, err))
        return -1;
    /* V is MN-major: 64-column blocks BN*128 bytes apart (LBO), 8-key
     * groups 1024 bytes apart (SBO); the swapped assignment was checked
     * on the H200 and faults. */
    attw_args<T> a = {};
    a.q = j.q, a.k = j.k, a.v = j.v, a.qs = j.qs, a.o = j.o, a.os = j.os, a.off = j.off;
    a.tiles = tiles, a.ntiles = ntiles, a.heads = j.heads, a.flags = flags, a.ldkv = j.ldkv;
    a.tq = j.tq, a.go = j.go;
    a.causal = j.causal, a.silu = j.silu, a.scale = (float)rs;
    a.scale_log2 = (float)(1.4426950408889634 * rs);
    a.lbo_v = attw_cfg<DH>::BN * 128, a.sbo_v = 1024;
    if (flags & ATTW_TMA_KV) {
        /* K and V as [rows][heads * dh], rows ldkv apart: whole blocks
         * never pass a user's last event, so the row extent is only a bound
         * (no load reaches it; row coordinates are 32-bit, ample for event
         * counts). */
        const uint64_t es = sizeof(T), hd = (uint64_t)j.heads * DH;
        uint64_t dims[2] = {hd, (uint64_t)1 << 31}, strides[1] = {(uint64_t)j.ldkv * es};
        uint32_t box[2] = {64, (uint32_t)attw_cfg<DH>::BN};
        const CUtensorMapDataType dt = cu_tmap_dtype<T>();
        int rc = cu_tmap_encode(&a.tk, dt, 2, j.k, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_128B);
        if (!rc)
            rc = cu_tmap_encode(&a.tv, dt, 2, j.v, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_128B);
        if (rc)
            a.flags &= ~ATTW_TMA_KV; /* cp.async for every block */
    }
    /* Persistent: one CTA per SM (or per work item, if fewer), launched as
     * the tile table's programmatic dependent. */
    long work = cap * j.heads, sms = cu_impl(s->be)->sm_count;
    unsigned pgrid = (unsigned)(work < sms ? work : sms);
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at = pdl_attr();
    cfg.gridDim = dim3(pgrid);
    cfg.blockDim = dim3(attw_cfg<DH>::NT);
    cfg.dynamicSmemBytes = attw_cfg<DH>::SMEM;
    cfg.stream = s->st;
    cfg.attrs = &at;
    cfg.numAttrs = 1;
    CU_TRY(cudaLaunchKernelEx(&cfg, kern, a), "attention (wgmma)");
    return cu_check_launch(s, err, "attention (wgmma)");
}

#endif
