/* registry_view.c - what the registry shows: per-model views for the
 * transports, readiness, the memory gauge collector and the ModelInfo
 * message. Read-only over the table (read lock). */
#include "registry_impl.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- views -------------------------------------------------------------------- */

static void fill_views(const entry *e, registry_version_view *vv)
{
    for (int j = 0; j < e->n_v; j++) {
        const vrec *v = &e->v[j];
        vv[j].version = v->version;
        vv[j].state = v->state;
        vv[j].message = v->message;
        vv[j].load_seconds = v->load_seconds;
        vv[j].info = v->inst ? ikbo_model_get_info(v->inst->model) : NULL;
        vv[j].serving = v->inst ? &v->inst->serving : NULL;
        vv[j].model = v->inst ? v->inst->model : NULL;
    }
}

void registry_foreach(registry *r, registry_visit_fn fn, void *ctx)
{
    pthread_rwlock_rdlock(&r->lock);
    for (int i = 0; i < r->n_entries; i++) {
        const entry *e = &r->entries[i];
        registry_version_view vv[e->n_v > 0 ? e->n_v : 1];
        fill_views(e, vv);
        registry_entry_view ev = {
            .name = e->name, .versions = vv, .n_versions = e->n_v, .unloaded = e->unloaded};
        fn(&ev, ctx);
    }
    pthread_rwlock_unlock(&r->lock);
}

int registry_acquire_ready(registry *r, registry_model ***out)
{
    *out = NULL;
    pthread_rwlock_rdlock(&r->lock);
    int n = 0;
    for (int i = 0; i < r->n_entries; i++)
        for (int j = 0; j < r->entries[i].n_v; j++)
            n += r->entries[i].v[j].state == REGISTRY_READY && r->entries[i].v[j].inst;
    registry_model **hs = n ? malloc((size_t)n * sizeof *hs) : NULL;
    if (n && !hs) {
        pthread_rwlock_unlock(&r->lock);
        return -1;
    }
    int k = 0;
    for (int i = 0; i < r->n_entries; i++)
        for (int j = 0; j < r->entries[i].n_v; j++) {
            const vrec *v = &r->entries[i].v[j];
            if (v->state == REGISTRY_READY && v->inst) hs[k++] = registry_model_ref(v->inst);
        }
    pthread_rwlock_unlock(&r->lock);
    *out = hs;
    return k;
}

void registry_model_stats(const registry_model *m, ikbo_stats *out)
{
    memset(out, 0, sizeof *out);
    if (m->model) ikbo_get_stats(m->model, out);
}

void registry_collect_memory(metrics_family *f, void *reg)
{
    static const char *const tag_kind[BK_TAG_COUNT] = {
        [BK_TAG_USER] = "user", [BK_TAG_CAND] = "candidate",
        [BK_TAG_BROADCAST] = "broadcast", [BK_TAG_INDEX] = "index"};
    registry_model **hs;
    int n = registry_acquire_ready(reg, &hs);
    metrics_family_clear(f);
    for (int i = 0; i < n; i++) {
        ikbo_stats st;
        registry_model_stats(hs[i], &st);
        const ikbo_model_info *mi = registry_model_info(hs[i]);
        char ver[32];
        snprintf(ver, sizeof ver, "%lld", (long long)registry_model_version(hs[i]));
        const char *dev = mi && mi->device ? mi->device : hs[i]->serving.device;
        const char *labels[] = {registry_model_name(hs[i]), ver, dev, "weights"};
        metrics_set_l(f, labels, (double)st.weight_bytes);
        for (int t = 0; t < BK_TAG_COUNT; t++) {
            labels[3] = tag_kind[t];
            metrics_set_l(f, labels, (double)st.bytes_live[t]);
        }
    }
    /* Releasing may free a version retired meanwhile: outside every lock. */
    for (int i = 0; i < n; i++) registry_release(hs[i]);
    free(hs);
}

static int entry_ready(const entry *e)
{
    if (e->unloaded) return 0;
    for (int j = 0; j < e->n_v; j++)
        if (e->v[j].state == REGISTRY_READY) return 1;
    return 0;
}

int registry_model_ready(registry *r, const char *name)
{
    pthread_rwlock_rdlock(&r->lock);
    entry *e = reg_find_entry(r, name);
    int ready = e ? entry_ready(e) : -1;
    pthread_rwlock_unlock(&r->lock);
    return ready;
}

int registry_all_ready(registry *r, char *why, size_t why_size)
{
    int ok = 1, live = 0;
    pthread_rwlock_rdlock(&r->lock);
    for (int i = 0; ok && i < r->n_entries; i++) {
        const entry *e = &r->entries[i];
        /* A model added while serving does not take the server out of
         * rotation while it loads (or if its first load fails). */
        if (e->unloaded || !(e->initial || e->ever_ready)) continue;
        live++;
        if (entry_ready(e)) continue;
        ok = 0;
        const vrec *v = NULL;
        for (int j = 0; j < e->n_v && !v; j++)
            if (e->v[j].state == REGISTRY_LOADING) v = &e->v[j];
        if (!v && e->n_v) v = &e->v[0];
        if (v && v->state == REGISTRY_LOADING)
            snprintf(why, why_size, "model '%s' version %lld is loading", e->name,
                     (long long)v->version);
        else if (v && v->version > 0)
            snprintf(why, why_size, "model '%s' version %lld %s: %s", e->name,
                     (long long)v->version, registry_state_name(v->state), v->message);
        else
            snprintf(why, why_size, "model '%s': %s", e->name, v ? v->message : "no versions");
    }
    if (ok && !live) {
        snprintf(why, why_size, r->n_entries ? "every model is unloaded" : "no models in %s",
                 r->repository);
        ok = 0;
    }
    pthread_rwlock_unlock(&r->lock);
    return ok;
}

/* ---- ModelInfo ------------------------------------------------------------------ */

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

static int describe_plan(const ikbo_model *model, Ikbo__V1__ModelVersionInfo *v)
{
    ikbo_plan_summary ps;
    ikbo_model_plan_summary(model, REGISTRY_PLAN_RATIO, &ps);
    Ikbo__V1__PlanSummary *p = malloc(sizeof *p);
    if (!p) return -1;
    ikbo__v1__plan_summary__init(p);
    v->plan = p;
    if (!(p->planning = strdup(ps.is_auto ? "auto" : "manual"))) return -1;
    p->layers = (uint32_t)ps.layers;
    p->rewritten = (uint32_t)ps.rewritten;
    p->gathers = (uint32_t)ps.gathers;
    p->flops_per_candidate_before = ps.flops_before;
    p->flops_per_candidate_after = ps.flops_after;
    p->gather_bytes_per_candidate = ps.gather_bytes;
    p->plan_ratio = REGISTRY_PLAN_RATIO;
    return 0;
}

/* Fills d for entry e; everything malloc'd so protobuf_c_message_free_unpacked
 * with the default allocator frees it. Returns -1 on allocation failure
 * (d stays freeable). */
static int describe_entry(const registry *r, const entry *e, Ikbo__V1__ModelDescription *d)
{
    if (!(d->name = strdup(e->name))) return -1;
    const ikbo_model_info *mi = NULL;
    for (int j = 0; j < e->n_v && !mi; j++)
        if (e->v[j].inst) mi = ikbo_model_get_info(e->v[j].inst->model);
    const char *mode = ikbo_mode_name(r->mode);
    const char *device = r->device;
    if (mi) {
        mode = ikbo_mode_name(mi->mode);
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
    if (e->n_v) {
        d->versions = calloc((size_t)e->n_v, sizeof *d->versions);
        if (!d->versions) return -1;
        for (int j = 0; j < e->n_v; j++) {
            const vrec *m = &e->v[j];
            Ikbo__V1__ModelVersionInfo *v = malloc(sizeof *v);
            if (!v) return -1;
            ikbo__v1__model_version_info__init(v);
            d->versions[d->n_versions++] = v;
            v->version = m->version;
            if (!(v->state = strdup(registry_state_name(m->state)))) return -1;
            if (!(v->message = strdup(m->message))) return -1;
            if (m->inst && describe_plan(m->inst->model, v)) return -1;
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
        entry *e = reg_find_entry(r, name);
        if (!e) {
            pthread_rwlock_unlock(&r->lock);
            char sn[160];
            reg_safe_name(name, sn, sizeof sn);
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

