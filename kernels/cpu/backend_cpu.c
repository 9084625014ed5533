/* backend_cpu.c - the CPU backend's op table: memory with byte accounting,
 * streams, weights, and the constructor bk_cpu_new.
 *
 * Why this exists: it is the fp32 reference device every model can run on
 * (no GPU needed) and the one the engine's tests use. Buffers are plain host
 * memory, so upload/download are copies and a stream runs each op to
 * completion before returning (sync has nothing to wait for). The only
 * shared mutable state is the per-backend byte accounting, guarded by a
 * mutex because alloc/free may be called from any thread, and each weight's
 * lazily built linear panels (see struct bk_weight).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_internal.h"

static cpu_backend *impl_of(bk_backend *be) { return (cpu_backend *)be->impl; }

/* ---- memory ---- */

/* Every buffer is cache-line aligned and at least one line long, so an
 * alloc of 0 bytes still returns a valid, distinct pointer. */
static void *aligned_bytes(size_t bytes)
{
    if (bytes > SIZE_MAX - CPU_ALIGN)
        return NULL;
    size_t rounded = (bytes + CPU_ALIGN - 1) / CPU_ALIGN * CPU_ALIGN;
    if (rounded == 0)
        rounded = CPU_ALIGN;
    return aligned_alloc(CPU_ALIGN, rounded);
}

void *cpu_alloc(bk_backend *be, size_t bytes, enum bk_tag tag, bk_err *err)
{
    if ((unsigned)tag >= BK_TAG_COUNT) {
        bk_seterr(err, "alloc: bad buffer tag %d", (int)tag);
        return NULL;
    }
    if (bk_fault_hit(&be->fault, BK_FAULT_ALLOC)) {
        bk_seterr(err, "out of host memory allocating %zu bytes" BK_FAULT_INJECTED, bytes);
        return NULL;
    }
    void *p = aligned_bytes(bytes);
    if (!p) {
        bk_seterr(err, "out of host memory allocating %zu bytes", bytes);
        return NULL;
    }
    bk_ledger_account(&impl_of(be)->ledger, tag, bytes, 0);
    return p;
}

/* The caller passes the size and tag it allocated with (backend.h), as the
 * CUDA backend needs too; free(NULL) is a no-op and accounts nothing. */
void cpu_free(bk_backend *be, void *p, size_t bytes, enum bk_tag tag)
{
    if (!p)
        return;
    free(p);
    if ((unsigned)tag < BK_TAG_COUNT)
        bk_ledger_account(&impl_of(be)->ledger, tag, 0, bytes);
}

static int cpu_upload(bk_stream *s, void *dst, const void *src, size_t bytes, bk_err *err)
{
    (void)s;
    if (bk_bad_copy("upload", bytes, 1, dst, src, err))
        return -1;
    if (bytes)
        memmove(dst, src, bytes);
    return 0;
}

/* Activations are fp32 on the CPU, so conversion is a copy. */
static int cpu_upload_f32(bk_stream *s, void *dst, const float *src, size_t n, bk_err *err)
{
    if (bk_bad_copy("upload_f32", n, sizeof(float), dst, src, err))
        return -1;
    return cpu_upload(s, dst, src, n * sizeof(float), err);
}

static void cpu_host_from_f32(bk_backend *be, void *dst, const float *src, size_t n)
{
    (void)be;
    if (n) memcpy(dst, src, n * sizeof(float));
}

static int cpu_download_f32(bk_stream *s, float *dst, const void *src, size_t n, bk_err *err)
{
    if (bk_bad_copy("download_f32", n, sizeof(float), dst, src, err))
        return -1;
    if (bk_fault_wait(&s->be->fault, "download_f32", err))
        return -1;
    return cpu_upload(s, dst, src, n * sizeof(float), err);
}

static void cpu_get_stats(bk_backend *be, bk_stats *out)
{
    bk_ledger_get(&impl_of(be)->ledger, out);
}

/* ---- streams: ops run synchronously, so a stream only names its backend ---- */

static bk_stream *cpu_stream_new(bk_backend *be, bk_err *err)
{
    bk_stream *s = calloc(1, sizeof *s);
    if (!s) {
        bk_seterr(err, "out of host memory allocating %zu bytes", sizeof *s);
        return NULL;
    }
    s->be = be;
    return s;
}

static void cpu_stream_free(bk_stream *s)
{
    if (s) free(s->lane);
    free(s);
}

/* be->lane: ops here run on the calling thread in call order, so a lane
 * overlaps nothing; it exists so that the engine's lane path (where each
 * layer is issued, the bags split by side, the waits) runs in the CPU's
 * tests and in the golden check against the PyTorch reference. */
static bk_stream *cpu_lane(bk_stream *s, bk_err *err)
{
    if (s->owner) {
        bk_seterr(err, "lane: a lane has no lane of its own");
        return NULL;
    }
    if (!s->lane) {
        if (!(s->lane = cpu_stream_new(s->be, err))) return NULL;
        s->lane->owner = s;
    }
    return s->lane;
}

/* Every op has completed on return, so there is nothing to wait for. */
static int cpu_lane_wait(bk_stream *a, bk_stream *b, bk_err *err)
{
    if (a->owner == b || b->owner == a) return 0;
    bk_seterr(err, "lane_wait: the streams are not a stream and its lane");
    return -1;
}

static int cpu_sync(bk_stream *s, bk_err *err) { return bk_fault_wait(&s->be->fault, "sync", err); }

/* Host memory is never lost; only IKBO_FAULT's lost says otherwise. */
static int cpu_lost(bk_backend *be, bk_err *why) { return bk_fault_lost(&be->fault, why); }

/* ---- weights ---- */

static size_t panel_floats(const bk_weight *w)
{
    size_t panels = ((size_t)w->rows + GEMM_NR - 1) / GEMM_NR;
    return panels * GEMM_NR * (size_t)w->cols;
}

static bk_weight *cpu_weight_new(bk_backend *be, const float *w, int rows, int cols, bk_err *err)
{
    if (rows < 0 || cols < 0) {
        bk_seterr(err, "weight_new: bad shape [%d, %d]", rows, cols);
        return NULL;
    }
    size_t n = (size_t)rows * (size_t)cols;
    if (n && !w) {
        bk_seterr(err, "weight_new: NULL data for a [%d, %d] weight", rows, cols);
        return NULL;
    }
    if (n > SIZE_MAX / sizeof(float) / 2) { /* /2: room for the packed copy */
        bk_seterr(err, "weight_new: [%d, %d] is too large", rows, cols);
        return NULL;
    }
    if (bk_fault_hit(&be->fault, BK_FAULT_ALLOC)) {
        bk_seterr(err, "out of host memory allocating %zu bytes" BK_FAULT_INJECTED,
                  n * sizeof(float));
        return NULL;
    }
    bk_weight *h = malloc(sizeof *h);
    float *data = aligned_bytes(n * sizeof(float));
    if (!h || !data) {
        free(h);
        free(data);
        bk_seterr(err, "out of host memory allocating %zu bytes", n * sizeof(float));
        return NULL;
    }
    if (n)
        memcpy(data, w, n * sizeof(float));
    h->be = be;
    h->rows = rows;
    h->cols = cols;
    h->data = data;
    h->packed = NULL;
    pthread_mutex_init(&h->pack_lock, NULL);
    bk_ledger_weights(&impl_of(be)->ledger, n * sizeof(float), 0);
    return h;
}

const float *cpu_weight_packed(const bk_weight *cw, bk_err *err)
{
    /* The weight is logically read-only; its panels are a cache built once
     * under the weight's lock. The lock is taken on every call (tens of ns
     * against a matmul) rather than double-checked, which keeps the code
     * obviously right and race checkers (helgrind, tsan) quiet. */
    bk_weight *w = (bk_weight *)cw;
    pthread_mutex_lock(&w->pack_lock);
    float *p = w->packed;
    if (!p) {
        size_t n = panel_floats(w);
        p = aligned_bytes(n * sizeof(float));
        if (!p) {
            pthread_mutex_unlock(&w->pack_lock);
            bk_seterr(err, "out of host memory allocating %zu bytes", n * sizeof(float));
            return NULL;
        }
        size_t K = (size_t)w->cols, panels = ((size_t)w->rows + GEMM_NR - 1) / GEMM_NR;
        for (size_t q = 0; q < panels; q++) {
            float *panel = p + q * K * GEMM_NR;
            for (size_t k = 0; k < K; k++)
                for (size_t j = 0; j < GEMM_NR; j++) {
                    size_t r = q * GEMM_NR + j;
                    panel[k * GEMM_NR + j] = r < (size_t)w->rows ? w->data[r * K + k] : 0.0f;
                }
        }
        bk_ledger_weights(&impl_of(w->be)->ledger, n * sizeof(float), 0);
        w->packed = p;
    }
    pthread_mutex_unlock(&w->pack_lock);
    return p;
}

static void cpu_weight_free(bk_backend *be, bk_weight *w)
{
    if (!w)
        return;
    size_t n = (size_t)w->rows * (size_t)w->cols;
    float *p = w->packed; /* the caller owns w now: no other user */
    size_t held = n * sizeof(float) + (p ? panel_floats(w) * sizeof(float) : 0);
    bk_ledger_weights(&impl_of(be)->ledger, 0, held);
    free(p);
    free(w->data);
    pthread_mutex_destroy(&w->pack_lock);
    free(w);
}

/* ---- the table ---- */

static void cpu_destroy(bk_backend *be)
{
    if (!be)
        return;
    cpu_backend *cb = impl_of(be);
    bk_ledger_destroy(&cb->ledger);
    free(cb);
    free(be);
}

bk_backend *bk_cpu_new(bk_err *err)
{
    bk_backend *be = calloc(1, sizeof *be);
    cpu_backend *cb = calloc(1, sizeof *cb);
    if (!be || !cb) {
        free(be);
        free(cb);
        bk_seterr(err, "out of host memory allocating %zu bytes",
                  sizeof *be + sizeof *cb);
        return NULL;
    }
    bk_ledger_init(&cb->ledger);
    be->name = "cpu";
    be->act_size = sizeof(float);
    be->impl = cb;
    be->destroy = cpu_destroy;
    be->alloc = cpu_alloc;
    be->free = cpu_free;
    be->upload = cpu_upload;
    be->upload_f32 = cpu_upload_f32;
    be->host_from_f32 = cpu_host_from_f32;
    be->download_f32 = cpu_download_f32;
    be->get_stats = cpu_get_stats;
    be->stream_new = cpu_stream_new;
    be->stream_free = cpu_stream_free;
    be->lane = cpu_lane;
    be->lane_wait = cpu_lane_wait;
    be->sync = cpu_sync;
    be->lost = cpu_lost;
    be->weight_new = cpu_weight_new;
    be->weight_free = cpu_weight_free;
    be->embedding_bag = cpu_embedding_bag;
    be->embedding_bags = cpu_embedding_bags;
    be->history_embedding = cpu_history_embedding;
    be->linear = cpu_linear;
    be->mlp2 = cpu_mlp2;
    be->linear_grouped = cpu_linear_grouped;
    be->lce = cpu_lce;
    be->attention = cpu_attention;
    be->self_attention = cpu_self_attention;
    be->din_attention = cpu_din_attention;
    be->add = cpu_add;
    be->copy_rows = cpu_copy_rows;
    be->gather = cpu_gather;
    be->pool = cpu_pool;
    be->activation = cpu_activation;
    be->layer_norm = cpu_layer_norm;
    be->mul = cpu_mul;
    be->token_linear = cpu_token_linear;
    be->dot_interaction = cpu_dot_interaction;
    be->mixture = cpu_mixture;
    return be;
}
