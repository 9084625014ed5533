/* test_kernels_rank.c - the CPU backend's ranking ops against naive
 * double-precision loops.
 *
 * Why this exists: kernels/cpu/rank_cpu.c is the reference the CUDA twins
 * are checked against, so it is checked here against the plainest possible
 * loops written from backend.h's contract: pool (four fns, jagged and
 * tokens, empty segments), activation, layer_norm, mul (map, addend),
 * token_linear, dot_interaction (interleaved user/candidate orders, self on
 * and off, K = 1 and 2, uu given vs not), mixture (1 expert and many). Random
 * shapes, outputs poisoned with NaN, relative error against double. Plus the
 * determinism rule (a row alone == the same row in a batch, bitwise) and
 * error paths.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define KF_SEED 12345ULL
#include "tests/unit/kernel_fixture.h"

static bk_weight *weight(const float *w, int rows, int cols)
{
    bk_weight *h = be->weight_new(be, w, rows, cols, &err);
    assert_non_null(h);
    return h;
}

/* ---- pool ---- */

static void pool_ref(const float *x, int64_t beg, int64_t cnt, int d, enum bk_pool fn, double *o)
{
    for (int j = 0; j < d; j++) {
        double v = 0;
        if (cnt > 0) {
            v = fn == BK_POOL_MAX ? -INFINITY : 0;
            for (int64_t e = 0; e < cnt; e++) {
                double xv = x[(size_t)(beg + e) * d + j];
                v = fn == BK_POOL_MAX ? fmax(v, xv) : v + xv;
            }
            if (fn == BK_POOL_MEAN) v /= (double)cnt;
            if (fn == BK_POOL_LAST) v = x[(size_t)(beg + cnt - 1) * d + j];
        }
        o[j] = v;
    }
}

static void test_pool(void **state)
{
    (void)state;
    for (int it = 0; it < 48; it++) {
        enum bk_pool fn = (enum bk_pool)(it % 4);
        int n = it % 5 == 0 ? 1 : irand(1, 40), d = irand(1, 33), jag = it % 2, k = irand(1, 9);
        int64_t *off = malloc(sizeof(int64_t) * (size_t)(n + 1));
        off[0] = 0;
        for (int r = 0; r < n; r++) off[r + 1] = off[r] + (jag ? (r % 3 == 0 ? 0 : irand(0, 12)) : k);
        size_t ne = (size_t)off[n];
        float *x = rnd(ne * d, 3.0), *out = poisoned((size_t)n * d);
        if (fn == BK_POOL_MAX) for (size_t i = 0; i < ne * d; i++) x[i] = -fabsf(x[i]) - 1; /* all negative */
        double *ref = malloc(sizeof(double) * (size_t)n * d);
        for (int r = 0; r < n; r++) pool_ref(x, off[r], off[r + 1] - off[r], d, fn, ref + (size_t)r * d);
        assert_int_equal(be->pool(st, x, jag ? off : NULL, n, jag ? 0 : k, d, fn, out, d, &err), 0);
        check("pool", out, ref, (size_t)n * d, 1e-6);
        /* Into a wider row (a stack's columns): the same values, the rest untouched. */
        int ld = d + it % 7;
        float *wide = poisoned((size_t)n * ld);
        assert_int_equal(be->pool(st, x, jag ? off : NULL, n, jag ? 0 : k, d, fn, wide, ld, &err), 0);
        for (int r = 0; r < n; r++) {
            assert_memory_equal(wide + (size_t)r * ld, out + (size_t)r * d, sizeof(float) * d);
            for (int j = d; j < ld; j++) assert_true(isnan(wide[(size_t)r * ld + j]));
        }
        free(wide);
        free(x); free(out); free(ref); free(off);
    }
}

/* ---- activation, layer_norm ---- */

static double act_ref(double v, enum bk_act a)
{
    switch (a) {
    case BK_ACT_RELU: return v < 0 ? 0 : v;
    case BK_ACT_SIGMOID: return 1 / (1 + exp(-v));
    case BK_ACT_GELU: return 0.5 * v * (1 + erf(v / sqrt(2.0)));
    case BK_ACT_SILU: return v / (1 + exp(-v));
    case BK_ACT_TANH: return tanh(v);
    default: return v;
    }
}

static void test_activation_and_layer_norm(void **state)
{
    (void)state;
    for (int a = BK_ACT_RELU; a < BK_ACT_COUNT; a++) {
        size_t n = (size_t)irand(1, 3000);
        float *x = rnd(n, 6.0), *out = poisoned(n);
        double *ref = malloc(sizeof(double) * n);
        for (size_t i = 0; i < n; i++) ref[i] = act_ref(x[i], (enum bk_act)a);
        assert_int_equal(be->activation(st, x, n, (enum bk_act)a, out, &err), 0);
        check("activation", out, ref, n, 2e-6);
        assert_int_equal(be->activation(st, x, n, (enum bk_act)a, x, &err), 0); /* in place */
        assert_memory_equal(x, out, n * sizeof(float));
        free(x); free(out); free(ref);
    }
    /* gelu element by element on its negative tail, where 1 + erf cancels. */
    float xs[64], ys[64];
    for (int i = 0; i < 64; i++) xs[i] = -2.0f - 3.0f * (float)i / 64; /* down to -5 */
    assert_int_equal(be->activation(st, xs, 64, BK_ACT_GELU, ys, &err), 0);
    for (int i = 0; i < 64; i++) {
        double r = act_ref(xs[i], BK_ACT_GELU);
        if (fabs(ys[i] - r) > 5e-5 * fabs(r)) /* 1 + erff: 2e-4 at -3.6, 100% at -7 */ fail_msg("gelu(%g) = %g, expected %g", xs[i], ys[i], r);
    }
    for (int it = 0; it < 20; it++) {
        int rows = it == 0 ? 1 : irand(1, 50), dim = it == 1 ? 1 : irand(1, 200);
        float eps = it % 2 ? 1e-5f : 1e-3f;
        float *x = rnd((size_t)rows * dim, 4.0), *out = poisoned((size_t)rows * dim);
        if (it == 2) for (int j = 0; j < dim; j++) x[j] = 0.75f; /* a constant row */
        float *w = rnd((size_t)dim, 1.0), *b = rnd((size_t)dim, 1.0);
        bk_weight *hw = weight(w, 1, dim), *hb = weight(b, 1, dim);
        double *ref = malloc(sizeof(double) * (size_t)rows * dim);
        for (int r = 0; r < rows; r++) {
            const float *xr = x + (size_t)r * dim;
            double m = 0, v = 0;
            for (int j = 0; j < dim; j++) m += xr[j];
            m /= dim;
            for (int j = 0; j < dim; j++) v += (xr[j] - m) * (xr[j] - m);
            v /= dim;
            for (int j = 0; j < dim; j++) ref[(size_t)r * dim + j] = (xr[j] - m) / sqrt(v + eps) * w[j] + b[j];
        }
        assert_int_equal(be->layer_norm(st, x, rows, dim, hw, hb, eps, out, &err), 0);
        check("layer_norm", out, ref, (size_t)rows * dim, 2e-5);
        be->weight_free(be, hw);
        be->weight_free(be, hb);
        free(x); free(out); free(ref); free(w); free(b);
    }
}

/* ---- mul ---- */

static void test_mul(void **state)
{
    (void)state;
    for (int it = 0; it < 16; it++) {
        int nu = it % 4 == 0 ? 1 : irand(1, 6), per = it % 3 == 0 ? 1000 : irand(1, 20);
        int n = nu * per, width = irand(1, 40), use_map = it % 2, add = it % 4 >= 2;
        int32_t *map = malloc(sizeof(int32_t) * (size_t)n);
        for (int c = 0; c < n; c++) map[c] = c / per;
        float *a = rnd((size_t)n * width, 2.0), *b = rnd((size_t)(use_map ? nu : n) * width, 2.0);
        float *cc = add ? rnd((size_t)n * width, 2.0) : NULL, *out = poisoned((size_t)n * width);
        double *ref = malloc(sizeof(double) * (size_t)n * width);
        for (int r = 0; r < n; r++)
            for (int j = 0; j < width; j++) {
                size_t i = (size_t)r * width + j;
                ref[i] = (double)a[i] * b[(size_t)(use_map ? map[r] : r) * width + j] + (add ? cc[i] : 0);
            }
        assert_int_equal(be->mul(st, a, b, use_map ? map : NULL, cc, n, width, out, &err), 0);
        check("mul", out, ref, (size_t)n * width, 1e-6);
        free(a); free(b); free(cc); free(out); free(ref); free(map);
    }
}

/* ---- token_linear ---- */

static void test_token_linear(void **state)
{
    (void)state;
    for (int it = 0; it < 16; it++) {
        int rows = it == 0 ? 1 : irand(1, 30), k = it == 1 ? 1 : irand(1, 20), m = irand(1, 12), d = irand(1, 40);
        float *x = rnd((size_t)rows * k * d, 2.0), *w = rnd((size_t)m * k, 1.0), *z = poisoned((size_t)rows * m * d);
        bk_weight *hw = weight(w, m, k);
        double *ref = calloc((size_t)rows * m * d, sizeof(double));
        for (int r = 0; r < rows; r++)
            for (int i = 0; i < m; i++)
                for (int t = 0; t < k; t++)
                    for (int j = 0; j < d; j++)
                        ref[((size_t)r * m + i) * d + j] += (double)w[i * k + t] * x[((size_t)r * k + t) * d + j];
        assert_int_equal(be->token_linear(st, x, rows, hw, k, m, d, z, &err), 0);
        check("token_linear", z, ref, (size_t)rows * m * d, 1e-5);
        be->weight_free(be, hw);
        free(x); free(w); free(z); free(ref);
    }
}

/* ---- dot_interaction ---- */

/* A random interleaving of ku user and kc candidate tokens. */
static void random_order(bk_dot_order *o, int ku, int kc)
{
    memset(o, 0, sizeof *o);
    o->ku = ku;
    o->kc = kc;
    int iu = 0, ic = 0;
    for (int p = 0; p < ku + kc; p++) {
        int user = ic == kc || (iu < ku && frand() < 0);
        if (user) o->pos[iu++] = (uint16_t)p;
        else o->pos[ku + ic++] = (uint16_t)p;
    }
}

static void dot_ref(const float *tu, const float *tc, const int32_t *map, int n, const bk_dot_order *o,
                    int d, int self, double *ref)
{
    int K = o->ku + o->kc;
    const float *tok[BK_DOT_MAX_TOKENS];
    size_t q = 0;
    for (int r = 0; r < n; r++) {
        for (int t = 0; t < K; t++)
            tok[o->pos[t]] = t < o->ku ? tu + ((size_t)(map ? map[r] : r) * o->ku + t) * d
                                       : tc + ((size_t)r * o->kc + (t - o->ku)) * d;
        for (int i = 0; i < K; i++)
            for (int j = self ? i : i + 1; j < K; j++) {
                double s = 0;
                for (int e = 0; e < d; e++) s += (double)tok[i][e] * tok[j][e];
                ref[q++] = s;
            }
    }
}

static void test_dot_interaction(void **state)
{
    (void)state;
    for (int it = 0; it < 40; it++) {
        int self = it % 2, ku = irand(0, 6), kc = irand(0, 6);
        if (it < 4) { ku = it < 2; kc = it < 2 ? 0 : 1 + (it == 3); } /* K = 1 (self), K = 1..2 */
        if (ku + kc < (self ? 1 : 2)) kc = (self ? 1 : 2) - ku;
        int nu = it % 5 == 0 ? 1 : irand(1, 5), per = it % 7 == 0 ? 1000 : irand(1, 9), n = nu * per;
        int d = irand(1, 24), K = ku + kc;
        size_t P = self ? (size_t)K * (K + 1) / 2 : (size_t)K * (K - 1) / 2;
        size_t Pu = self ? (size_t)ku * (ku + 1) / 2 : (size_t)ku * (ku - 1) / 2;
        bk_dot_order o, uo;
        random_order(&o, ku, kc);
        memset(&uo, 0, sizeof uo);
        uo.ku = ku;
        for (int t = 0; t < ku; t++) uo.pos[t] = (uint16_t)t;
        int32_t *map = malloc(sizeof(int32_t) * (size_t)n);
        for (int c = 0; c < n; c++) map[c] = c / per;
        float *tu = rnd((size_t)nu * ku * d + 1, 2.0), *tc = rnd((size_t)n * kc * d + 1, 2.0);
        float *out = poisoned((size_t)n * P + 1), *out2 = poisoned((size_t)n * P + 1);
        float *uu = poisoned(Pu * nu + 1);
        double *ref = malloc(sizeof(double) * ((size_t)n * P + 1));
        dot_ref(tu, tc, map, n, &o, d, self, ref);
        assert_int_equal(be->dot_interaction(st, tu, NULL, map, kc ? tc : NULL, n, &o, d, self, out, &err), 0);
        check("dot_interaction", out, ref, (size_t)n * P, 1e-6);
        if (Pu > 0) { /* user-user pairs once per user, then copied: bitwise the same */
            assert_int_equal(be->dot_interaction(st, tu, NULL, NULL, NULL, nu, &uo, d, self, uu, &err), 0);
            assert_int_equal(be->dot_interaction(st, tu, uu, map, kc ? tc : NULL, n, &o, d, self, out2, &err), 0);
            assert_memory_equal(out, out2, (size_t)n * P * sizeof(float));
        }
        free(map); free(tu); free(tc); free(out); free(out2); free(uu); free(ref);
    }
}

/* ---- mixture ---- */

static void test_mixture(void **state)
{
    (void)state;
    for (int it = 0; it < 16; it++) {
        int E = it == 0 ? 1 : it == 1 ? BK_MIX_MAX_EXPERTS : irand(1, 8), n = irand(1, 40), F = irand(1, 30);
        float *ex[BK_MIX_MAX_EXPERTS];
        for (int e = 0; e < E; e++) ex[e] = rnd((size_t)n * F, 2.0);
        float *g = rnd((size_t)n * E, 8.0), *out = poisoned((size_t)n * F);
        double *ref = malloc(sizeof(double) * (size_t)n * F);
        for (int r = 0; r < n; r++) {
            double mx = -INFINITY, s = 0, w[BK_MIX_MAX_EXPERTS];
            for (int e = 0; e < E; e++) mx = fmax(mx, g[r * E + e]);
            for (int e = 0; e < E; e++) s += (w[e] = exp(g[r * E + e] - mx));
            for (int j = 0; j < F; j++) {
                double v = 0;
                for (int e = 0; e < E; e++) v += w[e] / s * ex[e][(size_t)r * F + j];
                ref[(size_t)r * F + j] = v;
            }
        }
        assert_int_equal(be->mixture(st, (const void *const *)ex, E, g, n, F, out, &err), 0);
        check("mixture", out, ref, (size_t)n * F, 1e-5);
        for (int e = 0; e < E; e++) free(ex[e]);
        free(g); free(out); free(ref);
    }
}

/* ---- determinism and errors ---- */

/* A row's result is bitwise the same alone and inside a larger batch. */
static void test_row_alone_equals_row_in_batch(void **state)
{
    (void)state;
    int n = 37, d = 13, E = 3;
    float *x = rnd((size_t)n * d, 3.0), *g = rnd((size_t)n * E, 3.0);
    float *all = poisoned((size_t)n * d), *one = poisoned((size_t)d);
    float *w = rnd((size_t)d, 1.0), *b = rnd((size_t)d, 1.0);
    bk_weight *hw = weight(w, 1, d), *hb = weight(b, 1, d);
    assert_int_equal(be->layer_norm(st, x, n, d, hw, hb, 1e-5f, all, &err), 0);
    assert_int_equal(be->layer_norm(st, x + 20 * d, 1, d, hw, hb, 1e-5f, one, &err), 0);
    assert_memory_equal(one, all + 20 * d, (size_t)d * sizeof(float));
    const void *ex[3] = {x, x, x};
    assert_int_equal(be->mixture(st, ex, E, g, n, d, all, &err), 0);
    const void *ex1[3] = {x + 5 * d, x + 5 * d, x + 5 * d};
    assert_int_equal(be->mixture(st, ex1, E, g + 5 * E, 1, d, one, &err), 0);
    assert_memory_equal(one, all + 5 * d, (size_t)d * sizeof(float));
    be->weight_free(be, hw);
    be->weight_free(be, hb);
    free(x); free(g); free(all); free(one); free(w); free(b);
}

static void test_errors(void **state)
{
    (void)state;
    float buf[64] = {0};
    int64_t bad_off[3] = {0, 4, 2};
    int32_t map[2] = {0, 5};
    bk_dot_order o = {.ku = 1, .kc = 1, .pos = {0, 0}};
    assert_int_equal(be->pool(st, buf, bad_off, 2, 0, 2, BK_POOL_MAX, buf, 2, &err), -1);
    assert_non_null(strstr(err.msg, "pool: offsets decrease"));
    assert_int_equal(be->pool(st, buf, NULL, 2, 1, 2, (enum bk_pool)9, buf, 2, &err), -1);
    assert_non_null(strstr(err.msg, "pool: bad fn"));
    assert_int_equal(be->pool(st, buf, NULL, 2, 1, 2, BK_POOL_SUM, buf + 32, 1, &err), -1);
    assert_non_null(strstr(err.msg, "row stride"));
    assert_int_equal(be->activation(st, buf, 4, BK_ACT_NONE, buf, &err), -1);
    assert_int_equal(be->mul(st, buf, buf, map, NULL, 2, 2, buf, &err), 0); /* nu unknown: map[1] = 5 allowed */
    map[1] = -1;
    assert_int_equal(be->mul(st, buf, buf, map, NULL, 2, 2, buf, &err), -1);
    assert_non_null(strstr(err.msg, "mul: map[1]"));
    assert_int_equal(be->dot_interaction(st, buf, NULL, NULL, buf, 1, &o, 2, 0, buf, &err), -1);
    assert_non_null(strstr(err.msg, "not a permutation"));
    o.kc = 300;
    assert_int_equal(be->dot_interaction(st, buf, NULL, NULL, buf, 1, &o, 2, 0, buf, &err), -1);
    assert_non_null(strstr(err.msg, "bad token counts"));
    const void *ex[1] = {NULL};
    assert_int_equal(be->mixture(st, ex, 1, buf, 1, 2, buf, &err), -1);
    assert_non_null(strstr(err.msg, "expert 0 is NULL"));
    assert_int_equal(be->mixture(st, ex, BK_MIX_MAX_EXPERTS + 1, buf, 1, 2, buf, &err), -1);
    assert_int_equal(be->layer_norm(st, buf, 1, 2, NULL, NULL, 1e-5f, buf, &err), -1);
    assert_int_equal(be->token_linear(st, buf, 1, NULL, 0, 1, 1, buf, &err), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool),
        cmocka_unit_test(test_activation_and_layer_norm),
        cmocka_unit_test(test_mul),
        cmocka_unit_test(test_token_linear),
        cmocka_unit_test(test_dot_interaction),
        cmocka_unit_test(test_mixture),
        cmocka_unit_test(test_row_alone_equals_row_in_batch),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
