/* test_batcher.c - the dynamic batcher (server/batcher.c) on the CPU backend.
 *
 * Why this exists: batching must be invisible in the answers. For random
 * request mixes submitted from several threads, every request's scores from
 * batched execution (merged with others, users deduplicated across requests,
 * oversize requests chunked) must be bitwise identical to scoring that
 * request alone. Also: chunking and stitching, dedup across requests (and no
 * merge of same-key users with different content), admission limits and
 * their messages, deadline expiry while queued, cancelled requests not
 * computed, and batcher_free finishing queued work. A small model with every
 * op is written to a temp dir. Run it under ThreadSanitizer with `make tsan`.
 *
 * IKBO_TEST_DEVICE=cuda:0 runs the same tests on the GPU, where batched and
 * solo scores need not be bitwise equal (cuBLAS picks its algorithm, and with
 * it the TF32 rounding, by batch size): there the check is |batched - solo|
 * <= 2e-3 (scores are in [0, 1.5]) and the test prints how many scores were
 * bitwise equal and the largest absolute and relative differences.
 */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "server/batcher.h"
#include "server/metrics.h"
#include "server/request.h"
#include "engine_fixture.h"

/* ---- the model: engine_fixture.h's every-op model ----------------------- */

/* Deterministic generator; one per thread where threads draw. */
static double frand_s(uint64_t *s) /* uniform in [-1, 1) */
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(*s >> 11) / (double)(1ULL << 53) * 2.0 - 1.0;
}
static int irand_s(uint64_t *s, int n) /* 0..n-1 */
{
    int v = (int)((frand_s(s) + 1.0) * 0.5 * n);
    return v < n ? v : n - 1;
}

static char model_dir[256];
static const char *DEVICE = "cpu";
static int EXACT = 1;             /* CPU: bitwise; GPU: within GPU_TOL */
#define GPU_TOL 2e-3
static long long n_scores, n_bitwise;
static double max_diff, max_rel;
static ikbo_model *MODEL;
static const ikbo_model_info *MI;
static ikbo_ctx *SOLO_CTX;

static int setup(void **state)
{
    (void)state;
    assert_int_equal(ef_write_model("batcher", model_dir, sizeof model_dir), 0);
    ikbo_err err;
    memset(&err, 0, sizeof err);
    const char *dev = getenv("IKBO_TEST_DEVICE");
    if (dev && *dev) DEVICE = dev;
    EXACT = !strcmp(DEVICE, "cpu");
    ikbo_load_opts o = {.device = DEVICE, .mode = IKBO_MODE_IKBO};
    MODEL = ikbo_model_load(model_dir, &o, &err);
    if (!MODEL) fail_msg("load: %s", err.msg);
    MI = ikbo_model_get_info(MODEL);
    SOLO_CTX = ikbo_ctx_new(MODEL, &err);
    assert_non_null(SOLO_CTX);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    if (!EXACT)
        printf("[ %s ] %lld of %lld batched scores bitwise equal to solo, max |diff| %.3g, "
               "max relative %.3g\n",
               DEVICE, n_bitwise, n_scores, max_diff, max_rel);
    ikbo_ctx_free(SOLO_CTX);
    ikbo_model_free(MODEL);
    ef_remove_model(model_dir);
    return 0;
}

/* ---- requests ------------------------------------------------------------ */

typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->p + b->n, b->cap - b->n, fmt, ap);
        va_end(ap);
        if (k >= 0 && (size_t)k < b->cap - b->n) {
            b->n += (size_t)k;
            return;
        }
        b->cap = b->cap * 2 + (size_t)k + 64;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
}

/* A user as JSON. Pool users are fixed by their id; variant != 0 changes the
 * content but keeps the key (must not merge with the original). */
static void user_json(sbuf *b, uint64_t seed, const char *key, int variant)
{
    uint64_t s = seed * 7919 + 17;
    sb_printf(b, "{\"key\":\"%s\",\"dense\":[", key);
    for (int i = 0; i < 6; i++)
        sb_printf(b, "%s%.6f", i ? "," : "", frand_s(&s) + (i == 0 ? variant * 0.25 : 0));
    sb_printf(b, "],\"sparse\":[");
    int nb = irand_s(&s, 3);
    if (nb) {
        sb_printf(b, "{\"name\":\"country\",\"ids\":[");
        for (int k = 0; k < nb; k++) sb_printf(b, "%s%d", k ? "," : "", irand_s(&s, 1000));
        sb_printf(b, "]}");
    }
    sb_printf(b, "]");
    int nh = irand_s(&s, 9);
    int actions = irand_s(&s, 2);
    if (nh) {
        sb_printf(b, ",\"historyIds\":[");
        for (int k = 0; k < nh; k++) sb_printf(b, "%s%d", k ? "," : "", irand_s(&s, 100000));
        sb_printf(b, "]");
        if (actions) {
            sb_printf(b, ",\"historyActions\":[");
            for (int k = 0; k < nh; k++) sb_printf(b, "%s%d", k ? "," : "", irand_s(&s, 3));
            sb_printf(b, "]");
        }
    }
    sb_printf(b, "}");
}

/* n_users users (from a pool of pool_size shared users, fresh ones, and
 * same-key variants), cand_counts[u] candidates of user u, interleaved. */
static Ikbo__V1__RankRequest *make_request(uint64_t *s, int n_users, const int *cand_counts,
                                           int pool_size)
{
    sbuf b = {malloc(256), 0, 256};
    sb_printf(&b, "{\"model\":\"t\",\"users\":[");
    for (int u = 0; u < n_users; u++) {
        if (u) sb_printf(&b, ",");
        int kind = irand_s(s, 10);
        if (pool_size > 0 && kind < 6) { /* shared user, keyed or by content */
            int id = irand_s(s, pool_size);
            char key[32];
            if (id % 3 == 0)
                key[0] = '\0'; /* empty key: dedup by content */
            else
                snprintf(key, sizeof key, "pool%d", id);
            user_json(&b, 1000 + (uint64_t)id, key, 0);
        } else if (pool_size > 0 && kind < 8) { /* same key, other content */
            int id = irand_s(s, pool_size);
            char key[32];
            snprintf(key, sizeof key, "pool%d", id);
            user_json(&b, 1000 + (uint64_t)id, key, 1 + irand_s(s, 3));
        } else {
            char key[32];
            snprintf(key, sizeof key, "fresh%d", irand_s(s, 1 << 30));
            user_json(&b, 5000000 + (uint64_t)irand_s(s, 1 << 30), key, 0);
        }
    }
    sb_printf(&b, "],\"candidates\":[");
    int total = 0, left[64];
    for (int u = 0; u < n_users; u++) total += left[u] = cand_counts[u];
    for (int c = 0, id = 1; c < total; c++, id++) {
        int u;
        do u = irand_s(s, n_users); while (!left[u]);
        left[u]--;
        sb_printf(&b, "%s{\"id\":%d,\"user\":%d,\"dense\":[%.5f,%.5f,%.5f],\"sparse\":[{\"name\":\"item\",\"ids\":[%d%s]}]}",
                  c ? "," : "", id, u, frand_s(s), frand_s(s), frand_s(s), irand_s(s, 100000),
                  irand_s(s, 2) ? ",7" : "");
    }
    sb_printf(&b, "]}");
    rq_status st;
    Ikbo__V1__RankRequest *r = rq_request_from_json(b.p, b.n, &st);
    if (!r) fail_msg("request JSON: %s\n%s", st.msg, b.p);
    free(b.p);
    return r;
}

/* ---- one request's bookkeeping ---------------------------------------- */

typedef struct slot {
    Ikbo__V1__RankRequest *req;
    rq_plan *plan;
    int C, T;
    float *solo, *solo_t; /* request order */
    float *got, *got_t;
    int code;
    char msg[512];
    int batches;
    double queue_s;
    atomic_int cancel;
    atomic_int done;
    int cb_instance;  /* before_callback's instance: -1 a completer or the sweeper */
    int cb_computed;  /* the instance that last computed on the callback's thread, -1 none */
} slot;

/* Per thread: the instance it computed a batch for last (gate_hook), and
 * the instance before_callback named for the callback about to run. */
static __thread int t_computed = -1;
static __thread int t_cb_instance = -2;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static int g_done;

static void slot_init(slot *s, Ikbo__V1__RankRequest *req, int solo)
{
    memset(s, 0, sizeof *s);
    s->req = req;
    rq_status st;
    if (rq_validate(req, MI, NULL, &st)) fail_msg("validate: %s", st.msg);
    s->plan = rq_plan_build(req, MI, &st);
    assert_non_null(s->plan);
    s->C = s->plan->batch.n_cands;
    s->T = MI->n_tasks;
    s->got = calloc((size_t)s->C, sizeof(float));
    s->got_t = calloc((size_t)s->C * (size_t)s->T, sizeof(float));
    if (solo) {
        float *sc = malloc((size_t)s->C * sizeof(float));
        float *tc = malloc((size_t)s->C * (size_t)s->T * sizeof(float));
        ikbo_err err;
        memset(&err, 0, sizeof err);
        if (ikbo_score(SOLO_CTX, &s->plan->batch, tc, sc, &err)) fail_msg("solo: %s", err.msg);
        s->solo = malloc((size_t)s->C * sizeof(float));
        s->solo_t = malloc((size_t)s->C * (size_t)s->T * sizeof(float));
        for (int i = 0; i < s->C; i++) {
            int ri = s->plan->order[i];
            s->solo[ri] = sc[i];
            memcpy(s->solo_t + (size_t)ri * s->T, tc + (size_t)i * s->T, (size_t)s->T * sizeof(float));
        }
        free(sc);
        free(tc);
    }
    s->code = -1;
}

static void slot_free(slot *s)
{
    rq_plan_free(s->plan);
    rq_request_free(s->req);
    free(s->solo);
    free(s->solo_t);
    free(s->got);
    free(s->got_t);
}

static void on_done(void *arg, const batcher_result *r)
{
    slot *s = arg;
    s->code = r->st.code;
    snprintf(s->msg, sizeof s->msg, "%s", r->st.msg);
    s->batches = r->batches;
    s->queue_s = r->queue_seconds;
    s->cb_instance = t_cb_instance;
    s->cb_computed = t_computed;
    if (r->st.code == RQ_OK) {
        for (int i = 0; i < s->C; i++) {
            int ri = s->plan->order[i];
            s->got[ri] = r->scores[i];
            memcpy(s->got_t + (size_t)ri * s->T, r->task_scores + (size_t)i * s->T,
                   (size_t)s->T * sizeof(float));
        }
    }
    atomic_store(&s->done, 1);
    pthread_mutex_lock(&g_mu);
    g_done++;
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
}

/* Bounds of every wait on a test condition: far above any machine's time
 * for these few tiny batches, and below the 10 s queue delay the leader
 * tests rely on. */
#define WAIT_MS 5000

/* 0 once *count >= n (read under mu, signalled on cv), -1 after ms. */
static int wait_count(pthread_mutex_t *mu, pthread_cond_t *cv, const int *count, int n, int ms)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until); /* the condvars use the default clock */
    until.tv_sec += ms / 1000;
    until.tv_nsec += (long)(ms % 1000) * 1000000;
    if (until.tv_nsec >= 1000000000) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000;
    }
    int rc = 0;
    pthread_mutex_lock(mu);
    while (*count < n && rc == 0) rc = pthread_cond_timedwait(cv, mu, &until);
    int ok = *count >= n;
    pthread_mutex_unlock(mu);
    return ok ? 0 : -1;
}

/* wait_done, bounded: 0 once n callbacks ran, -1 after ms. */
static int wait_done_ms(int n, int ms) { return wait_count(&g_mu, &g_cv, &g_done, n, ms); }

static void wait_done(int n) { assert_int_equal(wait_done_ms(n, WAIT_MS), 0); }

static void reset_done(void)
{
    pthread_mutex_lock(&g_mu);
    g_done = 0;
    pthread_mutex_unlock(&g_mu);
}

static int submit(batcher *b, slot *s, int64_t deadline_ns, rq_status *st)
{
    batcher_request r = {.req = s->req, .plan = s->plan, .deadline_ns = deadline_ns,
                         .cancelled = &s->cancel, .done = on_done, .arg = s};
    return batcher_submit(b, &r, st);
}

static void check_bitwise(const slot *s, int idx)
{
    if (s->code != RQ_OK) fail_msg("request %d: %d %s", idx, s->code, s->msg);
    if (EXACT) {
        if (memcmp(s->got, s->solo, (size_t)s->C * sizeof(float)))
            fail_msg("request %d: batched scores differ from solo scores", idx);
        if (memcmp(s->got_t, s->solo_t, (size_t)s->C * (size_t)s->T * sizeof(float)))
            fail_msg("request %d: batched task scores differ from solo", idx);
        return;
    }
    for (int i = 0; i < s->C; i++) {
        double d = fabs((double)s->got[i] - (double)s->solo[i]);
        n_scores++;
        n_bitwise += !memcmp(&s->got[i], &s->solo[i], sizeof(float));
        if (d > max_diff) max_diff = d;
        if (s->solo[i] != 0 && d / fabs((double)s->solo[i]) > max_rel)
            max_rel = d / fabs((double)s->solo[i]);
        if (!(d <= GPU_TOL))
            fail_msg("request %d candidate %d: batched %.9g solo %.9g on %s", idx, i, s->got[i],
                     s->solo[i], DEVICE);
    }
}

/* ---- batchers ---------------------------------------------------------- */

static ikbo_ctx *g_ctx[CONFIG_BATCH_MAX_INSTANCES];

static ikbo_ctx *make_ctx(void *arg, int instance, ikbo_err *err)
{
    (void)arg;
    if (!g_ctx[instance]) g_ctx[instance] = ikbo_ctx_new(MODEL, err);
    return g_ctx[instance];
}

static void free_ctxs(void)
{
    for (int i = 0; i < CONFIG_BATCH_MAX_INSTANCES; i++) {
        ikbo_ctx_free(g_ctx[i]);
        g_ctx[i] = NULL;
    }
}

static config_batching limits(long long max_c, long long max_u, long long delay_us, int inst)
{
    config_batching c;
    config_batching_default(&c);
    c.max_batch_candidates = max_c;
    c.max_batch_users = max_u;
    c.max_queue_delay_us = delay_us;
    c.instances = inst;
    c.max_queue_candidates = 1000000;
    c.max_queue_requests = 100000;
    return c;
}

/* A gate the instance threads stop at (before_compute) until opened. */
typedef struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int open;
    int arrived;        /* batches that reached the gate */
    int requests;       /* requests (or chunks) in those batches */
    int max_requests;   /* most in one batch */
} gate;

static gate G;

static void gate_reset(int open)
{
    pthread_mutex_lock(&G.mu);
    G.open = open;
    G.arrived = G.requests = G.max_requests = 0;
    pthread_mutex_unlock(&G.mu);
}

static void gate_hook(void *arg, int instance, int n_requests)
{
    (void)arg;
    t_computed = instance;
    pthread_mutex_lock(&G.mu);
    G.arrived++;
    G.requests += n_requests;
    if (n_requests > G.max_requests) G.max_requests = n_requests;
    pthread_cond_broadcast(&G.cv);
    while (!G.open) pthread_cond_wait(&G.cv, &G.mu);
    pthread_mutex_unlock(&G.mu);
}

static void gate_open(void)
{
    pthread_mutex_lock(&G.mu);
    G.open = 1;
    pthread_cond_broadcast(&G.cv);
    pthread_mutex_unlock(&G.mu);
}

/* gate_wait_arrived, bounded: 0 once n batches arrived, -1 after ms. */
static int gate_wait_arrived_ms(int n, int ms) { return wait_count(&G.mu, &G.cv, &G.arrived, n, ms); }

static void gate_wait_arrived(int n) { assert_int_equal(gate_wait_arrived_ms(n, WAIT_MS), 0); }

static void callback_hook(void *arg, int instance)
{
    (void)arg;
    t_cb_instance = instance;
}

static batcher *new_batcher(const config_batching *lim, metrics_server *mx)
{
    batcher_model bm = {MI, "t", make_ctx, NULL, NULL, NULL};
    batcher_hooks hk = {gate_hook, NULL, callback_hook};
    ikbo_err err;
    memset(&err, 0, sizeof err);
    batcher *b = batcher_new(&bm, lim, mx, &hk, &err);
    if (!b) fail_msg("batcher_new: %s", err.msg);
    return b;
}

/* The gate open or shut, no callback counted yet. */
static void reset_round(int open)
{
    gate_reset(open);
    reset_done();
}

/* A batcher under lim for one test, its gate open or shut; mx (when given)
 * is initialised here and freed by stop_batcher. */
static batcher *start_batcher(const config_batching *lim, int open, metrics_server *mx)
{
    if (mx) assert_int_equal(metrics_server_init(mx, "test"), 0);
    reset_round(open);
    return new_batcher(lim, mx);
}

/* Frees b (it answers what is still queued), then mx and the contexts. */
static void stop_batcher(batcher *b, metrics_server *mx)
{
    batcher_free(b);
    if (mx) metrics_server_free(mx);
    free_ctxs();
}

/* sl: a request of one user (none shared) with n candidates; solo: score it
 * alone too. */
static void one_user_slot(slot *sl, uint64_t *s, int n, int solo)
{
    slot_init(sl, make_request(s, 1, &n, 0), solo);
}

static metrics_series *series(metrics_family *f, const char *l0, const char *l1)
{
    const char *const v[] = {l0, l1};
    return metrics_series_get(f, v);
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

static int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ---- tests ------------------------------------------------------------- */

typedef struct submitter {
    batcher *b;
    slot *slots;
    int from, to;
    uint64_t seed;
} submitter;

static void *submit_main(void *arg)
{
    submitter *sm = arg;
    for (int i = sm->from; i < sm->to; i++) {
        rq_status st;
        if (submit(sm->b, &sm->slots[i], 0, &st)) fail_msg("submit %d: %s", i, st.msg);
        if (irand_s(&sm->seed, 4) == 0) sleep_ms(irand_s(&sm->seed, 2));
    }
    return NULL;
}

/* Random mixes from 4 threads under several limit sets: every request's
 * scores are bitwise its solo scores; requests really were merged. */
static void test_bitwise_random_mixes(void **state)
{
    (void)state;
    struct {
        long long max_c, max_u, delay_us;
        int inst;
        long long spin_us; /* idle instances and a completer poll this long */
    } cfgs[] = {
        {1024, 64, 0, 1, 0},   /* defaults-like */
        {64, 8, 300, 2, 0},    /* small batches, waiting, two instances */
        {7, 2, 0, 3, 0},       /* heavy chunking: most requests exceed the limits */
        {100000, 100000, 2000, 1, 0},
        {64, 8, 0, 3, 500},    /* polling: a submit is seen without a wake-up */
        {64, 8, 300, 2, 5000}, /* polling past the delay: the delay ends it */
    };
    const int N = 96;
    uint64_t s = 7;
    for (size_t k = 0; k < sizeof cfgs / sizeof *cfgs; k++) {
        metrics_server mx;
        slot *slots = calloc(N, sizeof *slots);
        for (int i = 0; i < N; i++) {
            int nu = 1 + irand_s(&s, 5), counts[8];
            for (int u = 0; u < nu; u++) counts[u] = 1 + irand_s(&s, 12);
            slot_init(&slots[i], make_request(&s, nu, counts, 12), 1);
        }
        config_batching lim = limits(cfgs[k].max_c, cfgs[k].max_u, cfgs[k].delay_us, cfgs[k].inst);
        lim.idle_spin_us = cfgs[k].spin_us;
        batcher *b = start_batcher(&lim, 1, &mx);
        pthread_t th[4];
        submitter sm[4];
        for (int t = 0; t < 4; t++) {
            sm[t] = (submitter){b, slots, t * N / 4, (t + 1) * N / 4, 100 + (uint64_t)t};
            pthread_create(&th[t], NULL, submit_main, &sm[t]);
        }
        for (int t = 0; t < 4; t++) pthread_join(th[t], NULL);
        wait_done(N);
        int chunked = 0;
        for (int i = 0; i < N; i++) {
            check_bitwise(&slots[i], i);
            chunked += slots[i].batches > 1;
        }
        const char *const ml[] = {"t"};
        metrics_series *br = metrics_series_get(mx.batch_requests, ml);
        metrics_series *bu = metrics_series_get(mx.batch_users, ml);
        uint64_t batches = metrics_hist_count(br);
        double merged = metrics_hist_sum(br);
        assert_true(batches > 0);
        if (cfgs[k].max_c >= 64) /* 4 threads racing: some batches carry several requests */
            assert_true(merged > (double)batches);
        if (cfgs[k].max_c == 7) assert_true(chunked > N / 2);
        double rows = 0;
        for (int i = 0; i < N; i++) rows += slots[i].plan->batch.n_users;
        /* chunks can repeat a row; dedup across requests can only remove rows */
        if (cfgs[k].max_c >= 1024) assert_true(metrics_hist_sum(bu) <= rows);
        stop_batcher(b, &mx);
        for (int i = 0; i < N; i++) slot_free(&slots[i]);
        free(slots);
    }
}

/* One request over both limits: chunked by user row (a user with more
 * candidates than the limit is cut inside), stitched in request order. */
static void test_chunking(void **state)
{
    (void)state;
    uint64_t s = 99;
    int counts[4] = {5, 300, 9, 41};
    slot sl;
    slot_init(&sl, make_request(&s, 4, counts, 0), 1);
    config_batching lim = limits(32, 2, 0, 2);
    batcher *b = start_batcher(&lim, 1, NULL);
    rq_status st;
    assert_int_equal(submit(b, &sl, 0, &st), 0);
    wait_done(1);
    check_bitwise(&sl, 0);
    /* rows by first reference are interleaved; at least ceil(355 / 32) chunks */
    assert_true(sl.batches >= 12);
    stop_batcher(b, NULL);
    slot_free(&sl);
}

/* Five requests share one user (same key and content) and each has one own
 * user; a sixth has the same key with other content. Held back until all
 * are queued, they form one batch whose rows are 1 + 5 + 1, not 12. */
static void test_dedup_across_requests(void **state)
{
    (void)state;
    metrics_server mx;
    config_batching lim = limits(100000, 100000, 0, 1);
    batcher *b = start_batcher(&lim, 0, &mx);
    uint64_t s = 5;
    slot first, sl[6];
    one_user_slot(&first, &s, 3, 1);
    rq_status st;
    assert_int_equal(submit(b, &first, 0, &st), 0);
    gate_wait_arrived(1); /* the instance holds the first batch at the gate */
    for (int i = 0; i < 6; i++) {
        sbuf j = {malloc(256), 0, 256};
        sb_printf(&j, "{\"users\":[");
        user_json(&j, 77, "shared", i == 5 ? 1 : 0);
        sb_printf(&j, ",");
        user_json(&j, 200 + (uint64_t)i, "", 0);
        sb_printf(&j, "],\"candidates\":[");
        for (int c = 0; c < 6; c++)
            sb_printf(&j, "%s{\"id\":%d,\"user\":%d,\"dense\":[0.1,%d,0.3],\"sparse\":[{\"name\":\"item\",\"ids\":[%d]}]}",
                      c ? "," : "", c, c % 2, c, 10 * i + c);
        sb_printf(&j, "]}");
        Ikbo__V1__RankRequest *r = rq_request_from_json(j.p, j.n, &st);
        assert_non_null(r);
        free(j.p);
        slot_init(&sl[i], r, 1);
        assert_int_equal(submit(b, &sl[i], 0, &st), 0);
    }
    const char *const ml[] = {"t"};
    metrics_series *bu = metrics_series_get(mx.batch_users, ml);
    double users_before = metrics_hist_sum(bu);
    gate_open();
    wait_done(7);
    check_bitwise(&first, 0);
    for (int i = 0; i < 6; i++) check_bitwise(&sl[i], i + 1);
    assert_int_equal(G.max_requests, 6);
    /* the held batch (1 user), then one batch: the shared user once, its
     * same-key variant, six own users */
    assert_int_equal((int)(metrics_hist_sum(bu) - users_before), 1 + (1 + 1 + 6));
    metrics_series *ratio = metrics_series_get(mx.batch_candidates_per_user, ml);
    assert_int_equal(metrics_hist_count(ratio), 2);
    stop_batcher(b, &mx);
    slot_free(&first);
    for (int i = 0; i < 6; i++) slot_free(&sl[i]);
}

/* Admission: requests and candidates limits, exact messages, counted as
 * queue_full; the admitted ones finish once the instance is released; a
 * request over max_queue_candidates enters an empty queue only. */
static void test_queue_limits(void **state)
{
    (void)state;
    metrics_server mx;
    config_batching lim = limits(100000, 100000, 0, 1);
    lim.max_queue_requests = 3;
    lim.max_queue_candidates = 100;
    batcher *b = start_batcher(&lim, 0, &mx);
    uint64_t s = 11;
    slot sl[7];
    for (int i = 0; i < 4; i++) one_user_slot(&sl[i], &s, 30, 1);
    one_user_slot(&sl[4], &s, 20, 1);
    one_user_slot(&sl[5], &s, 5, 1);
    one_user_slot(&sl[6], &s, 500, 1);
    const char *const ml[] = {"t"};
    rq_status st;

    /* by requests */
    assert_int_equal(submit(b, &sl[0], 0, &st), 0);
    gate_wait_arrived(1); /* computing (held): no longer queued */
    for (int i = 1; i <= 3; i++) assert_int_equal(submit(b, &sl[i], 0, &st), 0);
    long long qr, qc;
    batcher_queue_depth(b, &qr, &qc);
    assert_int_equal(qr, 3);
    assert_int_equal(qc, 90);
    assert_int_equal(metrics_value(metrics_series_get(mx.queue_requests, ml)), 3);
    assert_int_equal(metrics_value(metrics_series_get(mx.queue_candidates, ml)), 90);
    assert_int_equal(submit(b, &sl[4], 0, &st), -1);
    assert_int_equal(st.code, RQ_RESOURCE_EXHAUSTED);
    assert_string_equal(st.msg, "queue full: 3 requests queued, limit 3");
    gate_open();
    wait_done(4);
    for (int i = 0; i < 4; i++) check_bitwise(&sl[i], i);
    assert_int_equal(metrics_value(metrics_series_get(mx.queue_requests, ml)), 0);
    assert_int_equal(metrics_value(metrics_series_get(mx.queue_candidates, ml)), 0);

    /* by candidates */
    reset_round(0);
    assert_int_equal(submit(b, &sl[5], 0, &st), 0);
    gate_wait_arrived(1);
    assert_int_equal(submit(b, &sl[0], 0, &st), 0);
    assert_int_equal(submit(b, &sl[1], 0, &st), 0); /* 60 queued */
    assert_int_equal(submit(b, &sl[6], 0, &st), -1);
    assert_int_equal(st.code, RQ_RESOURCE_EXHAUSTED);
    assert_string_equal(st.msg,
                        "queue full: 560 candidates queued with this request's 500, limit 100");
    assert_int_equal(submit(b, &sl[2], 0, &st), 0); /* 90 <= 100 */
    gate_open();
    wait_done(4);
    for (int i = 0; i < 3; i++) check_bitwise(&sl[i], i);
    assert_int_equal(metrics_value(series(mx.rejected_total, "t", "queue_full")), 2);

    /* an oversize request alone */
    reset_round(1);
    assert_int_equal(submit(b, &sl[6], 0, &st), 0);
    wait_done(1);
    check_bitwise(&sl[6], 6);
    check_bitwise(&sl[5], 5);
    stop_batcher(b, &mx);
    for (int i = 0; i < 7; i++) slot_free(&sl[i]);
}

/* A queued request whose deadline passes gets DEADLINE_EXCEEDED at its
 * deadline, while the instance is still busy, and is never computed. */
static void test_deadline_in_queue(void **state)
{
    (void)state;
    metrics_server mx;
    config_batching lim = limits(100000, 100000, 0, 1);
    batcher *b = start_batcher(&lim, 0, &mx);
    uint64_t s = 21;
    slot a, d, e;
    one_user_slot(&a, &s, 4, 1);
    one_user_slot(&d, &s, 4, 0);
    one_user_slot(&e, &s, 4, 1);
    rq_status st;
    assert_int_equal(submit(b, &a, 0, &st), 0);
    gate_wait_arrived(1);
    int64_t t0 = mono_ns();
    assert_int_equal(submit(b, &d, t0 + 60 * 1000000LL, &st), 0);
    assert_int_equal(submit(b, &e, t0 + 60 * 1000000000LL, &st), 0);
    wait_done(1); /* d, with the instance still held */
    int64_t waited = mono_ns() - t0;
    assert_int_equal(atomic_load(&d.done), 1);
    assert_int_equal(d.code, RQ_DEADLINE_EXCEEDED);
    assert_non_null(strstr(d.msg, "deadline exceeded after "));
    assert_non_null(strstr(d.msg, "in the batch queue (4 candidates not scored)"));
    assert_true(waited >= 55 * 1000000LL);
    assert_int_equal(atomic_load(&a.done), 0);
    gate_open();
    wait_done(3);
    check_bitwise(&a, 0);
    check_bitwise(&e, 2);
    assert_int_equal(G.requests, 2); /* a, then e: d was never computed */
    assert_int_equal(metrics_value(series(mx.rejected_total, "t", "deadline")), 1);
    stop_batcher(b, &mx);
    slot_free(&a);
    slot_free(&d);
    slot_free(&e);
}

/* A request whose client went away while queued is answered CANCELLED and
 * not computed; a chunked request cancelled between chunks stops too. */
static void test_cancel(void **state)
{
    (void)state;
    metrics_server mx;
    config_batching lim = limits(16, 100000, 0, 1);
    batcher *b = start_batcher(&lim, 0, &mx);
    uint64_t s = 31;
    slot a, f, c, big, e;
    int c64[2] = {30, 34};
    one_user_slot(&a, &s, 4, 1);
    one_user_slot(&f, &s, 16, 1);
    one_user_slot(&c, &s, 4, 0);
    slot_init(&big, make_request(&s, 2, c64, 0), 0);
    one_user_slot(&e, &s, 4, 1);
    rq_status st;
    assert_int_equal(submit(b, &a, 0, &st), 0);
    gate_wait_arrived(1);
    /* f fills a batch; it and what queues behind it wait for the instance */
    assert_int_equal(submit(b, &f, 0, &st), 0);
    assert_int_equal(submit(b, &c, 0, &st), 0);
    assert_int_equal(submit(b, &big, 0, &st), 0);
    assert_int_equal(submit(b, &e, 0, &st), 0);
    atomic_store(&c.cancel, 1);
    gate_open();
    /* let big's first chunk start, then cancel it */
    gate_wait_arrived(3);
    atomic_store(&big.cancel, 1);
    wait_done(5);
    check_bitwise(&a, 0);
    check_bitwise(&f, 1);
    check_bitwise(&e, 4);
    assert_int_equal(c.code, RQ_CANCELLED);
    assert_non_null(strstr(c.msg, "client went away"));
    assert_true(big.code == RQ_CANCELLED || big.code == RQ_OK);
    assert_true(metrics_value(series(mx.rejected_total, "t", "cancelled")) >= 1);
    stop_batcher(b, &mx);
    slot_free(&a);
    slot_free(&f);
    slot_free(&c);
    slot_free(&big);
    slot_free(&e);
}

/* batcher_free answers everything still queued (computed, not dropped). */
static void test_free_finishes_queue(void **state)
{
    (void)state;
    config_batching lim = limits(50, 100000, 100000, 2); /* 0.1 s delay: still queued */
    batcher *b = start_batcher(&lim, 1, NULL);
    uint64_t s = 41;
    enum { N = 12 };
    slot sl[N];
    rq_status st;
    for (int i = 0; i < N; i++) {
        int cnt[2] = {1 + irand_s(&s, 9), 1 + irand_s(&s, 9)};
        slot_init(&sl[i], make_request(&s, 2, cnt, 4), 1);
        assert_int_equal(submit(b, &sl[i], 0, &st), 0);
    }
    batcher_free(b);
    assert_int_equal(g_done, N);
    for (int i = 0; i < N; i++) check_bitwise(&sl[i], i);
    for (int i = 0; i < N; i++) slot_free(&sl[i]);
    free_ctxs();
}

/* A request submitted to an idle batcher is formed into a batch, computed
 * and answered by the one instance that took it: the callback runs on that
 * instance's thread (no dispatcher, no completer). Submitted one after the
 * other, nothing waits when each finishes, so every answer stays there. */
static void test_idle_instance_answers(void **state)
{
    (void)state;
    config_batching lim = limits(1024, 64, 0, 2);
    batcher *b = start_batcher(&lim, 1, NULL);
    uint64_t s = 51;
    enum { N = 8 };
    slot sl[N];
    rq_status st;
    for (int i = 0; i < N; i++) {
        one_user_slot(&sl[i], &s, 7, 1);
        assert_int_equal(submit(b, &sl[i], 0, &st), 0);
        assert_int_equal(wait_done_ms(i + 1, WAIT_MS), 0);
        check_bitwise(&sl[i], i);
        assert_true(sl[i].cb_instance >= 0);
        assert_int_equal(sl[i].cb_computed, sl[i].cb_instance);
    }
    stop_batcher(b, NULL);
    for (int i = 0; i < N; i++) slot_free(&sl[i]);
}

/* An instance that finishes a batch while a request waits for it (and no
 * other instance is idle) hands the answer to a completer and computes the
 * waiting request; that one, with nothing behind it, it answers itself. */
static void busy_instance_hands_off(long long spin_us)
{
    config_batching lim = limits(1024, 64, 0, 1);
    lim.idle_spin_us = spin_us;
    batcher *b = start_batcher(&lim, 0, NULL);
    uint64_t s = 61;
    slot a, w;
    one_user_slot(&a, &s, 5, 1);
    one_user_slot(&w, &s, 5, 1);
    rq_status st;
    assert_int_equal(submit(b, &a, 0, &st), 0);
    assert_int_equal(gate_wait_arrived_ms(1, WAIT_MS), 0); /* a computing, held */
    assert_int_equal(submit(b, &w, 0, &st), 0);             /* w waits for the instance */
    gate_open();
    assert_int_equal(wait_done_ms(2, WAIT_MS), 0);
    check_bitwise(&a, 0);
    check_bitwise(&w, 1);
    assert_int_equal(a.cb_instance, -1); /* a completer */
    assert_int_equal(a.cb_computed, -1); /* a thread that never computed */
    assert_int_equal(w.cb_instance, 0);
    assert_int_equal(w.cb_computed, 0);
    stop_batcher(b, NULL);
    slot_free(&a);
    slot_free(&w);
}

/* The same with polling: the completer that polls takes the hand-off. */
static void test_busy_instance_hands_off(void **state)
{
    (void)state;
    busy_instance_hands_off(0);
    busy_instance_hands_off(3000);
}

/* The idle leader waits out max_queue_delay_us (10 s here), but a submit
 * that fills the batch wakes it at once, and a queued request's deadline
 * inside the delay is answered at the deadline, not at the delay (a submit
 * that wakes an idle instance does not wake the sweeper). */
static void leader_delay_and_deadline(long long spin_us)
{
    metrics_server mx;
    config_batching lim = limits(8, 100000, 10 * 1000 * 1000, 1);
    lim.idle_spin_us = spin_us;
    batcher *b = start_batcher(&lim, 1, &mx);
    uint64_t s = 71;
    slot a, f, d;
    one_user_slot(&a, &s, 4, 1);
    one_user_slot(&f, &s, 4, 1);
    one_user_slot(&d, &s, 4, 0);
    rq_status st;
    assert_int_equal(submit(b, &a, 0, &st), 0);
    assert_int_equal(submit(b, &f, 0, &st), 0); /* 8 candidates: full */
    assert_int_equal(wait_done_ms(2, WAIT_MS), 0);
    check_bitwise(&a, 0);
    check_bitwise(&f, 1);
    assert_int_equal(G.max_requests, 2);
    /* The instance back on the idle stack (it answered a and f itself). */
    int64_t until = mono_ns() + WAIT_MS * 1000000LL;
    while (!batcher_idle(b) && mono_ns() < until) sleep_ms(1);
    assert_true(batcher_idle(b));
    assert_int_equal(submit(b, &d, mono_ns() + 50 * 1000000LL, &st), 0);
    assert_int_equal(wait_done_ms(3, WAIT_MS), 0);
    assert_int_equal(d.code, RQ_DEADLINE_EXCEEDED);
    /* (Answered by the leader; or by the sweeper when that thread first ran
     * after d was queued, so saw its deadline too: the test cannot tell.) */
    assert_int_equal(G.arrived, 1);  /* d was never computed */
    assert_int_equal(metrics_value(series(mx.rejected_total, "t", "deadline")), 1);
    stop_batcher(b, &mx);
    slot_free(&a);
    slot_free(&f);
    slot_free(&d);
}

/* With polling too: the leader polls (10 ms, the most) and then sleeps
 * until the delay or a deadline, as without. */
static void test_leader_delay_and_deadline(void **state)
{
    (void)state;
    leader_delay_and_deadline(0);
    leader_delay_and_deadline(10000);
}

/* batcher_busy_ms (the hung-device watchdog's input): 0 while nothing
 * computes; while a batch is held at the gate (it has begun computing) it
 * grows past 50 ms (waited for, bounded); 0 again once it finished. */
static void test_busy_ms(void **state)
{
    (void)state;
    config_batching lim = limits(16, 100000, 0, 1);
    batcher *b = start_batcher(&lim, 0, NULL);
    assert_int_equal(batcher_busy_ms(b), 0);
    uint64_t s = 5;
    slot a;
    one_user_slot(&a, &s, 4, 1);
    rq_status st;
    assert_int_equal(submit(b, &a, 0, &st), 0);
    gate_wait_arrived(1);
    int64_t until = mono_ns() + WAIT_MS * 1000000LL;
    while (batcher_busy_ms(b) <= 50 && mono_ns() < until) sleep_ms(5);
    assert_true(batcher_busy_ms(b) > 50);
    gate_open();
    assert_int_equal(wait_done_ms(1, WAIT_MS), 0);
    check_bitwise(&a, 0);
    assert_int_equal(batcher_busy_ms(b), 0);
    stop_batcher(b, NULL);
    slot_free(&a);
}

/* An instance that pops part of the queue wakes the next idle instance for
 * the rest: a request cut into two chunks computes on both at once. */
static void test_next_idle_takes_rest(void **state)
{
    (void)state;
    config_batching lim = limits(16, 100000, 0, 2);
    batcher *b = start_batcher(&lim, 0, NULL);
    uint64_t s = 81;
    slot big;
    one_user_slot(&big, &s, 32, 1);
    rq_status st;
    assert_int_equal(submit(b, &big, 0, &st), 0);
    assert_int_equal(gate_wait_arrived_ms(2, WAIT_MS), 0); /* both chunks held at once */
    gate_open();
    assert_int_equal(wait_done_ms(1, WAIT_MS), 0);
    check_bitwise(&big, 0);
    assert_int_equal(big.batches, 2);
    stop_batcher(b, NULL);
    slot_free(&big);
}

/* Candidates whose score comes out NaN or infinite (features the model
 * overflows on) are answered and counted, one per candidate, in
 * nonfinite_scores_total; finite ones are not. */
static void test_nonfinite_scores_counted(void **state)
{
    (void)state;
    metrics_server mx;
    config_batching lim = limits(100000, 100000, 0, 1);
    batcher *b = start_batcher(&lim, 1, &mx);
    const char *const ml[] = {"t"};
    metrics_series *nf = metrics_series_get(mx.nonfinite_scores_total, ml);
    const char *big = "{\"users\":[{\"key\":\"big\",\"dense\":[3e38,-3e38,3e38,3e38,-3e38,3e38]}],"
                      "\"candidates\":[";
    for (int round = 0; round < 2; round++) {
        sbuf j = {malloc(256), 0, 256};
        if (round == 0) {
            sb_printf(&j, "%s", big);
        } else {
            sb_printf(&j, "{\"users\":[");
            user_json(&j, 3, "small", 0);
            sb_printf(&j, "],\"candidates\":[");
        }
        for (int c = 0; c < 3; c++)
            sb_printf(&j, "%s{\"id\":%d,\"user\":0,\"dense\":[%s],\"sparse\":[{\"name\":\"item\",\"ids\":[%d]}]}",
                      c ? "," : "", c, round == 0 && c == 0 ? "3e38,-3e38,3e38" : "0.1,0.2,0.3", c);
        sb_printf(&j, "]}");
        rq_status st;
        Ikbo__V1__RankRequest *r = rq_request_from_json(j.p, j.n, &st);
        if (!r) fail_msg("request: %s", st.msg);
        free(j.p);
        slot sl;
        slot_init(&sl, r, 0);
        double before = metrics_value(nf);
        reset_done();
        assert_int_equal(submit(b, &sl, 0, &st), 0);
        wait_done(1);
        assert_int_equal(sl.code, RQ_OK);
        int bad = 0;
        for (int c = 0; c < sl.C; c++) bad += !isfinite(sl.got[c]);
        if (round == 0 && bad == 0) fail_msg("the fixture scored 3e38 features finite: no test");
        if (round == 1) assert_int_equal(bad, 0);
        assert_int_equal((int)(metrics_value(nf) - before), bad);
        slot_free(&sl);
    }
    stop_batcher(b, &mx);
}

/* batcher_resolve: server config < model.json serving; auto instances. */
static void test_resolve(void **state)
{
    (void)state;
    config_batching srv, out;
    config_batching_default(&srv);
    batcher_resolve(&srv, NULL, "cpu", &out);
    assert_int_equal(out.instances, CONFIG_BATCH_AUTO_INSTANCES_CPU);
    assert_int_equal(out.max_batch_candidates, CONFIG_BATCH_AUTO_CANDIDATES_CPU);
    assert_int_equal(out.max_batch_users, CONFIG_BATCH_AUTO_USERS_CPU);
    batcher_resolve(&srv, NULL, "cuda:0", &out);
    assert_int_equal(out.instances, CONFIG_BATCH_AUTO_INSTANCES_GPU);
    assert_int_equal(out.max_batch_candidates, CONFIG_BATCH_AUTO_CANDIDATES_GPU);
    assert_int_equal(out.max_batch_users, CONFIG_BATCH_AUTO_USERS_GPU);
    /* An explicit server value is kept on every device. */
    srv.max_batch_candidates = 700;
    batcher_resolve(&srv, NULL, "cuda:0", &out);
    assert_int_equal(out.max_batch_candidates, 700);
    assert_int_equal(out.max_batch_users, CONFIG_BATCH_AUTO_USERS_GPU);
    srv.max_batch_candidates = CONFIG_BATCH_MAX_CANDIDATES;
    ikbo_serving sv = {.max_batch_candidates = 4096, .max_batch_users = -1,
                       .max_queue_delay_us = 0, .instances = 3};
    srv.max_queue_delay_us = 500;
    batcher_resolve(&srv, &sv, "cpu", &out);
    assert_int_equal(out.max_batch_candidates, 4096);
    assert_int_equal(out.max_batch_users, CONFIG_BATCH_AUTO_USERS_CPU);
    assert_int_equal(out.max_queue_delay_us, 0);
    assert_int_equal(out.instances, 3);
    sv.instances = 1000;
    batcher_resolve(&srv, &sv, "cpu", &out);
    assert_int_equal(out.instances, CONFIG_BATCH_MAX_INSTANCES);
    /* A model's 0 means auto by device, as the server's does (engine/serving.h),
     * over an explicit server value; unset (-1) keeps the server's. */
    srv.max_batch_candidates = 700;
    srv.instances = 5;
    ikbo_serving sv0;
    serving_unset(&sv0);
    sv0.max_batch_candidates = 0;
    batcher_resolve(&srv, &sv0, "cuda:0", &out);
    assert_int_equal(out.max_batch_candidates, CONFIG_BATCH_AUTO_CANDIDATES_GPU);
    assert_int_equal(out.instances, 5);
    sv0.instances = 0;
    batcher_resolve(&srv, &sv0, "cuda:0", &out);
    assert_int_equal(out.instances, CONFIG_BATCH_AUTO_INSTANCES_GPU);
}

int main(void)
{
    pthread_mutex_init(&G.mu, NULL);
    pthread_cond_init(&G.cv, NULL);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resolve),
        cmocka_unit_test(test_busy_ms),
        cmocka_unit_test(test_bitwise_random_mixes),
        cmocka_unit_test(test_chunking),
        cmocka_unit_test(test_dedup_across_requests),
        cmocka_unit_test(test_queue_limits),
        cmocka_unit_test(test_deadline_in_queue),
        cmocka_unit_test(test_cancel),
        cmocka_unit_test(test_free_finishes_queue),
        cmocka_unit_test(test_idle_instance_answers),
        cmocka_unit_test(test_busy_instance_hands_off),
        cmocka_unit_test(test_leader_delay_and_deadline),
        cmocka_unit_test(test_next_idle_takes_rest),
        cmocka_unit_test(test_nonfinite_scores_counted),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
