/* shape.c - distributions, shape spec, model inputs and request bodies (see
 * shape.h). */
#include "shape.h"

#include "packed.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int lg_seterr(char *buf, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, n, fmt, ap);
    va_end(ap);
    return -1;
}

/* ---- distributions ---------------------------------------------------- */

static int parse_i64(const char *p, const char **end, int64_t *v)
{
    while (isspace((unsigned char)*p)) p++;
    if (!isdigit((unsigned char)*p) && *p != '-') return -1;
    errno = 0;
    char *e;
    long long x = strtoll(p, &e, 10);
    if (e == p || errno) return -1;
    while (isspace((unsigned char)*e)) e++;
    *v = x;
    *end = e;
    return 0;
}

int dist_parse(dist *d, const char *text, int64_t min, int64_t max, char *errbuf, size_t n)
{
    memset(d, 0, sizeof *d);
    const char *p = text, *e;
    int64_t a;
    if (!text || parse_i64(p, &e, &a))
        return lg_seterr(errbuf, n, "'%s': expected N, A..B or A,B,C", text ? text : "");
    if (*e == 0) {
        d->kind = DIST_FIXED;
        d->a = d->b = a;
    } else if (e[0] == '.' && e[1] == '.') {
        int64_t b;
        if (parse_i64(e + 2, &e, &b) || *e)
            return lg_seterr(errbuf, n, "'%s': expected A..B", text);
        if (b < a) return lg_seterr(errbuf, n, "'%s': A..B needs A <= B", text);
        d->kind = DIST_UNIFORM;
        d->a = a;
        d->b = b;
    } else if (*e == ',') {
        d->kind = DIST_CHOICE;
        d->values[d->n++] = a;
        while (*e == ',') {
            if (d->n == DIST_MAX_CHOICES)
                return lg_seterr(errbuf, n, "'%s': more than %d values", text, DIST_MAX_CHOICES);
            if (parse_i64(e + 1, &e, &a)) return lg_seterr(errbuf, n, "'%s': expected A,B,C", text);
            d->values[d->n++] = a;
        }
        if (*e) return lg_seterr(errbuf, n, "'%s': expected A,B,C", text);
        d->a = d->b = d->values[0];
    } else {
        return lg_seterr(errbuf, n, "'%s': expected N, A..B or A,B,C", text);
    }
    int64_t lo = d->kind == DIST_CHOICE ? d->values[0] : d->a;
    int64_t hi = lo;
    if (d->kind == DIST_UNIFORM) hi = d->b;
    for (int i = 0; i < d->n; i++) {
        if (d->values[i] < lo) lo = d->values[i];
        if (d->values[i] > hi) hi = d->values[i];
    }
    if (lo < min || hi > max)
        return lg_seterr(errbuf, n, "'%s': values must be in %" PRId64 "..%" PRId64, text, min, max);
    return 0;
}

void dist_format(const dist *d, char *buf, size_t n)
{
    if (d->kind == DIST_FIXED) {
        snprintf(buf, n, "%" PRId64, d->a);
    } else if (d->kind == DIST_UNIFORM) {
        snprintf(buf, n, "%" PRId64 "..%" PRId64, d->a, d->b);
    } else {
        size_t off = 0;
        buf[0] = 0;
        for (int i = 0; i < d->n && off < n; i++)
            off += (size_t)snprintf(buf + off, n - off, "%s%" PRId64, i ? "," : "", d->values[i]);
    }
}

double dist_mean(const dist *d)
{
    if (d->kind == DIST_FIXED) return (double)d->a;
    if (d->kind == DIST_UNIFORM) return ((double)d->a + (double)d->b) / 2;
    double s = 0;
    for (int i = 0; i < d->n; i++) s += (double)d->values[i];
    return d->n ? s / d->n : 0;
}

int64_t dist_max(const dist *d)
{
    if (d->kind != DIST_CHOICE) return d->b;
    int64_t m = d->values[0];
    for (int i = 1; i < d->n; i++)
        if (d->values[i] > m) m = d->values[i];
    return m;
}

/* ---- rng ---------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void lg_rng_seed(lg_rng *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t lg_rng_next(lg_rng *r)
{
    uint64_t *s = r->s;
    uint64_t out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

double lg_rng_unit(lg_rng *r) { return (double)(lg_rng_next(r) >> 11) * 0x1.0p-53; }

int64_t lg_rng_range(lg_rng *r, int64_t lo, int64_t hi)
{
    if (hi <= lo) return lo;
    uint64_t span = (uint64_t)(hi - lo) + 1;
    return lo + (int64_t)(span ? lg_rng_next(r) % span : lg_rng_next(r));
}

int64_t dist_sample(const dist *d, lg_rng *r)
{
    switch (d->kind) {
    case DIST_FIXED: return d->a;
    case DIST_UNIFORM: return lg_rng_range(r, d->a, d->b);
    default: return d->values[lg_rng_range(r, 0, d->n - 1)];
    }
}

/* ---- shape spec --------------------------------------------------------- */

void shape_defaults(shape *s)
{
    memset(s, 0, sizeof *s);
    s->users = 1;
    s->candidates.kind = DIST_FIXED;
    s->candidates.a = s->candidates.b = 70;
    s->has_history = 0;
    s->user_ids.a = s->user_ids.b = 1;
    s->cand_ids.a = s->cand_ids.b = 1;
    s->repeat_users = 0;
    s->user_pool = 1000;
    s->id_range = 1000000;
    s->distinct = 64;
    s->seed = 1;
}

int lg_encoding_parse(const char *text)
{
    if (!strcmp(text, "classic")) return LG_ENC_CLASSIC;
    if (!strcmp(text, "packed")) return LG_ENC_PACKED;
    return -1;
}

const char *lg_encoding_name(int encoding) { return encoding == LG_ENC_PACKED ? "packed" : "classic"; }

/* A distribution from a JSON value: number, string, array or {"uniform":[a,b]}. */
static int json_dist(dist *d, json_t *v, const char *key, int64_t min, int64_t max, char *errbuf,
                     size_t n)
{
    char text[1024], sub[256];
    if (json_is_integer(v)) {
        snprintf(text, sizeof text, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
    } else if (json_is_string(v)) {
        snprintf(text, sizeof text, "%s", json_string_value(v));
    } else if (json_is_array(v) && json_array_size(v) > 0) {
        size_t off = 0, i;
        json_t *x;
        text[0] = 0;
        json_array_foreach(v, i, x) {
            if (!json_is_integer(x))
                return lg_seterr(errbuf, n, "%s[%zu]: expected integer", key, i);
            off += (size_t)snprintf(text + off, sizeof text - off, "%s%" JSON_INTEGER_FORMAT,
                                    i ? "," : "", json_integer_value(x));
            if (off >= sizeof text) return lg_seterr(errbuf, n, "%s: list too long", key);
        }
    } else if (json_is_object(v) && json_object_size(v) == 1 && json_object_get(v, "uniform")) {
        json_t *u = json_object_get(v, "uniform");
        if (!json_is_array(u) || json_array_size(u) != 2 ||
            !json_is_integer(json_array_get(u, 0)) || !json_is_integer(json_array_get(u, 1)))
            return lg_seterr(errbuf, n, "%s.uniform: expected [A, B]", key);
        snprintf(text, sizeof text, "%" JSON_INTEGER_FORMAT "..%" JSON_INTEGER_FORMAT,
                 json_integer_value(json_array_get(u, 0)), json_integer_value(json_array_get(u, 1)));
    } else {
        return lg_seterr(errbuf, n,
                         "%s: expected an integer, \"A..B\", \"A,B,C\", [A, B, C] or {\"uniform\": [A, B]}",
                         key);
    }
    if (dist_parse(d, text, min, max, sub, sizeof sub)) return lg_seterr(errbuf, n, "%s: %s", key, sub);
    return 0;
}

static int json_int(json_t *v, const char *key, int64_t min, int64_t max, int64_t *out,
                    char *errbuf, size_t n)
{
    if (!json_is_integer(v) || json_integer_value(v) < min || json_integer_value(v) > max)
        return lg_seterr(errbuf, n, "%s: expected integer %" PRId64 "..%" PRId64, key, min, max);
    *out = json_integer_value(v);
    return 0;
}

int shape_apply_json_file(shape *s, const char *path, char **model, int64_t *version,
                          char *errbuf, size_t n)
{
    *model = NULL;
    *version = -1;
    json_error_t je;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        if (je.line > 0)
            return lg_seterr(errbuf, n, "%s: invalid JSON at line %d column %d: %s", path, je.line,
                             je.column, je.text);
        return lg_seterr(errbuf, n, "%s: %s", path, je.text);
    }
    char sub[512];
    int rc = -1;
    if (!json_is_object(root)) {
        lg_seterr(sub, sizeof sub, "expected a JSON object");
        goto out;
    }
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        int64_t x;
        if (!strcmp(key, "users")) {
            if (json_int(v, key, 1, 1000000, &x, sub, sizeof sub)) goto out;
            s->users = (int)x;
        } else if (!strcmp(key, "candidates")) {
            if (json_dist(&s->candidates, v, key, 0, 1000000, sub, sizeof sub)) goto out;
        } else if (!strcmp(key, "history")) {
            if (json_dist(&s->history, v, key, 0, 10000000, sub, sizeof sub)) goto out;
            s->has_history = 1;
        } else if (!strcmp(key, "ids_per_bag")) {
            if (json_dist(&s->user_ids, v, key, 0, 1000000, sub, sizeof sub)) goto out;
            s->cand_ids = s->user_ids;
        } else if (!strcmp(key, "user_ids_per_bag")) {
            if (json_dist(&s->user_ids, v, key, 0, 1000000, sub, sizeof sub)) goto out;
        } else if (!strcmp(key, "candidate_ids_per_bag")) {
            if (json_dist(&s->cand_ids, v, key, 0, 1000000, sub, sizeof sub)) goto out;
        } else if (!strcmp(key, "repeat_users")) {
            if (!json_is_number(v) || json_number_value(v) < 0 || json_number_value(v) > 1) {
                lg_seterr(sub, sizeof sub, "repeat_users: expected a number 0..1");
                goto out;
            }
            s->repeat_users = json_number_value(v);
        } else if (!strcmp(key, "user_pool")) {
            if (json_int(v, key, 1, 100000000, &x, sub, sizeof sub)) goto out;
            s->user_pool = (int)x;
        } else if (!strcmp(key, "id_range")) {
            if (json_int(v, key, 1, INT64_MAX, &x, sub, sizeof sub)) goto out;
            s->id_range = x;
        } else if (!strcmp(key, "distinct")) {
            if (json_int(v, key, 1, 1000000, &x, sub, sizeof sub)) goto out;
            s->distinct = (int)x;
        } else if (!strcmp(key, "shuffle")) {
            if (!json_is_boolean(v)) {
                lg_seterr(sub, sizeof sub, "shuffle: expected true or false");
                goto out;
            }
            s->shuffle = json_is_true(v);
        } else if (!strcmp(key, "top_k")) {
            if (json_int(v, key, 0, UINT32_MAX, &x, sub, sizeof sub)) goto out;
            s->top_k = (uint32_t)x;
        } else if (!strcmp(key, "seed")) {
            if (json_int(v, key, 0, INT64_MAX, &x, sub, sizeof sub)) goto out;
            s->seed = (uint64_t)x;
        } else if (!strcmp(key, "model")) {
            if (!json_is_string(v) || !json_string_length(v)) {
                lg_seterr(sub, sizeof sub, "model: expected a non-empty string");
                goto out;
            }
            free(*model);
            *model = strdup(json_string_value(v));
        } else if (!strcmp(key, "model_version")) {
            if (json_int(v, key, 0, INT64_MAX, &x, sub, sizeof sub)) goto out;
            *version = x;
        } else {
            lg_seterr(sub, sizeof sub, "%s: unknown key (known: users, candidates, history, ids_per_bag, "
                      "user_ids_per_bag, candidate_ids_per_bag, repeat_users, user_pool, id_range, "
                      "distinct, shuffle, top_k, seed, model, model_version)", key);
            goto out;
        }
    }
    rc = 0;
out:
    json_decref(root);
    if (rc) {
        free(*model);
        *model = NULL;
        lg_seterr(errbuf, n, "%s: %s", path, sub);
    }
    return rc;
}

/* ---- model inputs -------------------------------------------------------- */

static char **strv_dup(char **v, size_t n)
{
    char **out = calloc(n ? n : 1, sizeof *out);
    if (!out) return NULL;
    for (size_t i = 0; i < n; i++)
        if (!(out[i] = strdup(v[i] ? v[i] : ""))) {
            for (size_t j = 0; j < i; j++) free(out[j]);
            free(out);
            return NULL;
        }
    return out;
}

int lg_model_from_desc(lg_model *m, const Ikbo__V1__ModelDescription *d, int64_t version,
                       char *errbuf, size_t n)
{
    memset(m, 0, sizeof *m);
    int64_t best = -1;
    char states[512];
    size_t off = 0;
    states[0] = 0;
    for (size_t i = 0; i < d->n_versions; i++) {
        const Ikbo__V1__ModelVersionInfo *v = d->versions[i];
        if (off < sizeof states)
            off += (size_t)snprintf(states + off, sizeof states - off, "%s%" PRId64 " %s%s%s",
                                    i ? ", " : "", v->version, v->state,
                                    v->message && *v->message ? ": " : "", v->message ? v->message : "");
        if (strcmp(v->state, "READY")) continue;
        if (version > 0 ? v->version == version : v->version > best) best = v->version;
    }
    if (best < 0) {
        if (version > 0)
            return lg_seterr(errbuf, n, "model '%s' version %" PRId64 " is not READY (versions: %s)",
                             d->name, version, off ? states : "none");
        return lg_seterr(errbuf, n, "model '%s' has no READY version (versions: %s)", d->name,
                         off ? states : "none");
    }
    m->name = strdup(d->name);
    m->mode = strdup(d->mode ? d->mode : "");
    m->device = strdup(d->device ? d->device : "");
    m->version = best;
    m->req_version = version > 0 ? version : 0;
    m->user_dense = d->user_dense;
    m->cand_dense = d->candidate_dense;
    m->n_user_sparse = (int)d->n_user_sparse;
    m->user_sparse = strv_dup(d->user_sparse, d->n_user_sparse);
    m->n_cand_sparse = (int)d->n_candidate_sparse;
    m->cand_sparse = strv_dup(d->candidate_sparse, d->n_candidate_sparse);
    if (d->history) {
        m->has_history = 1;
        m->hist_max_len = d->history->max_len;
        m->hist_actions = d->history->actions;
    }
    m->n_tasks = (int)d->n_tasks;
    if (!m->name || !m->mode || !m->device || !m->user_sparse || !m->cand_sparse) {
        lg_model_free(m);
        return lg_seterr(errbuf, n, "out of memory");
    }
    return 0;
}

void lg_model_free(lg_model *m)
{
    if (!m) return;
    free(m->name);
    free(m->mode);
    free(m->device);
    for (int i = 0; m->user_sparse && i < m->n_user_sparse; i++) free(m->user_sparse[i]);
    for (int i = 0; m->cand_sparse && i < m->n_cand_sparse; i++) free(m->cand_sparse[i]);
    free(m->user_sparse);
    free(m->cand_sparse);
    memset(m, 0, sizeof *m);
}

/* ---- request bodies ------------------------------------------------------ */

/* Bump allocator for one request's message tree (freed in one go after
 * packing). */
typedef struct chunk {
    struct chunk *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
} chunk;

typedef struct arena {
    chunk *head;
    int failed;
} arena;

static void *arena_alloc(arena *a, size_t size)
{
    size = (size + 15) & ~(size_t)15;
    if (!a->head || a->head->used + size > a->head->cap) {
        size_t cap = size > (1u << 20) ? size : (1u << 20);
        chunk *c = malloc(sizeof *c + cap);
        if (!c) {
            a->failed = 1;
            return NULL;
        }
        c->next = a->head;
        c->used = 0;
        c->cap = cap;
        a->head = c;
    }
    void *p = a->head->data + a->head->used;
    a->head->used += size;
    return p;
}

static void arena_free(arena *a)
{
    for (chunk *c = a->head; c;) {
        chunk *next = c->next;
        free(c);
        c = next;
    }
    a->head = NULL;
}

#define ANEW(a, type, count) ((type *)arena_alloc((a), sizeof(type) * ((count) ? (count) : 1)))

static char *arena_printf(arena *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static char *arena_printf(arena *a, const char *fmt, ...)
{
    char buf[128];
    va_list ap;
    va_start(ap, fmt);
    int len = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (len < 0) len = 0;
    if ((size_t)len >= sizeof buf) len = sizeof buf - 1;
    char *s = arena_alloc(a, (size_t)len + 1);
    if (s) memcpy(s, buf, (size_t)len + 1);
    return s;
}

static float rand_dense(lg_rng *r) { return (float)(lg_rng_unit(r) * 2.0 - 1.0); }

static Ikbo__V1__SparseFeature **make_bags(arena *a, lg_rng *r, char **names, int n_names,
                                           const dist *ids, int64_t id_range, size_t *n_out)
{
    Ikbo__V1__SparseFeature **bags = ANEW(a, Ikbo__V1__SparseFeature *, n_names);
    size_t nb = 0;
    if (!bags) return NULL;
    for (int f = 0; f < n_names; f++) {
        int64_t k = dist_sample(ids, r);
        if (k <= 0) continue; /* an absent feature is an empty bag */
        Ikbo__V1__SparseFeature *sf = ANEW(a, Ikbo__V1__SparseFeature, 1);
        int64_t *v = ANEW(a, int64_t, k);
        if (!sf || !v) return NULL;
        ikbo__v1__sparse_feature__init(sf);
        sf->name = names[f];
        sf->n_ids = (size_t)k;
        sf->ids = v;
        for (int64_t i = 0; i < k; i++) v[i] = lg_rng_range(r, 0, id_range - 1);
        bags[nb++] = sf;
    }
    *n_out = nb;
    return bags;
}

static Ikbo__V1__User *make_user(arena *a, lg_rng *r, const shape *s, const lg_model *m,
                                 char *key)
{
    Ikbo__V1__User *u = ANEW(a, Ikbo__V1__User, 1);
    if (!u) return NULL;
    ikbo__v1__user__init(u);
    u->key = key;
    u->n_dense = m->user_dense;
    u->dense = ANEW(a, float, m->user_dense);
    if (!u->dense) return NULL;
    for (uint32_t i = 0; i < m->user_dense; i++) u->dense[i] = rand_dense(r);
    u->sparse = make_bags(a, r, m->user_sparse, m->n_user_sparse, &s->user_ids, s->id_range,
                          &u->n_sparse);
    if (!u->sparse) return NULL;
    if (m->has_history) {
        int64_t L = s->has_history ? dist_sample(&s->history, r) : (int64_t)m->hist_max_len;
        if (L > 0) {
            u->n_history_ids = (size_t)L;
            u->history_ids = ANEW(a, int64_t, L);
            if (!u->history_ids) return NULL;
            for (int64_t i = 0; i < L; i++) u->history_ids[i] = lg_rng_range(r, 0, s->id_range - 1);
            if (m->hist_actions > 0) {
                u->n_history_actions = (size_t)L;
                u->history_actions = ANEW(a, int32_t, L);
                if (!u->history_actions) return NULL;
                for (int64_t i = 0; i < L; i++)
                    u->history_actions[i] = (int32_t)lg_rng_range(r, 0, m->hist_actions - 1);
            }
        }
    }
    return u;
}

/* Request `index` of the distinct set; NULL on allocation failure. */
static Ikbo__V1__RankRequest *build_request(arena *a, const shape *s, const lg_model *m, int index)
{
    lg_rng r;
    lg_rng_seed(&r, s->seed * 1000003u + (uint64_t)index);
    Ikbo__V1__RankRequest *q = ANEW(a, Ikbo__V1__RankRequest, 1);
    if (!q) return NULL;
    ikbo__v1__rank_request__init(q);
    q->model = m->name;
    q->model_version = m->req_version;
    q->top_k = s->top_k;
    q->n_users = (size_t)s->users;
    q->users = ANEW(a, Ikbo__V1__User *, s->users);
    int *picked = ANEW(a, int, s->users);
    if (!q->users || !picked) return NULL;
    int n_picked = 0;
    for (int j = 0; j < s->users; j++) {
        Ikbo__V1__User *u = NULL;
        if (s->repeat_users > 0 && lg_rng_unit(&r) < s->repeat_users && n_picked < s->user_pool) {
            int p;
            for (;;) { /* distinct within the request */
                p = (int)lg_rng_range(&r, 0, s->user_pool - 1);
                int dup = 0;
                for (int k = 0; k < n_picked; k++) dup |= picked[k] == p;
                if (!dup) break;
            }
            picked[n_picked++] = p;
            lg_rng pr; /* pool user p: same content wherever it appears */
            lg_rng_seed(&pr, (s->seed ^ 0x5eed5eedull) * 1000003u + (uint64_t)p);
            u = make_user(a, &pr, s, m, arena_printf(a, "pool-%d", p));
        } else {
            u = make_user(a, &r, s, m, arena_printf(a, "u%d-%d", index, j));
        }
        if (!u || !u->key) return NULL;
        q->users[j] = u;
    }
    int64_t *counts = ANEW(a, int64_t, s->users);
    if (!counts) return NULL;
    int64_t total = 0;
    for (int j = 0; j < s->users; j++) total += counts[j] = dist_sample(&s->candidates, &r);
    q->n_candidates = (size_t)total;
    q->candidates = ANEW(a, Ikbo__V1__Candidate *, total);
    if (!q->candidates) return NULL;
    size_t c = 0;
    for (int j = 0; j < s->users; j++) {
        for (int64_t k = 0; k < counts[j]; k++) {
            Ikbo__V1__Candidate *cd = ANEW(a, Ikbo__V1__Candidate, 1);
            if (!cd) return NULL;
            ikbo__v1__candidate__init(cd);
            cd->id = (int64_t)index * 10000000 + (int64_t)c;
            cd->user = (uint32_t)j;
            cd->n_dense = m->cand_dense;
            cd->dense = ANEW(a, float, m->cand_dense);
            if (!cd->dense) return NULL;
            for (uint32_t i = 0; i < m->cand_dense; i++) cd->dense[i] = rand_dense(&r);
            cd->sparse = make_bags(a, &r, m->cand_sparse, m->n_cand_sparse, &s->cand_ids,
                                   s->id_range, &cd->n_sparse);
            if (!cd->sparse) return NULL;
            q->candidates[c++] = cd;
        }
    }
    if (s->shuffle)
        for (size_t i = c; i > 1; i--) {
            size_t k = (size_t)lg_rng_range(&r, 0, (int64_t)i - 1);
            Ikbo__V1__Candidate *t = q->candidates[i - 1];
            q->candidates[i - 1] = q->candidates[k];
            q->candidates[k] = t;
        }
    return q;
}

/* Serializes q into b in the shape's encoding. */
static int pack_body(lg_body *b, const Ikbo__V1__RankRequest *q, int encoding, char *errbuf,
                     size_t n)
{
    if (encoding == LG_ENC_PACKED) return lg_pack_columnar(q, &b->data, &b->len, errbuf, n);
    b->len = ikbo__v1__rank_request__get_packed_size(q);
    b->data = malloc(b->len ? b->len : 1);
    if (!b->data) return lg_seterr(errbuf, n, "out of memory");
    ikbo__v1__rank_request__pack(q, b->data);
    return 0;
}

int lg_bodies_build(lg_bodies *out, const shape *s, const lg_model *m, char *errbuf, size_t n)
{
    memset(out, 0, sizeof *out);
    out->b = calloc((size_t)s->distinct, sizeof *out->b);
    if (!out->b) return lg_seterr(errbuf, n, "out of memory");
    double cands = 0, bytes = 0;
    for (int i = 0; i < s->distinct; i++) {
        arena a = {0};
        char sub[256];
        Ikbo__V1__RankRequest *q = build_request(&a, s, m, i);
        if (!q || a.failed) {
            arena_free(&a);
            lg_bodies_free(out);
            return lg_seterr(errbuf, n, "out of memory building request %d", i);
        }
        lg_body *b = &out->b[out->n];
        if (pack_body(b, q, s->encoding, sub, sizeof sub)) {
            arena_free(&a);
            lg_bodies_free(out);
            return lg_seterr(errbuf, n, "packing request %d (%s): %s", i, lg_encoding_name(s->encoding),
                             sub);
        }
        b->n_users = (uint32_t)q->n_users;
        b->n_cands = (uint32_t)q->n_candidates;
        b->n_expected_scores = s->top_k && s->top_k < b->n_cands ? s->top_k : b->n_cands;
        out->n++;
        cands += b->n_cands;
        bytes += (double)b->len;
        arena_free(&a);
    }
    out->mean_cands = cands / s->distinct;
    out->mean_bytes = bytes / s->distinct;
    return 0;
}

void lg_bodies_free(lg_bodies *b)
{
    if (!b) return;
    for (int i = 0; i < b->n; i++) free(b->b[i].data);
    free(b->b);
    memset(b, 0, sizeof *b);
}
