#!/usr/bin/python3
"""PyTorch's own data-parallel training of the Fashion-MNIST CNN, the reference for cairn's
"2 clusters x 1 node, gradients" row (tools/bench/run_all table 4).

    /usr/bin/python3 tools/bench/ddp_reference.py --model model.pt --procs 2 --batch-size 128 \
        --threads 1 --steps 400 --eval-every 50 --target 0.85

Idiomatic DDP: torch.multiprocessing.spawn of --procs processes, gloo process group on 127.0.0.1,
DistributedDataParallel around the model, DistributedSampler (shuffle, seed 0), global batch
--batch-size (each process takes batch/procs), AdamW(lr, weight_decay 0.01), constant lr, cross
entropy, torch.set_num_threads(--threads) in every process. Same initial weights and data
normalisation as cairn (fmnist_common.py). Timing (step_timing.py, the same rule as the cairn
side): on rank 0 each step's time is the interval from the end of the previous step (the first:
from the start of the training loop) to the end of this one, so it includes the DataLoader's
batch, forward, backward with DDP's all-reduce, and AdamW, as cairn's step records do; the step
after each evaluation counts as the median step (its interval holds the evaluation pause);
start-up (spawn, data, process group) is never timed; samples/s counts steps after --warmup; time
to target = the sum of the step times until the first evaluation at or above --target.
Evaluation: rank 0, full test set (or --test-samples), every --eval-every steps. Prints one JSON
line.

--task gpt trains the tiny GPT (examples/tiny_gpt/make_model.py, initial weights from --model) on
the byte tokens of --corpus split as cairn's `tokens` format splits them (gpt_common.py), cross
entropy over every token; the evaluation is the validation loss and --target is reached at or
below it (tools/bench/netem_bench.py --model gpt).
"""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import fmnist_common as common
import gpt_common
import step_timing


def worker(rank, args):
    torch.set_num_threads(args.threads)
    os.environ["MASTER_ADDR"] = args.master_addr
    os.environ["MASTER_PORT"] = str(args.port)
    dist.init_process_group("gloo", rank=rank, world_size=args.procs)
    torch.manual_seed(args.seed)
    gpt = args.task == "gpt"
    if gpt:
        (x, y), (tx, ty) = gpt_common.load_splits(args.corpus, args.block, args.test_fraction,
                                                  args.train_samples, args.test_samples)
        model = DDP(gpt_common.make_model(args.model, block=args.block))
        loss_of, metric = gpt_common.loss, "loss"
    else:
        x, y = common.load_split(args.data, True, args.train_samples)
        tx, ty = common.load_split(args.data, False, args.test_samples) if rank == 0 else (None, None)
        model = DDP(common.make_model(args.model))
        loss_of, metric = F.cross_entropy, "accuracy"
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, num_replicas=args.procs, rank=rank, shuffle=True,
                                 seed=args.seed, drop_last=True)
    loader = DataLoader(dataset, batch_size=args.batch_size // args.procs, sampler=sampler,
                        drop_last=True, num_workers=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    step, times, evals, reached = 0, [], [], None
    epoch = 0
    last = time.perf_counter()
    while step < args.steps:
        sampler.set_epoch(epoch)
        for inputs, targets in loader:
            optimizer.zero_grad(set_to_none=True)
            loss = loss_of(model(inputs), targets)
            loss.backward()
            optimizer.step()
            now = time.perf_counter()
            times.append(now - last)
            last = now
            step += 1
            if args.eval_every and (step % args.eval_every == 0 or step == args.steps):
                if rank == 0:
                    model.eval()
                    if gpt:
                        evals.append({"step": step, "loss": gpt_common.validation_loss(model.module, tx, ty)})
                    else:
                        evals.append({"step": step, "accuracy": common.accuracy(model.module, tx, ty)})
                    model.train()
                    if reached is None and step_timing.reached(evals[-1], args.target, metric):
                        reached = evals[-1]
                flag = torch.tensor([1 if reached else 0])
                dist.broadcast(flag, 0)
                if args.stop_at_target and int(flag):
                    step = args.steps
            if step >= args.steps:
                break
        epoch += 1
    if rank == 0:
        fig = step_timing.figures(times, evals, args.eval_every, args.warmup, args.batch_size,
                                  args.target, metric)
        print(json.dumps({
            "side": "pytorch_ddp", "procs": args.procs, "batch_size": args.batch_size,
            "steps": len(times), "target": args.target, **fig,
            "task": args.task, "last_accuracy": evals[-1].get("accuracy") if evals else None,
            "last_loss": evals[-1].get("loss") if evals else None,
            "evals": evals, "step_times": [round(t, 6) for t in times]}), flush=True)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="TorchScript model.pt (initial weights)")
    p.add_argument("--task", choices=["cnn", "gpt"], default="cnn", help="cnn: Fashion-MNIST and "
                   "the example CNN (target: test accuracy); gpt: the tiny GPT on --corpus (target: "
                   "validation loss, reached at or below it)")
    p.add_argument("--corpus", help="--task gpt: the text file (examples/tiny_gpt/make_corpus.sh)")
    p.add_argument("--block", type=int, default=64, help="--task gpt: tokens per sample")
    p.add_argument("--test-fraction", type=float, default=0.1, help="--task gpt: data.test_fraction")
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=128, help="GLOBAL batch (all processes)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per process")
    p.add_argument("--lr", type=float, default=0.003)
    p.add_argument("--steps", type=int, default=400, help="most optimizer steps")
    p.add_argument("--warmup", type=int, default=10, help="steps left out of samples/s")
    p.add_argument("--eval-every", type=int, default=0)
    p.add_argument("--target", type=float, default=0.85)
    p.add_argument("--stop-at-target", action="store_true")
    p.add_argument("--train-samples", type=int, default=0)
    p.add_argument("--test-samples", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--port", type=int, default=29531)
    p.add_argument("--master-addr", default="127.0.0.1", help="rank 0's address (gloo rendezvous)")
    p.add_argument("--rank", type=int, default=-1,
                   help="run only this rank in this process (one process per rank, started by the "
                        "caller, e.g. tools/bench/netem_bench.py in separate network namespaces); "
                        "default: spawn all --procs ranks here")
    args = p.parse_args()
    if args.task == "gpt" and not args.corpus:
        p.error("--task gpt needs --corpus")
    if args.rank >= 0:
        worker(args.rank, args)
    else:
        mp.spawn(worker, args=(args,), nprocs=args.procs, join=True)


if __name__ == "__main__":
    main()
