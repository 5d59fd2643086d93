#!/usr/bin/env bash
# Step time at ZeRO stages 0-3 on a namespace cluster (default 3 nodes x 1 rank), and
# the share of it the compute thread spent waiting on communication, from the runs'
# metrics.jsonl (wall_clock_breakdown). Prints figures; asserts nothing. Needs root.
#   scripts/bench_zero_stages.sh [NODES] [SLOTS] [STEPS] [OVERLAP true|false] [BUCKET]
# BUCKET = reduce_bucket_size in elements (default 500000, about one bucket per layer of
# this model: with a bucket larger than the model nothing can overlap with backward).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${DTRAIN_BIN:-$root/build/dtrain}
nodes=${1:-3}; slots=${2:-1}; steps=${3:-30}; overlap=${4:-false}; bucket=${5:-500000}
state=$(mktemp -d /tmp/dtrain-zero-bench.XXXXXX)
trap 'bash "$root/scripts/test_cluster.sh" down "$state" >/dev/null 2>&1 || true; rm -rf "$state"' EXIT
bash "$root/scripts/test_cluster.sh" up "$nodes" "$state" "$slots" >/dev/null
world=$((nodes * slots))
cat > "$state/model.yaml" <<YAML
train_micro_batch_size_per_gpu: 4
gradient_accumulation_steps: 1
steps_per_print: 5
wall_clock_breakdown: true
optimizer: {type: AdamW, params: {lr: 1.0e-3}}
model: {architecture: llama, vocab_size: 512, n_layer: 4, n_head: 4, n_kv_head: 2, d_model: 256, d_ff: 768, max_seq_len: 128}
data: {train: $root/configs/data/tasks/train.jsonl, format: alpaca, tokenizer: byte, seq_len: 128}
training: {max_steps: $steps, device: cpu}
YAML
printf "ZeRO stages on %d namespace node(s) x %d rank(s), Llama d_model 256 x 4 layers, micro 4 x seq 128, %d steps, overlap_comm %s, reduce_bucket_size %s\n" \
  "$nodes" "$slots" "$steps" "$overlap" "$bucket"
printf "%-6s %12s %14s %16s %12s %10s\n" stage "step (ms)" "comm wait (ms)" "comm overlap (ms)" "wait share" "tokens/s"
for stage in 0 1 2 3; do
  run="$state/run-$stage"
  "$bin" launch --config "$state/model.yaml" --hostfile "$state/hostfile" --output-dir "$run" --master-port 0 \
    --set cluster.ssh.identity_file="$state/id_ed25519" --set cluster.ssh.known_hosts="$state/known_hosts" \
    --set zero_optimization.stage=$stage --set zero_optimization.overlap_comm=$overlap \
    --set zero_optimization.reduce_bucket_size=$bucket \
    --set fault_tolerance.max_retries=0 >"$state/log-$stage" 2>&1 || { echo "stage $stage failed:"; tail -5 "$state/log-$stage"; continue; }
  [ "$stage" = 0 ] && grep -m1 "^train:" "$state/log-$stage" | sed 's/^/  /'
  # Average over the records after the first (warm-up) interval.
  python3 - "$run/metrics.jsonl" "$stage" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if '"step_time"' in l][1:]
n = len(recs) or 1
avg = lambda k: sum(r.get(k, 0.0) for r in recs) / n
st = 1e3 * avg("step_time"); wait = avg("comm_exposed_ms"); ov = avg("comm_overlapped_ms")
print(f"{sys.argv[2]:<6} {st:12.1f} {wait:14.1f} {ov:16.1f} {100*wait/st if st else 0:11.1f}% {avg('tokens_per_s'):10.0f}")
PY
done
