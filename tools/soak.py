#!/usr/bin/python3
"""Soak (issue [Q]): many volunteers, constant churn, faults together, and nothing lost.

    /usr/bin/python3 tools/soak.py --build build --work /tmp/soak              # 24 volunteers
    /usr/bin/python3 tools/soak.py --build build --work /tmp/soak --seed 7 --steps 300
    /usr/bin/python3 tools/soak.py --build build --work /tmp/soak --short      # the suite's case
    /usr/bin/python3 tools/soak.py --build build --work /tmp/soak --faults kill --no-grow

A real coordinator (`clusterize --serve --lost-after-s --grow`) and --volunteers real
`provider --join` processes train the example Fashion-MNIST CNN (3 stages a cluster, "average"
syncs, checkpoints every 10 steps, sample ids recorded). Where network namespaces can be made (root,
`ip netns`), every volunteer runs in its own namespace (address 10.X.1.i/16 on a veth to one
bridge; the coordinator listens on the bridge, 10.X.0.1) so its link can be cut; the namespaces
have no route anywhere else and are removed on exit. Elsewhere all run on 127.0.0.1 and the
partition faults are skipped (said in the report).

The fault schedule is drawn from --seed before the run and fires on training events (the
coordinator's metrics.jsonl: "cluster c reaches step s"), so a seed injects the same faults at the
same points on any machine:
  kill       every --kill-every steps, SIGKILL the volunteer that holds (cluster, stage) then
  freeze     SIGSTOP one for 2.5 x --lost-after-s (a closed laptop lid), then SIGCONT it
  partition  cut one volunteer's link (its veth down) for 2 x --lost-after-s, then restore it
  restart    SIGKILL the coordinator, start it again with the same command 5 s later
  late       start --late more volunteers (spares; with --grow a new cluster once enough wait)
--faults keeps only the kinds it lists (`none`: no faults), each where the full schedule of the
same seed has it (tools/bench/churn_bench.py compares a run with kills to one without).
With --overlap (the default but with --short) the first kill has a twin in another cluster at
the same step (two replacements at once); every other fault but `late` waits until the run has settled from the one before (every node held by a
live volunteer, nobody frozen or cut off; 90 s at most). With --flip, the last cluster's Root also
flips the top exponent bit of one weight at 45% of the steps (CAIRN_TEST_FLIP_BIT, given to every
volunteer; it fires once). Faults stop at 60% of the run's steps so that replaced clusters meet
their ring peers training. The schedule is budgeted against the spares there will be (each kill,
freeze and partition, and the flip, needs one; the late volunteers add some, less the cluster --grow makes of them while
--keep-spares wait): `late` comes no later than the first fault that would find none, and a fault
that still would is dropped (logged, and listed in the report's "dropped").

What the soak checks (exit 1 naming what failed; every check is on outcomes, none on timing):
  1. the coordinator finishes (exit 0); every cluster in run_result.json merged on its own
     (`clusterize --merge --cluster N`) evaluates in PyTorch to exactly its Leaf's accuracy;
  2. nothing lost or trained twice: each step a Root recorded more than once (a resumed step) has
     the same sample ids each time; within each epoch a cluster trains no sample twice, no sample
     is trained by two clusters, and a cluster that completed an epoch trained steps x batch ids;
  3. a frozen or cut-off volunteer that was replaced is refused as its old node when it is back
     (the coordinator says so) and comes back as a spare;
  4. with --flip: the flipping volunteer exits 2 naming the corruption — unless its cluster resumed
     from a checkpoint older than the flip before the ring checked it (the flip is then thrown
     away and the hook fires once: it trains on; seed 1 of --short does that once in a while:
     paused by the partition while alone in its ring, its peer being replaced) — and every
     trained weight is finite and below 1e3;
  5. every volunteer not killed exits 0 (or 2, the flipper) on its own, and every volunteer still
     running after the coordinator ends exits on its first SIGTERM;
Writes WORK/report.json (the schedule, what fired when, the checks, accuracies, wall time; on a
failure or a stall past --timeout-s what fired and the step each cluster reached) and
WORK/timeline.png (who trained which node's steps when, from the metrics; faults marked; needs
Debian's python3-matplotlib, else the PNG is skipped with the reason). The report's "figures"
(`figures` below: joins to plan, each kill to its spare's first step, throughput) are measured,
never checked.
"""
import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(REPO, "tests/integration"))
import volunteer_harness as vt  # noqa: E402  (processes, the example model and job, evaluation)

TEST_SAMPLES = 1000
COORDINATOR_PORT = 7100
VOLUNTEER_PORT = 7200


class Network:
    """One namespace per volunteer on a bridge (netns mode), or plain loopback."""

    def __init__(self, use_netns):
        self.tag = f"ck{os.getpid() % 10000000}"
        self.octet = 200 + os.getpid() % 50
        self.namespaces = []
        self.netns, self.reason = False, "--no-netns"
        if use_netns:
            self.netns, self.reason = self._probe()
        if self.netns:
            self._sh("ip", "link", "add", self.tag + "b", "type", "bridge")
            # A bridge takes the lowest MAC of its ports unless it has one of its own: a namespace
            # added later (a late volunteer) could change it, and every volunteer's ARP entry for
            # the coordinator would point at a port instead, so their new connections to it failed
            # until the entries expired (30-60 s: placed volunteers taken for lost).
            self._sh("ip", "link", "set", self.tag + "b", "address", f"02:ca:12:{self.octet:02x}:00:01")
            self._sh("ip", "addr", "add", f"10.{self.octet}.0.1/16", "dev", self.tag + "b")
            self._sh("ip", "link", "set", self.tag + "b", "up")
        self.coordinator_host = f"10.{self.octet}.0.1" if self.netns else "127.0.0.1"

    def _probe(self):
        if os.geteuid() != 0 or shutil.which("ip") is None:
            return False, "not root or no `ip`: every process on 127.0.0.1, no partition faults"
        probe = self.tag + "p"
        made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
        if made.returncode != 0:
            return False, f"`ip netns add` failed ({made.stderr.strip()}): on 127.0.0.1, no partition faults"
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
        return True, "a network namespace per volunteer"

    @staticmethod
    def _sh(*cmd):
        subprocess.run(cmd, check=True, capture_output=True)

    def add(self, i):
        """(address volunteer i listens on, command prefix that runs a program there)."""
        if not self.netns:
            return "127.0.0.1", [], vt.free_ports(1)[0]
        ns, veth = f"{self.tag}n{i}", f"{self.tag}v{i}"
        self._sh("ip", "netns", "add", ns)
        self.namespaces.append(ns)
        self._sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "e0", "netns", ns)
        self._sh("ip", "link", "set", veth, "master", self.tag + "b", "up")
        address = f"10.{self.octet}.{1 + i // 250}.{1 + i % 250}"
        self._sh("ip", "netns", "exec", ns, "ip", "addr", "add", address + "/16", "dev", "e0")
        self._sh("ip", "netns", "exec", ns, "ip", "link", "set", "e0", "up")
        self._sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        return address, ["ip", "netns", "exec", ns], VOLUNTEER_PORT

    def cut(self, i, down):
        self._sh("ip", "link", "set", f"{self.tag}v{i}", "down" if down else "up")

    def close(self):
        for ns in self.namespaces:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        if self.netns:
            subprocess.run(["ip", "link", "del", self.tag + "b"], capture_output=True)
        self.namespaces = []


class Metrics:
    """Follows the coordinator's metrics.jsonl: the newest step per cluster, and every step record
    with the time it was read (for the timeline)."""

    def __init__(self, path):
        self.path, self.offset, self.partial = path, 0, ""
        self.top = {}       # cluster -> highest step seen
        self.records = []   # (seconds since start, record)
        self.t0 = time.monotonic()

    def poll(self):
        if not os.path.exists(self.path):
            return
        if os.path.getsize(self.path) < self.offset:
            self.offset, self.partial = 0, ""
        with open(self.path) as f:
            f.seek(self.offset)
            data = f.read()
            self.offset = f.tell()
        lines = (self.partial + data).split("\n")
        self.partial = lines.pop()
        now = time.monotonic() - self.t0
        for line in lines:
            record = json.loads(line)
            if "step" in record and "cluster" in record:
                c = record["cluster"]
                self.top[c] = max(self.top.get(c, 0), record["step"])
                self.records.append((now, record))


def schedule(args, clusters):
    """The seeded fault schedule: [{kind, cluster, stage, at_step, overlap}] in firing order. With
    --overlap the first kill has a twin in another cluster at the same step (two replacements at
    once); every other fault but `late` waits for the run to settle first (overlap False:
    Soak.settled)."""
    rng = random.Random(args.seed)
    last = int(args.steps * 0.6)
    events = []
    for step in range(args.kill_every, last + 1, args.kill_every):
        events.append({"kind": "kill", "cluster": rng.randrange(clusters), "stage": rng.randrange(3),
                       "at_step": step, "overlap": False})
    if events and clusters > 1 and args.overlap:
        events[0]["overlap"] = True
        events.insert(1, dict(events[0], cluster=(events[0]["cluster"] + 1) % clusters))
    for kind in ["freeze", "partition", "restart", "late"]:
        events.append({"kind": kind, "cluster": rng.randrange(clusters), "stage": rng.randrange(3),
                       "at_step": rng.randrange(args.kill_every // 2 + 5, last + 1), "overlap": kind == "late"})
    events.sort(key=lambda e: (e["at_step"], not e["overlap"], e["kind"]))
    # --faults keeps some kinds: drawn as above, then filtered, so each kept fault is where the
    # full schedule of the same seed has it.
    events = [e for e in events if e["kind"] in args.faults]
    return early_enough_late(args, clusters, events)


def early_enough_late(args, clusters, events):
    """Budgets the schedule's replacements against the spares there will be. Each kill, freeze and
    partition (and the flip) gives a node to a spare (a frozen or cut-off volunteer comes back as
    one only later, or holds its node again when no spare took it: counted as used either way).
    First `late` moves forward to the step of the first fault that would find no spare left; then,
    as the late volunteers come (with --grow, the coordinator makes a cluster of three of them
    while --keep-spares more wait), a fault that would still find none is dropped from the
    schedule and said in the report (`args.dropped`). Without it a seed could schedule more
    replacements than spares (seed 2 of --short: three kills and the flip, three spares; seed 1
    of the 24-volunteer run: the late volunteers became a cluster and the last kill found no
    spare), and the soak measured its own schedule, not cairn (a cluster waits max_wait_s for a
    spare, then its volunteers leave)."""
    grow = getattr(args, "grow", False)
    spares = args.volunteers - 3 * clusters
    while grow and spares - 3 >= args.keep_spares:
        spares -= 3  # a cluster grown from spares at the start (coordinator/Growth.h)
    flip = [{"kind": "flip", "at_step": int(args.steps * 0.45)}] if args.flip else []
    late = next((e for e in events if e["kind"] == "late"), None)
    order = lambda e: (e["at_step"], not e.get("overlap", False), e["kind"])  # noqa: E731
    used = 0
    for e in sorted(events + flip, key=order) if late else []:
        if e is late:
            break
        if e["kind"] in ("kill", "flip", "freeze", "partition"):
            used += 1
        if used > spares:
            late["at_step"], late["cluster"] = e["at_step"], e.get("cluster", late["cluster"])
            break
    events.sort(key=order)
    kept, used, args.dropped = [], 0, []
    for e in sorted(events + flip, key=order):
        if e is late:
            spares += args.late
            while grow and spares - used - 3 >= args.keep_spares:
                spares -= 3  # the late volunteers grow the run by a cluster
        elif e["kind"] in ("kill", "flip", "freeze", "partition"):
            if used + 1 > spares and e["kind"] != "flip":  # the flip is set at the start: kept
                args.dropped.append(dict(e, why=f"no spare left for it ({spares} in all)"))
                continue
            used += 1
        if e["kind"] != "flip":
            kept.append(e)
    return kept


class Soak:
    def __init__(self, args):
        self.args = args
        self.net = Network(not args.no_netns)
        self.volunteers = []   # dicts: i, process, workdir, address
        self.fired = []        # what happened, when
        self.killed, self.faulted = set(), {}   # faulted: volunteer index -> the node it held
        self.out_now = set()   # volunteers frozen or cut off right now
        self.out = os.path.join(args.work, "coordinator")
        self.timers = []

    def log(self, text):
        stamp = time.monotonic() - self.metrics.t0
        print(f"[soak {stamp:7.1f}s] {text}", flush=True)

    # --- processes -------------------------------------------------------------------------
    def coordinator_cmd(self):
        a = self.args
        return [a.clusterize, "--model", self.model, "--job", self.job, *vt.INPUT_SHAPE,
                "--serve", f"{self.net.coordinator_host}:{COORDINATOR_PORT if self.net.netns else self.port}",
                "--invite-file", os.path.join(a.work, "invite.txt"), "--out", self.out,
                "--min-volunteers", str(3 * a.clusters), "--clusters", str(a.clusters), "--cuts", "7,14",
                "--lost-after-s", str(a.lost_after_s)] + (
                    ["--grow", "--max-clusters", str(a.clusters + 2), "--keep-spares", str(a.keep_spares)]
                    if a.grow else [])

    def start_coordinator(self):
        self.coordinator = vt.Process("coordinator", self.coordinator_cmd(),
                                      log=os.path.join(self.args.work, "coordinator.log"))
        line = self.coordinator.wait_for(lambda l: l.startswith("invite: "), 120, "'invite: …'")
        return line.split()[1]

    def start_volunteer(self):
        i = len(self.volunteers)
        address, prefix, port = self.net.add(i)
        workdir = os.path.join(self.args.work, f"volunteer_{i}")
        env = dict(os.environ)
        if self.args.flip:
            env["CAIRN_TEST_FLIP_BIT"] = self.flip_spec
        cmd = prefix + [self.args.provider, "--join", self.invite, "--listen", f"{address}:{port}",
                        "--workdir", workdir, "--probe-megabytes", "1", "--max-mbps", str(self.args.mbps),
                        "--upload-mbps", str(self.args.mbps / 2)]
        process = vt.Process(f"volunteer {i}", cmd, log=os.path.join(self.args.work, f"volunteer_{i}.log"), env=env)
        self.volunteers.append({"i": i, "process": process, "workdir": workdir, "address": address})

    def chains(self):
        return [c["chain"] for c in json.load(open(os.path.join(self.out, "plan.json")))["clusters"]]

    def holders(self):
        """{node: the live volunteer that holds it now}, from each one's membership.json."""
        held = {}
        for v in self.volunteers:
            if v["i"] in self.killed or v["i"] in self.out_now or v["process"].proc.poll() is not None:
                continue
            try:
                node = json.load(open(os.path.join(v["workdir"], "membership.json")))["name"]
            except (OSError, ValueError, KeyError):
                continue
            if self.faulted.get(v["i"]) != node:  # else frozen or cut off while holding it: replaced
                held.setdefault(node, v)
        return held

    def target(self, event):
        """The volunteer holding (cluster, stage), else the next stage's, else None (all busy)."""
        chains = self.chains()
        chain, held = chains[event["cluster"] % len(chains)], self.holders()
        for k in range(3):
            node = chain[(event["stage"] + k) % 3]
            if node in held:
                return held[node], node
        return None, None

    # --- faults ----------------------------------------------------------------------------
    def fire(self, event):
        kind = event["kind"]
        if kind == "late":
            for _ in range(self.args.late):
                self.start_volunteer()
            return f"started {self.args.late} late volunteers"
        if kind == "restart":
            self.coordinator.proc.kill()
            self.coordinator.finish(30)
            time.sleep(5)  # down a while; training goes on without it
            if self.start_coordinator() != self.invite:
                vt.fail("the restarted coordinator has another invite")
            return "coordinator SIGKILLed, started again 5 s later"
        v, node = self.target(event)
        if v is None:
            return None  # every holder of that cluster is down right now: try again later
        event["node"] = node
        p = v["process"].proc
        if kind == "kill":
            p.kill()
            self.killed.add(v["i"])
        elif kind == "freeze":
            p.send_signal(signal.SIGSTOP)
            self.faulted[v["i"]] = node
            self.out_now.add(v["i"])
            self.later(2.5 * self.args.lost_after_s, lambda: p.send_signal(signal.SIGCONT), v, "woken")
        elif kind == "partition":
            if not self.net.netns:
                return f"skipped ({self.net.reason})"
            self.net.cut(v["i"], True)
            self.faulted[v["i"]] = node
            self.out_now.add(v["i"])
            self.later(2 * self.args.lost_after_s, lambda: self.net.cut(v["i"], False), v, "link restored")
        return f"volunteer {v['i']} holding {node}"

    def later(self, seconds, action, v, said):
        def run():
            action()
            self.out_now.discard(v["i"])
            self.log(f"volunteer {v['i']}: {said}")
        timer = threading.Timer(seconds, run)
        timer.start()
        self.timers.append(timer)

    def settled(self):
        """No fault in progress: every node of the plan has a live holder (a lost one was taken over)
        and no volunteer is frozen or cut off right now."""
        if self.out_now:
            return False
        held = self.holders()
        return all(node in held for chain in self.chains() for node in chain)

    def drive(self, events):
        pending = list(events)
        deadline = time.monotonic() + self.args.timeout_s
        due_since = {}  # event -> when its step was reached (a fault waits 90 s at most to settle)
        while self.coordinator.proc.poll() is None or pending:
            if time.monotonic() > deadline:
                vt.fail(f"the run did not finish within {self.args.timeout_s} s; pending faults: {pending}")
            self.metrics.poll()
            for event in list(pending):
                if self.metrics.top.get(event["cluster"] % self.args.clusters, 0) < event["at_step"]:
                    continue
                since = due_since.setdefault(id(event), time.monotonic())
                if not event["overlap"] and time.monotonic() - since < 90 and not self.settled():
                    continue
                said = self.fire(event)
                if said is None:
                    continue
                pending.remove(event)
                record = dict(event, t=round(time.monotonic() - self.metrics.t0, 1), what=said)
                self.fired.append(record)
                self.log(f"{event['kind']} at cluster {event['cluster']} step {event['at_step']}: {said}")
            if self.coordinator.proc.poll() is not None and pending:
                vt.fail(f"the coordinator ended (exit {self.coordinator.proc.poll()}) with faults pending: {pending}")
            time.sleep(0.3)
        self.metrics.poll()

    # --- the run ---------------------------------------------------------------------------
    def run(self):
        a = self.args
        os.makedirs(a.work, exist_ok=True)
        self.model, self.job = vt.prepare(a, a.steps, TEST_SAMPLES, {
            "checkpoint_every": 10, "record_sample_ids": True, "threads": 1,
            "timeouts": {"startup_s": 60, "peer_s": 30, "peer_timeout_s": 2, "max_wait_s": 300}})
        job = json.load(open(self.job))
        job["data"].update({"train_samples": a.train_samples, "chunks": 24})
        json.dump(job, open(self.job, "w"))
        self.flip_spec = f"{a.clusters - 1}:0:{int(a.steps * 0.45)}:conv1.weight:0:30:{os.path.join(a.work, 'flipped')}"
        self.port = vt.free_ports(1)[0]
        self.metrics = Metrics(os.path.join(self.out, "metrics.jsonl"))
        events = schedule(a, a.clusters)
        self.log(f"network: {self.net.reason}; schedule (seed {a.seed}): " +
                 ", ".join(f"{e['kind']}@c{e['cluster']}s{e['at_step']}" for e in events))
        for e in a.dropped:
            self.log(f"dropped from the schedule: {e['kind']}@c{e['cluster']}s{e['at_step']}: {e['why']}")
        start = time.monotonic()
        self.invite = self.start_coordinator()
        joins = time.monotonic()
        for _ in range(3 * a.clusters):
            self.start_volunteer()
        self.coordinator.wait_for(lambda l: f"planned {a.clusters} cluster(s)" in l, 300, "the plan")
        self.join_to_plan_s = time.monotonic() - joins
        for _ in range(a.volunteers - 3 * a.clusters):
            self.start_volunteer()
        self.drive(events)
        code = self.coordinator.finish(60)
        wall = time.monotonic() - start
        for t in self.timers:
            t.join()
        exits = self.finish_volunteers()
        return events, code, wall, exits

    def finish_volunteers(self):
        """Exit codes: volunteers end on their own once the coordinator is done; any still running
        after 120 s gets one SIGTERM and must exit on it."""
        exits = {}
        deadline = time.monotonic() + 120
        for v in self.volunteers:
            p = v["process"].proc
            try:
                exits[v["i"]] = p.wait(max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.send_signal(signal.SIGTERM)
                try:
                    exits[v["i"]] = ("sigterm", p.wait(60))
                except subprocess.TimeoutExpired:
                    p.kill()
                    exits[v["i"]] = ("ignored sigterm", p.wait())
        return exits

    def close(self):
        for t in self.timers:
            t.cancel()
        for v in self.volunteers:
            if v["process"].proc.poll() is None:
                v["process"].proc.send_signal(signal.SIGCONT)
                v["process"].kill()
        if hasattr(self, "coordinator"):
            self.coordinator.kill()
        self.net.close()


# --- the checks --------------------------------------------------------------------------------
def grown_at_end(soak, root):
    """The first step of a cluster grown so late that it starts at the run's last step (its Root
    says "it starts at step N" with N >= --steps: the grower takes the deal's epoch, and the seed's
    late volunteers can form a cluster then), or None. Such a cluster trains no step, so its Root
    records no sample ids."""
    for v in soak.volunteers:
        for line in v["process"].lines:
            m = re.search(r"\[" + re.escape(root) + r"\] data: this cluster is added by the deal from "
                          r"epoch \d+: it starts at step (\d+)", line)
            if m and int(m.group(1)) >= soak.args.steps:
                return int(m.group(1))
    return None


def check_samples(soak, checks):
    """Check 2 from the Roots' sample_ids.jsonl (every volunteer that held a Root) and the step
    records' epochs; returns a summary line."""
    plan = json.load(open(os.path.join(soak.out, "plan.json")))
    epoch_of = {}
    for _, r in soak.metrics.records:
        epoch_of.setdefault(r["cluster"], {})[r["step"]] = r["epoch"]
    by_epoch = {}  # epoch -> sample id -> cluster
    lines = []
    for index, cluster in enumerate(plan["clusters"]):
        c = cluster.get("cluster", index)
        root = cluster["chain"][0]
        steps = {}
        for v in soak.volunteers:
            path = os.path.join(v["workdir"], "node_data", "nodes", root, "sample_ids.jsonl")
            if not os.path.exists(path):
                continue
            for line in open(path):
                if not line.endswith("\n"):
                    continue  # a line the volunteer was writing when it was killed
                r = json.loads(line)
                if r["step"] in steps and steps[r["step"]] != r["ids"]:
                    checks.append(f"FAIL cluster {c}: step {r['step']} was trained twice on different samples")
                steps[r["step"]] = r["ids"]
        if not steps:
            start = grown_at_end(soak, root)
            if start is not None:  # nothing was left to train: no ids, nothing lost
                lines.append(f"cluster {c}: grown to start at step {start}, the run's end: no step trained")
                continue
            checks.append(f"FAIL cluster {c}: no sample ids recorded for its Root {root}")
            continue
        first, last = min(steps), max(steps)
        gaps = [s for s in range(first, last + 1) if s not in steps]
        if gaps:
            checks.append(f"FAIL cluster {c}: steps {gaps[:5]} of {first}..{last} have no sample ids (lost)")
        per_epoch = {}
        for s, ids in steps.items():
            e = epoch_of.get(c, {}).get(s + 1)  # sample_ids.jsonl counts steps from 0, the records from 1
            if e is None:
                continue  # a step whose record the coordinator never got (killed before it went up)
            per_epoch.setdefault(e, []).extend(ids)
        for e, ids in per_epoch.items():
            if len(set(ids)) != len(ids):
                checks.append(f"FAIL cluster {c}: epoch {e} trained {len(ids) - len(set(ids))} samples twice")
            for i in ids:
                other = by_epoch.setdefault(e, {}).setdefault(i, c)
                if other != c:
                    checks.append(f"FAIL epoch {e}: sample {i} trained by clusters {other} and {c}")
                    break
        lines.append(f"cluster {c}: steps {first}..{last}, {sum(len(x) for x in per_epoch.values())} samples "
                     f"in {len(per_epoch)} epochs")
    return "; ".join(lines)


def check_replaced_refused(soak, checks):
    """Check 3: each frozen or cut-off volunteer whose node went to a spare was refused as it."""
    log = open(os.path.join(soak.args.work, "coordinator.log")).read()
    said = []
    for i, node in soak.faulted.items():
        if f"coordinator: {node} is taken over by spare" not in log:
            said.append(f"volunteer {i} ({node}) came back before it was replaced")
            continue
        if not re.search(rf"claiming to be {node} from {node}-lost-\d+", log):
            checks.append(f"FAIL volunteer {i}: replaced as {node}, not refused as it when back")
        lines = soak.volunteers[i]["process"].lines
        told = next((k for k, l in enumerate(lines) if "given to another volunteer" in l), None)
        if told is None:
            checks.append(f"FAIL volunteer {i}: never told that {node} was given to another volunteer")
            continue
        again = next((l for l in lines[told:] if "joined as node_" in l), None)
        if again is None and i not in soak.killed:
            checks.append(f"FAIL volunteer {i}: told {node} was taken, it did not join again as a spare")
        name = again.split("joined as ")[1].split()[0] if again else "(killed before it joined again)"
        said.append(f"volunteer {i} replaced as {node}, refused as it when back, joined again as {name}")
    return "; ".join(said) or "no freeze or partition fired"


def flip_undone(lines):
    """True when the flipping volunteer resumed, after its flip, from a checkpoint of an earlier
    step than the flip's: the flipped value was thrown away before the ring checked it (the seed's
    faults can pause its cluster right after the flip while its ring peers are being replaced, so
    it syncs with nobody first), and the hook flips once. check_weights still holds the trained
    weights to their bound, so a flip that spread before the resume fails the soak there."""
    flip_step = None
    for line in lines:
        if flip_step is None:
            m = re.search(r"CAIRN_TEST_FLIP_BIT: flipped bit \d+ of \S+ after step (\d+)", line)
            flip_step = int(m.group(1)) if m else None
            continue
        m = re.search(r"resuming from \S+ \(step (\d+)\)", line)
        if m and int(m.group(1)) < flip_step:
            return True
    return False


def check_exits(soak, exits, checks):
    """Exit codes: -9 the killed, 0 the others, 2 the flipper (it names the corruption) unless its
    flip was undone by a resume first (flip_undone: then 0). Returns the flipper's index."""
    flipper = next((v["i"] for v in soak.volunteers if any("CAIRN_TEST_FLIP_BIT: flipped" in l
                                                           for l in v["process"].lines)), None)
    undone = flipper is not None and flip_undone(soak.volunteers[flipper]["process"].lines)
    if undone:
        print(f"volunteer {flipper}'s flip was undone: it resumed from a checkpoint before it")
    for i, code in exits.items():
        if isinstance(code, tuple):
            if code[0] != "sigterm" or code[1] != 0:
                checks.append(f"FAIL volunteer {i}: {code[0]}, exit {code[1]}")
            continue
        expected = -9 if i in soak.killed else 2 if i == flipper and not undone else 0
        if code != expected:
            checks.append(f"FAIL volunteer {i}: exit {code}, expected {expected}")
    if soak.args.flip:
        if flipper is None:
            checks.append("FAIL --flip: no volunteer flipped the bit")
        elif not undone and not any("corrupt" in l for l in soak.volunteers[flipper]["process"].lines):
            checks.append(f"FAIL volunteer {flipper} flipped a bit but did not name the corruption")
    return flipper


def check_weights(soak, checks):
    import torch
    worst = 0.0
    for node, name, p in vt.trained_parameters(soak.out, missing_ok=True):
        if not torch.isfinite(p).all():
            checks.append(f"FAIL {node}'s trained {name} holds a non-finite value")
        worst = max(worst, p.abs().max().item())
    if worst >= 1e3:
        checks.append(f"FAIL a trained weight of magnitude {worst}")
    return worst


def figures(soak):
    """What the run measured (tools/bench/churn_bench.py reads them; no check depends on them):
    seconds from starting the planned volunteers (all at once) to the coordinator's plan; for each
    kill, seconds from the SIGKILL to the first step record of the killed node from another
    process (its spare's first step; null if none came); and the training throughput: distinct
    (cluster, step) pairs x batch size over the seconds from the first step record to the last
    (the whole run: its end waits for the slowest cluster), and the same up to the moment the first
    cluster finished (while every cluster trains).
    Times are when the soak read the records from metrics.jsonl (polled every 0.3 s; volunteers
    send their records about once a second), so each is late by about a second."""
    steps = [(t, r) for t, r in soak.metrics.records if "samples" in r]
    done = {(r["cluster"], r["step"]): r["samples"] for _, r in steps}
    to_first = []
    for f in (f for f in soak.fired if f["kind"] == "kill" and f.get("node")):
        before = [r["stream"] for t, r in steps if r["node"] == f["node"] and t <= f["t"]]
        after = [t for t, r in steps if r["node"] == f["node"] and t > f["t"]
                 and (not before or r["stream"] != before[-1])]
        to_first.append(round(after[0] - f["t"], 1) if after else None)
    span = steps[-1][0] - steps[0][0] if len(steps) > 1 else 0
    # While every cluster trains: up to the first time a cluster's last step was read (after it,
    # finished clusters idle while the slowest ones catch up, which the whole-run figure counts).
    last = {}
    for t, r in steps:
        last[r["cluster"]] = max(last.get(r["cluster"], (0, 0)), (r["step"], -t))
    first_done = min((-t for _, t in last.values()), default=0)
    early = {(r["cluster"], r["step"]): r["samples"] for t, r in steps if t <= first_done}
    all_span = first_done - steps[0][0] if steps else 0
    return {"join_to_plan_s": round(getattr(soak, "join_to_plan_s", 0), 1),
            "kill_to_first_step_s": to_first,
            "cluster_steps": len(done), "samples": sum(done.values()),
            "training_s": round(span, 1), "samples_per_s": round(sum(done.values()) / span, 1) if span else 0,
            "all_training_s": round(all_span, 1),
            "samples_per_s_all_training": round(sum(early.values()) / all_span, 1) if all_span > 0 else 0}


def timeline(soak, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "skipped: no python3-matplotlib"
    rows = [n for chain in soak.chains() for n in chain]
    streams = sorted({r.get("stream", "") for _, r in soak.metrics.records})
    colours = plt.get_cmap("tab20")
    fig, ax = plt.subplots(figsize=(12, 0.3 * len(rows) + 2))
    for k, stream in enumerate(streams):
        points = [(t, rows.index(r["node"])) for t, r in soak.metrics.records
                  if r.get("stream", "") == stream and r["node"] in rows]
        if points:
            ax.scatter([p[0] for p in points], [p[1] for p in points], s=2, color=colours(k % 20))
    for f in soak.fired:
        ax.axvline(f["t"], color="red" if f["kind"] == "kill" else "grey", lw=0.8, ls="--")
        ax.text(f["t"], len(rows) - 0.5, f["kind"], rotation=90, fontsize=7, va="top")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(rows, fontsize=7)
    ax.set_xlabel("seconds (step records as the coordinator got them; a colour per volunteer process)")
    ax.set_title(f"soak: {len(soak.volunteers)} volunteers, seed {soak.args.seed}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=os.path.join(REPO, "build"))
    p.add_argument("--provider")
    p.add_argument("--clusterize")
    p.add_argument("--work", required=True)
    p.add_argument("--volunteers", type=int, default=24)
    p.add_argument("--clusters", type=int, default=6, help="clusters of 3 planned at the start")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--kill-every", type=int, default=20)
    p.add_argument("--late", type=int, default=6, help="volunteers started by the 'late' fault")
    p.add_argument("--keep-spares", type=int, default=4,
                   help="with --grow: spares the coordinator keeps (4: the default schedule's faults all find one)")
    p.add_argument("--lost-after-s", type=float, default=8)
    p.add_argument("--train-samples", type=int, default=12000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--mbps", type=float, default=40,
                   help="each volunteer's --max-mbps (half of it for checkpoint uploads): a home link, "
                        "and steps slow enough that a replacement takes few of them")
    p.add_argument("--flip", action="store_true", help="add a flipped exponent bit")
    p.add_argument("--faults", default="kill,freeze,partition,restart,late",
                   help="the kinds of fault to schedule (comma list of kill, freeze, partition, restart, late; "
                        "'none': no faults); each kept where the full schedule of the seed has it")
    p.add_argument("--no-netns", action="store_true", help="all on 127.0.0.1 (no partition faults)")
    p.add_argument("--no-overlap", dest="overlap", action="store_false",
                   help="no twin kill: every fault but `late` waits for the run to settle")
    p.add_argument("--no-grow", dest="grow", action="store_false",
                   help="no --grow: late volunteers stay spares")
    p.add_argument("--timeout-s", type=float, default=3600)
    p.add_argument("--short", action="store_true",
                   help="the suite's case: 9 volunteers (2 clusters and 3 spares), 120 steps, kills "
                        "every 30, 3 late volunteers, a flip, the twin kill; no growth")
    args = p.parse_args()
    kinds = {"kill", "freeze", "partition", "restart", "late"}
    args.faults = set() if args.faults == "none" else set(args.faults.split(","))
    if not args.faults <= kinds:
        p.error(f"--faults: {', '.join(sorted(args.faults - kinds))} is not a fault kind ({', '.join(sorted(kinds))}, or none)")
    if args.short:
        args.volunteers, args.clusters, args.steps, args.kill_every, args.late = 9, 2, 120, 30, 3
        args.grow, args.overlap, args.train_samples, args.flip, args.timeout_s = False, True, 6000, True, 1500
    args.provider = args.provider or os.path.join(args.build, "node/provider")
    args.clusterize = args.clusterize or os.path.join(args.build, "clusterize/clusterize")
    if os.path.exists(args.work):
        shutil.rmtree(args.work)
    soak = Soak(args)
    stop = lambda *_: sys.exit(1)  # noqa: E731  (close() runs on the way out)
    signal.signal(signal.SIGTERM, stop)
    try:
        events, code, wall, exits = soak.run()
        checks = []
        if code != 0:
            checks.append(f"FAIL the coordinator exited {code}")
        flipper = check_exits(soak, exits, checks)
        samples = check_samples(soak, checks)
        refused = check_replaced_refused(soak, checks)
        worst = check_weights(soak, checks)
        summary = vt.check_cluster_weights(
            args, soak.out, lambda path: vt.evaluate(path, TEST_SAMPLES),
            "cluster {cluster} ({leaf}): Leaf reports {reported:.4f}, its weights in PyTorch {accuracy:.4f}",
            "cluster {cluster}'s weights evaluate to {accuracy} in PyTorch, its Leaf reported {reported}")
        report = {"seed": args.seed, "network": soak.net.reason, "volunteers": len(soak.volunteers),
                  "schedule": events, "dropped": args.dropped, "fired": soak.fired, "wall_s": round(wall, 1),
                  "exits": {str(i): c for i, c in exits.items()}, "flipper": flipper,
                  "samples": samples, "replaced_and_back": refused, "largest_weight": worst,
                  "accuracy": {str(c["cluster"]): c["eval"]["accuracy"] for c in summary["clusters"]},
                  "timeline": timeline(soak, os.path.join(args.work, "timeline.png")),
                  "figures": figures(soak), "checks": checks}
        json.dump(report, open(os.path.join(args.work, "report.json"), "w"), indent=1)
        print(f"samples: {samples}\nreplaced and back: {refused}\nlargest trained weight {worst:.4g}; "
              f"wall {wall:.0f} s; report {os.path.join(args.work, 'report.json')}")
        if checks:
            vt.fail("; ".join(checks))
        print(f"soak passed: {len(soak.fired)} faults over {len(soak.volunteers)} volunteers")
    except SystemExit as e:
        if e.code:
            partial_report(soak, args)
            tails(args.work)
        raise
    finally:
        soak.close()


def partial_report(soak, args):
    """On a failure (a stall past --timeout-s included): report.json with what fired and how far
    each cluster got, and the timeline so far, so a stalled run can be read like a finished one."""
    path = os.path.join(args.work, "report.json")
    if os.path.exists(path):
        return  # the checks ran and wrote the full report
    metrics = getattr(soak, "metrics", None)  # made when the run started
    report = {"seed": args.seed, "network": soak.net.reason, "volunteers": len(soak.volunteers),
              "fired": soak.fired, "failed": True,
              "steps_reached": {str(c): s for c, s in sorted(metrics.top.items())} if metrics else {}}
    try:
        report["timeline"] = timeline(soak, os.path.join(args.work, "timeline.png"))
    except Exception as e:  # noqa: BLE001  (the report must be written whatever the plot does)
        report["timeline"] = f"not drawn: {e}"
    with open(path, "w") as f:
        json.dump(report, f, indent=1)
    print(f"partial report {path}", file=sys.stderr)


def tails(work):
    """On a failure: the last lines of every log of the run (all of them are in WORK)."""
    for name in sorted(os.listdir(work)):
        if name.endswith(".log"):
            lines = open(os.path.join(work, name), errors="replace").read().splitlines()
            keep = 30 if name == "coordinator.log" else 8
            print(f"--- {name}, last {min(keep, len(lines))} of {len(lines)} lines", file=sys.stderr)
            for line in lines[-keep:]:
                print("    " + line[:300], file=sys.stderr)


if __name__ == "__main__":
    main()
