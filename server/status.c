/* status.c - rq_status: the status codes and messages every transport
 * answers with (gRPC codes, their HTTP mapping and names). Kept apart from
 * the request code so that anything reporting a status needs neither
 * protobuf nor jansson. */
#include "status.h"

#include <stdarg.h>
#include <stdio.h>

int rq_status_set(rq_status *st, int code, const char *fmt, ...)
{
    if (st) {
        st->code = code;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(st->msg, sizeof st->msg, fmt, ap);
        va_end(ap);
        /* One line: transports put this in headers and log lines. */
        for (char *p = st->msg; *p; p++)
            if (*p == '\n' || *p == '\r')
                *p = ' ';
    }
    return code == RQ_OK ? 0 : -1;
}

void rq_status_ok(rq_status *st)
{
    if (st) {
        st->code = RQ_OK;
        st->msg[0] = 0;
    }
}

const char *rq_code_name(int code)
{
    switch (code) {
    case RQ_OK: return "OK";
    case RQ_CANCELLED: return "CANCELLED";
    case RQ_INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case RQ_DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case RQ_NOT_FOUND: return "NOT_FOUND";
    case RQ_RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case RQ_UNIMPLEMENTED: return "UNIMPLEMENTED";
    case RQ_INTERNAL: return "INTERNAL";
    case RQ_UNAVAILABLE: return "UNAVAILABLE";
    default: return "UNKNOWN";
    }
}

int rq_code_http(int code)
{
    switch (code) {
    case RQ_OK: return 200;
    case RQ_CANCELLED: return 499;
    case RQ_INVALID_ARGUMENT: return 400;
    case RQ_DEADLINE_EXCEEDED: return 504;
    case RQ_NOT_FOUND: return 404;
    case RQ_RESOURCE_EXHAUSTED: return 429;
    case RQ_UNIMPLEMENTED: return 501;
    case RQ_UNAVAILABLE: return 503;
    default: return 500;
    }
}

int rq_status_oom(rq_status *st) { return rq_status_set(st, RQ_INTERNAL, "out of memory"); }
