"""The logical content of a RankRequest in either encoding, for the tests of
the packed-encoding clients (test_packed_client.py, test_loadgen.py's ghz
payloads, e2e_packed.py).

Why a second reading of the packed form: the clients' converters
(tools/rank_client.py's to_packed, ikbo-loadgen's packed.c) write the
columns; this module reads them back on its own, following ranker.proto's
comments, so a layout mistake in a writer shows up as a difference instead
of cancelling out. logical() normalizes what the proto says is equivalent:
an absent sparse feature and an empty bag, empty history_actions and zeros,
no keys and empty keys, no candidate ids and zeros. Dense values are kept as
float32 bit patterns, so NaN and -0.0 compare exactly.
"""
import struct


def _f32_bits(values):
    values = list(values)
    return list(struct.unpack("<%dI" % len(values), struct.pack("<%df" % len(values), *values)))


def _col(data, fmt, count, what):
    size = struct.calcsize("<" + fmt)
    if len(data) != size * count:
        raise ValueError("%s: %d bytes, expected %d x %d" % (what, len(data), count, size))
    return list(struct.unpack("<%d%s" % (count, fmt), data))


def _classic_bags(entity, what):
    bags = {}
    for sf in entity.sparse:
        if sf.name in bags:
            raise ValueError("%s: feature %r twice" % (what, sf.name))
        bags[sf.name] = list(sf.ids)
    return {k: v for k, v in bags.items() if v}


def _packed_bags(sparse, count, what):
    """[{name: ids}] per entity from repeated PackedSparse."""
    bags = [{} for _ in range(count)]
    seen = set()
    for ps in sparse:
        if ps.name in seen:
            raise ValueError("%s: packed feature %r twice" % (what, ps.name))
        seen.add(ps.name)
        lengths = _col(ps.lengths, "I", count, "%s %r lengths" % (what, ps.name))
        ids = _col(ps.ids, "q", sum(lengths), "%s %r ids" % (what, ps.name))
        off = 0
        for i, n in enumerate(lengths):
            if n:
                bags[i][ps.name] = ids[off:off + n]
            off += n
    return bags


def _classic(req):
    users = []
    for i, u in enumerate(req.users):
        acts = list(u.history_actions) or [0] * len(u.history_ids)
        if len(acts) != len(u.history_ids):
            raise ValueError("users[%d]: %d actions for %d history ids" % (i, len(acts), len(u.history_ids)))
        users.append({"key": u.key, "dense": _f32_bits(u.dense), "sparse": _classic_bags(u, "users[%d]" % i),
                      "history_ids": list(u.history_ids), "history_actions": acts})
    cands = [{"id": c.id, "user": c.user, "dense": _f32_bits(c.dense),
              "sparse": _classic_bags(c, "candidates[%d]" % i)} for i, c in enumerate(req.candidates)]
    return users, cands


def _rows(data, count, what):
    """count equal rows of float32 bit patterns from a dense column."""
    if count == 0:
        if data:
            raise ValueError("%s dense: %d bytes for no rows" % (what, len(data)))
        return []
    if len(data) % (4 * count):
        raise ValueError("%s dense: %d bytes do not split into %d rows" % (what, len(data), count))
    width = len(data) // (4 * count)
    flat = _col(data, "I", count * width, what + " dense")
    return [flat[i * width:(i + 1) * width] for i in range(count)]


def _packed(req):
    pu, pc = req.packed_users, req.packed_candidates
    n = pu.count
    if len(pu.keys) not in (0, n):
        raise ValueError("packed_users: %d keys for %d users" % (len(pu.keys), n))
    keys = list(pu.keys) or [""] * n
    lengths = _col(pu.history_lengths, "I", n, "history_lengths") if pu.history_lengths else [0] * n
    hids = _col(pu.history_ids, "q", sum(lengths), "history_ids")
    acts = (_col(pu.history_actions, "i", sum(lengths), "history_actions") if pu.history_actions
            else [0] * sum(lengths))
    dense, bags = _rows(pu.dense, n, "packed_users"), _packed_bags(pu.sparse, n, "packed_users")
    users, off = [], 0
    for i in range(n):
        k = lengths[i]
        users.append({"key": keys[i], "dense": dense[i], "sparse": bags[i],
                      "history_ids": hids[off:off + k], "history_actions": acts[off:off + k]})
        off += k
    m = pc.count
    ids = _col(pc.ids, "q", m, "candidate ids") if pc.ids else [0] * m
    cu = _col(pc.users, "I", m, "candidate users")
    dense, bags = _rows(pc.dense, m, "packed_candidates"), _packed_bags(pc.sparse, m, "packed_candidates")
    cands = [{"id": ids[i], "user": cu[i], "dense": dense[i], "sparse": bags[i]} for i in range(m)]
    return users, cands


def is_packed(req):
    return req.HasField("packed_users") or req.HasField("packed_candidates")


def logical(req):
    """{model, model_version, top_k, request_id, users, candidates} of a
    RankRequest in either encoding (see the module comment). Raises
    ValueError for a request that breaks the encoding's rules."""
    if is_packed(req):
        if req.users or req.candidates:
            raise ValueError("both packed and classic users/candidates")
        if not (req.HasField("packed_users") and req.HasField("packed_candidates")):
            raise ValueError("only one of packed_users and packed_candidates")
        users, cands = _packed(req)
    else:
        users, cands = _classic(req)
    return {"model": req.model, "model_version": req.model_version, "top_k": req.top_k,
            "request_id": req.request_id, "users": users, "candidates": cands}


def first_difference(a, b, path="request"):
    """None when a == b, else the path of the first difference (for messages)."""
    if type(a) is not type(b):
        return "%s: %r vs %r" % (path, a, b)
    if isinstance(a, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                return "%s.%s: only on one side" % (path, k)
            d = first_difference(a[k], b[k], "%s.%s" % (path, k))
            if d:
                return d
        return None
    if isinstance(a, list):
        if len(a) != len(b):
            return "%s: %d vs %d items" % (path, len(a), len(b))
        for i, (x, y) in enumerate(zip(a, b)):
            d = first_difference(x, y, "%s[%d]" % (path, i))
            if d:
                return d
        return None
    return None if a == b else "%s: %r vs %r" % (path, a, b)
