#!/usr/bin/python3
"""Integration tests: 2 clusters of real `provider` processes on tcp loopback, started by
tools/launch_local, with their rings written as clusterize forms them (provider_cluster_test.py
holds the single-cluster cases and the shared helpers).

    two_clusters_test.py CASE --provider BUILD/node/provider --work DIR --port BASE [--device D]

--device: where every provider trains (default cpu; tools/gpu/gpu_figures.sh runs cases on cuda:
the rings reduce host copies of the buckets of stages that live on the GPU).

CASE:
  two_clusters_average  2 clusters x 3 providers (the by-hand cut twice, ring per stage), "average"
                  every 5 steps with BatchNorm: after the run (the last step is a reduce) every
                  parameter and buffer of stage s is bit-identical in both clusters, and differs
                  from the initial weights
  two_clusters_gradients, two_clusters_diloco  the same with "gradients" (every step) and
                  "diloco" (outer step every 5 steps)
  two_clusters_sync_bf16  two_clusters_average with wire.sync "bf16": the copies are bit-identical
                  after the reduce and every synced float is a bfloat16 value
  two_clusters_async  "diloco" every 5 optimizer steps under the async schedule (weight stashing,
                  several micro-batches in flight): the same bit-identity after the final reduce
  two_clusters_cut_differently  cluster 0 is one provider holding the whole model, cluster 1 cuts it
                  into 3 stages: the one node is in 3 rings (run concurrently), "average" every 5
                  steps; after the run every tensor is bit-identical in both of its copies
  two_clusters_sending_later  "gradients" over 2 clusters x 3 providers, run twice on copies of one
                  plan: every provider holding back what it sends until its next pass is queued, as
                  on a GPU (CAIRN_TEST_SEND_LATER=1, trainer/Device.cpp; each provider's log must say
                  so), and sending at once (CAIRN_TEST_SEND_LATER=0); fp32-strict; every trained
                  tensor of every node equal in both runs;
                  every step record of the first run counts the packets held back (later_sends:
                  the Root's 4 activations, a Stem's 4 and 4 gradients, the Leaf's 4 gradients),
                  the second's has no such key; gradient buckets of at most 256 bytes, so every
                  sync overlaps backward, and in the first run each provider's log counts buckets
                  copied out by the backward that finished them (none in the second)
"""
import os
import re
import shutil

import torch

import provider_cluster_test as pct  # make_clusters_node_data, launch, metrics, the settings, the keys

CASES = ["two_clusters_average", "two_clusters_gradients", "two_clusters_diloco", "two_clusters_async",
         "two_clusters_cut_differently", "two_clusters_sync_bf16", "two_clusters_sending_later"]


def case_two_clusters_gradients(args):
    case_two_clusters_average(args, "gradients")


def case_two_clusters_diloco(args):
    case_two_clusters_average(args, "diloco")


def case_two_clusters_async(args):
    case_two_clusters_average(args, "diloco", schedule="async")


def case_two_clusters_sync_bf16(args):
    case_two_clusters_average(args, wire_sync="bf16")


def case_two_clusters_cut_differently(args):
    case_two_clusters_average(args, stages=(1, 3))


def case_two_clusters_average(args, mode="average", schedule="sync", stages=(3, 3), wire_sync="fp32"):
    settings = pct.training_settings(20)
    settings.update({"local_steps": 1 if mode == "gradients" else 5, "sync": mode,
                     "record_sample_ids": False, "schedule": schedule})
    if wire_sync != "fp32":
        settings["wire"] = {"sync": wire_sync}
    data = {"train_samples": 4000, "test_samples": 500}
    # Clusters cut the same way: one ring per stage; cut differently: the 1-node cluster's node is
    # in one ring per stage of the other cluster.
    node_data, nodes, rings = pct.make_clusters_node_data(args.work, args.port, stages, settings, data, pct.KEYS)
    stage_of = lambda name: os.path.join(node_data, "nodes", name, "stage.pt")
    initial = {name: dict(torch.jit.load(stage_of(name)).state_dict()) for name in nodes[0]}
    seconds = pct.launch(node_data, args.provider, 240, ["--device", args.device])
    print(f"{stages[0]} + {stages[1]} providers in 2 clusters, {len(rings)} ring(s): {seconds:.1f} s")
    trained = lambda name: torch.jit.load(
        os.path.join(node_data, "nodes", name, "trained_stage.pt")).state_dict()
    compared = 0
    for r in rings:
        a_name, b_name = (m["name"] for m in r["members"])
        a, b = trained(a_name), trained(b_name)
        for name in r["parameters"]:
            if not torch.equal(a[name], b[name]):
                diff = (a[name].double() - b[name].double()).abs().max().item()
                pct.fail(f"{r['id']} {name}: {a_name} and {b_name} differ after the final reduce (max abs diff {diff:g})")
            compared += 1
        if all(torch.equal(a[name], initial[a_name][name]) for name in r["parameters"]):
            pct.fail(f"{r['id']}: weights did not change")
        if wire_sync == "bf16":
            # The final average travelled as bf16 and every copy adopted the decoded values: each
            # float32 value is a bfloat16 (low 16 bits zero) — with fp32 syncs almost none are.
            for name in r["parameters"]:
                t = a[name]
                if t.is_floating_point() and (t.view(torch.int32) & 0xFFFF).any():
                    pct.fail(f"{r['id']} {name}: not bf16 values after a bf16 sync")
    for name in nodes[0] + nodes[1]:
        steps = [m for m in pct.metrics(node_data, name) if "step" in m]
        if len(steps) != 20 or "sync_s" not in steps[-1]:
            pct.fail(f"{name}: expected 20 step records with sync_s")
    print(f"sync {mode}, schedule {schedule}, wire.sync {wire_sync}: {compared} parameters and buffers bit-identical across the 2 clusters after the reduce")
    pct.check_accuracy(node_data, nodes[0][-1], 0.3)
    pct.check_accuracy(node_data, nodes[1][-1], 0.3)


def case_two_clusters_sending_later(args):
    settings = pct.training_settings(20)
    # Gradient buckets of at most 256 bytes: each stage's gradients are several buckets, so the
    # all-reduce overlaps backward, and a provider that holds back what it sends also copies each
    # bucket out in the backward that finishes it (GradientOverlap.h).
    # fp32-strict: on a GPU (--device cuda) two runs are equal bit for bit only with deterministic
    # kernels and no TF32; on the CPU it is fp32.
    settings.update({"local_steps": 1, "sync": {"name": "gradients", "bucket_bytes": 256},
                     "record_sample_ids": False, "precision": "fp32-strict"})
    data = {"train_samples": 4000, "test_samples": 500}
    node_data, nodes, _ = pct.make_clusters_node_data(args.work, args.port, (3, 3), settings, data, pct.KEYS)
    at_once = node_data + "_at_once"
    shutil.rmtree(at_once, ignore_errors=True)
    shutil.copytree(node_data, at_once)
    names = nodes[0] + nodes[1]
    output = []
    later_s = pct.launch(node_data, args.provider, 240, ["--device", args.device],
                         env={"CAIRN_TEST_SEND_LATER": "1"}, output=output)
    holding = set(re.findall(r"^\[(node_\d+)\].*CAIRN_TEST_SEND_LATER=1 \(a test hook\)", output[0], re.M))
    if holding != set(names):
        pct.fail(f"providers that said they hold back what they send: {sorted(holding)}, expected {names}")
    # Sending at once said outright (CAIRN_TEST_SEND_LATER=0): a GPU's placement sends later by
    # default.
    at_once_s = pct.launch(at_once, args.provider, 240, ["--device", args.device],
                           env={"CAIRN_TEST_SEND_LATER": "0"}, output=output)
    microbatches = settings["microbatches"]
    for chain in nodes:
        for i, name in enumerate(chain):
            held = [m for m in pct.metrics(node_data, name) if "step" in m]
            expected = microbatches * (2 if 0 < i < len(chain) - 1 else 1)
            if len(held) != 20 or any(m.get("later_sends") != expected or
                                      not 0 <= m.get("held_through_receives", -1) <= expected for m in held):
                pct.fail(f"{name}: expected 20 step records with later_sends {expected} and "
                         f"held_through_receives in [0, {expected}], got {[(m.get('later_sends'), m.get('held_through_receives')) for m in held]}")
            if any("later_sends" in m for m in pct.metrics(at_once, name)):
                pct.fail(f"{name}: later_sends in a run that sends at once")
    # Each provider's closing sync line: the gradient syncs overlapped with backward, and the
    # buckets copied out by backward (every step the same buckets: those whose parameters all get
    # a gradient), none when sending at once.
    summary = re.compile(r"^\[(node_\d+)\].*gradient syncs overlapped with backward (\d+) "
                         r"\(buckets started during backward \d+, copied out by backward (\d+)\)", re.M)
    for run, log in (("held back", output[0]), ("at once", output[1])):
        counts = {m.group(1): (int(m.group(2)), int(m.group(3))) for m in summary.finditer(log)}
        for name in names:
            overlapped, copied = counts.get(name, (-1, -1))
            copies_out = run == "held back"
            if overlapped != 20 or (copied <= 0 or copied % 20 != 0 if copies_out else copied != 0):
                pct.fail(f"{name} ({run}): expected 20 gradient syncs overlapped with backward and "
                         f"{'a positive multiple of 20' if copies_out else 'no'} buckets copied out by "
                         f"backward, got {overlapped} and {copied}")
    trained = lambda folder, name: torch.jit.load(
        os.path.join(folder, "nodes", name, "trained_stage.pt")).state_dict()
    compared = 0
    for name in names:
        a, b = trained(node_data, name), trained(at_once, name)
        for t in a:
            if not torch.equal(a[t], b[t]):
                pct.fail(f"{name} {t}: trained differently when it held back what it sent")
            compared += 1
    print(f"held back: {later_s:.1f} s, at once: {at_once_s:.1f} s; {compared} trained tensors of "
          f"{len(names)} nodes equal in both runs")
    pct.check_accuracy(node_data, nodes[0][-1], 0.3)


def main():
    def add_args(parser):
        parser.add_argument("--device", default="cpu", help="where the providers train (cpu, cuda)")
    pct.main_of(CASES, globals(), add_args)


if __name__ == "__main__":
    main()
