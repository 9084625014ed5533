/* cuda_internal.h - what the CUDA backend's files share and nobody else sees.
 *
 * Why this exists: the CUDA backend is split by concern (backend_cuda.cu:
 * memory, streams, weights, conversions, the plain ops and linear through
 * cuBLASLt; lce.cu: the IKBO linear compression; attention.cu: the IKBO
 * target attention; lce_kern.cuh and att_wg.cuh: the kernel templates that
 * bench/kernels also instantiates; linear_small.cu: linear at a few rows;
 * linear_tk.cu: linear with short input rows on tensor cores; linear_wr.cu:
 * linear_grouped with W resident in shared memory;
 * graph.cu: recording and replaying a batch as a CUDA graph). They share the private structs, the
 * dtype dispatch and the error helpers declared here; the engine only ever
 * sees kernels/backend.h (tests and benches also cuda_paths.h).
 * The ranking-model ops sit one family per file: elementwise.cu (activation,
 * mul), norm.cu (layer_norm), pool.cu (pool), interact.cu (token_linear,
 * dot_interaction), mixture.cu (mixture).
 *
 * Activation dtype: chosen once per backend from IKBO_CUDA_DTYPE (bf16 by
 * default, fp16, or fp32 for tight checks against the CPU backend). Every
 * activation buffer and every weight is stored in it; every reduction
 * accumulates in fp32.
 */
#ifndef IKBO_CUDA_INTERNAL_H
#define IKBO_CUDA_INTERNAL_H

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

extern "C" {
#include "kernels/backend.h"
#include "kernels/cuda/cuda_paths.h"
}

enum cu_dtype { CU_F32 = 0, CU_BF16 = 1, CU_F16 = 2 };

typedef struct cuda_backend {
    int ordinal;
    enum cu_dtype dtype;
    int sm_count;
    size_t smem_optin; /* max dynamic shared memory per block */
    size_t l2_bytes;   /* L2 cache size */
    /* enum cu_path of the lce and attention ops: CU_PATH_AUTO (the kernel
     * chosen by shape, dtype and alignment) unless a test or benchmark
     * forced a fallback (bk_cuda_force_path). */
    int force_lce, force_att;
    /* IKBO_CUDA_LT_TUNE at creation: how many of cuBLASLt's heuristic
     * candidates a new linear shape times before keeping the fastest
     * (0/1 = the heuristic's first, no timing). A tuning switch for
     * cuBLASLt's algorithm, not a choice among our kernels. */
    int lt_tune;
    pthread_mutex_t lock; /* guards smem_fn, wblocks and weights' aug */
    bk_ledger ledger;     /* byte counts; alloc/free run on any thread */
    /* The blocks weights are sub-allocated from (backend_cuda.cu, "weight
     * blocks"); newest first. */
    struct cu_wblock *wblocks;
    int n_wblocks;
    /* Kernels whose dynamic shared memory limit was already raised on this
     * device (cudaFuncSetAttribute once, not per launch). */
    const void *smem_fn[64];
    int smem_bytes[64];
    int n_smem;
} cuda_backend;

/* A grow-only device buffer private to a stream (op scratch). Growing waits
 * for the stream first, so no queued kernel still reads the old block. */
typedef struct cu_scratch {
    void *p;
    size_t cap;
    enum bk_tag tag;
} cu_scratch;

/* One linear shape's cuBLASLt plan (see backend_cuda.cu): the descriptors
 * and the heuristic's algorithm, made on the shape's first call and reused,
 * so a steady-state linear is one cublasLtMatmul. */
typedef struct cu_algo_entry {
    int valid;
    int m, n, k, lda, ldb, ldd, epi, align_a, align_b, align_d, dtype;
    int batch;          /* > 1: a strided batch (linear_grouped), W shared */
    int sms;            /* > 0: planned for that many SMs (cu_linear_on_sms) */
    int64_t sb, sd;     /* x's and y's batch strides, elements */
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulAlgo_t algo;
} cu_algo_entry;

#define CU_ALGO_CACHE 128

/* Pinned host staging, one per stream: every host<->device copy goes through
 * it, so copies are truly asynchronous (a pageable copy may wait for the
 * stream, and pageable D2H always does). Bump-allocated between
 * synchronizations; reset when the stream is known idle (sync,
 * download_f32). Grown on demand: a batch that outgrows it waits for the
 * stream once and the next idle point sizes it to the batch's high-water. */
typedef struct cu_pinned {
    char *p;
    size_t cap, used;
    size_t peak; /* bytes this batch asked for, wrap-arounds included */
} cu_pinned;

/* Where a stream's time goes (IKBO_CUDA_PROFILE=1, a diagnostic): every op
 * records its host time and a pair of CUDA events; at each synchronization
 * the batch's events are read and summed per op, and stream_free prints the
 * per-batch means to stderr. Off: one branch per op.
 *
 * Each op call also declares its work (cu_prof_scope::work), and the report
 * sets its GPU time against its floor (issue 17's target: the bench model's
 * forward within 1.4x the sum of its ops' floors):
 *   floor = max(FLOPs / GEMM rate, bytes / copy bandwidth)
 * bytes: the call's compulsory HBM traffic - every input read once, every
 * output written once, every weight read once; a row read through the
 * candidate-to-user map counts the user row once, not per candidate; an
 * embedding table read by ids counts ids * row bytes; activations and
 * weights at the activation dtype's size, fp32 scratch as fp32, index
 * arrays at their int size. FLOPs: multiply-add = 2, dominant terms only
 * (GEMMs, attention's QK^T and PV, LCE's two GEMMs); elementwise and copy
 * ops have none (their floor is the bandwidth one). The ceilings are
 * measured once per process and dtype (backend_cuda.cu, prof_ceilings):
 * the best of 3 device-to-device copies of 1 GiB (read + write) and of 3
 * cuBLASLt 8192^3 GEMMs in the activation dtype (fp32 accumulate), as
 * linear runs them. Transfers (upload, upload_f32, download_f32, sync) have
 * no floor and stay out of both sums.
 *
 * The gate: an op's events time what the GPU does between them, and when
 * the GPU has caught up with the host (a batch's first ops: history,
 * bags, the small linears) that includes the host's own time to issue the
 * op. So by default (IKBO_CUDA_PROFILE=1) each batch's first op is
 * preceded by a one-thread gate kernel that holds the stream until the
 * host first waits on it (cu_prof_release: every blocking wait of the
 * backend calls it), so the GPU runs the whole batch back to back from a
 * full queue, as a batch graph's replay does, and an op's time is its own.
 * A gate not released within CU_PROF_GATE_MS opens by itself (a wait this
 * file does not know of: the report counts them). IKBO_CUDA_PROFILE=host
 * records the events as the host issues the ops, without the gate. */
#define CU_PROF_MAX 512
#define CU_PROF_NAMES 64
#define CU_PROF_UPLOADS 8
enum cu_work { CU_WORK_NONE = 0, CU_WORK_OP = 1, CU_WORK_TRANSFER = 2 };
typedef struct cu_prof_stat {
    const char *name;
    double calls, host_us, gpu_us;
    double floor_us, floor_calls; /* over the calls that declared work */
    int transfer;
} cu_prof_stat;
/* The ceilings a floor divides by; ok = 0: not measured (why says so). */
typedef struct cu_ceil {
    int ok;
    const char *dtype;
    double copy_bps, gemm_flops; /* bytes/s (read + write), FLOP/s */
    char why[200];
} cu_ceil;
/* A raw upload of the current batch: device range and its bytes in the
 * stream's pinned staging (valid until the staging is reused: host_stage
 * wraps or host_idle; both forget the list). The jagged ops read their
 * lengths here (cu_prof_jagged): the engine uploads every index array of a
 * batch in one copy (engine.c), so the host already has what the device
 * reads, with no extra copy or wait. */
typedef struct cu_prof_upload {
    const char *dev, *host;
    size_t bytes;
} cu_prof_upload;
typedef struct cu_prof {
    int skip;    /* batches still to discard (warm-up) */
    int depth;   /* nested scopes (token_linear -> lce) count once */
    int n;       /* ops recorded in the current batch */
    int dropped; /* ops past CU_PROF_MAX (not timed) */
    const char *name[CU_PROF_MAX];
    double host_us[CU_PROF_MAX];
    double flops[CU_PROF_MAX], bytes[CU_PROF_MAX]; /* declared work */
    signed char kind[CU_PROF_MAX];                 /* enum cu_work */
    cudaEvent_t ev[2 * CU_PROF_MAX];
    double t_first; /* host clock at the batch's first op (us) */
    long batches;
    double wall_us, span_us, busy_us;
    double ops_wall_us; /* first op's start to last op's end, transfers out */
    cu_prof_stat st[CU_PROF_NAMES];
    int nst;
    /* Per-shape op names ("linear 1120x16>190464"), so a batch's linears
     * are reported one by one; they live as long as the profile. */
    char shape_name[CU_PROF_NAMES][40];
    int n_shape;
    cu_ceil ceil;
    cu_prof_upload up[CU_PROF_UPLOADS]; /* a ring: the newest CU_PROF_UPLOADS */
    int n_up;
    /* The timeline (backend_cuda.cu, prof_timeline): each op call of a
     * batch in issue order, on its stream (lane: the user lane), its start
     * and end after the batch's first op's start, summed over the batches
     * whose calls matched the first counted batch's names one for one
     * (tl_other counts the rest). Shows the gaps between ops on a stream
     * and what the other stream runs beside them, which the per-op sums
     * cannot. */
    signed char lane[CU_PROF_MAX];
    const char *tl_name[CU_PROF_MAX];
    signed char tl_lane[CU_PROF_MAX];
    double tl_t0[CU_PROF_MAX], tl_t1[CU_PROF_MAX];
    double tl_c0[CU_PROF_MAX], tl_c1[CU_PROF_MAX]; /* the batch being closed */
    int tl_n;
    long tl_batches, tl_other;
    /* The gate: [0] the host's release count, [1] gates that timed out
     * (written by the device); pinned and mapped; NULL: no gate (host). */
    volatile unsigned *gate_h;
    unsigned *gate_d;
    unsigned gate_seq; /* gates launched */
    int gate_held;     /* the newest gate is not released yet */
} cu_prof;
#define CU_PROF_GATE_MS 50
/* Releases the stream's profile gate, if one holds it (see cu_prof): call
 * before any host wait on the stream. No-op without profiling. */
void cu_prof_release(bk_stream *s);

struct bk_stream {
    bk_backend *be;
    cudaStream_t st;
    cublasLtHandle_t lt;
    void *ws; /* cuBLASLt workspace */
    size_t ws_size;
    cu_pinned host;      /* pinned staging for every host copy            */
    cu_scratch lce_y;    /* LCE user term at nu user rows (lce.cu)        */
    cu_scratch att_tile; /* attention tile table                         */
    cu_scratch mlp2_part; /* mlp2's slice partials or composed chunk (mlp2.cu) */
    cu_algo_entry algos[CU_ALGO_CACHE];
    int algo_next;
    cu_prof *prof; /* NULL unless IKBO_CUDA_PROFILE */
    /* stream_set_spin: < 0 = cudaStreamSynchronize; else poll `done` for
     * spin_us, then cudaEventSynchronize on it (a blocking-sync event). */
    long long spin_us;
    cudaEvent_t done;
    /* Batch graphs (graph.cu). gen counts moves of the stream's private
     * buffers (staging, scratch): a graph recorded at another gen points at
     * freed memory and is refused. */
    unsigned long gen;
    /* be->lane: on a stream, the lane it owns (NULL until asked for); on
     * a lane, its owner, whose gen, profile and graph state the lane's ops
     * use (NULL on a stream). lane_open (owner): the lane waited for the
     * owner since the owner last waited for the lane, so its work may be
     * in a recording the owner must join before it ends. ev: lane_wait's
     * event, recorded on this stream and waited on by the other. */
    bk_stream *lane, *owner;
    int lane_open;
    cudaEvent_t ev;
    int gmode;             /* enum cu_gmode */
    bk_graph *grec;        /* capture: the graph being recorded; then done */
    const bk_graph *gplay; /* replay: the graph replayed */
    int gnext;             /* replay: the next staged copy to check */
};

/* A move of the stream's private buffers (graph.cu's gen): a lane's count
 * in its owner, whose graphs replay the lane's work too. */
static inline void cu_gen_bump(bk_stream *s) { (s->owner ? s->owner : s)->gen++; }
/* The owner waits for everything queued on its lane, if the lane was
 * forked from it and not joined since (download_f32, sync, the end of a
 * recording). */
int cu_lane_join(bk_stream *s, bk_err *err);

/* ------------------------------------------------------------ graphs
 * (graph.cu; the contract is backend.h's graph_* entries) */
enum cu_gmode { CU_G_OFF = 0, CU_G_CAPTURE = 1, CU_G_REPLAY = 2 };
/* Every staged host<->device copy of the backend: queued (and recorded)
 * normally; while replaying, only checked against the recorded copy. */
int cu_copy(bk_stream *s, void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
            bk_err *err);
/* download_f32 calls it after queueing its copy, before it waits: ends a
 * recording and launches it, or launches the replayed graph. */
int cu_graph_run(bk_stream *s, bk_err *err);
/* Fails when the stream is replaying (ops are not called then). */
int cu_graph_refuse(bk_stream *s, bk_err *err);
/* Stream teardown: drops a recording still held. */
void cu_graph_stream_free(bk_stream *s);
/* The backend table's graph entries. */
void cu_graph_install(bk_backend *be);

struct bk_weight {
    int rows, cols;
    int ld;      /* row stride in elements: cols rounded up to a multiple of 8 */
    void *data;  /* activation dtype [rows, ld], zero columns past cols */
    size_t bytes;
    /* A layout of this weight that one op builds on first use and that is
     * freed with it (mlp2.cu: W1a, W1 with b1 as a column). Written once,
     * under the backend's lock; read under it. */
    void *aug;
    const void *aug_key; /* what aug was built with besides this weight (b1) */
    size_t aug_bytes;
};

static inline cuda_backend *cu_impl(bk_backend *be) { return (cuda_backend *)be->impl; }
static inline enum cu_dtype cu_dt(bk_stream *s) { return cu_impl(s->be)->dtype; }

/* cudaMalloc of bytes (IKBO_FAULT alloc injects a failure), with an error
 * naming the device, the bytes and the free memory. */
void *cu_dev_malloc(bk_backend *be, size_t bytes, bk_err *err);

/* Error helpers: every CUDA status becomes a bk_err message naming the step. */
int cu_check(cudaError_t e, bk_err *err, const char *what);
int cu_check_launch(bk_stream *s, bk_err *err, const char *what); /* also IKBO_FAULT launch */
int cu_scratch_get(bk_stream *s, cu_scratch *sc, size_t bytes, bk_err *err);
/* Binds the stream's device; the start of every op. */
int cu_enter(bk_stream *s, bk_err *err);
/* Raises fn's dynamic shared memory limit to bytes, once per backend and
 * kernel rather than before every launch. */
int cu_smem_limit(bk_stream *s, const void *fn, int bytes, bk_err *err);

/* Times one op while profiling (see cu_prof); `closes`: the op ends with
 * the stream idle (download_f32, sync), so the batch's events are read. */
struct cu_prof_scope {
    bk_stream *s;
    int i; /* the call's event slot; -1 when not profiled (off, nested, dropped) */
    bool closes;
    double t0;
    cu_prof_scope(bk_stream *st, const char *name, bool closes_batch = false);
    ~cu_prof_scope();
    /* Whether this call is profiled: ops compute their work only then. */
    bool on() const { return i >= 0; }
    /* The call's compulsory work (see cu_prof): dominant FLOPs and bytes. */
    void work(double flops, double bytes)
    {
        if (i < 0)
            return;
        s->prof->flops[i] = flops;
        s->prof->bytes[i] = bytes;
        s->prof->kind[i] = CU_WORK_OP;
    }
    /* A host<->device transfer or a wait, not an op: no floor. */
    void transfer()
    {
        if (i >= 0)
            s->prof->kind[i] = CU_WORK_TRANSFER;
    }
};

/* What a jagged or mapped op reads, for its profile work, from this batch's
 * host copies of its index arrays (cu_prof_upload). For rows r < n, user
 * u(r) = map ? map[r] : r and L_u = off[u+1] - off[u] (0 when off is
 * NULL). Distinct users are counted as runs of equal map values: the
 * engine's map is non-decreasing (ikbo.h); an unsorted map over-counts. */
typedef struct cu_prof_jag {
    double pairs;    /* sum over r of L_u(r): rows read per row through its user */
    double users;    /* distinct users */
    double urows;    /* sum of L_u over distinct users: each user's rows once */
    double sq, tri;  /* sum over distinct users of L_u^2 and L_u (L_u + 1) / 2 */
    double nonempty; /* rows r with L_u(r) > 0 */
    double maxlen;   /* the longest L_u */
} cu_prof_jag;
/* 0, or -1 when map or off is not in this batch's uploads (the op then
 * declares no work and the report lists it as an op without a floor). */
int cu_prof_jagged(bk_stream *s, const int64_t *off, const int32_t *map, int n, cu_prof_jag *j);

#define CU_TRY(call, what)                                                    \
    do {                                                                      \
        if (cu_check((call), err, (what))) return -1;                         \
    } while (0)

/* Element conversions. */
template <typename T> __host__ __device__ inline float cu_tof(T x);
template <> __host__ __device__ inline float cu_tof<float>(float x) { return x; }
template <> __host__ __device__ inline float cu_tof<__nv_bfloat16>(__nv_bfloat16 x)
{
    return __bfloat162float(x);
}
template <> __host__ __device__ inline float cu_tof<__half>(__half x) { return __half2float(x); }

template <typename T> __host__ __device__ inline T cu_fromf(float x);
template <> __host__ __device__ inline float cu_fromf<float>(float x) { return x; }
template <> __host__ __device__ inline __nv_bfloat16 cu_fromf<__nv_bfloat16>(float x)
{
    return __float2bfloat16_rn(x);
}
template <> __host__ __device__ inline __half cu_fromf<__half>(float x) { return __float2half_rn(x); }

/* Runs the body (the arguments after DT; a braced block may hold commas)
 * with T bound to the activation type of dtype DT. */
#define CU_DISPATCH(DT, ...)                                                  \
    do {                                                                      \
        switch (DT) {                                                         \
        case CU_F32: { typedef float T; __VA_ARGS__; } break;                 \
        case CU_BF16: { typedef __nv_bfloat16 T; __VA_ARGS__; } break;        \
        case CU_F16: { typedef __half T; __VA_ARGS__; } break;                \
        }                                                                     \
    } while (0)

/* act(x) in fp32 for every bk_act but NONE (identity): exact gelu (erf),
 * shared by the activation op and linear's activation pass. */
__device__ __forceinline__ float cu_act_f(float x, int act)
{
    switch (act) {
    case BK_ACT_RELU: return x > 0.0f ? x : 0.0f;
    case BK_ACT_SIGMOID: return 1.0f / (1.0f + expf(-x));
    case BK_ACT_GELU: return 0.5f * x * erfcf(-x * 0.70710678118654752f); /* no cancellation for x << 0 */
    case BK_ACT_SILU: return x / (1.0f + expf(-x));
    case BK_ACT_TANH: return tanhf(x);
    default: return x;
    }
}

/* linear at rows <= CU_SMALL_ROWS as one pass over W (linear_small.cu):
 * cuda_linear takes it where cu_linear_small_fits and linear_tk does not
 * apply, cuBLASLt elsewhere.
 * Arguments as backend.h's linear, already checked. */
#define CU_SMALL_ROWS 16
int cu_linear_small_fits(int rows, const bk_weight *w);
int cu_linear_small(bk_stream *s, const void *x, int ldx, int rows, const bk_weight *w,
                    const bk_weight *bias, enum bk_act act, void *y, int ldy, bk_err *err);

/* linear with short input rows (W's ld <= 64) and many outputs on tensor
 * cores (linear_tk.cu): cuda_linear takes it first where
 * cu_linear_tk_fits(dtype, rows, W, y, ldy). Arguments as backend.h's
 * linear, already checked. */
int cu_linear_tk_fits(enum cu_dtype dt, int rows, const bk_weight *w, const void *y, int ldy);
int cu_linear_tk(bk_stream *s, const void *x, int ldx, int rows, const bk_weight *w,
                 const bk_weight *bias, enum bk_act act, void *y, int ldy, bk_err *err);

/* linear_grouped with W resident in shared memory (in <= 256) over many
 * rows in groups of g rows gx/gy elements apart (linear_wr.cu):
 * cuda_linear_grouped takes it where cu_linear_wr_fits (total rows, W,
 * operands and strides). act NONE or RELU; arguments already checked
 * (bk_grouped_check). */
int cu_linear_wr_fits(enum cu_dtype dt, int rows, const bk_weight *w, const void *x, int ldx,
                      int64_t gx, const void *y, int ldy, int64_t gy);
int cu_linear_wr(bk_stream *s, const void *x, int ldx, int64_t gx, int groups, int g,
                 const bk_weight *w, const bk_weight *bias, enum bk_act act, void *y, int ldy,
                 int64_t gy, bk_err *err);

/* backend.h's linear (backend_cuda.cu), for ops that compose it (mlp2.cu:
 * W may be a view of another weight's rows or columns, ld its row stride). */
int cuda_linear(bk_stream *s, const void *x, int ldx, int rows, const bk_weight *w,
                const bk_weight *bias, enum bk_act act, void *y, int ldy, bk_err *err);
/* cuda_linear planned for `sms` SMs of the device (cuBLASLt's SM count
 * target), for a linear run beside a kernel that holds the other SMs
 * (mlp2.cu's addend). The plan, so the result's bits, depend on sms. */
int cu_linear_on_sms(bk_stream *s, int sms, const void *x, int ldx, int rows, const bk_weight *w,
                     const bk_weight *bias, enum bk_act act, void *y, int ldy, bk_err *err);
/* backend.h's mlp2 (mlp2.cu). */
int cuda_mlp2(bk_stream *s, const void *x, int ldx, int rows, const bk_weight *w1,
              const bk_weight *b1, enum bk_act act1, const bk_weight *w2,
              const bk_mlp2_addend *a, const void *addu, const int32_t *map, enum bk_act act2,
              void *y, int ldy, bk_err *err);

/* Grid size for a grid-stride loop over n items (backend_cuda.cu). */
unsigned cu_grid_for(size_t n, unsigned block);

/* y[r, j] = act(y[r, j]) for rows x width (row stride ldy), in place: the
 * activation op's kernel, also linear's pass for what cuBLASLt's epilogues
 * lack (sigmoid, exact gelu, silu, tanh). elementwise.cu. */
int cu_act_rows(bk_stream *s, void *y, int ldy, int rows, int width, enum bk_act act,
                bk_err *err);

/* y[r, :] = a[r, :] + b[map ? map[r] : r, :] for rows x width, each with its
 * row stride; a or b NULL reads as zeros; y may be a (elementwise.cu: the
 * add op's kernel and mlp2's sums; `what` names the launch in errors). */
int cu_add_rows(bk_stream *s, const void *a, int lda, const void *b, int ldb,
                const int32_t *map, void *y, int ldy, int rows, int width, const char *what,
                bk_err *err);

/* The ranking-model ops (elementwise.cu, norm.cu, pool.cu, interact.cu,
 * mixture.cu), with backend.h's signatures. */
int cuda_activation(bk_stream *s, const void *x, size_t n, enum bk_act act, void *out,
                    bk_err *err);
int cuda_mul(bk_stream *s, const void *a, const void *b, const int32_t *map, const void *c, int n,
             int width, void *out, bk_err *err);
int cuda_layer_norm(bk_stream *s, const void *x, int rows, int dim, const bk_weight *w,
                    const bk_weight *b, float eps, void *out, bk_err *err);
int cuda_pool(bk_stream *s, const void *x, const int64_t *offsets, int n, int k, int d,
              enum bk_pool fn, void *out, int ld, bk_err *err);
int cuda_token_linear(bk_stream *s, const void *x, int rows, const bk_weight *w, int k, int m,
                      int d, void *z, bk_err *err);
int cuda_dot_interaction(bk_stream *s, const void *tu, const void *uu, const int32_t *map,
                         const void *tc, int n, const bk_dot_order *ord, int d, int self,
                         void *out, bk_err *err);
int cuda_mixture(bk_stream *s, const void *const *experts, int n_experts, const void *gate, int n,
                 int width, void *out, bk_err *err);

/* 16-byte vectors of V = 16 / sizeof(T) elements, for the memory-bound
 * kernels: loads widen to fp32, stores round once. */
static inline bool cu_aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }
template <typename T> struct cu_vec {
    static constexpr int V = 16 / sizeof(T);
    __device__ __forceinline__ static void load(const T *p, float *f)
    {
        uint4 u = *(const uint4 *)p;
        const T *t = (const T *)&u;
#pragma unroll
        for (int i = 0; i < V; i++)
            f[i] = cu_tof<T>(t[i]);
    }
    __device__ __forceinline__ static void store(T *p, const float *f)
    {
        uint4 u;
        T *t = (T *)&u;
#pragma unroll
        for (int i = 0; i < V; i++)
            t[i] = cu_fromf<T>(f[i]);
        *(uint4 *)p = u;
    }
};

/* The IKBO ops (lce.cu, attention.cu), with backend.h's signatures. */
int cuda_lce(bk_stream *s, const void *eu, int nu, const void *ec, int nc, const int32_t *map,
             const bk_weight *w_user, const bk_weight *w_cand, int ku, int kc, int m, int d,
             void *z, bk_err *err);
int cuda_attention(bk_stream *s, const void *q, const void *k, const void *v, int ldkv,
                   const int64_t *offsets, int nu, const int32_t *map, int nc, int tq, int heads,
                   int dh, void *o, int64_t go, bk_err *err);
int cuda_self_attention(bk_stream *s, const bk_seq_att *a, bk_err *err);
int cuda_din_attention(bk_stream *s, const void *q, const void *qp, const void *h,
                       const void *hp, const int64_t *offsets, const int32_t *map, int n, int d,
                       int h1, const bk_weight *wd, const bk_weight *w2, const bk_weight *b2,
                       enum bk_act act, int normalize, void *out, bk_err *err); /* din.cu */

#endif
