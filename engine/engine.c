/* engine.c - runs a planned model on a backend: the forward pass.
 *
 * Why this exists: model_load.c produced a plan in which every layer has a
 * batch domain; this file executes it for one deduplicated batch. User-domain
 * layers run at U rows, candidate-domain layers at C rows, and the three
 * mixing ops (lce, target_attention, add) read user rows through map[c].
 * In broadcast mode (the baseline) the user operand of each mixing op is first
 * gathered to C rows and the same op runs with an identity map.
 *
 * Workspace: each context owns one arena per bk_tag. A batch is walked twice:
 * a dry pass that only sums the bytes each tag needs, then the real pass that
 * bump-allocates from arenas grown to fit. The arenas persist, so steady
 * traffic allocates nothing, and the per-tag totals are the byte accounting
 * that shows no user tensor ever reaches C rows in IKBO mode.
 *
 * Per-batch copies: every index array of a batch (map, history, all
 * embedding bags' ids and offsets, broadcast offsets) is written into a host
 * mirror of the index arena, with the two dense inputs converted to the
 * activation dtype beside them (be->host_from_f32), and uploaded with one
 * copy before the first op; the logits come back with the one wait of the
 * batch (download_f32). On the GPU each copy has a fixed cost, and an upload
 * between kernels used to be one of ~25.
 *
 * Stacks in place: a linear or embedding_bag whose only reader is a stack
 * (directly or through reshape/flatten views) writes its rows straight into
 * its columns of the stack's buffer (row stride = the stack's width), and
 * the stack copies only its other inputs. In the bench model that removes
 * the copy of 85% of E_cand, the largest copy of a batch. A target_attention
 * read only by a stack writes its Tq output tokens there too (its output
 * projection as a grouped linear, be->linear_grouped): another 7% of E_cand;
 * and pool/mean_pool write their vector the same way (E_user's history mean).
 * A stack read by another gatherer lives in it too (its parts land in the
 * outer rows): read directly, or read only through views (the fold's user
 * term concatenates its stack's flatten with a linear's output, which
 * then is no copy at all).
 *
 * Embedding bags: embedding_bag layers (OP_QUEUED) queue their bags and
 * run as one be->embedding_bags call. Those that read only request inputs
 * (every embedding_bag in a model file) run first, before any other layer,
 * so all of a batch's bags, user and candidate, are one launch (the bench
 * model's were two on the H200: 14.0 us at 16 x 70, 13.3 at 1 x 70; one:
 * 12.7 and 9.5); a queued layer reading another layer would flush before
 * the next other layer, in model order.
 *
 * Batch graphs (batch_graph.h, with ikbo_load_opts.graphs on a backend that
 * records them): the dry pass also builds the batch's key; score_graphed
 * replays the key's graph (only the inputs are staged) or records it.
 *
 * The user lane (lane.h; IKBO mode on a backend with be->lane, unless
 * ikbo_load_opts.no_lane): the user side's layers are issued on the
 * context's lane, which waits for the batch's one upload first; a layer
 * that reads lane work makes the stream wait for the lane (or, an
 * OP_LANE_SPLIT op, does so itself after putting its own user-only work
 * there); the stream waits for the lane again before the logits come back.
 * So the user side runs beside the candidate side, and a graph recorded on
 * the stream holds both. A batch that failed with lane work pending is
 * waited for before the next batch's upload reuses the arenas.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batch_graph.h"
#include "lane.h"
#include "ikbo.h"
#include "model.h"
#include "op.h"
#include "plan.h"

#define ARENA_ALIGN 256

struct ikbo_model {
    model_def *def;
    bk_backend *be;
    enum ikbo_mode mode;
    int graphs; /* batch graphs per context; 0 = off */
    char device[32];
    bk_weight **table_w; /* [n_tables] */
    bk_weight *(*layer_w)[MD_MAX_WEIGHTS]; /* [n_layers][4] */
    /* [n_layers]: the stack a layer writes its output into (its only
     * reader, or for a stack, the one that is not an OP_READS_PITCHED
     * input), -1 = its own buffer; and its first column there. */
    int *into, *into_col;
    /* [n_layers]: a self_attention's fused target_attention, and a
     * target_attention's self_attention that computed it; -1 none. */
    int *fuse;
    /* [n_layers]: where each layer runs (lane.h); NULL: lanes off (not
     * IKBO mode, no_lane, no be->lane, or no layer would run there). */
    unsigned char *lane;
    ikbo_model_info info;
};

typedef struct arena {
    void *base;
    size_t cap, used;
} arena;

struct ikbo_ctx {
    ikbo_model *m;
    bk_stream *s;
    arena ar[BK_TAG_COUNT];
    size_t need[BK_TAG_COUNT];
    size_t last[BK_TAG_COUNT];
    int dry;
    value *vals; /* [n_layers] */
    /* Host mirror of the index arena, as large as it: index arrays are
     * written at their arena offsets and uploaded with one copy. */
    char *h_index;
    size_t h_index_cap;
    float *h_logits;
    size_t h_logits_cap;
    const int64_t **bag_ids, **bag_off; /* [n_layers]: embedding_bag inputs */
    void **stack_buf;                   /* [n_layers]: a stack's buffer, once taken */
    char *stack_taken;                  /* [n_layers]: taken in this pass */
    void *(*aux)[OP_AUX];               /* [n_layers]: buffers a later layer reads (op_aux) */
    /* Bytes broadcast mode would have copied to C rows for the last batch
     * (0 in broadcast mode, where they were copied). */
    uint64_t avoided;
    /* Candidate rows of this batch's passes: n_cands, or its bucket with
     * graphs on (rows past n_cands are padding: batch_graph.h). */
    int rows_c;
    /* Batch graphs (NULL: off) and this batch's key, built by the dry
     * pass: every arena take's size in order, then the scalars. */
    bg_cache *graphs;
    bg_key key;
    enum ikbo_graph_use last_graph;
    ikbo_graph_stats gst;
    bk_bag bags[BK_MAX_BAGS]; /* queued by OP_QUEUED layers (op_queue_bag) */
    char bag_lane[BK_MAX_BAGS]; /* queued by a LANE_RUN layer */
    int n_bags;
    /* The user lane (NULL: off) and whether launches were issued on it
     * since the stream last waited for it. */
    bk_stream *lane;
    int lane_busy;
};

const char *ikbo_version(void) { return "0.1.0"; }

/* ---------------------------------------------------------------- load */

static void model_release(ikbo_model *m)
{
    if (!m) return;
    if (m->be) {
        if (m->table_w)
            for (int i = 0; i < m->def->n_tables; i++)
                if (m->table_w[i]) m->be->weight_free(m->be, m->table_w[i]);
        if (m->layer_w)
            for (int i = 0; i < m->def->n_layers; i++)
                for (int j = 0; j < MD_MAX_WEIGHTS; j++)
                    if (m->layer_w[i][j]) m->be->weight_free(m->be, m->layer_w[i][j]);
        m->be->destroy(m->be);
    }
    free(m->table_w);
    free(m->layer_w);
    free(m->into);
    free(m->into_col);
    free(m->fuse);
    free(m->lane);
    model_def_free(m->def);
    free(m);
}

void ikbo_model_free(ikbo_model *m) { model_release(m); }


/* Follows views (reshape, flatten) back to the layer that computes a value;
 * -1 for a model input. */
static int producer(const model_def *d, md_ref r)
{
    while (r.src == MD_SRC_LAYER) {
        const md_layer *l = &d->layers[r.index];
        if (!(md_ops[l->op]->flags & OP_VIEW)) return r.index;
        r = l->in[0];
    }
    return -1;
}

/* A stack p may live inside the stack s that reads it: read directly (no
 * view) by s once, and otherwise only as input 0 of OP_READS_PITCHED
 * layers (they read it with its row stride, value.ld), never the logits. */
static int gatherer_placeable(const model_def *d, int p, int s)
{
    if (p == d->logits_layer) return 0;
    int by_s = 0;
    for (int j = p + 1; j < d->n_layers; j++)
        for (int k = 0; k < d->layers[j].n_in; k++) {
            md_ref q = d->layers[j].in[k];
            if (q.src != MD_SRC_LAYER || q.index != p) continue;
            if (j == s)
                by_s++;
            else if (k != 0 || !(md_ops[d->layers[j].op]->flags & OP_READS_PITCHED))
                return 0;
        }
    return by_s == 1;
}

/* Which layers write straight into a stack or concat (see the file comment):
 * a vector output of an OP_PLACED op (linear, embedding_bag, pool) or a tokens
 * output of an OP_PLACED_TOKENS op (target_attention) of the gatherer's
 * domain, read once, through views each read once; and a stack read by
 * another (gatherer_placeable), or read once through views each read once
 * (a concat of a stack's flatten: the fold's user term), whose own placed
 * inputs then land in the outer gatherer's rows. */
static int plan_in_place(ikbo_model *m)
{
    const model_def *d = m->def;
    int n = d->n_layers;
    int *uses = calloc((size_t)n + 1, sizeof(int));
    m->into = malloc(((size_t)n + 1) * sizeof(int));
    m->into_col = calloc((size_t)n + 1, sizeof(int));
    if (!uses || !m->into || !m->into_col) {
        free(uses);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        m->into[i] = -1;
        for (int k = 0; k < d->layers[i].n_in; k++)
            if (d->layers[i].in[k].src == MD_SRC_LAYER) uses[d->layers[i].in[k].index]++;
    }
    uses[d->logits_layer]++;
    for (int s = 0; s < n; s++) {
        const md_layer *st = &d->layers[s];
        if (!(md_ops[st->op]->flags & OP_GATHERS)) continue;
        int col = 0;
        for (int k = 0; k < st->n_in; k++) {
            md_ref r = st->in[k];
            int p = producer(d, r);
            int fl = p >= 0 ? md_ops[d->layers[p].op]->flags : 0;
            int ok = p >= 0 && m->into[p] < 0 && d->layers[p].domain == st->domain;
            if (ok && (fl & OP_GATHERS) && r.index == p) {
                ok = gatherer_placeable(d, p, s);
            } else { /* through views, each read once (a gatherer too: a flatten of a stack) */
                ok = ok && (((fl & OP_PLACED) && d->layers[p].kind == MD_VEC) ||
                            ((fl & OP_PLACED_TOKENS) && d->layers[p].kind == MD_TOKENS) ||
                            (fl & OP_GATHERS));
                for (md_ref q = r; ok; q = d->layers[q.index].in[0]) {
                    ok = uses[q.index] == 1;
                    if (q.index == p) break;
                }
            }
            if (ok) {
                m->into[p] = s;
                m->into_col[p] = col;
            }
            col += md_ref_width(d, r);
        }
    }
    free(uses);
    return 0;
}

/* Which target_attention runs inside its shared self_attention's launch
 * (IKBO mode): one per self_attention, whose query is computed before the
 * self_attention runs. The others read the shared K/V afterwards. */
static int plan_fuse(ikbo_model *m)
{
    const model_def *d = m->def;
    if (!(m->fuse = malloc(((size_t)d->n_layers + 1) * sizeof(int)))) return -1;
    for (int i = 0; i < d->n_layers; i++) m->fuse[i] = -1;
    if (m->mode != IKBO_MODE_IKBO) return 0;
    for (int t = 0; t < d->n_layers; t++) {
        const md_layer *l = &d->layers[t];
        if (l->op != MD_TARGET_ATTENTION || l->shared < 0 || m->fuse[l->shared] >= 0) continue;
        if (l->in[0].src == MD_SRC_LAYER && l->in[0].index > l->shared) continue;
        m->fuse[l->shared] = t;
        m->fuse[t] = l->shared;
    }
    return 0;
}

/* Puts "<pre>: " before err's message. */
static void err_prefix(ikbo_err *err, const char *pre)
{
    char msg[sizeof(err->msg)];
    snprintf(msg, sizeof(msg), "%s", err->msg);
    bk_seterr(err, "%s: %s", pre, msg);
}

/* On failure err names the weight (a folded weight by its rewritten name,
 * "<linear>__u.weight": engine/fold.h). */
static bk_weight *upload_weight(ikbo_model *m, md_weight *w, ikbo_err *err)
{
    bk_weight *h = m->be->weight_new(m->be, w->data, w->rows, w->cols, err);
    if (!h) {
        err_prefix(err, w->name);
        return NULL;
    }
    /* The backend holds its own copy; the host copy is no longer needed. */
    free(w->data);
    w->data = NULL;
    return h;
}

ikbo_model *ikbo_model_load(const char *dir, const ikbo_load_opts *opts, ikbo_err *err)
{
    const char *device = opts && opts->device ? opts->device : "cpu";
    ikbo_model *m = calloc(1, sizeof(*m));
    if (!m) {
        bk_seterr(err, "out of memory");
        return NULL;
    }
    m->mode = opts ? opts->mode : IKBO_MODE_IKBO;
    m->graphs = opts && opts->graphs > 0 ? opts->graphs : 0;
    if (m->mode != IKBO_MODE_IKBO && m->mode != IKBO_MODE_BROADCAST) {
        bk_seterr(err, "load options: unknown mode %d", (int)m->mode);
        free(m);
        return NULL;
    }
    snprintf(m->device, sizeof(m->device), "%s", device);
    if (model_def_load_opts(dir, opts && opts->no_fold ? MD_LOAD_NO_FOLD : 0, &m->def, err) !=
        0) {
        free(m);
        return NULL;
    }
    m->be = bk_backend_new(device, err);
    if (!m->be) goto fail;
    if (!m->be->graph_capture) m->graphs = 0;
    model_def *d = m->def;
    m->table_w = calloc((size_t)d->n_tables + 1, sizeof(*m->table_w));
    m->layer_w = calloc((size_t)d->n_layers + 1, sizeof(*m->layer_w));
    if (!m->table_w || !m->layer_w) {
        bk_seterr(err, "out of memory");
        goto fail;
    }
    for (int i = 0; i < d->n_tables; i++) {
        md_table *t = &d->tables[i];
        /* A table no layer reads is not worth device memory. */
        int used = 0;
        for (int l = 0; l < d->n_layers && !used; l++)
            used = d->layers[l].table == i;
        if (!used) continue;
        if (!(m->table_w[i] = upload_weight(m, &t->w, err))) goto fail_where;
    }
    for (int l = 0; l < d->n_layers; l++) {
        const md_op_def *od = md_ops[d->layers[l].op];
        if (od->prepare && od->prepare(&d->layers[l], err)) goto fail_where;
    }
    for (int l = 0; l < d->n_layers; l++)
        for (int j = 0; j < d->layers[l].n_w; j++)
            if (!(m->layer_w[l][j] = upload_weight(m, &d->layers[l].w[j], err))) goto fail_where;

    if (plan_in_place(m) || plan_fuse(m)) {
        bk_seterr(err, "out of memory");
        goto fail;
    }
    if (m->mode == IKBO_MODE_IKBO && m->be->lane && !(opts && opts->no_lane)) {
        if (!(m->lane = lane_plan(d, m->fuse))) {
            bk_seterr(err, "out of memory");
            goto fail;
        }
        if (!lane_count(d, m->lane)) {
            free(m->lane);
            m->lane = NULL;
        }
    }

    ikbo_model_info *in = &m->info;
    in->dir = d->dir;
    in->user_dense = d->user_dense;
    in->cand_dense = d->cand_dense;
    in->user_sparse = (const char *const *)d->user_sparse;
    in->n_user_sparse = d->n_user_sparse;
    in->cand_sparse = (const char *const *)d->cand_sparse;
    in->n_cand_sparse = d->n_cand_sparse;
    in->has_history = d->has_history;
    in->hist_max_len = d->hist_max_len;
    in->hist_actions = d->hist_actions;
    in->tasks = (const char *const *)d->tasks;
    in->n_tasks = d->n_tasks;
    in->score_weights = d->score_weights;
    in->mode = m->mode;
    in->device = m->device;
    return m;

fail_where: {
    char pre[sizeof(err->msg)];
    snprintf(pre, sizeof(pre), "%s: loading weights on %s", dir, device);
    err_prefix(err, pre);
}
fail:
    model_release(m);
    return NULL;
}

int ikbo_model_peek_serving(const char *dir, ikbo_serving *out, ikbo_err *err)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/model.json", dir);
    FILE *f = fopen(path, "rb");
    if (!f) {
        bk_seterr(err, "%s: %s", path, strerror(errno));
        return -1;
    }
    /* Same cap as the loader's: model.json over 16 MiB is refused there too. */
    size_t cap = 16u << 20, n = 0;
    char *buf = malloc(cap + 1);
    if (!buf) {
        fclose(f);
        bk_seterr(err, "%s: out of memory", path);
        return -1;
    }
    n = fread(buf, 1, cap + 1, f);
    int bad = ferror(f);
    fclose(f);
    if (bad || n > cap) {
        free(buf);
        bk_seterr(err, "%s: %s", path, bad ? "read error" : "larger than 16 MiB");
        return -1;
    }
    model_def *d = NULL;
    int rc = model_def_plan(dir, buf, n, &d, err);
    free(buf);
    if (rc) return -1;
    *out = d->serving;
    model_def_free(d);
    return 0;
}

const ikbo_model_info *ikbo_model_get_info(const ikbo_model *m) { return &m->info; }

char *ikbo_model_plan(const ikbo_model *m, int json, double ratio)
{
    return md_plan_render(m->def, json, ratio);
}

void ikbo_model_plan_summary(const ikbo_model *m, double ratio, ikbo_plan_summary *out)
{
    md_plan_summary(m->def, ratio, out);
}

void ikbo_get_stats(const ikbo_model *m, ikbo_stats *out) { m->be->get_stats(m->be, out); }

/* ------------------------------------------------------------- context */

/* Frees what a context holds; any field may still be NULL. */
static void ctx_release(ikbo_ctx *c)
{
    bk_backend *be = c->m ? c->m->be : NULL;
    for (int t = 0; be && t < BK_TAG_COUNT; t++)
        if (c->ar[t].base) be->free(be, c->ar[t].base, c->ar[t].cap, (enum bk_tag)t);
    bg_free(c->graphs); /* before the stream its graphs belong to */
    if (c->s) be->stream_free(c->s);
    free(c->vals);
    free(c->bag_ids);
    free(c->bag_off);
    free(c->stack_buf);
    free(c->stack_taken);
    free(c->aux);
    free(c->h_index);
    free(c->h_logits);
    free(c);
}

ikbo_ctx *ikbo_ctx_new(ikbo_model *m, ikbo_err *err)
{
    ikbo_ctx *c = calloc(1, sizeof(*c));
    size_t nl = (size_t)m->def->n_layers + 1;
    if (!c) {
        bk_seterr(err, "out of memory");
        return NULL;
    }
    c->m = m;
    if (!(c->vals = calloc(nl, sizeof(value))) ||
        !(c->bag_ids = calloc(nl, sizeof(*c->bag_ids))) ||
        !(c->bag_off = calloc(nl, sizeof(*c->bag_off))) ||
        !(c->stack_buf = calloc(nl, sizeof(*c->stack_buf))) ||
        !(c->stack_taken = calloc(nl, 1)) || !(c->aux = calloc(nl, sizeof(*c->aux)))) {
        ctx_release(c);
        bk_seterr(err, "out of memory");
        return NULL;
    }
    if (!(c->s = m->be->stream_new(m->be, err)) ||
        (m->lane && !(c->lane = m->be->lane(c->s, err)))) {
        ctx_release(c);
        return NULL;
    }
    if (m->graphs && !(c->graphs = bg_new(m->be, m->graphs))) {
        ctx_release(c);
        bk_seterr(err, "out of memory");
        return NULL;
    }
    return c;
}

void ikbo_ctx_free(ikbo_ctx *c)
{
    if (c) ctx_release(c);
}

int ikbo_ctx_set_gpu_spin(ikbo_ctx *c, long long spin_us, ikbo_err *err)
{
    const bk_backend *be = c->m->be;
    return be->stream_set_spin ? be->stream_set_spin(c->s, spin_us, err) : 0;
}

int ikbo_ctx_device_lost(const ikbo_ctx *c, ikbo_err *why)
{
    bk_backend *be = c->m->be;
    return be->lost(be, why);
}

void ikbo_ctx_last_bytes(const ikbo_ctx *c, size_t bytes[BK_TAG_COUNT])
{
    memcpy(bytes, c->last, sizeof(c->last));
}

uint64_t ikbo_ctx_last_avoided_bytes(const ikbo_ctx *c) { return c->avoided; }

const char *const ikbo_graph_use_names[IKBO_GRAPH_USES] = {"none", "replayed", "recorded",
                                                           "fell_back"};

enum ikbo_graph_use ikbo_ctx_last_graph(const ikbo_ctx *c) { return c->last_graph; }

void ikbo_ctx_graph_stats(const ikbo_ctx *c, ikbo_graph_stats *out)
{
    *out = c->gst;
    out->evictions = c->graphs ? c->graphs->evictions : 0;
    out->held = c->graphs ? bg_held(c->graphs) : 0;
}

/* Takes bytes from the tag's arena (or, in the dry pass, only counts them).
 * Never fails in the real pass: the arenas were grown to the dry total. */
static void *take(ikbo_ctx *c, enum bk_tag tag, size_t bytes)
{
    size_t n = (bytes + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
    if (c->dry) {
        c->need[tag] += n;
        if (c->graphs) bg_key_add(&c->key, (int64_t)(n << 2 | tag));
        return NULL;
    }
    arena *a = &c->ar[tag];
    void *p = (char *)a->base + a->used;
    a->used += n;
    return p;
}

/* The real pass starts at the arenas' bases. */
static void arenas_rewind(ikbo_ctx *c)
{
    for (int t = 0; t < BK_TAG_COUNT; t++) c->ar[t].used = 0;
}

/* Grows the arenas to the dry pass's totals; a moved arena invalidates
 * every recorded graph. */
static int grow_arenas(ikbo_ctx *c, ikbo_err *err)
{
    bk_backend *be = c->m->be;
    arenas_rewind(c);
    for (int t = 0; t < BK_TAG_COUNT; t++) {
        arena *a = &c->ar[t];
        if (c->need[t] <= a->cap) continue;
        if (c->graphs) bg_flush(c->graphs);
        if (a->base) be->free(be, a->base, a->cap, (enum bk_tag)t);
        a->base = NULL;
        a->cap = 0;
        /* Grow with headroom so slowly rising batch sizes don't reallocate. */
        size_t cap = c->need[t] + c->need[t] / 4;
        if (!(a->base = be->alloc(be, cap, (enum bk_tag)t, err))) return -1;
        a->cap = cap;
    }
    size_t ic = c->ar[BK_TAG_INDEX].cap;
    if (ic > c->h_index_cap) {
        char *p = realloc(c->h_index, ic);
        if (!p) {
            bk_seterr(err, "out of host memory");
            return -1;
        }
        memset(p, 0, ic); /* arena padding travels too; keep it defined */
        c->h_index = p;
        c->h_index_cap = ic;
    }
    return 0;
}

/* Where an index buffer's bytes sit in the host mirror (real pass only). */
static void *mirror(ikbo_ctx *c, const void *dev)
{
    return c->h_index + ((const char *)dev - (const char *)c->ar[BK_TAG_INDEX].base);
}

#define GROW(ptr, cap, n)                                                     \
    do {                                                                      \
        if ((size_t)(n) > (cap)) {                                            \
            void *np_ = realloc((ptr), (size_t)(n) * sizeof(*(ptr)));         \
            if (!np_) {                                                       \
                bk_seterr(err, "out of host memory");                         \
                return -1;                                                    \
            }                                                                 \
            (ptr) = np_;                                                      \
            (cap) = (size_t)(n);                                              \
        }                                                                     \
    } while (0)

/* --------------------------------------------------------- validation */

static int check_jagged(const ikbo_jagged *j, int rows, const char *what, ikbo_err *err)
{
    if (!j->offsets) {
        bk_seterr(err, "batch: %s: offsets missing", what);
        return -1;
    }
    if (j->offsets[0] != 0) {
        bk_seterr(err, "batch: %s: offsets[0] = %lld, expected 0", what, (long long)j->offsets[0]);
        return -1;
    }
    for (int r = 0; r < rows; r++)
        if (j->offsets[r + 1] < j->offsets[r]) {
            bk_seterr(err, "batch: %s: offsets decrease at row %d", what, r);
            return -1;
        }
    if (j->offsets[rows] > 0 && !j->ids) {
        bk_seterr(err, "batch: %s: ids missing", what);
        return -1;
    }
    if (j->offsets[rows] > INT32_MAX) {
        bk_seterr(err, "batch: %s: %lld ids exceed the engine's limit", what,
                  (long long)j->offsets[rows]);
        return -1;
    }
    return 0;
}

static int validate_batch(const ikbo_model *m, const ikbo_batch *b, ikbo_err *err)
{
    const model_def *d = m->def;
    char what[160];
    if (b->n_users < 1 || b->n_cands < 1) {
        bk_seterr(err, "batch: needs at least 1 user and 1 candidate (got %d users, %d candidates)",
                  b->n_users, b->n_cands);
        return -1;
    }
    if (!b->map) {
        bk_seterr(err, "batch: map missing");
        return -1;
    }
    for (int c = 0; c < b->n_cands; c++) {
        if (b->map[c] < 0 || b->map[c] >= b->n_users) {
            bk_seterr(err, "batch: map[%d] = %d but batch has %d users", c, b->map[c], b->n_users);
            return -1;
        }
        if (c > 0 && b->map[c] < b->map[c - 1]) {
            bk_seterr(err, "batch: map[%d] = %d < map[%d] = %d: candidates must be grouped by user",
                      c, b->map[c], c - 1, b->map[c - 1]);
            return -1;
        }
    }
    if ((d->user_dense && !b->user_dense) || (d->cand_dense && !b->cand_dense)) {
        bk_seterr(err, "batch: %s dense values missing", d->user_dense && !b->user_dense ? "user" : "candidate");
        return -1;
    }
    if ((d->n_user_sparse && !b->user_sparse) || (d->n_cand_sparse && !b->cand_sparse)) {
        bk_seterr(err, "batch: sparse features missing");
        return -1;
    }
    for (int f = 0; f < d->n_user_sparse; f++) {
        snprintf(what, sizeof(what), "user sparse '%s'", d->user_sparse[f]);
        if (check_jagged(&b->user_sparse[f], b->n_users, what, err)) return -1;
    }
    for (int f = 0; f < d->n_cand_sparse; f++) {
        snprintf(what, sizeof(what), "candidate sparse '%s'", d->cand_sparse[f]);
        if (check_jagged(&b->cand_sparse[f], b->n_cands, what, err)) return -1;
    }
    if (d->has_history) {
        if (check_jagged(&b->hist, b->n_users, "history", err)) return -1;
        if (b->hist_actions)
            for (int64_t e = 0; e < b->hist.offsets[b->n_users]; e++)
                if (b->hist_actions[e] < 0 || b->hist_actions[e] >= d->hist_actions) {
                    bk_seterr(err, "batch: history action %d at event %lld is outside [0, %d)",
                              b->hist_actions[e], (long long)e, d->hist_actions);
                    return -1;
                }
    }
    return 0;
}

/* ------------------------------------------------------------- forward */

/* Places a jagged id list of `real` rows in the index arena (and its host
 * mirror) as `rows` rows, the rest empty; returns backend ids and offsets.
 * With graphs on, the ids get bg_room's room, so nearby counts share a key. */
static void put_jagged(ikbo_ctx *c, const ikbo_jagged *j, int real, int rows, const int64_t **ids,
                       const int64_t **off)
{
    size_t nid = (size_t)j->offsets[real];
    size_t room = c->graphs ? bg_room(nid) : nid;
    int64_t *di = take(c, BK_TAG_INDEX, room * sizeof(int64_t));
    int64_t *dof = take(c, BK_TAG_INDEX, (size_t)(rows + 1) * sizeof(int64_t));
    *ids = di;
    *off = dof;
    if (c->dry) return;
    if (nid) memcpy(mirror(c, di), j->ids, nid * sizeof(int64_t));
    int64_t *ho = mirror(c, dof);
    memcpy(ho, j->offsets, (size_t)(real + 1) * sizeof(int64_t));
    for (int r = real + 1; r <= rows; r++) ho[r] = (int64_t)nid;
}

/* Cuts each user's history to its most recent max_len events, straight
 * into the index arena's host mirror (ids, actions, offsets). */
static void put_history(ikbo_ctx *c, const ikbo_batch *b, const int64_t **ids,
                        const int32_t **acts, const int64_t **off, int64_t *n_events)
{
    const model_def *d = c->m->def;
    int U = b->n_users;
    int64_t total = 0;
    for (int u = 0; u < U; u++) {
        int64_t len = b->hist.offsets[u + 1] - b->hist.offsets[u];
        total += len < d->hist_max_len ? len : d->hist_max_len;
    }
    *n_events = total;
    int64_t *dids = take(c, BK_TAG_INDEX, (size_t)total * sizeof(int64_t));
    int32_t *dacts = b->hist_actions ? take(c, BK_TAG_INDEX, (size_t)total * sizeof(int32_t)) : NULL;
    int64_t *doff = take(c, BK_TAG_INDEX, (size_t)(U + 1) * sizeof(int64_t));
    *ids = dids;
    *acts = dacts;
    *off = doff;
    if (c->dry) return;
    int64_t *hi = mirror(c, dids), *ho = mirror(c, doff);
    int32_t *ha = dacts ? mirror(c, dacts) : NULL;
    int64_t k = 0;
    ho[0] = 0;
    for (int u = 0; u < U; u++) {
        int64_t beg = b->hist.offsets[u], end = b->hist.offsets[u + 1];
        if (end - beg > d->hist_max_len) beg = end - d->hist_max_len;
        if (end > beg) {
            memcpy(hi + k, b->hist.ids + beg, (size_t)(end - beg) * sizeof(int64_t));
            if (ha) memcpy(ha + k, b->hist_actions + beg, (size_t)(end - beg) * sizeof(int32_t));
            k += end - beg;
        }
        ho[u + 1] = k;
    }
}

static enum bk_tag dom_tag(enum md_domain d) { return d == MD_USER ? BK_TAG_USER : BK_TAG_CAND; }

static size_t act_bytes(const ikbo_ctx *c, size_t rows, size_t width)
{
    return rows * width * c->m->be->act_size;
}

static value input_value(ikbo_ctx *c, const fwd *f, md_ref r)
{
    value v = {0};
    switch (r.src) {
    case MD_SRC_LAYER: return c->vals[r.index];
    case MD_SRC_USER_DENSE: v.p = (void *)f->user_dense; v.rows = f->b->n_users; break;
    case MD_SRC_CAND_DENSE: v.p = (void *)f->cand_dense; v.rows = f->C; break;
    default: break;
    }
    return v;
}

/* IKBO mode: counts the bytes the broadcast baseline would have copied. */
static void avoided(ikbo_ctx *c, size_t rows, size_t width)
{
    if (!c->dry && c->m->mode == IKBO_MODE_IKBO) c->avoided += act_bytes(c, rows, width);
}

/* Broadcast mode: copies a dense user tensor to C rows. */
static const void *broadcast_dense(ikbo_ctx *c, const fwd *f, const void *src, int width,
                                   ikbo_err *err)
{
    int C = f->C;
    void *dst = take(c, BK_TAG_BROADCAST, act_bytes(c, (size_t)C, (size_t)width));
    if (!c->dry && c->m->be->gather(c->s, src, NULL, f->map, C, NULL, width, dst, err)) return NULL;
    return c->dry ? (const void *)1 : dst;
}

/* A gatherer's buffer, taken the first time it or one of its in-place
 * producers needs it in this pass. */
static void *stack_base(ikbo_ctx *c, int s, int rows)
{
    const md_layer *l = &c->m->def->layers[s];
    if (!c->stack_taken[s]) {
        c->stack_buf[s] = take(c, dom_tag(l->domain),
                               act_bytes(c, (size_t)rows, (size_t)md_layer_width(l)));
        c->stack_taken[s] = 1;
    }
    return c->stack_buf[s];
}

/* ------------------------------------------------ the op_run API (op.h) */

value op_in(const op_run *r, int k) { return input_value(r->c, r->f, r->l->in[k]); }

enum md_domain op_in_domain(const op_run *r, int k) { return md_ref_domain(r->d, r->l->in[k]); }

int op_in_width(const op_run *r, int k) { return md_ref_width(r->d, r->l->in[k]); }

int op_in_tokens(const op_run *r, int k)
{
    md_ref x = r->l->in[k];
    return x.src == MD_SRC_LAYER ? r->d->layers[x.index].tokens : 1;
}

void *op_take(op_run *r, enum bk_tag tag, size_t rows, size_t width)
{
    return take(r->c, tag, act_bytes(r->c, rows, width));
}

void *op_out(op_run *r, size_t rows, size_t width)
{
    return op_take(r, dom_tag(r->l->domain), rows, width);
}

void *op_out_like(op_run *r, int k)
{
    value in = op_in(r, k);
    if (r->l->kind == MD_JAGGED) {
        r->out->rows = in.rows;
        r->out->offsets = in.offsets;
    }
    return r->out->p = op_out(r, (size_t)r->out->rows, (size_t)md_layer_width(r->l));
}

/* Gatherer s's rows: its own buffer, or its columns of the outermost
 * gatherer it is placed in (*ld: that one's width). */
static char *gather_rows(ikbo_ctx *c, int s, int rows, int *ld)
{
    size_t col = 0;
    for (; c->m->into[s] >= 0; s = c->m->into[s]) col += (size_t)c->m->into_col[s];
    *ld = md_layer_width(&c->m->def->layers[s]);
    char *base = stack_base(c, s, rows);
    return c->dry ? NULL : base + col * c->m->be->act_size;
}

void *op_out_placed(op_run *r, int rows, int width, int *ld)
{
    ikbo_ctx *c = r->c;
    int s = c->m->into[r->li];
    *ld = width;
    if (s < 0) return op_out(r, (size_t)rows, (size_t)width);
    char *base = gather_rows(c, s, rows, ld); /* NULL in the dry pass */
    return base ? base + (size_t)c->m->into_col[r->li] * c->m->be->act_size : NULL;
}

const void *op_broadcast(op_run *r, const void *src, int width)
{
    return broadcast_dense(r->c, r->f, src, width, r->err);
}

void op_avoided(op_run *r, size_t rows, size_t width) { avoided(r->c, rows, width); }

int op_cand_operand(op_run *r, int k, int width, const void **p, const int32_t **map)
{
    *p = op_in(r, k).p;
    *map = NULL;
    if (r->l->domain != MD_CAND || op_in_domain(r, k) != MD_USER) return 0;
    if (r->bc) return (*p = op_broadcast(r, *p, width)) ? 0 : -1;
    *map = r->f->map;
    op_avoided(r, (size_t)r->C, (size_t)width);
    return 0;
}

void *op_gather_base(op_run *r, int *ld) { return gather_rows(r->c, r->li, r->rows, ld); }

int op_in_placed(const op_run *r, int k)
{
    int p = producer(r->d, r->l->in[k]);
    return p >= 0 && r->c->m->into[p] == r->li;
}

const bk_weight *op_table_w(const op_run *r, int t) { return r->c->m->table_w[t]; }

/* The lane's launches from now on: marked pending (real pass). */
static bk_stream *lane_use(ikbo_ctx *c)
{
    if (!c->dry) c->lane_busy = 1;
    return c->lane;
}

/* The stream waits for the lane's pending launches (none: no call). */
static int lane_join(ikbo_ctx *c, ikbo_err *err)
{
    if (c->dry || !c->lane_busy) return 0;
    c->lane_busy = 0;
    return c->m->be->lane_wait(c->s, c->lane, err);
}

bk_stream *op_lane(op_run *r)
{
    ikbo_ctx *c = r->c;
    return c->lane && c->m->lane[r->li] == LANE_SPLIT && !r->dry ? lane_use(c) : r->s;
}

int op_join(op_run *r) { return lane_join(r->c, r->err); }

/* Launches the queued bags: one backend call, or, with the lane on, one
 * for the lane's bags there (side 1) and one for the others on the stream. */
static int flush_bags(ikbo_ctx *c, ikbo_err *err)
{
    int n = c->n_bags;
    c->n_bags = 0;
    if (!n || c->dry) return 0;
    bk_backend *be = c->m->be;
    if (!c->lane) return be->embedding_bags(c->s, c->bags, n, err);
    for (int side = 1; side >= 0; side--) {
        bk_bag own[BK_MAX_BAGS];
        int k = 0;
        for (int i = 0; i < n; i++)
            if (c->bag_lane[i] == side) own[k++] = c->bags[i];
        if (k && be->embedding_bags(side ? lane_use(c) : c->s, own, k, err)) return -1;
    }
    return 0;
}

int op_queue_bag(op_run *r, const bk_bag *bag)
{
    ikbo_ctx *c = r->c;
    if (r->dry) return 0;
    if (c->n_bags == BK_MAX_BAGS && flush_bags(c, r->err)) return -1;
    c->bag_lane[c->n_bags] = c->lane && r->s == c->lane;
    c->bags[c->n_bags++] = *bag;
    return 0;
}

void op_bag(const op_run *r, const int64_t **ids, const int64_t **off)
{
    *ids = r->c->bag_ids[r->li];
    *off = r->c->bag_off[r->li];
}

value op_in_of(const op_run *r, int li, int k)
{
    return input_value(r->c, r->f, r->d->layers[li].in[k]);
}

bk_weight *const *op_layer_w(const op_run *r, int li) { return r->c->m->layer_w[li]; }

void **op_aux(const op_run *r, int li) { return r->c->aux[li]; }

int op_fuse(const op_run *r) { return r->c->m->fuse[r->li]; }

/* One layer: its op's run from the table, on the stream or the lane
 * (lane.h), the stream first waiting for the lane where the layer says. */
static int run_layer(ikbo_ctx *c, const fwd *f, int li, ikbo_err *err)
{
    const model_def *d = c->m->def;
    const md_layer *l = &d->layers[li];
    int U = f->b->n_users, C = f->C;
    int mode = c->lane ? c->m->lane[li] : LANE_MAIN;
    if (mode == LANE_JOIN && lane_join(c, err)) return -1;
    bk_stream *s = mode == LANE_RUN ? lane_use(c) : c->s;
    op_run r = {.c = c, .f = f, .d = d, .l = l, .li = li, .be = c->m->be, .s = s,
                .w = c->m->layer_w[li], .U = U, .C = C, .rows = l->domain == MD_USER ? U : C,
                .bc = c->m->mode == IKBO_MODE_BROADCAST, .dry = c->dry, .out = &c->vals[li],
                .err = err};
    r.out->p = NULL;
    r.out->rows = r.rows;
    r.out->offsets = NULL;
    r.out->ld = 0;
    return md_ops[l->op]->run(&r);
}

/* A batch's inputs: every index array and the dense features into the host
 * mirror of the index arena, and up with one copy. Candidates past
 * b->n_cands (padding) map
 * to the last user, have empty bags and zero dense features. The dry pass
 * only takes (and, with graphs on, records the key). */
static int forward_inputs(ikbo_ctx *c, const ikbo_batch *b, fwd *f, ikbo_err *err)
{
    const model_def *d = c->m->def;
    bk_backend *be = c->m->be;
    int U = b->n_users, Cr = b->n_cands, C = c->rows_c;
    *f = (fwd){.b = b, .C = C};
    memset(c->stack_taken, 0, (size_t)d->n_layers);

    int bc = c->m->mode == IKBO_MODE_BROADCAST;

    /* Index arrays first, in arena order, into the host mirror. */
    int32_t *map = take(c, BK_TAG_INDEX, (size_t)C * sizeof(int32_t));
    if (!c->dry) {
        int32_t *hm = mirror(c, map);
        memcpy(hm, b->map, (size_t)Cr * sizeof(int32_t));
        for (int i = Cr; i < C; i++) hm[i] = U - 1;
    }
    f->map = map;
    if (d->has_history) put_history(c, b, &f->h_ids, &f->h_acts, &f->h_off, &f->n_events);
    for (int li = 0; li < d->n_layers; li++) {
        const md_layer *l = &d->layers[li];
        md_ref r = l->n_in > 0 ? l->in[0] : (md_ref){0};
        if (r.src != MD_SRC_USER_SPARSE && r.src != MD_SRC_CAND_SPARSE) continue;
        if (r.src == MD_SRC_USER_SPARSE)
            put_jagged(c, &b->user_sparse[r.index], U, U, &c->bag_ids[li], &c->bag_off[li]);
        else
            put_jagged(c, &b->cand_sparse[r.index], Cr, C, &c->bag_ids[li], &c->bag_off[li]);
    }

    /* Per-candidate history offsets: what broadcast mode copies, and what
     * IKBO mode reports as avoided. */
    int32_t *id = bc ? take(c, BK_TAG_INDEX, (size_t)C * sizeof(int32_t)) : NULL;
    int64_t *bo = bc ? take(c, BK_TAG_INDEX, (size_t)(C + 1) * sizeof(int64_t)) : NULL;
    int64_t *hbo = bc && !c->dry ? mirror(c, bo) : NULL;
    int64_t ev = 0;
    if (hbo) hbo[0] = 0;
    for (int i = 0; d->has_history && i < C; i++) {
        int u = i < Cr ? b->map[i] : U - 1;
        int64_t len = b->hist.offsets[u + 1] - b->hist.offsets[u];
        ev += len < d->hist_max_len ? len : d->hist_max_len;
        if (hbo) hbo[i + 1] = ev;
    }
    if (hbo && !d->has_history) memset(hbo, 0, (size_t)(C + 1) * sizeof(int64_t));
    f->bc_events = ev;
    if (bc) {
        if (ev > INT32_MAX) {
            bk_seterr(err, "batch: broadcast mode would copy %lld history events, over the engine's limit",
                      (long long)ev);
            return -1;
        }
        f->identity = id;
        f->bc_off = bo;
        if (!c->dry) {
            int32_t *hid = mirror(c, id);
            for (int i = 0; i < C; i++) hid[i] = i;
        }
    }
    if (c->dry && c->graphs) {
        bg_key_add(&c->key, U);
        bg_key_add(&c->key, C);
        bg_key_add(&c->key, f->n_events);
        bg_key_add(&c->key, f->bc_events);
    }

    /* The dense features, converted into the mirror beside the index
     * arrays (padding rows zero): the batch's inputs are one copy. */
    size_t uw = (size_t)d->user_dense, cw = (size_t)d->cand_dense;
    void *ud = uw ? take(c, BK_TAG_INDEX, act_bytes(c, (size_t)U, uw)) : NULL;
    void *cd = cw ? take(c, BK_TAG_INDEX, act_bytes(c, (size_t)C, cw)) : NULL;
    f->user_dense = ud;
    f->cand_dense = cd;
    if (c->dry) return 0;
    if (ud) be->host_from_f32(be, mirror(c, ud), b->user_dense, (size_t)U * uw);
    if (cd) {
        be->host_from_f32(be, mirror(c, cd), b->cand_dense, (size_t)Cr * cw);
        memset((char *)mirror(c, cd) + act_bytes(c, (size_t)Cr, cw), 0,
               act_bytes(c, (size_t)(C - Cr), cw));
    }
    const arena *ix = &c->ar[BK_TAG_INDEX];
    return ix->used ? be->upload(c->s, ix->base, c->h_index, ix->used, err) : 0;
}

/* Whether layer li runs before all others: a queued op (embedding_bag)
 * whose inputs are all request inputs. */
static int hoisted(const model_def *d, int li)
{
    const md_layer *l = &d->layers[li];
    if (!(md_ops[l->op]->flags & OP_QUEUED)) return 0;
    for (int k = 0; k < l->n_in; k++)
        if (l->in[k].src == MD_SRC_LAYER) return 0;
    return 1;
}

/* One pass over the model; in the dry pass only sizes are summed. Leaves
 * the logits buffer in *logits (real pass). The hoisted bags first, as one
 * launch; then every other layer in model order. */
static int forward(ikbo_ctx *c, const ikbo_batch *b, void **logits, ikbo_err *err)
{
    const model_def *d = c->m->def;
    fwd f;
    c->n_bags = 0;
    if (forward_inputs(c, b, &f, err)) return -1;
    /* The lane starts after the upload (its first launches read it). */
    if (c->lane && !c->dry && c->m->be->lane_wait(c->lane, c->s, err)) return -1;
    for (int li = 0; li < d->n_layers; li++)
        if (hoisted(d, li) && run_layer(c, &f, li, err)) return -1;
    for (int li = 0; li < d->n_layers; li++) {
        if (hoisted(d, li)) continue;
        if (!(md_ops[d->layers[li].op]->flags & OP_QUEUED) && flush_bags(c, err)) return -1;
        if (run_layer(c, &f, li, err)) return -1;
    }
    if (flush_bags(c, err) || lane_join(c, err)) return -1;
    *logits = c->vals[d->logits_layer].p;
    return 0;
}

/* The logits of the batch's rows_c rows into h_logits: the batch's one
 * wait (download_f32 returns with the stream idle). */
static int download_logits(ikbo_ctx *c, const void *logits, ikbo_err *err)
{
    size_t n = (size_t)c->rows_c * c->m->def->n_tasks;
    return c->m->be->download_f32(c->s, c->h_logits, logits, n, err);
}

/* With graphs on: replays the key's graph, or records it on the key's
 * second batch. Returns 0 (computed), 1 (not computed: run the batch
 * normally) or never -1: a failed recording or replay is a fallback whose
 * reason lands in the stats, and the normal run reports any real error. */
static int score_graphed(ikbo_ctx *c, const ikbo_batch *b, ikbo_err *err)
{
    bk_backend *be = c->m->be;
    bg_entry *e = bg_get(c->graphs, c->key);
    int counts = 1;
    if (e->g) {
        fwd f;
        counts = !be->graph_replay(c->s, e->g, err);
        if (counts && !forward_inputs(c, b, &f, err) && !download_logits(c, e->logits, err)) {
            c->gst.replays++;
            c->last_graph = IKBO_GRAPH_REPLAYED;
            return 0;
        }
    } else {
        if (!e->seen++ || e->fails >= BG_MAX_FAILS) return 1;
        void *logits = NULL;
        if (!be->graph_capture(c->s, err) && !forward(c, b, &logits, err) &&
            !download_logits(c, logits, err)) {
            if ((e->g = be->graph_take(c->s))) {
                e->logits = logits;
                c->gst.captures++;
                c->last_graph = IKBO_GRAPH_RECORDED;
            }
            return 0;
        }
    }
    be->graph_cancel(c->s);
    bg_fail(c->graphs, e, counts);
    c->gst.fallbacks++;
    c->last_graph = IKBO_GRAPH_FELL_BACK;
    snprintf(c->gst.last_error, sizeof c->gst.last_error, "%.*s", (int)sizeof c->gst.last_error - 1, err->msg);
    arenas_rewind(c);
    c->avoided = 0;
    return 1;
}

int ikbo_score(ikbo_ctx *c, const ikbo_batch *b, float *task_scores, float *scores, ikbo_err *err)
{
    ikbo_model *m = c->m;
    const model_def *d = m->def;
    if (validate_batch(m, b, err)) return -1;
    int C = b->n_cands, T = d->n_tasks;
    c->rows_c = c->graphs ? bg_bucket(C) : C;
    for (int li = 0; li < d->n_layers; li++)
        if ((int64_t)c->rows_c * d->layers[li].tokens > INT32_MAX) {
            bk_seterr(err, "batch: %d candidates exceed the engine's limit", C);
            return -1;
        }

    memset(c->need, 0, sizeof(c->need));
    c->key = BG_KEY_INIT;
    c->last_graph = IKBO_GRAPH_NONE;
    c->dry = 1;
    void *logits = NULL;
    int dry_rc = forward(c, b, &logits, err);
    c->dry = 0;
    if (dry_rc) return -1;
    c->avoided = 0;
    /* A failed batch may have left lane work queued that still reads the
     * arenas this batch's upload rewrites. */
    if (lane_join(c, err) || grow_arenas(c, err)) return -1;
    GROW(c->h_logits, c->h_logits_cap, (size_t)c->rows_c * T);
    int rc = c->graphs ? score_graphed(c, b, err) : 1;
    if (rc == 1 && (forward(c, b, &logits, err) || download_logits(c, logits, err))) return -1;
    memcpy(c->last, c->need, sizeof(c->need));

    for (int i = 0; i < C; i++) {
        double s = 0;
        for (int t = 0; t < T; t++) {
            float p = 1.0f / (1.0f + expf(-c->h_logits[(size_t)i * T + t]));
            if (task_scores) task_scores[(size_t)i * T + t] = p;
            s += (double)d->score_weights[t] * p;
        }
        if (scores) scores[i] = (float)s;
    }
    return 0;
}
