#!/usr/bin/env bash
# grpc_args.sh - the gRPC channel arguments measured: the echo floor
# (build/echo_server, which takes ikbo-serve's arguments from
# server/grpc_args.c) under each candidate set of HTTP/2 settings, the same
# ikbo-loadgen requests, classic and packed, closed loop.
#
# Why this exists: flow control (the stream window a server advertises,
# grpc.http2.lookahead_bytes), frame size and BDP probing decide how many
# round trips a 200-300 KB request takes before the server has all of it;
# the values server/grpc_args.c ships are the ones this measures best, on the
# host that serves (bench/RESULTS.md, "gRPC channel arguments").
#
#   bench/e2e/grpc_args.sh [--build DIR] [--models DIR] [--duration S]
#                          [--concurrency "1 8"] [--shapes "1x70 16x70"]
#                          [--variants "default;k=v,k=v;..."]
# Prints one line per (variant, encoding, shape, concurrency): client p50,
# p99 and mean ms and requests/s. Exit 0 when every run answered.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
. "$ROOT/bench/e2e/lib.sh" # wait_ready
BUILD=$ROOT/build MODELS=$ROOT/models DURATION=2 CONC="1 8" SHAPES="1x70 16x70"
VARIANTS="default;grpc.http2.lookahead_bytes=1048576;grpc.http2.lookahead_bytes=4194304"
VARIANTS+=";grpc.http2.max_frame_size=4194304"
VARIANTS+=";grpc.http2.lookahead_bytes=4194304,grpc.http2.max_frame_size=4194304"
VARIANTS+=";grpc.http2.lookahead_bytes=4194304,grpc.http2.max_frame_size=4194304,grpc.http2.bdp_probe=0"
while [ $# -gt 0 ]; do
  case "$1" in
    --build) BUILD=$2 ;; --models) MODELS=$2 ;; --duration) DURATION=$2 ;;
    --concurrency) CONC=$2 ;; --shapes) SHAPES=$2 ;; --variants) VARIANTS=$2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "grpc_args.sh: unknown flag '$1'" >&2; exit 2 ;;
  esac
  shift 2
done
[ -f "$MODELS/bench/1/model.json" ] || { echo "grpc_args.sh: no $MODELS/bench/1" >&2; exit 2; }
TMP=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$TMP"' EXIT
port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# ModelInfo for the echo comes from a real ikbo-serve (CPU is enough).
SP=$(port) HP=$(port)
"$BUILD/ikbo-serve" --grpc 127.0.0.1:$SP --http 127.0.0.1:$HP --models "$MODELS" --log-level warn \
    > "$TMP/serve.log" 2>&1 &
wait_ready $! 127.0.0.1:$HP 60 || { cat "$TMP/serve.log" >&2; exit 1; }

rc=0
IFS=';' read -r -a vs <<< "$VARIANTS"
for v in "${vs[@]}"; do
  args=$v; [ "$v" = default ] && args=""
  for shape in $SHAPES; do
    u=${shape%x*} c=${shape#*x} EP=$(port)
    IKBO_GRPC_ARGS="$args" "$BUILD/echo_server" --listen 127.0.0.1:$EP \
        --model-info-from 127.0.0.1:$SP --model bench --cands $((u * c)) --users "$u" \
        > "$TMP/echo.log" 2>&1 &
    pid=$!
    for _ in $(seq 100); do grep -q listening "$TMP/echo.log" && break; sleep 0.05; done
    for enc in classic packed; do
      for n in $CONC; do
        line=$("$BUILD/ikbo-loadgen" --target 127.0.0.1:$EP --model bench --users "$u" \
            --candidates "$c" --encoding $enc --concurrency "$n" --warmup 1 \
            --duration "$DURATION" --json 2>/dev/null | /usr/bin/python3 -c '
import json, sys
m = json.load(sys.stdin)["measured"]; l = m["latency_ms"]
print("%.3f %.3f %.3f %.0f" % (l["p50"], l["p99"], l["mean"], m["requests_per_s"]))') || { line=FAILED; rc=1; }
        printf '%-62s %-7s %5s c=%-3s p50/p99/mean ms rps: %s\n' "${v//grpc.http2./}" $enc \
            "$shape" "$n" "$line"
      done
    done
    kill $pid; wait $pid 2>/dev/null || true
  done
done
exit $rc
