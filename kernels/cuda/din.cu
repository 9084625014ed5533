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
 * All arithmetic is fp32; inputs are read in the activation dtype.
 */
#include <math.h>

#include "kernels/cuda/cuda_internal.h"

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

__device__ __forceinline__ float dn_block_max(float v, float *red)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if ((threadIdx.x & 31) == 0)
        red[threadIdx.x >> 5] = v;
    __syncthreads();
    float m = red[0];
#pragma unroll
    for (int w = 1; w < DN_WARPS; w++)
        m = fmaxf(m, red[w]);
    __syncthreads();
    return m;
}

__device__ __forceinline__ float dn_block_sum(float v, float *red)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0)
        red[threadIdx.x >> 5] = v;
    __syncthreads();
    float m = red[0];
#pragma unroll
    for (int w = 1; w < DN_WARPS; w++)
        m += red[w];
    __syncthreads();
    return m;
}

/* SM: M = wd * diag(q[r]) in shared memory; otherwise wd from global. */
template <typename T, bool SM>
__global__ void __launch_bounds__(32 * DN_WARPS)
k_din(const T *__restrict__ q, const T *__restrict__ qp, const T *__restrict__ h,
      const T *__restrict__ hp, const int64_t *__restrict__ off, const int32_t *__restrict__ map,
      int d, int h1, const T *__restrict__ wd, int ldw, const T *__restrict__ w2,
      const T *__restrict__ b2, int act, int normalize, T *__restrict__ out)
{
    extern __shared__ float sm[];
    const int ms = d | 1; /* odd row stride: lane k's row k in bank (k * ms + i) % 32 */
    float *M = sm;
    float *qs = M + (SM ? (size_t)h1 * ms : 0);
    float *qps = qs + d;
    float *w2s = qps + h1;
    float *acc = w2s + h1;
    float *sc = acc + d;
    float *hb = sc + DN_TILE;
    float *red = hb + (size_t)DN_WARPS * DN_EV * d;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
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
        qs[i] = cu_tof<T>(q[r * d + i]);
        acc[i] = 0.0f;
    }
    for (int k = tid; k < h1; k += blockDim.x) {
        qps[k] = cu_tof<T>(qp[r * h1 + k]);
        w2s[k] = cu_tof<T>(w2[k]);
    }
    const float bias = cu_tof<T>(b2[0]);
    __syncthreads();
    if constexpr (SM) {
        for (int x = tid; x < h1 * d; x += blockDim.x) {
            const int k = x / d, i = x - k * d;
            M[(size_t)k * ms + i] = cu_tof<T>(wd[(size_t)k * ldw + i]) * qs[i];
        }
        __syncthreads();
    }

    float m_run = -INFINITY, l_run = 0.0f;
    float *hw = hb + (size_t)warp * DN_EV * d;
    for (int64_t t0 = 0; t0 < L; t0 += DN_TILE) {
        const int tn = (int)(L - t0 < DN_TILE ? L - t0 : DN_TILE);
        const int64_t ev0 = e0 + t0; /* the tile's first event row */
        /* Scores of the tile's events, DN_EV per warp step. */
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
                    const float *Mk = M + (size_t)k * ms;
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
                        const float mv = cu_tof<T>(wk[i]) * qs[i];
#pragma unroll
                        for (int e = 0; e < DN_EV; e++)
                            dot[e] = fmaf(mv, hw[e * d + i], dot[e]);
                    }
                }
#pragma unroll
                for (int e = 0; e < DN_EV; e++) {
                    const float hpv =
                        base + e < tn ? cu_tof<T>(hp[(size_t)(ev0 + base + e) * h1 + k]) : 0.0f;
                    const float pre = qps[k] + hpv + dot[e];
                    part[e] = fmaf(w2s[k], cu_act_f(pre, act), part[e]);
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
                        sc[base + e] = part[e] + bias;
            }
            __syncwarp(); /* hw is rewritten by the next step */
        }
        __syncthreads();
        /* The tile's weights: e_j = exp(s_j - m) with the running max m;
         * what was summed before is rescaled to the new max. */
        float scale = 1.0f;
        if (normalize) {
            float mx = -INFINITY;
            for (int j = tid; j < tn; j += blockDim.x)
                mx = fmaxf(mx, sc[j]);
            mx = dn_block_max(mx, red);
            const float m_new = fmaxf(m_run, mx);
            scale = m_run == -INFINITY ? 0.0f : expf(m_run - m_new);
            float sum = 0.0f;
            for (int j = tid; j < tn; j += blockDim.x) {
                const float ev = expf(sc[j] - m_new);
                sc[j] = ev;
                sum += ev;
            }
            sum = dn_block_sum(sum, red); /* also orders the sc writes before the reads */
            l_run = l_run * scale + sum;
            m_run = m_new;
        }
        for (int c = tid; c < d; c += blockDim.x) {
            float a = acc[c] * scale;
            const T *hc = h + (size_t)ev0 * d + c;
            for (int j = 0; j < tn; j++)
                a = fmaf(sc[j], cu_tof<T>(hc[(size_t)j * d]), a);
            acc[c] = a;
        }
        __syncthreads(); /* sc is rewritten by the next tile */
    }
    const float inv = normalize ? 1.0f / l_run : 1.0f;
    for (int c = tid; c < d; c += blockDim.x)
        orow[c] = cu_fromf<T>(normalize ? acc[c] * inv : acc[c]);
}

template <typename T>
static int din_t(bk_stream *s, const void *q, const void *qp, const void *h, const void *hp,
                 const int64_t *offsets, const int32_t *map, int n, int d, int h1,
                 const bk_weight *wd, const bk_weight *w2, const bk_weight *b2, int act,
                 int normalize, void *out, bk_err *err)
{
    const size_t optin = cu_impl(s->be)->smem_optin;
    const size_t base = din_smem_base(d, h1) * sizeof(float);
    const size_t with_m = base + (size_t)h1 * (d | 1) * sizeof(float);
    if (base > optin) {
        bk_seterr(err, "din_attention: d %d, h1 %d need %zu bytes of shared memory (at most "
                       "%zu on this device)", d, h1, base, optin);
        return -1;
    }
    const bool sm = with_m <= optin;
    const size_t bytes = sm ? with_m : base;
    const void *kern = sm ? (const void *)k_din<T, true> : (const void *)k_din<T, false>;
    if (bytes > 48 * 1024 && cu_smem_limit(s, kern, (int)bytes, err))
        return -1;
    if (sm)
        k_din<T, true><<<(unsigned)n, 32 * DN_WARPS, bytes, s->st>>>(
            (const T *)q, (const T *)qp, (const T *)h, (const T *)hp, offsets, map, d, h1,
            (const T *)wd->data, wd->ld, (const T *)w2->data, (const T *)b2->data, act,
            normalize, (T *)out);
    else
        k_din<T, false><<<(unsigned)n, 32 * DN_WARPS, bytes, s->st>>>(
            (const T *)q, (const T *)qp, (const T *)h, (const T *)hp, offsets, map, d, h1,
            (const T *)wd->data, wd->ld, (const T *)w2->data, (const T *)b2->data, act,
            normalize, (T *)out);
    return cu_check_launch(s, err, "din_attention");
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
    if (cu_enter(s, err))
        return -1;
    int rc = 0;
    CU_DISPATCH(cu_dt(s), rc = din_t<T>(s, q, qp, h, hp, offsets, map, n, d, h1, wd, w2, b2,
                                        (int)act, normalize, out, err));
    return rc;
}
