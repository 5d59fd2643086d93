#!/usr/bin/env bash
# Builds the GPU check's bundle here, with this machine's nvcc, for a GPU machine that has
# CUDA 13 but none of dtrain's Debian libraries (docs/gpu.md "Checking on a real GPU"):
#
#   scripts/gpu_bundle.sh [--archs "80;90"|"90"] [--out DIR]      (default: "80;90", ./gpu-bundle)
#
# A tree (build-gpu/) for the named SM architectures, compiled as the test run compiles
# (-O2 -DNDEBUG, no debug info: ccache then serves it every object scripts/test.sh's
# build/ compiled, so after a test run only the links are new), holds dtrain,
# apps/hf_logits and every GPU test binary of the real build; the bundle gets them stripped
# in bin/, the shared libraries they need outside the system set and the CUDA toolkit in
# lib/ (scripts/bundle.sh --no-cuda-libs: cudart, cuBLASLt and NCCL are the GPU machine's
# own, found at run time by scripts/gpu_check.sh), the CPU reference of the check's job
# stage in ref/, and manifest.json (version, commit, architectures, sizes), and packs the
# folder as gpu-bundle.tar.gz: both are ignored by git, and the tarball travels to the GPU
# machine as a carried path (64 MiB at most).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
archs="80;90"
out=$root/gpu-bundle
while [ $# -gt 0 ]; do
  case "$1" in
    --archs) archs=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "gpu_bundle.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
nvcc=/usr/local/cuda/bin/nvcc
[ -x "$nvcc" ] || { echo "gpu_bundle.sh: no CUDA toolkit at /usr/local/cuda: the bundle needs nvcc" >&2; exit 2; }
build=${DTRAIN_GPU_BUILD_DIR:-$root/build-gpu}
tests=(kernels_conformance_test kernels_gemm_test kernels_attention_test gpu_cuda_device_test gpu_model_device_test
       gpu_families_device_test gpu_zero_device_test gpu_offload_device_test bench_train_test plan_budget_test
       comm_nccl_test gpu_local_comm_test gpu_ranks_local_test gpu_nccl_single_test kernels_hopper_check_test
       kernels_attention_hopper_test)
launcher=()
if command -v ccache >/dev/null 2>&1; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
t0=$SECONDS
export CCACHE_NOHASHDIR=1
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -DNDEBUG" \
  "-DCMAKE_CUDA_FLAGS_RELWITHDEBINFO=-O2 -DNDEBUG" -DDTRAIN_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$archs" \
  -DDTRAIN_TESTS=ON "${launcher[@]}" >/dev/null
cmake --build "$build" -j "${DTRAIN_JOBS:-$(nproc)}" --target dtrain hf_logits "${tests[@]}"
echo "gpu_bundle: built in $((SECONDS - t0)) s (sm $archs)"

# dtrain and its libraries, checked with an empty environment, by the portable-bundle script
bash "$root/scripts/bundle.sh" "$build" --no-cuda-libs >/dev/null
rm -rf "$out"
mkdir -p "$out"
cp -a "$build/bundle/bin" "$build/bundle/lib" "$out/"
for t in hf_logits "${tests[@]}"; do
  src=$build/$t
  [ -x "$src" ] || src=$(find "$build" -maxdepth 3 -type f -name "$t" -perm -u+x -print -quit)
  [ -n "$src" ] && [ -x "$src" ] || { echo "gpu_bundle.sh: $t was not built" >&2; exit 3; }
  cp "$src" "$out/bin/$t"
  patchelf --set-rpath '$ORIGIN/../lib' "$out/bin/$t"
done
strip --strip-unneeded "$out"/bin/*
# Every library a binary needs resolves in lib/, in the system set or in the CUDA toolkit.
bad=0
for f in "$out"/bin/*; do
  while read -r name arrow path _; do
    [[ "$arrow" == "=>" ]] || continue
    case "$name" in
      ld-linux*|linux-vdso*|libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|libresolv.so.*|libutil.so.*) continue ;;
      libcuda.so.*|libcudart.so*|libcublasLt.so*|libcublas.so*|libnccl.so*|libnvrtc.so*|libnvJitLink.so*) continue ;;
    esac
    case "$(readlink -f "$path" 2>/dev/null || echo "$path")" in
      "$(readlink -f "$out/lib")"/*) ;;
      *) echo "gpu_bundle.sh: $(basename "$f") needs $name from outside the bundle ($path)" >&2; bad=1 ;;
    esac
  done < <(ldd "$f")
done
(( bad == 0 )) || exit 3

# The job stage's reference: the same default job on this CPU (fp32), per-step losses.
python3 "$root/scripts/gpu_check.py" --make-reference "$out/bin/dtrain" --out "$out/ref"
version=$(env -i "$out/bin/dtrain" --version)
commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
dirty=$(git -C "$root" status --porcelain 2>/dev/null | grep -qv '^??' && echo true || echo false)
size=$(du -sm "$out" | cut -f1)
cat >"$out/manifest.json" <<JSON
{"version": "$version", "commit": "$commit", "uncommitted_changes": $dirty, "cuda_architectures": "$archs",
 "nvcc": "$($nvcc --version | tail -1)", "built": "$(date -u +%Y-%m-%dT%H:%M:%SZ)", "size_mib": $size,
 "binaries": [$(ls "$out/bin" | sed 's/.*/"&"/' | paste -sd,)]}
JSON
# What travels: one gzip tarball beside the folder (the binaries' sm_80 + sm_90 kernel images
# and OpenBLAS's kernels for every x86 CPU compress to about a third); gpu_check.sh unpacks
# it on the GPU machine when the folder is not there.
tar -C "$(dirname "$out")" -czf "$out.tar.gz" "$(basename "$out")"
packed=$(( ($(stat -c %s "$out.tar.gz") + 1048575) / 1048576 ))
echo "gpu_bundle: $out: ${size} MiB, $(ls "$out/bin" | wc -l) binaries, $(ls "$out/lib" | wc -l) libraries; $version"
echo "gpu_bundle: $out.tar.gz: ${packed} MiB (carry this one)"
if [ "$packed" -gt 60 ]; then
  echo "gpu_bundle.sh: the tarball is ${packed} MiB, over the ~60 MiB that leaves room under the 64 MiB carry limit;" \
       "build for fewer architectures (--archs 90)" >&2
  exit 4
fi
