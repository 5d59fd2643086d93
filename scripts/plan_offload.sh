#!/usr/bin/env bash
# docs/gpu.md's ZeRO-Offload planning table: `dtrain launch --plan-for` for full fine-tuning
# of Llama-3.1-8B and Qwen2.5-7B (their published config.json, tests/data/hf_configs, the
# ones examples/ plans with) on 8 GPUs of one node and on 1 GPU, at ZeRO stages 2-3 with
# and without offload; prints each rank's planned GPU and host GiB.
# Usage: scripts/plan_offload.sh [path/to/dtrain]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
dtrain=${1:-$here/build/dtrain}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/job.yaml" <<EOC
train_micro_batch_size_per_gpu: 1
gradient_accumulation_steps: 8
gradient_clipping: 1.0
bf16: {enabled: true}
activation_checkpointing: {enabled: true}
data: {train: $here/configs/data/tasks/train.jsonl, format: alpaca, template: plain, seq_len: 2048}
training: {max_steps: 10, device: cuda}
EOC
printf '%-12s %-5s %-5s %-18s %10s %10s\n' model gpus stage offload "GPU GiB" "host GiB"
for model in llama3.1-8b qwen2.5-7b; do
  for gpus in 8 1; do
    for v in "2 none none" "3 none none" "2 cpu none" "3 cpu none" "3 cpu cpu"; do
      read -r stage opt par <<<"$v"
      # exit 2 when a rank does not fit 80 GB: the plan is printed all the same.
      out=$("$dtrain" launch --config "$tmp/job.yaml" --plan-for "${gpus}x80GB" \
        --set model.init_from="$here/tests/data/hf_configs/$model" --set zero_optimization.stage="$stage" \
        --set zero_optimization.offload_optimizer.device="$opt" --set zero_optimization.offload_param.device="$par" \
        --set zero_optimization.offload_optimizer.pin_memory=true 2>&1) || true
      gpu=$(sed -n 's/^  device \([0-9.]*\) GiB.*/\1/p' <<<"$out")
      host=$(sed -n 's/^  host   \([0-9.]*\) GiB.*/\1/p' <<<"$out")
      what=none
      [ "$opt" = cpu ] && what=optimizer
      [ "$par" = cpu ] && what="optimizer+param"
      printf '%-12s %-5s %-5s %-18s %10s %10s\n' "$model" "$gpus" "$stage" "$what" "$gpu" "$host"
    done
  done
done
