/* fuzz_loader.c - fuzz model_def_parse with hostile model.json + safetensors.
 *
 * Why this exists: model files are untrusted input to a long-running server;
 * the loader must refuse anything malformed with one clean line and never
 * crash, read out of bounds or leak. Two ways to run:
 *
 * - libFuzzer: clang -DLIBFUZZER -fsanitize=fuzzer,address,undefined ...
 *   Input = model.json bytes, a NUL byte, then weights.safetensors bytes (no
 *   NUL: everything is model.json, no weights). `fuzz_loader --seed-out F`
 *   from the standalone build writes a valid seed input for the corpus.
 * - standalone (make test): a seeded, deterministic mutation loop over a
 *   small valid model exercising every op - byte flips, truncations, span
 *   deletes/duplicates, token swaps from the model's own vocabulary, numeric
 *   edge values, header-size and offset edits. `fuzz_loader [iters] [seed]`,
 *   default 20000 iterations, seed 1; a few seconds.
 *
 * Every input is also checked for: an accepted model is internally
 * consistent (fx_check_model); a refusal is one line starting with the file;
 * model_def_plan on the same JSON agrees with model_def_parse.
 */
#define _POSIX_C_SOURCE 200809L /* strnlen */

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model.h"
#include "tests/unit/loader_fixture.h"

#define FZ_DIR "fz/1"
#define FZ_JFILE FZ_DIR "/model.json: "
#define FZ_WFILE FZ_DIR "/weights.safetensors: "

static unsigned long n_ok, n_json_err, n_st_err;

static void die(const char *what, const char *msg)
{
    fprintf(stderr, "fuzz_loader: %s: %s\n", what, msg);
    abort();
}

static void check_msg(const bk_err *e)
{
    size_t n = strnlen(e->msg, sizeof e->msg);
    if (n == sizeof e->msg)
        die("message not terminated", "");
    if (strncmp(e->msg, FZ_JFILE, strlen(FZ_JFILE)) != 0 &&
        strncmp(e->msg, FZ_WFILE, strlen(FZ_WFILE)) != 0)
        die("message does not start with the file", e->msg);
    if (n <= strlen(FZ_WFILE))
        die("empty message", e->msg);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)e->msg[i] < 0x20)
            die("control byte in message", e->msg);
}

static void run_one(const char *json, size_t jlen, const uint8_t *st, size_t slen)
{
    bk_err e, pe;
    model_def *m = NULL, *p = NULL;
    char why[256];
    memset(&e, 0, sizeof e);
    memset(&pe, 0, sizeof pe);
    int rc = model_def_parse(FZ_DIR, json, jlen, st, slen, &m, &e);
    int prc = model_def_plan(FZ_DIR, json, jlen, &p, &pe);
    if (rc == 0) {
        n_ok++;
        if (fx_check_model(m, 1, why, sizeof why))
            die("inconsistent model accepted", why);
        if (prc != 0)
            die("parse accepted what plan refused", pe.msg);
        model_def_free(m);
    } else {
        if (m)
            die("out set on failure", e.msg);
        check_msg(&e);
        if (strncmp(e.msg, FZ_JFILE, strlen(FZ_JFILE)) == 0) {
            n_json_err++;
            if (prc == 0 || strcmp(pe.msg, e.msg) != 0)
                die("plan and parse disagree on model.json", e.msg);
        } else {
            n_st_err++;
            if (prc != 0)
                die("plan refused but parse blamed the weights", pe.msg);
        }
    }
    if (prc == 0) {
        if (fx_check_model(p, 0, why, sizeof why))
            die("inconsistent plan", why);
        model_def_free(p);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    size_t jlen = nul ? (size_t)(nul - data) : size;
    const uint8_t *st = nul ? nul + 1 : data + size;
    size_t slen = nul ? size - jlen - 1 : 0;
    run_one((const char *)data, jlen, st, slen);
    return 0;
}

/* ------------------------------------------------------------ the seed */

static const char SEED_JSON[] =
    "{\"format\":\"ikbo-model/1\",\"name\":\"fz\",\"description\":\"fuzz seed\","
    "\"serving\":{\"max_batch_candidates\":64,\"max_batch_users\":8,\"max_queue_delay_us\":100,"
    "\"instances\":1,\"mode\":\"ikbo\",\"device\":\"cuda:0\"},"
    "\"inputs\":{\"user\":{\"dense\":4,\"sparse\":[\"a\"],\"history\":{\"max_len\":3,"
    "\"actions\":2}},\"candidate\":{\"dense\":4,\"sparse\":[\"b\"]}},"
    "\"tables\":{\"ta\":{\"rows\":3,\"dim\":4},\"tb\":{\"rows\":2,\"dim\":4}},"
    "\"layers\":["
    "{\"name\":\"ue\",\"op\":\"embedding_bag\",\"input\":\"user.sparse.a\",\"table\":\"ta\","
    "\"pooling\":\"sum\"},"
    "{\"name\":\"ud\",\"op\":\"linear\",\"input\":\"user.dense\",\"out\":8,\"activation\":\"relu\"},"
    "{\"name\":\"ur\",\"op\":\"reshape\",\"input\":\"ud\",\"tokens\":2},"
    "{\"name\":\"h\",\"op\":\"history_embedding\",\"input\":\"user.history\",\"table\":\"ta\"},"
    "{\"name\":\"hm\",\"op\":\"mean_pool\",\"input\":\"h\"},"
    "{\"name\":\"us\",\"op\":\"stack\",\"inputs\":[\"ue\",\"ur\",\"hm\"]},"
    "{\"name\":\"ce\",\"op\":\"embedding_bag\",\"input\":\"candidate.sparse.b\",\"table\":\"tb\","
    "\"pooling\":\"mean\"},"
    "{\"name\":\"cd\",\"op\":\"linear\",\"input\":\"candidate.dense\",\"out\":4},"
    "{\"name\":\"cx\",\"op\":\"add\",\"inputs\":[\"ce\",\"hm\"]},"
    "{\"name\":\"cy\",\"op\":\"add\",\"a\":\"cx\",\"b\":\"cd\"},"
    "{\"name\":\"cs\",\"op\":\"stack\",\"inputs\":[\"ce\",\"cy\"]},"
    "{\"name\":\"at\",\"op\":\"target_attention\",\"query\":\"cs\",\"history\":\"h\","
    "\"heads\":2,\"head_dim\":2},"
    "{\"name\":\"l\",\"op\":\"lce\",\"user\":\"us\",\"candidate\":\"at\",\"out_tokens\":2},"
    "{\"name\":\"f\",\"op\":\"flatten\",\"input\":\"l\"},"
    "{\"name\":\"o\",\"op\":\"linear\",\"input\":\"f\",\"out\":2,\"activation\":\"sigmoid\"}"
    "],"
    "\"output\":{\"logits\":\"o\",\"tasks\":[\"x\",\"y\"],\"score_weights\":[1,0.5]}}";

/* Weights for the seed, dtypes rotating F32/F16/BF16, plus metadata. */
static uint8_t *seed_weights(size_t *len)
{
    static const char *const dts[] = {"F32", "F16", "BF16"};
    bk_err e = {{0}};
    model_def *m = NULL;
    if (model_def_plan(FZ_DIR, SEED_JSON, strlen(SEED_JSON), &m, &e))
        die("seed does not plan", e.msg);
    fx_st *b = fx_new();
    fx_hdr_cat(b, "\"__metadata__\":{\"format\":\"pt\"}");
    int k = 0;
    for (int i = 0; i < m->n_tables; i++, k++)
        fx_add_fill(b, m->tables[i].w.name, dts[k % 3], m->tables[i].rows, m->tables[i].dim);
    for (int i = 0; i < m->n_layers; i++)
        for (int j = 0; j < m->layers[i].n_w; j++, k++) {
            const md_weight *w = &m->layers[i].w[j];
            int one_d = m->layers[i].op == MD_LINEAR && j == 1;
            fx_add_fill(b, w->name, dts[k % 3], one_d ? w->cols : w->rows, one_d ? -1 : w->cols);
        }
    model_def_free(m);
    return fx_finish(b, len);
}

#ifndef LIBFUZZER

/* ------------------------------------------------------- mutation loop */

static uint64_t rng_state;

static uint64_t rnd(void)
{
    uint64_t x = rng_state; /* xorshift64* */
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    rng_state = x;
    return x * 2685821657736338717ull;
}

static size_t rndn(size_t n) { return n ? (size_t)(rnd() % n) : 0; }

typedef struct buf {
    uint8_t *p;
    size_t n, cap;
} buf;

static void buf_set(buf *b, const void *p, size_t n)
{
    if (n + 1 > b->cap) {
        b->cap = (n + 1) * 2;
        b->p = fx_xrealloc(b->p, b->cap);
    }
    memcpy(b->p, p, n);
    b->n = n;
}

/* Replaces [at, at+del) with ins[0..k). */
static void buf_splice(buf *b, size_t at, size_t del, const void *ins, size_t k)
{
    if (at > b->n)
        at = b->n;
    if (del > b->n - at)
        del = b->n - at;
    size_t n = b->n - del + k;
    if (n + 1 > b->cap) {
        b->cap = (n + 1) * 2;
        b->p = fx_xrealloc(b->p, b->cap);
    }
    memmove(b->p + at + k, b->p + at + del, b->n - at - del);
    if (k)
        memcpy(b->p + at, ins, k);
    b->n = n;
}

static const char *const tokens[] = {
    "\"", "{", "}", "[", "]", ",", ":", "-1", "0", "1", "2", "3", "4", "8", "null", "true",
    "1.5", "1e309", "-0", "2147483647", "2147483648", "4294967296", "9223372036854775807",
    "99999999999999999999", "\"\"", "\"user.dense\"", "\"candidate.dense\"", "\"user.history\"",
    "\"user.sparse.a\"", "\"candidate.sparse.b\"", "\"ue\"", "\"h\"", "\"hm\"", "\"us\"",
    "\"cs\"", "\"at\"", "\"l\"", "\"f\"", "\"o\"", "\"cx\"", "\"ta\"", "\"tb\"", "\"stack\"",
    "\"lce\"", "\"add\"", "\"linear\"", "\"flatten\"", "\"reshape\"", "\"mean_pool\"",
    "\"target_attention\"", "\"history_embedding\"", "\"embedding_bag\"", "\"F16\"", "\"BF16\"",
    "\"F32\"", "\"I32\"", "\"a.b\"", "\"\\u0001\"", "\"\\n\"", "[]", "{}", "[0,0]", "\"tables\"",
    "\"x\"", "\"__metadata__\"",
};
#define N_TOKENS (sizeof tokens / sizeof tokens[0])

/* A quoted run from the first '"' at or after i to the next '"' (usually a
 * JSON string; sometimes the text between two strings - also fine). */
static int token_at(const buf *b, size_t i, size_t *s, size_t *e)
{
    size_t a = i;
    while (a < b->n && b->p[a] != '"')
        a++;
    if (a >= b->n)
        return -1;
    size_t z = a + 1;
    while (z < b->n && b->p[z] != '"')
        z++;
    if (z >= b->n)
        return -1;
    *s = a;
    *e = z + 1;
    return 0;
}

static void mutate_bytes(buf *b, size_t lo, size_t hi)
{
    if (hi > b->n)
        hi = b->n;
    if (lo >= hi)
        return;
    size_t i = lo + rndn(hi - lo);
    switch (rndn(7)) {
    case 0:
        b->p[i] ^= (uint8_t)(1u << rndn(8));
        break;
    case 1: {
        static const uint8_t v[] = {0, 0xff, 0x7f, 0x80, '"', '{', '}', '9', '-', '.', '\\', ' '};
        b->p[i] = v[rndn(sizeof v)];
        break;
    }
    case 2: /* delete a span */
        buf_splice(b, i, 1 + rndn(16), NULL, 0);
        break;
    case 3: { /* duplicate a span */
        size_t k = 1 + rndn(24);
        if (i + k > b->n)
            k = b->n - i;
        uint8_t tmp[32];
        memcpy(tmp, b->p + i, k);
        buf_splice(b, lo + rndn(hi - lo), 0, tmp, k);
        break;
    }
    case 4: { /* insert a token */
        const char *t = tokens[rndn(N_TOKENS)];
        buf_splice(b, i, 0, t, strlen(t));
        break;
    }
    case 5: { /* replace a string token with a vocabulary token */
        size_t s, e;
        if (token_at(b, i, &s, &e) == 0) {
            const char *t = tokens[rndn(N_TOKENS)];
            buf_splice(b, s, e - s, t, strlen(t));
        }
        break;
    }
    case 6: { /* replace a digit run with an edge number */
        size_t a = i;
        while (a < hi && !(b->p[a] >= '0' && b->p[a] <= '9'))
            a++;
        if (a >= hi)
            break;
        size_t z = a;
        while (z < b->n && b->p[z] >= '0' && b->p[z] <= '9')
            z++;
        static const char *const nums[] = {"0", "1", "2", "3", "7", "8", "16", "65535",
                                           "2147483647", "2147483648", "18446744073709551615",
                                           "1.0", "-3"};
        const char *t = nums[rndn(sizeof nums / sizeof nums[0])];
        buf_splice(b, a, z - a, t, strlen(t));
        break;
    }
    }
}

static uint64_t get_le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int k = 7; k >= 0; k--)
        v = v << 8 | p[k];
    return v;
}

static void put_le64(uint8_t *p, uint64_t v)
{
    for (int k = 0; k < 8; k++)
        p[k] = (uint8_t)(v >> (8 * k));
}

static void mutate_st(buf *b)
{
    if (b->n < 8) {
        mutate_bytes(b, 0, b->n);
        return;
    }
    uint64_t hl = get_le64(b->p);
    size_t hend = hl <= b->n - 8 ? (size_t)(8 + hl) : b->n;
    switch (rndn(6)) {
    case 0: { /* edit the header size */
        static const int64_t d[] = {-8, -1, 1, 8, 4096};
        uint64_t v = rndn(3) == 0 ? rnd() >> rndn(64) : hl + (uint64_t)d[rndn(5)];
        put_le64(b->p, v);
        break;
    }
    case 1: /* truncate */
        b->n = rndn(b->n + 1);
        break;
    case 2:
    case 3: { /* the header JSON, keeping the size field consistent */
        size_t before = b->n;
        mutate_bytes(b, 8, hend);
        if (hl <= before - 8)
            put_le64(b->p, hl + b->n - before);
        break;
    }
    case 4: /* the data section (NaN/Inf bit patterns come from here) */
        mutate_bytes(b, hend, b->n);
        break;
    default: { /* write an edge float into the data */
        static const uint32_t pats[] = {0x7f800000u, 0xff800000u, 0x7fc00000u, 0x00000001u,
                                        0x7c007c00u, 0x7f807f80u, 0xfc00fc00u};
        if (b->n >= hend + 4) {
            size_t at = hend + rndn(b->n - hend - 3);
            uint32_t v = pats[rndn(sizeof pats / sizeof pats[0])];
            memcpy(b->p + at, &v, 4);
        }
        break;
    }
    }
}

int main(int argc, char **argv)
{
    size_t slen;
    uint8_t *st = seed_weights(&slen);
    size_t jlen = strlen(SEED_JSON);

    if (argc == 3 && strcmp(argv[1], "--seed-out") == 0) {
        FILE *f = fopen(argv[2], "wb");
        if (!f || fwrite(SEED_JSON, 1, jlen, f) != jlen || fputc(0, f) == EOF ||
            fwrite(st, 1, slen, f) != slen || fclose(f) != 0) {
            perror(argv[2]);
            return 1;
        }
        free(st);
        return 0;
    }
    long iters = argc > 1 ? atol(argv[1]) : 20000;
    rng_state = argc > 2 ? strtoull(argv[2], NULL, 0) : 1;
    if (rng_state == 0)
        rng_state = 1;

    /* The seed itself must load. */
    {
        bk_err e = {{0}};
        model_def *m = NULL;
        if (model_def_parse(FZ_DIR, SEED_JSON, jlen, st, slen, &m, &e))
            die("seed refused", e.msg);
        model_def_free(m);
    }

    buf j = {0}, w = {0};
    for (long it = 0; it < iters; it++) {
        buf_set(&j, SEED_JSON, jlen);
        buf_set(&w, st, slen);
        int where = (int)rndn(3); /* 0: json, 1: weights, 2: both */
        int k = 1 + (int)rndn(4);
        for (int r = 0; r < k; r++) {
            if (where != 1)
                mutate_bytes(&j, 0, j.n);
            if (where != 0)
                mutate_st(&w);
        }
        /* Hand the loader exact-size heap copies so ASan/valgrind see any
         * read past the end. */
        char *jc = malloc(j.n ? j.n : 1);
        uint8_t *wc = malloc(w.n ? w.n : 1);
        if (!jc || !wc)
            abort();
        memcpy(jc, j.p, j.n);
        memcpy(wc, w.p, w.n);
        run_one(jc, j.n, wc, w.n);
        free(jc);
        free(wc);
    }
    printf("fuzz_loader: %ld iterations: %lu loaded, %lu refused at model.json, %lu refused at "
           "weights.safetensors\n",
           iters, n_ok, n_json_err, n_st_err);
    free(j.p);
    free(w.p);
    free(st);
    return 0;
}

#endif
