#!/usr/bin/env bash
# README command 1: install, build, and run the embedded default job (a tiny model on
# the shipped data, one CPU rank) in ./runs/.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/setup.sh"
# Only the product, the dtrain binary (with its CUDA kernels where nvcc exists), not the
# test suites; scripts/test.sh later builds those with the same flags and reuses this.
# A fresh tree is configured for the GPUs this machine has ("native"), or, with none, for
# sm_80 and sm_90 as scripts/test.sh configures it (so the test build reuses the objects),
# not for every card the CMake default serves: each architecture adds nvcc time to every
# kernel file (about 3x for all six). DTRAIN_CUDA_ARCHITECTURES overrides; a tree
# configured before keeps its architectures.
arch_args=()
if [ ! -f "$root/build/CMakeCache.txt" ]; then
  if [ -n "${DTRAIN_CUDA_ARCHITECTURES:-}" ]; then
    arch_args=("-DCMAKE_CUDA_ARCHITECTURES=$DTRAIN_CUDA_ARCHITECTURES")
  elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    arch_args=("-DCMAKE_CUDA_ARCHITECTURES=native")
  else
    arch_args=("-DCMAKE_CUDA_ARCHITECTURES=80;90")
  fi
fi
DTRAIN_BUILD_TARGETS=dtrain bash "$root/scripts/build.sh" "${arch_args[@]}"
cd "$root"
# A fresh run directory each time: dtrain never overwrites or silently continues a run
# (continue one with: build/dtrain resume runs/quickstart-...).
run_dir="runs/quickstart-$(date +%Y%m%d-%H%M%S)"
"$root/build/dtrain" launch --output-dir "$run_dir" "$@"
# The same held-out records answered by the initial weights (the job's seed) and by the
# trained model, each figure beside the other.
echo
echo "held-out accuracy before training (dtrain eval $run_dir --init: the initial weights):"
before=$("$root/build/dtrain" eval "$run_dir" --init --max-records 200)
echo "$before"
echo
echo "after training (dtrain eval $run_dir):"
after=$("$root/build/dtrain" eval "$run_dir" --max-records 200)
echo "$after"
echo
echo "held-out $(grep '^accuracy' <<<"$before" | sed 's/^accuracy //') before training -> $(grep '^accuracy' <<<"$after" | sed 's/^accuracy //') after"
echo "try the model: build/dtrain chat $run_dir   (one instruction per line, Ctrl-D ends)"
