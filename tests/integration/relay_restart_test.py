#!/usr/bin/python3
"""The coordinator's relay dies and comes back mid-run (issue 29, docs/OPERATIONS.md "Behind a
home router", docs/PROTOCOL.md "Relayed links"):

    relay_restart_test.py --provider P --clusterize C --work DIR

Four volunteers join with no address (dial-out only) on loopback, so every link of the 2 clusters x
2 stages job goes through the coordinator's relay (`--relay`). The same job runs twice: once
undisturbed (the reference), once with the coordinator — and so its relay — SIGKILLed once it
acknowledged a checkpoint of step 30 (of 80), and started again (the same command, port and key) 3 s later,
well within `timeouts.peer_timeout_s`. Checked (outcomes only): node.json names the relay on every
link; both runs end (every process exits 0); every step's loss of every cluster's Leaf in the run
with the restart equals the reference's: what was sent while the relay was down was sent again
end to end (acknowledged messages, RelayedLinks.h), none lost, none twice.
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import volunteer_harness as vt  # noqa: E402

STEPS = 80
KILL_AT = 30  # the coordinator is killed once it acknowledged a checkpoint of this step
TEST_SAMPLES = 200
FLAGS = ["--min-volunteers", "4", "--clusters", "2", "--cuts", "7"]


def relayed_run(args, model, job, name, kill):
    sub = vt.in_folder(args, name)
    out = os.path.join(sub.work, "coordinator")
    port, relay_port = vt.free_ports(2)
    flags = FLAGS + ["--relay", f"127.0.0.1:{relay_port}"]
    coordinator, invite = vt.start_coordinator(sub, job, model, out, flags, port)
    volunteers = []
    try:
        for i in range(4):
            workdir = os.path.join(sub.work, f"volunteer_{i}")
            cmd = [args.provider, "--join", invite, "--workdir", workdir, "--probe-megabytes", "1"]
            volunteers.append((vt.Process(f"{name} volunteer {i}", cmd), workdir))
        coordinator.wait_for(lambda l: "planned 2 cluster(s) on 4 volunteers" in l, 120, "'planned'")
        if kill:
            # A checkpoint of step KILL_AT acknowledged (every 10 steps; the Leaves' own progress
            # lines come every 10 s, which a fast machine covers in more than the whole run).
            vt.wait_for_checkpoint(coordinator, KILL_AT, 120)
            coordinator.proc.kill()
            coordinator.finish(30)
            print("killed the coordinator (and its relay); starting it again in 3 s")
            time.sleep(3)
            coordinator, again = vt.start_coordinator(sub, job, model, out, flags, port, "coordinator again")
            if again != invite:
                vt.fail("the restarted coordinator has another invite")
        vt.all_finish(coordinator, volunteers)
        check_relayed(out)
        return vt.leaf_losses(out, [w for _, w in volunteers])
    finally:
        vt.kill_all(coordinator, volunteers)


def check_relayed(out):
    """Every link of the plan goes through the coordinator's relay (all four are dial-out only)."""
    for name in os.listdir(os.path.join(out, "nodes")):
        spec = vt.json.load(open(os.path.join(out, "nodes", name, "node.json")))
        peers = [spec[k] for k in ("upstream", "downstream") if spec.get(k)]
        peers += [m for ring in spec.get("rings", []) for m in ring["members"] if m["name"] != name]
        for p in peers:
            if p.get("relay", {}).get("name") != "coordinator":
                vt.fail(f"{name}'s link to {p['name']} is not through the coordinator's relay: {p}")


def main():
    parser = vt.argparse.ArgumentParser()
    parser.add_argument("--provider", required=True)
    parser.add_argument("--clusterize", required=True)
    parser.add_argument("--work", required=True)
    args = parser.parse_args()
    vt.torch.set_num_threads(1)
    vt.shutil.rmtree(args.work, ignore_errors=True)
    model, job = vt.prepare(args, STEPS, TEST_SAMPLES, {"checkpoint_every": 10})
    reference = relayed_run(args, model, job, "undisturbed", kill=False)
    restarted = relayed_run(args, model, job, "restarted", kill=True)
    vt.check_same_losses(reference, restarted, STEPS, "the run whose relay was killed and restarted")
    print(f"every Leaf loss of {len(reference)} clusters x {STEPS} steps equals the undisturbed run's")
    print("PASS")


if __name__ == "__main__":
    main()
