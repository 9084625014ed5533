/* client.c - gRPC core client helpers for ikbo-loadgen (see client.h). */
#include "client.h"

#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const CODE_NAMES[LG_N_CODES] = {
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
};

const char *lg_code_name(int code)
{
    static _Thread_local char buf[32];
    if (code >= 0 && code < LG_N_CODES) return CODE_NAMES[code];
    snprintf(buf, sizeof buf, "CODE_%d", code);
    return buf;
}

grpc_channel *lg_channel_new(const char *target, int id)
{
    grpc_arg args[5];
    args[0].type = GRPC_ARG_INTEGER;
    args[0].key = (char *)GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL;
    args[0].value.integer = 1;
    args[1].type = GRPC_ARG_INTEGER;
    args[1].key = (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
    args[1].value.integer = -1;
    args[2].type = GRPC_ARG_INTEGER;
    args[2].key = (char *)GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
    args[2].value.integer = -1;
    /* Counts must match the server's: no retries of any kind. */
    args[3].type = GRPC_ARG_INTEGER;
    args[3].key = (char *)GRPC_ARG_ENABLE_RETRIES;
    args[3].value.integer = 0;
    args[4].type = GRPC_ARG_INTEGER;
    args[4].key = (char *)"ikbo.loadgen.connection";
    args[4].value.integer = id;
    grpc_channel_args ca = {5, args};
    grpc_channel_credentials *creds = grpc_insecure_credentials_create();
    grpc_channel *ch = grpc_channel_create(target, creds, &ca);
    grpc_channel_credentials_release(creds);
    return ch;
}

static gpr_timespec deadline_in_ms(int64_t ms)
{
    return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(ms, GPR_TIMESPAN));
}

int lg_channel_wait_ready(grpc_channel *ch, int timeout_ms)
{
    gpr_timespec end = deadline_in_ms(timeout_ms);
    grpc_completion_queue *cq = grpc_completion_queue_create_for_next(NULL);
    int rc = -1;
    for (;;) {
        grpc_connectivity_state s = grpc_channel_check_connectivity_state(ch, 1);
        if (s == GRPC_CHANNEL_READY) {
            rc = 0;
            break;
        }
        if (gpr_time_cmp(gpr_now(GPR_CLOCK_MONOTONIC), end) >= 0) break;
        grpc_channel_watch_connectivity_state(ch, s, end, cq, NULL);
        grpc_event ev = grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
        if (ev.type != GRPC_OP_COMPLETE || !ev.success) break; /* deadline passed */
    }
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type !=
           GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(cq);
    return rc;
}

uint8_t *lg_byte_buffer_read(grpc_byte_buffer *bb, size_t *len)
{
    *len = 0;
    if (!bb) return NULL;
    grpc_byte_buffer_reader r;
    if (!grpc_byte_buffer_reader_init(&r, bb)) return NULL;
    grpc_slice s = grpc_byte_buffer_reader_readall(&r);
    grpc_byte_buffer_reader_destroy(&r);
    size_t n = GRPC_SLICE_LENGTH(s);
    uint8_t *out = malloc(n ? n : 1);
    if (out) {
        memcpy(out, GRPC_SLICE_START_PTR(s), n);
        *len = n;
    }
    grpc_slice_unref(s);
    return out;
}

int lg_unary(grpc_channel *ch, const char *method, const uint8_t *req, size_t req_len,
             int timeout_ms, int *code, char **details, uint8_t **resp, size_t *resp_len)
{
    *code = GRPC_STATUS_UNKNOWN;
    *details = NULL;
    *resp = NULL;
    *resp_len = 0;
    grpc_completion_queue *cq = grpc_completion_queue_create_for_next(NULL);
    grpc_slice m = grpc_slice_from_static_string(method);
    grpc_call *call = grpc_channel_create_call(ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq, m, NULL,
                                               deadline_in_ms(timeout_ms), NULL);
    grpc_slice payload = grpc_slice_from_copied_buffer((const char *)req, req_len);
    grpc_byte_buffer *send = grpc_raw_byte_buffer_create(&payload, 1);
    grpc_slice_unref(payload);
    grpc_byte_buffer *recv = NULL;
    grpc_metadata_array init_md, trail_md;
    grpc_metadata_array_init(&init_md);
    grpc_metadata_array_init(&trail_md);
    grpc_status_code status = GRPC_STATUS_UNKNOWN;
    grpc_slice det = grpc_empty_slice();
    grpc_op ops[6];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = send;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &init_md;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &recv;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &trail_md;
    ops[5].data.recv_status_on_client.status = &status;
    ops[5].data.recv_status_on_client.status_details = &det;
    int rc = -1;
    if (call && grpc_call_start_batch(call, ops, 6, (void *)1, NULL) == GRPC_CALL_OK) {
        grpc_event ev = grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
        if (ev.type == GRPC_OP_COMPLETE) {
            rc = 0;
            *code = (int)status;
            char *d = grpc_slice_to_c_string(det);
            *details = strdup(d ? d : "");
            gpr_free(d);
            if (status == GRPC_STATUS_OK) *resp = lg_byte_buffer_read(recv, resp_len);
        }
    }
    if (call) grpc_call_unref(call);
    grpc_slice_unref(det);
    grpc_byte_buffer_destroy(send);
    if (recv) grpc_byte_buffer_destroy(recv);
    grpc_metadata_array_destroy(&init_md);
    grpc_metadata_array_destroy(&trail_md);
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type !=
           GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(cq);
    return rc;
}
