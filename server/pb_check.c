/* pb_check.c - string validity, field paths and the descriptor-driven wire
 * walker (see pb_check.h). */
#include "pb_check.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* ---- strings ---------------------------------------------------------- */

/* Nonzero iff some byte of w is 0 or >= 0x80 (a clean ASCII word gives 0:
 * each byte minus one stays below 0x80 and borrows nothing). */
static inline uint64_t word_not_plain(uint64_t w)
{
    return ((w - 0x0101010101010101ull) | w) & 0x8080808080808080ull;
}
static inline uint32_t word32_not_plain(uint32_t w)
{
    return ((w - 0x01010101u) | w) & 0x80808080u;
}

/* ASCII without NUL, the common case, in a few word loads: overlapping
 * loads cover a tail shorter than a word. 1 = plain, 0 = look closer. */
static inline int all_plain(const uint8_t *s, size_t n)
{
    uint64_t w;
    uint32_t v;
    if (n >= 8) {
        for (size_t i = 0; i + 8 <= n; i += 8) {
            memcpy(&w, s + i, 8);
            if (word_not_plain(w)) return 0;
        }
        memcpy(&w, s + n - 8, 8);
        return !word_not_plain(w);
    }
    if (n >= 4) {
        memcpy(&v, s, 4);
        if (word32_not_plain(v)) return 0;
        memcpy(&v, s + n - 4, 4);
        return !word32_not_plain(v);
    }
    for (size_t i = 0; i < n; i++)
        if (s[i] - 1u >= 0x7fu) return 0; /* 0 or >= 0x80 */
    return 1;
}

/* The full decode, from the start: the first fault and where. */
static int check_slow(const uint8_t *s, size_t n, size_t *at)
{
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) {
            if (!c) {
                *at = i;
                return PB_STR_NUL;
            }
            i++;
            continue;
        }
        /* Lead byte: how many continuation bytes, and the range of the
         * first one (which excludes overlongs, surrogates, > U+10FFFF). */
        size_t need;
        uint8_t lo = 0x80, hi = 0xbf;
        if (c >= 0xc2 && c <= 0xdf) {
            need = 1;
        } else if (c >= 0xe0 && c <= 0xef) {
            need = 2;
            if (c == 0xe0) lo = 0xa0;
            if (c == 0xed) hi = 0x9f;
        } else if (c >= 0xf0 && c <= 0xf4) {
            need = 3;
            if (c == 0xf0) lo = 0x90;
            if (c == 0xf4) hi = 0x8f;
        } else {
            *at = i; /* 0x80..0xc1 (continuation, overlong lead), 0xf5.. */
            return PB_STR_UTF8;
        }
        if (n - i - 1 < need || s[i + 1] < lo || s[i + 1] > hi) {
            *at = i;
            return PB_STR_UTF8;
        }
        for (size_t k = 2; k <= need; k++)
            if ((s[i + k] & 0xc0) != 0x80) {
                *at = i;
                return PB_STR_UTF8;
            }
        i += need + 1;
    }
    return PB_STR_OK;
}

int pb_str_check(const uint8_t *s, size_t n, size_t *at)
{
    return all_plain(s, n) ? PB_STR_OK : check_slow(s, n, at);
}

int pb_str_refuse(rq_status *st, const char *path, int fault, size_t at)
{
    return rq_status_set(st, RQ_INVALID_ARGUMENT, "%s: string %s at byte %zu", path,
                         fault == PB_STR_NUL ? "contains NUL" : "is not valid UTF-8", at);
}

/* ---- field paths ------------------------------------------------------ */

void pb_path_format(const pb_path *p, char *out, size_t n)
{
    if (!n) return;
    out[0] = 0;
    if (p->depth <= 0) {
        snprintf(out, n, "request");
        return;
    }
    size_t l = 0;
    for (int i = 0; i < p->depth && i < PB_PATH_MAX && l < n; i++) {
        int k = p->at[i].index >= 0
                    ? snprintf(out + l, n - l, "%s%s[%" PRId64 "]", i ? "." : "", p->at[i].name,
                               p->at[i].index)
                    : snprintf(out + l, n - l, "%s%s", i ? "." : "", p->at[i].name);
        if (k < 0) break;
        l += (size_t)k;
    }
}

/* ---- the walker ------------------------------------------------------- */

/* Counters per field index are on the stack: the server's request messages
 * have at most a dozen fields. */
#define WALK_MAX_FIELDS 64

typedef struct walker {
    const ProtobufCMessageDescriptor *root;
    pb_path path;
    rq_status *st;
} walker;

static int malformed(walker *w)
{
    return rq_status_set(w->st, RQ_INVALID_ARGUMENT, "request is not a valid %s message",
                         w->root->name);
}

/* A fault of the message at the current path; num: a field number out of
 * range, else what is wrong. */
static int fault_here(walker *w, uint64_t num, const char *what)
{
    char path[256];
    pb_path_format(&w->path, path, sizeof path);
    if (what) return rq_status_set(w->st, RQ_INVALID_ARGUMENT, "%s: %s", path, what);
    return rq_status_set(w->st, RQ_INVALID_ARGUMENT,
                         "%s: field number %" PRIu64 " is outside 1..%u", path, num,
                         PB_MAX_FIELD_NUMBER);
}

/* The next field: its number, and its body when length-delimited (else
 * body stays NULL). */
static int next_field(walker *w, const uint8_t **p, const uint8_t *end, uint64_t *num,
                      const uint8_t **body, size_t *blen)
{
    uint64_t key, v;
    if (pb_read_varint(p, end, &key, 10)) return malformed(w);
    *num = key >> 3;
    *body = NULL;
    if (*num == 0 || *num > PB_MAX_FIELD_NUMBER) return fault_here(w, *num, NULL);
    switch (key & 7) {
    case 0: return pb_read_varint(p, end, &v, 10) ? malformed(w) : 0;
    case 1:
    case 5: {
        size_t k = (key & 7) == 1 ? 8 : 4;
        if ((size_t)(end - *p) < k) return malformed(w);
        *p += k;
        return 0;
    }
    case 2:
        if (pb_read_varint(p, end, &v, 10) || v > (uint64_t)(end - *p)) return malformed(w);
        *body = *p;
        *blen = (size_t)v;
        *p += v;
        return 0;
    default: return malformed(w); /* groups: protobuf-c refuses them too */
    }
}

static int walk_msg(walker *w, const ProtobufCMessageDescriptor *d, const uint8_t *p,
                    const uint8_t *end)
{
    uint32_t seen[WALK_MAX_FIELDS] = {0}; /* occurrences so far, per field index */
    if (d->n_fields > WALK_MAX_FIELDS)
        return rq_status_set(w->st, RQ_INTERNAL, "%s has too many fields to check", d->name);
    while (p < end) {
        uint64_t num = 0;
        const uint8_t *body = NULL;
        size_t blen = 0;
        if (next_field(w, &p, end, &num, &body, &blen)) return -1;
        if (!body) continue;
        const ProtobufCFieldDescriptor *f =
            protobuf_c_message_descriptor_get_field(d, (unsigned)num);
        if (!f || (f->type != PROTOBUF_C_TYPE_STRING &&
                   !(f->type == PROTOBUF_C_TYPE_MESSAGE && f->descriptor)))
            continue; /* unknown, bytes, or a packed scalar run */
        if (w->path.depth >= PB_PATH_MAX) return fault_here(w, 0, "nested too deeply");
        size_t fi = (size_t)(f - d->fields);
        w->path.at[w->path.depth].name = f->name;
        w->path.at[w->path.depth].index =
            f->label == PROTOBUF_C_LABEL_REPEATED ? (int64_t)seen[fi]++ : -1;
        w->path.depth++;
        int rc;
        if (f->type == PROTOBUF_C_TYPE_STRING) {
            size_t at = 0;
            int fault = pb_str_check(body, blen, &at);
            char path[256];
            if (fault) pb_path_format(&w->path, path, sizeof path);
            rc = fault ? pb_str_refuse(w->st, path, fault, at) : 0;
        } else {
            rc = walk_msg(w, f->descriptor, body, body + blen);
        }
        w->path.depth--;
        if (rc) return -1;
    }
    return 0;
}

int pb_check_wire(const ProtobufCMessageDescriptor *d, const uint8_t *buf, size_t len,
                  rq_status *st)
{
    walker w = {.root = d, .path = {.depth = 0}, .st = st};
    if (len && !buf) return malformed(&w);
    if (len && walk_msg(&w, d, buf, buf + len)) return -1;
    rq_status_ok(st);
    return 0;
}

ProtobufCMessage *pb_check_unpack(const ProtobufCMessageDescriptor *d, ProtobufCAllocator *al,
                                  const uint8_t *buf, size_t len, rq_status *st)
{
    ProtobufCMessage *m = protobuf_c_message_unpack(d, al, len, buf);
    if (!m) {
        rq_status_set(st, RQ_INVALID_ARGUMENT, "request is not a valid %s message", d->name);
        return NULL;
    }
    if (pb_check_wire(d, buf, len, st)) {
        protobuf_c_message_free_unpacked(m, al);
        return NULL;
    }
    rq_status_ok(st);
    return m;
}
