#!/usr/bin/env bash
# ab_device.sh - on the GPU machine: two builds packed by bench/kernels/
# ab_pack.sh, the bench model's forward alternated, then B's checks.
#
# Why this exists: a kernel change ships only if it gains in the forward
# and passes the GPU checks, both in the same call (issue 17); written once
# here instead of per session, and paced by a time budget so that what ran
# is reported even when the call is short.
#
#   bash bench/kernels/ab_device.sh [TAR]          (TAR: .carry/ab.tar.xz)
#
# Steps, each skipped once AB_SECONDS (default 280) have passed since the
# start (a skipped step is named in the table):
#   1. batch_phases models/bench/1 --shapes "16x70 1x70" --iters 100
#      --warmup 10, A B A B A B (each of ab_pack.sh's variants after B in
#      every round): ops GPU us and ratio to floors at 16 x 70, the ops
#      whose median moved against A's (bench/kernels/phases_ops.py),
#      and score[0] of each shape, equal across A and B to the five
#      decimals batch_phases prints (a sanity check, not a bitwise one)
#      unless AB_SAME_SCORES=0 (a change that reorders a sum may move them;
#      the checks of step 4 judge numerics either way);
#   2. 1 x 70 with batch graphs (--graphs 16 --no-profile), A, B, the variants;
#   3. with AB_NCU=REGEX, ncu of the kernels matching it in the 16 x 70
#      forward, A then B (time, grid, registers, DRAM bytes);
#   4. B's test_cuda_ops --quick bf16, test_cuda_model bf16 over the nine
#      packed models, test_cuda_ops --quick fp16 and fp32, test_cuda_model
#      fp16 and fp32 over the bench model and m_fold (the fold's mlp2), and
#      compute-sanitizer memcheck over m_fold in bf16.
# Logs go to $OUT (the device tool's folder, which returns at most 8 files:
# each run's log is appended to one file per step) or /tmp/ikbo-ab-out; a
# table is printed last. Exit 1 if a check failed or the scores differ. PY: the
# Python with torch that makes the bench model (default python3).
set -uo pipefail
cd "$(dirname "$0")/../.."
TAR=${1:-.carry/ab.tar.xz}
OUT=${OUT:-/tmp/ikbo-ab-out}
BUDGET=${AB_SECONDS:-280}
T0=$SECONDS
left() { [ $((SECONDS - T0)) -lt "$BUDGET" ]; }
mkdir -p "$OUT"
[ -f "$TAR" ] || { echo "ab_device: $TAR not found (bench/kernels/ab_pack.sh makes it)" >&2; exit 2; }
xz -dc "$TAR" | tar xf - || { echo "ab_device: cannot unpack $TAR" >&2; exit 2; }
rows=() rc=0
note() { rows+=("$(printf '%-24s %s' "$1" "$2")"); }
RUN_LOG=$(mktemp)
trap 'rm -f "$RUN_LOG"' EXIT
keep() { { echo "=== $2"; cat "$RUN_LOG"; } >> "$OUT/$1"; } # file run: RUN_LOG appended
: > "$OUT/phases.log"; : > "$OUT/graphs.log" # this call's runs only (OUT may be reused)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
cat v/REFS
[ -f models/bench/1/model.json ] || ${PY:-python3} models/bench/make_bench_model.py > /dev/null 2>&1 ||
  { echo "ab_device: making the bench model failed" >&2; exit 1; }

# 1. The forward alternated; scores compared across builds.
BUILDS=$(awk '{print $1}' v/REFS | paste -sd' ') # A B, then ab_pack.sh's variants
declare -A score
for run in $(for i in 1 2 3; do for v in $BUILDS; do echo "$v.$i"; done; done); do
  v=${run%.*}
  left || { note "phases $run" "skipped (budget)"; continue; }
  log=$RUN_LOG
  timeout 60 v/$v/batch_phases models/bench/1 --device cuda:0 --shapes "16x70 1x70" \
      --iters 100 --warmup 10 > "$log" 2>&1
  r=$?
  keep phases.log "$run"
  s=$(grep -o 'score\[0\] [-0-9.e]*' "$log" | awk '{print $2}' | paste -sd' ')
  if [ $r = 0 ]; then
    note "phases $run" "$(grep -m1 'sum of floors' "$log" | sed 's/ | ceilings.*//; s/^ *//') scores $s"
  else
    note "phases $run" "rc=$r $(tail -n 1 "$log" | cut -c1-90)"
    rc=1
  fi
  if [ -n "${score[$v]:-}" ] && [ "${score[$v]}" != "$s" ]; then note "scores $v" "differ between runs"; rc=1; fi
  score[$v]=$s
done
if [ -n "${score[A]:-}" ] && [ -n "${score[B]:-}" ]; then
  if [ "${score[A]}" = "${score[B]}" ]; then
    note "scores A vs B" "equal"
  else
    note "scores A vs B" "differ: ${score[A]} / ${score[B]}"
    [ "${AB_SAME_SCORES:-1}" = 0 ] || rc=1
  fi
fi

# B's registers and spills against A's, as ab_pack.sh found them (compile time).
if [ -f v/SPILLS ]; then
  while IFS= read -r line; do
    note "spills B vs A" "$line"
  done < <(grep -E '^differs|kernel instances differ|no CUDA source|^spills:' v/SPILLS | tail -n 12)
fi

# Each op's median per build, the ops that moved against A named in the table
# (a gain in one op can hide a loss in another behind the totals).
if [ -s "$OUT/phases.log" ]; then
  while IFS= read -r line; do
    note "op moved" "$line"
  done < <(python3 bench/kernels/phases_ops.py "$OUT/phases.log" 2>&1 | tail -n 25)
fi

# 2. 1 x 70 with batch graphs.
for v in $BUILDS; do
  left || { note "graphs 1x70 $v" "skipped (budget)"; continue; }
  log=$RUN_LOG
  timeout 60 v/$v/batch_phases models/bench/1 --device cuda:0 --shapes 1x70 --iters 400 \
      --warmup 20 --no-profile --graphs 16 > "$log" 2>&1
  r=$?
  keep graphs.log "$v"
  [ $r = 0 ] || rc=1
  note "graphs 1x70 $v" "rc=$r $( (grep -m1 'graphs 16' "$log" || tail -n 1 "$log") | sed 's/^ *//' | cut -c1-90)"
done

# 3. ncu of the kernels named by AB_NCU.
if [ -n "${AB_NCU:-}" ]; then
  M=gpu__time_duration.sum,launch__grid_size,launch__registers_per_thread,launch__occupancy_limit_registers,dram__bytes_read.sum,dram__bytes_write.sum
  for v in A B; do
    left || { note "ncu $v" "skipped (budget)"; continue; }
    timeout 90 ncu --cache-control none --clock-control none --kernel-name "regex:$AB_NCU" \
        --launch-skip 6 --launch-count 6 --metrics $M v/$v/batch_phases models/bench/1 \
        --device cuda:0 --shapes 16x70 --iters 3 --warmup 1 --no-profile > "$OUT/ncu_$v.log" 2>&1
    note "ncu $v" "rc=$? $OUT/ncu_$v.log"
    awk '/^  [a-z_]+<|^  void /{print "  " $0} / (gpu__time|launch__grid|launch__reg|dram__bytes)/{print "    " $1, $NF}' \
        "$OUT/ncu_$v.log" | head -n 48
  done
fi

# 4. B's checks.
check() { # name cmd... (its log appended to $OUT/checks.log: the device returns at most 8 files)
  local name=$1
  shift
  left || { note "$name" "skipped (budget)"; return; }
  "$@" > "$RUN_LOG" 2>&1
  local r=$?
  keep checks.log "$name"
  note "$name" "rc=$r $(tail -n 1 "$RUN_LOG" | cut -c1-100)"
  [ $r = 0 ] || rc=1
}
: > "$OUT/checks.log"
G=build/gpu/models
check "B test_cuda_ops bf16" timeout 120 v/B/test_cuda_ops --quick --dtype bf16
check "B test_cuda_model bf16" env IKBO_CUDA_DTYPE=bf16 timeout 120 v/B/test_cuda_model \
    $G/r0/1 $G/r1/1 $G/r3/1 $G/r5/1 $G/f_seq41/1 $G/f_hstu51/1 $G/demo/1 $G/f_dlrm11/1 $G/m_fold/1
check "B test_cuda_ops fp16" timeout 120 v/B/test_cuda_ops --quick --dtype fp16
check "B test_cuda_ops fp32" timeout 120 v/B/test_cuda_ops --quick --dtype fp32
for d in fp16 fp32; do
  check "B test_cuda_model $d" env IKBO_CUDA_DTYPE=$d timeout 120 v/B/test_cuda_model \
      models/bench/1 $G/m_fold/1
done
check "B memcheck m_fold" env IKBO_CUDA_DTYPE=bf16 IKBO_TEST_NO_OOM=1 timeout 150 \
    compute-sanitizer --tool memcheck --error-exitcode 3 v/B/test_cuda_model $G/m_fold/1

echo "== ab_device: $(paste -sd';' v/REFS), $((SECONDS - T0)) s"
printf '%s\n' "${rows[@]}"
exit $rc
