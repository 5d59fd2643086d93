#!/usr/bin/env bash
# Prints the cluster table of docs/cluster.md ("A step on N nodes"): `dtrain bench train
# --plan --cluster` for Llama-3-8B and Qwen2.5-7B (their config.json shapes in
# tests/data/hf_configs) on 1/2/4/8/16 nodes x 8 H100 at ZeRO 2 and 3, with 400 and 100 Gb/s
# per GPU. Predicted, nothing executes: needs no GPU.
#   scripts/cluster_table.sh [DTRAIN_BINARY]   (default: build/dtrain)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${1:-$root/build/dtrain}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# torchtitan's Llama 3 8B setting: local batch 2 x 8192 tokens, no accumulation; every layer
# recomputes (dtrain has no selective checkpointing); a stage-3 prefetch window of one layer.
cat > "$tmp/job.yaml" <<'YAML'
train_micro_batch_size_per_gpu: 2
gradient_accumulation_steps: 1
bf16: {enabled: true}
zero_optimization: {stage: 2, stage3_prefetch_bucket_size: 300000000}
activation_checkpointing: {enabled: true}
data: {train: x.jsonl, tokenizer: byte, seq_len: 8192}
training: {device: cuda, max_steps: 10}
YAML
for model in llama3.1-8b qwen2.5-7b; do
  for stage in 2 3; do
    for gbits in 400 100; do
      echo "## $model, ZeRO $stage, $gbits Gb/s per GPU"
      "$bin" bench train --plan --config "$tmp/job.yaml" --cluster 1x8,2x8,4x8,8x8,16x8 \
        --set "model.init_from=$root/tests/data/hf_configs/$model" --set "zero_optimization.stage=$stage" \
        --set "cluster.link.inter_node_gbits=$gbits" | sed -n '/^cluster plan, ZeRO/,$p'
      echo
    done
  done
done
