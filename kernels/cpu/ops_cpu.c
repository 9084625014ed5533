/* ops_cpu.c - the CPU backend's ops, in fp32, as kernels/backend.h documents
 * them.
 *
 * Why this exists: these are the reference implementations every other
 * backend and the PyTorch interpreter are checked against, and what a CPU-only
 * server runs. Priorities, in order: exact semantics, determinism, speed.
 *
 * Determinism (hard requirement; see cpu_internal.h): every reduction has a
 * fixed order that depends only on the widths, never on the batch:
 *   - sums over bag/history/segment members run in member order;
 *   - matmul-shaped ops (linear, lce; attention in attention_cpu.c) go through gemm_cpu_tile,
 *     one fp32 accumulator per output element, k in increasing order. Rows
 *     are processed GEMM_MR at a time; a short last tile repeats a valid row
 *     pointer and drops its results, so a row's arithmetic is the same alone
 *     or at any position of a batch of any size;
 *   - linear's cache blocking over k stores the partial sum in the output
 *     and reloads it, which continues the same sequential sum exactly.
 * No threads: a server runs one stream per execution instance, which is where
 * CPU parallelism comes from. Splitting an op by rows would keep results
 * bitwise equal (rows are independent); splitting a reduction would not.
 *
 * IKBO: lce computes the user term at nu rows (scratch) and adds it in the
 * candidate epilogue (attention_cpu.c has the attention family). It never
 * copies a user tensor to candidate batch size.
 *
 * Scratch (lce's user term) comes from the
 * accounted allocator under BK_TAG_USER and is freed before the op returns.
 *
 * Index arrays are validated as far as the op can see (offsets
 * non-decreasing from >= 0, map within [0, nu)), so a bad plan is an error
 * message rather than a wild read.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cpu_internal.h"

/* Linear's cache blocks: KC x GEMM_NR floats of a weight panel (8 KiB) stay
 * in L1 while LIN_MC rows x KC of x (64 KiB) stream from L2. */
#define LIN_MC 64
#define LIN_KC 256


/* ((id % rows) + rows) % rows, the format's rule, with one division: C's %
 * truncates toward zero, so id % rows lies in (-rows, rows) and one
 * conditional add makes it non-negative. No overflow for any int64 id
 * (INT64_MIN included) because 0 < rows <= INT_MAX. */
static inline int64_t table_row(int64_t id, int64_t rows)
{
    int64_t r = id % rows;
    return r < 0 ? r + rows : r;
}

/* offsets[0 .. n] must start >= 0 and never decrease. */
int cpu_check_offsets(const char *op, const int64_t *offsets, int n, bk_err *err)
{
    if (!offsets) {
        bk_seterr(err, "%s: offsets is NULL", op);
        return -1;
    }
    if (offsets[0] < 0) {
        bk_seterr(err, "%s: offsets[0] = %lld is negative", op, (long long)offsets[0]);
        return -1;
    }
    for (int i = 0; i < n; i++)
        if (offsets[i + 1] < offsets[i]) {
            bk_seterr(err, "%s: offsets decrease at %d (%lld > %lld)", op, i,
                      (long long)offsets[i], (long long)offsets[i + 1]);
            return -1;
        }
    return 0;
}

/* map[0 .. n) must lie in [0, nu); nu < 0 means "upper bound unknown". */
int cpu_check_map(const char *op, const int32_t *map, int n, int nu, bk_err *err)
{
    if (!map) {
        bk_seterr(err, "%s: map is NULL", op);
        return -1;
    }
    for (int i = 0; i < n; i++)
        if (map[i] < 0 || (nu >= 0 && map[i] >= nu)) {
            bk_seterr(err, "%s: map[%d] = %d is outside [0, %d)", op, i, (int)map[i], nu);
            return -1;
        }
    return 0;
}

int cpu_bad_dims(const char *op, const char *what, long long v, bk_err *err)
{
    bk_seterr(err, "%s: bad %s %lld", op, what, v);
    return -1;
}

/* ---- embedding_bag ---- */

int cpu_embedding_bag(bk_stream *s, const bk_weight *table, const int64_t *ids,
                      const int64_t *offsets, int n, enum bk_pool pool, void *out, int ld,
                      bk_err *err)
{
    (void)s;
    const char *op = "embedding_bag";
    if (n < 0)
        return cpu_bad_dims(op, "bag count", n, err);
    if (pool != BK_POOL_SUM && pool != BK_POOL_MEAN)
        return cpu_bad_dims(op, "pooling", pool, err);
    if (n == 0)
        return 0;
    if (!table || !out) {
        bk_seterr(err, "%s: NULL table or output", op);
        return -1;
    }
    const int dim = table->cols;
    if (ld < dim) {
        bk_seterr(err, "%s: ld %d < table dim %d", op, ld, dim);
        return -1;
    }
    if (cpu_check_offsets(op, offsets, n, err))
        return -1;
    if (offsets[n] > offsets[0] && !ids) {
        bk_seterr(err, "%s: ids is NULL", op);
        return -1;
    }
    if (offsets[n] > offsets[0] && table->rows == 0) {
        bk_seterr(err, "%s: table has no rows", op);
        return -1;
    }
    float *o = out;
    for (int b = 0; b < n; b++) {
        float *ob = o + (size_t)b * (size_t)ld;
        memset(ob, 0, (size_t)dim * sizeof(float));
        for (int64_t e = offsets[b]; e < offsets[b + 1]; e++) {
            const float *row = table->data + (size_t)table_row(ids[e], table->rows) * dim;
            for (int j = 0; j < dim; j++)
                ob[j] += row[j];
        }
        int64_t count = offsets[b + 1] - offsets[b];
        if (pool == BK_POOL_MEAN && count > 0)
            for (int j = 0; j < dim; j++)
                ob[j] /= (float)count;
    }
    return 0;
}

/* The bags one after the other: the CPU has no launches to save. */
int cpu_embedding_bags(bk_stream *s, const bk_bag *bags, int n, bk_err *err)
{
    if (bk_bags_check(bags, n, err))
        return -1;
    for (int i = 0; i < n; i++) {
        const bk_bag *b = &bags[i];
        if (cpu_embedding_bag(s, b->table, b->ids, b->offsets, b->n, b->pool, b->out, b->ld, err)) {
            char msg[sizeof err->msg];
            snprintf(msg, sizeof msg, "%s", err->msg);
            bk_seterr(err, "embedding_bags: bag %d: %s", i, msg);
            return -1;
        }
    }
    return 0;
}

/* ---- history_embedding ---- */

int cpu_history_embedding(bk_stream *s, const bk_weight *table, const bk_weight *action,
                          const bk_weight *position, const int64_t *ids, const int32_t *actions,
                          const int64_t *offsets, int n, void *out, bk_err *err)
{
    (void)s;
    const char *op = "history_embedding";
    if (n < 0)
        return cpu_bad_dims(op, "user count", n, err);
    if (n == 0)
        return 0;
    if (!table || !action || !position) {
        bk_seterr(err, "%s: NULL table, action or position weight", op);
        return -1;
    }
    const int dim = table->cols;
    if (action->cols != dim || position->cols != dim) {
        bk_seterr(err, "%s: widths differ (table %d, action %d, position %d)", op, dim,
                  action->cols, position->cols);
        return -1;
    }
    if (cpu_check_offsets(op, offsets, n, err))
        return -1;
    if (offsets[n] > offsets[0] && (!ids || !out || table->rows == 0)) {
        bk_seterr(err, "%s: NULL ids or output, or an empty table", op);
        return -1;
    }
    float *o = out;
    for (int u = 0; u < n; u++) {
        if (offsets[u + 1] - offsets[u] > position->rows) {
            bk_seterr(err, "%s: user %d has %lld events, more than the %d positions", op, u,
                      (long long)(offsets[u + 1] - offsets[u]), position->rows);
            return -1;
        }
        for (int64_t e = offsets[u]; e < offsets[u + 1]; e++) {
            int32_t a = actions ? actions[e] : 0;
            if (a < 0 || a >= action->rows) {
                bk_seterr(err, "%s: event %lld has action %d outside [0, %d)", op,
                          (long long)e, (int)a, action->rows);
                return -1;
            }
            const float *t = table->data + (size_t)table_row(ids[e], table->rows) * dim;
            const float *ar = action->data + (size_t)a * dim;
            const float *p = position->data + (size_t)(e - offsets[u]) * dim;
            float *oe = o + (size_t)e * dim;
            for (int j = 0; j < dim; j++)
                oe[j] = (t[j] + ar[j]) + p[j];
        }
    }
    return 0;
}

/* ---- linear ---- */



int cpu_linear(bk_stream *s, const void *x, int ldx, int rows, const bk_weight *w,
               const bk_weight *bias, enum bk_act act, void *y, int ldy, bk_err *err)
{
    (void)s;
    const char *op = "linear";
    if (!w) {
        bk_seterr(err, "%s: weight is NULL", op);
        return -1;
    }
    const int in = w->cols, out = w->rows;
    if (rows < 0)
        return cpu_bad_dims(op, "row count", rows, err);
    if (ldx < in || ldy < out) {
        bk_seterr(err, "%s: ldx %d / ldy %d smaller than in %d / out %d", op, ldx, ldy, in, out);
        return -1;
    }
    if (bias && (size_t)bias->rows * (size_t)bias->cols != (size_t)out) {
        bk_seterr(err, "%s: bias has %d x %d elements, expected %d", op, bias->rows, bias->cols,
                  out);
        return -1;
    }
    if ((int)act < 0 || act >= BK_ACT_COUNT)
        return cpu_bad_dims(op, "activation", act, err);
    if (rows == 0 || out == 0)
        return 0;
    if (!x || !y) {
        bk_seterr(err, "%s: NULL input or output", op);
        return -1;
    }
    /* y receives partial sums between k blocks, so it must not overlap x. */
    if (overlap(x, ((size_t)(rows - 1) * ldx + in) * sizeof(float), y,
                ((size_t)(rows - 1) * ldy + out) * sizeof(float))) {
        bk_seterr(err, "%s: output overlaps input", op);
        return -1;
    }
    const float *wp = cpu_weight_packed(w, err);
    if (!wp)
        return -1;
    const float *xf = x, *bv = bias ? bias->data : NULL;
    float *yf = y;
    const int panels = (out + GEMM_NR - 1) / GEMM_NR;

    for (int r0 = 0; r0 < rows; r0 += LIN_MC) {
        const int rn = min_int(LIN_MC, rows - r0);
        for (int k0 = 0;; k0 += LIN_KC) {
            const int kn = min_int(LIN_KC, in - k0);
            const int last = k0 + kn >= in;
            for (int p = 0; p < panels; p++) {
                const float *bp = wp + ((size_t)p * in + k0) * GEMM_NR;
                const int o0 = p * GEMM_NR, nr = min_int(GEMM_NR, out - o0);
                for (int i0 = 0; i0 < rn; i0 += GEMM_MR) {
                    const int mr = min_int(GEMM_MR, rn - i0);
                    const float *a[GEMM_MR];
                    float *c[GEMM_MR];
                    /* A partial last panel goes through tmp: the tile always
                     * runs full width (the panel is zero-padded), but only
                     * nr columns of y are ours. */
                    float tmp[GEMM_MR][GEMM_NR] = {{0}};
                    for (int i = 0; i < GEMM_MR; i++) {
                        a[i] = xf + (size_t)(r0 + i0 + min_int(i, mr - 1)) * ldx + k0;
                        c[i] = i < mr && nr == GEMM_NR
                                   ? yf + (size_t)(r0 + i0 + i) * ldy + o0
                                   : tmp[i];
                        if (i < mr && nr < GEMM_NR && k0 > 0)
                            memcpy(tmp[i], yf + (size_t)(r0 + i0 + i) * ldy + o0,
                                   (size_t)nr * sizeof(float));
                    }
                    gemm_cpu_tile(a, bp, GEMM_NR, kn, GEMM_NR, c, k0 > 0);
                    for (int i = 0; i < mr; i++) {
                        float *yr = yf + (size_t)(r0 + i0 + i) * ldy + o0;
                        if (nr < GEMM_NR)
                            memcpy(yr, tmp[i], (size_t)nr * sizeof(float));
                        if (last)
                            for (int j = 0; j < nr; j++)
                                yr[j] = cpu_activate(bv ? yr[j] + bv[o0 + j] : yr[j], act);
                    }
                }
            }
            if (last)
                break;
        }
    }
    return 0;
}

/* Each group is one linear call: a row's result does not depend on the rows
 * around it (cpu_internal.h's determinism contract), so grouped rows equal
 * contiguous ones bit for bit. */
int cpu_linear_grouped(bk_stream *s, const void *x, int ldx, int64_t gx, int groups, int g,
                       const bk_weight *w, const bk_weight *bias, enum bk_act act, void *y,
                       int ldy, int64_t gy, bk_err *err)
{
    int uni = bk_grouped_check(w != NULL, w ? w->cols : 0, w ? w->rows : 0,
                               bias ? bias->rows * bias->cols : -1, ldx, gx, groups, g, act, ldy,
                               gy, err);
    if (uni)
        return uni < 0 ? -1 : cpu_linear(s, x, ldx, groups * g, w, bias, act, y, ldy, err);
    if (!x || !y) {
        bk_seterr(err, "linear_grouped: NULL input or output");
        return -1;
    }
    if (overlap(x, ((size_t)(groups - 1) * gx + (size_t)(g - 1) * ldx + w->cols) * sizeof(float),
                y, ((size_t)(groups - 1) * gy + (size_t)(g - 1) * ldy + w->rows) * sizeof(float))) {
        bk_seterr(err, "linear_grouped: output overlaps input");
        return -1;
    }
    for (int i = 0; i < groups; i++)
        if (cpu_linear(s, (const float *)x + i * gx, ldx, g, w, bias, act, (float *)y + i * gy,
                       ldy, err))
            return -1;
    return 0;
}

/* ---- lce ---- */

/* out[M, D] = A[M, K] @ B[K, D] (+ addend[M, D] when given), every element a
 * sequential sum over k, then the addend added once. */
static void small_gemm(const float *A, int M, int K, const float *B, int D, const float *addend,
                       float *out)
{
    float dummy[GEMM_NR] = {0};
    for (int m0 = 0; m0 < M; m0 += GEMM_MR) {
        const int mr = min_int(GEMM_MR, M - m0);
        const float *a[GEMM_MR];
        for (int i = 0; i < GEMM_MR; i++)
            a[i] = A + (size_t)(m0 + min_int(i, mr - 1)) * K;
        for (int d0 = 0; d0 < D; d0 += GEMM_NR) {
            const int nr = min_int(GEMM_NR, D - d0);
            float *c[GEMM_MR];
            for (int i = 0; i < GEMM_MR; i++)
                c[i] = i < mr ? out + (size_t)(m0 + i) * D + d0 : dummy;
            gemm_cpu_tile(a, B + d0, (size_t)D, K, nr, c, 0);
            if (addend)
                for (int i = 0; i < mr; i++) {
                    const float *ad = addend + (size_t)(m0 + i) * D + d0;
                    if (nr == GEMM_NR) { /* the same adds, 4 lanes at a time */
                        v4f x0, x1, y0, y1;
                        V4_LD(x0, c[i]);
                        V4_LD(x1, c[i] + 4);
                        V4_LD(y0, ad);
                        V4_LD(y1, ad + 4);
                        x0 = x0 + y0;
                        x1 = x1 + y1;
                        V4_ST(c[i], x0);
                        V4_ST(c[i] + 4, x1);
                    } else {
                        for (int j = 0; j < nr; j++)
                            c[i][j] = c[i][j] + ad[j];
                    }
                }
        }
    }
}

int cpu_lce(bk_stream *s, const void *eu, int nu, const void *ec, int nc, const int32_t *map,
            const bk_weight *w_user, const bk_weight *w_cand, int ku, int kc, int m, int d,
            void *z, bk_err *err)
{
    const char *op = "lce";
    if (nu < 0 || nc < 0 || ku < 0 || kc < 0 || m < 0 || d < 0) {
        bk_seterr(err, "%s: bad sizes nu %d nc %d ku %d kc %d m %d d %d", op, nu, nc, ku, kc, m,
                  d);
        return -1;
    }
    if (!w_user || !w_cand || w_user->rows != m || w_user->cols != ku || w_cand->rows != m ||
        w_cand->cols != kc) {
        bk_seterr(err, "%s: weights must be w_user [%d, %d] and w_cand [%d, %d]", op, m, ku, m,
                  kc);
        return -1;
    }
    if (nc == 0 || m == 0 || d == 0)
        return 0;
    if (!eu || !ec || !z) {
        bk_seterr(err, "%s: NULL user, candidate or output tensor", op);
        return -1;
    }
    if (cpu_check_map(op, map, nc, nu, err))
        return -1;

    /* The user term, once per user: scratch at nu rows, never at nc. */
    const size_t md = (size_t)m * d;
    const size_t ybytes = (size_t)nu * md * sizeof(float);
    float *Y = cpu_alloc(s->be, ybytes, BK_TAG_USER, err);
    if (!Y)
        return -1;
    const float *euf = eu, *ecf = ec;
    for (int u = 0; u < nu; u++)
        small_gemm(w_user->data, m, ku, euf + (size_t)u * ku * d, d, NULL, Y + (size_t)u * md);

    /* The candidate term with the user term added in the epilogue. */
    float *zf = z;
    for (int c = 0; c < nc; c++)
        small_gemm(w_cand->data, m, kc, ecf + (size_t)c * kc * d, d, Y + (size_t)map[c] * md,
                   zf + (size_t)c * md);
    cpu_free(s->be, Y, ybytes, BK_TAG_USER);
    return 0;
}

/* ---- copy_rows, gather (add is beside mul in rank_cpu.c) ---- */

int cpu_copy_rows(bk_stream *s, const void *src, int lds, const int32_t *map, int n, int width,
                  void *dst, int ldd, bk_err *err)
{
    (void)s;
    const char *op = "copy_rows";
    if (n < 0 || width < 0 || lds < width || ldd < width) {
        bk_seterr(err, "%s: bad sizes n %d width %d lds %d ldd %d", op, n, width, lds, ldd);
        return -1;
    }
    if (n == 0 || width == 0)
        return 0;
    if (!src || !dst) {
        bk_seterr(err, "%s: NULL source or destination", op);
        return -1;
    }
    const float *sf = src;
    float *df = dst;
    for (int r = 0; r < n; r++)
        memmove(df + (size_t)r * ldd, sf + (size_t)(map ? map[r] : r) * lds,
                (size_t)width * sizeof(float));
    return 0;
}

int cpu_gather(bk_stream *s, const void *src, const int64_t *src_offsets, const int32_t *map,
               int nc, const int64_t *dst_offsets, int width, void *dst, bk_err *err)
{
    (void)s;
    const char *op = "gather";
    if (nc < 0 || width < 0)
        return cpu_bad_dims(op, nc < 0 ? "row count" : "width", nc < 0 ? nc : width, err);
    if (nc == 0 || width == 0)
        return 0;
    if (!src || !dst) {
        bk_seterr(err, "%s: NULL source or destination", op);
        return -1;
    }
    if (cpu_check_map(op, map, nc, -1, err))
        return -1;
    const float *sf = src;
    float *df = dst;
    const size_t w = (size_t)width;
    if (!src_offsets) {
        for (int c = 0; c < nc; c++)
            memcpy(df + (size_t)c * w, sf + (size_t)map[c] * w, w * sizeof(float));
        return 0;
    }
    if (!dst_offsets) {
        bk_seterr(err, "%s: jagged gather needs dst_offsets", op);
        return -1;
    }
    for (int c = 0; c < nc; c++) {
        const int64_t b = src_offsets[map[c]], e = src_offsets[map[c] + 1];
        if (b < 0 || e < b || dst_offsets[c] < 0) {
            bk_seterr(err, "%s: bad offsets for candidate %d (user %d)", op, c, (int)map[c]);
            return -1;
        }
        if (e > b)
            memcpy(df + (size_t)dst_offsets[c] * w, sf + (size_t)b * w,
                   (size_t)(e - b) * w * sizeof(float));
    }
    return 0;
}
