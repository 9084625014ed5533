/* ops.c - the op table: every op of ikbo-model/1, in md_op order.
 *
 * Why this exists: this is the one list the loader (names, keys, planning)
 * and the executor (run) read. Each entry is defined in its family's file;
 * the static_assert and md_ops_check() keep the table in step with enum
 * md_op (engine/model.h).
 */
#include <stdio.h>
#include <string.h>

#include "../op.h"
#include "ops.h"

const md_op_def *const md_ops[] = {
    &md_op_embedding_bag,  &md_op_history_embedding, &md_op_mean_pool,   &md_op_linear,
    &md_op_reshape,        &md_op_stack,             &md_op_flatten,     &md_op_target_attention,
    &md_op_lce,            &md_op_add,               &md_op_activation,  &md_op_layer_norm,
    &md_op_concat,         &md_op_mul,               &md_op_token_linear, &md_op_dot_interaction,
    &md_op_cross,          &md_op_mixture,           &md_op_pool,             &md_op_self_attention, &md_op_din_attention,
    &md_op_broadcast,      &md_op_mlp2,
};
_Static_assert(sizeof md_ops / sizeof md_ops[0] == MD_OP_COUNT,
               "md_ops[] must list one entry per enum md_op, in enum order");

int md_op_find(const char *name)
{
    for (int k = 0; k < MD_OP_COUNT; k++)
        if (strcmp(md_ops[k]->name, name) == 0)
            return k;
    return -1;
}

const char *md_op_list(void)
{
    /* Built on every call (only error paths need it); 21 short names fit. */
    static __thread char buf[512];
    size_t o = 0;
    buf[0] = 0;
    for (int k = 0; k < MD_OP_COUNT && o < sizeof buf; k++)
        if (!(md_ops[k]->flags & OP_INTERNAL))
            o += (size_t)snprintf(buf + o, sizeof buf - o, "%s%s", o ? ", " : "", md_ops[k]->name);
    return buf;
}
