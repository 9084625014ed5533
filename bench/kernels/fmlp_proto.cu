/* fmlp_proto.cu - a prototype: the bench model's c_r1 linear fused into the
 * lce fold's candidate linear, so c_r1's output never reaches HBM.
 *
 * Why this exists: after the fold (NOTES.md, "The lce fold") the 16 x 70
 * forward spends ~150 us in c_r1 (1120 x [16 -> 190464], bias, ReLU,
 * writing 427 MB of E_cand at its floor) and ~160 of the folded linear's
 * ~189 us reading those bytes back (its other 15% are E_cand's other
 * parts). The composition is a two-layer MLP whose hidden layer is
 * 190464 wide and read by nothing else:
 *     y[r, :] = sum_j relu(x[r, :] W1[j, :] + b1[j]) Wf[:, j]      (64 outputs)
 * 35 GFLOP and 30 MB of weights at 1120 rows, where today's two ops move
 * 850 MB. Before the engine learns the pattern, this measures what the
 * fused op would take (llm.c's dev/cuda: a numbered version beside its
 * benchmark; only a winner moves to kernels/cuda).
 *
 * k_fmlp (v1, mma.sync): CTA = 128 (or 256) rows x a slice of the hidden layer; 8
 * warps of 16 (or 32) rows. Per 128-wide hidden chunk (W1's [128, 16] and Wf's
 * [64, 128] staged by cp.async, double-buffered): H = X W1^T + b1 on
 * tensor cores (one k-step), ReLU, rounded to bf16 as c_r1 stores it, the
 * accumulator repacked in registers as the A operand (FlashAttention's P
 * trick) of Y += H Wf^T. Each slice writes fp32 partials; a second kernel
 * sums them in slice order (deterministic). Reference: today's two steps
 * on cuBLAS (H through fp32, rounded to bf16 after bias and ReLU, then Y).
 * Baseline: H's write alone (step 1's floor) plus cuBLAS's step 2.
 *
 * Variants: __launch_bounds__ min blocks 1, 2 or 3 an SM, and 16 or 32 rows a
 * warp (128 or 256 rows a CTA; 32 shares each Wf fragment between two row
 * tiles), each at about 2, 4 and 8 CTAs an SM of slices.
 *
 *   fmlp_proto [--rows M] [--hidden N] [--slices S]
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>

#include "bench/kernels/bench_util.cuh"
#include "kernels/cuda/mma_util.cuh"

typedef __nv_bfloat16 bf;

#define KIN 16    /* c_r1's inputs */
#define NOUT 64   /* the folded linear's outputs */
#define HC 128    /* hidden units a chunk */
#define W2P 136   /* Wf chunk row pitch in shared memory (bf16): conflict-free ldmatrix */

struct fm_stage {
    bf w1[HC * KIN];    /* [j][i], 32-byte rows */
    bf w2[NOUT * W2P];  /* [n][j], padded */
    float b1[HC];
};

__device__ __forceinline__ void fm_load(fm_stage *s, const bf *W1, const float *b1, const bf *Wf,
                                        long ldf, int j0, int tid)
{
    /* W1 chunk: 4 KB = 256 x 16 B; Wf chunk: 64 rows x 256 B = 1024 x 16 B; b1: 512 B = 32 x 16 B. */
    cp_async16(&s->w1[tid * 8], W1 + (size_t)j0 * KIN + tid * 8, true);
    for (int c = tid; c < NOUT * (HC / 8); c += 256) {
        const int n = c >> 4, q = c & 15;
        cp_async16(&s->w2[n * W2P + q * 8], Wf + (size_t)n * ldf + j0 + q * 8, true);
    }
    if (tid < HC / 4) cp_async16(&s->b1[tid * 4], b1 + j0 + tid * 4, true);
}

template <int MINB, int RT>
__global__ void __launch_bounds__(256, MINB)
k_fmlp(const bf *X, const bf *W1, const float *b1, const bf *Wf, long ldf, float *part, int M,
       int nchunks, int per_slice)
{
    extern __shared__ __align__(128) unsigned char smem_raw[];
    fm_stage *st = (fm_stage *)smem_raw;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int r0 = (blockIdx.x * 8 + warp) * 16 * RT; /* the warp's RT row tiles of 16 */
    const int c0 = blockIdx.y * per_slice, c1 = min(nchunks, c0 + per_slice);
    /* X's A fragments (rows past M are zero). */
    uint32_t a[RT][4];
#pragma unroll
    for (int r = 0; r < RT; r++) {
        const int ra = r0 + 16 * r + g, rb = ra + 8;
        const uint32_t *xa = (const uint32_t *)(X + (size_t)ra * KIN);
        const uint32_t *xb = (const uint32_t *)(X + (size_t)rb * KIN);
        a[r][0] = ra < M ? xa[t] : 0u;
        a[r][1] = rb < M ? xb[t] : 0u;
        a[r][2] = ra < M ? xa[t + 4] : 0u;
        a[r][3] = rb < M ? xb[t + 4] : 0u;
    }
    float y[RT][NOUT / 8][4];
#pragma unroll
    for (int r = 0; r < RT; r++)
#pragma unroll
        for (int i = 0; i < NOUT / 8; i++) y[r][i][0] = y[r][i][1] = y[r][i][2] = y[r][i][3] = 0.f;
    if (c0 < c1) fm_load(&st[0], W1, b1, Wf, ldf, c0 * HC, tid);
    cp_async_commit();
    const int mi = lane >> 3, rr = lane & 7;
    for (int c = c0; c < c1; c++) {
        const int buf = (c - c0) & 1;
        if (c + 1 < c1) fm_load(&st[buf ^ 1], W1, b1, Wf, ldf, (c + 1) * HC, tid);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const fm_stage *s = &st[buf];
#pragma unroll
        for (int kk = 0; kk < HC / 16; kk++) {
            /* H for hidden units 16kk .. 16kk+15: two n-tiles of 8. ldmatrix x4 over W1 rows
             * 16kk..16kk+15: m0 rows +0..7 cols 0..7, m1 rows +0..7 cols 8..15, m2 rows +8..15
             * cols 0..7, m3 rows +8..15 cols 8..15. */
            uint32_t bw[4];
            ldmatrix_x4(bw, &s->w1[(16 * kk + (mi >> 1) * 8 + rr) * KIN + (mi & 1) * 8]);
            const float bb[2][2] = {{s->b1[16 * kk + 2 * t], s->b1[16 * kk + 2 * t + 1]},
                                    {s->b1[16 * kk + 8 + 2 * t], s->b1[16 * kk + 8 + 2 * t + 1]}};
            uint32_t p[RT][4];
#pragma unroll
            for (int r = 0; r < RT; r++) {
                float h[2][4];
#pragma unroll
                for (int q = 0; q < 2; q++) {
                    h[q][0] = bb[q][0], h[q][1] = bb[q][1], h[q][2] = bb[q][0], h[q][3] = bb[q][1];
                    const uint32_t b2[2] = {bw[2 * q], bw[2 * q + 1]};
                    mma16816<bf>(h[q], a[r], b2);
                }
                p[r][0] = pack2<bf>(fmaxf(h[0][0], 0.f), fmaxf(h[0][1], 0.f));
                p[r][1] = pack2<bf>(fmaxf(h[0][2], 0.f), fmaxf(h[0][3], 0.f));
                p[r][2] = pack2<bf>(fmaxf(h[1][0], 0.f), fmaxf(h[1][1], 0.f));
                p[r][3] = pack2<bf>(fmaxf(h[1][2], 0.f), fmaxf(h[1][3], 0.f));
            }
            /* Y += H[:, 16kk..] Wf[:, 16kk..]^T: eight n-tiles of 8 outputs, two a ldmatrix,
             * each B fragment used by the warp's RT row tiles. */
#pragma unroll
            for (int nn = 0; nn < NOUT / 16; nn++) {
                uint32_t bq[4];
                ldmatrix_x4(bq, &s->w2[(16 * nn + (mi >> 1) * 8 + rr) * W2P + 16 * kk + (mi & 1) * 8]);
                const uint32_t blo[2] = {bq[0], bq[1]}, bhi[2] = {bq[2], bq[3]};
#pragma unroll
                for (int r = 0; r < RT; r++) {
                    mma16816<bf>(y[r][2 * nn], p[r], blo);
                    mma16816<bf>(y[r][2 * nn + 1], p[r], bhi);
                }
            }
        }
        __syncthreads();
    }
    float *pp = part + (size_t)blockIdx.y * M * NOUT;
#pragma unroll
    for (int r = 0; r < RT; r++)
#pragma unroll
        for (int i = 0; i < NOUT / 8; i++) {
            const int n = 8 * i + 2 * t, ra = r0 + 16 * r + g, rb = ra + 8;
            if (ra < M) *(float2 *)&pp[(size_t)ra * NOUT + n] = make_float2(y[r][i][0], y[r][i][1]);
            if (rb < M) *(float2 *)&pp[(size_t)rb * NOUT + n] = make_float2(y[r][i][2], y[r][i][3]);
        }
}

__global__ void k_fmlp_sum(const float *part, float *y, int M, int S)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= M * NOUT) return;
    float acc = 0.f;
    for (int s = 0; s < S; s++) acc += part[(size_t)s * M * NOUT + i];
    y[i] = acc;
}

/* The baseline's middle step: bias, ReLU, bf16 (what c_r1's epilogue does). */
__global__ void k_bias_relu(const float *hf, const float *b1, bf *h, int M, int N)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (size_t)M * N;
         i += (size_t)gridDim.x * blockDim.x)
        h[i] = __float2bfloat16(fmaxf(hf[i] + b1[i % N], 0.f));
}

static double rel_l2(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : (num > 0 ? INFINITY : 0);
}

int main(int argc, char **argv)
{
    int M = 1120, N = 190464, S = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--rows")) M = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--hidden")) N = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--slices")) S = atoi(argv[i + 1]);
        else { fprintf(stderr, "fmlp_proto: unknown flag %s\n", argv[i]); return 2; }
    }
    if (M < 1 || N < HC || N % HC) { fprintf(stderr, "fmlp_proto: --hidden must be a multiple of %d\n", HC); return 2; }
    const long ldf = N + 4096; /* Wf's row is the folded weight's, wider than c_r1's part */
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    bf *X, *W1, *Wf, *H;
    float *b1, *part, *Y, *Yref, *Hf;
    const int nchunks = N / HC;
    /* Slices: S, or about 2, 4 and 8 CTAs an SM at the variant's row blocks. At most nchunks. */
    const int smax = S ? S : 8 * prop.multiProcessorCount;
    CK(cudaMalloc(&X, (size_t)M * KIN * 2));
    CK(cudaMalloc(&W1, (size_t)N * KIN * 2));
    CK(cudaMalloc(&Wf, (size_t)NOUT * ldf * 2));
    CK(cudaMalloc(&b1, (size_t)N * 4));
    CK(cudaMalloc(&H, (size_t)M * N * 2));
    CK(cudaMalloc(&Hf, (size_t)M * N * 4));
    CK(cudaMalloc(&part, (size_t)smax * M * NOUT * 4));
    CK(cudaMalloc(&Y, (size_t)M * NOUT * 4));
    CK(cudaMalloc(&Yref, (size_t)M * NOUT * 4));
    fill(X, (size_t)M * KIN, 11, 1.0f);
    fill(W1, (size_t)N * KIN, 12, 0.25f);
    fill(Wf, (size_t)NOUT * ldf, 13, 0.01f);
    fill(b1, (size_t)N, 14, 0.1f);
    cublasHandle_t hb;
    if (cublasCreate(&hb) != CUBLAS_STATUS_SUCCESS) { fprintf(stderr, "cublasCreate failed\n"); return 2; }
    const float one = 1.f, zero = 0.f;
    /* Baseline, today's decomposition: Hf[M, N] = X W1^T (fp32), H = bf16(relu(Hf + b1)),
     * Y[M, 64] = H Wf[:, :N]^T. cuBLAS is column-major: C^T = B^T A^T. */
    auto step1 = [&] {
        cublasGemmEx(hb, CUBLAS_OP_T, CUBLAS_OP_N, N, M, KIN, &one, W1, CUDA_R_16BF, KIN, X, CUDA_R_16BF,
                     KIN, &zero, Hf, CUDA_R_32F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        k_bias_relu<<<4096, 256>>>(Hf, b1, H, M, N);
    };
    auto step2 = [&] {
        cublasGemmEx(hb, CUBLAS_OP_T, CUBLAS_OP_N, NOUT, M, N, &one, Wf, CUDA_R_16BF, ldf, H, CUDA_R_16BF,
                     N, &zero, Yref, CUDA_R_32F, NOUT, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    };
    /* Step 1 here goes through fp32 (the reference's rounding is the fused kernel's: fp32
     * accumulate, bias, ReLU, one rounding to bf16), so its time is not production's; the
     * baseline below is H's write alone (memset: step 1's floor, which production's c_r1
     * reaches within ~1.04x) plus cuBLAS's step 2. */
    step1();
    step2();
    CK(cudaDeviceSynchronize());
    const double t1 = median_ms(0, step1, 3, 20), t2 = median_ms(0, step2, 3, 20);
    const double tcopy = median_ms(0, [&] { CK(cudaMemsetAsync(H, 0, (size_t)M * N * 2, 0)); }, 3, 20);
    step1(); /* H back */
    /* a GEMM ceiling for the floor: 8192^3 bf16 */
    bf *G;
    const int GN = 8192;
    CK(cudaMalloc(&G, (size_t)3 * GN * GN * 2));
    fill(G, (size_t)2 * GN * GN, 15, 0.1f);
    const double tg = median_ms(0, [&] {
        cublasGemmEx(hb, CUBLAS_OP_N, CUBLAS_OP_N, GN, GN, GN, &one, G, CUDA_R_16BF, GN, G + (size_t)GN * GN,
                     CUDA_R_16BF, GN, &zero, G + (size_t)2 * GN * GN, CUDA_R_16BF, GN, CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT);
    }, 2, 10);
    const double gemm_tf = 2.0 * GN * GN * (double)GN / (tg * 1e-3) / 1e12;
    CK(cudaFree(G));
    const double flops = 2.0 * M * (double)N * (KIN + NOUT);
    const double fused_floor_us = flops / (gemm_tf * 1e12) * 1e6;
    const double membytes = (double)M * N * 2; /* H written once, read once in the baseline */
    const double copy_tbs = membytes / (tcopy * 1e-3) / 1e12;
    printf("fmlp_proto: %s, M %d, hidden %d, outputs %d; ceilings: gemm bf16 %.0f TFLOP/s, write %.2f TB/s\n",
           prop.name, M, N, NOUT, gemm_tf, copy_tbs);
    printf("  baseline: H's write alone (step 1's floor) %.1f us + cuBLAS step 2 %.1f us = %.1f us "
           "(reference step 1 through fp32: %.1f us)\n", tcopy * 1e3, t2 * 1e3, (tcopy + t2) * 1e3, t1 * 1e3);
    std::vector<float> hy((size_t)M * NOUT), hr((size_t)M * NOUT);
    CK(cudaMemcpy(hr.data(), Yref, hr.size() * 4, cudaMemcpyDeviceToHost));
    const size_t smem = 2 * sizeof(fm_stage);
    typedef void (*kern_t)(const bf *, const bf *, const float *, const bf *, long, float *, int, int, int);
    const struct { int minb, rt; kern_t k; } var[] = {
        {2, 1, k_fmlp<2, 1>}, {3, 1, k_fmlp<3, 1>}, {2, 2, k_fmlp<2, 2>}, {1, 2, k_fmlp<1, 2>}};
    for (int vi = 0; vi < 4; vi++)
    for (int w = 2; w <= 8; w *= 2) {
        const int minb = var[vi].minb, rt = var[vi].rt, rblocks = (M + 128 * rt - 1) / (128 * rt);
        const kern_t kern = var[vi].k;
        CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        int occ = 0;
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kern, 256, smem));
        if (S && w > 2) break;
        int Sx = S ? S : (w * prop.multiProcessorCount + rblocks - 1) / rblocks;
        Sx = Sx < 1 ? 1 : Sx > smax ? smax : Sx > nchunks ? nchunks : Sx;
        const int per = (nchunks + Sx - 1) / Sx, Sr = (nchunks + per - 1) / per;
        auto fused = [&] {
            kern<<<dim3(rblocks, Sr), 256, smem>>>(X, W1, b1, Wf, ldf, part, M, nchunks, per);
            k_fmlp_sum<<<(M * NOUT + 255) / 256, 256>>>(part, Y, M, Sr);
        };
        CK(cudaMemset(Y, 0xff, (size_t)M * NOUT * 4)); /* poison */
        fused();
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(hy.data(), Y, hy.size() * 4, cudaMemcpyDeviceToHost));
        const double err = rel_l2(hy.data(), hr.data(), hy.size());
        const double tf = median_ms(0, fused, 3, 20);
        printf("  fused v1 minb %d rows/warp %2d: slices %3d (%d chunks each, grid %d x %d, %d CTAs/SM) %.1f us = %.0f TFLOP/s, "
               "%.2fx faster than the baseline, %.2fx its floor %.1f us; rel L2 err %.2e %s\n",
               minb, 16 * rt, Sr, per, rblocks, Sr, occ, tf * 1e3, flops / (tf * 1e-3) / 1e12, (tcopy + t2) / tf,
               tf * 1e3 / fused_floor_us, fused_floor_us, err, err < 1e-3 ? "ok" : "FAIL");
    }
    return 0;
}
