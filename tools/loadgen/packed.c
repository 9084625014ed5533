/* packed.c - the classic RankRequest tree re-laid out in the packed encoding
 * (see packed.h for the rules it follows). */
#include "packed.h"

#include <stdlib.h>
#include <string.h>

#include "shape.h" /* lg_seterr */

/* ---- little-endian columns ---------------------------------------------- */

typedef struct bbuf {
    uint8_t *p;
    size_t len, cap;
    int failed;
} bbuf;

static void bb_put(bbuf *b, const uint8_t *src, size_t n)
{
    if (b->failed) return;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n) cap *= 2;
        uint8_t *p = realloc(b->p, cap);
        if (!p) {
            b->failed = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, src, n);
    b->len += n;
}

/* Byte by byte, so the layout is little-endian whatever the host is. */
static void put_u32(bbuf *b, uint32_t v)
{
    uint8_t x[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    bb_put(b, x, 4);
}

static void put_i64(bbuf *b, int64_t v)
{
    uint64_t u = (uint64_t)v;
    uint8_t x[8];
    for (int i = 0; i < 8; i++) x[i] = (uint8_t)(u >> (8 * i));
    bb_put(b, x, 8);
}

static void put_f32(bbuf *b, float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    put_u32(b, u);
}

static ProtobufCBinaryData bb_data(const bbuf *b) { return (ProtobufCBinaryData){b->len, b->p}; }

/* ---- sparse features ------------------------------------------------------ */

/* One entity's bags (a User's or a Candidate's sparse list). */
typedef struct bag_list {
    Ikbo__V1__SparseFeature **bags;
    size_t n;
} bag_list;

/* The PackedSparse columns of one side (users or candidates). */
typedef struct sparse_cols {
    Ikbo__V1__PackedSparse *msg;
    Ikbo__V1__PackedSparse **ptr;
    bbuf *lengths, *ids;
    size_t n;
} sparse_cols;

static void sparse_cols_free(sparse_cols *sc)
{
    for (size_t f = 0; f < sc->n; f++) {
        free(sc->lengths[f].p);
        free(sc->ids[f].p);
    }
    free(sc->msg);
    free(sc->ptr);
    free(sc->lengths);
    free(sc->ids);
    memset(sc, 0, sizeof *sc);
}

static const Ikbo__V1__SparseFeature *find_bag(const bag_list *e, const char *name)
{
    for (size_t j = 0; j < e->n; j++)
        if (!strcmp(e->bags[j]->name, name)) return e->bags[j];
    return NULL;
}

/* The distinct feature names of count entities, in first appearance order
 * (*names malloc'd, pointing into the bags). what: "users" or
 * "candidates", for the message. */
static int collect_names(const bag_list *e, size_t count, const char *what, const char ***names,
                         size_t *nn, char *errbuf, size_t n)
{
    size_t cap = 0;
    *names = NULL;
    *nn = 0;
    for (size_t i = 0; i < count; i++)
        for (size_t j = 0; j < e[i].n; j++) {
            const char *name = e[i].bags[j]->name;
            for (size_t k = 0; k < j; k++)
                if (!strcmp(e[i].bags[k]->name, name))
                    return lg_seterr(errbuf, n, "%s[%zu].sparse[%zu]: feature '%s' is also sparse[%zu]"
                                     " (the packed encoding has one bag per feature)", what, i, j, name, k);
            size_t f = 0;
            while (f < *nn && strcmp((*names)[f], name)) f++;
            if (f < *nn) continue;
            if (*nn == cap) {
                cap = cap ? 2 * cap : 8;
                const char **p = realloc(*names, cap * sizeof *p);
                if (!p) return lg_seterr(errbuf, n, "out of memory");
                *names = p;
            }
            (*names)[(*nn)++] = name;
        }
    return 0;
}

static int pack_sparse(sparse_cols *sc, const bag_list *e, size_t count, const char *what,
                       char *errbuf, size_t n)
{
    const char **names;
    size_t nn;
    if (collect_names(e, count, what, &names, &nn, errbuf, n)) {
        free(names);
        return -1;
    }
    sc->msg = calloc(nn ? nn : 1, sizeof *sc->msg);
    sc->ptr = calloc(nn ? nn : 1, sizeof *sc->ptr);
    sc->lengths = calloc(nn ? nn : 1, sizeof *sc->lengths);
    sc->ids = calloc(nn ? nn : 1, sizeof *sc->ids);
    if (!sc->msg || !sc->ptr || !sc->lengths || !sc->ids) {
        free(names);
        return lg_seterr(errbuf, n, "out of memory");
    }
    sc->n = nn;
    int failed = 0;
    for (size_t f = 0; f < nn; f++) {
        for (size_t i = 0; i < count; i++) {
            const Ikbo__V1__SparseFeature *sf = find_bag(&e[i], names[f]);
            size_t k = sf ? sf->n_ids : 0;
            put_u32(&sc->lengths[f], (uint32_t)k);
            for (size_t x = 0; x < k; x++) put_i64(&sc->ids[f], sf->ids[x]);
        }
        ikbo__v1__packed_sparse__init(&sc->msg[f]);
        sc->msg[f].name = (char *)names[f];
        sc->msg[f].lengths = bb_data(&sc->lengths[f]);
        sc->msg[f].ids = bb_data(&sc->ids[f]);
        sc->ptr[f] = &sc->msg[f];
        failed |= sc->lengths[f].failed | sc->ids[f].failed;
    }
    free(names);
    return failed ? lg_seterr(errbuf, n, "out of memory") : 0;
}

/* ---- users and candidates --------------------------------------------------- */

enum { C_UDENSE, C_HLEN, C_HIDS, C_HACT, C_CIDS, C_CUSERS, C_CDENSE, N_COLS };

typedef struct packer {
    bbuf col[N_COLS];
    char **keys;
    bag_list *bags; /* scratch for one side at a time: max(users, candidates) */
    sparse_cols us, cs;
} packer;

static int ragged(char *errbuf, size_t n, const char *what, size_t i, size_t got, size_t want)
{
    return lg_seterr(errbuf, n, "%s[%zu].dense: %zu values, %s[0] has %zu (the packed encoding takes "
                        "one width)", what, i, got, what, want);
}

static void packer_free(packer *pk)
{
    for (int c = 0; c < N_COLS; c++) free(pk->col[c].p);
    free(pk->keys);
    free(pk->bags);
    sparse_cols_free(&pk->us);
    sparse_cols_free(&pk->cs);
}

static int cols_failed(const packer *pk)
{
    for (int c = 0; c < N_COLS; c++)
        if (pk->col[c].failed) return 1;
    return 0;
}

static int pack_users(packer *pk, Ikbo__V1__PackedUsers *pu, const Ikbo__V1__RankRequest *q,
                      char *errbuf, size_t n)
{
    size_t count = q->n_users;
    int any_key = 0, any_hist = 0, any_act = 0;
    for (size_t i = 0; i < count; i++) {
        const Ikbo__V1__User *u = q->users[i];
        if (u->n_dense != q->users[0]->n_dense)
            return ragged(errbuf, n, "users", i, u->n_dense, q->users[0]->n_dense);
        if (u->n_history_actions && u->n_history_actions != u->n_history_ids)
            return lg_seterr(errbuf, n, "users[%zu].history_actions: %zu values for %zu history ids",
                             i, u->n_history_actions, u->n_history_ids);
        any_key |= u->key && *u->key;
        any_hist |= u->n_history_ids > 0;
        any_act |= u->n_history_actions > 0;
        pk->bags[i] = (bag_list){u->sparse, u->n_sparse};
    }
    if (any_key && !(pk->keys = calloc(count, sizeof *pk->keys)))
        return lg_seterr(errbuf, n, "out of memory");
    for (size_t i = 0; i < count; i++) {
        const Ikbo__V1__User *u = q->users[i];
        if (any_key) pk->keys[i] = u->key ? u->key : "";
        for (size_t k = 0; k < u->n_dense; k++) put_f32(&pk->col[C_UDENSE], u->dense[k]);
        if (any_hist) put_u32(&pk->col[C_HLEN], (uint32_t)u->n_history_ids);
        for (size_t k = 0; k < u->n_history_ids; k++) {
            put_i64(&pk->col[C_HIDS], u->history_ids[k]);
            if (any_act) put_u32(&pk->col[C_HACT], u->n_history_actions ? (uint32_t)u->history_actions[k] : 0);
        }
    }
    if (pack_sparse(&pk->us, pk->bags, count, "users", errbuf, n)) return -1;
    pu->count = (uint32_t)count;
    pu->n_keys = any_key ? count : 0;
    pu->keys = pk->keys;
    pu->dense = bb_data(&pk->col[C_UDENSE]);
    pu->n_sparse = pk->us.n;
    pu->sparse = pk->us.ptr;
    pu->history_lengths = bb_data(&pk->col[C_HLEN]);
    pu->history_ids = bb_data(&pk->col[C_HIDS]);
    pu->history_actions = bb_data(&pk->col[C_HACT]);
    return 0;
}

static int pack_candidates(packer *pk, Ikbo__V1__PackedCandidates *pc,
                           const Ikbo__V1__RankRequest *q, char *errbuf, size_t n)
{
    size_t count = q->n_candidates;
    for (size_t i = 0; i < count; i++) {
        const Ikbo__V1__Candidate *c = q->candidates[i];
        if (c->n_dense != q->candidates[0]->n_dense)
            return ragged(errbuf, n, "candidates", i, c->n_dense, q->candidates[0]->n_dense);
        put_i64(&pk->col[C_CIDS], c->id);
        put_u32(&pk->col[C_CUSERS], c->user);
        for (size_t k = 0; k < c->n_dense; k++) put_f32(&pk->col[C_CDENSE], c->dense[k]);
        pk->bags[i] = (bag_list){c->sparse, c->n_sparse};
    }
    if (pack_sparse(&pk->cs, pk->bags, count, "candidates", errbuf, n)) return -1;
    pc->count = (uint32_t)count;
    pc->ids = bb_data(&pk->col[C_CIDS]);
    pc->users = bb_data(&pk->col[C_CUSERS]);
    pc->dense = bb_data(&pk->col[C_CDENSE]);
    pc->n_sparse = pk->cs.n;
    pc->sparse = pk->cs.ptr;
    return 0;
}

int lg_pack_columnar(const Ikbo__V1__RankRequest *q, uint8_t **out, size_t *len, char *errbuf,
                     size_t n)
{
    packer pk = {0};
    Ikbo__V1__PackedUsers pu = IKBO__V1__PACKED_USERS__INIT;
    Ikbo__V1__PackedCandidates pc = IKBO__V1__PACKED_CANDIDATES__INIT;
    int rc = -1;
    *out = NULL;
    *len = 0;
    size_t most = q->n_users > q->n_candidates ? q->n_users : q->n_candidates;
    if (!(pk.bags = calloc(most ? most : 1, sizeof *pk.bags))) return lg_seterr(errbuf, n, "out of memory");
    if (pack_users(&pk, &pu, q, errbuf, n) || pack_candidates(&pk, &pc, q, errbuf, n)) goto done;
    if (cols_failed(&pk)) {
        lg_seterr(errbuf, n, "out of memory");
        goto done;
    }
    Ikbo__V1__RankRequest r = IKBO__V1__RANK_REQUEST__INIT;
    r.model = q->model;
    r.model_version = q->model_version;
    r.top_k = q->top_k;
    r.request_id = q->request_id;
    r.packed_users = &pu;
    r.packed_candidates = &pc;
    *len = ikbo__v1__rank_request__get_packed_size(&r);
    if (!(*out = malloc(*len ? *len : 1))) {
        lg_seterr(errbuf, n, "out of memory");
        goto done;
    }
    ikbo__v1__rank_request__pack(&r, *out);
    rc = 0;
done:
    packer_free(&pk);
    return rc;
}
