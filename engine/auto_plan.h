/* auto_plan.h - the automatic IKBO planner: a broadcast-form model.json
 * rewritten into an IKBO one (engine-internal).
 *
 * Why this exists: ranking models are usually written with user tensors
 * broadcast to candidates before the interaction layers. MODEL_FORMAT.md's
 * "planning": "auto" lets such a model be deployed as written; this pass
 * turns its planned broadcast form (every layer's domain and shape known)
 * into the model a person would have written by hand with the IKBO ops, as
 * a model.json document that the loader then plans with the manual rules
 * (model_load.c: two passes). Nothing here runs per request.
 *
 * The rewrites (MODEL_FORMAT.md's numbered rules):
 *   1. a layer whose inputs are all user-domain stays at U;
 *   2. Type I: token_linear over a mixed stack becomes lce (weight columns
 *      split by token); linear over a mixed concat becomes a user linear at
 *      U (no bias) added through the map to a candidate linear (the bias),
 *      then its activation; dot_interaction over a mixed stack reads the
 *      stack's parts directly;
 *   3. add, mul, lce and the attentions read user operands through the
 *      map, as they do in manual models; a mixed stack or concat that some
 *      other op needs whole is built at C rows with its user parts read
 *      through the map (it never holds a separate user copy);
 *   4. any other candidate-domain op with a user operand gets an explicit
 *      `broadcast` layer (internal op): the plan's gather, counted.
 *
 * Ownership: ap_rewrite allocates *out; ap_result_free releases it. Not
 * thread-safe (one load).
 */
#ifndef IKBO_AUTO_PLAN_H
#define IKBO_AUTO_PLAN_H

#include <jansson.h>

#include "model.h"

/* Where one weight of a rewritten layer comes from: weight src_w of the
 * broadcast-form layer src (columns cols[0..n_cols) in order, or all of
 * them when cols is NULL), or zeros when src < 0. With fold_d > 0 (fold.h):
 * the folded weight of w_cand = (src, src_w) and w_top = (fold_src, 0)
 * over fold_d columns a token. With comp (fold.h's composed user part,
 * fold_compose): AP_COMP_WEIGHT, that folded weight over cols, then the
 * columns of tokens ccols[0..n_ccols) composed with the weight of linear
 * comp_src; AP_COMP_BIAS, those tokens' columns times comp_src's bias. */
enum { AP_COMP_NONE = 0, AP_COMP_WEIGHT, AP_COMP_BIAS };
/* With n_wo (fold.h's composed attention parts, fold_compose_wo): after the
 * fold, the fold_d columns of each token tok .. tok + the layer's tokens - 1
 * are right-multiplied by target_attention `layer`'s wo. */
#define AP_MAX_WO 4
typedef struct ap_wo {
    int layer, tok;
} ap_wo;
typedef struct ap_wsrc {
    int src, src_w;
    int *cols;
    int n_cols;
    int fold_src, fold_d;
    int comp, comp_src;
    int *ccols;
    int n_ccols;
    ap_wo wo[AP_MAX_WO];
    int n_wo;
} ap_wsrc;

/* One layer of the rewritten document, in its order. */
typedef struct ap_layer {
    int origin; /* the broadcast-form layer it comes from */
    int copy;   /* 1: the origin's layer itself; its weights are taken as they are */
    ap_wsrc w[MD_MAX_WEIGHTS];
    int n_w;
} ap_layer;

typedef struct ap_result {
    json_t *root; /* the rewritten model.json ("planning" removed) */
    ap_layer *l;
    int n, cap;
    md_plan_entry *e; /* one per broadcast-form layer: name, op, domain, rw, note, split */
    int n_e;
} ap_result;

/* m: the broadcast form, planned (weights may be absent); root: its
 * model.json. Returns 0, or -1 with err naming the layer. */
int ap_rewrite(const model_def *m, const json_t *root, ap_result **out, bk_err *err);

/* Fills the rewritten model's weights from the broadcast form's (no-op
 * where from has no weight data: model_def_plan). -1 on out of memory. */
int ap_take_weights(const ap_result *r, model_def *from, model_def *to, bk_err *err);

void ap_result_free(ap_result *r);

/* Shared with fold.c. ap_emit appends layer object o (stolen) to arr and
 * its ap_layer to r (NULL on out of memory); ap_fresh_name makes a name
 * "<base>__<role>" (then "...2", ...) absent from the set `names`, adds it
 * and points *out at the set's copy (-1 on out of memory). */
ap_layer *ap_emit(ap_result *r, json_t *arr, json_t *o, int origin, int copy);
int ap_fresh_name(json_t *names, const char *base, const char *role, const char **out);

#endif
