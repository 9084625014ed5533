#!/usr/bin/env bash
# ab.sh - two builds of the daemon end to end on one host, interleaved.
#
# Why this exists: GPU hosts differ (the same binaries gave floor ratios
# 1.69x on one H200 host and 2.06-2.54x on another, RESULTS.md), so a change
# to the request path is only judged against its own baseline in the same
# device call. This runs bench/e2e/run.sh (IKBO mode, seed-scale bench
# model, the device.sh e2e settings) for build A, then B, REPS times
# (A B A B ...), each into OUT/<tag><rep>, and prints each run's floor and
# saturation lines last.
#
#   bench/e2e/ab.sh A_DIR B_DIR [--reps N] [--users "1 16"] [--cands 70]
#                   [--encoding packed] [--device cuda:0] [--out DIR]
#                   [--a-batching JSON] [--b-batching JSON]
#
# --a-batching/--b-batching add keys to one side's server config "batching"
# (e.g. A_DIR = B_DIR with --a-batching '{"graphs": 0}' compares one build
# with batch graphs off and on).
#
# A_DIR/B_DIR are stage.sh folders (.devrun: ikbo-serve, ikbo-loadgen,
# echo_server, gen/); their shared libraries come from LD_LIBRARY_PATH
# (.devlibs on the GPU machine).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
. "$ROOT/bench/e2e/lib.sh" # throughput_config
[ $# -ge 2 ] || { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2; }
A=$1 B=$2
shift 2
REPS=2 USERS="1 16" CANDS=70 ENCODING=packed DEVICE=cuda:0 OUT=${OUT:-/tmp/ab} AB= BB=
while [ $# -gt 0 ]; do
  case "$1" in
    --reps) REPS=$2 ;; --users) USERS=$2 ;; --cands) CANDS=$2 ;; --encoding) ENCODING=$2 ;;
    --device) DEVICE=$2 ;; --out) OUT=$2 ;; --a-batching) AB=$2 ;; --b-batching) BB=$2 ;;
    *) echo "ab.sh: unknown flag '$1'" >&2; exit 2 ;;
  esac
  shift 2
done
PY=${PY:-python3}
[ -f "$ROOT/models/bench/1/model.json" ] || $PY "$ROOT/models/bench/make_bench_model.py" >/dev/null
mkdir -p "$OUT"
for tag in A B; do
  extra=$AB; [ $tag = B ] && extra=$BB
  throughput_config "$OUT/server$tag.json" "$extra" || exit 2
done
for rep in $(seq 1 "$REPS"); do
  for tag in A B; do
    dir=$A; [ $tag = B ] && dir=$B
    "$ROOT/bench/e2e/run.sh" --build "$dir" --models "$ROOT/models" --model bench --device "$DEVICE" \
        --modes ikbo --users "$USERS" --cands "$CANDS" --server-threads 6 --concurrency "8 32 256" \
        --loadgen-threads 4 --warmup 1 --duration 2 --server-config "$OUT/server$tag.json" \
        --encoding "$ENCODING" --out "$OUT/$tag$rep" > "$OUT/$tag$rep.log" 2>&1 \
      || { echo "ab.sh: $tag$rep failed (last lines of $OUT/$tag$rep.log):"; tail -n 5 "$OUT/$tag$rep.log"; }
  done
done
for rep in $(seq 1 "$REPS"); do
  for tag in A B; do
    echo "== $tag$rep ($([ $tag = A ] && echo "$A" || echo "$B"))"
    [ -f "$OUT/$tag$rep/table.md" ] && grep -E "^\|" "$OUT/$tag$rep/table.md" | grep -v -- "---"
  done
done
