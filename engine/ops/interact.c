/* interact.c - the IKBO interaction ops: lce and dot_interaction.
 *
 * Why this exists: both mix a user's tokens with each of its candidates'
 * tokens, and both are where broadcasting would copy user tensors to C rows.
 *
 * lce: Z[c] = w_user @ E_user[map c] + w_cand @ E_cand[c]; the backend
 * multiplies the user part once per user and reads it through the map.
 *
 * dot_interaction over user and candidate tokens (DLRM) never builds the
 * [C, K, D] stack. The work splits three ways: pairs of two user tokens
 * depend only on the user and are computed once per user, at U, into a
 * [U, Pu] scratch; user-candidate and candidate-candidate pairs are computed
 * at C, reading user tokens through the map; the kernel copies each
 * candidate's user-user pairs from the scratch row of its user. Several
 * inputs of one side are first stacked at that side's rows (a user-side copy
 * is at U; candidate inputs are candidate rows anyway); one input per side
 * is read where it is.
 */
#include "ops.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#define QB 280

static int plan_lce(op_plan *p)
{
    md_shape s, sb;
    long long M;
    char q[QB], q2[QB], s1[96];
    if (op_input(p, "user", "user operand", OP_ACC_VALUE, &s) ||
        op_input(p, "candidate", "candidate operand", OP_ACC_VALUE, &sb) ||
        op_int(p, "out_tokens", 1, 0, 1, INT_MAX, &M))
        return -1;
    if (s.dom != MD_USER || s.kind == MD_JAGGED)
        return op_fail(p, "lce user operand '%s' is %s; it must be user-domain vec [D] or tokens "
                          "[Ku, D]",
                       op_in_name(p, 0, q, sizeof q), op_shape_str(s1, sizeof s1, s));
    if (sb.dom != MD_CAND || sb.kind == MD_JAGGED)
        return op_fail(p, "lce candidate operand '%s' is %s; it must be candidate-domain vec [D] "
                          "or tokens [Kc, D]",
                       op_in_name(p, 1, q, sizeof q), op_shape_str(s1, sizeof s1, sb));
    if (s.dim != sb.dim)
        return op_fail(p, "lce user operand '%s' has D=%d, candidate operand '%s' has D=%d",
                       op_in_name(p, 0, q, sizeof q), s.dim, op_in_name(p, 1, q2, sizeof q2),
                       sb.dim);
    return op_output(p, MD_CAND, MD_TOKENS, M, s.dim) || op_weight(p, "w_user", M, s.tokens) ||
                   op_weight(p, "w_cand", M, sb.tokens)
               ? -1
               : 0;
}

static int run_lce(op_run *r)
{
    const md_layer *l = r->l;
    value eu = op_in(r, 0), ec = op_in(r, 1);
    int D = l->dim, M = l->tokens;
    int ku = op_in_width(r, 0) / D, kc = op_in_width(r, 1) / D;
    const void *eup = eu.p;
    const int32_t *map = r->f->map;
    int nu = r->U;
    if (r->bc) {
        if (!(eup = op_broadcast(r, eu.p, ku * D)))
            return -1;
        map = r->f->identity;
        nu = r->C;
    }
    op_avoided(r, (size_t)r->C, (size_t)ku * D);
    r->out->p = op_out(r, (size_t)r->C, (size_t)md_layer_width(l));
    OP_TRY(r, r->be->lce(r->s, eup, nu, ec.p, r->C, map, r->w[0], r->w[1], ku, kc, M, D,
                         r->out->p, r->err));
    return 0;
}

static const char *const lce_keys[] = {"name", "op", "user", "candidate", "out_tokens", NULL};
/* The user term once per user, the candidate term and the sum per candidate. */
static md_cost cost_lce(const model_def *m, const md_layer *l)
{
    double MD = (double)l->tokens * l->dim;
    return (md_cost){.u = 2.0 * MD * md_ref_tokens(m, l->in[0]),
                     .c = 2.0 * MD * md_ref_tokens(m, l->in[1]) + MD};
}

const md_op_def md_op_lce = {"lce", lce_keys, 0, plan_lce, run_lce, NULL,
    cost_lce};

static int plan_dot_interaction(op_plan *p)
{
    md_shape *s;
    int n, self, rc = -1;
    long long K = 0;
    char q[QB], q2[QB], s1[96];
    if (op_bool(p, "self", 0, &self) || op_inputs(p, "inputs", &s, &n))
        return -1;
    enum md_domain dom = MD_USER;
    for (int k = 0; k < n; k++) {
        op_in_name(p, k, q2, sizeof q2);
        if (s[k].kind == MD_JAGGED) {
            op_fail(p, "dot_interaction input '%s' is %s; it takes vectors [D] or tokens [K, D] "
                       "(pool a jagged history first)",
                    q2, op_shape_str(s1, sizeof s1, s[k]));
            goto out;
        }
        if (s[k].dim != s[0].dim) {
            op_fail(p, "dot_interaction inputs need one width D: '%s' has D=%d, '%s' has D=%d",
                    op_in_name(p, 0, q, sizeof q), s[0].dim, q2, s[k].dim);
            goto out;
        }
        if (s[k].dom == MD_CAND)
            dom = MD_CAND;
        K += s[k].tokens;
        if (K > BK_DOT_MAX_TOKENS) {
            op_fail(p, "dot_interaction over more than %d tokens", BK_DOT_MAX_TOKENS);
            goto out;
        }
    }
    if (K < 2 && !self) {
        op_fail(p, "dot_interaction over %lld token has no pairs (give 2 or more tokens, or "
                   "\"self\": true)",
                K);
        goto out;
    }
    p->l->self = self;
    rc = op_output(p, dom, MD_VEC, 1, self ? K * (K + 1) / 2 : K * (K - 1) / 2);
out:
    free(s);
    return rc;
}

/* The inputs of one side (user or candidate) as one [rows, k*d] buffer:
 * the input itself when it is the only one, else a copy at those rows. */
static int side_stack(op_run *r, enum md_domain side, int rows, int d, const void **out)
{
    const md_layer *l = r->l;
    int n = 0, only = -1, k_all = 0;
    for (int k = 0; k < l->n_in; k++)
        if (op_in_domain(r, k) == side) {
            n++;
            only = k;
            k_all += op_in_width(r, k) / d;
        }
    *out = NULL;
    if (n == 0)
        return 0;
    if (n == 1) {
        *out = op_in(r, only).p;
        return 0;
    }
    char *buf = op_take(r, side == MD_USER ? BK_TAG_USER : BK_TAG_CAND, (size_t)rows,
                        (size_t)k_all * d);
    size_t col = 0;
    for (int k = 0; k < l->n_in; k++) {
        if (op_in_domain(r, k) != side)
            continue;
        int wi = op_in_width(r, k);
        OP_TRY(r, r->be->copy_rows(r->s, op_in(r, k).p, wi, NULL, rows, wi,
                                   buf + col * r->be->act_size, k_all * d, r->err));
        col += (size_t)wi;
    }
    *out = buf;
    return 0;
}

static int run_dot_interaction(op_run *r)
{
    const md_layer *l = r->l;
    int d = op_in_width(r, 0) / op_in_tokens(r, 0);
    bk_dot_order ord = {0}, uo = {0};
    uint16_t cpos[BK_DOT_MAX_TOKENS];
    int place = 0;
    /* ord numbers user tokens first, then candidate tokens, each in input order. */
    for (int k = 0; k < l->n_in; k++) {
        int user = op_in_domain(r, k) == MD_USER;
        for (int j = 0; j < op_in_tokens(r, k); j++, place++) {
            if (user)
                ord.pos[ord.ku++] = (uint16_t)place;
            else
                cpos[ord.kc++] = (uint16_t)place;
        }
    }
    memcpy(ord.pos + ord.ku, cpos, (size_t)ord.kc * sizeof cpos[0]);
    const void *tu, *tc;
    if (side_stack(r, MD_USER, r->U, d, &tu) || side_stack(r, MD_CAND, r->C, d, &tc))
        return -1;
    r->out->p = op_out(r, (size_t)r->rows, (size_t)l->dim);
    const int32_t *map = NULL;
    const void *uu = NULL;
    if (l->domain == MD_CAND && ord.ku > 0) {
        if (r->bc) { /* the baseline: user tokens copied to every candidate */
            if (!(tu = op_broadcast(r, tu, ord.ku * d)))
                return -1;
        } else {
            int pu = l->self ? ord.ku * (ord.ku + 1) / 2 : ord.ku * (ord.ku - 1) / 2;
            map = r->f->map;
            op_avoided(r, (size_t)r->C, (size_t)ord.ku * d);
            if (pu > 0) { /* user-user pairs once per user */
                void *u = op_take(r, BK_TAG_USER, (size_t)r->U, (size_t)pu);
                uo.ku = ord.ku;
                for (int t = 0; t < ord.ku; t++)
                    uo.pos[t] = (uint16_t)t;
                OP_TRY(r, r->be->dot_interaction(r->s, tu, NULL, NULL, NULL, r->U, &uo, d,
                                                 l->self, u, r->err));
                uu = u;
            }
        }
    }
    OP_TRY(r, r->be->dot_interaction(r->s, tu, uu, map, tc, r->rows, &ord, d, l->self, r->out->p,
                                     r->err));
    return 0;
}

static const char *const dot_keys[] = {"name", "op", "inputs", "self", NULL};
/* 2 D per pair; pairs of two user tokens once per user. */
static md_cost cost_dot_interaction(const model_def *m, const md_layer *l)
{
    double ku = 0, k = 0, D = 0;
    for (int i = 0; i < l->n_in; i++) {
        int t = md_ref_tokens(m, l->in[i]);
        k += t;
        if (md_ref_domain(m, l->in[i]) == MD_USER) ku += t;
        D = (double)md_ref_width(m, l->in[i]) / t;
    }
    double pu = l->self ? ku * (ku + 1) / 2 : ku * (ku - 1) / 2;
    double p = l->self ? k * (k + 1) / 2 : k * (k - 1) / 2;
    if (l->domain == MD_USER) return (md_cost){.u = 2.0 * D * p};
    return (md_cost){.u = 2.0 * D * pu, .c = 2.0 * D * (p - pu)};
}

const md_op_def md_op_dot_interaction = {"dot_interaction", dot_keys, 0, plan_dot_interaction,
                                         run_dot_interaction, NULL,
    cost_dot_interaction};
