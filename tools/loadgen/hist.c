/* hist.c - log-bucketed histogram (see hist.h). */
#include "hist.h"

#include <math.h>
#include <string.h>

void hist_init(hist *h)
{
    memset(h, 0, sizeof *h);
    h->min = UINT64_MAX;
}

int hist_index(uint64_t v)
{
    if (v < 2 * HIST_SUB) return (int)v;
    int e = 63 - __builtin_clzll(v); /* e >= HIST_SUB_BITS + 1 */
    int shift = e - HIST_SUB_BITS;
    int sub = (int)((v >> shift) & (HIST_SUB - 1));
    return (e - HIST_SUB_BITS + 1) * HIST_SUB + sub;
}

void hist_bounds(int index, uint64_t *lo, uint64_t *hi)
{
    if (index < 2 * HIST_SUB) {
        *lo = *hi = (uint64_t)index;
        return;
    }
    int e = index / HIST_SUB + HIST_SUB_BITS - 1;
    int sub = index % HIST_SUB;
    int shift = e - HIST_SUB_BITS;
    uint64_t base = ((uint64_t)HIST_SUB + (uint64_t)sub) << shift;
    *lo = base;
    *hi = base + ((1ull << shift) - 1);
}

void hist_add(hist *h, uint64_t v)
{
    h->b[hist_index(v)]++;
    h->count++;
    h->sum += (double)v;
    if (v < h->min) h->min = v;
    if (v > h->max) h->max = v;
}

void hist_merge(hist *into, const hist *from)
{
    if (!from->count) return;
    for (int i = 0; i < HIST_BUCKETS; i++) into->b[i] += from->b[i];
    into->count += from->count;
    into->sum += from->sum;
    if (from->min < into->min) into->min = from->min;
    if (from->max > into->max) into->max = from->max;
}

double hist_quantile(const hist *h, double q)
{
    if (!h->count) return 0;
    if (q <= 0) return (double)h->min;
    if (q >= 1) return (double)h->max;
    uint64_t rank = (uint64_t)ceil(q * (double)h->count);
    if (rank < 1) rank = 1;
    uint64_t seen = 0;
    for (int i = 0; i < HIST_BUCKETS; i++) {
        seen += h->b[i];
        if (seen >= rank) {
            uint64_t lo, hi;
            hist_bounds(i, &lo, &hi);
            double mid = ((double)lo + (double)hi) / 2;
            if (mid < (double)h->min) mid = (double)h->min;
            if (mid > (double)h->max) mid = (double)h->max;
            return mid;
        }
    }
    return (double)h->max;
}

double hist_mean(const hist *h)
{
    return h->count ? h->sum / (double)h->count : 0;
}
