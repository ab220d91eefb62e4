#!/usr/bin/python3
"""Token datasets for TokenDatasetTest, and what numpy reads from them.

    /usr/bin/python3 tests/trainer/make_token_files.py OUTDIR

OUTDIR/llmc/      train_00{0,1,2}.bin (llm.c GPT-2 shards, uint16) and val_000.bin
OUTDIR/llama/     two llm.c Llama-3 shards (uint32, ids above 65535)
OUTDIR/npy/       a.npy (uint16) and b.npy (int64), 1-D
OUTDIR/raw16.bin  nanoGPT-style uint16 tokens without a header (data.token_dtype "uint16")
OUTDIR/bad/       broken files, one per way of being broken
OUTDIR/<case>_ref.safetensors  per case: ids, inputs, targets (numpy's reading of the same
                  samples), samples per shard, and each shard's zlib.crc32
Sample i of a file is tokens [i*L, i*L + L] (L = block length); samples do not span files.
"""
import os
import sys
import zlib

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dataset_refs import npy_bytes, write_llmc_shard, write_safetensors  # noqa: E402

L = 16


def reference(out, case, files, reader, ids_of):
    """files: paths in cairn's order; reader(path) -> numpy 1-D tokens (memory-mapped)."""
    arrays = [reader(p) for p in files]
    per_file = [max(0, (len(a) - 1) // L) for a in arrays]
    begins = np.cumsum([0] + per_file)
    ids = ids_of(int(begins[-1]))
    inputs, targets = [], []
    for i in ids:
        k = int(np.searchsorted(begins, i, side="right") - 1)
        j = i - begins[k]
        block = np.asarray(arrays[k][j * L: j * L + L + 1], dtype=np.int64)
        inputs.append(block[:-1])
        targets.append(block[1:])
    crcs = []
    for p in files:
        with open(p, "rb") as f:
            crcs.append(zlib.crc32(f.read()))
    write_safetensors(f"{out}/{case}_ref.safetensors", {
        "ids": np.array(ids, dtype=np.int64), "inputs": np.stack(inputs), "targets": np.stack(targets),
        "shard_samples": np.array(per_file, dtype=np.int64), "crc32": np.array(crcs, dtype=np.int64)})


def llmc_reader(path):
    header = np.fromfile(path, dtype="<i4", count=256)
    dtype = "<u2" if header[0] == 20240520 else "<u4"
    return np.memmap(path, dtype=dtype, mode="r", offset=1024, shape=(int(header[2]),))


def spread(n):
    """Sample ids touching both ends and every shard boundary region."""
    return sorted(set([0, 1, n // 3, n // 2, n - 2, n - 1] + list(range(5, n, 11))))


def main():
    out = sys.argv[1]
    rng = np.random.default_rng(20240520)
    os.makedirs(f"{out}/llmc", exist_ok=True)
    sizes = [1000, 777, 1500]  # (n-1)//16 = 62, 48, 93 samples
    for k, n in enumerate(sizes):
        write_llmc_shard(f"{out}/llmc/train_{k:03d}.bin", rng.integers(0, 50257, n))
    write_llmc_shard(f"{out}/llmc/val_000.bin", rng.integers(0, 50257, 400))
    train = [f"{out}/llmc/train_{k:03d}.bin" for k in range(3)]
    reference(out, "llmc", train, llmc_reader, spread)
    reference(out, "llmc_val", [f"{out}/llmc/val_000.bin"], llmc_reader, spread)

    os.makedirs(f"{out}/llama", exist_ok=True)
    for k, n in enumerate([600, 333]):
        write_llmc_shard(f"{out}/llama/part{k}.bin", rng.integers(60000, 128256, n), llama3=True)
    reference(out, "llama", [f"{out}/llama/part{k}.bin" for k in range(2)], llmc_reader, spread)

    os.makedirs(f"{out}/npy", exist_ok=True)
    np.save(f"{out}/npy/a.npy", rng.integers(0, 65536, 500).astype(np.uint16))
    np.save(f"{out}/npy/b.npy", rng.integers(0, 2**40, 300).astype(np.int64))
    reference(out, "npy", [f"{out}/npy/a.npy", f"{out}/npy/b.npy"],
              lambda p: np.load(p, mmap_mode="r"), spread)

    rng.integers(0, 65536, 1234).astype("<u2").tofile(f"{out}/raw16.bin")
    reference(out, "raw16", [f"{out}/raw16.bin"],
              lambda p: np.memmap(p, dtype="<u2", mode="r"), spread)

    bad = f"{out}/bad"
    os.makedirs(bad, exist_ok=True)
    write_llmc_shard(f"{bad}/short.bin", np.arange(100))
    with open(f"{bad}/short.bin", "r+b") as f:  # the header says 100 tokens, 90 are there
        f.truncate(1024 + 90 * 2)
    header = np.zeros(256, dtype="<i4")
    header[:3] = [20240520, 3, 10]
    with open(f"{bad}/version.bin", "wb") as f:
        f.write(header.tobytes() + np.arange(10, dtype="<u2").tobytes())
    with open(f"{bad}/fortran.npy", "wb") as f:
        f.write(npy_bytes("<u2", "(8,)", bytes(16), fortran=True))
    with open(f"{bad}/complex.npy", "wb") as f:
        f.write(npy_bytes("<c8", "(8,)", bytes(64)))
    with open(f"{bad}/bigendian.npy", "wb") as f:
        f.write(npy_bytes(">u2", "(8,)", bytes(16)))
    with open(f"{bad}/truncated.npy", "wb") as f:
        f.write(npy_bytes("<u2", "(80,)", bytes(100)))
    with open(f"{bad}/extra_key.npy", "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + b"\x46\x00" +
                b"{'descr': '<u2', 'fortran_order': False, 'shape': (8,), 'x': 1}".ljust(69) + b"\n" + bytes(16))
    np.save(f"{bad}/float.npy", np.zeros(40, dtype=np.float32))
    np.save(f"{bad}/matrix.npy", np.zeros((4, 40), dtype=np.uint16))
    with open(f"{bad}/odd.bin", "wb") as f:  # 33 bytes: not whole uint16 tokens
        f.write(bytes(33))
    print(f"make_token_files: wrote {out}")


if __name__ == "__main__":
    main()
