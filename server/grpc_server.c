/* grpc_server.c - the gRPC front end on gRPC core's C API (see grpc_server.h).
 *
 * A `call` record is made when a call is requested; it embeds the call's
 * bookkeeping shared with the echo floor (grpc_call.h): three completion-queue
 * tags, for the request (the call arrived), the close op
 * (GRPC_OP_RECV_CLOSE_ON_SERVER, started as soon as the call arrives, so a
 * client that goes away is seen while its request is still queued) and the
 * one send batch (initial metadata, message, status). When a call arrives
 * the worker re-requests the method at once, starts the close op, and hands
 * a Rank call to rank_submit; the answer is sent by whichever thread
 * finishes it (a batcher instance or completion thread, see batcher.h, or
 * the worker itself for an early error). The record is freed when both the
 * close op and the send batch have completed (refs). The gate's `busy`
 * counts calls that arrived and whose send batch has not been started yet;
 * grpcsrv_free stops the gate and waits for `busy` to reach zero before it
 * destroys the server and shuts the queues down, so no request or batch is
 * ever started on a destroyed server or a shut-down queue.
 *
 * Which thread writes an answer to the socket, from gRPC core's sources
 * (surface/call.cc, iomgr/exec_ctx.h, iomgr/combiner.cc and chttp2_transport.cc
 * as of 1.49-1.51; read, not traced): grpc_call_start_batch opens a fresh
 * default ExecCtx on whatever thread calls it, and a default ExecCtx is born
 * "finished" (GRPC_EXEC_CTX_FLAG_IS_FINISHED). The send ops run in the
 * connection's transport combiner (perform_stream_op_locked), and the write
 * itself (write_action_begin_locked -> write_action -> grpc_endpoint_write,
 * sendmsg; what does not fit the socket waits for the poller) runs from the
 * combiner's final list in whichever thread holds the combiner; the chttp2
 * write path no longer schedules on the executor itself. If the combiner was
 * idle, that thread is the caller: an instance or completer sends the answer
 * itself. If another thread holds it (a worker reading the next request on
 * the same connection, or starting a call's close op), the combiner is
 * "contended", and grpc_combiner_continue_exec_ctx hands the rest of its
 * queue to the executor whenever the holder's ExecCtx is ready to finish:
 * always for an application thread's, and for a worker in
 * grpc_completion_queue_next once its queue has an event. So the executor
 * hop comes from contention on one connection's combiner, not from sending
 * from a thread that does not poll: a worker calling grpc_call_start_batch
 * opens the same kind of ExecCtx and is offloaded the same way, and handing
 * the answer to a worker would add back the cross-thread wake-up the
 * batcher no longer makes. The public C API can neither run a batch on a
 * chosen (polling) thread nor switch the executor off (Executor::
 * SetThreadingAll is internal, and the executor also runs core's blocking
 * work), so nothing is done about it here; clients that spread calls over
 * several connections contend less per combiner. Measured on a 2-core CPU
 * host (bench/e2e/thread_cpu.py, demo 1 user x 70, one loadgen connection,
 * 2 workers): gRPC's default-executor thread used 0.0% of a core at 500
 * req/s and 0.7-1.0% at 1500 (near saturation), against 5-10% for the
 * completion thread that built and sent the answers: there, sends run on
 * the thread that starts them almost always. A busier host contends more
 * (the H200 host's default-executor thread ran at 50-57% of a core at 17k
 * requests/s), but the hop costs no latency there: the echo server with
 * each answer handed to another thread was as fast at 1 x 70 (8600/s) and
 * 0.05 ms faster at 16 x 70 than sending from its worker (bench/RESULTS.md,
 * 2026-12-04). So answers are sent by whichever thread finishes them.
 */
#include "clock.h"
#include "grpc_server.h"

#include "grpc_args.h"
#include "grpc_call.h"

#include <errno.h>
#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/compression.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <pthread.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "config.h"
#include "grpc/health/v1/health.pb-c.h"
#include "health.h"
#include "ikbo/v1/ranker.pb-c.h"
#include "log.h"
#include "pb_arena.h"
#include "pb_check.h"
#include "rank_wire.h"

enum method { M_RANK = 0, M_MODEL_INFO = 1, M_HEALTH_CHECK = 2, M_UNKNOWN = 3, M_COUNT = 4 };

static const char *const method_path[M_COUNT] = {
    "/ikbo.v1.Ranker/Rank",
    "/ikbo.v1.Ranker/ModelInfo",
    "/grpc.health.v1.Health/Check",
    "unknown",
};

/* Requests posted per method per worker, re-posted as each call arrives:
 * workers never wait for compute, so each keeps accepting. */
#define REQUESTS_PER_METHOD 1

/* Drain: how long no call must arrive before shutdown proper (see
 * grpcsrv_shutdown). */
#define LAME_DUCK_QUIET_MS 200
/* After shutdown starts, how long core gets to settle streams that raced it
 * (they end UNAVAILABLE that way; closing their connection would cancel
 * them) before idle connections are closed (shutdown_wait). */
#define SHUTDOWN_SETTLE_MS 1000

/* The metadata limit a config may ask for stays well under core's ceiling. */
_Static_assert(CONFIG_MAX_METADATA_BYTES_CAP <= GRPCSRV_METADATA_CEILING / 4,
               "limits.max_metadata_bytes cap must leave room under gRPC core's ceiling");

/* HTTP/2's per-entry overhead in a header list's size (RFC 9113 6.5.2). */
#define HTTP2_ENTRY_OVERHEAD 32

/* gRPC core 1.51 tells whether a received message still has its compressed
 * flag (core did not decompress it) only through this test-only function,
 * declared with C++ linkage in its internal src/core/lib/surface/
 * call_test_only.h; libgrpc.so.29 exports it under this name (a core without
 * it fails at link time, not silently). The flag bit is core's
 * GRPC_WRITE_INTERNAL_COMPRESS (src/core/lib/transport/transport.h). */
extern uint32_t core_message_flags(grpc_call *call)
    __asm__("_Z37grpc_call_test_only_get_message_flagsP9grpc_call");
#define CORE_WRITE_INTERNAL_COMPRESS 0x80000000u

typedef struct worker worker;

typedef struct call {
    /* The core call, its tags, refs (the close op and the send batch),
     * request and answer (grpc_call.h; M_UNKNOWN calls are its generic
     * requests). */
    gcall gc;
    worker *w;
    enum method method;
    /* Set when the close op reports the call cancelled (client gone,
     * deadline passed): a queued Rank is then not computed. */
    atomic_int gone;
    pb_arena *rank_arena; /* a Rank call's request (all its memory), until answered */
    grpc_slice rank_bytes; /* its wire bytes, which the packed columns point into */
    /* Rank calls: when a worker took the call off its queue, and when its
     * answer was handed to finish (ikbo_grpc_receive/send_seconds). */
    int64_t arrived_ns, answered_ns;
    int counted; /* in grpcsrv.live until freed */
} call;

struct worker {
    grpcsrv *srv;
    int index;
    grpc_completion_queue *cq;
    pthread_t thread;
    int started;
    /* Call slots this worker owes its queue: a request_call that failed
     * (out of memory) after a call arrived. Retried every
     * REREQUEST_MS until made good, so a transient failure does not leave
     * the server unable to accept that method. Worker thread only. */
    int owed[M_COUNT];
};

#define REREQUEST_MS 10

struct grpcsrv {
    grpc_server *server;
    void *registered[M_UNKNOWN];
    grpc_completion_queue *shutdown_cq;
    worker *workers;
    int n_workers;
    int port;
    int shutdown_started;
    int shutdown_done;
    const rank_env *rank;
    registry *reg;
    metrics_server *metrics;
    const atomic_int *draining;
    uint32_t max_metadata_bytes;
    char encodings[64]; /* "identity, deflate, gzip": what core decompresses */
    /* CLOCK_MONOTONIC ms of the last Rank/ModelInfo/unknown call to reach a
     * worker: the drain's lame-duck phase waits for it to go quiet. */
    atomic_llong last_call_ms;
    /* Stopped by grpcsrv_free before the queues shut down: from then on no
     * worker starts a batch (a batch on a shut-down queue aborts), and a call
     * still found in a queue is cancelled UNAVAILABLE. Its busy count is of
     * calls that arrived and are not answered yet (their send batch not
     * started: a Rank waiting in the batcher counts). */
    gcall_gate gate;
    /* Calls that arrived and whose records are not freed yet (answered or
     * not, their send batch and close op not both done): 0 during the drain
     * means what keeps gRPC core's shutdown waiting is idle connections. */
    atomic_int live;
};

/* ---- requests ----------------------------------------------------------- */

static void call_free(call *c)
{
    if (c->counted) atomic_fetch_sub(&c->w->srv->live, 1);
    gcall_destroy(&c->gc);
    pb_arena_free(c->rank_arena); /* the request, if still held */
    grpc_slice_unref(c->rank_bytes);
    free(c);
}

/* gcall_drain's free_record. */
static void record_free(gcall *g) { call_free(GCALL_OWNER(g, call, gc)); }

static int request_call(worker *w, enum method m)
{
    grpcsrv *s = w->srv;
    call *c = calloc(1, sizeof *c);
    if (!c) return -1;
    gcall_init(&c->gc);
    c->w = w;
    c->method = m;
    c->rank_bytes = grpc_empty_slice();
    grpc_call_error e =
        gcall_request(&c->gc, s->server, m == M_UNKNOWN ? NULL : s->registered[m], w->cq);
    if (e != GRPC_CALL_OK) {
        call_free(c);
        log_msg(LOG_LEVEL_ERROR, "grpc", "request_call(%s) failed: %d", method_path[m], (int)e);
        return -1;
    }
    return 0;
}

static void call_unref(call *c)
{
    if (gcall_unref(&c->gc)) call_free(c);
}

/* ---- answering ---------------------------------------------------------- */

/* Sends initial metadata, the response (when code is OK and resp is given)
 * and the status in one batch, from any thread; the call must not be
 * touched after (its record goes once the batch and the close op are done). */
static void finish(call *c, int code, const char *msg, const ProtobufCMessage *resp)
{
    grpcsrv *s = c->w->srv;
    c->answered_ns = clock_mono_ns();
    if (code == RQ_OK && resp) {
        const Ikbo__V1__RankResponse *rr =
            resp->descriptor == &ikbo__v1__rank_response__descriptor
                ? (const Ikbo__V1__RankResponse *)resp
                : NULL;
        size_t n = rr ? rank_wire_response_size(rr) : protobuf_c_message_get_packed_size(resp);
        grpc_slice slice = grpc_slice_malloc(n);
        if (rr) rank_wire_pack_response(rr, GRPC_SLICE_START_PTR(slice));
        else protobuf_c_message_pack(resp, GRPC_SLICE_START_PTR(slice));
        c->gc.response = grpc_raw_byte_buffer_create(&slice, 1);
        grpc_slice_unref(slice);
    }

    const char *const labels[] = {method_path[c->method], rq_code_name(code)};
    metrics_add_l(s->metrics->grpc_requests_total, labels, 1);

    enum method method = c->method;
    grpc_call_error e = gcall_send(&c->gc, (grpc_status_code)code, code == RQ_OK ? "" : msg);
    if (e != GRPC_CALL_OK) {
        log_msg(LOG_LEVEL_ERROR, "grpc", "start_batch(%s) failed: %d", method_path[method],
                (int)e);
        call_unref(c);
    }
    gcall_gate_leave(&s->gate); /* answered: its send batch started or abandoned */
}

/* Reads the whole request message and unpacks it; NULL with *st set. With
 * arena, the message's memory comes from a new arena returned there (free
 * that, not the message); else from malloc (protobuf_c_message_free_unpacked).
 * With keep, the message's bytes are returned there (the message may point
 * into them: unref after it); else they are released here. */
static ProtobufCMessage *unpack(call *c, const ProtobufCMessageDescriptor *d, pb_arena **arena,
                                grpc_slice *keep, rq_status *st)
{
    if (!c->gc.payload)
        return rq_status_set(st, RQ_INVALID_ARGUMENT, "%s: no request message", d->name), NULL;
    grpc_byte_buffer_reader rd;
    if (!grpc_byte_buffer_reader_init(&rd, c->gc.payload))
        return rq_status_set(st, RQ_INTERNAL, "cannot read the request message"), NULL;
    grpc_slice all = grpc_byte_buffer_reader_readall(&rd);
    grpc_byte_buffer_reader_destroy(&rd);
    ProtobufCMessage *m =
        rank_wire_unpack(d, GRPC_SLICE_START_PTR(all), GRPC_SLICE_LENGTH(all), arena, st);
    if (m && keep) *keep = all;
    else grpc_slice_unref(all);
    return m;
}

/* The call's deadline on CLOCK_MONOTONIC in ns (rank.h's clock); 0 = none. */
static int64_t deadline_ns(const call *c)
{
    gpr_timespec d = c->gc.deadline;
    if (gpr_time_cmp(d, gpr_inf_future(d.clock_type)) == 0) return 0;
    gpr_timespec left = gpr_time_sub(d, gpr_now(d.clock_type));
    int64_t now = clock_mono_ns();
    if (left.tv_sec < 0) return now; /* already passed */
    if (left.tv_sec > 10L * 365 * 86400) return 0;
    return now + (int64_t)left.tv_sec * 1000000000 + left.tv_nsec;
}

/* rank_submit's callback: on a batcher thread, or on the worker for an
 * early error. */
static void rank_done(void *arg, Ikbo__V1__RankResponse *resp, const rq_status *st)
{
    call *c = arg;
    pb_arena *arena = c->rank_arena;
    c->rank_arena = NULL;
    grpc_slice bytes = c->rank_bytes;
    c->rank_bytes = grpc_empty_slice();
    finish(c, resp ? RQ_OK : st->code, st->msg, resp ? &resp->base : NULL);
    rq_response_free(resp);
    pb_arena_free(arena); /* the request */
    grpc_slice_unref(bytes);
}

static void handle_rank(call *c)
{
    grpcsrv *s = c->w->srv;
    rq_status st;
    rq_status_ok(&st);
    if (atomic_load(s->draining)) {
        metrics_server *mx = s->metrics;
        const char *const mc[] = {"", "UNAVAILABLE"};
        metrics_add_l(mx->requests_total, mc, 1);
        finish(c, RQ_UNAVAILABLE, "server is shutting down", NULL);
        return;
    }
    pb_arena *arena = NULL;
    Ikbo__V1__RankRequest *req =
        (Ikbo__V1__RankRequest *)unpack(c, &ikbo__v1__rank_request__descriptor, &arena,
                                        &c->rank_bytes, &st);
    if (!req) {
        const char *const mc[] = {"", rq_code_name(st.code)};
        metrics_add_l(s->metrics->requests_total, mc, 1);
        finish(c, st.code, st.msg, NULL);
        return;
    }
    c->rank_arena = arena;
    metrics_observe(s->metrics->grpc_receive, (double)(clock_mono_ns() - c->arrived_ns) * 1e-9);
    rank_submit(s->rank, req, deadline_ns(c), &c->gone, "grpc", rank_done, c);
}

static void handle_model_info(call *c)
{
    grpcsrv *s = c->w->srv;
    rq_status st;
    rq_status_ok(&st);
    if (atomic_load(s->draining)) {
        finish(c, RQ_UNAVAILABLE, "server is shutting down", NULL);
        return;
    }
    Ikbo__V1__ModelInfoRequest *req = (Ikbo__V1__ModelInfoRequest *)unpack(
        c, &ikbo__v1__model_info_request__descriptor, NULL, NULL, &st);
    if (!req) {
        finish(c, st.code, st.msg, NULL);
        return;
    }
    Ikbo__V1__ModelInfoResponse *resp = registry_describe(s->reg, req->model, &st);
    finish(c, resp ? RQ_OK : st.code, st.msg, resp ? &resp->base : NULL);
    registry_describe_free(resp);
    protobuf_c_message_free_unpacked(&req->base, NULL);
}

static void handle_health(call *c)
{
    grpcsrv *s = c->w->srv;
    rq_status st;
    rq_status_ok(&st);
    Grpc__Health__V1__HealthCheckRequest *req = (Grpc__Health__V1__HealthCheckRequest *)unpack(
        c, &grpc__health__v1__health_check_request__descriptor, NULL, NULL, &st);
    if (!req) {
        finish(c, st.code, st.msg, NULL);
        return;
    }
    Grpc__Health__V1__HealthCheckResponse resp = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    if (health_check(s->reg, atomic_load(s->draining), req, &resp, &st) == 0)
        finish(c, RQ_OK, "", &resp.base);
    else
        finish(c, st.code, st.msg, NULL);
    protobuf_c_message_free_unpacked(&req->base, NULL);
}

static void handle_unknown(call *c)
{
    char *m = grpc_slice_to_c_string(c->gc.details.method);
    char msg[600];
    snprintf(msg, sizeof msg, "unknown method %.500s", m ? m : "?");
    log_line ln;
    log_begin(&ln, LOG_LEVEL_DEBUG, "grpc_unimplemented");
    log_str(&ln, "method", m);
    log_end(&ln);
    gpr_free(m);
    finish(c, RQ_UNIMPLEMENTED, msg, NULL);
}

/* ---- refusals every method shares ---------------------------------------- */

/* The call's request metadata as HTTP/2 sizes a header list: name + value +
 * 32 per entry, over what core hands the application (custom keys,
 * user-agent, ...; not the pseudo-headers nor the grpc-* headers core
 * consumes). */
static size_t metadata_bytes(const grpc_metadata_array *md)
{
    size_t n = 0;
    for (size_t i = 0; i < md->count; i++)
        n += GRPC_SLICE_LENGTH(md->metadata[i].key) + GRPC_SLICE_LENGTH(md->metadata[i].value) +
             HTTP2_ENTRY_OVERHEAD;
    return n;
}

/* Answers a call refused before its handler ran (a Rank counts in
 * requests_total, as the handler's own early errors do). */
static void refuse(call *c, int code, const char *msg)
{
    if (c->method == M_RANK) {
        const char *const mc[] = {"", rq_code_name(code)};
        metrics_add_l(c->w->srv->metrics->requests_total, mc, 1);
    }
    finish(c, code, msg, NULL);
}

/* Metadata over max_metadata_bytes, or a message whose compressed flag is
 * set but that core did not decompress (see grpc_server.h): refused here,
 * for this call alone. Returns 1 when the call has been answered. */
static int check_call(call *c)
{
    grpcsrv *s = c->w->srv;
    char msg[300];
    size_t md = metadata_bytes(&c->gc.md);
    if (md > s->max_metadata_bytes) {
        snprintf(msg, sizeof msg,
                 "request metadata is %zu bytes, over the limit of %u (limits.max_metadata_bytes; "
                 "each entry counts its name + value + 32)",
                 md, s->max_metadata_bytes);
        refuse(c, RQ_RESOURCE_EXHAUSTED, msg);
        return 1;
    }
    if (c->gc.payload && (core_message_flags(c->gc.call) & CORE_WRITE_INTERNAL_COMPRESS)) {
        snprintf(msg, sizeof msg,
                 "the message's compressed flag is set, but the call's grpc-encoding is absent, "
                 "identity or not one this server decodes (%s)",
                 s->encodings);
        refuse(c, RQ_INTERNAL, msg);
        return 1;
    }
    return 0;
}

/* ---- workers ------------------------------------------------------------ */

/* Call slots not yet re-requested (a request_call failed). */
static int owed_total(const worker *w)
{
    int n = 0;
    for (int m = 0; m < M_COUNT; m++) n += w->owed[m];
    return n;
}

/* Requests the call slots owed, as far as it can now. */
static void rerequest(worker *w)
{
    for (int m = 0; m < M_COUNT; m++)
        while (w->owed[m] > 0 && request_call(w, (enum method)m) == 0) w->owed[m]--;
}

/* gcall_gate_take's hook: the call counts as live until its record goes. */
static void count_live(void *arg)
{
    call *c = arg;
    c->counted = 1;
    atomic_fetch_add(&c->w->srv->live, 1);
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    log_thread_name("ikbo-grpc", w->index);
    for (;;) {
        const int owed = owed_total(w);
        gpr_timespec until =
            owed ? gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                gpr_time_from_millis(REREQUEST_MS, GPR_TIMESPAN))
                 : gpr_inf_future(GPR_CLOCK_REALTIME);
        grpc_event ev = grpc_completion_queue_next(w->cq, until, NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN) break;
        if (owed) rerequest(w);
        if (ev.type != GRPC_OP_COMPLETE) continue;
        const gcall_tag *t = ev.tag;
        call *c = GCALL_OWNER(t->g, call, gc);
        if (t->kind == GCALL_SEND) {
            if (c->method == M_RANK && ev.success)
                metrics_observe(w->srv->metrics->grpc_send,
                                (double)(clock_mono_ns() - c->answered_ns) * 1e-9);
            call_unref(c);
            continue;
        }
        if (t->kind == GCALL_CLOSE) {
            if (c->gc.close_cancelled || !ev.success) atomic_store(&c->gone, 1);
            call_unref(c);
            continue;
        }
        if (!ev.success) { /* the server is shutting down: no call came */
            call_free(c);
            continue;
        }
        grpcsrv *s = w->srv;
        if (!gcall_gate_take(&s->gate, &c->gc, "server is shutting down", count_live, c)) {
            call_free(c);
            continue;
        }
        c->arrived_ns = clock_mono_ns();
        if (c->method != M_HEALTH_CHECK) atomic_store(&s->last_call_ms, c->arrived_ns / 1000000);
        /* Keep accepting: the next call of this method may arrive while this
         * one waits in the batcher. */
        if (request_call(w, c->method)) w->owed[c->method]++;
        gcall_start_close(&c->gc);
        if (check_call(c)) continue;
        switch (c->method) {
        case M_RANK: handle_rank(c); break;
        case M_MODEL_INFO: handle_model_info(c); break;
        case M_HEALTH_CHECK: handle_health(c); break;
        default: handle_unknown(c); break;
        }
    }
    return NULL;
}

/* ---- lifecycle ---------------------------------------------------------- */

static char *read_file(const char *path, ikbo_err *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        bk_seterr(err, "%s: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 8192, len = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (len + 1 >= cap) {
            char *grown = realloc(buf, cap * 2);
            if (!grown) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = grown;
            cap *= 2;
        }
        size_t n = fread(buf + len, 1, cap - len - 1, f);
        len += n;
        if (n == 0) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (!buf || bad) {
        free(buf);
        bk_seterr(err, "%s: %s", path, bad ? "read error" : "out of memory");
        return NULL;
    }
    buf[len] = '\0';
    return buf;
}

static grpc_server_credentials *make_creds(const grpcsrv_opts *o, ikbo_err *err)
{
    if (!o->tls_cert_file && !o->tls_key_file) return grpc_insecure_server_credentials_create();
    if (!o->tls_cert_file || !o->tls_key_file) {
        bk_seterr(err, "tls: cert_file and key_file are both required");
        return NULL;
    }
    char *cert = read_file(o->tls_cert_file, err);
    char *key = cert ? read_file(o->tls_key_file, err) : NULL;
    char *ca = NULL;
    if (key && o->tls_client_ca_file) ca = read_file(o->tls_client_ca_file, err);
    grpc_server_credentials *creds = NULL;
    if (cert && key && (ca || !o->tls_client_ca_file)) {
        grpc_ssl_pem_key_cert_pair pair = {.private_key = key, .cert_chain = cert};
        creds = grpc_ssl_server_credentials_create_ex(
            ca, &pair, 1,
            ca ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
               : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
            NULL);
        if (!creds) bk_seterr(err, "tls: cannot create server credentials");
    }
    free(cert);
    free(key);
    free(ca);
    return creds;
}

grpcsrv *grpcsrv_start(const grpcsrv_opts *o, ikbo_err *err)
{
    grpcsrv *s = calloc(1, sizeof *s);
    if (!s) {
        bk_seterr(err, "grpc: out of memory");
        return NULL;
    }
    s->rank = o->rank;
    s->reg = o->reg;
    s->metrics = o->metrics;
    s->draining = o->draining;
    s->n_workers = o->threads > 0 ? o->threads : 1;
    s->max_metadata_bytes =
        o->max_metadata_bytes ? o->max_metadata_bytes : CONFIG_DEFAULT_MAX_METADATA_BYTES;
    if (s->max_metadata_bytes > GRPCSRV_METADATA_CEILING / 4) {
        bk_seterr(err, "grpc: max_metadata_bytes %u is over %u", s->max_metadata_bytes,
                  GRPCSRV_METADATA_CEILING / 4);
        free(s);
        return NULL;
    }
    for (int a = 0; a < GRPC_COMPRESS_ALGORITHMS_COUNT; a++) {
        const char *name = NULL;
        if (!grpc_compression_algorithm_name((grpc_compression_algorithm)a, &name)) continue;
        size_t used = strlen(s->encodings);
        snprintf(s->encodings + used, sizeof s->encodings - used, "%s%s", used ? ", " : "",
                 name);
    }
    gcall_gate_init(&s->gate);

    grpc_args ga;
    char aerr[160];
    if (grpc_args_server(&ga, o->max_message_bytes, (int)GRPCSRV_METADATA_CEILING, aerr,
                         sizeof aerr)) {
        bk_seterr(err, "grpc: %s", aerr);
        gcall_gate_destroy(&s->gate);
        free(s);
        return NULL;
    }
    s->server = grpc_server_create(&ga.ch, NULL);
    if (!s->server) {
        bk_seterr(err, "grpc: cannot create the server");
        gcall_gate_destroy(&s->gate);
        free(s);
        return NULL;
    }
    for (int m = 0; m < M_UNKNOWN; m++) {
        s->registered[m] = gcall_register(s->server, method_path[m]);
        if (!s->registered[m]) {
            bk_seterr(err, "grpc: cannot register %s", method_path[m]);
            goto fail_unstarted;
        }
    }
    s->workers = calloc((size_t)s->n_workers, sizeof *s->workers);
    if (!s->workers) {
        bk_seterr(err, "grpc: out of memory");
        goto fail_unstarted;
    }
    for (int i = 0; i < s->n_workers; i++) {
        s->workers[i].srv = s;
        s->workers[i].index = i;
        s->workers[i].cq = grpc_completion_queue_create_for_next(NULL);
        grpc_server_register_completion_queue(s->server, s->workers[i].cq, NULL);
    }
    s->shutdown_cq = grpc_completion_queue_create_for_next(NULL);

    grpc_server_credentials *creds = make_creds(o, err);
    if (!creds) goto fail_unstarted;
    s->port = grpc_server_add_http2_port(s->server, o->listen, creds);
    grpc_server_credentials_release(creds);
    if (s->port <= 0) {
        bk_seterr(err, "grpc: cannot listen on %s (address in use or invalid)", o->listen);
        goto fail_unstarted;
    }
    grpc_server_start(s->server);

    for (int i = 0; i < s->n_workers; i++)
        for (int m = 0; m < M_COUNT; m++)
            for (int k = 0; k < REQUESTS_PER_METHOD; k++)
                if (request_call(&s->workers[i], (enum method)m) != 0) {
                    bk_seterr(err, "grpc: cannot request calls");
                    goto fail_started;
                }
    for (int i = 0; i < s->n_workers; i++) {
        if (pthread_create(&s->workers[i].thread, NULL, worker_main, &s->workers[i]) != 0) {
            bk_seterr(err, "grpc: cannot start worker thread %d", i);
            goto fail_started;
        }
        s->workers[i].started = 1;
    }
    return s;

fail_started:
    grpcsrv_free(s);
    return NULL;
fail_unstarted:
    /* A server never started can be destroyed right away. */
    grpc_server_destroy(s->server);
    s->server = NULL;
    for (int i = 0; s->workers && i < s->n_workers; i++) {
        if (!s->workers[i].cq) continue;
        grpc_completion_queue_shutdown(s->workers[i].cq);
        while (grpc_completion_queue_next(s->workers[i].cq, gpr_inf_future(GPR_CLOCK_REALTIME),
                                          NULL)
                   .type != GRPC_QUEUE_SHUTDOWN) {
        }
        grpc_completion_queue_destroy(s->workers[i].cq);
    }
    if (s->shutdown_cq) grpc_completion_queue_destroy(s->shutdown_cq);
    gcall_gate_destroy(&s->gate);
    free(s->workers);
    free(s);
    return NULL;
}

int grpcsrv_port(const grpcsrv *s) { return s->port; }


/* After grpc_server_shutdown_and_notify: waits for core's shutdown tag until
 * end_ms. Core also waits for every client connection to go, and a client
 * that keeps an idle channel open holds it (~5 s, until a core timer: every
 * deploy's drain took that long). So once no call is live and
 * SHUTDOWN_SETTLE_MS have passed, the connections still open are closed
 * (grpc_server_cancel_all_calls, with no call of ours left to cancel). At
 * end_ms with calls still live they are cancelled. 0, or -1 when calls
 * were cancelled. */
static int shutdown_wait(grpcsrv *s, int64_t end_ms, int drain_timeout_ms)
{
    const int64_t settled = clock_mono_ms() + SHUTDOWN_SETTLE_MS;
    int closed = 0;
    for (;;) {
        int64_t now = clock_mono_ms(), step = end_ms - now < 20 ? end_ms - now : 20;
        gpr_timespec until = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                          gpr_time_from_millis(step > 0 ? step : 0, GPR_TIMESPAN));
        if (grpc_completion_queue_next(s->shutdown_cq, until, NULL).type != GRPC_QUEUE_TIMEOUT)
            return 0;
        int live = atomic_load(&s->live);
        if (clock_mono_ms() >= end_ms) {
            if (live)
                log_msg(LOG_LEVEL_WARN, "drain_timeout",
                        "%d calls still running after %d ms: cancelling them", live,
                        drain_timeout_ms);
            grpc_server_cancel_all_calls(s->server);
            grpc_completion_queue_next(s->shutdown_cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
            return live ? -1 : 0;
        }
        if (!live && !closed && clock_mono_ms() >= settled) {
            log_msg(LOG_LEVEL_INFO, "drain_connections",
                    "no call in flight: closing the client connections still open");
            grpc_server_cancel_all_calls(s->server);
            closed = 1;
        }
    }
}

int grpcsrv_shutdown(grpcsrv *s, int drain_timeout_ms)
{
    if (s->shutdown_started) return 0;
    s->shutdown_started = 1;
    int64_t t0 = clock_mono_ms();
    if (drain_timeout_ms < 0) drain_timeout_ms = 0;

    /* Lame duck: gRPC core cancels (CANCELLED, not UNAVAILABLE) every call
     * whose stream reaches it after grpc_server_shutdown_and_notify, and
     * there is no C API to send GOAWAY first. So while *draining is set and
     * the port still accepts, new calls are answered UNAVAILABLE by the
     * workers; once no call has arrived for LAME_DUCK_QUIET_MS (clients have
     * moved away) or half the drain budget is spent, shutdown proper starts. */
    int64_t lame_max = drain_timeout_ms / 2;
    while (clock_mono_ms() - t0 < lame_max &&
           clock_mono_ms() - atomic_load(&s->last_call_ms) < LAME_DUCK_QUIET_MS) {
        struct timespec ts = {0, 5 * 1000000};
        nanosleep(&ts, NULL);
    }

    static int shutdown_tag;
    grpc_server_shutdown_and_notify(s->server, s->shutdown_cq, &shutdown_tag);
    int result = shutdown_wait(s, t0 + drain_timeout_ms, drain_timeout_ms);
    if (result >= 0) result = (int)(clock_mono_ms() - t0);
    s->shutdown_done = 1;
    return result;
}

void grpcsrv_free(grpcsrv *s)
{
    if (!s) return;
    if (!s->shutdown_done) grpcsrv_shutdown(s, 0);
    /* Wait out handlers still running (scoring cannot be interrupted). */
    gcall_gate_stop(&s->gate);
    gcall_gate_wait_idle(&s->gate);
    grpc_server_destroy(s->server);
    for (int i = 0; i < s->n_workers; i++) grpc_completion_queue_shutdown(s->workers[i].cq);
    for (int i = 0; i < s->n_workers; i++) {
        worker *w = &s->workers[i];
        if (w->started) {
            pthread_join(w->thread, NULL);
        } else {
            /* Never ran: drain its queue here (the requested calls, each
             * completing as failed). */
            gcall_drain(w->cq, record_free);
        }
        grpc_completion_queue_destroy(w->cq);
    }
    grpc_completion_queue_shutdown(s->shutdown_cq);
    while (grpc_completion_queue_next(s->shutdown_cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL)
               .type != GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(s->shutdown_cq);
    gcall_gate_destroy(&s->gate);
    free(s->workers);
    free(s);
}
