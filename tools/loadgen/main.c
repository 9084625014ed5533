/* main.c - ikbo-loadgen: a load generator for ikbo.v1.Ranker/Rank on gRPC
 * core's C client API.
 *
 * What it does: asks the server for the model's inputs (ModelInfo), builds a
 * set of requests of the asked shape that fit the model, then drives the
 * server in a closed loop (--concurrency) or an open loop (--rate, latency
 * from the intended send time) for a warm-up and a measured window, and
 * prints counts by status, requests/s, candidates/s and latency percentiles
 * (text, or --json for scripts). `--help` lists every flag.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <grpc/grpc.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "client.h"
#include "hist.h"
#include "ikbo/v1/ranker.pb-c.h"
#include "run.h"
#include "shape.h"

#define LOADGEN_VERSION "0.1.0"

int lg_self_test(void); /* selftest.c */

static const char *prog = "ikbo-loadgen";

static void usage(FILE *f)
{
    fprintf(f,
"usage: %s [flags]\n"
"Load generator for ikbo.v1.Ranker/Rank (gRPC, plaintext). Asks the server for the\n"
"model's inputs (ModelInfo), builds --distinct requests of the given shape, and sends\n"
"them round-robin in a closed loop (--concurrency) or an open loop (--rate).\n"
"\n"
"target and model\n"
"  --target ADDR            server host:port or unix:PATH (default 127.0.0.1:50051)\n"
"  --model NAME             model to rank with (default demo)\n"
"  --model-version N        version to ask for, 0 = newest ready (default 0)\n"
"  --connect-timeout-ms MS  how long to wait for the server and a READY model version (default 5000)\n"
"request shape (a distribution DIST is N, A..B uniform inclusive, or A,B,C one of the list)\n"
"  --spec FILE              JSON shape spec, applied before the flags below (keys: users, candidates,\n"
"                           history, ids_per_bag, user_ids_per_bag, candidate_ids_per_bag,\n"
"                           repeat_users, user_pool, id_range, distinct, shuffle, top_k, seed,\n"
"                           model, model_version; a DIST is a number, a string, [A,B,C] or\n"
"                           {\"uniform\": [A, B]})\n"
"  --users N                users per request (default 1)\n"
"  --candidates DIST        candidates per user (default 70)\n"
"  --history DIST           history events per user (default: the model's max_len)\n"
"  --ids-per-bag DIST       ids per sparse bag, users and candidates (default 1)\n"
"  --user-ids-per-bag DIST  ids per user sparse bag\n"
"  --candidate-ids-per-bag DIST  ids per candidate sparse bag\n"
"  --repeat-users F         share of user slots filled from a fixed pool, 0..1 (default 0)\n"
"  --user-pool N            size of that pool (default 1000)\n"
"  --id-range N             sparse and history ids are drawn from [0, N) (default 1000000)\n"
"  --distinct N             distinct requests built and sent round-robin (default 64)\n"
"  --shuffle                interleave the candidates of different users\n"
"  --top-k K                RankRequest.top_k (default 0: all scores)\n"
"  --seed S                 seed of the request contents and the Poisson schedule (default 1)\n"
"  --encoding E             classic (RankRequest.users/candidates) or packed (packed_users/\n"
"                           packed_candidates: columnar little-endian bytes); the same requests\n"
"                           either way (default classic)\n"
"load\n"
"  --concurrency N          closed loop: calls in flight (default 8)\n"
"  --rate R                 open loop: R requests/s on a precomputed schedule; latency counts\n"
"                           from each request's intended send time (no coordinated omission)\n"
"  --poisson                open loop: exponential inter-arrival times (default: uniform 1/R)\n"
"  --max-inflight N         open loop: outstanding calls at most; later sends wait, and their\n"
"                           wait counts as latency (default 1000)\n"
"  --threads N              worker threads, each with a completion queue (default 1)\n"
"  --connections N          TCP connections (default: --threads)\n"
"  --warmup S               seconds sent but not measured (default 1)\n"
"  --duration S             measured seconds (default 10)\n"
"  --timeout-ms MS          deadline of each call (default 10000)\n"
"  --no-verify              do not unpack OK answers (default: check each has one finite\n"
"                           score per candidate, or top_k)\n"
"output\n"
"  --json                   one JSON object on stdout instead of the text report\n"
"  --self-test              run the built-in checks (histogram, distributions, requests in both\n"
"                           encodings), exit\n"
"  --help                   this text\n"
"  --version                print the version\n"
"\n"
"Exit status: 0 every measured call OK; 1 the run completed with failed or invalid\n"
"calls; 2 usage or setup error (bad flag, cannot connect, model not found).\n",
            prog);
}

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: error: ", prog);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(2);
}

static int64_t parse_int(const char *flag, const char *v, int64_t min, int64_t max)
{
    char *e;
    errno = 0;
    long long x = strtoll(v, &e, 10);
    if (!*v || *e || errno || x < min || x > max)
        die("%s: expected an integer %" PRId64 "..%" PRId64 ", got '%s'", flag, min, max, v);
    return x;
}

static double parse_num(const char *flag, const char *v, double min, double max)
{
    char *e;
    errno = 0;
    double x = strtod(v, &e);
    if (!*v || *e || errno || !isfinite(x) || x < min || x > max)
        die("%s: expected a number %g..%g, got '%s'", flag, min, max, v);
    return x;
}

static void parse_dist(const char *flag, const char *v, dist *d, int64_t min, int64_t max)
{
    char err[256];
    if (dist_parse(d, v, min, max, err, sizeof err)) die("%s: %s", flag, err);
}

typedef struct opts {
    const char *target;
    char *model;
    int64_t model_version;
    int connect_timeout_ms;
    shape sh;
    int concurrency, max_inflight, threads, connections, timeout_ms, verify, json, poisson;
    double rate, warmup, duration;
} opts;

/* Flags that take a value. */
static const char *const VALUE_FLAGS[] = {
    "--target", "--model", "--model-version", "--connect-timeout-ms", "--spec", "--users",
    "--candidates", "--history", "--ids-per-bag", "--user-ids-per-bag", "--candidate-ids-per-bag",
    "--repeat-users", "--user-pool", "--id-range", "--distinct", "--top-k", "--seed",
    "--concurrency", "--rate", "--max-inflight", "--threads", "--connections", "--warmup",
    "--duration", "--timeout-ms", "--encoding", NULL};
static const char *const BOOL_FLAGS[] = {"--shuffle", "--poisson", "--no-verify", "--json",
                                         "--self-test", "--help", "--version", NULL};

static int in_list(const char *const *l, const char *s)
{
    for (; *l; l++)
        if (!strcmp(*l, s)) return 1;
    return 0;
}

/* Splits argv into (flag, value) pairs; value NULL for boolean flags. */
typedef struct kv {
    char name[64];
    const char *value;
} kv;

static kv *split_args(int argc, char **argv, int *n)
{
    kv *out = calloc((size_t)argc + 1, sizeof *out);
    if (!out) die("out of memory");
    *n = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2)) die("unexpected argument '%s' (flags start with --; see --help)", a);
        const char *eq = strchr(a, '=');
        size_t len = eq ? (size_t)(eq - a) : strlen(a);
        if (len >= sizeof out->name) die("unknown flag '%s' (see --help)", a);
        kv *p = &out[(*n)++];
        memcpy(p->name, a, len);
        p->name[len] = 0;
        if (in_list(VALUE_FLAGS, p->name)) {
            if (eq) {
                p->value = eq + 1;
            } else {
                if (i + 1 >= argc) die("%s needs a value (see --help)", p->name);
                p->value = argv[++i];
            }
        } else if (in_list(BOOL_FLAGS, p->name)) {
            if (eq) die("%s takes no value", p->name);
        } else {
            die("unknown flag '%s' (see --help)", p->name);
        }
    }
    return out;
}

static void parse_args(opts *o, int argc, char **argv)
{
    memset(o, 0, sizeof *o);
    o->target = "127.0.0.1:50051";
    o->connect_timeout_ms = 5000;
    o->concurrency = 8;
    o->max_inflight = 1000;
    o->threads = 1;
    o->timeout_ms = 10000;
    o->verify = 1;
    o->warmup = 1;
    o->duration = 10;
    shape_defaults(&o->sh);
    int n;
    kv *a = split_args(argc, argv, &n);
    for (int i = 0; i < n; i++) {
        if (!strcmp(a[i].name, "--help")) {
            usage(stdout);
            exit(0);
        }
        if (!strcmp(a[i].name, "--version")) {
            printf("ikbo-loadgen %s\n", LOADGEN_VERSION);
            exit(0);
        }
        if (!strcmp(a[i].name, "--self-test")) exit(lg_self_test() ? 1 : 0);
    }
    int64_t spec_version = -1;
    for (int i = 0; i < n; i++) /* the spec first: flags override it */
        if (!strcmp(a[i].name, "--spec")) {
            char err[768];
            char *model = NULL;
            if (shape_apply_json_file(&o->sh, a[i].value, &model, &spec_version, err, sizeof err))
                die("--spec %s", err);
            if (model) {
                free(o->model);
                o->model = model;
            }
        }
    if (spec_version >= 0) o->model_version = spec_version;
    shape *s = &o->sh;
    for (int i = 0; i < n; i++) {
        const char *f = a[i].name, *v = a[i].value;
        if (!strcmp(f, "--target")) o->target = v;
        else if (!strcmp(f, "--model")) {
            if (!*v) die("--model: expected a model name");
            free(o->model);
            o->model = strdup(v);
        } else if (!strcmp(f, "--model-version")) o->model_version = parse_int(f, v, 0, INT64_MAX);
        else if (!strcmp(f, "--connect-timeout-ms"))
            o->connect_timeout_ms = (int)parse_int(f, v, 1, 3600000);
        else if (!strcmp(f, "--spec")) continue;
        else if (!strcmp(f, "--users")) s->users = (int)parse_int(f, v, 1, 1000000);
        else if (!strcmp(f, "--candidates")) parse_dist(f, v, &s->candidates, 0, 1000000);
        else if (!strcmp(f, "--history")) {
            parse_dist(f, v, &s->history, 0, 10000000);
            s->has_history = 1;
        } else if (!strcmp(f, "--ids-per-bag")) {
            parse_dist(f, v, &s->user_ids, 0, 1000000);
            s->cand_ids = s->user_ids;
        } else if (!strcmp(f, "--user-ids-per-bag")) parse_dist(f, v, &s->user_ids, 0, 1000000);
        else if (!strcmp(f, "--candidate-ids-per-bag")) parse_dist(f, v, &s->cand_ids, 0, 1000000);
        else if (!strcmp(f, "--repeat-users")) s->repeat_users = parse_num(f, v, 0, 1);
        else if (!strcmp(f, "--user-pool")) s->user_pool = (int)parse_int(f, v, 1, 100000000);
        else if (!strcmp(f, "--id-range")) s->id_range = parse_int(f, v, 1, INT64_MAX);
        else if (!strcmp(f, "--distinct")) s->distinct = (int)parse_int(f, v, 1, 1000000);
        else if (!strcmp(f, "--shuffle")) s->shuffle = 1;
        else if (!strcmp(f, "--top-k")) s->top_k = (uint32_t)parse_int(f, v, 0, UINT32_MAX);
        else if (!strcmp(f, "--seed")) s->seed = (uint64_t)parse_int(f, v, 0, INT64_MAX);
        else if (!strcmp(f, "--encoding")) {
            if ((s->encoding = lg_encoding_parse(v)) < 0)
                die("--encoding: expected classic or packed, got '%s'", v);
        }
        else if (!strcmp(f, "--concurrency")) o->concurrency = (int)parse_int(f, v, 1, 1000000);
        else if (!strcmp(f, "--rate")) o->rate = parse_num(f, v, 1e-3, 1e7);
        else if (!strcmp(f, "--poisson")) o->poisson = 1;
        else if (!strcmp(f, "--max-inflight")) o->max_inflight = (int)parse_int(f, v, 1, 1000000);
        else if (!strcmp(f, "--threads")) o->threads = (int)parse_int(f, v, 1, 1024);
        else if (!strcmp(f, "--connections")) o->connections = (int)parse_int(f, v, 1, 4096);
        else if (!strcmp(f, "--warmup")) o->warmup = parse_num(f, v, 0, 86400);
        else if (!strcmp(f, "--duration")) o->duration = parse_num(f, v, 0.001, 86400);
        else if (!strcmp(f, "--timeout-ms")) o->timeout_ms = (int)parse_int(f, v, 1, 86400000);
        else if (!strcmp(f, "--no-verify")) o->verify = 0;
        else if (!strcmp(f, "--json")) o->json = 1;
    }
    free(a);
    if (!o->model) o->model = strdup("demo");
    if (!o->connections) o->connections = o->threads;
    if (o->rate > 0 && o->poisson == 0 && o->rate * (o->warmup + o->duration) < 1)
        die("--rate %g over %g s schedules no request", o->rate, o->warmup + o->duration);
    if (o->rate <= 0 && o->poisson) die("--poisson needs --rate");
    if (o->rate <= 0 && o->concurrency < o->threads)
        die("--concurrency %d is less than --threads %d", o->concurrency, o->threads);
    if (o->rate > 0 && o->max_inflight < o->threads)
        die("--max-inflight %d is less than --threads %d", o->max_inflight, o->threads);
}

/* ModelInfo, retried while the server is unreachable or the model is still
 * loading. Exits on a definite error. */
static void fetch_model(const opts *o, lg_model *m)
{
    grpc_channel *ch = lg_channel_new(o->target, -1);
    if (!ch) die("cannot create a channel to %s", o->target);
    Ikbo__V1__ModelInfoRequest rq = IKBO__V1__MODEL_INFO_REQUEST__INIT;
    rq.model = o->model;
    size_t len = ikbo__v1__model_info_request__get_packed_size(&rq);
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf) die("out of memory");
    ikbo__v1__model_info_request__pack(&rq, buf);
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    char last[1024] = "";
    for (;;) {
        int code;
        char *details;
        uint8_t *resp;
        size_t resp_len;
        clock_gettime(CLOCK_MONOTONIC, &t);
        double left_ms = o->connect_timeout_ms - ((t.tv_sec - t0.tv_sec) * 1e3 + (t.tv_nsec - t0.tv_nsec) / 1e6);
        if (left_ms < 1) left_ms = 1;
        if (lg_unary(ch, "/ikbo.v1.Ranker/ModelInfo", buf, len, (int)left_ms, &code, &details, &resp,
                     &resp_len))
            die("cannot start a call to %s", o->target);
        if (code == GRPC_STATUS_OK) {
            Ikbo__V1__ModelInfoResponse *r = ikbo__v1__model_info_response__unpack(NULL, resp_len, resp);
            free(resp);
            if (!r) die("%s: ModelInfo answer does not parse", o->target);
            const Ikbo__V1__ModelDescription *d = NULL;
            for (size_t i = 0; i < r->n_models; i++)
                if (!strcmp(r->models[i]->name, o->model)) d = r->models[i];
            if (!d) die("model '%s' not found on %s (ModelInfo lists %zu other model(s))", o->model,
                        o->target, r->n_models);
            int rc = lg_model_from_desc(m, d, o->model_version, last, sizeof last);
            ikbo__v1__model_info_response__free_unpacked(r, NULL);
            free(details);
            if (rc == 0) break;
        } else if (code == GRPC_STATUS_NOT_FOUND) {
            die("model '%s' not found on %s: %s", o->model, o->target, details);
        } else if (code == GRPC_STATUS_UNAVAILABLE || code == GRPC_STATUS_DEADLINE_EXCEEDED) {
            snprintf(last, sizeof last, "cannot connect to %s: %s: %s", o->target, lg_code_name(code),
                     details);
            free(details);
        } else {
            die("%s: ModelInfo failed: %s: %s", o->target, lg_code_name(code), details);
        }
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 >= o->connect_timeout_ms)
            die("%s (gave up after %d ms; --connect-timeout-ms)", last, o->connect_timeout_ms);
        usleep(100000);
    }
    free(buf);
    grpc_channel_destroy(ch);
}

static json_t *lat_json(const hist *h)
{
    json_t *o = json_object();
    json_object_set_new(o, "count", json_integer((json_int_t)h->count));
    const double ms = 1e-6;
    json_object_set_new(o, "min", json_real(h->count ? (double)h->min * ms : 0));
    json_object_set_new(o, "mean", json_real(hist_mean(h) * ms));
    json_object_set_new(o, "p50", json_real(hist_quantile(h, 0.50) * ms));
    json_object_set_new(o, "p90", json_real(hist_quantile(h, 0.90) * ms));
    json_object_set_new(o, "p99", json_real(hist_quantile(h, 0.99) * ms));
    json_object_set_new(o, "p999", json_real(hist_quantile(h, 0.999) * ms));
    json_object_set_new(o, "max", json_real((double)h->max * ms * (h->count > 0)));
    return o;
}

static json_t *codes_json(const uint64_t *c)
{
    json_t *o = json_object();
    for (int i = 0; i < LG_N_CODES; i++)
        if (c[i]) json_object_set_new(o, lg_code_name(i), json_integer((json_int_t)c[i]));
    return o;
}

static void text_codes(const uint64_t *c)
{
    int any = 0;
    for (int i = 0; i < LG_N_CODES; i++)
        if (c[i]) {
            printf("%s%s %" PRIu64, any ? ", " : "", lg_code_name(i), c[i]);
            any = 1;
        }
    if (!any) printf("none");
}

static void text_lat(const char *label, const hist *h)
{
    const double ms = 1e-6;
    printf("%-12s min %.3f  mean %.3f  p50 %.3f  p90 %.3f  p99 %.3f  p99.9 %.3f  max %.3f ms (%" PRIu64
           " calls)\n",
           label, h->count ? (double)h->min * ms : 0, hist_mean(h) * ms, hist_quantile(h, .5) * ms,
           hist_quantile(h, .9) * ms, hist_quantile(h, .99) * ms, hist_quantile(h, .999) * ms,
           h->count ? (double)h->max * ms : 0, h->count);
}

/* What a run's report needs: the options, the model, the requests and the
 * merged stats, with the figures and shape strings derived once. */
typedef struct report {
    const opts *o;
    const lg_model *m;
    const lg_bodies *bodies;
    const lg_stats *st;
    int open;
    double rps, ok_rps, cps;
    char cd[256], hd[256], uid[256], cid[256];
} report;

static void report_init(report *r, const opts *o, const lg_model *m, const lg_bodies *bodies,
                        const lg_stats *st)
{
    const shape *s = &o->sh;
    r->o = o;
    r->m = m;
    r->bodies = bodies;
    r->st = st;
    r->open = o->rate > 0;
    r->rps = (double)st->measured / st->duration_s;
    r->ok_rps = (double)st->lat_ok.count / st->duration_s;
    r->cps = st->ok_candidates / st->duration_s;
    dist_format(&s->candidates, r->cd, sizeof r->cd);
    if (s->has_history) dist_format(&s->history, r->hd, sizeof r->hd);
    else snprintf(r->hd, sizeof r->hd, "%u", m->has_history ? m->hist_max_len : 0);
    dist_format(&s->user_ids, r->uid, sizeof r->uid);
    dist_format(&s->cand_ids, r->cid, sizeof r->cid);
}

static json_t *shape_json(const report *r)
{
    const shape *s = &r->o->sh;
    json_t *sj = json_object();
    json_object_set_new(sj, "users", json_integer(s->users));
    json_object_set_new(sj, "candidates", json_string(r->cd));
    json_object_set_new(sj, "history", json_string(r->hd));
    json_object_set_new(sj, "user_ids_per_bag", json_string(r->uid));
    json_object_set_new(sj, "candidate_ids_per_bag", json_string(r->cid));
    json_object_set_new(sj, "repeat_users", json_real(s->repeat_users));
    json_object_set_new(sj, "user_pool", json_integer(s->user_pool));
    json_object_set_new(sj, "id_range", json_integer(s->id_range));
    json_object_set_new(sj, "distinct", json_integer(s->distinct));
    json_object_set_new(sj, "shuffle", json_boolean(s->shuffle));
    json_object_set_new(sj, "top_k", json_integer(s->top_k));
    json_object_set_new(sj, "seed", json_integer((json_int_t)s->seed));
    json_object_set_new(sj, "encoding", json_string(lg_encoding_name(s->encoding)));
    json_object_set_new(sj, "mean_candidates", json_real(r->bodies->mean_cands));
    json_object_set_new(sj, "mean_request_bytes", json_real(r->bodies->mean_bytes));
    return sj;
}

static json_t *measured_json(const report *r)
{
    const lg_stats *st = r->st;
    json_t *mj = json_object();
    json_object_set_new(mj, "requests", json_integer((json_int_t)st->measured));
    json_object_set_new(mj, "codes", codes_json(st->codes));
    json_object_set_new(mj, "invalid_responses", json_integer((json_int_t)st->invalid));
    json_object_set_new(mj, "requests_per_s", json_real(r->rps));
    json_object_set_new(mj, "ok_per_s", json_real(r->ok_rps));
    json_object_set_new(mj, "candidates_per_s", json_real(r->cps));
    json_object_set_new(mj, "latency_ms", lat_json(&st->lat_ok));
    json_object_set_new(mj, "latency_all_ms", lat_json(&st->lat_all));
    if (r->open) json_object_set_new(mj, "send_lag_ms", lat_json(&st->send_lag));
    return mj;
}

/* --json: one object on stdout (bench/e2e/run.sh and report.py read it). */
static void print_json(const report *r)
{
    const opts *o = r->o;
    const lg_stats *st = r->st;
    json_t *j = json_object();
    json_object_set_new(j, "target", json_string(o->target));
    json_object_set_new(j, "model", json_string(r->m->name));
    json_object_set_new(j, "model_version", json_integer(r->m->version));
    json_object_set_new(j, "server_mode", json_string(r->m->mode));
    json_object_set_new(j, "device", json_string(r->m->device));
    json_object_set_new(j, "loop", json_string(r->open ? "open" : "closed"));
    if (r->open) {
        json_object_set_new(j, "rate", json_real(o->rate));
        json_object_set_new(j, "arrivals", json_string(o->poisson ? "poisson" : "uniform"));
        json_object_set_new(j, "max_inflight", json_integer(o->max_inflight));
    } else {
        json_object_set_new(j, "concurrency", json_integer(o->concurrency));
    }
    json_object_set_new(j, "threads", json_integer(o->threads));
    json_object_set_new(j, "connections", json_integer(o->connections));
    json_object_set_new(j, "warmup_s", json_real(o->warmup));
    json_object_set_new(j, "duration_s", json_real(st->duration_s));
    json_object_set_new(j, "elapsed_s", json_real(st->elapsed_s));
    json_object_set_new(j, "timeout_ms", json_integer(o->timeout_ms));
    json_object_set_new(j, "verify", json_boolean(o->verify));
    json_object_set_new(j, "shape", shape_json(r));
    json_object_set_new(j, "sent", json_integer((json_int_t)st->sent));
    if (r->open) {
        json_object_set_new(j, "scheduled", json_integer((json_int_t)st->scheduled));
        json_object_set_new(j, "unsent", json_integer((json_int_t)st->unsent));
    }
    json_object_set_new(j, "codes", codes_json(st->codes_all));
    json_object_set_new(j, "invalid_responses", json_integer((json_int_t)st->invalid_all));
    json_object_set_new(j, "measured", measured_json(r));
    json_object_set_new(j, "first_error", st->first_error[0] ? json_string(st->first_error) : json_null());
    char *out = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10));
    if (!out) die("out of memory");
    puts(out);
    free(out);
    json_decref(j);
}

static void print_text(const report *r)
{
    const opts *o = r->o;
    const shape *s = &o->sh;
    const lg_stats *st = r->st;
    printf("ikbo-loadgen %s -> %s, model %s version %" PRId64 " (%s, %s)\n", LOADGEN_VERSION,
           o->target, r->m->name, r->m->version, r->m->mode, r->m->device);
    if (r->open)
        printf("open loop: %.1f req/s (%s arrivals, at most %d in flight)", o->rate,
               o->poisson ? "poisson" : "uniform", o->max_inflight);
    else
        printf("closed loop: concurrency %d", o->concurrency);
    printf(", %d thread(s), %d connection(s), warm-up %.1f s, measured %.1f s, timeout %d ms\n",
           o->threads, o->connections, o->warmup, st->duration_s, o->timeout_ms);
    printf("shape: %d user(s)/request, candidates/user %s (mean %.1f per request), history %s, "
           "ids/bag user %s candidate %s, repeat users %.2f (pool %d), %d distinct requests of "
           "%.0f bytes mean (%s encoding)\n",
           s->users, r->cd, r->bodies->mean_cands, r->hd, r->uid, r->cid, s->repeat_users,
           s->user_pool, s->distinct, r->bodies->mean_bytes, lg_encoding_name(s->encoding));
    printf("sent %" PRIu64 " (warm-up included): ", st->sent);
    text_codes(st->codes_all);
    if (r->open) printf("; unsent %" PRIu64 " of %" PRIu64 " scheduled", st->unsent, st->scheduled);
    printf("\nmeasured %" PRIu64 ": ", st->measured);
    text_codes(st->codes);
    if (st->invalid) printf(", invalid answers %" PRIu64, st->invalid);
    printf("\nthroughput  %.1f req/s (OK %.1f/s), %.0f candidates/s\n", r->rps, r->ok_rps, r->cps);
    text_lat("latency OK", &st->lat_ok);
    if (st->lat_all.count != st->lat_ok.count) text_lat("latency all", &st->lat_all);
    if (r->open) text_lat("send lag", &st->send_lag);
    if (st->first_error[0]) printf("first error: %s\n", st->first_error);
}

int main(int argc, char **argv)
{
    opts o;
    parse_args(&o, argc, argv);
    grpc_init();
    lg_model m;
    fetch_model(&o, &m);
    shape *s = &o.sh;
    if (s->has_history && !m.has_history && dist_max(&s->history) > 0)
        die("--history: model '%s' takes no history", m.name);
    lg_bodies bodies;
    char err[512];
    if (lg_bodies_build(&bodies, s, &m, err, sizeof err)) die("%s", err);
    lg_run_opts ro = {
        .target = o.target,
        .threads = o.threads,
        .connections = o.connections,
        .concurrency = o.concurrency,
        .rate = o.rate,
        .poisson = o.poisson,
        .max_inflight = o.max_inflight,
        .warmup_s = o.warmup,
        .duration_s = o.duration,
        .timeout_ms = o.timeout_ms,
        .verify = o.verify,
        .bodies = &bodies,
        .seed = s->seed,
    };
    lg_stats *st = calloc(1, sizeof *st);
    if (!st) die("out of memory");
    if (lg_run(&ro, st, err, sizeof err)) die("%s", err);

    report r;
    report_init(&r, &o, &m, &bodies, st);
    if (o.json) print_json(&r);
    else print_text(&r);
    int failed = st->invalid_all > 0 || st->unsent > 0 || st->measured == 0;
    for (int c = 1; c < LG_N_CODES; c++) failed |= st->codes_all[c] > 0;
    if (!o.json && st->measured == 0) fprintf(stderr, "%s: no call finished in the measured window\n", prog);
    free(st);
    lg_bodies_free(&bodies);
    lg_model_free(&m);
    free(o.model);
    grpc_shutdown();
    return failed ? 1 : 0;
}
