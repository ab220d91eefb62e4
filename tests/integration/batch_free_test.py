#!/usr/bin/python3
"""Tensors without a batch dimension across a cut (issue [R]): real `provider` processes on tcp
loopback (tools/launch_local) train a tiny GPT cut by `clusterize --cuts` so that the positions
from torch.arange(T), a position embedding and the attention mask, as float and as bool (no batch
dimension), the transposed token embedding (batch dimension 1) and the activations (dimension 0)
cross a cut.

    batch_free_test.py CASE --provider BUILD/node/provider --clusterize BUILD/clusterize/clusterize
                       --work DIR --port BASE

CASE:
  positions_cross  3 stages (cuts before pos2 and before b2), 3 SGD+momentum steps of 2
                   micro-batches: node.json records batch_dim null / 1 / 0 as profiled, and the
                   per-step losses and the trained weights equal PyTorch (python) training the
                   unsplit model on the Root's recorded batches, micro-batch by micro-batch, and
                   the final evaluation's loss equals that model's on the test blocks.
                   Before [R] the Leaf dropped every activation message ("shape": the positions
                   [16] taken to be 16 samples) and the run hung until the peer timeout.
  positions_cross_int8  the same with training_definition.wire.activations "int8": the float
                   tensors cross as int8 rows with scales (the transposed one batched in dimension 1,
                   the batch-free embedding and mask as planned); no message is dropped and each
                   step's loss is within 1% of the fp32 reference (int8 rows carry each value to
                   within 1/254 of its row's largest, ~0.4%).

The model is tests/clusterize/make_models.py's LatePosGpt (256 byte tokens, 16 positions).
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
from make_models import LatePosGpt  # noqa: E402

BLOCK = 16
VOCAB = 256
BATCH, MICROBATCHES, STEPS = 8, 2, 3
LR, MOMENTUM = 0.1, 0.9
# The losses are float32 sums of BATCH * BLOCK cross-entropy terms of ~5.5 (ulp ~5e-7) over the
# same kernels in another order (per stage vs whole): 1e-5 relative is ~100 ulps. The weights
# (~0.1..1) get the same updates, summed in the same micro-batch order: 1e-5 absolute.
LOSS_RTOL = 1e-5
WEIGHT_ATOL = 1e-5


def fail(message):
    print("FAIL: " + message, file=sys.stderr)
    sys.exit(1)


def run(command, **kwargs):
    proc = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kwargs)
    if proc.returncode != 0:
        sys.stdout.write(proc.stdout[-4000:])
        fail(f"{command[0]} exited {proc.returncode}")
    return proc.stdout


def unit_index(plan, prefix):
    for unit in plan["units"]:
        if unit["label"].startswith(prefix):
            return unit["index"]
    fail(f"no unit labelled {prefix!r} in plan.json")


def make_inputs(work, port, wire="fp32"):
    os.makedirs(work, exist_ok=True)
    torch.manual_seed(0)
    model = os.path.join(work, "model.pt")
    net = LatePosGpt(vocab=VOCAB, block=BLOCK)
    torch.jit.save(torch.jit.script(net), model)
    corpus = os.path.join(work, "corpus.bin")
    np.random.default_rng(1).integers(0, VOCAB, 4000, dtype=np.uint8).tofile(corpus)
    configs = {str(i): {"IP": f"127.0.0.1:{port + i}", "benchmarks": {"ram": 1, "bandwidth": 1000}}
               for i in range(3)}
    job = {"format": 2, "job_id": "batch-free", "driver": "cairn", "model": model,
           "data": {"location": corpus, "format": "tokens", "block_length": BLOCK},
           "training_definition": {
               "batch_size": BATCH, "microbatches": MICROBATCHES, "epochs": 0, "max_steps": STEPS,
               "seed": 3, "loss_fn": "cross_entropy", "lr_scheduler": "constant", "eval_every": 0,
               "optimizer": {"name": "sgd", "lr": LR, "momentum": MOMENTUM},
               "wire": {"activations": wire},
               "record_sample_ids": True, "timeouts": {"startup_s": 30, "peer_s": 60}}}
    for name, doc in (("node_configs.json", configs), ("job.json", job)):
        with open(os.path.join(work, name), "w") as f:
            json.dump(doc, f)
    return model, corpus


def clusterize(args, model, out, cuts=None):
    command = [args.clusterize, "--model", model, "--nodes", os.path.join(args.work, "node_configs.json"),
               "--job", os.path.join(args.work, "job.json"), "--clusters", "1",
               "--input-shape", f"{BATCH // MICROBATCHES},{BLOCK}", "--input-dtype", "int64", "--out", out]
    if cuts:
        command += ["--cuts", ",".join(map(str, cuts))]
    run(command)
    return json.load(open(os.path.join(out, "plan.json")))


def check_batch_dims(node_data, chain):
    """The stage after the first cut receives the positions, the position embedding and the mask
    (float and bool) without a batch dimension, the transposed tokens batched in dimension 1, the activations in 0."""
    inputs = json.load(open(os.path.join(node_data, "nodes", chain[1], "node.json")))["inputs"]
    seen = sorted((v["dtype"], len(v["shape"]), v["batch_dim"] if v["batch_dim"] is not None else -1)
                  for v in inputs)
    expected = sorted([("int64", 1, -1), ("bool", 2, -1), ("float32", 2, -1), ("float32", 2, -1),
                       ("float32", 3, 1), ("float32", 3, 0)])
    if seen != expected:
        fail(f"{chain[1]}'s inputs (dtype, dims, batch_dim): {seen}, expected {expected}")


def reference(model_path, corpus, recorded):
    """PyTorch training the unsplit model as the providers do: each step's batch in MICROBATCHES
    consecutive micro-batches, each one's summed cross entropy over the batch's token count,
    backward per micro-batch; returns the per-step losses and the trained model."""
    tokens = torch.from_numpy(np.fromfile(corpus, dtype=np.uint8).astype(np.int64))
    model = torch.jit.load(model_path)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    losses = []
    for entry in recorded:
        blocks = torch.stack([tokens[i * BLOCK:i * BLOCK + BLOCK + 1] for i in entry["ids"]])
        x, y = blocks[:, :-1], blocks[:, 1:]
        optimizer.zero_grad()
        total = 0.0
        for xs, ys in zip(x.chunk(MICROBATCHES), y.chunk(MICROBATCHES)):
            loss = torch.nn.functional.cross_entropy(model(xs).reshape(-1, VOCAB), ys.reshape(-1),
                                                     reduction="sum") / y.numel()
            loss.backward()
            total += loss.item()
        optimizer.step()
        losses.append(total)
    return losses, model


def check_evaluation(leaf, corpus, trained):
    """The run's final evaluation (evaluation batches carry the positions across the cuts too)
    equals the PyTorch-trained model's mean cross entropy over the test blocks (the last 10%)."""
    result = json.load(open(os.path.join(leaf, "result.json")))["eval"]
    tokens = torch.from_numpy(np.fromfile(corpus, dtype=np.uint8).astype(np.int64))
    blocks = (len(tokens) - 1) // BLOCK
    first = blocks - result["samples"]
    data = torch.stack([tokens[i * BLOCK:i * BLOCK + BLOCK + 1] for i in range(first, blocks)])
    trained.eval()
    with torch.no_grad():
        loss = torch.nn.functional.cross_entropy(trained(data[:, :-1]).reshape(-1, VOCAB),
                                                 data[:, 1:].reshape(-1)).item()
    print(f"evaluation on {result['samples']} blocks: pipeline loss {result['loss']:.7f}, PyTorch {loss:.7f}")
    if abs(result["loss"] - loss) > LOSS_RTOL * loss:
        fail(f"evaluation loss {result['loss']} vs PyTorch {loss}")


def case_positions_cross(args, wire="fp32", loss_rtol=LOSS_RTOL):
    model, corpus = make_inputs(args.work, args.port, wire)
    probe = clusterize(args, model, os.path.join(args.work, "probe"))
    cuts = [unit_index(probe, "pos2 "), unit_index(probe, "b2 ")]
    node_data = os.path.join(args.work, "node_data")
    plan = clusterize(args, model, node_data, cuts)
    chain = plan["clusters"][0]["chain"]
    if len(chain) != 3:
        fail(f"expected 3 stages at cuts {cuts}, got {chain}")
    check_batch_dims(node_data, chain)
    env = dict(os.environ, PROVIDER=args.provider)
    proc = subprocess.run([os.path.join(REPO, "tools/launch_local"), node_data], env=env, timeout=300,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sys.stdout.write(proc.stdout[-4000:])
    if proc.returncode != 0:
        fail(f"launch_local exited {proc.returncode}")
    transport = [line for line in proc.stdout.splitlines() if "] transport: " in line]
    if len(transport) != 3 or any(", 0 dropped" not in line for line in transport):
        fail(f"a provider dropped pipeline messages: {transport}")
    root = os.path.join(node_data, "nodes", chain[0])
    recorded = [json.loads(line) for line in open(os.path.join(root, "sample_ids.jsonl"))]
    losses = [m["loss"] for m in map(json.loads, open(os.path.join(root, "metrics.jsonl"))) if "step" in m]
    if len(recorded) != STEPS or len(losses) != STEPS:
        fail(f"expected {STEPS} recorded batches and losses, got {len(recorded)} and {len(losses)}")
    expected, trained = reference(model, corpus, recorded)
    for step, (got, want) in enumerate(zip(losses, expected)):
        print(f"step {step}: provider loss {got:.7f}, PyTorch {want:.7f}")
        if abs(got - want) > loss_rtol * abs(want):
            fail(f"step {step}: provider loss {got} vs PyTorch {want}")
    if wire != "fp32":
        return
    check_evaluation(os.path.join(node_data, "nodes", chain[-1]), corpus, trained)
    want = dict(trained.named_parameters())
    worst, compared = 0.0, 0
    for node in chain:
        stage = torch.jit.load(os.path.join(node_data, "nodes", node, "trained_stage.pt"))
        for name, p in stage.named_parameters():
            worst = max(worst, (p - want[name]).abs().max().item())
            compared += 1
    print(f"max abs difference of the trained weights to PyTorch: {worst:.3g} ({compared} tensors)")
    if compared != len(want):
        fail(f"compared {compared} parameters, the model has {len(want)}")
    if not worst <= WEIGHT_ATOL:
        fail(f"trained weights differ from PyTorch by {worst}")


def case_positions_cross_int8(args):
    case_positions_cross(args, "int8", 1e-2)


def main_of(cases, namespace, doc):
    """The command line of a static-plan case script: CASE --provider --clusterize --work --port;
    runs namespace["case_" + CASE] in a fresh work folder and prints PASS."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("case", choices=cases)
    parser.add_argument("--provider", required=True)
    parser.add_argument("--clusterize", required=True)
    parser.add_argument("--work", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    shutil.rmtree(args.work, ignore_errors=True)
    namespace["case_" + args.case](args)
    print("PASS")


if __name__ == "__main__":
    main_of(["positions_cross", "positions_cross_int8"], globals(), __doc__)
