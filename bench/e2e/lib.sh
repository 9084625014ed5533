# lib.sh - shell helpers the bench/e2e scripts share (sourced, never run).
#
# Why this exists: device.sh, ab.sh and grpc_args.sh each wrote the daemon's
# throughput config and each waited for /readyz their own way (three copies
# of the JSON, one of them in Python); a change to one drifted from the
# others. No state: each function reads its arguments only.

# The daemon's config for throughput runs (e2e, load, A/B): queue limits raised
# so that many large requests in flight measure throughput, not admission
# (bench/overload.sh measures admission). KEYS: more "batching" keys as a JSON
# fragment ('"graphs": 0') or object ('{"graphs": 0}'), or nothing.
throughput_config() { # FILE [KEYS]
  local keys=${2:-}
  keys=${keys#"${keys%%[![:space:]]*}"}; keys=${keys%"${keys##*[![:space:]]}"}
  if [ "${keys:0:1}" = "{" ]; then
    [ "${keys: -1}" = "}" ] || { echo "throughput_config: '$2' is not a JSON object" >&2; return 2; }
    keys=${keys:1:${#keys}-2}
  fi
  keys=${keys#"${keys%%[![:space:]]*}"}
  printf '{"batching": {"max_queue_candidates": 4000000, "max_queue_requests": 100000%s}}\n' \
      "${keys:+, $keys}" > "$1"
}

# Waits until the daemon PID answers GET http://HTTP/readyz, at most SECONDS
# (default 120). Returns 1, naming why, if the daemon exits first or the time
# runs out (the caller shows its log).
wait_ready() { # PID HTTP [SECONDS]
  local pid=$1 http=$2 end=$((SECONDS + ${3:-120}))
  while [ $SECONDS -lt $end ]; do
    curl -sf "http://$http/readyz" >/dev/null 2>&1 && return 0
    kill -0 "$pid" 2>/dev/null || { echo "wait_ready: the daemon (pid $pid) exited before it was ready" >&2; return 1; }
    sleep 0.1
  done
  echo "wait_ready: the daemon (pid $pid) was not ready at http://$http/readyz after ${3:-120} s" >&2
  return 1
}
