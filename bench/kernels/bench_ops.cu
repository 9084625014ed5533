/* bench_ops.cu - the CUDA backend's ranking-model ops against their floors.
 *
 * Why this exists: issue 14's ops (pool, activation, layer_norm, mul,
 * token_linear, dot_interaction, mixture) are memory-bound passes (and one
 * small GEMM); this measures, in one run on the device, each op's time at
 * the reference-model shapes (16 and 1024 users x 70 candidates; D 16..128,
 * K 8..32 tokens, E 4..8 experts, F 256..1024) against its floor:
 *   floor = max(bytes moved / device copy bandwidth, FLOPs / GEMM rate)
 * with the copy bandwidth (device-to-device, read + write) and the cuBLAS
 * 8192^3 GEMM rate of the dtype measured first in the same run. FLOPs count
 * only for token_linear (cuBLAS's strided-batched GEMM with a stride-0
 * weight is timed beside it, the alternative the kernel choice was measured
 * against) and dot_interaction. Small shapes fit in the 60 MiB L2 and are
 * bound by launch latency, so their ratio can fall below 1 or sit far above.
 * Also linear with short input rows (linear_tk.cu) at the bench model's
 * shapes beside cuBLAS's GemmEx. Times: the median of 30 runs after 5
 * warm-ups, CUDA events on the op's stream. A short table is printed last.
 *
 *   bench_ops [--dtype bf16|fp16|fp32] [--quick] [--proj]   (--proj: only the attention projections)
 */
#include <algorithm>
#include <functional>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <string>
#include <vector>

#include "bench/kernels/bench_util.cuh"
#include "kernels/cuda/cuda_internal.h"


static bk_err berr;
static bk_backend *be;
static bk_stream *bs;
static size_t es; /* activation bytes */
static double g_bw, g_rate; /* bytes/s, FLOP/s */
static std::vector<std::string> table;

/* A device buffer of n activations, seeded values in [-1, 1) (bench_util.cuh fill) on bs. */
static void *act_buf(size_t n, uint32_t seed)
{
    void *p = be->alloc(be, n * es + 16, BK_TAG_CAND, &berr);
    if (!p) {
        fprintf(stderr, "alloc %zu: %s\n", n * es, berr.msg);
        exit(2);
    }
    switch (cu_dt(bs)) {
    case CU_F32: fill((float *)p, n, seed, 1.0f, bs->st); break;
    case CU_BF16: fill((__nv_bfloat16 *)p, n, seed, 1.0f, bs->st); break;
    case CU_F16: fill((__half *)p, n, seed, 1.0f, bs->st); break;
    }
    return p;
}

static bk_weight *weight(int rows, int cols, uint32_t seed)
{
    std::vector<float> h((size_t)rows * cols);
    for (size_t i = 0; i < h.size(); i++)
        h[i] = (float)((i * 2654435761u ^ seed) % 2001) / 1000.0f - 1.0f;
    bk_weight *w = be->weight_new(be, h.data(), rows, cols, &berr);
    if (!w) {
        fprintf(stderr, "weight: %s\n", berr.msg);
        exit(2);
    }
    return w;
}

/* Median of 30 runs after 5 warm-ups on the op's stream, in us. */
static double median_us(const std::function<void()> &f) { return median_ms(bs->st, f, 5, 30) * 1e3; }

/* One table line: time, floor, and the ratio. */
static void report(const char *op, const char *shape, double us, double bytes, double flops)
{
    double fl = std::max(bytes / g_bw, flops > 0 ? flops / g_rate : 0.0) * 1e6;
    char line[256];
    snprintf(line, sizeof line, "%-16s %-34s %9.1f us  floor %8.1f us  x%6.2f  %7.0f GB/s", op,
             shape, us, fl, us / fl, bytes / (us * 1e-6) / 1e9);
    printf("%s\n", line);
    table.push_back(line);
}

static void ceilings(cublasHandle_t h)
{
    size_t bytes = (size_t)1 << 30;
    void *a, *b;
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&b, bytes));
    CK(cudaMemsetAsync(a, 1, bytes, bs->st));
    double us = median_us([&] { CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, bs->st)); });
    g_bw = 2.0 * bytes / (us * 1e-6);
    /* Writes alone (a 1 GiB memset): reported beside the floors' copy rate,
     * which counts a copy's read and write (bench/kernels/NOTES.md: no
     * write-bound op here has written faster than 2.8 TB/s). Not used in
     * the floors. */
    us = median_us([&] { CK(cudaMemsetAsync(b, 0, bytes, bs->st)); });
    double write_bw = bytes / (us * 1e-6);
    CK(cudaFree(a));
    CK(cudaFree(b));
    const int N = 8192;
    enum cu_dtype dt = cu_dt(bs);
    cudaDataType_t ty = dt == CU_F32 ? CUDA_R_32F : dt == CU_BF16 ? CUDA_R_16BF : CUDA_R_16F;
    void *A = act_buf((size_t)N * N, 2), *B = act_buf((size_t)N * N, 3), *C = act_buf((size_t)N * N, 4);
    float one = 1.0f, zero = 0.0f;
    CK(cudaStreamSynchronize(bs->st));
    cublasSetStream(h, bs->st);
    us = median_us([&] {
        cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, N, N, N, &one, A, ty, N, B, ty, N, &zero, C, ty,
                     N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    });
    g_rate = 2.0 * N * N * (double)N / (us * 1e-6);
    for (void *p : {A, B, C})
        be->free(be, p, (size_t)N * N * es + 16, BK_TAG_CAND);
    char line[200];
    snprintf(line, sizeof line,
             "ceilings (%s): copy %.2f TB/s (read + write), GEMM 8192^3 %.1f TFLOP/s; "
             "memset (writes alone) %.2f TB/s, not used in the floors",
             dt == CU_F32 ? "fp32" : dt == CU_BF16 ? "bf16" : "fp16", g_bw / 1e12, g_rate / 1e12,
             write_bw / 1e12);
    printf("%s\n", line);
    table.push_back(line);
}

struct bufs {
    std::vector<std::pair<void *, size_t>> v;
    void *act(size_t n)
    {
        void *p = act_buf(n, (uint32_t)v.size() * 7919u + 1);
        v.push_back({p, n * es + 16});
        return p;
    }
    ~bufs()
    {
        for (auto &b : v)
            be->free(be, b.first, b.second, BK_TAG_CAND);
    }
};

static int32_t *user_map(int U, int C)
{
    std::vector<int32_t> h(C);
    for (int c = 0; c < C; c++)
        h[c] = (int32_t)((long)c * U / C);
    int32_t *d = (int32_t *)be->alloc(be, (size_t)C * 4, BK_TAG_INDEX, &berr);
    BK(!d || be->upload(bs, d, h.data(), (size_t)C * 4, &berr));
    return d;
}

/* A cuBLAS handle on the op's stream and workspace; *ty = the activation
 * dtype's cuBLAS type. The caller destroys it. */
static cublasHandle_t blas_on_stream(cudaDataType_t *ty)
{
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS)
        exit(2);
    cublasSetStream(h, bs->st);
    cublasSetWorkspace(h, bs->ws, bs->ws_size);
    enum cu_dtype dt = cu_dt(bs);
    *ty = dt == CU_F32 ? CUDA_R_32F : dt == CU_BF16 ? CUDA_R_16BF : CUDA_R_16F;
    return h;
}

static void bench_users(int U, int quick)
{
    const int C = 70 * U;
    char sh[96];
    int32_t *map = user_map(U, C);
    /* pool over tokens at C and over jagged histories at U. */
    for (int d : {64, 128}) {
        bufs b;
        int k = 16;
        void *x = b.act((size_t)C * k * d), *o = b.act((size_t)C * d);
        for (int fn : {BK_POOL_SUM, BK_POOL_MAX}) {
            double us = median_us([&] { BK(be->pool(bs, x, NULL, C, k, d, (enum bk_pool)fn, o, d, &berr)); });
            snprintf(sh, sizeof sh, "tokens C %d k %d d %d %s", C, k, d, fn ? "max" : "sum");
            report("pool", sh, us, (double)C * (k + 1) * d * es, 0);
        }
    }
    {
        bufs b;
        int L = 512, d = 64;
        std::vector<int64_t> off(U + 1);
        for (int u = 0; u <= U; u++)
            off[u] = (int64_t)u * L;
        int64_t *doff = (int64_t *)be->alloc(be, (U + 1) * 8, BK_TAG_INDEX, &berr);
        BK(!doff || be->upload(bs, doff, off.data(), (U + 1) * 8, &berr));
        void *x = b.act((size_t)U * L * d), *o = b.act((size_t)U * d);
        double us = median_us([&] { BK(be->pool(bs, x, doff, U, 0, d, BK_POOL_MEAN, o, d, &berr)); });
        snprintf(sh, sizeof sh, "jagged U %d L %d d %d mean", U, L, d);
        report("pool", sh, us, (double)U * (L + 1) * d * es, 0);
        be->free(be, doff, (U + 1) * 8, BK_TAG_INDEX);
    }
    for (int F : {256, 1024}) {
        bufs b;
        void *x = b.act((size_t)C * F), *o = b.act((size_t)C * F), *xu = b.act((size_t)U * F),
             *c = b.act((size_t)C * F);
        double us = median_us([&] { BK(be->activation(bs, x, (size_t)C * F, BK_ACT_GELU, o, &berr)); });
        snprintf(sh, sizeof sh, "C %d F %d gelu", C, F);
        report("activation", sh, us, 2.0 * C * F * es, 0);
        bk_weight *w = weight(1, F, 5), *bb = weight(1, F, 6);
        us = median_us([&] { BK(be->layer_norm(bs, x, C, F, w, bb, 1e-5f, o, &berr)); });
        snprintf(sh, sizeof sh, "C %d F %d", C, F);
        report("layer_norm", sh, us, 2.0 * C * F * es, 0);
        be->weight_free(be, w);
        be->weight_free(be, bb);
        us = median_us([&] { BK(be->mul(bs, x, xu, map, c, C, F, o, &berr)); });
        snprintf(sh, sizeof sh, "C %d F %d user b via map, +c", C, F);
        report("mul", sh, us, (3.0 * C + U) * F * es + 4.0 * C, 0);
    }
    for (int E : {4, 8})
        for (int F : {256, 1024}) {
            bufs b;
            const void *ex[8];
            for (int e = 0; e < E; e++)
                ex[e] = b.act((size_t)C * F);
            void *g = b.act((size_t)C * E), *o = b.act((size_t)C * F);
            double us = median_us([&] { BK(be->mixture(bs, ex, E, g, C, F, o, &berr)); });
            snprintf(sh, sizeof sh, "C %d E %d F %d", C, E, F);
            report("mixture", sh, us, ((double)C * F * (E + 1) + (double)C * E) * es, 0);
        }
    /* token_linear: ours (lce's kernels) and cuBLAS strided-batched, weight stride 0. */
    cudaDataType_t ty;
    cublasHandle_t h = blas_on_stream(&ty);
    int shapes[][3] = {{16, 16, 64}, {32, 32, 128}, {16, 8, 128}, {32, 64, 64}};
    for (auto &s3 : shapes) {
        int k = s3[0], m = s3[1], d = s3[2];
        bufs b;
        void *x = b.act((size_t)C * k * d), *z = b.act((size_t)C * m * d);
        bk_weight *w = weight(m, k, 9);
        double bytes = ((double)C * (k + m) * d + (double)m * k) * es, flops = 2.0 * C * m * k * d;
        double us = median_us([&] { BK(be->token_linear(bs, x, C, w, k, m, d, z, &berr)); });
        snprintf(sh, sizeof sh, "C %d k %d m %d d %d", C, k, m, d);
        report("token_linear", sh, us, bytes, flops);
        /* Z[r]^T (d x m, col-major) = X[r]^T (d x k) W^T (k x m; W's storage). */
        float one = 1.0f, zero = 0.0f;
        cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
        us = median_us([&] {
            st = cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, d, m, k, &one, x, ty, d,
                                            (long long)k * d, w->data, ty, w->ld, 0, &zero, z, ty,
                                            d, (long long)m * d, C, CUBLAS_COMPUTE_32F,
                                            CUBLAS_GEMM_DEFAULT);
        });
        if (st == CUBLAS_STATUS_SUCCESS)
            report("  cublas batched", sh, us, bytes, flops);
        be->weight_free(be, w);
    }
    cublasDestroy(h);
    /* dot_interaction: half user, half candidate tokens; with uu (IKBO) and without. */
    for (int K : {8, 16, 32})
        for (int d : {16, 64, 128}) {
            if (quick && d != 64)
                continue;
            int ku = K / 2, kc = K - ku, P = K * (K - 1) / 2, Pu = ku * (ku - 1) / 2;
            bufs b;
            void *tu = b.act((size_t)U * ku * d), *tc = b.act((size_t)C * kc * d),
                 *uu = b.act((size_t)U * Pu), *o = b.act((size_t)C * P);
            bk_dot_order ord;
            memset(&ord, 0, sizeof ord);
            ord.ku = ku;
            ord.kc = kc;
            for (int t = 0; t < K; t++) /* interleaved: user, candidate, ... */
                ord.pos[t] = (uint16_t)(t < ku ? 2 * t : 2 * (t - ku) + 1);
            bk_dot_order ou = ord;
            ou.kc = 0;
            for (int t = 0; t < ku; t++)
                ou.pos[t] = (uint16_t)t;
            BK(be->dot_interaction(bs, tu, NULL, NULL, NULL, U, &ou, d, 0, uu, &berr));
            double us = median_us(
                [&] { BK(be->dot_interaction(bs, tu, uu, map, tc, C, &ord, d, 0, o, &berr)); });
            double bytes = ((double)U * ku * d + (double)C * kc * d + (double)U * Pu + (double)C * P) * es + 4.0 * C;
            double flops = 2.0 * C * (P - Pu) * d;
            snprintf(sh, sizeof sh, "C %d K %d (%d+%d) d %d uu", C, K, ku, kc, d);
            report("dot_interaction", sh, us, bytes, flops);
            us = median_us(
                [&] { BK(be->dot_interaction(bs, tu, NULL, map, tc, C, &ord, d, 0, o, &berr)); });
            snprintf(sh, sizeof sh, "C %d K %d (%d+%d) d %d no uu", C, K, ku, kc, d);
            report("dot_interaction", sh, us, bytes - (double)U * Pu * es, 2.0 * C * P * d);
        }
    be->free(be, map, (size_t)C * 4, BK_TAG_INDEX);
}

/* linear with short input rows (linear_tk.cu) at the bench model's shapes
 * (16 and 1 users x 70 candidates), beside cuBLAS's GemmEx on the same
 * problem (no bias or activation: the baseline a user would call). */
static void bench_linear()
{
    cudaDataType_t ty;
    cublasHandle_t h = blas_on_stream(&ty);
    /* rows, in, out, ldy, relu: c_r1 (into E_cand's pitch), the candidate
     * token linear, the user MLP's second layer. */
    int shapes[][5] = {{1120, 16, 190464, 223232, 1}, {1120, 16, 15872, 15872, 1},
                       {16, 32, 300800, 300800, 0},   {70, 16, 190464, 223232, 1},
                       {70, 16, 15872, 15872, 1},     {1, 32, 300800, 300800, 0}};
    for (auto &q : shapes) {
        int rows = q[0], in = q[1], out = q[2], ldy = q[3];
        bufs b;
        void *x = b.act((size_t)rows * in), *y = b.act((size_t)rows * ldy);
        bk_weight *w = weight(out, in, 11), *bias = weight(1, out, 12);
        double bytes = ((double)rows * in + (double)out * in + out + (double)rows * out) * es;
        double flops = 2.0 * rows * in * out;
        char sh[96];
        snprintf(sh, sizeof sh, "%d x %d > %d%s%s", rows, in, out, ldy != out ? " pitched" : "",
                 q[4] ? " relu" : "");
        double us = median_us([&] {
            BK(be->linear(bs, x, in, rows, w, bias, q[4] ? BK_ACT_RELU : BK_ACT_NONE, y, ldy, &berr));
        });
        report("linear", sh, us, bytes, flops);
        /* y^T (out x rows, col-major, ld ldy) = W (out x in; W's storage is
         * W^T col-major with ld) x^T. */
        float one = 1.0f, zero = 0.0f;
        cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
        us = median_us([&] {
            st = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, out, rows, in, &one, w->data, ty, w->ld,
                              x, ty, in, &zero, y, ty, ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        });
        if (st == CUBLAS_STATUS_SUCCESS)
            report("  cublas", sh, us, bytes - (double)out * es, flops);
        be->weight_free(be, w);
        be->weight_free(be, bias);
    }
    cublasDestroy(h);
}

/* The target attention's projections at the bench model's 16 x 70 shapes
 * (C 1120, Tq 64, D = H dh = 256, Kc 872, 16 users x L 1024 events), and
 * what placing them costs: Wo's output written straight into its tokens of
 * E_cand (a strided batch over candidates: Tq rows each, batch stride Kc D)
 * against the contiguous GEMM plus the stack's copy it replaced; Q read
 * from X's tokens inside E_cand the same way. Each placed row twice: the
 * backend's linear_grouped (what the engine runs: linear_wr.cu at these
 * shapes) and cuBLAS's GemmStridedBatchedEx (the baseline). Then K and V as one N = 512 GEMM
 * (what target_attention runs since 73b3ba5; the attention reads K and V
 * with a row stride of 2 H dh) against two of N = 256; the plain rows
 * have cuBLAS's GemmEx beside them. */
static void bench_proj()
{
    const int C = 1120, tq = 64, D = 256, kc = 872, ev = 16 * 1024;
    const long rows = (long)C * tq;
    cudaDataType_t ty;
    cublasHandle_t h = blas_on_stream(&ty);
    bufs b;
    void *x = b.act((size_t)rows * D), *y = b.act((size_t)rows * D),
         *e = b.act((size_t)C * kc * D), *hist = b.act((size_t)ev * D),
         *kv = b.act((size_t)ev * 2 * D);
    bk_weight *w = weight(D, D, 21), *w2 = weight(2 * D, D, 22);
    double io = 2.0 * rows * D * es, flops = 2.0 * rows * D * D;
    char sh[96];
    snprintf(sh, sizeof sh, "%ld x %d > %d", rows, D, D);
    double lin = median_us([&] { BK(be->linear(bs, x, D, (int)rows, w, NULL, BK_ACT_NONE, y, D, &berr)); });
    report("proj linear", sh, lin, io, flops);
    float one = 1.0f, zero = 0.0f;
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    /* The baseline of every plain row: y^T (out x rows, col-major) = W x^T. */
    auto gemm = [&](int n, int out, const bk_weight *wt, const void *xx, void *yy, int ldy) {
        return median_us([&] {
            st = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, out, n, D, &one, wt->data, ty, wt->ld,
                              xx, ty, D, &zero, yy, ty, ldy, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT);
        });
    };
    double cb = gemm((int)rows, D, w, x, y, D);
    if (st == CUBLAS_STATUS_SUCCESS)
        report("  cublas", sh, cb, io, flops);
    double cp = median_us([&] {
        BK(be->copy_rows(bs, y, tq * D, NULL, C, tq * D, (char *)e + (size_t)tq * D * es, kc * D, &berr));
    });
    report("proj copy", "Tq tokens into E_cand", cp, io, 0);
    report("proj sum", "linear + copy", lin + cp, 2 * io, flops);
    double pl, pi;
    char *et = (char *)e + (size_t)tq * D * es; /* the attention's tokens in E_cand */
    pl = median_us([&] {
        BK(be->linear_grouped(bs, x, D, (int64_t)tq * D, C, tq, w, NULL, BK_ACT_NONE, et, D,
                              (int64_t)kc * D, &berr));
    });
    report("proj placed out", "linear_grouped into E_cand", pl, io, flops);
    pi = median_us([&] {
        BK(be->linear_grouped(bs, e, D, (int64_t)kc * D, C, tq, w, NULL, BK_ACT_NONE, y, D,
                              (int64_t)tq * D, &berr));
    });
    report("proj placed in", "linear_grouped from E_cand", pi, io, flops);
    /* Y_c^T (D x Tq, col-major, ld D) = W x X_c^T, batch stride Kc D in E. */
    pl = median_us([&] {
        st = cublasGemmStridedBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, D, tq, D, &one, w->data, ty,
                                        w->ld, 0, x, ty, D, (long long)tq * D, &zero, et, ty, D,
                                        (long long)kc * D, C, CUBLAS_COMPUTE_32F,
                                        CUBLAS_GEMM_DEFAULT);
    });
    if (st == CUBLAS_STATUS_SUCCESS)
        report("  cublas batched", "over C, into E_cand", pl, io, flops);
    pi = median_us([&] {
        st = cublasGemmStridedBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, D, tq, D, &one, w->data, ty,
                                        w->ld, 0, e, ty, D, (long long)kc * D, &zero, y, ty, D,
                                        (long long)tq * D, C, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    });
    if (st == CUBLAS_STATUS_SUCCESS)
        report("  cublas batched", "over C, from E_cand", pi, io, flops);
    double kv_io = 3.0 * ev * D * es, kv_fl = 4.0 * ev * D * D;
    snprintf(sh, sizeof sh, "%d x %d > %d, twice", ev, D, D);
    double k2 = median_us([&] {
        BK(be->linear(bs, hist, D, ev, w, NULL, BK_ACT_NONE, kv, D, &berr));
        BK(be->linear(bs, hist, D, ev, w, NULL, BK_ACT_NONE, (char *)kv + (size_t)ev * D * es, D, &berr));
    });
    report("K,V linears", sh, k2, kv_io + ev * D * es, kv_fl);
    snprintf(sh, sizeof sh, "%d x %d > %d", ev, D, 2 * D);
    double k1 = median_us([&] { BK(be->linear(bs, hist, D, ev, w2, NULL, BK_ACT_NONE, kv, 2 * D, &berr)); });
    report("K|V one linear", sh, k1, kv_io, kv_fl);
    cb = gemm(ev, 2 * D, w2, hist, kv, 2 * D);
    if (st == CUBLAS_STATUS_SUCCESS)
        report("  cublas", sh, cb, kv_io, kv_fl);
    be->weight_free(be, w);
    be->weight_free(be, w2);
    cublasDestroy(h);
}

int main(int argc, char **argv)
{
    const char *dtype = "bf16";
    int quick = 0, proj = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--dtype") && i + 1 < argc)
            dtype = argv[++i];
        else if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else if (!strcmp(argv[i], "--proj"))
            proj = 1;
        else {
            fprintf(stderr, "usage: %s [--dtype bf16|fp16|fp32] [--quick] [--proj]\n", argv[0]);
            return 2;
        }
    }
    setenv("IKBO_CUDA_DTYPE", dtype, 1);
    if (!(be = bk_backend_new("cuda:0", &berr)) || !(bs = be->stream_new(be, &berr))) {
        fprintf(stderr, "cuda:0: %s\n", berr.msg);
        return 2;
    }
    es = be->act_size;
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS)
        return 2;
    ceilings(h);
    cublasDestroy(h);
    table.push_back("-- the attention's projections, placed or not (bench model, 16 x 70)");
    bench_proj();
    if (!proj) {
        table.push_back("-- linear with short input rows (bench model shapes)");
        bench_linear();
    }
    for (int U : {16, 1024}) {
        if (proj)
            break;
        table.push_back("-- " + std::to_string(U) + " users x 70 candidates");
        bench_users(U, quick);
    }
    printf("==== summary\n");
    for (auto &l : table)
        printf("%s\n", l.c_str());
    be->stream_free(bs);
    be->destroy(be);
    return 0;
}
