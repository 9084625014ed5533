/* fold.h - an lce read only by flatten -> linear, folded into one linear over
 * the candidate tokens (engine-internal; a plan rewrite beside auto_plan.h).
 *
 * Why this exists: nothing non-linear stands between an lce and a linear
 * that reads its flattened output, so the pair is one linear map of the lce's
 * operands:
 *
 *   y[c] = W_top flat(W_user E_user[u] + W_cand E_cand[c]) + b
 *        = W_u' flat(E_user[u])  +  W_c' flat(E_cand[c]) + b,
 *   W'[j, k*D + d] = sum_m W_top[j, m*D + d] * W[m, k]  (W = W_user, W_cand).
 *
 * The first term depends on the user only: it runs at U and is added
 * through the map; the second is one linear at C over E_cand as it is. The
 * folded weights are computed once at load. The [C, M, D] lce output is
 * never written nor read again, and the candidate FLOPs drop from
 * 2 M D (Kc + N) to 2 Kc D N. The rewrite is applied where that is a drop
 * (N < M Kc / (Kc - M) when Kc > M; always when Kc <= M) and W_c' has at
 * most FOLD_MAX_ELEMS elements; the user side is folded by the same rule
 * over Ku, else it runs as written (token_linear, then W_top). ikbo_load_
 * opts.no_fold (the serving key "fold": 0) keeps every chain as written.
 *
 * An mlp2 part: when lce.candidate is a stack read only by the lce and one
 * of its parts (there are others) is a reshape, read only by the stack, of
 * a candidate vector linear, read only by the reshape, with at most 16
 * inputs and no activation or ReLU, that part's share of the candidate term
 * is y = act(x W1^T + b1) W_c'[:, part]^T over the linear's input x: one
 * mlp2 (backend.h), whose [C, hidden] layer is never stored (the bench
 * model's c_r1: 427 MB at 16 x 70 not written nor read back). The other
 * parts keep one linear over their own stack, which mlp2 runs as its
 * addend (so a backend can overlap that memory-bound linear with the
 * hidden layer's compute); mlp2 also adds the user term and applies the
 * folded linear's activation in its last pass.
 *
 * A composed user part: when the user side folds and lce.user is a stack
 * read only by the lce, with other parts too, one of whose parts is a
 * reshape, read only by the stack, of a user vector linear, read only by
 * the reshape, with no activation and an input narrower than the part
 * (x [F] -> q = W_q x + b_q, F < the part's tokens * D), that part's share
 * of the user term is linear in x:
 *
 *   W_u'[:, part] q = (W_u'[:, part] W_q) x + W_u'[:, part] b_q,
 *
 * so the user linear reads concat(flatten(the other parts), x) with weight
 * [W_u'[:, others] | W_u'[:, part] W_q] and bias W_u'[:, part] b_q
 * (fold_compose: from W_top, W_user and W_q without forming W_u'[:, part]).
 * The part's linear, reshape and the stack leave the plan; the bench
 * model's u_d2 ([U, 32] -> [U, 300800]) is no longer written, and the user
 * linear reads 2336 columns instead of 303104.
 *
 * A composed attention part: a target_attention part of the candidate
 * stack (the stack read only by the lce, the attention only by the stack,
 * without shared_with, H dh = D) ends in its output projection, y_t = wo o_t
 * for each token t, with nothing non-linear after it, so its columns of the
 * candidate term compose with wo:
 *
 *   W_c'[:, t] (wo o_t) = (W_c'[:, t] wo) o_t,
 *
 * a [N, D] block times [D, D], the same width. The layer is planned with
 * "project_output": false (a key only this pass writes) and writes its
 * heads' outputs o in its place in the stack; its [C, tq, D] projection (the
 * bench model's 36.7 MB written and read at 16 x 70) is not run. Up to
 * FOLD_MAX_WO such parts per stack.
 *
 * Numerics: the function is the same; the roundings differ. The activation-
 * dtype rounding of the lce output (and of a composed part's output) is
 * gone, the folded weights are computed in fp32 and rounded once to the
 * backend's dtype (bench/RESULTS.md has the differences measured against
 * the unfolded run and the PyTorch reference).
 *
 * The pass works like auto_plan.c: it writes the folded model.json layers
 * (an ap_result: the document and each new layer's origin and weight
 * sources) for the loader to plan again with OP_PASS_REWRITTEN. Not
 * thread-safe (one load); nothing here runs per request.
 */
#ifndef IKBO_FOLD_H
#define IKBO_FOLD_H

#include <jansson.h>

#include "auto_plan.h"
#include "model.h"

/* The largest folded weight (elements) the pass makes. */
#define FOLD_MAX_ELEMS (1LL << 27)
/* The most target_attention parts of one candidate stack whose wo composes. */
#define FOLD_MAX_WO AP_MAX_WO

/* m: a model planned with the IKBO rules (its layers are root's "layers",
 * one for one). On a fold, *out is the rewritten document (its layers'
 * origins index m's layers) and, for each m layer, folded_into[i] is the
 * linear's index for the lce, flatten and linear of a folded chain, -1
 * otherwise (an array of m->n_layers the caller passes). *out = NULL when
 * nothing folds. Returns 0, or -1 with err set (out of memory). */
int fold_rewrite(const model_def *m, const json_t *root, int *folded_into, ap_result **out,
                 bk_err *err);

/* The plan report's note for m's layer i of a folded chain (folded_into
 * from fold_rewrite): the entry's rewrite becomes MD_RW_FOLDED. */
void fold_note(const model_def *m, const int *folded_into, int i, md_plan_entry *e);

/* The folded weight [N, K*D] of w [M, K] (w_user or w_cand) and w_top
 * [N, M*D]; to->rows/cols set by the planner. Returns 0, or -1 on out of
 * memory or shapes that do not match (to->data NULL then). Sums over N
 * rows split among threads: one per FOLD_THREAD_WORK multiply-adds, at most
 * the online CPUs and FOLD_MAX_THREADS (the bench model's two folds are
 * ~15e9; a thread that cannot start has its rows summed by the caller).
 * Every row is summed the same way on any thread: the result is the same
 * bits for any thread count. Called from the loading thread only. */
#define FOLD_THREAD_WORK 2.5e8
#define FOLD_MAX_THREADS 16
int fold_weight(const md_weight *w, const md_weight *w_top, int D, md_weight *to);
/* fold_weight on exactly `threads` threads (clamped to 1..min(N,
 * FOLD_MAX_THREADS)); for tests. */
int fold_weight_n(const md_weight *w, const md_weight *w_top, int D, md_weight *to, int threads);

/* The composed part's columns (fold.h's user part): for the n tokens
 * cols[0..n) of w [M, Ku] (w_user) and a part weight wq [n*D, in] (row
 * k*D + d of wq feeds token cols[k]'s column d; in = 1: a bias),
 *   out[j*ldo + i] = sum_{k, d} W'[j, cols[k]*D + d] wq[k*D + d, i],
 * W' = W_top W_user as fold_weight defines it, computed without W' as
 *   sum_{m, d} W_top[j, m*D + d] G[m, d, i],  G[m, d, i] = sum_k w[m, cols[k]] wq[k*D + d, i]
 * (M n D in + N M D in multiply-adds, in a fixed order). rows must be
 * w_top's rows. Returns 0, or -1 on out of memory or shapes that do not
 * match. Called from the loading thread only. */
int fold_compose(const md_weight *w, const int *cols, int n, const md_weight *w_top, int D,
                 const float *wq, int in, size_t rows, float *out, int ldo);

/* A composed attention part's columns (fold.h): tokens tok .. tok + n - 1
 * of the folded weight w ([N, K*D], D columns a token) right-multiplied in
 * place by wo [D, D] (its [D, H*dh] with H dh = D):
 *   w[j, t*D + e] <- sum_d w[j, t*D + d] wo[d, e],  summed in d order.
 * Rows split among threads as fold_weight's are (the same bits on any
 * count). Returns 0, or -1 on out of memory or shapes that do not match.
 * Called from the loading thread only. */
int fold_compose_wo(md_weight *w, int D, int tok, int n, const md_weight *wo);

#endif
