#!/usr/bin/python3
"""Per-step bookkeeping against the training time (issue [I] part 3: "well under 1% of a step").

    tools/bench/bookkeeping.py NODE_DATA [NODE_DATA …]

Reads every nodes/*/metrics.jsonl under each NODE_DATA (a finished run: `tools/demo.sh` leaves
one, as does any provider run) and prints, per node, the "done" record's `bookkeeping_s` (every
step's metrics line, observer and progress line, the stop polling and the Root's deal check;
trainer/StepRecorder.h) against its `train_seconds` (the steps only), and the share over all nodes.
A run without those fields (an older provider) is named and skipped. Exit 2 when no node has them.
"""
import glob
import json
import os
import sys


def main():
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        sys.exit(0 if len(sys.argv) >= 2 else 2)
    rows = []
    for node_data in sys.argv[1:]:
        paths = sorted(glob.glob(os.path.join(node_data, "nodes", "*", "metrics.jsonl")))
        if not paths:
            print(f"{node_data}: no nodes/*/metrics.jsonl", file=sys.stderr)
        for path in paths:
            done = None
            steps = 0
            with open(path) as f:
                for line in f:
                    try:
                        r = json.loads(line)
                    except json.JSONDecodeError:
                        continue
                    if isinstance(r, dict) and "done" in r:
                        done = r["done"]
                    elif isinstance(r, dict) and "step" in r and "loss" in r:
                        steps += 1
            name = os.path.basename(os.path.dirname(path))
            if not isinstance(done, dict) or "bookkeeping_s" not in done or "train_seconds" not in done:
                print(f"{path}: no done record with bookkeeping_s and train_seconds; skipped", file=sys.stderr)
                continue
            rows.append((name, steps, float(done["bookkeeping_s"]), float(done["train_seconds"])))
    if not rows:
        sys.exit(2)
    print(f"{'node':<10} {'steps':>6} {'bookkeeping s':>14} {'train s':>9} {'per step ms':>12} {'share':>8}")
    for name, steps, b, t in rows:
        per = 1000 * b / steps if steps else float("nan")
        print(f"{name:<10} {steps:>6} {b:>14.4f} {t:>9.2f} {per:>12.4f} {100 * b / t:>7.3f}%")
    total_b = sum(r[2] for r in rows)
    total_t = sum(r[3] for r in rows)
    print(f"all nodes: {100 * total_b / total_t:.3f}% of the training time")


if __name__ == "__main__":
    main()
