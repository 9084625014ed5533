/* test_registry.c - the model registry against a real repository in a temp
 * directory: initial load, a new version swapped in while an old handle
 * still scores, failed versions (truncated weights, bad JSON, missing file,
 * wrong shape) leaving the previous version serving and retried when their
 * files change, the settle rule (by change times and by looks), explicit
 * and latest-N policies, admin load/unload and pinning, per-model config.json precedence, the memory
 * check, the ikbo_model_memory_bytes collector (registry_collect_memory),
 * and 100 load/unload cycles without heap growth. The leak check proper:
 * IKBO_TEST_FILTER=test_load_unload_cycles valgrind --leak-check=full
 * build/tests/test_registry (clean), and the daemon's 100 cycles under
 * valgrind in tests/integration/test_reload_leaks.py. Models are
 * MODEL_FORMAT.md's example (loader_fixture.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "loader_fixture.h"
#include "server/log.h"
#include "server/metrics.h"
#include "server/registry.h"
#include "server/repo_watch.h"

static char g_repo[256];

static void xwrite(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

static void mkdirs(const char *path)
{
    char tmp[512];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            mkdir(tmp, 0755);
            *p = '/';
        }
    mkdir(tmp, 0755);
}

static void rmtree(const char *path)
{
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    assert_int_equal(system(cmd), 0);
}

/* <repo>/<name>/<v>/ with the example's model.json (or json) and weights
 * made with opts; truncate > 0 keeps only that many bytes of the weights;
 * no_weights leaves the file out. */
typedef struct vopts {
    const char *json;
    fx_opts fx;
    size_t truncate;
    int no_weights;
} vopts;

static void make_version(const char *name, int v, const vopts *o)
{
    vopts def = {0};
    if (!o) o = &def;
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/%s/%d", g_repo, name, v);
    mkdirs(dir);
    if (!o->no_weights) {
        size_t len;
        uint8_t *w = fx_example_weights(&o->fx, &len);
        snprintf(path, sizeof path, "%s/weights.safetensors", dir);
        xwrite(path, w, o->truncate && o->truncate < len ? o->truncate : len);
        free(w);
    }
    const char *json = o->json ? o->json : FX_EXAMPLE_JSON;
    snprintf(path, sizeof path, "%s/model.json", dir);
    xwrite(path, json, strlen(json));
}

typedef struct vstate {
    int found;
    enum registry_state state;
    char message[600];
    int n_versions;
    ikbo_serving serving;
    int has_serving;
} vstate;

typedef struct find_ctx {
    const char *name;
    int64_t version;
    vstate *out;
} find_ctx;

static void visit(const registry_entry_view *e, void *p)
{
    find_ctx *c = p;
    if (strcmp(e->name, c->name)) return;
    c->out->n_versions = e->n_versions;
    for (int j = 0; j < e->n_versions; j++) {
        if (e->versions[j].version != c->version) continue;
        c->out->found = 1;
        c->out->state = e->versions[j].state;
        snprintf(c->out->message, sizeof c->out->message, "%s", e->versions[j].message);
        if (e->versions[j].serving) {
            c->out->serving = *e->versions[j].serving;
            c->out->has_serving = 1;
        }
    }
}

static vstate state_of(registry *r, const char *name, int64_t version)
{
    vstate s;
    memset(&s, 0, sizeof s);
    s.state = (enum registry_state)-1;
    find_ctx c = {name, version, &s};
    registry_foreach(r, visit, &c);
    return s;
}

#define assert_state(r, name, v, st)                                                          \
    do {                                                                                      \
        vstate s_ = state_of(r, name, v);                                                     \
        if (!s_.found || s_.state != (st))                                                    \
            fail_msg("%s v%d: state %s (found %d), want %s: %s", name, (int)(v),              \
                     s_.found ? registry_state_name(s_.state) : "-", s_.found,                \
                     registry_state_name(st), s_.message);                                    \
    } while (0)

static registry *open_registry(int settle_ms, const registry_policy *pol,
                               metrics_family *failures)
{
    registry_opts o = {.repository = g_repo, .device = "cpu", .n_slots = 2,
                       .settle_ms = settle_ms, .load_failures = failures};
    if (pol) o.default_policy = *pol;
    ikbo_err err;
    registry *r = registry_new(&o, &err);
    if (!r) fail_msg("registry_new: %s", err.msg);
    return r;
}

/* Scores the minimal batch on the handle's slot 1: the handle works. */
static void score_ok(registry_model *m)
{
    ikbo_err err;
    ikbo_ctx *ctx = registry_model_ctx(m, 1, &err);
    if (!ctx) fail_msg("ctx: %s", err.msg);
    static const int64_t ids[1] = {7}, off[2] = {0, 1}, none[2] = {0, 0};
    static const int32_t map[1] = {0};
    float ud[8] = {0}, cd[4] = {0}, ts[2], score;
    ikbo_jagged us[2] = {{ids, off}, {ids, none}}, cs[2] = {{ids, off}, {ids, off}};
    ikbo_batch b = {.n_users = 1, .n_cands = 1, .user_dense = ud, .user_sparse = us,
                    .hist = {ids, off}, .cand_dense = cd, .cand_sparse = cs, .map = map};
    if (ikbo_score(ctx, &b, ts, &score, &err)) fail_msg("score: %s", err.msg);
}

static int64_t acquired_version(registry *r, const char *name, int64_t v)
{
    rq_status st;
    registry_model *m = registry_acquire(r, name, v, &st);
    if (!m) return -(int64_t)st.code;
    int64_t got = registry_model_version(m);
    registry_release(m);
    return got;
}

static int setup(void **s)
{
    (void)s;
    snprintf(g_repo, sizeof g_repo, "/tmp/ikbo-test-registry-XXXXXX");
    assert_non_null(mkdtemp(g_repo));
    return 0;
}

static int teardown(void **s)
{
    (void)s;
    rmtree(g_repo);
    return 0;
}

static void test_swap_keeps_old_handle(void **s)
{
    (void)s;
    make_version("demo", 1, NULL);
    registry *r = open_registry(0, NULL, NULL);
    assert_state(r, "demo", 1, REGISTRY_LOADING); /* listed before loading */
    assert_int_equal(registry_poll_once(r, 1), 1);
    assert_state(r, "demo", 1, REGISTRY_READY);
    char why[300];
    assert_int_equal(registry_all_ready(r, why, sizeof why), 1);

    rq_status st;
    registry_model *old = registry_acquire(r, "demo", 0, &st);
    assert_non_null(old);
    assert_int_equal(registry_model_version(old), 1);
    assert_int_equal(registry_model_retired(old), 0);
    assert_string_equal(registry_model_serving(old)->device, "cpu");
    assert_string_equal(registry_model_serving(old)->mode, "ikbo");
    assert_int_equal(registry_model_serving(old)->instances, -1);

    make_version("demo", 2, NULL);
    registry_poll_once(r, 0); /* settle 0: loads at once */
    assert_state(r, "demo", 2, REGISTRY_READY);
    assert_state(r, "demo", 1, REGISTRY_UNLOADED);
    assert_int_equal(acquired_version(r, "demo", 0), 2);
    assert_int_equal(acquired_version(r, "demo", 1), -RQ_NOT_FOUND);
    /* The old handle still scores after the swap, then goes away. */
    assert_int_equal(registry_model_retired(old), 1);
    score_ok(old);
    registry_release(old);

    /* A handle outlives the registry too. */
    registry_model *m = registry_acquire(r, "demo", 2, &st);
    assert_non_null(m);
    registry_free(r);
    score_ok(m);
    registry_release(m);
}

static void test_failed_versions_keep_previous(void **s)
{
    (void)s;
    metrics_registry *mr = metrics_registry_new();
    const char *const lbl[] = {"model"};
    metrics_family *fails = metrics_family_new(mr, METRICS_COUNTER, "f_total", "h", 1, lbl, 0, NULL);
    make_version("demo", 1, NULL);
    registry *r = open_registry(0, NULL, fails);
    registry_poll_once(r, 1);
    assert_state(r, "demo", 1, REGISTRY_READY);

    struct {
        vopts o;
        const char *want;
    } bad[] = {
        {{.truncate = 4000}, "weights.safetensors"},
        {{.json = "{\"format\": \"ikbo-model/1\", \"inputs\": "}, "model.json"},
        {{.no_weights = 1}, "weights.safetensors: cannot open"},
        {{.fx = {.reshape = "top1.weight", .rows = 64, .cols = 191}}, "top1.weight"},
    };
    const char *const d[] = {"demo"};
    for (int i = 0; i < (int)(sizeof bad / sizeof bad[0]); i++) {
        int v = 2 + i;
        make_version("demo", v, &bad[i].o);
        registry_poll_once(r, 0);
        assert_state(r, "demo", v, REGISTRY_FAILED);
        vstate st = state_of(r, "demo", v);
        if (!strstr(st.message, bad[i].want))
            fail_msg("v%d message '%s' lacks '%s'", v, st.message, bad[i].want);
        /* The newest good version still serves; acquire(0) finds it. */
        assert_state(r, "demo", 1, REGISTRY_READY);
        assert_int_equal(acquired_version(r, "demo", 0), 1);
        assert_int_equal(registry_model_ready(r, "demo"), 1);
        assert_true(metrics_value(metrics_series_get(fails, d)) == i + 1);
    }
    /* Unchanged files are not retried on the next poll. */
    registry_poll_once(r, 0);
    assert_true(metrics_value(metrics_series_get(fails, d)) == 4);
    /* Fixing version 3 in place (its files change): retried, and it
     * replaces version 1 (the newest good one); 4 and 5 stay FAILED. */
    make_version("demo", 3, NULL);
    registry_poll_once(r, 0);
    assert_state(r, "demo", 3, REGISTRY_READY);
    assert_state(r, "demo", 1, REGISTRY_UNLOADED);
    assert_int_equal(acquired_version(r, "demo", 0), 3);
    /* SIGHUP-style rescans retry failed versions even when unchanged. */
    registry_poll_once(r, 1);
    assert_true(metrics_value(metrics_series_get(fails, d)) > 4);
    assert_state(r, "demo", 5, REGISTRY_FAILED);
    assert_int_equal(acquired_version(r, "demo", 0), 3);
    registry_free(r);
    metrics_registry_free(mr);
}

static void test_settle_rule(void **s)
{
    (void)s;
    make_version("demo", 1, NULL);
    registry *r = open_registry(60000, NULL, NULL);
    registry_poll_once(r, 1); /* the initial load does not wait */
    assert_state(r, "demo", 1, REGISTRY_READY);
    make_version("demo", 2, NULL);
    registry_poll_once(r, 0);
    assert_state(r, "demo", 2, REGISTRY_LOADING);
    vstate st = state_of(r, "demo", 2);
    assert_non_null(strstr(st.message, "unchanged for 60000 ms"));
    assert_int_equal(acquired_version(r, "demo", 0), 1);
    /* An incomplete directory (no model.json) is not even listed. */
    char dir[600];
    snprintf(dir, sizeof dir, "%s/demo/3", g_repo);
    mkdirs(dir);
    registry_poll_once(r, 0);
    assert_false(state_of(r, "demo", 3).found);
    /* A trusted rescan (SIGHUP) loads version 2 now. */
    registry_poll_once(r, 1);
    assert_state(r, "demo", 2, REGISTRY_READY);
    assert_state(r, "demo", 1, REGISTRY_UNLOADED);
    registry_free(r);
}

static void test_settle_by_change_time(void **s)
{
    (void)s;
    make_version("demo", 1, NULL);
    registry *r = open_registry(300, NULL, NULL);
    registry_poll_once(r, 1);
    make_version("demo", 2, NULL);
    /* Written 400 ms before the poller first sees it: at rest by its change
     * times, so the first look loads it (no second look needed). */
    usleep(400 * 1000);
    registry_poll_once(r, 0);
    assert_state(r, "demo", 2, REGISTRY_READY);
    /* Written just now: the first look waits. */
    make_version("demo", 3, NULL);
    registry_poll_once(r, 0);
    assert_state(r, "demo", 3, REGISTRY_LOADING);
    usleep(350 * 1000);
    registry_poll_once(r, 0);
    assert_state(r, "demo", 3, REGISTRY_READY);
    registry_free(r);
}

static void test_policies(void **s)
{
    (void)s;
    for (int v = 1; v <= 3; v++) make_version("demo", v, NULL);
    registry_policy two = {.latest = 2};
    registry *r = open_registry(0, &two, NULL);
    registry_poll_once(r, 1);
    assert_state(r, "demo", 3, REGISTRY_READY);
    assert_state(r, "demo", 2, REGISTRY_READY);
    assert_false(state_of(r, "demo", 1).found);
    assert_int_equal(acquired_version(r, "demo", 0), 3);
    assert_int_equal(acquired_version(r, "demo", 2), 2);
    registry_free(r);

    registry_policy list = {.n_versions = 2, .versions = {1, 3}};
    r = open_registry(0, &list, NULL);
    registry_poll_once(r, 1);
    assert_state(r, "demo", 1, REGISTRY_READY);
    assert_state(r, "demo", 3, REGISTRY_READY);
    assert_false(state_of(r, "demo", 2).found);
    assert_int_equal(acquired_version(r, "demo", 2), -RQ_NOT_FOUND);
    /* Removing a listed version's directory retires it. */
    char dir[600];
    snprintf(dir, sizeof dir, "%s/demo/3", g_repo);
    rmtree(dir);
    registry_poll_once(r, 0);
    assert_false(state_of(r, "demo", 3).found);
    assert_int_equal(acquired_version(r, "demo", 0), 1);
    registry_free(r);

    /* Per-model policy beats the default. */
    make_version("other", 1, NULL);
    make_version("other", 2, NULL);
    registry_model_policy mp = {"other", {.latest = 2}};
    registry_opts o = {.repository = g_repo, .device = "cpu", .n_slots = 1,
                       .policies = &mp, .n_policies = 1};
    ikbo_err err;
    r = registry_new(&o, &err);
    assert_non_null(r);
    registry_poll_once(r, 1);
    assert_state(r, "other", 1, REGISTRY_READY);
    assert_state(r, "other", 2, REGISTRY_READY);
    assert_false(state_of(r, "demo", 1).found); /* demo: latest 1 = version 2 */
    assert_state(r, "demo", 2, REGISTRY_READY);
    registry_free(r);
}

static void test_admin_load_unload(void **s)
{
    (void)s;
    make_version("demo", 1, NULL);
    make_version("demo", 2, NULL);
    make_version("other", 1, NULL);
    registry *r = open_registry(0, NULL, NULL);
    registry_poll_once(r, 1);
    rq_status st;
    registry_model *held = registry_acquire(r, "demo", 0, &st);
    assert_non_null(held);

    assert_int_equal(registry_admin_unload(r, "demo", 0, &st), 0);
    assert_int_equal(acquired_version(r, "demo", 0), -RQ_NOT_FOUND);
    assert_null(registry_acquire(r, "demo", 0, &st));
    assert_non_null(strstr(st.msg, "unloaded"));
    assert_int_equal(registry_model_ready(r, "demo"), 0);
    assert_int_equal(registry_model_ready(r, "other"), 1);
    char why[300];
    assert_int_equal(registry_all_ready(r, why, sizeof why), 1); /* unloaded on purpose */
    registry_poll_once(r, 1); /* rescans do not bring it back */
    assert_int_equal(acquired_version(r, "demo", 0), -RQ_NOT_FOUND);
    score_ok(held); /* the held request finishes on it */
    registry_release(held);

    assert_int_equal(registry_admin_load(r, "demo", 0, &st), 0);
    registry_poll_once(r, 0);
    assert_int_equal(acquired_version(r, "demo", 0), 2);

    /* Unloading the served version: the policy falls back to version 1. */
    assert_int_equal(registry_admin_unload(r, "demo", 2, &st), 0);
    assert_int_equal(acquired_version(r, "demo", 2), -RQ_NOT_FOUND);
    registry_poll_once(r, 0);
    assert_int_equal(acquired_version(r, "demo", 0), 1);
    /* A plain admin load unblocks and goes by policy: version 2 again, and
     * version 1 retires. */
    assert_int_equal(registry_admin_load(r, "demo", 0, &st), 0);
    registry_poll_once(r, 0);
    assert_int_equal(acquired_version(r, "demo", 0), 2);
    assert_int_equal(acquired_version(r, "demo", 1), -RQ_NOT_FOUND);

    /* Pin version 1 on top of the policy, then unload it again. */
    assert_int_equal(registry_admin_load(r, "demo", 1, &st), 0);
    registry_poll_once(r, 0);
    assert_int_equal(acquired_version(r, "demo", 1), 1);
    assert_int_equal(acquired_version(r, "demo", 0), 2);
    registry_poll_once(r, 0); /* pinned: polling keeps it */
    assert_int_equal(acquired_version(r, "demo", 1), 1);
    assert_int_equal(registry_admin_unload(r, "demo", 1, &st), 0);
    assert_int_equal(acquired_version(r, "demo", 1), -RQ_NOT_FOUND);
    registry_poll_once(r, 0);
    assert_int_equal(acquired_version(r, "demo", 0), 2);
    assert_int_equal(acquired_version(r, "demo", 1), -RQ_NOT_FOUND);
    /* Loading version 1 again does not bring back a version 2 unloaded by
     * itself: unload 2, load 1 -> only 1 serves. */
    assert_int_equal(registry_admin_unload(r, "demo", 2, &st), 0);
    assert_int_equal(registry_admin_load(r, "demo", 1, &st), 0);
    registry_poll_once(r, 0);
    assert_int_equal(acquired_version(r, "demo", 0), 1);
    assert_int_equal(acquired_version(r, "demo", 2), -RQ_NOT_FOUND);
    assert_int_equal(registry_admin_load(r, "demo", 0, &st), 0); /* all back */
    registry_poll_once(r, 0);
    assert_int_equal(acquired_version(r, "demo", 0), 2);
    assert_int_equal(acquired_version(r, "demo", 1), 1); /* still pinned */
    assert_int_equal(registry_admin_unload(r, "demo", 1, &st), 0);

    /* Errors. */
    assert_int_equal(registry_admin_load(r, "nope", 0, &st), -1);
    assert_int_equal(st.code, RQ_NOT_FOUND);
    assert_int_equal(registry_admin_load(r, "demo", 9, &st), -1);
    assert_int_equal(st.code, RQ_NOT_FOUND);
    assert_int_equal(registry_admin_load(r, "../etc", 0, &st), -1);
    assert_int_equal(st.code, RQ_INVALID_ARGUMENT);
    assert_int_equal(registry_admin_unload(r, "demo", 9, &st), -1);
    assert_int_equal(st.code, RQ_NOT_FOUND);
    assert_int_equal(registry_admin_unload(r, "nope", 0, &st), -1);
    assert_int_equal(st.code, RQ_NOT_FOUND);

    /* A model directory added later is found by the next scan; a broken
     * new model does not make the server unready. */
    vopts broken = {.truncate = 100};
    make_version("new_broken", 1, &broken);
    make_version("late", 4, NULL);
    registry_poll_once(r, 0);
    assert_int_equal(acquired_version(r, "late", 0), 4);
    assert_state(r, "new_broken", 1, REGISTRY_FAILED);
    assert_int_equal(registry_all_ready(r, why, sizeof why), 1);
    assert_int_equal(registry_admin_unload(r, "other", 0, &st), 0);
    assert_int_equal(registry_all_ready(r, why, sizeof why), 1); /* demo, late */
    /* ... and one removed disappears. */
    char dir[600];
    snprintf(dir, sizeof dir, "%s/late", g_repo);
    rmtree(dir);
    registry_poll_once(r, 0);
    assert_int_equal(registry_model_ready(r, "late"), -1);
    registry_free(r);
}

/* A plain admin load that lands between a pass's scan and its loads is
 * met by that pass's load; the admin call's own pass must not load the
 * version a second time (the daemon logged 102 loads for 100 unload/load
 * cycles). A plain load of a version already READY still reloads it. */
static void test_admin_load_between_scan_and_loads(void **s)
{
    (void)s;
    make_version("demo", 1, NULL);
    registry *r = open_registry(0, NULL, NULL);
    assert_int_equal(registry_poll_once(r, 1), 1);
    rq_status st;
    assert_int_equal(registry_admin_unload(r, "demo", 0, &st), 0);
    assert_int_equal(registry_poll_once(r, 0), 0); /* a pass's scan: nothing to load */
    assert_int_equal(registry_admin_load(r, "demo", 0, &st), 0);
    assert_int_equal(registry_load_pending(r), 1); /* that pass's loads take it */
    registry_model *m = registry_acquire(r, "demo", 0, &st);
    assert_non_null(m);
    registry_poll_once(r, 0); /* the pass the admin call woke */
    assert_int_equal(registry_model_retired(m), 0);

    assert_int_equal(registry_admin_load(r, "demo", 0, &st), 0);
    registry_poll_once(r, 0);
    assert_int_equal(registry_model_retired(m), 1); /* reloaded and swapped */
    assert_int_equal(acquired_version(r, "demo", 0), 1);
    registry_release(m);
    registry_free(r);
}

static void test_serving_precedence(void **s)
{
    (void)s;
    char *json = fx_replace(FX_EXAMPLE_JSON, "\"format\": \"ikbo-model/1\",",
                            "\"format\": \"ikbo-model/1\", \"serving\": {\"max_batch_candidates\": "
                            "100, \"instances\": 2, \"mode\": \"ikbo\"},");
    assert_non_null(json);
    vopts o = {.json = json};
    make_version("demo", 1, &o);
    char path[600];
    snprintf(path, sizeof path, "%s/demo/config.json", g_repo);
    const char *cfg = "{\"serving\": {\"instances\": 3, \"mode\": \"broadcast\"}}";
    xwrite(path, cfg, strlen(cfg));
    ikbo_serving def;
    serving_unset(&def);
    def.max_batch_candidates = 7;
    def.max_queue_delay_us = 55;
    registry_opts ro = {.repository = g_repo, .device = "cpu", .n_slots = 1,
                        .serving_defaults = &def};
    ikbo_err err;
    registry *r = registry_new(&ro, &err);
    assert_non_null(r);
    registry_poll_once(r, 1);
    assert_state(r, "demo", 1, REGISTRY_READY);
    rq_status st;
    registry_model *m = registry_acquire(r, "demo", 0, &st);
    assert_non_null(m);
    const ikbo_serving *sv = registry_model_serving(m);
    assert_int_equal(sv->max_batch_candidates, 100); /* model.json over the server */
    assert_int_equal(sv->max_queue_delay_us, 55);    /* server default */
    assert_int_equal(sv->max_batch_users, -1);       /* nobody */
    assert_int_equal(sv->instances, 3);              /* config.json over model.json */
    assert_string_equal(sv->mode, "broadcast");
    assert_string_equal(sv->device, "cpu");
    assert_int_equal(registry_model_info(m)->mode, IKBO_MODE_BROADCAST);
    registry_release(m);

    /* A bad config.json fails the next load; the loaded version serves on. */
    cfg = "{\"serving\": {\"instancez\": 3}}";
    xwrite(path, cfg, strlen(cfg));
    assert_int_equal(registry_admin_load(r, "demo", 0, &st), 0);
    registry_poll_once(r, 0);
    assert_state(r, "demo", 1, REGISTRY_READY);
    vstate vs = state_of(r, "demo", 1);
    assert_non_null(strstr(vs.message, "config.json: serving.instancez: unknown key"));
    assert_int_equal(acquired_version(r, "demo", 0), 1);
    make_version("demo", 2, NULL);
    registry_poll_once(r, 0);
    assert_state(r, "demo", 2, REGISTRY_FAILED);
    assert_non_null(strstr(state_of(r, "demo", 2).message, "config.json"));
    registry_free(r);
    free(json);

    /* config.json reads the key table model.json's "serving" reads: same
     * ranges and wording, the file first; the queue limits are not a model's. */
    char mdir[600];
    snprintf(mdir, sizeof mdir, "%s/demo", g_repo);
    ikbo_serving got;
    cfg = "{\"serving\": {\"instances\": 65}}";
    xwrite(path, cfg, strlen(cfg));
    assert_int_equal(repo_read_model_config(mdir, &got, &err), -1);
    assert_non_null(strstr(err.msg, "demo/config.json: serving.instances: expected integer 0..64, got 65"));
    assert_int_equal(got.instances, -1); /* unset on error */
    cfg = "{\"serving\": {\"max_queue_requests\": 1}}";
    xwrite(path, cfg, strlen(cfg));
    assert_int_equal(repo_read_model_config(mdir, &got, &err), -1);
    assert_non_null(strstr(err.msg, "config.json: serving.max_queue_requests: unknown key (known: "));
    cfg = "{\"serving\": {\"instances\": 0, \"device\": \"cuda:2\"}}";
    xwrite(path, cfg, strlen(cfg));
    assert_int_equal(repo_read_model_config(mdir, &got, &err), 0);
    assert_int_equal(got.instances, 0); /* 0 = auto by device, as in the server's config */
    assert_string_equal(got.device, "cuda:2");
    assert_int_equal(got.max_batch_users, -1);
}

/* config.json's own faults, each named with the file's path; the
 * overrides stay unset after each. A missing file is no fault. */
static void test_model_config_file_errors(void **s)
{
    (void)s;
    char mdir[600], path[700];
    snprintf(mdir, sizeof mdir, "%s/demo", g_repo);
    mkdirs(mdir);
    snprintf(path, sizeof path, "%s/config.json", mdir);
    ikbo_serving got;
    ikbo_err err = {{0}};
    assert_int_equal(repo_read_model_config(mdir, &got, &err), 0); /* none */
    assert_int_equal(got.instances, -1);
    static const struct {
        const char *text, *want;
    } bad[] = {
        {"{\"serving\": ", "demo/config.json: invalid JSON at line 1"},
        {"{\"serving\": {}, \"serving\": {}}", "demo/config.json: invalid JSON at line 1 column 25: duplicate object key"},
        {"[1]", "demo/config.json: expected a JSON object"},
        {"{\"servng\": {}}", "demo/config.json: servng: unknown key (known: serving)"},
        {"{\"serving\": [3]}", "demo/config.json: serving: expected object, got array"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        xwrite(path, bad[i].text, strlen(bad[i].text));
        assert_int_equal(repo_read_model_config(mdir, &got, &err), -1);
        if (!strstr(err.msg, bad[i].want)) fail_msg("%s: got '%s'", bad[i].text, err.msg);
        assert_int_equal(got.instances, -1);
    }
    /* Larger than 1 MiB, then not a regular file. */
    char *big = malloc((1u << 20) + 2);
    assert_non_null(big);
    memset(big, ' ', (1u << 20) + 2);
    big[0] = '{';
    big[(1u << 20) + 1] = '}';
    xwrite(path, big, (1u << 20) + 2);
    free(big);
    assert_int_equal(repo_read_model_config(mdir, &got, &err), -1);
    assert_non_null(strstr(err.msg, "demo/config.json: not a regular file of at most 1048576 bytes"));
    assert_int_equal(unlink(path), 0);
    assert_int_equal(mkdir(path, 0755), 0);
    assert_int_equal(repo_read_model_config(mdir, &got, &err), -1);
    assert_non_null(strstr(err.msg, "demo/config.json: not a regular file"));
    assert_int_equal(rmdir(path), 0);

    /* A repository that cannot be listed names itself and the reason. */
    char **names = NULL, missing[700];
    snprintf(missing, sizeof missing, "%s/no-such-dir", g_repo);
    assert_int_equal(repo_list_models(missing, &names, &err), -1);
    assert_null(names);
    assert_non_null(strstr(err.msg, "no-such-dir: No such file or directory"));
}

static void test_memory_check_refuses(void **s)
{
    (void)s;
    make_version("demo", 1, NULL);
    /* Version 2 claims a 1 TiB tensor: a sparse file, so nothing is written. */
    char dir[600], path[700];
    snprintf(dir, sizeof dir, "%s/demo/2", g_repo);
    mkdirs(dir);
    snprintf(path, sizeof path, "%s/model.json", dir);
    xwrite(path, FX_EXAMPLE_JSON, strlen(FX_EXAMPLE_JSON));
    const uint64_t n = 1ull << 38; /* elements: 4 * 2^38 = 1 TiB */
    char hdr[200];
    int hl = snprintf(hdr, sizeof hdr,
                      "{\"tables.item\":{\"dtype\":\"F32\",\"shape\":[%llu],\"data_offsets\":[0,%llu]}}",
                      (unsigned long long)n, (unsigned long long)(4 * n));
    snprintf(path, sizeof path, "%s/weights.safetensors", dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    uint8_t le[8];
    for (int i = 0; i < 8; i++) le[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    assert_int_equal(write(fd, le, 8), 8);
    assert_int_equal(write(fd, hdr, (size_t)hl), hl);
    if (ftruncate(fd, (off_t)(8 + hl + 4 * n)) != 0) {
        close(fd);
        skip(); /* the file system cannot hold the sparse file */
    }
    close(fd);
    uint64_t host, dev;
    assert_int_equal(repo_estimate_memory(dir, "cpu", &host, &dev), 0);
    assert_true(host >= 4 * n);
    assert_int_equal(dev, 0);
    registry *r = open_registry(0, NULL, NULL);
    registry_poll_once(r, 1);
    assert_state(r, "demo", 2, REGISTRY_FAILED);
    vstate vs = state_of(r, "demo", 2);
    if (!strstr(vs.message, "not loaded: needs about") || !strstr(vs.message, "MiB of host memory"))
        fail_msg("message: %s", vs.message);
    assert_state(r, "demo", 1, REGISTRY_READY);
    assert_int_equal(acquired_version(r, "demo", 0), 1);
    registry_free(r);
}

static size_t heap_in_use(void)
{
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
}

static void test_load_unload_cycles(void **s)
{
    (void)s;
    make_version("demo", 1, NULL);
    make_version("other", 1, NULL);
    registry *r = open_registry(0, NULL, NULL);
    registry_poll_once(r, 1);
    const int cycles = 100;
    size_t base = 0;
    rq_status st;
    for (int i = 0; i < cycles; i++) {
        if (i == 10) base = heap_in_use();
        registry_model *held = registry_acquire(r, "demo", 0, &st);
        assert_non_null(held);
        assert_int_equal(registry_admin_unload(r, "demo", 0, &st), 0);
        score_ok(held);
        registry_release(held);
        assert_int_equal(registry_admin_load(r, "demo", i % 2 ? 1 : 0, &st), 0);
        registry_poll_once(r, 0);
        assert_int_equal(acquired_version(r, "demo", 0), 1);
        assert_int_equal(acquired_version(r, "other", 0), 1);
    }
    size_t end = heap_in_use();
    /* Every cycle loads and frees a ~1 MiB model: a leak of one shows. */
    if (end > base + (256u << 10))
        fail_msg("heap grew by %zu bytes over %d load/unload cycles", end - base, cycles - 10);
    registry_free(r);
}

/* The rendered value of name{model,version,device="cpu",kind}; -1 when the
 * scrape has no such series. */
static double series_value(metrics_registry *mr, const char *name, const char *model,
                           const char *version, const char *kind)
{
    size_t len;
    char *text = metrics_render(mr, &len);
    assert_non_null(text);
    char want[300];
    snprintf(want, sizeof want, "%s{model=\"%s\",version=\"%s\",device=\"cpu\",kind=\"%s\"} ",
             name, model, version, kind);
    const char *p = strstr(text, want);
    double v = p ? strtod(p + strlen(want), NULL) : -1;
    free(text);
    return v;
}

/* ikbo_model_memory_bytes from registry_collect_memory: every READY version,
 * weights > 0, workspace by tag once a context has scored (0 broadcast in
 * IKBO mode), a swapped-out version gone from the family while a held
 * handle keeps it alive, and handles released after the collect. */
static void test_memory_metrics(void **s)
{
    (void)s;
    metrics_registry *mr = metrics_registry_new();
    const char *const lbl[] = {"model", "version", "device", "kind"};
    metrics_family *f =
        metrics_family_new(mr, METRICS_GAUGE, "mem_bytes", "h", 4, lbl, 0, NULL);
    make_version("demo", 1, NULL);
    make_version("other", 1, NULL);
    registry *r = open_registry(0, NULL, NULL);
    metrics_family_set_collect(f, registry_collect_memory, r);
    assert_true(series_value(mr, "mem_bytes", "demo", "1", "weights") < 0); /* loading */
    assert_int_equal(registry_poll_once(r, 1), 2);

    registry_model **hs;
    assert_int_equal(registry_acquire_ready(r, &hs), 2);
    assert_string_equal(registry_model_name(hs[0]), "demo");
    assert_string_equal(registry_model_name(hs[1]), "other");
    ikbo_stats st;
    registry_model_stats(hs[0], &st);
    assert_true(st.weight_bytes > 0);
    for (int i = 0; i < 2; i++) registry_release(hs[i]);
    free(hs);

    double w = series_value(mr, "mem_bytes", "demo", "1", "weights");
    assert_true(w == (double)st.weight_bytes);
    assert_true(series_value(mr, "mem_bytes", "other", "1", "weights") > 0);
    /* The warm-up context's workspace is live; nothing is broadcast. */
    assert_true(series_value(mr, "mem_bytes", "demo", "1", "candidate") > 0);
    assert_true(series_value(mr, "mem_bytes", "demo", "1", "user") > 0);
    assert_true(series_value(mr, "mem_bytes", "demo", "1", "index") > 0);
    assert_true(series_value(mr, "mem_bytes", "demo", "1", "broadcast") == 0);

    /* Scoring on another slot makes a second context: more live bytes. */
    rq_status rs;
    registry_model *old = registry_acquire(r, "demo", 1, &rs);
    assert_non_null(old);
    double cand0 = series_value(mr, "mem_bytes", "demo", "1", "candidate");
    score_ok(old);
    assert_true(series_value(mr, "mem_bytes", "demo", "1", "candidate") > cand0);

    /* v2 replaces v1: v1 leaves the family though the handle keeps it. */
    make_version("demo", 2, NULL);
    registry_poll_once(r, 0);
    assert_state(r, "demo", 2, REGISTRY_READY);
    assert_true(series_value(mr, "mem_bytes", "demo", "1", "weights") < 0);
    assert_true(series_value(mr, "mem_bytes", "demo", "2", "weights") > 0);
    score_ok(old);
    registry_release(old); /* the last reference: the collect took none */
    registry_free(r);
    metrics_registry_free(mr);
}

static void test_worker_thread(void **s)
{
    (void)s;
    make_version("demo", 1, NULL);
    registry_opts o = {.repository = g_repo, .device = "cpu", .n_slots = 1, .poll_ms = 20,
                       .settle_ms = 0};
    ikbo_err err;
    registry *r = registry_new(&o, &err);
    assert_non_null(r);
    assert_int_equal(registry_start(r, &err), 0);
    int64_t got = 0;
    for (int i = 0; i < 500 && got != 1; i++) {
        usleep(10000);
        got = acquired_version(r, "demo", 0);
    }
    assert_int_equal(got, 1);
    make_version("demo", 2, NULL); /* polling finds it */
    for (int i = 0; i < 500 && got != 2; i++) {
        usleep(10000);
        got = acquired_version(r, "demo", 0);
    }
    assert_int_equal(got, 2);
    rq_status st;
    assert_int_equal(registry_admin_unload(r, "demo", 0, &st), 0);
    assert_int_equal(registry_admin_load(r, "demo", 0, &st), 0); /* the worker loads it */
    got = 0;
    for (int i = 0; i < 500 && got != 2; i++) {
        usleep(10000);
        got = acquired_version(r, "demo", 0);
    }
    assert_int_equal(got, 2);
    registry_rescan(r);
    registry_stop(r);
    registry_free(r);
}

int main(void)
{
    /* Log lines go to a scratch file: the tests check states, not text. */
    FILE *logf = tmpfile();
    log_setup(LOG_LEVEL_INFO, 0, logf);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_swap_keeps_old_handle, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failed_versions_keep_previous, setup, teardown),
        cmocka_unit_test_setup_teardown(test_settle_rule, setup, teardown),
        cmocka_unit_test_setup_teardown(test_settle_by_change_time, setup, teardown),
        cmocka_unit_test_setup_teardown(test_policies, setup, teardown),
        cmocka_unit_test_setup_teardown(test_admin_load_unload, setup, teardown),
        cmocka_unit_test_setup_teardown(test_admin_load_between_scan_and_loads, setup, teardown),
        cmocka_unit_test_setup_teardown(test_serving_precedence, setup, teardown),
        cmocka_unit_test_setup_teardown(test_model_config_file_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_memory_check_refuses, setup, teardown),
        cmocka_unit_test_setup_teardown(test_load_unload_cycles, setup, teardown),
        cmocka_unit_test_setup_teardown(test_memory_metrics, setup, teardown),
        cmocka_unit_test_setup_teardown(test_worker_thread, setup, teardown),
    };
    /* IKBO_TEST_FILTER=test_load_unload_cycles runs one test (the leak check
     * under valgrind runs only what it needs). */
    if (getenv("IKBO_TEST_FILTER")) cmocka_set_test_filter(getenv("IKBO_TEST_FILTER"));
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    if (logf) fclose(logf);
    return rc;
}
