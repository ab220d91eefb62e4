#!/usr/bin/python3
"""Training benchmarks of tools/bench/run_all tables 3-5 and 7; each subcommand prints one JSON line per row.

    /usr/bin/python3 tools/bench/training_bench.py pipeline --model cnn --stages 2,3 --microbatches 1,2,4,8,16
    /usr/bin/python3 tools/bench/training_bench.py demo --rounds 3
    /usr/bin/python3 tools/bench/training_bench.py ddp --steps 200 --eval-every 25 --target 0.85
    /usr/bin/python3 tools/bench/training_bench.py memory --stages 1,2,3

pipeline  cairn's pipeline (clusterize plan with exactly P stages: P equal nodes of 2 GB, 10 Gbps,
          cut at fixed_cuts.CUTS, the planner's own choice on an idle machine, fixed so that the
          setup does not follow the timing profile) for each micro-batch count M and schedule, next to
          bench_single_process (the unsplit model, one process, P intra-op threads = the pipeline's
          total) on the same job.json (batch, optimizer, data); pipeline and single process alternate
          row by row, the single-process figure is the median of all its runs for that model and P.
          Bubble = mean over nodes of wait_s / (compute_s + send_s + wait_s) over the steps after
          --warmup; textbook (P-1)/(M+P-1). A schedule the provider refuses (exit code 2 naming the
          key) is reported as unavailable, never as a number.
demo      tools/demo.sh's job cut for its 3 equal nodes (clusterize's own choice, default profiling)
          against one provider holding the whole model (1 thread, as each demo provider) and, for
          context, with 2 threads; --rounds rounds, the order rotating; medians of samples/s.
ddp       2 processes, same CNN, data, initial weights, global batch, AdamW/constant lr, 1 thread
          per process: cairn 2 clusters x 1 node with training_definition.sync = "gradients" vs
          ddp_reference.py; cairn 2 clusters x 1 node averaging parameters every step (local_steps 1,
          the mode that exists today) for context; cairn 1 cluster x 2 nodes vs
          rpc_pipeline_reference.py. Runs alternate ours/peer for --rounds rounds (even rounds
          ours first, odd rounds PyTorch first); medians. Case ours_gradients_serial: "gradients"
          with the overlap off (job.json sync.overlap false: the all-reduce after the last
          backward, as before the overlap), run right after ours_gradients in every round;
          --bucket-bytes sets the gradient bucket cap (sync.bucket_bytes) of both. Case
          ours_gradients_64k: "gradients" in 64 KiB buckets (the CNN's 200 KB of gradients in 4)
          overlapped with backward; at the default 1 MiB cap they are one bucket, which has
          nothing to overlap and is reduced after the last backward whatever sync.overlap says.
          Rows also give the median sync_s (time the step waits in the sync) of cluster 0's Root.
          Both sides are timed by step_timing.py's one rule: a step is the interval from the end
          of the previous step to the end of this one (data, forward, backward, sync, optimizer,
          bookkeeping); the step after each evaluation (its interval holds the evaluation pause)
          counts as the median step; start-up is never timed; samples/s leaves out --warmup steps;
          time to target = sum of step times until the first evaluation >= --target.
clusters  the CNN as 2 clusters x 2 nodes under sync average / diloco / gradients vs 1
          cluster x 2 nodes with the same global batch: samples/s, time to --target (and to
          --fallback-target), best accuracy within --steps; then sync vs async throughput on 1 x 2
          (same batch and micro-batches), --async-rounds alternating rounds, medians.
memory    peak RSS (/usr/bin/time %M) of every provider for 1, 2, 3 stages of the CNN (clusterize
          plans as above) vs bench_single_process's peak on the same job, and vs clusterize's
          node.json estimates.memory_bytes.
Needs the build (provider, clusterize, bench_single_process); CAIRN_BUILD_DIR picks it, PROVIDER
overrides the provider binary.
"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import step_timing  # noqa: E402
from loopback_ports import free_port_base  # noqa: E402
from training_common import (  # noqa: E402  (the helpers every subcommand shares)
    HERE, ROOT, BUILD, PY, log, sh, make_model, plan, node_specs, set_training, launch, metrics,
    step_seconds, pipeline_figures, single_process)


# ---- table 3 ----------------------------------------------------------------------------------

def cmd_pipeline(args):
    work = os.path.join(args.work, "pipeline")
    rows = []
    for kind in args.model:
        model, job, flags = make_model(kind, os.path.join(args.work, "models"))
        # The GPT is ~20x slower per sample than the CNN on this CPU: its own (trimmed) grid and steps.
        steps, warmup = (args.steps, args.warmup) if kind == "cnn" else (args.gpt_steps, args.gpt_warmup)
        grid = args.microbatches if kind == "cnn" else args.gpt_microbatches
        if kind == "gpt":
            job["training_definition"]["batch_size"] = args.gpt_batch
        else:
            # Throughput rows only: a 4,096-image slice loads faster than 60,000 and is more than
            # the steps read; the final evaluation on 200 test images.
            job["data"].update({"train_samples": 4096, "test_samples": 200})
        batch = job["training_definition"]["batch_size"]
        for p in args.stages:
            nd = plan(model, job, flags, p, 1, os.path.join(work, f"{kind}_{p}"), kind=kind)
            singles = []
            for m in grid:
                for schedule in args.schedules:
                    # async: one optimizer step per batch (update_frequency = M), the same optimizer
                    # work as sync; the default (1) steps AdamW after every micro-batch.
                    set_training(nd, microbatches=m, schedule=schedule, max_steps=steps + warmup,
                                 threads=1, update_frequency=m if schedule == "async" else None)
                    refused = launch(nd, refused_key="schedule" if schedule != "sync" else None)
                    row = {"table": "pipeline", "model": kind, "stages": p, "microbatches": m,
                           "schedule": schedule, "batch_size": batch, "steps": steps, "warmup": warmup,
                           "textbook_bubble": (p - 1) / (m + p - 1)}
                    if refused:
                        row["unavailable"] = refused
                    else:
                        row["pipeline_samples_per_s"], row["bubble"] = pipeline_figures(nd, batch, warmup)
                    rows.append(row)
                    log(json.dumps(row))
                # alternate: one single-process run after the pipeline runs of every M
                set_training(nd, schedule="sync", update_frequency=None)
                singles.append(single_process(model, nd, p, steps, warmup)[0])
            median = statistics.median(singles)
            for row in rows:
                if row["model"] == kind and row["stages"] == p:
                    row["single_samples_per_s"] = median
                    row["single_runs"] = len(singles)
                    if "pipeline_samples_per_s" in row:
                        row["ratio"] = row["pipeline_samples_per_s"] / median
    for row in rows:
        print(json.dumps(row), flush=True)


# ---- the demo against one provider alone ----------------------------------------------------

def cmd_demo(args):
    """tools/demo.sh's job (examples/fashion_mnist/job.json: batch 128, M = 4, sync, 1 thread per
    provider) cut by clusterize for the demo's 3 equal nodes with the demo's own flags, against the
    same job on one provider holding the whole model (a 1-node plan, 1 thread: what the user would
    run on one machine), and for context one provider with 2 threads. Runs alternate case by case
    for --rounds rounds (the order rotates each round); medians of the Root/Leaf step records after
    --warmup steps (the same rule as table 3)."""
    work = os.path.join(args.work, "demo")
    model, _, flags = make_model("cnn", os.path.join(args.work, "models"))
    job = json.load(open(os.path.join(ROOT, "examples", "fashion_mnist", "job.json")))
    job["model"] = model
    job["training_definition"].update({"epochs": 0, "max_steps": args.steps + args.warmup,
                                       "eval_every": 0})
    job["data"]["test_samples"] = 200
    if args.train_samples:
        job["data"]["train_samples"] = args.train_samples
    batch = job["training_definition"]["batch_size"]
    # The demo's cut is clusterize's own choice from a timing profile: with its 3 nodes it may use
    # 2 of them (as tools/demo.sh would then); the row says how many stages it made.
    cases = {"demo_3_nodes": (plan(model, job, flags, 3, 1, os.path.join(work, "three"), None, exact=False), 1),
             "alone_1_thread": (plan(model, job, flags, 1, 1, os.path.join(work, "one"), None), 1),
             "alone_2_threads": (os.path.join(work, "one"), 2)}
    runs = {c: [] for c in cases}
    order = list(cases)
    for r in range(args.rounds):
        for case in order[r % len(order):] + order[:r % len(order)]:
            nd, threads = cases[case]
            set_training(nd, threads=threads)
            launch(nd)
            runs[case].append(pipeline_figures(nd, batch, args.warmup)[0])
            log(json.dumps({"round": r, "case": case, "samples_per_s": runs[case][-1]}))
    three = node_specs(cases["demo_3_nodes"][0])
    for case, sps in runs.items():
        row = {"table": "demo", "case": case, "batch_size": batch, "steps": args.steps,
               "warmup": args.warmup, "rounds": args.rounds, "samples_per_s_runs": sps,
               "samples_per_s": statistics.median(sps)}
        if case == "demo_3_nodes":
            row["stages"] = len(three)
            row["estimated_ms_per_microbatch"] = {n: 1000 * s["estimates"]["seconds_per_microbatch"] for n, s in sorted(three.items())}
        print(json.dumps(row), flush=True)
    pipe = statistics.median(runs["demo_3_nodes"])
    for case in ("alone_1_thread", "alone_2_threads"):
        print(json.dumps({"table": "demo", "ratio": f"demo_3_nodes / {case}",
                          "value": pipe / statistics.median(runs[case])}), flush=True)


# ---- table 4 ----------------------------------------------------------------------------------

def cluster0_run(nd, roles, batch_per_cluster, clusters, warmup):
    """Step records, evaluations and step times of cluster 0's node with one of `roles`, and the
    samples/s of all clusters over the steps after `warmup`."""
    specs = node_specs(nd)
    name = [n for n, s in specs.items() if s["cluster"] == 0 and s["role"] in roles][0]
    steps, evals = metrics(nd, name)
    times = [step_seconds(r, batch_per_cluster) for r in steps]
    timed = times[warmup:]
    return steps, evals, times, clusters * batch_per_cluster * len(timed) / sum(timed)


def first_reaching(evals, times, target):
    """(seconds, step) of the first evaluation at or above `target`: the sum of the step times
    until it; None when never reached."""
    hit = next((e for e in evals if step_timing.reached(e, target)), None)
    return None if hit is None else (sum(times[:hit["step"]]), hit["step"])


def ours_to_target(nd, batch_per_cluster, clusters, target, warmup, eval_every):
    """cluster 0's root: the step intervals of its metrics.jsonl (batch / samples_per_s, the time
    since the previous step record) through step_timing.figures, the rule the PyTorch references
    apply to their own step intervals."""
    steps, evals, times, _ = cluster0_run(nd, ("root", "root_leaf"), batch_per_cluster, clusters, warmup)
    fig = step_timing.figures(times, evals, eval_every, warmup, clusters * batch_per_cluster, target)
    timed = steps[warmup:] or steps
    return {**fig, "steps": len(steps),
            "sync_s_median": statistics.median(r.get("sync_s", 0.0) for r in timed) if timed else None,
            "compute_s_median": statistics.median(r.get("compute_s", 0.0) for r in timed) if timed else None,
            "last_accuracy": evals[-1]["accuracy"] if evals else None,
            "evals": [{"step": e["step"], "accuracy": e["accuracy"]} for e in evals]}


def cmd_ddp(args):
    work = os.path.join(args.work, "ddp")
    model, job, flags = make_model("cnn", os.path.join(args.work, "models"))
    job["training_definition"].update({"max_steps": args.steps, "eval_every": args.eval_every,
                                       "batch_size": args.batch_size, "microbatches": args.microbatches,
                                       "optimizer": {"name": "adamw", "lr": args.lr, "weight_decay": 0.01}})
    job["data"]["test_samples"] = args.test_samples
    job["data"]["train_samples"] = args.train_samples
    # 2 clusters x 1 node: each cluster trains half the global batch on its half of the data
    dp = plan(model, job, flags, 1, 2, os.path.join(work, "clusters2"))
    pp = plan(model, job, flags, 2, 1, os.path.join(work, "pipeline2"))
    common = ["--model", model, "--steps", str(args.steps), "--eval-every", str(args.eval_every),
              "--target", str(args.target), "--threads", "1", "--lr", str(args.lr),
              "--warmup", str(args.warmup), "--test-samples", str(args.test_samples),
              "--train-samples", str(args.train_samples)]
    pairs = [
        ("ours_gradients", "pytorch_ddp"),
        ("ours_gradients_serial", None),  # gradients, overlap off (the all-reduce after backward)
        ("ours_gradients_64k", None),  # gradients in 64 KiB buckets, overlapped with backward
        ("ours_param_avg", None),
        ("ours_pipeline", "pytorch_rpc_pipeline"),
    ]
    pairs = [pair for pair in pairs if pair[0] in args.cases]
    results = {k: [] for pair in pairs for k in pair if k}
    unavailable = {}
    def run_ours(ours, r):
        if ours in unavailable:
            return
        if ours == "ours_pipeline":
            set_training(pp, batch_size=args.batch_size, microbatches=args.microbatches)
            launch(pp)
            res = ours_to_target(pp, args.batch_size, 1, args.target, args.warmup, args.eval_every)
        else:
            half = args.batch_size // 2
            sync = "gradients" if ours.startswith("ours_gradients") else None
            if sync:
                # job.json sync.overlap (off for _serial) and sync.bucket_bytes (docs/TRAINING.md)
                sync = {"name": "gradients", "overlap": ours != "ours_gradients_serial"}
                if ours == "ours_gradients_64k":
                    sync["bucket_bytes"] = 65536
                elif args.bucket_bytes:
                    sync["bucket_bytes"] = args.bucket_bytes
            set_training(dp, batch_size=half, microbatches=1, local_steps=1, sync=sync)
            refused = launch(dp, refused_key="sync" if sync else None)
            if refused:
                unavailable[ours] = refused
                return
            res = ours_to_target(dp, half, 2, args.target, args.warmup, args.eval_every)
        results[ours].append(res)
        log(f"round {r} {ours}: {json.dumps(res)}")

    def run_peer(peer, r):
        script = "ddp_reference.py" if peer == "pytorch_ddp" else "rpc_pipeline_reference.py"
        extra = ["--procs", "2"] if peer == "pytorch_ddp" else ["--microbatches", str(args.microbatches)]
        proc = sh([PY, os.path.join(HERE, script), "--batch-size", str(args.batch_size),
                   "--port", str(free_port_base(8))] + common + extra)
        res = [json.loads(l) for l in proc.stdout.splitlines() if l.startswith("{")][-1]
        res.pop("step_times", None)
        results[peer].append(res)
        log(f"round {r} {peer}: {json.dumps(res)}")

    for r in range(args.rounds):
        for ours, peer in pairs:
            # alternate which side goes first, round by round
            order = [("ours", ours), ("peer", peer)] if r % 2 == 0 else [("peer", peer), ("ours", ours)]
            for side, key in order:
                if side == "ours":
                    run_ours(key, r)
                elif key:
                    run_peer(key, r)

    def summary(key):
        runs = results.get(key, [])
        if not runs:
            return {"unavailable": unavailable.get(key, "not run")}
        ttt = [x["time_to_target_s"] for x in runs if x["time_to_target_s"] is not None]
        return {"samples_per_s": statistics.median(x["samples_per_s"] for x in runs),
                "time_to_target_s": statistics.median(ttt) if len(ttt) == len(runs) else None,
                "steps_to_target": statistics.median(x["steps_to_target"] for x in runs)
                if len(ttt) == len(runs) else None,
                "last_accuracy": statistics.median(x["last_accuracy"] for x in runs if x["last_accuracy"] is not None)
                if any(x["last_accuracy"] is not None for x in runs) else None,
                "sync_s_median": statistics.median(x["sync_s_median"] for x in runs)
                if all(x.get("sync_s_median") is not None for x in runs) else None,
                "runs": len(runs)}

    for ours, peer in pairs:
        row = {"table": "ddp", "case": ours, "peer": peer, "batch_size": args.batch_size,
               "eval_every": args.eval_every, "warmup": args.warmup,
               "microbatches": args.microbatches, "target": args.target, "steps": args.steps,
               "test_samples": args.test_samples, "bucket_bytes": args.bucket_bytes,
               "rounds": args.rounds, "ours": summary(ours)}
        if peer:
            row["theirs"] = summary(peer)
        print(json.dumps(row), flush=True)


# ---- table 7: across clusters ------------------------------------------------------------------

def leaf_run(nd, batch_per_cluster, clusters, targets, warmup):
    """Figures of one run from cluster 0's leaf: samples/s over the steps after `warmup` (all
    clusters' samples), time to each target accuracy (sum of step times, sync included, until the
    first evaluation at or above it), best and last accuracy."""
    steps, evals, times, samples_per_s = cluster0_run(nd, ("leaf", "root_leaf"), batch_per_cluster,
                                                      clusters, warmup)
    out = {"samples_per_s": samples_per_s, "steps": len(steps),
           "train_seconds": sum(times), "sync_s": sum(r.get("sync_s", 0.0) for r in steps),
           "best_accuracy": max((e["accuracy"] for e in evals), default=None),
           "last_accuracy": evals[-1]["accuracy"] if evals else None,
           "evals": [[e["step"], round(e["accuracy"], 4)] for e in evals], "to_target": {}}
    for t in targets:
        hit = first_reaching(evals, times, t)
        out["to_target"][str(t)] = None if hit is None else {"seconds": hit[0], "step": hit[1]}
    return out


def cmd_clusters(args):
    """Fashion-MNIST CNN, 2 stages per cluster: 2 clusters x 2 nodes under each `sync` vs 1 cluster x
    2 nodes with the same global batch (so the same samples per step), then sync vs async on 1 x 2."""
    work = os.path.join(args.work, "clusters")
    model, job, flags = make_model("cnn", os.path.join(args.work, "models"))
    job["training_definition"].update({"max_steps": args.steps, "eval_every": args.eval_every,
                                       "optimizer": {"name": "adamw", "lr": args.lr, "weight_decay": 0.01}})
    job["data"]["test_samples"] = args.test_samples
    job["data"].pop("train_samples", None)
    if args.train_samples:
        job["data"]["train_samples"] = args.train_samples
    one = plan(model, job, flags, 2, 1, os.path.join(work, "one_cluster"))
    two = plan(model, job, flags, 2, 2, os.path.join(work, "two_clusters"))
    g, mb = args.batch_size, args.microbatch_size
    cases = [("one_cluster", one, None, 1)] + [(m, two, m, 2) for m in args.modes]
    targets = sorted({args.target, args.fallback_target})
    for name, nd, mode, clusters in cases:
        batch = g // clusters
        fields = {"batch_size": batch, "microbatches": max(1, batch // mb), "schedule": "sync",
                  "update_frequency": None,
                  "max_steps": args.steps, "eval_every": args.eval_every}
        if mode:
            fields.update(sync=mode, local_steps=1 if mode == "gradients" else args.local_steps)
        else:
            fields.update(sync=None, local_steps=None)
        set_training(nd, **fields)
        launch(nd)
        res = leaf_run(nd, batch, clusters, targets, args.warmup)
        row = {"table": "clusters", "case": name, "clusters": clusters, "nodes_per_cluster": 2,
               "sync": mode, "local_steps": fields.get("local_steps"), "batch_per_cluster": batch,
               "microbatches": fields["microbatches"], "global_batch": g, "max_steps": args.steps,
               "eval_every": args.eval_every, "test_samples": args.test_samples, "targets": targets,
               "lr": args.lr, "warmup": args.warmup, **res}
        log(json.dumps(row))
        print(json.dumps(row), flush=True)
    # async vs sync: same plan (1 cluster x 2 nodes), batch, micro-batches; alternating rounds, medians
    runs = {"sync": [], "async": []}
    for r in range(args.async_rounds):
        for schedule in ("sync", "async") if r % 2 == 0 else ("async", "sync"):
            set_training(one, batch_size=g, microbatches=max(1, g // mb), schedule=schedule, sync=None,
                         local_steps=None, max_steps=args.async_steps + args.warmup, eval_every=0,
                         update_frequency=max(1, g // mb) if schedule == "async" else None)
            launch(one)
            runs[schedule].append(pipeline_figures(one, g, args.warmup)[0])
            log(f"round {r} {schedule}: {runs[schedule][-1]:.1f} samples/s")
    for schedule, values in runs.items():
        print(json.dumps({"table": "clusters", "case": f"schedule_{schedule}", "schedule": schedule,
                          "clusters": 1, "nodes_per_cluster": 2, "batch_size": g,
                          "microbatches": max(1, g // mb), "steps": args.async_steps, "warmup": args.warmup,
                          "rounds": len(values), "samples_per_s_runs": values,
                          "samples_per_s": statistics.median(values)}), flush=True)


# ---- table 5 ----------------------------------------------------------------------------------

def cmd_memory(args):
    work = os.path.join(args.work, "memory")
    model, job, flags = make_model("cnn", os.path.join(args.work, "models"))
    job["training_definition"].update({"max_steps": args.steps, "microbatches": args.microbatches})
    if args.train_samples:
        job["data"]["train_samples"] = args.train_samples
    single_rss = []
    rows = []
    for p in args.stages:
        nd = plan(model, job, flags, p, 1, os.path.join(work, f"cnn_{p}"))
        launch(nd)
        single_rss.append(single_process(model, nd, 1, args.steps, 0)[1] * 1024)
        for name, spec in sorted(node_specs(nd).items(), key=lambda kv: kv[1]["stage"]):
            rss = int(open(os.path.join(nd, "nodes", name, "peak_rss_kb")).read().split()[-1]) * 1024
            rows.append({"table": "memory", "model": "cnn", "stages": p, "stage": spec["stage"], "node": name,
                         "peak_rss_bytes": rss, "estimate_bytes": spec["estimates"]["memory_bytes"],
                         "batch_size": job["training_definition"]["batch_size"],
                         "microbatches": args.microbatches, "steps": args.steps})
    single = statistics.median(single_rss)
    for row in rows:
        row["single_peak_rss_bytes"] = single
        row["single_runs"] = len(single_rss)
        print(json.dumps(row), flush=True)


def ints(text):
    return [int(x) for x in text.split(",")]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", default=os.path.join(BUILD, "bench_training"))
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("pipeline")
    a.add_argument("--model", type=lambda s: s.split(","), default=["cnn", "gpt"])
    a.add_argument("--stages", type=ints, default=[2, 3])
    a.add_argument("--microbatches", type=ints, default=[1, 2, 4, 8, 16])
    a.add_argument("--schedules", type=lambda s: s.split(","), default=["sync", "async"])
    a.add_argument("--steps", type=int, default=10, help="CNN: timed steps per row")
    a.add_argument("--warmup", type=int, default=2, help="CNN: untimed steps first")
    a.add_argument("--gpt-microbatches", type=ints, default=[1, 8])
    a.add_argument("--gpt-batch", type=int, default=16, help="GPT: sequences of 64 bytes per step")
    a.add_argument("--gpt-steps", type=int, default=2, help="GPT: timed steps per row")
    a.add_argument("--gpt-warmup", type=int, default=1, help="GPT: untimed steps first")
    e = sub.add_parser("demo")
    e.add_argument("--steps", type=int, default=40, help="timed steps per run")
    e.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    e.add_argument("--rounds", type=int, default=3)
    e.add_argument("--train-samples", type=int, default=0, help="0: all 60,000 training images (a smaller slice loads faster: run_all --smoke)")
    d = sub.add_parser("ddp")
    d.add_argument("--steps", type=int, default=200)
    d.add_argument("--eval-every", type=int, default=25)
    d.add_argument("--target", type=float, default=0.85)
    d.add_argument("--batch-size", type=int, default=128, help="global batch")
    d.add_argument("--microbatches", type=int, default=4, help="pipeline rows")
    d.add_argument("--lr", type=float, default=0.003)
    d.add_argument("--warmup", type=int, default=10)
    d.add_argument("--test-samples", type=int, default=0, help="0: the full 10,000 test images")
    d.add_argument("--rounds", type=int, default=1)
    d.add_argument("--train-samples", type=int, default=0, help="0: all 60,000 training images")
    d.add_argument("--cases", type=lambda s: s.split(","), default=["ours_gradients", "ours_param_avg", "ours_pipeline"])
    d.add_argument("--bucket-bytes", type=int, default=0,
                   help="gradients: bucket cap, job.json sync.bucket_bytes (0: the default, 1 MiB)")
    c = sub.add_parser("clusters")
    c.add_argument("--steps", type=int, default=100, help="at most this many steps per run")
    c.add_argument("--eval-every", type=int, default=20)
    c.add_argument("--target", type=float, default=0.9)
    c.add_argument("--fallback-target", type=float, default=0.85)
    c.add_argument("--batch-size", type=int, default=128, help="global batch (all clusters)")
    c.add_argument("--microbatch-size", type=int, default=32)
    c.add_argument("--lr", type=float, default=0.003)
    c.add_argument("--local-steps", type=int, default=5, help="average and diloco")
    c.add_argument("--modes", type=lambda s: s.split(","), default=["average", "diloco", "gradients"])
    c.add_argument("--test-samples", type=int, default=2000)
    c.add_argument("--warmup", type=int, default=5)
    c.add_argument("--async-steps", type=int, default=25)
    c.add_argument("--async-rounds", type=int, default=2)
    c.add_argument("--train-samples", type=int, default=0, help="0: all 60,000 training images (a smaller slice loads faster: run_all --smoke)")
    m = sub.add_parser("memory")
    m.add_argument("--stages", type=ints, default=[1, 2, 3])
    m.add_argument("--steps", type=int, default=20)
    m.add_argument("--microbatches", type=int, default=4)
    m.add_argument("--train-samples", type=int, default=0, help="0: all 60,000 training images (a smaller slice loads faster: run_all --smoke)")
    args = p.parse_args()
    {"pipeline": cmd_pipeline, "demo": cmd_demo, "ddp": cmd_ddp, "memory": cmd_memory, "clusters": cmd_clusters}[args.cmd](args)


if __name__ == "__main__":
    main()
