/* test_ledger.c - the backends' byte ledger (kernels/backend.c, bk_ledger).
 *
 * Why this exists: both backends count every allocation through it, and the
 * counts are what /metrics and the IKBO accounting tests read; its rules
 * (peak kept per tag, a free of more than is live clamps at zero instead of
 * wrapping, weights counted apart) and its lock are checked here directly,
 * not only through whole-model runs. Threads allocating and freeing at once
 * must end where they started.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "kernels/backend.h"

static void test_counts_and_peak(void **state)
{
    (void)state;
    bk_ledger l;
    bk_stats s;
    bk_ledger_init(&l);
    bk_ledger_account(&l, BK_TAG_CAND, 100, 0);
    bk_ledger_account(&l, BK_TAG_CAND, 50, 0);
    bk_ledger_account(&l, BK_TAG_USER, 7, 0);
    bk_ledger_account(&l, BK_TAG_CAND, 0, 120);
    bk_ledger_get(&l, &s);
    assert_int_equal(s.bytes_live[BK_TAG_CAND], 30);
    assert_int_equal(s.bytes_peak[BK_TAG_CAND], 150);
    assert_int_equal(s.bytes_live[BK_TAG_USER], 7);
    assert_int_equal(s.bytes_peak[BK_TAG_USER], 7);
    assert_int_equal(s.bytes_live[BK_TAG_BROADCAST], 0);
    assert_int_equal(s.weight_bytes, 0);
    bk_ledger_destroy(&l);
}

static void test_over_free_clamps(void **state)
{
    (void)state;
    bk_ledger l;
    bk_stats s;
    bk_ledger_init(&l);
    bk_ledger_account(&l, BK_TAG_INDEX, 10, 0);
    bk_ledger_account(&l, BK_TAG_INDEX, 0, 11); /* a caller passing the wrong size */
    bk_ledger_weights(&l, 64, 0);
    bk_ledger_weights(&l, 0, 65);
    bk_ledger_get(&l, &s);
    assert_int_equal(s.bytes_live[BK_TAG_INDEX], 0);
    assert_int_equal(s.bytes_peak[BK_TAG_INDEX], 10);
    assert_int_equal(s.weight_bytes, 0);
    bk_ledger_weights(&l, 3, 0);
    bk_ledger_get(&l, &s);
    assert_int_equal(s.weight_bytes, 3);
    bk_ledger_destroy(&l);
}

#define ROUNDS 200000

static void *churn(void *arg)
{
    bk_ledger *l = arg;
    for (int i = 0; i < ROUNDS; i++) {
        bk_ledger_account(l, BK_TAG_USER, 3, 0);
        bk_ledger_weights(l, 5, 0);
        bk_ledger_account(l, BK_TAG_USER, 0, 3);
        bk_ledger_weights(l, 0, 5);
    }
    return NULL;
}

static void test_threads_balance(void **state)
{
    (void)state;
    bk_ledger l;
    bk_stats s;
    pthread_t t[4];
    bk_ledger_init(&l);
    bk_ledger_account(&l, BK_TAG_USER, 1000, 0); /* live above zero: no clamp hides a lost update */
    bk_ledger_weights(&l, 1000, 0);
    for (int i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&t[i], NULL, churn, &l), 0);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    bk_ledger_get(&l, &s);
    assert_int_equal(s.bytes_live[BK_TAG_USER], 1000);
    assert_true(s.bytes_peak[BK_TAG_USER] >= 1003 && s.bytes_peak[BK_TAG_USER] <= 1012);
    assert_int_equal(s.weight_bytes, 1000);
    bk_ledger_destroy(&l);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_counts_and_peak),
        cmocka_unit_test(test_over_free_clamps),
        cmocka_unit_test(test_threads_balance),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
