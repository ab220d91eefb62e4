#!/usr/bin/env bash
# Set-up (packages + build), each fuzz target for a fixed number of inputs from a fixed seed (the
# same inputs in every run, so the suite's verdict does not depend on luck: exploring with random
# seeds is `tools/fuzz.sh SECONDS`, by hand), then the whole test suite (ctest last, so its summary
# closes the output).
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
ctest --output-on-failure -j "${CAIRN_TEST_JOBS:-2}" "$@"
