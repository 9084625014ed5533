/* gemm_cpu.c - the register-tile matmul core of the CPU backend.
 *
 * Why this exists: linear, lce and both halves of attention are small
 * matmuls; they all go through this one tile so that they share its
 * determinism argument and its speed. The tile is an outer-product update:
 * for each k (in increasing order) one scalar of each of GEMM_MR rows of A
 * times one contiguous GEMM_NR-vector of B is added to GEMM_MR x GEMM_NR
 * accumulators. The vector direction is the output column, not k, so each
 * output element keeps a single fp32 accumulator with a fixed summation order
 * (a sequential sum over k) while the compiler still vectorizes the j loop
 * (C with GNU vector types, no intrinsics: SSE by default, AVX with -march).
 * Nothing here depends on how many rows the caller has.
 */
#include <string.h>

#include "cpu_internal.h"

/* The accumulators are v4f (cpu_internal.h) rather than plain arrays left
 * to the auto-vectorizer: gcc -O2 keeps plain-array accumulators of this tile
 * in memory, while v4f keeps all 4 x 8 of them in eight registers. The
 * arithmetic per lane is the scalar multiply then add of tile_part, so both
 * tiles give identical bits for an element. */
#define LD V4_LD
#define ST V4_ST

/* Full-width tile. */
static void tile_full(const float *const a[GEMM_MR], const float *b, size_t ldb, int kn,
                      float *const c[GEMM_MR], int load)
{
    v4f c00 = {0}, c01 = {0}, c10 = {0}, c11 = {0}, c20 = {0}, c21 = {0}, c30 = {0}, c31 = {0};
    if (load) {
        LD(c00, c[0]); LD(c01, c[0] + 4);
        LD(c10, c[1]); LD(c11, c[1] + 4);
        LD(c20, c[2]); LD(c21, c[2] + 4);
        LD(c30, c[3]); LD(c31, c[3] + 4);
    }
    const float *a0 = a[0], *a1 = a[1], *a2 = a[2], *a3 = a[3];
    for (int k = 0; k < kn; k++) {
        const float *bk = b + (size_t)k * ldb;
        v4f b0, b1;
        LD(b0, bk);
        LD(b1, bk + 4);
        const float x0 = a0[k], x1 = a1[k], x2 = a2[k], x3 = a3[k];
        c00 += x0 * b0; c01 += x0 * b1;
        c10 += x1 * b0; c11 += x1 * b1;
        c20 += x2 * b0; c21 += x2 * b1;
        c30 += x3 * b0; c31 += x3 * b1;
    }
    ST(c[0], c00); ST(c[0] + 4, c01);
    ST(c[1], c10); ST(c[1] + 4, c11);
    ST(c[2], c20); ST(c[2] + 4, c21);
    ST(c[3], c30); ST(c[3] + 4, c31);
}

/* Narrow tile (nr < GEMM_NR: the last columns of an output whose width is
 * not a multiple of GEMM_NR). Same per-element operations as tile_full: a
 * multiply then an add per k, in increasing k, from 0 or the loaded value. */
static void tile_part(const float *const a[GEMM_MR], const float *b, size_t ldb, int kn, int nr,
                      float *const c[GEMM_MR], int load)
{
    float acc[GEMM_MR][GEMM_NR] = {{0}};
    if (load)
        for (int i = 0; i < GEMM_MR; i++)
            memcpy(acc[i], c[i], (size_t)nr * sizeof(float));
    for (int k = 0; k < kn; k++) {
        const float *bk = b + (size_t)k * ldb;
        for (int i = 0; i < GEMM_MR; i++) {
            const float x = a[i][k];
            for (int j = 0; j < nr; j++)
                acc[i][j] += x * bk[j];
        }
    }
    for (int i = 0; i < GEMM_MR; i++)
        memcpy(c[i], acc[i], (size_t)nr * sizeof(float));
}

void gemm_cpu_tile(const float *const a[GEMM_MR], const float *b, size_t ldb, int kn, int nr,
                   float *const c[GEMM_MR], int load)
{
    _Static_assert(GEMM_MR == 4 && GEMM_NR == 8, "tile_full is written for a 4 x 8 tile");
    if (nr == GEMM_NR)
        tile_full(a, b, ldb, kn, c, load);
    else
        tile_part(a, b, ldb, kn, nr, c, load);
}
