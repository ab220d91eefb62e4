#!/usr/bin/python3
"""Fixture of CheckpointCarryTest.cpp: one small CNN with BatchNorm (4 units) cut three ways by hand,
each a node_data folder of the same job, so a run checkpointed at one cut can be carried into another
(trainer/CheckpointCarry.h).

    /usr/bin/python3 tests/trainer/make_recut_models.py OUTDIR

OUTDIR/recut/data.safetensors and OUTDIR/recut/{a,b,c}/node_data:
  a: [l0 | l1 | l2 l3]   b: [l0 l1 | l2 | l3]   c: [l0 l1 l2 | l3]
Every stage module holds all four unit attributes (units it does not run are nn.Identity, without
parameters), so a parameter has the same dotted name ("l1.bn.running_mean") whatever the cut, as
clusterize's stages keep the original model's names. The units' initial weights are the same in the
three cuts.
"""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "../../examples/fashion_mnist"))
from make_node_data_by_hand import boundary, write_node_data  # noqa: E402
sys.path.insert(0, HERE)
import dataset_refs  # noqa: E402


class ConvUnit(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x):
        return F.max_pool2d(F.relu(self.bn(self.conv(x))), 2)


class HiddenUnit(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8 * 2 * 2, 16)

    def forward(self, x):
        return F.relu(self.fc(torch.flatten(x, 1)))


class Stage(nn.Module):
    """Runs l0..l3 in order; the units of other stages are nn.Identity."""

    def __init__(self, units, held):
        super().__init__()
        for i in range(4):
            setattr(self, f"l{i}", units[i] if i in held else nn.Identity())

    def forward(self, x):
        return self.l3(self.l2(self.l1(self.l0(x))))


def main():
    out = os.path.join(sys.argv[1], "recut")
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(4321)
    units = [ConvUnit(1, 4), ConvUnit(4, 8), HiddenUnit(), nn.Linear(16, 5)]
    data = f"{out}/data.safetensors"
    dataset_refs.write_safetensors(data, {"inputs": torch.randn(512, 1, 8, 8).numpy(),
                                          "targets": torch.randint(0, 5, (512,)).numpy()})
    job = {"data": {"location": data, "format": "safetensors"},
           "training_definition": {"batch_size": 32, "microbatches": 4, "max_steps": 20, "epochs": 0,
                                   "seed": 11, "loss_fn": "cross_entropy",
                                   "optimizer": {"name": "adamw", "lr": 0.01}}}
    shapes = [boundary("x", [1, 1, 8, 8]), boundary("a", [1, 4, 4, 4]), boundary("b", [1, 8, 2, 2]),
              boundary("h", [1, 16]), boundary("logits", [1, 5])]
    cuts = {"a": [[0], [1], [2, 3]], "b": [[0, 1], [2], [3]], "c": [[0, 1, 2], [3]]}
    for name, groups in cuts.items():
        stages = [torch.jit.script(Stage(units, set(g))) for g in groups]
        bounds = [shapes[g[0]] for g in groups] + [shapes[4]]
        write_node_data(f"{out}/{name}/node_data", "recut_test", stages, [[b] for b in bounds],
                        [f"127.0.0.1:{5840 + i}" for i in range(len(groups))], job)
    print(f"make_recut_models: wrote {out}/{{a,b,c}}/node_data")


if __name__ == "__main__":
    main()
