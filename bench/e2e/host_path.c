/* host_path.c - what one Rank request costs the server's CPU outside the
 * forward pass, step by step, without gRPC or a model.
 *
 * Why this exists: on the H200 the bench model's 16 x 70 request has a
 * ~1.3 ms forward pass, and the server's own work on it (protobuf unpack,
 * validation, user dedup and grouping, response build and pack, freeing)
 * was of the same size. This times each step on requests built by
 * ikbo-loadgen's own generator (tools/loadgen/shape.c) for the bench
 * model's inputs, so a change to any of them can be measured here, on any
 * machine, in a second.
 *
 *   build/host_path [--users N] [--cands N] [--history N] [--iters N]
 *
 * Prints the mean microseconds per request of each step, unpacking with
 * protobuf-c and malloc, protobuf-c into an arena (pb_arena.h), and the
 * server's gRPC path: the fast decoder (rank_wire.h) into an arena and the
 * response packer, for the classic encoding and for the same requests in
 * the packed encoding (ranker.proto).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/pb_arena.h"
#include "server/rank_wire.h"
#include "server/request.h"
#include "tools/loadgen/shape.h"

enum { P_COPY, P_UNPACK, P_PREPARE, P_RESPONSE, P_PACK, P_FREE, P_N };
static const char *const PHASE[P_N] = {"copy payload",   "unpack",        "validate + plan",
                                       "build response", "pack response", "free"};

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}

static char *user_sparse[8] = {"uf0", "uf1", "uf2", "uf3", "uf4", "uf5", "uf6", "uf7"};
static char *cand_sparse[2] = {"item", "author"};
static const char *tasks[2] = {"click", "like"};
static const float weights[2] = {1.0f, 0.5f};

/* Times every step over iters requests (the first 10% unmeasured); t[P_N].
 * how: 0 protobuf-c with malloc, 1 protobuf-c into an arena, 2 the server's
 * path (rank_wire's decoder into an arena, protobuf-c where it declines). */
static int run(const lg_bodies *b, const ikbo_model_info *mi, int iters, int how, double *t)
{
    size_t max_c = 1;
    for (int i = 0; i < b->n; i++)
        if (b->b[i].n_cands > max_c) max_c = b->b[i].n_cands;
    float *scores = calloc(max_c, sizeof *scores);
    float *task_scores = calloc(max_c * (size_t)mi->n_tasks, sizeof *task_scores);
    if (!scores || !task_scores) return -1;
    int warm = iters / 10, measured = 0;
    memset(t, 0, P_N * sizeof *t);
    for (int r = 0; r < iters; r++) {
        const lg_body *x = &b->b[r % b->n];
        double ts[P_N + 1];
        ts[0] = now_us();
        uint8_t *wire = malloc(x->len);
        if (!wire) return -1;
        memcpy(wire, x->data, x->len);
        ts[1] = now_us();
        pb_arena *a = how ? pb_arena_new(2 * x->len + 4096) : NULL;
        Ikbo__V1__RankRequest *q = how == 2 ? rank_wire_decode(wire, x->len, a, NULL) : NULL;
        if (!q)
            q = ikbo__v1__rank_request__unpack(a ? pb_arena_allocator(a) : NULL, x->len, wire);
        ts[2] = now_us();
        rq_status st;
        rq_plan *p = q ? rq_prepare(q, mi, NULL, &st) : NULL;
        if (!p) {
            fprintf(stderr, "host_path: request %d: %s\n", r, q ? st.msg : "does not unpack");
            return -1;
        }
        ts[3] = now_us();
        Ikbo__V1__RankResponse *rs =
            rq_response_build(q, p, "bench", 1, mi, task_scores, scores, &st);
        ts[4] = now_us();
        size_t n = !rs ? 0 : how == 2 ? rank_wire_response_size(rs)
                                      : ikbo__v1__rank_response__get_packed_size(rs);
        uint8_t *out = malloc(n + 1);
        if (!rs || !out) return -1;
        if (how == 2) rank_wire_pack_response(rs, out);
        else ikbo__v1__rank_response__pack(rs, out);
        ts[5] = now_us();
        free(out);
        rq_response_free(rs);
        rq_plan_free(p);
        if (a)
            pb_arena_free(a);
        else
            ikbo__v1__rank_request__free_unpacked(q, NULL);
        free(wire);
        ts[6] = now_us();
        if (r < warm) continue;
        for (int k = 0; k < P_N; k++) t[k] += ts[k + 1] - ts[k];
        measured++;
    }
    for (int k = 0; k < P_N; k++) t[k] /= measured;
    free(scores);
    free(task_scores);
    return 0;
}

int main(int argc, char **argv)
{
    int users = 16, iters = 200;
    const char *cands = "70", *history = "1024";
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--users") && v) users = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--cands") && v) cands = argv[++i];
        else if (!strcmp(argv[i], "--history") && v) history = argv[++i];
        else if (!strcmp(argv[i], "--iters") && v) iters = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--users N] [--cands DIST] [--history DIST] [--iters N]\n",
                    argv[0]);
            return 2;
        }
    }
    char err[256];
    shape s;
    shape_defaults(&s);
    s.users = users;
    s.distinct = 8;
    if (users < 1 || iters < 10 || dist_parse(&s.candidates, cands, 1, 1000000, err, sizeof err) ||
        dist_parse(&s.history, history, 0, 1024, err, sizeof err)) {
        fprintf(stderr, "host_path: bad arguments (users >= 1, iters >= 10, history <= 1024)\n");
        return 2;
    }
    s.has_history = 1;
    /* The bench model's inputs (models/bench/make_bench_model.py). */
    lg_model m;
    memset(&m, 0, sizeof m);
    m.name = "bench";
    m.user_dense = 64;
    m.cand_dense = 16;
    m.user_sparse = user_sparse;
    m.n_user_sparse = 8;
    m.cand_sparse = cand_sparse;
    m.n_cand_sparse = 2;
    m.has_history = 1;
    m.hist_max_len = 1024;
    m.hist_actions = 4;
    m.n_tasks = 2;
    ikbo_model_info mi;
    memset(&mi, 0, sizeof mi);
    mi.user_dense = 64;
    mi.cand_dense = 16;
    mi.user_sparse = (const char *const *)user_sparse;
    mi.n_user_sparse = 8;
    mi.cand_sparse = (const char *const *)cand_sparse;
    mi.n_cand_sparse = 2;
    mi.has_history = 1;
    mi.hist_max_len = 1024;
    mi.hist_actions = 4;
    mi.tasks = tasks;
    mi.n_tasks = 2;
    mi.score_weights = weights;
    mi.device = "cpu";
    lg_bodies b, bp; /* the same requests, classic and packed */
    shape sp = s;
    sp.encoding = LG_ENC_PACKED;
    if (lg_bodies_build(&b, &s, &m, err, sizeof err) ||
        lg_bodies_build(&bp, &sp, &m, err, sizeof err)) {
        fprintf(stderr, "host_path: %s\n", err);
        return 1;
    }
    double t[4][P_N], sum[4] = {0, 0, 0, 0};
    for (int h = 0; h < 4; h++)
        if (run(h < 3 ? &b : &bp, &mi, iters, h < 3 ? h : 2, t[h])) return 1;
    printf("host_path: %d users x %s candidates, history %s, %.0f-byte requests (%.0f packed), "
           "%d iterations\n",
           users, cands, history, b.mean_bytes, bp.mean_bytes, iters);
    printf("  %-16s %14s %14s %14s %14s\n", "step (us)", "protobuf-c", "+ arena", "server path",
           "server, packed");
    for (int k = 0; k < P_N; k++) {
        printf("  %-16s %14.1f %14.1f %14.1f %14.1f\n", PHASE[k], t[0][k], t[1][k], t[2][k],
               t[3][k]);
        for (int h = 0; h < 4; h++) sum[h] += t[h][k];
    }
    printf("  %-16s %14.1f %14.1f %14.1f %14.1f\n", "total", sum[0], sum[1], sum[2], sum[3]);
    lg_bodies_free(&bp);
    lg_bodies_free(&b);
    return 0;
}
