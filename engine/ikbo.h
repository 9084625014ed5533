/* ikbo.h - the ranking engine's public C API.
 *
 * Why this exists: the daemon, the offline scorer (ikbo-score) and anyone who
 * embeds the engine load a model and score host batches through these few
 * calls. A batch is already deduplicated: U unique user rows, C candidates,
 * and an int32 map c -> user row. The engine runs the user-only part of the
 * model at U and the candidate part at C with IKBO ops that read user rows
 * through the map (or, in broadcast mode, materializes user tensors at C).
 *
 * Ownership and thread-safety
 * - ikbo_model_load returns a model the caller frees with ikbo_model_free
 *   after every context made from it is freed. A model is immutable: its
 *   info and weights may be read from any number of threads.
 * - ikbo_ctx is an execution instance (workspace and, on GPU, a stream).
 *   One thread at a time per context; make one per worker thread.
 * - Errors are returned (-1 / NULL) with the message in *err, never printed.
 */
#ifndef IKBO_H
#define IKBO_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "../kernels/backend.h"

typedef bk_err ikbo_err;
typedef struct ikbo_model ikbo_model;
typedef struct ikbo_ctx ikbo_ctx;

enum ikbo_mode { IKBO_MODE_IKBO = 0, IKBO_MODE_BROADCAST = 1 };

/* The modes' names, as the server config and model.json's serving block
 * spell them: "ikbo", "broadcast". ikbo_mode_parse returns 0, or -1 when s
 * is neither (out untouched); out may be NULL. Inline: a config parser
 * links nothing else. */
static inline const char *ikbo_mode_name(enum ikbo_mode m)
{
    return m == IKBO_MODE_BROADCAST ? "broadcast" : "ikbo";
}
static inline int ikbo_mode_parse(const char *s, enum ikbo_mode *out)
{
    enum ikbo_mode m;
    if (s && strcmp(s, "ikbo") == 0)
        m = IKBO_MODE_IKBO;
    else if (s && strcmp(s, "broadcast") == 0)
        m = IKBO_MODE_BROADCAST;
    else
        return -1;
    if (out) *out = m;
    return 0;
}

typedef struct ikbo_load_opts {
    const char *device; /* "cpu" (default when NULL), "cuda:N" */
    enum ikbo_mode mode;
    /* Batch graphs (engine/batch_graph.h): how many batch shapes each
     * context keeps a recorded graph for; 0 = off. Ignored by a backend
     * without graphs (the CPU). With graphs on, a batch's candidates are
     * padded to their bucket (at most 1/8 more rows). */
    int graphs;
    /* 1: run lce -> flatten -> linear chains as written; 0 (default): fold
     * each into one linear over the candidate tokens where that takes FLOPs
     * off (engine/fold.h; the plan report marks them "folded"). */
    int no_fold;
    /* 1: every layer on the context's one stream; 0 (default): in IKBO
     * mode the user side's layers on a second stream (a lane), beside the
     * candidate side on a GPU; on the CPU, in call order as before
     * (engine/lane.h). */
    int no_lane;
} ikbo_load_opts;

/* What a model takes and returns. Pointers stay valid for the model's life. */
typedef struct ikbo_model_info {
    const char *dir;
    int user_dense, cand_dense;
    const char *const *user_sparse; /* feature names, the model's order */
    int n_user_sparse;
    const char *const *cand_sparse;
    int n_cand_sparse;
    int has_history, hist_max_len, hist_actions;
    const char *const *tasks;
    int n_tasks;
    const float *score_weights;
    enum ikbo_mode mode;
    const char *device;
} ikbo_model_info;

/* A jagged list of int64 ids per row: row r owns ids[offsets[r] ..
 * offsets[r+1]); offsets has rows+1 entries, offsets[0] = 0. */
typedef struct ikbo_jagged {
    const int64_t *ids;
    const int64_t *offsets;
} ikbo_jagged;

/* A deduplicated host batch. Arrays are read during ikbo_score only. */
typedef struct ikbo_batch {
    int n_users; /* U >= 1 */
    int n_cands; /* C >= 1 */
    const float *user_dense;       /* [U, user_dense] (NULL if user_dense == 0) */
    const ikbo_jagged *user_sparse; /* [n_user_sparse], model order */
    /* History, oldest first: user u owns events [hist.offsets[u],
     * hist.offsets[u+1]). The engine keeps the most recent hist_max_len.
     * hist_actions: one per event in [0, hist_actions), or NULL = all 0. */
    ikbo_jagged hist;
    const int32_t *hist_actions;
    const float *cand_dense;        /* [C, cand_dense] */
    const ikbo_jagged *cand_sparse; /* [n_cand_sparse] */
    const int32_t *map;             /* [C], non-decreasing, in [0, U) */
} ikbo_batch;

/* Per-context byte accounting, from the backend (see bk_stats). */
typedef bk_stats ikbo_stats;

/* Serving settings: one type for a model's own (model.json "serving", the
 * model's config.json) and the server's (config.json "batching", "device",
 * "mode"). -1 / "" = unset. The queue limits are the server's only (a model
 * file cannot set them). engine/serving.h has the key table (names, ranges,
 * defaults); the server decides the precedence. */
typedef struct ikbo_serving {
    long long max_batch_candidates;
    long long max_batch_users;
    long long max_queue_delay_us;
    long long instances;
    long long max_queue_candidates;
    long long max_queue_requests;
    long long graphs; /* batch graphs per instance (ikbo_load_opts.graphs) */
    long long fold;   /* 0: ikbo_load_opts.no_fold */
    long long user_lane; /* 0: ikbo_load_opts.no_lane */
    long long idle_spin_us; /* how long an idle instance or completer polls before sleeping */
    long long gpu_spin_us;  /* how long an instance polls for its batch's end (ikbo_ctx_set_gpu_spin) */
    long long batch_timeout_ms; /* a batch computing longer means a hung device (server only) */
    char mode[16];   /* "", "ikbo", "broadcast" */
    char device[32]; /* "", "cpu", "cuda:N" */
} ikbo_serving;

/* Reads and validates <dir>/model.json only (no weights) and returns its
 * serving block: lets a server pick the device and mode before loading. */
int ikbo_model_peek_serving(const char *dir, ikbo_serving *out, ikbo_err *err);

ikbo_model *ikbo_model_load(const char *dir, const ikbo_load_opts *opts, ikbo_err *err);
void ikbo_model_free(ikbo_model *m);
const ikbo_model_info *ikbo_model_get_info(const ikbo_model *m);

/* The plan report (engine/plan.h): what the planner made of each model.json
 * layer, FLOPs and bytes per candidate at `ratio` candidates per user, as
 * text (json 0) or JSON (json 1). Malloc'd; NULL on out of memory. */
char *ikbo_model_plan(const ikbo_model *m, int json, double ratio);
/* The same for a model directory, loaded without a backend (build/ikbo-plan).
 * Returns 0 and *out, or -1 with err naming the file, layer or tensor. */
int ikbo_plan_dir(const char *dir, int json, double ratio, char **out, ikbo_err *err);
/* A model's plan in short: "auto"/"manual", layers rewritten, gathers,
 * per-candidate FLOPs before and after at `ratio`. */
typedef struct ikbo_plan_summary {
    int is_auto, layers, rewritten, gathers;
    double flops_before, flops_after, bytes_before, bytes_after, gather_bytes;
} ikbo_plan_summary;
void ikbo_model_plan_summary(const ikbo_model *m, double ratio, ikbo_plan_summary *out);

ikbo_ctx *ikbo_ctx_new(ikbo_model *m, ikbo_err *err);
void ikbo_ctx_free(ikbo_ctx *ctx);
/* How the thread in ikbo_score waits for the device's end of a batch
 * (backend.h stream_set_spin): spin_us < 0, the runtime's own wait (polls
 * until done; a new context's setting); >= 0, polls at most spin_us, then
 * sleeps until the device signals. No effect on the CPU backend. Not while
 * another thread scores on ctx. */
int ikbo_ctx_set_gpu_spin(ikbo_ctx *ctx, long long spin_us, ikbo_err *err);

/* Scores a batch. task_scores [C, n_tasks] = sigmoid(logits); scores [C] =
 * sum_t score_weights[t] * task_scores[c, t]. Either output may be NULL.
 * Rows are in the batch's candidate order. Returns 0, or -1 with err set
 * (bad batch: message names the field; device failure). */
int ikbo_score(ikbo_ctx *ctx, const ikbo_batch *b, float *task_scores, float *scores,
               ikbo_err *err);

/* After a failed ikbo_score: 1 with *why when the failure left the context's
 * device unusable for the rest of the process (backend.h lost: a CUDA
 * kernel fault such as an illegal address, or IKBO_FAULT's lost), so no
 * batch on it can succeed again until the process restarts; 0 when the
 * failure was this batch's alone. Does not wait for the device; any thread. */
int ikbo_ctx_device_lost(const ikbo_ctx *ctx, ikbo_err *why);

/* Byte accounting of the model's backend (live and peak bytes by tag). */
void ikbo_get_stats(const ikbo_model *m, ikbo_stats *out);

/* Workspace bytes the last ikbo_score on this context took, by bk_tag
 * (user tensors, candidate tensors, broadcast copies, the batch inputs: index
 * arrays and dense features). In IKBO
 * mode bytes[BK_TAG_BROADCAST] is 0: no user tensor exists at C rows. */
void ikbo_ctx_last_bytes(const ikbo_ctx *ctx, size_t bytes[BK_TAG_COUNT]);

/* Bytes of user tensors the last ikbo_score on this context did NOT copy out
 * to candidate rows, i.e. what broadcast mode would have materialized for the
 * same batch (user operands of lce, add, mul and dot_interaction at C rows; for target_attention
 * the history and its K/V per candidate). 0 in broadcast mode. */
uint64_t ikbo_ctx_last_avoided_bytes(const ikbo_ctx *ctx);

/* What a context's batch graphs did (all 0 with graphs off). */
typedef struct ikbo_graph_stats {
    uint64_t replays;   /* batches computed by replaying a graph */
    uint64_t captures;  /* batches recorded into a new graph */
    uint64_t fallbacks; /* recordings or replays that failed; the batch
                           was then computed without a graph */
    uint64_t evictions; /* batch shapes dropped for a newer one */
    int held;           /* graphs held now */
    char last_error[200]; /* why the last fallback happened ("" if none) */
} ikbo_graph_stats;
void ikbo_ctx_graph_stats(const ikbo_ctx *ctx, ikbo_graph_stats *out);

/* What the last ikbo_score on this context did with batch graphs. */
enum ikbo_graph_use {
    IKBO_GRAPH_NONE = 0,     /* graphs off, or the key's first batch: run as usual */
    IKBO_GRAPH_REPLAYED = 1, /* computed by replaying the key's graph */
    IKBO_GRAPH_RECORDED = 2, /* recorded into a new graph (and computed by it) */
    IKBO_GRAPH_FELL_BACK = 3, /* a recording or replay failed; run as usual */
    IKBO_GRAPH_USES = 4
};
extern const char *const ikbo_graph_use_names[IKBO_GRAPH_USES]; /* "none", "replayed", ... */
enum ikbo_graph_use ikbo_ctx_last_graph(const ikbo_ctx *ctx);

const char *ikbo_version(void);

#endif
