#!/usr/bin/python3
"""A lost volunteer is replaced by a spare (docs/OPERATIONS.md): a real coordinator
(`clusterize --serve --lost-after-s`) and real `provider --join` processes on tcp loopback with
CurveZMQ. No sleeps stand in for synchronisation: each step waits for the log line or file that
says the previous one happened.

    volunteer_replace_test.py spare_replaces_lost --provider BUILD/node/provider
        --clusterize BUILD/clusterize/clusterize --work DIR

spare_replaces_lost
    Reference: 3 volunteers train one 3-stage pipeline for STEPS steps uninterrupted.
    Run: the same job with 3 volunteers and a 4th that joins after planning (a spare). Once the
    coordinator has acknowledged a checkpoint of step >= KILL_AFTER from the Stem's volunteer, that
    volunteer is SIGKILLed. Its neighbours pause; the coordinator sees every connection the volunteer
    had to it closed (--gone-after-s; --lost-after-s is 600 here, never waited out) and gives its
    node (name, stage, the newest checkpoint it holds) to the spare; the neighbours get `peers`,
    restart their stage in-process, and the cluster resumes from the newest common checkpoint.
    Checks: every step loss the Leaf logged (before the kill and after the resume, replayed steps
    included) equals the uninterrupted run's; the run resumed from a checkpoint; the merged
    trained.pt evaluated by PyTorch has exactly the accuracy the Leaf reported, which equals the
    reference's; coordinator.db gives the node to the spare's key and keeps the lost key as lost.

ring_peer_replaced, spare_too_small
    See their functions: a ring peer re-pointed live; a spare whose --memory-gb holds no lost
    stage stays a spare and is told why.

The churn cases (volunteer_churn_test.py: a frozen volunteer, active hours, two replacements in
a row, ...) share this file's job, helpers and uninterrupted reference run.
"""
import argparse
import fcntl
import hashlib
import json
import os
import shutil
import sqlite3
import sys
import time
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import volunteer_harness as vt  # noqa: E402  (the shared helpers: processes, jobs, evaluation)

STEPS = 120
RING_STEPS = 150
HOLD_AT = 100  # the latest step the held cluster reaches before the awaited event (ring_peer_replaced:
#                cluster 0 resumes; active_hours: the leaver is back)
KILL_AFTER = 20
TEST_SAMPLES = 1000
TRAINING = {"checkpoint_every": 10,
            "timeouts": {"startup_s": 60, "peer_s": 60, "peer_timeout_s": 2, "max_wait_s": 300}}
FLAGS = ["--min-volunteers", "3", "--clusters", "1", "--cuts", "7,14", "--lost-after-s", "8"]


name_of = vt.name_of


def hold_root(args, step):
    """CAIRN_TEST_HOLD for the volunteers started from now on: cluster 0's Root holds before
    `step` until the returned file exists. A test that kills a volunteer once a checkpoint of step
    >= KILL_AFTER is acknowledged must kill it before the run can end, however late that
    acknowledgement comes on a loaded machine (a node lost after its final checkpoint needs no
    spare: its result is made from that checkpoint)."""
    release = os.path.join(args.work, "release")
    os.environ["CAIRN_TEST_HOLD"] = f"0:{step}:{release}"
    return release


def hold_until(args, step, name):
    """Also holds cluster 0's Root before `step` (after that many steps) until the returned file
    (NAME in the work folder) exists; the holds set before stay. A test that kills or stops a
    volunteer while the Root holds there knows the resume step (that step's checkpoint), however
    the machine's load spaces the steps, the uploads and the test's own waits."""
    release = os.path.join(args.work, name)
    os.environ["CAIRN_TEST_HOLD"] = f"0:{step}:{release}," + os.environ["CAIRN_TEST_HOLD"]
    return release


def three_and_a_spare(run):
    """Three volunteers that the plan places (uploading checkpoints), then a 4th that waits as a
    spare (node_3); returns the plan's cluster 0 chain."""
    run.join(3, ["--upload-mbps", "200"])
    run.wait_planned(1)
    run.join(1)
    run.coordinator.wait_for(lambda l: "joined: node_3 " in l and ", spare" in l, 120, "the spare")
    return json.load(open(os.path.join(run.out, "plan.json")))["clusters"][0]["chain"]


def kill_after_checkpoint(coordinator, victim, stem, records_in=None, at=KILL_AFTER):
    """SIGKILLs the victim (a volunteer's (Process, workdir)) once the coordinator has acknowledged
    a checkpoint of its node STEM at step >= AT; returns that acknowledgement's line.
    records_in (the coordinator's out folder): also wait until its metrics.jsonl holds STEM's step
    record of that step (the volunteer sends its records about once a second, apart from its
    checkpoint uploads)."""
    ack = vt.wait_for_checkpoint(coordinator, at, 300, stem)
    if records_in:
        step = vt.checkpoint_step(ack)
        metrics = os.path.join(records_in, "metrics.jsonl")

        def recorded():
            if not os.path.exists(metrics):
                return False
            for line in open(metrics):
                if line.endswith("\n"):
                    r = json.loads(line)
                    if r.get("node") == stem and r.get("step") == step:
                        return True
            return False
        vt.wait_until(recorded, 120, f"{stem}'s step record {step} at the coordinator")
    victim[0].proc.kill()
    victim[0].finish(30)
    return ack


def run_reference(args, model, job):
    """The uninterrupted run: 3 volunteers, the job as given, FLAGS: (the Leaf's step losses by
    step, the run's accuracy); args.reference_out is its coordinator's out folder. Five cases run
    the very same one (the same model, job and FLAGS): with CAIRN_REFERENCE_CACHE set (the suite
    sets it: tests/integration/Tests.cmake, whose fixture case `reference` makes it first) the
    first case to ask runs it in a folder of that cache named by what determines it (the bytes of
    the model, the job but its model path, FLAGS, the provider and clusterize binaries), under a
    lock, and the others read what it left."""
    cache = os.environ.get("CAIRN_REFERENCE_CACHE")
    if not cache:
        sub = vt.in_folder(args, "reference")
        args.reference_out = os.path.join(sub.work, "coordinator")
        return reference_run(sub, model, job)
    digest = hashlib.sha256()
    with zipfile.ZipFile(model) as archive:  # TorchScript's code lists constants in set order:
        for name in sorted(archive.namelist()):  # its lines are taken sorted
            data = archive.read(name)
            digest.update(name.encode() + b"".join(sorted(data.splitlines())) if "/code/" in name else data)
    for path in (args.provider, args.clusterize):
        with open(path, "rb") as f:
            digest.update(f.read())
    doc = json.load(open(job))
    doc.pop("model", None)
    digest.update(json.dumps([doc, FLAGS], sort_keys=True).encode())
    folder = os.path.join(cache, digest.hexdigest()[:16])
    done = os.path.join(folder, "reference.json")
    os.makedirs(cache, exist_ok=True)
    with open(os.path.join(cache, "lock"), "w") as lock:
        deadline = time.monotonic() + 600  # never wait forever on the case running it
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    vt.fail(f"waited 600 s for the reference run in {cache} (another case runs it)")
                time.sleep(0.5)
        if not os.path.exists(done):
            shutil.rmtree(folder, ignore_errors=True)  # a run cut short
            sub = argparse.Namespace(**vars(args))
            sub.work = folder
            os.makedirs(folder)
            losses, accuracy = reference_run(sub, model, job)
            with open(done + ".part", "w") as f:
                json.dump({"losses": sorted(losses.items()), "accuracy": accuracy}, f)
            os.replace(done + ".part", done)
            print(f"reference run made in {folder}")
        else:
            print(f"reference run taken from {folder} (made by an earlier case)")
    args.reference_out = os.path.join(folder, "coordinator")
    saved = json.load(open(done))
    return {step: loss for step, loss in saved["losses"]}, saved["accuracy"]


def reference_run(args, model, job):
    run = vt.Run(args, model, job, FLAGS, 3)
    with run:
        run.join(3, ["--upload-mbps", "0"])
        run.all_finish()
    leaf = json.load(open(os.path.join(run.out, "plan.json")))["clusters"][0]["chain"][-1]
    workdir = next(w for _, w in run.volunteers if name_of(w) == leaf)
    losses = {r["step"]: r["loss"] for r in vt.node_records(workdir, leaf) if "step" in r}
    summary = json.load(open(os.path.join(run.out, "run_result.json")))
    return losses, summary["clusters"][0]["eval"]["accuracy"]


def key_of(workdir):
    """The Z85 public key in a volunteer's identity.key."""
    text = open(os.path.join(workdir, "identity.key")).read()
    return next(line[len("public "):] for line in text.splitlines() if line.startswith("public "))


def check_credit(out, expected, batch_size=None, steps=STEPS):
    """coordinator.db and run_result.json credit each node's steps 1..STEPS to exactly one key each,
    and each key with the steps EXPECTED says ({node: {public key: kept steps}}); with BATCH_SIZE,
    each key's samples are its steps times that (every step's record arrived)."""
    db = sqlite3.connect(os.path.join(out, "coordinator.db"))
    for node, keys in expected.items():
        credited = [s for s, in db.execute("SELECT step FROM credit WHERE node = ? ORDER BY step", (node,))]
        if credited != list(range(1, steps + 1)):
            vt.fail(f"credit: {node}'s credited steps are {credited[:3]}..{credited[-3:]} ({len(credited)}), "
                    f"expected 1..{steps} once each")
    credit = json.load(open(os.path.join(out, "run_result.json")))["credit"]
    got = {}
    for c in credit:
        got.setdefault(c["node"], {})[c["key"]] = c["steps"]
        if batch_size is not None and c["samples"] != c["steps"] * batch_size:
            vt.fail(f"credit: {c['volunteer']} for {c['node']}: {c['samples']} samples for {c['steps']} steps")
    if got != expected:
        vt.fail(f"credit in run_result.json: {got}, expected {expected}")
    print("credit: " + "; ".join(f"{c['volunteer']} {c['node']} {c['steps']} steps, {c['samples']} samples, "
                                 f"{c['compute_s']:.2f} compute s, {c['sent_bytes']} bytes" for c in credit))


def case_reference(args):
    """The suite's fixture (tests/integration/Tests.cmake volunteer_reference): the uninterrupted
    run that five cases compare against, made into CAIRN_REFERENCE_CACHE before they start, so none
    of them holds a ctest slot while waiting for another to make it. It checks that the run finished."""
    if not os.environ.get("CAIRN_REFERENCE_CACHE"):
        vt.fail("the reference case fills CAIRN_REFERENCE_CACHE: set it")
    model, job = vt.prepare(args, STEPS, TEST_SAMPLES, TRAINING)
    losses, accuracy = run_reference(args, model, job)
    print(f"reference: {len(losses)} Leaf step losses, accuracy {accuracy:.4f}")


def case_spare_replaces_lost(args):
    model, job = vt.prepare(args, STEPS, TEST_SAMPLES, TRAINING)
    reference, reference_accuracy = run_reference(args, model, job)
    if len(reference) != STEPS:
        vt.fail(f"the reference Leaf logged {len(reference)} steps, expected {STEPS}")

    release = hold_root(args, HOLD_AT)
    # Held also after KILL_AFTER steps until the kill: the checkpoint the spare resumes from is
    # that step's, and the victim's step records up to it have reached the coordinator (its
    # credit), however the machine's load spaces the records and the uploads.
    killed = hold_until(args, KILL_AFTER, "killed")
    # A silence timeout the test never waits out: only its closed connections can make the killed
    # volunteer lost (--gone-after-s, its default 3 s).
    run = vt.Run(args, model, job, FLAGS[:-1] + ["600"], 4)
    out, coordinator, volunteers = run.out, run.coordinator, run.volunteers
    with run:
        run.join(3, ["--upload-mbps", "200"])
        run.wait_planned(1)
        run.join(1)
        spare_line = coordinator.wait_for(lambda l: "joined: node_3 " in l, 120, "'joined: node_3' (the spare)")
        if ", spare" not in spare_line:
            vt.fail(f"the 4th volunteer did not wait as a spare: {spare_line.strip()}")
        chain = json.load(open(os.path.join(out, "plan.json")))["clusters"][0]["chain"]
        stem, leaf = chain[1], chain[2]
        victim = next(v for v in volunteers[:3] if name_of(v[1]) == stem)
        leaf_workdir = next(w for _, w in volunteers[:3] if name_of(w) == leaf)
        ack = kill_after_checkpoint(coordinator, victim, stem, records_in=out)
        print(f"SIGKILLed {victim[0].tag} ({stem}) after: {ack.strip()}")
        lost = coordinator.wait_for(lambda l: f"coordinator: lost: {stem}" in l, 120, f"'lost: {stem}'")
        if "its connections to the coordinator closed" not in lost:
            vt.fail(f"the killed volunteer was not lost by its closed connections: {lost.strip()}")
        taken = coordinator.wait_for(lambda l: f"coordinator: {stem} is taken over by spare node_3" in l, 60,
                                     "the takeover")
        print(lost.strip())
        print(taken.strip())
        open(killed, "w").close()
        open(release, "w").close()
        run.all_finish(but=victim[0])

    spare_workdir = volunteers[3][1]
    if name_of(spare_workdir) != stem:
        vt.fail(f"the spare's membership.json names {name_of(spare_workdir)}, not {stem}")
    for v, w in volunteers[:3]:
        if v is victim[0]:
            continue
        if not v.count(lambda l: "peers updated in" in l):
            vt.fail(f"{v.tag} ({name_of(w)}) never applied the coordinator's peers update")

    # The store: the node belongs to the spare's key; the lost key is kept, lost.
    db = sqlite3.connect(os.path.join(out, "coordinator.db"))
    spare_key = open(os.path.join(spare_workdir, "identity.key")).read()
    row = db.execute("SELECT public_key, state FROM members WHERE name = ?", (stem,)).fetchone()
    if row is None or row[0] not in spare_key or row[1] != "done":
        vt.fail(f"coordinator.db: {stem} is {row}, expected the spare's key and state done")
    lost = db.execute("SELECT name, state FROM members WHERE name LIKE ?", (stem + "-lost-%",)).fetchall()
    if lost != [(stem + "-lost-1", "lost")]:
        vt.fail(f"coordinator.db: the lost volunteer's row is {lost}")

    # Exact resume: every step loss the Leaf logged equals the uninterrupted run's.
    records = vt.node_records(leaf_workdir, leaf)
    marks = [i for i, r in enumerate(records) if "resumed_from" in r]
    if not marks:
        vt.fail("the Leaf's metrics.jsonl has no resumed_from record")
    resumed_from = records[marks[-1]]["resumed_from"]
    if resumed_from < 10:
        vt.fail(f"the cluster resumed from step {resumed_from}, not from a checkpoint")
    every = [r for r in records if "step" in r]
    after = [r for r in records[marks[-1]:] if "step" in r]
    same = sum(1 for r in every if reference.get(r["step"]) == r["loss"])
    steps = sorted({r["step"] for r in every})
    print(f"resumed from step {resumed_from}; {same} of {len(every)} logged Leaf step losses equal the "
          f"uninterrupted run's ({len(after)} after the resume)")
    if same != len(every) or steps != list(range(1, STEPS + 1)) and steps != list(range(STEPS)):
        vt.fail(f"resume is not exact or steps are missing: {same} of {len(every)} equal, steps "
                f"{steps[:3]}..{steps[-3:]}")

    # Credit: the lost volunteer keeps the Stem's steps up to the resume, the spare the rest; the
    # others all of theirs.
    expected = {name_of(w): {key_of(w): STEPS} for v, w in volunteers[:3] if v is not victim[0]}
    expected[stem] = {key_of(victim[1]): resumed_from, key_of(spare_workdir): STEPS - resumed_from}
    check_credit(out, expected)

    reported = vt.check_trained(out, TEST_SAMPLES, f"Leaf accuracy {{reported:.4f}}; merged model in PyTorch "
                                f"{{accuracy:.4f}}; uninterrupted run {reference_accuracy:.4f}")
    if reported != reference_accuracy:
        vt.fail("the replaced run's accuracy differs from the uninterrupted run's")


RING_FLAGS = ["--min-volunteers", "6", "--clusters", "2", "--cuts", "7,14", "--lost-after-s", "8"]


def six_and_a_spare(run, spare_dial_out_only=False):
    """Six volunteers that the plan places in 2 clusters of 3 (uploading checkpoints), then a 7th
    that waits as a spare (node_6; without --listen when spare_dial_out_only); returns the plan's
    chains, cluster by cluster."""
    run.join(6, ["--upload-mbps", "200"])
    run.wait_planned(2, 180)
    run.join(1, dial_out_only=spare_dial_out_only)
    run.coordinator.wait_for(lambda l: "joined: node_6 " in l and ", spare" in l, 120, "the spare")
    return [c["chain"] for c in json.load(open(os.path.join(run.out, "plan.json")))["clusters"]]


def check_each_cluster(args, out):
    """Each cluster's own weights (`clusterize --merge --cluster N`) evaluated by PyTorch give
    exactly the accuracy its Leaf reported."""
    vt.check_cluster_weights(args, out, lambda path: vt.evaluate(path, TEST_SAMPLES),
                             "cluster {cluster} ({leaf}): Leaf reports {reported:.4f}, its weights in "
                             "PyTorch {accuracy:.4f}",
                             "cluster {cluster}'s weights evaluate to {accuracy} in PyTorch, its Leaf "
                             "reported {reported}")


def case_ring_peer_replaced(args):
    ring_peer_replaced(args)


def ring_peer_replaced(args, spare_dial_out_only=False):
    """2 clusters x 3 stages and a spare (dial-out only when spare_dial_out_only: dial_out_spare_test.py); the Stem of cluster 0 is SIGKILLed after its checkpoint
    ack. Its neighbours restart with the new peers; its ring peer (cluster 1's Stem, which keeps
    training) re-points it live; the replacement joins the rings (a welcome from that ring peer:
    impossible unless the peer admitted its new key and dials its new address); the run finishes.
    Each cluster's own weights (`clusterize --merge --cluster N`, the replacement's stage included
    for cluster 0) evaluated by PyTorch give exactly the accuracy that cluster's Leaf reported.
    Cluster 1 must still be training when cluster 0 resumes (a resuming cluster cannot rejoin rings
    whose other members have finished): its Root holds (CAIRN_TEST_HOLD, node/pipeline/TestHold.h)
    from the kill, or from step HOLD_AT at the latest, until the replacement says the cluster agreed
    on its resume step, so cluster 1 still has at least RING_STEPS - HOLD_AT steps to go whatever
    the machine's speed (the precondition is still checked and reported as such). Returns the
    takeover's line, the killed node, its ring peer and the two processes (ring peer, spare)."""
    release = os.path.join(args.work, "release_cluster_1")
    os.environ["CAIRN_TEST_HOLD"] = f"1:{HOLD_AT}:{release}"
    run = vt.start_run(args, RING_STEPS, TEST_SAMPLES, RING_FLAGS, 7, TRAINING)
    out, coordinator, volunteers = run.out, run.coordinator, run.volunteers
    with run:
        chains = six_and_a_spare(run, spare_dial_out_only)
        stem, ring_peer = chains[0][1], chains[1][1]
        victim = next(v for v in volunteers[:6] if name_of(v[1]) == stem)
        peer_proc = next(v for v, w in volunteers[:6] if name_of(w) == ring_peer)
        kill_after_checkpoint(coordinator, victim, stem)
        open(release + ".hold", "w").close()
        taken = coordinator.wait_for(lambda l: f"coordinator: {stem} is taken over by spare node_6" in l, 120,
                                     "the takeover")
        print(taken.strip())
        if ring_peer not in taken:
            vt.fail(f"the coordinator does not tell the ring peer {ring_peer}")
        volunteers[6][0].wait_for(lambda l: "resume: the cluster agreed on step" in l, 120,
                                  "the replacement's resume agreement")
        open(release, "w").close()
        run.all_finish(but=victim[0])
    spare = volunteers[6][0]
    if not peer_proc.count(lambda l: "ring peers re-pointed live" in l and stem in l):
        vt.fail(f"{ring_peer} never re-pointed {stem} live")
    welcomed = [l for l in spare.lines if ": joined from " + ring_peer in l]
    if not welcomed:
        if peer_proc.count(lambda l: "done: " in l) and not peer_proc.count(lambda l: "admitted " + stem in l):
            vt.fail(f"precondition: cluster 1 finished its {RING_STEPS} steps before the replacement "
                    "could join its rings (a slow machine: raise RING_STEPS)")
        vt.fail(f"the replacement never joined the rings with a welcome from {ring_peer}")
    print("replacement:", welcomed[0].strip())
    check_each_cluster(args, out)
    return taken, out, stem, ring_peer, peer_proc, spare


def leaf_records(workdirs, leaf):
    """The step records of node LEAF from every volunteer folder that held it, in step order."""
    records = []
    for w in workdirs:
        path = os.path.join(w, "node_data", "nodes", leaf, "metrics.jsonl")
        if os.path.exists(path):
            records += [json.loads(line) for line in open(path) if line.strip()]
    return records


def check_exact_resume(workdirs, out, leaf, reference, reference_accuracy, resumes, what):
    """After a run with replacements: node LEAF's step records over every holder's folder
    (WORKDIRS) name at least RESUMES resumes, every step 1..STEPS, and each logged loss equals the
    uninterrupted run's (REFERENCE); the merged model's accuracy, evaluated by PyTorch, equals the
    Leaf's report and REFERENCE_ACCURACY. WHAT names the run in failures. Returns the resume steps."""
    records = leaf_records(workdirs, leaf)
    resumed = [r["resumed_from"] for r in records if "resumed_from" in r]
    every = [r for r in records if "step" in r]
    same = sum(1 for r in every if reference.get(r["step"]) == r["loss"])
    print(f"resumed from steps {resumed}; {same} of {len(every)} logged Leaf step losses equal the "
          f"uninterrupted run's")
    if len(resumed) < resumes or same != len(every) or sorted({r["step"] for r in every}) != list(range(1, STEPS + 1)):
        vt.fail(f"{what}: resumed {resumed}, {same} of {len(every)} losses equal, steps missing?")
    reported = vt.check_trained(out, TEST_SAMPLES, f"Leaf accuracy {{reported:.4f}}; merged model in PyTorch "
                                f"{{accuracy:.4f}}; uninterrupted run {reference_accuracy:.4f}")
    if reported != reference_accuracy:
        vt.fail(f"{what}: the accuracy differs from the uninterrupted run's")
    return resumed


def case_spare_too_small(args):
    """The plan is profiled at a batch of 256 (--input-shape), so its stages need an estimated
    0.03 (Leaf), 0.24 (Stem) and 0.37 GB (Root). After planning a 4th volunteer joins giving
    0.1 GB (--memory-gb): it is told which stage it could take (the Leaf's) and which not. The
    Stem's volunteer is SIGKILLed: the small spare is not chosen, and is told why, while the
    cluster waits; a 5th volunteer (all its RAM) joins and takes the Stem over; the run finishes
    and every volunteer, the small spare too, exits 0. The small spare never trained: no credit."""
    flags = FLAGS
    model, job = vt.prepare(args, 40, TEST_SAMPLES, TRAINING)
    release = hold_root(args, 30)  # of 40 steps: the Stem is killed before the run can end
    run = vt.Run(args, model, job, flags, 5, shape=("--input-shape", "256,1,28,28"))
    out, coordinator, volunteers = run.out, run.coordinator, run.volunteers
    with run:
        run.join(3, ["--upload-mbps", "200"])
        run.wait_planned(1)
        run.join(1, ["--memory-gb", "0.1"])
        small = volunteers[3][0]
        said = small.wait_for(lambda l: "the coordinator says: the run is planned" in l, 120, "its note")
        if "(node_" not in said or "0.10 GB it gives" not in said or "; not " not in said:
            vt.fail(f"the small spare's note does not list what fits it: {said.strip()}")
        chain = json.load(open(os.path.join(out, "plan.json")))["clusters"][0]["chain"]
        stem = chain[1]
        victim = next(v for v in volunteers[:3] if name_of(v[1]) == stem)
        kill_after_checkpoint(coordinator, victim, stem)
        told = small.wait_for(lambda l: f"the coordinator says: {stem} needs a new holder" in l, 120,
                              "why it does not take the Stem")
        if "and this volunteer gives 0.10 GB; it stays a spare" not in told:
            vt.fail(f"the small spare was told {told.strip()}")
        print("small spare:", told.strip().split("] ")[-1])
        run.join(1)
        coordinator.wait_for(lambda l: f"coordinator: {stem} is taken over by spare node_4" in l, 120,
                             "the takeover by the 5th volunteer")
        open(release, "w").close()
        run.all_finish(but=victim[0])
    if name_of(volunteers[4][1]) != stem:
        vt.fail(f"the 5th volunteer holds {name_of(volunteers[4][1])}, not {stem}")
    credited = {c["key"] for c in json.load(open(os.path.join(out, "run_result.json")))["credit"]}
    if key_of(volunteers[3][1]) in credited:
        vt.fail("the small spare, which never trained, has credit")


def main():
    vt.main_of(["reference", "spare_replaces_lost", "ring_peer_replaced", "spare_too_small"], globals())


if __name__ == "__main__":
    main()
