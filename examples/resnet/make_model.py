#!/usr/bin/python3
"""A small residual network for Fashion-MNIST as a TorchScript module, for examples/resnet.

    /usr/bin/python3 examples/resnet/make_model.py --out model.pt

The residual blocks are written out in the top-level forward (not hidden in child modules), so
each skip connection spans several top-level units: wherever clusterize cuts inside a block, the
block's input crosses the boundary together with the branch's activation — a boundary of two
tensors. forward(x: float32 [B, 1, 28, 28]) -> logits [B, 10].
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class ResNet(nn.Module):
    def __init__(self, width: int = 32):
        super().__init__()
        w = width
        self.stem = nn.Conv2d(1, w, 3, padding=1, bias=False)
        self.stem_bn = nn.BatchNorm2d(w)
        # block 1 (28x28, w channels)
        self.b1_conv1 = nn.Conv2d(w, w, 3, padding=1, bias=False)
        self.b1_bn1 = nn.BatchNorm2d(w)
        self.b1_conv2 = nn.Conv2d(w, w, 3, padding=1, bias=False)
        self.b1_bn2 = nn.BatchNorm2d(w)
        # block 2 (downsample to 14x14, 2w channels; 1x1 projection on the skip)
        self.b2_conv1 = nn.Conv2d(w, 2 * w, 3, stride=2, padding=1, bias=False)
        self.b2_bn1 = nn.BatchNorm2d(2 * w)
        self.b2_conv2 = nn.Conv2d(2 * w, 2 * w, 3, padding=1, bias=False)
        self.b2_bn2 = nn.BatchNorm2d(2 * w)
        self.b2_proj = nn.Conv2d(w, 2 * w, 1, stride=2, bias=False)
        # block 3 (downsample to 7x7, 4w channels)
        self.b3_conv1 = nn.Conv2d(2 * w, 4 * w, 3, stride=2, padding=1, bias=False)
        self.b3_bn1 = nn.BatchNorm2d(4 * w)
        self.b3_conv2 = nn.Conv2d(4 * w, 4 * w, 3, padding=1, bias=False)
        self.b3_bn2 = nn.BatchNorm2d(4 * w)
        self.b3_proj = nn.Conv2d(2 * w, 4 * w, 1, stride=2, bias=False)
        self.fc = nn.Linear(4 * w, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.stem_bn(self.stem(x)))
        h = F.relu(self.b1_bn1(self.b1_conv1(x)))
        h = self.b1_bn2(self.b1_conv2(h))
        x = F.relu(h + x)
        h = F.relu(self.b2_bn1(self.b2_conv1(x)))
        h = self.b2_bn2(self.b2_conv2(h))
        x = F.relu(h + self.b2_proj(x))
        h = F.relu(self.b3_bn1(self.b3_conv1(x)))
        h = self.b3_bn2(self.b3_conv2(h))
        x = F.relu(h + self.b3_proj(x))
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.fc(x)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    model = ResNet(args.width)
    torch.jit.script(model).save(args.out)
    n = sum(p.numel() for p in model.parameters())
    print(f"wrote {args.out}: ResNet width {args.width}, {n} parameters")


if __name__ == "__main__":
    main()
