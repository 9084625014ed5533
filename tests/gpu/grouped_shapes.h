/* grouped_shapes.h - the many-row grouped-linear shapes test_cuda_ops runs
 * the backend's linear_grouped over (against the CPU): the generality
 * kernels/cuda/linear_wr.cu (W resident) must have to serve it (partial
 * row tiles, one to four 64-deep k slices, a second 256-output block,
 * outputs ending inside a block's halves, bias, relu, pitched rows and
 * groups). A table apart from the test, so a bench can time the same.
 * Header-only (C and C++); nothing is allocated.
 */
#ifndef IKBO_TESTS_GPU_GROUPED_SHAPES_H
#define IKBO_TESTS_GPU_GROUPED_SHAPES_H

#include <stdint.h>

typedef struct grouped_shape {
    int groups, g, in, out, bias, relu, ldx;
    int64_t gx;
    int ldy;
    int64_t gy;
} grouped_shape;

#define GROUPED_SHAPES 9

/* Fills out[GROUPED_SHAPES]: three fixed shapes (more tiles than CTAs with
 * bias; groups of 100 rows, 3 k slices, 384 outputs; 512 outputs), then six
 * whose k runs 40..240 and outputs 128..248 over odd group sizes. */
static inline void grouped_shapes(grouped_shape out[GROUPED_SHAPES])
{
    const grouped_shape fixed[3] = {
        {300, 64, 256, 256, 1, 0, 256, 4 * 64 * 256, 264, 64 * 264 + 8},
        {40, 100, 192, 384, 1, 1, 200, 100 * 200 + 8, 392, 100 * 392 + 16},
        {20, 64, 256, 512, 1, 1, 256, 64 * 256 + 8, 512, 64 * 512 + 8}};
    for (int i = 0; i < 3; i++)
        out[i] = fixed[i];
    for (int k = 0; k < 6; k++) {
        grouped_shape *s = &out[3 + k];
        s->groups = 61 + 7 * k;
        s->g = 17 + 9 * k;
        s->in = 40 + 40 * k;
        s->out = 128 + 24 * k;
        s->bias = k % 2;
        s->relu = k % 3 == 1;
        s->ldx = s->in + 8 * (k % 2);
        s->gx = (int64_t)s->g * s->ldx + 16;
        s->ldy = s->out;
        s->gy = (int64_t)s->g * s->out + 8 * k;
    }
}

#endif
