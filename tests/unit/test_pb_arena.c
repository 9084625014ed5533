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
#include "wire_fixture.h"

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
