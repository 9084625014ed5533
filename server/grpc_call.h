/* grpc_call.h - one server call's bookkeeping on gRPC core's C API, shared
 * by ikbo-serve's gRPC front end (grpc_server.c) and the transport floor it
 * is measured against (bench/e2e/echo_server.c).
 *
 * Why this exists: the echo server is a floor only if it moves each call
 * through gRPC core as the server does. The two used to carry their own
 * copies of the call record, its tags and refcount, the close op, the send
 * batch and the shutdown gate, so a fix to one (a batch started on a queue
 * being shut down aborts core) had to be found and made again in the other.
 * What differs stays with each program: which methods are served, what an
 * answer holds, which thread sends it, and the worker loop around these.
 *
 * The life of a call:
 *   1. gcall_init, then gcall_request on a worker's completion queue (for a
 *      method registered with gcall_register, its message read up front; or
 *      a generic request, details filled in, for any other method). The
 *      record carries three tags (request, close, send); each completion's
 *      tag names the record and the kind of op that completed.
 *   2. When the request completes with success, gcall_gate_take counts the
 *      call busy, or, once the gate is stopped, cancels it UNAVAILABLE (the
 *      owner then frees the record: nothing was started on it).
 *   3. gcall_start_close starts GRPC_OP_RECV_CLOSE_ON_SERVER at once, so a
 *      client that goes away is seen while its call still waits; the record
 *      then holds two refs, the close op and the send batch (one if the
 *      close op could not start).
 *   4. gcall_send starts the one send batch (initial metadata, the message
 *      in response if set, the status), from any thread; then the owner
 *      calls gcall_gate_leave. If the batch did not start, the owner drops
 *      its ref itself.
 *   5. Each completion of the close op or the send batch drops a ref
 *      (gcall_unref); the owner frees its record when the last one goes.
 * The gate (gcall_gate) is what makes shutdown safe: stop it, then wait
 * until no call is busy (gcall_gate_wait_idle) before shutting the
 * completion queues down, so that no batch is ever started on a shut-down
 * queue (gRPC core aborts on that).
 *
 * Ownership: a gcall is embedded in the owner's call record (GCALL_OWNER
 * gives the record back from a tag's gcall), which the owner allocates and
 * frees; gcall_destroy releases what the gcall holds (the core call, its
 * metadata, request and response messages, status text, generic details).
 * The gate's state lives in the gcall_gate the owner embeds.
 * Thread-safety: a gcall is used by one thread at a time (the worker that
 * took it, then whichever thread answers it), except refs, which is atomic:
 * gcall_unref may run on any thread. gcall_send may be called from any
 * thread (grpc_call_start_batch may). The gate's functions take its mutex
 * and may be called from any thread.
 */
#ifndef IKBO_SERVER_GRPC_CALL_H
#define IKBO_SERVER_GRPC_CALL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

#include <grpc/grpc.h>

enum gcall_kind { GCALL_REQUEST = 0, GCALL_CLOSE = 1, GCALL_SEND = 2 };

typedef struct gcall gcall;

/* A completion-queue tag: the record and the op that completed. */
typedef struct gcall_tag {
    gcall *g;
    enum gcall_kind kind;
} gcall_tag;

struct gcall {
    gcall_tag t_request, t_close, t_send;
    atomic_int refs;          /* the close op and the send batch */
    int close_cancelled;      /* written by gRPC core for the close op */
    int generic;              /* requested with gcall_request(.., NULL, ..) */
    grpc_call *call;
    gpr_timespec deadline;    /* registered methods only */
    grpc_call_details details; /* generic requests only: method, host, deadline */
    grpc_metadata_array md;   /* the request's metadata */
    grpc_byte_buffer *payload; /* the request message (registered methods), or NULL */
    grpc_byte_buffer *response; /* set by the owner before gcall_send, or NULL */
    grpc_slice status_details; /* the status message; lives until the record goes */
};

/* The owner's record of type `type` in which g is the member `member`. */
#define GCALL_OWNER(g, type, member) ((type *)(void *)((char *)(g) - offsetof(type, member)))

/* Registers path on server so that its calls arrive with the request
 * message read (gcall_request's payload); NULL on failure. Before
 * grpc_server_start. */
void *gcall_register(grpc_server *server, const char *path);

/* Makes g (zeroed memory, or a record never requested) ready to request. */
void gcall_init(gcall *g);

/* Requests the next call of the method registered as `registered` (or, with
 * NULL, of any method not registered) on cq, which both binds the call and
 * gets its completions. Returns core's error; on failure nothing is posted,
 * and the owner frees its record as usual (gcall_destroy). */
grpc_call_error gcall_request(gcall *g, grpc_server *server, void *registered,
                              grpc_completion_queue *cq);

/* Releases what g holds; the owner then frees its record. */
void gcall_destroy(gcall *g);

/* Step 3 above: sets refs to 2 and starts the close op (refs 1 if it could
 * not start; the call is still answered). */
void gcall_start_close(gcall *g);

/* Step 4 above: initial metadata, g->response if set, and the status code
 * with msg (NULL: empty) in one batch. The record may be freed by another
 * thread as soon as this returns GRPC_CALL_OK; on any other result the send
 * batch will not complete, and the caller drops its ref (gcall_unref). */
grpc_call_error gcall_send(gcall *g, grpc_status_code code, const char *msg);

/* Drops one ref; 1 when it was the last (the owner frees the record now). */
int gcall_unref(gcall *g);

/* For a worker that never ran, after its queue was shut down: takes every
 * event off cq until it reports shutdown, handing each requested call's
 * record (they complete as failed) to free_record. */
void gcall_drain(grpc_completion_queue *cq, void (*free_record)(gcall *));

/* ---- the gate ------------------------------------------------------------ */

typedef struct gcall_gate {
    pthread_mutex_t mu;
    pthread_cond_t idle;
    int stopping; /* set by gcall_gate_stop: no call is taken on after */
    int busy;     /* calls taken on whose send batch has not been started */
} gcall_gate;

void gcall_gate_init(gcall_gate *gt);
void gcall_gate_destroy(gcall_gate *gt);

/* Takes an arrived call on: 1, with the call counted busy and then taken(arg)
 * run under the gate's lock (NULL: nothing), so that what it does cannot
 * happen after gcall_gate_stop returns. 0 once the gate is stopped: the call
 * has been cancelled UNAVAILABLE with stop_msg; nothing was started on it,
 * and the owner frees its record. */
int gcall_gate_take(gcall_gate *gt, gcall *g, const char *stop_msg, void (*taken)(void *),
                    void *arg);

/* A call taken on has had its send batch started (or given up). */
void gcall_gate_leave(gcall_gate *gt);

/* From now on gcall_gate_take refuses every call. */
void gcall_gate_stop(gcall_gate *gt);

/* Waits until no call taken on is still busy. */
void gcall_gate_wait_idle(gcall_gate *gt);

#endif
