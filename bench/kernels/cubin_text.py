#!/usr/bin/python3
"""Compares the machine code of two ELF objects function by function: the
.text.<name> sections of two cubins (`nvcc -cubin`), or of two host objects
built with -ffunction-sections.

Why this exists: a change that must not touch the device code (a refactor,
a flag whose default keeps the old path) is checked by building the kernel
file before and after and comparing what the GPU would run. Whole-file
hashes differ for reasons that do not matter (section order, symbol tables,
debug line info), and there is no cuobjdump off the device machine. Two
versions of a kernel are the same when each .text section of one has a
byte-identical twin of the same name in the other. A template argument
added by the change renames every instantiation (linear_wr's WR_CL = 1
adds `ELi1E`); --rename 'PATTERN=REPLACEMENT' (a Python regex, split at
the last "=", applied to the second file's names, repeatable) maps them
back before pairing.

    nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -I. -cubin \\
        -o /tmp/old.cubin kernels/cuda/linear_wr.cu     # at the old commit
    ... the same at the new one -> /tmp/new.cubin
    bench/kernels/cubin_text.py /tmp/old.cubin /tmp/new.cubin --rename 'ELi1EEv=EEv'

Prints one line per function (same / differs / only in A / only in B) and
a summary; exit 0 when every function is present in both and identical, 1
when any differs or is missing, 2 on an unreadable file.
"""
import argparse
import re
import struct
import sys


class ElfError(Exception):
    pass


def text_sections(path):
    """{section name: bytes} for the .text.* sections of a 64-bit
    little-endian ELF file."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ElfError("%s: %s" % (path, e.strerror))
    if len(data) < 64 or data[:4] != b"\x7fELF":
        raise ElfError("%s: not an ELF file" % path)
    if data[4] != 2 or data[5] != 1:
        raise ElfError("%s: only 64-bit little-endian ELF is read" % path)
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    if shentsize < 64 or shoff + shnum * shentsize > len(data) or shstrndx >= shnum:
        raise ElfError("%s: section header table out of bounds" % path)
    headers = []
    for i in range(shnum):
        name, stype, _flags, _addr, off, size = struct.unpack_from(
            "<IIQQQQ", data, shoff + i * shentsize)
        headers.append((name, stype, off, size))
    _, _, str_off, str_size = headers[shstrndx]
    strtab = data[str_off:str_off + str_size]
    out = {}
    for name, stype, off, size in headers:
        end = strtab.find(b"\0", name)
        label = strtab[name:end if end >= 0 else None].decode("ascii", "replace")
        if not label.startswith(".text."):
            continue
        if stype == 8:  # SHT_NOBITS: no bytes in the file
            body = b""
        elif off + size > len(data):
            raise ElfError("%s: section %s out of bounds" % (path, label))
        else:
            body = data[off:off + size]
        out[label[len(".text."):]] = body
    return out


def compare(a, b, renames):
    """Rows (name, verdict) over the union of both files' functions, B's
    names renamed first; and whether every function is the same."""
    renamed = {}
    for name, body in b.items():
        for pat, rep in renames:
            name = re.sub(pat, rep, name)
        if name in renamed:
            raise ElfError("--rename maps two functions of B to %s" % name)
        renamed[name] = body
    rows = []
    for name in sorted(set(a) | set(renamed)):
        if name not in renamed:
            rows.append((name, "only in A"))
        elif name not in a:
            rows.append((name, "only in B"))
        elif a[name] == renamed[name]:
            rows.append((name, "same (%d bytes)" % len(a[name])))
        else:
            rows.append((name, "differs (%d / %d bytes)" % (len(a[name]), len(renamed[name]))))
    return rows, all(v.startswith("same") for _, v in rows)


def parse_rename(arg):
    if "=" not in arg:
        raise argparse.ArgumentTypeError("expected PATTERN=REPLACEMENT, got %r" % arg)
    pat, rep = arg.rsplit("=", 1)  # a pattern may hold "=" ((?=...)); a replacement rarely does
    try:
        re.compile(pat)
    except re.error as e:
        raise argparse.ArgumentTypeError("bad pattern %r: %s" % (pat, e))
    return pat, rep


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", help="the first ELF object (e.g. the old build's cubin)")
    ap.add_argument("b", help="the second ELF object")
    ap.add_argument("--rename", type=parse_rename, action="append", default=[],
                    metavar="PATTERN=REPLACEMENT",
                    help="regex applied to B's function names before pairing (repeatable)")
    args = ap.parse_args(argv)
    try:
        rows, same = compare(text_sections(args.a), text_sections(args.b), args.rename)
    except ElfError as e:
        print("cubin_text: %s" % e, file=sys.stderr)
        return 2
    if not rows:
        print("cubin_text: neither file has a .text.* section", file=sys.stderr)
        return 2
    for name, verdict in rows:
        print("%-24s %s" % (verdict, name))
    n_same = sum(1 for _, v in rows if v.startswith("same"))
    print("%d of %d functions identical%s" % (n_same, len(rows), "" if same else "; NOT the same code"))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
