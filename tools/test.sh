#!/usr/bin/env bash
# Set-up (packages + build) and the whole test suite: tools/test.sh [extra ctest args]
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
BUILD_DIR=${CAIRN_BUILD_DIR:-build}
cd "$BUILD_DIR"
ctest --output-on-failure -j "${CAIRN_TEST_JOBS:-2}" "$@"
