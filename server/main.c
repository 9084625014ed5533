/* main.c - the ikbo-serve daemon: wires config, log, metrics, the model
 * registry, the gRPC server and the HTTP server together, and owns the
 * process lifecycle.
 *
 * Lifecycle: resolve the config (errors: one line, exit 2; --help/--version
 * print and exit 0), block the signals in every thread, bind both ports and
 * log where they listen, then start the registry's worker thread, which
 * loads the models (so probes see LOADING instead of a closed port) and then
 * polls the repository for new versions (registry.h). The main thread waits
 * in sigwait: SIGHUP asks the registry to rescan the repository now (event
 * reload_requested; the config file is not re-read); SIGTERM/SIGINT drain: health goes NOT_SERVING, /readyz 503, gRPC stops accepting and new
 * calls get UNAVAILABLE, in-flight calls finish (up to drain_timeout_ms, then
 * they are cancelled), and the process exits 0.
 *
 * A lost device (a kernel fault that leaves the CUDA context unusable for
 * the rest of the process: ikbo_ctx_device_lost) cannot be recovered in
 * process, and a server that stayed up would answer every call with an
 * error (a fast failure that least-loaded balancing sends more traffic to).
 * So the batch that finds it answers UNAVAILABLE, on_device_lost logs
 * device_lost and signals the main thread (SIGUSR2), which drains as for
 * SIGTERM and exits EXIT_DEVICE_LOST: systemd's Restart=on-failure and a
 * Kubernetes pod restart a fresh process. A hung device (a batch computing
 * past batching.batch_timeout_ms, batcher_set's watchdog) is reported the
 * same way, but its instance thread may never return, so nothing can be
 * joined or drained to the end: the process logs and exits at once
 * (_exit), and the clients of its calls in flight see the connection go.
 *
 * The only globals are the draining and device-lost flags (the signal
 * plumbing); everything else is passed down explicitly.
 */
#include <errno.h>
#include <grpc/grpc.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../engine/ikbo.h"
#include "config.h"
#include "grpc_server.h"
#include "http.h"
#include "log.h"
#include "metrics.h"
#include "batcher_set.h"
#include "rank.h"
#include "registry.h"

extern char **environ;

static atomic_int g_draining;
static atomic_int g_device_lost;

#define EXIT_DEVICE_LOST 3

/* A hung device: no thread can be joined, no call drained; the log is
 * flushed and the process ends (its supervisor starts a new one). */
static void exit_hung(void)
{
    log_msg(LOG_LEVEL_ERROR, "stopped", "exit %d (device hung)", EXIT_DEVICE_LOST);
    fflush(NULL);
    _exit(EXIT_DEVICE_LOST);
}

/* batcher_lost_fn: the first report logs and wakes the main thread's
 * sigwait; later ones (other batches on the same device) are already
 * covered, except that a hang after a loss still ends the drain (a hang
 * exits here, on the watchdog's thread). */
static void on_device_lost(void *arg, const char *label, const char *why, int hung)
{
    (void)arg;
    if (atomic_exchange(&g_device_lost, 1) && !hung) return;
    log_line ln;
    log_begin(&ln, LOG_LEVEL_ERROR, "device_lost");
    log_str(&ln, "model", label);
    log_str(&ln, "error", why);
    log_str(&ln, "then", hung ? "exit at once" : "drain");
    log_int(&ln, "exit", EXIT_DEVICE_LOST);
    log_end(&ln);
    if (hung) exit_hung();
    kill(getpid(), SIGUSR2);
}

static registry_policy to_policy(const config_version_policy *p)
{
    registry_policy r;
    memset(&r, 0, sizeof r);
    r.latest = p->latest;
    r.n_versions = p->n_versions;
    for (int i = 0; i < p->n_versions && i < REGISTRY_MAX_POLICY_VERSIONS; i++)
        r.versions[i] = p->versions[i];
    return r;
}

/* ikbo_model_loaded{model,version,state} from the registry at scrape time. */
typedef struct loaded_ctx {
    metrics_family *f;
} loaded_ctx;

static void visit_loaded(const registry_entry_view *e, void *p)
{
    loaded_ctx *c = p;
    for (int j = 0; j < e->n_versions; j++) {
        char v[32];
        snprintf(v, sizeof v, "%lld", (long long)e->versions[j].version);
        const char *const labels[] = {e->name, v, registry_state_name(e->versions[j].state)};
        metrics_set_l(c->f, labels, 1);
    }
}

static void collect_loaded(metrics_family *f, void *reg)
{
    loaded_ctx c = {f};
    metrics_family_clear(f);
    registry_foreach(reg, visit_loaded, &c);
}

/* "host:0" -> "host:<bound port>" for the log. */
static void bound_address(const char *listen, int port, char *out, size_t n)
{
    const char *colon = strrchr(listen, ':');
    int host_len = colon ? (int)(colon - listen) : (int)strlen(listen);
    snprintf(out, n, "%.*s:%d", host_len, listen, port);
}

/* glibc gives threads up to 8 malloc arenas per core, and memory freed in an
 * arena stays mapped there. Each model version starts its own threads, which
 * take arenas of their own, so RSS climbed with every version switch until
 * every arena held a version's worth of freed workspace (bench/soak: 138 ->
 * 160 MiB in 30 minutes on 2 cores; bench/soak/version_rss.py: +35 MiB over
 * 15 switches with 16 arenas, flat with 2). Two arenas, unless the operator
 * set MALLOC_ARENA_MAX (glibc reads it itself); before any thread starts. */
#define DEFAULT_MALLOC_ARENAS 2

static void limit_malloc_arenas(void)
{
    if (!getenv("MALLOC_ARENA_MAX")) mallopt(M_ARENA_MAX, DEFAULT_MALLOC_ARENAS);
}

/* Everything main starts, in order; serve_stop takes it down in reverse.
 * Owned by the main thread. */
typedef struct serve {
    config cfg;
    metrics_server mx;
    registry_model_policy *policies;
    registry *reg;
    batcher_set *batchers;
    int grpc_inited;
    rank_env env; /* read by both front ends until they stop */
    grpcsrv *gs;
    http_server *hs;
    int http_wait_ms; /* what the drain leaves to HTTP ranks in flight */
} serve;

/* The configuration, or an exit: -1 to go on, else the exit status (2 for
 * a config error, one line on stderr; 0 after --help / --version). */
static int resolve_config(serve *d, int argc, char **argv)
{
    ikbo_err err;
    memset(&err, 0, sizeof err);
    int rc = -1;
    enum config_action action;
    if (config_resolve(&d->cfg, argc, argv, (const char *const *)environ, &action, &err) != 0) {
        fprintf(stderr, "ikbo-serve: %s\n", err.msg);
        rc = 2;
    } else if (action == CONFIG_HELP) {
        config_write_help(stdout, "ikbo-serve");
        rc = 0;
    } else if (action == CONFIG_VERSION) {
        printf("ikbo-serve %s\n", ikbo_version());
        rc = 0;
    } else {
        /* TLS files are part of the configuration: an unreadable one is a
         * config error found before anything starts. */
        const char *tls_files[][2] = {{"tls.cert_file", d->cfg.tls_cert_file},
                                      {"tls.key_file", d->cfg.tls_key_file},
                                      {"tls.client_ca_file", d->cfg.tls_client_ca_file}};
        for (size_t i = 0; i < sizeof tls_files / sizeof *tls_files && rc < 0; i++) {
            if (tls_files[i][1] && access(tls_files[i][1], R_OK) != 0) {
                fprintf(stderr, "ikbo-serve: %s: %s: %s\n", tls_files[i][0], tls_files[i][1],
                        strerror(errno));
                rc = 2;
            }
        }
    }
    if (rc >= 0) config_free(&d->cfg);
    return rc;
}

/* The registry with its policies and scrape-time collectors: 0, or the
 * exit status (1 out of memory, 2 an unreadable repository), on stderr. */
static int open_registry(serve *d)
{
    const config *cfg = &d->cfg;
    registry_opts ro = {
        .repository = cfg->model_repository,
        .models = (const char *const *)cfg->models,
        .n_models = cfg->n_models,
        .device = cfg->device,
        .mode = cfg->mode,
        .n_slots = CONFIG_BATCH_MAX_INSTANCES, /* batcher instance i scores with slot i */
        /* The keys a version's load reads (graphs) come from here too, under
         * model.json's and config.json's serving blocks. */
        .serving_defaults = &cfg->batching,
    };
    ro.default_policy = to_policy(&cfg->version_policy);
    ro.poll_ms = cfg->repository_poll_ms;
    ro.settle_ms = cfg->repository_settle_ms;
    ro.load_failures = d->mx.model_load_failures_total;
    if (cfg->n_model_policy) {
        d->policies = calloc((size_t)cfg->n_model_policy, sizeof *d->policies);
        if (!d->policies) {
            fprintf(stderr, "ikbo-serve: out of memory\n");
            return 1;
        }
        for (int i = 0; i < cfg->n_model_policy; i++) {
            d->policies[i].name = cfg->model_policy[i].name;
            d->policies[i].policy = to_policy(&cfg->model_policy[i].policy);
        }
        ro.policies = d->policies;
        ro.n_policies = cfg->n_model_policy;
    }
    ikbo_err err;
    memset(&err, 0, sizeof err);
    if (!(d->reg = registry_new(&ro, &err))) {
        fprintf(stderr, "ikbo-serve: %s\n", err.msg);
        return 2;
    }
    metrics_family_set_collect(d->mx.model_loaded, collect_loaded, d->reg);
    metrics_family_set_collect(d->mx.model_memory_bytes, registry_collect_memory, d->reg);
    return 0;
}

static void log_start(const config *cfg)
{
    char *cj = config_to_json(cfg);
    log_line ln;
    log_begin(&ln, LOG_LEVEL_INFO, "start");
    log_str(&ln, "version", ikbo_version());
    log_int(&ln, "pid", (int64_t)getpid());
    log_str(&ln, "config", cj);
    log_end(&ln);
    free(cj);
}

static void log_listening(const serve *d)
{
    const config *cfg = &d->cfg;
    char ga[300], ha[300];
    bound_address(cfg->grpc_listen, grpcsrv_port(d->gs), ga, sizeof ga);
    bound_address(cfg->http_listen, http_port(d->hs), ha, sizeof ha);
    log_line ln;
    log_begin(&ln, LOG_LEVEL_INFO, "listening");
    log_str(&ln, "grpc", ga);
    log_str(&ln, "http", ha);
    log_str(&ln, "tls", cfg->tls_cert_file ? (cfg->tls_client_ca_file ? "mutual" : "on") : "off");
    log_int(&ln, "threads", cfg->threads);
    log_str(&ln, "models", cfg->model_repository);
    log_end(&ln);
}

/* Batchers, both front ends (ports bound and logged), then the registry's
 * worker. -1 with *err when a part cannot start. */
static int start_serving(serve *d, ikbo_err *err)
{
    const config *cfg = &d->cfg;
    if (!(d->batchers = batcher_set_new(d->reg, &cfg->batching, &d->mx, on_device_lost, NULL, err)))
        return -1;
    grpc_init();
    d->grpc_inited = 1;
    d->env = (rank_env){.reg = d->reg, .limits = &cfg->limits, .metrics = &d->mx,
                        .batchers = d->batchers};
    grpcsrv_opts go = {
        .listen = cfg->grpc_listen,
        .threads = cfg->threads,
        .max_message_bytes = cfg->limits.max_message_bytes,
        .max_metadata_bytes = cfg->max_metadata_bytes,
        .tls_cert_file = cfg->tls_cert_file,
        .tls_key_file = cfg->tls_key_file,
        .tls_client_ca_file = cfg->tls_client_ca_file,
        .rank = &d->env,
        .reg = d->reg,
        .metrics = &d->mx,
        .draining = &g_draining,
    };
    if (!(d->gs = grpcsrv_start(&go, err)))
        return -1;
    http_opts ho = {
        .listen = cfg->http_listen,
        .max_body_bytes = cfg->limits.max_message_bytes,
        .rank = &d->env,
        .reg = d->reg,
        .metrics = &d->mx,
        .draining = &g_draining,
        .admin = cfg->admin_http == CONFIG_ADMIN_ANY   ? HTTP_ADMIN_ANY
                 : cfg->admin_http == CONFIG_ADMIN_OFF ? HTTP_ADMIN_OFF
                                                       : HTTP_ADMIN_LOCAL,
    };
    if (!(d->hs = http_start(&ho, err)))
        return -1;
    log_listening(d);
    return registry_start(d->reg, err);
}

/* Until SIGTERM or SIGINT, or SIGUSR2 after on_device_lost (logged as
 * draining); SIGHUP rescans the repository; any other SIGUSR2 is ignored. */
static void wait_for_stop(const serve *d, const sigset_t *sigs)
{
    for (;;) {
        int sig = 0;
        if (sigwait(sigs, &sig) != 0) continue;
        if (sig == SIGHUP) {
            log_msg(LOG_LEVEL_INFO, "reload_requested",
                    "SIGHUP: rescanning the model repository");
            registry_rescan(d->reg);
            continue;
        }
        if (sig == SIGUSR2 && !atomic_load(&g_device_lost)) continue;
        log_line ln;
        log_begin(&ln, LOG_LEVEL_INFO, "draining");
        log_str(&ln, "signal", sig == SIGTERM ? "SIGTERM" : sig == SIGINT ? "SIGINT" : "device lost");
        log_int(&ln, "drain_timeout_ms", d->cfg.drain_timeout_ms);
        log_end(&ln);
        return;
    }
}

/* gRPC stops accepting and finishes its calls within drain_timeout_ms; what
 * is left of it goes to HTTP ranks in flight (serve_stop). */
static void drain(serve *d)
{
    atomic_store(&g_draining, 1);
    int ms = grpcsrv_shutdown(d->gs, d->cfg.drain_timeout_ms);
    int left = (int)d->cfg.drain_timeout_ms - ms;
    d->http_wait_ms = ms >= 0 && left > 0 ? left : 0;
    log_line ln;
    log_begin(&ln, LOG_LEVEL_INFO, "drained");
    if (ms >= 0)
        log_int(&ln, "ms", ms);
    else
        log_str(&ln, "cancelled", "true");
    log_end(&ln);
}

static void serve_stop(serve *d)
{
    atomic_store(&g_draining, 1);
    http_stop(d->hs, d->http_wait_ms);
    registry_stop(d->reg); /* after the load in progress, if any */
    grpcsrv_free(d->gs);
    /* After every front end is gone: answers queued work, then the batchers
     * drop their model references. */
    batcher_set_free(d->batchers);
    if (d->grpc_inited) grpc_shutdown_blocking();
    registry_free(d->reg);
    free(d->policies);
    metrics_server_free(&d->mx);
    config_free(&d->cfg);
}

int main(int argc, char **argv)
{
    limit_malloc_arenas();
    serve d;
    memset(&d, 0, sizeof d);
    int rc = resolve_config(&d, argc, argv);
    if (rc >= 0) return rc;
    log_setup((enum log_level)d.cfg.log_level, d.cfg.log_format == CONFIG_LOG_JSON, NULL);

    /* Signals are taken synchronously by sigwait; every thread made from
     * here on (ours, gRPC's, libevent's) inherits the blocked mask. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGHUP);
    sigaddset(&sigs, SIGUSR2);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    if (metrics_server_init(&d.mx, ikbo_version()) != 0) {
        fprintf(stderr, "ikbo-serve: out of memory\n");
        config_free(&d.cfg);
        return 1;
    }
    if ((rc = open_registry(&d)) != 0) {
        serve_stop(&d);
        return rc;
    }
    log_start(&d.cfg); /* after the repository check, so a config error stays one line */
    ikbo_err err;
    memset(&err, 0, sizeof err);
    if (start_serving(&d, &err) != 0) {
        log_msg(LOG_LEVEL_ERROR, "startup_failed", "%s", err.msg);
        serve_stop(&d);
        return 1;
    }
    wait_for_stop(&d, &sigs);
    drain(&d);
    serve_stop(&d);
    rc = atomic_load(&g_device_lost) ? EXIT_DEVICE_LOST : 0;
    log_msg(rc ? LOG_LEVEL_ERROR : LOG_LEVEL_INFO, "stopped", "exit %d%s", rc,
            rc ? " (device lost)" : "");
    return rc;
}
