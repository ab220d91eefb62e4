#!/usr/bin/python3
"""The one-process reference: the same model.pt trained by PyTorch in this one process on the same
training shards for the same number of tokens as the cairn job (clusters x max_steps x batch_size x
block_length), with the job's optimizer and learning-rate schedule.

    /usr/bin/python3 examples/subword_gpt/reference.py --job JOB.json --model model.pt \
        --train DIR --clusters 2 --out reference.pt [--threads 1]

cairn's clusters each take batch_size blocks per step from their own shards and average their
parameters every local_steps steps; the reference takes clusters x batch_size blocks per step from
all shards (reshuffled every epoch, the last partial batch dropped, as cairn's sampler does), i.e.
the data-parallel run that cairn's averaging approximates. Implemented: AdamW (torch.optim.AdamW)
and cairn's warmup_cosine schedule (trainer/LrSchedule.cpp), cross entropy, fp32.
"""
import argparse
import json
import math
import sys

sys.dont_write_bytecode = True  # no __pycache__ beside the example
import time

import numpy as np
import torch
import torch.nn.functional as F

import lm


def lr_at(step, base, warmup, total, min_lr=0.0):
    """cairn's warmup_cosine: linear warm-up, then cosine over the remaining steps."""
    if step < warmup:
        return base * (step + 1) / warmup
    horizon = total - warmup
    progress = min(1.0, (step - warmup) / horizon) if horizon > 0 else 0.0
    return min_lr + (base - min_lr) * 0.5 * (1 + math.cos(math.pi * progress))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--job", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--train", required=True, help="the folder of training shards")
    p.add_argument("--clusters", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    job = json.load(open(a.job))
    td, data = job["training_definition"], job["data"]
    opt, sched = td["optimizer"], td["lr_scheduler"]
    if opt["name"] != "adamw" or sched["name"] != "warmup_cosine" or td.get("loss_fn") != "cross_entropy" \
            or td.get("precision", "fp32") != "fp32" or td.get("clip_grad_norm", 0) or opt.get("param_groups"):
        sys.exit(f"reference: {a.job}: only adamw + warmup_cosine + cross_entropy in fp32, no clipping "
                 "or param_groups, are implemented here")
    torch.set_num_threads(a.threads)
    steps, batch, block = td["max_steps"], a.clusters * td["batch_size"], data["block_length"]
    train = lm.blocks_of(a.train, block)
    if len(train) < batch:
        sys.exit(f"reference: {len(train)} training blocks, fewer than one batch of {batch}")
    model = torch.jit.load(a.model)
    model.train()
    base = opt["lr"]
    optimizer = torch.optim.AdamW(model.parameters(), lr=base, betas=tuple(opt.get("betas", (0.9, 0.999))),
                                  eps=opt.get("eps", 1e-8), weight_decay=opt.get("weight_decay", 0.01))
    rng = np.random.default_rng(td.get("seed", 0))
    order, at = rng.permutation(len(train)), 0
    start = time.time()
    for step in range(steps):
        if at + batch > len(order):
            order, at = rng.permutation(len(train)), 0
        x = train[order[at:at + batch]]
        at += batch
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, base, sched.get("warmup_steps", 0), steps, sched.get("min_lr", 0.0))
        logits = model(x[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 50 == 0 or step == steps - 1:
            print(f"reference: step {step}/{steps} loss {loss.item():.4f}", flush=True)
    seconds = time.time() - start
    model.save(a.out)
    print(f"reference: {steps} steps x {batch} blocks x {block} tokens = {steps * batch * block} tokens "
          f"in {seconds:.1f} s ({a.threads} thread(s)); wrote {a.out}")


if __name__ == "__main__":
    main()
