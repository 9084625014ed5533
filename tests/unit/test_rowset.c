/* test_rowset.c - server/rowset.c on its own, against a reference written
 * here with plain loops: the dedup table (rows at odd byte offsets, every
 * hash colliding or not, absent actions equal to zeros), the stable
 * counting sort, and the assembled batch (every column, candidates through
 * an order, actions zero-filled for users without them), plus reading an
 * assembled batch back as rows. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "server/rowset.h"

static uint32_t seed = 77;
static uint32_t rnd(void)
{
    seed = seed * 1103515245u + 12345u;
    return (seed >> 16) & 0x7fff;
}

enum { UD = 3, NUS = 2, CD = 2, NCS = 1, MAXN = 40 };

/* Users laid out in one byte buffer at odd offsets, so spans are unaligned. */
typedef struct pool {
    unsigned char bytes[1 << 16];
    size_t used;
} pool;

static const void *put(pool *p, const void *v, size_t n)
{
    unsigned char *at = p->bytes + p->used + 1; /* odd offset */
    assert_true(p->used + n + 2 <= sizeof p->bytes);
    if (n) memcpy(at, v, n);
    p->used += n + 1;
    return at;
}

typedef struct user {
    char key[4];
    float dense[UD];
    int64_t bag[NUS][3];
    size_t nbag[NUS];
    int64_t hist[4];
    int32_t act[4];
    size_t nhist, nact; /* nact 0 or nhist */
} user;

/* Few distinct values, so that equal users and users differing in one part
 * only (a key, one dense bit, a bag, actions absent vs zero vs not) are
 * common. */
static void random_user(user *u)
{
    memset(u, 0, sizeof *u);
    if (rnd() % 2) snprintf(u->key, sizeof u->key, "k%d", (int)(rnd() % 2));
    u->dense[rnd() % UD] = (float)(rnd() % 2);
    if (rnd() % 4 == 0) u->dense[0] = -0.0f; /* a different user than 0.0 */
    for (int f = 0; f < NUS; f++) {
        u->nbag[f] = rnd() % 4 == 0;
        u->bag[f][0] = rnd() % 2;
    }
    u->nhist = 2 + rnd() % 3;
    u->hist[1] = rnd() % 4 == 0; /* the middle one when nhist == 3 or 4 */
    u->act[rnd() % 2] = rnd() % 2;
    u->nact = rnd() % 2 ? u->nhist : 0;
}

/* request.h's rule, written directly. */
static int same_user(const user *a, const user *b)
{
    if (strcmp(a->key, b->key) || memcmp(a->dense, b->dense, sizeof a->dense)) return 0;
    for (int f = 0; f < NUS; f++)
        if (a->nbag[f] != b->nbag[f] || memcmp(a->bag[f], b->bag[f], a->nbag[f] * 8)) return 0;
    if (a->nhist != b->nhist || memcmp(a->hist, b->hist, a->nhist * 8)) return 0;
    for (size_t k = 0; k < a->nhist; k++) {
        int32_t x = a->nact ? a->act[k] : 0, y = b->nact ? b->act[k] : 0;
        if (x != y) return 0;
    }
    return 1;
}

static void as_row(pool *p, const user *u, rs_row *r, rs_span *bags)
{
    for (int f = 0; f < NUS; f++) bags[f] = (rs_span){put(p, u->bag[f], u->nbag[f] * 8), u->nbag[f]};
    r->key = u->key;
    r->dense = put(p, u->dense, sizeof u->dense);
    r->bags = bags;
    r->hist = (rs_span){put(p, u->hist, u->nhist * 8), u->nhist};
    r->act = (rs_span){u->nact ? put(p, u->act, u->nact * 4) : NULL, u->nact};
}

static void test_table_against_loops(void **s)
{
    (void)s;
    static pool p;
    const rs_dims d = {UD, CD, NUS, NCS};
    for (int it = 0; it < 300; it++) {
        int n = 1 + (int)(rnd() % MAXN), collide = it % 3;
        user u[MAXN];
        rs_row rows[MAXN];
        rs_span bags[MAXN][NUS];
        p.used = 0;
        rs_table *t = rs_table_new((size_t)n, &d, collide);
        assert_non_null(t);
        int want_ids = 0, ref[MAXN];
        for (int i = 0; i < n; i++) {
            random_user(&u[i]);
            as_row(&p, &u[i], &rows[i], bags[i]);
            int j = 0;
            while (j < i && !same_user(&u[j], &u[i])) j++;
            ref[i] = j < i ? ref[j] : want_ids++;
            assert_int_equal(rs_table_add(t, &rows[i]), ref[i]);
        }
        assert_int_equal(rs_table_count(t), (size_t)want_ids);
        for (int i = 0; i < n; i++) { /* each id's representative is its first row */
            int first = 0;
            while (ref[first] != ref[i]) first++;
            assert_ptr_equal(rs_table_rows(t)[ref[i]].dense, rows[first].dense);
        }
        rs_table_free(t);
    }
    /* A table at capacity refuses a new row and still finds an old one. */
    rs_table *t = rs_table_new(1, &d, 0);
    user a, b;
    random_user(&a);
    b = a;
    b.dense[0] = 5.0f;
    rs_row ra, rb;
    rs_span ba[NUS], bb[NUS];
    p.used = 0;
    as_row(&p, &a, &ra, ba);
    as_row(&p, &b, &rb, bb);
    assert_int_equal(rs_table_add(t, &ra), 0);
    assert_int_equal(rs_table_add(t, &rb), -1);
    assert_int_equal(rs_table_add(t, &ra), 0);
    rs_table_free(t);
}

/* Many users alike in everything the short hash reads (key, dense, bags,
 * history length and ends), apart only in a middle history id: each
 * distinct one gets its own id, every repeat finds it, in either
 * collide mode that leaves full hashes real. */
static void test_table_short_hash_alike(void **s)
{
    (void)s;
    enum { N = 3000, DISTINCT = 700, H = 64 };
    const rs_dims d = {UD, CD, NUS, NCS};
    static int64_t hist[N][H];
    static rs_row rows[N];
    static const rs_span bags[NUS];
    static const float dense[UD] = {1, 2, 3};
    for (int collide = 0; collide <= 2; collide += 2) {
        rs_table *t = rs_table_new(N, &d, collide);
        assert_non_null(t);
        for (int i = 0; i < N; i++) {
            for (int k = 0; k < H; k++) hist[i][k] = k;
            hist[i][H / 2] = 1000 + 3 * (i % DISTINCT);
            rows[i] = (rs_row){.key = "u", .dense = dense, .bags = bags, .hist = {hist[i], H}};
            assert_int_equal(rs_table_add(t, &rows[i]), i % DISTINCT);
        }
        assert_int_equal(rs_table_count(t), DISTINCT);
        rs_table_free(t);
    }
}

static void test_group_stable(void **s)
{
    (void)s;
    for (int it = 0; it < 200; it++) {
        size_t n = 1 + rnd() % 60, rows = 1 + rnd() % 8;
        int32_t row_of[64], order[64], map[64];
        for (size_t i = 0; i < n; i++) row_of[i] = (int32_t)(rnd() % rows);
        assert_int_equal(rs_group(row_of, n, rows, order, map), 0);
        size_t pos = 0;
        for (size_t r = 0; r < rows; r++) /* the reference: a pass per row */
            for (size_t i = 0; i < n; i++)
                if ((size_t)row_of[i] == r) {
                    assert_int_equal(order[pos], (int32_t)i);
                    assert_int_equal(map[pos], (int32_t)r);
                    pos++;
                }
        assert_int_equal(pos, n);
    }
}

static void test_assemble_and_read_back(void **s)
{
    (void)s;
    static pool p;
    const rs_dims d = {UD, CD, NUS, NCS};
    for (int it = 0; it < 100; it++) {
        p.used = 0;
        size_t U = 1 + rnd() % 6, C = 1 + rnd() % 20;
        user u[6];
        rs_row urows[6], crows[20];
        rs_span ubags[6][NUS], cbags[20][NCS];
        float cd[20][CD];
        int64_t cid[20][2];
        int32_t row_of[20], order[20], map[20];
        for (size_t j = 0; j < U; j++) {
            random_user(&u[j]);
            as_row(&p, &u[j], &urows[j], ubags[j]);
        }
        for (size_t i = 0; i < C; i++) {
            cd[i][0] = (float)i, cd[i][1] = -(float)i;
            size_t nb = rnd() % 3;
            cid[i][0] = (int64_t)i, cid[i][1] = 100 + (int64_t)i;
            cbags[i][0] = (rs_span){put(&p, cid[i], nb * 8), nb};
            crows[i] = (rs_row){.key = "", .dense = put(&p, cd[i], sizeof cd[i]), .bags = cbags[i]};
            row_of[i] = (int32_t)(rnd() % U);
        }
        assert_int_equal(rs_group(row_of, C, U, order, map), 0);
        rs_batch b;
        assert_int_equal(rs_assemble(&b, &d, urows, U, crows, order, C, map), 0);
        const ikbo_batch *x = &b.b;
        assert_int_equal(x->n_users, (int)U);
        assert_int_equal(x->n_cands, (int)C);
        int any_act = 0;
        for (size_t j = 0; j < U; j++) any_act |= u[j].nact != 0;
        assert_int_equal(x->hist_actions != NULL, any_act);
        for (size_t j = 0; j < U; j++) {
            assert_memory_equal(x->user_dense + j * UD, u[j].dense, sizeof u[j].dense);
            for (int f = 0; f < NUS; f++) {
                const ikbo_jagged *g = &x->user_sparse[f];
                assert_int_equal(g->offsets[j + 1] - g->offsets[j], (int64_t)u[j].nbag[f]);
                if (u[j].nbag[f])
                    assert_memory_equal(g->ids + g->offsets[j], u[j].bag[f], u[j].nbag[f] * 8);
            }
            int64_t h0 = x->hist.offsets[j];
            assert_int_equal(x->hist.offsets[j + 1] - h0, (int64_t)u[j].nhist);
            for (size_t k = 0; k < u[j].nhist; k++) {
                assert_int_equal(x->hist.ids[h0 + (int64_t)k], u[j].hist[k]);
                if (any_act)
                    assert_int_equal(x->hist_actions[h0 + (int64_t)k], u[j].nact ? u[j].act[k] : 0);
            }
            /* read back as a row: the same user */
            rs_row back;
            rs_span bb[NUS];
            rs_batch_user(x, &d, j, u[j].key, &back, bb);
            rs_table *t = rs_table_new(2, &d, 0);
            assert_int_equal(rs_table_add(t, &urows[j]), 0);
            assert_int_equal(rs_table_add(t, &back), 0);
            rs_table_free(t);
        }
        for (size_t k = 0; k < C; k++) {
            size_t i = (size_t)order[k];
            assert_int_equal(x->map[k], row_of[i]);
            assert_memory_equal(x->cand_dense + k * CD, cd[i], sizeof cd[i]);
            const ikbo_jagged *g = &x->cand_sparse[0];
            assert_int_equal(g->offsets[k + 1] - g->offsets[k], (int64_t)cbags[i][0].n);
            if (cbags[i][0].n) assert_memory_equal(g->ids + g->offsets[k], cid[i], cbags[i][0].n * 8);
            rs_row back;
            rs_span bb[NCS];
            rs_batch_cand(x, &d, k, &back, bb);
            assert_memory_equal(back.dense, cd[i], sizeof cd[i]);
            assert_int_equal(bb[0].n, cbags[i][0].n);
        }
        rs_batch_free(&b);
        rs_batch_free(&b); /* idempotent */
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table_against_loops),
        cmocka_unit_test(test_table_short_hash_alike),
        cmocka_unit_test(test_group_stable),
        cmocka_unit_test(test_assemble_and_read_back),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
