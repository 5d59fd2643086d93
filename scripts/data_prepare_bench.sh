#!/usr/bin/env bash
# Throughput and peak memory of `dtrain data prepare` on a large generated alpaca JSONL:
# MB/s and tokens/s (from dtrain's summary line) and peak RSS (/usr/bin/time -v) with 1
# and 2 threads, for the byte tokenizer and, when given, a real tokenizer.json (e.g. the
# Llama 3 one scripts/fetch_test_assets.sh puts under build-assets/). The input (32 MB of
# distinct records, repeated to the size) and the shards live in a temporary directory
# that is removed at the end. Prints figures; asserts nothing.
#   scripts/data_prepare_bench.sh [BUILD_DIR] [MB] [TOKENIZER_JSON] [BPE_MB]
# BPE_MB (default MB): the input size for the tokenizer.json runs, which are slower.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-${repo}/build}"
mb="${2:-1024}"
tokjson="${3:-}"
bpe_mb="${4:-${mb}}"
[[ -x "${build}/dtrain" ]] || { echo "data_prepare_bench: build the dtrain target in ${build}" >&2; exit 2; }
[[ -x /usr/bin/time ]] || { echo "data_prepare_bench: needs /usr/bin/time (GNU time, for peak RSS)" >&2; exit 2; }
tmp="$(mktemp -d "${TMPDIR:-/tmp}/dtrain-prepare-bench-XXXXXX")"
trap 'rm -rf "${tmp}"' EXIT

python3 - "${tmp}/block.jsonl" <<'PY'
import json, random, sys
random.seed(7)
words = ("the of and to in is was for that with as on by at from it an be this which or are his had not but "
         "were have one their all been has more when who new first there can also after its two time into some "
         "other would over most only may than such about these many then them so years three because during "
         "model training data token answer question explain write list code function value number result").split()
extra = ["中文", "日本語", "🙂", "café", "x = 42;", "if (a < b) {", "2024", "\t", "  "]
def text(n):
    return " ".join(random.choice(extra) if random.random() < 0.03 else random.choice(words) for _ in range(n))
with open(sys.argv[1], "w", encoding="utf-8") as f:
    size = 0
    while size < 32 << 20:
        rec = {"instruction": text(random.randint(5, 60)), "input": text(random.randint(0, 40)),
               "output": text(random.randint(10, 200))}
        line = json.dumps(rec, ensure_ascii=False) + "\n"
        f.write(line)
        size += len(line.encode("utf-8"))
PY

make_input() {  # make_input MB -> ${tmp}/in.jsonl of about MB megabytes
  rm -f "${tmp}/in.jsonl"
  local block_mb=$(( $(stat -c %s "${tmp}/block.jsonl") / 1000000 ))
  for ((i = 0; i * block_mb < $1; i++)); do cat "${tmp}/block.jsonl" >> "${tmp}/in.jsonl"; done
  echo "input: $(( $(stat -c %s "${tmp}/in.jsonl") / 1000000 )) MB, $(wc -l < "${tmp}/in.jsonl") alpaca records"
}

run() {  # run TOKENIZER THREADS
  rm -f "${tmp}/out.bin"
  /usr/bin/time -v -o "${tmp}/time.txt" "${build}/dtrain" data prepare "${tmp}/in.jsonl" "${tmp}/out.bin" \
    --format alpaca --tokenizer "$1" --threads "$2" 2> "${tmp}/err.txt" > /dev/null || {
    cat "${tmp}/err.txt" >&2
    exit 1
  }
  local summary rss
  summary=$(grep -o '[0-9.]* MB in [0-9.]* s, [0-9.]* MB/s, [0-9]* tokens/s' "${tmp}/err.txt" | tail -1)
  rss=$(awk -F': ' '/Maximum resident set size/ {printf "%.0f", $2 / 1024}' "${tmp}/time.txt")
  printf '  %-8s threads %s: %s, peak RSS %s MB, %s progress lines\n' "$3" "$2" "${summary}" "${rss}" \
    "$(grep -c ' MB read (' "${tmp}/err.txt" || true)"
}

make_input "${mb}"
run byte 1 byte
run byte 2 byte
if [[ -n "${tokjson}" ]]; then
  [[ "${bpe_mb}" == "${mb}" ]] || make_input "${bpe_mb}"
  echo "tokenizer: ${tokjson}"
  run "${tokjson}" 1 bpe
  run "${tokjson}" 2 bpe
fi
