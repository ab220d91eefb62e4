#!/usr/bin/env bash
# The main job end to end: set up and build, make the Fashion-MNIST CNN, cut it into 3 stages,
# train it on 3 local providers (tools/launch_local), merge the trained stages back into one
# TorchScript model (node_data/fashion_mnist/trained.pt), print the final test accuracy.
#   tools/demo.sh            (see examples/fashion_mnist/README.md)
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
# Only what the demo runs: a fresh clone builds in a few minutes instead of building every test.
CAIRN_TARGETS="${CAIRN_TARGETS:-provider clusterize}" tools/setup.sh
BUILD_DIR=${CAIRN_BUILD_DIR:-build}
OUT=node_data/fashion_mnist
PY=/usr/bin/python3
built=$(date +%s)
echo "demo: 1/3 make the model"
mkdir -p "$OUT"
$PY examples/fashion_mnist/make_model.py --out "$OUT/model.pt"
echo "demo: 2/3 clusterize: profile the model, cut it into stages, place them on the 3 nodes"
"$BUILD_DIR/clusterize/clusterize" --model "$OUT/model.pt" --nodes examples/fashion_mnist/node_configs.json \
  --job examples/fashion_mnist/job.json --clusters 1 --input-shape 32,1,28,28 --out "$OUT"
echo "demo: 3/3 train on 3 local providers"
CAIRN_BUILD_DIR=$BUILD_DIR tools/launch_local "$OUT"
echo "demo: the trained model back in one file"
"$BUILD_DIR/clusterize/clusterize" --merge "$OUT" --out "$OUT/trained.pt"
end=$(date +%s)
LEAF=$($PY -c "import json,sys; c=json.load(open(sys.argv[1]))['clusters'][0]; print(c['chain'][-1])" "$OUT/plan.json")
$PY - "$OUT/nodes/$LEAF/result.json" "$((end - built))" "$((end - start))" <<'PYEOF'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"demo: final test accuracy {100 * r['eval']['accuracy']:.2f}% on {r['eval']['samples']} "
      f"Fashion-MNIST test images after {r['steps']} steps "
      f"(training {r['seconds']:.0f} s; model + cut + training {sys.argv[2]} s; whole demo {sys.argv[3]} s)")
PYEOF
