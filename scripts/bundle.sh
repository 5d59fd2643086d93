#!/usr/bin/env bash
# Packs a built dtrain into BUILD/bundle/ (bin/dtrain + lib/ with every shared library it
# needs outside the target machine's system set) and BUILD/dtrain-bundle.tar.gz, with
# RUNPATH $ORIGIN/../lib on the binary and $ORIGIN on each library (patchelf), then checks
# it: `env -i bundle/bin/dtrain --version` and ldd of every ELF file in the bundle.
#
#   scripts/bundle.sh [BUILD_DIR] [--no-cuda-libs]
#
# System set (NOT carried; every Linux box with an NVIDIA driver has them): the dynamic
# loader, glibc (libc, libm, libpthread, libdl, librt, libresolv, libutil) and the CUDA
# driver libcuda.so.1. Everything else is carried: libstdc++/libgcc_s (Debian 12's GCC 12
# runtime is newer than older distributions'), yaml-cpp, fmt, libssh2 + OpenSSL + zlib,
# protobuf-lite (TensorBoard event files), gloo, OpenBLAS + gfortran/quadmath, and in a
# CUDA build cudart, cuBLASLt/cuBLAS and NCCL (the bundle then needs only a driver that
# supports CUDA 13). --no-cuda-libs leaves the CUDA toolkit libraries out (about 750 MB)
# and relies on the machine's CUDA 13 runtime: they must then be on its loader path
# (ld.so.conf or LD_LIBRARY_PATH).
set -euo pipefail

build=build
carry_cuda=1
for a in "$@"; do
  case "$a" in
    --no-cuda-libs) carry_cuda=0 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    -*) echo "bundle.sh: unknown option $a" >&2; exit 2 ;;
    *) build="$a" ;;
  esac
done
bin="$build/dtrain"
[[ -x "$bin" ]] || { echo "bundle.sh: no binary at $bin: build first (scripts/build.sh) or pass the build directory" >&2; exit 2; }
command -v patchelf >/dev/null || { echo "bundle.sh: patchelf is missing: apt-get install patchelf" >&2; exit 2; }

system_re='^(ld-linux[^ ]*|linux-vdso[^ ]*|libc\.so\.[0-9]+|libm\.so\.[0-9]+|libpthread\.so\.[0-9]+|libdl\.so\.[0-9]+|librt\.so\.[0-9]+|libresolv\.so\.[0-9]+|libutil\.so\.[0-9]+|libcuda\.so\.[0-9]+)$'
cuda_re='^(libcudart|libcublasLt|libcublas|libnccl|libnvrtc|libnvJitLink)\.so'

out="$build/bundle"
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
cp "$bin" "$out/bin/dtrain"

# ldd lists the transitive closure: "libfoo.so.1 => /path/libfoo.so.1 (0x...)".
missing=0
while read -r name arrow path _; do
  [[ "$arrow" == "=>" ]] || continue
  if [[ "$path" == "not" ]]; then echo "bundle.sh: $name is not found on this machine" >&2; missing=1; continue; fi
  [[ "$name" =~ $system_re ]] && continue
  if [[ $carry_cuda == 0 && "$name" =~ $cuda_re ]]; then continue; fi
  cp -L "$path" "$out/lib/$name"
  chmod u+w "$out/lib/$name"
done < <(ldd "$bin")
(( missing == 0 )) || exit 3

patchelf --set-rpath '$ORIGIN/../lib' "$out/bin/dtrain"
for f in "$out"/lib/*; do patchelf --set-rpath '$ORIGIN' "$f"; done

# ---- checks: runs with an empty environment, and nothing resolves outside the bundle
# except the system set.
version=$(env -i "$out/bin/dtrain" --version)
echo "bundle: $version"
bad=0
for f in "$out/bin/dtrain" "$out"/lib/*; do
  while read -r name arrow path _; do
    [[ "$arrow" == "=>" ]] || continue
    [[ "$name" =~ $system_re ]] && continue
    if [[ $carry_cuda == 0 && "$name" =~ $cuda_re ]]; then continue; fi
    case "$(readlink -f "$path" 2>/dev/null || echo "$path")" in
      "$(readlink -f "$out/lib")"/*) ;;
      *) echo "bundle.sh: $(basename "$f") needs $name, resolved outside the bundle: $path" >&2; bad=1 ;;
    esac
  done < <(env -i ldd "$f")
done
(( bad == 0 )) || exit 3

tar -C "$build" -czf "$build/dtrain-bundle.tar.gz" bundle
echo "bundle: $out ($(du -sh "$out" | cut -f1)), $(ls "$out/lib" | wc -l) libraries: $(ls "$out/lib" | tr '\n' ' ')"
echo "bundle: $build/dtrain-bundle.tar.gz ($(du -h "$build/dtrain-bundle.tar.gz" | cut -f1))"
