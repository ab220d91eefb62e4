#!/usr/bin/python3
"""Scripts the test models for clusterize_tests with Debian's torch: make_models.py OUT_DIR.

Writes cnn.pt, wrapped_cnn.pt, resnet.pt, gpt.pt, gpt_tied.pt, two_input.pt, gpt_late_pos.pt. Each model is in
eval mode (BatchNorm uses running stats, Dropout is the identity) so that outputs are deterministic.
"""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


def cnn():
    # The Fashion-MNIST CNN: a plain nn.Sequential with BatchNorm and Dropout.
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Dropout(0.25), nn.Linear(16 * 7 * 7, 64), nn.ReLU(), nn.Dropout(0.25),
        nn.Linear(64, 10))


class WrappedCnn(nn.Module):
    # One top-level unit (the Sequential call): only --granularity=expand-containers can split it.
    def __init__(self):
        super().__init__()
        self.body = cnn()

    def forward(self, x):
        return self.body(x)


class ResNet(nn.Module):
    # The skip `s` spans conv1, bn1, relu and conv2 (four top-level units).
    def __init__(self):
        super().__init__()
        self.conv0 = nn.Conv2d(1, 8, 3, padding=1)
        self.bn0 = nn.BatchNorm2d(8)
        self.conv1 = nn.Conv2d(8, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 14 * 14, 10)

    def forward(self, x):
        x = F.relu(self.bn0(self.conv0(x)))
        s = F.max_pool2d(x, 2)
        y = self.conv1(s)
        y = self.bn1(y)
        y = torch.relu(y)
        y = self.conv2(y)
        x = s + y
        return self.fc(torch.flatten(x, 1))


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, mask):
        b, t, d = x.size(0), x.size(1), x.size(2)
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        hd = d // self.heads
        q = q.view(b, t, self.heads, hd).transpose(1, 2)
        k = k.view(b, t, self.heads, hd).transpose(1, 2)
        v = v.view(b, t, self.heads, hd).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / (hd ** 0.5))
        att = att.masked_fill(mask == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, d)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))


class Gpt(nn.Module):
    # Token + position embedding (positions from idx.size(1)), blocks in a ModuleList taking an
    # attention mask cut from a buffer on the top module, a parameter used directly on the top
    # module (self.scale), a final norm and a head; T (an int) is used again at the very end.
    def __init__(self, vocab=50, block=16, d=32, heads=4, layers=3, tied=False):
        super().__init__()
        self.vocab = vocab
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(block, d)
        self.blocks = nn.ModuleList([Block(d, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d)
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, d))
        self.head = nn.Linear(d, vocab, bias=False)
        if tied:
            self.head.weight = self.tok.weight
        self.register_buffer("causal", torch.tril(torch.ones(block, block)))

    def forward(self, idx):
        t = idx.size(1)
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        mask = self.causal[:t, :t]
        x = self.tok(idx) + self.pos(pos)
        for blk in self.blocks:
            x = blk(x, mask)
        x = self.ln_f(x) * self.scale
        logits = self.head(x)
        return logits.reshape(-1, t, self.vocab)


class LatePosGpt(nn.Module):
    # Issue [R]'s new user's GPT: positions from torch.arange(T) and a learned position embedding,
    # arranged so that a cut before pos2 is crossed by tensors of every batch layout: the
    # positions (int64 [T], no batch dimension), the attention mask (float [T, T], none, no
    # gradient; and as bool [T, T] for b1), a position embedding (float [T, D], none, with a gradient), the token embedding
    # transposed (float [T, B, D], batch dimension 1) and the activations (float [B, T, D], 0).
    # A cut before b2 is crossed by the mask and the activations. Also trained by
    # tests/integration/batch_free_test.py.
    def __init__(self, vocab=50, block=16, d=32, heads=4):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(block, d)
        self.pos2 = nn.Embedding(block, d)
        self.b0 = Block(d, heads)
        self.b1 = Block(d, heads)
        self.b2 = Block(d, heads)
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)
        self.register_buffer("causal", torch.tril(torch.ones(block, block)))

    def forward(self, idx):
        t = idx.size(1)
        positions = torch.arange(t, device=idx.device)
        mask = self.causal[:t, :t]
        keep = mask > 0
        x = self.tok(idx)
        pe = self.pos(positions)
        xt = x.transpose(0, 1)
        x = self.b0(x, mask)
        x = self.pos2(positions) + x + pe + xt.transpose(0, 1)  # pos2 first: its unit is the cut
        x = self.b1(x, keep)
        x = self.b2(x, mask)
        return self.head(self.ln_f(x))


class TwoInput(nn.Module):
    # Two inputs; `b` is needed again at the end (it crosses every cut after fb), and the
    # torch.cat list of tensors cannot cross a cut.
    def __init__(self):
        super().__init__()
        self.fa = nn.Linear(12, 16)
        self.fb = nn.Linear(6, 16)
        self.mix = nn.Linear(32, 8)
        self.skip = nn.Linear(6, 8)

    def forward(self, a, b):
        ha = torch.tanh(self.fa(a))
        hb = torch.tanh(self.fb(b))
        h = torch.cat([ha, hb], 1)
        return self.mix(h) + self.skip(b)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    models = {
        "cnn": cnn(),
        "wrapped_cnn": WrappedCnn(),
        "resnet": ResNet(),
        "gpt": Gpt(),
        "gpt_tied": Gpt(tied=True),
        "two_input": TwoInput(),
        "gpt_late_pos": LatePosGpt(),
    }
    for name, model in models.items():
        # Non-trivial BatchNorm statistics so eval mode differs from the identity.
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
        model.eval()
        torch.jit.save(torch.jit.script(model), os.path.join(out, name + ".pt"))


if __name__ == "__main__":
    main()
