/* mma_util.cuh - the warp-level tensor-core and async-copy primitives the
 * IKBO kernels (lce.cu, attention.cu) are written in.
 *
 * Why this exists: both kernels stage tiles with cp.async (16-byte copies
 * that bypass registers, zero-filling what lies outside the tensor), load
 * fragments with ldmatrix and multiply with mma.sync m16n8k16 (bf16 or fp16
 * in, fp32 accumulate). One copy of the inline PTX, used by both.
 *
 * Fragment layouts (PTX ISA, mma.m16n8k16, g = lane / 4, t = lane % 4):
 *   A (16x16, row): a0 (g, 2t..2t+1) a1 (g+8, 2t..) a2 (g, 2t+8..) a3 (g+8, 2t+8..)
 *   B (16x8, col):  b0 (k 2t..2t+1, n g) b1 (k 2t+8.., n g)
 *   C (16x8):       c0,c1 (g, 2t..2t+1)  c2,c3 (g+8, 2t..2t+1)
 */
#ifndef IKBO_MMA_UTIL_CUH
#define IKBO_MMA_UTIL_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

__device__ __forceinline__ uint32_t smem_u32(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* 16-byte global->shared copy; src_bytes 0 writes zeros and reads nothing. */
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, bool valid)
{
    int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(smem)),
                 "l"(gmem), "r"(n));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int N> __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void *smem)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(smem)));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void *smem)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(smem)));
}

/* d += a * b for one m16n8k16 tile; T selects bf16 or fp16 inputs. */
template <typename T> __device__ __forceinline__ void mma16816(float d[4], const uint32_t a[4],
                                                               const uint32_t b[2]);

/* d = a * b + c for one m16n8k16 tile, c's pair (c.x, c.y) in both of
 * the thread's rows: a bias in the accumulator's place, no adds after. */
template <typename T> __device__ __forceinline__ void mma16816_c(float d[4], const uint32_t a[4],
                                                                 const uint32_t b[2], float2 c);

/* Both, for input type T spelled TY in PTX. */
#define IKBO_MMA16816(T, TY)                                                                      \
    template <>                                                                                   \
    __device__ __forceinline__ void mma16816<T>(float d[4], const uint32_t a[4],                  \
                                                const uint32_t b[2])                              \
    {                                                                                             \
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." TY "." TY ".f32 "                   \
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"                     \
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                             \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));         \
    }                                                                                             \
    template <>                                                                                   \
    __device__ __forceinline__ void mma16816_c<T>(float d[4], const uint32_t a[4],                \
                                                  const uint32_t b[2], float2 c)                  \
    {                                                                                             \
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." TY "." TY ".f32 "                   \
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%10,%11};\n"                 \
                     : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])                             \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),          \
                       "f"(c.x), "f"(c.y));                                                       \
    }
IKBO_MMA16816(__nv_bfloat16, "bf16")
IKBO_MMA16816(__half, "f16")
#undef IKBO_MMA16816

/* Two fp32 values packed as one 32-bit pair of T (low half = x). */
template <typename T> __device__ __forceinline__ uint32_t pack2(float x, float y);

template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float x, float y)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(x, y);
    return *(uint32_t *)&v;
}

template <> __device__ __forceinline__ uint32_t pack2<__half>(float x, float y)
{
    __half2 v = __floats2half2_rn(x, y);
    return *(uint32_t *)&v;
}

/* pack2 of max(x, 0) and max(y, 0) in one conversion (cvt's .relu: the
 * same pair as clamping first, since rounding keeps the sign; a NaN stays
 * NaN, where fmaxf would give 0). */
template <typename T> __device__ __forceinline__ uint32_t pack2_relu(float x, float y);

template <> __device__ __forceinline__ uint32_t pack2_relu<__nv_bfloat16>(float x, float y)
{
    uint32_t v;
    asm("cvt.rn.relu.bf16x2.f32 %0, %1, %2;\n" : "=r"(v) : "f"(y), "f"(x));
    return v;
}

template <> __device__ __forceinline__ uint32_t pack2_relu<__half>(float x, float y)
{
    uint32_t v;
    asm("cvt.rn.relu.f16x2.f32 %0, %1, %2;\n" : "=r"(v) : "f"(y), "f"(x));
    return v;
}

/* Four 8x8 b16 matrices from registers to shared memory, each transposed:
 * r[k] is this lane's pair of matrix k (row lane / 4, columns 2 (lane % 4)
 * and + 1, as mma fragments hold them), which lands in shared rows 2
 * (lane % 4) and + 1 at element lane / 4; lane 8k + i gives the 16-byte
 * aligned address of shared row i of matrix k. */
__device__ __forceinline__ void stmatrix_x4_trans(void *smem, const uint32_t r[4])
{
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(
                     smem_u32(smem)),
                 "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
                 : "memory");
}

/* stmatrix without .trans: matrix k's row i (lane 8k + i's address) gets
 * the pairs as mma fragments hold them (lane l: row l / 4, columns
 * 2 (l % 4) and + 1). */
__device__ __forceinline__ void stmatrix_x4(void *smem, const uint32_t r[4])
{
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(
                     smem_u32(smem)),
                 "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
                 : "memory");
}

/* pack2's inverse: the pair (low half first) as two fp32 values. */
template <typename T> __device__ __forceinline__ float2 unpack2(uint32_t v);

template <> __device__ __forceinline__ float2 unpack2<__nv_bfloat16>(uint32_t v)
{
    return __bfloat1622float2(*(__nv_bfloat162 *)&v);
}

template <> __device__ __forceinline__ float2 unpack2<__half>(uint32_t v)
{
    return __half22float2(*(__half2 *)&v);
}

/* ---- Hopper wgmma (sm_90a): warpgroup-wide async matrix multiply ---- */

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit()
{
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void wg_wait()
{
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* Pins accumulator registers in place around async wgmma (no compiler
 * reordering of their reads/writes across the fence/wait). */
template <int N> __device__ __forceinline__ void wg_fence_regs(float *d)
{
#pragma unroll
    for (int i = 0; i < N; i++)
        asm volatile("" : "+f"(d[i])::"memory");
}

/* Shared-memory matrix descriptor, 128-byte swizzle: start address, leading
 * and stride byte offsets (PTX ISA "matrix descriptor format"). Tiles are
 * stored as rows of 128 bytes, 8-row atoms of 1024 bytes, 16-byte chunk c of
 * row r at chunk (c ^ (r % 8)) - what TMA's SWIZZLE_128B writes. */
__device__ __forceinline__ uint64_t wg_desc(const void *smem, uint32_t lbo, uint32_t sbo)
{
    uint64_t a = smem_u32(smem);
    return ((a & 0x3FFFF) >> 4) | ((uint64_t)((lbo >> 4) & 0x3FFF) << 16) |
           ((uint64_t)((sbo >> 4) & 0x3FFF) << 32) | (1ull << 62);
}

/* Bulk shared->global copies (the TMA unit, no tensor map): stores drain
 * while the SM computes. Shared data written by ordinary stores needs
 * fence_proxy_async() in each writing thread before the barrier that
 * precedes the copy; a buffer may be rewritten after bulk_wait_read. */
__device__ __forceinline__ void fence_proxy_async()
{
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void bulk_store(void *gdst, const void *ssrc, uint32_t bytes)
{
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(gdst),
                 "r"(smem_u32(ssrc)), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void bulk_wait_read()
{
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
template <int N> __device__ __forceinline__ void bulk_wait()
{
    asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

/* Transposes a lane quad's 4 x 4 matrix of 32-bit values: lane t's v[j]
 * becomes lane j's v[t] (two butterfly stages). */
__device__ __forceinline__ void quad_transpose(uint32_t v[4], int t)
{
#pragma unroll
    for (int s = 1; s <= 2; s <<= 1) {
        const bool hi = t & s;
#pragma unroll
        for (int k = 0; k < 4; k++)
            if (!(k & s)) {
                uint32_t send = hi ? v[k] : v[k + s];
                uint32_t got = __shfl_xor_sync(0xffffffffu, send, s);
                if (hi)
                    v[k] = got;
                else
                    v[k + s] = got;
            }
    }
}

/* Byte offset of 16-byte chunk c of row r in a 128B-swizzled tile. */
__device__ __forceinline__ uint32_t sw128(int r, int c) { return r * 128 + ((c ^ (r & 7)) << 4); }

#endif
