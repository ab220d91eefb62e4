#!/usr/bin/python3
"""Churn among volunteers (issue [Q]): faults a real volunteer run meets, on top of the single
replacements of volunteer_replace_test.py (whose helpers, job and reference this shares): a real
coordinator (`clusterize --serve --lost-after-s`) and real `provider --join` processes on tcp
loopback with CurveZMQ, each step waiting for the log line that says the previous one happened.

    volunteer_churn_test.py frozen_replaced --provider BUILD/node/provider
        --clusterize BUILD/clusterize/clusterize --work DIR

frozen_replaced
    See its function: a frozen volunteer replaced, then woken, cannot take its node back.
lost_after_finishing
    See its function: a volunteer lost between its final checkpoint and its result.
bit_flip
    See its function: a flipped exponent bit in one volunteer's weights is caught before the
    average spreads it, and that volunteer's node goes to a spare.
"""
import json
import os
import signal
import sqlite3
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import volunteer_test as vt  # noqa: E402  (the shared helpers: processes, jobs, evaluation)
from volunteer_replace_test import (FLAGS, HOLD_AT, KILL_AFTER, RING_FLAGS, RING_STEPS, STEPS,  # noqa: E402
                                    TEST_SAMPLES, TRAINING, check_each_cluster, six_and_a_spare,
                                    hold_root, hold_until, key_of, leaf_records, name_of, run_reference,
                                    three_and_a_spare)


def case_frozen_replaced(args):
    """Issue [Q]: a volunteer frozen (SIGSTOP: a laptop lid closed) for longer than --lost-after-s
    is replaced by the spare; once the cluster trains again with the spare, it wakes (SIGCONT).
    It must not take its node back nor touch the run: the coordinator refuses it as that node (its
    key's row is `<node>-lost-1`; rejected{node_taken}), no current member accepts its packets
    (they admit the spare's key now: its connections are refused), and the run goes on exactly.
    Told so, it stops its run, gives the node up and joins again, as a spare under a fresh name.
    Cluster 0's Root holds after KILL_AFTER steps until the stop (the spare resumes from that
    checkpoint) and before step HOLD_AT until the woken one is back, so the run cannot end first.
    Checks: every step loss the Leaf logged equals the uninterrupted run's; the merged model's
    accuracy equals the reference's; coordinator.db gives the node to the spare's key and the
    woken key one row, its fresh name; every volunteer exits 0, the woken one too."""
    model, job = vt.prepare(args, STEPS, TEST_SAMPLES, TRAINING)
    reference, reference_accuracy = run_reference(args, model, job)
    release = hold_root(args, HOLD_AT)
    # Held also after KILL_AFTER steps until the stop: the spare resumes from that step's
    # checkpoint and has steps to go before HOLD_AT (a late stop could resume at HOLD_AT,
    # where no checkpoint after the resume comes before the release).
    stopped = hold_until(args, KILL_AFTER, "stopped")
    run = vt.Run(args, model, job, FLAGS, 4)
    out, coordinator, volunteers = run.out, run.coordinator, run.volunteers
    with run:
        stem, leaf = three_and_a_spare(run)[1:3]
        victim = next(v for v in volunteers[:3] if name_of(v[1]) == stem)
        vt.wait_for_checkpoint(coordinator, KILL_AFTER, 300, stem)
        victim[0].proc.send_signal(signal.SIGSTOP)
        open(stopped, "w").close()
        taken = coordinator.wait_for(lambda l: f"coordinator: {stem} is taken over by spare node_3" in l, 120,
                                     "the takeover")
        resumed_from = int(taken.split("from its checkpoint of step ")[1].split(";")[0])
        vt.wait_for_checkpoint(coordinator, resumed_from + 1, 120, stem)  # the spare's first
        victim[0].proc.send_signal(signal.SIGCONT)
        refused = coordinator.wait_for(lambda l: f"claiming to be {stem} from {stem}-lost-1" in l, 120,
                                       "the woken volunteer refused as its old node")
        print(refused.strip())
        told = victim[0].wait_for(lambda l: "the coordinator says: " in l and "given to another volunteer" in l,
                                  60, "the woken volunteer told its node was taken")
        print(told.strip().split("] ", 1)[-1])
        back = coordinator.wait_for(lambda l: "coordinator: back: " in l, 120, "the woken volunteer back")
        if not back.strip().endswith("spare"):
            vt.fail(f"the woken volunteer did not come back as a spare: {back.strip()}")
        back_as = back.split("coordinator: back: ")[1].split()[0]
        print(back.strip())
        open(release, "w").close()
        run.all_finish()  # every volunteer exits 0, the woken one too (a spare at the end)

    db = sqlite3.connect(os.path.join(out, "coordinator.db"))
    spare_key = key_of(volunteers[3][1])
    row = db.execute("SELECT public_key, state FROM members WHERE name = ?", (stem,)).fetchone()
    if row is None or row[0] != spare_key:
        vt.fail(f"coordinator.db: {stem} is {row}, expected the spare's key")
    frozen = [r[0] for r in db.execute("SELECT name, state, public_key FROM members") if r[2] == key_of(victim[1])]
    if frozen != [back_as] or back_as == stem:
        vt.fail(f"coordinator.db: the woken volunteer's key is in rows {frozen}, expected one, {back_as} (not {stem})")
    records = leaf_records([w for _, w in volunteers], leaf)
    every = [r for r in records if "step" in r]
    same = sum(1 for r in every if reference.get(r["step"]) == r["loss"])
    print(f"{stem} frozen, replaced from step {resumed_from}, woken and refused; {same} of {len(every)} logged "
          f"Leaf step losses equal the uninterrupted run's")
    if same != len(every) or len({r["step"] for r in every}) != STEPS:
        vt.fail(f"the run is not exact or steps are missing: {same} of {len(every)} equal")
    reported = vt.check_trained(out, TEST_SAMPLES, f"Leaf accuracy {{reported:.4f}}; merged model in PyTorch "
                                f"{{accuracy:.4f}}; uninterrupted run {reference_accuracy:.4f}")
    if reported != reference_accuracy:
        vt.fail("the run with a woken, replaced volunteer differs from the uninterrupted run")


def case_lost_after_finishing(args):
    """Issue [Q]: the Stem's volunteer is SIGKILLed after it finished training and uploaded its
    final checkpoint, just before its result would go up (CAIRN_TEST_CRASH_BEFORE_RESULT=1). A
    spare could only resume at the last step and wait for neighbours that have finished and gone,
    so the coordinator makes the Stem's result from that checkpoint (the stage file with its
    weights) and finishes the run; the spare is not used. Checks: the coordinator says so and
    takes no spare; every other volunteer, the spare too, exits 0; the merged model evaluates in
    PyTorch to the Leaf's accuracy, which equals the uninterrupted run's, and the Stem's
    trained_stage.pt holds the weights of the reference's Stem exactly."""
    model, job = vt.prepare(args, STEPS, TEST_SAMPLES, TRAINING)
    reference, reference_accuracy = run_reference(args, model, job)
    os.environ["CAIRN_TEST_CRASH_BEFORE_RESULT"] = "1"
    run = vt.Run(args, model, job, FLAGS, 4)
    out, coordinator, volunteers = run.out, run.coordinator, run.volunteers
    with run:
        stem = three_and_a_spare(run)[1]
        victim = next(v for v in volunteers[:3] if name_of(v[1]) == stem)
        said = coordinator.wait_for(lambda l: f"coordinator: {stem} was lost after its final checkpoint" in l, 180,
                                    "the result made from the final checkpoint")
        print(said.strip())
        run.all_finish(but=victim[0])
        if victim[0].finish(10) != -9:
            vt.fail("the Stem's volunteer was not the one killed by the test hook")
    if coordinator.count(lambda l: "is taken over by spare" in l):
        vt.fail("a spare was given the node that had finished")
    import torch
    ref_out = args.reference_out
    ref_name = json.load(open(os.path.join(ref_out, "plan.json")))["clusters"][0]["chain"][1]  # its Stem
    ref_stem = torch.jit.load(os.path.join(ref_out, "nodes", ref_name, "trained_stage.pt")).state_dict()
    got = torch.jit.load(os.path.join(out, "nodes", stem, "trained_stage.pt")).state_dict()
    if sorted(ref_stem) != sorted(got) or any(not torch.equal(ref_stem[k], got[k]) for k in got):
        vt.fail(f"{stem}'s result from its checkpoint differs from the uninterrupted run's trained stage")
    print(f"{stem}'s result from its final checkpoint: {len(got)} tensors, equal to the uninterrupted run's")
    reported = vt.check_trained(out, TEST_SAMPLES, f"Leaf accuracy {{reported:.4f}}; merged model in PyTorch "
                                f"{{accuracy:.4f}}; uninterrupted run {reference_accuracy:.4f}")
    if reported != reference_accuracy:
        vt.fail("the run finished from a checkpoint differs from the uninterrupted run")


FLIP_AT = 25  # after the Root's checkpoint of step 20 (checkpoint_every 10), before that of step 30


def case_bit_flip(args):
    """Issue [Q], silent corruption: 2 clusters x 3 stages and a spare, averaging every step. Right
    after step FLIP_AT, cluster 0's Root flips bit 30 (the top exponent bit) of conv1.weight[0]
    (CAIRN_TEST_FLIP_BIT, trainer/TestFlipBit.h): the value becomes ~1e38, inf or NaN. The ring
    check before that step's average (node/ring/RingSyncMath.h checkContributions) finds it: the Root
    refuses to go on and its volunteer exits naming the corruption, its ring peer drops it and
    averages without it, the spare takes the node over from its checkpoint of step 20 (written
    before the flip) and the run finishes. Cluster 0's Root holds before step FLIP_AT - 3 until the
    coordinator acknowledged its checkpoint of step 20 (however fast the machine, the spare gets
    it), and cluster 1's Root before step HOLD_AT until the spare's cluster agreed on its resume
    step, so the replacement finds its ring peer training.
    Checks: the flip happened and was refused by the volunteer that made it (exit 2, "corrupt"); the
    coordinator gave its node to the spare; every parameter of both clusters' trained stages is
    finite and below 1e3 in magnitude (without the check the flipped value is averaged into every
    copy: ~5e37, inf or NaN); each cluster's weights evaluate in PyTorch to its Leaf's accuracy."""
    os.makedirs(args.work, exist_ok=True)
    once = os.path.join(args.work, "flipped")
    os.environ["CAIRN_TEST_FLIP_BIT"] = f"0:0:{FLIP_AT}:conv1.weight:0:30:{once}"
    release = os.path.join(args.work, "release_cluster_1")
    uploaded = os.path.join(args.work, "release_cluster_0")
    os.environ["CAIRN_TEST_HOLD"] = f"0:{FLIP_AT - 3}:{uploaded},1:{HOLD_AT}:{release}"
    run = vt.start_run(args, RING_STEPS, TEST_SAMPLES, RING_FLAGS, 7, TRAINING)
    out, coordinator, volunteers = run.out, run.coordinator, run.volunteers
    with run:
        root = six_and_a_spare(run)[0][0]
        flipper = next(v for v, w in volunteers[:6] if name_of(w) == root)
        coordinator.wait_for(lambda l: f"coordinator: checkpoint of {root} at step 20 " in l, 300,
                             f"{root}'s checkpoint of step 20")
        open(uploaded, "w").close()
        flipper.wait_for(lambda l: "CAIRN_TEST_FLIP_BIT: flipped bit 30 of conv1.weight[0]" in l, 300, "the flip")
        code = flipper.finish(120)
        taken = coordinator.wait_for(lambda l: f"coordinator: {root} is taken over by spare node_6" in l, 120,
                                     "the takeover")
        print(taken.strip())
        if "from its checkpoint of step 20;" not in taken:
            vt.fail("the spare was not given the Root's checkpoint of step 20")
        volunteers[6][0].wait_for(lambda l: "resume: the cluster agreed on step" in l, 120,
                                  "the replacement's resume agreement")
        open(release, "w").close()
        run.all_finish(but=flipper)
    said = [l.strip() for l in flipper.lines if "corrupt" in l]
    if code != 2 or not said:
        vt.fail(f"the volunteer that flipped a bit exited {code} without naming the corruption")
    print(f"{root}'s volunteer exited {code}: {said[-1]}")
    import torch
    worst = 0.0
    for node, name, p in vt.trained_parameters(out):
        if not torch.isfinite(p).all():
            vt.fail(f"{node}'s trained {name} holds a non-finite value: the corruption spread")
        worst = max(worst, p.abs().max().item())
    print(f"largest trained weight magnitude over both clusters: {worst:.4g}")
    if worst >= 1e3:
        vt.fail(f"a trained weight of magnitude {worst}: the corruption spread")
    check_each_cluster(args, out)


def main():
    vt.main_of(["frozen_replaced", "lost_after_finishing", "bit_flip"], globals())


if __name__ == "__main__":
    main()
