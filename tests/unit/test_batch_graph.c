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

static bg_key key_of(const int64_t *v, int n)
{
    bg_key k = BG_KEY_INIT;
    for (int i = 0; i < n; i++)
        bg_key_add(&k, v[i]);
    return k;
}

static void test_key(void **s)
{
    (void)s;
    int64_t a[] = {1, 70, 1024}, b[] = {1, 72, 1024}, c[] = {1, 70, 1024, 0}, d[] = {70, 1, 1024};
    bg_key ka = key_of(a, 3);
    assert_true(ka.a == key_of(a, 3).a && ka.b == key_of(a, 3).b);
    /* A changed value, an added zero, a swapped order: other keys. */
    bg_key others[] = {key_of(b, 3), key_of(c, 4), key_of(d, 3), key_of(a, 2)};
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++)
        assert_false(others[i].a == ka.a || others[i].b == ka.b);
}

static void test_lookup_evict(void **s)
{
    (void)s;
    bk_backend be = {.graph_free = count_free};
    bg_cache *c = bg_new(&be, 2);
    assert_non_null(c);
    freed = 0;
    int64_t v1[] = {1, 70, 1024}, v2[] = {1, 72, 1024}, v3[] = {2, 72};
    bg_key k1 = key_of(v1, 3), k2 = key_of(v2, 3), k3 = key_of(v3, 2);
    bg_entry *e1 = bg_get(c, k1);
    assert_null(e1->g);
    assert_int_equal(e1->seen, 0);
    e1->seen = 1;
    e1->g = new_graph();
    bg_entry *e2 = bg_get(c, k2);
    assert_ptr_not_equal(e1, e2);
    e2->g = new_graph();
    assert_int_equal(bg_held(c), 2);
    /* Found again, with its state; k1 is now the most recent. */
    assert_ptr_equal(bg_get(c, k1), e1);
    assert_int_equal(e1->seen, 1);
    /* A third key evicts the least recently used (k2) and frees its graph. */
    bg_entry *e3 = bg_get(c, k3);
    assert_ptr_equal(e3, e2);
    assert_int_equal(freed, 1);
    assert_int_equal(c->evictions, 1);
    assert_null(e3->g);
    assert_int_equal(e3->seen, 0);
    assert_ptr_equal(bg_get(c, k1), e1);
    bg_free(c);
    assert_int_equal(freed, 2);
}

static void test_fail(void **s)
{
    (void)s;
    bk_backend be = {.graph_free = count_free};
    bg_cache *c = bg_new(&be, 4);
    freed = 0;
    int64_t v[] = {7};
    bg_key k = key_of(v, 1);
    bg_entry *e = bg_get(c, k);
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
    e = bg_get(c, k);
    assert_int_equal(e->fails, 0);
    bg_free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bucket),
        cmocka_unit_test(test_key),
        cmocka_unit_test(test_lookup_evict),
        cmocka_unit_test(test_fail),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
