/* request_json.c - proto3 JSON <-> the Rank messages: RankRequest from the
 * HTTP :rank body (and ikbo-score's file), RankResponse and errors back.
 *
 * Why this exists: the HTTP transport and ikbo-score speak JSON, gRPC
 * speaks protobuf; both must produce the same RankRequest, so that
 * validation (request.c) gives the same status and message on every
 * transport. Every error names the JSON path of the field. Policies are in
 * request.h. The packed encoding (packedUsers, packedCandidates) maps like
 * the rest; its bytes fields are base64 strings, either alphabet, padding
 * optional (`packedUsers.dense: invalid base64 at character 17`); what the
 * bytes hold is rq_validate's to check, as for the wire. Reentrant; no
 * global state.
 */
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

#include <jansson.h>

#include "pb_check.h"

/* ======================================================================
 * JSON -> RankRequest
 * ====================================================================== */

/* A dotted/indexed field path, for error messages. */
typedef struct jpath {
    char s[256];
    size_t n;
} jpath;

static size_t jp_push(jpath *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static size_t jp_push(jpath *p, const char *fmt, ...)
{
    size_t old = p->n;
    if (p->n < sizeof p->s - 1) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(p->s + p->n, sizeof p->s - p->n, fmt, ap);
        va_end(ap);
        if (k > 0)
            p->n += (size_t)k;
        if (p->n > sizeof p->s - 1)
            p->n = sizeof p->s - 1;
    }
    return old;
}
static void jp_pop(jpath *p, size_t old)
{
    p->n = old;
    p->s[old] = 0;
}
/* Field `key` under the current path (no leading dot at the root). */
static size_t jp_field(jpath *p, const char *key)
{
    return p->n ? jp_push(p, ".%.80s", key) : jp_push(p, "%.80s", key);
}
static size_t jp_index(jpath *p, size_t i)
{
    return jp_push(p, "[%zu]", i);
}

static const char *jtype(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "object";
    case JSON_ARRAY: return "array";
    case JSON_STRING: return "string";
    case JSON_INTEGER: return "integer";
    case JSON_REAL: return "number";
    case JSON_TRUE: return "true";
    case JSON_FALSE: return "false";
    case JSON_NULL: return "null";
    }
    return "?";
}

/* "got string", "got number 1.5", "got integer -3" (values shown only for numbers). */
static void jgot(const json_t *v, char *buf, size_t n)
{
    if (json_is_integer(v))
        snprintf(buf, n, "got integer %" JSON_INTEGER_FORMAT, json_integer_value(v));
    else if (json_is_real(v))
        snprintf(buf, n, "got number %.17g", json_real_value(v));
    else
        snprintf(buf, n, "got %s", jtype(v));
}

static int jerr_type(rq_status *st, const jpath *p, const char *want, const json_t *v)
{
    char got[64];
    jgot(v, got, sizeof got);
    return rq_status_set(st, RQ_INVALID_ARGUMENT, "%s: expected %s, %s", p->n ? p->s : "request",
                         want, got);
}

/* Integral value of a JSON number or decimal string within [lo, hi]. */
static int j_integral(const json_t *v, int allow_string, long long lo, long long hi, long long *out)
{
    if (json_is_integer(v)) {
        long long x = json_integer_value(v);
        if (x < lo || x > hi)
            return -1;
        *out = x;
        return 0;
    }
    if (json_is_real(v)) {
        /* proto3 JSON parsers accept integral floats like 5.0 or 1e3. */
        double d = json_real_value(v);
        if (!(d == floor(d)) || d < (double)lo || d >= -(double)LLONG_MIN ||
            d > (double)hi)
            return -1;
        *out = (long long)d;
        return 0;
    }
    if (allow_string && json_is_string(v)) {
        const char *s = json_string_value(v);
        size_t len = json_string_length(v);
        const char *q = s;
        if (*q == '-')
            q++;
        if (!*q || len != strlen(s))
            return -1;
        for (const char *c = q; *c; c++)
            if (!isdigit((unsigned char)*c))
                return -1;
        errno = 0;
        char *end;
        long long x = strtoll(s, &end, 10);
        if (errno || *end || x < lo || x > hi)
            return -1;
        *out = x;
        return 0;
    }
    return -1;
}

static int j_int64(const json_t *v, const jpath *p, int64_t *out, rq_status *st)
{
    long long x;
    if (j_integral(v, 1, INT64_MIN, INT64_MAX, &x))
        return jerr_type(st, p, "int64 (integer or decimal string)", v);
    *out = (int64_t)x;
    return 0;
}

static int j_uint32(const json_t *v, const jpath *p, uint32_t *out, rq_status *st)
{
    long long x;
    if (j_integral(v, 1, 0, UINT32_MAX, &x))
        return jerr_type(st, p, "uint32 (integer 0..4294967295)", v);
    *out = (uint32_t)x;
    return 0;
}

static int j_int32(const json_t *v, const jpath *p, int32_t *out, rq_status *st)
{
    long long x;
    if (j_integral(v, 1, INT32_MIN, INT32_MAX, &x))
        return jerr_type(st, p, "int32 (integer)", v);
    *out = (int32_t)x;
    return 0;
}

static int j_float(const json_t *v, const jpath *p, float *out, rq_status *st)
{
    double d;
    if (json_is_number(v)) {
        d = json_number_value(v);
    } else if (json_is_string(v)) {
        /* proto3 JSON: floats may be strings, including the non-finite
         * spellings; those pass here and are rejected by rq_validate with a
         * message naming the field. */
        const char *s = json_string_value(v);
        if (!strcmp(s, "NaN")) {
            *out = NAN;
            return 0;
        }
        if (!strcmp(s, "Infinity")) {
            *out = INFINITY;
            return 0;
        }
        if (!strcmp(s, "-Infinity")) {
            *out = -INFINITY;
            return 0;
        }
        char *end;
        errno = 0;
        d = strtod(s, &end);
        if (!*s || *end || isspace((unsigned char)*s) || !isfinite(d) ||
            json_string_length(v) != strlen(s))
            return jerr_type(st, p, "float (number or numeric string)", v);
    } else {
        return jerr_type(st, p, "float (number)", v);
    }
    if (isfinite(d) && fabs(d) > FLT_MAX)
        return rq_status_set(st, RQ_INVALID_ARGUMENT, "%s: %.9g is out of float range", p->s,
                             d);
    *out = (float)d;
    return 0;
}

static int j_string(const json_t *v, const jpath *p, char **out, rq_status *st)
{
    if (!json_is_string(v))
        return jerr_type(st, p, "string", v);
    /* jansson hands over valid UTF-8 only; a \u0000 (JSON_ALLOW_NUL) is
     * refused here, with the message the gRPC decoders give (pb_check.h). */
    size_t at;
    int fault = pb_str_check((const uint8_t *)json_string_value(v), json_string_length(v), &at);
    if (fault)
        return pb_str_refuse(st, p->s, fault, at);
    char *s = strdup(json_string_value(v));
    if (!s)
        return rq_status_oom(st);
    free(*out == protobuf_c_empty_string ? NULL : *out);
    *out = s;
    return 0;
}

/* The 6-bit value of a base64 character of either alphabet (RFC 4648:
 * standard "+/", URL-safe "-_"; proto3 JSON parsers accept both), or -1. */
static int b64_value(unsigned char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '+' || c == '-')
        return 62;
    if (c == '/' || c == '_')
        return 63;
    return -1;
}

/* Padding from s[i] (the first '=') for a last quantum of q sextets: it
 * must complete the quantum and end the text. 0, or -1 with *at set. */
static int b64_padding(const char *s, size_t n, size_t i, size_t q, size_t *at)
{
    if (q < 2) { /* after a whole quantum, or a lone sextet: never valid */
        *at = i;
        return -1;
    }
    for (size_t k = i; k < i + (4 - q); k++)
        if (k >= n || s[k] != '=') {
            *at = k;
            return -1;
        }
    if (i + (4 - q) < n) {
        *at = i + (4 - q);
        return -1;
    }
    return 0;
}

/* Decodes base64 s[0..n) (either alphabet, padded or not) into out, or
 * with out NULL only checks it and counts. *len = the decoded size. Bits
 * below the last byte are ignored (RFC 4648 3.5 allows it, as the proto3
 * JSON parsers do). Returns 0, or -1 with *at = the length of the longest
 * prefix that is still valid base64 (0-based offset of the offending
 * character; n when the text ends early). */
static int b64_decode(const char *s, size_t n, uint8_t *out, size_t *len, size_t *at)
{
    size_t i = 0, q = 0, w = 0; /* q: sextets in the current quantum */
    uint32_t acc = 0;
    for (; i < n && s[i] != '='; i++) {
        int x = b64_value((unsigned char)s[i]);
        if (x < 0) {
            *at = i;
            return -1;
        }
        acc = acc << 6 | (uint32_t)x;
        if (++q == 4) {
            if (out) {
                out[w] = (uint8_t)(acc >> 16);
                out[w + 1] = (uint8_t)(acc >> 8);
                out[w + 2] = (uint8_t)acc;
            }
            w += 3;
            q = 0;
            acc = 0;
        }
    }
    if (i < n && b64_padding(s, n, i, q, at))
        return -1;
    if (i == n && q == 1) { /* a lone sextet: the text ends early */
        *at = n;
        return -1;
    }
    if (q >= 2 && out)
        out[w] = (uint8_t)(acc >> (6 * q - 8));
    if (q == 3 && out)
        out[w + 1] = (uint8_t)(acc >> 2);
    *len = w + (q ? q - 1 : 0);
    return 0;
}

/* A bytes field: a base64 string (proto3 JSON). Empty = no data (NULL, as
 * protobuf-c unpacks an empty bytes field). */
static int j_bytes(const json_t *v, const jpath *p, ProtobufCBinaryData *out, rq_status *st)
{
    if (!json_is_string(v))
        return jerr_type(st, p, "a base64 string", v);
    const char *s = json_string_value(v);
    size_t n = json_string_length(v), len, at;
    if (b64_decode(s, n, NULL, &len, &at))
        return rq_status_set(st, RQ_INVALID_ARGUMENT, "%s: invalid base64 at character %zu",
                             p->s, at);
    uint8_t *d = NULL;
    if (len) {
        d = malloc(len);
        if (!d)
            return rq_status_oom(st);
        b64_decode(s, n, d, &len, &at);
    }
    free(out->data);
    out->data = d;
    out->len = len;
    return 0;
}

/* A repeated string field. The array is attached as it fills (counts kept
 * consistent) so that on error one free_unpacked releases it. */
static int j_strings(const json_t *v, jpath *p, size_t *n_out, char ***out, rq_status *st)
{
    if (!json_is_array(v))
        return jerr_type(st, p, "array", v);
    size_t n = json_array_size(v);
    if (!n)
        return 0;
    char **a = calloc(n, sizeof *a);
    if (!a)
        return rq_status_oom(st);
    *out = a;
    *n_out = 0;
    for (size_t i = 0; i < n; i++) {
        size_t old = jp_index(p, i);
        int rc = j_string(json_array_get(v, i), p, &a[i], st);
        jp_pop(p, old);
        if (rc)
            return -1;
        *n_out = i + 1;
    }
    return 0;
}

/* Repeated scalar fields. */
#define J_REPEATED(fname, ctype, conv)                                                        \
    static int fname(const json_t *v, jpath *p, size_t *n_out, ctype **out, rq_status *st)    \
    {                                                                                         \
        if (!json_is_array(v))                                                                \
            return jerr_type(st, p, "array", v);                                              \
        size_t n = json_array_size(v);                                                        \
        ctype *a = NULL;                                                                      \
        if (n) {                                                                              \
            a = malloc(n * sizeof *a);                                                        \
            if (!a)                                                                           \
                return rq_status_oom(st);                                                               \
        }                                                                                     \
        for (size_t i = 0; i < n; i++) {                                                      \
            size_t old = jp_index(p, i);                                                      \
            int rc = conv(json_array_get(v, i), p, &a[i], st);                                \
            jp_pop(p, old);                                                                   \
            if (rc) {                                                                         \
                free(a);                                                                      \
                return -1;                                                                    \
            }                                                                                 \
        }                                                                                     \
        free(*out);                                                                           \
        *out = a;                                                                             \
        *n_out = n;                                                                           \
        return 0;                                                                             \
    }
J_REPEATED(j_floats, float, j_float)
J_REPEATED(j_int64s, int64_t, j_int64)
J_REPEATED(j_int32s, int32_t, j_int32)

/* Which declared field a JSON key names: lowerCamelCase or original. Two keys
 * naming one field (e.g. topK and top_k) are an error. */
typedef struct jfield {
    const char *camel, *snake;
} jfield;

static int j_lookup(const jfield *f, int nf, const char *key)
{
    for (int i = 0; i < nf; i++)
        if (!strcmp(key, f[i].camel) || !strcmp(key, f[i].snake))
            return i;
    return -1;
}

/* Iterates obj's keys; calls on_field(idx, key, value) for each non-null
 * known field; unknown keys are errors naming the path. */
typedef int (*j_on_field)(void *msg, int idx, const json_t *v, jpath *p, rq_status *st);

static int j_object(const json_t *obj, jpath *p, const jfield *f, int nf, void *msg,
                    j_on_field on_field, rq_status *st)
{
    if (!json_is_object(obj))
        return jerr_type(st, p, "object", obj);
    const char *seen[16] = {0};
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)obj, key, v)
    {
        size_t old = jp_field(p, key);
        int idx = j_lookup(f, nf, key);
        if (idx < 0) {
            rq_status_set(st, RQ_INVALID_ARGUMENT, "%s: unknown field", p->s);
            jp_pop(p, old);
            return -1;
        }
        if (seen[idx]) {
            rq_status_set(st, RQ_INVALID_ARGUMENT, "%s: duplicate field (also given as \"%s\")",
                          p->s, seen[idx]);
            jp_pop(p, old);
            return -1;
        }
        seen[idx] = key;
        int rc = json_is_null(v) ? 0 : on_field(msg, idx, v, p, st);
        jp_pop(p, old);
        if (rc)
            return -1;
    }
    return 0;
}

/* Message fields. A message is allocated with its init and attached to its
 * parent before it is filled, so that on error the parent's free_unpacked
 * releases it with the rest. */
typedef void (*j_init_fn)(void *m);
typedef int (*j_fill_fn)(const json_t *v, jpath *p, void *m, rq_status *st);

static int j_message(const json_t *v, jpath *p, size_t size, j_init_fn init, j_fill_fn fill,
                     void **slot, rq_status *st)
{
    void *m = malloc(size);
    if (!m)
        return rq_status_oom(st);
    init(m);
    *slot = m;
    return fill(v, p, m, st);
}

/* Repeated: the pointer array is attached too, the count kept consistent
 * with what it holds. */
static int j_messages(const json_t *v, jpath *p, size_t elem_size, j_init_fn init,
                      j_fill_fn fill, size_t *n_out, void ***out, rq_status *st)
{
    if (!json_is_array(v))
        return jerr_type(st, p, "array", v);
    /* Replace any earlier value (cannot happen: duplicates are rejected). */
    size_t n = json_array_size(v);
    if (!n)
        return 0;
    void **a = calloc(n, sizeof *a);
    if (!a)
        return rq_status_oom(st);
    *out = a;
    *n_out = 0;
    for (size_t i = 0; i < n; i++) {
        size_t old = jp_index(p, i);
        int rc = j_message(json_array_get(v, i), p, elem_size, init, fill, &a[i], st);
        jp_pop(p, old);
        *n_out = a[i] ? i + 1 : i;
        if (rc)
            return -1;
    }
    return 0;
}

/* --- SparseFeature --- */
static const jfield SPARSE_FIELDS[] = {{"name", "name"}, {"ids", "ids"}};

static int sparse_field(void *msg, int idx, const json_t *v, jpath *p, rq_status *st)
{
    Ikbo__V1__SparseFeature *m = msg;
    switch (idx) {
    case 0: return j_string(v, p, &m->name, st);
    default: return j_int64s(v, p, &m->n_ids, &m->ids, st);
    }
}
static void sparse_init(void *m)
{
    ikbo__v1__sparse_feature__init(m);
}
static int sparse_fill(const json_t *v, jpath *p, void *m, rq_status *st)
{
    return j_object(v, p, SPARSE_FIELDS, 2, m, sparse_field, st);
}

/* --- User --- */
static const jfield USER_FIELDS[] = {{"key", "key"},
                                     {"dense", "dense"},
                                     {"sparse", "sparse"},
                                     {"historyIds", "history_ids"},
                                     {"historyActions", "history_actions"}};

static int user_field(void *msg, int idx, const json_t *v, jpath *p, rq_status *st)
{
    Ikbo__V1__User *m = msg;
    switch (idx) {
    case 0: return j_string(v, p, &m->key, st);
    case 1: return j_floats(v, p, &m->n_dense, &m->dense, st);
    case 2:
        return j_messages(v, p, sizeof(Ikbo__V1__SparseFeature), sparse_init, sparse_fill,
                          &m->n_sparse, (void ***)&m->sparse, st);
    case 3: return j_int64s(v, p, &m->n_history_ids, &m->history_ids, st);
    default: return j_int32s(v, p, &m->n_history_actions, &m->history_actions, st);
    }
}
static void user_init(void *m)
{
    ikbo__v1__user__init(m);
}
static int user_fill(const json_t *v, jpath *p, void *m, rq_status *st)
{
    return j_object(v, p, USER_FIELDS, 5, m, user_field, st);
}

/* --- Candidate --- */
static const jfield CAND_FIELDS[] = {
    {"id", "id"}, {"user", "user"}, {"dense", "dense"}, {"sparse", "sparse"}};

static int cand_field(void *msg, int idx, const json_t *v, jpath *p, rq_status *st)
{
    Ikbo__V1__Candidate *m = msg;
    switch (idx) {
    case 0: return j_int64(v, p, &m->id, st);
    case 1: return j_uint32(v, p, &m->user, st);
    case 2: return j_floats(v, p, &m->n_dense, &m->dense, st);
    default:
        return j_messages(v, p, sizeof(Ikbo__V1__SparseFeature), sparse_init, sparse_fill,
                          &m->n_sparse, (void ***)&m->sparse, st);
    }
}
static void cand_init(void *m)
{
    ikbo__v1__candidate__init(m);
}
static int cand_fill(const json_t *v, jpath *p, void *m, rq_status *st)
{
    return j_object(v, p, CAND_FIELDS, 4, m, cand_field, st);
}

/* --- PackedSparse, PackedUsers, PackedCandidates (the packed encoding:
 * bytes fields are base64 in JSON; their contents are checked by
 * rq_validate, as for the wire) --- */
static const jfield PSPARSE_FIELDS[] = {{"name", "name"}, {"lengths", "lengths"}, {"ids", "ids"}};

static int psparse_field(void *msg, int idx, const json_t *v, jpath *p, rq_status *st)
{
    Ikbo__V1__PackedSparse *m = msg;
    switch (idx) {
    case 0: return j_string(v, p, &m->name, st);
    case 1: return j_bytes(v, p, &m->lengths, st);
    default: return j_bytes(v, p, &m->ids, st);
    }
}
static void psparse_init(void *m)
{
    ikbo__v1__packed_sparse__init(m);
}
static int psparse_fill(const json_t *v, jpath *p, void *m, rq_status *st)
{
    return j_object(v, p, PSPARSE_FIELDS, 3, m, psparse_field, st);
}

static const jfield PUSERS_FIELDS[] = {{"count", "count"},
                                       {"keys", "keys"},
                                       {"dense", "dense"},
                                       {"sparse", "sparse"},
                                       {"historyLengths", "history_lengths"},
                                       {"historyIds", "history_ids"},
                                       {"historyActions", "history_actions"}};

static int pusers_field(void *msg, int idx, const json_t *v, jpath *p, rq_status *st)
{
    Ikbo__V1__PackedUsers *m = msg;
    switch (idx) {
    case 0: return j_uint32(v, p, &m->count, st);
    case 1: return j_strings(v, p, &m->n_keys, &m->keys, st);
    case 2: return j_bytes(v, p, &m->dense, st);
    case 3:
        return j_messages(v, p, sizeof(Ikbo__V1__PackedSparse), psparse_init, psparse_fill,
                          &m->n_sparse, (void ***)&m->sparse, st);
    case 4: return j_bytes(v, p, &m->history_lengths, st);
    case 5: return j_bytes(v, p, &m->history_ids, st);
    default: return j_bytes(v, p, &m->history_actions, st);
    }
}
static void pusers_init(void *m)
{
    ikbo__v1__packed_users__init(m);
}
static int pusers_fill(const json_t *v, jpath *p, void *m, rq_status *st)
{
    return j_object(v, p, PUSERS_FIELDS, 7, m, pusers_field, st);
}

static const jfield PCANDS_FIELDS[] = {
    {"count", "count"}, {"ids", "ids"}, {"users", "users"}, {"dense", "dense"}, {"sparse", "sparse"}};

static int pcands_field(void *msg, int idx, const json_t *v, jpath *p, rq_status *st)
{
    Ikbo__V1__PackedCandidates *m = msg;
    switch (idx) {
    case 0: return j_uint32(v, p, &m->count, st);
    case 1: return j_bytes(v, p, &m->ids, st);
    case 2: return j_bytes(v, p, &m->users, st);
    case 3: return j_bytes(v, p, &m->dense, st);
    default:
        return j_messages(v, p, sizeof(Ikbo__V1__PackedSparse), psparse_init, psparse_fill,
                          &m->n_sparse, (void ***)&m->sparse, st);
    }
}
static void pcands_init(void *m)
{
    ikbo__v1__packed_candidates__init(m);
}
static int pcands_fill(const json_t *v, jpath *p, void *m, rq_status *st)
{
    return j_object(v, p, PCANDS_FIELDS, 5, m, pcands_field, st);
}

/* --- RankRequest --- */
static const jfield REQ_FIELDS[] = {{"model", "model"},           {"modelVersion", "model_version"},
                                    {"users", "users"},           {"candidates", "candidates"},
                                    {"topK", "top_k"},            {"requestId", "request_id"},
                                    {"packedUsers", "packed_users"},
                                    {"packedCandidates", "packed_candidates"}};

static int req_field(void *msg, int idx, const json_t *v, jpath *p, rq_status *st)
{
    Ikbo__V1__RankRequest *m = msg;
    switch (idx) {
    case 0: return j_string(v, p, &m->model, st);
    case 1: return j_int64(v, p, &m->model_version, st);
    case 2:
        return j_messages(v, p, sizeof(Ikbo__V1__User), user_init, user_fill, &m->n_users,
                          (void ***)&m->users, st);
    case 3:
        return j_messages(v, p, sizeof(Ikbo__V1__Candidate), cand_init, cand_fill,
                          &m->n_candidates, (void ***)&m->candidates, st);
    case 4: return j_uint32(v, p, &m->top_k, st);
    case 5: return j_string(v, p, &m->request_id, st);
    case 6:
        return j_message(v, p, sizeof(Ikbo__V1__PackedUsers), pusers_init, pusers_fill,
                         (void **)&m->packed_users, st);
    default:
        return j_message(v, p, sizeof(Ikbo__V1__PackedCandidates), pcands_init, pcands_fill,
                         (void **)&m->packed_candidates, st);
    }
}

Ikbo__V1__RankRequest *rq_request_from_json(const char *text, size_t len, rq_status *st)
{
    json_error_t je;
    /* JSON_ALLOW_NUL: a \u0000 in a string value then reaches j_string,
     * which names the field; jansson still refuses it in keys. */
    json_t *root = json_loadb(text ? text : "", text ? len : 0,
                              JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je);
    if (!root && (json_error_code(&je) == json_error_out_of_memory || !je.text[0]))
        return rq_status_oom(st), NULL; /* jansson names every input error; no text: it ran out of memory */
    if (!root) {
        rq_status_set(st, RQ_INVALID_ARGUMENT, "invalid JSON at line %d column %d: %s", je.line,
                      je.column, je.text);
        return NULL;
    }
    Ikbo__V1__RankRequest *req = malloc(sizeof *req);
    if (!req) {
        json_decref(root);
        rq_status_oom(st);
        return NULL;
    }
    ikbo__v1__rank_request__init(req);
    jpath p = {.s = "", .n = 0};
    if (!json_is_object(root)) {
        jerr_type(st, &p, "object", root);
        goto fail;
    }
    if (j_object(root, &p, REQ_FIELDS, 8, req, req_field, st))
        goto fail;
    json_decref(root);
    rq_status_ok(st);
    return req;
fail:
    json_decref(root);
    rq_request_free(req);
    return NULL;
}

void rq_request_free(Ikbo__V1__RankRequest *req)
{
    if (req)
        protobuf_c_message_free_unpacked(&req->base, NULL);
}

/* ======================================================================
 * RankResponse -> JSON
 * ====================================================================== */

static json_t *j_real(float f)
{
    if (isnan(f))
        return json_string("NaN");
    if (isinf(f))
        return json_string(f > 0 ? "Infinity" : "-Infinity");
    return json_real((double)f);
}

static json_t *j_i64str(int64_t x)
{
    char b[32];
    snprintf(b, sizeof b, "%" PRId64, x);
    return json_string(b);
}

/* Adds, returning -1 when v is NULL (allocation failed). */
static int jset(json_t *o, const char *k, json_t *v)
{
    return v ? json_object_set_new(o, k, v) : -1;
}
static int jappend(json_t *a, json_t *v)
{
    return v ? json_array_append_new(a, v) : -1;
}

static const char *nz(const char *s)
{
    return s ? s : "";
}

char *rq_response_to_json(const Ikbo__V1__RankResponse *r)
{
    json_t *o = json_object(), *tasks = json_array(), *scores = json_array();
    int bad = !o || !tasks || !scores;
    if (bad) {
        json_decref(tasks);
        json_decref(scores);
        json_decref(o);
        return NULL;
    }
    bad |= jset(o, "model", json_string(nz(r->model)));
    bad |= jset(o, "modelVersion", j_i64str(r->model_version));
    for (size_t t = 0; t < r->n_tasks; t++)
        bad |= jappend(tasks, json_string(nz(r->tasks[t])));
    bad |= jset(o, "tasks", tasks);
    for (size_t i = 0; i < r->n_scores && !bad; i++) {
        const Ikbo__V1__Score *s = r->scores[i];
        json_t *so = json_object(), *ts = json_array();
        if (!so || !ts) {
            json_decref(so);
            json_decref(ts);
            bad = 1;
            break;
        }
        bad |= jset(so, "id", j_i64str(s->id));
        bad |= jset(so, "index", json_integer(s->index));
        bad |= jset(so, "score", j_real(s->score));
        for (size_t t = 0; t < s->n_task_scores; t++)
            bad |= jappend(ts, j_real(s->task_scores[t]));
        bad |= jset(so, "taskScores", ts);
        bad |= jappend(scores, so);
    }
    bad |= jset(o, "scores", scores);
    bad |= jset(o, "uniqueUsers", json_integer(r->unique_users));
    bad |= jset(o, "requestId", json_string(nz(r->request_id)));
    char *out = bad ? NULL : json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9));
    json_decref(o);
    return out;
}

char *rq_error_json(const rq_status *st)
{
    json_t *o = json_pack("{s:{s:s,s:s}}", "error", "code", rq_code_name(st->code), "message",
                          st->msg);
    if (!o) {
        /* Only when msg is not valid UTF-8 (request strings are checked,
         * pb_check.h, so this is a guard for any other source): keep it,
         * ASCII only. */
        char ascii[sizeof st->msg];
        size_t i = 0;
        for (; st->msg[i] && i < sizeof ascii - 1; i++)
            ascii[i] = (unsigned char)st->msg[i] < 0x80 ? st->msg[i] : '?';
        ascii[i] = 0;
        o = json_pack("{s:{s:s,s:s}}", "error", "code", rq_code_name(st->code), "message", ascii);
        if (!o)
            return NULL;
    }
    char *out = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
    return out;
}

