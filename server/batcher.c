/* batcher.c - dynamic batching per model version (see batcher.h).
 *
 * Data: a request admitted by batcher_submit becomes a `breq` (it owns the
 * request's score arrays) and one or more `bseg` (the whole plan, or chunks
 * of it) appended to the FIFO queue. A free instance pops segments into a
 * `bbatch`, merges them into one ikbo_batch (its own copies of the inputs;
 * none when the batch is one whole request) and computes it, scatters each
 * segment's scores into its request's arrays, and the request completes
 * when its last segment is done or dropped.
 *
 * Locking: one mutex per batcher guards the queue, the idle stack, the
 * counters and each breq's bookkeeping (segs_left, failure status, timing).
 * Merging and computing run outside it. Callbacks run outside it.
 */
#include "batcher.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "log.h"
#include "rowset.h"

/* ---- records ------------------------------------------------------------ */

enum reject_reason { RJ_QUEUE_FULL = 0, RJ_DEADLINE, RJ_CANCELLED, RJ_ERROR, RJ_COUNT };
static const char *const REJECT_NAME[RJ_COUNT] = {"queue_full", "deadline", "cancelled", "error"};

typedef struct breq {
    batcher_request r;
    int C, U;
    float *scores, *task_scores;
    int64_t enq_ns, start_ns;
    double compute_s;
    int batches;
    uint64_t last_batch; /* id of the last batch that added to compute_s */
    int segs_left;       /* segments not yet computed or dropped */
    int waiting_segs;    /* segments not computing yet (queued or in a ready batch) */
    int failed;          /* st holds why; the rest of its segments are dropped */
    int reason;          /* enum reject_reason when failed */
    rq_status st;
    struct breq *next_done; /* completion list */
} breq;

typedef struct bseg {
    breq *q;
    int r0, r1;       /* plan rows [r0, r1) */
    int c0, c1;       /* plan batch candidates [c0, c1) (rows r0..r1-1, maybe part of one) */
    struct bseg *next;
} bseg;

typedef struct bbatch {
    uint64_t id;
    bseg **segs;
    int n_segs;
    int n_requests; /* distinct requests */
    ikbo_batch batch;
    int32_t *pos;   /* merged position of segment i's k-th candidate: pos[off[i] + k] */
    int *off;
    float *scores, *task_scores;
    rs_batch rb;    /* merged inputs; empty when the batch is one whole request's plan */
} bbatch;

typedef struct instance {
    struct batcher *b;
    int index;
    pthread_t thread;
    int started;
    ikbo_ctx *ctx;
    pthread_cond_t cv;          /* this instance alone, while idle: work, stop */
    struct instance *next_idle; /* the idle stack */
    /* On the idle stack. Written under the lock; read without it (atomic)
     * by the instance while it polls (idle_spin_us). */
    unsigned idle;
    /* clock_mono_ns() when its current batch began computing (context,
     * ikbo_score), 0 otherwise; written by the instance, read by
     * batcher_busy_ms on any thread (atomic). */
    int64_t busy_since;
} instance;

struct batcher {
    pthread_mutex_t mu;
    bseg *head, *tail;
    long long q_cands, q_rows; /* in the FIFO: what the next batch is formed from */
    /* Admission: requests admitted and not computing yet (reserved, or
     * queued in the FIFO) and their candidates. */
    long long w_requests, w_cands;
    /* Instances waiting for work, the most recently idle first. The first
     * (the leader) is the one a submit wakes; it watches the FIFO's delay
     * and deadlines while it waits. */
    instance *idle_head;
    int active; /* batches popped and not finished (merging, computing, answering) */
    int stopping;
    uint64_t next_batch_id;

    config_batching lim;
    batcher_model model;
    char *label;
    int n_tasks;
    batcher_hooks hooks;
    instance *inst;
    int n_inst;
    /* The sweeper: answers queued requests whose deadline passes while no
     * instance is idle to watch them. sweep_at: when it wakes next (0: only
     * when signalled). */
    pthread_cond_t cv_sweep;
    int64_t sweep_at;
    pthread_t sweeper;
    int sweeper_started;
    /* Completion: requests whose callbacks an instance hands off (work is
     * waiting for it) wait here for a completer thread, which runs them
     * (response build, protobuf pack, send). */
    pthread_cond_t cv_done;
    breq *done_head, *done_tail;
    pthread_t *completer;
    int n_completers, completers_started, completers_stop;
    /* idle_spin_us: hand-offs so far (bumped under the lock, read without
     * it by the one completer polling, `completer_polls`). */
    unsigned done_seq;
    int completer_polls;

    /* metrics series (NULL without metrics) */
    metrics_series *m_queue_s, *m_req_compute_s, *m_batch_compute_s, *m_batch_requests,
        *m_batch_users, *m_batch_cands, *m_batch_ratio, *m_q_requests, *m_q_cands,
        *m_bytes_avoided, *m_nonfinite, *m_rejected[RJ_COUNT], *m_graphs[IKBO_GRAPH_USES];
};

static void m_add(metrics_series *s, double v)
{
    if (s) metrics_add(s, v);
}
static void m_obs(metrics_series *s, double v)
{
    if (s) metrics_observe(s, v);
}

/* ---- limits ------------------------------------------------------------- */

void batcher_resolve(const ikbo_serving *server, const ikbo_serving *sv, const char *device,
                     ikbo_serving *out)
{
    *out = *server;
    if (sv) serving_merge(out, sv);
    int ordinal = -1;
    const int gpu = bk_parse_device(device, &ordinal) == 0 && ordinal >= 0;
    if (out->instances <= 0)
        out->instances = gpu ? CONFIG_BATCH_AUTO_INSTANCES_GPU : CONFIG_BATCH_AUTO_INSTANCES_CPU;
    if (out->max_batch_candidates <= 0)
        out->max_batch_candidates = gpu ? CONFIG_BATCH_AUTO_CANDIDATES_GPU
                                        : CONFIG_BATCH_AUTO_CANDIDATES_CPU;
    if (out->max_batch_users <= 0)
        out->max_batch_users = gpu ? CONFIG_BATCH_AUTO_USERS_GPU : CONFIG_BATCH_AUTO_USERS_CPU;
    if (out->instances > CONFIG_BATCH_MAX_INSTANCES) out->instances = CONFIG_BATCH_MAX_INSTANCES;
    if (out->max_queue_delay_us < 0) out->max_queue_delay_us = 0;
    if (out->max_queue_candidates < 1) out->max_queue_candidates = 1;
    if (out->max_queue_requests < 1) out->max_queue_requests = 1;
}

void batcher_get_limits(const batcher *b, config_batching *out) { *out = b->lim; }

long long batcher_busy_ms(const batcher *b)
{
    int64_t now = clock_mono_ns(), oldest = 0;
    for (int i = 0; i < b->n_inst; i++) {
        int64_t t = __atomic_load_n(&b->inst[i].busy_since, __ATOMIC_ACQUIRE);
        if (t && (!oldest || t < oldest)) oldest = t;
    }
    return oldest && now > oldest ? (long long)((now - oldest) / 1000000) : 0;
}

/* ---- completing requests ------------------------------------------------ */

static void breq_free(breq *q)
{
    free(q->scores);
    free(q->task_scores);
    free(q);
}

/* Runs the callback (no lock held) and frees the request. instance: the
 * instance whose thread this is, -1 for a completer or the sweeper. */
static void breq_complete(batcher *b, breq *q, int instance)
{
    batcher_result res;
    memset(&res, 0, sizeof res);
    res.batches = q->batches;
    res.compute_seconds = q->compute_s;
    if (q->failed) {
        res.st = q->st;
        res.queue_seconds = (double)(clock_mono_ns() - q->enq_ns) * 1e-9;
        m_add(b->m_rejected[q->reason], 1);
    } else {
        rq_status_ok(&res.st);
        res.scores = q->scores;
        res.task_scores = q->task_scores;
        res.queue_seconds = (double)(q->start_ns - q->enq_ns) * 1e-9;
        m_obs(b->m_queue_s, res.queue_seconds);
        m_obs(b->m_req_compute_s, res.compute_seconds);
    }
    if (b->hooks.before_callback) b->hooks.before_callback(b->hooks.arg, instance);
    q->r.done(q->r.arg, &res);
    breq_free(q);
}

/* A segment leaves the FIFO (popped into a batch or dropped). Locked. */
static void unqueue_seg(batcher *b, const bseg *s)
{
    b->q_cands -= s->c1 - s->c0;
    b->q_rows -= s->r1 - s->r0;
}

/* A segment stops waiting (its batch starts computing, or it is dropped).
 * Locked. */
static void unwait_seg(batcher *b, const bseg *s)
{
    long long c = s->c1 - s->c0;
    b->w_cands -= c;
    m_add(b->m_q_cands, -(double)c);
    if (--s->q->waiting_segs == 0) {
        b->w_requests--;
        m_add(b->m_q_requests, -1);
    }
}

static void fail_req(breq *q, int reason, int code, const char *msg)
{
    if (q->failed) return;
    q->failed = 1;
    q->reason = reason;
    q->st.code = code;
    snprintf(q->st.msg, sizeof q->st.msg, "%s", msg);
}

/* Drops queued segments of failed, cancelled or expired requests; requests
 * with nothing left go on *done. Returns the earliest deadline still queued
 * (0 = none). Locked. */
static int64_t sweep(batcher *b, int64_t now, breq **done)
{
    int64_t earliest = 0;
    bseg **pp = &b->head, *prev = NULL;
    while (*pp) {
        bseg *s = *pp;
        breq *q = s->q;
        if (!q->failed) {
            char msg[200];
            /* Deadline first: gRPC core also cancels a call whose deadline
             * passed, and that is a deadline, not a client gone. */
            if (q->r.deadline_ns && now >= q->r.deadline_ns) {
                snprintf(msg, sizeof msg,
                         "deadline exceeded after %.1f ms in the batch queue (%d candidates not "
                         "scored)",
                         (double)(now - q->enq_ns) * 1e-6, q->C);
                fail_req(q, RJ_DEADLINE, RQ_DEADLINE_EXCEEDED, msg);
            } else if (q->r.cancelled && atomic_load(q->r.cancelled)) {
                fail_req(q, RJ_CANCELLED, RQ_CANCELLED,
                         "cancelled: the client went away while the request was queued");
            }
        }
        if (q->failed) {
            *pp = s->next;
            if (b->tail == s) b->tail = prev;
            unqueue_seg(b, s);
            unwait_seg(b, s);
            if (--q->segs_left == 0) {
                q->next_done = *done;
                *done = q;
            }
            free(s);
            continue;
        }
        if (q->r.deadline_ns && (!earliest || q->r.deadline_ns < earliest))
            earliest = q->r.deadline_ns;
        prev = s;
        pp = &s->next;
    }
    return earliest;
}

/* ---- merging ------------------------------------------------------------ */

static void bbatch_free(bbatch *bt)
{
    if (!bt) return;
    for (int i = 0; i < bt->n_segs; i++) free(bt->segs[i]);
    free(bt->segs);
    free(bt->pos);
    free(bt->off);
    free(bt->scores);
    free(bt->task_scores);
    rs_batch_free(&bt->rb);
    free(bt);
}


/* Builds bt->batch from its segments: their plans' rows deduplicated again
 * across requests and their candidates grouped by merged row, stable
 * (segment order, then candidate order), by rowset.h. Returns 0, or -1 with
 * *st set. */
static int merge(batcher *b, bbatch *bt, rq_status *st)
{
    rs_dims d;
    rs_dims_of(&d, b->model.mi);
    const size_t nus = (size_t)d.n_user_sparse, ncs = (size_t)d.n_cand_sparse;
    const int T = b->n_tasks;
    int C = 0, R = 0;
    bt->off = malloc(((size_t)bt->n_segs + 1) * sizeof *bt->off);
    if (!bt->off) goto nomem;
    for (int i = 0; i < bt->n_segs; i++) {
        bt->off[i] = C;
        C += bt->segs[i]->c1 - bt->segs[i]->c0;
        R += bt->segs[i]->r1 - bt->segs[i]->r0;
    }
    bt->off[bt->n_segs] = C;
    bt->pos = malloc((size_t)C * sizeof *bt->pos);
    bt->scores = malloc((size_t)C * sizeof *bt->scores);
    bt->task_scores = malloc((size_t)C * (size_t)(T > 0 ? T : 1) * sizeof *bt->task_scores);
    if (!bt->pos || !bt->scores || !bt->task_scores) goto nomem;

    const bseg *s0 = bt->segs[0];
    if (bt->n_segs == 1 && s0->r0 == 0 && s0->r1 == s0->q->U && s0->c0 == 0 &&
        s0->c1 == s0->q->C) {
        /* One whole request: its plan is already the batch. */
        bt->batch = s0->q->r.plan->batch;
        for (int i = 0; i < C; i++) bt->pos[i] = i;
        return 0;
    }

    rs_row *rows = malloc(((size_t)R + (size_t)C) * sizeof *rows), *cands = rows + R;
    rs_span *spans = malloc(((size_t)R * nus + (size_t)C * ncs + 1) * sizeof *spans);
    int32_t *ix = malloc(((size_t)R + 3 * (size_t)C) * sizeof *ix);
    rs_table *t = rs_table_new((size_t)R, &d, 0);
    if (!rows || !spans || !ix || !t) goto nomem_rows;
    int32_t *rowmap = ix, *cand_row = ix + R, *order = cand_row + C, *map = order + C;
    int k = 0, kc = 0;
    for (int i = 0; i < bt->n_segs; i++) {
        const bseg *s = bt->segs[i];
        const rq_plan *p = s->q->r.plan;
        const int k0 = k;
        for (int r = s->r0; r < s->r1; r++, k++) {
            rs_batch_user(&p->batch, &d, (size_t)r, p->row_key[r], &rows[k],
                          spans + (size_t)k * nus);
            rowmap[k] = rs_table_add(t, &rows[k]);
        }
        for (int c = s->c0; c < s->c1; c++, kc++) {
            rs_batch_cand(&p->batch, &d, (size_t)c, &cands[kc],
                          spans + (size_t)R * nus + (size_t)kc * ncs);
            cand_row[kc] = rowmap[k0 + p->batch.map[c] - s->r0];
        }
    }
    const size_t U = rs_table_count(t);
    if (rs_group(cand_row, (size_t)C, U, order, map) ||
        rs_assemble(&bt->rb, &d, rs_table_rows(t), U, cands, order, (size_t)C, map))
        goto nomem_rows;
    bt->batch = bt->rb.b;
    for (int p = 0; p < C; p++) bt->pos[order[p]] = p; /* source index = off[i] + (c - c0) */
    free(rows);
    free(spans);
    free(ix);
    rs_table_free(t);
    return 0;

nomem_rows:
    free(rows);
    free(spans);
    free(ix);
    rs_table_free(t);
nomem:
    return rq_status_set(st, RQ_INTERNAL, "batcher: out of memory merging %d requests",
                         bt->n_requests);
}

/* ---- forming batches ----------------------------------------------------- */

/* Pops the head segments that fit one batch (at least one). Locked. */
static bbatch *pop_batch(batcher *b)
{
    bbatch *bt = calloc(1, sizeof *bt);
    if (!bt) return NULL;
    long long cands = 0, rows = 0;
    int n = 0, cap = 0;
    const breq *last = NULL;
    while (b->head) {
        bseg *s = b->head;
        long long c = s->c1 - s->c0, r = s->r1 - s->r0;
        if (n > 0 && (cands + c > b->lim.max_batch_candidates ||
                      rows + r > b->lim.max_batch_users))
            break;
        if (n == cap) {
            cap = cap ? 2 * cap : 8;
            bseg **g = realloc(bt->segs, (size_t)cap * sizeof *g);
            if (!g) break;
            bt->segs = g;
        }
        b->head = s->next;
        if (!b->head) b->tail = NULL;
        s->next = NULL;
        unqueue_seg(b, s);
        bt->segs[n++] = s;
        if (s->q != last) bt->n_requests++;
        last = s->q;
        cands += c;
        rows += r;
    }
    bt->n_segs = n;
    if (!n) {
        free(bt->segs);
        free(bt);
        return NULL;
    }
    bt->id = ++b->next_batch_id;
    return bt;
}

/* Wakes the idle leader and takes it off the idle stack, so that the next
 * wake reaches the next idle instance. 0 when no instance is idle. Locked. */
static int wake_leader(batcher *b)
{
    instance *in = b->idle_head;
    if (!in) return 0;
    b->idle_head = in->next_idle;
    in->next_idle = NULL;
    __atomic_store_n(&in->idle, 0, __ATOMIC_RELEASE);
    pthread_cond_signal(&in->cv);
    return 1;
}

/* A request with this deadline (0: none) is queued and no instance is idle
 * to watch it: the sweeper must wake by then. Locked. */
static void watch_deadline(batcher *b, int64_t deadline_ns)
{
    if (!deadline_ns || (b->sweep_at && b->sweep_at <= deadline_ns)) return;
    b->sweep_at = deadline_ns;
    pthread_cond_signal(&b->cv_sweep);
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Polls *word without the lock until it differs from `was` or until_ns
 * (CLOCK_MONOTONIC) passes: a thread that would sleep on a condition
 * variable stays on its core for idle_spin_us first, so the next piece of
 * work starts without a wake-up (tens of microseconds on a host whose idle
 * cores sleep). Unlocks b->mu for the poll, relocks it after. 1 if *word
 * changed. */
static int poll_word(batcher *b, const unsigned *word, unsigned was, int64_t until_ns)
{
    pthread_mutex_unlock(&b->mu);
    int changed = 0, n = 0;
    for (;;) {
        if (__atomic_load_n(word, __ATOMIC_ACQUIRE) != was) {
            changed = 1;
            break;
        }
        if ((++n & 63) == 0 && clock_mono_ns() >= until_ns) break;
        cpu_relax();
    }
    pthread_mutex_lock(&b->mu);
    return changed;
}

/* The end of a poll of idle_spin_us from now, or until_ns if earlier (0:
 * none). */
static int64_t poll_end(const batcher *b, int64_t until_ns)
{
    const int64_t end = clock_mono_ns() + b->lim.idle_spin_us * 1000;
    return until_ns && until_ns < end ? until_ns : end;
}

/* Waits on the idle stack until woken or until_ns (0: no limit), polling
 * first for idle_spin_us. Locked. */
static void idle_wait(batcher *b, instance *in, int64_t until_ns)
{
    in->next_idle = b->idle_head;
    b->idle_head = in;
    __atomic_store_n(&in->idle, 1, __ATOMIC_RELAXED);
    /* Each instance polls once per time it goes idle; a submit wakes the
     * newest (the leader), so older pollers only run out their time. */
    const int polled = b->lim.idle_spin_us > 0 && !b->stopping &&
                       poll_word(b, &in->idle, 1, poll_end(b, until_ns));
    if (!polled && in->idle && (!until_ns || clock_mono_ns() < until_ns))
        clock_cond_wait_until(&in->cv, &b->mu, until_ns);
    if (in->idle) { /* timed out (or a spurious wake-up): still on the stack */
        for (instance **pp = &b->idle_head; *pp; pp = &(*pp)->next_idle)
            if (*pp == in) {
                *pp = in->next_idle;
                break;
            }
        __atomic_store_n(&in->idle, 0, __ATOMIC_RELAXED);
    }
    in->next_idle = NULL;
}

/* ---- answering ------------------------------------------------------------ */

/* The rule of batcher.h: work waits for the instance that finished requests
 * when the FIFO holds a request and no other instance is idle to take it.
 * Then a completer answers them; else the instance does. Locked. */
static int work_waits(const batcher *b) { return b->head && !b->idle_head && b->n_completers > 0; }

/* Appends finished requests (in order) to the completers' list. Locked. */
static void hand_off(batcher *b, breq *list)
{
    int n = 0;
    while (list) {
        breq *q = list;
        list = q->next_done;
        q->next_done = NULL;
        if (b->done_tail)
            b->done_tail->next_done = q;
        else
            b->done_head = q;
        b->done_tail = q;
        n++;
    }
    __atomic_store_n(&b->done_seq, b->done_seq + 1, __ATOMIC_RELEASE);
    /* Several: wake every completer, they take one at a time. */
    if (n > 1)
        pthread_cond_broadcast(&b->cv_done);
    else if (n == 1)
        pthread_cond_signal(&b->cv_done);
}

/* Answers requests on this thread, in order. An instance (instance >= 0)
 * hands what is left to the completers as soon as work waits for it. No
 * lock held. */
static void complete_here(batcher *b, breq *list, int instance)
{
    while (list) {
        breq *q = list;
        list = q->next_done;
        breq_complete(b, q, instance);
        if (!list || instance < 0) continue;
        pthread_mutex_lock(&b->mu);
        if (work_waits(b)) {
            hand_off(b, list);
            list = NULL;
        }
        pthread_mutex_unlock(&b->mu);
    }
}

/* Answers requests an instance found finished (scored, failed or dropped):
 * by the completers when work waits, else here. Locked on entry and exit;
 * the lock is released while callbacks run. */
static void answer(batcher *b, breq *list, int instance)
{
    if (!list) return;
    if (work_waits(b)) {
        hand_off(b, list);
        return;
    }
    pthread_mutex_unlock(&b->mu);
    complete_here(b, list, instance);
    pthread_mutex_lock(&b->mu);
}

/* Accounts a finished batch to its requests (or fails them when it could
 * not be built or scored) and answers those with nothing left. Takes the
 * lock. */
static void finish_segments(batcher *b, bbatch *bt, const rq_status *st, int64_t t0, double dt,
                            int instance)
{
    breq *done = NULL, **tail = &done;
    pthread_mutex_lock(&b->mu);
    for (int i = 0; i < bt->n_segs; i++) {
        breq *q = bt->segs[i]->q;
        if (st->code != RQ_OK) {
            fail_req(q, RJ_ERROR, st->code, st->msg);
        } else {
            if (q->last_batch != bt->id) {
                q->compute_s += dt;
                q->batches++;
                q->last_batch = bt->id;
            }
            if (t0 > q->start_ns) q->start_ns = t0;
        }
        if (--q->segs_left == 0) {
            q->next_done = NULL;
            *tail = q;
            tail = &q->next_done;
        }
    }
    answer(b, done, instance);
    pthread_mutex_unlock(&b->mu);
}

/* ---- instances ------------------------------------------------------------ */

/* A failed ikbo_score: INTERNAL for this batch alone, or UNAVAILABLE (a
 * client retries elsewhere) when the device is lost, which is reported. */
static void score_failed(batcher *b, instance *in, const ikbo_err *err, rq_status *st)
{
    ikbo_err why;
    memset(&why, 0, sizeof why);
    if (!ikbo_ctx_device_lost(in->ctx, &why)) {
        rq_status_set(st, RQ_INTERNAL, "model '%s': scoring failed: %s", b->label, err->msg);
        return;
    }
    rq_status_set(st, RQ_UNAVAILABLE, "model '%s': scoring failed: %s; the server is stopping",
                  b->label, why.msg);
    if (b->model.device_lost) b->model.device_lost(b->model.lost_arg, b->label, why.msg, 0);
}

static void run_batch(batcher *b, instance *in, bbatch *bt)
{
    ikbo_err err;
    memset(&err, 0, sizeof err);
    rq_status st;
    rq_status_ok(&st);
    __atomic_store_n(&in->busy_since, clock_mono_ns(), __ATOMIC_RELEASE);
    if (!in->ctx) { /* the registry's; how it waits for the GPU is this batcher's setting */
        ikbo_ctx *c = b->model.ctx(b->model.ctx_arg, in->index, &err);
        if (c && ikbo_ctx_set_gpu_spin(c, b->lim.gpu_spin_us, &err) == 0)
            in->ctx = c;
        else
            rq_status_set(&st, RQ_INTERNAL, "model '%s': no execution context: %s", b->label,
                          err.msg);
    }
    if (b->hooks.before_compute) b->hooks.before_compute(b->hooks.arg, in->index, bt->n_requests);
    int64_t t0 = clock_mono_ns(), t1 = t0;
    if (st.code == RQ_OK) {
        if (ikbo_score(in->ctx, &bt->batch, bt->task_scores, bt->scores, &err) != 0)
            score_failed(b, in, &err, &st);
        t1 = clock_mono_ns();
    }
    __atomic_store_n(&in->busy_since, 0, __ATOMIC_RELEASE);
    double dt = (double)(t1 - t0) * 1e-9;
    if (st.code == RQ_OK) {
        const int U = bt->batch.n_users, C = bt->batch.n_cands, T = b->n_tasks;
        m_obs(b->m_batch_compute_s, dt);
        m_obs(b->m_batch_requests, bt->n_requests);
        m_obs(b->m_batch_users, U);
        m_obs(b->m_batch_cands, C);
        m_obs(b->m_batch_ratio, (double)C / (double)U);
        m_add(b->m_bytes_avoided, (double)ikbo_ctx_last_avoided_bytes(in->ctx));
        m_add(b->m_graphs[ikbo_ctx_last_graph(in->ctx)], 1);
        /* Scatter: segments own disjoint ranges of their requests' arrays. */
        long nonfinite = 0;
        for (int i = 0; i < bt->n_segs; i++) {
            const bseg *s = bt->segs[i];
            breq *q = s->q;
            const int32_t *pos = bt->pos + bt->off[i];
            for (int k = 0; k < s->c1 - s->c0; k++) {
                q->scores[s->c0 + k] = bt->scores[pos[k]];
                nonfinite += !isfinite(bt->scores[pos[k]]);
                if (T > 0)
                    memcpy(q->task_scores + (size_t)(s->c0 + k) * (size_t)T,
                           bt->task_scores + (size_t)pos[k] * (size_t)T, (size_t)T * sizeof(float));
            }
        }
        if (nonfinite) m_add(b->m_nonfinite, (double)nonfinite);
    }
    finish_segments(b, bt, &st, t0, dt, in->index);
}

/* The next batch of a free instance, by the rules of batcher.h: drops what
 * expired or was cancelled, then pops the head segments once they fill a
 * batch, the oldest has waited max_queue_delay_us, or the batcher stops;
 * until then waits on the idle stack. NULL: stop. Locked. */
static bbatch *next_batch(batcher *b, instance *in)
{
    for (;;) {
        int64_t now = clock_mono_ns();
        breq *dropped = NULL;
        int64_t earliest = b->head ? sweep(b, now, &dropped) : 0;
        if (dropped) {
            answer(b, dropped, in->index);
            continue;
        }
        if (!b->head) {
            if (b->stopping) return NULL;
            idle_wait(b, in, 0);
            continue;
        }
        const int full = b->q_cands >= b->lim.max_batch_candidates ||
                         b->q_rows >= b->lim.max_batch_users;
        const int64_t due = b->head->q->enq_ns + b->lim.max_queue_delay_us * 1000;
        if (!full && now < due && !b->stopping) {
            idle_wait(b, in, earliest && earliest < due ? earliest : due);
            continue;
        }
        bbatch *bt = pop_batch(b);
        if (!bt) { /* out of memory: let the others drain, retry */
            clock_cond_wait_until(&in->cv, &b->mu, clock_mono_ns() + 1000000);
            continue;
        }
        for (int i = 0; i < bt->n_segs; i++) unwait_seg(b, bt->segs[i]);
        b->active++;
        /* What is left is the next idle instance's, or the sweeper's to watch. */
        if (b->head && !wake_leader(b)) watch_deadline(b, earliest);
        return bt;
    }
}

static void *instance_main(void *arg)
{
    instance *in = arg;
    batcher *b = in->b;
    log_thread_name("ikbo-inst", in->index);
    pthread_mutex_lock(&b->mu);
    bbatch *bt;
    while ((bt = next_batch(b, in))) {
        pthread_mutex_unlock(&b->mu);
        rq_status st;
        rq_status_ok(&st);
        if (merge(b, bt, &st) == 0)
            run_batch(b, in, bt);
        else
            finish_segments(b, bt, &st, 0, 0, in->index);
        bbatch_free(bt);
        pthread_mutex_lock(&b->mu);
        b->active--;
    }
    pthread_mutex_unlock(&b->mu);
    return NULL;
}

/* ---- sweeper and completers ------------------------------------------------ */

/* Answers queued requests whose deadline passes, or whose client went away,
 * while no instance is idle to watch the FIFO (an instance also sweeps it
 * before every batch it forms). */
static void *sweeper_main(void *arg)
{
    batcher *b = arg;
    log_thread_name("ikbo-sweep", -1);
    pthread_mutex_lock(&b->mu);
    while (!b->stopping) {
        breq *dropped = NULL;
        int64_t earliest = b->head ? sweep(b, clock_mono_ns(), &dropped) : 0;
        if (dropped) {
            pthread_mutex_unlock(&b->mu);
            complete_here(b, dropped, -1);
            pthread_mutex_lock(&b->mu);
            continue;
        }
        b->sweep_at = earliest;
        clock_cond_wait_until(&b->cv_sweep, &b->mu, earliest);
    }
    pthread_mutex_unlock(&b->mu);
    return NULL;
}

/* Runs the callbacks the instances handed off, in order. Exits once told to
 * stop and the list is empty: no request is left behind. */
static void *completer_main(void *arg)
{
    batcher *b = arg;
    pthread_mutex_lock(&b->mu);
    int index = b->completers_started++;
    pthread_mutex_unlock(&b->mu);
    log_thread_name("ikbo-done", index);
    pthread_mutex_lock(&b->mu);
    for (;;) {
        /* One completer at a time polls for the next hand-off. */
        if (!b->done_head && !b->completers_stop && b->lim.idle_spin_us > 0 &&
            !b->completer_polls) {
            b->completer_polls = 1;
            poll_word(b, &b->done_seq, b->done_seq, poll_end(b, 0));
            b->completer_polls = 0;
        }
        while (!b->done_head && !b->completers_stop) pthread_cond_wait(&b->cv_done, &b->mu);
        breq *q = b->done_head;
        if (!q) break;
        b->done_head = q->next_done;
        if (!b->done_head) b->done_tail = NULL;
        pthread_mutex_unlock(&b->mu);
        breq_complete(b, q, -1);
        pthread_mutex_lock(&b->mu);
    }
    pthread_mutex_unlock(&b->mu);
    return NULL;
}

/* ---- submit ------------------------------------------------------------- */

static bseg *seg_new(breq *q, int r0, int r1, int c0, int c1)
{
    bseg *s = calloc(1, sizeof *s);
    if (s) {
        s->q = q;
        s->r0 = r0;
        s->r1 = r1;
        s->c0 = c0;
        s->c1 = c1;
    }
    return s;
}

/* The request as segments: whole, or chunks at row boundaries (a row with
 * more than max_c candidates is cut into pieces of max_c). NULL on OOM. */
static bseg *make_segments(breq *q, long long max_c, long long max_u, int *n_out)
{
    const ikbo_batch *B = &q->r.plan->batch;
    const int U = B->n_users, C = B->n_cands;
    *n_out = 0;
    if (C <= max_c && U <= max_u) {
        *n_out = 1;
        return seg_new(q, 0, U, 0, C);
    }
    int *rs = calloc((size_t)U + 1, sizeof *rs); /* row r's candidates: [rs[r], rs[r+1]) */
    if (!rs) return NULL;
    for (int c = 0; c < C; c++) rs[B->map[c] + 1]++;
    for (int r = 0; r < U; r++) rs[r + 1] += rs[r];
    bseg *first = NULL, *last = NULL;
    int r = 0, c = 0, n = 0;
    while (c < C) {
        int r0 = r, c0 = c, split = 0;
        long long rows = 0, cands = 0;
        while (r < U) {
            long long avail = rs[r + 1] - c;
            if (rows == 0 && avail > max_c) {
                c += (int)max_c;
                split = 1;
                break;
            }
            if (rows + 1 > max_u || cands + avail > max_c) break;
            cands += avail;
            rows++;
            c = rs[r + 1];
            r++;
        }
        bseg *s = seg_new(q, r0, split ? r0 + 1 : r, c0, c);
        if (!s) {
            while (first) {
                bseg *nx = first->next;
                free(first);
                first = nx;
            }
            free(rs);
            return NULL;
        }
        if (last)
            last->next = s;
        else
            first = s;
        last = s;
        n++;
    }
    free(rs);
    *n_out = n;
    return first;
}

int batcher_reserve(batcher *b, int n_cands, rq_status *st)
{
    int rc = 0;
    pthread_mutex_lock(&b->mu);
    if (b->stopping) {
        rc = rq_status_set(st, RQ_UNAVAILABLE, "model '%s': this version is being unloaded",
                           b->label);
    } else if (b->w_requests + 1 > b->lim.max_queue_requests) {
        rc = rq_status_set(st, RQ_RESOURCE_EXHAUSTED, "queue full: %lld requests queued, limit %lld",
                           b->w_requests, b->lim.max_queue_requests);
    } else if (b->w_requests > 0 && b->w_cands + n_cands > b->lim.max_queue_candidates) {
        rc = rq_status_set(st, RQ_RESOURCE_EXHAUSTED,
                           "queue full: %lld candidates queued with this request's %d, limit %lld",
                           b->w_cands + n_cands, n_cands, b->lim.max_queue_candidates);
    } else {
        b->w_requests++;
        b->w_cands += n_cands;
        m_add(b->m_q_requests, 1);
        m_add(b->m_q_cands, n_cands);
    }
    if (rc && st->code == RQ_RESOURCE_EXHAUSTED) m_add(b->m_rejected[RJ_QUEUE_FULL], 1);
    pthread_mutex_unlock(&b->mu);
    return rc;
}

void batcher_unreserve(batcher *b, int n_cands)
{
    pthread_mutex_lock(&b->mu);
    b->w_requests--;
    b->w_cands -= n_cands;
    m_add(b->m_q_requests, -1);
    m_add(b->m_q_cands, -(double)n_cands);
    pthread_mutex_unlock(&b->mu);
}

int batcher_submit_reserved(batcher *b, const batcher_request *r, rq_status *st)
{
    const int C = r->plan->batch.n_cands, U = r->plan->batch.n_users;
    const int T = b->n_tasks > 0 ? b->n_tasks : 1;
    breq *q = calloc(1, sizeof *q);
    bseg *segs = NULL;
    int n = 0;
    if (q) {
        q->r = *r;
        q->C = C;
        q->U = U;
        q->scores = malloc((size_t)C * sizeof *q->scores);
        q->task_scores = malloc((size_t)C * (size_t)T * sizeof *q->task_scores);
        if (q->scores && q->task_scores)
            segs = make_segments(q, b->lim.max_batch_candidates, b->lim.max_batch_users, &n);
    }
    if (!segs) {
        if (q) breq_free(q);
        batcher_unreserve(b, C);
        return rq_status_set(st, RQ_INTERNAL, "batcher: out of memory for %d candidates", C);
    }
    q->segs_left = q->waiting_segs = n;
    bseg *tail = segs;
    while (tail->next) tail = tail->next;
    pthread_mutex_lock(&b->mu);
    q->enq_ns = clock_mono_ns();
    if (b->tail)
        b->tail->next = segs;
    else
        b->head = segs;
    b->tail = tail;
    b->q_cands += C;
    b->q_rows += U;
    /* An idle instance takes it (one wake-up); else the first instance to
     * finish its batch does, and the sweeper watches its deadline. */
    if (!wake_leader(b)) watch_deadline(b, r->deadline_ns);
    pthread_mutex_unlock(&b->mu);
    return 0;
}

int batcher_submit(batcher *b, const batcher_request *r, rq_status *st)
{
    if (batcher_reserve(b, r->plan->batch.n_cands, st)) return -1;
    return batcher_submit_reserved(b, r, st);
}

int batcher_idle(batcher *b)
{
    pthread_mutex_lock(&b->mu);
    int idle = !b->head && b->active == 0 && b->w_requests == 0;
    pthread_mutex_unlock(&b->mu);
    return idle;
}

void batcher_queue_depth(batcher *b, long long *requests, long long *candidates)
{
    pthread_mutex_lock(&b->mu);
    if (requests) *requests = b->w_requests;
    if (candidates) *candidates = b->w_cands;
    pthread_mutex_unlock(&b->mu);
}

/* ---- lifecycle ---------------------------------------------------------- */

static void stop_threads(batcher *b)
{
    pthread_mutex_lock(&b->mu);
    b->stopping = 1;
    while (wake_leader(b)) {
    }
    pthread_cond_signal(&b->cv_sweep);
    pthread_mutex_unlock(&b->mu);
    if (b->sweeper_started) pthread_join(b->sweeper, NULL);
    b->sweeper_started = 0;
    /* The instances drain the FIFO (sweeping it before each batch). */
    for (int i = 0; i < b->n_inst; i++)
        if (b->inst[i].started) pthread_join(b->inst[i].thread, NULL);
    /* The instances are gone, so the completers' list only shrinks now. */
    pthread_mutex_lock(&b->mu);
    b->completers_stop = 1;
    __atomic_store_n(&b->done_seq, b->done_seq + 1, __ATOMIC_RELEASE); /* ends a poll */
    pthread_cond_broadcast(&b->cv_done);
    pthread_mutex_unlock(&b->mu);
    for (int i = 0; i < b->n_completers; i++) pthread_join(b->completer[i], NULL);
    b->n_completers = 0;
}

static void destroy(batcher *b)
{
    pthread_mutex_destroy(&b->mu);
    pthread_cond_destroy(&b->cv_sweep);
    pthread_cond_destroy(&b->cv_done);
    for (int i = 0; b->inst && i < b->n_inst; i++) pthread_cond_destroy(&b->inst[i].cv);
    free(b->completer);
    free(b->inst);
    free(b->label);
    free(b);
}

/* Completers first, so an instance never finishes a batch with nobody to
 * hand answers to; the sweeper last. 0, or -1 with *err. */
static int start_threads(batcher *b, ikbo_err *err)
{
    /* One completer per instance: completing a request (response build,
     * pack, send) costs a fraction of scoring it. */
    for (int i = 0; i < b->n_inst; i++) {
        if (pthread_create(&b->completer[i], NULL, completer_main, b) != 0) {
            bk_seterr(err, "batcher: cannot start completion thread %d", i);
            return -1;
        }
        b->n_completers++;
    }
    for (int i = 0; i < b->n_inst; i++) {
        if (pthread_create(&b->inst[i].thread, NULL, instance_main, &b->inst[i]) != 0) {
            bk_seterr(err, "batcher: cannot start instance thread %d", i);
            return -1;
        }
        b->inst[i].started = 1;
    }
    if (pthread_create(&b->sweeper, NULL, sweeper_main, b) != 0) {
        bk_seterr(err, "batcher: cannot start the sweeper thread");
        return -1;
    }
    b->sweeper_started = 1;
    return 0;
}

static void metrics_init(batcher *b, metrics_server *mx)
{
    const char *const ml[] = {b->label};
    b->m_queue_s = metrics_series_get(mx->queue_seconds, ml);
    b->m_req_compute_s = metrics_series_get(mx->request_compute_seconds, ml);
    b->m_batch_compute_s = metrics_series_get(mx->batch_compute_seconds, ml);
    b->m_batch_requests = metrics_series_get(mx->batch_requests, ml);
    b->m_batch_users = metrics_series_get(mx->batch_users, ml);
    b->m_batch_cands = metrics_series_get(mx->batch_candidates, ml);
    b->m_batch_ratio = metrics_series_get(mx->batch_candidates_per_user, ml);
    b->m_q_requests = metrics_series_get(mx->queue_requests, ml);
    b->m_q_cands = metrics_series_get(mx->queue_candidates, ml);
    b->m_bytes_avoided = metrics_series_get(mx->broadcast_bytes_avoided_total, ml);
    b->m_nonfinite = metrics_series_get(mx->nonfinite_scores_total, ml);
    for (int i = 0; i < RJ_COUNT; i++) {
        const char *const mr[] = {b->label, REJECT_NAME[i]};
        b->m_rejected[i] = metrics_series_get(mx->rejected_total, mr);
    }
    for (int i = 0; i < IKBO_GRAPH_USES; i++) {
        const char *const mg[] = {b->label, ikbo_graph_use_names[i]};
        b->m_graphs[i] = metrics_series_get(mx->batch_graphs_total, mg);
    }
}

batcher *batcher_new(const batcher_model *model, const config_batching *lim, metrics_server *mx,
                     const batcher_hooks *hooks, ikbo_err *err)
{
    batcher *b = calloc(1, sizeof *b);
    if (!b) {
        bk_seterr(err, "batcher: out of memory");
        return NULL;
    }
    b->lim = *lim;
    if (b->lim.instances < 1) b->lim.instances = 1;
    b->model = *model;
    b->label = strdup(model->label ? model->label : "");
    b->model.label = b->label;
    b->n_tasks = model->mi->n_tasks;
    if (hooks) b->hooks = *hooks;
    b->n_inst = b->lim.instances;
    b->inst = calloc((size_t)b->n_inst, sizeof *b->inst);
    b->completer = calloc((size_t)b->n_inst, sizeof *b->completer);
    pthread_mutex_init(&b->mu, NULL);
    /* Timed waits (delay, deadlines) are on CLOCK_MONOTONIC. */
    clock_cond_init(&b->cv_sweep);
    for (int i = 0; b->inst && i < b->n_inst; i++) {
        b->inst[i].b = b;
        b->inst[i].index = i;
        clock_cond_init(&b->inst[i].cv);
    }
    pthread_cond_init(&b->cv_done, NULL);
    if (!b->label || !b->inst || !b->completer) {
        bk_seterr(err, "batcher: out of memory");
        destroy(b);
        return NULL;
    }
    if (mx) metrics_init(b, mx);
    if (start_threads(b, err) != 0) {
        stop_threads(b);
        destroy(b);
        return NULL;
    }
    return b;
}

void batcher_free(batcher *b)
{
    if (!b) return;
    stop_threads(b);
    destroy(b);
}
