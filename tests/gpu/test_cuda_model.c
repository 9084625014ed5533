/* test_cuda_model.c - whole models on "cuda:0" against "cpu".
 *
 * Why this exists: the op tests check kernels one at a time; this checks the
 * engine's whole plan on the GPU (every op, the workspace arenas, dtype
 * conversion at the edges) for real model directories. For each model given
 * it loads the model on the CPU backend and on cuda:0 in IKBO mode and in
 * broadcast mode, scores random batches of several shapes (1 user and 1
 * candidate; uneven ratios with odd counts; ratio 70; one user with 1000
 * candidates) and compares against the CPU's IKBO scores:
 *   relative error of task scores ||gpu - cpu|| / ||cpu||  <= tol
 *   top-10 agreement (same candidates among the 10 best)     reported
 * tol: 1e-4 (fp32), 3e-2 (bf16/fp16; the activation dtype is the backend's,
 * IKBO_CUDA_DTYPE). It also checks that IKBO mode on the GPU allocates no
 * broadcast bytes, and that instances scoring at once on their own threads
 * (as the daemon's do) agree with one scoring alone, and that the user lane
 * (engine/lane.h) gives the same bits as one stream.
 *
 * With --no-fold every load keeps lce -> flatten -> linear as written
 * (engine/fold.h), so the lce kernels run where the fold would replace them.
 *
 *   test_cuda_model [--no-fold] MODEL_VERSION_DIR...
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/ikbo.h"
#include "tests/gpu/gpu_rand.h"

/* A jagged id list with rows rows, 0..maxlen ids each. */
static ikbo_jagged rand_jagged(int rows, int maxlen)
{
    int64_t *off = xcalloc((size_t)rows + 1, sizeof(int64_t));
    for (int r = 0; r < rows; r++)
        off[r + 1] = off[r] + irand(0, maxlen);
    int64_t *ids = xcalloc((size_t)off[rows] + 1, sizeof(int64_t));
    for (int64_t i = 0; i < off[rows]; i++)
        ids[i] = rnd() % 3 ? (int64_t)irand(0, 100000) : (int64_t)rnd();
    ikbo_jagged j = {ids, off};
    return j;
}

/* A jagged id list with exactly k ids per row. */
static ikbo_jagged fixed_jagged(int rows, int k)
{
    int64_t *off = xcalloc((size_t)rows + 1, sizeof(int64_t));
    for (int r = 0; r < rows; r++)
        off[r + 1] = off[r] + k;
    int64_t *ids = xcalloc((size_t)off[rows] + 1, sizeof(int64_t));
    for (int64_t i = 0; i < off[rows]; i++)
        ids[i] = (int64_t)irand(0, 100000);
    ikbo_jagged j = {ids, off};
    return j;
}

typedef struct batch_mem {
    ikbo_batch b;
    float *ud, *cd;
    ikbo_jagged *us, *csp;
    int32_t *acts, *map;
    int nus, ncs;
} batch_mem;

/* hist_len < 0: history lengths from empty to past max_len, else each
 * user hist_len events; cand_ids < 0: 0..4 ids per candidate and sparse
 * feature, else exactly cand_ids. */
static batch_mem make_batch_fixed(const ikbo_model_info *in, int nu, const int *counts,
                                  int hist_len, int cand_ids)
{
    batch_mem m;
    memset(&m, 0, sizeof m);
    int nc = 0;
    for (int u = 0; u < nu; u++)
        nc += counts[u];
    m.map = xcalloc((size_t)nc, sizeof(int32_t));
    for (int u = 0, c = 0; u < nu; u++)
        for (int i = 0; i < counts[u]; i++)
            m.map[c++] = u;
    m.ud = xcalloc((size_t)nu * in->user_dense, sizeof(float));
    for (int i = 0; i < nu * in->user_dense; i++)
        m.ud[i] = frand();
    m.cd = xcalloc((size_t)nc * in->cand_dense, sizeof(float));
    for (int i = 0; i < nc * in->cand_dense; i++)
        m.cd[i] = frand();
    m.nus = in->n_user_sparse;
    m.ncs = in->n_cand_sparse;
    m.us = xcalloc((size_t)m.nus, sizeof(ikbo_jagged));
    for (int f = 0; f < m.nus; f++)
        m.us[f] = rand_jagged(nu, 6);
    m.csp = xcalloc((size_t)m.ncs, sizeof(ikbo_jagged));
    for (int f = 0; f < m.ncs; f++)
        m.csp[f] = cand_ids < 0 ? rand_jagged(nc, 4) : fixed_jagged(nc, cand_ids);
    m.b.n_users = nu;
    m.b.n_cands = nc;
    m.b.user_dense = in->user_dense ? m.ud : NULL;
    m.b.cand_dense = in->cand_dense ? m.cd : NULL;
    m.b.user_sparse = m.us;
    m.b.cand_sparse = m.csp;
    m.b.map = m.map;
    if (in->has_history) {
        /* Lengths from empty to past max_len (the engine keeps the newest). */
        int64_t *off = xcalloc((size_t)nu + 1, sizeof(int64_t));
        for (int u = 0; u < nu; u++) {
            int kind = (int)(rnd() % 4);
            int len = hist_len >= 0 ? hist_len
                      : kind == 0   ? 0
                      : kind == 1   ? in->hist_max_len + irand(0, 7)
                                    : irand(1, in->hist_max_len);
            off[u + 1] = off[u] + len;
        }
        int64_t *ids = xcalloc((size_t)off[nu] + 1, sizeof(int64_t));
        m.acts = xcalloc((size_t)off[nu] + 1, sizeof(int32_t));
        for (int64_t i = 0; i < off[nu]; i++) {
            ids[i] = (int64_t)irand(0, 1 << 20);
            m.acts[i] = in->hist_actions > 0 ? irand(0, in->hist_actions - 1) : 0;
        }
        m.b.hist.ids = ids;
        m.b.hist.offsets = off;
        m.b.hist_actions = in->hist_actions > 0 ? m.acts : NULL;
    }
    return m;
}

static batch_mem make_batch(const ikbo_model_info *in, int nu, const int *counts)
{
    return make_batch_fixed(in, nu, counts, -1, -1);
}

static void free_batch(batch_mem *m)
{
    for (int f = 0; f < m->nus; f++) {
        free((void *)m->us[f].ids);
        free((void *)m->us[f].offsets);
    }
    for (int f = 0; f < m->ncs; f++) {
        free((void *)m->csp[f].ids);
        free((void *)m->csp[f].offsets);
    }
    free(m->us);
    free(m->csp);
    free((void *)m->b.hist.ids);
    free((void *)m->b.hist.offsets);
    free(m->acts);
    free(m->map);
    free(m->ud);
    free(m->cd);
}

/* How many of ref's k best candidates are among got's k best. */
static int topk_overlap(const float *ref, const float *got, int n, int k)
{
    if (k > n)
        k = n;
    int *ir = xcalloc((size_t)n, sizeof(int)), *ig = xcalloc((size_t)n, sizeof(int));
    for (int i = 0; i < n; i++)
        ir[i] = ig[i] = i;
    /* partial selection sort, k is small */
    for (int a = 0; a < k; a++)
        for (int b = a + 1; b < n; b++) {
            if (ref[ir[b]] > ref[ir[a]]) { int t = ir[a]; ir[a] = ir[b]; ir[b] = t; }
            if (got[ig[b]] > got[ig[a]]) { int t = ig[a]; ig[a] = ig[b]; ig[b] = t; }
        }
    int same = 0;
    for (int a = 0; a < k; a++)
        for (int b = 0; b < k; b++)
            same += ir[a] == ig[b];
    free(ir);
    free(ig);
    return same;
}

/* ||got - ref|| / ||ref|| over n values; *nan counts NaNs in got. */
static double rel_err(const float *got, const float *ref, size_t n, int *nan)
{
    double num = 0, den = 0;
    *nan = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(got[i]))
            (*nan)++;
        double d = (double)got[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

static unsigned long long g_seed; /* this run's IKBO_TEST_SEED (main) */

/* After a failed GPU score: when the device is lost (ikbo_ctx_device_lost:
 * the CUDA context is unusable for the rest of the process), says so with
 * the batch's shape (users, candidates each, history events each: what a
 * repro needs beside the seed) and exits 1, since every later check would
 * fail for the same reason and hide which one was first. */
static void stop_if_lost(ikbo_ctx *ctx, const ikbo_batch *b, const char *dir, const char *what)
{
    ikbo_err why = {{0}};
    if (!ikbo_ctx_device_lost(ctx, &why))
        return;
    printf("FAIL %s %s: %s\n     batch: %d users, %d candidates; per user (first 8) candidates / "
           "history events:", dir, what, why.msg, b->n_users, b->n_cands);
    for (int u = 0, c = 0; u < b->n_users && u < 8; u++) {
        int n = 0;
        while (c < b->n_cands && b->map[c] == u)
            c++, n++;
        long ev = b->hist.offsets ? (long)(b->hist.offsets[u + 1] - b->hist.offsets[u]) : 0;
        printf(" %d/%ld", n, ev);
    }
    printf("\ntest_cuda_model: stopped: the device is lost, no later check can run "
           "(IKBO_TEST_SEED=%llu)\n", g_seed);
    exit(1);
}

/* Batch graphs (engine/batch_graph.h) on a context that has them: batches
 * sharing one key (1 user, 65..72 candidates -> bucket 72, full-length
 * history, 1 id per candidate and feature, 0..6 per user), a larger batch
 * (another key; the arenas grow, which forgets every graph), then the first
 * shape three times more. Every batch's task scores against the CPU's, NaN-
 * poisoned first. Without IKBO_FAULT the expected trace is exact: 2
 * recordings, 5 replays, no fallback; with IKBO_FAULT=graph:N some
 * recordings fail and their batches must still score right. Returns the
 * failures; adds its checks to *checks. */
static int check_graphs(const char *dir, const char *mode, const ikbo_model_info *in, ikbo_ctx *cc,
                        ikbo_ctx *cg, double tol, int *checks)
{
    int seq[][2] = {{1, 70}, {1, 72}, {1, 65}, {1, 71}, {1, 70}, {1, 69},
                    {2, 1000}, {1, 70}, {1, 66}, {1, 72}};
    int failures = 0, n = (int)(sizeof seq / sizeof seq[0]);
    ikbo_err e = {{0}};
    for (int i = 0; i < n; i++) {
        int counts[2] = {seq[i][1], 1};
        batch_mem bm = make_batch_fixed(in, seq[i][0], counts, in->hist_max_len, 1);
        int C = bm.b.n_cands, T = in->n_tasks;
        float *tc = xcalloc((size_t)C * T, sizeof(float)), *tg = xcalloc((size_t)C * T, sizeof(float));
        for (int k = 0; k < C * T; k++)
            tg[k] = NAN;
        (*checks)++;
        if (ikbo_score(cc, &bm.b, tc, NULL, &e) || ikbo_score(cg, &bm.b, tg, NULL, &e)) {
            printf("FAIL %s graphs %s batch %d: %s\n", dir, mode, i, e.msg);
            stop_if_lost(cg, &bm.b, dir, mode);
            failures++;
        } else {
            int nan;
            double rel = rel_err(tg, tc, (size_t)C * T, &nan);
            int bad = nan || !(rel <= tol);
            failures += bad;
            if (bad)
                printf("FAIL %s graphs %s batch %d (C %d): rel %.2e%s\n", dir, mode, i, C, rel,
                       nan ? " NaN" : "");
        }
        free(tc);
        free(tg);
        free_batch(&bm);
    }
    ikbo_graph_stats st;
    ikbo_ctx_graph_stats(cg, &st);
    const char *fault = getenv("IKBO_FAULT");
    int faulty = fault && strstr(fault, "graph");
    int bad = faulty ? !st.fallbacks || st.replays + st.captures + st.fallbacks < 5
                     : st.captures != 2 || st.replays != 5 || st.fallbacks;
    (*checks)++;
    failures += bad;
    printf("%s %-28s graphs %-9s recorded %llu, replayed %llu, fell back %llu, held %d%s%s\n",
           bad ? "FAIL" : "ok  ", dir, mode, (unsigned long long)st.captures,
           (unsigned long long)st.replays, (unsigned long long)st.fallbacks, st.held,
           st.last_error[0] ? "; last fallback: " : "", st.last_error);
    return failures;
}

/* The three contexts one model is checked on: CPU (the reference), cuda:0
 * in IKBO mode and cuda:0 in broadcast mode. */
typedef struct trio {
    const char *dir;
    const ikbo_model_info *in;
    ikbo_ctx *cc, *cg, *cb;
    double tol;
} trio;

/* One batch shape: scored on the CPU, then on both GPU contexts into
 * NaN-poisoned outputs, compared by relative error (and top-10 agreement,
 * reported); IKBO mode must allocate no broadcast bytes. Returns the
 * failures; adds its checks to *checks. */
static int check_shape(const trio *t, int nu, const int *counts, const char *name, int *checks)
{
    ikbo_err e = {{0}};
    batch_mem bm = make_batch(t->in, nu, counts);
    int C = bm.b.n_cands, T = t->in->n_tasks, failures = 0;
    float *tc = xcalloc((size_t)C * T, sizeof(float)), *sc = xcalloc((size_t)C, sizeof(float));
    float *tgs[2] = {xcalloc((size_t)C * T, sizeof(float)), xcalloc((size_t)C * T, sizeof(float))};
    float *sgs[2] = {xcalloc((size_t)C, sizeof(float)), xcalloc((size_t)C, sizeof(float))};
    const char *mode[2] = {"ikbo", "broadcast"};
    ikbo_ctx *ctx[2] = {t->cg, t->cb};
    if (ikbo_score(t->cc, &bm.b, tc, sc, &e)) {
        printf("FAIL %s [%s]: cpu score: %s\n", t->dir, name, e.msg);
        failures++;
    }
    for (int md = 0; md < 2 && !failures; md++) {
        for (int i = 0; i < C * T; i++)
            tgs[md][i] = NAN;
        (*checks)++;
        if (ikbo_score(ctx[md], &bm.b, tgs[md], sgs[md], &e)) {
            printf("FAIL %s [%s] %s: cuda score: %s\n", t->dir, name, mode[md], e.msg);
            stop_if_lost(ctx[md], &bm.b, t->dir, mode[md]);
            failures++;
            continue;
        }
        int nan;
        double rel = rel_err(tgs[md], tc, (size_t)C * T, &nan);
        int k = C < 10 ? C : 10, agree = topk_overlap(sc, sgs[md], C, k);
        int bad = nan || !(rel <= t->tol);
        if (md == 0) {
            size_t lb[BK_TAG_COUNT];
            ikbo_ctx_last_bytes(t->cg, lb);
            if (lb[BK_TAG_BROADCAST]) {
                printf("FAIL %s: IKBO mode used %zu broadcast bytes\n", t->dir, lb[BK_TAG_BROADCAST]);
                bad = 1;
            }
        }
        failures += bad;
        printf("%s %-28s %-16s %-9s C %5d rel %.2e top%d %d/%d%s\n", bad ? "FAIL" : "ok  ", t->dir,
               name, mode[md], C, rel, k, agree, k, nan ? " NaN" : "");
    }
    free(tc);
    free(sc);
    for (int md = 0; md < 2; md++) {
        free(tgs[md]);
        free(sgs[md]);
    }
    free_batch(&bm);
    return failures;
}

/* Batch graphs in both modes, each on a context of its own (graphs = 4)
 * with the server's waits: sleep at once (ikbo), poll then sleep
 * (broadcast). */
static int check_graph_modes(const trio *t, const ikbo_load_opts *og, const ikbo_load_opts *ob,
                             int *checks)
{
    int failures = 0;
    for (int md = 0; md < 2; md++) {
        ikbo_err e = {{0}};
        ikbo_load_opts o = md ? *ob : *og;
        o.graphs = 4;
        ikbo_model *mgr = ikbo_model_load(t->dir, &o, &e);
        ikbo_ctx *cgr = mgr ? ikbo_ctx_new(mgr, &e) : NULL;
        if (cgr && ikbo_ctx_set_gpu_spin(cgr, md ? 50 : 0, &e)) {
            ikbo_ctx_free(cgr);
            cgr = NULL;
        }
        if (!cgr) {
            printf("FAIL %s: graphs: %s\n", t->dir, e.msg);
            failures++;
        } else {
            failures += check_graphs(t->dir, md ? "broadcast" : "ikbo", t->in, t->cc, cgr, t->tol,
                                     checks);
        }
        ikbo_ctx_free(cgr);
        ikbo_model_free(mgr);
    }
    return failures;
}

/* Instances at once, as the daemon runs them: CC_THREADS contexts of one
 * loaded model, each on its own thread (and CUDA stream), score one merged
 * batch (58 users x 70 candidates) CC_ROUNDS times, each into a NaN-poisoned
 * buffer, against the same batch scored alone on the model's own context.
 * Every element must agree to tol of the largest score (a stale tile in one
 * candidate's rows moves that candidate, not the norm). The single-stream
 * checks above passed while linear_wr's barrier race lost the device under
 * the daemon's concurrent batches (bench/RESULTS.md, 2026-12-05). */
#define CC_THREADS 4
#define CC_ROUNDS 30
typedef struct cc_job {
    ikbo_ctx *ctx;
    const ikbo_batch *b;
    const float *ref;
    size_t n;
    double tol;
    int bad, round;
    char err[sizeof(ikbo_err) + 64];
} cc_job;

static void *cc_run(void *arg)
{
    cc_job *j = arg;
    float *got = xcalloc(j->n, sizeof(float));
    double top = 0;
    for (size_t i = 0; i < j->n; i++)
        top = fabs(j->ref[i]) > top ? fabs(j->ref[i]) : top;
    for (int r = 0; r < CC_ROUNDS && !j->bad; r++) {
        ikbo_err e = {{0}};
        j->round = r;
        for (size_t i = 0; i < j->n; i++)
            got[i] = NAN;
        if (ikbo_score(j->ctx, j->b, got, NULL, &e)) {
            snprintf(j->err, sizeof j->err, "%s", e.msg);
            j->bad = 1;
            break;
        }
        double worst = 0;
        for (size_t i = 0; i < j->n; i++) {
            double d = fabs((double)got[i] - j->ref[i]);
            if (isnan(d))
                d = INFINITY;
            if (d > worst)
                worst = d;
        }
        if (!(worst <= j->tol * (top > 0 ? top : 1))) {
            snprintf(j->err, sizeof j->err, "worst element off by %.3g (largest score %.3g)", worst,
                     top);
            j->bad = 1;
        }
    }
    free(got);
    return NULL;
}

static int check_concurrent(const char *dir, ikbo_model *mg, ikbo_ctx *cg,
                            const ikbo_model_info *in, double tol, int *checks)
{
    int counts[58];
    for (int u = 0; u < 58; u++)
        counts[u] = 70;
    batch_mem bm = make_batch(in, 58, counts);
    size_t n = (size_t)bm.b.n_cands * in->n_tasks;
    float *ref = xcalloc(n, sizeof(float));
    ikbo_err e = {{0}};
    cc_job jobs[CC_THREADS];
    pthread_t th[CC_THREADS];
    int failures = 0, started = 0;
    (*checks)++;
    if (ikbo_score(cg, &bm.b, ref, NULL, &e)) {
        printf("FAIL %s concurrent: the batch alone: %s\n", dir, e.msg);
        stop_if_lost(cg, &bm.b, dir, "concurrent");
        failures++;
        goto out;
    }
    int made = 0;
    for (; made < CC_THREADS; made++) { /* every context before any thread, as at a load */
        jobs[made] = (cc_job){.b = &bm.b, .ref = ref, .n = n, .tol = tol};
        if (!(jobs[made].ctx = ikbo_ctx_new(mg, &e))) {
            printf("FAIL %s concurrent: context %d: %s\n", dir, made, e.msg);
            failures++;
            break;
        }
    }
    for (; started < made && !failures; started++)
        if (pthread_create(&th[started], NULL, cc_run, &jobs[started])) {
            printf("FAIL %s concurrent: thread %d not started\n", dir, started);
            failures++;
            break;
        }
    for (int k = 0; k < made; k++) {
        if (k < started)
            pthread_join(th[k], NULL);
        if (jobs[k].bad) {
            printf("FAIL %s concurrent: instance %d, round %d: %s\n", dir, k, jobs[k].round,
                   jobs[k].err);
            stop_if_lost(jobs[k].ctx, &bm.b, dir, "concurrent");
            failures++;
        }
        ikbo_ctx_free(jobs[k].ctx);
    }
    if (!failures)
        printf("ok   %-28s concurrent: %d instances x %d rounds of C %d agree with one alone\n",
               dir, CC_THREADS, CC_ROUNDS, bm.b.n_cands);
out:
    free(ref);
    free_batch(&bm);
    return failures;
}

static int g_no_fold; /* --no-fold */

/* The user lane (engine/lane.h) against one stream: the same kernels in
 * the same order on each side, so the task scores must be bit-identical;
 * a difference means one side read the other's work before it was done.
 * Shapes from one user to 15 x 70 (a fresh batch each, output NaN-poisoned
 * on both sides), on a context with the lane (cg, the checks' IKBO
 * context) and one without. Returns the failures; adds its checks. */
static int check_lane(const char *dir, const ikbo_model_info *in, ikbo_ctx *cg, int *checks)
{
    ikbo_err e = {{0}};
    ikbo_load_opts o1 = {.device = "cuda:0", .mode = IKBO_MODE_IKBO, .no_fold = g_no_fold,
                         .no_lane = 1};
    ikbo_model *m1 = ikbo_model_load(dir, &o1, &e);
    ikbo_ctx *c1 = m1 ? ikbo_ctx_new(m1, &e) : NULL;
    int failures = 0, c70[15];
    for (int i = 0; i < 15; i++)
        c70[i] = 70;
    (*checks)++;
    if (!c1) {
        printf("FAIL %s: lane check: one-stream load: %s\n", dir, e.msg);
        ikbo_model_free(m1);
        return 1;
    }
    for (int nu = 1; nu <= 15 && !failures; nu += 7) {
        batch_mem bm = make_batch(in, nu, c70);
        size_t n = (size_t)bm.b.n_cands * in->n_tasks;
        float *a = xcalloc(n, sizeof(float)), *b = xcalloc(n, sizeof(float));
        for (size_t i = 0; i < n; i++)
            a[i] = b[i] = NAN;
        (*checks)++;
        if (ikbo_score(cg, &bm.b, a, NULL, &e) || ikbo_score(c1, &bm.b, b, NULL, &e)) {
            printf("FAIL %s lane %d x 70: %s\n", dir, nu, e.msg);
            stop_if_lost(cg, &bm.b, dir, "lane");
            failures++;
        } else {
            size_t diff = 0, nan = 0;
            for (size_t i = 0; i < n; i++) {
                diff += memcmp(&a[i], &b[i], sizeof(float)) != 0;
                nan += isnan(a[i]);
            }
            failures += diff || nan;
            printf("%s %-28s lane %2d x 70       %zu of %zu task scores differ from one stream, "
                   "%zu NaN\n", diff || nan ? "FAIL" : "ok  ", dir, nu, diff, n, nan);
        }
        free(a);
        free(b);
        free_batch(&bm);
    }
    ikbo_ctx_free(c1);
    ikbo_model_free(m1);
    return failures;
}

/* Every check of one model version directory. Returns the failures. */
static int check_model(const char *dir, double tol, int *checks)
{
    ikbo_err e = {{0}};
    ikbo_load_opts oc = {.device = "cpu", .mode = IKBO_MODE_IKBO, .no_fold = g_no_fold},
                   og = {.device = "cuda:0", .mode = IKBO_MODE_IKBO, .no_fold = g_no_fold},
                   ob = {.device = "cuda:0", .mode = IKBO_MODE_BROADCAST, .no_fold = g_no_fold};
    ikbo_model *mc = ikbo_model_load(dir, &oc, &e), *mg = NULL, *mb = NULL;
    trio t = {.dir = dir, .tol = tol};
    int failures = 0;
    if (!mc) {
        printf("FAIL %s: cpu load: %s\n", dir, e.msg);
        return 1;
    }
    mg = ikbo_model_load(dir, &og, &e);
    mb = mg ? ikbo_model_load(dir, &ob, &e) : NULL;
    if (!mg || !mb) {
        printf("FAIL %s: cuda load: %s\n", dir, e.msg);
        failures++;
        goto out;
    }
    t.in = ikbo_model_get_info(mc);
    if (!(t.cc = ikbo_ctx_new(mc, &e)) || !(t.cg = ikbo_ctx_new(mg, &e)) ||
        !(t.cb = ikbo_ctx_new(mb, &e))) {
        printf("FAIL %s: context: %s\n", dir, e.msg);
        failures++;
        goto out;
    }
    int c1[] = {1}, c3[] = {1, 7, 2}, c70[15], c1000[] = {1000, 1}, codd[] = {3, 1, 5, 9, 1};
    for (int i = 0; i < 15; i++)
        c70[i] = 70;
    struct { int nu; const int *counts; const char *name; } shapes[] = {
        {1, c1, "1x1"}, {3, c3, "3 users 1/7/2"}, {5, codd, "5 users odd"},
        {15, c70, "15 users x70"}, {2, c1000, "1000+1"}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        failures += check_shape(&t, shapes[s].nu, shapes[s].counts, shapes[s].name, checks);
    ikbo_stats st;
    ikbo_get_stats(mg, &st);
    (*checks)++;
    if (st.bytes_peak[BK_TAG_BROADCAST]) {
        printf("FAIL %s: IKBO-mode backend peaked at %zu broadcast bytes\n", dir,
               st.bytes_peak[BK_TAG_BROADCAST]);
        failures++;
    }
    failures += check_lane(dir, t.in, t.cg, checks);
    failures += check_graph_modes(&t, &og, &ob, checks);
    failures += check_concurrent(dir, mg, t.cg, t.in, tol, checks);
out:
    ikbo_ctx_free(t.cc);
    ikbo_ctx_free(t.cg);
    ikbo_ctx_free(t.cb);
    ikbo_model_free(mc);
    ikbo_model_free(mg);
    ikbo_model_free(mb);
    return failures;
}

int main(int argc, char **argv)
{
    int first = 1;
    if (argc > 1 && !strcmp(argv[1], "--no-fold"))
        g_no_fold = 1, first = 2;
    if (argc <= first) {
        fprintf(stderr, "usage: %s [--no-fold] MODEL_VERSION_DIR...\n", argv[0]);
        return 2;
    }
    const char *dt = getenv("IKBO_CUDA_DTYPE");
    double tol = dt && !strcmp(dt, "fp32") ? 1e-4 : 3e-2;
    unsigned long long seed = g_seed = gr_seed_checks();
    printf("test_cuda_model: inputs from IKBO_TEST_SEED=%llu%s\n", seed,
           g_no_fold ? ", lce chains as written (--no-fold)" : "");
    int failures = 0, checks = 0;
    for (int a = first; a < argc; a++)
        failures += check_model(argv[a], tol, &checks);
    printf("test_cuda_model: %s (%d checks, %d failures; IKBO_TEST_SEED=%llu)\n",
           failures ? "FAILED" : "passed", checks, failures, seed);
    return failures ? 1 : 0;
}
