/* lane.h - which layers of a batch run on the user lane (engine-internal).
 *
 * Why this exists: in IKBO mode a batch's user side (bags, history, pools,
 * the user MLP, the K/V projection of the history, the fold's user term)
 * is a chain of small launches at U rows that reads nothing of the
 * candidate side until a mixing op. On one stream those launches run one
 * after another between the candidate side's; on a second stream of the
 * same device (be->lane) they run beside it. This file decides, once per
 * model at load, where each layer runs and where the candidate side must
 * wait; engine.c issues the waits (engine.c, "The user lane"). On the CPU
 * the lane's ops run in call order like the stream's, so the same path is
 * exercised by the CPU tests and the golden check, without overlap.
 *
 * The rule, in model order:
 * - LANE_RUN: a user-domain layer that reads only request inputs and other
 *   LANE_RUN layers, is not a fused self_attention (its launch reads the
 *   candidate query) and is not the logits: issued on the lane.
 * - LANE_MAIN: a layer reading no LANE_RUN layer: issued on the stream, no
 *   wait.
 * - LANE_SPLIT: an OP_LANE_SPLIT op (target_attention, not fused) whose
 *   first input is not a LANE_RUN layer: issued on the stream; the op puts
 *   its user-only work on op_lane and calls op_join before any launch on
 *   the stream reads lane work (op.h).
 * - LANE_JOIN: any other layer reading a LANE_RUN layer: the stream waits
 *   for all lane work issued so far, then the layer runs on the stream.
 * Request inputs are uploaded on the stream before the lane's first wait
 * for it, so reading them needs no wait. Arenas are bump-allocated per
 * batch (engine.c), so no buffer is reused between the two sides; each
 * side's backend scratch is its own stream's.
 *
 * Thread-safety: lane_plan runs once at load; its result is read-only.
 */
#ifndef IKBO_LANE_H
#define IKBO_LANE_H

#include "model.h"

enum lane_mode { LANE_MAIN = 0, LANE_RUN = 1, LANE_SPLIT = 2, LANE_JOIN = 3 };

/* The modes of d's layers ([n_layers], malloc'd; NULL out of memory). fuse:
 * engine.c's plan_fuse ([n_layers]: a fused self/target attention pair, -1
 * none). */
unsigned char *lane_plan(const model_def *d, const int *fuse);

/* How many layers of modes run on the lane (a model with none never forks). */
int lane_count(const model_def *d, const unsigned char *modes);

#endif
