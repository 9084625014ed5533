/* registry_load.c - the registry's loader: the worker thread that polls the
 * repository, loads each version the table asks for (serving settings,
 * memory check, load, warm-up batch) and hands the result back to the table
 * (registry.c, reg_pick_job / reg_commit), plus its start, stop and wake-up.
 *
 * Why this exists apart from registry.c: loading is the slow part (seconds,
 * outside every lock) and the only one that runs a model; the table's rules
 * can be read without it. Locking: registry_impl.h.
 */
#include "clock.h"
#include "registry.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "registry_impl.h"
#include "repo_watch.h"

/* One synthetic minimal batch: 1 user, 1 candidate, zero dense features,
 * empty bags and history. Catches a model that loads but cannot run. */
static int warm_up(ikbo_model *model, ikbo_ctx *ctx, ikbo_err *err)
{
    const ikbo_model_info *mi = ikbo_model_get_info(model);
    static const int64_t no_ids[1] = {0};
    static const int64_t empty[2] = {0, 0};
    static const int32_t map[1] = {0};
    int nu = mi->n_user_sparse, nc = mi->n_cand_sparse;
    float *ud = calloc((size_t)mi->user_dense + 1, sizeof *ud);
    float *cd = calloc((size_t)mi->cand_dense + 1, sizeof *cd);
    ikbo_jagged *us = calloc((size_t)nu + 1, sizeof *us);
    ikbo_jagged *cs = calloc((size_t)nc + 1, sizeof *cs);
    float *ts = calloc((size_t)mi->n_tasks + 1, sizeof *ts);
    int rc = -1;
    if (!ud || !cd || !us || !cs || !ts) {
        bk_seterr(err, "warm-up: out of memory");
        goto done;
    }
    for (int i = 0; i < nu; i++) us[i] = (ikbo_jagged){no_ids, empty};
    for (int i = 0; i < nc; i++) cs[i] = (ikbo_jagged){no_ids, empty};
    ikbo_batch b = {
        .n_users = 1,
        .n_cands = 1,
        .user_dense = mi->user_dense ? ud : NULL,
        .user_sparse = us,
        .hist = {no_ids, empty},
        .hist_actions = NULL,
        .cand_dense = mi->cand_dense ? cd : NULL,
        .cand_sparse = cs,
        .map = map,
    };
    float score = 0;
    ikbo_err e2;
    if (ikbo_score(ctx, &b, ts, &score, &e2) != 0) {
        bk_seterr(err, "warm-up batch (1 user, 1 candidate) failed: %s", e2.msg);
        goto done;
    }
    if (!isfinite(score)) {
        bk_seterr(err, "warm-up batch (1 user, 1 candidate) scored %g: the weights give "
                       "non-finite scores", (double)score);
        goto done;
    }
    rc = 0;
done:
    free(ud);
    free(cd);
    free(us);
    free(cs);
    free(ts);
    return rc;
}

/* Resolves the serving settings, checks memory, loads, warms up. */
static registry_model *load_instance(registry *r, const reg_job *j, ikbo_err *err)
{
    ikbo_serving s = r->defaults, over;
    snprintf(s.device, sizeof s.device, "%s", r->device);
    snprintf(s.mode, sizeof s.mode, "%s", ikbo_mode_name(r->mode));
    if (ikbo_model_peek_serving(j->dir, &over, err) != 0) return NULL;
    serving_merge(&s, &over);
    if (repo_read_model_config(j->model_dir, &over, err) != 0) return NULL;
    serving_merge(&s, &over);
    if (repo_memory_check(j->dir, s.device, err) != 0) return NULL;

    registry_model *m = calloc(1, sizeof *m);
    if (m) {
        atomic_init(&m->refs, 1);
        atomic_init(&m->retired, 0);
        m->name = strdup(j->name);
        m->dir = strdup(j->dir);
        m->ctx = calloc((size_t)r->n_slots, sizeof *m->ctx);
        m->n_slots = r->n_slots;
        m->version = j->version;
        m->serving = s;
    }
    if (!m || !m->name || !m->dir || !m->ctx) {
        bk_seterr(err, "%s: out of memory", j->dir);
        if (m) reg_instance_destroy(m);
        return NULL;
    }
    enum ikbo_mode mode = IKBO_MODE_IKBO; /* s.mode was checked where it was read */
    ikbo_mode_parse(s.mode, &mode);
    ikbo_load_opts lo = {.device = s.device, .mode = mode,
                         .graphs = (int)(s.graphs < 0 ? SERVING_DEF_GRAPHS : s.graphs),
                         .no_fold = s.fold == 0,
                         .no_lane = s.user_lane == 0};
    m->model = ikbo_model_load(j->dir, &lo, err);
    if (!m->model) {
        reg_instance_destroy(m);
        return NULL;
    }
    ikbo_ctx *ctx = ikbo_ctx_new(m->model, err);
    if (!ctx || warm_up(m->model, ctx, err) != 0) {
        if (ctx) ikbo_ctx_free(ctx);
        reg_instance_destroy(m);
        return NULL;
    }
    m->ctx[0] = ctx;
    return m;
}

static int count_ready(registry *r)
{
    int ready = 0;
    pthread_rwlock_rdlock(&r->lock);
    for (int k = 0; k < r->n_entries; k++)
        for (int j = 0; j < r->entries[k].n_v; j++)
            if (r->entries[k].v[j].state == REGISTRY_READY) {
                ready++;
                break;
            }
    pthread_rwlock_unlock(&r->lock);
    return ready;
}

/* Loads what should load, one version at a time, then ends the pass. */
static int load_pending(registry *r)
{
    relist rel = {0};
    for (;;) {
        reg_job j;
        pthread_rwlock_wrlock(&r->lock);
        int64_t now = clock_mono_ms();
        reg_decide_all(r, now, 0, &rel);
        int have = !atomic_load(&r->stop) && reg_pick_job(r, now, &j);
        pthread_rwlock_unlock(&r->lock);
        reg_relist_run(&rel);
        if (!have) break;

        ikbo_err err;
        memset(&err, 0, sizeof err);
        double t0 = clock_mono_s();
        registry_model *m = load_instance(r, &j, &err);
        double secs = clock_mono_s() - t0;
        pthread_rwlock_wrlock(&r->lock);
        reg_commit(r, &j, m, m ? NULL : (err.msg[0] ? err.msg : "load failed"), secs, &rel);
        pthread_rwlock_unlock(&r->lock);
        reg_relist_run(&rel);
    }
    pthread_rwlock_wrlock(&r->lock);
    int64_t wake = reg_decide_all(r, clock_mono_ms(), 1, &rel);
    pthread_rwlock_unlock(&r->lock);
    reg_relist_run(&rel);
    pthread_mutex_lock(&r->wmu);
    r->next_settle_ms = wake;
    pthread_mutex_unlock(&r->wmu);
    return count_ready(r);
}

/* Scan, then load. */
static int pass(registry *r, int trusted)
{
    reg_scan(r, trusted);
    return load_pending(r);
}

int registry_poll_once(registry *r, int trusted) { return pass(r, trusted); }

int registry_load_pending(registry *r) { return load_pending(r); }

/* ---- the worker ------------------------------------------------------------ */

static void *worker_main(void *p)
{
    registry *r = p;
    log_thread_name("ikbo-models", -1);
    int ready = pass(r, 1);
    char why[600];
    if (registry_all_ready(r, why, sizeof why))
        log_msg(LOG_LEVEL_INFO, "ready", "%d model(s) ready", ready);
    else
        log_msg(LOG_LEVEL_WARN, "not_ready", "%s", why);
    int64_t last_poll = clock_mono_ms();
    pthread_mutex_lock(&r->wmu);
    while (!atomic_load(&r->stop)) {
        int64_t now = clock_mono_ms();
        int64_t due = r->poll_ms > 0 ? last_poll + r->poll_ms : INT64_MAX;
        if (r->next_settle_ms && r->next_settle_ms < due) due = r->next_settle_ms;
        if (!r->rescan && !r->kick && now < due) {
            clock_cond_wait_until(&r->wcv, &r->wmu,
                                  due == INT64_MAX ? 0 : clock_mono_ns() + (due - now) * 1000000);
            continue;
        }
        int trusted = r->rescan;
        r->rescan = r->kick = 0;
        pthread_mutex_unlock(&r->wmu);
        pass(r, trusted);
        last_poll = clock_mono_ms();
        pthread_mutex_lock(&r->wmu);
    }
    pthread_mutex_unlock(&r->wmu);
    return NULL;
}

int registry_start(registry *r, ikbo_err *err)
{
    if (r->running) return 0;
    atomic_store(&r->stop, 0);
    if (pthread_create(&r->thread, NULL, worker_main, r) != 0) {
        bk_seterr(err, "registry: cannot start the model loader thread");
        return -1;
    }
    r->running = 1;
    return 0;
}

void registry_stop(registry *r)
{
    if (!r || !r->running) return;
    pthread_mutex_lock(&r->wmu);
    atomic_store(&r->stop, 1);
    pthread_cond_broadcast(&r->wcv);
    pthread_mutex_unlock(&r->wmu);
    pthread_join(r->thread, NULL);
    r->running = 0;
}

void reg_wake_worker(registry *r, int rescan)
{
    pthread_mutex_lock(&r->wmu);
    if (rescan) r->rescan = 1;
    r->kick = 1;
    pthread_cond_broadcast(&r->wcv);
    pthread_mutex_unlock(&r->wmu);
}

void registry_rescan(registry *r) { reg_wake_worker(r, 1); }
