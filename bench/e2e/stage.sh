#!/usr/bin/env bash
# stage.sh - builds and gathers what bench/e2e/device.sh needs on the GPU
# machine (which can build nothing): stripped daemon, scorer, load
# generator, echo server (run.sh's floor) and host_path in .devrun/, their non-system
# shared libraries in .devlibs/ (both git-ignored through .git/info/exclude). Then, with the device tool:
#   run  command: "bench/e2e/device.sh"   carry: [".devrun", ".devlibs"]
set -euo pipefail
cd "$(dirname "$0")/../.."
make -s -j2 build/ikbo-serve build/ikbo-score build/ikbo-plan build/ikbo-loadgen build/echo_server build/host_path \
    build/gen/py/ikbo/v1/ranker_pb2.py build/gen/py/grpc/health/v1/health_pb2.py
rm -rf .devrun .devlibs
mkdir -p .devrun
for b in ikbo-serve ikbo-score ikbo-plan ikbo-loadgen echo_server host_path; do strip -o .devrun/$b build/$b; done
cp -r build/gen .devrun/gen && rm -rf .devrun/gen/ikbo .devrun/gen/grpc
git rev-parse HEAD > .devrun/COMMIT
bash ../shared/device/bundle-libs.sh .devrun/ikbo-serve .devrun/ikbo-loadgen .devlibs
ex=$(git rev-parse --git-path info/exclude); mkdir -p "$(dirname "$ex")"
for d in /.devrun/ /.devlibs/; do grep -qx "$d" "$ex" 2>/dev/null || echo "$d" >> "$ex"; done
du -sh .devrun .devlibs
