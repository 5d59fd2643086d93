#!/usr/bin/env bash
# README command 2: install (with test extras), build, and run every test through ctest.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/setup.sh" --test
bash "$root/scripts/build.sh"
cd "$root/build"
ctest --output-on-failure -j "${DTRAIN_TEST_JOBS:-2}" --timeout 600
