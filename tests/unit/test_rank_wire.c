/* test_rank_wire.c - the fast RankRequest decoder (server/rank_wire.c)
 * against protobuf-c, the reference: wherever the decoder answers, protobuf-c
 * must accept the same bytes and both results must re-pack to the same
 * bytes. Random requests, the other encodings protobuf allows (unpacked
 * repeated scalars, split and interleaved fields, repeated singular fields),
 * encodings it must refuse (unknown fields, wrong wire types, truncation),
 * and byte-flip mutations of valid requests. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "server/pb_arena.h"
#include "server/rank_wire.h"
#include "wire_fixture.h"

/* Both decoders on the same bytes. Returns 1 when the fast one answered
 * (and then checks it equals protobuf-c's), 0 when it declined. */
static int agree(const uint8_t *b, size_t n)
{
    pb_arena *a = pb_arena_new(64);
    assert_non_null(a);
    Ikbo__V1__RankRequest *f = rank_wire_decode(b, n, a);
    Ikbo__V1__RankRequest *m = ikbo__v1__rank_request__unpack(NULL, n, b);
    int answered = f != NULL;
    if (f) {
        assert_non_null(m); /* never accepts what protobuf-c refuses */
        size_t n1, n2;
        uint8_t *w1 = pack(m, &n1), *w2 = pack(f, &n2);
        assert_int_equal(n1, n2);
        assert_memory_equal(w1, w2, n1);
        assert_int_equal(f->n_users, m->n_users);
        assert_int_equal(f->n_candidates, m->n_candidates);
        free(w1);
        free(w2);
    }
    if (m) ikbo__v1__rank_request__free_unpacked(m, NULL);
    pb_arena_free(a);
    return answered;
}

static void test_random_requests(void **s)
{
    (void)s;
    for (int it = 0; it < 300; it++) {
        Ikbo__V1__RankRequest *r = random_request();
        size_t n;
        uint8_t *w = pack(r, &n);
        ikbo__v1__rank_request__free_unpacked(r, NULL);
        assert_int_equal(agree(w, n), 1); /* canonical encoding: always taken */
        free(w);
    }
    assert_int_equal(agree((const uint8_t *)"", 0), 1); /* the empty request */
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
static void len_field(buf *o, uint32_t field, const buf *body)
{
    key(o, field, 2);
    varint(o, body->n);
    put(o, body->b, body->n);
}
static void str_field(buf *o, uint32_t field, const char *s)
{
    key(o, field, 2);
    varint(o, strlen(s));
    put(o, s, strlen(s));
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
    assert_int_equal(agree(r.b, r.n), 1);

    pb_arena *a = pb_arena_new(0);
    Ikbo__V1__RankRequest *q = rank_wire_decode(r.b, r.n, a);
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
    /* Packed floats whose length is not a multiple of 4. */
    buf u = {{0}, 0}, r = ok;
    key(&u, 2, 2);
    varint(&u, 3);
    put(&u, "abc", 3);
    len_field(&r, 3, &u);
    assert_int_equal(agree(r.b, r.n), 0);
    buf u6 = {{0}, 0}, r6 = ok; /* 6 bytes: 1.5 floats */
    key(&u6, 2, 2);
    varint(&u6, 6);
    put(&u6, "abcdef", 6);
    len_field(&r6, 3, &u6);
    assert_int_equal(agree(r6.b, r6.n), 0);
    /* A packed varint run that ends inside a varint. */
    buf u2 = {{0}, 0}, r2 = ok;
    key(&u2, 4, 2);
    varint(&u2, 2);
    put(&u2, "\x81\x82", 2);
    len_field(&r2, 3, &u2);
    assert_int_equal(agree(r2.b, r2.n), 0);
    /* An 11-byte varint; field number 0; a length past the end. */
    buf v = ok;
    key(&v, 2, 0);
    put(&v, "\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", 11);
    assert_int_equal(agree(v.b, v.n), 0);
    assert_int_equal(agree((const uint8_t *)"\x00\x01", 2), 0);
    assert_int_equal(agree((const uint8_t *)"\x0a\x05" "ab", 4), 0);
    assert_null(rank_wire_decode(ok.b, ok.n, NULL));
}

/* Every truncation, and random byte flips, of random requests: the decoder
 * never answers differently from protobuf-c, never reads out of bounds
 * (ASan/valgrind runs of this test), and leaks nothing. */
static void test_mutations(void **s)
{
    (void)s;
    int answered = 0, total = 0;
    for (int it = 0; it < 60; it++) {
        Ikbo__V1__RankRequest *r = random_request();
        size_t n;
        uint8_t *w = pack(r, &n);
        ikbo__v1__rank_request__free_unpacked(r, NULL);
        for (size_t k = 0; k < n && k < 400; k++) answered += agree(w, k), total++;
        uint8_t *m = malloc(n + 1);
        for (int f = 0; f < 200 && n > 0; f++) {
            memcpy(m, w, n);
            int flips = 1 + (int)(rnd() % 3);
            for (int j = 0; j < flips; j++) m[rnd() % n] ^= (uint8_t)(1u << (rnd() % 8));
            answered += agree(m, n);
            total++;
        }
        free(m);
        free(w);
    }
    /* Sanity: the mutations are not all trivially declined. */
    assert_true(answered > total / 20);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_requests),
        cmocka_unit_test(test_other_encodings),
        cmocka_unit_test(test_declines),
        cmocka_unit_test(test_mutations),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
