/* test_kernels_attention.c - the CPU backend's sequence attention ops
 * against naive double-precision loops.
 *
 * Why this exists: kernels/cpu/attention_cpu.c is the reference the CUDA
 * self_attention and din_attention kernels are checked against, so it is
 * checked here against the plainest loops written from backend.h's
 * contract: self_attention (softmax and silu, causal and full, uneven
 * lengths including 0 and 1, several heads, dh not a multiple of 8, the
 * fused target part equal to the attention op), din_attention (map and
 * identity, normalize on and off, every activation, empty histories), the
 * determinism rule (a user alone == the same user in a batch, bitwise) and
 * argument errors. Outputs are poisoned with NaN; relative error against
 * double.
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

#define KF_SEED 777ULL
#include "tests/unit/kernel_fixture.h"

/* ---- self_attention ---- */

static double silu_d(double x) { return x / (1.0 + exp(-x)); }

/* Rows [e0, e0 + n) of q attend to keys [k0, k0 + L) (row i: the first
 * lim(i) keys), one head at column ho. */
static void att_ref(const float *q, const float *k, const float *v, size_t hd, int ho, int dh,
                    int64_t qrow, int64_t k0, int L, int lim, enum bk_att_kind kind, double *o)
{
    double *s = malloc(((size_t)L + 1) * sizeof *s), mx = -INFINITY, sum = 0;
    for (int j = 0; j < lim; j++) {
        double d = 0;
        for (int e = 0; e < dh; e++)
            d += (double)q[(size_t)qrow * hd + ho + e] * k[(size_t)(k0 + j) * hd + ho + e];
        s[j] = d / sqrt((double)dh);
        mx = fmax(mx, s[j]);
    }
    for (int j = 0; j < lim; j++) {
        s[j] = kind == BK_ATT_SOFTMAX ? exp(s[j] - mx) : silu_d(s[j]);
        sum += s[j];
    }
    double div = kind == BK_ATT_SOFTMAX ? sum : (double)L;
    for (int e = 0; e < dh; e++) {
        double acc = 0;
        for (int j = 0; j < lim; j++) acc += s[j] * v[(size_t)(k0 + j) * hd + ho + e];
        o[(size_t)qrow * hd + ho + e] = lim ? acc / div : 0;
    }
    free(s);
}

static void self_case(int nu, int lmax, int heads, int dh, int causal, enum bk_att_kind kind,
                      int nc, int tq)
{
    int64_t *off = malloc(((size_t)nu + 1) * sizeof *off);
    off[0] = 0;
    for (int u = 0; u < nu; u++) {
        int L = irand(0, lmax);
        if (u == 0) L = 0;
        if (u == 1) L = 1;
        if (u == 2) L = lmax;
        off[u + 1] = off[u] + L;
    }
    const int64_t ev = off[nu];
    const size_t hd = (size_t)heads * dh;
    float *q = rnd((size_t)ev * hd, 1.5), *k = rnd((size_t)ev * hd, 1.5),
          *v = rnd((size_t)ev * hd, 1.0), *o = poisoned((size_t)ev * hd);
    double *ref = calloc((size_t)ev * hd + 1, sizeof *ref);
    int32_t *map = malloc(((size_t)nc + 1) * sizeof *map);
    for (int c = 0; c < nc; c++) map[c] = (int)((long)c * nu / nc);
    float *tqv = rnd((size_t)nc * tq * hd, 1.5), *to = poisoned((size_t)nc * tq * hd),
          *to2 = poisoned((size_t)nc * tq * hd);
    bk_seq_att a = {.k = k, .v = v, .offsets = off, .events = ev, .nu = nu, .heads = heads, .dh = dh,
                    .q = q, .o = o, .causal = causal, .kind = kind};
    if (nc) {
        a.tq = tqv;
        a.map = map;
        a.nc = nc;
        a.tq_tokens = tq;
        a.to = to;
    }
    assert_int_equal(be->self_attention(st, &a, &err), 0);
    for (int u = 0; u < nu; u++) {
        int L = (int)(off[u + 1] - off[u]);
        for (int i = 0; i < L; i++)
            for (int h = 0; h < heads; h++)
                att_ref(q, k, v, hd, h * dh, dh, off[u] + i, off[u], L, causal ? i + 1 : L, kind,
                        ref);
    }
    char what[128];
    snprintf(what, sizeof what, "self_attention nu %d lmax %d H %d dh %d causal %d kind %d", nu,
             lmax, heads, dh, causal, (int)kind);
    check(what, o, ref, (size_t)ev * hd, 2e-5);
    if (nc) {
        /* The fused target part equals the attention op, bitwise. */
        assert_int_equal(be->attention(st, tqv, k, v, heads * dh, off, nu, map, nc, tq, heads, dh, to2,
                                       (int64_t)tq * heads * dh, &err), 0);
        assert_memory_equal(to, to2, (size_t)nc * tq * hd * sizeof(float));
    }
    free(off), free(q), free(k), free(v), free(o), free(ref), free(map), free(tqv), free(to),
        free(to2);
}

static void test_self_attention(void **state)
{
    (void)state;
    for (int kind = 0; kind < 2; kind++)
        for (int causal = 0; causal < 2; causal++) {
            self_case(5, 40, 2, 8, causal, (enum bk_att_kind)kind, 0, 0);
            self_case(4, 9, 1, 5, causal, (enum bk_att_kind)kind, 7, 2);
            self_case(3, 130, 3, 16, causal, (enum bk_att_kind)kind, 3, 1);
        }
}

/* A user's rows alone == the same user's rows among others, bitwise. */
static void test_self_attention_user_alone(void **state)
{
    (void)state;
    const int heads = 2, dh = 8, hd = heads * dh;
    int64_t off[4] = {0, 13, 50, 57};
    const int64_t ev = off[3];
    float *q = rnd((size_t)ev * hd, 1), *k = rnd((size_t)ev * hd, 1), *v = rnd((size_t)ev * hd, 1);
    float *o = poisoned((size_t)ev * hd), *o1 = poisoned((size_t)37 * hd);
    for (int kind = 0; kind < 2; kind++) {
        bk_seq_att a = {.k = k, .v = v, .offsets = off, .events = ev, .nu = 3, .heads = heads, .dh = dh,
                        .q = q, .o = o, .causal = 1, .kind = (enum bk_att_kind)kind};
        assert_int_equal(be->self_attention(st, &a, &err), 0);
        int64_t off1[2] = {0, 37};
        bk_seq_att b = {.k = k + 13 * hd, .v = v + 13 * hd, .offsets = off1, .events = 37, .nu = 1,
                        .heads = heads, .dh = dh, .q = q + 13 * hd, .o = o1, .causal = 1,
                        .kind = (enum bk_att_kind)kind};
        assert_int_equal(be->self_attention(st, &b, &err), 0);
        assert_memory_equal(o + 13 * hd, o1, (size_t)37 * hd * sizeof(float));
    }
    free(q), free(k), free(v), free(o), free(o1);
}

/* ---- din_attention ---- */

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

static void din_case(int n, int nu, int lmax, int d, int h1, int use_map, int norm, enum bk_act act)
{
    if (!use_map) nu = n;
    int64_t *off = malloc(((size_t)nu + 1) * sizeof *off);
    off[0] = 0;
    for (int u = 0; u < nu; u++) off[u + 1] = off[u] + (u == 0 ? 0 : u == 1 ? 1 : irand(0, lmax));
    int32_t *map = malloc(((size_t)n + 1) * sizeof *map);
    for (int r = 0; r < n; r++) map[r] = irand(0, nu - 1); /* any map, not only grouped */
    const int64_t ev = off[nu];
    float *q = rnd((size_t)n * d, 1), *qp = rnd((size_t)n * h1, 1), *h = rnd((size_t)ev * d, 1),
          *hp = rnd((size_t)ev * h1, 1), *wm = rnd((size_t)h1 * d, 0.5), *w2 = rnd(h1, 0.7),
          *b2 = rnd(1, 1), *out = poisoned((size_t)n * d);
    bk_weight *Wm = be->weight_new(be, wm, h1, d, &err), *W2 = be->weight_new(be, w2, 1, h1, &err),
              *B2 = be->weight_new(be, b2, 1, 1, &err);
    assert_non_null(Wm);
    assert_int_equal(be->din_attention(st, q, qp, h, hp, off, use_map ? map : NULL, n, d, h1, Wm,
                                       W2, B2, act, norm, out, &err),
                     0);
    double *ref = calloc((size_t)n * d, sizeof *ref);
    for (int r = 0; r < n; r++) {
        int u = use_map ? map[r] : r;
        int L = (int)(off[u + 1] - off[u]);
        double *s = malloc(((size_t)L + 1) * sizeof *s), mx = -INFINITY, sum = 0;
        for (int j = 0; j < L; j++) {
            const float *hj = h + (size_t)(off[u] + j) * d;
            double sc = b2[0];
            for (int k = 0; k < h1; k++) {
                double pre = (double)qp[(size_t)r * h1 + k] + hp[(size_t)(off[u] + j) * h1 + k];
                for (int e = 0; e < d; e++)
                    pre += (double)wm[(size_t)k * d + e] * q[(size_t)r * d + e] * hj[e];
                sc += w2[k] * act_ref(pre, act);
            }
            s[j] = sc;
            mx = fmax(mx, sc);
        }
        for (int j = 0; j < L && norm; j++) sum += (s[j] = exp(s[j] - mx));
        for (int j = 0; j < L; j++)
            for (int e = 0; e < d; e++)
                ref[(size_t)r * d + e] += (norm ? s[j] / sum : s[j]) * h[(size_t)(off[u] + j) * d + e];
        free(s);
    }
    char what[128];
    snprintf(what, sizeof what, "din n %d d %d h1 %d map %d norm %d act %d", n, d, h1, use_map,
             norm, (int)act);
    check(what, out, ref, (size_t)n * d, 2e-5);
    be->weight_free(be, Wm), be->weight_free(be, W2), be->weight_free(be, B2);
    free(off), free(map), free(q), free(qp), free(h), free(hp), free(wm), free(w2), free(b2),
        free(out), free(ref);
}

static void test_din_attention(void **state)
{
    (void)state;
    for (int a = BK_ACT_NONE; a < BK_ACT_COUNT; a++)
        din_case(9, 4, 12, 6, 5, 1, a & 1, (enum bk_act)a);
    din_case(1, 1, 30, 16, 8, 0, 1, BK_ACT_RELU);
    din_case(40, 6, 70, 32, 20, 1, 1, BK_ACT_SIGMOID);
    din_case(12, 12, 20, 8, 3, 0, 0, BK_ACT_RELU);
}

static void test_errors(void **state)
{
    (void)state;
    int64_t off[3] = {0, 2, 1}; /* decreasing */
    float x[64] = {0};
    bk_seq_att a = {.k = x, .v = x, .offsets = off, .nu = 2, .heads = 1, .dh = 4, .q = x, .o = x,
                    .causal = 1};
    assert_int_equal(be->self_attention(st, &a, &err), -1);
    assert_non_null(strstr(err.msg, "self_attention: offsets decrease"));
    int64_t ok[2] = {0, 2};
    a.offsets = ok;
    a.nu = 1;
    assert_int_equal(be->self_attention(st, &a, &err), -1); /* events 0 != 2 */
    assert_non_null(strstr(err.msg, "events 0 but offsets end at 2"));
    a.events = 2;
    a.kind = (enum bk_att_kind)7;
    assert_int_equal(be->self_attention(st, &a, &err), -1);
    assert_non_null(strstr(err.msg, "unknown kind"));
    a.kind = BK_ATT_SOFTMAX;
    a.heads = 0;
    assert_int_equal(be->self_attention(st, &a, &err), -1);
    assert_non_null(strstr(err.msg, "bad sizes"));
    a.heads = 1;
    int32_t map[2] = {0, 3};
    a.tq = x, a.map = map, a.nc = 2, a.tq_tokens = 1, a.to = x;
    assert_int_equal(be->self_attention(st, &a, &err), -1);
    assert_non_null(strstr(err.msg, "self_attention"));

    float w[16] = {0};
    bk_weight *Wm = be->weight_new(be, w, 2, 4, &err), *W2 = be->weight_new(be, w, 1, 3, &err),
              *B2 = be->weight_new(be, w, 1, 1, &err);
    assert_int_equal(be->din_attention(st, x, x, x, x, ok, NULL, 1, 4, 2, Wm, W2, B2, BK_ACT_RELU,
                                       1, x, &err),
                     -1);
    assert_non_null(strstr(err.msg, "din_attention: weights"));
    int32_t bad[1] = {-1};
    assert_int_equal(be->din_attention(st, x, x, x, x, ok, bad, 1, 4, 3, Wm, W2, B2, BK_ACT_RELU,
                                       1, x, &err),
                     -1);
    be->weight_free(be, Wm), be->weight_free(be, W2), be->weight_free(be, B2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_self_attention),
        cmocka_unit_test(test_self_attention_user_alone),
        cmocka_unit_test(test_din_attention),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
