/* rank.c - one Rank request end to end (see rank.h). */
#include "clock.h"
#include "rank.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"

/* One request between rank_submit and its callback. */
typedef struct rank_job {
    const rank_env *env;
    const Ikbo__V1__RankRequest *req;
    rq_plan *plan;
    registry_model *m; /* the job's own reference */
    int64_t t0;
    const char *transport;
    rank_done_fn done;
    void *arg;
    double queue_s, compute_s;
    int batches;
} rank_job;

/* Metrics, log line, callback, cleanup (the line written after the callback). */
static void job_finish(rank_job *j, Ikbo__V1__RankResponse *resp, rq_status *st)
{
    metrics_server *mx = j->env->metrics;
    const Ikbo__V1__RankRequest *req = j->req;
    const char *model_label = j->m ? registry_model_name(j->m) : "";
    int64_t version = j->m ? registry_model_version(j->m) : 0;
    int n_users = j->plan ? j->plan->batch.n_users : -1;
    if (resp) {
        rq_status_ok(st);
        metrics_observe(mx->request_cands, (double)j->plan->batch.n_cands);
        metrics_observe(mx->request_users, (double)n_users);
    }
    double secs = (double)(clock_mono_ns() - j->t0) * 1e-9;
    const char *code = rq_code_name(st->code);
    const char *const mc[] = {model_label, code};
    metrics_add_l(mx->requests_total, mc, 1);
    const char *const ml[] = {model_label};
    metrics_observe_l(mx->request_duration_seconds, ml, secs);
    metrics_add(mx->inflight, -1);

    log_line ln;
    log_begin(&ln, st->code == RQ_INTERNAL ? LOG_LEVEL_ERROR : LOG_LEVEL_INFO, "rank");
    log_str(&ln, "transport", j->transport);
    log_str(&ln, "model", req->model);
    if (version) log_int(&ln, "version", version);
    log_str(&ln, "request_id", req->request_id);
    log_str(&ln, "code", code);
    log_int(&ln, "candidates", (int64_t)rq_request_candidates(req));
    if (n_users >= 0) log_int(&ln, "unique_users", n_users);
    log_num(&ln, "ms", secs * 1e3, 3);
    if (j->batches) {
        log_num(&ln, "queue_ms", j->queue_s * 1e3, 3);
        log_num(&ln, "compute_ms", j->compute_s * 1e3, 3);
        if (j->batches > 1) log_int(&ln, "batches", j->batches);
    }
    if (st->code != RQ_OK) log_str(&ln, "error", st->msg);

    /* The request may be freed by the callback: nothing reads it after (the
     * line holds copies). The line is written after the answer has gone to
     * the transport, so its write (a syscall under the log's lock) is not
     * in the client's latency. */
    j->done(j->arg, resp, st);
    log_end(&ln);
    rq_plan_free(j->plan);
    registry_release(j->m);
    free(j);
}

static void batch_done(void *arg, const batcher_result *r)
{
    rank_job *j = arg;
    rq_status st = r->st;
    Ikbo__V1__RankResponse *resp = NULL;
    j->queue_s = r->queue_seconds;
    j->compute_s = r->compute_seconds;
    j->batches = r->batches;
    if (st.code == RQ_OK)
        resp = rq_response_build(j->req, j->plan, registry_model_name(j->m),
                                 registry_model_version(j->m), registry_model_info(j->m),
                                 r->task_scores, r->scores, &st);
    job_finish(j, resp, &st);
}

void rank_submit(const rank_env *env, const Ikbo__V1__RankRequest *req, int64_t deadline_ns,
                 const atomic_int *cancelled, const char *transport, rank_done_fn done, void *arg)
{
    rq_status st;
    rq_status_ok(&st);
    rank_job *j = calloc(1, sizeof *j);
    if (!j) {
        rq_status_set(&st, RQ_INTERNAL, "out of memory");
        const char *const mc[] = {"", "INTERNAL"};
        metrics_add_l(env->metrics->requests_total, mc, 1);
        done(arg, NULL, &st);
        return;
    }
    j->env = env;
    j->req = req;
    j->t0 = clock_mono_ns();
    j->transport = transport;
    j->done = done;
    j->arg = arg;
    metrics_add(env->metrics->inflight, 1);

    j->m = registry_acquire(env->reg, req->model, req->model_version, &st);
    if (!j->m) goto fail;
    if (deadline_ns && j->t0 >= deadline_ns) {
        rq_status_set(&st, RQ_DEADLINE_EXCEEDED,
                      "deadline exceeded before the request started (%zu candidates not scored)",
                      rq_request_candidates(req));
        goto fail;
    }
    /* Admission first: under overload a refusal must cost next to nothing
     * (no validation, no plan). */
    size_t nc = rq_request_candidates(req);
    int n_cands = nc < (size_t)INT32_MAX ? (int)nc : INT32_MAX;
    batcher *b = batcher_set_reserve(env->batchers, j->m, n_cands, &st);
    if (!b) goto fail;
    const ikbo_model_info *mi = registry_model_info(j->m);
    const int64_t p0 = clock_mono_ns();
    j->plan = rq_prepare(req, mi, env->limits, &st);
    if (j->plan) {
        const char *const ml[] = {registry_model_name(j->m)};
        metrics_observe_l(env->metrics->request_prepare_seconds, ml,
                          (double)(clock_mono_ns() - p0) * 1e-9);
    }
    if (j->plan && deadline_ns && clock_mono_ns() >= deadline_ns)
        rq_status_set(&st, RQ_DEADLINE_EXCEEDED,
                      "deadline exceeded before scoring (%d candidates, %d unique users)",
                      j->plan->batch.n_cands, j->plan->batch.n_users);
    if (!j->plan || st.code != RQ_OK) {
        batcher_unreserve(b, n_cands);
        goto fail;
    }
    batcher_request br = {
        .req = req,
        .plan = j->plan,
        .deadline_ns = deadline_ns,
        .cancelled = cancelled,
        .done = batch_done,
        .arg = j,
    };
    /* Once admitted, the job may complete on a batcher thread at any time:
     * nothing here touches it after a successful submit. */
    if (batcher_submit_reserved(b, &br, &st) == 0) return;
fail:
    job_finish(j, NULL, &st);
}
