#!/usr/bin/python3
"""The model zoo of clusterize_tests' Zoo suite (issue [R]: every cut clusterize allows trains),
scripted by Debian's torch: make_zoo.py OUT_DIR.

For each model, OUT_DIR/<name>/ holds model.pt (TorchScript, train mode), data.safetensors (the
samples: the model's inputs by name and "targets", first dimension = samples) and job.json (3
SGD-with-momentum steps of 8 samples in 2 micro-batches, cross entropy, the samples' ids recorded);
OUT_DIR/zoo.json lists them with the shapes and dtypes of one micro-batch (clusterize's example).

The zoo: the Fashion-MNIST CNN and a ResNet block (BatchNorm, a skip; real Fashion-MNIST images),
a GPT with learned positions (the mask cut from a buffer, an int T reused at the end), the same
GPT with tied embeddings (head.weight = tok.weight), a GPT with rotary embeddings and an explicit
bool causal mask computed in forward, LatePosGpt (an int64 position tensor, a bool mask, a
transposed tensor and a position embedding cross its cuts), a model whose first and last units
hold no parameters, and a model with two inputs. Dropout is off (p = 0): the reference could not
draw a provider's masks.
"""
import gzip
import json
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "trainer"))
from dataset_refs import write_safetensors  # noqa: E402
from make_models import Block, Gpt, LatePosGpt, ResNet, TwoInput, cnn  # noqa: E402

FASHION = "/usr/share/datasets/fashion-mnist"
SAMPLES = 64
VOCAB, BLOCK = 50, 10
MICROBATCH = 4  # batch 8 in 2 micro-batches


def rope(x, cos, sin):
    """Rotary position embedding of q or k [B, H, T, hd] by the tables cos, sin [T, hd / 2]."""
    x1 = x[..., 0::2]
    x2 = x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)


class RotaryBlock(Block):
    # make_models.py's Block with q and k rotated by the rotary tables and a bool causal mask.
    def forward(self, x, cos, sin, causal):
        b, t, d = x.size(0), x.size(1), x.size(2)
        hd = d // self.heads
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q = rope(q.view(b, t, self.heads, hd).transpose(1, 2), cos, sin)
        k = rope(k.view(b, t, self.heads, hd).transpose(1, 2), cos, sin)
        v = v.view(b, t, self.heads, hd).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / (hd ** 0.5))
        att = F.softmax(att.masked_fill(causal.logical_not(), float("-inf")), dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).contiguous().view(b, t, d))
        return x + self.mlp(self.ln2(x))


class RotaryGpt(nn.Module):
    # Rotary tables (float [T, hd/2], no batch dimension, no gradient) and an explicit causal mask
    # (bool [T, T]) computed in forward from T: each crosses every cut between it and its users.
    def __init__(self, vocab=VOCAB, d=16, heads=2, layers=2):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList([RotaryBlock(d, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)
        self.register_buffer("inv_freq", 1.0 / (100.0 ** (torch.arange(0, d // heads, 2).float() / (d // heads))))

    def forward(self, idx):
        t = idx.size(1)
        freqs = torch.arange(t).float().unsqueeze(1) * self.inv_freq.unsqueeze(0)
        cos = torch.cos(freqs)
        sin = torch.sin(freqs)
        causal = torch.ones(t, t).tril() > 0
        x = self.tok(idx)
        for blk in self.blocks:
            x = blk(x, cos, sin, causal)
        return self.head(self.ln_f(x))


class Paramless(nn.Module):
    # The first units (a scale and a shift) and the last (a division) hold no parameters: a cut
    # right after the first or before the last gives a stage with nothing to train.
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(28 * 28, 24)
        self.fc2 = nn.Linear(24, 10)

    def forward(self, x):
        h = x * 2.0
        h = h - 1.0
        h = torch.tanh(h)
        h = torch.flatten(h, 1)
        h = torch.relu(self.fc1(h))
        h = self.fc2(h)
        return h / 2.0


def fashion_images(count):
    with gzip.open(os.path.join(FASHION, "train-images-idx3-ubyte.gz")) as f:
        images = np.frombuffer(f.read(), dtype=np.uint8, offset=16)[:count * 784]
    with gzip.open(os.path.join(FASHION, "train-labels-idx1-ubyte.gz")) as f:
        labels = np.frombuffer(f.read(), dtype=np.uint8, offset=8)[:count]
    x = (images.reshape(count, 1, 28, 28).astype(np.float32) / 255.0 - 0.2860) / 0.3530
    return {"inputs": x, "targets": labels.astype(np.int64)}


def tokens(count, rng):
    blocks = rng.integers(0, VOCAB, (count, BLOCK + 1), dtype=np.int64)
    return {"inputs": blocks[:, :-1].copy(), "targets": blocks[:, 1:].copy()}


def no_dropout(model):
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0
    return model


def main():
    out = os.path.abspath(sys.argv[1])
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    rng = np.random.default_rng(5)
    images = fashion_images(SAMPLES)
    image = ([f"{MICROBATCH},1,28,28"], ["float32"])
    token = ([f"{MICROBATCH},{BLOCK}"], ["int64"])
    two = rng.standard_normal((SAMPLES, 12)).astype(np.float32), rng.standard_normal((SAMPLES, 6)).astype(np.float32)
    zoo = [
        ("cnn", no_dropout(cnn()), images, image),
        ("resnet", ResNet(), images, image),
        ("gpt", Gpt(vocab=VOCAB, block=16, d=16, heads=2, layers=2), tokens(SAMPLES, rng), token),
        ("gpt_tied", Gpt(vocab=VOCAB, block=16, d=16, heads=2, layers=2, tied=True), tokens(SAMPLES, rng), token),
        ("gpt_rotary", RotaryGpt(), tokens(SAMPLES, rng), token),
        ("gpt_late_pos", LatePosGpt(vocab=VOCAB, block=16, d=16, heads=2), tokens(SAMPLES, rng), token),
        ("paramless", Paramless(), images, image),
        ("two_input", TwoInput(), {"a": two[0], "b": two[1], "targets": rng.integers(0, 8, SAMPLES)},
         ([f"{MICROBATCH},12", f"{MICROBATCH},6"], ["float32", "float32"])),
    ]
    manifest = []
    for name, model, data, (shapes, dtypes) in zoo:
        folder = os.path.join(out, name)
        os.makedirs(folder, exist_ok=True)
        model.train()
        model_path = os.path.join(folder, "model.pt")
        torch.jit.save(torch.jit.script(model), model_path)
        data_path = os.path.join(folder, "data.safetensors")
        write_safetensors(data_path, data)
        inputs = [k for k in data if k != "targets"]
        job = {"format": 2, "job_id": "zoo-" + name.replace("_", "-"), "driver": "cairn", "model": model_path,
               "data": {"location": data_path, "format": "safetensors", "inputs": inputs, "targets": "targets"},
               "training_definition": {
                   "batch_size": 2 * MICROBATCH, "microbatches": 2, "epochs": 0, "max_steps": 3,
                   "seed": 3, "loss_fn": "cross_entropy", "lr_scheduler": "constant", "eval_every": 0,
                   "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9},
                   "record_sample_ids": True, "timeouts": {"startup_s": 30, "peer_s": 60}}}
        with open(os.path.join(folder, "job.json"), "w") as f:
            json.dump(job, f, indent=1)
        manifest.append({"name": name, "folder": folder, "inputs": inputs, "input_shapes": shapes,
                         "input_dtypes": dtypes})
    with open(os.path.join(out, "zoo.json"), "w") as f:
        json.dump(manifest, f, indent=1)


if __name__ == "__main__":
    main()
