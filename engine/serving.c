/* serving.c - the serving settings' key table and the one parser every
 * reader of them uses: the model loader (model.json "serving"), the
 * repository watcher (a model's config.json) and the server config
 * ("batching", "device", "mode"). See serving.h. */
#include "serving.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

/* Longest value shown in a message before it is cut with "...". */
#define SHOW_MAX 60

/* Only libc and jansson here (no bk_seterr, no json_schema): the server's
 * config parser links this file alone. */
int serving_fail(bk_err *err, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        for (char *c = err->msg; *c; c++)
            if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = '?';
    }
    return -1;
}

/* s in quotes, cut at SHOW_MAX bytes. */
static const char *show(const char *s, char *buf, size_t n)
{
    snprintf(buf, n, "\"%.*s%s\"", SHOW_MAX, s, strlen(s) > SHOW_MAX ? "..." : "");
    return buf;
}

#define INT_KEY(f, lo, hi, d, sc, desc) \
    {#f, SERVING_INT, offsetof(ikbo_serving, f), sizeof(long long), lo, hi, d, sc, desc}
#define STR_KEY(f, t, sc, desc) \
    {#f, t, offsetof(ikbo_serving, f), sizeof(((ikbo_serving *)0)->f), 0, 0, 0, sc, desc}
#define BOTH (SERVING_MODEL | SERVING_BATCHING)

const serving_key serving_keys[] = {
    INT_KEY(max_batch_candidates, 0, 100000000, SERVING_DEF_MAX_BATCH_CANDIDATES, BOTH,
            "a batch closes at this many candidates; 0 = auto by device"),
    INT_KEY(max_batch_users, 0, 1000000, SERVING_DEF_MAX_BATCH_USERS, BOTH,
            "... or this many user rows (before cross-request dedup); 0 = auto by device"),
    INT_KEY(max_queue_delay_us, 0, 10000000, SERVING_DEF_MAX_QUEUE_DELAY_US, BOTH,
            "longest the oldest request waits for a batch to fill"),
    INT_KEY(instances, 0, SERVING_MAX_INSTANCES, SERVING_DEF_INSTANCES, BOTH,
            "execution instances (context + thread) per model version; 0 = auto by device"),
    INT_KEY(max_queue_candidates, 1, 1000000000, SERVING_DEF_MAX_QUEUE_CANDIDATES,
            SERVING_BATCHING, "admission: candidates waiting, at most"),
    INT_KEY(max_queue_requests, 1, 10000000, SERVING_DEF_MAX_QUEUE_REQUESTS, SERVING_BATCHING,
            "admission: requests waiting, at most"),
    INT_KEY(graphs, 0, 1024, SERVING_DEF_GRAPHS, BOTH,
            "batch shapes each instance keeps a recorded CUDA graph for; 0 = off (cuda only)"),
    INT_KEY(fold, 0, 1, SERVING_DEF_FOLD, BOTH,
            "1: fold each lce read only by flatten -> linear into one linear over the candidate "
            "tokens where that takes FLOPs off (engine/fold.h); 0 = run them as written"),
    INT_KEY(user_lane, 0, 1, SERVING_DEF_USER_LANE, BOTH,
            "1: run the user side's layers on a second stream beside the candidate side "
            "(engine/lane.h; ikbo mode; overlaps on cuda only); 0 = one stream"),
    INT_KEY(idle_spin_us, 0, 10000, SERVING_DEF_IDLE_SPIN_US, BOTH,
            "how long an idle instance (and one completer) polls for work before it sleeps; "
            "0 = sleep at once"),
    INT_KEY(gpu_spin_us, 0, 10000000, SERVING_DEF_GPU_SPIN_US, BOTH,
            "how long an instance polls the GPU for its batch's end before it sleeps until the "
            "GPU signals; 0 = sleep at once (cuda only)"),
    INT_KEY(batch_timeout_ms, 0, 3600000, SERVING_DEF_BATCH_TIMEOUT_MS, SERVING_BATCHING,
            "a batch still computing after this long means the device is hung: the server "
            "exits 3 for its supervisor to restart it; 0 = never"),
    STR_KEY(mode, SERVING_MODE, SERVING_MODEL | SERVING_TOP, "\"ikbo\" or \"broadcast\""),
    STR_KEY(device, SERVING_DEVICE, SERVING_MODEL | SERVING_TOP, "\"cpu\" or \"cuda:N\""),
};
const int serving_n_keys = (int)(sizeof serving_keys / sizeof serving_keys[0]);

static long long *int_at(ikbo_serving *s, const serving_key *k)
{
    return (long long *)(void *)((char *)s + k->offset);
}
static const long long *int_at_c(const ikbo_serving *s, const serving_key *k)
{
    return (const long long *)(const void *)((const char *)s + k->offset);
}
static char *str_at(ikbo_serving *s, const serving_key *k) { return (char *)s + k->offset; }
static const char *str_at_c(const ikbo_serving *s, const serving_key *k)
{
    return (const char *)s + k->offset;
}

const serving_key *serving_find(const char *name, unsigned scope)
{
    for (int i = 0; i < serving_n_keys; i++)
        if ((serving_keys[i].scopes & scope) && !strcmp(serving_keys[i].name, name))
            return &serving_keys[i];
    return NULL;
}

void serving_unset(ikbo_serving *s)
{
    memset(s, 0, sizeof *s);
    for (int i = 0; i < serving_n_keys; i++)
        if (serving_keys[i].type == SERVING_INT) *int_at(s, &serving_keys[i]) = -1;
}

void serving_defaults(ikbo_serving *s)
{
    serving_unset(s);
    for (int i = 0; i < serving_n_keys; i++)
        if (serving_keys[i].type == SERVING_INT)
            *int_at(s, &serving_keys[i]) = serving_keys[i].def;
}

void serving_merge(ikbo_serving *dst, const ikbo_serving *src)
{
    for (int i = 0; i < serving_n_keys; i++) {
        const serving_key *k = &serving_keys[i];
        if (k->type == SERVING_INT) {
            if (*int_at_c(src, k) >= 0) *int_at(dst, k) = *int_at_c(src, k);
        } else if (str_at_c(src, k)[0]) {
            snprintf(str_at(dst, k), k->size, "%s", str_at_c(src, k));
        }
    }
}

const char *serving_json_got(const json_t *v, char *buf, size_t n)
{
    char t[SHOW_MAX + 8];
    switch (json_typeof(v)) {
    case JSON_STRING: snprintf(buf, n, "got %s", show(json_string_value(v), t, sizeof t)); break;
    case JSON_INTEGER: snprintf(buf, n, "got %" JSON_INTEGER_FORMAT, json_integer_value(v)); break;
    case JSON_REAL: snprintf(buf, n, "got %g", json_real_value(v)); break;
    case JSON_OBJECT: snprintf(buf, n, "got object"); break;
    case JSON_ARRAY: snprintf(buf, n, "got array"); break;
    case JSON_TRUE: snprintf(buf, n, "got true"); break;
    case JSON_FALSE: snprintf(buf, n, "got false"); break;
    default: snprintf(buf, n, "got null"); break;
    }
    return buf;
}

static int bad_int(const serving_key *k, const char *path, const char *got, bk_err *err)
{
    return serving_fail(err, "%s: expected integer %lld..%lld, %s", path, k->min, k->max, got);
}

/* A mode or device name: checked by the one rule for its type. */
static int set_str(ikbo_serving *s, const serving_key *k, const char *v, const char *path,
                   bk_err *err)
{
    int ok = k->type == SERVING_MODE ? ikbo_mode_parse(v, NULL) == 0
                                     : bk_parse_device(v, NULL) == 0;
    char t[SHOW_MAX + 8];
    if (!ok)
        return serving_fail(err, "%s: expected %s, got %s", path, k->description,
                            show(v, t, sizeof t));
    snprintf(str_at(s, k), k->size, "%s", v);
    return 0;
}

int serving_set_json(ikbo_serving *s, const serving_key *k, const json_t *v, const char *path,
                     bk_err *err)
{
    char got[SHOW_MAX + 16];
    if (k->type == SERVING_INT) {
        if (!json_is_integer(v) || json_integer_value(v) < k->min ||
            json_integer_value(v) > k->max)
            return bad_int(k, path, serving_json_got(v, got, sizeof got), err);
        *int_at(s, k) = json_integer_value(v);
        return 0;
    }
    if (!json_is_string(v))
        return serving_fail(err, "%s: expected string, %s", path,
                            serving_json_got(v, got, sizeof got));
    if (strlen(json_string_value(v)) != json_string_length(v))
        return serving_fail(err, "%s: string contains NUL", path);
    return set_str(s, k, json_string_value(v), path, err);
}

int serving_set_text(ikbo_serving *s, const serving_key *k, const char *text, const char *where,
                     bk_err *err)
{
    if (k->type != SERVING_INT) return set_str(s, k, text, where, err);
    char t[SHOW_MAX + 8], got[SHOW_MAX + 16];
    const int digit = text[0] == '-' || (text[0] >= '0' && text[0] <= '9');
    char *end = NULL;
    long long x = 0;
    errno = 0;
    if (digit) x = strtoll(text, &end, 10);
    if (!digit || errno || *end || x < k->min || x > k->max) {
        snprintf(got, sizeof got, "got %s", show(text, t, sizeof t));
        return bad_int(k, where, got, err);
    }
    *int_at(s, k) = x;
    return 0;
}

/* "a, b, c": the keys of scope, for an unknown-key message. */
static void known_keys(unsigned scope, char *buf, size_t n)
{
    size_t o = 0;
    buf[0] = 0;
    for (int i = 0; i < serving_n_keys && o < n; i++)
        if (serving_keys[i].scopes & scope)
            o += (size_t)snprintf(buf + o, n - o, "%s%s", o ? ", " : "", serving_keys[i].name);
}

int serving_apply_object(ikbo_serving *s, const json_t *o, const char *path, unsigned scope,
                         bk_err *err)
{
    char got[SHOW_MAX + 16];
    if (!json_is_object(o))
        return serving_fail(err, "%s: expected object, %s", path,
                            serving_json_got(o, got, sizeof got));
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)o, key, v)
    {
        char kp[160];
        snprintf(kp, sizeof kp, "%.60s.%.80s", path, key);
        const serving_key *k = serving_find(key, scope);
        if (!k) {
            char known[400];
            known_keys(scope, known, sizeof known);
            return serving_fail(err, "%s: unknown key (known: %s)", kp, known);
        }
        if (serving_set_json(s, k, v, kp, err)) return -1;
    }
    return 0;
}

json_t *serving_to_json(const ikbo_serving *s, unsigned scope)
{
    json_t *o = json_object();
    for (int i = 0; o && i < serving_n_keys; i++) {
        const serving_key *k = &serving_keys[i];
        if (!(k->scopes & scope)) continue;
        json_t *v = k->type == SERVING_INT ? json_integer(*int_at_c(s, k))
                                           : json_string(str_at_c(s, k));
        if (json_object_set_new(o, k->name, v)) {
            json_decref(o);
            return NULL;
        }
    }
    return o;
}
