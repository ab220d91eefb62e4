#!/usr/bin/python3
"""Test fixtures for trainer_tests: a small CNN and a small GPT, each saved whole (reference) and
hand-cut into 3 TorchScript stages with node_data folders (the cut is written out here, independently
of clusterize, so the trainer is tested against a reference that does not depend on it).

    /usr/bin/python3 tests/trainer/make_test_models.py OUTDIR

OUTDIR/cnn/{full.pt,data.safetensors,node_data/...}  OUTDIR/gpt/{full.pt,text.txt,node_data/...}
OUTDIR/cnn/whole/node_data/...: the same CNN as one stage, Root and Leaf at once.
OUTDIR/cnn_bn_dropout/node_data/...: the CNN with BatchNorm in stages 0 and 1 and dropout in the
Leaf (state beyond parameters for the checkpoint tests: running statistics, the dropout RNG).
The GPT's stages pass the sequence length as an `int` boundary value next to the hidden states, so
the non-tensor path of the executor and the wire is exercised.
"""
import json
import os
import sys
from typing import Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../examples/fashion_mnist"))
from make_node_data_by_hand import boundary, write_node_data  # noqa: E402
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_loss_references  # noqa: E402
import dataset_refs  # noqa: E402


def write_safetensors(path, tensors):
    """Torch tensors to a safetensors file, written by dataset_refs' one writer."""
    dataset_refs.write_safetensors(path, {name: t.detach().contiguous().numpy()
                                          for name, t in tensors.items()})


# ---- CNN ------------------------------------------------------------------------------------
class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, padding=1)
        self.conv2 = nn.Conv2d(4, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 2 * 2, 5)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(torch.flatten(x, 1))


class CnnStage0(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.conv1 = m.conv1

    def forward(self, x):
        return F.max_pool2d(F.relu(self.conv1(x)), 2)


class CnnStage1(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.conv2 = m.conv2

    def forward(self, x):
        return F.max_pool2d(F.relu(self.conv2(x)), 2)


class CnnStage2(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.fc = m.fc

    def forward(self, x):
        return self.fc(torch.flatten(x, 1))


class BnDropStage0(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(4)

    def forward(self, x):
        return F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)


class BnDropStage1(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv2 = nn.Conv2d(4, 8, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(8)

    def forward(self, x):
        return F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)


class BnDropStage2(nn.Module):
    # Dropout only in the Leaf: the in-memory tests run all stages as threads of one process, which
    # share libtorch's one CPU generator (a provider is one process per node).
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.3)
        self.fc = nn.Linear(8 * 2 * 2, 5)

    def forward(self, x):
        return self.fc(self.drop(torch.flatten(x, 1)))


# ---- GPT ------------------------------------------------------------------------------------
class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        # No bias on q/k/v: a key bias has a mathematically zero gradient (softmax is shift-invariant),
        # which float rounding turns into ~1e-10 noise that Adam's normalisation blows up to ~lr —
        # in ANY two implementations that sum in a different order, split or not.
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x, n: int):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        hd = d // self.heads
        q = q.view(b, t, self.heads, hd).transpose(1, 2)
        k = k.view(b, t, self.heads, hd).transpose(1, 2)
        v = v.view(b, t, self.heads, hd).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / (hd ** 0.5)
        mask = torch.ones(n, n).tril() == 0
        att = F.softmax(att.masked_fill(mask, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class SmallGPT(nn.Module):
    def __init__(self, vocab=256, block=16, d=32, heads=2, layers=3):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, d)
        self.pos_emb = nn.Embedding(block, d)
        self.blocks = nn.ModuleDict({str(i): Block(d, heads) for i in range(layers)})
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, idx):
        n = idx.size(1)
        x = self.tok_emb(idx) + self.pos_emb(torch.arange(n))
        for b in self.blocks.values():
            x = b(x, n)
        return self.head(self.ln_f(x))


class GptStage0(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.tok_emb = m.tok_emb
        self.pos_emb = m.pos_emb
        self.blocks = nn.ModuleDict({"0": m.blocks["0"]})

    def forward(self, idx) -> Tuple[torch.Tensor, int]:
        n = idx.size(1)
        x = self.tok_emb(idx) + self.pos_emb(torch.arange(n))
        for b in self.blocks.values():
            x = b(x, n)
        return x, n


class GptStage1(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.blocks = nn.ModuleDict({"1": m.blocks["1"]})

    def forward(self, x, n: int) -> Tuple[torch.Tensor, int]:
        for b in self.blocks.values():
            x = b(x, n)
        return x, n


class GptStage2(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.blocks = nn.ModuleDict({"2": m.blocks["2"]})
        self.ln_f = m.ln_f
        self.head = m.head

    def forward(self, x, n: int):
        for b in self.blocks.values():
            x = b(x, n)
        return self.head(self.ln_f(x))


def addresses(base):
    return [f"127.0.0.1:{base + i}" for i in range(3)]


def main():
    out = sys.argv[1]
    torch.manual_seed(1234)
    # CNN on random 8x8 images, 5 classes.
    os.makedirs(f"{out}/cnn", exist_ok=True)
    cnn = SmallCNN()
    torch.jit.script(cnn).save(f"{out}/cnn/full.pt")
    write_safetensors(f"{out}/cnn/data.safetensors",
                      {"inputs": torch.randn(512, 1, 8, 8), "targets": torch.randint(0, 5, (512,))})
    job = {"data": {"location": f"{out}/cnn/data.safetensors", "format": "safetensors"},
           "training_definition": {"batch_size": 32, "microbatches": 4, "max_steps": 10, "epochs": 0,
                                   "seed": 7, "loss_fn": "cross_entropy"}}
    stages = [torch.jit.script(S(cnn)) for S in (CnnStage0, CnnStage1, CnnStage2)]
    write_node_data(f"{out}/cnn/node_data", "cnn_test", stages,
                    [[boundary("x", [1, 1, 8, 8])], [boundary("a", [1, 4, 4, 4])],
                     [boundary("b", [1, 8, 2, 2])], [boundary("logits", [1, 5])]], addresses(5800), job)

    # The whole CNN as one stage (Root and Leaf at once), same job: what a GPU volunteer runs
    # when the plan gives it a whole model.
    write_node_data(f"{out}/cnn/whole/node_data", "cnn_whole_test", [torch.jit.script(cnn)],
                    [[boundary("x", [1, 1, 8, 8])], [boundary("logits", [1, 5])]], addresses(5830)[:1],
                    job)

    # The same data through a CNN with BatchNorm and dropout (checkpoint tests).
    job = {"data": {"location": f"{out}/cnn/data.safetensors", "format": "safetensors"},
           "training_definition": {"batch_size": 32, "microbatches": 4, "max_steps": 12, "epochs": 0,
                                   "seed": 5, "loss_fn": "cross_entropy"}}
    stages = [torch.jit.script(S()) for S in (BnDropStage0, BnDropStage1, BnDropStage2)]
    write_node_data(f"{out}/cnn_bn_dropout/node_data", "cnn_bn_dropout_test", stages,
                    [[boundary("x", [1, 1, 8, 8])], [boundary("a", [1, 4, 4, 4])],
                     [boundary("b", [1, 8, 2, 2])], [boundary("logits", [1, 5])]], addresses(5820), job)

    # GPT on a byte stream, next-token targets.
    os.makedirs(f"{out}/gpt", exist_ok=True)
    gpt = SmallGPT()
    torch.jit.script(gpt).save(f"{out}/gpt/full.pt")
    text = ("the quick brown fox jumps over the lazy dog. " * 40 +
            "pack my box with five dozen liquor jugs! " * 40).encode()
    with open(f"{out}/gpt/text.txt", "wb") as f:
        f.write(text)
    job = {"data": {"location": f"{out}/gpt/text.txt", "format": "tokens", "block_length": 16},
           "training_definition": {"batch_size": 16, "microbatches": 4, "max_steps": 10, "epochs": 0,
                                   "seed": 3, "loss_fn": "cross_entropy"}}
    stages = [torch.jit.script(S(gpt)) for S in (GptStage0, GptStage1, GptStage2)]
    n = {"name": "n", "type": "int", "dtype": "int64", "shape": []}
    write_node_data(f"{out}/gpt/node_data", "gpt_test", stages,
                    [[boundary("idx", [1, 16], "int64")], [boundary("h0", [1, 16, 32]), n],
                     [boundary("h1", [1, 16, 32]), n], [boundary("logits", [1, 16, 256])]],
                    addresses(5810), job)
    print(f"make_test_models: wrote {out}/cnn and {out}/gpt")
    # The loss and optimizer-group references (LossTest.cpp, ParamGroupsTest.cpp), same fixture.
    make_loss_references.main(out)


if __name__ == "__main__":
    main()
