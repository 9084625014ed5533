/* json_schema.h - strict typed access to jansson values, with load-error text.
 *
 * Why this exists: every model file is untrusted and every mistake in it must
 * become one precise line ("<file>: layer 'x': 'layers[3].out' must be an
 * integer >= 1, got 0"). These helpers keep that wording uniform across the
 * model.json loader and the safetensors header parser, and make sure nothing a
 * file contains (newlines, control bytes, huge names) reaches a message raw.
 *
 * A js_ctx names the file and carries the error sink; `path` is the dotted
 * key path of the containing object ("" for the document root, "layers[3]"),
 * `pre` an optional message prefix such as "layer 'top1': " ("" or NULL for
 * none). Every function returns 0 on success, -1 after writing the error.
 * Thread-safety: none needed; no state beyond the arguments.
 */
#ifndef IKBO_JSON_SCHEMA_H
#define IKBO_JSON_SCHEMA_H

#include <stddef.h>

#include <jansson.h>

#include "../kernels/backend.h"

typedef struct js_ctx {
    const char *file; /* shown first in every message */
    bk_err *err;
} js_ctx;

/* Longest quoted user string in a message before it is cut with "...". */
#define JS_QUOTE_MAX 64

/* Writes "<file>: <formatted>" to c->err. */
void js_fail(const js_ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Copies s into buf as printable one-line text: control bytes and DEL become
 * \xNN, backslash and quote are escaped, at most max source bytes are kept
 * (never cutting a UTF-8 sequence) and a cut ends in "...". Returns buf. */
const char *js_quote_n(char *buf, size_t n, const char *s, size_t max);
#define js_quote(buf, s) js_quote_n((buf), sizeof(buf), (s), JS_QUOTE_MAX)

/* "string", "integer", "real", "object", "array", "boolean", "null". */
const char *js_type_name(const json_t *v);

/* Joins path and key into buf ("a.b", or "b" when path is empty); key is
 * quoted for safety. Returns buf. */
const char *js_path(char *buf, size_t n, const char *path, const char *key);

/* Fails on the first key of obj not in allowed (NULL-terminated), naming its
 * full path and listing the allowed keys. */
int js_check_keys(const js_ctx *c, const json_t *obj, const char *path, const char *pre,
                  const char *const *allowed);

/* Typed getters. When the key is absent: required -> error "missing key";
 * optional -> *out gets the default (NULL for pointers) and 0 is returned. */
int js_get_int(const js_ctx *c, const json_t *obj, const char *path, const char *pre,
               const char *key, int required, long long dflt, long long min, long long max,
               long long *out);
int js_get_str(const js_ctx *c, const json_t *obj, const char *path, const char *pre,
               const char *key, int required, const char **out);
int js_get_obj(const js_ctx *c, const json_t *obj, const char *path, const char *pre,
               const char *key, int required, json_t **out);
int js_get_arr(const js_ctx *c, const json_t *obj, const char *path, const char *pre,
               const char *key, int required, json_t **out);

/* Parses buf (len bytes, need not be NUL-terminated) as a JSON object with
 * duplicate keys rejected. what = "" or e.g. "header: ". */
json_t *js_load_object(const js_ctx *c, const char *what, const char *buf, size_t len);

#endif
