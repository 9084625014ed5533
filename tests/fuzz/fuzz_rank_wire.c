/* fuzz_rank_wire.c - fuzz the fast RankRequest decoder (server/rank_wire.c)
 * with protobuf-c as the oracle.
 *
 * Why this exists: the gRPC handler decodes untrusted bytes with
 * rank_wire_decode first and only falls back to protobuf-c + pb_check
 * (pb_check_unpack, the reference) when it declines, so whatever the fast
 * decoder does must agree with the reference. The checks, on every input:
 *   - fast decoder answers => the reference accepts too, and the two
 *     messages are equal field by field (strings, float bits, int64s,
 *     counts, every submessage) and re-pack to the same bytes;
 *   - fast decoder refuses (a string that is not UTF-8 or holds a NUL) =>
 *     the reference refuses with the same message;
 *   - the reference accepts without unknown fields and the input is the
 *     canonical encoding of its result (re-packing gives the input back) =>
 *     the fast decoder answers (rank_wire.h: it only gives up on unknown
 *     fields, unexpected wire types and malformed bytes, and a canonical
 *     encoding of known fields has none of those);
 *   - declining is always allowed otherwise (the fallback handles it).
 * Two builds: libFuzzer (clang -DLIBFUZZER -fsanitize=fuzzer,...) and the
 * standalone corpus replayer + mutation loop (fuzz_main.h) run by make test,
 * which also mixes in random valid requests from tests/unit/wire_fixture.h.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/pb_arena.h"
#include "server/pb_check.h"
#include "server/rank_wire.h"
/* The fixture's generator is used by the standalone build only. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#include "tests/unit/wire_fixture.h"
#pragma GCC diagnostic pop

static void die(const char *what, const char *detail)
{
    fprintf(stderr, "fuzz_rank_wire: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
    abort();
}

static void same_str(const char *a, const char *b, const char *field)
{
    if (!a || !b)
        die("NULL string (protobuf-c gives \"\")", field);
    if (strcmp(a, b) != 0)
        die("strings differ", field);
}

/* n elements of size sz at a and b, which may be NULL only when n == 0. */
static void same_array(size_t na, const void *a, size_t nb, const void *b, size_t sz,
                       const char *field)
{
    if (na != nb)
        die("counts differ", field);
    if (na && (!a || !b))
        die("NULL array with a nonzero count", field);
    if (na && memcmp(a, b, na * sz) != 0)
        die("elements differ", field);
}

static void same_sparse(size_t na, Ikbo__V1__SparseFeature *const *a, size_t nb,
                        Ikbo__V1__SparseFeature *const *b, const char *field)
{
    if (na != nb)
        die("counts differ", field);
    for (size_t i = 0; i < na; i++) {
        if (!a[i] || !b[i])
            die("NULL submessage", field);
        same_str(a[i]->name, b[i]->name, "sparse.name");
        same_array(a[i]->n_ids, a[i]->ids, b[i]->n_ids, b[i]->ids, sizeof *a[i]->ids,
                   "sparse.ids");
    }
}

static void same_user(const Ikbo__V1__User *a, const Ikbo__V1__User *b)
{
    same_str(a->key, b->key, "users.key");
    same_array(a->n_dense, a->dense, b->n_dense, b->dense, sizeof *a->dense, "users.dense");
    same_sparse(a->n_sparse, a->sparse, b->n_sparse, b->sparse, "users.sparse");
    same_array(a->n_history_ids, a->history_ids, b->n_history_ids, b->history_ids,
               sizeof *a->history_ids, "users.history_ids");
    same_array(a->n_history_actions, a->history_actions, b->n_history_actions,
               b->history_actions, sizeof *a->history_actions, "users.history_actions");
}

static void same_candidate(const Ikbo__V1__Candidate *a, const Ikbo__V1__Candidate *b)
{
    if (a->id != b->id || a->user != b->user)
        die("candidate id/user differ", NULL);
    same_array(a->n_dense, a->dense, b->n_dense, b->dense, sizeof *a->dense, "candidates.dense");
    same_sparse(a->n_sparse, a->sparse, b->n_sparse, b->sparse, "candidates.sparse");
}

static void same_request(const Ikbo__V1__RankRequest *f, const Ikbo__V1__RankRequest *m)
{
    same_str(f->model, m->model, "model");
    same_str(f->request_id, m->request_id, "request_id");
    if (f->model_version != m->model_version || f->top_k != m->top_k)
        die("model_version/top_k differ", NULL);
    if (f->n_users != m->n_users || f->n_candidates != m->n_candidates)
        die("user/candidate counts differ", NULL);
    for (size_t i = 0; i < m->n_users; i++) {
        if (!f->users[i])
            die("NULL user", NULL);
        same_user(f->users[i], m->users[i]);
    }
    for (size_t i = 0; i < m->n_candidates; i++) {
        if (!f->candidates[i])
            die("NULL candidate", NULL);
        same_candidate(f->candidates[i], m->candidates[i]);
    }
}

static int sparse_unknown(Ikbo__V1__PackedSparse *const *sp, size_t n)
{
    for (size_t f = 0; f < n; f++)
        if (sp[f]->base.n_unknown_fields) return 1;
    return 0;
}

/* Any unknown field anywhere (protobuf-c keeps them and re-packs them). */
static int has_unknown(const Ikbo__V1__RankRequest *m)
{
    if (m->base.n_unknown_fields)
        return 1;
    const Ikbo__V1__PackedUsers *pu = m->packed_users;
    const Ikbo__V1__PackedCandidates *pc = m->packed_candidates;
    if (pu && (pu->base.n_unknown_fields || sparse_unknown(pu->sparse, pu->n_sparse))) return 1;
    if (pc && (pc->base.n_unknown_fields || sparse_unknown(pc->sparse, pc->n_sparse))) return 1;
    for (size_t i = 0; i < m->n_users; i++) {
        const Ikbo__V1__User *u = m->users[i];
        if (u->base.n_unknown_fields)
            return 1;
        for (size_t f = 0; f < u->n_sparse; f++)
            if (u->sparse[f]->base.n_unknown_fields)
                return 1;
    }
    for (size_t i = 0; i < m->n_candidates; i++) {
        const Ikbo__V1__Candidate *c = m->candidates[i];
        if (c->base.n_unknown_fields)
            return 1;
        for (size_t f = 0; f < c->n_sparse; f++)
            if (c->sparse[f]->base.n_unknown_fields)
                return 1;
    }
    return 0;
}

static unsigned long n_fast, n_ref_only, n_refused;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    pb_arena *a = pb_arena_new(size * 2 + 64);
    if (!a)
        abort();
    rq_status fs, ms;
    Ikbo__V1__RankRequest *f = rank_wire_decode(data, size, a, &fs);
    Ikbo__V1__RankRequest *m = (Ikbo__V1__RankRequest *)pb_check_unpack(
        &ikbo__v1__rank_request__descriptor, NULL, data, size, &ms);
    if (f && !m)
        die("fast decoder accepted what the reference refuses", ms.msg);
    if (!f && fs.code != RQ_OK && (m || strcmp(fs.msg, ms.msg) != 0))
        die("fast decoder refused what the reference does not refuse the same way", fs.msg);
    n_fast += f != NULL;
    n_ref_only += !f && m;
    n_refused += !m;
    if (m) {
        size_t n1;
        uint8_t *w1 = pack(m, &n1);
        int canonical = n1 == size && memcmp(w1, data, size) == 0 && !has_unknown(m);
        if (canonical && !f)
            die("fast decoder declined a canonical encoding", NULL);
        if (f) {
            same_request(f, m);
            size_t n2;
            uint8_t *w2 = pack(f, &n2);
            if (n1 != n2 || memcmp(w1, w2, n1) != 0)
                die("re-packed bytes differ", NULL);
            free(w2);
        }
        free(w1);
        ikbo__v1__rank_request__free_unpacked(m, NULL);
    }
    pb_arena_free(a);
    return 0;
}

#ifndef LIBFUZZER

#include "fuzz_main.h"

/* Wire-format pieces: tags of every field (wire types 0/2/5), varint edges,
 * bad wire types, an unknown field. */
static const fz_token wire_tokens[] = {
    FZ_TOK("\x0a"), FZ_TOK("\x10"), FZ_TOK("\x1a"), FZ_TOK("\x22"), FZ_TOK("\x28"),
    FZ_TOK("\x32"), FZ_TOK("\x12"), FZ_TOK("\x15"), FZ_TOK("\x20"), FZ_TOK("\x25"),
    FZ_TOK("\x08"), FZ_TOK("\x18"), FZ_TOK("\x1d"), FZ_TOK("\x00"), FZ_TOK("\x80\x01"),
    FZ_TOK("\xff\xff\xff\xff\x0f"), FZ_TOK("\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"),
    FZ_TOK("\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"), FZ_TOK("\x80\x80\x80\x80\x00"),
    FZ_TOK("\x09\x00\x00\x00\x00\x00\x00\x00\x00"), FZ_TOK("\x0b"), FZ_TOK("\x0c"),
    FZ_TOK("\xf8\xff\xff\xff\x0f\x00"), FZ_TOK("\x3a\x00"), FZ_TOK("\x1a\x00"),
    FZ_TOK("\x22\x00"), FZ_TOK("\x12\x03\x01\x02\x03"), FZ_TOK("\x00\x00\xc0\x7f"),
    FZ_TOK("\xc3\x28"), FZ_TOK("\xed\xa0\x80"),
};
static const fz_dict wire_dict = {wire_tokens, sizeof wire_tokens / sizeof wire_tokens[0]};

static void gen_request(fz_buf *out)
{
    Ikbo__V1__RankRequest *r = random_request();
    size_t n;
    uint8_t *w = pack(r, &n);
    ikbo__v1__rank_request__free_unpacked(r, NULL);
    fz_set(out, w, n);
    free(w);
}

static void report(void)
{
    printf(": %lu decoded by both, %lu by protobuf-c only, %lu refused", n_fast, n_ref_only,
           n_refused);
}

int main(int argc, char **argv)
{
    static const fz_target t = {"fuzz_rank_wire", &wire_dict, 20000, gen_request, report};
    return fz_main(argc, argv, &t);
}

#endif
