#!/usr/bin/python3
"""PNG charts of tools/bench/run_all's figures (matplotlib, Debian's python3-matplotlib).

    /usr/bin/python3 tools/bench/charts.py RAW.json OUTDIR

RAW.json is what run_all saves next to BENCHMARKS.md's figures: {table name: [rows]} with the
rows exactly as the benchmark programs printed them. Writes OUTDIR/bench_<table>.png for each
table present; prints the files written.
"""
import json
import os
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def save(fig, outdir, name, written):
    path = os.path.join(outdir, f"bench_{name}.png")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    written.append(path)


def transport(rows, outdir, written):
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    for ax, kind in zip(axes, ("tcp", "ipc")):
        rs = sorted((r for r in rows if r["transport"] == kind), key=lambda r: r["bytes"])
        if not rs:
            continue
        x = [r["bytes"] for r in rs]
        ax.plot(x, [r["cairn_gbps"] for r in rs], "o-", label="cairn codec + transport")
        ax.plot(x, [r["raw_gbps"] for r in rs], "s--", label="raw ZeroMQ")
        ax.plot(x, [r["memcpy_gbps"] for r in rs], ":", color="grey", label="memcpy")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message size (bytes)")
        ax.set_title(f"one tensor between two processes, {kind}")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("GB/s")
    axes[0].legend()
    save(fig, outdir, "transport", written)


def allreduce(rows, outdir, written):
    rounds = {}
    for r in rows:
        rounds.setdefault((r["ranks"], r["bytes"], r["impl"]), []).extend(r["rounds_s"])
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for n in sorted({k[0] for k in rounds}):
        for impl, style in (("cairn", "o-"), ("gloo", "s--")):
            sizes = sorted(k[1] for k in rounds if k[0] == n and k[2] == impl)
            ax.plot([b / 1e6 for b in sizes], [b / statistics.median(rounds[(n, b, impl)]) / 1e9 for b in sizes],
                    style, label=f"{impl}, {n} processes")
    ax.set_xscale("log")
    ax.set_xlabel("float32 tensor (MB)")
    ax.set_ylabel("algorithm bandwidth (GB/s)")
    ax.set_title("ring all-reduce: cairn vs torch.distributed gloo")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save(fig, outdir, "allreduce", written)


def pipeline(rows, outdir, written):
    models = sorted({r["model"] for r in rows})
    fig, axes = plt.subplots(2, len(models), figsize=(5 * len(models), 6.5), squeeze=False)
    for col, model in enumerate(models):
        top, bottom = axes[0][col], axes[1][col]
        for p in sorted({r["stages"] for r in rows if r["model"] == model}):
            for schedule, style in (("sync", "o-"), ("async", "s--")):
                rs = [r for r in rows if r["model"] == model and r["stages"] == p and r["schedule"] == schedule
                      and "ratio" in r]
                if not rs:
                    continue
                m = [r["microbatches"] for r in rs]
                top.plot(m, [r["ratio"] for r in rs], style, label=f"P={p} {schedule}")
                bottom.plot(m, [r["bubble"] for r in rs], style, label=f"P={p} {schedule} measured")
            rs = sorted({r["microbatches"] for r in rows if r["model"] == model and r["stages"] == p})
            bottom.plot(rs, [(p - 1) / (m + p - 1) for m in rs], ":", color="grey")
        top.axhline(1.0, color="grey", lw=0.8)
        top.set_title(f"{model}: pipeline / single process samples/s")
        bottom.set_title(f"{model}: bubble fraction (dotted: (P-1)/(M+P-1))")
        for ax in (top, bottom):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("micro-batches M")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    save(fig, outdir, "pipeline", written)


def training(ddp, clusters, outdir, written):
    bars = []
    for r in ddp or []:
        if "samples_per_s" in r["ours"]:
            bars.append((r["case"].replace("ours_", "cairn "), r["ours"]["samples_per_s"]))
        if r.get("theirs") and "samples_per_s" in r["theirs"]:
            bars.append((r["peer"].replace("pytorch_", "PyTorch "), r["theirs"]["samples_per_s"]))
    for r in clusters or []:
        label = {"one_cluster": "1x2 nodes"}.get(r["case"], r["case"])
        if r["case"].startswith("schedule_"):
            label = f"1x2 {r['schedule']}"
        elif r["case"] != "one_cluster":
            label = f"2x2 {r['case']}"
        bars.append((label, r["samples_per_s"]))
    if not bars:
        return
    fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(bars)), 3.8))
    ax.bar(range(len(bars)), [b[1] for b in bars], color=["C0" if "cairn" in b[0] or "x" in b[0] else "C1"
                                                        for b in bars])
    ax.set_xticks(range(len(bars)))
    ax.set_xticklabels([b[0] for b in bars], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("samples/s")
    ax.set_title("Fashion-MNIST CNN training throughput (tables 4 and 7)")
    ax.grid(axis="y", alpha=0.3)
    save(fig, outdir, "training", written)


def memory(rows, outdir, written):
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    labels = [f"P={r['stages']} s{r['stage']}" for r in rows]
    x = range(len(rows))
    ax.bar([i - 0.2 for i in x], [r["peak_rss_bytes"] / 2**20 for r in rows], 0.4, label="peak RSS")
    ax.bar([i + 0.2 for i in x], [r["estimate_bytes"] / 2**20 for r in rows], 0.4, label="clusterize estimate")
    if rows:
        ax.axhline(rows[0]["single_peak_rss_bytes"] / 2**20, color="grey", ls=":", label="single process")
    ax.set_xticks(list(x))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylabel("MiB")
    ax.set_title("memory per node (CNN)")
    ax.legend(fontsize=8)
    save(fig, outdir, "memory", written)


def planning(rows, outdir, written):
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for u in sorted({r["units"] for r in rows}):
        rs = sorted((r for r in rows if r["units"] == u), key=lambda r: r["nodes"])
        ax.plot([r["nodes"] for r in rs], [max(r["seconds"], 1e-4) for r in rs], "o-", label=f"{u} units")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("nodes")
    ax.set_ylabel("planning time (s)")
    ax.set_title("clusterize planning scale")
    ax.grid(alpha=0.3)
    ax.legend()
    save(fig, outdir, "planning", written)


def main():
    data = json.load(open(sys.argv[1]))
    outdir = sys.argv[2]
    os.makedirs(outdir, exist_ok=True)
    written = []
    for name, draw in (("transport", transport), ("allreduce", allreduce), ("pipeline", pipeline),
                       ("memory", memory), ("planning", planning)):
        if data.get(name):
            draw(data[name], outdir, written)
    if data.get("ddp") or data.get("clusters"):
        training(data.get("ddp"), data.get("clusters"), outdir, written)
    for w in written:
        print(w)


if __name__ == "__main__":
    main()
