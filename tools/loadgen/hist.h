/* hist.h - log-bucketed latency histogram for ikbo-loadgen.
 *
 * Why this exists: percentiles of millions of latencies need a fixed-size
 * structure that one thread updates without locks and that threads merge at
 * the end. Values (nanoseconds, any uint64) land in buckets whose width is at
 * most 1/128 of their lower bound: below 256 ns one bucket per ns, above it
 * 128 sub-buckets per power of two. A percentile is reported as its bucket's
 * midpoint clamped to the exact min/max, so its relative error is under 0.4%
 * (the brief asks for ~1%).
 *
 * Ownership: a hist is a plain value (no heap); copy or merge freely.
 * Thread-safety: none; give each thread its own and merge after joining.
 */
#ifndef IKBO_LOADGEN_HIST_H
#define IKBO_LOADGEN_HIST_H

#include <stdint.h>

#define HIST_SUB_BITS 7                          /* 128 sub-buckets per octave */
#define HIST_SUB (1 << HIST_SUB_BITS)
/* Octaves 0..7 are the 256 linear ns buckets; octaves 8..63 are log. */
#define HIST_BUCKETS (2 * HIST_SUB + (64 - HIST_SUB_BITS - 1) * HIST_SUB)

typedef struct hist {
    uint64_t count;
    uint64_t min, max; /* exact; min = UINT64_MAX when empty */
    double sum;        /* exact sum for the mean */
    uint64_t b[HIST_BUCKETS];
} hist;

void hist_init(hist *h);
void hist_add(hist *h, uint64_t v);
void hist_merge(hist *into, const hist *from);

/* Bucket index of v and the bucket's [lo, hi] value range (inclusive). */
int hist_index(uint64_t v);
void hist_bounds(int index, uint64_t *lo, uint64_t *hi);

/* The q-quantile (0 <= q <= 1): the bucket holding the ceil(q*count)-th
 * smallest value, reported as its midpoint clamped to [min, max]. 0 when
 * empty. */
double hist_quantile(const hist *h, double q);
double hist_mean(const hist *h);

#endif
