/* backend_cuda.cu - the CUDA backend's op table: device memory with per-tag
 * byte accounting, streams (CUDA stream + cuBLASLt handle + workspace),
 * weights, dtype conversion, the plain ops, linear through cuBLASLt, and the
 * constructor bk_cuda_new (and bk_cuda_force_path, for tests: cuda_paths.h).
 *
 * Why this exists: it lets `--device cuda:N` serve any model the CPU backend
 * serves. The IKBO ops live beside it (lce.cu, attention.cu), and so do the
 * ranking-model ops (elementwise.cu, norm.cu, pool.cu, interact.cu,
 * mixture.cu; see cuda_internal.h); everything
 * here is either memory plumbing or a simple memory-bound kernel that does
 * one pass over its data.
 *
 * Byte accounting: buffers from alloc carry the caller's tag. Stream-private
 * scratch is accounted too: the LCE user term (U rows) as BK_TAG_USER, the
 * attention tile table as BK_TAG_INDEX. The cuBLASLt workspace (fixed size,
 * one per stream) is not tagged.
 *
 * Per-batch fixed costs (measured with IKBO_CUDA_PROFILE, bench/e2e/
 * batch_phases.c): host copies go through a pinned staging buffer per stream
 * (truly asynchronous; fp32 <-> activation dtype conversion on the host, no
 * conversion kernels); a linear shape's cuBLASLt descriptors and algorithm
 * are made once; a kernel's shared memory limit is raised once; the stream
 * waits only in download_f32 and sync. The profile also sets each op's GPU
 * time against its floor (cuda_internal.h, cu_prof), with the copy and GEMM
 * ceilings measured when the first profiled stream starts (section
 * "profile ceilings").
 *
 * Errors: every CUDA and cuBLAS status is checked and becomes a bk_err that
 * names the step. A kernel fault is reported by the next call that waits on
 * the stream (download_f32, sync); after such a fault the CUDA context is
 * unusable and every later call on it fails with that message.
 */
#include <chrono>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cudaTypedefs.h>

#include "kernels/cuda/cuda_internal.h"
#include "kernels/cuda/tma_util.cuh"

#define WS_BYTES ((size_t)32 << 20) /* cuBLASLt workspace per stream (Hopper advice) */
#define MIN_ALLOC 256

/* ------------------------------------------------------------ errors */

int cu_check(cudaError_t e, bk_err *err, const char *what)
{
    if (e == cudaSuccess)
        return 0;
    (void)cudaGetLastError(); /* clear a non-sticky error so the next call starts clean */
    bk_seterr(err, "cuda: %s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
    return -1;
}

int cu_check_launch(bk_stream *s, bk_err *err, const char *what)
{
    if (bk_fault_hit(&s->be->fault, BK_FAULT_LAUNCH)) {
        (void)cudaGetLastError();
        bk_seterr(err, "cuda: %s: launch failed" BK_FAULT_INJECTED, what);
        return -1;
    }
    return cu_check(cudaGetLastError(), err, what);
}

/* The stream's end, waited for as stream_set_spin says (backend.h), or the
 * failure IKBO_FAULT injects at this wait. An event's wait reports an
 * earlier asynchronous failure as cudaStreamSynchronize does. */
static int stream_wait(bk_stream *s, bk_err *err, const char *what)
{
    if (bk_fault_wait(&s->be->fault, what, err))
        return -1;
    cu_prof_release(s);
    if (s->spin_us < 0)
        return cu_check(cudaStreamSynchronize(s->st), err, what);
    if (cu_check(cudaEventRecord(s->done, s->st), err, what))
        return -1;
    cudaError_t e = cudaErrorNotReady;
    if (s->spin_us > 0) {
        typedef std::chrono::steady_clock clk;
        const clk::time_point end = clk::now() + std::chrono::microseconds(s->spin_us);
        while ((e = cudaEventQuery(s->done)) == cudaErrorNotReady && clk::now() < end) {
        }
    }
    return cu_check(e == cudaErrorNotReady ? cudaEventSynchronize(s->done) : e, err, what);
}

/* The errors after which the runtime says "the process must be terminated
 * and relaunched" (driver_types.h): the context is unusable, and every later
 * call on the device returns the same error. */
static bool cu_sticky(cudaError_t e)
{
    switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchTimeout:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchFailure:
    case cudaErrorTensorMemoryLeak:
    case cudaErrorMpsClientTerminated:
    case cudaErrorContained:
    case cudaErrorECCUncorrectable:
    case cudaErrorNvlinkUncorrectable:
        return true;
    default:
        return false;
    }
}

/* backend.h lost: an injected loss, else a call that touches the context
 * without waiting for it (a sticky error is returned by every such call). */
static int cuda_lost(bk_backend *be, bk_err *why)
{
    if (bk_fault_lost(&be->fault, why))
        return 1;
    const int dev = cu_impl(be)->ordinal;
    size_t fr = 0, tot = 0;
    cudaError_t e = cudaSetDevice(dev);
    if (e == cudaSuccess)
        e = cudaMemGetInfo(&fr, &tot);
    if (!cu_sticky(e)) {
        (void)cudaGetLastError(); /* a non-sticky error is not a loss; start the next call clean */
        return 0;
    }
    bk_seterr(why, "cuda:%d is lost: %s (%s); only a new process can use it", dev,
              cudaGetErrorString(e), cudaGetErrorName(e));
    return 1;
}

static int cuda_stream_set_spin(bk_stream *s, long long spin_us, bk_err *err)
{
    if (spin_us >= 0 && !s->done &&
        cu_check(cudaEventCreateWithFlags(&s->done, cudaEventBlockingSync | cudaEventDisableTiming),
                 err, "wait event create"))
        return -1;
    s->spin_us = spin_us;
    return 0;
}

static const char *blas_status_name(cublasStatus_t st)
{
    switch (st) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "cuBLAS error";
    }
}

static int blas_check(cublasStatus_t st, bk_err *err, const char *what)
{
    if (st == CUBLAS_STATUS_SUCCESS)
        return 0;
    bk_seterr(err, "cublasLt: %s: %s (%d)", what, blas_status_name(st), (int)st);
    return -1;
}

#define BLAS_TRY(call, what)                                                  \
    do {                                                                      \
        if (blas_check((call), err, (what))) goto fail;                       \
    } while (0)

/* Server threads call ops from wherever they run; bind the backend's device. */
static int enter(bk_backend *be, bk_err *err)
{
    return cu_check(cudaSetDevice(cu_impl(be)->ordinal), err, "cudaSetDevice");
}

/* ------------------------------------------------------------ profile */

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

/* The process's ceilings for the stream's dtype (measured on the first
 * profiled stream of that dtype: prof_ceilings, after linear). */
static void prof_ceilings(bk_stream *s, cu_ceil *out);

/* The profile's gate (cu_prof): one thread polls the host's release
 * count in mapped memory until it reaches seq, or until CU_PROF_GATE_MS
 * have passed (then it counts a timeout and opens). */
__global__ void k_prof_gate(const volatile unsigned *rel, unsigned seq, volatile unsigned *timeouts)
{
    uint64_t t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    while ((int)(*rel - seq) < 0) {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        if (t - t0 > (uint64_t)CU_PROF_GATE_MS * 1000000u) {
            *timeouts = *timeouts + 1;
            return;
        }
        __nanosleep(1000);
    }
}

/* The gate's pinned words (cu_prof), unless IKBO_CUDA_PROFILE=host; when
 * mapped memory cannot be had the profile runs ungated and says so. */
static void prof_gate_new(cu_prof *p, const char *mode)
{
    void *h = NULL;
    if (!strcmp(mode, "host"))
        return;
    if (cudaHostAlloc(&h, 2 * sizeof(unsigned), cudaHostAllocMapped) != cudaSuccess ||
        cudaHostGetDevicePointer((void **)&p->gate_d, h, 0) != cudaSuccess) {
        (void)cudaGetLastError();
        if (h)
            cudaFreeHost(h);
        fprintf(stderr, "cuda profile: no mapped memory for the gate; timing ops as issued\n");
        return;
    }
    p->gate_h = (volatile unsigned *)h;
    p->gate_h[0] = p->gate_h[1] = 0;
}

void cu_prof_release(bk_stream *s)
{
    cu_prof *p = s->prof;
    if (!p || !p->gate_held)
        return;
    p->gate_h[0] = p->gate_seq;
    __sync_synchronize();
    p->gate_held = 0;
}

static cu_prof *prof_new(bk_stream *s)
{
    const char *v = getenv("IKBO_CUDA_PROFILE");
    if (!v || !*v || !strcmp(v, "0"))
        return NULL;
    cu_prof *p = (cu_prof *)calloc(1, sizeof *p);
    if (!p)
        return NULL;
    const char *sk = getenv("IKBO_CUDA_PROFILE_SKIP");
    p->skip = sk && *sk ? atoi(sk) : 3;
    for (int i = 0; i < 2 * CU_PROF_MAX; i++)
        if (cudaEventCreate(&p->ev[i]) != cudaSuccess) {
            (void)cudaGetLastError();
            for (int j = 0; j < i; j++)
                cudaEventDestroy(p->ev[j]);
            free(p);
            return NULL;
        }
    prof_ceilings(s, &p->ceil);
    prof_gate_new(p, v);
    return p;
}

cu_prof_scope::cu_prof_scope(bk_stream *st, const char *name, bool closes_batch)
    : s(st), i(-1), closes(closes_batch), t0(0)
{
    cu_prof *p = s->prof;
    if (!p || p->depth++ > 0)
        return;
    t0 = now_us();
    if (p->n == 0 && p->dropped == 0) {
        p->t_first = t0;
        if (p->gate_h && !p->gate_held) {
            k_prof_gate<<<1, 1, 0, s->st>>>(p->gate_d, ++p->gate_seq, p->gate_d + 1);
            p->gate_held = 1;
        }
    }
    if (p->n >= CU_PROF_MAX) {
        p->dropped++;
        return;
    }
    i = p->n++;
    p->name[i] = name;
    p->kind[i] = CU_WORK_NONE;
    p->lane[i] = s->owner != NULL;
    cudaEventRecord(p->ev[2 * i], s->st);
}

/* The one floor formula (see cu_prof): us, or -1 without ceilings. */
static double prof_floor_us(const cu_ceil *c, double flops, double bytes)
{
    if (!c->ok)
        return -1;
    double tf = flops / c->gemm_flops, tb = bytes / c->copy_bps;
    return (tf > tb ? tf : tb) * 1e6;
}

/* A raw upload's device range and its staged host bytes (cu_prof_upload). */
static void prof_note_upload(cu_prof *p, const void *dev, const void *host, size_t bytes)
{
    cu_prof_upload *u = &p->up[p->n_up++ % CU_PROF_UPLOADS];
    u->dev = (const char *)dev;
    u->host = (const char *)host;
    u->bytes = bytes;
}

/* The host copy of device bytes [dev, dev + bytes) uploaded in this batch
 * (the newest upload holding them), or NULL. */
static const void *prof_host(bk_stream *s, const void *dev, size_t bytes)
{
    cu_prof *p = s->prof;
    const char *d = (const char *)dev;
    int n = p->n_up < CU_PROF_UPLOADS ? p->n_up : CU_PROF_UPLOADS;
    for (int k = 0; k < n; k++) {
        const cu_prof_upload *u = &p->up[(p->n_up - 1 - k) % CU_PROF_UPLOADS];
        if (d >= u->dev && d < u->dev + u->bytes && bytes <= (size_t)(u->dev + u->bytes - d))
            return u->host + (d - u->dev);
    }
    return NULL;
}

int cu_prof_jagged(bk_stream *s, const int64_t *off, const int32_t *map, int n, cu_prof_jag *j)
{
    memset(j, 0, sizeof *j);
    if (!s->prof || n <= 0)
        return s->prof ? 0 : -1;
    const int32_t *m = map ? (const int32_t *)prof_host(s, map, (size_t)n * sizeof *map) : NULL;
    if (map && !m)
        return -1;
    int umax = n - 1;
    for (int r = 0; m && r < n; r++) {
        if (m[r] < 0)
            return -1;
        umax = r == 0 || m[r] > umax ? m[r] : umax;
    }
    const int64_t *o = off ? (const int64_t *)prof_host(s, off, ((size_t)umax + 2) * sizeof *off)
                           : NULL;
    if (off && !o)
        return -1;
    for (int r = 0; r < n; r++) {
        int u = m ? m[r] : r;
        double len = o ? (double)(o[u + 1] - o[u]) : 0;
        j->pairs += len;
        j->nonempty += len > 0;
        if (r == 0 || u != (m ? m[r - 1] : r - 1)) {
            j->users += 1;
            j->urows += len;
            j->sq += len * len;
            j->tri += len * (len + 1) / 2;
            j->maxlen = len > j->maxlen ? len : j->maxlen;
        }
    }
    return 0;
}

static cu_prof_stat *prof_stat(cu_prof *p, const char *name)
{
    for (int k = 0; k < p->nst; k++)
        if (!strcmp(p->st[k].name, name))
            return &p->st[k];
    if (p->nst == CU_PROF_NAMES)
        return NULL;
    p->st[p->nst].name = name;
    return &p->st[p->nst++];
}

/* The profile's name for one shape of an op: interned, so the report keeps
 * each shape apart; the plain op name once the table is full. */
static const char *prof_shape_name(cu_prof *p, const char *op, int rows, int in, int out)
{
    char nm[40];
    snprintf(nm, sizeof nm, "%s %dx%d>%d", op, rows, in, out);
    for (int k = 0; k < p->n_shape; k++)
        if (!strcmp(p->shape_name[k], nm))
            return p->shape_name[k];
    if (p->n_shape == CU_PROF_NAMES)
        return op;
    memcpy(p->shape_name[p->n_shape], nm, sizeof nm);
    return p->shape_name[p->n_shape++];
}

/* One timed call into its op's sums: time, and floor where it declared work. */
static void prof_add(cu_prof *p, int k, double gpu_us)
{
    cu_prof_stat *st = prof_stat(p, p->name[k]);
    if (!st)
        return;
    st->calls += 1;
    st->host_us += p->host_us[k];
    st->gpu_us += gpu_us;
    st->transfer |= p->kind[k] == CU_WORK_TRANSFER;
    double fl = p->kind[k] == CU_WORK_OP ? prof_floor_us(&p->ceil, p->flops[k], p->bytes[k]) : -1;
    if (fl >= 0) {
        st->floor_us += fl;
        st->floor_calls += 1;
    }
}

/* The batch's calls into the timeline (cu_prof): t0[k], t1[k] = call k's
 * start and end after the first op's start, in us. */
static void prof_timeline_add(cu_prof *p, const double *t0, const double *t1)
{
    if (p->tl_batches == 0 && p->tl_other == 0) {
        p->tl_n = p->n;
        for (int k = 0; k < p->n; k++) {
            p->tl_name[k] = p->name[k];
            p->tl_lane[k] = p->lane[k];
        }
    }
    int same = p->n == p->tl_n;
    for (int k = 0; same && k < p->n; k++)
        same = p->name[k] == p->tl_name[k] && p->lane[k] == p->tl_lane[k];
    if (!same) {
        p->tl_other++;
        return;
    }
    for (int k = 0; k < p->n; k++) {
        p->tl_t0[k] += t0[k];
        p->tl_t1[k] += t1[k];
    }
    p->tl_batches++;
}

/* The stream is idle: read the batch's events and add them up. A batch of
 * nothing but sync calls (a second sync after download_f32) is folded into
 * the previous batch rather than counted as one. */
static void prof_close(bk_stream *s)
{
    cu_prof *p = s->prof;
    int real = 0;
    cu_prof_release(s);
    for (int k = 0; k < p->n; k++)
        real |= strcmp(p->name[k], "sync") != 0;
    if (p->skip > 0) {
        p->skip -= real;
        p->n = p->dropped = 0;
        return;
    }
    cudaEventSynchronize(p->ev[2 * (p->n - 1) + 1]);
    double busy = 0, op0 = 1e300, op1 = -1e300;
    double *ts0 = p->tl_c0, *ts1 = p->tl_c1;
    for (int k = 0; k < p->n; k++) {
        float ms = 0, t0 = 0, t1 = 0;
        if (cudaEventElapsedTime(&ms, p->ev[2 * k], p->ev[2 * k + 1]) != cudaSuccess)
            ms = 0;
        prof_add(p, k, ms * 1e3);
        busy += ms * 1e3;
        /* The ops' wall: first op's start to last op's end, transfers left
         * out; ops on a lane overlap, so this, not their sum, is the
         * forward's time then. */
        if (cudaEventElapsedTime(&t0, p->ev[0], p->ev[2 * k]) != cudaSuccess ||
            cudaEventElapsedTime(&t1, p->ev[0], p->ev[2 * k + 1]) != cudaSuccess)
            t0 = t1 = 0;
        ts0[k] = t0 * 1e3;
        ts1[k] = t1 * 1e3;
        if (p->kind[k] != CU_WORK_TRANSFER) {
            op0 = ts0[k] < op0 ? ts0[k] : op0;
            op1 = ts1[k] > op1 ? ts1[k] : op1;
        }
    }
    p->ops_wall_us += op1 > op0 ? op1 - op0 : 0;
    for (int k = 0; k < p->n; k++) {
        ts0[k] -= op1 > op0 ? op0 : 0;
        ts1[k] -= op1 > op0 ? op0 : 0;
    }
    prof_timeline_add(p, ts0, ts1);
    float span = 0;
    if (cudaEventElapsedTime(&span, p->ev[0], p->ev[2 * (p->n - 1) + 1]) != cudaSuccess)
        span = 0;
    (void)cudaGetLastError();
    p->batches += real;
    p->wall_us += now_us() - p->t_first;
    p->span_us += span * 1e3;
    p->busy_us += busy;
    p->n = p->dropped = 0;
}

cu_prof_scope::~cu_prof_scope()
{
    cu_prof *p = s->prof;
    if (!p || --p->depth > 0)
        return;
    if (i >= 0) {
        cudaEventRecord(p->ev[2 * i + 1], s->st);
        p->host_us[i] = now_us() - t0;
    }
    if (closes && p->n > 0)
        prof_close(s);
}

/* The ceilings, as the header and the totals print them. */
static void prof_ceil_text(const cu_ceil *c, char *buf, size_t cap)
{
    if (c->ok)
        snprintf(buf, cap, "copy %.2f TB/s, gemm %s %.0f TFLOP/s", c->copy_bps * 1e-12, c->dtype,
                 c->gemm_flops * 1e-12);
    else
        snprintf(buf, cap, "not measured (%s), so no floors", c->why);
}

/* The report's totals (per batch, b batches): the ops with a floor against
 * the sum of their floors, then what stayed out of the sums and why. */
static void prof_totals(const cu_prof *p, double b)
{
    double gpu = 0, fl = 0, xfer = 0, nofl = 0;
    char ceil[256], xn[512] = "", nn[512] = "";
    for (int k = 0; k < p->nst; k++) {
        const cu_prof_stat *st = &p->st[k];
        char *list = st->transfer ? xn : nn;
        if (!st->transfer && (st->floor_calls == st->calls || !p->ceil.ok)) {
            gpu += st->gpu_us;
            fl += st->floor_us;
            continue;
        }
        *(st->transfer ? &xfer : &nofl) += st->gpu_us;
        size_t used = strlen(list);
        snprintf(list + used, 512 - used, "%s%s", used ? ", " : "", st->name);
    }
    prof_ceil_text(&p->ceil, ceil, sizeof ceil);
    if (p->ceil.ok && fl > 0)
        fprintf(stderr,
                "  ops gpu us %.1f | sum of floors us %.1f | ratio %.2fx | gpu busy us %.1f / "
                "sum of floors %.2fx | ops wall us %.1f / sum of floors %.2fx | ceilings: %s\n",
                gpu / b, fl / b, gpu / fl, p->busy_us / b, p->busy_us / fl, p->ops_wall_us / b,
                p->ops_wall_us / fl, ceil);
    else
        fprintf(stderr, "  ops gpu us %.1f | sum of floors - | ceilings: %s\n", gpu / b, ceil);
    fprintf(stderr, "  not in the sums: transfers, not ops: %s (gpu us %.1f) | ", *xn ? xn : "none",
            xfer / b);
    if (*nn)
        fprintf(stderr, "ops without a floor: %s (gpu us %.1f)\n", nn, nofl / b);
    else
        fprintf(stderr, "ops without a floor: none\n");
}

/* The timeline (cu_prof), to stderr: each call's mean start and end after
 * the batch's first op's start, and its wait, the gap since the previous
 * call on the same stream ended (what the stream idled or was blocked by a
 * wait on the other stream). Its lines are indented by 4. */
static void prof_timeline(const cu_prof *p)
{
    if (!p->tl_batches)
        return;
    const double b = (double)p->tl_batches;
    fprintf(stderr,
            "  timeline: the calls in issue order, us after the first op's start, mean of %ld "
            "batches (%ld others called other ops); wait: since the stream's previous call\n",
            p->tl_batches, p->tl_other);
    fprintf(stderr, "    %3s %-5s %-28s %8s %8s %8s %8s\n", "#", "on", "op", "start", "end", "gpu",
            "wait");
    double last[2] = {0, 0};
    int seen[2] = {0, 0};
    for (int k = 0; k < p->tl_n; k++) {
        const int l = p->tl_lane[k] != 0;
        const double t0 = p->tl_t0[k] / b, t1 = p->tl_t1[k] / b;
        char wait[32] = "-";
        if (seen[l])
            snprintf(wait, sizeof wait, "%.1f", t0 - last[l]);
        fprintf(stderr, "    %3d %-5s %-28s %8.1f %8.1f %8.1f %8s\n", k, l ? "lane" : "main",
                p->tl_name[k], t0, t1, t1 - t0, wait);
        last[l] = t1;
        seen[l] = 1;
    }
}

/* Per-batch means since the warm-up, to stderr: the diagnostic's output.
 * floor us and x floor: "-" where an op declared no work (or some of its
 * calls did not, or the ceilings are unknown); "transfer" for transfers. */
static void prof_report(bk_stream *s)
{
    cu_prof *p = s->prof;
    if (!p->batches) {
        fprintf(stderr, "cuda profile: no batches after warm-up\n");
        return;
    }
    double b = (double)p->batches, host = 0;
    char ceil[256];
    prof_ceil_text(&p->ceil, ceil, sizeof ceil);
    fprintf(stderr,
            "cuda profile: %ld batches, per batch; floor = max(FLOPs / gemm, bytes / copy), "
            "ceilings: %s\n",
            p->batches, ceil);
    if (p->gate_h)
        fprintf(stderr,
                "  gated: each batch queued whole before the GPU starts it (%u of %u gates "
                "opened by their %d ms timeout)\n",
                p->gate_h[1], p->gate_seq, CU_PROF_GATE_MS);
    else
        fprintf(stderr, "  as issued (IKBO_CUDA_PROFILE=host): op times include the host's "
                        "pace where the GPU waits for it\n");
    fprintf(stderr, "  %-28s %7s %10s %10s %10s %8s\n", "op", "calls", "host us", "gpu us",
            "floor us", "x floor");
    for (int k = 0; k < p->nst; k++) {
        cu_prof_stat *st = &p->st[k];
        char fl[32] = "-", x[32] = "-";
        host += st->host_us;
        if (st->transfer)
            snprintf(x, sizeof x, "transfer");
        else if (st->floor_calls == st->calls) {
            snprintf(fl, sizeof fl, "%.1f", st->floor_us / b);
            if (st->floor_us > 0)
                snprintf(x, sizeof x, "%.2fx", st->gpu_us / st->floor_us);
        }
        fprintf(stderr, "  %-28s %7.1f %10.1f %10.1f %10s %8s\n", st->name, st->calls / b,
                st->host_us / b, st->gpu_us / b, fl, x);
    }
    fprintf(stderr,
            "  backend host us %.1f | gpu busy us %.1f, span us %.1f (idle %.1f) | "
            "wall first op -> idle us %.1f\n",
            host / b, p->busy_us / b, p->span_us / b, (p->span_us - p->busy_us) / b,
            p->wall_us / b);
    prof_totals(p, b);
    prof_timeline(p);
}

/* ------------------------------------------------------------ memory */

/* cudaMalloc with the message a load error needs: device, bytes, free memory. */
void *cu_dev_malloc(bk_backend *be, size_t bytes, bk_err *err)
{
    void *p = NULL;
    size_t n = bytes < MIN_ALLOC ? MIN_ALLOC : bytes;
    if (bk_fault_hit(&be->fault, BK_FAULT_ALLOC)) {
        bk_seterr(err, "out of device memory on cuda:%d allocating %zu bytes" BK_FAULT_INJECTED,
                  cu_impl(be)->ordinal, bytes);
        return NULL;
    }
    cudaError_t e = cudaMalloc(&p, n);
    if (e != cudaSuccess && e != cudaErrorMemoryAllocation) { /* e.g. a lost device (cuda_lost) */
        (void)cudaGetLastError();
        bk_seterr(err, "cuda:%d: allocating %zu bytes failed: %s (%s)", cu_impl(be)->ordinal, bytes,
                  cudaGetErrorString(e), cudaGetErrorName(e));
        return NULL;
    }
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        (void)cudaGetLastError();
        bk_seterr(err, "out of device memory on cuda:%d allocating %zu bytes (%zu of %zu free): %s",
                  cu_impl(be)->ordinal, bytes, fr, tot, cudaGetErrorString(e));
        return NULL;
    }
    return p;
}

static void *cuda_alloc(bk_backend *be, size_t bytes, enum bk_tag tag, bk_err *err)
{
    if ((unsigned)tag >= BK_TAG_COUNT) {
        bk_seterr(err, "alloc: bad buffer tag %d", (int)tag);
        return NULL;
    }
    if (enter(be, err))
        return NULL;
    void *p = cu_dev_malloc(be, bytes, err);
    if (p)
        bk_ledger_account(&cu_impl(be)->ledger, tag, bytes, 0);
    return p;
}

static void cuda_free(bk_backend *be, void *p, size_t bytes, enum bk_tag tag)
{
    if (!p)
        return;
    cudaSetDevice(cu_impl(be)->ordinal);
    cudaFree(p);
    (void)cudaGetLastError();
    if ((unsigned)tag < BK_TAG_COUNT)
        bk_ledger_account(&cu_impl(be)->ledger, tag, 0, bytes);
}

int cu_scratch_get(bk_stream *s, cu_scratch *sc, size_t bytes, bk_err *err)
{
    if (bytes <= sc->cap)
        return 0;
    if (sc->p) {
        /* The stream may still read the old block: wait before freeing it. */
        cu_prof_release(s);
        CU_TRY(cudaStreamSynchronize(s->st), "waiting to grow scratch");
        cu_gen_bump(s);
        cuda_free(s->be, sc->p, sc->cap, sc->tag);
        sc->p = NULL;
        sc->cap = 0;
    }
    size_t cap = bytes + bytes / 4;
    if (!(sc->p = cuda_alloc(s->be, cap, sc->tag, err)))
        return -1;
    sc->cap = cap;
    return 0;
}

int cu_enter(bk_stream *s, bk_err *err)
{
    return cu_graph_refuse(s, err) ? -1 : enter(s->be, err);
}

unsigned cu_grid_for(size_t n, unsigned block)
{
    size_t g = (n + block - 1) / block;
    if (g > 65536u * 16)
        g = 65536u * 16;
    return g ? (unsigned)g : 1;
}

int cu_smem_limit(bk_stream *s, const void *fn, int bytes, bk_err *err)
{
    cuda_backend *cb = cu_impl(s->be);
    int k, done = 0;
    pthread_mutex_lock(&cb->lock);
    for (k = 0; k < cb->n_smem && cb->smem_fn[k] != fn; k++)
        ;
    done = k < cb->n_smem && cb->smem_bytes[k] >= bytes;
    pthread_mutex_unlock(&cb->lock);
    if (done)
        return 0;
    CU_TRY(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
           "raising a kernel's shared memory limit");
    pthread_mutex_lock(&cb->lock);
    for (k = 0; k < cb->n_smem && cb->smem_fn[k] != fn; k++)
        ;
    if (k == cb->n_smem && k < (int)(sizeof cb->smem_fn / sizeof cb->smem_fn[0])) {
        cb->smem_fn[k] = fn;
        cb->smem_bytes[k] = 0;
        cb->n_smem++;
    }
    if (k < cb->n_smem && cb->smem_bytes[k] < bytes)
        cb->smem_bytes[k] = bytes;
    pthread_mutex_unlock(&cb->lock);
    return 0;
}

/* Tensor maps for the TMA kernels (tma_util.cuh). The driver's encoder is
 * looked up once through the runtime (no link against libcuda). */
static PFN_cuTensorMapEncodeTiled_v12000 tmap_encode_fn(void)
{
    static PFN_cuTensorMapEncodeTiled_v12000 fn;
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    struct lookup {
        static void run(void)
        {
            void *p = NULL;
            cudaDriverEntryPointQueryResult q;
            if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000,
                                                 cudaEnableDefault, &q) == cudaSuccess &&
                q == cudaDriverEntryPointSuccess)
                fn = (PFN_cuTensorMapEncodeTiled_v12000)p;
        }
    };
    pthread_once(&once, lookup::run);
    return fn;
}

int cu_tmap_encode(CUtensorMap *map, CUtensorMapDataType dt, int rank, const void *base,
                   const uint64_t *dims, const uint64_t *strides, const uint32_t *box,
                   CUtensorMapSwizzle swizzle)
{
    PFN_cuTensorMapEncodeTiled_v12000 fn = tmap_encode_fn();
    if (!fn)
        return (int)CUDA_ERROR_NOT_SUPPORTED;
    cuuint64_t d[5], st[4];
    cuuint32_t b[5], es[5];
    for (int i = 0; i < rank; i++) {
        d[i] = dims[i];
        b[i] = box[i];
        es[i] = 1;
        if (i + 1 < rank)
            st[i] = strides[i];
    }
    return (int)fn(map, dt, (cuuint32_t)rank, (void *)base, d, st, b, es,
                   CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                   CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

/* ------------------------------------------------------------ host staging */

static int pinned_resize(cu_pinned *h, size_t cap, bk_err *err)
{
    if (h->p)
        cudaFreeHost(h->p);
    h->p = NULL;
    h->cap = h->used = 0;
    if (!cap)
        return 0;
    cudaError_t e = cudaHostAlloc((void **)&h->p, cap, cudaHostAllocPortable);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        h->p = NULL;
        bk_seterr(err, "out of pinned host memory allocating %zu bytes of copy staging: %s", cap,
                  cudaGetErrorString(e));
        return -1;
    }
    h->cap = cap;
    return 0;
}

/* Room for bytes in the stream's pinned staging (64-byte aligned). Copies
 * queued earlier may still read the buffer, so running out means waiting
 * for the stream before reusing it from the start (or growing it). */
static char *host_stage(bk_stream *s, size_t bytes, bk_err *err)
{
    cu_pinned *h = &s->host;
    size_t off = (h->used + 63) & ~(size_t)63;
    h->peak += off - h->used + bytes;
    if (!h->p || off + bytes > h->cap) {
        cu_prof_release(s);
        if (cu_check(cudaStreamSynchronize(s->st), err, "waiting to reuse copy staging"))
            return NULL;
        if (s->prof)
            s->prof->n_up = 0; /* the staged bytes it points at are reused */
        off = 0;
        if (bytes > h->cap) {
            size_t want = h->peak > bytes ? h->peak : bytes;
            cu_gen_bump(s);
            if (pinned_resize(h, want + want / 4 + 4096, err))
                return NULL;
        }
    }
    h->used = off + bytes;
    return h->p + off;
}

/* The stream is idle: staging is free again, sized to the last batch's
 * high-water so steady traffic never waits for it. */
static void host_idle(bk_stream *s)
{
    cu_pinned *h = &s->host;
    if (s->prof)
        s->prof->n_up = 0; /* the batch's staged uploads are gone */
    if (h->peak > h->cap) {
        bk_err ignore;
        size_t want = h->peak + h->peak / 4 + 4096;
        cu_gen_bump(s);
        (void)pinned_resize(h, want, &ignore); /* on failure the next stage() retries */
    }
    h->used = 0;
    h->peak = 0;
}

static int cuda_upload(bk_stream *s, void *dst, const void *src, size_t bytes, bk_err *err)
{
    cu_prof_scope prof_(s, "upload");
    prof_.transfer();
    if (!bytes)
        return 0;
    if (bk_bad_copy("upload", bytes, 1, dst, src, err))
        return -1;
    if (enter(s->be, err)) /* allowed while replaying: see graph.cu */
        return -1;
    /* Through pinned staging: asynchronous, and the caller may reuse src at
     * once. */
    char *h = host_stage(s, bytes, err);
    if (!h)
        return -1;
    memcpy(h, src, bytes);
    if (s->prof)
        prof_note_upload(s->prof, dst, h, bytes); /* the ops' lengths: cu_prof_jagged */
    return cu_copy(s, dst, h, bytes, cudaMemcpyHostToDevice, err);
}

template <typename T> static void host_from_f32(const float *src, void *dst, size_t n)
{
    T *d = (T *)dst;
    for (size_t i = 0; i < n; i++)
        d[i] = cu_fromf<T>(src[i]);
}

template <typename T> static void host_to_f32(const void *src, float *dst, size_t n)
{
    const T *x = (const T *)src;
    for (size_t i = 0; i < n; i++)
        dst[i] = cu_tof<T>(x[i]);
}

static void cuda_host_from_f32(bk_backend *be, void *dst, const float *src, size_t n)
{
    CU_DISPATCH(cu_impl(be)->dtype, host_from_f32<T>(src, dst, n));
}

static int cuda_upload_f32(bk_stream *s, void *dst, const float *src, size_t n, bk_err *err)
{
    cu_prof_scope prof_(s, "upload_f32");
    prof_.transfer();
    if (!n)
        return 0;
    if (bk_bad_copy("upload_f32", n, sizeof(float), dst, src, err))
        return -1;
    if (enter(s->be, err)) /* allowed while replaying: see graph.cu */
        return -1;
    /* Converted on the host into the staging: one copy, no kernel. */
    size_t bytes = n * s->be->act_size;
    char *h = host_stage(s, bytes, err);
    if (!h)
        return -1;
    cuda_host_from_f32(s->be, h, src, n);
    return cu_copy(s, dst, h, bytes, cudaMemcpyHostToDevice, err);
}

static int cuda_download_f32(bk_stream *s, float *dst, const void *src, size_t n, bk_err *err)
{
    cu_prof_scope prof_(s, "download_f32", true);
    prof_.transfer();
    /* allowed while replaying (graph.cu); the lane joins first */
    if (enter(s->be, err) || cu_lane_join(s, err))
        return -1;
    if (!n) {
        if (stream_wait(s, err, "download_f32: stream"))
            return -1;
        host_idle(s);
        return 0;
    }
    if (bk_bad_copy("download_f32", n, sizeof(float), dst, src, err))
        return -1;
    /* Raw activations into pinned staging, the stream's one wait, then the
     * conversion on the host. */
    size_t bytes = n * s->be->act_size;
    char *h = host_stage(s, bytes, err);
    if (!h)
        return -1;
    if (cu_copy(s, h, src, bytes, cudaMemcpyDeviceToHost, err) || cu_graph_run(s, err))
        return -1;
    if (stream_wait(s, err, "download_f32: stream (an earlier op on it failed)"))
        return -1;
    CU_DISPATCH(cu_dt(s), host_to_f32<T>(h, dst, n));
    host_idle(s);
    return 0;
}

static void cuda_get_stats(bk_backend *be, bk_stats *out)
{
    bk_ledger_get(&cu_impl(be)->ledger, out);
}

/* ------------------------------------------------------------ streams */

static void algo_release(cu_algo_entry *e);

static void cuda_stream_free(bk_stream *s)
{
    if (!s)
        return;
    cudaSetDevice(cu_impl(s->be)->ordinal);
    cuda_stream_free(s->lane);
    if (s->owner)
        s->prof = NULL; /* the owner's */
    cu_graph_stream_free(s);
    cu_prof_release(s);
    if (s->st)
        cudaStreamSynchronize(s->st);
    if (s->prof) {
        prof_report(s);
        for (int i = 0; i < 2 * CU_PROF_MAX; i++)
            cudaEventDestroy(s->prof->ev[i]);
        if (s->prof->gate_h)
            cudaFreeHost((void *)s->prof->gate_h);
        free(s->prof);
    }
    cu_scratch *sc[] = {&s->lce_y, &s->att_tile, &s->mlp2_part};
    for (size_t i = 0; i < sizeof sc / sizeof sc[0]; i++)
        cuda_free(s->be, sc[i]->p, sc[i]->cap, sc[i]->tag);
    bk_err ignore;
    (void)pinned_resize(&s->host, 0, &ignore);
    for (int i = 0; i < CU_ALGO_CACHE; i++)
        algo_release(&s->algos[i]);
    if (s->ws)
        cudaFree(s->ws);
    if (s->lt)
        cublasLtDestroy(s->lt);
    if (s->done)
        cudaEventDestroy(s->done);
    if (s->ev)
        cudaEventDestroy(s->ev);
    if (s->st)
        cudaStreamDestroy(s->st);
    (void)cudaGetLastError();
    free(s);
}

/* What a stream and a lane both are: a CUDA stream at the given priority
 * with its own cuBLASLt handle, workspace and scratch. */
static int stream_init(bk_stream *s, bk_backend *be, int priority, bk_err *err)
{
    s->be = be;
    s->spin_us = -1;
    s->lce_y.tag = BK_TAG_USER;
    s->att_tile.tag = BK_TAG_INDEX;
    s->mlp2_part.tag = BK_TAG_CAND;
    cublasStatus_t bs;
    if (cu_check(cudaStreamCreateWithPriority(&s->st, cudaStreamNonBlocking, priority), err,
                 "stream create") ||
        cu_check(cudaEventCreateWithFlags(&s->ev, cudaEventDisableTiming), err, "event create"))
        return -1;
    if ((bs = cublasLtCreate(&s->lt)) != CUBLAS_STATUS_SUCCESS) {
        s->lt = NULL;
        return blas_check(bs, err, "handle create");
    }
    if (!(s->ws = cu_dev_malloc(be, WS_BYTES, err)))
        return -1;
    s->ws_size = WS_BYTES;
    return 0;
}

static bk_stream *cuda_stream_new(bk_backend *be, bk_err *err)
{
    if (enter(be, err))
        return NULL;
    bk_stream *s = (bk_stream *)calloc(1, sizeof *s);
    if (!s) {
        bk_seterr(err, "out of host memory allocating %zu bytes", sizeof *s);
        return NULL;
    }
    if (stream_init(s, be, 0, err)) {
        cuda_stream_free(s);
        return NULL;
    }
    s->prof = prof_new(s);
    return s;
}

/* be->lane. The lane runs at the device's highest priority: its kernels
 * are the user side's few small grids, whose blocks then go first to SMs
 * the candidate side's larger grids free. */
static bk_stream *cuda_lane(bk_stream *s, bk_err *err)
{
    if (s->owner) {
        bk_seterr(err, "lane: a lane has no lane of its own");
        return NULL;
    }
    if (s->lane)
        return s->lane;
    if (enter(s->be, err))
        return NULL;
    int lo = 0, hi = 0;
    if (cu_check(cudaDeviceGetStreamPriorityRange(&lo, &hi), err, "lane: stream priorities"))
        return NULL;
    bk_stream *l = (bk_stream *)calloc(1, sizeof *l);
    if (!l) {
        bk_seterr(err, "out of host memory allocating %zu bytes", sizeof *l);
        return NULL;
    }
    l->owner = s;
    if (stream_init(l, s->be, hi, err)) {
        cuda_stream_free(l);
        return NULL;
    }
    l->prof = s->prof;
    s->lane = l;
    return l;
}

static int cuda_lane_wait(bk_stream *a, bk_stream *b, bk_err *err)
{
    if (a->owner != b && b->owner != a) {
        bk_seterr(err, "lane_wait: the streams are not a stream and its lane");
        return -1;
    }
    if (cu_enter(a, err) ||
        cu_check(cudaEventRecord(b->ev, b->st), err, "lane_wait: event record") ||
        cu_check(cudaStreamWaitEvent(a->st, b->ev, 0), err, "lane_wait: stream wait"))
        return -1;
    (a->owner ? a->owner : a)->lane_open = a->owner != NULL;
    return 0;
}

int cu_lane_join(bk_stream *s, bk_err *err)
{
    return s->lane && s->lane_open ? cuda_lane_wait(s, s->lane, err) : 0;
}

static int cuda_sync(bk_stream *s, bk_err *err)
{
    cu_prof_scope prof_(s, "sync", true);
    prof_.transfer();
    if (cu_enter(s, err) || cu_lane_join(s, err))
        return -1;
    if (stream_wait(s, err, "stream (an earlier op on it failed)"))
        return -1;
    host_idle(s);
    return 0;
}

/* ------------------------------------------------------------ weights */

/* Converts w into the activation dtype at row stride ld. Returns the index
 * of the first finite value the dtype cannot hold (fp16 past 65504, or a
 * value within rounding of FLT_MAX in bf16: it would turn into infinity
 * and every score it touches into inf or NaN), or -1. */
template <typename T>
static long pack_weight(const float *w, int rows, int cols, int ld, void *out)
{
    T *o = (T *)out;
    long bad = -1;
    for (size_t r = 0; r < (size_t)rows; r++)
        for (size_t c = 0; c < (size_t)ld; c++) {
            float v = c < (size_t)cols ? w[r * cols + c] : 0.0f;
            o[r * ld + c] = cu_fromf<T>(v);
            if (bad < 0 && isinf(cu_tof<T>(o[r * ld + c])) && isfinite(v))
                bad = (long)(r * cols + c);
        }
    return bad;
}

/* Weight blocks. A model's weights (one backend per model) are
 * sub-allocated, 256-byte aligned, from a few large device blocks instead
 * of one cudaMalloc each: with x, W and the bias of the bench model's c_r1
 * in allocations of their own, linear_tk's kernel took 134-137 us in
 * write_patterns, with them in one 118-120; in bench_ops this took c_r1
 * from 139 to 124.5 us, in the model's forward it changed nothing (143;
 * bench/kernels/NOTES.md, "operand placement", "weights in blocks"). The
 * engine allocates a layer's weights one after another, so a linear's W
 * and bias end up adjacent. Blocks grow from WBLOCK_MIN, doubling to
 * WBLOCK_MAX (a larger weight gets a block of its own size); a block is
 * freed with its last weight. The bytes accounted are still the weights'
 * (the blocks' unused tails are not), and compute-sanitizer sees a block,
 * not each weight: a read past one weight's end lands in the next. */
#define WBLOCK_MIN ((size_t)4 << 20)
#define WBLOCK_MAX ((size_t)256 << 20)
struct cu_wblock {
    struct cu_wblock *next;
    char *base;
    size_t cap, used;
    int live; /* weights in it */
};

static void *wblock_take(bk_backend *be, size_t bytes, bk_err *err)
{
    cuda_backend *cb = cu_impl(be);
    const size_t need = ((bytes ? bytes : 1) + 255) & ~(size_t)255;
    pthread_mutex_lock(&cb->lock);
    cu_wblock *b = cb->wblocks;
    if (!b || b->cap - b->used < need) {
        int sh = cb->n_wblocks < 6 ? cb->n_wblocks : 6;
        size_t cap = WBLOCK_MIN << sh;
        cap = need > cap ? need : cap;
        b = (cu_wblock *)calloc(1, sizeof *b);
        if (!b || !(b->base = (char *)cu_dev_malloc(be, cap, err))) {
            if (!b)
                bk_seterr(err, "out of host memory for a weight block");
            free(b);
            pthread_mutex_unlock(&cb->lock);
            return NULL;
        }
        b->cap = cap;
        b->next = cb->wblocks;
        cb->wblocks = b;
        cb->n_wblocks++;
    }
    void *p = b->base + b->used;
    b->used += need;
    b->live++;
    pthread_mutex_unlock(&cb->lock);
    return p;
}

/* Gives back a weight's bytes; its block goes once it holds none. */
static void wblock_put(bk_backend *be, void *p)
{
    cuda_backend *cb = cu_impl(be);
    pthread_mutex_lock(&cb->lock);
    for (cu_wblock **pp = &cb->wblocks; *pp; pp = &(*pp)->next) {
        cu_wblock *b = *pp;
        if ((char *)p < b->base || (char *)p >= b->base + b->cap)
            continue;
        if (--b->live == 0) {
            *pp = b->next;
            cb->n_wblocks--;
            cudaFree(b->base);
            (void)cudaGetLastError();
            free(b);
        }
        break;
    }
    pthread_mutex_unlock(&cb->lock);
}

static bk_weight *cuda_weight_new(bk_backend *be, const float *w, int rows, int cols, bk_err *err)
{
    if (rows < 0 || cols < 0) {
        bk_seterr(err, "weight_new: bad shape [%d, %d]", rows, cols);
        return NULL;
    }
    if ((size_t)rows * (size_t)cols != 0 && !w) {
        bk_seterr(err, "weight_new: NULL data for a [%d, %d] weight", rows, cols);
        return NULL;
    }
    if (enter(be, err))
        return NULL;
    /* K padded to a multiple of 8 with zeros: every row starts 16-byte
     * aligned, so matmul kernels load weights with 16-byte copies. */
    int ld = (int)(((long)cols + 7) / 8 * 8);
    enum cu_dtype dt = cu_impl(be)->dtype;
    size_t es = dt == CU_F32 ? 4 : 2;
    size_t bytes = (size_t)rows * (size_t)ld * es;
    bk_weight *h = (bk_weight *)calloc(1, sizeof *h);
    void *host = malloc(bytes ? bytes : 1);
    if (!h || !host) {
        free(h);
        free(host);
        bk_seterr(err, "out of host memory allocating %zu bytes", bytes);
        return NULL;
    }
    long bad = -1;
    CU_DISPATCH(dt, bad = pack_weight<T>(w, rows, cols, ld, host));
    if (bad >= 0) {
        bk_seterr(err, "value %g at [%ld, %ld] is outside %s's range; serve this model in %s",
                  (double)w[bad], bad / cols, bad % cols, dt == CU_F16 ? "fp16" : "bf16",
                  dt == CU_F16 ? "bf16 or fp32 (IKBO_CUDA_DTYPE)" : "fp32 (IKBO_CUDA_DTYPE)");
        free(host);
        free(h);
        return NULL;
    }
    h->rows = rows;
    h->cols = cols;
    h->ld = ld;
    h->bytes = bytes;
    if (!(h->data = wblock_take(be, bytes, err))) {
        free(host);
        free(h);
        return NULL;
    }
    cudaError_t e = bytes ? cudaMemcpy(h->data, host, bytes, cudaMemcpyHostToDevice) : cudaSuccess;
    free(host);
    if (cu_check(e, err, "weight upload")) {
        wblock_put(be, h->data);
        free(h);
        return NULL;
    }
    bk_ledger_weights(&cu_impl(be)->ledger, bytes, 0);
    return h;
}

static void cuda_weight_free(bk_backend *be, bk_weight *w)
{
    if (!w)
        return;
    cudaSetDevice(cu_impl(be)->ordinal);
    wblock_put(be, w->data);
    bk_ledger_weights(&cu_impl(be)->ledger, 0, w->bytes + w->aug_bytes);
    if (w->aug) cudaFree(w->aug);
    free(w);
}

/* ------------------------------------------------------------ plain ops */

__device__ __forceinline__ int64_t wrap_row(int64_t id, int rows)
{
    if ((uint64_t)id < (uint64_t)rows)
        return id; /* in range (the usual case): no 64-bit division */
    int64_t r = id % rows;
    return r < 0 ? r + rows : r;
}

/* The 16-byte (vector) paths below take an activation-dtype array when its
 * pointer and row stride (ld elements of es bytes) are 16-byte aligned. */
static bool vec_ok(const void *p, int ld, size_t es)
{
    return cu_aligned16(p) && (size_t)ld * es % 16 == 0;
}

/* cu_vec<T>::store as one 16-byte store instruction (nvcc split the plain
 * uint4 store into four narrower ones in k_history_embedding_vec). */
template <typename T> __device__ __forceinline__ void vec_store(T *p, const float *f)
{
    uint4 u;
    cu_vec<T>::store((T *)&u, f);
    __stwb((uint4 *)p, u);
}

/* How the vector kernels lay a block of nt threads over rows of c 16-byte
 * chunks: per rows a step, thread t on row t / c, chunk t % c (threads past
 * per * c idle); when c >= nt, one row a step and each thread strides its
 * chunks by nt. One 32-bit division a thread, none per element. */
__host__ __device__ __forceinline__ int vec_rows_per_step(int c, int nt)
{
    return c < nt ? nt / c : 1;
}
struct vec_lane {
    int per, row, chunk;
};
__device__ __forceinline__ vec_lane vec_lane_of(int c)
{
    int row = (int)threadIdx.x / c;
    return vec_lane{vec_rows_per_step(c, (int)blockDim.x), row, (int)threadIdx.x - row * c};
}

/* embedding_bags' arguments, by value: one launch for up to BK_MAX_BAGS
 * bags (a model's sparse features are ~10 small launches otherwise). */
struct cu_bag {
    const void *table;
    const int64_t *ids, *off;
    void *out;
    int rows, tld, dim, ld, n, mean;
};
struct cu_bags {
    cu_bag b[BK_MAX_BAGS];
};

/* Scalar path (bags_vec_ok false: a width not whole 16-byte chunks, or
 * an output at an unaligned column or stride): block (row, bag), threads
 * across the embedding width; ids in order. Rows past a bag's n (bags of
 * fewer rows than the grid) exit. */
template <typename T> __global__ void k_embedding_bags(const __grid_constant__ cu_bags a)
{
    const cu_bag &g = a.b[blockIdx.y];
    int b = blockIdx.x;
    if (b >= g.n)
        return;
    const T *__restrict__ table = (const T *)g.table;
    T *__restrict__ out = (T *)g.out;
    int64_t s = g.off[b], e = g.off[b + 1];
    for (int j = threadIdx.x; j < g.dim; j += blockDim.x) {
        float acc = 0.0f;
        for (int64_t i = s; i < e; i++)
            acc += cu_tof<T>(table[wrap_row(g.ids[i], g.rows) * g.tld + j]);
        if (g.mean && e > s)
            acc /= (float)(e - s);
        out[(size_t)b * g.ld + j] = cu_fromf<T>(acc);
    }
}

static int block_for(int width)
{
    int b = (width + 31) / 32 * 32;
    return b < 32 ? 32 : b > 256 ? 256 : b;
}

#define BAG_BLOCK 128 /* threads of a vector-path bags block */
#define BAG_IDS 8     /* ids whose rows a thread loads before adding any */

/* Vector path: block (row group, bag), its rows laid out by vec_lane_of
 * over the bag's dim / V 16-byte chunks (V = 16 / sizeof(T)); a thread owns
 * one chunk of one output row (for dim 256 bf16: a warp a row, 4 rows a
 * block). It loads BAG_IDS ids, then their table chunks, then adds them,
 * so BAG_IDS 16-byte loads are in flight; the fp32 sum still runs in id
 * order, the mean divides by the count, one rounding. */
template <typename T>
__global__ void __launch_bounds__(BAG_BLOCK) k_embedding_bags_vec(const __grid_constant__ cu_bags a)
{
    constexpr int V = cu_vec<T>::V;
    const cu_bag &g = a.b[blockIdx.y];
    const vec_lane l = vec_lane_of(g.dim / V);
    const int b = (int)blockIdx.x * l.per + l.row;
    if (l.row >= l.per || b >= g.n)
        return;
    const T *__restrict__ table = (const T *)g.table;
    const int64_t *__restrict__ ids = g.ids;
    const int64_t s = g.off[b], e = g.off[b + 1];
    for (int j = l.chunk * V; j < g.dim; j += (int)blockDim.x * V) {
        float acc[V];
#pragma unroll
        for (int q = 0; q < V; q++)
            acc[q] = 0.0f;
        for (int64_t i = s; i < e; i += BAG_IDS) {
            int64_t r[BAG_IDS];
            uint4 raw[BAG_IDS];
#pragma unroll
            for (int k = 0; k < BAG_IDS; k++) /* all ids issued before any is used */
                r[k] = i + k < e ? ids[i + k] : 0;
#pragma unroll
            for (int k = 0; k < BAG_IDS; k++)
                r[k] = wrap_row(r[k], g.rows);
#pragma unroll
            for (int k = 0; k < BAG_IDS; k++)
                if (i + k < e)
                    raw[k] = __ldg((const uint4 *)(table + r[k] * g.tld + j));
#pragma unroll
            for (int k = 0; k < BAG_IDS; k++)
                if (i + k < e) {
                    float f[V];
                    cu_vec<T>::load((const T *)&raw[k], f);
#pragma unroll
                    for (int q = 0; q < V; q++)
                        acc[q] += f[q];
                }
        }
        if (g.mean && e > s) {
#pragma unroll
            for (int q = 0; q < V; q++)
                acc[q] /= (float)(e - s);
        }
        vec_store((T *)g.out + (size_t)b * g.ld + j, acc);
    }
}

/* Whether a bag takes the vector path: whole 16-byte chunks a row, table
 * and output (pointer and stride) 16-byte aligned. */
static bool bags_vec_ok(const cu_bag *g, size_t es)
{
    return g->dim % (int)(16 / es) == 0 && vec_ok(g->table, g->tld, es) &&
           vec_ok(g->out, g->ld, es);
}

/* Launches the bags of a whose bags_vec_ok is vec as one kernel (none when
 * no bag is): a batch whose bags all qualify (or none do) is one launch. */
static void bags_launch(bk_stream *s, const cu_bags *a, int nb, bool vec)
{
    size_t es = s->be->act_size;
    cu_bags p;
    int np = 0, gx = 0, width = 0;
    for (int i = 0; i < nb; i++) {
        const cu_bag *g = &a->b[i];
        if (bags_vec_ok(g, es) != vec)
            continue;
        p.b[np++] = *g;
        int per = vec ? vec_rows_per_step(g->dim / (int)(16 / es), BAG_BLOCK) : 1;
        int blocks = (g->n + per - 1) / per;
        gx = blocks > gx ? blocks : gx;
        width = g->dim > width ? g->dim : width;
    }
    if (!np)
        return;
    CU_DISPATCH(cu_dt(s), {
        auto k = vec ? k_embedding_bags_vec<T> : k_embedding_bags<T>;
        k<<<dim3(gx, np), vec ? BAG_BLOCK : block_for(width), 0, s->st>>>(p);
    });
}

/* Profile work of one bags launch: per bag, its ids and offsets, one table
 * row per id (ids * row bytes) and its output rows; no FLOPs. None when a
 * bag's offsets are not in this batch's uploads. */
static void bags_work(bk_stream *s, cu_prof_scope &pr, const cu_bags *a, int nb)
{
    double bytes = 0, es = (double)s->be->act_size;
    for (int i = 0; i < nb; i++) {
        const cu_bag *g = &a->b[i];
        cu_prof_jag j;
        if (cu_prof_jagged(s, g->off, NULL, g->n, &j))
            return;
        bytes += j.pairs * (sizeof(int64_t) + g->dim * es) + (g->n + 1.0) * sizeof(int64_t) +
                 (double)g->n * g->dim * es;
    }
    pr.work(0, bytes);
}

static int cuda_embedding_bags(bk_stream *s, const bk_bag *bags, int n, bk_err *err)
{
    cu_prof_scope prof_(s, "embedding_bag");
    if (bk_bags_check(bags, n, err))
        return -1;
    cu_bags a;
    int nb = 0;
    for (int i = 0; i < n; i++) {
        const bk_bag *g = &bags[i];
        if (g->n <= 0 || g->table->cols == 0)
            continue;
        if (g->table->rows <= 0) {
            bk_seterr(err, "embedding_bags: bag %d: table has no rows", i);
            return -1;
        }
        a.b[nb++] = cu_bag{g->table->data, g->ids, g->offsets, g->out, g->table->rows,
                           g->table->ld, g->table->cols, g->ld, g->n, g->pool == BK_POOL_MEAN};
    }
    if (!nb)
        return 0;
    if (prof_.on())
        bags_work(s, prof_, &a, nb);
    if (cu_enter(s, err))
        return -1;
    bags_launch(s, &a, nb, true);
    bags_launch(s, &a, nb, false);
    return cu_check_launch(s, err, "embedding_bag");
}

static int cuda_embedding_bag(bk_stream *s, const bk_weight *table, const int64_t *ids,
                              const int64_t *offsets, int n, enum bk_pool pool, void *out, int ld,
                              bk_err *err)
{
    bk_bag b = {table, ids, offsets, n, pool, out, ld};
    return n <= 0 ? 0 : cuda_embedding_bags(s, &b, 1, err);
}

/* One history_embedding launch's arguments, shared by its two kernels:
 * out[ev] = table[ids[ev]] + action[actions[ev]] + position[p] for event
 * ev, the p-th of its user (offsets off). */
template <typename T> struct hist_args {
    const T *table, *action, *position;
    int rows, tld, ald, pld, dim;
    const int64_t *ids, *off;
    const int32_t *actions;
    T *out;
};

/* Scalar path (history_vec_ok false: a width not whole 16-byte chunks, or
 * an unaligned table or output).
 * Blocks (user, slice): the gridDim.y slices of one user split its (event,
 * column) pairs, so a few users with long histories still fill the GPU (one
 * block per user left a single user's 1024 x 256 lookups on one SM). */
template <typename T> __global__ void k_history_embedding(const __grid_constant__ hist_args<T> h)
{
    int u = blockIdx.x;
    const int dim = h.dim;
    int64_t s = h.off[u], e = h.off[u + 1];
    int64_t total = (e - s) * dim;
    for (int64_t t = (int64_t)blockIdx.y * blockDim.x + threadIdx.x; t < total;
         t += (int64_t)gridDim.y * blockDim.x) {
        int64_t p = t / dim;
        int j = (int)(t - p * dim);
        int64_t ev = s + p;
        int a = h.actions ? h.actions[ev] : 0;
        float v = cu_tof<T>(h.table[wrap_row(h.ids[ev], h.rows) * h.tld + j]);
        v += cu_tof<T>(h.action[(int64_t)a * h.ald + j]);
        v += cu_tof<T>(h.position[p * h.pld + j]);
        h.out[ev * dim + j] = cu_fromf<T>(v);
    }
}

/* Slices per row for the jagged kernels: about 8 blocks per SM over the
 * batch, at most 128 per row (the backend does not know the lengths). */
static unsigned slices_for(bk_stream *s, int n)
{
    long want = (8L * cu_impl(s->be)->sm_count + n - 1) / n;
    return (unsigned)(want < 1 ? 1 : want > 128 ? 128 : want);
}

/* Vector path: blocks (user, slice) as above; a block step covers per
 * events of the user (vec_lane_of over dim / V 16-byte chunks, V = 16 /
 * sizeof(T): 8 events of a 256-thread block at dim 256 bf16), the slices
 * striding over the events. A thread owns one chunk of up to HIST_EV
 * events a step (the slices' stride apart): it reads their ids and actions
 * first, then all their table, action and position chunks (3 * HIST_EV
 * independent 16-byte loads), then writes each (table + action) +
 * position in fp32, rounded once. (One event a step left two dependent
 * id -> row chains per thread at the bench model's 16 x 1024 events:
 * 14.9 us for 8 MB.) */
#define HIST_EV 2
template <typename T>
__global__ void __launch_bounds__(256, 4) k_history_embedding_vec(const __grid_constant__ hist_args<T> h)
{
    constexpr int V = cu_vec<T>::V;
    const int dim = h.dim;
    const vec_lane l = vec_lane_of(dim / V);
    if (l.row >= l.per)
        return;
    const int64_t s = h.off[blockIdx.x], len = h.off[blockIdx.x + 1] - s;
    const int64_t stride = (int64_t)gridDim.y * l.per;
    for (int64_t p0 = (int64_t)blockIdx.y * l.per + l.row; p0 < len; p0 += HIST_EV * stride) {
        int64_t r[HIST_EV], a[HIST_EV];
#pragma unroll
        for (int k = 0; k < HIST_EV; k++) {
            const int64_t p = p0 + k * stride;
            r[k] = p < len ? h.ids[s + p] : 0;
            a[k] = p < len && h.actions ? h.actions[s + p] : 0;
        }
#pragma unroll
        for (int k = 0; k < HIST_EV; k++)
            r[k] = wrap_row(r[k], h.rows);
        for (int j = l.chunk * V; j < dim; j += (int)blockDim.x * V) {
            uint4 tv[HIST_EV], av[HIST_EV], pv[HIST_EV];
#pragma unroll
            for (int k = 0; k < HIST_EV; k++) {
                const int64_t p = p0 + k * stride;
                if (p < len) {
                    tv[k] = __ldg((const uint4 *)(h.table + r[k] * h.tld + j));
                    av[k] = __ldg((const uint4 *)(h.action + a[k] * h.ald + j));
                    pv[k] = __ldg((const uint4 *)(h.position + p * h.pld + j));
                }
            }
#pragma unroll
            for (int k = 0; k < HIST_EV; k++) {
                const int64_t p = p0 + k * stride;
                if (p >= len)
                    continue;
                float v[V], af[V], pf[V];
                cu_vec<T>::load((const T *)&tv[k], v);
                cu_vec<T>::load((const T *)&av[k], af);
                cu_vec<T>::load((const T *)&pv[k], pf);
#pragma unroll
                for (int q = 0; q < V; q++) {
                    v[q] += af[q];
                    v[q] += pf[q];
                }
                vec_store(h.out + (s + p) * dim + j, v);
            }
        }
    }
}

/* Whether history_embedding takes the vector path: whole 16-byte chunks a
 * row, the three tables and out 16-byte aligned (out's stride is dim). */
static bool history_vec_ok(const bk_weight *table, const bk_weight *action,
                           const bk_weight *position, const void *out, size_t es)
{
    return table->cols % (int)(16 / es) == 0 && vec_ok(table->data, table->ld, es) &&
           vec_ok(action->data, action->ld, es) && vec_ok(position->data, position->ld, es) &&
           cu_aligned16(out);
}

static int cuda_history_embedding(bk_stream *s, const bk_weight *table, const bk_weight *action,
                                  const bk_weight *position, const int64_t *ids,
                                  const int32_t *actions, const int64_t *offsets, int n,
                                  void *out, bk_err *err)
{
    cu_prof_scope prof_(s, "history_embedding");
    if (n <= 0 || table->cols == 0)
        return 0;
    if (table->rows <= 0 || action->cols != table->cols || position->cols != table->cols) {
        bk_seterr(err, "history_embedding: table/action/position widths %d/%d/%d disagree",
                  table->cols, action->cols, position->cols);
        return -1;
    }
    cu_prof_jag j;
    if (prof_.on() && !cu_prof_jagged(s, offsets, NULL, n, &j)) {
        /* Events E: ids (+ actions), offsets, E table rows (ids * row
         * bytes), the action rows touched (at most E; row 0 alone without
         * actions), the position rows touched (the longest history), E
         * output rows; no FLOPs. */
        double rb = (double)table->cols * s->be->act_size, E = j.pairs;
        double act_rows = actions ? (E < action->rows ? E : action->rows) : (E > 0);
        double pos_rows = j.maxlen < position->rows ? j.maxlen : position->rows;
        prof_.work(0, E * (sizeof(int64_t) + (actions ? sizeof(int32_t) : 0)) +
                          (n + 1.0) * sizeof(int64_t) + (2 * E + act_rows + pos_rows) * rb);
    }
    if (cu_enter(s, err))
        return -1;
    dim3 grid((unsigned)n, slices_for(s, n));
    bool vec = history_vec_ok(table, action, position, out, s->be->act_size);
    CU_DISPATCH(cu_dt(s), {
        hist_args<T> h = {(const T *)table->data, (const T *)action->data,
                          (const T *)position->data, table->rows, table->ld, action->ld,
                          position->ld, table->cols, ids, offsets, actions, (T *)out};
        auto k = vec ? k_history_embedding_vec<T> : k_history_embedding<T>;
        k<<<grid, 256, 0, s->st>>>(h);
    });
    return cu_check_launch(s, err, "history_embedding");
}

static int cuda_add(bk_stream *s, const void *a, const void *b, const int32_t *map, int n,
                    int width, void *out, bk_err *err)
{
    cu_prof_scope prof_(s, "add");
    if (n <= 0 || width <= 0)
        return 0;
    cu_prof_jag j; /* a and out at n rows, b at its distinct rows, the map */
    if (prof_.on() && !cu_prof_jagged(s, NULL, map, n, &j))
        prof_.work(0, (2.0 * n + j.users) * width * s->be->act_size +
                          (map ? n * (double)sizeof *map : 0));
    if (cu_enter(s, err))
        return -1;
    return cu_add_rows(s, a, width, b, width, map, out, width, n, width, "add", err);
}

/* Row copy in 16-byte units (rows, pitches and pointers 16-byte aligned):
 * a block per (row, chunk of 4 x blockDim units), each thread moving 4 units
 * with its loads issued before its stores, so a warp keeps 2 KiB in flight.
 * cudaMemcpy2DAsync moved the bench model's stack copies (1120 rows x 32
 * KiB) at 1.5 TB/s on the H200. Chunks rather than whole rows per block: with
 * a block per row, 1120 rows on 1056 resident blocks left a second round of
 * 64 rows on a nearly idle GPU. */
__global__ void k_copy_rows16(const uint4 *__restrict__ src, size_t lds,
                              const int32_t *__restrict__ map, uint4 *__restrict__ dst,
                              size_t ldd, int rows, int w, int chunks)
{
    const long units = (long)rows * chunks;
    for (long u = blockIdx.x; u < units; u += gridDim.x) {
        const int r = (int)(u / chunks);
        const int j = (int)(u - (long)r * chunks) * 4 * (int)blockDim.x + (int)threadIdx.x;
        const uint4 *sr = src + (size_t)(map ? map[r] : r) * lds;
        uint4 *dr = dst + (size_t)r * ldd;
        uint4 v[4];
#pragma unroll
        for (int k = 0; k < 4; k++)
            if (j + k * (int)blockDim.x < w) v[k] = __ldcs(sr + j + k * blockDim.x);
#pragma unroll
        for (int k = 0; k < 4; k++)
            if (j + k * (int)blockDim.x < w) dr[j + k * blockDim.x] = v[k];
    }
}

/* The unaligned mapped case (an auto-planned stack's odd widths), per
 * element (T: the activation's size). */
template <typename T>
__global__ void k_copy_rows_map(const T *__restrict__ src, size_t lds,
                                const int32_t *__restrict__ map, T *__restrict__ dst, size_t ldd,
                                int rows, int w)
{
    for (int r = blockIdx.x; r < rows; r += gridDim.x)
        for (int j = threadIdx.x; j < w; j += blockDim.x)
            dst[(size_t)r * ldd + j] = src[(size_t)map[r] * lds + j];
}

static int cuda_copy_rows(bk_stream *s, const void *src, int lds, const int32_t *map, int n,
                          int width, void *dst, int ldd, bk_err *err)
{
    cu_prof_scope prof_(s, "copy_rows");
    if (n <= 0 || width <= 0)
        return 0;
    cu_prof_jag j; /* n rows written, the distinct source rows read, the map */
    if (prof_.on() && !cu_prof_jagged(s, NULL, map, n, &j))
        prof_.work(0, ((double)n + j.users) * width * s->be->act_size +
                          (map ? n * (double)sizeof *map : 0));
    if (cu_enter(s, err))
        return -1;
    size_t es = s->be->act_size, wb = (size_t)width * es, sb = (size_t)lds * es,
           db = (size_t)ldd * es;
    int cap = cu_impl(s->be)->sm_count * 8;
    if (((uintptr_t)src | (uintptr_t)dst | wb | sb | db) % 16 == 0) {
        const int chunks = (int)((wb / 16 + 1023) / 1024); /* 4 units x 256 threads */
        const long units = (long)n * chunks, g = units < 64L * cap ? units : 64L * cap;
        k_copy_rows16<<<(unsigned)g, 256, 0, s->st>>>((const uint4 *)src, sb / 16, map,
                                                     (uint4 *)dst, db / 16, n, (int)(wb / 16),
                                                     chunks);
        return cu_check_launch(s, err, "copy_rows");
    }
    if (map) {
        int g = n < cap ? n : cap;
        if (es == 4)
            k_copy_rows_map<<<g, 256, 0, s->st>>>((const uint32_t *)src, (size_t)lds, map,
                                                  (uint32_t *)dst, (size_t)ldd, n, width);
        else
            k_copy_rows_map<<<g, 256, 0, s->st>>>((const uint16_t *)src, (size_t)lds, map,
                                                  (uint16_t *)dst, (size_t)ldd, n, width);
        return cu_check_launch(s, err, "copy_rows");
    }
    CU_TRY(cudaMemcpy2DAsync(dst, db, src, sb, wb, (size_t)n, cudaMemcpyDeviceToDevice, s->st),
           "copy_rows");
    return 0;
}

template <typename T>
__global__ void k_gather_dense(const T *__restrict__ src, const int32_t *__restrict__ map,
                               size_t nc, int width, T *__restrict__ dst)
{
    size_t total = nc * (size_t)width;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / width, j = i - r * width;
        dst[i] = src[(size_t)map[r] * width + j];
    }
}

/* One block per candidate copies its user's contiguous run of rows, 16 bytes
 * at a time where both ends allow it. */
__global__ void k_gather_jagged(const char *__restrict__ src, const int64_t *__restrict__ soff,
                                const int32_t *__restrict__ map, const int64_t *__restrict__ doff,
                                size_t row_bytes, char *__restrict__ dst)
{
    int c = blockIdx.x;
    int u = map[c];
    int64_t s0 = soff[u], len = soff[u + 1] - s0;
    const char *from = src + (size_t)s0 * row_bytes;
    char *to = dst + (size_t)doff[c] * row_bytes;
    size_t bytes = (size_t)len * row_bytes;
    if ((((uintptr_t)from | (uintptr_t)to | bytes) & 15) == 0) {
        const uint4 *f4 = (const uint4 *)from;
        uint4 *t4 = (uint4 *)to;
        for (size_t i = threadIdx.x; i < bytes / 16; i += blockDim.x)
            t4[i] = f4[i];
    } else if ((((uintptr_t)from | (uintptr_t)to | bytes) & 1) == 0) {
        const uint16_t *f2 = (const uint16_t *)from;
        uint16_t *t2 = (uint16_t *)to;
        for (size_t i = threadIdx.x; i < bytes / 2; i += blockDim.x)
            t2[i] = f2[i];
    } else {
        for (size_t i = threadIdx.x; i < bytes; i += blockDim.x)
            to[i] = from[i];
    }
}

static int cuda_gather(bk_stream *s, const void *src, const int64_t *src_offsets,
                       const int32_t *map, int nc, const int64_t *dst_offsets, int width,
                       void *dst, bk_err *err)
{
    cu_prof_scope prof_(s, "gather");
    if (nc <= 0 || width <= 0)
        return 0;
    /* Dense: nc rows written, each distinct user row read once. Jagged:
     * every candidate's copy of its user's events written, each user's
     * events read once, plus the offsets touched. Both read the map. */
    cu_prof_jag j;
    if (prof_.on() && !cu_prof_jagged(s, src_offsets, map, nc, &j)) {
        double rb = (double)width * s->be->act_size, idx = nc * (double)sizeof *map;
        if (!src_offsets)
            prof_.work(0, (nc + j.users) * rb + idx);
        else
            prof_.work(0, (j.pairs + j.urows) * rb + idx +
                              (nc + 1.0 + j.users + 1.0) * sizeof(int64_t));
    }
    if (cu_enter(s, err))
        return -1;
    if (!src_offsets) {
        size_t total = (size_t)nc * width;
        CU_DISPATCH(cu_dt(s), (k_gather_dense<T><<<cu_grid_for(total, 256), 256, 0, s->st>>>(
                                  (const T *)src, map, (size_t)nc, width, (T *)dst)));
    } else {
        if (!dst_offsets) {
            bk_seterr(err, "gather: jagged source needs dst_offsets");
            return -1;
        }
        k_gather_jagged<<<nc, 256, 0, s->st>>>((const char *)src, src_offsets, map, dst_offsets,
                                               (size_t)width * s->be->act_size, (char *)dst);
    }
    return cu_check_launch(s, err, "gather");
}

/* ------------------------------------------------------------ linear */

/* in == 0: y = act(bias), or zeros. */
template <typename T>
__global__ void k_bias_rows(T *y, int ldy, size_t rows, int width, const T *bias, int relu)
{
    size_t total = rows * (size_t)width;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / width, j = i - r * width;
        float v = bias ? cu_tof<T>(bias[j]) : 0.0f;
        y[r * ldy + j] = cu_fromf<T>(relu && v < 0.0f ? 0.0f : v);
    }
}

/* Largest power of two (<= 256) dividing both the address and the row pitch:
 * what cuBLASLt may assume about every row of the operand. */
static int align_of(const void *p, int ld, size_t es, int64_t batch_stride = 0)
{
    uintptr_t v = (uintptr_t)p | (uintptr_t)((size_t)ld * es) |
                  (uintptr_t)((size_t)batch_stride * es) | 256;
    return (int)(v & (~v + 1));
}

static void algo_release(cu_algo_entry *e)
{
    if (e->op) cublasLtMatmulDescDestroy(e->op);
    if (e->la) cublasLtMatrixLayoutDestroy(e->la);
    if (e->lb) cublasLtMatrixLayoutDestroy(e->lb);
    if (e->ld) cublasLtMatrixLayoutDestroy(e->ld);
    memset(e, 0, sizeof *e);
}

#define LT_TUNE_MAX 16

/* Times one candidate algorithm on the call's own operands (y is written,
 * the real call follows): the mean of 3 runs after one warm-up, in us, or
 * -1 when cuBLASLt refuses it. */
static float algo_time(bk_stream *s, cu_algo_entry *e, const cublasLtMatmulAlgo_t *algo,
                       const void *w, const void *x, void *y)
{
    float alpha = 1.0f, beta = 0.0f, ms = -1.0f;
    cudaEvent_t ev[2] = {NULL, NULL};
    if (cudaEventCreate(&ev[0]) != cudaSuccess || cudaEventCreate(&ev[1]) != cudaSuccess)
        goto out;
    for (int r = 0; r < 4; r++) {
        if (r == 1)
            cudaEventRecord(ev[0], s->st);
        if (cublasLtMatmul(s->lt, e->op, &alpha, w, e->la, x, e->lb, &beta, y, e->ld, y, e->ld,
                           algo, s->ws, s->ws_size, s->st) != CUBLAS_STATUS_SUCCESS)
            goto out;
    }
    cudaEventRecord(ev[1], s->st);
    cu_prof_release(s);
    if (cudaEventSynchronize(ev[1]) != cudaSuccess || cudaEventElapsedTime(&ms, ev[0], ev[1]))
        ms = -1.0f;
    else
        ms = ms * 1e3f / 3.0f;
out:
    for (int i = 0; i < 2; i++)
        if (ev[i]) cudaEventDestroy(ev[i]);
    (void)cudaGetLastError();
    return ms;
}

/* Makes e's descriptors and asks the heuristic once for its shape:
 * column-major view y^T [m, n] = W (col-major [k, m])^T x^T. With
 * IKBO_CUDA_LT_TUNE = N > 1 it times the heuristic's first N candidates on
 * this call's operands (bias already set) and keeps the fastest. */
static int algo_plan(bk_stream *s, cu_algo_entry *e, const void *bias, const void *w,
                     const void *x, void *y, bk_err *err)
{
    enum cu_dtype dt = (enum cu_dtype)e->dtype;
    cudaDataType_t ty = dt == CU_F32 ? CUDA_R_32F : dt == CU_BF16 ? CUDA_R_16BF : CUDA_R_16F;
    cublasLtEpilogue_t epi = (cublasLtEpilogue_t)e->epi;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t res[LT_TUNE_MAX];
    int tune = cu_impl(s->be)->lt_tune, found = 0, best = 0;
    if (tune < 1) tune = 1;
    if (tune > LT_TUNE_MAX) tune = LT_TUNE_MAX;
    uint32_t a32 = (uint32_t)e->align_a, b32 = (uint32_t)e->align_b, d32 = (uint32_t)e->align_d;
    e->op = NULL;
    e->la = e->lb = e->ld = NULL;
    BLAS_TRY(cublasLtMatmulDescCreate(&e->op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
    BLAS_TRY(cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta),
             "transa");
    BLAS_TRY(cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb),
             "transb");
    BLAS_TRY(cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi),
             "epilogue");
    if (bias)
        BLAS_TRY(cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                sizeof bias),
                 "bias");
    if (e->sms > 0)
        BLAS_TRY(cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET,
                                                &e->sms, sizeof e->sms),
                 "SM count target");
    BLAS_TRY(cublasLtMatrixLayoutCreate(&e->la, ty, e->k, e->m, e->lda), "layout W");
    BLAS_TRY(cublasLtMatrixLayoutCreate(&e->lb, ty, e->k, e->n, e->ldb), "layout x");
    BLAS_TRY(cublasLtMatrixLayoutCreate(&e->ld, ty, e->m, e->n, e->ldd), "layout y");
    if (e->batch > 1) { /* linear_grouped: W shared (stride 0), x and y strided */
        int32_t nb = e->batch;
        int64_t s0 = 0;
        cublasLtMatrixLayout_t lay[3] = {e->la, e->lb, e->ld};
        const int64_t *st[3] = {&s0, &e->sb, &e->sd};
        for (int i = 0; i < 3; i++) {
            BLAS_TRY(cublasLtMatrixLayoutSetAttribute(lay[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                      &nb, sizeof nb),
                     "batch count");
            BLAS_TRY(cublasLtMatrixLayoutSetAttribute(
                         lay[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, st[i], sizeof *st[i]),
                     "batch stride");
        }
    }
    BLAS_TRY(cublasLtMatmulPreferenceCreate(&pref), "preference");
    BLAS_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &s->ws_size, sizeof s->ws_size),
             "workspace preference");
    BLAS_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                  &a32, sizeof a32),
             "alignment A");
    BLAS_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                  &b32, sizeof b32),
             "alignment B");
    BLAS_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                  &d32, sizeof d32),
             "alignment C");
    BLAS_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                  &d32, sizeof d32),
             "alignment D");
    BLAS_TRY(cublasLtMatmulAlgoGetHeuristic(s->lt, e->op, e->la, e->lb, e->ld, e->ld, pref, tune,
                                            res, &found),
             "heuristic");
    if (found < 1) {
        bk_seterr(err, "cublasLt: no algorithm for linear [%d x %d] x [%d x %d]^T", e->n, e->k,
                  e->m, e->k);
        goto fail;
    }
    cublasLtMatmulPreferenceDestroy(pref);
    if (found > 1) {
        float t_best = -1.0f, t[LT_TUNE_MAX];
        for (int i = 0; i < found; i++) {
            t[i] = algo_time(s, e, &res[i].algo, w, x, y);
            if (t[i] >= 0 && (t_best < 0 || t[i] < t_best)) {
                t_best = t[i];
                best = i;
            }
        }
        if (s->prof) {
            fprintf(stderr, "lt tune linear %dx%d>%d:", e->n, e->k, e->m);
            for (int i = 0; i < found; i++)
                fprintf(stderr, " %s%.1f", i == best ? "*" : "", t[i]);
            fprintf(stderr, " us\n");
        }
    }
    e->algo = res[best].algo;
    return 0;
fail:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    algo_release(e);
    return -1;
}

/* y = act(x W^T + b) through cuBLASLt over `rows` rows of x, or with batch
 * > 1 a strided batch of `rows` rows each (x and y batch strides sx, sy,
 * elements; W shared). The shape's plan
 * is made on its first call and kept in the stream's cache (cu_algo_entry),
 * for sms SMs where sms > 0 (cu_linear_on_sms), else the whole device.
 * The epilogue applies bias and relu; other activations are the caller's. */
static int lt_linear(bk_stream *s, const void *x, int ldx, int64_t sx, int rows, int batch,
                     int sms, const bk_weight *w, const bk_weight *bias, enum bk_act act, void *y,
                     int ldy, int64_t sy, bk_err *err)
{
    size_t es = s->be->act_size;
    cublasLtEpilogue_t epi = bias ? (act == BK_ACT_RELU ? CUBLASLT_EPILOGUE_RELU_BIAS
                                                        : CUBLASLT_EPILOGUE_BIAS)
                                  : (act == BK_ACT_RELU ? CUBLASLT_EPILOGUE_RELU
                                                        : CUBLASLT_EPILOGUE_DEFAULT);
    cu_algo_entry key = {};
    key.valid = 1;
    key.m = w->rows;
    key.n = rows;
    key.k = w->cols;
    key.lda = w->ld;
    key.ldb = ldx;
    key.ldd = ldy;
    key.epi = (int)epi;
    key.align_a = align_of(w->data, w->ld, es);
    key.align_b = align_of(x, ldx, es, sx);
    key.align_d = align_of(y, ldy, es, sy);
    key.dtype = (int)cu_dt(s);
    key.batch = batch;
    key.sb = batch > 1 ? sx : 0;
    key.sd = batch > 1 ? sy : 0;
    key.sms = sms;
    cu_algo_entry *hit = NULL;
    for (int i = 0; i < CU_ALGO_CACHE && !hit; i++) {
        cu_algo_entry *e = &s->algos[i];
        if (e->valid && e->m == key.m && e->n == key.n && e->k == key.k && e->lda == key.lda &&
            e->ldb == key.ldb && e->ldd == key.ldd && e->epi == key.epi &&
            e->align_a == key.align_a && e->align_b == key.align_b &&
            e->align_d == key.align_d && e->dtype == key.dtype && e->batch == key.batch &&
            e->sb == key.sb && e->sd == key.sd && e->sms == key.sms)
            hit = e;
    }
    if (!hit) {
        if (algo_plan(s, &key, bias ? bias->data : NULL, w->data, x, y, err))
            return -1;
        hit = &s->algos[s->algo_next];
        s->algo_next = (s->algo_next + 1) % CU_ALGO_CACHE;
        algo_release(hit);
        *hit = key;
    }
    float alpha = 1.0f, beta = 0.0f;
    if (bias) {
        /* Layers of one shape share a plan; the bias is each call's own. */
        const void *bp = bias->data;
        if (blas_check(cublasLtMatmulDescSetAttribute(hit->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                      &bp, sizeof bp),
                       err, "bias"))
            return -1;
    }
    return blas_check(cublasLtMatmul(s->lt, hit->op, &alpha, w->data, hit->la, x, hit->lb, &beta,
                                     y, hit->ld, y, hit->ld, &hit->algo, s->ws, s->ws_size, s->st),
                      err, "matmul");
}

/* linear: with in = 0 a bias pass; else the first kernel that fits of
 * linear_tk.cu (in <= 64, many outputs), linear_small.cu (<= 16 rows) and
 * cuBLASLt. (linear_wr.cu's kernel lost to cuBLASLt on the plain K|V
 * projection in the forward, 15.9 against 15.2 us: bench/RESULTS.md.) */
static int linear_run(bk_stream *s, int sms, const void *x, int ldx, int rows, const bk_weight *w,
                      const bk_weight *bias, enum bk_act act, void *y, int ldy, bk_err *err)
{
    int out = w->rows, in = w->cols;
    cu_prof_scope prof_(s, s->prof ? prof_shape_name(s->prof, "linear", rows, in, out) : "linear");
    if (rows <= 0 || out <= 0)
        return 0;
    if (act < BK_ACT_NONE || act >= BK_ACT_COUNT) {
        bk_seterr(err, "linear: unknown activation %d", (int)act);
        return -1;
    }
    if (bias && bias->rows * bias->cols != out) {
        bk_seterr(err, "linear: bias has %d values for %d outputs", bias->rows * bias->cols, out);
        return -1;
    }
    if (ldx < in || ldy < out) {
        bk_seterr(err, "linear: row strides %d/%d below widths %d/%d", ldx, ldy, in, out);
        return -1;
    }
    if (prof_.on()) /* x, W, bias once, y; the activation pass is not compulsory */
        prof_.work(2.0 * rows * in * out,
                   ((double)rows * in + (double)out * in + (double)rows * out + (bias ? out : 0)) *
                       s->be->act_size);
    if (cu_enter(s, err))
        return -1;
    enum cu_dtype dt = cu_dt(s);
    if (in == 0) {
        size_t total = (size_t)rows * out;
        CU_DISPATCH(dt, (k_bias_rows<T><<<cu_grid_for(total, 256), 256, 0, s->st>>>(
                            (T *)y, ldy, (size_t)rows, out, bias ? (const T *)bias->data : NULL,
                            act == BK_ACT_RELU)));
        if (cu_check_launch(s, err, "linear bias"))
            return -1;
    } else if (cu_linear_tk_fits(dt, rows, w, y, ldy)) {
        return cu_linear_tk(s, x, ldx, rows, w, bias, act, y, ldy, err);
    } else if (cu_linear_small_fits(rows, w)) {
        return cu_linear_small(s, x, ldx, rows, w, bias, act, y, ldy, err);
    } else if (lt_linear(s, x, ldx, 0, rows, 1, sms, w, bias, act, y, ldy, 0, err)) {
        return -1;
    }
    /* What the epilogue lacks: sigmoid, exact gelu, silu, tanh (elementwise.cu). */
    return act == BK_ACT_RELU ? 0 : cu_act_rows(s, y, ldy, rows, out, act, err);
}

int cuda_linear(bk_stream *s, const void *x, int ldx, int rows, const bk_weight *w,
                const bk_weight *bias, enum bk_act act, void *y, int ldy, bk_err *err)
{
    return linear_run(s, 0, x, ldx, rows, w, bias, act, y, ldy, err);
}

int cu_linear_on_sms(bk_stream *s, int sms, const void *x, int ldx, int rows, const bk_weight *w,
                     const bk_weight *bias, enum bk_act act, void *y, int ldy, bk_err *err)
{
    return linear_run(s, sms, x, ldx, rows, w, bias, act, y, ldy, err);
}

/* linear_grouped: plain linear when the groups are evenly spaced, else
 * linear_wr.cu's kernel where it fits (the bench model's Q and Wo, 56.3 ->
 * 49.9 us in the forward against cuBLASLt's strided batch), else one
 * cuBLASLt strided batch over the groups (measured against the contiguous
 * GEMM plus the stack's copy it replaces: bench_ops --proj). */
static int cuda_linear_grouped(bk_stream *s, const void *x, int ldx, int64_t gx, int groups,
                               int g, const bk_weight *w, const bk_weight *bias, enum bk_act act,
                               void *y, int ldy, int64_t gy, bk_err *err)
{
    int uni = bk_grouped_check(w != NULL, w ? w->cols : 0, w ? w->rows : 0,
                               bias ? bias->rows * bias->cols : -1, ldx, gx, groups, g, act, ldy,
                               gy, err);
    if (uni)
        return uni < 0 ? -1 : cuda_linear(s, x, ldx, groups * g, w, bias, act, y, ldy, err);
    int out = w->rows, in = w->cols;
    cu_prof_scope prof_(s, s->prof ? prof_shape_name(s->prof, "linear grouped", groups * g, in, out)
                                   : "linear grouped");
    if (g == 0 || out == 0)
        return 0;
    if (prof_.on())
        prof_.work(2.0 * groups * g * in * out,
                   ((double)groups * g * (in + out) + (double)out * in + (bias ? out : 0)) *
                       s->be->act_size);
    if (cu_enter(s, err))
        return -1;
    if (in == 0) {
        for (int i = 0; i < groups; i++)
            if (cuda_linear(s, x, ldx, g, w, bias, act, (char *)y + i * gy * s->be->act_size,
                            ldy, err))
                return -1;
        return 0;
    }
    if (cu_linear_wr_fits(cu_dt(s), groups * g, w, x, ldx, gx, y, ldy, gy))
        return cu_linear_wr(s, x, ldx, gx, groups, g, w, bias, act, y, ldy, gy, err);
    return lt_linear(s, x, ldx, gx, g, groups, 0, w, bias, act, y, ldy, gy, err);
}

/* ------------------------------------------------------------ profile ceilings
 * What the profile's floors divide by (cu_prof, prof_floor_us): measured
 * once per process and dtype, on the first profiled stream, in the same
 * run as the ops they judge. Allocations are freed right after; a failure
 * leaves the ceilings unknown (the report says why and prints no floors). */

#define CEIL_COPY_BYTES ((size_t)1 << 30)
#define CEIL_GEMM_N 8192

/* Values in [-1, 1) from a hash of the index: GEMM operands with real bit
 * patterns (zeros would flatter the rate: less switching, less power). */
template <typename T> __global__ void k_ceil_fill(T *p, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        p[i] = cu_fromf<T>((float)(h >> 8) * (1.0f / 8388608.0f) - 1.0f);
    }
}

/* The best of 3 runs of run(err) on s's stream, in ms between CUDA events. */
template <class F> static int best_of_3(bk_stream *s, F run, float *best, bk_err *err)
{
    cudaEvent_t ev[2] = {NULL, NULL};
    int rc = -1;
    *best = -1;
    if (cu_check(cudaEventCreate(&ev[0]), err, "ceiling event") ||
        cu_check(cudaEventCreate(&ev[1]), err, "ceiling event"))
        goto out;
    for (int r = 0; r < 3; r++) {
        float ms = 0;
        if (cu_check(cudaEventRecord(ev[0], s->st), err, "ceiling event") || run(err) ||
            cu_check(cudaEventRecord(ev[1], s->st), err, "ceiling event") ||
            cu_check(cudaEventSynchronize(ev[1]), err, "ceiling run") ||
            cu_check(cudaEventElapsedTime(&ms, ev[0], ev[1]), err, "ceiling time"))
            goto out;
        if (*best < 0 || ms < *best)
            *best = ms;
    }
    rc = 0;
    if (!(*best > 0)) {
        bk_seterr(err, "ceiling timed at %g ms", (double)*best);
        rc = -1;
    }
out:
    for (int i = 0; i < 2; i++)
        if (ev[i])
            cudaEventDestroy(ev[i]);
    return rc;
}

/* Copy bandwidth: device-to-device copies of 1 GiB, read + write bytes / s. */
static int ceil_copy(bk_stream *s, double *bps, bk_err *err)
{
    void *a = NULL, *b = NULL;
    float ms = 0;
    auto copy = [&](bk_err *e) {
        return cu_check(cudaMemcpyAsync(b, a, CEIL_COPY_BYTES, cudaMemcpyDeviceToDevice, s->st), e,
                        "ceiling copy");
    };
    int rc = cu_check(cudaMalloc(&a, CEIL_COPY_BYTES), err, "1 GiB for the copy ceiling") ||
                     cu_check(cudaMalloc(&b, CEIL_COPY_BYTES), err, "1 GiB for the copy ceiling") ||
                     best_of_3(s, copy, &ms, err)
                 ? -1
                 : 0;
    cudaFree(a);
    cudaFree(b);
    (void)cudaGetLastError();
    if (!rc)
        *bps = 2.0 * (double)CEIL_COPY_BYTES / (ms * 1e-3);
    return rc;
}

/* GEMM rate: 8192^3 through cuBLASLt exactly as linear plans and runs it
 * (algo_plan: the dtype's inputs and output, fp32 compute and scale). */
static int ceil_gemm(bk_stream *s, enum cu_dtype dt, double *fps, bk_err *err)
{
    const int n = CEIL_GEMM_N;
    const size_t elems = (size_t)n * n, bytes = elems * (dt == CU_F32 ? 4 : 2);
    void *w = NULL, *x = NULL, *y = NULL;
    float ms = 0, alpha = 1.0f, beta = 0.0f;
    int rc = -1;
    cu_algo_entry e = {1, n, n, n, n, n, n, (int)CUBLASLT_EPILOGUE_DEFAULT, 256, 256, 256, (int)dt,
                       1, 0, 0, 0, NULL, NULL, NULL, NULL, {}};
    auto gemm = [&](bk_err *er) {
        return blas_check(cublasLtMatmul(s->lt, e.op, &alpha, w, e.la, x, e.lb, &beta, y, e.ld, y,
                                         e.ld, &e.algo, s->ws, s->ws_size, s->st),
                          er, "ceiling gemm");
    };
    if (cu_check(cudaMalloc(&w, bytes), err, "the gemm ceiling's operands") ||
        cu_check(cudaMalloc(&x, bytes), err, "the gemm ceiling's operands") ||
        cu_check(cudaMalloc(&y, bytes), err, "the gemm ceiling's operands"))
        goto out;
    CU_DISPATCH(dt, {
        k_ceil_fill<T><<<cu_grid_for(elems, 256), 256, 0, s->st>>>((T *)w, elems);
        k_ceil_fill<T><<<cu_grid_for(elems, 256), 256, 0, s->st>>>((T *)x, elems);
    });
    if (cu_check(cudaGetLastError(), err, "filling the gemm ceiling's operands") ||
        algo_plan(s, &e, NULL, w, x, y, err))
        goto out;
    rc = best_of_3(s, gemm, &ms, err);
out:
    algo_release(&e);
    cudaFree(w);
    cudaFree(x);
    cudaFree(y);
    (void)cudaGetLastError();
    if (!rc)
        *fps = 2.0 * n * (double)n * n / (ms * 1e-3);
    return rc;
}

static void prof_ceilings(bk_stream *s, cu_ceil *out)
{
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    static cu_ceil done[3]; /* by enum cu_dtype */
    static int tried[3];
    const enum cu_dtype dt = cu_dt(s);
    pthread_mutex_lock(&lock);
    if (!tried[dt]) {
        cu_ceil *c = &done[dt];
        bk_err e;
        c->dtype = dt == CU_F32 ? "fp32" : dt == CU_BF16 ? "bf16" : "fp16";
        c->ok = !ceil_copy(s, &c->copy_bps, &e) && !ceil_gemm(s, dt, &c->gemm_flops, &e);
        if (!c->ok)
            snprintf(c->why, sizeof c->why, "%.190s", e.msg);
        tried[dt] = 1;
    }
    *out = done[dt];
    pthread_mutex_unlock(&lock);
}

/* ------------------------------------------------------------ the table */

static void cuda_destroy(bk_backend *be)
{
    if (!be)
        return;
    cuda_backend *cb = cu_impl(be);
    pthread_mutex_destroy(&cb->lock);
    bk_ledger_destroy(&cb->ledger);
    free(cb);
    free(be);
}

/* Tests and benchmarks only (cuda_paths.h): production never calls it. */
extern "C" int bk_cuda_force_path(bk_backend *be, int lce, int attention, bk_err *err)
{
    if (!be || !be->name || strcmp(be->name, "cuda") != 0) {
        bk_seterr(err, "bk_cuda_force_path: not a CUDA backend");
        return -1;
    }
    if (lce < CU_PATH_AUTO || lce > CU_PATH_SIMT || attention < CU_PATH_AUTO ||
        attention > CU_PATH_SIMT) {
        bk_seterr(err, "bk_cuda_force_path: unknown path %d / %d", lce, attention);
        return -1;
    }
    cu_impl(be)->force_lce = lce;
    cu_impl(be)->force_att = attention;
    return 0;
}

static int env_int(const char *name, int dflt)
{
    const char *v = getenv(name);
    return v && *v ? atoi(v) : dflt;
}

extern "C" bk_backend *bk_cuda_new(int ordinal, bk_err *err)
{
    enum cu_dtype dt = CU_BF16;
    const char *ev = getenv("IKBO_CUDA_DTYPE");
    if (ev && *ev) {
        if (!strcmp(ev, "fp32") || !strcmp(ev, "f32"))
            dt = CU_F32;
        else if (!strcmp(ev, "bf16"))
            dt = CU_BF16;
        else if (!strcmp(ev, "fp16") || !strcmp(ev, "f16"))
            dt = CU_F16;
        else {
            bk_seterr(err, "IKBO_CUDA_DTYPE=%.32s: expected fp32, bf16 or fp16", ev);
            return NULL;
        }
    }
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        bk_seterr(err, "device cuda:%d: no usable CUDA device (%s)", ordinal, cudaGetErrorString(e));
        return NULL;
    }
    if (ordinal < 0 || ordinal >= count) {
        bk_seterr(err, "device cuda:%d: this machine has %d CUDA device(s)", ordinal, count);
        return NULL;
    }
    cudaDeviceProp prop;
    if (cu_check(cudaSetDevice(ordinal), err, "cudaSetDevice") ||
        cu_check(cudaGetDeviceProperties(&prop, ordinal), err, "device properties"))
        return NULL;
    if (prop.major < 9) {
        bk_seterr(err, "device cuda:%d (%s) has compute capability %d.%d; this build targets 9.0",
                  ordinal, prop.name, prop.major, prop.minor);
        return NULL;
    }
    bk_backend *be = (bk_backend *)calloc(1, sizeof *be);
    cuda_backend *cb = (cuda_backend *)calloc(1, sizeof *cb);
    if (!be || !cb) {
        free(be);
        free(cb);
        bk_seterr(err, "out of host memory allocating %zu bytes", sizeof *be + sizeof *cb);
        return NULL;
    }
    pthread_mutex_init(&cb->lock, NULL);
    bk_ledger_init(&cb->ledger);
    cb->ordinal = ordinal;
    cb->dtype = dt;
    cb->sm_count = prop.multiProcessorCount;
    cb->smem_optin = prop.sharedMemPerBlockOptin;
    cb->l2_bytes = (size_t)prop.l2CacheSize;
    cb->lt_tune = env_int("IKBO_CUDA_LT_TUNE", 0);
    be->name = "cuda";
    be->act_size = dt == CU_F32 ? 4 : 2;
    be->impl = cb;
    be->destroy = cuda_destroy;
    be->alloc = cuda_alloc;
    be->free = cuda_free;
    be->upload = cuda_upload;
    be->upload_f32 = cuda_upload_f32;
    be->host_from_f32 = cuda_host_from_f32;
    be->download_f32 = cuda_download_f32;
    be->get_stats = cuda_get_stats;
    be->stream_new = cuda_stream_new;
    be->stream_free = cuda_stream_free;
    be->lane = cuda_lane;
    be->lane_wait = cuda_lane_wait;
    be->sync = cuda_sync;
    be->lost = cuda_lost;
    be->stream_set_spin = cuda_stream_set_spin;
    be->weight_new = cuda_weight_new;
    be->weight_free = cuda_weight_free;
    be->embedding_bag = cuda_embedding_bag;
    be->embedding_bags = cuda_embedding_bags;
    be->history_embedding = cuda_history_embedding;
    be->linear = cuda_linear;
    be->linear_grouped = cuda_linear_grouped;
    be->mlp2 = cuda_mlp2;
    be->lce = cuda_lce;
    be->attention = cuda_attention;
    be->self_attention = cuda_self_attention;
    be->din_attention = cuda_din_attention;
    be->add = cuda_add;
    be->copy_rows = cuda_copy_rows;
    be->gather = cuda_gather;
    be->pool = cuda_pool;
    be->activation = cuda_activation;
    be->layer_norm = cuda_layer_norm;
    be->mul = cuda_mul;
    be->token_linear = cuda_token_linear;
    be->dot_interaction = cuda_dot_interaction;
    be->mixture = cuda_mixture;
    cu_graph_install(be);
    return be;
}
