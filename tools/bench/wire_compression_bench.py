#!/usr/bin/python3
"""Compression on the wire (training_definition.wire.activations): bytes per step per link and
final Fashion-MNIST accuracy, one JSON line per codec.

    tools/bench/wire_compression_bench.py --provider build/node/provider [--steps 300]
        [--codecs fp32,bf16,fp16,int8] [--work /tmp/wire_bench] [--port 6950] [--model cnn|gpt] [--sync]

--model gpt: examples/tiny_gpt (see run_gpt) instead, printing the validation loss.
--sync: training_definition.wire.sync instead (see run_sync): 2 clusters x 1 provider averaging
(--sync-mode average, or diloco: outer steps on compressed pseudo-gradients) every 5 steps, tensor
bytes per sync per member and final accuracy per codec (--codecs fp32,bf16,int8).

Each codec trains the example CNN (BatchNorm, cut by hand into --stages real providers on tcp
loopback, tools/launch_local; the by-hand cut has 3 stages, so 2 links) for --steps steps of batch 32 in 4 micro-batches, AdamW lr 0.003 with
a cosine schedule, seed 1, on the first 12,000 training images; accuracy is the Leaf's evaluation on
the first 2,000 test images. Bytes per step per link are counted from the payloads: every
boundary value node.json plans between two stages, batch rows, once forward (activation) and once
backward (gradient), at the codec's bytes per value (fp32 4, bf16/fp16 2, int8 1 plus a 4-byte
scale per row: node/pipeline/Int8Boundary.h — a row is a [B, F] sample or a (sample, channel) of a tensor
of 3 or more dimensions; values of fewer than 2 dimensions stay fp32); the msgpack header and
the small "__" bookkeeping tensors (targets, ids, loss) are left out and are the same for every
codec. Wall time is printed, not compared (the machine is shared).
"""
import argparse
import json
import os
import shutil
import sys
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "../.."))
sys.path.insert(0, os.path.join(REPO, "tests/integration"))
import provider_cluster_test as pct  # noqa: E402

BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "int8": 1}


def chain_of(node_data):
    """The first cluster's nodes in pipeline order (by-hand plans: "nodes"; clusterize: "chain")."""
    c = json.load(open(os.path.join(node_data, "plan.json")))["clusters"][0]
    return c.get("chain") or c["nodes"]


def value_bytes(shape, codec):
    """Payload bytes per sample of one planned float32 boundary value of `shape` in `codec`."""
    per_sample = 1
    for d in shape[1:]:
        per_sample *= d
    if codec != "int8":
        return per_sample * BYTES[codec]
    if len(shape) < 2:
        return per_sample * 4  # stays fp32
    rows = 1 if len(shape) == 2 else shape[1]
    return per_sample + 4 * rows


def link_bytes(node_data, codec):
    """Payload bytes per sample crossing each link of the first cluster, one way (each sender's
    planned float32 outputs)."""
    out = []
    for name in chain_of(node_data)[:-1]:
        node = json.load(open(os.path.join(node_data, "nodes", name, "node.json")))
        out.append(sum(value_bytes(v["shape"], codec) for v in node["outputs"]
                       if v["type"] == "tensor" and v["dtype"] == "float32"))
    return out


def run_gpt(args):
    """examples/tiny_gpt as examples/tiny_gpt/run.sh runs it (clusterize: 2 clusters x 2 nodes,
    "average" every 10 steps, batch 32 in 2 micro-batches) for --steps steps with each codec; the
    validation loss is the mean over the two clusters' Leaf evaluations."""
    import subprocess
    build = os.path.dirname(os.path.dirname(os.path.abspath(args.provider)))
    for codec in args.codecs.split(","):
        work = os.path.join(args.work, "gpt_" + codec)
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(work)
        subprocess.run([os.path.join(REPO, "examples/tiny_gpt/make_corpus.sh"), os.path.join(work, "corpus.txt")],
                       check=True, stdout=subprocess.DEVNULL)
        job = json.load(open(os.path.join(REPO, "examples/tiny_gpt/job.json")))
        job["data"]["location"] = os.path.join(work, "corpus.txt")
        job["training_definition"].update({"max_steps": args.steps, "wire": {"activations": codec}})
        json.dump(job, open(os.path.join(work, "job.json.in"), "w"))
        subprocess.run([sys.executable, os.path.join(REPO, "examples/tiny_gpt/make_model.py"), "--out",
                        os.path.join(work, "model.pt")], check=True, stdout=subprocess.DEVNULL)
        configs = {str(i): {"IP": f"127.0.0.1:{args.port + i}", "benchmarks": {"ram": 1, "bandwidth": 10000}}
                   for i in range(4)}
        json.dump(configs, open(os.path.join(work, "node_configs.json"), "w"))
        subprocess.run([os.path.join(build, "clusterize/clusterize"), "--model", os.path.join(work, "model.pt"),
                        "--nodes", os.path.join(work, "node_configs.json"), "--job", os.path.join(work, "job.json.in"),
                        "--clusters", "2", "--granularity", "expand-containers", "--input-shape", "16,64",
                        "--input-dtype", "int64", "--out", work], check=True, stdout=subprocess.DEVNULL)
        start = time.time()
        pct.launch(work, args.provider, 1200)
        seconds = time.time() - start
        plan = json.load(open(os.path.join(work, "plan.json")))
        losses = [json.load(open(os.path.join(work, "nodes", c["chain"][-1], "result.json")))["eval"]["loss"]
                  for c in plan["clusters"]]
        batch = job["training_definition"]["batch_size"]
        per_link = [2 * batch * n for n in link_bytes(work, codec)]
        print(json.dumps({"model": "tiny_gpt", "clusters": len(plan["clusters"]), "steps": args.steps,
                          "wire_activations": codec, "bytes_per_step_per_link": per_link,
                          "val_loss": sum(losses) / len(losses), "wall_s": round(seconds, 1)}), flush=True)


def run_sync(args):
    """training_definition.wire.sync: the example CNN (BatchNorm) whole on each of 2 clusters of 1
    provider (tcp loopback), "average" every 5 steps, otherwise the settings of the CNN rows
    (--steps steps of batch 32 in 4 micro-batches, AdamW lr 0.003 cosine, seed 1, 12,000 training
    images split between the clusters, 2,000 test images). Bytes per sync per member: the tensor
    bytes each provider's ring sent over the run (its "cross-cluster sync: ... tensor bytes sent"
    log line, the ring's ProcessGroup stats: chunk payloads only, no headers) divided by its syncs;
    accuracy: each cluster's own evaluation after the final sync (the clusters' weights are then
    identical, so the two agree)."""
    import re
    import subprocess
    for codec in args.codecs.split(","):
        work = os.path.join(args.work, f"sync_{args.sync_mode}_{codec}")
        shutil.rmtree(work, ignore_errors=True)
        settings = pct.training_settings(args.steps)
        settings.update({"local_steps": 5, "sync": args.sync_mode, "record_sample_ids": False,
                         "wire": {"sync": codec}})
        node_data, nodes, rings = pct.make_clusters_node_data(
            work, args.port, (1, 1), settings, {"train_samples": 12000, "test_samples": 2000}, pct.KEYS)
        start = time.time()
        env = dict(os.environ, PROVIDER=args.provider)
        proc = subprocess.run([os.path.join(REPO, "tools/launch_local"), node_data], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1800)
        seconds = time.time() - start
        if proc.returncode != 0:
            sys.stdout.write(proc.stdout[-4000:])
            sys.exit(f"launch_local exited {proc.returncode}")
        per_member = {}
        for name in sum(nodes, []):
            m = re.search(r"\[" + name + r"\].*cross-cluster sync: (\d+) sync\(s\).* (\d+) tensor bytes sent",
                          proc.stdout)
            if not m:
                sys.exit(f"no sync summary in {name}'s log")
            per_member[name] = int(m.group(2)) / int(m.group(1))
        results = [json.load(open(os.path.join(node_data, "nodes", c[-1], "result.json"))) for c in nodes]
        floats = sum(t.numel() for t in torch_state(os.path.join(node_data, "nodes", nodes[0][0], "stage.pt"))
                     if t.is_floating_point())
        print(json.dumps({"model": "fashion_mnist_cnn", "clusters": "2x1", "sync": args.sync_mode, "local_steps": 5,
                          "steps": args.steps, "wire_sync": codec, "float_values_synced": floats,
                          "bytes_per_sync_per_member": per_member,
                          "accuracy": [r["eval"]["accuracy"] for r in results],
                          "eval_loss": [r["eval"]["loss"] for r in results],
                          "eval_samples": results[0]["eval"]["samples"], "wall_s": round(seconds, 1)}),
              flush=True)


def torch_state(stage_file):
    import torch
    module = torch.jit.load(stage_file)
    return list(module.state_dict().values())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--provider", required=True)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--stages", type=int, default=3, choices=[3])
    parser.add_argument("--codecs", default="fp32,bf16,fp16")
    parser.add_argument("--work", default="/tmp/wire_bench")
    parser.add_argument("--port", type=int, default=6950)
    parser.add_argument("--model", choices=["cnn", "gpt"], default="cnn")
    parser.add_argument("--keys", help="cairn_keys binary; default: next to the provider's build")
    parser.add_argument("--sync", action="store_true",
                        help="compress ring syncs (wire.sync) instead of activations; codecs fp32,bf16,int8")
    parser.add_argument("--sync-mode", choices=["average", "diloco"], default="average",
                        help="with --sync: the ring sync mode")
    args = parser.parse_args()
    parser_model = args.model
    pct.KEYS = pct.keys_binary(args)
    if args.sync:
        return run_sync(args)
    if parser_model == "gpt":
        return run_gpt(args)
    batch = 32
    for codec in args.codecs.split(","):
        work = os.path.join(args.work, codec)
        shutil.rmtree(work, ignore_errors=True)
        settings = pct.training_settings(args.steps)
        settings["wire"] = {"activations": codec}
        _, node_data = pct.make_node_data(work, args.port, args.stages, True, settings,
                                          {"train_samples": 12000, "test_samples": 2000})
        start = time.time()
        pct.launch(node_data, args.provider, 1200)
        seconds = time.time() - start
        leaf = f"node_{args.stages - 1}"
        result = json.load(open(os.path.join(node_data, "nodes", leaf, "result.json")))
        per_link = [2 * batch * n for n in link_bytes(node_data, codec)]
        print(json.dumps({"model": "fashion_mnist_cnn", "stages": args.stages, "steps": args.steps,
                          "wire_activations": codec, "bytes_per_step_per_link": per_link,
                          "accuracy": result["eval"]["accuracy"], "eval_loss": result["eval"]["loss"],
                          "eval_samples": result["eval"]["samples"], "wall_s": round(seconds, 1)}),
              flush=True)


if __name__ == "__main__":
    main()
