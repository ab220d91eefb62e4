#!/usr/bin/env bash
# What background checkpoint uploads (provider --join --upload-mbps, docs/OPERATIONS.md
# "Volunteers join") cost a training step. The same run twice on this machine: a coordinator
# (clusterize --serve, 1 cluster x 3 stages of examples/fashion_mnist on Fashion-MNIST) and 3
# volunteers, checkpointing every --every steps of --steps; once with --upload-mbps RATE, once with
# --upload-mbps 0 (uploads off). The runs alternate --repeats times. Prints, per setting, the
# median step time of the Leaf (compute_s + send_s + wait_s of its metrics.jsonl step records, the
# first 5 steps left out as warm-up), the ratio with/without, and the bytes and seconds of each
# upload from the volunteers' logs. A benchmark, not a test.
#
#   tools/bench/checkpoint_upload_cost.sh                  # 200 steps, every 10, 50 Mbit/s, 1 repeat
#   tools/bench/checkpoint_upload_cost.sh --steps 400 --every 5 --rate 10 --repeats 3
#
# Environment: CAIRN_BUILD_DIR (default build).
set -euo pipefail
cd "$(dirname "$0")/../.."

steps=200
every=10
rate=50
repeats=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --steps) steps=$2; shift 2 ;;
    --every) every=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    *) echo "checkpoint_upload_cost.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
# shellcheck source=tools/bench/volunteer_runs.sh
source tools/bench/volunteer_runs.sh
volunteer_bench_setup checkpoint_upload_cost.sh
write_fashion_job ckpt_cost "$steps" " \"checkpoint_every\": $every,"

# One run with --upload-mbps $1 in $work/run_$2; its Leaf's step times go to $work/steps_$1.txt,
# the upload lines to $work/uploads_$1.txt.
one_run() {
  local mbps=$1 dir=$work/run_$2
  run_volunteers "$dir" --upload-mbps "$mbps"
  /usr/bin/python3 - "$dir" >>"$work/steps_$mbps.txt" <<'EOF'
import json, os, sys
d = sys.argv[1]
leaf = json.load(open(os.path.join(d, "coordinator", "plan.json")))["clusters"][0]["chain"][-1]
for v in os.listdir(d):
    m = os.path.join(d, v, "node_data", "nodes", leaf, "metrics.jsonl")
    if os.path.exists(m):
        for line in open(m):
            r = json.loads(line)
            if "step" in r and r["step"] > 5:
                print(r["compute_s"] + r["send_s"] + r["wait_s"])
EOF
  grep -h "uploaded checkpoint step" "$dir"/volunteer_*.log >>"$work/uploads_$mbps.txt" || true
}

n=0
for r in $(seq "$repeats"); do
  one_run "$rate" $((n++))
  one_run 0 $((n++))
done

/usr/bin/python3 - "$work" "$rate" "$steps" "$every" <<'EOF'
import re, statistics, sys
work, rate, steps, every = sys.argv[1:]
def median(mbps):
    return statistics.median(float(x) for x in open(f"{work}/steps_{mbps}.txt"))
on, off = median(rate), median("0")
print(f"{steps} steps, a checkpoint every {every}, 1 cluster x 3 stages (fashion_mnist example)")
print(f"median Leaf step time (compute_s+send_s+wait_s): uploads at {rate} Mbit/s {on*1e3:.3f} ms, "
      f"uploads off {off*1e3:.3f} ms, ratio {on/off:.3f}")
by_size = {}
try:
    for line in open(f"{work}/uploads_{rate}.txt"):
        m = re.search(r"\[(\S+)\] uploaded checkpoint step (\d+): (\d+) bytes in (\S+) s", line)
        if m:
            by_size.setdefault(int(m.group(3)), []).append(float(m.group(4)))
except FileNotFoundError:
    pass
# Node names differ from run to run (the order of joining); a stage's checkpoint size does not.
for size, secs in sorted(by_size.items()):
    print(f"  a stage with {size} bytes per checkpoint: {len(secs)} uploads, median {statistics.median(secs)*1e3:.2f} ms "
          f"(send to acknowledgement), max {max(secs)*1e3:.2f} ms")
if not by_size:
    print("  no upload lines found in the volunteers' logs")
EOF
