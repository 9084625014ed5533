/* rank.h - one Rank request end to end, shared by the gRPC and HTTP front
 * ends: resolve the model, check the deadline, validate, plan (request.h),
 * score, build the response, and record the request's metrics and log line.
 *
 * Why a module of its own: both transports must give the same status and
 * message for the same request, and the scoring step (rank_execute: a
 * validated plan -> scores -> response) is the seam where the dynamic batcher
 * (server/batcher.c, a later issue) plugs in: today it scores on the calling
 * thread with that thread's context slot.
 *
 * Broadcast bytes avoided (metric ikbo_broadcast_bytes_avoided_total): per
 * scored request, the host bytes of user inputs that a broadcast stack would
 * copy out to candidate batch size and IKBO does not:
 *     sum over candidates c of row_bytes(map[c]) - sum over rows u of row_bytes(u)
 * with row_bytes(u) = 4*user_dense + 8*(sparse ids of u) + 8*(history ids of u)
 * + 4*(history actions of u, when given). With equal-sized rows this is
 * (C - U) * row_bytes. The engine does not yet report the per-row bytes of
 * the user-domain activations its IKBO ops read (E_user, history K/V), which
 * would be the truer figure; this input-level count is a lower bound.
 *
 * Thread-safety: rank_handle may run on many threads at once, each with its
 * own slot (registry.h). Ownership: the returned response is the caller's
 * (rq_response_free).
 */
#ifndef IKBO_SERVER_RANK_H
#define IKBO_SERVER_RANK_H

#include <stdint.h>

#include "metrics.h"
#include "registry.h"
#include "request.h"

typedef struct rank_env {
    registry *reg;
    const rq_limits *limits;
    metrics_server *metrics;
} rank_env;

/* Now on CLOCK_MONOTONIC, in nanoseconds: the clock of every deadline here. */
int64_t rank_now_ns(void);

/* Handles one request. deadline_ns: absolute CLOCK_MONOTONIC time, 0 = none;
 * a deadline that has passed before scoring gives DEADLINE_EXCEEDED and no
 * work. transport ("grpc", "http") only labels the log line. Returns the
 * response, or NULL with *st set (the status to send). */
Ikbo__V1__RankResponse *rank_handle(const rank_env *env, int slot,
                                    const Ikbo__V1__RankRequest *req, int64_t deadline_ns,
                                    const char *transport, rq_status *st);

/* The scoring seam: a plan already validated against m -> response. */
Ikbo__V1__RankResponse *rank_execute(registry_model *m, int slot,
                                     const Ikbo__V1__RankRequest *req, const rq_plan *p,
                                     rq_status *st);

/* The broadcast-avoided byte count described above. */
uint64_t rank_broadcast_bytes_avoided(const rq_plan *p, const ikbo_model_info *mi);

#endif
