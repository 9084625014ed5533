/* test_request.c - the shared request path (server/request.c): JSON mapping,
 * every validation rule's code and message, dedup + grouping, response
 * building and JSON. Uses a hand-made ikbo_model_info; no engine needed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "server/pb_arena.h"
#include "server/pb_check.h"
#include "server/rank_wire.h"
#include "server/request.h"
#include "server/rq_view.h"
#include "request_fixture.h"

static const char *const USER_SPARSE[] = {"country", "lang"};
static const char *const CAND_SPARSE[] = {"item", "author"};
static const char *const TASKS[] = {"click", "like"};
static const float WEIGHTS[] = {1.0f, 0.5f};

static ikbo_model_info model(void)
{
    ikbo_model_info mi = {
        .dir = "/repo/demo/3",
        .user_dense = 3,
        .cand_dense = 2,
        .user_sparse = USER_SPARSE,
        .n_user_sparse = 2,
        .cand_sparse = CAND_SPARSE,
        .n_cand_sparse = 2,
        .has_history = 1,
        .hist_max_len = 8,
        .hist_actions = 4,
        .tasks = TASKS,
        .n_tasks = 2,
        .score_weights = WEIGHTS,
        .mode = IKBO_MODE_IKBO,
        .device = "cpu",
    };
    return mi;
}

/* The message must contain substr. */
static void parse_err(const char *json, const char *substr) { rf_parse_err(json, substr, 0); }

/* A valid request body around the given users/candidates arrays. */
#define U0 "{\"dense\":[1,2,3]}"
#define C0(u) "{\"id\":1,\"user\":" #u ",\"dense\":[0.5,0.25]}"

static void validate_expect(const char *json, int code, const char *substr)
{
    ikbo_model_info mi = model();
    rq_limits lim;
    rq_limits_default(&lim);
    lim.max_users = 4;
    lim.max_candidates = 8;
    lim.max_ids_per_bag = 3;
    lim.max_history = 5;
    lim.max_sparse_features = 2;
    Ikbo__V1__RankRequest *r = parse_ok(json);
    rq_status st;
    int rc = rq_validate(r, &mi, &lim, &st);
    if (code == RQ_OK) {
        if (rc)
            fail_msg("expected valid, got %s: %s\n  json: %s", rq_code_name(st.code), st.msg, json);
    } else {
        if (!rc)
            fail_msg("expected %s '%s', got OK\n  json: %s", rq_code_name(code), substr, json);
        if (st.code != code || !strstr(st.msg, substr))
            fail_msg("expected %s '%s', got %s '%s'", rq_code_name(code), substr,
                     rq_code_name(st.code), st.msg);
        assert_int_equal(rc, -1);
    }
    rq_request_free(r);
}

/* ---------------- status ---------------- */

static void test_status_codes(void **s)
{
    (void)s;
    assert_string_equal(rq_code_name(RQ_INVALID_ARGUMENT), "INVALID_ARGUMENT");
    assert_string_equal(rq_code_name(RQ_RESOURCE_EXHAUSTED), "RESOURCE_EXHAUSTED");
    assert_string_equal(rq_code_name(RQ_NOT_FOUND), "NOT_FOUND");
    assert_string_equal(rq_code_name(RQ_DEADLINE_EXCEEDED), "DEADLINE_EXCEEDED");
    assert_string_equal(rq_code_name(RQ_UNAVAILABLE), "UNAVAILABLE");
    assert_string_equal(rq_code_name(RQ_INTERNAL), "INTERNAL");
    assert_string_equal(rq_code_name(RQ_OK), "OK");
    assert_string_equal(rq_code_name(77), "UNKNOWN");
    assert_int_equal(rq_code_http(RQ_OK), 200);
    assert_int_equal(rq_code_http(RQ_INVALID_ARGUMENT), 400);
    assert_int_equal(rq_code_http(RQ_NOT_FOUND), 404);
    assert_int_equal(rq_code_http(RQ_RESOURCE_EXHAUSTED), 429);
    assert_int_equal(rq_code_http(RQ_DEADLINE_EXCEEDED), 504);
    assert_int_equal(rq_code_http(RQ_UNAVAILABLE), 503);
    assert_int_equal(rq_code_http(RQ_INTERNAL), 500);
    assert_int_equal(rq_code_http(99), 500);
    rq_status st;
    assert_int_equal(rq_status_set(&st, RQ_INTERNAL, "a\nb %d", 5), -1);
    assert_string_equal(st.msg, "a b 5");
    assert_int_equal(rq_status_set(&st, RQ_OK, "x"), 0);
    rq_limits l;
    rq_limits_default(&l);
    assert_int_equal(l.max_users, 1024);
    assert_int_equal(l.max_candidates, 10000);
    assert_int_equal(l.max_ids_per_bag, 1024);
    assert_int_equal(l.max_history, 10000);
    assert_int_equal(l.max_message_bytes, 4u << 20);
}

static void test_error_json(void **s)
{
    (void)s;
    rq_status st;
    rq_status_set(&st, RQ_INVALID_ARGUMENT, "users[0].dense[1] is \"NaN\"");
    char *j = rq_error_json(&st);
    assert_non_null(j);
    json_t *o = json_loads(j, 0, NULL);
    assert_non_null(o);
    assert_string_equal(json_string_value(json_object_get(json_object_get(o, "error"), "code")),
                        "INVALID_ARGUMENT");
    assert_string_equal(json_string_value(json_object_get(json_object_get(o, "error"), "message")),
                        st.msg);
    json_decref(o);
    free(j);
    /* invalid UTF-8 (possible from a wire request) still gives a body */
    rq_status_set(&st, RQ_INVALID_ARGUMENT, "name = \"a\xff\xfe\"");
    j = rq_error_json(&st);
    assert_non_null(j);
    assert_non_null(strstr(j, "name = \\\"a??\\\""));
    free(j);
}

/* ---------------- JSON mapping ---------------- */

/* The top-level scalars, whichever spelling (camelCase or snake_case) set them. */
static void expect_top_fields(const Ikbo__V1__RankRequest *r, int64_t version, uint32_t top_k,
                              const char *request_id)
{
    assert_int_equal(r->model_version, version);
    assert_int_equal(r->top_k, top_k);
    assert_string_equal(r->request_id, request_id);
}

static void test_json_camel(void **s)
{
    (void)s;
    Ikbo__V1__RankRequest *r = parse_ok(
        "{\"model\":\"demo\",\"modelVersion\":\"7\",\"topK\":5,\"requestId\":\"r-1\","
        "\"users\":[{\"key\":\"u\",\"dense\":[1,2.5,-3e2],"
        "\"sparse\":[{\"name\":\"lang\",\"ids\":[\"-9223372036854775808\",9223372036854775807,3]}],"
        "\"historyIds\":[\"9007199254740993\",2],\"historyActions\":[1,\"3\"]}],"
        "\"candidates\":[{\"id\":\"123456789012345678\",\"user\":0,\"dense\":[0.5,\"1.5\"],"
        "\"sparse\":[{\"name\":\"item\",\"ids\":[4]}]}]}");
    assert_string_equal(r->model, "demo");
    expect_top_fields(r, 7, 5, "r-1");
    assert_int_equal(r->n_users, 1);
    Ikbo__V1__User *u = r->users[0];
    assert_string_equal(u->key, "u");
    assert_int_equal(u->n_dense, 3);
    assert_true(u->dense[1] == 2.5f && u->dense[2] == -300.0f);
    assert_int_equal(u->n_sparse, 1);
    assert_string_equal(u->sparse[0]->name, "lang");
    assert_int_equal(u->sparse[0]->n_ids, 3);
    assert_true(u->sparse[0]->ids[0] == INT64_MIN);
    assert_true(u->sparse[0]->ids[1] == INT64_MAX);
    assert_int_equal(u->n_history_ids, 2);
    assert_true(u->history_ids[0] == 9007199254740993LL);
    assert_int_equal(u->n_history_actions, 2);
    assert_int_equal(u->history_actions[1], 3);
    Ikbo__V1__Candidate *c = r->candidates[0];
    assert_true(c->id == 123456789012345678LL);
    assert_true(c->dense[1] == 1.5f);
    assert_string_equal(c->sparse[0]->name, "item");
    rq_request_free(r);
}

static void test_json_snake(void **s)
{
    (void)s;
    Ikbo__V1__RankRequest *r = parse_ok(
        "{\"model\":\"demo\",\"model_version\":3,\"top_k\":2,\"request_id\":\"x\","
        "\"users\":[{\"history_ids\":[5,6],\"history_actions\":[0,1]}],"
        "\"candidates\":[{\"id\":-4,\"user\":0}]}");
    expect_top_fields(r, 3, 2, "x");
    assert_int_equal(r->users[0]->n_history_ids, 2);
    assert_int_equal(r->users[0]->n_history_actions, 2);
    assert_true(r->candidates[0]->id == -4);
    rq_request_free(r);

    /* null = absent; integral floats accepted for integer fields; empty object */
    r = parse_ok("{\"model\":null,\"topK\":3.0,\"users\":null,\"candidates\":[{\"id\":1e3}]}");
    assert_string_equal(r->model, "");
    assert_int_equal(r->top_k, 3);
    assert_int_equal(r->n_users, 0);
    assert_true(r->candidates[0]->id == 1000);
    rq_request_free(r);
    r = parse_ok("{}");
    rq_request_free(r);

    /* non-finite floats parse (rq_validate rejects them with the field name) */
    r = parse_ok("{\"users\":[{\"dense\":[\"NaN\",\"Infinity\",\"-Infinity\"]}]}");
    assert_true(isnan(r->users[0]->dense[0]));
    assert_true(isinf(r->users[0]->dense[1]) && r->users[0]->dense[2] < 0);
    rq_request_free(r);
}

static void test_json_unknown_fields(void **s)
{
    (void)s;
    parse_err("{\"users\":[{},{},{\"sparse\":[{\"name\":\"a\",\"idz\":[1]}]}]}",
              "users[2].sparse[0].idz: unknown field");
    parse_err("{\"modelz\":1}", "modelz: unknown field");
    parse_err("{\"candidates\":[{\"id\":1},{\"bogus\":true}]}", "candidates[1].bogus: unknown field");
    parse_err("{\"users\":[{\"History_ids\":[]}]}", "users[0].History_ids: unknown field");
    parse_err("{\"topK\":1,\"top_k\":2}", "top_k: duplicate field (also given as \"topK\")");
}

static void test_json_wrong_types(void **s)
{
    (void)s;
    parse_err("{\"users\":[{\"dense\":\"x\"}]}", "users[0].dense: expected array, got string");
    parse_err("{\"users\":[{\"dense\":[1,\"x\"]}]}", "users[0].dense[1]: expected float");
    parse_err("{\"users\":[{\"dense\":[1,1e300]}]}", "users[0].dense[1]: 1e+300 is out of float range");
    parse_err("{\"candidates\":[{\"id\":true}]}", "candidates[0].id: expected int64 (integer or decimal string), got true");
    parse_err("{\"candidates\":[{\"id\":\"12a\"}]}", "candidates[0].id: expected int64");
    parse_err("{\"candidates\":[{\"id\":\"\"}]}", "candidates[0].id: expected int64");
    parse_err("{\"candidates\":[{\"id\":\"99999999999999999999\"}]}", "candidates[0].id: expected int64");
    parse_err("{\"candidates\":[{\"id\":1.5}]}", "candidates[0].id: expected int64 (integer or decimal string), got number 1.5");
    parse_err("{\"candidates\":[{\"user\":-1}]}", "candidates[0].user: expected uint32 (integer 0..4294967295), got integer -1");
    parse_err("{\"candidates\":[{\"user\":4294967296}]}", "candidates[0].user: expected uint32");
    parse_err("{\"topK\":\"abc\"}", "topK: expected uint32");
    parse_err("{\"users\":[{\"historyActions\":[3000000000]}]}", "users[0].historyActions[0]: expected int32");
    parse_err("{\"users\":{}}", "users: expected array, got object");
    parse_err("{\"users\":[1]}", "users[0]: expected object, got integer");
    parse_err("{\"users\":[null]}", "users[0]: expected object, got null");
    parse_err("{\"users\":[{\"sparse\":[{\"name\":5}]}]}", "users[0].sparse[0].name: expected string, got integer");
    parse_err("{\"model\":[]}", "model: expected string, got array");
    parse_err("[]", "request: expected object, got array");
    parse_err("{\"model\":", "invalid JSON at line 1");
    parse_err("", "invalid JSON");
    parse_err("{\"model\":\"a\\u0000b\"}", "model: string contains NUL at byte 1");
    parse_err("{\"model\":\"a\",\"model\":\"b\"}", "invalid JSON");
}

/* ---------------- strings: JSON and the wire agree ---------------- */

/* The wire message of `json` (which must parse) with the 5-byte placeholder
 * "PHPHP" overwritten by bad[5]. */
static uint8_t *wire_with(const char *json, const char *bad, size_t *n)
{
    Ikbo__V1__RankRequest *r = parse_ok(json);
    *n = ikbo__v1__rank_request__get_packed_size(r);
    uint8_t *w = malloc(*n);
    assert_non_null(w);
    ikbo__v1__rank_request__pack(r, w);
    rq_request_free(r);
    uint8_t *ph = NULL;
    for (size_t i = 0; i + 5 <= *n && !ph; i++)
        if (!memcmp(w + i, "PHPHP", 5)) ph = w + i;
    assert_non_null(ph);
    memcpy(ph, bad, 5);
    return w;
}

/* What the gRPC transport answers for wire bytes: the fast decoder, else
 * the fallback (as grpc_server.c runs them). */
static void wire_answer(const uint8_t *w, size_t n, rq_status *st)
{
    pb_arena *a = pb_arena_new(0);
    Ikbo__V1__RankRequest *m = rank_wire_decode(w, n, a, st);
    assert_null(m);
    pb_arena_free(a);
    rq_status st2;
    Ikbo__V1__RankRequest *f = (Ikbo__V1__RankRequest *)pb_check_unpack(
        &ikbo__v1__rank_request__descriptor, NULL, w, n, &st2);
    assert_null(f);
    if (st->code == RQ_OK) *st = st2; /* declined: the fallback's answer */
    assert_string_equal(st->msg, st2.msg);
}

static void test_json_strings(void **s)
{
    (void)s;
    /* (JSON with X where the bad string goes, the path JSON names) */
    static const char *const docs[][2] = {
        {"{\"model\":\"X\"}", "model"},
        {"{\"request_id\":\"X\"}", "request_id"},
        {"{\"users\":[{},{\"key\":\"X\"}]}", "users[1].key"},
        {"{\"users\":[{\"sparse\":[{},{\"name\":\"X\"}]}]}", "users[0].sparse[1].name"},
        {"{\"candidates\":[{\"sparse\":[{\"name\":\"X\"}]}]}", "candidates[0].sparse[0].name"},
        {"{\"requestId\":\"X\"}", "requestId"},
    };
    for (size_t i = 0; i < sizeof docs / sizeof *docs; i++) {
        char json[256], ph[256], want[128];
        const char *x = strchr(docs[i][0], 'X');
        int pre = (int)(x - docs[i][0]);
        /* NUL: JSON names the field; the wire answers the same words. */
        snprintf(json, sizeof json, "%.*sde\\u0000mo%s", pre, docs[i][0], x + 1);
        snprintf(want, sizeof want, "%s: string contains NUL at byte 2", docs[i][1]);
        parse_err(json, want);
        snprintf(ph, sizeof ph, "%.*sPHPHP%s", pre, docs[i][0], x + 1);
        size_t n;
        uint8_t *w = wire_with(ph, "de\0mo", &n);
        rq_status st;
        wire_answer(w, n, &st);
        assert_int_equal(st.code, RQ_INVALID_ARGUMENT);
        if (!strcmp(docs[i][1], "requestId"))
            assert_string_equal(st.msg, "request_id: string contains NUL at byte 2");
        else
            assert_string_equal(st.msg, want);
        free(w);
        /* Invalid UTF-8 (a raw 0xff, a lone surrogate escape): JSON that
         * is not UTF-8 is not JSON; both transports refuse the content. */
        snprintf(json, sizeof json, "%.*sde\xffmo%s", pre, docs[i][0], x + 1);
        parse_err(json, "invalid JSON at line 1");
        snprintf(json, sizeof json, "%.*sde\\ud800mo%s", pre, docs[i][0], x + 1);
        parse_err(json, "invalid JSON at line 1");
        w = wire_with(ph, "de\xed\xa0\x80", &n);
        wire_answer(w, n, &st);
        assert_int_equal(st.code, RQ_INVALID_ARGUMENT);
        assert_non_null(strstr(st.msg, "string is not valid UTF-8 at byte 2"));
        free(w);
        /* Valid non-ASCII content is taken by both. */
        snprintf(json, sizeof json, "%.*sd\\u00e9\\ud83d\\ude00%s", pre, docs[i][0], x + 1);
        rq_request_free(parse_ok(json));
    }
    /* A NUL in a key stays jansson's refusal (it cannot name a field). */
    parse_err("{\"mo\\u0000del\":\"a\"}", "invalid JSON");
}

/* ---------------- validation ---------------- */

static void test_validate_ok(void **s)
{
    (void)s;
    validate_expect("{\"users\":[" U0 "],\"candidates\":[" C0(0) "]}", RQ_OK, "");
    /* top_k beyond C, full features, history with and without actions */
    validate_expect("{\"topK\":100,\"users\":[{\"dense\":[1,2,3],\"sparse\":[{\"name\":\"lang\",\"ids\":[1,2,3]},"
                    "{\"name\":\"country\"}],\"historyIds\":[1,2,3,4,5],\"historyActions\":[0,1,2,3,0]},"
                    "{\"dense\":[0,0,0],\"historyIds\":[9]}],"
                    "\"candidates\":[" C0(0) "," C0(1) ",{\"id\":2,\"user\":1,\"dense\":[1,1],"
                    "\"sparse\":[{\"name\":\"author\",\"ids\":[7]},{\"name\":\"item\",\"ids\":[]}]}]}",
                    RQ_OK, "");
}

static void test_validate_counts(void **s)
{
    (void)s;
    validate_expect("{\"candidates\":[" C0(0) "]}", RQ_INVALID_ARGUMENT, "users: request has no users");
    validate_expect("{\"users\":[" U0 "]}", RQ_INVALID_ARGUMENT, "candidates: request has no candidates");
    validate_expect("{\"users\":[" U0 "," U0 "," U0 "," U0 "," U0 "],\"candidates\":[" C0(0) "]}",
                    RQ_RESOURCE_EXHAUSTED, "users: request has 5 users, limit max_users = 4");
    validate_expect("{\"users\":[" U0 "],\"candidates\":[" C0(0) "," C0(0) "," C0(0) "," C0(0) ","
                    C0(0) "," C0(0) "," C0(0) "," C0(0) "," C0(0) "]}",
                    RQ_RESOURCE_EXHAUSTED, "candidates: request has 9 candidates, limit max_candidates = 8");
}

/* Dense rows wider than the scan's 8-float step (validate.c any_nonfinite):
 * a NaN or an infinity at every index of a 21-wide user row and a 19-wide
 * candidate row is found and named; the largest, smallest and negative-zero
 * finite values at every index are not refused. */
static void test_validate_dense_wide(void **s)
{
    (void)s;
    ikbo_model_info mi = model();
    mi.user_dense = 21;
    mi.cand_dense = 19;
    const char *const bad[] = {"\"NaN\"", "\"Infinity\"", "\"-Infinity\""};
    const char *const name[] = {"NaN", "Infinity", "-Infinity"};
    const char *const fine[] = {"3.4028234e38", "-3.4028234e38", "1e-45", "-0.0"};
    rq_limits lim;
    rq_limits_default(&lim);
    for (int side = 0; side < 2; side++) {
        const int n = side ? 19 : 21;
        for (int k = 0; k < n; k++)
            for (int v = 0; v < 7; v++) {
                char row[512] = "", json[1400];
                for (int q = 0; q < n; q++) {
                    const char *x = q != k ? "0.5" : v < 3 ? bad[v] : fine[v - 3];
                    strcat(row, q ? "," : "");
                    strcat(row, x);
                }
                char u[600], c[600];
                snprintf(u, sizeof u, "{\"dense\":[%s]}", side ? "1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1" : row);
                snprintf(c, sizeof c, "{\"id\":1,\"user\":0,\"dense\":[%s]}",
                         side ? row : "1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1");
                snprintf(json, sizeof json, "{\"users\":[%s],\"candidates\":[%s]}", u, c);
                Ikbo__V1__RankRequest *r = parse_ok(json);
                rq_status st;
                int rc = rq_validate(r, &mi, &lim, &st);
                if (v < 3) {
                    char want[64];
                    snprintf(want, sizeof want, "%s[0].dense[%d] is %s", side ? "candidates" : "users",
                             k, name[v]);
                    if (rc != -1 || st.code != RQ_INVALID_ARGUMENT || strcmp(st.msg, want))
                        fail_msg("%s: got %d '%s', want '%s'", json, rc, st.msg, want);
                } else if (rc) {
                    fail_msg("%s: refused: %s", json, st.msg);
                }
                rq_request_free(r);
            }
    }
}

/* Actions out of range at every index of a 21-event history (past the
 * scan's 8-action step, validate.c) are found and named. */
static void test_validate_actions_wide(void **s)
{
    (void)s;
    ikbo_model_info mi = model();
    mi.hist_max_len = 32;
    rq_limits lim;
    rq_limits_default(&lim);
    const int bad[] = {4, -1, 1000000};
    for (int k = 0; k < 21; k++)
        for (int v = 0; v < 3; v++) {
            char ids[256] = "", acts[256] = "", json[800];
            for (int q = 0; q < 21; q++) {
                char one[32];
                snprintf(one, sizeof one, "%s%d", q ? "," : "", q + 1);
                strcat(ids, one);
                snprintf(one, sizeof one, "%s%d", q ? "," : "", q == k ? bad[v] : q % 4);
                strcat(acts, one);
            }
            snprintf(json, sizeof json,
                     "{\"model\":\"demo\",\"users\":[{\"dense\":[1,2,3],\"historyIds\":[%s],"
                     "\"historyActions\":[%s]}],\"candidates\":[" C0(0) "]}", ids, acts);
            Ikbo__V1__RankRequest *r = parse_ok(json);
            rq_status st;
            char want[128];
            snprintf(want, sizeof want,
                     "users[0].history_actions[%d] = %d is outside [0, 4) for model 'demo'", k, bad[v]);
            if (rq_validate(r, &mi, &lim, &st) != -1 || st.code != RQ_INVALID_ARGUMENT ||
                strcmp(st.msg, want))
                fail_msg("%s: got '%s', want '%s'", json, st.msg, want);
            rq_request_free(r);
        }
}

static void test_validate_user_index(void **s)
{
    (void)s;
    validate_expect("{\"users\":[" U0 "," U0 "," U0 "],\"candidates\":[" C0(0) "," C0(2) "," C0(3) "]}",
                    RQ_INVALID_ARGUMENT, "candidates[2].user = 3 but request has 3 users");
}

static void test_validate_dense(void **s)
{
    (void)s;
    validate_expect("{\"model\":\"demo\",\"users\":[{\"dense\":[1,2,3,4,5]}],\"candidates\":[" C0(0) "]}",
                    RQ_INVALID_ARGUMENT, "users[0].dense has 5 values, model 'demo' expects 3");
    /* model name from the version dir when the request names none */
    validate_expect("{\"users\":[" U0 "],\"candidates\":[" C0(0) ",{\"user\":0,\"dense\":[1]}]}",
                    RQ_INVALID_ARGUMENT, "candidates[1].dense has 1 values, model 'demo' expects 2");
    validate_expect("{\"users\":[" U0 ",{\"dense\":[1,\"NaN\",3]}],\"candidates\":[" C0(0) "]}",
                    RQ_INVALID_ARGUMENT, "users[1].dense[1] is NaN");
    validate_expect("{\"users\":[" U0 "],\"candidates\":[" C0(0) "," C0(0) "," C0(0)
                    ",{\"user\":0,\"dense\":[0,\"-Infinity\"]}]}",
                    RQ_INVALID_ARGUMENT, "candidates[3].dense[1] is -Infinity");
    validate_expect("{\"users\":[{\"dense\":[\"Infinity\",0,0]}],\"candidates\":[" C0(0) "]}",
                    RQ_INVALID_ARGUMENT, "users[0].dense[0] is Infinity");
}

static void test_validate_sparse(void **s)
{
    (void)s;
    validate_expect("{\"users\":[" U0 ",{\"dense\":[1,2,3],\"sparse\":[{\"name\":\"colour\",\"ids\":[1]}]}],"
                    "\"candidates\":[" C0(0) "]}",
                    RQ_INVALID_ARGUMENT,
                    "users[1].sparse[0].name = \"colour\": unknown user sparse feature (model has: country, lang)");
    validate_expect("{\"users\":[" U0 "],\"candidates\":[" C0(0) ",{\"user\":0,\"dense\":[1,2],"
                    "\"sparse\":[{\"name\":\"item\"},{\"name\":\"lang\"}]}]}",
                    RQ_INVALID_ARGUMENT,
                    "candidates[1].sparse[1].name = \"lang\": unknown candidate sparse feature (model has: item, author)");
    validate_expect("{\"users\":[{\"dense\":[1,2,3],\"sparse\":[{\"name\":\"lang\"},{\"name\":\"lang\"}]}],"
                    "\"candidates\":[" C0(0) "]}",
                    RQ_INVALID_ARGUMENT, "users[0].sparse[1].name = \"lang\": duplicate feature (also users[0].sparse[0])");
    validate_expect("{\"users\":[" U0 "],\"candidates\":[{\"user\":0,\"dense\":[1,2],"
                    "\"sparse\":[{\"name\":\"author\",\"ids\":[1,2,3,4]}]}]}",
                    RQ_RESOURCE_EXHAUSTED, "candidates[0].sparse[0].ids has 4 ids, limit max_ids_per_bag = 3");
    validate_expect("{\"users\":[{\"dense\":[1,2,3],\"sparse\":[{\"name\":\"lang\"},{\"name\":\"country\"},"
                    "{\"name\":\"x\"}]}],\"candidates\":[" C0(0) "]}",
                    RQ_RESOURCE_EXHAUSTED, "users[0].sparse has 3 features, limit max_sparse_features = 2");
    validate_expect("{\"users\":[{\"dense\":[1,2,3],\"sparse\":[{\"name\":\"a\\u0001\\\"b\"}]}],"
                    "\"candidates\":[" C0(0) "]}",
                    RQ_INVALID_ARGUMENT, "users[0].sparse[0].name = \"a??b\": unknown user sparse feature");
}

static void test_validate_history(void **s)
{
    (void)s;
    validate_expect("{\"users\":[{\"dense\":[1,2,3],\"historyIds\":[1,2,3,4,5,6]}],\"candidates\":[" C0(0) "]}",
                    RQ_RESOURCE_EXHAUSTED, "users[0].history_ids has 6 events, limit max_history = 5");
    validate_expect("{\"users\":[" U0 ",{\"dense\":[1,2,3],\"historyIds\":[1,2],\"historyActions\":[1]}],"
                    "\"candidates\":[" C0(0) "]}",
                    RQ_INVALID_ARGUMENT, "users[1].history_actions has 1 values but history_ids has 2");
    validate_expect("{\"users\":[{\"dense\":[1,2,3],\"historyActions\":[1]}],\"candidates\":[" C0(0) "]}",
                    RQ_INVALID_ARGUMENT, "users[0].history_actions has 1 values but history_ids has 0");
    validate_expect("{\"users\":[{\"dense\":[1,2,3],\"historyIds\":[1,2,3],\"historyActions\":[0,3,4]}],"
                    "\"candidates\":[" C0(0) "]}",
                    RQ_INVALID_ARGUMENT, "users[0].history_actions[2] = 4 is outside [0, 4)");
    validate_expect("{\"users\":[{\"dense\":[1,2,3],\"historyIds\":[1],\"historyActions\":[-1]}],"
                    "\"candidates\":[" C0(0) "]}",
                    RQ_INVALID_ARGUMENT, "users[0].history_actions[0] = -1 is outside [0, 4)");

    /* a model without history */
    ikbo_model_info mi = model();
    mi.has_history = 0;
    mi.hist_actions = 0;
    mi.hist_max_len = 0;
    rq_status st;
    Ikbo__V1__RankRequest *r =
        parse_ok("{\"model\":\"nohist\",\"users\":[{\"dense\":[1,2,3],\"historyIds\":[1]}],\"candidates\":[" C0(0) "]}");
    assert_int_equal(rq_validate(r, &mi, NULL, &st), -1);
    assert_int_equal(st.code, RQ_INVALID_ARGUMENT);
    assert_string_equal(st.msg, "users[0].history_ids: model 'nohist' takes no history");
    rq_request_free(r);
    r = parse_ok("{\"users\":[{\"dense\":[1,2,3]}],\"candidates\":[" C0(0) "]}");
    assert_int_equal(rq_validate(r, &mi, NULL, &st), 0);
    assert_int_equal(st.code, RQ_OK);
    rq_request_free(r);
}

/* ---------------- plan: dedup + grouping ---------------- */

static rq_plan *plan_of(const char *json, int collide, Ikbo__V1__RankRequest **out_req)
{
    ikbo_model_info mi = model();
    Ikbo__V1__RankRequest *r = parse_ok(json);
    rq_status st;
    if (rq_validate(r, &mi, NULL, &st))
        fail_msg("invalid: %s", st.msg);
    rq_plan_opts o = {.collide_hashes = collide};
    rq_plan *p = rq_plan_build_opts(r, &mi, &o, &st);
    if (!p)
        fail_msg("plan: %s", st.msg);
    if (out_req)
        *out_req = r;
    else
        rq_request_free(r);
    return p;
}

static int rows_of(const char *users_json, int n_users, int collide)
{
    /* one candidate per user, in order */
    char buf[4096];
    int k = snprintf(buf, sizeof buf, "{\"users\":%s,\"candidates\":[", users_json);
    for (int j = 0; j < n_users; j++)
        k += snprintf(buf + k, sizeof buf - (size_t)k, "%s{\"id\":%d,\"user\":%d,\"dense\":[0,0]}",
                      j ? "," : "", j, j);
    snprintf(buf + k, sizeof buf - (size_t)k, "]}");
    rq_plan *p = plan_of(buf, collide, NULL);
    int n = p->batch.n_users;
    rq_plan_free(p);
    return n;
}

#define UD(x) "\"dense\":[" x "]"
static void dedup_cases(int collide)
{
    /* same key same content -> 1 row */
    assert_int_equal(rows_of("[{\"key\":\"a\"," UD("1,2,3") "},{\"key\":\"a\"," UD("1,2,3") "}]", 2, collide), 1);
    /* same key, different dense / sparse / history / actions -> 2 rows */
    assert_int_equal(rows_of("[{\"key\":\"a\"," UD("1,2,3") "},{\"key\":\"a\"," UD("1,2,4") "}]", 2, collide), 2);
    assert_int_equal(rows_of("[{\"key\":\"a\"," UD("0,0,0") "},{\"key\":\"a\"," UD("-0.0,0,0") "}]", 2, collide), 2);
    assert_int_equal(rows_of("[{\"key\":\"a\"," UD("1,2,3") ",\"sparse\":[{\"name\":\"lang\",\"ids\":[1]}]},"
                             "{\"key\":\"a\"," UD("1,2,3") ",\"sparse\":[{\"name\":\"lang\",\"ids\":[2]}]}]", 2, collide), 2);
    assert_int_equal(rows_of("[{\"key\":\"a\"," UD("1,2,3") ",\"sparse\":[{\"name\":\"lang\",\"ids\":[1]}]},"
                             "{\"key\":\"a\"," UD("1,2,3") ",\"sparse\":[{\"name\":\"country\",\"ids\":[1]}]}]", 2, collide), 2);
    assert_int_equal(rows_of("[{\"key\":\"a\"," UD("1,2,3") ",\"historyIds\":[1,2]},"
                             "{\"key\":\"a\"," UD("1,2,3") ",\"historyIds\":[1,3]}]", 2, collide), 2);
    /* only a middle history id differs (the short hash cannot tell) */
    assert_int_equal(rows_of("[{\"key\":\"a\"," UD("1,2,3") ",\"historyIds\":[1,5,2]},"
                             "{\"key\":\"a\"," UD("1,2,3") ",\"historyIds\":[1,6,2]},"
                             "{\"key\":\"a\"," UD("1,2,3") ",\"historyIds\":[1,6,2]},"
                             "{\"key\":\"a\"," UD("1,2,3") ",\"historyIds\":[1,5,2]}]", 4, collide), 2);
    assert_int_equal(rows_of("[{\"key\":\"a\"," UD("1,2,3") ",\"historyIds\":[1,2]},"
                             "{\"key\":\"a\"," UD("1,2,3") ",\"historyIds\":[1,2],\"historyActions\":[0,1]}]", 2, collide), 2);
    /* absent actions == all-zero actions */
    assert_int_equal(rows_of("[{\"key\":\"a\"," UD("1,2,3") ",\"historyIds\":[1,2]},"
                             "{\"key\":\"a\"," UD("1,2,3") ",\"historyIds\":[1,2],\"historyActions\":[0,0]}]", 2, collide), 1);
    /* empty keys, equal content -> 1 row; different keys, equal content -> 2 */
    assert_int_equal(rows_of("[{" UD("1,2,3") "},{" UD("1,2,3") "},{\"key\":\"\"," UD("1,2,3") "}]", 3, collide), 1);
    assert_int_equal(rows_of("[{\"key\":\"a\"," UD("1,2,3") "},{\"key\":\"b\"," UD("1,2,3") "},{" UD("1,2,3") "}]", 3, collide), 3);
    /* sparse feature order does not matter; absent == empty bag */
    assert_int_equal(rows_of("[{" UD("1,2,3") ",\"sparse\":[{\"name\":\"lang\",\"ids\":[1,2]},{\"name\":\"country\",\"ids\":[5]}]},"
                             "{" UD("1,2,3") ",\"sparse\":[{\"name\":\"country\",\"ids\":[5]},{\"name\":\"lang\",\"ids\":[1,2]}]},"
                             "{" UD("1,2,3") ",\"sparse\":[{\"name\":\"country\",\"ids\":[5]},{\"name\":\"lang\",\"ids\":[1,2]}]}]", 3, collide), 1);
    assert_int_equal(rows_of("[{" UD("1,2,3") ",\"sparse\":[{\"name\":\"lang\",\"ids\":[]}]},{" UD("1,2,3") "}]", 2, collide), 1);
    /* id order within a bag matters (documented as order-sensitive) */
    assert_int_equal(rows_of("[{" UD("1,2,3") ",\"sparse\":[{\"name\":\"lang\",\"ids\":[1,2]}]},"
                             "{" UD("1,2,3") ",\"sparse\":[{\"name\":\"lang\",\"ids\":[2,1]}]}]", 2, collide), 2);
    /* ids moved across a bag boundary are different content */
    assert_int_equal(rows_of("[{" UD("1,2,3") ",\"sparse\":[{\"name\":\"lang\",\"ids\":[1,2]},{\"name\":\"country\",\"ids\":[]}]},"
                             "{" UD("1,2,3") ",\"sparse\":[{\"name\":\"lang\",\"ids\":[1]},{\"name\":\"country\",\"ids\":[2]}]}]", 2, collide), 2);
    /* a mix: 5 users, 3 distinct */
    assert_int_equal(rows_of("[{" UD("1,2,3") "},{\"key\":\"k\"," UD("1,2,3") "},{" UD("1,2,3") "},"
                             "{\"key\":\"k\"," UD("1,2,3") "},{" UD("7,2,3") "}]", 5, collide), 3);
}

static void test_dedup(void **s)
{
    (void)s;
    dedup_cases(0);
}

static void test_dedup_hash_collisions(void **s)
{
    (void)s;
    dedup_cases(1);
    dedup_cases(2);
}

static void test_grouping(void **s)
{
    (void)s;
    Ikbo__V1__RankRequest *r;
    /* users 0 and 3 are duplicates (empty key), user 2 unreferenced */
    rq_plan *p = plan_of(
        "{\"users\":["
        "{\"dense\":[1,1,1],\"sparse\":[{\"name\":\"lang\",\"ids\":[10,11]}],\"historyIds\":[5,6,7],\"historyActions\":[1,2,3]},"
        "{\"dense\":[2,2,2],\"sparse\":[{\"name\":\"country\",\"ids\":[20]}],\"historyIds\":[8]},"
        "{\"dense\":[3,3,3]},"
        "{\"dense\":[1,1,1],\"sparse\":[{\"name\":\"lang\",\"ids\":[10,11]}],\"historyIds\":[5,6,7],\"historyActions\":[1,2,3]}],"
        "\"candidates\":["
        "{\"id\":100,\"user\":1,\"dense\":[0,1],\"sparse\":[{\"name\":\"author\",\"ids\":[1]}]},"
        "{\"id\":101,\"user\":0,\"dense\":[2,3]},"
        "{\"id\":102,\"user\":1,\"dense\":[4,5],\"sparse\":[{\"name\":\"item\",\"ids\":[7,8]}]},"
        "{\"id\":103,\"user\":3,\"dense\":[6,7]},"
        "{\"id\":104,\"user\":0,\"dense\":[8,9],\"sparse\":[{\"name\":\"item\",\"ids\":[9]},{\"name\":\"author\",\"ids\":[2,3]}]}]}",
        0, &r);
    const ikbo_batch *b = &p->batch;
    assert_int_equal(b->n_users, 2);
    assert_int_equal(b->n_cands, 5);
    /* rows in order of first reference: user 1 -> row 0, users 0,3 -> row 1 */
    assert_int_equal(p->n_request_users, 4);
    assert_int_equal(p->user_row[0], 1);
    assert_int_equal(p->user_row[1], 0);
    assert_int_equal(p->user_row[2], -1);
    assert_int_equal(p->user_row[3], 1);
    assert_int_equal(p->row_user[0], 1);
    assert_int_equal(p->row_user[1], 0);
    const int32_t order[] = {0, 2, 1, 3, 4}, map[] = {0, 0, 1, 1, 1};
    for (int i = 0; i < 5; i++) {
        assert_int_equal(p->order[i], order[i]);
        assert_int_equal(b->map[i], map[i]);
        assert_true(b->cand_dense[2 * i] == (float)(2 * order[i]));
        assert_true(b->cand_dense[2 * i + 1] == (float)(2 * order[i] + 1));
    }
    /* user rows */
    assert_true(b->user_dense[0] == 2.0f && b->user_dense[3] == 1.0f && b->user_dense[5] == 1.0f);
    /* user sparse: country (feature 0): row0 [20], row1 []; lang: row0 [], row1 [10,11] */
    assert_int_equal(b->user_sparse[0].offsets[1], 1);
    assert_int_equal(b->user_sparse[0].offsets[2], 1);
    assert_int_equal(b->user_sparse[0].ids[0], 20);
    assert_int_equal(b->user_sparse[1].offsets[1], 0);
    assert_int_equal(b->user_sparse[1].offsets[2], 2);
    assert_int_equal(b->user_sparse[1].ids[0], 10);
    assert_int_equal(b->user_sparse[1].ids[1], 11);
    /* cand sparse in batch order [100, 102, 101, 103, 104]: item: [], [7,8], [], [], [9] */
    const int64_t item_off[] = {0, 0, 2, 2, 2, 3}, author_off[] = {0, 1, 1, 1, 1, 3};
    for (int i = 0; i < 6; i++) {
        assert_int_equal(b->cand_sparse[0].offsets[i], item_off[i]);
        assert_int_equal(b->cand_sparse[1].offsets[i], author_off[i]);
    }
    assert_int_equal(b->cand_sparse[0].ids[2], 9);
    assert_int_equal(b->cand_sparse[1].ids[0], 1);
    assert_int_equal(b->cand_sparse[1].ids[2], 3);
    /* history: row0 [8] (no actions -> zeros), row1 [5,6,7] actions [1,2,3] */
    assert_int_equal(b->hist.offsets[0], 0);
    assert_int_equal(b->hist.offsets[1], 1);
    assert_int_equal(b->hist.offsets[2], 4);
    assert_int_equal(b->hist.ids[0], 8);
    assert_int_equal(b->hist.ids[3], 7);
    assert_non_null(b->hist_actions);
    assert_int_equal(b->hist_actions[0], 0);
    assert_int_equal(b->hist_actions[1], 1);
    assert_int_equal(b->hist_actions[3], 3);
    rq_plan_free(p);
    rq_request_free(r);

    /* no actions anywhere -> NULL; no user dense in a model -> NULL */
    p = plan_of("{\"users\":[{\"dense\":[1,2,3],\"historyIds\":[1]}],\"candidates\":[" C0(0) "]}", 0, NULL);
    assert_null(p->batch.hist_actions);
    assert_int_equal(p->batch.hist.offsets[1], 1);
    rq_plan_free(p);
}

static void test_plan_refuses_bad_request(void **s)
{
    (void)s;
    /* Unvalidated input must not crash the planner. */
    ikbo_model_info mi = model();
    const char *bad[] = {
        "{\"users\":[" U0 "],\"candidates\":[" C0(1) "]}",
        "{\"users\":[{\"dense\":[1]}],\"candidates\":[" C0(0) "]}",
        "{\"users\":[" U0 "],\"candidates\":[{\"dense\":[1,2,3]}]}",
        "{\"users\":[{\"dense\":[1,2,3],\"sparse\":[{\"name\":\"zz\"}]}],\"candidates\":[" C0(0) "]}",
        "{\"users\":[" U0 "],\"candidates\":[{\"dense\":[1,2],\"sparse\":[{\"name\":\"item\"},{\"name\":\"item\"}]}]}",
        "{\"users\":[{\"dense\":[1,2,3],\"historyIds\":[1,2],\"historyActions\":[1]}],\"candidates\":[" C0(0) "]}",
        "{\"users\":[" U0 "]}",
        "{\"candidates\":[" C0(0) "]}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        Ikbo__V1__RankRequest *r = parse_ok(bad[i]);
        rq_status st;
        rq_plan *p = rq_plan_build(r, &mi, &st);
        if (p)
            fail_msg("plan accepted %s", bad[i]);
        assert_int_equal(st.code, RQ_INVALID_ARGUMENT);
        rq_request_free(r);
    }
}

/* Random requests: map non-decreasing, order a permutation, stable within a
 * row, and every candidate's row holds its own user's content. */
static void test_plan_random(void **s)
{
    (void)s;
    ikbo_model_info mi = model();
    unsigned seed = 12345;
#define RND() (seed = seed * 1103515245u + 12345u, (seed >> 16) & 0x7fff)
    for (int iter = 0; iter < 200; iter++) {
        int nu = 1 + (int)(RND() % 12), nc = 1 + (int)(RND() % 40);
        Ikbo__V1__RankRequest *r = malloc(sizeof *r);
        ikbo__v1__rank_request__init(r);
        r->n_users = (size_t)nu;
        r->users = calloc((size_t)nu, sizeof *r->users);
        for (int j = 0; j < nu; j++) {
            Ikbo__V1__User *u = malloc(sizeof *u);
            ikbo__v1__user__init(u);
            r->users[j] = u;
            if (RND() % 2) {
                u->key = malloc(4);
                snprintf(u->key, 4, "k%d", (int)(RND() % 3));
            }
            u->n_dense = 3;
            u->dense = malloc(3 * sizeof(float));
            for (int d = 0; d < 3; d++)
                u->dense[d] = (float)(RND() % 2);
            if (RND() % 2) {
                u->n_sparse = 1;
                u->sparse = malloc(sizeof *u->sparse);
                u->sparse[0] = malloc(sizeof **u->sparse);
                ikbo__v1__sparse_feature__init(u->sparse[0]);
                u->sparse[0]->name = strdup(RND() % 2 ? "lang" : "country");
                u->sparse[0]->n_ids = RND() % 3;
                u->sparse[0]->ids = malloc((u->sparse[0]->n_ids + 1) * sizeof(int64_t));
                for (size_t k = 0; k < u->sparse[0]->n_ids; k++)
                    u->sparse[0]->ids[k] = RND() % 2;
            }
            u->n_history_ids = RND() % 3;
            u->history_ids = malloc((u->n_history_ids + 1) * sizeof(int64_t));
            for (size_t k = 0; k < u->n_history_ids; k++)
                u->history_ids[k] = RND() % 2;
        }
        r->n_candidates = (size_t)nc;
        r->candidates = calloc((size_t)nc, sizeof *r->candidates);
        for (int i = 0; i < nc; i++) {
            Ikbo__V1__Candidate *c = malloc(sizeof *c);
            ikbo__v1__candidate__init(c);
            r->candidates[i] = c;
            c->id = i;
            c->user = RND() % (unsigned)nu;
            c->n_dense = 2;
            c->dense = malloc(2 * sizeof(float));
            c->dense[0] = (float)i;
            c->dense[1] = (float)c->user;
        }
        rq_status st;
        assert_int_equal(rq_validate(r, &mi, NULL, &st), 0);
        for (int collide = 0; collide < 2; collide++) {
            rq_plan_opts o = {.collide_hashes = collide};
            rq_plan *p = rq_plan_build_opts(r, &mi, &o, &st);
            assert_non_null(p);
            const ikbo_batch *b = &p->batch;
            assert_int_equal(b->n_cands, nc);
            int *seen = calloc((size_t)nc, sizeof *seen);
            for (int i = 0; i < nc; i++) {
                assert_true(b->map[i] >= 0 && b->map[i] < b->n_users);
                if (i) {
                    assert_true(b->map[i - 1] <= b->map[i]);
                    if (b->map[i - 1] == b->map[i])
                        assert_true(p->order[i - 1] < p->order[i]);
                }
                int ri = p->order[i];
                assert_false(seen[ri]);
                seen[ri] = 1;
                assert_true(b->cand_dense[2 * i] == (float)ri);
                const Ikbo__V1__User *u = r->users[r->candidates[ri]->user];
                int row = b->map[i];
                assert_int_equal(p->user_row[r->candidates[ri]->user], row);
                assert_memory_equal(b->user_dense + 3 * row, u->dense, 3 * sizeof(float));
                int64_t h0 = b->hist.offsets[row], h1 = b->hist.offsets[row + 1];
                assert_int_equal(h1 - h0, (int64_t)u->n_history_ids);
                if (u->n_history_ids)
                    assert_memory_equal(b->hist.ids + h0, u->history_ids, u->n_history_ids * sizeof(int64_t));
                for (int f = 0; f < 2; f++) {
                    size_t want = 0;
                    const int64_t *ids = NULL;
                    if (u->n_sparse && !strcmp(u->sparse[0]->name, USER_SPARSE[f])) {
                        want = u->sparse[0]->n_ids;
                        ids = u->sparse[0]->ids;
                    }
                    int64_t s0 = b->user_sparse[f].offsets[row], s1 = b->user_sparse[f].offsets[row + 1];
                    assert_int_equal(s1 - s0, (int64_t)want);
                    if (want)
                        assert_memory_equal(b->user_sparse[f].ids + s0, ids, want * sizeof(int64_t));
                }
                /* same key required to share a row */
                const Ikbo__V1__User *rep = r->users[p->row_user[row]];
                assert_string_equal(rep->key, u->key);
            }
            free(seen);
            rq_plan_free(p);
        }
        rq_request_free(r);
    }
}

/* ---------------- response ---------------- */

/* Scores by request position -> batch order arrays. */
static void fake_scores(const rq_plan *p, const float *by_req, float *scores, float *task)
{
    for (int i = 0; i < p->batch.n_cands; i++) {
        int ri = p->order[i];
        scores[i] = by_req[ri];
        task[2 * i] = (float)ri;
        task[2 * i + 1] = (float)ri + 0.5f;
    }
}

static void test_response_order(void **s)
{
    (void)s;
    ikbo_model_info mi = model();
    Ikbo__V1__RankRequest *r;
    rq_plan *p = plan_of("{\"requestId\":\"abc\",\"users\":[" U0 ",{\"dense\":[9,9,9]}],\"candidates\":["
                         "{\"id\":10,\"user\":1,\"dense\":[0,0]},{\"id\":11,\"user\":0,\"dense\":[0,0]},"
                         "{\"id\":12,\"user\":1,\"dense\":[0,0]},{\"id\":13,\"user\":0,\"dense\":[0,0]}]}",
                         0, &r);
    const float by_req[] = {0.1f, 0.9f, 0.5f, 0.9f};
    float scores[4], task[8];
    fake_scores(p, by_req, scores, task);
    rq_status st;
    Ikbo__V1__RankResponse *resp = rq_response_build(r, p, "demo", 3, &mi, task, scores, &st);
    assert_non_null(resp);
    assert_string_equal(resp->model, "demo");
    assert_int_equal(resp->model_version, 3);
    assert_string_equal(resp->request_id, "abc");
    assert_int_equal(resp->unique_users, 2);
    assert_int_equal(resp->n_tasks, 2);
    assert_string_equal(resp->tasks[0], "click");
    assert_string_equal(resp->tasks[1], "like");
    assert_int_equal(resp->n_scores, 4);
    for (int k = 0; k < 4; k++) {
        assert_int_equal(resp->scores[k]->index, k);
        assert_int_equal(resp->scores[k]->id, 10 + k);
        assert_true(resp->scores[k]->score == by_req[k]);
        assert_int_equal(resp->scores[k]->n_task_scores, 2);
        assert_true(resp->scores[k]->task_scores[0] == (float)k);
        assert_true(resp->scores[k]->task_scores[1] == (float)k + 0.5f);
    }

    /* response JSON */
    char *j = rq_response_to_json(resp);
    assert_non_null(j);
    json_t *o = json_loads(j, 0, NULL);
    assert_non_null(o);
    assert_string_equal(json_string_value(json_object_get(o, "model")), "demo");
    assert_string_equal(json_string_value(json_object_get(o, "modelVersion")), "3");
    assert_string_equal(json_string_value(json_object_get(o, "requestId")), "abc");
    assert_int_equal(json_integer_value(json_object_get(o, "uniqueUsers")), 2);
    assert_string_equal(json_string_value(json_array_get(json_object_get(o, "tasks"), 1)), "like");
    json_t *s1 = json_array_get(json_object_get(o, "scores"), 1);
    assert_string_equal(json_string_value(json_object_get(s1, "id")), "11");
    assert_int_equal(json_integer_value(json_object_get(s1, "index")), 1);
    assert_true((float)json_number_value(json_object_get(s1, "score")) == 0.9f);
    assert_true((float)json_number_value(json_array_get(json_object_get(s1, "taskScores"), 1)) == 1.5f);
    json_decref(o);
    free(j);
    rq_response_free(resp);

    /* top_k = 3: 0.9 (index 1), 0.9 (index 3), 0.5 (index 2) */
    r->top_k = 3;
    resp = rq_response_build(r, p, "demo", 3, &mi, task, scores, &st);
    assert_int_equal(resp->n_scores, 3);
    assert_int_equal(resp->scores[0]->index, 1);
    assert_int_equal(resp->scores[1]->index, 3);
    assert_int_equal(resp->scores[2]->index, 2);
    assert_int_equal(resp->scores[1]->id, 13);
    assert_true(resp->scores[1]->task_scores[0] == 3.0f);
    rq_response_free(resp);

    /* top_k > C: all, sorted */
    r->top_k = 100;
    resp = rq_response_build(r, p, "demo", 3, &mi, NULL, scores, &st);
    assert_int_equal(resp->n_scores, 4);
    const uint32_t want[] = {1, 3, 2, 0};
    for (int k = 0; k < 4; k++) {
        assert_int_equal(resp->scores[k]->index, want[k]);
        assert_int_equal(resp->scores[k]->n_task_scores, 0);
    }
    rq_response_free(resp);
    rq_plan_free(p);
    rq_request_free(r);
}

static void test_response_ties_and_nan(void **s)
{
    (void)s;
    ikbo_model_info mi = model();
    Ikbo__V1__RankRequest *r;
    /* all equal scores: request order; NaN ranks last */
    rq_plan *p = plan_of("{\"topK\":5,\"users\":[" U0 ",{\"dense\":[2,2,2]}],\"candidates\":["
                         "{\"user\":1,\"dense\":[0,0]},{\"user\":0,\"dense\":[0,0]},{\"user\":1,\"dense\":[0,0]},"
                         "{\"user\":0,\"dense\":[0,0]},{\"user\":1,\"dense\":[0,0]}]}",
                         0, &r);
    const float by_req[] = {0.5f, 0.5f, NAN, 0.5f, 0.5f};
    float scores[5], task[10];
    fake_scores(p, by_req, scores, task);
    rq_status st;
    Ikbo__V1__RankResponse *resp = rq_response_build(r, p, "demo", 1, &mi, task, scores, &st);
    const uint32_t want[] = {0, 1, 3, 4, 2};
    for (int k = 0; k < 5; k++)
        assert_int_equal(resp->scores[k]->index, want[k]);
    char *j = rq_response_to_json(resp);
    assert_non_null(strstr(j, "\"score\":\"NaN\""));
    free(j);
    rq_response_free(resp);

    /* top_k = 1 */
    r->top_k = 1;
    resp = rq_response_build(r, p, "demo", 1, &mi, task, scores, &st);
    assert_int_equal(resp->n_scores, 1);
    assert_int_equal(resp->scores[0]->index, 0);
    rq_response_free(resp);
    rq_plan_free(p);
    rq_request_free(r);
}

/* A message built by unpacking the wire format goes through the same path
 * and frees the same way (what the gRPC handler does). */
/* 30 candidates whose bags come in either order, item ids 100 + i and
 * author ids 200 + i, then (bad != 0) one more whose bag is bad: an unknown
 * name (bad 1) or item twice (bad 2). Packed to wire bytes in *n. */
static uint8_t *shared_names_request(int bad, size_t *n)
{
    enum { NC = 30 };
    static const char *const bad_name[3] = {NULL, "nope", "item"};
    Ikbo__V1__RankRequest r = IKBO__V1__RANK_REQUEST__INIT;
    Ikbo__V1__User u = IKBO__V1__USER__INIT, *up = &u;
    Ikbo__V1__Candidate c[NC + 1], *cp[NC + 1];
    Ikbo__V1__SparseFeature sf[NC + 1][2], *sfp[NC + 1][2];
    int64_t ids[NC + 1][2];
    float ud[3] = {1, 2, 3}, cd[2] = {0.5f, 0.25f};
    u.n_dense = 3;
    u.dense = ud;
    for (int i = 0; i <= NC; i++) {
        ikbo__v1__candidate__init(&c[i]);
        c[i].id = i;
        c[i].n_dense = 2;
        c[i].dense = cd;
        c[i].n_sparse = 2;
        c[i].sparse = sfp[i];
        for (int k = 0; k < 2; k++) {
            int f = (i % 3 == 1) ? 1 - k : k; /* every third candidate: author first */
            ikbo__v1__sparse_feature__init(&sf[i][k]);
            sf[i][k].name = (char *)CAND_SPARSE[f];
            ids[i][k] = (f ? 200 : 100) + i;
            sf[i][k].n_ids = 1;
            sf[i][k].ids = &ids[i][k];
            sfp[i][k] = &sf[i][k];
        }
        cp[i] = &c[i];
    }
    if (bad)
        sf[NC][1].name = (char *)bad_name[bad];
    r.n_users = 1;
    r.users = &up;
    r.n_candidates = bad ? NC + 1 : NC;
    r.candidates = cp;
    *n = ikbo__v1__rank_request__get_packed_size(&r);
    uint8_t *b = malloc(*n);
    ikbo__v1__rank_request__pack(&r, b);
    return b;
}

/* Bag names to model features through validate.c's memo (the fast decoder
 * shares one string among equal names) and without it (protobuf-c: a string
 * each): every candidate's bags in model order with its own ids; an unknown
 * or repeated name after 30 memo hits still refused, naming its place. */
static void test_bag_names_shared(void **s)
{
    (void)s;
    ikbo_model_info mi = model();
    rq_limits lim;
    rq_limits_default(&lim);
    for (int bad = 0; bad < 3; bad++) {
        size_t n;
        uint8_t *wire = shared_names_request(bad, &n);
        for (int path = 0; path < 2; path++) {
            pb_arena *a = pb_arena_new(0);
            rq_status st;
            Ikbo__V1__RankRequest *r = path ? ikbo__v1__rank_request__unpack(NULL, n, wire)
                                            : rank_wire_decode(wire, n, a, &st);
            assert_non_null(r);
            if (!path)
                assert_ptr_equal(r->candidates[0]->sparse[0]->name, r->candidates[2]->sparse[0]->name);
            rq_view v = {0};
            int rc = rq_view_build(r, &mi, &lim, &v, &st);
            if (!bad) {
                assert_int_equal(rc, 0);
                for (size_t i = 0; i < v.n_cands; i++) {
                    assert_int_equal(((const int64_t *)v.cands[i].bags[0].p)[0], 100 + (int64_t)i);
                    assert_int_equal(((const int64_t *)v.cands[i].bags[1].p)[0], 200 + (int64_t)i);
                }
            } else {
                assert_int_equal(rc, -1);
                assert_int_equal(st.code, RQ_INVALID_ARGUMENT);
                const char *want = bad == 1 ? "candidates[30].sparse[1].name = \"nope\""
                                            : "candidates[30].sparse[1].name = \"item\": duplicate feature "
                                              "(also candidates[30].sparse[0])";
                if (!strstr(st.msg, want))
                    fail_msg("path %d: message '%s' lacks '%s'", path, st.msg, want);
            }
            rq_view_free(&v);
            if (path)
                ikbo__v1__rank_request__free_unpacked(r, NULL);
            pb_arena_free(a);
        }
        free(wire);
    }
}

static void test_wire_roundtrip(void **s)
{
    (void)s;
    ikbo_model_info mi = model();
    Ikbo__V1__RankRequest *r = parse_ok("{\"model\":\"demo\",\"users\":[{\"key\":\"u\",\"dense\":[1,2,3],"
                                        "\"sparse\":[{\"name\":\"lang\",\"ids\":[1,2]}]}],"
                                        "\"candidates\":[" C0(0) "," C0(0) "]}");
    size_t n = ikbo__v1__rank_request__get_packed_size(r);
    uint8_t *buf = malloc(n);
    ikbo__v1__rank_request__pack(r, buf);
    Ikbo__V1__RankRequest *w = ikbo__v1__rank_request__unpack(NULL, n, buf);
    free(buf);
    assert_non_null(w);
    rq_status st;
    assert_int_equal(rq_validate(w, &mi, NULL, &st), 0);
    rq_plan *p = rq_plan_build(w, &mi, &st);
    assert_non_null(p);
    assert_int_equal(p->batch.n_users, 1);
    rq_plan_free(p);
    rq_request_free(w);
    rq_request_free(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_status_codes),
        cmocka_unit_test(test_error_json),
        cmocka_unit_test(test_json_camel),
        cmocka_unit_test(test_json_snake),
        cmocka_unit_test(test_json_unknown_fields),
        cmocka_unit_test(test_json_wrong_types),
        cmocka_unit_test(test_json_strings),
        cmocka_unit_test(test_validate_ok),
        cmocka_unit_test(test_validate_counts),
        cmocka_unit_test(test_validate_user_index),
        cmocka_unit_test(test_validate_dense),
        cmocka_unit_test(test_validate_dense_wide),
        cmocka_unit_test(test_validate_actions_wide),
        cmocka_unit_test(test_validate_sparse),
        cmocka_unit_test(test_validate_history),
        cmocka_unit_test(test_dedup),
        cmocka_unit_test(test_dedup_hash_collisions),
        cmocka_unit_test(test_grouping),
        cmocka_unit_test(test_plan_refuses_bad_request),
        cmocka_unit_test(test_plan_random),
        cmocka_unit_test(test_bag_names_shared),
        cmocka_unit_test(test_response_order),
        cmocka_unit_test(test_response_ties_and_nan),
        cmocka_unit_test(test_wire_roundtrip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
