/* dense.c - the ops that multiply by a weight matrix: linear, token_linear,
 * DCNv2's cross, and the fold's internal mlp2.
 *
 * Why this exists: each is a plain GEMM on the backend (cuBLASLt on the GPU)
 * plus an epilogue, over the rows of one domain; none mixes domains.
 * linear applies to the last dim of a vector, of each token, or of each
 * event of a jagged history; a vector linear may write straight into the
 * stack or concat that reads it (OP_PLACED).
 */
#include "ops.h"

#include <limits.h>

#define QB 280

static int plan_linear(op_plan *p)
{
    md_shape s;
    long long out;
    if (op_input(p, "input", "input", OP_ACC_VALUE, &s) ||
        op_int(p, "out", 1, 0, 1, INT_MAX, &out) ||
        op_act(p, "activation", 1, BK_ACT_NONE, &p->l->act))
        return -1;
    return op_output(p, s.dom, s.kind, s.tokens, out) || op_weight(p, "weight", out, s.dim) ||
                   op_weight1(p, "bias", out)
               ? -1
               : 0;
}

/* Rows the backend sees: one per vector, token or event. */
static int run_linear(op_run *r)
{
    const md_layer *l = r->l;
    value in = op_in(r, 0);
    int ld, w_in = op_in_width(r, 0) / l->tokens;
    if (l->kind == MD_VEC) {
        r->out->p = op_out_placed(r, r->rows, l->dim, &ld);
        OP_TRY(r, r->be->linear(r->s, in.p, w_in, r->rows, r->w[0], r->w[1], l->act, r->out->p,
                                ld, r->err));
        return 0;
    }
    int n = l->kind == MD_JAGGED ? in.rows : r->rows * l->tokens;
    if (l->kind == MD_JAGGED) {
        r->out->rows = in.rows;
        r->out->offsets = in.offsets;
    }
    r->out->p = op_out(r, (size_t)n, (size_t)l->dim);
    OP_TRY(r, r->be->linear(r->s, in.p, w_in, n, r->w[0], r->w[1], l->act, r->out->p, l->dim,
                            r->err));
    return 0;
}

static const char *const linear_keys[] = {"name", "op", "input", "out", "activation", NULL};
/* Per row of the layer's domain; a tokens input is K rows, a jagged one
 * max_len events. */
static md_cost cost_linear(const model_def *m, const md_layer *l)
{
    double f = 2.0 * md_ref_width(m, l->in[0]) * l->dim * md_events(m, l);
    return l->domain == MD_USER ? (md_cost){.u = f} : (md_cost){.c = f};
}

const md_op_def md_op_linear = {"linear", linear_keys, OP_PLACED, plan_linear, run_linear, NULL,
    cost_linear};

static int plan_token_linear(op_plan *p)
{
    md_shape s;
    long long m;
    char q[QB], s1[96];
    if (op_input(p, "input", "input", OP_ACC_VALUE, &s) ||
        op_int(p, "out_tokens", 1, 0, 1, INT_MAX, &m))
        return -1;
    if (s.kind == MD_JAGGED)
        return op_fail(p, "token_linear input '%s' is %s; token_linear takes tokens [K, D]",
                       op_in_name(p, 0, q, sizeof q), op_shape_str(s1, sizeof s1, s));
    return op_output(p, s.dom, MD_TOKENS, m, s.dim) || op_weight(p, "weight", m, s.tokens) ? -1
                                                                                           : 0;
}

static int run_token_linear(op_run *r)
{
    const md_layer *l = r->l;
    value in = op_in(r, 0);
    int k = op_in_width(r, 0) / l->dim;
    r->out->p = op_out(r, (size_t)r->rows, (size_t)md_layer_width(l));
    OP_TRY(r, r->be->token_linear(r->s, in.p, r->rows, r->w[0], k, l->tokens, l->dim, r->out->p,
                                  r->err));
    return 0;
}

static const char *const tl_keys[] = {"name", "op", "input", "out_tokens", NULL};
static md_cost cost_token_linear(const model_def *m, const md_layer *l)
{
    double f = 2.0 * md_ref_tokens(m, l->in[0]) * l->tokens * l->dim;
    return l->domain == MD_USER ? (md_cost){.u = f} : (md_cost){.c = f};
}

const md_op_def md_op_token_linear = {"token_linear", tl_keys, 0, plan_token_linear,
                                      run_token_linear, NULL,
    cost_token_linear};

/* DCNv2 cross: y = x0 * (W x + b) + x, W full [F, F] or u @ v of rank r. */
static int plan_cross(op_plan *p)
{
    md_shape s[2];
    long long rank;
    enum md_domain dom;
    char q[QB], q2[QB], s1[96], s2[96];
    if (op_input(p, "x0", "x0", OP_ACC_VALUE, &s[0]) ||
        op_input(p, "input", "input", OP_ACC_VALUE, &s[1]) ||
        op_int(p, "rank", 0, 0, 1, INT_MAX, &rank) || op_one_domain(p, s, 2, &dom))
        return -1;
    if (s[0].kind != MD_VEC || s[1].kind != MD_VEC || s[0].dim != s[1].dim)
        return op_fail(p, "cross x0 '%s' is %s and input '%s' is %s; both must be vectors [F] "
                          "of one F",
                       op_in_name(p, 0, q, sizeof q), op_shape_str(s1, sizeof s1, s[0]),
                       op_in_name(p, 1, q2, sizeof q2), op_shape_str(s2, sizeof s2, s[1]));
    int F = s[0].dim;
    p->l->rank = (int)rank;
    if (op_output(p, dom, MD_VEC, 1, F))
        return -1;
    if (rank == 0)
        return op_weight(p, "weight", F, F) || op_weight1(p, "bias", F) ? -1 : 0;
    return op_weight(p, "u", F, rank) || op_weight(p, "v", rank, F) || op_weight1(p, "bias", F)
               ? -1
               : 0;
}

static int run_cross(op_run *r)
{
    const md_layer *l = r->l;
    value x0 = op_in(r, 0), x = op_in(r, 1);
    int F = l->dim;
    void *y = r->out->p = op_out(r, (size_t)r->rows, (size_t)F);
    if (l->rank == 0) {
        OP_TRY(r, r->be->linear(r->s, x.p, F, r->rows, r->w[0], r->w[1], BK_ACT_NONE, y, F,
                                r->err));
    } else {
        void *t = op_take(r, l->domain == MD_USER ? BK_TAG_USER : BK_TAG_CAND, (size_t)r->rows,
                          (size_t)l->rank);
        OP_TRY(r, r->be->linear(r->s, x.p, F, r->rows, r->w[1], NULL, BK_ACT_NONE, t, l->rank,
                                r->err));
        OP_TRY(r, r->be->linear(r->s, t, l->rank, r->rows, r->w[0], r->w[2], BK_ACT_NONE, y, F,
                                r->err));
    }
    /* y = (W x + b) * x0 + x, in place over the GEMM's output. */
    OP_TRY(r, r->be->mul(r->s, y, x0.p, NULL, x.p, r->rows, F, y, r->err));
    return 0;
}

static const char *const cross_keys[] = {"name", "op", "x0", "input", "rank", NULL};
static md_cost cost_cross(const model_def *m, const md_layer *l)
{
    (void)m;
    double F = l->dim, f = (l->rank ? 4.0 * F * l->rank : 2.0 * F * F) + 3.0 * F;
    return l->domain == MD_USER ? (md_cost){.u = f} : (md_cost){.c = f};
}

const md_op_def md_op_cross = {"cross", cross_keys, 0, plan_cross, run_cross, NULL,
    cost_cross};

/* mlp2 (internal; engine/fold.h writes it): y = out_activation(addend +
 * act(x W1^T + b1) W2^T + user_addend) over candidate vectors, the [rows,
 * hidden] layer never stored, where addend = addend_input wa^T + ba, a
 * linear the backend runs inside the op (backend.h: CUDA runs it beside
 * the hidden layer's work). Keys: input, addend_input (a vector layer in
 * the input's domain), hidden, out, activation (the hidden layer's: none
 * or relu), and optionally user_addend (a vector layer of out, user or the
 * input's domain) and out_activation. Weights w1 [hidden, in], b1
 * [hidden], w2 [out, hidden], wa [out, the addend input's width], ba
 * [out]. */
static int plan_mlp2(op_plan *p)
{
    md_shape s, a, u;
    long long hid, out;
    if (op_input(p, "input", "input", OP_ACC_VALUE, &s) ||
        op_input(p, "addend_input", "addend_input", OP_ACC_VALUE, &a) ||
        op_int(p, "hidden", 1, 0, 1, INT_MAX, &hid) || op_int(p, "out", 1, 0, 1, INT_MAX, &out) ||
        op_act(p, "activation", 1, BK_ACT_NONE, &p->l->act) ||
        op_act(p, "out_activation", 1, BK_ACT_NONE, &p->l->act2))
        return -1;
    if (s.kind != MD_VEC || a.kind != MD_VEC || a.dom != s.dom)
        return op_fail(p, "mlp2 takes a vector input and a vector addend_input in its domain");
    if (json_object_get(p->o, "user_addend") &&
        (op_input(p, "user_addend", "user_addend", OP_ACC_VALUE, &u) ||
         ((u.kind != MD_VEC || u.dim != out || (u.dom != MD_USER && u.dom != s.dom)) &&
          op_fail(p, "mlp2's user_addend must be a vector of %lld", out))))
        return -1;
    if (p->l->act != BK_ACT_NONE && p->l->act != BK_ACT_RELU)
        return op_fail(p, "mlp2's hidden activation is none or relu");
    return op_output(p, s.dom, MD_VEC, 1, out) || op_weight(p, "w1", hid, s.dim) ||
                   op_weight1(p, "b1", hid) || op_weight(p, "w2", out, hid) ||
                   op_weight(p, "wa", out, a.dim) || op_weight1(p, "ba", out)
               ? -1
               : 0;
}

static int run_mlp2(op_run *r)
{
    const md_layer *l = r->l;
    value in = op_in(r, 0), ad = op_in(r, 1);
    const void *up = NULL;
    const int32_t *map = NULL;
    if (l->n_in > 2 && op_cand_operand(r, 2, l->dim, &up, &map)) return -1;
    r->out->p = op_out(r, (size_t)r->rows, (size_t)l->dim);
    const bk_mlp2_addend a = {ad.p, op_in_width(r, 1), r->w[3], r->w[4]};
    OP_TRY(r, r->be->mlp2(r->s, in.p, op_in_width(r, 0), r->rows, r->w[0], r->w[1], l->act,
                          r->w[2], &a, up, map, l->act2, r->out->p, l->dim, r->err));
    return 0;
}

static const char *const mlp2_keys[] = {"name",       "op",          "input",
                                        "addend_input", "hidden",    "out",
                                        "activation", "user_addend", "out_activation",
                                        NULL};
static md_cost cost_mlp2(const model_def *m, const md_layer *l)
{
    const double hid = l->w[0].rows;
    return (md_cost){.c = 2.0 * hid * (md_ref_width(m, l->in[0]) + l->dim) +
                          2.0 * l->dim * md_ref_width(m, l->in[1])};
}

const md_op_def md_op_mlp2 = {"mlp2", mlp2_keys, OP_INTERNAL, plan_mlp2, run_mlp2, NULL, cost_mlp2};
