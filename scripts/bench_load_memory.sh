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
# prints with the plan. The final export (rank 0 alone, streamed from the checkpoint) is
# timed with the rest. Under LoRA the base is frozen, so final/ (bf16) must hold exactly the
# checkpoint's bf16 bytes: the script compares every base tensor's bytes (the round trip).
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
grep -h "wrote .*final" "$work/launch.log" | sed -n '1s/^/  /p'
echo "  wall $(echo "$end - $start" | bc) s (launch to exit, export included)"
if [ "$mode" = lora ]; then
  python3 - "$model" "$work/run/final" <<'PY'
import json, os, struct, sys
def tensors(d):
    out = {}
    for f in sorted(os.listdir(d)):
        if not f.endswith(".safetensors") or f.startswith("adapter"):
            continue
        p = os.path.join(d, f)
        with open(p, "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            h = json.loads(fh.read(n))
        for k, v in h.items():
            if k != "__metadata__":
                out[k] = (p, 8 + n + v["data_offsets"][0], v["data_offsets"][1] - v["data_offsets"][0], v["dtype"])
    return out
src, dst = tensors(sys.argv[1]), tensors(sys.argv[2])
same = diff = 0
for k, (p, off, n, dt) in src.items():
    q = dst.get(k)
    if q is None or q[2] != n or q[3] != dt:
        diff += 1
        continue
    with open(p, "rb") as a, open(q[0], "rb") as b:
        a.seek(off); b.seek(q[1])
        left, ok = n, True
        while left and ok:
            c = min(left, 1 << 24)
            ok = a.read(c) == b.read(c)
            left -= c
    same += ok
    diff += not ok
print(f"  round trip: {same} of {len(src)} base tensors byte-identical in final/ ({diff} differ or missing)")
PY
fi
