#!/usr/bin/env bash
# Configures and builds dtrain into ./build (or $DTRAIN_BUILD_DIR). Extra arguments go to
# the CMake configure step, e.g. scripts/build.sh -DDTRAIN_CUDA=OFF. DTRAIN_BUILD_TARGETS
# (space-separated) builds only those targets (the quickstart: dtrain), else everything.
# Uses ccache when it is installed (scripts/setup.sh installs it: the EMU tree then reuses
# the main tree's objects for the modules without CUDA code).
#
# One set of flags for every build the scripts make (the quickstart's, the test run's):
# -O2 without debug info (-g costs about a quarter more compile and link time on a clean
# clone). The test run then finds the quickstart's objects up to date instead of
# recompiling them with other flags. A later -DCMAKE_*_FLAGS_RELWITHDEBINFO=... argument
# overrides these (e.g. "-O2 -g -DNDEBUG" for a debugger).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${DTRAIN_BUILD_DIR:-$root/build}
jobs=${DTRAIN_JOBS:-$(nproc)}
flags=("-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -DNDEBUG" "-DCMAKE_CUDA_FLAGS_RELWITHDEBINFO=-O2 -DNDEBUG")
launcher=()
if command -v ccache >/dev/null 2>&1; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
# ccache keys an object on its compile command, which names the build directory (a unity
# batch lives there, -I paths point into it): with the source root as base directory those
# paths are relative, so ./build and ./build-emu share every object whose command is the
# same (the lib/ modules outside their CUDA glue, CMakeLists.txt). The test files include
# one precompiled header (tests/test_pch.h), which ccache caches only with this sloppiness.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$root}
export CCACHE_NOHASHDIR=1
export CCACHE_SLOPPINESS=${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}
# --no-warn-unused-cli: the CUDA flags go to every tree on purpose; a tree without the CUDA
# language (EMU, OFF, no nvcc) does not read them, which CMake would warn about.
cmake -S "$root" -B "$build" --no-warn-unused-cli -DCMAKE_BUILD_TYPE=RelWithDebInfo "${launcher[@]}" "${flags[@]}" "$@" \
  >/dev/null
targets=()
for t in ${DTRAIN_BUILD_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$build" -j "$jobs" "${targets[@]}"
