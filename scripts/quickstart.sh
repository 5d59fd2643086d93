#!/usr/bin/env bash
# README command 1: install, build, and run the embedded default job (a tiny model on
# the shipped data, one CPU rank) in ./runs/.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/setup.sh"
# Only the product, the dtrain binary (with its CUDA kernels where nvcc exists), not the
# test suites; scripts/test.sh later builds those with the same flags and reuses this.
DTRAIN_BUILD_TARGETS=dtrain bash "$root/scripts/build.sh"
cd "$root"
# A fresh run directory each time: dtrain never overwrites or silently continues a run
# (continue one with: build/dtrain resume runs/quickstart-...).
run_dir="runs/quickstart-$(date +%Y%m%d-%H%M%S)"
"$root/build/dtrain" launch --output-dir "$run_dir" "$@"
echo
echo "held-out accuracy of the trained model (dtrain eval $run_dir):"
exec "$root/build/dtrain" eval "$run_dir" --max-records 200
