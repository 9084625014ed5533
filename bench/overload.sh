#!/usr/bin/env bash
# overload.sh - admission control under overload, the figures of bench/RESULTS.md
# "## Overload (CPU)": the phases of tests/integration/test_overload.py, on a
# machine quiet enough to measure, for two batching configs:
#   tight     max_queue_candidates = one request (512), instances 1
#   defaults  the server's defaults (queue 32768 candidates)
# Per config, with build/ikbo-loadgen (8 users x 64 candidates, 32 history
# events): one client calling sequentially (3 s); capacity = closed loop with
# 2 in flight (3 s); unloaded = open loop at 10% of capacity, Poisson (6 s);
# overload = open loop at 2x capacity, Poisson (4 s), with a grpcio probe
# (20 calls/s) timing answers by status. One JSON line per config on stdout
# (and $OUT/summary.jsonl), full outputs under $OUT.
#
# Usage: bench/overload.sh            (BIN=build, the daemon and loadgen there)
#   env: BIN (ikbo-serve, ikbo-loadgen), OUT, PY (python3 with grpcio),
#        ONLY_TIGHT=1 (skip the defaults config),
#        PROBE_BIN (a serialized RankRequest for the probe; made here with the
#        generated stubs in $BIN/gen/py when absent; no probe without either).
# GPU machine (builds nothing): bench/e2e/stage.sh, then run with
#   BIN=.devrun LD_LIBRARY_PATH=.devlibs, carrying .devrun and .devlibs.
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
BIN=${BIN:-build}; OUT=${OUT:-/tmp/ikbo-overload}; PY=${PY:-python3}
mkdir -p "$OUT"
echo "nproc $(nproc) $(uptime)" | tee "$OUT/host.txt"
PROBE_BIN=${PROBE_BIN:-$OUT/probe.bin}
if [ ! -s "$PROBE_BIN" ] && [ -d "$BIN/gen/py" ]; then
  IKBO_BUILD=$BIN IKBO_ROOT=$ROOT $PY - "$PROBE_BIN" <<'PYEOF' || true
import sys; sys.path.insert(0, "tests/integration")
from ikbo_itest import make_request, to_proto
open(sys.argv[1], "wb").write(to_proto(make_request("models/demo/1", users=8, cands_per_user=64,
                                                    seed=77, history_len=32)).SerializeToString())
PYEOF
fi
free_port() { $PY -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])"; }
run_case() { # name batching-json
  local name=$1 B=$2 port hport
  port=$(free_port); hport=$(free_port)
  cat > "$OUT/$name.json" <<J
{"grpc_listen":"127.0.0.1:$port","http_listen":"127.0.0.1:$hport","model_repository":"$ROOT/models","models":["demo"],"threads":2,"log":{"level":"warn"},"batching":$B}
J
  "$BIN/ikbo-serve" --config "$OUT/$name.json" > "$OUT/$name.serve.log" 2>&1 &
  local P=$!
  for _ in $(seq 100); do curl -s "localhost:$hport/readyz" | grep -q ready && break; sleep 0.1; done
  local LG="$BIN/ikbo-loadgen --target 127.0.0.1:$port --model demo --users 8 --candidates 64 --history 32 --warmup 0.5 --timeout-ms 10000 --json"
  $LG --concurrency 1 --duration 1 > /dev/null
  $LG --concurrency 1 --duration 3 > "$OUT/$name.one.json"
  $LG --concurrency 2 --duration 3 > "$OUT/$name.cap.json"
  local CAP
  CAP=$($PY -c "import json; print(json.load(open('$OUT/$name.cap.json'))['measured']['ok_per_s'])")
  $LG --rate "$($PY -c "print('%.2f' % ($CAP*0.1))")" --poisson --duration 6 > "$OUT/$name.low.json"
  curl -s "localhost:$hport/metrics" > "$OUT/$name.m0.prom"
  local Q=""
  if [ -s "$PROBE_BIN" ]; then
    $PY - "$port" 4.5 "$OUT/$name.probe.json" "$PROBE_BIN" <<'PYEOF' &
import json, sys, time, grpc
port, secs, out = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
payload = open(sys.argv[4], "rb").read()
call = grpc.insecure_channel("127.0.0.1:%d" % port).unary_unary(
    "/ikbo.v1.Ranker/Rank", request_serializer=None, response_deserializer=None)
res, stop = {}, time.time() + secs
while time.time() < stop:
    t0 = time.perf_counter()
    try:
        call(payload, timeout=10); code = "OK"
    except grpc.RpcError as e:
        code = e.code().name
    res.setdefault(code, []).append(1e3 * (time.perf_counter() - t0))
    time.sleep(0.05)
json.dump(res, open(out, "w"))
PYEOF
    Q=$!
  fi
  $LG --rate "$($PY -c "print('%.2f' % ($CAP*2))")" --poisson --duration 4 --max-inflight 1000 > "$OUT/$name.hi.json"
  [ -n "$Q" ] && wait "$Q"
  curl -s "localhost:$hport/metrics" > "$OUT/$name.m1.prom"
  kill "$P"; wait "$P"
  $PY - "$OUT" "$name" <<'PYEOF'
import json, os, sys
out, name = sys.argv[1], sys.argv[2]
def L(s):
    j = json.load(open("%s/%s.%s.json" % (out, name, s))); m = j["measured"]
    return dict(ok_rps=round(m["ok_per_s"], 1), p50=round(m["latency_ms"]["p50"], 2),
                p99=round(m["latency_ms"]["p99"], 2), codes={k: v for k, v in j["codes"].items() if v},
                unsent=j.get("unsent", 0), sent=j["sent"])
def pct(xs, p):
    xs = sorted(xs); return round(xs[min(len(xs)-1, int(round(p/100.0*(len(xs)-1))))], 2) if xs else None
pf = "%s/%s.probe.json" % (out, name)
pr = json.load(open(pf)) if os.path.exists(pf) else {}
r = dict(case=name, one=L("one"), cap=L("cap"), low=L("low"), hi=L("hi"),
         probe={k: dict(n=len(v), p50=pct(v, 50), p99=pct(v, 99)) for k, v in pr.items()})
r["ratio_vs_low"] = round(r["hi"]["p99"] / r["low"]["p99"], 2)
r["ratio_vs_one"] = round(r["hi"]["p99"] / r["one"]["p99"], 2)
print(json.dumps(r))
PYEOF
}
run_case tight '{"max_batch_candidates":512,"max_queue_candidates":512,"max_queue_delay_us":0,"instances":1}' | tee -a "$OUT/summary.jsonl"
[ -n "${ONLY_TIGHT:-}" ] || run_case defaults '{}' | tee -a "$OUT/summary.jsonl"
