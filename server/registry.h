/* registry.h - the models the daemon serves, their versions and states, and
 * the repository poller that loads, swaps and retires versions while the
 * server runs.
 *
 * Why this exists: every front end (gRPC Rank/ModelInfo/Health, HTTP, the
 * batcher) asks the same questions - which models exist, which version is
 * ready, what does it take - and a request must hold its model version alive
 * while it waits and scores even if a hot reload replaces that version. So
 * lookups return a refcounted handle.
 *
 * Repository: `<repo>/<name>/<N>/model.json + weights.safetensors` (N a
 * positive integer, no leading zero), optional `<repo>/<name>/config.json`
 * (repo_watch.h). Every model directory is served, or only the configured
 * names.
 *
 * Version policy, per model (registry_policy): `latest` N (the default, N = 1)
 * serves the newest N version directories that have not failed to load;
 * `versions` serves exactly the listed ones. Versions loaded by an admin call
 * with an explicit version stay served on top of the policy ("pinned").
 *
 * Completeness: a version directory is a candidate once it holds model.json.
 * The poller loads it once it has been at rest for settle_ms: nothing in it
 * (the directory and its entries) changed for settle_ms by their change
 * times (ctime/mtime), or the poller has seen the same entries (names,
 * sizes, mtimes) for settle_ms, whichever comes first. A copy still being
 * written keeps changing, so it is not loaded half-written; copying into a
 * dot-directory and renaming it to <N> is atomic and safest. If a copy
 * stalls for longer than settle_ms the load may fail (FAILED, the previous
 * version serving); it is retried once the files change again. The initial
 * load, SIGHUP (registry_rescan) and the admin load call do not wait (the
 * operator says the repository is at rest).
 * A version that failed is retried when its directory changes, on SIGHUP and
 * on an admin load. In-place edits of a READY version are not picked up by
 * polling; an admin load reloads it.
 *
 * Loading: one worker thread (registry_start) scans, then loads one version
 * at a time: memory check (repo_memory_check), ikbo_model_load (validates),
 * warm-up (one synthetic batch: 1 user, 1 candidate, zero dense, empty bags
 * and history), then under the write lock the new version becomes READY and
 * older versions the policy no longer wants are retired in the same step.
 * Versions are retired only when the versions the policy wants are all READY
 * or FAILED and at least one is READY, so a failed load leaves the previous
 * version serving. A retired version leaves the table (state UNLOADED) and
 * the registry drops its reference; requests and batches that hold a handle
 * finish on it, and the last registry_release frees it.
 *
 * Serving settings per version (registry_model_serving), lowest to highest
 * precedence: the server's defaults (registry_opts.serving_defaults, device
 * and mode from the server config) < model.json "serving" < the model's
 * config.json "serving". Read when a version loads; fixed for its life.
 *
 * Execution contexts: a handle carries one lazily-made ikbo_ctx per "slot"
 * (one slot per thread that scores), so contexts are per thread per version
 * and need no lock: only the thread that owns slot i may call
 * registry_model_ctx(m, i).
 *
 * Ownership: registry_acquire returns a reference the caller gives back with
 * registry_release; the version, its contexts, info and serving settings
 * stay valid until then, also after the registry itself is freed.
 * Thread-safety: everything may be called from any thread (a rwlock guards
 * the table; refcounts are atomic), except registry_new/registry_free and
 * registry_start/registry_stop (one controlling thread) and
 * registry_poll_once and registry_load_pending (only while no worker runs).
 */
#ifndef IKBO_SERVER_REGISTRY_H
#define IKBO_SERVER_REGISTRY_H

#include <stdint.h>

#include "../engine/ikbo.h"
#include "ikbo/v1/ranker.pb-c.h"
#include "metrics.h"
#include "request.h"

typedef struct registry registry;
typedef struct registry_model registry_model;

enum registry_state {
    REGISTRY_LOADING = 0,
    REGISTRY_READY = 1,
    REGISTRY_FAILED = 2,
    REGISTRY_UNLOADED = 3,
};
const char *registry_state_name(enum registry_state s); /* "LOADING", ... */

#define REGISTRY_MAX_POLICY_VERSIONS 64

/* latest > 0: the newest `latest` versions; latest == 0: exactly versions[]. */
typedef struct registry_policy {
    int latest;
    int n_versions;
    int64_t versions[REGISTRY_MAX_POLICY_VERSIONS];
} registry_policy;

typedef struct registry_model_policy {
    const char *name;
    registry_policy policy;
} registry_model_policy;

typedef struct registry_opts {
    const char *repository;
    const char *const *models; /* names to serve; NULL = every model directory */
    int n_models;
    const char *device; /* "cpu", "cuda:N": the default for every model */
    enum ikbo_mode mode;
    int n_slots; /* execution context slots per version (>= 1) */
    /* Server-level batching defaults (device and mode ignored: see above);
     * NULL = none (-1 everywhere). */
    const ikbo_serving *serving_defaults;
    registry_policy default_policy; /* latest == 0 && n_versions == 0: latest 1 */
    const registry_model_policy *policies; /* per-model overrides */
    int n_policies;
    int poll_ms;   /* 0 = no polling (SIGHUP and admin calls only) */
    int settle_ms; /* a polled version directory must be unchanged this long */
    /* ikbo_model_load_failures_total{model}; NULL = not counted. */
    metrics_family *load_failures;
} registry_opts;

/* Checks the repository and records the configured names (a configured name
 * without a model directory is listed FAILED). Loads nothing: see
 * registry_start / registry_poll_once. NULL with *err only when the
 * repository cannot be read or memory runs out. */
registry *registry_new(const registry_opts *opts, ikbo_err *err);
/* Stops the worker if it runs, then drops the registry's references. */
void registry_free(registry *r);

/* The configured device and mode (what a model that failed would have used). */
const char *registry_device(const registry *r);
enum ikbo_mode registry_mode(const registry *r);

/* Starts the worker thread: an initial load of everything (logging "ready"
 * or "not_ready" when done), then polling, rescans and admin loads until
 * registry_stop. -1 with *err when the thread cannot start. */
int registry_start(registry *r, ikbo_err *err);
/* Asks the worker to stop after the load in progress and joins it. */
void registry_stop(registry *r);

/* One scan-and-load pass on the calling thread (no worker must run):
 * trusted != 0 skips the settle wait and retries failed versions, like
 * SIGHUP. Returns the number of models with a READY version. */
int registry_poll_once(registry *r, int trusted);
/* The second half of a pass alone: loads what the last scan and the admin
 * calls since then ask for, without scanning (same rule: no worker must
 * run). Tests use it to put an admin call between a pass's scan and its
 * loads, as the worker's timing can. */
int registry_load_pending(registry *r);

/* SIGHUP: rescan the whole repository now (new and removed models and
 * versions), load complete versions without the settle wait, retry failed
 * ones. Returns at once; the worker does the work. */
void registry_rescan(registry *r);

/* Admin load: (re)load a model now in the background. version 0: every
 * version the policy selects (READY ones are reloaded and swapped, FAILED
 * ones retried) and a previous admin unload is undone; version N: that
 * version, which stays served on top of the policy until unloaded (other
 * versions unloaded one by one stay unloaded). Both undo an admin unload of
 * the whole model and retry FAILED versions. Returns
 * 0 when accepted, -1 with *st NOT_FOUND (no such model or version
 * directory) or INVALID_ARGUMENT. */
int registry_admin_load(registry *r, const char *name, int64_t version, rq_status *st);
/* Admin unload: version 0: every version of the model; its requests get
 * NOT_FOUND and health NOT_SERVING until an admin load. Version N: that
 * version only (the policy will not load it again until an admin load).
 * Immediate; held handles finish. -1 with *st NOT_FOUND for an unknown
 * model or a version that is not loaded. */
int registry_admin_unload(registry *r, const char *name, int64_t version, rq_status *st);

/* The version to score with. version 0 = the newest READY version.
 * NOT_FOUND "model 'x' not found", "model 'demo' version 7 not found
 * (ready: 1)", "model 'demo' is unloaded"; UNAVAILABLE when the model exists
 * but no version is ready ("model 'demo' is loading", "... has no ready
 * version: version 1 FAILED: <why>"). Returns NULL with *st set. */
registry_model *registry_acquire(registry *r, const char *name, int64_t version, rq_status *st);
/* Another reference to a handle already held (e.g. one per queued batch). */
registry_model *registry_model_ref(registry_model *m);
void registry_release(registry_model *m); /* NULL ok */

const char *registry_model_name(const registry_model *m);
int64_t registry_model_version(const registry_model *m);
const ikbo_model_info *registry_model_info(const registry_model *m);
/* Effective serving settings (precedence above). device and mode are always
 * set; the batching numbers are -1 where nobody set them. */
const ikbo_serving *registry_model_serving(const registry_model *m);
/* 1 once the version was swapped out or unloaded (new requests no longer
 * reach it; held handles still work), else 0. */
int registry_model_retired(const registry_model *m);
/* The slot's context, made on first use. NULL with *err on failure. */
ikbo_ctx *registry_model_ctx(registry_model *m, int slot, ikbo_err *err);

/* Read-only views handed to registry_foreach. */
typedef struct registry_version_view {
    int64_t version;
    enum registry_state state;
    const char *message;         /* why FAILED/UNLOADED/LOADING; "" when READY */
    double load_seconds;         /* time the last load took; 0 before one */
    const ikbo_model_info *info; /* NULL unless READY */
    const ikbo_serving *serving; /* NULL unless READY */
    const ikbo_model *model;     /* NULL unless READY (its plan report) */
} registry_version_view;

/* Candidates per user behind the per-candidate figures of the plan shown in
 * ModelInfo and /v1/models (the bench shape, 16 x 70). */
#define REGISTRY_PLAN_RATIO 70.0

typedef struct registry_entry_view {
    const char *name;
    const registry_version_view *versions; /* newest first */
    int n_versions;
    int unloaded; /* an admin unload is in effect */
} registry_entry_view;

/* Calls fn for every model (name order) under the registry's read lock: fn
 * must be quick and must not call into the registry. */
typedef void (*registry_visit_fn)(const registry_entry_view *e, void *ctx);
void registry_foreach(registry *r, registry_visit_fn fn, void *ctx);

/* References to every READY version (models in name order, versions newest
 * first), taken under the read lock and held by the caller afterwards, so
 * that slow work on them (reading the backend's byte accounting, rendering)
 * runs outside the lock while a hot reload may retire them. *out is malloc'd
 * (NULL when there are none): registry_release each handle, then free(*out).
 * Returns the count, or -1 when memory runs out (nothing held). */
int registry_acquire_ready(registry *r, registry_model ***out);

/* The engine's byte accounting of the handle's version (ikbo_get_stats):
 * weights plus the live workspace of its execution contexts by bk_tag. */
void registry_model_stats(const registry_model *m, ikbo_stats *out);

/* A metrics_collect_fn (ctx: the registry) for ikbo_model_memory_bytes
 * {model,version,device,kind}: clears the family and sets, for every READY
 * version, kind "weights" (bk_stats.weight_bytes) and "user", "candidate",
 * "broadcast", "index" (bytes_live by bk_tag). Holds the registry lock only
 * while taking the handles (registry_acquire_ready). */
void registry_collect_memory(metrics_family *f, void *reg);

/* 1: the model has a READY version; 0: known but none ready (or unloaded);
 * -1: unknown. */
int registry_model_ready(registry *r, const char *name);

/* 1 when every model that is not admin-unloaded has a READY version (and
 * there is at least one such model); else 0 with the first reason in why
 * ("model 'demo' is loading"). Counted: the models known at startup, and a
 * model added later once it first became READY (a new model that is still
 * loading, or whose first load failed, does not make the server unready). */
int registry_all_ready(registry *r, char *why, size_t why_size);

/* ModelInfo: one model (name) or all (name NULL or ""). NOT_FOUND for an
 * unknown name. Free with registry_describe_free. */
Ikbo__V1__ModelInfoResponse *registry_describe(registry *r, const char *name, rq_status *st);
void registry_describe_free(Ikbo__V1__ModelInfoResponse *resp);

#endif
