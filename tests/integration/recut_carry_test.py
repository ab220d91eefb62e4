#!/usr/bin/python3
"""Integration test: a run carried into a re-cut plan (clusterize --resume-from) with real providers.

    recut_carry_test.py --provider BUILD/node/provider --clusterize BUILD/clusterize/clusterize --work DIR

1. clusterize cuts the BatchNorm Fashion-MNIST CNN for 3 nodes at --cuts 7,14 (plan A); 3 providers
   train 40 AdamW steps with a cosine schedule, checkpointing every 10 steps (uninterrupted run).
2. clusterize re-plans the same model and job at other cuts (plan B) with --resume-from A
   --resume-step 20: every node of B gets a checkpoint of step 20 carried by parameter name.
3. The providers of B start with --resume and train steps 21..40.
Checks: B's step losses equal A's steps 21..40 (max abs diff <= 1e-6; bit-identical is expected, a cut
does not change the arithmetic), the merged trained models of A and B are equal (<= 1e-6), and the
refusals exit 2 naming the problem (no checkpoints, --out equal to --resume-from, another optimizer).
Ports come from volunteer_harness.free_ports (below the kernel's ephemeral range).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import volunteer_harness as vt  # noqa: E402  (free_ports)
from in_process import run_script  # noqa: E402  (make_model.py in this interpreter)

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "../.."))
EXAMPLE = os.path.join(REPO, "examples/fashion_mnist")
FASHION = "/usr/share/datasets/fashion-mnist"


def fail(message):
    print("FAIL: " + message, file=sys.stderr)
    sys.exit(1)


def write_json(path, doc):
    with open(path, "w") as f:
        json.dump(doc, f)


def plan(args, work, name, cuts, nodes, job, extra=(), expect=0):
    out = os.path.join(work, name)
    cmd = [args.clusterize, "--model", os.path.join(work, "model.pt"), "--nodes", nodes, "--job", job,
           "--clusters", "1", "--input-shape", "8,1,28,28", "--cuts", cuts, "--out", out, *extra]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(proc.stdout[-3000:])
    if proc.returncode != expect:
        fail(f"clusterize {' '.join(cmd[1:])} exited {proc.returncode}, expected {expect}")
    return out, proc.stdout


def launch(node_data, provider, extra=()):
    cmd = [os.path.join(REPO, "tools/launch_local"), node_data, "--provider", provider]
    if extra:
        cmd += ["--", *extra]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=400)
    sys.stdout.write(proc.stdout[-3000:])
    if proc.returncode != 0:
        fail(f"launch_local {node_data} exited {proc.returncode}")


def step_losses(node_data):
    chain = json.load(open(os.path.join(node_data, "plan.json")))["clusters"][0]["chain"]
    losses = {}
    with open(os.path.join(node_data, "nodes", chain[-1], "metrics.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if "step" in r and "loss" in r:
                losses[r["step"]] = r["loss"]
    return chain, losses


def merged(args, node_data):
    out = os.path.join(node_data, "trained.pt")
    subprocess.run([args.clusterize, "--merge", node_data, "--out", out], check=True,
                   stdout=subprocess.DEVNULL)
    return torch.jit.load(out).state_dict()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--provider", required=True)
    parser.add_argument("--clusterize", required=True)
    parser.add_argument("--work", required=True)
    args = parser.parse_args()
    work = args.work
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    run_script(os.path.join(EXAMPLE, "make_model.py"),
               ["--out", os.path.join(work, "model.pt"), "--channels", "8", "16"])
    nodes = os.path.join(work, "node_configs.json")
    write_json(nodes, {str(i): {"IP": f"127.0.0.1:{p}", "benchmarks": {"ram": 1, "bandwidth": 10000}}
                       for i, p in enumerate(vt.free_ports(3))})
    training = {"batch_size": 32, "microbatches": 4, "epochs": 0, "max_steps": 40, "seed": 3,
                "optimizer": {"name": "adamw", "lr": 0.003}, "lr_scheduler": {"name": "cosine"},
                "checkpoint_every": 10, "keep_checkpoints": 10, "threads": 1,
                "timeouts": {"startup_s": 60, "peer_s": 120}}
    job = {"format": 1, "job_id": "recut-carry", "driver": "cairn",
           "data": {"location": FASHION, "format": "idx", "normalize": {"mean": [0.2860], "std": [0.3530]},
                    "train_samples": 1024, "test_samples": 256},
           "training_definition": training}
    job_path = os.path.join(work, "job.json")
    write_json(job_path, job)

    # Refused before anything exists to carry: no checkpoints yet.
    a, _ = plan(args, work, "a", "7,14", nodes, job_path)
    _, out = plan(args, work, "b_refused", "4,14", nodes, job_path, ["--resume-from", a], expect=2)
    if "has no valid checkpoint" not in out or "checkpoints" not in out:
        fail("a plan without checkpoints was not refused naming the checkpoint folder")
    if os.path.exists(os.path.join(work, "b_refused", "plan.json")):
        fail("a refused carry still wrote the new plan")

    launch(a, args.provider)
    chain_a, losses_a = step_losses(a)
    if sorted(losses_a) != list(range(1, 41)):
        fail(f"plan A logged steps {sorted(losses_a)}")

    # Refusals with checkpoints present: --out is the old folder; another optimizer.
    _, out = plan(args, work, "a", "4,14", nodes, job_path, ["--resume-from", a], expect=2)
    if "is the --resume-from folder" not in out:
        fail("--out equal to --resume-from was not refused")
    sgd = dict(job, training_definition=dict(training, optimizer={"name": "sgd", "lr": 0.01, "momentum": 0.9}))
    sgd_path = os.path.join(work, "job_sgd.json")
    write_json(sgd_path, sgd)
    _, out = plan(args, work, "b_sgd", "4,14", nodes, sgd_path, ["--resume-from", a], expect=2)
    if "training_definition.optimizer is sgd" not in out:
        fail("another optimizer was not refused naming training_definition.optimizer")

    # The carry: plan B at other cuts from A's step 20.
    b, out = plan(args, work, "b", "4,14", nodes, job_path, ["--resume-from", a, "--resume-step", "20"])
    if "carried step 20" not in out:
        fail("clusterize did not report the carried step")
    units_a = [s["units"] for s in json.load(open(os.path.join(a, "plan.json")))["clusters"][0]["stages"]]
    units_b = [s["units"] for s in json.load(open(os.path.join(b, "plan.json")))["clusters"][0]["stages"]]
    print(f"units per stage: A {units_a}, B {units_b}")
    if units_a == units_b:
        fail("plan B has the same cut as plan A")
    launch(b, args.provider, ["--resume"])
    chain_b, losses_b = step_losses(b)
    if sorted(losses_b) != list(range(21, 41)):
        fail(f"plan B logged steps {sorted(losses_b)}, expected 21..40")
    worst = max(abs(losses_a[s] - losses_b[s]) for s in range(21, 41))
    print(f"steps 21..40: max |loss A - loss B| = {worst:.3g}; last loss A {losses_a[40]!r}, B {losses_b[40]!r}")
    if worst > 1e-6:
        fail("the carried run's losses differ from the uninterrupted run's")
    wa, wb = merged(args, a), merged(args, b)
    if sorted(wa) != sorted(wb):
        fail("the merged models hold different tensors")
    diff = max((wa[k].double() - wb[k].double()).abs().max().item() for k in wa)
    print(f"merged models: max abs diff {diff:.3g} over {len(wa)} tensors")
    if diff > 1e-6:
        fail("the carried run's trained model differs from the uninterrupted run's")
    print("PASS")


if __name__ == "__main__":
    main()
