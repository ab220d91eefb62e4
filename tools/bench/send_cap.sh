#!/usr/bin/env bash
# What `provider --join --max-mbps` (docs/OPERATIONS.md "Running as a service", the volunteer's
# limits) does to what a volunteer sends. The same run twice on this machine, side by side: a
# coordinator (clusterize --serve, 1 cluster x 3 stages of examples/fashion_mnist on Fashion-MNIST)
# and 3 volunteers, once without a cap, once with --max-mbps RATE on every volunteer (checkpoint
# uploads off, so the training transport gets all of it). Prints per stage the Mbit/s it sent
# while training (the sum of its metrics.jsonl step records' sent_bytes over its "done" record's
# train_seconds) in both runs, and the run's training time with and without the cap. A benchmark,
# not a test.
#
#   tools/bench/send_cap.sh                   # 100 steps, 40 Mbit/s
#   tools/bench/send_cap.sh --steps 200 --rate 10
#
# Environment: CAIRN_BUILD_DIR (default build).
set -euo pipefail
cd "$(dirname "$0")/../.."

steps=100
rate=40
while [[ $# -gt 0 ]]; do
  case "$1" in
    --steps) steps=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    *) echo "send_cap.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
# shellcheck source=tools/bench/volunteer_runs.sh
source tools/bench/volunteer_runs.sh
volunteer_bench_setup send_cap.sh
write_fashion_job send_cap "$steps"

# Checkpoint uploads off: the training transport gets all of --max-mbps.
run_volunteers "$work/free" --upload-mbps 0
run_volunteers "$work/capped" --upload-mbps 0 --max-mbps "$rate"

/usr/bin/python3 - "$work" "$rate" "$steps" <<'EOF'
import json, os, sys
work, rate, steps = sys.argv[1], float(sys.argv[2]), sys.argv[3]
def figures(run):
    d = os.path.join(work, run)
    plan = json.load(open(os.path.join(d, "coordinator", "plan.json")))["clusters"][0]["chain"]
    out = {}
    for v in os.listdir(d):
        nodes = os.path.join(d, v, "node_data", "nodes")
        if not os.path.isdir(nodes):
            continue
        for node in os.listdir(nodes):
            records = [json.loads(l) for l in open(os.path.join(nodes, node, "metrics.jsonl"))]
            sent = sum(r.get("sent_bytes", 0) for r in records if "step" in r)
            seconds = next(r["done"]["train_seconds"] for r in records if "done" in r)
            out[plan.index(node)] = (sent, seconds)
    return out
free, capped = figures("free"), figures("capped")
names = {0: "Root", 1: "Stem", 2: "Leaf"}
print(f"{steps} steps, 1 cluster x 3 stages (fashion_mnist example), checkpoint uploads off")
for stage in sorted(free):
    (fs, ft), (cs, ct) = free[stage], capped[stage]
    print(f"  {names[stage]}: no cap {fs * 8 / ft / 1e6:.1f} Mbit/s ({fs / 1e6:.1f} MB in {ft:.2f} s); "
          f"--max-mbps {rate:g}: {cs * 8 / ct / 1e6:.1f} Mbit/s ({cs / 1e6:.1f} MB in {ct:.2f} s)")
ft = max(t for _, t in free.values())
ct = max(t for _, t in capped.values())
print(f"training time: no cap {ft:.2f} s, capped {ct:.2f} s, ratio {ct / ft:.2f}")
EOF
