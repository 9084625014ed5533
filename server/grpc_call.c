/* grpc_call.c - one server call's bookkeeping and the shutdown gate, shared
 * by grpc_server.c and bench/e2e/echo_server.c (see grpc_call.h). */
#include "grpc_call.h"

#include <string.h>

#include <grpc/byte_buffer.h>
#include <grpc/slice.h>
#include <grpc/support/time.h>

void *gcall_register(grpc_server *server, const char *path)
{
    return grpc_server_register_method(server, path, NULL,
                                       GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER, 0);
}

void gcall_init(gcall *g)
{
    memset(g, 0, sizeof *g);
    g->t_request = (gcall_tag){g, GCALL_REQUEST};
    g->t_close = (gcall_tag){g, GCALL_CLOSE};
    g->t_send = (gcall_tag){g, GCALL_SEND};
    atomic_init(&g->refs, 0);
    grpc_metadata_array_init(&g->md);
    g->status_details = grpc_empty_slice();
}

grpc_call_error gcall_request(gcall *g, grpc_server *server, void *registered,
                              grpc_completion_queue *cq)
{
    if (registered)
        return grpc_server_request_registered_call(server, registered, &g->call, &g->deadline,
                                                   &g->md, &g->payload, cq, cq, &g->t_request);
    g->generic = 1;
    grpc_call_details_init(&g->details);
    return grpc_server_request_call(server, &g->call, &g->details, &g->md, cq, cq, &g->t_request);
}

void gcall_destroy(gcall *g)
{
    if (g->payload) grpc_byte_buffer_destroy(g->payload);
    if (g->response) grpc_byte_buffer_destroy(g->response);
    grpc_slice_unref(g->status_details);
    if (g->generic) grpc_call_details_destroy(&g->details);
    grpc_metadata_array_destroy(&g->md);
    if (g->call) grpc_call_unref(g->call);
}

void gcall_start_close(gcall *g)
{
    atomic_init(&g->refs, 2);
    grpc_op close_op;
    memset(&close_op, 0, sizeof close_op);
    close_op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    close_op.data.recv_close_on_server.cancelled = &g->close_cancelled;
    if (grpc_call_start_batch(g->call, &close_op, 1, &g->t_close, NULL) != GRPC_CALL_OK)
        atomic_store(&g->refs, 1);
}

grpc_call_error gcall_send(gcall *g, grpc_status_code code, const char *msg)
{
    g->status_details = msg ? grpc_slice_from_copied_string(msg) : grpc_empty_slice();
    grpc_op ops[3];
    memset(ops, 0, sizeof ops);
    size_t n = 0;
    ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[n].data.send_initial_metadata.count = 0;
    n++;
    if (g->response) {
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n].data.send_message.send_message = g->response;
        n++;
    }
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.trailing_metadata_count = 0;
    ops[n].data.send_status_from_server.status = code;
    ops[n].data.send_status_from_server.status_details = &g->status_details;
    n++;
    return grpc_call_start_batch(g->call, ops, n, &g->t_send, NULL);
}

int gcall_unref(gcall *g) { return atomic_fetch_sub(&g->refs, 1) == 1; }

void gcall_drain(grpc_completion_queue *cq, void (*free_record)(gcall *))
{
    grpc_event ev;
    do {
        ev = grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type == GRPC_OP_COMPLETE) free_record(((gcall_tag *)ev.tag)->g);
    } while (ev.type != GRPC_QUEUE_SHUTDOWN);
}

/* ---- the gate ------------------------------------------------------------ */

void gcall_gate_init(gcall_gate *gt)
{
    pthread_mutex_init(&gt->mu, NULL);
    pthread_cond_init(&gt->idle, NULL);
    gt->stopping = 0;
    gt->busy = 0;
}

void gcall_gate_destroy(gcall_gate *gt)
{
    pthread_mutex_destroy(&gt->mu);
    pthread_cond_destroy(&gt->idle);
}

int gcall_gate_take(gcall_gate *gt, gcall *g, const char *stop_msg, void (*taken)(void *),
                    void *arg)
{
    pthread_mutex_lock(&gt->mu);
    int stopping = gt->stopping;
    if (!stopping) {
        gt->busy++;
        if (taken) taken(arg);
    }
    pthread_mutex_unlock(&gt->mu);
    if (stopping) /* no batch may start now: the queues are going */
        grpc_call_cancel_with_status(g->call, GRPC_STATUS_UNAVAILABLE, stop_msg, NULL);
    return !stopping;
}

void gcall_gate_leave(gcall_gate *gt)
{
    pthread_mutex_lock(&gt->mu);
    if (--gt->busy == 0) pthread_cond_broadcast(&gt->idle);
    pthread_mutex_unlock(&gt->mu);
}

void gcall_gate_stop(gcall_gate *gt)
{
    pthread_mutex_lock(&gt->mu);
    gt->stopping = 1;
    pthread_mutex_unlock(&gt->mu);
}

void gcall_gate_wait_idle(gcall_gate *gt)
{
    pthread_mutex_lock(&gt->mu);
    while (gt->busy > 0) pthread_cond_wait(&gt->idle, &gt->mu);
    pthread_mutex_unlock(&gt->mu);
}
