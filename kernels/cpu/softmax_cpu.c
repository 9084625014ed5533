/* softmax_cpu.c - the softmax row of attention: max, exp, sum, 4 lanes wide.
 *
 * Why this exists: with libm's scalar expf and scalar max/sum loops, the
 * softmax took two thirds of attention's time at serving shapes (L = 64,
 * dh = 16). This computes the same thing with 4-lane vectors. It is its own
 * file because its exp is an approximation with a stated error that the unit
 * tests check directly (tests/unit/test_kernels_cpu.c).
 *
 * exp: Cephes expf's method. x = n ln2 + r with n = round(x log2 e) and
 * |r| <= ln2/2 (ln2 split in two constants so n ln2 is exact enough), then
 * e^r by a degree-7 polynomial (1 + r + r^2 p(r)) and 2^n built in the
 * exponent bits. Relative error below 1.4 * 2^-24 on [-87, 0] (measured on
 * a 1e-5 grid against double exp). Inputs are s - max <= 0; below
 * -87 they are clamped to -87 (exp(-87) ~ 1.6e-38 instead of a smaller
 * number: an absolute error of 1.6e-38 against a sum >= 1, since the maximum
 * contributes exp(0) = 1).
 *
 * Determinism: every element goes through the same vector code (the row is
 * padded to a multiple of 4) and the sum's order depends only on n.
 */
#include <math.h>

#include "cpu_internal.h"

static inline v4f splat(float x) { return (v4f){x, x, x, x}; }

/* Lane-wise a > b ? a : b (GNU C has vector compares but, in C, no vector ?:). */
static inline v4f vmax(v4f a, v4f b)
{
    v4i gt = a > b;
    return (v4f)((gt & (v4i)a) | (~gt & (v4i)b));
}

static inline v4f exp_nonpos(v4f x)
{
    x = vmax(x, splat(-87.0f));
    /* n = round-half-up(x log2 e): for t < 0, (int)(t - 0.5) truncates toward
     * zero, which is ceil(t - 0.5). x <= 0 so n is in [-126, 0]. */
    v4i n = __builtin_convertvector(x * splat(1.44269504088896341f) - splat(0.5f), v4i);
    v4f nf = __builtin_convertvector(n, v4f);
    v4f r = x - nf * splat(0.693359375f);
    r = r - nf * splat(-2.12194440e-4f);
    v4f p = splat(1.9875691500e-4f);
    p = p * r + splat(1.3981999507e-3f);
    p = p * r + splat(8.3334519073e-3f);
    p = p * r + splat(4.1665795894e-2f);
    p = p * r + splat(1.6666665459e-1f);
    p = p * r + splat(5.0000001201e-1f);
    v4f y = p * (r * r) + r + splat(1.0f);
    v4i bits = (n + 127) << 23; /* 2^n, a normal number for n >= -126 */
    return y * (v4f)bits;
}

float cpu_softmax_row(float *s, int n)
{
    const int n4 = (n + 3) & ~3;
    for (int j = n; j < n4; j++)
        s[j] = -INFINITY;
    v4f m = splat(-INFINITY), x;
    for (int j = 0; j < n4; j += 4) {
        V4_LD(x, s + j);
        m = vmax(x, m);
    }
    /* max is exact, so the lane order does not matter here. */
    float mx = m[0];
    for (int l = 1; l < 4; l++)
        mx = m[l] > mx ? m[l] : mx;
    const v4f vmx = splat(mx);
    const v4i lane = {0, 1, 2, 3};
    v4f acc = splat(0.0f);
    for (int j = 0; j < n4; j += 4) {
        V4_LD(x, s + j);
        v4f e = exp_nonpos(x - vmx);
        const int left = n - j;
        v4i keep = lane < (v4i){left, left, left, left}; /* the padding: exactly 0 */
        e = (v4f)((v4i)e & keep);
        V4_ST(s + j, e);
        acc += e;
    }
    return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}
