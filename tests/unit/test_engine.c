/* test_engine.c - the forward pass end to end on the CPU backend.
 *
 * Why this exists: the golden test compares scores with PyTorch; this one
 * checks the engine's own promises that no reference can see: IKBO mode never
 * materializes a user tensor at candidate batch size (byte accounting by
 * tag), broadcast mode does and agrees bitwise, scoring is deterministic
 * whatever else is in the batch, and bad batches are refused with messages.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine/ikbo.h"
#include "engine_fixture.h"

/* ---- the every-op model (engine_fixture.h), written to a temp dir ---- */

static uint64_t rng_state;
static double frand(void) /* uniform in [-1, 1) */
{
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(rng_state >> 11) / (double)(1ULL << 53) * 2.0 - 1.0;
}

static char model_dir[256];

/* ---- random batches ---- */

typedef struct hbatch {
    ikbo_batch b;
    float *ud, *cd;
    int64_t *us_ids, *us_off, *cs_ids, *cs_off, *h_ids, *h_off;
    int32_t *h_act, *map;
    ikbo_jagged us, cs;
} hbatch;

/* counts[u] candidates for user u; history lengths vary, some exceed max_len. */
static void make_batch(hbatch *h, int U, const int *counts)
{
    memset(h, 0, sizeof(*h));
    int C = 0;
    for (int u = 0; u < U; u++) C += counts[u];
    h->ud = malloc(sizeof(float) * (size_t)U * 6);
    h->cd = malloc(sizeof(float) * (size_t)C * 3);
    for (int i = 0; i < U * 6; i++) h->ud[i] = (float)frand();
    for (int i = 0; i < C * 3; i++) h->cd[i] = (float)frand();
    h->us_off = malloc(sizeof(int64_t) * (size_t)(U + 1));
    h->us_ids = malloc(sizeof(int64_t) * (size_t)U * 3 + 8);
    h->h_off = malloc(sizeof(int64_t) * (size_t)(U + 1));
    h->h_ids = malloc(sizeof(int64_t) * (size_t)U * 9 + 8);
    h->h_act = malloc(sizeof(int32_t) * (size_t)U * 9 + 8);
    h->us_off[0] = h->h_off[0] = 0;
    for (int u = 0; u < U; u++) {
        int nb = u % 3; /* 0, 1 or 2 ids: empty bags too */
        for (int k = 0; k < nb; k++) h->us_ids[h->us_off[u] + k] = (int64_t)(frand() * 1e12);
        h->us_off[u + 1] = h->us_off[u] + nb;
        int nh = (u * 7) % 10; /* 0..9 events; max_len is 5 */
        for (int k = 0; k < nh; k++) {
            h->h_ids[h->h_off[u] + k] = (int64_t)(frand() * 1000);
            h->h_act[h->h_off[u] + k] = (int32_t)((u + k) % 3);
        }
        h->h_off[u + 1] = h->h_off[u] + nh;
    }
    h->cs_off = malloc(sizeof(int64_t) * (size_t)(C + 1));
    h->cs_ids = malloc(sizeof(int64_t) * (size_t)C * 2 + 8);
    h->map = malloc(sizeof(int32_t) * (size_t)C);
    h->cs_off[0] = 0;
    int c = 0;
    for (int u = 0; u < U; u++)
        for (int k = 0; k < counts[u]; k++, c++) {
            h->map[c] = u;
            int nb = 1 + c % 2;
            for (int j = 0; j < nb; j++) h->cs_ids[h->cs_off[c] + j] = (int64_t)(frand() * 1e6);
            h->cs_off[c + 1] = h->cs_off[c] + nb;
        }
    h->us = (ikbo_jagged){h->us_ids, h->us_off};
    h->cs = (ikbo_jagged){h->cs_ids, h->cs_off};
    h->b = (ikbo_batch){.n_users = U,
                        .n_cands = C,
                        .user_dense = h->ud,
                        .user_sparse = &h->us,
                        .hist = {h->h_ids, h->h_off},
                        .hist_actions = h->h_act,
                        .cand_dense = h->cd,
                        .cand_sparse = &h->cs,
                        .map = h->map};
}

static void free_batch(hbatch *h)
{
    free(h->ud); free(h->cd); free(h->us_ids); free(h->us_off); free(h->cs_ids);
    free(h->cs_off); free(h->h_ids); free(h->h_off); free(h->h_act); free(h->map);
}

static ikbo_model *load(enum ikbo_mode mode)
{
    ikbo_err err = {{0}};
    ikbo_load_opts o = {.device = "cpu", .mode = mode};
    ikbo_model *m = ikbo_model_load(model_dir, &o, &err);
    if (!m) fail_msg("load failed: %s", err.msg);
    return m;
}

static float *score(ikbo_ctx *ctx, const ikbo_batch *b, size_t last[BK_TAG_COUNT])
{
    ikbo_err err = {{0}};
    float *s = malloc(sizeof(float) * (size_t)b->n_cands * 3);
    for (int i = 0; i < b->n_cands * 3; i++) s[i] = NAN; /* poison */
    if (ikbo_score(ctx, b, s, s + (size_t)b->n_cands * 2, &err)) fail_msg("score failed: %s", err.msg);
    for (int i = 0; i < b->n_cands * 3; i++) assert_true(isfinite(s[i]));
    if (last) ikbo_ctx_last_bytes(ctx, last);
    return s;
}

/* Candidate-domain bytes the plan needs at C rows: every candidate tensor's
 * width, plus attention's Q. A user tensor at C would add to this.
 * Stacks in place (engine.c): c_item and c_d1 (8 each) are written into
 * x_cand, their only reader; x_cand (16), read by e_cand and as the
 * attention's query, lives in e_cand's rows; the attention's heads' output
 * (16) is written into e_cand too, with no O buffer: the lce -> flatten ->
 * top1 chain is folded (engine/fold.h) and ta's wo composed into its
 * weight, so the kernel writes there directly. No [C, 3, 8] lce output;
 * top1 is its candidate linear, the sum through the map and the activation
 * (8 each). */
static size_t expected_cand_bytes(int C)
{
    size_t widths[] = {32, 8, 8, 8, 8, 2};
    size_t n = 0;
    for (size_t i = 0; i < sizeof(widths) / sizeof(widths[0]); i++)
        n += (C * widths[i] * 4 + 255) / 256 * 256;
    n += (C * 2 * 8 * 4 + 255) / 256 * 256; /* Q: C*Tq rows of H*dh */
    return n;
}

static void test_ikbo_never_broadcasts(void **state)
{
    (void)state;
    ikbo_model *m = load(IKBO_MODE_IKBO);
    ikbo_err err = {{0}};
    ikbo_ctx *ctx = ikbo_ctx_new(m, &err);
    assert_non_null(ctx);
    int few[] = {300, 400};
    int many[] = {100, 100, 100, 100, 100, 100, 100};
    hbatch a, b;
    make_batch(&a, 2, few);
    make_batch(&b, 7, many);
    size_t la[BK_TAG_COUNT], lb[BK_TAG_COUNT];
    free(score(ctx, &a.b, la));
    free(score(ctx, &b.b, lb));
    assert_int_equal(la[BK_TAG_BROADCAST], 0);
    assert_int_equal(lb[BK_TAG_BROADCAST], 0);
    /* Same C, different U: candidate bytes don't move, and equal the plan. */
    assert_int_equal(la[BK_TAG_CAND], expected_cand_bytes(700));
    assert_int_equal(lb[BK_TAG_CAND], expected_cand_bytes(700));
    assert_true(lb[BK_TAG_USER] > la[BK_TAG_USER]);
    ikbo_stats st;
    ikbo_get_stats(m, &st);
    assert_int_equal(st.bytes_peak[BK_TAG_BROADCAST], 0);
    free_batch(&a);
    free_batch(&b);
    ikbo_ctx_free(ctx);
    ikbo_model_free(m);
}

static void test_broadcast_matches_ikbo(void **state)
{
    (void)state;
    ikbo_model *mi = load(IKBO_MODE_IKBO), *mb = load(IKBO_MODE_BROADCAST);
    ikbo_err err = {{0}};
    ikbo_ctx *ci = ikbo_ctx_new(mi, &err), *cb = ikbo_ctx_new(mb, &err);
    int counts[] = {1, 1000, 3, 0, 17};
    hbatch h;
    make_batch(&h, 5, counts);
    size_t lb[BK_TAG_COUNT];
    float *si = score(ci, &h.b, NULL), *sb = score(cb, &h.b, lb);
    assert_true(lb[BK_TAG_BROADCAST] > 0);
    assert_memory_equal(si, sb, sizeof(float) * (size_t)h.b.n_cands * 3);
    /* What IKBO reports as avoided is what broadcast mode copied (up to the
     * arena's 256-byte rounding of its 5 copies: history, K, V, u_vec and the
     * folded top1's user term; e_user is read at U by the folded user linear). */
    uint64_t av = ikbo_ctx_last_avoided_bytes(ci);
    assert_int_equal(ikbo_ctx_last_avoided_bytes(cb), 0);
    assert_true(av > 0);
    assert_true(lb[BK_TAG_BROADCAST] >= av && lb[BK_TAG_BROADCAST] - av < 5 * 256);
    free(si);
    free(sb);
    free_batch(&h);
    ikbo_ctx_free(ci);
    ikbo_ctx_free(cb);
    ikbo_model_free(mi);
    ikbo_model_free(mb);
}

/* A user's scores do not depend on the other users in the batch. */
static void test_deterministic_across_batches(void **state)
{
    (void)state;
    ikbo_model *m = load(IKBO_MODE_IKBO);
    ikbo_err err = {{0}};
    ikbo_ctx *ctx = ikbo_ctx_new(m, &err);
    int counts[] = {5, 9, 1, 33};
    hbatch all;
    make_batch(&all, 4, counts);
    float *s_all = score(ctx, &all.b, NULL);
    int C = all.b.n_cands;
    /* Re-score user 3 alone by slicing the batch arrays. */
    int c0 = 5 + 9 + 1;
    ikbo_batch one = all.b;
    one.n_users = 1;
    one.n_cands = 33;
    float ud[6];
    memcpy(ud, all.ud + 3 * 6, sizeof(ud));
    one.user_dense = ud;
    int64_t us_off[2] = {0, all.us_off[4] - all.us_off[3]};
    ikbo_jagged us = {all.us_ids + all.us_off[3], us_off};
    one.user_sparse = &us;
    int64_t h_off[2] = {0, all.h_off[4] - all.h_off[3]};
    one.hist = (ikbo_jagged){all.h_ids + all.h_off[3], h_off};
    one.hist_actions = all.h_act + all.h_off[3];
    one.cand_dense = all.cd + (size_t)c0 * 3;
    int64_t cs_off[34];
    for (int i = 0; i <= 33; i++) cs_off[i] = all.cs_off[c0 + i] - all.cs_off[c0];
    ikbo_jagged cs = {all.cs_ids + all.cs_off[c0], cs_off};
    one.cand_sparse = &cs;
    int32_t map[33] = {0};
    one.map = map;
    float *s_one = score(ctx, &one, NULL);
    for (int i = 0; i < 33; i++) {
        assert_memory_equal(&s_one[i * 2], &s_all[(c0 + i) * 2], 2 * sizeof(float));
        assert_memory_equal(&s_one[33 * 2 + i], &s_all[(size_t)C * 2 + c0 + i], sizeof(float));
    }
    free(s_all);
    free(s_one);
    free_batch(&all);
    ikbo_ctx_free(ctx);
    ikbo_model_free(m);
}

static void expect_refused(ikbo_ctx *ctx, const ikbo_batch *b, const char *needle)
{
    ikbo_err err = {{0}};
    float out[4096];
    assert_int_equal(ikbo_score(ctx, b, out, NULL, &err), -1);
    if (!strstr(err.msg, needle)) fail_msg("message '%s' lacks '%s'", err.msg, needle);
}

static void test_bad_batches(void **state)
{
    (void)state;
    ikbo_model *m = load(IKBO_MODE_IKBO);
    ikbo_err err = {{0}};
    ikbo_ctx *ctx = ikbo_ctx_new(m, &err);
    int counts[] = {2, 2};
    hbatch h;
    make_batch(&h, 2, counts);
    ikbo_batch b = h.b;
    h.map[1] = 1;
    h.map[2] = 0;
    expect_refused(ctx, &b, "grouped by user");
    h.map[2] = 5;
    expect_refused(ctx, &b, "map[2] = 5");
    h.map[1] = 0;
    h.map[2] = 1;
    assert_true(h.h_off[2] > 0);
    int32_t saved = h.h_act[0];
    h.h_act[0] = 3;
    expect_refused(ctx, &b, "outside [0, 3)");
    h.h_act[0] = saved;
    b.n_cands = 0;
    expect_refused(ctx, &b, "at least 1");
    b = h.b;
    b.cand_dense = NULL;
    expect_refused(ctx, &b, "candidate dense");
    b = h.b;
    b.map = NULL;
    expect_refused(ctx, &b, "batch: map missing");
    b = h.b;
    b.user_sparse = NULL;
    expect_refused(ctx, &b, "batch: sparse features missing");
    /* Jagged lists (sparse bags, history): each fault names its list. */
    ikbo_jagged bad = h.cs;
    b = h.b;
    b.cand_sparse = &bad;
    bad.offsets = NULL;
    expect_refused(ctx, &b, "candidate sparse 'item': offsets missing");
    int64_t off[5] = {1, 2, 3, 4, 5};
    bad = (ikbo_jagged){h.cs_ids, off};
    expect_refused(ctx, &b, "candidate sparse 'item': offsets[0] = 1, expected 0");
    off[0] = 0;
    off[3] = 1; /* 0 2 3 1 5 */
    expect_refused(ctx, &b, "candidate sparse 'item': offsets decrease at row 2");
    off[3] = 4;
    bad.ids = NULL;
    expect_refused(ctx, &b, "candidate sparse 'item': ids missing");
    off[4] = (int64_t)INT32_MAX + 1;
    bad.ids = h.cs_ids;
    expect_refused(ctx, &b, "candidate sparse 'item': 2147483648 ids exceed the engine's limit");
    b = h.b;
    b.hist.offsets = NULL;
    expect_refused(ctx, &b, "batch: history: offsets missing");
    /* The context still works after refusals. */
    b = h.b;
    free(score(ctx, &b, NULL));
    free_batch(&h);
    ikbo_ctx_free(ctx);
    ikbo_model_free(m);
}

static void test_load_errors(void **state)
{
    (void)state;
    ikbo_err err = {{0}};
    ikbo_load_opts o = {.device = "tpu:0"};
    assert_null(ikbo_model_load(model_dir, &o, &err));
    assert_non_null(strstr(err.msg, "tpu:0"));
    o.device = "cpu";
    assert_null(ikbo_model_load("/nonexistent/model/1", &o, &err));
    assert_non_null(strstr(err.msg, "/nonexistent/model/1"));
    ikbo_serving sv;
    assert_int_equal(ikbo_model_peek_serving(model_dir, &sv, &err), 0);
    assert_int_equal(sv.max_batch_candidates, -1);
    assert_int_equal(sv.instances, -1);
    assert_string_equal(sv.mode, "");
    assert_int_equal(ikbo_model_peek_serving("/nonexistent/model/1", &sv, &err), -1);
    assert_non_null(strstr(err.msg, "/nonexistent/model/1/model.json"));
}

static int setup(void **state)
{
    (void)state;
    assert_int_equal(ef_write_model("engine", model_dir, sizeof model_dir), 0);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    ef_remove_model(model_dir);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ikbo_never_broadcasts),
        cmocka_unit_test(test_broadcast_matches_ikbo),
        cmocka_unit_test(test_deterministic_across_batches),
        cmocka_unit_test(test_bad_batches),
        cmocka_unit_test(test_load_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
