/* model.h - a loaded, validated and planned ikbo-model/1 (engine-internal).
 *
 * Why this exists: the loader (model_load.c, safetensors.c) turns a model
 * directory into this plain description, with every reference resolved, every
 * tensor's batch domain and shape inferred, and every weight checked and held
 * as fp32 on the host. The executor (engine.c) only walks it. Anything wrong
 * is refused here, at load, never discovered during a request.
 *
 * Ownership: model_def_load returns a model_def the caller frees with
 * model_def_free. Immutable once the engine has uploaded the weights to its
 * backend (engine.c frees each md_weight.data then and sets it to NULL);
 * safe to read from any thread after ikbo_model_load returns.
 */
#ifndef IKBO_MODEL_H
#define IKBO_MODEL_H

#include <stdint.h>

#include "../kernels/backend.h"
#include "ikbo.h"

enum md_op {
    MD_EMBEDDING_BAG,
    MD_HISTORY_EMBEDDING,
    MD_MEAN_POOL,
    MD_LINEAR,
    MD_RESHAPE,
    MD_STACK,
    MD_FLATTEN,
    MD_TARGET_ATTENTION,
    MD_LCE,
    MD_ADD,
    MD_ACTIVATION,
    MD_LAYER_NORM,
    MD_CONCAT,
    MD_MUL,
    MD_TOKEN_LINEAR,
    MD_DOT_INTERACTION,
    MD_CROSS,
    MD_MIXTURE,
    MD_POOL,
    MD_SELF_ATTENTION,
    MD_DIN_ATTENTION,
    MD_BROADCAST, /* internal: only the auto planner writes it (a counted gather) */
    MD_MLP2,      /* internal: only the fold writes it (a linear's output read through a fold) */
    MD_OP_COUNT /* keep last: engine/ops/ops.c's table is checked against it */
};

enum md_domain { MD_USER = 0, MD_CAND = 1 };

/* Shape after the leading (batch) dim. */
enum md_kind {
    MD_VEC = 0,    /* [dim]                                   */
    MD_TOKENS = 1, /* [tokens, dim]                           */
    MD_JAGGED = 2, /* [L_u, dim], packed rows, one per event  */
};

/* Where a layer input comes from. */
enum md_src {
    MD_SRC_LAYER = 0,        /* index = layer index (always < this layer's) */
    MD_SRC_USER_DENSE = 1,   /* [user_dense] vec, user domain               */
    MD_SRC_CAND_DENSE = 2,   /* [cand_dense] vec, candidate domain          */
    MD_SRC_USER_SPARSE = 3,  /* index = user sparse feature index           */
    MD_SRC_CAND_SPARSE = 4,  /* index = candidate sparse feature index      */
    MD_SRC_USER_HISTORY = 5, /* user.history                                */
};

typedef struct md_ref {
    enum md_src src;
    int index;
} md_ref;

/* A weight as fp32 host data, [rows, cols] row-major (a 1-D tensor has rows=1). */
typedef struct md_weight {
    char *name; /* safetensors name, e.g. "top1.weight" */
    int rows, cols;
    int one_d; /* the file holds it as 1-D [cols] (a bias, a norm's weight) */
    float *data;
} md_weight;

typedef struct md_table {
    char *name;
    int rows, dim;
    md_weight w; /* "tables.<name>" [rows, dim] */
} md_table;

#define MD_MAX_WEIGHTS 6

typedef struct md_layer {
    char *name;
    enum md_op op;
    md_ref *in; /* n_in inputs, in the op's order: target_attention [query,
                   history]; lce [user, candidate]; add, mul [a, b]; cross
                   [x0, input]; mixture [experts..., gate] */
    int n_in;

    /* Output, inferred by the planner. */
    enum md_domain domain;
    enum md_kind kind;
    int tokens; /* MD_TOKENS: K; MD_VEC and MD_JAGGED: 1 */
    int dim;    /* MD_VEC: F; MD_TOKENS, MD_JAGGED: D */

    /* Op parameters (those that apply). */
    int table;            /* embedding_bag, history_embedding: index into tables */
    enum bk_pool pooling; /* embedding_bag, pool */
    enum bk_act act;      /* linear, activation; mlp2: the hidden layer's */
    enum bk_act act2;     /* mlp2: the output's */
    int heads, head_dim;  /* target_attention, self_attention */
    int causal;           /* self_attention */
    enum bk_att_kind att_kind; /* self_attention */
    int shared;           /* target_attention: the self_attention layer it shares, -1 none */
    int no_wo;            /* target_attention: 1 when the lce fold composed wo into its reader's
                             weight (engine/fold.h): the layer writes its heads' outputs */
    int hidden;           /* din_attention: H1 */
    int normalize;        /* din_attention: softmax over events */
    float eps;            /* layer_norm */
    int self;             /* dot_interaction: pairs i <= j */
    int rank;             /* cross: 0 = full rank */
    int origin;           /* auto planning: the model.json layer it comes from (plan.e index) */

    /* Weights, op-specific order:
     *   linear: weight [out, in], bias [1, out]
     *   history_embedding: action [actions, dim], position [max_len, dim]
     *   target_attention: wq, wk, wv [H*dh, D], wo [D, H*dh] (no wo with no_wo)
     *   lce: w_user [M, Ku], w_cand [M, Kc]
     *   see engine/ops/ for the others (op_weight order) */
    md_weight w[MD_MAX_WEIGHTS];
    int n_w;
} md_layer;

/* Width of a layer output row in elements (jagged: per event row). */
static inline int md_layer_width(const md_layer *l)
{
    return l->kind == MD_TOKENS ? l->tokens * l->dim : l->dim;
}

/* How a model.json layer was planned (engine/auto_plan.c, plan.c). */
enum md_rewrite {
    MD_RW_USER = 0,     /* all inputs user: runs at U                                  */
    MD_RW_CAND,         /* candidate inputs only: runs at C as written                 */
    MD_RW_IKBO,         /* a mixing op: reads user rows through the map                */
    MD_RW_TYPE1,        /* decomposed over a mixed stack/concat: user part at U        */
    MD_RW_SPLICED,      /* a mixed stack/concat only rewrites read: never built        */
    MD_RW_MAP_READ,     /* a mixed stack/concat built at C, user parts read via map    */
    MD_RW_GATHER,       /* needs a user operand at C rows: an explicit broadcast       */
    MD_RW_FOLDED,       /* lce -> flatten -> linear folded into one linear (fold.h)    */
    MD_RW_COUNT
};

/* The report of one model.json layer. Costs are per user row (u) and per
 * candidate row (c), [0] as written (broadcast form: every user operand of
 * a candidate layer copied to C rows first) and [1] as planned. FLOPs are
 * the dominant terms (multiply-add = 2); bytes are the fp32 activations a
 * layer writes (a gather's copy included); jagged layers count max_len
 * events per user. */
typedef struct md_plan_entry {
    char *name;
    enum md_op op;
    enum md_domain domain;
    enum md_rewrite rw;
    char note[192];  /* the rewrite applied, or why it broadcasts */
    char split[160]; /* the weight split ("weight [64, 40] -> user cols 24, candidate 16") */
    double flops_u[2], flops_c[2], bytes_u[2], bytes_c[2];
} md_plan_entry;

typedef struct md_plan {
    int is_auto; /* "planning": "auto" */
    md_plan_entry *e;
    int n; /* == the number of model.json layers */
} md_plan;

typedef struct model_def {
    char *dir;         /* version directory as given */
    char *name;        /* optional "name", may be NULL */
    char *description; /* optional, may be NULL */

    int user_dense, cand_dense; /* 0 = not declared */
    char **user_sparse;         /* declared order */
    int n_user_sparse;
    char **cand_sparse;
    int n_cand_sparse;
    int has_history;
    int hist_max_len;
    int hist_actions;

    md_table *tables;
    int n_tables;
    md_layer *layers; /* in file order (inputs always defined earlier) */
    int n_layers;

    int logits_layer; /* candidate-domain MD_VEC of width n_tasks */
    char **tasks;
    int n_tasks;
    float *score_weights; /* n_tasks, default 1.0 */

    ikbo_serving serving; /* "serving" (engine/serving.h); unset = -1 / "" */

    md_plan plan; /* the plan report (engine/plan.h): one entry per model.json layer */
} model_def;

/* A reference's domain, row width (elements; jagged: per event) and tokens
 * (K of a tokens value, else 1). Sparse and history inputs have width 0. */
static inline enum md_domain md_ref_domain(const model_def *m, md_ref r)
{
    switch (r.src) {
    case MD_SRC_LAYER: return m->layers[r.index].domain;
    case MD_SRC_CAND_DENSE:
    case MD_SRC_CAND_SPARSE: return MD_CAND;
    default: return MD_USER;
    }
}

static inline int md_ref_width(const model_def *m, md_ref r)
{
    switch (r.src) {
    case MD_SRC_LAYER: return md_layer_width(&m->layers[r.index]);
    case MD_SRC_USER_DENSE: return m->user_dense;
    case MD_SRC_CAND_DENSE: return m->cand_dense;
    default: return 0;
    }
}

static inline int md_ref_tokens(const model_def *m, md_ref r)
{
    return r.src == MD_SRC_LAYER ? m->layers[r.index].tokens : 1;
}

/* Loads <dir>/model.json and <dir>/weights.safetensors. On failure returns
 * -1, *out untouched, and err names the file, the layer or tensor, and the
 * problem. */
int model_def_load(const char *dir, model_def **out, bk_err *err);

/* The same with flags: MD_LOAD_NO_FOLD keeps lce -> flatten -> linear
 * chains as written (engine/fold.h; model_def_load folds them). */
#define MD_LOAD_NO_FOLD 1u
int model_def_load_opts(const char *dir, unsigned flags, model_def **out, bk_err *err);

/* Same, from memory: for tests and fuzzing. dir is only used in messages. */
int model_def_parse(const char *dir, const char *json, size_t json_len, const uint8_t *st,
                    size_t st_len, model_def **out, bk_err *err);

/* Plans model.json alone (no weights file): everything is filled and checked
 * except weight data - each md_weight has its name and shape, data NULL.
 * For tests and tools (e.g. listing the tensors an exporter must write). */
int model_def_plan(const char *dir, const char *json, size_t json_len, model_def **out,
                   bk_err *err);

/* The same, but an auto-planned model is returned in its broadcast form, as
 * written (not rewritten, no plan report): the layers and weights its file
 * holds. A manual model is what model_def_plan returns. */
int model_def_plan_as_written(const char *dir, const char *json, size_t json_len,
                              model_def **out, bk_err *err);

void model_def_free(model_def *m);

#endif
