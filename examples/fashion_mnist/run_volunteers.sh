#!/usr/bin/env bash
# The Fashion-MNIST CNN trained by volunteers who join by invite, on this machine: a coordinator
# (clusterize --serve) prints an invite; 4 volunteers (provider --join) join with it, each with its
# own work folder, key and port; the coordinator plans once 3 have joined, keeps the 4th as a spare,
# sends each placed volunteer its stage, and merges the uploaded trained stages into trained.pt.
#   examples/fashion_mnist/run_volunteers.sh [--short]   (tools/demo.sh --volunteers)
#   CAIRN_WEB=8080 examples/fashion_mnist/run_volunteers.sh   also serves the live page at
#                                                         http://127.0.0.1:8080/ (clusterize --web)
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR=${CAIRN_BUILD_DIR:-build}
OUT=${CAIRN_EXAMPLE_OUT:-node_data/fashion_mnist_volunteers}
PY=/usr/bin/python3
start=$(date +%s)
rm -rf "$OUT"
mkdir -p "$OUT"
JOB=examples/fashion_mnist/job.json
if [[ "${1:-}" == "--short" ]]; then
  $PY examples/fashion_mnist/short_job.py "$JOB" "$OUT/job_short.json"
  JOB=$OUT/job_short.json
fi
# Free loopback ports from the kernel: one for the coordinator, one per volunteer.
read -r -a PORTS <<<"$($PY -c "
import socket
s = [socket.socket() for _ in range(5)]
for x in s: x.bind(('127.0.0.1', 0))
print(' '.join(str(x.getsockname()[1]) for x in s))")"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
echo "volunteers: 1/4 make the model"
$PY examples/fashion_mnist/make_model.py --out "$OUT/model.pt"
echo "volunteers: 2/4 the coordinator: profile the model, print the invite, wait for 3 volunteers"
# --cuts 7,14 (conv block 1 | conv block 2 | classifier): volunteers on one machine all have the
# whole machine's memory, and the planner would keep this small CNN in one piece on one of them.
"$BUILD_DIR/clusterize/clusterize" --model "$OUT/model.pt" --job "$JOB" --clusters 1 --cuts 7,14 \
  --input-shape 32,1,28,28 --serve "127.0.0.1:${PORTS[0]}" --min-volunteers 3 --gather-s 0 \
  --invite-file "$OUT/invite.txt" --out "$OUT/coordinator" ${CAIRN_WEB:+--web "$CAIRN_WEB"} \
  > "$OUT/coordinator.log" 2>&1 &
coordinator=$!
pids+=("$coordinator")
for _ in $(seq 1 600); do [[ -s "$OUT/invite.txt" ]] && break; sleep 0.2; done
[[ -s "$OUT/invite.txt" ]] || { cat "$OUT/coordinator.log"; echo "volunteers: no invite"; exit 1; }
INVITE=$(cat "$OUT/invite.txt")
if [[ -n "${CAIRN_WEB:-}" ]]; then
  echo "volunteers: watch the run at $(sed -n 's/^web view: //p' "$OUT/coordinator.log")"
fi
echo "volunteers: invite $INVITE"
echo "volunteers: 3/4 four volunteers join (each: provider --join INVITE --listen 127.0.0.1:PORT)"
for i in 1 2 3 4; do
  "$BUILD_DIR/node/provider" --join "$INVITE" --listen "127.0.0.1:${PORTS[$i]}" \
    --workdir "$OUT/volunteer_$i" > "$OUT/volunteer_$i.log" 2>&1 &
  pids+=("$!")
done
status=0
wait "$coordinator" || status=$?
sed -n '/cluster 0/,$p' "$OUT/coordinator.log" | grep -v "^20..-" || true
if [[ $status -ne 0 ]]; then
  tail -20 "$OUT/coordinator.log"
  echo "volunteers: the coordinator exited $status"
  exit $status
fi
for p in "${pids[@]:1}"; do wait "$p" || status=$?; done
[[ $status -eq 0 ]] || { tail -5 "$OUT"/volunteer_*.log; echo "volunteers: a volunteer exited $status"; exit $status; }
echo "volunteers: 4/4 the trained model came back to the coordinator"
$PY - "$OUT/coordinator/run_result.json" "$(( $(date +%s) - start ))" <<'PYEOF'
import json, sys
r = json.load(open(sys.argv[1]))
for c in r["clusters"]:
    e = c["eval"]
    print(f"volunteers: cluster {c['cluster']}: final test accuracy {100 * e['accuracy']:.2f}% on "
          f"{e['samples']} Fashion-MNIST test images after {c['steps']} steps")
print(f"volunteers: trained model {r['trained_torchscript']} and {r['trained_safetensors']} "
      f"({sys.argv[2]} s in all)")
PYEOF
