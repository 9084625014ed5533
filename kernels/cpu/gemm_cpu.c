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

/* Four accumulators as a GNU C vector type rather than hoping for
 * auto-vectorization: gcc -O2's vectorizer leaves this tile's accumulators
 * in memory, while 16-byte vectors (the one width every x86-64 and arm64
 * has) keep all 4 x 8 of them in eight registers. Lane-wise vector arithmetic
 * is the same IEEE single-precision multiply and add as the scalar code in
 * tile_part, so both tiles give identical bits for an element. */
typedef float v4f __attribute__((vector_size(16)));

/* Unaligned load/store (buffers are aligned, but row strides need not be). */
#define LD(v, p) memcpy(&(v), (p), sizeof(v4f))
#define ST(p, v) memcpy((p), &(v), sizeof(v4f))

/* Full-width tile. */
static void tile_full(const float *const a[GEMM_MR], const float *b, size_t ldb, int kn,
                      float acc[GEMM_MR][GEMM_NR])
{
    v4f c00, c01, c10, c11, c20, c21, c30, c31;
    LD(c00, acc[0]); LD(c01, acc[0] + 4);
    LD(c10, acc[1]); LD(c11, acc[1] + 4);
    LD(c20, acc[2]); LD(c21, acc[2] + 4);
    LD(c30, acc[3]); LD(c31, acc[3] + 4);
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
    ST(acc[0], c00); ST(acc[0] + 4, c01);
    ST(acc[1], c10); ST(acc[1] + 4, c11);
    ST(acc[2], c20); ST(acc[2] + 4, c21);
    ST(acc[3], c30); ST(acc[3] + 4, c31);
}

/* Narrow tile (nr < GEMM_NR: the last columns of an output whose width is
 * not a multiple of GEMM_NR). Same per-element operations as tile_full: a
 * multiply then an add per k, in increasing k. */
static void tile_part(const float *const a[GEMM_MR], const float *b, size_t ldb, int kn, int nr,
                      float acc[GEMM_MR][GEMM_NR])
{
    for (int k = 0; k < kn; k++) {
        const float *bk = b + (size_t)k * ldb;
        for (int i = 0; i < GEMM_MR; i++) {
            const float x = a[i][k];
            for (int j = 0; j < nr; j++)
                acc[i][j] += x * bk[j];
        }
    }
}

void gemm_cpu_tile(const float *const a[GEMM_MR], const float *b, size_t ldb, int kn, int nr,
                   float acc[GEMM_MR][GEMM_NR])
{
    _Static_assert(GEMM_MR == 4 && GEMM_NR == 8, "tile_full is written for a 4 x 8 tile");
    if (nr == GEMM_NR)
        tile_full(a, b, ldb, kn, acc);
    else
        tile_part(a, b, ldb, kn, nr, acc);
}
