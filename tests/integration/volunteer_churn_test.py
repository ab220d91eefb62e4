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
active_hours
    See its function: a volunteer whose --active-hours end hands its node over to a spare at a
    step boundary and comes back as a spare.
two_replacements
    See its function: two replacements in a row in one pipeline (overlapping faults).
"""
import json
import os
import signal
import sqlite3
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import volunteer_harness as vt  # noqa: E402  (the shared helpers: processes, jobs, evaluation)
from volunteer_replace_test import (FLAGS, HOLD_AT, KILL_AFTER, RING_FLAGS, RING_STEPS, STEPS,  # noqa: E402
                                    TEST_SAMPLES, TRAINING, check_credit, check_each_cluster,
                                    check_exact_resume, hold_root, hold_until, key_of,
                                    kill_after_checkpoint, leaf_records,
                                    name_of, run_reference, six_and_a_spare, three_and_a_spare)


SECOND_KILL_AFTER = 50  # two_replacements: the second kill's step (the first is KILL_AFTER)
HOURS_END_AT = 30  # active_hours: the Root holds before this step until the leaver's clock says 07:30


def case_frozen_replaced(args):
    """Issue [Q]: a volunteer frozen (SIGSTOP: a laptop lid closed) for longer than --lost-after-s
    is replaced by the spare; once the cluster trains again with the spare, it wakes (SIGCONT).
    It must not take its node back nor touch the run: the coordinator refuses it as that node (its
    key's row is `<node>-lost-1`; rejected{node_taken}), no current member accepts its packets
    (they admit the spare's key now: its connections are refused), and the run goes on exactly.
    Told so, it stops its run, gives the node up and joins again, as a spare under a fresh name.
    Cluster 0's Root holds after KILL_AFTER steps until the stop (the spare resumes from that
    checkpoint) and before step HOLD_AT until the woken one is back, so the run cannot end first.
    Checks: it is lost by its silence (its connections stay open: not as a volunteer whose process
    ended, --gone-after-s); every step loss the Leaf logged equals the uninterrupted run's; the
    merged model's accuracy equals the reference's; coordinator.db gives the node to the spare's
    key and the woken key one row, its fresh name; every volunteer exits 0, the woken one too."""
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
        # Frozen, its connections to the coordinator stay open: lost by its silence, never as gone.
        lost = coordinator.wait_for(lambda l: f"coordinator: lost: {stem} " in l, 10, f"'lost: {stem}'")
        if "no heartbeat for" not in lost:
            vt.fail(f"the frozen volunteer was not lost by its silence: {lost.strip()}")
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


def case_active_hours(args):
    """Volunteer 0 computes only 22:00-07:00 (--active-hours), read from a test clock
    (CAIRN_TEST_CLOCK, a file holding HH:MM); volunteers 1 and 2 at all hours; a 4th joins as a
    spare. The Root holds before step HOURS_END_AT (CAIRN_TEST_HOLD) until the coordinator holds a
    checkpoint of step >= KILL_AFTER from volunteer 0 and its clock says 07:30; so the stop comes
    after KILL_AFTER and at most a few steps after HOURS_END_AT, never as late as the second hold
    at HOLD_AT (a stop needs the cluster to step: a fast machine reaches HOLD_AT from step 30 in
    half a second, a CI run once did before the stop was asked, and waited there). Volunteer 0
    stops the cluster at a step boundary (every node checkpoints that step),
    says `leaving` with the reason, and waits, still running; the spare takes its node over from
    that very checkpoint, the rest of the cluster (paused, not stopped) resumes with the spare from
    that step. Then its clock says 22:30: it joins again and, its node taken, becomes a spare under
    a fresh name (the store keeps its key), and exits 0 when the run is over. Cluster 0's Root holds
    before step HOLD_AT until the rejoin is seen (CAIRN_TEST_HOLD), so the run cannot end first.
    Whatever stage volunteer 0 held (Root, Stem or Leaf: the plan decides), the checks are: the
    cluster resumed from exactly the step volunteer 0 stopped at; every step loss the Leaf logged
    (over every holder) equals the uninterrupted run's; the merged model's accuracy equals the
    reference's."""
    model, job = vt.prepare(args, STEPS, TEST_SAMPLES, TRAINING)
    reference, reference_accuracy = run_reference(args, model, job)
    clock, release = os.path.join(args.work, "clock"), os.path.join(args.work, "release")
    hours_end = os.path.join(args.work, "hours_end")
    with open(clock, "w") as f:
        f.write("23:00\n")
    os.environ["CAIRN_TEST_CLOCK"] = clock
    os.environ["CAIRN_TEST_HOLD"] = f"0:{HOURS_END_AT}:{hours_end},0:{HOLD_AT}:{release}"
    run = vt.Run(args, model, job, FLAGS, 4)
    out, coordinator, volunteers = run.out, run.coordinator, run.volunteers
    with run:
        run.join(1, ["--upload-mbps", "200", "--active-hours", "22:00-07:00"])
        run.join(2, ["--upload-mbps", "200"])
        run.wait_planned(1)
        run.join(1)
        coordinator.wait_for(lambda l: "joined: node_3 " in l and ", spare" in l, 120, "the spare")
        leaver, leaver_dir = volunteers[0]
        node = name_of(leaver_dir)
        vt.wait_for_checkpoint(coordinator, KILL_AFTER, 300, node)
        with open(clock, "w") as f:
            f.write("07:30\n")
        open(hours_end, "w").close()
        stopped = leaver.wait_for(lambda l: "stopped cleanly after step " in l, 120, "the leaver's stop")
        stop_step = int(stopped.split("stopped cleanly after step ")[1].split()[0])
        if not KILL_AFTER < stop_step < HOLD_AT:
            vt.fail(f"the leaver stopped after step {stop_step}, outside ({KILL_AFTER}, {HOLD_AT})")
        coordinator.wait_for(lambda l: f"coordinator: {node} is leaving (its active hours 22:00-07:00 are "
                             "over (local time 07:30))" in l, 60, "the leaving with its reason")
        taken = coordinator.wait_for(lambda l: f"coordinator: {node} is taken over by spare node_3" in l, 60,
                                     "the takeover")
        print(taken.strip())
        if f"from its checkpoint of step {stop_step};" not in taken:
            vt.fail(f"the spare was not given the checkpoint of step {stop_step}, where {node} stopped")
        leaver.wait_for(lambda l: "outside the active hours 22:00-07:00 (local time 07:30)" in l, 60,
                        "the leaver waiting for its hours")
        with open(clock, "w") as f:
            f.write("22:30\n")
        back = coordinator.wait_for(lambda l: "coordinator: back: " in l, 120, "the leaver back")
        if not back.strip().endswith("spare"):
            vt.fail(f"the leaver did not come back as a spare: {back.strip()}")
        back_as = back.split("coordinator: back: ")[1].split()[0]
        open(release, "w").close()
        run.all_finish()

    if leaver.count(lambda l: "the coordinator says the run is over" in l) != 1:
        vt.fail("the leaver, a spare again, did not end with the run")
    if name_of(volunteers[3][1]) != node:
        vt.fail(f"the spare's membership.json names {name_of(volunteers[3][1])}, not {node}")
    db = sqlite3.connect(os.path.join(out, "coordinator.db"))
    leaver_key = key_of(leaver_dir)
    rows = [r for r in db.execute("SELECT name, state, public_key FROM members") if r[2] == leaver_key]
    if [r[0] for r in rows] != [back_as] or back_as == node:
        vt.fail(f"coordinator.db: the leaver's key is in rows {rows}, expected one, {back_as} (not {node})")

    leaf = json.load(open(os.path.join(out, "plan.json")))["clusters"][0]["chain"][-1]
    records = leaf_records([w for _, w in volunteers], leaf)
    resumed = [r["resumed_from"] for r in records if "resumed_from" in r]
    if resumed != [stop_step]:
        vt.fail(f"the Leaf resumed from {resumed}, expected once from step {stop_step}")
    every = [r for r in records if "step" in r]
    same = sum(1 for r in every if reference.get(r["step"]) == r["loss"])
    steps = sorted({r["step"] for r in every})
    print(f"{node} handed over after step {stop_step}; the cluster resumed from it; {same} of {len(every)} "
          f"logged Leaf step losses equal the uninterrupted run's")
    if same != len(every) or len(steps) != STEPS:
        vt.fail(f"hand-over is not exact or steps are missing: {same} of {len(every)} equal, {len(steps)} steps")
    # Credit: the leaver keeps its node's steps up to its stop, the spare the rest; each with the
    # samples of every step (the leaver's records all arrived before it left).
    expected = {name_of(w): {key_of(w): STEPS} for _, w in volunteers[1:3]}
    expected[node] = {leaver_key: stop_step, key_of(volunteers[3][1]): STEPS - stop_step}
    check_credit(out, expected, json.load(open(job))["training_definition"]["batch_size"])
    gave = leaver.wait_for(lambda l: f"this volunteer gave {node}: {stop_step} steps" in l, 1,
                           f"the leaver's own total of {stop_step} steps")
    print(gave.strip())
    reported = vt.check_trained(out, TEST_SAMPLES, f"Leaf accuracy {{reported:.4f}}; merged model in PyTorch "
                                f"{{accuracy:.4f}}; uninterrupted run {reference_accuracy:.4f}")
    if reported != reference_accuracy:
        vt.fail("the handed-over run's accuracy differs from the uninterrupted run's")


def case_two_replacements(args):
    """Two replacements in a row in one 3-stage pipeline (issue [Q]: overlapping faults), with 2
    spares. First the Root is SIGKILLed, holding after KILL_AFTER steps: its spare takes it over,
    the Stem (told: new peers) restarts while the Leaf (not told) is already agreeing on the resume
    step, so the Leaf's hello went to the Stem's previous transport and the Stem must take the
    Leaf's "ckpt_steps" as its handshake. Once the cluster trains again and the Leaf's checkpoint
    of step SECOND_KILL_AFTER is acknowledged (the Root holds there until the kill), the Leaf is
    SIGKILLed: the Stem restarts while the Root (not told) is already agreeing, and the Root must
    answer the Stem's new hello (a fresh handshake, then the agreement again). Checks: every step
    loss the Leaf logged (over its two holders) equals an uninterrupted run's; the merged model's
    accuracy equals the reference's; each node's steps are credited once each, the killed
    volunteers' up to the resume step of their kill and the spares' after it."""
    model, job = vt.prepare(args, STEPS, TEST_SAMPLES, TRAINING)
    reference, reference_accuracy = run_reference(args, model, job)
    release = hold_root(args, HOLD_AT)
    # Each kill comes while the Root holds, after KILL_AFTER steps (the first Root, until the first
    # kill) and after SECOND_KILL_AFTER steps (its spare, until the second): each resume step is
    # that hold's checkpoint, and the victim's step records up to it reached the coordinator (its
    # credit), however the machine's load spaces records and uploads. Without the first hold, a
    # CI run's Root reached HOLD_AT before its kill; its spare resumed there and held before its
    # first step, waiting for a release that comes only after the second kill.
    killed = [hold_until(args, KILL_AFTER, "killed_1"), hold_until(args, SECOND_KILL_AFTER, "killed_2")]
    run = vt.Run(args, model, job, FLAGS, 5)
    out, coordinator, volunteers = run.out, run.coordinator, run.volunteers
    with run:
        run.join(3, ["--upload-mbps", "200"])
        run.wait_planned(1)
        run.join(2, ["--upload-mbps", "200"])
        coordinator.wait_for(lambda l: "joined: node_4 " in l and ", spare" in l, 120, "the spares")
        chain = json.load(open(os.path.join(out, "plan.json")))["clusters"][0]["chain"]
        root, leaf = chain[0], chain[-1]
        first = next(v for v in volunteers[:3] if name_of(v[1]) == root)
        kill_after_checkpoint(coordinator, first, root, records_in=out)
        open(killed[0], "w").close()
        coordinator.wait_for(lambda l: f"coordinator: {root} is taken over by spare" in l, 120,
                             "the Root's takeover")
        # Which spare took it (the two joined at once: their names need not follow their order).
        took = lambda v: v[0].count(lambda l: f"taking over the node {root} " in l) > 0  # noqa: E731
        vt.wait_until(lambda: any(took(v) for v in volunteers[3:]), 120, f"a spare taking {root} over")
        spare_of_root = next(v for v in volunteers[3:] if took(v))
        spare_of_root[0].wait_for(lambda l: "resume: first step after resuming done" in l, 120,
                                  "the cluster training again")
        second = next(v for v in volunteers[:3] if name_of(v[1]) == leaf)
        kill_after_checkpoint(coordinator, second, leaf, records_in=out, at=SECOND_KILL_AFTER)
        open(killed[1], "w").close()
        coordinator.wait_for(lambda l: f"coordinator: {leaf} is taken over by spare" in l, 120,
                             "the Leaf's takeover")
        open(release, "w").close()
        code = coordinator.finish(600)
        if code != 0:
            vt.fail(f"the coordinator exited {code}")
        for v, _ in volunteers:
            if v is not first[0] and v is not second[0] and v.finish(120) != 0:
                vt.fail(f"{v.tag} exited {v.proc.poll()}")
    resumed = check_exact_resume([w for _, w in volunteers], out, leaf, reference, reference_accuracy, 2,
                                 "two replacements")
    stem = chain[1]
    spare_of_leaf = next(w for _, w in volunteers[3:] if name_of_or_none(w) == leaf)
    # The Leaf's second holder resumed once more than the first: its first resume record is the
    # second kill's resume step (the first holder's last is the first kill's).
    second_resume = [r["resumed_from"] for r in leaf_records([spare_of_leaf], leaf) if "resumed_from" in r][0]
    expected = {stem: {key_of(w): STEPS for _, w in volunteers[:3] if name_of_or_none(w) == stem},
                root: {key_of(first[1]): resumed[0], key_of(spare_of_root[1]): STEPS - resumed[0]},
                leaf: {key_of(second[1]): second_resume, key_of(spare_of_leaf): STEPS - second_resume}}
    check_credit(out, expected)


def name_of_or_none(workdir):
    """The node a volunteer holds, or None when it holds none (killed before it wrote one, or left)."""
    try:
        return name_of(workdir)
    except (FileNotFoundError, KeyError, ValueError):
        return None


def main():
    vt.main_of(["frozen_replaced", "lost_after_finishing", "bit_flip", "active_hours", "two_replacements"],
               globals())


if __name__ == "__main__":
    main()
