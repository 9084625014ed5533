/* pool.c - the ops that reduce tokens or history events to one vector:
 * mean_pool (the first format's history mean) and pool (mean, sum, max,
 * last over tokens or events).
 *
 * Why this exists: both are one fused reduction on the backend (be->pool);
 * mean_pool is pool with fn mean restricted to jagged input, kept because
 * models in the field use it. Their vector output may be written straight
 * into the stack that reads it (OP_PLACED: the bench model's history mean
 * is E_user's first token).
 */
#include "ops.h"

#define QB 280

static int plan_mean_pool(op_plan *p)
{
    md_shape s;
    char q[QB], s1[96];
    if (op_input(p, "input", "input", OP_ACC_VALUE, &s))
        return -1;
    if (s.kind != MD_JAGGED)
        return op_fail(p, "mean_pool input '%s' is %s; it must be a jagged history "
                          "(history_embedding output)",
                       op_in_name(p, 0, q, sizeof q), op_shape_str(s1, sizeof s1, s));
    p->l->pooling = BK_POOL_MEAN;
    return op_output(p, s.dom, MD_VEC, 1, s.dim);
}

static int plan_pool(op_plan *p)
{
    static const char *const fns[] = {"sum", "mean", "max", "last"}; /* bk_pool order */
    md_shape s;
    int fn;
    char q[QB], s1[96];
    if (op_input(p, "input", "input", OP_ACC_VALUE, &s) || op_enum(p, "fn", fns, 4, -1, &fn))
        return -1;
    if (s.kind == MD_VEC)
        return op_fail(p, "pool input '%s' is %s; pool takes tokens [K, D] or a jagged history",
                       op_in_name(p, 0, q, sizeof q), op_shape_str(s1, sizeof s1, s));
    p->l->pooling = (enum bk_pool)fn;
    return op_output(p, s.dom, MD_VEC, 1, s.dim);
}

static int run_pool(op_run *r)
{
    const md_layer *l = r->l;
    value in = op_in(r, 0);
    int k = in.offsets ? 0 : op_in_width(r, 0) / l->dim, ld;
    r->out->p = op_out_placed(r, r->rows, l->dim, &ld);
    OP_TRY(r, r->be->pool(r->s, in.p, in.offsets, r->rows, k, l->dim, l->pooling, r->out->p, ld,
                          r->err));
    return 0;
}

static const char *const one_keys[] = {"name", "op", "input", NULL};
static const char *const pool_keys[] = {"name", "op", "input", "fn", NULL};
/* One add per input element (a jagged input: max_len events). */
static md_cost cost_pool(const model_def *m, const md_layer *l)
{
    md_ref r = l->in[0];
    double k = r.src == MD_SRC_LAYER && m->layers[r.index].kind == MD_JAGGED ? m->hist_max_len
                                                                           : md_ref_tokens(m, r);
    double f = k * l->dim;
    return l->domain == MD_USER ? (md_cost){.u = f} : (md_cost){.c = f};
}

const md_op_def md_op_mean_pool = {"mean_pool", one_keys, OP_PLACED, plan_mean_pool, run_pool,
                                   NULL, cost_pool};
const md_op_def md_op_pool = {"pool", pool_keys, OP_PLACED, plan_pool, run_pool, NULL,
                              cost_pool};
