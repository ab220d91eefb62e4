#!/usr/bin/env bash
# The byte-level tiny GPT trained by 2 clusters x 2 nodes on this machine: clusterize cuts the
# model (between transformer blocks) for each cluster, the clusters average their parameters every
# `local_steps` steps over ring all-reduce, and at the end the model is merged (averaged over the
# clusters), its validation perplexity printed, and a short sample generated.
#   examples/tiny_gpt/run.sh [--short]     (--short: 20 steps, averaging every 5, for tools/test.sh)
# Run tools/setup.sh first (tools/demo.sh and tools/test.sh do).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR=${CAIRN_BUILD_DIR:-build}
OUT=${CAIRN_EXAMPLE_OUT:-node_data/tiny_gpt}
PY=/usr/bin/python3
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
examples/tiny_gpt/make_corpus.sh "$OUT/corpus.txt"
$PY - examples/tiny_gpt/job.json "$OUT/job.json.in" "$OUT/corpus.txt" "${1:-}" <<'PYEOF'
import json, sys
job = json.load(open(sys.argv[1]))
job["data"]["location"] = sys.argv[3]
if sys.argv[4] == "--short":
    job["training_definition"].update({"max_steps": 20, "local_steps": 5})
json.dump(job, open(sys.argv[2], "w"), indent=2)
PYEOF
$PY examples/tiny_gpt/make_model.py --out "$OUT/model.pt"
"$BUILD_DIR/clusterize/clusterize" --model "$OUT/model.pt" --nodes examples/tiny_gpt/node_configs.json \
  --job "$OUT/job.json.in" --clusters 2 --granularity expand-containers \
  --input-shape 16,64 --input-dtype int64 --out "$OUT"
CAIRN_BUILD_DIR=$BUILD_DIR tools/launch_local "$OUT"
"$BUILD_DIR/clusterize/clusterize" --merge "$OUT" --out "$OUT/trained.pt"
$PY - "$OUT" <<'PYEOF'
import json, sys
out = sys.argv[1]
plan = json.load(open(f"{out}/plan.json"))
for c in plan["clusters"]:
    leaf = c["chain"][-1]
    e = json.load(open(f"{out}/nodes/{leaf}/result.json"))["eval"]
    print(f"tiny_gpt: cluster {c['index']} ({' -> '.join(c['chain'])}): validation loss {e['loss']:.4f}, "
          f"perplexity {e['perplexity']:.2f} on {e['samples']} blocks")
PYEOF
echo "tiny_gpt: a sample from the merged model ($OUT/trained.pt):"
$PY examples/tiny_gpt/generate.py "$OUT/trained.pt" --prompt "The " --chars 160
