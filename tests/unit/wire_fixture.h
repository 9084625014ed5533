/* wire_fixture.h - random RankRequests for the wire-format tests
 * (test_pb_arena.c, test_rank_wire.c): every field kind, random UTF-8
 * strings, built with calloc
 * so protobuf-c's free_unpacked (default allocator) frees them, and packed
 * to bytes. Header-only, one include per test binary. */
#ifndef IKBO_TESTS_WIRE_FIXTURE_H
#define IKBO_TESTS_WIRE_FIXTURE_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ikbo/v1/ranker.pb-c.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* Code point cp (not a surrogate, <= U+10FFFF) as UTF-8 at out; its length. */
static size_t utf8_put(uint32_t cp, uint8_t *out)
{
    if (cp < 0x80) {
        out[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (uint8_t)(0xc0 | cp >> 6);
        out[1] = (uint8_t)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xe0 | cp >> 12);
        out[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3f));
        out[2] = (uint8_t)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (uint8_t)(0xf0 | cp >> 18);
    out[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3f));
    out[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3f));
    out[3] = (uint8_t)(0x80 | (cp & 0x3f));
    return 4;
}

/* A random valid proto3 string (malloc'd): up to 12 code points from every
 * UTF-8 length, the boundaries of each (U+7F, U+80, U+7FF, U+800, U+D7FF,
 * U+E000, U+FFFF, U+10000, U+10FFFF) included; never NUL or a surrogate. */
static char *random_text(void)
{
    static const uint32_t edge[] = {0x01,   0x7f,    0x80,    0x7ff,   0x800,
                                    0xd7ff, 0xe000,  0xfffd,  0xffff,  0x10000,
                                    0x10ffff, 0x1f600, 0xe9,  0x4e2d};
    size_t n = rnd() % 13;
    uint8_t *s = malloc(4 * n + 1), *o = s;
    if (!s) abort();
    for (size_t i = 0; i < n; i++) {
        uint32_t cp;
        switch (rnd() % 6) {
        case 0: cp = edge[rnd() % (sizeof edge / sizeof *edge)]; break;
        case 1: cp = 0x80 + (uint32_t)(rnd() % (0x800 - 0x80)); break;
        case 2:
            cp = 0x800 + (uint32_t)(rnd() % (0x10000 - 0x800 - 0x800));
            if (cp >= 0xd800) cp += 0x800; /* skip the surrogates */
            break;
        case 3: cp = 0x10000 + (uint32_t)(rnd() % (0x110000 - 0x10000)); break;
        default: cp = 0x20 + (uint32_t)(rnd() % 0x5f); break;
        }
        o += utf8_put(cp, o);
    }
    *o = 0;
    return (char *)s;
}

/* A random RankRequest with every field kind: strings (random UTF-8 in
 * model, request_id and user keys), packed floats and int64s, submessages
 * two levels deep, empty and missing parts. */
static Ikbo__V1__RankRequest *random_request(void)
{
    Ikbo__V1__RankRequest *r = calloc(1, sizeof *r);
    ikbo__v1__rank_request__init(r);
    r->model = rnd() % 4 ? (rnd() % 2 ? strdup("bench") : random_text()) : strdup("");
    r->model_version = (int64_t)(rnd() % 5) - 1;
    r->request_id = rnd() % 2 ? strdup("req-7") : random_text();
    r->top_k = (uint32_t)(rnd() % 3);
    r->n_users = 1 + rnd() % 4;
    r->users = calloc(r->n_users, sizeof *r->users);
    for (size_t u = 0; u < r->n_users; u++) {
        Ikbo__V1__User *x = calloc(1, sizeof *x);
        ikbo__v1__user__init(x);
        x->key = rnd() % 3 ? strdup(rnd() % 2 ? "user-key" : "") : random_text();
        x->n_dense = rnd() % 9;
        x->dense = calloc(x->n_dense + 1, sizeof *x->dense);
        for (size_t i = 0; i < x->n_dense; i++) x->dense[i] = (float)(rnd() % 1000) * 0.25f;
        x->n_history_ids = rnd() % 200;
        x->history_ids = calloc(x->n_history_ids + 1, sizeof *x->history_ids);
        x->n_history_actions = rnd() % 2 ? x->n_history_ids : 0;
        x->history_actions = calloc(x->n_history_ids + 1, sizeof *x->history_actions);
        for (size_t i = 0; i < x->n_history_ids; i++) {
            x->history_ids[i] = (int64_t)(rnd() >> (rnd() % 64)) * (rnd() % 2 ? 1 : -1);
            x->history_actions[i] = (int32_t)(rnd() % 4);
        }
        x->n_sparse = rnd() % 3;
        x->sparse = calloc(x->n_sparse + 1, sizeof *x->sparse);
        for (size_t f = 0; f < x->n_sparse; f++) {
            Ikbo__V1__SparseFeature *sf = calloc(1, sizeof *sf);
            ikbo__v1__sparse_feature__init(sf);
            sf->name = f == 1 ? random_text() : strdup(f ? "lang" : "country");
            sf->n_ids = rnd() % 5;
            sf->ids = calloc(sf->n_ids + 1, sizeof *sf->ids);
            for (size_t i = 0; i < sf->n_ids; i++) sf->ids[i] = (int64_t)(rnd() % 100000);
            x->sparse[f] = sf;
        }
        r->users[u] = x;
    }
    r->n_candidates = rnd() % 60;
    r->candidates = calloc(r->n_candidates + 1, sizeof *r->candidates);
    for (size_t c = 0; c < r->n_candidates; c++) {
        Ikbo__V1__Candidate *x = calloc(1, sizeof *x);
        ikbo__v1__candidate__init(x);
        x->id = (int64_t)rnd();
        x->user = (uint32_t)(rnd() % r->n_users);
        x->n_dense = rnd() % 5;
        x->dense = calloc(x->n_dense + 1, sizeof *x->dense);
        for (size_t i = 0; i < x->n_dense; i++) x->dense[i] = (float)(rnd() % 100);
        x->n_sparse = rnd() % 3;
        x->sparse = calloc(x->n_sparse + 1, sizeof *x->sparse);
        for (size_t f = 0; f < x->n_sparse; f++) {
            Ikbo__V1__SparseFeature *sf = calloc(1, sizeof *sf);
            ikbo__v1__sparse_feature__init(sf);
            sf->name = strdup("item");
            sf->n_ids = 1 + rnd() % 3;
            sf->ids = calloc(sf->n_ids, sizeof *sf->ids);
            for (size_t i = 0; i < sf->n_ids; i++) sf->ids[i] = (int64_t)(rnd() % 1000000);
            x->sparse[f] = sf;
        }
        r->candidates[c] = x;
    }
    return r;
}

static uint8_t *pack(const Ikbo__V1__RankRequest *r, size_t *n)
{
    *n = ikbo__v1__rank_request__get_packed_size(r);
    uint8_t *b = malloc(*n + 1);
    if (!b) abort();
    ikbo__v1__rank_request__pack(r, b);
    return b;
}

#endif
