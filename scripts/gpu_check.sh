#!/usr/bin/env bash
# The GPU check (docs/gpu.md "Checking on a real GPU"): on a GPU machine, from the repository root
# with the bundle of scripts/gpu_bundle.sh carried as ./gpu-bundle, runs env, tests,
# sanitizer, job, speed, losses, offload, peers, hf, profile, attention, ranks and race8b, each
# bounded in time, and writes $OUT/gpu_check.md and $OUT/gpu_check.json after each stage (a cut-off run keeps what
# finished). Exit 0 when no stage failed.
#
#   scripts/gpu_check.sh [--only STAGE,...] [--bundle DIR] [--out DIR] [--budget SECONDS]
#   scripts/gpu_check.sh --rehearse [--build build-emu] ...   (here: the EMU tree, tiny shapes)
#
# The stages are scripts/gpu_check.py (python3, standard library); the hf stage also uses
# scripts/gpu_hf_parity.py and the peers stage scripts/compare_pytorch.py (PyTorch).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
py=${DTRAIN_PYTHON:-python3}
command -v "$py" >/dev/null || { echo "gpu_check.sh: $py not found (set DTRAIN_PYTHON)" >&2; exit 2; }
cd "$root"
exec "$py" "$root/scripts/gpu_check.py" "$@"
