/* selftest.c - `ikbo-loadgen --self-test`: checks of the parts that need no
 * server (histogram precision, distributions, JSON spec, request bodies), so
 * tests/integration/test_loadgen.py can run them without a unit framework. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hist.h"
#include "ikbo/v1/ranker.pb-c.h"
#include "shape.h"

int lg_self_test(void);

static int n_checks, n_failed;

#define CHECK(cond, ...)                                                   \
    do {                                                                   \
        n_checks++;                                                        \
        if (!(cond)) {                                                     \
            n_failed++;                                                    \
            fprintf(stderr, "self-test FAILED %s:%d: ", __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                                  \
            fputc('\n', stderr);                                           \
        }                                                                  \
    } while (0)

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void test_hist(void)
{
    /* every index's range is contiguous with the next and at most 1/128 wide */
    uint64_t prev_hi = 0;
    int bad = 0;
    for (int i = 0; i < HIST_BUCKETS; i++) {
        uint64_t lo, hi;
        hist_bounds(i, &lo, &hi);
        if (i > 0 && lo != prev_hi + 1) bad++;
        if (lo >= 256 && (double)(hi - lo + 1) > (double)lo / 128.0 + 1e-9) bad++;
        if (hist_index(lo) != i || hist_index(hi) != i) bad++;
        prev_hi = hi;
    }
    CHECK(bad == 0, "%d bucket boundary errors", bad);
    CHECK(prev_hi == UINT64_MAX, "buckets end at %llu", (unsigned long long)prev_hi);

    /* quantiles of a wide log-normal sample within 0.5% of the exact ones */
    enum { N = 200000 };
    uint64_t *v = malloc(N * sizeof *v);
    hist *h = malloc(sizeof *h), *h1 = malloc(sizeof *h1), *h2 = malloc(sizeof *h2);
    if (!v || !h || !h1 || !h2) {
        CHECK(0, "out of memory");
        return;
    }
    hist_init(h);
    hist_init(h1);
    hist_init(h2);
    lg_rng r;
    lg_rng_seed(&r, 42);
    for (int i = 0; i < N; i++) {
        double u1 = lg_rng_unit(&r) + 1e-12, u2 = lg_rng_unit(&r);
        double z = sqrt(-2 * log(u1)) * cos(2 * M_PI * u2);
        v[i] = (uint64_t)(exp(13.0 + 1.5 * z)); /* ~0.4 ms median, tails to seconds */
        hist_add(h, v[i]);
        hist_add(i % 2 ? h1 : h2, v[i]);
    }
    qsort(v, N, sizeof *v, cmp_u64);
    const double qs[] = {0.5, 0.9, 0.99, 0.999, 0.0001};
    for (size_t k = 0; k < sizeof qs / sizeof *qs; k++) {
        size_t rank = (size_t)ceil(qs[k] * N);
        double exact = (double)v[rank - 1], got = hist_quantile(h, qs[k]);
        CHECK(fabs(got - exact) <= 0.005 * exact, "q%.4f: %.1f vs exact %.1f", qs[k], got, exact);
    }
    CHECK(hist_quantile(h, 0) == (double)v[0] && hist_quantile(h, 1) == (double)v[N - 1], "min/max");
    hist_merge(h1, h2);
    CHECK(h1->count == h->count && h1->min == h->min && h1->max == h->max &&
              !memcmp(h1->b, h->b, sizeof h->b),
          "merge of halves differs from the whole");
    hist_init(h2);
    CHECK(hist_quantile(h2, 0.5) == 0 && hist_mean(h2) == 0, "empty histogram");
    hist_add(h2, 12345678);
    CHECK(hist_quantile(h2, 0.5) == 12345678.0, "single value is exact (clamped to min/max)");
    free(v);
    free(h);
    free(h1);
    free(h2);
}

static void test_dist(void)
{
    dist d;
    char err[256], buf[256];
    CHECK(!dist_parse(&d, "70", 0, 1000, err, sizeof err) && d.kind == DIST_FIXED && d.a == 70, "fixed");
    CHECK(!dist_parse(&d, "10..500", 0, 1000, err, sizeof err) && d.kind == DIST_UNIFORM &&
              d.a == 10 && d.b == 500 && dist_mean(&d) == 255,
          "uniform");
    lg_rng r;
    lg_rng_seed(&r, 7);
    int lo = 1 << 30, hi = -1;
    for (int i = 0; i < 10000; i++) {
        int x = (int)dist_sample(&d, &r);
        if (x < lo) lo = x;
        if (x > hi) hi = x;
    }
    CHECK(lo == 10 && hi == 500, "uniform sample range %d..%d", lo, hi);
    CHECK(!dist_parse(&d, "10,70,500", 0, 1000, err, sizeof err) && d.kind == DIST_CHOICE && d.n == 3 &&
              dist_max(&d) == 500,
          "choice");
    dist_format(&d, buf, sizeof buf);
    CHECK(!strcmp(buf, "10,70,500"), "format %s", buf);
    int seen[3] = {0};
    for (int i = 0; i < 3000; i++) {
        int64_t x = dist_sample(&d, &r);
        seen[x == 10 ? 0 : x == 70 ? 1 : 2]++;
    }
    CHECK(seen[0] > 800 && seen[1] > 800 && seen[2] > 800, "choice is uniform: %d %d %d", seen[0],
          seen[1], seen[2]);
    const char *bad[] = {"", "a", "5..2", "1,,2", "1..", "2000", "-1", "3x", "1,2,x", NULL};
    for (int i = 0; bad[i]; i++)
        CHECK(dist_parse(&d, bad[i], 0, 1000, err, sizeof err) == -1 && err[0], "'%s' accepted", bad[i]);
}

static void test_spec(void)
{
    char path[] = "/tmp/ikbo-loadgen-spec-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) {
        CHECK(0, "mkstemp");
        return;
    }
    const char *doc = "{\"users\": 16, \"candidates\": {\"uniform\": [10, 500]}, \"history\": [0, 64],"
                      " \"ids_per_bag\": \"1..4\", \"repeat_users\": 0.25, \"user_pool\": 50,"
                      " \"model\": \"bench\", \"model_version\": 3, \"shuffle\": true}";
    if (write(fd, doc, strlen(doc)) != (ssize_t)strlen(doc)) CHECK(0, "write");
    close(fd);
    shape s;
    shape_defaults(&s);
    char *model = NULL, err[512];
    int64_t ver;
    int rc = shape_apply_json_file(&s, path, &model, &ver, err, sizeof err);
    CHECK(rc == 0, "spec: %s", err);
    CHECK(s.users == 16 && s.candidates.kind == DIST_UNIFORM && s.candidates.b == 500 &&
              s.has_history && s.history.kind == DIST_CHOICE && s.cand_ids.b == 4 &&
              s.repeat_users == 0.25 && s.user_pool == 50 && s.shuffle && model &&
              !strcmp(model, "bench") && ver == 3,
          "spec values");
    free(model);
    FILE *f = fopen(path, "w");
    if (f) {
        fputs("{\"users\": 2, \"candidatez\": 3}", f);
        fclose(f);
    }
    rc = shape_apply_json_file(&s, path, &model, &ver, err, sizeof err);
    CHECK(rc == -1 && strstr(err, "candidatez: unknown key"), "unknown key: %s", err);
    f = fopen(path, "w");
    if (f) {
        fputs("{\"users\": 0}", f);
        fclose(f);
    }
    rc = shape_apply_json_file(&s, path, &model, &ver, err, sizeof err);
    CHECK(rc == -1 && strstr(err, "users"), "users 0: %s", err);
    unlink(path);
}

static void test_bodies(void)
{
    char *us[] = {"country", "lang"}, *cs[] = {"item"};
    lg_model m = {.name = "demo", .version = 1, .req_version = 0, .user_dense = 3, .cand_dense = 2,
                  .user_sparse = us, .n_user_sparse = 2, .cand_sparse = cs, .n_cand_sparse = 1,
                  .has_history = 1, .hist_max_len = 8, .hist_actions = 3, .n_tasks = 2};
    shape s;
    shape_defaults(&s);
    s.users = 4;
    char err[256];
    dist_parse(&s.candidates, "2..5", 0, 100, err, sizeof err);
    dist_parse(&s.user_ids, "1..3", 0, 100, err, sizeof err);
    s.repeat_users = 0.5;
    s.user_pool = 6;
    s.distinct = 20;
    s.top_k = 3;
    lg_bodies b;
    CHECK(lg_bodies_build(&b, &s, &m, err, sizeof err) == 0 && b.n == 20, "build: %s", err);
    int pool_seen = 0, bad = 0;
    uint8_t *pool_pack[6] = {0};
    size_t pool_len[6] = {0};
    for (int i = 0; i < b.n; i++) {
        Ikbo__V1__RankRequest *q = ikbo__v1__rank_request__unpack(NULL, b.b[i].len, b.b[i].data);
        if (!q) {
            bad++;
            continue;
        }
        bad += strcmp(q->model, "demo") != 0 || q->model_version != 0 || q->n_users != 4 || q->top_k != 3;
        bad += b.b[i].n_cands != q->n_candidates || b.b[i].n_expected_scores != 3;
        int per_user[4] = {0};
        for (size_t c = 0; c < q->n_candidates; c++) {
            Ikbo__V1__Candidate *cd = q->candidates[c];
            bad += cd->user >= 4 || cd->n_dense != 2 || cd->n_sparse != 1 || cd->sparse[0]->n_ids != 1;
            if (cd->user < 4) per_user[cd->user]++;
        }
        for (int j = 0; j < 4; j++) bad += per_user[j] < 2 || per_user[j] > 5;
        for (size_t j = 0; j < q->n_users; j++) {
            Ikbo__V1__User *u = q->users[j];
            bad += u->n_dense != 3 || u->n_sparse != 2 || u->n_history_ids != 8 || u->n_history_actions != 8;
            for (size_t k = 0; k < u->n_history_actions; k++) bad += u->history_actions[k] < 0 || u->history_actions[k] > 2;
            for (size_t k = 0; k < u->n_sparse; k++) bad += u->sparse[k]->n_ids < 1 || u->sparse[k]->n_ids > 3;
            int p;
            if (sscanf(u->key, "pool-%d", &p) == 1 && p >= 0 && p < 6) {
                pool_seen++;
                for (size_t k = 0; k < j; k++) bad += !strcmp(q->users[k]->key, u->key); /* distinct */
                size_t len = ikbo__v1__user__get_packed_size(u);
                uint8_t *pk = malloc(len);
                ikbo__v1__user__pack(u, pk);
                if (!pool_pack[p]) {
                    pool_pack[p] = pk;
                    pool_len[p] = len;
                } else {
                    bad += pool_len[p] != len || memcmp(pool_pack[p], pk, len); /* same content */
                    free(pk);
                }
            }
        }
        ikbo__v1__rank_request__free_unpacked(q, NULL);
    }
    CHECK(bad == 0, "%d malformed fields in generated requests", bad);
    CHECK(pool_seen > 10 && pool_seen < 70, "pool users %d of 80 slots (expected ~40)", pool_seen);
    for (int p = 0; p < 6; p++) free(pool_pack[p]);
    lg_bodies_free(&b);
    /* a model without history and sparse inputs gets neither */
    lg_model m2 = {.name = "plain", .user_dense = 1, .cand_dense = 1};
    shape_defaults(&s);
    s.distinct = 2;
    CHECK(lg_bodies_build(&b, &s, &m2, err, sizeof err) == 0, "build plain: %s", err);
    Ikbo__V1__RankRequest *q = ikbo__v1__rank_request__unpack(NULL, b.b[0].len, b.b[0].data);
    CHECK(q && q->n_users == 1 && q->users[0]->n_history_ids == 0 && q->users[0]->n_sparse == 0 &&
              q->n_candidates == 70 && b.b[0].n_expected_scores == 70,
          "plain model request");
    if (q) ikbo__v1__rank_request__free_unpacked(q, NULL);
    lg_bodies_free(&b);
}

int lg_self_test(void)
{
    test_hist();
    test_dist();
    test_spec();
    test_bodies();
    printf("self-test: %d checks, %d failed\n", n_checks, n_failed);
    return n_failed ? 1 : 0;
}
