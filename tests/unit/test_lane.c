/* test_lane.c - the user lane's plan (engine/lane.h): which layers run on
 * the lane, and where the stream waits for it.
 *
 * Why this exists: a layer put on the lane that reads the stream's work,
 * or a layer on the stream that reads lane work without a wait, is a race
 * on the GPU that the CPU backend (one stream) can never show, and that a
 * GPU run shows only sometimes. So the plan is checked here against the
 * rule written out layer by layer on the engine fixture (hand-derived
 * expectations), against the rule's invariants on every layer of the
 * fixture's folded and mlp2 variants, and with a fused self_attention's
 * layer, whose launch reads the stream, forcing its readers off the lane.
 * The engine's side of the lane (which stream each layer and bag goes to,
 * the waits) also runs on the CPU, whose lane executes in call order: there
 * its scores must equal one stream's bit for bit, so a layer or bag the
 * lane path drops or misroutes shows here. The bit-identity on the GPU,
 * where the lane overlaps, is tests/gpu/test_cuda_model.c's check_lane.
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

#include "engine/ikbo.h"
#include "engine/lane.h"
#include "engine/model.h"
#include "engine/op.h"
#include "engine_fixture.h"

static int layer(const model_def *d, const char *name)
{
    for (int i = 0; i < d->n_layers; i++)
        if (!strcmp(d->layers[i].name, name)) return i;
    fail_msg("no layer %s", name);
    return -1;
}

static model_def *load(const char *tag, const char *json, const ef_tensor *t, size_t nt,
                       unsigned flags, char *dir, size_t dn)
{
    assert_int_equal(ef_write_model_as(tag, json, t, nt, dir, dn), 0);
    model_def *d = NULL;
    bk_err e = {{0}};
    if (model_def_load_opts(dir, flags, &d, &e)) fail_msg("load: %s", e.msg);
    return d;
}

static int *no_fuse(const model_def *d)
{
    int *f = malloc(((size_t)d->n_layers + 1) * sizeof(int));
    assert_non_null(f);
    for (int i = 0; i < d->n_layers; i++) f[i] = -1;
    return f;
}

/* The rule's invariants on every layer (lane.h). */
static void check_invariants(const model_def *d, const unsigned char *m, const int *fuse)
{
    for (int li = 0; li < d->n_layers; li++) {
        const md_layer *l = &d->layers[li];
        int on_lane = 0, on_stream = 0;
        for (int k = 0; k < l->n_in; k++)
            if (l->in[k].src == MD_SRC_LAYER) {
                on_lane |= m[l->in[k].index] == LANE_RUN;
                on_stream |= m[l->in[k].index] != LANE_RUN;
            }
        switch (m[li]) {
        case LANE_RUN:
            if (l->domain != MD_USER || on_stream || fuse[li] >= 0 || li == d->logits_layer)
                fail_msg("%s on the lane: domain %d, reads the stream %d, fused %d", l->name,
                         (int)l->domain, on_stream, fuse[li]);
            break;
        case LANE_MAIN:
            if (on_lane) fail_msg("%s reads lane work without a wait", l->name);
            break;
        case LANE_SPLIT:
            if (!(md_ops[l->op]->flags & OP_LANE_SPLIT) || fuse[li] >= 0 ||
                (l->in[0].src == MD_SRC_LAYER && m[l->in[0].index] == LANE_RUN))
                fail_msg("%s split where it may not be", l->name);
            break;
        case LANE_JOIN:
            if (!on_lane) fail_msg("%s waits for the lane and reads none of it", l->name);
            break;
        default: fail_msg("%s: mode %d", l->name, m[li]);
        }
    }
}

/* The fixture unfolded, layer by layer from the rule. */
static void test_fixture_modes(void **state)
{
    (void)state;
    char dir[256];
    model_def *d = load("lane_fix", EF_MODEL_JSON, EF_TENSORS, EF_N_TENSORS, MD_LOAD_NO_FOLD, dir,
                        sizeof dir);
    int *fuse = no_fuse(d);
    unsigned char *m = lane_plan(d, fuse);
    assert_non_null(m);
    static const struct {
        const char *name;
        int mode;
    } want[] = {{"u_country", LANE_RUN}, {"u_d1", LANE_RUN},  {"u_d", LANE_RUN},
                {"hist", LANE_RUN},      {"hist_mean", LANE_RUN}, {"e_user", LANE_RUN},
                {"c_item", LANE_MAIN},   {"c_d1", LANE_MAIN}, {"x_cand", LANE_MAIN},
                {"ta", LANE_SPLIT},      {"e_cand", LANE_MAIN}, {"lce", LANE_JOIN},
                {"flat", LANE_MAIN},     {"top1", LANE_MAIN}, {"u_vec", LANE_RUN},
                {"mix", LANE_JOIN},      {"logits", LANE_MAIN}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (m[layer(d, want[i].name)] != want[i].mode)
            fail_msg("%s: mode %d, want %d", want[i].name, m[layer(d, want[i].name)], want[i].mode);
    assert_int_equal(lane_count(d, m), 7);
    check_invariants(d, m, fuse);
    free(m);
    free(fuse);
    model_def_free(d);
    ef_remove_model(dir);
}

/* The fixture as written and folded with its mlp2 and composed-user-part
 * variants, each model named prefix + its tag; free the JSON with
 * variants_free. */
typedef struct variant {
    char tag[32];
    const char *json;
    const ef_tensor *t;
    size_t n;
} variant;
typedef struct variants {
    ef_tensor t2[EF_N_TENSORS + 2];
    char *mj, *uj;
    variant v[3];
} variants;

static void variants_make(variants *vs, const char *prefix)
{
    size_t n2 = ef_mlp2_tensors(vs->t2);
    vs->mj = ef_mlp2_json(), vs->uj = ef_upart_json();
    assert_non_null(vs->mj);
    assert_non_null(vs->uj);
    const variant v[3] = {{"fold", EF_MODEL_JSON, EF_TENSORS, EF_N_TENSORS},
                          {"mlp2", vs->mj, vs->t2, n2},
                          {"upart", vs->uj, EF_TENSORS, EF_N_TENSORS}};
    for (int i = 0; i < 3; i++) {
        vs->v[i] = v[i];
        snprintf(vs->v[i].tag, sizeof vs->v[i].tag, "%.16s%.8s", prefix, v[i].tag);
    }
}

static void variants_free(variants *vs)
{
    free(vs->mj);
    free(vs->uj);
}

/* The folded fixture and its mlp2 and composed-user-part variants: the
 * rewritten layers obey the rule, the user term runs on the lane and the
 * candidate term that adds it waits. */
static void test_folded_variants(void **state)
{
    (void)state;
    variants vs;
    variants_make(&vs, "lane_");
    const variant *v = vs.v;
    for (size_t i = 0; i < 3; i++) {
        char dir[256];
        model_def *d = load(v[i].tag, v[i].json, v[i].t, v[i].n, 0, dir, sizeof dir);
        int *fuse = no_fuse(d);
        unsigned char *m = lane_plan(d, fuse);
        assert_non_null(m);
        check_invariants(d, m, fuse);
        int run = 0, join = 0, user_cand = 0;
        for (int li = 0; li < d->n_layers; li++) {
            run += m[li] == LANE_RUN;
            join += m[li] == LANE_JOIN;
            for (int k = 0; k < d->layers[li].n_in; k++) {
                md_ref r = d->layers[li].in[k];
                user_cand |= d->layers[li].domain == MD_CAND && r.src == MD_SRC_LAYER &&
                             d->layers[r.index].domain == MD_USER;
            }
        }
        if (!run || !join || !user_cand)
            fail_msg("%s: %d on the lane, %d waits, a candidate layer reading the user side %d",
                     v[i].tag, run, join, user_cand);
        assert_int_equal(m[layer(d, "ta")], LANE_SPLIT);
        free(m);
        free(fuse);
        model_def_free(d);
        ef_remove_model(dir);
    }
    variants_free(&vs);
}

/* A layer fused into a launch that reads the candidate side (a shared
 * self_attention) stays on the stream; user layers reading it do too, and
 * the first to read both sides waits for the lane. */
static void test_fused_layer(void **state)
{
    (void)state;
    char dir[256];
    model_def *d = load("lane_fuse", EF_MODEL_JSON, EF_TENSORS, EF_N_TENSORS, MD_LOAD_NO_FOLD,
                        dir, sizeof dir);
    int *fuse = no_fuse(d);
    fuse[layer(d, "u_d1")] = layer(d, "ta");
    unsigned char *m = lane_plan(d, fuse);
    assert_non_null(m);
    assert_int_equal(m[layer(d, "u_d1")], LANE_MAIN); /* reads only request inputs */
    assert_int_equal(m[layer(d, "u_d")], LANE_MAIN);  /* reads the stream's u_d1 */
    assert_int_equal(m[layer(d, "hist_mean")], LANE_RUN);
    assert_int_equal(m[layer(d, "e_user")], LANE_JOIN); /* both sides */
    check_invariants(d, m, fuse);
    free(m);
    free(fuse);
    model_def_free(d);
    ef_remove_model(dir);
}

/* The fixture's scores (task scores, then scores) on the CPU, with or
 * without the lane, for one batch of 3 users and 40 candidates. */
static float *score(const char *dir, int no_lane)
{
    enum { U = 3, C = 40 };
    float ud[U * 6], cd[C * 3];
    int64_t us_ids[U], us_off[U + 1], cs_ids[C], cs_off[C + 1], h_ids[U * 4], h_off[U + 1];
    int32_t h_act[U * 4], map[C];
    for (int i = 0; i < U * 6; i++) ud[i] = (float)((i * 37) % 11) / 11 - 0.5f;
    for (int i = 0; i < C * 3; i++) cd[i] = (float)((i * 53) % 13) / 13 - 0.5f;
    for (int u = 0; u <= U; u++) us_off[u] = u, h_off[u] = 4 * u;
    for (int u = 0; u < U; u++) us_ids[u] = u + 1;
    for (int i = 0; i < U * 4; i++) h_ids[i] = 3 * i + 1, h_act[i] = i % 3;
    for (int c = 0; c <= C; c++) cs_off[c] = c;
    for (int c = 0; c < C; c++) cs_ids[c] = 7 * c + 2, map[c] = c * U / C;
    ikbo_jagged us = {us_ids, us_off}, cs = {cs_ids, cs_off};
    ikbo_batch b = {.n_users = U, .n_cands = C, .user_dense = ud, .user_sparse = &us,
                    .hist = {h_ids, h_off}, .hist_actions = h_act, .cand_dense = cd,
                    .cand_sparse = &cs, .map = map};
    ikbo_err err = {{0}};
    ikbo_load_opts o = {.device = "cpu", .mode = IKBO_MODE_IKBO, .no_lane = no_lane};
    ikbo_model *m = ikbo_model_load(dir, &o, &err);
    ikbo_ctx *ctx = m ? ikbo_ctx_new(m, &err) : NULL;
    if (!ctx) fail_msg("load: %s", err.msg);
    float *out = malloc(sizeof(float) * C * 3);
    assert_non_null(out);
    for (int i = 0; i < C * 3; i++) out[i] = NAN;
    if (ikbo_score(ctx, &b, out, out + C * 2, &err)) fail_msg("score: %s", err.msg);
    ikbo_ctx_free(ctx);
    ikbo_model_free(m);
    return out;
}

/* On the CPU the lane path scores what one stream does, to the bit, on the
 * fixture as written and folded with its variants. */
static void test_cpu_scores(void **state)
{
    (void)state;
    variants vs;
    variants_make(&vs, "lane_s_");
    const variant *v = vs.v;
    for (size_t i = 0; i < 3; i++) {
        char dir[256];
        assert_int_equal(ef_write_model_as(v[i].tag, v[i].json, v[i].t, v[i].n, dir, sizeof dir), 0);
        float *a = score(dir, 0), *b = score(dir, 1);
        for (int k = 0; k < 40 * 3; k++)
            if (isnan(a[k]) || memcmp(&a[k], &b[k], sizeof(float)))
                fail_msg("%s: value %d: %g with the lane, %g on one stream", v[i].tag, k, a[k], b[k]);
        free(a);
        free(b);
        ef_remove_model(dir);
    }
    variants_free(&vs);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixture_modes),
        cmocka_unit_test(test_folded_variants),
        cmocka_unit_test(test_fused_layer),
        cmocka_unit_test(test_cpu_scores),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
