/* test_planner.c - shape and batch-domain inference of the model planner.
 *
 * Small models share one input/table header; each test lists layers and
 * checks the inferred domain/kind/shape per op, the weights each op expects
 * and its fields (act, eps, self, rank, pooling), that bad keys, values and
 * shapes are refused with a message naming the layer, and that every domain
 * mix outside lce/target_attention/add/mul/dot_interaction is refused.
 * Accepted plans are also loaded end to end with weights generated from the
 * plan (model_def_parse must agree), and both pass fx_check_model. The op
 * table itself (engine/op.h md_ops[]) is checked last. Expected shapes come
 * from shared/MODEL_FORMAT.md and the briefs' semantics, worked by hand.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/model.h"
#include "engine/op.h"
#include "tests/unit/loader_fixture.h"

#define DIR "m/1"

/* user: dense 8, sparse u, history; candidate: dense 4, sparse c, c2.
 * tables t (dim 8), t16 (dim 16). */
#define HEAD                                                                                   \
    "{\"format\":\"ikbo-model/1\",\"inputs\":{\"user\":{\"dense\":8,\"sparse\":[\"u\"],"      \
    "\"history\":{\"max_len\":16,\"actions\":2}},\"candidate\":{\"dense\":4,\"sparse\":[\"c\"," \
    "\"c2\"]}},\"tables\":{\"t\":{\"rows\":10,\"dim\":8},\"t16\":{\"rows\":10,\"dim\":16}},"     \
    "\"layers\":["
/* Every model ends in a candidate logits layer so that it plans. */
#define TAIL                                                                                   \
    ",{\"name\":\"zz\",\"op\":\"linear\",\"input\":\"candidate.dense\",\"out\":1}],"           \
    "\"output\":{\"logits\":\"zz\",\"tasks\":[\"p\"]}}"

/* Layer snippets reused below. */
#define L_UE "{\"name\":\"ue\",\"op\":\"embedding_bag\",\"input\":\"user.sparse.u\",\"table\":\"t\",\"pooling\":\"sum\"}"
#define L_UE16 "{\"name\":\"ue16\",\"op\":\"embedding_bag\",\"input\":\"user.sparse.u\",\"table\":\"t16\",\"pooling\":\"mean\"}"
#define L_CE "{\"name\":\"ce\",\"op\":\"embedding_bag\",\"input\":\"candidate.sparse.c\",\"table\":\"t\",\"pooling\":\"sum\"}"
#define L_CE2 "{\"name\":\"ce2\",\"op\":\"embedding_bag\",\"input\":\"candidate.sparse.c2\",\"table\":\"t\",\"pooling\":\"mean\"}"
#define L_H "{\"name\":\"h\",\"op\":\"history_embedding\",\"input\":\"user.history\",\"table\":\"t\"}"
#define L_H16 "{\"name\":\"h16\",\"op\":\"history_embedding\",\"input\":\"user.history\",\"table\":\"t16\"}"
#define L_HM "{\"name\":\"hm\",\"op\":\"mean_pool\",\"input\":\"h\"}"
/* user tokens [4, 8] and candidate tokens [2, 8] */
#define L_UT "{\"name\":\"ud\",\"op\":\"linear\",\"input\":\"user.dense\",\"out\":32,\"activation\":\"relu\"}," \
             "{\"name\":\"ut\",\"op\":\"reshape\",\"input\":\"ud\",\"tokens\":4}"
#define L_CT "{\"name\":\"cd\",\"op\":\"linear\",\"input\":\"candidate.dense\",\"out\":16,\"activation\":\"sigmoid\"}," \
             "{\"name\":\"ct\",\"op\":\"reshape\",\"input\":\"cd\",\"tokens\":2}"

static char *model(const char *layers)
{
    size_t n = strlen(HEAD) + strlen(layers) + strlen(TAIL) + 1;
    char *j = malloc(n);
    assert_non_null(j);
    snprintf(j, n, "%s%s%s", HEAD, layers, TAIL);
    return j;
}

/* Plans, checks consistency, and loads with weights made from the plan. */
static model_def *plan_ok(const char *layers)
{
    char *j = model(layers);
    bk_err e = {{0}};
    model_def *m = NULL, *full = NULL;
    char why[256];
    if (model_def_plan(DIR, j, strlen(j), &m, &e))
        fail_msg("plan refused: %s\nlayers: %s", e.msg, layers);
    if (fx_check_model(m, 0, why, sizeof why))
        fail_msg("inconsistent plan: %s", why);
    size_t n;
    uint8_t *w = fx_weights_for(m, "BF16", &n);
    if (model_def_parse(DIR, j, strlen(j), w, n, &full, &e))
        fail_msg("full load refused: %s", e.msg);
    if (fx_check_model(full, 1, why, sizeof why))
        fail_msg("inconsistent model: %s", why);
    model_def_free(full);
    free(w);
    free(j);
    return m;
}

/* Plans `layers`, which must be refused with a one-line message that
 * starts with the model path and holds each string of want[] (NULL-ended). */
static void plan_err_list(const char *layers, const char *const *want)
{
    char *j = model(layers);
    bk_err e = {{0}};
    model_def *m = NULL;
    if (model_def_plan(DIR, j, strlen(j), &m, &e) == 0) {
        model_def_free(m);
        fail_msg("plan accepted but should be refused: %s", layers);
    }
    assert_null(m);
    if (strncmp(e.msg, DIR "/model.json: ", strlen(DIR "/model.json: ")) != 0 ||
        strchr(e.msg, '\n'))
        fail_msg("bad message form: %s", e.msg);
    for (const char *const *s = want; *s; s++)
        if (!strstr(e.msg, *s))
            fail_msg("message lacks \"%s\": %s", *s, e.msg);
    free(j);
}
#define plan_err(layers, ...) plan_err_list((layers), (const char *const[]){__VA_ARGS__, NULL})

/* One refused layer 'x': the layers before it ("" for none), its keys after
 * "name" and "op" (each with its leading comma), and what the message must
 * hold (as plan_err's strings). */
struct bad_x {
    const char *before;
    const char *keys;
    const char *want[8];
};

static char *fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));

/* Each case: `before`,{"name":"x","op":"<op>"<keys>} is refused by plan_err_list. */
static void refuse_x(const char *op, const struct bad_x *c, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char *ls = fmt("%s%s{\"name\":\"x\",\"op\":\"%s\"%s}", c[i].before,
                       c[i].before[0] ? "," : "", op, c[i].keys);
        assert_null(c[i].want[7]); /* want[] ends in NULL */
        plan_err_list(ls, c[i].want);
        free(ls);
    }
}
#define REFUSE_X(op, cases) refuse_x((op), (cases), sizeof(cases) / sizeof((cases)[0]))

static const md_layer *L(const model_def *m, const char *name)
{
    for (int i = 0; i < m->n_layers; i++)
        if (strcmp(m->layers[i].name, name) == 0)
            return &m->layers[i];
    fail_msg("no layer %s", name);
    return NULL;
}

static void shape_is(const model_def *m, const char *name, enum md_domain dom, enum md_kind kind,
                     int tokens, int dim)
{
    const md_layer *l = L(m, name);
    if (l->domain != dom || l->kind != kind || l->tokens != tokens || l->dim != dim)
        fail_msg("%s: domain %d kind %d [%d, %d], expected domain %d kind %d [%d, %d]", name,
                 l->domain, l->kind, l->tokens, l->dim, dom, kind, tokens, dim);
}

static void weight_is(const model_def *m, const char *layer, int k, const char *name, int rows,
                      int cols)
{
    const md_layer *l = L(m, layer);
    assert_true(k < l->n_w);
    if (strcmp(l->w[k].name, name) || l->w[k].rows != rows || l->w[k].cols != cols)
        fail_msg("%s.w[%d] = %s [%d, %d], expected %s [%d, %d]", layer, k, l->w[k].name,
                 l->w[k].rows, l->w[k].cols, name, rows, cols);
}

/* --------------------------------------------------------------- domains */

static void test_user_chain_stays_user(void **state)
{
    (void)state;
    model_def *m = plan_ok(
        L_UE "," L_UT "," L_H "," L_HM ","
        "{\"name\":\"s\",\"op\":\"stack\",\"inputs\":[\"ue\",\"ut\",\"hm\",\"user.dense\"]},"
        "{\"name\":\"f\",\"op\":\"flatten\",\"input\":\"s\"},"
        "{\"name\":\"l\",\"op\":\"linear\",\"input\":\"f\",\"out\":5},"
        "{\"name\":\"a\",\"op\":\"add\",\"inputs\":[\"l\",\"l\"]}");
    shape_is(m, "ue", MD_USER, MD_VEC, 1, 8);
    shape_is(m, "ud", MD_USER, MD_VEC, 1, 32);
    shape_is(m, "ut", MD_USER, MD_TOKENS, 4, 8);
    shape_is(m, "h", MD_USER, MD_JAGGED, 1, 8);
    shape_is(m, "hm", MD_USER, MD_VEC, 1, 8);
    shape_is(m, "s", MD_USER, MD_TOKENS, 7, 8); /* 1 + 4 + 1 + 1 (user.dense is [8]) */
    shape_is(m, "f", MD_USER, MD_VEC, 1, 56);
    shape_is(m, "l", MD_USER, MD_VEC, 1, 5);
    shape_is(m, "a", MD_USER, MD_VEC, 1, 5);
    const md_layer *s = L(m, "s");
    assert_int_equal(s->n_in, 4);
    assert_int_equal(s->in[3].src, MD_SRC_USER_DENSE);
    weight_is(m, "ud", 0, "ud.weight", 32, 8);
    weight_is(m, "ud", 1, "ud.bias", 1, 32);
    weight_is(m, "h", 0, "h.action", 2, 8);
    weight_is(m, "h", 1, "h.position", 16, 8);
    weight_is(m, "l", 0, "l.weight", 5, 56);
    assert_int_equal(L(m, "ue")->n_w, 0);
    assert_int_equal(L(m, "a")->n_w, 0);
    assert_int_equal(L(m, "l")->act, BK_ACT_NONE);
    assert_int_equal(L(m, "ud")->act, BK_ACT_RELU);
    model_def_free(m);
}

static void test_candidate_chain(void **state)
{
    (void)state;
    model_def *m = plan_ok(
        L_CE "," L_CE2 "," L_CT ","
        "{\"name\":\"s\",\"op\":\"stack\",\"inputs\":[\"ce\",\"ct\",\"ce2\"]},"
        "{\"name\":\"f\",\"op\":\"flatten\",\"input\":\"s\"},"
        "{\"name\":\"o\",\"op\":\"linear\",\"input\":\"f\",\"out\":3,\"activation\":\"sigmoid\"}");
    shape_is(m, "ce", MD_CAND, MD_VEC, 1, 8);
    shape_is(m, "ct", MD_CAND, MD_TOKENS, 2, 8);
    shape_is(m, "s", MD_CAND, MD_TOKENS, 4, 8);
    shape_is(m, "f", MD_CAND, MD_VEC, 1, 32);
    shape_is(m, "o", MD_CAND, MD_VEC, 1, 3);
    assert_int_equal(L(m, "ce2")->in[0].src, MD_SRC_CAND_SPARSE);
    assert_int_equal(L(m, "ce2")->in[0].index, 1);
    assert_int_equal(L(m, "ce2")->pooling, BK_POOL_MEAN);
    assert_int_equal(L(m, "cd")->act, BK_ACT_SIGMOID);
    model_def_free(m);
}

static void test_refused_mixes(void **state)
{
    (void)state;
    const char *msg = "cannot mix user and candidate inputs; only lce, target_attention, din_attention, "
                      "add, mul and dot_interaction read user rows through the map";
    plan_err(L_UE "," L_CE ",{\"name\":\"s\",\"op\":\"stack\",\"inputs\":[\"ue\",\"ce\"]}",
             "layer 's': op 'stack'", msg);
    plan_err(L_UE "," L_CE ",{\"name\":\"s\",\"op\":\"stack\",\"inputs\":[\"ce\",\"user.dense\"]}",
             "layer 's': op 'stack'", msg);
    plan_err(L_CE ",{\"name\":\"s\",\"op\":\"stack\",\"inputs\":[\"ce\",\"ce\",\"user.dense\"]}",
             "layer 's': op 'stack'", msg);
    /* Single-input ops cannot be given two inputs at all. */
    plan_err(L_UE "," L_CE ",{\"name\":\"x\",\"op\":\"linear\",\"inputs\":[\"ue\",\"ce\"],\"out\":2}",
             "layer 'x': unknown key 'layers[2].inputs'");
    plan_err(L_UE "," L_CE ",{\"name\":\"x\",\"op\":\"flatten\",\"input\":\"ue\",\"inputs\":[\"ce\"]}",
             "layer 'x': unknown key 'layers[2].inputs'");
    plan_err(L_UE "," L_CE ",{\"name\":\"x\",\"op\":\"mean_pool\",\"inputs\":[\"ue\",\"ce\"]}",
             "layer 'x': unknown key 'layers[2].inputs'");
    plan_err(L_UE "," L_CE ",{\"name\":\"x\",\"op\":\"reshape\",\"inputs\":[\"ue\",\"ce\"],\"tokens\":1}",
             "layer 'x': unknown key 'layers[2].inputs'");
    /* logits must be candidate-domain */
    char *j = malloc(4096);
    assert_non_null(j);
    snprintf(j, 4096, HEAD L_UE "],\"output\":{\"logits\":\"ue\",\"tasks\":[\"a\",\"b\",\"c\","
                      "\"d\",\"e\",\"f\",\"g\",\"h\"]}}");
    bk_err e = {{0}};
    model_def *m = NULL;
    assert_int_equal(model_def_plan(DIR, j, strlen(j), &m, &e), -1);
    assert_non_null(strstr(e.msg, "'output.logits': layer 'ue' is user vec [8]; it must be a "
                                  "candidate-domain vec [8]"));
    free(j);
}

/* ------------------------------------------------------------------- lce */

static void test_lce(void **state)
{
    (void)state;
    model_def *m = plan_ok(L_UT "," L_CT ","
                           "{\"name\":\"x\",\"op\":\"lce\",\"user\":\"ut\",\"candidate\":\"ct\","
                           "\"out_tokens\":3}");
    shape_is(m, "x", MD_CAND, MD_TOKENS, 3, 8);
    weight_is(m, "x", 0, "x.w_user", 3, 4);
    weight_is(m, "x", 1, "x.w_cand", 3, 2);
    assert_int_equal(L(m, "x")->in[0].src, MD_SRC_LAYER);
    model_def_free(m);
    plan_err(L_UT "," L_CT ",{\"name\":\"v\",\"op\":\"lce\",\"user\":\"user.dense\","
                           "\"candidate\":\"cd\",\"out_tokens\":2}",
             "layer 'v': lce user operand 'user.dense' has D=8, candidate operand 'cd' has D=16");
}

static void test_lce_vec_operands(void **state)
{
    (void)state;
    model_def *m = plan_ok(L_UE "," L_CE ",{\"name\":\"v\",\"op\":\"lce\",\"user\":\"ue\","
                                          "\"candidate\":\"ce\",\"out_tokens\":2}");
    shape_is(m, "v", MD_CAND, MD_TOKENS, 2, 8);
    weight_is(m, "v", 0, "v.w_user", 2, 1);
    weight_is(m, "v", 1, "v.w_cand", 2, 1);
    model_def_free(m);
}

static void test_lce_refused(void **state)
{
    (void)state;
    static const struct bad_x cases[] = {
        {L_UT "," L_CT, ",\"user\":\"ct\",\"candidate\":\"ct\",\"out_tokens\":3",
         {"layer 'x': lce user operand 'ct' is candidate tokens [2, 8]; it must be user-domain"}},
        {L_UT "," L_CT, ",\"user\":\"ut\",\"candidate\":\"ut\",\"out_tokens\":3",
         {"layer 'x': lce candidate operand 'ut' is user tokens [4, 8]; it must be "
          "candidate-domain"}},
        {L_H "," L_CT, ",\"user\":\"h\",\"candidate\":\"ct\",\"out_tokens\":3",
         {"layer 'x': lce user operand 'h' is user jagged [L, 8]"}},
        {L_UE16 "," L_CT, ",\"user\":\"ue16\",\"candidate\":\"ct\",\"out_tokens\":3",
         {"layer 'x': lce user operand 'ue16' has D=16, candidate operand 'ct' has D=8"}},
        {L_UT "," L_CT, ",\"user\":\"ut\",\"candidate\":\"ct\"",
         {"layer 'x': missing key 'layers[4].out_tokens'"}},
        {L_UT "," L_CT, ",\"user\":\"ut\",\"candidate\":\"ct\",\"out_tokens\":300000000",
         {"layer 'x': lce output [300000000, 8] is too wide"}},
    };
    REFUSE_X("lce", cases);
}

/* ------------------------------------------------------------- attention */

static void test_attention(void **state)
{
    (void)state;
    model_def *m =
        plan_ok(L_H "," L_CT "," L_CE ","
                "{\"name\":\"a\",\"op\":\"target_attention\",\"query\":\"ct\",\"history\":\"h\","
                "\"heads\":3,\"head_dim\":5},"
                "{\"name\":\"b\",\"op\":\"target_attention\",\"query\":\"ce\",\"history\":\"h\","
                "\"heads\":1,\"head_dim\":8}");
    shape_is(m, "a", MD_CAND, MD_TOKENS, 2, 8);
    shape_is(m, "b", MD_CAND, MD_TOKENS, 1, 8); /* a vec query gives tokens [1, D] */
    const md_layer *a = L(m, "a");
    assert_int_equal(a->heads, 3);
    assert_int_equal(a->head_dim, 5);
    assert_int_equal(a->n_in, 2);
    assert_int_equal(a->in[0].index, 2); /* ct */
    assert_int_equal(a->in[1].index, 0); /* h  */
    weight_is(m, "a", 0, "a.wq", 15, 8);
    weight_is(m, "a", 1, "a.wk", 15, 8);
    weight_is(m, "a", 2, "a.wv", 15, 8);
    weight_is(m, "a", 3, "a.wo", 8, 15);
    model_def_free(m);
}

static void test_attention_refused(void **state)
{
    (void)state;
    /* a candidate history */
    plan_err(L_CT ",{\"name\":\"a\",\"op\":\"target_attention\",\"query\":\"ct\",\"history\":"
                  "\"ct\",\"heads\":1,\"head_dim\":4}",
             "layer 'a': target_attention history 'ct' is candidate tokens [2, 8]; it must be a "
             "user-domain jagged history");
    /* a user history that is not jagged */
    plan_err(L_H "," L_HM "," L_CT ",{\"name\":\"a\",\"op\":\"target_attention\",\"query\":\"ct\","
                                    "\"history\":\"hm\",\"heads\":1,\"head_dim\":4}",
             "layer 'a': target_attention history 'hm' is user vec [8]");
    /* a user query */
    plan_err(L_H "," L_UT ",{\"name\":\"a\",\"op\":\"target_attention\",\"query\":\"ut\","
                          "\"history\":\"h\",\"heads\":1,\"head_dim\":4}",
             "layer 'a': target_attention query 'ut' is user tokens [4, 8]; it must be a "
             "candidate-domain vec [D] or tokens [Tq, D]");
    /* D mismatch */
    plan_err(L_H16 "," L_CT ",{\"name\":\"a\",\"op\":\"target_attention\",\"query\":\"ct\","
                            "\"history\":\"h16\",\"heads\":1,\"head_dim\":4}",
             "layer 'a': target_attention history 'h16' has D=16, query 'ct' has D=8");
    plan_err(L_H "," L_CT ",{\"name\":\"a\",\"op\":\"target_attention\",\"query\":\"ct\","
                          "\"history\":\"h\",\"heads\":65536,\"head_dim\":65536}",
             "layer 'a': heads * head_dim = 4294967296 is too large");
    plan_err(L_H "," L_CT ",{\"name\":\"a\",\"op\":\"target_attention\",\"query\":\"ct\","
                          "\"history\":\"user.history\",\"heads\":1,\"head_dim\":4}",
             "layer 'a': history 'user.history' is the raw history; only history_embedding");
}

/* ------------------------------------------------------ sequence ops */

#define L_SA "{\"name\":\"sa\",\"op\":\"self_attention\",\"input\":\"h\",\"heads\":2,\"head_dim\":4}"

static void test_self_attention(void **state)
{
    (void)state;
    model_def *m = plan_ok(L_H "," L_SA ","
                           "{\"name\":\"hs\",\"op\":\"self_attention\",\"input\":\"sa\",\"heads\":1,"
                           "\"head_dim\":3,\"causal\":false,\"kind\":\"silu\"}," L_CE ","
                           "{\"name\":\"t\",\"op\":\"target_attention\",\"query\":\"ce\","
                           "\"history\":\"h\",\"shared_with\":\"sa\"}");
    shape_is(m, "sa", MD_USER, MD_JAGGED, 1, 8);
    shape_is(m, "hs", MD_USER, MD_JAGGED, 1, 8);
    shape_is(m, "t", MD_CAND, MD_TOKENS, 1, 8);
    const md_layer *sa = L(m, "sa"), *hs = L(m, "hs"), *t = L(m, "t");
    assert_int_equal(sa->causal, 1); /* the default */
    assert_int_equal(sa->att_kind, BK_ATT_SOFTMAX);
    assert_int_equal(hs->causal, 0);
    assert_int_equal(hs->att_kind, BK_ATT_SILU);
    weight_is(m, "sa", 0, "sa.wq", 8, 8);
    weight_is(m, "sa", 3, "sa.wo", 8, 8);
    weight_is(m, "hs", 1, "hs.wk", 3, 8);
    assert_int_equal(t->shared, 1);
    assert_int_equal(t->n_w, 0); /* no params of its own */
    assert_int_equal(t->heads, 2);
    assert_int_equal(t->head_dim, 4);
    assert_int_equal(L(m, "sa")->shared, -1);
    model_def_free(m);
}

static void test_self_attention_refused(void **state)
{
    (void)state;
    plan_err(L_CT ",{\"name\":\"s\",\"op\":\"self_attention\",\"input\":\"ct\",\"heads\":1,"
                  "\"head_dim\":4}",
             "layer 's': self_attention history 'ct' is candidate tokens [2, 8]; it must be a "
             "user-domain jagged history");
    plan_err(L_H "," L_HM ",{\"name\":\"s\",\"op\":\"self_attention\",\"input\":\"hm\",\"heads\":1,"
                           "\"head_dim\":4}",
             "layer 's': self_attention history 'hm' is user vec [8]");
    plan_err(L_H ",{\"name\":\"s\",\"op\":\"self_attention\",\"input\":\"h\",\"heads\":1,"
                 "\"head_dim\":4,\"kind\":\"relu\"}",
             "layer 's'", "kind", "softmax", "silu");
    plan_err(L_H ",{\"name\":\"s\",\"op\":\"self_attention\",\"input\":\"h\",\"heads\":1,"
                 "\"head_dim\":4,\"causal\":1}",
             "layer 's'", "causal", "must be true or false");
    plan_err(L_H ",{\"name\":\"s\",\"op\":\"self_attention\",\"input\":\"h\",\"heads\":2}",
             "layer 's'", "head_dim");
    /* shared_with: unknown, not a self_attention, defined later, other history, extra keys */
    plan_err(L_H "," L_CE ",{\"name\":\"t\",\"op\":\"target_attention\",\"query\":\"ce\","
                          "\"history\":\"h\",\"shared_with\":\"nope\"}",
             "layer 't'", "unknown shared_with 'nope'");
    plan_err(L_H "," L_CE ",{\"name\":\"t\",\"op\":\"target_attention\",\"query\":\"ce\","
                          "\"history\":\"h\",\"shared_with\":\"ce\"}",
             "layer 't': shared_with 'ce' is a embedding_bag layer; it must name a self_attention");
    plan_err(L_H "," L_CE ",{\"name\":\"t\",\"op\":\"target_attention\",\"query\":\"ce\","
                          "\"history\":\"h\",\"shared_with\":\"user.dense\"}",
             "layer 't'", "'shared_with' must name a layer");
    plan_err(L_H "," L_CE ",{\"name\":\"t\",\"op\":\"target_attention\",\"query\":\"ce\","
                          "\"history\":\"h\",\"shared_with\":\"sa\"}," L_SA,
             "layer 't'", "shared_with 'sa' is defined later");
    plan_err(L_H "," L_SA "," L_CE ",{\"name\":\"t\",\"op\":\"target_attention\",\"query\":\"ce\","
                                   "\"history\":\"sa\",\"shared_with\":\"sa\"}",
             "layer 't': history 'sa' must be the input of shared_with layer 'sa'");
    plan_err(L_H "," L_SA "," L_CE ",{\"name\":\"t\",\"op\":\"target_attention\",\"query\":\"ce\","
                                   "\"history\":\"h\",\"shared_with\":\"sa\",\"heads\":2}",
             "layer 't': with shared_with, heads and head_dim come from 'sa'");
}

#define L_DIN(extra)                                                                           \
    "{\"name\":\"d\",\"op\":\"din_attention\",\"query\":\"ce\",\"history\":\"h\",\"hidden\":5" extra "}"

static void test_din_attention(void **state)
{
    (void)state;
    model_def *m = plan_ok(L_H "," L_CE "," L_DIN(",\"activation\":\"sigmoid\",\"normalize\":\"none\""));
    shape_is(m, "d", MD_CAND, MD_VEC, 1, 8);
    const md_layer *d = L(m, "d");
    assert_int_equal(d->hidden, 5);
    assert_int_equal(d->act, BK_ACT_SIGMOID);
    assert_int_equal(d->normalize, 0);
    weight_is(m, "d", 0, "d.w1", 5, 32);
    weight_is(m, "d", 1, "d.b1", 1, 5);
    weight_is(m, "d", 2, "d.w2", 1, 5);
    weight_is(m, "d", 3, "d.b2", 1, 1);
    model_def_free(m);
    m = plan_ok(L_H "," L_CE "," L_DIN(""));
    assert_int_equal(L(m, "d")->act, BK_ACT_RELU); /* defaults */
    assert_int_equal(L(m, "d")->normalize, 1);
    model_def_free(m);
}

static void test_din_attention_refused(void **state)
{
    (void)state;
    plan_err(L_H "," L_UE ",{\"name\":\"d\",\"op\":\"din_attention\",\"query\":\"ue\","
                          "\"history\":\"h\",\"hidden\":5}",
             "layer 'd': din_attention query 'ue' is user vec [8]; it must be a candidate-domain vec");
    plan_err(L_H "," L_CT ",{\"name\":\"d\",\"op\":\"din_attention\",\"query\":\"ct\","
                          "\"history\":\"h\",\"hidden\":5}",
             "layer 'd': din_attention query 'ct' is candidate tokens [2, 8]");
    plan_err(L_CE "," L_CE2 ",{\"name\":\"d\",\"op\":\"din_attention\",\"query\":\"ce\","
                            "\"history\":\"ce2\",\"hidden\":5}",
             "layer 'd': din_attention history 'ce2' is candidate vec [8]");
    plan_err(L_H16 "," L_CE ",{\"name\":\"d\",\"op\":\"din_attention\",\"query\":\"ce\","
                            "\"history\":\"h16\",\"hidden\":5}",
             "layer 'd': din_attention history 'h16' has D=16, query 'ce' has D=8");
    plan_err(L_H "," L_CE ",{\"name\":\"d\",\"op\":\"din_attention\",\"query\":\"ce\","
                          "\"history\":\"h\"}",
             "layer 'd'", "hidden");
    plan_err(L_H "," L_CE "," L_DIN(",\"normalize\":\"l1\""), "layer 'd'", "normalize", "softmax");
    plan_err(L_H "," L_CE "," L_DIN(",\"activation\":\"swish\""), "layer 'd'", "activation");
    plan_err(L_H "," L_CE "," L_DIN(",\"heads\":2"), "layer 'd'", "heads");
}

/* ------------------------------------------------------------------- add */

static void test_add(void **state)
{
    (void)state;
    model_def *m = plan_ok(
        L_UT "," L_CT "," L_UE "," L_CE ","
        "{\"name\":\"v1\",\"op\":\"add\",\"inputs\":[\"ue\",\"ce\"]},"
        "{\"name\":\"v2\",\"op\":\"add\",\"inputs\":[\"ce\",\"ue\"]},"
        "{\"name\":\"v3\",\"op\":\"add\",\"inputs\":[\"ue\",\"ue\"]},"
        "{\"name\":\"v4\",\"op\":\"add\",\"inputs\":[\"ce\",\"ce\"]},"
        "{\"name\":\"u2\",\"op\":\"reshape\",\"input\":\"ud\",\"tokens\":16},"
        "{\"name\":\"c32\",\"op\":\"linear\",\"input\":\"candidate.dense\",\"out\":32},"
        "{\"name\":\"c2\",\"op\":\"reshape\",\"input\":\"c32\",\"tokens\":16},"
        "{\"name\":\"t1\",\"op\":\"add\",\"inputs\":[\"c2\",\"u2\"]},"
        "{\"name\":\"t2\",\"op\":\"add\",\"a\":\"v3\",\"b\":\"v4\"}");
    shape_is(m, "v1", MD_CAND, MD_VEC, 1, 8);
    shape_is(m, "v2", MD_CAND, MD_VEC, 1, 8);
    shape_is(m, "v3", MD_USER, MD_VEC, 1, 8);
    shape_is(m, "v4", MD_CAND, MD_VEC, 1, 8);
    shape_is(m, "t1", MD_CAND, MD_TOKENS, 16, 2);
    shape_is(m, "t2", MD_CAND, MD_VEC, 1, 8); /* the "a"/"b" spelling */
    const md_layer *v1 = L(m, "v1");
    assert_int_equal(v1->n_in, 2);
    assert_int_equal(v1->in[0].index, 4); /* ue, a */
    assert_int_equal(v1->in[1].index, 5); /* ce, b */
    assert_int_equal(L(m, "t2")->in[0].index, 8);
    model_def_free(m);
}

static void test_add_refused(void **state)
{
    (void)state;
    static const struct bad_x cases[] = {
        {L_UT "," L_UE, ",\"inputs\":[\"ut\",\"ue\"]",
         {"layer 'x': add operands must have equal shapes: 'ut' is user tokens [4, 8], 'ue' is "
          "user vec [8]"}},
        {L_UE "," L_UE16, ",\"inputs\":[\"ue\",\"ue16\"]",
         {"layer 'x': add operands must have equal shapes"}},
        {L_UE "," L_CT, ",\"inputs\":[\"ue\",\"cd\"]",
         {"layer 'x': add operands must have equal shapes: 'ue' is user vec [8], 'cd' is "
          "candidate vec [16]"}},
        {L_H "," L_UE, ",\"inputs\":[\"h\",\"ue\"]",
         {"layer 'x': add operands must have equal shapes: 'h' is user jagged [L, 8], 'ue' is "
          "user vec [8]"}},
        {L_UE, ",\"inputs\":[\"ue\",\"ue\",\"ue\"]",
         {"layer 'x': 'layers[1].inputs' must list exactly two inputs [a, b], got 3"}},
        {L_UE, ",\"inputs\":[\"ue\"]", {"must list exactly two inputs [a, b], got 1"}},
        {L_UE, ",\"a\":\"ue\"", {"layer 'x': missing key 'layers[1].b'"}},
        {L_UE, ",\"a\":\"ue\",\"b\":\"ue\",\"inputs\":[\"ue\",\"ue\"]",
         {"layer 'x': add takes either 'inputs': [a, b] or 'a' and 'b', not both"}},
        {L_UE, "", {"layer 'x': missing key 'layers[1].inputs'"}},
    };
    REFUSE_X("add", cases);
}

/* ----------------------------------------------------- stack and shapes */

static void test_stack_refused(void **state)
{
    (void)state;
    plan_err(L_UE "," L_UE16 ",{\"name\":\"s\",\"op\":\"stack\",\"inputs\":[\"ue\",\"ue16\"]}",
             "layer 's': stack inputs need one width D: 'ue' has D=8, 'ue16' has D=16");
    plan_err(L_UE "," L_H ",{\"name\":\"s\",\"op\":\"stack\",\"inputs\":[\"ue\",\"h\"]}",
             "layer 's': stack input 'h' is user jagged [L, 8]", "mean_pool");
    plan_err(L_UE ",{\"name\":\"s\",\"op\":\"stack\",\"inputs\":[\"ue\",\"later\"]},"
                  "{\"name\":\"later\",\"op\":\"flatten\",\"input\":\"s\"}",
             "layer 's': inputs[1] 'later' is defined later (layers[2])");
    plan_err(L_UE ",{\"name\":\"s\",\"op\":\"stack\",\"inputs\":[\"ue\",\"user.sparse.u\"]}",
             "layer 's': inputs[1] 'user.sparse.u' is a sparse feature; only embedding_bag");
    plan_err("{\"name\":\"d\",\"op\":\"linear\",\"input\":\"user.dense\",\"out\":2000000000},"
             "{\"name\":\"s\",\"op\":\"stack\",\"inputs\":[\"d\",\"d\"]}",
             "layer 's': stack output [2, 2000000000] is too wide");
    plan_err(L_UE ",{\"name\":\"s\",\"op\":\"stack\",\"inputs\":\"ue\"}",
             "layer 's': 'layers[1].inputs' must be an array, got string");
}

static void test_kind_errors(void **state)
{
    (void)state;
    plan_err(L_UE ",{\"name\":\"f\",\"op\":\"flatten\",\"input\":\"ue\"}",
             "layer 'f': flatten input 'ue' is user vec [8]", "already a vector");
    plan_err(L_H ",{\"name\":\"f\",\"op\":\"flatten\",\"input\":\"h\"}",
             "layer 'f': flatten input 'h' is user jagged [L, 8]");
    plan_err(L_UT ",{\"name\":\"r\",\"op\":\"reshape\",\"input\":\"ut\",\"tokens\":2}",
             "layer 'r': reshape input 'ut' is user tokens [4, 8]", "flatten it first");
    plan_err(L_UE ",{\"name\":\"p\",\"op\":\"mean_pool\",\"input\":\"ue\"}",
             "layer 'p': mean_pool input 'ue' is user vec [8]; it must be a jagged history");
    plan_err("{\"name\":\"p\",\"op\":\"mean_pool\",\"input\":\"user.dense\"}",
             "layer 'p': mean_pool input 'user.dense' is user vec [8]");
    plan_err("{\"name\":\"e\",\"op\":\"embedding_bag\",\"input\":\"user.dense\",\"table\":\"t\","
             "\"pooling\":\"sum\"}",
             "layer 'e': embedding_bag input must be a sparse feature");
    plan_err("{\"name\":\"e\",\"op\":\"embedding_bag\",\"input\":\"user.history\",\"table\":\"t\","
             "\"pooling\":\"sum\"}",
             "layer 'e': embedding_bag input must be a sparse feature");
    plan_err(L_UE ",{\"name\":\"e\",\"op\":\"history_embedding\",\"input\":\"ue\",\"table\":\"t\"}",
             "layer 'e': history_embedding input must be 'user.history', got 'ue'");
    plan_err("{\"name\":\"e\",\"op\":\"history_embedding\",\"input\":\"user.sparse.u\",\"table\":\"t\"}",
             "layer 'e': history_embedding input must be 'user.history'");
    plan_err("{\"name\":\"r\",\"op\":\"reshape\",\"input\":\"user.dense\",\"tokens\":3}",
             "layer 'r': reshape of 'user.dense' (user vec [8]) into 3 tokens: 8 is not divisible by 3");
}

static void test_refs_and_misc(void **state)
{
    (void)state;
    /* dense refs feed any vector op; reshape to one token is tokens [1, F];
     * unused layers and an unused table are fine. */
    model_def *m = plan_ok(
        "{\"name\":\"r\",\"op\":\"reshape\",\"input\":\"candidate.dense\",\"tokens\":1},"
        "{\"name\":\"f\",\"op\":\"flatten\",\"input\":\"r\"},"
        "{\"name\":\"unused\",\"op\":\"linear\",\"input\":\"user.dense\",\"out\":1}");
    shape_is(m, "r", MD_CAND, MD_TOKENS, 1, 4);
    shape_is(m, "f", MD_CAND, MD_VEC, 1, 4);
    assert_int_equal(L(m, "r")->in[0].src, MD_SRC_CAND_DENSE);
    assert_int_equal(m->n_tables, 2);
    assert_int_equal(m->logits_layer, 3);
    model_def_free(m);
    /* the big edges plan fine (no weights needed to plan) */
    char *j = model("{\"name\":\"big\",\"op\":\"linear\",\"input\":\"user.dense\",\"out\":2147483647}");
    bk_err e = {{0}};
    assert_int_equal(model_def_plan(DIR, j, strlen(j), &m, &e), 0);
    weight_is(m, "big", 0, "big.weight", 2147483647, 8);
    model_def_free(m);
    free(j);
    plan_err("{\"name\":\"x\",\"op\":\"linear\",\"input\":\"zz\",\"out\":1}",
             "layer 'x': input 'zz' is defined later (layers[1])");
    plan_err("{\"name\":\"x\",\"op\":\"linear\",\"input\":\"user.sparse\",\"out\":1}",
             "layer 'x': input 'user.sparse' is not a model input");
    plan_err("{\"name\":\"x\",\"op\":\"linear\",\"input\":\"\",\"out\":1}",
             "layer 'x': unknown input ''");
    plan_err("{\"name\":\"x\",\"op\":\"embedding_bag\",\"input\":\"candidate.sparse.u\",\"table\":"
             "\"t\",\"pooling\":\"sum\"}",
             "layer 'x': input 'candidate.sparse.u': no sparse feature 'u' in inputs.candidate.sparse");
}

/* -------------------------------------------- the ops of 2026-12-01 */

/* A user history projected per event, jagged [L, 8]. */
#define L_HL "{\"name\":\"hl\",\"op\":\"linear\",\"input\":\"h\",\"out\":8}"
/* The refusal of a user/candidate mix, as every one-domain op words it. */
#define MIX_MSG(op)                                                                            \
    "op '" op "' cannot mix user and candidate inputs; only lce, target_attention, din_attention, " \
    "add, mul and dot_interaction read user rows through the map"

/* "\"r\",\"r\",..." n times (a static buffer: one list at a time). */
static const char *refs(const char *r, int n)
{
    static char buf[8192];
    size_t o = 0;
    for (int k = 0; k < n; k++)
        o += (size_t)snprintf(buf + o, sizeof buf - o, "%s\"%s\"", k ? "," : "", r);
    assert_true(o < sizeof buf - 1);
    return buf;
}

/* A layer list built with printf-style arguments (each test frees it). */
static char *fmt(const char *f, ...)
{
    va_list ap;
    va_start(ap, f);
    int n = vsnprintf(NULL, 0, f, ap);
    va_end(ap);
    char *b = malloc((size_t)n + 1);
    assert_non_null(b);
    va_start(ap, f);
    vsnprintf(b, (size_t)n + 1, f, ap);
    va_end(ap);
    return b;
}

static void test_activation(void **state)
{
    (void)state;
    model_def *m = plan_ok(
        L_UE "," L_UT "," L_H "," L_CE "," L_CT ","
        "{\"name\":\"a1\",\"op\":\"activation\",\"input\":\"ue\",\"fn\":\"relu\"},"
        "{\"name\":\"a2\",\"op\":\"activation\",\"input\":\"ut\",\"fn\":\"gelu\"},"
        "{\"name\":\"a3\",\"op\":\"activation\",\"input\":\"h\",\"fn\":\"silu\"},"
        "{\"name\":\"a4\",\"op\":\"activation\",\"input\":\"ct\",\"fn\":\"tanh\"},"
        "{\"name\":\"a5\",\"op\":\"activation\",\"input\":\"candidate.dense\",\"fn\":\"sigmoid\"}");
    shape_is(m, "a1", MD_USER, MD_VEC, 1, 8);
    shape_is(m, "a2", MD_USER, MD_TOKENS, 4, 8);
    shape_is(m, "a3", MD_USER, MD_JAGGED, 1, 8);
    shape_is(m, "a4", MD_CAND, MD_TOKENS, 2, 8);
    shape_is(m, "a5", MD_CAND, MD_VEC, 1, 4);
    assert_int_equal(L(m, "a1")->act, BK_ACT_RELU);
    assert_int_equal(L(m, "a2")->act, BK_ACT_GELU);
    assert_int_equal(L(m, "a3")->act, BK_ACT_SILU);
    assert_int_equal(L(m, "a4")->act, BK_ACT_TANH);
    assert_int_equal(L(m, "a5")->act, BK_ACT_SIGMOID);
    assert_int_equal(L(m, "a5")->in[0].src, MD_SRC_CAND_DENSE);
    assert_int_equal(L(m, "a1")->n_w, 0);
    model_def_free(m);

    static const struct bad_x cases[] = {
        {L_UE, ",\"input\":\"ue\"", {"layer 'x': missing key 'layers[1].fn'"}},
        {L_UE, ",\"fn\":\"relu\"", {"layer 'x': missing key 'layers[1].input'"}},
        /* "none" is linear's, not an activation layer's */
        {L_UE, ",\"input\":\"ue\",\"fn\":\"none\"",
         {"layer 'x': 'layers[1].fn' must be ", "\"relu\"", "\"gelu\"", "\"silu\"", "\"tanh\"",
          "\"sigmoid\"", "got 'none'"}},
        {L_UE, ",\"input\":\"ue\",\"fn\":\"softmax\"",
         {"layer 'x': 'layers[1].fn' must be ", "got 'softmax'"}},
        {L_UE, ",\"input\":\"ue\",\"fn\":1", {"layer 'x': 'layers[1].fn' must be a string"}},
        {L_UE, ",\"input\":\"ue\",\"fn\":\"relu\",\"activation\":\"relu\"",
         {"layer 'x': unknown key 'layers[1].activation'"}},
        {L_UE, ",\"input\":[\"ue\"],\"fn\":\"relu\"",
         {"layer 'x': 'layers[1].input' must be a string"}},
        {"", ",\"input\":\"user.sparse.u\",\"fn\":\"relu\"",
         {"layer 'x': input 'user.sparse.u' is a sparse feature"}},
    };
    REFUSE_X("activation", cases);
}

static void test_layer_norm(void **state)
{
    (void)state;
    model_def *m = plan_ok(
        L_UE "," L_UT "," L_H "," L_CT ","
        "{\"name\":\"n1\",\"op\":\"layer_norm\",\"input\":\"ue\"},"
        "{\"name\":\"n2\",\"op\":\"layer_norm\",\"input\":\"ut\",\"eps\":0.001},"
        "{\"name\":\"n3\",\"op\":\"layer_norm\",\"input\":\"h\",\"eps\":1},"
        "{\"name\":\"n4\",\"op\":\"layer_norm\",\"input\":\"cd\",\"eps\":1e-12}");
    shape_is(m, "n1", MD_USER, MD_VEC, 1, 8);
    shape_is(m, "n2", MD_USER, MD_TOKENS, 4, 8);
    shape_is(m, "n3", MD_USER, MD_JAGGED, 1, 8);
    shape_is(m, "n4", MD_CAND, MD_VEC, 1, 16);
    assert_float_equal(L(m, "n1")->eps, 1e-5f, 0);
    assert_float_equal(L(m, "n2")->eps, 1e-3f, 0);
    assert_float_equal(L(m, "n3")->eps, 1.0f, 0);
    assert_float_equal(L(m, "n4")->eps, 1e-12f, 0);
    /* [D] params over the last dim, 1-D in the file */
    weight_is(m, "n2", 0, "n2.weight", 1, 8);
    weight_is(m, "n2", 1, "n2.bias", 1, 8);
    weight_is(m, "n4", 0, "n4.weight", 1, 16);
    weight_is(m, "n4", 1, "n4.bias", 1, 16);
    assert_int_equal(L(m, "n2")->n_w, 2);
    assert_true(L(m, "n2")->w[0].one_d && L(m, "n2")->w[1].one_d);
    model_def_free(m);

    static const struct bad_x cases[] = {
        {L_UE, ",\"input\":\"ue\",\"eps\":0",
         {"layer 'x': 'layers[1].eps' must be a positive finite number, got 0"}},
        {L_UE, ",\"input\":\"ue\",\"eps\":-1e-5",
         {"layer 'x': 'layers[1].eps' must be a positive finite number"}},
        {L_UE, ",\"input\":\"ue\",\"eps\":1e300",
         {"layer 'x': 'layers[1].eps' must be a positive finite number"}},
        {L_UE, ",\"input\":\"ue\",\"eps\":\"1e-5\"",
         {"layer 'x': 'layers[1].eps' must be a number, got string"}},
        {L_UE, ",\"input\":\"ue\",\"eps\":null", {"layer 'x': 'layers[1].eps' must be a number"}},
        {L_UE, ",\"input\":\"ue\",\"epsilon\":0.1", {"layer 'x': unknown key 'layers[1].epsilon'"}},
        {L_UE, "", {"layer 'x': missing key 'layers[1].input'"}},
    };
    REFUSE_X("layer_norm", cases);
}

/* An eps that is positive as written but 0 as the fp32 the layer keeps
 * would divide by zero on a constant row: refused like 0. */
static void test_layer_norm_eps_underflow(void **state)
{
    (void)state;
    plan_err(L_UE ",{\"name\":\"x\",\"op\":\"layer_norm\",\"input\":\"ue\",\"eps\":1e-50}",
             "layer 'x': 'layers[1].eps' must be a positive finite number");
    plan_err(L_UE ",{\"name\":\"x\",\"op\":\"layer_norm\",\"input\":\"ue\",\"eps\":1e-40}",
             "layer 'x': 'layers[1].eps' must be a positive finite number");
    /* just above the smallest normal fp32 is fine */
    model_def *m = plan_ok(L_UE ",{\"name\":\"x\",\"op\":\"layer_norm\",\"input\":\"ue\","
                                "\"eps\":1.2e-38}");
    assert_true(L(m, "x")->eps > 0);
    model_def_free(m);
}

static void test_concat(void **state)
{
    (void)state;
    model_def *m = plan_ok(
        L_UE "," L_UE16 "," L_CE "," L_CT ","
        "{\"name\":\"c1\",\"op\":\"concat\",\"inputs\":[\"ue\",\"ue16\",\"user.dense\"]},"
        "{\"name\":\"c2\",\"op\":\"concat\",\"inputs\":[\"cd\",\"ce\",\"candidate.dense\",\"ce\"]},"
        "{\"name\":\"c3\",\"op\":\"concat\",\"inputs\":[\"ce\"]}");
    shape_is(m, "c1", MD_USER, MD_VEC, 1, 32);
    shape_is(m, "c2", MD_CAND, MD_VEC, 1, 36);
    shape_is(m, "c3", MD_CAND, MD_VEC, 1, 8);
    const md_layer *c2 = L(m, "c2");
    assert_int_equal(c2->n_in, 4);
    assert_int_equal(c2->in[0].index, 3); /* cd */
    assert_int_equal(c2->in[1].index, 2); /* ce */
    assert_int_equal(c2->in[2].src, MD_SRC_CAND_DENSE);
    assert_int_equal(c2->n_w, 0);
    model_def_free(m);

    static const struct bad_x cases[] = {
        {L_UE "," L_UT, ",\"inputs\":[\"ue\",\"ut\"]",
         {"layer 'x': concat input 'ut' is user tokens [4, 8]; concat takes vectors [F]",
          "flatten"}},
        {L_UE "," L_H, ",\"inputs\":[\"ue\",\"h\"]",
         {"layer 'x': concat input 'h' is user jagged [L, 8]; concat takes vectors [F]", "pool"}},
        {L_UE, ",\"inputs\":[]", {"layer 'x': 'layers[1].inputs' must be a non-empty array"}},
        {L_UE, ",\"inputs\":\"ue\"", {"layer 'x': 'layers[1].inputs' must be"}},
        {L_UE, ",\"inputs\":[\"ue\",3]", {"layer 'x': 'layers[1].inputs[1]' must be a string"}},
        {L_UE, ",\"input\":\"ue\"", {"layer 'x': unknown key 'layers[1].input'"}},
        {L_UE, "", {"layer 'x': missing key 'layers[1].inputs'"}},
        {"{\"name\":\"d\",\"op\":\"linear\",\"input\":\"user.dense\",\"out\":2000000000}",
         ",\"inputs\":[\"d\",\"d\"]", {"layer 'x': concat output [4000000000] is too wide"}},
    };
    REFUSE_X("concat", cases);
}

static void test_mul(void **state)
{
    (void)state;
    model_def *m = plan_ok(
        L_UE "," L_CE "," L_UT "," L_H "," L_HL ","
        "{\"name\":\"v1\",\"op\":\"mul\",\"inputs\":[\"ue\",\"ce\"]},"
        "{\"name\":\"v2\",\"op\":\"mul\",\"a\":\"ce\",\"b\":\"ue\"},"
        "{\"name\":\"v3\",\"op\":\"mul\",\"inputs\":[\"ue\",\"ue\"]},"
        "{\"name\":\"j1\",\"op\":\"mul\",\"inputs\":[\"h\",\"hl\"]},"
        "{\"name\":\"t1\",\"op\":\"mul\",\"inputs\":[\"ut\",\"ut\"]},"
        "{\"name\":\"c32\",\"op\":\"linear\",\"input\":\"candidate.dense\",\"out\":32},"
        "{\"name\":\"c4\",\"op\":\"reshape\",\"input\":\"c32\",\"tokens\":4},"
        "{\"name\":\"t2\",\"op\":\"mul\",\"a\":\"ut\",\"b\":\"c4\"}");
    shape_is(m, "v1", MD_CAND, MD_VEC, 1, 8);
    shape_is(m, "v2", MD_CAND, MD_VEC, 1, 8);
    shape_is(m, "v3", MD_USER, MD_VEC, 1, 8);
    shape_is(m, "j1", MD_USER, MD_JAGGED, 1, 8);
    shape_is(m, "t1", MD_USER, MD_TOKENS, 4, 8);
    shape_is(m, "t2", MD_CAND, MD_TOKENS, 4, 8);
    const md_layer *v2 = L(m, "v2");
    assert_int_equal(v2->n_in, 2);
    assert_int_equal(v2->in[0].index, 1); /* a = ce */
    assert_int_equal(v2->in[1].index, 0); /* b = ue */
    assert_int_equal(v2->n_w, 0);
    model_def_free(m);

    static const struct bad_x cases[] = {
        {L_UT "," L_UE, ",\"inputs\":[\"ut\",\"ue\"]",
         {"layer 'x': mul operands must have equal shapes: 'ut' is user tokens [4, 8], 'ue' is "
          "user vec [8]"}},
        {L_H "," L_H16, ",\"inputs\":[\"h\",\"h16\"]",
         {"layer 'x': mul operands must have equal shapes: 'h' is user jagged [L, 8], 'h16' is "
          "user jagged [L, 16]"}},
        /* a jagged operand never meets a candidate one */
        {L_H "," L_CE, ",\"inputs\":[\"h\",\"ce\"]",
         {"layer 'x': mul operands must have equal shapes: 'h' is user jagged [L, 8], 'ce' is "
          "candidate vec [8]"}},
        {L_UE, ",\"inputs\":[\"ue\",\"ue\",\"ue\"]",
         {"layer 'x': 'layers[1].inputs' must list exactly two inputs [a, b], got 3"}},
        {L_UE, ",\"b\":\"ue\"", {"layer 'x': missing key 'layers[1].a'"}},
        {L_UE, ",\"a\":\"ue\",\"b\":\"ue\",\"inputs\":[\"ue\",\"ue\"]",
         {"layer 'x': mul takes either 'inputs': [a, b] or 'a' and 'b', not both"}},
        {L_UE, ",\"a\":\"ue\",\"b\":\"ue\",\"c\":\"ue\"", {"layer 'x': unknown key 'layers[1].c'"}},
    };
    REFUSE_X("mul", cases);
}

static void test_jagged_add_and_linear(void **state)
{
    (void)state;
    model_def *m = plan_ok(
        L_H "," L_HL "," L_UT "," L_CT ","
        "{\"name\":\"j\",\"op\":\"add\",\"a\":\"h\",\"b\":\"hl\"},"
        "{\"name\":\"jl\",\"op\":\"linear\",\"input\":\"j\",\"out\":3,\"activation\":\"silu\"},"
        "{\"name\":\"tl\",\"op\":\"linear\",\"input\":\"ut\",\"out\":5,\"activation\":\"gelu\"},"
        "{\"name\":\"cl\",\"op\":\"linear\",\"input\":\"ct\",\"out\":6,\"activation\":\"tanh\"}");
    shape_is(m, "hl", MD_USER, MD_JAGGED, 1, 8);
    shape_is(m, "j", MD_USER, MD_JAGGED, 1, 8);
    shape_is(m, "jl", MD_USER, MD_JAGGED, 1, 3);
    shape_is(m, "tl", MD_USER, MD_TOKENS, 4, 5);
    shape_is(m, "cl", MD_CAND, MD_TOKENS, 2, 6);
    weight_is(m, "hl", 0, "hl.weight", 8, 8);
    weight_is(m, "jl", 0, "jl.weight", 3, 8);
    weight_is(m, "jl", 1, "jl.bias", 1, 3);
    weight_is(m, "tl", 0, "tl.weight", 5, 8); /* per token: [out, D], not [out, K*D] */
    weight_is(m, "tl", 1, "tl.bias", 1, 5);
    weight_is(m, "cl", 0, "cl.weight", 6, 8);
    assert_true(L(m, "tl")->w[1].one_d && !L(m, "tl")->w[0].one_d);
    assert_int_equal(L(m, "hl")->act, BK_ACT_NONE);
    assert_int_equal(L(m, "jl")->act, BK_ACT_SILU);
    assert_int_equal(L(m, "tl")->act, BK_ACT_GELU);
    assert_int_equal(L(m, "cl")->act, BK_ACT_TANH);
    model_def_free(m);

    plan_err(L_H "," L_H16 ",{\"name\":\"x\",\"op\":\"add\",\"inputs\":[\"h\",\"h16\"]}",
             "layer 'x': add operands must have equal shapes: 'h' is user jagged [L, 8], 'h16' is "
             "user jagged [L, 16]");
    plan_err(L_UT ",{\"name\":\"x\",\"op\":\"linear\",\"input\":\"ut\",\"out\":2,\"activation\":"
                  "\"softmax\"}",
             "layer 'x': 'layers[2].activation' must be ", "\"none\"", "\"relu\"", "\"sigmoid\"",
             "\"gelu\"", "\"silu\"", "\"tanh\"", "got 'softmax'");
    plan_err("{\"name\":\"d\",\"op\":\"linear\",\"input\":\"user.dense\",\"out\":2000000000},"
             "{\"name\":\"r\",\"op\":\"reshape\",\"input\":\"d\",\"tokens\":1000000000},"
             "{\"name\":\"x\",\"op\":\"linear\",\"input\":\"r\",\"out\":4}",
             "layer 'x': linear output [1000000000, 4] is too wide");
}

static void test_token_linear(void **state)
{
    (void)state;
    model_def *m = plan_ok(
        L_UT "," L_CT "," L_CE ","
        "{\"name\":\"t1\",\"op\":\"token_linear\",\"input\":\"ut\",\"out_tokens\":3},"
        "{\"name\":\"t2\",\"op\":\"token_linear\",\"input\":\"ct\",\"out_tokens\":5},"
        "{\"name\":\"t3\",\"op\":\"token_linear\",\"input\":\"ce\",\"out_tokens\":2},"
        "{\"name\":\"t4\",\"op\":\"token_linear\",\"input\":\"user.dense\",\"out_tokens\":1}");
    shape_is(m, "t1", MD_USER, MD_TOKENS, 3, 8);
    shape_is(m, "t2", MD_CAND, MD_TOKENS, 5, 8);
    shape_is(m, "t3", MD_CAND, MD_TOKENS, 2, 8); /* a vec is K = 1 */
    shape_is(m, "t4", MD_USER, MD_TOKENS, 1, 8);
    weight_is(m, "t1", 0, "t1.weight", 3, 4);
    weight_is(m, "t2", 0, "t2.weight", 5, 2);
    weight_is(m, "t3", 0, "t3.weight", 2, 1);
    weight_is(m, "t4", 0, "t4.weight", 1, 1);
    assert_int_equal(L(m, "t1")->n_w, 1);
    model_def_free(m);

    static const struct bad_x cases[] = {
        {L_H, ",\"input\":\"h\",\"out_tokens\":2",
         {"layer 'x': token_linear input 'h' is user jagged [L, 8]; token_linear takes tokens "
          "[K, D]"}},
        {L_UT, ",\"input\":\"ut\"", {"layer 'x': missing key 'layers[2].out_tokens'"}},
        {L_UT, ",\"input\":\"ut\",\"out_tokens\":0",
         {"layer 'x': 'layers[2].out_tokens' must be an integer in [1, 2147483647], got 0"}},
        {L_UT, ",\"input\":\"ut\",\"out_tokens\":\"3\"",
         {"layer 'x': 'layers[2].out_tokens' must be an integer, got string"}},
        {L_UT, ",\"input\":\"ut\",\"out_tokens\":1.5",
         {"layer 'x': 'layers[2].out_tokens' must be an integer"}},
        {L_UT, ",\"input\":\"ut\",\"out\":3", {"layer 'x': unknown key 'layers[2].out'"}},
        {L_UT, ",\"input\":\"ut\",\"out_tokens\":1000000000",
         {"layer 'x': token_linear output [1000000000, 8] is too wide"}},
    };
    REFUSE_X("token_linear", cases);
}

static void test_dot_interaction(void **state)
{
    (void)state;
    /* DLRM: user and candidate tokens, K = 1 + 4 + 1 + 2 = 8 -> 28 pairs */
    model_def *m = plan_ok(
        L_UE "," L_UT "," L_CE "," L_CT ","
        "{\"name\":\"d1\",\"op\":\"dot_interaction\",\"inputs\":[\"ue\",\"ut\",\"ce\",\"ct\"]},"
        "{\"name\":\"d2\",\"op\":\"dot_interaction\",\"inputs\":[\"ue\"],\"self\":true},"
        "{\"name\":\"d3\",\"op\":\"dot_interaction\",\"inputs\":[\"ut\",\"ue\"],\"self\":true},"
        "{\"name\":\"d4\",\"op\":\"dot_interaction\",\"inputs\":[\"ut\"],\"self\":false},"
        "{\"name\":\"d5\",\"op\":\"dot_interaction\",\"inputs\":[\"ct\"]},"
        "{\"name\":\"d6\",\"op\":\"dot_interaction\",\"inputs\":[\"ce\",\"user.dense\"],"
        "\"self\":true}");
    shape_is(m, "d1", MD_CAND, MD_VEC, 1, 28);
    shape_is(m, "d2", MD_USER, MD_VEC, 1, 1);
    shape_is(m, "d3", MD_USER, MD_VEC, 1, 15);
    shape_is(m, "d4", MD_USER, MD_VEC, 1, 6);
    shape_is(m, "d5", MD_CAND, MD_VEC, 1, 1);
    shape_is(m, "d6", MD_CAND, MD_VEC, 1, 3);
    assert_int_equal(L(m, "d1")->self, 0);
    assert_int_equal(L(m, "d2")->self, 1);
    assert_int_equal(L(m, "d3")->self, 1);
    assert_int_equal(L(m, "d4")->self, 0);
    const md_layer *d1 = L(m, "d1");
    assert_int_equal(d1->n_in, 4);
    assert_int_equal(d1->in[0].index, 0); /* ue: the listed order is kept */
    assert_int_equal(d1->in[1].index, 2); /* ut */
    assert_int_equal(d1->in[2].index, 3); /* ce */
    assert_int_equal(d1->in[3].index, 5); /* ct */
    assert_int_equal(d1->n_w, 0);
    model_def_free(m);

    /* 256 tokens is the most: as 256 vectors, and as one [256, 1] */
    char *ls = fmt(L_UE ",{\"name\":\"x\",\"op\":\"dot_interaction\",\"inputs\":[%s]},"
                   "{\"name\":\"d\",\"op\":\"linear\",\"input\":\"user.dense\",\"out\":256},"
                   "{\"name\":\"r\",\"op\":\"reshape\",\"input\":\"d\",\"tokens\":256},"
                   "{\"name\":\"y\",\"op\":\"dot_interaction\",\"inputs\":[\"r\"],\"self\":true}",
                   refs("ue", 256));
    m = plan_ok(ls);
    shape_is(m, "x", MD_USER, MD_VEC, 1, 256 * 255 / 2);
    assert_int_equal(L(m, "x")->n_in, 256);
    shape_is(m, "y", MD_USER, MD_VEC, 1, 256 * 257 / 2);
    model_def_free(m);
    free(ls);
    ls = fmt(L_UE ",{\"name\":\"x\",\"op\":\"dot_interaction\",\"inputs\":[%s]}", refs("ue", 257));
    plan_err(ls, "layer 'x': dot_interaction over more than 256 tokens");
    free(ls);
    static const struct bad_x cases[] = {
        {"{\"name\":\"d\",\"op\":\"linear\",\"input\":\"user.dense\",\"out\":257},"
         "{\"name\":\"r\",\"op\":\"reshape\",\"input\":\"d\",\"tokens\":257}",
         ",\"inputs\":[\"r\"],\"self\":true",
         {"layer 'x': dot_interaction over more than 256 tokens"}},
        {L_UE, ",\"inputs\":[\"ue\"]",
         {"layer 'x': dot_interaction over 1 token has no pairs", "\"self\": true"}},
        {L_UE, ",\"inputs\":[\"ue\"],\"self\":false",
         {"layer 'x': dot_interaction over 1 token has no pairs"}},
        {L_UE "," L_H, ",\"inputs\":[\"ue\",\"h\"]",
         {"layer 'x': dot_interaction input 'h' is user jagged [L, 8]"}},
        {L_UE "," L_UE16, ",\"inputs\":[\"ue\",\"ue16\"]",
         {"layer 'x': dot_interaction inputs need one width D: 'ue' has D=8, 'ue16' has D=16"}},
        {L_UE "," L_CT, ",\"inputs\":[\"ue\",\"cd\"]",
         {"layer 'x': dot_interaction inputs need one width D: 'ue' has D=8, 'cd' has D=16"}},
        {L_UE, ",\"inputs\":[\"ue\",\"ue\"],\"self\":1",
         {"layer 'x': 'layers[1].self' must be true or false"}},
        {L_UE, ",\"inputs\":[]", {"layer 'x': 'layers[1].inputs' must be a non-empty array"}},
        {L_UE, ",\"input\":\"ue\"", {"layer 'x': unknown key 'layers[1].input'"}},
        {L_UE, ",\"self\":true", {"layer 'x': missing key 'layers[1].inputs'"}},
    };
    REFUSE_X("dot_interaction", cases);
}

static void test_cross(void **state)
{
    (void)state;
    model_def *m = plan_ok(
        L_UE "," L_CT ","
        "{\"name\":\"x1\",\"op\":\"cross\",\"x0\":\"ue\",\"input\":\"ue\"},"
        "{\"name\":\"x2\",\"op\":\"cross\",\"x0\":\"ue\",\"input\":\"x1\"},"
        "{\"name\":\"x3\",\"op\":\"cross\",\"x0\":\"cd\",\"input\":\"cd\",\"rank\":3},"
        "{\"name\":\"x4\",\"op\":\"cross\",\"x0\":\"candidate.dense\",\"input\":"
        "\"candidate.dense\",\"rank\":1}");
    shape_is(m, "x1", MD_USER, MD_VEC, 1, 8);
    shape_is(m, "x2", MD_USER, MD_VEC, 1, 8);
    shape_is(m, "x3", MD_CAND, MD_VEC, 1, 16);
    shape_is(m, "x4", MD_CAND, MD_VEC, 1, 4);
    const md_layer *x2 = L(m, "x2");
    assert_int_equal(x2->rank, 0);
    assert_int_equal(x2->n_in, 2);
    assert_int_equal(x2->in[0].index, 0); /* x0 = ue */
    assert_int_equal(x2->in[1].index, 3); /* input = x1 */
    assert_int_equal(x2->n_w, 2);
    weight_is(m, "x1", 0, "x1.weight", 8, 8);
    weight_is(m, "x1", 1, "x1.bias", 1, 8);
    assert_true(L(m, "x1")->w[1].one_d);
    assert_int_equal(L(m, "x3")->rank, 3);
    assert_int_equal(L(m, "x3")->n_w, 3);
    weight_is(m, "x3", 0, "x3.u", 16, 3);
    weight_is(m, "x3", 1, "x3.v", 3, 16);
    weight_is(m, "x3", 2, "x3.bias", 1, 16);
    assert_true(L(m, "x3")->w[2].one_d && !L(m, "x3")->w[0].one_d);
    assert_int_equal(L(m, "x4")->rank, 1);
    weight_is(m, "x4", 0, "x4.u", 4, 1);
    weight_is(m, "x4", 1, "x4.v", 1, 4);
    model_def_free(m);

    static const struct bad_x cases[] = {
        {L_UE "," L_UE16, ",\"x0\":\"ue\",\"input\":\"ue16\"",
         {"layer 'x': cross x0 'ue' is user vec [8] and input 'ue16' is user vec [16]; both "
          "must be vectors [F] of one F"}},
        {L_UT, ",\"x0\":\"ut\",\"input\":\"ut\"",
         {"layer 'x': cross x0 'ut' is user tokens [4, 8] and input 'ut' is user tokens [4, 8]"}},
        {L_H, ",\"x0\":\"h\",\"input\":\"h\"", {"layer 'x': cross x0 'h' is user jagged [L, 8]"}},
        {L_UE, ",\"x0\":\"ue\",\"input\":\"ue\",\"rank\":0",
         {"layer 'x': 'layers[1].rank' must be an integer in [1, 2147483647], got 0"}},
        {L_UE, ",\"x0\":\"ue\",\"input\":\"ue\",\"rank\":\"2\"",
         {"layer 'x': 'layers[1].rank' must be an integer, got string"}},
        {L_UE, ",\"input\":\"ue\"", {"layer 'x': missing key 'layers[1].x0'"}},
        {L_UE, ",\"x0\":\"ue\"", {"layer 'x': missing key 'layers[1].input'"}},
        {L_UE, ",\"x0\":\"ue\",\"input\":\"ue\",\"out\":8",
         {"layer 'x': unknown key 'layers[1].out'"}},
    };
    REFUSE_X("cross", cases);
}

static void test_mixture(void **state)
{
    (void)state;
#define L_EXPERTS                                                                              \
    "{\"name\":\"e1\",\"op\":\"linear\",\"input\":\"user.dense\",\"out\":4},"                  \
    "{\"name\":\"e2\",\"op\":\"linear\",\"input\":\"user.dense\",\"out\":4},"                  \
    "{\"name\":\"e3\",\"op\":\"linear\",\"input\":\"user.dense\",\"out\":4},"                  \
    "{\"name\":\"g3\",\"op\":\"linear\",\"input\":\"user.dense\",\"out\":3},"                  \
    "{\"name\":\"cg2\",\"op\":\"linear\",\"input\":\"candidate.dense\",\"out\":2}"
    model_def *m = plan_ok(
        L_EXPERTS "," L_CT ","
        "{\"name\":\"m1\",\"op\":\"mixture\",\"experts\":[\"e1\",\"e2\",\"e3\"],\"gate\":\"g3\"},"
        "{\"name\":\"m2\",\"op\":\"mixture\",\"experts\":[\"cd\",\"cd\"],\"gate\":\"cg2\"},"
        "{\"name\":\"g1\",\"op\":\"linear\",\"input\":\"candidate.dense\",\"out\":1},"
        "{\"name\":\"m3\",\"op\":\"mixture\",\"experts\":[\"candidate.dense\"],\"gate\":\"g1\"}");
    shape_is(m, "m1", MD_USER, MD_VEC, 1, 4);
    shape_is(m, "m2", MD_CAND, MD_VEC, 1, 16);
    shape_is(m, "m3", MD_CAND, MD_VEC, 1, 4);
    const md_layer *m1 = L(m, "m1");
    assert_int_equal(m1->n_in, 4); /* experts..., then gate */
    assert_int_equal(m1->in[0].index, 0);
    assert_int_equal(m1->in[1].index, 1);
    assert_int_equal(m1->in[2].index, 2);
    assert_int_equal(m1->in[3].index, 3);
    assert_int_equal(m1->n_w, 0);
    model_def_free(m);

    /* 64 experts is the most */
    char *ls = fmt(L_CE ",{\"name\":\"g\",\"op\":\"linear\",\"input\":\"candidate.dense\",\"out\":"
                   "64},{\"name\":\"x\",\"op\":\"mixture\",\"experts\":[%s],\"gate\":\"g\"}",
                   refs("ce", 64));
    m = plan_ok(ls);
    shape_is(m, "x", MD_CAND, MD_VEC, 1, 8);
    assert_int_equal(L(m, "x")->n_in, 65);
    model_def_free(m);
    free(ls);
    ls = fmt(L_CE ",{\"name\":\"g\",\"op\":\"linear\",\"input\":\"candidate.dense\",\"out\":65},"
             "{\"name\":\"x\",\"op\":\"mixture\",\"experts\":[%s],\"gate\":\"g\"}",
             refs("ce", 65));
    plan_err(ls, "layer 'x': mixture has 65 experts; at most 64");
    free(ls);

    static const struct bad_x cases[] = {
        {L_EXPERTS, ",\"experts\":[\"e1\",\"e2\"],\"gate\":\"g3\"",
         {"layer 'x': mixture gate 'g3' is user vec [3]; it must be a vector [2], one logit "
          "per expert"}},
        {L_EXPERTS "," L_UE, ",\"experts\":[\"e1\",\"ue\"],\"gate\":\"g3\"",
         {"layer 'x': mixture expert 'ue' is user vec [8]; experts must be vectors [F] of one "
          "F (the first is [4])"}},
        {L_EXPERTS "," L_UT, ",\"experts\":[\"ut\",\"ut\",\"ut\"],\"gate\":\"g3\"",
         {"layer 'x': mixture expert 'ut' is user tokens [4, 8]"}},
        {L_EXPERTS "," L_H, ",\"experts\":[\"e1\",\"h\"],\"gate\":\"g3\"",
         {"layer 'x': mixture expert 'h' is user jagged [L, 8]"}},
        {L_EXPERTS "," L_UT ",{\"name\":\"r\",\"op\":\"reshape\",\"input\":\"g3\",\"tokens\":3}",
         ",\"experts\":[\"e1\",\"e2\",\"e3\"],\"gate\":\"r\"",
         {"layer 'x': mixture gate 'r' is user tokens [3, 1]"}},
        {L_EXPERTS, ",\"experts\":[],\"gate\":\"g3\"",
         {"layer 'x': 'layers[5].experts' must be a non-empty array"}},
        {L_EXPERTS, ",\"experts\":\"e1\",\"gate\":\"g3\"", {"layer 'x': 'layers[5].experts' must be"}},
        {L_EXPERTS, ",\"experts\":[\"e1\",\"e2\",\"e3\"]", {"layer 'x': missing key 'layers[5].gate'"}},
        {L_EXPERTS, ",\"gate\":\"g3\"", {"layer 'x': missing key 'layers[5].experts'"}},
        {L_EXPERTS, ",\"experts\":[\"e1\",\"e2\",\"e3\"],\"gate\":\"g3\",\"inputs\":[\"e1\"]",
         {"layer 'x': unknown key 'layers[5].inputs'"}},
    };
    REFUSE_X("mixture", cases);
}

static void test_pool(void **state)
{
    (void)state;
    model_def *m = plan_ok(
        L_UT "," L_H "," L_CT ","
        "{\"name\":\"p1\",\"op\":\"pool\",\"input\":\"ut\",\"fn\":\"mean\"},"
        "{\"name\":\"p2\",\"op\":\"pool\",\"input\":\"h\",\"fn\":\"sum\"},"
        "{\"name\":\"p3\",\"op\":\"pool\",\"input\":\"h\",\"fn\":\"max\"},"
        "{\"name\":\"p4\",\"op\":\"pool\",\"input\":\"h\",\"fn\":\"last\"},"
        "{\"name\":\"p5\",\"op\":\"pool\",\"input\":\"ct\",\"fn\":\"last\"}");
    shape_is(m, "p1", MD_USER, MD_VEC, 1, 8);
    shape_is(m, "p2", MD_USER, MD_VEC, 1, 8);
    shape_is(m, "p3", MD_USER, MD_VEC, 1, 8);
    shape_is(m, "p4", MD_USER, MD_VEC, 1, 8);
    shape_is(m, "p5", MD_CAND, MD_VEC, 1, 8);
    assert_int_equal(L(m, "p1")->pooling, BK_POOL_MEAN);
    assert_int_equal(L(m, "p2")->pooling, BK_POOL_SUM);
    assert_int_equal(L(m, "p3")->pooling, BK_POOL_MAX);
    assert_int_equal(L(m, "p4")->pooling, BK_POOL_LAST);
    assert_int_equal(L(m, "p5")->pooling, BK_POOL_LAST);
    assert_int_equal(L(m, "p1")->n_w, 0);
    model_def_free(m);

    static const struct bad_x cases[] = {
        {L_UE, ",\"input\":\"ue\",\"fn\":\"sum\"",
         {"layer 'x': pool input 'ue' is user vec [8]; pool takes tokens [K, D] or a jagged "
          "history"}},
        {"", ",\"input\":\"candidate.dense\",\"fn\":\"sum\"",
         {"layer 'x': pool input 'candidate.dense' is candidate vec [4]"}},
        {L_H, ",\"input\":\"h\"", {"layer 'x': missing key 'layers[1].fn'"}},
        {L_H, ",\"input\":\"h\",\"fn\":\"avg\"",
         {"layer 'x': 'layers[1].fn' must be \"sum\", \"mean\", \"max\" or \"last\", got 'avg'"}},
        {L_H, ",\"input\":\"h\",\"fn\":\"first\"",
         {"layer 'x': 'layers[1].fn' must be ", "got 'first'"}},
        {L_H, ",\"input\":\"h\",\"fn\":0", {"layer 'x': 'layers[1].fn' must be a string"}},
        {L_H, ",\"input\":\"h\",\"fn\":\"sum\",\"pooling\":\"sum\"",
         {"layer 'x': unknown key 'layers[1].pooling'"}},
        {"", ",\"input\":\"user.history\",\"fn\":\"sum\"",
         {"layer 'x': input 'user.history' is the raw history"}},
    };
    REFUSE_X("pool", cases);
}

/* Every op that takes one domain refuses a mix, naming the layer; mul and
 * dot_interaction accept it and give the candidate domain. */
static void test_new_mixes(void **state)
{
    (void)state;
    plan_err(L_UE "," L_CE ",{\"name\":\"x\",\"op\":\"concat\",\"inputs\":[\"ue\",\"ce\"]}",
             "layer 'x': " MIX_MSG("concat"));
    plan_err(L_CE ",{\"name\":\"x\",\"op\":\"concat\",\"inputs\":[\"ce\",\"user.dense\"]}",
             "layer 'x': " MIX_MSG("concat"));
    plan_err(L_UE "," L_CE ",{\"name\":\"x\",\"op\":\"stack\",\"inputs\":[\"ce\",\"ce\",\"ue\"]}",
             "layer 'x': " MIX_MSG("stack"));
    plan_err(L_UE "," L_CE ",{\"name\":\"x\",\"op\":\"cross\",\"x0\":\"ue\",\"input\":\"ce\"}",
             "layer 'x': " MIX_MSG("cross"));
    plan_err(L_UE "," L_CE ",{\"name\":\"x\",\"op\":\"cross\",\"x0\":\"ce\",\"input\":\"ue\","
                           "\"rank\":2}",
             "layer 'x': " MIX_MSG("cross"));
    /* a user gate over candidate experts, and mixed experts */
    plan_err(L_EXPERTS "," L_CT ",{\"name\":\"x\",\"op\":\"mixture\",\"experts\":[\"cd\",\"cd\","
                              "\"cd\"],\"gate\":\"g3\"}",
             "layer 'x': " MIX_MSG("mixture"));
    plan_err(L_EXPERTS "," L_CE ",{\"name\":\"x\",\"op\":\"mixture\",\"experts\":[\"ce\","
                              "\"user.dense\"],\"gate\":\"cg2\"}",
             "layer 'x': " MIX_MSG("mixture"));
    model_def *m = plan_ok(
        L_UE "," L_CE "," L_UT "," L_CT ","
        "{\"name\":\"m\",\"op\":\"mul\",\"a\":\"ue\",\"b\":\"ce\"},"
        "{\"name\":\"d\",\"op\":\"dot_interaction\",\"inputs\":[\"ut\",\"ct\",\"ue\"]},"
        "{\"name\":\"d2\",\"op\":\"dot_interaction\",\"inputs\":[\"ue\",\"ce\"]}");
    shape_is(m, "m", MD_CAND, MD_VEC, 1, 8);
    shape_is(m, "d", MD_CAND, MD_VEC, 1, 21);
    shape_is(m, "d2", MD_CAND, MD_VEC, 1, 1);
    model_def_free(m);
}

static void test_unknown_op_lists_all(void **state)
{
    (void)state;
    plan_err(L_UE ",{\"name\":\"x\",\"op\":\"softmax\",\"input\":\"ue\"}",
             "layer 'x': unknown op 'softmax' (ops: embedding_bag, history_embedding, mean_pool, "
             "linear, reshape, stack, flatten, target_attention, lce, add, activation, "
             "layer_norm, concat, mul, token_linear, dot_interaction, cross, mixture, pool, self_attention, din_attention)");
    plan_err(L_UE ",{\"name\":\"x\",\"op\":\"Pool\",\"input\":\"ue\"}",
             "layer 'x': unknown op 'Pool'");
    plan_err(L_UE ",{\"name\":\"x\",\"op\":3,\"input\":\"ue\"}",
             "layer 'x': 'layers[1].op' must be a string");
}

/* fx_check_model (loader_fixture.h) is an independent check of plans: it
 * must refuse each of these one-field corruptions of a good plan. */
static void test_checker_catches(void **state)
{
    (void)state;
    model_def *m = plan_ok(
        L_UE "," L_CE "," L_UT "," L_CT ","
        "{\"name\":\"d\",\"op\":\"dot_interaction\",\"inputs\":[\"ue\",\"ut\",\"ce\"]},"
        "{\"name\":\"x\",\"op\":\"cross\",\"x0\":\"cd\",\"input\":\"cd\",\"rank\":3},"
        "{\"name\":\"g\",\"op\":\"linear\",\"input\":\"candidate.dense\",\"out\":2},"
        "{\"name\":\"mx\",\"op\":\"mixture\",\"experts\":[\"ce\",\"ce\"],\"gate\":\"g\"},"
        "{\"name\":\"n\",\"op\":\"layer_norm\",\"input\":\"ut\"},"
        "{\"name\":\"p\",\"op\":\"pool\",\"input\":\"ut\",\"fn\":\"max\"},"
        "{\"name\":\"a\",\"op\":\"activation\",\"input\":\"ct\",\"fn\":\"tanh\"},"
        "{\"name\":\"tl\",\"op\":\"linear\",\"input\":\"ct\",\"out\":3},"
        "{\"name\":\"c\",\"op\":\"concat\",\"inputs\":[\"ce\",\"cd\"]},"
        "{\"name\":\"mu\",\"op\":\"mul\",\"a\":\"ue\",\"b\":\"ce\"},"
        "{\"name\":\"k\",\"op\":\"token_linear\",\"input\":\"ut\",\"out_tokens\":2}");
    char why[256];
    md_layer *l;
    md_weight tw;
    md_ref tr;
#define MUST_CATCH(what, corrupt, restore)                                                      \
    do {                                                                                       \
        corrupt;                                                                               \
        if (fx_check_model(m, 0, why, sizeof why) == 0)                                        \
            fail_msg("checker missed: %s", what);                                              \
        restore;                                                                               \
        if (fx_check_model(m, 0, why, sizeof why))                                             \
            fail_msg("restore after %s: %s", what, why);                                       \
    } while (0)
    l = (md_layer *)L(m, "d");
    MUST_CATCH("dot pairs", l->dim--, l->dim++);
    MUST_CATCH("dot self", l->self = 1, l->self = 0);
    MUST_CATCH("dot domain", l->domain = MD_USER, l->domain = MD_CAND);
    l = (md_layer *)L(m, "x");
    MUST_CATCH("cross u/v order", (tw = l->w[0], l->w[0] = l->w[1], l->w[1] = tw),
               (tw = l->w[0], l->w[0] = l->w[1], l->w[1] = tw));
    MUST_CATCH("cross rank", l->rank = 0, l->rank = 3);
    MUST_CATCH("cross bias 1-D", l->w[2].one_d = 0, l->w[2].one_d = 1);
    l = (md_layer *)L(m, "mx");
    MUST_CATCH("mixture gate last", (tr = l->in[0], l->in[0] = l->in[2], l->in[2] = tr),
               (tr = l->in[0], l->in[0] = l->in[2], l->in[2] = tr));
    MUST_CATCH("mixture width", l->dim = 2, l->dim = 8);
    l = (md_layer *)L(m, "n");
    MUST_CATCH("layer_norm eps", l->eps = 0, l->eps = 1e-5f);
    MUST_CATCH("layer_norm kind", l->kind = MD_VEC, l->kind = MD_TOKENS);
    MUST_CATCH("layer_norm weight", l->w[0].cols = 32, l->w[0].cols = 8);
    l = (md_layer *)L(m, "p");
    MUST_CATCH("pool fn", l->pooling = (enum bk_pool)7, l->pooling = BK_POOL_MAX);
    l = (md_layer *)L(m, "a");
    MUST_CATCH("activation none", l->act = BK_ACT_NONE, l->act = BK_ACT_TANH);
    MUST_CATCH("activation tokens", l->tokens = 1, l->tokens = 2);
    l = (md_layer *)L(m, "tl");
    MUST_CATCH("linear tokens", l->tokens = 1, l->tokens = 2);
    MUST_CATCH("linear weight", l->w[0].cols = 16, l->w[0].cols = 8);
    l = (md_layer *)L(m, "c");
    MUST_CATCH("concat width", l->dim++, l->dim--);
    MUST_CATCH("concat mix", l->in[0].index = 0, l->in[0].index = 1); /* ue for ce */
    l = (md_layer *)L(m, "mu");
    MUST_CATCH("mul domain", l->domain = MD_USER, l->domain = MD_CAND);
    l = (md_layer *)L(m, "k");
    MUST_CATCH("token_linear weight", l->w[0].cols = 1, l->w[0].cols = 4);
    MUST_CATCH("token_linear D", l->dim = 4, l->dim = 8);
#undef MUST_CATCH
    model_def_free(m);
}

/* md_ops[] (engine/op.h): one well-formed entry per enum md_op. */
static void test_op_table(void **state)
{
    (void)state;
    for (int k = 0; k < MD_OP_COUNT; k++) {
        const md_op_def *d = md_ops[k];
        assert_non_null(d);
        assert_non_null(d->name);
        assert_true(d->name[0] != 0);
        assert_non_null(d->plan);
        assert_non_null(d->run);
        assert_non_null(d->keys);
        int has_name = 0, has_op = 0, n = 0;
        for (const char *const *kk = d->keys; *kk; kk++, n++) {
            has_name |= strcmp(*kk, "name") == 0;
            has_op |= strcmp(*kk, "op") == 0;
            for (const char *const *k2 = d->keys; k2 != kk; k2++)
                if (strcmp(*k2, *kk) == 0)
                    fail_msg("op %s lists key %s twice", d->name, *kk);
        }
        if (!has_name || !has_op || n < 3)
            fail_msg("op %s: keys must include name, op and an input", d->name);
        for (int j = 0; j < k; j++)
            if (strcmp(md_ops[j]->name, d->name) == 0)
                fail_msg("op name %s twice (md_ops[%d] and [%d])", d->name, j, k);
        assert_int_equal(md_op_find(d->name), k);
        /* views are single-input shape changes; only gathers gather */
        if (d->flags & OP_GATHERS)
            assert_true(k == MD_STACK || k == MD_CONCAT);
    }
    assert_int_equal(md_op_find("nope"), -1);
    assert_int_equal(md_op_find(""), -1);
    /* the table in enum order, by name (model.h's enum and the format's names) */
    static const char *const names[MD_OP_COUNT] = {
        [MD_EMBEDDING_BAG] = "embedding_bag", [MD_HISTORY_EMBEDDING] = "history_embedding",
        [MD_MEAN_POOL] = "mean_pool",         [MD_LINEAR] = "linear",
        [MD_RESHAPE] = "reshape",             [MD_STACK] = "stack",
        [MD_FLATTEN] = "flatten",             [MD_TARGET_ATTENTION] = "target_attention",
        [MD_LCE] = "lce",                     [MD_ADD] = "add",
        [MD_ACTIVATION] = "activation",       [MD_LAYER_NORM] = "layer_norm",
        [MD_CONCAT] = "concat",               [MD_MUL] = "mul",
        [MD_TOKEN_LINEAR] = "token_linear",   [MD_DOT_INTERACTION] = "dot_interaction",
        [MD_CROSS] = "cross",                 [MD_MIXTURE] = "mixture",
        [MD_POOL] = "pool",                   [MD_SELF_ATTENTION] = "self_attention",
        [MD_DIN_ATTENTION] = "din_attention", [MD_BROADCAST] = "broadcast",
        [MD_MLP2] = "mlp2",
    };
    char list[512];
    size_t o = 0;
    for (int k = 0; k < MD_OP_COUNT; k++) {
        assert_non_null(names[k]);
        assert_string_equal(md_ops[k]->name, names[k]);
        assert_non_null(md_ops[k]->cost);
        /* the list in messages: the ops model.json may name (not the planner's own) */
        if (!(md_ops[k]->flags & OP_INTERNAL))
            o += (size_t)snprintf(list + o, sizeof list - o, "%s%s", o ? ", " : "", names[k]);
    }
    assert_true(md_ops[MD_BROADCAST]->flags & OP_INTERNAL);
    assert_true(md_ops[MD_MLP2]->flags & OP_INTERNAL);
    assert_string_equal(md_op_list(), list);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_user_chain_stays_user),
        cmocka_unit_test(test_candidate_chain),
        cmocka_unit_test(test_refused_mixes),
        cmocka_unit_test(test_lce),
        cmocka_unit_test(test_lce_vec_operands),
        cmocka_unit_test(test_lce_refused),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_attention_refused),
        cmocka_unit_test(test_self_attention),
        cmocka_unit_test(test_self_attention_refused),
        cmocka_unit_test(test_din_attention),
        cmocka_unit_test(test_din_attention_refused),
        cmocka_unit_test(test_add),
        cmocka_unit_test(test_add_refused),
        cmocka_unit_test(test_stack_refused),
        cmocka_unit_test(test_kind_errors),
        cmocka_unit_test(test_refs_and_misc),
        cmocka_unit_test(test_activation),
        cmocka_unit_test(test_layer_norm),
        cmocka_unit_test(test_layer_norm_eps_underflow),
        cmocka_unit_test(test_concat),
        cmocka_unit_test(test_mul),
        cmocka_unit_test(test_jagged_add_and_linear),
        cmocka_unit_test(test_token_linear),
        cmocka_unit_test(test_dot_interaction),
        cmocka_unit_test(test_cross),
        cmocka_unit_test(test_mixture),
        cmocka_unit_test(test_pool),
        cmocka_unit_test(test_new_mixes),
        cmocka_unit_test(test_unknown_op_lists_all),
        cmocka_unit_test(test_checker_catches),
        cmocka_unit_test(test_op_table),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
