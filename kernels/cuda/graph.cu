/* graph.cu - batch graphs: a batch's launches recorded once as a CUDA graph
 * and replayed for later batches of the same shape.
 *
 * Why this exists: a small batch (1 user x 70 candidates) is ~30 launches
 * of a few microseconds each; issued one by one from the host, the GPU
 * waits for the host between them. A graph is one launch. The engine
 * decides which batches share a graph (engine/batch_graph.h); this file
 * records and replays on one stream, and refuses every replay it cannot
 * prove safe:
 * - a graph recorded at another `gen` of the stream (its staging or
 *   scratch was reallocated since, so the graph points at freed memory);
 * - an upload that stages to another address or size than at recording
 *   (the bytes would not reach the graph's copy node);
 * - an op called while replaying (its launch would run outside the graph).
 * A recording takes in the stream's lane (be->lane) from the lane's first
 * wait for the stream; the lane rejoins before the recording ends.
 * The recording uses cudaStreamCaptureModeThreadLocal, so other instances'
 * threads keep working; anything illegal in a capture (a stream wait to
 * grow scratch, a new cuBLASLt workspace) fails the recording and the
 * engine computes the batch normally.
 *
 * Thread-safety: a stream and its graphs belong to one thread at a time.
 */
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_internal.h"

typedef struct cu_gcopy {
    void *dst;
    const void *src;
    size_t bytes;
} cu_gcopy;

struct bk_graph {
    bk_stream *s;
    cudaGraphExec_t exec; /* NULL until the recording ended well */
    unsigned long gen;    /* the stream's gen when recorded */
    cu_gcopy *copy;       /* the staged copies, in order */
    int n, cap;
};

static void graph_free(bk_graph *g)
{
    if (!g)
        return;
    if (g->exec)
        cudaGraphExecDestroy(g->exec);
    free(g->copy);
    free(g);
}

int cu_graph_refuse(bk_stream *s, bk_err *err)
{
    if ((s->owner ? s->owner : s)->gmode != CU_G_REPLAY)
        return 0;
    bk_seterr(err, "graph replay: an op was called; a replayed batch only stages its uploads");
    return -1;
}

int cu_copy(bk_stream *s, void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
            bk_err *err)
{
    const char *what = kind == cudaMemcpyDeviceToHost ? "download" : "upload";
    if (s->gmode == CU_G_REPLAY) {
        const bk_graph *g = s->gplay;
        const cu_gcopy *c = s->gnext < g->n ? &g->copy[s->gnext] : NULL;
        if (!c || c->dst != dst || c->src != src || c->bytes != bytes) {
            bk_seterr(err, "graph replay: %s %d (%zu bytes) differs from the recording", what,
                      s->gnext, bytes);
            return -1;
        }
        s->gnext++;
        return 0;
    }
    if (cu_check(cudaMemcpyAsync(dst, src, bytes, kind, s->st), err, what))
        return -1;
    if (s->gmode == CU_G_CAPTURE) {
        bk_graph *g = s->grec;
        if (g->n == g->cap) {
            int cap = g->cap ? 2 * g->cap : 8;
            cu_gcopy *p = (cu_gcopy *)realloc(g->copy, (size_t)cap * sizeof *p);
            if (!p) {
                bk_seterr(err, "graph capture: out of host memory");
                return -1;
            }
            g->copy = p;
            g->cap = cap;
        }
        g->copy[g->n++] = (cu_gcopy){dst, src, bytes};
    }
    return 0;
}

/* Ends the recording: the captured graph, instantiated into g->exec. */
static int end_capture(bk_stream *s, bk_graph *g, bk_err *err)
{
    cudaGraph_t gr = NULL;
    if (cu_check(cudaStreamEndCapture(s->st, &gr), err, "graph capture: end"))
        return -1;
    int rc = 0;
    if (bk_fault_hit(&s->be->fault, BK_FAULT_GRAPH)) {
        bk_seterr(err, "graph capture: instantiate failed" BK_FAULT_INJECTED);
        rc = -1;
    } else {
        /* Node priorities as captured: the lane's launches keep its high
         * priority on replay (without the flag a graph runs at the priority
         * of the stream it is launched into). */
        rc = cu_check(cudaGraphInstantiate(&g->exec, gr, cudaGraphInstantiateFlagUseNodePriority), err,
                      "graph capture: instantiate");
        if (rc)
            g->exec = NULL;
    }
    cudaGraphDestroy(gr);
    return rc;
}

int cu_graph_run(bk_stream *s, bk_err *err)
{
    int mode = s->gmode;
    s->gmode = CU_G_OFF;
    if (mode == CU_G_OFF)
        return 0;
    const bk_graph *g = s->gplay;
    if (mode == CU_G_CAPTURE) {
        if (end_capture(s, s->grec, err)) {
            graph_free(s->grec);
            s->grec = NULL;
            return -1;
        }
        g = s->grec;
    } else if (s->gnext != g->n) {
        bk_seterr(err, "graph replay: %d of the recording's %d copies were staged", s->gnext,
                  g->n);
        return -1;
    } else if (bk_fault_hit(&s->be->fault, BK_FAULT_GRAPH)) {
        bk_seterr(err, "graph replay: launch failed" BK_FAULT_INJECTED);
        return -1;
    }
    return cu_check(cudaGraphLaunch(g->exec, s->st), err, "graph launch");
}

static int graph_capture(bk_stream *s, bk_err *err)
{
    if (s->gmode != CU_G_OFF || s->grec) {
        bk_seterr(err, "graph capture: the stream is already recording or replaying");
        return -1;
    }
    if (s->prof) {
        bk_seterr(err, "graph capture: not while IKBO_CUDA_PROFILE times each op");
        return -1;
    }
    if (s->host.used) {
        bk_seterr(err, "graph capture: the stream's staging is in use (a batch is in flight)");
        return -1;
    }
    if (cu_enter(s, err))
        return -1;
    bk_graph *g = (bk_graph *)calloc(1, sizeof *g);
    if (!g) {
        bk_seterr(err, "graph capture: out of host memory");
        return -1;
    }
    g->s = s;
    g->gen = s->gen;
    if (cu_check(cudaStreamBeginCapture(s->st, cudaStreamCaptureModeThreadLocal), err,
                 "graph capture: begin")) {
        free(g);
        return -1;
    }
    s->grec = g;
    s->gmode = CU_G_CAPTURE;
    return 0;
}

static bk_graph *graph_take(bk_stream *s)
{
    bk_graph *g = s->gmode == CU_G_OFF && s->grec && s->grec->exec ? s->grec : NULL;
    if (g)
        s->grec = NULL;
    return g;
}

static int graph_replay(bk_stream *s, const bk_graph *g, bk_err *err)
{
    if (s->gmode != CU_G_OFF || s->grec) {
        bk_seterr(err, "graph replay: the stream is already recording or replaying");
        return -1;
    }
    if (!g || g->s != s || !g->exec) {
        bk_seterr(err, "graph replay: not a graph this stream recorded");
        return -1;
    }
    if (g->gen != s->gen) {
        bk_seterr(err, "graph replay: the stream's buffers moved since the graph was recorded");
        return -1;
    }
    if (s->host.used) {
        bk_seterr(err, "graph replay: the stream's staging is in use (a batch is in flight)");
        return -1;
    }
    s->gplay = g;
    s->gnext = 0;
    s->gmode = CU_G_REPLAY;
    return 0;
}

static void graph_cancel(bk_stream *s)
{
    if (s->gmode == CU_G_CAPTURE) {
        cudaGraph_t gr = NULL;
        cudaSetDevice(cu_impl(s->be)->ordinal);
        bk_err ignore;
        (void)cu_lane_join(s, &ignore); /* a forked lane must rejoin for the capture to end */
        if (cudaStreamEndCapture(s->st, &gr) == cudaSuccess && gr)
            cudaGraphDestroy(gr);
        (void)cudaGetLastError();
    }
    s->gmode = CU_G_OFF;
    s->lane_open = 0;
    s->gplay = NULL;
    graph_free(s->grec);
    s->grec = NULL;
}

void cu_graph_stream_free(bk_stream *s) { graph_cancel(s); }

void cu_graph_install(bk_backend *be)
{
    be->graph_capture = graph_capture;
    be->graph_take = graph_take;
    be->graph_replay = graph_replay;
    be->graph_cancel = graph_cancel;
    be->graph_free = graph_free;
}
