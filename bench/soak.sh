#!/usr/bin/env bash
# soak.sh - the daemon soak: build/ikbo-serve on the CPU under mixed gRPC
# (ikbo-loadgen, grpcio) and HTTP load for --minutes M (default 30), with a
# new model version every minute, SIGHUP and admin unload/load; judged on
# failed calls, server/client counter agreement and RSS/fd/thread growth.
# What runs, which codes are expected and the resource rule: the top comment
# of bench/soak/soak.py, which does the work.
#
# Usage: bench/soak.sh [--minutes M] [--out DIR] [--period-s S] [--sample-s S]
#   env: IKBO_BUILD (default build: ikbo-serve, ikbo-loadgen, gen/py), PY
#        (a python3 with grpcio, protobuf, prometheus_client; default
#        /usr/bin/python3)
# Exit 0 pass, 1 a check failed (named in the output), 2 setup error.
set -u
cd "$(dirname "$0")/.."
export IKBO_ROOT=$PWD
export IKBO_BUILD=${IKBO_BUILD:-$PWD/build}
for b in ikbo-serve ikbo-loadgen; do
  [ -x "$IKBO_BUILD/$b" ] || { echo "soak.sh: missing $IKBO_BUILD/$b: run make" >&2; exit 2; }
done
exec "${PY:-/usr/bin/python3}" bench/soak/soak.py "$@"
