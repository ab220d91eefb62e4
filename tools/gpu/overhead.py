#!/usr/bin/env python3
"""Issue [M]'s figures 2 and 3 (tools/gpu/gpu_figures.sh runs this on the GPU machine):

  2. overhead: one provider training the whole model (1 stage) on DEVICE vs PyTorch's own training
     loop in Python on DEVICE, samples/s, for the demo CNN and the tiny GPT (goal >= 1.0x);
  3. pipeline on one device: the tiny GPT in 2 stages, 2 providers sharing DEVICE, 4 micro-batches,
     vs 1 provider (goal >= 0.9x), with the providers' own split of a step (compute/send/wait).
     --at-once: the same 2 stages again with every packet sent at once and every copy on the
     compute stream (CAIRN_TEST_SEND_LATER=0, trainer/Device.cpp), as before a GPU stage held its
     packets back until its next pass was queued and copied on a stream of its own
     (docs/TRAINING.md "Sending later", "The copy stream"): what both gain, side by side.

    overhead.py --build BUILD --work DIR [--device cuda] [--steps 300] [--port 27300]
                [--models cnn,gpt] [--gpt-dim 128 --gpt-heads 4] [--batch N] [--at-once]

A launch-bound variant (--models gpt --gpt-dim 8 --gpt-heads 2 --batch 2: almost no arithmetic
per op) compares what each side spends per op on the host: the dispatcher, TorchScript's
interpreter, autograd and the trainer's own work, without the device's compute.

Both sides train the same TorchScript model (the examples' make_model.py), batch size, optimizer
(AdamW) and data; the provider's figure is result.json's train_samples_per_s (its whole run), the
reference's the same count over its whole loop (after the same number of warm-up steps: none);
next to it the median step after the first 10 of each side (the reference reads each step's loss,
as a provider does for its metrics line).
Prints one line per figure and writes DIR/figures.json. Here, without a GPU, `--device cpu
--steps 20` checks the script, not the figures.
"""
import argparse
import gzip
import json
import os
import subprocess
import sys
import time

# One BLAS thread, as a provider multiplies (core/BlasThreads.h), read when torch loads the BLAS:
# on the CPU a reference multiplying on every core measured threads, not overhead (0.80x against
# 1.02-1.04x with one thread each for the GPT on 2 cores, 2026-12-01).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "../.."))
FASHION = "/usr/share/datasets/fashion-mnist"


def run(command, **kwargs):
    proc = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kwargs)
    if proc.returncode != 0:
        sys.stdout.write(proc.stdout[-3000:])
        raise SystemExit(f"overhead: {' '.join(map(str, command[:3]))} ... exited {proc.returncode}")
    return proc.stdout


class Model:
    def __init__(self, name, work, steps):
        self.name = name
        self.dir = os.path.join(work, name)
        os.makedirs(self.dir, exist_ok=True)
        self.model = os.path.join(self.dir, "model.pt")
        example = os.path.join(REPO, "examples", "fashion_mnist" if name == "cnn" else "tiny_gpt")
        size = ["--dim", str(ARGS.gpt_dim), "--heads", str(ARGS.gpt_heads)] if name == "gpt" else []
        run([sys.executable, os.path.join(example, "make_model.py"), "--out", self.model, *size])
        job = json.load(open(os.path.join(example, "job.json")))
        if name == "gpt":
            corpus = os.path.join(self.dir, "corpus.txt")
            run(["bash", os.path.join(example, "make_corpus.sh"), corpus])
            job["data"]["location"] = corpus
            self.shape, self.dtype = "16,64", "int64"
        else:
            self.shape, self.dtype = "32,1,28,28", "float32"
        t = job["training_definition"]
        if ARGS.batch:
            t["batch_size"] = ARGS.batch
            self.shape = f"{ARGS.batch}," + self.shape.split(",", 1)[1]
        t.update({"epochs": 0, "max_steps": steps, "eval_every": 0, "lr_scheduler": "constant",
                  "timeouts": {"startup_s": 120, "peer_s": 120}})
        for key in ("sync", "local_steps"):
            t.pop(key, None)
        self.job = job

    def plan(self, nodes, port, microbatches, cuts=None):
        """node_data for one cluster of `nodes` providers; returns (folder, plan)."""
        out = os.path.join(self.dir, f"stages_{nodes}")
        configs = {str(i): {"IP": f"127.0.0.1:{port + i}",
                            "benchmarks": {"ram": 64, "bandwidth": 100000}} for i in range(nodes)}
        os.makedirs(out, exist_ok=True)
        json.dump(configs, open(os.path.join(out, "node_configs.json"), "w"))
        job = json.loads(json.dumps(self.job))
        job["training_definition"]["microbatches"] = microbatches
        json.dump(job, open(os.path.join(out, "job.in.json"), "w"))
        command = [os.path.join(ARGS.build, "clusterize/clusterize"), "--model", self.model,
                   "--nodes", os.path.join(out, "node_configs.json"), "--job",
                   os.path.join(out, "job.in.json"), "--clusters", "1", "--input-shape", self.shape,
                   "--input-dtype", self.dtype, "--out", out]
        if self.name == "gpt":
            command += ["--granularity", "expand-containers"]
        if cuts is not None:
            command += ["--cuts", str(cuts)]
        run(command)
        return out, json.load(open(os.path.join(out, "plan.json")))

    def train(self, node_data, env_extra=None):
        """Trains through providers (`env_extra` added to their environment); returns (samples/s of
        the run, each node's mean step split)."""
        env = dict(os.environ, PROVIDER=os.path.join(ARGS.build, "node/provider"), **(env_extra or {}))
        run([os.path.join(REPO, "tools/launch_local"), node_data, "--", "--device", ARGS.device,
            ], env=env, timeout=1800)
        plan = json.load(open(os.path.join(node_data, "plan.json")))
        chain = plan["clusters"][0]["chain"]
        result = json.load(open(os.path.join(node_data, "nodes", chain[-1], "result.json")))
        split = {}
        for node in chain:
            records = [json.loads(line) for line in open(os.path.join(node_data, "nodes", node, "metrics.jsonl"))]
            steps = [r for r in records if "step" in r and "compute_s" in r]
            split[node] = {k: float(np.mean([r[k] for r in steps])) for k in
                           ("compute_s", "send_s", "wait_s", "later_sends", "held_through_receives")
                           if all(k in r for r in steps)}  # the last two where sends are held back
            # the steady step: the median after the first 10 (start-up, kernel selection)
            split[node]["median_step_ms"] = float(np.median(
                [1e3 * self.job["training_definition"]["batch_size"] / r["samples_per_s"] for r in steps[10:]]))
        return result["train_samples_per_s"], split

    def batches(self, device):
        """A function giving the step's (inputs, targets) on `device`, from the same data."""
        batch = self.job["training_definition"]["batch_size"]
        if self.name == "cnn":
            with gzip.open(os.path.join(FASHION, "train-images-idx3-ubyte.gz")) as f:
                images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)
            with gzip.open(os.path.join(FASHION, "train-labels-idx1-ubyte.gz")) as f:
                labels = np.frombuffer(f.read(), np.uint8, offset=8).astype(np.int64)
            x = (torch.tensor(images.copy()).float() / 255 - 0.2860) / 0.3530
            y = torch.tensor(labels)
        else:
            data = open(self.job["data"]["location"], "rb").read()
            block = self.job["data"]["block_length"]
            tokens = torch.tensor(np.frombuffer(data, np.uint8).astype(np.int64))
            n = (len(tokens) - 1) // block
            x = tokens[: n * block].view(n, block)
            y = tokens[1: n * block + 1].view(n, block)
        x, y = x.pin_memory() if device.type == "cuda" else x, y
        generator = torch.Generator().manual_seed(0)

        def next_batch():
            ids = torch.randint(0, len(x), (batch,), generator=generator)
            return (x[ids].to(device, non_blocking=True), y[ids].to(device, non_blocking=True))
        return next_batch


def pytorch_step(net, optimizer, x, y):
    """One step of PyTorch's own loop: zero_grad, forward, loss, backward, step."""
    optimizer.zero_grad(set_to_none=True)
    out = net(x)
    loss = torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
    loss.backward()
    optimizer.step()
    loss.item()  # as a provider reads every step's loss for its metrics line


def reference_samples_per_s(model, steps):
    """PyTorch's own loop in Python on the device: zero_grad, forward, loss, backward, step."""
    device = torch.device(ARGS.device)
    if device.type == "cpu":
        # the provider's intra-op threads (job.json "threads"): on the CPU a reference with torch's
        # default (every core) measured threads, not overhead (the dry run here said 0.74x for the
        # GPT with 2 threads against 1; with 1 thread each, 0.92-1.10x)
        torch.set_num_threads(int(model.job["training_definition"].get("threads", 1)))
    net = torch.jit.load(model.model, map_location=device)
    net.train()
    o = model.job["training_definition"]["optimizer"]
    optimizer = torch.optim.AdamW(net.parameters(), lr=o["lr"], weight_decay=o.get("weight_decay", 0.01))
    next_batch = model.batches(device)
    batch = model.job["training_definition"]["batch_size"]
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    step_ms = []
    for _ in range(steps):
        began = time.perf_counter()
        pytorch_step(net, optimizer, *next_batch())
        step_ms.append(1e3 * (time.perf_counter() - began))
    if device.type == "cuda":
        torch.cuda.synchronize()
    return steps * batch / (time.perf_counter() - start), float(np.median(step_ms[10:]))


def balanced_cut(plan):
    """The allowed cut that halves the model's blocks (its units holding parameters): two stages
    of equal work, whatever small units (sizes, positions, embeddings) come first."""
    weighted = [u["index"] for u in plan["units"] if "(" in u["label"]]  # modules, not aten:: ops
    if not weighted:
        raise SystemExit("overhead: the plan has no module units")
    target = weighted[len(weighted) // 2]
    allowed = [u["index"] for u in plan["units"] if u["cut_before_allowed"] and u["index"] > 0]
    if not allowed:
        raise SystemExit("overhead: the plan allows no cut")
    return min(allowed, key=lambda i: abs(i - target))


def main():
    figures = {"device": ARGS.device, "steps": ARGS.steps, "torch": torch.__version__}
    port = ARGS.port
    for name in ARGS.models.split(","):
        model = Model(name, ARGS.work, ARGS.steps)
        node_data, one_stage = model.plan(1, port, 1)
        provider, split = model.train(node_data)
        port += 10
        reference, reference_ms = reference_samples_per_s(model, ARGS.steps)
        provider_ms = split["node_0"]["median_step_ms"]
        figures[f"{name}_one_provider_samples_per_s"] = provider
        figures[f"{name}_pytorch_loop_samples_per_s"] = reference
        figures[f"{name}_one_provider_median_step_ms"] = provider_ms
        figures[f"{name}_pytorch_loop_median_step_ms"] = reference_ms
        print(f"figure 2, {name}: one provider {provider:.0f} samples/s, PyTorch loop {reference:.0f} "
              f"samples/s on {ARGS.device}: {provider / reference:.2f}x; median step after the first "
              f"10: {provider_ms:.2f} ms vs {reference_ms:.2f} ms, {reference_ms / provider_ms:.2f}x "
              f"(split {split})")
        if name == "gpt" and model.job["training_definition"]["batch_size"] < 4:
            print("figure 3 skipped: a batch smaller than its 4 micro-batches")
        elif name == "gpt":
            node_data, _ = model.plan(1, port, 4)
            single, _ = model.train(node_data)
            port += 10
            node_data, _ = model.plan(2, port, 4, balanced_cut(one_stage))
            piped, split = model.train(node_data)
            port += 10
            figures.update({"gpt_1_provider_m4_samples_per_s": single,
                            "gpt_2_stages_m4_samples_per_s": piped, "gpt_2_stages_split": split})
            print(f"figure 3, gpt: 2 stages on one {ARGS.device} (M=4) {piped:.0f} samples/s vs 1 "
                  f"provider {single:.0f}: {piped / single:.2f}x; per-step split {split}")
            if ARGS.at_once:
                node_data, _ = model.plan(2, port, 4, balanced_cut(one_stage))
                at_once, at_once_split = model.train(node_data, {"CAIRN_TEST_SEND_LATER": "0"})
                port += 10
                figures.update({"gpt_2_stages_m4_at_once_samples_per_s": at_once,
                                "gpt_2_stages_at_once_split": at_once_split})
                print(f"figure 3, gpt: 2 stages sending later {piped:.0f} samples/s vs at once "
                      f"{at_once:.0f}: {piped / at_once:.2f}x; at once, per-step split {at_once_split}")
    json.dump(figures, open(os.path.join(ARGS.work, "figures.json"), "w"), indent=2)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build", required=True)
    parser.add_argument("--work", required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--port", type=int, default=27300)
    parser.add_argument("--models", default="cnn,gpt", help="which of cnn,gpt to run")
    parser.add_argument("--gpt-dim", type=int, default=128)
    parser.add_argument("--gpt-heads", type=int, default=4)
    parser.add_argument("--batch", type=int, default=0, help="batch size (0: the example's job.json)")
    parser.add_argument("--at-once", action="store_true",
                        help="figure 3 again with every packet sent at once and every copy on the "
                             "compute stream (CAIRN_TEST_SEND_LATER=0)")
    ARGS = parser.parse_args()
    if set(ARGS.models.split(",")) - {"cnn", "gpt"}:
        parser.error("--models takes cnn, gpt or both")
    main()
