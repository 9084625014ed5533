#!/usr/bin/env bash
# spills.sh - each kernel's registers and spills (ptxas -v), at a git ref
# and in the working tree, side by side.
#
# Why this exists: an edit that looks local to a kernel's epilogue can move
# the register allocation of the whole kernel. In the thirty-fifth session
# a 64-bit division of the attention's output row added 4 bytes of spills
# to k_att_wg (48 -> 52) and cost the attention 10% of its time at the
# bench model's 16 x 70 (bench/RESULTS.md). ptxas says so at compile time,
# here, without a GPU; a change in spills predicts a change in time. Read
# this before a kernel change goes to the device.
#
#   bench/kernels/spills.sh [--ref REF] [FILE.cu ...]
#     REF: the commit to compare with (default HEAD); FILE: sources under
#     kernels/cuda (default: all of them in the tree). A FILE on one side
#     only (added or deleted) lists its kernels with "-" on the other. A
#     kernel whose parameters changed (its mangled name with them) is
#     paired with its old name when that is unambiguous, and marked so.
#     Both sides are compiled with the tree's flags (`make nvcc-flags`:
#     the Makefile's, one place), so only source changes show; objects are
#     thrown away.
#
# Prints one line per kernel instance whose registers, stack frame or
# spills differ (all of them with SPILLS_ALL=1), then a count. Exit 0 when
# none differ, 1 when some do, 2 on bad usage or a failed compile.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
NVCC=${NVCC:-$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)}
REF=HEAD
if [ "${1:-}" = --ref ]; then
  [ $# -ge 2 ] || { echo "spills: --ref needs a commit" >&2; exit 2; }
  REF=$2
  shift 2
fi
[ -x "$NVCC" ] || { echo "spills: nvcc not found (set NVCC)" >&2; exit 2; }
git -C "$ROOT" rev-parse -q --verify "$REF^{commit}" > /dev/null ||
  { echo "spills: $REF is not a commit" >&2; exit 2; }
FILES=("$@")
if [ ${#FILES[@]} = 0 ]; then
  mapfile -t FILES < <(cd "$ROOT" && ls kernels/cuda/*.cu)
fi
FLAGS=$(make -s --no-print-directory -C "$ROOT" nvcc-flags) ||
  { echo "spills: 'make nvcc-flags' failed in $ROOT" >&2; exit 2; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$TMP/ref"
git -C "$ROOT" archive "$REF" | tar -x -C "$TMP/ref"

# table DIR OUT: "kernel<TAB>registers<TAB>stack<TAB>spill stores<TAB>spill
# loads" for every entry function of FILES compiled in DIR.
table() {
  local dir=$1 out=$2 f
  : > "$out"
  for f in "${FILES[@]}"; do
    [ -f "$dir/$f" ] || continue # on the other side only (checked below)
    # shellcheck disable=SC2086 # FLAGS: one argument a word
    (cd "$dir" && "$NVCC" $FLAGS -Xptxas -v -c "$f" -o "$TMP/x.o") > "$TMP/log" 2>&1 ||
      { echo "spills: compiling $f in $dir failed:" >&2; tail -n 20 "$TMP/log" >&2; exit 2; }
    awk '/Compiling entry function/ { k = $0; sub(/.*function .\047?/, "", k); sub(/\047.*/, "", k) }
         /bytes stack frame/ { st = $1; ss = $5; sl = $9 }
         /Used [0-9]+ registers/ && k != "" { r = $0; sub(/.*Used /, "", r); sub(/ registers.*/, "", r)
           print k "\t" r "\t" st "\t" ss "\t" sl; k = "" }' "$TMP/log" >> "$out"
  done
  sort -o "$out" "$out"
}
for f in "${FILES[@]}"; do
  [ -f "$TMP/ref/$f" ] || [ -f "$ROOT/$f" ] ||
    { echo "spills: $f is neither at $REF nor in the tree" >&2; exit 2; }
done
table "$TMP/ref" "$TMP/a"
table "$ROOT" "$TMP/b"
# A kernel on one side only is paired with one on the other side whose
# mangled name differs only in its parameters (a parameter added renames
# every instance), when exactly one of each shares that prefix.
join -t $'\t' -a 1 -a 2 -e - -o 0,1.2,1.3,1.4,1.5,2.2,2.3,2.4,2.5 "$TMP/a" "$TMP/b" |
  awk -F'\t' -v all="${SPILLS_ALL:-0}" -v ref="$REF" '
    # The name without its parameters: _Z<len><name>, then the template
    # arguments through the return type ("...Ev") when it has some.
    function stem(n,   len, base, rest, p) {
      if (!match(n, /^_Z[0-9]+/)) return n
      len = substr(n, 3, RLENGTH - 2) + 0
      base = substr(n, 1, RLENGTH + len); rest = substr(n, RLENGTH + len + 1)
      if (substr(rest, 1, 1) == "I" && (p = index(rest, "Ev"))) return base substr(rest, 1, p + 1)
      return base
    }
    { k[NR] = $1; a[NR] = $2 "/" $3 "/" $4 "+" $5; b[NR] = $6 "/" $7 "/" $8 "+" $9
      if (a[NR] == "-/-/-+-") { nb[stem($1)]++; ib[stem($1)] = NR }
      if (b[NR] == "-/-/-+-") { na[stem($1)]++; ia[stem($1)] = NR } }
    END {
      printf "%-10s %-22s %-22s %s\n", "", ref " regs/stack/spills", "tree", "kernel"
      for (i = 1; i <= NR; i++) {
        if (b[i] == "-/-/-+-" && na[stem(k[i])] == 1 && nb[stem(k[i])] == 1) continue # paired below
        name = k[i]; x = a[i]
        if (x == "-/-/-+-" && na[stem(k[i])] == 1 && nb[stem(k[i])] == 1) {
          x = a[ia[stem(k[i])]]; name = k[i] " (parameters changed)"
        }
        d = x != b[i]; n += d; m++
        if (d || all) printf "%-10s %-22s %-22s %s\n", d ? "differs" : "same", x, b[i], name
      }
      printf "%d of %d kernel instances differ\n", n, m; exit n > 0
    }'
