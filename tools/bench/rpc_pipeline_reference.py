#!/usr/bin/python3
"""PyTorch's RPC-based pipeline of the Fashion-MNIST CNN, the reference for cairn's
"1 cluster x 2 nodes pipeline" row (tools/bench/run_all table 4).

    /usr/bin/python3 tools/bench/rpc_pipeline_reference.py --model model.pt --batch-size 128 \
        --microbatches 4 --threads 1 --steps 400 --eval-every 50 --target 0.85

The approach of seed 001 (torch.distributed.rpc + distributed autograd; the PyTorch tutorial
"Distributed Pipeline Parallelism Using RPC"): 2 processes (torch.multiprocessing.spawn), TensorPipe
RPC on 127.0.0.1; each process owns one shard (worker0: conv1 bn1 relu — the same cut as
clusterize's 2-stage plan of this model — and worker1: pool conv2 bn2 relu pool flatten fc) created
with rpc.remote; worker0 also drives: it splits the batch into --microbatches, sends each through
shard 1 (p1.remote().forward) and shard 2 (p2.rpc_async().forward) without waiting, so micro-batches
overlap, concatenates the logits, and runs dist_autograd.backward + DistributedOptimizer(AdamW) in
one distributed-autograd context per step. Same initial weights, data normalisation, optimizer
(AdamW lr 0.003 weight decay 0.01, constant), global batch and torch intra-op threads as cairn.
Timing as in ddp_reference.py (step_timing.py: interval from the end of the previous step, batch
selection included; the step after an evaluation counts as the median step; start-up excluded).
Prints one JSON line.
"""
import argparse
import json
import os
import threading
import time

import torch
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.optim import DistributedOptimizer
from torch.distributed.rpc import RRef

import fmnist_common as common
import step_timing


class Rest(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.conv2, self.bn2, self.fc = m.conv2, m.bn2, m.fc

    def forward(self, x):
        x = F.max_pool2d(x, 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        return self.fc(torch.flatten(x, 1))


class Shard(nn.Module):
    """One pipeline stage living on its worker; the lock serialises concurrent RPC calls."""

    def __init__(self, index, model_pt, threads):
        super().__init__()
        torch.set_num_threads(threads)
        m = common.make_model(model_pt)
        self.net = nn.Sequential(m.conv1, m.bn1, nn.ReLU()) if index == 0 else Rest(m)
        self._lock = threading.Lock()

    def forward(self, x_rref):
        x = x_rref.to_here()
        with self._lock:
            return self.net(x)

    def set_training(self, mode):
        self.train(mode)

    def parameter_rrefs(self):
        return [RRef(p) for p in self.parameters()]


class DistPipe(nn.Module):
    def __init__(self, microbatches, model_pt, threads):
        super().__init__()
        self.microbatches = microbatches
        self.p1 = rpc.remote("worker0", Shard, args=(0, model_pt, threads))
        self.p2 = rpc.remote("worker1", Shard, args=(1, model_pt, threads))

    def forward(self, xs):
        futures = []
        for x in xs.chunk(self.microbatches, dim=0):
            y_rref = self.p1.remote().forward(RRef(x))
            futures.append(self.p2.rpc_async().forward(y_rref))
        return torch.cat(torch.futures.wait_all(futures))

    def set_training(self, mode):
        self.p1.rpc_sync().set_training(mode)
        self.p2.rpc_sync().set_training(mode)

    def parameter_rrefs(self):
        return self.p1.remote().parameter_rrefs().to_here() + self.p2.remote().parameter_rrefs().to_here()


def train(args):
    torch.manual_seed(args.seed)
    x, y = common.load_split(args.data, True, args.train_samples)
    tx, ty = common.load_split(args.data, False, args.test_samples)
    model = DistPipe(args.microbatches, args.model, args.threads)
    optimizer = DistributedOptimizer(torch.optim.AdamW, model.parameter_rrefs(), lr=args.lr,
                                     weight_decay=0.01)
    generator = torch.Generator().manual_seed(args.seed)
    per_epoch = len(x) // args.batch_size
    step, times, evals, reached = 0, [], [], None
    last = time.perf_counter()
    while step < args.steps:
        order = torch.randperm(len(x), generator=generator)
        for b in range(per_epoch):
            ids = order[b * args.batch_size:(b + 1) * args.batch_size]
            inputs, targets = x[ids], y[ids]
            with dist_autograd.context() as context_id:
                loss = F.cross_entropy(model(inputs), targets)
                dist_autograd.backward(context_id, [loss])
                optimizer.step(context_id)
            now = time.perf_counter()
            times.append(now - last)
            last = now
            step += 1
            if args.eval_every and (step % args.eval_every == 0 or step == args.steps):
                model.set_training(False)
                acc = common.accuracy(model, tx, ty)
                model.set_training(True)
                evals.append({"step": step, "accuracy": acc})
                if reached is None and acc >= args.target:
                    reached = evals[-1]
                    if args.stop_at_target:
                        step = args.steps
            if step >= args.steps:
                break
    fig = step_timing.figures(times, evals, args.eval_every, args.warmup, args.batch_size, args.target)
    print(json.dumps({
        "side": "pytorch_rpc_pipeline", "procs": 2, "batch_size": args.batch_size,
        "microbatches": args.microbatches, "steps": len(times), "target": args.target, **fig,
        "last_accuracy": evals[-1]["accuracy"] if evals else None,
        "evals": evals, "step_times": [round(t, 6) for t in times]}), flush=True)


def worker(rank, args):
    torch.set_num_threads(args.threads)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    options = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{args.port}")
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=2, rpc_backend_options=options)
    if rank == 0:
        train(args)
    rpc.shutdown()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="TorchScript model.pt (initial weights)")
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per process")
    p.add_argument("--lr", type=float, default=0.003)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--eval-every", type=int, default=0)
    p.add_argument("--target", type=float, default=0.85)
    p.add_argument("--stop-at-target", action="store_true")
    p.add_argument("--train-samples", type=int, default=0)
    p.add_argument("--test-samples", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--port", type=int, default=29541)
    args = p.parse_args()
    mp.spawn(worker, args=(args,), nprocs=2, join=True)


if __name__ == "__main__":
    main()
