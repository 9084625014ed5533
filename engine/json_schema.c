/* json_schema.c - strict typed access to jansson values, with load-error text.
 * See json_schema.h. */
#include "json_schema.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void js_fail(const js_ctx *c, const char *fmt, ...)
{
    char body[sizeof(((bk_err *)0)->msg)];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(body, sizeof body, fmt, ap);
    va_end(ap);
    if (c->err)
        bk_seterr(c->err, "%s: %s", c->file, body);
}

const char *js_quote_n(char *buf, size_t n, const char *s, size_t max)
{
    size_t o = 0, lead = 0, len;
    int cut = 0;
    if (n == 0)
        return buf;
    if (!s)
        s = "(null)";
    len = strlen(s);
    if (len > max) {
        len = max;
        /* Back up to a UTF-8 sequence start so the cut never splits one. */
        while (len > 0 && ((unsigned char)s[len] & 0xC0) == 0x80)
            len--;
        cut = 1;
    }
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)s[i];
        char tmp[8];
        size_t k;
        if (ch < 0x20 || ch == 0x7f) {
            snprintf(tmp, sizeof tmp, "\\x%02x", ch);
        } else if (ch == '\\' || ch == '\'') {
            tmp[0] = '\\';
            tmp[1] = (char)ch;
            tmp[2] = 0;
        } else {
            tmp[0] = (char)ch;
            tmp[1] = 0;
        }
        k = strlen(tmp);
        if ((ch & 0xC0) != 0x80)
            lead = o;
        if (o + k + 4 > n) { /* keep room for "..." and the NUL */
            if ((ch & 0xC0) == 0x80)
                o = lead; /* drop the partial UTF-8 sequence */
            cut = 1;
            break;
        }
        memcpy(buf + o, tmp, k);
        o += k;
    }
    if (cut && o + 4 <= n) {
        memcpy(buf + o, "...", 3);
        o += 3;
    }
    buf[o < n ? o : n - 1] = 0;
    return buf;
}

const char *js_type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "object";
    case JSON_ARRAY:
        return "array";
    case JSON_STRING:
        return "string";
    case JSON_INTEGER:
        return "integer";
    case JSON_REAL:
        return "real";
    case JSON_TRUE:
    case JSON_FALSE:
        return "boolean";
    case JSON_NULL:
    default:
        return "null";
    }
}

const char *js_path(char *buf, size_t n, const char *path, const char *key)
{
    char q[JS_QUOTE_MAX * 4 + 8];
    js_quote(q, key);
    if (path && path[0])
        snprintf(buf, n, "%s.%s", path, q);
    else
        snprintf(buf, n, "%s", q);
    return buf;
}

int js_check_keys(const js_ctx *c, const json_t *obj, const char *path, const char *pre,
                  const char *const *allowed)
{
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)obj, key, v) {
        int ok = 0;
        for (const char *const *a = allowed; *a; a++)
            if (strcmp(*a, key) == 0) {
                ok = 1;
                break;
            }
        if (!ok) {
            char p[400], list[256];
            size_t o = 0;
            list[0] = 0;
            for (const char *const *a = allowed; *a && o < sizeof list; a++) {
                int k = snprintf(list + o, sizeof list - o, "%s%s", o ? ", " : "", *a);
                if (k < 0)
                    break;
                o += (size_t)k;
            }
            js_fail(c, "%sunknown key '%s' (allowed: %s)", pre ? pre : "",
                    js_path(p, sizeof p, path, key), list);
            return -1;
        }
    }
    return 0;
}

static json_t *get_or_missing(const js_ctx *c, const json_t *obj, const char *path,
                              const char *pre, const char *key, int required, const char *type,
                              int *rc)
{
    json_t *v = json_object_get(obj, key);
    *rc = 0;
    if (!v && required) {
        char p[400];
        js_fail(c, "%smissing key '%s' (%s)", pre ? pre : "", js_path(p, sizeof p, path, key),
                type);
        *rc = -1;
    }
    return v;
}

static int type_error(const js_ctx *c, const char *path, const char *pre, const char *key,
                      const char *want, const json_t *got)
{
    char p[400];
    js_fail(c, "%s'%s' must be %s, got %s", pre ? pre : "", js_path(p, sizeof p, path, key), want,
            js_type_name(got));
    return -1;
}

int js_get_int(const js_ctx *c, const json_t *obj, const char *path, const char *pre,
               const char *key, int required, long long dflt, long long min, long long max,
               long long *out)
{
    int rc;
    json_t *v = get_or_missing(c, obj, path, pre, key, required, "integer", &rc);
    if (rc)
        return rc;
    if (!v) {
        *out = dflt;
        return 0;
    }
    if (!json_is_integer(v))
        return type_error(c, path, pre, key, "an integer", v);
    long long x = (long long)json_integer_value(v);
    if (x < min || x > max) {
        char p[400];
        js_fail(c, "%s'%s' must be an integer in [%lld, %lld], got %lld", pre ? pre : "",
                js_path(p, sizeof p, path, key), min, max, x);
        return -1;
    }
    *out = x;
    return 0;
}

int js_get_str(const js_ctx *c, const json_t *obj, const char *path, const char *pre,
               const char *key, int required, const char **out)
{
    int rc;
    json_t *v = get_or_missing(c, obj, path, pre, key, required, "string", &rc);
    *out = NULL;
    if (rc || !v)
        return rc;
    if (!json_is_string(v))
        return type_error(c, path, pre, key, "a string", v);
    *out = json_string_value(v);
    return 0;
}

int js_get_obj(const js_ctx *c, const json_t *obj, const char *path, const char *pre,
               const char *key, int required, json_t **out)
{
    int rc;
    json_t *v = get_or_missing(c, obj, path, pre, key, required, "object", &rc);
    *out = NULL;
    if (rc || !v)
        return rc;
    if (!json_is_object(v))
        return type_error(c, path, pre, key, "an object", v);
    *out = v;
    return 0;
}

int js_get_arr(const js_ctx *c, const json_t *obj, const char *path, const char *pre,
               const char *key, int required, json_t **out)
{
    int rc;
    json_t *v = get_or_missing(c, obj, path, pre, key, required, "array", &rc);
    *out = NULL;
    if (rc || !v)
        return rc;
    if (!json_is_array(v))
        return type_error(c, path, pre, key, "an array", v);
    *out = v;
    return 0;
}

json_t *js_load_object(const js_ctx *c, const char *what, const char *buf, size_t len)
{
    json_error_t je;
    json_t *root;
    char text[JS_QUOTE_MAX * 4 + 8];
    if (!buf) {
        buf = "";
        len = 0;
    }
    root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        /* jansson's text can quote the offending token: sanitize it. */
        js_quote_n(text, sizeof text, je.text, 120);
        js_fail(c, "%sinvalid JSON at line %d column %d: %s", what, je.line, je.column, text);
        return NULL;
    }
    if (!json_is_object(root)) {
        js_fail(c, "%sthe document must be a JSON object, got %s", what, js_type_name(root));
        json_decref(root);
        return NULL;
    }
    return root;
}
