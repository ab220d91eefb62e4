"""Shared by reference.py, report.py and check.py: an llm.c shard reader written apart from cairn's
(trainer/data/TokenDataset.cpp) and from make_data.py's writer, the blocks cairn trains and
evaluates on, the one perplexity function every model is measured with, and sampling."""
import math
import os

import numpy as np
import torch
import torch.nn.functional as F

HEADER_INTS, MAGIC, VERSION = 256, 20240520, 1


def read_shard(path):
    """Token ids of one llm.c uint16 shard, after checking its header against the file size."""
    raw = open(path, "rb").read()
    if len(raw) < HEADER_INTS * 4:
        raise ValueError(f"{path}: {len(raw)} bytes, shorter than the 1024-byte header")
    header = np.frombuffer(raw[:HEADER_INTS * 4], dtype="<i4")
    if header[0] != MAGIC or header[1] != VERSION:
        raise ValueError(f"{path}: header magic/version {header[0]}/{header[1]}, expected {MAGIC}/{VERSION}")
    count = int(header[2])
    if len(raw) != HEADER_INTS * 4 + 2 * count:
        raise ValueError(f"{path}: header says {count} tokens, file holds {(len(raw) - 1024) / 2}")
    return np.frombuffer(raw[HEADER_INTS * 4:], dtype="<u2").astype(np.int64)


def shard_paths(folder):
    return [os.path.join(folder, f) for f in sorted(os.listdir(folder))]


def blocks(tokens, block):
    """Sample i of a file: tokens [i*L, i*L + L] (L+1 ids: inputs the first L, targets the last L)."""
    n = (len(tokens) - 1) // block
    idx = np.arange(n)[:, None] * block + np.arange(block + 1)[None, :]
    return torch.from_numpy(tokens[idx])


def blocks_of(folder, block):
    return torch.cat([blocks(read_shard(p), block) for p in shard_paths(folder)])


def validation_blocks(out, job):
    """The blocks cairn's Leaf evaluates: every block of OUT/shards/val, or the first
    data.test_samples of them."""
    data = job["data"]
    val = blocks_of(os.path.join(out, "shards", "val"), data["block_length"])
    return val[:data["test_samples"]] if data.get("test_samples", 0) > 0 else val


def perplexity(model, data, batch=256):
    """Mean next-token cross entropy over every target of `data` ([N, L+1] blocks) and its exp."""
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for b in range(0, len(data), batch):
            x = data[b:b + batch]
            logits = model(x[:, :-1])
            total += float(F.cross_entropy(logits.reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1),
                                           reduction="sum").double())
            count += x[:, 1:].numel()
    loss = total / count
    return loss, math.exp(loss)


def sample(model, sp, prompt, tokens=48, block=64, temperature=0.8, seed=0):
    """Text sampled from `model` after `prompt`, up to `tokens` ids or the end of the verse (</s>)."""
    g = torch.Generator().manual_seed(seed)
    model.eval()
    ids = sp.encode(prompt)
    with torch.no_grad():
        for _ in range(tokens):
            logits = model(torch.tensor([ids[-block:]]))[0, -1] / temperature
            nxt = int(torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=g))
            if nxt == sp.eos_id():
                break
            ids.append(nxt)
    return sp.decode(ids)
