#!/usr/bin/python3
"""A GPT with tied embeddings (head.weight = tok.weight) cut between the two (issue [R]): 2
clusters x 2 real `provider` processes on tcp loopback (tools/launch_local) train it on llm.c
uint16 token shards; the Root of each cluster holds tok.weight, the Leaf head.weight, and the two
copies are kept equal over the pipeline (trainer/SharedParameters.h).

    tied_gpt_test.py CASE --provider BUILD/node/provider --clusterize BUILD/clusterize/clusterize
                     --work DIR --port BASE

CASE:
  gradients  sync "gradients" (the clusters average gradients every step, as DDP), gradient
             clipping by the global norm, SGD with momentum, 4 steps of 2 micro-batches. Reference:
             PyTorch training the unsplit tied model on the batches each cluster's Root recorded:
             per step, each cluster's loss (its micro-batches' summed cross entropy over its
             batch's token count) backward, the two clusters' gradients averaged, clipped as
             torch.nn.utils.clip_grad_norm_ (a tied tensor counted once), one SGD step. Each
             cluster's step losses and every trained weight (both copies of the tied one) equal it.
  average    sync "average" every 2 steps with Adam, 5 steps: the run ends on a sync.
Both: plan.json lists tok.weight as shared by stages 0 and 1 in each cluster and rings only
tok.weight (not head.weight); in each cluster the Root's tok.weight and the Leaf's head.weight end
bit for bit equal; `clusterize --merge` gives a model whose tok.weight and head.weight are one
tensor, and that model evaluated in PyTorch on the validation shard gives each Leaf's reported
validation loss.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import torch

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "../.."))
sys.path.insert(0, os.path.join(REPO, "tests/clusterize"))
from make_models import Gpt  # noqa: E402

BLOCK, VOCAB = 16, 256
BATCH, MICROBATCHES = 8, 2
LR, MOMENTUM, CLIP = 0.1, 0.9, 0.5
# Losses: float32 sums of BATCH * BLOCK cross-entropy terms of ~5.5 over the same kernels per stage
# instead of whole, and the two clusters' gradients averaged in another order: 1e-5 relative is
# ~100 ulps. Weights (~0.01..1) after 4 steps of the same updates: 1e-5 absolute.
LOSS_RTOL = 1e-5
WEIGHT_ATOL = 1e-5


def fail(message):
    print("FAIL: " + message, file=sys.stderr)
    sys.exit(1)


def run(command, **kwargs):
    proc = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kwargs)
    if proc.returncode != 0:
        sys.stdout.write(proc.stdout[-6000:])
        fail(f"{command[0]} exited {proc.returncode}")
    return proc.stdout


def write_shard(path, tokens):
    """An llm.c GPT-2 shard: 256 int32 of header (magic 20240520, version 1, count), uint16 tokens."""
    header = np.zeros(256, dtype="<i4")
    header[:3] = [20240520, 1, len(tokens)]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype="<u2").tobytes())


def read_shard(path):
    return torch.from_numpy(np.fromfile(path, dtype="<u2", offset=1024).astype(np.int64))


def blocks_of(paths):
    """Every sample of the files in name order, as the token dataset numbers them."""
    out = []
    for path in paths:
        tokens = read_shard(path)
        out += [tokens[i * BLOCK:i * BLOCK + BLOCK + 1] for i in range((len(tokens) - 1) // BLOCK)]
    return out


def prepare(args, training):
    os.makedirs(args.work, exist_ok=True)
    torch.manual_seed(0)
    model = os.path.join(args.work, "model.pt")
    torch.jit.save(torch.jit.script(Gpt(vocab=VOCAB, block=BLOCK, d=32, heads=4, layers=2, tied=True)), model)
    rng = np.random.default_rng(5)
    shards = os.path.join(args.work, "shards")
    os.makedirs(shards, exist_ok=True)
    for name, count in (("train_000.bin", 1601), ("train_001.bin", 1601), ("val_000.bin", 321)):
        # A learnable stream: each token mostly follows from the one before it.
        tokens = np.cumsum(rng.integers(1, 4, count)) % VOCAB
        write_shard(os.path.join(shards, name), tokens)
    configs = {str(i): {"IP": f"127.0.0.1:{args.port + i}", "benchmarks": {"ram": 1, "bandwidth": 1000}}
               for i in range(4)}
    job = {"format": 2, "job_id": "tied-gpt", "driver": "cairn", "model": model,
           "data": {"location": os.path.join(shards, "train_*.bin"), "format": "tokens",
                    "test_location": os.path.join(shards, "val_*.bin"), "block_length": BLOCK},
           "training_definition": dict({
               "batch_size": BATCH, "microbatches": MICROBATCHES, "epochs": 0, "seed": 3,
               "loss_fn": "cross_entropy", "lr_scheduler": "constant", "eval_every": 0,
               "record_sample_ids": True, "timeouts": {"startup_s": 30, "peer_s": 60}}, **training)}
    for name, doc in (("node_configs.json", configs), ("job.json", job)):
        with open(os.path.join(args.work, name), "w") as f:
            json.dump(doc, f)
    return model, shards


def clusterize(args, model, out, cuts=None):
    command = [args.clusterize, "--model", model, "--nodes", os.path.join(args.work, "node_configs.json"),
               "--job", os.path.join(args.work, "job.json"), "--clusters", "2",
               "--input-shape", f"{BATCH // MICROBATCHES},{BLOCK}", "--input-dtype", "int64", "--out", out]
    if cuts:
        command += ["--cuts", ",".join(map(str, cuts))]
    run(command)
    return json.load(open(os.path.join(out, "plan.json")))


def plan_and_train(args, model):
    probe = clusterize(args, model, os.path.join(args.work, "probe"))
    head = [u["index"] for u in probe["units"] if u["label"].startswith("blocks.1 ")]
    if len(head) != 1 or not probe["units"][head[0]]["cut_before_allowed"]:
        fail(f"the cut before blocks.1 is not allowed: {probe['units']}")
    node_data = os.path.join(args.work, "node_data")
    plan = clusterize(args, model, node_data, head)
    for cluster in plan["clusters"]:
        shared = cluster["shared_parameters"]
        if len(cluster["chain"]) != 2 or len(shared) != 1 or shared[0]["name"] != "tok.weight" or \
                shared[0]["stages"] != [0, 1] or shared[0]["local_names"] != ["tok.weight", "head.weight"]:
            fail(f"cluster {cluster['index']}: chain {cluster['chain']}, shared_parameters {shared}")
    ringed = [name for ring in plan["rings"] for name in ring["parameters"]]
    if "tok.weight" not in ringed or "head.weight" in ringed:
        fail(f"rings must carry tok.weight once and head.weight never: {plan['rings']}")
    env = dict(os.environ, PROVIDER=args.provider)
    proc = subprocess.run([os.path.join(REPO, "tools/launch_local"), node_data], env=env, timeout=300,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sys.stdout.write(proc.stdout[-3000:])
    if proc.returncode != 0:
        fail(f"launch_local exited {proc.returncode}")
    return plan, node_data


def trained_stages(node_data, chain):
    return [dict(torch.jit.load(os.path.join(node_data, "nodes", n, "trained_stage.pt")).named_parameters())
            for n in chain]


def check_copies_equal(plan, node_data):
    for cluster in plan["clusters"]:
        root, leaf = trained_stages(node_data, cluster["chain"])
        if not torch.equal(root["tok.weight"], leaf["head.weight"]):
            diff = (root["tok.weight"] - leaf["head.weight"]).abs().max().item()
            fail(f"cluster {cluster['index']}: the Root's tok.weight and the Leaf's head.weight differ by {diff}")
    print("each cluster's tok.weight (Root) and head.weight (Leaf) are bit for bit equal")


def check_merged(args, plan, node_data, shards):
    merged = os.path.join(args.work, "trained.pt")
    run([args.clusterize, "--merge", node_data, "--out", merged])
    model = torch.jit.load(merged)
    if model.tok.weight.data_ptr() != model.head.weight.data_ptr():
        fail("the merged model's tok.weight and head.weight are two tensors")
    blocks = blocks_of([os.path.join(shards, "val_000.bin")])
    model.eval()
    for cluster in plan["clusters"]:
        result = json.load(open(os.path.join(node_data, "nodes", cluster["chain"][-1], "result.json")))["eval"]
        data = torch.stack(blocks[:result["samples"]])
        with torch.no_grad():
            loss = torch.nn.functional.cross_entropy(model(data[:, :-1]).reshape(-1, VOCAB),
                                                     data[:, 1:].reshape(-1)).item()
        print(f"cluster {cluster['index']}: Leaf's validation loss {result['loss']:.7f} on {result['samples']} "
              f"blocks, the merged model in PyTorch {loss:.7f}")
        if abs(result["loss"] - loss) > LOSS_RTOL * loss:
            fail(f"cluster {cluster['index']}: validation loss {result['loss']} vs the merged model's {loss}")


def recorded(node_data, root):
    folder = os.path.join(node_data, "nodes", root)
    ids = [json.loads(line)["ids"] for line in open(os.path.join(folder, "sample_ids.jsonl"))]
    losses = [m["loss"] for m in map(json.loads, open(os.path.join(folder, "metrics.jsonl"))) if "step" in m]
    return ids, losses


def case_gradients(args):
    steps = 4
    model_path, shards = prepare(args, {"max_steps": steps, "sync": "gradients", "clip_grad_norm": CLIP,
                                        "optimizer": {"name": "sgd", "lr": LR, "momentum": MOMENTUM}})
    plan, node_data = plan_and_train(args, model_path)
    train = blocks_of(sorted(os.path.join(shards, f) for f in os.listdir(shards) if f.startswith("train_")))
    runs = [recorded(node_data, c["chain"][0]) for c in plan["clusters"]]
    for ids, losses in runs:
        if len(ids) != steps or len(losses) != steps:
            fail(f"expected {steps} recorded batches and losses, got {len(ids)} and {len(losses)}")
    model = torch.jit.load(model_path)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for step in range(steps):
        optimizer.zero_grad()
        for c, (ids, losses) in enumerate(runs):
            blocks = torch.stack([train[i] for i in ids[step]])
            x, y = blocks[:, :-1], blocks[:, 1:]
            total = 0.0
            for xs, ys in zip(x.chunk(MICROBATCHES), y.chunk(MICROBATCHES)):
                loss = torch.nn.functional.cross_entropy(model(xs).reshape(-1, VOCAB), ys.reshape(-1),
                                                         reduction="sum") / y.numel()
                (loss / len(runs)).backward()
                total += loss.item()
            print(f"step {step} cluster {c}: provider loss {losses[step]:.7f}, PyTorch {total:.7f}")
            if abs(losses[step] - total) > LOSS_RTOL * total:
                fail(f"step {step} cluster {c}: provider loss {losses[step]} vs PyTorch {total}")
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP).item()
        if step == 0 and norm <= CLIP:
            fail(f"the first step's gradient norm {norm} is not clipped: the test would not check clipping")
        optimizer.step()
    want = dict(model.named_parameters())
    want["head.weight"] = model.tok.weight
    worst, compared = 0.0, 0
    for cluster in plan["clusters"]:
        for stage in trained_stages(node_data, cluster["chain"]):
            for name, p in stage.items():
                worst = max(worst, (p - want[name]).abs().max().item())
                compared += 1
    print(f"max abs difference of the trained weights to PyTorch: {worst:.3g} ({compared} tensors)")
    if not worst <= WEIGHT_ATOL:
        fail(f"trained weights differ from PyTorch by {worst}")
    check_copies_equal(plan, node_data)
    check_merged(args, plan, node_data, shards)


def case_average(args):
    model_path, shards = prepare(args, {"max_steps": 5, "sync": "average", "local_steps": 2,
                                        "optimizer": {"name": "adam", "lr": 0.003}})
    plan, node_data = plan_and_train(args, model_path)
    check_copies_equal(plan, node_data)
    check_merged(args, plan, node_data, shards)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("case", choices=["gradients", "average"])
    parser.add_argument("--provider", required=True)
    parser.add_argument("--clusterize", required=True)
    parser.add_argument("--work", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    shutil.rmtree(args.work, ignore_errors=True)
    globals()["case_" + args.case](args)
    print("PASS")


if __name__ == "__main__":
    main()
