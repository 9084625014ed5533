/* registry.h - the models the daemon serves, their versions and states.
 *
 * Why this exists: every front end (gRPC Rank/ModelInfo/Health, HTTP) asks
 * the same questions - which models exist, which version is ready, what does
 * it take - and a request must hold its model alive while it scores even if a
 * later hot reload replaces it. So lookups return a refcounted handle.
 *
 * Layout: a repository `<repo>/<name>/<N>/model.json`. registry_new scans it
 * (or takes the configured names) and records, per name, the highest-numbered
 * version directory in state LOADING; registry_load_all then loads them with
 * ikbo_model_load (READY, or FAILED with the engine's message). A failed load
 * is logged and kept visible; it never stops the daemon.
 *
 * Execution contexts: a handle carries one lazily-made ikbo_ctx per "slot"
 * (one slot per thread that scores: each gRPC worker, the HTTP thread), so
 * contexts are per thread per model and need no lock: only the thread that
 * owns slot i may call registry_model_ctx(m, i).
 *
 * Ownership: registry_acquire returns a reference the caller gives back with
 * registry_release; the model, its contexts and its info stay valid until
 * then. The registry holds its own reference to each version it lists;
 * freeing the registry drops those, and the last release frees the model.
 * Thread-safety: everything may be called from any thread (a rwlock guards
 * the table; refcounts are atomic), except registry_free, which runs after
 * every other user is gone.
 */
#ifndef IKBO_SERVER_REGISTRY_H
#define IKBO_SERVER_REGISTRY_H

#include <stdint.h>

#include "../engine/ikbo.h"
#include "ikbo/v1/ranker.pb-c.h"
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

typedef struct registry_opts {
    const char *repository;
    const char *const *models; /* names to serve; NULL = every model directory */
    int n_models;
    const char *device; /* "cpu", "cuda:N" */
    enum ikbo_mode mode;
    int n_slots; /* execution context slots per model (>= 1) */
} registry_opts;

/* Scans the repository. A model directory is a subdirectory holding at least
 * one all-digit version directory; a configured name without one is listed
 * FAILED. NULL with *err only when the repository cannot be read or memory
 * runs out. */
registry *registry_new(const registry_opts *opts, ikbo_err *err);
void registry_free(registry *r);

/* The configured device and mode (what a model that failed would have used). */
const char *registry_device(const registry *r);
enum ikbo_mode registry_mode(const registry *r);

/* Loads every LOADING version, one after another, logging each result
 * (event model_load). Stops early when *stop becomes nonzero (stop may be
 * NULL). Returns the number of READY models. */
int registry_load_all(registry *r, const volatile int *stop);

/* The version to score with. version 0 = the newest READY version.
 * NOT_FOUND "model 'x' not found" / "model 'demo' version 7 not found
 * (ready: 1)"; UNAVAILABLE when the model exists but no version is ready
 * ("model 'demo' is loading", "... has no ready version: version 1 FAILED:
 * <why>"). Returns NULL with *st set. */
registry_model *registry_acquire(registry *r, const char *name, int64_t version, rq_status *st);
void registry_release(registry_model *m); /* NULL ok */

const char *registry_model_name(const registry_model *m);
int64_t registry_model_version(const registry_model *m);
const ikbo_model_info *registry_model_info(const registry_model *m);
/* The slot's context, made on first use. NULL with *err on failure. */
ikbo_ctx *registry_model_ctx(registry_model *m, int slot, ikbo_err *err);

/* Read-only views handed to registry_foreach. */
typedef struct registry_version_view {
    int64_t version;
    enum registry_state state;
    const char *message;         /* "" unless FAILED */
    double load_seconds;         /* time ikbo_model_load took; 0 while LOADING */
    const ikbo_model_info *info; /* NULL unless READY */
} registry_version_view;

typedef struct registry_entry_view {
    const char *name;
    const registry_version_view *versions; /* newest first */
    int n_versions;
} registry_entry_view;

/* Calls fn for every model (name order) under the registry's read lock: fn
 * must be quick and must not call into the registry. */
typedef void (*registry_visit_fn)(const registry_entry_view *e, void *ctx);
void registry_foreach(registry *r, registry_visit_fn fn, void *ctx);

/* 1: the model has a READY version; 0: known but none ready; -1: unknown. */
int registry_model_ready(registry *r, const char *name);

/* 1 when every model has a READY version; else 0 with the first reason in
 * why ("model 'demo' is loading"). An empty registry is not ready. */
int registry_all_ready(registry *r, char *why, size_t why_size);

/* ModelInfo: one model (name) or all (name NULL or ""). NOT_FOUND for an
 * unknown name. Free with registry_describe_free. */
Ikbo__V1__ModelInfoResponse *registry_describe(registry *r, const char *name, rq_status *st);
void registry_describe_free(Ikbo__V1__ModelInfoResponse *resp);

#endif
