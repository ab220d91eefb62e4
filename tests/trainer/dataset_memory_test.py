#!/usr/bin/python3
"""Memory stays bounded: dataset_stream streams every sample of a token dataset several times the
size of its memory headroom (RLIMIT_AS, as `ulimit -v` sets it, = its virtual size at start +
HEADROOM), and what it saw must equal numpy's sums over the same files; its peak resident set must
stay far below the dataset.
A control run that copies the dataset into memory, as the loader did before, must fail under the
same limit (so the limit is real).

    /usr/bin/python3 tests/trainer/dataset_memory_test.py --stream build/tests/dataset_stream \
        [--megabytes 256] [--headroom-mb 64]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dataset_refs import write_llmc_shard  # noqa: E402

def main():
    p = argparse.ArgumentParser()
    p.add_argument("--stream", required=True)
    p.add_argument("--megabytes", type=int, default=256)
    p.add_argument("--headroom-mb", type=int, default=64)
    p.add_argument("--block-length", type=int, default=255)
    p.add_argument("--keep", help="write the shards here and keep them")
    args = p.parse_args()
    L = args.block_length
    folder = args.keep or tempfile.mkdtemp(prefix="cairn_tokens_")
    os.makedirs(folder, exist_ok=True)
    try:
        rng = np.random.default_rng(1)
        shards = 4
        per_shard = args.megabytes * 2**20 // 2 // shards  # uint16 tokens
        input_sum = last_target_sum = samples = 0
        for k in range(shards):
            tokens = rng.integers(0, 50257, per_shard + k, dtype=np.uint16)
            if k % 2:
                write_llmc_shard(f"{folder}/shard_{k}.bin", tokens)
            else:
                np.save(f"{folder}/shard_{k}.npy", tokens)
            blocks = (len(tokens) - 1) // L
            t = tokens.astype(np.int64)
            input_sum += int(t[: blocks * L].sum())
            last_target_sum += int(t[L: (blocks + 1) * L: L].sum())
            samples += blocks
            del tokens, t
        total = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
        common = [args.stream, "--location", folder, "--block-length", str(L), "--batch", "64",
                  "--headroom-mb", str(args.headroom_mb)]
        run = subprocess.run(common, capture_output=True, text=True, timeout=300)
        if run.returncode != 0:
            sys.exit(f"FAIL: dataset_stream exited {run.returncode}:\n{run.stderr}")
        seen = json.loads(run.stdout)
        print(json.dumps(seen))
        hwm_growth = seen["vm_hwm_kb"] - seen["vm_rss_start_kb"]
        checks = [
            (seen["samples"] == samples, f"samples {seen['samples']} != numpy's {samples}"),
            (seen["input_sum"] == input_sum, f"input sum {seen['input_sum']} != numpy's {input_sum}"),
            (seen["last_target_sum"] == last_target_sum,
             f"last-target sum {seen['last_target_sum']} != numpy's {last_target_sum}"),
            (seen["bytes"] == total, f"bytes {seen['bytes']} != {total}"),
            (total >= 3 * args.headroom_mb * 2**20,
             f"the dataset ({total >> 20} MiB) is not several times the headroom"),
            (hwm_growth * 1024 < total / 8,
             f"peak RSS grew by {hwm_growth >> 10} MiB while streaming {total >> 20} MiB"),
        ]
        control = subprocess.run(common + ["--control"], capture_output=True, text=True, timeout=300)
        control_failed = control.returncode != 0 or json.loads(control.stdout)["control_failed"]
        checks.append((control_failed, "copying the dataset into memory did not fail under the limit"))
        failed = [m for ok, m in checks if not ok]
        for m in failed:
            print("FAIL:", m)
        if failed:
            sys.exit(1)
        print(f"PASS: streamed {samples} samples ({total >> 20} MiB in {shards} shards) under "
              f"RLIMIT_AS = start + {args.headroom_mb} MiB; peak RSS {seen['vm_hwm_kb'] >> 10} MiB "
              f"(start {seen['vm_rss_start_kb'] >> 10} MiB); a full copy fails under the same limit")
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
