#!/usr/bin/env bash
# The main job on an embedded default. Until issue [C] lands there is no training yet, so this
# runs the best end-to-end path that exists and says so: validate the example node_configs.json
# and send a 64 MiB tensor between two processes over tcp loopback through cairn's transport.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
BUILD_DIR=${CAIRN_BUILD_DIR:-build}
echo "demo: training is not implemented yet (issue [C]); running what exists end to end."
echo "demo: 1/2 clusterize reads node_data/node_configs.json"
"$BUILD_DIR/clusterize/clusterize" --nodes node_data/node_configs.json
echo "demo: 2/2 a 64 MiB tensor between two processes over tcp loopback"
"$BUILD_DIR/tools/bench/bench_transport" --sizes 64M --rounds 3
