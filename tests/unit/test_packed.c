/* test_packed.c - the packed request encoding (ranker.proto PackedUsers /
 * PackedCandidates) held to the classic one: the same request in both
 * encodings (tests/unit/packed_fixture.h converts) must give the same plan,
 * byte for byte, or the same refusal with the same message; what only a
 * packed column can get wrong is refused with a message naming the column.
 * Also through the wire: the fast decoder's borrowed columns plan the same.
 * A hand-made ikbo_model_info; no engine needed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "packed_fixture.h"
#include "server/pb_arena.h"
#include "server/rank_wire.h"
#include "server/request.h"

static const char *const USER_SPARSE[] = {"country", "lang"};
static const char *const CAND_SPARSE[] = {"item", "author"};
static const char *const TASKS[] = {"click"};
static const float WEIGHTS[] = {1.0f};

static ikbo_model_info model(void)
{
    ikbo_model_info mi = {
        .dir = "/repo/demo/3", .user_dense = 3, .cand_dense = 2,
        .user_sparse = USER_SPARSE, .n_user_sparse = 2,
        .cand_sparse = CAND_SPARSE, .n_cand_sparse = 2,
        .has_history = 1, .hist_max_len = 8, .hist_actions = 4,
        .tasks = TASKS, .n_tasks = 1, .score_weights = WEIGHTS,
        .mode = IKBO_MODE_IKBO, .device = "cpu",
    };
    return mi;
}

static rq_limits limits(void)
{
    rq_limits l;
    rq_limits_default(&l);
    l.max_users = 16;
    l.max_candidates = 64;
    l.max_ids_per_bag = 4;
    l.max_history = 6;
    l.max_sparse_features = 2;
    return l;
}

static uint32_t seed = 2026;
static uint32_t rnd(void)
{
    seed = seed * 1103515245u + 12345u;
    return (seed >> 16) & 0x7fff;
}

static void jag_equal(const ikbo_jagged *a, const ikbo_jagged *b, int rows)
{
    assert_memory_equal(a->offsets, b->offsets, (size_t)(rows + 1) * sizeof(int64_t));
    if (a->offsets[rows]) assert_memory_equal(a->ids, b->ids, (size_t)a->offsets[rows] * 8);
}

/* Two plans of the same request: every array equal. */
static void plans_equal(const rq_plan *a, const rq_plan *b, const ikbo_model_info *mi)
{
    const ikbo_batch *x = &a->batch, *y = &b->batch;
    const int U = x->n_users, C = x->n_cands;
    assert_int_equal(U, y->n_users);
    assert_int_equal(C, y->n_cands);
    assert_int_equal(a->n_request_users, b->n_request_users);
    assert_memory_equal(x->map, y->map, (size_t)C * 4);
    assert_memory_equal(a->order, b->order, (size_t)C * 4);
    assert_memory_equal(a->user_row, b->user_row, (size_t)a->n_request_users * 4);
    assert_memory_equal(a->row_user, b->row_user, (size_t)U * 4);
    assert_memory_equal(a->cand_ids, b->cand_ids, (size_t)C * 8);
    for (int r = 0; r < U; r++) assert_string_equal(a->row_key[r], b->row_key[r]);
    assert_memory_equal(x->user_dense, y->user_dense, (size_t)U * (size_t)mi->user_dense * 4);
    assert_memory_equal(x->cand_dense, y->cand_dense, (size_t)C * (size_t)mi->cand_dense * 4);
    for (int f = 0; f < mi->n_user_sparse; f++) jag_equal(&x->user_sparse[f], &y->user_sparse[f], U);
    for (int f = 0; f < mi->n_cand_sparse; f++) jag_equal(&x->cand_sparse[f], &y->cand_sparse[f], C);
    jag_equal(&x->hist, &y->hist, U);
    int64_t H = x->hist.offsets[U];
    /* absent actions are zeros: the packed twin gives zeros explicitly */
    for (int64_t e = 0; e < H; e++) {
        int32_t va = x->hist_actions ? x->hist_actions[e] : 0;
        int32_t vb = y->hist_actions ? y->hist_actions[e] : 0;
        assert_int_equal(va, vb);
    }
}

static Ikbo__V1__SparseFeature *bag(const char *name, size_t n)
{
    Ikbo__V1__SparseFeature *f = malloc(sizeof *f);
    ikbo__v1__sparse_feature__init(f);
    f->name = strdup(name);
    f->n_ids = n;
    f->ids = malloc((n + 1) * sizeof *f->ids);
    for (size_t k = 0; k < n; k++) f->ids[k] = rnd() % 3;
    return f;
}

/* A random valid classic request for model(): few distinct values, so users
 * repeat (dedup has work), bags and histories empty or not. */
static Ikbo__V1__RankRequest *random_classic(void)
{
    Ikbo__V1__RankRequest *r = malloc(sizeof *r);
    ikbo__v1__rank_request__init(r);
    r->model = strdup("demo");
    r->request_id = strdup("r1");
    r->top_k = rnd() % 3;
    r->n_users = 1 + rnd() % 10;
    r->users = calloc(r->n_users, sizeof *r->users);
    int actions = rnd() % 2;
    for (size_t j = 0; j < r->n_users; j++) {
        Ikbo__V1__User *u = malloc(sizeof *u);
        ikbo__v1__user__init(u);
        r->users[j] = u;
        if (rnd() % 2) {
            u->key = malloc(4);
            snprintf(u->key, 4, "k%d", (int)(rnd() % 3));
        }
        u->n_dense = 3;
        u->dense = malloc(3 * sizeof(float));
        for (int d = 0; d < 3; d++) u->dense[d] = (float)(rnd() % 2);
        u->n_sparse = rnd() % 3;
        u->sparse = calloc(u->n_sparse + 1, sizeof *u->sparse);
        for (size_t f = 0; f < u->n_sparse; f++)
            u->sparse[f] = bag(USER_SPARSE[(f + (rnd() % 2 && u->n_sparse == 1)) % 2], rnd() % 4);
        u->n_history_ids = rnd() % 5;
        u->history_ids = malloc((u->n_history_ids + 1) * sizeof(int64_t));
        u->history_actions = calloc(u->n_history_ids + 1, sizeof(int32_t));
        for (size_t k = 0; k < u->n_history_ids; k++) {
            u->history_ids[k] = rnd() % 2;
            u->history_actions[k] = (int32_t)(rnd() % 4);
        }
        if (actions && rnd() % 2) u->n_history_actions = u->n_history_ids;
    }
    r->n_candidates = 1 + rnd() % 40;
    r->candidates = calloc(r->n_candidates, sizeof *r->candidates);
    for (size_t i = 0; i < r->n_candidates; i++) {
        Ikbo__V1__Candidate *c = malloc(sizeof *c);
        ikbo__v1__candidate__init(c);
        r->candidates[i] = c;
        c->id = (int64_t)i * 7 - 3;
        c->user = rnd() % (uint32_t)r->n_users;
        c->n_dense = 2;
        c->dense = malloc(2 * sizeof(float));
        c->dense[0] = (float)i;
        c->dense[1] = (float)(rnd() % 5) - 2.0f;
        c->n_sparse = rnd() % 3;
        c->sparse = calloc(c->n_sparse + 1, sizeof *c->sparse);
        for (size_t f = 0; f < c->n_sparse; f++) c->sparse[f] = bag(CAND_SPARSE[f], 1 + rnd() % 3);
    }
    return r;
}

static void free_req(Ikbo__V1__RankRequest *r)
{
    if (r) protobuf_c_message_free_unpacked(&r->base, NULL);
}

/* Both encodings through rq_prepare: the same plan, or the same refusal. */
static void same_answer(const Ikbo__V1__RankRequest *c, const rq_limits *lim)
{
    ikbo_model_info mi = model();
    Ikbo__V1__RankRequest *p = to_packed(c);
    assert_non_null(p);
    rq_status sc, sp;
    rq_plan *a = rq_prepare(c, &mi, lim, &sc), *b = rq_prepare(p, &mi, lim, &sp);
    if (a && b) {
        plans_equal(a, b, &mi);
    } else if (a || b) {
        fail_msg("classic %s '%s', packed %s '%s'", rq_code_name(sc.code), sc.msg,
                 rq_code_name(sp.code), sp.msg);
    } else {
        assert_int_equal(sc.code, sp.code);
        assert_string_equal(sc.msg, sp.msg);
    }
    /* And through the wire, with the columns borrowed from the bytes. */
    size_t n = ikbo__v1__rank_request__get_packed_size(p);
    uint8_t *w = malloc(n + 1);
    ikbo__v1__rank_request__pack(p, w);
    pb_arena *ar = pb_arena_new(0);
    rq_status sw;
    Ikbo__V1__RankRequest *q = rank_wire_decode(w, n, ar, &sw);
    assert_non_null(q);
    rq_plan *d = rq_prepare(q, &mi, lim, &sw);
    assert_int_equal(!d, !b);
    if (d) plans_equal(b, d, &mi);
    else assert_string_equal(sw.msg, sp.msg);
    rq_plan_free(d);
    pb_arena_free(ar);
    free(w);
    rq_plan_free(a);
    rq_plan_free(b);
    free_req(p);
}

static void test_random_same_plan(void **s)
{
    (void)s;
    rq_limits lim = limits();
    for (int it = 0; it < 300; it++) {
        Ikbo__V1__RankRequest *c = random_classic();
        same_answer(c, &lim);
        free_req(c);
    }
}

/* A value rule broken in an otherwise valid request: the same message. */
static void test_same_refusals(void **s)
{
    (void)s;
    rq_limits lim = limits();
    for (int rule = 0; rule < 9; rule++)
        for (int it = 0; it < 20; it++) {
            Ikbo__V1__RankRequest *c = random_classic();
            Ikbo__V1__User *u = c->users[rnd() % c->n_users];
            Ikbo__V1__Candidate *k = c->candidates[rnd() % c->n_candidates];
            switch (rule) {
            case 0: u->dense[rnd() % 3] = NAN; break;
            case 1: k->dense[1] = -INFINITY; break;
            case 2: k->user = (uint32_t)c->n_users + rnd() % 3; break;
            case 3:
                if (u->n_history_ids) u->n_history_actions = u->n_history_ids, u->history_actions[0] = 4;
                break;
            case 4:
                u->history_ids = realloc(u->history_ids, 8 * sizeof(int64_t));
                u->history_actions = realloc(u->history_actions, 8 * sizeof(int32_t));
                for (int e = 0; e < 8; e++) u->history_ids[e] = e, u->history_actions[e] = 0;
                u->n_history_ids = 7;
                if (u->n_history_actions) u->n_history_actions = 7;
                break;
            case 5:
                if (k->n_sparse) {
                    Ikbo__V1__SparseFeature *f = k->sparse[k->n_sparse - 1];
                    f->ids = realloc(f->ids, 5 * sizeof(int64_t));
                    f->n_ids = 5;
                    for (int e = 0; e < 5; e++) f->ids[e] = e;
                }
                break;
            case 6: lim.max_users = 1; break;
            case 7: lim.max_candidates = 1; break;
            case 8: u->dense[0] = -0.0f; break; /* valid: a different user than 0.0 */
            }
            same_answer(c, &lim);
            lim = limits();
            free_req(c);
        }
}

static void test_model_without_history(void **s)
{
    (void)s;
    ikbo_model_info mi = model();
    mi.has_history = 0;
    mi.hist_actions = 0;
    Ikbo__V1__RankRequest *c = random_classic();
    c->users[0]->n_history_ids = 1;
    c->users[0]->n_history_actions = 0;
    Ikbo__V1__RankRequest *p = to_packed(c);
    rq_status st;
    assert_null(rq_prepare(p, &mi, NULL, &st));
    assert_string_equal(st.msg, "users[0].history_ids: model 'demo' takes no history");
    free_req(p);
    free_req(c);
}

/* ---- what only the packed form can get wrong ---------------------------- */

/* One user (key "a", two history events with actions, one lang bag of two
 * ids) and two candidates (item bags), packed. */
static Ikbo__V1__RankRequest *base_packed(void)
{
    Ikbo__V1__RankRequest *c = malloc(sizeof *c);
    ikbo__v1__rank_request__init(c);
    c->model = strdup("demo");
    c->n_users = 1;
    c->users = calloc(1, sizeof *c->users);
    Ikbo__V1__User *u = c->users[0] = malloc(sizeof *u);
    ikbo__v1__user__init(u);
    u->key = strdup("a");
    u->n_dense = 3;
    u->dense = calloc(3, sizeof(float));
    u->n_sparse = 1;
    u->sparse = calloc(1, sizeof *u->sparse);
    u->sparse[0] = bag("lang", 2);
    u->n_history_ids = u->n_history_actions = 2;
    u->history_ids = calloc(2, sizeof(int64_t));
    u->history_actions = calloc(2, sizeof(int32_t));
    c->n_candidates = 2;
    c->candidates = calloc(2, sizeof *c->candidates);
    for (int i = 0; i < 2; i++) {
        Ikbo__V1__Candidate *k = c->candidates[i] = malloc(sizeof *k);
        ikbo__v1__candidate__init(k);
        k->id = i + 1;
        k->n_dense = 2;
        k->dense = calloc(2, sizeof(float));
        k->n_sparse = 1;
        k->sparse = calloc(1, sizeof *k->sparse);
        k->sparse[0] = bag("item", 1);
    }
    Ikbo__V1__RankRequest *p = to_packed(c);
    free_req(c);
    return p;
}

static void shrink(ProtobufCBinaryData *b, size_t by) { b->len -= by; }

static void refused(Ikbo__V1__RankRequest *p, int code, const char *want)
{
    ikbo_model_info mi = model();
    rq_limits lim = limits();
    rq_status st;
    rq_plan *pl = rq_prepare(p, &mi, &lim, &st);
    if (pl) fail_msg("expected '%s', got a plan", want);
    assert_int_equal(st.code, code);
    if (strcmp(st.msg, want)) fail_msg("expected '%s'\n     got '%s'", want, st.msg);
    free_req(p);
}

static void test_packed_columns(void **s)
{
    (void)s;
    Ikbo__V1__RankRequest *p = base_packed();
    ikbo_model_info mi = model();
    rq_status st;
    rq_plan *ok = rq_prepare(p, &mi, NULL, &st);
    assert_non_null(ok);
    assert_int_equal(ok->batch.n_cands, 2);
    assert_int_equal(ok->cand_ids[1], 2);
    assert_string_equal(ok->row_key[0], "a");
    rq_plan_free(ok);
    free_req(p);

    p = base_packed();
    shrink(&p->packed_users->dense, 4);
    refused(p, RQ_INVALID_ARGUMENT,
            "packed_users.dense has 8 bytes, expected 12 (count x user_dense floats, 4 bytes each)");
    p = base_packed();
    shrink(&p->packed_candidates->users, 4);
    refused(p, RQ_INVALID_ARGUMENT,
            "packed_candidates.users has 4 bytes, expected 8 (one uint32 per candidate, 4 bytes "
            "each)");
    p = base_packed();
    shrink(&p->packed_candidates->ids, 3);
    refused(p, RQ_INVALID_ARGUMENT,
            "packed_candidates.ids has 13 bytes, expected 16 (one int64 per candidate, 8 bytes "
            "each, or none)");
    p = base_packed();
    shrink(&p->packed_users->sparse[0]->lengths, 4);
    refused(p, RQ_INVALID_ARGUMENT,
            "packed_users.sparse[0].lengths has 0 bytes, expected 4 (one uint32 per entity, 4 "
            "bytes each)");
    p = base_packed();
    shrink(&p->packed_users->sparse[0]->ids, 8);
    refused(p, RQ_INVALID_ARGUMENT,
            "packed_users.sparse[0].lengths[0] = 2 runs past the end of "
            "packed_users.sparse[0].ids (1 elements)");
    p = base_packed();
    p->packed_users->sparse[0]->lengths.data[0] = 1;
    refused(p, RQ_INVALID_ARGUMENT,
            "packed_users.sparse[0].ids has 16 bytes, expected 8 (the sum of the lengths, 1, x 8)");
    p = base_packed();
    free(p->packed_users->sparse[0]->name);
    p->packed_users->sparse[0]->name = strdup("colour");
    refused(p, RQ_INVALID_ARGUMENT,
            "packed_users.sparse[0].name = \"colour\": unknown user sparse feature (model has: "
            "country, lang)");
    /* a second feature with the first one's name */
    p = base_packed();
    Ikbo__V1__PackedCandidates *pc = p->packed_candidates;
    pc->sparse = realloc(pc->sparse, 2 * sizeof *pc->sparse);
    Ikbo__V1__PackedSparse *d = pc->sparse[1] = malloc(sizeof *d);
    ikbo__v1__packed_sparse__init(d);
    d->name = strdup("item");
    pc->n_sparse = 2;
    refused(p, RQ_INVALID_ARGUMENT,
            "packed_candidates.sparse[1].name = \"item\": duplicate feature (also "
            "packed_candidates.sparse[0])");
    p = base_packed();
    p->packed_users->history_lengths.data[0] = 5;
    refused(p, RQ_INVALID_ARGUMENT,
            "packed_users.history_lengths[0] = 5 runs past the end of packed_users.history_ids (2 "
            "elements)");
    p = base_packed();
    shrink(&p->packed_users->history_actions, 4);
    refused(p, RQ_INVALID_ARGUMENT,
            "packed_users.history_actions has 4 bytes but history_ids has 2 ids (give none or one "
            "int32 per id)");
    p = base_packed();
    p->packed_users->count = 2;
    refused(p, RQ_INVALID_ARGUMENT,
            "packed_users.keys has 1 keys but count is 2 (give none or one per user)");
    p = base_packed();
    p->packed_users->count = 0;
    refused(p, RQ_INVALID_ARGUMENT, "users: request has no users");
    p = base_packed();
    p->packed_candidates->count = 3;
    refused(p, RQ_INVALID_ARGUMENT,
            "packed_candidates.ids has 16 bytes, expected 24 (one int64 per candidate, 8 bytes "
            "each, or none)");
    p = base_packed();
    memset(p->packed_candidates->users.data + 4, 0xff, 4);
    refused(p, RQ_INVALID_ARGUMENT, "candidates[1].user = 4294967295 but request has 1 users");
    p = base_packed();
    p->packed_candidates->count = 65;
    refused(p, RQ_RESOURCE_EXHAUSTED,
            "candidates: request has 65 candidates, limit max_candidates = 64");
    p = base_packed();
    memset(p->packed_candidates->dense.data + 12, 0xff, 4); /* a NaN */
    refused(p, RQ_INVALID_ARGUMENT, "candidates[1].dense[1] is NaN");
}

static void test_packed_bag_limits(void **s)
{
    (void)s;
    Ikbo__V1__RankRequest *p = base_packed();
    Ikbo__V1__PackedSparse *f = p->packed_users->sparse[0];
    uint32_t five = 5;
    memcpy(f->lengths.data, &five, 4);
    f->ids.data = realloc(f->ids.data, 40);
    memset(f->ids.data, 0, 40);
    f->ids.len = 40;
    refused(p, RQ_RESOURCE_EXHAUSTED,
            "users[0].sparse[0].ids has 5 ids, limit max_ids_per_bag = 4");
    p = base_packed();
    Ikbo__V1__PackedUsers *pu = p->packed_users;
    pu->sparse = realloc(pu->sparse, 3 * sizeof *pu->sparse);
    for (int k = 1; k < 3; k++) {
        pu->sparse[k] = malloc(sizeof *pu->sparse[k]);
        ikbo__v1__packed_sparse__init(pu->sparse[k]);
        pu->sparse[k]->name = strdup(k == 1 ? "country" : "x");
    }
    pu->n_sparse = 3;
    refused(p, RQ_RESOURCE_EXHAUSTED,
            "packed_users.sparse has 3 features, limit max_sparse_features = 2");
}

/* The two encodings in one request are refused, naming which. */
static void test_mixed_encodings(void **s)
{
    (void)s;
    Ikbo__V1__RankRequest *p = base_packed();
    ikbo__v1__packed_candidates__free_unpacked(p->packed_candidates, NULL);
    p->packed_candidates = NULL;
    refused(p, RQ_INVALID_ARGUMENT,
            "packed_candidates: packed_users and packed_candidates are given together");
    p = base_packed();
    p->n_users = 1;
    p->users = calloc(1, sizeof *p->users);
    p->users[0] = malloc(sizeof *p->users[0]);
    ikbo__v1__user__init(p->users[0]);
    refused(p, RQ_INVALID_ARGUMENT,
            "users: the request has packed_users and packed_candidates, so it gives no users");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_same_plan),
        cmocka_unit_test(test_same_refusals),
        cmocka_unit_test(test_model_without_history),
        cmocka_unit_test(test_packed_columns),
        cmocka_unit_test(test_packed_bag_limits),
        cmocka_unit_test(test_mixed_encodings),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
