/* request.c - the request path shared by every transport: limits,
 * validation against a model, and user dedup + candidate grouping into an
 * ikbo_batch. JSON mapping is in request_json.c, the response in
 * response.c, statuses in status.c. Policies are documented in request.h. */
#include "request.h"

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hash.h"

void rq_limits_default(rq_limits *l)
{
    l->max_users = RQ_DEFAULT_MAX_USERS;
    l->max_candidates = RQ_DEFAULT_MAX_CANDIDATES;
    l->max_ids_per_bag = RQ_DEFAULT_MAX_IDS_PER_BAG;
    l->max_history = RQ_DEFAULT_MAX_HISTORY;
    l->max_sparse_features = RQ_DEFAULT_MAX_SPARSE_FEATURES;
    l->max_message_bytes = RQ_DEFAULT_MAX_MESSAGE_BYTES;
}

/* ======================================================================
 * validation
 * ====================================================================== */

/* A request-supplied name, safe to put in a one-line message. */
static void safe_name(const char *s, char *out, size_t n)
{
    size_t j = 0;
    for (size_t i = 0; s && s[i] && j + 4 < n; i++) {
        unsigned char c = (unsigned char)s[i];
        out[j++] = (c < 0x20 || c == 0x7f || c == '"' || c == '\\') ? '?' : (char)c;
        if (i >= 63) {
            out[j++] = '.';
            out[j++] = '.';
            out[j++] = '.';
            break;
        }
    }
    out[j] = 0;
}

/* The model's name for messages: the request's, else <repo>/<name>/<version>'s name. */
static void model_name(const Ikbo__V1__RankRequest *req, const ikbo_model_info *mi, char *out,
                       size_t n)
{
    if (req->model && req->model[0]) {
        safe_name(req->model, out, n);
        return;
    }
    const char *d = mi->dir ? mi->dir : "";
    size_t len = strlen(d);
    while (len && d[len - 1] == '/')
        len--;
    size_t e = len;
    while (e && d[e - 1] != '/') /* skip the version component */
        e--;
    while (e && d[e - 1] == '/')
        e--;
    size_t b = e;
    while (b && d[b - 1] != '/')
        b--;
    if (e > b)
        snprintf(out, n, "%.*s", (int)(e - b), d + b);
    else
        snprintf(out, n, "%.*s", (int)len, d);
}

static const char *nonfinite_name(float f)
{
    return isnan(f) ? "NaN" : f > 0 ? "Infinity" : "-Infinity";
}

static int find_name(const char *const *names, int n, const char *s)
{
    for (int i = 0; i < n; i++)
        if (names[i] && s && !strcmp(names[i], s))
            return i;
    return -1;
}

static int check_dense(const char *ent, size_t idx, const float *v, size_t n, int want,
                       const char *mname, rq_status *st)
{
    if (n != (size_t)want)
        return rq_status_set(st, RQ_INVALID_ARGUMENT,
                             "%s[%zu].dense has %zu values, model '%s' expects %d", ent, idx, n,
                             mname, want);
    for (size_t k = 0; k < n; k++)
        if (!isfinite(v[k]))
            return rq_status_set(st, RQ_INVALID_ARGUMENT, "%s[%zu].dense[%zu] is %s", ent, idx,
                                 k, nonfinite_name(v[k]));
    return 0;
}

static int check_sparse(const char *ent, const char *kind, size_t idx,
                        Ikbo__V1__SparseFeature *const *sp, size_t n, const char *const *names,
                        int n_names, const rq_limits *lim, rq_status *st)
{
    if (n > lim->max_sparse_features)
        return rq_status_set(st, RQ_RESOURCE_EXHAUSTED,
                             "%s[%zu].sparse has %zu features, limit max_sparse_features = %u",
                             ent, idx, n, lim->max_sparse_features);
    /* Feature k's model index, to find duplicates without an O(n^2) scan. */
    int seen_at[256];
    int nm = n_names < 256 ? n_names : 256;
    for (int i = 0; i < nm; i++)
        seen_at[i] = -1;
    for (size_t k = 0; k < n; k++) {
        const Ikbo__V1__SparseFeature *f = sp[k];
        char nb[80];
        int fi = find_name(names, n_names, f->name);
        if (fi < 0) {
            char list[240];
            size_t l = 0;
            list[0] = 0;
            for (int i = 0; i < n_names && l < sizeof list - 8; i++) {
                int w = snprintf(list + l, sizeof list - l, "%s%s", i ? ", " : "", names[i]);
                if (w < 0 || (size_t)w >= sizeof list - l) {
                    snprintf(list + (sizeof list - 5), 5, "...");
                    break;
                }
                l += (size_t)w;
            }
            safe_name(f->name, nb, sizeof nb);
            return rq_status_set(st, RQ_INVALID_ARGUMENT,
                                 "%s[%zu].sparse[%zu].name = \"%s\": unknown %s sparse feature "
                                 "(model has: %s)",
                                 ent, idx, k, nb, kind, n_names ? list : "none");
        }
        int prev = -1;
        if (fi < nm) {
            prev = seen_at[fi];
            seen_at[fi] = (int)k;
        } else {
            for (size_t j = 0; j < k; j++)
                if (!strcmp(sp[j]->name, f->name))
                    prev = (int)j;
        }
        if (prev >= 0) {
            safe_name(f->name, nb, sizeof nb);
            return rq_status_set(st, RQ_INVALID_ARGUMENT,
                                 "%s[%zu].sparse[%zu].name = \"%s\": duplicate feature (also "
                                 "%s[%zu].sparse[%d])",
                                 ent, idx, k, nb, ent, idx, prev);
        }
        if (f->n_ids > lim->max_ids_per_bag)
            return rq_status_set(st, RQ_RESOURCE_EXHAUSTED,
                                 "%s[%zu].sparse[%zu].ids has %zu ids, limit max_ids_per_bag = %u",
                                 ent, idx, k, f->n_ids, lim->max_ids_per_bag);
    }
    return 0;
}

int rq_validate(const Ikbo__V1__RankRequest *req, const ikbo_model_info *mi,
                const rq_limits *lim_in, rq_status *st)
{
    rq_limits dl;
    if (!lim_in) {
        rq_limits_default(&dl);
        lim_in = &dl;
    }
    const rq_limits *lim = lim_in;
    if (!req || !mi)
        return rq_status_set(st, RQ_INTERNAL, "rq_validate: no request or model");
    if (req->n_users == 0)
        return rq_status_set(st, RQ_INVALID_ARGUMENT, "users: request has no users");
    if (req->n_candidates == 0)
        return rq_status_set(st, RQ_INVALID_ARGUMENT, "candidates: request has no candidates");
    if (req->n_users > lim->max_users)
        return rq_status_set(st, RQ_RESOURCE_EXHAUSTED,
                             "users: request has %zu users, limit max_users = %u", req->n_users,
                             lim->max_users);
    if (req->n_candidates > lim->max_candidates)
        return rq_status_set(st, RQ_RESOURCE_EXHAUSTED,
                             "candidates: request has %zu candidates, limit max_candidates = %u",
                             req->n_candidates, lim->max_candidates);
    char mname[80];
    model_name(req, mi, mname, sizeof mname);

    for (size_t j = 0; j < req->n_users; j++) {
        const Ikbo__V1__User *u = req->users[j];
        if (check_dense("users", j, u->dense, u->n_dense, mi->user_dense, mname, st))
            return -1;
        if (check_sparse("users", "user", j, u->sparse, u->n_sparse, mi->user_sparse,
                         mi->n_user_sparse, lim, st))
            return -1;
        if (!u->n_history_ids && !u->n_history_actions)
            continue;
        if (!mi->has_history)
            return rq_status_set(st, RQ_INVALID_ARGUMENT, "users[%zu].%s: model '%s' takes no history",
                                 j, u->n_history_ids ? "history_ids" : "history_actions", mname);
        if (u->n_history_ids > lim->max_history)
            return rq_status_set(st, RQ_RESOURCE_EXHAUSTED,
                                 "users[%zu].history_ids has %zu events, limit max_history = %u",
                                 j, u->n_history_ids, lim->max_history);
        if (u->n_history_actions && u->n_history_actions != u->n_history_ids)
            return rq_status_set(st, RQ_INVALID_ARGUMENT,
                                 "users[%zu].history_actions has %zu values but history_ids has "
                                 "%zu (give none or one per id)",
                                 j, u->n_history_actions, u->n_history_ids);
        for (size_t k = 0; k < u->n_history_actions; k++) {
            int32_t a = u->history_actions[k];
            if (a < 0 || a >= mi->hist_actions)
                return rq_status_set(st, RQ_INVALID_ARGUMENT,
                                     "users[%zu].history_actions[%zu] = %d is outside [0, %d) "
                                     "for model '%s'",
                                     j, k, a, mi->hist_actions, mname);
        }
    }
    for (size_t i = 0; i < req->n_candidates; i++) {
        const Ikbo__V1__Candidate *c = req->candidates[i];
        if (c->user >= req->n_users)
            return rq_status_set(st, RQ_INVALID_ARGUMENT,
                                 "candidates[%zu].user = %u but request has %zu users", i, c->user,
                                 req->n_users);
        if (check_dense("candidates", i, c->dense, c->n_dense, mi->cand_dense, mname, st))
            return -1;
        if (check_sparse("candidates", "candidate", i, c->sparse, c->n_sparse, mi->cand_sparse,
                         mi->n_cand_sparse, lim, st))
            return -1;
    }
    rq_status_ok(st);
    return 0;
}

/* ======================================================================
 * plan: dedup + grouping
 * ====================================================================== */

typedef struct plan_priv {
    float *user_dense, *cand_dense;
    ikbo_jagged *user_sparse, *cand_sparse;
    int64_t **bufs; /* every ids/offsets array of the jagged inputs */
    int n_bufs;
    int64_t *hist_ids, *hist_offsets;
    int32_t *hist_actions, *map;
} plan_priv;

void rq_plan_free(rq_plan *p)
{
    if (!p)
        return;
    plan_priv *v = p->priv_;
    if (v) {
        free(v->user_dense);
        free(v->cand_dense);
        free(v->user_sparse);
        free(v->cand_sparse);
        for (int i = 0; i < v->n_bufs; i++)
            free(v->bufs[i]);
        free(v->bufs);
        free(v->hist_ids);
        free(v->hist_offsets);
        free(v->hist_actions);
        free(v->map);
        free(v);
    }
    free(p->order);
    free(p->user_row);
    free(p->row_user);
    free(p);
}

/* A request entity's sparse bags in model feature order (NULL = absent). */
static int bags_by_model(Ikbo__V1__SparseFeature *const *sp, size_t n, const char *const *names,
                         int n_names, const Ikbo__V1__SparseFeature **out, const char *ent,
                         size_t idx, rq_status *st)
{
    for (int f = 0; f < n_names; f++)
        out[f] = NULL;
    for (size_t k = 0; k < n; k++) {
        int fi = find_name(names, n_names, sp[k]->name);
        if (fi < 0 || out[fi]) {
            char nb[80];
            safe_name(sp[k]->name, nb, sizeof nb);
            return rq_status_set(st, RQ_INVALID_ARGUMENT,
                                 "%s[%zu].sparse[%zu].name = \"%s\": %s feature", ent, idx, k, nb,
                                 fi < 0 ? "unknown" : "duplicate");
        }
        out[fi] = sp[k];
    }
    return 0;
}


/* Per-row dedup state: the representative user and its bags in model order. */
typedef struct urow {
    const Ikbo__V1__User *u;
    const Ikbo__V1__SparseFeature **bags;
    uint64_t hash;
    int next; /* next row in the same hash bucket, -1 = end */
} urow;

static uint64_t user_hash(const Ikbo__V1__User *u, const Ikbo__V1__SparseFeature **bags,
                          int n_feat)
{
    uint64_t h = hash_bytes(0x1234567ull, u->key ? u->key : "", u->key ? strlen(u->key) : 0);
    h = hash_bytes(h, u->dense, u->n_dense * sizeof(float));
    for (int f = 0; f < n_feat; f++) {
        /* absent == empty bag: both hash as zero ids */
        h = bags[f] ? hash_bytes(h, bags[f]->ids, bags[f]->n_ids * sizeof(int64_t))
                    : hash_bytes(h, NULL, 0);
    }
    h = hash_bytes(h, u->history_ids, u->n_history_ids * sizeof(int64_t));
    /* absent actions == all zero (hash.h) */
    return hash_actions(h, u->history_actions, u->n_history_actions);
}

static int user_equal(const Ikbo__V1__User *a, const Ikbo__V1__SparseFeature **ba,
                      const Ikbo__V1__User *b, const Ikbo__V1__SparseFeature **bb, int n_feat)
{
    if (strcmp(a->key ? a->key : "", b->key ? b->key : ""))
        return 0;
    if (a->n_dense != b->n_dense ||
        (a->n_dense && memcmp(a->dense, b->dense, a->n_dense * sizeof(float))))
        return 0;
    for (int f = 0; f < n_feat; f++) {
        size_t na = ba[f] ? ba[f]->n_ids : 0, nb = bb[f] ? bb[f]->n_ids : 0;
        if (na != nb || (na && memcmp(ba[f]->ids, bb[f]->ids, na * sizeof(int64_t))))
            return 0;
    }
    if (a->n_history_ids != b->n_history_ids ||
        (a->n_history_ids &&
         memcmp(a->history_ids, b->history_ids, a->n_history_ids * sizeof(int64_t))))
        return 0;
    for (size_t k = 0; k < a->n_history_ids; k++) {
        int32_t xa = k < a->n_history_actions ? a->history_actions[k] : 0;
        int32_t xb = k < b->n_history_actions ? b->history_actions[k] : 0;
        if (xa != xb)
            return 0;
    }
    return 1;
}

/* Lays out one feature's bags for `rows` entities as a jagged array. get(i)
 * returns entity i's bag or NULL. */
typedef const Ikbo__V1__SparseFeature *(*bag_get)(void *ctx, size_t i, int f);

static int build_jagged(plan_priv *v, size_t rows, int f, bag_get get, void *ctx,
                        ikbo_jagged *out)
{
    int64_t *off = malloc((rows + 1) * sizeof *off);
    if (!off)
        return -1;
    v->bufs[v->n_bufs++] = off;
    off[0] = 0;
    for (size_t i = 0; i < rows; i++) {
        const Ikbo__V1__SparseFeature *b = get(ctx, i, f);
        off[i + 1] = off[i] + (int64_t)(b ? b->n_ids : 0);
    }
    int64_t *ids = malloc((size_t)(off[rows] ? off[rows] : 1) * sizeof *ids);
    if (!ids)
        return -1;
    v->bufs[v->n_bufs++] = ids;
    for (size_t i = 0; i < rows; i++) {
        const Ikbo__V1__SparseFeature *b = get(ctx, i, f);
        if (b && b->n_ids)
            memcpy(ids + off[i], b->ids, b->n_ids * sizeof *ids);
    }
    out->ids = ids;
    out->offsets = off;
    return 0;
}

typedef struct bagctx {
    const Ikbo__V1__SparseFeature **bags; /* [rows * n_feat] */
    int n_feat;
} bagctx;

static const Ikbo__V1__SparseFeature *bag_at(void *ctx, size_t i, int f)
{
    bagctx *c = ctx;
    return c->bags[i * (size_t)c->n_feat + (size_t)f];
}

rq_plan *rq_plan_build(const Ikbo__V1__RankRequest *req, const ikbo_model_info *mi,
                       rq_status *st)
{
    return rq_plan_build_opts(req, mi, NULL, st);
}

rq_plan *rq_plan_build_opts(const Ikbo__V1__RankRequest *req, const ikbo_model_info *mi,
                            const rq_plan_opts *opts, rq_status *st)
{
    const size_t NU = req->n_users, NC = req->n_candidates;
    const int nus = mi->n_user_sparse, ncs = mi->n_cand_sparse;
    if (!NU || !NC) {
        rq_status_set(st, RQ_INVALID_ARGUMENT, "%s",
                      !NU ? "users: request has no users" : "candidates: request has no candidates");
        return NULL;
    }
    if (NU > INT32_MAX / 2 || NC > INT32_MAX / 2) {
        rq_status_set(st, RQ_RESOURCE_EXHAUSTED, "request too large");
        return NULL;
    }

    rq_plan *p = calloc(1, sizeof *p);
    plan_priv *v = calloc(1, sizeof *v);
    urow *rows = NULL;
    int *bucket = NULL;
    const Ikbo__V1__SparseFeature **ubags = NULL, **cbags = NULL;
    int32_t *cand_row = NULL, *row_start = NULL;
    char mname[80];
    model_name(req, mi, mname, sizeof mname);
    if (!p || !v)
        goto nomem;
    p->priv_ = v;
    p->n_request_users = (int)NU;
    p->order = malloc(NC * sizeof *p->order);
    p->user_row = malloc(NU * sizeof *p->user_row);
    rows = malloc(NU * sizeof *rows);
    ubags = malloc((NU * (size_t)nus + 1) * sizeof *ubags);
    cand_row = malloc(NC * sizeof *cand_row);
    if (!p->order || !p->user_row || !rows || !ubags || !cand_row)
        goto nomem;
    for (size_t j = 0; j < NU; j++)
        p->user_row[j] = -1;

    /* Hash buckets: a power of two >= 2 * users. */
    size_t nb = 16;
    while (nb < 2 * NU)
        nb <<= 1;
    bucket = malloc(nb * sizeof *bucket);
    if (!bucket)
        goto nomem;
    for (size_t i = 0; i < nb; i++)
        bucket[i] = -1;

    /* Rows in order of first reference by a candidate. */
    int n_rows = 0;
    for (size_t i = 0; i < NC; i++) {
        const Ikbo__V1__Candidate *c = req->candidates[i];
        if (c->user >= NU) {
            rq_status_set(st, RQ_INVALID_ARGUMENT,
                          "candidates[%zu].user = %u but request has %zu users", i, c->user, NU);
            goto fail;
        }
        size_t j = c->user;
        if (p->user_row[j] < 0) {
            const Ikbo__V1__User *u = req->users[j];
            if (u->n_dense != (size_t)mi->user_dense) {
                rq_status_set(st, RQ_INVALID_ARGUMENT,
                              "users[%zu].dense has %zu values, model '%s' expects %d", j,
                              u->n_dense, mname, mi->user_dense);
                goto fail;
            }
            if (u->n_history_actions && u->n_history_actions != u->n_history_ids) {
                rq_status_set(st, RQ_INVALID_ARGUMENT,
                              "users[%zu].history_actions has %zu values but history_ids has %zu",
                              j, u->n_history_actions, u->n_history_ids);
                goto fail;
            }
            const Ikbo__V1__SparseFeature **bags = ubags + (size_t)n_rows * (size_t)nus;
            if (bags_by_model(u->sparse, u->n_sparse, mi->user_sparse, nus, bags, "users", j, st))
                goto fail;
            uint64_t h = (opts && opts->collide_hashes) ? 42 : user_hash(u, bags, nus);
            int r = bucket[h & (nb - 1)];
            while (r >= 0 && !(rows[r].hash == h && user_equal(rows[r].u, rows[r].bags, u, bags, nus)))
                r = rows[r].next;
            if (r < 0) {
                r = n_rows++;
                rows[r].u = u;
                rows[r].bags = bags;
                rows[r].hash = h;
                rows[r].next = bucket[h & (nb - 1)];
                bucket[h & (nb - 1)] = r;
            }
            p->user_row[j] = r;
        }
        cand_row[i] = p->user_row[j];
    }
    free(bucket);
    bucket = NULL;

    const int U = n_rows, C = (int)NC;
    p->row_user = malloc((size_t)U * sizeof *p->row_user);
    row_start = calloc((size_t)U + 1, sizeof *row_start);
    v->map = malloc((size_t)C * sizeof *v->map);
    if (!p->row_user || !row_start || !v->map)
        goto nomem;
    for (int r = 0; r < U; r++)
        p->row_user[r] = -1;
    for (size_t j = 0; j < NU; j++)
        if (p->user_row[j] >= 0 && p->row_user[p->user_row[j]] < 0)
            p->row_user[p->user_row[j]] = (int32_t)j;

    /* Counting sort by row, stable within a row: map is non-decreasing. */
    for (int i = 0; i < C; i++)
        row_start[cand_row[i] + 1]++;
    for (int r = 0; r < U; r++)
        row_start[r + 1] += row_start[r];
    for (int i = 0; i < C; i++) {
        int pos = row_start[cand_row[i]]++;
        p->order[pos] = i;
        v->map[pos] = cand_row[i];
    }

    /* Candidate inputs in batch order. */
    cbags = malloc(((size_t)C * (size_t)ncs + 1) * sizeof *cbags);
    if (!cbags)
        goto nomem;
    if (mi->cand_dense > 0) {
        v->cand_dense = malloc((size_t)C * (size_t)mi->cand_dense * sizeof(float));
        if (!v->cand_dense)
            goto nomem;
    }
    for (int i = 0; i < C; i++) {
        size_t ri = (size_t)p->order[i];
        const Ikbo__V1__Candidate *c = req->candidates[ri];
        if (c->n_dense != (size_t)mi->cand_dense) {
            rq_status_set(st, RQ_INVALID_ARGUMENT,
                          "candidates[%zu].dense has %zu values, model '%s' expects %d", ri,
                          c->n_dense, mname, mi->cand_dense);
            goto fail;
        }
        if (mi->cand_dense > 0)
            memcpy(v->cand_dense + (size_t)i * (size_t)mi->cand_dense, c->dense,
                   (size_t)mi->cand_dense * sizeof(float));
        if (bags_by_model(c->sparse, c->n_sparse, mi->cand_sparse, ncs,
                          cbags + (size_t)i * (size_t)ncs, "candidates", ri, st))
            goto fail;
    }

    /* Jagged arrays: ids + offsets per feature. */
    v->bufs = malloc((size_t)(2 * (nus + ncs) + 1) * sizeof *v->bufs);
    v->user_sparse = malloc(((size_t)nus + 1) * sizeof *v->user_sparse);
    v->cand_sparse = malloc(((size_t)ncs + 1) * sizeof *v->cand_sparse);
    if (!v->bufs || !v->user_sparse || !v->cand_sparse)
        goto nomem;
    bagctx uctx = {ubags, nus}, cctx = {cbags, ncs};
    for (int f = 0; f < nus; f++)
        if (build_jagged(v, (size_t)U, f, bag_at, &uctx, &v->user_sparse[f]))
            goto nomem;
    for (int f = 0; f < ncs; f++)
        if (build_jagged(v, (size_t)C, f, bag_at, &cctx, &v->cand_sparse[f]))
            goto nomem;

    /* User dense and history, one row per unique user. */
    if (mi->user_dense > 0) {
        v->user_dense = malloc((size_t)U * (size_t)mi->user_dense * sizeof(float));
        if (!v->user_dense)
            goto nomem;
        for (int r = 0; r < U; r++)
            memcpy(v->user_dense + (size_t)r * (size_t)mi->user_dense, rows[r].u->dense,
                   (size_t)mi->user_dense * sizeof(float));
    }
    v->hist_offsets = malloc(((size_t)U + 1) * sizeof *v->hist_offsets);
    if (!v->hist_offsets)
        goto nomem;
    v->hist_offsets[0] = 0;
    int any_actions = 0;
    for (int r = 0; r < U; r++) {
        const Ikbo__V1__User *u = rows[r].u;
        size_t n = mi->has_history ? u->n_history_ids : 0;
        v->hist_offsets[r + 1] = v->hist_offsets[r] + (int64_t)n;
        if (n && u->n_history_actions)
            any_actions = 1;
    }
    size_t H = (size_t)v->hist_offsets[U];
    v->hist_ids = malloc((H ? H : 1) * sizeof *v->hist_ids);
    if (!v->hist_ids)
        goto nomem;
    if (any_actions) {
        v->hist_actions = calloc(H ? H : 1, sizeof *v->hist_actions);
        if (!v->hist_actions)
            goto nomem;
    }
    for (int r = 0; r < U; r++) {
        const Ikbo__V1__User *u = rows[r].u;
        size_t n = (size_t)(v->hist_offsets[r + 1] - v->hist_offsets[r]);
        if (!n)
            continue;
        memcpy(v->hist_ids + v->hist_offsets[r], u->history_ids, n * sizeof(int64_t));
        if (any_actions && u->n_history_actions)
            memcpy(v->hist_actions + v->hist_offsets[r], u->history_actions, n * sizeof(int32_t));
    }

    ikbo_batch *b = &p->batch;
    b->n_users = U;
    b->n_cands = C;
    b->user_dense = v->user_dense;
    b->user_sparse = v->user_sparse;
    b->hist.ids = v->hist_ids;
    b->hist.offsets = v->hist_offsets;
    b->hist_actions = v->hist_actions;
    b->cand_dense = v->cand_dense;
    b->cand_sparse = v->cand_sparse;
    b->map = v->map;

    free(rows);
    free(ubags);
    free(cbags);
    free(cand_row);
    free(row_start);
    rq_status_ok(st);
    return p;

nomem:
    rq_status_oom(st);
fail:
    free(bucket);
    free(rows);
    free(ubags);
    free(cbags);
    free(cand_row);
    free(row_start);
    rq_plan_free(p);
    if (!p)
        free(v);
    return NULL;
}

