#!/usr/bin/env bash
# Installs the Debian 12 packages cairn needs (only those missing), then configures and builds
# into build/. Safe to re-run; as root it uses apt-get directly, otherwise sudo.
#   tools/setup.sh            # install + build
#   CAIRN_BUILD_DIR=... CAIRN_JOBS=... tools/setup.sh
#   CAIRN_TARGETS="provider" tools/setup.sh   # build only these targets (tools/demo.sh does)
#   CAIRN_SETUP_PACKAGES_ONLY=1 tools/setup.sh # install packages, build nothing (tools/tsan.sh)
#   CAIRN_LIBTORCH=/path/to/libtorch tools/setup.sh
#       build against another libtorch than Debian's, e.g. PyTorch's CUDA build (README "GPU
#       volunteers"): the folder holding share/cmake/Torch/TorchConfig.cmake (an unpacked libtorch
#       zip, or pip's site-packages/torch). The build folder is configured for it anew.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  build-essential cmake ninja-build pkg-config
  libtorch-dev python3-torch
  # Debian's torch calls BLAS through libblas.so.3; a bare Debian 12 has the reference BLAS there,
  # ~13x slower per matmul (3 vs 43 GFLOP/s on one core here). OpenBLAS's pthread build, which
  # is safe to call from several threads at once (its serial build is not: wrong results; its
  # OpenMP build neither, from threads OpenMP did not start). Its thread count changes results'
  # last bits, so cairn runs it on one thread (core/BlasThreads.h; OPENBLAS_NUM_THREADS=1 in tests).
  libopenblas0-pthread
  libzmq3-dev cppzmq-dev libmsgpack-cxx-dev nlohmann-json3-dev libhwloc-dev libcli11-dev
  libsodium-dev  # relayed links sealed end to end (node/transport/RelaySeal.h)
  libgtest-dev libgmock-dev zlib1g-dev libsqlite3-dev
  libpng-dev libjpeg62-turbo-dev python3-pil
  dataset-fashion-mnist time
  python3-matplotlib
  libcpp-httplib-dev chromium  # the coordinator's web view, and the browser its test loads it in
  sentencepiece python3-sentencepiece bible-kjv
  universal-ctags  # tools/check_sizes.sh (lint.sizes): each function's first and last line
  # The Debian packages (cmake/Packaging.cmake; ctest package.debs): man pages from --help,
  # dpkg-shlibdeps, lintian, systemd-analyze verify for the service unit.
  help2man dpkg-dev lintian systemd
  # Volunteers behind home routers, emulated: network namespaces behind MASQUERADE
  # (tests/integration/nat_test.py; docs/OPERATIONS.md "Behind a home router").
  iptables
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if [[ -n "${CAIRN_SETUP_PACKAGES_ONLY:-}" ]]; then exit 0; fi

BUILD_DIR=${CAIRN_BUILD_DIR:-build}
JOBS=${CAIRN_JOBS:-$(nproc)}
TORCH_ARGS=()
if [[ -n "${CAIRN_LIBTORCH:-}" ]]; then
  if [[ ! -f "$CAIRN_LIBTORCH/share/cmake/Torch/TorchConfig.cmake" ]]; then
    echo "setup: error: CAIRN_LIBTORCH=$CAIRN_LIBTORCH holds no share/cmake/Torch/TorchConfig.cmake" \
         "(give the unpacked libtorch folder, or the folder of: python3 -c 'import torch; print(torch.__file__)')" >&2
    exit 2
  fi
  TORCH_ARGS=(-DTorch_DIR="$(cd "$CAIRN_LIBTORCH" && pwd)/share/cmake/Torch")
fi
if [[ ! -f "$BUILD_DIR/build.ninja" || ${#TORCH_ARGS[@]} -gt 0 ]]; then
  # CI (CI=true) builds with -Werror; CAIRN_WERROR=ON asks for it anywhere.
  WERROR=${CAIRN_WERROR:-$([[ "${CI:-}" == "true" ]] && echo ON || echo OFF)}
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCAIRN_WERROR="$WERROR" \
    "${TORCH_ARGS[@]}"
fi
if [[ -n "${CAIRN_TARGETS:-}" ]]; then
  # shellcheck disable=SC2086
  cmake --build "$BUILD_DIR" -j "$JOBS" --target ${CAIRN_TARGETS}
else
  cmake --build "$BUILD_DIR" -j "$JOBS"
fi
