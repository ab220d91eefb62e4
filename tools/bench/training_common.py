#!/usr/bin/python3
"""What the subcommands of tools/bench/training_bench.py share: the build's binaries, the CNN job,
the models, clusterize plans, launching providers and reading their step records, and
bench_single_process (the unsplit model in one process)."""
import json
import os
import re
import shutil
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fixed_cuts import CUTS  # noqa: E402  (the exact plans' cuts)
from loopback_ports import free_port_base  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BUILD = os.path.join(ROOT, os.environ.get("CAIRN_BUILD_DIR", "build"))
PY = "/usr/bin/python3"
PROVIDER = os.environ.get("PROVIDER", os.path.join(BUILD, "node", "provider"))
CLUSTERIZE = os.path.join(BUILD, "clusterize", "clusterize")
SINGLE = os.path.join(BUILD, "tools", "bench", "bench_single_process")
# Every process this script starts (providers, bench_single_process, the PyTorch references): OpenMP
# threads sleep instead of spinning when they wait. On a 2-core machine shared with other work a
# spinning multi-threaded single process loses up to half its speed; same setting on both sides.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def log(msg):
    print("training_bench: " + msg, file=sys.stderr, flush=True)


def sh(cmd, check=True, timeout=900):
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise SystemExit(f"training_bench: failed ({proc.returncode}): {' '.join(cmd)}")
    return proc


# ---- models and plans -------------------------------------------------------------------------

def cnn_job(steps):
    job = json.load(open(os.path.join(ROOT, "examples", "fashion_mnist", "job.json")))
    job["training_definition"].update({"epochs": 0, "max_steps": steps, "lr_scheduler": "constant",
                                       "threads": 1, "eval_every": 0})
    job["data"]["test_samples"] = 500
    return job


def make_model(kind, work):
    """Returns (model.pt, job dict, clusterize input flags)."""
    os.makedirs(work, exist_ok=True)
    if kind == "cnn":
        model = os.path.join(work, "cnn.pt")
        if not os.path.exists(model):
            sh([PY, "examples/fashion_mnist/make_model.py", "--out", model])
        return model, cnn_job(20), ["--input-shape", "32,1,28,28"]
    model, corpus = os.path.join(work, "gpt.pt"), os.path.join(work, "corpus.txt")
    if not os.path.exists(model):
        sh([PY, "examples/tiny_gpt/make_model.py", "--out", model])
        sh(["bash", "examples/tiny_gpt/make_corpus.sh", corpus])
    job = {"format": 1, "job_id": "tiny-gpt", "driver": "cairn", "model": model,
           "data": {"location": corpus, "format": "tokens", "block_length": 64, "test_fraction": 0.01},
           "training_definition": {"batch_size": 32, "microbatches": 4, "epochs": 0, "max_steps": 20,
                                   "seed": 0, "optimizer": {"name": "adamw", "lr": 0.001},
                                   "loss_fn": "cross_entropy", "threads": 1}}
    return model, job, ["--input-shape", "8,64", "--input-dtype", "int64", "--granularity",
                        "expand-containers"]


def plan(model, job, shape_flags, stages, clusters, out, profile_runs=1, exact=True, kind="cnn"):
    """clusterize with exactly stages*clusters equal nodes. exact: every cluster gets `stages`
    stages at the cut CUTS[kind][stages] (fixed_cuts.py); exact=False: takes the cut clusterize
    chooses, which its timing profile decides (as tools/demo.sh does). profile_runs None:
    clusterize's default profiling."""
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    n = stages * clusters
    base = free_port_base(n)
    nodes = {str(i): {"IP": f"127.0.0.1:{base + i}", "benchmarks": {"ram": 2, "bandwidth": 10000}}
             for i in range(n)}
    json.dump(nodes, open(os.path.join(out, "node_configs.json"), "w"))
    json.dump(job, open(os.path.join(out, "job.in.json"), "w"))
    cuts = []
    if exact and stages > 1:
        if stages not in CUTS[kind]:
            raise SystemExit(f"training_bench: no fixed cut of the {kind} for {stages} stages (CUTS in "
                             f"tools/bench/fixed_cuts.py has {sorted(CUTS[kind])})")
        cuts = ["--cuts", CUTS[kind][stages]]
    sh([CLUSTERIZE, "--model", model, "--nodes", os.path.join(out, "node_configs.json"), "--job",
        os.path.join(out, "job.in.json"), "--clusters", str(clusters)] +
       (["--profile-runs", str(profile_runs)] if profile_runs else []) + ["--out", out] + shape_flags +
       cuts)
    specs = node_specs(out)
    per_cluster = {}
    for s in specs.values():
        per_cluster[s["cluster"]] = per_cluster.get(s["cluster"], 0) + 1
    if exact and sorted(per_cluster.values()) != [stages] * clusters:
        raise SystemExit(f"training_bench: clusterize made {per_cluster} stages per cluster, wanted {stages}")
    return out


def node_specs(nd):
    names = sorted(os.listdir(os.path.join(nd, "nodes")))
    return {n: json.load(open(os.path.join(nd, "nodes", n, "node.json"))) for n in names
            if os.path.exists(os.path.join(nd, "nodes", n, "node.json"))}


def set_training(nd, **fields):
    path = os.path.join(nd, "job.json")
    job = json.load(open(path))
    for k, v in fields.items():
        if v is None:
            job["training_definition"].pop(k, None)
        else:
            job["training_definition"][k] = v
    json.dump(job, open(path, "w"), indent=1)
    return job


def launch(nd, refused_key=None):
    """Runs every provider of nd (through a wrapper recording peak RSS). Returns None, or the reason
    when the provider refuses `refused_key` (exit code 2 naming it)."""
    for name in node_specs(nd):
        d = os.path.join(nd, "nodes", name)
        for f in ("metrics.jsonl", "result.json", "peak_rss_kb"):
            if os.path.exists(os.path.join(d, f)):
                os.remove(os.path.join(d, f))
    wrapper = os.path.join(nd, "rss_provider.sh")
    with open(wrapper, "w") as f:
        f.write('#!/bin/sh\n# records the provider\'s peak RSS (KiB) in nodes/NAME/peak_rss_kb\n'
                f'exec /usr/bin/time -f %M -o "$4/nodes/$2/peak_rss_kb" "{PROVIDER}" "$@"\n')
    os.chmod(wrapper, 0o755)
    env = dict(os.environ, PROVIDER=wrapper)
    proc = subprocess.run([os.path.join(ROOT, "tools", "launch_local"), nd], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    text = proc.stdout + proc.stderr
    if proc.returncode == 2 and refused_key and re.search(refused_key, text):
        lines = [l for l in text.splitlines() if re.search(refused_key, l) and "error" in l]
        return (lines[0] if lines else "refused")[:400]
    if proc.returncode != 0:
        sys.stderr.write(text[-6000:])
        raise SystemExit(f"training_bench: launch_local {nd} failed with exit code {proc.returncode}")
    return None


def metrics(nd, name):
    steps, evals = [], []
    for line in open(os.path.join(nd, "nodes", name, "metrics.jsonl")):
        r = json.loads(line)
        if "samples_per_s" in r:
            steps.append(r)
        elif "eval" in r:
            evals.append(r["eval"])
    return steps, evals


def step_seconds(r, batch):
    return batch / r["samples_per_s"]


def pipeline_figures(nd, batch, warmup):
    specs = node_specs(nd)
    leaf = [n for n, s in specs.items() if s["role"] in ("leaf", "root_leaf") and s["cluster"] == 0][0]
    steps, _ = metrics(nd, leaf)
    timed = steps[warmup:]
    sps = batch * len(timed) / sum(step_seconds(r, batch) for r in timed)
    idle = []
    for name in specs:
        st = metrics(nd, name)[0][warmup:]
        busy = sum(r["compute_s"] + r["send_s"] + r["wait_s"] for r in st)
        idle.append(sum(r["wait_s"] for r in st) / busy if busy else 0.0)
    return sps, statistics.mean(idle)


def single_process(model, nd, threads, steps, warmup):
    proc = sh(["/usr/bin/time", "-f", "peak_rss_kb %M", SINGLE, "--model", model, "--job",
               os.path.join(nd, "job.json"), "--steps", str(steps), "--warmup", str(warmup),
               "--threads", str(threads)])
    sps = float(re.search(r"single_process_samples_per_s ([0-9.]+)", proc.stdout).group(1))
    rss = int(re.search(r"peak_rss_kb (\d+)", proc.stderr).group(1))
    return sps, rss
