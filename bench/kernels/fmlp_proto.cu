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
 * fused op would take; v1 won (2.6x at 1120 rows, H100, 2026-12-06) and
 * moved to kernels/cuda/mlp2.cu, the fold's mlp2. Its variants (1 to 3
 * CTAs an SM, here at e0ba0d8) are in bench/RESULTS.md; this now times
 * production's k_mlp2 (16 or 32 rows a warp, each at about 2, 4 and 8
 * CTAs an SM of slices) against the reference, today's two steps on
 * cuBLAS (H through fp32, rounded to bf16 after bias and ReLU, then Y),
 * and the baseline: H's write alone (step 1's floor) plus cuBLAS's step 2.
 * The weights sit in a folded weight's wider rows (ld2 = hidden + 4096).
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
#include "kernels/cuda/mlp2.cu" /* its kernels, launched directly below */

typedef __nv_bfloat16 bf;

#define KIN 16   /* c_r1's inputs */
#define NOUT 64  /* the folded linear's outputs */

/* The baseline's middle step: bias, ReLU, bf16 (what c_r1's epilogue does). */
__global__ void k_bias_relu(const float *hf, const bf *b1, bf *h, int M, int N)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (size_t)M * N;
         i += (size_t)gridDim.x * blockDim.x)
        h[i] = __float2bfloat16(fmaxf(hf[i] + __bfloat162float(b1[i % N]), 0.f));
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
    if (M < 1 || N < MLP2_HC || N % MLP2_HC) {
        fprintf(stderr, "fmlp_proto: --hidden must be a multiple of %d\n", MLP2_HC);
        return 2;
    }
    const long ldf = N + 4096; /* Wf's row is the folded weight's, wider than c_r1's part */
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    bf *X, *W1, *Wf, *H, *b1, *Y;
    float *part, *Yref, *Hf;
    const int nchunks = N / MLP2_HC;
    /* Slices: S, or about 2, 4 and 8 CTAs an SM at the variant's row blocks. At most nchunks. */
    const int smax = S ? S : 8 * prop.multiProcessorCount;
    CK(cudaMalloc(&X, (size_t)M * KIN * 2));
    CK(cudaMalloc(&W1, (size_t)N * KIN * 2));
    CK(cudaMalloc(&Wf, (size_t)NOUT * ldf * 2));
    CK(cudaMalloc(&b1, (size_t)N * 2));
    CK(cudaMalloc(&H, (size_t)M * N * 2));
    CK(cudaMalloc(&Hf, (size_t)M * N * 4));
    CK(cudaMalloc(&part, (size_t)smax * M * NOUT * 4));
    CK(cudaMalloc(&Y, (size_t)M * NOUT * 2));
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
    std::vector<float> hr((size_t)M * NOUT);
    std::vector<bf> hy((size_t)M * NOUT);
    CK(cudaMemcpy(hr.data(), Yref, hr.size() * 4, cudaMemcpyDeviceToHost));
    const size_t smem = 2 * sizeof(mlp2_stage<bf>);
    for (int rt = 1; rt <= 2; rt++)
        for (int w = 2; w <= 8; w *= 2) {
            const int rblocks = (M + 128 * rt - 1) / (128 * rt);
            auto kern = rt == 2 ? k_mlp2<bf, 2> : k_mlp2<bf, 1>;
            CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
            int occ = 0;
            CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kern, 256, smem));
            if (S && w > 2) break;
            int Sx = S ? S : (w * prop.multiProcessorCount + rblocks - 1) / rblocks;
            Sx = Sx < 1 ? 1 : Sx > smax ? smax : Sx > nchunks ? nchunks : Sx;
            const int per = (nchunks + Sx - 1) / Sx, Sr = (nchunks + per - 1) / per;
            auto fused = [&] {
                kern<<<dim3(rblocks, Sr, 1), 256, smem>>>(X, KIN, KIN, M, W1, KIN, b1, 1, Wf, (int)ldf,
                                                          N, NOUT, part, per);
                k_mlp2_sum<bf><<<(M * NOUT + 255) / 256, 256>>>(part, Sr, NULL, 0, Y, NOUT, M, NOUT);
            };
            CK(cudaMemset(Y, 0xff, (size_t)M * NOUT * 2)); /* poison */
            fused();
            CK(cudaGetLastError());
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(hy.data(), Y, hy.size() * 2, cudaMemcpyDeviceToHost));
            std::vector<float> hf(hy.size());
            for (size_t i = 0; i < hy.size(); i++) hf[i] = __bfloat162float(hy[i]);
            const double err = rel_l2(hf.data(), hr.data(), hf.size());
            const double tf = median_ms(0, fused, 3, 20);
            printf("  k_mlp2 rows/warp %2d: slices %3d (%d chunks each, grid %d x %d, %d CTAs/SM) %.1f us = "
                   "%.0f TFLOP/s, %.2fx faster than the baseline, %.2fx its floor %.1f us; rel L2 err %.2e %s\n",
                   16 * rt, Sr, per, rblocks, Sr, occ, tf * 1e3, flops / (tf * 1e-3) / 1e12,
                   (tcopy + t2) / tf, tf * 1e3 / fused_floor_us, fused_floor_us, err,
                   err < 1e-2 ? "ok" : "FAIL");
        }
    return 0;
}
