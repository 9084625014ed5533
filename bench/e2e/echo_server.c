/* echo_server.c - the transport floor for bench/e2e: a gRPC server that
 * answers /ikbo.v1.Ranker/Rank without doing any of ikbo-serve's work.
 *
 * Why this exists: issue 18 measures ikbo-serve's request path as a ratio,
 * (client latency - forward time) / echo latency, where the echo latency is
 * what the same client, the same request bytes and the same gRPC core setup
 * cost when the server does nothing but receive and answer. This program is
 * that "nothing": it reads each Rank request whole
 * (grpc_byte_buffer_reader_readall, as ikbo-serve's workers do) and drops it
 * undecoded, then answers a RankResponse packed once at start, with --cands
 * scores of --tasks task scores each, ids, indices and scores filled as
 * ikbo-serve fills them, so the answer has the same size as ours within a
 * few bytes and ikbo-loadgen accepts it (one finite score per candidate).
 *
 * The server setup is ikbo-serve's (server/grpc_server.c), and each call
 * goes through the same code (server/grpc_call.h): one grpc_server,
 * --threads workers, each with its own completion queue on which it requests
 * calls of the registered methods with the payload read up front; a close op
 * (GRPC_OP_RECV_CLOSE_ON_SERVER) started when each call arrives; one send
 * batch (initial metadata, message, status); the same channel arguments
 * (max receive message size, unlimited send, the same metadata ceiling).
 * What it leaves out is the server's own work: no decode, no validation, no
 * batcher hand-off (the worker that took the call answers it; with
 * --send-from thread, one sender thread answers every call instead, as
 * ikbo-serve's batcher threads do, to measure what sending from a thread
 * that does not poll costs; with --answer-after-us N the sender answers
 * each call N us after a worker took it, a stand-in for a forward pass of
 * that length that keeps as many calls in flight as ikbo-serve does at the
 * same rate, so the transport's share can be compared at equal
 * concurrency). Only Rank
 * and ModelInfo are registered (no health, no generic call for other
 * methods: a call to one waits for its deadline).
 *
 * ModelInfo: ikbo-loadgen asks for the model's inputs before it builds its
 * requests, so the echo is given a serialized ModelInfoResponse, from a file
 * (--model-info) or asked once at start from the ikbo-serve being
 * benchmarked (--model-info-from, what bench/e2e/run.sh does; the call is
 * tools/loadgen/client.c's), answers it verbatim to ModelInfo, and takes the
 * response's model name, version and task names from it.
 *
 * ids: ikbo-loadgen gives candidate i of request r the id r * 10^7 + i, and
 * sends its --distinct requests round-robin; the server echoes the ids. The
 * echo packs --distinct responses, response r with ids r * 10^7 + i, and
 * answers them round-robin, so the mean answer size equals ours exactly.
 *
 * Errors are returned up to main, which prints one line and exits 2.
 * `echo_server --help` lists the flags; README.md ("Benchmarks") too.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/time.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ikbo/v1/ranker.pb-c.h"
#include "tools/loadgen/client.h" /* lg_unary: --model-info-from */
#include "server/grpc_args.h"
#include "server/grpc_call.h"
#include "server/clock.h"
#include "server/grpc_server.h" /* GRPCSRV_METADATA_CEILING, RQ_DEFAULT_MAX_MESSAGE_BYTES */

/* The id stride of ikbo-loadgen's requests (tools/loadgen/shape.c). */
#define LOADGEN_ID_STRIDE 10000000

enum method { M_RANK = 0, M_MODEL_INFO = 1, M_COUNT = 2 };
static const char *const method_path[M_COUNT] = {"/ikbo.v1.Ranker/Rank",
                                                 "/ikbo.v1.Ranker/ModelInfo"};

typedef struct echo_opts {
    const char *listen, *model_info, *model_info_from, *model;
    int threads;
    long cands, tasks, users, distinct;
    long max_message_bytes;
    int send_thread; /* --send-from thread (or --answer-after-us) */
    long answer_after_us; /* --answer-after-us */
} echo_opts;

typedef struct echo_server echo_server;

typedef struct worker {
    echo_server *srv;
    grpc_completion_queue *cq;
    pthread_t thread;
    int started;
} worker;

struct echo_server {
    grpc_server *server;
    int started; /* grpc_server_start done: shut down before destroying */
    void *registered[M_COUNT];
    worker *workers;
    int n_workers;
    /* The answers, packed at start: Rank's --distinct responses (round-robin
     * through next_rank) and ModelInfo's bytes. Read-only once serving. */
    grpc_slice *rank_resp;
    long n_rank_resp;
    size_t n_tasks; /* task scores per score */
    atomic_long next_rank;
    grpc_slice info_resp;
    /* Shutdown: once the gate is stopped, no worker requests another call
     * (that is done under the gate's lock, in gcall_gate_take) or takes one
     * on, so none can publish on a completion queue being shut down (gRPC
     * core aborts on that: seen in CI when a worker started a call's batches
     * after its queue was shut down). Its busy count is of calls taken on
     * whose answer has not been started; echo_free waits for it to reach
     * zero before it shuts the queues down, as ikbo-serve's grpcsrv_free
     * does (server/grpc_call.h). */
    gcall_gate gate;
    /* --send-from thread: calls taken by the workers wait in a stack for the
     * sender, which polls it (a spinning thread: a hand-off of about a
     * microsecond, so the measurement is the send, not a wake-up). Pushes
     * and the sender's last drain hold send_lock, so a call pushed after
     * that drain (send_closed) is answered by its worker instead. */
    _Atomic(struct call *) send_head;
    pthread_mutex_t send_lock;
    int send_closed;
    atomic_int send_stop;
    int64_t answer_after_ns; /* --answer-after-us, in ns */
    pthread_t sender;
    int sender_started;
};

/* One call, from request to both the close op and the send batch done. */
typedef struct call {
    /* The core call, its tags, refs (the close op and the send batch),
     * request and answer: ikbo-serve's (server/grpc_call.h). */
    gcall gc;
    worker *w;
    enum method method;
    struct call *send_next; /* in echo_server.send_head's stack, then the sender's queue */
    int64_t taken_ns; /* when its worker took it (clock_mono_ns) */
} call;

/* ---- errors -------------------------------------------------------------- */

typedef struct echo_err {
    char msg[512];
} echo_err;

static int fail(echo_err *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(echo_err *e, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return -1;
}

/* ---- the pre-built answers ---------------------------------------------- */

static int read_file(const char *path, uint8_t **data, size_t *len, echo_err *e)
{
    FILE *f = fopen(path, "rb");
    if (!f) return fail(e, "%s: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    uint8_t *buf = malloc(cap);
    for (;;) {
        if (!buf) break;
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break;
        uint8_t *grown = realloc(buf, cap * 2);
        if (!grown) free(buf);
        buf = grown;
        cap *= 2;
    }
    int bad = ferror(f);
    fclose(f);
    if (!buf || bad) {
        free(buf);
        return fail(e, "%s: %s", path, bad ? "read error" : "out of memory");
    }
    *data = buf;
    *len = n;
    return 0;
}

/* ModelInfo (for --model, or every model) from the server at target. */
static int fetch_model_info(const char *target, const char *model, uint8_t **data, size_t *len,
                            echo_err *e)
{
    Ikbo__V1__ModelInfoRequest rq = IKBO__V1__MODEL_INFO_REQUEST__INIT;
    rq.model = (char *)(model ? model : "");
    uint8_t req[512];
    if (ikbo__v1__model_info_request__get_packed_size(&rq) > sizeof req)
        return fail(e, "--model: name too long");
    size_t req_len = ikbo__v1__model_info_request__pack(&rq, req);
    grpc_channel *ch = lg_channel_new(target, -1);
    if (!ch) return fail(e, "--model-info-from %s: cannot create a channel", target);
    int code = 0;
    char *details = NULL;
    int rc = lg_unary(ch, "/ikbo.v1.Ranker/ModelInfo", req, req_len, 10000, &code, &details, data,
                      len);
    grpc_channel_destroy(ch);
    if (rc) rc = fail(e, "--model-info-from %s: cannot start a call", target);
    else if (code != GRPC_STATUS_OK)
        rc = fail(e, "--model-info-from %s: ModelInfo failed: %s: %s", target, lg_code_name(code),
                  details ? details : "");
    else if (!*data)
        rc = fail(e, "--model-info-from %s: out of memory", target);
    free(details);
    return rc;
}

/* Where the model description came from, for errors. */
static const char *model_info_name(const echo_opts *o)
{
    return o->model_info ? o->model_info : o->model_info_from;
}

/* The model the answers name: --model, or the description's only model. */
static const Ikbo__V1__ModelDescription *pick_model(const Ikbo__V1__ModelInfoResponse *mi,
                                                    const echo_opts *o, echo_err *e)
{
    for (size_t i = 0; i < mi->n_models; i++)
        if (o->model ? !strcmp(mi->models[i]->name, o->model) : mi->n_models == 1)
            return mi->models[i];
    if (o->model)
        fail(e, "%s: no model '%s' (it describes %zu model(s))", model_info_name(o), o->model,
             mi->n_models);
    else
        fail(e, "%s: describes %zu models: give --model NAME", model_info_name(o), mi->n_models);
    return NULL;
}

/* The version ikbo-serve answers with when model_version is 0: the newest
 * READY one. */
static int64_t ready_version(const Ikbo__V1__ModelDescription *d)
{
    int64_t v = 0;
    for (size_t i = 0; i < d->n_versions; i++)
        if (!strcmp(d->versions[i]->state, "READY") && d->versions[i]->version > v)
            v = d->versions[i]->version;
    return v;
}

/* Packs response r (ids r * LOADGEN_ID_STRIDE + i) into a new slice. Every
 * score and task score is a non-zero float, as a sigmoid is: proto3 would
 * leave a zero out and the answer would be smaller than ours. */
static int pack_rank(Ikbo__V1__RankResponse *resp, Ikbo__V1__Score *scores, long r,
                     grpc_slice *out)
{
    for (size_t i = 0; i < resp->n_scores; i++)
        scores[i].id = (int64_t)r * LOADGEN_ID_STRIDE + (int64_t)i;
    size_t n = ikbo__v1__rank_response__get_packed_size(resp);
    *out = grpc_slice_malloc(n);
    return ikbo__v1__rank_response__pack(resp, GRPC_SLICE_START_PTR(*out)) == n ? 0 : -1;
}

/* Fills s->rank_resp from the model description and the flags. */
static int build_rank_answers(echo_server *s, const Ikbo__V1__ModelDescription *d,
                              const echo_opts *o, echo_err *e)
{
    size_t C = (size_t)o->cands, T = o->tasks >= 0 ? (size_t)o->tasks : d->n_tasks;
    Ikbo__V1__RankResponse resp = IKBO__V1__RANK_RESPONSE__INIT;
    Ikbo__V1__Score *scores = calloc(C ? C : 1, sizeof *scores);
    Ikbo__V1__Score **ptrs = calloc(C ? C : 1, sizeof *ptrs);
    float *task_scores = calloc(T ? T : 1, sizeof *task_scores);
    char **tasks = calloc(T ? T : 1, sizeof *tasks);
    char(*names)[32] = calloc(T ? T : 1, sizeof *names);
    s->rank_resp = calloc((size_t)o->distinct, sizeof *s->rank_resp);
    int rc = 0;
    if (!scores || !ptrs || !task_scores || !tasks || !names || !s->rank_resp) {
        rc = fail(e, "out of memory building %zu scores", C);
        goto out;
    }
    for (size_t t = 0; t < T; t++) {
        snprintf(names[t], sizeof names[t], "task%zu", t);
        tasks[t] = t < d->n_tasks ? d->tasks[t] : names[t];
        task_scores[t] = 0.25f + 0.5f * (float)(t + 1) / (float)(T + 1);
    }
    for (size_t i = 0; i < C; i++) {
        ikbo__v1__score__init(&scores[i]);
        scores[i].index = (uint32_t)i;
        scores[i].score = 0.5f;
        scores[i].n_task_scores = T;
        scores[i].task_scores = task_scores;
        ptrs[i] = &scores[i];
    }
    resp.model = d->name;
    resp.model_version = ready_version(d);
    resp.n_tasks = T;
    resp.tasks = tasks;
    resp.n_scores = C;
    resp.scores = ptrs;
    resp.unique_users = (uint32_t)o->users;
    s->n_tasks = T;
    for (long r = 0; r < o->distinct; r++) {
        if (pack_rank(&resp, scores, r, &s->rank_resp[r])) {
            rc = fail(e, "cannot pack response %ld", r);
            goto out;
        }
        s->n_rank_resp = r + 1;
    }
out:
    free(scores);
    free(ptrs);
    free(task_scores);
    free(tasks);
    free(names);
    return rc;
}

/* Reads --model-info (or asks --model-info-from) and packs every answer. */
static int build_answers(echo_server *s, const echo_opts *o, echo_err *e)
{
    uint8_t *bytes = NULL;
    size_t len = 0;
    if (o->model_info ? read_file(o->model_info, &bytes, &len, e)
                      : fetch_model_info(o->model_info_from, o->model, &bytes, &len, e))
        return -1;
    Ikbo__V1__ModelInfoResponse *mi = ikbo__v1__model_info_response__unpack(NULL, len, bytes);
    int rc = -1;
    if (!mi) {
        fail(e, "%s: not a serialized ikbo.v1.ModelInfoResponse", model_info_name(o));
    } else {
        const Ikbo__V1__ModelDescription *d = pick_model(mi, o, e);
        if (d && build_rank_answers(s, d, o, e) == 0) {
            s->info_resp = grpc_slice_from_copied_buffer((const char *)bytes, len);
            rc = 0;
        }
        ikbo__v1__model_info_response__free_unpacked(mi, NULL);
    }
    free(bytes);
    return rc;
}

/* ---- calls -------------------------------------------------------------- */

static void call_free(call *c)
{
    gcall_destroy(&c->gc);
    free(c);
}

/* gcall_drain's free_record. */
static void record_free(gcall *g) { call_free(GCALL_OWNER(g, call, gc)); }

static int request_call(worker *w, enum method m)
{
    call *c = calloc(1, sizeof *c);
    if (!c) return -1;
    gcall_init(&c->gc);
    c->w = w;
    c->method = m;
    if (gcall_request(&c->gc, w->srv->server, w->srv->registered[m], w->cq) != GRPC_CALL_OK) {
        call_free(c);
        return -1;
    }
    return 0;
}

static void call_unref(call *c)
{
    if (gcall_unref(&c->gc)) call_free(c);
}

/* Reads the request whole, as ikbo-serve does before it decodes, and drops
 * it; returns the pre-built answer for the call's method. */
static grpc_slice answer_for(call *c)
{
    echo_server *s = c->w->srv;
    if (c->gc.payload) {
        grpc_byte_buffer_reader rd;
        if (grpc_byte_buffer_reader_init(&rd, c->gc.payload)) {
            grpc_slice all = grpc_byte_buffer_reader_readall(&rd);
            grpc_byte_buffer_reader_destroy(&rd);
            grpc_slice_unref(all);
        }
    }
    if (c->method == M_MODEL_INFO) return s->info_resp;
    long r = atomic_fetch_add_explicit(&s->next_rank, 1, memory_order_relaxed);
    return s->rank_resp[r % s->n_rank_resp];
}

/* Initial metadata, the answer and OK in one batch, as ikbo-serve sends;
 * the call is then no longer busy. */
static void answer(call *c)
{
    echo_server *s = c->w->srv; /* c may be freed once its batch is started */
    grpc_slice body = answer_for(c);
    c->gc.response = grpc_raw_byte_buffer_create(&body, 1); /* a ref, not a copy */
    if (gcall_send(&c->gc, GRPC_STATUS_OK, NULL) != GRPC_CALL_OK) call_unref(c);
    gcall_gate_leave(&s->gate);
}

/* --send-from thread: hands the call to the sender, or answers it here once
 * the sender has stopped. */
static void send_push(echo_server *s, call *c)
{
    pthread_mutex_lock(&s->send_lock);
    int closed = s->send_closed;
    if (!closed) {
        c->send_next = atomic_load(&s->send_head);
        while (!atomic_compare_exchange_weak(&s->send_head, &c->send_next, c)) {
        }
    }
    pthread_mutex_unlock(&s->send_lock);
    if (closed) answer(c);
}

/* The sender's queue: calls in arrival order, each answered once its
 * answer_after_ns has passed since it was taken. */
typedef struct send_queue {
    call *head, *tail;
} send_queue;

/* Appends a taken stack (newest first) to q in arrival order. */
static void queue_stack(send_queue *q, call *l)
{
    call *fifo = NULL, *last = l;
    while (l) {
        call *n = l->send_next;
        l->send_next = fifo;
        fifo = l;
        l = n;
    }
    if (!fifo) return;
    if (q->tail) q->tail->send_next = fifo;
    else q->head = fifo;
    q->tail = last;
    last->send_next = NULL;
}

/* Answers the calls at q's head that were taken at least delay_ns before
 * now; returns how many. */
static int answer_due(send_queue *q, int64_t delay_ns, int64_t now)
{
    int n = 0;
    while (q->head && q->head->taken_ns + delay_ns <= now) {
        call *c = q->head;
        q->head = c->send_next;
        if (!q->head) q->tail = NULL;
        answer(c);
        n++;
    }
    return n;
}

static void *sender_main(void *arg)
{
    echo_server *s = arg;
    send_queue q = {0};
    while (!atomic_load_explicit(&s->send_stop, memory_order_relaxed)) {
        queue_stack(&q, atomic_exchange(&s->send_head, NULL));
        if (!answer_due(&q, s->answer_after_ns, clock_mono_ns())) __builtin_ia32_pause();
    }
    pthread_mutex_lock(&s->send_lock);
    s->send_closed = 1;
    pthread_mutex_unlock(&s->send_lock);
    queue_stack(&q, atomic_exchange(&s->send_head, NULL));
    answer_due(&q, 0, INT64_MAX); /* stopping: every call left, at once */
    return NULL;
}

/* gcall_gate_take's hook: keep accepting (until shutdown). A failed
 * re-request (out of memory) leaves this worker one slot short; the other
 * slots serve. */
static void rerequest(void *arg)
{
    call *c = arg;
    request_call(c->w, c->method);
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    for (;;) {
        grpc_event ev =
            grpc_completion_queue_next(w->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN) break;
        if (ev.type != GRPC_OP_COMPLETE) continue;
        const gcall_tag *t = ev.tag;
        call *c = GCALL_OWNER(t->g, call, gc);
        if (t->kind != GCALL_REQUEST) {
            call_unref(c);
            continue;
        }
        if (!ev.success) { /* shutting down: no call came */
            call_free(c);
            continue;
        }
        if (!gcall_gate_take(&w->srv->gate, &c->gc, "echo server is stopping", rerequest, c)) {
            call_free(c);
            continue;
        }
        gcall_start_close(&c->gc);
        c->taken_ns = clock_mono_ns();
        if (w->srv->sender_started) send_push(w->srv, c);
        else answer(c);
    }
    return NULL;
}

/* ---- lifecycle ---------------------------------------------------------- */

/* Shutdown order: no new call requests; the server's shutdown (calls
 * cancelled, pending requests failed onto the workers' queues); then each
 * worker's queue is shut down and drained by its worker; then the server
 * is destroyed, when nothing can reach it any more. */
static void echo_free(echo_server *s)
{
    gcall_gate_stop(&s->gate);
    if (s->started) { /* workers still run: they free the calls cancelled here */
        grpc_completion_queue *scq = grpc_completion_queue_create_for_next(NULL);
        static int shutdown_tag;
        grpc_server_shutdown_and_notify(s->server, scq, &shutdown_tag);
        grpc_server_cancel_all_calls(s->server);
        grpc_completion_queue_next(scq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        grpc_completion_queue_shutdown(scq);
        while (grpc_completion_queue_next(scq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
               GRPC_QUEUE_SHUTDOWN) {
        }
        grpc_completion_queue_destroy(scq);
    }
    if (s->sender_started) { /* its last sends complete on the workers' live queues */
        atomic_store(&s->send_stop, 1);
        pthread_join(s->sender, NULL);
    }
    gcall_gate_wait_idle(&s->gate); /* calls a worker took on get their answer started */
    for (int i = 0; s->workers && i < s->n_workers; i++) {
        worker *w = &s->workers[i];
        if (!w->cq) continue;
        grpc_completion_queue_shutdown(w->cq);
        if (w->started) {
            pthread_join(w->thread, NULL);
        } else { /* never ran: its requested calls complete as failed here */
            gcall_drain(w->cq, record_free);
        }
        grpc_completion_queue_destroy(w->cq);
    }
    if (s->server) grpc_server_destroy(s->server);
    gcall_gate_destroy(&s->gate);
    pthread_mutex_destroy(&s->send_lock);
    for (long r = 0; r < s->n_rank_resp; r++) grpc_slice_unref(s->rank_resp[r]);
    free(s->rank_resp);
    grpc_slice_unref(s->info_resp);
    free(s->workers);
}

/* ikbo-serve's channel arguments (server/grpc_args.h), IKBO_GRPC_ARGS included. */
static grpc_server *server_new(const echo_opts *o, echo_err *e)
{
    grpc_args ga;
    char err[160];
    if (grpc_args_server(&ga, (uint32_t)o->max_message_bytes, (int)GRPCSRV_METADATA_CEILING, err,
                         sizeof err)) {
        fail(e, "%s", err);
        return NULL;
    }
    grpc_server *g = grpc_server_create(&ga.ch, NULL);
    if (!g) fail(e, "cannot create the gRPC server");
    return g;
}

/* Binds o->listen and starts the workers; *port gets the bound port. */
static int echo_start(echo_server *s, const echo_opts *o, int *port, echo_err *e)
{
    s->server = server_new(o, e);
    if (!s->server) return -1;
    for (int m = 0; m < M_COUNT; m++) {
        s->registered[m] = gcall_register(s->server, method_path[m]);
        if (!s->registered[m]) return fail(e, "cannot register %s", method_path[m]);
    }
    s->n_workers = o->threads;
    s->workers = calloc((size_t)s->n_workers, sizeof *s->workers);
    if (!s->workers) return fail(e, "out of memory");
    for (int i = 0; i < s->n_workers; i++) {
        s->workers[i].srv = s;
        s->workers[i].cq = grpc_completion_queue_create_for_next(NULL);
        grpc_server_register_completion_queue(s->server, s->workers[i].cq, NULL);
    }
    grpc_server_credentials *creds = grpc_insecure_server_credentials_create();
    *port = grpc_server_add_http2_port(s->server, o->listen, creds);
    grpc_server_credentials_release(creds);
    if (*port <= 0) return fail(e, "cannot listen on %s (address in use or invalid)", o->listen);
    s->answer_after_ns = o->answer_after_us * 1000;
    if (o->send_thread) {
        if (pthread_create(&s->sender, NULL, sender_main, s))
            return fail(e, "cannot start the sender thread");
        s->sender_started = 1;
    }
    grpc_server_start(s->server);
    s->started = 1;
    for (int i = 0; i < s->n_workers; i++)
        for (int m = 0; m < M_COUNT; m++)
            if (request_call(&s->workers[i], (enum method)m))
                return fail(e, "cannot request calls");
    for (int i = 0; i < s->n_workers; i++) {
        if (pthread_create(&s->workers[i].thread, NULL, worker_main, &s->workers[i]))
            return fail(e, "cannot start worker thread %d", i);
        s->workers[i].started = 1;
    }
    return 0;
}

/* ---- flags -------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f,
"usage: echo_server (--model-info FILE | --model-info-from ADDR) --cands N [flags]\n"
"The transport floor for bench/e2e: serves /ikbo.v1.Ranker/Rank on gRPC core with\n"
"ikbo-serve's server setup, reads each request whole without decoding it, and\n"
"answers a RankResponse packed once at start, the size of ikbo-serve's for the\n"
"same request. ModelInfo is answered with the model description it was given.\n"
"\n"
"  --listen ADDR        host:port to serve on; port 0 picks a free one (default 127.0.0.1:0)\n"
"  --threads N          gRPC worker threads, each with a completion queue, 1..1024\n"
"                       (default 2, as ikbo-serve's --threads)\n"
"  --model-info FILE    a serialized ikbo.v1.ModelInfoResponse: answered to ModelInfo\n"
"                       verbatim; gives the response's model name, version and tasks\n"
"  --model-info-from ADDR  the same, asked once at start from the ikbo-serve at\n"
"                       host:port (ModelInfo for --model); one of the two is required\n"
"  --model NAME         the model described to answer for (default: the only one)\n"
"  --cands N            scores per response: the candidates per request (required)\n"
"  --tasks T            task scores per score (default: the model's task count)\n"
"  --users N            RankResponse.unique_users (default 1)\n"
"  --distinct N         responses packed, answered round-robin; response r has ids\n"
"                       r * 10^7 + i as ikbo-loadgen's request r (default 64)\n"
"  --max-message-bytes N  largest request accepted (default %u, as ikbo-serve's\n"
"                       limits.max_message_bytes)\n"
"  --send-from W        who sends each answer: worker (the gRPC worker that took the\n"
"                       call, default) or thread (one spinning sender thread, as\n"
"                       ikbo-serve's batcher threads send theirs)\n"
"  --answer-after-us N  the sender thread (implied) answers each call N us after a\n"
"                       worker took it, 0..10000000: a stand-in forward pass of N us,\n"
"                       so as many calls are in flight as ikbo-serve has (default 0)\n"
"  --help               this text\n"
"\n"
"Prints one line 'echo_server: listening grpc=HOST:PORT ...' on stderr once it\n"
"serves; SIGTERM or SIGINT stop it (exit 0). Exit 2 on a bad flag or setup error.\n",
            (unsigned)RQ_DEFAULT_MAX_MESSAGE_BYTES);
}

static int parse_long(const char *flag, const char *v, long min, long max, long *out,
                      echo_err *e)
{
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (!*v || *end || errno || x < min || x > max)
        return fail(e, "%s: expected an integer %ld..%ld, got '%s'", flag, min, max, v);
    *out = x;
    return 0;
}

/* Returns 0, 1 for --help, -1 with *e on a bad command line. */
static int parse_args(echo_opts *o, int argc, char **argv, echo_err *e)
{
    *o = (echo_opts){.listen = "127.0.0.1:0", .threads = 2, .cands = -1, .tasks = -1,
                     .users = 1, .distinct = 64,
                     .max_message_bytes = (long)RQ_DEFAULT_MAX_MESSAGE_BYTES};
    int worker_asked = 0; /* --send-from worker given */
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) return 1;
        if (i + 1 >= argc) return fail(e, "%s: unknown flag or missing value (see --help)", f);
        const char *v = argv[++i];
        long x = 0;
        int rc = 0;
        if (!strcmp(f, "--listen")) o->listen = v;
        else if (!strcmp(f, "--model-info")) o->model_info = v;
        else if (!strcmp(f, "--model-info-from")) o->model_info_from = v;
        else if (!strcmp(f, "--model")) o->model = v;
        else if (!strcmp(f, "--threads")) rc = parse_long(f, v, 1, 1024, &x, e), o->threads = (int)x;
        else if (!strcmp(f, "--cands")) rc = parse_long(f, v, 0, 10000000, &o->cands, e);
        else if (!strcmp(f, "--tasks")) rc = parse_long(f, v, 0, 1024, &o->tasks, e);
        else if (!strcmp(f, "--users")) rc = parse_long(f, v, 0, UINT32_MAX, &o->users, e);
        else if (!strcmp(f, "--distinct")) rc = parse_long(f, v, 1, 100000, &o->distinct, e);
        else if (!strcmp(f, "--send-from")) {
            if (strcmp(v, "worker") && strcmp(v, "thread"))
                return fail(e, "--send-from: expected worker or thread, got '%s'", v);
            o->send_thread = !strcmp(v, "thread");
            worker_asked = !o->send_thread;
        } else if (!strcmp(f, "--answer-after-us")) {
            rc = parse_long(f, v, 0, 10000000, &o->answer_after_us, e);
        } else if (!strcmp(f, "--max-message-bytes"))
            rc = parse_long(f, v, 1, INT32_MAX, &o->max_message_bytes, e);
        else return fail(e, "unknown flag '%s' (see --help)", f);
        if (rc) return -1;
    }
    if (o->answer_after_us > 0) {
        if (worker_asked)
            return fail(e, "--answer-after-us: answers wait in the sender thread, not with "
                           "--send-from worker");
        o->send_thread = 1;
    }
    if (!o->model_info == !o->model_info_from)
        return fail(e, "give one of --model-info FILE and --model-info-from ADDR (see --help)");
    if (o->cands < 0) return fail(e, "--cands N is required (see --help)");
    return 0;
}

/* "host:0" with the bound port: "host:PORT". */
static void bound_address(const char *listen, int port, char *out, size_t n)
{
    const char *colon = strrchr(listen, ':');
    int host_len = colon ? (int)(colon - listen) : (int)strlen(listen);
    snprintf(out, n, "%.*s:%d", host_len, listen, port);
}

int main(int argc, char **argv)
{
    echo_opts o;
    echo_err e = {{0}};
    int pr = parse_args(&o, argc, argv, &e);
    if (pr == 1) {
        usage(stdout);
        return 0;
    }
    if (pr) {
        fprintf(stderr, "echo_server: error: %s\n", e.msg);
        return 2;
    }
    /* Signals are taken by sigwait below, in no other thread. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);

    grpc_init();
    echo_server s;
    memset(&s, 0, sizeof s);
    gcall_gate_init(&s.gate);
    pthread_mutex_init(&s.send_lock, NULL);
    int port = 0, rc = build_answers(&s, &o, &e);
    if (rc == 0) rc = echo_start(&s, &o, &port, &e);
    if (rc == 0) {
        char addr[300];
        bound_address(o.listen, port, addr, sizeof addr);
        fprintf(stderr,
                "echo_server: listening grpc=%s threads=%d cands=%ld tasks=%zu distinct=%ld "
                "response_bytes=%zu\n",
                addr, o.threads, o.cands, s.n_tasks, o.distinct,
                GRPC_SLICE_LENGTH(s.rank_resp[0]));
        int sig;
        while (sigwait(&sigs, &sig) != 0) {
        }
    } else {
        fprintf(stderr, "echo_server: error: %s\n", e.msg);
    }
    echo_free(&s);
    grpc_shutdown();
    return rc ? 2 : 0;
}
