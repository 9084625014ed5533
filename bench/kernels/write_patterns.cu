/* write_patterns.cu - how fast the H200 takes a large pitched write, by
 * store pattern: the question behind linear_tk's c_r1 shape.
 *
 * Why this exists: the bench model's c_r1 linear ([1120, 16] x [16,
 * 190464] into E_cand's pitch, 426 MB written) ran at 2.5-2.8 TB/s in
 * linear_tk and cuBLAS while a 1 GiB memset writes 4.5 TB/s (bench_ops'
 * ceilings line). Each pattern below writes the same bytes at c_r1's
 * geometry without arithmetic, so the rate a kernel could reach with that
 * store order is measured apart from its math:
 *   memset2d   cudaMemset2DAsync over the pitched region (the ceiling)
 *   tk         linear_tk's order: a warp stores 8 rows x 64 B per
 *              instruction, 4 warps on adjacent 32-column strips, blocks
 *              (512 columns, 32 rows), column groups fastest
 *   row512     blocks (512 columns, 16 rows); a warp stores one row's 512
 *              contiguous bytes per instruction (a staged tile's order)
 *   row8k      blocks (4096 columns, 16 rows), each walking its columns in
 *              512-column steps, one row's 512 B per instruction
 *   seq        blocks (4096 columns of one row): memset's order
 *   tk 16 warps  tk's order at linear_tk's occupancy (4 blocks of 4 warps
 *              an SM, held down by unused shared memory)
 * then linear_tk's kernel itself (bias and ReLU, K 16) with its rows per
 * warp (MI = 1, 2, 4), blocks an SM (B) and strips a warp (S, default 4).
 * Prints TB/s (median of 20 after 3 warm-ups). Outcomes: bench/kernels/
 * NOTES.md ("Where c_r1's write rate goes").
 *
 *   write_patterns [--rows N] [--cols N] [--pitch N]   (bf16 elements)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/kernels/bench_util.cuh"
#include "kernels/cuda/linear_tk.cu" /* its kernel template, launched directly below */

__global__ void k_tk(uint16_t *y, int rows, int cols, long ldy)
{
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int r0 = blockIdx.y * 32, strip0 = blockIdx.x * 16 + warp;
    const uint4 v = make_uint4(blockIdx.x, r0, 0, 0);
    for (int sp = 0; sp < 4; sp++) {
        const int n0 = (strip0 + sp * 4) * 32;
        for (int i = 0; i < 2; i++)
            for (int h = 0; h < 2; h++) {
                const int r = r0 + 16 * i + g + 8 * h, n = n0 + 8 * t;
                if (r < rows && n < cols)
                    *(uint4 *)(y + (size_t)r * ldy + n) = v;
            }
    }
}

/* Blocks (span columns, 16 rows): 4 warps, 4 rows each, one row's 256
 * columns (512 B) per store instruction, spans walked in 256-column steps. */
template <int SPAN>
__global__ void k_rows(uint16_t *y, int rows, int cols, long ldy)
{
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r0 = blockIdx.y * 16, c0 = blockIdx.x * SPAN;
    const uint4 v = make_uint4(blockIdx.x, r0, 0, 0);
    for (int c = c0; c < c0 + SPAN; c += 512)
        for (int k = 0; k < 4; k++) {
            const int r = r0 + 4 * warp + k;
            for (int half = 0; half < 2; half++) {
                const int n = c + 256 * half + 8 * lane;
                if (r < rows && n < cols)
                    *(uint4 *)(y + (size_t)r * ldy + n) = v;
            }
        }
}

/* Blocks (4096 columns of one row). */
__global__ void k_seq(uint16_t *y, int rows, int cols, long ldy)
{
    const int r = blockIdx.y, c0 = blockIdx.x * 4096;
    const uint4 v = make_uint4(blockIdx.x, r, 0, 0);
    for (int n = c0 + 8 * (int)threadIdx.x; n < c0 + 4096; n += 8 * (int)blockDim.x)
        if (n < cols)
            *(uint4 *)(y + (size_t)r * ldy + n) = v;
}

__global__ void k_fill(uint16_t *p, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = (uint16_t)(0x3c00 ^ ((uint32_t)i * 2654435761u >> 7 & 0x83ff)) & 0xbbff;
}

/* linear_tk at c_r1's shape: k_linear_tk<bf16, KS 1, MI, ReLU, MINB>, with
 * production's grid (4 warps, 4 strips a warp, 16 x MI rows a block). */
template <int MI, int MINB, int STR = TK_STRIPS>
static void tk_math(cudaStream_t st, const __nv_bfloat16 *x, const __nv_bfloat16 *w,
                    const __nv_bfloat16 *b, uint16_t *y, int rows, int cols, long ldy)
{
    const int strips = (cols + 31) / 32, per = TK_WARPS * STR;
    dim3 grid((unsigned)((strips + per - 1) / per), (unsigned)((rows + 16 * MI - 1) / (16 * MI)));
    k_linear_tk<__nv_bfloat16, 1, MI, true, MINB, STR><<<grid, TK_WARPS * 32, 0, st>>>(
        x, 16, rows, w, 16, 16, cols, b, (__nv_bfloat16 *)y, (int)ldy);
}

int main(int argc, char **argv)
{
    int rows = 1120, cols = 190464;
    long pitch = 223232;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--rows")) rows = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--cols")) cols = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--pitch")) pitch = atol(argv[i + 1]);
        else { fprintf(stderr, "usage: %s [--rows N] [--cols N] [--pitch N]\n", argv[0]); return 2; }
    }
    if (cols % 8 || pitch % 8 || pitch < cols) { fprintf(stderr, "cols, pitch: multiples of 8, pitch >= cols\n"); return 2; }
    uint16_t *y;
    CK(cudaMalloc(&y, (size_t)rows * pitch * 2));
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    const double bytes = (double)rows * cols * 2;
    uint16_t *xw;
    const size_t nx = (size_t)rows * 16, nw = (size_t)cols * 16 + cols;
    CK(cudaMalloc(&xw, (nx + nw) * 2));
    k_fill<<<1024, 256, 0, st>>>(xw, nx + nw);
    const __nv_bfloat16 *x = (const __nv_bfloat16 *)xw, *w = x + nx, *bias = w + (size_t)cols * 16;
    /* stores alone at linear_tk's occupancy: 56 KiB of (unused) shared
     * memory a block leaves 4 blocks (16 warps) an SM */
    CK(cudaFuncSetAttribute(k_tk, cudaFuncAttributeMaxDynamicSharedMemorySize, 56 << 10));
    struct { const char *name; std::function<void()> f; } p[] = {
        {"memset2d", [&] { CK(cudaMemset2DAsync(y, pitch * 2, 0, (size_t)cols * 2, rows, st)); }},
        {"tk", [&] { k_tk<<<dim3((cols + 511) / 512, (rows + 31) / 32), 128, 0, st>>>(y, rows, cols, pitch); }},
        {"row512", [&] { k_rows<512><<<dim3((cols + 511) / 512, (rows + 15) / 16), 128, 0, st>>>(y, rows, cols, pitch); }},
        {"row8k", [&] { k_rows<4096><<<dim3((cols + 4095) / 4096, (rows + 15) / 16), 128, 0, st>>>(y, rows, cols, pitch); }},
        {"seq", [&] { k_seq<<<dim3((cols + 4095) / 4096, rows), 128, 0, st>>>(y, rows, cols, pitch); }},
        {"tk 16 warps", [&] { k_tk<<<dim3((cols + 511) / 512, (rows + 31) / 32), 128, 56 << 10, st>>>(y, rows, cols, pitch); }},
        {"mma MI4 B4", [&] { tk_math<4, 4>(st, x, w, bias, y, rows, cols, pitch); }},
        {"mma MI2 B4", [&] { tk_math<2, 4>(st, x, w, bias, y, rows, cols, pitch); }},
        {"mma MI1 B8", [&] { tk_math<1, 8>(st, x, w, bias, y, rows, cols, pitch); }},
        {"mma MI4 B8", [&] { tk_math<4, 8>(st, x, w, bias, y, rows, cols, pitch); }},
        {"mma MI2 B8", [&] { tk_math<2, 8>(st, x, w, bias, y, rows, cols, pitch); }},
        {"mma MI2 B12", [&] { tk_math<2, 12>(st, x, w, bias, y, rows, cols, pitch); }},
        {"mma MI1 B16", [&] { tk_math<1, 16>(st, x, w, bias, y, rows, cols, pitch); }},
        {"mma MI2 B4 S16", [&] { tk_math<2, 4, 16>(st, x, w, bias, y, rows, cols, pitch); }},
        {"mma MI2 B4 S64", [&] { tk_math<2, 4, 64>(st, x, w, bias, y, rows, cols, pitch); }},
    };
    printf("write_patterns: %d rows x %d bf16 columns, pitch %ld (%.0f MB written)\n", rows, cols,
           pitch, bytes / 1e6);
    for (auto &q : p) {
        double ms = median_ms(st, q.f, 3, 20);
        CK(cudaGetLastError());
        printf("  %-12s %8.1f us  %5.2f TB/s\n", q.name, ms * 1e3, bytes / (ms * 1e-3) / 1e12);
    }
    CK(cudaFree(y));
    CK(cudaFree(xw));
    return 0;
}
