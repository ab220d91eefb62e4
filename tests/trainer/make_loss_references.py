#!/usr/bin/python3
"""Reference values for the loss and optimizer-group tests (tests/trainer/LossAndGroupsTest.cpp),
computed by PyTorch itself (torch.nn.functional, torch.optim), independently of cairn.

    /usr/bin/python3 tests/trainer/make_loss_references.py OUTDIR   (make_test_models.py calls it)

OUTDIR/losses/builtin.safetensors   logits/targets and F.cross_entropy(label_smoothing=...) and
                                    F.binary_cross_entropy_with_logits(pos_weight=...) values and
                                    gradients (float64)
OUTDIR/losses/loss_ce.pt            a TorchScript loss: cross-entropy written out by hand, returning
                                    (sum of terms, count), with count(target) exported
OUTDIR/losses/loss_ce_ls.pt         the same with label smoothing 0.1
OUTDIR/losses/loss_bce.pt           BCE-with-logits (sum, count) without a count method
OUTDIR/groups/model.pt              a model with biases, BatchNorm, LayerNorm, an RMSNorm, 0-D and
                                    1-D parameters and a frozen one
OUTDIR/groups/cases.json            optimizer settings with param_groups (what job.json would hold)
OUTDIR/groups/reference.safetensors the gradients fed at every step, the lr of every step, and the
                                    parameters torch.optim leaves after the steps, per case
"""
import fnmatch
import json
import os
import sys
from typing import Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dataset_refs  # noqa: E402  (the one safetensors writer of these fixtures)

IGNORE = -100


def write_safetensors(path, tensors):
    """Torch tensors to a safetensors file, written by dataset_refs' one writer."""
    dataset_refs.write_safetensors(path, {name: t.detach().contiguous().numpy()
                                          for name, t in tensors.items()})


# ---- losses ---------------------------------------------------------------------------------
class CrossEntropySum(nn.Module):
    """Cross-entropy (optionally label-smoothed) written out term by term, not F.cross_entropy."""

    def __init__(self, smoothing: float = 0.0, ignore_index: int = IGNORE):
        super().__init__()
        self.smoothing = smoothing
        self.ignore_index = ignore_index

    def forward(self, output: torch.Tensor, target: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        logp = torch.log_softmax(output.reshape(-1, output.size(-1)), dim=1)
        t = target.reshape(-1)
        keep = t != self.ignore_index
        safe = torch.where(keep, t, torch.zeros_like(t))
        nll = -logp.gather(1, safe.unsqueeze(1)).squeeze(1)
        terms = (1.0 - self.smoothing) * nll - self.smoothing * logp.mean(1)
        return torch.where(keep, terms, torch.zeros_like(terms)).sum(), keep.sum()

    @torch.jit.export
    def count(self, target: torch.Tensor) -> torch.Tensor:
        return (target != self.ignore_index).sum()


class BceSum(nn.Module):
    """BCE with logits, one term per element: no count method (cairn's default, target.numel())."""

    def forward(self, output: torch.Tensor, target: torch.Tensor) -> Tuple[torch.Tensor, int]:
        return F.binary_cross_entropy_with_logits(output, target, reduction="sum"), target.numel()


def loss_references(out):
    os.makedirs(out, exist_ok=True)
    g = torch.Generator().manual_seed(20240611)
    t = {}

    def with_grad(name, logits, fn):
        x = logits.clone().requires_grad_(True)
        loss = fn(x)
        loss.backward()
        t[name + "_loss"] = loss.detach().reshape(())
        t[name + "_grad"] = x.grad

    # (N, C) logits with ignored targets.
    logits = torch.randn(13, 7, generator=g, dtype=torch.float64) * 2
    targets = torch.randint(0, 7, (13,), generator=g)
    targets[[2, 9, 10]] = IGNORE
    t["ce_logits"], t["ce_targets"] = logits, targets
    with_grad("ce", logits, lambda x: F.cross_entropy(x, targets, ignore_index=IGNORE))
    with_grad("ce_ls", logits,
              lambda x: F.cross_entropy(x, targets, ignore_index=IGNORE, label_smoothing=0.1))
    # (N, T, C) sequence logits (torch wants the classes in dim 1).
    seq = torch.randn(4, 5, 6, generator=g, dtype=torch.float64)
    seq_targets = torch.randint(0, 6, (4, 5), generator=g)
    seq_targets[0, 1] = IGNORE
    seq_targets[3, 4] = IGNORE
    t["seq_logits"], t["seq_targets"] = seq, seq_targets
    with_grad("seq_ls", seq, lambda x: F.cross_entropy(x.transpose(1, 2), seq_targets,
                                                        ignore_index=IGNORE, label_smoothing=0.25))
    # Multi-label BCE with soft targets, with and without pos_weight.
    bce = torch.randn(11, 4, generator=g, dtype=torch.float64) * 3
    bce_targets = torch.rand(11, 4, generator=g, dtype=torch.float64)
    bce_targets[:5] = (bce_targets[:5] > 0.5).double()
    t["bce_logits"], t["bce_targets"] = bce, bce_targets
    with_grad("bce", bce, lambda x: F.binary_cross_entropy_with_logits(x, bce_targets))
    pos_weight = torch.tensor([0.5, 1.0, 2.0, 3.0], dtype=torch.float64)
    with_grad("bce_pw", bce,
              lambda x: F.binary_cross_entropy_with_logits(x, bce_targets, pos_weight=pos_weight))
    write_safetensors(f"{out}/builtin.safetensors", t)

    torch.jit.script(CrossEntropySum()).save(f"{out}/loss_ce.pt")
    torch.jit.script(CrossEntropySum(0.1)).save(f"{out}/loss_ce_ls.pt")
    torch.jit.script(BceSum()).save(f"{out}/loss_bce.pt")


# ---- optimizer parameter groups ---------------------------------------------------------------
class RMSNorm(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class GroupsNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3)
        self.bn = nn.BatchNorm2d(3)
        self.fc1 = nn.Linear(12, 8)
        self.ln = nn.LayerNorm(8)
        self.fc2 = nn.Linear(8, 8, bias=False)
        self.norm = RMSNorm(8)
        self.head = nn.Linear(8, 4)
        self.gain = nn.Parameter(torch.randn(8))
        self.temperature = nn.Parameter(torch.tensor(1.5))
        self.frozen = nn.Linear(4, 4)
        self.frozen.requires_grad_(False)

    def forward(self, x):
        h = self.bn(self.conv(x)).flatten(1)
        h = self.norm(self.fc2(self.ln(self.fc1(h)))) * self.gain
        return self.frozen(self.head(h)) / self.temperature


NORMS = (nn.BatchNorm2d, nn.LayerNorm, RMSNorm)

CASES = {
    "sgd": {"name": "sgd", "lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 0.05,
            "param_groups": [{"biases": True, "norm_layers": True, "max_dim": 1, "weight_decay": 0},
                             {"names": ["head.*"], "lr_scale": 0.5}]},
    "adam": {"name": "adam", "lr": 0.01, "weight_decay": 0.1,
             "param_groups": [{"names": ["fc1.*", "conv.weight"], "lr_scale": 2.0, "weight_decay": 0.02},
                              {"biases": True, "weight_decay": 0}]},
    "adamw": {"name": "adamw", "lr": 0.01, "weight_decay": 0.1,
              "param_groups": [{"biases": True, "norm_layers": True, "max_dim": 1, "weight_decay": 0},
                               {"names": ["head.weight"], "lr_scale": 0.1}]},
}
STEPS = 8


def group_of(rules, name, owner, p):
    """This script's own reading of the rules (first rule that selects the parameter, else -1)."""
    for i, r in enumerate(rules):
        if ((r.get("biases") and name.split(".")[-1] == "bias") or
                (r.get("norm_layers") and isinstance(owner, NORMS)) or
                ("max_dim" in r and p.dim() <= r["max_dim"]) or
                any(fnmatch.fnmatchcase(name, pattern) for pattern in r.get("names", []))):
            return i
    return -1


def group_references(out):
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(77)
    model = GroupsNet()
    torch.jit.script(model).save(f"{out}/model.pt")
    with open(f"{out}/cases.json", "w") as f:
        json.dump(CASES, f, indent=1)
    owners = {}
    for mname, m in model.named_modules():
        for pname, _ in m.named_parameters(recurse=False):
            owners[f"{mname}.{pname}" if mname else pname] = m
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    g = torch.Generator().manual_seed(5)
    grads = [{n: torch.randn(p.shape, generator=g) for n, p in trainable} for _ in range(STEPS)]
    # A parameter without a gradient at one step is skipped by torch.optim (and must be by cairn).
    del grads[3]["gain"]
    lrs = [0.9 ** s for s in range(STEPS)]  # the schedule's factor of the base lr at each step
    ref = {"lr_factors": torch.tensor(lrs, dtype=torch.float64)}
    for s, step_grads in enumerate(grads):
        for n, gr in step_grads.items():
            ref[f"grad.{s}.{n}"] = gr
    for case, o in CASES.items():
        params = {n: p.detach().clone().requires_grad_(True) for n, p in trainable}
        rules = o["param_groups"]
        members = [[] for _ in range(len(rules) + 1)]
        for n, p in trainable:
            members[group_of(rules, n, owners[n], p) + 1].append(n)
        groups = []
        for i, names in enumerate(members):
            if not names:
                continue
            group = {"params": [params[n] for n in names], "scale": 1.0}
            if i > 0:
                r = rules[i - 1]
                group["scale"] = r.get("lr_scale", 1.0)
                if "weight_decay" in r:
                    group["weight_decay"] = r["weight_decay"]
            groups.append(group)
        if o["name"] == "sgd":
            opt = torch.optim.SGD(groups, lr=o["lr"], momentum=o["momentum"], nesterov=o["nesterov"],
                                  weight_decay=o["weight_decay"])
        elif o["name"] == "adam":
            opt = torch.optim.Adam(groups, lr=o["lr"], weight_decay=o["weight_decay"])
        else:
            opt = torch.optim.AdamW(groups, lr=o["lr"], weight_decay=o["weight_decay"])
        for s, step_grads in enumerate(grads):
            for n, p in params.items():
                p.grad = step_grads[n].clone() if n in step_grads else None
            for group in opt.param_groups:
                group["lr"] = o["lr"] * lrs[s] * group["scale"]
            opt.step()
        for n, p in params.items():
            ref[f"final.{case}.{n}"] = p.detach()
        ref[f"groups.{case}"] = torch.tensor([len(m) for m in members], dtype=torch.int64)
    write_safetensors(f"{out}/reference.safetensors", ref)


def main(out):
    loss_references(f"{out}/losses")
    group_references(f"{out}/groups")
    print(f"make_loss_references: wrote {out}/losses and {out}/groups")


if __name__ == "__main__":
    main(sys.argv[1])
