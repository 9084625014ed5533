/* test_config.c - server configuration (server/config.c): defaults, the
 * shipped config/server.json, every key's type/value errors, unknown keys,
 * env and flag precedence, --help/--version; and the serving settings' key
 * table (engine/serving.h) that config.json's "batching", "device", "mode"
 * share with model.json's "serving". */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "engine/serving.h"
#include "kernels/backend.h"

#include "server/config.h"

/* c at the defaults; fails the test if config_defaults does. */
static void defaults_ok(config *c)
{
    ikbo_err err = {{0}};
    if (config_defaults(c, &err))
        fail_msg("config_defaults: %s", err.msg);
}

static void apply_err(const char *json, const char *substr)
{
    config c;
    ikbo_err err = {{0}};
    defaults_ok(&c);
    int rc = config_apply_json(&c, json, strlen(json), &err);
    if (rc == 0)
        fail_msg("accepted %s (wanted error '%s')", json, substr);
    if (!strstr(err.msg, substr))
        fail_msg("message '%s' lacks '%s'", err.msg, substr);
    config_free(&c);
}

static void apply_ok(config *c, const char *json)
{
    ikbo_err err = {{0}};
    defaults_ok(c);
    if (config_apply_json(c, json, strlen(json), &err))
        fail_msg("rejected %s: %s", json, err.msg);
}

/* config_to_json(c) contains want. */
static void json_has(const config *c, const char *want)
{
    char *j = config_to_json(c);
    assert_non_null(j);
    if (!strstr(j, want))
        fail_msg("config_to_json lacks %s:\n%s", want, j);
    free(j);
}

/* Writes text to a temp file; returns its malloc'd path. */
static char *tmpfile_with(const char *text)
{
    char *path = strdup("/tmp/ikbo_test_config_XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    return path;
}

static void test_defaults(void **s)
{
    (void)s;
    config c;
    defaults_ok(&c);
    assert_string_equal(c.grpc_listen, "127.0.0.1:50051");
    assert_string_equal(c.http_listen, "127.0.0.1:8080");
    assert_string_equal(c.model_repository, "models");
    assert_null(c.models);
    assert_int_equal(c.n_models, 0);
    assert_string_equal(c.device, "cpu");
    assert_int_equal(c.mode, IKBO_MODE_IKBO);
    assert_int_equal(c.threads, 2);
    assert_int_equal(c.limits.max_users, RQ_DEFAULT_MAX_USERS);
    assert_int_equal(c.limits.max_candidates, RQ_DEFAULT_MAX_CANDIDATES);
    assert_int_equal(c.limits.max_ids_per_bag, RQ_DEFAULT_MAX_IDS_PER_BAG);
    assert_int_equal(c.limits.max_history, RQ_DEFAULT_MAX_HISTORY);
    assert_int_equal(c.limits.max_sparse_features, RQ_DEFAULT_MAX_SPARSE_FEATURES);
    assert_int_equal(c.limits.max_message_bytes, 4 << 20);
    assert_int_equal(c.max_metadata_bytes, 8192);
    assert_int_equal(c.log_level, CONFIG_LOG_INFO);
    assert_int_equal(c.log_format, CONFIG_LOG_PLAIN);
    assert_int_equal(c.drain_timeout_ms, 10000);
    assert_null(c.tls_cert_file);
    assert_null(c.tls_key_file);
    assert_null(c.tls_client_ca_file);
    assert_null(c.config_file);
    config_free(&c);
    config_free(&c); /* safe twice */
}

static void test_good_config(void **s)
{
    (void)s;
    config c;
    apply_ok(&c, "{\"grpc_listen\":\"0.0.0.0:6000\",\"http_listen\":\"[::1]:0\","
                 "\"model_repository\":\"/srv/models\",\"models\":[\"demo\",\"bench\"],"
                 "\"device\":\"cuda:1\",\"mode\":\"broadcast\",\"threads\":8,"
                 "\"limits\":{\"max_users\":10,\"max_candidates\":20,\"max_ids_per_bag\":30,"
                 "\"max_history\":40,\"max_sparse_features\":5,\"max_message_bytes\":1000,"
                 "\"max_metadata_bytes\":16384},"
                 "\"log\":{\"level\":\"debug\",\"format\":\"json\"},\"drain_timeout_ms\":0,"
                 "\"tls\":{\"cert_file\":\"c.pem\",\"key_file\":\"k.pem\",\"client_ca_file\":\"ca.pem\"}}");
    assert_string_equal(c.grpc_listen, "0.0.0.0:6000");
    assert_string_equal(c.http_listen, "[::1]:0");
    assert_string_equal(c.model_repository, "/srv/models");
    assert_int_equal(c.n_models, 2);
    assert_string_equal(c.models[1], "bench");
    assert_string_equal(c.device, "cuda:1");
    assert_int_equal(c.mode, IKBO_MODE_BROADCAST);
    assert_int_equal(c.threads, 8);
    assert_int_equal(c.limits.max_users, 10);
    assert_int_equal(c.limits.max_candidates, 20);
    assert_int_equal(c.limits.max_ids_per_bag, 30);
    assert_int_equal(c.limits.max_history, 40);
    assert_int_equal(c.limits.max_sparse_features, 5);
    assert_int_equal(c.limits.max_message_bytes, 1000);
    assert_int_equal(c.max_metadata_bytes, 16384);
    assert_int_equal(c.log_level, CONFIG_LOG_DEBUG);
    assert_int_equal(c.log_format, CONFIG_LOG_JSON);
    assert_int_equal(c.drain_timeout_ms, 0);
    assert_string_equal(c.tls_cert_file, "c.pem");
    assert_string_equal(c.tls_key_file, "k.pem");
    assert_string_equal(c.tls_client_ca_file, "ca.pem");
    char *j = config_to_json(&c);
    assert_non_null(j);
    assert_non_null(strstr(j, "\"mode\":\"broadcast\""));
    assert_non_null(strstr(j, "\"max_history\":40"));
    assert_non_null(strstr(j, "\"max_metadata_bytes\":16384"));
    assert_non_null(strstr(j, "\"client_ca_file\":\"ca.pem\""));
    free(j);
    config_free(&c);

    /* partial limits keep the other defaults; tls without CA; null = absent */
    apply_ok(&c, "{\"limits\":{\"max_users\":7},\"tls\":{\"cert_file\":\"c\",\"key_file\":\"k\","
                 "\"client_ca_file\":null},\"models\":null,\"grpc_listen\":\"unix:/tmp/s.sock\"}");
    assert_int_equal(c.limits.max_users, 7);
    assert_int_equal(c.limits.max_candidates, RQ_DEFAULT_MAX_CANDIDATES);
    assert_int_equal(c.max_metadata_bytes, CONFIG_DEFAULT_MAX_METADATA_BYTES);
    assert_null(c.tls_client_ca_file);
    assert_null(c.models);
    assert_string_equal(c.grpc_listen, "unix:/tmp/s.sock");
    config_free(&c);
    apply_ok(&c, "{\"tls\":null}");
    assert_null(c.tls_cert_file);
    json_has(&c, "\"tls\":null");
    config_free(&c);
}

static void test_shipped_config(void **s)
{
    (void)s;
    /* Unit tests run from the repository root (make unit). */
    FILE *f = fopen("config/server.json", "r");
    if (!f)
        skip();
    fclose(f);
    config c;
    ikbo_err err;
    assert_int_equal(config_defaults(&c, &err), 0);
    if (config_apply_file(&c, "config/server.json", &err))
        fail_msg("%s", err.msg);
    assert_string_equal(c.model_repository, "models");
    assert_string_equal(c.device, "cpu");
    assert_int_equal(c.mode, IKBO_MODE_IKBO);
    assert_string_equal(c.config_file, "config/server.json");
    config_free(&c);
}

static void test_bad_values(void **s)
{
    (void)s;
    apply_err("{\"threads\":\"two\"}", "threads: expected integer 1..1024, got \"two\"");
    apply_err("{\"threads\":0}", "threads: expected integer 1..1024, got 0");
    apply_err("{\"threads\":1.5}", "threads: expected integer 1..1024, got 1.5");
    apply_err("{\"threads\":5000}", "threads: expected integer 1..1024");
    apply_err("{\"drain_timeout_ms\":-1}", "drain_timeout_ms: expected integer 0..3600000, got -1");
    apply_err("{\"grpc_listen\":5}", "grpc_listen: expected string, got 5");
    apply_err("{\"grpc_listen\":\"localhost\"}", "grpc_listen: expected host:port or unix:PATH, got \"localhost\"");
    apply_err("{\"grpc_listen\":\":50051\"}", "grpc_listen: expected host:port");
    apply_err("{\"http_listen\":\"h:99999\"}", "http_listen: expected host:port, got \"h:99999\"");
    apply_err("{\"http_listen\":\"h:80x\"}", "http_listen: expected host:port");
    apply_err("{\"http_listen\":\"unix:/x\"}", "http_listen: expected host:port, got \"unix:/x\"");
    apply_err("{\"model_repository\":\"\"}", "model_repository: expected a directory, got \"\"");
    apply_err("{\"model_repository\":[]}", "model_repository: expected string, got array");
    apply_err("{\"device\":\"gpu\"}", "device: expected \"cpu\" or \"cuda:N\", got \"gpu\"");
    apply_err("{\"device\":\"cuda:\"}", "device: expected \"cpu\" or \"cuda:N\"");
    apply_err("{\"device\":\"cuda:x\"}", "device: expected \"cpu\" or \"cuda:N\"");
    /* the one device rule (kernels/backend.h bk_parse_device), as in model.json */
    apply_err("{\"device\":\"cuda:01\"}", "device: expected \"cpu\" or \"cuda:N\"");
    apply_err("{\"device\":\"cuda:1000\"}", "device: expected \"cpu\" or \"cuda:N\"");
    apply_err("{\"device\":\"cuda:+1\"}", "device: expected \"cpu\" or \"cuda:N\"");
    apply_err("{\"mode\":\"fast\"}", "mode: expected \"ikbo\" or \"broadcast\", got \"fast\"");
    apply_err("{\"mode\":true}", "mode: expected string, got true");
    apply_err("{\"models\":\"demo\"}", "models: expected a non-empty array of model names (omit for all), got \"demo\"");
    apply_err("{\"models\":[]}", "models: expected a non-empty array of model names (omit for all), got []");
    apply_err("{\"models\":[\"a\",3]}", "models[1]: expected string, got 3");
    apply_err("{\"models\":[\"a/b\"]}", "models[0]: expected a model name");
    apply_err("{\"models\":[\"..\"]}", "models[0]: expected a model name");
    apply_err("{\"models\":[\"a\",\"a\"]}", "models[1]: duplicate model \"a\"");
    apply_err("{\"limits\":[]}", "limits: expected object, got array");
    apply_err("{\"limits\":{\"max_users\":0}}", "limits.max_users: expected integer 1..1000000, got 0");
    apply_err("{\"limits\":{\"max_candidates\":\"9\"}}", "limits.max_candidates: expected integer");
    apply_err("{\"limits\":{\"max_message_bytes\":2147483648}}", "limits.max_message_bytes: expected integer 1..1073741824");
    apply_err("{\"limits\":{\"max_metadata_bytes\":0}}", "limits.max_metadata_bytes: expected integer 1..262144, got 0");
    apply_err("{\"limits\":{\"max_metadata_bytes\":262145}}", "limits.max_metadata_bytes: expected integer 1..262144");
    apply_err("{\"log\":{\"level\":\"verbose\"}}", "log.level: expected \"debug\", \"info\", \"warn\" or \"error\", got \"verbose\"");
    apply_err("{\"log\":{\"format\":\"xml\"}}", "log.format: expected \"plain\" or \"json\", got \"xml\"");
    apply_err("{\"log\":{\"level\":1}}", "log.level: expected string, got 1");
    apply_err("{\"log\":\"info\"}", "log: expected object, got \"info\"");
    apply_err("{\"tls\":{\"cert_file\":\"c\"}}", "tls: cert_file and key_file are both required");
    apply_err("{\"tls\":{\"key_file\":\"k\"}}", "tls: cert_file and key_file are both required");
    apply_err("{\"tls\":{\"cert_file\":\"\",\"key_file\":\"k\"}}", "tls.cert_file: expected a file path");
    apply_err("{\"tls\":{\"cert_file\":1,\"key_file\":\"k\"}}", "tls.cert_file: expected string, got 1");
    apply_err("{\"tls\":true}", "tls: expected object, got true");
    apply_err("{\"threads\":2,\"threads\":3}", "invalid JSON");
    apply_err("[1]", "expected a JSON object at the top level, got array");
    apply_err("{", "invalid JSON at line 1");
}

/* The device rule every parser shares. */
static void test_parse_device(void **s)
{
    (void)s;
    static const struct { const char *d; int rc, ord; } cases[] = {
        {"cpu", 0, -1},      {"cuda:0", 0, 0},    {"cuda:7", 0, 7},   {"cuda:999", 0, 999},
        {"cuda:1000", -1, -1}, {"cuda:01", -1, -1}, {"cuda:", -1, -1},  {"cuda:-1", -1, -1},
        {"cuda:+1", -1, -1}, {"cuda:1 ", -1, -1}, {"cuda", -1, -1},    {"gpu", -1, -1},
        {"CPU", -1, -1},     {"", -1, -1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int ord = 12345;
        int rc = bk_parse_device(cases[i].d, &ord);
        if (rc != cases[i].rc || ord != cases[i].ord)
            fail_msg("bk_parse_device(\"%s\") = %d, ordinal %d; want %d, %d", cases[i].d, rc, ord,
                     cases[i].rc, cases[i].ord);
    }
    assert_int_equal(bk_parse_device(NULL, NULL), -1);
    /* and the mode names (engine/ikbo.h), shared the same way */
    enum ikbo_mode m = IKBO_MODE_IKBO;
    assert_int_equal(ikbo_mode_parse("broadcast", &m), 0);
    assert_int_equal(m, IKBO_MODE_BROADCAST);
    assert_int_equal(ikbo_mode_parse("ikbo", &m), 0);
    assert_int_equal(m, IKBO_MODE_IKBO);
    assert_int_equal(ikbo_mode_parse("IKBO", &m), -1);
    assert_int_equal(ikbo_mode_parse(NULL, NULL), -1);
    assert_string_equal(ikbo_mode_name(ikbo_mode_parse("broadcast", &m) == 0 ? m : IKBO_MODE_IKBO),
                        "broadcast");
}

static void test_unknown_keys(void **s)
{
    (void)s;
    apply_err("{\"grpc_port\":1}", "grpc_port: unknown key (known: grpc_listen,");
    apply_err("{\"limits\":{\"max_userz\":1}}", "limits.max_userz: unknown key");
    apply_err("{\"log\":{\"lvl\":\"info\"}}", "log.lvl: unknown key (known: level, format)");
    apply_err("{\"tls\":{\"cert\":\"c\"}}", "tls.cert: unknown key");
}

static void test_batching(void **s)
{
    (void)s;
    config c;
    defaults_ok(&c);
    assert_int_equal(c.batching.max_batch_candidates, CONFIG_BATCH_MAX_CANDIDATES);
    assert_int_equal(c.batching.max_batch_users, CONFIG_BATCH_MAX_USERS);
    assert_int_equal(c.batching.max_queue_delay_us, CONFIG_BATCH_MAX_QUEUE_DELAY_US);
    assert_int_equal(c.batching.instances, CONFIG_BATCH_INSTANCES);
    assert_int_equal(c.batching.max_queue_candidates, CONFIG_BATCH_MAX_QUEUE_CANDIDATES);
    assert_int_equal(c.batching.max_queue_requests, CONFIG_BATCH_MAX_QUEUE_REQUESTS);
    config_free(&c);
    apply_ok(&c, "{\"batching\":{\"max_batch_candidates\":2048,\"max_batch_users\":8,"
                 "\"max_queue_delay_us\":250,\"instances\":3,\"max_queue_candidates\":800,"
                 "\"max_queue_requests\":20}}");
    assert_int_equal(c.batching.max_batch_candidates, 2048);
    assert_int_equal(c.batching.max_batch_users, 8);
    assert_int_equal(c.batching.max_queue_delay_us, 250);
    assert_int_equal(c.batching.instances, 3);
    assert_int_equal(c.batching.max_queue_candidates, 800);
    assert_int_equal(c.batching.max_queue_requests, 20);
    json_has(&c, "\"batching\":{\"max_batch_candidates\":2048,\"max_batch_users\":8,"
                 "\"max_queue_delay_us\":250,\"instances\":3,"
                 "\"max_queue_candidates\":800,\"max_queue_requests\":20,"
                 "\"graphs\":16,\"fold\":1,\"user_lane\":1,\"idle_spin_us\":0,\"gpu_spin_us\":10000000,"
                 "\"batch_timeout_ms\":30000}");
    config_free(&c);
    apply_err("{\"batching\":1}", "batching: expected object, got 1");
    apply_err("{\"batching\":{\"max_batch_candidates\":-1}}",
              "batching.max_batch_candidates: expected integer 0..100000000, got -1");
    apply_err("{\"batching\":{\"max_queue_delay_us\":-1}}",
              "batching.max_queue_delay_us: expected integer 0..10000000, got -1");
    apply_err("{\"batching\":{\"instances\":65}}", "batching.instances: expected integer 0..64");
    apply_err("{\"batching\":{\"max_queue_requests\":\"9\"}}",
              "batching.max_queue_requests: expected integer");
    apply_err("{\"batching\":{\"max_delay\":1}}", "batching.max_delay: unknown key (known: ");
}

/* One table: the server's view (config_batching, CONFIG_BATCH_*) and a
 * model's (SERVING_MODEL) read the same keys with the same ranges and
 * messages; only the scope differs. */
static void serving_err(const char *json, unsigned scope, const char *path, const char *want)
{
    json_t *o = json_loads(json, 0, NULL);
    assert_non_null(o);
    ikbo_serving sv;
    serving_unset(&sv);
    bk_err e = {{0}};
    assert_int_equal(serving_apply_object(&sv, o, path, scope, &e), -1);
    json_decref(o);
    if (strcmp(e.msg, want))
        fail_msg("message '%s', wanted '%s'", e.msg, want);
}

static void test_serving_table(void **s)
{
    (void)s;
    /* The server's defaults are the table's. */
    config_batching b;
    config_batching_default(&b);
    assert_int_equal(b.max_queue_candidates, CONFIG_BATCH_MAX_QUEUE_CANDIDATES);
    assert_int_equal(b.instances, CONFIG_BATCH_INSTANCES);
    assert_string_equal(b.mode, "");
    assert_string_equal(b.device, "");
    for (int i = 0; i < serving_n_keys; i++) {
        const serving_key *k = &serving_keys[i];
        assert_ptr_equal(serving_find(k->name, k->scopes), k);
        assert_non_null(k->description);
        assert_true(k->type != SERVING_INT || (k->min <= k->def && k->def <= k->max));
    }
    assert_null(serving_find("max_queue_requests", SERVING_MODEL));
    assert_null(serving_find("mode", SERVING_BATCHING));
    assert_null(serving_find("nope", SERVING_MODEL | SERVING_BATCHING | SERVING_TOP));

    /* Same rule and wording for a model's block and the server's. */
    serving_err("{\"instances\":65}", SERVING_MODEL, "serving",
                "serving.instances: expected integer 0..64, got 65");
    serving_err("{\"instances\":65}", SERVING_BATCHING, "batching",
                "batching.instances: expected integer 0..64, got 65");
    serving_err("{\"device\":\"cuda:01\"}", SERVING_MODEL, "serving",
                "serving.device: expected \"cpu\" or \"cuda:N\", got \"cuda:01\"");
    serving_err("{\"mode\":[]}", SERVING_MODEL, "serving", "serving.mode: expected string, got array");
    serving_err("{\"graphs\":1025}", SERVING_MODEL, "serving",
                "serving.graphs: expected integer 0..1024, got 1025");
    serving_err("[]", SERVING_MODEL, "serving", "serving: expected object, got array");
    serving_err("{\"gpu_spin_us\":-1}", SERVING_MODEL, "serving",
                "serving.gpu_spin_us: expected integer 0..10000000, got -1");
    apply_err("{\"batching\":{\"gpu_spin_us\":\"50\"}}",
              "batching.gpu_spin_us: expected integer 0..10000000, got \"50\"");
    serving_err("{\"max_queue_requests\":1}", SERVING_MODEL, "serving",
                "serving.max_queue_requests: unknown key (known: max_batch_candidates, "
                "max_batch_users, max_queue_delay_us, instances, graphs, fold, user_lane, idle_spin_us, gpu_spin_us, mode, device)");
    apply_err("{\"batching\":{\"mode\":\"ikbo\"}}",
              "batching.mode: unknown key (known: max_batch_candidates, max_batch_users, "
              "max_queue_delay_us, instances, max_queue_candidates, max_queue_requests, graphs, fold, user_lane, idle_spin_us, gpu_spin_us, "
              "batch_timeout_ms)");
    /* batch_timeout_ms: the server's only (a model cannot set it), 0..3600000. */
    serving_err("{\"batch_timeout_ms\":5}", SERVING_MODEL, "serving",
                "serving.batch_timeout_ms: unknown key (known: max_batch_candidates, "
                "max_batch_users, max_queue_delay_us, instances, graphs, fold, user_lane, idle_spin_us, gpu_spin_us, mode, device)");
    apply_err("{\"batching\":{\"batch_timeout_ms\":3600001}}",
              "batching.batch_timeout_ms: expected integer 0..3600000, got 3600001");
    apply_err("{\"batching\":{\"max_queue_candidates\":0}}",
              "batching.max_queue_candidates: expected integer 1..1000000000, got 0");

    /* Text (environment, flags) goes through the same rule. */
    ikbo_serving sv;
    serving_unset(&sv);
    bk_err e = {{0}};
    const serving_key *inst = serving_find("instances", SERVING_BATCHING);
    assert_int_equal(serving_set_text(&sv, inst, "12", "X", &e), 0);
    assert_int_equal(sv.instances, 12);
    assert_int_equal(serving_set_text(&sv, inst, "65", "X", &e), -1);
    assert_string_equal(e.msg, "X: expected integer 0..64, got \"65\"");
    assert_int_equal(serving_set_text(&sv, inst, "1x", "X", &e), -1);
    assert_int_equal(serving_set_text(&sv, inst, "", "X", &e), -1);
    assert_int_equal(sv.instances, 12); /* untouched on error */
    assert_int_equal(serving_set_text(&sv, serving_find("mode", SERVING_TOP), "fa\nst", "M", &e), -1);
    assert_string_equal(e.msg, "M: expected \"ikbo\" or \"broadcast\", got \"fa?st\"");

    /* Merge: what is set in src wins, unset (-1, "") keeps dst. */
    ikbo_serving dst, src;
    config_batching_default(&dst);
    serving_unset(&src);
    src.max_batch_users = 0;
    snprintf(src.device, sizeof src.device, "cuda:3");
    dst.max_batch_candidates = 700;
    serving_merge(&dst, &src);
    assert_int_equal(dst.max_batch_candidates, 700);
    assert_int_equal(dst.max_batch_users, 0);
    assert_int_equal(dst.max_queue_requests, CONFIG_BATCH_MAX_QUEUE_REQUESTS);
    assert_string_equal(dst.device, "cuda:3");
    assert_string_equal(dst.mode, "");

    /* Rendering: a model's keys in table order, unset as -1 / "". */
    json_t *o = serving_to_json(&src, SERVING_MODEL);
    char *txt = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    assert_string_equal(txt, "{\"max_batch_candidates\":-1,\"max_batch_users\":0,"
                             "\"max_queue_delay_us\":-1,\"instances\":-1,\"graphs\":-1,\"fold\":-1,\"user_lane\":-1,\"idle_spin_us\":-1,\"gpu_spin_us\":-1,"
                             "\"mode\":\"\","
                             "\"device\":\"cuda:3\"}");
    free(txt);
    json_decref(o);
}

static void test_repository(void **s)
{
    (void)s;
    config c;
    defaults_ok(&c);
    assert_int_equal(c.repository_poll_ms, 2000);
    assert_int_equal(c.repository_settle_ms, 1000);
    assert_int_equal(c.version_policy.latest, 1);
    assert_int_equal(c.n_model_policy, 0);
    assert_int_equal(c.admin_http, CONFIG_ADMIN_LOCAL);
    config_free(&c);
    apply_ok(&c, "{\"repository_poll_ms\":0,\"repository_settle_ms\":50,"
                 "\"version_policy\":{\"latest\":3},\"admin_http\":\"any\","
                 "\"model_policy\":{\"demo\":{\"versions\":[2,1]},\"b\":{\"latest\":2}}}");
    assert_int_equal(c.repository_poll_ms, 0);
    assert_int_equal(c.repository_settle_ms, 50);
    assert_int_equal(c.version_policy.latest, 3);
    assert_int_equal(c.admin_http, CONFIG_ADMIN_ANY);
    assert_int_equal(c.n_model_policy, 2);
    assert_string_equal(c.model_policy[0].name, "demo");
    assert_int_equal(c.model_policy[0].policy.latest, 0);
    assert_int_equal(c.model_policy[0].policy.n_versions, 2);
    assert_int_equal(c.model_policy[0].policy.versions[0], 2);
    assert_int_equal(c.model_policy[0].policy.versions[1], 1);
    assert_string_equal(c.model_policy[1].name, "b");
    assert_int_equal(c.model_policy[1].policy.latest, 2);
    json_has(&c, "\"repository_poll_ms\":0,\"repository_settle_ms\":50,"
                 "\"version_policy\":{\"latest\":3},\"model_policy\":{\"demo\":"
                 "{\"versions\":[2,1]},\"b\":{\"latest\":2}},\"admin_http\":\"any\"");
    config_free(&c);
    apply_err("{\"repository_poll_ms\":-1}", "repository_poll_ms: expected integer 0..86400000");
    apply_err("{\"repository_settle_ms\":\"1s\"}", "repository_settle_ms: expected integer");
    apply_err("{\"version_policy\":{}}", "version_policy: expected exactly one of");
    apply_err("{\"version_policy\":{\"latest\":1,\"versions\":[1]}}",
              "version_policy: expected exactly one of");
    apply_err("{\"version_policy\":{\"latest\":0}}", "version_policy.latest: expected integer 1..64");
    apply_err("{\"version_policy\":{\"newest\":1}}",
              "version_policy.newest: unknown key (known: latest, versions)");
    apply_err("{\"version_policy\":{\"versions\":[]}}",
              "version_policy.versions: expected an array of 1..64 version numbers");
    apply_err("{\"version_policy\":{\"versions\":[1,0]}}", "version_policy.versions[1]: expected integer");
    apply_err("{\"version_policy\":{\"versions\":[3,3]}}",
              "version_policy.versions[1]: duplicate version 3");
    apply_err("{\"model_policy\":{\"demo\":{\"latest\":\"2\"}}}",
              "model_policy.demo.latest: expected integer");
    apply_err("{\"model_policy\":{\"a/b\":{\"latest\":1}}}", "model_policy.a/b: expected a model name");
    apply_err("{\"model_policy\":[]}", "model_policy: expected object");
    apply_err("{\"admin_http\":\"remote\"}", "admin_http: expected \"local\", \"any\" or \"off\"");
}

static void test_file_errors(void **s)
{
    (void)s;
    config c;
    ikbo_err err;
    assert_int_equal(config_defaults(&c, &err), 0);
    assert_int_equal(config_apply_file(&c, "/nonexistent/ikbo.json", &err), -1);
    assert_non_null(strstr(err.msg, "/nonexistent/ikbo.json: No such file"));
    char *p = tmpfile_with("{\"threads\": \"x\"}");
    assert_int_equal(config_apply_file(&c, p, &err), -1);
    char want[300];
    snprintf(want, sizeof want, "%s: threads: expected integer", p);
    assert_non_null(strstr(err.msg, want));
    unlink(p);
    free(p);
    config_free(&c);
}

static void test_env(void **s)
{
    (void)s;
    config c;
    ikbo_err err;
    assert_int_equal(config_defaults(&c, &err), 0);
    const char *env[] = {"PATH=/bin",
                         "IKBO_GRPC_LISTEN=0.0.0.0:1",
                         "IKBO_HTTP_LISTEN=0.0.0.0:2",
                         "IKBO_MODEL_REPOSITORY=/m",
                         "IKBO_DEVICE=cuda:0",
                         "IKBO_MODE=broadcast",
                         "IKBO_LOG_LEVEL=warn",
                         "IKBO_MODEX=ikbo",
                         NULL};
    assert_int_equal(config_apply_env(&c, env, &err), 0);
    assert_string_equal(c.grpc_listen, "0.0.0.0:1");
    assert_string_equal(c.http_listen, "0.0.0.0:2");
    assert_string_equal(c.model_repository, "/m");
    assert_string_equal(c.device, "cuda:0");
    assert_int_equal(c.mode, IKBO_MODE_BROADCAST);
    assert_int_equal(c.log_level, CONFIG_LOG_WARN);
    const char *bad[] = {"IKBO_MODE=fast", NULL};
    assert_int_equal(config_apply_env(&c, bad, &err), -1);
    assert_string_equal(err.msg, "IKBO_MODE: expected \"ikbo\" or \"broadcast\", got \"fast\"");
    const char *bad2[] = {"IKBO_DEVICE=tpu", NULL};
    assert_int_equal(config_apply_env(&c, bad2, &err), -1);
    assert_non_null(strstr(err.msg, "IKBO_DEVICE: expected"));
    assert_int_equal(config_apply_env(&c, NULL, &err), 0);
    config_free(&c);
}

static void test_precedence(void **s)
{
    (void)s;
    char *p = tmpfile_with("{\"grpc_listen\":\"file:1\",\"http_listen\":\"file:2\",\"device\":\"cuda:3\","
                           "\"mode\":\"broadcast\",\"threads\":4,\"log\":{\"level\":\"error\",\"format\":\"json\"}}");
    const char *env[] = {"IKBO_HTTP_LISTEN=env:2", "IKBO_DEVICE=cuda:5", "IKBO_LOG_LEVEL=debug", NULL};
    char *argv[] = {"ikbo-serve", "--config", p, "--device", "cpu", "--threads=6", "--log-level", "warn",
                    "--threads", "7", NULL};
    config c;
    ikbo_err err = {{0}};
    enum config_action act;
    if (config_resolve(&c, 10, argv, env, &act, &err))
        fail_msg("%s", err.msg);
    assert_int_equal(act, CONFIG_RUN);
    assert_string_equal(c.grpc_listen, "file:1");  /* file over default */
    assert_string_equal(c.http_listen, "env:2");   /* env over file */
    assert_string_equal(c.device, "cpu");          /* flag over env over file */
    assert_int_equal(c.mode, IKBO_MODE_BROADCAST); /* file */
    assert_int_equal(c.threads, 7);                /* last flag wins */
    assert_int_equal(c.log_level, CONFIG_LOG_WARN);
    assert_int_equal(c.log_format, CONFIG_LOG_JSON);
    assert_string_equal(c.model_repository, "models"); /* default */
    assert_string_equal(c.config_file, p);
    config_free(&c);

    /* every flag */
    char *argv2[] = {"ikbo-serve", "--grpc", "a:1", "--http=b:2", "--models", "/r", "--device=cuda:0",
                     "--mode", "broadcast", "--log-format", "json", NULL};
    assert_int_equal(config_resolve(&c, 11, argv2, NULL, &act, &err), 0);
    assert_string_equal(c.grpc_listen, "a:1");
    assert_string_equal(c.http_listen, "b:2");
    assert_string_equal(c.model_repository, "/r");
    assert_string_equal(c.device, "cuda:0");
    assert_int_equal(c.mode, IKBO_MODE_BROADCAST);
    assert_int_equal(c.log_format, CONFIG_LOG_JSON);
    assert_null(c.config_file);
    config_free(&c);
    unlink(p);
    free(p);
}

static void resolve_err(int argc, char **argv, const char *const *env, const char *substr)
{
    config c;
    ikbo_err err = {{0}};
    enum config_action act;
    if (config_resolve(&c, argc, argv, env, &act, &err) == 0)
        fail_msg("accepted (wanted '%s')", substr);
    if (!strstr(err.msg, substr))
        fail_msg("message '%s' lacks '%s'", err.msg, substr);
    config_free(&c);
}

static void test_flag_errors(void **s)
{
    (void)s;
    const char *log_loud[] = {"IKBO_LOG_LEVEL=loud", NULL};
    /* argv (NULL-terminated; argc is its length), environment, wanted text */
    struct {
        char *argv[4];
        const char *const *env;
        const char *want;
    } cases[] = {
        {{"x", "--bogus", NULL}, NULL, "unknown flag --bogus (see --help)"},
        {{"x", "--threads", NULL}, NULL, "--threads: missing value N"},
        {{"x", "--threads", "0", NULL}, NULL, "--threads: expected integer 1..1024, got \"0\""},
        {{"x", "--threads=9x", NULL}, NULL, "--threads: expected integer 1..1024, got \"9x\""},
        {{"x", "--mode", "fast", NULL}, NULL,
         "--mode: expected \"ikbo\" or \"broadcast\", got \"fast\""},
        {{"x", "stray", NULL}, NULL, "unexpected argument \"stray\""},
        {{"x", "--config", "/nonexistent.json", NULL}, NULL, "/nonexistent.json: No such file"},
        {{"x", "--help=1", NULL}, NULL, "--help takes no value"},
        {{"x", "--grpc", "nope", NULL}, NULL, "--grpc: expected host:port"},
        {{"x", "--log-level", "loud", NULL}, NULL, "--log-level: expected"},
        {{"x", "--device", "cuda:1234", NULL}, NULL, "--device: expected \"cpu\" or \"cuda:N\""},
        {{"x", NULL}, log_loud, "IKBO_LOG_LEVEL: expected"},
        {{"x", "--models", "", NULL}, NULL, "--models: expected a directory"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int argc = 0;
        while (cases[i].argv[argc])
            argc++;
        resolve_err(argc, cases[i].argv, cases[i].env, cases[i].want);
    }
}

/* config_resolve accepts argv and asks for the action want. */
static void resolve_action(int argc, char **argv, enum config_action want)
{
    config c;
    ikbo_err err;
    enum config_action act;
    assert_int_equal(config_resolve(&c, argc, argv, NULL, &act, &err), 0);
    assert_int_equal(act, want);
    config_free(&c);
}

static void test_help_version(void **s)
{
    (void)s;
    char *a1[] = {"ikbo-serve", "--threads", "3", "--help", NULL};
    resolve_action(4, a1, CONFIG_HELP);
    char *a2[] = {"ikbo-serve", "-h", NULL};
    resolve_action(2, a2, CONFIG_HELP);
    char *a3[] = {"ikbo-serve", "--version", NULL};
    resolve_action(2, a3, CONFIG_VERSION);

    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    config_write_help(f, "/usr/bin/ikbo-serve");
    fclose(f);
    assert_non_null(strstr(buf, "usage: ikbo-serve [flags]"));
    const char *flags[] = {"--config FILE", "--grpc ADDR", "--http ADDR", "--models DIR",
                           "--device DEV", "--mode MODE", "--threads N", "--log-level L",
                           "--log-format F", "--help", "--version"};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) {
        const char *at = strstr(buf, flags[i]);
        if (!at)
            fail_msg("help lacks %s:\n%s", flags[i], buf);
        /* one line each */
        const char *nl = strchr(at, '\n');
        assert_non_null(nl);
        assert_true(strstr(nl + 1, flags[i]) == NULL || i >= 9);
    }
    free(buf);
    assert_string_equal(config_log_level_name(CONFIG_LOG_WARN), "warn");
    assert_string_equal(config_log_format_name(CONFIG_LOG_JSON), "json");
    assert_string_equal(ikbo_mode_name(IKBO_MODE_BROADCAST), "broadcast");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_good_config),
        cmocka_unit_test(test_shipped_config),
        cmocka_unit_test(test_parse_device),
        cmocka_unit_test(test_bad_values),
        cmocka_unit_test(test_unknown_keys),
        cmocka_unit_test(test_batching),
        cmocka_unit_test(test_serving_table),
        cmocka_unit_test(test_repository),
        cmocka_unit_test(test_file_errors),
        cmocka_unit_test(test_env),
        cmocka_unit_test(test_precedence),
        cmocka_unit_test(test_flag_errors),
        cmocka_unit_test(test_help_version),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
