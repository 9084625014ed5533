#!/usr/bin/env bash
# ab_pack.sh - two git refs' GPU checks and forward timer in one tarball,
# for bench/kernels/ab_device.sh to run against each other on the GPU.
#
# Why this exists: device time is short and a machine may not start when
# asked (bench/RESULTS.md counts refused calls), so a kernel change should
# be ready to decide in one call the moment one does. This builds, here,
# each ref in a worktree of its own (tests/gpu/build.sh --checks-only:
# batch_phases, test_cuda_ops, test_cuda_model), strips them, and packs
# them with the random models test_cuda_model checks and the refs' commits,
# and B's kernels' registers and spills against A's (bench/kernels/spills.sh:
# a change in spills predicts a change in time, read before the device):
#
#   bench/kernels/ab_pack.sh [--variant NAME=FILE:FLAGS]... REF_A REF_B [OUT]
#   (OUT: .carry/ab.tar.xz); then, on the device: bash bench/kernels/ab_device.sh OUT
#   (run's carry: [OUT]; .carry/ is in .git/info/exclude)
#
# A variant is B with one CUDA source rebuilt with extra nvcc flags (a
# tuning constant's -D, e.g. k8=kernels/cuda/mlp2.cu:-DMLP2_ADDEND_SMS=8):
# its batch_phases alone, as v/NAME, timed beside A and B by ab_device.sh.
# The object is built by the Makefile's own rule (BUILD=build-NAME; FLAGS
# after its NVCCFLAGS default, passed through the environment so that the
# Makefile still appends its own) and replaces its namesake in a copy of
# B's build/libikbo.a. B must have tests/gpu/build.sh's --phases-only
# (2026-12-07 on).
#
# The models come from this checkout's build/gpu/models (tests/gpu/build.sh
# without --no-models writes them; PyTorch needed). A ref older than
# --checks-only builds everything there, models too (slower, same result).
# Exit 2 on bad usage, 1 on a failed build (its log named).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2; }
VARIANTS=()
while [ "${1:-}" = --variant ]; do
  [ $# -ge 2 ] || usage
  v=$2
  [[ $v =~ ^[a-z][a-z0-9_]*=[^:]+\.cu:.+$ ]] ||
    { echo "ab_pack: --variant $v: expected NAME=FILE.cu:FLAGS (NAME in lower case)" >&2; exit 2; }
  VARIANTS+=("$v")
  shift 2
done
[ $# -ge 2 ] || usage
REF_A=$1 REF_B=$2 OUT=${3:-$ROOT/.carry/ab.tar.xz}
MODELS="r0 r1 r3 r5 f_seq41 f_hstu51 demo f_dlrm11 m_fold"
for m in $MODELS; do
  [ -f "$ROOT/build/gpu/models/$m/1/model.json" ] ||
    { echo "ab_pack: build/gpu/models/$m is missing (run tests/gpu/build.sh first)" >&2; exit 2; }
done
for ref in "$REF_A" "$REF_B"; do
  git -C "$ROOT" rev-parse -q --verify "$ref^{commit}" > /dev/null ||
    { echo "ab_pack: $ref is not a commit" >&2; exit 2; }
done
# variant WORKTREE NAME=FILE:FLAGS SHA: B's batch_phases with FILE's object
# rebuilt with FLAGS, into $STG/v/NAME.
variant() {
  local wt=$1 name=${2%%=*} rest=${2#*=} sha=$3
  local file=${rest%%:*} flags=${rest#*:} vb=build-$name
  local obj=$vb/obj/${file%.cu}.o
  [ -f "$wt/$file" ] || { echo "ab_pack: variant $name: $file is not in B" >&2; exit 2; }
  echo "ab_pack: variant $name = B with $file built with $flags"
  local m
  m=$(basename "$obj")
  # The archive holds members by base name, and a CPU op and its CUDA twin
  # share one (pool.o); the Makefile archives the CUDA objects last, so the
  # last member of that name is FILE's: deleted, then the new one appended
  # (ar q, then ar s: GNU ar takes "qs" for "r", which replaces the first).
  (cd "$wt" && rm -rf "$vb" && NVCCFLAGS="-O3 -lineinfo $flags" make -s BUILD="$vb" "$obj" &&
     cp build/libikbo.a "$vb/libikbo.a" && cp "$obj" "$vb/$m" && cd "$vb" &&
     n=$(ar t libikbo.a | grep -cx "$m") && ar dN "$n" libikbo.a "$m" && ar q libikbo.a "$m" && ar s libikbo.a &&
     cd "$wt" && B="$vb/gpu" LIB="$vb/libikbo.a" bash tests/gpu/build.sh --phases-only) \
    >> "/tmp/ikbo-ab-B.log" 2>&1 ||
    { echo "ab_pack: building variant $name failed (log /tmp/ikbo-ab-B.log)" >&2; exit 1; }
  mkdir -p "$STG/v/$name"
  cp "$wt/$vb/gpu/batch_phases" "$STG/v/$name/" && strip "$STG/v/$name/batch_phases"
  echo "$name B+$file:$flags $sha" >> "$STG/v/REFS"
}
# spills WORKTREE SHA_A: B's kernels' registers and spills against A's
# (bench/kernels/spills.sh, when B has it) over the CUDA sources that
# differ, or all of them when a header does; printed here, before any
# device time is spent, and packed as v/SPILLS for ab_device.sh's table.
spills() {
  local wt=$1 a=$2 files
  [ -x "$wt/bench/kernels/spills.sh" ] || return 0
  files=$(git -C "$wt" diff --name-only "$a" HEAD -- kernels/cuda)
  if [ -z "$files" ]; then
    echo "no CUDA source differs" > "$STG/v/SPILLS"
  else
    if grep -qv '\.cu$' <<< "$files"; then files=""; fi # a header changed: every .cu
    # shellcheck disable=SC2086 # one argument a file
    (cd "$wt" && bench/kernels/spills.sh --ref "$a" $files) > "$STG/v/SPILLS" 2>&1 || true
  fi
  echo "ab_pack: registers and spills, B against A: $(tail -n 1 "$STG/v/SPILLS")"
}
STG=$(mktemp -d /tmp/ikbo-ab-stage.XXXXXX)
trap 'rm -rf "$STG"' EXIT
mkdir -p "$STG/v" "$STG/build/gpu/models"
for tag in A B; do
  ref=$REF_A; [ $tag = B ] && ref=$REF_B
  sha=$(git -C "$ROOT" rev-parse --verify "$ref^{commit}")
  wt=/tmp/ikbo-ab-$tag
  git -C "$ROOT" worktree remove --force "$wt" 2>/dev/null || rm -rf "$wt"
  git -C "$ROOT" worktree prune
  git -C "$ROOT" worktree add -q --detach "$wt" "$sha"
  log=/tmp/ikbo-ab-$tag.log
  echo "ab_pack: $tag = $ref ($sha), building in $wt"
  (cd "$wt" && bash tests/gpu/build.sh --checks-only) > "$log" 2>&1 ||
    { echo "ab_pack: building $ref failed (log $log)" >&2; exit 1; }
  mkdir -p "$STG/v/$tag"
  for b in batch_phases test_cuda_ops test_cuda_model; do
    cp "$wt/build/gpu/$b" "$STG/v/$tag/"
    strip "$STG/v/$tag/$b"
  done
  echo "$tag $ref $sha" >> "$STG/v/REFS"
  [ $tag = B ] && for v in "${VARIANTS[@]}"; do variant "$wt" "$v" "$sha"; done
  [ $tag = B ] && spills "$wt" "$(git -C "$ROOT" rev-parse --verify "$REF_A^{commit}")"
  git -C "$ROOT" worktree remove --force "$wt"
done
for m in $MODELS; do cp -r "$ROOT/build/gpu/models/$m" "$STG/build/gpu/models/"; done
mkdir -p "$(dirname "$OUT")"
(cd "$STG" && tar cf - . | xz -T0 -6) > "$OUT.tmp" && mv "$OUT.tmp" "$OUT"
echo "ab_pack: $OUT ($(du -h "$OUT" | cut -f1)): $(paste -sd';' "$STG/v/REFS")"
