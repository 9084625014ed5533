/* test_accounting.c - IKBO mode copies no user tensor to candidate rows, for
 * every model with mixing ops, sequence models included.
 *
 * Why this exists: test_engine.c proves the byte accounting on one model of
 * the first format's ops; the ranking ops (mul and dot_interaction read user
 * rows through the map) and the reference models need the same promise. For
 * each model - the shipped ones and one written here that mixes domains in
 * every op that may - it scores random batches on the CPU backend and checks:
 *   - IKBO mode allocates no BK_TAG_BROADCAST bytes (last batch and peak);
 *   - user-tagged bytes do not grow with C: the same users with twice the
 *     candidates take exactly the same user bytes (a user tensor at C rows
 *     would double);
 *   - broadcast mode gives bitwise the same scores, and copies what IKBO
 *     mode reports as avoided (up to the arena's 256-byte rounding).
 * An auto-planned model (auto_fixture.h) is held to the same, except that
 * its plan's gathers are the broadcast bytes IKBO mode allocates: exactly
 * the plan's gather bytes per candidate times C, nothing else.
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
#include "engine/model.h"
#include "auto_fixture.h"
#include "loader_fixture.h"

/* Every mixing op with a user operand: mul (both operand orders),
 * dot_interaction with user and candidate tokens interleaved, with and
 * without self, lce, add; plus the single-domain ranking ops around them. */
static const char *MIX_JSON =
    "{\"format\": \"ikbo-model/1\","
    " \"inputs\": {\"user\": {\"dense\": 5, \"sparse\": [\"u\"]},"
    "             \"candidate\": {\"dense\": 3, \"sparse\": [\"c\"]}},"
    " \"tables\": {\"t\": {\"rows\": 40, \"dim\": 8}},"
    " \"layers\": ["
    "  {\"name\": \"ue\", \"op\": \"embedding_bag\", \"input\": \"user.sparse.u\", \"table\": \"t\", \"pooling\": \"sum\"},"
    "  {\"name\": \"ud\", \"op\": \"linear\", \"input\": \"user.dense\", \"out\": 16, \"activation\": \"gelu\"},"
    "  {\"name\": \"ut\", \"op\": \"reshape\", \"input\": \"ud\", \"tokens\": 2},"
    "  {\"name\": \"ce\", \"op\": \"embedding_bag\", \"input\": \"candidate.sparse.c\", \"table\": \"t\", \"pooling\": \"mean\"},"
    "  {\"name\": \"cd\", \"op\": \"linear\", \"input\": \"candidate.dense\", \"out\": 8, \"activation\": \"silu\"},"
    "  {\"name\": \"m1\", \"op\": \"mul\", \"a\": \"ue\", \"b\": \"ce\"},"
    "  {\"name\": \"m2\", \"op\": \"mul\", \"inputs\": [\"cd\", \"ue\"]},"
    "  {\"name\": \"dot\", \"op\": \"dot_interaction\", \"inputs\": [\"ue\", \"m1\", \"ut\", \"cd\"]},"
    "  {\"name\": \"dots\", \"op\": \"dot_interaction\", \"inputs\": [\"ut\", \"ce\", \"ue\"], \"self\": true},"
    "  {\"name\": \"ctok\", \"op\": \"stack\", \"inputs\": [\"ce\", \"m2\"]},"
    "  {\"name\": \"lce\", \"op\": \"lce\", \"user\": \"ut\", \"candidate\": \"ctok\", \"out_tokens\": 2},"
    "  {\"name\": \"lf\", \"op\": \"pool\", \"input\": \"lce\", \"fn\": \"max\"},"
    "  {\"name\": \"x\", \"op\": \"concat\", \"inputs\": [\"dot\", \"dots\", \"lf\"]},"
    "  {\"name\": \"xn\", \"op\": \"layer_norm\", \"input\": \"x\"},"
    "  {\"name\": \"cr\", \"op\": \"cross\", \"x0\": \"xn\", \"input\": \"xn\", \"rank\": 3},"
    "  {\"name\": \"e1\", \"op\": \"linear\", \"input\": \"cr\", \"out\": 8, \"activation\": \"tanh\"},"
    "  {\"name\": \"e2\", \"op\": \"linear\", \"input\": \"cr\", \"out\": 8, \"activation\": \"relu\"},"
    "  {\"name\": \"g\", \"op\": \"linear\", \"input\": \"cr\", \"out\": 2},"
    "  {\"name\": \"mx\", \"op\": \"mixture\", \"experts\": [\"e1\", \"e2\"], \"gate\": \"g\"},"
    "  {\"name\": \"uv\", \"op\": \"linear\", \"input\": \"user.dense\", \"out\": 8},"
    "  {\"name\": \"s\", \"op\": \"add\", \"inputs\": [\"uv\", \"mx\"]},"
    "  {\"name\": \"sa\", \"op\": \"activation\", \"input\": \"s\", \"fn\": \"sigmoid\"},"
    "  {\"name\": \"logits\", \"op\": \"linear\", \"input\": \"sa\", \"out\": 2}"
    " ],"
    " \"output\": {\"logits\": \"logits\", \"tasks\": [\"a\", \"b\"]}}";

/* The sequence ops: a pre-LN block over the history (softmax, causal), an
 * HSTU layer (silu, full), two target_attentions sharing the block's K/V -
 * one fused into its launch (query ready before it), one not - and DIN. */
static const char *SEQ_JSON =
    "{\"format\": \"ikbo-model/1\","
    " \"inputs\": {\"user\": {\"dense\": 4, \"history\": {\"max_len\": 9, \"actions\": 3}},"
    "             \"candidate\": {\"dense\": 3, \"sparse\": [\"c\"]}},"
    " \"tables\": {\"t\": {\"rows\": 50, \"dim\": 8}},"
    " \"layers\": ["
    "  {\"name\": \"ce\", \"op\": \"embedding_bag\", \"input\": \"candidate.sparse.c\", \"table\": \"t\", \"pooling\": \"sum\"},"
    "  {\"name\": \"h\", \"op\": \"history_embedding\", \"input\": \"user.history\", \"table\": \"t\"},"
    "  {\"name\": \"n1\", \"op\": \"layer_norm\", \"input\": \"h\"},"
    "  {\"name\": \"sa\", \"op\": \"self_attention\", \"input\": \"n1\", \"heads\": 2, \"head_dim\": 4},"
    "  {\"name\": \"r1\", \"op\": \"add\", \"inputs\": [\"h\", \"sa\"]},"
    "  {\"name\": \"f1\", \"op\": \"linear\", \"input\": \"r1\", \"out\": 16, \"activation\": \"gelu\"},"
    "  {\"name\": \"f2\", \"op\": \"linear\", \"input\": \"f1\", \"out\": 8},"
    "  {\"name\": \"r2\", \"op\": \"add\", \"inputs\": [\"r1\", \"f2\"]},"
    "  {\"name\": \"hs\", \"op\": \"self_attention\", \"input\": \"r2\", \"heads\": 1, \"head_dim\": 8, \"kind\": \"silu\", \"causal\": false},"
    "  {\"name\": \"last\", \"op\": \"pool\", \"input\": \"hs\", \"fn\": \"last\"},"
    "  {\"name\": \"t1\", \"op\": \"target_attention\", \"query\": \"ce\", \"history\": \"n1\", \"shared_with\": \"sa\"},"
    "  {\"name\": \"cq\", \"op\": \"linear\", \"input\": \"candidate.dense\", \"out\": 16},"
    "  {\"name\": \"cqt\", \"op\": \"reshape\", \"input\": \"cq\", \"tokens\": 2},"
    "  {\"name\": \"t2\", \"op\": \"target_attention\", \"query\": \"cqt\", \"history\": \"n1\", \"shared_with\": \"sa\"},"
    "  {\"name\": \"t2f\", \"op\": \"flatten\", \"input\": \"t2\"},"
    "  {\"name\": \"t1f\", \"op\": \"flatten\", \"input\": \"t1\"},"
    "  {\"name\": \"din\", \"op\": \"din_attention\", \"query\": \"ce\", \"history\": \"h\", \"hidden\": 6, \"activation\": \"sigmoid\"},"
    "  {\"name\": \"x\", \"op\": \"concat\", \"inputs\": [\"t1f\", \"t2f\", \"din\"]},"
    "  {\"name\": \"xc\", \"op\": \"linear\", \"input\": \"x\", \"out\": 8},"
    "  {\"name\": \"s\", \"op\": \"add\", \"inputs\": [\"xc\", \"last\"]},"
    "  {\"name\": \"logits\", \"op\": \"linear\", \"input\": \"s\", \"out\": 1}"
    " ],"
    " \"output\": {\"logits\": \"logits\", \"tasks\": [\"p\"]}}";

/* The shipped models with mixing ops; a missing one fails. */
static const char *const SHIPPED[] = {"models/demo/1", "models/dlrm/1", "models/dcn/1",
                                      "models/mmoe/1", "models/seq/1", "models/hstu/1"};

static char mix_dir[256];

static void write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
}

/* A model json with weights made from its own plan, in mix_dir. */
static void write_mix_model(const char *json)
{
    char path[512];
    bk_err e = {{0}};
    model_def *d = NULL;
    snprintf(mix_dir, sizeof mix_dir, "/tmp/ikbo_test_accounting_%d", (int)getpid());
    mkdir(mix_dir, 0755);
    if (model_def_plan_as_written(mix_dir, json, strlen(json), &d, &e))
        fail_msg("mix model: %s", e.msg);
    size_t n;
    uint8_t *w = fx_weights_for(d, "F32", &n);
    snprintf(path, sizeof path, "%s/model.json", mix_dir);
    write_file(path, json, strlen(json));
    snprintf(path, sizeof path, "%s/weights.safetensors", mix_dir);
    write_file(path, w, n);
    free(w);
    model_def_free(d);
}

static void remove_mix_model(void)
{
    char path[512];
    snprintf(path, sizeof path, "%s/model.json", mix_dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/weights.safetensors", mix_dir);
    unlink(path);
    rmdir(mix_dir);
}

/* ---- random batches for any model (from its info) ---- */

static uint64_t rng = 7;
static double frand(void) /* uniform in [-1, 1) */
{
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(rng >> 11) / (double)(1ULL << 53) * 2.0 - 1.0;
}

typedef struct hjag {
    int64_t *ids, *off;
} hjag;

typedef struct hbatch {
    ikbo_batch b;
    float *ud, *cd;
    hjag *us, *cs, hist;
    ikbo_jagged *jus, *jcs;
    int32_t *acts, *map;
    int nus, ncs;
} hbatch;

/* rows bags of 0..3 ids each (seeded per row from row_seed, so that the
 * same user gets the same bags in every batch). */
static void fill_jag(hjag *j, int rows, uint64_t seed, int maxn)
{
    j->off = malloc(sizeof(int64_t) * (size_t)(rows + 1));
    j->ids = malloc(sizeof(int64_t) * (size_t)rows * (size_t)maxn + 8);
    j->off[0] = 0;
    for (int r = 0; r < rows; r++) {
        rng = seed * 1000003u + (uint64_t)r;
        int n = (int)((frand() + 1) * 0.5 * (maxn + 1));
        if (n > maxn) n = maxn;
        for (int k = 0; k < n; k++) j->ids[j->off[r] + k] = (int64_t)(frand() * 1e9);
        j->off[r + 1] = j->off[r] + n;
    }
}

/* U users (deterministic from their index), counts[u] candidates each. */
static void make_batch(hbatch *h, const ikbo_model_info *in, int U, const int *counts)
{
    memset(h, 0, sizeof *h);
    int C = 0;
    for (int u = 0; u < U; u++) C += counts[u];
    h->ud = malloc(sizeof(float) * ((size_t)U * in->user_dense + 1));
    rng = 99;
    for (int i = 0; i < U * in->user_dense; i++) h->ud[i] = (float)frand();
    h->cd = malloc(sizeof(float) * ((size_t)C * in->cand_dense + 1));
    for (int i = 0; i < C * in->cand_dense; i++) h->cd[i] = (float)frand();
    h->nus = in->n_user_sparse;
    h->ncs = in->n_cand_sparse;
    h->us = calloc((size_t)h->nus + 1, sizeof *h->us);
    h->jus = calloc((size_t)h->nus + 1, sizeof *h->jus);
    h->cs = calloc((size_t)h->ncs + 1, sizeof *h->cs);
    h->jcs = calloc((size_t)h->ncs + 1, sizeof *h->jcs);
    for (int f = 0; f < h->nus; f++) {
        fill_jag(&h->us[f], U, 10 + (uint64_t)f, 3);
        h->jus[f] = (ikbo_jagged){h->us[f].ids, h->us[f].off};
    }
    for (int f = 0; f < h->ncs; f++) {
        fill_jag(&h->cs[f], C, 50 + (uint64_t)f, 3);
        h->jcs[f] = (ikbo_jagged){h->cs[f].ids, h->cs[f].off};
    }
    if (in->has_history) {
        fill_jag(&h->hist, U, 77, in->hist_max_len + 3);
        int64_t ne = h->hist.off[U];
        h->acts = malloc(sizeof(int32_t) * (size_t)ne + 4);
        for (int64_t e = 0; e < ne; e++) h->acts[e] = (int32_t)(e % in->hist_actions);
    }
    h->map = malloc(sizeof(int32_t) * (size_t)C);
    for (int u = 0, c = 0; u < U; u++)
        for (int k = 0; k < counts[u]; k++) h->map[c++] = u;
    h->b = (ikbo_batch){.n_users = U, .n_cands = C, .user_dense = h->ud,
                        .user_sparse = h->jus, .hist = {h->hist.ids, h->hist.off},
                        .hist_actions = h->acts, .cand_dense = h->cd,
                        .cand_sparse = h->jcs, .map = h->map};
}

static void free_batch(hbatch *h)
{
    for (int f = 0; f < h->nus; f++) { free(h->us[f].ids); free(h->us[f].off); }
    for (int f = 0; f < h->ncs; f++) { free(h->cs[f].ids); free(h->cs[f].off); }
    free(h->us); free(h->cs); free(h->jus); free(h->jcs);
    free(h->hist.ids); free(h->hist.off); free(h->acts); free(h->map);
    free(h->ud); free(h->cd);
}

static ikbo_model *load(const char *dir, enum ikbo_mode mode)
{
    ikbo_err err = {{0}};
    ikbo_load_opts o = {.device = "cpu", .mode = mode};
    ikbo_model *m = ikbo_model_load(dir, &o, &err);
    if (!m) fail_msg("%s: load failed: %s", dir, err.msg);
    return m;
}

static float *score(ikbo_ctx *ctx, const hbatch *h, size_t last[BK_TAG_COUNT])
{
    ikbo_err err = {{0}};
    size_t n = (size_t)h->b.n_cands;
    float *s = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) s[i] = NAN; /* poison */
    if (ikbo_score(ctx, &h->b, NULL, s, &err)) fail_msg("score failed: %s", err.msg);
    for (size_t i = 0; i < n; i++) assert_true(isfinite(s[i]));
    ikbo_ctx_last_bytes(ctx, last);
    return s;
}

/* The three checks of the file comment, on one model directory. */
static void check_model(const char *dir)
{
    ikbo_model *mi = load(dir, IKBO_MODE_IKBO), *mb = load(dir, IKBO_MODE_BROADCAST);
    ikbo_err err = {{0}};
    ikbo_ctx *ci = ikbo_ctx_new(mi, &err), *cb = ikbo_ctx_new(mb, &err);
    assert_non_null(ci);
    assert_non_null(cb);
    const ikbo_model_info *in = ikbo_model_get_info(mi);
    int c1[] = {3, 1, 250, 40}, c2[] = {6, 2, 500, 80};
    hbatch a, b;
    make_batch(&a, in, 4, c1);
    make_batch(&b, in, 4, c2); /* the same users, twice the candidates */
    size_t la[BK_TAG_COUNT], lb[BK_TAG_COUNT], lbc[BK_TAG_COUNT];
    free(score(ci, &a, la));
    float *si = score(ci, &b, lb);
    uint64_t av = ikbo_ctx_last_avoided_bytes(ci);
    ikbo_plan_summary ps;
    ikbo_model_plan_summary(mi, 1, &ps);
    size_t gather = (size_t)ps.gather_bytes * (size_t)b.b.n_cands; /* fp32 on the CPU */
    if (lb[BK_TAG_BROADCAST] < gather || lb[BK_TAG_BROADCAST] - gather >= 256 * (size_t)ps.gathers +
                                                                              (gather ? 0 : 1))
        fail_msg("%s: IKBO mode allocated %zu broadcast bytes; the plan's %d gathers are %zu", dir,
                 lb[BK_TAG_BROADCAST], ps.gathers, gather);
    if (la[BK_TAG_USER] != lb[BK_TAG_USER])
        fail_msg("%s: user bytes grew with C (%zu -> %zu): a user tensor at candidate rows", dir,
                 la[BK_TAG_USER], lb[BK_TAG_USER]);
    assert_true(lb[BK_TAG_CAND] > la[BK_TAG_CAND]);
    ikbo_stats st;
    ikbo_get_stats(mi, &st);
    if (ps.gathers == 0) assert_int_equal(st.bytes_peak[BK_TAG_BROADCAST], 0);

    float *sb = score(cb, &b, lbc);
    if (memcmp(si, sb, sizeof(float) * (size_t)b.b.n_cands) != 0)
        fail_msg("%s: broadcast mode scores differ from IKBO mode", dir);
    assert_int_equal(ikbo_ctx_last_avoided_bytes(cb), 0);
    if (av > 0 && !(lbc[BK_TAG_BROADCAST] >= av + gather &&
                    lbc[BK_TAG_BROADCAST] - av - gather < 16 * 256))
        fail_msg("%s: broadcast copied %zu bytes, IKBO reports %llu avoided", dir,
                 lbc[BK_TAG_BROADCAST], (unsigned long long)av);
    free(si);
    free(sb);
    free_batch(&a);
    free_batch(&b);
    ikbo_ctx_free(ci);
    ikbo_ctx_free(cb);
    ikbo_model_free(mi);
    ikbo_model_free(mb);
}

static void test_mixing_ops_model(void **state)
{
    (void)state;
    write_mix_model(MIX_JSON);
    check_model(mix_dir);
    /* This model mixes in every op that may: broadcast mode copies something. */
    ikbo_model *mb = load(mix_dir, IKBO_MODE_BROADCAST);
    ikbo_stats st;
    ikbo_err err = {{0}};
    ikbo_ctx *cb = ikbo_ctx_new(mb, &err);
    const ikbo_model_info *in = ikbo_model_get_info(mb);
    int c[] = {2, 5};
    hbatch h;
    make_batch(&h, in, 2, c);
    size_t l[BK_TAG_COUNT];
    free(score(cb, &h, l));
    ikbo_get_stats(mb, &st);
    assert_true(st.bytes_peak[BK_TAG_BROADCAST] > 0);
    free_batch(&h);
    ikbo_ctx_free(cb);
    ikbo_model_free(mb);
    remove_mix_model();
}

static void test_sequence_model(void **state)
{
    (void)state;
    write_mix_model(SEQ_JSON);
    check_model(mix_dir);
    remove_mix_model();
}

/* Every rewrite and two gathers (auto_fixture.h). */
static void test_auto_model(void **state)
{
    (void)state;
    write_mix_model(AUTO_JSON);
    check_model(mix_dir);
    remove_mix_model();
}

static void test_shipped_models(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof SHIPPED / sizeof SHIPPED[0]; i++) {
        struct stat sbuf;
        if (stat(SHIPPED[i], &sbuf) != 0) fail_msg("%s: missing (run from the repository root)", SHIPPED[i]);
        check_model(SHIPPED[i]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mixing_ops_model),
        cmocka_unit_test(test_sequence_model),
        cmocka_unit_test(test_auto_model),
        cmocka_unit_test(test_shipped_models),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
