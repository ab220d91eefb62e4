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
build=${CAIRN_BUILD_DIR:-build}
provider=$build/node/provider
clusterize=$build/clusterize/clusterize
for b in "$provider" "$clusterize"; do
  [[ -x $b ]] || { echo "checkpoint_upload_cost.sh: $b is not built" >&2; exit 2; }
done
fashion=/usr/share/datasets/fashion-mnist
work=$(mktemp -d /tmp/cairn_ckpt_cost.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

/usr/bin/python3 examples/fashion_mnist/make_model.py --out "$work/model.pt" >/dev/null
cat >"$work/job.json" <<EOF
{"format": 1, "job_id": "ckpt_cost", "driver": "cairn", "model": "$work/model.pt",
 "data": {"location": "$fashion", "format": "idx", "normalize": {"mean": [0.2860], "std": [0.3530]},
          "train_samples": 6000, "test_samples": 200},
 "training_definition": {"batch_size": 32, "microbatches": 4, "epochs": 0, "max_steps": $steps,
                         "seed": 3, "optimizer": {"name": "adamw", "lr": 0.003},
                         "checkpoint_every": $every,
                         "timeouts": {"startup_s": 60, "peer_s": 60}}}
EOF

free_port() { /usr/bin/python3 tools/bench/loopback_ports.py 1; }

# One run with --upload-mbps $1 in $work/run_$2; its Leaf's step times go to $work/steps_$1.txt,
# the upload lines to $work/uploads_$1.txt.
one_run() {
  local mbps=$1 dir=$work/run_$2
  mkdir -p "$dir"
  pids=()
  "$clusterize" --model "$work/model.pt" --job "$work/job.json" --input-shape 8,1,28,28 \
    --serve 127.0.0.1:0 --invite-file "$dir/invite.txt" --out "$dir/coordinator" \
    --min-volunteers 3 --clusters 1 --cuts 7,14 >"$dir/coordinator.log" 2>&1 &
  local coordinator=$!
  pids+=("$coordinator")
  for _ in $(seq 600); do [[ -s $dir/invite.txt ]] && break; sleep 0.2; done
  local invite
  invite=$(cat "$dir/invite.txt")
  local volunteers=()
  for i in 0 1 2; do
    "$provider" --join "$invite" --listen "127.0.0.1:$(free_port)" --workdir "$dir/volunteer_$i" \
      --probe-megabytes 1 --upload-mbps "$mbps" >"$dir/volunteer_$i.log" 2>&1 &
    volunteers+=($!)
    pids+=($!)
  done
  wait "$coordinator" || { echo "the coordinator failed; see below" >&2; tail -20 "$dir/coordinator.log" >&2; exit 1; }
  for v in "${volunteers[@]}"; do wait "$v" || { echo "a volunteer failed" >&2; exit 1; }; done
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
