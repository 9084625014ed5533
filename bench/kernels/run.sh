#!/usr/bin/env bash
# run.sh - one device call: GPU checks, sanitizer, whole-model checks, then
# the kernel benchmark; full logs under $OUT, a short table printed last.
#
# Why this exists: device time is scarce, so everything that needs the GPU
# runs from one script over binaries built here (tests/gpu/build.sh) and
# carried in build/gpu/. Stages (default: all):
#   ops      tests/gpu/test_cuda_ops, fp32 + bf16 + fp16   -> $OUT/ops.log
#   sanitize compute-sanitizer memcheck (all kernels) + racecheck (quick;
#            wgmma kernels excluded: racecheck cannot follow them) -> $OUT/sanitizer.log
#   model    tests/gpu/test_cuda_model, fp32 + bf16         -> $OUT/model.log
#   bench    bench/kernels/bench_kernels.cu                 -> $OUT/bench.log
#   graphs   batch graphs: test_cuda_model with IKBO_FAULT=graph:1 (every
#            first recording fails, batches still right), memcheck over
#            recorded and replayed batches, and build/gpu/batch_phases on
#            the bench model with and without graphs   -> $OUT/graphs.log
#   profile  ncu on the LCE candidate kernel (k_lce_ws; not in the default set)
#                                                           -> $OUT/profile.log
# Usage (device): [BENCH_ARGS="--only lce"] bench/kernels/run.sh [ops] [sanitize] [model] [bench] [graphs]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/ikbo-gpu-out}
mkdir -p "$OUT"
B=${B:-build/gpu}
stages=${*:-ops sanitize model bench}
summary=()
STAGE_NAME_WIDTH=26 STAGE_TAIL_WIDTH=110
. bench/stage_lib.sh # stage: a log under $OUT and a row of summary
{ date -u; git log -1 --format='commit %H' 2>/dev/null; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv; } > "$OUT/env.log" 2>&1
cat "$OUT/env.log"

models=$(ls -d $B/models/*/1 2>/dev/null)
for s in $stages; do
  case $s in
  ops)
    stage ops-fp32 ops.log $B/test_cuda_ops --dtype fp32
    stage ops-bf16 ops.log $B/test_cuda_ops --dtype bf16
    stage ops-fp16 ops.log $B/test_cuda_ops --dtype fp16 ;;
  sanitize)
    stage memcheck sanitizer.log env IKBO_TEST_NO_OOM=1 timeout 240 compute-sanitizer --tool memcheck --error-exitcode 3 $B/test_cuda_ops --quick --dtype bf16
    stage racecheck sanitizer.log env IKBO_TEST_NO_OOM=1 IKBO_TEST_NO_WGMMA=1 timeout 240 compute-sanitizer --tool racecheck --error-exitcode 3 $B/test_cuda_ops --quick --dtype fp16 ;;
  model)
    stage model-fp32 model.log env IKBO_CUDA_DTYPE=fp32 $B/test_cuda_model $models
    stage model-bf16 model.log env IKBO_CUDA_DTYPE=bf16 $B/test_cuda_model $models ;;
  bench)
    stage bench bench.log $B/bench_kernels ${BENCH_ARGS:-} ;;
  graphs)
    gm="$B/models/r1/1 $B/models/r4/1 $B/models/f_hstu51/1"
    stage graphs-fault graphs.log env IKBO_CUDA_DTYPE=fp32 IKBO_FAULT=graph:1 $B/test_cuda_model $gm
    stage graphs-memcheck graphs.log env IKBO_TEST_NO_OOM=1 timeout 300 compute-sanitizer --tool memcheck --error-exitcode 3 $B/test_cuda_model $gm
    [ -f models/bench/1/model.json ] || stage bench-model graphs.log python3 models/bench/make_bench_model.py
    stage graphs-phases graphs.log $B/batch_phases models/bench/1 --shapes "${PHASES_SHAPES:-1x70 16x70}" --graphs 16 --iters 200 --warmup 10 ;;
  profile)
    secs="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section SourceCounters"
    stage ncu-lce profile.log ncu --clock-control none -k regex:k_lce_ws --launch-skip 3 -c 1 $secs --print-details all --import-source no -f -o "$OUT/lce" $B/bench_kernels --profile
    stage ncu-lce-sass profile.log sh -c "ncu -i '$OUT/lce.ncu-rep' $secs --print-details all > '$OUT/lce_sections.txt' 2>&1; ncu -i '$OUT/lce.ncu-rep' --page source --print-source sass --csv > '$OUT/lce_sass.csv' 2>&1; rm -f '$OUT/lce.ncu-rep'; wc -l '$OUT/lce_sass.csv'" ;;
  esac
done
grep -h "^FAIL" "$OUT"/ops.log "$OUT"/model.log "$OUT"/graphs.log 2>/dev/null | head -n 25
[ -f "$OUT/graphs.log" ] && grep -h -E "^== shape|graphs [0-9]+:|graphs (ikbo|broadcast)" "$OUT/graphs.log" | head -n 30
grep -h -E "ERROR SUMMARY|RACECHECK SUMMARY|Invalid|Internal" "$OUT"/sanitizer.log 2>/dev/null | sort | uniq -c | head -n 12
# cuBLAS's own kernels (nvjet*) draw racecheck reports we cannot act on; ours are k_*.
[ -f "$OUT/sanitizer.log" ] && echo "racecheck hazards in our kernels: $(grep -c -E 'Race reported .* k_' "$OUT"/sanitizer.log)"
[ -f "$OUT/bench.log" ] && sed -n '/==== summary/,$p' "$OUT/bench.log"
echo "==== stages"
printf '%s\n' "${summary[@]}"
