#!/usr/bin/env bash
# Issue [M]'s checks and figures on the GPU machine, in one run (its time is short: build, checks,
# figures). Runs ON that machine from the project root after ../shared/device/build_cuda.sh built
# cairn into $BUILD against PyTorch's CUDA libtorch; writes everything under $OUT:
#   bash .device-deps/build_cuda.sh && export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu \
#     && BUILD=/tmp/cb bash tools/gpu/gpu_figures.sh
# Here (no GPU) `DEVICE=cpu BUILD=build OUT=/tmp/gpu_dry bash tools/gpu/gpu_figures.sh` runs the
# same steps on the CPU, which checks the script, not the GPU (SKIP_DEMO=1 leaves out step 4;
# STEPS=6 shortens step 3).
#   1. Device.* of trainer_tests (the CUDA checkpoint round trip: save on CUDA, resume on the CPU)
#   2. equivalence: 3 providers sharing the GPU vs one PyTorch process on it, 20 SGD steps,
#      fp32-strict, deterministic algorithms (tests/integration/provider_cluster_test.py
#      match_pytorch --device cuda): max abs difference <= 1e-5
#   3. overhead (one provider, whole model, vs PyTorch's loop in Python) and the tiny GPT in 2 stages
#      on one device vs 1 provider (tools/gpu/overhead.py)
#   4. the demo (6 epochs) on $DEVICE and on this machine's CPU, one after the other: accuracy, time
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-/tmp/cb}
OUT=${OUT:-/tmp/gpu_out}
DEVICE=${DEVICE:-cuda}
PY=${PY:-python3}
mkdir -p "$OUT"
log() { echo "gpu_figures: $*" | tee -a "$OUT/figures.txt"; }
log "$(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo '?') device $DEVICE"
log "torch: $($PY -c 'import torch; print(torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU")')"
status=0

log "1/4 Device.* (trainer_tests)"
models=$OUT/trainer_models
if ! $PY tests/trainer/make_test_models.py "$models" > "$OUT/models.log" 2>&1; then
  log "could not make the test models (tail of $OUT/models.log):"; tail -5 "$OUT/models.log"; status=1
fi
CAIRN_TEST_MODELS=$models timeout 300 "$BUILD/tests/trainer_tests" --gtest_filter='Device.*' \
  > "$OUT/device_tests.log" 2>&1
rc=$?; log "Device.* exit $rc: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/device_tests.log" | tr '\n' ' ')"
[[ $rc -eq 0 ]] || status=1

log "2/4 equivalence: 3 providers on $DEVICE vs one PyTorch process on $DEVICE"
timeout 300 $PY tests/integration/provider_cluster_test.py match_pytorch --device "$DEVICE" \
  --provider "$BUILD/node/provider" --work "$OUT/match" --port 27100 > "$OUT/match.log" 2>&1
rc=$?; log "match_pytorch exit $rc: $(grep -E 'max abs difference|providers on|FAIL' "$OUT/match.log" | tr '\n' ' ')"
[[ $rc -eq 0 ]] || status=1

log "3/4 overhead and the pipeline on one $DEVICE (tools/gpu/overhead.py, ${STEPS:-300} steps)"
timeout 900 $PY tools/gpu/overhead.py --build "$BUILD" --work "$OUT/overhead" --device "$DEVICE" \
  --steps "${STEPS:-300}" > "$OUT/overhead.log" 2>&1
rc=$?; log "overhead exit $rc:"; grep -E '^figure' "$OUT/overhead.log" | tee -a "$OUT/figures.txt"
[[ $rc -eq 0 ]] || { tail -5 "$OUT/overhead.log"; status=1; }

log "4/4 the demo, 6 epochs, on $DEVICE then on the CPU (same machine, same script run)"
DEMO_DEVICES=("$DEVICE" cpu)
[[ -n "${SKIP_DEMO:-}" ]] && DEMO_DEVICES=() && log "skipped (SKIP_DEMO)"
for d in "${DEMO_DEVICES[@]}"; do
  CAIRN_BUILD_DIR=$BUILD CAIRN_DEVICE=$d CAIRN_EXAMPLE_OUT="$OUT/demo_$d" timeout 900 \
    examples/fashion_mnist/run.sh > "$OUT/demo_$d.log" 2>&1
  rc=$?; log "demo on $d exit $rc: $(grep -E 'final test accuracy' "$OUT/demo_$d.log")"
  [[ $rc -eq 0 ]] || status=1
done
log "done, exit $status"
exit $status
