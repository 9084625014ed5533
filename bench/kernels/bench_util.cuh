/* bench_util.cuh - what the GPU benchmarks of bench/kernels share.
 *
 * Why this exists: bench_kernels.cu and bench_ops.cu both abort on a CUDA
 * or backend error with the failing expression, and both time a launch
 * sequence as the median of CUDA-event intervals on one stream; written
 * once here. Header-only (each benchmark is one translation unit). BK needs
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
