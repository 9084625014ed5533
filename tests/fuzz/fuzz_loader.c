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
 *   edge values (fuzz_mutate.h, shared with the other targets), header-size
 *   and offset edits. `fuzz_loader [iters] [seed] [PATH...]`, default 20000
 *   iterations, seed 1, then every corpus file under PATH as-is; a few
 *   seconds.
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

#ifndef LIBFUZZER /* the rest is the standalone build's */

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
    /* the ops of 2026-12-01 */
    "{\"name\":\"ua\",\"op\":\"activation\",\"input\":\"ue\",\"fn\":\"gelu\"},"
    "{\"name\":\"un\",\"op\":\"layer_norm\",\"input\":\"ua\",\"eps\":0.001},"
    "{\"name\":\"hl\",\"op\":\"linear\",\"input\":\"h\",\"out\":4,\"activation\":\"silu\"},"
    "{\"name\":\"hx\",\"op\":\"mul\",\"inputs\":[\"h\",\"hl\"]},"
    "{\"name\":\"hp\",\"op\":\"pool\",\"input\":\"hx\",\"fn\":\"last\"},"
    "{\"name\":\"cm\",\"op\":\"mul\",\"a\":\"ce\",\"b\":\"un\"},"
    "{\"name\":\"dt\",\"op\":\"dot_interaction\",\"inputs\":[\"us\",\"cm\",\"hp\"],"
    "\"self\":false},"
    "{\"name\":\"tl\",\"op\":\"token_linear\",\"input\":\"us\",\"out_tokens\":2},"
    "{\"name\":\"tp\",\"op\":\"pool\",\"input\":\"tl\",\"fn\":\"max\"},"
    "{\"name\":\"cr\",\"op\":\"cross\",\"x0\":\"cd\",\"input\":\"cm\",\"rank\":2},"
    "{\"name\":\"cf\",\"op\":\"cross\",\"x0\":\"cd\",\"input\":\"cr\"},"
    "{\"name\":\"gt\",\"op\":\"linear\",\"input\":\"candidate.dense\",\"out\":2},"
    "{\"name\":\"mx\",\"op\":\"mixture\",\"experts\":[\"cr\",\"cf\"],\"gate\":\"gt\"},"
    "{\"name\":\"ct\",\"op\":\"add\",\"inputs\":[\"mx\",\"tp\"]},"
    "{\"name\":\"fc\",\"op\":\"concat\",\"inputs\":[\"f\",\"dt\",\"ct\"]},"
    "{\"name\":\"o\",\"op\":\"linear\",\"input\":\"fc\",\"out\":2,\"activation\":\"sigmoid\"}"
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
            int one_d = w->one_d;
            fx_add_fill(b, w->name, dts[k % 3], one_d ? w->cols : w->rows, one_d ? -1 : w->cols);
        }
    model_def_free(m);
    return fx_finish(b, len);
}

/* ------------------------------------------------------- mutation loop */

#include "fuzz_main.h" /* fuzz_mutate.h, and the corpus reader (not fz_main) */

#define T FZ_TOK
static const fz_token tokens[] = {
    T("\""), T("{"), T("}"), T("["), T("]"), T(","), T(":"), T("-1"), T("0"), T("1"), T("2"),
    T("3"), T("4"), T("8"), T("null"), T("true"), T("1.5"), T("1e309"), T("-0"), T("2147483647"),
    T("2147483648"), T("4294967296"), T("9223372036854775807"), T("99999999999999999999"),
    T("\"\""), T("\"user.dense\""), T("\"candidate.dense\""), T("\"user.history\""),
    T("\"user.sparse.a\""), T("\"candidate.sparse.b\""), T("\"ue\""), T("\"h\""), T("\"hm\""),
    T("\"us\""), T("\"cs\""), T("\"at\""), T("\"l\""), T("\"f\""), T("\"o\""), T("\"cx\""),
    T("\"ta\""), T("\"tb\""), T("\"stack\""), T("\"lce\""), T("\"add\""), T("\"linear\""),
    T("\"flatten\""), T("\"reshape\""), T("\"mean_pool\""), T("\"target_attention\""),
    T("\"history_embedding\""), T("\"embedding_bag\""), T("\"F16\""), T("\"BF16\""),
    T("\"activation\""), T("\"layer_norm\""), T("\"concat\""), T("\"mul\""),
    T("\"token_linear\""), T("\"dot_interaction\""), T("\"cross\""), T("\"mixture\""),
    T("\"pool\""), T("\"fn\""), T("\"eps\""), T("\"self\""), T("\"rank\""),
    T("\"experts\""), T("\"gate\""), T("\"x0\""), T("\"out_tokens\""), T("\"inputs\""),
    T("\"gelu\""), T("\"silu\""), T("\"tanh\""), T("\"relu\""), T("\"none\""),
    T("\"mean\""), T("\"max\""), T("\"last\""), T("\"sum\""), T("\"un\""), T("\"hx\""),
    T("\"dt\""), T("\"tl\""), T("\"cr\""), T("\"mx\""), T("\"fc\""), T("false"),
    T("1e-50"), T("64"), T("65"), T("256"), T("257"),
    T("\"F32\""), T("\"I32\""), T("\"a.b\""), T("\"\\u0001\""), T("\"\\n\""), T("[]"),
    T("{}"), T("[0,0]"), T("\"tables\""), T("\"x\""), T("\"__metadata__\""),
};
#undef T
static const fz_dict dict = {tokens, sizeof tokens / sizeof tokens[0]};

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

static void mutate_st(fz_buf *b)
{
    if (b->n < 8) {
        fz_mutate(b, 0, b->n, &dict);
        return;
    }
    uint64_t hl = get_le64(b->p);
    size_t hend = hl <= b->n - 8 ? (size_t)(8 + hl) : b->n;
    switch (fz_rndn(6)) {
    case 0: { /* edit the header size */
        static const int64_t d[] = {-8, -1, 1, 8, 4096};
        uint64_t v = fz_rndn(3) == 0 ? fz_rnd() >> fz_rndn(64) : hl + (uint64_t)d[fz_rndn(5)];
        put_le64(b->p, v);
        break;
    }
    case 1: /* truncate */
        b->n = fz_rndn(b->n + 1);
        break;
    case 2:
    case 3: { /* the header JSON, keeping the size field consistent */
        size_t before = b->n;
        fz_mutate(b, 8, hend, &dict);
        if (hl <= before - 8)
            put_le64(b->p, hl + b->n - before);
        break;
    }
    case 4: /* the data section (NaN/Inf bit patterns come from here) */
        fz_mutate(b, hend, b->n, &dict);
        break;
    default: { /* write an edge float into the data */
        static const uint32_t pats[] = {0x7f800000u, 0xff800000u, 0x7fc00000u, 0x00000001u,
                                        0x7c007c00u, 0x7f807f80u, 0xfc00fc00u};
        if (b->n >= hend + 4) {
            size_t at = hend + fz_rndn(b->n - hend - 3);
            uint32_t v = pats[fz_rndn(sizeof pats / sizeof pats[0])];
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
    fz_seed(argc > 2 ? strtoull(argv[2], NULL, 0) : 1);

    /* The seed itself must load. */
    {
        bk_err e = {{0}};
        model_def *m = NULL;
        if (model_def_parse(FZ_DIR, SEED_JSON, jlen, st, slen, &m, &e))
            die("seed refused", e.msg);
        model_def_free(m);
    }

    fz_buf j = {0}, w = {0};
    for (long it = 0; it < iters; it++) {
        fz_set(&j, SEED_JSON, jlen);
        fz_set(&w, st, slen);
        int where = (int)fz_rndn(3); /* 0: json, 1: weights, 2: both */
        int k = 1 + (int)fz_rndn(4);
        for (int r = 0; r < k; r++) {
            if (where != 1)
                fz_mutate(&j, 0, j.n, &dict);
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
    /* Then the corpus files given after the seed, each as-is. */
    fz_corpus c = {0};
    for (int i = 3; i < argc; i++)
        if (fz_load_path(argv[i], &c) != 0)
            return 2;
    for (size_t i = 0; i < c.n; i++) {
        fz_run_copy(c.f[i].p, c.f[i].n);
        free(c.f[i].p);
    }
    free(c.f);
    printf("fuzz_loader: %ld iterations and %zu corpus inputs: %lu loaded, %lu refused at "
           "model.json, %lu refused at weights.safetensors\n",
           iters, c.n, n_ok, n_json_err, n_st_err);
    free(j.p);
    free(w.p);
    free(st);
    return 0;
}

#endif
