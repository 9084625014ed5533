#!/usr/bin/env bash
# bench/e2e/run.sh - end-to-end benchmark of ikbo-serve: IKBO mode against the
# broadcast baseline, through the real daemon and gRPC, with ikbo-loadgen.
#
# For each mode (a fresh daemon per mode, free ports) and each point of the
# sweep (users per request x candidates per user):
#   1. closed loop at each --concurrency (default 2 x server threads; a list
#      such as "8 32 128" runs each and keeps the best): throughput at
#      saturation (requests/s, candidates/s). During each, bench/e2e/
#      thread_cpu.py samples the CPU use of every server and loadgen thread
#      (which one is the bottleneck);
#   2. open loop at --fraction (default 0.5) of that throughput: p50/p99
#      latency from the intended send times (no coordinated omission);
#   3. /metrics before/after each run: mean server time per request and, when
#      the daemon exports a forward-pass (compute) time histogram, the share
#      of request latency spent outside the forward pass (server overhead);
#   4. the transport floor: build/echo_server (bench/e2e/echo_server.c) on the
#      same host, with the daemon's gRPC threads, started per point with that
#      point's response size (the model description asked from the daemon),
#      driven by the same loadgen with the same request bodies: a closed loop
#      at the concurrency that gave saturation, then the open loop at the same
#      rate and length. report.py's floor table: per point, our client
#      latency, the forward time (ikbo_request_compute_seconds), the echo's
#      latency and (client - forward) / echo at p50, p99 and the mean.
# Then bench/e2e/report.py writes the tables (markdown) and results.json.
#
#   bench/e2e/run.sh                                  # CPU, demo model, defaults below
#   bench/e2e/run.sh --models models --model bench --device cuda:0 --server-threads 4
#   bench/e2e/run.sh --cands "70" --users "1" --duration 2 --warmup 0.5   # one quick point
#
# Flags (defaults in brackets):
#   --build DIR          ikbo-serve and ikbo-loadgen [build]
#   --models DIR         model repository [models]
#   --model NAME         model to rank with [demo]
#   --device DEV         cpu or cuda:N [cpu]
#   --modes "M ..."      [ikbo broadcast]
#   --users "N ..."      users per request [1 16]
#   --cands "N ..."      candidates per user [10 70 500]
#   --history N          history events per user [the model's max_len]
#   --server-threads N   daemon gRPC worker threads [2]
#   --concurrency "N ..." closed-loop calls in flight; several: the best is saturation [2 x server threads]
#   --loadgen-threads N  loadgen worker threads [1]
#   --fraction F         open-loop rate as a fraction of saturation [0.5]
#   --warmup S           seconds before each measured window [1]
#   --duration S         measured seconds per run [3]
#   --min-open-calls N   lengthen an open-loop run to schedule at least N calls (at most 60 s) [20]
#   --timeout-ms MS      per-call deadline [60000]
#   --compute-metric M   histogram of forward-pass seconds in /metrics [auto-detect]
#   --server-config FILE the daemon's --config (e.g. a larger batching.max_queue_candidates,
#                        so a high --concurrency measures throughput, not admission) [none]
#   --echo BIN           the echo server of step 4; "none" skips the floor [BUILD/echo_server]
#   --echo-delay 0|1     after the floor, the echo again answering each call after the
#                        point's forward mean (echo_server --answer-after-us): the floor at
#                        the concurrency ours has at that rate (report.py's third floor table) [0]
#   --encoding E         request encoding every loadgen run sends: classic or packed [classic]
#   --out DIR            where results go [build/e2e/<date>-<device>]
# Needs: bash, curl, /usr/bin/python3. Exit 0 when every point ran.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$ROOT/build MODELS=$ROOT/models MODEL=demo DEVICE=cpu MODES="ikbo broadcast"
USERS="1 16" CANDS="10 70 500" HISTORY="" SERVER_THREADS=2 CONCURRENCY="" LG_THREADS=1
FRACTION=0.5 WARMUP=1 DURATION=3 MIN_OPEN=20 TIMEOUT_MS=60000 COMPUTE_METRIC="" OUT="" SERVER_CONFIG=""
ECHO="" ENCODING=classic ECHO_DELAY=0
CMDLINE="bench/e2e/run.sh$(printf ' %q' "$@")"

die() { echo "run.sh: error: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --build) BUILD=$2 ;; --models) MODELS=$2 ;; --model) MODEL=$2 ;; --device) DEVICE=$2 ;;
    --modes) MODES=$2 ;; --users) USERS=$2 ;; --cands) CANDS=$2 ;; --history) HISTORY=$2 ;;
    --server-threads) SERVER_THREADS=$2 ;; --concurrency) CONCURRENCY=$2 ;;
    --loadgen-threads) LG_THREADS=$2 ;; --fraction) FRACTION=$2 ;; --warmup) WARMUP=$2 ;;
    --duration) DURATION=$2 ;; --min-open-calls) MIN_OPEN=$2 ;; --timeout-ms) TIMEOUT_MS=$2 ;;
    --compute-metric) COMPUTE_METRIC=$2 ;; --out) OUT=$2 ;; --server-config) SERVER_CONFIG=$2 ;;
    --echo) ECHO=$2 ;; --encoding) ENCODING=$2 ;; --echo-delay) ECHO_DELAY=$2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown flag '$1' (see --help)" ;;
  esac
  [ $# -ge 2 ] || die "$1 needs a value"
  shift 2
done
BUILD=$(cd "$BUILD" && pwd) || die "no build directory"
MODELS=$(cd "$MODELS" && pwd) || die "no model repository"
SERVE=$BUILD/ikbo-serve LOADGEN=$BUILD/ikbo-loadgen PY=/usr/bin/python3
[ -x "$SERVE" ] || die "$SERVE missing (make)"
[ -x "$LOADGEN" ] || die "$LOADGEN missing (make)"
[ -n "$ECHO" ] || ECHO=$BUILD/echo_server
[ "$ECHO" = none ] && ECHO=""
[ -z "$ECHO" ] || [ -x "$ECHO" ] || die "$ECHO missing (make build/echo_server, or --echo none)"
ls -d "$MODELS/$MODEL"/*/ >/dev/null 2>&1 || die "no version of model '$MODEL' in $MODELS (bench: models/bench/make_bench_model.py)"
case "$ECHO_DELAY" in 0|1) ;; *) die "--echo-delay: expected 0 or 1, got '$ECHO_DELAY'" ;; esac
[ -n "$CONCURRENCY" ] || CONCURRENCY=$(( SERVER_THREADS * 2 > 4 ? SERVER_THREADS * 2 : 4 ))
[ -n "$OUT" ] || OUT=$ROOT/build/e2e/$(date -u +%Y%m%d-%H%M%S)-${DEVICE/:/}
mkdir -p "$OUT"

SERVE_PID="" ECHO_PID="" ECHO_GRPC=""
stop_daemon() {
  if [ -n "$SERVE_PID" ]; then
    kill -TERM "$SERVE_PID" 2>/dev/null || true
    wait "$SERVE_PID" 2>/dev/null || true
    SERVE_PID=""
  fi
}
stop_echo() {
  if [ -n "$ECHO_PID" ]; then
    kill -TERM "$ECHO_PID" 2>/dev/null || true
    wait "$ECHO_PID" 2>/dev/null || true
    ECHO_PID="" ECHO_GRPC=""
  fi
}
trap 'stop_echo; stop_daemon' EXIT

# The floor's server for one point: answers of cands scores, the model
# description asked from the running daemon -> sets ECHO_GRPC, ECHO_PID.
start_echo() { # tag users cands distinct [echo_server flags...]
  local log=$OUT/$1.echo.log
  "$ECHO" --listen 127.0.0.1:0 --model-info-from "$GRPC" --model "$MODEL" --threads "$SERVER_THREADS" \
    --users "$2" --cands "$3" --distinct "$4" "${@:5}" >"$log" 2>&1 &
  ECHO_PID=$!
  for _ in $(seq 1 100); do  # 10 s
    kill -0 "$ECHO_PID" 2>/dev/null || { cat "$log" >&2; ECHO_PID=""; die "echo_server exited"; }
    ECHO_GRPC=$(grep -m1 -o 'listening grpc=[^ ]*' "$log" || true)
    ECHO_GRPC=${ECHO_GRPC#listening grpc=}
    [ -z "$ECHO_GRPC" ] || return 0
    sleep 0.1
  done
  cat "$log" >&2
  die "echo_server not listening after 10 s"
}

start_daemon() { # mode -> sets GRPC, HTTP
  local mode=$1 log=$OUT/serve-$1.log
  "$SERVE" ${SERVER_CONFIG:+--config "$SERVER_CONFIG"} --grpc 127.0.0.1:0 --http 127.0.0.1:0 --models "$MODELS" --device "$DEVICE" \
    --mode "$mode" --threads "$SERVER_THREADS" --log-level info >"$log" 2>&1 &
  SERVE_PID=$!
  GRPC="" HTTP=""
  for _ in $(seq 1 1200); do  # model loading can take a while on a GPU: 120 s
    kill -0 "$SERVE_PID" 2>/dev/null || { cat "$log" >&2; die "ikbo-serve ($mode) exited"; }
    if [ -z "$GRPC" ]; then  # the bound ports, from the "listening" log line
      local line
      line=$(grep -m1 -o 'listening grpc=[^ ]* http=[^ ]*' "$log" || true)
      if [ -n "$line" ]; then
        GRPC=${line#listening grpc=}; GRPC=${GRPC%% *}
        HTTP=${line##* http=}
      fi
    fi
    if [ -n "$GRPC" ] && curl -fs "http://$HTTP/readyz" >/dev/null 2>&1; then return 0; fi
    sleep 0.1
  done
  cat "$log" >&2
  die "ikbo-serve ($mode) not ready after 120 s"
}

# tag, args... -> $OUT/tag.json. Against the daemon with /metrics snapshots
# around it; against the echo server (no /metrics) while ECHO_GRPC is set.
loadgen() {
  local tag=$1; shift
  [ -n "$ECHO_GRPC" ] || curl -fs "http://$HTTP/metrics" >"$OUT/$tag.before.prom"
  local rc=0 lpid spid=""
  "$LOADGEN" --target "${ECHO_GRPC:-$GRPC}" --model "$MODEL" --json --timeout-ms "$TIMEOUT_MS" \
    --threads "$LG_THREADS" --encoding "$ENCODING" "$@" >"$OUT/$tag.json" 2>"$OUT/$tag.err" &
  lpid=$!
  if [ -z "$ECHO_GRPC" ] && [ "${tag%.closed-c*}" != "$tag" ]; then  # at saturation: CPU per thread, server and loadgen
    ( sleep "$WARMUP"; exec $PY "$ROOT/bench/e2e/thread_cpu.py" --seconds "$(awk -v d="$DURATION" 'BEGIN { print d * 0.8 }')" \
        --json "$OUT/$tag.threads.json" "$SERVE_PID" "$lpid" >/dev/null 2>&1 ) &
    spid=$!
  fi
  wait "$lpid" || rc=$?
  [ -z "$spid" ] || wait "$spid" || true
  if [ -z "$ECHO_GRPC" ] && ! kill -0 "$SERVE_PID" 2>/dev/null; then
    tail -n 5 "$OUT/serve-$mode.log" >&2
    die "ikbo-serve exited during $tag (its log above; exit status 3: device lost or hung)"
  fi
  [ -n "$ECHO_GRPC" ] || curl -fs "http://$HTTP/metrics" >"$OUT/$tag.after.prom"
  if [ $rc -ge 2 ]; then cat "$OUT/$tag.err" >&2; die "ikbo-loadgen failed for $tag"; fi
  [ $rc -eq 0 ] || echo "  note: $tag had failed calls: $($PY -c 'import json,sys; j=json.load(open(sys.argv[1])); print(j["codes"], j["first_error"])' "$OUT/$tag.json")" >&2
}

HIST_ARGS=()
[ -n "$HISTORY" ] && HIST_ARGS=(--history "$HISTORY")
commit=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
git -C "$ROOT" diff --quiet HEAD -- 2>/dev/null || commit="$commit (working tree has uncommitted changes)"
$PY - "$OUT/run.json" <<PY
import json, sys
json.dump({"command": r"""$CMDLINE""", "date": "$(date -u +%Y-%m-%dT%H:%M:%SZ)", "commit": "$commit",
           "host": "$(uname -n)", "cpus": $(nproc), "loadavg": "$(cut -d' ' -f1-3 /proc/loadavg)",
           "device": "$DEVICE", "model": "$MODEL", "models": "$MODELS", "server_threads": $SERVER_THREADS,
           "concurrency": "$CONCURRENCY", "loadgen_threads": $LG_THREADS, "fraction": $FRACTION,
           "warmup_s": $WARMUP, "duration_s": $DURATION, "compute_metric": "$COMPUTE_METRIC",
           "echo": "$ECHO", "encoding": "$ENCODING"},
          open(sys.argv[1], "w"), indent=1)
PY

for mode in $MODES; do
  start_daemon "$mode"
  echo "== $mode: ikbo-serve on grpc $GRPC http $HTTP ($DEVICE, $SERVER_THREADS threads)" >&2
  for u in $USERS; do
    for c in $CANDS; do
      tag=$mode-u$u-c$c
      distinct=$(( u * c > 2000 ? 16 : 64 ))
      best=""
      for n in $CONCURRENCY; do  # saturation: the best of the closed loops
        loadgen "$tag.closed-c$n" --users "$u" --candidates "$c" "${HIST_ARGS[@]}" --distinct "$distinct" \
          --concurrency "$n" --warmup "$WARMUP" --duration "$DURATION"
        best=$($PY - "$OUT" "$tag" "$n" "$best" <<'PY'
import json, sys
out, tag, n, best = sys.argv[1:5]
rate = lambda k: json.load(open("%s/%s.closed-c%s.json" % (out, tag, k)))["measured"]["ok_per_s"]
print(n if not best or rate(n) > rate(best) else best)
PY
)
      done
      for f in "$OUT/$tag.closed-c$best".*; do cp "$f" "$OUT/$tag.closed.${f#"$OUT/$tag.closed-c$best".}"; done
      read -r rate dur < <($PY - "$OUT/$tag.closed.json" "$FRACTION" "$DURATION" "$MIN_OPEN" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
rate = float(sys.argv[2]) * j["measured"]["ok_per_s"]
rate = max(rate, 0.05)
dur = max(float(sys.argv[3]), float(sys.argv[4]) / rate)
print("%.3f %.2f" % (rate, min(dur, 60.0)))
PY
)
      loadgen "$tag.open" --users "$u" --candidates "$c" "${HIST_ARGS[@]}" --distinct "$distinct" \
        --rate "$rate" --max-inflight 10000 --warmup "$WARMUP" --duration "$dur"
      if [ -n "$ECHO" ]; then  # the floor: same loadgen, bodies, concurrency and rate
        start_echo "$tag" "$u" $(( u * c )) "$distinct"
        loadgen "$tag.echo-closed" --users "$u" --candidates "$c" "${HIST_ARGS[@]}" --distinct "$distinct" \
          --concurrency "$best" --warmup "$WARMUP" --duration "$DURATION"
        loadgen "$tag.echo-open" --users "$u" --candidates "$c" "${HIST_ARGS[@]}" --distinct "$distinct" \
          --rate "$rate" --max-inflight 10000 --warmup "$WARMUP" --duration "$dur"
        stop_echo
        if [ "$ECHO_DELAY" = 1 ]; then  # the floor at our concurrency: answers after our forward mean
          $PY "$ROOT/bench/e2e/report.py" "$OUT" --forward-mean-us "$tag" \
            ${COMPUTE_METRIC:+--compute-metric "$COMPUTE_METRIC"} >"$OUT/$tag.echo-delay-us" \
            || die "no forward mean for $tag (--echo-delay needs the compute histogram)"
          start_echo "$tag.delay" "$u" $(( u * c )) "$distinct" --answer-after-us "$(cat "$OUT/$tag.echo-delay-us")"
          loadgen "$tag.echo-delay-open" --users "$u" --candidates "$c" "${HIST_ARGS[@]}" --distinct "$distinct" \
            --rate "$rate" --max-inflight 10000 --warmup "$WARMUP" --duration "$dur"
          stop_echo
        fi
      fi
      $PY - "$OUT" "$tag" <<'PY' >&2
import json, sys
c = json.load(open("%s/%s.closed.json" % (sys.argv[1], sys.argv[2])))["measured"]
o = json.load(open("%s/%s.open.json" % (sys.argv[1], sys.argv[2])))
import os
line = ("  %-22s saturation %8.1f req/s %10.0f cand/s | open %7.2f req/s: p50 %8.2f ms p99 %8.2f ms"
        % (sys.argv[2], c["ok_per_s"], c["candidates_per_s"], o["rate"],
           o["measured"]["latency_ms"]["p50"], o["measured"]["latency_ms"]["p99"]))
e = "%s/%s.echo-open.json" % (sys.argv[1], sys.argv[2])
if os.path.exists(e):
    e = json.load(open(e))["measured"]["latency_ms"]
    line += " | echo p50 %6.2f ms p99 %6.2f ms" % (e["p50"], e["p99"])
print(line)
PY
    done
  done
  stop_daemon
done

$PY "$ROOT/bench/e2e/report.py" "$OUT" ${COMPUTE_METRIC:+--compute-metric "$COMPUTE_METRIC"} >"$OUT/table.md"
cat "$OUT/table.md"
echo "results: $OUT (table.md, results.json, per-run JSON and /metrics snapshots; *.echo-*.json: the floor)" >&2
