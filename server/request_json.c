/* request_json.c - proto3 JSON <-> the Rank messages: RankRequest from the
 * HTTP :rank body (and ikbo-score's file), RankResponse and errors back.
 *
 * Why this exists: the HTTP transport and ikbo-score speak JSON, gRPC
 * speaks protobuf; both must produce the same RankRequest, so that
 * validation (request.c) gives the same status and message on every
 * transport. Every error names the JSON path of the field. Policies are in
 * request.h. Reentrant; no global state.
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
        return rq_status_oom(st);
    *out = a;
    *n_out = 0;
    for (size_t i = 0; i < n; i++) {
        void *m = malloc(elem_size);
        if (!m)
            return rq_status_oom(st);
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

