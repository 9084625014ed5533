/* loader_fixture.h - in-memory model fixtures for the loader tests and fuzzer.
 *
 * Why this exists: test_loader.c, test_planner.c and tests/fuzz/fuzz_loader.c
 * all need safetensors blobs built from named arrays, the MODEL_FORMAT.md
 * example model, and a check that a loaded model_def is internally consistent
 * (what the executor relies on). Header-only (static functions) so each test
 * binary stays one .c file; it depends on nothing but libc and model.h.
 * Allocation failures abort: this is test code.
 */
#ifndef IKBO_LOADER_FIXTURE_H
#define IKBO_LOADER_FIXTURE_H

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model.h"

#define FX_FN static __attribute__((unused))

/* ------------------------------------------------------------ blobs */

typedef struct fx_st {
    char *hdr; /* JSON header being built, without the closing brace */
    size_t hlen, hcap;
    uint8_t *data;
    size_t dlen, dcap;
} fx_st;

FX_FN void *fx_xrealloc(void *p, size_t n)
{
    p = realloc(p, n ? n : 1);
    if (!p)
        abort();
    return p;
}

FX_FN void fx_hdr_cat(fx_st *b, const char *s)
{
    size_t n = strlen(s);
    if (b->hlen + n + 1 > b->hcap) {
        b->hcap = (b->hlen + n + 1) * 2;
        b->hdr = fx_xrealloc(b->hdr, b->hcap);
    }
    memcpy(b->hdr + b->hlen, s, n + 1);
    b->hlen += n;
}

FX_FN fx_st *fx_new(void)
{
    fx_st *b = calloc(1, sizeof *b);
    if (!b)
        abort();
    fx_hdr_cat(b, "{");
    return b;
}

/* Appends raw tensor bytes with a header entry; shape is JSON text ("[2, 3]"). */
FX_FN void fx_add_raw(fx_st *b, const char *name, const char *dtype, const char *shape,
                       const void *bytes, size_t nbytes)
{
    char e[512];
    if (b->dlen + nbytes > b->dcap) {
        b->dcap = (b->dlen + nbytes) * 2;
        b->data = fx_xrealloc(b->data, b->dcap);
    }
    if (nbytes)
        memcpy(b->data + b->dlen, bytes, nbytes);
    snprintf(e, sizeof e, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":%s,\"data_offsets\":[%zu,%zu]}",
             b->hlen > 1 ? "," : "", name, dtype, shape, b->dlen, b->dlen + nbytes);
    fx_hdr_cat(b, e);
    b->dlen += nbytes;
}

/* fp32 -> binary16, round to nearest even (normal, subnormal, inf, nan). */
FX_FN uint16_t fx_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t exp = (x >> 23) & 0xffu, mant = x & 0x7fffffu;
    if (exp == 0xff)
        return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u : 0));
    int e = (int)exp - 127 + 15;
    if (e >= 31)
        return (uint16_t)(sign | 0x7c00u);
    if (e <= 0) {
        if (e < -10)
            return sign;
        mant |= 0x800000u;
        int shift = 14 - e;
        uint32_t h = mant >> shift, rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1)))
            h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((uint32_t)e << 10) | (mant >> 13), rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1)))
        h++;
    return (uint16_t)(sign | h);
}

FX_FN uint16_t fx_f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

/* Appends n floats encoded as dtype "F32", "F16" or "BF16" (little-endian). */
FX_FN void fx_add_f32(fx_st *b, const char *name, const char *dtype, const char *shape,
                       const float *v, size_t n)
{
    size_t es = strcmp(dtype, "F32") == 0 ? 4 : 2;
    uint8_t *raw = malloc(n * es + 1);
    if (!raw)
        abort();
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        if (es == 4)
            memcpy(&u, &v[i], 4);
        else
            u = strcmp(dtype, "F16") == 0 ? fx_f32_to_f16(v[i]) : fx_f32_to_bf16(v[i]);
        for (size_t k = 0; k < es; k++)
            raw[i * es + k] = (uint8_t)(u >> (8 * k));
    }
    fx_add_raw(b, name, dtype, shape, raw, n * es);
    free(raw);
}

/* Deterministic weight value: small multiples of 1/64, exact in F16/BF16. */
FX_FN float fx_val(const char *name, size_t i)
{
    uint32_t h = 2166136261u;
    for (const char *p = name; *p; p++)
        h = (h ^ (uint8_t)*p) * 16777619u;
    h = (h ^ (uint32_t)i) * 2654435761u;
    return (float)((int)((h >> 8) % 65) - 32) / 64.0f;
}

/* A [rows, cols] tensor (cols < 0: a 1-D [rows] tensor) of fx_val values,
 * but for element poison_at (if >= 0), which is poison_val. */
FX_FN void fx_add_fill_poisoned(fx_st *b, const char *name, const char *dtype, long rows,
                                long cols, long poison_at, float poison_val)
{
    char shape[64];
    size_t n = (size_t)rows * (size_t)(cols < 0 ? 1 : cols);
    float *v = malloc(n * sizeof(float) + 1);
    if (!v)
        abort();
    for (size_t i = 0; i < n; i++)
        v[i] = poison_at >= 0 && i == (size_t)poison_at ? poison_val : fx_val(name, i);
    if (cols < 0)
        snprintf(shape, sizeof shape, "[%ld]", rows);
    else
        snprintf(shape, sizeof shape, "[%ld, %ld]", rows, cols);
    fx_add_f32(b, name, dtype, shape, v, n);
    free(v);
}

/* A [rows, cols] tensor (cols < 0: a 1-D [rows] tensor) of fx_val values. */
FX_FN void fx_add_fill(fx_st *b, const char *name, const char *dtype, long rows, long cols)
{
    fx_add_fill_poisoned(b, name, dtype, rows, cols, -1, 0.0f);
}

/* Blob = 8-byte LE header size + header text + data; frees b. */
FX_FN uint8_t *fx_blob_raw(const char *hdr, const void *data, size_t dlen, size_t *len)
{
    size_t hl = strlen(hdr);
    uint8_t *p = malloc(8 + hl + dlen + 1);
    if (!p)
        abort();
    for (int k = 0; k < 8; k++)
        p[k] = (uint8_t)((uint64_t)hl >> (8 * k));
    memcpy(p + 8, hdr, hl);
    if (dlen)
        memcpy(p + 8 + hl, data, dlen);
    *len = 8 + hl + dlen;
    return p;
}

FX_FN uint8_t *fx_finish(fx_st *b, size_t *len)
{
    fx_hdr_cat(b, "}");
    uint8_t *p = fx_blob_raw(b->hdr, b->data, b->dlen, len);
    free(b->hdr);
    free(b->data);
    free(b);
    return p;
}

/* Weights for every tensor a plan expects (tables first, then layers). */
FX_FN uint8_t *fx_weights_for(const model_def *m, const char *dtype, size_t *len)
{
    fx_st *b = fx_new();
    for (int i = 0; i < m->n_tables; i++)
        fx_add_fill(b, m->tables[i].w.name, dtype, m->tables[i].rows, m->tables[i].dim);
    for (int i = 0; i < m->n_layers; i++)
        for (int j = 0; j < m->layers[i].n_w; j++) {
            const md_weight *w = &m->layers[i].w[j];
            int one_d = w->one_d;
            fx_add_fill(b, w->name, dtype, one_d ? w->cols : w->rows, one_d ? -1 : w->cols);
        }
    return fx_finish(b, len);
}

/* ---------------------------------------------------- the example model */

/* MODEL_FORMAT.md's example, verbatim. */
static const char FX_EXAMPLE_JSON[] =
    "{\n"
    "  \"format\": \"ikbo-model/1\",\n"
    "  \"inputs\": {\n"
    "    \"user\":      {\"dense\": 8, \"sparse\": [\"country\", \"lang\"],\n"
    "                  \"history\": {\"max_len\": 64, \"actions\": 4}},\n"
    "    \"candidate\": {\"dense\": 4, \"sparse\": [\"item\", \"author\"]}\n"
    "  },\n"
    "  \"tables\": {\n"
    "    \"item\":    {\"rows\": 5000, \"dim\": 32},\n"
    "    \"author\":  {\"rows\": 500,  \"dim\": 32},\n"
    "    \"country\": {\"rows\": 64,   \"dim\": 32},\n"
    "    \"lang\":    {\"rows\": 16,   \"dim\": 32}\n"
    "  },\n"
    "  \"layers\": [\n"
    "    {\"name\": \"u_country\", \"op\": \"embedding_bag\", \"input\": \"user.sparse.country\", "
    "\"table\": \"country\", \"pooling\": \"sum\"},\n"
    "    {\"name\": \"u_lang\",    \"op\": \"embedding_bag\", \"input\": \"user.sparse.lang\",    "
    "\"table\": \"lang\",    \"pooling\": \"mean\"},\n"
    "    {\"name\": \"u_dense1\",  \"op\": \"linear\", \"input\": \"user.dense\", \"out\": 64, "
    "\"activation\": \"relu\"},\n"
    "    {\"name\": \"u_dense2\",  \"op\": \"linear\", \"input\": \"u_dense1\",   \"out\": 64, "
    "\"activation\": \"none\"},\n"
    "    {\"name\": \"u_dense\",   \"op\": \"reshape\", \"input\": \"u_dense2\", \"tokens\": 2},\n"
    "    {\"name\": \"hist\",      \"op\": \"history_embedding\", \"input\": \"user.history\", "
    "\"table\": \"item\"},\n"
    "    {\"name\": \"hist_mean\", \"op\": \"mean_pool\", \"input\": \"hist\"},\n"
    "    {\"name\": \"e_user\",    \"op\": \"stack\", \"inputs\": [\"u_country\", \"u_lang\", "
    "\"u_dense\", \"hist_mean\"]},\n"
    "    {\"name\": \"c_item\",    \"op\": \"embedding_bag\", \"input\": \"candidate.sparse.item\",   "
    "\"table\": \"item\",   \"pooling\": \"sum\"},\n"
    "    {\"name\": \"c_author\",  \"op\": \"embedding_bag\", \"input\": "
    "\"candidate.sparse.author\", \"table\": \"author\", \"pooling\": \"sum\"},\n"
    "    {\"name\": \"c_dense1\",  \"op\": \"linear\", \"input\": \"candidate.dense\", \"out\": 64, "
    "\"activation\": \"relu\"},\n"
    "    {\"name\": \"c_dense\",   \"op\": \"reshape\", \"input\": \"c_dense1\", \"tokens\": 2},\n"
    "    {\"name\": \"x_cand\",    \"op\": \"stack\", \"inputs\": [\"c_item\", \"c_author\", "
    "\"c_dense\"]},\n"
    "    {\"name\": \"ta\",        \"op\": \"target_attention\", \"query\": \"x_cand\", "
    "\"history\": \"hist\", \"heads\": 2, \"head_dim\": 16},\n"
    "    {\"name\": \"e_cand\",    \"op\": \"stack\", \"inputs\": [\"x_cand\", \"ta\"]},\n"
    "    {\"name\": \"lce\",       \"op\": \"lce\", \"user\": \"e_user\", \"candidate\": "
    "\"e_cand\", \"out_tokens\": 6},\n"
    "    {\"name\": \"flat\",      \"op\": \"flatten\", \"input\": \"lce\"},\n"
    "    {\"name\": \"top1\",      \"op\": \"linear\", \"input\": \"flat\", \"out\": 64, "
    "\"activation\": \"relu\"},\n"
    "    {\"name\": \"logits\",    \"op\": \"linear\", \"input\": \"top1\", \"out\": 2, "
    "\"activation\": \"none\"}\n"
    "  ],\n"
    "  \"output\": {\"logits\": \"logits\", \"tasks\": [\"click\", \"like\"], \"score_weights\": "
    "[1.0, 0.5]}\n"
    "}\n";

/* The example's tensors, shapes worked out by hand from MODEL_FORMAT.md
 * (cols < 0: 1-D). */
typedef struct fx_spec {
    const char *name;
    long rows, cols;
} fx_spec;

static const fx_spec FX_EXAMPLE_SPECS[] = {
    {"tables.item", 5000, 32},  {"tables.author", 500, 32},  {"tables.country", 64, 32},
    {"tables.lang", 16, 32},    {"u_dense1.weight", 64, 8},  {"u_dense1.bias", 64, -1},
    {"u_dense2.weight", 64, 64}, {"u_dense2.bias", 64, -1},  {"hist.action", 4, 32},
    {"hist.position", 64, 32},  {"c_dense1.weight", 64, 4},  {"c_dense1.bias", 64, -1},
    {"ta.wq", 32, 32},          {"ta.wk", 32, 32},           {"ta.wv", 32, 32},
    {"ta.wo", 32, 32},          {"lce.w_user", 6, 5},        {"lce.w_cand", 6, 8},
    {"top1.weight", 64, 192},   {"top1.bias", 64, -1},       {"logits.weight", 2, 64},
    {"logits.bias", 2, -1},
};
#define FX_N_EXAMPLE_SPECS ((int)(sizeof FX_EXAMPLE_SPECS / sizeof FX_EXAMPLE_SPECS[0]))

/* Example weights with optional damage: `skip` is left out, `reshape` gets
 * shape [rows, cols] instead (cols < 0: 1-D), `extra` is added. */
typedef struct fx_opts {
    const char *dtype; /* default "F32" */
    const char *skip;
    const char *reshape;
    long rows, cols;
    const char *extra;
    const char *poison; /* this tensor's element 3 becomes poison_val */
    float poison_val;
} fx_opts;

FX_FN uint8_t *fx_example_weights(const fx_opts *o, size_t *len)
{
    fx_opts def = {0};
    if (!o)
        o = &def;
    fx_st *b = fx_new();
    for (int i = 0; i < FX_N_EXAMPLE_SPECS; i++) {
        const fx_spec *s = &FX_EXAMPLE_SPECS[i];
        if (o->skip && strcmp(o->skip, s->name) == 0)
            continue;
        long r = s->rows, c = s->cols;
        if (o->reshape && strcmp(o->reshape, s->name) == 0) {
            r = o->rows;
            c = o->cols;
        }
        if (o->poison && strcmp(o->poison, s->name) == 0) {
            fx_add_fill_poisoned(b, s->name, o->dtype ? o->dtype : "F32", r, c, 3, o->poison_val);
            continue;
        }
        fx_add_fill(b, s->name, o->dtype ? o->dtype : "F32", r, c);
    }
    if (o->extra)
        fx_add_fill(b, o->extra, o->dtype ? o->dtype : "F32", 2, 2);
    return fx_finish(b, len);
}

/* Returns a malloc'd copy of src with the single occurrence of `find`
 * replaced; NULL if find does not occur exactly once. */
FX_FN char *fx_replace(const char *src, const char *find, const char *repl)
{
    const char *p = strstr(src, find);
    if (!p || strstr(p + 1, find))
        return NULL;
    size_t a = (size_t)(p - src), fl = strlen(find), rl = strlen(repl), tl = strlen(p + fl);
    char *out = malloc(a + rl + tl + 1);
    if (!out)
        abort();
    memcpy(out, src, a);
    memcpy(out + a, repl, rl);
    memcpy(out + a + rl, p + fl, tl + 1);
    return out;
}

/* ----------------------------------------------------- consistency check */

/* Shape of a layer input as the planner must have seen it. */
FX_FN int fx_ref_shape(const model_def *m, md_ref r, int self, enum md_domain *dom,
                        enum md_kind *kind, int *tokens, int *dim)
{
    switch (r.src) {
    case MD_SRC_LAYER:
        if (r.index < 0 || r.index >= self)
            return -1;
        *dom = m->layers[r.index].domain;
        *kind = m->layers[r.index].kind;
        *tokens = m->layers[r.index].tokens;
        *dim = m->layers[r.index].dim;
        return 0;
    case MD_SRC_USER_DENSE:
    case MD_SRC_CAND_DENSE:
        *dom = r.src == MD_SRC_USER_DENSE ? MD_USER : MD_CAND;
        *dim = r.src == MD_SRC_USER_DENSE ? m->user_dense : m->cand_dense;
        *kind = MD_VEC;
        *tokens = 1;
        return *dim > 0 && r.index == 0 ? 0 : -1;
    default:
        return -1;
    }
}

#define FX_REQ(c, what)                                                                       \
    do {                                                                                      \
        if (!(c)) {                                                                           \
            snprintf(why, whyn, "layer %d (%s): %s", i, l ? l->name : "-", what);             \
            return -1;                                                                        \
        }                                                                                     \
    } while (0)

FX_FN int fx_wok(const md_weight *w, int rows, int cols, int need_data)
{
    return w->name && w->rows == rows && w->cols == cols && (!need_data || w->data);
}

/* Weight j of l is "<layer>.<param>" [rows, cols], 2-D; rows < 0: a 1-D
 * tensor [cols] (held as [1, cols]). */
FX_FN int fx_w(const md_layer *l, int j, const char *param, int rows, int cols, int need_data)
{
    if (j >= l->n_w)
        return 0;
    const md_weight *w = &l->w[j];
    size_t ln = strlen(l->name);
    int one_d = rows < 0;
    return fx_wok(w, one_d ? 1 : rows, cols, need_data) && strncmp(w->name, l->name, ln) == 0 &&
           w->name[ln] == '.' && strcmp(w->name + ln + 1, param) == 0 && w->one_d == one_d;
}

/* An attention layer's wq, wk, wv [hd, D] and wo [D, hd]. */
FX_FN int fx_att_w(const md_layer *l, int hd, int need_data)
{
    return fx_w(l, 0, "wq", hd, l->dim, need_data) && fx_w(l, 1, "wk", hd, l->dim, need_data) &&
           fx_w(l, 2, "wv", hd, l->dim, need_data) && fx_w(l, 3, "wo", l->dim, hd, need_data);
}

/* The shapes of a layer's inputs, as fx_ref_shape gives them; the most
 * inputs an op takes: dot_interaction's 256 tokens as 256 vectors. */
#define FX_MAX_IN 256
typedef struct fx_in {
    enum md_domain d[FX_MAX_IN];
    enum md_kind k[FX_MAX_IN];
    int tk[FX_MAX_IN], dm[FX_MAX_IN];
} fx_in;

/* Output equal to input 0's shape (activation, layer_norm). */
#define FX_SAME_AS_IN0 (l->kind == s->k[0] && l->tokens == s->tk[0] && l->dim == s->dm[0])

/* The ops of the first format (MODEL_FORMAT.md "Ops"), linear and add as
 * extended on 2026-12-01. 1: not one of these ops. */
FX_FN int fx_check_base_op(const md_layer *l, int i, const fx_in *s, int need_data, char *why,
                           size_t whyn)
{
    switch (l->op) {
    case MD_MEAN_POOL:
        FX_REQ(l->n_in == 1 && s->k[0] == MD_JAGGED && l->kind == MD_VEC && l->dim == s->dm[0] &&
                   l->n_w == 0,
               "mean_pool");
        return 0;
    case MD_LINEAR:
        /* The last dim of a vector, of each token, or of each event. */
        FX_REQ(l->n_in == 1 && l->kind == s->k[0] && l->tokens == s->tk[0] && l->n_w == 2 &&
                   fx_w(l, 0, "weight", l->dim, s->dm[0], need_data) &&
                   fx_w(l, 1, "bias", -1, l->dim, need_data) && l->act >= BK_ACT_NONE &&
                   l->act < BK_ACT_COUNT,
               "linear");
        return 0;
    case MD_RESHAPE:
        FX_REQ(l->n_in == 1 && s->k[0] == MD_VEC && l->kind == MD_TOKENS &&
                   (long long)l->tokens * l->dim == s->dm[0] && l->n_w == 0,
               "reshape");
        return 0;
    case MD_FLATTEN:
        FX_REQ(l->n_in == 1 && s->k[0] == MD_TOKENS && l->kind == MD_VEC &&
                   (long long)l->dim == (long long)s->tk[0] * s->dm[0] && l->n_w == 0,
               "flatten");
        return 0;
    case MD_STACK: {
        long long K = 0;
        for (int j = 0; j < l->n_in; j++) {
            FX_REQ(s->k[j] != MD_JAGGED && s->dm[j] == l->dim && s->d[j] == l->domain,
                   "stack input");
            K += s->tk[j];
        }
        FX_REQ(l->kind == MD_TOKENS && K == l->tokens && l->n_w == 0, "stack");
        return 0;
    }
    case MD_TARGET_ATTENTION: {
        int hd = l->heads * l->head_dim;
        FX_REQ(l->n_in == 2 && s->d[0] == MD_CAND && s->k[0] != MD_JAGGED && s->d[1] == MD_USER &&
                   s->k[1] == MD_JAGGED && s->dm[0] == s->dm[1] && l->kind == MD_TOKENS &&
                   l->tokens == s->tk[0] && l->dim == s->dm[0] && l->heads >= 1 &&
                   l->head_dim >= 1 && l->n_w == (l->shared >= 0 ? 0 : 4) && l->shared < i,
               "attention");
        if (l->shared >= 0)
            return 0; /* the shared self_attention's weights (checked by the loader's test) */
        FX_REQ(fx_att_w(l, hd, need_data), "attention weights");
        return 0;
    }
    case MD_LCE:
        FX_REQ(l->n_in == 2 && s->d[0] == MD_USER && s->d[1] == MD_CAND && s->k[0] != MD_JAGGED &&
                   s->k[1] != MD_JAGGED && s->dm[0] == s->dm[1] && l->kind == MD_TOKENS &&
                   l->dim == s->dm[0] && l->n_w == 2 &&
                   fx_w(l, 0, "w_user", l->tokens, s->tk[0], need_data) &&
                   fx_w(l, 1, "w_cand", l->tokens, s->tk[1], need_data),
               "lce");
        return 0;
    case MD_ADD:
    case MD_MUL:
        /* Equal shapes; jagged operands are per-event rows of one user. */
        FX_REQ(l->n_in == 2 && s->k[0] == s->k[1] && s->tk[0] == s->tk[1] &&
                   s->dm[0] == s->dm[1] &&
                   (s->k[0] != MD_JAGGED || (s->d[0] == MD_USER && s->d[1] == MD_USER)) &&
                   FX_SAME_AS_IN0 && l->n_w == 0,
               l->op == MD_ADD ? "add" : "mul");
        return 0;
    default:
        return 1;
    }
}

/* The ops added on 2026-12-01, as semantics.md pins them down. */
FX_FN int fx_check_new_op(const md_layer *l, int i, const fx_in *s, int need_data, char *why,
                          size_t whyn)
{
    switch (l->op) {
    case MD_ACTIVATION:
        FX_REQ(l->n_in == 1 && FX_SAME_AS_IN0 && l->n_w == 0 && l->act > BK_ACT_NONE &&
                   l->act < BK_ACT_COUNT,
               "activation");
        return 0;
    case MD_LAYER_NORM:
        FX_REQ(l->n_in == 1 && FX_SAME_AS_IN0 && l->eps > 0 && l->eps <= 3.4e38f &&
                   l->n_w == 2 && fx_w(l, 0, "weight", -1, l->dim, need_data) &&
                   fx_w(l, 1, "bias", -1, l->dim, need_data),
               "layer_norm");
        return 0;
    case MD_CONCAT: {
        long long F = 0;
        for (int j = 0; j < l->n_in; j++) {
            FX_REQ(s->k[j] == MD_VEC && s->d[j] == l->domain, "concat input");
            F += s->dm[j];
        }
        FX_REQ(l->kind == MD_VEC && F == l->dim && l->n_w == 0, "concat");
        return 0;
    }
    case MD_TOKEN_LINEAR:
        /* A vector [D] counts as K = 1. */
        FX_REQ(l->n_in == 1 && s->k[0] != MD_JAGGED && l->kind == MD_TOKENS &&
                   l->dim == s->dm[0] && l->n_w == 1 &&
                   fx_w(l, 0, "weight", l->tokens, s->tk[0], need_data),
               "token_linear");
        return 0;
    case MD_DOT_INTERACTION: {
        long long K = 0;
        for (int j = 0; j < l->n_in; j++) {
            FX_REQ(s->k[j] != MD_JAGGED && s->dm[j] == s->dm[0], "dot_interaction input");
            K += s->tk[j];
        }
        long long P = l->self ? K * (K + 1) / 2 : K * (K - 1) / 2;
        FX_REQ(K <= 256 && (l->self ? K >= 1 : K >= 2) && (l->self == 0 || l->self == 1) &&
                   l->kind == MD_VEC && l->dim == P && l->n_w == 0,
               "dot_interaction");
        return 0;
    }
    case MD_CROSS: {
        int F = l->dim, r = l->rank;
        FX_REQ(l->n_in == 2 && s->k[0] == MD_VEC && s->k[1] == MD_VEC && s->dm[0] == F &&
                   s->dm[1] == F && s->d[0] == s->d[1] && l->kind == MD_VEC && r >= 0,
               "cross");
        FX_REQ(r == 0 ? l->n_w == 2 && fx_w(l, 0, "weight", F, F, need_data) &&
                            fx_w(l, 1, "bias", -1, F, need_data)
                      : l->n_w == 3 && fx_w(l, 0, "u", F, r, need_data) &&
                            fx_w(l, 1, "v", r, F, need_data) &&
                            fx_w(l, 2, "bias", -1, F, need_data),
               "cross weights");
        return 0;
    }
    case MD_MIXTURE: {
        int E = l->n_in - 1;
        FX_REQ(E >= 1 && E <= 64 && s->k[E] == MD_VEC && s->dm[E] == E && l->kind == MD_VEC &&
                   l->n_w == 0,
               "mixture");
        for (int j = 0; j <= E; j++)
            FX_REQ(s->d[j] == l->domain && (j == E || (s->k[j] == MD_VEC && s->dm[j] == l->dim)),
                   "mixture input");
        return 0;
    }
    case MD_SELF_ATTENTION: {
        int hd = l->heads * l->head_dim;
        FX_REQ(l->n_in == 1 && s->d[0] == MD_USER && s->k[0] == MD_JAGGED &&
                   l->kind == MD_JAGGED && l->domain == MD_USER && l->dim == s->dm[0] &&
                   l->heads >= 1 && l->head_dim >= 1 && l->n_w == 4 &&
                   (l->att_kind == BK_ATT_SOFTMAX || l->att_kind == BK_ATT_SILU),
               "self_attention");
        FX_REQ(fx_att_w(l, hd, need_data), "self_attention weights");
        return 0;
    }
    case MD_DIN_ATTENTION:
        FX_REQ(l->n_in == 2 && s->d[0] == MD_CAND && s->k[0] == MD_VEC && s->d[1] == MD_USER &&
                   s->k[1] == MD_JAGGED && s->dm[0] == s->dm[1] && l->kind == MD_VEC &&
                   l->dim == s->dm[0] && l->hidden >= 1 && l->n_w == 4 &&
                   fx_w(l, 0, "w1", l->hidden, 4 * l->dim, need_data) &&
                   fx_w(l, 1, "b1", -1, l->hidden, need_data) &&
                   fx_w(l, 2, "w2", 1, l->hidden, need_data) && fx_w(l, 3, "b2", -1, 1, need_data),
               "din_attention");
        return 0;
    case MD_POOL:
        FX_REQ(l->n_in == 1 && (s->k[0] == MD_TOKENS || s->k[0] == MD_JAGGED) &&
                   l->kind == MD_VEC && l->dim == s->dm[0] && l->n_w == 0 &&
                   (l->pooling == BK_POOL_SUM || l->pooling == BK_POOL_MEAN ||
                    l->pooling == BK_POOL_MAX || l->pooling == BK_POOL_LAST),
               "pool");
        return 0;
    default:
        FX_REQ(0, "op");
        return -1;
    }
}

/* The table ops (no layer inputs). */
FX_FN int fx_check_table_op(const model_def *m, const md_layer *l, int i, int need_data,
                            char *why, size_t whyn)
{
    FX_REQ(l->n_in == 1 && l->table >= 0 && l->table < m->n_tables, "table ref");
    FX_REQ(l->dim == m->tables[l->table].dim &&
               l->kind == (l->op == MD_EMBEDDING_BAG ? MD_VEC : MD_JAGGED),
           "table shape");
    if (l->op == MD_EMBEDDING_BAG) {
        md_ref r = l->in[0];
        FX_REQ((r.src == MD_SRC_USER_SPARSE && r.index >= 0 && r.index < m->n_user_sparse &&
                l->domain == MD_USER) ||
                   (r.src == MD_SRC_CAND_SPARSE && r.index >= 0 && r.index < m->n_cand_sparse &&
                    l->domain == MD_CAND),
               "sparse ref");
        FX_REQ(l->n_w == 0 && (l->pooling == BK_POOL_SUM || l->pooling == BK_POOL_MEAN), "n_w");
    } else {
        FX_REQ(m->has_history && l->in[0].src == MD_SRC_USER_HISTORY && l->domain == MD_USER &&
                   l->n_w == 2 && fx_w(l, 0, "action", m->hist_actions, l->dim, need_data) &&
                   fx_w(l, 1, "position", m->hist_max_len, l->dim, need_data),
               "history");
    }
    return 0;
}

/* One layer, given the layers before it. */
FX_FN int fx_check_layer(const model_def *m, int i, int need_data, char *why, size_t whyn)
{
    const md_layer *l = &m->layers[i];
    fx_in s;
    FX_REQ(l->name && l->n_in >= 1 && l->in && l->n_w >= 0 && l->n_w <= MD_MAX_WEIGHTS,
           "basics");
    FX_REQ(l->dim >= 1 && l->tokens >= 1 && (l->kind == MD_TOKENS || l->tokens == 1),
           "shape");
    FX_REQ((long long)l->tokens * l->dim <= INT_MAX, "width");
    for (int w = 0; w < l->n_w; w++)
        FX_REQ(l->w[w].name && l->w[w].rows >= 1 && l->w[w].cols >= 1 &&
                   (!need_data || l->w[w].data),
               "weight");
    if (l->op == MD_EMBEDDING_BAG || l->op == MD_HISTORY_EMBEDDING)
        return fx_check_table_op(m, l, i, need_data, why, whyn);
    FX_REQ(l->n_in <= FX_MAX_IN, "too many inputs");
    int any_c = 0, any_u = 0;
    for (int j = 0; j < l->n_in; j++) {
        FX_REQ(fx_ref_shape(m, l->in[j], i, &s.d[j], &s.k[j], &s.tk[j], &s.dm[j]) == 0,
               "input ref");
        if (s.d[j] == MD_CAND)
            any_c = 1;
        else
            any_u = 1;
    }
    FX_REQ(l->domain == (any_c ? MD_CAND : MD_USER), "domain rule");
    FX_REQ(!(any_c && any_u) || l->op == MD_LCE || l->op == MD_TARGET_ATTENTION ||
               l->op == MD_DIN_ATTENTION || l->op == MD_ADD || l->op == MD_MUL || l->op == MD_DOT_INTERACTION,
           "mixing");
    int rc = fx_check_base_op(l, i, &s, need_data, why, whyn);
    return rc == 1 ? fx_check_new_op(l, i, &s, need_data, why, whyn) : rc;
}

/* Everything the executor relies on; 0 if consistent, else -1 and why. */
FX_FN int fx_check_model(const model_def *m, int need_data, char *why, size_t whyn)
{
    int i = -1;
    const md_layer *l = NULL;
    FX_REQ(m && m->dir && m->n_layers >= 1 && m->layers, "model header");
    FX_REQ(m->user_dense >= 0 && m->cand_dense >= 0, "dense");
    FX_REQ(!m->has_history || (m->hist_max_len >= 1 && m->hist_actions >= 1), "history");
    for (int t = 0; t < m->n_tables; t++)
        FX_REQ(m->tables[t].name && m->tables[t].rows >= 1 && m->tables[t].dim >= 1 &&
                   fx_wok(&m->tables[t].w, m->tables[t].rows, m->tables[t].dim, need_data),
               "table");
    for (i = 0; i < m->n_layers; i++)
        if (fx_check_layer(m, i, need_data, why, whyn))
            return -1;
    i = -1;
    FX_REQ(m->logits_layer >= 0 && m->logits_layer < m->n_layers, "logits index");
    const md_layer *lg = &m->layers[m->logits_layer];
    FX_REQ(lg->domain == MD_CAND && lg->kind == MD_VEC && lg->dim == m->n_tasks &&
               m->n_tasks >= 1 && m->tasks && m->score_weights,
           "logits");
    return 0;
}

#endif
