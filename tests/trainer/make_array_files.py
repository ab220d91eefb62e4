#!/usr/bin/python3
"""Array datasets for ArrayDatasetTest, what numpy/PyTorch read from them, and a two-input model.

    /usr/bin/python3 tests/trainer/make_array_files.py OUTDIR

OUTDIR/st/shard_{0,1,2}.safetensors  input_ids int64 (n, 8), attention_mask bool (n, 8),
                          pixels float16 (n, 2, 3), emb bfloat16 (n, 4), labels int64 (n,), and
                          an unused tensor; n = 7, 5, 9 (written with torch's bytes for bfloat16)
OUTDIR/npy/s{0,1}/        input_ids.npy int32 (n, 6), attention_mask.npy bool (n, 6),
                          x.npy float64 (n, 3), labels.npy int64 (n,); n = 4, 6
OUTDIR/plain/             inputs.npy float32 (10, 3), targets.npy int64 (10,) (default names)
OUTDIR/<case>_ref.safetensors  ids and each tensor's rows for those ids, as numpy/torch read them
OUTDIR/twoin/             a model taking (input_ids, attention_mask) cut by hand into 2 stages,
                          node_data/ training on OUTDIR/st, full.pt (the unsplit model) and
                          data.safetensors (every sample of the three shards, in order)
OUTDIR/bad/               broken shards
"""
import json
import os
import sys

import numpy as np
import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "../../examples/fashion_mnist"))
from dataset_refs import npy_bytes, write_safetensors  # noqa: E402
from make_node_data_by_hand import boundary, write_node_data  # noqa: E402


def bf16(t):
    return ("BF16", list(t.shape), t.contiguous().view(torch.int16).numpy().tobytes())


def read_safetensors_np(path):
    """An independent reader (numpy.memmap over the header's offsets); bfloat16 -> torch."""
    with open(path, "rb") as f:
        n = int(np.frombuffer(f.read(8), dtype="<u8")[0])
        header = json.loads(f.read(n))
    out = {}
    types = {"I64": "<i8", "BOOL": "?", "F16": "<f2", "F32": "<f4", "I32": "<i4", "BF16": "<i2"}
    for name, e in header.items():
        b, end = e["data_offsets"]
        a = np.memmap(path, dtype=types[e["dtype"]], mode="r", offset=8 + n + b,
                      shape=tuple(e["shape"]))
        out[name] = torch.from_numpy(np.array(a)).view(torch.bfloat16) if e["dtype"] == "BF16" else a
    return out


def rows(shards, names, ids):
    """Rows `ids` (counted across shards) of each named array; shards: list of name -> array."""
    counts = [len(s[names[0]]) for s in shards]
    begins = np.cumsum([0] + counts)
    out = {n: [] for n in names}
    for i in ids:
        k = int(np.searchsorted(begins, i, side="right") - 1)
        for n in names:
            out[n].append(shards[k][n][i - begins[k]])
    return out


class TwoInput(nn.Module):
    """Masked mean of token embeddings, then a linear head: forward(input_ids, attention_mask)."""
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, input_ids, attention_mask):
        m = attention_mask.to(torch.float32).unsqueeze(-1)
        h = (self.emb(input_ids) * m).sum(1) / m.sum(1).clamp(min=1.0)
        return self.head(h)


class Stage0(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.emb = m.emb

    def forward(self, input_ids, attention_mask):
        m = attention_mask.to(torch.float32).unsqueeze(-1)
        return (self.emb(input_ids) * m).sum(1) / m.sum(1).clamp(min=1.0)


class Stage1(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.head = m.head

    def forward(self, h):
        return self.head(h)


def main():
    out = sys.argv[1]
    torch.manual_seed(7)
    names = ["input_ids", "attention_mask", "pixels", "emb", "labels"]
    os.makedirs(f"{out}/st", exist_ok=True)
    for k, n in enumerate([7, 5, 9]):
        mask = torch.rand(n, 8) < 0.7
        mask[:, 0] = True
        write_safetensors(f"{out}/st/shard_{k}.safetensors", {
            "unused": np.arange(3, dtype=np.float32),
            "input_ids": torch.randint(0, 20, (n, 8)).numpy(), "attention_mask": mask.numpy(),
            "pixels": torch.randn(n, 2, 3).half().numpy(), "emb": bf16(torch.randn(n, 4).bfloat16()),
            "labels": torch.randint(0, 3, (n,)).numpy()})
    shards = [read_safetensors_np(f"{out}/st/shard_{k}.safetensors") for k in range(3)]
    ids = [20, 0, 6, 7, 11, 12, 3, 19]
    r = rows(shards, names, ids)
    ref = {"ids": np.array(ids, dtype=np.int64)}
    for n in names:
        ref[n] = bf16(torch.stack(r[n])) if n == "emb" else np.stack(r[n])
    write_safetensors(f"{out}/st_ref.safetensors", ref)
    every = rows(shards, ["input_ids", "attention_mask", "labels"], range(21))
    write_safetensors(f"{out}/twoin_data.safetensors", {n: np.stack(v) for n, v in every.items()})

    npy_names = ["input_ids", "attention_mask", "x", "labels"]
    for k, n in enumerate([4, 6]):
        d = f"{out}/npy/s{k}"
        os.makedirs(d, exist_ok=True)
        np.save(f"{d}/input_ids.npy", np.random.default_rng(k).integers(0, 20, (n, 6)).astype(np.int32))
        np.save(f"{d}/attention_mask.npy", np.random.default_rng(k + 5).random((n, 6)) < 0.5)
        np.save(f"{d}/x.npy", np.random.default_rng(k + 9).standard_normal((n, 3)))
        np.save(f"{d}/labels.npy", np.arange(n, dtype=np.int64) + 100 * k)
    shards = [{n: np.load(f"{out}/npy/s{k}/{n}.npy", mmap_mode="r") for n in npy_names} for k in range(2)]
    ids = [9, 0, 3, 4, 5, 2]
    r = rows(shards, npy_names, ids)
    ref = {"ids": np.array(ids, dtype=np.int64)}
    ref.update({n: np.stack(v) for n, v in r.items()})
    write_safetensors(f"{out}/npy_ref.safetensors", ref)

    os.makedirs(f"{out}/plain", exist_ok=True)
    np.save(f"{out}/plain/inputs.npy", np.random.default_rng(3).standard_normal((10, 3)).astype(np.float32))
    np.save(f"{out}/plain/targets.npy", np.arange(10, dtype=np.int64))

    bad = f"{out}/bad"
    for d in ["uint16", "mismatch/s0", "mismatch/s1", "fortran", "count"]:
        os.makedirs(f"{bad}/{d}", exist_ok=True)
    np.save(f"{bad}/uint16/inputs.npy", np.zeros((4, 2), dtype=np.uint16))
    np.save(f"{bad}/uint16/targets.npy", np.zeros(4, dtype=np.int64))
    np.save(f"{bad}/mismatch/s0/inputs.npy", np.zeros((4, 2), dtype=np.float32))
    np.save(f"{bad}/mismatch/s0/targets.npy", np.zeros(4, dtype=np.int64))
    np.save(f"{bad}/mismatch/s1/inputs.npy", np.zeros((4, 3), dtype=np.float32))
    np.save(f"{bad}/mismatch/s1/targets.npy", np.zeros(4, dtype=np.int64))
    with open(f"{bad}/fortran/inputs.npy", "wb") as f:
        f.write(npy_bytes("<f4", "(4, 2)", bytes(32), fortran=True))
    np.save(f"{bad}/fortran/targets.npy", np.zeros(4, dtype=np.int64))
    np.save(f"{bad}/count/inputs.npy", np.zeros((4, 2), dtype=np.float32))
    np.save(f"{bad}/count/targets.npy", np.zeros(5, dtype=np.int64))
    write_safetensors(f"{bad}/no_targets.safetensors", {"inputs": np.zeros((4, 2), dtype=np.float32)})
    write_safetensors(f"{bad}/int16.safetensors", {"inputs": np.zeros((4, 2), dtype=np.int16),
                                                   "targets": np.zeros(4, dtype=np.int64)})

    model = TwoInput()
    os.makedirs(f"{out}/twoin", exist_ok=True)
    torch.jit.script(model).save(f"{out}/twoin/full.pt")
    job = {"data": {"location": f"{out}/st", "format": "safetensors",
                    "inputs": ["input_ids", "attention_mask"], "targets": "labels"},
           "training_definition": {"batch_size": 6, "microbatches": 2, "max_steps": 3, "epochs": 0,
                                   "seed": 11, "loss_fn": "cross_entropy",
                                   "optimizer": {"name": "sgd", "lr": 0.0}}}
    stages = [torch.jit.script(Stage0(model)), torch.jit.script(Stage1(model))]
    write_node_data(f"{out}/twoin/node_data", "two_input_test", stages,
                    [[boundary("input_ids", [1, 8], "int64"), boundary("attention_mask", [1, 8], "bool")],
                     [boundary("h", [1, 8])], [boundary("logits", [1, 3])]],
                    ["127.0.0.1:1", "127.0.0.1:2"], job)
    print(f"make_array_files: wrote {out}")


if __name__ == "__main__":
    main()
