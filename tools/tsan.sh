#!/usr/bin/env bash
# ThreadSanitizer over the suites where cairn's own threads meet: node_tests (transport, mailbox,
# liveness, ZAP; RingClusterSync: a node's rings on threads sharing one mailbox and transport),
# collectives_tests (ranks as threads) and coordinator_web_tests (the coordinator's web server:
# its listening and request threads, concurrent clients, stop). Builds them into build-tsan/
# (-fsanitize=thread on cairn's code; a clean build takes ~10 minutes on 2 cores) and runs them;
# any report fails the run.
#   tools/tsan.sh [extra ctest args]        CAIRN_TSAN_BUILD_DIR=... to build elsewhere
# The Debian libraries (libtorch, libzmq, libgomp) are not instrumented, so their own
# synchronisation is invisible to TSan: tools/tsan.supp suppresses reports whose frames lie inside
# them, never a report in cairn's code. docs/THREADS.md says which thread touches what.
set -euo pipefail
cd "$(dirname "$0")/.."
CAIRN_SETUP_PACKAGES_ONLY=1 tools/setup.sh  # the Debian packages only; build-tsan/ is built below
if ! dpkg-query -W -f='${Status}' libtsan2 2>/dev/null | grep -q "install ok installed"; then
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get install -y -qq --no-install-recommends libtsan2
fi
BUILD_DIR=${CAIRN_TSAN_BUILD_DIR:-build-tsan}
if [[ ! -f "$BUILD_DIR/build.ninja" ]]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCAIRN_TSAN=ON
fi
cmake --build "$BUILD_DIR" -j "${CAIRN_JOBS:-$(nproc)}" \
  --target node_tests collectives_tests collectives_rank coordinator_web_tests
export TSAN_OPTIONS="suppressions=$PWD/tools/tsan.supp halt_on_error=1 abort_on_error=0 exitcode=66 second_deadlock_stack=1"
export OMP_NUM_THREADS=1
cd "$BUILD_DIR/tests"
# Every case of the executables, except the collectives whose ranks are separate processes
# (one thread each, so nothing for TSan to see; their 10 s peer timeouts do not survive TSan's
# 5-15x slow-down, which would fail them for the wrong reason). The ranks-as-threads suites run the
# same algorithms with every rank in one process.
status=0
for suite in node_tests collectives_tests coordinator_web_tests; do
  filter="*"
  [[ "$suite" == collectives_tests ]] && filter="-*OverProcesses*"
  echo "tsan: $suite (--gtest_filter=$filter)"
  if ! ./"$suite" --gtest_brief=1 --gtest_filter="$filter" "$@"; then
    echo "tsan: $suite FAILED (a ThreadSanitizer report exits 66; see above)"
    status=1
  fi
done
if ((status == 0)); then
  echo "tsan: node_tests, collectives_tests, coordinator_web_tests clean"
fi
exit $status
