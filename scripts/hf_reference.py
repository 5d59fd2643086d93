"""Reference decoder models for the HF families dtrain trains (llama, qwen2, qwen3, mistral),
written from Hugging Face transformers' modeling code (modeling_llama.py, modeling_qwen2.py,
modeling_qwen3.py, modeling_mistral.py and modeling_rope_utils.py), not from dtrain's: plain
PyTorch over a dict of weights named as in the checkpoints, computed in float64 so the
reference's own rounding is far below the fp32 tolerance it checks. Also a minimal
safetensors reader and writer (F32 only), so the check needs nothing beyond torch.

What each piece follows in transformers:
  RMSNorm      LlamaRMSNorm: x * rsqrt(mean(x^2) + eps) * weight (Qwen3's q_norm/k_norm are
               the same module over head_dim, applied to q_proj(x).view(..., head_dim) and
               k_proj(x) before the rotation)
  RoPE         rotate_half convention: q * cos + rotate_half(q) * sin, cos/sin of
               cat(freqs, freqs), freqs = position * inv_freq; inv_freq from
               ROPE_INIT_FUNCTIONS: default, linear (inv_freq / factor), dynamic
               (_compute_dynamic_ntk_parameters, the base rescaled only past
               max_position_embeddings), llama3 (_compute_llama3_parameters). The inverse
               frequencies are formed in float32 as transformers does, then widened.
  attention    q k^T * head_dim^-0.5, causal mask, and Mistral's sliding window (keys with
               kv_idx > q_idx - sliding_window), softmax, repeat_kv for grouped heads
  biases       Qwen2: q/k/v always; Llama, Qwen3: attention_bias on q/k/v/o; Llama mlp_bias
  MLP          down_proj(silu(gate_proj(x)) * up_proj(x))
  head         lm_head, or embed_tokens when tie_word_embeddings
  LoRA (PEFT)  y = base(x) + (lora_alpha / r) * lora_B(lora_A(x)), dropout off (eval)
"""
import json
import struct

import torch


# ----------------------------------------------------------------------------
# safetensors (F32 tensors only: what the parity check writes and dtrain's hf_logits returns)
def safetensors_write(path, tensors):
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        b = t.detach().to(torch.float32).contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def safetensors_read(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "F32":
            raise ValueError(f"{path}: {name} is {info['dtype']}; this reader takes F32 only")
        a, b = info["data_offsets"]
        buf = bytearray(data[8 + n + a:8 + n + b])
        out[name] = torch.frombuffer(buf, dtype=torch.float32).reshape(info["shape"]).clone()
    return out


# ----------------------------------------------------------------------------
# config.json fields, with each config class's defaults
def head_dim_of(cfg):
    if cfg.get("head_dim"):
        return cfg["head_dim"]
    if cfg["model_type"] == "qwen3":
        return 128  # Qwen3Config's default
    return cfg["hidden_size"] // cfg["num_attention_heads"]


def sliding_window_of(cfg):
    if cfg["model_type"] != "mistral":
        return None  # qwen2/qwen3 use it only with use_sliding_window, which the checks leave off
    return cfg.get("sliding_window", 4096)  # MistralConfig's default; null = none


def inv_freq_of(cfg, seq_len):
    """modeling_rope_utils.ROPE_INIT_FUNCTIONS[rope_type](config, device, seq_len)."""
    dim = head_dim_of(cfg)
    base = cfg.get("rope_theta", 10000.0)
    rs = cfg.get("rope_scaling") or {}
    rtype = rs.get("rope_type", rs.get("type", "default"))

    def default(b):
        return 1.0 / (b ** (torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim))

    if rtype == "default":
        return default(base)
    if rtype == "linear":
        return default(base) / rs["factor"]
    if rtype == "dynamic":
        max_pos, factor = cfg["max_position_embeddings"], rs["factor"]
        seq_len = seq_len if seq_len is not None and seq_len > max_pos else max_pos
        b = base * ((factor * seq_len / max_pos) - (factor - 1)) ** (dim / (dim - 2))
        return default(b)
    if rtype == "llama3":
        inv_freq = default(base)
        factor, low, high = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old_ctx = rs["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
        wavelen = 2 * torch.pi / inv_freq
        inv_freq_llama = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_ctx / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * inv_freq_llama / factor + smooth * inv_freq_llama
        is_medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
        return torch.where(is_medium, smoothed, inv_freq_llama)
    raise ValueError(f"rope_type {rtype} is not part of this reference")


# ----------------------------------------------------------------------------
def forward(cfg, W, tokens, lora=None):
    """Logits [B, T, V] (float64) of the causal LM on tokens [B, T] (int64).
    W: name -> float64 tensor (checkpoint names). lora: None or (adapter_config dict, name -> tensor)."""
    mt = cfg["model_type"]
    C, NH = cfg["hidden_size"], cfg["num_attention_heads"]
    NKV = cfg.get("num_key_value_heads") or NH
    HD, L, eps = head_dim_of(cfg), cfg["num_hidden_layers"], cfg["rms_norm_eps"]
    B, T = tokens.shape
    window = sliding_window_of(cfg)

    def rms(x, w):
        var = x.pow(2).mean(-1, keepdim=True)
        return w * (x * torch.rsqrt(var + eps))

    def linear(x, module):
        y = x @ W[module + ".weight"].T
        if module + ".bias" in W:
            y = y + W[module + ".bias"]
        if lora is not None:
            acfg, A = lora
            short = module.rsplit(".", 1)[-1]
            if short in acfg["target_modules"]:
                pre = "base_model.model." + module
                scale = acfg["lora_alpha"] / acfg["r"]
                y = y + scale * ((x @ A[pre + ".lora_A.weight"].T) @ A[pre + ".lora_B.weight"].T)
        return y

    inv_freq = inv_freq_of(cfg, T).to(torch.float64)
    pos = torch.arange(T, dtype=torch.float64)
    freqs = pos[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()

    def rotate_half(x):
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return torch.cat((-x2, x1), dim=-1)

    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    allowed = j <= i
    if window:
        allowed = allowed & (j > i - window)

    h = W["model.embed_tokens.weight"][tokens]
    for layer in range(L):
        p = f"model.layers.{layer}."
        x = rms(h, W[p + "input_layernorm.weight"])
        q = linear(x, p + "self_attn.q_proj").view(B, T, NH, HD)
        k = linear(x, p + "self_attn.k_proj").view(B, T, NKV, HD)
        v = linear(x, p + "self_attn.v_proj").view(B, T, NKV, HD)
        if mt == "qwen3":
            q = rms(q, W[p + "self_attn.q_norm.weight"])
            k = rms(k, W[p + "self_attn.k_norm.weight"])
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        # repeat_kv: [B, NKV, T, HD] -> [B, NH, T, HD], head h reads KV head h // (NH / NKV)
        k = k[:, :, None].expand(B, NKV, NH // NKV, T, HD).reshape(B, NH, T, HD)
        v = v[:, :, None].expand(B, NKV, NH // NKV, T, HD).reshape(B, NH, T, HD)
        scores = (q @ k.transpose(2, 3)) * HD ** -0.5
        scores = scores.masked_fill(~allowed, float("-inf"))
        att = torch.softmax(scores, dim=-1)
        o = (att @ v).transpose(1, 2).reshape(B, T, NH * HD)
        h = h + linear(o, p + "self_attn.o_proj")
        x = rms(h, W[p + "post_attention_layernorm.weight"])
        gate = linear(x, p + "mlp.gate_proj")
        h = h + linear(torch.nn.functional.silu(gate) * linear(x, p + "mlp.up_proj"), p + "mlp.down_proj")
    h = rms(h, W["model.norm.weight"])
    tied = cfg.get("tie_word_embeddings", False)
    return h @ (W["model.embed_tokens.weight"] if tied else W["lm_head.weight"]).T
