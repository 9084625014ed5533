/* config.h - the daemon's configuration: defaults, config file (JSON), env
 * overrides and command-line flags, resolved into one struct.
 *
 * Precedence (lowest to highest): built-in defaults < config file (--config
 * FILE; no file is read without it) < environment (IKBO_GRPC_LISTEN,
 * IKBO_HTTP_LISTEN, IKBO_MODEL_REPOSITORY, IKBO_DEVICE, IKBO_MODE,
 * IKBO_LOG_LEVEL) < flags.
 *
 * Config file keys (all optional; unknown keys anywhere are errors naming the
 * path, e.g. `limits.max_userz: unknown key`):
 *   grpc_listen       "127.0.0.1:50051"  loopback by default, for safety;
 *                                         "0.0.0.0:50051" to serve the network
 *   http_listen       "127.0.0.1:8080"
 *   model_repository  "models"
 *   models            all models in the repository; or an array of names
 *   device            "cpu" | "cuda:N"    default "cpu"
 *   mode              "ikbo" | "broadcast" default "ikbo"
 *   threads           gRPC worker threads, 1..1024, default 2
 *   limits            {max_users 1024, max_candidates 10000, max_ids_per_bag
 *                      1024, max_history 10000, max_sparse_features 64,
 *                      max_message_bytes 4194304}  (each >= 1; see request.h),
 *                     and max_metadata_bytes 8192 (1..CONFIG_MAX_METADATA_BYTES_CAP:
 *                     a gRPC call's request metadata, grpc_server.h)
 *   log               {level: "debug"|"info"|"warn"|"error" (info),
 *                      format: "plain"|"json" (plain)}
 *   drain_timeout_ms  0..3600000, default 10000
 *   tls               {cert_file, key_file, client_ca_file (optional: mutual
 *                      TLS)}; absent or null = plaintext. cert_file and
 *                      key_file are required when tls is given.
 *   batching          dynamic batcher per model version (server/batcher.h):
 *                     {max_batch_candidates 1024, max_batch_users 64,
 *                      max_queue_delay_us 0, instances 0 (auto: cpu 1, cuda 4),
 *                      max_queue_candidates 32768, max_queue_requests 1024,
 *                      graphs 16, idle_spin_us 0, gpu_spin_us 10000000,
 *                      batch_timeout_ms 30000 (server only)}
 *                     (ranges and meanings: engine/serving.h's key table,
 *                     the same for model.json's "serving"). A model's
 *                     model.json "serving" block (then its config.json)
 *                     overrides max_batch_*, max_queue_delay_us,
 *                     instances, graphs, fold, idle_spin_us and gpu_spin_us for that model,
 *                     where set.
 *   repository_poll_ms   how often the model repository is rescanned for new,
 *                     changed and removed versions; 0..86400000, default
 *                     2000, 0 = never (SIGHUP and the admin endpoints still
 *                     rescan)
 *   repository_settle_ms a polled version directory is loaded once it has
 *                     been at rest this long (no change time in it newer, or
 *                     the same entries seen by the poller for this long;
 *                     registry.h); 0..3600000, default 1000
 *   version_policy    which versions every model serves: {"latest": N}
 *                     (newest N, 1..64; default {"latest": 1}) or
 *                     {"versions": [N, ...]} (exactly these, 1..64 entries)
 *   model_policy      per-model version policy: {"<name>": <policy>, ...}
 *   admin_http        who may POST /v1/models/{name}/load and /unload:
 *                     "local" (loopback peers only; default), "any", "off"
 *
 * Flags: --config FILE, --grpc ADDR, --http ADDR, --models DIR, --device DEV,
 * --mode MODE, --threads N, --log-level L, --log-format F, --help, --version
 * (both "--flag VALUE" and "--flag=VALUE").
 *
 * Ownership: config_* functions fill a caller-owned struct whose strings are
 * malloc'd; config_free releases them. Errors are returned in an ikbo_err,
 * never printed; nothing here exits. Thread-safety: no global state; a
 * resolved config is read-only and may be shared by threads.
 */
#ifndef IKBO_SERVER_CONFIG_H
#define IKBO_SERVER_CONFIG_H

#include <stdio.h>

#include "../engine/ikbo.h"
#include "../engine/serving.h"
#include "request.h"

enum config_log_level {
    CONFIG_LOG_DEBUG = 0,
    CONFIG_LOG_INFO = 1,
    CONFIG_LOG_WARN = 2,
    CONFIG_LOG_ERROR = 3,
};
enum config_log_format { CONFIG_LOG_PLAIN = 0, CONFIG_LOG_JSON = 1 };

/* Dynamic batching (server/batcher.h says what each limit does). The keys,
 * ranges and defaults are engine/serving.h's table, shared with model.json's
 * "serving"; the names here are the server's view of it. */
#define CONFIG_BATCH_MAX_CANDIDATES SERVING_DEF_MAX_BATCH_CANDIDATES /* 0 = auto (below) */
#define CONFIG_BATCH_MAX_USERS SERVING_DEF_MAX_BATCH_USERS           /* 0 = auto */
/* What auto resolves to per device (batcher_resolve): a GPU amortizes its
 * per-batch fixed costs (~30 launches, the uploads, the one wait) over
 * larger batches; on the H200 the bench model's IKBO batch costs 1.0 us per
 * candidate at 1120 candidates and 0.88 at 4480. */
#define CONFIG_BATCH_AUTO_CANDIDATES_CPU 1024
#define CONFIG_BATCH_AUTO_USERS_CPU 64
#define CONFIG_BATCH_AUTO_CANDIDATES_GPU 4096
#define CONFIG_BATCH_AUTO_USERS_GPU 256
/* Instances: on the H200, bench model, packed 1 x 70 at half saturation,
 * 4 instances answer in 0.91 ms mean against 1.18 with 2 (a request waits
 * less for a free one), saturation 1.21M vs 1.20M candidates/s, 16 x 70
 * unchanged (bench/RESULTS.md, 2026-12-02). */
#define CONFIG_BATCH_AUTO_INSTANCES_CPU 1
#define CONFIG_BATCH_AUTO_INSTANCES_GPU 4
#define CONFIG_BATCH_MAX_QUEUE_DELAY_US SERVING_DEF_MAX_QUEUE_DELAY_US
#define CONFIG_BATCH_INSTANCES SERVING_DEF_INSTANCES /* 0 = auto */
#define CONFIG_BATCH_MAX_QUEUE_CANDIDATES SERVING_DEF_MAX_QUEUE_CANDIDATES
#define CONFIG_BATCH_MAX_QUEUE_REQUESTS SERVING_DEF_MAX_QUEUE_REQUESTS
#define CONFIG_BATCH_MAX_INSTANCES SERVING_MAX_INSTANCES

/* limits.max_metadata_bytes: a gRPC call's request metadata, counted as
 * HTTP/2 counts a header list (name + value + 32 per entry). Its cap leaves
 * gRPC core's own, connection-wide limit (GRPCSRV_METADATA_CEILING) room
 * for the headers the daemon does not see (pseudo-headers, grpc-timeout...). */
#define CONFIG_DEFAULT_MAX_METADATA_BYTES 8192u
#define CONFIG_MAX_METADATA_BYTES_CAP (256u << 10)

/* The "batching" block: the serving-settings type itself (its mode and
 * device stay unset; the server's are config.device and config.mode). */
typedef ikbo_serving config_batching;

/* The table's defaults (serving_defaults). */
void config_batching_default(config_batching *b);

/* Version policy: latest > 0 = the newest `latest` versions; else exactly
 * versions[0..n_versions). */
#define CONFIG_MAX_POLICY_VERSIONS 64
typedef struct config_version_policy {
    int latest;
    int n_versions;
    int64_t versions[CONFIG_MAX_POLICY_VERSIONS];
} config_version_policy;

typedef struct config_model_policy {
    char *name;
    config_version_policy policy;
} config_model_policy;

enum config_admin_http { CONFIG_ADMIN_LOCAL = 0, CONFIG_ADMIN_ANY = 1, CONFIG_ADMIN_OFF = 2 };

typedef struct config {
    char *grpc_listen;      /* "host:port" */
    char *http_listen;      /* "host:port" */
    char *model_repository; /* directory */
    char **models;          /* names to serve; NULL = all in the repository */
    int n_models;
    char *device;           /* "cpu" | "cuda:N" */
    enum ikbo_mode mode;
    int threads;
    rq_limits limits;
    uint32_t max_metadata_bytes; /* "limits.max_metadata_bytes" (gRPC only) */
    enum config_log_level log_level;
    enum config_log_format log_format;
    int drain_timeout_ms;
    config_batching batching;
    int repository_poll_ms;   /* 0 = no polling */
    int repository_settle_ms;
    config_version_policy version_policy;
    config_model_policy *model_policy;
    int n_model_policy;
    enum config_admin_http admin_http;
    /* TLS: all NULL = plaintext; cert+key set = TLS; + client_ca = mTLS. */
    char *tls_cert_file;
    char *tls_key_file;
    char *tls_client_ca_file;
    char *config_file;      /* the file read, or NULL */
} config;

/* What the command line asked for. */
enum config_action { CONFIG_RUN = 0, CONFIG_HELP = 1, CONFIG_VERSION = 2 };

/* Fills *c with the built-in defaults. Returns 0, -1 on allocation failure. */
int config_defaults(config *c, ikbo_err *err);

/* Applies a JSON config document / file on top of *c. Errors name the path
 * and what was expected: `threads: expected integer 1..1024, got "two"`;
 * file errors name the file. On error *c may be partly updated. */
int config_apply_json(config *c, const char *text, size_t len, ikbo_err *err);
int config_apply_file(config *c, const char *path, ikbo_err *err);

/* Applies IKBO_* overrides from envp ("KEY=VALUE" strings, NULL-terminated;
 * NULL = none). Values are validated like the config file's. */
int config_apply_env(config *c, const char *const *envp, ikbo_err *err);

/* The whole resolution: defaults, then --config FILE, env, flags. argv[0] is
 * the program name. *action says whether to run or print help/version (then
 * *c holds defaults only). On error *c is freed (config_free is still safe),
 * and err names the flag, env var or file. */
int config_resolve(config *c, int argc, char *const *argv, const char *const *envp,
                   enum config_action *action, ikbo_err *err);

/* Frees the strings and zeroes *c. Safe on a zeroed or freed config. */
void config_free(config *c);

/* --help text: usage line, then every flag on its own line. */
void config_write_help(FILE *f, const char *prog);

/* "debug" / "info" / "warn" / "error"; "plain" / "json" (modes: ikbo_mode_name). */
const char *config_log_level_name(enum config_log_level l);
const char *config_log_format_name(enum config_log_format f);
const char *config_admin_http_name(enum config_admin_http a); /* "local" / "any" / "off" */

/* The resolved config as one-line JSON (for the startup log; TLS file paths
 * included, never file contents). malloc'd; NULL on allocation failure. */
char *config_to_json(const config *c);

#endif
