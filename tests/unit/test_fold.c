/* test_fold.c - the lce fold (engine/fold.h): where it applies, what it
 * plans, its weight, and that it scores the model as written.
 *
 * Why this exists: the fold replaces three model.json layers by a rewrite
 * chosen by a cost rule, and computes a weight no file holds. Each part is
 * checked against something independent: the rule against the header's
 * FLOP counts on shapes either side of it, the folded weight against the
 * definition summed in double, and the folded model's scores against the
 * same model loaded with no_fold (the CPU backend, fp32: the two differ
 * only by summation order). The golden test (rand_fold) checks the folded
 * engine against the PyTorch reference.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/fold.h"
#include "engine/ikbo.h"
#include "engine/model.h"
#include "engine/plan.h"
#include "engine_fixture.h"

/* src with `from` replaced by `to` (once; src must hold it). Malloc'd. */
static char *subst(const char *src, const char *from, const char *to)
{
    const char *at = strstr(src, from);
    if (!at) fail_msg("the fixture lacks %s", from);
    size_t n = strlen(src) - strlen(from) + strlen(to) + 1;
    char *s = malloc(n);
    assert_non_null(s);
    snprintf(s, n, "%.*s%s%s", (int)(at - src), src, to, at + strlen(from));
    return s;
}

static char *variant(const char *from, const char *to) { return subst(EF_MODEL_JSON, from, to); }

/* The fixture with top1 (and u_vec, added to it) N wide and the lce M. */
static char *widths(int N, int M)
{
    char a[96], b[96], c[96];
    snprintf(a, sizeof a, "\"input\": \"flat\", \"out\": %d,", N);
    snprintf(b, sizeof b, "\"input\": \"user.dense\", \"out\": %d}", N);
    snprintf(c, sizeof c, "\"out_tokens\": %d}", M);
    char *s1 = variant("\"input\": \"flat\", \"out\": 8,", a);
    char *s2 = subst(s1, "\"input\": \"user.dense\", \"out\": 8}", b);
    char *s3 = subst(s2, "\"out_tokens\": 3}", c);
    free(s1);
    free(s2);
    return s3;
}

/* engine_fixture.h's mlp2 variant (ef_mlp2_json). Malloc'd. */
static char *with_mlp2_part(void)
{
    char *s = ef_mlp2_json();
    assert_non_null(s);
    return s;
}

static model_def *plan(const char *json)
{
    model_def *m = NULL;
    bk_err e = {{0}};
    if (model_def_plan("/fold/1", json, strlen(json), &m, &e)) fail_msg("plan failed: %s", e.msg);
    return m;
}

static enum md_rewrite rw_of(const model_def *m, const char *name)
{
    for (int i = 0; i < m->plan.n; i++)
        if (!strcmp(m->plan.e[i].name, name)) return m->plan.e[i].rw;
    fail_msg("no plan entry '%s'", name);
    return MD_RW_COUNT;
}

static const md_layer *layer(const model_def *m, const char *name)
{
    for (int i = 0; i < m->n_layers; i++)
        if (!strcmp(m->layers[i].name, name)) return &m->layers[i];
    return NULL;
}

static void expect_layers(const model_def *m, const char *const *names, const enum md_op *ops,
                          const enum md_domain *doms, const int *dims, int n)
{
    const md_layer *prev = NULL;
    for (int k = 0; k < n; k++) {
        const md_layer *l = layer(m, names[k]);
        if (!l) fail_msg("no planned layer '%s'", names[k]);
        assert_int_equal(l->op, ops[k]);
        assert_int_equal(l->domain, doms[k]);
        assert_int_equal(l->dim, dims[k]);
        assert_true(!prev || l == prev + 1); /* in order, at the linear's place */
        prev = l;
    }
}

/* The fixture (M 3, Kc = Ku = 4, D 8, N 8: 2*4*8*8 = 512 < 2*3*8*(4+8) =
 * 576) folds both sides: the chain's layers become fold.c's five and the
 * activation, in place. */
static void test_fixture_folds(void **s)
{
    (void)s;
    model_def *m = plan(EF_MODEL_JSON);
    assert_int_equal(rw_of(m, "lce"), MD_RW_FOLDED);
    assert_int_equal(rw_of(m, "flat"), MD_RW_FOLDED);
    assert_int_equal(rw_of(m, "top1"), MD_RW_FOLDED);
    assert_int_equal(rw_of(m, "mix"), MD_RW_IKBO);
    assert_null(layer(m, "lce"));
    assert_null(layer(m, "flat"));
    static const char *const names[] = {"flat__u", "top1__u", "flat__c", "top1__c", "top1__sum",
                                        "top1"};
    static const enum md_op ops[] = {MD_FLATTEN, MD_LINEAR, MD_FLATTEN, MD_LINEAR, MD_ADD,
                                     MD_ACTIVATION};
    static const enum md_domain doms[] = {MD_USER, MD_USER, MD_CAND, MD_CAND, MD_CAND, MD_CAND};
    static const int dims[] = {32, 8, 32, 8, 8, 8};
    expect_layers(m, names, ops, doms, dims, 6);
    assert_null(layer(m, "lce__u"));
    assert_int_equal(layer(m, "top1__u")->w[0].cols, 32); /* W_top W_user [N, Ku*D] */
    /* The folded weight's shape: [N, Kc*D]; the user linear has no bias. */
    const md_layer *c = layer(m, "top1__c");
    assert_int_equal(c->w[0].rows, 8);
    assert_int_equal(c->w[0].cols, 32);
    /* Candidate FLOPs drop; the report says so on the linear. */
    md_plan_totals t;
    md_plan_totals_of(m, 70, &t);
    assert_true(t.flops[1] < t.flops[0]);
    assert_int_equal(t.rewritten, 4); /* lce, flat, top1 and ta (its wo composed) */
    model_def_free(m);
}

/* The composed attention part: ta stays where it was, planned with no wo
 * (wq, wk, wv), and the plan says where its wo went; the candidate linear
 * keeps its shape. Refused where wo would change the width (H dh != D),
 * where ta has a second reader, and in a model as written. */
static void test_wo_part_plan(void **s)
{
    (void)s;
    model_def *m = plan(EF_MODEL_JSON);
    const md_layer *a = layer(m, "ta");
    assert_non_null(a);
    assert_int_equal(a->no_wo, 1);
    assert_int_equal(a->n_w, 3);
    assert_true(a < layer(m, "e_cand")); /* in place, before the stack that reads it */
    assert_int_equal(layer(m, "top1__c")->w[0].cols, 32);
    assert_int_equal(rw_of(m, "ta"), MD_RW_FOLDED);
    for (int i = 0; i < m->plan.n; i++)
        if (!strcmp(m->plan.e[i].name, "ta"))
            assert_non_null(strstr(m->plan.e[i].note, "wo is composed into that linear's weight"));
    model_def_free(m);
    static const struct { const char *from, *to, *why; } cases[] = {
        {"\"heads\": 2, \"head_dim\": 4}", "\"heads\": 1, \"head_dim\": 4}", "H dh 4 != D 8"},
        {"{\"name\": \"logits\", \"op\": \"linear\", \"input\": \"mix\"",
         "{\"name\": \"tp\", \"op\": \"pool\", \"input\": \"ta\", \"fn\": \"sum\"},"
         "  {\"name\": \"logits\", \"op\": \"linear\", \"input\": \"mix\"",
         "ta read twice"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char *json = variant(cases[k].from, cases[k].to);
        m = plan(json);
        assert_int_equal(rw_of(m, "top1"), MD_RW_FOLDED); /* the chain still folds */
        if (layer(m, "ta")->no_wo) fail_msg("wo composed although %s", cases[k].why);
        assert_int_equal(layer(m, "ta")->n_w, 4);
        model_def_free(m);
        free(json);
    }
    /* "project_output" is the fold's own key: refused as written, either value. */
    for (int v = 0; v < 2; v++) {
        char *json = variant("\"heads\": 2, \"head_dim\": 4}",
                             v ? "\"heads\": 2, \"head_dim\": 4, \"project_output\": true}"
                               : "\"heads\": 2, \"head_dim\": 4, \"project_output\": false}");
        bk_err e = {{0}};
        m = NULL;
        assert_int_not_equal(model_def_plan("/fold/1", json, strlen(json), &m, &e), 0);
        assert_null(m);
        assert_non_null(strstr(e.msg, "'project_output' is set by the engine's lce fold only"));
        free(json);
    }
}

/* Ku 10 (u_d as 8 tokens): the user side fails the rule (2*10*8*8 = 1280
 * >= 2*3*8*18 = 864) while the candidate side passes: the user term is
 * computed as written, at U. */
static void test_user_side_as_written(void **s)
{
    (void)s;
    char *j1 = variant("\"input\": \"user.dense\", \"out\": 16,", "\"input\": \"user.dense\", \"out\": 64,");
    char *json = subst(j1, "\"input\": \"u_d1\", \"tokens\": 2}", "\"input\": \"u_d1\", \"tokens\": 8}");
    model_def *m = plan(json);
    static const char *const names[] = {"lce__u", "flat__u", "top1__u", "flat__c", "top1__c",
                                        "top1__sum", "top1"};
    static const enum md_op ops[] = {MD_TOKEN_LINEAR, MD_FLATTEN, MD_LINEAR, MD_FLATTEN,
                                     MD_LINEAR, MD_ADD, MD_ACTIVATION};
    static const enum md_domain doms[] = {MD_USER, MD_USER, MD_USER, MD_CAND, MD_CAND, MD_CAND,
                                          MD_CAND};
    static const int dims[] = {8, 24, 8, 32, 8, 8, 8};
    expect_layers(m, names, ops, doms, dims, 7);
    assert_int_equal(layer(m, "top1__u")->w[0].cols, 24); /* W_top as it is */
    assert_int_equal(rw_of(m, "top1"), MD_RW_FOLDED);
    model_def_free(m);
    free(json);
    free(j1);
}

/* Shapes the rule refuses, and chains that are not chains. */
static void test_rule_and_readers(void **s)
{
    (void)s;
    static const struct { const char *from, *to, *why; } cases[] = {
        /* the lce read by a second layer */
        {"{\"name\": \"logits\", \"op\": \"linear\", \"input\": \"mix\"",
         "{\"name\": \"p\", \"op\": \"pool\", \"input\": \"lce\", \"fn\": \"sum\"},"
         "  {\"name\": \"logits\", \"op\": \"linear\", \"input\": \"mix\"",
         "lce read twice"},
        /* the flatten read by a second layer */
        {"{\"name\": \"logits\", \"op\": \"linear\", \"input\": \"mix\"",
         "{\"name\": \"f2\", \"op\": \"activation\", \"input\": \"flat\", \"fn\": \"relu\"},"
         "  {\"name\": \"logits\", \"op\": \"linear\", \"input\": \"mix\"",
         "flatten read twice"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0] + 2; k++) {
        /* then, at M 3, N 16 (2*4*8*16 = 1024 >= 2*3*8*(4+16) = 960) and
         * N 12, the edge (768 >= 768): no FLOPs off */
        char *json = k < 2 ? variant(cases[k].from, cases[k].to) : widths(k == 2 ? 16 : 12, 3);
        const char *why = k < 2 ? cases[k].why : "the rule gives no FLOPs off";
        model_def *m = plan(json);
        if (rw_of(m, "lce") == MD_RW_FOLDED || layer(m, "top1__c"))
            fail_msg("folded although %s (case %zu)", why, k);
        assert_non_null(layer(m, "lce"));
        model_def_free(m);
        free(json);
    }
    /* Just inside the rule: N 11 at M 3 (704 < 720), and N 16 at M 5
     * (1024 < 2*5*8*20 = 1600). */
    for (int k = 0; k < 2; k++) {
        char *json = widths(k ? 16 : 11, k ? 5 : 3);
        model_def *m = plan(json);
        assert_int_equal(rw_of(m, "top1"), MD_RW_FOLDED);
        model_def_free(m);
        free(json);
    }
}

/* fold_weight against its definition, summed in double. */
static void test_fold_weight(void **s)
{
    (void)s;
    const int M = 5, Kc = 7, D = 6, N = 3;
    md_weight wc = {.rows = M, .cols = Kc}, wt = {.rows = N, .cols = M * D};
    md_weight to = {.rows = N, .cols = Kc * D};
    wc.data = malloc(sizeof(float) * M * Kc);
    wt.data = malloc(sizeof(float) * N * M * D);
    uint64_t r = 7;
    for (int i = 0; i < M * Kc + N * M * D; i++) {
        r = r * 6364136223846793005ULL + 1442695040888963407ULL;
        float v = (float)((double)(r >> 11) / (double)(1ULL << 53) - 0.5);
        if (i < M * Kc) wc.data[i] = v;
        else wt.data[i - M * Kc] = v;
    }
    assert_int_equal(fold_weight(&wc, &wt, D, &to), 0);
    for (int j = 0; j < N; j++)
        for (int k = 0; k < Kc; k++)
            for (int d = 0; d < D; d++) {
                double want = 0;
                for (int m = 0; m < M; m++)
                    want += (double)wt.data[j * M * D + m * D + d] * wc.data[m * Kc + k];
                double got = to.data[(size_t)j * Kc * D + k * D + d];
                if (fabs(got - want) > 1e-6 * (1 + fabs(want)))
                    fail_msg("W_f[%d, %d*%d + %d] = %g, want %g", j, k, D, d, got, want);
            }
    /* Split among threads (1, 2, 3 and more than rows: clamped), the same
     * bits as on one. */
    for (int t = 1; t <= 4; t++) {
        md_weight tn = {.rows = N, .cols = Kc * D};
        assert_int_equal(fold_weight_n(&wc, &wt, D, &tn, t), 0);
        if (memcmp(tn.data, to.data, sizeof(float) * N * Kc * D))
            fail_msg("fold_weight on %d threads differs from fold_weight", t);
        free(tn.data);
    }
    /* Shapes the planner did not make are refused, not computed. */
    md_weight bad = {.rows = N, .cols = Kc * D + 1};
    assert_int_equal(fold_weight(&wc, &wt, D, &bad), -1);
    assert_null(bad.data);
    free(wc.data);
    free(wt.data);
    free(to.data);
}

static char model_dir[256];

static int setup(void **s)
{
    (void)s;
    assert_int_equal(ef_write_model("fold", model_dir, sizeof model_dir), 0);
    return 0;
}

static int teardown(void **s)
{
    (void)s;
    ef_remove_model(model_dir);
    return 0;
}

/* The batch's scores; *user (when not NULL): its user-domain arena bytes. */
static float *score_dir(const char *dir, int no_fold, enum ikbo_mode mode, const ikbo_batch *b,
                        size_t *user)
{
    ikbo_err err = {{0}};
    ikbo_load_opts o = {.device = "cpu", .mode = mode, .no_fold = no_fold};
    ikbo_model *m = ikbo_model_load(dir, &o, &err);
    if (!m) fail_msg("load failed: %s", err.msg);
    ikbo_ctx *ctx = ikbo_ctx_new(m, &err);
    assert_non_null(ctx);
    float *out = malloc(sizeof(float) * (size_t)b->n_cands * 3);
    for (int i = 0; i < b->n_cands * 3; i++) out[i] = NAN; /* poison */
    if (ikbo_score(ctx, b, out, out + (size_t)b->n_cands * 2, &err))
        fail_msg("score failed: %s", err.msg);
    if (user) {
        size_t last[BK_TAG_COUNT];
        ikbo_ctx_last_bytes(ctx, last);
        *user = last[BK_TAG_USER];
    }
    char *plan_text = ikbo_model_plan(m, 0, 70);
    assert_non_null(plan_text);
    assert_true((strstr(plan_text, "folded") != NULL) == !no_fold);
    free(plan_text);
    ikbo_ctx_free(ctx);
    ikbo_model_free(m);
    return out;
}

/* The folded model scores what the model as written scores (both modes):
 * random batches, relative error over all task scores and scores; with
 * mlp2, the fixture with an mlp2 part (with_mlp2_part). want_user > 0: the
 * folded IKBO run's user-domain bytes must be that. */
static void scores_match(const char *dir, size_t want_user)
{
    enum { U = 3, C = 40 };
    uint64_t r = 12345;
#define RND() (r = r * 6364136223846793005ULL + 1442695040888963407ULL, \
               (float)((double)(r >> 11) / (double)(1ULL << 53) * 2 - 1))
    float ud[U * 6], cd[C * 3];
    int64_t us_ids[U], us_off[U + 1], cs_ids[C], cs_off[C + 1], h_ids[U * 4], h_off[U + 1];
    int32_t h_act[U * 4], map[C];
    for (int i = 0; i < U * 6; i++) ud[i] = RND();
    for (int i = 0; i < C * 3; i++) cd[i] = RND();
    for (int u = 0; u <= U; u++) us_off[u] = u, h_off[u] = 4 * u; /* 4 events each */
    for (int u = 0; u < U; u++) us_ids[u] = u + 1;
    for (int i = 0; i < U * 4; i++) h_ids[i] = 3 * i + 1, h_act[i] = i % 3;
    for (int c = 0; c <= C; c++) cs_off[c] = c;
    for (int c = 0; c < C; c++) cs_ids[c] = 7 * c + 2, map[c] = c * U / C; /* non-decreasing */
#undef RND
    ikbo_jagged us = {us_ids, us_off}, cs = {cs_ids, cs_off};
    ikbo_batch b = {.n_users = U, .n_cands = C, .user_dense = ud, .user_sparse = &us,
                    .hist = {h_ids, h_off}, .hist_actions = h_act, .cand_dense = cd,
                    .cand_sparse = &cs, .map = map};
    for (int mode = 0; mode < 2; mode++) {
        enum ikbo_mode md = mode ? IKBO_MODE_BROADCAST : IKBO_MODE_IKBO;
        size_t user;
        float *f = score_dir(dir, 0, md, &b, &user), *w = score_dir(dir, 1, md, &b, NULL);
        if (want_user && !mode && user != want_user)
            fail_msg("%s: %zu user bytes, expected %zu", dir, user, want_user);
        double worst = 0;
        for (int i = 0; i < C * 3; i++) {
            assert_true(isfinite(f[i]));
            double e = fabs((double)f[i] - w[i]) / fmax(fabs(w[i]), 1e-6);
            worst = e > worst ? e : worst;
        }
        if (worst > 1e-5)
            fail_msg("%s mode %d: folded vs as written, relative error %g", dir, mode, worst);
        free(f);
        free(w);
    }
}

static void test_scores_match_unfolded(void **s)
{
    (void)s;
    scores_match(model_dir, 0);
}

static void test_scores_match_unfolded_mlp2(void **s)
{
    (void)s;
    char dir[256];
    assert_int_equal(ef_write_mlp2_model("fold_mlp2", dir, sizeof dir), 0);
    scores_match(dir, 0);
    ef_remove_model(dir);
}

/* The mlp2 part: c_r1, c_rest and e_cand leave the plan; the other parts
 * are one stack and flatten, mlp2's addend input, whose linear (their
 * columns of the folded weight, top1's bias) mlp2 runs itself; mlp2
 * computes c_r1's share from candidate.dense, adds the user term and
 * applies top1's ReLU (no add or activation layer); the plan names all six
 * layers folded. */
static void test_mlp2_part_plan(void **s)
{
    (void)s;
    char *json = with_mlp2_part();
    model_def *m = plan(json);
    static const char *const names[] = {"flat__u", "top1__u", "e_cand__r", "flat__c", "top1"};
    static const enum md_op ops[] = {MD_FLATTEN, MD_LINEAR, MD_STACK, MD_FLATTEN, MD_MLP2};
    static const enum md_domain doms[] = {MD_USER, MD_USER, MD_CAND, MD_CAND, MD_CAND};
    static const int dims[] = {32, 8, 8, 32, 8};
    expect_layers(m, names, ops, doms, dims, 5);
    assert_null(layer(m, "c_r1"));
    assert_null(layer(m, "c_rest"));
    assert_null(layer(m, "e_cand"));
    assert_null(layer(m, "top1__r"));
    const md_layer *c = layer(m, "top1");
    assert_int_equal(c->n_in, 3);
    assert_string_equal(m->layers[c->in[1].index].name, "flat__c");
    assert_string_equal(m->layers[c->in[2].index].name, "top1__u");
    assert_int_equal(c->act, BK_ACT_RELU), assert_int_equal(c->act2, BK_ACT_RELU);
    assert_int_equal(c->n_w, 5);
    assert_int_equal(c->w[0].rows, 16), assert_int_equal(c->w[0].cols, 3); /* c_r1's W1 */
    assert_int_equal(c->w[2].rows, 8), assert_int_equal(c->w[2].cols, 16); /* its 2 tokens x D */
    assert_int_equal(c->w[3].rows, 8), assert_int_equal(c->w[3].cols, 32); /* 4 tokens x D */
    assert_int_equal(c->w[4].cols, 8);                                     /* top1's bias */
    for (const char *const *n = (const char *const[]){"c_r1", "c_rest", "e_cand", "lce", NULL}; *n; n++)
        assert_int_equal(rw_of(m, *n), MD_RW_FOLDED);
    for (int i = 0; i < m->plan.n; i++) /* the report says where c_r1 went */
        if (!strcmp(m->plan.e[i].name, "top1"))
            assert_non_null(strstr(m->plan.e[i].note, "'c_r1''s share through mlp2"));
    model_def_free(m);
    free(json);
}

/* A part that fails the rule stays as written: c_r1 with a sigmoid. */
static void test_mlp2_part_refused(void **s)
{
    (void)s;
    char *json = with_mlp2_part();
    char *sig = subst(json, "\"candidate.dense\", \"out\": 16, \"activation\": \"relu\"",
                      "\"candidate.dense\", \"out\": 16, \"activation\": \"sigmoid\"");
    model_def *m = plan(sig);
    assert_non_null(layer(m, "c_r1"));
    assert_null(layer(m, "top1__r"));
    assert_int_equal(layer(m, "top1__c")->op, MD_LINEAR);
    model_def_free(m);
    free(sig);
    free(json);
}

/* The composed user part: u_d1, u_d and e_user leave the plan; the other
 * parts (u_country, hist_mean) are one stack and flatten, concatenated
 * with u_d1's input, and the user linear reads that: [N, 2*8 + 6], with a
 * bias (the part's columns times u_d1's bias). The plan names them folded. */
static void test_user_part_plan(void **s)
{
    (void)s;
    char *json = ef_upart_json();
    model_def *m = plan(json);
    static const char *const names[] = {"e_user__ur", "flat__u", "flat__ucat", "top1__u"};
    static const enum md_op ops[] = {MD_STACK, MD_FLATTEN, MD_CONCAT, MD_LINEAR};
    static const enum md_domain doms[] = {MD_USER, MD_USER, MD_USER, MD_USER};
    static const int dims[] = {8, 16, 22, 8};
    expect_layers(m, names, ops, doms, dims, 4);
    for (const char *const *n = (const char *const[]){"u_d1", "u_d", "e_user", "lce", NULL}; *n; n++) {
        assert_null(layer(m, *n));
        assert_int_equal(rw_of(m, *n), MD_RW_FOLDED);
    }
    const md_layer *u = layer(m, "top1__u");
    assert_int_equal(u->w[0].rows, 8), assert_int_equal(u->w[0].cols, 22);
    for (int i = 0; i < m->plan.n; i++)
        if (!strcmp(m->plan.e[i].name, "top1"))
            assert_non_null(strstr(m->plan.e[i].note, "'u_d1' composed into it"));
    model_def_free(m);
    free(json);
    /* Refused: u_d1 with its ReLU (the fixture: e_user stays whole), and
     * an input as wide as the part (user.dense 16: nothing saved). */
    m = plan(EF_MODEL_JSON);
    assert_non_null(layer(m, "u_d1"));
    assert_null(layer(m, "flat__ucat"));
    model_def_free(m);
    char *wide = subst(json = ef_upart_json(), "\"dense\": 6,", "\"dense\": 16,");
    m = plan(wide);
    assert_non_null(layer(m, "u_d1"));
    assert_null(layer(m, "flat__ucat"));
    assert_int_equal(rw_of(m, "top1"), MD_RW_FOLDED); /* the chain still folds */
    model_def_free(m);
    free(wide);
    free(json);
}

/* fold_compose against W' (fold_weight) times the part weight, summed in
 * double; and the bias form (in = 1). */
static void test_fold_compose(void **s)
{
    (void)s;
    const int M = 4, Ku = 6, D = 5, N = 3, in = 7, cols[] = {4, 1, 5}, n = 3;
    md_weight wu = {.rows = M, .cols = Ku}, wt = {.rows = N, .cols = M * D};
    md_weight wf = {.rows = N, .cols = Ku * D};
    float wq[3 * 5 * 7], bq[3 * 5], got[3 * 9], gotb[3];
    wu.data = malloc(sizeof(float) * M * Ku);
    wt.data = malloc(sizeof(float) * N * M * D);
    uint64_t r = 11;
#define RND() (r = r * 6364136223846793005ULL + 1442695040888963407ULL, \
               (float)((double)(r >> 11) / (double)(1ULL << 53) - 0.5))
    for (int i = 0; i < M * Ku; i++) wu.data[i] = RND();
    for (int i = 0; i < N * M * D; i++) wt.data[i] = RND();
    for (int i = 0; i < n * D * in; i++) wq[i] = RND();
    for (int i = 0; i < n * D; i++) bq[i] = RND();
#undef RND
    assert_int_equal(fold_weight(&wu, &wt, D, &wf), 0);
    for (int i = 0; i < N * 9; i++) got[i] = NAN;
    assert_int_equal(fold_compose(&wu, cols, n, &wt, D, wq, in, N, got + 2, 9), 0);
    assert_int_equal(fold_compose(&wu, cols, n, &wt, D, bq, 1, N, gotb, 1), 0);
    for (int j = 0; j < N; j++) {
        assert_true(isnan(got[j * 9]) && isnan(got[j * 9 + 1])); /* only its columns */
        double wantb = 0;
        for (int k = 0; k < n; k++)
            for (int d = 0; d < D; d++)
                wantb += (double)wf.data[(size_t)j * Ku * D + cols[k] * D + d] * bq[k * D + d];
        if (fabs(gotb[j] - wantb) > 1e-5 * (1 + fabs(wantb)))
            fail_msg("bias[%d] = %g, want %g", j, gotb[j], wantb);
        for (int i = 0; i < in; i++) {
            double want = 0;
            for (int k = 0; k < n; k++)
                for (int d = 0; d < D; d++)
                    want += (double)wf.data[(size_t)j * Ku * D + cols[k] * D + d] * wq[(k * D + d) * in + i];
            if (fabs(got[j * 9 + 2 + i] - want) > 1e-5 * (1 + fabs(want)))
                fail_msg("W_comp[%d, %d] = %g, want %g", j, i, got[j * 9 + 2 + i], want);
        }
    }
    /* Shapes the planner did not make are refused. */
    assert_int_equal(fold_compose(&wu, cols, n, &wt, D, wq, in, N + 1, got, 9), -1);
    free(wu.data);
    free(wt.data);
    free(wf.data);
}

/* fold_compose_wo against its definition summed in double: only the named
 * tokens' columns change; shapes that do not match are refused. */
static void test_fold_compose_wo(void **s)
{
    (void)s;
    enum { N = 3, K = 4, D = 5 };
    md_weight w = {.rows = N, .cols = K * D}, wo = {.rows = D, .cols = D};
    float before[N * K * D];
    w.data = malloc(sizeof before);
    wo.data = malloc(sizeof(float) * D * D);
    uint64_t r = 7;
#define RND() (r = r * 6364136223846793005ULL + 1442695040888963407ULL, \
               (float)((double)(r >> 11) / (double)(1ULL << 53) - 0.5))
    for (int i = 0; i < N * K * D; i++) before[i] = w.data[i] = RND();
    for (int i = 0; i < D * D; i++) wo.data[i] = RND();
#undef RND
    assert_int_equal(fold_compose_wo(&w, D, 1, 2, &wo), 0); /* tokens 1 and 2 */
    for (int j = 0; j < N; j++)
        for (int t = 0; t < K; t++)
            for (int e = 0; e < D; e++) {
                const size_t at = (size_t)j * K * D + t * D + e;
                double want = before[at];
                if (t == 1 || t == 2) {
                    want = 0;
                    for (int d = 0; d < D; d++)
                        want += (double)before[(size_t)j * K * D + t * D + d] * wo.data[d * D + e];
                }
                if (fabs(w.data[at] - want) > 1e-6 * (1 + fabs(want)))
                    fail_msg("w[%d, %d] = %g, want %g", j, t * D + e, w.data[at], want);
            }
    assert_int_equal(fold_compose_wo(&w, D, 3, 2, &wo), -1); /* past the weight */
    wo.cols = D - 1;
    assert_int_equal(fold_compose_wo(&w, D, 0, 1, &wo), -1); /* wo not [D, D] */
    free(w.data);
    free(wo.data);
}

/* One user tensor of the batch in the CPU arena: fp32, 256-byte blocks. */
static size_t user_block(size_t rows, size_t width) { return (rows * width * 4 + 255) / 256 * 256; }

/* The folded model with the composed part scores what the model as
 * written scores; and the concat it reads is built in place (engine.c's
 * plan_in_place): at 3 users of 4 events, the user tensors are the concat
 * [U, 2 tokens of 8 + 6], the history [12, 8], the attention's K|V [12,
 * 16], the user term [U, 8] and u_vec [U, 8]. The other parts' stack (read
 * only through its flatten) and u_d1 write into the concat's rows: a
 * buffer of their own ([U, 16] or [U, 6]) would add a block. */
static void test_scores_match_unfolded_user_part(void **s)
{
    (void)s;
    char dir[256];
    assert_int_equal(ef_write_upart_model("fold_upart", dir, sizeof dir), 0);
    scores_match(dir, user_block(3, 22) + user_block(12, 8) + user_block(12, 16) +
                          2 * user_block(3, 8));
    ef_remove_model(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixture_folds),
        cmocka_unit_test(test_user_side_as_written),
        cmocka_unit_test(test_rule_and_readers),
        cmocka_unit_test(test_fold_weight),
        cmocka_unit_test(test_mlp2_part_plan),
        cmocka_unit_test(test_mlp2_part_refused),
        cmocka_unit_test_setup_teardown(test_scores_match_unfolded, setup, teardown),
        cmocka_unit_test(test_scores_match_unfolded_mlp2),
        cmocka_unit_test(test_user_part_plan),
        cmocka_unit_test(test_fold_compose),
        cmocka_unit_test(test_wo_part_plan),
        cmocka_unit_test(test_fold_compose_wo),
        cmocka_unit_test(test_scores_match_unfolded_user_part),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
