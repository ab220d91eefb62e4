#!/usr/bin/python3
"""A volunteer behind a home router is lost and a spare behind another router takes its node over,
every link through the coordinator's relay (issue 29, docs/OPERATIONS.md "Behind a home router" and
"A lost volunteer is replaced by a spare"), against real NAT:

    nat_replace_test.py --provider P --clusterize C --work DIR

The closed world of nat_test.py (tests/integration/nat_world.py): an "internet" namespace with the
coordinator (10.77.0.1, `--relay 10.77.0.1:7101 --lost-after-s 5`) and five homes, each volunteer
behind its own MASQUERADE router and joining with no address (dial-out only). Four are placed in
the 2 clusters x 2 stages job of nat_test.py (so every link joins two dial-out-only volunteers and
goes through the relay); the fifth joins after the plan and waits as a spare. Both clusters' Roots
are held (CAIRN_TEST_HOLD) once they have trained, synced and checkpointed step HOLD_AT; once the
coordinator holds the checkpoint of step HOLD_AT of cluster 1's Root (the victim), its volunteer is
SIGKILLed. The coordinator hears it no more and gives its node to the spare with
that checkpoint; the victim's Leaf (paused) and its ring peer (cluster 0's Root, live) are told
the spare's key, both through the relay; cluster 1 resumes from step HOLD_AT; cluster 0 is then
released.

STEPS is HOLD_AT + local_steps: the run's last sync is the first after the kill. A resumed cluster
is taken back into the rings only at a sync boundary the live Roots decide at an earlier sync
(docs/TRAINING.md "A cluster is admitted at the same sync in every ring"), so here it never is:
each cluster trains its last local_steps steps from its own checkpointed weights, exactly as the
uninterrupted run does (the losses of those steps are computed before the last sync). With more
steps the resumed cluster would be welcomed with the live cluster's weights of a later sync, which
one depending on when its join request reaches the live Root relative to that Root's syncs:
losses that are neither the uninterrupted run's nor the same from run to run. The resumed
cluster's members ask to join; the live cluster's members, finishing, answer that they finished
(docs/PROTOCOL.md "ring closed"), and the resumed ones train their last steps without the rings at
once (before, they waited 3 x max(startup_s, peer_s) for a welcome that could not come); the flat
reference runs meanwhile.

Checked (outcomes only):
  * each volunteer is admitted as dial-out only from its router's address; the spare as a spare;
  * the plan names the coordinator's relay on every link, in both ends' node.json;
  * the coordinator gives the victim's node to the spare (node_4) from its checkpoint of step
    HOLD_AT; the victim's Leaf applies the new peers, its ring peer re-points the node live;
  * after the replacement every link still names the relay in both ends' node.json (the
    coordinator's copies and the live holders' own), and the victim's neighbours name the
    spare's key; coordinator.db gives the node to the spare's key and keeps the victim's as lost;
  * cluster 1's Leaf resumed from step HOLD_AT;
  * the run ends: the coordinator and the four living volunteers exit 0;
  * every step's loss of every cluster's Leaf equals the same job's on a flat network (4
    reachable volunteers on loopback, nobody lost).
Exits 77 (ctest: skipped) with the reason where namespaces or iptables are missing. Every namespace
is removed on exit, whatever happens.
"""
import json
import os
import sqlite3
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nat_test  # noqa: E402
import nat_world  # noqa: E402
import volunteer_harness as vt  # noqa: E402

HOLD_AT = 10  # the Roots hold before step HOLD_AT + 1 (CAIRN_TEST_HOLD counts from 0)
LOCAL_STEPS = 5  # vt.write_job's: syncs after steps 5, 10, 15
STEPS = HOLD_AT + LOCAL_STEPS
TEST_SAMPLES = 200
# startup_s: the spare's first handshake waits for the victim's Leaf, which restarts with the new
# peers once it has paused and given up (5 s, ProviderRun's flushAndClose) the relayed messages it
# sent the dead Root: 6 s from the takeover here. max(startup_s, peer_s) is also the ring timeout,
# and cluster 1 waits 3 of them for a welcome into the rings: the test's longest wait.
TRAINING = {"checkpoint_every": 5,
            "timeouts": {"startup_s": 10, "peer_s": 10, "peer_timeout_s": 2, "max_wait_s": 300}}
HOMES = 5  # four placed, one spare
RELAY = f"{nat_test.COORDINATOR}:7101"
FLAGS = nat_test.FLAGS + ["--relay", RELAY, "--lost-after-s", "5"]
SAYS = "dial-out only: no address given"


def key_of(workdir):
    """The Z85 public key in a volunteer's identity.key."""
    text = open(os.path.join(workdir, "identity.key")).read()
    return next(line[len("public "):] for line in text.splitlines() if line.startswith("public "))


def peers_of(spec):
    peers = [spec[k] for k in ("upstream", "downstream") if spec.get(k)]
    return peers + [m for ring in spec.get("rings", []) for m in ring["members"] if m["name"] != spec["name"]]


def check_links(specs, when):
    """Every link between the node.json `specs` ({name: spec}) names the coordinator's relay at
    both ends; returns {peer name: {its public keys in the others' entries}}."""
    ends, keys = {}, {}  # {link: the nodes whose node.json names it}
    for name, spec in specs.items():
        for p in peers_of(spec):
            relay = p.get("relay", {})
            if relay.get("name") != "coordinator" or relay.get("address") != RELAY:
                vt.fail(f"{when}: {name}'s link to {p['name']} is not through the coordinator's relay: {p}")
            if not p.get("dial_out_only") or p.get("address"):
                vt.fail(f"{when}: {name}'s node.json gives {p['name']} an address: {p}")
            ends.setdefault(tuple(sorted((name, p["name"]))), set()).add(name)
            keys.setdefault(p["name"], set()).add(p["public_key"])
    if len(ends) != 4 or any(set(link) != named for link, named in ends.items()):
        vt.fail(f"{when}: expected the 4 links of 2 x 2, each in both ends' node.json; got {ends}")
    return keys


def coordinator_specs(out):
    return {name: json.load(open(os.path.join(out, "nodes", name, "node.json")))
            for name in os.listdir(os.path.join(out, "nodes"))}


def step_of(line, marker):
    return int(line.split(marker)[1].split()[0].rstrip(";,"))


class Reference:
    """The flat reference (nat_test.reference_run's: the same job, 4 reachable volunteers on
    loopback, nobody lost), run on a thread of its own from start() on, while the NAT run only
    waits; kill() ends whatever of it still runs."""

    def __init__(self, args, model, job):
        self.args, self.model, self.job = args, model, job
        self.thread, self.runs, self.losses, self.error, self.killed = None, [], None, None, False

    def start(self):
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _run(self):
        try:
            sub = vt.in_folder(self.args, "flat")
            run = vt.Run(sub, self.model, self.job, nat_test.FLAGS, 4, label="flat")
            self.runs.append(run)
            if self.killed:  # kill() came while the coordinator started
                vt.kill_all(run.coordinator, run.volunteers)
                return
            with run:
                run.join(4)
                run.wait_planned(2)
                run.all_finish()
            self.losses = vt.leaf_losses(run.out, [w for _, w in run.volunteers])
        except BaseException as e:  # vt.fail exits (SystemExit): the main thread reports it
            self.error = e

    def result(self):
        if self.thread is None:
            vt.fail("the flat reference never started")
        self.thread.join()
        if self.error is not None or self.losses is None:
            vt.fail(f"the flat reference run failed ({self.error!r}); see its lines above")
        return self.losses

    def kill(self):
        self.killed = True
        for run in self.runs:
            vt.kill_all(run.coordinator, run.volunteers)


def replaced_run(args, world, model, job, reference):
    sub = vt.in_folder(args, "nat")
    out = os.path.join(sub.work, "coordinator")
    release = os.path.join(sub.work, "release")
    coordinator = vt.Process("coordinator", world.run_in(world.inet) + [
        args.clusterize, "--model", model, "--job", job, *vt.INPUT_SHAPE,
        "--serve", f"{nat_test.COORDINATOR}:7100", "--invite-file", os.path.join(sub.work, "invite.txt"),
        "--out", out] + FLAGS)
    processes = [coordinator]
    try:
        invite = coordinator.wait_for(lambda l: l.startswith("invite: "), 120, "'invite: …'").split()[1]
        workdirs, homes = [], []

        def join(k, env):
            workdirs.append(os.path.join(sub.work, f"volunteer_{k}"))
            homes.append(vt.Process(f"home {k}", world.run_in(world.home_of(k)) + [
                args.provider, "--join", invite, "--workdir", workdirs[-1], "--probe-megabytes", "1",
                "--upload-mbps", "200"], env=env))
            processes.append(homes[-1])

        # Both Roots hold before step HOLD_AT + 1 (the victim's is killed there; cluster 0's
        # until cluster 1 has resumed), so the run cannot end first however slow the machine.
        hold = dict(os.environ, CAIRN_TEST_HOLD=f"0:{HOLD_AT}:{release},1:{HOLD_AT}:{release}")
        for k in range(4):
            join(k, hold)
        coordinator.wait_for(lambda l: "planned 2 cluster(s) on 4 volunteers" in l, 120, "'planned'")
        spare_env = {k: v for k, v in os.environ.items() if k != "CAIRN_TEST_HOLD"}
        join(4, spare_env)
        spare, spare_dir = homes[4], workdirs[4]
        joined = coordinator.wait_for(lambda l: "coordinator: joined: node_4 " in l, 120, "the spare's join")
        if ", spare" not in joined or f"(dial-out only, from {nat_world.router_address(4)})" not in joined:
            vt.fail(f"the 5th volunteer did not join as a dial-out-only spare: {joined.strip()}")
        for k, home in enumerate(homes):
            line = home.wait_for(lambda l: SAYS in l, 120, f"'{SAYS}'")
            if f"come from {nat_world.router_address(k)}" not in line:
                vt.fail(f"home {k} was not told its router's address: {line.strip()}")
        check_links(coordinator_specs(out), "planned")
        plan = json.load(open(os.path.join(out, "plan.json")))
        (root0, leaf0), (victim_node, leaf1) = (c["chain"] for c in plan["clusters"])
        holder = {vt.name_of(w): (p, w) for p, w in zip(homes[:4], workdirs[:4])}
        victim = holder[victim_node][0]
        print(f"plan: cluster 0 {root0} -> {leaf0}, cluster 1 {victim_node} -> {leaf1}; "
              f"every link through the relay; the spare node_4 waits")

        vt.wait_until(lambda: all(holder[r][0].count(lambda l: f"test hold: before step {HOLD_AT} " in l)
                                  for r in (root0, victim_node)), 300, f"both Roots held before step {HOLD_AT}")
        ack = vt.wait_for_checkpoint(coordinator, HOLD_AT, 120, victim_node)
        victim.proc.kill()
        victim.finish(30)
        print(f"SIGKILLed {victim.tag} ({victim_node}) with both Roots held, after: {ack.strip()}")

        taken = coordinator.wait_for(lambda l: f"coordinator: {victim_node} is taken over by spare node_4" in l,
                                     120, "the takeover")
        print(taken.strip())
        if f"from its checkpoint of step {HOLD_AT};" not in taken:
            vt.fail(f"the spare was not given the checkpoint of step {HOLD_AT}")
        repointed = holder[root0][0].wait_for(lambda l: "ring peers re-pointed live" in l and victim_node in l,
                                              120, f"{root0} re-pointing {victim_node} live")
        print(repointed.strip())
        resuming = [spare, holder[leaf1][0]]
        for p in resuming:
            agreed = p.wait_for(lambda l: "resume: the cluster agreed on step " in l, 120, "cluster 1's resume")
            if step_of(agreed, "resume: the cluster agreed on step ") != HOLD_AT:
                vt.fail(f"{p.tag}: cluster 1 did not resume from step {HOLD_AT}: {agreed.strip()}")
            p.wait_for(lambda l: "cross-cluster sync: asked the ring peers to admit" in l, 120,
                       "cluster 1 asking to rejoin the rings")
        # Cluster 1 now waits for a welcome into the rings (3 x the ring timeout): cluster 0 trains
        # its last steps meanwhile, and the flat reference runs.
        open(release, "w").close()
        reference.start()

        code = coordinator.finish(600)
        if code != 0:
            vt.fail(f"the coordinator exited {code}")
        for p in homes:
            if p is not victim and p.finish(120) != 0:
                vt.fail(f"{p.tag} exited {p.proc.poll()}")

        # The node is the spare's, everywhere.
        if vt.name_of(spare_dir) != victim_node:
            vt.fail(f"the spare's membership.json names {vt.name_of(spare_dir)}, not {victim_node}")
        spare_key, victim_key = key_of(spare_dir), key_of(holder[victim_node][1])
        db = sqlite3.connect(os.path.join(out, "coordinator.db"))
        row = db.execute("SELECT public_key, state FROM members WHERE name = ?", (victim_node,)).fetchone()
        if row != (spare_key, "done"):
            vt.fail(f"coordinator.db: {victim_node} is {row}, expected the spare's key and state done")
        lost = db.execute("SELECT name, state, public_key FROM members WHERE name LIKE ?",
                          (victim_node + "-lost-%",)).fetchall()
        if lost != [(victim_node + "-lost-1", "lost", victim_key)]:
            vt.fail(f"coordinator.db: the lost volunteer's row is {lost}")
        if not holder[leaf1][0].count(lambda l: "peers updated in" in l):
            vt.fail(f"{leaf1} never applied the coordinator's peers update")
        for specs, which in ((coordinator_specs(out), "the coordinator's node.json"),
                             (own_specs(holder, spare_dir, victim_node), "the holders' own node.json")):
            keys = check_links(specs, f"after the replacement ({which})")
            if keys[victim_node] != {spare_key}:
                vt.fail(f"after the replacement ({which}): {victim_node}'s peers name keys {keys[victim_node]}, "
                        f"not the spare's {spare_key}")
        print(f"after the replacement: {victim_node} is the spare's in coordinator.db and in its neighbours' "
              f"node.json; every link still through the relay (both ends)")
        resumed = [r["resumed_from"] for r in vt.node_records(holder[leaf1][1], leaf1) if "resumed_from" in r]
        if resumed != [HOLD_AT]:
            vt.fail(f"{leaf1} resumed from {resumed}, expected once from step {HOLD_AT}")
        return vt.leaf_losses(out, workdirs)
    finally:
        for p in processes:
            p.kill()


def own_specs(holder, spare_dir, victim_node):
    """The node.json each living holder trained with (its own copy in its node_data)."""
    dirs = {name: w for name, (_, w) in holder.items() if name != victim_node}
    dirs[victim_node] = spare_dir
    return {name: json.load(open(os.path.join(w, "node_data", "nodes", name, "node.json")))
            for name, w in dirs.items()}


def main():
    args = nat_test.arguments()
    begun = time.monotonic()
    nat_test.REACHABLE = []
    nat_test.HOMES = HOMES
    world = nat_test.open_world(args)
    model, job = vt.prepare(args, STEPS, TEST_SAMPLES, TRAINING)
    reference = Reference(args, model, job)
    try:
        world.build()
        replaced = replaced_run(args, world, model, job, reference)
        flat = reference.result()
    finally:
        reference.kill()
        world.close()
    vt.check_same_losses(flat, replaced, STEPS, "the run whose NAT volunteer was replaced by a NAT spare")
    print(f"every Leaf loss of {len(flat)} clusters x {STEPS} steps, the victim's cluster resumed from step "
          f"{HOLD_AT} on the spare through the relay, equals the flat run's ({time.monotonic() - begun:.1f} s)")
    print("PASS")


if __name__ == "__main__":
    main()
