#!/usr/bin/python3
"""Volunteers behind home routers (issue 29, docs/OPERATIONS.md "Behind a home router"), against
real NAT, over direct links or (--relayed) through the coordinator's relay:

    nat_test.py --provider P --clusterize C --work DIR [--relayed]

Network namespaces, a closed world that never touches this machine's own interfaces: an
"internet" namespace holds a bridge with the coordinator (10.77.0.1) and two reachable volunteers
(10.77.0.2, 10.77.0.3); each of two "homes" is a namespace behind a router namespace whose only
way out is `iptables -t nat ... MASQUERADE` on its WAN side (10.77.0.10+k): SNAT with connection
tracking, the return traffic of its own connections forwarded, nothing else (no route reaches the
home's 192.168.k.0/24 from outside). One home volunteer runs `provider --join` with no --listen at
all, the other advertises its router's address, which nothing forwards (the dial-back fails). The same 2 clusters x 2 stages job (the example Fashion-MNIST CNN, "average" syncs) runs
twice: on a flat network (4 reachable volunteers on loopback: the reference) and this way.

With --relayed there is no reachable volunteer: four homes, each volunteer behind its own router
with no address, so every link joins two dial-out-only volunteers and goes through the relay the
coordinator offers (`--relay 10.77.0.1:7101`), sealed end to end (node/transport/RelayedLinks.h).

Checked (outcomes only): each home volunteer is admitted as dial-out only and told so in one line
(no address given / the advertised address did not answer) naming the router's address the
coordinator saw; the plan puts both dial-out-only volunteers in
node.json with no address and every link (pipeline neighbours, ring members) has a reachable
side (--relayed: every link names the coordinator's relay in both ends' node.json); the run ends (every process exits 0) and every step's loss of every cluster's Leaf equals
the reference's exactly. Exits 77 (ctest: skipped) with the reason when namespaces or iptables
are missing (not root, no `ip`/`iptables`, `ip netns add` refused). Every namespace is removed on
exit, whatever happens.
"""
import argparse
import atexit
import json
import os
import shutil
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import volunteer_harness as vt  # noqa: E402
import nat_world  # noqa: E402  (the namespaces, shared with examples/fashion_mnist/run_nat.py)

STEPS = 20
TEST_SAMPLES = 200
FLAGS = ["--min-volunteers", "4", "--clusters", "2", "--cuts", "7"]
COORDINATOR = "10.77.0.1"
REACHABLE = ["10.77.0.2", "10.77.0.3"]
HOMES = 2
# Home 0 gives no address at all; home 1 advertises its router's address without forwarding it
# (what a user who misread the docs does): the dial-back gets no answer, it is dial-out only too.
HOME_FLAGS = [[], ["--listen", "0.0.0.0:7300", "--advertise", "10.77.0.11:7300"]]
HOME_SAYS = ["dial-out only: no address given",
             "dial-out only: the advertised address 10.77.0.11:7300 did not answer"]


class NatWorld(nat_world.NatWorld):
    """The namespaces above (tests/integration/nat_world.py), built from this module's
    COORDINATOR, REACHABLE and HOMES as they are at build() (use_relay(), or a test importing this
    one, may change them)."""

    def build(self, public=None, homes=None):
        super().build([COORDINATOR] + REACHABLE if public is None else public,
                      HOMES if homes is None else homes)


def reference_run(args, model, job):
    sub = vt.in_folder(args, "flat")
    run = vt.Run(sub, model, job, FLAGS, 4)
    with run:
        run.join(4)
        run.wait_planned(2)
        run.all_finish()
    return vt.leaf_losses(run.out, [w for _, w in run.volunteers])


def use_relay():
    """Four homes, nobody reachable: every link through the coordinator's relay."""
    global REACHABLE, HOMES, HOME_FLAGS, HOME_SAYS, COORDINATOR_FLAGS
    REACHABLE = []
    HOMES = 4
    HOME_FLAGS = [[]] * HOMES
    HOME_SAYS = ["dial-out only: no address given"] * HOMES
    COORDINATOR_FLAGS = ["--relay", f"{COORDINATOR}:7101"]


COORDINATOR_FLAGS = []


def check_links(out):
    """The dial-out-only volunteers are placed with no address; every link has a reachable side,
    or (nobody reachable) goes through the coordinator's relay."""
    nodes = {}
    for name in os.listdir(os.path.join(out, "nodes")):
        nodes[name] = json.load(open(os.path.join(out, "nodes", name, "node.json")))
    behind = sorted(n for n, spec in nodes.items() if spec.get("dial_out_only"))
    if len(behind) != HOMES or any(nodes[n]["address"] for n in behind):
        vt.fail(f"expected {HOMES} dial-out-only nodes without an address, got {behind}")
    links = 0
    for name, spec in nodes.items():
        peers = [spec[k] for k in ("upstream", "downstream") if spec.get(k)]
        peers += [m for ring in spec.get("rings", []) for m in ring["members"] if m["name"] != name]
        for p in peers:
            links += 1
            relay = p.get("relay", {})
            if not REACHABLE and (relay.get("name") != "coordinator" or relay.get("address") != f"{COORDINATOR}:7101"):
                vt.fail(f"{name}'s link to {p['name']} is not through the coordinator's relay: {p}")
            if REACHABLE and spec.get("dial_out_only") and p.get("dial_out_only"):
                vt.fail(f"{name} and {p['name']} are linked and both dial-out only")
            if bool(p.get("dial_out_only")) != (p["name"] in behind):
                vt.fail(f"{name}'s node.json marks {p['name']} wrongly")
    print(f"plan: {behind} dial-out only; {links // 2} links, each "
          f"{'with a reachable side' if REACHABLE else 'through the relay'}")


def nat_run(args, world, model, job):
    sub = vt.in_folder(args, "nat")
    out = os.path.join(sub.work, "coordinator")
    invite_file = os.path.join(sub.work, "invite.txt")
    coordinator = vt.Process("coordinator", world.run_in(world.inet) + [
        args.clusterize, "--model", model, "--job", job, *vt.INPUT_SHAPE, "--serve", f"{COORDINATOR}:7100",
        "--invite-file", invite_file, "--out", out] + FLAGS + COORDINATOR_FLAGS)
    processes = [coordinator]
    try:
        invite = coordinator.wait_for(lambda l: l.startswith("invite: "), 120, "'invite: …'").split()[1]
        workdirs, homes = [], []
        for i in range(len(REACHABLE) + HOMES):
            workdir = os.path.join(sub.work, f"volunteer_{i}")
            workdirs.append(workdir)
            base = [args.provider, "--join", invite, "--workdir", workdir, "--probe-megabytes", "1"]
            if i < len(REACHABLE):
                cmd = world.run_in(world.inet) + base + ["--listen", f"{REACHABLE[i]}:7200"]
            else:
                k = i - len(REACHABLE)
                cmd = world.run_in(world.home_of(k)) + base + HOME_FLAGS[k]
            processes.append(vt.Process(f"volunteer {i}", cmd))
            if i >= len(REACHABLE):
                homes.append((processes[-1], i - len(REACHABLE)))
        for v, k in homes:
            line = v.wait_for(lambda l, k=k: HOME_SAYS[k] in l, 120, f"'{HOME_SAYS[k]}'")
            if f"come from 10.77.0.{10 + k}" not in line:
                vt.fail(f"the home volunteer {k} was not told the router's address: {line.strip()}")
        coordinator.wait_for(lambda l: "planned 2 cluster(s) on 4 volunteers" in l, 120, "'planned'")
        vt.all_finish(coordinator, [(p, None) for p in processes[1:]])
        check_links(out)
        return vt.leaf_losses(out, workdirs)
    finally:
        for p in processes:
            p.kill()


def arguments(relayed_flag=False):
    """The NAT tests' flags: --provider, --clusterize, --work (and this script's --relayed)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--provider", required=True)
    parser.add_argument("--clusterize", required=True)
    parser.add_argument("--work", required=True)
    if relayed_flag:
        parser.add_argument("--relayed", action="store_true", help="nobody reachable: the coordinator relays")
    return parser.parse_args()


def open_world(args):
    """The namespaces of this module's settings (REACHABLE, HOMES), not built yet: exit 77 with the
    reason where they cannot be made; removed at exit and on ctest's SIGTERM. args.work made empty."""
    world = NatWorld()
    reason = world.skip_reason()
    if reason:
        print(f"SKIP: {reason}")
        sys.exit(77)
    atexit.register(world.close)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # ctest's timeout: still clean up
    vt.torch.set_num_threads(1)
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    return world


def main():
    args = arguments(relayed_flag=True)
    if args.relayed:
        use_relay()
    world = open_world(args)
    model, job = vt.prepare(args, STEPS, TEST_SAMPLES)
    try:
        world.build()
        behind_nat = nat_run(args, world, model, job)
    finally:
        world.close()
    reference = reference_run(args, model, job)
    vt.check_same_losses(reference, behind_nat, STEPS, "the run behind NAT's")
    print(f"every Leaf loss of {len(reference)} clusters x {STEPS} steps behind NAT"
          f"{' (relayed)' if args.relayed else ''} equals the flat run's")
    print("PASS")


if __name__ == "__main__":
    main()
