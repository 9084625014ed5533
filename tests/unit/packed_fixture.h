/* packed_fixture.h - a classic RankRequest re-encoded in the packed form
 * (ranker.proto's PackedUsers/PackedCandidates), for the tests that hold the
 * two encodings to the same answers (test_packed.c, test_rank_wire.c).
 *
 * The conversion is written from the proto's comments, independently of the
 * server's reader (server/validate.c): each side's features are the union of
 * the names its entities give, in order of first appearance, an entity
 * without one gets an empty bag; actions are given for every user when any
 * user gives them (absent = zeros, the same content). Returns NULL for a
 * request the packed form cannot say (an entity naming a feature twice).
 * Everything is malloc'd: free with protobuf_c_message_free_unpacked(m, NULL).
 */
#ifndef IKBO_TESTS_PACKED_FIXTURE_H
#define IKBO_TESTS_PACKED_FIXTURE_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ikbo/v1/ranker.pb-c.h"

typedef struct pk_col {
    uint8_t *p;
    size_t n, cap;
} pk_col;

static void pk_put(pk_col *c, const void *v, size_t n)
{
    if (!n) return;
    if (c->n + n > c->cap) {
        c->cap = 2 * (c->n + n) + 16;
        c->p = realloc(c->p, c->cap);
        if (!c->p) abort();
    }
    memcpy(c->p + c->n, v, n);
    c->n += n;
}

static ProtobufCBinaryData pk_bytes(pk_col *c)
{
    ProtobufCBinaryData b = {c->n, c->n ? c->p : NULL};
    if (!c->n) free(c->p);
    return b;
}

/* The feature names of n entities' sparse lists, union in first-seen order;
 * -1 when an entity gives one twice. */
static int pk_names(Ikbo__V1__SparseFeature **const *lists, const size_t *counts, size_t n,
                    char ***names)
{
    int k = 0;
    *names = NULL;
    for (size_t e = 0; e < n; e++)
        for (size_t f = 0; f < counts[e]; f++) {
            for (size_t g = 0; g < f; g++)
                if (!strcmp(lists[e][g]->name, lists[e][f]->name)) return -1;
            int seen = 0;
            for (int q = 0; q < k && !seen; q++) seen = !strcmp((*names)[q], lists[e][f]->name);
            if (seen) continue;
            *names = realloc(*names, (size_t)(k + 1) * sizeof **names);
            (*names)[k++] = strdup(lists[e][f]->name);
        }
    return k;
}

static Ikbo__V1__PackedSparse **pk_sparse(Ikbo__V1__SparseFeature **const *lists,
                                          const size_t *counts, size_t n, char **names, int k)
{
    Ikbo__V1__PackedSparse **out = calloc((size_t)k + 1, sizeof *out);
    for (int q = 0; q < k; q++) {
        Ikbo__V1__PackedSparse *ps = calloc(1, sizeof *ps);
        ikbo__v1__packed_sparse__init(ps);
        ps->name = names[q];
        pk_col len = {0}, ids = {0};
        for (size_t e = 0; e < n; e++) {
            uint32_t l = 0;
            for (size_t f = 0; f < counts[e]; f++)
                if (!strcmp(lists[e][f]->name, names[q])) {
                    l = (uint32_t)lists[e][f]->n_ids;
                    pk_put(&ids, lists[e][f]->ids, 8 * (size_t)l);
                }
            pk_put(&len, &l, 4);
        }
        ps->lengths = pk_bytes(&len);
        ps->ids = pk_bytes(&ids);
        out[q] = ps;
    }
    free(names);
    return out;
}

static Ikbo__V1__PackedUsers *pk_users(const Ikbo__V1__RankRequest *in)
{
    const size_t U = in->n_users;
    Ikbo__V1__SparseFeature ***lists = calloc(U + 1, sizeof *lists);
    size_t *counts = calloc(U + 1, sizeof *counts);
    for (size_t j = 0; j < U; j++) lists[j] = in->users[j]->sparse, counts[j] = in->users[j]->n_sparse;
    char **names;
    int k = pk_names((Ikbo__V1__SparseFeature **const *)lists, counts, U, &names);
    Ikbo__V1__PackedUsers *pu = NULL;
    if (k < 0) goto out;
    pu = calloc(1, sizeof *pu);
    ikbo__v1__packed_users__init(pu);
    pu->count = (uint32_t)U;
    int any_key = 0, any_act = 0, any_hist = 0;
    for (size_t j = 0; j < U; j++) {
        any_key |= in->users[j]->key && in->users[j]->key[0];
        any_act |= in->users[j]->n_history_actions != 0;
        any_hist |= in->users[j]->n_history_ids != 0;
    }
    if (any_key) {
        pu->n_keys = U;
        pu->keys = calloc(U, sizeof *pu->keys);
        for (size_t j = 0; j < U; j++) pu->keys[j] = strdup(in->users[j]->key ? in->users[j]->key : "");
    }
    pk_col dense = {0}, hl = {0}, hi = {0}, ha = {0};
    for (size_t j = 0; j < U; j++) {
        const Ikbo__V1__User *u = in->users[j];
        pk_put(&dense, u->dense, 4 * u->n_dense);
        uint32_t l = (uint32_t)u->n_history_ids;
        pk_put(&hl, &l, 4);
        pk_put(&hi, u->history_ids, 8 * u->n_history_ids);
        for (size_t e = 0; any_act && e < u->n_history_ids; e++) {
            int32_t a = e < u->n_history_actions ? u->history_actions[e] : 0;
            pk_put(&ha, &a, 4);
        }
    }
    pu->dense = pk_bytes(&dense);
    if (!any_hist) hl.n = 0; /* "empty = no history" */
    pu->history_lengths = pk_bytes(&hl);
    pu->history_ids = pk_bytes(&hi);
    pu->history_actions = pk_bytes(&ha);
    pu->n_sparse = (size_t)k;
    pu->sparse = pk_sparse((Ikbo__V1__SparseFeature **const *)lists, counts, U, names, k);
out:
    free(lists);
    free(counts);
    return pu;
}

static Ikbo__V1__PackedCandidates *pk_cands(const Ikbo__V1__RankRequest *in)
{
    const size_t C = in->n_candidates;
    Ikbo__V1__SparseFeature ***lists = calloc(C + 1, sizeof *lists);
    size_t *counts = calloc(C + 1, sizeof *counts);
    for (size_t i = 0; i < C; i++)
        lists[i] = in->candidates[i]->sparse, counts[i] = in->candidates[i]->n_sparse;
    char **names;
    int k = pk_names((Ikbo__V1__SparseFeature **const *)lists, counts, C, &names);
    Ikbo__V1__PackedCandidates *pc = NULL;
    if (k < 0) goto out;
    pc = calloc(1, sizeof *pc);
    ikbo__v1__packed_candidates__init(pc);
    pc->count = (uint32_t)C;
    pk_col ids = {0}, users = {0}, dense = {0};
    for (size_t i = 0; i < C; i++) {
        const Ikbo__V1__Candidate *c = in->candidates[i];
        pk_put(&ids, &c->id, 8);
        pk_put(&users, &c->user, 4);
        pk_put(&dense, c->dense, 4 * c->n_dense);
    }
    pc->ids = pk_bytes(&ids);
    pc->users = pk_bytes(&users);
    pc->dense = pk_bytes(&dense);
    pc->n_sparse = (size_t)k;
    pc->sparse = pk_sparse((Ikbo__V1__SparseFeature **const *)lists, counts, C, names, k);
out:
    free(lists);
    free(counts);
    return pc;
}

static Ikbo__V1__RankRequest *to_packed(const Ikbo__V1__RankRequest *in)
{
    Ikbo__V1__RankRequest *r = calloc(1, sizeof *r);
    ikbo__v1__rank_request__init(r);
    r->model = strdup(in->model ? in->model : "");
    r->request_id = strdup(in->request_id ? in->request_id : "");
    r->model_version = in->model_version;
    r->top_k = in->top_k;
    r->packed_users = pk_users(in);
    r->packed_candidates = pk_cands(in);
    if (!r->packed_users || !r->packed_candidates) {
        protobuf_c_message_free_unpacked(&r->base, NULL);
        return NULL;
    }
    return r;
}

#endif
