#!/usr/bin/env bash
# Set-up (packages + build), each fuzz target for a bounded time, then the whole test suite
# (ctest last, so its summary closes the output).
#   tools/test.sh [extra ctest args]        CAIRN_FUZZ_SECONDS=0 skips fuzzing (default 30 each)
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
FUZZ_SECONDS=${CAIRN_FUZZ_SECONDS:-30}
if [[ "$FUZZ_SECONDS" != "0" ]]; then
  tools/fuzz.sh "$FUZZ_SECONDS"
fi
BUILD_DIR=${CAIRN_BUILD_DIR:-build}
cd "$BUILD_DIR"
ctest --output-on-failure -j "${CAIRN_TEST_JOBS:-2}" "$@"
