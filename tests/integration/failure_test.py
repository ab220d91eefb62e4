#!/usr/bin/env python3
"""Integration tests for failures while training (docs/OPERATIONS.md): real provider processes on tcp loopback,
a Fashion-MNIST slice, one cluster of 3 nodes Root–Stem–Leaf (node_0–node_1–node_2), threads 1.

    failure_test.py CASE --provider BUILD/node/provider --work DIR --port BASE [--reference DIR]

  reference         the uninterrupted run (STEPS steps, same seed) that the resume cases compare
                    with, in --work; ctest runs it once as a fixture and hands its folder to them as
                    --reference (without it, each of them runs its own first).

  kill_stem_resume  SIGKILL the Stem mid-run, restart it with --resume a few seconds later: all exit
                    0 and the final test loss is within 2% of an uninterrupted run with the same
                    seed. Prints the time the neighbours took to notice (kill → their "lost" log
                    line) and to resume (restart → first step after resuming).
  stem_restarts_quickly  the same, restarted after 0.5 s with peer_timeout_s 10: the neighbours
                    notice its hello mid-run (it restarted) instead of the dropped connection.
  frozen_stem       SIGSTOP the Stem (connections stay open): the neighbours notice through the
                    missing heartbeat answers; then it is killed and restarted with --resume.
  lost_for_good     SIGKILL the Stem and never restart it: the others exit 3 within max_wait_s +
                    slack with a message naming the Stem and "--resume".
  lost_without_checkpoints  the same with checkpoint_every 0: they exit 3 at once, naming the Stem
                    and hinting at checkpoint_every.
  sigterm_resume    SIGTERM the Stem: all exit 0 with "stopped"; restart all with --resume: they
                    finish with the weights of an uninterrupted run.
  sigterm_while_waiting  SIGTERM the Stem while no message can come (the Root held before step
                    HOLD_AT by CAIRN_TEST_HOLD; peer_s 600, so the step boundary of a clean stop is
                    10 minutes away): the Stem gives up the step peer_timeout_s after the signal,
                    says why, tells its neighbours and exits 0 (issue [Q]: a volunteer exits on its
                    first SIGTERM whatever it waits for); the Leaf stops with it, the Root once
                    released; restarted with --resume they finish with the uninterrupted run's
                    weights (only the unfinished step was given up: they resume from step 20).
"""
import json
import os
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import provider_cluster_test as pct  # noqa: E402  (node data building, shared with the other cases)

NODES = ["node_0", "node_1", "node_2"]


def fail(message):
    pct.fail(message)


def settings(steps, peer_timeout_s, max_wait_s, checkpoint_every):
    s = pct.training_settings(steps)
    s["record_sample_ids"] = False
    s["checkpoint_every"] = checkpoint_every
    s["timeouts"] = {"startup_s": 30, "peer_s": 60, "peer_timeout_s": peer_timeout_s, "max_wait_s": max_wait_s}
    return s


DATA = {"train_samples": 4000, "test_samples": 1000}
# The resume cases stop the Stem once the Leaf logged KILL_AT steps (a checkpoint every 20: they
# resume from step KILL_AT), with STEPS - KILL_AT steps still to go.
STEPS, KILL_AT = 120, 40


class Node:
    """One provider process; a reader thread keeps (time, line) of everything it prints."""

    def __init__(self, provider, node_data, name, extra=()):
        self.name = name
        self.lines = []
        self.started = time.time()
        self.proc = subprocess.Popen([provider, "--name", name, "--node-data", node_data] + list(extra),
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append((time.time(), line.rstrip("\n")))

    def wait(self, limit):
        try:
            code = self.proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            self.dump()
            fail(f"{self.name} did not exit within {limit:.0f} s")
        self.reader.join(timeout=10)
        return code

    def first(self, text, after=0.0):
        for t, line in self.lines:
            if t >= after and text in line:
                return t, line
        return None

    def dump(self, n=8):
        for _, line in self.lines[-n:]:
            print(f"[{self.name}] {line}")


def steps_done(node_data, node):
    try:
        return len(pct.losses_of(node_data, node))
    except (OSError, ValueError):
        return 0


def wait_for_steps(node_data, node, n, limit):
    deadline = time.time() + limit
    while time.time() < deadline:
        if steps_done(node_data, node) >= n:
            return
        time.sleep(0.2)
    fail(f"{node} did not reach {n} steps within {limit} s")


def reference_run(args, tag, s):
    """The uninterrupted run with the same seed and training settings: --reference's (the fixture
    case `reference`, run once for all of them; timeouts and ports do not change what is trained),
    else one run here."""
    if args.reference:
        node_data = os.path.join(args.reference, "node_data")
        if not os.path.exists(os.path.join(node_data, "nodes", "node_2", "result.json")):
            fail(f"--reference {args.reference}: no finished run (node_data/nodes/node_2/result.json)")
        return node_data
    _, node_data = pct.make_node_data(os.path.join(args.work, tag), args.port, 3, True, s, DATA)
    seconds = pct.launch(node_data, args.provider, 240)
    print(f"uninterrupted run: {seconds:.1f} s")
    return node_data


def case_reference(args):
    args.reference = None
    reference_run(args, ".", settings(STEPS, 2, 60, 20))


def eval_loss(node_data, leaf="node_2"):
    return json.load(open(os.path.join(node_data, "nodes", leaf, "result.json")))["eval"]["loss"]


def case_kill_stem_resume(args, peer_timeout=2, downtime=5.0, freeze=False):
    s = settings(STEPS, peer_timeout, 60, 20)
    reference = reference_run(args, "reference", s)
    _, node_data = pct.make_node_data(os.path.join(args.work, "run"), args.port, 3, True, s, DATA)
    nodes = {n: Node(args.provider, node_data, n) for n in NODES}
    wait_for_steps(node_data, "node_2", KILL_AT, 120)
    killed = time.time()
    if freeze:
        # SIGSTOP: its TCP connections stay open, only the missing heartbeat answers give it away.
        nodes["node_1"].proc.send_signal(signal.SIGSTOP)
        deadline = time.time() + 60
        while time.time() < deadline and not all(nodes[n].first("lost (", killed) for n in ("node_0", "node_2")):
            time.sleep(0.2)
        if not all(nodes[n].first("lost (", killed) for n in ("node_0", "node_2")):
            nodes["node_1"].proc.send_signal(signal.SIGKILL)
            fail("the neighbours did not notice the frozen Stem within 60 s")
    nodes["node_1"].proc.send_signal(signal.SIGKILL)
    nodes["node_1"].wait(10)
    time.sleep(downtime)
    restarted = time.time()
    stem = Node(args.provider, node_data, "node_1", ["--resume"])
    codes = {n: nodes[n].wait(180) for n in ("node_0", "node_2")}
    codes["node_1"] = stem.wait(60)
    for n, code in codes.items():
        if code != 0:
            (stem if n == "node_1" else nodes[n]).dump(15)
            fail(f"{n} exited {code}")
    noticed = [nodes[n].first("lost (", killed) for n in ("node_0", "node_2")]
    if any(x is None for x in noticed):
        for n in ("node_0", "node_2"):
            nodes[n].dump(20)
        fail("a neighbour of the Stem never logged it lost")
    resumed = nodes["node_0"].first("first step after resuming", restarted)
    if resumed is None:
        fail("the Root never logged its first step after resuming")
    for t, line in noticed:
        print(f"noticed: {line.strip()[:160]}")
    print(f"time to notice ({'SIGSTOP' if freeze else 'SIGKILL'} -> neighbours' 'lost'): "
          f"{', '.join(f'{t - killed:.2f} s' for t, _ in noticed)} (peer_timeout_s {peer_timeout}, "
          f"Stem restarted after {downtime} s{', frozen (SIGSTOP) first' if freeze else ''})")
    print(f"time to resume (restart -> Root's first step after resuming): {resumed[0] - restarted:.2f} s")
    for text in ("resume: this node holds", "resume: the cluster agreed", "resume: no checkpoint step"):
        line = nodes["node_0"].first(text, restarted)
        if line:
            print(f"Root: {line[1].strip()[:200]}")
    a, b = eval_loss(reference), eval_loss(node_data)
    diff = abs(b - a) / a
    print(f"final test loss: uninterrupted {a:.6f}, killed and resumed {b:.6f}: difference {100 * diff:.3f}%")
    if not diff <= 0.02:
        fail(f"final test loss differs by {100 * diff:.2f}% (limit 2%)")
    # Resume is exact (the trainer restores data order, RNG and optimizer state; docs/OPERATIONS.md
    # "Checkpoints and resume"): every logged step loss, before the kill and after the resume (the
    # replayed steps included), equals the uninterrupted run's.
    resumed_from = json.load(open(os.path.join(node_data, "nodes", "node_0", "result.json")))["resumed_from"]
    print(f"the cluster resumed from step {resumed_from} (checkpoint_every {s['checkpoint_every']})")
    if resumed_from <= 0:
        fail("the cluster did not resume from a checkpoint")
    ref = {m["step"]: m["loss"] for m in pct.metrics(reference, "node_2") if "step" in m}
    records = pct.metrics(node_data, "node_2")
    marks = [i for i, m in enumerate(records) if "resumed_from" in m]
    if not marks:
        fail("node_2's metrics.jsonl has no resumed_from record")
    after = [m for m in records[marks[-1]:] if "step" in m]
    every = [m for m in records if "step" in m]
    same = sum(1 for m in every if ref.get(m["step"]) == m["loss"])
    replayed = sum(1 for m in after if m["step"] <= max(x["step"] for x in records[:marks[-1]] if "step" in x))
    print(f"{same} of {len(every)} logged step losses equal the uninterrupted run's exactly "
          f"({len(after)} after the resume from step {after[0]['step'] if after else '-'}, {replayed} of them replayed)")
    if not after or same != len(every):
        fail("resume is not exact: logged losses differ from the uninterrupted run's")


def case_stem_restarts_quickly(args):
    """The Stem is back before its neighbours' peer_timeout_s ran out: they see its hello mid-run."""
    case_kill_stem_resume(args, peer_timeout=10, downtime=0.5)


def case_frozen_stem(args):
    """SIGSTOP the Stem: only ZMTP heartbeats can tell (its connections stay open). The neighbours
    declare it lost after the heartbeat timeout (5 s) + peer_timeout_s; then it is killed and
    restarted with --resume."""
    case_kill_stem_resume(args, peer_timeout=2, downtime=1.0, freeze=True)


def case_lost_for_good(args, checkpoint_every=20):
    max_wait = 8
    s = settings(400, 2, max_wait, checkpoint_every)
    _, node_data = pct.make_node_data(args.work, args.port, 3, True, s, DATA)
    nodes = {n: Node(args.provider, node_data, n) for n in NODES}
    wait_for_steps(node_data, "node_2", 30, 120)
    killed = time.time()
    nodes["node_1"].proc.send_signal(signal.SIGKILL)
    nodes["node_1"].wait(10)
    for n in ("node_0", "node_2"):
        code = nodes[n].wait(max_wait + 2 + 30)
        took = time.time() - killed
        last = nodes[n].lines[-1][1] if nodes[n].lines else ""
        print(f"{n}: exit {code} {took:.1f} s after the kill: {last.strip()[:300]}")
        if code != 3:
            nodes[n].dump(15)
            fail(f"{n} exited {code}, expected 3 (peer lost)")
        expected = "--resume" if checkpoint_every else "checkpoint_every"
        if "node_1" not in last or expected not in last:
            fail(f"{n}'s last line does not name node_1 and {expected}: {last}")
    noticed = [nodes[n].first("is lost", killed) for n in ("node_0", "node_2")]
    if any(x is None for x in noticed):
        fail("a neighbour of the Stem never logged it lost")
    print(f"time to notice: {', '.join(f'{t - killed:.2f} s' for t, _ in noticed)} (peer_timeout_s 2)")


def case_lost_without_checkpoints(args):
    """checkpoint_every 0: nothing to resume from, so no pause: exit 3 naming the Stem, with a hint."""
    case_lost_for_good(args, checkpoint_every=0)


def expect_reference_weights(reference, node_data):
    """Every node's trained_stage.pt in NODE_DATA equals the uninterrupted run's, bit for bit."""
    import torch
    for n in NODES:
        a = torch.jit.load(os.path.join(reference, "nodes", n, "trained_stage.pt")).state_dict()
        b = torch.jit.load(os.path.join(node_data, "nodes", n, "trained_stage.pt")).state_dict()
        worst = max(float((a[k].double() - b[k].double()).abs().max()) if a[k].numel() else 0.0 for k in a)
        print(f"{n}: largest weight difference to the uninterrupted run {worst:.3g}")
        if worst != 0.0:
            fail(f"{n}'s weights differ from the uninterrupted run's")


def case_sigterm_resume(args):
    s = settings(STEPS, 2, 60, 20)
    reference = reference_run(args, "reference", s)
    _, node_data = pct.make_node_data(os.path.join(args.work, "run"), args.port, 3, True, s, DATA)
    nodes = {n: Node(args.provider, node_data, n) for n in NODES}
    wait_for_steps(node_data, "node_2", KILL_AT, 120)
    nodes["node_1"].proc.send_signal(signal.SIGTERM)
    for n in NODES:
        code = nodes[n].wait(60)
        result = json.load(open(os.path.join(node_data, "nodes", n, "result.json")))
        print(f"{n}: exit {code}, stopped at step {result['steps']}")
        if code != 0 or not result.get("stopped"):
            nodes[n].dump(15)
            fail(f"{n}: exit {code}, stopped {result.get('stopped')}: expected 0 and true")
    nodes = {n: Node(args.provider, node_data, n, ["--resume"]) for n in NODES}
    for n in NODES:
        if nodes[n].wait(180) != 0:
            nodes[n].dump(15)
            fail(f"{n} did not finish after --resume")
    expect_reference_weights(reference, node_data)


HOLD_AT = 30  # sigterm_while_waiting: the Root holds before this step (the checkpoint of 20 written)


def wait_for_line(node, text, limit):
    deadline = time.time() + limit
    while time.time() < deadline:
        found = node.first(text)
        if found:
            return found[1]
        if node.proc.poll() is not None:
            break
        time.sleep(0.1)
    node.dump(15)
    fail(f"{node.name}: no line with {text!r} within {limit} s")


def case_sigterm_while_waiting(args):
    s = settings(STEPS, 2, 60, 20)
    s["timeouts"]["peer_s"] = 600  # without the give-up, the Stem would wait this long
    reference = reference_run(args, "reference", s)
    _, node_data = pct.make_node_data(os.path.join(args.work, "run"), args.port, 3, True, s, DATA)
    release = os.path.join(args.work, "release")
    os.environ["CAIRN_TEST_HOLD"] = f"0:{HOLD_AT}:{release}"
    nodes = {n: Node(args.provider, node_data, n) for n in NODES}
    wait_for_line(nodes["node_0"], f"test hold: before step {HOLD_AT}", 120)
    nodes["node_1"].proc.send_signal(signal.SIGTERM)
    for n in ["node_1", "node_2"]:  # the Root is held: it stops once released, below
        code = nodes[n].wait(60)
        result = json.load(open(os.path.join(node_data, "nodes", n, "result.json")))
        print(f"{n}: exit {code}, stopped {result.get('stopped')}")
        if code != 0 or not result.get("stopped"):
            nodes[n].dump(15)
            fail(f"{n}: exit {code}, stopped {result.get('stopped')}: expected 0 and true")
    gave_up = nodes["node_1"].first("a stop was asked and")
    if not gave_up:
        nodes["node_1"].dump(15)
        fail("the Stem did not say why it left mid-step")
    print("node_1:", gave_up[1].split("] ", 1)[-1])
    open(release, "w").close()
    code = nodes["node_0"].wait(60)
    if code != 0 or not json.load(open(os.path.join(node_data, "nodes", "node_0", "result.json"))).get("stopped"):
        nodes["node_0"].dump(15)
        fail(f"node_0 (released) exit {code}: expected 0, stopped")
    del os.environ["CAIRN_TEST_HOLD"]
    nodes = {n: Node(args.provider, node_data, n, ["--resume"]) for n in NODES}
    for n in NODES:
        if nodes[n].wait(180) != 0:
            nodes[n].dump(15)
            fail(f"{n} did not finish after --resume")
    resumed = nodes["node_2"].first("the cluster agreed on step")
    print("node_2:", resumed[1].split("] ", 1)[-1] if resumed else "(no agreement line)")
    expect_reference_weights(reference, node_data)


def main():
    pct.main_of(["reference", "kill_stem_resume", "stem_restarts_quickly", "frozen_stem", "lost_for_good",
                 "lost_without_checkpoints", "sigterm_resume", "sigterm_while_waiting"], globals(),
                lambda parser: parser.add_argument(
                    "--reference", help="the `reference` case's --work folder (its finished run)"))


if __name__ == "__main__":
    main()
