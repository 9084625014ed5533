/* rank.c - one Rank request end to end (see rank.h). */
#include "rank.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"

int64_t rank_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static uint64_t row_bytes(const ikbo_batch *b, const ikbo_model_info *mi, int u)
{
    uint64_t n = 4u * (uint64_t)mi->user_dense;
    for (int f = 0; f < mi->n_user_sparse; f++)
        if (b->user_sparse && b->user_sparse[f].offsets)
            n += 8u * (uint64_t)(b->user_sparse[f].offsets[u + 1] - b->user_sparse[f].offsets[u]);
    if (mi->has_history && b->hist.offsets) {
        uint64_t ev = (uint64_t)(b->hist.offsets[u + 1] - b->hist.offsets[u]);
        n += 8u * ev + (b->hist_actions ? 4u * ev : 0);
    }
    return n;
}

uint64_t rank_broadcast_bytes_avoided(const rq_plan *p, const ikbo_model_info *mi)
{
    const ikbo_batch *b = &p->batch;
    if (b->n_users <= 0 || b->n_cands <= 0 || !b->map) return 0;
    uint64_t *rb = malloc((size_t)b->n_users * sizeof *rb);
    if (!rb) return 0;
    uint64_t rows = 0, cands = 0;
    for (int u = 0; u < b->n_users; u++) rows += rb[u] = row_bytes(b, mi, u);
    for (int c = 0; c < b->n_cands; c++) cands += rb[b->map[c]];
    free(rb);
    return cands > rows ? cands - rows : 0;
}

Ikbo__V1__RankResponse *rank_execute(registry_model *m, int slot,
                                     const Ikbo__V1__RankRequest *req, const rq_plan *p,
                                     rq_status *st)
{
    const ikbo_model_info *mi = registry_model_info(m);
    ikbo_err err;
    memset(&err, 0, sizeof err);
    ikbo_ctx *ctx = registry_model_ctx(m, slot, &err);
    if (!ctx) {
        rq_status_set(st, RQ_INTERNAL, "model '%s': %s", registry_model_name(m), err.msg);
        return NULL;
    }
    size_t c = (size_t)p->batch.n_cands, t = (size_t)mi->n_tasks;
    float *task_scores = malloc(c * (t ? t : 1) * sizeof(float));
    float *scores = malloc(c * sizeof(float));
    Ikbo__V1__RankResponse *resp = NULL;
    if (!task_scores || !scores) {
        rq_status_set(st, RQ_INTERNAL, "out of memory for %zu candidates", c);
    } else if (ikbo_score(ctx, &p->batch, task_scores, scores, &err) != 0) {
        rq_status_set(st, RQ_INTERNAL, "model '%s' version %lld: scoring failed: %s",
                      registry_model_name(m), (long long)registry_model_version(m), err.msg);
    } else {
        resp = rq_response_build(req, p, registry_model_name(m), registry_model_version(m), mi,
                                 task_scores, scores, st);
    }
    free(task_scores);
    free(scores);
    return resp;
}

Ikbo__V1__RankResponse *rank_handle(const rank_env *env, int slot,
                                    const Ikbo__V1__RankRequest *req, int64_t deadline_ns,
                                    const char *transport, rq_status *st)
{
    metrics_server *mx = env->metrics;
    int64_t t0 = rank_now_ns();
    metrics_add(mx->inflight, 1);

    Ikbo__V1__RankResponse *resp = NULL;
    rq_plan *plan = NULL;
    registry_model *m = NULL;
    const char *model_label = ""; /* only names that resolved become labels */
    int64_t version = 0;
    int n_users = -1;

    m = registry_acquire(env->reg, req->model, req->model_version, st);
    if (!m) goto done;
    model_label = registry_model_name(m);
    version = registry_model_version(m);
    if (deadline_ns && t0 >= deadline_ns) {
        rq_status_set(st, RQ_DEADLINE_EXCEEDED,
                      "deadline exceeded before the request started (%zu candidates not scored)",
                      req->n_candidates);
        goto done;
    }
    const ikbo_model_info *mi = registry_model_info(m);
    if (rq_validate(req, mi, env->limits, st) != 0) goto done;
    plan = rq_plan_build(req, mi, st);
    if (!plan) goto done;
    n_users = plan->batch.n_users;
    if (deadline_ns && rank_now_ns() >= deadline_ns) {
        rq_status_set(st, RQ_DEADLINE_EXCEEDED,
                      "deadline exceeded before scoring (%zu candidates, %d unique users)",
                      req->n_candidates, n_users);
        goto done;
    }
    resp = rank_execute(m, slot, req, plan, st);
    if (resp) {
        rq_status_ok(st);
        metrics_observe(metrics_series_get(mx->request_candidates, NULL),
                        (double)plan->batch.n_cands);
        metrics_observe(metrics_series_get(mx->request_unique_users, NULL), (double)n_users);
        const char *const ml[] = {model_label};
        metrics_add_l(mx->broadcast_bytes_avoided_total, ml,
                      (double)rank_broadcast_bytes_avoided(plan, mi));
    }

done:;
    int64_t t1 = rank_now_ns();
    double secs = (double)(t1 - t0) * 1e-9;
    const char *code = rq_code_name(st->code);
    const char *const mc[] = {model_label, code};
    metrics_add_l(mx->requests_total, mc, 1);
    const char *const ml[] = {model_label};
    metrics_observe_l(mx->request_duration_seconds, ml, secs);
    metrics_add(mx->inflight, -1);

    log_line ln;
    log_begin(&ln, st->code == RQ_INTERNAL ? LOG_LEVEL_ERROR : LOG_LEVEL_INFO, "rank");
    log_str(&ln, "transport", transport);
    log_str(&ln, "model", req->model);
    if (version) log_int(&ln, "version", version);
    log_str(&ln, "request_id", req->request_id);
    log_str(&ln, "code", code);
    log_int(&ln, "candidates", (int64_t)req->n_candidates);
    if (n_users >= 0) log_int(&ln, "unique_users", n_users);
    log_num(&ln, "ms", secs * 1e3, 3);
    if (st->code != RQ_OK) log_str(&ln, "error", st->msg);
    log_end(&ln);

    rq_plan_free(plan);
    registry_release(m);
    return resp;
}
