/* registry.c - loaded models, versions, states and refcounted handles
 * (see registry.h). */
#include "registry.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "log.h"

struct registry_model {
    _Atomic int refs;
    char *name;
    char *dir;
    int64_t version;
    /* state, message, load_seconds and model change only under the
     * registry's write lock, and only while the version is not READY. */
    enum registry_state state;
    char message[512];
    double load_seconds;
    ikbo_model *model;
    /* ctx[i] is touched only by the thread that owns slot i. */
    ikbo_ctx **ctx;
    int n_slots;
};

typedef struct entry {
    char *name;
    registry_model **versions; /* newest first */
    int n_versions;
} entry;

struct registry {
    pthread_rwlock_t lock;
    entry *entries; /* sorted by name */
    int n_entries;
    char *repository;
    char *device;
    enum ikbo_mode mode;
    int n_slots;
};

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
static void safe_name(const char *s, char *out, size_t n)
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

static registry_model *model_new(const char *name, const char *repo, int64_t version,
                                 int n_slots)
{
    registry_model *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    atomic_init(&m->refs, 1);
    m->name = strdup(name);
    m->version = version;
    m->n_slots = n_slots;
    m->ctx = calloc((size_t)n_slots, sizeof *m->ctx);
    size_t dl = strlen(repo) + strlen(name) + 32;
    m->dir = malloc(dl);
    if (!m->name || !m->ctx || !m->dir) {
        free(m->name);
        free(m->ctx);
        free(m->dir);
        free(m);
        return NULL;
    }
    if (version > 0)
        snprintf(m->dir, dl, "%s/%s/%lld", repo, name, (long long)version);
    else
        snprintf(m->dir, dl, "%s/%s", repo, name);
    m->state = REGISTRY_LOADING;
    return m;
}

static void model_destroy(registry_model *m)
{
    for (int i = 0; i < m->n_slots; i++)
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
        model_destroy(m);
}

static int is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Highest all-digit subdirectory of dir (a version), 0 when none, -1 when
 * dir cannot be read. */
static int64_t highest_version(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return -1;
    int64_t best = 0;
    struct dirent *de;
    char path[4096];
    while ((de = readdir(d)) != NULL) {
        const char *s = de->d_name;
        size_t n = strlen(s);
        if (n == 0 || n > 18) continue;
        int digits = 1;
        for (size_t i = 0; i < n; i++) digits = digits && isdigit((unsigned char)s[i]);
        if (!digits) continue;
        int64_t v = strtoll(s, NULL, 10);
        if (v <= 0 || v <= best) continue;
        snprintf(path, sizeof path, "%s/%s", dir, s);
        if (is_dir(path)) best = v;
    }
    closedir(d);
    return best;
}

static int cmp_entry(const void *a, const void *b)
{
    return strcmp(((const entry *)a)->name, ((const entry *)b)->name);
}

static int add_entry(registry *r, const char *name, ikbo_err *err)
{
    for (int i = 0; i < r->n_entries; i++)
        if (strcmp(r->entries[i].name, name) == 0) return 0; /* listed twice */
    entry *grown = realloc(r->entries, (size_t)(r->n_entries + 1) * sizeof *grown);
    if (!grown) goto oom;
    r->entries = grown;
    entry *e = &r->entries[r->n_entries];
    memset(e, 0, sizeof *e);
    e->name = strdup(name);
    e->versions = calloc(1, sizeof *e->versions);
    if (!e->name || !e->versions) {
        free(e->name);
        free(e->versions);
        goto oom;
    }
    r->n_entries++;

    char dir[4096];
    snprintf(dir, sizeof dir, "%s/%s", r->repository, name);
    int64_t v = highest_version(dir);
    registry_model *m = model_new(name, r->repository, v > 0 ? v : 0, r->n_slots);
    if (!m) goto oom;
    e->versions[0] = m;
    e->n_versions = 1;
    if (v < 0) {
        m->state = REGISTRY_FAILED;
        snprintf(m->message, sizeof m->message, "%.400s: model directory not found", dir);
    } else if (v == 0) {
        m->state = REGISTRY_FAILED;
        snprintf(m->message, sizeof m->message, "%.400s: no version directory (<N>/model.json)",
                 dir);
    }
    return 0;
oom:
    bk_seterr(err, "registry: out of memory");
    return -1;
}

registry *registry_new(const registry_opts *o, ikbo_err *err)
{
    registry *r = calloc(1, sizeof *r);
    if (!r) {
        bk_seterr(err, "registry: out of memory");
        return NULL;
    }
    pthread_rwlock_init(&r->lock, NULL);
    r->repository = strdup(o->repository ? o->repository : "models");
    r->device = strdup(o->device ? o->device : "cpu");
    r->mode = o->mode;
    r->n_slots = o->n_slots > 0 ? o->n_slots : 1;
    if (!r->repository || !r->device) {
        bk_seterr(err, "registry: out of memory");
        goto fail;
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
        for (int i = 0; i < o->n_models; i++)
            if (add_entry(r, o->models[i], err)) goto fail;
    } else {
        DIR *d = opendir(r->repository);
        if (!d) {
            bk_seterr(err, "model repository %s: %s", r->repository, strerror(errno));
            goto fail;
        }
        struct dirent *de;
        char path[4096];
        while ((de = readdir(d)) != NULL) {
            if (de->d_name[0] == '.') continue;
            snprintf(path, sizeof path, "%s/%s", r->repository, de->d_name);
            if (!is_dir(path) || highest_version(path) <= 0) continue;
            if (add_entry(r, de->d_name, err)) {
                closedir(d);
                goto fail;
            }
        }
        closedir(d);
    }
    qsort(r->entries, (size_t)r->n_entries, sizeof *r->entries, cmp_entry);
    return r;
fail:
    registry_free(r);
    return NULL;
}

void registry_free(registry *r)
{
    if (!r) return;
    for (int i = 0; i < r->n_entries; i++) {
        for (int j = 0; j < r->entries[i].n_versions; j++)
            registry_release(r->entries[i].versions[j]);
        free(r->entries[i].versions);
        free(r->entries[i].name);
    }
    free(r->entries);
    free(r->repository);
    free(r->device);
    pthread_rwlock_destroy(&r->lock);
    free(r);
}

const char *registry_device(const registry *r) { return r->device; }
enum ikbo_mode registry_mode(const registry *r) { return r->mode; }

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int registry_load_all(registry *r, const volatile int *stop)
{
    int ready = 0;
    for (int i = 0; i < r->n_entries; i++) {
        for (int j = 0; j < r->entries[i].n_versions; j++) {
            if (stop && *stop) return ready;
            registry_model *m = r->entries[i].versions[j];
            pthread_rwlock_rdlock(&r->lock);
            enum registry_state st = m->state;
            pthread_rwlock_unlock(&r->lock);
            if (st == REGISTRY_FAILED) {
                log_line ln;
                log_begin(&ln, LOG_LEVEL_ERROR, "model_load");
                log_str(&ln, "model", m->name);
                log_str(&ln, "state", "FAILED");
                log_str(&ln, "error", m->message);
                log_end(&ln);
                continue;
            }
            if (st != REGISTRY_LOADING) {
                ready += st == REGISTRY_READY;
                continue;
            }
            /* Nobody reads m->model while it is LOADING, so the load runs
             * without the lock. */
            ikbo_load_opts lo = {.device = r->device, .mode = r->mode};
            ikbo_err err;
            memset(&err, 0, sizeof err);
            double t0 = now_seconds();
            ikbo_model *model = ikbo_model_load(m->dir, &lo, &err);
            double secs = now_seconds() - t0;

            pthread_rwlock_wrlock(&r->lock);
            m->load_seconds = secs;
            if (model) {
                m->model = model;
                m->state = REGISTRY_READY;
                m->message[0] = '\0';
                ready++;
            } else {
                m->state = REGISTRY_FAILED;
                snprintf(m->message, sizeof m->message, "%s", err.msg[0] ? err.msg : "load failed");
            }
            pthread_rwlock_unlock(&r->lock);

            log_line ln;
            log_begin(&ln, model ? LOG_LEVEL_INFO : LOG_LEVEL_ERROR, "model_load");
            log_str(&ln, "model", m->name);
            log_int(&ln, "version", m->version);
            log_str(&ln, "state", registry_state_name(m->state));
            log_num(&ln, "seconds", secs, 3);
            log_str(&ln, "device", r->device);
            log_str(&ln, "mode", r->mode == IKBO_MODE_BROADCAST ? "broadcast" : "ikbo");
            log_str(&ln, "dir", m->dir);
            if (!model) log_str(&ln, "error", m->message);
            log_end(&ln);
        }
    }
    return ready;
}

static entry *find_entry(registry *r, const char *name)
{
    if (!name) return NULL;
    entry key = {.name = (char *)name};
    return bsearch(&key, r->entries, (size_t)r->n_entries, sizeof *r->entries, cmp_entry);
}

/* "1, 3" or "none". */
static void ready_list(const entry *e, char *out, size_t n)
{
    size_t len = 0;
    out[0] = '\0';
    for (int j = 0; j < e->n_versions && len + 24 < n; j++) {
        if (e->versions[j]->state != REGISTRY_READY) continue;
        len += (size_t)snprintf(out + len, n - len, "%s%lld", len ? ", " : "",
                                (long long)e->versions[j]->version);
    }
    if (!len) snprintf(out, n, "none");
}

registry_model *registry_acquire(registry *r, const char *name, int64_t version, rq_status *st)
{
    char sn[160];
    safe_name(name, sn, sizeof sn);
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
    entry *e = find_entry(r, name);
    registry_model *m = NULL;
    if (!e) {
        rq_status_set(st, RQ_NOT_FOUND, "model '%s' not found", sn);
        goto out;
    }
    if (version == 0) {
        for (int j = 0; j < e->n_versions && !m; j++)
            if (e->versions[j]->state == REGISTRY_READY) m = e->versions[j];
        if (!m) {
            const registry_model *v = e->n_versions ? e->versions[0] : NULL;
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
        registry_model *v = NULL;
        for (int j = 0; j < e->n_versions && !v; j++)
            if (e->versions[j]->version == version) v = e->versions[j];
        if (v && v->state == REGISTRY_READY) {
            m = v;
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

const char *registry_model_name(const registry_model *m) { return m->name; }
int64_t registry_model_version(const registry_model *m) { return m->version; }

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

static void fill_views(const entry *e, registry_version_view *vv)
{
    for (int j = 0; j < e->n_versions; j++) {
        const registry_model *m = e->versions[j];
        vv[j].version = m->version;
        vv[j].state = m->state;
        vv[j].message = m->message;
        vv[j].load_seconds = m->load_seconds;
        vv[j].info = m->state == REGISTRY_READY ? ikbo_model_get_info(m->model) : NULL;
    }
}

void registry_foreach(registry *r, registry_visit_fn fn, void *ctx)
{
    pthread_rwlock_rdlock(&r->lock);
    for (int i = 0; i < r->n_entries; i++) {
        const entry *e = &r->entries[i];
        registry_version_view vv[e->n_versions > 0 ? e->n_versions : 1];
        fill_views(e, vv);
        registry_entry_view ev = {.name = e->name, .versions = vv, .n_versions = e->n_versions};
        fn(&ev, ctx);
    }
    pthread_rwlock_unlock(&r->lock);
}

static int entry_ready(const entry *e)
{
    for (int j = 0; j < e->n_versions; j++)
        if (e->versions[j]->state == REGISTRY_READY) return 1;
    return 0;
}

int registry_model_ready(registry *r, const char *name)
{
    pthread_rwlock_rdlock(&r->lock);
    entry *e = find_entry(r, name);
    int ready = e ? entry_ready(e) : -1;
    pthread_rwlock_unlock(&r->lock);
    return ready;
}

int registry_all_ready(registry *r, char *why, size_t why_size)
{
    int ok = 1;
    pthread_rwlock_rdlock(&r->lock);
    if (r->n_entries == 0) {
        snprintf(why, why_size, "no models in %s", r->repository);
        ok = 0;
    }
    for (int i = 0; ok && i < r->n_entries; i++) {
        const entry *e = &r->entries[i];
        if (entry_ready(e)) continue;
        ok = 0;
        const registry_model *v = e->n_versions ? e->versions[0] : NULL;
        if (v && v->state == REGISTRY_LOADING)
            snprintf(why, why_size, "model '%s' version %lld is loading", e->name,
                     (long long)v->version);
        else if (v && v->version > 0)
            snprintf(why, why_size, "model '%s' version %lld %s: %s", e->name,
                     (long long)v->version, registry_state_name(v->state), v->message);
        else
            snprintf(why, why_size, "model '%s': %s", e->name, v ? v->message : "no versions");
    }
    pthread_rwlock_unlock(&r->lock);
    return ok;
}

/* ---- ModelInfo -------------------------------------------------------- */

static char **dup_strv(const char *const *s, int n)
{
    char **out = calloc((size_t)(n > 0 ? n : 1), sizeof *out);
    if (!out) return NULL;
    for (int i = 0; i < n; i++) {
        out[i] = strdup(s[i]);
        if (!out[i]) {
            for (int j = 0; j < i; j++) free(out[j]);
            free(out);
            return NULL;
        }
    }
    return out;
}

/* Fills d for entry e; everything malloc'd so protobuf_c_message_free_unpacked
 * with the default allocator frees it. Returns -1 on allocation failure
 * (d stays freeable). */
static int describe_entry(const registry *r, const entry *e, Ikbo__V1__ModelDescription *d)
{
    if (!(d->name = strdup(e->name))) return -1;
    const ikbo_model_info *mi = NULL;
    for (int j = 0; j < e->n_versions && !mi; j++)
        if (e->versions[j]->state == REGISTRY_READY) mi = ikbo_model_get_info(e->versions[j]->model);
    const char *mode = r->mode == IKBO_MODE_BROADCAST ? "broadcast" : "ikbo";
    const char *device = r->device;
    if (mi) {
        mode = mi->mode == IKBO_MODE_BROADCAST ? "broadcast" : "ikbo";
        if (mi->device) device = mi->device;
        d->user_dense = (uint32_t)mi->user_dense;
        d->candidate_dense = (uint32_t)mi->cand_dense;
        if (mi->n_user_sparse) {
            if (!(d->user_sparse = dup_strv(mi->user_sparse, mi->n_user_sparse))) return -1;
            d->n_user_sparse = (size_t)mi->n_user_sparse;
        }
        if (mi->n_cand_sparse) {
            if (!(d->candidate_sparse = dup_strv(mi->cand_sparse, mi->n_cand_sparse))) return -1;
            d->n_candidate_sparse = (size_t)mi->n_cand_sparse;
        }
        if (mi->n_tasks) {
            if (!(d->tasks = dup_strv(mi->tasks, mi->n_tasks))) return -1;
            d->n_tasks = (size_t)mi->n_tasks;
            if (!(d->score_weights = malloc((size_t)mi->n_tasks * sizeof(float)))) return -1;
            memcpy(d->score_weights, mi->score_weights, (size_t)mi->n_tasks * sizeof(float));
            d->n_score_weights = (size_t)mi->n_tasks;
        }
        if (mi->has_history) {
            Ikbo__V1__HistoryInfo *h = malloc(sizeof *h);
            if (!h) return -1;
            ikbo__v1__history_info__init(h);
            h->max_len = (uint32_t)mi->hist_max_len;
            h->actions = (uint32_t)mi->hist_actions;
            d->history = h;
        }
    }
    if (!(d->mode = strdup(mode)) || !(d->device = strdup(device))) return -1;
    if (e->n_versions) {
        d->versions = calloc((size_t)e->n_versions, sizeof *d->versions);
        if (!d->versions) return -1;
        for (int j = 0; j < e->n_versions; j++) {
            const registry_model *m = e->versions[j];
            Ikbo__V1__ModelVersionInfo *v = malloc(sizeof *v);
            if (!v) return -1;
            ikbo__v1__model_version_info__init(v);
            d->versions[d->n_versions++] = v;
            v->version = m->version;
            if (!(v->state = strdup(registry_state_name(m->state)))) return -1;
            if (!(v->message = strdup(m->message))) return -1;
        }
    }
    return 0;
}

Ikbo__V1__ModelInfoResponse *registry_describe(registry *r, const char *name, rq_status *st)
{
    Ikbo__V1__ModelInfoResponse *resp = malloc(sizeof *resp);
    if (!resp) {
        rq_status_set(st, RQ_INTERNAL, "out of memory");
        return NULL;
    }
    ikbo__v1__model_info_response__init(resp);
    pthread_rwlock_rdlock(&r->lock);
    int lo = 0, hi = r->n_entries;
    if (name && *name) {
        entry *e = find_entry(r, name);
        if (!e) {
            pthread_rwlock_unlock(&r->lock);
            char sn[160];
            safe_name(name, sn, sizeof sn);
            rq_status_set(st, RQ_NOT_FOUND, "model '%s' not found", sn);
            free(resp);
            return NULL;
        }
        lo = (int)(e - r->entries);
        hi = lo + 1;
    }
    int failed = 0;
    if (hi > lo) {
        resp->models = calloc((size_t)(hi - lo), sizeof *resp->models);
        failed = !resp->models;
    }
    for (int i = lo; i < hi && !failed; i++) {
        Ikbo__V1__ModelDescription *d = malloc(sizeof *d);
        if (!d) {
            failed = 1;
            break;
        }
        ikbo__v1__model_description__init(d);
        resp->models[resp->n_models++] = d;
        failed = describe_entry(r, &r->entries[i], d) != 0;
    }
    pthread_rwlock_unlock(&r->lock);
    if (failed) {
        registry_describe_free(resp);
        rq_status_set(st, RQ_INTERNAL, "out of memory");
        return NULL;
    }
    rq_status_ok(st);
    return resp;
}

void registry_describe_free(Ikbo__V1__ModelInfoResponse *resp)
{
    if (resp) protobuf_c_message_free_unpacked(&resp->base, NULL);
}
