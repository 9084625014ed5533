/* bench_util.cuh - what the GPU benchmarks of bench/kernels share.
 *
 * Why this exists: bench_kernels.cu, bench_ops.cu and write_patterns.cu
 * abort on a CUDA or backend error with the failing expression, time a
 * launch sequence as the median of CUDA-event intervals on one stream, and
 * fill operands with seeded values in [-scale, scale); written once here. Header-only (each benchmark is one translation unit). BK needs
 * a `bk_err berr` in scope.
 */
#ifndef IKBO_BENCH_UTIL_CUH
#define IKBO_BENCH_UTIL_CUH

#include <algorithm>
#include <functional>
#include <stdio.h>
#include <stdlib.h>
#include <vector>

#include <cuda_runtime.h>

#include "kernels/cuda/cuda_internal.h" /* cu_fromf */

#define CK(x)                                                                 \
    do {                                                                      \
        cudaError_t e_ = (x);                                                 \
        if (e_ != cudaSuccess) {                                              \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x,        \
                    cudaGetErrorString(e_));                                  \
            exit(2);                                                          \
        }                                                                     \
    } while (0)
#define BK(x)                                                                 \
    do {                                                                      \
        if ((x) != 0) {                                                       \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x,        \
                    berr.msg);                                                \
            exit(2);                                                          \
        }                                                                     \
    } while (0)

/* Seeded values in [-scale, scale) from a hash of the index, on stream st
 * (default: the legacy default stream). */
template <typename T>
__global__ void k_fill(T *p, size_t n, uint32_t seed, float scale)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint32_t x = (uint32_t)i * 2654435761u ^ seed;
        x ^= x >> 15;
        x *= 2246822519u;
        x ^= x >> 13;
        x *= 3266489917u;
        x ^= x >> 16;
        p[i] = cu_fromf<T>(((float)(x >> 8) * (1.0f / 16777216.0f) * 2.0f - 1.0f) * scale);
    }
}

template <typename T>
static void fill(T *p, size_t n, uint32_t seed, float scale, cudaStream_t st = 0)
{
    k_fill<T><<<4096, 256, 0, st>>>(p, n, seed, scale);
    CK(cudaGetLastError());
}

/* Median time in ms of f() on stream st over reps runs after warm runs. */
static inline double median_ms(cudaStream_t st, const std::function<void()> &f, int warm, int reps)
{
    for (int i = 0; i < warm; i++)
        f();
    CK(cudaStreamSynchronize(st));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    std::vector<float> t;
    for (int i = 0; i < reps; i++) {
        CK(cudaEventRecord(a, st));
        f();
        CK(cudaEventRecord(b, st));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms);
    }
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

#endif
