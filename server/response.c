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
    int32_t batch; /* its batch index */
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

/* The response is one block: the message, then the task name and Score
 * pointers, the Score structs, the order's scratch items, the task_scores
 * floats and the strings (no allocation per candidate; rq_response_free is
 * one free). */

static char *put_str(char **at, const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = memcpy(*at, s, n);
    *at += n;
    return d;
}

Ikbo__V1__RankResponse *rq_response_build(const Ikbo__V1__RankRequest *req, const rq_plan *p,
                                          const char *model_name_, int64_t model_version,
                                          const ikbo_model_info *mi, const float *task_scores,
                                          const float *scores, rq_status *st)
{
    const size_t C = (size_t)p->batch.n_cands;
    const size_t T = mi->n_tasks > 0 && task_scores ? (size_t)mi->n_tasks : 0;
    const size_t NT = mi->n_tasks > 0 ? (size_t)mi->n_tasks : 0;
    const char *name = model_name_ ? model_name_ : "", *rid = req->request_id ? req->request_id : "";
    size_t n = req->top_k > 0 && (size_t)req->top_k < C ? req->top_k : C;
    size_t strs = strlen(name) + strlen(rid) + 2;
    for (size_t t = 0; t < NT; t++) strs += strlen(mi->tasks[t] ? mi->tasks[t] : "") + 1;
    /* pointer-aligned parts first, then floats and items, then the bytes */
    size_t bytes = sizeof(Ikbo__V1__RankResponse) + NT * sizeof(char *) + n * sizeof(Ikbo__V1__Score *) +
                   n * sizeof(Ikbo__V1__Score) + C * sizeof(rank_item) + n * T * sizeof(float) +
                   strs;
    Ikbo__V1__RankResponse *r = malloc(bytes);
    if (!r) {
        rq_status_oom(st);
        return NULL;
    }
    ikbo__v1__rank_response__init(r);
    r->tasks = (char **)(r + 1);
    r->scores = (Ikbo__V1__Score **)(r->tasks + NT);
    Ikbo__V1__Score *sc = (Ikbo__V1__Score *)(r->scores + n);
    rank_item *items = (rank_item *)(sc + n);
    float *ts = (float *)(items + C);
    char *at = (char *)(ts + n * T);
    r->model = put_str(&at, name);
    r->request_id = put_str(&at, rid);
    r->n_tasks = NT;
    for (size_t t = 0; t < NT; t++) r->tasks[t] = put_str(&at, mi->tasks[t] ? mi->tasks[t] : "");
    r->model_version = model_version;
    r->unique_users = (uint32_t)p->batch.n_users;

    /* items in request order, then (top_k) by score */
    for (size_t i = 0; i < C; i++) {
        size_t ri = (size_t)p->order[i];
        items[ri] = (rank_item){scores ? scores[i] : 0.0f, (int32_t)ri, (int32_t)i};
    }
    if (req->top_k > 0) qsort(items, C, sizeof *items, rank_cmp);
    r->n_scores = n;
    for (size_t k = 0; k < n; k++) {
        Ikbo__V1__Score *s = &sc[k];
        ikbo__v1__score__init(s);
        r->scores[k] = s;
        size_t ri = (size_t)items[k].index, bi = (size_t)items[k].batch;
        s->id = p->cand_ids[ri];
        s->index = (uint32_t)ri;
        s->score = items[k].score;
        if (T) {
            s->task_scores = memcpy(ts + k * T, task_scores + bi * T, T * sizeof(float));
            s->n_task_scores = T;
        }
    }
    rq_status_ok(st);
    return r;
}

void rq_response_free(Ikbo__V1__RankResponse *resp)
{
    free(resp); /* the block starts with the message */
}
