/* plan.h - the plan report of a loaded model (engine-internal; ikbo.h has
 * the public entry points).
 *
 * Why this exists: a ranking engineer deploying a model written in
 * broadcast form needs to see what the planner made of it - per model.json
 * layer its domain, where it runs (U or C rows), the rewrite applied or why
 * it broadcasts, the weight split, and FLOPs and bytes per candidate before
 * and after. build/ikbo-plan, GET /v1/models/{name} and ModelInfo show this
 * one report. Manual models get the same report (their mixing ops are the
 * IKBO reads; "before" is broadcast mode).
 *
 * Ownership: the entries belong to the model_def (model_def_free frees
 * them). The renderers return malloc'd text / a new json_t reference.
 * Thread-safety: read-only after load.
 */
#ifndef IKBO_PLAN_H
#define IKBO_PLAN_H

#include <jansson.h>

#include "model.h"

/* bf: the model as written (the broadcast form of an auto model); m: the
 * model as it runs, each layer's origin indexing e. e: one entry per bf
 * layer (names, rewrites, notes; stolen): the auto planner's, or
 * md_plan_manual_entries(bf), either marked by the fold. Fills m->plan
 * with the costs. */
void md_plan_build(const model_def *bf, model_def *m, md_plan_entry *e);

/* A manual model's entries: its own layers, as written (NULL on out of
 * memory; md_plan_build takes them). */
md_plan_entry *md_plan_manual_entries(const model_def *m);

/* Per-candidate totals at `ratio` candidates per user. */
typedef struct md_plan_totals {
    double flops[2], bytes[2]; /* [0] as written (broadcast form), [1] as planned */
    int gathers;               /* broadcast layers (MD_BROADCAST) */
    double gather_bytes;       /* their fp32 bytes per candidate */
    int rewritten;             /* layers with a Type I, map-read or fold rewrite */
} md_plan_totals;
void md_plan_totals_of(const model_def *m, double ratio, md_plan_totals *t);

/* The report as text (a table and the totals) or JSON (plan.c documents
 * the keys; README's "Plan report" too). NULL on out of memory. */
char *md_plan_text(const model_def *m, double ratio);
json_t *md_plan_json(const model_def *m, double ratio);

/* How model.json names a value reference ("user.dense", a layer name). */
const char *md_value_ref_text(const model_def *m, md_ref r);

/* "user", "type1", ... (the JSON's "rewrite" values). */
const char *md_rewrite_name(enum md_rewrite rw);

/* Text or JSON, malloc'd (ikbo_model_plan); NULL on out of memory. */
char *md_plan_render(const model_def *m, int json, double ratio);
void md_plan_summary(const model_def *m, double ratio, ikbo_plan_summary *out);

void md_plan_free(md_plan *p);

#endif
