/* op.h - the op registry: every op of ikbo-model/1 defined once (engine-internal).
 *
 * Why this exists: an op used to be spread over an enum, a name array, a key
 * list, a 330-line planning switch, an executor switch and the byte
 * accounting. Now each op is one md_op_def in its family's file under
 * engine/ops/ - name, allowed keys, planning (inputs, shape, domain, weights)
 * and run (backend calls, workspace, avoided bytes) - and engine/ops/ops.c
 * lists them in enum order. The loader (model_load.c) and the executor
 * (engine.c) only read the table. engine/README.md has the recipe for adding
 * an op.
 *
 * The two halves of an op see the loader and the executor through small
 * APIs declared here: op_plan (implemented in model_load.c) and op_run
 * (implemented in engine.c).
 *
 * Thread-safety: the table is const. An op_plan lives during one load, an
 * op_run during one layer of one forward pass, on the calling thread.
 */
#ifndef IKBO_OP_H
#define IKBO_OP_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "ikbo.h"
#include "model.h"

/* A shape at plan time: domain, kind, tokens (1 unless MD_TOKENS), dim. */
typedef struct md_shape {
    enum md_domain dom;
    enum md_kind kind;
    int tokens;
    int dim;
} md_shape;

/* ------------------------------------------------------------ planning */

typedef struct ld ld; /* the loader's state (model_load.c) */

typedef struct op_plan {
    ld *L;
    model_def *m;
    md_layer *l; /* l->name is set; plan fills the rest */
    int i;       /* layer index */
    const json_t *o;
    const char *path; /* "layers[3]" */
    const char *pre;  /* "layer 'top1': " */
} op_plan;

/* Which kinds of reference an input accepts. */
enum { OP_ACC_VALUE = 1, OP_ACC_SPARSE = 2, OP_ACC_HISTORY = 4 };

/* Every function returns 0, or -1 after writing one load error that starts
 * with the file and p->pre. */
int op_fail(const op_plan *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int op_str(const op_plan *p, const char *key, int required, const char **out);
int op_int(const op_plan *p, const char *key, int required, long long dflt, long long lo,
           long long hi, long long *out);
/* A positive finite number; dflt when absent. */
int op_pos_num(const op_plan *p, const char *key, double dflt, double *out);
int op_bool(const op_plan *p, const char *key, int dflt, int *out);
/* One of names[0..n) (string); *out = its index, dflt when absent (dflt < 0:
 * required). The error lists the names. */
int op_enum(const op_plan *p, const char *key, const char *const *names, int n, int dflt,
            int *out);
/* An activation name ("none" only when allow_none) -> bk_act; dflt when absent. */
int op_act(const op_plan *p, const char *key, int allow_none, enum bk_act dflt, enum bk_act *out);
/* Appends the input named by string key to l->in; role names it in errors
 * ("input", "query"). s gets its shape. */
int op_input(const op_plan *p, const char *key, const char *role, int accept, md_shape *s);
/* The earlier layer named by string key (optional): *index, or -1 when absent. */
int op_layer(const op_plan *p, const char *key, int *index);
/* Appends the inputs listed by array key (value references); *s gets their
 * shapes (malloc'd, caller frees), *n their count (>= 1). */
int op_inputs(const op_plan *p, const char *key, md_shape **s, int *n);
/* Two operands, as "inputs": [a, b] or as "a" and "b". s[0], s[1]. */
int op_operands(const op_plan *p, md_shape s[2]);
/* The "table" key -> l->table. */
int op_table(const op_plan *p);
/* Declares weight "<layer>.<param>" [rows, cols] (a 1-D tensor: rows = 1). */
int op_weight(const op_plan *p, const char *param, long long rows, long long cols);
/* Declares a 1-D weight "<layer>.<param>" [n] (held as [1, n]). */
int op_weight1(const op_plan *p, const char *param, long long n);
/* Sets the layer's output. Fails when tokens * dim exceeds an int. */
int op_output(const op_plan *p, enum md_domain dom, enum md_kind kind, long long tokens,
              long long dim);
/* Refuses a user/candidate mix among s[0..n) (every op but the mixing ones);
 * returns the common domain in *dom. In an auto-planned model's first pass
 * (broadcast form) any mix is allowed and means candidate. */
int op_one_domain(const op_plan *p, const md_shape *s, int n, enum md_domain *dom);
/* How the layer is being planned: as written (manual), an auto model's
 * broadcast form (first pass), or the planner's rewrite (second pass: the
 * manual rules, plus stack/concat reading user parts through the map and the
 * internal broadcast op). */
enum op_pass { OP_PASS_MANUAL = 0, OP_PASS_BROADCAST_FORM, OP_PASS_REWRITTEN };
enum op_pass op_planning(const op_plan *p);
/* "user vec [8]", "candidate tokens [4, 16]", "user jagged [L, 32]". */
const char *op_shape_str(char *buf, size_t n, md_shape s);
/* The reference text of input k as written in model.json (quoted for messages). */
const char *op_in_name(const op_plan *p, int k, char *buf, size_t n);

/* ------------------------------------------------------------- running */

typedef struct ikbo_ctx ikbo_ctx;

/* A layer output during a batch. */
typedef struct value {
    void *p;
    int rows;               /* U, C, or event rows for jagged */
    const int64_t *offsets; /* jagged: backend offsets [U+1]  */
    int ld;                 /* row stride in elements when the value's rows sit
                               inside a wider gatherer's (a stack placed in the
                               stack that reads it); 0: its own width */
} value;

/* What a batch's forward pass shares (engine.c fills it). */
typedef struct fwd {
    const ikbo_batch *b;
    int C; /* candidate rows: b->n_cands, or more when padded (batch_graph.h) */
    const int32_t *map;      /* backend map [C]                    */
    const int32_t *identity; /* backend 0..C-1 (broadcast mode)    */
    const void *user_dense, *cand_dense;
    const int64_t *h_ids, *h_off;
    const int32_t *h_acts;
    int64_t n_events;
    const int64_t *bc_off; /* broadcast history offsets [C+1]     */
    int64_t bc_events;
} fwd;

typedef struct op_run {
    ikbo_ctx *c;
    const fwd *f;
    const model_def *d;
    const md_layer *l;
    int li;
    bk_backend *be;
    bk_stream *s;
    bk_weight *const *w; /* the layer's weights, in op_weight order */
    int U, C;
    int rows;  /* U or C: the layer's domain */
    int bc;    /* broadcast mode */
    int dry;   /* dry pass: only sizes are summed; buffers are NULL */
    value *out;
    bk_err *err;
} op_run;

/* A backend call: skipped in the dry pass, -1 returned on failure. */
#define OP_TRY(r, x)                                                          \
    do {                                                                      \
        if (!(r)->dry && (x) != 0) return -1;                                 \
    } while (0)

value op_in(const op_run *r, int k);
enum md_domain op_in_domain(const op_run *r, int k);
int op_in_width(const op_run *r, int k); /* elements per row (jagged: per event) */
int op_in_tokens(const op_run *r, int k); /* K of a tokens input, else 1 */
/* Workspace of rows x width activations under tag (NULL in the dry pass). */
void *op_take(op_run *r, enum bk_tag tag, size_t rows, size_t width);
/* The layer's own output buffer, rows x width at its domain's tag. */
void *op_out(op_run *r, size_t rows, size_t width);
/* An output with input k's rows (and, jagged, its offsets) and the layer's
 * row width; sets r->out->rows and r->out->offsets. */
void *op_out_like(op_run *r, int k);
/* Where a layer that may write in place writes: its own buffer (*ld =
 * width) or its columns of the stack/concat that reads it (*ld = that
 * row width; the outermost one's when that stack is itself placed). */
void *op_out_placed(op_run *r, int rows, int width, int *ld);
/* Broadcast mode: a dense user tensor copied to C rows (non-NULL in the dry
 * pass too; NULL on failure). */
const void *op_broadcast(op_run *r, const void *src, int width);
/* IKBO mode: records rows x width activations broadcast mode would have copied. */
void op_avoided(op_run *r, size_t rows, size_t width);
/* Input k (dense rows of width) as the layer reads it into *p: in a
 * candidate-domain layer a user input through *map (IKBO mode; recorded as
 * avoided) or broadcast (broadcast mode), anything else as it is (*map
 * NULL). 0, or -1 when the broadcast failed. */
int op_cand_operand(op_run *r, int k, int width, const void **p, const int32_t **map);
/* A gathering op's (stack, concat) rows for this pass, *ld their stride:
 * its own buffer, or its columns of the stack it is placed in. In-place
 * producers already wrote their columns. */
void *op_gather_base(op_run *r, int *ld);
/* True when input k of a gathering layer was written in place. */
int op_in_placed(const op_run *r, int k);
/* Input k of another layer li (one that runs later: a fused launch). */
value op_in_of(const op_run *r, int li, int k);
/* Layer li's weights, in its op_weight order. */
bk_weight *const *op_layer_w(const op_run *r, int li);
/* Layer li's OP_AUX slots: buffers it took in this pass that a later layer
 * reads (a self_attention's K and V); NULL in the dry pass. */
#define OP_AUX 4
void **op_aux(const op_run *r, int li);
/* For a self_attention: the target_attention computed in its launch; for
 * a target_attention: the self_attention that computed it; -1 none
 * (engine.c's plan_fuse). */
int op_fuse(const op_run *r);
/* The user lane (engine/lane.h) for an OP_LANE_SPLIT layer's user-only
 * work: launches there may read only request inputs and user-domain layer
 * outputs, and their results only after op_join. r->s when the layer does
 * not split (lanes off, the CPU, the dry pass). */
bk_stream *op_lane(op_run *r);
/* r->s waits for every launch issued on the lane so far (none pending: no
 * call). -1 on failure (r->err set). */
int op_join(op_run *r);
/* embedding_bag: queues the layer's bag; the engine runs the OP_QUEUED
 * layers that read only request inputs before all other layers and
 * launches their bags with one be->embedding_bags call (others: before
 * the next other layer runs). r->out->p must already be set. -1 on
 * failure. */
int op_queue_bag(op_run *r, const bk_bag *bag);
/* The backend weight of table t. */
const bk_weight *op_table_w(const op_run *r, int t);
/* Backend ids/offsets of an embedding_bag's sparse input for this batch. */
void op_bag(const op_run *r, const int64_t **ids, const int64_t **off);

/* --------------------------------------------------------------- table */

enum {
    OP_VIEW = 1,      /* same bytes as input 0, new shape (reshape, flatten)     */
    OP_PLACED = 2,    /* a vector output may be written into a gathering reader  */
    OP_GATHERS = 4,   /* writes its inputs side by side (stack, concat)          */
    OP_INTERNAL = 8,  /* written by the auto planner only, not accepted in model.json */
    OP_QUEUED = 16,   /* run queues its backend call (op_queue_bag): a run of such
                         layers is launched as one, before the next other layer */
    OP_PLACED_TOKENS = 32, /* a tokens output may be written into a gathering reader
                              (its rows of Tq*D inside the reader's wider rows) */
    OP_READS_PITCHED = 64, /* input 0 may be pitched (value.ld): a stack read by it may
                              sit inside the stack that also reads it */
    OP_LANE_SPLIT = 128, /* run issues its user-only work on op_lane and calls op_join
                            before the stream reads that work (engine/lane.h) */
};

/* FLOPs of one layer per user row (u) and per candidate row (c) as the
 * engine runs it in IKBO mode: a mixing op's user-only part (lce's user
 * term, attention's K/V) is in u. Dominant terms, multiply-add = 2; jagged
 * inputs count max_len events per user. */
typedef struct md_cost {
    double u, c;
} md_cost;

/* Rows one output row stands for in a cost: max_len events for a jagged
 * layer, else 1. */
static inline double md_events(const model_def *m, const md_layer *l)
{
    return l->kind == MD_JAGGED ? m->hist_max_len : 1;
}

typedef struct md_op_def {
    const char *name;
    const char *const *keys; /* allowed keys, "name" and "op" included, NULL-ended */
    int flags;
    int (*plan)(op_plan *p);
    int (*run)(op_run *r);
    /* Optional, at load before the weights go to the backend: rewrites
     * the layer's host weights (a split of DIN's w1). */
    int (*prepare)(md_layer *l, bk_err *err);
    /* FLOPs per row (see md_cost); every op has one. */
    md_cost (*cost)(const model_def *m, const md_layer *l);
} md_op_def;

extern const md_op_def *const md_ops[MD_OP_COUNT];

/* Index of op `name`, or -1 (internal ops included). */
int md_op_find(const char *name);
/* "embedding_bag, history_embedding, ..." in table order, internal ops left out. */
const char *md_op_list(void);

#endif
