#!/usr/bin/python3
"""Loads a node_data folder's stages with Debian's Python torch and checks them against the model.

check_stages.py NODE_DATA MODEL.pt INPUT...   where INPUT is float:4,1,28,28 or ids<N>:2,10
For every cluster in plan.json, runs the chain of stage.pt files (torch.jit.load) in order and
compares the result with the whole model; checks that each cluster holds every parameter exactly
once under its original name. Exits 1 with a message on the first mismatch.
"""
import json
import os
import sys

import torch


def make_input(spec):
    kind, shape = spec.split(":")
    shape = [int(s) for s in shape.split(",")]
    if kind == "float":
        return torch.randn(shape)
    if kind.startswith("ids"):
        return torch.randint(0, int(kind[3:]), shape)
    raise SystemExit("bad input spec " + spec)


def main():
    node_data, model_path, specs = sys.argv[1], sys.argv[2], sys.argv[3:]
    torch.manual_seed(0)
    inputs = [make_input(s) for s in specs]
    model = torch.jit.load(model_path)
    model.eval()
    with torch.no_grad():
        expected = model(*inputs)
    all_params = set(name for name, _ in model.named_parameters())
    plan = json.load(open(os.path.join(node_data, "plan.json")))
    for cluster in plan["clusters"]:
        values = list(inputs)
        held = []
        for stage in cluster["stages"]:
            folder = os.path.join(node_data, "nodes", stage["node"])
            node = json.load(open(os.path.join(folder, "node.json")))
            module = torch.jit.load(os.path.join(folder, node["stage_file"]))
            module.eval()
            held += [name for name, _ in module.named_parameters()]
            if len(values) != len(node["inputs"]):
                raise SystemExit("%s takes %d inputs, got %d" % (stage["node"], len(node["inputs"]), len(values)))
            with torch.no_grad():
                out = module(*values)
            values = list(out) if len(node["outputs"]) > 1 else [out]
        diff = (values[0] - expected).abs().max().item()
        if diff > 1e-5:
            raise SystemExit("cluster %d: output differs by %g" % (cluster["index"], diff))
        if sorted(held) != sorted(all_params):
            raise SystemExit("cluster %d holds %s, the model has %s" % (cluster["index"], sorted(held), sorted(all_params)))
        print("cluster %d: %s ok (max abs diff %.2g)" % (cluster["index"], " -> ".join(cluster["chain"]), diff))


if __name__ == "__main__":
    main()
