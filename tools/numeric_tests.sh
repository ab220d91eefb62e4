#!/usr/bin/env bash
# The numeric tests (ctest label `numeric`: every test that compares floating-point results with a
# reference) under each of ATen's CPU kernel sets: `default` (no vector kernels), `avx2`, and the
# machine's best (unset). A tolerance that holds only on one CPU's kernels is a flaky test on
# another CI machine; run this before resolving an issue that touches numerics. Not part of every
# CI run (it runs the label three times).
#   tools/numeric_tests.sh [extra ctest args]      (after tools/setup.sh has built build/)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${CAIRN_BUILD_DIR:-build}
status=0
for capability in default avx2 best; do
  echo "numeric: ATEN_CPU_CAPABILITY=$capability"
  if [[ "$capability" == best ]]; then
    (cd "$BUILD_DIR" && env -u ATEN_CPU_CAPABILITY ctest -L numeric -j "${CAIRN_TEST_JOBS:-$((2 * $(nproc)))}" \
       --output-on-failure "$@") || status=1
  else
    (cd "$BUILD_DIR" && ATEN_CPU_CAPABILITY=$capability ctest -L numeric \
       -j "${CAIRN_TEST_JOBS:-$((2 * $(nproc)))}" --output-on-failure "$@") || status=1
  fi
done
exit $status
