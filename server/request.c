/* request.c - the request path shared by every transport: proto3-JSON
 * mapping, validation, user dedup + candidate grouping into an ikbo_batch,
 * and the response. Policies are documented in request.h. */
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

#include "hash.h"
#include "pb_check.h"

/* ======================================================================
 * status
 * ====================================================================== */

int rq_status_set(rq_status *st, int code, const char *fmt, ...)
{
    if (st) {
        st->code = code;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(st->msg, sizeof st->msg, fmt, ap);
        va_end(ap);
        /* One line: transports put this in headers and log lines. */
        for (char *p = st->msg; *p; p++)
            if (*p == '\n' || *p == '\r')
                *p = ' ';
    }
    return code == RQ_OK ? 0 : -1;
}

void rq_status_ok(rq_status *st)
{
    if (st) {
        st->code = RQ_OK;
        st->msg[0] = 0;
    }
}

const char *rq_code_name(int code)
{
    switch (code) {
    case RQ_OK: return "OK";
    case RQ_CANCELLED: return "CANCELLED";
    case RQ_INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case RQ_DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case RQ_NOT_FOUND: return "NOT_FOUND";
    case RQ_RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case RQ_UNIMPLEMENTED: return "UNIMPLEMENTED";
    case RQ_INTERNAL: return "INTERNAL";
    case RQ_UNAVAILABLE: return "UNAVAILABLE";
    default: return "UNKNOWN";
    }
}

int rq_code_http(int code)
{
    switch (code) {
    case RQ_OK: return 200;
    case RQ_CANCELLED: return 499;
    case RQ_INVALID_ARGUMENT: return 400;
    case RQ_DEADLINE_EXCEEDED: return 504;
    case RQ_NOT_FOUND: return 404;
    case RQ_RESOURCE_EXHAUSTED: return 429;
    case RQ_UNIMPLEMENTED: return 501;
    case RQ_UNAVAILABLE: return 503;
    default: return 500;
    }
}

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

static char *xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

static int oom(rq_status *st)
{
    return rq_status_set(st, RQ_INTERNAL, "out of memory");
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
    char *s = xstrdup(json_string_value(v));
    if (!s)
        return oom(st);
    free(*out == protobuf_c_empty_string ? NULL : *out);
    *out = s;
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
                return oom(st);                                                               \
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

/* Repeated message fields: allocates the pointer array, each element with
 * its init, then fills it. On error the partial array stays attached to the
 * parent (counts kept consistent) so one free_unpacked releases it. */
typedef void (*j_init_fn)(void *m);
typedef int (*j_fill_fn)(const json_t *v, jpath *p, void *m, rq_status *st);

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
        return oom(st);
    *out = a;
    *n_out = 0;
    for (size_t i = 0; i < n; i++) {
        void *m = malloc(elem_size);
        if (!m)
            return oom(st);
        init(m);
        a[i] = m;
        *n_out = i + 1;
        size_t old = jp_index(p, i);
        int rc = fill(json_array_get(v, i), p, m, st);
        jp_pop(p, old);
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

/* --- RankRequest --- */
static const jfield REQ_FIELDS[] = {{"model", "model"},           {"modelVersion", "model_version"},
                                    {"users", "users"},           {"candidates", "candidates"},
                                    {"topK", "top_k"},            {"requestId", "request_id"}};

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
    default: return j_string(v, p, &m->request_id, st);
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
        return oom(st), NULL; /* jansson names every input error; no text: it ran out of memory */
    if (!root) {
        rq_status_set(st, RQ_INVALID_ARGUMENT, "invalid JSON at line %d column %d: %s", je.line,
                      je.column, je.text);
        return NULL;
    }
    Ikbo__V1__RankRequest *req = malloc(sizeof *req);
    if (!req) {
        json_decref(root);
        oom(st);
        return NULL;
    }
    ikbo__v1__rank_request__init(req);
    jpath p = {.s = "", .n = 0};
    if (!json_is_object(root)) {
        jerr_type(st, &p, "object", root);
        goto fail;
    }
    if (j_object(root, &p, REQ_FIELDS, 6, req, req_field, st))
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
    oom(st);
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

/* ======================================================================
 * response
 * ====================================================================== */

typedef struct rank_item {
    float score;
    int32_t index; /* request position */
} rank_item;

/* Score descending, ties (and NaN, ranked last) by request index ascending. */
static int rank_cmp(const void *pa, const void *pb)
{
    const rank_item *a = pa, *b = pb;
    int na = isnan(a->score), nb_ = isnan(b->score);
    if (na != nb_)
        return na - nb_;
    if (!na && a->score != b->score)
        return a->score > b->score ? -1 : 1;
    return (a->index > b->index) - (a->index < b->index);
}

Ikbo__V1__RankResponse *rq_response_build(const Ikbo__V1__RankRequest *req, const rq_plan *p,
                                          const char *model_name_, int64_t model_version,
                                          const ikbo_model_info *mi, const float *task_scores,
                                          const float *scores, rq_status *st)
{
    const size_t C = (size_t)p->batch.n_cands;
    const size_t T = mi->n_tasks > 0 ? (size_t)mi->n_tasks : 0;
    Ikbo__V1__RankResponse *r = malloc(sizeof *r);
    int32_t *inv = NULL;
    rank_item *items = NULL;
    if (!r)
        goto nomem;
    ikbo__v1__rank_response__init(r);
    r->model = xstrdup(model_name_ ? model_name_ : "");
    r->request_id = xstrdup(req->request_id ? req->request_id : "");
    if (!r->model || !r->request_id)
        goto nomem;
    r->model_version = model_version;
    r->unique_users = (uint32_t)p->batch.n_users;
    if (T) {
        r->tasks = calloc(T, sizeof *r->tasks);
        if (!r->tasks)
            goto nomem;
        for (size_t t = 0; t < T; t++) {
            r->tasks[t] = xstrdup(mi->tasks[t] ? mi->tasks[t] : "");
            if (!r->tasks[t])
                goto nomem;
            r->n_tasks = t + 1;
        }
    }

    /* inv[request position] = batch index */
    inv = malloc((C ? C : 1) * sizeof *inv);
    items = malloc((C ? C : 1) * sizeof *items);
    if (!inv || !items)
        goto nomem;
    for (size_t i = 0; i < C; i++)
        inv[p->order[i]] = (int32_t)i;
    for (size_t k = 0; k < C; k++) {
        items[k].index = (int32_t)k;
        items[k].score = scores ? scores[inv[k]] : 0.0f;
    }
    size_t n = C;
    if (req->top_k > 0) {
        qsort(items, C, sizeof *items, rank_cmp);
        if ((size_t)req->top_k < n)
            n = req->top_k;
    }
    if (n) {
        r->scores = calloc(n, sizeof *r->scores);
        if (!r->scores)
            goto nomem;
    }
    for (size_t k = 0; k < n; k++) {
        Ikbo__V1__Score *s = malloc(sizeof *s);
        if (!s)
            goto nomem;
        ikbo__v1__score__init(s);
        r->scores[k] = s;
        r->n_scores = k + 1;
        size_t ri = (size_t)items[k].index, bi = (size_t)inv[ri];
        s->id = req->candidates[ri]->id;
        s->index = (uint32_t)ri;
        s->score = items[k].score;
        if (task_scores && T) {
            s->task_scores = malloc(T * sizeof(float));
            if (!s->task_scores)
                goto nomem;
            memcpy(s->task_scores, task_scores + bi * T, T * sizeof(float));
            s->n_task_scores = T;
        }
    }
    free(inv);
    free(items);
    rq_status_ok(st);
    return r;
nomem:
    free(inv);
    free(items);
    rq_response_free(r);
    oom(st);
    return NULL;
}

void rq_response_free(Ikbo__V1__RankResponse *resp)
{
    if (resp)
        protobuf_c_message_free_unpacked(&resp->base, NULL);
}
