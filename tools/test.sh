#!/usr/bin/env bash
# Set-up (packages + build), each fuzz target for a fixed number of inputs from a fixed seed (the
# same inputs in every run, so the suite's verdict does not depend on luck: exploring with random
# seeds is `tools/fuzz.sh SECONDS`, by hand), then the whole test suite, then the ten slowest tests
# (figures only: no test's verdict depends on its time; each has a ctest TIMEOUT so a hang fails
# fast), and ctest's summary again, so it closes the output.
#   tools/test.sh [extra ctest args]        CAIRN_FUZZ_SECONDS=0 skips fuzzing
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
FUZZ_SECONDS=${CAIRN_FUZZ_SECONDS:-300}  # a cap only: 600,000 inputs take ~10-20 s per target here
if [[ "$FUZZ_SECONDS" != "0" ]]; then
  CAIRN_FUZZ_SEED=${CAIRN_FUZZ_SEED:-1} CAIRN_FUZZ_RUNS=${CAIRN_FUZZ_RUNS:-600000} \
    tools/fuzz.sh "$FUZZ_SECONDS"
fi
BUILD_DIR=${CAIRN_BUILD_DIR:-build}
cd "$BUILD_DIR"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
ctest --output-on-failure -j "${CAIRN_TEST_JOBS:-2}" "$@" 2>&1 | tee "$log" || status=$?
# ctest's result lines: "  12/120 Test  #34: name ......   Passed   12.34 sec"
echo
echo "The ten slowest tests:"
sed -nE 's/^ *[0-9]+\/[0-9]+ Test +#[0-9]+: ([^ ]+) .* ([0-9.]+) sec$/\2 \1/p' "$log" |
  sort -rn | head -10 | awk '{printf "  %8.1f s  %s\n", $1, $2}'
echo
sed -nE '/^[0-9]+% tests passed/,$p' "$log"
exit "$status"
