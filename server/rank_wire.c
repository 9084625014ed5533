/* rank_wire.c - RankRequest straight from the wire (see rank_wire.h).
 *
 * Each message is read in two passes over its bytes: the first counts the
 * elements of every repeated field (so each array is allocated once, at its
 * size), the second fills them; submessages are decoded in the second pass
 * of their parent, each with its own two passes. Candidates and their bags,
 * most of a request's messages, are first read in one pass (each array
 * counted from its single occurrence, as encoders write them) and take the
 * two passes only when that does not hold; a message without repeated
 * fields (PackedSparse) takes the second pass alone. Candidates and bags
 * have walks of their own, for that one pass; every other message is read
 * by one loop, dec_fields, from a table of its fields (wfield). Any byte
 * sequence outside the known fields' encodings makes the whole decode
 * return NULL.
 */
#include "rank_wire.h"

#include <limits.h>
#include <string.h>

#include "pb_check.h"

enum { WT_VARINT = 0, WT_I64 = 1, WT_LEN = 2, WT_I32 = 5 };

typedef struct rd {
    const uint8_t *p, *end;
} rd;

static inline int get_varint_n(rd *r, uint64_t *v, int max_bytes)
{
    return pb_read_varint(&r->p, r->end, v, max_bytes);
}

static inline int get_varint(rd *r, uint64_t *v) { return get_varint_n(r, v, 10); }

/* One varint with at least 10 bytes readable at p (no bounds checks): the
 * packed-array loop's fast path. NULL past 10 bytes. */
static inline const uint8_t *varint_unchecked(const uint8_t *p, uint64_t *v)
{
    uint64_t x = 0;
#pragma GCC unroll 10 /* -7% of a 16 x 70 classic decode (bench/e2e/host_path) */
    for (int i = 0; i < 10; i++) {
        uint64_t b = p[i];
        x |= (b & 0x7f) << (7 * i);
        if (b < 0x80) {
            *v = x;
            return p + i + 1;
        }
    }
    return NULL;
}

/* Next field: its number and wire type; LEN fields also get their body. */
static inline int get_field(rd *r, uint32_t *num, int *wt, rd *body)
{
    uint64_t k;
    if (get_varint_n(r, &k, 5) || (k >> 3) == 0 || (k >> 3) > 0x1fffffff) return -1;
    *num = (uint32_t)(k >> 3);
    *wt = (int)(k & 7);
    if (*wt == WT_LEN) {
        uint64_t n; /* protobuf-c: a 5-byte prefix at most, of at most INT_MAX */
        if (get_varint_n(r, &n, 5) || n > INT_MAX || n > (uint64_t)(r->end - r->p)) return -1;
        body->p = r->p;
        body->end = r->p + n;
        r->p += n;
    } else if (*wt != WT_VARINT && *wt != WT_I32) {
        return -1; /* no known field is fixed64 or a group */
    }
    return 0;
}

/* The top bit of each byte of a little-endian word: set where a varint
 * continues, clear where one ends. */
#define VARINT_MORE 0x8080808080808080ull

/* Varints in a packed body; -1 when it ends inside one. A varint ends at
 * each byte whose top bit is clear: eight bytes a step, their end bits
 * summed by one multiply (each byte of the product's top byte adds 0 or 1). */
static inline int64_t count_varints(rd b)
{
    int64_t n = 0;
    const uint8_t *p = b.p;
    for (; b.end - p >= 8; p += 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        n += (int64_t)((((~w & VARINT_MORE) >> 7) * 0x0101010101010101ull) >> 56);
    }
    for (; p < b.end; p++) n += !(*p & 0x80);
    return b.p < b.end && (b.end[-1] & 0x80) ? -1 : n;
}

#define NAME_CACHE 8 /* bag names a decode keeps for reuse (set_bag_name) */

/* One decode: the arena, where in the request it is (for an error's field
 * path), and the first string fault met, if any. A fault does not stop the
 * decode: bytes the decoder then declines go to protobuf-c, whose check
 * (pb_check.h) reports the same first fault, or a malformation the decoder
 * had not reached yet. Either way both paths give the same answer. */
typedef struct dctx {
    pb_arena *a;
    pb_path path; /* at[0]: users[i] / candidates[i]; at[1]: sparse[k] */
    int fault;    /* enum pb_str_fault of the first bad string; 0 = none */
    size_t fault_at;
    pb_path fault_path;
    /* Bag names already copied (every candidate repeats the same few): one
     * arena string serves them all. Round-robin replacement. */
    struct {
        const char *s;
        size_t n;
    } names[NAME_CACHE];
    int n_names, next_name;
} dctx;

static void *alloc(pb_arena *a, size_t n)
{
    ProtobufCAllocator *al = pb_arena_allocator(a);
    return al->alloc(al->allocator_data, n);
}

/* Arrays of n elements (NULL for none, as protobuf-c leaves them). */
static int alloc_array(pb_arena *a, void **out, size_t n, size_t elem)
{
    *out = NULL;
    if (n == 0) return 0;
    if (n > SIZE_MAX / elem) return -1;
    return (*out = alloc(a, n * elem)) ? 0 : -1;
}

/* A repeated message field of n messages (users, candidates, bags): the
 * pointer array protobuf-c reads, and the n structs of `size` bytes in one
 * block behind it (each initialized by its decoder). NULL for none. */
static int alloc_msgs(pb_arena *a, void ***out, size_t n, size_t size)
{
    unsigned char *blk;
    if (alloc_array(a, (void **)out, n, sizeof **out) || alloc_array(a, (void **)&blk, n, size))
        return -1;
    for (size_t i = 0; i < n; i++) (*out)[i] = blk + i * size;
    return 0;
}

/* A string field at path depth `depth` (the message's own depth), named
 * field (element `index` of a repeated one, else -1): copied NUL-terminated,
 * and checked (pb_str_check). */
static int set_string_at(dctx *d, int depth, const char *field, int64_t index, char **dst, rd b)
{
    size_t n = (size_t)(b.end - b.p);
    if (!d->fault) {
        size_t at;
        int f = pb_str_check(b.p, n, &at);
        if (f) {
            d->fault = f;
            d->fault_at = at;
            d->fault_path = d->path;
            d->fault_path.at[depth].name = field;
            d->fault_path.at[depth].index = index;
            d->fault_path.depth = depth + 1;
        }
    }
    char *s = alloc(d->a, n + 1);
    if (!s) return -1;
    memcpy(s, b.p, n);
    s[n] = 0;
    *dst = s;
    return 0;
}

static int set_string(dctx *d, int depth, const char *field, char **dst, rd b)
{
    return set_string_at(d, depth, field, -1, dst, b);
}

/* A bag's name: the arena copy of an equal name met before, else a new one
 * (checked as set_string does; an equal name's first fault was recorded
 * when it was first met, and only the first fault is reported). The
 * message's strings are read-only, so sharing one is not visible. */
static int set_bag_name(dctx *d, char **dst, rd b)
{
    const size_t n = (size_t)(b.end - b.p);
    for (int i = 0; i < d->n_names; i++)
        if (d->names[i].n == n && !memcmp(d->names[i].s, b.p, n)) {
            *dst = (char *)d->names[i].s;
            return 0;
        }
    if (set_string(d, 2, "name", dst, b)) return -1;
    int slot = d->n_names < NAME_CACHE ? d->n_names++ : d->next_name++ % NAME_CACHE;
    d->names[slot].s = *dst;
    d->names[slot].n = n;
    return 0;
}

/* A bytes field: borrowed, it points into the wire buffer (rank_wire.h). */
static int set_bytes(int wt, rd b, ProtobufCBinaryData *dst)
{
    if (wt != WT_LEN) return -1;
    dst->len = (size_t)(b.end - b.p);
    dst->data = dst->len ? (uint8_t *)b.p : NULL;
    return 0;
}

/* How a known field is read: by the walks (the repeated scalars) and by
 * dec_fields (all, through a message's table of wfield). */
enum fkind {
    F_NONE,   /* no such field: declined */
    F_I64,    /* varint, singular */
    F_U32,
    F_STRING, /* LEN, singular: a string (set_string) */
    F_NAME,   /* a bag's name (set_bag_name) */
    F_BYTES,  /* bytes, borrowed (set_bytes) */
    F_MSG,    /* a submessage; protobuf merges repeats of it: left to protobuf-c (declined) */
    F_STRINGS, /* repeated (F_STRINGS and after): strings */
    F_MSGS,    /* submessages */
    F_FLOATS,  /* scalars, packed or not (rep_scalar) */
    F_I64S,
    F_I32S,
};

/* A repeated scalar field, one occurrence. count: add its elements to *n;
 * else append them at dst[*n]. kind: F_FLOATS, F_I64S or F_I32S. */
static int rep_scalar(rd *r, int wt, rd body, enum fkind kind, int count, size_t *n, void *dst)
{
    if (kind == F_FLOATS) {
        if (wt == WT_LEN) {
            size_t bytes = (size_t)(body.end - body.p);
            if (bytes % 4) return -1;
            if (!count && bytes) memcpy((float *)dst + *n, body.p, bytes); /* dst NULL when empty */
            *n += bytes / 4;
            return 0;
        }
        if (wt != WT_I32 || r->end - r->p < 4) return -1;
        if (!count) memcpy((float *)dst + *n, r->p, 4);
        r->p += 4;
        (*n)++;
        return 0;
    }
    if (wt == WT_VARINT) {
        uint64_t v;
        if (get_varint(r, &v)) return -1;
        if (!count) {
            if (kind == F_I64S)
                ((int64_t *)dst)[*n] = (int64_t)v;
            else
                ((int32_t *)dst)[*n] = (int32_t)(uint32_t)v;
        }
        (*n)++;
        return 0;
    }
    if (wt != WT_LEN) return -1;
    if (count) {
        int64_t k = count_varints(body);
        if (k < 0) return -1;
        *n += (size_t)k;
        return 0;
    }
    size_t k = *n;
    if (kind == F_I64S) {
        int64_t *o = dst;
        while (body.end - body.p >= 10) {
            uint64_t v;
            if (!(body.p = varint_unchecked(body.p, &v))) return -1;
            o[k++] = (int64_t)v;
        }
        while (body.p < body.end) {
            uint64_t v;
            if (get_varint(&body, &v)) return -1;
            o[k++] = (int64_t)v;
        }
    } else {
        int32_t *o = dst;
        while (body.end - body.p >= 10) {
            uint64_t v;
            if (!(body.p = varint_unchecked(body.p, &v))) return -1;
            o[k++] = (int32_t)(uint32_t)v;
        }
        while (body.p < body.end) {
            uint64_t v;
            if (get_varint(&body, &v)) return -1;
            o[k++] = (int32_t)(uint32_t)v;
        }
    }
    *n = k;
    return 0;
}

/* A repeated scalar field met once: counted, allocated and filled from
 * this one occurrence (*dst NULL when it has no elements). */
static int rep_scalar_once(rd *it, int wt, rd body, enum fkind kind, size_t elem, pb_arena *a,
                           size_t *n, void **dst)
{
    const rd at = *it;
    size_t k = 0;
    *n = 0;
    if (rep_scalar(it, wt, body, kind, 1, n, NULL) || alloc_array(a, dst, *n, elem)) return -1;
    *it = at;
    return rep_scalar(it, wt, body, kind, 0, &k, *dst);
}

/* Where the decode is, at path depth `depth`: field name, element index
 * (-1: not repeated). */
static inline void set_path(dctx *d, int depth, const char *name, int64_t index)
{
    d->path.at[depth].name = name;
    d->path.at[depth].index = index;
}

/* The walks over a candidate's or a bag's fields. Every encoder writes a
 * repeated scalar field as one run and a candidate with a few bags, so such
 * a message is first walked ONCE, each array counted from its one
 * occurrence, allocated and filled on the spot. A message that is not (a
 * second occurrence, more than ONCE_BAGS bags) makes that walk return 1 and
 * is walked again twice, COUNT (every occurrence counted) then FILL (the
 * arrays allocated at their sizes); what the first walk took from the
 * arena stays there, at most a few times the message's own size. -1:
 * malformed (or out of memory). */
enum walk { ONCE, COUNT, FILL };
#define ONCE_BAGS 8

/* The walks are inlined at each call, so each walk's mode is a constant
 * there: not inlined, the decode measured 8% slower than with a loop per
 * mode (bench/e2e/host_path). */
#define WALK static inline __attribute__((always_inline)) int

/* A walk's repeated scalar field *dst (*n elements), one occurrence: ONCE
 * takes the first (rep_scalar_once) and returns 1 at another (*seen counts
 * them); COUNT and FILL go to rep_scalar. */
WALK rep_walk(rd *r, int wt, rd b, enum fkind kind, size_t elem, dctx *d, enum walk w, int *seen,
              size_t *n, void **dst)
{
    if (w != ONCE) return rep_scalar(r, wt, b, kind, w == COUNT, n, *dst);
    if ((*seen)++) return 1;
    return rep_scalar_once(r, wt, b, kind, elem, d->a, n, dst);
}

/* A bag's fields; *n: its ids. */
WALK sparse_walk(rd r, dctx *d, Ikbo__V1__SparseFeature *m, enum walk w, size_t *n)
{
    int ids_seen = 0, k;
    *n = 0;
    while (r.p < r.end) {
        uint32_t f;
        int wt;
        rd b = {0, 0};
        if (get_field(&r, &f, &wt, &b)) return -1;
        if (f == 1 && wt == WT_LEN) {
            if (w != COUNT && set_bag_name(d, &m->name, b)) return -1;
        } else if (f == 2) {
            if ((k = rep_walk(&r, wt, b, F_I64S, sizeof *m->ids, d, w, &ids_seen, n,
                              (void **)&m->ids)))
                return k;
        } else {
            return -1;
        }
    }
    return 0;
}

/* The decoders of a message (m, initialized here) each; 0, else -1:
 * declined (or out of memory). */
typedef int dec_fn(rd r, dctx *d, void *m);

static int dec_sparse(rd r, dctx *d, void *msg)
{
    Ikbo__V1__SparseFeature *m = msg;
    size_t n;
    ikbo__v1__sparse_feature__init(m);
    int once = sparse_walk(r, d, m, ONCE, &n);
    if (once == 1) {
        ikbo__v1__sparse_feature__init(m);
        if (sparse_walk(r, d, m, COUNT, &n) ||
            alloc_array(d->a, (void **)&m->ids, n, sizeof *m->ids) ||
            sparse_walk(r, d, m, FILL, &n))
            return -1;
    } else if (once) {
        return -1;
    }
    m->n_ids = n;
    return 0;
}

/* A candidate's fields (see enum walk); *nd: its dense values, *ns: its
 * bags, which a ONCE walk decodes into `bags` (the block is allocated only
 * when their number is known), the FILL walk into m->sparse. */
WALK candidate_walk(rd r, dctx *d, Ikbo__V1__Candidate *m, enum walk w,
                   Ikbo__V1__SparseFeature *bags, size_t *nd, size_t *ns)
{
    int dense_seen = 0, k;
    *nd = *ns = 0;
    while (r.p < r.end) {
        uint32_t f;
        int wt;
        rd b = {0, 0};
        uint64_t v;
        if (get_field(&r, &f, &wt, &b)) return -1;
        switch (f) {
        case 1:
            if (wt != WT_VARINT || get_varint(&r, &v)) return -1;
            m->id = (int64_t)v;
            break;
        case 2:
            if (wt != WT_VARINT || get_varint(&r, &v)) return -1;
            m->user = (uint32_t)v;
            break;
        case 3:
            if ((k = rep_walk(&r, wt, b, F_FLOATS, sizeof *m->dense, d, w, &dense_seen, nd,
                              (void **)&m->dense)))
                return k;
            break;
        case 4:
            if (w == ONCE && *ns == ONCE_BAGS) return 1;
            set_path(d, 1, "sparse", (int64_t)*ns);
            if (wt != WT_LEN ||
                (w != COUNT && dec_sparse(b, d, w == ONCE ? &bags[*ns] : m->sparse[*ns])))
                return -1;
            (*ns)++;
            break;
        default:
            return -1;
        }
    }
    return 0;
}

static int dec_candidate(rd r, dctx *d, void *msg)
{
    Ikbo__V1__Candidate *m = msg;
    Ikbo__V1__SparseFeature bags[ONCE_BAGS];
    size_t nd, ns;
    ikbo__v1__candidate__init(m);
    int once = candidate_walk(r, d, m, ONCE, bags, &nd, &ns);
    if (once == 0) {
        if (alloc_msgs(d->a, (void ***)&m->sparse, ns, sizeof **m->sparse)) return -1;
        for (size_t i = 0; i < ns; i++) *m->sparse[i] = bags[i];
    } else if (once == 1) {
        ikbo__v1__candidate__init(m);
        if (candidate_walk(r, d, m, COUNT, NULL, &nd, &ns) ||
            alloc_array(d->a, (void **)&m->dense, nd, sizeof *m->dense) ||
            alloc_msgs(d->a, (void ***)&m->sparse, ns, sizeof **m->sparse) ||
            candidate_walk(r, d, m, FILL, NULL, &nd, &ns))
            return -1;
    } else {
        return -1;
    }
    m->n_dense = nd;
    m->n_sparse = ns;
    return 0;
}

/* ---- the other messages: a table of their fields each ------------------ */

/* One field of a message that dec_fields reads: its table is indexed by
 * field number, below N_FIELDS; an entry left out (F_NONE) is declined. */
typedef struct wfield {
    enum fkind kind;
    const char *name; /* as in ranker.proto: an error's path */
    size_t at;        /* offset of the field (repeated: of its array) */
    size_t n_at;      /* repeated: offset of its count */
    size_t size;      /* repeated: an element's size; F_MSG: the message's */
    dec_fn *dec;      /* F_MSG, F_MSGS: the submessage's decoder */
} wfield;

#define N_FIELDS 9 /* RankRequest's fields are 1..8 */
_Static_assert(N_FIELDS == 9, "dec_fields has a case for each field number below N_FIELDS");

/* Entries of message type T's table: a singular field, a singular
 * submessage, a repeated field, repeated submessages. */
#define ONE(T, field, kind) {kind, #field, offsetof(T, field), 0, 0, NULL}
#define MSG(T, field, dec) {F_MSG, #field, offsetof(T, field), 0, sizeof *((T *)0)->field, dec}
#define REP(T, field, kind) \
    {kind, #field, offsetof(T, field), offsetof(T, n_##field), sizeof *((T *)0)->field, NULL}
#define MSGS(T, field, dec)                                                             \
    {F_MSGS, #field, offsetof(T, field), offsetof(T, n_##field), sizeof **((T *)0)->field, \
     dec}

/* Inlined, as the walks are, so that the table entry is a constant (dec_fields). */
#define FIELD static inline __attribute__((always_inline)) int

/* Field x of message `base`, one occurrence (its wire type wt, a LEN one's
 * body b), in the given pass of dec_fields; *n: a repeated field's count. */
FIELD read_field(const wfield *x, rd *it, int wt, rd b, dctx *d, char *base, int depth, int pass,
                 size_t *n)
{
    void *at = base + x->at;
    uint64_t v;
    switch (x->kind) {
    case F_NONE:
        return -1;
    case F_I64:
    case F_U32:
        if (wt != WT_VARINT || get_varint(it, &v)) return -1;
        if (x->kind == F_I64)
            *(int64_t *)at = (int64_t)v;
        else
            *(uint32_t *)at = (uint32_t)v;
        return 0;
    case F_STRING:
        return wt != WT_LEN || (pass && set_string(d, depth, x->name, at, b)) ? -1 : 0;
    case F_NAME:
        return wt != WT_LEN || (pass && set_bag_name(d, at, b)) ? -1 : 0;
    case F_BYTES:
        return set_bytes(wt, b, at);
    case F_MSG:
        if (wt != WT_LEN) return -1;
        if (pass) {
            void **sub = at;
            set_path(d, depth, x->name, -1);
            if (*sub || !(*sub = alloc(d->a, x->size)) || x->dec(b, d, *sub)) return -1;
        }
        return 0;
    case F_STRINGS:
        if (wt != WT_LEN ||
            (pass && set_string_at(d, depth, x->name, (int64_t)*n, *(char ***)at + *n, b)))
            return -1;
        (*n)++;
        return 0;
    case F_MSGS:
        set_path(d, depth, x->name, (int64_t)*n);
        if (wt != WT_LEN || (pass && x->dec(b, d, (*(void ***)at)[*n]))) return -1;
        (*n)++;
        return 0;
    default: /* F_FLOATS, F_I64S, F_I32S */
        return rep_scalar(it, wt, b, x->kind, !pass, n, *(void **)at);
    }
}

/* A message m (initialized) by its table t, at path depth `depth`: two
 * passes where it has a repeated field (the first counts every repeated
 * field's elements, their arrays are allocated, the second fills them and
 * decodes the submessages), else the second alone. Inlined at each
 * message's decoder, where t is a constant, and with a case per field
 * number, so that each case's entry and kind are constants and the code is
 * what a hand-written loop per message would be: read from the table as
 * the decode runs, they made the packed decode 6% slower (host_path's
 * requests, decoded alone). */
FIELD dec_fields(rd r, dctx *d, void *m, const wfield *t, int depth)
{
    char *const base = m;
    size_t n[N_FIELDS];
    int pass = 1;
#pragma GCC unroll 8 /* N_FIELDS - 1: the loops over t fold away */
    for (int f = 1; f < N_FIELDS; f++)
        if (t[f].kind >= F_STRINGS) pass = 0;
    for (; pass < 2; pass++) {
        rd it = r;
#pragma GCC unroll 8
        for (int f = 1; f < N_FIELDS; f++) n[f] = 0;
        while (it.p < it.end) {
            uint32_t f;
            int wt;
            rd b = {0, 0};
            if (get_field(&it, &f, &wt, &b)) return -1;
#define CASE(k) \
    case k: if (read_field(&t[k], &it, wt, b, d, base, depth, pass, &n[k])) return -1; break
            switch (f) {
                CASE(1); CASE(2); CASE(3); CASE(4); CASE(5); CASE(6); CASE(7); CASE(8);
            default:
                return -1;
            }
#undef CASE
        }
#pragma GCC unroll 8
        for (int f = 1; f < N_FIELDS && !pass; f++) {
            void *at = base + t[f].at;
            if (t[f].kind == F_MSGS ? alloc_msgs(d->a, at, n[f], t[f].size)
                : t[f].kind >= F_STRINGS ? alloc_array(d->a, at, n[f], t[f].size) : 0)
                return -1;
        }
    }
#pragma GCC unroll 8
    for (int f = 1; f < N_FIELDS; f++)
        if (t[f].kind >= F_STRINGS) *(size_t *)(base + t[f].n_at) = n[f];
    return 0;
}

/* ---- the packed encoding (fields 7 and 8) ---------------------------- */

static const wfield packed_sparse_fields[N_FIELDS] = {
    [1] = ONE(Ikbo__V1__PackedSparse, name, F_NAME),
    [2] = ONE(Ikbo__V1__PackedSparse, lengths, F_BYTES),
    [3] = ONE(Ikbo__V1__PackedSparse, ids, F_BYTES),
};

static int dec_packed_sparse(rd r, dctx *d, void *m)
{
    ikbo__v1__packed_sparse__init(m);
    return dec_fields(r, d, m, packed_sparse_fields, 2);
}

static const wfield packed_users_fields[N_FIELDS] = {
    [1] = ONE(Ikbo__V1__PackedUsers, count, F_U32),
    [2] = REP(Ikbo__V1__PackedUsers, keys, F_STRINGS),
    [3] = ONE(Ikbo__V1__PackedUsers, dense, F_BYTES),
    [4] = MSGS(Ikbo__V1__PackedUsers, sparse, dec_packed_sparse),
    [5] = ONE(Ikbo__V1__PackedUsers, history_lengths, F_BYTES),
    [6] = ONE(Ikbo__V1__PackedUsers, history_ids, F_BYTES),
    [7] = ONE(Ikbo__V1__PackedUsers, history_actions, F_BYTES),
};

static int dec_packed_users(rd r, dctx *d, void *m)
{
    ikbo__v1__packed_users__init(m);
    return dec_fields(r, d, m, packed_users_fields, 1);
}

static const wfield packed_cands_fields[N_FIELDS] = {
    [1] = ONE(Ikbo__V1__PackedCandidates, count, F_U32),
    [2] = ONE(Ikbo__V1__PackedCandidates, ids, F_BYTES),
    [3] = ONE(Ikbo__V1__PackedCandidates, users, F_BYTES),
    [4] = ONE(Ikbo__V1__PackedCandidates, dense, F_BYTES),
    [5] = MSGS(Ikbo__V1__PackedCandidates, sparse, dec_packed_sparse),
};

static int dec_packed_cands(rd r, dctx *d, void *m)
{
    ikbo__v1__packed_candidates__init(m);
    return dec_fields(r, d, m, packed_cands_fields, 1);
}

/* ---- the classic encoding's users, and the request -------------------- */

static const wfield user_fields[N_FIELDS] = {
    [1] = ONE(Ikbo__V1__User, key, F_STRING),
    [2] = REP(Ikbo__V1__User, dense, F_FLOATS),
    [3] = MSGS(Ikbo__V1__User, sparse, dec_sparse),
    [4] = REP(Ikbo__V1__User, history_ids, F_I64S),
    [5] = REP(Ikbo__V1__User, history_actions, F_I32S),
};

static int dec_user(rd r, dctx *d, void *m)
{
    ikbo__v1__user__init(m);
    return dec_fields(r, d, m, user_fields, 1);
}

static const wfield request_fields[N_FIELDS] = {
    [1] = ONE(Ikbo__V1__RankRequest, model, F_STRING),
    [2] = ONE(Ikbo__V1__RankRequest, model_version, F_I64),
    [3] = MSGS(Ikbo__V1__RankRequest, users, dec_user),
    [4] = MSGS(Ikbo__V1__RankRequest, candidates, dec_candidate),
    [5] = ONE(Ikbo__V1__RankRequest, top_k, F_U32),
    [6] = ONE(Ikbo__V1__RankRequest, request_id, F_STRING),
    [7] = MSG(Ikbo__V1__RankRequest, packed_users, dec_packed_users),
    [8] = MSG(Ikbo__V1__RankRequest, packed_candidates, dec_packed_cands),
};

/* The request's fields; NULL = declined. */
static Ikbo__V1__RankRequest *dec_request(rd r, dctx *d)
{
    Ikbo__V1__RankRequest *m = alloc(d->a, sizeof *m);
    if (!m) return NULL;
    ikbo__v1__rank_request__init(m);
    return dec_fields(r, d, m, request_fields, 0) ? NULL : m;
}

Ikbo__V1__RankRequest *rank_wire_decode(const uint8_t *buf, size_t len, pb_arena *a,
                                        rq_status *st)
{
    rq_status_ok(st);
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
    (void)buf, (void)len, (void)a;
    return NULL; /* floats are copied as wire bytes: little-endian hosts only */
#else
    if (!a || (len && !buf)) return NULL;
    dctx d = {.a = a, .path = {.depth = 0}, .fault = 0};
    const rd r = {buf, buf + len};
    Ikbo__V1__RankRequest *m = dec_request(r, &d);
    if (m && d.fault) {
        char path[256];
        pb_path_format(&d.fault_path, path, sizeof path);
        pb_str_refuse(st, path, d.fault, d.fault_at);
        return NULL;
    }
    return m;
#endif
}

ProtobufCMessage *rank_wire_unpack(const ProtobufCMessageDescriptor *d, const uint8_t *bytes,
                                   size_t len, pb_arena **arena, rq_status *st)
{
    rq_status_ok(st);
    if (!arena) return pb_check_unpack(d, NULL, bytes, len, st);
    /* Unpacked, a message takes ~1.5-2x its wire size (int64 varints widen
     * to 8 bytes, each submessage adds its struct): one chunk usually holds
     * it all. */
    size_t first = len < (SIZE_MAX - 4096) / 2 ? 2 * len + 4096 : SIZE_MAX / 2;
    ProtobufCMessage *m = NULL;
    if (d == &ikbo__v1__rank_request__descriptor && (*arena = pb_arena_new(first))) {
        m = (ProtobufCMessage *)rank_wire_decode(bytes, len, *arena, st);
        if (m || st->code != RQ_OK) {
            if (!m) {
                pb_arena_free(*arena);
                *arena = NULL;
            }
            return m;
        }
        pb_arena_free(*arena); /* declined: partial allocations stay behind */
    }
    if (!(*arena = pb_arena_new(first)))
        return rq_status_set(st, RQ_INTERNAL, "out of memory for a %zu-byte request", len), NULL;
    m = pb_check_unpack(d, pb_arena_allocator(*arena), bytes, len, st);
    if (!m) {
        /* protobuf-c ran out of arena memory: not the client's fault. */
        if (pb_arena_failed(*arena))
            rq_status_set(st, RQ_INTERNAL, "out of memory unpacking a %zu-byte %s", len, d->name);
        pb_arena_free(*arena);
        *arena = NULL;
    }
    return m;
}

/* ---- the response ------------------------------------------------------- */

/* protobuf-c's encoding of a RankResponse, written directly: the generic
 * packer walks every Score through its descriptor (74 us of a 16 x 70
 * request's 1120 scores, build/host_path); this writes the same bytes in
 * one pass each for the size and the bytes. proto3 rules as protobuf-c
 * applies them: zero scalars and empty strings are left out (a float is
 * zero when it == 0, so -0.0 too), repeated floats are packed. */
static size_t vlen(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) v >>= 7, n++;
    return n;
}

static uint8_t *put_v(uint8_t *o, uint64_t v)
{
    while (v >= 0x80) *o++ = (uint8_t)(v | 0x80), v >>= 7;
    *o++ = (uint8_t)v;
    return o;
}

static size_t score_body(const Ikbo__V1__Score *sc)
{
    size_t n = 0;
    if (sc->id) n += 1 + vlen((uint64_t)sc->id);
    if (sc->index) n += 1 + vlen(sc->index);
    if (sc->score != 0) n += 5;
    if (sc->n_task_scores) n += 1 + vlen(4 * sc->n_task_scores) + 4 * sc->n_task_scores;
    return n;
}

static size_t str_len(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    return n ? 1 + vlen(n) + n : 0;
}

static uint8_t *put_str(uint8_t *o, uint8_t tag, const char *s, int always)
{
    size_t n = s ? strlen(s) : 0;
    if (!n && !always) return o;
    *o++ = tag;
    o = put_v(o, n);
    memcpy(o, s, n);
    return o + n;
}

size_t rank_wire_response_size(const Ikbo__V1__RankResponse *r)
{
    size_t n = str_len(r->model) + str_len(r->request_id);
    if (r->model_version) n += 1 + vlen((uint64_t)r->model_version);
    if (r->unique_users) n += 1 + vlen(r->unique_users);
    for (size_t t = 0; t < r->n_tasks; t++) {
        size_t k = r->tasks[t] ? strlen(r->tasks[t]) : 0;
        n += 1 + vlen(k) + k; /* repeated: empty strings are kept */
    }
    for (size_t i = 0; i < r->n_scores; i++) {
        size_t b = score_body(r->scores[i]);
        n += 1 + vlen(b) + b;
    }
    return n;
}

size_t rank_wire_pack_response(const Ikbo__V1__RankResponse *r, uint8_t *out)
{
    uint8_t *o = put_str(out, 0x0a, r->model, 0);
    if (r->model_version) *o++ = 0x10, o = put_v(o, (uint64_t)r->model_version);
    for (size_t t = 0; t < r->n_tasks; t++) o = put_str(o, 0x1a, r->tasks[t], 1);
    for (size_t i = 0; i < r->n_scores; i++) {
        const Ikbo__V1__Score *sc = r->scores[i];
        *o++ = 0x22;
        o = put_v(o, score_body(sc));
        if (sc->id) *o++ = 0x08, o = put_v(o, (uint64_t)sc->id);
        if (sc->index) *o++ = 0x10, o = put_v(o, sc->index);
        if (sc->score != 0) *o++ = 0x1d, memcpy(o, &sc->score, 4), o += 4;
        if (sc->n_task_scores) {
            *o++ = 0x22;
            o = put_v(o, 4 * sc->n_task_scores);
            memcpy(o, sc->task_scores, 4 * sc->n_task_scores);
            o += 4 * sc->n_task_scores;
        }
    }
    if (r->unique_users) *o++ = 0x28, o = put_v(o, r->unique_users);
    o = put_str(o, 0x32, r->request_id, 0);
    return (size_t)(o - out);
}
