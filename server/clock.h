/* clock.h - the server's monotonic clock, defined once.
 *
 * Why this exists: request deadlines (rank.h), batch delays (batcher.c),
 * settle times and load durations (registry.c), drains and lame-duck
 * timing (grpc_server.c) and HTTP timeouts compare times taken on
 * different threads; they must all read one clock, CLOCK_MONOTONIC (also
 * the clock the condition variables that wait on these times are set to).
 * Header-only; thread-safe.
 */
#ifndef IKBO_SERVER_CLOCK_H
#define IKBO_SERVER_CLOCK_H

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

#endif
