/* attention.c - the attention family: target_attention (candidates' query
 * tokens attend to their user's history, IKBO), self_attention over the
 * history (at U) and din_attention (DIN's activation unit, IKBO).
 *
 * Why this exists: the history side of a sequence model is request-only,
 * so it runs once per user and the candidates read its results through the
 * map; the broadcast baseline copies the history to every candidate.
 * - target_attention: K and V projected once per user at the history's
 *   event rows, as one GEMM (prepare joins wk and wv into [wk; wv]); the
 *   kernel reads them through the map, rows 2 H dh apart. With shared_with it
 *   uses its self_attention layer's weights and K/V: when its query is
 *   ready before that layer runs, the engine fuses both into one backend
 *   call (engine.c plan_fuse) and this layer only projects the output.
 * - self_attention: user-only (runs at U in both modes); keeps K and V in
 *   its op_aux slots for a sharing target_attention.
 * - din_attention: w1 [q; h; q - h; q * h] = (Wq + Wd) q + (Wh - Wd) h +
 *   Wm (q * h) (prepare splits w1 at load), so the h term is one GEMM at
 *   the history's event rows and the q term one at C; only the q * h term
 *   is per (candidate, event) pair, inside the kernel, never a [C, L, D]
 *   tensor.
 */
#include "ops.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#define QB 280

/* aux slots of a self_attention layer */
enum { AUX_K, AUX_V, AUX_TO };

/* Declares wq, wk, wv and, unless wo is off (a target_attention whose wo
 * the lce fold composed away), wo. */
static int plan_heads(op_plan *p, int D, int wo)
{
    long long H, dh;
    if (op_int(p, "heads", 1, 0, 1, INT_MAX, &H) || op_int(p, "head_dim", 1, 0, 1, INT_MAX, &dh))
        return -1;
    if (H * dh > INT_MAX / 4)
        return op_fail(p, "heads * head_dim = %lld is too large", H * dh);
    p->l->heads = (int)H;
    p->l->head_dim = (int)dh;
    return op_weight(p, "wq", H * dh, D) || op_weight(p, "wk", H * dh, D) ||
                   op_weight(p, "wv", H * dh, D) || (wo && op_weight(p, "wo", D, H * dh))
               ? -1
               : 0;
}

static int history_input(op_plan *p, int k, const char *op, md_shape sb)
{
    char q[QB], s1[96];
    if (sb.dom != MD_USER || sb.kind != MD_JAGGED)
        return op_fail(p, "%s history '%s' is %s; it must be a user-domain jagged history "
                          "(history_embedding output or a layer over it)",
                       op, op_in_name(p, k, q, sizeof q), op_shape_str(s1, sizeof s1, sb));
    return 0;
}

/* A candidate query (a vec, or with tokens_ok tokens too) and a user
 * history of the same D. */
static int query_history(op_plan *p, const char *op, md_shape s, md_shape sb, int tokens_ok)
{
    char q[QB], q2[QB], s1[96];
    if (s.dom != MD_CAND || s.kind == MD_JAGGED || (!tokens_ok && s.kind != MD_VEC))
        return op_fail(p, "%s query '%s' is %s; it must be a candidate-domain vec [D]%s", op,
                       op_in_name(p, 0, q, sizeof q), op_shape_str(s1, sizeof s1, s),
                       tokens_ok ? " or tokens [Tq, D]" : "");
    if (history_input(p, 1, op, sb))
        return -1;
    if (sb.dim != s.dim)
        return op_fail(p, "%s history '%s' has D=%d, query '%s' has D=%d", op,
                       op_in_name(p, 1, q, sizeof q), sb.dim, op_in_name(p, 0, q2, sizeof q2),
                       s.dim);
    return 0;
}

/* ---- target_attention ---- */

/* A target_attention's own weights after prepare (without shared_with; with
 * it, the self_attention layer's wq wk wv wo are read). */
enum { TA_WQ, TA_WKV, TA_WO };

/* Q = query Wq^T at C*tq rows of width D into q_out [C*tq, hd]. The query
 * may sit inside the stack that also reads it (value.ld, OP_READS_PITCHED):
 * then each candidate's tq tokens are one group of rows. */
static int query_proj(op_run *r, value q, int D, int tq, int hd, const bk_weight *wq, void *q_out)
{
    int64_t gx = q.ld ? q.ld : (int64_t)tq * D;
    return r->be->linear_grouped(r->s, q.p, D, gx, r->C, tq, wq, NULL, BK_ACT_NONE, q_out, hd,
                                 (int64_t)tq * hd, r->err);
}

/* "project_output": false is the lce fold's (engine/fold.h): wo composed
 * into the weight of the linear that reads this layer's tokens, so the layer
 * writes its heads' outputs ([tq, H*dh], H*dh = D) in their place. Only a
 * rewritten plan may carry the key. Sets l->no_wo. */
static int plan_no_wo(op_plan *p, int S)
{
    int proj;
    if (!json_object_get(p->o, "project_output"))
        return 0;
    if (op_planning(p) != OP_PASS_REWRITTEN)
        return op_fail(p, "'project_output' is set by the engine's lce fold only; remove it");
    if (op_bool(p, "project_output", 1, &proj))
        return -1;
    p->l->no_wo = !proj;
    if (p->l->no_wo && S >= 0)
        return op_fail(p, "'project_output': false cannot go with shared_with");
    return 0;
}

static int plan_target_attention(op_plan *p)
{
    md_shape s, sb;
    char q[QB];
    int S;
    if (op_input(p, "query", "query", OP_ACC_VALUE, &s) ||
        op_input(p, "history", "history", OP_ACC_VALUE, &sb) || op_layer(p, "shared_with", &S) ||
        query_history(p, "target_attention", s, sb, 1))
        return -1;
    if (op_output(p, MD_CAND, MD_TOKENS, s.tokens, s.dim))
        return -1;
    if (plan_no_wo(p, S))
        return -1;
    if (S < 0) {
        if (plan_heads(p, s.dim, !p->l->no_wo))
            return -1;
        if (p->l->no_wo && (long long)p->l->heads * p->l->head_dim != s.dim)
            return op_fail(p, "'project_output': false needs heads * head_dim = D (%d)", s.dim);
        return 0;
    }
    const md_layer *sl = &p->m->layers[S];
    if (sl->op != MD_SELF_ATTENTION)
        return op_fail(p, "shared_with '%s' is a %s layer; it must name a self_attention layer",
                       sl->name, md_ops[sl->op]->name);
    if (json_object_get(p->o, "heads") || json_object_get(p->o, "head_dim"))
        return op_fail(p, "with shared_with, heads and head_dim come from '%s'; remove them",
                       sl->name);
    md_ref h = p->l->in[1], sh = sl->in[0];
    if (h.src != sh.src || h.index != sh.index)
        return op_fail(p, "history '%s' must be the input of shared_with layer '%s'",
                       op_in_name(p, 1, q, sizeof q), sl->name);
    p->l->shared = S;
    p->l->heads = sl->heads;
    p->l->head_dim = sl->head_dim;
    return 0;
}

static int run_target_attention(op_run *r)
{
    const md_layer *l = r->l;
    const fwd *f = r->f;
    value q = op_in(r, 0), h = op_in(r, 1);
    int D = l->dim, tq = l->tokens, H = l->heads, dh = l->head_dim, hd = H * dh, C = r->C;
    bk_weight *const *w = l->shared >= 0 ? op_layer_w(r, l->shared) : r->w;
    const bk_weight *wq = w[l->shared >= 0 ? 0 : TA_WQ], *wo = w[l->shared >= 0 ? 3 : TA_WO];
    bk_backend *be = r->be;
    /* What the baseline copies: the history and its K and V, per candidate. */
    op_avoided(r, (size_t)f->bc_events, (size_t)D + 2 * (size_t)hd);
    int ld; /* a candidate's row: tq*D, or the stack's width when placed (OP_PLACED_TOKENS) */
    void *out = r->out->p = op_out_placed(r, C, tq * D, &ld);
    if (op_fuse(r) >= 0) {
        /* Computed in the self_attention's launch; only Wo is left. */
        void **aux = op_aux(r, l->shared);
        OP_TRY(r, be->linear_grouped(r->s, aux ? aux[AUX_TO] : NULL, hd, (int64_t)tq * hd, C, tq,
                                     wo, NULL, BK_ACT_NONE, out, D, ld, r->err));
        return 0;
    }
    const void *hp = h.p;
    const int64_t *hoff = h.offsets;
    const int32_t *map = f->map;
    int nu = r->U;
    int64_t ev = f->n_events;
    void *Q = op_take(r, BK_TAG_CAND, (size_t)C * tq, (size_t)hd);
    /* With no_wo the heads' outputs are the layer's (hd = D): written in
     * place, ld apart a candidate. */
    void *O = l->no_wo ? out : op_take(r, BK_TAG_CAND, (size_t)C * tq, (size_t)hd);
    int64_t go = l->no_wo ? ld : (int64_t)tq * hd;
    const void *K, *V;
    int ldkv = hd;
    if (r->bc) {
        /* The baseline: every candidate gets its own copy of the history,
         * and K/V are projected per candidate. */
        void *g = op_take(r, BK_TAG_BROADCAST, (size_t)f->bc_events, (size_t)D);
        OP_TRY(r, be->gather(r->s, h.p, h.offsets, f->map, C, f->bc_off, D, g, r->err));
        hp = g;
        hoff = f->bc_off;
        map = f->identity;
        nu = C;
        ev = f->bc_events;
    }
    if (l->shared >= 0 && !r->bc) {
        void **aux = op_aux(r, l->shared); /* K/V once per user, by the self_attention */
        K = aux ? aux[AUX_K] : NULL;
        V = aux ? aux[AUX_V] : NULL;
    } else {
        /* Each event row holds its K then its V: one GEMM with [wk; wv],
         * or, the baseline of a shared layer, its wk and wv side by side.
         * In IKBO mode that reads the user side only: on the user lane,
         * beside the query's projection (engine/lane.h). */
        enum bk_tag kv_tag = r->bc ? BK_TAG_BROADCAST : BK_TAG_USER;
        char *kv = op_take(r, kv_tag, (size_t)ev, 2 * (size_t)hd);
        char *v = kv ? kv + (size_t)hd * be->act_size : NULL;
        bk_stream *ks = r->bc ? r->s : op_lane(r);
        ldkv = 2 * hd;
        if (l->shared < 0) {
            OP_TRY(r, be->linear(ks, hp, D, (int)ev, w[TA_WKV], NULL, BK_ACT_NONE, kv, ldkv, r->err));
        } else {
            OP_TRY(r, be->linear(ks, hp, D, (int)ev, w[1], NULL, BK_ACT_NONE, kv, ldkv, r->err));
            OP_TRY(r, be->linear(ks, hp, D, (int)ev, w[2], NULL, BK_ACT_NONE, v, ldkv, r->err));
        }
        K = kv;
        V = v;
    }
    OP_TRY(r, query_proj(r, q, D, tq, hd, wq, Q));
    OP_TRY(r, op_join(r)); /* K and V (or the shared ones) were made on the lane */
    OP_TRY(r, be->attention(r->s, Q, K, V, ldkv, hoff, nu, map, C, tq, H, dh, O, go, r->err));
    if (!l->no_wo)
        OP_TRY(r, be->linear_grouped(r->s, O, hd, (int64_t)tq * hd, C, tq, wo, NULL, BK_ACT_NONE,
                                     out, D, ld, r->err));
    return 0;
}

/* Joins wk and wv [hd, D] into [wk; wv] [2 hd, D] so K and V come from one
 * GEMM over the history (one launch, the history read once); wo moves to
 * TA_WO. With shared_with the layer has no weights of its own. */
static int prepare_target_attention(md_layer *l, bk_err *err)
{
    if (l->shared >= 0)
        return 0;
    md_weight *wk = &l->w[1], *wv = &l->w[2];
    const size_t n = (size_t)wk->rows * wk->cols;
    size_t nl = strlen(wk->name) + strlen(wv->name) + 2;
    float *kv = realloc(wk->data, 2 * n * sizeof(float));
    char *name = malloc(nl);
    if (!kv || !name) {
        if (kv) wk->data = kv;
        free(name);
        bk_seterr(err, "layer '%s': out of memory", l->name);
        return -1;
    }
    memcpy(kv + n, wv->data, n * sizeof(float));
    snprintf(name, nl, "%s|%s", wk->name, wv->name);
    free(wk->name);
    free(wv->name);
    free(wv->data);
    *wk = (md_weight){.name = name, .rows = 2 * wk->rows, .cols = wk->cols, .data = kv};
    l->w[TA_WO] = l->w[3];
    l->w[3] = (md_weight){0};
    l->n_w = l->no_wo ? 2 : 3;
    return 0;
}

static const char *const ta_keys[] = {"name",     "op",          "query",          "history",
                                      "heads",    "head_dim",    "shared_with",    "project_output",
                                      NULL};
/* K and V once per user (none when shared: the self_attention computes
 * them); Q, the two score/value products and Wo per candidate. */
static md_cost cost_target_attention(const model_def *m, const md_layer *l)
{
    double L = m->hist_max_len, D = l->dim, hd = (double)l->heads * l->head_dim, tq = l->tokens;
    double kv = l->shared >= 0 ? 0 : 4.0 * L * D * hd;
    return (md_cost){.u = kv, .c = (l->no_wo ? 2.0 : 4.0) * tq * D * hd + 4.0 * tq * L * hd};
}

const md_op_def md_op_target_attention = {"target_attention", ta_keys,
                                          OP_PLACED_TOKENS | OP_READS_PITCHED | OP_LANE_SPLIT,
                                          plan_target_attention,
                                          run_target_attention, prepare_target_attention,
    cost_target_attention};

/* ---- self_attention ---- */

static int plan_self_attention(op_plan *p)
{
    md_shape s;
    int causal, kind;
    static const char *const kinds[] = {"softmax", "silu"};
    if (op_input(p, "input", "input", OP_ACC_VALUE, &s) || op_bool(p, "causal", 1, &causal) ||
        op_enum(p, "kind", kinds, 2, BK_ATT_SOFTMAX, &kind) || history_input(p, 0, "self_attention", s))
        return -1;
    p->l->causal = causal;
    p->l->att_kind = (enum bk_att_kind)kind;
    return op_output(p, MD_USER, MD_JAGGED, 1, s.dim) || plan_heads(p, s.dim, 1) ? -1 : 0;
}

static int run_self_attention(op_run *r)
{
    const md_layer *l = r->l;
    const fwd *f = r->f;
    value x = op_in(r, 0);
    int D = l->dim, hd = l->heads * l->head_dim, ev = x.rows;
    bk_backend *be = r->be;
    void *Q = op_take(r, BK_TAG_USER, (size_t)ev, (size_t)hd);
    void *K = op_take(r, BK_TAG_USER, (size_t)ev, (size_t)hd);
    void *V = op_take(r, BK_TAG_USER, (size_t)ev, (size_t)hd);
    void *O = op_take(r, BK_TAG_USER, (size_t)ev, (size_t)hd);
    void *out = op_out_like(r, 0);
    bk_seq_att a = {.k = K, .v = V, .offsets = x.offsets, .events = ev, .nu = r->U, .heads = l->heads,
                    .dh = l->head_dim, .q = Q, .o = O, .causal = l->causal, .kind = l->att_kind};
    int t = op_fuse(r);
    if (t >= 0) {
        /* The sharing target_attention's queries, in the same launch. */
        const md_layer *tl = &r->d->layers[t];
        value tqv = op_in_of(r, t, 0);
        a.tq = op_take(r, BK_TAG_CAND, (size_t)r->C * tl->tokens, (size_t)hd);
        a.to = op_take(r, BK_TAG_CAND, (size_t)r->C * tl->tokens, (size_t)hd);
        a.map = f->map;
        a.nc = r->C;
        a.tq_tokens = tl->tokens;
        OP_TRY(r, query_proj(r, tqv, D, tl->tokens, hd, r->w[0], (void *)a.tq));
    }
    OP_TRY(r, be->linear(r->s, x.p, D, ev, r->w[0], NULL, BK_ACT_NONE, Q, hd, r->err));
    OP_TRY(r, be->linear(r->s, x.p, D, ev, r->w[1], NULL, BK_ACT_NONE, K, hd, r->err));
    OP_TRY(r, be->linear(r->s, x.p, D, ev, r->w[2], NULL, BK_ACT_NONE, V, hd, r->err));
    OP_TRY(r, be->self_attention(r->s, &a, r->err));
    OP_TRY(r, be->linear(r->s, O, hd, ev, r->w[3], NULL, BK_ACT_NONE, out, D, r->err));
    void **aux = op_aux(r, r->li);
    aux[AUX_K] = K;
    aux[AUX_V] = V;
    aux[AUX_TO] = a.to;
    return 0;
}

static const char *const sa_keys[] = {"name", "op", "input", "heads", "head_dim", "causal",
                                      "kind", NULL};
static md_cost cost_self_attention(const model_def *m, const md_layer *l)
{
    double L = m->hist_max_len, D = l->dim, hd = (double)l->heads * l->head_dim;
    return (md_cost){.u = 8.0 * L * D * hd + 4.0 * L * L * hd * (l->causal ? 0.5 : 1.0)};
}

const md_op_def md_op_self_attention = {"self_attention", sa_keys, 0, plan_self_attention,
                                        run_self_attention, NULL,
    cost_self_attention};

/* ---- din_attention ---- */

/* w[] after prepare: 0 Wq' = Wq + Wd [H1, D], 1 b1, 2 w2, 3 b2, 4 Wh' = Wh - Wd,
 * 5 Wm (the q * h columns). */
enum { DIN_WQ, DIN_B1, DIN_W2, DIN_B2, DIN_WH, DIN_WM };

static int plan_din_attention(op_plan *p)
{
    md_shape s, sb;
    long long H1;
    int norm;
    enum bk_act act;
    static const char *const norms[] = {"none", "softmax"};
    if (op_input(p, "query", "query", OP_ACC_VALUE, &s) ||
        op_input(p, "history", "history", OP_ACC_VALUE, &sb) ||
        op_int(p, "hidden", 1, 0, 1, INT_MAX, &H1) || op_act(p, "activation", 1, BK_ACT_RELU, &act) ||
        op_enum(p, "normalize", norms, 2, 1, &norm) || query_history(p, "din_attention", s, sb, 0))
        return -1;
    if (4LL * s.dim > INT_MAX)
        return op_fail(p, "din_attention D=%d is too wide", s.dim);
    p->l->hidden = (int)H1;
    p->l->act = act;
    p->l->normalize = norm;
    return op_output(p, MD_CAND, MD_VEC, 1, s.dim) || op_weight(p, "w1", H1, 4LL * s.dim) ||
                   op_weight1(p, "b1", H1) || op_weight(p, "w2", 1, H1) || op_weight1(p, "b2", 1)
               ? -1
               : 0;
}

/* Splits w1 [H1, 4D] = [Wq | Wh | Wd | Wm] into Wq + Wd, Wh - Wd and Wm
 * ([H1, D] each). */
static int prepare_din(md_layer *l, bk_err *err)
{
    const int H1 = l->hidden, D = l->dim;
    md_weight *w1 = &l->w[DIN_WQ];
    float *wq = malloc((size_t)H1 * D * sizeof(float));
    float *wh = malloc((size_t)H1 * D * sizeof(float));
    float *wm = malloc((size_t)H1 * D * sizeof(float));
    size_t nl = strlen(w1->name) + 4;
    char *nh = malloc(nl), *nm = malloc(nl);
    if (!wq || !wh || !wm || !nh || !nm) {
        free(wq), free(wh), free(wm), free(nh), free(nm);
        bk_seterr(err, "layer '%s': out of memory", l->name);
        return -1;
    }
    for (int k = 0; k < H1; k++) {
        const float *row = w1->data + (size_t)k * 4 * D;
        for (int e = 0; e < D; e++) {
            wq[(size_t)k * D + e] = row[e] + row[2 * D + e];
            wh[(size_t)k * D + e] = row[D + e] - row[2 * D + e];
            wm[(size_t)k * D + e] = row[3 * D + e];
        }
    }
    snprintf(nh, nl, "%s(h)", w1->name);
    snprintf(nm, nl, "%s(m)", w1->name);
    free(w1->data);
    w1->data = wq;
    w1->cols = D;
    l->w[DIN_WH] = (md_weight){.name = nh, .rows = H1, .cols = D, .data = wh};
    l->w[DIN_WM] = (md_weight){.name = nm, .rows = H1, .cols = D, .data = wm};
    l->n_w = 6;
    return 0;
}

static int run_din_attention(op_run *r)
{
    const md_layer *l = r->l;
    const fwd *f = r->f;
    value q = op_in(r, 0), h = op_in(r, 1);
    int D = l->dim, H1 = l->hidden, C = r->C;
    bk_backend *be = r->be;
    const void *hv = h.p;
    const int64_t *hoff = h.offsets;
    const int32_t *map = f->map;
    int64_t ev = h.rows;
    enum bk_tag tag = BK_TAG_USER;
    if (r->bc) {
        void *g = op_take(r, BK_TAG_BROADCAST, (size_t)f->bc_events, (size_t)D);
        OP_TRY(r, be->gather(r->s, h.p, h.offsets, f->map, C, f->bc_off, D, g, r->err));
        hv = g;
        hoff = f->bc_off;
        map = f->identity;
        ev = f->bc_events;
        tag = BK_TAG_BROADCAST;
    } else {
        /* The baseline copies the history and its projection per candidate. */
        op_avoided(r, (size_t)f->bc_events, (size_t)D + (size_t)H1);
    }
    void *qp = op_take(r, BK_TAG_CAND, (size_t)C, (size_t)H1);
    void *hp = op_take(r, tag, (size_t)ev, (size_t)H1);
    void *out = r->out->p = op_out(r, (size_t)C, (size_t)D);
    OP_TRY(r, be->linear(r->s, q.p, D, C, r->w[DIN_WQ], r->w[DIN_B1], BK_ACT_NONE, qp, H1, r->err));
    OP_TRY(r, be->linear(r->s, hv, D, (int)ev, r->w[DIN_WH], NULL, BK_ACT_NONE, hp, H1, r->err));
    OP_TRY(r, be->din_attention(r->s, q.p, qp, hv, hp, hoff, map, C, D, H1, r->w[DIN_WM],
                                r->w[DIN_W2], r->w[DIN_B2], l->act, l->normalize, out, r->err));
    return 0;
}

static const char *const din_keys[] = {"name",   "op",         "query",     "history",
                                       "hidden", "activation", "normalize", NULL};
/* The history part of w1 once per user (prepare_din's split); per candidate
 * its own part, then per event the q*h part, w2 and the weighted sum. */
static md_cost cost_din_attention(const model_def *m, const md_layer *l)
{
    double L = m->hist_max_len, D = l->dim, H1 = l->hidden;
    return (md_cost){.u = 2.0 * L * D * H1,
                     .c = 2.0 * D * H1 + L * (2.0 * D * H1 + 2.0 * H1 + 3.0 * D)};
}

const md_op_def md_op_din_attention = {"din_attention", din_keys, 0, plan_din_attention,
                                       run_din_attention, prepare_din,
    cost_din_attention};
