/* wire_fixture.h - random RankRequests for the wire-format tests
 * (test_pb_arena.c, test_rank_wire.c): every field kind, built with calloc
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

/* A random RankRequest with every field kind: strings, packed floats and
 * int64s, submessages two levels deep, empty and missing parts. */
static Ikbo__V1__RankRequest *random_request(void)
{
    Ikbo__V1__RankRequest *r = calloc(1, sizeof *r);
    ikbo__v1__rank_request__init(r);
    r->model = strdup(rnd() % 4 ? "bench" : "");
    r->model_version = (int64_t)(rnd() % 5) - 1;
    r->request_id = strdup("req-7");
    r->top_k = (uint32_t)(rnd() % 3);
    r->n_users = 1 + rnd() % 4;
    r->users = calloc(r->n_users, sizeof *r->users);
    for (size_t u = 0; u < r->n_users; u++) {
        Ikbo__V1__User *x = calloc(1, sizeof *x);
        ikbo__v1__user__init(x);
        x->key = strdup(rnd() % 2 ? "user-key" : "");
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
            sf->name = strdup(f ? "lang" : "country");
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
