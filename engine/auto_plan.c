/* auto_plan.c - the automatic IKBO planner (auto_plan.h has the rules).
 *
 * Why this exists: see auto_plan.h. The pass walks the broadcast form in
 * file order and writes the rewritten layer list as JSON. A mixed stack or
 * concat is held back ("lazy": its parts remembered, nothing emitted) until
 * a consumer shows what it needs: its parts (Type I, dot_interaction), or
 * the whole tensor at C rows (built there and then, under its own name). A
 * rewritten layer always keeps the name of the layer it replaces, so every
 * later reference stays valid; helper layers get "<name>__<role>" names,
 * made unique against every name in the model.
 */
#include "auto_plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fold.h"
#include "op.h"
#include "plan.h"

/* One part of a lazy stack/concat: a value reference. */
typedef struct part {
    md_ref r;
    enum md_domain dom;
    int tokens, width;
} part;

typedef struct lazy {
    part *p;
    int n;
    int built; /* materialized at C rows */
} lazy;

typedef struct ap {
    const model_def *m;
    const json_t *src; /* the broadcast form's "layers" */
    json_t *out;       /* the rewritten "layers" */
    json_t *names;     /* every name in use (a set) */
    json_t *bcast;     /* source reference -> its broadcast layer's name */
    lazy *lz;          /* per broadcast-form layer; p == NULL: not lazy */
    ap_result *res;
    bk_err *err;
} ap;

static int oom(ap *a)
{
    bk_seterr(a->err, "%s: out of memory planning the model", a->m->dir);
    return -1;
}

static int is_lazy(const ap *a, md_ref r)
{
    return r.src == MD_SRC_LAYER && a->lz[r.index].p != NULL;
}

int ap_fresh_name(json_t *names, const char *base, const char *role, const char **out)
{
    char buf[512];
    for (int k = 1;; k++) {
        if (k == 1)
            snprintf(buf, sizeof buf, "%s__%s", base, role);
        else
            snprintf(buf, sizeof buf, "%s__%s%d", base, role, k);
        for (char *c = buf; *c; c++)
            if (*c == '.') *c = '_'; /* "user.dense" -> "user_dense__bcast" */
        if (!json_object_get(names, buf)) break;
    }
    if (json_object_set_new(names, buf, json_true())) return -1;
    *out = json_object_iter_key(json_object_iter_at(names, buf));
    return 0;
}

static int fresh_name(ap *a, const char *base, const char *role, const char **out)
{
    return ap_fresh_name(a->names, base, role, out) ? oom(a) : 0;
}

ap_layer *ap_emit(ap_result *r, json_t *arr, json_t *o, int origin, int copy)
{
    if (!o || json_array_append_new(arr, o)) return NULL;
    if (r->n == r->cap) {
        int cap = r->cap ? 2 * r->cap : 16;
        ap_layer *l = realloc(r->l, (size_t)cap * sizeof *l);
        if (!l) return NULL;
        r->l = l;
        r->cap = cap;
    }
    ap_layer *l = &r->l[r->n++];
    memset(l, 0, sizeof *l);
    l->origin = origin;
    l->copy = copy;
    return l;
}

/* Appends layer object o (stolen) with its origin; returns its ap_layer. */
static ap_layer *emit(ap *a, json_t *o, int origin, int copy)
{
    return ap_emit(a->res, a->out, o, origin, copy);
}

static json_t *names_of(const part *p, int n, const model_def *m, enum md_domain only, int any)
{
    json_t *arr = json_array();
    for (int k = 0; arr && k < n; k++)
        if (any || p[k].dom == only)
            if (json_array_append_new(arr, json_string(md_value_ref_text(m, p[k].r)))) {
                json_decref(arr);
                return NULL;
            }
    return arr;
}

/* A gatherer layer {"name", "op", "inputs"}. */
static json_t *gatherer(const char *name, const char *op, json_t *inputs)
{
    if (!inputs) return NULL;
    return json_pack("{s:s, s:s, s:o}", "name", name, "op", op, "inputs", inputs);
}

/* Builds lazy layer j at C rows, under its own name (rule 3). */
static int materialize(ap *a, int j, int consumer)
{
    lazy *z = &a->lz[j];
    if (z->built) return 0;
    const md_layer *l = &a->m->layers[j];
    json_t *o = gatherer(l->name, md_ops[l->op]->name, names_of(z->p, z->n, a->m, MD_USER, 1));
    if (!emit(a, o, j, 1)) return oom(a);
    z->built = 1;
    md_plan_entry *e = &a->res->e[j];
    e->rw = MD_RW_MAP_READ;
    snprintf(e->note, sizeof e->note,
             "built at C rows for '%s' (%s), its user parts read through the map",
             a->m->layers[consumer].name, md_ops[a->m->layers[consumer].op]->name);
    return 0;
}

/* The side of lazy z as one operand: its only part there, or a new
 * gatherer of those parts (at that side's rows). *cols gets the parts'
 * column (unit: tokens for a stack, elements for a concat) indices. */
static int side_operand(ap *a, int i, const lazy *z, enum md_domain side, const char **name,
                        int **cols, int *n_cols)
{
    const md_layer *l = &a->m->layers[i];
    int n = 0, total = 0, c = 0, only = -1;
    int stack = l->op == MD_TOKEN_LINEAR; /* else a linear over a concat */
    for (int k = 0; k < z->n; k++) {
        if (z->p[k].dom == side) n++, only = k;
        total += z->p[k].width;
    }
    if (!(*cols = malloc((size_t)total * sizeof(int)))) return oom(a);
    *n_cols = 0;
    for (int k = 0; k < z->n; k++) {
        int w = stack ? z->p[k].tokens : z->p[k].width;
        if (z->p[k].dom == side)
            for (int t = 0; t < w; t++) (*cols)[(*n_cols)++] = c + t;
        c += w;
    }
    if (n == 1) {
        *name = md_value_ref_text(a->m, z->p[only].r);
        return 0;
    }
    if (fresh_name(a, l->name, side == MD_USER ? "user" : "cand", name)) return -1;
    json_t *o = gatherer(*name, stack ? "stack" : "concat", names_of(z->p, z->n, a->m, side, 0));
    return emit(a, o, i, 0) ? 0 : oom(a);
}

static void split_note(md_plan_entry *e, const char *what, int rows, int nu, int nc, int unit_tok)
{
    snprintf(e->split, sizeof e->split, "%s [%d, %d] -> user %s %d, candidate %s %d", what, rows,
             nu + nc, unit_tok ? "tokens" : "columns", nu, unit_tok ? "tokens" : "columns", nc);
}

/* token_linear over a mixed stack -> lce (rule 2). */
static int rewrite_token_linear(ap *a, int i, const lazy *z)
{
    const md_layer *l = &a->m->layers[i];
    const char *un, *cn;
    int *uc = NULL, *cc = NULL, nu, nc;
    if (side_operand(a, i, z, MD_USER, &un, &uc, &nu) ||
        side_operand(a, i, z, MD_CAND, &cn, &cc, &nc)) {
        free(uc);
        free(cc);
        return -1;
    }
    json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:i}", "name", l->name, "op", "lce", "user", un,
                          "candidate", cn, "out_tokens", l->tokens);
    ap_layer *al = emit(a, o, i, 0);
    if (!al) {
        free(uc);
        free(cc);
        return oom(a);
    }
    al->w[0] = (ap_wsrc){.src = i, .src_w = 0, .cols = uc, .n_cols = nu};
    al->w[1] = (ap_wsrc){.src = i, .src_w = 0, .cols = cc, .n_cols = nc};
    al->n_w = 2;
    md_plan_entry *e = &a->res->e[i];
    e->rw = MD_RW_TYPE1;
    snprintf(e->note, sizeof e->note, "token_linear over a mixed stack runs as lce");
    split_note(e, "weight", l->tokens, nu, nc, 1);
    return 0;
}

/* linear over a mixed concat -> linear(user) at U + linear(cand) through
 * the map, then the activation (rule 2). */
static int rewrite_linear(ap *a, int i, const lazy *z, const json_t *src)
{
    const md_layer *l = &a->m->layers[i];
    const char *un, *cn, *lu, *lc, *sum = l->name;
    int *uc = NULL, *cc = NULL, nu, nc;
    const char *act = json_string_value(json_object_get(src, "activation"));
    int has_act = act && strcmp(act, "none") != 0;
    if (side_operand(a, i, z, MD_USER, &un, &uc, &nu) ||
        side_operand(a, i, z, MD_CAND, &cn, &cc, &nc) || fresh_name(a, l->name, "u", &lu) ||
        fresh_name(a, l->name, "c", &lc) || (has_act && fresh_name(a, l->name, "sum", &sum)))
        goto fail;
    ap_layer *u = emit(a, json_pack("{s:s, s:s, s:s, s:i}", "name", lu, "op", "linear", "input",
                                    un, "out", l->dim), i, 0);
    if (!u) goto nomem;
    u->w[0] = (ap_wsrc){.src = i, .src_w = 0, .cols = uc, .n_cols = nu};
    u->w[1] = (ap_wsrc){.src = -1}; /* the bias is the candidate side's */
    u->n_w = 2;
    uc = NULL;
    ap_layer *c = emit(a, json_pack("{s:s, s:s, s:s, s:i}", "name", lc, "op", "linear", "input",
                                    cn, "out", l->dim), i, 0);
    if (!c) goto nomem;
    c->w[0] = (ap_wsrc){.src = i, .src_w = 0, .cols = cc, .n_cols = nc};
    c->w[1] = (ap_wsrc){.src = i, .src_w = 1};
    c->n_w = 2;
    cc = NULL;
    if (!emit(a, json_pack("{s:s, s:s, s:[s, s]}", "name", sum, "op", "add", "inputs", lc, lu), i,
              0))
        goto nomem;
    if (has_act && !emit(a, json_pack("{s:s, s:s, s:s, s:s}", "name", l->name, "op", "activation",
                                      "input", sum, "fn", act), i, 0))
        goto nomem;
    md_plan_entry *e = &a->res->e[i];
    e->rw = MD_RW_TYPE1;
    snprintf(e->note, sizeof e->note,
             "linear over a mixed concat: W_u user at U (no bias) + W_c candidate + b, added "
             "through the map%s", has_act ? ", then the activation" : "");
    split_note(e, "weight", l->dim, nu, nc, 0);
    return 0;
nomem:
    oom(a);
fail:
    free(uc);
    free(cc);
    return -1;
}

/* The broadcast layer of user value r (one per value, shared by every
 * reader): its name in *name (rule 4). */
static int broadcast_of(ap *a, int i, md_ref r, const char **name)
{
    const char *t = md_value_ref_text(a->m, r);
    json_t *have = json_object_get(a->bcast, t);
    if (have) {
        *name = json_string_value(have);
        return 0;
    }
    if (fresh_name(a, t, "bcast", name)) return -1;
    json_t *o = json_pack("{s:s, s:s, s:s}", "name", *name, "op", "broadcast", "input", t);
    if (!emit(a, o, i, 0) || json_object_set_new(a->bcast, t, json_string(*name))) return oom(a);
    return 0;
}

/* The reference keys of a layer object (every key that names an input). */
static const char *const ref_keys[] = {"input", "inputs", "query", "history", "user",
                                       "candidate", "a", "b", "x0", "experts", "gate", NULL};

/* In layer object o, every reference to `from` becomes `to`. */
static int replace_ref(json_t *o, const char *from, const char *to)
{
    for (const char *const *k = ref_keys; *k; k++) {
        json_t *v = json_object_get(o, *k);
        if (json_is_string(v) && strcmp(json_string_value(v), from) == 0) {
            if (json_object_set_new(o, *k, json_string(to))) return -1;
        } else if (json_is_array(v)) {
            for (size_t j = 0; j < json_array_size(v); j++) {
                json_t *x = json_array_get(v, j);
                if (json_is_string(x) && strcmp(json_string_value(x), from) == 0 &&
                    json_array_set_new(v, j, json_string(to)))
                    return -1;
            }
        }
    }
    return 0;
}

static int is_mixing(enum md_op op)
{
    return op == MD_ADD || op == MD_MUL || op == MD_LCE || op == MD_TARGET_ATTENTION ||
           op == MD_DIN_ATTENTION;
}

/* dot_interaction: each lazy stack input replaced by its parts. */
static int rewrite_dot(ap *a, int i, json_t *o)
{
    const md_layer *l = &a->m->layers[i];
    json_t *inputs = json_array();
    int spliced = 0, mixed = 0;
    if (!inputs || json_object_set_new(o, "inputs", inputs)) return oom(a);
    for (int k = 0; k < l->n_in; k++) {
        md_ref r = l->in[k];
        const lazy *z = is_lazy(a, r) ? &a->lz[r.index] : NULL;
        if (z && a->m->layers[r.index].op == MD_STACK) {
            for (int j = 0; j < z->n; j++) {
                mixed |= z->p[j].dom == MD_USER;
                if (json_array_append_new(inputs, json_string(md_value_ref_text(a->m, z->p[j].r))))
                    return oom(a);
            }
            spliced = 1;
            continue;
        }
        if (z && materialize(a, r.index, i)) return -1;
        mixed |= md_ref_domain(a->m, r) == MD_USER;
        if (json_array_append_new(inputs, json_string(md_value_ref_text(a->m, r)))) return oom(a);
    }
    md_plan_entry *e = &a->res->e[i];
    e->rw = mixed ? MD_RW_IKBO : MD_RW_CAND;
    if (spliced)
        snprintf(e->note, sizeof e->note,
                 "over the mixed stack's parts: user-user pairs once per user, user tokens read "
                 "through the map");
    return emit(a, o, i, 1) ? 0 : oom(a);
}

/* Rule 4 and the rest: lazy inputs built, user inputs of a non-mixing op
 * broadcast. */
static int rewrite_other(ap *a, int i, json_t *o)
{
    const md_layer *l = &a->m->layers[i];
    md_plan_entry *e = &a->res->e[i];
    int user = 0;
    for (int k = 0; k < l->n_in; k++) {
        md_ref r = l->in[k];
        if (is_lazy(a, r)) {
            if (materialize(a, r.index, i)) return -1;
            continue;
        }
        if (md_ref_domain(a->m, r) != MD_USER) continue;
        user = 1;
        if (is_mixing(l->op)) continue;
        const char *t = md_value_ref_text(a->m, r), *b;
        if (md_ref_width(a->m, r) == 0 ||
            (r.src == MD_SRC_LAYER && a->m->layers[r.index].kind == MD_JAGGED)) {
            bk_seterr(a->err,
                      "%s: layer '%s': op '%s' reads the user history or a jagged user value at "
                      "candidate rows; only target_attention and din_attention can",
                      a->m->dir, l->name, md_ops[l->op]->name);
            return -1;
        }
        if (broadcast_of(a, i, r, &b) || replace_ref(o, t, b)) return -1;
        e->rw = MD_RW_GATHER;
        size_t n = strlen(e->note);
        snprintf(e->note + n, sizeof e->note - n, "%s'%s'", n ? ", " : "", t);
    }
    if (e->rw == MD_RW_GATHER) {
        char tmp[sizeof e->note + 96];
        snprintf(tmp, sizeof tmp, "op '%s' cannot read user rows through the map: %s copied to C rows",
                 md_ops[l->op]->name, e->note);
        size_t n = strlen(tmp) < sizeof e->note ? strlen(tmp) : sizeof e->note - 1;
        memcpy(e->note, tmp, n);
        e->note[n] = 0;
    } else {
        e->rw = user ? MD_RW_IKBO : MD_RW_CAND;
    }
    return emit(a, o, i, 1) ? 0 : oom(a);
}

/* A mixed stack/concat: its parts, nested lazies of the same op spliced. */
static int make_lazy(ap *a, int i)
{
    const md_layer *l = &a->m->layers[i];
    lazy *z = &a->lz[i];
    int n = 0;
    for (int k = 0; k < l->n_in; k++) {
        md_ref r = l->in[k];
        n += is_lazy(a, r) && a->m->layers[r.index].op == l->op ? a->lz[r.index].n : 1;
    }
    if (!(z->p = calloc((size_t)n, sizeof *z->p))) return oom(a);
    for (int k = 0; k < l->n_in; k++) {
        md_ref r = l->in[k];
        if (is_lazy(a, r) && a->m->layers[r.index].op == l->op) {
            const lazy *y = &a->lz[r.index];
            memcpy(z->p + z->n, y->p, (size_t)y->n * sizeof *y->p);
            z->n += y->n;
        } else {
            z->p[z->n++] = (part){.r = r, .dom = md_ref_domain(a->m, r),
                                  .tokens = md_ref_tokens(a->m, r), .width = md_ref_width(a->m, r)};
        }
    }
    a->res->e[i].rw = MD_RW_SPLICED;
    snprintf(a->res->e[i].note, sizeof a->res->e[i].note,
             "mixed: never built, its readers take its parts");
    return 0;
}

static int plan_one(ap *a, int i)
{
    const md_layer *l = &a->m->layers[i];
    int lazy_in = 0, user_in = 0;
    for (int k = 0; k < l->n_in; k++) {
        lazy_in |= is_lazy(a, l->in[k]);
        user_in |= md_ref_domain(a->m, l->in[k]) == MD_USER;
    }
    md_plan_entry *e = &a->res->e[i];
    e->rw = l->domain == MD_USER ? MD_RW_USER : MD_RW_CAND;
    if (l->domain == MD_CAND && (l->op == MD_STACK || l->op == MD_CONCAT) && (user_in || lazy_in))
        return make_lazy(a, i);
    if (lazy_in && l->op == MD_TOKEN_LINEAR && a->m->layers[l->in[0].index].op == MD_STACK)
        return rewrite_token_linear(a, i, &a->lz[l->in[0].index]);
    if (lazy_in && l->op == MD_LINEAR && a->m->layers[l->in[0].index].op == MD_CONCAT)
        return rewrite_linear(a, i, &a->lz[l->in[0].index], json_array_get(a->src, (size_t)i));
    json_t *o = json_deep_copy(json_array_get(a->src, (size_t)i));
    if (!o) return oom(a);
    if (l->domain == MD_USER) return emit(a, o, i, 1) ? 0 : oom(a);
    if (l->op == MD_DOT_INTERACTION) return rewrite_dot(a, i, o);
    return rewrite_other(a, i, o);
}

static int plan_all(ap *a)
{
    const model_def *m = a->m;
    for (int i = 0; i < m->n_layers; i++) {
        md_plan_entry *e = &a->res->e[i];
        if (!(e->name = strdup(m->layers[i].name))) return oom(a);
        e->op = m->layers[i].op;
        e->domain = m->layers[i].domain;
        if (json_object_set_new(a->names, m->layers[i].name, json_true())) return oom(a);
    }
    for (int i = 0; i < m->n_layers; i++)
        if (plan_one(a, i)) return -1;
    if (a->lz[m->logits_layer].p) return materialize(a, m->logits_layer, m->logits_layer);
    return 0;
}

int ap_rewrite(const model_def *m, const json_t *root, ap_result **out, bk_err *err)
{
    ap a = {.m = m, .src = json_object_get(root, "layers"), .err = err};
    ap_result *r = calloc(1, sizeof *r);
    a.res = r;
    a.out = json_array();
    a.names = json_object();
    a.bcast = json_object();
    a.lz = calloc((size_t)m->n_layers, sizeof *a.lz);
    int rc = -1;
    if (!r || !a.out || !a.names || !a.bcast || !a.lz ||
        !(r->e = calloc((size_t)m->n_layers, sizeof *r->e))) {
        oom(&a);
        goto out;
    }
    r->n_e = m->n_layers;
    if (plan_all(&a)) goto out;
    if (!(r->root = json_deep_copy(root)) || json_object_del(r->root, "planning") ||
        json_object_set(r->root, "layers", a.out)) {
        oom(&a);
        goto out;
    }
    rc = 0;
out:
    json_decref(a.out);
    json_decref(a.names);
    json_decref(a.bcast);
    for (int i = 0; a.lz && i < m->n_layers; i++) free(a.lz[i].p);
    free(a.lz);
    if (rc == 0)
        *out = r;
    else
        ap_result_free(r);
    return rc;
}

/* Columns cols[0..n) of w, as a new weight (*sub; -1: out of memory). */
static int cols_of(const md_weight *w, const int *cols, int n, md_weight *sub)
{
    *sub = (md_weight){.rows = w->rows, .cols = n};
    if (!(sub->data = malloc(((size_t)w->rows * n + 1) * sizeof(float)))) return -1;
    for (int r = 0; r < w->rows; r++)
        for (int c = 0; c < n; c++) sub->data[(size_t)r * n + c] = w->data[(size_t)r * w->cols + cols[c]];
    return 0;
}

/* The folded weight of w over s's cols (all of w without cols) into to. */
static int fold_cols(const ap_wsrc *s, const md_weight *w, const md_weight *w_top, md_weight *to)
{
    if (!s->cols) return fold_weight(w, w_top, s->fold_d, to);
    md_weight sub;
    if (cols_of(w, s->cols, s->n_cols, &sub)) return -1;
    int rc = fold_weight(&sub, w_top, s->fold_d, to);
    free(sub.data);
    return rc;
}

/* fold.h's composed user part: AP_COMP_WEIGHT, [the fold over cols | the
 * ccols tokens' columns composed with comp_src's weight]; AP_COMP_BIAS,
 * those columns times comp_src's bias. */
static int take_composed(const ap_wsrc *s, model_def *from, const md_weight *w, md_weight *to)
{
    const md_weight *w_top = &from->layers[s->fold_src].w[0];
    const md_layer *q = &from->layers[s->comp_src];
    if (s->comp == AP_COMP_BIAS) {
        if (!(to->data = malloc(((size_t)to->rows * to->cols + 1) * sizeof(float)))) return -1;
        return fold_compose(w, s->ccols, s->n_ccols, w_top, s->fold_d, q->w[1].data, 1,
                            (size_t)to->rows * to->cols, to->data, 1);
    }
    md_weight keep = {.rows = to->rows, .cols = s->n_cols * s->fold_d};
    const int in = q->w[0].cols;
    if (to->cols != keep.cols + in || fold_cols(s, w, w_top, &keep)) return -1;
    if (!(to->data = malloc(((size_t)to->rows * to->cols + 1) * sizeof(float)))) {
        free(keep.data);
        return -1;
    }
    for (int r = 0; r < to->rows; r++)
        memcpy(to->data + (size_t)r * to->cols, keep.data + (size_t)r * keep.cols,
               (size_t)keep.cols * sizeof(float));
    free(keep.data);
    return fold_compose(w, s->ccols, s->n_ccols, w_top, s->fold_d, q->w[0].data, in, to->rows,
                        to->data + keep.cols, to->cols);
}

/* One weight: columns of the source (or all of it), or zeros. */
static int take_one(const ap_wsrc *s, model_def *from, md_weight *to)
{
    size_t n = (size_t)to->rows * to->cols;
    md_weight *w = s->src < 0 ? NULL : &from->layers[s->src].w[s->src_w];
    if (w && !w->data) return 0; /* planned without weights */
    if (s->comp) return take_composed(s, from, w, to);
    if (s->fold_d > 0) {
        if (fold_cols(s, w, &from->layers[s->fold_src].w[0], to)) return -1;
        for (int k = 0; k < s->n_wo; k++) {
            const md_layer *a = &from->layers[s->wo[k].layer];
            if (fold_compose_wo(to, s->fold_d, s->wo[k].tok, a->tokens, &a->w[3])) return -1;
        }
        return 0;
    }
    if (!(to->data = malloc((n ? n : 1) * sizeof(float)))) return -1;
    for (int r = 0; r < to->rows; r++)
        for (int c = 0; c < to->cols; c++)
            to->data[(size_t)r * to->cols + c] =
                w ? w->data[(size_t)r * w->cols + (size_t)(s->cols ? s->cols[c] : c)] : 0.0f;
    return 0;
}

int ap_take_weights(const ap_result *r, model_def *from, model_def *to, bk_err *err)
{
    for (int k = 0; k < r->n && k < to->n_layers; k++) {
        const ap_layer *al = &r->l[k];
        md_layer *l = &to->layers[k];
        md_layer *o = &from->layers[al->origin];
        l->origin = al->origin;
        for (int j = 0; j < l->n_w; j++) {
            if (al->copy) { /* the same layer: its weights move */
                l->w[j].data = o->w[j].data;
                o->w[j].data = NULL;
            } else if (j < al->n_w && take_one(&al->w[j], from, &l->w[j])) {
                bk_seterr(err, "%s: out of memory building the weights of layer '%s'",
                          from->dir, o->name);
                return -1;
            }
        }
    }
    for (int t = 0; t < to->n_tables && t < from->n_tables; t++) {
        to->tables[t].w.data = from->tables[t].w.data;
        from->tables[t].w.data = NULL;
    }
    return 0;
}

void ap_result_free(ap_result *r)
{
    if (!r) return;
    json_decref(r->root);
    for (int k = 0; k < r->n; k++)
        for (int j = 0; j < r->l[k].n_w; j++) {
            free(r->l[k].w[j].cols);
            free(r->l[k].w[j].ccols);
        }
    free(r->l);
    for (int i = 0; r->e && i < r->n_e; i++) free(r->e[i].name);
    free(r->e);
    free(r);
}
