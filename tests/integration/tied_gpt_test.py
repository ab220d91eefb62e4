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
  diloco     sync "diloco" every 2 steps (outer SGD with Nesterov momentum) with Adam, 5 steps:
             only the Root's copy has outer state; the Leaf's takes its weights after each sync.
  relay      1 cluster of 3 stages cut before blocks.0 and blocks.1: the Root holds tok.weight,
             the Leaf head.weight and the Stem between them relays; the same reference and checks
             as gradients (one cluster).
  async      with training_definition.schedule "async", clusterize refuses every cut between tok
             and head (plan.json names the parameter and the schedule), and a provider given the
             split plan of a sync job with the schedule changed to async exits 2 naming it.
  carry      clusterize --resume-from across cuts that keep and split the tied pair: 1 cluster,
             SGD with momentum, 8 steps checkpointed every 2; plan A keeps tok and head in one stage (cut before
             tok), B splits them (cut before blocks.1) and resumes from A's step 4, C keeps them
             together again and resumes from B's step 6. B's and C's step losses equal A's (within
             1e-5: the tied gradient's two parts are added in another order) and the three merged
             models are equal: the Leaf's copy took A's momentum for the parameter it never held
             by that name, and the copies of B came back as one.
gradients, average, diloco and relay: plan.json lists tok.weight as shared by the first and the
last stage of each cluster and rings only tok.weight (not head.weight); in each cluster the Root's
tok.weight and the Leaf's head.weight end bit for bit equal; `clusterize --merge` gives a model whose tok.weight and head.weight are one
tensor, and that model evaluated in PyTorch on the validation shard gives each Leaf's reported
validation loss.
"""
import json
import os
import subprocess
import sys

import numpy as np
import torch

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "../.."))
sys.path.insert(0, os.path.join(REPO, "tests/clusterize"))
from make_models import Gpt  # noqa: E402
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from batch_free_test import fail, main_of, run  # noqa: E402  (exit on failure, run a command, the CLI)

BLOCK, VOCAB = 16, 256
BATCH, MICROBATCHES = 8, 2
LR, MOMENTUM, CLIP = 0.1, 0.9, 0.5
# Losses: float32 sums of BATCH * BLOCK cross-entropy terms (~20 at first: the tied head turns the
# N(0, 1) embedding into large logits) over the same kernels per stage instead of whole, and the two
# clusters' gradients averaged in another order: 1e-5 relative is ~100 ulps. Weights (~0.01..1)
# after 4 steps of the same updates: 1e-5 absolute (measured 1.2e-7).
LOSS_RTOL = 1e-5
WEIGHT_ATOL = 1e-5


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


def clusterize(args, model, out, cuts=None, clusters=2):
    command = [args.clusterize, "--model", model, "--nodes", os.path.join(args.work, "node_configs.json"),
               "--job", os.path.join(args.work, "job.json"), "--clusters", str(clusters),
               "--input-shape", f"{BATCH // MICROBATCHES},{BLOCK}", "--input-dtype", "int64", "--out", out]
    if cuts:
        command += ["--cuts", ",".join(map(str, cuts))]
    run(command)
    return json.load(open(os.path.join(out, "plan.json")))


def unit_indices(plan, labels):
    found = [u["index"] for label in labels for u in plan["units"] if u["label"].startswith(label + " ")]
    if len(found) != len(labels):
        fail(f"units {labels} not all found in plan.json: {plan['units']}")
    return found


def plan_and_train(args, model, before=("blocks.1",), clusters=2):
    probe = clusterize(args, model, os.path.join(args.work, "probe"), clusters=clusters)
    cuts = unit_indices(probe, before)
    for cut in cuts:
        if not probe["units"][cut]["cut_before_allowed"]:
            fail(f"the cut before unit {cut} is not allowed: {probe['units'][cut]}")
    node_data = os.path.join(args.work, "node_data")
    plan = clusterize(args, model, node_data, cuts, clusters)
    last = len(cuts)
    for cluster in plan["clusters"]:
        shared = cluster["shared_parameters"]
        if len(cluster["chain"]) != last + 1 or len(shared) != 1 or shared[0]["name"] != "tok.weight" or \
                shared[0]["stages"] != [0, last] or shared[0]["local_names"] != ["tok.weight", "head.weight"]:
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
        stages = trained_stages(node_data, cluster["chain"])
        root, leaf = stages[0], stages[-1]
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


def case_gradients(args, before=("blocks.1",), clusters=2):
    steps = 4
    model_path, shards = prepare(args, {"max_steps": steps, "sync": "gradients", "clip_grad_norm": CLIP,
                                        "optimizer": {"name": "sgd", "lr": LR, "momentum": MOMENTUM}})
    plan, node_data = plan_and_train(args, model_path, before, clusters)
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


def case_diloco(args):
    model_path, shards = prepare(args, {"max_steps": 5, "local_steps": 2,
                                        "sync": {"name": "diloco", "outer_lr": 0.7, "outer_momentum": 0.9,
                                                 "outer_nesterov": True},
                                        "optimizer": {"name": "adam", "lr": 0.003}})
    plan, node_data = plan_and_train(args, model_path)
    check_copies_equal(plan, node_data)
    check_merged(args, plan, node_data, shards)


def case_relay(args):
    case_gradients(args, ("blocks.0", "blocks.1"), clusters=1)


def case_async(args):
    model_path, _ = prepare(args, {"max_steps": 2, "optimizer": {"name": "sgd", "lr": LR}})
    node_data = os.path.join(args.work, "node_data")
    probe = clusterize(args, model_path, os.path.join(args.work, "probe"), clusters=1)
    cut = unit_indices(probe, ["blocks.1"])[0]
    clusterize(args, model_path, node_data, [cut], clusters=1)
    job_path = os.path.join(args.work, "job.json")
    job = json.load(open(job_path))
    job["training_definition"]["schedule"] = "async"
    json.dump(job, open(job_path, "w"))
    # The provider, given the split plan with the schedule changed to async: exit 2, naming it.
    served = json.load(open(os.path.join(node_data, "job.json")))
    served["training_definition"]["schedule"] = "async"
    json.dump(served, open(os.path.join(node_data, "job.json"), "w"))
    leaf = json.load(open(os.path.join(node_data, "plan.json")))["clusters"][0]["chain"][-1]
    proc = subprocess.run([args.provider, "--name", leaf, "--node-data", node_data], timeout=120,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(proc.stdout[-1500:])
    if proc.returncode != 2 or "async schedule" not in proc.stdout or "tok.weight" not in proc.stdout:
        fail(f"a provider given a split tied plan with the async schedule exited {proc.returncode}")
    # clusterize with the async job keeps tok and head in one stage.
    refused = clusterize(args, model_path, os.path.join(args.work, "async_probe"), clusters=1)
    why = refused["units"][cut].get("why_not", "")
    if refused["units"][cut]["cut_before_allowed"] or "head.weight = tok.weight" not in why or "async" not in why:
        fail(f"clusterize with schedule async allows the cut before blocks.1: {refused['units'][cut]}")
    print(f"async: cut {cut} refused: {why}")


def step_losses(node_data):
    plan = json.load(open(os.path.join(node_data, "plan.json")))
    leaf = os.path.join(node_data, "nodes", plan["clusters"][0]["chain"][-1], "metrics.jsonl")
    return {r["step"]: r["loss"] for r in map(json.loads, open(leaf)) if "step" in r and "loss" in r}


def case_carry(args):
    # SGD with momentum, not Adam: the attention key bias's gradient is zero up to rounding (softmax
    # ignores a shift shared by every key), and Adam scales that rounding noise, which another cut
    # orders differently, up to whole steps (2e-4 after 8 steps here); momentum carries the state
    # that must move with the run (the Leaf's head copy takes the momentum of tok.weight) without it.
    model_path, _ = prepare(args, {"max_steps": 8, "checkpoint_every": 2, "keep_checkpoints": 10,
                                   "optimizer": {"name": "sgd", "lr": LR, "momentum": MOMENTUM}})
    probe = clusterize(args, model_path, os.path.join(args.work, "probe"), clusters=1)
    together, apart = unit_indices(probe, ["tok"]), unit_indices(probe, ["blocks.1"])
    env = dict(os.environ, PROVIDER=args.provider)

    def planned(name, cuts, resume=()):
        out = os.path.join(args.work, name)
        clusterize_args = list(resume)
        command = [args.clusterize, "--model", model_path, "--nodes", os.path.join(args.work, "node_configs.json"),
                   "--job", os.path.join(args.work, "job.json"), "--clusters", "1",
                   "--input-shape", f"{BATCH // MICROBATCHES},{BLOCK}", "--input-dtype", "int64",
                   "--cuts", ",".join(map(str, cuts)), "--out", out, *clusterize_args]
        run(command)
        launch = [os.path.join(REPO, "tools/launch_local"), out] + (["--", "--resume"] if resume else [])
        proc = subprocess.run(launch, env=env, timeout=300, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
        if proc.returncode != 0:
            sys.stdout.write(proc.stdout[-4000:])
            fail(f"launch_local {name} exited {proc.returncode}")
        shared = json.load(open(os.path.join(out, "plan.json")))["clusters"][0]["shared_parameters"]
        return out, step_losses(out), shared

    a, losses_a, shared_a = planned("a", together)
    b, losses_b, shared_b = planned("b", apart, ["--resume-from", a, "--resume-step", "4"])
    c, losses_c, shared_c = planned("c", together, ["--resume-from", b, "--resume-step", "6"])
    if shared_a or not shared_b or shared_c:
        fail(f"plans A and C must keep tok and head together, B split them: {shared_a}, {shared_b}, {shared_c}")
    if sorted(losses_a) != list(range(1, 9)) or sorted(losses_b) != [5, 6, 7, 8] or sorted(losses_c) != [7, 8]:
        fail(f"steps logged: A {sorted(losses_a)}, B {sorted(losses_b)}, C {sorted(losses_c)}")
    worst = max(abs(losses_a[s] - other[s]) / abs(losses_a[s])
                for other in (losses_b, losses_c) for s in other)
    print(f"carried runs: max relative loss difference to the uninterrupted run {worst:.3g}")
    if worst > LOSS_RTOL:
        fail("a carried run's losses differ from the uninterrupted run's")
    merged = []
    for node_data in (a, b, c):
        out = os.path.join(node_data, "trained.pt")
        run([args.clusterize, "--merge", node_data, "--out", out])
        merged.append(dict(torch.jit.load(out).named_parameters()))
    diff = max((m[k] - merged[0][k]).abs().max().item() for m in merged[1:] for k in merged[0])
    print(f"merged models A, B, C: max abs difference {diff:.3g}")
    if diff > WEIGHT_ATOL:
        fail("the carried runs' trained models differ from the uninterrupted run's")


if __name__ == "__main__":
    main_of(["gradients", "average", "diloco", "relay", "async", "carry"], globals(), __doc__)
