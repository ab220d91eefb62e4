"""Shared by the PyTorch reference scripts of tools/bench (ddp_reference.py, rpc_pipeline_reference.py):
the Fashion-MNIST data exactly as cairn's job.json describes it (IDX files, x = (pixel/255 - 0.2860)/0.3530)
and the example CNN (examples/fashion_mnist/make_model.py) with the SAME initial weights as the
TorchScript model.pt the cairn side trains (its state_dict is loaded into the Python module).
Runs under /usr/bin/python3 (Debian's python3-torch)."""
import gzip
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples", "fashion_mnist"))
from make_model import FashionCNN  # noqa: E402

MEAN, STD = 0.2860, 0.3530


def _idx(path):
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def _find(folder, stem):
    for name in (stem, stem + ".gz"):
        if os.path.exists(os.path.join(folder, name)):
            return os.path.join(folder, name)
    raise SystemExit(f"{folder}: {stem}[.gz] missing")


def load_split(folder, train, limit=0):
    prefix = "train" if train else "t10k"
    images = _idx(_find(folder, f"{prefix}-images-idx3-ubyte"))
    labels = _idx(_find(folder, f"{prefix}-labels-idx1-ubyte"))
    if limit > 0:
        images, labels = images[:limit], labels[:limit]
    x = (torch.from_numpy(images.astype(np.float32)).unsqueeze(1) / 255.0 - MEAN) / STD
    return x, torch.from_numpy(labels.astype(np.int64))


def make_model(model_pt, batchnorm=True):
    """The example CNN with model.pt's initial weights (so both sides start from the same point)."""
    model = FashionCNN(batchnorm)
    state = torch.jit.load(model_pt).state_dict()
    model.load_state_dict(state)
    return model


@torch.no_grad()
def accuracy(forward, x, y, batch=500):
    correct = 0
    for i in range(0, len(x), batch):
        correct += int((forward(x[i:i + batch]).argmax(1) == y[i:i + batch]).sum())
    return correct / len(x)
