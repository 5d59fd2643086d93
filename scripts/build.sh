#!/usr/bin/env bash
# Configures and builds dtrain into ./build (or $DTRAIN_BUILD_DIR). Extra arguments go to
# the CMake configure step, e.g. scripts/build.sh -DDTRAIN_CUDA=OFF. Uses ccache when it
# is installed (the test set-up installs it: the EMU tree then reuses the main tree's
# objects for the modules without CUDA code).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${DTRAIN_BUILD_DIR:-$root/build}
jobs=${DTRAIN_JOBS:-$(nproc)}
launcher=()
if command -v ccache >/dev/null 2>&1; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo "${launcher[@]}" "$@" >/dev/null
cmake --build "$build" -j "$jobs"
