#!/bin/sh
# coverage.sh SITES - which allocation call sites in engine/, server/ and
# kernels/cpu/ the out-of-memory sweep (make alloc-fail) made fail.
# SITES: the file test_alloc_fail writes (AF_SITES): "path:line calls failed".
# Prints reached/total and every call site never made to fail; exits 1
# when there is one (every out-of-memory branch must be exercised).
set -eu
sites=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Every line with an allocation call, as path:line.
grep -nE '\b(malloc|calloc|realloc|strdup|strndup|posix_memalign|aligned_alloc)\s*\(' \
    engine/*.c server/*.c kernels/cpu/*.c | grep -v 'server/main.c' |
    grep -vE '^[^:]+:[0-9]+:\s*(/\*|\*)' | cut -d: -f1,2 | sort -u > "$tmp/all"
# Sites that failed at least once, with the path made relative to the tree.
awk '$3 > 0 {print $1}' "$sites" | sed "s|^$(pwd)/||; s|^\./||" | sort -u > "$tmp/hit"
# A call inside a macro (a line ending in a backslash) is attributed by the
# debug info to the lines that invoke the macro: such a site counts as
# reached when one of its invocations is.
while IFS=: read -r f l; do
    sed -n "${l}p" "$f" | grep -q '\\$' || continue
    name=$(head -n "$l" "$f" | grep -E '^#define [A-Za-z_0-9]+\(' | tail -1 |
           sed -E 's/^#define ([A-Za-z_0-9]+).*/\1/')
    [ -n "$name" ] || continue
    grep -nE "\b$name\(" "$f" | grep -v '#define' | cut -d: -f1 | while read -r i; do
        grep -qx "$f:$i" "$tmp/hit" && echo "$f:$l" && break
    done
done < "$tmp/all" >> "$tmp/hit"
sort -u -o "$tmp/hit" "$tmp/hit"
comm -12 "$tmp/all" "$tmp/hit" > "$tmp/reached"
comm -23 "$tmp/all" "$tmp/hit" > "$tmp/missed"
echo "alloc-fail coverage: $(wc -l < "$tmp/reached") of $(wc -l < "$tmp/all") allocation call sites" \
     "in engine/ server/ kernels/cpu/ made to fail"
grep -E '^\[lib' "$sites" | awk '{printf "  %s: %d allocations, %d made to fail\n", $1, $2, $3}'
if [ -s "$tmp/missed" ]; then
    echo "  never failed (give each a sweep in tests/alloc/test_alloc_fail.c):"
    while IFS=: read -r f l; do
        printf '    %s:%s: %s\n' "$f" "$l" "$(sed -n "${l}p" "$f" | sed 's/^ *//' | cut -c1-90)"
    done < "$tmp/missed"
    exit 1
fi
