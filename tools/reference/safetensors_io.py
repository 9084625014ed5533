#!/usr/bin/python3
"""Minimal reader/writer of the safetensors format, written from its public
description so the reference tools need no `safetensors` package.

Layout: 8-byte little-endian unsigned header size N, N bytes of JSON header
{name: {"dtype", "shape", "data_offsets": [begin, end]}, optional
"__metadata__": {str: str}}, then the raw little-endian tensor bytes; offsets
are relative to the first byte after the header. Only the dtypes of
ikbo-model/1 (F32, F16, BF16) are supported.

The reader is strict (offsets in range, sizes match shapes, no holes or
overlaps, buffer fully covered) because the reference interpreter is also the
model validator of the exporter.
"""
import json
import struct

import numpy as np
import torch

# dtype name -> bytes per element
ITEMSIZE = {"F32": 4, "F16": 2, "BF16": 2}

# Refuse absurd headers before allocating (a corrupt file must fail cleanly).
MAX_HEADER = 100 * 1024 * 1024


def _decode(dtype, raw, shape):
    """Raw little-endian bytes -> torch tensor of the stored dtype."""
    if dtype == "F32":
        arr = np.frombuffer(raw, dtype="<f4").astype(np.float32)
        return torch.from_numpy(arr.copy()).reshape(shape)
    if dtype == "F16":
        arr = np.frombuffer(raw, dtype="<f2").astype(np.float16)
        return torch.from_numpy(arr.copy()).reshape(shape)
    if dtype == "BF16":
        # bf16 is the top half of an f32: widen exactly through uint32.
        bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        f32 = bits.view(np.float32)
        return torch.from_numpy(f32.copy()).reshape(shape).to(torch.bfloat16)
    raise ValueError("unsupported dtype %r" % dtype)


def _encode(dtype, tensor):
    """torch tensor -> raw little-endian bytes of `dtype` (round to nearest even)."""
    t = tensor.detach().cpu().contiguous()
    if dtype == "F32":
        return t.to(torch.float32).numpy().astype("<f4").tobytes()
    if dtype == "F16":
        return t.to(torch.float16).numpy().astype("<f2").tobytes()
    if dtype == "BF16":
        bits = t.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
        return bits.astype("<u2").tobytes()
    raise ValueError("unsupported dtype %r" % dtype)


def load(path):
    """Returns ({name: tensor in its stored dtype}, metadata dict or {}).

    Raises ValueError naming the file and the problem on a malformed file."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise ValueError("%s: shorter than the 8-byte header size" % path)
    (n,) = struct.unpack("<Q", blob[:8])
    if n > MAX_HEADER or 8 + n > len(blob):
        raise ValueError("%s: header size %d exceeds the file" % (path, n))
    try:
        header = json.loads(blob[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError("%s: header is not JSON: %s" % (path, e))
    if not isinstance(header, dict):
        raise ValueError("%s: header is not a JSON object" % path)
    data = blob[8 + n:]
    meta = header.pop("__metadata__", {}) or {}
    tensors = {}
    spans = []
    for name, info in header.items():
        where = "%s: tensor %r" % (path, name)
        if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
            raise ValueError("%s: entry needs exactly dtype, shape, data_offsets" % where)
        dtype = info["dtype"]
        if dtype not in ITEMSIZE:
            raise ValueError("%s: dtype %r not one of F32, F16, BF16" % (where, dtype))
        shape = info["shape"]
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise ValueError("%s: bad shape %r" % (where, shape))
        off = info["data_offsets"]
        if (not isinstance(off, list) or len(off) != 2
                or not all(isinstance(o, int) for o in off) or not 0 <= off[0] <= off[1] <= len(data)):
            raise ValueError("%s: data_offsets %r out of range (data is %d bytes)" % (where, off, len(data)))
        count = 1
        for d in shape:
            count *= d
        if off[1] - off[0] != count * ITEMSIZE[dtype]:
            raise ValueError("%s: %d bytes for shape %r of %s" % (where, off[1] - off[0], shape, dtype))
        spans.append((off[0], off[1], name))
        tensors[name] = _decode(dtype, data[off[0]:off[1]], shape)
    # The format requires the buffer to be covered exactly, without holes.
    pos = 0
    for begin, end, name in sorted(spans):
        if begin != pos:
            raise ValueError("%s: tensor %r starts at %d, expected %d (hole or overlap)" % (path, name, begin, pos))
        pos = end
    if pos != len(data):
        raise ValueError("%s: %d trailing bytes after the last tensor" % (path, len(data) - pos))
    return tensors, meta


def save(path, tensors, dtype="F32", metadata=None):
    """Writes {name: tensor} with every tensor converted to `dtype`.

    Tensors are written in sorted name order; the header is padded with spaces
    to a multiple of 8 bytes (as the reference implementation does) so that
    the data section is aligned."""
    if dtype not in ITEMSIZE:
        raise ValueError("dtype %r not one of F32, F16, BF16" % dtype)
    header = {}
    chunks = []
    pos = 0
    for name in sorted(tensors):
        raw = _encode(dtype, tensors[name])
        header[name] = {"dtype": dtype, "shape": list(tensors[name].shape),
                        "data_offsets": [pos, pos + len(raw)]}
        chunks.append(raw)
        pos += len(raw)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * (-len(hjson) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for c in chunks:
            f.write(c)
