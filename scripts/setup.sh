#!/usr/bin/env bash
# Installs everything dtrain needs on Debian 12 from Debian's packages (idempotent:
# packages already present are not touched). `--test` adds what the test suite uses
# (sshd for the namespace cluster, node/npm for the GPT-2 tokenizer check, and PyTorch for
# the HF families' reference when it can be installed); `--compare`
# adds PyTorch (python3-torch) for scripts/compare_cpu.py, never part of the default set.
# The CUDA toolkit (nvcc, NCCL, cuBLASLt) is expected in /usr/local/cuda when present.
set -euo pipefail

want_test=0
want_compare=0
for a in "$@"; do
  case "$a" in
    --test) want_test=1 ;;
    --compare) want_compare=1 ;;
    -h|--help) echo "usage: scripts/setup.sh [--test] [--compare]"; exit 0 ;;
    *) echo "setup.sh: unknown option '$a' (usage: scripts/setup.sh [--test] [--compare])" >&2; exit 2 ;;
  esac
done

pkgs=(build-essential cmake pkg-config git python3
      libcli11-dev libyaml-cpp-dev libssh2-1-dev libfmt-dev libboost-dev doctest-dev
      libgloo-dev libopenblas-dev nlohmann-json3-dev libssl-dev openssh-client patchelf
      libprotobuf-dev protobuf-compiler zlib1g-dev
      ccache lld)
# ccache and lld (ld.lld, which CMake then links with) are in the default set, not only the
# test extras: the quickstart's build then links faster, and the test run's configure of
# build/ is the quickstart's (same compiler launcher, same linker), so it reuses the
# quickstart's objects and its second tree (build-emu/) gets the first one's from ccache.
if [ "$want_test" = 1 ]; then
  # libboost-context-dev: the fibers of the CPU execution engine that runs the CUDA code
  # in tests (the EMU build tree).
  pkgs+=(openssh-server iproute2 procps slurmctld slurmd slurm-client munge libboost-context-dev)
  command -v npm >/dev/null 2>&1 || pkgs+=(npm)
fi
# PyTorch from Debian (1.13) for the CPU race against dtrain (scripts/compare_cpu.py).
if [ "$want_compare" = 1 ]; then pkgs+=(python3-torch); fi

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# A user-installed node/npm (not from Debian) is fine too.
if [ "${#missing[@]}" -eq 0 ]; then
  echo "setup.sh: all packages present"
else
  echo "setup.sh: installing ${missing[*]}"
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO=sudo; else
      echo "setup.sh: these Debian packages are missing: ${missing[*]}" >&2
      echo "setup.sh: run this script as root (or install them with apt-get as root)." >&2
      exit 1
    fi
  else
    SUDO=
  fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The test set-up also wants Debian's PyTorch: scripts/hf_reference.py, the independent
# reference the HF model families' logits and gradients are checked against
# (hf_family_parity_test). Optional: where it cannot be installed that test skips.
if [ "$want_test" = 1 ] && [ "$want_compare" = 0 ] &&
  ! dpkg-query -W -f='${Status}' python3-torch 2>/dev/null | grep -q "install ok installed"; then
  echo "setup.sh: installing python3-torch (the reference of hf_family_parity_test)"
  if [ "$(id -u)" -eq 0 ]; then SUDO=; elif command -v sudo >/dev/null 2>&1; then SUDO=sudo; else SUDO=false; fi
  { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3-torch; } ||
    echo "setup.sh: python3-torch not installed; hf_family_parity_test will skip"
fi

if [ "$want_test" = 1 ]; then
  here=$(cd "$(dirname "$0")" && pwd)
  if [ -x "$here/fetch_test_assets.sh" ] || [ -f "$here/fetch_test_assets.sh" ]; then
    bash "$here/fetch_test_assets.sh" || echo "setup.sh: test assets not fetched; the GPT-2 and Llama-2-style tokenizer checks will skip"
  fi
fi
if [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "setup.sh: no CUDA toolkit in /usr/local/cuda: dtrain builds CPU-only (DTRAIN_CUDA=AUTO)"
fi
