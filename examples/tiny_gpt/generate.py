#!/usr/bin/python3
"""Print text sampled from a trained tiny GPT (a TorchScript model, e.g. from clusterize --merge).

    /usr/bin/python3 examples/tiny_gpt/generate.py trained.pt --prompt "The " --chars 200
"""
import argparse

import torch


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("--prompt", default="This ")
    parser.add_argument("--chars", type=int, default=200)
    parser.add_argument("--block", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    model = torch.jit.load(args.model)
    model.eval()
    idx = torch.tensor([list(args.prompt.encode())], dtype=torch.long)
    with torch.no_grad():
        for _ in range(args.chars):
            logits = model(idx[:, -args.block:])[:, -1, :] / args.temperature
            nxt = torch.multinomial(torch.softmax(logits, dim=-1), 1)
            idx = torch.cat([idx, nxt], dim=1)
    print(bytes(idx[0].tolist()).decode("utf-8", errors="replace"))


if __name__ == "__main__":
    main()
