#!/usr/bin/python3
"""Writes the broadcast-form twin of a hand-written IKBO model: every `lce`
becomes what a PyTorch module computes - `token_linear` (one weight over the
tokens) of `stack([E_user, E_cand])`, the user tokens broadcast to their
candidates - under "planning": "auto", with the weight [M, Ku + Kc] =
[w_user | w_cand]. The engine's planner must turn it back into the same lce
(same function, same speed); tests and the GPU bench compare the two.

    broadcast_form.py SRC_VERSION_DIR OUT_VERSION_DIR [--name NAME]

Other layers are copied as they are. The PyTorch importer
(tools/importer) is the way to bring a module in; this is the twin of a
model that was written by hand.
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_io  # noqa: E402


def convert(src, out, name=None, out_tokens=None):
    """out_tokens overrides every token_linear's out_tokens (a broken twin for error tests)."""
    with open(os.path.join(src, "model.json")) as f:
        m = json.load(f)
    w, meta = safetensors_io.load(os.path.join(src, "weights.safetensors"))
    w = {k: v.float() for k, v in w.items()}
    taken = {l["name"] for l in m["layers"]}
    layers = []
    for l in m["layers"]:
        if l["op"] != "lce":
            layers.append(l)
            continue
        stack = l["name"] + "_tokens"
        while stack in taken:
            stack += "_"
        taken.add(stack)
        layers.append({"name": stack, "op": "stack", "inputs": [l["user"], l["candidate"]]})
        layers.append({"name": l["name"], "op": "token_linear", "input": stack,
                       "out_tokens": out_tokens or l["out_tokens"]})
        w[l["name"] + ".weight"] = torch.cat([w.pop(l["name"] + ".w_user"),
                                              w.pop(l["name"] + ".w_cand")], 1)
    m["layers"], m["planning"] = layers, "auto"
    if name:
        m["name"] = name
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "model.json"), "w") as f:
        json.dump(m, f, indent=1)
    safetensors_io.save(os.path.join(out, "weights.safetensors"), w)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("src")
    ap.add_argument("out")
    ap.add_argument("--name")
    a = ap.parse_args(argv)
    convert(a.src, a.out, a.name)


if __name__ == "__main__":
    main()
