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
 * dot_interaction: one thread per 4 x 4 block of places of a row's upper
 * triangle (diagonal blocks included), reading its eight tokens in 16-byte
 * vectors straight from global memory - user tokens through the map,
 * candidate tokens direct - with 16 fp32 FMA chains in increasing d, so a
 * token is loaded once per four dots (a thread per pair, through a shared
 * memory stack, ran 17-24x over the byte floor). Pairs of two user tokens
 * are copied from uu when given (IKBO: computed once per user). No
 * [n, K, d] stack exists anywhere.
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
    /* One batched GEMM: X, W and Z once. Declared here: the nested lce
     * scope below is not timed on its own. */
    if (prof_.on())
        prof_.work(2.0 * rows * m * k * d,
                   ((double)rows * k * d + (double)m * k + (double)rows * m * d) *
                       s->be->act_size);
    /* lce with Ku = 0: Z[c] = W_cand @ Ec[c]; the user weight is never read. */
    bk_weight none = {m, 0, 0, NULL, 0};
    return cuda_lce(s, NULL, 0, x, rows, NULL, &none, w, 0, k, m, d, z, err);
}

#define DI_THREADS 256
#define DI_TILE 4 /* a thread's block of pairs: 4 x 4 places */

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

/* One thread per tile (bi <= bj) of 4 x 4 places of a row: eight token
 * pointers, 16 fp32 FMA chains in increasing d, the tokens read in 16-byte
 * vectors (VEC) straight from global memory (a row's tokens are a few KiB
 * and stay in L1 across the row's tiles). Places past K repeat place K-1
 * and are not written. */
template <typename T, bool VEC>
__global__ void __launch_bounds__(DI_THREADS)
k_dot_interaction(const T *__restrict__ tu, const T *__restrict__ uu,
                  const int32_t *__restrict__ map, const T *__restrict__ tc, int n,
                  bk_dot_order ord, int d, int self, T *__restrict__ out)
{
    constexpr int V = VEC ? cu_vec<T>::V : 1, TS = DI_TILE;
    __shared__ int16_t tok_at[BK_DOT_MAX_TOKENS];
    const int ku = ord.ku, kc = ord.kc, K = ku + kc;
    const int P = self ? K * (K + 1) / 2 : K * (K - 1) / 2;
    const int Pu = self ? ku * (ku + 1) / 2 : ku * (ku - 1) / 2;
    const int nb = (K + TS - 1) / TS, nt = nb * (nb + 1) / 2;
    for (int t = threadIdx.x; t < K; t += blockDim.x)
        tok_at[ord.pos[t]] = (int16_t)t;
    __syncthreads();
    const size_t total = (size_t)n * nt;
    for (size_t q = blockIdx.x * (size_t)blockDim.x + threadIdx.x; q < total;
         q += (size_t)gridDim.x * blockDim.x) {
        const int r = (int)(q / nt), tile = (int)(q - (size_t)r * nt);
        const int u = map ? map[r] : r;
        int bi, bj;
        tri_pair(tile, nb, 1, &bi, &bj);
        const T *pa[TS], *pb[TS];
#pragma unroll
        for (int a = 0; a < TS; a++) {
            int ta = tok_at[min(bi * TS + a, K - 1)], tb = tok_at[min(bj * TS + a, K - 1)];
            pa[a] = ta < ku ? tu + ((size_t)u * ku + ta) * d : tc + ((size_t)r * kc + ta - ku) * d;
            pb[a] = tb < ku ? tu + ((size_t)u * ku + tb) * d : tc + ((size_t)r * kc + tb - ku) * d;
        }
        float acc[TS][TS];
#pragma unroll
        for (int a = 0; a < TS; a++)
#pragma unroll
            for (int b = 0; b < TS; b++)
                acc[a][b] = 0.0f;
        for (int k = 0; k < d; k += V) {
            float fa[TS][V], fb[TS][V];
#pragma unroll
            for (int a = 0; a < TS; a++) {
                if constexpr (VEC) {
                    cu_vec<T>::load(pa[a] + k, fa[a]);
                    cu_vec<T>::load(pb[a] + k, fb[a]);
                } else {
                    fa[a][0] = cu_tof<T>(pa[a][k]);
                    fb[a][0] = cu_tof<T>(pb[a][k]);
                }
            }
#pragma unroll
            for (int v = 0; v < V; v++)
#pragma unroll
                for (int a = 0; a < TS; a++)
#pragma unroll
                    for (int b = 0; b < TS; b++)
                        acc[a][b] = fmaf(fa[a][v], fb[b][v], acc[a][b]);
        }
        T *orow = out + (size_t)r * P;
#pragma unroll
        for (int a = 0; a < TS; a++)
#pragma unroll
            for (int b = 0; b < TS; b++) {
                const int i = bi * TS + a, j = bj * TS + b;
                if (j >= K || (self ? i > j : i >= j))
                    continue;
                const int ti = tok_at[i], tj = tok_at[j];
                if (uu && ti < ku && tj < ku) /* two user tokens: ti <= tj, pos rises */
                    orow[tri_index(i, j, K, self)] = uu[(size_t)u * Pu + tri_index(ti, tj, ku, self)];
                else
                    orow[tri_index(i, j, K, self)] = cu_fromf<T>(acc[a][b]);
            }
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
    const int K = ord->ku + ord->kc, nb = (K + DI_TILE - 1) / DI_TILE;
    cu_prof_jag j;
    if (prof_.on() && !cu_prof_jagged(s, NULL, map, n, &j)) {
        /* Dots: 2 d FLOPs per pair computed (the user-user pairs are copied
         * from uu when given). Bytes: candidate tokens at n rows, user
         * tokens (and uu) once per distinct user, the output, the map. */
        const int ku = ord->ku;
        const double P = self ? K * (K + 1) / 2.0 : K * (K - 1) / 2.0;
        const double Pu = self ? ku * (ku + 1) / 2.0 : ku * (ku - 1) / 2.0;
        const double es = (double)s->be->act_size;
        prof_.work(2.0 * n * d * (P - (uu ? Pu : 0)),
                   ((double)n * ord->kc * d + j.users * ((double)ku * d + (uu ? Pu : 0)) +
                    (double)n * P) * es +
                       (map ? n * (double)sizeof *map : 0));
    }
    if (cu_enter(s, err))
        return -1;
    const size_t tiles = (size_t)n * (nb * (nb + 1) / 2);
    const int v = 16 / (int)s->be->act_size;
    const bool vec = d % v == 0 && cu_aligned16(tu) && cu_aligned16(tc);
    const unsigned grid = cu_grid_for(tiles, DI_THREADS);
    CU_DISPATCH(cu_dt(s), {
        if (vec)
            k_dot_interaction<T, true><<<grid, DI_THREADS, 0, s->st>>>(
                (const T *)tu, (const T *)uu, map, (const T *)tc, n, *ord, d, self, (T *)out);
        else
            k_dot_interaction<T, false><<<grid, DI_THREADS, 0, s->st>>>(
                (const T *)tu, (const T *)uu, map, (const T *)tc, n, *ord, d, self, (T *)out);
    });
    return cu_check_launch(s, err, "dot_interaction");
}
