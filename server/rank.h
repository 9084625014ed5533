/* rank.h - one Rank request end to end, shared by the gRPC and HTTP front
 * ends: resolve the model, check the deadline, validate, plan (request.h),
 * queue the plan on the model version's batcher (batcher.h), build the
 * response from the scores, and record the request's metrics and log line.
 *
 * Why a module of its own: both transports must give the same status and
 * message for the same request. rank_submit is asynchronous so neither a
 * gRPC worker nor the HTTP thread ever waits for compute.
 *
 * Metrics and the log line are recorded before the callback runs, so a
 * client that has its answer sees its request counted.
 *
 * Thread-safety: both functions may run on many threads at once.
 */
#ifndef IKBO_SERVER_RANK_H
#define IKBO_SERVER_RANK_H

#include <stdatomic.h>
#include <stdint.h>

#include "batcher_set.h"
#include "metrics.h"
#include "registry.h"
#include "request.h"

typedef struct rank_env {
    registry *reg;
    const rq_limits *limits;
    metrics_server *metrics;
    batcher_set *batchers;
} rank_env;

/* Every deadline here is clock.h's clock_mono_ns() (CLOCK_MONOTONIC ns). */

/* The answer: resp (the callee owns it: rq_response_free) or NULL with *st
 * the status to send. */
typedef void (*rank_done_fn)(void *arg, Ikbo__V1__RankResponse *resp, const rq_status *st);

/* Handles one request and calls done exactly once: on this thread when the
 * request fails before reaching the batcher (NOT_FOUND, INVALID_ARGUMENT,
 * DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED queue full, ...), else later on a
 * batcher thread. deadline_ns: absolute CLOCK_MONOTONIC time, 0 = none.
 * cancelled: nonzero once the client is gone (a queued request is then not
 * computed), NULL = never. transport ("grpc", "http") labels the log line.
 * req must stay valid until done has been called; done may free it. */
void rank_submit(const rank_env *env, const Ikbo__V1__RankRequest *req, int64_t deadline_ns,
                 const atomic_int *cancelled, const char *transport, rank_done_fn done,
                 void *arg);

#endif
