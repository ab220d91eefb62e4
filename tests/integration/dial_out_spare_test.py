#!/usr/bin/python3
"""A node placed dial-out only is taken over by a reachable spare (docs/OPERATIONS.md "A lost
volunteer is replaced by a spare"): a real coordinator (`clusterize --serve --lost-after-s`) and
real `provider --join` processes on tcp loopback with CurveZMQ, as volunteer_replace_test.py.

    dial_out_spare_test.py reachable_spare_dials_out --provider BUILD/node/provider
        --clusterize BUILD/clusterize/clusterize --work DIR

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
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import volunteer_harness as vt  # noqa: E402  (the shared helpers: processes, jobs, evaluation)
from volunteer_replace_test import (FLAGS, HOLD_AT, KILL_AFTER, STEPS, TEST_SAMPLES, TRAINING,  # noqa: E402
                                    check_exact_resume, hold_root, hold_until, key_of,
                                    kill_after_checkpoint, run_reference)

name_of = vt.name_of


def references_to(out, node):
    """Every reference to NODE in the coordinator's node.json files of the plan's other nodes."""
    refs = []
    for other in json.load(open(os.path.join(out, "plan.json")))["clusters"][0]["chain"]:
        if other == node:
            continue
        doc = json.load(open(os.path.join(out, "nodes", other, "node.json")))
        for side in ("upstream", "downstream"):
            if isinstance(doc.get(side), dict) and doc[side].get("name") == node:
                refs.append((other, doc[side]))
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


def main():
    vt.main_of(["reachable_spare_dials_out"], globals())


if __name__ == "__main__":
    main()
