/* config.c - resolves the daemon's configuration: defaults < config file <
 * environment < flags (see config.h). Relative paths (model_repository, TLS
 * files) are kept as given: relative to the daemon's working directory. */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#define DEFAULT_GRPC_LISTEN "127.0.0.1:50051"
#define DEFAULT_HTTP_LISTEN "127.0.0.1:8080"
#define DEFAULT_MODEL_REPOSITORY "models"
#define DEFAULT_DEVICE "cpu"
#define DEFAULT_THREADS 2
#define MAX_THREADS 1024
#define DEFAULT_DRAIN_TIMEOUT_MS 10000
#define MAX_DRAIN_TIMEOUT_MS 3600000
#define MAX_MESSAGE_BYTES_CAP (1u << 30)
#define DEFAULT_POLL_MS 2000
#define MAX_POLL_MS 86400000
#define DEFAULT_SETTLE_MS 1000
#define MAX_SETTLE_MS 3600000

/* One line: a key or value from the file may hold control bytes. */
#define fail serving_fail

static char *xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

static int set_str(char **dst, const char *s, ikbo_err *err)
{
    char *d = s ? xstrdup(s) : NULL;
    if (s && !d)
        return fail(err, "out of memory");
    free(*dst);
    *dst = d;
    return 0;
}

/* A value quoted for an error message, shortened. */
static const char *q(const char *s, char *buf, size_t n)
{
    snprintf(buf, n, "\"%.60s%s\"", s, strlen(s) > 60 ? "..." : "");
    return buf;
}

/* ---- value checks shared by file, env and flags ---- */

/* host:port (host may be [v6]); port 0..65535 (0 = any free port). gRPC also
 * takes unix:PATH. */
static int set_listen(char **dst, const char *v, int allow_unix, const char *where, ikbo_err *err)
{
    char b[80];
    if (allow_unix && !strncmp(v, "unix:", 5) && v[5])
        return set_str(dst, v, err);
    const char *colon = strrchr(v, ':');
    int ok = colon && colon != v && colon[1];
    if (ok && v[0] == '[')
        ok = colon[-1] == ']' && colon - v > 2;
    long port = -1;
    if (ok) {
        for (const char *c = colon + 1; *c; c++)
            if (!isdigit((unsigned char)*c))
                ok = 0;
        if (ok && strlen(colon + 1) <= 5)
            port = strtol(colon + 1, NULL, 10);
        ok = ok && port >= 0 && port <= 65535;
    }
    if (!ok)
        return fail(err, "%s: expected host:port%s, got %s", where,
                    allow_unix ? " or unix:PATH" : "", q(v, b, sizeof b));
    return set_str(dst, v, err);
}

/* "device" and "mode", from the file (jv) or the environment and flags
 * (text): the serving table's rule and wording (engine/serving.h). */
static int set_serving(config *c, const char *key, const json_t *jv, const char *text,
                       const char *where, ikbo_err *err)
{
    const serving_key *k = serving_find(key, SERVING_TOP);
    ikbo_serving sv;
    serving_unset(&sv);
    if (jv ? serving_set_json(&sv, k, jv, where, err) : serving_set_text(&sv, k, text, where, err))
        return -1;
    if (k->type == SERVING_DEVICE)
        return set_str(&c->device, sv.device, err);
    ikbo_mode_parse(sv.mode, &c->mode);
    return 0;
}

static int set_device(config *c, const char *v, const char *where, ikbo_err *err)
{
    return set_serving(c, "device", NULL, v, where, err);
}

static int set_mode(config *c, const char *v, const char *where, ikbo_err *err)
{
    return set_serving(c, "mode", NULL, v, where, err);
}

static const char *const LEVELS[] = {"debug", "info", "warn", "error"};
static const char *const FORMATS[] = {"plain", "json"};

static int set_log_level(config *c, const char *v, const char *where, ikbo_err *err)
{
    char b[80];
    for (int i = 0; i < 4; i++)
        if (!strcmp(v, LEVELS[i])) {
            c->log_level = (enum config_log_level)i;
            return 0;
        }
    return fail(err, "%s: expected \"debug\", \"info\", \"warn\" or \"error\", got %s", where,
                q(v, b, sizeof b));
}

static int set_log_format(config *c, const char *v, const char *where, ikbo_err *err)
{
    char b[80];
    for (int i = 0; i < 2; i++)
        if (!strcmp(v, FORMATS[i])) {
            c->log_format = (enum config_log_format)i;
            return 0;
        }
    return fail(err, "%s: expected \"plain\" or \"json\", got %s", where, q(v, b, sizeof b));
}

static int set_repo(config *c, const char *v, const char *where, ikbo_err *err)
{
    if (!v[0])
        return fail(err, "%s: expected a directory, got \"\"", where);
    return set_str(&c->model_repository, v, err);
}

/* Decimal integer in [lo, hi] from a flag value. */
static int parse_int(const char *v, long lo, long hi, long *out)
{
    if (!v[0] || isspace((unsigned char)v[0]))
        return -1;
    errno = 0;
    char *end;
    long x = strtol(v, &end, 10);
    if (errno || *end || x < lo || x > hi)
        return -1;
    *out = x;
    return 0;
}

/* ---- defaults ---- */

void config_batching_default(config_batching *b) { serving_defaults(b); }

int config_defaults(config *c, ikbo_err *err)
{
    memset(c, 0, sizeof *c);
    c->grpc_listen = xstrdup(DEFAULT_GRPC_LISTEN);
    c->http_listen = xstrdup(DEFAULT_HTTP_LISTEN);
    c->model_repository = xstrdup(DEFAULT_MODEL_REPOSITORY);
    c->device = xstrdup(DEFAULT_DEVICE);
    if (!c->grpc_listen || !c->http_listen || !c->model_repository || !c->device) {
        config_free(c);
        return fail(err, "out of memory");
    }
    c->mode = IKBO_MODE_IKBO;
    c->threads = DEFAULT_THREADS;
    rq_limits_default(&c->limits);
    c->max_metadata_bytes = CONFIG_DEFAULT_MAX_METADATA_BYTES;
    c->log_level = CONFIG_LOG_INFO;
    c->log_format = CONFIG_LOG_PLAIN;
    c->drain_timeout_ms = DEFAULT_DRAIN_TIMEOUT_MS;
    config_batching_default(&c->batching);
    c->repository_poll_ms = DEFAULT_POLL_MS;
    c->repository_settle_ms = DEFAULT_SETTLE_MS;
    c->version_policy.latest = 1;
    c->admin_http = CONFIG_ADMIN_LOCAL;
    return 0;
}

static void free_models(config *c)
{
    for (int i = 0; i < c->n_models; i++)
        free(c->models[i]);
    free(c->models);
    c->models = NULL;
    c->n_models = 0;
}

void config_free(config *c)
{
    if (!c)
        return;
    free(c->grpc_listen);
    free(c->http_listen);
    free(c->model_repository);
    free_models(c);
    free(c->device);
    free(c->tls_cert_file);
    free(c->tls_key_file);
    free(c->tls_client_ca_file);
    free(c->config_file);
    for (int i = 0; i < c->n_model_policy; i++)
        free(c->model_policy[i].name);
    free(c->model_policy);
    memset(c, 0, sizeof *c);
}

/* ---- config file ---- */

static int want_string(const json_t *v, const char *path, ikbo_err *err)
{
    char b[100];
    if (!json_is_string(v))
        return fail(err, "%s: expected string, %s", path, serving_json_got(v, b, sizeof b));
    if (strlen(json_string_value(v)) != json_string_length(v))
        return fail(err, "%s: string contains NUL", path);
    return 0;
}

static int want_int(const json_t *v, const char *path, long long lo, long long hi, long long *out,
                    ikbo_err *err)
{
    char b[100];
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return fail(err, "%s: expected integer %lld..%lld, %s", path, lo, hi,
                    serving_json_got(v, b, sizeof b));
    *out = json_integer_value(v);
    return 0;
}

static int want_object(const json_t *v, const char *path, ikbo_err *err)
{
    char b[100];
    if (!json_is_object(v))
        return fail(err, "%s: expected object, %s", path, serving_json_got(v, b, sizeof b));
    return 0;
}

static int apply_limits(config *c, const json_t *o, ikbo_err *err)
{
    if (want_object(o, "limits", err))
        return -1;
    struct {
        const char *k;
        uint32_t *dst;
        long long hi;
    } keys[] = {
        {"max_users", &c->limits.max_users, 1000000},
        {"max_candidates", &c->limits.max_candidates, 100000000},
        {"max_ids_per_bag", &c->limits.max_ids_per_bag, 100000000},
        {"max_history", &c->limits.max_history, 100000000},
        {"max_sparse_features", &c->limits.max_sparse_features, 65536},
        {"max_message_bytes", &c->limits.max_message_bytes, MAX_MESSAGE_BYTES_CAP},
        {"max_metadata_bytes", &c->max_metadata_bytes, CONFIG_MAX_METADATA_BYTES_CAP},
    };
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)o, key, v)
    {
        char path[128];
        snprintf(path, sizeof path, "limits.%.80s", key);
        size_t i = 0;
        while (i < sizeof keys / sizeof keys[0] && strcmp(keys[i].k, key))
            i++;
        if (i == sizeof keys / sizeof keys[0])
            return fail(err, "%s: unknown key (known: max_users, max_candidates, "
                             "max_ids_per_bag, max_history, max_sparse_features, "
                             "max_message_bytes, max_metadata_bytes)",
                        path);
        long long x;
        if (want_int(v, path, 1, keys[i].hi, &x, err))
            return -1;
        *keys[i].dst = (uint32_t)x;
    }
    return 0;
}

static int apply_batching(config *c, const json_t *o, ikbo_err *err)
{
    return serving_apply_object(&c->batching, o, "batching", SERVING_BATCHING, err);
}

static int apply_log(config *c, const json_t *o, ikbo_err *err)
{
    if (want_object(o, "log", err))
        return -1;
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)o, key, v)
    {
        char path[128];
        snprintf(path, sizeof path, "log.%.80s", key);
        if (!strcmp(key, "level")) {
            if (want_string(v, path, err) || set_log_level(c, json_string_value(v), path, err))
                return -1;
        } else if (!strcmp(key, "format")) {
            if (want_string(v, path, err) || set_log_format(c, json_string_value(v), path, err))
                return -1;
        } else {
            return fail(err, "%s: unknown key (known: level, format)", path);
        }
    }
    return 0;
}

static int apply_tls(config *c, const json_t *o, ikbo_err *err)
{
    free(c->tls_cert_file);
    free(c->tls_key_file);
    free(c->tls_client_ca_file);
    c->tls_cert_file = c->tls_key_file = c->tls_client_ca_file = NULL;
    if (json_is_null(o))
        return 0;
    if (want_object(o, "tls", err))
        return -1;
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)o, key, v)
    {
        char path[128];
        snprintf(path, sizeof path, "tls.%.80s", key);
        char **dst = !strcmp(key, "cert_file")        ? &c->tls_cert_file
                     : !strcmp(key, "key_file")       ? &c->tls_key_file
                     : !strcmp(key, "client_ca_file") ? &c->tls_client_ca_file
                                                      : NULL;
        if (!dst)
            return fail(err, "%s: unknown key (known: cert_file, key_file, client_ca_file)", path);
        if (json_is_null(v) && dst == &c->tls_client_ca_file)
            continue;
        if (want_string(v, path, err))
            return -1;
        if (!json_string_value(v)[0])
            return fail(err, "%s: expected a file path, got \"\"", path);
        if (set_str(dst, json_string_value(v), err))
            return -1;
    }
    if (!c->tls_cert_file || !c->tls_key_file)
        return fail(err, "tls: cert_file and key_file are both required (omit tls for plaintext)");
    return 0;
}

static int apply_models(config *c, const json_t *v, ikbo_err *err)
{
    char b[100];
    free_models(c);
    if (json_is_null(v))
        return 0;
    if (!json_is_array(v) || json_array_size(v) == 0)
        return fail(err, "models: expected a non-empty array of model names (omit for all), %s",
                    json_is_array(v) ? "got []" : serving_json_got(v, b, sizeof b));
    size_t n = json_array_size(v);
    c->models = calloc(n, sizeof *c->models);
    if (!c->models)
        return fail(err, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(v, i);
        char path[64];
        snprintf(path, sizeof path, "models[%zu]", i);
        if (want_string(e, path, err))
            return -1;
        const char *s = json_string_value(e);
        if (!s[0] || strchr(s, '/') || !strcmp(s, ".") || !strcmp(s, ".."))
            return fail(err, "%s: expected a model name (a directory in the repository), got %s",
                        path, q(s, b, sizeof b));
        for (size_t j = 0; j < i; j++)
            if (!strcmp(c->models[j], s))
                return fail(err, "%s: duplicate model %s", path, q(s, b, sizeof b));
        c->models[i] = xstrdup(s);
        if (!c->models[i])
            return fail(err, "out of memory");
        c->n_models = (int)i + 1;
    }
    return 0;
}

/* {"latest": N} or {"versions": [N, ...]}; exactly one of the two. */
static int parse_policy(const json_t *o, const char *path, config_version_policy *p,
                        ikbo_err *err)
{
    char b[100], kp[200];
    if (want_object(o, path, err))
        return -1;
    memset(p, 0, sizeof *p);
    if (json_object_size(o) != 1)
        return fail(err, "%s: expected exactly one of \"latest\" or \"versions\"", path);
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)o, key, v)
    {
        snprintf(kp, sizeof kp, "%s.%.80s", path, key);
        if (!strcmp(key, "latest")) {
            long long x;
            if (want_int(v, kp, 1, CONFIG_MAX_POLICY_VERSIONS, &x, err))
                return -1;
            p->latest = (int)x;
        } else if (!strcmp(key, "versions")) {
            size_t n = json_is_array(v) ? json_array_size(v) : 0;
            if (n == 0 || n > CONFIG_MAX_POLICY_VERSIONS)
                return fail(err, "%s: expected an array of 1..%d version numbers, %s", kp,
                            CONFIG_MAX_POLICY_VERSIONS, serving_json_got(v, b, sizeof b));
            for (size_t i = 0; i < n; i++) {
                char ip[240];
                long long x;
                snprintf(ip, sizeof ip, "%s[%zu]", kp, i);
                if (want_int(v ? json_array_get(v, i) : NULL, ip, 1, 999999999999999999LL, &x, err))
                    return -1;
                for (int j = 0; j < p->n_versions; j++)
                    if (p->versions[j] == x)
                        return fail(err, "%s: duplicate version %lld", ip, x);
                p->versions[p->n_versions++] = x;
            }
        } else {
            return fail(err, "%s: unknown key (known: latest, versions)", kp);
        }
    }
    return 0;
}

static int apply_model_policy(config *c, const json_t *o, ikbo_err *err)
{
    char b[100];
    if (want_object(o, "model_policy", err))
        return -1;
    for (int i = 0; i < c->n_model_policy; i++)
        free(c->model_policy[i].name);
    free(c->model_policy);
    c->model_policy = NULL;
    c->n_model_policy = 0;
    size_t n = json_object_size(o);
    if (!n)
        return 0;
    c->model_policy = calloc(n, sizeof *c->model_policy);
    if (!c->model_policy)
        return fail(err, "out of memory");
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)o, key, v)
    {
        char path[128];
        snprintf(path, sizeof path, "model_policy.%.80s", key);
        if (!key[0] || strchr(key, '/') || !strcmp(key, ".") || !strcmp(key, ".."))
            return fail(err, "%s: expected a model name (a directory in the repository), got %s",
                        path, q(key, b, sizeof b));
        config_model_policy *mp = &c->model_policy[c->n_model_policy];
        if (parse_policy(v, path, &mp->policy, err))
            return -1;
        if (!(mp->name = xstrdup(key)))
            return fail(err, "out of memory");
        c->n_model_policy++;
    }
    return 0;
}

static int set_admin_http(config *c, const char *v, const char *where, ikbo_err *err)
{
    char b[80];
    if (!strcmp(v, "local"))
        c->admin_http = CONFIG_ADMIN_LOCAL;
    else if (!strcmp(v, "any"))
        c->admin_http = CONFIG_ADMIN_ANY;
    else if (!strcmp(v, "off"))
        c->admin_http = CONFIG_ADMIN_OFF;
    else
        return fail(err, "%s: expected \"local\", \"any\" or \"off\", got %s", where,
                    q(v, b, sizeof b));
    return 0;
}

const char *config_admin_http_name(enum config_admin_http a)
{
    return a == CONFIG_ADMIN_ANY ? "any" : a == CONFIG_ADMIN_OFF ? "off" : "local";
}

static const char *const TOP_KEYS =
    "grpc_listen, http_listen, model_repository, models, device, mode, threads, limits, log, "
    "drain_timeout_ms, tls, batching, repository_poll_ms, repository_settle_ms, version_policy, "
    "model_policy, admin_http";

static int apply_top(config *c, const char *key, const json_t *v, ikbo_err *err)
{
    long long x;
    if (!strcmp(key, "grpc_listen"))
        return want_string(v, key, err) || set_listen(&c->grpc_listen, json_string_value(v), 1, key, err) ? -1 : 0;
    if (!strcmp(key, "http_listen"))
        return want_string(v, key, err) || set_listen(&c->http_listen, json_string_value(v), 0, key, err) ? -1 : 0;
    if (!strcmp(key, "model_repository"))
        return want_string(v, key, err) || set_repo(c, json_string_value(v), key, err) ? -1 : 0;
    if (!strcmp(key, "models"))
        return apply_models(c, v, err);
    if (!strcmp(key, "device") || !strcmp(key, "mode"))
        return set_serving(c, key, v, NULL, key, err);
    if (!strcmp(key, "threads")) {
        if (want_int(v, key, 1, MAX_THREADS, &x, err))
            return -1;
        c->threads = (int)x;
        return 0;
    }
    if (!strcmp(key, "drain_timeout_ms")) {
        if (want_int(v, key, 0, MAX_DRAIN_TIMEOUT_MS, &x, err))
            return -1;
        c->drain_timeout_ms = (int)x;
        return 0;
    }
    if (!strcmp(key, "limits"))
        return apply_limits(c, v, err);
    if (!strcmp(key, "log"))
        return apply_log(c, v, err);
    if (!strcmp(key, "batching"))
        return apply_batching(c, v, err);
    if (!strcmp(key, "tls"))
        return apply_tls(c, v, err);
    if (!strcmp(key, "repository_poll_ms")) {
        if (want_int(v, key, 0, MAX_POLL_MS, &x, err))
            return -1;
        c->repository_poll_ms = (int)x;
        return 0;
    }
    if (!strcmp(key, "repository_settle_ms")) {
        if (want_int(v, key, 0, MAX_SETTLE_MS, &x, err))
            return -1;
        c->repository_settle_ms = (int)x;
        return 0;
    }
    if (!strcmp(key, "version_policy"))
        return parse_policy(v, key, &c->version_policy, err);
    if (!strcmp(key, "model_policy"))
        return apply_model_policy(c, v, err);
    if (!strcmp(key, "admin_http"))
        return want_string(v, key, err) || set_admin_http(c, json_string_value(v), key, err) ? -1 : 0;
    return fail(err, "%.80s: unknown key (known: %s)", key, TOP_KEYS);
}

int config_apply_json(config *c, const char *text, size_t len, ikbo_err *err)
{
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return fail(err, "invalid JSON at line %d column %d: %s", je.line, je.column, je.text);
    int rc = 0;
    char b[100];
    if (!json_is_object(root)) {
        rc = fail(err, "expected a JSON object at the top level, %s",
                  serving_json_got(root, b, sizeof b));
    } else {
        const char *key;
        json_t *v;
        json_object_foreach(root, key, v)
        {
            if (apply_top(c, key, v, err)) {
                rc = -1;
                break;
            }
        }
    }
    json_decref(root);
    return rc;
}

int config_apply_file(config *c, const char *path, ikbo_err *err)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return fail(err, "%s: %s", path, strerror(errno));
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n == cap) {
            if (cap >= (16u << 20)) {
                fclose(f);
                free(buf);
                return fail(err, "%s: larger than 16 MiB", path);
            }
            cap = cap ? 2 * cap : 4096;
            char *nb = realloc(buf, cap);
            if (!nb) {
                fclose(f);
                free(buf);
                return fail(err, "out of memory");
            }
            buf = nb;
        }
        size_t k = fread(buf + n, 1, cap - n, f);
        n += k;
        if (k == 0)
            break;
    }
    int rerr = ferror(f);
    fclose(f);
    if (rerr) {
        free(buf);
        return fail(err, "%s: read error", path);
    }
    ikbo_err e = {{0}};
    int rc = config_apply_json(c, buf, n, &e);
    free(buf);
    if (rc)
        return fail(err, "%s: %s", path, e.msg);
    return set_str(&c->config_file, path, err);
}

/* ---- environment ---- */

static const char *env_get(const char *const *envp, const char *name)
{
    size_t n = strlen(name);
    const char *found = NULL;
    for (; envp && *envp; envp++)
        if (!strncmp(*envp, name, n) && (*envp)[n] == '=')
            found = *envp + n + 1; /* last one wins, like setenv */
    return found;
}

int config_apply_env(config *c, const char *const *envp, ikbo_err *err)
{
    const char *v;
    if ((v = env_get(envp, "IKBO_GRPC_LISTEN")) &&
        set_listen(&c->grpc_listen, v, 1, "IKBO_GRPC_LISTEN", err))
        return -1;
    if ((v = env_get(envp, "IKBO_HTTP_LISTEN")) &&
        set_listen(&c->http_listen, v, 0, "IKBO_HTTP_LISTEN", err))
        return -1;
    if ((v = env_get(envp, "IKBO_MODEL_REPOSITORY")) &&
        set_repo(c, v, "IKBO_MODEL_REPOSITORY", err))
        return -1;
    if ((v = env_get(envp, "IKBO_DEVICE")) && set_device(c, v, "IKBO_DEVICE", err))
        return -1;
    if ((v = env_get(envp, "IKBO_MODE")) && set_mode(c, v, "IKBO_MODE", err))
        return -1;
    if ((v = env_get(envp, "IKBO_LOG_LEVEL")) && set_log_level(c, v, "IKBO_LOG_LEVEL", err))
        return -1;
    return 0;
}

/* ---- flags ---- */

enum flag_id {
    F_CONFIG, F_GRPC, F_HTTP, F_MODELS, F_DEVICE, F_MODE, F_THREADS, F_LOG_LEVEL, F_LOG_FORMAT,
    F_HELP, F_VERSION, F_COUNT
};

static const struct flag_def {
    const char *name, *arg, *help;
} FLAGS[F_COUNT] = {
    [F_CONFIG] = {"--config", "FILE", "JSON config file (keys: see server/config.h; e.g. config/server.json)"},
    [F_GRPC] = {"--grpc", "ADDR", "gRPC listen host:port or unix:PATH (default " DEFAULT_GRPC_LISTEN "; env IKBO_GRPC_LISTEN)"},
    [F_HTTP] = {"--http", "ADDR", "HTTP listen host:port for /metrics, /healthz, JSON rank (default " DEFAULT_HTTP_LISTEN "; env IKBO_HTTP_LISTEN)"},
    [F_MODELS] = {"--models", "DIR", "model repository DIR/<name>/<version>/ (default " DEFAULT_MODEL_REPOSITORY "; env IKBO_MODEL_REPOSITORY)"},
    [F_DEVICE] = {"--device", "DEV", "cpu or cuda:N (default cpu; env IKBO_DEVICE)"},
    [F_MODE] = {"--mode", "MODE", "ikbo or broadcast (default ikbo; env IKBO_MODE)"},
    [F_THREADS] = {"--threads", "N", "gRPC worker threads, 1..1024 (default 2)"},
    [F_LOG_LEVEL] = {"--log-level", "L", "debug, info, warn or error (default info; env IKBO_LOG_LEVEL)"},
    [F_LOG_FORMAT] = {"--log-format", "F", "plain or json (default plain)"},
    [F_HELP] = {"--help", NULL, "print this help and exit"},
    [F_VERSION] = {"--version", NULL, "print the version and exit"},
};

void config_write_help(FILE *f, const char *prog)
{
    const char *p = prog && *prog ? strrchr(prog, '/') : NULL;
    p = p ? p + 1 : (prog && *prog ? prog : "ikbo-serve");
    fprintf(f, "usage: %s [flags]\n", p);
    fprintf(f, "Serves ranking models over gRPC (ikbo.v1.Ranker) and HTTP.\n");
    fprintf(f, "Precedence: defaults < --config file < IKBO_* env < flags.\n");
    for (int i = 0; i < F_COUNT; i++) {
        char left[40];
        snprintf(left, sizeof left, "%s%s%s", FLAGS[i].name, FLAGS[i].arg ? " " : "",
                 FLAGS[i].arg ? FLAGS[i].arg : "");
        fprintf(f, "  %-20s %s\n", left, FLAGS[i].help);
    }
}

static int apply_flag(config *c, int id, const char *v, ikbo_err *err)
{
    const char *w = FLAGS[id].name;
    long x;
    switch (id) {
    case F_GRPC: return set_listen(&c->grpc_listen, v, 1, w, err);
    case F_HTTP: return set_listen(&c->http_listen, v, 0, w, err);
    case F_MODELS: return set_repo(c, v, w, err);
    case F_DEVICE: return set_device(c, v, w, err);
    case F_MODE: return set_mode(c, v, w, err);
    case F_THREADS: {
        char b[80];
        if (parse_int(v, 1, MAX_THREADS, &x))
            return fail(err, "%s: expected integer 1..%d, got %s", w, MAX_THREADS,
                        q(v, b, sizeof b));
        c->threads = (int)x;
        return 0;
    }
    case F_LOG_LEVEL: return set_log_level(c, v, w, err);
    case F_LOG_FORMAT: return set_log_format(c, v, w, err);
    default: return 0;
    }
}

int config_resolve(config *c, int argc, char *const *argv, const char *const *envp,
                   enum config_action *action, ikbo_err *err)
{
    /* Pass 1: parse and check the syntax of every flag, remember values. */
    const char *val[F_COUNT] = {0};
    /* Flags apply in command-line order; a repeated flag: the last wins. */
    int order[256], n_order = 0;
    const char *vals[256];
    int help = 0, version = 0;
    memset(c, 0, sizeof *c);
    *action = CONFIG_RUN;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h"))
            a = "--help";
        const char *eq = strncmp(a, "--", 2) ? NULL : strchr(a, '=');
        size_t nlen = eq ? (size_t)(eq - a) : strlen(a);
        int id = -1;
        for (int k = 0; k < F_COUNT; k++)
            if (strlen(FLAGS[k].name) == nlen && !strncmp(FLAGS[k].name, a, nlen))
                id = k;
        if (id < 0) {
            if (a[0] == '-')
                return fail(err, "unknown flag %.*s (see --help)", (int)(nlen > 60 ? 60 : nlen), a);
            return fail(err, "unexpected argument \"%.60s\" (see --help)", a);
        }
        const char *v = NULL;
        if (FLAGS[id].arg) {
            if (eq) {
                v = eq + 1;
            } else if (i + 1 < argc) {
                v = argv[++i];
            } else {
                return fail(err, "%s: missing value %s", FLAGS[id].name, FLAGS[id].arg);
            }
        } else if (eq) {
            return fail(err, "%s takes no value", FLAGS[id].name);
        }
        if (id == F_HELP)
            help = 1;
        else if (id == F_VERSION)
            version = 1;
        else if (id == F_CONFIG)
            val[F_CONFIG] = v;
        else {
            if (n_order == (int)(sizeof order / sizeof order[0]))
                return fail(err, "too many flags");
            order[n_order] = id;
            vals[n_order++] = v;
        }
    }
    if (config_defaults(c, err))
        return -1;
    if (help || version) {
        *action = help ? CONFIG_HELP : CONFIG_VERSION;
        return 0;
    }
    if (val[F_CONFIG] && config_apply_file(c, val[F_CONFIG], err))
        goto fail;
    if (config_apply_env(c, envp, err))
        goto fail;
    for (int k = 0; k < n_order; k++)
        if (apply_flag(c, order[k], vals[k], err))
            goto fail;
    return 0;
fail:
    config_free(c);
    return -1;
}

/* ---- names and dump ---- */

const char *config_log_level_name(enum config_log_level l)
{
    return (unsigned)l < 4 ? LEVELS[l] : "?";
}

const char *config_log_format_name(enum config_log_format f)
{
    return (unsigned)f < 2 ? FORMATS[f] : "?";
}

static json_t *jstr_or_null(const char *s)
{
    return s ? json_string(s) : json_null();
}

static json_t *policy_json(const config_version_policy *p)
{
    if (p->latest > 0)
        return json_pack("{s:i}", "latest", p->latest);
    json_t *a = json_array();
    for (int i = 0; a && i < p->n_versions; i++)
        json_array_append_new(a, json_integer(p->versions[i]));
    return a ? json_pack("{s:o}", "versions", a) : json_null();
}

char *config_to_json(const config *c)
{
    json_t *models;
    if (c->models) {
        models = json_array();
        for (int i = 0; models && i < c->n_models; i++)
            json_array_append_new(models, json_string(c->models[i]));
    } else {
        models = json_null();
    }
    json_t *tls = c->tls_cert_file
                      ? json_pack("{s:s,s:s,s:o}", "cert_file", c->tls_cert_file, "key_file",
                                  c->tls_key_file ? c->tls_key_file : "", "client_ca_file",
                                  jstr_or_null(c->tls_client_ca_file))
                      : json_null();
    json_t *o = json_pack(
        "{s:o,s:s,s:s,s:s,s:o,s:s,s:s,s:i,s:{s:I,s:I,s:I,s:I,s:I,s:I,s:I},s:{s:s,s:s},s:i,s:o}",
        "config_file", jstr_or_null(c->config_file), "grpc_listen", c->grpc_listen ? c->grpc_listen : "",
        "http_listen", c->http_listen ? c->http_listen : "", "model_repository",
        c->model_repository ? c->model_repository : "", "models", models, "device",
        c->device ? c->device : "", "mode", ikbo_mode_name(c->mode), "threads", c->threads,
        "limits", "max_users", (json_int_t)c->limits.max_users, "max_candidates",
        (json_int_t)c->limits.max_candidates, "max_ids_per_bag",
        (json_int_t)c->limits.max_ids_per_bag, "max_history", (json_int_t)c->limits.max_history,
        "max_sparse_features", (json_int_t)c->limits.max_sparse_features, "max_message_bytes",
        (json_int_t)c->limits.max_message_bytes, "max_metadata_bytes",
        (json_int_t)c->max_metadata_bytes, "log", "level",
        config_log_level_name(c->log_level), "format", config_log_format_name(c->log_format),
        "drain_timeout_ms", c->drain_timeout_ms, "tls", tls);
    if (!o)
        return NULL;
    json_object_set_new(o, "batching", serving_to_json(&c->batching, SERVING_BATCHING));
    json_object_set_new(o, "repository_poll_ms", json_integer(c->repository_poll_ms));
    json_object_set_new(o, "repository_settle_ms", json_integer(c->repository_settle_ms));
    json_object_set_new(o, "version_policy", policy_json(&c->version_policy));
    json_t *mp = json_object();
    for (int i = 0; mp && i < c->n_model_policy; i++)
        json_object_set_new(mp, c->model_policy[i].name, policy_json(&c->model_policy[i].policy));
    json_object_set_new(o, "model_policy", mp ? mp : json_null());
    json_object_set_new(o, "admin_http", json_string(config_admin_http_name(c->admin_http)));
    char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
    return s;
}
