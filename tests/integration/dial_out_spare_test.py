#!/usr/bin/python3
"""A node placed dial-out only is taken over by a reachable spare (docs/OPERATIONS.md "A lost
volunteer is replaced by a spare"): a real coordinator (`clusterize --serve --lost-after-s`) and
real `provider --join` processes on tcp loopback with CurveZMQ, as volunteer_replace_test.py.

    dial_out_spare_test.py reachable_spare_dials_out --provider BUILD/node/provider
        --clusterize BUILD/clusterize/clusterize --work DIR

    dial_out_spare_test.py dial_out_spare_turns_links --provider … --clusterize … --work DIR

reachable_spare_dials_out
    Three volunteers join, one of them without --listen: it is admitted dial-out only and its node
    is placed dial-out only (it dials its two reachable neighbours, which accept it at their port
    + 1). A 4th volunteer, reachable, joins after the plan and waits as a spare. Once the
    coordinator has acknowledged a checkpoint of step >= KILL_AFTER of the dial-out-only node
    (whichever stage the plan gave it), its volunteer is SIGKILLed. The coordinator gives the node
    to the reachable spare (before, only a dial-out-only spare could take it, and the cluster
    waited): the spare runs it dial-out only, listening on nothing; the neighbours, told the new
    key, accept its dial as they accepted the lost holder's; the cluster resumes.
    Checks: the takeover; the spare's log says it listens on nothing and dials every peer; the
    coordinator's node.json of the node has no address and says dial_out_only, and so do its
    neighbours' references to it, with the spare's key; every step loss the Leaf logged (over its
    holders) equals the uninterrupted run's (volunteer_replace_test.py's reference, the same job);
    the merged model's accuracy equals the reference's; the run ends and every living volunteer
    exits 0.

dial_out_spare_turns_links
    The mirror: every volunteer of 2 clusters x 3 stages joins reachable, and the only spare joins
    dial-out only (volunteer_replace_test.py ring_peer_replaced with that spare). Cluster 0's Stem
    is SIGKILLed; the coordinator gives it to the dial-out-only spare (before, only a reachable
    spare could take a node placed reachable, and the cluster waited): the node is placed dial-out
    only from then on, its links turned around. Its neighbours restart and accept its dial; its
    ring peer in cluster 1, which keeps training, turns its link live (the transport's PUSH to the
    lost holder closed, the spare's dial accepted: node/transport/ZmqTransport.h repointPeer) and
    welcomes it into the ring. Checks: the takeover says the links turn; the spare runs the node
    dial-out only; node.json of the node and every reference to it (neighbours, ring peer) have
    no address, say dial_out_only and hold the spare's key (no relay: every peer is reachable); the
    ring peer re-pointed it live as dial-out only; the replacement was welcomed into the ring by
    that peer; each cluster's own weights evaluated by PyTorch give exactly the accuracy its Leaf
    reported.

dial_out_spare_through_relay
    2 clusters x 3 stages on five reachable volunteers and one dial-out-only one (D's node, placed
    next to reachable ones), the coordinator offering its relay (--relay); the only spare joins
    dial-out only. The holder of D's ring peer R (the other cluster's node of D's stage, placed
    reachable) is SIGKILLed: the spare takes R over, R is placed dial-out only from then on, and
    the link R-D, between two dial-out-only volunteers now, goes through the coordinator's relay.
    D, which keeps training, turns its link live (its DEALER to R's lost holder closed, the relay
    dialled) and welcomes the spare into the ring through the relay. Checks: the takeover says one
    link goes through a relay; R's and D's node.json name the relay for each other, R has no
    address; D re-pointed R live through the relay; the replacement was welcomed into the ring by
    D; each cluster's own weights give exactly the accuracy its Leaf reported.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import volunteer_harness as vt  # noqa: E402  (the shared helpers: processes, jobs, evaluation)
from volunteer_replace_test import (FLAGS, HOLD_AT, KILL_AFTER, STEPS, TEST_SAMPLES, TRAINING,  # noqa: E402
                                    check_exact_resume, hold_root, hold_until, key_of,
                                    kill_after_checkpoint, ring_peer_replaced, run_reference,
                                    RING_FLAGS, RING_STEPS, check_each_cluster)

name_of = vt.name_of


def references_to(out, node):
    """Every reference to NODE in the coordinator's node.json files of the plan's other nodes
    (pipeline neighbours, ring members), as (that node, the reference)."""
    refs = []
    for cluster in json.load(open(os.path.join(out, "plan.json")))["clusters"]:
        for other in cluster["chain"]:
            if other == node:
                continue
            doc = json.load(open(os.path.join(out, "nodes", other, "node.json")))
            named = [doc[side] for side in ("upstream", "downstream") if isinstance(doc.get(side), dict)]
            named += [m for ring in doc.get("rings", []) for m in ring.get("members", [])]
            refs += [(other, ref) for ref in named if ref.get("name") == node]
    return refs


def case_reachable_spare_dials_out(args):
    model, job = vt.prepare(args, STEPS, TEST_SAMPLES, TRAINING)
    reference, reference_accuracy = run_reference(args, model, job)
    release = hold_root(args, HOLD_AT)
    killed = hold_until(args, KILL_AFTER, "killed")
    run = vt.Run(args, model, job, FLAGS, 4)
    out, coordinator, volunteers = run.out, run.coordinator, run.volunteers
    with run:
        run.join(2, ["--upload-mbps", "200"])
        run.join(1, ["--upload-mbps", "200"], dial_out_only=True)
        # Admitted at once (no address to dial back), it may be named before the other two.
        admitted = coordinator.wait_for(lambda l: "joined: " in l and " at (dial-out only" in l, 120,
                                        "the dial-out-only volunteer's admission")
        node = admitted.split("joined: ")[1].split()[0]
        run.wait_planned(1)
        run.join(1)
        coordinator.wait_for(lambda l: "joined: node_3 " in l and ", spare" in l, 120, "the spare")
        spec = json.load(open(os.path.join(out, "nodes", node, "node.json")))
        if not spec.get("dial_out_only"):
            vt.fail(f"{node} (the dial-out-only volunteer's) is not placed dial-out only: {spec}")
        ack = kill_after_checkpoint(coordinator, volunteers[2], node, records_in=out)
        print(f"SIGKILLed the dial-out-only volunteer ({node}) after: {ack.strip()}")
        taken = coordinator.wait_for(lambda l: f"coordinator: {node} is taken over by spare node_3" in l,
                                     120, "the takeover by the reachable spare")
        print(taken.strip().split("] ")[-1])
        if "(dialling out: the node is placed dial-out only)" not in taken:
            vt.fail(f"the takeover does not say the reachable spare dials out: {taken.strip()}")
        volunteers[3][0].wait_for(lambda l: "dial-out only: listening on nothing, dialling every peer" in l,
                                  120, "the spare running the node dial-out only")
        open(killed, "w").close()
        open(release, "w").close()
        run.all_finish(but=volunteers[2][0])

    spare_workdir = volunteers[3][1]
    if name_of(spare_workdir) != node:
        vt.fail(f"the spare's membership.json names {name_of(spare_workdir)}, not {node}")
    spec = json.load(open(os.path.join(out, "nodes", node, "node.json")))
    spare_key = key_of(spare_workdir)
    own_key = spec.get("extra", {}).get("public_key")
    if not spec.get("dial_out_only") or spec.get("address") or own_key != spare_key:
        vt.fail(f"{node}'s node.json after the takeover: dial_out_only {spec.get('dial_out_only')}, "
                f"address {spec.get('address')!r}, key {own_key} (the spare's: {spare_key})")
    refs = references_to(out, node)
    if not refs:
        vt.fail(f"no node of the plan names {node}")
    for other, ref in refs:
        if not ref.get("dial_out_only") or ref.get("address") or ref.get("public_key") != spare_key:
            vt.fail(f"{other}'s reference to {node} after the takeover: {ref}")
    print(f"{node}: placed dial-out only before and after; {len(refs)} neighbour(s) name the spare's key")

    leaf = json.load(open(os.path.join(out, "plan.json")))["clusters"][0]["chain"][-1]
    check_exact_resume([w for _, w in volunteers], out, leaf, reference, reference_accuracy, 1,
                       "the reachable spare's run")


def case_dial_out_spare_turns_links(args):
    taken, out, stem, ring_peer, peer_proc, spare = ring_peer_replaced(args, spare_dial_out_only=True)
    if "its links turn around" not in taken:
        vt.fail(f"the takeover does not say the node's links turn around: {taken.strip()}")
    if not spare.count(lambda l: "dial-out only: listening on nothing, dialling every peer" in l):
        vt.fail("the dial-out-only spare did not run the node dial-out only")
    spec = json.load(open(os.path.join(out, "nodes", stem, "node.json")))
    spare_key = spec.get("extra", {}).get("public_key")
    if not spec.get("dial_out_only") or spec.get("address"):
        vt.fail(f"{stem}'s node.json after the takeover: dial_out_only {spec.get('dial_out_only')}, "
                f"address {spec.get('address')!r}")
    refs = references_to(out, stem)
    naming = {other for other, _ in refs}
    if len(naming) != 3 or ring_peer not in naming:
        vt.fail(f"{stem} is named by {sorted(naming)}: expected its two neighbours and its ring peer "
                f"{ring_peer}")
    for other, ref in refs:
        if not ref.get("dial_out_only") or ref.get("address") or ref.get("public_key") != spare_key \
                or ref.get("relay"):
            vt.fail(f"{other}'s reference to {stem} after the takeover: {ref}")
    live = [l for l in peer_proc.lines if "ring peers re-pointed live" in l and stem in l]
    if not any(f"{stem} at (dial-out only)" in l for l in live):
        vt.fail(f"{ring_peer} did not re-point {stem} live as dial-out only: {live}")
    print(f"{stem}: placed dial-out only after the takeover; {len(refs)} references name the spare's "
          f"key; {ring_peer}: {live[-1].strip()}")


def case_dial_out_spare_through_relay(args):
    holds = [os.path.join(args.work, f"release_cluster_{c}") for c in (0, 1)]
    # Each cluster's Root holds before step HOLD_AT until its file exists (and from its next step
    # once FILE.hold exists): the cluster that keeps training cannot finish before the spare joins.
    os.environ["CAIRN_TEST_HOLD"] = ",".join(f"{c}:{HOLD_AT}:{holds[c]}" for c in (0, 1))
    relay = f"127.0.0.1:{vt.free_ports(1)[0]}"
    run = vt.start_run(args, RING_STEPS, TEST_SAMPLES, RING_FLAGS + ["--relay", relay], 7, TRAINING)
    out, coordinator, volunteers = run.out, run.coordinator, run.volunteers
    with run:
        run.join(5, ["--upload-mbps", "200"])
        run.join(1, ["--upload-mbps", "200"], dial_out_only=True)
        run.wait_planned(2, 180)
        run.join(1, dial_out_only=True)
        coordinator.wait_for(lambda l: "joined: node_6 " in l and ", spare" in l, 120, "the spare")
        chains = [c["chain"] for c in json.load(open(os.path.join(out, "plan.json")))["clusters"]]
        behind = [n for chain in chains for n in chain
                  if json.load(open(os.path.join(out, "nodes", n, "node.json"))).get("dial_out_only")]
        if len(behind) != 1:
            vt.fail(f"expected one node placed dial-out only, found {behind}")
        d = behind[0]
        d_cluster = next(c for c, chain in enumerate(chains) if d in chain)
        r = chains[1 - d_cluster][chains[d_cluster].index(d)]
        victim = next(v for v in volunteers[:6] if name_of(v[1]) == r)
        d_proc = next(v for v, w in volunteers[:6] if name_of(w) == d)
        kill_after_checkpoint(coordinator, victim, r)
        open(holds[d_cluster] + ".hold", "w").close()
        open(holds[1 - d_cluster], "w").close()  # R's cluster resumes unheld
        taken = coordinator.wait_for(lambda l: f"coordinator: {r} is taken over by spare node_6" in l, 120,
                                     "the takeover")
        print(taken.strip().split("] ")[-1])
        if "1 through a relay" not in taken:
            vt.fail(f"the takeover does not say R's link to {d} goes through a relay: {taken.strip()}")
        spare = volunteers[6][0]
        spare.wait_for(lambda l: "resume: the cluster agreed on step" in l, 120, "the replacement's resume agreement")
        open(holds[d_cluster], "w").close()
        run.all_finish(but=victim[0])
    nodes = {n: json.load(open(os.path.join(out, "nodes", n, "node.json"))) for n in (r, d)}
    if not nodes[r].get("dial_out_only") or nodes[r].get("address"):
        vt.fail(f"{r}'s node.json after the takeover: dial_out_only {nodes[r].get('dial_out_only')}, "
                f"address {nodes[r].get('address')!r}")
    for a, b in ((r, d), (d, r)):
        refs = [m for ring in nodes[a].get("rings", []) for m in ring.get("members", []) if m.get("name") == b]
        if not refs or any((ref.get("relay") or {}).get("address") != relay for ref in refs):
            vt.fail(f"{a}'s reference to {b} does not name the coordinator's relay at {relay}: {refs}")
    live = [l for l in d_proc.lines if "ring peers re-pointed live" in l and r in l]
    if not any(f"{r} at (through the relay" in l for l in live):
        vt.fail(f"{d} did not re-point {r} live through the relay: {live}")
    welcomed = [l for l in spare.lines if ": joined from " + d in l]
    if not welcomed:
        vt.fail(f"the replacement never joined the rings with a welcome from {d}")
    print(f"{d} (dial-out only): {live[-1].strip()}")
    print("replacement:", welcomed[0].strip())
    check_each_cluster(args, out)


def main():
    vt.main_of(["reachable_spare_dials_out", "dial_out_spare_turns_links", "dial_out_spare_through_relay"],
               globals())


if __name__ == "__main__":
    main()
