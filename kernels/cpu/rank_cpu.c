/* rank_cpu.c - the CPU backend's ops of the ranking architectures (DLRM,
 * DCNv2, MMoE/PLE): pool, activation, layer_norm, mul, token_linear,
 * dot_interaction, mixture, in fp32, as kernels/backend.h documents them.
 *
 * Why this exists: these are the reference the CUDA twins are checked
 * against, and what a CPU-only server runs. Determinism (cpu_internal.h):
 * every output element is a fixed sequence of fp32 operations on its own
 * inputs - pools and dots sum in increasing event / d order, layer_norm's
 * statistics in increasing column order, mixture over experts in increasing
 * e - never depending on the batch. No scratch: everything is computed from
 * the operands straight into the output.
 *
 * IKBO: mul reads its b operand through the map; dot_interaction reads user
 * tokens through the map and, given uu, copies the user-user pairs from the
 * user's row of uu (computed by the same function with kc = 0, so bitwise the
 * values it would recompute).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu_internal.h"

/* ---- pool ---- */

/* Pools cnt rows of x (row stride d) into o. */
static void pool_rows(const float *x, int64_t cnt, int d, enum bk_pool fn, float *o)
{
    if (cnt == 0) {
        memset(o, 0, (size_t)d * sizeof(float));
        return;
    }
    if (fn == BK_POOL_LAST) {
        memcpy(o, x + (size_t)(cnt - 1) * d, (size_t)d * sizeof(float));
        return;
    }
    memcpy(o, x, (size_t)d * sizeof(float));
    for (int64_t e = 1; e < cnt; e++) {
        const float *xr = x + (size_t)e * d;
        if (fn == BK_POOL_MAX)
            for (int j = 0; j < d; j++)
                o[j] = xr[j] > o[j] ? xr[j] : o[j];
        else
            for (int j = 0; j < d; j++)
                o[j] += xr[j];
    }
    if (fn == BK_POOL_MEAN)
        for (int j = 0; j < d; j++)
            o[j] /= (float)cnt;
}

int cpu_pool(bk_stream *s, const void *x, const int64_t *offsets, int n, int k, int d,
             enum bk_pool fn, void *out, int ld, bk_err *err)
{
    (void)s;
    const char *op = "pool";
    if (n < 0 || d < 0 || (!offsets && k < 0))
        return cpu_bad_dims(op, n < 0 ? "row count" : d < 0 ? "dim" : "token count",
                            n < 0 ? n : d < 0 ? d : k, err);
    if ((int)fn < BK_POOL_SUM || fn > BK_POOL_LAST)
        return cpu_bad_dims(op, "fn", fn, err);
    if (bk_bad_stride(op, "output row stride", ld, "dim", d, err))
        return -1;
    if (n == 0 || d == 0)
        return 0;
    if (!out) {
        bk_seterr(err, "%s: output is NULL", op);
        return -1;
    }
    if (offsets && cpu_check_offsets(op, offsets, n, err))
        return -1;
    int64_t total = offsets ? offsets[n] : (int64_t)n * k;
    if (total > 0 && !x) {
        bk_seterr(err, "%s: input is NULL", op);
        return -1;
    }
    const float *xf = x;
    for (int r = 0; r < n; r++) {
        int64_t beg = offsets ? offsets[r] : (int64_t)r * k;
        int64_t cnt = offsets ? offsets[r + 1] - offsets[r] : k;
        pool_rows(xf + (size_t)beg * d, cnt, d, fn, (float *)out + (size_t)r * ld);
    }
    return 0;
}

/* ---- activation, layer_norm ---- */

int cpu_activation(bk_stream *s, const void *x, size_t n, enum bk_act act, void *out, bk_err *err)
{
    (void)s;
    if ((int)act <= BK_ACT_NONE || act >= BK_ACT_COUNT)
        return cpu_bad_dims("activation", "fn", act, err);
    if (n == 0)
        return 0;
    if (!x || !out) {
        bk_seterr(err, "activation: NULL input or output");
        return -1;
    }
    const float *xf = x;
    float *of = out;
    for (size_t i = 0; i < n; i++)
        of[i] = cpu_activate(xf[i], act);
    return 0;
}

int cpu_layer_norm(bk_stream *s, const void *x, int rows, int dim, const bk_weight *w,
                   const bk_weight *b, float eps, void *out, bk_err *err)
{
    (void)s;
    const char *op = "layer_norm";
    if (rows < 0 || dim < 0)
        return cpu_bad_dims(op, rows < 0 ? "row count" : "dim", rows < 0 ? rows : dim, err);
    if (!(eps > 0.0f)) {
        bk_seterr(err, "%s: eps %g must be positive", op, (double)eps);
        return -1;
    }
    if (rows == 0 || dim == 0)
        return 0;
    if (!x || !out || !w || !b) {
        bk_seterr(err, "%s: NULL input, output or weight", op);
        return -1;
    }
    if ((size_t)w->rows * w->cols != (size_t)dim || (size_t)b->rows * b->cols != (size_t)dim) {
        bk_seterr(err, "%s: weight and bias must have %d elements, got %d and %d", op, dim,
                  w->rows * w->cols, b->rows * b->cols);
        return -1;
    }
    for (int r = 0; r < rows; r++) {
        const float *xr = (const float *)x + (size_t)r * dim;
        float *o = (float *)out + (size_t)r * dim;
        float mean = 0.0f, var = 0.0f;
        for (int j = 0; j < dim; j++)
            mean += xr[j];
        mean /= (float)dim;
        for (int j = 0; j < dim; j++) {
            float t = xr[j] - mean;
            var += t * t;
        }
        var /= (float)dim;
        float inv = 1.0f / sqrtf(var + eps);
        for (int j = 0; j < dim; j++) /* x read before o written: o may alias x */
            o[j] = (xr[j] - mean) * inv * w->data[j] + b->data[j];
    }
    return 0;
}

/* ---- add, mul ---- */

/* out = a + b[map] (add), or a * b[map] (+ c) (mul): one loop, one set of checks. */
static int binary_rows(const char *op, int mul, const void *a, const void *b, const int32_t *map,
                       const void *c, int n, int width, void *out, bk_err *err)
{
    if (n < 0 || width < 0)
        return cpu_bad_dims(op, n < 0 ? "row count" : "width", n < 0 ? n : width, err);
    if (n == 0 || width == 0)
        return 0;
    if (!a || !b || !out) {
        bk_seterr(err, "%s: NULL operand or output", op);
        return -1;
    }
    if (map && cpu_check_map(op, map, n, -1, err))
        return -1;
    for (int r = 0; r < n; r++) {
        const float *ar = (const float *)a + (size_t)r * width;
        const float *br = (const float *)b + (size_t)(map ? map[r] : r) * width;
        const float *cr = c ? (const float *)c + (size_t)r * width : NULL;
        float *o = (float *)out + (size_t)r * width;
        for (int j = 0; j < width; j++) {
            float v = mul ? ar[j] * br[j] : ar[j] + br[j];
            o[j] = cr ? v + cr[j] : v;
        }
    }
    return 0;
}

int cpu_add(bk_stream *s, const void *a, const void *b, const int32_t *map, int n, int width,
            void *out, bk_err *err)
{
    (void)s;
    return binary_rows("add", 0, a, b, map, NULL, n, width, out, err);
}

int cpu_mul(bk_stream *s, const void *a, const void *b, const int32_t *map, const void *c, int n,
            int width, void *out, bk_err *err)
{
    (void)s;
    return binary_rows("mul", 1, a, b, map, c, n, width, out, err);
}

/* ---- token_linear ---- */

int cpu_token_linear(bk_stream *s, const void *x, int rows, const bk_weight *w, int k, int m,
                     int d, void *z, bk_err *err)
{
    (void)s;
    const char *op = "token_linear";
    if (rows < 0 || k < 1 || m < 1 || d < 1)
        return cpu_bad_dims(op, rows < 0 ? "row count" : k < 1 ? "k" : m < 1 ? "m" : "d",
                            rows < 0 ? rows : k < 1 ? k : m < 1 ? m : d, err);
    if (rows == 0)
        return 0;
    if (!x || !z || !w) {
        bk_seterr(err, "%s: NULL input, output or weight", op);
        return -1;
    }
    if (w->rows != m || w->cols != k) {
        bk_seterr(err, "%s: weight is [%d, %d], expected [%d, %d]", op, w->rows, w->cols, m, k);
        return -1;
    }
    for (int r = 0; r < rows; r++) {
        const float *xr = (const float *)x + (size_t)r * k * d;
        float *zr = (float *)z + (size_t)r * m * d;
        for (int i = 0; i < m; i++) {
            float *o = zr + (size_t)i * d;
            const float *wi = w->data + (size_t)i * k;
            for (int j = 0; j < d; j++)
                o[j] = wi[0] * xr[j];
            for (int t = 1; t < k; t++)
                for (int j = 0; j < d; j++)
                    o[j] += wi[t] * xr[(size_t)t * d + j];
        }
    }
    return 0;
}

/* ---- dot_interaction ---- */

/* ord is a permutation of 0..K-1, increasing within each side; inv[place]
 * gets the token at that place. */
static int check_order(const bk_dot_order *ord, int self, uint16_t *inv, bk_err *err)
{
    const char *op = "dot_interaction";
    int K = ord ? ord->ku + ord->kc : 0;
    if (!ord || ord->ku < 0 || ord->kc < 0 || K > BK_DOT_MAX_TOKENS || K < (self ? 1 : 2)) {
        bk_seterr(err, "%s: bad token counts (ku %d, kc %d; 1..%d tokens, 2 without self)", op,
                  ord ? ord->ku : -1, ord ? ord->kc : -1, BK_DOT_MAX_TOKENS);
        return -1;
    }
    uint8_t seen[BK_DOT_MAX_TOKENS] = {0};
    for (int t = 0; t < K; t++) {
        int p = ord->pos[t];
        int side_prev = t > 0 && t != ord->ku; /* previous token on the same side */
        if (p >= K || seen[p] || (side_prev && ord->pos[t - 1] >= p)) {
            bk_seterr(err, "%s: pos[%d] = %d: not a permutation increasing within each side", op,
                      t, p);
            return -1;
        }
        seen[p] = 1;
        inv[p] = (uint16_t)t;
    }
    return 0;
}

/* Index of pair (a, b), a <= b, among n tokens in row-major upper-triangle order. */
static inline size_t pair_index(int a, int b, int n, int self)
{
    return self ? (size_t)a * n - (size_t)a * (a - 1) / 2 + (size_t)(b - a)
                : (size_t)a * (n - 1) - (size_t)a * (a - 1) / 2 + (size_t)(b - a - 1);
}

static inline float dot_d(const float *x, const float *y, int d)
{
    float acc = 0.0f;
    for (int j = 0; j < d; j++)
        acc += x[j] * y[j];
    return acc;
}

int cpu_dot_interaction(bk_stream *s, const void *tu, const void *uu, const int32_t *map,
                        const void *tc, int n, const bk_dot_order *ord, int d, int self, void *out,
                        bk_err *err)
{
    (void)s;
    const char *op = "dot_interaction";
    uint16_t inv[BK_DOT_MAX_TOKENS];
    if (n < 0 || d < 1)
        return cpu_bad_dims(op, n < 0 ? "row count" : "d", n < 0 ? n : d, err);
    if (check_order(ord, self, inv, err))
        return -1;
    if (n == 0)
        return 0;
    int ku = ord->ku, kc = ord->kc, K = ku + kc;
    if (!out || (ku && !tu) || (kc && !tc)) {
        bk_seterr(err, "%s: NULL tokens or output", op);
        return -1;
    }
    if (map && cpu_check_map(op, map, n, -1, err))
        return -1;
    size_t P = self ? (size_t)K * (K + 1) / 2 : (size_t)K * (K - 1) / 2;
    size_t Pu = self ? (size_t)ku * (ku + 1) / 2 : (size_t)ku * (ku - 1) / 2;
    for (int r = 0; r < n; r++) {
        int u = map ? map[r] : r;
        const float *ur = ku ? (const float *)tu + (size_t)u * ku * d : NULL;
        const float *cr = kc ? (const float *)tc + (size_t)r * kc * d : NULL;
        const float *uur = uu ? (const float *)uu + (size_t)u * Pu : NULL;
        float *o = (float *)out + (size_t)r * P;
        size_t q = 0;
        for (int i = 0; i < K; i++)
            for (int j = self ? i : i + 1; j < K; j++, q++) {
                int a = inv[i], b = inv[j]; /* tokens at places i < j (a, b may be either order) */
                if (uur && a < ku && b < ku) {
                    o[q] = uur[a < b ? pair_index(a, b, ku, self) : pair_index(b, a, ku, self)];
                    continue;
                }
                const float *x = a < ku ? ur + (size_t)a * d : cr + (size_t)(a - ku) * d;
                const float *y = b < ku ? ur + (size_t)b * d : cr + (size_t)(b - ku) * d;
                o[q] = dot_d(x, y, d);
            }
    }
    return 0;
}

/* ---- mixture ---- */

int cpu_mixture(bk_stream *s, const void *const *experts, int n_experts, const void *gate, int n,
                int width, void *out, bk_err *err)
{
    (void)s;
    const char *op = "mixture";
    if (n_experts < 1 || n_experts > BK_MIX_MAX_EXPERTS)
        return cpu_bad_dims(op, "expert count", n_experts, err);
    if (n < 0 || width < 0)
        return cpu_bad_dims(op, n < 0 ? "row count" : "width", n < 0 ? n : width, err);
    if (n == 0 || width == 0)
        return 0;
    if (!experts || !gate || !out) {
        bk_seterr(err, "%s: NULL experts, gate or output", op);
        return -1;
    }
    for (int e = 0; e < n_experts; e++)
        if (!experts[e]) {
            bk_seterr(err, "%s: expert %d is NULL", op, e);
            return -1;
        }
    float g[BK_MIX_MAX_EXPERTS];
    for (int r = 0; r < n; r++) {
        const float *gr = (const float *)gate + (size_t)r * n_experts;
        float mx = gr[0], sum = 0.0f;
        for (int e = 1; e < n_experts; e++)
            mx = gr[e] > mx ? gr[e] : mx;
        for (int e = 0; e < n_experts; e++) {
            g[e] = expf(gr[e] - mx);
            sum += g[e];
        }
        for (int e = 0; e < n_experts; e++)
            g[e] /= sum;
        float *o = (float *)out + (size_t)r * width;
        const float *x0 = (const float *)experts[0] + (size_t)r * width;
        for (int j = 0; j < width; j++)
            o[j] = g[0] * x0[j];
        for (int e = 1; e < n_experts; e++) {
            const float *xe = (const float *)experts[e] + (size_t)r * width;
            for (int j = 0; j < width; j++)
                o[j] += g[e] * xe[j];
        }
    }
    return 0;
}
