/* rowset.h - THE user dedup, candidate grouping and batch assembly.
 *
 * Why this exists: a request's users are deduplicated into rows and its
 * candidates grouped by row (request.c, the plan), and the batcher merges the
 * rows of several plans again (batcher.c). Both describe what they hold as
 * the same canonical rows and use this one table, one hash and equality, one
 * counting sort and one gather into an owned ikbo_batch, so the dedup rule
 * (request.h, "Two users share a row iff ...") is written once. Redis's
 * dict is the model: one table; what differs between callers is only how
 * they fill rs_row.
 *
 * Rows point at the caller's memory and copy nothing: a span's bytes may sit
 * anywhere (a packed request's bytes field in the wire buffer, a protobuf-c
 * array, a plan's batch), unaligned, and are only read with memcpy/memcmp.
 * Little-endian hosts only (the packed encoding's byte order).
 *
 * Ownership: rs_table and rs_batch own what they allocate; the rows they are
 * given must outlive the table (rs_table keeps pointers), not the batch
 * (rs_assemble copies everything). Thread-safety: none needed; each object
 * belongs to one thread at a time; no global state.
 */
#ifndef IKBO_SERVER_ROWSET_H
#define IKBO_SERVER_ROWSET_H

#include <stddef.h>
#include <stdint.h>

#include "../engine/ikbo.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "rowset: the packed encoding is little-endian; this host is not"
#endif

/* n elements of a column's type (int64 ids, int32 actions) at p, any alignment. */
typedef struct rs_span {
    const void *p;
    size_t n;
} rs_span;

/* One user or candidate, canonical. Users use every field; candidates use
 * dense and bags. */
typedef struct rs_row {
    const char *key;     /* NUL-terminated; "" = no key */
    const void *dense;   /* float32 [dims' dense width]; unused when the width is 0 */
    const rs_span *bags; /* int64 ids per sparse feature, in model order */
    rs_span hist;        /* int64 history ids, oldest first */
    rs_span act;         /* int32 actions: n == 0 = all zero, else n == hist.n */
} rs_row;

/* What a row holds, from the model. */
typedef struct rs_dims {
    int user_dense, cand_dense;     /* floats per row */
    int n_user_sparse, n_cand_sparse;
} rs_dims;

static inline void rs_dims_of(rs_dims *d, const ikbo_model_info *mi)
{
    d->user_dense = mi->user_dense > 0 ? mi->user_dense : 0;
    d->cand_dense = mi->cand_dense > 0 ? mi->cand_dense : 0;
    d->n_user_sparse = mi->n_user_sparse;
    d->n_cand_sparse = mi->n_cand_sparse;
}

/* ---- dedup ----------------------------------------------------------- */

/* Users that are the same user (request.h's rule: same key, dense bits,
 * bags in order, history ids, actions with absent == zeros) get one id. */
typedef struct rs_table rs_table;

/* A table for at most max_rows distinct rows. collide_hashes, a test hook:
 * 1 gives every row the same short and full hash (the full-compare path), 2
 * the same short hash only (the full-hash chains, rowset.c). NULL on OOM. */
rs_table *rs_table_new(size_t max_rows, const rs_dims *d, int collide_hashes);
/* The id (0, 1, ... in order of first add) of the row equal to *r, adding a
 * copy of *r (pointers only) when none is. -1 past max_rows. */
int rs_table_add(rs_table *t, const rs_row *r);
size_t rs_table_count(const rs_table *t);
const rs_row *rs_table_rows(const rs_table *t); /* [count], each id's first row */
void rs_table_free(rs_table *t);                 /* NULL ok */

/* ---- grouping -------------------------------------------------------- */

/* Stable counting sort of n items by row_of[i] in [0, n_rows): order[pos] =
 * item, map[pos] = its row, so map is non-decreasing and items of one row
 * keep their order. -1 on OOM (outputs unspecified). */
int rs_group(const int32_t *row_of, size_t n, size_t n_rows, int32_t *order, int32_t *map);

/* ---- assembly -------------------------------------------------------- */

/* An engine batch that owns its inputs (one allocation). */
typedef struct rs_batch {
    ikbo_batch b;
    void *mem_;
} rs_batch;

/* Gathers users[0..U) as the batch's user rows and cands[order[i]] (order
 * NULL = identity) as its candidate i, with map[C] copied. hist_actions is
 * NULL unless some user has actions; then users without get zeros.
 * 0, or -1 on OOM (out zeroed). */
int rs_assemble(rs_batch *out, const rs_dims *d, const rs_row *users, size_t U,
                const rs_row *cands, const int32_t *order, size_t C, const int32_t *map);
void rs_batch_free(rs_batch *b); /* NULL ok; idempotent */

/* The rows of an assembled batch again (the batcher merges plans): user row
 * r with the given key, candidate c; bags[] receives the spans the row
 * points to ([n_user_sparse] / [n_cand_sparse]) and must outlive it. */
void rs_batch_user(const ikbo_batch *b, const rs_dims *d, size_t r, const char *key,
                   rs_row *out, rs_span *bags);
void rs_batch_cand(const ikbo_batch *b, const rs_dims *d, size_t c, rs_row *out, rs_span *bags);

#endif
