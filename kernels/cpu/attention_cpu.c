/* attention_cpu.c - the CPU backend's attention family: IKBO target
 * attention, self-attention over the history (softmax and HSTU's silu,
 * causal or full) and DIN attention, in fp32.
 *
 * Why this exists: the three ops are one computation - query rows against
 * one user's keys, weights from the scores, a weighted sum of values - that
 * differs in which rows are queries, how many keys each sees and how scores
 * become weights. One core (att_rows) does the matmul-shaped part for all
 * of them, so the reference every GPU kernel is checked against is written
 * once.
 *
 * The core, per user and head: the user's keys transposed to [dh, lp] and
 * pre-scaled by 1/sqrt(dh) (scores then vectorize over events), GEMM_MR
 * query rows at a time: scores through gemm_cpu_tile, weights in place
 * (softmax numerators, or silu), O = W V through gemm_cpu_tile, then one
 * division per row (the softmax sum, or silu's event count n). Causal rows
 * see keys j <= i: a tile's scores are computed up to its last row's key
 * count and each row's weights past its own count are zero, so a row's
 * arithmetic depends on the user's history and its position in it only
 * (cpu_internal.h's determinism rule; an exact 0 * v adds nothing).
 *
 * IKBO: target attention processes all query rows of a run of candidates
 * that share a user together and reads K/V at the user's event rows; DIN
 * reads the user's history rows and their projections through the map.
 * Neither copies a user tensor to candidate rows. Scratch (transposed keys,
 * scores) is accounted under BK_TAG_USER and freed before the op returns.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu_internal.h"

static inline int min_i(int a, int b) { return a < b ? a : b; }

/* Scratch for one op: transposed keys [dh, lpmax] and GEMM_MR score rows. */
typedef struct att_scratch {
    float *kt, *sc;
    size_t bytes;
    int lpmax;
} att_scratch;

static int scratch_get(bk_stream *s, const char *op, const int64_t *offsets, int nu, int dh,
                       att_scratch *w, bk_err *err)
{
    int64_t lmax = 0;
    for (int u = 0; u < nu; u++)
        if (offsets[u + 1] - offsets[u] > lmax)
            lmax = offsets[u + 1] - offsets[u];
    if (lmax > INT32_MAX / GEMM_MR / 2) {
        bk_seterr(err, "%s: a user has %lld events, too many", op, (long long)lmax);
        return -1;
    }
    w->lpmax = (int)((lmax + GEMM_NR - 1) / GEMM_NR * GEMM_NR);
    if (w->lpmax == 0)
        w->lpmax = GEMM_NR;
    w->bytes = ((size_t)dh + GEMM_MR) * (size_t)w->lpmax * sizeof(float);
    if (!(w->kt = cpu_alloc(s->be, w->bytes, BK_TAG_USER, err)))
        return -1;
    w->sc = w->kt + (size_t)dh * w->lpmax;
    return 0;
}

/* One head of one user's keys into kt [dh, lp] scaled by 1/sqrt(dh), zero
 * past L. ku points at the user's first event, head offset applied. */
static void keys_t(const float *ku, size_t hd, int L, int dh, float *kt, int lp)
{
    const float scale = 1.0f / sqrtf((float)dh);
    for (int e = 0; e < dh; e++) {
        float *kte = kt + (size_t)e * lp;
        for (int j = 0; j < L; j++)
            kte[j] = ku[(size_t)j * hd + e] * scale;
        for (int j = L; j < lp; j++)
            kte[j] = 0.0f;
    }
}

/* Query rows q[0 .. nrows) (stride hd, head offset applied) against the
 * transposed keys kt [dh, lp] and values vu (stride ldv) of L events; o
 * at stride hd, or, otq > 0 (target rows into candidate spans, the
 * attention op's go), row r at o + (r / otq) * go + (r % otq) * hd.
 * causal: row i sees keys j <= i0 + i (i0 = the rows' first event index),
 * else all L. */
typedef struct att_rows_args {
    const float *q, *kt, *vu;
    float *o, *sc;
    size_t hd, ldv, go;
    int nrows, L, lp, dh, causal, i0, otq;
    enum bk_att_kind kind;
} att_rows_args;

/* Output row r of att_rows: only the address depends on the layout, so a
 * row's arithmetic is the same packed or strided (the determinism rule). */
static inline float *att_orow(const att_rows_args *x, int r)
{
    if (x->otq <= 0)
        return x->o + (size_t)r * x->hd;
    return x->o + (size_t)(r / x->otq) * x->go + (size_t)(r % x->otq) * x->hd;
}

static void att_rows(const att_rows_args *x)
{
    float dummy[GEMM_NR] = {0};
    const float n_events = (float)x->L; /* silu divides by the event count */
    for (int r0 = 0; r0 < x->nrows; r0 += GEMM_MR) {
        const int mr = min_i(GEMM_MR, x->nrows - r0);
        /* Keys this tile needs: all, or up to its last row's position. */
        const int kn = x->causal ? min_i(x->L, x->i0 + r0 + mr) : x->L;
        const int kp = (kn + GEMM_NR - 1) / GEMM_NR * GEMM_NR;
        const float *a[GEMM_MR];
        float div[GEMM_MR];
        for (int i = 0; i < GEMM_MR; i++)
            a[i] = x->q + (size_t)(r0 + min_i(i, mr - 1)) * x->hd;
        for (int j0 = 0; j0 < kp; j0 += GEMM_NR) {
            float *c[GEMM_MR];
            for (int i = 0; i < GEMM_MR; i++)
                c[i] = x->sc + (size_t)i * x->lp + j0; /* spare rows: scratch */
            gemm_cpu_tile(a, x->kt + j0, (size_t)x->lp, x->dh, GEMM_NR, c, 0);
        }
        for (int i = 0; i < mr; i++) {
            float *si = x->sc + (size_t)i * x->lp;
            const int ni = x->causal ? min_i(x->L, x->i0 + r0 + i + 1) : x->L;
            if (x->kind == BK_ATT_SOFTMAX) {
                div[i] = cpu_softmax_row(si, ni); /* zeroes up to pad4(ni) */
            } else {
                for (int j = 0; j < ni; j++)
                    si[j] = cpu_activate(si[j], BK_ACT_SILU);
                div[i] = n_events;
            }
            for (int j = ni; j < kn; j++)
                si[j] = 0.0f;
        }
        for (int i = 0; i < GEMM_MR; i++)
            a[i] = x->sc + (size_t)min_i(i, mr - 1) * x->lp;
        for (int d0 = 0; d0 < x->dh; d0 += GEMM_NR) {
            const int nr = min_i(GEMM_NR, x->dh - d0);
            float *c[GEMM_MR];
            for (int i = 0; i < GEMM_MR; i++)
                c[i] = i < mr ? att_orow(x, r0 + i) + d0 : dummy;
            gemm_cpu_tile(a, x->vu + d0, x->ldv, kn, nr, c, 0);
            for (int i = 0; i < mr; i++) {
                if (nr == GEMM_NR) { /* the same divisions, 4 lanes at a time */
                    const v4f t = {div[i], div[i], div[i], div[i]};
                    v4f x0, x1;
                    V4_LD(x0, c[i]);
                    V4_LD(x1, c[i] + 4);
                    x0 = x0 / t;
                    x1 = x1 / t;
                    V4_ST(c[i], x0);
                    V4_ST(c[i] + 4, x1);
                } else {
                    for (int j = 0; j < nr; j++)
                        c[i][j] = c[i][j] / div[i];
                }
            }
        }
    }
}

static int bad_sizes(const char *op, int nu, int n, int tq, int heads, int dh, bk_err *err)
{
    if (nu < 0 || n < 0 || tq < 0 || heads <= 0 || dh <= 0) {
        bk_seterr(err, "%s: bad sizes nu %d n %d tq %d heads %d dh %d", op, nu, n, tq, heads, dh);
        return 1;
    }
    return 0;
}

/* Target attention rows (the attention op), scratch already sized; K and
 * V rows ldkv apart; candidate c's tq output rows at o + c * go. */
static void target_rows(const float *q, const float *k, const float *v, size_t ldkv,
                        const int64_t *offsets, const int32_t *map, int nc, int tq, int heads,
                        int dh, float *o, size_t go, const att_scratch *w)
{
    const size_t hd = (size_t)heads * dh;
    for (int c0 = 0, c1; c0 < nc; c0 = c1) {
        /* A run of candidates of one user shares its keys (map is grouped by
         * user, so runs are long; any map works). */
        const int u = map[c0];
        for (c1 = c0 + 1; c1 < nc && map[c1] == u; c1++)
            ;
        const size_t row0 = (size_t)c0 * tq;
        const int nrows = (c1 - c0) * tq;
        const int L = (int)(offsets[u + 1] - offsets[u]);
        if (L == 0) { /* each span alone: nothing between them is written */
            for (int c = c0; c < c1; c++)
                memset(o + (size_t)c * go, 0, (size_t)tq * hd * sizeof(float));
            continue;
        }
        const int lp = (L + GEMM_NR - 1) / GEMM_NR * GEMM_NR;
        const float *ku = k + (size_t)offsets[u] * ldkv, *vu = v + (size_t)offsets[u] * ldkv;
        for (int h = 0; h < heads; h++) {
            const size_t ho = (size_t)h * dh;
            keys_t(ku + ho, ldkv, L, dh, w->kt, lp);
            att_rows(&(att_rows_args){.q = q + row0 * hd + ho, .kt = w->kt, .vu = vu + ho,
                                      .o = o + (size_t)c0 * go + ho, .sc = w->sc, .hd = hd,
                                      .go = go, .otq = tq, .ldv = ldkv, .nrows = nrows, .L = L,
                                      .lp = lp, .dh = dh, .kind = BK_ATT_SOFTMAX});
        }
    }
}

int cpu_attention(bk_stream *s, const void *q, const void *k, const void *v, int ldkv,
                  const int64_t *offsets, int nu, const int32_t *map, int nc, int tq, int heads,
                  int dh, void *o, int64_t go, bk_err *err)
{
    const char *op = "attention";
    if (bad_sizes(op, nu, nc, tq, heads, dh, err) ||
        bk_bad_stride(op, "K/V row stride", ldkv, "heads * head_dim", (int64_t)heads * dh, err) ||
        bk_bad_stride(op, "output candidate stride go", go, "tq * heads * head_dim",
                      (int64_t)tq * heads * dh, err))
        return -1;
    if (nc == 0 || tq == 0)
        return 0;
    if (!q || !o) {
        bk_seterr(err, "%s: NULL query or output", op);
        return -1;
    }
    if (cpu_check_map(op, map, nc, nu, err) || cpu_check_offsets(op, offsets, nu, err))
        return -1;
    if (offsets[nu] > offsets[0] && (!k || !v)) {
        bk_seterr(err, "%s: NULL keys or values", op);
        return -1;
    }
    att_scratch w;
    if (scratch_get(s, op, offsets, nu, dh, &w, err))
        return -1;
    target_rows(q, k, v, (size_t)ldkv, offsets, map, nc, tq, heads, dh, o, (size_t)go, &w);
    cpu_free(s->be, w.kt, w.bytes, BK_TAG_USER);
    return 0;
}

int cpu_self_attention(bk_stream *s, const bk_seq_att *a, bk_err *err)
{
    const char *op = "self_attention";
    if (bad_sizes(op, a->nu, a->tq ? a->nc : 0, a->tq ? a->tq_tokens : 0, a->heads, a->dh, err))
        return -1;
    if (a->kind != BK_ATT_SOFTMAX && a->kind != BK_ATT_SILU) {
        bk_seterr(err, "%s: unknown kind %d", op, (int)a->kind);
        return -1;
    }
    if (cpu_check_offsets(op, a->offsets, a->nu, err))
        return -1;
    const int64_t ev = a->offsets[a->nu] - a->offsets[0];
    if (a->events != a->offsets[a->nu]) {
        bk_seterr(err, "%s: events %lld but offsets end at %lld", op, (long long)a->events,
                  (long long)a->offsets[a->nu]);
        return -1;
    }
    if (ev > 0 && (!a->k || !a->v || (a->q && !a->o))) {
        bk_seterr(err, "%s: NULL keys, values or output", op);
        return -1;
    }
    if (a->tq && (!a->to || cpu_check_map(op, a->map, a->nc, a->nu, err))) {
        if (!a->to)
            bk_seterr(err, "%s: target part without an output", op);
        return -1;
    }
    att_scratch w;
    if (scratch_get(s, op, a->offsets, a->nu, a->dh, &w, err))
        return -1;
    const size_t hd = (size_t)a->heads * a->dh;
    const float *qf = a->q, *kf = a->k, *vf = a->v;
    float *of = a->o;
    for (int u = 0; a->q && u < a->nu; u++) {
        const int L = (int)(a->offsets[u + 1] - a->offsets[u]);
        if (L == 0)
            continue;
        const int lp = (L + GEMM_NR - 1) / GEMM_NR * GEMM_NR;
        const size_t e0 = (size_t)a->offsets[u] * hd;
        for (int h = 0; h < a->heads; h++) {
            const size_t ho = (size_t)h * a->dh;
            keys_t(kf + e0 + ho, hd, L, a->dh, w.kt, lp);
            att_rows(&(att_rows_args){.q = qf + e0 + ho, .kt = w.kt, .vu = vf + e0 + ho,
                                      .o = of + e0 + ho, .sc = w.sc, .hd = hd, .ldv = hd, .nrows = L,
                                      .L = L, .lp = lp, .dh = a->dh, .causal = a->causal,
                                      .kind = a->kind});
        }
    }
    if (a->tq && a->nc > 0 && a->tq_tokens > 0)
        target_rows(a->tq, kf, vf, hd, a->offsets, a->map, a->nc, a->tq_tokens, a->heads, a->dh,
                    a->to, (size_t)a->tq_tokens * hd, &w); /* to is packed */
    cpu_free(s->be, w.kt, w.bytes, BK_TAG_USER);
    return 0;
}

/* ---- DIN ---- */

int cpu_din_attention(bk_stream *s, const void *q, const void *qp, const void *h, const void *hp,
                      const int64_t *offsets, const int32_t *map, int n, int d, int h1,
                      const bk_weight *wd, const bk_weight *w2, const bk_weight *b2,
                      enum bk_act act, int normalize, void *out, bk_err *err)
{
    const char *op = "din_attention";
    if (n < 0 || d <= 0 || h1 <= 0) {
        bk_seterr(err, "%s: bad sizes n %d d %d h1 %d", op, n, d, h1);
        return -1;
    }
    if (n == 0)
        return 0;
    if (!q || !qp || !out || !wd || !w2 || !b2) {
        bk_seterr(err, "%s: NULL argument", op);
        return -1;
    }
    if (wd->rows != h1 || wd->cols != d || w2->rows != 1 || w2->cols != h1 ||
        b2->rows * b2->cols != 1) {
        bk_seterr(err, "%s: weights [%d, %d], [%d, %d], [%d, %d] do not fit h1 %d, d %d", op,
                  wd->rows, wd->cols, w2->rows, w2->cols, b2->rows, b2->cols, h1, d);
        return -1;
    }
    int nu = -1;
    if (map) {
        for (int r = 0; r < n; r++)
            if (map[r] + 1 > nu)
                nu = map[r] + 1;
        if (cpu_check_map(op, map, n, -1, err))
            return -1;
    } else {
        nu = n;
    }
    if (cpu_check_offsets(op, offsets, nu, err))
        return -1;
    if (offsets[nu] > offsets[0] && (!h || !hp)) {
        bk_seterr(err, "%s: NULL history", op);
        return -1;
    }
    int64_t lmax = 0;
    for (int u = 0; u < nu; u++)
        if (offsets[u + 1] - offsets[u] > lmax)
            lmax = offsets[u + 1] - offsets[u];
    /* Scratch: q[r] * wd's columns folded per row ([h1, d]), pre [h1], s [L]. */
    const size_t bytes = ((size_t)h1 * d + (size_t)h1 + (size_t)(lmax ? lmax : 1)) * sizeof(float);
    float *m = cpu_alloc(s->be, bytes, BK_TAG_USER, err);
    if (!m)
        return -1;
    float *pre = m + (size_t)h1 * d, *sj = pre + h1;
    const float *qf = q, *qpf = qp, *hf = h, *hpf = hp, *W = wd->data, *v2 = w2->data;
    const float bias2 = b2->data[0];
    float *of = out;
    for (int r = 0; r < n; r++) {
        const int u = map ? map[r] : r;
        const int64_t e0 = offsets[u];
        const int L = (int)(offsets[u + 1] - e0);
        float *orow = of + (size_t)r * d;
        memset(orow, 0, (size_t)d * sizeof(float));
        if (L == 0)
            continue;
        const float *qr = qf + (size_t)r * d;
        for (int k = 0; k < h1; k++)
            for (int e = 0; e < d; e++)
                m[(size_t)k * d + e] = W[(size_t)k * d + e] * qr[e];
        float mx = -INFINITY;
        for (int j = 0; j < L; j++) {
            const float *hj = hf + (size_t)(e0 + j) * d, *hpj = hpf + (size_t)(e0 + j) * h1;
            float sc = 0.0f;
            for (int k = 0; k < h1; k++) {
                const float *mk = m + (size_t)k * d;
                float acc = 0.0f;
                for (int e = 0; e < d; e++)
                    acc = fmaf(mk[e], hj[e], acc);
                pre[k] = qpf[(size_t)r * h1 + k] + hpj[k] + acc;
                sc = fmaf(v2[k], cpu_activate(pre[k], act), sc);
            }
            sj[j] = sc + bias2;
            mx = fmaxf(mx, sj[j]);
        }
        if (normalize) {
            float sum = 0.0f;
            for (int j = 0; j < L; j++) {
                sj[j] = expf(sj[j] - mx);
                sum += sj[j];
            }
            for (int j = 0; j < L; j++)
                sj[j] /= sum;
        }
        for (int j = 0; j < L; j++) {
            const float *hj = hf + (size_t)(e0 + j) * d;
            for (int e = 0; e < d; e++)
                orow[e] = fmaf(sj[j], hj[e], orow[e]);
        }
    }
    cpu_free(s->be, m, bytes, BK_TAG_USER);
    return 0;
}
