#!/usr/bin/python3
"""Integration tests: real `provider` processes on tcp loopback, started by tools/launch_local
(2 clusters: two_clusters_test.py, which shares this file's helpers and main_of).

    provider_cluster_test.py CASE --provider BUILD/node/provider --work DIR --port BASE

CASE:
  three_nodes     3 providers train a Fashion-MNIST slice for 150 steps: test accuracy > 80%,
                  the Leaf received exactly the sample ids the Root sent, step by step, and every
                  message between them went over the same-host link (result.json transport)
  one_node        the same model as a one-node cluster (Root and Leaf at once)
  match_pytorch   3 providers, 20 SGD+momentum steps of a BatchNorm-free CNN: the trained stage
                  weights equal PyTorch (python) training the unsplit model on the Root's recorded
                  batches, max abs diff <= 1e-5. With --device cuda (the GPU script, issue [M])
                  providers and reference train on the GPU, fp32-strict (strict_device)
  launcher_stops_all  one node cannot load its stage: tools/launch_local returns that node's exit
                  code (2) and stops the others long before their startup timeout
  clusterize_merge  the real chain: clusterize cuts the BatchNorm CNN for 3 nodes, providers train
                  it, clusterize --merge puts the trained stages back into the original model; the
                  merged model, evaluated here by PyTorch itself on the same test images, gives the
                  pipeline's own reported accuracy and loss
  stranger        a plan with CURVE keys (cairn_keys); a forger claiming to be the Root floods the
                  Stem with well-formed activations before the real Root starts: with keys
                  (no key / a wrong key) the per-step losses equal an undisturbed run exactly;
                  with --insecure (the control) the same forgery changes them
  never_starts    only the Root starts: it fails (non-zero, within the configured time + slack)
                  naming its missing neighbour in the startup-timeout error
"""
import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import torch

from in_process import run_script  # examples/ scripts in this interpreter (no second torch import)

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "../.."))
EXAMPLE = os.path.join(REPO, "examples/fashion_mnist")
FASHION = "/usr/share/datasets/fashion-mnist"
MEAN, STD = 0.2860, 0.3530
MASK = (1 << 64) - 1
KEYS = None


def keys_binary(args):
    """--keys, or cairn_keys in the build the provider comes from."""
    return args.keys or os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(args.provider))),
                                     "clusterize", "cairn_keys")


def fail(message):
    print("FAIL: " + message, file=sys.stderr)
    sys.exit(1)


def make_node_data(work, port, stages, batchnorm, settings, data_settings):
    os.makedirs(work, exist_ok=True)
    model = os.path.join(work, "model.pt")
    run_script(os.path.join(EXAMPLE, "make_model.py"),
               ["--out", model] + ([] if batchnorm else ["--no-batchnorm"]))
    configs = {str(i): {"IP": f"127.0.0.1:{port + i}", "benchmarks": {"ram": 1, "bandwidth": 1000}} for i in range(3)}
    with open(os.path.join(work, "node_configs.json"), "w") as f:
        json.dump(configs, f)
    node_data = os.path.join(work, "node_data")
    shutil.rmtree(node_data, ignore_errors=True)
    cmd = ["--model", model, "--nodes", os.path.join(work, "node_configs.json"), "--out", node_data,
           "--stages", str(stages)]
    cmd += [a for k, v in settings.items() for a in ("--set", f"{k}={json.dumps(v)}")]
    cmd += [a for k, v in data_settings.items() for a in ("--data-set", f"{k}={json.dumps(v)}")]
    run_script(os.path.join(EXAMPLE, "make_node_data_by_hand.py"), cmd)
    # Providers run secured by default: give the hand-made plan keys as clusterize would.
    subprocess.run([KEYS, node_data], check=True, stdout=subprocess.DEVNULL)
    return model, node_data


def launch(node_data, provider, limit, provider_args=(), env=None, output=None):
    """tools/launch_local over node_data, `env` added; their whole log appended to `output` if given."""
    start, command = time.time(), [os.path.join(REPO, "tools/launch_local"), node_data] + (["--", *provider_args] if provider_args else [])
    proc = subprocess.run(command, env=dict(os.environ, PROVIDER=provider, **(env or {})), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=limit)
    sys.stdout.write(proc.stdout[-4000:])
    (output if output is not None else []).append(proc.stdout)
    if proc.returncode != 0:
        fail(f"launch_local exited {proc.returncode}")
    return time.time() - start


def metrics(node_data, node):
    with open(os.path.join(node_data, "nodes", node, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def check_accuracy(node_data, leaf, floor):
    result = json.load(open(os.path.join(node_data, "nodes", leaf, "result.json")))
    accuracy = result["eval"]["accuracy"]
    print(f"test accuracy {accuracy:.4f} on {result['eval']['samples']} samples ({result['steps']} steps)")
    if not accuracy > floor:
        fail(f"accuracy {accuracy:.4f} is not above {floor}")
    for node in os.listdir(os.path.join(node_data, "nodes")):
        if not os.path.exists(os.path.join(node_data, "nodes", node, "trained_stage.pt")):
            fail(f"{node} wrote no trained_stage.pt")


def training_settings(steps):
    return {"batch_size": 32, "microbatches": 4, "epochs": 0, "max_steps": steps, "seed": 1,
            "optimizer": {"name": "adamw", "lr": 0.003}, "lr_scheduler": {"name": "cosine"},
            "record_sample_ids": True, "timeouts": {"startup_s": 30, "peer_s": 60}}


# three_nodes and one_node: 150 steps of 32 reach 85 % on the slice's 2,000 test images (the 300
# they used to train added 3 points and 10-15 s, not a behaviour).
SLICE_STEPS, SLICE_SAMPLES = 150, 6000


def case_three_nodes(args):
    _, node_data = make_node_data(args.work, args.port, 3, True, training_settings(SLICE_STEPS),
                                  {"train_samples": SLICE_SAMPLES, "test_samples": 2000})
    seconds = launch(node_data, args.provider, 240)
    print(f"3 providers: {seconds:.1f} s")
    check_accuracy(node_data, "node_2", 0.80)
    root, leaf = metrics(node_data, "node_0"), metrics(node_data, "node_2")
    root_steps = [m for m in root if "step" in m]
    leaf_steps = [m for m in leaf if "step" in m]
    if len(root_steps) != SLICE_STEPS or len(leaf_steps) != SLICE_STEPS:
        fail(f"expected {SLICE_STEPS} step records, got {len(root_steps)} (root) and {len(leaf_steps)} (leaf)")
    recorded = [json.loads(line) for line in open(os.path.join(node_data, "nodes/node_0/sample_ids.jsonl"))]
    seen = set()
    for r, l, ids in zip(root_steps, leaf_steps, recorded):
        expected = sum(splitmix64(i) for i in ids["ids"]) & MASK
        if len(ids["ids"]) != 32 or len(set(ids["ids"])) != 32:
            fail(f"step {ids['step']}: the Root did not send 32 distinct samples")
        if l["sample_checksum"] != expected or r["sample_checksum"] != expected:
            fail(f"step {r['step']}: the Leaf's sample ids (checksum {l['sample_checksum']}) are not the ones "
                 f"the Root recorded ({expected})")
        if abs(r["loss"] - l["loss"]) > 1e-9:
            fail(f"step {r['step']}: Root and Leaf disagree on the loss")
        seen.update(ids["ids"])
    # 150 steps x 32 = 4800 of 6000 samples: one epoch, so no sample twice.
    if len(seen) != SLICE_STEPS * 32:
        fail(f"an epoch repeated samples: {len(seen)} distinct of {SLICE_STEPS * 32}")
    print(f"sample ids aligned at the Leaf on all {SLICE_STEPS} steps")
    # All three providers listen on loopback: every message between them went over the same-host
    # socket (docs/PROTOCOL.md "Same-host links"), none over TCP.
    for name in ("node_0", "node_1", "node_2"):
        t = json.load(open(os.path.join(node_data, "nodes", name, "result.json")))["transport"]
        if not (0 < t["messages_sent"] == t["messages_sent_same_host"]) or \
                t["messages_received"] != t["messages_received_same_host"]:
            fail(f"{name}: not every message went over the same-host link: {t}")
    print("every message between the 3 providers went over same-host links")


def case_one_node(args):
    _, node_data = make_node_data(args.work, args.port, 1, True, training_settings(SLICE_STEPS),
                                  {"train_samples": SLICE_SAMPLES, "test_samples": 2000})
    seconds = launch(node_data, args.provider, 240)
    print(f"1 provider: {seconds:.1f} s")
    check_accuracy(node_data, "node_0", 0.80)


def load_idx(name, offset):
    return np.frombuffer(gzip.open(os.path.join(FASHION, name)).read(), np.uint8, offset=offset)


def microbatched_step(forward, x, y, microbatches):
    """Forward and backward of one step the way a provider does it, in PyTorch: the batch in
    `microbatches` consecutive micro-batches, each one's summed cross entropy over the whole
    batch's size, backward per micro-batch (the gradients add up); returns the step's loss, the
    sum of the micro-batches'. A reference computed the same way as the run it checks: the
    whole batch at once sums the gradients in another order (1e-5 apart after 20 steps)."""
    total = 0.0
    for xs, ys in zip(x.chunk(microbatches), y.chunk(microbatches)):
        loss = torch.nn.functional.cross_entropy(forward(xs), ys, reduction="sum") / len(y)
        loss.backward()
        total += loss.item()
    return total


def strict_device(name, settings):
    """torch.device(name); on CUDA both sides compute alike: "fp32-strict" for the providers (the
    job's precision), no TF32 and deterministic algorithms for this process's reference."""
    if torch.device(name).type == "cuda":
        settings["precision"] = "fp32-strict"
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        torch.backends.cudnn.benchmark = False
        torch.use_deterministic_algorithms(True)
    return torch.device(name)


def case_match_pytorch(args):
    settings = {"batch_size": 32, "microbatches": 4, "epochs": 0, "max_steps": 20, "seed": 5,
                "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9, "weight_decay": 0.001},
                "lr_scheduler": "constant",
                "record_sample_ids": True, "timeouts": {"startup_s": 30, "peer_s": 60}}
    device = strict_device(args.device, settings)
    model_path, node_data = make_node_data(args.work, args.port, 3, False, settings,
                                           {"train_samples": 2000, "test_samples": 100})
    seconds = launch(node_data, args.provider, 120, ["--device", args.device])
    print(f"3 providers on {args.device}: 20 steps in {seconds:.1f} s (start-up included)")
    images = torch.tensor(load_idx("train-images-idx3-ubyte.gz", 16).reshape(-1, 1, 28, 28).copy())
    labels = torch.tensor(load_idx("train-labels-idx1-ubyte.gz", 8).astype(np.int64))
    images, labels = images.to(device), labels.to(device)
    model = torch.jit.load(model_path, map_location=device)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=0.001)
    recorded = [json.loads(line) for line in open(os.path.join(node_data, "nodes/node_0/sample_ids.jsonl"))]
    losses = [m["loss"] for m in metrics(node_data, "node_0") if "step" in m]
    if len(recorded) != 20:
        fail(f"expected 20 recorded batches, got {len(recorded)}")
    for step, entry in enumerate(recorded):
        ids = torch.tensor(entry["ids"], device=device)
        x = (images[ids].float() / 255 - MEAN) / STD
        optimizer.zero_grad()
        loss = microbatched_step(model, x, labels[ids], settings["microbatches"])
        optimizer.step()
        if abs(loss - losses[step]) > 1e-5:
            fail(f"step {step}: provider loss {losses[step]} vs PyTorch {loss}")
    reference = dict(model.named_parameters())
    worst, compared = 0.0, 0
    for node in ("node_0", "node_1", "node_2"):
        trained = torch.jit.load(os.path.join(node_data, "nodes", node, "trained_stage.pt"))
        for name, p in trained.named_parameters():
            worst = max(worst, (p - reference[name].cpu()).abs().max().item())
            compared += 1
    if compared != len(reference):
        fail(f"compared {compared} parameters, the model has {len(reference)}")
    print(f"max abs difference to PyTorch after 20 steps: {worst:.3g}")
    if not worst <= 1e-5:
        fail(f"trained weights differ from PyTorch by {worst}")


def make_clusters_node_data(work, port, stages, settings, data, keys):
    """One node_data folder for len(stages) clusters, cluster c cut by hand into stages[c] stages
    (nodes numbered on, ports port + number). Rings as clusterize forms them: tensors grouped by the
    node holding them in each cluster, one ring per group, members in cluster order. Returns
    (node_data, node names per cluster, rings)."""
    os.makedirs(work, exist_ok=True)
    model = os.path.join(work, "model.pt")
    run_script(os.path.join(EXAMPLE, "make_model.py"), ["--out", model])
    first = [sum(stages[:c]) for c in range(len(stages))]  # node number of each cluster's Root
    nodes = [[f"node_{first[c] + i}" for i in range(stages[c])] for c in range(len(stages))]
    parts = []
    for c in range(len(stages)):
        cluster = os.path.join(work, f"cluster{c}")
        os.makedirs(cluster, exist_ok=True)
        configs = {str(first[c] + i): {"IP": f"127.0.0.1:{port + first[c] + i}",
                                       "benchmarks": {"ram": 1, "bandwidth": 1000}} for i in range(stages[c])}
        with open(os.path.join(cluster, "node_configs.json"), "w") as f:
            json.dump(configs, f)
        out = os.path.join(cluster, "node_data")
        cmd = ["--model", model, "--nodes", os.path.join(cluster, "node_configs.json"), "--out", out,
               "--stages", str(stages[c])]
        for k, v in settings.items():
            cmd += ["--set", f"{k}={json.dumps(v)}"]
        for k, v in data.items():
            cmd += ["--data-set", f"{k}={json.dumps(v)}"]
        run_script(os.path.join(EXAMPLE, "make_node_data_by_hand.py"), cmd)
        parts.append(out)
    # Merge every cluster into cluster 0's folder.
    node_data = parts[0]
    for c in range(1, len(stages)):
        for name in nodes[c]:
            shutil.copytree(os.path.join(parts[c], "nodes", name), os.path.join(node_data, "nodes", name))
    specs = {}
    for name in sum(nodes, []):
        path = os.path.join(node_data, "nodes", name, "node.json")
        specs[name] = (path, json.load(open(path)))
    holder = [{t: name for name in nodes[c] for t in specs[name][1]["parameters"] + specs[name][1]["buffers"]}
              for c in range(len(stages))]
    groups = {}  # (holder in each cluster) -> tensor names, in order of first appearance
    for name in nodes[0]:
        for t in specs[name][1]["parameters"] + specs[name][1]["buffers"]:
            groups.setdefault(tuple(h[t] for h in holder), []).append(t)
    rings = [{"id": f"ring_{i}", "parameters": tensors,
              "members": [{"name": n, "address": specs[n][1]["address"]} for n in members]}
             for i, (members, tensors) in enumerate(groups.items())]
    for c in range(len(stages)):
        for name in nodes[c]:
            path, spec = specs[name]
            spec["cluster"] = c
            spec["extra"]["num_clusters"] = len(stages)
            spec["rings"] = [dict(r, rank=c) for r in rings if r["members"][c]["name"] == name]
            json.dump(spec, open(path, "w"), indent=1)
    plan_path = os.path.join(node_data, "plan.json")
    plan = json.load(open(plan_path))
    plan["num_clusters"] = len(stages)
    json.dump(plan, open(plan_path, "w"))
    # Keys last: they cover the neighbours and the ring peers written above.
    subprocess.run([keys, node_data], check=True, stdout=subprocess.DEVNULL)
    return node_data, nodes, rings


def losses_of(node_data, node):
    return [m["loss"] for m in metrics(node_data, node) if "step" in m]


def run_attacked(args, node_data, forger_mode, provider_args):
    """Stem and Leaf start, the forger sends everything it can, then the Root starts."""
    procs = {}
    def start(name):
        procs[name] = subprocess.Popen([args.provider, "--name", name, "--node-data", node_data] + provider_args,
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    start("node_1")
    start("node_2")
    if forger_mode:
        time.sleep(1.0)  # let the Stem bind (only makes the forgery more likely to land)
        out = subprocess.run([args.forger, "--node-data", node_data, "--target", "node_1", "--claim", "node_0",
                              "--mode", forger_mode, "--steps", "20", "--microbatches", "4",
                              "--micro-batch-size", "8"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, timeout=60)
        print(f"forger ({forger_mode}): {out.stdout.strip().splitlines()[-1]}")
    start("node_0")
    codes = {}
    for name, proc in procs.items():
        out, _ = proc.communicate(timeout=120)
        codes[name] = proc.returncode
        if proc.returncode != 0:
            print(f"[{name}] " + "\n[{name}] ".join(out.strip().splitlines()[-5:]))
    return codes


def case_stranger(args):
    settings = {"batch_size": 32, "microbatches": 4, "epochs": 0, "max_steps": 20, "seed": 3,
                "optimizer": {"name": "sgd", "lr": 0.05}, "lr_scheduler": "constant", "threads": 1,
                "timeouts": {"startup_s": 30, "peer_s": 30}}
    _, node_data = make_node_data(args.work, args.port, 3, False, settings,
                                  {"train_samples": 1000, "test_samples": 100})
    codes = run_attacked(args, node_data, None, [])
    if any(codes.values()):
        fail(f"the undisturbed secured run failed: {codes}")
    reference = losses_of(node_data, "node_0")
    if len(reference) != 20:
        fail(f"expected 20 losses, got {len(reference)}")
    for mode in ("plain", "wrong_key"):
        codes = run_attacked(args, node_data, mode, [])
        if any(codes.values()):
            fail(f"secured run with a {mode} forger failed: {codes}")
        attacked = losses_of(node_data, "node_0")
        worst = max(abs(a - b) for a, b in zip(attacked, reference))
        transport = json.load(open(os.path.join(node_data, "nodes/node_1/result.json")))["transport"]
        print(f"{mode} forger vs CURVE: max loss difference {worst:.3g}; Stem transport {transport}")
        if len(attacked) != 20 or worst > 1e-9:
            fail(f"a {mode} forger changed the training (max loss difference {worst})")
        if mode == "wrong_key" and transport["connections_refused"] < 1:
            fail("the Stem did not refuse the forger's key")
    # The control: without CURVE the very same forgery is taken (so the check above can fail).
    codes = run_attacked(args, node_data, "plain", ["--insecure"])
    attacked = losses_of(node_data, "node_0") if codes["node_0"] == 0 else []
    changed = len(attacked) != 20 or max(abs(a - b) for a, b in zip(attacked, reference)) > 1e-6
    print(f"control (--insecure): exit codes {codes}, training changed: {changed}")
    if not changed:
        fail("the forgery had no effect even without CURVE: the test proves nothing")


def case_never_starts(args):
    settings = dict(training_settings(10), timeouts={"startup_s": 3, "peer_s": 10})
    _, node_data = make_node_data(args.work, args.port, 3, True, settings, {"train_samples": 1000})
    start = time.time()
    proc = subprocess.run([args.provider, "--name", "node_0", "--node-data", node_data],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    seconds = time.time() - start
    print(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "(no stderr)")
    print(f"exit code {proc.returncode} after {seconds:.1f} s")
    if proc.returncode == 0:
        fail("the provider succeeded without its neighbour")
    if not 3.0 <= seconds <= 3.0 + 7.0:
        fail(f"took {seconds:.1f} s; the startup timeout is 3 s")
    last = proc.stderr.strip().splitlines()[-1]
    if "startup timeout" not in last or "node_1" not in last or f"127.0.0.1:{args.port + 1}" not in last:
        fail(f"the error does not name the missing neighbour: {last}")


def case_launcher_stops_all(args):
    settings = dict(training_settings(10), timeouts={"startup_s": 60, "peer_s": 60})
    _, node_data = make_node_data(args.work, args.port, 3, True, settings, {"train_samples": 1000})
    env = dict(os.environ, PROVIDER=args.provider)
    launcher = os.path.join(REPO, "tools/launch_local")
    # --device-of: a node the plan lacks is refused before any provider starts; a device given to
    # one node replaces the shared --device for it alone (cuda:99 is refused on every machine:
    # no CUDA in this build, or fewer GPUs), so node_1 fails naming it, exit 2.
    proc = subprocess.run([launcher, node_data, "--device-of", "node_9=cpu"], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    if proc.returncode != 2 or "--device-of node_9: no node node_9" not in proc.stdout:
        fail(f"launch_local --device-of node_9: expected exit 2 naming node_9, got {proc.returncode}: "
             f"{proc.stdout[-500:]}")
    proc = subprocess.run([launcher, node_data, "--device-of", "node_1=cuda:99", "--", "--device", "cpu"],
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    if proc.returncode != 2 or "[node_1] provider: error: --device cuda:99: " not in proc.stdout:
        fail(f"launch_local --device-of node_1=cuda:99: expected node_1's refusal (exit 2), got "
             f"{proc.returncode}: {proc.stdout[-800:]}")
    with open(os.path.join(node_data, "nodes/node_2/stage.pt"), "wb") as f:
        f.write(b"not a TorchScript file")
    start = time.time()
    proc = subprocess.run([launcher, node_data], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    seconds = time.time() - start
    print(proc.stdout[-2000:])
    print(f"launch_local exit code {proc.returncode} after {seconds:.1f} s")
    if proc.returncode != 2:
        fail(f"expected node_2's exit code 2, got {proc.returncode}")
    if seconds > 20:
        fail(f"the other providers were not stopped ({seconds:.1f} s; their startup timeout is 60 s)")
    if "[node_2]" not in proc.stdout or "stage.pt: cannot load" not in proc.stdout:
        fail("node_2's error line (prefixed [node_2]) is missing")


def case_clusterize_merge(args):
    if not args.clusterize:
        fail("clusterize_merge needs --clusterize")
    os.makedirs(args.work, exist_ok=True)
    model = os.path.join(args.work, "model.pt")
    run_script(os.path.join(EXAMPLE, "make_model.py"), ["--out", model])
    configs = {str(i): {"IP": f"127.0.0.1:{args.port + i}", "benchmarks": {"ram": 1, "bandwidth": 10000}}
               for i in range(3)}
    test_samples = 2000
    job = {"format": 1, "job_id": "merge-check", "driver": "cairn", "model": model,
           "data": {"location": FASHION, "format": "idx", "normalize": {"mean": [MEAN], "std": [STD]},
                    "train_samples": 8000, "test_samples": test_samples},
           "training_definition": training_settings(150)}
    for name, doc in (("node_configs.json", configs), ("job.json", job)):
        with open(os.path.join(args.work, name), "w") as f:
            json.dump(doc, f)
    node_data = os.path.join(args.work, "node_data")
    subprocess.run([args.clusterize, "--model", model, "--nodes", os.path.join(args.work, "node_configs.json"),
                    "--job", os.path.join(args.work, "job.json"), "--clusters", "1",
                    "--input-shape", "8,1,28,28", "--out", node_data,
                    # The cut is fixed (conv block 1 | conv block 2 | classifier): the planner's own
                    # choice follows profiled timings and could, on some machine, be one stage.
                    "--cuts", "7,14"], check=True)
    chain = json.load(open(os.path.join(node_data, "plan.json")))["clusters"][0]["chain"]
    if len(chain) < 2:
        fail(f"clusterize planned a single stage ({chain}); this case needs a pipeline")
    launch(node_data, args.provider, 240)
    result = json.load(open(os.path.join(node_data, "nodes", chain[-1], "result.json")))["eval"]
    merged = os.path.join(args.work, "trained.pt")
    subprocess.run([args.clusterize, "--merge", node_data, "--out", merged], check=True)
    net = torch.jit.load(merged)
    net.eval()
    images = load_idx("t10k-images-idx3-ubyte.gz", 16).reshape(-1, 1, 28, 28)[:test_samples]
    labels = torch.from_numpy(load_idx("t10k-labels-idx1-ubyte.gz", 8)[:test_samples].astype(np.int64))
    x = (torch.from_numpy(images.astype(np.float32)) / 255.0 - MEAN) / STD
    with torch.no_grad():
        logits = torch.cat([net(x[i:i + 250]) for i in range(0, test_samples, 250)])
    loss = torch.nn.functional.cross_entropy(logits, labels).item()
    accuracy = (logits.argmax(1) == labels).double().mean().item()
    print(f"{len(chain)}-stage pipeline: accuracy {result['accuracy']:.4f}, loss {result['loss']:.6f}; "
          f"merged model in PyTorch: accuracy {accuracy:.4f}, loss {loss:.6f}")
    if result["samples"] != test_samples:
        fail(f"the pipeline evaluated {result['samples']} samples, expected {test_samples}")
    if abs(accuracy - result["accuracy"]) > 1e-9:
        fail("the merged model's accuracy differs from the pipeline's")
    if abs(loss - result["loss"]) > 1e-4 * max(1.0, loss):
        fail("the merged model's loss differs from the pipeline's")
    if accuracy <= 0.70:
        fail(f"accuracy {accuracy:.4f} after 150 steps is not above 0.70")


def main_of(cases, namespace, add_args=lambda parser: None):
    """A case file's main (here, two_clusters_test.py, failure_test.py): case_CASE(args), PASS."""
    global KEYS
    parser = argparse.ArgumentParser()
    parser.add_argument("case", choices=cases)
    parser.add_argument("--provider", required=True)
    parser.add_argument("--work", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--keys", help="cairn_keys binary; default: next to the provider's build")
    add_args(parser)  # the file's own flags
    args = parser.parse_args()
    KEYS = keys_binary(args)
    torch.set_num_threads(1)
    shutil.rmtree(args.work, ignore_errors=True)
    namespace["case_" + args.case](args)
    print("PASS")


def main():
    def add_args(parser):
        parser.add_argument("--clusterize", help="clusterize binary (clusterize_merge)")
        parser.add_argument("--forger", help="forge_peer binary (stranger)")
        parser.add_argument("--device", default="cpu",
                            help="match_pytorch: where the providers and the reference train (cpu, cuda)")
    main_of(["three_nodes", "one_node", "match_pytorch", "never_starts", "launcher_stops_all",
             "clusterize_merge", "stranger"], globals(), add_args)


if __name__ == "__main__":
    main()
