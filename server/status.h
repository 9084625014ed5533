/* status.h - the status every request path answers with: gRPC status codes
 * (their wire values), a one-line message, the HTTP mapping and the names.
 *
 * Why this exists: the transports, the batcher, the registry and the
 * request code all report errors the same way; this header needs nothing
 * else (no protobuf, no jansson). Reentrant; no global state.
 */
#ifndef IKBO_SERVER_STATUS_H
#define IKBO_SERVER_STATUS_H

/* gRPC status codes (numeric values are the gRPC wire values). */
enum rq_code {
    RQ_OK = 0,
    RQ_CANCELLED = 1,
    RQ_UNKNOWN = 2,
    RQ_INVALID_ARGUMENT = 3,
    RQ_DEADLINE_EXCEEDED = 4,
    RQ_NOT_FOUND = 5,
    RQ_RESOURCE_EXHAUSTED = 8,
    RQ_UNIMPLEMENTED = 12,
    RQ_INTERNAL = 13,
    RQ_UNAVAILABLE = 14,
};

typedef struct rq_status {
    int code;      /* enum rq_code */
    char msg[512]; /* one line, no trailing newline; "" when OK */
} rq_status;

/* Sets *st (st may be NULL) and returns -1 when code != RQ_OK, else 0, so
 * `return rq_status_set(st, RQ_INVALID_ARGUMENT, "...")` reads naturally. */
int rq_status_set(rq_status *st, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void rq_status_ok(rq_status *st);
/* "INVALID_ARGUMENT"; "UNKNOWN" for codes not listed above. */
const char *rq_code_name(int code);
/* OK 200, INVALID_ARGUMENT 400, NOT_FOUND 404, RESOURCE_EXHAUSTED 429,
 * DEADLINE_EXCEEDED 504, UNAVAILABLE 503, UNIMPLEMENTED 501, CANCELLED 499,
 * anything else 500. */
int rq_code_http(int code);

/* rq_status_set(st, RQ_INTERNAL, "out of memory"): -1. */
int rq_status_oom(rq_status *st);

#endif
