/* test_tk_grid.c - linear_tk.cu's grids (kernels/cuda/tk_grid.h): how many
 * strips a warp takes, and which; and the row sweep's choice and placement.
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
 * The sweep: the fewest strips a warp that fit one wave at the bench
 * shapes and at the edge of a wave, and every (strip, row tile) taken by
 * exactly one warp through tk_sweep_place.
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
    /* user MLP 16 x [32 -> 300800]: 9400 strips, one row tile; 588 blocks
     * at 4 strips a warp (a second wave of 60). */
    assert_int_equal(tk_strips_per_warp(9400, 1, SLOTS_H200), 5);
    /* 16 rows at in 16 (k_linear_tk serves rows <= 16 at any in; more
     * rows at in <= 16 go to the row sweep below): 70 candidates' worth
     * of columns, one row tile. */
    assert_int_equal(tk_strips_per_warp(496, 1, SLOTS_H200), 1);
    /* a grid that already fills its waves evenly keeps the home 4: 5952
     * strips x 18 row tiles (c_r1's grid before the row sweep), 12.7
     * waves at 4, as cheap as any within the slack */
    assert_int_equal(tk_strips_per_warp(5952, 18, SLOTS_H200), TK_SPW_HOME);
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

/* The row sweep's resident warps for spw 1 .. 4 on an H100 as built on
 * 2026-12-06 (54, 77, 92 and 128 registers: 9, 6, 5 and 4 blocks of 4
 * warps an SM, 132 SMs). */
static const long SWEEP_H100[TK_SWEEP_MAX_SPW + 1] = {0, 132 * 9 * 4, 132 * 6 * 4, 132 * 5 * 4,
                                                      132 * 4 * 4};

static void test_row_sweep_bench_shapes(void **state)
{
    (void)state;
    static const struct {
        long strips, row_tiles;
        int only, spw;
        long chunk_tiles, warps;
    } cases[] = {
        /* c_r1 1120 x [16 -> 190464]: 5952 strips do not fit one wave of
         * 4752 at one strip a warp; two a warp fit 3168: 2976 warps, each
         * down all 70 row tiles. */
        {5952, 70, 0, 2, 70, 2976},
        /* the token linear 1120 x [16 -> 15872]: 496 strips, one a warp,
         * the rows cut in 9 chunks of 8 tiles. */
        {496, 70, 0, 1, 8, 496 * 9},
        /* 1 x 70: c_r1 over 5 row tiles; the token linear a tile a warp */
        {5952, 5, 0, 2, 5, 2976},
        {496, 5, 0, 1, 1, 496 * 5},
        /* the edge of one wave at one strip a warp */
        {132 * 9 * 4, 70, 0, 1, 70, 132 * 9 * 4},
        {132 * 9 * 4 + 1, 70, 0, 2, 70, (132 * 9 * 4 + 2) / 2},
        /* imposed (write_patterns' rows) */
        {5952, 70, 4, 4, 70, 1488},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const tk_sweep sw = tk_sweep_choose(cases[i].strips, cases[i].row_tiles, SWEEP_H100,
                                            cases[i].only);
        assert_int_equal(sw.spw, cases[i].spw);
        assert_int_equal(sw.chunk_tiles, cases[i].chunk_tiles);
        assert_int_equal(sw.warps, cases[i].warps);
        assert_int_equal(sw.col_groups, (cases[i].strips + sw.spw - 1) / sw.spw);
    }
}

/* Every (strip, row tile) taken by exactly one warp of the sweep, through
 * the kernel's own placement; the strips a warp are the fewest that fit
 * one wave, and then the warps fit it. */
static void check_sweep(long strips, long row_tiles, const long *slots, int only,
                        unsigned char *seen)
{
    const tk_sweep sw = tk_sweep_choose(strips, row_tiles, slots, only);
    assert_true(sw.spw >= 1 && sw.spw <= TK_SWEEP_MAX_SPW);
    assert_true(sw.chunk_tiles >= 1 && sw.chunk_tiles <= row_tiles);
    assert_int_equal(sw.col_groups, (strips + sw.spw - 1) / sw.spw);
    if (only)
        assert_int_equal(sw.spw, only);
    else {
        for (int s = 1; s < sw.spw; s++)
            assert_true((strips + s - 1) / s > slots[s]);
        if (sw.spw < TK_SWEEP_MAX_SPW)
            assert_true(sw.col_groups <= slots[sw.spw]);
        if (sw.col_groups <= slots[sw.spw])
            assert_true(sw.warps <= slots[sw.spw]);
    }
    memset(seen, 0, (size_t)(strips * row_tiles));
    for (long gw = 0; gw < sw.warps; gw++) {
        long s0, t0, any = 0;
        tk_sweep_place(&sw, gw, &s0, &t0);
        assert_true(s0 >= 0 && t0 >= 0 && s0 < strips && t0 < row_tiles); /* no idle warp */
        for (long s = s0; s < s0 + sw.spw && s < strips; s++)
            for (long t = t0; t < t0 + sw.chunk_tiles && t < row_tiles; t++) {
                assert_int_equal(seen[s * row_tiles + t], 0);
                seen[s * row_tiles + t] = 1;
                any++;
            }
        assert_true(any > 0);
    }
    for (long i = 0; i < strips * row_tiles; i++)
        assert_int_equal(seen[i], 1);
}

static void test_row_sweep_cover(void **state)
{
    (void)state;
    const long strip_counts[] = {1, 2, 3, 5, 64, 65, 496, 1000, 5952};
    const long row_tiles[] = {1, 2, 5, 7, 70, 71};
    const long scales[] = {1, 3, 100, 1000}; /* slots from tiny to large */
    unsigned char *seen = malloc(5952 * 71);
    assert_non_null(seen);
    for (size_t a = 0; a < sizeof strip_counts / sizeof *strip_counts; a++)
        for (size_t b = 0; b < sizeof row_tiles / sizeof *row_tiles; b++)
            for (size_t c = 0; c < sizeof scales / sizeof *scales; c++) {
                long slots[TK_SWEEP_MAX_SPW + 1] = {0};
                for (int s = 1; s <= TK_SWEEP_MAX_SPW; s++)
                    slots[s] = scales[c] * (TK_SWEEP_MAX_SPW + 1 - s);
                for (int only = 0; only <= TK_SWEEP_MAX_SPW; only++)
                    check_sweep(strip_counts[a], row_tiles[b], slots, only, seen);
            }
    check_sweep(5952, 70, SWEEP_H100, 0, seen);
    free(seen);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bench_model_shapes),
        cmocka_unit_test(test_degenerate_inputs),
        cmocka_unit_test(test_sweep),
        cmocka_unit_test(test_row_sweep_bench_shapes),
        cmocka_unit_test(test_row_sweep_cover),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
