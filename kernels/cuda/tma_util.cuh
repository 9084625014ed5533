/* tma_util.cuh - the warp-specialized pipeline primitives of the Hopper
 * kernels: mbarriers, TMA tensor loads and stores, named barriers, and the
 * host-side tensor-map encoder; and programmatic dependent launch.
 *
 * Why this exists: a producer warp that issues TMA copies into a ring of
 * shared-memory stages, and consumer warpgroups that wait on a stage's
 * "full" mbarrier and release it through its "empty" mbarrier, keep the
 * tensor cores fed without block-wide barriers (lce.cu, attention.cu). One copy of the
 * inline PTX (PTX ISA: mbarrier, cp.async.bulk.tensor, bar.sync), used by
 * every kernel that pipelines this way.
 *
 * Phases: a stage's barrier completes once per fill; the k-th use of a
 * stage waits for parity (k & 1). Transaction bytes count the whole box,
 * including the zeros TMA writes for out-of-bounds elements.
 */
#ifndef IKBO_TMA_UTIL_CUH
#define IKBO_TMA_UTIL_CUH

#include <cuda.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <type_traits>

#include "kernels/cuda/mma_util.cuh"

/* Programmatic dependent launch (a launch with
 * cudaLaunchAttributeProgrammaticStreamSerialization). pdl_trigger: this
 * CTA lets the dependent grid start (it may start once every CTA has
 * triggered or exited); the first call per CTA counts. pdl_wait: the
 * calling thread waits until the grid before this one has completed and its
 * writes are visible; a no-op in a grid launched plainly. A dependent must
 * wait before it reads what the grid before it writes. */
__device__ __forceinline__ void pdl_trigger()
{
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }

/* The launch attribute that makes a kernel its stream predecessor's
 * programmatic dependent. */
static inline cudaLaunchAttribute pdl_attr()
{
    cudaLaunchAttribute at;
    at.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at.val.programmaticStreamSerializationAllowed = 1;
    return at;
}

__device__ __forceinline__ void mbar_init(uint64_t *bar, uint32_t count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count));
}

/* Makes initialized barriers visible to the async proxy (TMA). */
__device__ __forceinline__ void mbar_fence_init()
{
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

/* One arrival that also announces `bytes` of TMA transactions. */
__device__ __forceinline__ void mbar_expect_tx(uint64_t *bar, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)),
                 "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint64_t *bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}

__device__ __forceinline__ bool mbar_try_wait(uint64_t *bar, uint32_t parity)
{
    uint32_t ok;
    asm volatile("{\n.reg .pred p;\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                 "selp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(ok)
                 : "r"(smem_u32(bar)), "r"(parity)
                 : "memory");
    return ok != 0;
}

__device__ __forceinline__ void mbar_wait(uint64_t *bar, uint32_t parity)
{
    while (!mbar_try_wait(bar, parity)) {
    }
}

/* TMA tensor loads into shared memory, completing on `bar`; coordinates
 * are element indices, innermost first. */
__device__ __forceinline__ void tma_load_2d(void *dst, const CUtensorMap *map, uint64_t *bar, int c0,
                                            int c1)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%3, %4}], [%2];\n" ::"r"(smem_u32(dst)),
                 "l"((uint64_t)map), "r"(smem_u32(bar)), "r"(c0), "r"(c1)
                 : "memory");
}

__device__ __forceinline__ void tma_load_3d(void *dst, const CUtensorMap *map, uint64_t *bar, int c0,
                                            int c1, int c2)
{
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(smem_u32(dst)),
                 "l"((uint64_t)map), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2)
                 : "memory");
}

/* The same 2D load, written to the same offset of every CTA in `mask`
 * (cluster ranks), each completing on its own barrier at `bar`'s offset. */
__device__ __forceinline__ void tma_load_2d_mc(void *dst, const CUtensorMap *map, uint64_t *bar,
                                               int c0, int c1, uint16_t mask)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 ".multicast::cluster [%0], [%1, {%3, %4}], [%2], %5;\n" ::"r"(smem_u32(dst)),
                 "l"((uint64_t)map), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "h"(mask)
                 : "memory");
}

__device__ __forceinline__ void tma_load_3d_mc(void *dst, const CUtensorMap *map, uint64_t *bar,
                                               int c0, int c1, int c2, uint16_t mask)
{
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 ".multicast::cluster [%0], [%1, {%3, %4, %5}], [%2], %6;\n" ::"r"(smem_u32(dst)),
                 "l"((uint64_t)map), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2), "h"(mask)
                 : "memory");
}

/* Clusters: this CTA's rank, an arrival on the barrier at `bar`'s offset
 * in CTA `rank`, and a barrier among all (non-exited) threads of the
 * cluster. */
__device__ __forceinline__ uint32_t cluster_rank()
{
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}

/* Default (.release.cta) semantics: enough for "slot empty" signals, whose
 * reads were async-proxy wgmma reads already waited for. The .release.cluster
 * form costs a MEMBAR.ALL.GPU per arrival (ncu: over half of the LCE
 * cluster kernel's warp samples). */
__device__ __forceinline__ void mbar_arrive_cluster(uint64_t *bar, uint32_t rank)
{
    uint32_t remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(smem_u32(bar)), "r"(rank));
    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(remote) : "memory");
}

__device__ __forceinline__ void cluster_sync()
{
    asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}

/* TMA tensor store from shared memory (bulk group: bulk_commit, then
 * bulk_wait_read before the buffer is rewritten). Out-of-bounds elements
 * of the box are not written. */
__device__ __forceinline__ void tma_store_3d(const CUtensorMap *map, const void *src, int c0, int c1,
                                             int c2)
{
    asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
                     (uint64_t)map),
                 "r"(smem_u32(src)), "r"(c0), "r"(c1), "r"(c2)
                 : "memory");
}

__device__ __forceinline__ void tma_store_2d(const CUtensorMap *map, const void *src, int c0, int c1)
{
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(
                     (uint64_t)map),
                 "r"(smem_u32(src)), "r"(c0), "r"(c1)
                 : "memory");
}

__device__ __forceinline__ void tma_prefetch_desc(const CUtensorMap *map)
{
    asm volatile("prefetch.tensormap [%0];\n" ::"l"((uint64_t)map) : "memory");
}

/* Barrier `id` (1..15; 0 is __syncthreads) among `n` threads (a multiple
 * of 32), e.g. one warpgroup. */
__device__ __forceinline__ void named_bar_sync(int id, int n)
{
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

/* Arrival on `bar` once all of this thread's earlier cp.async copies have
 * landed; .noinc: the arrival counts against the barrier's expected count
 * (init it with the number of threads that do this). */
__device__ __forceinline__ void cp_async_mbar_arrive_noinc(uint64_t *bar)
{
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_u32(bar))
                 : "memory");
}

/* Arrives at named barrier `id` (1..15) without waiting; with
 * named_bar_sync(id, n) in other threads, n counts both. */
__device__ __forceinline__ void named_bar_arrive(int id, int n)
{
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

/* Register budget of this warpgroup (all its threads execute it); takes
 * effect under a register cap at entry (__launch_bounds__(n, 1)). */
template <int N> __device__ __forceinline__ void setmaxnreg_dec()
{
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N> __device__ __forceinline__ void setmaxnreg_inc()
{
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

/* Bulk prefetch of `bytes` (a multiple of 16, 16-byte aligned) into L2. */
__device__ __forceinline__ void bulk_prefetch_l2(const void *g, uint32_t bytes)
{
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(g), "r"(bytes) : "memory");
}

/* ------------------------------------------------------------------ host */

/* A launch of `grid` CTAs in clusters of `cl` (1: no cluster attribute),
 * the programmatic dependent of the stream's previous kernel if pdl; at[2]
 * holds the attributes. */
static inline cudaLaunchConfig_t cluster_cfg(cudaLaunchAttribute *at, int cl, unsigned grid,
                                             unsigned threads, size_t smem, cudaStream_t st,
                                             bool pdl = false)
{
    cudaLaunchConfig_t cfg = {};
    int n = 0;
    if (cl > 1) {
        at[n].id = cudaLaunchAttributeClusterDimension;
        at[n].val.clusterDim.x = (unsigned)cl;
        at[n].val.clusterDim.y = 1;
        at[n].val.clusterDim.z = 1;
        n++;
    }
    if (pdl)
        at[n++] = pdl_attr();
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(threads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cfg.attrs = at;
    cfg.numAttrs = (unsigned)n;
    return cfg;
}

/* How many clusters of `cl` CTAs of `kern` (threads, smem each) fit on the
 * device at once: a persistent grid's size, asked once per kernel; 0 if the
 * query fails. */
static inline int max_clusters(const void *kern, unsigned threads, size_t smem, int sms, int cl)
{
    cudaLaunchAttribute at[2];
    cudaLaunchConfig_t cfg = cluster_cfg(at, cl, (unsigned)(sms / cl * cl), threads, smem, 0);
    int n = 0;
    if (cudaOccupancyMaxActiveClusters(&n, kern, &cfg) != cudaSuccess || n <= 0) {
        (void)cudaGetLastError();
        n = 0;
    }
    return n;
}

/* The tensor-map element type of a kernel's T (__half, else bf16). */
template <typename T> static inline CUtensorMapDataType cu_tmap_dtype()
{
    return std::is_same<T, __half>::value ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                          : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
}

/* Encodes a tiled tensor map (cuTensorMapEncodeTiled, reached through the
 * runtime so that nothing links libcuda directly). dims/strides innermost
 * first; strides[i] is the byte stride of dimension i + 1 (rank - 1 of
 * them, multiples of 16). Returns 0 or a CUresult. */
int cu_tmap_encode(CUtensorMap *map, CUtensorMapDataType dt, int rank, const void *base,
                   const uint64_t *dims, const uint64_t *strides, const uint32_t *box,
                   CUtensorMapSwizzle swizzle);

#endif
