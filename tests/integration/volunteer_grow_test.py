#!/usr/bin/python3
"""Growing (issue [J] test 3; docs/OPERATIONS.md "Growing"): a real coordinator
(`clusterize --serve --grow`) and real `provider --join` processes on tcp loopback with CurveZMQ.
No sleeps stand in for synchronisation: each step waits for the log line that says the previous
one happened.

    volunteer_grow_test.py --provider BUILD/node/provider --clusterize BUILD/clusterize/clusterize
        --work DIR

Three volunteers form one cluster of 3 stages and train EPOCHS epochs of a Fashion-MNIST slice
(data.chunks 4). Once it is planned, three more volunteers join; the coordinator proposes cluster
1 from them with the data dealt over two clusters from the epoch after the newest one reported,
the running Root takes the deal at a step boundary (or refuses it when it is already in that
epoch, and the coordinator deals again from a later one: either way is fine here), the three get
their assignments, start at that epoch's first step F and are admitted by their ring peers at the
sync after step F - 1. Checks:
  * cluster 0's Root took the deal; every running member admitted its newcomer at step F and every
    newcomer joined at that step, with the same weights checksum on both sides;
  * both clusters' Leaves logged every step up to the same total, and the newcomers' first step is F;
  * the run finishes (the coordinator merges and exits 0, every volunteer exits 0);
  * at the end both clusters hold identical weights: every stage's trained_stage.pt of cluster 1
    equals cluster 0's tensor for tensor (the last sync), and PyTorch evaluates both clusters'
    merged models to the accuracy their Leaves reported.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import volunteer_test as vt  # noqa: E402  (the shared helpers: processes, jobs, evaluation)

EPOCHS = 10
TRAIN_SAMPLES = 1600   # 4 chunks; 50 steps of 32 per epoch with one cluster, 25 with two
TEST_SAMPLES = 500
FLAGS = ["--min-volunteers", "3", "--clusters", "1", "--cuts", "7,14", "--grow"]


def name_of(workdir):
    return json.load(open(os.path.join(workdir, "membership.json")))["name"]


def records(workdir, name):
    path = os.path.join(workdir, "node_data", "nodes", name, "metrics.jsonl")
    return [json.loads(line) for line in open(path) if line.endswith("\n")]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--provider", required=True)
    parser.add_argument("--clusterize", required=True)
    parser.add_argument("--work", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    model = os.path.join(args.work, "model.pt")
    subprocess.run([sys.executable, os.path.join(vt.EXAMPLE, "make_model.py"), "--out", model], check=True,
                   stdout=subprocess.DEVNULL)
    job_path = vt.write_job(args.work, model, 0, TEST_SAMPLES, {"epochs": EPOCHS, "max_steps": 0})
    job = json.load(open(job_path))
    job["data"]["train_samples"] = TRAIN_SAMPLES
    job["data"]["chunks"] = 4
    json.dump(job, open(job_path, "w"))

    out = os.path.join(args.work, "coordinator")
    coordinator, invite = vt.start_coordinator(args, job_path, model, out, FLAGS)
    ports = vt.free_ports(6)
    volunteers = []
    try:
        for i in range(3):
            volunteers.append(vt.volunteer(args, invite, i, ports[i], ["--upload-mbps", "0"]))
        coordinator.wait_for(lambda l: "planned 1 cluster(s) on 3 volunteers" in l, 120, "'planned'")
        for i in range(3, 6):
            volunteers.append(vt.volunteer(args, invite, i, ports[i], ["--upload-mbps", "0"]))
        proposed = coordinator.wait_for(lambda l: "coordinator: growing: cluster 1 from spares" in l, 120,
                                        "'growing: cluster 1'")
        print(proposed.strip())
        formed = coordinator.wait_for(lambda l: "coordinator: cluster 1 formed" in l, 120, "'cluster 1 formed'")
        print(formed.strip())
        vt.all_finish(coordinator, volunteers)
    finally:
        vt.kill_all(coordinator, volunteers)

    plan = json.load(open(os.path.join(out, "plan.json")))
    chain0 = plan["clusters"][0]["chain"]
    by_name = {name_of(w): (v, w) for v, w in volunteers}
    nodes = {}
    for name, (v, w) in by_name.items():
        node = json.load(open(os.path.join(w, "node_data", "nodes", name, "node.json")))
        nodes[name] = node
    chain1 = [n for n, _ in sorted(((n, d["stage"]) for n, d in nodes.items() if d["cluster"] == 1),
                                   key=lambda x: x[1])]
    if len(chain1) != 3:
        vt.fail(f"cluster 1 has nodes {chain1}, expected 3 stages")
    root0 = by_name[chain0[0]][0]
    took = [l for l in root0.lines if "data: took the new deal" in l]
    if not took:
        vt.fail(f"cluster 0's Root {chain0[0]} never took the new deal")
    print("cluster 0's Root:", took[-1].strip())

    # The new cluster's first step F: its Root's plan.
    leaf1 = records(by_name[chain1[2]][1], chain1[2])
    steps1 = sorted(r["step"] for r in leaf1 if "step" in r and "loss" in r)
    leaf0 = records(by_name[chain0[2]][1], chain0[2])
    steps0 = sorted(r["step"] for r in leaf0 if "step" in r and "loss" in r)
    # Step records count steps done: a cluster starting at step F first records F + 1.
    first = steps1[0] - 1
    total = steps0[-1]
    if steps0 != list(range(1, total + 1)) or steps1 != list(range(first + 1, total + 1)) or first <= 0:
        vt.fail(f"steps: cluster 0 {steps0[:2]}..{steps0[-2:]}, cluster 1 {steps1[:2]}..{steps1[-2:]}")
    print(f"cluster 0 trained steps 0..{total - 1}, cluster 1 steps {first}..{total - 1} of {total}")

    # Admission exactly at F, with the same weights on both sides.
    for s in range(3):
        old, new = by_name[chain0[s]][0], by_name[chain1[s]][0]
        admitted = [l for l in old.lines if "admitted [" + chain1[s] + "]" in l]
        joined = [l for l in new.lines if ": joined from " + chain0[s] in l]
        if not admitted or not joined:
            vt.fail(f"stage {s}: {chain0[s]} admitted {admitted}, {chain1[s]} joined {joined}")
        a_step = int(re.search(r" at step (\d+),", admitted[0]).group(1))
        j_step = int(re.search(r" at its step (\d+),", joined[0]).group(1))
        a_sum = re.search(r"sent weights checksum (\d+)", admitted[0]).group(1)
        j_sum = re.search(r"fetched weights checksum (\d+)", joined[0]).group(1)
        print(f"stage {s}: {chain0[s]} admitted {chain1[s]} at step {a_step} (checksum {a_sum}); "
              f"joined at {j_step} ({j_sum})")
        if a_step != first or j_step != first or a_sum != j_sum:
            vt.fail(f"stage {s}: admission at step {a_step}/{j_step} with checksums {a_sum}/{j_sum}; "
                    f"the new cluster's first step is {first}")

    # Identical weights at the end: every stage of cluster 1 equals cluster 0's.
    for s in range(3):
        a = torch.jit.load(os.path.join(out, "nodes", chain0[s], "trained_stage.pt")).state_dict()
        b = torch.jit.load(os.path.join(out, "nodes", chain1[s], "trained_stage.pt")).state_dict()
        if a.keys() != b.keys() or any(not torch.equal(a[k], b[k]) for k in a):
            diff = [k for k in a if k not in b or not torch.equal(a[k], b[k])]
            vt.fail(f"stage {s}: {chain0[s]} and {chain1[s]} end with different weights: {diff[:5]}")
    print("both clusters end with identical weights (every tensor of every stage)")

    summary = json.load(open(os.path.join(out, "run_result.json")))
    for entry in summary["clusters"]:
        merged = os.path.join(args.work, f"cluster_{entry['cluster']}.pt")
        subprocess.run([args.clusterize, "--merge", out, "--cluster", str(entry["cluster"]), "--out", merged],
                       check=True, stdout=subprocess.DEVNULL)
        accuracy = vt.evaluate(merged, TEST_SAMPLES)
        reported = entry["eval"]["accuracy"]
        print(f"cluster {entry['cluster']}: Leaf reports {reported:.4f}, its weights in PyTorch {accuracy:.4f}")
        if abs(accuracy - reported) > 1e-9:
            vt.fail(f"cluster {entry['cluster']}: PyTorch gives {accuracy}, its Leaf reported {reported}")
    if len(summary["clusters"]) != 2:
        vt.fail(f"run_result.json names {len(summary['clusters'])} clusters, expected 2")
    print("PASS")


if __name__ == "__main__":
    main()
