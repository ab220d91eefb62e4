"""Chunks served by the coordinator (issue [K] part 2, docs/NODE_DATA.md "Data served by the
coordinator"): a real coordinator (`clusterize --serve`) and two real `provider --join` volunteers
on tcp loopback, 2 clusters of one stage each, training on four safetensors shards of Fashion-MNIST
and evaluating on two test shards (data.test_location) that only the coordinator's job names
(data.source "coordinator"); each volunteer runs in its own empty work folder and fetches its
cluster's chunks and every test chunk from the coordinator.

Checks: every volunteer's chunk cache holds exactly its cluster's two shards (dealt round robin:
cluster c gets shards c and c + 2) and both test shards (chunks 4 and 5: not dealt, every cluster
evaluates on the whole test set), byte-identical to the coordinator's files (zlib.crc32); every
step loss of each cluster equals, exactly, that of the same job run with data.source "local" (the
same volunteers' flow reading the files themselves): the sampler order is the same; and so do the
evaluation records (metrics.jsonl "eval" after steps 20 and 40, on all 600 test samples) and the
final evaluations in the coordinator's run_result.json. The same checks then run for the tokens
format: four byte-token training files and two test files cut from a Debian text
(/usr/share/common-licenses/GPL-3), a one-block tiny GPT (examples/tiny_gpt/make_model.py), block
length 16 (evaluations on 374 test blocks, with perplexity).

    served_chunks_test.py --provider BUILD/node/provider --clusterize BUILD/clusterize/clusterize --work DIR
"""
import argparse
import json
import os
import shutil
import sys
import zlib

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import volunteer_harness as vt  # noqa: E402  (its Process, ports, coordinator helpers)
from in_process import run_script  # noqa: E402  (make_model.py in this interpreter)

SHARDS, PER_SHARD = 4, 600
TEST_SHARDS, PER_TEST_SHARD = 2, 300
TEXT = "/usr/share/common-licenses/GPL-3"  # base-files: every Debian machine has it


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, (dtype, array) in tensors.items():
        data = np.ascontiguousarray(array).tobytes()
        header[name] = {"dtype": dtype, "shape": list(array.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for b in blobs:
            f.write(b)


def make_shards(folder, prefix="train", idx="train", shards=SHARDS, per_shard=PER_SHARD):
    os.makedirs(folder, exist_ok=True)
    images = vt.load_idx(f"{idx}-images-idx3-ubyte.gz", 16).reshape(-1, 1, 28, 28)
    labels = vt.load_idx(f"{idx}-labels-idx1-ubyte.gz", 8).astype(np.int64)
    for k in range(shards):
        rows = slice(k * per_shard, (k + 1) * per_shard)
        x = ((images[rows].astype(np.float32) / 255.0 - vt.MEAN) / vt.STD).astype(np.float32)
        write_safetensors(os.path.join(folder, f"{prefix}_{k}.safetensors"),
                          {"inputs": ("F32", x), "targets": ("I64", labels[rows])})


def write_job(work, name, model, data):
    job = {"format": 1, "job_id": "served", "driver": "cairn", "model": model, "data": data,
           "training_definition": {"batch_size": 32, "microbatches": 2, "epochs": 0, "max_steps": 40,
                                   "seed": 5, "optimizer": {"name": "adamw", "lr": 0.003},
                                   "eval_every": 20, "eval_batch_size": 250,
                                   "sync": "average", "local_steps": 5,
                                   "timeouts": {"startup_s": 60, "peer_s": 60}}}
    path = os.path.join(work, name)
    with open(path, "w") as f:
        json.dump(job, f)
    return path


def run(args, label, job, model, shape):
    """One run: coordinator + 2 volunteers in empty folders; returns {cluster: [(step, loss)]},
    {cluster: volunteer work folder}, {cluster: [eval records]} and run_result.json's clusters."""
    # own_folders: each volunteer's cwd and work folder is empty, no copy of the data.
    run = vt.Run(vt.in_folder(args, label), model, job, ["--min-volunteers", "2", "--clusters", "2"], 2,
                 label=label, shape=shape, own_folders=True)
    out = run.out
    with run:
        run.join(2)
        run.all_finish()
    losses, folders, evals = {}, {}, {}
    for _, folder in run.volunteers:
        nodes = os.path.join(folder, "node_data", "nodes")
        (name,) = os.listdir(nodes)
        cluster = json.load(open(os.path.join(nodes, name, "node.json")))["cluster"]
        records = [json.loads(l) for l in open(os.path.join(nodes, name, "metrics.jsonl"))]
        losses[cluster] = [(r["step"], r["loss"]) for r in records if "step" in r and "loss" in r]
        evals[cluster] = [r["eval"] for r in records if "eval" in r]
        folders[cluster] = folder
    finals = json.load(open(os.path.join(out, "run_result.json")))["clusters"]
    return losses, folders, evals, sorted(finals, key=lambda c: c["cluster"])


def make_token_shards(folder, prefix, text, shards, per_shard):
    os.makedirs(folder, exist_ok=True)
    for k in range(shards):
        with open(os.path.join(folder, f"{prefix}_{k}.bin"), "wb") as f:
            f.write(text[k * per_shard:(k + 1) * per_shard])


def check_case(args, case, model, shape, data_dir, test_dir, suffix, test_samples, cache_mb):
    """Runs the served and the local job of one case and checks caches, losses and evaluations."""
    data = dict(case, location=data_dir, test_location=test_dir)
    label = case["format"]
    served_job = write_job(args.work, f"{label}_served.json", model, dict(data, source="coordinator", cache_mb=cache_mb))
    local_job = write_job(args.work, f"{label}_local.json", model, data)

    served, folders, served_evals, served_finals = run(args, f"{label}_served", served_job, model, shape)
    local, _, local_evals, local_finals = run(args, f"{label}_local", local_job, model, shape)

    files = {k: os.path.join(data_dir, f"train_{k}{suffix}") for k in range(SHARDS)}
    files.update({SHARDS + k: os.path.join(test_dir, f"test_{k}{suffix}") for k in range(TEST_SHARDS)})
    crc = {k: zlib.crc32(open(path, "rb").read()) for k, path in files.items()}
    for cluster, folder in sorted(folders.items()):
        cached = sorted(os.listdir(os.path.join(folder, "chunks")))
        expected = sorted([f"{k}-train_{k}{suffix}" for k in range(SHARDS) if k % 2 == cluster] +
                          [f"{SHARDS + k}-test_{k}{suffix}" for k in range(TEST_SHARDS)])
        if cached != expected:
            vt.fail(f"{label}: cluster {cluster}'s chunk cache holds {cached}, expected {expected}")
        for name in cached:
            k = int(name.split("-")[0])
            got = zlib.crc32(open(os.path.join(folder, "chunks", name), "rb").read())
            if got != crc[k]:
                vt.fail(f"{label}: cluster {cluster}'s cached chunk {k} differs from the coordinator's file")
    for cluster in (0, 1):
        a, b = served.get(cluster, []), local.get(cluster, [])
        if len(a) != 40 or a != b:
            vt.fail(f"{label}: cluster {cluster}: served losses {a[:3]}… ({len(a)}) differ from local {b[:3]}… ({len(b)})")
        print(f"{label}: cluster {cluster}: 40 step losses equal with served and local data "
              f"(first {a[0][1]:.6f}, last {a[-1][1]:.6f}); cache {sorted(os.listdir(os.path.join(folders[cluster], 'chunks')))}")
        ea, eb = served_evals.get(cluster, []), local_evals.get(cluster, [])
        if [e.get("step") for e in ea] != [20, 40] or any(e.get("samples") != test_samples for e in ea) or ea != eb:
            vt.fail(f"{label}: cluster {cluster}: served evaluations {ea} differ from local {eb} "
                    f"(expected after steps 20 and 40 on {test_samples} test samples)")
        print(f"{label}: cluster {cluster}: evaluations equal with served and local data: {ea}")
    finals = [(c["cluster"], c.get("eval")) for c in served_finals]
    if [c for c, _ in finals] != [0, 1] or any(e is None for _, e in finals) or \
            finals != [(c["cluster"], c.get("eval")) for c in local_finals]:
        vt.fail(f"{label}: run_result.json final evaluations: served {served_finals}, local {local_finals}")
    print(f"{label}: run_result.json final evaluations equal: {finals}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--provider", required=True)
    p.add_argument("--clusterize", required=True)
    p.add_argument("--work", required=True)
    args = p.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    # Safetensors: Fashion-MNIST images.
    model = vt.make_model(args.work)
    data_dir = os.path.join(args.work, "coordinator_data")
    make_shards(data_dir)
    test_dir = os.path.join(args.work, "coordinator_test_data")
    make_shards(test_dir, "test", "t10k", TEST_SHARDS, PER_TEST_SHARD)
    check_case(args, {"format": "safetensors"}, model, ["--input-shape", "8,1,28,28"], data_dir, test_dir,
               ".safetensors", TEST_SHARDS * PER_TEST_SHARD, 16)

    # Tokens: byte files of a Debian text (vocabulary 256), a one-block tiny GPT (examples/tiny_gpt).
    block, per_train, per_test = 16, 6000, 3000
    text = open(TEXT, "rb").read()
    if len(text) < SHARDS * per_train + TEST_SHARDS * per_test:
        vt.fail(f"{TEXT} is shorter than the token shards need")
    gpt = os.path.join(args.work, "gpt.pt")
    run_script(os.path.join(vt.REPO, "examples/tiny_gpt/make_model.py"),
               ["--out", gpt, "--layers", "1", "--dim", "32", "--heads", "2", "--block", str(block)])
    token_dir, token_test_dir = os.path.join(args.work, "token_data"), os.path.join(args.work, "token_test_data")
    make_token_shards(token_dir, "train", text, SHARDS, per_train)
    make_token_shards(token_test_dir, "test", text[SHARDS * per_train:], TEST_SHARDS, per_test)
    check_case(args, {"format": "tokens", "block_length": block}, gpt,
               ["--input-shape", f"8,{block}", "--input-dtype", "int64"], token_dir, token_test_dir, ".bin",
               TEST_SHARDS * ((per_test - 1) // block), 1)
    print("OK")


if __name__ == "__main__":
    main()
