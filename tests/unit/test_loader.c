/* test_loader.c - model_def_load / model_def_parse: schema, safetensors,
 * weights, and the error text of every refusal.
 *
 * Models are built in memory (loader_fixture.h): the MODEL_FORMAT.md example
 * with hand-computed tensor shapes, damaged one way per test; each refusal
 * asserts the message names the file and the layer/tensor/key at fault.
 */
#define _GNU_SOURCE /* mkdtemp */
#include <fcntl.h>
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

#include "engine/json_schema.h"
#include "engine/model.h"
#include "engine/safetensors.h"
#include "tests/unit/loader_fixture.h"

#define DIR "models/ex/1"
#define JFILE DIR "/model.json"
#define WFILE DIR "/weights.safetensors"

/* ---------------------------------------------------------------- helpers */

static model_def *parse_ok(const char *json, const uint8_t *st, size_t st_len)
{
    bk_err e;
    model_def *m = NULL;
    memset(&e, 0, sizeof e);
    int rc = model_def_parse(DIR, json, strlen(json), st, st_len, &m, &e);
    if (rc != 0)
        fail_msg("unexpected load error: %s", e.msg);
    assert_non_null(m);
    char why[256];
    if (fx_check_model(m, 1, why, sizeof why))
        fail_msg("inconsistent model_def: %s", why);
    return m;
}

/* Asserts the load fails and the one-line message starts with `file` and
 * contains every substring given (NULL-terminated). */
static void check_err_msg(const char *msg, const char *file, va_list ap)
{
    if (strncmp(msg, file, strlen(file)) != 0)
        fail_msg("message does not start with %s: %s", file, msg);
    if (strchr(msg, '\n'))
        fail_msg("message is not one line: %s", msg);
    for (const char *s = va_arg(ap, const char *); s; s = va_arg(ap, const char *))
        if (!strstr(msg, s))
            fail_msg("message lacks \"%s\": %s", s, msg);
}

static void parse_err(const char *json, size_t json_len, const uint8_t *st, size_t st_len,
                      const char *file, ...)
{
    bk_err e;
    model_def *sentinel = (model_def *)(uintptr_t)0x1234, *m = sentinel;
    memset(&e, 0, sizeof e);
    int rc = model_def_parse(DIR, json, json_len, st, st_len, &m, &e);
    if (rc == 0) {
        model_def_free(m);
        fail_msg("model loaded but should have been refused");
    }
    assert_int_equal(rc, -1);
    assert_ptr_equal(m, sentinel); /* *out untouched on failure */
    va_list ap;
    va_start(ap, file);
    check_err_msg(e.msg, file, ap);
    va_end(ap);
}

#define JSON_ERR(json, ...)                                                                    \
    do {                                                                                       \
        size_t wl_;                                                                            \
        uint8_t *w_ = fx_example_weights(NULL, &wl_);                                          \
        parse_err((json), strlen(json), w_, wl_, JFILE, __VA_ARGS__, (const char *)NULL);      \
        free(w_);                                                                              \
    } while (0)

#define WEIGHTS_ERR(st, st_len, ...)                                                           \
    parse_err(FX_EXAMPLE_JSON, strlen(FX_EXAMPLE_JSON), (st), (st_len), WFILE, __VA_ARGS__,    \
              (const char *)NULL)

/* The example with `find` replaced by `repl`, refused with the substrings. */
#define EX_ERR(find, repl, ...)                                                                \
    do {                                                                                       \
        char *j_ = fx_replace(FX_EXAMPLE_JSON, (find), (repl));                                \
        if (!j_)                                                                               \
            fail_msg("fixture: '%s' not found exactly once", (find));                          \
        JSON_ERR(j_, __VA_ARGS__);                                                             \
        free(j_);                                                                              \
    } while (0)

static int layer_index(const model_def *m, const char *name)
{
    for (int i = 0; i < m->n_layers; i++)
        if (strcmp(m->layers[i].name, name) == 0)
            return i;
    fail_msg("no layer %s", name);
    return -1;
}

static void assert_layer(const model_def *m, const char *name, enum md_op op,
                         enum md_domain dom, enum md_kind kind, int tokens, int dim)
{
    const md_layer *l = &m->layers[layer_index(m, name)];
    if (l->op != op || l->domain != dom || l->kind != kind || l->tokens != tokens ||
        l->dim != dim)
        fail_msg("layer %s: op %d domain %d kind %d tokens %d dim %d; expected %d %d %d %d %d",
                 name, l->op, l->domain, l->kind, l->tokens, l->dim, op, dom, kind, tokens, dim);
}

static const md_weight *find_weight(const model_def *m, const char *name)
{
    for (int t = 0; t < m->n_tables; t++)
        if (strcmp(m->tables[t].w.name, name) == 0)
            return &m->tables[t].w;
    for (int i = 0; i < m->n_layers; i++)
        for (int j = 0; j < m->layers[i].n_w; j++)
            if (strcmp(m->layers[i].w[j].name, name) == 0)
                return &m->layers[i].w[j];
    return NULL;
}

/* ------------------------------------------------------- the good example */

static void check_example(const model_def *m)
{
    assert_string_equal(m->dir, DIR);
    assert_null(m->name);
    assert_int_equal(m->user_dense, 8);
    assert_int_equal(m->cand_dense, 4);
    assert_int_equal(m->n_user_sparse, 2);
    assert_string_equal(m->user_sparse[0], "country");
    assert_string_equal(m->user_sparse[1], "lang");
    assert_int_equal(m->n_cand_sparse, 2);
    assert_string_equal(m->cand_sparse[1], "author");
    assert_true(m->has_history);
    assert_int_equal(m->hist_max_len, 64);
    assert_int_equal(m->hist_actions, 4);
    assert_int_equal(m->n_tables, 4);
    assert_string_equal(m->tables[0].name, "item"); /* file order */
    assert_int_equal(m->tables[0].rows, 5000);
    assert_string_equal(m->tables[3].name, "lang");
    assert_int_equal(m->n_layers, 19);

    assert_layer(m, "u_country", MD_EMBEDDING_BAG, MD_USER, MD_VEC, 1, 32);
    assert_layer(m, "u_lang", MD_EMBEDDING_BAG, MD_USER, MD_VEC, 1, 32);
    assert_layer(m, "u_dense1", MD_LINEAR, MD_USER, MD_VEC, 1, 64);
    assert_layer(m, "u_dense2", MD_LINEAR, MD_USER, MD_VEC, 1, 64);
    assert_layer(m, "u_dense", MD_RESHAPE, MD_USER, MD_TOKENS, 2, 32);
    assert_layer(m, "hist", MD_HISTORY_EMBEDDING, MD_USER, MD_JAGGED, 1, 32);
    assert_layer(m, "hist_mean", MD_MEAN_POOL, MD_USER, MD_VEC, 1, 32);
    assert_layer(m, "e_user", MD_STACK, MD_USER, MD_TOKENS, 5, 32);
    assert_layer(m, "c_item", MD_EMBEDDING_BAG, MD_CAND, MD_VEC, 1, 32);
    assert_layer(m, "c_author", MD_EMBEDDING_BAG, MD_CAND, MD_VEC, 1, 32);
    assert_layer(m, "c_dense1", MD_LINEAR, MD_CAND, MD_VEC, 1, 64);
    assert_layer(m, "c_dense", MD_RESHAPE, MD_CAND, MD_TOKENS, 2, 32);
    assert_layer(m, "x_cand", MD_STACK, MD_CAND, MD_TOKENS, 4, 32);
    assert_layer(m, "ta", MD_TARGET_ATTENTION, MD_CAND, MD_TOKENS, 4, 32);
    assert_layer(m, "e_cand", MD_STACK, MD_CAND, MD_TOKENS, 8, 32);
    assert_layer(m, "lce", MD_LCE, MD_CAND, MD_TOKENS, 6, 32);
    assert_layer(m, "flat", MD_FLATTEN, MD_CAND, MD_VEC, 1, 192);
    assert_layer(m, "top1", MD_LINEAR, MD_CAND, MD_VEC, 1, 64);
    assert_layer(m, "logits", MD_LINEAR, MD_CAND, MD_VEC, 1, 2);

    /* references */
    const md_layer *l = &m->layers[layer_index(m, "u_lang")];
    assert_int_equal(l->in[0].src, MD_SRC_USER_SPARSE);
    assert_int_equal(l->in[0].index, 1);
    assert_int_equal(l->table, 3);
    assert_int_equal(l->pooling, BK_POOL_MEAN);
    l = &m->layers[layer_index(m, "c_author")];
    assert_int_equal(l->in[0].src, MD_SRC_CAND_SPARSE);
    assert_int_equal(l->in[0].index, 1);
    assert_int_equal(l->table, 1);
    assert_int_equal(l->pooling, BK_POOL_SUM);
    l = &m->layers[layer_index(m, "u_dense1")];
    assert_int_equal(l->in[0].src, MD_SRC_USER_DENSE);
    assert_int_equal(l->act, BK_ACT_RELU);
    l = &m->layers[layer_index(m, "c_dense1")];
    assert_int_equal(l->in[0].src, MD_SRC_CAND_DENSE);
    l = &m->layers[layer_index(m, "u_dense2")];
    assert_int_equal(l->act, BK_ACT_NONE);
    l = &m->layers[layer_index(m, "hist")];
    assert_int_equal(l->in[0].src, MD_SRC_USER_HISTORY);
    assert_int_equal(l->table, 0);
    l = &m->layers[layer_index(m, "e_user")];
    assert_int_equal(l->n_in, 4);
    assert_int_equal(l->in[3].src, MD_SRC_LAYER);
    assert_int_equal(l->in[3].index, layer_index(m, "hist_mean"));
    l = &m->layers[layer_index(m, "ta")];
    assert_int_equal(l->n_in, 2);
    assert_int_equal(l->in[0].index, layer_index(m, "x_cand"));
    assert_int_equal(l->in[1].index, layer_index(m, "hist"));
    assert_int_equal(l->heads, 2);
    assert_int_equal(l->head_dim, 16);
    l = &m->layers[layer_index(m, "lce")];
    assert_int_equal(l->in[0].index, layer_index(m, "e_user"));
    assert_int_equal(l->in[1].index, layer_index(m, "e_cand"));

    /* weights: names, shapes (bias as [1, out]) and values */
    for (int i = 0; i < FX_N_EXAMPLE_SPECS; i++) {
        const fx_spec *s = &FX_EXAMPLE_SPECS[i];
        const md_weight *w = find_weight(m, s->name);
        if (!w)
            fail_msg("weight %s not in model_def", s->name);
        int rows = s->cols < 0 ? 1 : (int)s->rows, cols = s->cols < 0 ? (int)s->rows : (int)s->cols;
        if (w->rows != rows || w->cols != cols)
            fail_msg("weight %s is [%d, %d], expected [%d, %d]", s->name, w->rows, w->cols, rows,
                     cols);
        assert_non_null(w->data);
        for (size_t k = 0; k < (size_t)rows * cols; k += 7)
            if (w->data[k] != fx_val(s->name, k))
                fail_msg("weight %s[%zu] = %g, expected %g", s->name, k, w->data[k],
                         fx_val(s->name, k));
    }
    const md_layer *lin = &m->layers[layer_index(m, "top1")];
    assert_int_equal(lin->n_w, 2);
    assert_string_equal(lin->w[0].name, "top1.weight");
    assert_string_equal(lin->w[1].name, "top1.bias");
    const md_layer *ta = &m->layers[layer_index(m, "ta")];
    assert_string_equal(ta->w[0].name, "ta.wq");
    assert_string_equal(ta->w[3].name, "ta.wo");

    assert_int_equal(m->logits_layer, 18);
    assert_int_equal(m->n_tasks, 2);
    assert_string_equal(m->tasks[0], "click");
    assert_string_equal(m->tasks[1], "like");
    assert_true(m->score_weights[0] == 1.0f && m->score_weights[1] == 0.5f);
    assert_true(m->serving.max_batch_candidates == -1 && m->serving.instances == -1);
    assert_string_equal(m->serving.mode, "");
    assert_string_equal(m->serving.device, "");
}

static void test_example_loads(void **state)
{
    (void)state;
    size_t n;
    uint8_t *w = fx_example_weights(NULL, &n);
    model_def *m = parse_ok(FX_EXAMPLE_JSON, w, n);
    check_example(m);
    model_def_free(m);
    free(w);
}

static void test_example_plan_only(void **state)
{
    (void)state;
    bk_err e = {{0}};
    model_def *m = NULL;
    assert_int_equal(model_def_plan(DIR, FX_EXAMPLE_JSON, strlen(FX_EXAMPLE_JSON), &m, &e), 0);
    char why[256];
    if (fx_check_model(m, 0, why, sizeof why))
        fail_msg("%s", why);
    const md_weight *w = find_weight(m, "top1.weight");
    assert_non_null(w);
    assert_int_equal(w->rows, 64);
    assert_int_equal(w->cols, 192);
    assert_null(w->data);
    /* The plan's expectations agree with the hand-computed example shapes. */
    size_t n;
    uint8_t *blob = fx_weights_for(m, "F32", &n);
    model_def *m2 = parse_ok(FX_EXAMPLE_JSON, blob, n);
    check_example(m2);
    model_def_free(m2);
    model_def_free(m);
    free(blob);
}

static void test_optional_fields(void **state)
{
    (void)state;
    char *j = fx_replace(
        FX_EXAMPLE_JSON, "\"format\": \"ikbo-model/1\",",
        "\"format\": \"ikbo-model/1\", \"name\": \"ranker\", \"description\": \"d\","
        "\"serving\": {\"max_batch_candidates\": 4096, \"max_batch_users\": 0, "
        "\"max_queue_delay_us\": 500, \"instances\": 2, \"mode\": \"broadcast\", "
        "\"device\": \"cuda:1\"},");
    char *j2 = fx_replace(j, ", \"score_weights\": [1.0, 0.5]", "");
    char *j3 = fx_replace(j2, ", \"actions\": 4}", "}");
    char *j4 = fx_replace(j3, ", \"activation\": \"none\"},\n    {\"name\": \"u_dense\"",
                          "},\n    {\"name\": \"u_dense\"");
    assert_non_null(j4);
    size_t n;
    fx_opts o = {.reshape = "hist.action", .rows = 1, .cols = 32}; /* actions default 1 */
    uint8_t *w = fx_example_weights(&o, &n);
    model_def *m = parse_ok(j4, w, n);
    assert_string_equal(m->name, "ranker");
    assert_string_equal(m->description, "d");
    assert_int_equal(m->serving.max_batch_candidates, 4096);
    assert_int_equal(m->serving.max_batch_users, 0);
    assert_int_equal(m->serving.max_queue_delay_us, 500);
    assert_int_equal(m->serving.instances, 2);
    assert_string_equal(m->serving.mode, "broadcast");
    assert_string_equal(m->serving.device, "cuda:1");
    assert_int_equal(m->serving.max_queue_candidates, -1); /* never from a model */
    assert_true(m->score_weights[0] == 1.0f && m->score_weights[1] == 1.0f);
    assert_int_equal(m->hist_actions, 1);
    assert_int_equal(m->layers[layer_index(m, "u_dense2")].act, BK_ACT_NONE);
    model_def_free(m);
    free(w);
    free(j);
    free(j2);
    free(j3);
    free(j4);
}

/* ------------------------------------------------------ model.json errors */

static void test_json_syntax_and_top_level(void **state)
{
    (void)state;
    JSON_ERR("{\"format\": ", "invalid JSON at line 1");
    JSON_ERR("[1, 2]", "must be a JSON object");
    JSON_ERR("", "invalid JSON");
    EX_ERR("\"format\": \"ikbo-model/1\",", "\"format\": \"ikbo-model/1\", \"format\": \"x\",",
           "invalid JSON", "duplicate");
    EX_ERR("\"format\": \"ikbo-model/1\",", "\"format\": \"ikbo-model/1\", \"extra\": 1,",
           "unknown key 'extra'", "allowed: format");
    EX_ERR("ikbo-model/1", "ikbo-model/2", "'format' must be \"ikbo-model/1\", got 'ikbo-model/2'");
    EX_ERR("\"format\": \"ikbo-model/1\",", "", "missing key 'format'");
    EX_ERR("\"format\": \"ikbo-model/1\",", "\"format\": 1,", "'format' must be a string, got integer");
    EX_ERR("\"format\": \"ikbo-model/1\",", "\"format\": \"ikbo-model/1\", \"name\": 5,",
           "'name' must be a string, got integer");
    EX_ERR("\"format\": \"ikbo-model/1\",", "\"format\": \"ikbo-model/1\", \"serving\": [],",
           "'serving' must be an object, got array");
    JSON_ERR("{\"format\": \"ikbo-model/1\", \"inputs\": {}, \"tables\": {}, \"layers\": [], "
             "\"output\": {\"logits\": \"x\", \"tasks\": [\"a\"]}}",
             "'layers' must be a non-empty array");
    JSON_ERR("{\"format\": \"ikbo-model/1\", \"inputs\": {}, \"tables\": {}, "
             "\"output\": {\"logits\": \"x\", \"tasks\": [\"a\"]}}",
             "missing key 'layers' (array)");
    JSON_ERR("{\"format\": \"ikbo-model/1\", \"inputs\": {}, \"tables\": [], \"layers\": [], "
             "\"output\": {}}",
             "'tables' must be an object, got array");
}

static void test_json_size_limit(void **state)
{
    (void)state;
    size_t big = (16u << 20) + 1;
    char *j = malloc(big);
    assert_non_null(j);
    memset(j, ' ', big);
    j[0] = '{';
    j[big - 1] = '}';
    parse_err(j, big, NULL, 0, JFILE, "over the 16777216-byte limit", (const char *)NULL);
    free(j);
    parse_err("{\"a\"\0: 1}", 9, NULL, 0, JFILE, "NUL byte", (const char *)NULL);
}

static void test_inputs_errors(void **state)
{
    (void)state;
    EX_ERR("\"candidate\": {\"dense\": 4,", "\"candidate\": {\"dense\": 4, \"history\": {},",
           "unknown key 'inputs.candidate.history'", "allowed: dense, sparse");
    EX_ERR("\"inputs\": {", "\"inputs\": {\"item\": {},", "unknown key 'inputs.item'");
    EX_ERR("\"dense\": 8", "\"dense\": -1", "'inputs.user.dense' must be an integer in [0, ");
    EX_ERR("\"dense\": 8", "\"dense\": 8.0", "'inputs.user.dense' must be an integer, got real");
    EX_ERR("[\"country\", \"lang\"]", "[\"country\", \"lang\", \"country\"]",
           "'inputs.user.sparse[2]': duplicate name 'country' (also inputs.user.sparse[0])");
    EX_ERR("[\"country\", \"lang\"]", "[\"country\", \"\"]",
           "'inputs.user.sparse[1]' must be a non-empty name");
    EX_ERR("[\"country\", \"lang\"]", "[\"country\", 7]",
           "'inputs.user.sparse[1]' must be a string, got integer");
    EX_ERR("\"max_len\": 64", "\"max_len\": 0", "'inputs.user.history.max_len' must be an integer in [1, ");
    EX_ERR("{\"max_len\": 64, \"actions\": 4}", "{\"actions\": 4}",
           "missing key 'inputs.user.history.max_len'");
    EX_ERR("\"actions\": 4}", "\"actions\": 4, \"len\": 2}",
           "unknown key 'inputs.user.history.len'");
    EX_ERR("\"actions\": 4}", "\"actions\": 0}", "'inputs.user.history.actions' must be an integer in [1, ");
}

static void test_tables_errors(void **state)
{
    (void)state;
    EX_ERR("\"lang\":    {\"rows\": 16,   \"dim\": 32}",
           "\"lang\":    {\"rows\": 16,   \"dim\": 32, \"dtype\": \"F16\"}",
           "unknown key 'tables.lang.dtype'", "allowed: rows, dim");
    EX_ERR("\"lang\":    {\"rows\": 16,   \"dim\": 32}", "\"lang\":    {\"rows\": 16}",
           "missing key 'tables.lang.dim'");
    EX_ERR("\"rows\": 16,", "\"rows\": 0,", "'tables.lang.rows' must be an integer in [1, ");
    EX_ERR("\"rows\": 16,", "\"rows\": 99999999999,", "'tables.lang.rows' must be an integer in [1, 2147483647], got 99999999999");
    EX_ERR("\"lang\":    {\"rows\": 16,   \"dim\": 32}",
           "\"lang\":    {\"rows\": 16,   \"dim\": 32}, \"\": {\"rows\": 1, \"dim\": 1}",
           "empty table name");
    EX_ERR("\"lang\":    {\"rows\": 16,   \"dim\": 32}", "\"lang\":    5",
           "'tables.lang' must be an object, got integer");
}

static void test_layer_schema_errors(void **state)
{
    (void)state;
    EX_ERR("\"op\": \"flatten\", \"input\": \"lce\"}",
           "\"op\": \"flatten\", \"input\": \"lce\", \"foo\": 1}",
           "layer 'flat': unknown key 'layers[16].foo' (allowed: name, op, input)");
    EX_ERR("\"op\": \"flatten\"", "\"op\": \"flattn\"", "layer 'flat': unknown op 'flattn'");
    EX_ERR("\"op\": \"flatten\", ", "", "layer 'flat': missing key 'layers[16].op'");
    EX_ERR("\"heads\": 2", "\"heads\": \"2\"", "layer 'ta': 'layers[13].heads' must be an integer, got string");
    EX_ERR("\"heads\": 2", "\"heads\": 0", "layer 'ta': 'layers[13].heads' must be an integer in [1, ");
    EX_ERR("\"out\": 2,", "\"out\": 0,", "layer 'logits': 'layers[18].out' must be an integer in [1, ");
    EX_ERR(", \"table\": \"country\"", "", "layer 'u_country': missing key 'layers[0].table'");
    EX_ERR("\"pooling\": \"mean\"", "\"pooling\": \"max\"",
           "layer 'u_lang': 'layers[1].pooling' must be \"sum\" or \"mean\", got 'max'");
    EX_ERR("\"out\": 2, \"activation\": \"none\"", "\"out\": 2, \"activation\": \"tan\"",
           "layer 'logits': 'layers[18].activation' must be \"none\", \"relu\", \"sigmoid\", "
           "\"gelu\", \"silu\" or \"tanh\", got 'tan'");
    EX_ERR("{\"name\": \"flat\",      ", "{", "missing key 'layers[16].name'");
    EX_ERR("{\"name\": \"flat\",      \"op\": \"flatten\", \"input\": \"lce\"}", "[]",
           "'layers[16]' must be an object, got array");
    EX_ERR("\"name\": \"c_author\"", "\"name\": \"c_item\"",
           "layer 'c_item': duplicate layer name (layers[8] and layers[9])");
    EX_ERR("\"name\": \"flat\"", "\"name\": \"fl.at\"",
           "'layers[16].name' must be a non-empty name without '.', got 'fl.at'");
    EX_ERR("\"name\": \"flat\"", "\"name\": \"\"", "'layers[16].name' must be a non-empty name");
    EX_ERR("\"name\": \"flat\"", "\"name\": \"tables\"", "layer name 'tables' is reserved");
    EX_ERR("\"inputs\": [\"x_cand\", \"ta\"]", "\"inputs\": []",
           "layer 'e_cand': 'layers[14].inputs' must be a non-empty array");
    EX_ERR("\"inputs\": [\"x_cand\", \"ta\"]", "\"inputs\": [\"x_cand\", 3]",
           "layer 'e_cand': 'layers[14].inputs[1]' must be a string, got integer");
    /* A hostile name cannot break the one-line rule. */
    EX_ERR("\"name\": \"flat\",      \"op\": \"flatten\"",
           "\"name\": \"fl\\nat\",      \"op\": \"flatte\"", "layer 'fl\\x0aat': unknown op");
}

static void test_reference_errors(void **state)
{
    (void)state;
    EX_ERR("\"input\": \"u_dense1\"", "\"input\": \"top1\"",
           "layer 'u_dense2': input 'top1' is defined later (layers[17])");
    EX_ERR("\"input\": \"u_dense1\"", "\"input\": \"u_dense2\"",
           "layer 'u_dense2': input 'u_dense2' is the layer itself");
    EX_ERR("\"input\": \"u_dense1\"", "\"input\": \"nope\"",
           "layer 'u_dense2': unknown input 'nope'");
    EX_ERR("\"inputs\": [\"x_cand\", \"ta\"]", "\"inputs\": [\"x_cand\", \"tb\"]",
           "layer 'e_cand': unknown inputs[1] 'tb'");
    EX_ERR("\"table\": \"lang\"", "\"table\": \"langs\"",
           "layer 'u_lang': unknown table 'langs'");
    EX_ERR("\"user.sparse.lang\"", "\"user.sparse.langs\"",
           "layer 'u_lang': input 'user.sparse.langs': no sparse feature 'langs' in inputs.user.sparse");
    EX_ERR("\"input\": \"candidate.sparse.item\"", "\"input\": \"candidate.dense\"",
           "layer 'c_item': embedding_bag input must be a sparse feature");
    EX_ERR("\"input\": \"candidate.dense\"", "\"input\": \"candidate.sparse.item\"",
           "layer 'c_dense1': input 'candidate.sparse.item' is a sparse feature; only embedding_bag");
    EX_ERR("\"input\": \"candidate.dense\"", "\"input\": \"user.history\"",
           "layer 'c_dense1': input 'user.history' is the raw history; only history_embedding");
    EX_ERR("\"input\": \"user.history\"", "\"input\": \"user.dense\"",
           "layer 'hist': history_embedding input must be 'user.history', got 'user.dense'");
    EX_ERR("\"input\": \"candidate.dense\"", "\"input\": \"candidate.history\"",
           "layer 'c_dense1': input 'candidate.history' is not a model input");
    EX_ERR("\"input\": \"candidate.dense\"", "\"input\": \"item.dense\"",
           "layer 'c_dense1': unknown input 'item.dense'");
    EX_ERR("\"candidate\": {\"dense\": 4,", "\"candidate\": {\"dense\": 0,",
           "layer 'c_dense1': input 'candidate.dense': the model declares no inputs.candidate.dense");
    EX_ERR(",\n                  \"history\": {\"max_len\": 64, \"actions\": 4}", "",
           "layer 'hist': input 'user.history': the model declares no inputs.user.history");
}

static void test_shape_errors(void **state)
{
    (void)state;
    EX_ERR("\"input\": \"u_dense2\", \"tokens\": 2", "\"input\": \"u_dense2\", \"tokens\": 3",
           "layer 'u_dense': reshape of 'u_dense2' (user vec [64]) into 3 tokens: 64 is not divisible by 3");
    /* linear over tokens is per token: top1 becomes tokens, which logits then maps per token. */
    EX_ERR("\"input\": \"flat\"", "\"input\": \"lce\"",
           "'output.logits': layer 'logits' is candidate tokens [6, 2]; it must be a candidate-domain vec [2]");
    EX_ERR("\"input\": \"lce\"", "\"input\": \"top1\"", "layer 'flat': input 'top1' is defined later");
    EX_ERR("\"op\": \"mean_pool\", \"input\": \"hist\"", "\"op\": \"mean_pool\", \"input\": \"u_dense1\"",
           "layer 'hist_mean': mean_pool input 'u_dense1' is user vec [64]; it must be a jagged history");
    EX_ERR("\"inputs\": [\"x_cand\", \"ta\"]", "\"inputs\": [\"x_cand\", \"hist_mean\"]",
           "layer 'e_cand': op 'stack' cannot mix user and candidate inputs; only lce, "
           "target_attention, din_attention, add, mul and dot_interaction read user rows through the map");
    EX_ERR("\"out_tokens\": 6", "\"out_tokens\": 0", "'layers[15].out_tokens' must be an integer in [1, ");
}

static void test_output_errors(void **state)
{
    (void)state;
    EX_ERR("\"logits\": \"logits\"", "\"logits\": \"hist_mean\"",
           "'output.logits': layer 'hist_mean' is user vec [32]; it must be a candidate-domain vec [2]");
    EX_ERR("\"logits\": \"logits\"", "\"logits\": \"lce\"",
           "'output.logits': layer 'lce' is candidate tokens [6, 32]", "(flatten it)");
    EX_ERR("\"logits\": \"logits\"", "\"logits\": \"nope\"", "'output.logits': no layer named 'nope'");
    EX_ERR("\"logits\": \"logits\"", "\"logits\": \"candidate.dense\"",
           "'output.logits': no layer named 'candidate.dense'");
    EX_ERR("\"tasks\": [\"click\", \"like\"], \"score_weights\": [1.0, 0.5]",
           "\"tasks\": [\"click\", \"like\", \"share\"], \"score_weights\": [1.0, 0.5, 1]",
           "'output.logits': layer 'logits' has width 2, but output.tasks lists 3 tasks");
    EX_ERR("[1.0, 0.5]", "[1.0]", "'output.score_weights' has 1 entries, output.tasks has 2");
    EX_ERR("[1.0, 0.5]", "[1.0, \"x\"]", "'output.score_weights[1]' must be a number, got string");
    EX_ERR("[1.0, 0.5]", "[1.0, 1e300]", "'output.score_weights[1]' is out of float range");
    EX_ERR("[\"click\", \"like\"]", "[\"click\", \"click\"]",
           "'output.tasks[1]': duplicate name 'click'");
    EX_ERR("[\"click\", \"like\"]", "[]", "'output.tasks' must be a non-empty array");
    EX_ERR("\"score_weights\"", "\"weights\"", "unknown key 'output.weights'");
    EX_ERR(", \"tasks\": [\"click\", \"like\"]", "", "missing key 'output.tasks'");
}

static void test_serving_errors(void **state)
{
    (void)state;
#define SERVING_ERR(body, ...)                                                                 \
    EX_ERR("\"format\": \"ikbo-model/1\",",                                                    \
           "\"format\": \"ikbo-model/1\", \"serving\": " body ",", __VA_ARGS__)
    /* engine/serving.h's table and wording, the same as the server config's
     * "batching" block and a model's config.json; the file comes first. */
    SERVING_ERR("{\"instances\": 65}", "model.json: serving.instances: expected integer 0..64, got 65");
    SERVING_ERR("{\"instances\": -1}", "serving.instances: expected integer 0..64, got -1");
    SERVING_ERR("{\"max_batch_users\": -1}", "serving.max_batch_users: expected integer 0..1000000, got -1");
    SERVING_ERR("{\"max_batch_candidates\": 100000001}",
                "serving.max_batch_candidates: expected integer 0..100000000, got 100000001");
    SERVING_ERR("{\"max_queue_delay_us\": 1.5}", "serving.max_queue_delay_us: expected integer 0..10000000, got 1.5");
    SERVING_ERR("{\"mode\": \"fast\"}", "serving.mode: expected \"ikbo\" or \"broadcast\", got \"fast\"");
    SERVING_ERR("{\"device\": \"gpu\"}", "serving.device: expected \"cpu\" or \"cuda:N\", got \"gpu\"");
    SERVING_ERR("{\"device\": \"cuda:\"}", "serving.device: expected");
    SERVING_ERR("{\"device\": \"cuda:-1\"}", "serving.device: expected");
    SERVING_ERR("{\"device\": \"cuda:01\"}", "serving.device: expected");
    SERVING_ERR("{\"device\": \"cuda:1000\"}", "serving.device: expected");
    SERVING_ERR("{\"mode\": 1}", "serving.mode: expected string, got 1");
    SERVING_ERR("{\"batch\": 1}", "serving.batch: unknown key (known: max_batch_candidates, "
                "max_batch_users, max_queue_delay_us, instances, graphs, fold, user_lane, idle_spin_us, gpu_spin_us, mode, device)");
    /* The queue limits are the server's (config.json "batching") only. */
    SERVING_ERR("{\"max_queue_requests\": 5}", "serving.max_queue_requests: unknown key");
    /* A key from the file reaches the message on one line. */
    SERVING_ERR("{\"a\\nb\": 1}", "serving.a?b: unknown key");
#undef SERVING_ERR
}

/* --------------------------------------------------------- weight errors */

static void test_weight_matching_errors(void **state)
{
    (void)state;
    size_t n;
    uint8_t *w;
    fx_opts o;

    o = (fx_opts){.skip = "top1.bias"};
    w = fx_example_weights(&o, &n);
    WEIGHTS_ERR(w, n, "weights.safetensors: missing tensor 'top1.bias' (layer 'top1', expected shape [64])");
    free(w);

    o = (fx_opts){.skip = "tables.lang"};
    w = fx_example_weights(&o, &n);
    WEIGHTS_ERR(w, n, "missing tensor 'tables.lang' (table 'lang', expected shape [16, 32])");
    free(w);

    o = (fx_opts){.reshape = "top1.weight", .rows = 64, .cols = 100};
    w = fx_example_weights(&o, &n);
    WEIGHTS_ERR(w, n, WFILE ": tensor 'top1.weight': shape [64, 100], expected [64, 192] (layer 'top1')");
    free(w);

    o = (fx_opts){.reshape = "top1.bias", .rows = 1, .cols = 64};
    w = fx_example_weights(&o, &n);
    WEIGHTS_ERR(w, n, "tensor 'top1.bias': shape [1, 64], expected [64] (layer 'top1')");
    free(w);

    o = (fx_opts){.reshape = "hist.position", .rows = 32, .cols = 64};
    w = fx_example_weights(&o, &n);
    WEIGHTS_ERR(w, n, "tensor 'hist.position': shape [32, 64], expected [64, 32] (layer 'hist')");
    free(w);

    o = (fx_opts){.extra = "bogus"};
    w = fx_example_weights(&o, &n);
    WEIGHTS_ERR(w, n, "unexpected tensor 'bogus'");
    free(w);
}

static void test_weight_nonfinite(void **state)
{
    (void)state;
    size_t n;
    fx_opts o = {.poison = "u_dense2.weight", .poison_val = NAN};
    uint8_t *w = fx_example_weights(&o, &n);
    WEIGHTS_ERR(w, n, "tensor 'u_dense2.weight': element 3 is NaN (layer 'u_dense2')");
    free(w);
    o = (fx_opts){.poison = "tables.item", .poison_val = -INFINITY, .dtype = "F16"};
    w = fx_example_weights(&o, &n);
    WEIGHTS_ERR(w, n, "tensor 'tables.item': element 3 is -Inf (table 'item')");
    free(w);
    o = (fx_opts){.poison = "ta.wo", .poison_val = INFINITY, .dtype = "BF16"};
    w = fx_example_weights(&o, &n);
    WEIGHTS_ERR(w, n, "tensor 'ta.wo': element 3 is +Inf (layer 'ta')");
    free(w);
    o = (fx_opts){.poison = "lce.w_user", .poison_val = NAN, .dtype = "F16"};
    w = fx_example_weights(&o, &n);
    WEIGHTS_ERR(w, n, "tensor 'lce.w_user': element 3 is NaN");
    free(w);
    /* f16 overflow: 1e5 rounds to +Inf in binary16. */
    o = (fx_opts){.poison = "top1.bias", .poison_val = 1e5f, .dtype = "F16"};
    w = fx_example_weights(&o, &n);
    WEIGHTS_ERR(w, n, "tensor 'top1.bias': element 3 is +Inf");
    free(w);
}

/* Header-level errors: a one-tensor blob is enough, the header is checked
 * before any weight is matched. */
static void hdr_err(const char *hdr, size_t dlen, const char *want)
{
    uint8_t data[64] = {0};
    size_t n;
    assert_true(dlen <= sizeof data);
    uint8_t *b = fx_blob_raw(hdr, data, dlen, &n);
    WEIGHTS_ERR(b, n, want);
    free(b);
}

static void test_safetensors_header_errors(void **state)
{
    (void)state;
    hdr_err("{\"a\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
            "tensor 'a': dtype I32 is not supported (F32, F16 or BF16 only)");
    hdr_err("{\"a\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8,
            "tensor 'a': dtype F64 is not supported");
    hdr_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,12]}}", 8,
            "tensor 'a': data_offsets [0, 12] out of bounds (data section is 8 bytes)");
    hdr_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,4]}}", 8,
            "tensor 'a': data_offsets [8, 4] out of bounds");
    hdr_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8,
            "tensor 'a': data_offsets [0, 8] hold 8 bytes, but F32 shape with 3 elements needs 12");
    hdr_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
            "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
            12, "tensors 'a' [0, 8) and 'b' [4, 12) overlap");
    hdr_err("{\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
            "\"a\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]}}",
            8, "tensors 'a' [0, 4) and 'b' [0, 8) overlap");
    hdr_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8,
            "data bytes [0, 4) belong to no tensor (before 'a')");
    hdr_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8,
            "data bytes [4, 8) at the end belong to no tensor");
    hdr_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1}}", 8,
            "tensor 'a': unknown key 'x' (allowed: dtype, shape, data_offsets)");
    hdr_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8,
            "tensor 'a': missing key 'data_offsets'");
    hdr_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8,
            "tensor 'a': shape[0] must be a non-negative integer");
    hdr_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}", 8,
            "tensor 'a': shape[0] must be a non-negative integer, got real");
    hdr_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],"
            "\"data_offsets\":[0,8]}}",
            8, "tensor 'a': shape element count overflows");
    hdr_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904],\"data_offsets\":[0,8]}}",
            8, "tensor 'a': shape byte size overflows");
    hdr_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4,
            "tensor 'a': shape has 9 dimensions");
    hdr_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,-8]}}", 8,
            "tensor 'a': data_offsets must be [begin, end]");
    hdr_err("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8,
            "tensor 'a': data_offsets must be [begin, end]");
    hdr_err("{\"a\":[]}", 0, "tensor 'a': header entry must be an object, got array");
    hdr_err("{\"__metadata__\":{\"format\":\"pt\",\"n\":1}}", 0,
            "__metadata__.n must be a string, got integer");
    hdr_err("{\"__metadata__\":[]}", 0, "__metadata__ must be an object of strings");
    hdr_err("[]", 0, "must be a JSON object");
    hdr_err("{\"a\":", 0, "header: invalid JSON");
    hdr_err("{\"a\":1,\"a\":2}", 0, "header: invalid JSON");
    hdr_err("{\"\\u0001\\n\":{\"dtype\":\"X\",\"shape\":[],\"data_offsets\":[0,0]}}", 0,
            "tensor '\\x01\\x0a': dtype X");
    /* Valid header, metadata allowed, zero-size tensor, but nothing expected: */
    hdr_err("{\"__metadata__\":{\"format\":\"pt\"},\"z\":{\"dtype\":\"F32\",\"shape\":[0],"
            "\"data_offsets\":[0,0]}}",
            0, "missing tensor 'tables.item'");
}

static void test_safetensors_size_errors(void **state)
{
    (void)state;
    size_t n;
    uint8_t *w = fx_example_weights(NULL, &n);
    uint8_t *c = malloc(n);
    assert_non_null(c);

    /* truncated in the data section: the last tensor's end is out of bounds */
    WEIGHTS_ERR(w, n - 100, "out of bounds (data section is");
    /* truncated in the header */
    WEIGHTS_ERR(w, 40, "header size", "exceeds the file (32 bytes after the size field)");
    WEIGHTS_ERR(w, 5, "file is 5 bytes, too short for the 8-byte header size");
    WEIGHTS_ERR(NULL, 0, "file is 0 bytes");

    memcpy(c, w, n);
    c[6] = 1; /* header size ~2^48 */
    WEIGHTS_ERR(c, n, "header size 281474976", "exceeds the 104857600-byte limit");
    memcpy(c, w, n);
    c[0] = 0xff;
    c[1] = 0xff;
    c[2] = 0x7f; /* ~8 MiB: under the limit, over the file */
    WEIGHTS_ERR(c, n, "header size", "exceeds the file");
    memcpy(c, w, n);
    c[0] = 0;
    c[1] = 0;
    c[2] = 0; /* header size 0 */
    for (int k = 3; k < 8; k++)
        c[k] = 0;
    WEIGHTS_ERR(c, n, "header: invalid JSON");
    free(c);
    free(w);
}

/* -------------------------------------------------- F16 / BF16 exactness */

/* Independent binary16 decode from the definition. */
static double f16_ref(uint16_t h)
{
    int s = h >> 15, e = (h >> 10) & 31, f = h & 1023;
    double v;
    if (e == 0)
        v = ldexp(f, -24);
    else if (e == 31)
        v = f ? NAN : INFINITY;
    else
        v = ldexp(1024 + f, e - 25);
    return s ? -v : v;
}

static double bf16_ref(uint16_t b)
{
    int s = b >> 15, e = (b >> 7) & 255, f = b & 127;
    double v;
    if (e == 0)
        v = ldexp(f, -133);
    else if (e == 255)
        v = f ? NAN : INFINITY;
    else
        v = ldexp(128 + f, e - 134);
    return s ? -v : v;
}

static void test_half_conversion_exhaustive(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        float a = st_f16_to_f32((uint16_t)h), b = st_bf16_to_f32((uint16_t)h);
        double ra = f16_ref((uint16_t)h), rb = bf16_ref((uint16_t)h);
        if (isnan(ra) ? !isnan(a) : ((double)a != ra || !signbit(a) != !signbit(ra)))
            fail_msg("f16 0x%04x -> %a, expected %a", h, (double)a, ra);
        if (isnan(rb) ? !isnan(b) : ((double)b != rb || !signbit(b) != !signbit(rb)))
            fail_msg("bf16 0x%04x -> %a, expected %a", h, (double)b, rb);
    }
    assert_true(st_f16_to_f32(0x0001) == ldexpf(1.0f, -24)); /* smallest subnormal */
    assert_true(st_f16_to_f32(0x03ff) == ldexpf(1023.0f, -24)); /* largest subnormal */
    assert_true(st_f16_to_f32(0x0400) == ldexpf(1.0f, -14));
    assert_true(st_f16_to_f32(0x7bff) == 65504.0f);
    assert_true(st_f16_to_f32(0x3c00) == 1.0f);
    assert_true(st_f16_to_f32(0xc000) == -2.0f);
    assert_true(isinf(st_f16_to_f32(0x7c00)) && st_f16_to_f32(0x7c00) > 0);
    assert_true(isinf(st_f16_to_f32(0xfc00)) && st_f16_to_f32(0xfc00) < 0);
    assert_true(isnan(st_f16_to_f32(0x7e00)) && isnan(st_f16_to_f32(0x7c01)));
    assert_true(signbit(st_f16_to_f32(0x8000)) && st_f16_to_f32(0x8000) == 0.0f);
    assert_true(st_bf16_to_f32(0x3f80) == 1.0f);
    assert_true(st_bf16_to_f32(0x0001) == ldexpf(1.0f, -133));
    assert_true(isnan(st_bf16_to_f32(0x7fc0)) && isinf(st_bf16_to_f32(0xff80)));
}

static void test_example_in_half_dtypes(void **state)
{
    (void)state;
    const char *dts[] = {"F16", "BF16"};
    for (int k = 0; k < 2; k++) {
        size_t n;
        fx_opts o = {.dtype = dts[k]};
        uint8_t *w = fx_example_weights(&o, &n);
        model_def *m = parse_ok(FX_EXAMPLE_JSON, w, n);
        check_example(m); /* fx_val values are exact in both dtypes */
        model_def_free(m);
        free(w);
    }
}

/* The smallest model: one linear layer 'l' from candidate.dense [n] to n
 * logits (tasks "a" or "a", "b"), parsed with the safetensors blob st. */
static model_def *parse_linear(int n, const uint8_t *st, size_t st_len)
{
    static const char *const tasks[] = {"\"a\"", "\"a\",\"b\""};
    assert_true(n >= 1 && n <= 2);
    char json[512];
    snprintf(json, sizeof json,
             "{\"format\":\"ikbo-model/1\",\"inputs\":{\"candidate\":{\"dense\":%d}},\"tables\":{},"
             "\"layers\":[{\"name\":\"l\",\"op\":\"linear\",\"input\":\"candidate.dense\",\"out\":%d}],"
             "\"output\":{\"logits\":\"l\",\"tasks\":[%s]}}",
             n, n, tasks[n - 1]);
    return parse_ok(json, st, st_len);
}

/* Subnormal halves load exactly; mixed dtypes in one file are fine. */
static void test_subnormal_weights(void **state)
{
    (void)state;
    uint8_t w16[8] = {0x01, 0x00, 0xff, 0x03, 0x00, 0x80, 0xff, 0x7b}; /* 2^-24, max sub, -0, 65504 */
    uint8_t b16[4] = {0x01, 0x00, 0x80, 0xbf}; /* 2^-133, -1.0 */
    fx_st *b = fx_new();
    fx_add_raw(b, "l.weight", "F16", "[2, 2]", w16, 8);
    fx_add_raw(b, "l.bias", "BF16", "[2]", b16, 4);
    size_t n;
    uint8_t *blob = fx_finish(b, &n);
    model_def *m = parse_linear(2, blob, n);
    const md_layer *l = &m->layers[0];
    assert_true(l->w[0].data[0] == ldexpf(1.0f, -24));
    assert_true(l->w[0].data[1] == ldexpf(1023.0f, -24));
    assert_true(l->w[0].data[2] == 0.0f && signbit(l->w[0].data[2]));
    assert_true(l->w[0].data[3] == 65504.0f);
    assert_true(l->w[1].data[0] == ldexpf(1.0f, -133));
    assert_true(l->w[1].data[1] == -1.0f);
    model_def_free(m);
    free(blob);
}

/* Writers pad the header with spaces to a multiple of 8 (the reference
 * implementation does); tensors may appear in any order in the header. */
static void test_header_padding(void **state)
{
    (void)state;
    const char *hdr = "{\"l.bias\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]},"
                      "\"l.weight\":{\"dtype\":\"F32\",\"shape\":[1,1],\"data_offsets\":[0,4]},"
                      "\"__metadata__\":{\"format\":\"pt\"}}      ";
    float data[2] = {2.5f, -1.0f};
    size_t n;
    uint8_t *blob = fx_blob_raw(hdr, data, sizeof data, &n);
    model_def *m = parse_linear(1, blob, n);
    assert_true(m->layers[0].w[0].data[0] == 2.5f);
    assert_true(m->layers[0].w[1].data[0] == -1.0f);
    model_def_free(m);
    free(blob);
}

/* ------------------------------------------------------ files on disk */

static char tmpdir[64];

static void write_file(const char *dir, const char *name, const void *p, size_t n)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(p, 1, n, f), n);
    fclose(f);
}

static void load_err_(const char *dir, const char *file, ...)
{
    bk_err e = {{0}};
    model_def *m = NULL;
    int rc = model_def_load(dir, &m, &e);
    if (rc == 0) {
        model_def_free(m);
        fail_msg("model_def_load succeeded");
    }
    assert_null(m);
    char want[256];
    snprintf(want, sizeof want, "%s/%s", dir, file);
    va_list ap;
    va_start(ap, file);
    check_err_msg(e.msg, want, ap);
    va_end(ap);
}

#define load_err(dir, file, ...) load_err_((dir), (file), __VA_ARGS__, (const char *)NULL)

static void test_load_from_disk(void **state)
{
    (void)state;
    char path[256];
    snprintf(tmpdir, sizeof tmpdir, "/tmp/ikbo_test_loader_XXXXXX");
    assert_non_null(mkdtemp(tmpdir));

    load_err(tmpdir, "model.json", "cannot open: No such file or directory");
    write_file(tmpdir, "model.json", FX_EXAMPLE_JSON, strlen(FX_EXAMPLE_JSON));
    load_err(tmpdir, "weights.safetensors", "cannot open: No such file or directory");

    size_t n;
    fx_opts o = {.dtype = "F16"}; /* the fd path's chunked conversion */
    uint8_t *w = fx_example_weights(&o, &n);
    write_file(tmpdir, "weights.safetensors", w, n);
    bk_err e = {{0}};
    model_def *m = NULL;
    if (model_def_load(tmpdir, &m, &e))
        fail_msg("%s", e.msg);
    char why[256];
    if (fx_check_model(m, 1, why, sizeof why))
        fail_msg("%s", why);
    assert_string_equal(m->dir, tmpdir);
    model_def_free(m);

    /* trailing slash: messages do not double it */
    snprintf(path, sizeof path, "%s/", tmpdir);
    write_file(tmpdir, "weights.safetensors", w, n - 4);
    e.msg[0] = 0;
    assert_int_equal(model_def_load(path, &m, &e), -1);
    snprintf(why, sizeof why, "%s/weights.safetensors: ", tmpdir);
    assert_non_null(strstr(e.msg, why));

    /* weights.safetensors is a directory */
    snprintf(path, sizeof path, "%s/weights.safetensors", tmpdir);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(mkdir(path, 0700), 0);
    load_err(tmpdir, "weights.safetensors", "not a regular file");
    assert_int_equal(rmdir(path), 0);

    /* a FIFO is refused at once, not waited on */
    snprintf(path, sizeof path, "%s/model.json", tmpdir);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(mkfifo(path, 0600), 0);
    load_err(tmpdir, "model.json", "not a regular file");
    assert_int_equal(unlink(path), 0);
    write_file(tmpdir, "model.json", FX_EXAMPLE_JSON, strlen(FX_EXAMPLE_JSON));

    /* model.json over 16 MiB (sparse file) */
    int fd = open(path, O_WRONLY | O_TRUNC);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (16 << 20) + 1), 0);
    close(fd);
    load_err(tmpdir, "model.json", "file is 16777217 bytes, over the 16777216-byte limit");

    /* a bad model.json is reported before the weights are opened */
    write_file(tmpdir, "model.json", "{}", 2);
    load_err(tmpdir, "model.json", "missing key 'format'");
    assert_int_equal(unlink(path), 0);
    assert_int_equal(rmdir(tmpdir), 0);
    free(w);
    load_err("/nonexistent/dir", "model.json", "cannot open: No such file or directory");
}

static void test_null_arguments(void **state)
{
    (void)state;
    model_def *m = NULL;
    bk_err e = {{0}};
    assert_int_equal(model_def_parse(DIR, NULL, 0, NULL, 0, &m, &e), -1);
    assert_non_null(strstr(e.msg, JFILE ": invalid JSON"));
    assert_int_equal(model_def_parse(DIR, "{}", 2, NULL, 0, &m, NULL), -1); /* err may be NULL */
    assert_int_equal(model_def_load(NULL, &m, &e), -1);
    assert_null(m);
    model_def_free(NULL);
}


/* ------------------------------------------------ message sanitizing */

static void test_quote(void **state)
{
    (void)state;
    char b[300], small[8];
    assert_string_equal(js_quote(b, "plain"), "plain");
    assert_string_equal(js_quote(b, "a\nb\t'c\\"), "a\\x0ab\\x09\\'c\\\\");
    assert_string_equal(js_quote(b, "\x7f"), "\\x7f");
    char longname[200];
    memset(longname, 'x', sizeof longname - 1);
    longname[sizeof longname - 1] = 0;
    js_quote(b, longname);
    assert_int_equal(strlen(b), JS_QUOTE_MAX + 3);
    assert_string_equal(b + JS_QUOTE_MAX, "...");
    /* a cut never splits a UTF-8 sequence: 63 x's then a 2-byte char */
    memset(longname, 'x', 63);
    strcpy(longname + 63, "\xc3\xa9tail");
    js_quote(b, longname);
    assert_int_equal(strlen(b), 63 + 3);
    /* a small buffer still ends in "..." and is terminated */
    js_quote_n(small, sizeof small, "abcdefghij", 64);
    assert_string_equal(small, "abcd...");
    js_quote_n(small, sizeof small, "\n\n\n", 64);
    assert_string_equal(small, "\\x0a...");
    /* layer names with any byte stay on one line in messages (also fuzzed) */
    EX_ERR("\"name\": \"flat\",      \"op\": \"flatten\"",
           "\"name\": \"\\r\\u2028\\u00e9\",      \"op\": 5",
           "layer '\\x0d\xe2\x80\xa8\xc3\xa9': 'layers[16].op' must be a string, got integer");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_example_loads),
        cmocka_unit_test(test_example_plan_only),
        cmocka_unit_test(test_optional_fields),
        cmocka_unit_test(test_json_syntax_and_top_level),
        cmocka_unit_test(test_json_size_limit),
        cmocka_unit_test(test_inputs_errors),
        cmocka_unit_test(test_tables_errors),
        cmocka_unit_test(test_layer_schema_errors),
        cmocka_unit_test(test_reference_errors),
        cmocka_unit_test(test_shape_errors),
        cmocka_unit_test(test_output_errors),
        cmocka_unit_test(test_serving_errors),
        cmocka_unit_test(test_weight_matching_errors),
        cmocka_unit_test(test_weight_nonfinite),
        cmocka_unit_test(test_safetensors_header_errors),
        cmocka_unit_test(test_safetensors_size_errors),
        cmocka_unit_test(test_half_conversion_exhaustive),
        cmocka_unit_test(test_example_in_half_dtypes),
        cmocka_unit_test(test_subnormal_weights),
        cmocka_unit_test(test_header_padding),
        cmocka_unit_test(test_load_from_disk),
        cmocka_unit_test(test_null_arguments),
        cmocka_unit_test(test_quote),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
