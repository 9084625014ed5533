/* test_log.c - the event log's line shapes: plain key=value quoting, JSON
 * escaping, level filtering and truncation that keeps JSON valid. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/log.h"

/* Runs fn with the log going to a temp file; returns what was written. */
static char *capture(enum log_level min, int json, void (*fn)(void))
{
    FILE *f = tmpfile();
    assert_non_null(f);
    log_setup(min, json, f);
    fn();
    log_setup(LOG_LEVEL_INFO, 0, NULL);
    long n = ftell(f);
    rewind(f);
    char *s = calloc(1, (size_t)n + 1);
    assert_int_equal(fread(s, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    return s;
}

static void emit_rank(void)
{
    log_line ln;
    log_begin(&ln, LOG_LEVEL_INFO, "rank");
    log_str(&ln, "model", "demo");
    log_str(&ln, "request_id", "abc");
    log_str(&ln, "empty", ""); /* skipped */
    log_str(&ln, "code", "OK");
    log_num(&ln, "ms", 1.234, 1);
    log_int(&ln, "candidates", 70);
    log_str(&ln, "error", "a \"b\" c\\d\n");
    log_end(&ln);
}

static void test_plain(void **state)
{
    (void)state;
    char *s = capture(LOG_LEVEL_INFO, 0, emit_rank);
    /* 2026-11-29T12:00:00.123Z info rank ... */
    assert_int_equal(strlen(s) > 25, 1);
    assert_int_equal(s[4], '-');
    assert_int_equal(s[10], 'T');
    assert_int_equal(s[23], 'Z');
    assert_string_equal(s + 24, " info rank model=demo request_id=abc code=OK ms=1.2 candidates=70 "
                                "error=\"a \\\"b\\\" c\\\\d\\n\"\n");
    free(s);
}

static void test_json(void **state)
{
    (void)state;
    char *s = capture(LOG_LEVEL_DEBUG, 1, emit_rank);
    assert_int_equal(strncmp(s, "{\"ts\":\"", 7), 0);
    const char *rest = strstr(s, "\",\"level\"");
    assert_non_null(rest);
    assert_string_equal(rest, "\",\"level\":\"info\",\"event\":\"rank\",\"model\":\"demo\","
                              "\"request_id\":\"abc\",\"code\":\"OK\",\"ms\":1.2,\"candidates\":70,"
                              "\"error\":\"a \\\"b\\\" c\\\\d\\n\"}\n");
    free(s);
}

static void emit_control(void)
{
    log_line ln;
    log_begin(&ln, LOG_LEVEL_INFO, "bytes");
    log_str(&ln, "v", "a\x01\tb\x7f\x1f");
    log_end(&ln);
}

/* Control bytes: plain lines escape them (DEL too) as \xXX, JSON as \u00XX
 * (DEL is valid JSON and stays). */
static void test_control_bytes(void **state)
{
    (void)state;
    char *s = capture(LOG_LEVEL_INFO, 0, emit_control);
    const char *v = strstr(s, " v=");
    assert_non_null(v);
    assert_string_equal(v, " v=\"a\\x01\\tb\\x7f\\x1f\"\n");
    free(s);
    s = capture(LOG_LEVEL_INFO, 1, emit_control);
    v = strstr(s, "\"v\":");
    assert_non_null(v);
    assert_string_equal(v, "\"v\":\"a\\u0001\\tb\x7f\\u001f\"}\n");
    free(s);
}

static void test_level_filter(void **state)
{
    (void)state;
    char *s = capture(LOG_LEVEL_WARN, 0, emit_rank);
    assert_string_equal(s, "");
    free(s);
}

static void emit_long(void)
{
    log_line ln;
    log_begin(&ln, LOG_LEVEL_ERROR, "big");
    char v[600];
    memset(v, 'x', sizeof v - 1);
    v[sizeof v - 1] = '\0';
    for (int i = 0; i < 10; i++) log_str(&ln, "k", v);
    log_end(&ln);
    log_msg(LOG_LEVEL_WARN, "after", "%d", 7);
}

static void test_truncation(void **state)
{
    (void)state;
    char *s = capture(LOG_LEVEL_INFO, 1, emit_long);
    char *nl = strchr(s, '\n');
    assert_non_null(nl);
    assert_true(nl - s < LOG_LINE_MAX);
    assert_non_null(strstr(s, ",\"truncated\":true}\n"));
    assert_non_null(strstr(nl + 1, "\"event\":\"after\",\"msg\":\"7\"}\n"));
    free(s);
    s = capture(LOG_LEVEL_INFO, 0, emit_long);
    assert_non_null(strstr(s, " ...\n"));
    free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plain),
        cmocka_unit_test(test_json),
        cmocka_unit_test(test_control_bytes),
        cmocka_unit_test(test_level_filter),
        cmocka_unit_test(test_truncation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
