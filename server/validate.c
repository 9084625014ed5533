/* validate.c - limits and field checks of a RankRequest against a model,
 * over either encoding, into the canonical view the plan reads (rq_view.h).
 *
 * Why this exists: every rule an invalid request can break is here once,
 * with messages that name the field and index (`candidates[3].dense[2] is
 * NaN`). The classic and the packed encoding are mapped to the same rows
 * first and the value rules run on those rows, so both encodings get the
 * same answers; only what is specific to an encoding's shape (a packed
 * column's byte size, a classic entity's feature list) is checked in its
 * own filler. Policies: request.h. Reentrant.
 */
#include "rq_view.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void rq_limits_default(rq_limits *l)
{
    l->max_users = RQ_DEFAULT_MAX_USERS;
    l->max_candidates = RQ_DEFAULT_MAX_CANDIDATES;
    l->max_ids_per_bag = RQ_DEFAULT_MAX_IDS_PER_BAG;
    l->max_history = RQ_DEFAULT_MAX_HISTORY;
    l->max_sparse_features = RQ_DEFAULT_MAX_SPARSE_FEATURES;
    l->max_message_bytes = RQ_DEFAULT_MAX_MESSAGE_BYTES;
}

/* ---- names for messages ---------------------------------------------- */

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

/* The model's name for messages: the request's, else its directory's. */
static void model_name(const Ikbo__V1__RankRequest *req, const ikbo_model_info *mi, char *out,
                       size_t n)
{
    if (req->model && req->model[0]) {
        safe_name(req->model, out, n);
        return;
    }
    const char *d = mi->dir ? mi->dir : "";
    size_t len = strlen(d);
    while (len && d[len - 1] == '/') len--;
    size_t e = len;
    while (e && d[e - 1] != '/') e--; /* skip the version component */
    while (e && d[e - 1] == '/') e--;
    size_t b = e;
    while (b && d[b - 1] != '/') b--;
    if (e > b) snprintf(out, n, "%.*s", (int)(e - b), d + b);
    else snprintf(out, n, "%.*s", (int)len, d);
}

static int find_name(const char *const *names, int n, const char *s)
{
    for (int i = 0; i < n; i++)
        if (names[i] && s && !strcmp(names[i], s)) return i;
    return -1;
}

/* ---- checking context ------------------------------------------------- */

/* Bag names already matched to a model feature, by pointer: the fast
 * decoder gives equal names one shared string (rank_wire.c set_bag_name),
 * so most of a request's bags are found here without a string compare. */
#define NAME_MEMO 8
typedef struct name_memo {
    const char *s[NAME_MEMO];
    int fi[NAME_MEMO];
    int n, next;
} name_memo;

typedef struct vctx {
    const ikbo_model_info *mi;
    const rq_limits *lim; /* NULL = structure only */
    rq_view *v;
    rq_status *st;
    char mname[80];
    name_memo memo[2]; /* per entity: ENT_USER, ENT_CAND */
} vctx;

enum { ENT_USER = 0, ENT_CAND = 1 };
static const char *const ENT[2] = {"users", "candidates"};
static const char *const KIND[2] = {"user", "candidate"};

/* The two refusals a request check makes; both return -1. */
#define bad(x, ...) rq_status_set((x)->st, RQ_INVALID_ARGUMENT, __VA_ARGS__)
#define over(x, ...) rq_status_set((x)->st, RQ_RESOURCE_EXHAUSTED, __VA_ARGS__)

static int unknown_feature(vctx *x, int ent, const char *path, const char *name)
{
    const char *const *names = ent ? x->mi->cand_sparse : x->mi->user_sparse;
    int n_names = ent ? x->mi->n_cand_sparse : x->mi->n_user_sparse;
    char list[240], nb[80];
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
    safe_name(name, nb, sizeof nb);
    return bad(x, "%s.name = \"%s\": unknown %s sparse feature (model has: %s)", path, nb,
               KIND[ent], n_names ? list : "none");
}

/* ---- value rules, on canonical rows (both encodings) ----------------- */

static const char *nonfinite_name(float f)
{
    return isnan(f) ? "NaN" : f > 0 ? "Infinity" : "-Infinity";
}

/* Whether any of n floats at b (any alignment) is NaN or infinite: its
 * exponent bits all ones, i.e. (bits & 0x7f800000) + 0x00800000 reaches
 * bit 31. Two floats a 64-bit word (the low half's sum never carries into
 * the high half), four words a step, where the one-float loop took ~2
 * cycles a value (GCC 12 at -O2 vectorizes neither; build/host_path: 14 of
 * a 16 x 70 bench request's 57 us of plan). */
static int any_nonfinite(const unsigned char *b, size_t n)
{
    const uint64_t m = 0x7f8000007f800000ull, c = 0x0080000000800000ull;
    uint64_t acc = 0;
    size_t k = 0;
    for (; k + 8 <= n; k += 8) {
        uint64_t w[4];
        memcpy(w, b + 4 * k, sizeof w);
        acc |= ((w[0] & m) + c) | ((w[1] & m) + c) | ((w[2] & m) + c) | ((w[3] & m) + c);
    }
    for (; k < n; k++) {
        uint32_t w;
        memcpy(&w, b + 4 * k, 4);
        acc |= (uint64_t)((w & 0x7f800000u) + 0x00800000u);
    }
    return (acc & 0x8000000080000000ull) != 0;
}

/* The scan, then the first bad value named. */
static int check_dense_values(vctx *x, int ent, size_t idx, const void *dense, int n)
{
    if (!x->lim || n <= 0 || !any_nonfinite(dense, (size_t)n)) return 0;
    const unsigned char *b = dense;
    for (int k = 0; k < n; k++) {
        float f;
        memcpy(&f, b + 4 * (size_t)k, 4);
        if (!isfinite(f))
            return bad(x, "%s[%zu].dense[%d] is %s", ENT[ent], idx, k, nonfinite_name(f));
    }
    return 0;
}

/* The filler has checked that actions are absent or one per history id. */
static int check_history_values(vctx *x, size_t j, const rs_row *r)
{
    const ikbo_model_info *mi = x->mi;
    if (!x->lim || (!r->hist.n && !r->act.n)) return 0;
    if (!mi->has_history)
        return bad(x, "users[%zu].%s: model '%s' takes no history", j,
                   r->hist.n ? "history_ids" : "history_actions", x->mname);
    if (r->hist.n > x->lim->max_history)
        return over(x, "users[%zu].history_ids has %zu events, limit max_history = %u", j,
                    r->hist.n, x->lim->max_history);
    const unsigned char *a = r->act.p;
    const uint32_t lim = mi->hist_actions > 0 ? (uint32_t)mi->hist_actions : 0;
    /* as check_dense_values: scan, then name the first; eight actions a step
     * (GCC vectorizes the fixed-width block, not the loop) */
    uint32_t any = 0;
    size_t k = 0;
    for (; k + 8 <= r->act.n; k += 8) {
        uint32_t w[8];
        memcpy(w, a + 4 * k, sizeof w);
        for (int q = 0; q < 8; q++) any |= (uint32_t)(w[q] >= lim); /* negatives wrap above lim */
    }
    for (; k < r->act.n; k++) {
        uint32_t w;
        memcpy(&w, a + 4 * k, 4);
        any |= (uint32_t)(w >= lim);
    }
    for (k = 0; any && k < r->act.n; k++) {
        int32_t v;
        memcpy(&v, a + 4 * k, 4);
        if (v < 0 || v >= mi->hist_actions)
            return bad(x, "users[%zu].history_actions[%zu] = %d is outside [0, %d) for model '%s'",
                       j, k, v, mi->hist_actions, x->mname);
    }
    return 0;
}

/* ---- the classic encoding --------------------------------------------- */

static int classic_dense(vctx *x, int ent, size_t idx, const float *v, size_t n)
{
    int want = ent ? x->mi->cand_dense : x->mi->user_dense;
    if (n != (size_t)(want > 0 ? want : 0))
        return bad(x, "%s[%zu].dense has %zu values, model '%s' expects %d", ENT[ent], idx, n,
                   x->mname, want);
    return check_dense_values(x, ent, idx, v, (int)n);
}

/* find_name over the entity's feature names, through its memo. */
static int find_bag(vctx *x, int ent, const char *const *names, int n_names, const char *s)
{
    name_memo *m = &x->memo[ent];
    for (int i = 0; i < m->n; i++)
        if (m->s[i] == s) return m->fi[i];
    int fi = find_name(names, n_names, s);
    if (fi >= 0 && s) {
        int slot = m->n < NAME_MEMO ? m->n++ : m->next++ % NAME_MEMO;
        m->s[slot] = s;
        m->fi[slot] = fi;
    }
    return fi;
}

/* An entity's features into bags[] in model order; absent ones stay empty. */
static int classic_sparse(vctx *x, int ent, size_t idx, Ikbo__V1__SparseFeature *const *sp,
                          size_t n, rs_span *bags)
{
    const char *const *names = ent ? x->mi->cand_sparse : x->mi->user_sparse;
    int n_names = ent ? x->mi->n_cand_sparse : x->mi->n_user_sparse;
    if (x->lim && n > x->lim->max_sparse_features)
        return over(x, "%s[%zu].sparse has %zu features, limit max_sparse_features = %u",
                    ENT[ent], idx, n, x->lim->max_sparse_features);
    for (size_t k = 0; k < n; k++) {
        const Ikbo__V1__SparseFeature *s = sp[k];
        char path[96], nb[80];
        int fi = find_bag(x, ent, names, n_names, s->name);
        int fault = fi < 0 || bags[fi].p || (x->lim && s->n_ids > x->lim->max_ids_per_bag);
        if (!fault) {
            bags[fi] = (rs_span){s->ids ? (const void *)s->ids : (const void *)"", s->n_ids};
            continue;
        }
        snprintf(path, sizeof path, "%s[%zu].sparse[%zu]", ENT[ent], idx, k);
        if (fi < 0) return unknown_feature(x, ent, path, s->name);
        if (bags[fi].p) { /* given before: name where */
            size_t prev = 0;
            while (prev < k && strcmp(sp[prev]->name, s->name)) prev++;
            safe_name(s->name, nb, sizeof nb);
            return bad(x, "%s.name = \"%s\": duplicate feature (also %s[%zu].sparse[%zu])", path,
                       nb, ENT[ent], idx, prev);
        }
        return over(x, "%s.ids has %zu ids, limit max_ids_per_bag = %u", path, s->n_ids,
                    x->lim->max_ids_per_bag);
    }
    return 0;
}

static int classic_users(vctx *x, const Ikbo__V1__RankRequest *req)
{
    rq_view *v = x->v;
    for (size_t j = 0; j < v->n_users; j++) {
        const Ikbo__V1__User *u = req->users[j];
        rs_row *r = &v->users[j];
        r->key = u->key ? u->key : "";
        r->dense = u->dense;
        if (classic_dense(x, ENT_USER, j, u->dense, u->n_dense) ||
            classic_sparse(x, ENT_USER, j, u->sparse, u->n_sparse, (rs_span *)r->bags))
            return -1;
        if (u->n_history_actions && u->n_history_actions != u->n_history_ids)
            return bad(x, "users[%zu].history_actions has %zu values but history_ids has %zu "
                          "(give none or one per id)",
                       j, u->n_history_actions, u->n_history_ids);
        r->hist = (rs_span){u->history_ids, u->n_history_ids};
        r->act = (rs_span){u->history_actions, u->n_history_actions};
        if (check_history_values(x, j, r)) return -1;
    }
    return 0;
}

static int classic_cands(vctx *x, const Ikbo__V1__RankRequest *req)
{
    rq_view *v = x->v;
    for (size_t i = 0; i < v->n_cands; i++) {
        const Ikbo__V1__Candidate *c = req->candidates[i];
        if (c->user >= v->n_users)
            return bad(x, "candidates[%zu].user = %u but request has %zu users", i, c->user,
                       v->n_users);
        v->cand_user[i] = (int32_t)c->user;
        v->cand_id[i] = c->id;
        v->cands[i].dense = c->dense;
        if (classic_dense(x, ENT_CAND, i, c->dense, c->n_dense) ||
            classic_sparse(x, ENT_CAND, i, c->sparse, c->n_sparse, (rs_span *)v->cands[i].bags))
            return -1;
    }
    return 0;
}

/* ---- the packed encoding ---------------------------------------------- */

static uint32_t u32_at(const ProtobufCBinaryData *b, size_t i)
{
    uint32_t v;
    memcpy(&v, b->data + 4 * i, 4);
    return v;
}

/* A fixed-width column of `want` elements (0 allowed when `optional`). */
static int column(vctx *x, const char *path, const ProtobufCBinaryData *b, size_t want,
                  size_t width, const char *what, int optional)
{
    if (b->len == want * width || (optional && b->len == 0)) return 0;
    return bad(x, "%s has %zu bytes, expected %zu (%s, %zu bytes each%s)", path, b->len,
               want * width, what, width, optional ? ", or none" : "");
}

/* Entity i's span of a jagged column, stored at base + i * stride (bytes),
 * from a lengths column (uint32 per entity) over an ids column of
 * `width`-byte elements; lp and ip name the two columns. */
static int jag_spans(vctx *x, const char *lp, const char *ip, const ProtobufCBinaryData *lengths,
                     const ProtobufCBinaryData *ids, size_t width, size_t count, char *base,
                     size_t stride)
{
    if (column(x, lp, lengths, count, 4, "one uint32 per entity", 0)) return -1;
    size_t at = 0, n_ids = ids->len / width;
    for (size_t i = 0; i < count; i++) {
        size_t n = u32_at(lengths, i);
        if (n > n_ids - at)
            return bad(x, "%s[%zu] = %zu runs past the end of %s (%zu elements)", lp, i, n, ip,
                       n_ids);
        rs_span sp = {ids->data ? ids->data + width * at : (const void *)"", n};
        memcpy(base + i * stride, &sp, sizeof sp);
        at += n;
    }
    if (ids->len != width * at)
        return bad(x, "%s has %zu bytes, expected %zu (the sum of the lengths, %zu, x %zu)", ip,
                   ids->len, width * at, at, width);
    return 0;
}

/* Every PackedSparse of one side into the rows' bags (model order). */
static int packed_sparse(vctx *x, int ent, const char *side, Ikbo__V1__PackedSparse *const *sp,
                         size_t n, size_t count, rs_span *bags)
{
    const char *const *names = ent ? x->mi->cand_sparse : x->mi->user_sparse;
    const int n_names = ent ? x->mi->n_cand_sparse : x->mi->n_user_sparse;
    if (x->lim && n > x->lim->max_sparse_features)
        return over(x, "%s.sparse has %zu features, limit max_sparse_features = %u", side, n,
                    x->lim->max_sparse_features);
    for (size_t k = 0; k < n; k++) {
        char path[96], nb[80];
        snprintf(path, sizeof path, "%s.sparse[%zu]", side, k);
        int fi = find_name(names, n_names, sp[k]->name);
        if (fi < 0) return unknown_feature(x, ent, path, sp[k]->name);
        for (size_t q = 0; q < k; q++)
            if (!strcmp(sp[q]->name, sp[k]->name)) {
                safe_name(sp[k]->name, nb, sizeof nb);
                return bad(x, "%s.name = \"%s\": duplicate feature (also %s.sparse[%zu])", path,
                           nb, side, q);
            }
        char lp[112], ip[112];
        snprintf(lp, sizeof lp, "%s.lengths", path);
        snprintf(ip, sizeof ip, "%s.ids", path);
        if (jag_spans(x, lp, ip, &sp[k]->lengths, &sp[k]->ids, 8, count, (char *)(bags + fi),
                      (size_t)n_names * sizeof *bags))
            return -1;
        for (size_t i = 0; x->lim && i < count; i++)
            if (bags[i * (size_t)n_names + (size_t)fi].n > x->lim->max_ids_per_bag)
                return over(x, "%s[%zu].sparse[%zu].ids has %zu ids, limit max_ids_per_bag = %u",
                            ENT[ent], i, k, bags[i * (size_t)n_names + (size_t)fi].n,
                            x->lim->max_ids_per_bag);
    }
    return 0;
}

static int packed_users(vctx *x, const Ikbo__V1__PackedUsers *pu)
{
    rq_view *v = x->v;
    const size_t U = v->n_users, ud = (size_t)v->d.user_dense;
    if (pu->n_keys && pu->n_keys != U)
        return bad(x, "packed_users.keys has %zu keys but count is %zu (give none or one per "
                      "user)", pu->n_keys, U);
    if (column(x, "packed_users.dense", &pu->dense, U * ud, 4, "count x user_dense floats", 0) ||
        packed_sparse(x, ENT_USER, "packed_users", pu->sparse, pu->n_sparse, U,
                      (rs_span *)v->users[0].bags))
        return -1;
    if ((pu->history_lengths.len || pu->history_ids.len) &&
        jag_spans(x, "packed_users.history_lengths", "packed_users.history_ids",
                  &pu->history_lengths, &pu->history_ids, 8, U, (char *)&v->users[0].hist,
                  sizeof(rs_row)))
        return -1;
    if (pu->history_actions.len && pu->history_actions.len != pu->history_ids.len / 2)
        return bad(x, "packed_users.history_actions has %zu bytes but history_ids has %zu ids "
                      "(give none or one int32 per id)",
                   pu->history_actions.len, pu->history_ids.len / 8);
    for (size_t j = 0, at = 0; j < U; j++) {
        rs_row *r = &v->users[j];
        r->key = pu->n_keys ? pu->keys[j] : "";
        r->dense = pu->dense.data + 4 * ud * j;
        if (pu->history_actions.len) r->act = (rs_span){pu->history_actions.data + 4 * at, r->hist.n};
        at += r->hist.n;
        if (check_dense_values(x, ENT_USER, j, r->dense, (int)ud) ||
            check_history_values(x, j, r))
            return -1;
    }
    return 0;
}

static int packed_cands(vctx *x, const Ikbo__V1__PackedCandidates *pc)
{
    rq_view *v = x->v;
    const size_t C = v->n_cands, cd = (size_t)v->d.cand_dense;
    if (column(x, "packed_candidates.ids", &pc->ids, C, 8, "one int64 per candidate", 1) ||
        column(x, "packed_candidates.users", &pc->users, C, 4, "one uint32 per candidate", 0) ||
        column(x, "packed_candidates.dense", &pc->dense, C * cd, 4,
               "count x candidate_dense floats", 0) ||
        packed_sparse(x, ENT_CAND, "packed_candidates", pc->sparse, pc->n_sparse, C,
                      (rs_span *)v->cands[0].bags))
        return -1;
    for (size_t i = 0; i < C; i++) {
        uint32_t u = u32_at(&pc->users, i);
        if (u >= v->n_users)
            return bad(x, "candidates[%zu].user = %u but request has %zu users", i, u,
                       v->n_users);
        v->cand_user[i] = (int32_t)u;
        if (pc->ids.len) memcpy(&v->cand_id[i], pc->ids.data + 8 * i, 8);
        else v->cand_id[i] = 0;
        v->cands[i].dense = pc->dense.data + 4 * cd * i;
        if (check_dense_values(x, ENT_CAND, i, v->cands[i].dense, (int)cd)) return -1;
    }
    return 0;
}

/* ---- the view ----------------------------------------------------------- */

/* Counts and the encoding: 0 with the entity counts, or -1. */
static int counts(vctx *x, const Ikbo__V1__RankRequest *req, size_t *nu, size_t *nc)
{
    const Ikbo__V1__PackedUsers *pu = req->packed_users;
    const Ikbo__V1__PackedCandidates *pc = req->packed_candidates;
    if (pu || pc) {
        if (!pu || !pc)
            return bad(x, "%s: packed_users and packed_candidates are given together",
                       pu ? "packed_candidates" : "packed_users");
        if (req->n_users || req->n_candidates)
            return bad(x, "%s: the request has packed_users and packed_candidates, so it gives "
                          "no %s", req->n_users ? "users" : "candidates",
                       req->n_users ? "users" : "candidates");
    }
    *nu = pu ? pu->count : req->n_users;
    *nc = pc ? pc->count : req->n_candidates;
    if (*nu == 0) return bad(x, "users: request has no users");
    if (*nc == 0) return bad(x, "candidates: request has no candidates");
    if (x->lim && *nu > x->lim->max_users)
        return over(x, "users: request has %zu users, limit max_users = %u", *nu,
                    x->lim->max_users);
    if (x->lim && *nc > x->lim->max_candidates)
        return over(x, "candidates: request has %zu candidates, limit max_candidates = %u", *nc,
                    x->lim->max_candidates);
    if (*nu > INT32_MAX / 4 || *nc > INT32_MAX / 4) return over(x, "request too large");
    return 0;
}

/* The view's one block: rows, bag spans, candidate users and ids. Zeroed:
 * every bag starts empty ({NULL, 0}), which is how the fillers tell a
 * feature given twice. */
static int view_alloc(rq_view *v)
{
    const size_t U = v->n_users, C = v->n_cands;
    const size_t nus = (size_t)v->d.n_user_sparse, ncs = (size_t)v->d.n_cand_sparse;
    size_t bytes = U * sizeof(rs_row) + C * sizeof(rs_row) + (U * nus + C * ncs) * sizeof(rs_span) +
                   C * (sizeof(int32_t) + sizeof(int64_t));
    char *m = calloc(1, bytes ? bytes : 1);
    if (!m) return -1;
    v->mem_ = m;
    v->users = (rs_row *)m;
    v->cands = v->users + U;
    rs_span *ub = (rs_span *)(v->cands + C), *cb = ub + U * nus;
    v->cand_id = (int64_t *)(cb + C * ncs);
    v->cand_user = (int32_t *)(v->cand_id + C);
    for (size_t j = 0; j < U; j++) v->users[j].bags = ub + j * nus, v->users[j].key = "";
    for (size_t i = 0; i < C; i++) v->cands[i].bags = cb + i * ncs, v->cands[i].key = "";
    return 0;
}

int rq_view_build(const Ikbo__V1__RankRequest *req, const ikbo_model_info *mi,
                  const rq_limits *lim, rq_view *v, rq_status *st)
{
    memset(v, 0, sizeof *v);
    if (!req || !mi) return rq_status_set(st, RQ_INTERNAL, "rq_validate: no request or model");
    vctx x = {.mi = mi, .lim = lim, .v = v, .st = st};
    rs_dims_of(&v->d, mi);
    if (counts(&x, req, &v->n_users, &v->n_cands)) return -1;
    model_name(req, mi, x.mname, sizeof x.mname);
    if (view_alloc(v)) return rq_status_oom(st), -1;
    int rc = req->packed_users
                 ? (packed_users(&x, req->packed_users) || packed_cands(&x, req->packed_candidates))
                 : (classic_users(&x, req) || classic_cands(&x, req));
    if (rc) {
        rq_view_free(v);
        return -1;
    }
    /* A model without history ignores one given where nothing checked it. */
    for (size_t j = 0; !mi->has_history && j < v->n_users; j++)
        v->users[j].hist.n = v->users[j].act.n = 0;
    rq_status_ok(st);
    return 0;
}

void rq_view_free(rq_view *v)
{
    free(v->mem_);
    memset(v, 0, sizeof *v);
}

int rq_validate(const Ikbo__V1__RankRequest *req, const ikbo_model_info *mi,
                const rq_limits *lim, rq_status *st)
{
    rq_limits dl;
    if (!lim) {
        rq_limits_default(&dl);
        lim = &dl;
    }
    rq_view v;
    if (rq_view_build(req, mi, lim, &v, st)) return -1;
    rq_view_free(&v);
    return 0;
}
