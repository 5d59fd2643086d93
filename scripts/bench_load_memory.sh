#!/usr/bin/env bash
# Each rank's peak host memory (VmHWM) of a real-size model loaded from HF shards and
# trained one step at ZeRO-3 on CPU ranks of this machine, beside the full model's size and
# dtrain's own plan (--dry-run):
#
#   scripts/bench_load_memory.sh MODEL_DIR NPROC [full|lora] [STAGE]    (default: lora 3)
#
# MODEL_DIR is an HF checkpoint directory (scripts/make_random_hf.py writes a random one of
# Qwen2.5-1.5B's shape). The job: one step of micro-batch 1 x 64 tokens of the shipped
# alpaca data (byte tokenizer), no evaluation; each rank logs "memory: rank R peak resident
# X GiB before the final export" (building, training and the checkpoint), which this script
# prints with the plan. The final export (rank 0 alone, from the checkpoint) is timed apart.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
model=$(cd "$1" && pwd)
nproc=${2:?NPROC}
mode=${3:-lora}
stage=${4:-3}
dtrain=${DTRAIN:-$root/build/dtrain}
work=$(mktemp -d /tmp/dtrain-loadmem.XXXXXX)
trap 'rm -rf "$work"' EXIT
{
  echo "train_batch_size: $nproc"
  echo "train_micro_batch_size_per_gpu: 1"
  echo "optimizer: {type: AdamW, params: {lr: 1.0e-5}}"
  echo "zero_optimization: {stage: $stage}"
  echo "model: {init_from: $model}"
  echo "data: {train: $root/configs/data/tasks/train.jsonl, format: alpaca, tokenizer: byte, template: plain, seq_len: 64, pack: true}"
  echo "training: {max_steps: 1, save_steps: 0, eval_steps: 0, device: cpu, output_dir: $work/run}"
  if [ "$mode" = lora ]; then
    echo "lora: {r: 8, alpha: 16, target_modules: [q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]}"
  fi
} >"$work/job.yaml"
weights=$(du -cb "$model"/*.safetensors | tail -1 | cut -f1)
echo "bench_load_memory: $model ($((weights / 1000000)) MB of safetensors), $nproc CPU rank(s), $mode, ZeRO stage $stage"
"$dtrain" launch --dry-run --config "$work/job.yaml" --nproc-per-node "$nproc" | sed -n '/^memory per rank/,$p'
start=$(date +%s.%N)
DTRAIN_NUM_THREADS=${DTRAIN_NUM_THREADS:-1} "$dtrain" launch --config "$work/job.yaml" --nproc-per-node "$nproc" \
  >"$work/launch.log" 2>&1 || { tail -30 "$work/launch.log"; exit 1; }
end=$(date +%s.%N)
grep -h "memory: rank" "$work/launch.log" "$work"/run/logs/* 2>/dev/null | sed 's/^.*memory: /  /' | sort -u
grep -h "wrote .*final" "$work/launch.log" | head -1 | sed 's/^/  /'
echo "  wall $(echo "$end - $start" | bc) s (launch to exit, export included)"
