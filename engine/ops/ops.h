/* ops.h - the op definitions engine/ops/ops.c puts in its table.
 *
 * One extern per op, defined in its family's file; nothing else includes
 * this header. See engine/README.md for adding an op.
 */
#ifndef IKBO_OPS_H
#define IKBO_OPS_H

#include "../op.h"

/* embed.c */
extern const md_op_def md_op_embedding_bag, md_op_history_embedding;
/* shape.c */
extern const md_op_def md_op_reshape, md_op_flatten, md_op_stack, md_op_concat, md_op_broadcast;
/* dense.c */
extern const md_op_def md_op_linear, md_op_token_linear, md_op_cross, md_op_mlp2;
/* elementwise.c */
extern const md_op_def md_op_activation, md_op_layer_norm, md_op_add, md_op_mul, md_op_mixture;
/* pool.c */
extern const md_op_def md_op_mean_pool, md_op_pool;
/* interact.c */
extern const md_op_def md_op_lce, md_op_dot_interaction;
/* attention.c */
extern const md_op_def md_op_target_attention, md_op_self_attention, md_op_din_attention;

#endif
