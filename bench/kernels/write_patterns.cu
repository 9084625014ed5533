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
 * warp (MI = 1, 2, 4), blocks an SM (B) and strips a warp (S, default 4),
 * and "tma tiles": the same math with each 16 x 64 tile staged by stmatrix
 * and written by a TMA tensor store (production for one commit, 8316ea0;
 * lost: 193.6 us in bench_ops against cuBLASLt's 159.6), and linear_tk
 * MI 2 B 4 with parts of its work taken out (k_linear_tk's OPT bits: no
 * W loads, no x loads, no MMAs, and combinations; same stores), and the
 * "occ" rows: the production kernel (evict-first stores, the model's
 * operands in allocations of their own) held to 3, 4 or 5 blocks an SM by
 * unused shared memory, built for 4 and for 5 (registers), beside the same
 * two uncapped ("own"); and the "tr" rows: the row sweep (k_linear_tr,
 * production for in <= 16 at more rows since 2026-12-06) launched as
 * production does, with each strips a warp imposed, without the
 * evict-first hint, and with parts taken out as above. Prints TB/s (median of 20 after 3 warm-ups). Outcomes: bench/kernels/
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
#include "kernels/cuda/tma_util.cuh"

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

/* Positive bf16 bit patterns (write_patterns' own operands, x, W and the
 * bias in one allocation; the model's placement and signs are filled by
 * bench_util's fill into allocations of their own below). */
__global__ void k_fill_positive(uint16_t *p, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = (uint16_t)(0x3c00 ^ ((uint32_t)i * 2654435761u >> 7 & 0x83ff)) & 0xbbff;
}

/* Unused dynamic shared memory a block so that at most `blocks` fit an SM
 * (each block also holds 1 KiB of the SM's 228 for the system); 0: none. */
static int cap_smem(int blocks) { return blocks ? ((228 << 10) / blocks - (1 << 10)) & ~1023 : 0; }

/* linear_tk at c_r1's shape: k_linear_tk<bf16, KS 1, MI, ReLU, MINB>, with
 * production's grid (4 warps, 4 strips a warp, 16 x MI rows a block);
 * CAP > 0 holds it to at most CAP blocks an SM with unused shared memory
 * (the "occ" rows: occupancy apart from the registers' code). */
template <int MI, int MINB, int STR = TK_SPW_HOME, int OPT = 0, int CAP = 0>
static void tk_math(cudaStream_t st, const __nv_bfloat16 *x, const __nv_bfloat16 *w,
                    const __nv_bfloat16 *b, uint16_t *y, int rows, int cols, long ldy)
{
    const int strips = (cols + 31) / 32, per = TK_WARPS * STR, smem = cap_smem(CAP);
    dim3 grid((unsigned)((strips + per - 1) / per), (unsigned)((rows + 16 * MI - 1) / (16 * MI)));
    auto k = k_linear_tk<__nv_bfloat16, 1, MI, true, MINB, OPT>;
    if (smem)
        CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    k<<<grid, TK_WARPS * 32, smem, st>>>(x, 16, rows, w, 16, 16, cols, b, (__nv_bfloat16 *)y,
                                         (int)ldy, STR);
}

/* linear_tk's row sweep at c_r1's shape, launched as production does
 * (tr_launch: the strips a warp chosen, or SPW > 0 imposed). */
template <int OPT, int SPW = 0>
static void tr_math(cudaStream_t st, const __nv_bfloat16 *x, const __nv_bfloat16 *w,
                    const __nv_bfloat16 *b, uint16_t *y, int rows, int cols, long ldy)
{
    int dev = 0, sms = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    tr_launch<__nv_bfloat16, OPT>(st, sms, x, 16, rows, w, 16, 16, cols, b, true,
                                  (__nv_bfloat16 *)y, (int)ldy, SPW);
}

/* Blocks an SM the occupancy API gives tk_math<MI, MINB, .., OPT, CAP>. */
template <int MI, int MINB, int OPT, int CAP>
static int tk_occupancy()
{
    int n = 0, smem = cap_smem(CAP);
    auto k = k_linear_tk<__nv_bfloat16, 1, MI, true, MINB, OPT>;
    if (smem)
        CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k, TK_WARPS * 32, smem));
    return n;
}

/* "tma tiles" (lost, 2026-12-04): at many rows linear_tk's register-stored kernel writes at ~2.7 TB/s (c_r1,
 * 1120 x [16 -> 190464], 155-160 us; cuBLASLt the same) where the same
 * bytes stored alone go at 4.1-4.4 (bench/kernels/NOTES.md). Here the
 * warps never store to global memory: a warp owns a strip of TT_COLS
 * columns (W and bias loaded once into registers) and walks TT_TILES row
 * tiles of 16, each tile's 8 MMAs (k 16) rounded, staged by stmatrix into
 * a 128B-swizzled 2 KiB buffer (TT_BUF a warp) and written by one TMA
 * tensor store (16 rows x 128 B, clipped at the tensor's edge), so a
 * warp's next tile runs while the copy engine writes the last one. Blocks:
 * TT_WARPS warps on adjacent strips of one row chunk, strip groups
 * fastest. x's fragments for the warp's tiles are loaded once, element by
 * element (any stride and alignment). ReLU fused as in k_linear_tk. */
#define TT_COLS 64
#define TT_TILES 8
#define TT_WARPS 4
#define TT_BUF 2
#define TT_BOX_BYTES (16 * TT_COLS * 2)

template <typename T, bool RELU>
__global__ void __launch_bounds__(TT_WARPS * 32)
    k_linear_tma(const __grid_constant__ CUtensorMap ty, const T *__restrict__ x, int ldx,
                 int rows, const T *__restrict__ w, int ldw, int in, int out,
                 const T *__restrict__ bias)
{
    __shared__ __align__(1024) unsigned char stg[TT_WARPS][TT_BUF][TT_BOX_BYTES];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int strips = (out + TT_COLS - 1) / TT_COLS;
    const int groups = (strips + TT_WARPS - 1) / TT_WARPS;
    const int strip = (int)(blockIdx.x % groups) * TT_WARPS + warp;
    const int r0 = (int)(blockIdx.x / groups) * 16 * TT_TILES;
    if (strip >= strips)
        return; /* no block-wide barrier below */
    const int n0 = strip * TT_COLS;
    tk_strip<T, 1> sw[2]; /* columns n0 .. + 31 and n0 + 32 .. + 63 */
    tk_load(sw[0], w, ldw, bias, out, n0, g, t);
    tk_load(sw[1], w, ldw, bias, out, n0 + 32, g, t);
    const int nt = min(TT_TILES, (rows - r0 + 15) / 16);
    uint32_t a[TT_TILES][4];
#pragma unroll
    for (int i = 0; i < TT_TILES; i++) {
        const int r = r0 + 16 * i + g;
        a[i][0] = x_pair(x, ldx, rows, in, r, 4 * t);
        a[i][1] = x_pair(x, ldx, rows, in, r + 8, 4 * t);
        a[i][2] = x_pair(x, ldx, rows, in, r, 4 * t + 2);
        a[i][3] = x_pair(x, ldx, rows, in, r + 8, 4 * t + 2);
    }
#pragma unroll
    for (int i = 0; i < TT_TILES; i++) {
        if (i >= nt)
            break;
        float c[8][4];
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const uint2 b = sw[j >> 2].b[j & 3][0];
            const uint32_t bb[2] = {b.x, b.y};
#pragma unroll
            for (int q = 0; q < 4; q++)
                c[j][q] = 0.0f;
            mma16816<T>(c[j], a[i], bb);
        }
        unsigned char *buf = stg[warp][i % TT_BUF];
        if (i >= TT_BUF) { /* the store that read this buffer last is done reading */
            if (lane == 0)
                bulk_wait_read<TT_BUF - 1>();
            __syncwarp();
        }
        /* stmatrix k of pair jp: n8 block 2 jp + (k >> 1), rows 8 (k & 1) ..
         * + 7; lane 8k + i names its row i (16-byte chunk = the n8 block,
         * swizzled by the row as the tensor map's 128B mode reads it). */
#pragma unroll
        for (int jp = 0; jp < 4; jp++) {
            uint32_t p[4];
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const int j = 2 * jp + (k >> 1), h = k & 1;
                const float *bj = sw[j >> 2].bias[j & 3];
                float p0 = c[j][2 * h] + bj[0], p1 = c[j][2 * h + 1] + bj[1];
                if (RELU) {
                    p0 = fmaxf(p0, 0.0f);
                    p1 = fmaxf(p1, 0.0f);
                }
                p[k] = pack2<T>(p0, p1);
            }
            const int k = lane >> 3, row = 8 * (k & 1) + (lane & 7), chunk = 2 * jp + (k >> 1);
            stmatrix_x4(buf + row * 128 + ((chunk ^ (row & 7)) << 4), p);
        }
        fence_proxy_async();
        __syncwarp();
        if (lane == 0) {
            tma_store_2d(&ty, buf, n0, r0 + 16 * i);
            bulk_commit();
        }
    }
    if (lane == 0)
        bulk_wait<0>(); /* the buffers outlive the copies that read them */
}

/* Launches k_linear_tma at c_r1's shape (ReLU, k 16) into y's pitch. */
static void tma_math(cudaStream_t st, const __nv_bfloat16 *x, const __nv_bfloat16 *w,
                     const __nv_bfloat16 *b, uint16_t *y, int rows, int cols, long ldy)
{
    CUtensorMap ty;
    const uint64_t dims[2] = {(uint64_t)cols, (uint64_t)rows}, str[1] = {(uint64_t)ldy * 2};
    const uint32_t box[2] = {TT_COLS, 16};
    if (cu_tmap_encode(&ty, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, y, dims, str, box,
                       CU_TENSOR_MAP_SWIZZLE_128B)) {
        fprintf(stderr, "write_patterns: tensor map encoding failed\n");
        exit(1);
    }
    const long strips = (cols + TT_COLS - 1) / TT_COLS, groups = (strips + TT_WARPS - 1) / TT_WARPS;
    const long blocks = groups * ((rows + 16 * TT_TILES - 1) / (16 * TT_TILES));
    k_linear_tma<__nv_bfloat16, true><<<(unsigned)blocks, TT_WARPS * 32, 0, st>>>(
        ty, x, 16, rows, w, 16, 16, cols, b);
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
    k_fill_positive<<<1024, 256, 0, st>>>(xw, nx + nw);
    const __nv_bfloat16 *x = (const __nv_bfloat16 *)xw, *w = x + nx, *bias = w + (size_t)cols * 16;
    /* The model's operands: signed values, x, W and the bias each in an
     * allocation of its own; y 64 KiB into each row (c_r1's columns of
     * E_cand). */
    __nv_bfloat16 *sx, *sw, *sb;
    CK(cudaMalloc(&sx, nx * 2));
    CK(cudaMalloc(&sw, (size_t)cols * 16 * 2));
    CK(cudaMalloc(&sb, (size_t)cols * 2));
    fill(sx, nx, 1, 1.0f);
    fill(sw, (size_t)cols * 16, 2, 1.0f);
    fill(sb, (size_t)cols, 3, 1.0f);
    const long yoff = pitch - cols >= 32768 ? 32768 : 0;
    /* The two apart: signed values in one allocation (as x, w, bias), and
     * the positive values in allocations of their own. */
    __nv_bfloat16 *s1, *px, *pw, *pb;
    CK(cudaMalloc(&s1, (nx + nw) * 2));
    fill(s1, nx + nw, 4, 1.0f);
    CK(cudaMalloc(&px, nx * 2));
    CK(cudaMalloc(&pw, (size_t)cols * 16 * 2));
    CK(cudaMalloc(&pb, (size_t)cols * 2));
    CK(cudaMemcpyAsync(px, x, nx * 2, cudaMemcpyDeviceToDevice, st));
    CK(cudaMemcpyAsync(pw, w, (size_t)cols * 16 * 2, cudaMemcpyDeviceToDevice, st));
    CK(cudaMemcpyAsync(pb, bias, (size_t)cols * 2, cudaMemcpyDeviceToDevice, st));
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
        {"tma tiles", [&] { tma_math(st, x, w, bias, y, rows, cols, pitch); }},
        {"MI2 B4 no W", [&] { tk_math<2, 4, TK_SPW_HOME, TK_DIAG_NO_W>(st, x, w, bias, y, rows, cols, pitch); }},
        {"MI2 B4 no x", [&] { tk_math<2, 4, TK_SPW_HOME, TK_DIAG_NO_X>(st, x, w, bias, y, rows, cols, pitch); }},
        {"MI2 B4 no mma", [&] { tk_math<2, 4, TK_SPW_HOME, TK_DIAG_NO_MMA>(st, x, w, bias, y, rows, cols, pitch); }},
        {"MI2 B4 no W x", [&] { tk_math<2, 4, TK_SPW_HOME, TK_DIAG_NO_W | TK_DIAG_NO_X>(st, x, w, bias, y, rows, cols, pitch); }},
        {"MI2 B4 stores only", [&] { tk_math<2, 4, TK_SPW_HOME, 7>(st, x, w, bias, y, rows, cols, pitch); }},
        {"MI4 B4 cs", [&] { tk_math<4, 4, TK_SPW_HOME, TK_STREAM>(st, x, w, bias, y, rows, cols, pitch); }},
        {"MI2 B4 cs", [&] { tk_math<2, 4, TK_SPW_HOME, TK_STREAM>(st, x, w, bias, y, rows, cols, pitch); }},
        {"MI4 B5 cs", [&] { tk_math<4, 5, TK_SPW_HOME, TK_STREAM>(st, x, w, bias, y, rows, cols, pitch); }},
        {"MI4 B4 no W cs", [&] { tk_math<4, 4, TK_SPW_HOME, TK_STREAM | TK_DIAG_NO_W>(st, x, w, bias, y, rows, cols, pitch); }},
        {"MI4 B4 cs signed", [&] { tk_math<4, 4, TK_SPW_HOME, TK_STREAM>(st, sx, sw, sb, y, rows, cols, pitch); }},
        {"MI4 B4 cs y+64K", [&] { tk_math<4, 4, TK_SPW_HOME, TK_STREAM>(st, x, w, bias, y + yoff, rows, cols, pitch); }},
        {"MI4 B4 cs signed y+64K", [&] { tk_math<4, 4, TK_SPW_HOME, TK_STREAM>(st, sx, sw, sb, y + yoff, rows, cols, pitch); }},
        {"MI4 B4 signed (no cs)", [&] { tk_math<4, 4>(st, sx, sw, sb, y, rows, cols, pitch); }},
        {"MI4 B4 cs signed one alloc", [&] { tk_math<4, 4, TK_SPW_HOME, TK_STREAM>(st, s1, s1 + nx, s1 + nx + (size_t)cols * 16, y, rows, cols, pitch); }},
        {"MI4 B4 cs positive own allocs", [&] { tk_math<4, 4, TK_SPW_HOME, TK_STREAM>(st, px, pw, pb, y, rows, cols, pitch); }},
        {"MI4 B4 cs x own", [&] { tk_math<4, 4, TK_SPW_HOME, TK_STREAM>(st, px, w, bias, y, rows, cols, pitch); }},
        {"MI4 B4 cs W own", [&] { tk_math<4, 4, TK_SPW_HOME, TK_STREAM>(st, x, pw, bias, y, rows, cols, pitch); }},
        {"MI4 B4 cs bias own", [&] { tk_math<4, 4, TK_SPW_HOME, TK_STREAM>(st, x, w, pb, y, rows, cols, pitch); }},
        {"MI4 B4 cs one alloc again", [&] { tk_math<4, 4, TK_SPW_HOME, TK_STREAM>(st, x, w, bias, y, rows, cols, pitch); }},
        /* occupancy apart from the code (c_r1 took 172 -> 167 us in the
         * forward when the runtime strip count took its registers 94 ->
         * 120, 5 -> 4 blocks an SM; NOTES.md 2026-12-06) */
        {"MI4 B4 cs occ3", [&] { tk_math<4, 4, TK_SPW_HOME, TK_STREAM, 3>(st, sx, sw, sb, y, rows, cols, pitch); }},
        {"MI4 B4 cs occ4", [&] { tk_math<4, 4, TK_SPW_HOME, TK_STREAM, 4>(st, sx, sw, sb, y, rows, cols, pitch); }},
        {"MI4 B5 cs occ3", [&] { tk_math<4, 5, TK_SPW_HOME, TK_STREAM, 3>(st, sx, sw, sb, y, rows, cols, pitch); }},
        {"MI4 B5 cs occ4", [&] { tk_math<4, 5, TK_SPW_HOME, TK_STREAM, 4>(st, sx, sw, sb, y, rows, cols, pitch); }},
        {"MI4 B5 cs occ5", [&] { tk_math<4, 5, TK_SPW_HOME, TK_STREAM, 5>(st, sx, sw, sb, y, rows, cols, pitch); }},
        {"MI4 B4 cs own", [&] { tk_math<4, 4, TK_SPW_HOME, TK_STREAM>(st, sx, sw, sb, y, rows, cols, pitch); }},
        {"MI4 B5 cs own", [&] { tk_math<4, 5, TK_SPW_HOME, TK_STREAM>(st, sx, sw, sb, y, rows, cols, pitch); }},
        /* the row sweep (2026-12-06): production's choice, each strips a
         * warp imposed, and parts taken out as above */
        {"tr cs own", [&] { tr_math<TK_STREAM>(st, sx, sw, sb, y, rows, cols, pitch); }},
        {"tr spw1 cs own", [&] { tr_math<TK_STREAM, 1>(st, sx, sw, sb, y, rows, cols, pitch); }},
        {"tr spw2 cs own", [&] { tr_math<TK_STREAM, 2>(st, sx, sw, sb, y, rows, cols, pitch); }},
        {"tr spw3 cs own", [&] { tr_math<TK_STREAM, 3>(st, sx, sw, sb, y, rows, cols, pitch); }},
        {"tr spw4 cs own", [&] { tr_math<TK_STREAM, 4>(st, sx, sw, sb, y, rows, cols, pitch); }},
        {"tr own (no cs)", [&] { tr_math<0>(st, sx, sw, sb, y, rows, cols, pitch); }},
        {"tr cs no W", [&] { tr_math<TK_STREAM | TK_DIAG_NO_W>(st, sx, sw, sb, y, rows, cols, pitch); }},
        {"tr cs no x", [&] { tr_math<TK_STREAM | TK_DIAG_NO_X>(st, sx, sw, sb, y, rows, cols, pitch); }},
        {"tr cs no mma", [&] { tr_math<TK_STREAM | TK_DIAG_NO_MMA>(st, sx, sw, sb, y, rows, cols, pitch); }},
        {"tr cs stores only", [&] { tr_math<TK_STREAM | 7>(st, sx, sw, sb, y, rows, cols, pitch); }},
        {"tr stores only (no cs)", [&] { tr_math<7>(st, sx, sw, sb, y, rows, cols, pitch); }},
        {"tr cs one alloc", [&] { tr_math<TK_STREAM>(st, s1, s1 + nx, s1 + nx + (size_t)cols * 16, y, rows, cols, pitch); }},
    };
    printf("occupancy (blocks an SM): B4 cs %d, B4 cs occ3 %d, occ4 %d; B5 cs %d, B5 cs occ3 %d, occ4 %d, occ5 %d\n",
           tk_occupancy<4, 4, TK_STREAM, 0>(), tk_occupancy<4, 4, TK_STREAM, 3>(),
           tk_occupancy<4, 4, TK_STREAM, 4>(), tk_occupancy<4, 5, TK_STREAM, 0>(),
           tk_occupancy<4, 5, TK_STREAM, 3>(), tk_occupancy<4, 5, TK_STREAM, 4>(),
           tk_occupancy<4, 5, TK_STREAM, 5>());
    printf("write_patterns: %d rows x %d bf16 columns, pitch %ld (%.0f MB written)\n", rows, cols,
           pitch, bytes / 1e6);
    for (auto &q : p) {
        double ms = median_ms(st, q.f, 3, 20);
        CK(cudaGetLastError());
        printf("  %-12s %8.1f us  %5.2f TB/s\n", q.name, ms * 1e3, bytes / (ms * 1e-3) / 1e12);
    }
    CK(cudaFree(y));
    CK(cudaFree(xw));
    CK(cudaFree(sx));
    CK(cudaFree(sw));
    CK(cudaFree(sb));
    CK(cudaFree(s1));
    CK(cudaFree(px));
    CK(cudaFree(pw));
    CK(cudaFree(pb));
    return 0;
}
