/* model_load.c - load, validate and plan an ikbo-model/1 directory (model.h).
 *
 * Why this exists: model.json and weights.safetensors come from exporters and
 * people; the executor must be able to trust every index, shape and weight it
 * walks. This file enforces shared/MODEL_FORMAT.md strictly - unknown keys,
 * wrong types, forward references, domain mixing outside the IKBO ops, shape
 * mismatches, missing/extra/non-finite weights are all refused with one line
 * naming the file, the layer or tensor, and the problem - and infers every
 * layer's domain and shape in file order.
 *
 * Order of work: model.json is parsed and planned completely (the expected
 * weights get their names and shapes), then the safetensors header is
 * validated and matched against the expectations, and only then is tensor
 * data read and converted to fp32.
 */
#define _POSIX_C_SOURCE 200809L /* pread, strdup, O_CLOEXEC */

#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "auto_plan.h"
#include "fold.h"
#include "json_schema.h"
#include "model.h"
#include "op.h"
#include "plan.h"
#include "safetensors.h"
#include "serving.h"

#define FORMAT_ID "ikbo-model/1"
#define MODEL_JSON_MAX ((size_t)16 << 20)
/* Every count and every row width (tokens * dim) fits an int. */
#define MD_MAX_DIM ((long long)INT_MAX)

#define QBUF (JS_QUOTE_MAX * 4 + 8)

/* The ops that read user rows through the map (MODEL_FORMAT.md). */
#define MIXING_OPS "lce, target_attention, din_attention, add, mul and dot_interaction"

/* A name -> index entry, for sorted lookup (hostile files can hold millions of
 * names; nothing here is quadratic). */
typedef struct nent {
    const char *s;
    int i;
} nent;

typedef md_shape shp;

typedef struct ld {
    js_ctx jc;   /* file = jfile */
    char *jfile; /* "<dir>/model.json", sanitized for messages */
    char *wfile; /* "<dir>/weights.safetensors" */
    bk_err *err;
    model_def *m;
    nent *lidx, *tidx, *uidx, *cidx; /* layers, tables, user/cand sparse, sorted */
    enum op_pass pass;
    json_t *root; /* the document, kept for the auto planner */
    int no_fold;  /* MD_LOAD_NO_FOLD: lce chains stay as written */
} ld;

enum ref_kind { REF_VALUE, REF_SPARSE, REF_HISTORY };


/* ------------------------------------------------------------ helpers */

static char *xstrdup(ld *L, const char *s)
{
    char *p = strdup(s);
    if (!p)
        js_fail(&L->jc, "out of memory");
    return p;
}

static int nent_cmp(const void *a, const void *b)
{
    const nent *x = a, *y = b;
    int c = strcmp(x->s, y->s);
    return c ? c : (x->i > y->i) - (x->i < y->i);
}

static int nent_key_cmp(const void *key, const void *b)
{
    return strcmp((const char *)key, ((const nent *)b)->s);
}

/* Sorts e[0..n); returns -1 if all names are unique, else sets first and dup to
 * the earliest (by dup) pair of equal names. */
static int nent_sort_dups(nent *e, int n, int *first, int *dup)
{
    int found = 0;
    if (n > 1)
        qsort(e, (size_t)n, sizeof *e, nent_cmp);
    for (int k = 0; k + 1 < n; k++)
        if (strcmp(e[k].s, e[k + 1].s) == 0 && (!found || e[k + 1].i < *dup)) {
            *first = e[k].i;
            *dup = e[k + 1].i;
            found = 1;
        }
    return found ? 0 : -1;
}

static int nent_find(const nent *e, int n, const char *s)
{
    if (!e || n <= 0)
        return -1;
    const nent *r = bsearch(s, e, (size_t)n, sizeof *e, nent_key_cmp);
    return r ? r->i : -1;
}

static shp layer_shape(const md_layer *l)
{
    shp s = {l->domain, l->kind, l->tokens, l->dim};
    return s;
}

/* Array of unique non-empty strings -> strdup'd copies. */
static int parse_name_list(ld *L, const json_t *arr, const char *path, const char *pre,
                           char ***out, int *n_out, nent **idx_out)
{
    size_t n = json_array_size(arr);
    char q[QBUF];
    if (n > (size_t)MD_MAX_DIM) {
        js_fail(&L->jc, "%s'%s' has too many entries", pre, path);
        return -1;
    }
    char **v = calloc(n ? n : 1, sizeof *v);
    nent *e = calloc(n ? n : 1, sizeof *e);
    *out = v;
    *n_out = 0;
    if (!v || !e) {
        free(e);
        js_fail(&L->jc, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *s = json_array_get(arr, i);
        if (!json_is_string(s)) {
            js_fail(&L->jc, "%s'%s[%zu]' must be a string, got %s", pre, path, i,
                    js_type_name(s));
            goto fail;
        }
        if (json_string_length(s) == 0 || strlen(json_string_value(s)) != json_string_length(s)) {
            js_fail(&L->jc, "%s'%s[%zu]' must be a non-empty name", pre, path, i);
            goto fail;
        }
        if (!(v[i] = xstrdup(L, json_string_value(s))))
            goto fail;
        (*n_out)++;
        e[i].s = v[i];
        e[i].i = (int)i;
    }
    int a, b;
    if (nent_sort_dups(e, (int)n, &a, &b) == 0) {
        js_fail(&L->jc, "%s'%s[%d]': duplicate name '%s' (also %s[%d])", pre, path, b,
                js_quote(q, v[b]), path, a);
        goto fail;
    }
    if (idx_out)
        *idx_out = e;
    else
        free(e);
    return 0;
fail:
    free(e);
    return -1;
}

/* -------------------------------------------------------------- inputs */

static int parse_side(ld *L, const json_t *obj, int user)
{
    static const char *const ukeys[] = {"dense", "sparse", "history", NULL};
    static const char *const ckeys[] = {"dense", "sparse", NULL};
    static const char *const hkeys[] = {"max_len", "actions", NULL};
    model_def *m = L->m;
    const char *path = user ? "inputs.user" : "inputs.candidate";
    long long dense, v;
    json_t *sparse, *hist;

    if (js_check_keys(&L->jc, obj, path, "", user ? ukeys : ckeys) ||
        js_get_int(&L->jc, obj, path, "", "dense", 0, 0, 0, MD_MAX_DIM, &dense) ||
        js_get_arr(&L->jc, obj, path, "", "sparse", 0, &sparse))
        return -1;
    if (user)
        m->user_dense = (int)dense;
    else
        m->cand_dense = (int)dense;
    if (sparse) {
        char p[64];
        snprintf(p, sizeof p, "%s.sparse", path);
        if (user ? parse_name_list(L, sparse, p, "", &m->user_sparse, &m->n_user_sparse, &L->uidx)
                 : parse_name_list(L, sparse, p, "", &m->cand_sparse, &m->n_cand_sparse, &L->cidx))
            return -1;
    }
    if (!user)
        return 0;
    if (js_get_obj(&L->jc, obj, path, "", "history", 0, &hist))
        return -1;
    if (hist) {
        const char *hp = "inputs.user.history";
        if (js_check_keys(&L->jc, hist, hp, "", hkeys) ||
            js_get_int(&L->jc, hist, hp, "", "max_len", 1, 0, 1, MD_MAX_DIM, &v))
            return -1;
        m->hist_max_len = (int)v;
        if (js_get_int(&L->jc, hist, hp, "", "actions", 0, 1, 1, MD_MAX_DIM, &v))
            return -1;
        m->hist_actions = (int)v;
        m->has_history = 1;
    }
    return 0;
}

static int parse_inputs(ld *L, const json_t *inputs)
{
    static const char *const keys[] = {"user", "candidate", NULL};
    json_t *u, *c;
    if (js_check_keys(&L->jc, inputs, "inputs", "", keys) ||
        js_get_obj(&L->jc, inputs, "inputs", "", "user", 0, &u) ||
        js_get_obj(&L->jc, inputs, "inputs", "", "candidate", 0, &c))
        return -1;
    if (u && parse_side(L, u, 1))
        return -1;
    if (c && parse_side(L, c, 0))
        return -1;
    return 0;
}

/* -------------------------------------------------------------- tables */

static int parse_tables(ld *L, const json_t *tables)
{
    static const char *const keys[] = {"rows", "dim", NULL};
    model_def *m = L->m;
    size_t n = json_object_size(tables);
    const char *key;
    json_t *t;
    char q[QBUF], path[QBUF + 16];

    if (n > (size_t)MD_MAX_DIM) {
        js_fail(&L->jc, "'tables' has too many entries");
        return -1;
    }
    m->tables = calloc(n ? n : 1, sizeof *m->tables);
    L->tidx = calloc(n ? n : 1, sizeof *L->tidx);
    if (!m->tables || !L->tidx) {
        js_fail(&L->jc, "out of memory");
        return -1;
    }
    json_object_foreach((json_t *)tables, key, t) {
        md_table *tb = &m->tables[m->n_tables];
        long long rows, dim;
        js_path(path, sizeof path, "tables", key);
        if (key[0] == 0) {
            js_fail(&L->jc, "'tables' has an empty table name");
            return -1;
        }
        if (!json_is_object(t)) {
            js_fail(&L->jc, "'%s' must be an object, got %s", path, js_type_name(t));
            return -1;
        }
        if (js_check_keys(&L->jc, t, path, "", keys) ||
            js_get_int(&L->jc, t, path, "", "rows", 1, 0, 1, MD_MAX_DIM, &rows) ||
            js_get_int(&L->jc, t, path, "", "dim", 1, 0, 1, MD_MAX_DIM, &dim))
            return -1;
        if (!(tb->name = xstrdup(L, key)))
            return -1;
        m->n_tables++;
        tb->rows = (int)rows;
        tb->dim = (int)dim;
        size_t ln = strlen(key) + sizeof "tables.";
        if (!(tb->w.name = malloc(ln))) {
            js_fail(&L->jc, "out of memory");
            return -1;
        }
        snprintf(tb->w.name, ln, "tables.%s", key);
        tb->w.rows = tb->rows;
        tb->w.cols = tb->dim;
        L->tidx[m->n_tables - 1].s = tb->name;
        L->tidx[m->n_tables - 1].i = m->n_tables - 1;
    }
    int a, b;
    if (nent_sort_dups(L->tidx, m->n_tables, &a, &b) == 0) { /* jansson rejects this first */
        js_fail(&L->jc, "duplicate table '%s'", js_quote(q, m->tables[b].name));
        return -1;
    }
    return 0;
}

/* -------------------------------------------------------------- layers */

/* Whether the op takes an input of this kind (accept: OP_ACC_*), with the
 * message that says what it reads instead. q: the quoted reference. */
static int check_accept(ld *L, const char *pre, const char *what, const char *q, const char *opn,
                        enum ref_kind kind, int accept)
{
    int want = kind == REF_SPARSE ? OP_ACC_SPARSE : kind == REF_HISTORY ? OP_ACC_HISTORY
                                                                        : OP_ACC_VALUE;
    if (accept & want)
        return 0;
    if (accept & OP_ACC_SPARSE)
        js_fail(&L->jc, "%sembedding_bag input must be a sparse feature (user.sparse.<f> or "
                        "candidate.sparse.<f>), got '%s'",
                pre, q);
    else if (accept & OP_ACC_HISTORY)
        js_fail(&L->jc, "%shistory_embedding input must be 'user.history', got '%s'", pre, q);
    else if (kind == REF_SPARSE)
        js_fail(&L->jc, "%s%s '%s' is a sparse feature; only embedding_bag reads sparse "
                        "features (op '%s')",
                pre, what, q, opn);
    else
        js_fail(&L->jc, "%s%s 'user.history' is the raw history; only history_embedding "
                        "reads it (op '%s')",
                pre, what, opn);
    return -1;
}

/* Resolves one input reference of layer i. `what` names the role for
 * messages ("input", "query", "inputs[2]"). */
static int resolve(ld *L, int i, const char *pre, const char *what, const char *r, int accept,
                   md_ref *ref, shp *s, enum ref_kind *kind_out)
{
    model_def *m = L->m;
    const md_layer *l = &m->layers[i];
    const char *opn = md_ops[l->op]->name;
    char q[QBUF], q2[QBUF];
    enum ref_kind kind = REF_VALUE;
    int user = 0;
    const char *rest = NULL;

    js_quote(q, r);
    memset(s, 0, sizeof *s);
    s->tokens = 1;
    if (strncmp(r, "user.", 5) == 0) {
        user = 1;
        rest = r + 5;
    } else if (strncmp(r, "candidate.", 10) == 0) {
        rest = r + 10;
    }

    if (rest) {
        s->dom = user ? MD_USER : MD_CAND;
        if (strcmp(rest, "dense") == 0) {
            kind = REF_VALUE;
        } else if (user && strcmp(rest, "history") == 0) {
            kind = REF_HISTORY;
        } else if (strncmp(rest, "sparse.", 7) == 0) {
            kind = REF_SPARSE;
        } else {
            js_fail(&L->jc,
                    "%s%s '%s' is not a model input (those are user.dense, user.sparse.<f>, "
                    "user.history, candidate.dense, candidate.sparse.<f>) nor a layer",
                    pre, what, q);
            return -1;
        }
    } else if (strchr(r, '.')) {
        js_fail(&L->jc, "%sunknown %s '%s': no layer of that name (layer names have no '.'), "
                        "and not a user.* or candidate.* input",
                pre, what, q);
        return -1;
    }

    if (check_accept(L, pre, what, q, opn, kind, accept))
        return -1;

    if (!rest) { /* a layer */
        int j = nent_find(L->lidx, m->n_layers, r);
        if (j < 0) {
            js_fail(&L->jc, "%sunknown %s '%s': no layer or model input of that name", pre, what,
                    q);
            return -1;
        }
        if (j == i) {
            js_fail(&L->jc, "%s%s '%s' is the layer itself", pre, what, q);
            return -1;
        }
        if (j > i) {
            js_fail(&L->jc,
                    "%s%s '%s' is defined later (layers[%d]); a layer may only read layers "
                    "above it",
                    pre, what, q, j);
            return -1;
        }
        ref->src = MD_SRC_LAYER;
        ref->index = j;
        *s = layer_shape(&m->layers[j]);
    } else if (kind == REF_VALUE) { /* dense */
        int d = user ? m->user_dense : m->cand_dense;
        if (d <= 0) {
            js_fail(&L->jc, "%s%s '%s': the model declares no inputs.%s.dense", pre, what, q,
                    user ? "user" : "candidate");
            return -1;
        }
        ref->src = user ? MD_SRC_USER_DENSE : MD_SRC_CAND_DENSE;
        ref->index = 0;
        s->kind = MD_VEC;
        s->dim = d;
    } else if (kind == REF_SPARSE) {
        const char *f = rest + 7;
        int k = user ? nent_find(L->uidx, m->n_user_sparse, f)
                     : nent_find(L->cidx, m->n_cand_sparse, f);
        if (k < 0) {
            js_fail(&L->jc, "%s%s '%s': no sparse feature '%s' in inputs.%s.sparse", pre, what, q,
                    js_quote(q2, f), user ? "user" : "candidate");
            return -1;
        }
        ref->src = user ? MD_SRC_USER_SPARSE : MD_SRC_CAND_SPARSE;
        ref->index = k;
    } else { /* history */
        if (!m->has_history) {
            js_fail(&L->jc, "%s%s 'user.history': the model declares no inputs.user.history", pre,
                    what);
            return -1;
        }
        ref->src = MD_SRC_USER_HISTORY;
        ref->index = 0;
    }
    if (kind_out)
        *kind_out = kind;
    return 0;
}

static int enum_error(ld *L, const char *path, const char *pre, const char *key, const char *got,
                      const char *allowed)
{
    char p[400], q[QBUF];
    js_fail(&L->jc, "%s'%s' must be %s, got '%s'", pre, js_path(p, sizeof p, path, key), allowed,
            js_quote(q, got));
    return -1;
}

/* ----------------------------------------------- the op_plan API (op.h) */

int op_fail(const op_plan *p, const char *fmt, ...)
{
    char msg[sizeof p->L->err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    js_fail(&p->L->jc, "%s%s", p->pre, msg);
    return -1;
}

int op_str(const op_plan *p, const char *key, int required, const char **out)
{
    return js_get_str(&p->L->jc, p->o, p->path, p->pre, key, required, out);
}

int op_int(const op_plan *p, const char *key, int required, long long dflt, long long lo,
           long long hi, long long *out)
{
    return js_get_int(&p->L->jc, p->o, p->path, p->pre, key, required, dflt, lo, hi, out);
}

int op_pos_num(const op_plan *p, const char *key, double dflt, double *out)
{
    const json_t *v = json_object_get(p->o, key);
    char k[400];
    *out = dflt;
    if (!v)
        return 0;
    if (!json_is_number(v))
        return op_fail(p, "'%s' must be a number, got %s", js_path(k, sizeof k, p->path, key),
                       js_type_name(v));
    double x = json_number_value(v);
    /* Held as fp32 (layer_norm's eps): a value that would round to 0 or to a
     * subnormal (flushed to 0 by fast-math kernels) is refused too. */
    if (!(x > 0) || !isfinite(x) || x < FLT_MIN || x > FLT_MAX)
        return op_fail(p, "'%s' must be a positive finite number, got %g",
                       js_path(k, sizeof k, p->path, key), x);
    *out = x;
    return 0;
}

int op_bool(const op_plan *p, const char *key, int dflt, int *out)
{
    const json_t *v = json_object_get(p->o, key);
    char k[400];
    *out = dflt;
    if (!v)
        return 0;
    if (!json_is_boolean(v))
        return op_fail(p, "'%s' must be true or false, got %s",
                       js_path(k, sizeof k, p->path, key), js_type_name(v));
    *out = json_is_true(v);
    return 0;
}

int op_enum(const op_plan *p, const char *key, const char *const *names, int n, int dflt,
            int *out)
{
    const char *got;
    if (op_str(p, key, dflt < 0, &got))
        return -1;
    if (!got) {
        *out = dflt;
        return 0;
    }
    for (int k = 0; k < n; k++)
        if (strcmp(got, names[k]) == 0) {
            *out = k;
            return 0;
        }
    char allowed[256];
    size_t o = 0;
    for (int k = 0; k < n && o < sizeof allowed; k++)
        o += (size_t)snprintf(allowed + o, sizeof allowed - o, "%s\"%s\"",
                              k == 0 ? "" : (k == n - 1 ? " or " : ", "), names[k]);
    return enum_error(p->L, p->path, p->pre, key, got, allowed);
}

int op_act(const op_plan *p, const char *key, int allow_none, enum bk_act dflt, enum bk_act *out)
{
    /* bk_act order; "none" is index 0. */
    static const char *const names[BK_ACT_COUNT] = {
        [BK_ACT_NONE] = "none", [BK_ACT_RELU] = "relu", [BK_ACT_SIGMOID] = "sigmoid",
        [BK_ACT_GELU] = "gelu", [BK_ACT_SILU] = "silu", [BK_ACT_TANH] = "tanh"};
    int v;
    int off = allow_none ? 0 : 1;
    if (op_enum(p, key, names + off, BK_ACT_COUNT - off, (int)dflt - off, &v))
        return -1;
    *out = (enum bk_act)(v + off);
    return 0;
}

static int grow_inputs(const op_plan *p, int more)
{
    md_layer *l = p->l;
    md_ref *in = realloc(l->in, ((size_t)l->n_in + (size_t)more) * sizeof *in);
    if (!in) {
        js_fail(&p->L->jc, "out of memory");
        return -1;
    }
    l->in = in;
    return 0;
}

static int add_ref(const op_plan *p, const char *role, const char *r, int accept, md_shape *s)
{
    if (grow_inputs(p, 1) ||
        resolve(p->L, p->i, p->pre, role, r, accept, &p->l->in[p->l->n_in], s, NULL))
        return -1;
    p->l->n_in++;
    return 0;
}

int op_layer(const op_plan *p, const char *key, int *index)
{
    const char *r;
    md_ref ref;
    md_shape sh;
    *index = -1;
    if (!json_object_get(p->o, key))
        return 0;
    if (op_str(p, key, 1, &r) || resolve(p->L, p->i, p->pre, key, r, OP_ACC_VALUE, &ref, &sh, NULL))
        return -1;
    if (ref.src != MD_SRC_LAYER)
        return op_fail(p, "'%s' must name a layer", key);
    *index = ref.index;
    return 0;
}

int op_input(const op_plan *p, const char *key, const char *role, int accept, md_shape *s)
{
    const char *r;
    if (op_str(p, key, 1, &r))
        return -1;
    return add_ref(p, role, r, accept, s);
}

static int add_ref_list(const op_plan *p, const json_t *arr, const char *key, md_shape **s,
                        int *n)
{
    size_t k = json_array_size(arr);
    *s = NULL;
    *n = 0;
    if (k == 0)
        return op_fail(p, "'%s.%s' must be a non-empty array", p->path, key);
    if (k > (size_t)MD_MAX_DIM)
        return op_fail(p, "'%s.%s' has too many entries", p->path, key);
    md_shape *v = calloc(k, sizeof *v);
    if (!v || grow_inputs(p, (int)k)) {
        free(v);
        js_fail(&p->L->jc, "out of memory");
        return -1;
    }
    for (size_t j = 0; j < k; j++) {
        json_t *e = json_array_get(arr, j);
        char what[48];
        if (!json_is_string(e)) {
            free(v);
            return op_fail(p, "'%s.%s[%zu]' must be a string, got %s", p->path, key, j,
                           js_type_name(e));
        }
        snprintf(what, sizeof what, "%s[%zu]", key, j);
        if (resolve(p->L, p->i, p->pre, what, json_string_value(e), OP_ACC_VALUE,
                    &p->l->in[p->l->n_in], &v[j], NULL)) {
            free(v);
            return -1;
        }
        p->l->n_in++;
    }
    *s = v;
    *n = (int)k;
    return 0;
}

int op_inputs(const op_plan *p, const char *key, md_shape **s, int *n)
{
    json_t *arr;
    if (js_get_arr(&p->L->jc, p->o, p->path, p->pre, key, 1, &arr))
        return -1;
    return add_ref_list(p, arr, key, s, n);
}

int op_operands(const op_plan *p, md_shape s[2])
{
    const char *opn = md_ops[p->l->op]->name;
    json_t *arr = json_object_get(p->o, "inputs");
    if (json_object_get(p->o, "a") || json_object_get(p->o, "b")) {
        if (arr)
            return op_fail(p, "%s takes either 'inputs': [a, b] or 'a' and 'b', not both", opn);
        const char *a, *b;
        if (op_str(p, "a", 1, &a) || op_str(p, "b", 1, &b))
            return -1;
        return add_ref(p, "inputs[0]", a, OP_ACC_VALUE, &s[0]) ||
                       add_ref(p, "inputs[1]", b, OP_ACC_VALUE, &s[1])
                   ? -1
                   : 0;
    }
    md_shape *v;
    int n;
    if (js_get_arr(&p->L->jc, p->o, p->path, p->pre, "inputs", 1, &arr))
        return -1;
    if (json_array_size(arr) != 2 && json_array_size(arr) != 0)
        return op_fail(p, "'%s.inputs' must list exactly two inputs [a, b], got %zu", p->path,
                       json_array_size(arr));
    if (add_ref_list(p, arr, "inputs", &v, &n))
        return -1;
    s[0] = v[0];
    s[1] = v[1];
    free(v);
    return 0;
}

int op_table(const op_plan *p)
{
    const char *t;
    char q[QBUF];
    if (op_str(p, "table", 1, &t))
        return -1;
    int k = nent_find(p->L->tidx, p->m->n_tables, t);
    if (k < 0)
        return op_fail(p, "unknown table '%s' (not declared in 'tables')", js_quote(q, t));
    p->l->table = k;
    return 0;
}

int op_weight(const op_plan *p, const char *param, long long rows, long long cols)
{
    md_layer *l = p->l;
    if (l->n_w >= MD_MAX_WEIGHTS)
        return op_fail(p, "internal: more than %d weights", MD_MAX_WEIGHTS);
    if (rows < 1 || cols < 1 || rows > MD_MAX_DIM || cols > MD_MAX_DIM)
        return op_fail(p, "weight '%s' has shape [%lld, %lld]", param, rows, cols);
    md_weight *w = &l->w[l->n_w];
    size_t n = strlen(l->name) + strlen(param) + 2;
    if (!(w->name = malloc(n))) {
        js_fail(&p->L->jc, "out of memory");
        return -1;
    }
    snprintf(w->name, n, "%s.%s", l->name, param);
    w->rows = (int)rows;
    w->cols = (int)cols;
    w->one_d = 0;
    l->n_w++;
    return 0;
}

int op_weight1(const op_plan *p, const char *param, long long n)
{
    if (op_weight(p, param, 1, n))
        return -1;
    p->l->w[p->l->n_w - 1].one_d = 1;
    return 0;
}

int op_output(const op_plan *p, enum md_domain dom, enum md_kind kind, long long tokens,
              long long dim)
{
    if (tokens < 1 || dim < 1 || tokens * dim > MD_MAX_DIM) /* both <= INT_MAX */
        return op_fail(p, "%s output [%lld, %lld] is too wide", md_ops[p->l->op]->name, tokens,
                       dim);
    p->l->domain = dom;
    p->l->kind = kind;
    p->l->tokens = (int)tokens;
    p->l->dim = (int)dim;
    return 0;
}

enum op_pass op_planning(const op_plan *p) { return p->L->pass; }

int op_one_domain(const op_plan *p, const md_shape *s, int n, enum md_domain *dom)
{
    if (p->L->pass == OP_PASS_BROADCAST_FORM) { /* mixing means broadcast */
        *dom = MD_USER;
        for (int k = 0; k < n; k++)
            if (s[k].dom == MD_CAND) *dom = MD_CAND;
        return 0;
    }
    for (int k = 1; k < n; k++)
        if (s[k].dom != s[0].dom)
            return op_fail(p,
                           "op '%s' cannot mix user and candidate inputs; only %s read user rows "
                           "through the map",
                           md_ops[p->l->op]->name, MIXING_OPS);
    *dom = s[0].dom;
    return 0;
}

const char *op_shape_str(char *buf, size_t n, md_shape s)
{
    const char *d = s.dom == MD_USER ? "user" : "candidate";
    if (s.kind == MD_VEC)
        snprintf(buf, n, "%s vec [%d]", d, s.dim);
    else if (s.kind == MD_TOKENS)
        snprintf(buf, n, "%s tokens [%d, %d]", d, s.tokens, s.dim);
    else
        snprintf(buf, n, "%s jagged [L, %d]", d, s.dim);
    return buf;
}

const char *op_in_name(const op_plan *p, int k, char *buf, size_t n)
{
    const md_ref r = p->l->in[k];
    const model_def *m = p->m;
    char raw[256];
    switch (r.src) {
    case MD_SRC_LAYER: snprintf(raw, sizeof raw, "%s", m->layers[r.index].name); break;
    case MD_SRC_USER_DENSE: snprintf(raw, sizeof raw, "user.dense"); break;
    case MD_SRC_CAND_DENSE: snprintf(raw, sizeof raw, "candidate.dense"); break;
    case MD_SRC_USER_SPARSE: snprintf(raw, sizeof raw, "user.sparse.%s", m->user_sparse[r.index]); break;
    case MD_SRC_CAND_SPARSE: snprintf(raw, sizeof raw, "candidate.sparse.%s", m->cand_sparse[r.index]); break;
    case MD_SRC_USER_HISTORY: snprintf(raw, sizeof raw, "user.history"); break;
    }
    return js_quote_n(buf, n, raw, JS_QUOTE_MAX);
}

/* One layer: its op from the table, its keys, then the op's own planning. */
static int plan_layer(ld *L, int i, const json_t *o)
{
    model_def *m = L->m;
    md_layer *l = &m->layers[i];
    char path[32], pre[QBUF + 16], q[QBUF], q2[QBUF];
    const char *opn;

    snprintf(path, sizeof path, "layers[%d]", i);
    snprintf(pre, sizeof pre, "layer '%s': ", js_quote(q, l->name));
    if (js_get_str(&L->jc, o, path, pre, "op", 1, &opn))
        return -1;
    int op = md_op_find(opn);
    if (op >= 0 && (md_ops[op]->flags & OP_INTERNAL) && L->pass != OP_PASS_REWRITTEN)
        op = -1; /* only the planner writes internal ops */
    if (op < 0) {
        js_fail(&L->jc, "%sunknown op '%s' (ops: %s)", pre, js_quote(q2, opn), md_op_list());
        return -1;
    }
    l->op = (enum md_op)op;
    if (js_check_keys(&L->jc, o, path, pre, md_ops[op]->keys))
        return -1;
    op_plan p = {.L = L, .m = m, .l = l, .i = i, .o = o, .path = path, .pre = pre};
    return md_ops[op]->plan(&p);
}

static int parse_layers(ld *L, const json_t *arr)
{
    model_def *m = L->m;
    size_t n = json_array_size(arr);
    char q[QBUF], path[32];

    if (n == 0) {
        js_fail(&L->jc, "'layers' must be a non-empty array");
        return -1;
    }
    if (n > (size_t)MD_MAX_DIM / 2) {
        js_fail(&L->jc, "'layers' has too many entries");
        return -1;
    }
    m->layers = calloc(n, sizeof *m->layers);
    L->lidx = calloc(n, sizeof *L->lidx);
    if (!m->layers || !L->lidx) {
        js_fail(&L->jc, "out of memory");
        return -1;
    }
    m->n_layers = (int)n;
    for (size_t i = 0; i < n; i++) {
        m->layers[i].table = -1;
        m->layers[i].shared = -1;
    }

    /* Pass 1: names, so that a forward reference can be told from a typo. */
    for (size_t i = 0; i < n; i++) {
        json_t *o = json_array_get(arr, i);
        const char *name;
        snprintf(path, sizeof path, "layers[%zu]", i);
        if (!json_is_object(o)) {
            js_fail(&L->jc, "'%s' must be an object, got %s", path, js_type_name(o));
            return -1;
        }
        if (js_get_str(&L->jc, o, path, "", "name", 1, &name))
            return -1;
        js_quote(q, name);
        if (name[0] == 0 || strchr(name, '.')) {
            js_fail(&L->jc, "'%s.name' must be a non-empty name without '.', got '%s'", path, q);
            return -1;
        }
        if (strcmp(name, "tables") == 0) {
            /* "tables.<x>" tensors are the embedding tables. */
            js_fail(&L->jc, "'%s.name': the layer name 'tables' is reserved", path);
            return -1;
        }
        if (!(m->layers[i].name = xstrdup(L, name)))
            return -1;
        L->lidx[i].s = m->layers[i].name;
        L->lidx[i].i = (int)i;
    }
    int a, b;
    if (nent_sort_dups(L->lidx, (int)n, &a, &b) == 0) {
        js_fail(&L->jc, "layer '%s': duplicate layer name (layers[%d] and layers[%d])",
                js_quote(q, m->layers[b].name), a, b);
        return -1;
    }
    /* Pass 2: ops, in file order. */
    for (size_t i = 0; i < n; i++)
        if (plan_layer(L, (int)i, json_array_get(arr, i)))
            return -1;
    return 0;
}

/* -------------------------------------------------------------- output */

static int parse_output(ld *L, const json_t *o)
{
    static const char *const keys[] = {"logits", "tasks", "score_weights", NULL};
    model_def *m = L->m;
    const char *logits;
    json_t *tasks, *sw;
    char q[QBUF], s1[96];

    if (js_check_keys(&L->jc, o, "output", "", keys) ||
        js_get_str(&L->jc, o, "output", "", "logits", 1, &logits) ||
        js_get_arr(&L->jc, o, "output", "", "tasks", 1, &tasks) ||
        js_get_arr(&L->jc, o, "output", "", "score_weights", 0, &sw))
        return -1;
    if (json_array_size(tasks) == 0) {
        js_fail(&L->jc, "'output.tasks' must be a non-empty array");
        return -1;
    }
    if (parse_name_list(L, tasks, "output.tasks", "", &m->tasks, &m->n_tasks, NULL))
        return -1;

    int j = nent_find(L->lidx, m->n_layers, logits);
    js_quote(q, logits);
    if (j < 0) {
        js_fail(&L->jc, "'output.logits': no layer named '%s'", q);
        return -1;
    }
    const md_layer *l = &m->layers[j];
    if (l->domain != MD_CAND || l->kind != MD_VEC) {
        js_fail(&L->jc, "'output.logits': layer '%s' is %s; it must be a candidate-domain vec [%d]%s",
                q, op_shape_str(s1, sizeof s1, layer_shape(l)), m->n_tasks,
                l->kind == MD_TOKENS ? " (flatten it)" : "");
        return -1;
    }
    if (l->dim != m->n_tasks) {
        js_fail(&L->jc, "'output.logits': layer '%s' has width %d, but output.tasks lists %d tasks",
                q, l->dim, m->n_tasks);
        return -1;
    }
    m->logits_layer = j;

    m->score_weights = calloc((size_t)m->n_tasks, sizeof *m->score_weights);
    if (!m->score_weights) {
        js_fail(&L->jc, "out of memory");
        return -1;
    }
    for (int t = 0; t < m->n_tasks; t++)
        m->score_weights[t] = 1.0f;
    if (sw) {
        if (json_array_size(sw) != (size_t)m->n_tasks) {
            js_fail(&L->jc, "'output.score_weights' has %zu entries, output.tasks has %d",
                    json_array_size(sw), m->n_tasks);
            return -1;
        }
        for (int t = 0; t < m->n_tasks; t++) {
            json_t *x = json_array_get(sw, (size_t)t);
            if (!json_is_number(x)) {
                js_fail(&L->jc, "'output.score_weights[%d]' must be a number, got %s", t,
                        js_type_name(x));
                return -1;
            }
            double d = json_number_value(x);
            if (!isfinite(d) || fabs(d) > FLT_MAX) {
                js_fail(&L->jc, "'output.score_weights[%d]' is out of float range", t);
                return -1;
            }
            m->score_weights[t] = (float)d;
        }
    }
    return 0;
}

/* ------------------------------------------------------------- serving */

/* The key table's parser (engine/serving.h); its message gets the file. */
static int parse_serving(ld *L, const json_t *o)
{
    bk_err e = {{0}};
    if (serving_apply_object(&L->m->serving, o, "serving", SERVING_MODEL, &e) == 0)
        return 0;
    js_fail(&L->jc, "%s", e.msg);
    return -1;
}

/* ------------------------------------------------------------ document */

/* "planning": absent (manual) or "auto" (MODEL_FORMAT.md, "Automatic
 * planning"): the layers are then planned in broadcast form first. */
static int parse_planning(ld *L, const json_t *root)
{
    const char *s;
    char q[QBUF];
    if (js_get_str(&L->jc, root, "", "", "planning", 0, &s))
        return -1;
    if (!s)
        return 0;
    if (strcmp(s, "auto") != 0) {
        js_fail(&L->jc, "'planning' must be \"auto\" (or absent for a model written with the IKBO "
                        "ops), got '%s'",
                js_quote(q, s));
        return -1;
    }
    if (L->pass == OP_PASS_MANUAL)
        L->pass = OP_PASS_BROADCAST_FORM;
    L->m->plan.is_auto = 1;
    return 0;
}

static int parse_root(ld *L, const json_t *root)
{
    static const char *const keys[] = {"format", "name",   "description", "inputs",  "tables",
                                       "layers", "output", "serving",     "planning", NULL};
    model_def *m = L->m;
    json_t *inputs, *tables, *layers, *output, *serving;
    const char *fmt, *s;
    char q[QBUF];

    if (js_get_str(&L->jc, root, "", "", "format", 1, &fmt))
        return -1;
    if (strcmp(fmt, FORMAT_ID) != 0) {
        js_fail(&L->jc, "'format' must be \"" FORMAT_ID "\", got '%s'", js_quote(q, fmt));
        return -1;
    }
    if (js_check_keys(&L->jc, root, "", "", keys) || parse_planning(L, root))
        return -1;
    if (js_get_str(&L->jc, root, "", "", "name", 0, &s) || (s && !(m->name = xstrdup(L, s))))
        return -1;
    if (js_get_str(&L->jc, root, "", "", "description", 0, &s) ||
        (s && !(m->description = xstrdup(L, s))))
        return -1;
    if (js_get_obj(&L->jc, root, "", "", "inputs", 1, &inputs) ||
        js_get_obj(&L->jc, root, "", "", "tables", 1, &tables) ||
        js_get_arr(&L->jc, root, "", "", "layers", 1, &layers) ||
        js_get_obj(&L->jc, root, "", "", "output", 1, &output) ||
        js_get_obj(&L->jc, root, "", "", "serving", 0, &serving))
        return -1;
    if (parse_inputs(L, inputs) || parse_tables(L, tables) || parse_layers(L, layers) ||
        parse_output(L, output) || (serving && parse_serving(L, serving)))
        return -1;
    return 0;
}

static int parse_document(ld *L, const char *json, size_t len)
{
    if (len > MODEL_JSON_MAX) {
        js_fail(&L->jc, "file is %zu bytes, over the %zu-byte limit", len, MODEL_JSON_MAX);
        return -1;
    }
    if (json && memchr(json, 0, len)) {
        js_fail(&L->jc, "invalid JSON: the file contains a NUL byte");
        return -1;
    }
    if (!(L->root = js_load_object(&L->jc, "", json, len)))
        return -1;
    return parse_root(L, L->root);
}

/* ------------------------------------------------------------- weights */

typedef struct expect {
    md_weight *w;
    int one_d;         /* file shape is [cols] (a bias) */
    const char *owner; /* "layer" or "table" */
    const char *oname;
} expect;

static const char *dims_str(char *buf, size_t n, const uint64_t *d, int nd)
{
    size_t o = 0;
    o += (size_t)snprintf(buf, n, "[");
    for (int k = 0; k < nd && o < n; k++)
        o += (size_t)snprintf(buf + o, n - o, "%s%llu", k ? ", " : "", (unsigned long long)d[k]);
    if (o < n)
        snprintf(buf + o, n - o, "]");
    return buf;
}

static const char *expect_dims(char *buf, size_t n, const expect *e)
{
    uint64_t d[2] = {(uint64_t)e->w->rows, (uint64_t)e->w->cols};
    return e->one_d ? dims_str(buf, n, d + 1, 1) : dims_str(buf, n, d, 2);
}

static int attach_weights(ld *L, st_file *f)
{
    model_def *m = L->m;
    js_ctx wc = {L->wfile, L->err};
    char q[QBUF], q2[QBUF], d1[128], d2[128];
    size_t ne = (size_t)m->n_tables;
    int rc = -1;
    for (int i = 0; i < m->n_layers; i++)
        ne += (size_t)m->layers[i].n_w;
    expect *ex = calloc(ne ? ne : 1, sizeof *ex);
    unsigned char *used = calloc(f->n ? f->n : 1, 1);
    long *tix = calloc(ne ? ne : 1, sizeof *tix);
    if (!ex || !used || !tix) {
        js_fail(&wc, "out of memory");
        goto out;
    }
    size_t k = 0;
    for (int i = 0; i < m->n_tables; i++)
        ex[k++] = (expect){&m->tables[i].w, 0, "table", m->tables[i].name};
    for (int i = 0; i < m->n_layers; i++)
        for (int j = 0; j < m->layers[i].n_w; j++)
            ex[k++] = (expect){&m->layers[i].w[j], m->layers[i].w[j].one_d,
                               "layer", m->layers[i].name};

    /* Names and shapes first: cheap, and the most common export mistakes. */
    for (k = 0; k < ne; k++) {
        const expect *e = &ex[k];
        long t = st_find(f, e->w->name);
        js_quote(q, e->w->name);
        js_quote(q2, e->oname);
        if (t < 0) {
            js_fail(&wc, "missing tensor '%s' (%s '%s', expected shape %s)", q, e->owner, q2,
                    expect_dims(d2, sizeof d2, e));
            goto out;
        }
        const st_tensor *st = &f->tensors[t];
        int ok = e->one_d ? (st->ndim == 1 && st->shape[0] == (uint64_t)e->w->cols)
                          : (st->ndim == 2 && st->shape[0] == (uint64_t)e->w->rows &&
                             st->shape[1] == (uint64_t)e->w->cols);
        if (!ok) {
            js_fail(&wc, "tensor '%s': shape %s, expected %s (%s '%s')", q,
                    dims_str(d1, sizeof d1, st->shape, st->ndim), expect_dims(d2, sizeof d2, e),
                    e->owner, q2);
            goto out;
        }
        used[t] = 1;
        tix[k] = t;
    }
    for (size_t t = 0; t < f->n; t++)
        if (!used[t]) {
            js_fail(&wc, "unexpected tensor '%s': no layer or table of model.json uses it",
                    js_quote(q, f->tensors[t].name));
            goto out;
        }

    for (k = 0; k < ne; k++) {
        const expect *e = &ex[k];
        const st_tensor *st = &f->tensors[tix[k]];
        size_t n = (size_t)st->numel;
        e->w->data = malloc(n ? n * sizeof(float) : 1);
        if (!e->w->data) {
            js_fail(&wc, "out of memory for tensor '%s' (%zu floats)", js_quote(q, e->w->name), n);
            goto out;
        }
        if (st_read_f32(f, st, e->w->data, L->err))
            goto out;
        long bad = st_first_nonfinite(e->w->data, n);
        if (bad >= 0) {
            float x = e->w->data[bad];
            js_fail(&wc, "tensor '%s': element %ld is %s (%s '%s'); weights must be finite",
                    js_quote(q, e->w->name), bad,
                    isnan(x) ? "NaN" : (x > 0 ? "+Inf" : "-Inf"), e->owner,
                    js_quote(q2, e->oname));
            goto out;
        }
    }
    rc = 0;
out:
    free(ex);
    free(used);
    free(tix);
    return rc;
}

/* -------------------------------------------------------------- driver */

static char *join(const char *dir, const char *file)
{
    size_t n = strlen(dir), k = strlen(file);
    char *p = malloc(n + k + 2);
    if (!p)
        return NULL;
    memcpy(p, dir, n);
    if (n && dir[n - 1] != '/')
        p[n++] = '/';
    memcpy(p + n, file, k + 1);
    return p;
}

static void ld_free(ld *L)
{
    json_decref(L->root);
    free(L->jfile);
    free(L->wfile);
    free(L->lidx);
    free(L->tidx);
    free(L->uidx);
    free(L->cidx);
}

static int ld_init(ld *L, const char *dir, bk_err *err)
{
    char shown[1100];
    memset(L, 0, sizeof *L);
    L->err = err;
    /* Messages show the directory sanitized (it may hold any byte). */
    js_quote_n(shown, sizeof shown, dir, 256);
    L->jfile = join(shown, "model.json");
    L->wfile = join(shown, "weights.safetensors");
    L->jc.file = L->jfile;
    L->jc.err = err;
    L->m = calloc(1, sizeof *L->m);
    if (!L->jfile || !L->wfile || !L->m || !(L->m->dir = strdup(dir))) {
        bk_seterr(err, "%s: out of memory", dir);
        return -1;
    }
    serving_unset(&L->m->serving);
    return 0;
}

/* Plans rewritten document `root` (r, made from model `from`) with the
 * manual rules plus the planner's own (OP_PASS_REWRITTEN) and moves or
 * builds the weights across. *out: the new model, its layers' origins
 * indexing from's layers. */
static int plan_rewritten(ld *L, model_def *from, ap_result *r, model_def **out)
{
    ld L2;
    int rc = -1;
    *out = NULL;
    if (ld_init(&L2, from->dir, L->err))
        goto out;
    L2.pass = OP_PASS_REWRITTEN;
    if (parse_root(&L2, r->root))
        goto out;
    if (L2.m->n_layers != r->n) { /* cannot happen: one planned layer per emitted one */
        bk_seterr(L->err, "%s: a rewrite of the model lost a layer", L->jfile);
        goto out;
    }
    if (ap_take_weights(r, from, L2.m, L->err))
        goto out;
    L2.m->plan.is_auto = from->plan.is_auto;
    *out = L2.m;
    L2.m = NULL;
    rc = 0;
out:
    model_def_free(L2.m);
    ld_free(&L2);
    return rc;
}

/* The fold pass (fold.h) over m, planned from `root` with its layers'
 * origins indexing plan entries e: *out is the folded model (origins
 * composed, e's folded entries marked), or NULL when nothing folds. */
static int fold_model(ld *L, model_def *m, const json_t *root, md_plan_entry *e,
                      model_def **out)
{
    ap_result *r = NULL;
    int rc = -1, *into;
    *out = NULL;
    if (L->no_fold)
        return 0;
    if (!(into = malloc(((size_t)m->n_layers + 1) * sizeof *into))) {
        bk_seterr(L->err, "%s: out of memory folding the model's lce layers", m->dir);
        return -1;
    }
    if (fold_rewrite(m, root, into, &r, L->err) || (r && plan_rewritten(L, m, r, out)))
        goto done;
    if (*out) {
        for (int k = 0; k < (*out)->n_layers; k++)
            (*out)->layers[k].origin = m->layers[(*out)->layers[k].origin].origin;
        for (int i = 0; i < m->n_layers; i++)
            if (into[i] >= 0)
                fold_note(m, into, i, &e[m->layers[i].origin]);
    }
    rc = 0;
done:
    ap_result_free(r);
    free(into);
    return rc;
}

/* An auto model: the broadcast form (L->m, with its weights when it has
 * any) is rewritten by auto_plan.c, planned again, then folded; the
 * weights move or are split across. L->m becomes the model that runs. */
static int replan(ld *L)
{
    ap_result *r = NULL;
    model_def *m1 = L->m, *m2 = NULL, *m3 = NULL;
    if (ap_rewrite(m1, L->root, &r, L->err) || plan_rewritten(L, m1, r, &m2) ||
        fold_model(L, m2, r->root, r->e, &m3)) {
        model_def_free(m2);
        model_def_free(m3);
        ap_result_free(r);
        return -1;
    }
    md_plan_build(m1, m3 ? m3 : m2, r->e);
    r->e = NULL; /* the plan owns the entries now */
    ap_result_free(r);
    L->m = m3 ? m3 : m2;
    if (m3)
        model_def_free(m2);
    model_def_free(m1);
    return 0;
}

/* The plan report; an auto model is rewritten first, and lce chains are
 * folded (fold.h) unless L->no_fold. */
static int plan_model(ld *L)
{
    if (L->m->plan.is_auto)
        return replan(L);
    model_def *m = L->m, *f = NULL;
    md_plan_entry *e = md_plan_manual_entries(m);
    if (!e) {
        bk_seterr(L->err, "%s: out of memory building the plan report", m->dir);
        return -1;
    }
    for (int k = 0; k < m->n_layers; k++)
        m->layers[k].origin = k;
    if (fold_model(L, m, L->root, e, &f)) {
        md_plan p = {.e = e, .n = m->n_layers};
        md_plan_free(&p);
        return -1;
    }
    md_plan_build(m, f ? f : m, e);
    if (f) {
        L->m = f;
        model_def_free(m);
    }
    return 0;
}

static int finish(ld *L, int rc, model_def **out)
{
    if (rc == 0)
        *out = L->m;
    else
        model_def_free(L->m);
    ld_free(L);
    return rc;
}

static int plan_only(const char *dir, const char *json, size_t json_len, int as_written,
                     model_def **out, bk_err *err)
{
    ld L;
    bk_err dummy;
    if (!err)
        err = &dummy;
    if (!dir)
        dir = "";
    if (!out) {
        bk_seterr(err, "%s: model_def_plan: out is NULL", dir);
        return -1;
    }
    if (ld_init(&L, dir, err))
        return finish(&L, -1, out);
    if (parse_document(&L, json, json_len))
        return finish(&L, -1, out);
    if (as_written && L.m->plan.is_auto) /* the broadcast form, no report */
        return finish(&L, 0, out);
    return finish(&L, plan_model(&L), out);
}

int model_def_plan(const char *dir, const char *json, size_t json_len, model_def **out,
                   bk_err *err)
{
    return plan_only(dir, json, json_len, 0, out, err);
}

int model_def_plan_as_written(const char *dir, const char *json, size_t json_len,
                              model_def **out, bk_err *err)
{
    return plan_only(dir, json, json_len, 1, out, err);
}

int model_def_parse(const char *dir, const char *json, size_t json_len, const uint8_t *st,
                    size_t st_len, model_def **out, bk_err *err)
{
    ld L;
    bk_err dummy;
    st_file f;
    int rc;
    if (!err)
        err = &dummy;
    if (!dir)
        dir = "";
    if (!out) {
        bk_seterr(err, "%s: model_def_parse: out is NULL", dir);
        return -1;
    }
    if (ld_init(&L, dir, err))
        return finish(&L, -1, out);
    if (parse_document(&L, json, json_len))
        return finish(&L, -1, out);
    if (st_open_mem(&f, L.wfile, st, st_len, err))
        return finish(&L, -1, out);
    rc = attach_weights(&L, &f);
    st_close(&f);
    return finish(&L, rc ? rc : plan_model(&L), out);
}

/* Reads a regular file of at most max bytes. Files are opened O_NONBLOCK so
 * that a FIFO in the model directory cannot hang the loader; it is refused
 * as "not a regular file" (O_NONBLOCK does not affect regular-file reads). */
static int read_file(const char *path, const char *shown, size_t max, char **out, size_t *len,
                     bk_err *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    struct stat sb;
    char *buf = NULL;
    size_t n = 0;
    if (fd < 0) {
        bk_seterr(err, "%s: cannot open: %s", shown, strerror(errno));
        return -1;
    }
    if (fstat(fd, &sb) != 0) {
        bk_seterr(err, "%s: cannot stat: %s", shown, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(sb.st_mode)) {
        bk_seterr(err, "%s: not a regular file", shown);
        goto fail;
    }
    if ((uint64_t)sb.st_size > max) {
        bk_seterr(err, "%s: file is %lld bytes, over the %zu-byte limit", shown,
                  (long long)sb.st_size, max);
        goto fail;
    }
    size_t cap = (size_t)sb.st_size + 1; /* +1 notices a file that grew */
    if (!(buf = malloc(cap))) {
        bk_seterr(err, "%s: out of memory", shown);
        goto fail;
    }
    for (;;) {
        ssize_t k = read(fd, buf + n, cap - n);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            bk_seterr(err, "%s: read failed: %s", shown, strerror(errno));
            goto fail;
        }
        if (k == 0)
            break;
        n += (size_t)k;
        if (n == cap) {
            bk_seterr(err, "%s: file changed while reading", shown);
            goto fail;
        }
    }
    close(fd);
    *out = buf;
    *len = n;
    return 0;
fail:
    free(buf);
    close(fd);
    return -1;
}

int model_def_load(const char *dir, model_def **out, bk_err *err)
{
    return model_def_load_opts(dir, 0, out, err);
}

int model_def_load_opts(const char *dir, unsigned flags, model_def **out, bk_err *err)
{
    ld L;
    bk_err dummy;
    char *json = NULL, *jpath = NULL, *wpath = NULL;
    size_t jlen = 0;
    int fd = -1, rc = -1;
    st_file f;
    struct stat sb;

    if (!err)
        err = &dummy;
    if (!dir || !out) {
        bk_seterr(err, "model_def_load: %s is NULL", dir ? "out" : "dir");
        return -1;
    }
    if (ld_init(&L, dir, err))
        return finish(&L, -1, out);
    L.no_fold = (flags & MD_LOAD_NO_FOLD) != 0;
    jpath = join(dir, "model.json");
    wpath = join(dir, "weights.safetensors");
    if (!jpath || !wpath) {
        bk_seterr(err, "%s: out of memory", L.jfile);
        goto done;
    }
    if (read_file(jpath, L.jfile, MODEL_JSON_MAX, &json, &jlen, err) ||
        parse_document(&L, json, jlen))
        goto done;
    free(json);
    json = NULL;

    fd = open(wpath, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        bk_seterr(err, "%s: cannot open: %s", L.wfile, strerror(errno));
        goto done;
    }
    if (fstat(fd, &sb) != 0) {
        bk_seterr(err, "%s: cannot stat: %s", L.wfile, strerror(errno));
        goto done;
    }
    if (!S_ISREG(sb.st_mode)) {
        bk_seterr(err, "%s: not a regular file", L.wfile);
        goto done;
    }
    if (st_open_fd(&f, L.wfile, fd, (uint64_t)sb.st_size, err))
        goto done;
    rc = attach_weights(&L, &f);
    st_close(&f);
    if (rc == 0)
        rc = plan_model(&L);
done:
    if (fd >= 0)
        close(fd);
    free(json);
    free(jpath);
    free(wpath);
    return finish(&L, rc, out);
}

void model_def_free(model_def *m)
{
    if (!m)
        return;
    free(m->dir);
    free(m->name);
    free(m->description);
    for (int i = 0; i < m->n_user_sparse; i++)
        free(m->user_sparse[i]);
    free(m->user_sparse);
    for (int i = 0; i < m->n_cand_sparse; i++)
        free(m->cand_sparse[i]);
    free(m->cand_sparse);
    if (m->tables)
        for (int i = 0; i < m->n_tables; i++) {
            free(m->tables[i].name);
            free(m->tables[i].w.name);
            free(m->tables[i].w.data);
        }
    free(m->tables);
    if (m->layers)
        for (int i = 0; i < m->n_layers; i++) {
            md_layer *l = &m->layers[i];
            free(l->name);
            free(l->in);
            for (int j = 0; j < MD_MAX_WEIGHTS; j++) {
                free(l->w[j].name);
                free(l->w[j].data);
            }
        }
    free(m->layers);
    for (int i = 0; i < m->n_tasks; i++)
        free(m->tasks[i]);
    free(m->tasks);
    free(m->score_weights);
    md_plan_free(&m->plan);
    free(m);
}
