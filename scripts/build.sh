#!/usr/bin/env bash
# Configures and builds dtrain into ./build (or $DTRAIN_BUILD_DIR). Extra arguments go to
# the CMake configure step, e.g. scripts/build.sh -DDTRAIN_CUDA=OFF.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${DTRAIN_BUILD_DIR:-$root/build}
jobs=${DTRAIN_JOBS:-$(nproc)}
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
cmake --build "$build" -j "$jobs"
