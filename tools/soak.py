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

What the soak checks, and the report it writes: tools/soak_report.py.
"""
import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(REPO, "tests/integration"))
import volunteer_harness as vt  # noqa: E402  (processes, the example model and job, evaluation)
import soak_report as report  # noqa: E402  (the checks and report.json)

TEST_SAMPLES = report.TEST_SAMPLES  # prepared here, evaluated there
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
    spare; then again, the late volunteers and the frozen one back as a spare), and the soak
    measured its own schedule, not cairn (a cluster waits max_wait_s for a spare, then its
    volunteers leave). Those back count towards growth only, never as capacity."""
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
    kept, used, back, came, args.dropped = [], 0, 0, False, []
    for e in sorted(events + flip, key=order):
        if e is late:
            spares, came = spares + args.late, True
        elif e["kind"] in ("kill", "flip", "freeze", "partition"):
            if used + 1 > spares and e["kind"] != "flip":  # the flip is set at the start: kept
                args.dropped.append(dict(e, why=f"no spare left for it ({spares} in all)"))
                continue
            used += 1
            back += e["kind"] in ("freeze", "partition")  # back later, as a spare if replaced
        while grow and came and spares + back - used - 3 >= args.keep_spares:
            spares -= 3  # the late volunteers (and those back) grow the run by a cluster
        if e["kind"] != "flip":
            kept.append(e)
    return kept


class Soak:
    def __init__(self, args):
        self.args = args
        self.net = Network(not args.no_netns)
        self.volunteers = []   # dicts: i, process, workdir, address
        self.fired = []        # what happened, when
        self.unfired = []      # faults due when the run ended, still waiting (drive)
        self.killed, self.faulted, self.rejoined = set(), {}, set()   # faulted: index -> node it held
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
            if self.faulted.get(v["i"], node) != node:
                self.rejoined.add(v["i"])  # back as a spare since: a node it takes later is its own
            if self.faulted.get(v["i"]) != node or v["i"] in self.rejoined:  # else replaced while out
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
        elif kind in ("freeze", "partition"):
            if kind == "partition" and not self.net.netns:
                return f"skipped ({self.net.reason})"
            self.faulted[v["i"]] = node
            self.out_now.add(v["i"])
            if kind == "freeze":
                p.send_signal(signal.SIGSTOP)
                self.later(2.5 * self.args.lost_after_s, lambda: p.send_signal(signal.SIGCONT), v, "woken")
            else:
                self.net.cut(v["i"], True)
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
                self.unfired, pending = report.unfired_at_end(self, pending, due_since), []
            time.sleep(0.3)
        self.metrics.poll()

    # --- the run ---------------------------------------------------------------------------
    def run(self):
        a = self.args
        os.makedirs(a.work, exist_ok=True)
        self.model, self.job = vt.prepare(a, a.steps, TEST_SAMPLES, {
            "checkpoint_every": 10, "record_sample_ids": True, "threads": 1,
            "timeouts": {"startup_s": 60, "peer_s": 30, "peer_timeout_s": a.peer_timeout_s, "max_wait_s": 300}})
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
    p.add_argument("--peer-timeout-s", type=float, default=2, help="the job's timeouts.peer_timeout_s (job default 10)")
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
    p.add_argument("--no-grow", dest="grow", action="store_false", help="no --grow: late volunteers stay spares")
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
        report.check_and_report(soak, args, events, code, wall, exits)
    except SystemExit as e:
        if e.code:
            report.partial_report(soak, args)
            report.tails(args.work)
        raise
    finally:
        soak.close()


if __name__ == "__main__":
    main()
