#!/usr/bin/env bash
# docs/gpu.md's ZeRO-Offload planning table: `dtrain launch --dry-run` for full fine-tuning
# of Llama-3-8B and Qwen2.5-7B shapes (model sections; Qwen2.5's q/k/v biases left out)
# on 8 GPUs of one node and on 1 GPU, at ZeRO stages 2-3 with and without offload; prints
# each rank's planned GPU and host GiB. Usage: scripts/plan_offload.sh [path/to/dtrain]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
dtrain=${1:-$here/build/dtrain}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# node1 is never contacted: a dry run plans only (and a remote host skips the local checks).
echo "node1 slots=8" > "$tmp/hosts8"
echo "node1 slots=1" > "$tmp/hosts1"
common="train_micro_batch_size_per_gpu: 1
gradient_accumulation_steps: 8
gradient_clipping: 1.0
bf16: {enabled: true}
activation_checkpointing: {enabled: true}
data: {train: $here/configs/data/tasks/train.jsonl, seq_len: 2048}
training: {max_steps: 10, device: cuda}"
cat > "$tmp/llama3-8b.yaml" <<EOC
$common
model: {architecture: llama, vocab_size: 128256, n_layer: 32, n_head: 32, n_kv_head: 8, d_model: 4096, d_ff: 14336, max_seq_len: 8192, rope_theta: 500000, tie_embeddings: false}
EOC
cat > "$tmp/qwen2.5-7b.yaml" <<EOC
$common
model: {architecture: llama, vocab_size: 152064, n_layer: 28, n_head: 28, n_kv_head: 4, d_model: 3584, d_ff: 18944, max_seq_len: 32768, rope_theta: 1000000, tie_embeddings: false}
EOC
printf '%-11s %-5s %-5s %-18s %10s %10s\n' model gpus stage offload "GPU GiB" "host GiB"
for model in llama3-8b qwen2.5-7b; do
  for gpus in 8 1; do
    for v in "2 none none" "3 none none" "2 cpu none" "3 cpu none" "3 cpu cpu"; do
      read -r stage opt par <<<"$v"
      out=$("$dtrain" launch --hostfile "$tmp/hosts$gpus" --config "$tmp/$model.yaml" --dry-run \
        --set zero_optimization.stage="$stage" --set zero_optimization.offload_optimizer.device="$opt" \
        --set zero_optimization.offload_param.device="$par" --set zero_optimization.offload_optimizer.pin_memory=true)
      gpu=$(sed -n 's/^  device \([0-9.]*\) GiB.*/\1/p' <<<"$out")
      host=$(sed -n 's/^  host   \([0-9.]*\) GiB.*/\1/p' <<<"$out")
      what=none
      [ "$opt" = cpu ] && what=optimizer
      [ "$par" = cpu ] && what="optimizer+param"
      printf '%-11s %-5s %-5s %-18s %10s %10s\n' "$model" "$gpus" "$stage" "$what" "$gpu" "$host"
    done
  done
done
