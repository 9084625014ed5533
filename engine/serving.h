/* serving.h - the serving settings' one key table and its parser.
 *
 * Why this exists: the same settings (batch limits, queue delay, instances,
 * mode, device) are written in three places - model.json's "serving", a
 * model's <repo>/<name>/config.json "serving", and the server's config.json
 * ("batching", which adds the queue limits, and the top-level "device" and
 * "mode") - and each place once had its own parser with its own ranges and
 * wording. One table (name, type, offset, range, default, where it may
 * appear, description) now says it once, and every reader goes through it.
 *
 * Why in engine/ and not server/: the engine validates model.json in full
 * (an unknown or out-of-range "serving" key is a load error for every
 * embedder, ikbo-score included), and the layering is server -> engine, so
 * the engine holds the table and the server uses it.
 *
 * Messages name the path and what was expected, in the server config's
 * wording: `serving.instances: expected integer 0..64, got 65`,
 * `batching.max_delay: unknown key (known: ...)`. The caller adds the file.
 * Control bytes of a key or value from a file become '?', so a message is
 * one line. This file needs only libc and jansson (the server's config
 * parser links it alone, without the rest of the engine).
 *
 * Thread-safety: the table is constant; nothing here keeps state.
 */
#ifndef IKBO_ENGINE_SERVING_H
#define IKBO_ENGINE_SERVING_H

#include <stddef.h>

#include "ikbo.h"

/* jansson's value type, declared only: users of the defaults need no jansson. */
struct json_t;

/* Where a key may appear (serving_key.scopes). */
enum serving_scope {
    SERVING_MODEL = 1u << 0,    /* model.json "serving", <repo>/<name>/config.json "serving" */
    SERVING_BATCHING = 1u << 1, /* the server config's "batching" */
    SERVING_TOP = 1u << 2,      /* the server config's top level ("device", "mode") */
};

enum serving_type {
    SERVING_INT,    /* long long field, min..max, -1 = unset */
    SERVING_MODE,   /* char[] field: ikbo_mode_parse's names, "" = unset */
    SERVING_DEVICE, /* char[] field: bk_parse_device's rule, "" = unset */
};

typedef struct serving_key {
    const char *name;
    enum serving_type type;
    size_t offset; /* in ikbo_serving */
    size_t size;   /* the field's size (strings: the buffer) */
    long long min, max;
    long long def;  /* SERVING_INT: the server's default (config.json) */
    unsigned scopes;
    const char *description;
} serving_key;

extern const serving_key serving_keys[];
extern const int serving_n_keys;

/* The server defaults of the queue and batch limits (the table's def). */
#define SERVING_DEF_MAX_BATCH_CANDIDATES 0 /* auto by device */
#define SERVING_DEF_MAX_BATCH_USERS 0      /* auto by device */
#define SERVING_DEF_MAX_QUEUE_DELAY_US 0
#define SERVING_DEF_INSTANCES 0 /* auto by device */
#define SERVING_DEF_MAX_QUEUE_CANDIDATES 32768
#define SERVING_DEF_MAX_QUEUE_REQUESTS 1024
#define SERVING_DEF_GRAPHS 16
#define SERVING_DEF_FOLD 1
#define SERVING_DEF_USER_LANE 1
#define SERVING_DEF_IDLE_SPIN_US 0
#define SERVING_DEF_GPU_SPIN_US 10000000
#define SERVING_DEF_BATCH_TIMEOUT_MS 30000
#define SERVING_MAX_INSTANCES 64

/* The key called name that may appear in scope; NULL if none. */
const serving_key *serving_find(const char *name, unsigned scope);

/* Every field unset (-1, ""). */
void serving_unset(ikbo_serving *s);
/* The server defaults: every integer its table default, strings unset. */
void serving_defaults(ikbo_serving *s);
/* Every field set in src (>= 0, non-empty) overwrites dst's. */
void serving_merge(ikbo_serving *dst, const ikbo_serving *src);

/* Sets key k of *s from a JSON value; path names it in the message
 * ("batching.instances", "device"). 0, or -1 with *err (s untouched). */
int serving_set_json(ikbo_serving *s, const serving_key *k, const struct json_t *v, const char *path,
                     bk_err *err);
/* Same from text (environment, command line): a decimal integer or the
 * string itself. where names the source ("IKBO_DEVICE", "--mode"). */
int serving_set_text(ikbo_serving *s, const serving_key *k, const char *text, const char *where,
                     bk_err *err);

/* Applies every key of the JSON object o that may appear in scope; path is
 * the object's ("serving", "batching"). Refuses a non-object, an unknown key
 * (listing the known ones) and a bad value. On error *s may be partly set. */
int serving_apply_object(ikbo_serving *s, const struct json_t *o, const char *path, unsigned scope,
                         bk_err *err);

/* The keys of scope as a JSON object in table order (unset values as -1 and
 * ""). NULL on allocation failure. */
struct json_t *serving_to_json(const ikbo_serving *s, unsigned scope);

/* "got 3", "got \"x\"" (quoted, cut at 60 bytes), "got true", "got array": how
 * every config-file message shows a value; server/config.c uses it too. */
const char *serving_json_got(const struct json_t *v, char *buf, size_t n);

/* A one-line error for a setting read from a file: the message, with the
 * control bytes a key or value may hold shown as '?'. Returns -1. */
int serving_fail(bk_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
