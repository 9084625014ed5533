/* tk_grid.h - how many 32-column strips each warp of kernels/cuda/
 * linear_tk.cu's kernels takes: k_linear_tk's, so that its grid does not
 * end in a nearly empty wave, and the row sweep's (k_linear_tr, below).
 *
 * (The measurements in this paragraph and the next were taken when
 * k_linear_tk also served the bench model's token linears and c_r1; those
 * shapes, in <= 16 at more than 16 rows, are the row sweep's since
 * 2026-12-06.)
 *
 * Why this exists: with a fixed 4 strips a warp (16 a block), a small
 * launch is a few large blocks on a mostly idle GPU (the bench model's 1 x
 * 70 token linears: 62 blocks on 132 SMs), and a grid just over a whole
 * number of waves ends in a nearly empty one. Each block's time grows with
 * its strips, so a launch costs about waves x strips a warp. This picks
 * the strips a warp from 1 to TK_MAX_SPW by that cost; among those within
 * TK_SPW_SLACK of the least it keeps the one nearest TK_SPW_HOME (the
 * measured default: x's fragments are loaded once a warp and amortized
 * over its strips), so a grid that already fills its waves evenly (c_r1)
 * is left as it was.
 *
 * Measured (H100, 2026-12-06, two calls, bench/RESULTS.md): 1 x 70 with
 * batch graphs 183.0 -> 176.2 and 178.2 -> 172.6 us a batch (the token
 * linear 12.8 -> 8.7 us); the 16 x 70 forward within noise (-2.5 us, then
 * +1.2). The prediction
 * (-10 us at 16 x 70) assumed 4 resident blocks an SM; the fixed-4 kernel
 * had 94 registers, so 5, and its 558-block launches already fit one wave.
 * The runtime strip count costs registers (120: 4 blocks an SM, which
 * linear_tk.cu's occupancy query sees); the 16 x 70 token linear (5
 * strips, 450 blocks) ran 0.5-1.4 us slower than the old 558 (c_r1's
 * 172 -> 167 us beside it was the L2 state left before it, not this).
 *
 * Kept apart from the kernel so tests/unit/test_tk_grid.c runs the same
 * functions on the CPU: the choice, and which strip each warp takes.
 * Header-only, pure functions (C and CUDA).
 */
#ifndef IKBO_KERNELS_CUDA_TK_GRID_H
#define IKBO_KERNELS_CUDA_TK_GRID_H

#ifdef __CUDACC__
#define TK_FN static __host__ __device__ __forceinline__
#else
#define TK_FN static inline
#endif

#define TK_WARPS 4     /* warps a block, each its own strips     */
#define TK_SPW_HOME 4  /* strips a warp unless another is cheaper */
#define TK_MAX_SPW 8   /* the most strips a warp                 */
#define TK_SPW_SLACK 0.05

/* Blocks along the columns for spw strips a warp. */
TK_FN long tk_col_blocks(long strips, int spw)
{
    const long per = (long)TK_WARPS * spw;
    return (strips + per - 1) / per;
}

/* The sp-th strip (0 <= sp < spw) of warp `warp` in column block bx: a
 * block's TK_WARPS x spw strips are consecutive, its warps interleaved
 * (strips past the last are skipped by the kernel). */
TK_FN long tk_strip_of(long bx, int warp, int sp, int spw)
{
    return bx * spw * TK_WARPS + warp + (long)sp * TK_WARPS;
}

/* Strips a warp for strips column strips and row_tiles row tiles, slots =
 * SMs x resident blocks an SM (at least 1). The cost of a choice is
 * ceil(blocks / slots) x spw; ties and near-ties (within TK_SPW_SLACK of
 * the least) go to the choice nearest TK_SPW_HOME, then to fewer strips. */
TK_FN int tk_strips_per_warp(long strips, long row_tiles, long slots)
{
    double cost[TK_MAX_SPW + 1], least = 0;
    if (slots < 1)
        slots = 1;
    for (int spw = 1; spw <= TK_MAX_SPW; spw++) {
        const long blocks = tk_col_blocks(strips, spw) * row_tiles;
        cost[spw] = (double)((blocks + slots - 1) / slots) * spw;
        if (spw == 1 || cost[spw] < least)
            least = cost[spw];
    }
    int best = 0;
    for (int spw = 1; spw <= TK_MAX_SPW; spw++) {
        if (cost[spw] > least * (1.0 + TK_SPW_SLACK))
            continue;
        const int d = spw > TK_SPW_HOME ? spw - TK_SPW_HOME : TK_SPW_HOME - spw;
        const int db = best > TK_SPW_HOME ? best - TK_SPW_HOME : TK_SPW_HOME - best;
        if (!best || d < db)
            best = spw;
    }
    return best;
}

/* ---- The row sweep (linear_tk.cu's k_linear_tr: in <= 16, more than 16
 * rows). A warp holds spw adjacent strips' W (1 to TK_SWEEP_MAX_SPW) and
 * walks one chunk of row tiles; warps next to each other take adjacent
 * column groups, so the GPU's stores move down the rows together and each
 * row is written in long contiguous runs. Measured (H100, write_patterns
 * at c_r1's shape, 2026-12-06, bench/RESULTS.md): 147 us against
 * k_linear_tk's 169 and memset's 135; at 2, 3 or 4 strips a warp (one
 * wave) the same, at 1 (two waves) 174. A first version split the work
 * items into contiguous ranges, each warp walking its own rows at its own
 * place, so a row's neighbouring 128-byte lines were written by other
 * warps at other times: its stores alone took 156 us against 137 in
 * k_linear_tk's order, and c_r1 164. */
#define TK_SWEEP_MAX_SPW 4

typedef struct {
    int spw;          /* strips a warp                          */
    long col_groups;  /* ceil(strips / spw)                     */
    long chunk_tiles; /* row tiles a warp walks (its last fewer) */
    long warps;       /* col_groups x row chunks                */
} tk_sweep;

/* The sweep for strips x row_tiles given, for each spw in 1 ..
 * TK_SWEEP_MAX_SPW, the warps resident at once (slots[spw]; slots[0]
 * unused): the fewest strips a warp whose column groups fit one wave
 * (every warp resident from the start, so all of them move down the rows
 * together), else the most, in several waves; then the row tiles cut into
 * as many chunks as that wave still holds (at least one). only_spw > 0
 * imposes the strips a warp (bench/kernels/write_patterns.cu). */
TK_FN tk_sweep tk_sweep_choose(long strips, long row_tiles, const long *slots, int only_spw)
{
    int spw = TK_SWEEP_MAX_SPW;
    if (only_spw > 0)
        spw = only_spw < TK_SWEEP_MAX_SPW ? only_spw : TK_SWEEP_MAX_SPW;
    else
        for (int s = 1; s <= TK_SWEEP_MAX_SPW; s++)
            if ((strips + s - 1) / s <= slots[s]) {
                spw = s;
                break;
            }
    const long cg = (strips + spw - 1) / spw;
    long chunks = slots[spw] / cg;
    if (chunks < 1)
        chunks = 1;
    if (chunks > row_tiles)
        chunks = row_tiles;
    const long tiles = (row_tiles + chunks - 1) / chunks;
    chunks = (row_tiles + tiles - 1) / tiles;
    return (tk_sweep){spw, cg, tiles, cg * chunks};
}

/* Where warp gw (0 <= gw < sw->warps) of a sweep starts: its first strip
 * and first row tile (it takes sw->spw strips and at most sw->chunk_tiles
 * row tiles from there; strips and tiles past the ends are skipped). */
TK_FN void tk_sweep_place(const tk_sweep *sw, long gw, long *strip0, long *rt0)
{
    *strip0 = (gw % sw->col_groups) * sw->spw;
    *rt0 = (gw / sw->col_groups) * sw->chunk_tiles;
}

#endif
