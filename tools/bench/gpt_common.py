"""Shared by the PyTorch references of tools/bench that train the tiny GPT (ddp_reference.py
--task gpt): the token data exactly as cairn's `tokens` format reads a text file (job.json data
format "tokens", trainer/data/TokenDataset.cpp) and the example model (examples/tiny_gpt/
make_model.py) with the SAME initial weights as the TorchScript model.pt the cairn side trains.

Data rule (cairn's, for one file without a header): tokens are the file's bytes; sample i is tokens
[i L, i L + L] (L = block_length), inputs the first L, targets the last L; there are (n - 1) // L
samples; without data.test_location the last int(samples * test_fraction) are the test set, the
rest the training set; train_samples / test_samples > 0 keep the first that many of each.
Validation loss: cross entropy averaged over every token of the test samples (cairn's Evaluator).
Runs under /usr/bin/python3 (Debian's python3-torch)."""
import importlib.util
import os

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
# loaded by path: examples/fashion_mnist/make_model.py (fmnist_common) has the same module name
_spec = importlib.util.spec_from_file_location(
    "tiny_gpt_make_model", os.path.join(HERE, "..", "..", "examples", "tiny_gpt", "make_model.py"))
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)
TinyGPT = _module.TinyGPT


def load_splits(corpus, block, test_fraction=0.1, train_samples=0, test_samples=0):
    """((train inputs, train targets), (test inputs, test targets)), int64 [N, block] each."""
    tokens = torch.from_numpy(np.fromfile(corpus, dtype=np.uint8).astype(np.int64))
    total = (len(tokens) - 1) // block
    if total < 1:
        raise SystemExit(f"{corpus}: shorter than one block of {block} + 1 tokens")
    rows = torch.stack([tokens[i * block:i * block + block + 1] for i in range(total)])
    test_count = int(float(total) * test_fraction)
    train, test = rows[:total - test_count], rows[total - test_count:]
    if train_samples > 0:
        train = train[:train_samples]
    if test_samples > 0:
        test = test[:test_samples]
    return (train[:, :-1], train[:, 1:]), (test[:, :-1], test[:, 1:])


def make_model(model_pt, layers=4, dim=128, heads=4, block=64):
    """The example tiny GPT with model.pt's initial weights (make_model.py's default shape)."""
    model = TinyGPT(layers, dim, heads, block)
    model.load_state_dict(torch.jit.load(model_pt).state_dict())
    return model


def loss(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


@torch.no_grad()
def validation_loss(model, x, y, batch=64):
    total, tokens = 0.0, 0
    for i in range(0, len(x), batch):
        logits = model(x[i:i + batch])
        total += float(F.cross_entropy(logits.reshape(-1, logits.size(-1)), y[i:i + batch].reshape(-1),
                                       reduction="sum"))
        tokens += y[i:i + batch].numel()
    return total / tokens
