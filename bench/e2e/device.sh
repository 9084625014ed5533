#!/usr/bin/env bash
# device.sh - one device call: the whole server on the GPU.
#
# Why this exists: device time is scarce and the GPU machine can build
# nothing, so binaries are built here and carried (bench/e2e/stage.sh), and
# this script runs every whole-server GPU check in one go, full logs under
# $OUT, a short table last:
#   golden   the GPU engine (fp32 activations) against the PyTorch reference,
#            demo + random models, IKBO and broadcast modes (tests/golden), and
#            the broadcast-form models of golden_auto.py
#   grpc     the daemon on cuda:0 answering a grpcio client (tools/rank_client.py):
#            same scores as ikbo-score --device cuda:0, health SERVING
#   e2e      bench/e2e/run.sh on the seed-scale bench model, IKBO vs broadcast,
#            each point against the echo floor (.devrun/echo_server)
#            (E2E_CONCURRENCY, E2E_ARGS: e.g. E2E_ARGS="--cands 70"; E2E_ENCODINGS:
#            "classic packed" runs both request encodings)
#   load     the daemon on cuda:0 (bench model, 6 gRPC threads, 4 instances) under the
#            closed loops that merge many requests into large batches on every
#            instance at once (1 x 70 at 256 in flight, 16 x 70 at 32, 4 x 70 at 64;
#            LOAD_SECONDS each, default 5): every call OK and the daemon alive after
#            each. A kernel race that only concurrent batches expose (linear_wr's
#            barriers, 2026-12-05) lost the device here within seconds while every
#            single-stream check passed
#   faults   tests/integration/test_faults.py on cuda:0: IKBO_FAULT injects a
#            failing cudaMalloc while a version loads, a failing stream wait
#            and a failing launch mid-batch, and a lost device (the daemon
#            must answer UNAVAILABLE and exit 3) (kernels/fault.h), after
#            build/gpu/test_cuda_lost (carry build/gpu: a real illegal address
#            must read as lost, an invalid launch must not); faults-memcheck
#            runs the same with the daemon under compute-sanitizer memcheck
#   phases   bench/e2e/batch_phases.c (built by tests/gpu/build.sh, carry
#            build/gpu): one batch's time split into host work, uploads,
#            each op's GPU time and the final download, per batch shape
#   ops      test_cuda_ops (every op, GPU vs CPU) at fp32, bf16 and fp16, the
#            ranking ops under compute-sanitizer memcheck, and bench_ops (the
#            ranking ops and the short-row linears against their floors and
#            cuBLAS, bf16), from build/gpu
#   zoo      the ranking reference models (carry build/gpu): test_cuda_model on
#            models/{dlrm,dcn,mmoe}/1 and the random family models at fp32,
#            bf16 and fp16, then the three under compute-sanitizer memcheck
#            (fp32); zoo-bench: the three at bench scale (tools/reference/zoo.py
#            --bench, written here), IKBO vs broadcast per batch shape
#            (ZOO_SHAPES, default "16x70 64x70"), then one profiled IKBO run
#   seq      sequence ops and models (issue 15): op tests + memcheck, test_cuda_model
#   seq-bench self_attention vs PyTorch SDPA (cuDNN, flash), fused vs two launches
#   att-bench target attention vs PyTorch SDPA (cuDNN, flash) on the packed form
#            at every shape (issue 17): bench_kernels --only attsweep, then
#            bench/kernels/sdpa_target.py; ours / cuDNN per shape, last
#   grpcargs bench/e2e/grpc_args.sh: the echo floor under each candidate set
#            of HTTP/2 channel arguments (server/grpc_args.c), classic and packed
#   auto     automatic planning (issue 16; carry build/gpu): the imported twins
#            (tools/importer of plain_models.BenchModel here; models/demo_auto as
#            shipped) of the seed-scale bench model and the demo checked GPU vs CPU
#            (test_cuda_model, fp32), the ops test (a mapped copy_rows), then
#            timed against their hand-written twins, interleaved A B A B (AUTO_REPS, default 4; medians), at
#            AUTO_SHAPES (default "1x70 16x70"): twin / hand-written per shape
#   host     build/host_path on the GPU host's CPU: the server's own work per
#            request (decode, validate + plan, response), classic and packed,
#            at 1 x 70 and 16 x 70
# Usage (device): bench/e2e/device.sh [golden] [grpc] [load] [faults] [faults-memcheck] [e2e] [phases] [ops] [zoo] [zoo-bench] [seq] [seq-bench] [att-bench] [auto] [host] [grpcargs]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/ikbo-e2e-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/.devlibs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
B=$PWD/.devrun
. bench/e2e/lib.sh # throughput_config, wait_ready
STAGE_NAME_WIDTH=10 STAGE_TAIL_WIDTH=100
. bench/stage_lib.sh # stage: a log under $OUT and a row of summary
PY=${PY:-python3}
stages=${*:-golden grpc load e2e}
summary=()
{ date -u; cat .devrun/COMMIT 2>/dev/null; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; } > "$OUT/env.log" 2>&1
cat "$OUT/env.log"

grpc_check() {
  local port=50551 http=8581 m rc=0
  $B/ikbo-serve --grpc 127.0.0.1:$port --http 127.0.0.1:$http --models models --device cuda:0 \
      --threads 2 > "$OUT/daemon_gpu.log" 2>&1 &
  local pid=$!
  wait_ready $pid 127.0.0.1:$http 60 || { tail -n 5 "$OUT/daemon_gpu.log"; kill $pid 2>/dev/null; return 1; }
  for m in demo dlrm dcn mmoe; do
    local ex=models/$m/example_request.json
    IKBO_BUILD=$B $PY tools/rank_client.py --target 127.0.0.1:$port $ex > "$OUT/grpc_resp_$m.json" || { rc=1; break; }
    $B/ikbo-score --device cuda:0 models/$m/1 $ex > "$OUT/score_gpu_$m.json" || { rc=1; break; }
    $PY - "$OUT/grpc_resp_$m.json" "$OUT/score_gpu_$m.json" $m <<'EOF' || { rc=1; break; }
import json, sys
resp = json.load(open(sys.argv[1])); ref = json.load(open(sys.argv[2]))
got = [s["score"] for s in sorted(resp["scores"], key=lambda s: s.get("index", 0))]
exp = ref["scores"]
assert len(got) == len(exp), (len(got), len(exp))
err = max(abs(a - b) / max(abs(b), 1e-6) for a, b in zip(got, exp))
assert err < 1e-6, err
print("%s: grpcio on cuda:0: %d scores equal ikbo-score --device cuda:0 (max rel %.1e), unique_users %s"
      % (sys.argv[3], len(got), err, resp.get("uniqueUsers")))
EOF
  done
  kill -TERM $pid; wait $pid; local drc=$?
  [ $rc = 0 ] && [ $drc = 0 ]
}

load_check() {
  [ -f models/bench/1/model.json ] || $PY models/bench/make_bench_model.py >/dev/null || return 1
  local port=50552 http=8582 rc=0 spec
  throughput_config "$OUT/load-server.json"
  $B/ikbo-serve --config "$OUT/load-server.json" --grpc 127.0.0.1:$port --http 127.0.0.1:$http \
      --models models --device cuda:0 --threads 6 > "$OUT/daemon_load.log" 2>&1 &
  local pid=$!
  wait_ready $pid 127.0.0.1:$http || { tail -n 5 "$OUT/daemon_load.log"; kill $pid 2>/dev/null; return 1; }
  for spec in "1 256" "16 32" "4 64"; do
    set -- $spec
    if ! kill -0 $pid 2>/dev/null; then echo "load: the daemon is gone before ${1} x 70"; rc=1; break; fi
    $B/ikbo-loadgen --target 127.0.0.1:$port --model bench --json --timeout-ms 20000 --threads 4 \
        --encoding packed --users $1 --candidates 70 --distinct 64 --concurrency $2 --warmup 1 \
        --duration "${LOAD_SECONDS:-5}" > "$OUT/load_u$1.json" 2>/dev/null
    $PY - "$OUT/load_u$1.json" "$1 x 70 at $2 in flight" <<'EOF' || rc=1
import json, sys
j = json.load(open(sys.argv[1])); c = j["codes"]; bad = sum(v for k, v in c.items() if k != "OK")
print("load %s: %d OK, %d failed, %.0f candidates/s%s" % (sys.argv[2], c.get("OK", 0), bad,
      j["measured"]["candidates_per_s"], "; first error: %s" % j["first_error"] if bad else ""))
sys.exit(1 if bad or not c.get("OK") else 0)
EOF
  done
  kill -0 $pid 2>/dev/null || { echo "load: the daemon exited under load:"; tail -n 5 "$OUT/daemon_load.log"; rc=1; }
  kill -TERM $pid 2>/dev/null; wait $pid; local drc=$?
  echo "load: daemon exit status $drc"
  [ $rc = 0 ] && [ $drc = 0 ]
}

ops_check() {
  local dt rc=0
  for dt in fp32 bf16 fp16; do build/gpu/test_cuda_ops --dtype $dt | tail -n 2 || rc=1; done
  compute-sanitizer --tool memcheck --error-exitcode 3 build/gpu/test_cuda_ops --ranking-only --dtype bf16 \
      > "$OUT/ops_memcheck.log" 2>&1 || rc=1
  grep "ERROR SUMMARY" "$OUT/ops_memcheck.log"
  build/gpu/bench_ops --dtype bf16 > "$OUT/bench_ops.log" 2>&1 || rc=1
  tail -n 30 "$OUT/bench_ops.log"
  return $rc
}

seq_models() { echo models/seq/1 models/hstu/1 build/gpu/models/f_seq*/1 build/gpu/models/f_hstu*/1; }

# Sequence ops (issue 15): the op tests (self_attention, din_attention) at
# three dtypes and under memcheck, whole sequence models at three dtypes
# and one under memcheck.
seq_check() {
  local dt rc=0
  for dt in fp32 bf16 fp16; do build/gpu/test_cuda_ops --ranking-only --dtype $dt | grep -E "^FAIL|checks passed" | tail -n 12 || rc=1; done
  for dt in fp32 bf16; do
    IKBO_TEST_NO_OOM=1 compute-sanitizer --tool memcheck --error-exitcode 3 build/gpu/test_cuda_ops --ranking-only --quick --dtype $dt \
        > "$OUT/seq_ops_memcheck_$dt.log" 2>&1 || rc=1
    echo "ops memcheck $dt: $(grep "ERROR SUMMARY" "$OUT/seq_ops_memcheck_$dt.log")"
  done
  for dt in fp32 bf16 fp16; do
    echo "-- IKBO_CUDA_DTYPE=$dt"
    IKBO_CUDA_DTYPE=$dt build/gpu/test_cuda_model $(seq_models) || rc=1
  done
  IKBO_CUDA_DTYPE=bf16 compute-sanitizer --tool memcheck --error-exitcode 3 \
      build/gpu/test_cuda_model $(seq_models | tr ' ' '\n' | head -n 2) > "$OUT/seq_model_memcheck.log" 2>&1 || rc=1
  echo "model memcheck: $(grep "ERROR SUMMARY" "$OUT/seq_model_memcheck.log")"
  return $rc
}

# Self-attention against PyTorch's cuDNN and flash SDPA on the same jagged
# histories, and the fused self + target launch (bench_kernels --only self).
seq_bench() {
  build/gpu/bench_kernels --only self > "$OUT/self_bench.log" 2>&1 || return 1
  grep -E "^SELF|^FUSED|GEMM" "$OUT/self_bench.log"
  $PY bench/kernels/sdpa_self.py --ours "$OUT/self_bench.log"
}

att_bench() {
  build/gpu/bench_kernels --only attsweep > "$OUT/att_bench.log" 2>&1 || return 1
  grep -E "^ATTS|GEMM" "$OUT/att_bench.log"
  $PY bench/kernels/sdpa_target.py --ours "$OUT/att_bench.log"
}

zoo_models() { echo models/dlrm/1 models/dcn/1 models/mmoe/1 build/gpu/models/f_*/1; }

zoo_check() {
  local dt
  for dt in fp32 bf16 fp16; do
    echo "-- IKBO_CUDA_DTYPE=$dt"
    IKBO_CUDA_DTYPE=$dt build/gpu/test_cuda_model $(zoo_models) || return 1
  done
  echo "-- memcheck (fp32)"
  IKBO_CUDA_DTYPE=fp32 compute-sanitizer --tool memcheck --error-exitcode 3 \
      build/gpu/test_cuda_model models/dlrm/1 models/dcn/1 models/mmoe/1 > "$OUT/zoo_memcheck.log" 2>&1
  local mrc=$?
  grep "ERROR SUMMARY" "$OUT/zoo_memcheck.log"
  return $mrc
}

zoo_bench() {
  local m mode
  for m in ${ZOO_BENCH_MODELS:-dlrm dcn mmoe seq hstu}; do
    [ -f /tmp/zoo-bench/$m/1/model.json ] || $PY tools/reference/zoo.py export $m /tmp/zoo-bench/$m/1 --bench || return 1
    for mode in ikbo broadcast; do
      build/gpu/batch_phases /tmp/zoo-bench/$m/1 --device cuda:0 --mode $mode \
          --shapes "${ZOO_SHAPES:-16x70 64x70}" --iters 100 --warmup 10 --no-profile | grep -E "^batch_phases|^== shape"
    done
    build/gpu/batch_phases /tmp/zoo-bench/$m/1 --device cuda:0 --mode ikbo --shapes 16x70 --iters 20 --warmup 5
  done
}

# Broadcast-form twins vs their hand-written models (see the file comment).
auto_check() {
  local rc=0 rep pair d
  [ -f models/bench/1/model.json ] || $PY models/bench/make_bench_model.py || return 1
  $PY -c "import torch, sys; print('torch', torch.__version__, 'python', sys.version.split()[0])"
  $PY tools/importer/ikbo_import.py tools/reference/plain_models.py:BenchModel.from_model_dir /tmp/auto/bench/1 \
      --arg models/bench/1 --inputs models/bench/1 --tasks click,like --score-weights 1,0.5 --dtype F16 \
      --name bench_auto || return 1
  IKBO_CUDA_DTYPE=fp32 build/gpu/test_cuda_model /tmp/auto/bench/1 models/demo_auto/1 || rc=1
  build/gpu/test_cuda_ops --dtype bf16 | tail -n 2 || rc=1
  # one pinned core for every timed process: unpinned, a process lands in a
  # ~10% slower mode at random (1x70 241 vs 272 us for one model, RESULTS.md)
  local PIN=""
  command -v taskset > /dev/null && PIN="taskset -c ${AUTO_CPU:-3}"
  # a discarded pass first: the first model timed on a cold GPU ran ~8% slow (RESULTS.md)
  $PIN build/gpu/batch_phases models/bench/1 --device cuda:0 --mode ikbo --shapes "16x70" --iters 200 --warmup 20 \
      --no-profile > /dev/null || rc=1
  for rep in $(seq "${AUTO_REPS:-4}"); do
    for pair in models/bench/1:/tmp/auto/bench/1 models/demo/1:models/demo_auto/1; do
      for d in ${pair%%:*} ${pair##*:}; do
        $PIN build/gpu/batch_phases $d --device cuda:0 --mode ikbo --shapes "${AUTO_SHAPES:-1x70 16x70}" \
            --iters 200 --warmup 20 --no-profile | grep -E "^batch_phases|^== shape" || rc=1
      done
    done
  done > "$OUT/auto_times.log"
  $PY - "$OUT/auto_times.log" <<'EOF' || rc=1
import re, statistics, sys
cur, t = None, {}
for line in open(sys.argv[1]):
    m = re.match(r"batch_phases: (\S+) on", line)
    if m:
        cur = m.group(1)
        continue
    m = re.match(r"== shape (\S+) .*ikbo_score mean ([0-9.]+) us", line)
    if m:
        t.setdefault((cur, m.group(1)), []).append(float(m.group(2)))
print("%-22s %-7s %12s %12s %7s  (medians of %d interleaved runs)" % ("twin", "shape", "hand us", "twin us",
                                                                       "ratio", len(next(iter(t.values())))))
worst = 0
for hand, twin in (("models/bench/1", "/tmp/auto/bench/1"), ("models/demo/1", "models/demo_auto/1")):
    for (d, shape), v in sorted(t.items()):
        if d != hand:
            continue
        a, b = statistics.median(v), statistics.median(t[(twin, shape)])     # of the A B A B means
        worst = max(worst, b / a)
        lo = min(t[(twin, shape)]) / min(v)
        print("%-22s %-7s %12.1f %12.1f %7.3f  (fastest runs: %.3f)" % (twin, shape, a, b, b / a, lo))
print("worst twin/hand %.3f (target <= 1.03)" % worst)
EOF
  return $rc
}

# test_faults.py with the daemon under memcheck (tests/gpu/memcheck_serve.sh
# as ikbo-serve in a wrapper build dir; any error fails the daemon's exit
# status, which the test checks), one log per daemon.
faults_memcheck() {
  local w=/tmp/ikbo-memcheck-bin
  rm -rf $w && mkdir -p $w && ln -s $B/gen $w/gen && cp tests/gpu/memcheck_serve.sh $w/ikbo-serve
  env IKBO_REAL_SERVE=$B/ikbo-serve IKBO_MEMCHECK_LOG="$OUT/memcheck.%p.log" IKBO_BUILD=$w \
      IKBO_ROOT=$PWD IKBO_TEST_DEVICE=cuda:0 $PY tests/integration/test_faults.py || return 1
  grep -h "ERROR SUMMARY" "$OUT"/memcheck.*.log
  ! grep -L "ERROR SUMMARY: 0 errors" "$OUT"/memcheck.*.log | grep -q .
}

for s in $stages; do
  case $s in
  golden)
    printf '#!/bin/sh\nexec %s/ikbo-score --device cuda:0 "$@"\n' "$B" > /tmp/score-cuda
    chmod +x /tmp/score-cuda
    stage golden golden.log env IKBO_CUDA_DTYPE=fp32 $PY tests/golden/golden.py \
        --score-bin /tmp/score-cuda --work /tmp/golden --tol 1e-5
    stage golden-auto golden.log env IKBO_CUDA_DTYPE=fp32 $PY tests/golden/golden_auto.py \
        --score-bin /tmp/score-cuda --plan-bin $B/ikbo-plan --work /tmp/golden_auto --tol 1e-5 ;;
  grpc)
    stage grpc grpc.log grpc_check ;;
  load)
    stage load load.log load_check ;;
  faults)
    stage lost lost.log build/gpu/test_cuda_lost
    stage faults faults.log env IKBO_BUILD=$B IKBO_ROOT=$PWD IKBO_TEST_DEVICE=cuda:0 \
        $PY tests/integration/test_faults.py ;;
  faults-memcheck)
    stage faults-memcheck faults_memcheck.log faults_memcheck ;;
  phases)
    [ -f models/bench/1/model.json ] || stage bench-model phases.log $PY models/bench/make_bench_model.py
    stage phases phases.log ${PHASES_BIN:-build/gpu/batch_phases} models/bench/1 --device cuda:0 ;;
  ops)
    stage ops ops.log ops_check ;;
  zoo)
    stage zoo zoo.log zoo_check ;;
  zoo-bench)
    stage zoo-bench zoo_bench.log zoo_bench ;;
  seq)
    stage seq seq.log seq_check ;;
  seq-bench)
    stage seq-bench seq_bench.log seq_bench ;;
  att-bench)
    stage att-bench att.log att_bench ;;
  grpcargs)
    [ -f models/bench/1/model.json ] || stage bench-model grpcargs.log $PY models/bench/make_bench_model.py
    stage grpcargs grpcargs.log bench/e2e/grpc_args.sh --build $B --models models ;;
  auto)
    stage auto auto.log auto_check ;;
  host)
    stage host host.log sh -c "$B/host_path --users 1 --cands 70 --iters 2000 && \
        $B/host_path --users 16 --cands 70 --iters 1000" ;;
  e2e)
    [ -f models/bench/1/model.json ] || stage bench-model e2e.log $PY models/bench/make_bench_model.py
    # Saturation = the best of 8, 32 and 256 calls in flight, from 4 loadgen
    # threads into 6 gRPC workers: small requests (1 x 70) only saturate
    # the GPU when enough of them queue to merge into large batches (H200:
    # IKBO 1 x 70 844k candidates/s at 32 in flight, 1.20M at 256). The
    # queue limits are raised so that many large requests in flight measure
    # throughput, not admission (throughput_config).
    # E2E_BATCHING: more batching keys for the daemon, e.g. '"instances": 4'.
    throughput_config "$OUT/e2e-server.json" "${E2E_BATCHING:-}"
    # E2E_ENCODINGS: one run per request encoding (run.sh --encoding), each
    # in its own folder: e2e (classic) and e2e-packed.
    for enc in ${E2E_ENCODINGS:-classic}; do
      dir=$OUT/e2e; [ "$enc" = classic ] || dir=$OUT/e2e-$enc
      stage "e2e-$enc" e2e.log bench/e2e/run.sh --build $B --models models --model bench \
          --device cuda:0 --server-threads 6 --concurrency "${E2E_CONCURRENCY:-8 32 256}" \
          --loadgen-threads 4 --warmup 1 --duration 2 --server-config "$OUT/e2e-server.json" \
          --encoding "$enc" ${E2E_ARGS:-} --out "$dir"
    done ;;
  esac
done
[ -f "$OUT/golden.log" ] && grep -E "FAIL|mismatch" "$OUT/golden.log" | head -n 10
for t in "$OUT"/e2e*/table.md; do [ -f "$t" ] && { echo "-- $t"; cat "$t"; }; done
printf '%s\n' "${summary[@]}"
