#!/usr/bin/env bash
# The residual network on Fashion-MNIST, end to end on 3 local providers: make the model, cut it
# with clusterize (the skips cross stage boundaries), train, merge, print the test accuracy.
# The cuts are fixed (--cuts 8,14: before block 1's addition and before block 2's second batch
# norm, so each boundary carries the skip and the branch: two tensors, ~1/3 of the convolutions per
# stage); clusterize still places the stages on the nodes. Without --cuts it would choose the cuts
# from profiled timings, which differ from machine to machine.
#   examples/resnet/run.sh [--short]     (--short: 60 steps on a slice, for tools/test.sh)
# Run tools/setup.sh first (tools/demo.sh and tools/test.sh do).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR=${CAIRN_BUILD_DIR:-build}
OUT=${CAIRN_EXAMPLE_OUT:-node_data/resnet}
PY=/usr/bin/python3
mkdir -p "$OUT"
JOB=examples/resnet/job.json
if [[ "${1:-}" == "--short" ]]; then
  $PY - "$JOB" "$OUT/job_short.json" <<'PYEOF'
import json, sys
job = json.load(open(sys.argv[1]))
job["training_definition"].update({"epochs": 0, "max_steps": 60, "batch_size": 64})
job["data"].update({"train_samples": 4000, "test_samples": 1000})
json.dump(job, open(sys.argv[2], "w"), indent=2)
PYEOF
  JOB=$OUT/job_short.json
fi
$PY examples/resnet/make_model.py --out "$OUT/model.pt"
"$BUILD_DIR/clusterize/clusterize" --model "$OUT/model.pt" --nodes examples/resnet/node_configs.json \
  --job "$JOB" --clusters 1 --input-shape 32,1,28,28 --cuts 8,14 --out "$OUT"
CAIRN_BUILD_DIR=$BUILD_DIR tools/launch_local "$OUT"
"$BUILD_DIR/clusterize/clusterize" --merge "$OUT" --out "$OUT/trained.pt"
$PY - "$OUT" <<'PYEOF'
import json, sys
out = sys.argv[1]
plan = json.load(open(f"{out}/plan.json"))
chain = plan["clusters"][0]["chain"]
crossing = [len(s["inputs"]) for s in plan["clusters"][0]["stages"][1:]]
result = json.load(open(f"{out}/nodes/{chain[-1]}/result.json"))
print(f"resnet: {len(chain)} stages ({' -> '.join(chain)}), tensors crossing each cut: {crossing}")
print(f"resnet: test accuracy {100 * result['eval']['accuracy']:.2f}% on {result['eval']['samples']} "
      f"images after {result['steps']} steps; model in {out}/trained.pt")
PYEOF
