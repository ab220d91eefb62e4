#!/usr/bin/python3
"""Growing (issue [J] test 3; docs/OPERATIONS.md "Growing"): a real coordinator
(`clusterize --serve --grow`) and real `provider --join` processes on tcp loopback with CurveZMQ.
No sleeps stand in for synchronisation: each step waits for the log line that says the previous
one happened.

    volunteer_grow_test.py --provider BUILD/node/provider --clusterize BUILD/clusterize/clusterize
        --work DIR [--data served|files] [--running 1|2]

--data served (the default, and what ctest runs as integration.volunteers.grows): the realistic
volunteer setting. The Fashion-MNIST slice is written as four safetensors shards (and two test
shards) that only the coordinator's job names (data.source "coordinator"); no volunteer opens
them: each Root fetches its chunks from the coordinator, which serves them by the deal from the
moment it proposes it (coordinator/ChunkServer.h). Then also: cluster 1's Root fetched exactly
the chunks the grown deal gives it (1 and 3: dealt round robin over two clusters) and both test
chunks, byte-identical to the coordinator's files, cluster 0's Root all four and both test
chunks, and the coordinator refused no chunk request. --data files: every volunteer reads the
idx files itself (data.chunks 4); the same checks but those of the chunk caches. (The file-data
deal is also run in-process by DealRun.* and DealChange.*, tests/trainer/DealRunTest.cpp.)

--dial-out 1 (integration.volunteers.grows runs with it): one volunteer of the first wave joins
without an address, so its node is placed dial-out only (its neighbours and ring peers dial
nothing of it: it dials them); the new cluster's node of that stage copies that node.json and must
still listen (its spare is reachable), and that dial-out-only node takes its new ring member live.
Then also: the first wave's plan has a node placed dial-out only, the new cluster none.

--spares-dial-out 1 (integration.volunteers.grows_from_two runs with it): one of the spares that
form the new cluster joins without an address. The coordinator takes the reachable spares first
(stage 0 here) and the dial-out-only one where no reachable one is left (stage 1), with no relay:
none of its links joins two dial-out-only volunteers. Its node is placed dial-out only, and the
running clusters' nodes of that stage take it into their rings live as a member that dials them.
Then also: exactly that node of the new cluster is placed dial-out only.

--running 2 (integration.volunteers.grows_from_two): growth from two running clusters, which
must take the deal together. Four volunteers form two clusters of 2 stages; two more join and
form cluster 2. Then also: both running Roots took the same deal at the same step (their rings
agreed on it at a sync: trainer/DealChange.h), though each got the coordinator's update at its
own moment; all three clusters end with identical weights.

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
import sys

import zlib

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import volunteer_harness as vt  # noqa: E402  (the shared helpers: processes, jobs, evaluation)
import served_chunks_test as sc  # noqa: E402  (safetensors shards of Fashion-MNIST)

EPOCHS = 10
TRAIN_SAMPLES = 1600   # 4 chunks; 50 steps of 32 per epoch with one cluster, 25 with two
# Served safetensors shards train about 2.5 times as fast here as idx files decoded by the Root; an
# epoch must outlast the coordinator's round trip (heartbeat, update, the Root's answer: ~2 s) or
# every deal comes after its epoch began and is dealt again until the run ends. So the served run
# has 125 steps per epoch (62 with two clusters) over fewer epochs. The deal comes within the
# first epoch here (step 52 of 125 from one running cluster, 40 of 62 from two), so 5 epochs leave
# three more for a slow machine; every epoch after the growth only adds time to the test.
SERVED_EPOCHS, SERVED_TRAIN_SAMPLES = 5, 4000
TEST_SAMPLES = 500


def flags(running, stages):
    cuts = "7,14" if stages == 3 else "7"
    return ["--min-volunteers", str(running * stages), "--clusters", str(running), "--cuts", cuts, "--grow"]


SHARDS, TEST_SHARDS = 4, 2


def served_data(work):
    """The slice as safetensors shards on the coordinator's side: train_k holds training images
    1000k..1000k+999, test_k test images 250k..250k+249 (normalised as vt.evaluate does)."""
    data_dir, test_dir = os.path.join(work, "coordinator_data"), os.path.join(work, "coordinator_test_data")
    sc.make_shards(data_dir, "train", "train", SHARDS, SERVED_TRAIN_SAMPLES // SHARDS)
    sc.make_shards(test_dir, "test", "t10k", TEST_SHARDS, TEST_SAMPLES // TEST_SHARDS)
    files = {k: os.path.join(data_dir, f"train_{k}.safetensors") for k in range(SHARDS)}
    files.update({SHARDS + k: os.path.join(test_dir, f"test_{k}.safetensors") for k in range(TEST_SHARDS)})
    data = {"format": "safetensors", "location": data_dir, "test_location": test_dir,
            "source": "coordinator", "cache_mb": 32}
    return data, files


def evaluate_served(path):
    """PyTorch's accuracy on exactly the test tensors the shards hold (sc.make_shards' arithmetic)."""
    net = torch.jit.load(path)
    net.eval()
    images = vt.load_idx("t10k-images-idx3-ubyte.gz", 16).reshape(-1, 1, 28, 28)[:TEST_SAMPLES]
    labels = torch.from_numpy(vt.load_idx("t10k-labels-idx1-ubyte.gz", 8)[:TEST_SAMPLES].astype(np.int64))
    x = torch.from_numpy(((images.astype(np.float32) / 255.0 - vt.MEAN) / vt.STD).astype(np.float32))
    with torch.no_grad():
        logits = torch.cat([net(x[i:i + 250]) for i in range(0, TEST_SAMPLES, 250)])
    return (logits.argmax(1) == labels).double().mean().item()


def check_caches(chains, deal, by_name, files, coordinator):
    """Each Root's chunk cache holds the chunks the deal gives its cluster in any epoch it trains
    (chunk k goes to cluster k % n while the deal says n clusters; the new cluster trains only
    under the last entry) and every test chunk, byte-identical to the coordinator's files; the
    coordinator refused nothing."""
    new = len(chains) - 1
    expected = {}
    for c, chain in enumerate(chains):
        entries = deal[-1:] if c == new else deal
        expected[chain[0]] = sorted({k for e in entries for k in range(SHARDS) if k % e["clusters"] == c})
    for root, chunks in expected.items():
        folder = os.path.join(by_name[root][1], "chunks")
        cached = sorted(os.listdir(folder))
        want = sorted([f"{k}-train_{k}.safetensors" for k in chunks] +
                      [f"{SHARDS + k}-test_{k}.safetensors" for k in range(TEST_SHARDS)])
        if cached != want:
            vt.fail(f"{root}'s chunk cache holds {cached}, expected {want}")
        for name in cached:
            k = int(name.split("-")[0])
            if zlib.crc32(open(os.path.join(folder, name), "rb").read()) != \
                    zlib.crc32(open(files[k], "rb").read()):
                vt.fail(f"{root}'s cached chunk {k} differs from the coordinator's {files[k]}")
        print(f"{root}'s chunk cache: {cached} (equal to the coordinator's files)")
    refused = coordinator.count(lambda l: "refused a chunk request" in l)
    if refused:
        vt.fail(f"the coordinator refused {refused} chunk request(s)")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--provider", required=True)
    parser.add_argument("--clusterize", required=True)
    parser.add_argument("--work", required=True)
    parser.add_argument("--data", choices=["served", "files"], default="served")
    parser.add_argument("--dial-out", type=int, choices=[0, 1], default=0,
                        help="how many of the first wave join dial-out only (no --listen)")
    parser.add_argument("--spares-dial-out", type=int, choices=[0, 1], default=0,
                        help="how many of the spares forming the new cluster join dial-out only")
    parser.add_argument("--running", type=int, choices=[1, 2], default=1,
                        help="clusters training before the growth (2: 2 stages each, else 3)")
    args = parser.parse_args()
    running = args.running
    stages = 3 if running == 1 else 2
    torch.set_num_threads(1)
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    model = vt.make_model(args.work)
    served = args.data == "served"
    job_path = vt.write_job(args.work, model, 0, TEST_SAMPLES,
                            {"epochs": SERVED_EPOCHS if served else EPOCHS, "max_steps": 0})
    job = json.load(open(job_path))
    if served:
        job["data"], files = served_data(args.work)
    else:
        job["data"]["train_samples"] = TRAIN_SAMPLES
        job["data"]["chunks"] = 4
    json.dump(job, open(job_path, "w"))

    first_wave = running * stages
    run = vt.Run(args, model, job_path, flags(running, stages), first_wave + stages)
    out, coordinator, volunteers = run.out, run.coordinator, run.volunteers
    with run:
        run.join(first_wave - args.dial_out, ["--upload-mbps", "0"])
        run.join(args.dial_out, ["--upload-mbps", "0"], dial_out_only=True)
        run.wait_planned(running)
        run.join(stages - args.spares_dial_out, ["--upload-mbps", "0"])
        run.join(args.spares_dial_out, ["--upload-mbps", "0"], dial_out_only=True)
        proposed = coordinator.wait_for(lambda l: f"coordinator: growing: cluster {running} from spares" in l,
                                        120, f"'growing: cluster {running}'")
        print(proposed.strip())
        formed = coordinator.wait_for(lambda l: f"coordinator: cluster {running} formed" in l, 120,
                                      f"'cluster {running} formed'")
        print(formed.strip())
        run.all_finish()

    by_name = {vt.name_of(w): (v, w) for v, w in volunteers}
    nodes = {}
    for name, (v, w) in by_name.items():
        node = json.load(open(os.path.join(w, "node_data", "nodes", name, "node.json")))
        nodes[name] = node
    chains = []
    for c in range(running + 1):
        chain = [n for n, _ in sorted(((n, d["stage"]) for n, d in nodes.items() if d["cluster"] == c),
                                      key=lambda x: x[1])]
        if len(chain) != stages:
            vt.fail(f"cluster {c} has nodes {chain}, expected {stages} stages")
        chains.append(chain)
    new_chain = chains[running]
    behind = sorted(n for n, d in nodes.items() if d.get("dial_out_only"))
    behind_new = [n for n in behind if n in new_chain]
    if len(behind) != args.dial_out + args.spares_dial_out or len(behind_new) != args.spares_dial_out:
        vt.fail(f"nodes placed dial-out only: {behind} (new cluster: {behind_new}); expected "
                f"{args.dial_out} in the first wave and {args.spares_dial_out} in the new cluster")
    if behind:
        print(f"placed dial-out only: {behind}; the new cluster: {new_chain}")

    # Every running Root took the deal, the same one at the same step.
    taken = []
    for c in range(running):
        root = by_name[chains[c][0]][0]
        took = [l for l in root.lines if "data: took the new deal" in l]
        if not took:
            vt.fail(f"cluster {c}'s Root {chains[c][0]} never took the new deal")
        m = re.search(r"took the new deal (\[.*?\]) at step (\d+)", took[-1])
        taken.append((m.group(1), int(m.group(2))))
        print(f"cluster {c}'s Root:", took[-1].strip())
    if len(set(taken)) != 1:
        vt.fail(f"the running Roots took different deals or at different steps: {taken}")
    deal = json.loads(taken[0][0])
    # Each running Root wrote the deal it took into its own node.json as the deal in force (a
    # restart plans with it); the offer is gone from it.
    for c in range(running):
        extra = nodes[chains[c][0]].get("extra", {})
        if extra.get("deal") != deal or "offered_deal" in extra:
            vt.fail(f"{chains[c][0]}'s node.json: extra.deal {extra.get('deal')}, offered_deal "
                    f"{extra.get('offered_deal')}; expected the deal taken {deal} and no offer")
    if running > 1:
        agreed = [l for c in range(running) for l in by_name[chains[c][0]][0].lines
                  if "refused a new deal" in l]
        print(f"the {running} running Roots took deal {taken[0][0]} at step {taken[0][1]}; "
              f"refusals on the way (all Roots alike): {len(agreed)}")
    if served:
        check_caches(chains, deal, by_name, files, coordinator)

    # The new cluster's first step F: its Leaf's first record.
    def leaf_steps(chain):
        leaf = vt.node_records(by_name[chain[-1]][1], chain[-1])
        return sorted(r["step"] for r in leaf if "step" in r and "loss" in r)
    steps_new = leaf_steps(new_chain)
    # Step records count steps done: a cluster starting at step F first records F + 1.
    first = steps_new[0] - 1
    total = leaf_steps(chains[0])[-1]
    for c in range(running):
        steps = leaf_steps(chains[c])
        if steps != list(range(1, total + 1)):
            vt.fail(f"steps: cluster {c} {steps[:2]}..{steps[-2:]}, expected 1..{total}")
    if steps_new != list(range(first + 1, total + 1)) or first <= 0:
        vt.fail(f"steps: cluster {running} {steps_new[:2]}..{steps_new[-2:]} of {total}")
    print(f"clusters 0..{running - 1} trained steps 0..{total - 1}, cluster {running} steps {first}..{total - 1} "
          f"of {total}")

    # Admission exactly at F, with the same weights on both sides: cluster 0's member (the first of
    # the view) sends the welcome; every other running member admits the newcomer at that sync too.
    for s in range(stages):
        old, new = by_name[chains[0][s]][0], by_name[new_chain[s]][0]
        admitted = [l for l in old.lines if "admitted [" + new_chain[s] + "]" in l]
        joined = [l for l in new.lines if ": joined from " + chains[0][s] in l]
        if not admitted or not joined:
            vt.fail(f"stage {s}: {chains[0][s]} admitted {admitted}, {new_chain[s]} joined {joined}")
        a_step = int(re.search(r" at step (\d+),", admitted[0]).group(1))
        j_step = int(re.search(r" at its step (\d+),", joined[0]).group(1))
        a_sum = re.search(r"sent weights checksum (\d+)", admitted[0]).group(1)
        j_sum = re.search(r"fetched weights checksum (\d+)", joined[0]).group(1)
        print(f"stage {s}: {chains[0][s]} admitted {new_chain[s]} at step {a_step} (checksum {a_sum}); "
              f"joined at {j_step} ({j_sum})")
        if a_step != first or j_step != first or a_sum != j_sum:
            vt.fail(f"stage {s}: admission at step {a_step}/{j_step} with checksums {a_sum}/{j_sum}; "
                    f"the new cluster's first step is {first}")
        for c in range(1, running):
            other = by_name[chains[c][s]][0]
            if not any(f"[{new_chain[s]}] admitted by {chains[0][s]}" in l for l in other.lines):
                vt.fail(f"stage {s}: {chains[c][s]} never logged {new_chain[s]} admitted by {chains[0][s]}")

    # Identical weights at the end: every stage of every cluster equals cluster 0's.
    for c in range(1, running + 1):
        for s in range(stages):
            a = torch.jit.load(os.path.join(out, "nodes", chains[0][s], "trained_stage.pt")).state_dict()
            b = torch.jit.load(os.path.join(out, "nodes", chains[c][s], "trained_stage.pt")).state_dict()
            if a.keys() != b.keys() or any(not torch.equal(a[k], b[k]) for k in a):
                diff = [k for k in a if k not in b or not torch.equal(a[k], b[k])]
                vt.fail(f"stage {s}: {chains[0][s]} and {chains[c][s]} end with different weights: {diff[:5]}")
    print(f"all {running + 1} clusters end with identical weights (every tensor of every stage)")

    summary = vt.check_cluster_weights(
        args, out, evaluate_served if served else (lambda path: vt.evaluate(path, TEST_SAMPLES)),
        "cluster {cluster}: Leaf reports {reported:.4f}, its weights in PyTorch {accuracy:.4f}",
        "cluster {cluster}: PyTorch gives {accuracy}, its Leaf reported {reported}")
    if len(summary["clusters"]) != running + 1:
        vt.fail(f"run_result.json names {len(summary['clusters'])} clusters, expected {running + 1}")
    print("PASS")


if __name__ == "__main__":
    main()
