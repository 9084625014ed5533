/* cpu_internal.h - what the CPU backend's files share and nobody else sees.
 *
 * Why this exists: the CPU backend is split by concern (backend_cpu.c: memory,
 * streams, weights and the op table; ops_cpu.c: the ops; gemm_cpu.c: the
 * register-tile core every matmul-shaped op goes through). They share the
 * private structs and a few helpers declared here; the engine only ever sees
 * kernels/backend.h.
 *
 * Determinism contract (a hard requirement, see tests/unit/test_kernels_cpu.c):
 * every output element is computed by a fixed sequence of fp32 operations that
 * depends only on that element's own inputs and the tensor widths - never on
 * the number of rows in the batch, on the row's position in it, or on the
 * thread that runs it. The server batches requests and must return the same
 * scores as when each is scored alone. Hence: no BLAS, no threads that split a
 * reduction, no -ffast-math (checked below), and every reduction over k runs
 * in increasing k with one fp32 accumulator per output element.
 */
#ifndef IKBO_CPU_INTERNAL_H
#define IKBO_CPU_INTERNAL_H

#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "../backend.h"

#ifdef __FAST_MATH__
#error "kernels/cpu relies on strict IEEE evaluation order; do not build it with -ffast-math"
#endif

/* Four fp32 lanes as a GNU C vector type (gcc, clang): the one width every
 * x86-64 and arm64 has. Lane-wise arithmetic is the same IEEE single-precision
 * operation as scalar code. Unaligned loads/stores go through memcpy. */
typedef float v4f __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16)));
#define V4_LD(v, p) memcpy(&(v), (p), sizeof(v4f))
#define V4_ST(p, v) memcpy((p), &(v), sizeof(v4f))

/* Register tile of the matmul core: GEMM_MR rows of A times GEMM_NR columns of B. */
#define GEMM_MR 4
#define GEMM_NR 8

/* Alignment of every buffer and weight copy (one cache line). */
#define CPU_ALIGN 64

typedef struct cpu_backend {
    bk_ledger ledger; /* byte counts; alloc/free run on any thread */
} cpu_backend;

struct bk_stream {
    bk_backend *be; /* ops allocate their transient scratch through it */
    bk_stream *lane, *owner; /* be->lane: the lane a stream owns; a lane's owner */
};

struct bk_weight {
    bk_backend *be;
    int rows, cols;
    float *data; /* fp32 [rows, cols] row-major copy */
    /* Linear panels, built on first use by linear (tables never need them):
     * panel p holds W[p*GEMM_NR + j][k] at [p][k][j], zero-padded to
     * GEMM_NR outputs. Threads share weights, so packed is only read or
     * written under pack_lock. */
    float *packed;
    pthread_mutex_t pack_lock;
};

static inline int min_int(int a, int b) { return a < b ? a : b; }

/* Byte ranges [a, a+an) and [b, b+bn) intersect. */
static inline int overlap(const void *a, size_t an, const void *b, size_t bn)
{
    uintptr_t pa = (uintptr_t)a, pb = (uintptr_t)b;
    return pa < pb + bn && pb < pa + an;
}

/* Accounted allocation (backend_cpu.c). Ops use it for scratch. */
void *cpu_alloc(bk_backend *be, size_t bytes, enum bk_tag tag, bk_err *err);
void cpu_free(bk_backend *be, void *p, size_t bytes, enum bk_tag tag);

/* The panel-packed copy of a weight for linear; NULL with err on OOM. */
const float *cpu_weight_packed(const bk_weight *w, bk_err *err);

/* Register-tile core (gemm_cpu.c):
 *   c[i][j] = (load ? c[i][j] : 0) + a[i][0]*b[0*ldb+j] + ... + a[i][kn-1]*b[(kn-1)*ldb+j]
 * summed left to right, for i < GEMM_MR and j < nr (nr <= GEMM_NR); only
 * c[i][0 .. nr) is read or written. a[i] are GEMM_MR row pointers
 * (contiguous in k), c[i] GEMM_MR output row pointers: a caller with fewer
 * rows points the spare a[i] at a valid row and the spare c[i] at a
 * GEMM_NR-float dummy. Each c[i][j] is one fp32 accumulator updated by a
 * multiply then an add per k, so an element's value never depends on i, on
 * the other rows, or on nr; splitting k into blocks with load = 1 after the
 * first continues the same sum exactly. */
void gemm_cpu_tile(const float *const a[GEMM_MR], const float *b, size_t ldb, int kn, int nr,
                   float *const c[GEMM_MR], int load);

/* Softmax numerators of one row, in place (softmax_cpu.c):
 *   s[j] = exp(s[j] - max_j s[j]) for j < n,  s[j] = 0 for n <= j < pad4(n),
 * returning sum_j s[j]. s must have room for n rounded up to a multiple of 4.
 * exp is a 4-lane polynomial (relative error < 1.4 * 2^-24; arguments below -87 give
 * exp(-87)), the sum keeps 4 lane partials combined as (0+1)+(2+3): a fixed
 * order that depends only on n. n >= 1. */
float cpu_softmax_row(float *s, int n);

/* Argument checks shared by the ops (ops_cpu.c): each writes "<op>: ..." and
 * returns -1. offsets[0 .. n] must start >= 0 and never decrease; map[0 .. n)
 * must lie in [0, nu) (nu < 0: upper bound unknown). */
int cpu_check_offsets(const char *op, const int64_t *offsets, int n, bk_err *err);
int cpu_check_map(const char *op, const int32_t *map, int n, int nu, bk_err *err);
int cpu_bad_dims(const char *op, const char *what, long long v, bk_err *err);

/* One activation in fp32 (libm's erfcf, expf, tanhf: exact functions, not
 * approximations). NaN stays NaN, as in PyTorch. */
static inline float cpu_activate(float v, enum bk_act act)
{
    switch (act) {
    case BK_ACT_RELU: return v < 0.0f ? 0.0f : v;
    case BK_ACT_SIGMOID: return 1.0f / (1.0f + expf(-v));
    case BK_ACT_GELU: return 0.5f * v * erfcf(-v * 0.70710678118654752f); /* = 0.5 v (1 + erf(v/√2)), no cancellation for v << 0 */
    case BK_ACT_SILU: return v / (1.0f + expf(-v));
    case BK_ACT_TANH: return tanhf(v);
    default: return v;
    }
}

/* The ops (ops_cpu.c, rank_cpu.c), with backend.h's signatures. */
int cpu_embedding_bag(bk_stream *s, const bk_weight *table, const int64_t *ids,
                      const int64_t *offsets, int n, enum bk_pool pool, void *out, int ld,
                      bk_err *err);
int cpu_embedding_bags(bk_stream *s, const bk_bag *bags, int n, bk_err *err);
int cpu_history_embedding(bk_stream *s, const bk_weight *table, const bk_weight *action,
                          const bk_weight *position, const int64_t *ids, const int32_t *actions,
                          const int64_t *offsets, int n, void *out, bk_err *err);
int cpu_linear(bk_stream *s, const void *x, int ldx, int rows, const bk_weight *w,
               const bk_weight *bias, enum bk_act act, void *y, int ldy, bk_err *err);
int cpu_mlp2(bk_stream *s, const void *x, int ldx, int rows, const bk_weight *w1,
             const bk_weight *b1, enum bk_act act1, const bk_weight *w2, const bk_mlp2_addend *a,
             const void *addu, const int32_t *map, enum bk_act act2, void *y, int ldy, bk_err *err);
int cpu_linear_grouped(bk_stream *s, const void *x, int ldx, int64_t gx, int groups, int g,
                       const bk_weight *w, const bk_weight *bias, enum bk_act act, void *y,
                       int ldy, int64_t gy, bk_err *err);
int cpu_lce(bk_stream *s, const void *eu, int nu, const void *ec, int nc, const int32_t *map,
            const bk_weight *w_user, const bk_weight *w_cand, int ku, int kc, int m, int d,
            void *z, bk_err *err);
int cpu_attention(bk_stream *s, const void *q, const void *k, const void *v, int ldkv,
                  const int64_t *offsets, int nu, const int32_t *map, int nc, int tq, int heads,
                  int dh, void *o, int64_t go, bk_err *err);
int cpu_self_attention(bk_stream *s, const bk_seq_att *a, bk_err *err);
int cpu_din_attention(bk_stream *s, const void *q, const void *qp, const void *h, const void *hp,
                      const int64_t *offsets, const int32_t *map, int n, int d, int h1,
                      const bk_weight *wd, const bk_weight *w2, const bk_weight *b2,
                      enum bk_act act, int normalize, void *out, bk_err *err);
int cpu_add(bk_stream *s, const void *a, const void *b, const int32_t *map, int n, int width,
            void *out, bk_err *err);
int cpu_copy_rows(bk_stream *s, const void *src, int lds, const int32_t *map, int n, int width,
                  void *dst, int ldd, bk_err *err);
int cpu_gather(bk_stream *s, const void *src, const int64_t *src_offsets, const int32_t *map,
               int nc, const int64_t *dst_offsets, int width, void *dst, bk_err *err);
/* rank_cpu.c: the ops of the ranking architectures. */
int cpu_pool(bk_stream *s, const void *x, const int64_t *offsets, int n, int k, int d,
             enum bk_pool fn, void *out, int ld, bk_err *err);
int cpu_activation(bk_stream *s, const void *x, size_t n, enum bk_act act, void *out,
                   bk_err *err);
int cpu_layer_norm(bk_stream *s, const void *x, int rows, int dim, const bk_weight *w,
                   const bk_weight *b, float eps, void *out, bk_err *err);
int cpu_mul(bk_stream *s, const void *a, const void *b, const int32_t *map, const void *c, int n,
            int width, void *out, bk_err *err);
int cpu_token_linear(bk_stream *s, const void *x, int rows, const bk_weight *w, int k, int m,
                     int d, void *z, bk_err *err);
int cpu_dot_interaction(bk_stream *s, const void *tu, const void *uu, const int32_t *map,
                        const void *tc, int n, const bk_dot_order *ord, int d, int self, void *out,
                        bk_err *err);
int cpu_mixture(bk_stream *s, const void *const *experts, int n_experts, const void *gate, int n,
                int width, void *out, bk_err *err);

#endif
