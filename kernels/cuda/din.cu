/* din.cu - the CUDA din_attention op (DIN's activation-unit attention).
 *
 * Why this exists: DIN scores every (candidate, history event) pair with a
 * small MLP over [q, h, q - h, q * h]. The engine folds the q and h columns
 * of the first layer into qp (per candidate) and hp (per event), which
 * leaves, per pair, pre_j = qp[r] + hp[j] + wd @ (q[r] * h[j]) - an [h1, d]
 * matrix-vector product - then s_j = w2 . act(pre_j) + b2, a softmax over
 * the user's events (or the raw scores) and out[r] = sum_j a_j h[j]. Done
 * as generic ops this would build a [C, L, h1] (or [C, L, d]) tensor; here
 * it is one kernel and nothing at C x L exists anywhere.
 *
 * One block per candidate (backend.h: r's user is map[r], any map):
 *  - M = wd * diag(q[r]) ([h1, d] fp32, row stride d | 1 so the lanes'
 *    rows fall in distinct banks), qp[r], w2 and q[r] in shared memory.
 *    When M does not fit, wd is read from global memory (L1/L2-resident)
 *    and multiplied by q on the fly.
 *  - Events in tiles of DN_TILE scores. Each warp takes DN_EV events at a
 *    time: their h rows go to the warp's shared slots (fp32), lanes run
 *    over the h1 hidden units, each looping over d with h broadcast from
 *    shared memory (one M load feeds DN_EV FMAs), then s_j is a warp
 *    reduction of w2 * act(pre). The tile's scores sit in shared memory.
 *  - Softmax tile by tile: the running max and sum rescale the running
 *    output (online softmax), so any history length works without global
 *    scratch and without truncation; for L <= DN_TILE (one tile) this is
 *    exactly max-subtracted expf, a sum, and out = sum_j e_j h[j] / sum.
 *  - out[r, c]: thread c sums a_j h[j, c] in increasing j (coalesced rows
 *    of h), fp32, rounded once at the end.
 * At bf16/fp16 with d in {16, 32, 64, 128} and h1 a multiple of 16 the
 * scores come from tensor cores instead (din_scores_tc: M as a hi + lo pair of T, the q * h
 * term as an [events, d] x [d, h1] mma.sync product per candidate, fp32
 * accumulation and epilogue); the softmax and the output are the same code.
 * Other arithmetic is fp32; inputs are read in the activation dtype.
 */
#include <math.h>

#include "kernels/cuda/cuda_internal.h"
#include "kernels/cuda/mma_util.cuh"

#define DN_WARPS 8    /* warps per block */
#define DN_EV 4       /* events a warp scores at once */
#define DN_TILE 1024  /* scores held in shared memory per tile */

/* Shared floats the kernel needs besides M. */
static size_t din_smem_base(int d, int h1)
{
    return (size_t)d            /* q[r]                  */
           + 2 * (size_t)h1     /* qp[r], w2             */
           + (size_t)d          /* the running output    */
           + DN_TILE            /* one tile's scores     */
           + (size_t)DN_WARPS * DN_EV * d /* the warps' h rows */
           + 2 * DN_WARPS;      /* block reductions      */
}

/* A block-wide max (MAX) or sum of v, the same in every thread; red holds
 * DN_WARPS floats. Both barriers also order shared-memory writes before
 * the caller's next reads. */
template <bool MAX> __device__ __forceinline__ float dn_block_reduce(float v, float *red)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float x = __shfl_xor_sync(0xffffffffu, v, o);
        v = MAX ? fmaxf(v, x) : v + x;
    }
    if ((threadIdx.x & 31) == 0)
        red[threadIdx.x >> 5] = v;
    __syncthreads();
    float m = red[0];
#pragma unroll
    for (int w = 1; w < DN_WARPS; w++)
        m = MAX ? fmaxf(m, red[w]) : m + red[w];
    __syncthreads();
    return m;
}

/* What one block shares (floats, then the tensor-core path's T tile). */
struct din_smem {
    float *M, *qs, *qps, *w2s, *acc, *sc, *hb, *red;
    void *Mh;
};

/* The SIMT scores of one tile (events ev0 .. ev0 + tn of this block's user)
 * into sc: M in shared memory (SM) or wd read from global memory. */
template <typename T, bool SM>
__device__ __forceinline__ void din_scores_simt(const din_smem &S, const T *__restrict__ h,
                                                const T *__restrict__ hp, const T *__restrict__ wd,
                                                int ldw, int d, int h1, int act, float bias,
                                                int64_t ev0, int tn)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, ms = d | 1;
    float *hw = S.hb + (size_t)warp * DN_EV * d;
    for (int base = warp * DN_EV; base < tn; base += DN_WARPS * DN_EV) {
#pragma unroll
        for (int e = 0; e < DN_EV; e++) {
            const bool ok = base + e < tn;
            const T *hr = h + (size_t)(ev0 + base + e) * d;
            for (int i = lane; i < d; i += 32)
                hw[e * d + i] = ok ? cu_tof<T>(hr[i]) : 0.0f;
        }
        __syncwarp();
        float part[DN_EV];
#pragma unroll
        for (int e = 0; e < DN_EV; e++)
            part[e] = 0.0f;
        for (int k = lane; k < h1; k += 32) {
            float dot[DN_EV];
#pragma unroll
            for (int e = 0; e < DN_EV; e++)
                dot[e] = 0.0f;
            if constexpr (SM) {
                const float *Mk = S.M + (size_t)k * ms;
#pragma unroll 4
                for (int i = 0; i < d; i++) {
                    const float mv = Mk[i];
#pragma unroll
                    for (int e = 0; e < DN_EV; e++)
                        dot[e] = fmaf(mv, hw[e * d + i], dot[e]);
                }
            } else {
                const T *wk = wd + (size_t)k * ldw;
#pragma unroll 4
                for (int i = 0; i < d; i++) {
                    const float mv = cu_tof<T>(wk[i]) * S.qs[i];
#pragma unroll
                    for (int e = 0; e < DN_EV; e++)
                        dot[e] = fmaf(mv, hw[e * d + i], dot[e]);
                }
            }
#pragma unroll
            for (int e = 0; e < DN_EV; e++) {
                const float hpv =
                    base + e < tn ? cu_tof<T>(hp[(size_t)(ev0 + base + e) * h1 + k]) : 0.0f;
                const float pre = S.qps[k] + hpv + dot[e];
                part[e] = fmaf(S.w2s[k], cu_act_f(pre, act), part[e]);
            }
        }
#pragma unroll
        for (int e = 0; e < DN_EV; e++) {
#pragma unroll
            for (int o = 16; o > 0; o >>= 1)
                part[e] += __shfl_xor_sync(0xffffffffu, part[e], o);
        }
        if (lane == 0) {
#pragma unroll
            for (int e = 0; e < DN_EV; e++)
                if (base + e < tn)
                    S.sc[base + e] = part[e] + bias;
        }
        __syncwarp(); /* hw is rewritten by the next step */
    }
}

/* Tensor-core scores (bf16/fp16, D a multiple of 16 up to 128, h1 a
 * multiple of 16): each warp takes 16 events at a time; G = H [16, D] x
 * M^T with M = wd * diag(q[r]) in T ([h1][D + 8] in shared memory, rows
 * padded for conflict-free ldmatrix) on mma.sync m16n8k16, 16 hidden units
 * per step, and the epilogue (qp + hp + G, act, w2 dot) on the
 * accumulators (M's hi and lo parts accumulate into the same sums); H's
 * fragments come straight from global memory (the
 * user's rows, L2-resident across the user's candidates). */
template <typename T, int D>
__device__ __forceinline__ void din_scores_tc(const din_smem &S, const T *__restrict__ h,
                                              const T *__restrict__ hp, int h1, int act,
                                              float bias, int64_t ev0, int tn)
{
    constexpr int LDM = D + 8, KS = D / 16;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const T *Mh = (const T *)S.Mh, *Ml = Mh + (size_t)h1 * LDM;
    for (int base = warp * 16; base < tn; base += DN_WARPS * 16) {
        const int r0 = base + g, r1 = base + g + 8;
        const bool ok0 = r0 < tn, ok1 = r1 < tn;
        const T *h0 = h + (size_t)(ev0 + (ok0 ? r0 : 0)) * D + 2 * t;
        const T *h1p = h + (size_t)(ev0 + (ok1 ? r1 : 0)) * D + 2 * t;
        uint32_t af[KS][4];
#pragma unroll
        for (int ks = 0; ks < KS; ks++) {
            af[ks][0] = ok0 ? *(const uint32_t *)(h0 + ks * 16) : 0u;
            af[ks][1] = ok1 ? *(const uint32_t *)(h1p + ks * 16) : 0u;
            af[ks][2] = ok0 ? *(const uint32_t *)(h0 + ks * 16 + 8) : 0u;
            af[ks][3] = ok1 ? *(const uint32_t *)(h1p + ks * 16 + 8) : 0u;
        }
        const T *hp0 = hp + (size_t)(ev0 + (ok0 ? r0 : 0)) * h1 + 2 * t;
        const T *hp1 = hp + (size_t)(ev0 + (ok1 ? r1 : 0)) * h1 + 2 * t;
        float part0 = 0.0f, part1 = 0.0f;
        for (int n0 = 0; n0 < h1; n0 += 16) {
            float c0[4] = {0.0f, 0.0f, 0.0f, 0.0f}, c1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int ks = 0; ks < KS; ks++) {
                uint32_t b4[4];
                const int n = n0 + (lane >> 4) * 8 + (lane & 7);
                const int col = ks * 16 + ((lane >> 3) & 1) * 8;
                ldmatrix_x4(b4, Mh + n * LDM + col);
                uint32_t b0[2] = {b4[0], b4[1]}, b1[2] = {b4[2], b4[3]};
                mma16816<T>(c0, af[ks], b0);
                mma16816<T>(c1, af[ks], b1);
                ldmatrix_x4(b4, Ml + n * LDM + col);
                uint32_t l0[2] = {b4[0], b4[1]}, l1[2] = {b4[2], b4[3]};
                mma16816<T>(c0, af[ks], l0);
                mma16816<T>(c1, af[ks], l1);
            }
            /* c0[x]: row g (x < 2) or g + 8, hidden unit n0 + 2t + (x & 1);
             * c1 likewise at n0 + 8. */
#pragma unroll
            for (int half = 0; half < 2; half++) {
                const float *c = half ? c1 : c0;
                const int k = n0 + half * 8 + 2 * t;
                const float q0 = S.qps[k], q1 = S.qps[k + 1], w0 = S.w2s[k], w1 = S.w2s[k + 1];
                float hv[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                if (ok0) {
                    hv[0] = cu_tof<T>(hp0[n0 + half * 8]);
                    hv[1] = cu_tof<T>(hp0[n0 + half * 8 + 1]);
                }
                if (ok1) {
                    hv[2] = cu_tof<T>(hp1[n0 + half * 8]);
                    hv[3] = cu_tof<T>(hp1[n0 + half * 8 + 1]);
                }
                part0 = fmaf(w0, cu_act_f(q0 + hv[0] + c[0], act), part0);
                part0 = fmaf(w1, cu_act_f(q1 + hv[1] + c[1], act), part0);
                part1 = fmaf(w0, cu_act_f(q0 + hv[2] + c[2], act), part1);
                part1 = fmaf(w1, cu_act_f(q1 + hv[3] + c[3], act), part1);
            }
        }
#pragma unroll
        for (int o = 1; o < 4; o <<= 1) {
            part0 += __shfl_xor_sync(0xffffffffu, part0, o);
            part1 += __shfl_xor_sync(0xffffffffu, part1, o);
        }
        if (t == 0) {
            if (ok0)
                S.sc[r0] = part0 + bias;
            if (ok1)
                S.sc[r1] = part1 + bias;
        }
    }
}

/* MODE: 0 SIMT with M in shared memory, 1 SIMT with wd from global
 * memory, 2 tensor cores (D = d, compile-time). */
template <typename T, int MODE, int D>
__global__ void __launch_bounds__(32 * DN_WARPS)
k_din(const T *__restrict__ q, const T *__restrict__ qp, const T *__restrict__ h,
      const T *__restrict__ hp, const int64_t *__restrict__ off, const int32_t *__restrict__ map,
      int d, int h1, const T *__restrict__ wd, int ldw, const T *__restrict__ w2,
      const T *__restrict__ b2, int act, int normalize, T *__restrict__ out)
{
    extern __shared__ float sm[];
    const int ms = d | 1; /* odd row stride: lane k's row k in bank (k * ms + i) % 32 */
    din_smem S;
    S.M = sm;
    S.qs = S.M + (MODE == 0 ? (size_t)h1 * ms : 0);
    S.qps = S.qs + d;
    S.w2s = S.qps + h1;
    S.acc = S.w2s + h1;
    S.sc = S.acc + d;
    S.hb = S.sc + DN_TILE;
    S.red = S.hb + (size_t)DN_WARPS * DN_EV * d;
    S.Mh = (void *)(((uintptr_t)(S.red + 2 * DN_WARPS) + 15) & ~(uintptr_t)15);

    const int tid = threadIdx.x;
    const size_t r = blockIdx.x;
    const int u = map ? map[r] : (int)r;
    const int64_t e0 = off[u];
    const int64_t L = off[u + 1] - e0;
    T *orow = out + r * d;
    if (L <= 0) {
        for (int c = tid; c < d; c += blockDim.x)
            orow[c] = cu_fromf<T>(0.0f);
        return;
    }
    for (int i = tid; i < d; i += blockDim.x) {
        S.qs[i] = cu_tof<T>(q[r * d + i]);
        S.acc[i] = 0.0f;
    }
    for (int k = tid; k < h1; k += blockDim.x) {
        S.qps[k] = cu_tof<T>(qp[r * h1 + k]);
        S.w2s[k] = cu_tof<T>(w2[k]);
    }
    const float bias = cu_tof<T>(b2[0]);
    __syncthreads();
    if constexpr (MODE == 0) {
        for (int x = tid; x < h1 * d; x += blockDim.x) {
            const int k = x / d, i = x - k * d;
            S.M[(size_t)k * ms + i] = cu_tof<T>(wd[(size_t)k * ldw + i]) * S.qs[i];
        }
        __syncthreads();
    } else if constexpr (MODE == 2) {
        /* M as a pair hi + lo of T: its rounding then adds nothing to the
         * error of the inputs (a product of two activations held in one
         * bf16 lost up to 2^-9 relative, which a near-cancelling w2 dot
         * amplified past the op's tolerance). */
        T *Mh = (T *)S.Mh, *Ml = Mh + (size_t)h1 * (D + 8);
        for (int x = tid; x < h1 * D; x += blockDim.x) {
            const int k = x / D, i = x - k * D;
            const float m = cu_tof<T>(wd[(size_t)k * ldw + i]) * S.qs[i];
            const T hi = cu_fromf<T>(m);
            Mh[(size_t)k * (D + 8) + i] = hi;
            Ml[(size_t)k * (D + 8) + i] = cu_fromf<T>(m - cu_tof<T>(hi));
        }
        __syncthreads();
    }

    float m_run = -INFINITY, l_run = 0.0f;
    for (int64_t t0 = 0; t0 < L; t0 += DN_TILE) {
        const int tn = (int)(L - t0 < DN_TILE ? L - t0 : DN_TILE);
        const int64_t ev0 = e0 + t0; /* the tile's first event row */
        if constexpr (MODE == 2)
            din_scores_tc<T, D>(S, h, hp, h1, act, bias, ev0, tn);
        else
            din_scores_simt<T, MODE == 0>(S, h, hp, wd, ldw, d, h1, act, bias, ev0, tn);
        __syncthreads();
        /* The tile's weights: e_j = exp(s_j - m) with the running max m;
         * what was summed before is rescaled to the new max. */
        float scale = 1.0f;
        if (normalize) {
            float mx = -INFINITY;
            for (int j = tid; j < tn; j += blockDim.x)
                mx = fmaxf(mx, S.sc[j]);
            mx = dn_block_reduce<true>(mx, S.red);
            const float m_new = fmaxf(m_run, mx);
            scale = m_run == -INFINITY ? 0.0f : expf(m_run - m_new);
            float sum = 0.0f;
            for (int j = tid; j < tn; j += blockDim.x) {
                const float ev = expf(S.sc[j] - m_new);
                S.sc[j] = ev;
                sum += ev;
            }
            sum = dn_block_reduce<false>(sum, S.red); /* also orders the sc writes before the reads */
            l_run = l_run * scale + sum;
            m_run = m_new;
        }
        for (int c = tid; c < d; c += blockDim.x) {
            float a = S.acc[c] * scale;
            const T *hc = h + (size_t)ev0 * d + c;
            for (int j = 0; j < tn; j++)
                a = fmaf(S.sc[j], cu_tof<T>(hc[(size_t)j * d]), a);
            S.acc[c] = a;
        }
        __syncthreads(); /* sc is rewritten by the next tile */
    }
    const float inv = normalize ? 1.0f / l_run : 1.0f;
    for (int c = tid; c < d; c += blockDim.x)
        orow[c] = cu_fromf<T>(normalize ? S.acc[c] * inv : S.acc[c]);
}

template <typename T, int MODE, int D>
static int din_launch(bk_stream *s, size_t bytes, const void *q, const void *qp, const void *h,
                      const void *hp, const int64_t *offsets, const int32_t *map, int n, int d,
                      int h1, const bk_weight *wd, const bk_weight *w2, const bk_weight *b2,
                      int act, int normalize, void *out, bk_err *err)
{
    auto kern = k_din<T, MODE, D>;
    if (bytes > 48 * 1024 && cu_smem_limit(s, (const void *)kern, (int)bytes, err))
        return -1;
    kern<<<(unsigned)n, 32 * DN_WARPS, bytes, s->st>>>(
        (const T *)q, (const T *)qp, (const T *)h, (const T *)hp, offsets, map, d, h1,
        (const T *)wd->data, wd->ld, (const T *)w2->data, (const T *)b2->data, act, normalize,
        (T *)out);
    return cu_check_launch(s, err, MODE == 2 ? "din_attention (tensor cores)" : "din_attention");
}

/* Tensor cores for bf16/fp16 when d is 16, 32, 64 or 128, h1 a multiple of
 * 16 and h, hp 4-byte aligned; SIMT otherwise (fp32 activations, other
 * shapes). */
template <typename T>
static int din_t(bk_stream *s, const void *q, const void *qp, const void *h, const void *hp,
                 const int64_t *offsets, const int32_t *map, int n, int d, int h1,
                 const bk_weight *wd, const bk_weight *w2, const bk_weight *b2, int act,
                 int normalize, void *out, bk_err *err)
{
    const size_t optin = cu_impl(s->be)->smem_optin;
    const size_t base = din_smem_base(d, h1) * sizeof(float);
    const size_t with_m = base + (size_t)h1 * (d | 1) * sizeof(float);
    const size_t with_mh = base + 16 + 2 * (size_t)h1 * (d + 8) * sizeof(T);
    if (base > optin) {
        bk_seterr(err, "din_attention: d %d, h1 %d need %zu bytes of shared memory (at most "
                       "%zu on this device)", d, h1, base, optin);
        return -1;
    }
    if constexpr (sizeof(T) == 2) {
        const bool tc = h1 % 16 == 0 && with_mh <= optin &&
                        (((uintptr_t)h | (uintptr_t)hp) & 3) == 0;
#define DIN_TC(DD)                                                                          \
    case DD:                                                                               \
        return din_launch<T, 2, DD>(s, with_mh, q, qp, h, hp, offsets, map, n, d, h1, wd, w2, \
                                    b2, act, normalize, out, err)
        if (tc) {
            switch (d) {
                DIN_TC(16);
                DIN_TC(32);
                DIN_TC(64);
                DIN_TC(128);
            default: break;
            }
        }
#undef DIN_TC
    }
    if (with_m <= optin)
        return din_launch<T, 0, 0>(s, with_m, q, qp, h, hp, offsets, map, n, d, h1, wd, w2, b2,
                                   act, normalize, out, err);
    return din_launch<T, 1, 0>(s, base, q, qp, h, hp, offsets, map, n, d, h1, wd, w2, b2, act,
                               normalize, out, err);
}

int cuda_din_attention(bk_stream *s, const void *q, const void *qp, const void *h,
                       const void *hp, const int64_t *offsets, const int32_t *map, int n, int d,
                       int h1, const bk_weight *wd, const bk_weight *w2, const bk_weight *b2,
                       enum bk_act act, int normalize, void *out, bk_err *err)
{
    cu_prof_scope prof_(s, "din_attention");
    if (n < 0 || d <= 0 || h1 <= 0) {
        bk_seterr(err, "din_attention: bad sizes n %d d %d h1 %d", n, d, h1);
        return -1;
    }
    if ((unsigned)act >= BK_ACT_COUNT) {
        bk_seterr(err, "din_attention: bad activation %d", (int)act);
        return -1;
    }
    if (!wd || !w2 || !b2) {
        bk_seterr(err, "din_attention: missing weight (wd %s, w2 %s, b2 %s)", wd ? "ok" : "NULL",
                  w2 ? "ok" : "NULL", b2 ? "ok" : "NULL");
        return -1;
    }
    if (wd->rows != h1 || wd->cols != d || w2->rows != 1 || w2->cols != h1 || b2->rows != 1 ||
        b2->cols != 1) {
        bk_seterr(err, "din_attention: weights wd [%d, %d], w2 [%d, %d], b2 [%d, %d] do not "
                       "match d %d, h1 %d (want [%d, %d], [1, %d], [1, 1])",
                  wd->rows, wd->cols, w2->rows, w2->cols, b2->rows, b2->cols, d, h1, h1, d, h1);
        return -1;
    }
    if (n == 0)
        return 0;
    if (!q || !qp || !h || !hp || !offsets || !out) {
        bk_seterr(err, "din_attention: NULL %s", !q ? "q" : !qp ? "qp" : !h ? "h" : !hp ? "hp"
                                                  : !offsets ? "offsets" : "out");
        return -1;
    }
    cu_prof_jag j;
    if (prof_.on() && !cu_prof_jagged(s, offsets, map, n, &j)) {
        /* Per (row, event) pair: wd @ (q * h) (2 h1 d), w2 . act (2 h1) and
         * the output sum a_j h[j] (2 d). Bytes: q, qp, out at n rows; h and
         * hp once per distinct user's event; the weights; map and offsets. */
        const double es = (double)s->be->act_size;
        const double elems = (double)n * (2.0 * d + h1) + j.urows * (d + h1) +
                             (double)h1 * d + h1 + 1;
        prof_.work(2.0 * j.pairs * ((double)h1 * d + h1 + d),
                   elems * es + (map ? n * (double)sizeof *map : 0) +
                       (j.users + 1) * sizeof *offsets);
    }
    if (cu_enter(s, err))
        return -1;
    int rc = 0;
    CU_DISPATCH(cu_dt(s), rc = din_t<T>(s, q, qp, h, hp, offsets, map, n, d, h1, wd, w2, b2,
                                        (int)act, normalize, out, err));
    return rc;
}
