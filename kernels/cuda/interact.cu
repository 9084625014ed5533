/* interact.cu - the CUDA token_linear and dot_interaction ops.
 *
 * Why this exists: DLRM's pairwise feature interaction and token mixing
 * (MLP-Mixer style, Z[r] = W @ X[r]) are the two ops of the new ranking
 * models that compute across a row's tokens.
 *
 * token_linear is one batched GEMM with the weight shared by every row:
 * exactly the candidate term of lce with no user tokens, so it runs on
 * lce's kernels (warp-specialized wgmma where M and D are large enough,
 * mma.sync, SIMT; lce.cu), not on a second GEMM written here. bench_ops
 * measures it against cuBLAS's strided-batched GEMM with a stride-0 weight.
 *
 * dot_interaction: a block takes R rows; it stages each row's virtual stack
 * T (K tokens of d, user tokens read through the map, candidate tokens
 * direct) in shared memory as fp32, transposed ([d][K+1], so a warp's pairs
 * (i, j..j+31) read one broadcast and 32 consecutive words, and the staging
 * writes are conflict-free), then its threads walk the row-major upper
 * triangle in output order, one pair each, with one fp32 FMA chain in
 * increasing d per pair. Pairs of two user tokens are copied from uu when
 * given (IKBO: computed once per user). No [n, K, d] stack exists in
 * global memory. Rows whose stack does not fit in shared memory read the
 * tokens from global memory (cached) instead.
 */
#include "kernels/cuda/cuda_internal.h"

int cuda_token_linear(bk_stream *s, const void *x, int rows, const bk_weight *w, int k, int m,
                      int d, void *z, bk_err *err)
{
    cu_prof_scope prof_(s, "token_linear");
    if (rows <= 0 || m <= 0 || d <= 0)
        return 0;
    if (k < 1 || w->rows != m || w->cols != k) {
        bk_seterr(err, "token_linear: weight [%d, %d] does not match out_tokens %d, tokens %d",
                  w->rows, w->cols, m, k);
        return -1;
    }
    /* lce with Ku = 0: Z[c] = W_cand @ Ec[c]; the user weight is never read. */
    bk_weight none = {m, 0, 0, NULL, 0};
    return cuda_lce(s, NULL, 0, x, rows, NULL, &none, w, 0, k, m, d, z, err);
}

#define DI_THREADS 256
#define DI_MAX_ROWS 16               /* rows per block */
#define DI_SMEM_DEFAULT (48 * 1024)  /* without raising the kernel's limit */

/* The pair (i, j) at index p of the row-major upper triangle over K places
 * (i < j, or i <= j with self). */
__device__ __forceinline__ void tri_pair(int p, int K, int self, int *pi, int *pj)
{
    const int kk = self ? K : K - 1; /* rows of the triangle */
    const float b = 2.0f * kk + 1.0f;
    int i = (int)((b - sqrtf(b * b - 8.0f * (float)p)) * 0.5f);
    i = i < 0 ? 0 : i > kk - 1 ? kk - 1 : i;
    while (i > 0 && i * (2 * kk - i + 1) / 2 > p)
        i--;
    while (i + 1 < kk && (i + 1) * (2 * kk - i) / 2 <= p)
        i++;
    *pi = i;
    *pj = i + (self ? 0 : 1) + (p - i * (2 * kk - i + 1) / 2);
}

/* Index of the pair (a, b), a < b (a <= b with self), among K places. */
__device__ __forceinline__ int tri_index(int a, int b, int K, int self)
{
    const int kk = self ? K : K - 1;
    return a * (2 * kk - a + 1) / 2 + (b - a - (self ? 0 : 1));
}

/* SMEM: stacks staged in shared memory (R rows); else R = 1 and tokens are
 * read from global memory. */
template <typename T, bool SMEM>
__global__ void __launch_bounds__(DI_THREADS)
k_dot_interaction(const T *__restrict__ tu, const T *__restrict__ uu,
                  const int32_t *__restrict__ map, const T *__restrict__ tc, int n,
                  bk_dot_order ord, int d, int self, int R, T *__restrict__ out)
{
    extern __shared__ float st[]; /* [R][d][K + 1] */
    __shared__ int16_t tok_at[BK_DOT_MAX_TOKENS];
    const int ku = ord.ku, kc = ord.kc, K = ku + kc, K1 = K + 1;
    const int P = self ? K * (K + 1) / 2 : K * (K - 1) / 2;
    const int Pu = self ? ku * (ku + 1) / 2 : ku * (ku - 1) / 2;
    const int r0 = blockIdx.x * R;
    const int nr = n - r0 < R ? n - r0 : R;
    for (int t = threadIdx.x; t < K; t += blockDim.x)
        tok_at[ord.pos[t]] = (int16_t)t;
    /* Token t of row r (of user u). */
    auto token = [&](int r, int u, int t) -> const T * {
        return t < ku ? tu + ((size_t)u * ku + t) * d : tc + ((size_t)r * kc + (t - ku)) * d;
    };
    if constexpr (SMEM) {
        const int per_row = K * d;
        for (int q = threadIdx.x; q < nr * per_row; q += blockDim.x) {
            int rr = q / per_row, rem = q - rr * per_row, t = rem / d, k = rem - t * d;
            int r = r0 + rr, u = map ? map[r] : r;
            st[((size_t)rr * d + k) * K1 + ord.pos[t]] = cu_tof<T>(token(r, u, t)[k]);
        }
    }
    __syncthreads();
    for (int q = threadIdx.x; q < nr * P; q += blockDim.x) {
        const int rr = q / P, p = q - rr * P, r = r0 + rr;
        const int u = map ? map[r] : r;
        int i, j;
        tri_pair(p, K, self, &i, &j);
        const int ti = tok_at[i], tj = tok_at[j];
        float acc = 0.0f;
        if (uu && ti < ku && tj < ku) { /* two user tokens: ti <= tj, pos rises */
            out[(size_t)r * P + p] = uu[(size_t)u * Pu + tri_index(ti, tj, ku, self)];
            continue;
        }
        if constexpr (SMEM) {
            const float *base = st + (size_t)rr * d * K1;
            for (int k = 0; k < d; k++)
                acc = fmaf(base[k * K1 + i], base[k * K1 + j], acc);
        } else {
            const T *a = token(r, u, ti), *b = token(r, u, tj);
            for (int k = 0; k < d; k++)
                acc = fmaf(cu_tof<T>(a[k]), cu_tof<T>(b[k]), acc);
        }
        out[(size_t)r * P + p] = cu_fromf<T>(acc);
    }
}

/* ord's counts and pos: a permutation of 0..K-1, increasing within each
 * side (backend.h). */
static int check_order(const bk_dot_order *ord, int self, bk_err *err)
{
    const int K = ord->ku + ord->kc;
    if (ord->ku < 0 || ord->kc < 0 || K > BK_DOT_MAX_TOKENS || K < (self ? 1 : 2)) {
        bk_seterr(err, "dot_interaction: %d user + %d candidate tokens (1..%d, at least 2 "
                       "without self)", ord->ku, ord->kc, BK_DOT_MAX_TOKENS);
        return -1;
    }
    unsigned char seen[BK_DOT_MAX_TOKENS] = {0};
    for (int t = 0; t < K; t++) {
        int p = ord->pos[t];
        bool rising = t == 0 || t == ord->ku || p > ord->pos[t - 1];
        if (p >= K || seen[p] || !rising) {
            bk_seterr(err, "dot_interaction: token order is not a permutation of 0..%d "
                           "increasing within each side (token %d at %d)", K - 1, t, p);
            return -1;
        }
        seen[p] = 1;
    }
    return 0;
}

int cuda_dot_interaction(bk_stream *s, const void *tu, const void *uu, const int32_t *map,
                         const void *tc, int n, const bk_dot_order *ord, int d, int self,
                         void *out, bk_err *err)
{
    cu_prof_scope prof_(s, "dot_interaction");
    if (!ord) {
        bk_seterr(err, "dot_interaction: no token order");
        return -1;
    }
    if (check_order(ord, self, err))
        return -1;
    if (ord->kc > 0 && !tc) {
        bk_seterr(err, "dot_interaction: %d candidate tokens but no candidate tensor", ord->kc);
        return -1;
    }
    if (ord->ku > 0 && !tu) {
        bk_seterr(err, "dot_interaction: %d user tokens but no user tensor", ord->ku);
        return -1;
    }
    if (n <= 0)
        return 0;
    if (d <= 0) {
        bk_seterr(err, "dot_interaction: token width %d", d);
        return -1;
    }
    if (cu_enter(s, err))
        return -1;
    const int K = ord->ku + ord->kc, P = self ? K * (K + 1) / 2 : K * (K - 1) / 2;
    const size_t row_bytes = (size_t)d * (K + 1) * sizeof(float);
    int R = P >= DI_THREADS ? 1 : DI_THREADS / P;
    if (R > DI_MAX_ROWS) R = DI_MAX_ROWS;
    while (R > 1 && R * row_bytes > DI_SMEM_DEFAULT)
        R--;
    const size_t smem = R * row_bytes;
    const bool in_smem = smem <= cu_impl(s->be)->smem_optin;
    const unsigned grid = (unsigned)((n + R - 1) / R);
    int rc = 0;
    CU_DISPATCH(cu_dt(s), {
        if (in_smem) {
            if (smem > DI_SMEM_DEFAULT)
                rc = cu_smem_limit(s, (const void *)k_dot_interaction<T, true>, (int)smem, err);
            if (!rc)
                k_dot_interaction<T, true><<<grid, DI_THREADS, smem, s->st>>>(
                    (const T *)tu, (const T *)uu, map, (const T *)tc, n, *ord, d, self, R,
                    (T *)out);
        } else {
            k_dot_interaction<T, false><<<n, DI_THREADS, 0, s->st>>>(
                (const T *)tu, (const T *)uu, map, (const T *)tc, n, *ord, d, self, 1, (T *)out);
        }
    });
    if (rc)
        return -1;
    return cu_check_launch(s, err, "dot_interaction");
}
