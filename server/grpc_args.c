/* grpc_args.c - the servers' channel arguments (see grpc_args.h). */
#include "grpc_args.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Replaces key's value, or appends it. -1 when full. */
static int set_int(grpc_args *g, const char *key, int value)
{
    size_t i = 0;
    while (i < g->ch.num_args && strcmp(g->a[i].key, key)) i++;
    if (i == GRPCARGS_MAX) return -1;
    if (i == g->ch.num_args) {
        snprintf(g->keys[i], sizeof g->keys[i], "%s", key);
        g->a[i].type = GRPC_ARG_INTEGER;
        g->a[i].key = g->keys[i];
        g->ch.num_args++;
    }
    g->a[i].value.integer = value;
    return 0;
}

/* "key=int,key=int": each entry applied over the defaults. */
static int apply_env(grpc_args *g, const char *spec, char *err, size_t err_n)
{
    char buf[1024];
    if (strlen(spec) >= sizeof buf) {
        snprintf(err, err_n, "IKBO_GRPC_ARGS: longer than %zu bytes", sizeof buf - 1);
        return -1;
    }
    snprintf(buf, sizeof buf, "%s", spec);
    char *save = NULL;
    for (char *e = strtok_r(buf, ",", &save); e; e = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(e, '='), *end = NULL;
        errno = 0;
        long v = eq ? strtol(eq + 1, &end, 10) : 0;
        if (!eq || eq == e || (size_t)(eq - e) >= sizeof g->keys[0] || !*(eq + 1) || *end ||
            errno || v < INT32_MIN || v > INT32_MAX) {
            snprintf(err, err_n, "IKBO_GRPC_ARGS: '%.80s' is not key=integer", e);
            return -1;
        }
        *eq = 0;
        if (set_int(g, e, (int)v)) {
            snprintf(err, err_n, "IKBO_GRPC_ARGS: more than %d arguments", GRPCARGS_MAX);
            return -1;
        }
    }
    return 0;
}

int grpc_args_server(grpc_args *g, uint32_t max_message_bytes, int metadata_ceiling, char *err,
                     size_t err_n)
{
    memset(g, 0, sizeof *g);
    g->ch.args = g->a;
    int max_recv = max_message_bytes > 0 && max_message_bytes < (uint32_t)INT32_MAX
                       ? (int)max_message_bytes
                       : INT32_MAX;
    set_int(g, GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, max_recv);
    set_int(g, GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, -1);
    set_int(g, GRPC_ARG_MAX_METADATA_SIZE, metadata_ceiling);
    /* A whole seed-scale request in one stream window and in few frames:
     * fewer WINDOW_UPDATE round trips before the server has it. */
    set_int(g, GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, GRPCARGS_LOOKAHEAD_BYTES);
    set_int(g, GRPC_ARG_HTTP2_MAX_FRAME_SIZE, GRPCARGS_MAX_FRAME_SIZE);
    const char *spec = getenv("IKBO_GRPC_ARGS");
    return spec && *spec ? apply_env(g, spec, err, err_n) : 0;
}
