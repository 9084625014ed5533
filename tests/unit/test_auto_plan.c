/* test_auto_plan.c - the automatic IKBO planner and the plan report.
 *
 * Why this exists: "planning": "auto" models are rewritten at load
 * (engine/auto_plan.c); what the rewrite produces is a contract (the plan
 * report, ikbo-plan, /v1/models), so every rewrite is pinned here on
 * auto_fixture.h's model: the planned layers and their domains, each
 * model.json layer's rewrite, the weight split, the gathers, the costs
 * (a Type I layer does less per candidate, nothing does more), the JSON
 * keys and the text; plus the errors: a bad "planning" value, the internal
 * op named in model.json, mixing in a manual model.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "auto_fixture.h"
#include "engine/model.h"
#include "engine/op.h"
#include "engine/plan.h"
#include "loader_fixture.h"

#define DIR "/models/auto/1"

static model_def *plan(const char *json)
{
    model_def *m = NULL;
    bk_err e = {{0}};
    if (model_def_plan(DIR, json, strlen(json), &m, &e)) fail_msg("plan failed: %s", e.msg);
    return m;
}

static void expect_error(const char *json, const char *needle)
{
    model_def *m = NULL;
    bk_err e = {{0}};
    assert_int_equal(model_def_plan(DIR, json, strlen(json), &m, &e), -1);
    assert_null(m);
    if (!strstr(e.msg, needle)) fail_msg("error '%s' lacks '%s'", e.msg, needle);
}

static const md_plan_entry *entry(const model_def *m, const char *name)
{
    for (int i = 0; i < m->plan.n; i++)
        if (strcmp(m->plan.e[i].name, name) == 0) return &m->plan.e[i];
    fail_msg("no plan entry '%s'", name);
    return NULL;
}

static const md_layer *layer(const model_def *m, const char *name)
{
    for (int i = 0; i < m->n_layers; i++)
        if (strcmp(m->layers[i].name, name) == 0) return &m->layers[i];
    fail_msg("no planned layer '%s'", name);
    return NULL;
}

static void test_rewrites(void **state)
{
    (void)state;
    model_def *m = plan(AUTO_JSON);
    assert_true(m->plan.is_auto);
    assert_int_equal(m->plan.n, 21);
    static const struct {
        const char *name;
        enum md_rewrite rw;
    } want[] = {{"ue", MD_RW_USER},     {"ut", MD_RW_USER},     {"uv", MD_RW_USER},
                {"ce", MD_RW_CAND},     {"st", MD_RW_MAP_READ}, {"tl", MD_RW_TYPE1},
                {"dt", MD_RW_IKBO},     {"cc", MD_RW_MAP_READ}, {"l1", MD_RW_TYPE1},
                {"l2", MD_RW_TYPE1},    {"flat", MD_RW_CAND},   {"ln", MD_RW_CAND},
                {"cr", MD_RW_GATHER},   {"mx", MD_RW_GATHER},   {"m", MD_RW_IKBO},
                {"logits", MD_RW_CAND}};
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++)
        if (entry(m, want[k].name)->rw != want[k].rw)
            fail_msg("layer %s: rewrite %s, want %s", want[k].name,
                     md_rewrite_name(entry(m, want[k].name)->rw), md_rewrite_name(want[k].rw));
    /* token_linear became lce over a user stack [ut, ue] and a candidate one [ce, cd]. */
    const md_layer *tl = layer(m, "tl");
    assert_int_equal(tl->op, MD_LCE);
    assert_int_equal(m->layers[tl->in[0].index].domain, MD_USER);
    assert_int_equal(m->layers[tl->in[0].index].tokens, 3);
    assert_int_equal(m->layers[tl->in[1].index].tokens, 2);
    assert_string_equal(entry(m, "tl")->split, "weight [3, 5] -> user tokens 3, candidate tokens 2");
    /* linear over cc: user linear at U (bias-free), candidate linear, add, relu. */
    assert_int_equal(layer(m, "l1__u")->domain, MD_USER);
    assert_int_equal(layer(m, "l1__c")->domain, MD_CAND);
    assert_int_equal(layer(m, "l1__sum")->op, MD_ADD);
    assert_int_equal(layer(m, "l1")->op, MD_ACTIVATION);
    assert_int_equal(layer(m, "l2")->op, MD_ADD); /* no activation: the add is l2 */
    assert_int_equal(md_ref_width(m, layer(m, "l1__u")->in[0]), 13); /* [ue, user.dense] */
    assert_string_equal(entry(m, "l1")->split, "weight [8, 21] -> user columns 13, candidate columns 8");
    /* dot_interaction reads st's five parts; st itself is built once, for flatten. */
    assert_int_equal(layer(m, "dt")->n_in, 4);
    assert_int_equal(layer(m, "st")->domain, MD_CAND);
    assert_int_equal(layer(m, "st")->n_in, 4);
    /* Two gathers, each a broadcast layer read by its op. */
    int gathers = 0;
    for (int i = 0; i < m->n_layers; i++) gathers += m->layers[i].op == MD_BROADCAST;
    assert_int_equal(gathers, 2);
    assert_int_equal(layer(m, "cr")->in[0].index, layer(m, "ue__bcast") - m->layers);
    assert_non_null(strstr(entry(m, "cr")->note, "op 'cross' cannot read user rows through the map"));
    model_def_free(m);
}

static void test_costs(void **state)
{
    (void)state;
    model_def *m = plan(AUTO_JSON);
    for (int i = 0; i < m->plan.n; i++) {
        const md_plan_entry *e = &m->plan.e[i];
        if (e->rw == MD_RW_TYPE1 && !(e->flops_c[1] < e->flops_c[0]))
            fail_msg("%s: a Type I rewrite must do less per candidate", e->name);
        if (e->rw == MD_RW_SPLICED && e->bytes_c[1] != 0)
            fail_msg("%s: a spliced stack writes nothing", e->name);
        if (e->rw == MD_RW_USER && (e->flops_c[0] || e->flops_c[1]))
            fail_msg("%s: a user layer has no per-candidate cost", e->name);
    }
    md_plan_totals t;
    md_plan_totals_of(m, 70, &t);
    assert_int_equal(t.gathers, 2);
    assert_true(t.gather_bytes == AUTO_GATHER_BYTES);
    assert_true(t.flops[1] < t.flops[0] && t.bytes[1] < t.bytes[0]);
    assert_int_equal(t.rewritten, 5); /* tl, l1, l2 (type1); st, cc (map_read) */
    model_def_free(m);
}

static void test_json_and_text(void **state)
{
    (void)state;
    model_def *m = plan(AUTO_JSON);
    json_t *o = md_plan_json(m, 70);
    assert_non_null(o);
    assert_string_equal(json_string_value(json_object_get(o, "planning")), "auto");
    assert_int_equal(json_array_size(json_object_get(o, "layers")), 21);
    assert_int_equal(json_array_size(json_object_get(o, "executed")), (size_t)m->n_layers);
    json_t *g = json_object_get(o, "gathers");
    assert_int_equal(json_array_size(g), 2);
    assert_string_equal(json_string_value(json_object_get(json_array_get(g, 0), "input")), "ue");
    assert_string_equal(json_string_value(json_object_get(json_array_get(g, 0), "layer")), "cr");
    json_t *tl = NULL;
    size_t k;
    json_t *v;
    json_array_foreach(json_object_get(o, "executed"), k, v)
        if (strcmp(json_string_value(json_object_get(v, "name")), "tl") == 0) tl = v;
    assert_non_null(tl);
    assert_string_equal(json_string_value(json_object_get(tl, "op")), "lce");
    assert_true(json_is_true(json_object_get(tl, "mixed")));
    json_t *totals = json_object_get(o, "totals");
    assert_int_equal(json_integer_value(json_object_get(totals, "gathers")), 2);
    json_decref(o);
    char *t = md_plan_text(m, 70);
    assert_non_null(t);
    assert_non_null(strstr(t, "planning auto, 21 layers in model.json"));
    assert_non_null(strstr(t, "gathers: 2 (64 B per candidate)"));
    assert_non_null(strstr(t, "  tl: weight [3, 5] -> user tokens 3, candidate tokens 2"));
    free(t);
    model_def_free(m);
}

/* A manual model's report: mixing ops are its IKBO reads, nothing rewritten. */
static void test_manual_report(void **state)
{
    (void)state;
    model_def *m = plan(FX_EXAMPLE_JSON);
    assert_false(m->plan.is_auto);
    assert_int_equal(m->plan.n, m->n_layers);
    assert_int_equal(entry(m, "lce")->rw, MD_RW_IKBO);
    assert_int_equal(entry(m, "ta")->rw, MD_RW_IKBO);
    assert_int_equal(entry(m, "u_dense1")->rw, MD_RW_USER);
    md_plan_totals t;
    md_plan_totals_of(m, 70, &t);
    assert_int_equal(t.gathers, 0);
    assert_int_equal(t.rewritten, 0);
    model_def_free(m);
}

static void test_as_written(void **state)
{
    (void)state;
    model_def *m = NULL;
    bk_err e = {{0}};
    assert_int_equal(model_def_plan_as_written(DIR, AUTO_JSON, strlen(AUTO_JSON), &m, &e), 0);
    assert_int_equal(m->n_layers, 21);
    assert_int_equal(layer(m, "tl")->op, MD_TOKEN_LINEAR);
    assert_int_equal(layer(m, "st")->domain, MD_CAND);
    model_def_free(m);
}

static void test_errors(void **state)
{
    (void)state;
    char *j = fx_replace(AUTO_JSON, "\"planning\": \"auto\"", "\"planning\": \"manual\"");
    expect_error(j, "'planning' must be \"auto\"");
    free(j);
    j = fx_replace(AUTO_JSON, "\"planning\": \"auto\",", "");
    expect_error(j, "layer 'st': op 'stack' cannot mix user and candidate inputs");
    free(j);
    j = fx_replace(AUTO_JSON, "\"op\": \"flatten\", \"input\": \"st\"", "\"op\": \"broadcast\", \"input\": \"ue\"");
    expect_error(j, "layer 'flat': unknown op 'broadcast'");
    free(j);
    /* An op the rewrite cannot place still fails naming its layer. */
    j = fx_replace(AUTO_JSON, "{\"name\": \"logits\", \"op\": \"linear\", \"input\": \"x\", \"out\": 2}",
                   "{\"name\": \"logits\", \"op\": \"linear\", \"input\": \"x\", \"out\": 3}");
    expect_error(j, "'output.logits'");
    free(j);
    /* The op list in messages leaves the internal op out. */
    assert_null(strstr(md_op_list(), "broadcast"));
    for (int k = 0; k < MD_OP_COUNT; k++) {
        assert_non_null(md_ops[k]->cost);
        assert_non_null(md_ops[k]->plan);
        assert_non_null(md_ops[k]->run);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rewrites),      cmocka_unit_test(test_costs),
        cmocka_unit_test(test_json_and_text), cmocka_unit_test(test_manual_report),
        cmocka_unit_test(test_as_written),    cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
