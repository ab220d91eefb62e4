#!/usr/bin/env bash
# Issue [M]'s checks and figures on the GPU machine, in one run (its time is short: build, checks,
# figures). Runs ON that machine from the project root after ../shared/device/build_cuda.sh built
# cairn into $BUILD against PyTorch's CUDA libtorch; writes $OUT/figures.txt and $OUT/logs.tar.gz:
#   S=$(date +%s); bash .device-deps/build_cuda.sh -DCMAKE_CXX_COMPILER=/usr/bin/g++ \
#     -DCMAKE_C_COMPILER=/usr/bin/gcc; export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu;
#   START=$S LIMIT=570 BUILD=/tmp/cb bash tools/gpu/gpu_figures.sh
# (the image's default /opt/gcc/bin/g++ links libstdc++ statically, and PyTorch's libtorch then
# serves std::filesystem, whose remove_all crashes: docs/BENCHMARKS.md section 13). Measured
# 2026-11-27 on an H200: the build of every target under 3 minutes, this script about 5 minutes.
# START/LIMIT: every step's timeout is cut so that the script ends LIMIT seconds after START (the
# device command's own limit); a step cut short says so in figures.txt.
# Here (no GPU) `PY=/usr/bin/python3 DEVICE=cpu BUILD=build OUT=/tmp/gpu_dry STEPS=20 SKIP_DEMO=1
# bash tools/gpu/gpu_figures.sh` runs the same steps on the CPU, which checks the script, not the
# GPU (about 4 minutes on 2 cores, 2026-12-01).
#   0. (background, from the start) figure 5's reference: the demo, 6 epochs, on this machine's CPU
#      (3 single-threaded providers; the GPU steps below use other cores)
#   1. Device.* of trainer_tests (the CUDA checkpoint round trip: save on CUDA, resume on the CPU;
#      the int8 wire form encoded and decoded on CUDA equal to the host's bit for bit; a whole-model
#      stage on the last CUDA device, made current on its thread, losses the CPU's within 1e-4)
#   2. figure 1, equivalence: 3 providers sharing the GPU vs one PyTorch process on it, 20 SGD
#      steps, fp32-strict, deterministic algorithms (tests/integration/provider_cluster_test.py
#      match_pytorch --device cuda): max abs difference <= 1e-5; then the same with wire bf16, cast
#      on the GPU before the copy (tests/integration/wire_compression_test.py bf16 --device cuda);
#      precision bf16 (CUDA autocast) against the same stages under torch.autocast;
#      and rings on the GPU: 2 clusters on cuda, "gradients" and a whole-model cluster in 3 rings
#      (tests/integration/two_clusters_test.py --device cuda): copies bit-identical after the reduce;
#      and "gradients" overlapped with backward, buckets copied out in backward or not: equal
#   3. figures 2 and 3: overhead (one provider, whole model, vs PyTorch's loop in Python) and the tiny
#      GPT in 2 stages on one device vs 1 provider, and those 2 stages again sending at once
#      (tools/gpu/overhead.py --at-once: what holding packets back until the next pass, and
#      copying on a stream of its own, gain)
#   4. figure 5: the demo (6 epochs) on $DEVICE
#   5. figure 4, mixed: the demo (--short) with its middle stage on $DEVICE, the others on the CPU
#   6. wait for step 0; then, in the time left, figure 2's GPT launch-bound (dim 8, batch 2: the
#      host's share of a step, a diagnostic) and the build of every other target (does all of
#      cairn compile against this libtorch?)
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-/tmp/cb}
OUT=${OUT:-/tmp/gpu_out}
WORK=${WORK:-/tmp/gpu_work}
DEVICE=${DEVICE:-cuda}
PY=${PY:-python3}
START=${START:-$(date +%s)}
LIMIT=${LIMIT:-3600}
mkdir -p "$OUT" "$WORK/logs"
LOGS=$WORK/logs
log() { echo "gpu_figures: $*" | tee -a "$OUT/figures.txt"; }
# seconds for a step: at most $1, and never past START + LIMIT - $2 (time kept for later steps)
budget() {
  local want=$1 keep=${2:-0} left
  left=$((START + LIMIT - keep - $(date +%s)))
  ((left < want)) && want=$left
  ((want < 1)) && want=1
  echo "$want"
}
pack() {  # the logs, and each demo's plan, results and per-step metrics
  (cd "$WORK" && tar -czf "$OUT/logs.tar.gz" logs $(ls -d demo_*/plan.json demo_*/nodes/*/result.json \
    demo_*/nodes/*/metrics.jsonl 2>/dev/null))
}
trap pack EXIT
log "$(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo '?') device $DEVICE, $(nproc) cores"
log "torch: $($PY -c 'import torch; print(torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU")')"
[[ -x "$BUILD/node/provider" ]] || { log "no $BUILD/node/provider: the build failed"; exit 1; }
status=0

demo() {  # demo NAME DEVICE SECONDS [run.sh args]: the Fashion-MNIST demo, its log in $LOGS/NAME.log
  local name=$1 device=$2 seconds=$3
  shift 3
  CAIRN_BUILD_DIR=$BUILD CAIRN_PY=$PY CAIRN_DEVICE=$device CAIRN_EXAMPLE_OUT="$WORK/$name" \
    CAIRN_NODES="$WORK/$name.nodes.json" timeout "$seconds" examples/fashion_mnist/run.sh "$@" \
    > "$LOGS/$name.log" 2>&1
}
nodes_at() {  # nodes_at NAME PORT: the demo's 3 node configs on ports PORT..PORT+2
  $PY -c "import json,sys; p=int(sys.argv[2]); json.dump({str(i): {'IP': f'127.0.0.1:{p+i}', 'benchmarks': {'ram': 2, 'bandwidth': 10000}} for i in range(3)}, open(sys.argv[1], 'w'))" \
    "$WORK/$1.nodes.json" "$2"
}
demo_figure() {  # the line figures.txt keeps of a demo: its accuracy and times, or why it has none
  local name=$1 rc=$2
  if ((rc == 124)); then echo "cut at its time limit; $(grep -c '\[node' "$LOGS/$name.log") log lines"
  else echo "exit $rc: $(grep -E 'final test accuracy|devices by stage' "$LOGS/$name.log" | tr '\n' ' ')"; fi
}

SKIP=${SKIP_DEMO:-}
if [[ -z "$SKIP" ]]; then
  log "0/6 background: the demo, 6 epochs, on this machine's CPU (figure 5's reference)"
  nodes_at demo_cpu 5800
  (demo demo_cpu cpu "$(budget 1200 40)"; echo $? > "$WORK/demo_cpu.rc") &
  cpu_demo=$!
fi

log "1/6 Device.* (trainer_tests)"
models=$WORK/trainer_models
$PY tests/trainer/make_test_models.py "$models" > "$LOGS/models.log" 2>&1 ||
  { log "could not make the test models (tail of models.log):"; tail -5 "$LOGS/models.log"; status=1; }
CAIRN_TEST_MODELS=$models timeout "$(budget 120 300)" "$BUILD/tests/trainer_tests" --gtest_filter='Device.*' \
  > "$LOGS/device_tests.log" 2>&1
rc=$?; log "Device.* exit $rc: $(grep -E '^\[ +(OK|PASSED|FAILED|SKIPPED) ' "$LOGS/device_tests.log" | tr '\n' ' ')"
[[ $rc -eq 0 ]] || status=1

log "2/6 figure 1, equivalence: 3 providers on $DEVICE vs one PyTorch process on $DEVICE"
timeout "$(budget 180 240)" $PY tests/integration/provider_cluster_test.py match_pytorch --device "$DEVICE" \
  --provider "$BUILD/node/provider" --work "$WORK/match" --port 27100 > "$LOGS/match.log" 2>&1
rc=$?; log "match_pytorch exit $rc: $(grep -E 'max abs difference|providers on|FAIL' "$LOGS/match.log" | tr '\n' ' ')"
[[ $rc -eq 0 ]] || status=1
# The same 3 providers with wire.activations bf16: cast on the device before the copy to the host
# (TimedLink), against the PyTorch reference that rounds each cut through bf16 on the same device.
timeout "$(budget 90 200)" $PY tests/integration/wire_compression_test.py bf16 --device "$DEVICE" \
  --provider "$BUILD/node/provider" --work "$WORK/wire" --port 27150 > "$LOGS/wire.log" 2>&1
rc=$?; log "wire bf16 on $DEVICE exit $rc: $(grep -E 'max \||FAIL' "$LOGS/wire.log" | tr '\n' ' ')"
[[ $rc -eq 0 ]] || status=1
# precision bf16: CUDA autocast in the providers against the same stages under torch.autocast.
timeout "$(budget 60 190)" $PY tests/integration/wire_compression_test.py precision_bf16 --device "$DEVICE" \
  --provider "$BUILD/node/provider" --work "$WORK/autocast" --port 27170 > "$LOGS/autocast.log" 2>&1
rc=$?; log "precision bf16 on $DEVICE exit $rc: $(grep -E 'max \||FAIL' "$LOGS/autocast.log" | tr '\n' ' ')"
[[ $rc -eq 0 ]] || status=1
# Rings on the device: 2 clusters, every stage on the GPU, the rings reducing host copies of the
# buckets ("gradients" every step; then one cluster holding the whole model in 3 rings, "average"):
# every copy bit-identical after the final reduce, and both Leaves past 30 % accuracy. Then
# "gradients" in buckets of 256 bytes, overlapped with backward, run twice: sending later with each
# bucket copied out by the backward that finishes it (events on the GPU), and sending at once with
# the communication thread copying; every trained tensor equal in both (fp32-strict).
for case in two_clusters_gradients two_clusters_cut_differently two_clusters_sending_later; do
  timeout "$(budget 90 180)" $PY tests/integration/two_clusters_test.py $case --device "$DEVICE" \
    --provider "$BUILD/node/provider" --work "$WORK/$case" --port 27200 > "$LOGS/$case.log" 2>&1
  rc=$?; log "$case on $DEVICE exit $rc: $(grep -E 'bit-identical|equal in both|FAIL' "$LOGS/$case.log" | tr '\n' ' ')"
  [[ $rc -eq 0 ]] || status=1
done

log "3/6 figures 2, 3: overhead and the pipeline on one $DEVICE (tools/gpu/overhead.py, ${STEPS:-1000} steps)"
timeout "$(budget 300 130)" $PY tools/gpu/overhead.py --build "$BUILD" --work "$WORK/overhead" \
  --device "$DEVICE" --steps "${STEPS:-1000}" --at-once > "$LOGS/overhead.log" 2>&1
rc=$?; log "overhead exit $rc:"; grep -E '^figure' "$LOGS/overhead.log" | tee -a "$OUT/figures.txt"
cp "$WORK/overhead/figures.json" "$LOGS/overhead_figures.json" 2>/dev/null
[[ $rc -eq 0 ]] || { tail -5 "$LOGS/overhead.log"; status=1; }

if [[ -z "$SKIP" ]]; then
  log "4/6 figure 5: the demo, 6 epochs, on $DEVICE (the CPU run of step 0 still going beside it)"
  nodes_at demo_gpu 5900
  demo demo_gpu "$DEVICE" "$(budget 240 60)"
  rc=$?; log "demo on $DEVICE $(demo_figure demo_gpu $rc)"
  [[ $rc -eq 0 ]] || status=1

  log "5/6 figure 4, mixed: the demo (--short) with its middle stage on $DEVICE, Root and Leaf on the CPU"
  nodes_at demo_mixed 6000
  demo demo_mixed "cpu,$DEVICE,cpu" "$(budget 120 15)" --short
  rc=$?; log "mixed demo $(demo_figure demo_mixed $rc)"
  [[ $rc -eq 0 ]] || status=1
  for node in "$WORK"/demo_mixed/nodes/*/; do
    [[ -f "$node/metrics.jsonl" ]] || continue
    log "  $(basename "$node"): $($PY -c "
import json, sys, statistics as st
r = [json.loads(l) for l in open(sys.argv[1])]
s = [x for x in r if 'step' in x and 'compute_s' in x]
print(f\"{len(s)} steps, median compute {1e3*st.median(x['compute_s'] for x in s):.2f} ms, send {1e3*st.median(x['send_s'] for x in s):.2f} ms, wait {1e3*st.median(x['wait_s'] for x in s):.2f} ms\")
" "$node/metrics.jsonl" 2>&1 | tail -1)"
  done

  log "6/6 waiting for the CPU demo (step 0)"
  wait "$cpu_demo"
  rc=$(cat "$WORK/demo_cpu.rc" 2>/dev/null || echo 1)
  log "demo on the CPU $(demo_figure demo_cpu "$rc")"
  [[ $rc -eq 0 ]] || status=1
fi
# A diagnostic beside figure 2, in the time the figures leave: the GPT with almost no arithmetic
# per op (dim 8, batch 2), so both sides' steps are what they spend on the host (on this machine's
# CPU: 1.20-1.24x PyTorch's loop, docs/BENCHMARKS.md section 13); on the GPU, a gap here is
# launches or host reads, not compute.
left=$(budget 60 5)
if ((left > 20)); then
  timeout "$left" $PY tools/gpu/overhead.py --build "$BUILD" --work "$WORK/overhead_lb" \
    --device "$DEVICE" --steps 300 --models gpt --gpt-dim 8 --gpt-heads 2 --batch 2 --port 27400 \
    > "$LOGS/overhead_lb.log" 2>&1
  rc=$?; log "launch-bound GPT (dim 8, batch 2) exit $rc:"
  grep -E '^figure 2' "$LOGS/overhead_lb.log" | tee -a "$OUT/figures.txt"
fi
left=$(budget 600 5)
if ((left > 20)); then
  log "the rest of the tree against this libtorch (${left} s left)"
  timeout "$left" cmake --build "$BUILD" -- -k 0 -j"$(nproc)" > "$LOGS/build_rest.log" 2>&1
  rc=$?
  log "build of every target: exit $rc; errors: $(grep -E 'error:' "$LOGS/build_rest.log" | sort -u | head -5 | tr '\n' ' ')"
fi
log "done, exit $status"
exit $status
