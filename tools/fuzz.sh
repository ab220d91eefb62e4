#!/usr/bin/env bash
# Builds cairn's libFuzzer targets with clang (address + undefined sanitizers) in build-fuzz/ and
# runs each from the seed corpus in tests/fuzz/corpus/. A crash input is copied to
# tests/fuzz/regressions/<target>/ (commit it: node_tests' FuzzReplay suite replays it forever) and the
# script fails.
#   tools/fuzz.sh [seconds per target, default 30]     explore: a random seed, for that long
#   CAIRN_FUZZ_SEED=N CAIRN_FUZZ_RUNS=R tools/fuzz.sh [cap seconds]
#                                                      replay: libFuzzer's -seed=N -runs=R, the same
#                                                      inputs in every run (tools/test.sh, CI)
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_TARGET=${1:-30}
FIXED=()
if [[ -n "${CAIRN_FUZZ_SEED:-}" ]]; then
  FIXED=(-seed="$CAIRN_FUZZ_SEED" -runs="${CAIRN_FUZZ_RUNS:?CAIRN_FUZZ_SEED needs CAIRN_FUZZ_RUNS}")
fi
BUILD_DIR=${CAIRN_FUZZ_BUILD_DIR:-build-fuzz}
if ! command -v clang++ >/dev/null || ! ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1; then
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends clang libclang-rt-14-dev
fi
if [[ ! -f "$BUILD_DIR/build.ninja" ]]; then
  CC=clang CXX=clang++ cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCAIRN_FUZZ=ON >/dev/null
fi
# Each target with its corpus folder (tests/fuzz/corpus/<folder>, regressions/<folder>).
TARGETS=(fuzz_wire_decoder:wire fuzz_node_data:node_data fuzz_coordination:coordination fuzz_chunks:chunks
         fuzz_pipeline_control:pipeline_control fuzz_ring_join:ring_join
         fuzz_collective_notices:collective_notices)
JOBS=${CAIRN_JOBS:-$(nproc)}
cmake --build "$BUILD_DIR" -j "$JOBS" --target "${TARGETS[@]%%:*}"

# One target: its corpus copied to a scratch folder, libFuzzer run there; a crash input is kept.
fuzz_one() {
  local target=$1 corpus=$2 work
  work=$(mktemp -d)
  cp tests/fuzz/corpus/"$corpus"/* "$work"/
  mkdir -p "$work/artifacts"
  if [[ ${#FIXED[@]} -gt 0 ]]; then
    echo "fuzz: $target, ${FIXED[*]} (at most ${SECONDS_PER_TARGET}s)"
  else
    echo "fuzz: $target for ${SECONDS_PER_TARGET}s"
  fi
  local rc=0 dict=()
  # The protocol decoders read JSON: their keys (tests/fuzz/protocol.dict) let the fuzzer build
  # well-formed headers instead of waiting to guess them.
  [[ $corpus == wire || $corpus == node_data ]] || dict=(-dict=tests/fuzz/protocol.dict)
  # Torch's own allocations are not ours to police; leak checking stays on for cairn code paths.
  if ! ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1 \
      "$BUILD_DIR/tests/$target" "${FIXED[@]}" "${dict[@]}" -max_total_time="$SECONDS_PER_TARGET" -rss_limit_mb=4096 \
      -max_len=65536 -artifact_prefix="$work/artifacts/" -print_final_stats=1 "$work" \
      > "$work/log" 2>&1; then
    rc=1
    mkdir -p tests/fuzz/regressions/"$corpus"
    cp "$work"/artifacts/* tests/fuzz/regressions/"$corpus"/ 2>/dev/null || true
    tail -40 "$work/log"
    echo "fuzz: $target FOUND A CRASH; input kept in tests/fuzz/regressions/$corpus/"
  fi
  grep -E "stat::number_of_executed_units|Done [0-9]+ runs" "$work/log" | tail -2 | sed "s/^/fuzz: $target: /"
  rm -rf "$work"
  return $rc
}

# The targets are single-threaded: up to JOBS run side by side (one core each), each printing its
# lines when it ends, in the targets' order.
status=0
pids=(); outs=(); printed=0
print_next() {
  wait "${pids[$printed]}" || status=1
  cat "${outs[$printed]}"; rm -f "${outs[$printed]}"
  printed=$((printed + 1))
}
for pair in "${TARGETS[@]}"; do
  while (( ${#pids[@]} - printed >= JOBS )); do print_next; done
  out=$(mktemp); outs+=("$out")
  fuzz_one "${pair%%:*}" "${pair##*:}" > "$out" 2>&1 &
  pids+=($!)
done
while (( printed < ${#pids[@]} )); do print_next; done
exit $status
