#!/usr/bin/python3
"""A character-level (byte-level) GPT as a TorchScript module, for examples/tiny_gpt.

    /usr/bin/python3 examples/tiny_gpt/make_model.py --out model.pt [--layers 4 --dim 128 --heads 4 --block 64]

Vocabulary: the 256 byte values, so any text file is a dataset (job.json data.format "tokens").
Layout: token embedding + position embedding (positions from idx.size(1)), an nn.Sequential of
transformer blocks (clusterize --granularity expand-containers cuts between blocks), final
LayerNorm, linear head. forward(idx: int64 [B, T]) -> logits float32 [B, T, 256].
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int, block: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.register_buffer("mask", torch.tril(torch.ones(block, block)).view(1, 1, block, block))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.size()
        q, k, v = self.qkv(x).split(c, dim=2)
        h = self.heads
        q = q.view(b, t, h, c // h).transpose(1, 2)
        k = k.view(b, t, h, c // h).transpose(1, 2)
        v = v.view(b, t, h, c // h).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / float(c // h) ** 0.5)
        att = att.masked_fill(self.mask[:, :, :t, :t] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, block: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads, block)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, layers: int, dim: int, heads: int, block: int, vocab: int = 256):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(block, dim)
        self.blocks = nn.Sequential(*[Block(dim, heads, block) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.size(1)
        positions = torch.arange(0, t, dtype=torch.long, device=idx.device).unsqueeze(0)
        x = self.tok(idx) + self.pos(positions)
        x = self.blocks(x)
        return self.head(self.ln_f(x))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--block", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.dim % args.heads:
        parser.error("--dim must be a multiple of --heads")
    torch.manual_seed(args.seed)
    model = TinyGPT(args.layers, args.dim, args.heads, args.block)
    scripted = torch.jit.script(model)
    scripted.save(args.out)
    n = sum(p.numel() for p in model.parameters())
    print(f"wrote {args.out}: TinyGPT {args.layers} layers, dim {args.dim}, {n} parameters, block {args.block}")


if __name__ == "__main__":
    main()
