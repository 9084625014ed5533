/* attention.c - target_attention: each candidate's query tokens attend to
 * its user's history (IKBO).
 *
 * Why this exists: K and V are projected once per user, at the history's
 * event rows, and the attention kernel reads them through the map; the
 * broadcast baseline copies the history to every candidate and projects K/V
 * per candidate. Sequence ops of the history (part 2) join this file's
 * family.
 */
#include "ops.h"

#include <limits.h>

#define QB 280

static int plan_target_attention(op_plan *p)
{
    md_shape s, sb;
    long long H, dh;
    char q[QB], q2[QB], s1[96];
    if (op_input(p, "query", "query", OP_ACC_VALUE, &s) ||
        op_input(p, "history", "history", OP_ACC_VALUE, &sb) ||
        op_int(p, "heads", 1, 0, 1, INT_MAX, &H) || op_int(p, "head_dim", 1, 0, 1, INT_MAX, &dh))
        return -1;
    if (s.dom != MD_CAND || s.kind == MD_JAGGED)
        return op_fail(p, "target_attention query '%s' is %s; it must be candidate-domain vec [D] "
                          "or tokens [Tq, D]",
                       op_in_name(p, 0, q, sizeof q), op_shape_str(s1, sizeof s1, s));
    if (sb.dom != MD_USER || sb.kind != MD_JAGGED)
        return op_fail(p, "target_attention history '%s' is %s; it must be a user-domain jagged "
                          "history (history_embedding output)",
                       op_in_name(p, 1, q, sizeof q), op_shape_str(s1, sizeof s1, sb));
    if (sb.dim != s.dim)
        return op_fail(p, "target_attention history '%s' has D=%d, query '%s' has D=%d",
                       op_in_name(p, 1, q, sizeof q), sb.dim, op_in_name(p, 0, q2, sizeof q2),
                       s.dim);
    if (H * dh > INT_MAX)
        return op_fail(p, "heads * head_dim = %lld is too large", H * dh);
    p->l->heads = (int)H;
    p->l->head_dim = (int)dh;
    return op_output(p, MD_CAND, MD_TOKENS, s.tokens, s.dim) ||
                   op_weight(p, "wq", H * dh, s.dim) || op_weight(p, "wk", H * dh, s.dim) ||
                   op_weight(p, "wv", H * dh, s.dim) || op_weight(p, "wo", s.dim, H * dh)
               ? -1
               : 0;
}

static int run_target_attention(op_run *r)
{
    const md_layer *l = r->l;
    const fwd *f = r->f;
    value q = op_in(r, 0), h = op_in(r, 1);
    int D = l->dim, tq = l->tokens, H = l->heads, dh = l->head_dim, hd = H * dh, C = r->C;
    const void *hp = h.p;
    const int64_t *hoff = h.offsets;
    const int32_t *map = f->map;
    int nu = r->U;
    int64_t ev = f->n_events;
    enum bk_tag kv_tag = BK_TAG_USER;
    if (r->bc) {
        /* The baseline: every candidate gets its own copy of the history,
         * and K/V are projected per candidate. */
        void *g = op_take(r, BK_TAG_BROADCAST, (size_t)f->bc_events, (size_t)D);
        OP_TRY(r, r->be->gather(r->s, h.p, h.offsets, f->map, C, f->bc_off, D, g, r->err));
        hp = g;
        hoff = f->bc_off;
        map = f->identity;
        nu = C;
        ev = f->bc_events;
        kv_tag = BK_TAG_BROADCAST;
    }
    /* What the baseline copies: the history and its K and V, per candidate. */
    op_avoided(r, (size_t)f->bc_events, (size_t)D + 2 * (size_t)hd);
    void *Q = op_take(r, BK_TAG_CAND, (size_t)C * tq, (size_t)hd);
    void *K = op_take(r, kv_tag, (size_t)ev, (size_t)hd);
    void *V = op_take(r, kv_tag, (size_t)ev, (size_t)hd);
    void *O = op_take(r, BK_TAG_CAND, (size_t)C * tq, (size_t)hd);
    void *out = r->out->p = op_out(r, (size_t)C, (size_t)md_layer_width(l));
    bk_backend *be = r->be;
    OP_TRY(r, be->linear(r->s, q.p, D, C * tq, r->w[0], NULL, BK_ACT_NONE, Q, hd, r->err));
    OP_TRY(r, be->linear(r->s, hp, D, (int)ev, r->w[1], NULL, BK_ACT_NONE, K, hd, r->err));
    OP_TRY(r, be->linear(r->s, hp, D, (int)ev, r->w[2], NULL, BK_ACT_NONE, V, hd, r->err));
    OP_TRY(r, be->attention(r->s, Q, K, V, hoff, nu, map, C, tq, H, dh, O, r->err));
    OP_TRY(r, be->linear(r->s, O, hd, C * tq, r->w[3], NULL, BK_ACT_NONE, out, D, r->err));
    return 0;
}

static const char *const ta_keys[] = {"name", "op", "query", "history", "heads", "head_dim", NULL};
const md_op_def md_op_target_attention = {"target_attention", ta_keys, 0, plan_target_attention,
                                          run_target_attention};
