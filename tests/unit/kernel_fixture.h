/* kernel_fixture.h - what the CPU kernel tests share: a seeded generator,
 * poisoned buffers, a relative-error check against double references, and
 * the cmocka setup that makes one CPU backend and stream.
 *
 * Header-only; define KF_SEED before including it (each test file draws
 * its own sequence). Single-threaded, as cmocka runs the tests.
 */
#ifndef IKBO_KERNEL_FIXTURE_H
#define IKBO_KERNEL_FIXTURE_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "kernels/backend.h"

#ifndef KF_SEED
#error "define KF_SEED before including kernel_fixture.h"
#endif

static uint64_t rng = KF_SEED;
static double frand(void) /* uniform in [-1, 1) */
{
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(rng >> 11) / (double)(1ULL << 53) * 2.0 - 1.0;
}
static int irand(int lo, int hi) { return lo + (int)((frand() + 1) * 0.5 * (hi - lo + 1)) % (hi - lo + 1); }

static bk_backend *be;
static bk_stream *st;
static bk_err err;

static float *rnd(size_t n, double scale)
{
    float *p = malloc((n ? n : 1) * sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] = (float)(frand() * scale);
    return p;
}
static float *poisoned(size_t n)
{
    float *p = malloc((n ? n : 1) * sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] = NAN;
    return p;
}

/* max |got - ref| / max(max |ref|, 1e-3) over n values; every got finite. */
static void check(const char *what, const float *got, const double *ref, size_t n, double tol)
{
    double mx = 1e-3, e = 0;
    for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs(ref[i]));
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) fail_msg("%s: element %zu is not finite", what, i);
        e = fmax(e, fabs(got[i] - ref[i]) / mx);
    }
    if (e > tol) fail_msg("%s: relative error %.3g > %.3g", what, e, tol);
}

static int setup(void **state)
{
    (void)state;
    be = bk_cpu_new(&err);
    st = be->stream_new(be, &err);
    return be && st ? 0 : -1;
}
static int teardown(void **state)
{
    (void)state;
    be->stream_free(st);
    be->destroy(be);
    return 0;
}

#endif
