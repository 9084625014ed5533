/* batcher.h - dynamic batching of Rank requests per model version, with user
 * dedup across the merged requests, admission control and deadlines.
 *
 * Why this exists: IKBO pays off when one forward pass carries many
 * candidates over few users; single feed requests are small. So requests for
 * the same model version wait in one queue and are merged into one engine
 * batch, in which identical users (same key and same content, request.h's
 * rule) of different requests share one row.
 *
 * Threads of one batcher (one per model version):
 * - callers (gRPC workers, the HTTP thread) batcher_submit a validated plan
 *   and return at once; admission is decided there, under the batcher's
 *   lock. A submit appends to the FIFO and wakes one idle instance, if any;
 * - `instances` instance threads, each with its own ikbo_ctx (workspace and,
 *   on GPU, stream). A free instance forms its own batch from the FIFO
 *   under the lock: it drops what expired or was cancelled, then, when the
 *   queue holds max_batch_candidates candidates or max_batch_users user
 *   rows, or the oldest request has waited max_queue_delay_us (0: at once),
 *   pops the head requests that fit one batch and, outside the lock, builds
 *   the merged ikbo_batch (user dedup, candidates grouped by merged row so
 *   map stays non-decreasing), runs ikbo_score and copies each request's
 *   scores out. So a request submitted while an instance is idle starts
 *   computing after one wake-up. Idle instances wait on a stack, most
 *   recently idle first; the first (the leader) is the one a submit wakes,
 *   and it waits for the oldest request's delay and the queue's earliest
 *   deadline. An instance that leaves requests in the queue wakes the next
 *   idle one. Nothing is assembled ahead of a free instance: what waits
 *   stays in the FIFO, where later arrivals still join it and deadlines and
 *   cancellation still drop it; with several instances one merges while
 *   another computes;
 * - the instance answers the requests it finished (runs their callbacks:
 *   on the server, response build, protobuf pack, send, request free)
 *   itself unless work waits for it, that is, the FIFO holds a request and
 *   no other instance is idle to take it. Then the requests go to the
 *   completion threads (as many as instances), so the instance starts its
 *   next batch at once. The rule is checked before each callback: work
 *   that arrives while an instance answers sends the rest to the
 *   completers. An answer thus costs no hand-off when the server is not
 *   busy, and delays a request that arrives meanwhile by at most the one
 *   callback then running;
 * - one sweeper thread answers queued requests whose deadline passes while
 *   no instance is idle to watch the queue; it sleeps until the earliest
 *   such deadline, and is woken only when a request with an earlier one is
 *   left in the queue with no instance idle.
 *
 * A request is never split across batches unless it alone exceeds
 * max_batch_candidates or max_batch_users: then it is cut into chunks at
 * user-row boundaries (a single user with more candidates than the limit is
 * cut within its candidates, each piece carrying the user's row), the chunks
 * queue back to back, and the callback runs once, after the last chunk,
 * with every score in place. max_batch_users counts the rows the merged
 * requests bring (each request already deduplicated), before dedup across
 * requests; a batch always takes at least one request or chunk.
 *
 * Admission: a request is refused at once with RESOURCE_EXHAUSTED ("queue
 * full: 812 candidates queued with this request's 64, limit 800", "queue
 * full: 512 requests queued, limit 512") when admitting it would put more
 * than max_queue_requests requests or max_queue_candidates candidates in the
 * queue, which holds every request admitted and not computing yet (waiting
 * in the FIFO; a request leaves it when an instance pops it). Admission is
 * a reservation taken before the request is validated and planned
 * (batcher_reserve), so a refusal costs almost nothing. A request larger
 * than max_queue_candidates is admitted only into an empty queue. So the
 * work ahead of an admitted request is at most the queue limits plus the
 * batches computing: max_queue_candidates bounds its queueing delay. A
 * queued request whose deadline passes gets DEADLINE_EXCEEDED, and one whose
 * client went away (*cancelled != 0) gets CANCELLED, without being computed:
 * an instance checks both before it forms a batch, and the idle leader or
 * the sweeper wakes at the earliest deadline. A request already popped
 * into a batch is computed.
 *
 * Scores are bitwise identical to scoring each request alone on the CPU
 * backend: the engine scores a candidate the same whatever else is in the
 * batch (engine/ikbo.h), and a request's rows and candidates keep their
 * relative order. On the GPU the kernels' rounding can depend on the
 * batch's shape; measured with tests/unit/test_batcher.c on an H200
 * (IKBO_TEST_DEVICE=cuda:0, 8547 scores): bf16 activations (the default)
 * 96.7% bitwise equal, max |diff| 9.4e-4 (relative 1.7e-3); fp32 88.9%,
 * max |diff| 1.2e-7; fp16 100%.
 *
 * Ownership: the request and the plan given to batcher_submit are only read
 * and must stay valid until the callback has run. The result passed to the
 * callback (and its score arrays) is valid during the callback only.
 * Thread-safety: batcher_submit from any thread; the callback runs on an
 * instance or a completion thread (by the rule above), or on the sweeper
 * (requests dropped at their deadline while every instance computes),
 * never under a batcher lock, never inside batcher_submit; batcher_free
 * from one thread once no submit can start, and every callback has run
 * when it returns.
 */
#ifndef IKBO_SERVER_BATCHER_H
#define IKBO_SERVER_BATCHER_H

#include <stdatomic.h>
#include <stdint.h>

#include "../engine/ikbo.h"
#include "config.h"
#include "metrics.h"
#include "request.h"

typedef struct batcher batcher;

typedef struct batcher_result {
    rq_status st;             /* OK, or why the request was not scored */
    const float *task_scores; /* [C, n_tasks] in the plan's batch order; NULL unless OK */
    const float *scores;      /* [C] in the plan's batch order; NULL unless OK */
    double queue_seconds;     /* submit -> compute start of the (last) batch that carried it */
    double compute_seconds;   /* ikbo_score time of the batches that carried it */
    int batches;              /* batches that carried it (> 1 only for a chunked request) */
} batcher_result;

typedef void (*batcher_done_fn)(void *arg, const batcher_result *r);

typedef struct batcher_request {
    const Ikbo__V1__RankRequest *req; /* user keys come from here */
    const rq_plan *plan;              /* validated against the batcher's model */
    int64_t deadline_ns;              /* clock_mono_ns() (clock.h), 0 = none */
    const atomic_int *cancelled;      /* nonzero once the client is gone; NULL = never */
    batcher_done_fn done;             /* called exactly once when batcher_submit returned 0 */
    void *arg;
} batcher_request;

/* The context of execution instance i (0 <= i < instances), asked for on the
 * instance's own thread, before its first batch. */
typedef ikbo_ctx *(*batcher_ctx_fn)(void *arg, int instance, ikbo_err *err);

/* The model's device is unusable for the rest of the process, with the
 * model's label and the reason. hung 0: a batch failed on a lost device
 * (ikbo_ctx_device_lost), called on its instance thread once per such batch,
 * whose calls are answered UNAVAILABLE. hung 1: a batch has computed past
 * batch_timeout_ms (batcher_set's watchdog, from its own thread); that
 * batch's instance thread may never return. */
typedef void (*batcher_lost_fn)(void *arg, const char *label, const char *why, int hung);

typedef struct batcher_model {
    const ikbo_model_info *mi;
    const char *label; /* metrics label "model" and log name (copied) */
    batcher_ctx_fn ctx;
    void *ctx_arg;
    batcher_lost_fn device_lost; /* NULL: none */
    void *lost_arg;
} batcher_model;

/* Test hooks, NULL in the daemon. before_compute: on the instance thread
 * just before a batch is computed, with the number of requests (or chunks)
 * in it. before_callback: just before a request's callback, with the
 * instance whose thread runs it, or -1 (a completer or the sweeper). */
typedef struct batcher_hooks {
    void (*before_compute)(void *arg, int instance, int n_requests);
    void *arg;
    void (*before_callback)(void *arg, int instance);
} batcher_hooks;

/* The limits a model runs with: the server's "batching" config, overridden
 * by the model's own serving values where set (>= 0: serving_merge), then
 * every 0 = auto (max_batch_candidates, max_batch_users, instances) resolved
 * by device (config.h's CONFIG_BATCH_AUTO_*; instances cpu 1, cuda 4) and
 * instances clamped to 1..CONFIG_BATCH_MAX_INSTANCES. serving and device may
 * be NULL. */
void batcher_resolve(const ikbo_serving *server, const ikbo_serving *serving,
                     const char *device, ikbo_serving *out);

/* Starts the instance, completion and sweeper threads. lim must be resolved
 * (instances >= 1). mx NULL = no metrics. NULL with *err on failure. */
batcher *batcher_new(const batcher_model *model, const config_batching *lim,
                     metrics_server *mx, const batcher_hooks *hooks, ikbo_err *err);

/* Admission for a request of n_cands candidates: 0 and a place is held in
 * the queue, or -1 with *st (RESOURCE_EXHAUSTED queue full, UNAVAILABLE
 * stopping). A reservation is used by batcher_submit_reserved (with a plan
 * of exactly n_cands candidates) or given back with batcher_unreserve. */
int batcher_reserve(batcher *b, int n_cands, rq_status *st);
void batcher_unreserve(batcher *b, int n_cands);

/* Queues a request whose place is reserved. 0: done will be called. -1 with
 * *st (INTERNAL, out of memory; the reservation is given back): done will
 * not be called. */
int batcher_submit_reserved(batcher *b, const batcher_request *r, rq_status *st);

/* batcher_reserve + batcher_submit_reserved. */
int batcher_submit(batcher *b, const batcher_request *r, rq_status *st);

/* 1 when nothing is reserved, queued or being computed. */
int batcher_idle(batcher *b);

/* The limits it runs with. */
void batcher_get_limits(const batcher *b, config_batching *out);

/* How long the longest-running batch of its instances has been computing
 * (from its context and ikbo_score on), in ms; 0 when none computes. A
 * batch that never ends (a hung device) grows without bound: batcher_set
 * compares it with batch_timeout_ms. Any thread. */
long long batcher_busy_ms(const batcher *b);

/* Current queue depth (requests, candidates admitted and not computing). */
void batcher_queue_depth(batcher *b, long long *requests, long long *candidates);

/* Stops admitting, finishes everything queued (callbacks run), joins the
 * threads and frees. NULL ok. */
void batcher_free(batcher *b);

#endif
