/* registry.c - the registry's core: models, versions and their states,
 * refcounted handles, the repository scan as the table sees it, the
 * load/swap/retire decisions, admin and lookups (registry.h has the rules).
 * The loader thread and warm-up are registry_load.c; what the registry shows
 * (views, readiness, the memory gauge, ModelInfo) is registry_view.c. */
#include "clock.h"
#include "registry.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "log.h"
#include "registry_impl.h"
#include "repo_watch.h"



static void relist_add(relist *l, registry_model *m)
{
    while (l->n == (int)(sizeof l->m / sizeof l->m[0])) {
        if (!l->more && !(l->more = calloc(1, sizeof *l->more))) {
            /* Out of memory: release under the lock rather than leak. */
            registry_release(m);
            return;
        }
        l = l->more;
    }
    l->m[l->n++] = m;
}

void reg_relist_run(relist *l)
{
    for (int i = 0; i < l->n; i++) registry_release(l->m[i]);
    relist *x = l->more;
    while (x) {
        for (int i = 0; i < x->n; i++) registry_release(x->m[i]);
        relist *next = x->more;
        free(x);
        x = next;
    }
    l->n = 0;
    l->more = NULL;
}

const char *registry_state_name(enum registry_state s)
{
    switch (s) {
    case REGISTRY_LOADING: return "LOADING";
    case REGISTRY_READY: return "READY";
    case REGISTRY_FAILED: return "FAILED";
    case REGISTRY_UNLOADED: return "UNLOADED";
    }
    return "UNKNOWN";
}

/* A client-supplied name as it may appear in a message: printable, short. */
void reg_safe_name(const char *s, char *out, size_t n)
{
    size_t j = 0;
    for (; s && *s && j + 4 < n; s++)
        out[j++] = isprint((unsigned char)*s) ? *s : '?';
    if (s && *s) {
        out[j++] = '.';
        out[j++] = '.';
        out[j++] = '.';
    }
    out[j] = '\0';
}

static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- instances ----------------------------------------------------------- */

void reg_instance_destroy(registry_model *m)
{
    if (m->model) {
        log_line ln;
        log_begin(&ln, LOG_LEVEL_DEBUG, "model_freed");
        log_str(&ln, "model", m->name);
        log_int(&ln, "version", m->version);
        log_end(&ln);
    }
    for (int i = 0; m->ctx && i < m->n_slots; i++)
        if (m->ctx[i]) ikbo_ctx_free(m->ctx[i]);
    if (m->model) ikbo_model_free(m->model);
    free(m->ctx);
    free(m->name);
    free(m->dir);
    free(m);
}

void registry_release(registry_model *m)
{
    if (m && atomic_fetch_sub_explicit(&m->refs, 1, memory_order_acq_rel) == 1)
        reg_instance_destroy(m);
}

registry_model *registry_model_ref(registry_model *m)
{
    if (m) atomic_fetch_add_explicit(&m->refs, 1, memory_order_relaxed);
    return m;
}

static void retire_instance(registry_model *m, relist *rel)
{
    atomic_store(&m->retired, 1);
    relist_add(rel, m);
}

const char *registry_model_name(const registry_model *m) { return m->name; }
int64_t registry_model_version(const registry_model *m) { return m->version; }
const ikbo_serving *registry_model_serving(const registry_model *m) { return &m->serving; }
int registry_model_retired(const registry_model *m) { return atomic_load(&m->retired); }

const ikbo_model_info *registry_model_info(const registry_model *m)
{
    return m->model ? ikbo_model_get_info(m->model) : NULL;
}

ikbo_ctx *registry_model_ctx(registry_model *m, int slot, ikbo_err *err)
{
    if (slot < 0 || slot >= m->n_slots) {
        bk_seterr(err, "registry: context slot %d out of range [0, %d)", slot, m->n_slots);
        return NULL;
    }
    if (!m->model) {
        bk_seterr(err, "registry: model '%s' is not loaded", m->name);
        return NULL;
    }
    if (!m->ctx[slot]) m->ctx[slot] = ikbo_ctx_new(m->model, err);
    return m->ctx[slot];
}

/* ---- table helpers (callers hold the lock) --------------------------------- */

static int cmp_entry(const void *a, const void *b)
{
    return strcmp(((const entry *)a)->name, ((const entry *)b)->name);
}

entry *reg_find_entry(registry *r, const char *name)
{
    if (!name || !r->n_entries) return NULL;
    entry key = {.name = (char *)name};
    return bsearch(&key, r->entries, (size_t)r->n_entries, sizeof *r->entries, cmp_entry);
}

static const registry_policy *policy_for(const registry *r, const char *name)
{
    for (int i = 0; i < r->n_policies; i++)
        if (!strcmp(r->policy_names[i], name)) return &r->policies[i];
    return &r->default_policy;
}

/* Inserts an entry for name (sorted) and returns it; NULL when out of memory.
 * Invalidates entry pointers. */
static entry *add_entry(registry *r, const char *name, int configured)
{
    entry *grown = realloc(r->entries, (size_t)(r->n_entries + 1) * sizeof *grown);
    if (!grown) return NULL;
    r->entries = grown;
    entry e;
    memset(&e, 0, sizeof e);
    if (!(e.name = strdup(name))) return NULL;
    e.configured = configured;
    e.policy = *policy_for(r, name);
    int i = r->n_entries;
    while (i > 0 && strcmp(r->entries[i - 1].name, name) > 0) {
        r->entries[i] = r->entries[i - 1];
        i--;
    }
    r->entries[i] = e;
    r->n_entries++;
    return &r->entries[i];
}

static void entry_free(entry *e)
{
    for (int j = 0; j < e->n_v; j++) registry_release(e->v[j].inst);
    free(e->v);
    free(e->disk);
    free(e->name);
}

static vrec *find_v(entry *e, int64_t version)
{
    for (int j = 0; j < e->n_v; j++)
        if (e->v[j].version == version) return &e->v[j];
    return NULL;
}

static const dver *find_disk(const entry *e, int64_t version)
{
    for (int j = 0; j < e->n_disk; j++)
        if (e->disk[j].version == version) return &e->disk[j];
    return NULL;
}

/* A new record (state LOADING) kept in newest-first order; NULL when out of
 * memory. Invalidates vrec pointers of e. */
static vrec *add_v(entry *e, int64_t version)
{
    vrec *g = realloc(e->v, (size_t)(e->n_v + 1) * sizeof *g);
    if (!g) return NULL;
    e->v = g;
    int i = e->n_v;
    while (i > 0 && e->v[i - 1].version < version) {
        e->v[i] = e->v[i - 1];
        i--;
    }
    memset(&e->v[i], 0, sizeof e->v[i]);
    e->v[i].version = version;
    e->v[i].state = REGISTRY_LOADING;
    e->n_v++;
    return &e->v[i];
}

static void remove_v(entry *e, int j)
{
    memmove(&e->v[j], &e->v[j + 1], (size_t)(e->n_v - j - 1) * sizeof *e->v);
    e->n_v--;
}

static void log_unload(const char *name, int64_t version, const char *why)
{
    log_line ln;
    log_begin(&ln, LOG_LEVEL_INFO, "model_unload");
    log_str(&ln, "model", name);
    log_int(&ln, "version", version);
    log_str(&ln, "reason", why);
    log_end(&ln);
}

/* READY -> UNLOADED: new requests stop reaching it; holders finish. */
static void retire_v(entry *e, vrec *v, const char *why, relist *rel)
{
    if (v->inst) {
        retire_instance(v->inst, rel);
        v->inst = NULL;
        log_unload(e->name, v->version, why);
    }
    v->state = REGISTRY_UNLOADED;
    v->reload = 0;
    snprintf(v->message, sizeof v->message, "unloaded: %s", why);
}

static int in_list(const int64_t *a, int n, int64_t x)
{
    for (int i = 0; i < n; i++)
        if (a[i] == x) return 1;
    return 0;
}

/* FAILED, with the files it failed on, and nobody asked for a retry. */
static int failed_unchanged(const vrec *v, const dver *d)
{
    return v && v->state == REGISTRY_FAILED && v->tried_sig == d->sig && !v->retry;
}

/* The versions the policy wants now (plus pinned ones), newest first. */
static int compute_target(const entry *e, int64_t *t, int cap)
{
    int n = 0;
    int latest = e->policy.latest;
    int taken = 0;
    for (int i = 0; i < e->n_disk && n < cap; i++) {
        const dver *d = &e->disk[i];
        const vrec *v = find_v((entry *)e, d->version);
        if (v && v->blocked) continue;
        int want;
        if (v && v->pinned) {
            want = 1;
        } else if (latest > 0) {
            want = taken < latest && !failed_unchanged(v, d);
            taken += want;
        } else {
            want = in_list(e->policy.versions, e->policy.n_versions, d->version);
        }
        if (want) t[n++] = d->version;
    }
    return n;
}

static int needs_load(const vrec *v, const dver *d)
{
    if (v->busy) return 0;
    switch (v->state) {
    case REGISTRY_LOADING:
    case REGISTRY_UNLOADED: return 1;
    case REGISTRY_READY: return v->reload;
    case REGISTRY_FAILED: return v->tried_sig != d->sig || v->retry;
    }
    return 0;
}

/* When d counts as at rest (CLOCK_MONOTONIC ms): settle_ms after the
 * newest change time in it, or after the poller first saw it this way,
 * whichever comes first (the second bounds the wait when file times are
 * off, e.g. a file server's clock). */
static int64_t settle_at(const registry *r, const dver *d, int64_t now)
{
    int64_t by_seen = d->since_ms + r->settle_ms;
    int64_t by_change = now + (d->changed_ms + r->settle_ms - wall_ms());
    return by_change < by_seen ? by_change : by_seen;
}

static int settled(const registry *r, const entry *e, const vrec *v, const dver *d, int64_t now)
{
    return e->trust || v->reload || v->retry || settle_at(r, d, now) <= now;
}

/* The model-level problem record (version 0) for a configured name. */
static void set_problem(entry *e, const char *msg)
{
    vrec *v = find_v(e, 0);
    if (!v) {
        if (!(v = add_v(e, 0))) return;
    } else if (v->state == REGISTRY_FAILED && !strcmp(v->message, msg)) {
        return;
    }
    v->state = REGISTRY_FAILED;
    snprintf(v->message, sizeof v->message, "%s", msg);
    log_line ln;
    log_begin(&ln, LOG_LEVEL_ERROR, "model_load");
    log_str(&ln, "model", e->name);
    log_str(&ln, "state", "FAILED");
    log_str(&ln, "error", v->message);
    log_end(&ln);
}

/* Brings e's records in line with its last scan and policy: records for
 * wanted versions, retirement of unwanted READY versions once the wanted
 * ones are settled, cleanup of records whose directory is gone. Returns
 * the earliest time a waiting version settles (0 = none). */
static int64_t decide(registry *r, entry *e, int64_t now, relist *rel)
{
    if (e->unloaded || !e->scanned) return 0;
    int64_t t[256];
    int nt = compute_target(e, t, (int)(sizeof t / sizeof t[0]));
    int64_t wake = 0;
    int pending = 0, any_ready = 0;
    for (int i = 0; i < nt; i++) {
        const dver *d = find_disk(e, t[i]);
        vrec *v = find_v(e, t[i]);
        if (!v && !(v = add_v(e, t[i]))) continue;
        if (v->state == REGISTRY_READY) any_ready = 1;
        int load = needs_load(v, d);
        if (v->busy || load) pending = 1;
        if (load && !settled(r, e, v, d, now)) {
            if (v->state != REGISTRY_READY) {
                v->state = REGISTRY_LOADING;
                snprintf(v->message, sizeof v->message,
                         "waiting until the directory is unchanged for %d ms", r->settle_ms);
            }
            int64_t at = settle_at(r, d, now);
            if (at <= now) at = now + 1;
            if (!wake || at < wake) wake = at;
        }
    }
    if (e->n_disk == 0 || (!pending && any_ready)) {
        for (int j = 0; j < e->n_v; j++) {
            vrec *v = &e->v[j];
            if (v->state != REGISTRY_READY || in_list(t, nt, v->version)) continue;
            char why[160];
            if (!find_disk(e, v->version))
                snprintf(why, sizeof why, "version directory removed");
            else if (nt)
                snprintf(why, sizeof why, "replaced by version %lld (version policy)",
                         (long long)t[0]);
            else
                snprintf(why, sizeof why, "not selected by the version policy");
            retire_v(e, v, why, rel);
        }
    }
    /* Records of versions that left the disk (and of unwanted versions
     * still waiting) are dropped once nothing holds them. */
    for (int j = e->n_v - 1; j >= 0; j--) {
        vrec *v = &e->v[j];
        if (v->version == 0 || v->busy || v->state == REGISTRY_READY) continue;
        int on_disk = find_disk(e, v->version) != NULL;
        /* An admin load's record waits for the scan that will see it. */
        if (v->pinned && e->trust_next) continue;
        if (!on_disk || (v->state == REGISTRY_LOADING && !in_list(t, nt, v->version)))
            remove_v(e, j);
    }
    vrec *p = find_v(e, 0);
    if (e->n_disk > 0 && p) {
        remove_v(e, (int)(p - e->v));
    } else if (e->n_disk == 0 && e->configured) {
        int ready = 0;
        for (int j = 0; j < e->n_v; j++) ready |= e->v[j].state == REGISTRY_READY;
        if (!ready) {
            char msg[600];
            snprintf(msg, sizeof msg, "%.400s/%.100s: %s", r->repository, e->name,
                     e->missing ? "model directory not found"
                                : "no version directory (<N>/model.json)");
            set_problem(e, msg);
        }
    }
    return wake;
}

/* ---- scanning ------------------------------------------------------------- */

typedef struct scan_item {
    char *name;
    repo_version *v;
    int n; /* -1: not readable (errno in err_no) */
    int err_no;
    int configured;
    char err[512];
} scan_item;

static void scan_free(scan_item *items, int n);

/* Reads the repository without the lock. */
static int scan_repo(registry *r, scan_item **out)
{
    *out = NULL;
    char **names = NULL;
    int n = 0;
    ikbo_err err;
    if (r->models) {
        names = r->models;
        n = r->n_models;
    } else {
        n = repo_list_models(r->repository, &names, &err);
        if (n < 0) {
            log_msg(LOG_LEVEL_WARN, "repository_scan", "%s", err.msg);
            return -1;
        }
    }
    scan_item *items = calloc((size_t)(n ? n : 1), sizeof *items);
    if (!items) {
        if (!r->models) repo_free_names(names, n);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        scan_item *it = &items[i];
        it->configured = r->models != NULL;
        it->name = strdup(names[i]);
        if (!it->name) { /* a partial scan would read as models removed: none */
            if (!r->models) repo_free_names(names, n);
            scan_free(items, i);
            return -1;
        }
        char dir[PATH_MAX];
        snprintf(dir, sizeof dir, "%s/%s", r->repository, names[i]);
        errno = 0;
        it->n = it->name ? repo_list_versions(dir, &it->v, &err) : -1;
        it->err_no = errno;
        if (it->n < 0) snprintf(it->err, sizeof it->err, "%s", it->name ? err.msg : "out of memory");
    }
    if (!r->models) repo_free_names(names, n);
    *out = items;
    return n;
}

static void scan_free(scan_item *items, int n)
{
    for (int i = 0; i < n; i++) {
        free(items[i].name);
        free(items[i].v);
    }
    free(items);
}

static void set_disk(entry *e, const repo_version *v, int n, int64_t now)
{
    dver *d = calloc((size_t)(n ? n : 1), sizeof *d);
    if (!d) return; /* keep the previous view */
    for (int i = 0; i < n; i++) {
        d[i].version = v[i].version;
        d[i].sig = v[i].sig;
        const dver *old = find_disk(e, v[i].version);
        d[i].since_ms = old && old->sig == v[i].sig ? old->since_ms : now;
        d[i].changed_ms = v[i].changed_ms;
    }
    free(e->disk);
    e->disk = d;
    e->n_disk = n;
    e->scanned = 1;
}

/* Applies a scan under the write lock. */
static void merge_scan(registry *r, scan_item *items, int n, int trusted, int64_t now)
{
    for (int i = 0; i < n; i++) {
        scan_item *it = &items[i];
        if (!it->name) continue;
        entry *e = reg_find_entry(r, it->name);
        if (it->n < 0 && it->err_no != ENOENT) {
            /* Unreadable for now (permissions, I/O): change nothing but say so. */
            if (e && e->configured && !e->n_v) set_problem(e, it->err);
            log_msg(LOG_LEVEL_WARN, "repository_scan", "%s", it->err);
            continue;
        }
        if (!e) {
            if (it->n <= 0 && !it->configured) continue; /* nothing complete yet */
            if (!(e = add_entry(r, it->name, it->configured))) continue;
        }
        e->missing = it->n < 0; /* ENOENT */
        set_disk(e, it->n < 0 ? NULL : it->v, it->n < 0 ? 0 : it->n, now);
    }
    /* Discovered models whose directory is gone: empty view (they retire). */
    if (!r->models && n >= 0) {
        for (int k = 0; k < r->n_entries; k++) {
            entry *e = &r->entries[k];
            int seen = 0;
            for (int i = 0; i < n && !seen; i++) seen = items[i].name && !strcmp(items[i].name, e->name);
            if (!seen) set_disk(e, NULL, 0, now);
        }
    }
    for (int k = 0; k < r->n_entries; k++) {
        entry *e = &r->entries[k];
        e->trust = trusted || e->trust_next;
        e->trust_next = 0;
        if (e->trust)
            for (int j = 0; j < e->n_v; j++)
                if (e->v[j].state == REGISTRY_FAILED && e->v[j].version > 0) e->v[j].retry = 1;
        int asked = 0;
        for (int j = 0; j < e->n_v; j++) asked |= e->v[j].reload_asked;
        if (asked) {
            /* A plain admin load: reload what was loaded before the call; a
             * version the worker picked after it (in the pass that was
             * running then) already reads today's files and is not loaded
             * twice. */
            int64_t t[256];
            int nt = compute_target(e, t, (int)(sizeof t / sizeof t[0]));
            for (int i = 0; i < nt; i++) {
                vrec *v = find_v(e, t[i]);
                if (v && v->state == REGISTRY_READY && v->reload_asked) v->reload = 1;
            }
            for (int j = 0; j < e->n_v; j++) e->v[j].reload_asked = 0;
        }
    }
}

/* Drops discovered entries with nothing left (their directory is gone). */
static void prune_entries(registry *r)
{
    if (r->models) return;
    for (int k = r->n_entries - 1; k >= 0; k--) {
        entry *e = &r->entries[k];
        if (e->n_disk || e->unloaded) continue;
        int held = 0;
        for (int j = 0; j < e->n_v; j++) held |= e->v[j].busy || e->v[j].state == REGISTRY_READY;
        if (held) continue;
        entry_free(e);
        memmove(&r->entries[k], &r->entries[k + 1], (size_t)(r->n_entries - k - 1) * sizeof *e);
        r->n_entries--;
    }
}


int64_t reg_decide_all(registry *r, int64_t now, int end_of_pass, relist *rel)
{
    int64_t wake = 0;
    for (int k = 0; k < r->n_entries; k++) {
        if (end_of_pass) r->entries[k].trust = 0;
        int64_t w = decide(r, &r->entries[k], now, rel);
        if (w && (!wake || w < wake)) wake = w;
    }
    if (end_of_pass) prune_entries(r);
    return wake;
}

void reg_scan(registry *r, int trusted)
{
    scan_item *items = NULL;
    int n = scan_repo(r, &items);
    relist rel = {0};
    if (n >= 0) {
        pthread_rwlock_wrlock(&r->lock);
        int64_t now = clock_mono_ms();
        merge_scan(r, items, n, trusted, now);
        reg_decide_all(r, now, 0, &rel);
        pthread_rwlock_unlock(&r->lock);
    }
    scan_free(items, n > 0 ? n : 0);
    reg_relist_run(&rel);
}

/* ---- loading: the table's side (the loader is registry_load.c) ---------- */

int reg_pick_job(registry *r, int64_t now, reg_job *j)
{
    for (int k = 0; k < r->n_entries; k++) {
        entry *e = &r->entries[k];
        if (e->unloaded || !e->scanned || strlen(e->name) >= sizeof j->name) continue;
        int64_t t[256];
        int nt = compute_target(e, t, (int)(sizeof t / sizeof t[0]));
        for (int i = 0; i < nt; i++) {
            const dver *d = find_disk(e, t[i]);
            vrec *v = find_v(e, t[i]);
            if (!v || !d || !needs_load(v, d) || !settled(r, e, v, d, now)) continue;
            v->busy = 1;
            v->reload_asked = 0; /* this load reads the directory as it is now */
            if (v->state != REGISTRY_READY) {
                v->state = REGISTRY_LOADING;
                v->message[0] = '\0';
            }
            snprintf(j->name, sizeof j->name, "%s", e->name);
            snprintf(j->model_dir, sizeof j->model_dir, "%s/%s", r->repository, e->name);
            snprintf(j->dir, sizeof j->dir, "%s/%s/%lld", r->repository, e->name,
                     (long long)v->version);
            j->version = v->version;
            j->sig = d->sig;
            j->gen = e->gen;
            return 1;
        }
    }
    return 0;
}

static void log_load(const reg_job *j, const registry_model *m, const char *state, double secs,
                     const char *error)
{
    log_line ln;
    log_begin(&ln, error ? LOG_LEVEL_ERROR : LOG_LEVEL_INFO, "model_load");
    log_str(&ln, "model", j->name);
    log_int(&ln, "version", j->version);
    log_str(&ln, "state", state);
    log_num(&ln, "seconds", secs, 3);
    if (m) {
        log_str(&ln, "device", m->serving.device);
        log_str(&ln, "mode", m->serving.mode);
    }
    log_str(&ln, "dir", j->dir);
    log_str(&ln, "error", error);
    log_end(&ln);
}

void reg_commit(registry *r, const reg_job *j, registry_model *m, const char *error, double secs,
                relist *rel)
{
    entry *e = reg_find_entry(r, j->name);
    vrec *v = e ? find_v(e, j->version) : NULL;
    if (!e || !v || e->gen != j->gen || v->blocked || e->unloaded) {
        if (v) v->busy = 0;
        if (m) {
            retire_instance(m, rel);
            log_unload(j->name, j->version, "unloaded while loading");
        }
        return;
    }
    v->busy = 0;
    v->tried_sig = j->sig;
    v->retry = 0;
    v->reload = 0;
    v->load_seconds = secs;
    if (m) {
        if (v->inst) retire_instance(v->inst, rel); /* a reload: swap */
        v->inst = m;
        v->state = REGISTRY_READY;
        v->message[0] = '\0';
        e->ever_ready = 1;
        log_load(j, m, "READY", secs, NULL);
    } else if (v->inst) {
        snprintf(v->message, sizeof v->message, "reload failed, previous load serving: %.460s", error);
        log_load(j, NULL, "READY", secs, v->message);
    } else {
        v->state = REGISTRY_FAILED;
        snprintf(v->message, sizeof v->message, "%s", error);
        log_load(j, NULL, "FAILED", secs, error);
    }
    if (!m) {
        const char *const labels[] = {j->name};
        metrics_add_l(r->load_failures, labels, 1);
    }
    decide(r, e, clock_mono_ms(), rel);
}

/* ---- construction ---------------------------------------------------------- */

registry *registry_new(const registry_opts *o, ikbo_err *err)
{
    registry *r = calloc(1, sizeof *r);
    if (!r) {
        bk_seterr(err, "registry: out of memory");
        return NULL;
    }
    pthread_rwlock_init(&r->lock, NULL);
    pthread_mutex_init(&r->wmu, NULL);
    clock_cond_init(&r->wcv);
    atomic_init(&r->stop, 0);
    r->repository = strdup(o->repository ? o->repository : "models");
    r->device = strdup(o->device ? o->device : "cpu");
    r->mode = o->mode;
    r->n_slots = o->n_slots > 0 ? o->n_slots : 1;
    r->poll_ms = o->poll_ms > 0 ? o->poll_ms : 0;
    r->settle_ms = o->settle_ms > 0 ? o->settle_ms : 0;
    r->load_failures = o->load_failures;
    serving_unset(&r->defaults);
    if (o->serving_defaults) serving_merge(&r->defaults, o->serving_defaults);
    r->defaults.mode[0] = r->defaults.device[0] = '\0';
    r->default_policy = o->default_policy;
    if (r->default_policy.latest <= 0 && r->default_policy.n_versions <= 0)
        r->default_policy.latest = 1;
    if (!r->repository || !r->device) goto oom;
    if (o->n_policies > 0) {
        r->policy_names = calloc((size_t)o->n_policies, sizeof *r->policy_names);
        r->policies = calloc((size_t)o->n_policies, sizeof *r->policies);
        if (!r->policy_names || !r->policies) goto oom;
        for (int i = 0; i < o->n_policies; i++) {
            if (!(r->policy_names[i] = strdup(o->policies[i].name))) goto oom;
            r->policies[i] = o->policies[i].policy;
            r->n_policies = i + 1;
        }
    }
    struct stat sb;
    if (stat(r->repository, &sb) != 0) {
        bk_seterr(err, "model repository %s: %s", r->repository, strerror(errno));
        goto fail;
    }
    if (!S_ISDIR(sb.st_mode)) {
        bk_seterr(err, "model repository %s: not a directory", r->repository);
        goto fail;
    }
    if (o->models) {
        r->models = calloc((size_t)(o->n_models ? o->n_models : 1), sizeof *r->models);
        if (!r->models) goto oom;
        for (int i = 0; i < o->n_models; i++) {
            int dup = 0;
            for (int k = 0; k < r->n_models; k++) dup |= !strcmp(r->models[k], o->models[i]);
            if (dup) continue;
            if (!(r->models[r->n_models] = strdup(o->models[i]))) goto oom;
            r->n_models++;
            if (!add_entry(r, o->models[i], 1)) goto oom;
        }
    }
    /* List what is there now (LOADING), so probes say "loading" at once. */
    reg_scan(r, 1);
    for (int k = 0; k < r->n_entries; k++) r->entries[k].initial = 1;
    return r;
oom:
    bk_seterr(err, "registry: out of memory");
fail:
    registry_free(r);
    return NULL;
}

void registry_free(registry *r)
{
    if (!r) return;
    registry_stop(r);
    for (int i = 0; i < r->n_entries; i++) entry_free(&r->entries[i]);
    free(r->entries);
    for (int i = 0; i < r->n_policies; i++) free(r->policy_names[i]);
    free(r->policy_names);
    free(r->policies);
    for (int i = 0; i < r->n_models; i++) free(r->models[i]);
    free(r->models);
    free(r->repository);
    free(r->device);
    pthread_rwlock_destroy(&r->lock);
    pthread_mutex_destroy(&r->wmu);
    pthread_cond_destroy(&r->wcv);
    free(r);
}

const char *registry_device(const registry *r) { return r->device; }
enum ikbo_mode registry_mode(const registry *r) { return r->mode; }

/* ---- admin ------------------------------------------------------------------ */

static int valid_model_name(const char *name)
{
    return name && *name && !strchr(name, '/') && strcmp(name, ".") && strcmp(name, "..") &&
           strlen(name) < 200;
}

int registry_admin_load(registry *r, const char *name, int64_t version, rq_status *st)
{
    char sn[160];
    reg_safe_name(name, sn, sizeof sn);
    if (!valid_model_name(name))
        return rq_status_set(st, RQ_INVALID_ARGUMENT, "model name '%s' is not valid", sn);
    if (version < 0)
        return rq_status_set(st, RQ_INVALID_ARGUMENT, "version: must be >= 0 (0 = by policy), got %lld",
                             (long long)version);
    char path[PATH_MAX];
    struct stat sb;
    snprintf(path, sizeof path, "%s/%s", r->repository, name);
    if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return rq_status_set(st, RQ_NOT_FOUND, "model '%s': no directory %s/%s in the repository",
                             sn, r->repository, sn);
    if (version > 0) {
        snprintf(path, sizeof path, "%s/%s/%lld/model.json", r->repository, name,
                 (long long)version);
        if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode))
            return rq_status_set(st, RQ_NOT_FOUND, "model '%s' version %lld: no %s", sn,
                                 (long long)version, path);
    }
    pthread_rwlock_wrlock(&r->lock);
    entry *e = reg_find_entry(r, name);
    if (!e && r->models) {
        pthread_rwlock_unlock(&r->lock);
        return rq_status_set(st, RQ_NOT_FOUND, "model '%s' is not in the configured model list", sn);
    }
    if (!e && !(e = add_entry(r, name, 0))) {
        pthread_rwlock_unlock(&r->lock);
        return rq_status_set(st, RQ_INTERNAL, "out of memory");
    }
    e->unloaded = 0;
    e->trust_next = 1;
    /* A plain load lifts every earlier per-version unload; a load of
     * version N only N's. */
    for (int j = 0; j < e->n_v; j++)
        if (version == 0 || e->v[j].version == version) e->v[j].blocked = 0;
    if (version > 0) {
        vrec *v = find_v(e, version);
        if (!v && !(v = add_v(e, version))) {
            pthread_rwlock_unlock(&r->lock);
            return rq_status_set(st, RQ_INTERNAL, "out of memory");
        }
        v->pinned = 1;
        if (v->state == REGISTRY_READY) v->reload = 1;
        if (v->state == REGISTRY_FAILED) v->retry = 1;
    } else { /* the next scan reloads the READY versions of the target */
        for (int j = 0; j < e->n_v; j++) e->v[j].reload_asked = 1;
    }
    pthread_rwlock_unlock(&r->lock);
    log_line ln;
    log_begin(&ln, LOG_LEVEL_INFO, "model_load_requested");
    log_str(&ln, "model", name);
    if (version > 0) log_int(&ln, "version", version);
    log_end(&ln);
    reg_wake_worker(r, 0);
    rq_status_ok(st);
    return 0;
}

int registry_admin_unload(registry *r, const char *name, int64_t version, rq_status *st)
{
    char sn[160];
    reg_safe_name(name, sn, sizeof sn);
    if (version < 0)
        return rq_status_set(st, RQ_INVALID_ARGUMENT, "version: must be >= 0 (0 = every version), got %lld",
                             (long long)version);
    relist rel = {0};
    pthread_rwlock_wrlock(&r->lock);
    entry *e = reg_find_entry(r, name);
    if (!e) {
        pthread_rwlock_unlock(&r->lock);
        return rq_status_set(st, RQ_NOT_FOUND, "model '%s' not found", sn);
    }
    if (version == 0) {
        e->unloaded = 1;
        e->gen++;
        for (int j = 0; j < e->n_v; j++) {
            vrec *v = &e->v[j];
            v->pinned = v->reload = v->retry = 0;
            if (v->state == REGISTRY_READY || v->state == REGISTRY_LOADING)
                retire_v(e, v, "admin request", &rel);
        }
    } else {
        vrec *v = find_v(e, version);
        if (!v || (v->state != REGISTRY_READY && v->state != REGISTRY_LOADING)) {
            pthread_rwlock_unlock(&r->lock);
            return rq_status_set(st, RQ_NOT_FOUND, "model '%s' version %lld is not loaded", sn,
                                 (long long)version);
        }
        v->blocked = 1;
        v->pinned = v->reload = v->retry = 0;
        retire_v(e, v, "admin request", &rel);
        decide(r, e, clock_mono_ms(), &rel);
    }
    pthread_rwlock_unlock(&r->lock);
    reg_relist_run(&rel);
    reg_wake_worker(r, 0);
    rq_status_ok(st);
    return 0;
}

/* ---- lookups ----------------------------------------------------------------- */

/* "1, 3" or "none". */
static void ready_list(const entry *e, char *out, size_t n)
{
    size_t len = 0;
    out[0] = '\0';
    for (int j = 0; j < e->n_v && len + 24 < n; j++) {
        if (e->v[j].state != REGISTRY_READY) continue;
        len += (size_t)snprintf(out + len, n - len, "%s%lld", len ? ", " : "",
                                (long long)e->v[j].version);
    }
    if (!len) snprintf(out, n, "none");
}

registry_model *registry_acquire(registry *r, const char *name, int64_t version, rq_status *st)
{
    char sn[160];
    reg_safe_name(name, sn, sizeof sn);
    if (!name || !*name) {
        rq_status_set(st, RQ_INVALID_ARGUMENT, "model: required (the model name)");
        return NULL;
    }
    if (version < 0) {
        rq_status_set(st, RQ_INVALID_ARGUMENT, "model_version: must be >= 0 (0 = newest ready), got %lld",
                      (long long)version);
        return NULL;
    }
    pthread_rwlock_rdlock(&r->lock);
    entry *e = reg_find_entry(r, name);
    registry_model *m = NULL;
    if (!e) {
        rq_status_set(st, RQ_NOT_FOUND, "model '%s' not found", sn);
        goto out;
    }
    if (e->unloaded) {
        rq_status_set(st, RQ_NOT_FOUND, "model '%s' is unloaded", sn);
        goto out;
    }
    if (version == 0) {
        for (int j = 0; j < e->n_v && !m; j++)
            if (e->v[j].state == REGISTRY_READY) m = e->v[j].inst;
        if (!m) {
            const vrec *v = NULL;
            for (int j = 0; j < e->n_v && !v; j++)
                if (e->v[j].state == REGISTRY_LOADING) v = &e->v[j];
            if (!v && e->n_v) v = &e->v[0];
            if (v && v->state == REGISTRY_LOADING)
                rq_status_set(st, RQ_UNAVAILABLE, "model '%s' is loading", sn);
            else if (v && v->version > 0)
                rq_status_set(st, RQ_UNAVAILABLE,
                              "model '%s' has no ready version: version %lld %s: %s", sn,
                              (long long)v->version, registry_state_name(v->state), v->message);
            else
                rq_status_set(st, RQ_UNAVAILABLE, "model '%s' has no ready version: %s", sn,
                              v ? v->message : "no versions");
            goto out;
        }
    } else {
        const vrec *v = find_v(e, version);
        if (v && v->state == REGISTRY_READY) {
            m = v->inst;
        } else if (v && v->state == REGISTRY_LOADING) {
            rq_status_set(st, RQ_UNAVAILABLE, "model '%s' version %lld is loading", sn,
                          (long long)version);
            goto out;
        } else {
            char ready[128];
            ready_list(e, ready, sizeof ready);
            rq_status_set(st, RQ_NOT_FOUND, "model '%s' version %lld not found (ready: %s)", sn,
                          (long long)version, ready);
            goto out;
        }
    }
    atomic_fetch_add_explicit(&m->refs, 1, memory_order_relaxed);
out:
    pthread_rwlock_unlock(&r->lock);
    return m;
}

