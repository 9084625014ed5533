/* test_tk_grid.c - linear_tk.cu's grid (kernels/cuda/tk_grid.h): how many
 * strips a warp takes, and which.
 *
 * Why this exists: the choice is a cost model, and a wrong one costs only
 * speed, so nothing on the GPU would fail; and a mapping that skipped or
 * doubled a strip would be found only by the GPU op tests at the shapes
 * they happen to run. Here, on the CPU, with the kernel's own functions:
 * the bench model's shapes get the strips a warp the model predicts (one
 * full wave instead of a first wave and a nearly empty second); a grid
 * that already fills its waves keeps the old 4; over a sweep of shapes and
 * slot counts the choice is never costlier than the old fixed 4, stays
 * within the slack of the cheapest, and every strip of every grid is taken
 * by exactly one (block, warp, step), with no block column left empty.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/tk_grid.h"

/* The cost the chooser minimizes, computed here from its definition. */
static double cost(long strips, long row_tiles, long slots, int spw)
{
    long blocks = tk_col_blocks(strips, spw) * row_tiles;
    return (double)((blocks + slots - 1) / slots) * spw;
}

/* The H200's 132 SMs at the kernel's 4 blocks an SM (its launch bounds'
 * minimum; the launch asks the occupancy API for the real count). */
#define SLOTS_H200 (132L * 4)

static void test_bench_model_shapes(void **state)
{
    (void)state;
    /* candidate token linear 1120 x [16 -> 15872]: 496 strips, 18 row
     * tiles of 64; 4 a warp gave 558 blocks (a second wave of 30). */
    assert_int_equal(tk_strips_per_warp(496, 18, SLOTS_H200), 5);
    assert_int_equal(tk_col_blocks(496, 5) * 18, 450);
    /* user MLP 16 x [32 -> 300800]: 9400 strips, one row tile; 588 blocks
     * before (a second wave of 60). */
    assert_int_equal(tk_strips_per_warp(9400, 1, SLOTS_H200), 5);
    /* c_r1 1120 x [16 -> 190464]: 12.7 waves at 4, as cheap as any within
     * the slack: left as measured. */
    assert_int_equal(tk_strips_per_warp(5952, 18, SLOTS_H200), 4);
    /* a 1 x 70 batch's token linear 70 x [16 -> 15872]: 62 blocks at 4, a
     * fraction of the GPU; one strip a warp gives 248. */
    assert_int_equal(tk_strips_per_warp(496, 2, SLOTS_H200), 1);
}

static void test_degenerate_inputs(void **state)
{
    (void)state;
    /* slots below 1 count as 1; a single strip; huge grids stay in range. */
    int spw = tk_strips_per_warp(100, 3, 0);
    assert_true(spw >= 1 && spw <= TK_MAX_SPW);
    assert_int_equal(tk_strips_per_warp(1, 1, SLOTS_H200), 1);
    spw = tk_strips_per_warp(1L << 26, 1L << 16, SLOTS_H200);
    assert_true(spw >= 1 && spw <= TK_MAX_SPW);
}

/* Every strip taken by exactly one (block, warp, step), no column of
 * blocks without a strip. */
static void check_cover(long strips, int spw, unsigned char *seen)
{
    long cols = tk_col_blocks(strips, spw);
    memset(seen, 0, (size_t)strips);
    for (long bx = 0; bx < cols; bx++) {
        int any = 0;
        for (int w = 0; w < TK_WARPS; w++)
            for (int sp = 0; sp < spw; sp++) {
                long s = tk_strip_of(bx, w, sp, spw);
                assert_true(s >= 0);
                if (s >= strips)
                    continue;
                assert_int_equal(seen[s], 0);
                seen[s] = 1;
                any = 1;
            }
        assert_true(any);
    }
    for (long s = 0; s < strips; s++)
        assert_int_equal(seen[s], 1);
}

static void test_sweep(void **state)
{
    (void)state;
    const long strip_counts[] = {1, 3, 4, 15, 16, 17, 63, 64, 65, 255, 496, 1000, 5952, 9400};
    const long row_tiles[] = {1, 2, 3, 17, 18, 64};
    const long slot_counts[] = {1, 7, 114 * 4, 132 * 4, 132 * 5, 132 * 6, 132 * 16};
    unsigned char *seen = malloc(9400);
    assert_non_null(seen);
    long n = 0;
    for (size_t a = 0; a < sizeof strip_counts / sizeof *strip_counts; a++)
        for (size_t b = 0; b < sizeof row_tiles / sizeof *row_tiles; b++)
            for (size_t c = 0; c < sizeof slot_counts / sizeof *slot_counts; c++) {
                long st = strip_counts[a], rt = row_tiles[b], sl = slot_counts[c];
                int spw = tk_strips_per_warp(st, rt, sl);
                assert_true(spw >= 1 && spw <= TK_MAX_SPW);
                double least = cost(st, rt, sl, 1);
                for (int k = 2; k <= TK_MAX_SPW; k++)
                    if (cost(st, rt, sl, k) < least)
                        least = cost(st, rt, sl, k);
                assert_true(cost(st, rt, sl, spw) <= least * (1.0 + TK_SPW_SLACK));
                assert_true(cost(st, rt, sl, spw) <= cost(st, rt, sl, TK_SPW_HOME));
                check_cover(st, spw, seen);
                n++;
            }
    free(seen);
    assert_true(n == 14 * 6 * 7);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bench_model_shapes),
        cmocka_unit_test(test_degenerate_inputs),
        cmocka_unit_test(test_sweep),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
