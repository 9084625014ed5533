/* run.h - the load loops of ikbo-loadgen: closed loop (a fixed number of
 * calls in flight) and open loop (a precomputed send schedule at a fixed
 * rate), spread over worker threads, each with its own completion queue.
 *
 * Open loop and coordinated omission: every request has an intended send
 * time from the schedule (uniform i/rate, or Poisson arrivals), computed
 * before the run. Latency is measured from the intended time, not from when
 * the call was actually started, so a stalled server (or client) shows up in
 * the percentiles instead of silently lowering the send rate. When
 * max_inflight calls are already outstanding the next request waits (its
 * clock keeps running); requests still unsent one timeout after the schedule
 * ends are counted as `unsent`.
 *
 * Windows: requests whose intended (open) or actual (closed) send time falls
 * in [warmup, warmup + duration) are "measured"; the rest are warm-up. Every
 * call is counted in codes_all, so sent == sum(codes_all) and that is what the
 * server's ikbo_requests_total sees.
 *
 * Ownership: lg_run fills a caller-owned lg_stats; opts->bodies must outlive
 * the call. Thread-safety: lg_run creates and joins its own threads.
 */
#ifndef IKBO_LOADGEN_RUN_H
#define IKBO_LOADGEN_RUN_H

#include <stddef.h>
#include <stdint.h>

#include "client.h"
#include "hist.h"
#include "shape.h"

typedef struct lg_run_opts {
    const char *target;
    int threads;          /* worker threads (each: one completion queue) */
    int connections;      /* channels, each its own TCP connection */
    int concurrency;      /* closed loop: calls in flight (when rate == 0) */
    double rate;          /* open loop: requests/s (> 0 selects open loop) */
    int poisson;          /* open loop: exponential inter-arrival times */
    int max_inflight;     /* open loop: outstanding calls at most */
    double warmup_s, duration_s;
    int timeout_ms;       /* deadline of each call, from its actual send */
    int verify;           /* unpack OK responses and check the score count */
    const lg_bodies *bodies;
    uint64_t seed;
} lg_run_opts;

typedef struct lg_stats {
    uint64_t sent;                   /* calls started, warm-up included */
    uint64_t codes_all[LG_N_CODES];  /* every finished call by status */
    uint64_t codes[LG_N_CODES];      /* measured calls by status */
    uint64_t measured;               /* measured calls finished */
    uint64_t invalid, invalid_all;   /* OK answers that failed verification */
    uint64_t unsent;                 /* open loop: scheduled, never sent */
    uint64_t scheduled;              /* open loop: schedule length */
    double ok_candidates;            /* candidates in measured OK answers */
    double ok_bytes_sent;            /* request bytes of measured OK calls */
    hist lat_ok;                     /* measured OK calls, ns */
    hist lat_all;                    /* every measured call, ns */
    hist send_lag;                   /* open loop: actual - intended send, ns */
    double duration_s;               /* length of the measured window */
    double elapsed_s;                /* whole run incl. warm-up and drain */
    char first_error[512];           /* first non-OK status: "CODE: details" */
} lg_stats;

/* Runs the load. Returns 0, or -1 with errbuf when it could not start
 * (channel/connection/thread creation). Call failures are counted, not
 * errors. */
int lg_run(const lg_run_opts *o, lg_stats *st, char *errbuf, size_t n);

#endif
