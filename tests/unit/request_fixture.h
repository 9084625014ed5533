/* request_fixture.h - parsing a JSON request body with rq_request_from_json
 * (server/request_json.c) and expecting it to succeed or fail, for the tests
 * of the JSON mapping (test_request.c, test_request_json_packed.c).
 * Header-only, one include per test binary. */
#ifndef IKBO_TESTS_REQUEST_FIXTURE_H
#define IKBO_TESTS_REQUEST_FIXTURE_H

#include <string.h>

#include "server/request.h"

/* json parsed (the request, to free with rq_request_free); fails the test
 * with the error otherwise. */
static __attribute__((unused)) Ikbo__V1__RankRequest *parse_ok(const char *json)
{
    rq_status st;
    Ikbo__V1__RankRequest *r = rq_request_from_json(json, strlen(json), &st);
    if (!r)
        fail_msg("parse failed: %s: %s\n  json: %s", rq_code_name(st.code), st.msg, json);
    assert_int_equal(st.code, RQ_OK);
    return r;
}

/* json rejected as INVALID_ARGUMENT with a message that is exactly want
 * (exact) or contains it. */
static __attribute__((unused)) void rf_parse_err(const char *json, const char *want, int exact)
{
    rq_status st;
    Ikbo__V1__RankRequest *r = rq_request_from_json(json, strlen(json), &st);
    if (r)
        fail_msg("expected the error %s'%s' for %s", exact ? "" : "containing ", want, json);
    assert_int_equal(st.code, RQ_INVALID_ARGUMENT);
    if (exact ? strcmp(st.msg, want) != 0 : strstr(st.msg, want) == NULL)
        fail_msg("message '%s', want %s'%s'\n  json: %s", st.msg, exact ? "" : "one containing ",
                 want, json);
}

#endif
