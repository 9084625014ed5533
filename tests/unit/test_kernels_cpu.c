/* test_kernels_cpu.c - unit tests of the CPU backend (kernels/cpu) through
 * the op table of kernels/backend.h.
 *
 * Why this exists: every model score the server returns is computed by these
 * ops, and the CPU backend is the reference the CUDA backend and the engine
 * are compared with. Each op is checked against a naive loop written here in
 * double precision, on random shapes from a seeded RNG (a fresh seed per
 * case, printed on failure; IKBO_TEST_SEED=<n> changes the base seed), with
 * outputs poisoned with NaN before every run so an element the op forgets to
 * write fails, and padding it must not write is checked to still hold the
 * poison. The tests use only the table (upload, download, alloc), so they can
 * be pointed at another backend.
 *
 * Tolerance: an element of a fp32 sum of n terms computed in any order
 * differs from the exact sum by at most gamma_n * sum|terms|, gamma_n ~ n*u
 * with u = 2^-24 (Higham, "Accuracy and Stability of Numerical Algorithms",
 * sec. 3.1; products add one more u each). Each double reference therefore
 * also computes mag = sum|terms| and an element passes when
 *     |got - ref| <= 2 * (n + 2) * u * mag
 * i.e. twice the worst-case bound. This is far tighter than a fixed relative
 * tolerance where it matters (an element that should be 0 from cancelling
 * terms must be ~u*mag, not 1e-3) and still safe for any K: a dropped or
 * doubled term of size t changes the result by t, more than the bound for
 * n < ~2800 uniformly sized terms. Attention and the composed target-attention
 * test state their own bounds where they are computed.
 *
 * Determinism is checked bitwise (memcmp): a row scored alone and inside a
 * batch of 37 rows at another position, and lce/attention through the map
 * versus the broadcast baseline (gathered inputs, identity map).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../kernels/backend.h"
#include "../../kernels/cpu/cpu_internal.h" /* cpu_softmax_row: its exp is an approximation */

#define U32 (1.0 / 16777216.0) /* unit roundoff of fp32, 2^-24 */
#define MAXBUF 64

/* ---- fixture: a backend, a stream, tracked buffers, the case's seed ---- */

typedef struct buf {
    void *p;
    size_t bytes;
    enum bk_tag tag;
} buf;

typedef struct T {
    bk_backend *be;
    bk_stream *s;
    bk_err err;
    uint64_t base_seed, rng;
    char ctx[200]; /* current case, printed with every failure */
    buf bufs[MAXBUF];
    int nbufs;
    bk_weight *weights[MAXBUF];
    int nweights;
} T;

#define OK(t, call)                                                                       \
    do {                                                                                  \
        if ((call) != 0)                                                                  \
            fail_msg("%s failed: %s [%s]", #call, (t)->err.msg, (t)->ctx);                \
    } while (0)

static uint64_t splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Start case `i` of test `name`: its own seed, derived from the base seed. */
static void new_case(T *t, const char *name, int i)
{
    uint64_t h = t->base_seed ^ ((uint64_t)i * 0x2545F4914F6CDD1Dull);
    for (const char *c = name; *c; c++)
        h = (h ^ (uint8_t)*c) * 0x100000001B3ull;
    uint64_t x = h;
    t->rng = splitmix(&x);
    snprintf(t->ctx, sizeof t->ctx, "%s case %d, rng state 0x%016" PRIx64, name, i, t->rng);
}

static uint64_t rnd(T *t) { return splitmix(&t->rng); }
/* Uniform int in [lo, hi]. */
static int rint_(T *t, int lo, int hi) { return lo + (int)(rnd(t) % (uint64_t)(hi - lo + 1)); }
/* Uniform float in [-1, 1). */
static float rflt(T *t) { return (float)((double)(rnd(t) >> 40) / (double)(1ull << 23) - 1.0); }

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    assert_non_null(p);
    return p;
}

static float *rand_floats(T *t, size_t n, float scale)
{
    float *p = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        p[i] = rflt(t) * scale;
    return p;
}

static double *dvec(size_t n) { return calloc(n ? n : 1, sizeof(double)); }

static void *dalloc(T *t, size_t bytes, enum bk_tag tag)
{
    assert_true(t->nbufs < MAXBUF);
    void *p = t->be->alloc(t->be, bytes, tag, &t->err);
    if (!p)
        fail_msg("alloc %zu: %s", bytes, t->err.msg);
    t->bufs[t->nbufs++] = (buf){p, bytes, tag};
    return p;
}

static void *dfloats(T *t, const float *host, size_t n, enum bk_tag tag)
{
    void *p = dalloc(t, n * sizeof(float), tag);
    OK(t, t->be->upload_f32(t->s, p, host, n, &t->err));
    return p;
}

static void *dbytes(T *t, const void *host, size_t bytes)
{
    void *p = dalloc(t, bytes, BK_TAG_INDEX);
    OK(t, t->be->upload(t->s, p, host, bytes, &t->err));
    return p;
}

static const uint32_t POISON = 0x7fc0deadu; /* a quiet NaN with a payload */

static float poison_f(void)
{
    float f;
    memcpy(&f, &POISON, sizeof f);
    return f;
}

/* An output buffer of n floats, filled with the poison NaN. */
static void *dpoisoned(T *t, size_t n, enum bk_tag tag)
{
    float *h = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        h[i] = poison_f();
    void *p = dfloats(t, h, n, tag);
    free(h);
    return p;
}

static float *download(T *t, const void *dev, size_t n)
{
    float *h = xmalloc(n * sizeof(float));
    OK(t, t->be->download_f32(t->s, h, dev, n, &t->err));
    OK(t, t->be->sync(t->s, &t->err));
    return h;
}

/* End of a case: free its buffers and weights (also run by teardown, so a
 * failed case does not report leaks on top of its failure). */
static void free_bufs(T *t)
{
    for (int i = t->nbufs - 1; i >= 0; i--)
        t->be->free(t->be, t->bufs[i].p, t->bufs[i].bytes, t->bufs[i].tag);
    t->nbufs = 0;
    for (int i = t->nweights - 1; i >= 0; i--)
        t->be->weight_free(t->be, t->weights[i]);
    t->nweights = 0;
}

static bk_weight *wnew(T *t, const float *w, int rows, int cols)
{
    assert_true(t->nweights < MAXBUF);
    bk_weight *h = t->be->weight_new(t->be, w, rows, cols, &t->err);
    if (!h)
        fail_msg("weight_new [%d, %d]: %s", rows, cols, t->err.msg);
    t->weights[t->nweights++] = h;
    return h;
}

/* Free one weight now (the weight accounting test). */
static void wdrop(T *t, bk_weight *h)
{
    for (int i = 0; i < t->nweights; i++)
        if (t->weights[i] == h) {
            t->weights[i] = t->weights[--t->nweights];
            break;
        }
    t->be->weight_free(t->be, h);
}

static int is_poison(float f)
{
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    return b == POISON;
}

/* got[r*ld + j] vs ref[r*width + j] within allow[...] for j < width; columns
 * width..ld-1 must still hold the poison. */
static void check_rows(T *t, const char *what, const float *got, int ld, const double *ref,
                       const double *allow, size_t rows, int width)
{
    for (size_t r = 0; r < rows; r++) {
        for (int j = 0; j < width; j++) {
            double g = got[r * (size_t)ld + j], e = ref[r * (size_t)width + j];
            double a = allow[r * (size_t)width + j];
            if (!(fabs(g - e) <= a))
                fail_msg("%s[%zu][%d] = %.9g, reference %.9g, |diff| %.3g > allowed %.3g [%s]",
                         what, r, j, g, e, fabs(g - e), a, t->ctx);
        }
        for (int j = width; j < ld; j++)
            if (!is_poison(got[r * (size_t)ld + j]))
                fail_msg("%s[%zu][%d]: padding column was written [%s]", what, r, j, t->ctx);
    }
}

static int setup(void **state)
{
    T *t = calloc(1, sizeof *t);
    if (!t)
        return -1;
    const char *env = getenv("IKBO_TEST_SEED");
    t->base_seed = env ? strtoull(env, NULL, 0) : 20241129u;
    t->be = bk_backend_new("cpu", &t->err);
    if (!t->be)
        return -1;
    t->s = t->be->stream_new(t->be, &t->err);
    if (!t->s)
        return -1;
    *state = t;
    return 0;
}

/* Every test frees what it allocated: afterwards no bytes may be live. */
static int teardown(void **state)
{
    T *t = *state;
    free_bufs(t);
    bk_stats st;
    t->be->get_stats(t->be, &st);
    int leaked = 0;
    for (int i = 0; i < BK_TAG_COUNT; i++)
        if (st.bytes_live[i]) {
            print_error("tag %d: %zu bytes still live after the test\n", i, st.bytes_live[i]);
            leaked = 1;
        }
    if (st.weight_bytes) {
        print_error("%zu weight bytes still held after the test\n", st.weight_bytes);
        leaked = 1;
    }
    t->be->stream_free(t->s);
    t->be->destroy(t->be);
    free(t);
    return leaked ? -1 : 0;
}

/* ---- references (double precision, naive loops) ---- */

/* The format's row rule, literally. */
static int64_t ref_row(int64_t id, int64_t rows) { return ((id % rows) + rows) % rows; }

static void ref_embedding_bag(const float *tab, int rows, int dim, const int64_t *ids,
                              const int64_t *off, int n, enum bk_pool pool, double *ref,
                              double *allow)
{
    for (int b = 0; b < n; b++) {
        int64_t cnt = off[b + 1] - off[b];
        for (int j = 0; j < dim; j++) {
            double s = 0, m = 0;
            for (int64_t e = off[b]; e < off[b + 1]; e++) {
                double v = tab[ref_row(ids[e], rows) * dim + j];
                s += v;
                m += fabs(v);
            }
            if (pool == BK_POOL_MEAN && cnt > 0) {
                s /= (double)cnt;
                m /= (double)cnt;
            }
            ref[(size_t)b * dim + j] = s;
            allow[(size_t)b * dim + j] = 2.0 * (double)(cnt + 2) * U32 * m;
        }
    }
}

/* y = act(x W^T + b), rows x out; allow from the pre-activation bound:
 * relu is 1-Lipschitz, sigmoid 1/4-Lipschitz plus a few ulps of its own. */
static void ref_linear(const float *x, int ldx, int rows, const float *w, int out, int in,
                       const float *bias, enum bk_act act, double *ref, double *allow)
{
    for (int r = 0; r < rows; r++)
        for (int o = 0; o < out; o++) {
            double s = bias ? bias[o] : 0.0, m = bias ? fabs(bias[o]) : 0.0;
            for (int k = 0; k < in; k++) {
                double p = (double)x[(size_t)r * ldx + k] * w[(size_t)o * in + k];
                s += p;
                m += fabs(p);
            }
            double a = 2.0 * (in + 2) * U32 * m;
            if (act == BK_ACT_RELU)
                s = s < 0 ? 0 : s;
            if (act == BK_ACT_SIGMOID) {
                s = 1.0 / (1.0 + exp(-s));
                a = 0.25 * a + 8 * U32;
            }
            ref[(size_t)r * out + o] = s;
            allow[(size_t)r * out + o] = a;
        }
}

static void ref_lce(const float *eu, const float *ec, int nc, const int32_t *map,
                    const float *wu, const float *wc, int ku, int kc, int m, int d, double *ref,
                    double *allow)
{
    int kmax = ku > kc ? ku : kc;
    for (int c = 0; c < nc; c++)
        for (int i = 0; i < m; i++)
            for (int j = 0; j < d; j++) {
                double s = 0, mg = 0;
                for (int k = 0; k < ku; k++) {
                    double p = (double)wu[i * ku + k] * eu[((size_t)map[c] * ku + k) * d + j];
                    s += p;
                    mg += fabs(p);
                }
                for (int k = 0; k < kc; k++) {
                    double p = (double)wc[i * kc + k] * ec[((size_t)c * kc + k) * d + j];
                    s += p;
                    mg += fabs(p);
                }
                size_t at = ((size_t)c * m + i) * d + j;
                ref[at] = s;
                allow[at] = 2.0 * (kmax + 3) * U32 * mg;
            }
}

/* Attention in double. Bound: a score's error is <= (dh+2) u A_j with
 * A_j = sum_d |q_d k_jd| / sqrt(dh); the stable exp of s_j - max adds
 * u (|s_j - max| + 2) relative error to a weight, the weight normalization
 * doubles it; the sums over L events add (2L + 4) u; the output is a convex
 * combination of values, so everything scales with max|v|. Allowed error:
 * twice  (4 (dh+2) A + span + 2L + 8) u max|v|, span = max_j |s_j - max|. */
static void ref_attention(const float *q, const float *k, const float *v, const int64_t *off,
                          const int32_t *map, int nc, int tq, int heads, int dh, double *ref,
                          double *allow)
{
    const size_t hd = (size_t)heads * dh;
    const double scale = 1.0 / sqrt((double)dh);
    for (int c = 0; c < nc; c++) {
        const int u = map[c];
        const int64_t b = off[u];
        const int L = (int)(off[u + 1] - off[u]);
        double *sc = dvec((size_t)L);
        for (int i = 0; i < tq; i++)
            for (int h = 0; h < heads; h++) {
                const float *qr = q + ((size_t)c * tq + i) * hd + (size_t)h * dh;
                double *rr = ref + ((size_t)c * tq + i) * hd + (size_t)h * dh;
                double *ar = allow + ((size_t)c * tq + i) * hd + (size_t)h * dh;
                if (L == 0) {
                    for (int e = 0; e < dh; e++)
                        rr[e] = ar[e] = 0;
                    continue;
                }
                double mx = -INFINITY, amax = 0, vmax = 0;
                for (int j = 0; j < L; j++) {
                    double s = 0, a = 0;
                    for (int e = 0; e < dh; e++) {
                        double p = (double)qr[e] * k[(size_t)(b + j) * hd + (size_t)h * dh + e];
                        s += p;
                        a += fabs(p);
                    }
                    sc[j] = s * scale;
                    mx = sc[j] > mx ? sc[j] : mx;
                    amax = a * scale > amax ? a * scale : amax;
                    for (int e = 0; e < dh; e++) {
                        double av = fabs(v[(size_t)(b + j) * hd + (size_t)h * dh + e]);
                        vmax = av > vmax ? av : vmax;
                    }
                }
                double sum = 0, span = 0;
                for (int j = 0; j < L; j++) {
                    span = mx - sc[j] > span ? mx - sc[j] : span;
                    sc[j] = exp(sc[j] - mx);
                    sum += sc[j];
                }
                double tol = 2.0 * (4.0 * (dh + 2) * amax + span + 2.0 * L + 8) * U32 * vmax;
                for (int e = 0; e < dh; e++) {
                    double o = 0;
                    for (int j = 0; j < L; j++)
                        o += sc[j] * v[(size_t)(b + j) * hd + (size_t)h * dh + e];
                    rr[e] = o / sum;
                    ar[e] = tol;
                }
            }
        free(sc);
    }
}

/* Random jagged offsets: n segments with lengths in [0, maxlen], some empty. */
static int64_t *rand_offsets(T *t, int n, int maxlen, int64_t start)
{
    int64_t *off = xmalloc((size_t)(n + 1) * sizeof(int64_t));
    off[0] = start;
    for (int i = 0; i < n; i++)
        off[i + 1] = off[i] + (rint_(t, 0, 4) == 0 ? 0 : rint_(t, 0, maxlen));
    return off;
}

/* Random ids, mostly small, some negative, some at the int64 extremes. */
static int64_t rand_id(T *t)
{
    switch (rint_(t, 0, 9)) {
    case 0: return INT64_MAX - rint_(t, 0, 3);
    case 1: return INT64_MIN + rint_(t, 0, 3);
    case 2: return -(int64_t)rint_(t, 1, 100000);
    case 3: return (int64_t)(rnd(t) >> 1) * (rint_(t, 0, 1) ? 1 : -1);
    default: return rint_(t, 0, 100000);
    }
}

/* ---- device selection ---- */

static void test_backend_new(void **state)
{
    (void)state;
    bk_err err = {{0}};
    bk_backend *be = bk_backend_new("cpu", &err);
    assert_non_null(be);
    assert_string_equal(be->name, "cpu");
    assert_int_equal(be->act_size, 4);
    be->destroy(be);

    assert_null(bk_backend_new("gpu7", &err));
    assert_non_null(strstr(err.msg, "\"gpu7\""));
    assert_null(bk_backend_new("cuda:x", &err));
    assert_non_null(strstr(err.msg, "cuda:x"));
    assert_null(bk_backend_new("", &err));
    assert_null(bk_backend_new(NULL, &err));
#ifndef IKBO_CUDA
    assert_null(bk_backend_new("cuda:0", &err));
    assert_string_equal(err.msg, "device cuda:0: this build has no CUDA support (built with CUDA=0)");
#endif
}

/* ---- memory ---- */

static void test_alloc_accounting(void **state)
{
    T *t = *state;
    bk_stats st;
    void *a = t->be->alloc(t->be, 1000, BK_TAG_USER, &t->err);
    void *b = t->be->alloc(t->be, 500, BK_TAG_USER, &t->err);
    void *c = t->be->alloc(t->be, 300, BK_TAG_CAND, &t->err);
    void *z1 = t->be->alloc(t->be, 0, BK_TAG_INDEX, &t->err);
    void *z2 = t->be->alloc(t->be, 0, BK_TAG_INDEX, &t->err);
    assert_true(a && b && c && z1 && z2);
    assert_ptr_not_equal(z1, z2);
    assert_int_equal((uintptr_t)a % 64, 0);
    t->be->get_stats(t->be, &st);
    assert_int_equal(st.bytes_live[BK_TAG_USER], 1500);
    assert_int_equal(st.bytes_peak[BK_TAG_USER], 1500);
    assert_int_equal(st.bytes_live[BK_TAG_CAND], 300);
    assert_int_equal(st.bytes_live[BK_TAG_BROADCAST], 0);
    assert_int_equal(st.bytes_live[BK_TAG_INDEX], 0);
    memset(a, 1, 1000); /* usable */
    t->be->free(t->be, a, 1000, BK_TAG_USER);
    void *d = t->be->alloc(t->be, 200, BK_TAG_USER, &t->err);
    assert_non_null(d);
    t->be->get_stats(t->be, &st);
    assert_int_equal(st.bytes_live[BK_TAG_USER], 700);
    assert_int_equal(st.bytes_peak[BK_TAG_USER], 1500); /* the peak stays */
    t->be->free(t->be, b, 500, BK_TAG_USER);
    t->be->free(t->be, d, 200, BK_TAG_USER);
    t->be->free(t->be, c, 300, BK_TAG_CAND);
    t->be->free(t->be, z1, 0, BK_TAG_INDEX);
    t->be->free(t->be, z2, 0, BK_TAG_INDEX);
    t->be->free(t->be, NULL, 0, BK_TAG_CAND);
    t->be->get_stats(t->be, &st);
    for (int i = 0; i < BK_TAG_COUNT; i++)
        assert_int_equal(st.bytes_live[i], 0);
    assert_int_equal(st.bytes_peak[BK_TAG_CAND], 300);

    /* Failure: NULL and the message the engine shows. */
    size_t huge = (size_t)1 << 62;
    assert_null(t->be->alloc(t->be, huge, BK_TAG_CAND, &t->err));
    char want[100];
    snprintf(want, sizeof want, "out of host memory allocating %zu bytes", huge);
    assert_string_equal(t->err.msg, want);
    t->be->get_stats(t->be, &st);
    assert_int_equal(st.bytes_live[BK_TAG_CAND], 0);
}

typedef struct churn_arg {
    bk_backend *be;
    int tag;
} churn_arg;

static void *churn(void *p)
{
    churn_arg *a = p;
    bk_err err;
    for (int i = 0; i < 2000; i++) {
        size_t n = 16 + (size_t)(i % 7) * 8;
        void *x = a->be->alloc(a->be, n, (enum bk_tag)a->tag, &err);
        if (!x)
            return p;
        a->be->free(a->be, x, n, (enum bk_tag)a->tag);
    }
    return NULL;
}

/* alloc/free from several threads: counters stay exact. */
static void test_alloc_threads(void **state)
{
    T *t = *state;
    pthread_t th[4];
    churn_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (churn_arg){t->be, i % 2};
        assert_int_equal(pthread_create(&th[i], NULL, churn, &args[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        void *r;
        pthread_join(th[i], &r);
        assert_null(r);
    }
    bk_stats st;
    t->be->get_stats(t->be, &st);
    assert_int_equal(st.bytes_live[0], 0);
    assert_int_equal(st.bytes_live[1], 0);
    assert_true(st.bytes_peak[0] >= 16 && st.bytes_peak[0] <= 2 * 64);
}

static void test_weights_and_transfers(void **state)
{
    T *t = *state;
    float w[6] = {1, 2, 3, 4, 5, 6};
    bk_weight *h = wnew(t, w, 2, 3);
    w[0] = 100; /* weight_new copies */
    bk_stats st;
    t->be->get_stats(t->be, &st);
    assert_true(st.weight_bytes >= 6 * sizeof(float));

    /* [1, 3] x W^T: proves the copy and the [out, in] convention. */
    float x[3] = {1, 1, 1}, y[2];
    void *dx = dfloats(t, x, 3, BK_TAG_CAND), *dy = dpoisoned(t, 2, BK_TAG_CAND);
    OK(t, t->be->linear(t->s, dx, 3, 1, h, NULL, BK_ACT_NONE, dy, 2, &t->err));
    OK(t, t->be->download_f32(t->s, y, dy, 2, &t->err));
    assert_true(y[0] == 6.0f && y[1] == 15.0f);

    bk_weight *z = wnew(t, NULL, 0, 0); /* empty weights are legal */
    wdrop(t, z);
    wdrop(t, h);
    t->be->weight_free(t->be, NULL); /* a no-op */
    t->be->get_stats(t->be, &st);
    assert_int_equal(st.weight_bytes, 0);
    assert_null(t->be->weight_new(t->be, w, -1, 3, &t->err));

    /* Raw upload of index bytes round-trips. */
    int64_t ids[3] = {INT64_MIN, -1, INT64_MAX}, back[3];
    void *di = dbytes(t, ids, sizeof ids);
    memcpy(back, di, sizeof back); /* CPU buffers are host memory */
    assert_memory_equal(ids, back, sizeof ids);
    OK(t, t->be->sync(t->s, &t->err));

    /* Bad copies are errors naming the op, the count and the unit. */
    float one = 1.0f;
    assert_int_equal(t->be->upload(t->s, NULL, ids, 8, &t->err), -1);
    assert_string_equal(t->err.msg, "upload: NULL buffer for 8 bytes");
    assert_int_equal(t->be->upload_f32(t->s, di, NULL, 2, &t->err), -1);
    assert_string_equal(t->err.msg, "upload_f32: NULL buffer for 2 elements");
    assert_int_equal(t->be->upload_f32(t->s, di, &one, SIZE_MAX / 2, &t->err), -1);
    assert_non_null(strstr(t->err.msg, "upload_f32: "));
    assert_non_null(strstr(t->err.msg, " elements overflow size_t"));
    assert_int_equal(t->be->download_f32(t->s, NULL, di, 1, &t->err), -1);
    assert_string_equal(t->err.msg, "download_f32: NULL buffer for 1 element");
    OK(t, t->be->upload(t->s, NULL, NULL, 0, &t->err)); /* nothing to copy */
    OK(t, t->be->download_f32(t->s, NULL, NULL, 0, &t->err));
    free_bufs(t);
}

/* ---- embedding_bag ---- */

static void test_embedding_bag_random(void **state)
{
    T *t = *state;
    for (int it = 0; it < 60; it++) {
        new_case(t, "embedding_bag", it);
        int rows = rint_(t, 1, 300), dim = it % 5 == 0 ? 1 : rint_(t, 1, 40);
        int n = rint_(t, 1, 50), ld = dim + (it % 2 ? rint_(t, 1, 5) : 0);
        enum bk_pool pool = it % 2 ? BK_POOL_MEAN : BK_POOL_SUM;
        int64_t *off = rand_offsets(t, n, 12, 0);
        int64_t nid = off[n];
        int64_t *ids = xmalloc((size_t)(nid ? nid : 1) * sizeof(int64_t));
        for (int64_t i = 0; i < nid; i++)
            ids[i] = rand_id(t);
        float *tab = rand_floats(t, (size_t)rows * dim, 1.0f);
        bk_weight *wt = wnew(t, tab, rows, dim);
        void *dids = dbytes(t, ids, (size_t)(nid ? nid : 1) * sizeof(int64_t));
        void *doff = dbytes(t, off, (size_t)(n + 1) * sizeof(int64_t));
        void *dout = dpoisoned(t, (size_t)n * ld, BK_TAG_CAND);
        OK(t, t->be->embedding_bag(t->s, wt, dids, doff, n, pool, dout, ld, &t->err));
        float *got = download(t, dout, (size_t)n * ld);
        double *ref = dvec((size_t)n * dim), *allow = dvec((size_t)n * dim);
        ref_embedding_bag(tab, rows, dim, ids, off, n, pool, ref, allow);
        check_rows(t, "embedding_bag", got, ld, ref, allow, (size_t)n, dim);
        for (int b = 0; b < n; b++) /* empty bag: exactly zero */
            if (off[b + 1] == off[b])
                for (int j = 0; j < dim; j++)
                    assert_true(got[(size_t)b * ld + j] == 0.0f);
        free(got), free(ref), free(allow), free(tab), free(ids), free(off);
        free_bufs(t);
    }
}

/* One id per bag, so the output is exactly the selected row: checks the row
 * rule at the int64 extremes bitwise. */
static void test_embedding_bag_extreme_ids(void **state)
{
    T *t = *state;
    const int64_t ids[] = {INT64_MAX, INT64_MIN, INT64_MIN + 1, INT64_MAX - 1, -1, 0, 1,
                           6, 7, -7, -8, 1000000007, -1000000007, (int64_t)1e18,
                           -(int64_t)1e18, 4294967296LL, -4294967296LL};
    const int n = (int)(sizeof ids / sizeof ids[0]);
    const int table_rows[] = {1, 7, 64, 1000003};
    for (int tr = 0; tr < 4; tr++) {
        new_case(t, "embedding_bag_extreme_ids", tr);
        int rows = table_rows[tr], dim = 3;
        float *tab = xmalloc((size_t)rows * dim * sizeof(float));
        for (int r = 0; r < rows; r++)
            for (int j = 0; j < dim; j++)
                tab[(size_t)r * dim + j] = (float)r + 0.25f * (float)j;
        int64_t off[sizeof ids / sizeof ids[0] + 1];
        for (int i = 0; i <= n; i++)
            off[i] = i;
        bk_weight *wt = wnew(t, tab, rows, dim);
        void *dids = dbytes(t, ids, sizeof ids), *doff = dbytes(t, off, sizeof off);
        void *dout = dpoisoned(t, (size_t)n * dim, BK_TAG_USER);
        OK(t, t->be->embedding_bag(t->s, wt, dids, doff, n, BK_POOL_MEAN, dout, dim, &t->err));
        float *got = download(t, dout, (size_t)n * dim);
        for (int i = 0; i < n; i++) {
            int64_t r = ref_row(ids[i], rows);
            assert_true(r >= 0 && r < rows);
            for (int j = 0; j < dim; j++)
                if (got[i * dim + j] != tab[r * dim + j])
                    fail_msg("id %" PRId64 " rows %d: got %g, want row %" PRId64, ids[i], rows,
                             got[i * dim + j], r);
        }
        free(got), free(tab);
        free_bufs(t);
    }
}

/* ---- history_embedding, mean_pool ---- */

static void test_history_embedding_random(void **state)
{
    T *t = *state;
    for (int it = 0; it < 40; it++) {
        new_case(t, "history_embedding", it);
        int rows = rint_(t, 1, 200), dim = it % 7 == 0 ? 1 : rint_(t, 1, 33);
        int nact = rint_(t, 1, 5), max_len = rint_(t, 1, 20), n = rint_(t, 1, 12);
        int64_t *off = rand_offsets(t, n, max_len, it % 3 == 0 ? 5 : 0);
        if (it == 0)
            off[n] = off[n - 1]; /* last user: no events */
        int64_t ne = off[n];
        int64_t *ids = xmalloc((size_t)(ne + 1) * sizeof(int64_t));
        int32_t *acts = xmalloc((size_t)(ne + 1) * sizeof(int32_t));
        for (int64_t e = 0; e < ne; e++) {
            ids[e] = rand_id(t);
            acts[e] = rint_(t, 0, nact - 1);
        }
        int use_acts = it % 2;
        float *tab = rand_floats(t, (size_t)rows * dim, 1.0f);
        float *act = rand_floats(t, (size_t)nact * dim, 1.0f);
        float *pos = rand_floats(t, (size_t)max_len * dim, 1.0f);
        bk_weight *wt = wnew(t, tab, rows, dim), *wa = wnew(t, act, nact, dim);
        bk_weight *wp = wnew(t, pos, max_len, dim);
        void *dids = dbytes(t, ids, (size_t)(ne + 1) * sizeof(int64_t));
        void *dacts = dbytes(t, acts, (size_t)(ne + 1) * sizeof(int32_t));
        void *doff = dbytes(t, off, (size_t)(n + 1) * sizeof(int64_t));
        void *dout = dpoisoned(t, (size_t)(ne + 1) * dim, BK_TAG_USER);
        OK(t, t->be->history_embedding(t->s, wt, wa, wp, dids, use_acts ? dacts : NULL, doff, n,
                                       dout, &t->err));
        float *got = download(t, dout, (size_t)(ne + 1) * dim);
        double *ref = dvec((size_t)(ne + 1) * dim), *allow = dvec((size_t)(ne + 1) * dim);
        for (int u = 0; u < n; u++)
            for (int64_t e = off[u]; e < off[u + 1]; e++)
                for (int j = 0; j < dim; j++) {
                    double a = tab[ref_row(ids[e], rows) * dim + j];
                    double b = act[(use_acts ? acts[e] : 0) * dim + j];
                    double c = pos[(e - off[u]) * dim + j];
                    ref[e * dim + j] = a + b + c;
                    allow[e * dim + j] = 2.0 * 4 * U32 * (fabs(a) + fabs(b) + fabs(c));
                }
        /* Rows before off[0] are not the op's: skip them. */
        check_rows(t, "history", got + off[0] * dim, dim, ref + off[0] * dim,
                   allow + off[0] * dim, (size_t)(ne - off[0]), dim);
        /* The op writes only its rows; the spare row after them keeps the poison. */
        for (int j = 0; j < dim; j++)
            assert_true(is_poison(got[ne * dim + j]));
        free(got), free(ref), free(allow), free(tab), free(act), free(pos), free(ids),
            free(acts), free(off);
        free_bufs(t);
    }
}

static void test_history_embedding_errors(void **state)
{
    T *t = *state;
    new_case(t, "history_errors", 0);
    float tab[8] = {0}, act[4] = {0}, pos[4] = {0};
    bk_weight *wt = wnew(t, tab, 4, 2), *wa = wnew(t, act, 2, 2), *wp = wnew(t, pos, 2, 2);
    int64_t ids[3] = {1, 2, 3}, off_ok[2] = {0, 2}, off_long[2] = {0, 3};
    int32_t bad_acts[3] = {0, 2, 0};
    void *dids = dbytes(t, ids, sizeof ids), *dacts = dbytes(t, bad_acts, sizeof bad_acts);
    void *dok = dbytes(t, off_ok, sizeof off_ok), *dlong = dbytes(t, off_long, sizeof off_long);
    void *dout = dpoisoned(t, 6, BK_TAG_USER);
    assert_int_equal(t->be->history_embedding(t->s, wt, wa, wp, dids, dacts, dok, 1, dout,
                                              &t->err), -1);
    assert_non_null(strstr(t->err.msg, "action 2"));
    assert_int_equal(t->be->history_embedding(t->s, wt, wa, wp, dids, NULL, dlong, 1, dout,
                                              &t->err), -1);
    assert_non_null(strstr(t->err.msg, "positions"));
    free_bufs(t);
}

static void test_mean_pool_random(void **state)
{
    T *t = *state;
    for (int it = 0; it < 40; it++) {
        new_case(t, "mean_pool", it);
        int n = rint_(t, 1, 30), dim = it % 4 == 0 ? 1 : rint_(t, 1, 50);
        int64_t *off = rand_offsets(t, n, 70, it % 2 ? 3 : 0);
        size_t ne = (size_t)off[n];
        float *x = rand_floats(t, (ne + 1) * dim, 2.0f);
        void *dx = dfloats(t, x, (ne + 1) * dim, BK_TAG_USER);
        void *doff = dbytes(t, off, (size_t)(n + 1) * sizeof(int64_t));
        void *dout = dpoisoned(t, (size_t)n * dim, BK_TAG_USER);
        OK(t, t->be->pool(t->s, dx, doff, n, 0, dim, BK_POOL_MEAN, dout, dim, &t->err));
        float *got = download(t, dout, (size_t)n * dim);
        double *ref = dvec((size_t)n * dim), *allow = dvec((size_t)n * dim);
        for (int r = 0; r < n; r++) {
            int64_t cnt = off[r + 1] - off[r];
            for (int j = 0; j < dim; j++) {
                double s = 0, m = 0;
                for (int64_t e = off[r]; e < off[r + 1]; e++) {
                    s += x[e * dim + j];
                    m += fabs(x[e * dim + j]);
                }
                ref[r * dim + j] = cnt ? s / cnt : 0.0;
                allow[r * dim + j] = 2.0 * (cnt + 2) * U32 * (cnt ? m / cnt : 0.0);
            }
        }
        check_rows(t, "mean_pool", got, dim, ref, allow, (size_t)n, dim);
        free(got), free(ref), free(allow), free(x), free(off);
        free_bufs(t);
    }
}

/* ---- linear ---- */

typedef struct lin_case {
    int rows, in, out, ldx, ldy, has_bias;
    enum bk_act act;
} lin_case;

static void run_linear_case(T *t, lin_case lc)
{
    float *x = rand_floats(t, (size_t)lc.rows * lc.ldx, 1.0f);
    float *w = rand_floats(t, (size_t)lc.out * lc.in, 1.0f);
    float *b = rand_floats(t, (size_t)lc.out, 1.0f);
    bk_weight *ww = wnew(t, w, lc.out, lc.in);
    bk_weight *wb = lc.has_bias ? wnew(t, b, 1, lc.out) : NULL;
    void *dx = dfloats(t, x, (size_t)lc.rows * lc.ldx, BK_TAG_CAND);
    void *dy = dpoisoned(t, (size_t)lc.rows * lc.ldy, BK_TAG_CAND);
    OK(t, t->be->linear(t->s, dx, lc.ldx, lc.rows, ww, wb, lc.act, dy, lc.ldy, &t->err));
    float *got = download(t, dy, (size_t)lc.rows * lc.ldy);
    double *ref = dvec((size_t)lc.rows * lc.out), *allow = dvec((size_t)lc.rows * lc.out);
    ref_linear(x, lc.ldx, lc.rows, w, lc.out, lc.in, lc.has_bias ? b : NULL, lc.act, ref, allow);
    check_rows(t, "linear", got, lc.ldy, ref, allow, (size_t)lc.rows, lc.out);
    free(got), free(ref), free(allow), free(x), free(w), free(b);
    free_bufs(t);
}

static void test_linear_random(void **state)
{
    T *t = *state;
    for (int it = 0; it < 60; it++) {
        new_case(t, "linear", it);
        lin_case lc;
        lc.rows = it < 5 ? 1 : rint_(t, 1, 150);
        lc.in = it % 10 == 1 ? 1 : rint_(t, 1, it % 3 == 0 ? 700 : 70); /* > 256: k blocks */
        lc.out = it % 10 == 2 ? 1 : rint_(t, 1, 45);
        lc.ldx = lc.in + (it % 2 ? rint_(t, 1, 9) : 0);
        lc.ldy = lc.out + (it % 4 >= 2 ? rint_(t, 1, 9) : 0);
        lc.has_bias = it % 5 != 0;
        lc.act = (enum bk_act)(it % 3);
        run_linear_case(t, lc);
    }
    /* The bench and seed shapes, and round sizes. */
    lin_case fixed[] = {
        {1024, 384, 64, 384, 64, 1, BK_ACT_RELU},
        {65, 256, 8, 256, 8, 0, BK_ACT_NONE},
        {64, 257, 9, 300, 16, 1, BK_ACT_SIGMOID},
        {3, 2600, 2, 2600, 2, 1, BK_ACT_NONE},
    };
    for (int i = 0; i < 4; i++) {
        new_case(t, "linear_fixed", i);
        run_linear_case(t, fixed[i]);
    }
}

static void test_linear_errors(void **state)
{
    T *t = *state;
    new_case(t, "linear_errors", 0);
    float w[12] = {0};
    bk_weight *ww = wnew(t, w, 3, 4), *wb = wnew(t, w, 1, 2);
    float *dx = dpoisoned(t, 64, BK_TAG_CAND), *dy = dpoisoned(t, 64, BK_TAG_CAND);
    /* (dx + 2 below is pointer arithmetic only: an output overlapping x.) */
    assert_int_equal(t->be->linear(t->s, dx, 3, 2, ww, NULL, BK_ACT_NONE, dy, 3, &t->err), -1);
    assert_non_null(strstr(t->err.msg, "ldx 3"));
    assert_int_equal(t->be->linear(t->s, dx, 4, 2, ww, wb, BK_ACT_NONE, dy, 3, &t->err), -1);
    assert_non_null(strstr(t->err.msg, "bias"));
    assert_int_equal(t->be->linear(t->s, dx, 4, 2, ww, NULL, BK_ACT_NONE, dx + 2, 3, &t->err),
                     -1);
    assert_non_null(strstr(t->err.msg, "overlaps"));
    /* in = 0: y = act(bias). */
    float bias3[3] = {-1.5f, 0.25f, 2.0f}, y3[3];
    bk_weight *w0 = wnew(t, NULL, 3, 0), *b3 = wnew(t, bias3, 3, 1);
    OK(t, t->be->linear(t->s, dx, 1, 1, w0, b3, BK_ACT_RELU, dy, 3, &t->err));
    OK(t, t->be->download_f32(t->s, y3, dy, 3, &t->err));
    assert_true(y3[0] == 0.0f && y3[1] == 0.25f && y3[2] == 2.0f);
    /* No rows: nothing to do, nothing written. */
    OK(t, t->be->linear(t->s, dx, 4, 0, ww, NULL, BK_ACT_NONE, dy + 8, 3, &t->err));
    float *got = download(t, dy, 64);
    assert_true(is_poison(got[8]));
    free(got);
    free_bufs(t);
}

/* linear_grouped: each group's rows equal linear's on those rows alone, bit
 * for bit (the determinism contract); the gaps between groups keep their
 * poison; strides that overlap and other activations are refused. */
static void test_linear_grouped(void **state)
{
    T *t = *state;
    for (int it = 0; it < 12; it++) {
        new_case(t, "linear_grouped", it);
        int groups = rint_(t, 1, 9), g = rint_(t, 1, 7), in = it == 11 ? 0 : rint_(t, 1, 40),
            out = rint_(t, 1, 30), ldx = in + (it % 2) * 3, ldy = out + (it % 3 == 1) * 2;
        int64_t gx = (int64_t)g * ldx + (it % 4 >= 2 ? 5 : 0), gy = (int64_t)(g - 1) * ldy + out +
                                                                    rint_(t, 0, 40);
        enum bk_act act = it % 2 ? BK_ACT_RELU : BK_ACT_NONE;
        size_t nx = (size_t)groups * gx, ny = (size_t)groups * gy;
        float *x = rand_floats(t, nx, 1.0f), *w = rand_floats(t, (size_t)out * in, 1.0f),
              *b = rand_floats(t, (size_t)out, 1.0f);
        bk_weight *ww = wnew(t, w, out, in), *wb = it % 3 ? wnew(t, b, 1, out) : NULL;
        void *dx = dfloats(t, x, nx, BK_TAG_CAND), *dy = dpoisoned(t, ny, BK_TAG_CAND),
             *d1 = dpoisoned(t, (size_t)g * ldy, BK_TAG_CAND);
        OK(t, t->be->linear_grouped(t->s, dx, ldx, gx, groups, g, ww, wb, act, dy, ldy, gy,
                                    &t->err));
        float *got = download(t, dy, ny);
        for (int i = 0; i < groups; i++) {
            OK(t, t->be->linear(t->s, (float *)dx + i * gx, ldx, g, ww, wb, act, d1, ldy, &t->err));
            float *one = download(t, d1, (size_t)g * ldy);
            for (int j = 0; j < g; j++)
                assert_memory_equal(got + i * gy + (size_t)j * ldy, one + (size_t)j * ldy,
                                    (size_t)out * sizeof(float));
            free(one);
        }
        for (size_t e = 0; e < ny; e++) { /* outside every row's out columns: poison */
            size_t r = e % (size_t)gy;
            if (r >= (size_t)g * ldy || (int)(r % (size_t)ldy) >= out)
                assert_true(is_poison(got[e]));
        }
        free(got), free(x), free(w), free(b);
        free_bufs(t);
    }
    new_case(t, "linear_grouped_errors", 0);
    float w[12] = {0};
    bk_weight *ww = wnew(t, w, 3, 4);
    float *dx = dpoisoned(t, 256, BK_TAG_CAND), *dy = dpoisoned(t, 256, BK_TAG_CAND);
    assert_int_equal(t->be->linear_grouped(t->s, dx, 4, 8, 3, 2, ww, NULL, BK_ACT_NONE, dy, 3, 5,
                                           &t->err),
                     -1); /* gy 5 < (2-1)*3 + 3 */
    assert_non_null(strstr(t->err.msg, "group strides"));
    assert_int_equal(t->be->linear_grouped(t->s, dx, 4, 8, 3, 2, ww, NULL, BK_ACT_SIGMOID, dy, 3,
                                           10, &t->err),
                     -1);
    assert_non_null(strstr(t->err.msg, "activation"));
    assert_int_equal(t->be->linear_grouped(t->s, dx, 4, 8, 3, 2, NULL, NULL, BK_ACT_NONE, dy, 3,
                                           10, &t->err),
                     -1);
    assert_non_null(strstr(t->err.msg, "weight is NULL"));
    bk_weight *wb2 = wnew(t, w, 1, 2); /* 2 bias values for 3 outputs */
    assert_int_equal(t->be->linear_grouped(t->s, dx, 4, 8, 3, 2, ww, wb2, BK_ACT_NONE, dy, 3, 10,
                                           &t->err),
                     -1);
    assert_non_null(strstr(t->err.msg, "linear_grouped: bias has 2 values for 3 outputs"));
    assert_int_equal(t->be->linear_grouped(t->s, dx, 4, 40, 3, 2, ww, NULL, BK_ACT_NONE, dx + 8, 3,
                                           40, &t->err),
                     -1);
    assert_non_null(strstr(t->err.msg, "overlaps"));
    free_bufs(t);
}

typedef struct pack_arg {
    bk_backend *be;
    const bk_weight *w;
    const float *x;
    float *y;
    int rows, in, out;
    int rc;
} pack_arg;

/* mlp2: without an addend, bit for bit linear(linear(x, W1, b1, act1), W2)
 * (cpu_internal.h: the sums over hidden continue one accumulator); with
 * one (a linear over its own input, with or without a bias), from exactly
 * what linear stores for it, within the sum bound of a double reference
 * over the composition's hidden values; padding keeps its poison; hidden
 * widths cross the 256-unit chunks. Then the refusals. */
static void run_mlp2_case(T *t, int it)
{
    const int rows = it < 3 ? 1 : rint_(t, 1, 70), in = rint_(t, 1, 20);
    const int hid = it % 7 == 1 ? 1 : rint_(t, 1, it % 2 ? 600 : 256), out = rint_(t, 1, 70);
    const int ldx = in + (it % 3 ? 0 : 3), ldy = out + (it % 4 ? 0 : 5), ldh = hid;
    const int mode = it % 3; /* 0: no addend, 1: an addend with a bias, 2: without */
    const int ka = rint_(t, 1, 300), lda = ka + (it % 5 ? 0 : 2);
    const enum bk_act act = it % 2 ? BK_ACT_RELU : BK_ACT_NONE;
    float *x = rand_floats(t, (size_t)rows * ldx, 1.0f), *w1 = rand_floats(t, (size_t)hid * in, 1.0f);
    float *b1 = rand_floats(t, (size_t)hid, 1.0f), *w2 = rand_floats(t, (size_t)out * hid, 1.0f);
    float *xa = rand_floats(t, (size_t)rows * lda, 1.0f), *wa = rand_floats(t, (size_t)out * ka, 1.0f);
    float *ba = rand_floats(t, (size_t)out, 1.0f);
    bk_weight *W1 = wnew(t, w1, hid, in), *B1 = it % 5 ? wnew(t, b1, 1, hid) : NULL;
    bk_weight *W2 = wnew(t, w2, out, hid), *WA = wnew(t, wa, out, ka);
    bk_weight *BA = mode == 1 ? wnew(t, ba, 1, out) : NULL;
    void *dx = dfloats(t, x, (size_t)rows * ldx, BK_TAG_CAND);
    void *dxa = dfloats(t, xa, (size_t)rows * lda, BK_TAG_CAND);
    void *dh = dpoisoned(t, (size_t)rows * ldh, BK_TAG_CAND);
    void *dc = dpoisoned(t, (size_t)rows * ldy, BK_TAG_CAND);
    void *da = dpoisoned(t, (size_t)rows * ldy, BK_TAG_CAND);
    void *dy = dpoisoned(t, (size_t)rows * ldy, BK_TAG_CAND);
    const bk_mlp2_addend A = {dxa, lda, WA, BA};
    OK(t, t->be->mlp2(t->s, dx, ldx, rows, W1, B1, act, W2, mode ? &A : NULL, NULL, NULL,
                      BK_ACT_NONE, dy, ldy, &t->err));
    OK(t, t->be->linear(t->s, dx, ldx, rows, W1, B1, act, dh, ldh, &t->err));
    OK(t, t->be->linear(t->s, dh, ldh, rows, W2, NULL, BK_ACT_NONE, dc, ldy, &t->err));
    OK(t, t->be->linear(t->s, dxa, lda, rows, WA, BA, BK_ACT_NONE, da, ldy, &t->err));
    float *got = download(t, dy, (size_t)rows * ldy), *comp = download(t, dc, (size_t)rows * ldy);
    float *h = download(t, dh, (size_t)rows * ldh), *ad = download(t, da, (size_t)rows * ldy);
    if (!mode) {
        for (int r = 0; r < rows; r++)
            if (memcmp(got + (size_t)r * ldy, comp + (size_t)r * ldy, (size_t)out * sizeof(float)))
                fail_msg("mlp2 row %d differs from the composition of two linears [%s]", r, t->ctx);
    }
    double *ref = dvec((size_t)rows * out), *allow = dvec((size_t)rows * out);
    for (int r = 0; r < rows; r++)
        for (int o = 0; o < out; o++) {
            double a0 = mode ? ad[(size_t)r * ldy + o] : 0.0, sum = a0, m = fabs(a0);
            for (int j = 0; j < hid; j++) {
                double p = (double)h[(size_t)r * ldh + j] * w2[(size_t)o * hid + j];
                sum += p;
                m += fabs(p);
            }
            ref[(size_t)r * out + o] = sum;
            allow[(size_t)r * out + o] = 2.0 * (hid + 2) * U32 * m;
        }
    check_rows(t, "mlp2", got, ldy, ref, allow, (size_t)rows, out);
    free(got), free(comp), free(h), free(ad), free(ref), free(allow);
    free(x), free(w1), free(b1), free(w2), free(xa), free(wa), free(ba);
    free_bufs(t);
}

/* One refusal: mlp2 with these arguments fails naming `what`. */
static void mlp2_refused(T *t, const float *dx, int ldx, const bk_weight *w1, const bk_weight *b1,
                         enum bk_act act1, const bk_weight *w2, const bk_mlp2_addend *a,
                         enum bk_act act2, float *dy, const char *what)
{
    assert_int_equal(t->be->mlp2(t->s, dx, ldx, 2, w1, b1, act1, w2, a, NULL, NULL, act2, dy, 2,
                                 &t->err),
                     -1);
    if (!strstr(t->err.msg, what)) fail_msg("mlp2: error '%s' does not name '%s'", t->err.msg, what);
}

static void test_mlp2(void **state)
{
    T *t = *state;
    for (int it = 0; it < 40; it++) {
        new_case(t, "mlp2", it);
        run_mlp2_case(t, it);
    }
    new_case(t, "mlp2_errors", 0);
    float w[64] = {0};
    bk_weight *w1 = wnew(t, w, 4, 3), *w2 = wnew(t, w, 2, 4), *w2b = wnew(t, w, 2, 5);
    bk_weight *b5 = wnew(t, w, 1, 5), *wa = wnew(t, w, 2, 6), *wa3 = wnew(t, w, 3, 6);
    bk_weight *b3 = wnew(t, w, 1, 3);
    float *dx = dpoisoned(t, 64, BK_TAG_CAND), *dy = dpoisoned(t, 64, BK_TAG_CAND);
    float *dxa = dpoisoned(t, 64, BK_TAG_CAND);
    const enum bk_act none = BK_ACT_NONE;
    mlp2_refused(t, dx, 3, w1, NULL, BK_ACT_RELU, w2b, NULL, none, dy, "hidden width");
    mlp2_refused(t, dx, 3, w1, NULL, BK_ACT_SIGMOID, w2, NULL, none, dy, "activation");
    mlp2_refused(t, dx, 3, w1, b5, none, w2, NULL, none, dy, "b1");
    mlp2_refused(t, dx, 2, w1, NULL, none, w2, NULL, none, dy, "ldx 2");
    mlp2_refused(t, dx, 3, w1, NULL, none, w2, NULL, none, dx + 1, "overlaps");
    mlp2_refused(t, dx, 3, w1, NULL, none, w2, NULL, (enum bk_act)BK_ACT_COUNT, dy,
                 "output activation");
    const bk_mlp2_addend no_w = {dxa, 6, NULL, NULL}, rows3 = {dxa, 6, wa3, NULL},
                         ld5 = {dxa, 5, wa, NULL}, bias3 = {dxa, 6, wa, b3},
                         over = {dy, 6, wa, NULL};
    mlp2_refused(t, dx, 3, w1, NULL, none, w2, &no_w, none, dy, "addend's weight is NULL");
    mlp2_refused(t, dx, 3, w1, NULL, none, w2, &rows3, none, dy, "addend's weight is [3, 6]");
    mlp2_refused(t, dx, 3, w1, NULL, none, w2, &ld5, none, dy, "its ldx 5");
    mlp2_refused(t, dx, 3, w1, NULL, none, w2, &bias3, none, dy, "its bias 3 elements");
    mlp2_refused(t, dx, 3, w1, NULL, none, w2, &over, none, dy, "overlap");
    free_bufs(t);
}

/* mlp2's tail: with a user addend read through a map and an output
 * activation, each row is bit for bit mlp2 without them, then add(y,
 * addu[map]) and the activation, as the add and activation ops compute
 * them (the fold's unfused form); without a map row r reads addu's row r. */
static void test_mlp2_tail(void **state)
{
    T *t = *state;
    for (int it = 0; it < 12; it++) {
        new_case(t, "mlp2_tail", it);
        const int rows = rint_(t, 1, 40), in = rint_(t, 1, 16), hid = rint_(t, 1, 300);
        const int out = rint_(t, 1, 40), nu = it % 3 ? rint_(t, 1, 5) : rows;
        const enum bk_act act2 = (enum bk_act)(it % BK_ACT_COUNT);
        float *x = rand_floats(t, (size_t)rows * in, 1.0f), *w1 = rand_floats(t, (size_t)hid * in, 1.0f);
        float *w2 = rand_floats(t, (size_t)out * hid, 0.1f), *u = rand_floats(t, (size_t)nu * out, 2.0f);
        const int ka = rint_(t, 1, 40);
        float *xa = rand_floats(t, (size_t)rows * ka, 1.0f), *wa = rand_floats(t, (size_t)out * ka, 0.5f);
        int32_t *map = malloc((size_t)rows * sizeof *map);
        assert_non_null(map);
        for (int r = 0; r < rows; r++) map[r] = it % 3 ? rint_(t, 0, nu - 1) : r;
        bk_weight *W1 = wnew(t, w1, hid, in), *W2 = wnew(t, w2, out, hid), *WA = wnew(t, wa, out, ka);
        void *dx = dfloats(t, x, (size_t)rows * in, BK_TAG_CAND);
        const bk_mlp2_addend A = {dfloats(t, xa, (size_t)rows * ka, BK_TAG_CAND), ka, WA, NULL};
        void *du = dfloats(t, u, (size_t)nu * out, BK_TAG_USER);
        void *dy = dpoisoned(t, (size_t)rows * out, BK_TAG_CAND);
        void *dr = dpoisoned(t, (size_t)rows * out, BK_TAG_CAND);
        void *ds = dpoisoned(t, (size_t)rows * out, BK_TAG_CAND);
        const int32_t *m = it % 3 ? map : NULL;
        OK(t, t->be->mlp2(t->s, dx, in, rows, W1, NULL, BK_ACT_RELU, W2, &A, du, m, act2, dy, out,
                          &t->err));
        OK(t, t->be->mlp2(t->s, dx, in, rows, W1, NULL, BK_ACT_RELU, W2, &A, NULL, NULL,
                          BK_ACT_NONE, dr, out, &t->err));
        OK(t, t->be->add(t->s, dr, du, m, rows, out, ds, &t->err));
        if (act2 != BK_ACT_NONE) /* (the activation op has no identity) */
            OK(t, t->be->activation(t->s, ds, (size_t)rows * out, act2, ds, &t->err));
        float *got = download(t, dy, (size_t)rows * out), *want = download(t, ds, (size_t)rows * out);
        if (memcmp(got, want, (size_t)rows * out * sizeof(float)))
            fail_msg("mlp2 with its tail differs from mlp2, add and activation [%s]", t->ctx);
        free(got), free(want), free(map), free(x), free(w1), free(w2), free(u), free(xa), free(wa);
        free_bufs(t);
    }
}

static void *lin_thread(void *p)
{
    pack_arg *a = p;
    bk_err err;
    bk_stream *s = a->be->stream_new(a->be, &err);
    a->rc = s ? a->be->linear(s, a->x, a->in, a->rows, a->w, NULL, BK_ACT_NONE, a->y, a->out,
                              &err)
              : -1;
    if (s)
        a->be->stream_free(s);
    return NULL;
}

/* A shared weight first used by several threads at once (each on its own
 * stream): every thread gets the same, correct bits. */
static void test_linear_shared_weight_threads(void **state)
{
    T *t = *state;
    new_case(t, "linear_threads", 0);
    const int rows = 9, in = 77, out = 19, nth = 4;
    float *x = rand_floats(t, (size_t)rows * in, 1.0f), *w = rand_floats(t, (size_t)out * in, 1);
    bk_weight *ww = wnew(t, w, out, in);
    void *dx = dfloats(t, x, (size_t)rows * in, BK_TAG_CAND);
    pthread_t th[4];
    pack_arg args[4];
    float *ys[4];
    for (int i = 0; i < nth; i++) {
        ys[i] = dpoisoned(t, (size_t)rows * out, BK_TAG_CAND);
        args[i] = (pack_arg){t->be, ww, dx, ys[i], rows, in, out, -1};
        assert_int_equal(pthread_create(&th[i], NULL, lin_thread, &args[i]), 0);
    }
    for (int i = 0; i < nth; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < nth; i++) {
        assert_int_equal(args[i].rc, 0);
        assert_memory_equal(ys[0], ys[i], (size_t)rows * out * sizeof(float));
    }
    float *got = download(t, ys[0], (size_t)rows * out);
    double *ref = dvec((size_t)rows * out), *allow = dvec((size_t)rows * out);
    ref_linear(x, in, rows, w, out, in, NULL, BK_ACT_NONE, ref, allow);
    check_rows(t, "linear_threads", got, out, ref, allow, (size_t)rows, out);
    free(got), free(ref), free(allow), free(x), free(w);
    free_bufs(t);
}

/* ---- lce ---- */

typedef struct lce_case {
    int nu, nc, ku, kc, m, d;
    int sorted_map; /* grouped by user, as the server builds it */
} lce_case;

static int32_t *rand_map(T *t, int nc, int nu, int sorted)
{
    int32_t *map = xmalloc((size_t)(nc ? nc : 1) * sizeof(int32_t));
    for (int c = 0; c < nc; c++)
        map[c] = rint_(t, 0, nu - 1);
    if (sorted) /* grouped by user, every user used when nc >= nu */
        for (int c = 0; c < nc; c++)
            map[c] = (int32_t)((int64_t)c * nu / nc);
    return map;
}

static void run_lce_case(T *t, lce_case lc)
{
    int32_t *map = rand_map(t, lc.nc, lc.nu, lc.sorted_map);
    float *eu = rand_floats(t, (size_t)lc.nu * lc.ku * lc.d, 1.0f);
    float *ec = rand_floats(t, (size_t)lc.nc * lc.kc * lc.d, 1.0f);
    float *wu = rand_floats(t, (size_t)lc.m * lc.ku, 1.0f);
    float *wc = rand_floats(t, (size_t)lc.m * lc.kc, 1.0f);
    bk_weight *hwu = wnew(t, wu, lc.m, lc.ku), *hwc = wnew(t, wc, lc.m, lc.kc);
    void *deu = dfloats(t, eu, (size_t)lc.nu * lc.ku * lc.d, BK_TAG_USER);
    void *dec = dfloats(t, ec, (size_t)lc.nc * lc.kc * lc.d, BK_TAG_CAND);
    void *dmap = dbytes(t, map, (size_t)lc.nc * sizeof(int32_t));
    size_t nz = (size_t)lc.nc * lc.m * lc.d;
    void *dz = dpoisoned(t, nz, BK_TAG_CAND);
    OK(t, t->be->lce(t->s, deu, lc.nu, dec, lc.nc, dmap, hwu, hwc, lc.ku, lc.kc, lc.m, lc.d, dz,
                     &t->err));
    float *got = download(t, dz, nz);
    double *ref = dvec(nz), *allow = dvec(nz);
    ref_lce(eu, ec, lc.nc, map, wu, wc, lc.ku, lc.kc, lc.m, lc.d, ref, allow);
    check_rows(t, "lce", got, lc.m * lc.d, ref, allow, (size_t)lc.nc, lc.m * lc.d);
    free(got), free(ref), free(allow), free(map), free(eu), free(ec), free(wu), free(wc);
    free_bufs(t);
}

static void test_lce_random(void **state)
{
    T *t = *state;
    for (int it = 0; it < 50; it++) {
        new_case(t, "lce", it);
        lce_case lc;
        lc.nu = it < 4 ? 1 : rint_(t, 1, 9);
        lc.nc = it < 2 ? 1 : rint_(t, lc.nu, 80);
        lc.ku = rint_(t, 1, 19);
        lc.kc = rint_(t, 1, 19);
        lc.m = rint_(t, 1, 11);
        lc.d = it % 5 == 0 ? 1 : rint_(t, 1, 40);
        lc.sorted_map = it % 2;
        run_lce_case(t, lc);
    }
    lce_case fixed[] = {
        {15, 1024, 8, 7, 6, 32, 1},   /* the bench shape   */
        {3, 3000, 5, 9, 4, 8, 1},     /* 1000 candidates per user */
        {1, 1, 1, 1, 1, 1, 1},        /* all ones          */
        {2, 70, 40, 33, 13, 17, 0},   /* odd everything    */
    };
    for (int i = 0; i < 4; i++) {
        new_case(t, "lce_fixed", i);
        run_lce_case(t, fixed[i]);
    }
}

/* IKBO vs the broadcast baseline: Eu gathered to candidates (gather op,
 * BK_TAG_BROADCAST) and lce with an identity map give identical bits. The
 * IKBO run's accounting shows no broadcast bytes and only nu-row scratch. */
static void test_lce_map_equals_broadcast(void **state)
{
    T *t = *state;
    for (int it = 0; it < 10; it++) {
        new_case(t, "lce_broadcast", it);
        int nu = rint_(t, 1, 6), nc = rint_(t, 1, 60), ku = rint_(t, 1, 12),
            kc = rint_(t, 1, 12), m = rint_(t, 1, 9), d = rint_(t, 1, 35);
        int32_t *map = rand_map(t, nc, nu, it % 2);
        int32_t *ident = xmalloc((size_t)nc * sizeof(int32_t));
        for (int c = 0; c < nc; c++)
            ident[c] = c;
        float *eu = rand_floats(t, (size_t)nu * ku * d, 1), *ec = rand_floats(t, (size_t)nc * kc * d, 1);
        float *wu = rand_floats(t, (size_t)m * ku, 1), *wc = rand_floats(t, (size_t)m * kc, 1);
        bk_weight *hwu = wnew(t, wu, m, ku), *hwc = wnew(t, wc, m, kc);
        void *deu = dfloats(t, eu, (size_t)nu * ku * d, BK_TAG_USER);
        void *dec = dfloats(t, ec, (size_t)nc * kc * d, BK_TAG_CAND);
        void *dmap = dbytes(t, map, (size_t)nc * sizeof(int32_t));
        void *did = dbytes(t, ident, (size_t)nc * sizeof(int32_t));
        size_t nz = (size_t)nc * m * d;
        void *dz1 = dpoisoned(t, nz, BK_TAG_CAND), *dz2 = dpoisoned(t, nz, BK_TAG_CAND);

        bk_stats before, after;
        t->be->get_stats(t->be, &before);
        OK(t, t->be->lce(t->s, deu, nu, dec, nc, dmap, hwu, hwc, ku, kc, m, d, dz1, &t->err));
        t->be->get_stats(t->be, &after);
        assert_int_equal(after.bytes_live[BK_TAG_BROADCAST], before.bytes_live[BK_TAG_BROADCAST]);
        if (it == 0) /* before any gather: the baseline's bytes never appeared */
            assert_int_equal(after.bytes_peak[BK_TAG_BROADCAST], 0);
        assert_int_equal(after.bytes_live[BK_TAG_USER], before.bytes_live[BK_TAG_USER]);
        /* Scratch at most the user term [nu, m*d]; never [nc, ku*d]. */
        size_t cap = before.bytes_live[BK_TAG_USER] + (size_t)nu * m * d * sizeof(float);
        assert_true(after.bytes_peak[BK_TAG_USER] <=
                    (before.bytes_peak[BK_TAG_USER] > cap ? before.bytes_peak[BK_TAG_USER] : cap));

        void *deb = dpoisoned(t, (size_t)nc * ku * d, BK_TAG_BROADCAST);
        OK(t, t->be->gather(t->s, deu, NULL, dmap, nc, NULL, ku * d, deb, &t->err));
        OK(t, t->be->lce(t->s, deb, nc, dec, nc, did, hwu, hwc, ku, kc, m, d, dz2, &t->err));
        float *z1 = download(t, dz1, nz), *z2 = download(t, dz2, nz);
        if (memcmp(z1, z2, nz * sizeof(float)) != 0)
            fail_msg("lce through map != lce of gathered input [%s]", t->ctx);
        free(z1), free(z2), free(map), free(ident), free(eu), free(ec), free(wu), free(wc);
        free_bufs(t);
    }
}

/* ---- attention ---- */

typedef struct att_case {
    int nu, nc, tq, heads, dh, maxlen;
    float qk_scale; /* large: scores far beyond exp's range */
} att_case;

static void run_attention_case(T *t, att_case ac, int broadcast_too)
{
    int64_t *off = rand_offsets(t, ac.nu, ac.maxlen, 0);
    if (ac.nu > 1 && rint_(t, 0, 1))
        off[1] = off[0]; /* user 0 has no events (offsets stay non-decreasing) */
    int32_t *map = rand_map(t, ac.nc, ac.nu, 1);
    const size_t hd = (size_t)ac.heads * ac.dh, nq = (size_t)ac.nc * ac.tq, ne = (size_t)off[ac.nu];
    float *q = rand_floats(t, nq * hd, ac.qk_scale);
    float *k = rand_floats(t, (ne + 1) * hd, ac.qk_scale), *v = rand_floats(t, (ne + 1) * hd, 1);
    void *dq = dfloats(t, q, nq * hd, BK_TAG_CAND);
    void *dk = dfloats(t, k, (ne + 1) * hd, BK_TAG_USER), *dv = dfloats(t, v, (ne + 1) * hd, BK_TAG_USER);
    void *doff = dbytes(t, off, (size_t)(ac.nu + 1) * sizeof(int64_t));
    void *dmap = dbytes(t, map, (size_t)ac.nc * sizeof(int32_t));
    void *dout = dpoisoned(t, nq * hd, BK_TAG_CAND);
    OK(t, t->be->attention(t->s, dq, dk, dv, (int)hd, doff, ac.nu, dmap, ac.nc, ac.tq, ac.heads,
                           ac.dh, dout, (int64_t)ac.tq * hd, &t->err));
    float *got = download(t, dout, nq * hd);
    double *ref = dvec(nq * hd), *allow = dvec(nq * hd);
    ref_attention(q, k, v, off, map, ac.nc, ac.tq, ac.heads, ac.dh, ref, allow);
    check_rows(t, "attention", got, (int)hd, ref, allow, nq, (int)hd);

    /* K and V in one buffer, rows ldkv apart ([K | V], as the engine's one
     * GEMM writes them, sometimes with a poisoned gap): identical bits. */
    const size_t ldkv = 2 * hd + (size_t)rint_(t, 0, 1) * 3;
    float *kv = xmalloc((ne + 1) * ldkv * sizeof(float));
    for (size_t e = 0; e < (ne + 1) * ldkv; e++)
        kv[e] = poison_f();
    for (size_t e = 0; e <= ne; e++) {
        memcpy(kv + e * ldkv, k + e * hd, hd * sizeof(float));
        memcpy(kv + e * ldkv + hd, v + e * hd, hd * sizeof(float));
    }
    float *dkv = dfloats(t, kv, (ne + 1) * ldkv, BK_TAG_USER);
    void *dout3 = dpoisoned(t, nq * hd, BK_TAG_CAND);
    OK(t, t->be->attention(t->s, dq, dkv, dkv + hd, (int)ldkv, doff, ac.nu, dmap, ac.nc, ac.tq,
                           ac.heads, ac.dh, dout3, (int64_t)ac.tq * hd, &t->err));
    float *got3 = download(t, dout3, nq * hd);
    if (memcmp(got, got3, nq * hd * sizeof(float)) != 0)
        fail_msg("attention with K/V rows %zu apart != contiguous K, V [%s]", ldkv, t->ctx);
    free(got3), free(kv);

    if (broadcast_too) {
        /* Broadcast baseline: keys/values gathered per candidate (jagged),
         * identity map, nu = nc: identical bits. */
        int64_t *doffs = xmalloc((size_t)(ac.nc + 1) * sizeof(int64_t));
        int32_t *ident = xmalloc((size_t)ac.nc * sizeof(int32_t));
        doffs[0] = 0;
        for (int c = 0; c < ac.nc; c++) {
            ident[c] = c;
            doffs[c + 1] = doffs[c] + off[map[c] + 1] - off[map[c]];
        }
        size_t nb = (size_t)doffs[ac.nc];
        void *ddoffs = dbytes(t, doffs, (size_t)(ac.nc + 1) * sizeof(int64_t));
        void *dident = dbytes(t, ident, (size_t)ac.nc * sizeof(int32_t));
        void *dkb = dpoisoned(t, (nb + 1) * hd, BK_TAG_BROADCAST);
        void *dvb = dpoisoned(t, (nb + 1) * hd, BK_TAG_BROADCAST);
        OK(t, t->be->gather(t->s, dk, doff, dmap, ac.nc, ddoffs, (int)hd, dkb, &t->err));
        OK(t, t->be->gather(t->s, dv, doff, dmap, ac.nc, ddoffs, (int)hd, dvb, &t->err));
        void *dout2 = dpoisoned(t, nq * hd, BK_TAG_CAND);
        OK(t, t->be->attention(t->s, dq, dkb, dvb, (int)hd, ddoffs, ac.nc, dident, ac.nc, ac.tq,
                               ac.heads, ac.dh, dout2, (int64_t)ac.tq * hd, &t->err));
        float *got2 = download(t, dout2, nq * hd);
        if (memcmp(got, got2, nq * hd * sizeof(float)) != 0)
            fail_msg("attention through map != attention of gathered keys [%s]", t->ctx);
        free(got2), free(doffs), free(ident);
    }
    free(got), free(ref), free(allow), free(q), free(k), free(v), free(off), free(map);
    free_bufs(t);
}

static void test_attention_random(void **state)
{
    T *t = *state;
    for (int it = 0; it < 40; it++) {
        new_case(t, "attention", it);
        att_case ac;
        ac.nu = it < 3 ? 1 : rint_(t, 1, 6);
        ac.nc = it < 2 ? 1 : rint_(t, ac.nu, 40);
        ac.tq = rint_(t, 1, 6);
        ac.heads = rint_(t, 1, 3);
        ac.dh = it % 6 == 0 ? 1 : rint_(t, 1, 24);
        ac.maxlen = it == 0 ? 0 : rint_(t, 1, 80);
        ac.qk_scale = 1.0f;
        run_attention_case(t, ac, it % 2);
    }
    att_case fixed[] = {
        {16, 1024, 4, 2, 16, 64, 1.0f},  /* the bench shape  */
        {2, 2000, 1, 1, 8, 30, 1.0f},    /* 1000 candidates per user */
        {3, 9, 3, 2, 5, 40, 30.0f},      /* scores up to ~4000: needs the max shift */
        {1, 1, 1, 1, 1, 1, 1.0f},        /* one event, dh 1  */
    };
    for (int i = 0; i < 4; i++) {
        new_case(t, "attention_fixed", i);
        run_attention_case(t, fixed[i], 1);
    }
}

/* Output spans go apart (backend.h's attention): each candidate's tq rows
 * land at o + c * go, bit for bit the packed result (only the address
 * changes), and nothing outside the spans is written - o starts inside a
 * poisoned buffer, so the poison before it, in every gap and after the
 * last span must survive. go below tq * heads * dh is an error naming go
 * that writes nothing. */
static void test_attention_strided_output(void **state)
{
    T *t = *state;
    for (int it = 0; it < 24; it++) {
        new_case(t, "attention_strided_output", it);
        const int nu = rint_(t, 1, 5), nc = rint_(t, nu, 30), tq = rint_(t, 1, 5);
        const int heads = rint_(t, 1, 3), dh = it % 4 == 0 ? rint_(t, 1, 3) : rint_(t, 1, 24);
        int64_t *off = rand_offsets(t, nu, it == 0 ? 0 : 60, 0);
        if (nu > 1 && rint_(t, 0, 1))
            off[1] = off[0]; /* user 0 has no events: its candidates' zeros go to spans too */
        int32_t *map = rand_map(t, nc, nu, 1);
        const size_t hd = (size_t)heads * dh, span = (size_t)tq * hd, ne = (size_t)off[nu];
        const size_t go = span + (size_t)rint_(t, 1, 9) * (it % 3 == 0 ? 8 : 1);
        const size_t lead = (size_t)rint_(t, 0, 5), total = lead + (size_t)nc * go + 3;
        float *q = rand_floats(t, (size_t)nc * span, 2), *k = rand_floats(t, (ne + 1) * hd, 2);
        float *v = rand_floats(t, (ne + 1) * hd, 1);
        void *dq = dfloats(t, q, (size_t)nc * span, BK_TAG_CAND);
        void *dk = dfloats(t, k, (ne + 1) * hd, BK_TAG_USER);
        void *dv = dfloats(t, v, (ne + 1) * hd, BK_TAG_USER);
        void *doff = dbytes(t, off, (size_t)(nu + 1) * sizeof(int64_t));
        void *dmap = dbytes(t, map, (size_t)nc * sizeof(int32_t));
        void *dpk = dpoisoned(t, (size_t)nc * span, BK_TAG_CAND);
        float *dst = dpoisoned(t, total, BK_TAG_CAND);
        OK(t, t->be->attention(t->s, dq, dk, dv, (int)hd, doff, nu, dmap, nc, tq, heads, dh, dpk,
                               (int64_t)span, &t->err));
        OK(t, t->be->attention(t->s, dq, dk, dv, (int)hd, doff, nu, dmap, nc, tq, heads, dh,
                               dst + lead, (int64_t)go, &t->err));
        float *pk = download(t, dpk, (size_t)nc * span), *got = download(t, dst, total);
        for (int c = 0; c < nc; c++)
            if (memcmp(got + lead + (size_t)c * go, pk + (size_t)c * span, span * sizeof(float)))
                fail_msg("attention: candidate %d's span at go %zu != packed [%s]", c, go, t->ctx);
        for (size_t e = 0; e < total; e++) {
            const size_t x = e - lead; /* wraps below lead: outside */
            if (!(e >= lead && x < (size_t)nc * go && x % go < span) && !is_poison(got[e]))
                fail_msg("attention wrote element %zu outside the spans (lead %zu, go %zu, "
                         "span %zu) [%s]", e, lead, go, span, t->ctx);
        }

        /* go one below the span: an error naming go, nothing written. */
        float *dbad = dpoisoned(t, total, BK_TAG_CAND);
        assert_int_equal(t->be->attention(t->s, dq, dk, dv, (int)hd, doff, nu, dmap, nc, tq, heads,
                                          dh, dbad, (int64_t)span - 1, &t->err), -1);
        if (!strstr(t->err.msg, "attention: output candidate stride go"))
            fail_msg("attention: go below tq * heads * dh gave \"%s\" [%s]", t->err.msg, t->ctx);
        float *bad = download(t, dbad, total);
        for (size_t e = 0; e < total; e++)
            if (!is_poison(bad[e]))
                fail_msg("attention with a bad go wrote element %zu [%s]", e, t->ctx);
        free(bad), free(pk), free(got), free(q), free(k), free(v), free(off), free(map);
        free_bufs(t);
    }
}

/* Full target attention from the model format, composed from backend ops
 * (linear projections at U for keys/values and at C for queries, the IKBO
 * core, the output projection), with heads * dh != D. Tolerance: each stage
 * is within its bound above (~1e-6 relative at these sizes); the chain is
 * checked at 1e-4 of the output's largest magnitude, loose for rounding and
 * tight for any wrong index or weight layout (those give O(1) errors). */
static void test_target_attention_composed(void **state)
{
    T *t = *state;
    for (int it = 0; it < 8; it++) {
        new_case(t, "target_attention", it);
        int D = rint_(t, 3, 40), H = rint_(t, 1, 3), dh = rint_(t, 1, 12);
        if (H * dh == D)
            dh++;
        int nu = rint_(t, 1, 4), nc = rint_(t, nu, 20), tq = rint_(t, 1, 4);
        int64_t *off = rand_offsets(t, nu, 25, 0);
        int32_t *map = rand_map(t, nc, nu, 1);
        size_t hd = (size_t)H * dh, nq = (size_t)nc * tq, ne = (size_t)off[nu];
        float *x = rand_floats(t, nq * D, 1), *hist = rand_floats(t, (ne + 1) * D, 1);
        float *wq = rand_floats(t, hd * D, 1), *wk = rand_floats(t, hd * D, 1);
        float *wv = rand_floats(t, hd * D, 1), *wo = rand_floats(t, (size_t)D * hd, 1);
        bk_weight *hq = wnew(t, wq, (int)hd, D), *hk = wnew(t, wk, (int)hd, D);
        bk_weight *hv = wnew(t, wv, (int)hd, D), *ho = wnew(t, wo, D, (int)hd);
        void *dx = dfloats(t, x, nq * D, BK_TAG_CAND), *dh_ = dfloats(t, hist, (ne + 1) * D, BK_TAG_USER);
        void *doff = dbytes(t, off, (size_t)(nu + 1) * sizeof(int64_t));
        void *dmap = dbytes(t, map, (size_t)nc * sizeof(int32_t));
        void *dQ = dpoisoned(t, nq * hd, BK_TAG_CAND), *dO = dpoisoned(t, nq * hd, BK_TAG_CAND);
        void *dK = dpoisoned(t, (ne + 1) * hd, BK_TAG_USER), *dV = dpoisoned(t, (ne + 1) * hd, BK_TAG_USER);
        void *dout = dpoisoned(t, nq * D, BK_TAG_CAND);
        OK(t, t->be->linear(t->s, dx, D, (int)nq, hq, NULL, BK_ACT_NONE, dQ, (int)hd, &t->err));
        OK(t, t->be->linear(t->s, dh_, D, (int)ne, hk, NULL, BK_ACT_NONE, dK, (int)hd, &t->err));
        OK(t, t->be->linear(t->s, dh_, D, (int)ne, hv, NULL, BK_ACT_NONE, dV, (int)hd, &t->err));
        OK(t, t->be->attention(t->s, dQ, dK, dV, H * dh, doff, nu, dmap, nc, tq, H, dh, dO,
                                (int64_t)tq * H * dh, &t->err));
        OK(t, t->be->linear(t->s, dO, (int)hd, (int)nq, ho, NULL, BK_ACT_NONE, dout, D, &t->err));
        float *got = download(t, dout, nq * D);

        /* Reference: the model format's formula, in double. */
        double *Q = dvec(nq * hd), *K = dvec(ne * hd + 1), *V = dvec(ne * hd + 1);
        double *O = dvec(nq * hd), *ref = dvec(nq * D), maxref = 0;
        for (size_t r = 0; r < nq; r++)
            for (size_t o = 0; o < hd; o++)
                for (int e = 0; e < D; e++)
                    Q[r * hd + o] += (double)x[r * D + e] * wq[o * D + e];
        for (size_t r = 0; r < ne; r++)
            for (size_t o = 0; o < hd; o++)
                for (int e = 0; e < D; e++) {
                    K[r * hd + o] += (double)hist[r * D + e] * wk[o * D + e];
                    V[r * hd + o] += (double)hist[r * D + e] * wv[o * D + e];
                }
        for (int c = 0; c < nc; c++) {
            int64_t b = off[map[c]], L = off[map[c] + 1] - b;
            for (int i = 0; i < tq; i++)
                for (int h = 0; h < H; h++) {
                    double *qr = Q + ((size_t)c * tq + i) * hd + (size_t)h * dh;
                    double mx = -INFINITY, sum = 0, *p = dvec((size_t)L);
                    for (int64_t j = 0; j < L; j++) {
                        for (int e = 0; e < dh; e++)
                            p[j] += qr[e] * K[(b + j) * hd + (size_t)h * dh + e];
                        p[j] /= sqrt((double)dh);
                        mx = p[j] > mx ? p[j] : mx;
                    }
                    for (int64_t j = 0; j < L; j++)
                        sum += (p[j] = exp(p[j] - mx));
                    for (int e = 0; e < dh; e++)
                        for (int64_t j = 0; j < L; j++)
                            O[((size_t)c * tq + i) * hd + (size_t)h * dh + e] +=
                                p[j] / sum * V[(b + j) * hd + (size_t)h * dh + e];
                    free(p);
                }
        }
        for (size_t r = 0; r < nq; r++)
            for (int o = 0; o < D; o++) {
                for (size_t e = 0; e < hd; e++)
                    ref[r * D + o] += O[r * hd + e] * wo[o * hd + e];
                maxref = fabs(ref[r * D + o]) > maxref ? fabs(ref[r * D + o]) : maxref;
            }
        double *allow = dvec(nq * D);
        for (size_t i = 0; i < nq * D; i++)
            allow[i] = 1e-4 * maxref + 1e-30;
        check_rows(t, "target_attention", got, D, ref, allow, nq, D);
        free(got), free(Q), free(K), free(V), free(O), free(ref), free(allow), free(x),
            free(hist), free(wq), free(wk), free(wv), free(wo), free(off), free(map);
        free_bufs(t);
    }
}

/* ---- determinism: a row alone == the same row inside a batch ---- */

static void test_determinism_linear(void **state)
{
    T *t = *state;
    for (int it = 0; it < 12; it++) {
        new_case(t, "determinism_linear", it);
        int in = rint_(t, 1, it % 2 ? 700 : 64), out = rint_(t, 1, 40);
        int batch = it % 3 == 0 ? 150 : 37, pos = rint_(t, 1, batch - 1);
        enum bk_act act = (enum bk_act)(it % 3);
        float *xb = rand_floats(t, (size_t)batch * in, 1), *w = rand_floats(t, (size_t)out * in, 1);
        float *b = rand_floats(t, (size_t)out, 1);
        bk_weight *hw = wnew(t, w, out, in), *hb = wnew(t, b, out, 1);
        void *dxb = dfloats(t, xb, (size_t)batch * in, BK_TAG_CAND);
        void *dx1 = dfloats(t, xb + (size_t)pos * in, (size_t)in, BK_TAG_CAND);
        void *dyb = dpoisoned(t, (size_t)batch * out, BK_TAG_CAND), *dy1 = dpoisoned(t, (size_t)out, BK_TAG_CAND);
        OK(t, t->be->linear(t->s, dxb, in, batch, hw, hb, act, dyb, out, &t->err));
        OK(t, t->be->linear(t->s, dx1, in, 1, hw, hb, act, dy1, out, &t->err));
        float *yb = download(t, dyb, (size_t)batch * out), *y1 = download(t, dy1, (size_t)out);
        if (memcmp(yb + (size_t)pos * out, y1, (size_t)out * sizeof(float)) != 0)
            fail_msg("linear row %d of %d differs from the row alone [%s]", pos, batch, t->ctx);
        free(xb), free(w), free(b), free(yb), free(y1);
        free_bufs(t);
    }
}

static void test_determinism_lce(void **state)
{
    T *t = *state;
    for (int it = 0; it < 12; it++) {
        new_case(t, "determinism_lce", it);
        int ku = rint_(t, 1, 20), kc = rint_(t, 1, 20), m = rint_(t, 1, 10), d = rint_(t, 1, 40);
        int nu = rint_(t, 2, 8), nc = 37, pos = rint_(t, 1, nc - 1);
        int32_t *map = rand_map(t, nc, nu, it % 2);
        int32_t zero = 0;
        float *eu = rand_floats(t, (size_t)nu * ku * d, 1), *ec = rand_floats(t, (size_t)nc * kc * d, 1);
        float *wu = rand_floats(t, (size_t)m * ku, 1), *wc = rand_floats(t, (size_t)m * kc, 1);
        bk_weight *hwu = wnew(t, wu, m, ku), *hwc = wnew(t, wc, m, kc);
        size_t md = (size_t)m * d;
        void *deu = dfloats(t, eu, (size_t)nu * ku * d, BK_TAG_USER);
        void *dec = dfloats(t, ec, (size_t)nc * kc * d, BK_TAG_CAND);
        void *deu1 = dfloats(t, eu + (size_t)map[pos] * ku * d, (size_t)ku * d, BK_TAG_USER);
        void *dec1 = dfloats(t, ec + (size_t)pos * kc * d, (size_t)kc * d, BK_TAG_CAND);
        void *dmap = dbytes(t, map, (size_t)nc * sizeof(int32_t)), *dzero = dbytes(t, &zero, 4);
        void *dz = dpoisoned(t, (size_t)nc * md, BK_TAG_CAND), *dz1 = dpoisoned(t, md, BK_TAG_CAND);
        OK(t, t->be->lce(t->s, deu, nu, dec, nc, dmap, hwu, hwc, ku, kc, m, d, dz, &t->err));
        OK(t, t->be->lce(t->s, deu1, 1, dec1, 1, dzero, hwu, hwc, ku, kc, m, d, dz1, &t->err));
        float *z = download(t, dz, (size_t)nc * md), *z1 = download(t, dz1, md);
        if (memcmp(z + (size_t)pos * md, z1, md * sizeof(float)) != 0)
            fail_msg("lce candidate %d of %d differs from the candidate alone [%s]", pos, nc, t->ctx);
        free(z), free(z1), free(map), free(eu), free(ec), free(wu), free(wc);
        free_bufs(t);
    }
}

static void test_determinism_attention(void **state)
{
    T *t = *state;
    for (int it = 0; it < 12; it++) {
        new_case(t, "determinism_attention", it);
        int nu = rint_(t, 2, 6), nc = 37, tq = rint_(t, 1, 5), heads = rint_(t, 1, 3);
        int dh = rint_(t, 1, 20), pos = rint_(t, 1, nc - 1);
        int64_t *off = rand_offsets(t, nu, 70, 0);
        int32_t *map = rand_map(t, nc, nu, 1);
        const size_t hd = (size_t)heads * dh, ne = (size_t)off[nu];
        float *q = rand_floats(t, (size_t)nc * tq * hd, 2), *k = rand_floats(t, (ne + 1) * hd, 2);
        float *v = rand_floats(t, (ne + 1) * hd, 1);
        const int u = map[pos];
        int64_t off1[2] = {0, off[u + 1] - off[u]};
        int32_t zero = 0;
        void *dq = dfloats(t, q, (size_t)nc * tq * hd, BK_TAG_CAND);
        void *dk = dfloats(t, k, (ne + 1) * hd, BK_TAG_USER), *dv = dfloats(t, v, (ne + 1) * hd, BK_TAG_USER);
        void *dq1 = dfloats(t, q + (size_t)pos * tq * hd, (size_t)tq * hd, BK_TAG_CAND);
        void *dk1 = dfloats(t, k + (size_t)off[u] * hd, (size_t)(off1[1] + 1) * hd, BK_TAG_USER);
        void *dv1 = dfloats(t, v + (size_t)off[u] * hd, (size_t)(off1[1] + 1) * hd, BK_TAG_USER);
        void *doff = dbytes(t, off, (size_t)(nu + 1) * 8), *doff1 = dbytes(t, off1, 16);
        void *dmap = dbytes(t, map, (size_t)nc * 4), *dzero = dbytes(t, &zero, 4);
        void *dout = dpoisoned(t, (size_t)nc * tq * hd, BK_TAG_CAND);
        void *dout1 = dpoisoned(t, (size_t)tq * hd, BK_TAG_CAND);
        OK(t, t->be->attention(t->s, dq, dk, dv, heads * dh, doff, nu, dmap, nc, tq, heads, dh,
                                dout, (int64_t)tq * heads * dh, &t->err));
        OK(t, t->be->attention(t->s, dq1, dk1, dv1, heads * dh, doff1, 1, dzero, 1, tq, heads, dh,
                                dout1, (int64_t)tq * heads * dh, &t->err));
        float *o = download(t, dout, (size_t)nc * tq * hd), *o1 = download(t, dout1, (size_t)tq * hd);
        if (memcmp(o + (size_t)pos * tq * hd, o1, (size_t)tq * hd * sizeof(float)) != 0)
            fail_msg("attention candidate %d of %d differs from the candidate alone [%s]", pos,
                     nc, t->ctx);
        free(o), free(o1), free(q), free(k), free(v), free(off), free(map);
        free_bufs(t);
    }
}

/* The softmax row's polynomial exp, directly: within 8 * 2^-24 relative of
 * exp for arguments >= -87 (measured worst: 1.35 * 2^-24), about exp(-87)
 * below, the padding to a multiple of 4 exactly zero, the sum within the
 * summation bound. Rows include the argument range's ends (0, -87, -88). */
static void test_softmax_row(void **state)
{
    T *t = *state;
    for (int it = 0; it < 400; it++) {
        new_case(t, "softmax_row", it);
        int n = rint_(t, 1, 70);
        float s[72], x[72];
        for (int j = 0; j < n; j++)
            x[j] = s[j] = rflt(t) * (it % 4 == 0 ? 100.0f : 8.0f);
        if (n > 2 && it % 3 == 0) { /* exact ends of the range */
            x[1] = s[1] = x[0] - 87.0f;
            x[2] = s[2] = x[0] - 88.0f;
            x[0] = s[0] = x[0] + 0.0f;
        }
        float sum = cpu_softmax_row(s, n);
        double mx = -INFINITY, dsum = 0;
        for (int j = 0; j < n; j++)
            mx = x[j] > mx ? x[j] : mx;
        for (int j = 0; j < n; j++) {
            float arg = x[j] - (float)mx; /* the op's argument, rounded as it rounds it */
            double e = exp((double)arg);
            double allowed = arg >= -87.0f ? 8.0 * U32 * e : 2e-38;
            if (!(fabs(s[j] - e) <= allowed) && !(arg < -87.0f && s[j] <= 2e-38f && s[j] >= 0))
                fail_msg("exp(%.9g) = %.9g, want %.9g [%s]", arg, s[j], e, t->ctx);
            dsum += s[j];
        }
        for (int j = n; j < ((n + 3) & ~3); j++)
            assert_true(s[j] == 0.0f);
        if (!(fabs(sum - dsum) <= 2.0 * (n + 2) * U32 * dsum))
            fail_msg("sum %.9g, want %.9g [%s]", sum, dsum, t->ctx);
    }
}

/* ---- add, copy_rows, gather ---- */

static void test_add(void **state)
{
    T *t = *state;
    for (int it = 0; it < 20; it++) {
        new_case(t, "add", it);
        int n = rint_(t, 1, 60), nb = rint_(t, 1, 7), width = it % 4 == 0 ? 1 : rint_(t, 1, 50);
        int use_map = it % 2, alias = it % 3 == 0;
        int32_t *map = rand_map(t, n, nb, it % 4 < 2);
        int brows = use_map ? nb : n;
        float *a = rand_floats(t, (size_t)n * width, 1), *b = rand_floats(t, (size_t)brows * width, 1);
        void *da = dfloats(t, a, (size_t)n * width, BK_TAG_CAND);
        void *db = dfloats(t, b, (size_t)brows * width, BK_TAG_USER);
        void *dmap = dbytes(t, map, (size_t)n * 4);
        void *dout = alias ? da : dpoisoned(t, (size_t)n * width, BK_TAG_CAND);
        OK(t, t->be->add(t->s, da, db, use_map ? dmap : NULL, n, width, dout, &t->err));
        float *got = download(t, dout, (size_t)n * width);
        for (int r = 0; r < n; r++)
            for (int j = 0; j < width; j++) {
                float want = a[r * width + j] + b[(use_map ? map[r] : r) * width + j];
                if (got[r * width + j] != want) /* one fp32 add: exact */
                    fail_msg("add[%d][%d] = %g, want %g [%s]", r, j, got[r * width + j], want, t->ctx);
            }
        free(got), free(a), free(b), free(map);
        free_bufs(t);
    }
}

static void test_copy_rows(void **state)
{
    T *t = *state;
    for (int it = 0; it < 20; it++) {
        new_case(t, "copy_rows", it);
        int n = rint_(t, 1, 30), width = rint_(t, 1, 20), nsrc = rint_(t, 1, 6);
        int lds = width + rint_(t, 0, 5), ldd = width + rint_(t, 0, 5);
        int mapped = it % 2; /* odd cases read the source rows through a map */
        int rows = mapped ? nsrc : n;
        int32_t *map = mapped ? rand_map(t, n, nsrc, it % 4 == 1) : NULL;
        float *src = rand_floats(t, (size_t)rows * lds, 1);
        void *ds = dfloats(t, src, (size_t)rows * lds, BK_TAG_CAND);
        void *dmap = map ? dbytes(t, map, (size_t)n * 4) : NULL;
        void *dd = dpoisoned(t, (size_t)n * ldd, BK_TAG_CAND);
        OK(t, t->be->copy_rows(t->s, ds, lds, dmap, n, width, dd, ldd, &t->err));
        float *got = download(t, dd, (size_t)n * ldd);
        for (int r = 0; r < n; r++) {
            size_t sr = (size_t)(map ? map[r] : r);
            assert_memory_equal(got + (size_t)r * ldd, src + sr * lds, (size_t)width * 4);
            for (int j = width; j < ldd; j++)
                assert_true(is_poison(got[(size_t)r * ldd + j]));
        }
        free(got), free(src), free(map);
        free_bufs(t);
    }
}

static void test_gather(void **state)
{
    T *t = *state;
    for (int it = 0; it < 20; it++) {
        new_case(t, "gather", it);
        int nu = rint_(t, 1, 6), nc = rint_(t, 1, 40), width = rint_(t, 1, 20);
        int32_t *map = rand_map(t, nc, nu, it % 2);
        int64_t *soff = rand_offsets(t, nu, 9, it % 3 == 0 ? 2 : 0);
        float *src = rand_floats(t, ((size_t)soff[nu] + (size_t)nu) * width, 1);
        void *ds = dfloats(t, src, ((size_t)soff[nu] + nu) * width, BK_TAG_USER);
        void *dmap = dbytes(t, map, (size_t)nc * 4);
        void *dsoff = dbytes(t, soff, (size_t)(nu + 1) * 8);
        /* Dense. */
        void *dd = dpoisoned(t, (size_t)nc * width, BK_TAG_BROADCAST);
        OK(t, t->be->gather(t->s, ds, NULL, dmap, nc, NULL, width, dd, &t->err));
        float *got = download(t, dd, (size_t)nc * width);
        for (int c = 0; c < nc; c++)
            assert_memory_equal(got + (size_t)c * width, src + (size_t)map[c] * width, (size_t)width * 4);
        free(got);
        /* Jagged, destination rows packed in candidate order. */
        int64_t *doff = xmalloc((size_t)(nc + 1) * 8);
        doff[0] = 0;
        for (int c = 0; c < nc; c++)
            doff[c + 1] = doff[c] + soff[map[c] + 1] - soff[map[c]];
        void *ddoff = dbytes(t, doff, (size_t)(nc + 1) * 8);
        void *dj = dpoisoned(t, ((size_t)doff[nc] + 1) * width, BK_TAG_BROADCAST);
        OK(t, t->be->gather(t->s, ds, dsoff, dmap, nc, ddoff, width, dj, &t->err));
        got = download(t, dj, ((size_t)doff[nc] + 1) * width);
        for (int c = 0; c < nc; c++)
            for (int64_t e = 0; e < doff[c + 1] - doff[c]; e++)
                assert_memory_equal(got + (size_t)(doff[c] + e) * width,
                                    src + (size_t)(soff[map[c]] + e) * width, (size_t)width * 4);
        for (int j = 0; j < width; j++)
            assert_true(is_poison(got[(size_t)doff[nc] * width + j]));
        free(got), free(doff), free(map), free(soff), free(src);
        free_bufs(t);
    }
}

/* Bad index arrays are errors that name the op, not wild reads. */
static void test_index_validation(void **state)
{
    T *t = *state;
    new_case(t, "index_validation", 0);
    float w[4] = {1, 2, 3, 4};
    bk_weight *hw = wnew(t, w, 2, 2);
    int32_t bad_map[2] = {0, 2};
    int64_t bad_off[3] = {0, 3, 1};
    void *dmap = dbytes(t, bad_map, sizeof bad_map), *doff = dbytes(t, bad_off, sizeof bad_off);
    float *buf = dpoisoned(t, 256, BK_TAG_CAND);
    assert_int_equal(t->be->lce(t->s, buf, 2, buf + 64, 2, dmap, hw, hw, 2, 2, 2, 1, buf + 128,
                                &t->err), -1);
    assert_non_null(strstr(t->err.msg, "lce: map[1] = 2"));
    assert_int_equal(t->be->attention(t->s, buf, buf + 64, buf + 96, 2, doff, 2, dmap, 1, 1, 1, 2,
                                      buf + 128, 2, &t->err), -1);
    assert_non_null(strstr(t->err.msg, "attention"));
    int64_t ok_off[3] = {0, 1, 2};
    void *dok = dbytes(t, ok_off, sizeof ok_off);
    assert_int_equal(t->be->attention(t->s, buf, buf + 64, buf + 96, 1, dok, 2, dmap, 1, 1, 1, 2,
                                      buf + 128, 2, &t->err), -1);
    assert_non_null(strstr(t->err.msg, "K/V row stride 1 is below heads * head_dim = 2"));
    assert_int_equal(t->be->pool(t->s, buf, doff, 2, 0, 2, BK_POOL_MEAN, buf + 128, 2, &t->err), -1);
    assert_non_null(strstr(t->err.msg, "pool: offsets decrease"));
    assert_int_equal(t->be->embedding_bag(t->s, hw, doff, doff, 2, BK_POOL_SUM, buf, 2, &t->err), -1);
    assert_int_equal(t->be->embedding_bag(t->s, hw, doff, doff, 1, BK_POOL_SUM, buf, 1, &t->err), -1);
    assert_non_null(strstr(t->err.msg, "ld 1"));
    free_bufs(t);
}

int main(void)
{
    const char *env = getenv("IKBO_TEST_SEED");
    print_message("test_kernels_cpu: base seed %s\n", env ? env : "20241129 (IKBO_TEST_SEED)");
#define T_(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
    const struct CMUnitTest tests[] = {
        T_(test_backend_new),
        T_(test_alloc_accounting),
        T_(test_alloc_threads),
        T_(test_weights_and_transfers),
        T_(test_embedding_bag_random),
        T_(test_embedding_bag_extreme_ids),
        T_(test_history_embedding_random),
        T_(test_history_embedding_errors),
        T_(test_mean_pool_random),
        T_(test_linear_random),
        T_(test_linear_errors),
        T_(test_linear_grouped),
        T_(test_linear_shared_weight_threads),
        T_(test_mlp2),
        T_(test_mlp2_tail),
        T_(test_lce_random),
        T_(test_lce_map_equals_broadcast),
        T_(test_softmax_row),
        T_(test_attention_random),
        T_(test_attention_strided_output),
        T_(test_target_attention_composed),
        T_(test_determinism_linear),
        T_(test_determinism_lce),
        T_(test_determinism_attention),
        T_(test_add),
        T_(test_copy_rows),
        T_(test_gather),
        T_(test_index_validation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
