#!/usr/bin/env bash
# A GPT with a SentencePiece BPE vocabulary, trained on the King James Bible's token shards by
# 2 clusters x 2 nodes on this machine (clusters average their parameters every `local_steps`
# steps over ring all-reduce), then the same model.pt trained in one PyTorch process on the same
# number of tokens, and both validation perplexities printed side by side with a sample of each.
#   examples/subword_gpt/run.sh [--short]     (--short: 30 steps of 8 blocks, 96 validation blocks, for ctest example.subword_gpt_short)
# Run tools/setup.sh first (packages sentencepiece, python3-sentencepiece, bible-kjv; the build).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR=${CAIRN_BUILD_DIR:-build}
OUT=${CAIRN_EXAMPLE_OUT:-node_data/subword_gpt}
PY=/usr/bin/python3
# PyTorch checks the providers here to the last bit: one BLAS thread as they use (docs/TRAINING.md
# "Reproducibility").
export OPENBLAS_NUM_THREADS=1
HERE=examples/subword_gpt
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
rm -rf "$OUT/nodes" "$OUT/trained.pt" "$OUT/reference.pt" "$OUT/timings.json"
now() { date +%s.%N; }
$PY $HERE/make_data.py --out "$OUT" --vocab 2000 --shards 4
$PY - $HERE/job.json "$OUT/job.json.in" "$OUT" "${1:-}" <<'PYEOF'
import json, sys
job = json.load(open(sys.argv[1]))
out = sys.argv[3]
job["data"]["location"] = f"{out}/shards/train"
job["data"]["test_location"] = f"{out}/shards/val"
if sys.argv[4] == "--short":
    job["training_definition"].update({"batch_size": 8, "max_steps": 30, "local_steps": 5})
    job["training_definition"]["lr_scheduler"]["warmup_steps"] = 5
    job["data"]["test_samples"] = 96
json.dump(job, open(sys.argv[2], "w"), indent=2)
PYEOF
$PY $HERE/make_model.py --out "$OUT/model.pt" --vocab 2000 --layers 2 --dim 64 --heads 4
"$BUILD_DIR/clusterize/clusterize" --model "$OUT/model.pt" --nodes $HERE/node_configs.json \
  --job "$OUT/job.json.in" --clusters 2 --granularity expand-containers \
  --input-shape 16,64 --input-dtype int64 --out "$OUT"
t0=$(now)
CAIRN_BUILD_DIR=$BUILD_DIR tools/launch_local "$OUT"
t1=$(now)
"$BUILD_DIR/clusterize/clusterize" --merge "$OUT" --out "$OUT/trained.pt"
t2=$(now)
$PY $HERE/reference.py --job "$OUT/job.json.in" --model "$OUT/model.pt" --train "$OUT/shards/train" \
  --clusters 2 --out "$OUT/reference.pt"
t3=$(now)
$PY -c 'import json, sys; t = [float(x) for x in sys.argv[2:]]
json.dump({"cairn_s": t[1] - t[0], "reference_s": t[3] - t[2]}, open(sys.argv[1], "w"))' "$OUT/timings.json" "$t0" "$t1" "$t2" "$t3"
$PY $HERE/report.py "$OUT"
