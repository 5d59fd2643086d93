#!/usr/bin/env bash
# Compiler launcher for kernels/*.cu (CMake's CUDA_COMPILER_LAUNCHER on dtrain_kernels):
# runs the compile it is given (through ccache when that follows), keeps ptxas's resource
# report (-Xptxas -v: registers, spill stores/loads, stack, static shared memory per kernel
# and architecture) in <object>.ptxas beside the object, and passes every other line of
# the compiler's stderr through. scripts/kernel_resources.py gates on those files. ccache
# replays a cached compile's stderr, so a cache hit writes the report too.
set -uo pipefail
out=""
prev=""
for a in "$@"; do
  [ "$prev" = "-o" ] && out=$a
  prev=$a
done
err=$(mktemp)
trap 'rm -f "$err"' EXIT
"$@" 2>"$err"
rc=$?
# ptxas -v writes "ptxas info    : ..." lines, each kernel's "Function properties" followed
# by an indented "N bytes stack frame, N bytes spill stores, N bytes spill loads" line.
report='^ptxas info|^ +[0-9]+ bytes stack frame'
if [ -n "$out" ] && [ "$rc" -eq 0 ]; then
  grep -E "$report" "$err" >"$out.ptxas.tmp" || true
  mv "$out.ptxas.tmp" "$out.ptxas"
fi
grep -v -E "$report" "$err" >&2 || true
exit $rc
