#!/usr/bin/python3
"""A volunteer that only relays, hostile and then lost (issue 29, docs/OPERATIONS.md "Behind a home
router"), against real NAT:

    relay_volunteer_test.py --provider P --clusterize C --work DIR

The closed world of nat_test.py: an "internet" namespace with the coordinator (10.77.0.1) and one
reachable volunteer (10.77.0.2) that runs `provider --join … --relay --listen 10.77.0.2:7300`; four
homes, each volunteer behind its own MASQUERADE router with no address (dial-out only). So every
link of the 2 clusters x 2 stages job joins two dial-out-only volunteers, and goes through the
volunteer's relay: the coordinator offers its own (`--relay 10.77.0.1:7101`) too, but uses it only
when no volunteer relay is alive. The relay is hostile (CAIRN_TEST_RELAY_TAMPER: of the messages it
forwards it drops, flips a bit in, doubles or reorders one in eight), and once both clusters' Roots
are held before step HOLD_AT (CAIRN_TEST_HOLD: both have trained through it) it is SIGKILLed; the
coordinator hears it no more (--lost-after-s 5), moves its links to its own relay and tells both
ends of each, which re-point them live (what was unacknowledged is sent again through the new
relay). Checked (outcomes only):
  * the relay is admitted as `relaying`; the plan names it on every link (both ends' node.json);
  * it tampered with messages before it was killed;
  * after the kill every link names the coordinator's relay;
  * the run ends (the coordinator and the four volunteers exit 0), and every step's loss of every
    cluster's Leaf equals the same job's on a flat network (4 volunteers on loopback): nothing the
    relay did, nor its loss, changed the training;
  * the merged model evaluates in PyTorch to the accuracy cluster 0's Leaf reported.
Exits 77 (ctest: skipped) with the reason where namespaces or iptables are missing. Every namespace
is removed on exit, whatever happens.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nat_test  # noqa: E402
import volunteer_harness as vt  # noqa: E402

STEPS = 20
HOLD_AT = 10
TEST_SAMPLES = 200
RELAY_AT = "10.77.0.2"
TAMPER_SEED = "7"


def links_of(out):
    """{(a, b): relay name or None} for every link of the placed nodes, both ends agreeing."""
    links = {}
    for name in os.listdir(os.path.join(out, "nodes")):
        spec = json.load(open(os.path.join(out, "nodes", name, "node.json")))
        peers = [spec[k] for k in ("upstream", "downstream") if spec.get(k)]
        peers += [m for ring in spec.get("rings", []) for m in ring["members"] if m["name"] != name]
        for p in peers:
            relay = p.get("relay", {}).get("name")
            key = tuple(sorted((name, p["name"])))
            if key in links and links[key] != relay:
                vt.fail(f"the ends of {key} name different relays: {links[key]} and {relay}")
            links[key] = relay
    return links


def check_all_through(out, relay, when):
    links = links_of(out)
    other = {k: v for k, v in links.items() if v != relay}
    if not links or other:
        vt.fail(f"{when}: links not through {relay}: {other or 'no links at all'}")
    print(f"{when}: all {len(links)} links through the relay {relay}")


def relayed_run(args, world, model, job):
    sub = vt.in_folder(args, "relayed")
    out = os.path.join(sub.work, "coordinator")
    release = os.path.join(sub.work, "release")
    coordinator = vt.Process("coordinator", world.run_in(world.inet) + [
        args.clusterize, "--model", model, "--job", job, *vt.INPUT_SHAPE,
        "--serve", f"{nat_test.COORDINATOR}:7100", "--invite-file", os.path.join(sub.work, "invite.txt"),
        "--out", out, "--relay", f"{nat_test.COORDINATOR}:7101", "--lost-after-s", "5"] + nat_test.FLAGS)
    processes = [coordinator]
    try:
        invite = coordinator.wait_for(lambda l: l.startswith("invite: "), 120, "'invite: …'").split()[1]
        relay = vt.Process("relay", world.run_in(world.inet) + [
            args.provider, "--join", invite, "--relay", "--listen", f"{RELAY_AT}:7300",
            "--workdir", os.path.join(sub.work, "relay"), "--probe-megabytes", "1"],
            env=dict(os.environ, CAIRN_TEST_RELAY_TAMPER=TAMPER_SEED))
        processes.append(relay)
        relay.wait_for(lambda l: "relaying for the run at " + RELAY_AT in l, 120, "'relaying for the run'")
        # It trains nothing: its join measured its compute briefly, not for the volunteers' 1.5 s.
        if not relay.count(lambda l: "only relays: its compute figure from 100 ms of 512 x 512 sgemms" in l):
            vt.fail("the relay did not take the short compute probe")
        relay_name = vt.name_of(os.path.join(sub.work, "relay"))
        hold = dict(os.environ, CAIRN_TEST_HOLD=f"0:{HOLD_AT}:{release},1:{HOLD_AT}:{release}")
        workdirs = []
        for k in range(4):
            workdirs.append(os.path.join(sub.work, f"volunteer_{k}"))
            processes.append(vt.Process(f"home {k}", world.run_in(world.home_of(k)) + [
                args.provider, "--join", invite, "--workdir", workdirs[-1], "--probe-megabytes", "1"],
                env=hold))
        coordinator.wait_for(lambda l: "planned 2 cluster(s) on 4 volunteers" in l, 120, "'planned'")
        check_all_through(out, relay_name, "planned")
        homes = processes[2:]
        vt.wait_until(lambda: sum(h.count(lambda l: f"test hold: before step {HOLD_AT}" in l)
                                  for h in homes) >= 2, 300, f"both Roots held before step {HOLD_AT}")
        relay.wait_for(lambda l: "relay: tampered with" in l, 10, "'relay: tampered with'")
        relay.kill()
        print(f"killed the relay {relay_name} with both clusters held before step {HOLD_AT}")
        open(release, "w").close()
        coordinator.wait_for(lambda l: "moved to the relay coordinator" in l, 120,
                             "'… moved to the relay coordinator'")
        vt.all_finish(coordinator, [(p, None) for p in homes])
        check_all_through(out, "coordinator", "after the relay was lost")
        vt.check_trained(out, TEST_SAMPLES, "the merged model: {accuracy:.4f} in PyTorch, the Leaf "
                         "reported {reported:.4f}")
        return vt.leaf_losses(out, workdirs)
    finally:
        for p in processes:
            p.kill()


def main():
    args = nat_test.arguments()
    nat_test.REACHABLE = [RELAY_AT]  # the relay's address on the "internet" bridge
    nat_test.HOMES = 4
    world = nat_test.open_world(args)
    model, job = vt.prepare(args, STEPS, TEST_SAMPLES)
    try:
        world.build()
        relayed = relayed_run(args, world, model, job)
    finally:
        world.close()
    reference = nat_test.reference_run(args, model, job)
    vt.check_same_losses(reference, relayed, STEPS, "the run through a hostile relay, then lost,")
    print(f"every Leaf loss of {len(reference)} clusters x {STEPS} steps through a hostile relay that "
          f"was then lost equals the flat run's")
    print("PASS")


if __name__ == "__main__":
    main()
