/* safetensors.c - validate a safetensors file and read its tensors as fp32.
 * See safetensors.h for the rules enforced. */
#define _POSIX_C_SOURCE 200809L /* pread, strdup, O_CLOEXEC */

#include "safetensors.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "json_schema.h"

size_t st_dtype_size(enum st_dtype d) { return d == ST_F32 ? 4 : 2; }

const char *st_dtype_name(enum st_dtype d)
{
    switch (d) {
    case ST_F32:
        return "F32";
    case ST_F16:
        return "F16";
    case ST_BF16:
        return "BF16";
    }
    return "?";
}

static float bits_to_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float st_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0x1f) /* inf, or NaN with its payload kept */
        return bits_to_f32(sign | 0x7f800000u | (mant << 13));
    if (exp == 0) {
        if (mant == 0)
            return bits_to_f32(sign);
        /* Subnormal half (mant * 2^-24) is a normal float: normalize. */
        uint32_t e = 127 - 15 + 1;
        while (!(mant & 0x400u)) {
            mant <<= 1;
            e--;
        }
        return bits_to_f32(sign | (e << 23) | ((mant & 0x3ffu) << 13));
    }
    return bits_to_f32(sign | ((exp + 127 - 15) << 23) | (mant << 13));
}

float st_bf16_to_f32(uint16_t b) { return bits_to_f32((uint32_t)b << 16); }

long st_first_nonfinite(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return (long)i;
    return -1;
}

static uint64_t le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* Reads len bytes at absolute file offset off (the caller checked bounds). */
static int read_at(const st_file *f, uint64_t off, void *dst, size_t len, bk_err *err)
{
    if (f->mem) {
        memcpy(dst, f->mem + off, len);
        return 0;
    }
    uint8_t *p = dst;
    while (len > 0) {
        size_t chunk = len > ((size_t)1 << 30) ? ((size_t)1 << 30) : len;
        ssize_t k = pread(f->fd, p, chunk, (off_t)off);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            bk_seterr(err, "%s: read failed: %s", f->fname, strerror(errno));
            return -1;
        }
        if (k == 0) {
            bk_seterr(err, "%s: unexpected end of file at byte %llu (file changed while loading?)",
                      f->fname, (unsigned long long)off);
            return -1;
        }
        p += k;
        off += (uint64_t)k;
        len -= (size_t)k;
    }
    return 0;
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp(((const st_tensor *)a)->name, ((const st_tensor *)b)->name);
}

static int cmp_begin(const void *a, const void *b)
{
    const st_tensor *x = *(const st_tensor *const *)a, *y = *(const st_tensor *const *)b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return 0;
}

/* Non-negative JSON integer, or -1 if v is anything else. */
static int json_u64(const json_t *v, uint64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return -1;
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

static int parse_tensor(const js_ctx *c, const char *name, json_t *e, uint64_t data_size,
                        st_tensor *t)
{
    static const char *const keys[] = {"dtype", "shape", "data_offsets", NULL};
    char qn[JS_QUOTE_MAX * 4 + 8], pre[JS_QUOTE_MAX * 4 + 32], q2[JS_QUOTE_MAX * 4 + 8];
    const char *dt;
    json_t *shape, *offs;

    js_quote(qn, name);
    snprintf(pre, sizeof pre, "tensor '%s': ", qn);
    if (!json_is_object(e)) {
        js_fail(c, "%sheader entry must be an object, got %s", pre, js_type_name(e));
        return -1;
    }
    if (js_check_keys(c, e, "", pre, keys) || js_get_str(c, e, "", pre, "dtype", 1, &dt) ||
        js_get_arr(c, e, "", pre, "shape", 1, &shape) ||
        js_get_arr(c, e, "", pre, "data_offsets", 1, &offs))
        return -1;

    if (strcmp(dt, "F32") == 0)
        t->dtype = ST_F32;
    else if (strcmp(dt, "F16") == 0)
        t->dtype = ST_F16;
    else if (strcmp(dt, "BF16") == 0)
        t->dtype = ST_BF16;
    else {
        js_fail(c, "%sdtype %s is not supported (F32, F16 or BF16 only)", pre, js_quote(q2, dt));
        return -1;
    }

    size_t nd = json_array_size(shape);
    if (nd > ST_MAX_DIMS) {
        js_fail(c, "%sshape has %zu dimensions, at most %d are supported", pre, nd, ST_MAX_DIMS);
        return -1;
    }
    t->ndim = (int)nd;
    t->numel = 1;
    for (size_t i = 0; i < nd; i++) {
        json_t *d = json_array_get(shape, i);
        if (json_u64(d, &t->shape[i])) {
            js_fail(c, "%sshape[%zu] must be a non-negative integer, got %s", pre, i,
                    js_type_name(d));
            return -1;
        }
        if (__builtin_mul_overflow(t->numel, t->shape[i], &t->numel)) {
            js_fail(c, "%sshape element count overflows", pre);
            return -1;
        }
    }
    uint64_t nbytes;
    if (__builtin_mul_overflow(t->numel, (uint64_t)st_dtype_size(t->dtype), &nbytes)) {
        js_fail(c, "%sshape byte size overflows", pre);
        return -1;
    }

    if (json_array_size(offs) != 2 || json_u64(json_array_get(offs, 0), &t->begin) ||
        json_u64(json_array_get(offs, 1), &t->end)) {
        js_fail(c, "%sdata_offsets must be [begin, end], two non-negative integers", pre);
        return -1;
    }
    if (t->begin > t->end || t->end > data_size) {
        js_fail(c, "%sdata_offsets [%llu, %llu] out of bounds (data section is %llu bytes)", pre,
                (unsigned long long)t->begin, (unsigned long long)t->end,
                (unsigned long long)data_size);
        return -1;
    }
    if (t->end - t->begin != nbytes) {
        js_fail(c,
                "%sdata_offsets [%llu, %llu] hold %llu bytes, but %s shape with %llu elements "
                "needs %llu",
                pre, (unsigned long long)t->begin, (unsigned long long)t->end,
                (unsigned long long)(t->end - t->begin), st_dtype_name(t->dtype),
                (unsigned long long)t->numel, (unsigned long long)nbytes);
        return -1;
    }
    return 0;
}

static int check_metadata(const js_ctx *c, json_t *meta)
{
    const char *k;
    json_t *v;
    char q[JS_QUOTE_MAX * 4 + 8];
    if (!json_is_object(meta)) {
        js_fail(c, "__metadata__ must be an object of strings, got %s", js_type_name(meta));
        return -1;
    }
    json_object_foreach(meta, k, v) {
        if (!json_is_string(v)) {
            js_fail(c, "__metadata__.%s must be a string, got %s", js_quote(q, k),
                    js_type_name(v));
            return -1;
        }
    }
    return 0;
}

/* The tensors must tile the data section: sorted by begin, each (non-empty)
 * one starts where the previous ended, and the last ends at the end. */
static int check_layout(const js_ctx *c, st_file *f, uint64_t data_size)
{
    char q1[JS_QUOTE_MAX * 4 + 8], q2[JS_QUOTE_MAX * 4 + 8];
    st_tensor **ord = NULL;
    size_t m = 0;
    uint64_t cur = 0;
    const st_tensor *prev = NULL;
    int rc = -1;

    if (f->n) {
        ord = malloc(f->n * sizeof *ord);
        if (!ord) {
            js_fail(c, "out of memory");
            return -1;
        }
    }
    for (size_t i = 0; i < f->n; i++)
        if (f->tensors[i].end > f->tensors[i].begin)
            ord[m++] = &f->tensors[i];
    if (m)
        qsort(ord, m, sizeof *ord, cmp_begin);
    for (size_t i = 0; i < m; i++) {
        const st_tensor *t = ord[i];
        if (t->begin < cur) {
            js_fail(c, "tensors '%s' [%llu, %llu) and '%s' [%llu, %llu) overlap",
                    js_quote(q1, prev->name), (unsigned long long)prev->begin,
                    (unsigned long long)prev->end, js_quote(q2, t->name),
                    (unsigned long long)t->begin, (unsigned long long)t->end);
            goto out;
        }
        if (t->begin > cur) {
            js_fail(c, "data bytes [%llu, %llu) belong to no tensor (before '%s')",
                    (unsigned long long)cur, (unsigned long long)t->begin,
                    js_quote(q1, t->name));
            goto out;
        }
        cur = t->end;
        prev = t;
    }
    if (cur != data_size) {
        js_fail(c, "data bytes [%llu, %llu) at the end belong to no tensor",
                (unsigned long long)cur, (unsigned long long)data_size);
        goto out;
    }
    rc = 0;
out:
    free(ord);
    return rc;
}

static int open_common(st_file *f, const char *fname, const uint8_t *mem, int fd, uint64_t size,
                       bk_err *err)
{
    js_ctx c = {fname, err};
    uint8_t lenbuf[8];
    uint8_t *hdr = NULL;
    json_t *root = NULL;
    int rc = -1;

    memset(f, 0, sizeof *f);
    f->fname = fname;
    f->mem = mem;
    f->fd = fd;
    f->size = size;

    if (size < 8) {
        js_fail(&c, "file is %llu bytes, too short for the 8-byte header size",
                (unsigned long long)size);
        return -1;
    }
    if (read_at(f, 0, lenbuf, 8, err))
        return -1;
    uint64_t n = le64(lenbuf);
    if (n > ST_MAX_HEADER) {
        js_fail(&c, "header size %llu exceeds the %llu-byte limit", (unsigned long long)n,
                (unsigned long long)ST_MAX_HEADER);
        return -1;
    }
    if (n > size - 8) {
        js_fail(&c, "header size %llu exceeds the file (%llu bytes after the size field)",
                (unsigned long long)n, (unsigned long long)(size - 8));
        return -1;
    }
    f->data_start = 8 + n;
    uint64_t data_size = size - f->data_start;

    if (mem) {
        root = js_load_object(&c, "header: ", (const char *)mem + 8, (size_t)n);
    } else {
        hdr = malloc(n ? (size_t)n : 1);
        if (!hdr) {
            js_fail(&c, "out of memory reading a %llu-byte header", (unsigned long long)n);
            return -1;
        }
        if (read_at(f, 8, hdr, (size_t)n, err))
            goto out;
        root = js_load_object(&c, "header: ", (const char *)hdr, (size_t)n);
    }
    if (!root)
        goto out;

    size_t cap = json_object_size(root);
    f->tensors = calloc(cap ? cap : 1, sizeof *f->tensors);
    if (!f->tensors) {
        js_fail(&c, "out of memory");
        goto out;
    }
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (strcmp(key, "__metadata__") == 0) {
            if (check_metadata(&c, v))
                goto out;
            continue;
        }
        st_tensor *t = &f->tensors[f->n];
        t->name = strdup(key);
        if (!t->name) {
            js_fail(&c, "out of memory");
            goto out;
        }
        f->n++;
        if (parse_tensor(&c, key, v, data_size, t))
            goto out;
    }
    if (check_layout(&c, f, data_size))
        goto out;
    if (f->n)
        qsort(f->tensors, f->n, sizeof *f->tensors, cmp_name);
    rc = 0;
out:
    json_decref(root);
    free(hdr);
    if (rc)
        st_close(f);
    return rc;
}

int st_open_mem(st_file *f, const char *fname, const uint8_t *buf, size_t len, bk_err *err)
{
    static const uint8_t empty[1];
    return open_common(f, fname, buf ? buf : empty, -1, buf ? len : 0, err);
}

int st_open_fd(st_file *f, const char *fname, int fd, uint64_t size, bk_err *err)
{
    return open_common(f, fname, NULL, fd, size, err);
}

void st_close(st_file *f)
{
    if (!f)
        return;
    for (size_t i = 0; i < f->n; i++)
        free(f->tensors[i].name);
    free(f->tensors);
    f->tensors = NULL;
    f->n = 0;
}

long st_find(const st_file *f, const char *name)
{
    size_t lo = 0, hi = f->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(f->tensors[mid].name, name);
        if (c == 0)
            return (long)mid;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}

int st_read_f32(const st_file *f, const st_tensor *t, float *dst, bk_err *err)
{
    uint64_t off = f->data_start + t->begin;
    size_t n = (size_t)t->numel;
    if (t->dtype == ST_F32) {
        if (read_at(f, off, dst, n * 4, err))
            return -1;
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
        for (size_t i = 0; i < n; i++) {
            uint8_t *p = (uint8_t *)&dst[i];
            uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                         (uint32_t)p[3] << 24;
            dst[i] = bits_to_f32(u);
        }
#endif
        return 0;
    }
    /* 16-bit: convert in chunks through a small buffer. */
    enum { CHUNK = 1 << 15 };
    uint8_t buf[CHUNK * 2];
    for (size_t i = 0; i < n; i += CHUNK) {
        size_t k = n - i < CHUNK ? n - i : CHUNK;
        if (read_at(f, off + (uint64_t)i * 2, buf, k * 2, err))
            return -1;
        for (size_t j = 0; j < k; j++) {
            uint16_t h = (uint16_t)(buf[2 * j] | (buf[2 * j + 1] << 8));
            dst[i + j] = t->dtype == ST_F16 ? st_f16_to_f32(h) : st_bf16_to_f32(h);
        }
    }
    return 0;
}
