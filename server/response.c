/* response.c - the RankResponse from the engine's outputs: scores back in
 * request order (or the top_k by score), task names, unique users.
 *
 * Why this exists: every transport answers with the same message built the
 * same way (request.h documents the order and tie rules). Reentrant.
 */
#include "request.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ======================================================================
 * response
 * ====================================================================== */

typedef struct rank_item {
    float score;
    int32_t index; /* request position */
} rank_item;

/* Score descending, ties (and NaN, ranked last) by request index ascending. */
static int rank_cmp(const void *pa, const void *pb)
{
    const rank_item *a = pa, *b = pb;
    int na = isnan(a->score), nb_ = isnan(b->score);
    if (na != nb_)
        return na - nb_;
    if (!na && a->score != b->score)
        return a->score > b->score ? -1 : 1;
    return (a->index > b->index) - (a->index < b->index);
}

Ikbo__V1__RankResponse *rq_response_build(const Ikbo__V1__RankRequest *req, const rq_plan *p,
                                          const char *model_name_, int64_t model_version,
                                          const ikbo_model_info *mi, const float *task_scores,
                                          const float *scores, rq_status *st)
{
    const size_t C = (size_t)p->batch.n_cands;
    const size_t T = mi->n_tasks > 0 ? (size_t)mi->n_tasks : 0;
    Ikbo__V1__RankResponse *r = malloc(sizeof *r);
    int32_t *inv = NULL;
    rank_item *items = NULL;
    if (!r)
        goto nomem;
    ikbo__v1__rank_response__init(r);
    r->model = strdup(model_name_ ? model_name_ : "");
    r->request_id = strdup(req->request_id ? req->request_id : "");
    if (!r->model || !r->request_id)
        goto nomem;
    r->model_version = model_version;
    r->unique_users = (uint32_t)p->batch.n_users;
    if (T) {
        r->tasks = calloc(T, sizeof *r->tasks);
        if (!r->tasks)
            goto nomem;
        for (size_t t = 0; t < T; t++) {
            r->tasks[t] = strdup(mi->tasks[t] ? mi->tasks[t] : "");
            if (!r->tasks[t])
                goto nomem;
            r->n_tasks = t + 1;
        }
    }

    /* inv[request position] = batch index */
    inv = malloc((C ? C : 1) * sizeof *inv);
    items = malloc((C ? C : 1) * sizeof *items);
    if (!inv || !items)
        goto nomem;
    for (size_t i = 0; i < C; i++)
        inv[p->order[i]] = (int32_t)i;
    for (size_t k = 0; k < C; k++) {
        items[k].index = (int32_t)k;
        items[k].score = scores ? scores[inv[k]] : 0.0f;
    }
    size_t n = C;
    if (req->top_k > 0) {
        qsort(items, C, sizeof *items, rank_cmp);
        if ((size_t)req->top_k < n)
            n = req->top_k;
    }
    if (n) {
        r->scores = calloc(n, sizeof *r->scores);
        if (!r->scores)
            goto nomem;
    }
    for (size_t k = 0; k < n; k++) {
        Ikbo__V1__Score *s = malloc(sizeof *s);
        if (!s)
            goto nomem;
        ikbo__v1__score__init(s);
        r->scores[k] = s;
        r->n_scores = k + 1;
        size_t ri = (size_t)items[k].index, bi = (size_t)inv[ri];
        s->id = p->cand_ids[ri];
        s->index = (uint32_t)ri;
        s->score = items[k].score;
        if (task_scores && T) {
            s->task_scores = malloc(T * sizeof(float));
            if (!s->task_scores)
                goto nomem;
            memcpy(s->task_scores, task_scores + bi * T, T * sizeof(float));
            s->n_task_scores = T;
        }
    }
    free(inv);
    free(items);
    rq_status_ok(st);
    return r;
nomem:
    free(inv);
    free(items);
    rq_response_free(r);
    rq_status_oom(st);
    return NULL;
}

void rq_response_free(Ikbo__V1__RankResponse *resp)
{
    if (resp)
        protobuf_c_message_free_unpacked(&resp->base, NULL);
}

