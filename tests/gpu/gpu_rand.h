/* gpu_rand.h - the GPU tools' random inputs and host allocation, written once.
 *
 * Why this exists: test_cuda_ops, test_cuda_model and bench/e2e/batch_phases
 * each draw random inputs and allocate host buffers that must not fail
 * quietly. The checks must draw fresh inputs on every run (a fixed seed tests
 * one input forever) and a failure must still be reproducible:
 * gr_seed_checks() takes IKBO_TEST_SEED when set, else a seed from the clock
 * and the pid, and returns it for the caller to print. A benchmark seeds a
 * constant with gr_seed() so that two builds see the same inputs.
 *
 * One generator state per program (static): single-threaded use only. Each
 * program includes this once (the functions are static).
 */
#ifndef IKBO_TESTS_GPU_RAND_H
#define IKBO_TESTS_GPU_RAND_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static uint64_t gr_state = 0x9e3779b97f4a7c15ull;

/* xorshift64 must not start at 0; seed 0 is taken as 1. */
static inline void gr_seed(uint64_t seed) { gr_state = seed ? seed : 1; }

/* The checks' seed: IKBO_TEST_SEED (a decimal or 0x number), else one mixed
 * (splitmix64's finalizer) from the realtime clock and the pid. A malformed
 * IKBO_TEST_SEED ends the program with exit code 2 naming the variable. */
static inline uint64_t gr_seed_checks(void)
{
    const char *env = getenv("IKBO_TEST_SEED");
    uint64_t s;
    if (env && *env) {
        char *end;
        errno = 0;
        s = strtoull(env, &end, 0);
        if (errno || *end || *env == '-') {
            fprintf(stderr, "IKBO_TEST_SEED: '%s' is not an unsigned 64-bit number\n", env);
            exit(2);
        }
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        s = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + ((uint64_t)getpid() << 40);
        s ^= s >> 30;
        s *= 0xbf58476d1ce4e5b9ull;
        s ^= s >> 27;
        s *= 0x94d049bb133111ebull;
        s ^= s >> 31;
    }
    gr_seed(s);
    return s;
}

static inline uint64_t rnd(void)
{
    gr_state ^= gr_state << 13;
    gr_state ^= gr_state >> 7;
    gr_state ^= gr_state << 17;
    return gr_state;
}
/* Uniform in [lo, hi]. */
static inline int irand(int lo, int hi) { return lo + (int)(rnd() % (uint64_t)(hi - lo + 1)); }
/* Uniform in [-1, 1). */
static inline float frand(void)
{
    return (float)((rnd() >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

/* calloc that ends the program (exit code 2) instead of returning NULL. */
static inline void *xcalloc(size_t n, size_t s)
{
    void *p = calloc(n ? n : 1, s);
    if (!p) {
        fprintf(stderr, "out of host memory (%zu x %zu bytes)\n", n, s);
        exit(2);
    }
    return p;
}

#endif
