#!/usr/bin/env bash
# Set-up (packages + build), the whole test suite, then each fuzz target for a bounded time.
#   tools/test.sh [extra ctest args]        CAIRN_FUZZ_SECONDS=0 skips fuzzing (default 30 each)
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
BUILD_DIR=${CAIRN_BUILD_DIR:-build}
(cd "$BUILD_DIR" && ctest --output-on-failure -j "${CAIRN_TEST_JOBS:-2}" "$@")
FUZZ_SECONDS=${CAIRN_FUZZ_SECONDS:-30}
if [[ "$FUZZ_SECONDS" != "0" ]]; then
  tools/fuzz.sh "$FUZZ_SECONDS"
fi
