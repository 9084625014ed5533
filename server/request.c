/* request.c - a validated request as an engine batch: users deduplicated
 * into rows and candidates grouped by row (rowset.h does both), plus what
 * the response and the batcher need to map back (order, keys, ids).
 * Validation is validate.c, the JSON mapping request_json.c, the response
 * response.c, statuses status.c. Policies are documented in request.h. */
#include "request.h"

#include <stdlib.h>
#include <string.h>

#include "rq_view.h"

size_t rq_request_candidates(const Ikbo__V1__RankRequest *req)
{
    return req->packed_candidates ? req->packed_candidates->count : req->n_candidates;
}

typedef struct plan_priv {
    rs_batch b;
    void *mem; /* order, user_row, row_user, row_key, cand_ids, key bytes */
} plan_priv;

void rq_plan_free(rq_plan *p)
{
    if (!p) return;
    plan_priv *v = p->priv_;
    if (v) {
        rs_batch_free(&v->b);
        free(v->mem);
        free(v);
    }
    free(p);
}

/* The plan's index arrays and its rows' keys, in one block. */
static int plan_arrays(rq_plan *p, plan_priv *v, const rq_view *w, const rs_row *rows, size_t U)
{
    const size_t NU = w->n_users, C = w->n_cands;
    size_t keys = 0;
    for (size_t r = 0; r < U; r++) keys += strlen(rows[r].key) + 1;
    size_t bytes = C * sizeof(int64_t) + U * sizeof(char *) + (C + NU + U) * sizeof(int32_t) + keys;
    char *m = malloc(bytes);
    if (!m) return -1;
    v->mem = m;
    p->cand_ids = (int64_t *)m;
    p->row_key = (const char **)(p->cand_ids + C);
    p->order = (int32_t *)(p->row_key + U);
    p->user_row = p->order + C;
    p->row_user = p->user_row + NU;
    char *kb = (char *)(p->row_user + U);
    for (size_t r = 0; r < U; r++) {
        size_t n = strlen(rows[r].key) + 1;
        memcpy(kb, rows[r].key, n);
        p->row_key[r] = kb;
        kb += n;
    }
    memcpy(p->cand_ids, w->cand_id, C * sizeof *p->cand_ids);
    return 0;
}

/* Dedup, grouping and assembly of a built view. */
static rq_plan *plan_view(const rq_view *w, const rq_plan_opts *opts, rq_status *st)
{
    const size_t NU = w->n_users, C = w->n_cands;
    rq_plan *p = calloc(1, sizeof *p);
    plan_priv *v = calloc(1, sizeof *v);
    int32_t *user_row = malloc(NU * sizeof *user_row);
    int32_t *cand_row = malloc(2 * C * sizeof *cand_row), *map = cand_row + C;
    rs_table *t = rs_table_new(NU, &w->d, opts && opts->collide_hashes);
    if (!p || !v || !user_row || !cand_row || !t) goto nomem;
    p->priv_ = v;
    p->n_request_users = (int)NU;
    /* Rows in order of first reference by a candidate. */
    for (size_t j = 0; j < NU; j++) user_row[j] = -1;
    for (size_t i = 0; i < C; i++) {
        int32_t j = w->cand_user[i];
        if (user_row[j] < 0) user_row[j] = rs_table_add(t, &w->users[j]);
        cand_row[i] = user_row[j];
    }
    const size_t U = rs_table_count(t);
    const rs_row *rows = rs_table_rows(t);
    if (plan_arrays(p, v, w, rows, U) || rs_group(cand_row, C, U, p->order, map) ||
        rs_assemble(&v->b, &w->d, rows, U, w->cands, p->order, C, map))
        goto nomem;
    p->batch = v->b.b;
    memcpy(p->user_row, user_row, NU * sizeof *user_row);
    for (size_t r = 0; r < U; r++) p->row_user[r] = -1;
    for (size_t j = 0; j < NU; j++)
        if (user_row[j] >= 0 && p->row_user[user_row[j]] < 0) p->row_user[user_row[j]] = (int32_t)j;
    free(user_row);
    free(cand_row);
    rs_table_free(t);
    rq_status_ok(st);
    return p;
nomem:
    free(user_row);
    free(cand_row);
    rs_table_free(t);
    if (!p || !p->priv_) free(v);
    rq_plan_free(p);
    rq_status_oom(st);
    return NULL;
}

static rq_plan *prepare(const Ikbo__V1__RankRequest *req, const ikbo_model_info *mi,
                        const rq_limits *lim, const rq_plan_opts *opts, rq_status *st)
{
    rq_view w;
    if (rq_view_build(req, mi, lim, &w, st)) return NULL;
    rq_plan *p = plan_view(&w, opts, st);
    rq_view_free(&w);
    return p;
}

rq_plan *rq_prepare(const Ikbo__V1__RankRequest *req, const ikbo_model_info *mi,
                    const rq_limits *lim, rq_status *st)
{
    rq_limits dl;
    if (!lim) {
        rq_limits_default(&dl);
        lim = &dl;
    }
    return prepare(req, mi, lim, NULL, st);
}

rq_plan *rq_plan_build(const Ikbo__V1__RankRequest *req, const ikbo_model_info *mi,
                       rq_status *st)
{
    return prepare(req, mi, NULL, NULL, st);
}

rq_plan *rq_plan_build_opts(const Ikbo__V1__RankRequest *req, const ikbo_model_info *mi,
                            const rq_plan_opts *opts, rq_status *st)
{
    return prepare(req, mi, NULL, opts, st);
}
