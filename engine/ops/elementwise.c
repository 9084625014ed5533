/* elementwise.c - the ops that combine rows element by element or per row:
 * activation, layer_norm, add, mul and mixture.
 *
 * Why this exists: these are memory-bound passes over rows of one domain,
 * fused kernels on the GPU. add and mul are IKBO ops: with a candidate
 * operand and a user operand, the user row is read through the map (never
 * copied to C rows; broadcast mode copies it, the A/B baseline). Jagged
 * operands (per-event rows of the user history) work for all but mixture.
 */
#include "ops.h"

#include <stdlib.h>

#define QB 280

static int plan_activation(op_plan *p)
{
    md_shape s;
    /* allow_none 0 with dflt NONE: "fn" is required. */
    if (op_input(p, "input", "input", OP_ACC_VALUE, &s) ||
        op_act(p, "fn", 0, BK_ACT_NONE, &p->l->act))
        return -1;
    return op_output(p, s.dom, s.kind, s.tokens, s.dim);
}

static int run_activation(op_run *r)
{
    value in = op_in(r, 0);
    size_t w = (size_t)md_layer_width(r->l);
    void *out = op_out_like(r, 0);
    OP_TRY(r, r->be->activation(r->s, in.p, (size_t)r->out->rows * w, r->l->act, out, r->err));
    return 0;
}

static const char *const act_keys[] = {"name", "op", "input", "fn", NULL};
/* Element-wise ops: a few FLOPs per element of their output. */
static md_cost cost_elementwise(double per, const model_def *m, const md_layer *l)
{
    double f = per * md_layer_width(l) * md_events(m, l);
    return l->domain == MD_USER ? (md_cost){.u = f} : (md_cost){.c = f};
}

static md_cost cost_activation(const model_def *m, const md_layer *l)
{
    return cost_elementwise(1, m, l);
}

const md_op_def md_op_activation = {"activation", act_keys, 0, plan_activation, run_activation, NULL,
    cost_activation};

static int plan_layer_norm(op_plan *p)
{
    md_shape s;
    double eps;
    if (op_input(p, "input", "input", OP_ACC_VALUE, &s) || op_pos_num(p, "eps", 1e-5, &eps))
        return -1;
    p->l->eps = (float)eps;
    return op_output(p, s.dom, s.kind, s.tokens, s.dim) || op_weight1(p, "weight", s.dim) ||
                   op_weight1(p, "bias", s.dim)
               ? -1
               : 0;
}

static int run_layer_norm(op_run *r)
{
    const md_layer *l = r->l;
    value in = op_in(r, 0);
    void *out = op_out_like(r, 0);
    OP_TRY(r, r->be->layer_norm(r->s, in.p, r->out->rows * l->tokens, l->dim, r->w[0], r->w[1],
                                l->eps, out, r->err));
    return 0;
}

static const char *const ln_keys[] = {"name", "op", "input", "eps", NULL};
static md_cost cost_layer_norm(const model_def *m, const md_layer *l)
{
    return cost_elementwise(5, m, l);
}

const md_op_def md_op_layer_norm = {"layer_norm", ln_keys, 0, plan_layer_norm, run_layer_norm, NULL,
    cost_layer_norm};

/* add, mul: equal shapes; the output takes the candidate domain if either is. */
static int plan_binary(op_plan *p)
{
    md_shape s[2];
    char q[QB], q2[QB], s1[96], s2[96];
    const char *opn = p->l->op == MD_ADD ? "add" : "mul";
    if (op_operands(p, s))
        return -1;
    if (s[0].kind != s[1].kind || s[0].tokens != s[1].tokens || s[0].dim != s[1].dim ||
        (s[0].kind == MD_JAGGED && s[0].dom != s[1].dom))
        return op_fail(p, "%s operands must have equal shapes: '%s' is %s, '%s' is %s", opn,
                       op_in_name(p, 0, q, sizeof q), op_shape_str(s1, sizeof s1, s[0]),
                       op_in_name(p, 1, q2, sizeof q2), op_shape_str(s2, sizeof s2, s[1]));
    enum md_domain dom = s[0].dom == MD_CAND || s[1].dom == MD_CAND ? MD_CAND : MD_USER;
    return op_output(p, dom, s[0].kind, s[0].tokens, s[0].dim);
}

static int run_binary(op_run *r)
{
    const md_layer *l = r->l;
    int ia = 0, ib = 1, width = md_layer_width(l);
    /* The candidate operand first, so that the user one is read via the map. */
    if (op_in_domain(r, 0) == MD_USER && op_in_domain(r, 1) == MD_CAND) {
        ia = 1;
        ib = 0;
    }
    value a = op_in(r, ia);
    const void *bp;
    const int32_t *map;
    if (op_cand_operand(r, ib, width, &bp, &map))
        return -1;
    void *out = op_out_like(r, ia);
    int n = r->out->rows;
    if (l->op == MD_ADD)
        OP_TRY(r, r->be->add(r->s, a.p, bp, map, n, width, out, r->err));
    else
        OP_TRY(r, r->be->mul(r->s, a.p, bp, map, NULL, n, width, out, r->err));
    return 0;
}

/* add: "inputs": [a, b] (the brief), or "a"/"b" (the op table's wording). */
static const char *const bin_keys[] = {"name", "op", "inputs", "a", "b", NULL};
static md_cost cost_binary(const model_def *m, const md_layer *l)
{
    return cost_elementwise(1, m, l);
}

const md_op_def md_op_add = {"add", bin_keys, 0, plan_binary, run_binary, NULL, cost_binary};
const md_op_def md_op_mul = {"mul", bin_keys, 0, plan_binary, run_binary, NULL, cost_binary};

/* MMoE/PLE: y = sum_e softmax(gate)_e * experts_e. Inputs: experts..., gate. */
static int plan_mixture(op_plan *p)
{
    md_shape *s, g;
    int n, rc = -1;
    enum md_domain dom;
    char q[QB], s1[96];
    if (op_inputs(p, "experts", &s, &n))
        return -1;
    if (n > BK_MIX_MAX_EXPERTS) {
        op_fail(p, "mixture has %d experts; at most %d", n, BK_MIX_MAX_EXPERTS);
        goto out;
    }
    for (int k = 0; k < n; k++)
        if (s[k].kind != MD_VEC || s[k].dim != s[0].dim) {
            op_fail(p, "mixture expert '%s' is %s; experts must be vectors [F] of one F (the "
                       "first is [%d])",
                    op_in_name(p, k, q, sizeof q), op_shape_str(s1, sizeof s1, s[k]), s[0].dim);
            goto out;
        }
    if (op_input(p, "gate", "gate", OP_ACC_VALUE, &g))
        goto out;
    if (g.kind != MD_VEC || g.dim != n) {
        op_fail(p, "mixture gate '%s' is %s; it must be a vector [%d], one logit per expert",
                op_in_name(p, n, q, sizeof q), op_shape_str(s1, sizeof s1, g), n);
        goto out;
    }
    md_shape *all = realloc(s, ((size_t)n + 1) * sizeof *s);
    if (!all) {
        op_fail(p, "out of memory");
        goto out;
    }
    s = all;
    s[n] = g;
    if (op_one_domain(p, s, n + 1, &dom))
        goto out;
    rc = op_output(p, dom, MD_VEC, 1, s[0].dim);
out:
    free(s);
    return rc;
}

static int run_mixture(op_run *r)
{
    const md_layer *l = r->l;
    const void *ex[BK_MIX_MAX_EXPERTS];
    int E = l->n_in - 1;
    for (int e = 0; e < E; e++)
        ex[e] = op_in(r, e).p;
    value g = op_in(r, E);
    r->out->p = op_out(r, (size_t)r->rows, (size_t)l->dim);
    OP_TRY(r, r->be->mixture(r->s, ex, E, g.p, r->rows, l->dim, r->out->p, r->err));
    return 0;
}

static const char *const mix_keys[] = {"name", "op", "experts", "gate", NULL};
/* softmax over E gates, then E weighted vectors. */
static md_cost cost_mixture(const model_def *m, const md_layer *l)
{
    (void)m;
    int E = l->n_in - 1;
    double f = 2.0 * E * l->dim + 3.0 * E;
    return l->domain == MD_USER ? (md_cost){.u = f} : (md_cost){.c = f};
}

const md_op_def md_op_mixture = {"mixture", mix_keys, 0, plan_mixture, run_mixture, NULL,
    cost_mixture};
