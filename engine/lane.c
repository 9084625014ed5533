/* lane.c - the user lane's plan (lane.h has why and the rule). */
#include <stdlib.h>

#include "lane.h"
#include "op.h"

unsigned char *lane_plan(const model_def *d, const int *fuse)
{
    int n = d->n_layers;
    unsigned char *mode = calloc((size_t)n + 1, 1);
    if (!mode) return NULL;
    for (int li = 0; li < n; li++) {
        const md_layer *l = &d->layers[li];
        int on_lane = 0, on_stream = 0;
        for (int k = 0; k < l->n_in; k++) {
            if (l->in[k].src != MD_SRC_LAYER) continue;
            if (mode[l->in[k].index] == LANE_RUN)
                on_lane = 1;
            else
                on_stream = 1;
        }
        int first_on_lane = l->n_in > 0 && l->in[0].src == MD_SRC_LAYER &&
                            mode[l->in[0].index] == LANE_RUN;
        if (l->domain == MD_USER && fuse[li] < 0 && !on_stream && li != d->logits_layer)
            mode[li] = LANE_RUN;
        else if (!on_lane)
            mode[li] = LANE_MAIN;
        else if ((md_ops[l->op]->flags & OP_LANE_SPLIT) && fuse[li] < 0 && !first_on_lane)
            mode[li] = LANE_SPLIT;
        else
            mode[li] = LANE_JOIN;
    }
    return mode;
}

int lane_count(const model_def *d, const unsigned char *modes)
{
    int n = 0;
    for (int li = 0; li < d->n_layers; li++) n += modes[li] == LANE_RUN;
    return n;
}
