#!/usr/bin/python3
"""The tables of tools/bench/run_all: each table_X(smoke) runs its benchmark side by side with its
reference and returns the table's markdown lines; the raw rows go into DATA (run_all's headline,
charts and bench_raw.json read them). run/json_lines/shown: the commands, echoed."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("CAIRN_BUILD_DIR", os.path.join(ROOT, "build"))


def run(cmd, timeout=1800):
    """Run a command, echoing it; return stdout. Fails loudly with the command's stderr."""
    print("run_all: $ " + " ".join(cmd), file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout + proc.stderr)
        raise SystemExit(f"run_all: command failed with exit code {proc.returncode}: {' '.join(cmd)}")
    return proc.stdout


def json_lines(text):
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def shown(cmd):
    return " ".join(os.path.relpath(c, ROOT) if c.startswith(ROOT) else c for c in cmd)


def human_bytes(n):
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} B"


# ---- tables ----------------------------------------------------------------------------------

def table_transport(smoke):
    sizes = "4K" if smoke else "4K,64K,1M,16M,64M,256M"
    rounds = "1" if smoke else "3"
    out = ["## 1. Transport: one tensor between two processes", ""]
    for kind in ("tcp", "ipc"):
        cmd = [os.path.join(BUILD, "tools/bench/bench_transport"), "--sizes", sizes, "--rounds", rounds,
               "--transport", kind, "--json"]
        rows = json_lines(run(cmd))
        DATA.setdefault("transport", []).extend(dict(r, transport=kind) for r in rows)
        out += [f"`{shown(cmd)}`", "",
                f"| size ({kind}) | cairn codec+transport GB/s | raw ZeroMQ GB/s | cairn / raw | memcpy GB/s (ceiling) |",
                "|---:|---:|---:|---:|---:|"]
        for r in rows:
            out.append(f"| {human_bytes(r['bytes'])} | {r['cairn_gbps']:.3f} | {r['raw_gbps']:.3f} | "
                       f"{r['cairn_gbps'] / r['raw_gbps']:.2f} | {r['memcpy_gbps']:.2f} |")
        out.append("")
    out += ["Median of the timed rounds after one warm-up; each round moves at least 256 MiB "
            "(messages of the given size), cairn and raw alternate round by round. memcpy is a "
            "single-process copy of the same size (small sizes stay in cache).", ""]
    return out


def table_allreduce(smoke):
    import statistics
    import tempfile
    sizes = "1" if smoke else "1,10,100,256"
    ranks = "2" if smoke else "2,4"
    repeats = "1" if smoke else "2"
    raw = tempfile.mktemp(suffix=".jsonl", prefix="allreduce_")
    cmd = ["tools/bench/allreduce_vs_gloo.sh", "--ranks", ranks, "--sizes-mb", sizes, "--repeats", repeats,
           "--rounds", "2" if smoke else "3", "--out", raw]
    run(cmd, timeout=1800)
    rows = [json.loads(line) for line in open(raw) if line.strip()]
    DATA["allreduce"] = rows
    os.remove(raw)
    rounds = {}
    for r in rows:
        rounds.setdefault((r["ranks"], r["bytes"], r["impl"]), []).extend(r["rounds_s"])
    out = ["## 2. Ring all-reduce vs torch.distributed (gloo)", "", f"`{' '.join(cmd[:-2])}`", "",
           "| processes | size | cairn s | cairn GB/s | gloo s | gloo GB/s | cairn / gloo |",
           "|---:|---:|---:|---:|---:|---:|---:|"]
    for n, nbytes in sorted({(k[0], k[1]) for k in rounds}):
        ours = statistics.median(rounds[(n, nbytes, "cairn")])
        gloo = statistics.median(rounds[(n, nbytes, "gloo")])
        out.append(f"| {n} | {nbytes / 1e6:g} MB | {ours:.4f} | {nbytes / ours / 1e9:.3f} | {gloo:.4f} | "
                   f"{nbytes / gloo / 1e9:.3f} | {gloo / ours:.2f}× |")
    out += ["", "float32, in place; algorithm bandwidth = bytes / seconds. The two implementations "
            "alternate run by run (warm-up rounds excluded) and each cell is the median over all timed "
            "rounds. gloo is Debian's python3-torch 1.13 `torch.distributed.all_reduce`.", ""]
    return out


def table_planning(smoke):
    units = [50] if smoke else [50, 200, 800]
    nodes = [10] if smoke else [10, 100, 1000, 10000]
    out = ["## 6. Planning scale", "",
           "`build/tools/bench/bench_planning --units U --nodes N` (profiling excluded: synthetic unit costs)", "",
           "| units \\ nodes | " + " | ".join(str(n) for n in nodes) + " |",
           "|---:|" + "---:|" * len(nodes)]
    for u in units:
        cells = []
        for n in nodes:
            text = run([os.path.join(BUILD, "tools/bench/bench_planning"), "--units", str(u), "--nodes", str(n)])
            line = [l for l in text.splitlines() if l.startswith("planning time:")][0]
            seconds = float(line.split()[2])
            clusters = [l for l in text.splitlines() if l.startswith("clusters:")][0].split(",")[0].split()[1]
            cells.append(f"{seconds:.3f} s ({clusters} clusters)")
            DATA.setdefault("planning", []).append({"units": u, "nodes": n, "seconds": seconds})
        out.append(f"| {u} | " + " | ".join(cells) + " |")
    out += ["", "Wall time of cluster formation, the exact DP partition per cluster and ring grouping.", ""]
    return out


DATA = {}  # table name -> its raw rows (for the summary and the charts)
# --smoke: the training tables' providers load this slice of Fashion-MNIST's 60,000 training images
# (their few steps read fewer; every provider decoded all of them before).
SMOKE_TRAIN = 2048

TRAINING_BENCH = os.path.join(ROOT, "tools", "bench", "training_bench.py")


def training_rows(args):
    cmd = ["/usr/bin/python3", TRAINING_BENCH] + args
    return cmd, json_lines(run(cmd, timeout=3600))


def fmt(x, spec=".1f"):
    return "—" if x is None else format(x, spec)


def table_pipeline(smoke):
    if smoke:
        args = ["pipeline", "--model", "cnn", "--stages", "2", "--microbatches", "2", "--schedules", "sync,async",
                "--steps", "2", "--warmup", "1"]
    else:
        args = ["pipeline"]
    cmd, rows = training_rows(args)
    DATA["pipeline"] = rows
    out = ["## 3. Pipeline efficiency", "", f"`{shown(cmd)}`", "",
           "| model | stages P | micro-batches M | schedule | pipeline samples/s | single process samples/s "
           "(P threads) | pipeline / single | measured bubble | textbook (P−1)/(M+P−1) |",
           "|---|---:|---:|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        head = f"| {r['model']} | {r['stages']} | {r['microbatches']} | {r['schedule']} |"
        if "unavailable" in r:
            out.append(head + f" not available in this build | {fmt(r.get('single_samples_per_s'))} | — | — | "
                       f"{r['textbook_bubble']:.2f} |")
        else:
            out.append(head + f" {r['pipeline_samples_per_s']:.1f} | {r['single_samples_per_s']:.1f} | "
                       f"{r['ratio']:.2f} | {r['bubble']:.2f} | {r['textbook_bubble']:.2f} |")
    unavailable = sorted({r["unavailable"] for r in rows if "unavailable" in r})
    per_model = {}
    for r in rows:
        per_model.setdefault(r["model"], r)
    sizes = "; ".join(f"{m.upper() if m == 'cnn' else 'tiny GPT'}: batch {r['batch_size']}"
                      f"{' (Fashion-MNIST)' if m == 'cnn' else ' sequences × 64 bytes'}, {r['steps']} timed steps "
                      f"after {r.get('warmup', '?')} untimed" for m, r in per_model.items())
    out += ["", "Each (P, M): one P-node pipeline run per schedule (clusterize plan of P equal nodes at a fixed "
            "cut, its own choice on an idle machine: tools/bench/fixed_cuts.py; 1 intra-op "
            "thread per provider, loopback), then one `bench_single_process` run (the unsplit model, one "
            "process, P threads, same job.json); the single-process figure is the median of those runs for "
            f"that model and P. {sizes}. async rows: `update_frequency` = M (one optimizer step per batch, as sync), "
            "default `max_in_flight`. OMP_WAIT_POLICY=PASSIVE for every process (see the note above). "
            "Measured bubble: mean over nodes of wait_s / (compute_s + send_s + wait_s) from metrics.jsonl, "
            "steady-state steps only (waiting includes waiting on a slower stage, so it exceeds the textbook "
            "figure when stages are unbalanced)."]
    for u in unavailable:
        out.append(f"Not available: the provider refused it (exit code 2): `{u}`.")
    out.append("")
    return out


def table_demo(smoke):
    args = ["demo"] + (["--steps", "3", "--warmup", "1", "--rounds", "1", "--train-samples", str(SMOKE_TRAIN)]
                       if smoke else [])
    cmd, rows = training_rows(args)
    DATA["demo"] = rows
    runs = {r["case"]: r for r in rows if "case" in r}
    stages = next((r.get("stages", 3) for r in rows if r.get("case") == "demo_3_nodes"), 3)
    names = {"demo_3_nodes": f"the demo: clusterize's cut for its 3 nodes, {stages} stages (1 thread each)",
             "alone_1_thread": "one provider holding the whole model, 1 thread",
             "alone_2_threads": "one provider holding the whole model, 2 threads (context)"}
    out = ["## 3b. The demo against one provider alone", "", f"`{shown(cmd)}`", "",
           "| run | samples/s per round | median samples/s | demo / this |", "|---|---|---:|---:|"]
    demo = runs.get("demo_3_nodes")
    for case, r in runs.items():
        ratio = "—" if case == "demo_3_nodes" or not demo else f"{demo['samples_per_s'] / r['samples_per_s']:.2f}"
        out.append(f"| {names.get(case, case)} | {', '.join(f'{x:.0f}' for x in r['samples_per_s_runs'])} | "
                   f"{r['samples_per_s']:.1f} | {ratio} |")
    if demo:
        est = demo.get("estimated_ms_per_microbatch", {})
        out += ["", f"tools/demo.sh's job (examples/fashion_mnist/job.json: batch {demo['batch_size']}, 4 micro-batches, "
                "`sync`, 1 intra-op thread per provider), cut by clusterize for the demo's 3 equal nodes with the demo's "
                "own flags (estimated " + " / ".join(f"{v:.1f}" for _, v in sorted(est.items())) + " ms per "
                "micro-batch), against the same job on a 1-node plan. "
                f"{demo['steps']} timed steps after {demo['warmup']} untimed per run (the Leaf's step records, the "
                f"rule of table 3), {demo['rounds']} rounds, the order of the runs rotating each round; medians. "
                f"The {stages} providers share this machine's 2 cores; they reach each other over same-host links "
                "(docs/PROTOCOL.md \"Same-host links\")."]
    out.append("")
    return out


def table_ddp(smoke):
    if smoke:
        args = ["ddp", "--steps", "4", "--eval-every", "2", "--warmup", "1", "--test-samples", "200",
                "--target", "0.3", "--train-samples", "2000", "--cases", "ours_gradients,ours_pipeline"]
    else:
        # Bounded for the 20-minute budget: the first 2,000 test images, no context row (table 7
        # has parameter averaging across clusters).
        # `gradients` as a user gets it (the default 1 MiB cap: the CNN's 200 KB of gradients are
        # one bucket, reduced after the last backward), the same with sync.overlap false (the same
        # code path: the two rows show the run-to-run noise), and 64 KiB buckets (4) overlapped
        # with backward; 2 rounds alternating which side runs first.
        args = ["ddp", "--steps", "125", "--eval-every", "25", "--test-samples", "2000", "--rounds", "2",
                "--cases", "ours_gradients,ours_gradients_serial,ours_gradients_64k,ours_pipeline"]
    cmd, rows = training_rows(args)
    DATA["ddp"] = rows
    target = rows[0]["target"] if rows else None
    names = {"ours_gradients": "cairn 2 clusters × 1 node, `sync: gradients`",
             "ours_gradients_serial": "cairn 2 clusters × 1 node, `gradients` with `sync.overlap` false "
                                      "(the all-reduce after the last backward)",
             "ours_gradients_64k": "cairn 2 clusters × 1 node, `gradients` in 64 KiB buckets overlapped "
                                   "with backward",
             "ours_param_avg": "cairn 2 clusters × 1 node, parameter averaging every step (context)",
             "ours_pipeline": "cairn 1 cluster × 2 nodes pipeline (M = 4)",
             "pytorch_ddp": "PyTorch DDP (gloo), 2 processes",
             "pytorch_rpc_pipeline": "PyTorch RPC pipeline + distributed autograd, 2 processes (M = 4)"}
    out = ["## 4. Against PyTorch's own distributed training", "", f"`{shown(cmd)}`", "",
           f"| ours | samples/s | time to {fmt(target and 100 * target, '.0f')}% test acc. (s) | steps | "
           "PyTorch | samples/s | time to target (s) | steps | samples/s ours / PyTorch | time PyTorch / ours |",
           "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        o, t = r["ours"], r.get("theirs")
        if "unavailable" in o:
            left = f"| {names[r['case']]} | not available in this build | — | — |"
        else:
            left = (f"| {names[r['case']]} | {o['samples_per_s']:.1f} | {fmt(o['time_to_target_s'])} | "
                    f"{fmt(o['steps_to_target'], '.0f')} |")
        if not t:
            out.append(left + " — | — | — | — | — | — |")
            continue
        right = (f" {names[r['peer']]} | {t['samples_per_s']:.1f} | {fmt(t['time_to_target_s'])} | "
                 f"{fmt(t['steps_to_target'], '.0f')} |")
        ratio = "—" if "unavailable" in o else f"{o['samples_per_s'] / t['samples_per_s']:.2f}"
        tratio = ("—" if "unavailable" in o or o["time_to_target_s"] is None or t["time_to_target_s"] is None
                  else f"{t['time_to_target_s'] / o['time_to_target_s']:.2f}")
        out.append(left + right + f" {ratio} | {tratio} |")
    if rows:
        r = rows[0]
        out += ["", f"Same CNN, initial weights, data normalisation, global batch {r['batch_size']}, AdamW "
                f"(lr 0.003, weight decay 0.01, constant), 1 intra-op thread per process, at most {r['steps']} "
                f"steps, {r['rounds']} round(s) alternating which side runs first, medians. The accuracy target is "
                f"{100 * r['target']:.0f}% on " + (f"the first {r['test_samples']:,} Fashion-MNIST test images" if r.get('test_samples') else "the full Fashion-MNIST test set") + " (not 90%: 90% needs several epochs, "
                "too long for this table on this machine). Both sides are timed by one rule (tools/bench/step_timing.py): "
                "a step is the interval from the end of the previous step to the end of this one (batch loading, "
                "forward, backward, all-reduce / stage transfers, optimizer, per-step bookkeeping); cairn's is its "
                "metrics.jsonl step record (batch / samples_per_s), PyTorch's the same interval by time.perf_counter() "
                "on rank 0; the step after each evaluation (its interval holds the evaluation pause on both sides) "
                "counts as the median step; start-up (process spawn, data and model loading, connecting) is never "
                f"timed. Time to target = sum of step times until the first evaluation (every {r['eval_every']} steps) "
                f"at or above it; — = not reached within the steps. samples/s leaves out the first {r['warmup']} steps."
                + (f" `gradients` all-reduces in buckets of at most {r['bucket_bytes']:,} bytes overlapped with "
                   "backward (`sync.overlap`, docs/TRAINING.md \"Across clusters\"); the overlap-off row is the "
                   "same job with the all-reduce after the last backward." if r.get("bucket_bytes") else
                   " `gradients` at the default bucket cap (1 MiB): the CNN's 200 KB of gradients are one bucket, "
                   "which has nothing to overlap and is all-reduced after the last backward (as DDP's first 1 MB "
                   "bucket), so the `sync.overlap` false row runs the same code and shows the run-to-run spread; "
                   "the 64 KiB row cuts them in 4 buckets, all-reduced by a thread while backward goes on "
                   "(docs/TRAINING.md \"Across clusters\").")
                + (" Parameter averaging has no PyTorch counterpart here and is shown for context."
                   if any(x["case"] == "ours_param_avg" for x in rows) else
                   " Parameter averaging across clusters is in table 7.")]
        # Where the gradients ratio stays below 1: the step and the part of it spent in the sync.
        for x in rows:
            o, t = x["ours"], x.get("theirs") or {}
            if x["case"].startswith("ours_gradients") and o.get("samples_per_s"):
                line = (f"`{x['case']}`: step (batch / samples/s) {1000 * x['batch_size'] / o['samples_per_s']:.1f} ms"
                        + (f", of which the median wait in the sync (`sync_s`) {1000 * o['sync_s_median']:.1f} ms"
                           if o.get("sync_s_median") is not None else ""))
                ddp = next((y["theirs"] for y in rows if y["case"] == "ours_gradients" and y.get("theirs")), None)
                if ddp and ddp.get("samples_per_s"):
                    line += f"; DDP's step {1000 * x['batch_size'] / ddp['samples_per_s']:.1f} ms."
                out.append("")
                out.append(line)
        for x in rows:
            if "unavailable" in x["ours"]:
                out.append(f"Not available: the provider refused it (exit code 2): `{x['ours']['unavailable']}`.")
    out.append("")
    return out


def table_clusters(smoke, steps=None):
    if smoke:
        args = ["clusters", "--steps", "4", "--eval-every", "2", "--warmup", "1", "--test-samples", "200",
                "--modes", "gradients", "--async-steps", "2", "--async-rounds", "1",
                "--train-samples", str(SMOKE_TRAIN)]
    else:
        args = ["clusters"] + (["--steps", str(steps)] if steps else [])
    cmd, rows = training_rows(args)
    DATA["clusters"] = rows
    runs = [r for r in rows if r["case"] in ("one_cluster", "average", "diloco", "gradients")]
    pair = {r["schedule"]: r for r in rows if r["case"].startswith("schedule_")}
    out = ["## 7. Across clusters (issue [D])", "", f"`{shown(cmd)}`", ""]
    if runs:
        r0 = runs[0]
        lo, hi = r0["targets"][0], r0["targets"][-1]
        out += [f"| run | sync | samples/s | time to {100 * hi:.0f}% (s) | steps to {100 * hi:.0f}% | "
                f"time to {100 * lo:.0f}% (s) | steps to {100 * lo:.0f}% | best accuracy | steps run | sync s |",
                "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in runs:
            label = ("1 cluster × 2 nodes" if r["clusters"] == 1 else "2 clusters × 2 nodes")
            sync = "—" if not r["sync"] else f"`{r['sync']}`" + (
                f", local_steps {r['local_steps']}" if r["sync"] != "gradients" else "")
            t_hi, t_lo = r["to_target"][str(hi)], r["to_target"][str(lo)]
            out.append(f"| {label}, batch {r['batch_per_cluster']} per cluster | {sync} | {r['samples_per_s']:.1f} | "
                       f"{fmt(t_hi and t_hi['seconds'])} | {fmt(t_hi and t_hi['step'], '.0f')} | "
                       f"{fmt(t_lo and t_lo['seconds'])} | {fmt(t_lo and t_lo['step'], '.0f')} | "
                       f"{fmt(r['best_accuracy'] and 100 * r['best_accuracy'], '.1f')}% | {r['steps']} | "
                       f"{r['sync_s']:.1f} |")
        out += ["", f"Fashion-MNIST CNN (examples/fashion_mnist), 2 pipeline stages per cluster (clusterize plans "
                f"of equal nodes, cut after the first pooling: `--cuts 7`), global batch {r0['global_batch']} (the same samples per step in every row: "
                f"2 clusters × {r0['global_batch'] // 2} or 1 × {r0['global_batch']}), micro-batches of "
                f"{r0['global_batch'] // r0['microbatches'] if r0['clusters'] == 1 else r0['batch_per_cluster'] // r0['microbatches']} "
                f"samples, AdamW lr {r0['lr']} constant, 1 intra-op thread per provider, at most "
                f"{r0['max_steps']} steps, evaluation every {r0['eval_every']} steps on the first "
                f"{r0['test_samples']} test images. Time to a target = sum of the step times (cross-cluster sync "
                f"included, evaluations and start-up excluded) until the first evaluation at or above it; — = "
                f"not reached within the steps. samples/s: all clusters' samples over the steps after the first "
                f"{r0['warmup']}. The {100 * hi:.0f}% target needs a few epochs, more than this table's budget "
                f"in the default run_all; the {100 * lo:.0f}% column is the bounded figure. "
                f"`tools/bench/run_all --only clusters --clusters-steps 1500` runs longer, towards {100 * hi:.0f}% "
                "(not part of the 20-minute budget)."]
    if pair:
        s, a = pair.get("sync"), pair.get("async")
        out += ["", "| schedule (1 cluster × 2 nodes) | samples/s (median) | runs | async / sync |", "|---|---:|---|---:|"]
        for r in (s, a):
            if r:
                out.append(f"| `{r['schedule']}` | {r['samples_per_s']:.1f} | "
                           f"{', '.join(f'{v:.0f}' for v in r['samples_per_s_runs'])} | "
                           f"{(r['samples_per_s'] / s['samples_per_s']) if s else float('nan'):.2f} |")
        if s:
            out += ["", f"Same plan, batch {s['batch_size']} in {s['microbatches']} micro-batches, "
                    f"{s['steps']} timed steps after {s['warmup']}; {s['rounds']} rounds alternating the order "
                    "(sync first, then async first, ...), median samples/s of cluster 0's leaf. async runs with "
                    f"`update_frequency` {s['microbatches']} (one optimizer step per batch, the same optimizer work "
                    "as sync) and the default `max_in_flight` (the number of stages)."]
    out.append("")
    return out


def table_rings(smoke):
    """Issue [D]: one node in several rings (clusters cut differently), rings in turn vs concurrently."""
    # (rings of the hub, MB per ring, emulated link Mbit/s or 0 for plain loopback)
    cases = ([(2, 1, 0), (3, 1, 10000)] if smoke else
             [(2, 0.1, 0), (3, 0.1, 0), (2, 4, 0), (3, 4, 0), (3, 25, 0), (2, 4, 100), (3, 4, 100)])
    rows = []
    cmds = []
    for k, mb, mbps in cases:
        rounds = "1" if smoke else ("3" if mbps else "7")
        cmd = [os.path.join(BUILD, "tools", "bench", "bench_rings"), "--rings", str(k), "--mb", str(mb),
               "--rounds", rounds, "--port", "6400"] + (["--link-mbps", str(mbps)] if mbps else [])
        cmds.append(cmd)
        rows += json_lines(run(cmd, timeout=600))
    DATA["rings"] = rows
    out = ["## 8. One node in several rings (issue [D])", "",
           "\n".join(f"`{shown(c)}`  " for c in cmds), "",
           "| rings of the hub | MB per ring | links | one after another (s) | concurrently (s) | speed-up |",
           "|---:|---:|---|---:|---:|---:|"]
    by = {(r["rings"], r["mb_per_ring"], r["link_mbps"], r["mode"]): r["median_s"] for r in rows}
    for k, mb, mbps in cases:
        seq, con = by.get((k, mb, mbps, "sequential")), by.get((k, mb, mbps, "concurrent"))
        if seq and con:
            link = f"{mbps:g} Mbit/s each (emulated)" if mbps else "loopback"
            out.append(f"| {k} | {mb:g} | {link} | {seq:.4f} | {con:.4f} | {seq / con:.2f}× |")
    out += ["", "Clusters cut differently: cluster 0 is one node (the hub) holding the whole model, cluster 1 "
            "cuts it into K stages, so the hub shares stage i's float32 weights with node i of cluster 1 in ring i "
            "(K rings of two). One `RingClusterSync::synchronize()` (`average`) per round on K + 1 processes over "
            "tcp loopback (one ZeroMQ I/O thread and one torch thread each, as the provider), timed at the hub; "
            "median of the timed rounds after one warm-up. The same binary runs both ways, one after the other: "
            "`\"sync\": {\"concurrent_rings\": false}` (ring after ring in ring id order) and the default (one "
            "thread per ring). Each process checks that every copy ends at the exact average. \"Emulated\" links: "
            "every message waits its bytes / rate in the sending thread (FaultyTransport's bandwidth fault), so "
            "each hub–volunteer link carries at most that rate each way while the hub's own connection is not "
            "the limit — the volunteer case concurrency is for. On plain loopback the machine's cores are the limit "
            "(K + 1 processes on 2 cores here): the rings move the same bytes through the same CPUs, and handing "
            "messages between a node's ring threads (one receives for all, then wakes the others) costs about "
            "what running the rings side by side saves.", ""]
    return out


def table_memory(smoke):
    args = (["memory", "--stages", "1", "--steps", "2", "--train-samples", str(SMOKE_TRAIN)] if smoke
            else ["memory", "--steps", "6"])
    cmd, rows = training_rows(args)
    DATA["memory"] = rows
    out = ["## 5. Memory", "", f"`{shown(cmd)}`", "",
           "| stages | stage | peak RSS | / single-process peak | clusterize estimate | estimate error |",
           "|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        rss, est = r["peak_rss_bytes"], r["estimate_bytes"]
        out.append(f"| {r['stages']} | {r['stage']} | {rss / 2**20:.0f} MiB | {rss / r['single_peak_rss_bytes']:.2f} | "
                   f"{est / 2**20:.0f} MiB | {100 * (est - rss) / rss:+.0f}% |")
    if rows:
        r = rows[0]
        out += ["", f"Fashion-MNIST CNN, batch {r['batch_size']} in {r['microbatches']} micro-batches, AdamW, "
                f"{r['steps']} steps. Plans made by clusterize for P equal nodes at fixed cuts "
                f"(tools/bench/fixed_cuts.py: its own choice on an idle machine); peak RSS of each provider process by `/usr/bin/time %M`; single-process peak: "
                f"`bench_single_process` on the same job.json, 1 thread (median of {r['single_runs']} runs: "
                f"{r['single_peak_rss_bytes'] / 2**20:.0f} MiB). Error = (estimate − measured) / measured. "
                "clusterize's estimate counts parameters, gradients, optimizer state and activations only; the "
                "process RSS also holds libtorch's code and allocator and the data set each provider loads, "
                "so the estimate is far below RSS on a model this small."]
    out.append("")
    return out
