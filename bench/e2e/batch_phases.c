/* batch_phases.c - where one batch's time goes: ikbo_score on a device,
 * without the server, for several batch shapes.
 *
 * Why this exists: end to end on the GPU the server spends ~2.6 us per
 * candidate where the kernels need ~1; this splits a batch into its phases
 * cheaply (no profiler, one short device run). For each shape "UxN" (U users,
 * N candidates each, full-length histories) it scores synthetic batches
 * through the public engine API and prints
 *   1. wall time per ikbo_score (mean, p50, p90) and per candidate, clean;
 *   2. the same batches again on a fresh context with IKBO_CUDA_PROFILE=1:
 *      the CUDA backend prints, per batch, each op's calls, host time in the
 *      call and GPU time between CUDA events around it, plus GPU busy vs
 *      span (idle = GPU waiting for the host) and backend host time;
 *      with each op its floor (floor us: max(FLOPs / GEMM rate, compulsory
 *      bytes / copy bandwidth), ceilings measured at the profile's start
 *      and printed in its header; kernels/cuda/cuda_internal.h, cu_prof)
 *      and x floor (gpu us / floor us), then the totals: the ops' GPU time
 *      against the sum of their floors (issue 17: <= 1.4x at 16 x 70), GPU
 *      busy / sum of floors, and what stayed out of the sums (transfers;
 *      ops without a floor, named);
 *      each batch is queued whole before the GPU starts it (the profile's
 *      gate, as a batch graph's replay runs), so an op's GPU time is its
 *      own; --profile-host times the ops as the host issues them instead
 *      (IKBO_CUDA_PROFILE=host: early ops then include the host's pace);
 *      this tool adds the wall time of those profiled ikbo_score calls, so
 *      wall - backend host = the engine's own host work (validation, dry
 *      pass, staging, output sigmoid);
 *   3. with --graphs N, the clean timing again on a model loaded with batch
 *      graphs (engine/batch_graph.h), and how many batches replayed.
 * Each shape cycles through NB batches of the same shape with different
 * data (user sparse features of 1 to 8 ids), as a server sees.
 *
 *   batch_phases MODEL_VERSION_DIR [--device cuda:0] [--mode ikbo|broadcast]
 *                [--shapes "1x10 1x70 16x70"] [--iters 50] [--warmup 5] [--no-profile]
 *                [--profile-host] [--graphs N] [--no-fold] [--no-lane]
 * (--no-lane: every layer on one stream, engine/lane.h, for an A/B.)
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/ikbo.h"
#include "tests/gpu/gpu_rand.h"

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

static ikbo_jagged rand_jagged(int rows, int lo, int hi)
{
    int64_t *off = xcalloc((size_t)rows + 1, sizeof(int64_t));
    for (int r = 0; r < rows; r++)
        off[r + 1] = off[r] + irand(lo, hi);
    int64_t *ids = xcalloc((size_t)off[rows] + 1, sizeof(int64_t));
    for (int64_t i = 0; i < off[rows]; i++)
        ids[i] = (int64_t)irand(0, 1 << 24);
    ikbo_jagged j = {ids, off};
    return j;
}

/* What the server would hand the engine: U users with full histories
 * (max_len events, as bench/e2e sends), N candidates each. */
static ikbo_batch make_batch(const ikbo_model_info *in, int nu, int per)
{
    ikbo_batch b;
    memset(&b, 0, sizeof b);
    int nc = nu * per;
    int32_t *map = xcalloc((size_t)nc, sizeof(int32_t));
    for (int c = 0; c < nc; c++)
        map[c] = c / per;
    float *ud = xcalloc((size_t)nu * in->user_dense, sizeof(float));
    for (int i = 0; i < nu * in->user_dense; i++)
        ud[i] = frand();
    float *cd = xcalloc((size_t)nc * in->cand_dense, sizeof(float));
    for (int i = 0; i < nc * in->cand_dense; i++)
        cd[i] = frand();
    ikbo_jagged *us = xcalloc((size_t)in->n_user_sparse, sizeof(ikbo_jagged));
    for (int f = 0; f < in->n_user_sparse; f++)
        us[f] = rand_jagged(nu, 1, 8);
    ikbo_jagged *cs = xcalloc((size_t)in->n_cand_sparse, sizeof(ikbo_jagged));
    for (int f = 0; f < in->n_cand_sparse; f++)
        cs[f] = rand_jagged(nc, 1, 1);
    b.n_users = nu;
    b.n_cands = nc;
    b.user_dense = in->user_dense ? ud : NULL;
    b.cand_dense = in->cand_dense ? cd : NULL;
    b.user_sparse = us;
    b.cand_sparse = cs;
    b.map = map;
    if (in->has_history) {
        int64_t *off = xcalloc((size_t)nu + 1, sizeof(int64_t));
        for (int u = 0; u < nu; u++)
            off[u + 1] = off[u] + in->hist_max_len;
        int64_t *ids = xcalloc((size_t)off[nu] + 1, sizeof(int64_t));
        int32_t *acts = xcalloc((size_t)off[nu] + 1, sizeof(int32_t));
        for (int64_t i = 0; i < off[nu]; i++) {
            ids[i] = (int64_t)irand(0, 1 << 24);
            acts[i] = in->hist_actions > 0 ? irand(0, in->hist_actions - 1) : 0;
        }
        b.hist.ids = ids;
        b.hist.offsets = off;
        b.hist_actions = in->hist_actions > 0 ? acts : NULL;
    }
    return b;
}

static void free_batch(const ikbo_model_info *in, ikbo_batch *b)
{
    for (int f = 0; f < in->n_user_sparse; f++) {
        free((void *)b->user_sparse[f].ids);
        free((void *)b->user_sparse[f].offsets);
    }
    for (int f = 0; f < in->n_cand_sparse; f++) {
        free((void *)b->cand_sparse[f].ids);
        free((void *)b->cand_sparse[f].offsets);
    }
    free((void *)b->user_sparse);
    free((void *)b->cand_sparse);
    free((void *)b->hist.ids);
    free((void *)b->hist.offsets);
    free((void *)b->hist_actions);
    free((void *)b->map);
    free((void *)b->user_dense);
    free((void *)b->cand_dense);
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Sorts t[n] (for percentiles) and returns its mean. */
static double stats(double *t, int n)
{
    double sum = 0;
    for (int i = 0; i < n; i++)
        sum += t[i];
    qsort(t, (size_t)n, sizeof(double), cmp_d);
    return sum / n;
}

#define NB 4 /* batches per shape, cycled */

/* Scores warmup + iters batches (cycling through b[NB]) on a fresh context;
 * fills t[iters] with the measured wall times (us) and *gs with the
 * context's graph counters. */
static int run(ikbo_model *m, const ikbo_batch *b, int warmup, int iters, double *t, float *ts,
               float *sc, ikbo_graph_stats *gs)
{
    ikbo_err e = {{0}};
    ikbo_ctx *c = ikbo_ctx_new(m, &e);
    if (!c) {
        fprintf(stderr, "batch_phases: context: %s\n", e.msg);
        return -1;
    }
    for (int i = 0; i < warmup + iters; i++) {
        double t0 = now_us();
        if (ikbo_score(c, &b[i % NB], ts, sc, &e)) {
            fprintf(stderr, "batch_phases: ikbo_score: %s\n", e.msg);
            ikbo_ctx_free(c);
            return -1;
        }
        if (i >= warmup)
            t[i - warmup] = now_us() - t0;
    }
    ikbo_ctx_graph_stats(c, gs);
    fflush(stdout);
    ikbo_ctx_free(c); /* with IKBO_CUDA_PROFILE set, the backend reports here */
    fflush(stderr);
    return 0;
}

/* run, then stats: the mean wall time (us; t[iters] sorted), or -1. */
static double timed(ikbo_model *m, const ikbo_batch *b, int warmup, int iters, double *t,
                    float *ts, float *sc, ikbo_graph_stats *gs)
{
    return run(m, b, warmup, iters, t, ts, sc, gs) ? -1 : stats(t, iters);
}

int main(int argc, char **argv)
{
    const char *dir = NULL, *device = "cuda:0", *shapes = "1x10 1x70 1x500 16x10 16x70 16x500";
    enum ikbo_mode mode = IKBO_MODE_IKBO;
    int iters = 50, warmup = 5, profile = 1, graphs = 0, no_fold = 0, no_lane = 0;
    const char *pmode = "1"; /* IKBO_CUDA_PROFILE: gated; --profile-host: "host" */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--device") && v) device = argv[++i];
        else if (!strcmp(a, "--mode") && v) {
            if (ikbo_mode_parse(v, &mode) != 0) {
                fprintf(stderr, "batch_phases: --mode: expected ikbo or broadcast, got \"%s\"\n", v);
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--shapes") && v) shapes = argv[++i];
        else if (!strcmp(a, "--iters") && v) iters = atoi(argv[++i]);
        else if (!strcmp(a, "--warmup") && v) warmup = atoi(argv[++i]);
        else if (!strcmp(a, "--no-profile")) profile = 0;
        else if (!strcmp(a, "--profile-host")) pmode = "host";
        else if (!strcmp(a, "--graphs") && v) graphs = atoi(argv[++i]);
        else if (!strcmp(a, "--no-fold")) no_fold = 1;
        else if (!strcmp(a, "--no-lane")) no_lane = 1;
        else if (a[0] != '-' && !dir) dir = a;
        else {
            fprintf(stderr, "usage: %s MODEL_VERSION_DIR [--device D] [--mode ikbo|broadcast] "
                            "[--shapes \"UxN ...\"] [--iters N] [--warmup N] [--no-profile] "
                            "[--profile-host] [--graphs N] [--no-fold] [--no-lane]\n",
                    argv[0]);
            return 2;
        }
    }
    if (!dir || iters < 1 || warmup < 0 || graphs < 0) {
        fprintf(stderr, "batch_phases: need a model directory, --iters >= 1, --graphs >= 0\n");
        return 2;
    }
    unsetenv("IKBO_CUDA_PROFILE");
    gr_seed(0x853c49e6748fea9bull); /* the same inputs in every run: builds compare */
    ikbo_err e = {{0}};
    ikbo_load_opts o = {.device = device, .mode = mode, .no_fold = no_fold, .no_lane = no_lane};
    ikbo_model *m = ikbo_model_load(dir, &o, &e);
    if (!m) {
        fprintf(stderr, "batch_phases: %s\n", e.msg);
        return 1;
    }
    o.graphs = graphs;
    ikbo_model *mg = graphs ? ikbo_model_load(dir, &o, &e) : NULL;
    if (graphs && !mg) {
        fprintf(stderr, "batch_phases: %s\n", e.msg);
        ikbo_model_free(m);
        return 1;
    }
    const ikbo_model_info *in = ikbo_model_get_info(m);
    ikbo_graph_stats gs;
    printf("batch_phases: %s on %s, %s mode, %d warm-up + %d timed batches per shape\n", dir,
           device, ikbo_mode_name(mode), warmup, iters);
    double *t = xcalloc((size_t)iters, sizeof(double));
    char buf[512];
    snprintf(buf, sizeof buf, "%s", shapes);
    int rc = 0;
    for (char *tok = strtok(buf, " ,"); tok; tok = strtok(NULL, " ,")) {
        int nu = 0, per = 0;
        if (sscanf(tok, "%dx%d", &nu, &per) != 2 || nu < 1 || per < 1) {
            fprintf(stderr, "batch_phases: bad shape '%s' (want UxN)\n", tok);
            rc = 2;
            break;
        }
        ikbo_batch b[NB];
        for (int k = 0; k < NB; k++)
            b[k] = make_batch(in, nu, per);
        int C = b[0].n_cands;
        float *ts = xcalloc((size_t)C * in->n_tasks, sizeof(float)), *sc = xcalloc((size_t)C, sizeof(float));
        double mean = timed(m, b, warmup, iters, t, ts, sc, &gs);
        if (mean < 0) {
            rc = 1;
            break;
        }
        printf("== shape %dx%d (C %d): ikbo_score mean %.1f us, p50 %.1f, p90 %.1f; %.3f us/candidate, "
               "%.0f candidates/s on one context (score[0] %.5f)\n",
               nu, per, C, mean, t[iters / 2], t[iters * 9 / 10], mean / C, C / mean * 1e6,
               (double)sc[0]);
        if (mg) {
            float s0 = sc[0];
            double gm = timed(mg, b, warmup, iters, t, ts, sc, &gs);
            if (gm < 0) {
                rc = 1;
                break;
            }
            printf("   graphs %d: ikbo_score mean %.1f us, p50 %.1f, p90 %.1f (%.2fx); recorded %llu, "
                   "replayed %llu of %d, fell back %llu%s%s; score[0] %.5f (|diff| %.1e)\n",
                   graphs, gm, t[iters / 2], t[iters * 9 / 10], mean / gm,
                   (unsigned long long)gs.captures, (unsigned long long)gs.replays, warmup + iters,
                   (unsigned long long)gs.fallbacks, gs.last_error[0] ? ": " : "", gs.last_error,
                   (double)sc[0], fabs((double)sc[0] - s0));
        }
        if (profile) {
            setenv("IKBO_CUDA_PROFILE", pmode, 1);
            char skip[16];
            snprintf(skip, sizeof skip, "%d", warmup);
            setenv("IKBO_CUDA_PROFILE_SKIP", skip, 1);
            fflush(stdout);
            double pm = timed(m, b, warmup, iters, t, ts, sc, &gs);
            unsetenv("IKBO_CUDA_PROFILE");
            if (pm < 0)
                rc = 1;
            else
                printf("   profiled: ikbo_score wall mean %.1f us (the profile's events add to it)\n",
                       pm);
        }
        fflush(stdout);
        free(ts);
        free(sc);
        for (int k = 0; k < NB; k++)
            free_batch(in, &b[k]);
    }
    free(t);
    ikbo_model_free(mg);
    ikbo_model_free(m);
    return rc;
}
