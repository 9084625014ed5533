/* fold.c - lce -> flatten -> linear folded into one candidate linear (fold.h).
 *
 * Why this exists: see fold.h. A chain is found from its linear: the input
 * is a flatten whose input is an lce, and neither the lce nor the flatten
 * has another reader (nor is the logits layer). The chain's three layers
 * are replaced, at the linear's place, by
 *
 *   <flat>__u    flatten(lce.user)  (a [D] user operand is read as is)      U
 *   <linear>__u  linear(<flat>__u, N), no bias    weight W_top W_user       U
 *   <flat>__c    flatten(lce.candidate)  (likewise)                         C
 *   <linear>__c  linear(<flat>__c, N)             weight W_top W_cand, b    C
 *   <linear>     add(<linear>__c, <linear>__u)  (then its activation,
 *                the add named <linear>__sum)                               C
 *
 * where the user side passes the rule too (its K = Ku); else the user term
 * is computed as written, at U: <lce>__u token_linear(lce.user, M) with
 * w_user, <flat>__u its flatten, <linear>__u the linear with W_top.
 *
 * Where lce.candidate is a stack with an mlp2 part (fold.h), the candidate
 * term and the sum are instead
 *
 *   <stack>__r   stack of the other parts                                   C
 *   <flat>__c    flatten(<stack>__r)                                        C
 *   <linear>     mlp2(part's linear input, addend_input <flat>__c,
 *                user_addend <linear>__u, out_activation the linear's)
 *                W1, b1 the part's linear's, W2 the part's columns of
 *                W_top W_cand, wa the other parts' columns, ba b        C
 *
 * (mlp2 runs the other parts' linear itself, where a backend can overlap
 * it with the hidden layer's work, adds the user term and applies the
 * activation: no add or activation launch after it), and the part's stack,
 * reshape and linear leave the plan too.
 *
 * Where the user side folds and lce.user is a stack with a composed part
 * (fold.h), the user term is instead
 *
 *   <stack>__ur  stack of the other parts                                   U
 *   <flat>__u    flatten(<stack>__ur)                                       U
 *   <flat>__ucat concat(<flat>__u, the part's linear input)                 U
 *   <linear>__u  linear(<flat>__ucat, N)  weight [their columns of W_top
 *                W_user | the part's columns composed with W_q], bias the
 *                part's columns times b_q                                   U
 *
 * and the part's stack, reshape and linear leave the plan.
 *
 * A composed attention part of the candidate stack (fold.h) is emitted in
 * its place with "project_output": false and its wq, wk, wv; the candidate
 * term's weight (the linear's, or mlp2's addend weight) has that part's
 * token columns multiplied by its wo (fold_compose_wo).
 *
 * every other layer is copied as it is. All of them are ops with a CPU
 * kernel, a CUDA kernel and a reference (mlp2 is internal: only this pass
 * writes it).
 */
#include "fold.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "plan.h"

typedef struct chain {
    int lce, flat, lin;
    int user; /* the user term folded too (else token_linear, flatten, linear) */
    /* the candidate operand's mlp2 part (-1: none): the stack, its part's
     * index in the stack's inputs, the reshape and the linear before it */
    int stack, part, reshape, mlin;
    /* the user operand's composed part (-1: none; only with `user`): the
     * same four for a linear with no activation, composed into the user
     * term's weight (fold.h) */
    int ustack, upart, ureshape, ulin;
    /* target_attention parts of the candidate operand's stack whose wo is
     * composed into the candidate term's weight (fold.h): the layers and
     * their first token in that weight's column order */
    int wo[FOLD_MAX_WO], wo_tok[FOLD_MAX_WO], n_wo;
} chain;

/* Readers of each layer (inputs of later layers, and the logits). */
static int *reader_counts(const model_def *m)
{
    int *n = calloc((size_t)m->n_layers + 1, sizeof *n);
    if (!n) return NULL;
    for (int i = 0; i < m->n_layers; i++)
        for (int k = 0; k < m->layers[i].n_in; k++)
            if (m->layers[i].in[k].src == MD_SRC_LAYER) n[m->layers[i].in[k].index]++;
    n[m->logits_layer]++;
    return n;
}

/* fold.h's rule for one side of K tokens: fewer FLOPs folded, W' bounded. */
static int side_folds(double K, double M, double D, double N)
{
    return 2 * K * D * N < 2 * M * D * (K + N) && N * K * D <= (double)FOLD_MAX_ELEMS;
}

/* Which linears may stand behind a stack part (stack_part). */
typedef int (*part_ok)(const model_def *m, const md_layer *q, const md_layer *reshape);

/* A part of the stack e (read only by the lce, with other parts too) that
 * is a reshape, read only by the stack, of a linear read only by the
 * reshape that `ok` accepts: the one with the most tokens. Sets *st (the
 * stack), *part (its index in the stack's inputs), *rs and *lin; leaves
 * them when there is none. */
static void stack_part(const model_def *m, const int *readers, md_ref e, part_ok ok, int *st,
                       int *part, int *rs, int *lin)
{
    if (e.src != MD_SRC_LAYER || readers[e.index] != 1) return;
    const md_layer *s = &m->layers[e.index];
    if (s->op != MD_STACK || s->n_in < 2) return;
    int best = 0;
    for (int k = 0; k < s->n_in; k++) {
        md_ref r = s->in[k];
        if (r.src != MD_SRC_LAYER || readers[r.index] != 1) continue;
        const md_layer *re = &m->layers[r.index];
        if (re->op != MD_RESHAPE || re->in[0].src != MD_SRC_LAYER || readers[re->in[0].index] != 1)
            continue;
        const md_layer *q = &m->layers[re->in[0].index];
        if (q->op != MD_LINEAR || q->kind != MD_VEC || !ok(m, q, re) || re->tokens <= best)
            continue;
        best = re->tokens;
        *st = e.index, *part = k, *rs = r.index, *lin = re->in[0].index;
    }
}

/* mlp2's part (fold.h): a candidate linear of at most
 * BK_MLP2_FUSED_MAX_IN inputs, with no activation or ReLU. */
static int mlp2_ok(const model_def *m, const md_layer *q, const md_layer *rs)
{
    (void)rs;
    return q->domain == MD_CAND && (q->act == BK_ACT_NONE || q->act == BK_ACT_RELU) &&
           md_ref_width(m, q->in[0]) <= BK_MLP2_FUSED_MAX_IN;
}

/* A composed user part (fold.h): a user linear with no activation whose
 * input is narrower than its output (the composed weight is narrower than
 * the part's columns). */
static int compose_ok(const model_def *m, const md_layer *q, const md_layer *rs)
{
    return q->domain == MD_USER && q->act == BK_ACT_NONE &&
           md_ref_width(m, q->in[0]) < rs->tokens * rs->dim;
}

/* The candidate stack's target_attention parts whose wo composes (fold.h):
 * read only by the stack (itself read only by the lce), not shared_with, H
 * dh = D. Their first tokens count the stack's parts before them, less the
 * mlp2 part's (its columns are not in the same weight). */
static void wo_parts(const model_def *m, const int *readers, md_ref e, chain *c)
{
    if (e.src != MD_SRC_LAYER || readers[e.index] != 1 || m->layers[e.index].op != MD_STACK)
        return;
    const md_layer *s = &m->layers[e.index];
    for (int k = 0, tok = 0; k < s->n_in; k++) {
        md_ref r = s->in[k];
        const int n = md_ref_tokens(m, r);
        if (c->stack >= 0 && k == c->part) continue;
        const md_layer *a = r.src == MD_SRC_LAYER ? &m->layers[r.index] : NULL;
        if (a && a->op == MD_TARGET_ATTENTION && readers[r.index] == 1 && a->shared < 0 &&
            !a->no_wo && a->heads * a->head_dim == a->dim && c->n_wo < FOLD_MAX_WO) {
            c->wo[c->n_wo] = r.index;
            c->wo_tok[c->n_wo++] = tok;
        }
        tok += n;
    }
}

/* Whether linear i closes a chain worth folding (fold.h's rule). */
static int chain_at(const model_def *m, const int *readers, int i, chain *c)
{
    const md_layer *t = &m->layers[i];
    if (t->op != MD_LINEAR || t->domain != MD_CAND || t->kind != MD_VEC ||
        t->in[0].src != MD_SRC_LAYER)
        return 0;
    const md_layer *f = &m->layers[t->in[0].index];
    if (f->op != MD_FLATTEN || f->in[0].src != MD_SRC_LAYER || readers[t->in[0].index] != 1)
        return 0;
    const md_layer *l = &m->layers[f->in[0].index];
    if (l->op != MD_LCE || readers[f->in[0].index] != 1) return 0;
    double M = l->tokens, D = l->dim, N = t->dim;
    if (!side_folds(md_ref_tokens(m, l->in[1]), M, D, N)) return 0;
    *c = (chain){.lce = f->in[0].index, .flat = t->in[0].index, .lin = i,
                 .user = side_folds(md_ref_tokens(m, l->in[0]), M, D, N), .stack = -1,
                 .part = -1, .reshape = -1, .mlin = -1, .ustack = -1, .upart = -1,
                 .ureshape = -1, .ulin = -1, .n_wo = 0};
    stack_part(m, readers, l->in[1], mlp2_ok, &c->stack, &c->part, &c->reshape, &c->mlin);
    wo_parts(m, readers, l->in[1], c);
    if (c->user)
        stack_part(m, readers, l->in[0], compose_ok, &c->ustack, &c->upart, &c->ureshape, &c->ulin);
    return 1;
}

typedef struct fw {
    const model_def *m;
    json_t *out, *names;
    ap_result *res;
} fw;

/* A flatten of operand r named `name` when r is tokens; *out: what to read. */
static int flat_of(fw *w, md_ref r, const char *name, int origin, const char **out)
{
    *out = md_value_ref_text(w->m, r);
    if (r.src != MD_SRC_LAYER || w->m->layers[r.index].kind != MD_TOKENS) return 0;
    if (!ap_emit(w->res, w->out,
                 json_pack("{s:s, s:s, s:s}", "name", name, "op", "flatten", "input", *out),
                 origin, 0))
        return -1;
    *out = name;
    return 0;
}

/* A linear {name, input, out} with weight wsrc and bias (src -1: zeros). */
static int linear(fw *w, const char *name, const char *input, int out, int origin, ap_wsrc wt,
                  ap_wsrc bias)
{
    ap_layer *a = ap_emit(w->res, w->out,
                          json_pack("{s:s, s:s, s:s, s:i}", "name", name, "op", "linear", "input",
                                    input, "out", out),
                          origin, 0);
    if (!a) return -1;
    a->w[0] = wt;
    a->w[1] = bias;
    a->n_w = 2;
    return 0;
}

/* The stack `stack` without its input `part`: emitted as <stack>__<role>
 * (named *sr), and the stack's token indices split into the other parts'
 * (*keep, *nk) and the part's (*mine, *nm), both malloc'd. -1: out of
 * memory (nothing to free). */
static int split_stack(fw *w, int stack, int part, const char *role, const char **sr,
                       int **keep, int *nk, int **mine, int *nm)
{
    const model_def *m = w->m;
    const md_layer *st = &m->layers[stack];
    int kt = 0;
    for (int k = 0; k < st->n_in; k++) kt += md_ref_tokens(m, st->in[k]);
    json_t *parts = json_array();
    *keep = malloc((size_t)kt * sizeof **keep), *mine = malloc((size_t)kt * sizeof **mine);
    *nk = *nm = 0;
    if (!parts || !*keep || !*mine || ap_fresh_name(w->names, st->name, role, sr)) goto oom;
    for (int k = 0, tok = 0; k < st->n_in; k++) {
        const int n = md_ref_tokens(m, st->in[k]);
        for (int j = 0; j < n; j++) {
            if (k == part) (*mine)[(*nm)++] = tok + j;
            else (*keep)[(*nk)++] = tok + j;
        }
        tok += n;
        if (k != part && json_array_append_new(parts, json_string(md_value_ref_text(m, st->in[k]))))
            goto oom;
    }
    json_t *o = json_pack("{s:s, s:s, s:o}", "name", *sr, "op", "stack", "inputs", parts);
    parts = NULL;
    if (ap_emit(w->res, w->out, o, stack, 0)) return 0;
oom:
    json_decref(parts);
    free(*keep);
    free(*mine);
    *keep = *mine = NULL;
    return -1;
}

/* The wo compositions of chain c on candidate weight source ws. */
static void wo_sources(const chain *c, ap_wsrc *ws)
{
    ws->n_wo = c->n_wo;
    for (int k = 0; k < c->n_wo; k++) ws->wo[k] = (ap_wo){.layer = c->wo[k], .tok = c->wo_tok[k]};
}

/* A composed attention part (fold.h) as written but for "project_output":
 * false, its wq, wk and wv taken across (no wo). -1: out of memory. */
static int emit_no_wo(fw *w, const json_t *src, int i)
{
    json_t *o = json_deep_copy(src);
    if (!o || json_object_set_new(o, "project_output", json_false())) {
        json_decref(o);
        return -1;
    }
    ap_layer *a = ap_emit(w->res, w->out, o, i, 0);
    if (!a) return -1;
    for (int j = 0; j < 3; j++) a->w[j] = (ap_wsrc){.src = i, .src_w = j};
    a->n_w = 3;
    return 0;
}

/* The candidate term and the sum with an mlp2 part (fold.h): the stack's other parts
 * as <stack>__r and its flatten (fc), then mlp2 over the part's linear
 * input (its W1 and b1, the part's columns of W_top W_cand as W2) with
 * fc's linear as the addend (the other tokens' columns of W_top W_cand,
 * the linear's bias), named y. -1: out of memory. */
static int cand_with_mlp2(fw *w, const chain *c, const char *fc, const char *y, const char *yu,
                          const char *act)
{
    const model_def *m = w->m;
    const md_layer *l = &m->layers[c->lce], *t = &m->layers[c->lin];
    const md_layer *q = &m->layers[c->mlin];
    const char *sr;
    int *keep, *mine, nk, nm;
    if (split_stack(w, c->stack, c->part, "r", &sr, &keep, &nk, &mine, &nm)) return -1;
    if (!ap_emit(w->res, w->out,
                 json_pack("{s:s, s:s, s:s}", "name", fc, "op", "flatten", "input", sr), c->flat, 0))
        goto oom;
    ap_layer *a = ap_emit(w->res, w->out,
                json_pack("{s:s, s:s, s:s, s:s, s:i, s:i, s:s, s:s, s:s}", "name", y, "op", "mlp2",
                          "input", md_value_ref_text(m, q->in[0]), "addend_input", fc, "hidden",
                          q->dim, "out", t->dim, "activation",
                          q->act == BK_ACT_RELU ? "relu" : "none", "user_addend", yu,
                          "out_activation", act),
                c->mlin, 0);
    if (!a) goto oom;
    a->w[0] = (ap_wsrc){.src = c->mlin, .src_w = 0};
    a->w[1] = (ap_wsrc){.src = c->mlin, .src_w = 1};
    a->w[2] = (ap_wsrc){.src = c->lce, .src_w = 1, .cols = mine, .n_cols = nm,
                        .fold_src = c->lin, .fold_d = l->dim};
    a->w[3] = (ap_wsrc){.src = c->lce, .src_w = 1, .cols = keep, .n_cols = nk,
                        .fold_src = c->lin, .fold_d = l->dim};
    wo_sources(c, &a->w[3]);
    a->w[4] = (ap_wsrc){.src = c->lin, .src_w = 1};
    a->n_w = 5;
    return 0;
oom:
    free(keep);
    free(mine);
    return -1;
}

/* The user term with a composed part (fold.h): the stack's other parts as
 * <stack>__ur, their flatten fu, its concat with the part's linear input
 * (<flat>__ucat), and the user linear yu over it: weight [the other
 * tokens' columns of W_top W_user | the part's columns composed with the
 * part's linear weight], bias the part's columns times that linear's bias.
 * -1: out of memory. */
static int user_with_part(fw *w, const chain *c, const char *fu, const char *yu)
{
    const model_def *m = w->m;
    const md_layer *l = &m->layers[c->lce], *t = &m->layers[c->lin];
    const md_layer *q = &m->layers[c->ulin];
    const char *sr, *cat;
    int *keep, *mine, *mine2 = NULL, nk, nm;
    if (split_stack(w, c->ustack, c->upart, "ur", &sr, &keep, &nk, &mine, &nm)) return -1;
    if (!(mine2 = malloc((size_t)nm * sizeof *mine2)) ||
        ap_fresh_name(w->names, m->layers[c->flat].name, "ucat", &cat) ||
        !ap_emit(w->res, w->out,
                 json_pack("{s:s, s:s, s:s}", "name", fu, "op", "flatten", "input", sr), c->flat, 0) ||
        !ap_emit(w->res, w->out,
                 json_pack("{s:s, s:s, s:[s, s]}", "name", cat, "op", "concat", "inputs", fu,
                           md_value_ref_text(m, q->in[0])),
                 c->ulin, 0))
        goto oom;
    memcpy(mine2, mine, (size_t)nm * sizeof *mine2);
    if (linear(w, yu, cat, t->dim, c->lin,
               (ap_wsrc){.src = c->lce, .src_w = 0, .cols = keep, .n_cols = nk,
                         .fold_src = c->lin, .fold_d = l->dim, .comp = AP_COMP_WEIGHT,
                         .comp_src = c->ulin, .ccols = mine, .n_ccols = nm},
               (ap_wsrc){.src = c->lce, .src_w = 0, .fold_src = c->lin, .fold_d = l->dim,
                         .comp = AP_COMP_BIAS, .comp_src = c->ulin, .ccols = mine2, .n_ccols = nm}))
        goto oom;
    return 0;
oom:
    free(keep);
    free(mine);
    free(mine2);
    return -1;
}

/* The chain's replacement layers (the header's table). -1: out of memory. */
static int emit_chain(fw *w, const json_t *src, const chain *c)
{
    const model_def *m = w->m;
    const md_layer *l = &m->layers[c->lce], *t = &m->layers[c->lin];
    const char *zu = NULL, *fu, *yu, *fc, *yc, *sum = t->name, *flat = m->layers[c->flat].name, *in;
    const char *act = json_string_value(json_object_get(src, "activation"));
    int has_act = act && strcmp(act, "none") != 0;
    ap_wsrc zeros = {.src = -1};
    if ((!c->user && ap_fresh_name(w->names, l->name, "u", &zu)) ||
        ap_fresh_name(w->names, flat, "u", &fu) ||
        ap_fresh_name(w->names, t->name, "u", &yu) || ap_fresh_name(w->names, flat, "c", &fc) ||
        ap_fresh_name(w->names, t->name, "c", &yc) ||
        (has_act && ap_fresh_name(w->names, t->name, "sum", &sum)))
        return -1;
    if (c->user && c->ustack >= 0) { /* the same, a part composed */
        if (user_with_part(w, c, fu, yu)) return -1;
    } else if (c->user) { /* W_top W_user over the user tokens, at U */
        if (flat_of(w, l->in[0], fu, c->flat, &in) ||
            linear(w, yu, in, t->dim, c->lin,
                   (ap_wsrc){.src = c->lce, .src_w = 0, .fold_src = c->lin, .fold_d = l->dim},
                   zeros))
            return -1;
    } else { /* W_user E_user, then W_top, at U */
        ap_layer *a = ap_emit(w->res, w->out,
                              json_pack("{s:s, s:s, s:s, s:i}", "name", zu, "op", "token_linear",
                                        "input", md_value_ref_text(m, l->in[0]), "out_tokens",
                                        l->tokens),
                              c->lce, 0);
        if (!a) return -1;
        a->w[0] = (ap_wsrc){.src = c->lce, .src_w = 0};
        a->n_w = 1;
        if (!ap_emit(w->res, w->out,
                     json_pack("{s:s, s:s, s:s}", "name", fu, "op", "flatten", "input", zu),
                     c->flat, 0) ||
            linear(w, yu, fu, t->dim, c->lin, (ap_wsrc){.src = c->lin, .src_w = 0}, zeros))
            return -1;
    }
    if (c->stack >= 0) return cand_with_mlp2(w, c, fc, t->name, yu, has_act ? act : "none");
    ap_wsrc wc = {.src = c->lce, .src_w = 1, .fold_src = c->lin, .fold_d = l->dim};
    wo_sources(c, &wc);
    if (flat_of(w, l->in[1], fc, c->flat, &in) ||
        linear(w, yc, in, t->dim, c->lin, wc, (ap_wsrc){.src = c->lin, .src_w = 1}))
        return -1;
    if (!ap_emit(w->res, w->out,
                 json_pack("{s:s, s:s, s:[s, s]}", "name", sum, "op", "add", "inputs", yc, yu),
                 c->lin, 0))
        return -1;
    if (has_act && !ap_emit(w->res, w->out,
                            json_pack("{s:s, s:s, s:s, s:s}", "name", t->name, "op", "activation",
                                      "input", sum, "fn", act),
                            c->lin, 0))
        return -1;
    return 0;
}

/* Finds the chains: folded_into filled, ch[linear] each chain. Returns
 * how many; -1: out of memory. */
static int find_chains(const model_def *m, int *folded_into, chain *ch)
{
    int *readers = reader_counts(m), n = 0;
    if (!readers) return -1;
    for (int i = 0; i < m->n_layers; i++) folded_into[i] = -1;
    for (int i = 0; i < m->n_layers; i++) {
        chain c;
        if (!chain_at(m, readers, i, &c)) continue;
        folded_into[c.lce] = folded_into[c.flat] = folded_into[c.lin] = i;
        if (c.stack >= 0) folded_into[c.stack] = folded_into[c.reshape] = folded_into[c.mlin] = i;
        if (c.ustack >= 0) folded_into[c.ustack] = folded_into[c.ureshape] = folded_into[c.ulin] = i;
        for (int k = 0; k < c.n_wo; k++) folded_into[c.wo[k]] = i;
        ch[i] = c;
        n++;
    }
    free(readers);
    return n;
}

static int write_layers(fw *w, const json_t *layers, const int *folded_into, const chain *ch)
{
    const model_def *m = w->m;
    for (int i = 0; i < m->n_layers; i++)
        if (json_object_set_new(w->names, m->layers[i].name, json_true())) return -1;
    for (int i = 0; i < m->n_layers; i++) {
        const json_t *src = json_array_get(layers, (size_t)i);
        if (folded_into[i] < 0) {
            if (!ap_emit(w->res, w->out, json_deep_copy(src), i, 1)) return -1;
        } else if (m->layers[i].op == MD_TARGET_ATTENTION) { /* in place, wo composed away */
            if (emit_no_wo(w, src, i)) return -1;
        } else if (folded_into[i] == i && emit_chain(w, src, &ch[i])) {
            return -1; /* (the lce and flatten go with their linear) */
        }
    }
    return 0;
}

int fold_rewrite(const model_def *m, const json_t *root, int *folded_into, ap_result **out,
                 bk_err *err)
{
    *out = NULL;
    chain *ch = malloc(((size_t)m->n_layers + 1) * sizeof *ch);
    int n = ch ? find_chains(m, folded_into, ch) : -1;
    fw w = {.m = m};
    int rc = -1;
    if (n == 0) {
        free(ch);
        return 0;
    }
    if (n < 0 || !(w.out = json_array()) || !(w.names = json_object()) ||
        !(w.res = calloc(1, sizeof *w.res)) ||
        write_layers(&w, json_object_get(root, "layers"), folded_into, ch) ||
        !(w.res->root = json_deep_copy(root)) || json_object_set(w.res->root, "layers", w.out)) {
        bk_seterr(err, "%s: out of memory folding the model's lce layers", m->dir);
        goto out;
    }
    *out = w.res;
    w.res = NULL;
    rc = 0;
out:
    free(ch);
    json_decref(w.out);
    json_decref(w.names);
    ap_result_free(w.res);
    return rc;
}

void fold_note(const model_def *m, const int *folded_into, int i, md_plan_entry *e)
{
    const md_layer *t = &m->layers[folded_into[i]];
    const md_layer *f = &m->layers[t->in[0].index];
    const md_layer *l = &m->layers[f->in[0].index];
    e->rw = MD_RW_FOLDED;
    const md_layer *self = &m->layers[i];
    if (self->op == MD_TARGET_ATTENTION) { /* a composed attention part */
        snprintf(e->note, sizeof e->note,
                 "folded into linear '%s': its wo is composed into that linear's weight (the "
                 "layer writes its heads' outputs; no [C, %d] projection)",
                 t->name, self->tokens * self->dim);
        return;
    }
    if (self != t && self != l && self != f && self->domain == MD_USER) { /* the composed part's */
        snprintf(e->note, sizeof e->note,
                 "folded into linear '%s': its part of the user term is composed into the user "
                 "linear's weight (no [U, %d] output)",
                 t->name, self->tokens * self->dim);
        return;
    }
    if (self != t && self != l && self != f) { /* the mlp2 part's stack, reshape or linear */
        snprintf(e->note, sizeof e->note,
                 "folded into linear '%s': its part of the candidate term is one mlp2 over "
                 "the part's linear input (no [C, %d] output)",
                 t->name, self->tokens * self->dim);
        return;
    }
    if (self != t) {
        snprintf(e->note, sizeof e->note, "folded into linear '%s' (no [C, %d, %d] output)",
                 t->name, l->tokens, l->dim);
        return;
    }
    int ku = md_ref_tokens(m, l->in[0]), kc = md_ref_tokens(m, l->in[1]);
    const char *part = NULL, *upart = NULL; /* the parts' linears, if any */
    int ucols = ku * l->dim; /* the user linear's inputs */
    for (int j = 0; j < m->n_layers; j++)
        if (folded_into[j] == folded_into[i] && m->layers[j].op == MD_RESHAPE) {
            const md_layer *q = &m->layers[m->layers[j].in[0].index];
            if (m->layers[j].domain == MD_USER) {
                upart = q->name;
                ucols += md_ref_width(m, q->in[0]) - m->layers[j].tokens * l->dim;
            } else {
                part = q->name;
            }
        }
    char user[64];
    if (side_folds(ku, l->tokens, l->dim, t->dim))
        snprintf(user, sizeof user, "W_top W_user [%d, %d]", t->dim, ucols);
    else
        snprintf(user, sizeof user, "W_top (W_user E_user)");
    char mlp[80] = "", comp[80] = "";
    if (part) snprintf(mlp, sizeof mlp, " ('%s''s share through mlp2)", part);
    if (upart) snprintf(comp, sizeof comp, " ('%s' composed into it)", upart);
    snprintf(e->note, sizeof e->note,
             "folds lce '%s': user term %s%s at U, candidate term W_top W_cand [%d, %d]%s at C, "
             "added through the map",
             l->name, user, comp, t->dim, kc * l->dim, mlp);
}

/* y += a x, four lanes at a time (-O2 does not vectorize it by itself). */
typedef float fold_v4 __attribute__((vector_size(16)));
static void axpy(float *restrict y, const float *restrict x, float a, int n)
{
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        fold_v4 xv, yv;
        memcpy(&xv, x + i, sizeof xv);
        memcpy(&yv, y + i, sizeof yv);
        yv += a * xv;
        memcpy(y + i, &yv, sizeof yv);
    }
    for (; i < n; i++) y[i] += a * x[i];
}

/* Rows j0 .. j1 - 1 of the folded weight into out ([N, K*D]):
 * W'[j, k*D + d] = sum_m W_top[j, m*D + d] * W[m, k], summed in m order;
 * FOLD_KB output tokens at a time, so their sums stay in L1 while W_top's
 * row streams past once per block. acc: FOLD_KB * D floats. */
enum { FOLD_KB = 8 };
static void fold_rows(const md_weight *w, const md_weight *w_top, int D, float *out, int j0,
                      int j1, float *acc)
{
    int M = w->rows, K = w->cols;
    size_t row = (size_t)K * D;
    for (int j = j0; j < j1; j++) {
        const float *top = w_top->data + (size_t)j * w_top->cols;
        for (int k0 = 0; k0 < K; k0 += FOLD_KB) {
            int kb = K - k0 < FOLD_KB ? K - k0 : FOLD_KB;
            memset(acc, 0, (size_t)kb * D * sizeof(float));
            for (int mi = 0; mi < M; mi++)
                for (int kk = 0; kk < kb; kk++)
                    axpy(acc + (size_t)kk * D, top + (size_t)mi * D,
                         w->data[(size_t)mi * K + k0 + kk], D);
            memcpy(out + (size_t)j * row + (size_t)k0 * D, acc, (size_t)kb * D * sizeof(float));
        }
    }
}

/* One thread's share of a row-parallel job: rows(job, j0, j1) returns 0,
 * or -1 (out of memory). */
typedef int (*fold_rows_fn)(const void *job, int j0, int j1);
typedef struct fold_share {
    fold_rows_fn rows;
    const void *job;
    int j0, j1, rc;
} fold_share;

static void *fold_share_run(void *arg)
{
    fold_share *f = arg;
    f->rc = f->rows(f->job, f->j0, f->j1);
    return NULL;
}

/* rows over [0, n) on `threads` threads (clamped to 1..min(n,
 * FOLD_MAX_THREADS)): share t takes rows [t n / threads, (t + 1) n /
 * threads); the caller runs the last one, and any share whose thread did
 * not start. Each row must be computed the same way whoever computes it,
 * so the result does not depend on the thread count. 0, or -1 if a share
 * failed. */
static int fold_rows_par(int n, int threads, fold_rows_fn rows, const void *job)
{
    if (threads > n) threads = n;
    if (threads > FOLD_MAX_THREADS) threads = FOLD_MAX_THREADS;
    if (threads < 1) threads = 1;
    fold_share sh[FOLD_MAX_THREADS];
    pthread_t tid[FOLD_MAX_THREADS];
    int started[FOLD_MAX_THREADS] = {0}, rc = 0;
    for (int t = 0; t < threads; t++) {
        sh[t] = (fold_share){rows, job, (int)((long)t * n / threads),
                             (int)((long)(t + 1) * n / threads), -1};
        if (t < threads - 1)
            started[t] = pthread_create(&tid[t], NULL, fold_share_run, &sh[t]) == 0;
    }
    for (int t = 0; t < threads; t++)
        if (!started[t]) fold_share_run(&sh[t]);
    for (int t = 0; t < threads; t++) {
        if (started[t]) pthread_join(tid[t], NULL);
        rc |= sh[t].rc;
    }
    return rc ? -1 : 0;
}

/* A thread per FOLD_THREAD_WORK multiply-adds, up to the online CPUs. */
static int fold_threads(double work)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = (int)(work / FOLD_THREAD_WORK);
    return threads > cpus ? (int)cpus : threads;
}

typedef struct fold_job {
    const md_weight *w, *w_top;
    int D;
    float *out;
} fold_job;

static int fold_job_rows(const void *job, int j0, int j1)
{
    const fold_job *f = job;
    float *acc = malloc((size_t)FOLD_KB * f->D * sizeof(float));
    if (!acc) return -1;
    fold_rows(f->w, f->w_top, f->D, f->out, j0, j1, acc);
    free(acc);
    return 0;
}

int fold_weight_n(const md_weight *w, const md_weight *w_top, int D, md_weight *to, int threads)
{
    int M = w->rows, N = w_top->rows;
    size_t row = (size_t)w->cols * D;
    if (to->rows != N || (size_t)to->cols != row || (size_t)w_top->cols != (size_t)M * D)
        return -1; /* cannot happen: the planner made these shapes */
    if (!(to->data = malloc((size_t)N * row * sizeof(float)))) return -1;
    if (fold_rows_par(N, threads, fold_job_rows, &(fold_job){w, w_top, D, to->data})) {
        free(to->data);
        to->data = NULL;
        return -1;
    }
    return 0;
}

int fold_weight(const md_weight *w, const md_weight *w_top, int D, md_weight *to)
{
    return fold_weight_n(w, w_top, D, to, fold_threads((double)w->rows * w->cols * D * w_top->rows));
}

int fold_compose(const md_weight *w, const int *cols, int n, const md_weight *w_top, int D,
                 const float *wq, int in, size_t rows, float *out, int ldo)
{
    const int M = w->rows, N = w_top->rows;
    if ((size_t)N != rows || (size_t)w_top->cols != (size_t)M * D || in < 1 || ldo < in)
        return -1; /* cannot happen: the planner made these shapes */
    float *g = calloc((size_t)M * D * in + 1, sizeof *g), *row = malloc((size_t)in * sizeof *row);
    if (!g || !row) {
        free(g);
        free(row);
        return -1;
    }
    for (int m = 0; m < M; m++) /* G[m, d, :] += w[m, cols[k]] wq[k*D + d, :], in k order */
        for (int k = 0; k < n; k++) {
            const float a = w->data[(size_t)m * w->cols + cols[k]];
            for (int d = 0; d < D; d++)
                axpy(g + ((size_t)m * D + d) * in, wq + ((size_t)k * D + d) * in, a, in);
        }
    for (int j = 0; j < N; j++) { /* out[j, :] = sum_{m, d} W_top[j, m*D + d] G[m, d, :] */
        const float *top = w_top->data + (size_t)j * w_top->cols;
        memset(row, 0, (size_t)in * sizeof *row);
        for (size_t md = 0; md < (size_t)M * D; md++) axpy(row, g + md * in, top[md], in);
        memcpy(out + (size_t)j * ldo, row, (size_t)in * sizeof *row);
    }
    free(g);
    free(row);
    return 0;
}

typedef struct wo_job {
    md_weight *w;
    int D, tok, n;
    const md_weight *wo;
} wo_job;

/* Rows j0 .. j1 - 1 of fold_compose_wo, each token's block in d order. */
static int wo_rows(const void *job, int j0, int j1)
{
    const wo_job *c = job;
    const int D = c->D;
    float *row = malloc((size_t)D * sizeof *row);
    if (!row) return -1;
    for (int j = j0; j < j1; j++)
        for (int t = c->tok; t < c->tok + c->n; t++) {
            float *blk = c->w->data + (size_t)j * c->w->cols + (size_t)t * D;
            memset(row, 0, (size_t)D * sizeof *row);
            for (int d = 0; d < D; d++) axpy(row, c->wo->data + (size_t)d * D, blk[d], D);
            memcpy(blk, row, (size_t)D * sizeof *row);
        }
    free(row);
    return 0;
}

int fold_compose_wo(md_weight *w, int D, int tok, int n, const md_weight *wo)
{
    if (wo->rows != D || wo->cols != D || (size_t)w->cols < (size_t)(tok + n) * D || !w->data)
        return -1; /* cannot happen: the pass checked H dh = D */
    return fold_rows_par(w->rows, fold_threads((double)w->rows * n * D * D), wo_rows,
                         &(wo_job){w, D, tok, n, wo});
}
