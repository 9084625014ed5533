/* run.c - closed- and open-loop load over gRPC core (see run.h).
 *
 * Closed loop: each worker thread owns a completion queue and its share of
 * the concurrency; a finished call is recorded and its slot immediately
 * starts the next call, until the end of the run.
 *
 * Open loop: each worker has two threads on one completion queue: a sender
 * that sleeps until each intended send time of its share of the schedule
 * (clock_nanosleep, absolute, timer slack 1 us) and starts the call, and a
 * receiver that blocks on the queue and records completions the moment they
 * arrive. Neither polls, so neither steals CPU from a server on the same
 * machine, and neither delays the other's timestamps.
 */
#define _GNU_SOURCE
#include "run.h"

#include <errno.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

#include "ikbo/v1/ranker.pb-c.h"

#define RANK_METHOD "/ikbo.v1.Ranker/Rank"
#define MAX_SCHEDULE 200000000ull

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void sleep_until(int64_t t)
{
    struct timespec ts = {.tv_sec = t / 1000000000, .tv_nsec = t % 1000000000};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

static gpr_timespec in_ns(int64_t ns)
{
    if (ns < 0) ns = 0;
    return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_nanos(ns, GPR_TIMESPAN));
}

typedef struct slot {
    grpc_call *call;
    grpc_byte_buffer *send, *recv;
    grpc_metadata_array init_md, trail_md;
    grpc_status_code status;
    grpc_slice details;
    grpc_op ops[6];
    int64_t intended_ns, sent_ns;
    int body;
    int measured;
} slot;

typedef struct shared {
    const lg_run_opts *o;
    grpc_channel **ch;
    void **reg;
    grpc_slice *payload; /* one static slice per body */
    int64_t *sched;      /* open loop: intended send offsets from start, ns */
    size_t n_sched;
    int64_t start_ns, warm_ns, end_ns;
    int open;
} shared;

typedef struct worker {
    int index;
    shared *sh;
    grpc_completion_queue *cq;
    int *chans, n_chans;
    slot *slots;
    int n_slots;
    /* free slots; open loop: sender pops, receiver pushes */
    int *free_stack;
    int n_free;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_int inflight;
    atomic_int sender_done;
    uint64_t next_body, next_ch;
    lg_stats st;      /* receiver's */
    hist send_lag;    /* sender's (open loop) */
    uint64_t sent, unsent;
    pthread_t tid, tid2;
    int started, started2;
    char err[256];
} worker;

static int slot_start(worker *w, slot *s, int64_t intended, int64_t now)
{
    shared *sh = w->sh;
    const lg_run_opts *o = sh->o;
    int c = w->chans[w->next_ch++ % (uint64_t)w->n_chans];
    s->body = (int)((w->next_body) % (uint64_t)o->bodies->n);
    w->next_body += (uint64_t)o->threads;
    s->intended_ns = intended;
    s->sent_ns = now;
    int64_t t = sh->open ? intended : now;
    s->measured = t >= sh->warm_ns && t < sh->end_ns;
    s->call = grpc_channel_create_registered_call(sh->ch[c], NULL, GRPC_PROPAGATE_DEFAULTS, w->cq,
                                                  sh->reg[c], in_ns((int64_t)o->timeout_ms * 1000000),
                                                  NULL);
    if (!s->call) {
        snprintf(w->err, sizeof w->err, "cannot create a call on connection %d", c);
        return -1;
    }
    s->send = grpc_raw_byte_buffer_create(&sh->payload[s->body], 1);
    s->recv = NULL;
    s->status = GRPC_STATUS_UNKNOWN;
    s->details = grpc_empty_slice();
    grpc_metadata_array_init(&s->init_md);
    grpc_metadata_array_init(&s->trail_md);
    grpc_op *ops = s->ops;
    memset(ops, 0, sizeof s->ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = s->send;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &s->init_md;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &s->recv;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &s->trail_md;
    ops[5].data.recv_status_on_client.status = &s->status;
    ops[5].data.recv_status_on_client.status_details = &s->details;
    atomic_fetch_add(&w->inflight, 1);
    grpc_call_error e = grpc_call_start_batch(s->call, ops, 6, s, NULL);
    if (e != GRPC_CALL_OK) {
        atomic_fetch_sub(&w->inflight, 1);
        snprintf(w->err, sizeof w->err, "grpc_call_start_batch failed (%d)", (int)e);
        grpc_call_unref(s->call);
        s->call = NULL;
        grpc_byte_buffer_destroy(s->send);
        grpc_metadata_array_destroy(&s->init_md);
        grpc_metadata_array_destroy(&s->trail_md);
        return -1;
    }
    w->sent++;
    return 0;
}

/* 1 when an OK answer has the expected number of finite scores. */
static int verify(grpc_byte_buffer *bb, uint32_t expected)
{
    size_t len;
    uint8_t *data = lg_byte_buffer_read(bb, &len);
    if (!data) return 0;
    Ikbo__V1__RankResponse *r = ikbo__v1__rank_response__unpack(NULL, len, data);
    free(data);
    if (!r) return 0;
    int ok = r->n_scores == expected;
    for (size_t i = 0; ok && i < r->n_scores; i++) ok = isfinite(r->scores[i]->score);
    ikbo__v1__rank_response__free_unpacked(r, NULL);
    return ok;
}

/* Records a finished call and releases its gRPC resources. */
static void slot_finish(worker *w, slot *s, int success)
{
    int64_t now = now_ns();
    const lg_run_opts *o = w->sh->o;
    const lg_body *body = &o->bodies->b[s->body];
    int code = success ? (int)s->status : GRPC_STATUS_UNKNOWN;
    if (code < 0 || code >= LG_N_CODES) code = GRPC_STATUS_UNKNOWN;
    int bad = code == GRPC_STATUS_OK && o->verify && !verify(s->recv, body->n_expected_scores);
    lg_stats *st = &w->st;
    st->codes_all[code]++;
    st->invalid_all += (uint64_t)bad;
    if (s->measured) {
        int64_t lat = now - (w->sh->open ? s->intended_ns : s->sent_ns);
        if (lat < 0) lat = 0;
        st->codes[code]++;
        st->measured++;
        hist_add(&st->lat_all, (uint64_t)lat);
        if (code == GRPC_STATUS_OK && !bad) {
            hist_add(&st->lat_ok, (uint64_t)lat);
            st->ok_candidates += body->n_cands;
            st->ok_bytes_sent += (double)body->len;
        }
        st->invalid += (uint64_t)bad;
    }
    if (!st->first_error[0] && (code != GRPC_STATUS_OK || bad)) {
        if (bad) {
            snprintf(st->first_error, sizeof st->first_error,
                     "OK answer failed verification: expected %u finite scores", body->n_expected_scores);
        } else {
            char *d = grpc_slice_to_c_string(s->details);
            snprintf(st->first_error, sizeof st->first_error, "%s: %s", lg_code_name(code), d ? d : "");
            gpr_free(d);
        }
    }
    grpc_slice_unref(s->details);
    grpc_byte_buffer_destroy(s->send);
    if (s->recv) grpc_byte_buffer_destroy(s->recv);
    grpc_metadata_array_destroy(&s->init_md);
    grpc_metadata_array_destroy(&s->trail_md);
    grpc_call_unref(s->call);
    s->call = NULL;
    atomic_fetch_sub(&w->inflight, 1);
}

/* ---- closed loop ---------------------------------------------------------- */

static void *closed_main(void *arg)
{
    worker *w = arg;
    shared *sh = w->sh;
    sleep_until(sh->start_ns);
    for (int i = 0; i < w->n_slots; i++) {
        int64_t t = now_ns();
        if (slot_start(w, &w->slots[i], t, t)) break;
    }
    while (atomic_load(&w->inflight) > 0) {
        grpc_event ev = grpc_completion_queue_next(w->cq, in_ns(250000000), NULL);
        if (ev.type == GRPC_QUEUE_TIMEOUT) continue;
        if (ev.type != GRPC_OP_COMPLETE) break;
        slot *s = ev.tag;
        slot_finish(w, s, ev.success);
        int64_t t = now_ns();
        if (t < sh->end_ns && !w->err[0]) slot_start(w, s, t, t);
    }
    return NULL;
}

/* ---- open loop ------------------------------------------------------------ */

static void *open_recv_main(void *arg)
{
    worker *w = arg;
    for (;;) {
        if (atomic_load(&w->sender_done) && atomic_load(&w->inflight) == 0) break;
        grpc_event ev = grpc_completion_queue_next(w->cq, in_ns(100000000), NULL);
        if (ev.type == GRPC_QUEUE_TIMEOUT) continue;
        if (ev.type != GRPC_OP_COMPLETE) break;
        slot *s = ev.tag;
        slot_finish(w, s, ev.success);
        pthread_mutex_lock(&w->mu);
        w->free_stack[w->n_free++] = (int)(s - w->slots);
        pthread_cond_signal(&w->cv);
        pthread_mutex_unlock(&w->mu);
    }
    return NULL;
}

static void *open_send_main(void *arg)
{
    worker *w = arg;
    shared *sh = w->sh;
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    int64_t give_up = sh->end_ns + (int64_t)sh->o->timeout_ms * 1000000;
    size_t T = (size_t)sh->o->threads;
    for (size_t i = (size_t)w->index; i < sh->n_sched; i += T) {
        int64_t due = sh->start_ns + sh->sched[i];
        sleep_until(due);
        pthread_mutex_lock(&w->mu);
        while (w->n_free == 0 && now_ns() < give_up) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts); /* condvar default clock */
            ts.tv_nsec += 20000000;
            if (ts.tv_nsec >= 1000000000) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000;
            }
            pthread_cond_timedwait(&w->cv, &w->mu, &ts);
        }
        int idx = w->n_free ? w->free_stack[--w->n_free] : -1;
        pthread_mutex_unlock(&w->mu);
        if (idx < 0) { /* a timeout past the schedule's end: stop */
            for (size_t k = i; k < sh->n_sched; k += T) w->unsent++;
            break;
        }
        int64_t t = now_ns();
        if (slot_start(w, &w->slots[idx], due, t)) break;
        if (t - due >= 0 && due >= sh->warm_ns && due < sh->end_ns)
            hist_add(&w->send_lag, (uint64_t)(t - due));
    }
    atomic_store(&w->sender_done, 1);
    return NULL;
}

/* ---- setup ---------------------------------------------------------------- */

static int64_t *make_schedule(const lg_run_opts *o, size_t *n)
{
    double total_s = o->warmup_s + o->duration_s;
    double count = floor(o->rate * total_s);
    if (count < 1) count = 1;
    if (count > (double)MAX_SCHEDULE) return NULL;
    *n = (size_t)count;
    int64_t *s = malloc(*n * sizeof *s);
    if (!s) return NULL;
    lg_rng r;
    lg_rng_seed(&r, o->seed ^ 0xa5a5a5a5ull);
    double t = 0;
    for (size_t i = 0; i < *n; i++) {
        if (o->poisson) {
            t += -log(1.0 - lg_rng_unit(&r)) / o->rate;
            s[i] = (int64_t)(t * 1e9);
        } else {
            s[i] = (int64_t)((double)i / o->rate * 1e9);
        }
    }
    return s;
}

static int seterr(char *buf, size_t n, const char *msg, const char *detail)
{
    snprintf(buf, n, "%s%s%s", msg, detail ? ": " : "", detail ? detail : "");
    return -1;
}

/* Channels to the target, each READY (or an error in errbuf). */
static int connect_all(shared *sh, char *errbuf, size_t n)
{
    const lg_run_opts *o = sh->o;
    for (int c = 0; c < o->connections; c++) {
        sh->ch[c] = lg_channel_new(o->target, c);
        if (!sh->ch[c]) return seterr(errbuf, n, "cannot create a channel to", o->target);
        sh->reg[c] = grpc_channel_register_call(sh->ch[c], RANK_METHOD, NULL, NULL);
    }
    for (int c = 0; c < o->connections; c++)
        if (lg_channel_wait_ready(sh->ch[c], 5000)) {
            char d[300];
            snprintf(d, sizeof d, "%s (connection %d not READY after 5 s)", o->target, c);
            return seterr(errbuf, n, "cannot connect to", d);
        }
    return 0;
}

/* Worker t's queue, connections and call slots; -1 out of memory. */
static int worker_init(worker *w, shared *sh, int t)
{
    const lg_run_opts *o = sh->o;
    const int T = o->threads, C = o->connections;
    w->index = t;
    w->sh = sh;
    hist_init(&w->st.lat_ok);
    hist_init(&w->st.lat_all);
    hist_init(&w->send_lag);
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    w->cq = grpc_completion_queue_create_for_next(NULL);
    /* connections: worker t takes c = t, t+T, ...; or shares c = t % C */
    w->chans = calloc((size_t)(C / T + 1), sizeof *w->chans);
    int total = sh->open ? o->max_inflight : o->concurrency;
    w->n_slots = total / T + (t < total % T);
    w->slots = calloc((size_t)(w->n_slots ? w->n_slots : 1), sizeof *w->slots);
    w->free_stack = calloc((size_t)(w->n_slots ? w->n_slots : 1), sizeof *w->free_stack);
    if (!w->cq || !w->chans || !w->slots || !w->free_stack) return -1;
    if (C >= T)
        for (int c = t; c < C; c += T) w->chans[w->n_chans++] = c;
    else
        w->chans[w->n_chans++] = t % C;
    for (int i = 0; i < w->n_slots; i++) w->free_stack[w->n_free++] = w->n_slots - 1 - i;
    w->next_body = (uint64_t)t;
    return 0;
}

/* Starts every worker's thread(s) on one tick and waits for them all. */
static void run_workers(shared *sh, worker *ws)
{
    const lg_run_opts *o = sh->o;
    const int T = o->threads;
    sh->start_ns = now_ns() + 20000000; /* every worker starts on the same tick */
    sh->warm_ns = sh->start_ns + (int64_t)(o->warmup_s * 1e9);
    sh->end_ns = sh->warm_ns + (int64_t)(o->duration_s * 1e9);
    for (int t = 0; t < T; t++) {
        worker *w = &ws[t];
        if (sh->open) {
            if (pthread_create(&w->tid, NULL, open_recv_main, w)) break;
            w->started = 1;
            if (pthread_create(&w->tid2, NULL, open_send_main, w)) {
                atomic_store(&w->sender_done, 1);
                break;
            }
            w->started2 = 1;
        } else {
            if (pthread_create(&w->tid, NULL, closed_main, w)) break;
            w->started = 1;
        }
    }
    for (int t = 0; t < T; t++) {
        if (ws[t].started2) pthread_join(ws[t].tid2, NULL);
        if (ws[t].started) pthread_join(ws[t].tid, NULL);
    }
}

/* Adds worker w's counts and histograms to out. */
static void merge_stats(lg_stats *out, const worker *w)
{
    const lg_stats *s = &w->st;
    out->sent += w->sent;
    out->unsent += w->unsent;
    for (int c = 0; c < LG_N_CODES; c++) {
        out->codes_all[c] += s->codes_all[c];
        out->codes[c] += s->codes[c];
    }
    out->measured += s->measured;
    out->invalid += s->invalid;
    out->invalid_all += s->invalid_all;
    out->ok_candidates += s->ok_candidates;
    out->ok_bytes_sent += s->ok_bytes_sent;
    hist_merge(&out->lat_ok, &s->lat_ok);
    hist_merge(&out->lat_all, &s->lat_all);
    hist_merge(&out->send_lag, &w->send_lag);
    if (!out->first_error[0] && s->first_error[0])
        memcpy(out->first_error, s->first_error, sizeof out->first_error);
}

/* Frees what worker_init made (after its threads ended, or never started). */
static void worker_free(worker *w)
{
    if (w->cq) {
        grpc_completion_queue_shutdown(w->cq);
        while (grpc_completion_queue_next(w->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type !=
               GRPC_QUEUE_SHUTDOWN) {
        }
        grpc_completion_queue_destroy(w->cq);
    }
    if (w->sh) { /* worker_init ran */
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cv);
    }
    free(w->chans);
    free(w->slots);
    free(w->free_stack);
}

int lg_run(const lg_run_opts *o, lg_stats *out, char *errbuf, size_t n)
{
    memset(out, 0, sizeof *out);
    hist_init(&out->lat_ok);
    hist_init(&out->lat_all);
    hist_init(&out->send_lag);
    shared sh;
    memset(&sh, 0, sizeof sh);
    sh.o = o;
    sh.open = o->rate > 0;
    int T = o->threads, C = o->connections, rc = -1;
    worker *ws = calloc((size_t)T, sizeof *ws);
    sh.ch = calloc((size_t)C, sizeof *sh.ch);
    sh.reg = calloc((size_t)C, sizeof *sh.reg);
    sh.payload = calloc((size_t)o->bodies->n, sizeof *sh.payload);
    if (!ws || !sh.ch || !sh.reg || !sh.payload) {
        seterr(errbuf, n, "out of memory", NULL);
        goto done;
    }
    for (int i = 0; i < o->bodies->n; i++)
        sh.payload[i] = grpc_slice_from_static_buffer(o->bodies->b[i].data, o->bodies->b[i].len);
    if (sh.open && !(sh.sched = make_schedule(o, &sh.n_sched))) {
        seterr(errbuf, n, "cannot allocate the send schedule (rate x time too large)", NULL);
        goto done;
    }
    out->scheduled = sh.n_sched;
    if (connect_all(&sh, errbuf, n)) goto done;
    for (int t = 0; t < T; t++)
        if (worker_init(&ws[t], &sh, t)) {
            seterr(errbuf, n, "out of memory", NULL);
            goto done;
        }
    run_workers(&sh, ws);
    out->elapsed_s = (double)(now_ns() - sh.start_ns) / 1e9;
    out->duration_s = o->duration_s;
    rc = 0;
    for (int t = 0; t < T; t++) {
        worker *w = &ws[t];
        if (!w->started || (sh.open && !w->started2))
            rc = seterr(errbuf, n, "cannot start worker threads", NULL);
        if (w->err[0] && rc == 0) rc = seterr(errbuf, n, w->err, NULL);
        merge_stats(out, w);
    }
done:
    for (int t = 0; ws && t < T; t++) worker_free(&ws[t]);
    for (int c = 0; sh.ch && c < C; c++)
        if (sh.ch[c]) grpc_channel_destroy(sh.ch[c]);
    free(sh.ch);
    free(sh.reg);
    free(sh.payload);
    free(sh.sched);
    free(ws);
    return rc;
}
