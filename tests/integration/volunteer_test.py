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
  bad_invites       what a volunteer sees when its invite is wrong: a wrong token is refused with
                    the coordinator's reason (exit 2), a wrong coordinator key gets no answer and a
                    clear timeout (exit 3), a malformed invite and --advertise without --listen
                    exit 2 before any network traffic;
                    and on the researcher's side, `--serve --grow` with an async job exits 2
                    naming training_definition.schedule before it listens
"""
import argparse
import gzip
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import torch

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "../.."))
sys.path.insert(0, os.path.join(REPO, "tools/bench"))
from loopback_ports import ephemeral_low  # noqa: E402  (the port policy the benchmarks share)
from in_process import run_script  # noqa: E402  (make_model.py in this interpreter)
EXAMPLE = os.path.join(REPO, "examples/fashion_mnist")
FASHION = "/usr/share/datasets/fashion-mnist"
MEAN, STD = 0.2860, 0.3530
INPUT_SHAPE = ("--input-shape", "8,1,28,28")


def fail(message):
    print("FAIL: " + message, file=sys.stderr)
    sys.exit(1)


def free_ports(count):
    """COUNT distinct ports on 127.0.0.1 that bind now, drawn at random from below the kernel's
    ephemeral range (/proc/sys/net/ipv4/ip_local_port_range): a port the kernel hands out for a
    bind to port 0 or an outgoing connection -- another test's, running beside this one -- can
    never be one of these, so a port picked here stays free while its process is down (a restarted
    coordinator, a volunteer between runs). The static tests' fixed ports (tests/CMakeLists.txt,
    5700-7000) lie below the range drawn from."""
    low = ephemeral_low()
    draw = random.Random(os.getpid() ^ time.monotonic_ns())
    ports = []
    while len(ports) < count:
        port = draw.randrange(20000, max(low, 20001))
        if port in ports:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        ports.append(port)
    return ports


class Process:
    """A child process whose output lines are collected by a thread (and echoed with a tag, or,
    with `log`, appended to that file instead: many processes would flood the terminal). `env`:
    its environment (default this one's)."""

    def __init__(self, tag, cmd, cwd=None, log=None, env=None):
        self.tag, self.lines, self.cond = tag, [], threading.Condition()
        self.log = open(log, "a") if log else None
        self.proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, bufsize=1, env=env)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        for line in self.proc.stdout:
            if self.log:
                self.log.write(line)
                self.log.flush()
            else:
                print(f"[{self.tag}] {line}", end="", flush=True)
            with self.cond:
                self.lines.append(line)
                self.cond.notify_all()

    def wait_for(self, predicate, timeout, what):
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for line in self.lines:
                    if predicate(line):
                        return line
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None and not self.thread.is_alive():
                    fail(f"{self.tag}: no line {what} within {timeout} s (exit {self.proc.poll()})")
                self.cond.wait(min(left, 1.0))

    def count(self, predicate):
        with self.cond:
            return sum(1 for line in self.lines if predicate(line))

    def finish(self, timeout):
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            fail(f"{self.tag}: still running after {timeout} s")
        self.thread.join(5)
        return code

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def z85(data):
    """ZeroMQ's Z85 encoding (RFC 32) of bytes whose length is a multiple of 4: a CURVE key."""
    alphabet = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
    out = []
    for i in range(0, len(data), 4):
        value = int.from_bytes(data[i:i + 4], "big")
        out.extend(alphabet[value // 85 ** k % 85] for k in range(4, -1, -1))
    return "".join(out)


def load_idx(name, offset):
    return np.frombuffer(gzip.open(os.path.join(FASHION, name)).read(), np.uint8, offset=offset)


def write_job(work, model, steps, test_samples, training=None):
    job = {"format": 1, "job_id": "volunteers", "driver": "cairn", "model": model,
           "data": {"location": FASHION, "format": "idx", "normalize": {"mean": [MEAN], "std": [STD]},
                    "train_samples": 6000, "test_samples": test_samples},
           "training_definition": {"batch_size": 32, "microbatches": 4, "epochs": 0, "max_steps": steps,
                                   "seed": 3, "optimizer": {"name": "adamw", "lr": 0.003},
                                   "sync": "average", "local_steps": 5,
                                   "timeouts": {"startup_s": 60, "peer_s": 60}}}
    job["training_definition"].update(training or {})
    path = os.path.join(work, "job.json")
    with open(path, "w") as f:
        json.dump(job, f)
    return path


def start_coordinator(args, job, model, out, extra, port=0, tag="coordinator", shape=INPUT_SHAPE):
    """port 0: the kernel picks; a restart must name the port its invite holds."""
    invite_file = os.path.join(args.work, "invite.txt")
    cmd = [args.clusterize, "--model", model, "--job", job, *shape,
           "--serve", f"127.0.0.1:{port}", "--invite-file", invite_file, "--out", out] + extra
    coordinator = Process(tag, cmd)
    line = coordinator.wait_for(lambda l: l.startswith("invite: "), 120, "'invite: …'")
    return coordinator, line.split()[1]


def volunteer(args, invite, i, port, extra=(), tag=None, own_folder=False):
    """own_folder: its work folder is made here (empty) and is its cwd too."""
    workdir = os.path.join(args.work, f"volunteer_{i}")
    if own_folder:
        os.makedirs(workdir)  # its cwd and work folder: empty, no copy of the data
    cmd = [args.provider, "--join", invite, "--listen", f"127.0.0.1:{port}", "--workdir", workdir,
           "--probe-megabytes", "1"] + list(extra)
    return Process(tag or f"volunteer {i}", cmd, cwd=workdir if own_folder else None), workdir


def all_finish(coordinator, volunteers, but=None):
    """The coordinator ends the run (exit 0) and every volunteer (but the Process `but`, one
    that was killed) exits 0 after it."""
    code = coordinator.finish(600)
    if code != 0:
        fail(f"the coordinator exited {code}")
    for v, _ in volunteers:
        if v is but:
            continue
        c = v.finish(120)
        if c != 0:
            fail(f"{v.tag} exited {c}")


def kill_all(coordinator, volunteers):
    coordinator.kill()
    for v, _ in volunteers:
        v.kill()


def make_model(work):
    """examples/fashion_mnist/make_model.py's CNN written to WORK/model.pt: that path."""
    model = os.path.join(work, "model.pt")
    run_script(os.path.join(EXAMPLE, "make_model.py"), ["--out", model])
    return model


def prepare(args, steps, test_samples, training=None):
    """args.work (made if missing) with the model (make_model) and the job (write_job): (model, job)."""
    os.makedirs(args.work, exist_ok=True)
    model = make_model(args.work)
    return model, write_job(args.work, model, steps, test_samples, training)


def in_folder(args, name):
    """args for a run of its own in the new folder args.work/NAME (work is the only change)."""
    work = os.path.join(args.work, name)
    os.makedirs(work)
    sub = argparse.Namespace(**vars(args))
    sub.work = work
    return sub


class Run:
    """A coordinator (start_coordinator, out args.work/coordinator) and the volunteers that join
    it. Leaving its `with` block kills whatever still runs (kill_all), the restarted coordinator if
    there was a restart. ports: how many volunteers it may start (free_ports, taken at the first
    join). restartable: the coordinator listens on a port picked here (free_ports) that a restart
    names again; else the kernel picks. label: a prefix to the processes' tags. shape: the
    coordinator's --input-shape (and dtype) flags. own_folders: each volunteer runs in its own
    new, empty work folder (its cwd)."""

    def __init__(self, args, model, job, flags, ports=0, restartable=False, label="", shape=INPUT_SHAPE,
                 own_folders=False):
        self.args, self.model, self.job, self.flags, self.shape = args, model, job, flags, shape
        self.prefix = label + " " if label else ""
        self.own_folders, self.port_count, self.ports, self.volunteers = own_folders, ports, None, []
        self.out = os.path.join(args.work, "coordinator")
        self.port = free_ports(1)[0] if restartable else 0
        self.coordinator, self.invite = start_coordinator(args, job, model, self.out, flags, self.port,
                                                          self.prefix + "coordinator", self.shape)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        kill_all(self.coordinator, self.volunteers)

    def join(self, count, extra=()):
        """Starts `count` more volunteers, numbered on from those started before."""
        if self.ports is None:
            self.ports = free_ports(self.port_count)
        for i in range(len(self.volunteers), len(self.volunteers) + count):
            self.volunteers.append(volunteer(self.args, self.invite, i, self.ports[i], extra,
                                             f"{self.prefix}volunteer {i}", self.own_folders))

    def wait_planned(self, clusters, timeout=120, what="'planned'"):
        """Waits for the coordinator's 'planned CLUSTERS cluster(s) on N volunteers', N those started."""
        planned = f"planned {clusters} cluster(s) on {len(self.volunteers)} volunteers"
        return self.coordinator.wait_for(lambda l: planned in l, timeout, what)

    def all_finish(self, but=None):
        all_finish(self.coordinator, self.volunteers, but)

    def restart_coordinator(self):
        """SIGKILLs the coordinator once the Leaf of the plan's cluster 0 has written 5 step
        records and starts it again (the same command and port, so the same invite) after 20 more:
        (the Leaf's metrics.jsonl, its step records at the kill, at the restart)."""
        leaf = json.load(open(os.path.join(self.out, "plan.json")))["clusters"][0]["chain"][-1]
        leaf_metrics = [os.path.join(w, "node_data", "nodes", leaf, "metrics.jsonl") for _, w in self.volunteers]
        wait_until(lambda: any(os.path.exists(m) for m in leaf_metrics), 120, f"{leaf}'s metrics.jsonl")
        metrics = next(m for m in leaf_metrics if os.path.exists(m))
        wait_until(lambda: step_records(metrics) >= 5, 120, "the Leaf's first steps")
        self.coordinator.proc.kill()
        self.coordinator.finish(30)
        at_kill = step_records(metrics)
        print(f"coordinator killed at the Leaf's step record {at_kill}")
        # Training goes on without the coordinator.
        wait_until(lambda: step_records(metrics) >= at_kill + 20, 300, "steps after the coordinator died")
        at_restart = step_records(metrics)
        self.coordinator, invite_again = start_coordinator(self.args, self.job, self.model, self.out, self.flags,
                                                           self.port, self.prefix + "coordinator", self.shape)
        if invite_again != self.invite:
            fail("the restarted coordinator has another invite")
        return metrics, at_kill, at_restart


def start_run(args, steps, test_samples, flags, ports=0, training=None, restartable=False):
    """prepare's model and job in args.work and a Run of them (its coordinator started)."""
    model, job = prepare(args, steps, test_samples, training)
    return Run(args, model, job, flags, ports, restartable)


def name_of(workdir):
    """The node a volunteer holds (its membership.json)."""
    return json.load(open(os.path.join(workdir, "membership.json")))["name"]


def node_records(workdir, name):
    """The complete records of node NAME's metrics.jsonl in a volunteer's work folder."""
    path = os.path.join(workdir, "node_data", "nodes", name, "metrics.jsonl")
    return [json.loads(line) for line in open(path) if line.endswith("\n")]


def leaf_losses(out, workdirs):
    """{cluster: [(step, loss), ...]} from each cluster's Leaf's own metrics.jsonl, read in the work
    folder of the one volunteer (of `workdirs`) that holds it."""
    plan = json.load(open(os.path.join(out, "plan.json")))
    losses = {}
    for c, cluster in enumerate(plan["clusters"]):
        leaf = cluster["chain"][-1]
        holders = [w for w in workdirs if name_of(w) == leaf]
        if len(holders) != 1:
            fail(f"cluster {c}: {len(holders)} volunteers hold its Leaf {leaf}")
        losses[c] = [(r["step"], r["loss"]) for r in node_records(holders[0], leaf) if "step" in r]
    return losses


def check_same_losses(reference, other, steps, which):
    """Every cluster's reference run trained steps 1..`steps`, and the `which` run's Leaf losses
    equal them exactly, step for step."""
    for c in sorted(reference):
        if [s for s, _ in reference[c]] != list(range(1, steps + 1)):
            fail(f"reference cluster {c}: steps {[s for s, _ in reference[c]]}")
        if other.get(c) != reference[c]:
            diff = [(a, b) for a, b in zip(reference[c], other.get(c, [])) if a != b]
            fail(f"cluster {c}: {which} Leaf losses differ from the reference's: {diff[:5]}")


def check_trained(out, test_samples, said):
    """The coordinator's merged model (run_result.json's trained_torchscript) evaluated by PyTorch
    has exactly the accuracy cluster 0's Leaf reported; prints `said` formatted with reported and
    accuracy. Returns the reported accuracy."""
    summary = json.load(open(os.path.join(out, "run_result.json")))
    reported = summary["clusters"][0]["eval"]["accuracy"]
    accuracy = evaluate(summary["trained_torchscript"], test_samples)
    print(said.format(reported=reported, accuracy=accuracy))
    if abs(accuracy - reported) > 1e-9:
        fail("the merged model's accuracy differs from the Leaf's")
    return reported


def trained_parameters(out, missing_ok=False):
    """(node, parameter name, tensor) of every trained stage of the run in OUT (plan.json's
    clusters, OUT/nodes/<node>/trained_stage.pt); with missing_ok, a node without one is skipped."""
    import torch
    for cluster in json.load(open(os.path.join(out, "plan.json")))["clusters"]:
        for node in cluster["chain"]:
            path = os.path.join(out, "nodes", node, "trained_stage.pt")
            if missing_ok and not os.path.exists(path):
                continue
            for name, p in torch.jit.load(path).named_parameters():
                yield node, name, p


def check_cluster_weights(args, out, evaluate_file, said, failed):
    """Each cluster of the run in OUT: its own weights (`clusterize --merge OUT --cluster N`, written
    to args.work/cluster_N.pt) evaluated by evaluate_file(path) give exactly the accuracy its Leaf
    reported. `said` (printed) and `failed` (the failure) are formatted with the cluster's
    run_result.json entry (cluster, leaf, ...), reported and accuracy. Returns run_result.json."""
    summary = json.load(open(os.path.join(out, "run_result.json")))
    for entry in summary["clusters"]:
        merged = os.path.join(args.work, f"cluster_{entry['cluster']}.pt")
        subprocess.run([args.clusterize, "--merge", out, "--cluster", str(entry["cluster"]), "--out", merged],
                       check=True, stdout=subprocess.DEVNULL)
        accuracy = evaluate_file(merged)
        reported = entry["eval"]["accuracy"]
        values = dict(entry, reported=reported, accuracy=accuracy)
        print(said.format_map(values))
        if abs(accuracy - reported) > 1e-9:
            fail(failed.format_map(values))
    return summary


def case_join_train_merge(args):
    test_samples = 1000
    run = start_run(args, 60, test_samples, ["--min-volunteers", "6", "--clusters", "2", "--cuts", "7,14"], 6)
    out, coordinator = run.out, run.coordinator
    with run:
        run.join(3)
        # The first three are in (accepted as spares) before the others start.
        for i in range(3):
            coordinator.wait_for(lambda l, i=i: f"joined: node_{i} " in l, 120, f"'joined: node_{i}'")
        if coordinator.count(lambda l: "planned" in l):
            fail("the coordinator planned before --min-volunteers had joined")
        run.join(3)
        run.wait_planned(2, 120, "'planned 2 cluster(s)'")
        run.all_finish()

    # Secret keys never left the volunteers; the coordinator holds none.
    for name in os.listdir(os.path.join(out, "nodes")):
        if os.path.exists(os.path.join(out, "nodes", name, "secret.key")):
            fail(f"the coordinator's folder holds a secret key for {name}")
    summary = json.load(open(os.path.join(out, "run_result.json")))
    clusters = summary["clusters"]
    if sorted(c["cluster"] for c in clusters) != [0, 1]:
        fail(f"expected the Leaves of clusters 0 and 1 in run_result.json, got {clusters}")
    accuracies = [c["eval"]["accuracy"] for c in clusters]
    if accuracies[0] != accuracies[1]:
        fail(f"the two clusters' Leaves report different accuracies after the final reduce: {accuracies}")
    plan = json.load(open(os.path.join(out, "plan.json")))
    chains = [c["chain"] for c in plan["clusters"]]
    if [len(c) for c in chains] != [3, 3]:
        fail(f"expected 2 clusters x 3 stages, got {chains}")

    accuracy = evaluate(summary["trained_torchscript"], test_samples)
    net = torch.jit.load(summary["trained_torchscript"])
    print(f"2 x 3 volunteers: Leaves report accuracy {accuracies[0]:.4f}; the merged model in PyTorch: {accuracy:.4f}")
    if abs(accuracy - accuracies[0]) > 1e-9:
        fail("the merged model's accuracy differs from the Leaves'")
    if accuracy <= 0.5:
        fail(f"accuracy {accuracy:.4f} after 60 steps is not above 0.5")
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
            fail(f"trained.safetensors: {name} differs from trained.pt")
        checked += 1
    if checked != len(state):
        fail(f"trained.safetensors holds {checked} tensors, trained.pt {len(state)}")


def case_checkpoint_upload(args):
    # job.json asks for 2 intra-op threads; every volunteer gives 1 core (its limit), volunteer 0
    # also only 3.5 GB.
    run = start_run(args, 60, 200, ["--min-volunteers", "3", "--clusters", "1", "--cuts", "7,14"], 3,
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
        name = name_of(workdir)
        held = os.path.join(out, "checkpoints", name)
        files = sorted(os.listdir(held)) if os.path.isdir(held) else []
        if len(files) != 1 or not files[0].startswith("step_") or not files[0].endswith(".ckpt"):
            fail(f"the coordinator holds {files} for {name}, expected exactly one step_<N>.ckpt")
        step = int(files[0][len("step_"):-len(".ckpt")])
        if step % 10 != 0 or not 10 <= step <= 60:
            fail(f"{name}: the coordinator's checkpoint is of step {step}, not a multiple of 10 up to 60")
        row = db.execute("SELECT step, path FROM checkpoints WHERE name = ?", (name,)).fetchone()
        if row is None or row[0] != step or os.path.abspath(row[1]) != os.path.abspath(os.path.join(held, files[0])):
            fail(f"{name}: coordinator.db says {row}, the folder holds step {step}")
        own = os.path.join(workdir, "node_data", "nodes", name, "checkpoints", files[0])
        if not os.path.exists(own):
            fail(f"{name}: the volunteer no longer has {own} (it keeps its newest 3; the coordinator "
                 f"should hold the newest)")
        if open(own, "rb").read() != open(os.path.join(held, files[0]), "rb").read():
            fail(f"{name}: the coordinator's step {step} differs from the volunteer's {own}")
        uploads = [l.strip() for l in v.lines if "uploaded checkpoint step" in l]
        if not uploads:
            fail(f"{v.tag} ({name}) logged no upload")
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
            fail(f"the coordinator's join lines of {v.tag}: {offered}")
        ram_gb = float(offered[0].split(f" at {address} (")[1].split(" GB, ")[0])
        if " GB, 1 cores," not in offered[0] or (ram_gb == 3.5) != (i == 0):
            fail(f"{v.tag} (--cores 1{' --memory-gb 3.5' if i == 0 else ''}) joined as: {offered[0]}")
        if not v.count(lambda l: "asks for 2 intra-op threads; this volunteer gives 1 cores" in l):
            fail(f"{v.tag} did not cap job.json's 2 threads at its 1 core")
        print(f"limits: {offered[0][offered[0].index('joined: '):].strip()}")
    if not run.volunteers[0][0].count(lambda l: "probe: giving " in l and " and 3.5 of " in l):
        fail("volunteer 0 did not log what it gives of the machine ('probe: giving …')")


def evaluate(path, test_samples):
    net = torch.jit.load(path)
    net.eval()
    images = load_idx("t10k-images-idx3-ubyte.gz", 16).reshape(-1, 1, 28, 28)[:test_samples]
    labels = torch.from_numpy(load_idx("t10k-labels-idx1-ubyte.gz", 8)[:test_samples].astype(np.int64))
    x = (torch.from_numpy(images.astype(np.float32)) / 255.0 - MEAN) / STD
    with torch.no_grad():
        logits = torch.cat([net(x[i:i + 250]) for i in range(0, test_samples, 250)])
    return (logits.argmax(1) == labels).double().mean().item()


def step_records(path):
    if not os.path.exists(path):
        return 0
    # A step record has "step" at the top level (evaluation records nest theirs under "eval").
    # The provider may be writing the last line right now: only complete lines count.
    count = 0
    for line in open(path):
        if line.endswith("\n") and "step" in json.loads(line):
            count += 1
    return count


# The coordinator's acknowledgement of a checkpoint upload (coordinator/CheckpointUploads.cpp).
CHECKPOINT_ACK = re.compile(r"coordinator: checkpoint of (\S+) at step (\d+) ")


def wait_for_checkpoint(coordinator, at_least, timeout, node=None):
    """The coordinator's line acknowledging a checkpoint of NODE (None: of any node) at step
    >= AT_LEAST, waited for up to TIMEOUT s (lines it logged before count too)."""
    def acknowledged(line):
        m = CHECKPOINT_ACK.search(line)
        return bool(m) and (node is None or m.group(1) == node) and int(m.group(2)) >= at_least
    return coordinator.wait_for(acknowledged, timeout, f"a checkpoint of {node or 'any node'} at step >= {at_least}")


def checkpoint_step(line):
    """The step of a checkpoint acknowledgement line (see CHECKPOINT_ACK)."""
    return int(CHECKPOINT_ACK.search(line).group(2))


def wait_until(condition, timeout, what):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.2)  # polling a file another process writes; no ordering is assumed


def case_coordinator_restarts(args):
    test_samples = 1000
    run = start_run(args, 150, test_samples, ["--min-volunteers", "3", "--clusters", "1", "--cuts", "7,14"], 3,
                    restartable=True)
    with run:
        run.join(3, ["--result-wait-s", "600"])
        run.wait_planned(1)
        metrics, _, _ = run.restart_coordinator()
        run.all_finish()
    if step_records(metrics) != 150:
        fail(f"the Leaf wrote {step_records(metrics)} step records, expected 150")
    check_trained(run.out, test_samples,
                  "after a coordinator restart: Leaf accuracy {reported:.4f}, merged model in PyTorch {accuracy:.4f}")


def case_bad_invites(args):
    run = start_run(args, 10, 100, ["--min-volunteers", "99"])
    model, job, coordinator, invite = run.model, run.job, run.coordinator, run.invite
    try:
        head, key_hex, token = invite.rsplit(":", 2)
        port = free_ports(1)[0]
        # A wrong token: refused with the coordinator's reason.
        v, _ = volunteer(args, f"{head}:{key_hex}:{'f' * len(token)}", "token", port)
        code = v.finish(120)
        if code != 2 or not v.count(lambda l: "refused" in l and "wrong invite token" in l):
            fail(f"a wrong token: expected exit 2 and the coordinator's reason, got exit {code}")
        # A wrong coordinator key (another valid key): the CURVE handshake fails silently, so
        # the volunteer hears nothing and says so.
        other = z85(os.urandom(32)).encode().hex()
        v, _ = volunteer(args, f"{head}:{other}:{token}", "key", port, ["--coordinator-timeout-s", "3"])
        code = v.finish(120)
        if code != 3 or not v.count(lambda l: "did not answer" in l):
            fail(f"a wrong coordinator key: expected exit 3 and 'did not answer', got exit {code}")
        # A malformed invite never reaches the network.
        v, _ = volunteer(args, "cairn-invite:1:127.0.0.1:notaport:00:00", "malformed", port)
        code = v.finish(60)
        if code != 2 or not v.count(lambda l: "invite" in l):
            fail(f"a malformed invite: expected exit 2 naming the invite, got exit {code}")
        # --advertise names --listen from outside: alone it is refused before any network traffic
        # (no address at all is fine: a dial-out-only volunteer, integration.volunteers.nat_direct).
        alone = subprocess.run([args.provider, "--join", invite, "--advertise", "203.0.113.7:7100",
                                "--workdir", os.path.join(args.work, "advertise_alone")],
                               capture_output=True, text=True, timeout=60)
        if alone.returncode != 2 or "--advertise 203.0.113.7:7100 needs --listen" not in alone.stderr:
            fail(f"--advertise without --listen: expected exit 2 naming both, got exit "
                 f"{alone.returncode}: {alone.stderr[-300:]}")
    finally:
        coordinator.proc.terminate()
        code = coordinator.finish(60)
    if code != 0:
        fail(f"the coordinator exited {code} on SIGTERM")
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
        fail(f"--grow with an async job: expected exit 2 naming training_definition.schedule, got exit "
             f"{refused.returncode}: {said[-400:]}")
    print("--grow with an async job: refused (exit 2):", [l for l in said.splitlines() if "schedule" in l][-1])


def main_of(cases, namespace):
    """The main of a file of cases: CASE --provider --clusterize --work DIR runs namespace's
    case_CASE(args) in a fresh DIR with one torch thread, then prints PASS."""
    parser = argparse.ArgumentParser()
    parser.add_argument("case", choices=cases)
    parser.add_argument("--provider", required=True)
    parser.add_argument("--clusterize", required=True)
    parser.add_argument("--work", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    shutil.rmtree(args.work, ignore_errors=True)
    namespace["case_" + args.case](args)
    print("PASS")


def main():
    main_of(["join_train_merge", "coordinator_restarts", "bad_invites", "checkpoint_upload"], globals())


if __name__ == "__main__":
    main()
