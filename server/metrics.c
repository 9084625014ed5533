/* metrics.c - metrics registry and Prometheus text exposition (see metrics.h). */
#include "metrics.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct metrics_series {
    char **values; /* n_labels label values */
    /* counter/gauge value, or histogram sum: a double's bits, so that
     * updates are single atomic operations. */
    _Atomic uint64_t bits;
    _Atomic uint64_t *buckets; /* histograms: n_buckets + 1 non-cumulative */
    int n_buckets;
    const double *bounds; /* the family's bucket bounds (lives as long) */
    enum metrics_type type;
};

struct metrics_family {
    enum metrics_type type;
    char *name;
    char *help;
    int n_labels;
    char *labels[METRICS_MAX_LABELS];
    int n_buckets;
    double bounds[METRICS_MAX_BUCKETS];
    metrics_collect_fn collect;
    void *collect_ctx;

    pthread_mutex_t mu; /* guards series/n_series/cap */
    metrics_series **series;
    int n_series, cap;
    metrics_family *next;
};

struct metrics_registry {
    pthread_mutex_t mu; /* guards the family list */
    metrics_family *first, *last;
};

static uint64_t d2u(double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    return u;
}

static double u2d(uint64_t u)
{
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}

static void atomic_add_double(_Atomic uint64_t *a, double v)
{
    uint64_t old = atomic_load_explicit(a, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(a, &old, d2u(u2d(old) + v),
                                                  memory_order_relaxed, memory_order_relaxed)) {
    }
}

metrics_registry *metrics_registry_new(void)
{
    metrics_registry *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    pthread_mutex_init(&r->mu, NULL);
    return r;
}

static void series_free(metrics_series *s, int n_labels)
{
    if (!s) return;
    if (s->values)
        for (int i = 0; i < n_labels; i++) free(s->values[i]);
    free(s->values);
    free(s->buckets);
    free(s);
}

static void family_free(metrics_family *f)
{
    for (int i = 0; i < f->n_series; i++) series_free(f->series[i], f->n_labels);
    free(f->series);
    for (int i = 0; i < f->n_labels; i++) free(f->labels[i]);
    free(f->name);
    free(f->help);
    pthread_mutex_destroy(&f->mu);
    free(f);
}

void metrics_registry_free(metrics_registry *r)
{
    if (!r) return;
    metrics_family *f = r->first;
    while (f) {
        metrics_family *next = f->next;
        family_free(f);
        f = next;
    }
    pthread_mutex_destroy(&r->mu);
    free(r);
}

metrics_family *metrics_family_new(metrics_registry *r, enum metrics_type type,
                                   const char *name, const char *help, int n_labels,
                                   const char *const *label_names, int n_buckets,
                                   const double *buckets)
{
    if (!r || !name || n_labels < 0 || n_labels > METRICS_MAX_LABELS) return NULL;
    if (type == METRICS_HISTOGRAM) {
        if (n_buckets < 0 || n_buckets > METRICS_MAX_BUCKETS || (n_buckets && !buckets))
            return NULL;
        for (int i = 0; i < n_buckets; i++)
            if (!isfinite(buckets[i]) || (i && buckets[i] <= buckets[i - 1])) return NULL;
    } else {
        n_buckets = 0;
    }
    metrics_family *f = calloc(1, sizeof *f);
    if (!f) return NULL;
    pthread_mutex_init(&f->mu, NULL);
    f->type = type;
    f->name = strdup(name);
    f->help = strdup(help ? help : "");
    f->n_labels = n_labels;
    int ok = f->name && f->help;
    for (int i = 0; i < n_labels; i++) {
        f->labels[i] = strdup(label_names[i]);
        ok = ok && f->labels[i];
    }
    f->n_buckets = n_buckets;
    for (int i = 0; i < n_buckets; i++) f->bounds[i] = buckets[i];
    if (!ok) {
        family_free(f);
        return NULL;
    }
    pthread_mutex_lock(&r->mu);
    if (r->last)
        r->last->next = f;
    else
        r->first = f;
    r->last = f;
    pthread_mutex_unlock(&r->mu);
    return f;
}

static int values_equal(const metrics_series *s, const char *const *v, int n)
{
    for (int i = 0; i < n; i++)
        if (strcmp(s->values[i], v[i] ? v[i] : "") != 0) return 0;
    return 1;
}

metrics_series *metrics_series_get(metrics_family *f, const char *const *label_values)
{
    if (!f) return NULL;
    pthread_mutex_lock(&f->mu);
    for (int i = 0; i < f->n_series; i++) {
        if (values_equal(f->series[i], label_values, f->n_labels)) {
            metrics_series *s = f->series[i];
            pthread_mutex_unlock(&f->mu);
            return s;
        }
    }
    metrics_series *s = NULL;
    if (f->n_series == f->cap) {
        int cap = f->cap ? f->cap * 2 : 8;
        metrics_series **grown = realloc(f->series, (size_t)cap * sizeof *grown);
        if (!grown) goto out;
        f->series = grown;
        f->cap = cap;
    }
    s = calloc(1, sizeof *s);
    if (!s) goto out;
    s->values = calloc((size_t)f->n_labels + 1, sizeof *s->values);
    s->n_buckets = f->n_buckets;
    s->bounds = f->bounds;
    s->type = f->type;
    if (f->type == METRICS_HISTOGRAM)
        s->buckets = calloc((size_t)f->n_buckets + 1, sizeof *s->buckets);
    int ok = s->values && (f->type != METRICS_HISTOGRAM || s->buckets);
    for (int i = 0; ok && i < f->n_labels; i++) {
        s->values[i] = strdup(label_values[i] ? label_values[i] : "");
        ok = s->values[i] != NULL;
    }
    if (!ok) {
        series_free(s, f->n_labels);
        s = NULL;
        goto out;
    }
    atomic_init(&s->bits, d2u(0.0));
    f->series[f->n_series++] = s;
out:
    pthread_mutex_unlock(&f->mu);
    return s;
}

void metrics_add(metrics_series *s, double v)
{
    if (!s || s->type == METRICS_HISTOGRAM) return;
    if (s->type == METRICS_COUNTER && !(v >= 0)) return;
    atomic_add_double(&s->bits, v);
}

void metrics_set(metrics_series *s, double v)
{
    if (!s || s->type != METRICS_GAUGE) return;
    atomic_store_explicit(&s->bits, d2u(v), memory_order_relaxed);
}

void metrics_observe(metrics_series *s, double v)
{
    if (!s || s->type != METRICS_HISTOGRAM) return;
    int i = 0;
    /* NaN compares false everywhere and lands in +Inf, like Prometheus. */
    while (i < s->n_buckets && !(v <= s->bounds[i])) i++;
    atomic_fetch_add_explicit(&s->buckets[i], 1, memory_order_relaxed);
    atomic_add_double(&s->bits, v);
}

void metrics_add_l(metrics_family *f, const char *const *label_values, double v)
{
    if (!f || f->type == METRICS_HISTOGRAM) return;
    metrics_add(metrics_series_get(f, label_values), v);
}

void metrics_set_l(metrics_family *f, const char *const *label_values, double v)
{
    if (!f || f->type != METRICS_GAUGE) return;
    metrics_set(metrics_series_get(f, label_values), v);
}

void metrics_observe_l(metrics_family *f, const char *const *label_values, double v)
{
    if (!f || f->type != METRICS_HISTOGRAM) return;
    metrics_observe(metrics_series_get(f, label_values), v);
}

double metrics_value(const metrics_series *s)
{
    if (!s) return 0;
    return u2d(atomic_load_explicit(&((metrics_series *)s)->bits, memory_order_relaxed));
}

uint64_t metrics_hist_bucket(const metrics_series *s, int i)
{
    if (!s || s->type != METRICS_HISTOGRAM || i < 0 || i > s->n_buckets) return 0;
    uint64_t n = 0;
    for (int j = 0; j <= i; j++)
        n += atomic_load_explicit(&s->buckets[j], memory_order_relaxed);
    return n;
}

uint64_t metrics_hist_count(const metrics_series *s)
{
    return s ? metrics_hist_bucket(s, s->n_buckets) : 0;
}

double metrics_hist_sum(const metrics_series *s)
{
    return s && s->type == METRICS_HISTOGRAM ? metrics_value(s) : 0;
}

void metrics_family_clear(metrics_family *f)
{
    if (!f) return;
    pthread_mutex_lock(&f->mu);
    for (int i = 0; i < f->n_series; i++) series_free(f->series[i], f->n_labels);
    f->n_series = 0;
    pthread_mutex_unlock(&f->mu);
}

void metrics_family_set_collect(metrics_family *f, metrics_collect_fn fn, void *ctx)
{
    if (!f) return;
    f->collect = fn;
    f->collect_ctx = ctx;
}

/* ---- rendering ---------------------------------------------------------- */

typedef struct sbuf {
    char *p;
    size_t len, cap;
    int failed;
} sbuf;

static void sb_reserve(sbuf *b, size_t extra)
{
    if (b->failed || b->len + extra + 1 <= b->cap) return;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + extra + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        b->failed = 1;
        return;
    }
    b->p = p;
    b->cap = cap;
}

static void sb_put(sbuf *b, const char *s, size_t n)
{
    sb_reserve(b, n);
    if (b->failed) return;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void sb_puts(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...)
{
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) {
        sb_put(b, tmp, (size_t)n);
        return;
    }
    sb_reserve(b, (size_t)n);
    if (b->failed) return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void metrics_format_double(double v, char *buf, size_t size)
{
    if (isnan(v)) {
        snprintf(buf, size, "NaN");
        return;
    }
    if (isinf(v)) {
        snprintf(buf, size, v > 0 ? "+Inf" : "-Inf");
        return;
    }
    /* Integers print as integers ("10", not "1e+01"): le labels read better. */
    if (v == (double)(long long)v && v > -1e15 && v < 1e15) {
        snprintf(buf, size, "%lld", (long long)v);
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, size, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) return;
    }
}

/* HELP text escapes backslash and newline; label values also escape '"'. */
static void sb_escaped(sbuf *b, const char *s, int quote)
{
    for (; *s; s++) {
        if (*s == '\\')
            sb_puts(b, "\\\\");
        else if (*s == '\n')
            sb_puts(b, "\\n");
        else if (quote && *s == '"')
            sb_puts(b, "\\\"");
        else
            sb_put(b, s, 1);
    }
}

/* {a="x",b="y"} plus an optional extra label (le); nothing when empty. */
static void sb_labels(sbuf *b, const metrics_family *f, const metrics_series *s,
                      const char *extra_name, const char *extra_value)
{
    if (f->n_labels == 0 && !extra_name) return;
    sb_puts(b, "{");
    for (int i = 0; i < f->n_labels; i++) {
        if (i) sb_puts(b, ",");
        sb_puts(b, f->labels[i]);
        sb_puts(b, "=\"");
        sb_escaped(b, s->values[i], 1);
        sb_puts(b, "\"");
    }
    if (extra_name) {
        if (f->n_labels) sb_puts(b, ",");
        sb_puts(b, extra_name);
        sb_puts(b, "=\"");
        sb_escaped(b, extra_value, 1);
        sb_puts(b, "\"");
    }
    sb_puts(b, "}");
}

static void render_family(sbuf *b, metrics_family *f)
{
    static const char *const type_names[] = {"counter", "gauge", "histogram"};
    char num[64];
    sb_printf(b, "# HELP %s ", f->name);
    sb_escaped(b, f->help, 0);
    sb_printf(b, "\n# TYPE %s %s\n", f->name, type_names[f->type]);

    pthread_mutex_lock(&f->mu);
    for (int i = 0; i < f->n_series; i++) {
        const metrics_series *s = f->series[i];
        if (f->type != METRICS_HISTOGRAM) {
            sb_puts(b, f->name);
            sb_labels(b, f, s, NULL, NULL);
            metrics_format_double(metrics_value(s), num, sizeof num);
            sb_printf(b, " %s\n", num);
            continue;
        }
        /* One snapshot of the counts so the buckets, +Inf and _count agree. */
        uint64_t cum = 0;
        for (int j = 0; j <= f->n_buckets; j++) {
            cum += atomic_load_explicit(&s->buckets[j], memory_order_relaxed);
            char le[64];
            if (j < f->n_buckets)
                metrics_format_double(f->bounds[j], le, sizeof le);
            else
                snprintf(le, sizeof le, "+Inf");
            sb_printf(b, "%s_bucket", f->name);
            sb_labels(b, f, s, "le", le);
            sb_printf(b, " %llu\n", (unsigned long long)cum);
        }
        metrics_format_double(metrics_value(s), num, sizeof num);
        sb_printf(b, "%s_sum", f->name);
        sb_labels(b, f, s, NULL, NULL);
        sb_printf(b, " %s\n", num);
        sb_printf(b, "%s_count", f->name);
        sb_labels(b, f, s, NULL, NULL);
        sb_printf(b, " %llu\n", (unsigned long long)cum);
    }
    pthread_mutex_unlock(&f->mu);
}

char *metrics_render(metrics_registry *r, size_t *len)
{
    if (!r) return NULL;
    sbuf b = {0};
    sb_reserve(&b, 0);
    pthread_mutex_lock(&r->mu);
    metrics_family *first = r->first;
    pthread_mutex_unlock(&r->mu);
    /* Families are only appended, never removed before registry_free, so the
     * list can be walked without the registry lock. */
    for (metrics_family *f = first; f; f = f->next) {
        if (f->collect) f->collect(f, f->collect_ctx);
        render_family(&b, f);
    }
    if (b.failed) {
        free(b.p);
        return NULL;
    }
    if (len) *len = b.len;
    return b.p;
}

/* ---- the daemon's families -------------------------------------------- */

static const double dur_buckets[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                     0.1,    0.25,  0.5,    1,     2.5,  5,     10};
static const double cand_buckets[] = {1,   8,    16,   32,   64,   128,  256,
                                      512, 1024, 2048, 4096, 8192, 16384};
static const double user_buckets[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};
static const double batch_secs[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                    0.01,   0.025,   0.05,   0.1,   0.25,   0.5,
                                    1,      2.5,     5,      10};
static const double req_buckets[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512};
static const double ratio_buckets[] = {1,   2,   4,   8,    16,   32,  64,
                                       128, 256, 512, 1024, 2048, 4096};
static const double fine_secs[] = {0.000005, 0.00001, 0.000025, 0.00005, 0.0001,
                                   0.00025,  0.0005,  0.001,    0.0025,  0.01};
static const char *const l_model_code[] = {"model", "code"};
static const char *const l_model[] = {"model"};
static const char *const l_mvs[] = {"model", "version", "state"};
static const char *const l_ver[] = {"version"};
static const char *const l_method_code[] = {"method", "code"};
static const char *const l_path_code[] = {"path", "code"};
static const char *const l_model_reason[] = {"model", "reason"};
static const char *const l_model_use[] = {"model", "use"};
static const char *const l_mvdk[] = {"model", "version", "device", "kind"};

/* One family of metrics_server: where it is kept, and its definition. The
 * table's order is the registration order, so the order of /metrics. */
typedef struct family_def {
    size_t off; /* offsetof(metrics_server, field) */
    enum metrics_type type;
    const char *name, *help;
    int n_labels;
    const char *const *labels;
    int n_buckets;
    const double *buckets;
} family_def;

#define ARR(a) (int)(sizeof a / sizeof *a), a
#define NONE 0, NULL
#define AT(field) offsetof(metrics_server, field)
static const family_def server_families[] = {
    {AT(requests_total), METRICS_COUNTER, "ikbo_requests_total",
     "Rank requests (gRPC and HTTP) by model and final status code.", ARR(l_model_code), NONE},
    {AT(request_duration_seconds), METRICS_HISTOGRAM, "ikbo_request_duration_seconds",
     "Rank request latency in the server, from receipt to response built.", ARR(l_model),
     ARR(dur_buckets)},
    {AT(request_candidates), METRICS_HISTOGRAM, "ikbo_request_candidates",
     "Candidates per scored Rank request.", NONE, ARR(cand_buckets)},
    {AT(request_unique_users), METRICS_HISTOGRAM, "ikbo_request_unique_users",
     "Unique users (rows after dedup) per scored Rank request.", NONE, ARR(user_buckets)},
    {AT(inflight_requests), METRICS_GAUGE, "ikbo_inflight_requests",
     "Rank requests being processed now.", NONE, NONE},
    {AT(model_loaded), METRICS_GAUGE, "ikbo_model_loaded",
     "1 for each known model version, labelled with its state (LOADING, READY, FAILED, "
     "UNLOADED).",
     ARR(l_mvs), NONE},
    {AT(build_info), METRICS_GAUGE, "ikbo_build_info",
     "Build of the running ikbo-serve; value is always 1.", ARR(l_ver), NONE},
    {AT(broadcast_bytes_avoided_total), METRICS_COUNTER, "ikbo_broadcast_bytes_avoided_total",
     "User-tensor bytes broadcast mode would have copied out to candidate rows and IKBO did "
     "not, summed over scored batches.",
     ARR(l_model), NONE},
    {AT(nonfinite_scores_total), METRICS_COUNTER, "ikbo_nonfinite_scores_total",
     "Candidates answered with a NaN or infinite score (ranked last): the model overflowed "
     "on their features or in the serving dtype.",
     ARR(l_model), NONE},
    {AT(grpc_requests_total), METRICS_COUNTER, "ikbo_grpc_requests_total",
     "gRPC calls by full method name (\"unknown\" for unregistered methods) and status code.",
     ARR(l_method_code), NONE},
    {AT(http_requests_total), METRICS_COUNTER, "ikbo_http_requests_total",
     "HTTP requests by route and HTTP status code.", ARR(l_path_code), NONE},
    {AT(grpc_receive_seconds), METRICS_HISTOGRAM, "ikbo_grpc_receive_seconds",
     "Per Rank call over gRPC: from a worker taking the call off its completion queue to the "
     "request submitted (re-requesting the method, starting the close op, reading and "
     "decoding the message).",
     NONE, ARR(fine_secs)},
    {AT(grpc_send_seconds), METRICS_HISTOGRAM, "ikbo_grpc_send_seconds",
     "Per Rank call over gRPC: from the answer handed to the send path (packing it, starting "
     "the send batch) to gRPC core reporting that batch done on a worker's queue.",
     NONE, ARR(fine_secs)},
    {AT(request_prepare_seconds), METRICS_HISTOGRAM, "ikbo_request_prepare_seconds",
     "Per admitted Rank request: validation, user dedup and batch assembly (the plan) on the "
     "thread that received it, before it is queued.",
     ARR(l_model), ARR(fine_secs)},
    {AT(queue_seconds), METRICS_HISTOGRAM, "ikbo_queue_seconds",
     "Time a Rank request waited in the batcher queue: submit to compute start of its batch.",
     ARR(l_model), ARR(batch_secs)},
    {AT(request_compute_seconds), METRICS_HISTOGRAM, "ikbo_request_compute_seconds",
     "Per Rank request: forward-pass (ikbo_score) time of the batch(es) that scored it, the "
     "share of its latency spent computing.",
     ARR(l_model), ARR(batch_secs)},
    {AT(batch_compute_seconds), METRICS_HISTOGRAM, "ikbo_batch_compute_seconds",
     "Forward-pass (ikbo_score) time per batch.", ARR(l_model), ARR(batch_secs)},
    {AT(batch_requests), METRICS_HISTOGRAM, "ikbo_batch_requests",
     "Rank requests (or chunks) merged into one batch.", ARR(l_model), ARR(req_buckets)},
    {AT(batch_users), METRICS_HISTOGRAM, "ikbo_batch_users",
     "Unique user rows per batch, after dedup across the merged requests.", ARR(l_model),
     ARR(user_buckets)},
    {AT(batch_candidates), METRICS_HISTOGRAM, "ikbo_batch_candidates", "Candidates per batch.",
     ARR(l_model), ARR(cand_buckets)},
    {AT(batch_candidates_per_user), METRICS_HISTOGRAM, "ikbo_batch_candidates_per_user",
     "Candidates per unique user row in a batch (C / U), the IKBO broadcast ratio.", ARR(l_model),
     ARR(ratio_buckets)},
    {AT(queue_requests), METRICS_GAUGE, "ikbo_queue_requests",
     "Rank requests admitted to the batcher queue and not yet in a batch.", ARR(l_model), NONE},
    {AT(queue_candidates), METRICS_GAUGE, "ikbo_queue_candidates",
     "Candidates admitted to the batcher queue and not yet in a batch.", ARR(l_model), NONE},
    {AT(batch_graphs_total), METRICS_COUNTER, "ikbo_batch_graphs_total",
     "Scored batches by what they did with batch graphs: none (off, or a shape's first "
     "batch), replayed, recorded, fell_back (a recording or replay failed).",
     ARR(l_model_use), NONE},
    {AT(rejected_total), METRICS_COUNTER, "ikbo_rejected_total",
     "Rank requests the batcher did not compute, by reason (queue_full, deadline, cancelled, "
     "error: their batch could not be built or scored).",
     ARR(l_model_reason), NONE},
    {AT(model_load_failures_total), METRICS_COUNTER, "ikbo_model_load_failures_total",
     "Model version loads that failed (bad files, validation, warm-up, memory check); the "
     "previous version keeps serving.",
     ARR(l_model), NONE},
    {AT(model_memory_bytes), METRICS_GAUGE, "ikbo_model_memory_bytes",
     "Memory the engine holds per READY model version, from its backend's byte accounting: "
     "kind=weights is the weights; user, candidate, broadcast and index are the execution "
     "contexts' workspace by tensor kind (grown to the largest batch seen, kept between "
     "batches; broadcast is 0 in IKBO mode). GPU memory when device is cuda:N, host memory "
     "when device is cpu. Not counted: the CUDA context, per-stream cuBLASLt workspaces and "
     "pinned host staging.",
     ARR(l_mvdk), NONE},
};
#undef ARR
#undef NONE
/* Every family field of metrics_server (requests_total .. model_memory_bytes,
 * the pointers before the cached series) has its row. */
_Static_assert(sizeof server_families / sizeof *server_families ==
                   (offsetof(metrics_server, inflight) - AT(requests_total)) /
                       sizeof(metrics_family *),
               "server_families and metrics_server's family fields are out of step");
#undef AT

int metrics_server_init(metrics_server *m, const char *version)
{
    memset(m, 0, sizeof *m);
    m->reg = metrics_registry_new();
    if (!m->reg) return -1;
    for (size_t i = 0; i < sizeof server_families / sizeof *server_families; i++) {
        const family_def *d = &server_families[i];
        metrics_family *f = metrics_family_new(m->reg, d->type, d->name, d->help, d->n_labels,
                                               d->labels, d->n_buckets, d->buckets);
        if (!f) goto fail;
        *(metrics_family **)(void *)((char *)m + d->off) = f;
    }
    /* The series with no labels (and build_info's one) exist from the
     * start, so a scrape shows them at 0, and hot paths use them directly. */
    const char *const vv[] = {version ? version : ""};
    metrics_series *bi = metrics_series_get(m->build_info, vv);
    m->inflight = metrics_series_get(m->inflight_requests, NULL);
    m->grpc_receive = metrics_series_get(m->grpc_receive_seconds, NULL);
    m->grpc_send = metrics_series_get(m->grpc_send_seconds, NULL);
    m->request_cands = metrics_series_get(m->request_candidates, NULL);
    m->request_users = metrics_series_get(m->request_unique_users, NULL);
    if (!bi || !m->inflight || !m->grpc_receive || !m->grpc_send || !m->request_cands ||
        !m->request_users)
        goto fail;
    metrics_set(bi, 1);
    return 0;
fail:
    metrics_server_free(m);
    return -1;
}

void metrics_server_free(metrics_server *m)
{
    metrics_registry_free(m->reg);
    memset(m, 0, sizeof *m);
}
