/* rowset.c - user dedup, candidate grouping and batch assembly over
 * canonical rows (see rowset.h). */
#include "rowset.h"

#include <stdlib.h>
#include <string.h>

#include "hash.h"

/* ---- dedup ----------------------------------------------------------- */

/* Two hashes per row. The short one covers the key, dense values, bags,
 * the history's length and its first and last ids: for users that differ
 * at all it almost always differs, and it costs nothing next to the full
 * one, which adds every history id and the actions (~12 KB at 1024 events:
 * 20 us of a 16 x 70 bench request's plan, build/host_path). Rows are
 * chained by short hash, at most one row per short-hash value ("heads");
 * a row whose short hash equals a head's is chained by full hash in a
 * second bucket array instead, both hashes computed then (the head's once,
 * cached). So the full hash is computed only for rows that share a short
 * hash with another, each row at most once, and no chain grows with rows
 * that merely share a key: the work stays linear in the bytes, whatever
 * the input. */
struct rs_table {
    rs_dims d;
    int collide;
    size_t n, cap, mask;
    rs_row *rows;
    uint64_t *hs, *hf; /* short and full hash; hf valid iff has_full */
    unsigned char *has_full;
    int32_t *next;         /* next id in the same chain, -1 = end */
    int32_t *bs, *bf;      /* [mask + 1] first id by short / full hash, -1 = empty */
};

rs_table *rs_table_new(size_t max_rows, const rs_dims *d, int collide_hashes)
{
    if (max_rows > INT32_MAX / 4) return NULL;
    rs_table *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    size_t nb = 16;
    while (nb < 2 * max_rows) nb <<= 1;
    size_t cap = max_rows ? max_rows : 1;
    t->d = *d;
    t->collide = collide_hashes;
    t->cap = cap;
    t->mask = nb - 1;
    t->rows = malloc(cap * sizeof *t->rows);
    t->hs = malloc(2 * cap * sizeof *t->hs);
    t->has_full = malloc(cap);
    t->next = malloc(cap * sizeof *t->next);
    t->bs = malloc(2 * nb * sizeof *t->bs);
    if (!t->rows || !t->hs || !t->has_full || !t->next || !t->bs) {
        rs_table_free(t);
        return NULL;
    }
    t->hf = t->hs + cap;
    t->bf = t->bs + nb;
    memset(t->bs, 0xff, 2 * nb * sizeof *t->bs); /* all -1 */
    return t;
}

void rs_table_free(rs_table *t)
{
    if (!t) return;
    free(t->rows);
    free(t->hs);
    free(t->has_full);
    free(t->next);
    free(t->bs);
    free(t);
}

size_t rs_table_count(const rs_table *t) { return t->n; }
const rs_row *rs_table_rows(const rs_table *t) { return t->rows; }

static uint64_t short_hash(const rs_table *t, const rs_row *r)
{
    if (t->collide) return 42;
    uint64_t h = hash_bytes(0x1234567ull, r->key, strlen(r->key));
    h = hash_bytes(h, r->dense, (size_t)t->d.user_dense * sizeof(float));
    for (int f = 0; f < t->d.n_user_sparse; f++)
        h = hash_bytes(h, r->bags[f].p, r->bags[f].n * sizeof(int64_t));
    h = hash_mix64(h, (uint64_t)r->hist.n);
    if (r->hist.n) {
        const unsigned char *ids = r->hist.p;
        h = hash_bytes(h, ids, sizeof(int64_t));
        h = hash_bytes(h, ids + (r->hist.n - 1) * sizeof(int64_t), sizeof(int64_t));
    }
    return h;
}

/* The short hash with every history id and the actions folded in. */
static uint64_t full_hash(const rs_table *t, uint64_t hs, const rs_row *r)
{
    if (t->collide == 1) return 42;
    uint64_t h = hash_bytes(hs, r->hist.p, r->hist.n * sizeof(int64_t));
    return hash_actions(h, r->act.p, r->act.n); /* absent == all zero */
}

static uint64_t full_of(rs_table *t, int32_t id)
{
    if (!t->has_full[id]) {
        t->hf[id] = full_hash(t, t->hs[id], &t->rows[id]);
        t->has_full[id] = 1;
    }
    return t->hf[id];
}

static int span_equal(const rs_span *a, const rs_span *b, size_t width)
{
    return a->n == b->n && (!a->n || !memcmp(a->p, b->p, a->n * width));
}

static int row_equal(const rs_table *t, const rs_row *a, const rs_row *b)
{
    size_t ud = (size_t)t->d.user_dense * sizeof(float);
    if (strcmp(a->key, b->key) || (ud && memcmp(a->dense, b->dense, ud))) return 0;
    for (int f = 0; f < t->d.n_user_sparse; f++)
        if (!span_equal(&a->bags[f], &b->bags[f], sizeof(int64_t))) return 0;
    if (!span_equal(&a->hist, &b->hist, sizeof(int64_t))) return 0;
    if (a->act.n && b->act.n) return span_equal(&a->act, &b->act, sizeof(int32_t));
    /* one side absent: equal iff the other is all zero */
    const rs_span *o = a->act.n ? &a->act : &b->act;
    return hash_all_zero(o->p, o->n * sizeof(int32_t));
}

/* Appends *r as a new id at the head of *chain; -1 when full. */
static int32_t append(rs_table *t, const rs_row *r, uint64_t hs, int32_t *chain)
{
    if (t->n == t->cap) return -1;
    int32_t id = (int32_t)t->n++;
    t->rows[id] = *r;
    t->hs[id] = hs;
    t->has_full[id] = 0;
    t->next[id] = *chain;
    *chain = id;
    return id;
}

int rs_table_add(rs_table *t, const rs_row *r)
{
    const uint64_t hs = short_hash(t, r);
    int32_t *sc = &t->bs[hs & t->mask], head = *sc;
    while (head >= 0 && t->hs[head] != hs) head = t->next[head];
    if (head < 0) return append(t, r, hs, sc);
    /* A head shares the short hash: compare full hashes, then rows. */
    const uint64_t hf = full_hash(t, hs, r);
    if (full_of(t, head) == hf && row_equal(t, &t->rows[head], r)) return head;
    int32_t *fc = &t->bf[hf & t->mask];
    for (int32_t m = *fc; m >= 0; m = t->next[m])
        if (t->hf[m] == hf && row_equal(t, &t->rows[m], r)) return m;
    int32_t id = append(t, r, hs, fc);
    if (id >= 0) {
        t->hf[id] = hf;
        t->has_full[id] = 1;
    }
    return id;
}

/* ---- grouping -------------------------------------------------------- */

int rs_group(const int32_t *row_of, size_t n, size_t n_rows, int32_t *order, int32_t *map)
{
    int32_t *start = calloc(n_rows + 1, sizeof *start);
    if (!start) return -1;
    for (size_t i = 0; i < n; i++) start[row_of[i] + 1]++;
    for (size_t r = 0; r < n_rows; r++) start[r + 1] += start[r];
    for (size_t i = 0; i < n; i++) {
        int32_t pos = start[row_of[i]]++;
        order[pos] = (int32_t)i;
        map[pos] = row_of[i];
    }
    free(start);
    return 0;
}

/* ---- assembly -------------------------------------------------------- */

/* A bump layout over one block: first pass sizes it (base NULL), second
 * hands out the same offsets. */
typedef struct layout {
    char *base;
    size_t off;
} layout;

static void *take(layout *l, size_t bytes)
{
    void *p = l->base ? l->base + l->off : NULL;
    l->off += (bytes + 63) & ~(size_t)63;
    return p;
}

/* Where the next take will start (the fill pass, before its size is known). */
static void *next_take(const layout *l) { return l->base + l->off; }

/* Copies that continue the pending one in both source and destination are
 * merged into it, so columns whose rows already lie back to back (a
 * packed request's columns, candidates in request order) cost one memcpy
 * each instead of one per row (per candidate and bag, 8 bytes each). */
typedef struct run {
    unsigned char *dst;
    const unsigned char *src;
    size_t n;
} run;

static void run_flush(run *r)
{
    if (r->n) memcpy(r->dst, r->src, r->n);
    r->n = 0;
}

static inline void run_put(run *r, void *dst, const void *src, size_t n)
{
    if (!n) return;
    if (r->n && r->dst + r->n == (unsigned char *)dst && r->src + r->n == (const unsigned char *)src) {
        r->n += n;
        return;
    }
    run_flush(r);
    *r = (run){dst, src, n};
}

/* Bag f of n rows as one jagged array; rows[k] is rows[order ? order[k] : k]. */
static void jagged(layout *l, const rs_row *rows, const int32_t *order, size_t n, int f,
                   ikbo_jagged *out)
{
    int64_t *off = take(l, (n + 1) * sizeof *off);
    if (!l->base) {
        size_t total = 0;
        for (size_t k = 0; k < n; k++) total += rows[order ? (size_t)order[k] : k].bags[f].n;
        take(l, total * sizeof(int64_t));
        return;
    }
    /* The fill pass sizes the ids by filling them (one loop, not two). */
    int64_t *ids = next_take(l);
    run cp = {0};
    off[0] = 0;
    for (size_t k = 0; k < n; k++) {
        const rs_span *s = &rows[order ? (size_t)order[k] : k].bags[f];
        run_put(&cp, ids + off[k], s->p, s->n * sizeof *ids);
        off[k + 1] = off[k] + (int64_t)s->n;
    }
    run_flush(&cp);
    take(l, (size_t)off[n] * sizeof *ids);
    out->ids = ids;
    out->offsets = off;
}

/* Every column of the batch; with l->base NULL only the size. */
static void lay_out(layout *l, const rs_dims *d, const rs_row *users, size_t U,
                    const rs_row *cands, const int32_t *order, size_t C, const int32_t *map,
                    ikbo_batch *b)
{
    const size_t ud = (size_t)d->user_dense, cd = (size_t)d->cand_dense;
    ikbo_jagged *us = take(l, ((size_t)d->n_user_sparse + 1) * sizeof *us);
    ikbo_jagged *cs = take(l, ((size_t)d->n_cand_sparse + 1) * sizeof *cs);
    float *udn = ud ? take(l, U * ud * sizeof *udn) : NULL;
    float *cdn = cd ? take(l, C * cd * sizeof *cdn) : NULL;
    int32_t *mp = take(l, C * sizeof *mp);
    int64_t *hoff = take(l, (U + 1) * sizeof *hoff);
    size_t H = 0;
    int any_act = 0;
    for (size_t u = 0; u < U; u++) {
        H += users[u].hist.n;
        any_act |= users[u].act.n != 0;
    }
    int64_t *hids = take(l, H * sizeof *hids);
    int32_t *hact = any_act ? take(l, H * sizeof *hact) : NULL;
    for (int f = 0; f < d->n_user_sparse; f++) jagged(l, users, NULL, U, f, us ? &us[f] : NULL);
    for (int f = 0; f < d->n_cand_sparse; f++) jagged(l, cands, order, C, f, cs ? &cs[f] : NULL);
    if (!l->base) return;
    run cp = {0};
    for (size_t u = 0; u < U && ud; u++)
        run_put(&cp, udn + u * ud, users[u].dense, ud * sizeof *udn);
    for (size_t k = 0; k < C && cd; k++)
        run_put(&cp, cdn + k * cd, cands[order ? (size_t)order[k] : k].dense, cd * sizeof *cdn);
    run_flush(&cp);
    memcpy(mp, map, C * sizeof *mp);
    hoff[0] = 0;
    for (size_t u = 0; u < U; u++) {
        const rs_row *r = &users[u];
        size_t n = r->hist.n;
        run_put(&cp, hids + hoff[u], r->hist.p, n * sizeof *hids);
        hoff[u + 1] = hoff[u] + (int64_t)n;
    }
    run_flush(&cp);
    for (size_t u = 0; u < U && hact; u++) {
        const rs_row *r = &users[u];
        size_t n = r->hist.n;
        if (r->act.n) run_put(&cp, hact + hoff[u], r->act.p, n * sizeof *hact);
        else if (n) memset(hact + hoff[u], 0, n * sizeof *hact);
    }
    run_flush(&cp);
    b->n_users = (int)U;
    b->n_cands = (int)C;
    b->user_dense = udn;
    b->user_sparse = us;
    b->hist.ids = hids;
    b->hist.offsets = hoff;
    b->hist_actions = hact;
    b->cand_dense = cdn;
    b->cand_sparse = cs;
    b->map = mp;
}

int rs_assemble(rs_batch *out, const rs_dims *d, const rs_row *users, size_t U,
                const rs_row *cands, const int32_t *order, size_t C, const int32_t *map)
{
    memset(out, 0, sizeof *out);
    layout l = {NULL, 0};
    lay_out(&l, d, users, U, cands, order, C, map, &out->b);
    l.base = malloc(l.off);
    if (!l.base) return -1;
    l.off = 0;
    lay_out(&l, d, users, U, cands, order, C, map, &out->b);
    out->mem_ = l.base;
    return 0;
}

void rs_batch_free(rs_batch *b)
{
    if (!b) return;
    free(b->mem_);
    memset(b, 0, sizeof *b);
}

static rs_span jag_row(const ikbo_jagged *j, size_t r)
{
    return (rs_span){j->ids + j->offsets[r], (size_t)(j->offsets[r + 1] - j->offsets[r])};
}

void rs_batch_user(const ikbo_batch *b, const rs_dims *d, size_t r, const char *key,
                   rs_row *out, rs_span *bags)
{
    for (int f = 0; f < d->n_user_sparse; f++) bags[f] = jag_row(&b->user_sparse[f], r);
    out->key = key;
    out->dense = d->user_dense ? b->user_dense + r * (size_t)d->user_dense : NULL;
    out->bags = bags;
    out->hist = jag_row(&b->hist, r);
    out->act = b->hist_actions ? (rs_span){b->hist_actions + b->hist.offsets[r], out->hist.n}
                               : (rs_span){NULL, 0};
}

void rs_batch_cand(const ikbo_batch *b, const rs_dims *d, size_t c, rs_row *out, rs_span *bags)
{
    for (int f = 0; f < d->n_cand_sparse; f++) bags[f] = jag_row(&b->cand_sparse[f], c);
    *out = (rs_row){.key = "", .bags = bags};
    out->dense = d->cand_dense ? b->cand_dense + c * (size_t)d->cand_dense : NULL;
}
