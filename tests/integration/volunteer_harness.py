#!/usr/bin/python3
"""The volunteer tests' shared harness: processes whose output lines are waited for, a real
coordinator (`clusterize --serve`) and real `provider --join` volunteers on tcp loopback, the
example CNN and its Fashion-MNIST job, ports, evaluation by PyTorch, and the checks the cases share.
A file of cases imports it as `vt` (volunteer_test.py, volunteer_replace_test.py, ...) and ends in
`vt.main_of`. No sleeps stand in for synchronisation: each step waits for the line or file that
says the previous one happened.
"""
import argparse
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time

import numpy as np
import torch

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "../.."))
sys.path.insert(0, os.path.join(REPO, "tools/bench"))
import loopback_ports  # noqa: E402  (the port scheme the benchmarks and C++ tests share)
from in_process import run_script  # noqa: E402  (make_model.py in this interpreter)
EXAMPLE = os.path.join(REPO, "examples/fashion_mnist")
FASHION = "/usr/share/datasets/fashion-mnist"
MEAN, STD = 0.2860, 0.3530
INPUT_SHAPE = ("--input-shape", "8,1,28,28")


def fail(message):
    print("FAIL: " + message, file=sys.stderr)
    sys.exit(1)


def free_ports(count):
    """COUNT distinct loopback ports below the kernel's ephemeral range, held for this test's life
    (tools/bench/loopback_ports.py, the scheme tests/common/LoopbackPorts.h shares): no other test
    or benchmark gets them, so a port stays free while its process is down (a restarted
    coordinator, a volunteer between runs). The static tests' fixed ports
    (tests/integration/Tests.cmake, 5700-7000) lie below them."""
    return loopback_ports.free_ports(count)


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
    """own_folder: its work folder is made here (empty) and is its cwd too. port None: no --listen
    (the volunteer joins dial-out only)."""
    workdir = os.path.join(args.work, f"volunteer_{i}")
    if own_folder:
        os.makedirs(workdir)  # its cwd and work folder: empty, no copy of the data
    listen = [] if port is None else ["--listen", f"127.0.0.1:{port}"]
    cmd = [args.provider, "--join", invite, *listen, "--workdir", workdir,
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

    def join(self, count, extra=(), dial_out_only=False):
        """Starts `count` more volunteers, numbered on from those started before; dial_out_only:
        without --listen."""
        if self.ports is None:
            self.ports = free_ports(self.port_count)
        for i in range(len(self.volunteers), len(self.volunteers) + count):
            port = None if dial_out_only else self.ports[i]
            self.volunteers.append(volunteer(self.args, self.invite, i, port, extra,
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
