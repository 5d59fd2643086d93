#!/usr/bin/env python3
"""Writes a random-initialised Hugging Face checkpoint of a real model's shape, as
transformers' save_pretrained lays it out: config.json, bf16 shards of at most
--max-shard-gb (model-0000k-of-0000n.safetensors) and model.safetensors.index.json. Each
tensor is generated and written straight to its shard, so the script never holds more
than one tensor (Debian's python3-torch; no numpy needed).

    scripts/make_random_hf.py OUT_DIR [--shape qwen2.5-1.5b|qwen2.5-0.5b] [--seed 1] [--max-shard-gb 2]

For scripts/bench_load_memory.sh (dtrain's per-rank peak memory at ZeRO-3): no download,
the shapes are the published config.json values.
"""
import argparse
import ctypes
import json
import os
import struct

import torch

SHAPES = {
    # Qwen/Qwen2.5-1.5B and Qwen/Qwen2.5-0.5B config.json (tied embeddings, q/k/v biases)
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768),
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768),
}


def tensors(c):
    """(name, shape, kind) in transformers' parameter order; kind: w (random), one, zero."""
    d, f, L = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    hd = d // c["num_attention_heads"]
    kv = c["num_key_value_heads"] * hd
    out = [("model.embed_tokens.weight", [c["vocab_size"], d], "w")]
    for i in range(L):
        p = f"model.layers.{i}."
        out += [(p + "self_attn.q_proj.weight", [d, d], "w"), (p + "self_attn.q_proj.bias", [d], "zero"),
                (p + "self_attn.k_proj.weight", [kv, d], "w"), (p + "self_attn.k_proj.bias", [kv], "zero"),
                (p + "self_attn.v_proj.weight", [kv, d], "w"), (p + "self_attn.v_proj.bias", [kv], "zero"),
                (p + "self_attn.o_proj.weight", [d, d], "w"),
                (p + "mlp.gate_proj.weight", [f, d], "w"), (p + "mlp.up_proj.weight", [f, d], "w"),
                (p + "mlp.down_proj.weight", [d, f], "w"),
                (p + "input_layernorm.weight", [d], "one"), (p + "post_attention_layernorm.weight", [d], "one")]
    out.append(("model.norm.weight", [d], "one"))
    return out


def numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def write_shard(path, group, gen):
    header, off = {}, 0
    for name, shape, _ in group:
        n = 2 * numel(shape)
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for _, shape, kind in group:
            if kind == "w":
                t = (torch.randn(shape, generator=gen) * 0.02).to(torch.bfloat16)
            else:
                t = torch.full(shape, 1.0 if kind == "one" else 0.0, dtype=torch.bfloat16)
            t = t.contiguous()
            f.write(ctypes.string_at(t.data_ptr(), t.numel() * t.element_size()))
            del t
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--shape", default="qwen2.5-1.5b", choices=sorted(SHAPES))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-shard-gb", type=float, default=2.0)
    a = ap.parse_args()
    c = SHAPES[a.shape]
    os.makedirs(a.out, exist_ok=True)
    ts = tensors(c)
    cap = int(a.max_shard_gb * 1e9)
    groups, cur, size = [], [], 0
    for t in ts:
        n = 2 * numel(t[1])
        if cur and size + n > cap:
            groups.append(cur)
            cur, size = [], 0
        cur.append(t)
        size += n
    groups.append(cur)
    gen = torch.Generator().manual_seed(a.seed)
    weight_map, total = {}, 0
    for k, g in enumerate(groups):
        fname = f"model-{k + 1:05d}-of-{len(groups):05d}.safetensors"
        write_shard(os.path.join(a.out, fname), g, gen)
        for name, shape, _ in g:
            weight_map[name] = fname
            total += 2 * numel(shape)
    with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    cfg = dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", hidden_act="silu", rms_norm_eps=1e-6,
               rope_theta=1000000.0, tie_word_embeddings=True, torch_dtype="bfloat16", use_sliding_window=False,
               attention_dropout=0.0, bos_token_id=151643, eos_token_id=151643, **c)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    params = sum(numel(s) for _, s, _ in ts)
    print(f"make_random_hf: {a.shape}: {params} parameters, {len(groups)} bf16 shards, {total / 1e9:.2f} GB -> {a.out}")


if __name__ == "__main__":
    main()
