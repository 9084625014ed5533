/* test_planner.c - shape and batch-domain inference of the model planner.
 *
 * Small models share one input/table header; each test lists layers and
 * checks the inferred domain/kind/shape per op, the weights each op expects,
 * and that every domain mix outside lce/target_attention/add is refused with
 * a message naming the layer. Accepted plans are also loaded end to end with
 * weights generated from the plan (model_def_parse must agree).
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

static void plan_err_(const char *layers, ...)
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
    va_list ap;
    va_start(ap, layers);
    for (const char *s = va_arg(ap, const char *); s; s = va_arg(ap, const char *))
        if (!strstr(e.msg, s))
            fail_msg("message lacks \"%s\": %s", s, e.msg);
    va_end(ap);
    free(j);
}
#define plan_err(layers, ...) plan_err_((layers), __VA_ARGS__, (const char *)NULL)

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
    const char *msg = "cannot mix user and candidate inputs; only lce, target_attention, add, mul "
                      "and dot_interaction read user rows through the map";
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
    plan_err(L_UT "," L_CT ",{\"name\":\"x\",\"op\":\"lce\",\"user\":\"ct\",\"candidate\":\"ct\","
                           "\"out_tokens\":3}",
             "layer 'x': lce user operand 'ct' is candidate tokens [2, 8]; it must be user-domain");
    plan_err(L_UT "," L_CT ",{\"name\":\"x\",\"op\":\"lce\",\"user\":\"ut\",\"candidate\":\"ut\","
                           "\"out_tokens\":3}",
             "layer 'x': lce candidate operand 'ut' is user tokens [4, 8]; it must be "
             "candidate-domain");
    plan_err(L_H "," L_CT ",{\"name\":\"x\",\"op\":\"lce\",\"user\":\"h\",\"candidate\":\"ct\","
                          "\"out_tokens\":3}",
             "layer 'x': lce user operand 'h' is user jagged [L, 8]");
    plan_err(L_UE16 "," L_CT ",{\"name\":\"x\",\"op\":\"lce\",\"user\":\"ue16\",\"candidate\":"
                             "\"ct\",\"out_tokens\":3}",
             "layer 'x': lce user operand 'ue16' has D=16, candidate operand 'ct' has D=8");
    plan_err(L_UT "," L_CT ",{\"name\":\"x\",\"op\":\"lce\",\"user\":\"ut\",\"candidate\":\"ct\"}",
             "layer 'x': missing key 'layers[4].out_tokens'");
    plan_err(L_UT "," L_CT ",{\"name\":\"x\",\"op\":\"lce\",\"user\":\"ut\",\"candidate\":\"ct\","
                           "\"out_tokens\":300000000}",
             "layer 'x': lce output [300000000, 8] is too wide");
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
             "layer 'a': target_attention query 'ut' is user tokens [4, 8]; it must be "
             "candidate-domain");
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
    plan_err(L_UT "," L_UE ",{\"name\":\"x\",\"op\":\"add\",\"inputs\":[\"ut\",\"ue\"]}",
             "layer 'x': add operands must have equal shapes: 'ut' is user tokens [4, 8], 'ue' is "
             "user vec [8]");
    plan_err(L_UE "," L_UE16 ",{\"name\":\"x\",\"op\":\"add\",\"inputs\":[\"ue\",\"ue16\"]}",
             "layer 'x': add operands must have equal shapes");
    plan_err(L_UE "," L_CT ",{\"name\":\"x\",\"op\":\"add\",\"inputs\":[\"ue\",\"cd\"]}",
             "layer 'x': add operands must have equal shapes: 'ue' is user vec [8], 'cd' is "
             "candidate vec [16]");
    plan_err(L_H "," L_UE ",{\"name\":\"x\",\"op\":\"add\",\"inputs\":[\"h\",\"ue\"]}",
             "layer 'x': add operands must have equal shapes: 'h' is user jagged [L, 8], 'ue' is "
             "user vec [8]");
    plan_err(L_UE ",{\"name\":\"x\",\"op\":\"add\",\"inputs\":[\"ue\",\"ue\",\"ue\"]}",
             "layer 'x': 'layers[1].inputs' must list exactly two inputs [a, b], got 3");
    plan_err(L_UE ",{\"name\":\"x\",\"op\":\"add\",\"inputs\":[\"ue\"]}",
             "must list exactly two inputs [a, b], got 1");
    plan_err(L_UE ",{\"name\":\"x\",\"op\":\"add\",\"a\":\"ue\"}",
             "layer 'x': missing key 'layers[1].b'");
    plan_err(L_UE ",{\"name\":\"x\",\"op\":\"add\",\"a\":\"ue\",\"b\":\"ue\",\"inputs\":[\"ue\","
                  "\"ue\"]}",
             "layer 'x': add takes either 'inputs': [a, b] or 'a' and 'b', not both");
    plan_err(L_UE ",{\"name\":\"x\",\"op\":\"add\"}", "layer 'x': missing key 'layers[1].inputs'");
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
        cmocka_unit_test(test_add),
        cmocka_unit_test(test_add_refused),
        cmocka_unit_test(test_stack_refused),
        cmocka_unit_test(test_kind_errors),
        cmocka_unit_test(test_refs_and_misc),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
