/* wr_ring.h - which slot and which mbarrier phase each tile of
 * kernels/cuda/linear_wr.cu's ring uses.
 *
 * Why this exists: the schedule is where that kernel's race was (one full
 * barrier per slot shared by two consumers, so a parity wait could take the
 * other consumer's pending phase for its own; bench/RESULTS.md,
 * 2026-12-05). Kept apart from the kernel so that tests/unit/test_wr_ring.c
 * can run these same functions on the CPU against every order in which a
 * CTA's loads can land, and fail if any consumer could read a slot before
 * its tile is there.
 *
 * A CTA's tiles are i = 0, 1, ...: one producer thread loads tile i into
 * slot wr_slot(i) once the slot is released; consumer wr_consumer(i) waits
 * on full barrier wr_full_bar(i) for parity wr_full_parity(i), then releases
 * the slot on empty[wr_slot(i)], whose parity the producer waits with
 * wr_empty_parity(i). A barrier's k-th phase completes with the k-th tile
 * that uses it. Header-only, pure functions (C and CUDA).
 */
#ifndef IKBO_KERNELS_CUDA_WR_RING_H
#define IKBO_KERNELS_CUDA_WR_RING_H

#ifdef __CUDACC__
#define WR_FN static __host__ __device__ __forceinline__
#else
#define WR_FN static inline
#endif

#define WR_STAGES 3    /* x tiles in flight                                 */
#define WR_CONSUMERS 2 /* consumer warpgroups, taking tiles in turn          */
/* Full barriers: one per (slot, consumer) pair, so every phase of one is
 * waited on by the same consumer, which has seen the previous one. */
#define WR_FULL (WR_CONSUMERS * WR_STAGES)

WR_FN int wr_slot(int i) { return i % WR_STAGES; }
WR_FN int wr_consumer(int i) { return i % WR_CONSUMERS; }
WR_FN int wr_full_bar(int i) { return i % WR_FULL; }
WR_FN unsigned wr_full_parity(int i) { return (unsigned)(i / WR_FULL) & 1u; }
/* The producer waits for the previous use of the slot (tile i - WR_STAGES)
 * to be released; the first round passes at once. */
WR_FN unsigned wr_empty_parity(int i) { return ((unsigned)(i / WR_STAGES) & 1u) ^ 1u; }

#endif
