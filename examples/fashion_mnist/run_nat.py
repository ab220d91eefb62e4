#!/usr/bin/python3
"""Volunteers behind home routers train the Fashion-MNIST CNN, on this one machine
(docs/OPERATIONS.md "Behind a home router"; `tools/demo.sh --nat`):

    sudo examples/fashion_mnist/run_nat.py [--short]

A closed world of network namespaces (tests/integration/nat_world.py, as the suite's
integration.volunteers.nat_relay_volunteer builds it; this machine's own interfaces are not
touched): an "internet" namespace with the coordinator (10.77.0.1) and a reachable volunteer that
only relays (10.77.0.2: `provider --join INVITE --relay --listen 10.77.0.2:7300`), and 4 homes,
each volunteer in its own namespace behind its own router (iptables MASQUERADE: out only, nothing
comes in that the home did not ask for). The relay joins first; then each home volunteer joins
with the invite and no address (`provider --join INVITE`, no --listen): all four are dial-out only,
every link joins two of them, so the coordinator plans every link through the volunteer's relay
(its own, `clusterize --serve ... --relay 10.77.0.1:7101`, is the fallback were that relay lost),
every message sealed end to end between the two volunteers.

The demo's job (examples/fashion_mnist/job.json, its model made by make_model.py) in 2 clusters x
2 stages (cut after the first conv block), shortened to 800 steps (STEPS: about 5 minutes on 2
cores; --short: short_job.py, 60 steps on a slice). It prints, as the run goes: the relay's
admission, each volunteer's one line from the coordinator ("dial-out only: ..."), the plan and
that every link is relayed (every peer entry of every placed node.json names a relay), each
cluster's step and loss and what the relay has forwarded (the coordinator's live view, from the
relay's heartbeats: `--web` inside the internet namespace, not reachable from this machine's own,
read 4 times a second), the relay's own count of what it forwarded when the run ended (exact), and
the merged model's test accuracy evaluated by PyTorch, which must equal the Leaves' reported
accuracy.

Needs root, `ip` and `iptables`; without them it says why in one line and exits 2. Every
namespace is removed and every process it started is killed on exit: at the end, on a failure, on
Ctrl-C, SIGTERM or SIGHUP (only a SIGKILL of this script leaves them behind). Exit 0: the
run ended and the accuracy checks; 1: something failed (named, with the log to read).
Environment: CAIRN_BUILD_DIR (default build: node/provider, clusterize/clusterize),
CAIRN_EXAMPLE_OUT (default node_data/fashion_mnist_nat).
"""
import argparse
import atexit
import json
import os
import signal
import subprocess
import sys
import threading
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "../.."))
sys.path.insert(0, os.path.join(REPO, "tests/integration"))
from nat_world import NatWorld, router_address  # noqa: E402  (the suite's namespaces, nat_test.py's)
EXAMPLE = os.path.join(REPO, "examples/fashion_mnist")
sys.path.insert(0, EXAMPLE)
from merged_accuracy import merged_accuracies  # noqa: E402  (run_volunteers.sh's check too)
PY = "/usr/bin/python3"
COORDINATOR = "10.77.0.1"
SERVE, RELAY = f"{COORDINATOR}:7100", f"{COORDINATOR}:7101"
WEB = "127.0.0.1:7102"  # the live view, inside the internet namespace only
HOMES = 4
# The default length: STEPS steps of batch 128 per cluster (the job's 6 epochs would be 1,404), to
# end within about 5 minutes on 2 cores. Measured 2026-11-29 on a 2-core machine (4 volunteers, the
# coordinator and its relay sharing it), start to end: 800 steps 290 s (90.96%, at least 11.1 GB
# through the relay); 1,000 steps 363 s (91.48%, 13.8 GB); --short (60 steps on a slice) 27-32 s
# (83.80%).
STEPS = 800
PLAN_FLAGS = ["--clusters", "2", "--cuts", "7", "--input-shape", "32,1,28,28", "--gather-s", "0"]


def say(message):
    print(f"nat: {message}", flush=True)


def fail(message, log=None):
    if log and os.path.exists(log):
        print("".join(open(log, errors="replace").readlines()[-20:]), end="")
        message += f" (log: {log})"
    say(f"FAILED: {message}")
    sys.exit(1)


class Proc:
    """A child process in its own session (a Ctrl-C reaches only this script, which kills it);
    its output lines go to `log` and are kept for wait_for; `on_line` (if given) sees each."""
    started = []

    def __init__(self, cmd, log, on_line=None):
        self.log, self.lines, self.cond, self.on_line = log, [], threading.Condition(), on_line
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     bufsize=1, start_new_session=True, errors="replace")
        Proc.started.append(self)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        with open(self.log, "a") as out:
            for line in self.proc.stdout:
                out.write(line)
                out.flush()
                if self.on_line:
                    self.on_line(line)
                with self.cond:
                    self.lines.append(line)
                    self.cond.notify_all()
        with self.cond:
            self.cond.notify_all()

    def wait_for(self, text, timeout, what):
        """The first line holding `text`; fails naming `what` after `timeout` s or if it exits."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for line in self.lines:
                    if text in line:
                        return line.rstrip("\n")
                if self.proc.poll() is not None and not self.thread.is_alive():
                    fail(f"no {what}: it exited {self.proc.returncode}", self.log)
                if time.monotonic() > deadline:
                    fail(f"no {what} after {timeout} s", self.log)
                self.cond.wait(1.0)

    def finish(self, timeout, what):
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            fail(f"{what} still running after {timeout} s", self.log)
        self.thread.join(5)
        if code != 0:
            fail(f"{what} exited {code}", self.log)

    @staticmethod
    def kill_all():
        for p in Proc.started:
            if p.proc.poll() is None:
                p.proc.kill()
                p.proc.wait()


class Volunteer:
    """One volunteer: the namespace it runs in, its provider flags past `--join INVITE`, the
    public address it holds in the internet namespace (None: behind a home router), the start of
    the line the coordinator sends it at its join (None: nothing expected) and its home router's
    address, which that line must name (None: no router)."""

    def __init__(self, label, namespace, flags, public=None, told=None, router=None):
        self.label, self.namespace, self.flags = label, namespace, flags
        self.public, self.told, self.router = public, told, router


def home_volunteers(world):
    """One volunteer per home, each behind its own router, with no address: dial-out only."""
    return [Volunteer(f"home {k}", world.home_of(k), [], told="dial-out only: no address given",
                      router=router_address(k)) for k in range(HOMES)]


RELAY_VOLUNTEER = "10.77.0.2:7300"


def relay_volunteer(world):
    """A reachable volunteer on the internet's bridge that only relays (`provider --join …
    --relay --listen HOST:PORT`): it joins first, so the plan routes every link through it; the
    coordinator's own relay stays the fallback."""
    return Volunteer("relay", world.inet, ["--relay", "--listen", RELAY_VOLUNTEER],
                     public=RELAY_VOLUNTEER.split(":")[0])


def volunteers(world):
    return [relay_volunteer(world)] + home_volunteers(world)


def write_job(out, short):
    job_path = os.path.join(EXAMPLE, "job.json")
    path = os.path.join(out, "job.json")
    if short:
        subprocess.run([PY, os.path.join(EXAMPLE, "short_job.py"), job_path, path], check=True)
    else:
        job = json.load(open(job_path))
        job["training_definition"].update({"epochs": 0, "max_steps": STEPS})
        json.dump(job, open(path, "w"), indent=2)
    return path


class LiveView:
    """The coordinator's live view (/api/state), read 4 times a second by `run_nat.py --poll URL` run
    inside the internet namespace (the web view listens there only). Keeps the newest snapshot; every
    `every` s prints each cluster's step and loss and what the relay has forwarded."""

    def __init__(self, world, url, log, every=15.0):
        self.latest, self.every, self.printed = None, every, 0.0
        self.proc = Proc(world.run_in(world.inet) + [PY, os.path.abspath(__file__), "--poll", url], log,
                         on_line=self._line)

    def _line(self, line):
        try:
            state = json.loads(line)
            self.latest = state
            training = any(c.get("step") for c in state["clusters"])
            if training and state["relays"] and time.monotonic() - self.printed >= self.every:
                self.printed = time.monotonic()
                clusters = "; ".join(f"cluster {c['id']} step {c['step']}/{c['max_steps'] or '?'}"
                                     + (f" loss {c['loss']:.3f}" if c["loss"] is not None else "")
                                     for c in state["clusters"])
                relay = state["relays"][0]
                say(f"{clusters}; the relay {relay['name']} has forwarded "
                    f"{relay['bytes_forwarded'] / 1e6:,.0f} MB in {relay['messages_forwarded']:,} messages")
        except (ValueError, KeyError, TypeError):
            pass  # not a snapshot line (the log keeps it)

    def last(self):
        """The newest snapshot, once the poller has ended (the coordinator is gone)."""
        try:
            self.proc.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.proc.kill()
        self.proc.thread.join(5)
        return self.latest or {}


def poll(url):
    """`--poll URL`: one line of the state's figures every 0.25 s until the coordinator is gone."""
    import urllib.request
    seen = False
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                state = json.load(r)
            seen = True
            slim = {"t": time.time(), "phase": state["run"]["phase"], "relays": state.get("relays"),
                    "clusters": [{k: c.get(k) for k in ("id", "step", "max_steps", "loss")}
                                 for c in state.get("clusters", [])]}
            print(json.dumps(slim), flush=True)
        except OSError:
            if seen:
                return
        time.sleep(0.25)


def check_relayed(out):
    """Every peer entry (pipeline neighbour, ring member) of every placed node.json names a relay.
    Returns ({relay name: address}, number of links)."""
    nodes_dir = os.path.join(out, "nodes")
    relays, entries = {}, 0
    for name in sorted(os.listdir(nodes_dir)):
        spec = json.load(open(os.path.join(nodes_dir, name, "node.json")))
        peers = [spec[k] for k in ("upstream", "downstream") if spec.get(k)]
        peers += [m for ring in spec.get("rings", []) for m in ring["members"] if m["name"] != name]
        for p in peers:
            entries += 1
            relay = p.get("relay")
            if not relay:
                fail(f"{name}'s node.json names {p['name']} without a relay: {json.dumps(p)}")
            relays[relay["name"]] = relay["address"]
    return relays, entries // 2


def check_accuracy(out, job_path):
    """The merged trained.pt evaluated by PyTorch on each Leaf's test images: exactly the Leaf's
    reported accuracy (merged_accuracy.py)."""
    result, accuracies = merged_accuracies(os.path.join(out, "run_result.json"), job_path)
    for c, accuracy in accuracies:
        e = c["eval"]
        if abs(accuracy - e["accuracy"]) > 1e-9:
            fail(f"the merged {result['trained_torchscript']} evaluates to {accuracy} in PyTorch, "
                 f"cluster {c['cluster']}'s Leaf reported {e['accuracy']}")
        say(f"cluster {c['cluster']}: the Leaf reported {100 * e['accuracy']:.2f}% on {e['samples']} "
            f"test images after {c['steps']} steps; the merged model evaluated by PyTorch: "
            f"{100 * accuracy:.2f}%, exactly the Leaf's figure")
    return result


def cannot_run(world, provider, clusterize):
    reason = world.skip_reason()
    if reason:
        return reason + "; run it as root on Linux with iproute2 and iptables (tools/setup.sh installs them)"
    for path in (provider, clusterize):
        if not os.access(path, os.X_OK):
            return f"no {path}: build first (tools/setup.sh), or set CAIRN_BUILD_DIR"
    if not os.path.isdir("/usr/share/datasets/fashion-mnist"):
        return "no /usr/share/datasets/fashion-mnist (Debian package dataset-fashion-mnist; tools/setup.sh)"
    return None


def start_coordinator(world, build, out, job, model, count):
    coordinator = Proc(world.run_in(world.inet) + [
        os.path.join(build, "clusterize/clusterize"), "--model", model, "--job", job, *PLAN_FLAGS,
        "--serve", SERVE, "--relay", RELAY, "--min-volunteers", str(count), "--web", WEB,
        "--invite-file", os.path.join(out, "invite.txt"), "--out", os.path.join(out, "coordinator")],
        os.path.join(out, "coordinator.log"))
    invite = coordinator.wait_for("invite: ", 180, "invite from the coordinator").split("invite: ")[1].split()[0]
    return coordinator, invite


def join(world, build, out, invite, team):
    """Each volunteer of `team` joins; prints the line the coordinator sends each."""
    joined = []
    for i, v in enumerate(team):
        workdir = os.path.join(out, f"volunteer_{i}")
        joined.append((v, workdir, Proc(world.run_in(v.namespace) + [
            os.path.join(build, "node/provider"), "--join", invite, "--workdir", workdir,
            "--probe-megabytes", "1"] + v.flags, os.path.join(out, f"volunteer_{i}.log"))))
        if "--relay" in v.flags:  # admitted before the others join: the plan relays through it
            line = joined[-1][2].wait_for("relaying for the run at", 180, f"{v.label} admitted as a relay")
            say(f"{v.label}: {line[line.index('relaying for'):].strip()}")
    for v, _, p in joined:
        if v.told:
            line = p.wait_for(v.told, 180, f"'{v.told}' at {v.label}'s join")
            told = line[line.index("dial-out only:"):]
            say(f"{v.label} was told: {told}")
            if v.router and f"from {v.router}" not in told:
                fail(f"{v.label} was not told its router's address {v.router}", p.log)
    return joined


def run(world, args, build, out):
    t0 = time.monotonic()
    job = write_job(out, args.short)
    model = os.path.join(out, "model.pt")
    subprocess.run([PY, os.path.join(EXAMPLE, "make_model.py"), "--out", model], check=True,
                   stdout=subprocess.DEVNULL)
    team = volunteers(world)
    world.build([COORDINATOR] + [v.public for v in team if v.public],
                sum(1 for v in team if v.router))
    say(f"1/4 the world: the coordinator at {COORDINATOR} (internet namespace {world.inet}); "
        f"{HOMES} homes, each volunteer behind its own MASQUERADE router "
        f"({', '.join(v.router for v in team if v.router)})")
    homes = sum(1 for v in team if v.router)
    coordinator, invite = start_coordinator(world, build, out, job, model, homes)
    say(f"2/4 the coordinator serves {SERVE} (its own relay on {RELAY}, the fallback); a volunteer "
        f"at {RELAY_VOLUNTEER} joins to relay only (`provider --join INVITE --relay --listen "
        f"{RELAY_VOLUNTEER}`), then {homes} volunteers join with `provider --join INVITE` and no address")
    joined = join(world, build, out, invite, team)
    planned = coordinator.wait_for(f"planned 2 cluster(s) on {homes} volunteers", 300, "plan")
    say(planned[planned.index("coordinator: "):])
    plan = json.load(open(os.path.join(out, "coordinator", "plan.json")))
    for c, cluster in enumerate(plan["clusters"]):
        say(f"cluster {c}: {' → '.join(cluster['chain'])}")
    relays, links = check_relayed(os.path.join(out, "coordinator"))
    say(f"every link is relayed: {links} links (pipelines and rings), each peer entry of every "
        f"node.json through {', '.join(f'{n} at {a}' for n, a in relays.items())}")
    say("3/4 training (the coordinator's live view, every 15 s):")
    view = LiveView(world, f"http://{WEB}/api/state", os.path.join(out, "live_view.log"))
    coordinator.finish(3600, "the coordinator")
    for v, _, p in joined:
        p.finish(120, f"{v.label}'s volunteer")
    say("4/4 the run is over; the coordinator merged the stages")
    for line in open(coordinator.log):
        if "eval accuracy" in line and not line.startswith("20"):
            print("   " + line.rstrip())
    view.last()
    for v, _, p in joined:  # the relay's own count, exact: its last line as the run ended
        if "--relay" in v.flags:
            done = p.wait_for(": forwarded ", 30, f"{v.label}'s final figures")
            say(f"the relay forwarded{done.split(': forwarded')[1].rstrip()} between the homes, sealed "
                f"end to end: each byte crossed its link twice (in and out)")
    check_accuracy(os.path.join(out, "coordinator"), job)
    say(f"done in {time.monotonic() - t0:.0f} s; trained model {out}/coordinator/trained.pt")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--short", action="store_true", help="60 steps on a slice (short_job.py)")
    parser.add_argument("--poll", help=argparse.SUPPRESS)  # inside the internet namespace (LiveView)
    args = parser.parse_args()
    if args.poll:
        return poll(args.poll)
    os.chdir(REPO)
    build = os.path.abspath(os.environ.get("CAIRN_BUILD_DIR", "build"))
    out = os.path.abspath(os.environ.get("CAIRN_EXAMPLE_OUT", "node_data/fashion_mnist_nat"))
    world = NatWorld(prefix="cdemo")
    reason = cannot_run(world, os.path.join(build, "node/provider"), os.path.join(build, "clusterize/clusterize"))
    if reason:
        say(f"cannot run: {reason}")
        sys.exit(2)
    # PyTorch checks the volunteers' accuracy to the last bit: one BLAS thread as they use.
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    atexit.register(world.close)
    atexit.register(Proc.kill_all)  # first (atexit runs last-registered first): nothing left inside
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda n, _: sys.exit(128 + n))
    subprocess.run(["rm", "-rf", out], check=True)
    os.makedirs(out)
    try:
        run(world, args, build, out)
    except KeyboardInterrupt:
        Proc.kill_all()
        world.close()
        say("interrupted: every process it started is stopped, every namespace removed")
        sys.exit(130)
    finally:
        Proc.kill_all()
        world.close()


if __name__ == "__main__":
    main()
