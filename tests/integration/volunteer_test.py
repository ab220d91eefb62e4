#!/usr/bin/python3
"""Volunteers join a run by invite: a real coordinator (`clusterize --serve`) and real
`provider --join` processes on tcp loopback. No sleeps stand in for synchronisation: each step
waits for the line or file that says the previous one happened.

    volunteer_test.py CASE --provider BUILD/node/provider --clusterize BUILD/clusterize/clusterize --work DIR

CASE:
  join_train_merge  a coordinator and 6 volunteers that join at different moments (3, then 3 more
                    once the first 3 are in) form 2 clusters x 3 stages, train a Fashion-MNIST slice
                    with "average" syncs (the last step is a reduce), upload their trained stages;
                    the coordinator merges them into trained.pt / trained.safetensors. PyTorch
                    evaluates trained.pt on the same test images to exactly the accuracy both Leaves
                    reported, and the safetensors file holds the same tensors.
  coordinator_restarts  3 volunteers form one 3-stage pipeline; the coordinator is SIGKILLed once it
                    has planned. Training goes on without it (the Leaf keeps writing step records);
                    the same command started again picks the run up from coordinator.db with the
                    same invite, the volunteers' pending uploads reach it, and it merges the
                    trained model, whose PyTorch accuracy equals the Leaf's.
  checkpoint_upload 3 volunteers form one 3-stage pipeline that checkpoints every 10 of 60 steps;
                    each uploads its checkpoints in the background (--upload-mbps). One gives less
                    than the machine has (--cores 1 --memory-gb 3.5): the coordinator's join line
                    shows those figures and its stage trains on 1 thread though job.json asks for
                    2 (its log says so). After the run
                    the coordinator's newest stored checkpoint of every node is a step that is a
                    multiple of 10 up to 60, its coordinator.db row names it, and it is
                    byte-identical to the volunteer's own file of that step. Prints the bytes and
                    seconds of each upload from the volunteers' logs.
  dead_spare_not_planned  a volunteer joins and is SIGKILLed while it waits for the plan: once the
                    coordinator says it is not heard lately (its connections closed, --gone-after-s),
                    3 more join and the plan (--min-volunteers 3) places those 3 only — nobody lost,
                    no replacement needed, the dead one's row still a spare — and they train to the
                    end (the merged model's PyTorch accuracy equals the Leaf's).
  bad_invites       what a volunteer sees when its invite is wrong: a wrong token is refused with
                    the coordinator's reason (exit 2), a wrong coordinator key gets no answer and a
                    clear timeout (exit 3), a malformed invite and --advertise without --listen
                    exit 2 before any network traffic;
                    and on the researcher's side, `--serve --grow` with an async job exits 2
                    naming training_definition.schedule before it listens
"""
import json
import os
import sqlite3
import subprocess
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import volunteer_harness as vt  # noqa: E402  (the shared harness: processes, jobs, evaluation)


def case_join_train_merge(args):
    test_samples = 1000
    run = vt.start_run(args, 60, test_samples, ["--min-volunteers", "6", "--clusters", "2", "--cuts", "7,14"], 6)
    out, coordinator = run.out, run.coordinator
    with run:
        run.join(3)
        # The first three are in (accepted as spares) before the others start.
        for i in range(3):
            coordinator.wait_for(lambda l, i=i: f"joined: node_{i} " in l, 120, f"'joined: node_{i}'")
        if coordinator.count(lambda l: "planned" in l):
            vt.fail("the coordinator planned before --min-volunteers had joined")
        run.join(3)
        run.wait_planned(2, 120, "'planned 2 cluster(s)'")
        run.all_finish()

    # Secret keys never left the volunteers; the coordinator holds none.
    for name in os.listdir(os.path.join(out, "nodes")):
        if os.path.exists(os.path.join(out, "nodes", name, "secret.key")):
            vt.fail(f"the coordinator's folder holds a secret key for {name}")
    summary = json.load(open(os.path.join(out, "run_result.json")))
    clusters = summary["clusters"]
    if sorted(c["cluster"] for c in clusters) != [0, 1]:
        vt.fail(f"expected the Leaves of clusters 0 and 1 in run_result.json, got {clusters}")
    accuracies = [c["eval"]["accuracy"] for c in clusters]
    if accuracies[0] != accuracies[1]:
        vt.fail(f"the two clusters' Leaves report different accuracies after the final reduce: {accuracies}")
    plan = json.load(open(os.path.join(out, "plan.json")))
    chains = [c["chain"] for c in plan["clusters"]]
    if [len(c) for c in chains] != [3, 3]:
        vt.fail(f"expected 2 clusters x 3 stages, got {chains}")

    accuracy = vt.evaluate(summary["trained_torchscript"], test_samples)
    net = torch.jit.load(summary["trained_torchscript"])
    print(f"2 x 3 volunteers: Leaves report accuracy {accuracies[0]:.4f}; the merged model in PyTorch: {accuracy:.4f}")
    if abs(accuracy - accuracies[0]) > 1e-9:
        vt.fail("the merged model's accuracy differs from the Leaves'")
    if accuracy <= 0.5:
        vt.fail(f"accuracy {accuracy:.4f} after 60 steps is not above 0.5")
    # The safetensors file holds the same values as the TorchScript one.
    raw = open(summary["trained_safetensors"], "rb").read()
    header_len = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + header_len])
    state = dict(net.state_dict())
    checked = 0
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        begin, end = meta["data_offsets"]
        dtype = {"F32": np.float32, "I64": np.int64}[meta["dtype"]]
        value = np.frombuffer(raw[8 + header_len + begin:8 + header_len + end], dtype).reshape(meta["shape"])
        if not np.array_equal(value, state[name].numpy()):
            vt.fail(f"trained.safetensors: {name} differs from trained.pt")
        checked += 1
    if checked != len(state):
        vt.fail(f"trained.safetensors holds {checked} tensors, trained.pt {len(state)}")


def case_checkpoint_upload(args):
    # job.json asks for 2 intra-op threads; every volunteer gives 1 core (its limit), volunteer 0
    # also only 3.5 GB.
    run = vt.start_run(args, 60, 200, ["--min-volunteers", "3", "--clusters", "1", "--cuts", "7,14"], 3,
                    {"checkpoint_every": 10, "threads": 2})
    out = run.out
    with run:
        run.join(1, ["--upload-mbps", "50", "--cores", "1", "--memory-gb", "3.5"])
        run.join(2, ["--upload-mbps", "50", "--cores", "1"])
        run.wait_planned(1, 120, "'planned 1 cluster(s)'")
        run.all_finish()
    check_limits(run)

    import sqlite3
    db = sqlite3.connect(os.path.join(out, "coordinator.db"))
    for v, workdir in run.volunteers:
        name = vt.name_of(workdir)
        held = os.path.join(out, "checkpoints", name)
        files = sorted(os.listdir(held)) if os.path.isdir(held) else []
        if len(files) != 1 or not files[0].startswith("step_") or not files[0].endswith(".ckpt"):
            vt.fail(f"the coordinator holds {files} for {name}, expected exactly one step_<N>.ckpt")
        step = int(files[0][len("step_"):-len(".ckpt")])
        if step % 10 != 0 or not 10 <= step <= 60:
            vt.fail(f"{name}: the coordinator's checkpoint is of step {step}, not a multiple of 10 up to 60")
        row = db.execute("SELECT step, path FROM checkpoints WHERE name = ?", (name,)).fetchone()
        if row is None or row[0] != step or os.path.abspath(row[1]) != os.path.abspath(os.path.join(held, files[0])):
            vt.fail(f"{name}: coordinator.db says {row}, the folder holds step {step}")
        own = os.path.join(workdir, "node_data", "nodes", name, "checkpoints", files[0])
        if not os.path.exists(own):
            vt.fail(f"{name}: the volunteer no longer has {own} (it keeps its newest 3; the coordinator "
                 f"should hold the newest)")
        if open(own, "rb").read() != open(os.path.join(held, files[0]), "rb").read():
            vt.fail(f"{name}: the coordinator's step {step} differs from the volunteer's {own}")
        uploads = [l.strip() for l in v.lines if "uploaded checkpoint step" in l]
        if not uploads:
            vt.fail(f"{v.tag} ({name}) logged no upload")
        print(f"{name}: coordinator holds step {step}, byte-identical to the volunteer's; uploads:")
        for l in uploads:
            print("   ", l[l.index("uploaded checkpoint"):])


def check_limits(run):
    """Each volunteer (--cores 1; volunteer 0 --memory-gb 3.5 too) offered the coordinator what it
    gives, not what the machine has, and trained its stage on 1 thread though job.json asks for 2."""
    for i, (v, _) in enumerate(run.volunteers):
        address = f"127.0.0.1:{run.ports[i]}"
        offered = [l for l in run.coordinator.lines if "coordinator: joined: " in l and f" at {address} (" in l]
        if len(offered) != 1:
            vt.fail(f"the coordinator's join lines of {v.tag}: {offered}")
        ram_gb = float(offered[0].split(f" at {address} (")[1].split(" GB, ")[0])
        if " GB, 1 cores," not in offered[0] or (ram_gb == 3.5) != (i == 0):
            vt.fail(f"{v.tag} (--cores 1{' --memory-gb 3.5' if i == 0 else ''}) joined as: {offered[0]}")
        if not v.count(lambda l: "asks for 2 intra-op threads; this volunteer gives 1 cores" in l):
            vt.fail(f"{v.tag} did not cap job.json's 2 threads at its 1 core")
        print(f"limits: {offered[0][offered[0].index('joined: '):].strip()}")
    if not run.volunteers[0][0].count(lambda l: "probe: giving " in l and " and 3.5 of " in l):
        vt.fail("volunteer 0 did not log what it gives of the machine ('probe: giving …')")


def case_coordinator_restarts(args):
    test_samples = 1000
    run = vt.start_run(args, 150, test_samples, ["--min-volunteers", "3", "--clusters", "1", "--cuts", "7,14"], 3,
                    restartable=True)
    with run:
        run.join(3, ["--result-wait-s", "600"])
        run.wait_planned(1)
        metrics, _, _ = run.restart_coordinator()
        run.all_finish()
    if vt.step_records(metrics) != 150:
        vt.fail(f"the Leaf wrote {vt.step_records(metrics)} step records, expected 150")
    vt.check_trained(run.out, test_samples,
                  "after a coordinator restart: Leaf accuracy {reported:.4f}, merged model in PyTorch {accuracy:.4f}")


def case_dead_spare_not_planned(args):
    test_samples = 1000
    run = vt.start_run(args, 30, test_samples, ["--min-volunteers", "3", "--clusters", "1", "--cuts", "7,14"], 4)
    out, coordinator = run.out, run.coordinator
    with run:
        run.join(1)
        coordinator.wait_for(lambda l: "joined: node_0 " in l, 120, "'joined: node_0'")
        dead = run.volunteers[0][0]
        dead.proc.kill()
        dead.finish(30)
        print(coordinator.wait_for(lambda l: "node_0 is not heard lately" in l, 60,
                                   "'node_0 is not heard lately'").strip())
        run.join(3)
        coordinator.wait_for(lambda l: "planned 1 cluster(s) on 3 volunteers" in l, 120, "the plan of 3")
        run.all_finish(but=dead)
    chain = json.load(open(os.path.join(out, "plan.json")))["clusters"][0]["chain"]
    if "node_0" in chain or len(chain) != 3:
        vt.fail(f"the plan's chain is {chain}: the dead volunteer node_0 was planned")
    if coordinator.count(lambda l: "coordinator: lost: " in l):
        vt.fail("a planned volunteer was lost: the plan held the dead one")
    row = sqlite3.connect(os.path.join(out, "coordinator.db")).execute(
        "SELECT state FROM members WHERE name = 'node_0'").fetchone()
    if row != ("spare",):
        vt.fail(f"coordinator.db: node_0 is {row}, expected still a spare")
    vt.check_trained(out, test_samples, "without the dead volunteer: Leaf accuracy {reported:.4f}, "
                     "merged model in PyTorch {accuracy:.4f}")


def case_bad_invites(args):
    run = vt.start_run(args, 10, 100, ["--min-volunteers", "99"])
    model, job, coordinator, invite = run.model, run.job, run.coordinator, run.invite
    try:
        head, key_hex, token = invite.rsplit(":", 2)
        port = vt.free_ports(1)[0]
        # A wrong token: refused with the coordinator's reason.
        v, _ = vt.volunteer(args, f"{head}:{key_hex}:{'f' * len(token)}", "token", port)
        code = v.finish(120)
        if code != 2 or not v.count(lambda l: "refused" in l and "wrong invite token" in l):
            vt.fail(f"a wrong token: expected exit 2 and the coordinator's reason, got exit {code}")
        # A wrong coordinator key (another valid key): the CURVE handshake fails silently, so
        # the volunteer hears nothing and says so.
        other = vt.z85(os.urandom(32)).encode().hex()
        v, _ = vt.volunteer(args, f"{head}:{other}:{token}", "key", port, ["--coordinator-timeout-s", "3"])
        code = v.finish(120)
        if code != 3 or not v.count(lambda l: "did not answer" in l):
            vt.fail(f"a wrong coordinator key: expected exit 3 and 'did not answer', got exit {code}")
        # A malformed invite never reaches the network.
        v, _ = vt.volunteer(args, "cairn-invite:1:127.0.0.1:notaport:00:00", "malformed", port)
        code = v.finish(60)
        if code != 2 or not v.count(lambda l: "invite" in l):
            vt.fail(f"a malformed invite: expected exit 2 naming the invite, got exit {code}")
        # --advertise names --listen from outside: alone it is refused before any network traffic
        # (no address at all is fine: a dial-out-only volunteer, integration.volunteers.nat_direct).
        alone = subprocess.run([args.provider, "--join", invite, "--advertise", "203.0.113.7:7100",
                                "--workdir", os.path.join(args.work, "advertise_alone")],
                               capture_output=True, text=True, timeout=60)
        if alone.returncode != 2 or "--advertise 203.0.113.7:7100 needs --listen" not in alone.stderr:
            vt.fail(f"--advertise without --listen: expected exit 2 naming both, got exit "
                 f"{alone.returncode}: {alone.stderr[-300:]}")
    finally:
        coordinator.proc.terminate()
        code = coordinator.finish(60)
    if code != 0:
        vt.fail(f"the coordinator exited {code} on SIGTERM")
    # Growth needs the sync schedule: an async job with --grow is refused before anything listens.
    async_job = json.load(open(job))
    async_job["training_definition"]["schedule"] = "async"
    async_path = os.path.join(args.work, "async_job.json")
    json.dump(async_job, open(async_path, "w"))
    refused = subprocess.run([args.clusterize, "--model", model, "--job", async_path, "--input-shape", "8,1,28,28",
                              "--serve", "127.0.0.1:0", "--out", os.path.join(args.work, "async_out"), "--grow"],
                             capture_output=True, text=True, timeout=300)
    said = refused.stdout + refused.stderr
    if refused.returncode != 2 or "training_definition.schedule" not in said or "--grow" not in said:
        vt.fail(f"--grow with an async job: expected exit 2 naming training_definition.schedule, got exit "
             f"{refused.returncode}: {said[-400:]}")
    print("--grow with an async job: refused (exit 2):", [l for l in said.splitlines() if "schedule" in l][-1])


def main():
    vt.main_of(["join_train_merge", "coordinator_restarts", "bad_invites", "checkpoint_upload",
                "dead_spare_not_planned"], globals())


if __name__ == "__main__":
    main()
