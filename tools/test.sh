#!/usr/bin/env bash
# Set-up (packages + build), each fuzz target for a fixed number of inputs from a fixed seed (the
# same inputs in every run, so the suite's verdict does not depend on luck: exploring with random
# seeds is `tools/fuzz.sh SECONDS`, by hand), then the whole test suite, then the ten slowest tests
# (figures only: no test's verdict depends on its time; each has a ctest TIMEOUT so a hang fails
# fast), why each failed test failed (its FAIL/Failure/error lines and its last lines, so a log cut
# to its tail still says it), and ctest's summary again, so it closes the output.
#   tools/test.sh [extra ctest args]        CAIRN_FUZZ_SECONDS=0 skips fuzzing
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
FUZZ_SECONDS=${CAIRN_FUZZ_SECONDS:-300}  # a cap only: 50,000 inputs take ~2-8 s per target here
if [[ "$FUZZ_SECONDS" != "0" ]]; then
  CAIRN_FUZZ_SEED=${CAIRN_FUZZ_SEED:-1} CAIRN_FUZZ_RUNS=${CAIRN_FUZZ_RUNS:-50000} \
    tools/fuzz.sh "$FUZZ_SECONDS"
fi
BUILD_DIR=${CAIRN_BUILD_DIR:-build}
cd "$BUILD_DIR"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
# Slots: 2 per core (a test takes 2: tests/CMakeLists.txt), and one more for the short soak, which
# takes 1 and mostly waits (so on 2 cores two tests run beside it, as without it).
ctest --output-on-failure -j "${CAIRN_TEST_JOBS:-$((2 * $(nproc) + 1))}" "$@" 2>&1 | tee "$log" || status=$?
# ctest's result lines: "  12/120 Test  #34: name ......   Passed   12.34 sec"
echo
echo "The ten slowest tests:"
# (awk, not head, takes the first ten: head exits early, sort then dies of SIGPIPE, and pipefail
# made a fresh run exit 141 instead of with ctest's status, before the failure report.)
sed -nE 's/^ *[0-9]+\/[0-9]+ Test +#[0-9]+: ([^ ]+) .* ([0-9.]+) sec$/\2 \1/p' "$log" |
  sort -rn | awk 'NR <= 10 {printf "  %8.1f s  %s\n", $1, $2}' || true
# Each failed test's output block (--output-on-failure prints it right after its result line).
awk '
  /^ *[0-9]+\/[0-9]+ Test +#[0-9]+: / || /^ *Start +[0-9]+: / {
    if (name != "") report()
    name = ""
    if ($0 ~ /\*\*\*(Failed|Timeout|Exception)|Not Run/) { name = $4; verdict = $0; n = 0; k = 0 }
    next
  }
  /^[0-9]+% tests passed/ { if (name != "") report(); name = "" }
  name != "" {
    n++; tail[n % 15] = $0
    if ($0 ~ /FAIL|Failure|[Ee]rror|what\(\)|Expected|Which is|Timeout/ && k < 20) key[++k] = $0
  }
  function report(   i) {
    print ""; print "Why " name " failed:"; sub(/^ */, "", verdict); print "  " verdict
    for (i = 1; i <= k; i++) print "  | " key[i]
    print "  last lines:"
    for (i = (n > 15 ? n - 14 : 1); i <= n; i++) print "  | " tail[i % 15]
  }
' "$log"
echo
sed -nE '/^[0-9]+% tests passed/,$p' "$log"
exit "$status"
