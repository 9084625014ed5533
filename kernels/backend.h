/* backend.h - the one op table the engine computes through.
 *
 * Why this exists: the engine (engine/) plans a model once and then runs the
 * same sequence of ops on whichever device serves it. Every device-specific
 * thing - memory, weight layout and dtype, kernels - sits behind this table,
 * like ggml's backend interface: kernels/cpu implements it in fp32 C,
 * kernels/cuda in CUDA C. The engine never dereferences a buffer pointer.
 *
 * Conventions
 * - Activations are 2-D row-major [rows, width] in the backend's activation
 *   dtype (fp32 on the CPU; the CUDA backend may use bf16/fp16). A "row" is one
 *   user or one candidate (or one history event for jagged tensors). `ld` is
 *   the row stride in elements; ops that take no `ld` use ld == width.
 * - Buffers come from be->alloc and are freed with be->free. Index arrays
 *   (ids, offsets, map) are backend buffers too, filled with be->upload.
 * - Weights are opaque handles made once at load from fp32 host data; the
 *   backend may convert, pad (K to a multiple of 8) or transpose them.
 * - Every op returns 0 or -1; on -1 it wrote a message with bk_seterr().
 *   Ops on one bk_stream run in order; be->sync waits for them.
 *
 * Ownership: the caller owns everything it allocates and frees it with the
 * same backend. Thread-safety: weights are read-only after load and may be
 * shared by all threads; a bk_stream and the buffers used on it belong to one
 * thread at a time. alloc/free/weight_new may be called from any thread.
 */
#ifndef IKBO_BACKEND_H
#define IKBO_BACKEND_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/fault.h"

typedef struct bk_backend bk_backend;
typedef struct bk_weight bk_weight;
typedef struct bk_stream bk_stream;
typedef struct bk_graph bk_graph;

/* Error text carried up to the caller (gRPC status, log line, CLI). */
typedef struct bk_err {
    char msg[512];
} bk_err;
void bk_seterr(bk_err *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* mlp2's addend (be->mlp2): add[r, :] = x[r, :] w^T + b over the op's
 * rows, w [out, in], b [1, out] (NULL: none), x [rows, ldx >= in]. */
typedef struct bk_mlp2_addend {
    const void *x;
    int ldx;
    const bk_weight *w, *b;
} bk_mlp2_addend;

/* Activations: relu, sigmoid, exact gelu 0.5 x (1 + erf(x / sqrt 2)),
 * silu x * sigmoid(x), tanh. */
enum bk_act {
    BK_ACT_NONE = 0,
    BK_ACT_RELU = 1,
    BK_ACT_SIGMOID = 2,
    BK_ACT_GELU = 3,
    BK_ACT_SILU = 4,
    BK_ACT_TANH = 5,
    BK_ACT_COUNT = 6
};
/* Pooling: embedding_bag takes SUM and MEAN; pool takes all four. LAST is
 * the last token / most recent event. */
enum bk_pool { BK_POOL_SUM = 0, BK_POOL_MEAN = 1, BK_POOL_MAX = 2, BK_POOL_LAST = 3 };

/* dot_interaction's token order (see the op). At most BK_DOT_MAX_TOKENS
 * tokens in all; passed by value to kernels. */
#define BK_DOT_MAX_TOKENS 256
typedef struct bk_dot_order {
    int ku, kc;                       /* user tokens, candidate tokens          */
    uint16_t pos[BK_DOT_MAX_TOKENS];  /* pos[t]: token t's place in the stack T */
} bk_dot_order;

/* self_attention's weighting of the keys. */
enum bk_att_kind { BK_ATT_SOFTMAX = 0, BK_ATT_SILU = 1 };

/* One self_attention call (see the op): the self part over each user's
 * events and, optionally, the target part of a target_attention that
 * shares the layer's K/V (shared_with) - one launch on the GPU. */
typedef struct bk_seq_att {
    const void *k, *v;       /* [offsets[nu], heads*dh] packed jagged        */
    const int64_t *offsets;  /* [nu+1] event rows of each user               */
    int64_t events;          /* offsets[nu]: rows of q, k, v, o (GPU sizing)  */
    int nu, heads, dh;
    /* Self part (q NULL: none). q, o [offsets[nu], heads*dh]. */
    const void *q;
    void *o;
    int causal;
    enum bk_att_kind kind;
    /* Target part (tq NULL: none): the attention op's semantics with
     * q = tq [nc*tq_tokens, heads*dh], map [nc] non-decreasing, o = to
     * packed (go = tq_tokens*heads*dh). */
    const void *tq;
    const int32_t *map;
    int nc, tq_tokens;
    void *to;
} bk_seq_att;

/* One embedding_bag call's arguments (embedding_bags). */
typedef struct bk_bag {
    const bk_weight *table;
    const int64_t *ids, *offsets;
    int n;
    enum bk_pool pool;
    void *out;
    int ld;
} bk_bag;
/* embedding_bags takes at most this many bags (passed by value to kernels). */
#define BK_MAX_BAGS 32

/* mixture takes at most this many experts (pointers passed by value). */
#define BK_MIX_MAX_EXPERTS 64

/* What a buffer holds, for the byte accounting that proves IKBO mode never
 * materializes a user tensor at candidate batch size. Ops' transient
 * scratch (lce's user term at nu rows, attention's per-user key tile) is
 * counted too, under BK_TAG_USER; the CPU backend frees it before the op
 * returns, so it shows in bytes_peak only. */
enum bk_tag {
    BK_TAG_USER = 0,      /* a user-domain tensor: rows = U (or history rows) */
    BK_TAG_CAND = 1,      /* a candidate-domain tensor: rows = C             */
    BK_TAG_BROADCAST = 2, /* a user tensor gathered to candidates (baseline)  */
    BK_TAG_INDEX = 3,     /* ids, offsets, map, and the dense input features
                             (the batch's inputs, uploaded in one copy)     */
    BK_TAG_COUNT = 4
};

typedef struct bk_stats {
    size_t bytes_live[BK_TAG_COUNT]; /* currently allocated, by tag */
    size_t bytes_peak[BK_TAG_COUNT]; /* high-water mark, by tag     */
    size_t weight_bytes;             /* device bytes held by weights */
} bk_stats;

/* Every backend's byte accounting (backend.c), behind its own lock: alloc
 * and free run on any thread. account adds add bytes to tag's live count and
 * takes away sub (never below zero: a caller freeing more than is live
 * clamps), raising its peak; weights does the same for the weights' count;
 * get copies the counts. The owner inits it once and destroys it last. */
typedef struct bk_ledger {
    pthread_mutex_t lock;
    bk_stats stats;
} bk_ledger;
void bk_ledger_init(bk_ledger *l);
void bk_ledger_destroy(bk_ledger *l);
void bk_ledger_account(bk_ledger *l, enum bk_tag tag, size_t add, size_t sub);
void bk_ledger_weights(bk_ledger *l, size_t add, size_t sub);
void bk_ledger_get(bk_ledger *l, bk_stats *out);

struct bk_backend {
    const char *name;       /* "cpu", "cuda"                         */
    size_t act_size;        /* bytes per activation element           */
    void *impl;             /* backend private state                  */
    bk_fault fault;         /* IKBO_FAULT injection (kernels/fault.h); zero = off */

    void (*destroy)(bk_backend *be);

    /* ---- memory ---- */
    void *(*alloc)(bk_backend *be, size_t bytes, enum bk_tag tag, bk_err *err);
    void (*free)(bk_backend *be, void *p, size_t bytes, enum bk_tag tag);
    /* Raw byte copies (ids, offsets, map) host <-> backend. */
    int (*upload)(bk_stream *s, void *dst, const void *src, size_t bytes, bk_err *err);
    /* fp32 host -> activation dtype, n elements. */
    int (*upload_f32)(bk_stream *s, void *dst, const float *src, size_t n, bk_err *err);
    /* fp32 -> activation dtype on the host, n elements into dst (host
     * memory): what upload_f32 converts before its copy. The engine
     * converts the dense inputs into its host mirror of the batch's
     * inputs and uploads them with the index arrays in one copy. */
    void (*host_from_f32)(bk_backend *be, void *dst, const float *src, size_t n);
    /* activation dtype -> fp32 host, n elements (completes before returning). */
    int (*download_f32)(bk_stream *s, float *dst, const void *src, size_t n, bk_err *err);
    void (*get_stats)(bk_backend *be, bk_stats *out);

    /* ---- streams (one per execution instance) ---- */
    bk_stream *(*stream_new)(bk_backend *be, bk_err *err);
    void (*stream_free)(bk_stream *s);
    int (*sync)(bk_stream *s, bk_err *err);
    /* How a thread waiting on this stream (download_f32, sync) waits for
     * the device: spin_us < 0, the runtime's own wait (it polls until the
     * stream is done; a new stream's setting); spin_us >= 0, it polls for
     * at most spin_us, then sleeps until the device signals the end (0:
     * sleeps at once). Polling answers a few microseconds sooner; sleeping
     * leaves the core to other threads (bench/RESULTS.md has the A/B).
     * Optional: NULL where the work runs on the calling thread (the CPU). */
    int (*stream_set_spin)(bk_stream *s, long long spin_us, bk_err *err);
    /* ---- lanes (optional: NULL on a backend without them) ----
     * lane: s's second stream on the same device, made on first call and
     *   owned by s (freed with it; NULL with err set on failure). Ops issued
     *   on the lane may run concurrently with s's ops (on the CPU, whose ops
     *   complete in call order, they never do): the engine puts the
     *   user-only part of a batch there (engine.c, "The user lane"). The
     *   lane shares s's profile and s's batch graph recording: a recording
     *   of s takes in the lane's work between a lane_wait(lane, s) and the
     *   lane_wait(s, lane) that must follow it before download_f32.
     * lane_wait(a, b): a's later ops wait for every op queued on b so far
     *   (a and b: a stream and its lane, either way round). No host wait. */
    bk_stream *(*lane)(bk_stream *s, bk_err *err);
    int (*lane_wait)(bk_stream *a, bk_stream *b, bk_err *err);
    /* 1 with why set when the device is lost: a fault left it unusable for
     * the rest of the process (CUDA's sticky errors: an illegal address or
     * instruction, a kernel's launch failure, an uncorrectable ECC error;
     * every later call on the device fails with it), or IKBO_FAULT's lost
     * fired on this backend; else 0. Does not wait for the device. A caller
     * asks after a failure: only a new process can use the device again.
     * Any thread. */
    int (*lost)(bk_backend *be, bk_err *why);

    /* ---- batch graphs (optional: NULL when the backend has none, as on
     * the CPU; the engine's use is in engine/batch_graph.h) ----
     * A batch is a fixed sequence: uploads, ops, one download_f32. Its
     * launches can be recorded once and replayed for a later batch whose
     * every buffer address, size and scalar is the same.
     * graph_capture: from now until the next download_f32, the stream's
     *   work is recorded, not run; that download_f32 ends the recording,
     *   runs the graph and waits, as usual. graph_take then hands the
     *   graph to the caller (NULL if the recording failed).
     * graph_replay: from now until the next download_f32, uploads only
     *   stage their bytes (each must reach the staging address and size it
     *   had when g was recorded, or the upload fails), ops are refused,
     *   and download_f32 launches g in place of its own copy. Fails at once
     *   when the stream's private buffers moved since g was recorded.
     * graph_cancel: after any failure in either mode, back to normal
     *   (a recording in progress is discarded; nothing of it ran).
     * A bk_graph belongs to the stream that recorded it; free it before
     * the stream. */
    int (*graph_capture)(bk_stream *s, bk_err *err);
    bk_graph *(*graph_take)(bk_stream *s);
    int (*graph_replay)(bk_stream *s, const bk_graph *g, bk_err *err);
    void (*graph_cancel)(bk_stream *s);
    void (*graph_free)(bk_graph *g);

    /* ---- weights ---- */
    /* w: fp32 [rows, cols] row-major, copied. */
    bk_weight *(*weight_new)(bk_backend *be, const float *w, int rows, int cols, bk_err *err);
    void (*weight_free)(bk_backend *be, bk_weight *w);

    /* ---- ops ---- */

    /* Embedding bag: out[b, :] = pool over ids[offsets[b] .. offsets[b+1]) of
     * table[((id % rows) + rows) % rows, :]. Empty bag -> zeros.
     * table [rows, dim]; ids int64; offsets int64 [n+1]; out [n, ld]. */
    int (*embedding_bag)(bk_stream *s, const bk_weight *table, const int64_t *ids,
                         const int64_t *offsets, int n, enum bk_pool pool,
                         void *out, int ld, bk_err *err);
    /* n (1..BK_MAX_BAGS) embedding_bag calls as one: the same results as
     * calling embedding_bag for each bag in order (on a GPU, one launch;
     * the engine groups consecutive embedding_bag layers this way). */
    int (*embedding_bags)(bk_stream *s, const bk_bag *bags, int n, bk_err *err);

    /* History embedding over packed jagged events: for user u, events
     * [offsets[u], offsets[u+1]) (already cut to the most recent max_len,
     * oldest first): out[e] = table[row(ids[e])] + action[actions[e]] +
     * position[e - offsets[u]]. actions may be NULL (all 0); values were
     * checked by the caller. out [offsets[n], dim]. */
    int (*history_embedding)(bk_stream *s, const bk_weight *table, const bk_weight *action,
                             const bk_weight *position, const int64_t *ids,
                             const int32_t *actions, const int64_t *offsets, int n,
                             void *out, bk_err *err);

    /* Pool each row's tokens or events to one [d] row, out [n, ld >= d]
     * (ld > d: the rows' columns of a wider output, such as a stack's).
     * Jagged (offsets != NULL): row r's events are rows [offsets[r],
     * offsets[r+1]) of x [*, d], k ignored. Tokens (offsets NULL): x [n, k*d],
     * k tokens of d per row. fn: SUM, MEAN, MAX, LAST (the last token/event);
     * an empty segment gives zeros for every fn. Reductions run in increasing
     * event order. */
    int (*pool)(bk_stream *s, const void *x, const int64_t *offsets, int n, int k, int d,
                enum bk_pool fn, void *out, int ld, bk_err *err);

    /* out[i] = act(x[i]) for i < n elements (act != NONE). out may alias x. */
    int (*activation)(bk_stream *s, const void *x, size_t n, enum bk_act act, void *out,
                      bk_err *err);

    /* Layer norm over each of `rows` rows of `dim` elements:
     *   out[r, :] = (x[r, :] - mean) / sqrt(var + eps) * w + b,
     * var the biased variance, mean and var accumulated in fp32 (two passes:
     * mean, then squared deviations). w, b are weights [1, dim]. out may
     * alias x. */
    int (*layer_norm)(bk_stream *s, const void *x, int rows, int dim, const bk_weight *w,
                      const bk_weight *b, float eps, void *out, bk_err *err);

    /* out[r, :] = a[r, :] * b[map ? map[r] : r, :] (+ c[r, :] when c != NULL),
     * width elements, n rows. mul is c == NULL; DCNv2's cross is
     * x0 * (W x + b) + x. out may alias a or c. */
    int (*mul)(bk_stream *s, const void *a, const void *b, const int32_t *map, const void *c,
               int n, int width, void *out, bk_err *err);

    /* Token mixing (token_linear): Z[r] = W @ X[r] for each row r, X[r] the
     * [k, d] tokens of row r (x [rows, k*d]), W [m, k], Z [rows, m*d]. */
    int (*token_linear)(bk_stream *s, const void *x, int rows, const bk_weight *w, int k, int m,
                        int d, void *z, bk_err *err);

    /* Pairwise dot products (dot_interaction). Row r has a virtual stack T of
     * K = ord->ku + ord->kc tokens of width d: user tokens tu[u] with u =
     * map ? map[r] : r (tu [*, ku*d]) and candidate tokens tc[r] (tc [n,
     * kc*d]; NULL when kc = 0). Token t (t < ku: user token t; else candidate
     * token t - ku) sits at place ord->pos[t] of T; pos is a permutation of
     * 0..K-1, increasing within each side. out[r, :] ([n, P]) holds T_i . T_j
     * for places i < j (i <= j with self) in row-major upper-triangle order:
     * (0,1), (0,2), ..., (1,2), ... Each dot is an fp32 sum in increasing d.
     * uu: NULL, or [*, Pu] the pairs among the ku user tokens alone (same
     * order and self rule, over user tokens 0..ku-1) as this op computed them
     * with kc = 0 - those pairs are then copied from uu[u], not recomputed.
     * IKBO: user-user pairs once per user, the rest at C through the map. */
    int (*dot_interaction)(bk_stream *s, const void *tu, const void *uu, const int32_t *map,
                           const void *tc, int n, const bk_dot_order *ord, int d, int self,
                           void *out, bk_err *err);

    /* MMoE/PLE mixture: out[r, :] = sum_e g[r, e] * experts[e][r, :] with
     * g[r, :] = softmax(gate[r, :]) (max-subtracted, fp32), gate [n, n_experts],
     * each expert [n, width], 1 <= n_experts <= BK_MIX_MAX_EXPERTS. The sum
     * runs in increasing e. */
    int (*mixture)(bk_stream *s, const void *const *experts, int n_experts, const void *gate,
                   int n, int width, void *out, bk_err *err);

    /* y[r, :] = act(x[r, :] W^T + b). W [out, in]; bias NULL = none.
     * x [rows, ldx >= in], y [rows, ldy >= out]. bias is a weight of out
     * elements ([1, out]). y must not overlap x (error). */
    int (*linear)(bk_stream *s, const void *x, int ldx, int rows, const bk_weight *w,
                  const bk_weight *bias, enum bk_act act, void *y, int ldy, bk_err *err);

    /* A two-layer map whose hidden layer is never stored, plus a linear:
     *   y[r, :] = act2(add[r, :] + act1(x[r, :] W1^T + b1) W2^T
     *                  + addu[map ? map[r] : r, :])
     *   add[r, :] = a->x[r, :] a->w^T + a->b   (a NULL: add = 0)
     * W1 [hidden, in], b1 [1, hidden] (NULL: none), act1 NONE or RELU, W2
     * [out, hidden]; x [rows, ldx >= in]; a (bk_mlp2_addend) a linear of
     * out outputs over its own input, which must not overlap y; addu packed
     * rows of out (NULL: zeros; the fold's user term, read through the
     * candidate-to-user map) must not overlap y, nor y x; act2 any
     * activation (NONE: identity). add is what linear(a->x, a->w, a->b)
     * would store and each hidden value what linear(x, W1, b1, act1) would
     * (both rounded to the activation dtype), so the result is the
     * composition act2(linear(linear(x, W1, b1, act1), W2) + add + addu) up
     * to the order of the sums over hidden; the CPU adds in that order. The
     * addend is an argument, not a tensor, so a backend may run its linear
     * beside the hidden layer's work (CUDA: kernels/cuda/mlp2.cu). */
    int (*mlp2)(bk_stream *s, const void *x, int ldx, int rows, const bk_weight *w1,
                const bk_weight *b1, enum bk_act act1, const bk_weight *w2,
                const bk_mlp2_addend *a, const void *addu, const int32_t *map, enum bk_act act2,
                void *y, int ldy, bk_err *err);

    /* linear over row groups, for a block of tokens that sits inside wider
     * rows (a layer writing its tokens straight into a stack): rows =
     * groups * g; row j of group i reads x + i*gx + j*ldx and writes
     * y + i*gy + j*ldy (offsets in elements), each row exactly as linear
     * computes it. act NONE or RELU. Groups must not overlap (gy >=
     * (g-1)*ldy + out), nor y overlap x. With gx = g*ldx and gy = g*ldy it
     * is linear over groups*g rows. */
    int (*linear_grouped)(bk_stream *s, const void *x, int ldx, int64_t gx, int groups, int g,
                          const bk_weight *w, const bk_weight *bias, enum bk_act act, void *y,
                          int ldy, int64_t gy, bk_err *err);

    /* IKBO linear compression: for candidate c,
     *   Z[c] = w_user @ Eu[map[c]] + w_cand @ Ec[c]
     * Eu [nu, Ku*D], Ec [nc, Kc*D], Z [nc, M*D], w_user [M, Ku], w_cand [M, Kc].
     * map int32 [nc], values in [0, nu). Must not build an [nc, Ku*D] copy
     * of Eu; scratch at nu rows is fine. */
    int (*lce)(bk_stream *s, const void *eu, int nu, const void *ec, int nc, const int32_t *map,
               const bk_weight *w_user, const bk_weight *w_cand, int ku, int kc, int m, int d,
               void *z, bk_err *err);

    /* IKBO attention core, queries of a candidate against its user's keys:
     * q [nc*tq, H*dh]; k, v packed jagged [offsets[nu], H*dh] with rows
     * ldkv >= H*dh elements apart (user u's events are rows [offsets[u],
     * offsets[u+1]); ldkv = 2*H*dh reads K and V from one [K | V] GEMM
     * output, v = k + H*dh); map int32 [nc], non-decreasing. For candidate
     * c, query row i, head h, the dh elements at
     *   o + c*go + i*H*dh + h*dh  =  softmax_j(q . k_j / sqrt(dh)) v_j over u's events;
     * a user with no events gives zeros. So candidate c's tq rows of H*dh
     * are one packed span [c*go, c*go + tq*H*dh) of o, and go (elements) is
     * the distance between consecutive candidates' spans: go = tq*H*dh is
     * o [nc*tq, H*dh] packed; a larger go writes each candidate's tokens in
     * place inside a wider row (the engine's stacked rows), and elements of
     * o outside every span are never written. go < tq*H*dh is an error
     * (err names go), returned before any work. */
    int (*attention)(bk_stream *s, const void *q, const void *k, const void *v, int ldkv,
                     const int64_t *offsets, int nu, const int32_t *map, int nc, int tq,
                     int heads, int dh, void *o, int64_t go, bk_err *err);

    /* Self-attention over packed jagged histories. For user u with events
     * [e0, e1) = [offsets[u], offsets[u+1]), n = e1 - e0, event i, head h,
     * keys j in [e0, e1) with j <= i when causal (all j otherwise):
     *   softmax: o[i, h] = sum_j softmax_j(q_i . k_j / sqrt(dh)) v_j
     *   silu:    o[i, h] = sum_j silu(q_i . k_j / sqrt(dh)) / n * v_j
     * Dots and sums in fp32; a user with no events has no rows. The target
     * part, when present, is computed as the attention op computes it. */
    int (*self_attention)(bk_stream *s, const bk_seq_att *a, bk_err *err);

    /* DIN attention at n rows (candidates). For row r with user u = map ?
     * map[r] : r and u's events j in [offsets[u], offsets[u+1]) of h [*, d]
     * and hp [*, h1]:
     *   pre_j = qp[r] + hp[j] + wd @ (q[r] * h[j])        (h1 values)
     *   s_j   = w2 . act(pre_j) + b2
     *   a     = softmax_j(s) (normalize) or s (no normalize)
     *   out[r] = sum_j a_j h[j]; a user with no events gives zeros.
     * q [n, d]; qp [n, h1]; wd [h1, d], w2 [1, h1], b2 [1, 1] weights;
     * out [n, d]. The engine folds the q and h columns of DIN's w1 into qp
     * (at n rows) and hp (once per event), so only the q * h term is
     * computed per (row, event) pair. Sums in fp32, increasing j. */
    int (*din_attention)(bk_stream *s, const void *q, const void *qp, const void *h,
                         const void *hp, const int64_t *offsets, const int32_t *map, int n,
                         int d, int h1, const bk_weight *wd, const bk_weight *w2,
                         const bk_weight *b2, enum bk_act act, int normalize, void *out,
                         bk_err *err);

    /* out[r, :] = a[r, :] + b[map ? map[r] : r, :], width elements, n rows.
     * out may alias a. */
    int (*add)(bk_stream *s, const void *a, const void *b, const int32_t *map, int n, int width,
               void *out, bk_err *err);

    /* Strided row copy: dst[r*ldd + j] = src[m(r)*lds + j] for j < width,
     * m(r) = map ? map[r] : r (an auto-planned stack reads its user parts
     * through the map). Used by stack and concat. */
    int (*copy_rows)(bk_stream *s, const void *src, int lds, const int32_t *map, int n, int width,
                     void *dst, int ldd, bk_err *err);

    /* Broadcast-mode gather (the baseline; never used in IKBO mode).
     * Dense (src_offsets NULL): dst[c, :] = src[map[c], :], width elements.
     * Jagged: rows [src_offsets[map[c]], src_offsets[map[c]+1]) of src are
     * copied to dst starting at row dst_offsets[c]. */
    int (*gather)(bk_stream *s, const void *src, const int64_t *src_offsets, const int32_t *map,
                  int nc, const int64_t *dst_offsets, int width, void *dst, bk_err *err);
};

/* The one device-string rule (server config, model.json serving, the
 * repository watcher, the backend; inline, so a config parser links
 * nothing else): "cpu" (*ordinal = -1), or "cuda:N"
 * with N decimal, no sign, no leading zero, 0..BK_MAX_CUDA_ORDINAL
 * (*ordinal = N). Returns 0, or -1 when s is neither. ordinal may be NULL. */
#define BK_MAX_CUDA_ORDINAL 999
static inline int bk_parse_device(const char *s, int *ordinal)
{
    if (ordinal) *ordinal = -1;
    if (!s) return -1;
    if (s[0] == 'c' && s[1] == 'p' && s[2] == 'u' && !s[3]) return 0;
    if (s[0] != 'c' || s[1] != 'u' || s[2] != 'd' || s[3] != 'a' || s[4] != ':') return -1;
    const char *p = s + 5;
    int v = 0, n = 0;
    for (; p[n]; n++) {
        if (p[n] < '0' || p[n] > '9' || n == 3) return -1;
        v = v * 10 + (p[n] - '0');
    }
    if (n == 0 || (p[0] == '0' && n > 1) || v > BK_MAX_CUDA_ORDINAL) return -1;
    if (ordinal) *ordinal = v;
    return 0;
}

/* embedding_bags' shared argument check: 1 <= n <= BK_MAX_BAGS, bags
 * non-NULL. 0, or -1 with err set. */
int bk_bags_check(const bk_bag *bags, int n, bk_err *err);
/* linear_grouped's arguments (both backends) for a weight [out, in]
 * (has_w: the weight is not NULL) and nbias bias values (-1: no bias):
 * counts >= 0, nbias = out, act NONE or RELU, strides that keep rows and
 * groups apart. 1: valid and uniform (one group, or gx =
 * g*ldx and gy = g*ldy: plain linear over groups*g rows), 0: valid, -1:
 * error set. */
int bk_grouped_check(int has_w, int in, int out, int nbias, int ldx, int64_t gx, int groups,
                     int g, enum bk_act act, int ldy, int64_t gy, bk_err *err);

/* mlp2's inputs up to which a backend keeps the hidden layer on chip (the
 * CUDA kernel's one k-step); the fold (engine/fold.c) makes mlp2 only for
 * linears this narrow. */
#define BK_MLP2_FUSED_MAX_IN 16

/* mlp2's arguments (both backends; bk_weight is each backend's own): has_w
 * (both weights not NULL), rows >= 0, W1 [hid, in], W2 [out, w2_cols] with
 * w2_cols = hid, nb1 b1 values (-1: no b1) = hid, act1 NONE or RELU, act2
 * an activation, strides that hold the widths; the addend's (a_in < 0: no
 * addend) weight [a_out, a_in] with a_out = out, its stride a_ldx >= a_in
 * and na_b bias values (-1: none) = out. 0, or -1 with err set. */
int bk_mlp2_check(int has_w, int rows, int in, int hid, int out, int w2_cols, int64_t nb1,
                  enum bk_act act1, enum bk_act act2, int ldx, int ldy, int a_in, int a_out,
                  int a_ldx, int64_t na_b, bk_err *err);

/* A row stride against the width it must hold (both backends): 0 when ld
 * >= width, else -1 with err "op: what ld is below of = width" (e.g.
 * attention's K/V rows, pool's output rows). */
int bk_bad_stride(const char *op, const char *what, int64_t ld, const char *of, int64_t width,
                  bk_err *err);

/* A host<->device copy's arguments (both backends): n elements of elem
 * bytes (counted in bytes when elem is 1) whose size fits size_t, and dst and src
 * non-NULL when n > 0. 0, or -1 with err "op: ...". */
int bk_bad_copy(const char *op, size_t n, size_t elem, const void *dst, const void *src,
                bk_err *err);

/* Backend constructors. device: "cpu", "cuda:N". NULL with err set when the
 * device is unknown or unavailable in this build. bk_backend_new also arms
 * the backend's fault injection from IKBO_FAULT (kernels/fault.h). */
bk_backend *bk_backend_new(const char *device, bk_err *err);
bk_backend *bk_cpu_new(bk_err *err);
bk_backend *bk_cuda_new(int ordinal, bk_err *err); /* kernels/cuda; absent with CUDA=0 */

#endif
