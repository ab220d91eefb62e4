#!/usr/bin/env python3
"""ATen operators per training step: one provider training the whole model (1 stage) against
PyTorch's own loop in Python, for issue [M]'s figure 2 (docs/BENCHMARKS.md "GPU").

On a GPU each leaf operator is a kernel launch, and a step of small kernels (the tiny GPT's) is
bound by launches, not arithmetic; the operators a step dispatches are the same on the CPU. So this
counts them where there is no GPU: the provider with CAIRN_COUNT_OPS=PATH (core/OpCount.h, every
operator by name, RecordFunction's operator scope), run for S and for 2S steps so that start-up,
loading and the final evaluation cancel out (per step: the difference / S); PyTorch's loop
(tools/gpu/overhead.py's, the same model, data, batch and AdamW) under torch.autograd.profiler for
S steps after 3 uncounted ones, counting the events named aten::*. The reference runs twice:
AdamW's multi-tensor path (foreach=True, PyTorch 2's default on CUDA, which figure 2's reference
used) and its single-tensor path (1.13's default). For the GPT also figure 3's pipeline: 1 provider
against 2 stages (summed over both providers), 4 micro-batches, as overhead.py cuts it.

    op_count.py --build BUILD --work DIR [--steps 20] [--models gpt,cnn] [--top 15]
                [--gpt-dim 128 --gpt-heads 4] [--batch N]

Prints, per model, the operators per step of each side and the operators whose counts differ most;
writes DIR/op_count.json. Counts do not depend on the machine's speed (only on the code paths).
"""
import argparse
import json
import os
import sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import overhead  # noqa: E402  (Model: the models, jobs, plans and data figure 2 uses)


def counted(model, node_data, tag):
    """{op: count} summed over the providers of node_data's plan, trained with CAIRN_COUNT_OPS."""
    template = os.path.join(model.dir, f"ops_{tag}_{{node}}.json")
    model.train(node_data, {"CAIRN_COUNT_OPS": template})
    total = {}
    for node in json.load(open(os.path.join(node_data, "plan.json")))["clusters"][0]["chain"]:
        for k, v in json.load(open(template.replace("{node}", node)))["ops"].items():
            # aten:: operators, as on the reference's side (the operator scope also holds a few
            # other names: autograd's accumulation, TorchScript's own helpers)
            if k.startswith("aten::"):
                total[k] = total.get(k, 0) + v
    return total


def provider_ops(name, steps, port):
    """{op: count} of one provider training `name` (1 stage) for `steps` steps."""
    model = overhead.Model(name, os.path.join(ARGS.work, f"steps_{steps}"), steps)
    node_data, _ = model.plan(1, port, 1)
    return counted(model, node_data, "one"), model


def pipeline_ops(steps, port):
    """Figure 3's GPT with 4 micro-batches: ({op: count} of 1 provider, of 2 stages summed)."""
    model = overhead.Model("gpt", os.path.join(ARGS.work, f"pipeline_{steps}"), steps)
    _, one_stage = model.plan(1, port, 1)
    single = counted(model, model.plan(1, port, 4)[0], "single")
    piped = counted(model, model.plan(2, port + 10, 4, overhead.balanced_cut(one_stage))[0], "piped")
    return single, piped


def difference(long, short, steps):
    return {k: (long.get(k, 0) - short.get(k, 0)) / steps for k in set(long) | set(short)}


def reference_ops(model, steps, foreach):
    """{op: count} of PyTorch's loop (overhead.pytorch_step) over `steps` steps."""
    torch.set_num_threads(int(model.job["training_definition"].get("threads", 1)))
    net = torch.jit.load(model.model)
    net.train()
    o = model.job["training_definition"]["optimizer"]
    optimizer = torch.optim.AdamW(net.parameters(), lr=o["lr"], weight_decay=o.get("weight_decay", 0.01),
                                  foreach=foreach)
    next_batch = model.batches(torch.device("cpu"))

    for _ in range(3):  # uncounted: the profiling executor's first runs optimise the graph
        overhead.pytorch_step(net, optimizer, *next_batch())
    with torch.autograd.profiler.profile() as prof:
        for _ in range(steps):
            overhead.pytorch_step(net, optimizer, *next_batch())
    counts = {}
    for event in prof.function_events:
        if event.name.startswith("aten::"):
            counts[event.name] = counts.get(event.name, 0) + 1
    return counts


def per_step(counts, steps):
    return {k: v / steps for k, v in counts.items()}


def main():
    results = {"steps": ARGS.steps, "torch": torch.__version__}
    port = ARGS.port
    for name in ARGS.models.split(","):
        short, _ = provider_ops(name, ARGS.steps, port)
        long, model = provider_ops(name, 2 * ARGS.steps, port + 10)
        port += 20
        cairn = difference(long, short, ARGS.steps)
        sides = {"provider": cairn,
                 "pytorch_foreach": per_step(reference_ops(model, ARGS.steps, True), ARGS.steps),
                 "pytorch_single_tensor": per_step(reference_ops(model, ARGS.steps, False), ARGS.steps)}
        totals = {side: sum(c.values()) for side, c in sides.items()}
        print(f"{name}: ATen operators per step: provider {totals['provider']:.1f}, PyTorch's loop "
              f"{totals['pytorch_foreach']:.1f} (AdamW foreach) / {totals['pytorch_single_tensor']:.1f} "
              f"(single-tensor); provider / foreach loop {totals['provider'] / totals['pytorch_foreach']:.2f}x")
        reference = sides["pytorch_foreach"]
        names = set(cairn) | set(reference)
        differing = sorted(names, key=lambda k: -abs(cairn.get(k, 0) - reference.get(k, 0)))
        print(f"  {'operator':40s} {'provider':>9s} {'PyTorch':>9s}")
        for k in differing[:ARGS.top]:
            if abs(cairn.get(k, 0) - reference.get(k, 0)) < 0.05:
                break
            print(f"  {k:40s} {cairn.get(k, 0):9.1f} {reference.get(k, 0):9.1f}")
        results[name] = {"totals": totals, "per_step": sides}
        if name == "gpt":
            (single_s, piped_s), (single_l, piped_l) = pipeline_ops(ARGS.steps, port), \
                pipeline_ops(2 * ARGS.steps, port + 20)
            port += 40
            single = sum(difference(single_l, single_s, ARGS.steps).values())
            piped = difference(piped_l, piped_s, ARGS.steps)
            extra = sorted(piped, key=lambda k: -(piped[k] - difference(single_l, single_s, ARGS.steps).get(k, 0)))
            print(f"gpt, figure 3 (4 micro-batches): 1 provider {single:.1f} ATen operators a step, 2 "
                  f"stages {sum(piped.values()):.1f} (both providers): {sum(piped.values()) / single:.2f}x; "
                  f"most added: {', '.join(extra[:6])}")
            results["gpt_pipeline"] = {"one_provider": single, "two_stages": sum(piped.values()),
                                       "two_stages_per_step": piped}
    json.dump(results, open(os.path.join(ARGS.work, "op_count.json"), "w"), indent=1)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build", required=True)
    parser.add_argument("--work", required=True)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--port", type=int, default=27600)
    parser.add_argument("--models", default="gpt,cnn", help="which of cnn,gpt to count")
    parser.add_argument("--top", type=int, default=15, help="how many differing operators to list")
    parser.add_argument("--gpt-dim", type=int, default=128)
    parser.add_argument("--gpt-heads", type=int, default=4)
    parser.add_argument("--batch", type=int, default=0, help="batch size (0: the example's job.json)")
    ARGS = parser.parse_args()
    if set(ARGS.models.split(",")) - {"cnn", "gpt"}:
        parser.error("--models takes cnn, gpt or both")
    # overhead.Model reads its settings from overhead.ARGS: this run's, on the CPU.
    overhead.ARGS = argparse.Namespace(build=ARGS.build, device="cpu", gpt_dim=ARGS.gpt_dim,
                                       gpt_heads=ARGS.gpt_heads, batch=ARGS.batch)
    os.makedirs(ARGS.work, exist_ok=True)
    main()
