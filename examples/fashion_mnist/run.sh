#!/usr/bin/env bash
# The Fashion-MNIST CNN end to end on 3 local providers: make the model, cut it with clusterize,
# train, merge the trained stages into one TorchScript model, print the test accuracy.
#   examples/fashion_mnist/run.sh [--short]   (--short: 60 steps on a slice, for tools/test.sh)
#   CAIRN_DEVICE=cuda examples/fashion_mnist/run.sh   every provider with --device cuda (default:
#                                                     provider's own, auto)
#   CAIRN_DEVICE=cpu,cuda,cpu ...                     one device per stage, Root first (a mixed run)
#   CAIRN_NODES=FILE ...                              node configs (default: this folder's, ports
#                                                     5600-5602)
#   CAIRN_PY=python3 ...                              the Python that makes the model (default
#                                                     /usr/bin/python3, Debian's torch)
# tools/demo.sh runs it after the set-up; run tools/setup.sh first when calling it directly.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR=${CAIRN_BUILD_DIR:-build}
OUT=${CAIRN_EXAMPLE_OUT:-node_data/fashion_mnist}
PY=${CAIRN_PY:-/usr/bin/python3}
start=$(date +%s)
mkdir -p "$OUT"
JOB=examples/fashion_mnist/job.json
if [[ "${1:-}" == "--short" ]]; then
  $PY examples/fashion_mnist/short_job.py "$JOB" "$OUT/job_short.json"
  JOB=$OUT/job_short.json
fi
echo "fashion_mnist: 1/4 make the model"
$PY examples/fashion_mnist/make_model.py --out "$OUT/model.pt"
echo "fashion_mnist: 2/4 clusterize: profile the model, cut it into stages, place them on the 3 nodes"
"$BUILD_DIR/clusterize/clusterize" --model "$OUT/model.pt" --nodes "${CAIRN_NODES:-examples/fashion_mnist/node_configs.json}" \
  --job "$JOB" --clusters 1 --input-shape 32,1,28,28 --out "$OUT"
echo "fashion_mnist: 3/4 train on 3 local providers"
DEVICE_ARGS=()
if [[ "${CAIRN_DEVICE:-}" == *,* ]]; then
  IFS=, read -r -a devices <<< "$CAIRN_DEVICE"
  mapfile -t chain < <($PY -c "import json,sys; print('\n'.join(json.load(open(sys.argv[1]))['clusters'][0]['chain']))" "$OUT/plan.json")
  if ((${#devices[@]} != ${#chain[@]})); then
    echo "fashion_mnist: CAIRN_DEVICE names ${#devices[@]} devices, the plan has ${#chain[@]} stages (${chain[*]})" >&2
    exit 2
  fi
  for i in "${!chain[@]}"; do DEVICE_ARGS+=(--device-of "${chain[i]}=${devices[i]}"); done
  echo "fashion_mnist: devices by stage: ${chain[*]} on ${devices[*]}"
elif [[ -n "${CAIRN_DEVICE:-}" ]]; then
  DEVICE_ARGS=(-- --device "$CAIRN_DEVICE")
fi
CAIRN_BUILD_DIR=$BUILD_DIR tools/launch_local "$OUT" "${DEVICE_ARGS[@]}"
echo "fashion_mnist: 4/4 the trained model back in one file"
"$BUILD_DIR/clusterize/clusterize" --merge "$OUT" --out "$OUT/trained.pt"
end=$(date +%s)
LEAF=$($PY -c "import json,sys; c=json.load(open(sys.argv[1]))['clusters'][0]; print(c['chain'][-1])" "$OUT/plan.json")
$PY - "$OUT/nodes/$LEAF/result.json" "$((end - start))" "$OUT/trained.pt" <<'PYEOF'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"fashion_mnist: final test accuracy {100 * r['eval']['accuracy']:.2f}% on {r['eval']['samples']} "
      f"Fashion-MNIST test images after {r['steps']} steps (training {r['seconds']:.0f} s; "
      f"model + cut + training + merge {sys.argv[2]} s); trained model: {sys.argv[3]}")
PYEOF
