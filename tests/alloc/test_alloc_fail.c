/* test_alloc_fail.c - out-of-memory sweeps over the engine and the server's
 * request path (make alloc-fail).
 *
 * Why this exists: most `out of memory` branches never run in the other
 * tests. Here each operation is repeated with the 1st, 2nd, 3rd, ...
 * counted allocation failing (alloc_fail.h: the binary is linked with
 * -Wl,--wrap=malloc,... so only our own objects' calls are counted), until
 * an iteration completes with no failure injected, first failing that one
 * allocation only, then failing it and every one after ("persistent", as in
 * SQLite's test_malloc.c). Every iteration must
 *   - end in a clean error (a load error string, an INTERNAL /
 *     RESOURCE_EXHAUSTED status, a FAILED version with its reason) or in
 *     success with the right result (a fallback took over), never a crash,
 *     a hang or a client-error status for a valid request;
 *   - leak nothing: the live block count returns to what it was;
 *   - leave the object working: the same registry / batcher / loader then
 *     succeeds with failures off, with bitwise the reference scores.
 * Sweeps: model load + score (ikbo and broadcast mode), three folded models'
 * load and plan (engine/fold.h), the registry's first
 * load, a hot swap to a new version and an unload of 66 versions at once, a
 * Rank request end to end (gRPC wire bytes through the fast decoder, through
 * the protobuf-c fallback, and the HTTP JSON body; on a fresh server and on
 * a warm one), the JSON mapper on a packed request, a batcher merge of
 * three requests, ModelInfo, config resolution, and the transports on loopback: starting the gRPC server
 * (with and without TLS files) and the HTTP server, a gRPC Rank call
 * (the client on this thread, not counted; the server's ikbo-grpc thread
 * and the batcher counted) and /healthz plus a chunked HTTP :rank.
 *
 * Determinism: allocations count only on the threads a sweep names (roles
 * in alloc_fail.h); the request sweeps count the test thread and the
 * batcher's sweeper, instance and completer, which handle one request in
 * turn; the merge sweep counts the instance only (it merges, computes and,
 * with nothing queued behind, answers). Waits are bounded
 * (WAIT_S); nothing depends on speed.
 *
 * What is accepted, knowingly: a fallback that succeeds (the protobuf-c
 * unpack where the fast decoder's arena failed, an instance retrying a
 * batch it could not allocate, the memory estimate from the file size);
 * /metrics missing a series for that one scrape; jansson-internal failures
 * only in the load, config and first-allocation sweeps, because jansson
 * 2.14 aborts (assert in lex_scan_string) when one fails inside a string
 * token and reports others as a syntax error.
 *
 * Output: one line per sweep; with AF_SITES=<file> the allocation call
 * sites (file:line calls failed) for tests/alloc/coverage.sh. AF_ONLY=<name
 * part> runs matching sweeps only, AF_VERBOSE=1 prints where each
 * recovered failure was injected.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "alloc_fail.h"
#include "engine/batch_graph.h"
#include "engine/ikbo.h"
#include "server/batcher.h"
#include "server/batcher_set.h"
#include "server/config.h"
#include "server/grpc_server.h"
#include "server/http.h"
#include "server/log.h"
#include "server/metrics.h"
#include "server/pb_arena.h"
#include "server/rank.h"
#include "server/rank_wire.h"
#include "server/registry.h"
#include "server/request.h"
#include "tools/loadgen/client.h"
#include "tests/unit/engine_fixture.h"

#include <arpa/inet.h>
#include <grpc/grpc.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#define WAIT_S 20             /* longest wait for an answer or a free */
#define MAX_ITER 200000       /* a sweep that does not end is a bug */
/* Armed requests in persistent mode: an instance retries a batch it
 * could not allocate every millisecond until memory returns; the request's
 * deadline ends that. */
#define REQ_DEADLINE_NS 300000000LL
#define N_MERGE 3

typedef char why_t[600];

static int failf(char *why, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int failf(char *why, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why_t), fmt, ap);
    va_end(ap);
    return -1;
}

static int64_t mono_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* ---- fixtures ----------------------------------------------------------- */

static char g_repo[64];          /* temp repository: demo/1 (and demo/2 in the swap sweep) */
static char g_v1[128], g_v2[128];
static const char *g_root = "."; /* the source tree (models/demo) */
static char *g_json;             /* the example request, modelVersion 0 */
static size_t g_json_len;
static uint8_t *g_wire, *g_wire_fb; /* packed; + an unknown field (fast decoder declines) */
static size_t g_wire_len, g_wire_fb_len;
static rq_plan *g_plan;          /* for the engine-only sweep */
static int g_C, g_T;
static float *g_ref_scores, *g_ref_tasks; /* [C], [C*T] in request order */
static int g_persistent;         /* the mode being swept */

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    struct stat sb;
    char *b = fstat(fileno(f), &sb) ? NULL : af_sys_malloc((size_t)sb.st_size + 1);
    size_t n = b ? fread(b, 1, (size_t)sb.st_size, f) : 0;
    fclose(f);
    if (b && n != (size_t)sb.st_size) {
        af_sys_free(b);
        return NULL;
    }
    if (b) b[n] = 0;
    *len = n;
    return b;
}

static int copy_file(const char *from, const char *to)
{
    size_t n;
    char *b = read_file(from, &n);
    if (!b) return -1;
    FILE *f = fopen(to, "wb");
    int rc = f && fwrite(b, 1, n, f) == n ? 0 : -1;
    if (f && fclose(f)) rc = -1;
    af_sys_free(b);
    return rc;
}

static int copy_version(const char *dst)
{
    char a[512], b[512];
    if (mkdir(dst, 0755) && errno != EEXIST) return -1;
    const char *files[] = {"model.json", "weights.safetensors"};
    for (int i = 0; i < 2; i++) {
        snprintf(a, sizeof a, "%s/models/demo/1/%s", g_root, files[i]);
        snprintf(b, sizeof b, "%s/%s", dst, files[i]);
        if (copy_file(a, b)) return -1;
    }
    return 0;
}

static void remove_version(const char *dir)
{
    char p[512];
    snprintf(p, sizeof p, "%s/model.json", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/weights.safetensors", dir);
    unlink(p);
    rmdir(dir);
}

/* A packed message in a buffer of the test's own. */
static uint8_t *pack_request(const Ikbo__V1__RankRequest *r, size_t extra, size_t *len)
{
    size_t n = ikbo__v1__rank_request__get_packed_size(r);
    uint8_t *w = af_sys_malloc(n + extra + 1);
    if (w) ikbo__v1__rank_request__pack(r, w);
    *len = n;
    return w;
}

static char g_fold[256];      /* the engine fixture's version directory (fold_load_op) */
static char g_fold_mlp2[256]; /* its mlp2 variant's (ef_write_mlp2_model) */
static char g_fold_upart[256]; /* its composed user part's (ef_write_upart_model) */

static int fixtures(char *why)
{
    char path[512];
    snprintf(g_repo, sizeof g_repo, "/tmp/ikbo_alloc_fail_XXXXXX");
    if (!mkdtemp(g_repo)) return failf(why, "mkdtemp: %s", strerror(errno));
    snprintf(path, sizeof path, "%s/demo", g_repo);
    snprintf(g_v1, sizeof g_v1, "%s/demo/1", g_repo);
    snprintf(g_v2, sizeof g_v2, "%s/demo/2", g_repo);
    if (mkdir(path, 0755) || copy_version(g_v1)) return failf(why, "cannot copy models/demo/1");
    if (ef_write_model("alloc_fold", g_fold, sizeof g_fold) ||
        ef_write_mlp2_model("alloc_fold_mlp2", g_fold_mlp2, sizeof g_fold_mlp2) ||
        ef_write_upart_model("alloc_fold_upart", g_fold_upart, sizeof g_fold_upart))
        return failf(why, "cannot write the engine fixture models");
    snprintf(path, sizeof path, "%s/models/demo/example_request.json", g_root);
    g_json = read_file(path, &g_json_len);
    char *v = g_json ? strstr(g_json, "\"modelVersion\": 1") : NULL;
    if (!v) return failf(why, "%s: no \"modelVersion\": 1", path);
    v[strlen("\"modelVersion\": ")] = '0'; /* newest: the swap sweep serves 1 then 2 */
    rq_status st;
    Ikbo__V1__RankRequest *req = rq_request_from_json(g_json, g_json_len, &st);
    if (!req) return failf(why, "example request: %s", st.msg);
    g_wire = pack_request(req, 0, &g_wire_len);
    /* field 15, varint 1: skipped by protobuf-c, declined by rank_wire */
    g_wire_fb = pack_request(req, 2, &g_wire_fb_len);
    g_wire_fb[g_wire_fb_len++] = 15 << 3;
    g_wire_fb[g_wire_fb_len++] = 1;
    ikbo_err err = {{0}};
    ikbo_model *m = ikbo_model_load(g_v1, NULL, &err);
    if (!m) return failf(why, "load: %s", err.msg);
    const ikbo_model_info *mi = ikbo_model_get_info(m);
    g_plan = rq_plan_build(req, mi, &st);
    ikbo_ctx *ctx = g_plan ? ikbo_ctx_new(m, &err) : NULL;
    g_C = (int)req->n_candidates;
    g_T = mi->n_tasks;
    float *s = af_sys_malloc((size_t)g_C * sizeof *s), *t = af_sys_malloc((size_t)g_C * g_T * 4);
    g_ref_scores = af_sys_malloc((size_t)g_C * sizeof *s);
    g_ref_tasks = af_sys_malloc((size_t)g_C * g_T * 4);
    int rc = ctx && ikbo_score(ctx, &g_plan->batch, t, s, &err) == 0 ? 0 : -1;
    for (int i = 0; !rc && i < g_C; i++) { /* batch order -> request order */
        int r = g_plan->order[i];
        g_ref_scores[r] = s[i];
        memcpy(g_ref_tasks + (size_t)r * g_T, t + (size_t)i * g_T, (size_t)g_T * 4);
    }
    af_sys_free(s);
    af_sys_free(t);
    ikbo_ctx_free(ctx);
    ikbo_model_free(m);
    rq_request_free(req);
    return rc ? failf(why, "reference scores: %s", err.msg) : 0;
}

/* Scores in request order equal the reference, bitwise (CPU). */
static int check_scores(const Ikbo__V1__RankResponse *r, char *why)
{
    if ((int)r->n_scores != g_C) return failf(why, "%zu scores, want %d", r->n_scores, g_C);
    for (size_t k = 0; k < r->n_scores; k++) {
        const Ikbo__V1__Score *s = r->scores[k];
        if (s->index >= (uint32_t)g_C || memcmp(&s->score, &g_ref_scores[s->index], 4) ||
            (int)s->n_task_scores != g_T ||
            memcmp(s->task_scores, g_ref_tasks + (size_t)s->index * g_T, (size_t)g_T * 4))
            return failf(why, "score %zu (candidate %u) differs from the reference", k, s->index);
    }
    return 0;
}

/* An allocation failure may end in these codes only; a valid request never
 * gets a client-error status because memory ran out. DEADLINE_EXCEEDED: a
 * retry loop (an instance's) outlived the deadline, persistent mode. */
static long g_jansson_misreports; /* see clean_code */

static int clean_code(const rq_status *st, char *why)
{
    if (!st->msg[0]) return failf(why, "%s without a message", rq_code_name(st->code));
    if (st->code == RQ_INTERNAL || st->code == RQ_RESOURCE_EXHAUSTED ||
        st->code == RQ_UNAVAILABLE || (g_persistent && st->code == RQ_DEADLINE_EXCEEDED))
        return 1;
    /* jansson 2.14's lexer reports some of its own allocation failures as a
     * syntax error ("string or '}' expected"): nothing the caller can tell
     * apart. Those (and only those) pass, counted. */
    size_t len = strlen(st->msg);
    if (st->code == RQ_INVALID_ARGUMENT && af_last_failure_in_jansson() &&
        strstr(st->msg, "invalid JSON") && st->msg[len - 1] != ' ' /* a syntax error named */) {
        g_jansson_misreports++;
        return 1;
    }
    return failf(why, "out of memory answered %s: %s", rq_code_name(st->code), st->msg);
}

/* ---- a server in-process ------------------------------------------------ */

typedef struct world {
    metrics_server mx;
    int mx_ok;
    registry *reg;
    batcher_set *bs;
    rq_limits lim;
    rank_env env;
    config_batching batching;
} world;

static void world_batching(world *w, long long max_c, long long delay_us)
{
    config_batching_default(&w->batching);
    w->batching.instances = 1;
    w->batching.max_batch_candidates = max_c;
    w->batching.max_queue_delay_us = delay_us;
}

/* The registry and batchers over g_repo (metrics made before). 0, or 1 with
 * the load error in why (nothing held but what world_free frees). */
static int world_open(world *w, int configured, char *why)
{
    static const char *const names[] = {"demo"};
    /* Every model directory (the scan lists them), a policy of its own. */
    static const registry_model_policy pol[] = {{"demo", {.latest = 1}}};
    registry_opts o;
    memset(&o, 0, sizeof o);
    o.repository = g_repo;
    o.policies = pol;
    o.n_policies = 1;
    o.models = configured ? names : NULL;
    o.n_models = configured ? 1 : 0;
    o.device = "cpu";
    o.n_slots = CONFIG_BATCH_MAX_INSTANCES;
    ikbo_err err = {{0}};
    w->reg = registry_new(&o, &err);
    if (!w->reg) return failf(why, "registry_new: %s", err.msg), 1;
    w->bs = batcher_set_new(w->reg, &w->batching, &w->mx, NULL, NULL, &err);
    if (!w->bs) return failf(why, "batcher_set_new: %s", err.msg), 1;
    rq_limits_default(&w->lim);
    w->env = (rank_env){w->reg, &w->lim, &w->mx, w->bs};
    registry_poll_once(w->reg, 1);
    return 0;
}

static int world_metrics(world *w, char *why)
{
    if (metrics_server_init(&w->mx, "test")) return failf(why, "metrics_server_init");
    w->mx_ok = 1;
    return 0;
}

static void world_free(world *w)
{
    batcher_set_free(w->bs);
    registry_free(w->reg);
    if (w->mx_ok) metrics_server_free(&w->mx);
    w->bs = NULL;
    w->reg = NULL;
    w->mx_ok = 0;
}

/* One Rank call in flight: what the transport keeps until the answer. */
typedef struct call {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
    int json;                        /* HTTP: the response goes back to the caller */
    pb_arena *arena;                 /* wire request's memory (freed by the callback) */
    Ikbo__V1__RankRequest *json_req; /* JSON request (freed by the caller) */
    Ikbo__V1__RankResponse *resp;    /* JSON: the answer, for the caller */
    uint8_t *packed;                 /* wire: the response as sent (test buffer) */
    size_t packed_len;
    rq_status st;
} call;

/* rank_submit's callback. Wire: as grpc_server.c's rank_done (pack, free the
 * response and the request's arena). JSON: as rank_handle's (hand it over). */
static void on_answer(void *arg, Ikbo__V1__RankResponse *resp, const rq_status *st)
{
    call *c = arg;
    if (!c->json) {
        if (resp) {
            size_t n = ikbo__v1__rank_response__get_packed_size(resp);
            c->packed = af_sys_malloc(n + 1);
            if (c->packed) c->packed_len = ikbo__v1__rank_response__pack(resp, c->packed);
        }
        rq_response_free(resp);
        resp = NULL;
        pb_arena_free(c->arena);
        c->arena = NULL;
    }
    pthread_mutex_lock(&c->mu);
    c->resp = resp;
    c->st = *st;
    c->done = 1;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static int call_wait(call *c, char *why)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += WAIT_S;
    pthread_mutex_lock(&c->mu);
    while (!c->done && pthread_cond_timedwait(&c->cv, &c->mu, &until) != ETIMEDOUT) {
    }
    int done = c->done;
    pthread_mutex_unlock(&c->mu);
    return done ? 0 : failf(why, "no answer within %d s", WAIT_S);
}

/* The gRPC handler's decode (grpc_server.c unpack -> rank_wire_unpack). */
static Ikbo__V1__RankRequest *decode_wire(const uint8_t *b, size_t n, pb_arena **arena,
                                          rq_status *st)
{
    return (Ikbo__V1__RankRequest *)rank_wire_unpack(&ikbo__v1__rank_request__descriptor, b, n,
                                                     arena, st);
}

enum transport { T_WIRE, T_WIRE_FALLBACK, T_JSON };
static const char *const T_NAME[] = {"wire", "wire-fallback", "json"};

/* One request over transport t, from decoding to the bytes sent, on this
 * thread and the batcher's, then failures off (af_disarm) and the answer
 * checked. 0 ok (scores as the reference), 1 clean error, -1 bug. */
static int one_request(world *w, enum transport t, int64_t deadline, char *why)
{
    call c;
    memset(&c, 0, sizeof c);
    pthread_mutex_init(&c.mu, NULL);
    pthread_cond_init(&c.cv, NULL);
    c.json = t == T_JSON;
    Ikbo__V1__RankRequest *req;
    if (t == T_JSON)
        req = c.json_req = rq_request_from_json(g_json, g_json_len, &c.st);
    else
        req = decode_wire(t == T_WIRE ? g_wire : g_wire_fb, t == T_WIRE ? g_wire_len : g_wire_fb_len,
                          &c.arena, &c.st);
    int rc = 0;
    char *body = NULL;
    if (req) {
        rank_submit(&w->env, req, deadline, NULL, T_NAME[t], on_answer, &c);
        rc = call_wait(&c, why);
        if (!rc && t == T_JSON) /* the HTTP handler's body; NULL: it sends 500 */
            body = c.resp ? rq_response_to_json(c.resp) : rq_error_json(&c.st);
    }
    af_disarm();
    if (rc) return rc; /* hung: leave c (the batcher may still call back) */
    if (c.st.code != RQ_OK) {
        rc = clean_code(&c.st, why);
    } else if (t == T_JSON) {
        rc = !c.resp ? failf(why, "OK without a response") : !body ? 1 : check_scores(c.resp, why);
    } else if (!c.packed) {
        rc = 1; /* the test's own buffer: cannot happen */
    } else {
        Ikbo__V1__RankResponse *r = ikbo__v1__rank_response__unpack(NULL, c.packed_len, c.packed);
        rc = r ? check_scores(r, why) : failf(why, "response does not unpack");
        if (r) ikbo__v1__rank_response__free_unpacked(r, NULL);
    }
    free(body);
    rq_response_free(c.resp);
    af_sys_free(c.packed);
    rq_request_free(c.json_req);
    pthread_mutex_destroy(&c.mu);
    pthread_cond_destroy(&c.cv);
    return rc;
}

/* Failures off: the object must work normally. */
static int must_serve(world *w, char *why)
{
    why_t inner = "";
    int rc = one_request(w, T_WIRE, 0, inner);
    return rc ? failf(why, "afterwards a request failed: %s", rc > 0 ? "clean error" : inner) : 0;
}

/* ---- sweeps: transports ------------------------------------------------ */

/* A warm world with a gRPC server (TLS when tls) and/or an HTTP server. */
typedef struct tr_arg {
    world w;
    int tls;
    grpcsrv *g;
    http_server *h;
    grpc_channel *ch;
} tr_arg;

static atomic_int g_not_draining;
static char g_cert[96], g_key[96];
static char *g_json_nm; /* the example request without "model": :rank takes the path's */
static size_t g_json_nm_len;

/* A self-signed certificate (openssl, a test dependency) whose file is
 * padded past grpc_server.c read_file's first 8 KiB buffer (PEM readers
 * skip text outside the BEGIN/END lines), so the sweep reaches its
 * realloc too. */
static int transport_fixture(char *why)
{
    snprintf(g_cert, sizeof g_cert, "%s/cert.pem", g_repo);
    snprintf(g_key, sizeof g_key, "%s/key.pem", g_repo);
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "openssl req -x509 -newkey rsa:2048 -nodes -keyout %s -out %s.raw -days 2 "
             "-subj /CN=localhost >/dev/null 2>&1", g_key, g_cert);
    if (system(cmd) != 0) return failf(why, "openssl req failed (is openssl installed?)");
    char raw[128];
    snprintf(raw, sizeof raw, "%s.raw", g_cert);
    size_t n;
    char *pem = read_file(raw, &n);
    FILE *f = fopen(g_cert, "w");
    if (!pem || !f) return failf(why, "cannot write %s", g_cert);
    for (int i = 0; i < 200; i++)
        fprintf(f, "padding line %03d: text outside the PEM block, skipped by readers\n", i);
    fwrite(pem, 1, n, f);
    fclose(f);
    af_sys_free(pem);
    unlink(raw);
    json_t *o = json_loadb(g_json, g_json_len, 0, NULL);
    char *d = o && !json_object_del(o, "model") ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!d) return failf(why, "example request without model");
    g_json_nm_len = strlen(d);
    g_json_nm = af_sys_malloc(g_json_nm_len + 1);
    memcpy(g_json_nm, d, g_json_nm_len + 1);
    free(d);
    return 0;
}

static grpcsrv *grpc_up(tr_arg *a, ikbo_err *err)
{
    grpcsrv_opts o = {.listen = "127.0.0.1:0", .threads = 1, .max_message_bytes = 64 << 20,
                      .rank = &a->w.env, .reg = a->w.reg, .metrics = &a->w.mx,
                      .draining = &g_not_draining};
    if (a->tls) o.tls_cert_file = g_cert, o.tls_key_file = g_key;
    return grpcsrv_start(&o, err);
}

static http_server *http_up(tr_arg *a, ikbo_err *err)
{
    http_opts o = {.listen = "127.0.0.1:0", .max_body_bytes = 64 << 20, .rank = &a->w.env,
                   .reg = a->w.reg, .metrics = &a->w.mx, .draining = &g_not_draining,
                   .admin = HTTP_ADMIN_OFF};
    return http_start(&o, err);
}

static int tr_world(tr_arg *a, char *why)
{
    memset(&a->w, 0, sizeof a->w);
    world_batching(&a->w, 0, 0);
    if (world_metrics(&a->w, why) || world_open(&a->w, 0, why)) return -1;
    return must_serve(&a->w, why);
}

static void tr_teardown(void *p)
{
    tr_arg *a = p;
    if (a->ch) grpc_channel_destroy(a->ch);
    if (a->g) {
        grpcsrv_shutdown(a->g, 0);
        grpcsrv_free(a->g);
    }
    if (a->h) http_stop(a->h, 0);
    a->ch = NULL, a->g = NULL, a->h = NULL;
    world_free(&a->w);
}

static int tr_setup_world(void *p, char *why) { return tr_world(p, why); }

/* Starting and stopping the servers: NULL with an error, or a server that
 * stops cleanly. */
static int start_op(void *p, char *why)
{
    tr_arg *a = p;
    ikbo_err err = {{0}};
    grpcsrv *g = grpc_up(a, &err);
    if (!g) return err.msg[0] ? 1 : failf(why, "grpcsrv_start: NULL without an error");
    grpcsrv_shutdown(g, 0);
    grpcsrv_free(g);
    if (a->tls) return 0;
    http_server *h = http_up(a, &err);
    if (!h) return err.msg[0] ? 1 : failf(why, "http_start: NULL without an error");
    http_stop(h, 0);
    return 0;
}

/* One Rank over gRPC (lg_unary on this thread, not counted). 0 OK with the
 * reference scores, 1 a clean error status, -1 a bug. */
static int grpc_rank(tr_arg *a, char *why)
{
    int code = -1;
    char *details = NULL;
    uint8_t *resp = NULL;
    size_t n = 0;
    /* Persistent mode: an instance retries a batch it cannot allocate
     * until the call's deadline (as in the request sweeps). */
    const int timeout_ms = g_persistent ? (int)(REQ_DEADLINE_NS / 1000000) : WAIT_S * 1000;
    if (lg_unary(a->ch, "/ikbo.v1.Ranker/Rank", g_wire, g_wire_len, timeout_ms, &code, &details,
                 &resp, &n))
        return failf(why, "the call could not be started");
    int rc;
    if (code == 0) {
        Ikbo__V1__RankResponse *r = ikbo__v1__rank_response__unpack(NULL, n, resp);
        rc = r ? check_scores(r, why) : failf(why, "response does not unpack");
        if (r) ikbo__v1__rank_response__free_unpacked(r, NULL);
    } else {
        /* clean_code's set, as gRPC codes: RESOURCE_EXHAUSTED, INTERNAL,
         * UNAVAILABLE, DEADLINE_EXCEEDED when persistent; with a message */
        const int ok = code == 8 || code == 13 || code == 14 || (code == 4 && g_persistent);
        rc = ok && details && details[0]
                 ? 1
                 : failf(why, "status %d (%s)", code, details ? details : "");
    }
    free(details);
    free(resp);
    return rc;
}

static int grpc_setup(void *p, char *why)
{
    tr_arg *a = p;
    ikbo_err err = {{0}};
    if (tr_world(a, why)) return -1;
    if (!(a->g = grpc_up(a, &err))) return failf(why, "grpcsrv_start: %s", err.msg);
    char target[64];
    snprintf(target, sizeof target, "127.0.0.1:%d", grpcsrv_port(a->g));
    a->ch = lg_channel_new(target, 0);
    if (lg_channel_wait_ready(a->ch, WAIT_S * 1000)) return failf(why, "channel not ready");
    return grpc_rank(a, why) ? failf(why, "the warm-up call failed: %s", why) : 0;
}

static int grpc_call_op(void *p, char *why) { return grpc_rank(p, why); }

static int grpc_after(void *p, char *why)
{
    why_t inner = "";
    return grpc_rank(p, inner) ? failf(why, "afterwards a call failed: %s", inner) : 0;
}

/* HTTP/1.1 on a blocking socket: the request, then the whole response
 * (Connection: close). Returns the status, 0 when the server closed
 * without one (a clean error), -1 on a socket error. */
static int http_call(int port, const char *req, size_t req_len, char *body, size_t cap)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa)) {
        if (fd >= 0) close(fd);
        return -1;
    }
    for (size_t off = 0; off < req_len;) {
        ssize_t w = send(fd, req + off, req_len - off, MSG_NOSIGNAL);
        if (w <= 0) break; /* the server may close early: read what it said */
        off += (size_t)w;
    }
    size_t len = 0;
    int64_t until = mono_ns() + (int64_t)WAIT_S * 1000000000;
    while (len + 1 < cap && mono_ns() < until) {
        struct pollfd pf = {fd, POLLIN, 0};
        if (poll(&pf, 1, 100) <= 0) continue;
        ssize_t r = recv(fd, body + len, cap - 1 - len, 0);
        if (r <= 0) break;
        len += (size_t)r;
    }
    close(fd);
    body[len] = 0;
    int status = 0;
    if (len && sscanf(body, "HTTP/1.%*d %d", &status) != 1) status = 0;
    return status;
}

/* A :rank JSON body's scores equal the reference (9 significant digits
 * give a float back exactly). */
static int http_scores(const char *body, char *why)
{
    json_t *o = json_loads(body, 0, NULL), *sc = json_object_get(o, "scores");
    int rc = json_array_size(sc) == (size_t)g_C ? 0 : failf(why, ":rank: %zu scores", json_array_size(sc));
    for (size_t k = 0; !rc && k < json_array_size(sc); k++) {
        json_t *e = json_array_get(sc, k);
        json_int_t i = json_integer_value(json_object_get(e, "index"));
        float v = (float)json_number_value(json_object_get(e, "score"));
        if (i < 0 || i >= g_C || memcmp(&v, &g_ref_scores[i], 4))
            rc = failf(why, ":rank: score %zu (candidate %lld) differs from the reference", k,
                       (long long)i);
    }
    json_decref(o);
    return rc;
}

/* GET /healthz, then a chunked POST :rank of the example request (the model
 * named by the path only). */
static int http_requests(tr_arg *a, char *why)
{
    static char resp[1 << 20];
    const int port = http_port(a->h);
    const char *get = "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    int st = http_call(port, get, strlen(get), resp, sizeof resp);
    if (st < 0) return failf(why, "connect failed");
    if (st != 200) return st == 0 || st == 500 || st == 503 ? 1 : failf(why, "/healthz %d", st);
    size_t cap = g_json_nm_len + 512, n = 0;
    char *req = af_sys_malloc(cap);
    n += (size_t)snprintf(req, cap, "POST /v1/models/demo:rank HTTP/1.1\r\nHost: x\r\n"
                          "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
                          "Connection: close\r\n\r\n%zx\r\n", g_json_nm_len);
    memcpy(req + n, g_json_nm, g_json_nm_len);
    n += g_json_nm_len;
    n += (size_t)snprintf(req + n, cap - n, "\r\n0\r\n\r\n");
    st = http_call(port, req, n, resp, sizeof resp);
    af_sys_free(req);
    if (st == 200) {
        const char *b = strstr(resp, "\r\n\r\n");
        return http_scores(b ? b + 4 : "", why);
    }
    return st == 0 || st == 500 || st == 503 ? 1 : failf(why, ":rank %d: %.200s", st, resp);
}

static int http_setup(void *p, char *why)
{
    tr_arg *a = p;
    ikbo_err err = {{0}};
    if (tr_world(a, why)) return -1;
    if (!(a->h = http_up(a, &err))) return failf(why, "http_start: %s", err.msg);
    return http_requests(a, why) ? failf(why, "the warm-up requests failed: %s", why) : 0;
}

static int http_op(void *p, char *why) { return http_requests(p, why); }

static int http_after(void *p, char *why)
{
    why_t inner = "";
    return http_requests(p, inner) ? failf(why, "afterwards a request failed: %s", inner) : 0;
}

/* ---- the sweep driver --------------------------------------------------- */

typedef struct sweep {
    const char *name;
    unsigned roles;
    int (*setup)(void *arg, char *why);     /* failures off; NULL = none */
    int (*op)(void *arg, char *why);        /* armed: 0 ok, 1 clean error, -1 bug */
    int (*after)(void *arg, char *why);     /* failures off: works normally; NULL = none */
    void (*teardown)(void *arg);
    void *arg;
    long max_n; /* > 0: only N = 1..max_n (where a library cannot take more) */
} sweep;

/* Waits (bounded) for the live blocks to come back to base: a thread that
 * answered may still be freeing. */
static int settle_live(long base)
{
    int64_t until = mono_ns() + (int64_t)WAIT_S * 1000000000;
    while (af_live() != base && mono_ns() < until) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    return af_live() == base ? 0 : -1;
}

/* Runs one sweep in the current mode; 0 or -1 (reported on stderr). */
static int run_sweep(const sweep *s)
{
    int64_t t0 = mono_ns();
    long n, clean = 0, fallback = 0;
    why_t why = "";
    for (n = 1; n <= MAX_ITER; n++) {
        long base = af_live();
        unsigned long mark = af_mark();
        if (s->setup && s->setup(s->arg, why)) goto bad;
        af_arm(n, g_persistent, s->roles);
        int rc = s->op(s->arg, why);
        long fired = af_disarm();
        if (rc < 0) goto bad;
        if (rc > 0 && !fired) {
            failf(why, "failed with no allocation failure injected");
            goto bad;
        }
        if (rc > 0) {
            clean++;
        } else if (fired) {
            fallback++;
            if (getenv("AF_VERBOSE")) {
                char b[300];
                printf("  recovered N=%ld: %s\n", n, af_last_failure(b, sizeof b));
            }
        }
        if (s->after && s->after(s->arg, why)) goto bad;
        s->teardown(s->arg);
        if (settle_live(base)) {
            fprintf(stderr, "FAIL %s (%s) N=%ld: %ld blocks leaked (%zu bytes live in all), from:\n",
                    s->name, g_persistent ? "persistent" : "once", n, af_live() - base,
                    af_live_bytes());
            af_dump_live(stderr, mark, 20);
            return -1;
        }
        if (!fired || n == s->max_n) break;
    }
    printf("ok   %-28s %-10s %5ld iterations (%ld clean errors, %ld recovered) %.2f s\n", s->name,
           g_persistent ? "persistent" : "once", n, clean, fallback, (double)(mono_ns() - t0) * 1e-9);
    return n > MAX_ITER ? -1 : 0;
bad:
    fprintf(stderr, "FAIL %s (%s) N=%ld: %s\n", s->name, g_persistent ? "persistent" : "once", n,
            why);
    char b[300];
    fprintf(stderr, "  last failure injected at %s\n", af_last_failure(b, sizeof b));
    af_disarm();
    if (!strncmp(why, "no answer", 9)) exit(1); /* hung: a batcher thread may still call back */
    s->teardown(s->arg);
    return -1;
}

/* ---- sweeps: engine ----------------------------------------------------- */

typedef struct load_arg {
    enum ikbo_mode mode;
    float *ref;      /* [C] scores of this mode, batch order, from a run with failures off */
    const char *dir; /* NULL: the demo (g_v1); else a version dir of the same inputs */
    int plan;        /* also render the plan report (text and JSON) */
} load_arg;

/* Load, make a context, score the fixture batch, free. */
static int load_op(void *p, char *why)
{
    load_arg *a = p;
    ikbo_load_opts o = {.device = "cpu", .mode = a->mode};
    ikbo_err err = {{0}};
    float *s = af_sys_malloc((size_t)g_C * 4), *t = af_sys_malloc((size_t)g_C * g_T * 4);
    ikbo_model *m = ikbo_model_load(a->dir ? a->dir : g_v1, &o, &err);
    ikbo_ctx *ctx = m ? ikbo_ctx_new(m, &err) : NULL;
    int rc = ctx ? ikbo_score(ctx, &g_plan->batch, t, s, &err) : -1;
    for (int json = 0; rc == 0 && a->plan && json < 2; json++) {
        char *text = ikbo_model_plan(m, json, 70);
        if (!text) { /* out of memory: the one error this call has */
            snprintf(err.msg, sizeof err.msg, "plan report: out of memory");
            rc = -1;
        }
        free(text);
    }
    ikbo_ctx_free(ctx);
    ikbo_model_free(m);
    af_disarm();
    if (rc == 0 && a->ref && memcmp(s, a->ref, (size_t)g_C * 4))
        rc = failf(why, "scores differ from the reference");
    else if (rc == 0 && !a->ref && (a->ref = af_sys_malloc((size_t)g_C * 4)))
        memcpy(a->ref, s, (size_t)g_C * 4);
    else if (rc != 0)
        rc = err.msg[0] ? 1 : failf(why, "load/score failed without a message");
    af_sys_free(s);
    af_sys_free(t);
    return rc;
}

/* The engine fixture (tests/unit/engine_fixture.h): its lce -> flatten ->
 * linear is folded at load (engine/fold.h), so the fold's allocations run
 * here: load, both plan renderings (which must show the fold), free. p:
 * the version directory, NULL for the fixture's (the mlp2 variant's adds
 * the fold's mlp2 part). */

static int fold_load_op(void *p, char *why)
{
    ikbo_load_opts o = {.device = "cpu", .mode = IKBO_MODE_IKBO};
    ikbo_err err = {{0}};
    ikbo_model *m = ikbo_model_load(p ? (const char *)p : g_fold, &o, &err);
    int rc = m ? 0 : 1, folded = 1;
    for (int json = 0; rc == 0 && json < 2; json++) {
        char *text = ikbo_model_plan(m, json, 70);
        if (!text) { /* out of memory: the one error this call has */
            snprintf(err.msg, sizeof err.msg, "plan report: out of memory");
            rc = 1;
        }
        folded &= !text || strstr(text, "folded") != NULL;
        free(text);
    }
    ikbo_model_free(m);
    af_disarm();
    if (!folded) return failf(why, "the plan report does not show the fold");
    if (rc && !err.msg[0]) return failf(why, "fold load failed without a message");
    return rc;
}

static int fold_load_after(void *p, char *why)
{
    int rc = fold_load_op(p, why);
    return rc ? failf(why, "afterwards: %s", rc > 0 ? "load failed" : why) : 0;
}

static int load_after(void *p, char *why)
{
    int rc = load_op(p, why);
    return rc ? failf(why, "afterwards: %s", rc > 0 ? "load failed" : why) : 0;
}

static int peek_op(void *p, char *why)
{
    (void)p;
    ikbo_serving sv;
    ikbo_err err = {{0}};
    if (ikbo_model_peek_serving(g_v1, &sv, &err) == 0) return 0;
    return err.msg[0] ? 1 : failf(why, "peek failed without a message");
}

static void no_teardown(void *p) { (void)p; }

/* The batch-graph cache (engine/batch_graph.h) is only built over a backend
 * that records graphs (CUDA); its allocations are swept here directly. */
static void graph_free_stub(bk_graph *g) { (void)g; }

static int graph_cache_op(void *p, char *why)
{
    (void)p;
    bk_backend be = {.graph_free = graph_free_stub};
    bg_cache *c = bg_new(&be, 3);
    if (!c) return 1;
    bg_key k = BG_KEY_INIT;
    for (int i = 0; i < 5; i++) {
        bg_key_add(&k, i);
        bg_get(c, k);
    }
    uint64_t ev = c->evictions;
    bg_free(c);
    return ev == 2 ? 0 : failf(why, "5 keys in 3 slots: %llu evictions, expected 2",
                               (unsigned long long)ev);
}

/* ---- sweeps: server ----------------------------------------------------- */

typedef struct req_arg {
    world w;
    enum transport t;
    int warm;     /* a request served before the armed one */
    int configured; /* the registry serves the configured name "demo", not what it finds */
    long long max_c; /* max_batch_candidates (small: the request is chunked) */
} req_arg;

static int req_setup(void *p, char *why)
{
    req_arg *a = p;
    memset(&a->w, 0, sizeof a->w);
    world_batching(&a->w, a->max_c, 0);
    if (world_metrics(&a->w, why) || world_open(&a->w, a->configured, why)) return -1;
    return a->warm ? must_serve(&a->w, why) : 0;
}

static int req_op(void *p, char *why)
{
    req_arg *a = p;
    return one_request(&a->w, a->t, g_persistent ? mono_ns() + REQ_DEADLINE_NS : 0, why);
}

static int req_after(void *p, char *why) { return must_serve(&((req_arg *)p)->w, why); }

static void req_teardown(void *p) { world_free(&((req_arg *)p)->w); }

/* The state of demo version v: REGISTRY_*, or -1 when not listed. */
typedef struct vfind {
    int64_t v;
    int state;
    char msg[512];
} vfind;

static void vfind_visit(const registry_entry_view *e, void *p)
{
    vfind *f = p;
    for (int j = 0; !strcmp(e->name, "demo") && j < e->n_versions; j++)
        if (e->versions[j].version == f->v) {
            f->state = e->versions[j].state;
            snprintf(f->msg, sizeof f->msg, "%s", e->versions[j].message);
        }
}

static vfind vstate(registry *r, int64_t v)
{
    vfind f = {v, -1, ""};
    registry_foreach(r, vfind_visit, &f);
    return f;
}

/* The registry's first load: registry_new, batcher_set_new, the load. */
static int reg_load_setup(void *p, char *why)
{
    req_arg *a = p;
    memset(&a->w, 0, sizeof a->w);
    world_batching(&a->w, 0, 0);
    return world_metrics(&a->w, why);
}

static int reg_load_op(void *p, char *why)
{
    req_arg *a = p;
    why_t open_why = "";
    if (world_open(&a->w, a->configured, open_why)) {
        af_disarm();
        return open_why[0] ? 1 : failf(why, "registry failed without a message");
    }
    af_disarm();
    vfind f = vstate(a->w.reg, 1);
    if (f.state == REGISTRY_READY) return 0;
    if (f.state == REGISTRY_FAILED && f.msg[0]) return 1;
    if (f.state < 0) return 1; /* the scan ran out of memory: nothing known yet, next poll */
    return failf(why, "after the load, version 1 is %s (%s)",
                 f.state < 0 ? "not listed" : registry_state_name(f.state), f.msg);
}

static int reg_load_after(void *p, char *why)
{
    req_arg *a = p;
    if (!a->w.bs) return 0; /* nothing was made: nothing to reuse */
    if (registry_poll_once(a->w.reg, 1) != 1) return failf(why, "afterwards: the retry did not load");
    return must_serve(&a->w, why);
}

/* A hot swap: version 2 appears while version 1 serves (with a batcher). */
static int swap_setup(void *p, char *why)
{
    req_arg *a = p;
    if (req_setup(p, why) || must_serve(&a->w, why)) return -1;
    return copy_version(g_v2) ? failf(why, "cannot copy version 2") : 0;
}

static int swap_op(void *p, char *why)
{
    req_arg *a = p;
    registry_poll_once(a->w.reg, 1);
    af_disarm();
    vfind v1 = vstate(a->w.reg, 1), v2 = vstate(a->w.reg, 2);
    if (v2.state == REGISTRY_READY && v1.state != REGISTRY_READY) return 0;
    if (v2.state != REGISTRY_READY && v1.state == REGISTRY_READY &&
        (v2.state != REGISTRY_FAILED || v2.msg[0]))
        return 1;
    return failf(why, "after the swap: v1 %d (%s), v2 %d (%s)", v1.state, v1.msg, v2.state, v2.msg);
}

static int swap_after(void *p, char *why)
{
    req_arg *a = p;
    if (must_serve(&a->w, why)) return -1;
    registry_poll_once(a->w.reg, 1);
    rq_status st;
    registry_model *m = registry_acquire(a->w.reg, "demo", 0, &st);
    int64_t v = m ? registry_model_version(m) : 0;
    registry_release(m);
    if (v != 2) return failf(why, "afterwards the retry serves version %lld", (long long)v);
    return must_serve(&a->w, why);
}

static void swap_teardown(void *p)
{
    req_teardown(p);
    remove_version(g_v2);
}

static int describe_op(void *p, char *why)
{
    req_arg *a = p;
    rq_status st;
    rq_status_ok(&st);
    Ikbo__V1__ModelInfoResponse *r = registry_describe(a->w.reg, a->warm ? "demo" : NULL, &st);
    size_t n = r ? r->n_models : 0;
    registry_describe_free(r);
    af_disarm();
    if (r) return n == 1 ? 0 : failf(why, "%zu models described", n);
    return clean_code(&st, why);
}

static int describe_after(void *p, char *why)
{
    int rc = describe_op(p, why);
    return rc ? failf(why, "afterwards: %s", rc > 0 ? "describe failed" : why) : 0;
}

/* N_MERGE requests in one batch: the batch closes when full (their
 * candidates together), the delay is long, so one instance merges all. */
static int merge_round(world *w, char *why)
{
    call c[N_MERGE];
    int rc = 0;
    for (int i = 0; i < N_MERGE; i++) {
        memset(&c[i], 0, sizeof c[i]);
        pthread_mutex_init(&c[i].mu, NULL);
        pthread_cond_init(&c[i].cv, NULL);
        Ikbo__V1__RankRequest *req = decode_wire(g_wire, g_wire_len, &c[i].arena, &c[i].st);
        if (!req) return failf(why, "decode: %s", c[i].st.msg);
        rank_submit(&w->env, req, g_persistent ? mono_ns() + REQ_DEADLINE_NS : 0, NULL, "grpc",
                    on_answer, &c[i]);
    }
    for (int i = 0; i < N_MERGE; i++)
        if (call_wait(&c[i], why)) return -1;
    af_disarm();
    for (int i = 0; i < N_MERGE && rc >= 0; i++) {
        int r;
        if (c[i].st.code != RQ_OK) {
            r = clean_code(&c[i].st, why);
        } else {
            Ikbo__V1__RankResponse *resp =
                ikbo__v1__rank_response__unpack(NULL, c[i].packed_len, c[i].packed);
            r = resp ? check_scores(resp, why) : failf(why, "response does not unpack");
            if (resp) ikbo__v1__rank_response__free_unpacked(resp, NULL);
        }
        if (r) rc = r;
    }
    for (int i = 0; i < N_MERGE; i++) {
        af_sys_free(c[i].packed);
        pthread_mutex_destroy(&c[i].mu);
        pthread_cond_destroy(&c[i].cv);
    }
    return rc;
}

static int merge_setup(void *p, char *why)
{
    req_arg *a = p;
    memset(&a->w, 0, sizeof a->w);
    world_batching(&a->w, N_MERGE * (long long)g_C, 10000000);
    if (world_metrics(&a->w, why) || world_open(&a->w, a->configured, why)) return -1;
    return merge_round(&a->w, why) ? failf(why, "warm-up merge failed: %s", why) : 0;
}

static int merge_op(void *p, char *why) { return merge_round(&((req_arg *)p)->w, why); }

static int merge_after(void *p, char *why)
{
    int rc = merge_round(&((req_arg *)p)->w, why);
    return rc ? failf(why, "afterwards: %s", rc > 0 ? "merge failed" : why) : 0;
}

/* /metrics: the server's families made, the registry's memory collector
 * attached, rendered, freed. */
static int metrics_op(void *p, char *why)
{
    req_arg *a = p;
    metrics_server mx;
    if (metrics_server_init(&mx, "test")) {
        af_disarm();
        return 1;
    }
    metrics_family_set_collect(mx.model_memory_bytes, registry_collect_memory, a->w.reg);
    metrics_add(mx.inflight, 1);
    size_t len = 0;
    char *text = metrics_render(mx.reg, &len);
    int found = text && strstr(text, "ikbo_model_memory_bytes{") != NULL;
    free(text);
    metrics_server_free(&mx);
    af_disarm();
    /* Metrics are best effort: a series or a collector that ran out of
     * memory is missing from that one scrape (never a wrong value). */
    return !text ? 1 : found || af_disarm() ? 0 : failf(why, "no memory series rendered");
}

static int metrics_after(void *p, char *why)
{
    req_arg *a = p;
    metrics_server mx;
    if (metrics_server_init(&mx, "test")) return failf(why, "afterwards: metrics_server_init");
    metrics_family_set_collect(mx.model_memory_bytes, registry_collect_memory, a->w.reg);
    size_t len = 0;
    char *text = metrics_render(mx.reg, &len);
    int found = text && strstr(text, "ikbo_model_memory_bytes{") != NULL;
    free(text);
    metrics_server_free(&mx);
    return found ? 0 : failf(why, "afterwards: no ikbo_model_memory_bytes series rendered");
}

/* ---- sweeps: config ----------------------------------------------------- */

static const char CONFIG_JSON[] =
    "{\"grpc_listen\":\"127.0.0.1:1\",\"http_listen\":\"127.0.0.1:2\",\"model_repository\":\"/r\","
    "\"models\":[\"a\",\"b\"],\"device\":\"cpu\",\"mode\":\"broadcast\",\"threads\":3,"
    "\"limits\":{\"max_users\":10,\"max_candidates\":20},\"log\":{\"level\":\"warn\","
    "\"format\":\"json\"},\"drain_timeout_ms\":5,\"batching\":{\"max_batch_candidates\":64,"
    "\"instances\":2},\"repository_poll_ms\":100,\"repository_settle_ms\":50,"
    "\"version_policy\":{\"latest\":2},\"model_policy\":{\"a\":{\"versions\":[1,2]},"
    "\"b\":{\"latest\":1}},\"admin_http\":\"off\",\"tls\":{\"cert_file\":\"/c\","
    "\"key_file\":\"/k\",\"client_ca_file\":\"/ca\"}}";
static char g_config_path[128];

static int config_op(void *p, char *why)
{
    (void)p;
    char *argv[] = {"ikbo-serve", "--config", g_config_path, "--threads", "5", "--models", "/m",
                    "--device=cpu", NULL};
    const char *env[] = {"IKBO_HTTP_LISTEN=127.0.0.1:3", "IKBO_LOG_LEVEL=error", NULL};
    config c;
    enum config_action act;
    ikbo_err err = {{0}};
    int rc = config_resolve(&c, 8, argv, env, &act, &err);
    char *text = rc ? NULL : config_to_json(&c);
    int ok = text && c.threads == 5 && c.n_model_policy == 2 && c.n_models == 2;
    free(text);
    config_free(&c);
    af_disarm();
    if (rc) return err.msg[0] ? 1 : failf(why, "config failed without a message");
    return text ? (ok ? 0 : failf(why, "config resolved wrong")) : 1;
}

static int config_after(void *p, char *why)
{
    int rc = config_op(p, why);
    return rc ? failf(why, "afterwards: %s", rc > 0 ? "config failed" : why) : 0;
}

/* ---- sweep: the JSON mapper on a packed request ----------------------- */

/* Every packed field kind (request_json.c: keys, base64 bytes, the packed
 * messages and their sparse features); the mapper only, since serving the
 * packed encoding is not this sweep's subject. */
static const char PACKED_JSON[] =
    "{\"model\":\"demo\",\"packedUsers\":{\"count\":2,\"keys\":[\"alice\",\"bob\"],"
    "\"dense\":\"AACAPwAAAEA=\",\"sparse\":[{\"name\":\"country\",\"lengths\":\"AQAAAAAAAAA\","
    "\"ids\":\"BwAAAAAAAAA=\"}],\"historyLengths\":\"AQAAAAAAAAA=\",\"historyIds\":"
    "\"BwAAAAAAAAA=\",\"historyActions\":\"AQAAAA==\"},\"packedCandidates\":{\"count\":1,"
    "\"ids\":\"ZQAAAAAAAAA=\",\"users\":\"AAAAAA==\",\"dense\":\"AACAPw==\",\"sparse\":"
    "[{\"name\":\"item\",\"lengths\":\"AQAAAA==\",\"ids\":\"_-___w\"}]}}";

static int packed_json_op(void *p, char *why)
{
    (void)p;
    rq_status st;
    Ikbo__V1__RankRequest *r = rq_request_from_json(PACKED_JSON, sizeof PACKED_JSON - 1, &st);
    af_disarm();
    if (!r) return st.code == RQ_INTERNAL ? 1 : failf(why, "packed JSON: %s", st.msg);
    const Ikbo__V1__PackedUsers *u = r->packed_users;
    const Ikbo__V1__PackedCandidates *c = r->packed_candidates;
    int ok = u && c && u->n_keys == 2 && !strcmp(u->keys[1], "bob") && u->dense.len == 8 &&
             u->n_sparse == 1 && u->sparse[0]->ids.len == 8 && u->history_actions.len == 4 &&
             c->n_sparse == 1 && c->sparse[0]->ids.len == 4 && c->users.len == 4;
    rq_request_free(r);
    return ok ? 0 : failf(why, "packed JSON mapped wrong");
}

static int packed_json_after(void *p, char *why)
{
    int rc = packed_json_op(p, why);
    return rc ? failf(why, "afterwards: %s", rc > 0 ? "out of memory" : why) : 0;
}

/* ---- main --------------------------------------------------------------- */

static int write_config(char *why)
{
    snprintf(g_config_path, sizeof g_config_path, "%s.json", g_repo);
    FILE *f = fopen(g_config_path, "w");
    if (!f || fputs(CONFIG_JSON, f) < 0 || fclose(f)) return failf(why, "cannot write the config");
    return 0;
}

/* ---- sweep: unloading many versions at once ----------------------------- */

/* More versions than one relist block holds (registry.c keeps 64 instances
 * per block and chains another when a pass retires more). */
#define MANY_V 66
static char g_repo_many[96];

typedef struct many_arg {
    registry *reg;
} many_arg;

/* g_repo_many/demo/1..MANY_V: links to the demo version (made once). */
static int many_fixture(char *why)
{
    char p[256];
    snprintf(g_repo_many, sizeof g_repo_many, "%s/many", g_repo);
    snprintf(p, sizeof p, "%s/demo", g_repo_many);
    if (mkdir(g_repo_many, 0755) || mkdir(p, 0755)) return failf(why, "mkdir %s", p);
    for (int v = 1; v <= MANY_V; v++) {
        snprintf(p, sizeof p, "%s/demo/%d", g_repo_many, v);
        if (symlink(g_v1, p)) return failf(why, "symlink %s: %s", p, strerror(errno));
    }
    return 0;
}

static void many_cleanup(void)
{
    char p[256];
    if (!g_repo_many[0]) return;
    for (int v = 1; v <= MANY_V; v++) {
        snprintf(p, sizeof p, "%s/demo/%d", g_repo_many, v);
        unlink(p);
    }
    snprintf(p, sizeof p, "%s/demo", g_repo_many);
    rmdir(p);
    rmdir(g_repo_many);
}

static int many_setup(void *p, char *why)
{
    many_arg *a = p;
    static const registry_model_policy pol[] = {{"demo", {.latest = MANY_V}}};
    registry_opts o;
    memset(&o, 0, sizeof o);
    o.repository = g_repo_many;
    o.policies = pol;
    o.n_policies = 1;
    o.device = "cpu";
    o.n_slots = 1;
    ikbo_err err = {{0}};
    if (!(a->reg = registry_new(&o, &err))) return failf(why, "registry_new: %s", err.msg);
    registry_poll_once(a->reg, 1);
    for (int v = 1; v <= MANY_V; v++)
        if (vstate(a->reg, v).state != REGISTRY_READY) return failf(why, "version %d not ready", v);
    return 0;
}

/* Unloads every version in one pass: OK whatever memory does (an instance
 * the registry cannot queue is released under the lock instead). */
static int many_op(void *p, char *why)
{
    many_arg *a = p;
    rq_status st;
    if (registry_admin_unload(a->reg, "demo", 0, &st) != 0)
        return st.code == RQ_INTERNAL || st.code == RQ_RESOURCE_EXHAUSTED ? 1
               : failf(why, "unload: %s", st.msg);
    return 0;
}

static int many_after(void *p, char *why)
{
    many_arg *a = p;
    for (int v = 1; v <= MANY_V; v++) {
        vfind f = vstate(a->reg, v);
        if (f.state == REGISTRY_READY) return failf(why, "version %d still READY", v);
    }
    return 0;
}

static void many_teardown(void *p)
{
    many_arg *a = p;
    registry_free(a->reg);
    a->reg = NULL;
}

static void cleanup(void)
{
    char p[512];
    remove_version(g_v2);
    remove_version(g_v1);
    if (g_fold[0]) ef_remove_model(g_fold);
    if (g_fold_mlp2[0]) ef_remove_model(g_fold_mlp2);
    if (g_fold_upart[0]) ef_remove_model(g_fold_upart);
    snprintf(p, sizeof p, "%s/demo", g_repo);
    rmdir(p);
    unlink(g_config_path);
    many_cleanup();
    if (g_cert[0]) unlink(g_cert), unlink(g_key);
    af_sys_free(g_json_nm);
    rmdir(g_repo);
}

int main(void)
{
    af_init();
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (getenv("IKBO_ROOT")) g_root = getenv("IKBO_ROOT");
    FILE *devnull = fopen("/dev/null", "w");
    log_setup(LOG_LEVEL_ERROR, 0, devnull ? devnull : stderr);
    why_t why = "";
    grpc_init();
    if (fixtures(why) || write_config(why) || transport_fixture(why) || many_fixture(why)) {
        fprintf(stderr, "test_alloc_fail: %s\n", why);
        cleanup();
        return 1;
    }
    const unsigned REQ_BATCH = AF_SWEEP | AF_INSTANCE | AF_COMPLETE, REQ = AF_MAIN | REQ_BATCH;
    static tr_arg tr_a[4] = {{.tls = 0}, {.tls = 1}, {.tls = 0}, {.tls = 0}};
    static many_arg many_a;
    /* The demo, and its broadcast-form twin (models/demo_auto, "planning":
     * "auto": the planner's rewrite and the plan report). */
    static char auto_dir[512];
    snprintf(auto_dir, sizeof auto_dir, "%s/models/demo_auto/1", g_root);
    static load_arg la[3] = {{IKBO_MODE_IKBO, NULL, NULL, 0},
                             {IKBO_MODE_BROADCAST, NULL, NULL, 0},
                             {IKBO_MODE_IKBO, NULL, auto_dir, 1}};
    static req_arg ra[] = {
        {.t = T_WIRE, .warm = 0},         {.t = T_WIRE, .warm = 1},
        {.t = T_WIRE_FALLBACK, .warm = 1}, {.t = T_JSON, .warm = 1},
        {.t = T_WIRE, .warm = 1, .max_c = 2},
    };
    static req_arg reg_a[2] = {{.configured = 0}, {.configured = 1}}, swap_a, desc_a[2] = {{.warm = 0}, {.warm = 1}}, merge_a;
    sweep sweeps[] = {
        {"model load+score (ikbo)", AF_MAIN | AF_LIBS, NULL, load_op, load_after, no_teardown, &la[0], 0},
        {"model load+score (broadcast)", AF_MAIN | AF_LIBS, NULL, load_op, load_after, no_teardown, &la[1], 0},
        {"auto model load+score+plan", AF_MAIN | AF_LIBS, NULL, load_op, load_after, no_teardown, &la[2], 0},
        /* Our allocations only: failures inside jansson while it lexes
         * this fixture's model.json hit the assert noted below; the demo's
         * load sweeps cover jansson's in the loader. */
        {"folded model load+plan", AF_MAIN, NULL, fold_load_op, fold_load_after, no_teardown,
         NULL, 0},
        {"folded model with an mlp2 part load+plan", AF_MAIN, NULL, fold_load_op, fold_load_after,
         no_teardown, g_fold_mlp2, 0},
        {"folded model with a composed user part load+plan", AF_MAIN, NULL, fold_load_op,
         fold_load_after, no_teardown, g_fold_upart, 0},
        {"model peek serving", AF_MAIN | AF_LIBS, NULL, peek_op, NULL, no_teardown, NULL, 0},
        {"batch-graph cache", AF_MAIN, NULL, graph_cache_op, NULL, no_teardown, NULL, 0},
        {"registry first load", AF_MAIN, reg_load_setup, reg_load_op, reg_load_after, req_teardown,
         &reg_a[0], 0},
        {"registry first load (named)", AF_MAIN, reg_load_setup, reg_load_op, reg_load_after,
         req_teardown, &reg_a[1], 0},
        {"registry swap to v2", AF_MAIN, swap_setup, swap_op, swap_after, swap_teardown, &swap_a, 0},
        {"request wire (cold)", REQ, req_setup, req_op, req_after, req_teardown, &ra[0], 0},
        {"request wire", REQ, req_setup, req_op, req_after, req_teardown, &ra[1], 0},
        {"request wire-fallback", REQ | AF_LIBS, req_setup, req_op, req_after, req_teardown, &ra[2], 0},
        {"request json", REQ, req_setup, req_op, req_after, req_teardown, &ra[3], 0},
        /* jansson 2.14 asserts (load.c:442) when an allocation fails inside
         * a string token, so only its first allocation is failed here (the
         * lexer's buffer: json_loadb then returns no error text). */
        {"request json (jansson 1st)", REQ | AF_LIBS, req_setup, req_op, req_after,
         req_teardown, &ra[3], 1},
        {"request chunked", REQ, req_setup, req_op, req_after, req_teardown, &ra[4], 0},
        {"batcher merge of 3", AF_INSTANCE, merge_setup, merge_op, merge_after, req_teardown,
         &merge_a, 0},
        {"model info (all)", AF_MAIN, req_setup, describe_op, describe_after, req_teardown,
         &desc_a[0], 0},
        {"model info (demo)", AF_MAIN, req_setup, describe_op, describe_after, req_teardown,
         &desc_a[1], 0},
        {"metrics render", AF_MAIN, req_setup, metrics_op, metrics_after, req_teardown,
         &desc_a[0], 0},
        {"config resolve", AF_MAIN | AF_LIBS, NULL, config_op, config_after, no_teardown, NULL, 0},
        {"request json packed (mapper)", AF_MAIN, NULL, packed_json_op, packed_json_after,
         no_teardown, NULL, 0},
        /* The transports in-process on loopback: starting them (gRPC with
         * and without TLS files, HTTP), and a call through each. The client
         * side runs on this thread and is not counted; the servers' threads
         * (ikbo-grpc, ikbo-http: AF_OTHER) and the batcher's are. */
        {"grpc+http start/stop", AF_MAIN, tr_setup_world, start_op, NULL, tr_teardown, &tr_a[0], 0},
        {"grpc start (tls)", AF_MAIN, tr_setup_world, start_op, NULL, tr_teardown, &tr_a[1], 0},
        {"grpc Rank call", AF_OTHER | REQ_BATCH, grpc_setup, grpc_call_op, grpc_after, tr_teardown,
         &tr_a[2], 0},
        {"http healthz + chunked rank", AF_OTHER | REQ_BATCH, http_setup, http_op, http_after,
         tr_teardown, &tr_a[3], 0},
        {"registry unload of 66 versions", AF_MAIN, many_setup, many_op, many_after,
         many_teardown, &many_a, 0},
    };
    /* Reference scores per mode, failures off. */
    for (int i = 0; i < 3; i++)
        if (load_op(&la[i], why)) {
            fprintf(stderr, "test_alloc_fail: reference load: %s\n", why);
            return 1;
        }
    int failed = 0;
    const char *only = getenv("AF_ONLY"); /* a sweep name substring, for debugging */
    for (g_persistent = 0; g_persistent < 2; g_persistent++)
        for (size_t i = 0; i < sizeof sweeps / sizeof sweeps[0]; i++)
            if (!only || strstr(sweeps[i].name, only)) failed |= run_sweep(&sweeps[i]) != 0;
    if (g_jansson_misreports)
        printf("note: %ld allocation failures inside jansson were reported by it as a JSON syntax "
               "error\n", g_jansson_misreports);
    if (af_foreign_frees())
        printf("note: %ld frees of blocks not allocated through the wrappers\n", af_foreign_frees());
    const char *sites = getenv("AF_SITES");
    if (sites) {
        FILE *f = fopen(sites, "w");
        if (!f || af_write_sites(f) || fclose(f)) {
            fprintf(stderr, "test_alloc_fail: cannot write %s\n", sites);
            failed = 1;
        }
    }
    cleanup();
    grpc_shutdown();
    printf("%s\n", failed ? "test_alloc_fail: FAILED" : "test_alloc_fail: all sweeps passed");
    return failed;
}
