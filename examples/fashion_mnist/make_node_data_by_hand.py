#!/usr/bin/python3
"""Stand-in for `clusterize` (issue [B]) until it lands: cuts the Fashion-MNIST example model BY HAND
into 1 or 3 stages and writes a node_data/ folder (plan.json, job.json, nodes/node_<i>/{node.json,
stage.pt}) in the format core/NodeData.h reads. Delete it once clusterize produces the same folder.

    /usr/bin/python3 examples/fashion_mnist/make_node_data_by_hand.py \
        --model node_data/fashion_mnist/model.pt \
        --nodes examples/fashion_mnist/node_configs.json --out node_data/fashion_mnist

Stage cut (3 stages): [conv1 bn1 relu pool] -> [conv2 bn2 relu pool] -> [flatten fc].
Training options come from --job (a JSON file with the training_definition and data members) or
the defaults below; --set key=value overrides training_definition entries (value parsed as JSON).
"""
import argparse
import json
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))

DEFAULT_JOB = {
    "data": {
        "location": "/usr/share/datasets/fashion-mnist",
        "format": "idx",
        "normalize": {"mean": [0.2860], "std": [0.3530]},
    },
    "training_definition": {
        "batch_size": 128,
        "microbatches": 4,
        "epochs": 6,
        "seed": 0,
        "optimizer": {"name": "adamw", "lr": 0.003, "weight_decay": 0.01},
        "lr_scheduler": {"name": "cosine"},
        "loss_fn": "cross_entropy",
        "eval_every": 0,
        "threads": 1,
    },
}


class Stage0(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.conv1 = m.conv1
        self.bn1 = m.bn1

    def forward(self, x):
        return F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)


class Stage1(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.conv2 = m.conv2
        self.bn2 = m.bn2

    def forward(self, x):
        return F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)


class Stage2(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.fc = m.fc

    def forward(self, x):
        return self.fc(torch.flatten(x, 1))


class Whole(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, x):
        return self.m(x)


def boundary(name, shape, dtype="float32"):
    return {"name": name, "type": "tensor", "dtype": dtype, "shape": list(shape)}


def role_for(stage, stages):
    if stages == 1:
        return "root_leaf"
    return "root" if stage == 0 else ("leaf" if stage == stages - 1 else "stem")


def write_node_data(out, job_id, stages, boundaries, addresses, job, names=None, cluster=0):
    """Writes one cluster: stages[i] (a scripted module) with boundaries[i] -> boundaries[i+1]."""
    os.makedirs(os.path.join(out, "nodes"), exist_ok=True)
    n = len(stages)
    names = names or [f"node_{i}" for i in range(n)]
    for i, stage in enumerate(stages):
        folder = os.path.join(out, "nodes", names[i])
        os.makedirs(folder, exist_ok=True)
        stage.save(os.path.join(folder, "stage.pt"))
        peer = lambda j: {"name": names[j], "address": addresses[j]}
        spec = {
            "format": 1, "name": names[i], "job_id": job_id, "address": addresses[i],
            "cluster": cluster, "stage": i, "num_stages": n, "role": role_for(i, n),
            "upstream": peer(i - 1) if i > 0 else None,
            "downstream": peer(i + 1) if i < n - 1 else None,
            "inputs": boundaries[i], "outputs": boundaries[i + 1],
            "parameters": [k for k, _ in stage.named_parameters()],
            "buffers": [k for k, _ in stage.named_buffers()],
            "rings": [], "stage_file": "stage.pt",
            "estimates": {"memory_bytes": 0, "seconds_per_microbatch": 0},
            "extra": {"num_clusters": 1, "written_by": "make_node_data_by_hand.py"},
        }
        with open(os.path.join(folder, "node.json"), "w") as f:
            json.dump(spec, f, indent=2)
    document = {"format": 1, "job_id": job_id, "driver": "cairn", "model": job.get("model", ""),
                "data": job["data"], "training_definition": job["training_definition"]}
    with open(os.path.join(out, "job.json"), "w") as f:
        json.dump(document, f, indent=2)
    plan = {"format": 1, "job_id": job_id, "num_clusters": 1, "written_by": "make_node_data_by_hand.py",
            "clusters": [{"id": cluster, "nodes": names}],
            "nodes": [{"name": names[i], "address": addresses[i], "stage": i} for i in range(n)]}
    with open(os.path.join(out, "plan.json"), "w") as f:
        json.dump(plan, f, indent=2)


def parse_overrides(pairs):
    out = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="TorchScript model from make_model.py")
    parser.add_argument("--nodes", default=os.path.join(HERE, "node_configs.json"),
                        help="node_configs.json (Ravnest format); its first 1 or 3 nodes are used")
    parser.add_argument("--out", required=True, help="node_data folder to write")
    parser.add_argument("--stages", type=int, choices=[1, 3], default=3)
    parser.add_argument("--job-id", default="fashion_mnist")
    parser.add_argument("--job", help="JSON file with 'data' and 'training_definition' to use instead of the defaults")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=JSON",
                        help="override a training_definition entry, e.g. --set epochs=1")
    parser.add_argument("--data-set", action="append", default=[], metavar="KEY=JSON",
                        help="override a data entry, e.g. --data-set train_samples=6000")
    args = parser.parse_args()

    job = json.load(open(args.job)) if args.job else json.loads(json.dumps(DEFAULT_JOB))
    job["model"] = os.path.abspath(args.model)
    job["training_definition"].update(parse_overrides(args.set))
    job["data"].update(parse_overrides(args.data_set))

    configs = json.load(open(args.nodes))
    keys = sorted(configs, key=lambda k: int(k) if k.isdigit() else k)
    if len(keys) < args.stages:
        sys.exit(f"make_node_data_by_hand: {args.nodes} lists {len(keys)} nodes, {args.stages} needed")
    addresses = [configs[k]["IP"] for k in keys[:args.stages]]
    names = [f"node_{k}" for k in keys[:args.stages]]

    model = torch.jit.load(args.model)
    if args.stages == 3:
        stages = [torch.jit.script(S(model)) for S in (Stage0, Stage1, Stage2)]
        c1 = model.conv1.weight.shape[0]
        c2 = model.conv2.weight.shape[0]
        boundaries = [[boundary("images", [1, 1, 28, 28])], [boundary("features1", [1, c1, 14, 14])],
                      [boundary("features2", [1, c2, 7, 7])], [boundary("logits", [1, 10])]]
    else:
        stages = [model]
        boundaries = [[boundary("images", [1, 1, 28, 28])], [boundary("logits", [1, 10])]]
    write_node_data(args.out, args.job_id, stages, boundaries, addresses, job, names)
    print(f"make_node_data_by_hand: wrote {args.out} ({args.stages} stage(s): {', '.join(names)})")


if __name__ == "__main__":
    main()
