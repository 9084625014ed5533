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
 * mirror of the index arena and uploaded with one copy before the first op;
 * then the two dense inputs; the logits come back with the one wait of the
 * batch (download_f32). On the GPU each copy has a fixed cost, and an upload
 * between kernels used to be one of ~25.
 *
 * Stacks in place: a linear or embedding_bag whose only reader is a stack
 * (directly or through reshape/flatten views) writes its rows straight into
 * its columns of the stack's buffer (row stride = the stack's width), and
 * the stack copies only its other inputs. In the bench model that removes
 * the copy of 85% of E_cand, the largest copy of a batch.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ikbo.h"
#include "model.h"

#define ARENA_ALIGN 256

struct ikbo_model {
    model_def *def;
    bk_backend *be;
    enum ikbo_mode mode;
    char device[32];
    bk_weight **table_w; /* [n_tables] */
    bk_weight *(*layer_w)[MD_MAX_WEIGHTS]; /* [n_layers][4] */
    /* [n_layers]: the stack a layer writes its output into (its only
     * reader), -1 = its own buffer; and its first column there. */
    int *into, *into_col;
    ikbo_model_info info;
};

typedef struct arena {
    void *base;
    size_t cap, used;
} arena;

/* A layer output during a batch. */
typedef struct value {
    void *p;
    int rows;               /* U, C, or event rows for jagged */
    const int64_t *offsets; /* jagged: backend offsets [U+1]  */
} value;

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
    /* Bytes broadcast mode would have copied to C rows for the last batch
     * (0 in broadcast mode, where they were copied). */
    uint64_t avoided;
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
    model_def_free(m->def);
    free(m);
}

void ikbo_model_free(ikbo_model *m) { model_release(m); }

static int ref_width(const model_def *d, md_ref r);

/* Follows views (reshape, flatten) back to the layer that computes a value;
 * -1 for a model input. */
static int producer(const model_def *d, md_ref r)
{
    while (r.src == MD_SRC_LAYER) {
        const md_layer *l = &d->layers[r.index];
        if (l->op != MD_RESHAPE && l->op != MD_FLATTEN) return r.index;
        r = l->in[0];
    }
    return -1;
}

/* Which layers write straight into a stack (see the file comment): a linear
 * or embedding_bag of the stack's domain, read once, through views each read
 * once. Stacks themselves keep their own buffers, so placements never nest. */
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
        if (st->op != MD_STACK) continue;
        int col = 0;
        for (int k = 0; k < st->n_in; k++) {
            md_ref r = st->in[k];
            int p = producer(d, r);
            int ok = p >= 0 && m->into[p] < 0 && d->layers[p].domain == st->domain &&
                     (d->layers[p].op == MD_LINEAR || d->layers[p].op == MD_EMBEDDING_BAG);
            for (md_ref q = r; ok; q = d->layers[q.index].in[0]) {
                ok = uses[q.index] == 1;
                if (q.index == p) break;
            }
            if (ok) {
                m->into[p] = s;
                m->into_col[p] = col;
            }
            col += ref_width(d, r);
        }
    }
    free(uses);
    return 0;
}

static bk_weight *upload_weight(ikbo_model *m, md_weight *w, ikbo_err *err)
{
    bk_weight *h = m->be->weight_new(m->be, w->data, w->rows, w->cols, err);
    if (!h) return NULL;
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
    if (m->mode != IKBO_MODE_IKBO && m->mode != IKBO_MODE_BROADCAST) {
        bk_seterr(err, "load options: unknown mode %d", (int)m->mode);
        free(m);
        return NULL;
    }
    snprintf(m->device, sizeof(m->device), "%s", device);
    if (model_def_load(dir, &m->def, err) != 0) {
        free(m);
        return NULL;
    }
    m->be = bk_backend_new(device, err);
    if (!m->be) goto fail;
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
            used = (d->layers[l].op == MD_EMBEDDING_BAG ||
                    d->layers[l].op == MD_HISTORY_EMBEDDING) &&
                   d->layers[l].table == i;
        if (!used) continue;
        if (!(m->table_w[i] = upload_weight(m, &t->w, err))) goto fail_where;
    }
    for (int l = 0; l < d->n_layers; l++)
        for (int j = 0; j < d->layers[l].n_w; j++)
            if (!(m->layer_w[l][j] = upload_weight(m, &d->layers[l].w[j], err))) goto fail_where;

    if (plan_in_place(m)) {
        bk_seterr(err, "out of memory");
        goto fail;
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
    char msg[sizeof(err->msg)];
    snprintf(msg, sizeof(msg), "%s", err->msg);
    bk_seterr(err, "%s: loading weights on %s: %s", dir, device, msg);
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
    out->max_batch_candidates = d->serving.max_batch_candidates;
    out->max_batch_users = d->serving.max_batch_users;
    out->max_queue_delay_us = d->serving.max_queue_delay_us;
    out->instances = d->serving.instances;
    snprintf(out->mode, sizeof(out->mode), "%s", d->serving.mode);
    snprintf(out->device, sizeof(out->device), "%s", d->serving.device);
    model_def_free(d);
    return 0;
}

const ikbo_model_info *ikbo_model_get_info(const ikbo_model *m) { return &m->info; }

void ikbo_get_stats(const ikbo_model *m, ikbo_stats *out) { m->be->get_stats(m->be, out); }

/* ------------------------------------------------------------- context */

ikbo_ctx *ikbo_ctx_new(ikbo_model *m, ikbo_err *err)
{
    ikbo_ctx *c = calloc(1, sizeof(*c));
    size_t nl = (size_t)m->def->n_layers + 1;
    if (!c || !(c->vals = calloc(nl, sizeof(value))) ||
        !(c->bag_ids = calloc(nl, sizeof(*c->bag_ids))) ||
        !(c->bag_off = calloc(nl, sizeof(*c->bag_off))) ||
        !(c->stack_buf = calloc(nl, sizeof(*c->stack_buf))) ||
        !(c->stack_taken = calloc(nl, 1))) {
        if (c) {
            free(c->vals);
            free(c->bag_ids);
            free(c->bag_off);
            free(c->stack_buf);
        }
        free(c);
        bk_seterr(err, "out of memory");
        return NULL;
    }
    c->m = m;
    if (!(c->s = m->be->stream_new(m->be, err))) {
        free(c->vals);
        free(c->bag_ids);
        free(c->bag_off);
        free(c->stack_buf);
        free(c->stack_taken);
        free(c);
        return NULL;
    }
    return c;
}

void ikbo_ctx_free(ikbo_ctx *c)
{
    if (!c) return;
    bk_backend *be = c->m->be;
    for (int t = 0; t < BK_TAG_COUNT; t++)
        if (c->ar[t].base) be->free(be, c->ar[t].base, c->ar[t].cap, (enum bk_tag)t);
    be->stream_free(c->s);
    free(c->vals);
    free(c->bag_ids);
    free(c->bag_off);
    free(c->stack_buf);
    free(c->stack_taken);
    free(c->h_index);
    free(c->h_logits);
    free(c);
}

void ikbo_ctx_last_bytes(const ikbo_ctx *c, size_t bytes[BK_TAG_COUNT])
{
    memcpy(bytes, c->last, sizeof(c->last));
}

uint64_t ikbo_ctx_last_avoided_bytes(const ikbo_ctx *c) { return c->avoided; }

/* Takes bytes from the tag's arena (or, in the dry pass, only counts them).
 * Never fails in the real pass: the arenas were grown to the dry total. */
static void *take(ikbo_ctx *c, enum bk_tag tag, size_t bytes)
{
    size_t n = (bytes + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
    if (c->dry) {
        c->need[tag] += n;
        return NULL;
    }
    arena *a = &c->ar[tag];
    void *p = (char *)a->base + a->used;
    a->used += n;
    return p;
}

static int grow_arenas(ikbo_ctx *c, ikbo_err *err)
{
    bk_backend *be = c->m->be;
    for (int t = 0; t < BK_TAG_COUNT; t++) {
        arena *a = &c->ar[t];
        a->used = 0;
        if (c->need[t] <= a->cap) continue;
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

#define TRY(x)                                                                \
    do {                                                                      \
        if (!c->dry && (x) != 0) return -1;                                   \
    } while (0)

/* Places a jagged id list in the index arena (and its host mirror);
 * returns backend ids and offsets. */
static void put_jagged(ikbo_ctx *c, const ikbo_jagged *j, int rows, const int64_t **ids,
                       const int64_t **off)
{
    size_t nid = (size_t)j->offsets[rows];
    int64_t *di = take(c, BK_TAG_INDEX, nid * sizeof(int64_t));
    int64_t *dof = take(c, BK_TAG_INDEX, (size_t)(rows + 1) * sizeof(int64_t));
    *ids = di;
    *off = dof;
    if (c->dry) return;
    if (nid) memcpy(mirror(c, di), j->ids, nid * sizeof(int64_t));
    memcpy(mirror(c, dof), j->offsets, (size_t)(rows + 1) * sizeof(int64_t));
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

/* Everything a batch's forward pass shares. */
typedef struct fwd {
    const ikbo_batch *b;
    const int32_t *map;      /* backend map [C]                    */
    const int32_t *identity; /* backend 0..C-1 (broadcast mode)    */
    const void *user_dense, *cand_dense;
    const int64_t *h_ids, *h_off;
    const int32_t *h_acts;
    int64_t n_events;
    const int64_t *bc_off; /* broadcast history offsets [C+1]     */
    int64_t bc_events;
} fwd;

static value input_value(ikbo_ctx *c, const fwd *f, md_ref r)
{
    value v = {0};
    switch (r.src) {
    case MD_SRC_LAYER: return c->vals[r.index];
    case MD_SRC_USER_DENSE: v.p = (void *)f->user_dense; v.rows = f->b->n_users; break;
    case MD_SRC_CAND_DENSE: v.p = (void *)f->cand_dense; v.rows = f->b->n_cands; break;
    default: break;
    }
    return v;
}

static enum md_domain ref_domain(const model_def *d, md_ref r)
{
    switch (r.src) {
    case MD_SRC_LAYER: return d->layers[r.index].domain;
    case MD_SRC_CAND_DENSE:
    case MD_SRC_CAND_SPARSE: return MD_CAND;
    default: return MD_USER;
    }
}

static int ref_width(const model_def *d, md_ref r)
{
    switch (r.src) {
    case MD_SRC_LAYER: return md_layer_width(&d->layers[r.index]);
    case MD_SRC_USER_DENSE: return d->user_dense;
    case MD_SRC_CAND_DENSE: return d->cand_dense;
    default: return 0;
    }
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
    int C = f->b->n_cands;
    void *dst = take(c, BK_TAG_BROADCAST, act_bytes(c, (size_t)C, (size_t)width));
    if (!c->dry && c->m->be->gather(c->s, src, NULL, f->map, C, NULL, width, dst, err)) return NULL;
    return c->dry ? (const void *)1 : dst;
}

/* A stack's buffer, taken the first time it or one of its in-place
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

/* Where layer li writes its rows x width output and with which row stride:
 * its own buffer, or its columns of the stack that reads it. */
static void *out_buf(ikbo_ctx *c, int li, int rows, int width, int *ld)
{
    const model_def *d = c->m->def;
    int s = c->m->into[li];
    *ld = width;
    if (s < 0) return take(c, dom_tag(d->layers[li].domain), act_bytes(c, (size_t)rows, (size_t)width));
    *ld = md_layer_width(&d->layers[s]);
    char *base = stack_base(c, s, rows);
    return c->dry ? NULL : base + (size_t)c->m->into_col[li] * c->m->be->act_size;
}

static int run_layer(ikbo_ctx *c, const fwd *f, int li, ikbo_err *err)
{
    const model_def *d = c->m->def;
    const md_layer *l = &d->layers[li];
    bk_backend *be = c->m->be;
    bk_weight *const *w = c->m->layer_w[li];
    const ikbo_batch *b = f->b;
    int U = b->n_users, C = b->n_cands;
    int rows = l->domain == MD_USER ? U : C;
    int width = md_layer_width(l);
    value *out = &c->vals[li];
    int bc = c->m->mode == IKBO_MODE_BROADCAST;

    out->offsets = NULL;
    out->rows = rows;

    switch (l->op) {
    case MD_RESHAPE:
    case MD_FLATTEN: /* views: same bytes, new shape */
        *out = input_value(c, f, l->in[0]);
        return 0;

    case MD_EMBEDDING_BAG: {
        int ld;
        out->p = out_buf(c, li, rows, width, &ld);
        TRY(be->embedding_bag(c->s, c->m->table_w[l->table], c->bag_ids[li], c->bag_off[li], rows,
                              l->pooling, out->p, ld, err));
        return 0;
    }

    case MD_HISTORY_EMBEDDING:
        out->rows = (int)f->n_events;
        out->offsets = f->h_off;
        out->p = take(c, BK_TAG_USER, act_bytes(c, (size_t)f->n_events, (size_t)width));
        TRY(be->history_embedding(c->s, c->m->table_w[l->table], w[0], w[1], f->h_ids,
                                  f->h_acts, f->h_off, U, out->p, err));
        return 0;

    case MD_MEAN_POOL: {
        value in = input_value(c, f, l->in[0]);
        out->p = take(c, dom_tag(l->domain), act_bytes(c, (size_t)rows, (size_t)width));
        TRY(be->mean_pool(c->s, in.p, in.offsets, rows, width, out->p, err));
        return 0;
    }

    case MD_LINEAR: {
        value in = input_value(c, f, l->in[0]);
        int w_in = ref_width(d, l->in[0]), ld;
        out->p = out_buf(c, li, rows, width, &ld);
        TRY(be->linear(c->s, in.p, w_in, rows, w[0], w[1], l->act, out->p, ld, err));
        return 0;
    }

    case MD_STACK: {
        out->p = stack_base(c, li, rows);
        size_t col = 0;
        for (int i = 0; i < l->n_in; i++) {
            value in = input_value(c, f, l->in[i]);
            int wi = ref_width(d, l->in[i]);
            int p = producer(d, l->in[i]);
            if (p >= 0 && c->m->into[p] == li) { /* already written in place */
                col += (size_t)wi;
                continue;
            }
            if (!c->dry &&
                be->copy_rows(c->s, in.p, wi, rows, wi,
                              (char *)out->p + col * be->act_size, width, err))
                return -1;
            col += (size_t)wi;
        }
        return 0;
    }

    case MD_ADD: {
        md_ref ra = l->in[0], rb = l->in[1];
        /* Put the candidate operand first so the user one is read via map. */
        if (ref_domain(d, ra) == MD_USER && ref_domain(d, rb) == MD_CAND) {
            md_ref t = ra;
            ra = rb;
            rb = t;
        }
        value a = input_value(c, f, ra), vb = input_value(c, f, rb);
        const void *bp = vb.p;
        const int32_t *map = NULL;
        if (l->domain == MD_CAND && ref_domain(d, rb) == MD_USER) {
            if (bc) {
                if (!(bp = broadcast_dense(c, f, vb.p, width, err))) return -1;
            } else {
                map = f->map;
                avoided(c, (size_t)C, (size_t)width);
            }
        }
        out->p = take(c, dom_tag(l->domain), act_bytes(c, (size_t)rows, (size_t)width));
        TRY(be->add(c->s, a.p, bp, map, rows, width, out->p, err));
        return 0;
    }

    case MD_LCE: {
        md_ref ru = l->in[0], rc = l->in[1];
        value eu = input_value(c, f, ru), ec = input_value(c, f, rc);
        int D = l->dim, M = l->tokens;
        int ku = ref_width(d, ru) / D, kc = ref_width(d, rc) / D;
        const void *eup = eu.p;
        const int32_t *map = f->map;
        int nu = U;
        if (bc) {
            if (!(eup = broadcast_dense(c, f, eu.p, ku * D, err))) return -1;
            map = f->identity;
            nu = C;
        }
        avoided(c, (size_t)C, (size_t)ku * D);
        out->p = take(c, BK_TAG_CAND, act_bytes(c, (size_t)C, (size_t)width));
        TRY(be->lce(c->s, eup, nu, ec.p, C, map, w[0], w[1], ku, kc, M, D, out->p, err));
        return 0;
    }

    case MD_TARGET_ATTENTION: {
        value q = input_value(c, f, l->in[0]), h = input_value(c, f, l->in[1]);
        int D = l->dim, tq = l->tokens, H = l->heads, dh = l->head_dim, hd = H * dh;
        const void *hp = h.p;
        const int64_t *hoff = h.offsets;
        const int32_t *map = f->map;
        int nu = U;
        int64_t ev = f->n_events;
        enum bk_tag kv_tag = BK_TAG_USER;
        if (bc) {
            /* The baseline: every candidate gets its own copy of the history,
             * and K/V are projected per candidate. */
            void *g = take(c, BK_TAG_BROADCAST, act_bytes(c, (size_t)f->bc_events, (size_t)D));
            if (!c->dry &&
                be->gather(c->s, h.p, h.offsets, f->map, C, f->bc_off, D, g, err))
                return -1;
            hp = g;
            hoff = f->bc_off;
            map = f->identity;
            nu = C;
            ev = f->bc_events;
            kv_tag = BK_TAG_BROADCAST;
        }
        /* The baseline copies the history and projects K and V per candidate. */
        avoided(c, (size_t)f->bc_events, (size_t)D + 2 * (size_t)hd);
        void *Q = take(c, BK_TAG_CAND, act_bytes(c, (size_t)C * tq, (size_t)hd));
        void *K = take(c, kv_tag, act_bytes(c, (size_t)ev, (size_t)hd));
        void *V = take(c, kv_tag, act_bytes(c, (size_t)ev, (size_t)hd));
        void *O = take(c, BK_TAG_CAND, act_bytes(c, (size_t)C * tq, (size_t)hd));
        out->p = take(c, BK_TAG_CAND, act_bytes(c, (size_t)C, (size_t)width));
        TRY(be->linear(c->s, q.p, D, C * tq, w[0], NULL, BK_ACT_NONE, Q, hd, err));
        TRY(be->linear(c->s, hp, D, (int)ev, w[1], NULL, BK_ACT_NONE, K, hd, err));
        TRY(be->linear(c->s, hp, D, (int)ev, w[2], NULL, BK_ACT_NONE, V, hd, err));
        TRY(be->attention(c->s, Q, K, V, hoff, nu, map, C, tq, H, dh, O, err));
        TRY(be->linear(c->s, O, hd, C * tq, w[3], NULL, BK_ACT_NONE, out->p, D, err));
        return 0;
    }
    }
    bk_seterr(err, "layer '%s': unsupported op", l->name);
    return -1;
}

/* One pass over the model; in the dry pass only sizes are summed. */
static int forward(ikbo_ctx *c, const ikbo_batch *b, ikbo_err *err)
{
    const model_def *d = c->m->def;
    bk_backend *be = c->m->be;
    int U = b->n_users, C = b->n_cands;
    fwd f = {.b = b};
    memset(c->stack_taken, 0, (size_t)d->n_layers);

    int bc = c->m->mode == IKBO_MODE_BROADCAST;

    /* Index arrays first, in arena order, into the host mirror. */
    int32_t *map = take(c, BK_TAG_INDEX, (size_t)C * sizeof(int32_t));
    if (!c->dry) memcpy(mirror(c, map), b->map, (size_t)C * sizeof(int32_t));
    f.map = map;
    if (d->has_history) put_history(c, b, &f.h_ids, &f.h_acts, &f.h_off, &f.n_events);
    for (int li = 0; li < d->n_layers; li++) {
        const md_layer *l = &d->layers[li];
        if (l->op != MD_EMBEDDING_BAG) continue;
        md_ref r = l->in[0];
        const ikbo_jagged *j =
            r.src == MD_SRC_USER_SPARSE ? &b->user_sparse[r.index] : &b->cand_sparse[r.index];
        put_jagged(c, j, l->domain == MD_USER ? U : C, &c->bag_ids[li], &c->bag_off[li]);
    }

    /* Per-candidate history offsets: what broadcast mode copies, and what
     * IKBO mode reports as avoided. */
    int32_t *id = bc ? take(c, BK_TAG_INDEX, (size_t)C * sizeof(int32_t)) : NULL;
    int64_t *bo = bc ? take(c, BK_TAG_INDEX, (size_t)(C + 1) * sizeof(int64_t)) : NULL;
    int64_t *hbo = bc && !c->dry ? mirror(c, bo) : NULL;
    int64_t ev = 0;
    if (hbo) hbo[0] = 0;
    for (int i = 0; d->has_history && i < C; i++) {
        int u = b->map[i];
        int64_t len = b->hist.offsets[u + 1] - b->hist.offsets[u];
        ev += len < d->hist_max_len ? len : d->hist_max_len;
        if (hbo) hbo[i + 1] = ev;
    }
    if (hbo && !d->has_history) memset(hbo, 0, (size_t)(C + 1) * sizeof(int64_t));
    f.bc_events = ev;
    if (bc) {
        if (ev > INT32_MAX) {
            bk_seterr(err, "batch: broadcast mode would copy %lld history events, over the engine's limit",
                      (long long)ev);
            return -1;
        }
        f.identity = id;
        f.bc_off = bo;
        if (!c->dry) {
            int32_t *hid = mirror(c, id);
            for (int i = 0; i < C; i++) hid[i] = i;
        }
    }
    if (!c->dry) {
        const arena *ix = &c->ar[BK_TAG_INDEX];
        if (ix->used && be->upload(c->s, ix->base, c->h_index, ix->used, err)) return -1;
    }

    if (d->user_dense) {
        void *p = take(c, BK_TAG_USER, act_bytes(c, (size_t)U, (size_t)d->user_dense));
        TRY(be->upload_f32(c->s, p, b->user_dense, (size_t)U * d->user_dense, err));
        f.user_dense = p;
    }
    if (d->cand_dense) {
        void *p = take(c, BK_TAG_CAND, act_bytes(c, (size_t)C, (size_t)d->cand_dense));
        TRY(be->upload_f32(c->s, p, b->cand_dense, (size_t)C * d->cand_dense, err));
        f.cand_dense = p;
    }

    for (int li = 0; li < d->n_layers; li++)
        if (run_layer(c, &f, li, err)) return -1;
    return 0;
}

int ikbo_score(ikbo_ctx *c, const ikbo_batch *b, float *task_scores, float *scores, ikbo_err *err)
{
    ikbo_model *m = c->m;
    const model_def *d = m->def;
    if (validate_batch(m, b, err)) return -1;
    for (int li = 0; li < d->n_layers; li++)
        if ((int64_t)b->n_cands * d->layers[li].tokens > INT32_MAX) {
            bk_seterr(err, "batch: %d candidates exceed the engine's limit", b->n_cands);
            return -1;
        }

    memset(c->need, 0, sizeof(c->need));
    c->dry = 1;
    int dry_rc = forward(c, b, err);
    c->dry = 0;
    if (dry_rc) return -1;
    c->avoided = 0;
    if (grow_arenas(c, err)) return -1;
    if (forward(c, b, err)) return -1;
    memcpy(c->last, c->need, sizeof(c->need));

    int C = b->n_cands, T = d->n_tasks;
    GROW(c->h_logits, c->h_logits_cap, (size_t)C * T);
    const value *lv = &c->vals[d->logits_layer];
    /* The batch's one wait: download_f32 returns with the stream idle. */
    if (m->be->download_f32(c->s, c->h_logits, lv->p, (size_t)C * T, err)) return -1;
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
