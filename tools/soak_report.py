#!/usr/bin/python3
"""The soak's checks and report (tools/soak.py runs the soak, then check_and_report; on a failure
partial_report and tails).

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
  6. every fault of the schedule came due (its cluster reached its step). One that was due but
     still waiting for the run to settle when the run ended (a lagging cluster reaches a late
     fault's step near the end) is not a failure: it is listed in the report's "unfired" and said
     in the last line;
Writes WORK/report.json (the schedule, what fired when, the checks, accuracies, wall time; on a
failure or a stall past --timeout-s what fired and the step each cluster reached) and
WORK/timeline.png (who trained which node's steps when, from the metrics; faults marked; needs
Debian's python3-matplotlib, else the PNG is skipped with the reason). The report's "figures"
(`figures` below: joins to plan, each kill to its spare's first step, throughput) are measured,
never checked.
"""
import json
import os
import re
import sys
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(REPO, "tests/integration"))
import volunteer_harness as vt  # noqa: E402  (evaluation, the trained weights)

TEST_SAMPLES = 1000  # test samples each cluster's merged weights are evaluated on


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


def unfired_at_end(soak, pending, due_since):
    """The faults still pending when the coordinator ended (check 6): each must have come due (its
    cluster reached its step: `due_since`, id -> when), else the soak fails. Due ones were waiting
    for the run to settle, or for a live target: returned with how long they waited, and logged."""
    code = soak.coordinator.proc.poll()
    if any(id(e) not in due_since for e in pending):
        vt.fail(f"the coordinator ended (exit {code}) with faults pending that never came due: {pending}")
    now = time.monotonic()
    unfired = [dict(e, waited_s=round(now - due_since[id(e)], 1)) for e in pending]
    soak.log(f"the run ended before these due faults fired (waiting for the run to settle): {unfired}")
    return unfired


def check_and_report(soak, args, events, code, wall, exits):
    """The checks above, once the run ended: WORK/report.json, and exit 1 naming what failed."""
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
              "schedule": events, "dropped": args.dropped, "fired": soak.fired,
              "unfired": soak.unfired, "wall_s": round(wall, 1),
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
    unfired = f" ({len(soak.unfired)} more due but never fired: the run ended first)" if soak.unfired else ""
    print(f"soak passed: {len(soak.fired)} faults over {len(soak.volunteers)} volunteers{unfired}")


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
