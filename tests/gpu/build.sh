#!/usr/bin/env bash
# build.sh - builds the GPU checks and the kernel benchmark into build/gpu/.
#
# Why this exists: the GPU machine cannot build (no project dependencies);
# these binaries are built here, carried there (`carry: ["build/gpu"]`) and
# run by bench/kernels/run.sh. CI (no GPU) may run this too: it only
# compiles. Also writes the random test models (tools/reference) once;
# --no-models skips that (no PyTorch needed, e.g. a compile-only CI step);
# --checks-only builds test_cuda_ops, test_cuda_model and batch_phases alone,
# no models (what bench/kernels/ab_pack.sh carries); --phases-only builds
# batch_phases alone. LIB=path links that library instead of making
# build/libikbo.a (ab_pack.sh's variants: build/libikbo.a with one object
# rebuilt with other -D flags).
set -euo pipefail
models=1 bench=1 checks=1
for a in "$@"; do
  case $a in
  --no-models) models=0 ;;
  --checks-only) bench=0 ;;
  --phases-only) bench=0 checks=0 ;;
  *) echo "build.sh: unknown argument $a (expected --no-models, --checks-only, --phases-only)" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/../.."
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$NVCC")")}
B=${B:-build/gpu}
mkdir -p $B
[ -n "${LIB:-}" ] || { make -s build/libikbo.a; LIB=build/libikbo.a; }
CUDA_LIBS="-L$CUDA_HOME/lib64 -Wl,-rpath,$CUDA_HOME/lib64 -lcublasLt -lcublas -lcudart"
CFLAGS="-O2 -g -std=gnu11 -Wall -Wextra -Werror -I. -DIKBO_CUDA"
if [ $checks = 1 ]; then
  gcc $CFLAGS -o $B/test_cuda_ops tests/gpu/test_cuda_ops.c "$LIB" $CUDA_LIBS -lm -lpthread -lstdc++
  gcc $CFLAGS -o $B/test_cuda_model tests/gpu/test_cuda_model.c "$LIB" \
      -Wl,-Bstatic -ljansson -Wl,-Bdynamic $CUDA_LIBS -lm -lpthread -lstdc++
fi
# Where a batch's time goes (bench/e2e/batch_phases.c, run by bench/e2e/device.sh phases).
gcc $CFLAGS -o $B/batch_phases bench/e2e/batch_phases.c "$LIB" \
    -Wl,-Bstatic -ljansson -Wl,-Bdynamic $CUDA_LIBS -lm -lpthread -lstdc++
[ $bench = 1 ] || { du -sh $B; exit 0; }
# backend.h lost() against a real illegal address (bench/e2e/device.sh faults).
"$NVCC" -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xcompiler -Wall -I. \
    -o $B/test_cuda_lost tests/gpu/test_cuda_lost.cu "$LIB" \
    -Xlinker -rpath -Xlinker "$CUDA_HOME/lib64" -lcublasLt -lcublas
# The benchmark links the bench-only kernel variants (bench/kernels/variants.cuh).
"$NVCC" -O3 -lineinfo -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xcompiler -Wall -I. \
    -o $B/bench_kernels bench/kernels/bench_kernels.cu bench/kernels/lce_v*.cu \
    bench/kernels/attention_v*.cu "$LIB" \
    -Xlinker -rpath -Xlinker "$CUDA_HOME/lib64" -lcublasLt -lcublas
[ $models = 1 ] || { du -sh $B; exit 0; }
# Random models of several shapes (SIMT and tensor-core paths, adds, no history).
PY=${PY:-/usr/bin/python3}
mk() { [ -f "$B/models/$1/1/model.json" ] || $PY tools/reference/random_model.py --out "$B/models/$1/1" "${@:2}" >/dev/null; }
mk r0 --seed 1
mk r1 --seed 2 --dim 64 --heads 2 --head-dim 32 --out-tokens 32 --user-dense-tokens 3 --cand-dense-tokens 4 --max-len 200 --mlp-width 64 --add both
mk r2 --seed 3 --dim 128 --heads 2 --head-dim 64 --out-tokens 48 --user-dense-tokens 2 --cand-dense-tokens 8 --max-len 300 --mlp-width 128 --add vector --user-sparse 3
mk r3 --seed 4 --dim 256 --heads 2 --head-dim 128 --out-tokens 40 --user-dense-tokens 2 --cand-dense-tokens 4 --max-len 1024 --mlp-width 64 --rows 10-500
mk r4 --seed 5 --no-history --add tokens --dim 24 --out-tokens 7 --cand-dense-tokens 3
# LCE wide enough for the wgmma kernel (M >= 64, D >= 64): N = 128 and N = 224 tiles.
mk r5 --seed 6 --dim 64 --heads 2 --head-dim 64 --out-tokens 100 --user-dense-tokens 3 --cand-dense-tokens 4 --max-len 100 --mlp-width 64 --rows 10-800
mk r6 --seed 7 --dim 128 --heads 2 --head-dim 128 --out-tokens 230 --user-dense-tokens 2 --cand-dense-tokens 3 --max-len 64 --mlp-width 64 --rows 10-400 --add vector
# The fold with an mlp2 part (engine/fold.h): c_d1's 640 hidden units (five chunks) from 3 inputs.
mk m_fold --seed 708 --no-history --dim 32 --cand-sparse 2 --cand-dense-tokens 20 --out-tokens 16 --mlp-layers 2 --mlp-width 8
# Random models of the ranking architectures (tools/reference/random_family.py).
fam() { [ -f "$B/models/f_$1$2/1/model.json" ] || $PY tools/reference/random_family.py --family $1 --seed $2 --out "$B/models/f_$1$2/1" >/dev/null; }
for s in 11 13; do fam dlrm $s; done; for s in 21 23; do fam dcn $s; done; for s in 31 33; do fam mmoe $s; done
for s in 41 43; do fam seq $s; done; for s in 51 53; do fam hstu $s; done
if [ -f models/demo/1/model.json ]; then mkdir -p $B/models/demo && rm -rf $B/models/demo/1 && cp -r models/demo/1 $B/models/demo/1; fi
du -sh $B
