#!/usr/bin/env bash
# README command 1: install, build, and run the embedded default job (a tiny model on
# the shipped data, one CPU rank) in ./runs/.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/setup.sh"
bash "$root/scripts/build.sh"
cd "$root"
exec "$root/build/dtrain" launch "$@"
