/* registry_impl.h - what registry.c (the table, handles, states, admin),
 * registry_load.c (the loader thread, warm-up) and registry_view.c (views,
 * readiness, metrics, ModelInfo) share. Private to them.
 *
 * Locking: the table (entries, vrec, dver) changes only under r->lock
 * (write); the worker's flags under r->wmu. See registry.h.
 */
#ifndef IKBO_SERVER_REGISTRY_IMPL_H
#define IKBO_SERVER_REGISTRY_IMPL_H

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "registry.h"

/* One loaded version: what a handle points to. Immutable once published,
 * except refs, retired and the per-slot contexts. */
struct registry_model {
    _Atomic int refs;
    _Atomic int retired;
    char *name;
    char *dir;
    int64_t version;
    double load_seconds;
    ikbo_model *model;
    ikbo_serving serving;
    /* ctx[i] is touched only by the thread that owns slot i (the loader
     * fills ctx[0] with the warm-up context before publishing). */
    ikbo_ctx **ctx;
    int n_slots;
};

/* A version as the table lists it. Changed only under the write lock. */
typedef struct vrec {
    int64_t version; /* 0: a model-level problem ("model directory not found") */
    enum registry_state state;
    char message[512];
    double load_seconds;
    registry_model *inst; /* the registry's reference; non-NULL iff READY */
    uint64_t tried_sig;   /* directory signature at the last load attempt */
    int pinned;           /* admin-loaded with this version: served on top of the policy */
    int blocked;          /* admin-unloaded: the policy skips it */
    int reload;           /* READY, but load again and swap (admin load) */
    int reload_asked;     /* a plain admin load came after this version's last pick:
                           * the next scan reloads it if it is READY and targeted */
    int retry;            /* FAILED, but try again though the directory is unchanged */
    int busy;             /* the worker is loading it */
} vrec;

/* A complete version directory as the last scan saw it. */
typedef struct dver {
    int64_t version;
    uint64_t sig;
    int64_t since_ms;   /* when sig was first seen (CLOCK_MONOTONIC) */
    int64_t changed_ms; /* newest change time in the directory (CLOCK_REALTIME) */
} dver;

typedef struct entry {
    char *name;
    vrec *v; /* newest first */
    int n_v;
    dver *disk; /* newest first */
    int n_disk;
    int scanned;    /* disk holds a successful scan */
    int missing;    /* the last scan found no model directory */
    int configured; /* named in the config: listed even without a directory */
    int initial;    /* known before the worker started: readiness waits for it */
    int ever_ready; /* had a READY version once: readiness counts it from then */
    int unloaded;   /* admin unload in effect */
    int trust;      /* this pass: no settle wait, failed versions retried */
    int trust_next; /* the next pass trusts this model (admin load) */
    uint64_t gen;   /* bumped by an admin unload: older loads are discarded */
    registry_policy policy;
} entry;

struct registry {
    pthread_rwlock_t lock;
    entry *entries; /* sorted by name */
    int n_entries;
    char *repository;
    char *device;
    enum ikbo_mode mode;
    int n_slots;
    ikbo_serving defaults;
    registry_policy default_policy;
    char **policy_names;
    registry_policy *policies;
    int n_policies;
    char **models; /* configured names, or NULL */
    int n_models;
    int poll_ms, settle_ms;
    metrics_family *load_failures;

    /* The worker. wmu guards the flags below and next_settle_ms. */
    pthread_t thread;
    int running;
    pthread_mutex_t wmu;
    pthread_cond_t wcv;
    atomic_int stop;
    int rescan, kick;
    int64_t next_settle_ms; /* earliest time a waiting version settles; 0 = none */
};

/* Instances to release after the write lock is dropped (freeing a model
 * takes time and logs). */
typedef struct relist {
    registry_model *m[64];
    int n;
    struct relist *more;
} relist;

/* A version to load, as the table hands it to the loader. */
typedef struct reg_job {
    char name[256];
    char dir[PATH_MAX];
    char model_dir[PATH_MAX];
    int64_t version;
    uint64_t sig;
    uint64_t gen;
} reg_job;

/* ---- what registry_load.c (the loader) and registry.c (the table) share */

/* The first version of any model that should load now, marked busy (1), or
 * 0. Caller holds the write lock. */
int reg_pick_job(registry *r, int64_t now, reg_job *j);
/* Publishes a finished load (m, or NULL and error) and the swap. Caller holds
 * the write lock; instances to release go to rel. */
void reg_commit(registry *r, const reg_job *j, registry_model *m, const char *error, double secs,
                relist *rel);
/* Reads the repository (no lock held) and applies it to the table (takes
 * the write lock); trusted: no settle wait, failed versions retried. */
void reg_scan(registry *r, int trusted);
/* Every model's decision; end_of_pass also ends this pass's trust and drops
 * models with nothing left. Returns the earliest time a waiting version
 * settles (0 = none). Caller holds the write lock. */
int64_t reg_decide_all(registry *r, int64_t now, int end_of_pass, relist *rel);
/* Releases what rel holds (after the lock is dropped). */
void reg_relist_run(relist *l);
/* Frees an instance that was never published. */
void reg_instance_destroy(registry_model *m);
/* Wakes the loader (rescan: read the repository first). */
void reg_wake_worker(registry *r, int rescan);

/* The entry named name, or NULL (caller holds r->lock). */
entry *reg_find_entry(registry *r, const char *name);
/* name made printable and bounded for messages. */
void reg_safe_name(const char *s, char *out, size_t n);

#endif
