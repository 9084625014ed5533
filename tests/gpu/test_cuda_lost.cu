/* test_cuda_lost.cu - the CUDA backend's lost() (backend.h) against real
 * device errors, which IKBO_FAULT cannot make:
 *   1. an error that leaves the context usable (a launch with no blocks:
 *      cudaErrorInvalidConfiguration, or cudaErrorInvalidValue as CUDA 13
 *      with driver 580 reports it) is not a loss: lost() says 0 and the
 *      stream still computes;
 *   2. a kernel that stores to an unmapped address (cudaErrorIllegalAddress,
 *      one of the runtime's "sticky" errors) is: the stream's wait fails,
 *      lost() says 1 naming the error, and a later allocation fails without
 *      calling it "out of device memory".
 * In that order, in one process: after case 2 the context is gone. The
 * server turns lost() into UNAVAILABLE answers and exit 3 (server/main.c).
 * Run on a GPU machine (bench/e2e/device.sh faults); exit 0 when every
 * check passes, 1 naming the first that failed.
 */
#include <stdio.h>
#include <string.h>

#include "kernels/cuda/cuda_internal.h"

__global__ void k_store(int *p) { *(volatile int *)p = 1; }

static int fail(const char *what, const char *msg)
{
    printf("FAIL %s%s%s\n", what, msg && *msg ? ": " : "", msg ? msg : "");
    return 1;
}

int main()
{
    bk_err err = {{0}}, why = {{0}};
    bk_backend *be = bk_backend_new("cuda:0", &err);
    if (!be)
        return fail("backend", err.msg);
    bk_stream *s = be->stream_new(be, &err);
    if (!s)
        return fail("stream", err.msg);

    /* 1. Not a loss. */
    k_store<<<0, 1, 0, s->st>>>(nullptr);
    cudaError_t e = cudaGetLastError();
    if (e != cudaErrorInvalidConfiguration && e != cudaErrorInvalidValue)
        return fail("a launch of no blocks", cudaGetErrorName(e));
    printf("ok   a launch of no blocks failed: %s\n", cudaGetErrorName(e));
    if (be->lost(be, &why))
        return fail("lost() after an invalid configuration said 1", why.msg);
    void *ok = be->alloc(be, 256, BK_TAG_CAND, &err);
    if (!ok || be->sync(s, &err))
        return fail("the device after an invalid configuration", err.msg);
    be->free(be, ok, 256, BK_TAG_CAND);
    printf("ok   an invalid launch configuration is not a loss\n");

    /* 2. A loss. */
    k_store<<<1, 1, 0, s->st>>>((int *)(uintptr_t)0x10);
    if (cudaGetLastError() != cudaSuccess)
        return fail("the faulting launch itself failed", NULL);
    memset(&err, 0, sizeof err);
    if (be->sync(s, &err) == 0)
        return fail("the wait after an illegal address succeeded", NULL);
    printf("ok   the wait failed: %s\n", err.msg);
    memset(&why, 0, sizeof why);
    if (be->lost(be, &why) != 1)
        return fail("lost() after an illegal address said 0", NULL);
    if (!strstr(why.msg, "cuda:0 is lost") || !strstr(why.msg, "cudaErrorIllegalAddress"))
        return fail("lost()'s message", why.msg);
    printf("ok   lost(): %s\n", why.msg);
    memset(&err, 0, sizeof err);
    if (be->alloc(be, 256, BK_TAG_CAND, &err))
        return fail("an allocation on the lost device succeeded", NULL);
    if (strstr(err.msg, "out of device memory"))
        return fail("the allocation's message calls a lost device out of memory", err.msg);
    printf("ok   a later allocation fails: %s\n", err.msg);
    printf("test_cuda_lost: passed\n");
    return 0; /* no teardown: every call on the context fails from here */
}
