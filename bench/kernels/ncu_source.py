#!/usr/bin/python3
"""ncu_source.py - the consumer warpgroups' share of a k_att_wg PC-sampling
profile, from ncu's source page as CSV:

    ncu --kernel-name regex:k_att_wg --launch-skip 4 --launch-count 1 \\
        --section SourceCounters --section WarpStateStats -o att <app>
    ncu -i att.ncu-rep --page source --print-source sass --csv > att.csv
    python3 bench/kernels/ncu_source.py att.csv

Why this exists: bench/RESULTS.md's PC-sampling rows (2026-12-04, ninth
session) come from this reading of the CSV. The consumers' code is every
instruction before the producer's `USETMAXREG.DEALLOC` (the producer's
setmaxnreg_dec, which ptxas places after the consumers' code); an mbarrier
wait is a SYNCS.PHASECHK setting a predicate and the `@!P BRA` that loops on
it, whose samples are the time spent waiting. Prints the consumers' samples,
their stall reasons, instructions executed, and each wait's samples with how
often it ran (the main loop's K/V wait runs most).
"""
import csv
import re
import sys


def main(path):
    rows = list(csv.reader(open(path)))
    head = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    hdr, data = rows[head], rows[head + 1:]
    ix = {h: i for i, h in enumerate(hdr)}
    cut = next(i for i, r in enumerate(data) if "USETMAXREG.DEALLOC" in r[1])
    cons = data[:cut]
    reasons = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    num = lambda r, k: int(r[ix[k]] or 0)  # noqa: E731
    tot = {k: sum(num(r, k) for r in cons) for k in reasons}
    n = sum(tot.values())
    ins = sum(num(r, "Instructions Executed") for r in cons)
    print("consumer samples %d, instructions executed %.2f M" % (n, ins / 1e6))
    for k, v in sorted(tot.items(), key=lambda kv: -kv[1]):
        if v:
            print("  %-24s %6d %5.1f%%" % (k[6:], v, 100.0 * v / n))
    print("mbarrier waits (index, executions, samples on the waiting branch):")
    for i, r in enumerate(cons):
        m = re.search(r"SYNCS\.PHASECHK\S*\s+(P\d)", r[1])
        if not m:
            continue
        for j in range(i + 1, min(i + 20, len(cons))):
            if re.search(r"@!%s\s+BRA" % m.group(1), cons[j][1]):
                print("  [%d] %8d %6d  %s" % (i, num(r, "Instructions Executed"),
                                             num(cons[j], "Warp Stall Sampling (All Samples)"),
                                             r[1].strip()[:60]))
                break


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: ncu_source.py SOURCE_PAGE.csv")
    main(sys.argv[1])
