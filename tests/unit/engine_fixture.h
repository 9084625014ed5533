/* engine_fixture.h - the small every-op model test_engine.c and
 * test_batcher.c score: its model.json, its tensors, and writing both (F32
 * weights from a fixed seed) into a fresh directory under /tmp.
 *
 * Header-only, libc only (tests/alloc/test_alloc_fail.c writes it too):
 * ef_write_model returns 0 or -1; ef_write_mlp2_model writes the variant
 * whose E_cand has a part the fold computes with mlp2, ef_write_upart_model
 * the one whose E_user has a part the fold composes into the user term.
 * Single-threaded: call it from a setup, ef_remove_model from its teardown.
 */
#ifndef IKBO_ENGINE_FIXTURE_H
#define IKBO_ENGINE_FIXTURE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *EF_MODEL_JSON =
    "{\"format\": \"ikbo-model/1\","
    " \"inputs\": {\"user\": {\"dense\": 6, \"sparse\": [\"country\"],"
    "                        \"history\": {\"max_len\": 5, \"actions\": 3}},"
    "             \"candidate\": {\"dense\": 3, \"sparse\": [\"item\"]}},"
    " \"tables\": {\"item\": {\"rows\": 50, \"dim\": 8}, \"country\": {\"rows\": 7, \"dim\": 8}},"
    " \"layers\": ["
    "  {\"name\": \"u_country\", \"op\": \"embedding_bag\", \"input\": \"user.sparse.country\","
    "   \"table\": \"country\", \"pooling\": \"mean\"},"
    "  {\"name\": \"u_d1\", \"op\": \"linear\", \"input\": \"user.dense\", \"out\": 16, \"activation\": \"relu\"},"
    "  {\"name\": \"u_d\", \"op\": \"reshape\", \"input\": \"u_d1\", \"tokens\": 2},"
    "  {\"name\": \"hist\", \"op\": \"history_embedding\", \"input\": \"user.history\", \"table\": \"item\"},"
    "  {\"name\": \"hist_mean\", \"op\": \"mean_pool\", \"input\": \"hist\"},"
    "  {\"name\": \"e_user\", \"op\": \"stack\", \"inputs\": [\"u_country\", \"u_d\", \"hist_mean\"]},"
    "  {\"name\": \"c_item\", \"op\": \"embedding_bag\", \"input\": \"candidate.sparse.item\","
    "   \"table\": \"item\", \"pooling\": \"sum\"},"
    "  {\"name\": \"c_d1\", \"op\": \"linear\", \"input\": \"candidate.dense\", \"out\": 8, \"activation\": \"sigmoid\"},"
    "  {\"name\": \"x_cand\", \"op\": \"stack\", \"inputs\": [\"c_item\", \"c_d1\"]},"
    "  {\"name\": \"ta\", \"op\": \"target_attention\", \"query\": \"x_cand\", \"history\": \"hist\","
    "   \"heads\": 2, \"head_dim\": 4},"
    "  {\"name\": \"e_cand\", \"op\": \"stack\", \"inputs\": [\"x_cand\", \"ta\"]},"
    "  {\"name\": \"lce\", \"op\": \"lce\", \"user\": \"e_user\", \"candidate\": \"e_cand\", \"out_tokens\": 3},"
    "  {\"name\": \"flat\", \"op\": \"flatten\", \"input\": \"lce\"},"
    "  {\"name\": \"top1\", \"op\": \"linear\", \"input\": \"flat\", \"out\": 8, \"activation\": \"relu\"},"
    "  {\"name\": \"u_vec\", \"op\": \"linear\", \"input\": \"user.dense\", \"out\": 8},"
    "  {\"name\": \"mix\", \"op\": \"add\", \"inputs\": [\"u_vec\", \"top1\"]},"
    "  {\"name\": \"logits\", \"op\": \"linear\", \"input\": \"mix\", \"out\": 2}"
    " ],"
    " \"output\": {\"logits\": \"logits\", \"tasks\": [\"click\", \"like\"], \"score_weights\": [1.0, 0.5]}}";

typedef struct ef_tensor {
    const char *name;
    int rows, cols; /* rows 0 = 1-D [cols] */
} ef_tensor;

static const ef_tensor EF_TENSORS[] = {
    {"tables.item", 50, 8},  {"tables.country", 7, 8}, {"u_d1.weight", 16, 6},
    {"u_d1.bias", 0, 16},    {"hist.action", 3, 8},    {"hist.position", 5, 8},
    {"c_d1.weight", 8, 3},   {"c_d1.bias", 0, 8},      {"ta.wq", 8, 8},
    {"ta.wk", 8, 8},         {"ta.wv", 8, 8},          {"ta.wo", 8, 8},
    {"lce.w_user", 3, 4},    {"lce.w_cand", 3, 4},     {"top1.weight", 8, 24},
    {"top1.bias", 0, 8},     {"u_vec.weight", 8, 6},   {"u_vec.bias", 0, 8},
    {"logits.weight", 2, 8}, {"logits.bias", 0, 2},
};
#define EF_N_TENSORS (sizeof(EF_TENSORS) / sizeof(EF_TENSORS[0]))

static inline int ef_write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int rc = fwrite(data, 1, n, f) == n ? 0 : -1;
    return fclose(f) || rc ? -1 : 0;
}

/* Writes the model into /tmp/ikbo_test_<tag>_<pid> (dir, of dir_n bytes):
 * model.json and weights.safetensors, weights uniform in [-0.5, 0.5) from
 * seed 42. */
/* ef_write_model with another model.json and tensor list (a variant). */
static inline int ef_write_model_as(const char *tag, const char *json, const ef_tensor *tensors,
                             size_t n_tensors, char *dir, size_t dir_n)
{
    snprintf(dir, dir_n, "/tmp/ikbo_test_%s_%d", tag, (int)getpid());
    mkdir(dir, 0755);
    char path[512];
    snprintf(path, sizeof(path), "%s/model.json", dir);
    if (ef_write_file(path, json, strlen(json))) return -1;
    char header[8192];
    size_t hl = 0, off = 0;
    hl += (size_t)snprintf(header + hl, sizeof(header) - hl, "{");
    for (size_t i = 0; i < n_tensors; i++) {
        const ef_tensor *t = &tensors[i];
        size_t n = (size_t)(t->rows ? t->rows : 1) * (size_t)t->cols;
        char shape[64];
        if (t->rows) snprintf(shape, sizeof(shape), "[%d, %d]", t->rows, t->cols);
        else snprintf(shape, sizeof(shape), "[%d]", t->cols);
        hl += (size_t)snprintf(header + hl, sizeof(header) - hl,
                               "%s\"%s\": {\"dtype\": \"F32\", \"shape\": %s, \"data_offsets\": [%zu, %zu]}",
                               i ? ", " : "", t->name, shape, off, off + n * 4);
        off += n * 4;
    }
    hl += (size_t)snprintf(header + hl, sizeof(header) - hl, "}");
    size_t total = 8 + hl + off;
    uint8_t *buf = malloc(total);
    if (!buf) return -1;
    uint64_t h64 = hl;
    memcpy(buf, &h64, 8); /* little-endian host */
    memcpy(buf + 8, header, hl);
    uint64_t s = 42;
    for (size_t i = 0; i < off / 4; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        float v = (float)(((double)(s >> 11) / (double)(1ULL << 53) * 2.0 - 1.0) * 0.5);
        memcpy(buf + 8 + hl + 4 * i, &v, 4); /* the header's length may leave it unaligned */
    }
    snprintf(path, sizeof(path), "%s/weights.safetensors", dir);
    int rc = ef_write_file(path, buf, total);
    free(buf);
    return rc;
}

static inline int ef_write_model(const char *tag, char *dir, size_t dir_n)
{
    return ef_write_model_as(tag, EF_MODEL_JSON, EF_TENSORS, EF_N_TENSORS, dir, dir_n);
}

/* src with `from` replaced by `to` (the first one); malloc'd, NULL when src
 * lacks it or memory runs out. */
static inline char *ef_replace(const char *src, const char *from, const char *to)
{
    const char *at = strstr(src, from);
    if (!at) return NULL;
    size_t n = strlen(src) - strlen(from) + strlen(to) + 1;
    char *s = malloc(n);
    if (s) snprintf(s, n, "%.*s%s%s", (int)(at - src), src, to, at + strlen(from));
    return s;
}

/* The fixture with an mlp2 part for the fold (engine/fold.h): c_rest =
 * reshape(c_r1), c_r1 a ReLU linear over candidate.dense (3 inputs, 16
 * outputs), in e_cand between x_cand and ta (so the other parts' tokens
 * are 0, 1, 4, 5), and the lce's M 5 (the rule: 2*6*8*8 = 768 < 2*5*8*14 =
 * 1120). Malloc'd, NULL on out of memory. */
static inline char *ef_mlp2_json(void)
{
    char *a = ef_replace(EF_MODEL_JSON, "{\"name\": \"x_cand\", \"op\": \"stack\"",
                         "{\"name\": \"c_r1\", \"op\": \"linear\", \"input\": \"candidate.dense\", "
                         "\"out\": 16, \"activation\": \"relu\"}, {\"name\": \"c_rest\", \"op\": "
                         "\"reshape\", \"input\": \"c_r1\", \"tokens\": 2}, {\"name\": \"x_cand\", "
                         "\"op\": \"stack\"");
    char *b = a ? ef_replace(a, "[\"x_cand\", \"ta\"]}", "[\"x_cand\", \"c_rest\", \"ta\"]}") : NULL;
    char *c = b ? ef_replace(b, "\"out_tokens\": 3}", "\"out_tokens\": 5}") : NULL;
    free(a);
    free(b);
    return c;
}

/* Its tensors into out (EF_N_TENSORS + 2 entries); returns the count. */
static inline size_t ef_mlp2_tensors(ef_tensor *out)
{
    size_t n = 0;
    for (size_t i = 0; i < EF_N_TENSORS; i++) {
        ef_tensor t = EF_TENSORS[i];
        if (!strcmp(t.name, "lce.w_user")) t.rows = 5;
        if (!strcmp(t.name, "lce.w_cand")) t.rows = 5, t.cols = 6;
        if (!strcmp(t.name, "top1.weight")) t.cols = 40;
        out[n++] = t;
    }
    out[n++] = (ef_tensor){"c_r1.weight", 16, 3};
    out[n++] = (ef_tensor){"c_r1.bias", 0, 16};
    return n;
}

/* ef_write_model for the mlp2 variant. */
static inline int ef_write_mlp2_model(const char *tag, char *dir, size_t dir_n)
{
    ef_tensor t[EF_N_TENSORS + 2];
    char *json = ef_mlp2_json();
    int rc = json ? ef_write_model_as(tag, json, t, ef_mlp2_tensors(t), dir, dir_n) : -1;
    free(json);
    return rc;
}

/* The fixture with u_d1 a linear with no activation: e_user's part u_d (2
 * tokens of 8 = 16 columns of the folded user weight) over user.dense (6
 * wide), which the fold composes into the user term (engine/fold.h).
 * Malloc'd, NULL on out of memory. */
#define EF_UD1_RELU "\"input\": \"user.dense\", \"out\": 16, \"activation\": \"relu\"}"
#define EF_UD1_NONE "\"input\": \"user.dense\", \"out\": 16, \"activation\": \"none\"}"
static inline char *ef_upart_json(void) { return ef_replace(EF_MODEL_JSON, EF_UD1_RELU, EF_UD1_NONE); }

static inline int ef_write_upart_model(const char *tag, char *dir, size_t dir_n)
{
    char *json = ef_upart_json();
    int rc = json ? ef_write_model_as(tag, json, EF_TENSORS, EF_N_TENSORS, dir, dir_n) : -1;
    free(json);
    return rc;
}

static inline void ef_remove_model(const char *dir)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/model.json", dir);
    unlink(path);
    snprintf(path, sizeof(path), "%s/weights.safetensors", dir);
    unlink(path);
    rmdir(dir);
}

#endif
