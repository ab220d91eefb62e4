#!/usr/bin/python3
"""Writes the Fashion-MNIST example model as TorchScript: 2 conv + pooling (+ optional BatchNorm).

    /usr/bin/python3 examples/fashion_mnist/make_model.py --out node_data/fashion_mnist/model.pt

Input (N, 1, 28, 28) float images, output (N, 10) logits. Parameter names (conv1.weight, bn1.*,
conv2.*, bn2.*, fc.*) are what the stages keep after the model is cut.
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class FashionCNN(nn.Module):
    def __init__(self, batchnorm: bool = True, channels1: int = 32, channels2: int = 64):
        super().__init__()
        self.conv1 = nn.Conv2d(1, channels1, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(channels1) if batchnorm else nn.Identity()
        self.conv2 = nn.Conv2d(channels1, channels2, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(channels2) if batchnorm else nn.Identity()
        self.fc = nn.Linear(channels2 * 7 * 7, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        return self.fc(torch.flatten(x, 1))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="where to write the TorchScript model (.pt)")
    parser.add_argument("--no-batchnorm", action="store_true", help="leave out the BatchNorm layers")
    parser.add_argument("--channels", type=int, nargs=2, default=[32, 64], metavar=("C1", "C2"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    model = FashionCNN(not args.no_batchnorm, *args.channels)
    scripted = torch.jit.script(model)
    scripted.save(args.out)
    n = sum(p.numel() for p in model.parameters())
    print(f"make_model: wrote {args.out} ({n} parameters, batchnorm={'no' if args.no_batchnorm else 'yes'})")


if __name__ == "__main__":
    main()
