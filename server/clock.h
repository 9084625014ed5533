/* clock.h - the server's monotonic clock, defined once.
 *
 * Why this exists: request deadlines (rank.h), batch delays (batcher.c),
 * settle times and load durations (registry.c), drains and lame-duck
 * timing (grpc_server.c) and HTTP timeouts compare times taken on
 * different threads; they must all read one clock, CLOCK_MONOTONIC (also
 * the clock the condition variables that wait on these times are set to:
 * clock_cond_init, clock_cond_wait_until).
 * Header-only; thread-safe.
 */
#ifndef IKBO_SERVER_CLOCK_H
#define IKBO_SERVER_CLOCK_H

#include <pthread.h>
#include <stdint.h>
#include <time.h>

static inline int64_t clock_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline int64_t clock_mono_ms(void) { return clock_mono_ns() / 1000000; }

static inline double clock_mono_s(void) { return (double)clock_mono_ns() * 1e-9; }

/* A condition variable whose timed waits are on this clock. */
static inline void clock_cond_init(pthread_cond_t *cv)
{
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &ca);
    pthread_condattr_destroy(&ca);
}

/* Waits on cv (made by clock_cond_init) until signalled or until_ns of
 * clock_mono_ns; until_ns 0: no deadline. */
static inline void clock_cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t until_ns)
{
    if (!until_ns) {
        pthread_cond_wait(cv, mu);
        return;
    }
    struct timespec ts = {(time_t)(until_ns / 1000000000), (long)(until_ns % 1000000000)};
    pthread_cond_timedwait(cv, mu, &ts);
}

#endif
