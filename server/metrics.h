/* metrics.h - a small thread-safe metrics registry and the Prometheus text
 * exposition (format 0.0.4) that GET /metrics serves.
 *
 * Why this exists: the daemon needs a handful of counters, gauges and
 * fixed-bucket histograms updated from every worker thread on the hot path
 * and rendered on scrape, without a dependency. Updates are lock-free
 * (atomics on the series); finding a series by label values takes the
 * family's mutex, so hot paths may keep the returned series pointer.
 *
 * Ownership: the registry owns its families and series; pointers stay valid
 * until metrics_registry_free, except that metrics_family_clear frees a
 * family's series (use it only for families whose series nobody keeps, i.e.
 * those refreshed by a collect hook). Strings passed in are copied.
 *
 * Thread-safety: metrics_family_new before threads use the registry (startup);
 * everything else from any thread. metrics_render is consistent per series
 * (a histogram's _count always equals its +Inf bucket) but not across
 * series.
 */
#ifndef IKBO_SERVER_METRICS_H
#define IKBO_SERVER_METRICS_H

#include <stddef.h>
#include <stdint.h>

typedef struct metrics_registry metrics_registry;
typedef struct metrics_family metrics_family;
typedef struct metrics_series metrics_series;

enum metrics_type { METRICS_COUNTER = 0, METRICS_GAUGE = 1, METRICS_HISTOGRAM = 2 };

#define METRICS_MAX_LABELS 8
#define METRICS_MAX_BUCKETS 32

metrics_registry *metrics_registry_new(void);
void metrics_registry_free(metrics_registry *r); /* NULL ok */

/* Adds a family. name follows Prometheus conventions (counters end in
 * _total, base units seconds/bytes); label_names has n_labels entries
 * (<= METRICS_MAX_LABELS); histograms take n_buckets ascending finite upper
 * bounds (<= METRICS_MAX_BUCKETS; +Inf is implicit). Families render in the
 * order they were added. NULL on a bad argument or allocation failure. */
metrics_family *metrics_family_new(metrics_registry *r, enum metrics_type type,
                                   const char *name, const char *help, int n_labels,
                                   const char *const *label_names, int n_buckets,
                                   const double *buckets);

/* The series with these label values (n_labels strings; NULL counts as ""),
 * created at zero on first use. NULL only on allocation failure. */
metrics_series *metrics_series_get(metrics_family *f, const char *const *label_values);

/* Counter: v >= 0 (negative v is ignored). Gauge: any v. */
void metrics_add(metrics_series *s, double v);
void metrics_set(metrics_series *s, double v); /* gauges */
void metrics_observe(metrics_series *s, double v); /* histograms */

/* Shorthands that look the series up first (NULL-safe: a NULL family or a
 * failed lookup does nothing). */
void metrics_add_l(metrics_family *f, const char *const *label_values, double v);
void metrics_set_l(metrics_family *f, const char *const *label_values, double v);
void metrics_observe_l(metrics_family *f, const char *const *label_values, double v);

/* Reads, for tests and /readyz-style checks. */
double metrics_value(const metrics_series *s);           /* counter/gauge */
uint64_t metrics_hist_count(const metrics_series *s);    /* observations */
double metrics_hist_sum(const metrics_series *s);
/* Observations <= bucket i's bound (cumulative); i == n_buckets is +Inf. */
uint64_t metrics_hist_bucket(const metrics_series *s, int i);

/* Removes every series of a family. */
void metrics_family_clear(metrics_family *f);

/* Called by metrics_render just before the family renders, outside any
 * registry lock: the hook refreshes the family (clear + set) from its
 * source of truth, e.g. the model registry's states. */
typedef void (*metrics_collect_fn)(metrics_family *f, void *ctx);
void metrics_family_set_collect(metrics_family *f, metrics_collect_fn fn, void *ctx);

/* The whole exposition as a malloc'd NUL-terminated string (*len its length
 * when len != NULL); NULL on allocation failure. Content type:
 * "text/plain; version=0.0.4; charset=utf-8". */
char *metrics_render(metrics_registry *r, size_t *len);

/* Formats v the way the exposition does (shortest text that reads back as
 * v; "+Inf", "-Inf", "NaN"). buf >= 32 bytes. */
void metrics_format_double(double v, char *buf, size_t size);

/* ---- the daemon's families -------------------------------------------- */

/* Every metric ikbo-serve exports; created once by metrics_server_init.
 * Label sets:
 *   requests_total{model,code}      Rank calls on both transports; model is
 *                                   "" when the name did not resolve
 *   request_duration_seconds{model} histogram, receive -> response built
 *   request_candidates              histogram of C per scored request
 *   request_unique_users            histogram of U (rows after dedup)
 *   inflight_requests               gauge, Rank requests being processed
 *   model_loaded{model,version,state} gauge 1 per known model version
 *   model_load_failures_total{model} counter: version loads that failed
 *                                   (validation, warm-up, memory check)
 *   model_memory_bytes{model,version,device,kind} gauge per READY version,
 *                                   refreshed at scrape by a collect hook
 *                                   (registry_collect_memory): kind "weights"
 *                                   (bk_stats.weight_bytes), "user",
 *                                   "candidate", "broadcast", "index"
 *                                   (bytes_live by bk_tag: the contexts'
 *                                   workspace). GPU memory on cuda:N, host
 *                                   memory on cpu.
 *   build_info{version}             gauge 1
 *   broadcast_bytes_avoided_total{model} user-tensor bytes broadcast mode would
 *                                   have copied to candidate rows, per scored batch
 *                                   (ikbo_ctx_last_avoided_bytes)
 *   request_prepare_seconds{model}  histogram per admitted request: validation and
 *                                   plan (rq_prepare) on the receiving thread
 *   Dynamic batcher (server/batcher.h), all labelled {model}:
 *   queue_seconds                   histogram per request: submit -> compute start
 *                                   of the (last) batch that carried it
 *   request_compute_seconds         histogram per request: forward-pass (ikbo_score)
 *                                   time of the batch(es) that carried it, i.e. the
 *                                   part of its latency spent computing
 *   batch_compute_seconds           histogram per batch: ikbo_score time
 *   batch_requests, batch_users, batch_candidates  histograms per batch (users =
 *                                   rows after cross-request dedup)
 *   batch_candidates_per_user       histogram per batch: C / U
 *   queue_requests, queue_candidates  gauges: admitted, not yet in a batch
 *   rejected_total{model,reason}    counter: queue_full, deadline, cancelled,
 *                                   error (batch not built or not scored)
 *   nonfinite_scores_total{model}   counter: candidates answered with a NaN or
 *                                   infinite score (ranked last; an overflow
 *                                   in the model, e.g. fp16, or extreme features)
 *   batch_graphs_total{model,use}   counter per scored batch: what it did with
 *                                   batch graphs (ikbo_ctx_last_graph): none,
 *                                   replayed, recorded, fell_back
 *   grpc_requests_total{method,code} every gRPC call by full method name
 *                                   (unknown methods as "unknown")
 *   grpc_receive_seconds            histogram per Rank call: a worker taking the
 *                                   call off its queue to the request submitted
 *                                   (re-request, close op, read, decode)
 *   grpc_send_seconds               histogram per Rank call: the answer handed to
 *                                   the send path to its send batch reported done
 *   http_requests_total{path,code}  every HTTP request by route and status
 */
typedef struct metrics_server {
    metrics_registry *reg;
    metrics_family *requests_total;
    metrics_family *request_duration_seconds;
    metrics_family *request_candidates;
    metrics_family *request_unique_users;
    metrics_family *inflight_requests;
    metrics_family *model_loaded;
    metrics_family *build_info;
    metrics_family *broadcast_bytes_avoided_total;
    metrics_family *nonfinite_scores_total;
    metrics_family *grpc_requests_total;
    metrics_family *grpc_receive_seconds;
    metrics_family *grpc_send_seconds;
    metrics_family *http_requests_total;
    metrics_family *request_prepare_seconds;
    metrics_family *queue_seconds;
    metrics_family *request_compute_seconds;
    metrics_family *batch_compute_seconds;
    metrics_family *batch_requests;
    metrics_family *batch_users;
    metrics_family *batch_candidates;
    metrics_family *batch_candidates_per_user;
    metrics_family *queue_requests;
    metrics_family *queue_candidates;
    metrics_family *rejected_total;
    metrics_family *batch_graphs_total;
    metrics_family *model_load_failures_total;
    metrics_family *model_memory_bytes;
    /* The families' unlabelled series, looked up once (the family fields
     * above come first and end at `inflight`: metrics.c's table relies on it). */
    metrics_series *inflight; /* the one inflight series */
    metrics_series *grpc_receive, *grpc_send; /* the gRPC spans' one series each */
    metrics_series *request_cands, *request_users; /* request_candidates, request_unique_users */
} metrics_server;

/* Creates the registry and families; build_info{version=version} = 1.
 * Returns 0, -1 on allocation failure (everything created is freed). */
int metrics_server_init(metrics_server *m, const char *version);
void metrics_server_free(metrics_server *m);

#endif
