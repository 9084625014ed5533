/* test_pb_arena.c - the protobuf-c arena (server/pb_arena.c): alignment,
 * chunk growth, huge and zero-size allocations, and RankRequests unpacked
 * through it equal to the malloc unpack, byte for byte after re-packing,
 * on random requests and on every truncation of one. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ikbo/v1/ranker.pb-c.h"
#include "server/pb_arena.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static void test_alignment_and_growth(void **s)
{
    (void)s;
    pb_arena *a = pb_arena_new(64); /* below the minimum chunk */
    assert_non_null(a);
    ProtobufCAllocator *al = pb_arena_allocator(a);
    char *prev = NULL;
    size_t total = 0;
    for (int i = 0; i < 5000; i++) {
        size_t n = (size_t)(rnd() % 300);
        char *p = al->alloc(al->allocator_data, n);
        assert_non_null(p);
        assert_int_equal((uintptr_t)p % 16, 0);
        memset(p, 0xab, n); /* writable, and must not overlap the last one */
        if (prev) assert_true(p != prev);
        prev = p;
        total += n;
        al->free(al->allocator_data, p); /* a no-op: the arena owns it */
    }
    assert_true(pb_arena_used(a) >= total);
    /* Larger than any chunk so far: gets its own. */
    char *big = al->alloc(al->allocator_data, (size_t)8 << 20);
    assert_non_null(big);
    memset(big, 1, (size_t)8 << 20);
    /* Sizes the arena cannot round up are refused, not wrapped. */
    assert_null(al->alloc(al->allocator_data, SIZE_MAX - 3));
    pb_arena_free(a);
    pb_arena_free(NULL);
}

/* A random RankRequest with every field kind: strings, packed floats and
 * int64s, submessages two levels deep, empty and missing parts. */
static Ikbo__V1__RankRequest *random_request(void)
{
    Ikbo__V1__RankRequest *r = calloc(1, sizeof *r);
    ikbo__v1__rank_request__init(r);
    r->model = strdup(rnd() % 4 ? "bench" : "");
    r->model_version = (int64_t)(rnd() % 5) - 1;
    r->request_id = strdup("req-7");
    r->top_k = (uint32_t)(rnd() % 3);
    r->n_users = 1 + rnd() % 4;
    r->users = calloc(r->n_users, sizeof *r->users);
    for (size_t u = 0; u < r->n_users; u++) {
        Ikbo__V1__User *x = calloc(1, sizeof *x);
        ikbo__v1__user__init(x);
        x->key = strdup(rnd() % 2 ? "user-key" : "");
        x->n_dense = rnd() % 9;
        x->dense = calloc(x->n_dense + 1, sizeof *x->dense);
        for (size_t i = 0; i < x->n_dense; i++) x->dense[i] = (float)(rnd() % 1000) * 0.25f;
        x->n_history_ids = rnd() % 200;
        x->history_ids = calloc(x->n_history_ids + 1, sizeof *x->history_ids);
        x->n_history_actions = rnd() % 2 ? x->n_history_ids : 0;
        x->history_actions = calloc(x->n_history_ids + 1, sizeof *x->history_actions);
        for (size_t i = 0; i < x->n_history_ids; i++) {
            x->history_ids[i] = (int64_t)(rnd() >> (rnd() % 64)) * (rnd() % 2 ? 1 : -1);
            x->history_actions[i] = (int32_t)(rnd() % 4);
        }
        x->n_sparse = rnd() % 3;
        x->sparse = calloc(x->n_sparse + 1, sizeof *x->sparse);
        for (size_t f = 0; f < x->n_sparse; f++) {
            Ikbo__V1__SparseFeature *sf = calloc(1, sizeof *sf);
            ikbo__v1__sparse_feature__init(sf);
            sf->name = strdup(f ? "lang" : "country");
            sf->n_ids = rnd() % 5;
            sf->ids = calloc(sf->n_ids + 1, sizeof *sf->ids);
            for (size_t i = 0; i < sf->n_ids; i++) sf->ids[i] = (int64_t)(rnd() % 100000);
            x->sparse[f] = sf;
        }
        r->users[u] = x;
    }
    r->n_candidates = rnd() % 60;
    r->candidates = calloc(r->n_candidates + 1, sizeof *r->candidates);
    for (size_t c = 0; c < r->n_candidates; c++) {
        Ikbo__V1__Candidate *x = calloc(1, sizeof *x);
        ikbo__v1__candidate__init(x);
        x->id = (int64_t)rnd();
        x->user = (uint32_t)(rnd() % r->n_users);
        x->n_dense = rnd() % 5;
        x->dense = calloc(x->n_dense + 1, sizeof *x->dense);
        for (size_t i = 0; i < x->n_dense; i++) x->dense[i] = (float)(rnd() % 100);
        x->n_sparse = rnd() % 3;
        x->sparse = calloc(x->n_sparse + 1, sizeof *x->sparse);
        for (size_t f = 0; f < x->n_sparse; f++) {
            Ikbo__V1__SparseFeature *sf = calloc(1, sizeof *sf);
            ikbo__v1__sparse_feature__init(sf);
            sf->name = strdup("item");
            sf->n_ids = 1 + rnd() % 3;
            sf->ids = calloc(sf->n_ids, sizeof *sf->ids);
            for (size_t i = 0; i < sf->n_ids; i++) sf->ids[i] = (int64_t)(rnd() % 1000000);
            x->sparse[f] = sf;
        }
        r->candidates[c] = x;
    }
    return r;
}

static uint8_t *pack(const Ikbo__V1__RankRequest *r, size_t *n)
{
    *n = ikbo__v1__rank_request__get_packed_size(r);
    uint8_t *b = malloc(*n + 1);
    assert_non_null(b);
    ikbo__v1__rank_request__pack(r, b);
    return b;
}

static void test_unpack_equals_malloc_unpack(void **s)
{
    (void)s;
    for (int it = 0; it < 200; it++) {
        Ikbo__V1__RankRequest *r = random_request();
        size_t n;
        uint8_t *wire = pack(r, &n);
        /* The built request was calloc'd field by field, which is what
         * free_unpacked with the default allocator frees. */
        ikbo__v1__rank_request__free_unpacked(r, NULL);

        Ikbo__V1__RankRequest *m = ikbo__v1__rank_request__unpack(NULL, n, wire);
        /* Small first chunks (it % 3 == 0) force the multi-chunk path. */
        pb_arena *a = pb_arena_new(it % 3 == 0 ? 16 : 2 * n + 4096);
        assert_non_null(a);
        Ikbo__V1__RankRequest *q = ikbo__v1__rank_request__unpack(pb_arena_allocator(a), n, wire);
        assert_non_null(m);
        assert_non_null(q);
        size_t n1, n2;
        uint8_t *w1 = pack(m, &n1), *w2 = pack(q, &n2);
        assert_int_equal(n1, n);
        assert_int_equal(n2, n);
        assert_memory_equal(w1, wire, n);
        assert_memory_equal(w2, wire, n);
        assert_int_equal(q->n_candidates, m->n_candidates);
        free(w1);
        free(w2);
        ikbo__v1__rank_request__free_unpacked(m, NULL);
        pb_arena_free(a);
        free(wire);
    }
}

/* Every prefix of a valid message: the two unpacks agree on failure, and a
 * failed arena unpack leaks nothing once the arena is freed (valgrind and
 * ASan runs of this test check that). */
static void test_truncated_agree(void **s)
{
    (void)s;
    Ikbo__V1__RankRequest *r = random_request();
    size_t n;
    uint8_t *wire = pack(r, &n);
    ikbo__v1__rank_request__free_unpacked(r, NULL);
    for (size_t k = 0; k < n; k++) {
        Ikbo__V1__RankRequest *m = ikbo__v1__rank_request__unpack(NULL, k, wire);
        pb_arena *a = pb_arena_new(64);
        Ikbo__V1__RankRequest *q = ikbo__v1__rank_request__unpack(pb_arena_allocator(a), k, wire);
        assert_int_equal(m == NULL, q == NULL);
        if (m) ikbo__v1__rank_request__free_unpacked(m, NULL);
        pb_arena_free(a);
    }
    free(wire);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alignment_and_growth),
        cmocka_unit_test(test_unpack_equals_malloc_unpack),
        cmocka_unit_test(test_truncated_agree),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
