/* test_metrics.c - the metrics registry and its Prometheus text exposition:
 * exact output format, label/HELP escaping, histogram buckets, collect hooks
 * and exact counts under concurrent updates. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "server/metrics.h"

static void test_counter_and_gauge_format(void **state)
{
    (void)state;
    metrics_registry *r = metrics_registry_new();
    const char *const ln[] = {"model", "code"};
    metrics_family *c =
        metrics_family_new(r, METRICS_COUNTER, "t_requests_total", "Requests.", 2, ln, 0, NULL);
    metrics_family *g = metrics_family_new(r, METRICS_GAUGE, "t_inflight", "In flight.", 0,
                                           NULL, 0, NULL);
    assert_non_null(c);
    assert_non_null(g);
    const char *const v1[] = {"demo", "OK"};
    const char *const v2[] = {"demo", "NOT_FOUND"};
    metrics_add_l(c, v1, 1);
    metrics_add_l(c, v1, 2);
    metrics_add_l(c, v2, 1);
    metrics_add_l(c, v2, -5); /* counters never go down */
    metrics_series *s = metrics_series_get(g, NULL);
    metrics_set(s, 4);
    metrics_add(s, -1.5);

    char *text = metrics_render(r, NULL);
    assert_non_null(text);
    assert_string_equal(text, "# HELP t_requests_total Requests.\n"
                              "# TYPE t_requests_total counter\n"
                              "t_requests_total{model=\"demo\",code=\"OK\"} 3\n"
                              "t_requests_total{model=\"demo\",code=\"NOT_FOUND\"} 1\n"
                              "# HELP t_inflight In flight.\n"
                              "# TYPE t_inflight gauge\n"
                              "t_inflight 2.5\n");
    free(text);
    metrics_registry_free(r);
}

static void test_escaping(void **state)
{
    (void)state;
    metrics_registry *r = metrics_registry_new();
    const char *const ln[] = {"v"};
    metrics_family *c = metrics_family_new(r, METRICS_COUNTER, "t_total",
                                           "Line one\nback\\slash \"quoted\"", 1, ln, 0, NULL);
    const char *const v[] = {"a\"b\\c\nd"};
    metrics_add_l(c, v, 1);
    char *text = metrics_render(r, NULL);
    assert_string_equal(text, "# HELP t_total Line one\\nback\\\\slash \"quoted\"\n"
                              "# TYPE t_total counter\n"
                              "t_total{v=\"a\\\"b\\\\c\\nd\"} 1\n");
    free(text);
    metrics_registry_free(r);
}

static void test_histogram_buckets(void **state)
{
    (void)state;
    metrics_registry *r = metrics_registry_new();
    const double b[] = {0.5, 1, 2.5};
    const char *const ln[] = {"model"};
    metrics_family *h =
        metrics_family_new(r, METRICS_HISTOGRAM, "t_seconds", "Latency.", 1, ln, 3, b);
    assert_non_null(h);
    const char *const v[] = {"demo"};
    metrics_series *s = metrics_series_get(h, v);
    metrics_observe(s, 0.25);
    metrics_observe(s, 0.5); /* le is inclusive */
    metrics_observe(s, 0.75);
    metrics_observe(s, 3);
    metrics_observe(s, 100);
    assert_int_equal(metrics_hist_bucket(s, 0), 2);
    assert_int_equal(metrics_hist_bucket(s, 1), 3);
    assert_int_equal(metrics_hist_bucket(s, 2), 3);
    assert_int_equal(metrics_hist_bucket(s, 3), 5);
    assert_int_equal(metrics_hist_count(s), 5);
    char *text = metrics_render(r, NULL);
    assert_string_equal(text, "# HELP t_seconds Latency.\n"
                              "# TYPE t_seconds histogram\n"
                              "t_seconds_bucket{model=\"demo\",le=\"0.5\"} 2\n"
                              "t_seconds_bucket{model=\"demo\",le=\"1\"} 3\n"
                              "t_seconds_bucket{model=\"demo\",le=\"2.5\"} 3\n"
                              "t_seconds_bucket{model=\"demo\",le=\"+Inf\"} 5\n"
                              "t_seconds_sum{model=\"demo\"} 104.5\n"
                              "t_seconds_count{model=\"demo\"} 5\n");
    free(text);

    /* No labels: only le inside the braces. */
    metrics_family *h2 = metrics_family_new(r, METRICS_HISTOGRAM, "t_c", "C.", 0, NULL, 1, b);
    metrics_observe_l(h2, NULL, 0.1);
    text = metrics_render(r, NULL);
    assert_non_null(strstr(text, "t_c_bucket{le=\"0.5\"} 1\nt_c_bucket{le=\"+Inf\"} 1\n"
                                 "t_c_sum 0.1\nt_c_count 1\n"));
    free(text);
    metrics_registry_free(r);
}

static void test_bad_families(void **state)
{
    (void)state;
    metrics_registry *r = metrics_registry_new();
    const double unsorted[] = {1, 0.5};
    assert_null(metrics_family_new(r, METRICS_HISTOGRAM, "x", "", 0, NULL, 2, unsorted));
    const double inf[] = {1, 1.0 / 0.0};
    assert_null(metrics_family_new(r, METRICS_HISTOGRAM, "x", "", 0, NULL, 2, inf));
    assert_null(metrics_family_new(r, METRICS_COUNTER, "x", "", METRICS_MAX_LABELS + 1, NULL,
                                   0, NULL));
    metrics_registry_free(r);
}

static void test_format_double(void **state)
{
    (void)state;
    char b[64];
    metrics_format_double(0.1, b, sizeof b);
    assert_string_equal(b, "0.1");
    metrics_format_double(3, b, sizeof b);
    assert_string_equal(b, "3");
    metrics_format_double(0.0005, b, sizeof b);
    assert_string_equal(b, "0.0005");
    metrics_format_double(1.0 / 0.0, b, sizeof b);
    assert_string_equal(b, "+Inf");
    metrics_format_double(-1.0 / 0.0, b, sizeof b);
    assert_string_equal(b, "-Inf");
    metrics_format_double(0.0 / 0.0, b, sizeof b);
    assert_string_equal(b, "NaN");
    metrics_format_double(123456789012345678.0, b, sizeof b);
    assert_true(strtod(b, NULL) == 123456789012345678.0);
}

static int g_collects;
static void collect(metrics_family *f, void *ctx)
{
    g_collects++;
    metrics_family_clear(f);
    const char *const v[] = {(const char *)ctx};
    metrics_set_l(f, v, 1);
}

static void test_collect_hook(void **state)
{
    (void)state;
    metrics_registry *r = metrics_registry_new();
    const char *const ln[] = {"state"};
    metrics_family *g = metrics_family_new(r, METRICS_GAUGE, "t_state", "S.", 1, ln, 0, NULL);
    const char *const old[] = {"LOADING"};
    metrics_set_l(g, old, 1);
    metrics_family_set_collect(g, collect, (void *)"READY");
    char *text = metrics_render(r, NULL);
    assert_int_equal(g_collects, 1);
    assert_null(strstr(text, "LOADING"));
    assert_non_null(strstr(text, "t_state{state=\"READY\"} 1\n"));
    free(text);
    metrics_registry_free(r);
}

#define THREADS 8
#define ITERS 100000

typedef struct worker_arg {
    metrics_family *c, *h;
    int id;
} worker_arg;

static void *worker(void *p)
{
    worker_arg *a = p;
    const char *const v[] = {a->id % 2 ? "odd" : "even"};
    metrics_series *shared = metrics_series_get(a->c, (const char *const[]){"all"});
    for (int i = 0; i < ITERS; i++) {
        metrics_add(shared, 1);
        metrics_add_l(a->c, v, 1); /* lookup path, concurrently creating series */
        metrics_observe_l(a->h, NULL, (double)(i % 4));
    }
    return NULL;
}

static void test_concurrent_increments(void **state)
{
    (void)state;
    metrics_registry *r = metrics_registry_new();
    const char *const ln[] = {"k"};
    const double b[] = {0.5, 1.5, 2.5};
    worker_arg args[THREADS];
    pthread_t th[THREADS];
    metrics_family *c = metrics_family_new(r, METRICS_COUNTER, "t_total", "T.", 1, ln, 0, NULL);
    metrics_family *h = metrics_family_new(r, METRICS_HISTOGRAM, "t_h", "H.", 0, NULL, 3, b);
    for (int i = 0; i < THREADS; i++) {
        args[i] = (worker_arg){c, h, i};
        assert_int_equal(pthread_create(&th[i], NULL, worker, &args[i]), 0);
    }
    for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
    assert_true(metrics_value(metrics_series_get(c, (const char *const[]){"all"})) ==
                (double)THREADS * ITERS);
    assert_true(metrics_value(metrics_series_get(c, (const char *const[]){"odd"})) ==
                (double)THREADS / 2 * ITERS);
    assert_true(metrics_value(metrics_series_get(c, (const char *const[]){"even"})) ==
                (double)THREADS / 2 * ITERS);
    metrics_series *hs = metrics_series_get(h, NULL);
    assert_int_equal(metrics_hist_count(hs), THREADS * ITERS);
    assert_int_equal(metrics_hist_bucket(hs, 0), THREADS * ITERS / 4);
    assert_int_equal(metrics_hist_bucket(hs, 2), THREADS * ITERS * 3 / 4);
    assert_true(metrics_hist_sum(hs) == (double)THREADS * ITERS / 4 * (0 + 1 + 2 + 3));
    metrics_registry_free(r);
}

static void test_server_families(void **state)
{
    (void)state;
    metrics_server m;
    assert_int_equal(metrics_server_init(&m, "1.2.3"), 0);
    const char *const rv[] = {"demo", "OK"};
    metrics_add_l(m.requests_total, rv, 1);
    metrics_add(m.inflight, 1);
    char *text = metrics_render(m.reg, NULL);
    assert_non_null(strstr(text, "# TYPE ikbo_requests_total counter\n"
                                 "ikbo_requests_total{model=\"demo\",code=\"OK\"} 1\n"));
    assert_non_null(strstr(text, "ikbo_build_info{version=\"1.2.3\"} 1\n"));
    assert_non_null(strstr(text, "ikbo_inflight_requests 1\n"));
    assert_non_null(strstr(text, "# TYPE ikbo_request_duration_seconds histogram\n"));
    assert_non_null(strstr(text, "ikbo_request_candidates_count 0\n"));
    free(text);
    metrics_server_free(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_counter_and_gauge_format),
        cmocka_unit_test(test_escaping),
        cmocka_unit_test(test_histogram_buckets),
        cmocka_unit_test(test_bad_families),
        cmocka_unit_test(test_format_double),
        cmocka_unit_test(test_collect_hook),
        cmocka_unit_test(test_concurrent_increments),
        cmocka_unit_test(test_server_families),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
