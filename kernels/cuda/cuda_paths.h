/* cuda_paths.h - forcing a fallback kernel of the CUDA backend's IKBO ops,
 * for tests and benchmarks only.
 *
 * Why this exists: production picks the LCE and attention kernels from each
 * call's shape, dtype and alignment alone (the tables in lce.cu and
 * attention.cu); no environment variable chooses one. The GPU tests must
 * still run every fallback kernel over the shapes the fastest kernel would
 * take, and bench_kernels times the fallbacks beside it, so both may force
 * one backend onto a fallback here. A forced path is still only used where
 * its kernel applies (mma.sync needs bf16/fp16 and aligned operands; SIMT
 * applies everywhere). Nothing on the serving path calls this. C and C++.
 */
#ifndef IKBO_CUDA_PATHS_H
#define IKBO_CUDA_PATHS_H

#include "kernels/backend.h"

enum cu_path {
    CU_PATH_AUTO = 0, /* production: chosen by shape, dtype, alignment       */
    CU_PATH_MMA = 1,  /* mma.sync where it applies (never wgmma), else SIMT  */
    CU_PATH_SIMT = 2  /* the SIMT kernel everywhere                          */
};

/* Sets the paths of be's lce and attention (target and self) ops from now
 * on; -1 with err set when be is not a CUDA backend or a path is unknown. */
int bk_cuda_force_path(bk_backend *be, int lce, int attention, bk_err *err);

#endif
