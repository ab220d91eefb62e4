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
#   sudo tools/demo.sh --volunteers --nat   (or just --nat) volunteers behind home routers: 4, each
#                               in its own network namespace behind its own NAT (iptables
#                               MASQUERADE), joining with no address; a fifth, reachable volunteer
#                               relays every link (provider --relay), 2 clusters x 2 stages
#                               (examples/fashion_mnist/run_nat.py;
#                               needs root, ip and iptables)
set -euo pipefail
cd "$(dirname "$0")/.."
volunteers='' nat=''
for arg in "$@"; do
  case "$arg" in
    --volunteers) volunteers=1 ;;
    --nat) nat=1 ;;
    *) echo "usage: tools/demo.sh [--volunteers] [--nat]" >&2; exit 2 ;;
  esac
done
if [[ -n "$nat" && $(id -u) -ne 0 ]]; then  # said before the build, not after it
  echo "demo: --nat needs root (network namespaces and iptables): sudo tools/demo.sh --nat" >&2
  exit 2
fi
start=$(date +%s)
# Only what the demo runs: a fresh clone builds in a few minutes instead of building every test.
CAIRN_TARGETS="${CAIRN_TARGETS:-provider clusterize}" tools/setup.sh
if [[ -n "$nat" ]]; then
  /usr/bin/python3 examples/fashion_mnist/run_nat.py
elif [[ -n "$volunteers" ]]; then
  examples/fashion_mnist/run_volunteers.sh
else
  examples/fashion_mnist/run.sh
fi
echo "demo: whole demo (set-up and build included) $(( $(date +%s) - start )) s"
