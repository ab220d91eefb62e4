#!/usr/bin/python3
"""The subword GPT as a TorchScript module: examples/tiny_gpt's GPT (token + position embeddings,
an nn.Sequential of pre-LayerNorm transformer blocks that clusterize --granularity expand-containers
cuts between, final LayerNorm, linear head) with the tokenizer's vocabulary instead of 256 bytes.

    /usr/bin/python3 examples/subword_gpt/make_model.py --out model.pt --vocab 2000 [--layers 2 --dim 64 --heads 4 --block 64 --seed 0]

forward(idx: int64 [B, T]) -> logits float32 [B, T, vocab]. The same model.pt is the starting
point of the cairn run and of the one-process reference (reference.py), so both start identical.
"""
import argparse
import os
import sys

sys.dont_write_bytecode = True  # no __pycache__ beside the example

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tiny_gpt"))
from make_model import TinyGPT  # noqa: E402  (examples/tiny_gpt/make_model.py)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--vocab", type=int, required=True)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--block", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    if a.dim % a.heads:
        p.error("--dim must be a multiple of --heads")
    torch.manual_seed(a.seed)
    model = TinyGPT(a.layers, a.dim, a.heads, a.block, vocab=a.vocab)
    torch.jit.script(model).save(a.out)
    n = sum(q.numel() for q in model.parameters())
    print(f"wrote {a.out}: GPT {a.layers} layers, dim {a.dim}, vocabulary {a.vocab}, {n} parameters, block {a.block}")


if __name__ == "__main__":
    main()
