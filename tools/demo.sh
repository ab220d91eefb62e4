#!/usr/bin/env bash
# The main job end to end: set up and build, then examples/fashion_mnist/run.sh — make the
# Fashion-MNIST CNN, cut it with clusterize for 3 local nodes, train it on 3 providers
# (tools/launch_local), merge the trained stages back into one TorchScript model
# (node_data/fashion_mnist/trained.pt) and print the final test accuracy.
#   tools/demo.sh               (see examples/fashion_mnist/README.md)
#   tools/demo.sh --volunteers  the same model trained by volunteers who join by invite: a
#                               coordinator (clusterize --serve) and 4 provider --join processes,
#                               one kept as a spare; the Stem's volunteer is SIGKILLed mid-run and
#                               the spare takes its node over (examples/fashion_mnist/run_volunteers.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
# Only what the demo runs: a fresh clone builds in a few minutes instead of building every test.
CAIRN_TARGETS="${CAIRN_TARGETS:-provider clusterize}" tools/setup.sh
if [[ "${1:-}" == "--volunteers" ]]; then
  examples/fashion_mnist/run_volunteers.sh
else
  examples/fashion_mnist/run.sh
fi
echo "demo: whole demo (set-up and build included) $(( $(date +%s) - start )) s"
