/* embed.c - the ops that read ids: embedding_bag and history_embedding.
 *
 * Why this exists: the two ops that turn a request's raw ids into vectors,
 * each defined once (op.h). embedding_bag runs at the domain of its sparse
 * feature; history_embedding turns user.history into the jagged [L_u, dim]
 * sequence every sequence op reads.
 */
#include "ops.h"

/* A bag reads about one row per id; counted as one row (bag lengths are
 * the request's). A history event adds three rows. */
static md_cost cost_embedding_bag(const model_def *m, const md_layer *l)
{
    (void)m;
    return (md_cost){.u = l->domain == MD_USER ? l->dim : 0, .c = l->domain == MD_CAND ? l->dim : 0};
}

static md_cost cost_history_embedding(const model_def *m, const md_layer *l)
{
    return (md_cost){.u = 2.0 * m->hist_max_len * l->dim};
}

static int plan_embedding_bag(op_plan *p)
{
    static const char *const pools[] = {"sum", "mean"}; /* bk_pool order */
    md_shape s;
    int pool;
    if (op_input(p, "input", "input", OP_ACC_SPARSE, &s) || op_table(p) ||
        op_enum(p, "pooling", pools, 2, -1, &pool))
        return -1;
    p->l->pooling = (enum bk_pool)pool;
    return op_output(p, s.dom, MD_VEC, 1, p->m->tables[p->l->table].dim);
}

static int run_embedding_bag(op_run *r)
{
    const md_layer *l = r->l;
    const int64_t *ids, *off;
    int ld;
    r->out->p = op_out_placed(r, r->rows, l->dim, &ld);
    op_bag(r, &ids, &off);
    bk_bag bag = {op_table_w(r, l->table), ids, off, r->rows, l->pooling, r->out->p, ld};
    return op_queue_bag(r, &bag);
}

static const char *const eb_keys[] = {"name", "op", "input", "table", "pooling", NULL};
const md_op_def md_op_embedding_bag = {"embedding_bag", eb_keys, OP_PLACED | OP_QUEUED,
                                       plan_embedding_bag,
                                       run_embedding_bag, NULL,
                                         cost_embedding_bag};

static int plan_history_embedding(op_plan *p)
{
    md_shape s;
    if (op_input(p, "input", "input", OP_ACC_HISTORY, &s) || op_table(p))
        return -1;
    int dim = p->m->tables[p->l->table].dim;
    return op_output(p, MD_USER, MD_JAGGED, 1, dim) ||
                   op_weight(p, "action", p->m->hist_actions, dim) ||
                   op_weight(p, "position", p->m->hist_max_len, dim)
               ? -1
               : 0;
}

static int run_history_embedding(op_run *r)
{
    const fwd *f = r->f;
    r->out->rows = (int)f->n_events;
    r->out->offsets = f->h_off;
    r->out->p = op_take(r, BK_TAG_USER, (size_t)f->n_events, (size_t)r->l->dim);
    OP_TRY(r, r->be->history_embedding(r->s, op_table_w(r, r->l->table), r->w[0], r->w[1],
                                       f->h_ids, f->h_acts, f->h_off, r->U, r->out->p, r->err));
    return 0;
}

static const char *const he_keys[] = {"name", "op", "input", "table", NULL};
const md_op_def md_op_history_embedding = {"history_embedding", he_keys, 0,
                                           plan_history_embedding, run_history_embedding, NULL,
                                             cost_history_embedding};
