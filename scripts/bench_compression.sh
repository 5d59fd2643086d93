#!/usr/bin/env bash
# Gradient compression on a namespace cluster (3 nodes x 1 rank, Llama d_model 256 x 4
# layers, 3.4M params: a 13.6 MB fp32 gradient), with every node's link shaped to RATE
# and unshaped: for none / bf16 / powersgd rank 2 and 4 (and rank 4 without error
# feedback) / topk 1%, the bytes rank 0 sent per step, the step time (both averaged over
# the records after the first) and the loss at the last step; none and powersgd rank 4
# once per seed, for the seed spread. Prints figures; asserts nothing. Needs root.
#   scripts/bench_compression.sh [RATE] [STEPS] [SEEDS]   (default 100mbit 15 2)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${DTRAIN_BIN:-$root/build/dtrain}
rate=${1:-100mbit}; steps=${2:-15}; seeds=${3:-2}
state=$(mktemp -d /tmp/dtrain-compress-bench.XXXXXX)
trap 'bash "$root/scripts/test_cluster.sh" down "$state" >/dev/null 2>&1 || true; rm -rf "$state"' EXIT
bash "$root/scripts/test_cluster.sh" up 3 "$state" 1 >/dev/null
cat > "$state/model.yaml" <<YAML
train_micro_batch_size_per_gpu: 4
gradient_accumulation_steps: 1
steps_per_print: 5
optimizer: {type: AdamW, params: {lr: 1.0e-3}}
model: {architecture: llama, vocab_size: 512, n_layer: 4, n_head: 4, n_kv_head: 2, d_model: 256, d_ff: 768, max_seq_len: 128}
data: {train: $root/configs/data/tasks/train.jsonl, format: alpaca, tokenizer: byte, seq_len: 128}
training: {max_steps: $steps, device: cpu}
YAML
run() {  # LABEL SEED SETS...
  local label=$1 seed=$2 dir="$state/run-$RANDOM"
  shift 2
  "$bin" launch --config "$state/model.yaml" --hostfile "$state/hostfile" --output-dir "$dir" --master-port 0 \
    --set cluster.ssh.identity_file="$state/id_ed25519" --set cluster.ssh.known_hosts="$state/known_hosts" \
    --set fault_tolerance.max_retries=0 --set training.seed="$seed" "$@" >"$dir.log" 2>&1 ||
    { echo "$label failed:"; tail -5 "$dir.log"; return 0; }
  python3 - "$dir/metrics.jsonl" "$label" "$seed" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if '"step_time"' in l]
tail = recs[1:] or recs
avg = lambda k: sum(r.get(k, 0.0) for r in tail) / len(tail)
print(f"  {sys.argv[2]:<24} seed {sys.argv[3]:<3} {avg('comm_bytes_sent'):14,.0f} B/step {1e3*avg('step_time'):9.0f} ms/step"
      f"  loss@{recs[-1]['step']} {recs[-1]['loss']:.4f}")
PY
}
methods() {
  for s in $(seq 1 "$seeds"); do run none "$s" --set communication.compression=none; done
  run bf16 1 --set communication.compression=bf16
  run "powersgd r2" 1 --set communication.compression=powersgd --set communication.powersgd.rank=2 \
    --set communication.powersgd.start_step=2
  for s in $(seq 1 "$seeds"); do
    run "powersgd r4" "$s" --set communication.compression=powersgd --set communication.powersgd.rank=4 \
      --set communication.powersgd.start_step=2
  done
  run "powersgd r4 no feedback" 1 --set communication.compression=powersgd --set communication.powersgd.rank=4 \
    --set communication.powersgd.start_step=2 --set communication.powersgd.error_feedback=false
  run "topk 1%" 1 --set communication.compression=topk --set communication.topk.ratio=0.01
}
echo "3 namespace nodes x 1 rank, Llama d_model 256 x 4 layers (3.4M params), micro 4 x seq 128, $steps steps, ZeRO 0"
for i in 0 1 2; do bash "$root/scripts/test_cluster.sh" throttle "$state" "$i" "$rate"; done
echo "links shaped to $rate:"
methods
for i in 0 1 2; do bash "$root/scripts/test_cluster.sh" unthrottle "$state" "$i"; done
echo "links unshaped (veth):"
methods
