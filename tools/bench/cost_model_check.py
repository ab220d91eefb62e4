#!/usr/bin/env python3
"""How well clusterize's cost model predicts what providers measure (issue [I] part 1).

For each example model (the Fashion-MNIST CNN, the ResNet, the tiny GPT) and each number of equal
nodes, it cuts the model with clusterize (profiling it as clusterize always does), trains a short
run with one provider per stage on this machine (tools/launch_local), and compares, per stage:
  estimated  the plan's compute seconds per micro-batch: the profiled seconds of the stage's atoms
             (plan.json atoms[].seconds; transfers are left out on both sides)
  measured   the median over training steps of the provider's metrics.jsonl compute_s, divided by
             the job's micro-batches (the rule clusterize --rebalance uses)
and prints one JSON line per stage and a table with measured/estimated and whether it is within
+-25%. It is a benchmark: its figures depend on the machine and on what else runs, so it asserts
nothing and is not a CI test.

    /usr/bin/python3 tools/bench/cost_model_check.py [--models cnn,resnet,gpt] [--nodes 2,3,4]
        [--steps 40] [--build build] [--work /tmp/cost_model_check]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from loopback_ports import free_port_base  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PY = "/usr/bin/python3"


def write_nodes(path, count, ram_gb):
    base = free_port_base(count)
    nodes = {str(i): {"IP": f"127.0.0.1:{base + i}", "benchmarks": {"ram": ram_gb, "bandwidth": 10000}}
             for i in range(count)}
    json.dump(nodes, open(path, "w"), indent=2)


def prepare(model, work, steps):
    """Writes model.pt and job.json for `model` under `work`; returns clusterize's extra flags."""
    os.makedirs(work, exist_ok=True)
    if model == "cnn":
        ex, flags = "fashion_mnist", []
        job = json.load(open(f"{ROOT}/examples/fashion_mnist/job.json"))
        job["data"].update({"train_samples": 4000, "test_samples": 500})
    elif model == "resnet":
        ex, flags = "resnet", []
        job = json.load(open(f"{ROOT}/examples/resnet/job.json"))
        job["data"].update({"train_samples": 4000, "test_samples": 500})
    elif model == "gpt":
        ex, flags = "tiny_gpt", ["--granularity", "expand-containers", "--input-dtype", "int64"]
        subprocess.run([f"{ROOT}/examples/tiny_gpt/make_corpus.sh", f"{work}/corpus.txt"], check=True,
                       stdout=subprocess.DEVNULL)
        job = json.load(open(f"{ROOT}/examples/tiny_gpt/job.json"))
        job["data"]["location"] = f"{work}/corpus.txt"
    else:
        raise SystemExit(f"cost_model_check: unknown model {model!r} (cnn, resnet, gpt)")
    t = job["training_definition"]
    t.update({"epochs": 0, "max_steps": steps, "eval_every": 0, "checkpoint_every": 0})
    t.pop("local_steps", None)
    json.dump(job, open(f"{work}/job.json", "w"), indent=2)
    subprocess.run([PY, f"{ROOT}/examples/{ex}/make_model.py", "--out", f"{work}/model.pt"], check=True,
                   stdout=subprocess.DEVNULL)
    micro = -(-t["batch_size"] // t.get("microbatches", 1))
    shape = f"{micro},64" if model == "gpt" else f"{micro},1,28,28"
    return flags + ["--input-shape", shape], t.get("microbatches", 1)


def stage_rows(out, microbatches):
    plan = json.load(open(f"{out}/plan.json"))
    atoms = plan["atoms"]
    rows = []
    for st in plan["clusters"][0]["stages"]:
        b, e = st["units"]
        estimated = sum(a["seconds"] for a in atoms if a["units"][0] >= b and a["units"][1] <= e)
        records = [json.loads(l) for l in open(f"{out}/nodes/{st['node']}/metrics.jsonl") if l.endswith("\n")]
        compute = [r["compute_s"] for r in records if "step" in r and "compute_s" in r]
        measured = statistics.median(compute[len(compute) // 5:]) / microbatches  # past warm-up
        rows.append({"stage": st["stage"], "node": st["node"], "units": [b, e],
                     "estimated_ms": 1e3 * estimated, "measured_ms": 1e3 * measured,
                     "ratio": measured / estimated if estimated > 0 else float("inf")})
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="cnn,resnet,gpt")
    ap.add_argument("--nodes", default="2,3,4")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--build", default=f"{ROOT}/build")
    ap.add_argument("--work", default="/tmp/cost_model_check")
    args = ap.parse_args()
    clusterize = f"{args.build}/clusterize/clusterize"
    if not os.access(clusterize, os.X_OK):
        print(f"cost_model_check: {clusterize} not found (build first)", file=sys.stderr)
        return 2
    shutil.rmtree(args.work, ignore_errors=True)
    table = []
    for model in args.models.split(","):
        for n in [int(x) for x in args.nodes.split(",")]:
            work = f"{args.work}/{model}_{n}"
            flags, micro = prepare(model, work, args.steps)
            write_nodes(f"{work}/node_configs.json", n, 4)
            out = f"{work}/node_data"
            subprocess.run([clusterize, "--model", f"{work}/model.pt", "--nodes", f"{work}/node_configs.json",
                            "--job", f"{work}/job.json", "--clusters", "1", "--out", out] + flags,
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            env = dict(os.environ, CAIRN_BUILD_DIR=args.build)
            run = subprocess.run([f"{ROOT}/tools/launch_local", out], env=env, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
            if run.returncode != 0:
                print(json.dumps({"model": model, "nodes": n, "error": f"launch_local exited {run.returncode}"}))
                continue
            for r in stage_rows(out, micro):
                r.update({"model": model, "nodes": n})
                print(json.dumps(r), flush=True)
                table.append(r)
    print("\n| model | nodes | stage | units | estimated ms/micro-batch | measured | measured/estimated |")
    print("|---|---:|---:|---|---:|---:|---:|")
    for r in table:
        mark = "" if 0.75 <= r["ratio"] <= 1.25 else " (outside ±25%)"
        print(f"| {r['model']} | {r['nodes']} | {r['stage']} | {r['units'][0]}-{r['units'][1]} | "
              f"{r['estimated_ms']:.2f} | {r['measured_ms']:.2f} | {r['ratio']:.2f}{mark} |")
    within = sum(1 for r in table if 0.75 <= r["ratio"] <= 1.25)
    print(f"\n{within} of {len(table)} stages within ±25%; load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
