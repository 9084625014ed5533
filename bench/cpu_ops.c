/* cpu_ops.c - micro-benchmark of the CPU backend's matmul-shaped ops.
 *
 * Why this exists: the CPU backend must be reasonably fast, and "reasonably"
 * needs a number. This measures linear, lce (IKBO and its broadcast
 * baseline) and attention at small serving shapes through the public op
 * table, single-threaded, and prints GFLOP/s. Time is the thread's CPU
 * time, best of 40 trials, so a busy machine skews it less. Inputs are random; results are
 * not checked here (tests/unit/test_kernels_cpu.c does that).
 *
 * Build and run (from the repository root):
 *   gcc -std=gnu11 -O2 bench/cpu_ops.c kernels/backend.c kernels/cpu/[a-z]*.c
 *       -lm -lpthread -o build/bench_cpu_ops && build/bench_cpu_ops [linear lce attention]
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../kernels/backend.h"

typedef struct ctx {
    bk_backend *be;
    bk_stream *s;
    bk_err err;
    uint64_t rng;
} ctx;

static void die(const char *what, const bk_err *err)
{
    fprintf(stderr, "cpu_ops: %s: %s\n", what, err->msg);
    exit(1);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static float rnd(ctx *c)
{
    c->rng = c->rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(c->rng >> 40) / (double)(1ull << 23) - 1.0);
}

/* A device buffer of n random floats (zeros when random is 0). */
static void *dev_floats(ctx *c, size_t n, enum bk_tag tag, int random)
{
    float *h = malloc((n ? n : 1) * sizeof(float));
    void *d = c->be->alloc(c->be, n * sizeof(float), tag, &c->err);
    if (!h || !d)
        die("alloc", &c->err);
    for (size_t i = 0; i < n; i++)
        h[i] = random ? rnd(c) : 0.0f;
    if (c->be->upload_f32(c->s, d, h, n, &c->err))
        die("upload", &c->err);
    free(h);
    return d;
}

static void *dev_bytes(ctx *c, const void *h, size_t bytes)
{
    void *d = c->be->alloc(c->be, bytes, BK_TAG_INDEX, &c->err);
    if (!d || c->be->upload(c->s, d, h, bytes, &c->err))
        die("upload", &c->err);
    return d;
}

static bk_weight *weight(ctx *c, int rows, int cols)
{
    float *h = malloc((size_t)rows * cols * sizeof(float) + 1);
    if (!h)
        die("malloc", &c->err);
    for (size_t i = 0; i < (size_t)rows * cols; i++)
        h[i] = rnd(c);
    bk_weight *w = c->be->weight_new(c->be, h, rows, cols, &c->err);
    if (!w)
        die("weight_new", &c->err);
    free(h);
    return w;
}

/* Runs op in 40 trials of >= 20 ms each and reports the best trial's mean:
 * on a shared machine the fastest window is the closest to the op's own
 * speed. */
typedef int (*op_fn)(ctx *c, void *arg);

static void measure(ctx *c, const char *name, op_fn fn, void *arg, double flops)
{
    if (fn(c, arg)) /* warm-up: packs weights, faults pages in */
        die(name, &c->err);
    double best = 1e30;
    for (int rep = 0; rep < 40; rep++) {
        int iters = 0;
        double t0 = now_s(), t;
        do {
            if (fn(c, arg))
                die(name, &c->err);
            iters++;
        } while ((t = now_s() - t0) < 0.02);
        if (t / iters < best)
            best = t / iters;
    }
    printf("%-58s %9.1f us  %7.2f GFLOP/s\n", name, best * 1e6, flops / best * 1e-9);
}

/* ---- linear ---- */

typedef struct lin_arg {
    void *x, *y;
    int rows, in, out;
    bk_weight *w, *b;
} lin_arg;

static int run_linear(ctx *c, void *p)
{
    lin_arg *a = p;
    return c->be->linear(c->s, a->x, a->in, a->rows, a->w, a->b, BK_ACT_RELU, a->y, a->out,
                         &c->err);
}

static void bench_linear(ctx *c, int rows, int in, int out)
{
    lin_arg a = {dev_floats(c, (size_t)rows * in, BK_TAG_CAND, 1),
                 dev_floats(c, (size_t)rows * out, BK_TAG_CAND, 0), rows, in, out,
                 weight(c, out, in), weight(c, 1, out)};
    char name[128];
    snprintf(name, sizeof name, "linear  x[%d x %d] W[%d x %d]^T +b relu", rows, in, out, in);
    measure(c, name, run_linear, &a, 2.0 * rows * in * out);
    c->be->free(c->be, a.x, (size_t)rows * in * 4, BK_TAG_CAND);
    c->be->free(c->be, a.y, (size_t)rows * out * 4, BK_TAG_CAND);
    c->be->weight_free(c->be, a.w);
    c->be->weight_free(c->be, a.b);
}

/* ---- lce ---- */

typedef struct lce_arg {
    void *eu, *eb, *ec, *z, *map, *ident;
    int nu, nc, ku, kc, m, d;
    bk_weight *wu, *wc;
} lce_arg;

static int run_lce(ctx *c, void *p)
{
    lce_arg *a = p;
    return c->be->lce(c->s, a->eu, a->nu, a->ec, a->nc, a->map, a->wu, a->wc, a->ku, a->kc, a->m,
                      a->d, a->z, &c->err);
}

/* The broadcast baseline: gather Eu to candidates, then lce with nu = nc. */
static int run_lce_broadcast(ctx *c, void *p)
{
    lce_arg *a = p;
    if (c->be->gather(c->s, a->eu, NULL, a->map, a->nc, NULL, a->ku * a->d, a->eb, &c->err))
        return -1;
    return c->be->lce(c->s, a->eb, a->nc, a->ec, a->nc, a->ident, a->wu, a->wc, a->ku, a->kc,
                      a->m, a->d, a->z, &c->err);
}

static void bench_lce(ctx *c, int nc, int nu, int m, int d, int ku, int kc)
{
    int32_t *map = malloc((size_t)nc * 4), *ident = malloc((size_t)nc * 4);
    if (!map || !ident)
        die("malloc", &c->err);
    for (int i = 0; i < nc; i++) {
        map[i] = (int32_t)((int64_t)i * nu / nc);
        ident[i] = i;
    }
    lce_arg a = {dev_floats(c, (size_t)nu * ku * d, BK_TAG_USER, 1),
                 dev_floats(c, (size_t)nc * ku * d, BK_TAG_BROADCAST, 0),
                 dev_floats(c, (size_t)nc * kc * d, BK_TAG_CAND, 1),
                 dev_floats(c, (size_t)nc * m * d, BK_TAG_CAND, 0),
                 dev_bytes(c, map, (size_t)nc * 4), dev_bytes(c, ident, (size_t)nc * 4),
                 nu, nc, ku, kc, m, d, weight(c, m, ku), weight(c, m, kc)};
    char name[128];
    double fl_ikbo = 2.0 * m * d * ((double)nu * ku + (double)nc * kc) + (double)nc * m * d;
    double fl_bcast = 2.0 * m * d * ((double)nc * ku + (double)nc * kc) + (double)nc * m * d;
    snprintf(name, sizeof name, "lce     C=%d U=%d M=%d D=%d Ku=%d Kc=%d  IKBO", nc, nu, m, d, ku,
             kc);
    measure(c, name, run_lce, &a, fl_ikbo);
    snprintf(name, sizeof name, "lce     same, broadcast baseline (gather + lce)");
    measure(c, name, run_lce_broadcast, &a, fl_bcast);
    printf("        (GFLOP/s count each mode's own work: IKBO %.2f MFLOP, broadcast %.2f MFLOP)\n",
           fl_ikbo * 1e-6, fl_bcast * 1e-6);
    c->be->free(c->be, a.eu, (size_t)nu * ku * d * 4, BK_TAG_USER);
    c->be->free(c->be, a.eb, (size_t)nc * ku * d * 4, BK_TAG_BROADCAST);
    c->be->free(c->be, a.ec, (size_t)nc * kc * d * 4, BK_TAG_CAND);
    c->be->free(c->be, a.z, (size_t)nc * m * d * 4, BK_TAG_CAND);
    c->be->free(c->be, a.map, (size_t)nc * 4, BK_TAG_INDEX);
    c->be->free(c->be, a.ident, (size_t)nc * 4, BK_TAG_INDEX);
    c->be->weight_free(c->be, a.wu);
    c->be->weight_free(c->be, a.wc);
    free(map);
    free(ident);
}

/* ---- attention ---- */

typedef struct att_arg {
    void *q, *k, *v, *o, *off, *map;
    int nu, nc, tq, h, dh;
} att_arg;

static int run_attention(ctx *c, void *p)
{
    att_arg *a = p;
    return c->be->attention(c->s, a->q, a->k, a->v, a->h * a->dh, a->off, a->nu, a->map, a->nc, a->tq, a->h,
                            a->dh, a->o, (int64_t)a->tq * a->h * a->dh, &c->err);
}

static void bench_attention(ctx *c, int nc, int nu, int tq, int L, int h, int dh)
{
    int64_t *off = malloc((size_t)(nu + 1) * 8);
    int32_t *map = malloc((size_t)nc * 4);
    if (!off || !map)
        die("malloc", &c->err);
    for (int u = 0; u <= nu; u++)
        off[u] = (int64_t)u * L;
    for (int i = 0; i < nc; i++)
        map[i] = (int32_t)((int64_t)i * nu / nc);
    size_t hd = (size_t)h * dh, nq = (size_t)nc * tq, ne = (size_t)nu * L;
    att_arg a = {dev_floats(c, nq * hd, BK_TAG_CAND, 1), dev_floats(c, ne * hd, BK_TAG_USER, 1),
                 dev_floats(c, ne * hd, BK_TAG_USER, 1), dev_floats(c, nq * hd, BK_TAG_CAND, 0),
                 dev_bytes(c, off, (size_t)(nu + 1) * 8), dev_bytes(c, map, (size_t)nc * 4),
                 nu, nc, tq, h, dh};
    char name[128];
    snprintf(name, sizeof name, "attention C=%d U=%d Tq=%d L=%d H=%d dh=%d", nc, nu, tq, L, h, dh);
    measure(c, name, run_attention, &a, 4.0 * (double)nq * h * L * dh);
    c->be->free(c->be, a.q, nq * hd * 4, BK_TAG_CAND);
    c->be->free(c->be, a.k, ne * hd * 4, BK_TAG_USER);
    c->be->free(c->be, a.v, ne * hd * 4, BK_TAG_USER);
    c->be->free(c->be, a.o, nq * hd * 4, BK_TAG_CAND);
    c->be->free(c->be, a.off, (size_t)(nu + 1) * 8, BK_TAG_INDEX);
    c->be->free(c->be, a.map, (size_t)nc * 4, BK_TAG_INDEX);
    free(off);
    free(map);
}

/* argv: optional op names (linear, lce, attention) to run only those. */
static int wanted(int argc, char **argv, const char *op)
{
    if (argc < 2)
        return 1;
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], op) == 0)
            return 1;
    return 0;
}

int main(int argc, char **argv)
{
    ctx c = {0};
    c.rng = 42;
    c.be = bk_backend_new("cpu", &c.err);
    if (!c.be)
        die("backend", &c.err);
    c.s = c.be->stream_new(c.be, &c.err);
    if (!c.s)
        die("stream", &c.err);
    printf("ikbo-serve CPU backend, one thread, fp32 (GFLOP/s = useful multiply-adds x 2)\n");
    if (wanted(argc, argv, "linear")) {
        bench_linear(&c, 1024, 384, 64);
        bench_linear(&c, 1024, 384, 384);
        bench_linear(&c, 1, 384, 64);
    }
    if (wanted(argc, argv, "lce"))
        bench_lce(&c, 1024, 15, 6, 32, 8, 7);
    if (wanted(argc, argv, "attention"))
        bench_attention(&c, 1024, 16, 4, 64, 2, 16);
    c.be->stream_free(c.s);
    c.be->destroy(c.be);
    return 0;
}
