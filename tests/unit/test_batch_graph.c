/* test_batch_graph.c - the batch-graph cache (engine/batch_graph.c): buckets,
 * id rooms, lookup, least-recently-used eviction, failure counting.
 *
 * The graphs themselves are the CUDA backend's (tests/gpu/test_cuda_model.c
 * records and replays them against the CPU); here a backend table with only
 * graph_free counts what the cache frees, so a leak or a double free of a
 * graph handle shows on the CPU.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "engine/batch_graph.h"

static int freed;
static void count_free(bk_graph *g)
{
    freed++;
    free(g);
}

static bk_graph *new_graph(void) { return (bk_graph *)malloc(16); }

static void test_bucket(void **s)
{
    (void)s;
    int in[] = {1, 8, 9, 15, 16, 17, 65, 70, 72, 73, 127, 128, 129, 600, 1024, 1025, 1120};
    int out[] = {1, 8, 9, 15, 16, 18, 72, 72, 72, 80, 128, 128, 144, 640, 1024, 1025, 1120};
    for (size_t i = 0; i < sizeof in / sizeof in[0]; i++) {
        int b = bg_bucket(in[i]);
        assert_int_equal(b, out[i]);
        assert_true(b >= in[i] && b - in[i] <= in[i] / 8); /* at most 1/8 padding */
    }
    assert_int_equal(bg_room(0), 64);
    assert_int_equal(bg_room(64), 64);
    assert_int_equal(bg_room(65), 128);
    assert_int_equal(bg_room(1000), 1024);
}

static void test_lookup_evict(void **s)
{
    (void)s;
    bk_backend be = {.graph_free = count_free};
    bg_cache *c = bg_new(&be, 2);
    assert_non_null(c);
    freed = 0;
    int64_t k1[] = {1, 70, 1024}, k2[] = {1, 72, 1024}, k3[] = {2, 72};
    bg_entry *e1 = bg_get(c, k1, 3);
    assert_non_null(e1);
    assert_null(e1->g);
    assert_int_equal(e1->seen, 0);
    e1->seen = 1;
    e1->g = new_graph();
    bg_entry *e2 = bg_get(c, k2, 3);
    assert_ptr_not_equal(e1, e2);
    e2->g = new_graph();
    assert_int_equal(bg_held(c), 2);
    /* Found again, with its state; k1 is now the most recent. */
    assert_ptr_equal(bg_get(c, k1, 3), e1);
    assert_int_equal(e1->seen, 1);
    /* A third key evicts the least recently used (k2) and frees its graph. */
    bg_entry *e3 = bg_get(c, k3, 2);
    assert_ptr_equal(e3, e2);
    assert_int_equal(freed, 1);
    assert_int_equal(c->evictions, 1);
    assert_null(e3->g);
    assert_int_equal(e3->seen, 0);
    assert_ptr_equal(bg_get(c, k1, 3), e1);
    /* A prefix is another key. */
    int64_t k1short[] = {1, 70};
    assert_ptr_not_equal(bg_get(c, k1short, 2), e1);
    bg_free(c);
    assert_int_equal(freed, 2);
}

static void test_fail(void **s)
{
    (void)s;
    bk_backend be = {.graph_free = count_free};
    bg_cache *c = bg_new(&be, 4);
    freed = 0;
    int64_t k[] = {7};
    bg_entry *e = bg_get(c, k, 1);
    e->g = new_graph();
    e->logits = &e;
    bg_fail(c, e, 0); /* stale: dropped, not counted */
    assert_null(e->g);
    assert_null(e->logits);
    assert_int_equal(e->fails, 0);
    assert_int_equal(freed, 1);
    e->g = new_graph();
    bg_fail(c, e, 1);
    bg_fail(c, e, 1); /* no graph held: nothing to free */
    assert_int_equal(e->fails, BG_MAX_FAILS);
    assert_int_equal(freed, 2);
    /* A flush forgets keys and frees every graph. */
    e->g = new_graph();
    bg_flush(c);
    assert_int_equal(freed, 3);
    assert_int_equal(bg_held(c), 0);
    e = bg_get(c, k, 1);
    assert_int_equal(e->fails, 0);
    bg_free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bucket),
        cmocka_unit_test(test_lookup_evict),
        cmocka_unit_test(test_fail),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
