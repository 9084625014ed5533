/* plan.c - the plan report: costs per layer, text and JSON (plan.h).
 *
 * Why this exists: see plan.h. Costs come from each op's cost callback
 * (engine/ops/), evaluated on the broadcast form for "before" (a
 * candidate-domain layer there does all its work per candidate, after its
 * user operands are copied to C rows) and on the planned model for "after"
 * (attributed to the model.json layer each planned layer comes from).
 *
 * JSON keys (README, "Plan report"): "model", "planning" ("auto" |
 * "manual"), "ratio", "layers" [{"name", "op", "domain", "rows" ("U" |
 * "C"), "rewrite", "note", "split", "flops_per_candidate" [before, after],
 * "bytes_per_candidate" [before, after]}], "executed" [{"name", "op",
 * "domain", "mixed", "from"}], "gathers" [{"layer", "input",
 * "bytes_per_candidate", "reason"}], "totals" {"flops_per_candidate",
 * "bytes_per_candidate", "gathers", "gather_bytes_per_candidate",
 * "rewritten"}.
 */
#define _POSIX_C_SOURCE 200809L /* open_memstream */

#include "plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "op.h"

static const char *const rw_names[MD_RW_COUNT] = {"user",    "candidate", "ikbo",  "type1",
                                                  "spliced", "map_read",  "gather", "folded"};

const char *md_rewrite_name(enum md_rewrite rw)
{
    return rw >= 0 && rw < MD_RW_COUNT ? rw_names[rw] : "?";
}

const char *md_value_ref_text(const model_def *m, md_ref r)
{
    switch (r.src) {
    case MD_SRC_LAYER: return m->layers[r.index].name;
    case MD_SRC_USER_DENSE: return "user.dense";
    case MD_SRC_CAND_DENSE: return "candidate.dense";
    case MD_SRC_USER_HISTORY: return "user.history";
    default: return "(sparse input)";
    }
}

/* fp32 bytes a layer writes per row of its domain (views write none). */
static double out_bytes(const model_def *m, const md_layer *l)
{
    if (md_ops[l->op]->flags & OP_VIEW) return 0;
    return 4.0 * md_layer_width(l) * md_events(m, l);
}

/* fp32 bytes of a user operand copied to one candidate row. */
static double operand_bytes(const model_def *m, md_ref r)
{
    if (r.src == MD_SRC_LAYER) {
        const md_layer *l = &m->layers[r.index];
        return 4.0 * md_layer_width(l) * md_events(m, l);
    }
    return 4.0 * md_ref_width(m, r);
}

static void cost_before(const model_def *bf, int i, md_plan_entry *e)
{
    const md_layer *l = &bf->layers[i];
    md_cost c = md_ops[l->op]->cost(bf, l);
    if (l->domain == MD_USER) {
        e->flops_u[0] = c.u + c.c;
        e->bytes_u[0] = out_bytes(bf, l);
        return;
    }
    e->flops_c[0] = c.u + c.c;
    e->bytes_c[0] = out_bytes(bf, l);
    for (int k = 0; k < l->n_in; k++)
        if (md_ref_domain(bf, l->in[k]) == MD_USER && l->in[k].src != MD_SRC_USER_SPARSE)
            e->bytes_c[0] += operand_bytes(bf, l->in[k]);
}

static void cost_after(const model_def *m, const md_layer *l, md_plan_entry *e)
{
    md_cost c = md_ops[l->op]->cost(m, l);
    if (l->domain == MD_USER) {
        e->flops_u[1] += c.u + c.c;
        e->bytes_u[1] += out_bytes(m, l);
    } else {
        e->flops_u[1] += c.u;
        e->flops_c[1] += c.c;
        e->bytes_c[1] += out_bytes(m, l);
    }
}

static int reads_user(const model_def *m, const md_layer *l)
{
    if (l->domain != MD_CAND || (md_ops[l->op]->flags & OP_INTERNAL)) return 0;
    for (int k = 0; k < l->n_in; k++)
        if (md_ref_domain(m, l->in[k]) == MD_USER) return 1;
    return 0;
}

md_plan_entry *md_plan_manual_entries(const model_def *m)
{
    md_plan_entry *e = calloc((size_t)m->n_layers, sizeof *e);
    for (int i = 0; e && i < m->n_layers; i++) {
        const md_layer *l = &m->layers[i];
        if (!(e[i].name = strdup(l->name))) {
            md_plan p = {.e = e, .n = i};
            md_plan_free(&p);
            return NULL;
        }
        e[i].op = l->op;
        e[i].domain = l->domain;
        e[i].rw = l->domain == MD_USER ? MD_RW_USER : reads_user(m, l) ? MD_RW_IKBO : MD_RW_CAND;
        if (e[i].rw == MD_RW_IKBO)
            snprintf(e[i].note, sizeof e[i].note, "reads user rows through the map");
    }
    return e;
}

void md_plan_build(const model_def *bf, model_def *m, md_plan_entry *e)
{
    int n = bf->n_layers;
    for (int i = 0; i < n; i++) cost_before(bf, i, &e[i]);
    for (int k = 0; k < m->n_layers; k++) cost_after(m, &m->layers[k], &e[m->layers[k].origin]);
    m->plan.e = e;
    m->plan.n = n;
}

void md_plan_totals_of(const model_def *m, double ratio, md_plan_totals *t)
{
    memset(t, 0, sizeof *t);
    for (int i = 0; i < m->plan.n; i++) {
        const md_plan_entry *e = &m->plan.e[i];
        for (int w = 0; w < 2; w++) {
            t->flops[w] += e->flops_c[w] + e->flops_u[w] / ratio;
            t->bytes[w] += e->bytes_c[w] + e->bytes_u[w] / ratio;
        }
        t->rewritten += e->rw == MD_RW_TYPE1 || e->rw == MD_RW_MAP_READ || e->rw == MD_RW_FOLDED;
    }
    for (int k = 0; k < m->n_layers; k++)
        if (m->layers[k].op == MD_BROADCAST) {
            t->gathers++;
            t->gather_bytes += out_bytes(m, &m->layers[k]);
        }
}

static json_t *pair(double a, double b) { return json_pack("[f, f]", a, b); }

static json_t *layers_json(const model_def *m, double ratio)
{
    json_t *arr = json_array();
    for (int i = 0; arr && i < m->plan.n; i++) {
        const md_plan_entry *e = &m->plan.e[i];
        json_t *o = json_pack(
            "{s:s, s:s, s:s, s:s, s:s, s:s, s:o, s:o}", "name", e->name, "op", md_ops[e->op]->name,
            "domain", e->domain == MD_USER ? "user" : "candidate", "rows",
            e->domain == MD_USER ? "U" : "C", "rewrite", md_rewrite_name(e->rw), "note", e->note,
            "flops_per_candidate",
            pair(e->flops_c[0] + e->flops_u[0] / ratio, e->flops_c[1] + e->flops_u[1] / ratio),
            "bytes_per_candidate",
            pair(e->bytes_c[0] + e->bytes_u[0] / ratio, e->bytes_c[1] + e->bytes_u[1] / ratio));
        if (!o || (e->split[0] && json_object_set_new(o, "split", json_string(e->split))) ||
            json_array_append_new(arr, o)) {
            json_decref(o);
            json_decref(arr);
            return NULL;
        }
    }
    return arr;
}

static json_t *executed_json(const model_def *m, json_t *gathers)
{
    json_t *arr = json_array();
    for (int k = 0; arr && k < m->n_layers; k++) {
        const md_layer *l = &m->layers[k];
        const md_plan_entry *e = &m->plan.e[l->origin];
        json_t *o = json_pack("{s:s, s:s, s:s, s:b, s:s}", "name", l->name, "op",
                              md_ops[l->op]->name, "domain",
                              l->domain == MD_USER ? "user" : "candidate", "mixed",
                              reads_user(m, l), "from", e->name);
        if (!o || json_array_append_new(arr, o)) goto fail;
        if (l->op != MD_BROADCAST) continue;
        o = json_pack("{s:s, s:s, s:f, s:s}", "layer", e->name, "input",
                      md_value_ref_text(m, l->in[0]), "bytes_per_candidate", out_bytes(m, l),
                      "reason", e->note);
        if (!o || json_array_append_new(gathers, o)) goto fail;
    }
    return arr;
fail:
    json_decref(arr);
    return NULL;
}

json_t *md_plan_json(const model_def *m, double ratio)
{
    md_plan_totals t;
    md_plan_totals_of(m, ratio, &t);
    json_t *gathers = json_array();
    json_t *exec = gathers ? executed_json(m, gathers) : NULL;
    json_t *o = json_pack("{s:s, s:s, s:f, s:o, s:o, s:o, s:{s:o, s:o, s:i, s:f, s:i}}", "model",
                          m->dir, "planning", m->plan.is_auto ? "auto" : "manual", "ratio", ratio,
                          "layers", layers_json(m, ratio), "executed", exec, "gathers", gathers,
                          "totals", "flops_per_candidate", pair(t.flops[0], t.flops[1]),
                          "bytes_per_candidate", pair(t.bytes[0], t.bytes[1]), "gathers",
                          t.gathers, "gather_bytes_per_candidate", t.gather_bytes, "rewritten",
                          t.rewritten);
    return o; /* json_pack's "o" steals even on failure */
}

static void text_layers(FILE *f, const model_def *m, double ratio)
{
    fprintf(f, "%-20s %-17s %-9s %-4s %-9s %21s %21s\n", "layer", "op", "domain", "rows",
            "rewrite", "kFLOP/cand bef->aft", "B/cand bef->aft");
    for (int i = 0; i < m->plan.n; i++) {
        const md_plan_entry *e = &m->plan.e[i];
        char fl[32], by[32];
        snprintf(fl, sizeof fl, "%.1f -> %.1f", (e->flops_c[0] + e->flops_u[0] / ratio) / 1e3,
                 (e->flops_c[1] + e->flops_u[1] / ratio) / 1e3);
        snprintf(by, sizeof by, "%.0f -> %.0f", e->bytes_c[0] + e->bytes_u[0] / ratio,
                 e->bytes_c[1] + e->bytes_u[1] / ratio);
        fprintf(f, "%-20s %-17s %-9s %-4s %-9s %21s %21s%s%s\n", e->name, md_ops[e->op]->name,
                e->domain == MD_USER ? "user" : "candidate", e->domain == MD_USER ? "U" : "C",
                md_rewrite_name(e->rw), fl, by, e->note[0] ? "  " : "", e->note);
    }
}

char *md_plan_text(const model_def *m, double ratio)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    md_plan_totals t;
    md_plan_totals_of(m, ratio, &t);
    fprintf(f, "model %s: planning %s, %d layers in model.json, %d run; %.0f candidates per user\n",
            m->dir, m->plan.is_auto ? "auto" : "manual", m->plan.n, m->n_layers, ratio);
    text_layers(f, m, ratio);
    int splits = 0;
    for (int i = 0; i < m->plan.n; i++)
        splits += m->plan.e[i].split[0] != 0;
    fprintf(f, "weight splits: %d\n", splits);
    for (int i = 0; i < m->plan.n; i++)
        if (m->plan.e[i].split[0])
            fprintf(f, "  %s: %s\n", m->plan.e[i].name, m->plan.e[i].split);
    fprintf(f, "gathers: %d (%.0f B per candidate)\n", t.gathers, t.gather_bytes);
    for (int k = 0; k < m->n_layers; k++)
        if (m->layers[k].op == MD_BROADCAST)
            fprintf(f, "  %s -> %s: %s\n", md_value_ref_text(m, m->layers[k].in[0]),
                    m->layers[k].name, m->plan.e[m->layers[k].origin].note);
    fprintf(f, "per candidate: %.1f kFLOP -> %.1f kFLOP, %.0f B -> %.0f B written; %d rewritten\n",
            t.flops[0] / 1e3, t.flops[1] / 1e3, t.bytes[0], t.bytes[1], t.rewritten);
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

char *md_plan_render(const model_def *m, int json, double ratio)
{
    if (!json) return md_plan_text(m, ratio);
    json_t *o = md_plan_json(m, ratio);
    char *s = o ? json_dumps(o, JSON_INDENT(1) | JSON_REAL_PRECISION(6)) : NULL;
    json_decref(o);
    return s;
}

void md_plan_summary(const model_def *m, double ratio, ikbo_plan_summary *out)
{
    md_plan_totals t;
    md_plan_totals_of(m, ratio, &t);
    *out = (ikbo_plan_summary){.is_auto = m->plan.is_auto, .layers = m->plan.n,
                               .rewritten = t.rewritten, .gathers = t.gathers,
                               .flops_before = t.flops[0], .flops_after = t.flops[1],
                               .bytes_before = t.bytes[0], .bytes_after = t.bytes[1],
                               .gather_bytes = t.gather_bytes};
}

int ikbo_plan_dir(const char *dir, int json, double ratio, char **out, ikbo_err *err)
{
    model_def *m;
    if (model_def_load(dir, &m, err)) return -1;
    *out = md_plan_render(m, json, ratio);
    model_def_free(m);
    if (*out) return 0;
    bk_seterr(err, "%s: out of memory rendering the plan", dir);
    return -1;
}

void md_plan_free(md_plan *p)
{
    for (int i = 0; p->e && i < p->n; i++) free(p->e[i].name);
    free(p->e);
    p->e = NULL;
    p->n = 0;
}
