/* batcher_set.c - the daemon's batchers, one per registry model version
 * (see batcher_set.h).
 *
 * Why this exists apart from batcher.c: a batcher knows a model only
 * through batcher_model's callbacks; this file is where the registry's
 * versions meet them (which version has which batcher, with which limits,
 * and when a retired version's batcher goes), and where a batch that never
 * ends is noticed (the watchdog, in the reaper's rounds).
 */
#include "batcher_set.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "log.h"

#define REAP_INTERVAL_MS 1000

typedef struct bs_entry {
    registry_model *m;
    batcher *b;
    struct bs_entry *next;
} bs_entry;

struct batcher_set {
    /* Readers submit; the writer makes and retires batchers, so a batcher is
     * never freed under a submit, and a version never has two batchers at
     * once (they would share the registry's context slots). */
    pthread_rwlock_t lock;
    bs_entry *head;
    registry *reg;
    config_batching server;
    metrics_server *mx;
    batcher_lost_fn lost;
    void *lost_arg;
    int hung_reported; /* the reaper's own (watch) */
    pthread_mutex_t rmu;
    pthread_cond_t rcv;
    int stop;
    pthread_t reaper;
    int reaper_started;
};

static ikbo_ctx *registry_ctx(void *m, int instance, ikbo_err *err)
{
    return registry_model_ctx(m, instance, err);
}

static bs_entry *find(batcher_set *s, const registry_model *m)
{
    for (bs_entry *e = s->head; e; e = e->next)
        if (e->m == m) return e;
    return NULL;
}

static batcher *set_make(batcher_set *s, registry_model *m, rq_status *st)
{
    const ikbo_model_info *mi = registry_model_info(m);
    ikbo_err err;
    config_batching lim;
    batcher_resolve(&s->server, registry_model_serving(m), mi->device, &lim);
    batcher_model bm = {mi, registry_model_name(m), registry_ctx, m, s->lost, s->lost_arg};
    memset(&err, 0, sizeof err);
    batcher *b = batcher_new(&bm, &lim, s->mx, NULL, &err);
    if (!b) {
        rq_status_set(st, RQ_INTERNAL, "model '%s': %s", registry_model_name(m), err.msg);
        return NULL;
    }
    log_line ln;
    log_begin(&ln, LOG_LEVEL_INFO, "batcher_start");
    log_str(&ln, "model", registry_model_name(m));
    log_int(&ln, "version", registry_model_version(m));
    log_int(&ln, "max_batch_candidates", lim.max_batch_candidates);
    log_int(&ln, "max_batch_users", lim.max_batch_users);
    log_int(&ln, "max_queue_delay_us", lim.max_queue_delay_us);
    log_int(&ln, "instances", lim.instances);
    log_int(&ln, "idle_spin_us", lim.idle_spin_us);
    log_int(&ln, "gpu_spin_us", lim.gpu_spin_us);
    log_int(&ln, "batch_timeout_ms", lim.batch_timeout_ms);
    log_int(&ln, "max_queue_candidates", lim.max_queue_candidates);
    log_int(&ln, "max_queue_requests", lim.max_queue_requests);
    log_end(&ln);
    return b;
}

batcher *batcher_set_reserve(batcher_set *s, registry_model *m, int n_cands, rq_status *st)
{
    pthread_rwlock_rdlock(&s->lock);
    bs_entry *e = find(s, m);
    if (e) {
        batcher *b = batcher_reserve(e->b, n_cands, st) ? NULL : e->b;
        pthread_rwlock_unlock(&s->lock);
        return b;
    }
    pthread_rwlock_unlock(&s->lock);
    pthread_rwlock_wrlock(&s->lock);
    e = find(s, m);
    if (!e) {
        e = calloc(1, sizeof *e);
        batcher *b = e ? set_make(s, m, st) : NULL;
        if (!b) {
            if (!e) rq_status_set(st, RQ_INTERNAL, "batcher: out of memory");
            free(e);
            pthread_rwlock_unlock(&s->lock);
            return NULL;
        }
        e->m = registry_model_ref(m);
        e->b = b;
        e->next = s->head;
        s->head = e;
    }
    batcher *b = batcher_reserve(e->b, n_cands, st) ? NULL : e->b;
    pthread_rwlock_unlock(&s->lock);
    return b;
}

static void reap(batcher_set *s, int all)
{
    bs_entry *gone = NULL;
    pthread_rwlock_wrlock(&s->lock);
    for (bs_entry **pp = &s->head; *pp;) {
        bs_entry *e = *pp;
        if (all || (registry_model_retired(e->m) && batcher_idle(e->b))) {
            *pp = e->next;
            /* Joined under the lock: a new batcher for the same version must
             * not start while these threads still use its context slots. */
            batcher_free(e->b);
            e->next = gone;
            gone = e;
            continue;
        }
        pp = &e->next;
    }
    pthread_rwlock_unlock(&s->lock);
    while (gone) {
        bs_entry *e = gone;
        gone = e->next;
        if (!all)
            log_msg(LOG_LEVEL_INFO, "batcher_stop", "model '%s' version %lld: no longer served",
                    registry_model_name(e->m), (long long)registry_model_version(e->m));
        registry_release(e->m);
        free(e);
    }
}

/* The watchdog, once per reaper round: the first batcher whose oldest
 * batch has computed past its batch_timeout_ms is reported hung (the GPU
 * never signals its end: a kernel that does not finish), once. */
static void watch(batcher_set *s)
{
    if (!s->lost || s->hung_reported) return;
    pthread_rwlock_rdlock(&s->lock);
    for (bs_entry *e = s->head; e && !s->hung_reported; e = e->next) {
        config_batching lim;
        batcher_get_limits(e->b, &lim);
        long long ms = batcher_busy_ms(e->b);
        if (lim.batch_timeout_ms <= 0 || ms <= lim.batch_timeout_ms) continue;
        char why[200];
        snprintf(why, sizeof why, "a batch has been computing for %lld ms, past "
                 "batching.batch_timeout_ms %lld: the device is hung", ms, lim.batch_timeout_ms);
        s->hung_reported = 1;
        s->lost(s->lost_arg, registry_model_name(e->m), why, 1);
    }
    pthread_rwlock_unlock(&s->lock);
}

static void *reaper_main(void *arg)
{
    batcher_set *s = arg;
    log_thread_name("ikbo-reaper", -1);
    pthread_mutex_lock(&s->rmu);
    while (!s->stop) {
        int64_t until = clock_mono_ns() + (int64_t)REAP_INTERVAL_MS * 1000000;
        clock_cond_wait_until(&s->rcv, &s->rmu, until);
        if (s->stop) break;
        pthread_mutex_unlock(&s->rmu);
        reap(s, 0);
        watch(s);
        pthread_mutex_lock(&s->rmu);
    }
    pthread_mutex_unlock(&s->rmu);
    return NULL;
}

batcher_set *batcher_set_new(registry *reg, const config_batching *server, metrics_server *mx,
                             batcher_lost_fn lost, void *lost_arg, ikbo_err *err)
{
    batcher_set *s = calloc(1, sizeof *s);
    if (!s) {
        bk_seterr(err, "batcher: out of memory");
        return NULL;
    }
    s->reg = reg;
    s->server = *server;
    s->mx = mx;
    s->lost = lost;
    s->lost_arg = lost_arg;
    pthread_rwlockattr_t ra;
    pthread_rwlockattr_init(&ra);
    /* The reaper's write lock must not starve behind a steady stream of submits. */
    pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&s->lock, &ra);
    pthread_rwlockattr_destroy(&ra);
    pthread_mutex_init(&s->rmu, NULL);
    clock_cond_init(&s->rcv);
    if (pthread_create(&s->reaper, NULL, reaper_main, s) != 0) {
        bk_seterr(err, "batcher: cannot start the reaper thread");
        batcher_set_free(s);
        return NULL;
    }
    s->reaper_started = 1;
    return s;
}

void batcher_set_free(batcher_set *s)
{
    if (!s) return;
    pthread_mutex_lock(&s->rmu);
    s->stop = 1;
    pthread_cond_broadcast(&s->rcv);
    pthread_mutex_unlock(&s->rmu);
    if (s->reaper_started) pthread_join(s->reaper, NULL);
    reap(s, 1);
    pthread_rwlock_destroy(&s->lock);
    pthread_mutex_destroy(&s->rmu);
    pthread_cond_destroy(&s->rcv);
    free(s);
}
