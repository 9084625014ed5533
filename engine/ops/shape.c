/* shape.c - the ops that only rearrange rows: reshape, flatten (views),
 * stack and concat (gathers).
 *
 * Why this exists: views cost nothing at run time (same bytes, new shape);
 * stack and concat write their inputs side by side into one buffer, and
 * producers marked OP_PLACED (linear, embedding_bag) write their columns of
 * it directly (engine.c plans which), so the gather copies only the rest.
 */
#include "ops.h"

#include <limits.h>
#include <stdlib.h>

#define QB 280

static int run_view(op_run *r)
{
    *r->out = op_in(r, 0);
    return 0;
}

static int plan_reshape(op_plan *p)
{
    md_shape s;
    long long v;
    char q[QB], s1[96];
    if (op_input(p, "input", "input", OP_ACC_VALUE, &s))
        return -1;
    op_in_name(p, 0, q, sizeof q);
    if (s.kind != MD_VEC)
        return op_fail(p, "reshape input '%s' is %s; reshape takes a vector [F]%s", q,
                       op_shape_str(s1, sizeof s1, s),
                       s.kind == MD_TOKENS ? " (flatten it first)" : " (mean_pool it first)");
    if (op_int(p, "tokens", 1, 0, 1, INT_MAX, &v))
        return -1;
    if (s.dim % v != 0)
        return op_fail(p, "reshape of '%s' (%s) into %lld tokens: %d is not divisible by %lld", q,
                       op_shape_str(s1, sizeof s1, s), v, s.dim, v);
    return op_output(p, s.dom, MD_TOKENS, v, s.dim / v);
}

static int plan_flatten(op_plan *p)
{
    md_shape s;
    char q[QB], s1[96];
    if (op_input(p, "input", "input", OP_ACC_VALUE, &s))
        return -1;
    if (s.kind != MD_TOKENS)
        return op_fail(p, "flatten input '%s' is %s; flatten takes tokens [K, D]%s",
                       op_in_name(p, 0, q, sizeof q), op_shape_str(s1, sizeof s1, s),
                       s.kind == MD_VEC ? " (it is already a vector)"
                                        : " (mean_pool a jagged history)");
    return op_output(p, s.dom, MD_VEC, 1, (long long)s.tokens * s.dim);
}

static const char *const reshape_keys[] = {"name", "op", "input", "tokens", NULL};
static const char *const one_keys[] = {"name", "op", "input", NULL};
/* Views and gathers move bytes only (counted by the plan as bytes). */
static md_cost cost_none(const model_def *m, const md_layer *l)
{
    (void)m;
    (void)l;
    return (md_cost){0};
}

const md_op_def md_op_reshape = {"reshape", reshape_keys, OP_VIEW, plan_reshape, run_view, NULL,
                                 cost_none};
const md_op_def md_op_flatten = {"flatten", one_keys, OP_VIEW, plan_flatten, run_view, NULL,
                                 cost_none};

/* stack: [D] or [K_i, D] of one D -> [sum K_i, D]; concat: [F_i] -> [sum F_i]. */
static int plan_gather(op_plan *p)
{
    int concat = p->l->op == MD_CONCAT;
    const char *opn = concat ? "concat" : "stack";
    md_shape *s;
    int n, rc = -1;
    enum md_domain dom;
    char q[QB], q2[QB], s1[96];
    long long K = 0;
    if (op_inputs(p, "inputs", &s, &n))
        return -1;
    if (op_planning(p) == OP_PASS_REWRITTEN) { /* the planner's: user parts read via the map */
        dom = MD_USER;
        for (int k = 0; k < n; k++)
            if (s[k].dom == MD_CAND) dom = MD_CAND;
    } else if (op_one_domain(p, s, n, &dom)) {
        goto out;
    }
    for (int k = 0; k < n; k++) {
        op_in_name(p, k, q2, sizeof q2);
        if (s[k].kind == MD_JAGGED || (concat && s[k].kind != MD_VEC)) {
            op_fail(p, "%s input '%s' is %s; %s takes %s", opn, q2,
                    op_shape_str(s1, sizeof s1, s[k]), opn,
                    concat ? (s[k].kind == MD_TOKENS ? "vectors [F] (flatten tokens first)"
                                                     : "vectors [F] (pool a jagged history first)")
                           : "vectors or tokens (mean_pool a jagged history first)");
            goto out;
        }
        if (!concat && s[k].dim != s[0].dim) {
            op_fail(p, "stack inputs need one width D: '%s' has D=%d, '%s' has D=%d",
                    op_in_name(p, 0, q, sizeof q), s[0].dim, q2, s[k].dim);
            goto out;
        }
        K += concat ? s[k].dim : s[k].tokens;
        if (K * (concat ? 1 : s[0].dim) > INT_MAX) { /* K, D < 2^31: no overflow */
            if (concat)
                op_fail(p, "concat output [%lld] is too wide", K);
            else
                op_fail(p, "stack output [%lld, %d] is too wide", K, s[0].dim);
            goto out;
        }
    }
    rc = concat ? op_output(p, dom, MD_VEC, 1, K) : op_output(p, dom, MD_TOKENS, K, s[0].dim);
out:
    free(s);
    return rc;
}

static int run_gather(op_run *r)
{
    const md_layer *l = r->l;
    int width = md_layer_width(l), ld;
    size_t col = 0;
    r->out->p = op_gather_base(r, &ld);
    r->out->ld = ld != width ? ld : 0; /* placed in the stack that reads it */
    for (int k = 0; k < l->n_in; k++) {
        value in = op_in(r, k);
        int wi = op_in_width(r, k);
        const void *src = in.p;
        const int32_t *map = NULL;
        if (l->domain == MD_CAND && op_in_domain(r, k) == MD_USER) { /* auto planning */
            if (r->bc) {
                if (!(src = op_broadcast(r, in.p, wi))) return -1;
            } else {
                map = r->f->map;
                op_avoided(r, (size_t)r->C, (size_t)wi);
            }
        }
        if (!op_in_placed(r, k))
            OP_TRY(r, r->be->copy_rows(r->s, src, wi, map, r->rows, wi,
                                       (char *)r->out->p + col * r->be->act_size, ld, r->err));
        col += (size_t)wi;
    }
    return 0;
}

/* broadcast (internal, written by the auto planner): a user vector or
 * tokens copied to each candidate of the user, because the op that reads it
 * at candidate rows cannot read through the map. Counted under
 * BK_TAG_BROADCAST in both modes: it is the plan's gather. */
static int plan_broadcast(op_plan *p)
{
    md_shape s;
    char q[QB], s1[96];
    if (op_input(p, "input", "input", OP_ACC_VALUE, &s))
        return -1;
    if (s.dom != MD_USER || s.kind == MD_JAGGED)
        return op_fail(p, "broadcast input '%s' is %s; it must be a user vector or tokens",
                       op_in_name(p, 0, q, sizeof q), op_shape_str(s1, sizeof s1, s));
    return op_output(p, MD_CAND, s.kind, s.tokens, s.dim);
}

static int run_broadcast(op_run *r)
{
    const void *p = op_broadcast(r, op_in(r, 0).p, op_in_width(r, 0));
    r->out->p = (void *)p;
    return p ? 0 : -1;
}

static const char *const gather_keys[] = {"name", "op", "inputs", NULL};
const md_op_def md_op_stack = {"stack", gather_keys, OP_GATHERS, plan_gather, run_gather, NULL,
                               cost_none};
const md_op_def md_op_concat = {"concat", gather_keys, OP_GATHERS, plan_gather, run_gather, NULL,
                                cost_none};
const md_op_def md_op_broadcast = {"broadcast", one_keys, OP_INTERNAL, plan_broadcast, run_broadcast,
                                   NULL, cost_none};
