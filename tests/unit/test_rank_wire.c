/* test_rank_wire.c - the fast RankRequest decoder (server/rank_wire.c)
 * against the fallback path, the reference: protobuf-c's unpack followed by
 * the wire check (server/pb_check.c). Wherever the decoder answers, the
 * fallback must accept the same bytes and both results must re-pack to the
 * same bytes; wherever it refuses, the fallback must refuse with the same
 * message. Random requests (random UTF-8 strings), the other encodings
 * protobuf allows (unpacked repeated scalars, split and interleaved fields,
 * repeated singular fields), encodings it must refuse (unknown fields,
 * wrong wire types, truncation), every class of bad string in every string
 * field, field numbers out of range, and byte-flip mutations of valid
 * requests. Also the UTF-8 validator itself, exhaustively against a
 * reference written from the definition. */
#define _GNU_SOURCE /* memmem */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "grpc/health/v1/health.pb-c.h"
#include "server/pb_arena.h"
#include "server/pb_check.h"
#include "server/rank_wire.h"
#include "wire_fixture.h"
#include "packed_fixture.h"

enum { DECLINED = 0, ANSWERED = 1, REFUSED = 2 };

/* The fallback: protobuf-c + the check, as the gRPC server runs it. */
static Ikbo__V1__RankRequest *fallback(const uint8_t *b, size_t n, rq_status *st)
{
    return (Ikbo__V1__RankRequest *)pb_check_unpack(&ikbo__v1__rank_request__descriptor, NULL,
                                                    b, n, st);
}

/* Both decode paths on the same bytes: what the fast one did (DECLINED,
 * ANSWERED, REFUSED), after checking the fallback agrees. *msg (may be
 * NULL) gets the refusal message of whichever path refused ("" if none). */
static int agree_msg(const uint8_t *b, size_t n, char *msg, size_t msg_n)
{
    pb_arena *a = pb_arena_new(64);
    assert_non_null(a);
    rq_status fs, rs;
    memset(&fs, 0x5a, sizeof fs); /* the decoder must set it on every path */
    Ikbo__V1__RankRequest *f = rank_wire_decode(b, n, a, &fs);
    Ikbo__V1__RankRequest *m = fallback(b, n, &rs);
    int out = f ? ANSWERED : fs.code == RQ_OK ? DECLINED : REFUSED;
    if (m) assert_int_equal(rs.code, RQ_OK);
    else assert_int_equal(rs.code, RQ_INVALID_ARGUMENT);
    if (f) {
        assert_int_equal(fs.code, RQ_OK);
        assert_non_null(m); /* never accepts what the fallback refuses */
        size_t n1, n2;
        uint8_t *w1 = pack(m, &n1), *w2 = pack(f, &n2);
        assert_int_equal(n1, n2);
        assert_memory_equal(w1, w2, n1);
        assert_int_equal(f->n_users, m->n_users);
        assert_int_equal(f->n_candidates, m->n_candidates);
        free(w1);
        free(w2);
    } else if (out == REFUSED) {
        assert_int_equal(fs.code, RQ_INVALID_ARGUMENT);
        if (m || strcmp(fs.msg, rs.msg))
            fail_msg("fast decoder refused '%s', fallback %s '%s'", fs.msg,
                     m ? "accepted" : "refused", m ? "" : rs.msg);
    }
    if (msg) snprintf(msg, msg_n, "%s", out == REFUSED ? fs.msg : m ? "" : rs.msg);
    if (m) ikbo__v1__rank_request__free_unpacked(m, NULL);
    pb_arena_free(a);
    return out;
}

static int agree(const uint8_t *b, size_t n) { return agree_msg(b, n, NULL, 0); }

static void test_random_requests(void **s)
{
    (void)s;
    for (int it = 0; it < 300; it++) {
        Ikbo__V1__RankRequest *r = random_request();
        size_t n;
        uint8_t *w = pack(r, &n);
        ikbo__v1__rank_request__free_unpacked(r, NULL);
        assert_int_equal(agree(w, n), ANSWERED); /* canonical encoding: always taken */
        free(w);
    }
    assert_int_equal(agree((const uint8_t *)"", 0), ANSWERED); /* the empty request */
}

/* Packed varints of every length (1 to 10 bytes) at every distance from
 * the end of their body: the decoder reads whole words where at least ten
 * bytes are left and byte by byte in the last ones, so each length must be
 * met on both sides of that boundary, for int64 ids and int32 actions (a
 * negative int32 is ten bytes on the wire; a large one is truncated). */
static void test_varint_lengths(void **s)
{
    (void)s;
    for (int shift = 0; shift < 24; shift++) {
        Ikbo__V1__User u = IKBO__V1__USER__INIT, *up = &u;
        Ikbo__V1__RankRequest r = IKBO__V1__RANK_REQUEST__INIT;
        int64_t ids[40];
        int32_t acts[40];
        const size_t n = 20 + (size_t)shift % 20;
        for (size_t i = 0; i < n; i++) {
            int len = (int)((i + (size_t)shift) % 10) + 1; /* wire bytes of ids[i] */
            uint64_t v = len == 10 ? (uint64_t)-1 - i : (1ull << (7 * len - 1)) + i;
            ids[i] = (int64_t)(i % 2 || len < 9 ? v : ~v + 1);
            acts[i] = (int32_t)(len == 10 ? -(int32_t)i - 1 : (int64_t)(v & 0xffffffffu));
        }
        u.key = "u";
        u.n_history_ids = n;
        u.history_ids = ids;
        u.n_history_actions = n;
        u.history_actions = acts;
        r.n_users = 1;
        r.users = &up;
        size_t bytes;
        uint8_t *w = pack(&r, &bytes);
        assert_int_equal(agree(w, bytes), ANSWERED);
        pb_arena *a = pb_arena_new(64);
        rq_status st;
        Ikbo__V1__RankRequest *f = rank_wire_decode(w, bytes, a, &st);
        assert_non_null(f);
        assert_int_equal(f->users[0]->n_history_ids, n);
        assert_memory_equal(f->users[0]->history_ids, ids, n * sizeof *ids);
        assert_memory_equal(f->users[0]->history_actions, acts, n * sizeof *acts);
        pb_arena_free(a);
        free(w);
    }
}

/* The response packer against protobuf-c's, byte for byte, on random
 * responses with every zero and sign case proto3 drops or keeps. */
static void test_response_pack(void **s)
{
    (void)s;
    static const float special[] = {0.0f, -0.0f, 1.0f, -3.5f, 1e-40f, 3.4e38f};
    for (int it = 0; it < 400; it++) {
        Ikbo__V1__RankResponse r = IKBO__V1__RANK_RESPONSE__INIT;
        char *tasks[3] = {"click", "", "like"};
        r.model = it % 5 ? "bench" : "";
        r.request_id = it % 3 ? random_text() : strdup("");
        r.model_version = it % 4 == 0 ? 0 : it % 4 == 1 ? -1 : (int64_t)(rnd() >> (rnd() % 64));
        r.unique_users = it % 3 ? (uint32_t)rnd() : 0;
        r.n_tasks = (size_t)(it % 4);
        r.tasks = tasks;
        r.n_scores = rnd() % 40;
        Ikbo__V1__Score *sc = calloc(r.n_scores + 1, sizeof *sc);
        Ikbo__V1__Score **sp = calloc(r.n_scores + 1, sizeof *sp);
        float *ts = calloc(4 * r.n_scores + 1, sizeof *ts);
        for (size_t k = 0; k < r.n_scores; k++) {
            ikbo__v1__score__init(&sc[k]);
            sc[k].id = rnd() % 3 ? (int64_t)rnd() : rnd() % 2 ? 0 : -1;
            sc[k].index = rnd() % 4 ? (uint32_t)(rnd() % 100000) : 0;
            sc[k].score = rnd() % 3 ? (float)(rnd() % 1000) / 999.0f : special[rnd() % 6];
            sc[k].n_task_scores = rnd() % 4;
            sc[k].task_scores = ts + 4 * k;
            for (size_t t = 0; t < sc[k].n_task_scores; t++) ts[4 * k + t] = special[rnd() % 6];
            sp[k] = &sc[k];
        }
        r.scores = sp;
        size_t n = ikbo__v1__rank_response__get_packed_size(&r);
        assert_int_equal(rank_wire_response_size(&r), n);
        uint8_t *a = malloc(n + 1), *b = malloc(n + 1);
        ikbo__v1__rank_response__pack(&r, a);
        assert_int_equal(rank_wire_pack_response(&r, b), n);
        assert_memory_equal(a, b, n);
        free(a);
        free(b);
        free(sc);
        free(sp);
        free(ts);
        free(r.request_id);
    }
}

/* ---- hand-made encodings ---------------------------------------------- */

typedef struct buf {
    uint8_t b[4096];
    size_t n;
} buf;

static void put(buf *o, const void *p, size_t n)
{
    assert_true(o->n + n <= sizeof o->b);
    memcpy(o->b + o->n, p, n);
    o->n += n;
}
static void varint(buf *o, uint64_t v)
{
    do {
        uint8_t c = (uint8_t)(v & 0x7f);
        v >>= 7;
        if (v) c |= 0x80;
        put(o, &c, 1);
    } while (v);
}
static void key(buf *o, uint32_t field, int wt) { varint(o, (uint64_t)field << 3 | (uint64_t)wt); }
static void bytes_field(buf *o, uint32_t field, const void *p, size_t n)
{
    key(o, field, 2);
    varint(o, n);
    put(o, p, n);
}
static void len_field(buf *o, uint32_t field, const buf *body)
{
    bytes_field(o, field, body->b, body->n);
}
static void str_field(buf *o, uint32_t field, const char *s)
{
    bytes_field(o, field, s, strlen(s));
}

/* The packed encoding: canonical bytes are always taken, the columns are
 * borrowed from the wire buffer (never copied), and bad strings in its keys
 * and feature names are refused as the fallback refuses them. */
static void test_packed_requests(void **s)
{
    (void)s;
    int tried = 0;
    for (int it = 0; it < 300; it++) {
        Ikbo__V1__RankRequest *c = random_request();
        for (size_t i = 0; i < c->n_candidates; i++) /* its candidates' bags share a name */
            while (c->candidates[i]->n_sparse > 1)
                ikbo__v1__sparse_feature__free_unpacked(
                    c->candidates[i]->sparse[--c->candidates[i]->n_sparse], NULL);
        Ikbo__V1__RankRequest *r = to_packed(c);
        ikbo__v1__rank_request__free_unpacked(c, NULL);
        if (!r) continue; /* a feature named twice: not sayable packed */
        tried++;
        size_t n;
        uint8_t *w = pack(r, &n);
        int want = ANSWERED;
        for (size_t k = 0; k < r->packed_users->n_keys && want == ANSWERED; k++)
            if (pb_str_check((const uint8_t *)r->packed_users->keys[k],
                             strlen(r->packed_users->keys[k]), &(size_t){0}))
                want = REFUSED;
        for (size_t k = 0; k < r->packed_users->n_sparse && want == ANSWERED; k++)
            if (pb_str_check((const uint8_t *)r->packed_users->sparse[k]->name,
                             strlen(r->packed_users->sparse[k]->name), &(size_t){0}))
                want = REFUSED;
        if (want == ANSWERED && pb_check_wire(&ikbo__v1__rank_request__descriptor, w, n,
                                              &(rq_status){0}))
            want = REFUSED; /* model or request_id */
        assert_int_equal(agree(w, n), want);
        if (want == ANSWERED) {
            pb_arena *a = pb_arena_new(0);
            rq_status st;
            Ikbo__V1__RankRequest *q = rank_wire_decode(w, n, a, &st);
            assert_non_null(q);
            const ProtobufCBinaryData *b = &q->packed_candidates->users;
            assert_int_equal(b->len, 4 * r->packed_candidates->count);
            if (b->len) assert_true(b->data >= w && b->data + b->len <= w + n); /* borrowed */
            pb_arena_free(a);
        }
        ikbo__v1__rank_request__free_unpacked(r, NULL);
        free(w);
    }
    assert_true(tried > 100);
    /* packed_users given twice: protobuf merges the two, so this decoder
     * leaves it to protobuf-c. */
    buf r = {{0}, 0}, pu = {{0}, 0};
    key(&pu, 1, 0);
    varint(&pu, 2);
    len_field(&r, 7, &pu);
    len_field(&r, 7, &pu);
    assert_int_equal(agree(r.b, r.n), DECLINED);
    /* A bytes field with a varint wire type: declined, and refused there. */
    buf bad = {{0}, 0}, pc = {{0}, 0};
    key(&pc, 3, 0);
    varint(&pc, 1);
    len_field(&bad, 8, &pc);
    assert_int_equal(agree(bad.b, bad.n), DECLINED);
}

static void test_other_encodings(void **s)
{
    (void)s;
    /* A user with unpacked floats and ids, a packed run split in two, actions
     * with negative values (10-byte varints), its key given twice. */
    buf u = {{0}, 0}, sf = {{0}, 0}, pk = {{0}, 0}, c = {{0}, 0}, r = {{0}, 0};
    str_field(&u, 1, "first");
    float f1 = 1.5f, f2 = -2.25f;
    key(&u, 2, 5);
    put(&u, &f1, 4);
    key(&u, 2, 5);
    put(&u, &f2, 4);
    key(&u, 4, 0);
    varint(&u, 7);
    varint(&pk, 300);
    varint(&pk, (uint64_t)-5);
    len_field(&u, 4, &pk);
    key(&u, 4, 0);
    varint(&u, 1ull << 62);
    for (int k = 0; k < 4; k++) {
        key(&u, 5, 0);
        varint(&u, (uint64_t)(int64_t)(k - 2));
    }
    str_field(&sf, 1, "lang");
    key(&sf, 2, 0);
    varint(&sf, 42);
    len_field(&u, 3, &sf);
    str_field(&u, 1, "second"); /* last wins */
    /* A candidate whose fields come in reverse order, user index given twice. */
    key(&c, 2, 0);
    varint(&c, 9);
    len_field(&c, 4, &sf);
    buf dense = {{0}, 0};
    put(&dense, &f1, 4);
    put(&dense, &f2, 4);
    len_field(&c, 3, &dense);
    key(&c, 1, 0);
    varint(&c, (uint64_t)-77);
    key(&c, 2, 0);
    varint(&c, 0);
    /* The request: candidates before users, fields interleaved. */
    len_field(&r, 4, &c);
    str_field(&r, 1, "bench");
    len_field(&r, 3, &u);
    key(&r, 5, 0);
    varint(&r, 3);
    len_field(&r, 4, &c);
    key(&r, 2, 0);
    varint(&r, 12);
    str_field(&r, 6, "id-1");
    len_field(&r, 3, &u);
    assert_int_equal(agree(r.b, r.n), ANSWERED);

    pb_arena *a = pb_arena_new(0);
    rq_status st;
    Ikbo__V1__RankRequest *q = rank_wire_decode(r.b, r.n, a, &st);
    assert_non_null(q);
    assert_string_equal(q->model, "bench");
    assert_int_equal(q->model_version, 12);
    assert_int_equal(q->top_k, 3);
    assert_int_equal(q->n_users, 2);
    assert_int_equal(q->n_candidates, 2);
    assert_string_equal(q->users[0]->key, "second");
    assert_int_equal(q->users[0]->n_dense, 2);
    assert_true(q->users[0]->dense[1] == f2);
    assert_int_equal(q->users[0]->n_history_ids, 4);
    assert_int_equal(q->users[0]->history_ids[2], -5);
    assert_int_equal(q->users[0]->history_ids[3], 1ll << 62);
    assert_int_equal(q->users[0]->n_history_actions, 4);
    assert_int_equal(q->users[0]->history_actions[0], -2);
    assert_int_equal(q->candidates[1]->id, -77);
    assert_int_equal(q->candidates[1]->user, 0);
    assert_string_equal(q->candidates[1]->sparse[0]->name, "lang");
    assert_int_equal(q->candidates[1]->sparse[0]->ids[0], 42);
    pb_arena_free(a);
}

/* The decoder's one-pass tries (sparse_once, candidate_once) hand a
 * candidate or bag back to the two-pass loop when an array comes in more
 * than one occurrence or there are more than ONCE_BAGS bags: each case
 * here takes that way, after the one-pass try has already decoded part of
 * the message, and must come out as protobuf-c's unpack does. */
static void test_one_pass_fallbacks(void **s)
{
    (void)s;
    float fv[3] = {0.5f, -1.0f, 3.25f};
    buf c_dense = {{0}, 0}, c_bags = {{0}, 0}, c_ids = {{0}, 0}, sf = {{0}, 0}, split = {{0}, 0};
    buf run1 = {{0}, 0}, run2 = {{0}, 0}, d1 = {{0}, 0}, r = {{0}, 0};
    str_field(&sf, 1, "item");
    varint(&run1, 11);
    len_field(&sf, 2, &run1);
    /* Dense values in a packed run and then one unpacked float; a bag first. */
    len_field(&c_dense, 4, &sf);
    put(&d1, fv, 8);
    len_field(&c_dense, 3, &d1);
    key(&c_dense, 3, 5);
    put(&c_dense, &fv[2], 4);
    /* Nine bags, one more than a one-pass candidate holds. */
    for (int k = 0; k < 9; k++)
        len_field(&c_bags, 4, &sf);
    /* A bag whose ids come in two runs, after its name. */
    str_field(&split, 1, "author");
    varint(&run2, 5);
    varint(&run2, (uint64_t)-6);
    len_field(&split, 2, &run2);
    key(&split, 2, 0);
    varint(&split, 7);
    len_field(&c_ids, 4, &sf);
    len_field(&c_ids, 4, &split);
    str_field(&r, 1, "bench");
    len_field(&r, 4, &c_dense);
    len_field(&r, 4, &c_bags);
    len_field(&r, 4, &c_ids);
    assert_int_equal(agree(r.b, r.n), ANSWERED);

    pb_arena *a = pb_arena_new(0);
    rq_status st;
    Ikbo__V1__RankRequest *q = rank_wire_decode(r.b, r.n, a, &st);
    assert_non_null(q);
    assert_int_equal(q->n_candidates, 3);
    assert_int_equal(q->candidates[0]->n_dense, 3);
    assert_true(q->candidates[0]->dense[2] == fv[2]);
    assert_int_equal(q->candidates[0]->n_sparse, 1);
    assert_int_equal(q->candidates[1]->n_sparse, 9);
    assert_string_equal(q->candidates[1]->sparse[8]->name, "item");
    assert_int_equal(q->candidates[1]->sparse[8]->ids[0], 11);
    assert_int_equal(q->candidates[2]->n_sparse, 2);
    assert_int_equal(q->candidates[2]->sparse[1]->n_ids, 3);
    assert_int_equal(q->candidates[2]->sparse[1]->ids[1], -6);
    assert_int_equal(q->candidates[2]->sparse[1]->ids[2], 7);
    pb_arena_free(a);
}

/* ok followed by a user (field 3) of one LEN field, `field`, holding p[n]:
 * what the fast decoder did (agree). */
static int agree_user_field(const buf *ok, uint32_t field, const void *p, size_t n)
{
    buf u = {{0}, 0}, r = *ok;
    bytes_field(&u, field, p, n);
    len_field(&r, 3, &u);
    return agree(r.b, r.n);
}

static void test_declines(void **s)
{
    (void)s;
    buf ok = {{0}, 0};
    str_field(&ok, 1, "bench");
    /* Unknown field (protobuf-c keeps it as an unknown field): declined. */
    buf unk = ok;
    key(&unk, 15, 0);
    varint(&unk, 1);
    assert_int_equal(agree(unk.b, unk.n), 0);
    /* A fixed64 field where none is known. */
    buf f64 = ok;
    key(&f64, 2, 1);
    put(&f64, "12345678", 8);
    assert_int_equal(agree(f64.b, f64.n), 0);
    /* Wrong wire type for a known field (model_version as a string). */
    buf wt = ok;
    str_field(&wt, 2, "x");
    assert_int_equal(agree(wt.b, wt.n), 0);
    /* Packed floats whose length is not a multiple of 4 (6 bytes: 1.5 floats). */
    assert_int_equal(agree_user_field(&ok, 2, "abc", 3), 0);
    assert_int_equal(agree_user_field(&ok, 2, "abcdef", 6), 0);
    /* A packed varint run that ends inside a varint. */
    assert_int_equal(agree_user_field(&ok, 4, "\x81\x82", 2), 0);
    /* An 11-byte varint; field number 0; a length past the end. */
    buf v = ok;
    key(&v, 2, 0);
    put(&v, "\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", 11);
    assert_int_equal(agree(v.b, v.n), 0);
    assert_int_equal(agree((const uint8_t *)"\x00\x01", 2), 0);
    assert_int_equal(agree((const uint8_t *)"\x0a\x05" "ab", 4), 0);
    rq_status st;
    assert_null(rank_wire_decode(ok.b, ok.n, NULL, &st));
    assert_int_equal(st.code, RQ_OK);
}

/* Inputs the fuzzers found (tests/fuzz): kept as cases of their own. */
static void test_fuzz_findings(void **s)
{
    (void)s;
    /* A length prefix as an overlong 6-byte varint of 0 (users): protobuf-c
     * reads a prefix in 5 bytes at most and refuses it, so the fast decoder
     * must not answer (it accepted it: rank_wire-2). */
    assert_int_equal(agree((const uint8_t *)"\x1a\x80\x80\x80\x80\x80\x00", 7), DECLINED);
    /* The same for a 6-byte tag (field 1, a 0-byte model name). */
    assert_int_equal(agree((const uint8_t *)"\x8a\x80\x80\x80\x80\x00\x00", 7), DECLINED);
    /* A 5-byte prefix is still legal for both. */
    assert_int_equal(agree((const uint8_t *)"\x0a\x81\x80\x80\x80\x00x", 7), ANSWERED);
    /* An empty packed dense in a candidate and in a user: answered with no
     * values (the copy of 0 bytes into a NULL array was UB: rank_wire-1). */
    assert_int_equal(agree((const uint8_t *)"\x22\x02\x1a\x00", 4), ANSWERED);
    assert_int_equal(agree((const uint8_t *)"\x1a\x02\x12\x00", 4), ANSWERED);
}

/* Every truncation, and random byte flips, of random requests: the decoder
 * never answers differently from the fallback, never reads out of bounds
 * (ASan/valgrind runs of this test), and leaks nothing. */
static void test_mutations(void **s)
{
    (void)s;
    int answered = 0, refused = 0, total = 0;
    for (int it = 0; it < 60; it++) {
        Ikbo__V1__RankRequest *r = random_request();
        size_t n;
        uint8_t *w = pack(r, &n);
        ikbo__v1__rank_request__free_unpacked(r, NULL);
        for (size_t k = 0; k < n && k < 400; k++) answered += agree(w, k) == ANSWERED, total++;
        uint8_t *m = malloc(n + 1);
        for (int f = 0; f < 200 && n > 0; f++) {
            memcpy(m, w, n);
            int flips = 1 + (int)(rnd() % 3);
            for (int j = 0; j < flips; j++) m[rnd() % n] ^= (uint8_t)(1u << (rnd() % 8));
            int got = agree(m, n);
            answered += got == ANSWERED;
            refused += got == REFUSED;
            total++;
        }
        free(m);
        free(w);
    }
    /* Sanity: the mutations are not all trivially declined, and some break
     * a string (refused by both paths, same message). */
    assert_true(answered > total / 20);
    assert_true(refused > 0);
}

/* ---- the UTF-8 check ---------------------------------------------------- */

/* The reference, from the definition: decode by bit pattern, then refuse
 * overlong forms, surrogates, code points past U+10FFFF and NUL. */
static int ref_check(const uint8_t *s, size_t n, size_t *at)
{
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        size_t len = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3
                                  : (c & 0xf8) == 0xf0 ? 4 : 0;
        uint32_t cp = len == 1 ? c : len == 2 ? c & 0x1fu : len == 3 ? c & 0x0fu : c & 0x07u;
        int ok = len != 0 && n - i >= len;
        for (size_t k = 1; ok && k < len; k++) {
            ok = (s[i + k] & 0xc0) == 0x80;
            cp = cp << 6 | (s[i + k] & 0x3fu);
        }
        static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (ok && (cp < min_cp[len] || (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff)) ok = 0;
        if (!ok || cp == 0) {
            *at = i;
            return ok ? PB_STR_NUL : PB_STR_UTF8;
        }
        i += len;
    }
    return PB_STR_OK;
}

static void expect_same(const uint8_t *s, size_t n)
{
    size_t a1 = 777, a2 = 777;
    int r1 = pb_str_check(s, n, &a1), r2 = ref_check(s, n, &a2);
    if (r1 != r2 || (r1 && a1 != a2)) {
        char hex[64] = "";
        for (size_t i = 0; i < n && i < 12; i++) snprintf(hex + 3 * i, 4, "%02x ", s[i]);
        fail_msg("bytes %s: check %d at %zu, reference %d at %zu", hex, r1, a1, r2, a2);
    }
}

static void test_utf8_check(void **s)
{
    (void)s;
    uint8_t b[16];
    /* Every code point, alone and after 7 ASCII bytes (the word path). */
    for (uint32_t cp = 0; cp <= 0x10ffff; cp++) {
        if (cp >= 0xd800 && cp <= 0xdfff) continue;
        size_t k = utf8_put(cp, b);
        size_t at = 99;
        assert_int_equal(pb_str_check(b, k, &at), cp ? PB_STR_OK : PB_STR_NUL);
        if (cp % 97 == 0) {
            memcpy(b, "abcdefg", 7);
            k = 7 + utf8_put(cp, b + 7);
            expect_same(b, k);
        }
    }
    /* Every 1- and 2-byte sequence; every 3-byte one with a multi-byte lead
     * (0xc0..0xff); 4-byte ones at random. */
    for (int i = 0; i < 256; i++) {
        b[0] = (uint8_t)i;
        expect_same(b, 1);
        for (int j = 0; j < 256; j++) {
            b[1] = (uint8_t)j;
            expect_same(b, 2);
        }
    }
    for (int i = 0xc0; i < 256; i++)
        for (int j = 0; j < 256; j++)
            for (int k = 0; k < 256; k += (j & 0xc0) == 0x80 ? 1 : 37) {
                b[0] = (uint8_t)i, b[1] = (uint8_t)j, b[2] = (uint8_t)k;
                expect_same(b, 3);
            }
    for (int it = 0; it < 100000; it++) {
        uint64_t r = rnd();
        b[0] = (uint8_t)(0xf0 + (r & 7));
        for (int k = 1; k < 4; k++) b[k] = (uint8_t)(rnd() % 3 ? 0x80 + (r >> (8 * k)) % 64 : r >> (8 * k));
        expect_same(b, 4);
    }
    /* Random byte strings of every length up to 16, mostly ASCII. */
    for (int it = 0; it < 100000; it++) {
        size_t n = rnd() % 17;
        for (size_t k = 0; k < n; k++) b[k] = (uint8_t)(rnd() % 4 ? 1 + rnd() % 127 : rnd());
        expect_same(b, n);
    }
    /* The first fault is reported, wherever it lies. */
    uint8_t t[40];
    for (size_t pos = 0; pos < sizeof t; pos++) {
        memset(t, 'a', sizeof t);
        t[pos] = 0;
        size_t at = 99;
        assert_int_equal(pb_str_check(t, sizeof t, &at), PB_STR_NUL);
        assert_int_equal(at, pos);
        t[pos] = 0xed; /* then a surrogate: ED A0 80 */
        if (pos + 2 < sizeof t) t[pos + 1] = 0xa0, t[pos + 2] = 0x80;
        assert_int_equal(pb_str_check(t, sizeof t, &at), PB_STR_UTF8);
        assert_int_equal(at, pos);
    }
    size_t at;
    assert_int_equal(pb_str_check(NULL, 0, &at), PB_STR_OK);
}

/* ---- bad strings in every string field --------------------------------- */

#define PH "@PLACEHOLDR@" /* 12 bytes, replaced by the bad string's */
#define PH_LEN 12

/* Sets the string named by `where` (one of the paths below) to PH in a
 * request with three users and three candidates, two sparse bags each. */
static Ikbo__V1__RankRequest *request_with_placeholder(const char *where)
{
    Ikbo__V1__RankRequest *r = calloc(1, sizeof *r);
    ikbo__v1__rank_request__init(r);
    char path[64];
    r->model = strdup(strcmp(where, "model") ? "d\xc3\xa9mo" : PH);
    r->request_id = strdup(strcmp(where, "request_id") ? "r\xf0\x9f\x98\x80" : PH);
    r->n_users = r->n_candidates = 3;
    r->users = calloc(3, sizeof *r->users);
    r->candidates = calloc(3, sizeof *r->candidates);
    for (size_t i = 0; i < 3; i++) {
        Ikbo__V1__User *u = calloc(1, sizeof *u);
        Ikbo__V1__Candidate *c = calloc(1, sizeof *c);
        ikbo__v1__user__init(u);
        ikbo__v1__candidate__init(c);
        snprintf(path, sizeof path, "users[%zu].key", i);
        u->key = strdup(strcmp(where, path) ? "k\xe4\xb8\xad" : PH);
        c->id = (int64_t)i;
        u->n_sparse = c->n_sparse = 2;
        u->sparse = calloc(2, sizeof *u->sparse);
        c->sparse = calloc(2, sizeof *c->sparse);
        for (size_t k = 0; k < 2; k++) {
            for (int side = 0; side < 2; side++) {
                Ikbo__V1__SparseFeature *f = calloc(1, sizeof *f);
                ikbo__v1__sparse_feature__init(f);
                snprintf(path, sizeof path, "%s[%zu].sparse[%zu].name",
                         side ? "candidates" : "users", i, k);
                f->name = strdup(strcmp(where, path) ? "lang" : PH);
                f->n_ids = 1;
                f->ids = calloc(1, sizeof *f->ids);
                f->ids[0] = 5;
                (side ? c->sparse : u->sparse)[k] = f;
            }
        }
        r->users[i] = u;
        r->candidates[i] = c;
    }
    return r;
}

/* The request's bytes with the placeholder overwritten by bad[PH_LEN]. */
static uint8_t *bytes_with(const char *where, const char *bad, size_t *n)
{
    Ikbo__V1__RankRequest *r = request_with_placeholder(where);
    uint8_t *w = pack(r, n);
    ikbo__v1__rank_request__free_unpacked(r, NULL);
    uint8_t *ph = memmem(w, *n, PH, PH_LEN);
    assert_non_null(ph);
    assert_null(memmem(ph + 1, *n - (size_t)(ph + 1 - w), PH, PH_LEN)); /* just one */
    memcpy(ph, bad, PH_LEN);
    return w;
}

static const char *const STRING_FIELDS[] = {
    "model", "request_id", "users[0].key", "users[2].key", "users[1].sparse[1].name",
    "users[0].sparse[0].name", "candidates[2].sparse[0].name", "candidates[0].sparse[1].name",
};

/* 12-byte strings and their first fault. */
static const struct {
    const char *s;
    int fault;
    size_t at;
} BAD[] = {
    {"demo\0evilxyz", PB_STR_NUL, 4},
    {"\0abcdefghijk", PB_STR_NUL, 0},
    {"abcdefghijk\0", PB_STR_NUL, 11},
    {"ab\x80" "defghijkl", PB_STR_UTF8, 2},         /* lone continuation */
    {"\xc0\x80" "cdefghijkl", PB_STR_UTF8, 0},      /* overlong NUL */
    {"a\xc1\xbf" "defghijkl", PB_STR_UTF8, 1},      /* overlong '\x7f' */
    {"\xe0\x80\xaf" "defghijkl", PB_STR_UTF8, 0},   /* overlong '/' */
    {"\xf0\x80\x80\xaf" "efghijkl", PB_STR_UTF8, 0}, /* overlong '/' */
    {"abc\xed\xa0\x80" "ghijkl", PB_STR_UTF8, 3},   /* U+D800 */
    {"\xed\xbf\xbf" "defghijkl", PB_STR_UTF8, 0},   /* U+DFFF */
    {"\xf4\x90\x80\x80" "efghijkl", PB_STR_UTF8, 0}, /* U+110000 */
    {"\xf5\x80\x80\x80" "efghijkl", PB_STR_UTF8, 0},
    {"abcdefgh\xff" "jkl", PB_STR_UTF8, 8},
    {"abcdefghij\xe2\x82", PB_STR_UTF8, 10},        /* truncated at the end */
    {"\xe2\x28\xa1" "defghijkl", PB_STR_UTF8, 0},
    {"\xc3" "bcdefghijkl", PB_STR_UTF8, 0},
};

static void test_bad_strings(void **s)
{
    (void)s;
    for (size_t f = 0; f < sizeof STRING_FIELDS / sizeof *STRING_FIELDS; f++) {
        for (size_t b = 0; b < sizeof BAD / sizeof *BAD; b++) {
            size_t n;
            uint8_t *w = bytes_with(STRING_FIELDS[f], BAD[b].s, &n);
            char msg[512], want[512];
            snprintf(want, sizeof want, "%s: string %s at byte %zu", STRING_FIELDS[f],
                     BAD[b].fault == PB_STR_NUL ? "contains NUL" : "is not valid UTF-8",
                     BAD[b].at);
            /* Refused by the fast decoder and the fallback, same message. */
            assert_int_equal(agree_msg(w, n, msg, sizeof msg), REFUSED);
            assert_string_equal(msg, want);
            /* What the check adds: protobuf-c alone takes it. */
            Ikbo__V1__RankRequest *m = ikbo__v1__rank_request__unpack(NULL, n, w);
            assert_non_null(m);
            ikbo__v1__rank_request__free_unpacked(m, NULL);
            free(w);
        }
        /* Valid multi-byte strings of the same length are taken. */
        size_t n;
        uint8_t *w = bytes_with(STRING_FIELDS[f], "\xf4\x8f\xbf\xbf\xef\xbf\xbf\xed\x9f\xbf\xc2\x80", &n);
        assert_int_equal(agree(w, n), ANSWERED);
        free(w);
    }
}

/* A bad string, then a malformation the fast decoder meets later: it
 * declines (no refusal of its own) and the fallback names the structure,
 * or the string when protobuf-c takes the rest (an unknown field). */
static void test_bad_string_then_other_faults(void **s)
{
    (void)s;
    buf r = {{0}, 0}, u = {{0}, 0};
    bytes_field(&r, 1, "de\0mo", 5);
    buf trunc = r;
    key(&trunc, 6, 2);
    varint(&trunc, 9); /* past the end */
    put(&trunc, "ab", 2);
    char msg[512];
    assert_int_equal(agree_msg(trunc.b, trunc.n, msg, sizeof msg), DECLINED);
    assert_string_equal(msg, "request is not a valid ikbo.v1.RankRequest message");
    str_field(&u, 1, "k");
    key(&u, 99, 0); /* unknown: the fast decoder declines */
    varint(&u, 1);
    len_field(&r, 3, &u);
    assert_int_equal(agree_msg(r.b, r.n, msg, sizeof msg), DECLINED);
    assert_string_equal(msg, "model: string contains NUL at byte 2");
}

/* ModelInfoRequest.model and HealthCheckRequest.service: the fallback only
 * (the fast decoder is the RankRequest's). */
static void test_other_requests(void **s)
{
    (void)s;
    static const struct {
        const ProtobufCMessageDescriptor *d;
        const char *field;
    } msgs[] = {{&ikbo__v1__model_info_request__descriptor, "model"},
                {&grpc__health__v1__health_check_request__descriptor, "service"}};
    for (size_t i = 0; i < 2; i++) {
        for (size_t b = 0; b < sizeof BAD / sizeof *BAD; b++) {
            buf w = {{0}, 0};
            bytes_field(&w, 1, BAD[b].s, PH_LEN);
            rq_status st;
            assert_null(pb_check_unpack(msgs[i].d, NULL, w.b, w.n, &st));
            assert_int_equal(st.code, RQ_INVALID_ARGUMENT);
            char want[128];
            snprintf(want, sizeof want, "%s: string %s at byte %zu", msgs[i].field,
                     BAD[b].fault == PB_STR_NUL ? "contains NUL" : "is not valid UTF-8",
                     BAD[b].at);
            assert_string_equal(st.msg, want);
            ProtobufCMessage *m = protobuf_c_message_unpack(msgs[i].d, NULL, w.n, w.b);
            assert_non_null(m); /* protobuf-c alone takes it */
            protobuf_c_message_free_unpacked(m, NULL);
        }
        buf ok = {{0}, 0};
        str_field(&ok, 1, "d\xc3\xa9mo");
        rq_status st;
        ProtobufCMessage *m = pb_check_unpack(msgs[i].d, NULL, ok.b, ok.n, &st);
        assert_non_null(m);
        assert_int_equal(st.code, RQ_OK);
        protobuf_c_message_free_unpacked(m, NULL);
        assert_null(pb_check_unpack(msgs[i].d, NULL, (const uint8_t *)"\x0a\x05" "ab", 4, &st));
        assert_string_equal(st.msg, msgs[i].d == &ikbo__v1__model_info_request__descriptor
                                        ? "request is not a valid ikbo.v1.ModelInfoRequest message"
                                        : "request is not a valid grpc.health.v1.HealthCheckRequest message");
    }
}

/* ---- field numbers ------------------------------------------------------ */

static void test_field_numbers(void **s)
{
    (void)s;
    char msg[512];
    static const struct {
        uint64_t num;
        const char *want; /* "" = accepted (an unknown field) */
    } cases[] = {
        {PB_MAX_FIELD_NUMBER, ""},
        {1u << 29, "field number 536870912 is outside 1..536870911"},
        {(1ull << 32) - 1, "field number 4294967295 is outside 1..536870911"},
        {0, "field number 0 is outside 1..536870911"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        for (int where = 0; where < 3; where++) {
            /* at the top; in users[1]; in candidates[0].sparse[0] */
            buf top = {{0}, 0}, u0 = {{0}, 0}, u1 = {{0}, 0}, sf = {{0}, 0}, c = {{0}, 0},
                x = {{0}, 0};
            if (cases[i].num) {
                key(&x, 0, 0); /* placeholder, rewritten just below */
                x.n = 0;
                varint(&x, cases[i].num << 3);
            } else {
                put(&x, "\x80\x00", 2); /* field 0 in two bytes: protobuf-c takes it */
            }
            varint(&x, 1);
            str_field(&top, 1, "bench");
            str_field(&u0, 1, "a");
            str_field(&u1, 1, "b");
            str_field(&sf, 1, "item");
            if (where == 1) put(&u1, x.b, x.n);
            if (where == 2) put(&sf, x.b, x.n);
            len_field(&c, 4, &sf);
            len_field(&top, 3, &u0);
            len_field(&top, 3, &u1);
            len_field(&top, 4, &c);
            if (where == 0) put(&top, x.b, x.n);
            Ikbo__V1__RankRequest *m = ikbo__v1__rank_request__unpack(NULL, top.n, top.b);
            assert_non_null(m); /* protobuf-c alone: an unknown field */
            ikbo__v1__rank_request__free_unpacked(m, NULL);
            /* The fast decoder declines (it takes no unknown field); the
             * fallback decides. */
            assert_int_equal(agree_msg(top.b, top.n, msg, sizeof msg), DECLINED);
            if (!*cases[i].want) {
                assert_string_equal(msg, "");
                continue;
            }
            char want[256];
            snprintf(want, sizeof want, "%s: %s",
                     where == 0 ? "request" : where == 1 ? "users[1]" : "candidates[0].sparse[0]",
                     cases[i].want);
            assert_string_equal(msg, want);
        }
    }
    /* Keys protobuf-c cannot read (past 32 bits) stay its refusal. */
    buf big = {{0}, 0};
    varint(&big, (1ull << 35) << 3);
    varint(&big, 1);
    assert_int_equal(agree_msg(big.b, big.n, msg, sizeof msg), DECLINED);
    assert_string_equal(msg, "request is not a valid ikbo.v1.RankRequest message");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_requests),
        cmocka_unit_test(test_varint_lengths),
        cmocka_unit_test(test_other_encodings),
        cmocka_unit_test(test_one_pass_fallbacks),
        cmocka_unit_test(test_packed_requests),
        cmocka_unit_test(test_response_pack),
        cmocka_unit_test(test_declines),
        cmocka_unit_test(test_fuzz_findings),
        cmocka_unit_test(test_mutations),
        cmocka_unit_test(test_utf8_check),
        cmocka_unit_test(test_bad_strings),
        cmocka_unit_test(test_bad_string_then_other_faults),
        cmocka_unit_test(test_other_requests),
        cmocka_unit_test(test_field_numbers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
