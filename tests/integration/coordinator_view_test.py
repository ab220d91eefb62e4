#!/usr/bin/python3
"""The coordinator sees the whole run (issue L, data half): real `clusterize --serve` and
`provider --join` processes on tcp loopback (helpers from volunteer_harness.py). No sleeps stand in
for synchronisation: each step waits for the line or file that says the previous one happened.

    coordinator_view_test.py CASE --provider BUILD/node/provider --clusterize BUILD/clusterize/clusterize --work DIR

CASE:
  stream_and_restart  3 volunteers form one 3-stage pipeline (150 steps, evaluations every 50).
                    The coordinator is SIGKILLed once the Leaf has written 5 step records and
                    started again after 20 more. Afterwards the coordinator's metrics.jsonl holds,
                    for every node, exactly the records the volunteer wrote to its own
                    metrics.jsonl, in its order, each once (none lost while it was down, none
                    taken twice from a resend; the volunteers' queues dropped none), plus each
                    node's state changes ("finished") and the Root's run plan (150 steps);
                    tools/plot_metrics reads the same records from it; the coordinator's live
                    view (plain lines, --view-every-s 1) ends showing the cluster at step 150/150.
                    While the restarted coordinator serves, its /metrics (--web 0) is parsed and
                    checked against the volunteers' own metrics.jsonl: the cluster's step, loss,
                    samples/s (the mean of its Leaf's last 20 steps) and ETA; each node's mean
                    compute/send/wait seconds over its last 20 steps the coordinator holds (fewer
                    while a restarted one has not had the backlog yet); nothing dropped.
                    Prints the Leaf's median step time with the coordinator up and down (no
                    assertion: timings are not tested).
"""
import math
import re
import urllib.request
import importlib.machinery
import importlib.util
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import volunteer_harness as vt  # noqa: E402

REPO = vt.REPO
fail = vt.fail


def lines_of(path):
    """The complete lines of a JSON-lines file another process may be appending to."""
    if not os.path.exists(path):
        return []
    return [json.loads(l) for l in open(path) if l.endswith("\n")]


def parse_prometheus(text):
    """{(name, frozenset(labels.items())): value} from Prometheus' text exposition format."""
    samples = {}
    sample = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
    label = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)",?')
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = sample.match(line)
        if not m:
            fail(f"/metrics: not a sample line: {line!r}")
        labels = {}
        for key, value in label.findall(m.group(2) or ""):
            labels[key] = re.sub(r"\\(.)", lambda e: "\n" if e.group(1) == "n" else e.group(1), value)
        samples[(m.group(1), frozenset(labels.items()))] = float(m.group(3))
    return samples


def mean(values):
    total = 0.0
    for v in values:
        total += v
    return total / len(values)


def check_metrics_endpoint(url, placed, leaf, steps):
    """One scrape of /metrics against the volunteers' own files (read after the scrape: they
    only grow, and each figure names the step it comes from)."""
    with urllib.request.urlopen(url + "metrics", timeout=10) as response:
        text = response.read().decode()
    m = parse_prometheus(text)
    get = lambda name, **labels: m.get((name, frozenset(labels.items())))
    own = {name: [r for r in lines_of(path) if "step" in r and "loss" in r] for name, path in placed.items()}
    s = int(get("cairn_cluster_step", cluster="0"))
    leaf_records = [r for r in own[leaf] if r["step"] <= s]
    if not leaf_records or leaf_records[-1]["step"] != s:
        fail(f"/metrics: cluster step {s} is not a step {leaf} recorded")
    if get("cairn_cluster_loss", cluster="0") != leaf_records[-1]["loss"]:
        fail(f"/metrics: cluster loss {get('cairn_cluster_loss', cluster='0')} != {leaf}'s step {s} loss {leaf_records[-1]['loss']}")
    sps = mean([r["samples_per_s"] for r in leaf_records[-20:]])
    if not math.isclose(get("cairn_cluster_samples_per_second", cluster="0"), sps, rel_tol=1e-9):
        fail(f"/metrics: samples/s {get('cairn_cluster_samples_per_second', cluster='0')}, the Leaf's last 20: {sps}")
    if get("cairn_cluster_max_steps", cluster="0") != steps:
        fail(f"/metrics: max steps {get('cairn_cluster_max_steps', cluster='0')}, expected {steps}")
    if not math.isclose(get("cairn_cluster_eta_seconds", cluster="0"), (steps - s) * 32 / sps, rel_tol=1e-9):
        fail("/metrics: the ETA is not (max_steps - step) * batch / samples_per_s")
    if get("cairn_records_dropped_total") != 0:
        fail(f"/metrics: {get('cairn_records_dropped_total')} records dropped")
    for name, records in own.items():
        for key, metric in (("compute_s", "cairn_node_compute_seconds"), ("send_s", "cairn_node_send_seconds"),
                            ("wait_s", "cairn_node_wait_seconds")):
            value = get(metric, node=name, cluster="0")
            # The coordinator holds some first k of the node's records (in order, each once; a
            # restarted one may not have the backlog yet): its figure is the mean of the last
            # min(20, k) of them.
            windows = [mean([r[key] for r in records[max(0, k - 20):k]]) for k in range(1, len(records) + 1)]
            if value is None or not any(math.isclose(value, w, rel_tol=1e-9) for w in windows):
                fail(f"/metrics: {metric} of {name} = {value} is no mean of its last min(20, k) steps "
                     f"for any first k of its {len(records)} step records")
    print(f"/metrics at cluster step {s}: loss, samples/s, ETA and every node's time split match the "
          f"volunteers' metrics.jsonl")
    return s


def plot_metrics_module():
    loader = importlib.machinery.SourceFileLoader("plot_metrics", os.path.join(REPO, "tools/plot_metrics"))
    spec = importlib.util.spec_from_loader("plot_metrics", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def case_stream_and_restart(args):
    steps = 150
    flags = ["--min-volunteers", "3", "--clusters", "1", "--cuts", "7,14", "--view-every-s", "1", "--web", "0"]
    run = vt.start_run(args, steps, 500, flags, 3, {"eval_every": 50}, restartable=True)
    out, volunteers = run.out, run.volunteers
    with run:
        run.join(3, ["--result-wait-s", "600"])
        run.wait_planned(1)
        chain = json.load(open(os.path.join(out, "plan.json")))["clusters"][0]["chain"]
        leaf = chain[-1]
        metrics, at_kill, at_restart = run.restart_coordinator()
        url = run.coordinator.wait_for(lambda l: l.startswith("web view: http://"), 10, "'web view: URL'").split()[2]
        placed = {}
        for _, workdir in volunteers:
            for name in os.listdir(os.path.join(workdir, "node_data", "nodes")):
                placed[name] = os.path.join(workdir, "node_data", "nodes", name, "metrics.jsonl")

        def scraped_after_restart():
            # The cluster has gone on past the restart, and the restarted coordinator holds step
            # records of every node (a node's backlog arrives on its own schedule: one it has not
            # resent yet has no time split to check).
            with urllib.request.urlopen(url + "metrics", timeout=10) as response:
                m = parse_prometheus(response.read().decode())
            step = m.get(("cairn_cluster_step", frozenset({("cluster", "0")})))
            every_node = all(m.get(("cairn_node_compute_seconds", frozenset({("node", n), ("cluster", "0")})))
                             is not None for n in placed)
            return step is not None and step >= at_restart + 5 and every_node
        vt.wait_until(scraped_after_restart, 300,
                      "/metrics showing steps after the restart and step records of every node")
        check_metrics_endpoint(url, placed, leaf, steps)
        run.all_finish()

    # Every node's own records, as the coordinator holds them.
    run_lines = lines_of(os.path.join(out, "metrics.jsonl"))
    keys = [(l["stream"], l["seq"]) for l in run_lines]
    if len(keys) != len(set(keys)):
        fail("the coordinator's metrics.jsonl holds a record twice (a resend taken again)")
    by_node = {}
    for l in run_lines:
        by_node.setdefault(l["node"], []).append(l)
    if sorted(placed) != sorted(chain):
        fail(f"the volunteers hold {sorted(placed)}, the plan {chain}")
    plot = plot_metrics_module().load_nodes(out)
    plotted = {n["spec"]["name"]: n["records"] for n in plot}
    for name, own_path in sorted(placed.items()):
        own = lines_of(own_path)
        held = [l for l in by_node.get(name, []) if "state" not in l and "plan" not in l]
        for l in held:
            if l["cluster"] != 0:
                fail(f"{name}: a record tagged cluster {l['cluster']}, expected 0")
        stripped = [{k: v for k, v in l.items() if k not in ("node", "cluster", "stream", "seq")} for l in held]
        step_count = sum(1 for r in own if "step" in r)
        if step_count != steps:
            fail(f"{name} wrote {step_count} step records, expected {steps}")
        if stripped != own:
            first = next((i for i, (a, b) in enumerate(zip(stripped, own)) if a != b), min(len(own), len(stripped)))
            fail(f"{name}: the coordinator holds {len(stripped)} records, the volunteer wrote {len(own)}; "
                 f"first difference at record {first}")
        if plotted.get(name) != own:
            fail(f"{name}: tools/plot_metrics does not read the volunteer's records from the coordinator's file")
        states = [l["state"] for l in by_node[name] if "state" in l]
        if states[-1:] != ["finished"]:
            fail(f"{name}: its state changes end {states}, expected 'finished'")
        print(f"{name}: all {len(own)} records ({step_count} steps) at the coordinator, each once, in order; "
              f"states {states}")
    plans = [l["plan"] for l in by_node[chain[0]] if "plan" in l]
    if not plans or plans[0]["total_steps"] != steps:
        fail(f"the Root's plan is {plans}, expected total_steps {steps}")
    # The live view's last frame (the plain lines) shows the cluster done.
    run.coordinator.wait_for(lambda l: l.startswith(f"cluster 0: step {steps}/{steps}"), 5,
                             f"'cluster 0: step {steps}/{steps}' in the live view")
    # The Leaf's step times with the coordinator up and down (batch / samples_per_s), printed only.
    leaf_steps = [r for r in lines_of(metrics) if "step" in r and "samples_per_s" in r]
    def median_ms(rs):
        return 1000 * statistics.median(32 / r["samples_per_s"] for r in rs) if rs else float("nan")
    # While down: from the kill to the restart. Up: as many steps right after the restart (the
    # restarted coordinator's catch-up included), and the rest of the run after step 10.
    down = [r for r in leaf_steps if max(at_kill, 10) < r["step"] <= at_restart]
    after = [r for r in leaf_steps if at_restart < r["step"] <= at_restart + len(down)]
    up = [r for r in leaf_steps if r["step"] > 10 and not (at_kill < r["step"] <= at_restart)]
    print(f"Leaf median step time: {median_ms(down):.1f} ms while the coordinator was down "
          f"({len(down)} steps), {median_ms(after):.1f} ms for as many steps after its restart, "
          f"{median_ms(up):.1f} ms over all steps > 10 with it up ({len(up)} steps)")


def main():
    vt.main_of(["stream_and_restart"], globals())


if __name__ == "__main__":
    main()
