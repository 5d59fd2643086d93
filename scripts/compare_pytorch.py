#!/usr/bin/env python3
"""Compare dtrain's one-GPU training throughput with PyTorch on the same models.

For each case the script runs `dtrain bench train --json` (a subprocess) and then the same
model in PyTorch (same shapes and init scheme, bf16 autocast over fp32 weights, fused
AdamW, F.scaled_dot_product_attention, torch.compile) on the same kind of synthetic
random tokens, and prints tokens/s, step time and peak memory side by side:

  gpt2       GPT-2 124M (configs/gpt2-124m.yaml), T=1024, micro-batch --gpt2-micro-batch
  llama      Llama-style ~1B (configs/llama-1b.yaml), full fine-tune
  llama-recompute  the same, every block recomputed in the backward (torch.utils.checkpoint,
             non-reentrant), as dtrain's activation_checkpointing: the like-for-like peer of
             configs/llama-1b.yaml, which recomputes; gpt2 and llama recompute nothing, on both sides
  llama-lora the same with LoRA r=16 on q,k,v,o,gate,up,down (base frozen)

Each case also records which SDPA kernel torch ran (flash, efficient, cudnn or math: the
profiler's view of one untimed step, scripts/race8b.py sdpa_backend).

Needs a CUDA GPU and PyTorch >= 2.1; without PyTorch it prints a message and exits 2.
Python 3 standard library + torch only.

  python3 scripts/compare_pytorch.py --dtrain build/dtrain --gpt2-micro-batch 16

--parity is the correctness check of the HF families instead (no GPU needed, PyTorch >= 1.13,
e.g. Debian's python3-torch): for each tiny random checkpoint (llama with llama3 / linear /
dynamic RoPE, explicit head_dim, tied embeddings, attention and MLP biases; qwen2; qwen3;
mistral with a sliding window shorter than the sequence; a LoRA adapter on qwen2) it runs
dtrain's apps/hf_logits on each --devices entry and compares the logits and the gradients of
the mean loss with scripts/hf_reference.py (written from transformers' modeling code), as
max |dtrain - ref| / max |ref| per tensor; exits 1 above --tol, 77 without PyTorch.

  python3 scripts/compare_pytorch.py --parity --hf-logits build/hf_logits [--devices cpu,cuda]
"""
import argparse
import json
import math
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

# The shapes of configs/gpt2-124m.yaml and configs/llama-1b.yaml (kept in step by hand:
# the script reads no YAML, standard library only).
CASES = {
    "gpt2": dict(config="configs/gpt2-124m.yaml", arch="gpt2", vocab=50304, n_layer=12, n_head=12, n_kv_head=12,
                 d_model=768, d_ff=3072, seq_len=1024, tied=True, lora_r=0, lr=6e-4, betas=(0.9, 0.95), wd=0.1,
                 recompute=False),
    "llama": dict(config="configs/llama-1b.yaml", arch="llama", vocab=32000, n_layer=16, n_head=32, n_kv_head=8,
                  d_model=2048, d_ff=5632, seq_len=2048, tied=False, lora_r=0, lr=4e-4, betas=(0.9, 0.95), wd=0.1,
                  recompute=False),
}
CASES["llama-recompute"] = dict(CASES["llama"], recompute=True)
CASES["llama-lora"] = dict(CASES["llama"], lora_r=16, lora_alpha=32.0)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dtrain", default=os.path.join(ROOT, "build", "dtrain"), help="the dtrain binary")
    p.add_argument("--cases", default="gpt2,llama,llama-lora", help="comma list of: " + ", ".join(CASES))
    p.add_argument("--gpt2-micro-batch", type=int, default=16, help="GPT-2 micro-batch (T=1024)")
    p.add_argument("--llama-micro-batch", type=int, default=4, help="Llama micro-batch")
    p.add_argument("--llama-seq-len", type=int, default=2048, help="Llama sequence length")
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first (torch.compile compiles here)")
    p.add_argument("--no-compile", action="store_true", help="PyTorch eager instead of torch.compile")
    p.add_argument("--skip-dtrain", action="store_true", help="PyTorch figures only")
    p.add_argument("--json", metavar="FILE", help="also write every case's figures (dtrain, torch, ratio) to FILE")
    p.add_argument("--parity", action="store_true", help="the HF-family correctness check (see above)")
    p.add_argument("--hf-logits", default=os.path.join(ROOT, "build", "hf_logits"), help="--parity: hf_logits binary")
    p.add_argument("--devices", default="cpu", help="--parity: comma list of hf_logits devices (cpu, cuda)")
    p.add_argument("--families", default="", help="--parity: comma list of case names (default: all)")
    p.add_argument("--tol", type=float, default=1e-4, help="--parity: max relative difference allowed")
    return p.parse_args()


# ----------------------------------------------------------------------------
# --parity: tiny random checkpoints of each HF family, dtrain (hf_logits) against hf_reference.py
def parity_cases():
    base = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=10000.0,
                hidden_act="silu", tie_word_embeddings=False, torch_dtype="float32")
    llama = dict(base, model_type="llama", architectures=["LlamaForCausalLM"], attention_bias=False, mlp_bias=False)
    # llama3 bands: with head_dim 32 and theta 5e5 the wavelengths span 6 .. 1.3e6, so an
    # original context of 32 (high/low wavelengths 8 and 32) puts pairs in all three.
    llama3 = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                  original_max_position_embeddings=32)
    return {
        "llama3-tied-headdim": (dict(llama, head_dim=32, rope_theta=500000.0, rope_scaling=llama3,
                                     tie_word_embeddings=True), None),
        "llama-linear-bias": (dict(llama, rope_scaling=dict(rope_type="linear", factor=2.0), attention_bias=True,
                                   mlp_bias=True), None),
        "llama-dynamic": (dict(llama, rope_scaling=dict(type="dynamic", factor=4.0)), None),
        "qwen2": (dict(base, model_type="qwen2", architectures=["Qwen2ForCausalLM"], tie_word_embeddings=True,
                       use_sliding_window=False, sliding_window=32, max_window_layers=2, rope_theta=1000000.0), None),
        "qwen3": (dict(base, model_type="qwen3", architectures=["Qwen3ForCausalLM"], head_dim=24, attention_bias=False,
                       use_sliding_window=False, sliding_window=None, max_window_layers=2, tie_word_embeddings=True),
                  None),
        "mistral-window": (dict(base, model_type="mistral", architectures=["MistralForCausalLM"], sliding_window=7),
                           None),
        "qwen2-lora": (dict(base, model_type="qwen2", architectures=["Qwen2ForCausalLM"], tie_word_embeddings=True),
                       dict(peft_type="LORA", task_type="CAUSAL_LM", r=4, lora_alpha=8, lora_dropout=0.0, bias="none",
                            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                            "down_proj"])),
    }


def parity_weights(torch, cfg, gen):
    """Random weights with every parameter mattering: biases and norm weights away from 0 and 1."""
    from hf_reference import head_dim_of
    C, NH, V, F = cfg["hidden_size"], cfg["num_attention_heads"], cfg["vocab_size"], cfg["intermediate_size"]
    NKV, HD = cfg["num_key_value_heads"], head_dim_of(cfg)
    mt = cfg["model_type"]
    qkv_bias = mt == "qwen2" or cfg.get("attention_bias", False)
    o_bias = mt != "qwen2" and cfg.get("attention_bias", False)
    mlp_bias = cfg.get("mlp_bias", False)
    W = {}

    def rnd(*shape, std=1.0):
        return torch.randn(*shape, generator=gen) * std

    def lin(name, out, inp, bias):
        W[name + ".weight"] = rnd(out, inp, std=inp ** -0.5)
        if bias:
            W[name + ".bias"] = rnd(out, std=0.2)

    W["model.embed_tokens.weight"] = rnd(V, C)
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        W[p + "input_layernorm.weight"] = 1 + rnd(C, std=0.2)
        lin(p + "self_attn.q_proj", NH * HD, C, qkv_bias)
        lin(p + "self_attn.k_proj", NKV * HD, C, qkv_bias)
        lin(p + "self_attn.v_proj", NKV * HD, C, qkv_bias)
        lin(p + "self_attn.o_proj", C, NH * HD, o_bias)
        if mt == "qwen3":
            W[p + "self_attn.q_norm.weight"] = 1 + rnd(HD, std=0.2)
            W[p + "self_attn.k_norm.weight"] = 1 + rnd(HD, std=0.2)
        W[p + "post_attention_layernorm.weight"] = 1 + rnd(C, std=0.2)
        lin(p + "mlp.gate_proj", F, C, mlp_bias)
        lin(p + "mlp.up_proj", F, C, mlp_bias)
        lin(p + "mlp.down_proj", C, F, mlp_bias)
    W["model.norm.weight"] = 1 + rnd(C, std=0.2)
    if not cfg.get("tie_word_embeddings", False):
        W["lm_head.weight"] = rnd(V, C, std=C ** -0.5)
    return W


def parity_adapter(torch, cfg, acfg, gen):
    """PEFT adapter tensors for every target module, B random (not PEFT's zeros) so both matter."""
    from hf_reference import head_dim_of
    C, F, HD = cfg["hidden_size"], cfg["intermediate_size"], head_dim_of(cfg)
    NH, NKV, r = cfg["num_attention_heads"], cfg["num_key_value_heads"], acfg["r"]
    dims = dict(q_proj=(C, NH * HD), k_proj=(C, NKV * HD), v_proj=(C, NKV * HD), o_proj=(NH * HD, C),
                gate_proj=(C, F), up_proj=(C, F), down_proj=(F, C))
    A = {}
    for l in range(cfg["num_hidden_layers"]):
        for m in acfg["target_modules"]:
            path = f"base_model.model.model.layers.{l}." + ("mlp." if m in ("gate_proj", "up_proj", "down_proj")
                                                            else "self_attn.") + m
            inp, out = dims[m]
            A[path + ".lora_A.weight"] = torch.randn(r, inp, generator=gen) * inp ** -0.5
            A[path + ".lora_B.weight"] = torch.randn(out, r, generator=gen) * 0.1
    return A


def parity_model_dir(torch, d, cfg, acfg, gen):
    """A Hugging Face model directory at d (config.json, model.safetensors, and with acfg a PEFT
    adapter beside them) of parity_weights / parity_adapter's random tensors: (W, A or None)."""
    from hf_reference import safetensors_write
    W = parity_weights(torch, cfg, gen)
    os.makedirs(d)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    safetensors_write(os.path.join(d, "model.safetensors"), W)
    A = None
    if acfg:
        A = parity_adapter(torch, cfg, acfg, gen)
        with open(os.path.join(d, "adapter_config.json"), "w") as f:
            json.dump(acfg, f, indent=2)
        safetensors_write(os.path.join(d, "adapter_model.safetensors"), A)
    return W, A


def torch_zeros_like(t):
    import torch
    return torch.zeros_like(t, dtype=torch.float64)


def rel_diff(got, ref):
    if ref is None:  # a tensor the reference's loss does not depend on
        ref = torch_zeros_like(got)
    return float((got.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def parity(args):
    try:
        import torch
    except ImportError:
        print("compare_pytorch.py --parity needs PyTorch (Debian: apt-get install python3-torch); skipped",
              file=sys.stderr)
        return 77
    import tempfile
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from hf_reference import forward, safetensors_read

    if not os.access(args.hf_logits, os.X_OK):
        print(f"compare_pytorch.py: no hf_logits binary at {args.hf_logits} (build the hf_logits target)",
              file=sys.stderr)
        return 2
    cases = parity_cases()
    names = [n for n in args.families.split(",") if n] or list(cases)
    devices = [d for d in args.devices.split(",") if d]
    B, T = 2, 24  # T > the mistral case's window
    worst, failed = 0.0, []
    with tempfile.TemporaryDirectory(prefix="dtrain_parity_") as tmp:
        for ci, name in enumerate(names):
            cfg, acfg = cases[name]
            gen = torch.Generator().manual_seed(1000 + ci)
            d = os.path.join(tmp, name)
            W, A = parity_model_dir(torch, d, cfg, acfg, gen)
            rows = torch.randint(0, cfg["vocab_size"], (B, T + 1), generator=gen, dtype=torch.int32)
            tok_path = os.path.join(d, "tokens.i32")
            with open(tok_path, "wb") as f:
                f.write(rows.numpy().tobytes())
            # the reference in float64: logits and d(mean next-token loss)/d(trainable tensors)
            Wd = {k: v.double().requires_grad_(A is None) for k, v in W.items()}
            Ad = {k: v.double().requires_grad_(True) for k, v in A.items()} if A else None
            logits = forward(cfg, Wd, rows[:, :T].long(), (acfg, Ad) if A else None)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, cfg["vocab_size"]), rows[:, 1:].reshape(-1).long())
            loss.backward()
            ref_grads = {k: v.grad for k, v in (Ad or Wd).items()}
            for dev in devices:
                out, gpath = os.path.join(d, f"logits.{dev}.f32"), os.path.join(d, f"grads.{dev}.safetensors")
                cmd = [args.hf_logits, "--model", d, "--tokens", tok_path, "--batch", str(B), "--seq", str(T),
                       "--device", dev, "--out", out, "--grads", gpath]
                p = subprocess.run(cmd, capture_output=True, text=True)
                if p.returncode != 0:
                    print(f"[{name}/{dev}] hf_logits failed (exit {p.returncode}): {p.stderr.strip()}", flush=True)
                    failed.append(f"{name}/{dev}")
                    continue
                with open(out, "rb") as f:
                    got = torch.frombuffer(bytearray(f.read()), dtype=torch.float32).reshape(logits.shape)
                e_logits = rel_diff(got, logits.detach())
                grads = safetensors_read(gpath)
                missing = sorted(set(ref_grads) ^ set(grads))
                if missing:
                    print(f"[{name}/{dev}] gradient names differ from the reference's: {missing}", flush=True)
                    failed.append(f"{name}/{dev}")
                    continue
                e_grads = {k: rel_diff(grads[k], ref_grads[k]) for k in ref_grads}
                gk = max(e_grads, key=e_grads.get)
                e_loss = abs(json.loads(p.stdout.strip().splitlines()[-1])["loss"] - loss.item()) / loss.item()
                e = max(e_logits, e_grads[gk], e_loss)
                worst = max(worst, e)
                ok = e <= args.tol
                if not ok:
                    failed.append(f"{name}/{dev}")
                print(f"[{name}/{dev}] {'ok' if ok else 'FAIL'}: logits {e_logits:.2e}, loss {e_loss:.2e}, "
                      f"{len(e_grads)} gradients max {e_grads[gk]:.2e} ({gk})", flush=True)
    print(json.dumps(dict(parity="hf-families", cases=names, devices=devices, tol=args.tol, max_rel_diff=worst,
                          failed=failed)))
    return 1 if failed else 0


# ----------------------------------------------------------------------------
# dtrain side
def run_dtrain(args, name, case, micro, seq_len):
    cmd = [args.dtrain, "bench", "train", "--config", os.path.join(ROOT, case["config"]),
           "--set", f"train_micro_batch_size_per_gpu={micro}", "--set", f"data.seq_len={seq_len}",
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--json",
           "--set", f"activation_checkpointing.enabled={'true' if case['recompute'] else 'false'}"]
    if case["lora_r"]:
        cmd += ["--set", f"lora.r={case['lora_r']}", "--set", f"lora.alpha={case['lora_alpha']}",
                "--set", "lora.target_modules=[" + ",".join(LORA_TARGETS) + "]"]
    print(f"[{name}] dtrain: {' '.join(cmd)}", flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if p.returncode != 0:
        print(f"[{name}] dtrain failed (exit {p.returncode}):\n{p.stderr.strip()}", flush=True)
        return None
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    return json.loads(lines[-1]) if lines else None


# ----------------------------------------------------------------------------
# PyTorch side (imported lazily so the script can explain a missing torch)
def build_torch_model(torch, case, seq_len):
    from torch.utils.checkpoint import checkpoint
    nn, F = torch.nn, torch.nn.functional
    C, L, NH, NKV, V, FF = case["d_model"], case["n_layer"], case["n_head"], case["n_kv_head"], case["vocab"], case["d_ff"]
    HD, gpt2 = C // NH, case["arch"] == "gpt2"

    class LoraLinear(nn.Module):
        """PEFT semantics: y = x W^T + scale * x A^T B^T, A kaiming-uniform, B zeros."""

        def __init__(self, base, r, alpha):
            super().__init__()
            self.base, self.scale = base, alpha / r
            base.weight.requires_grad_(False)
            self.A = nn.Parameter(torch.empty(r, base.in_features).uniform_(-1 / math.sqrt(base.in_features),
                                                                          1 / math.sqrt(base.in_features)))
            self.B = nn.Parameter(torch.zeros(base.out_features, r))

        def forward(self, x):
            return self.base(x) + self.scale * F.linear(F.linear(x, self.A), self.B)

    class RMSNorm(nn.Module):
        def __init__(self, c, eps=1e-5):
            super().__init__()
            self.weight, self.eps = nn.Parameter(torch.ones(c)), eps

        def forward(self, x):
            xf = x.float()
            return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight

    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, HD, 2).float() / HD))
    ang = torch.outer(torch.arange(seq_len).float(), inv_freq)
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)

    def rope(x):  # x [B, H, T, HD], HF rotate_half
        c, s = cos.to(x.device, x.dtype), sin.to(x.device, x.dtype)
        x1, x2 = x[..., : HD // 2], x[..., HD // 2:]
        return x * c + torch.cat([-x2, x1], -1) * s

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            if gpt2:
                self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
                self.c_attn, self.attn_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
                self.c_fc, self.mlp_proj = nn.Linear(C, FF), nn.Linear(FF, C)
            else:
                self.ln_1, self.ln_2 = RMSNorm(C), RMSNorm(C)
                self.q_proj, self.k_proj = nn.Linear(C, NH * HD, bias=False), nn.Linear(C, NKV * HD, bias=False)
                self.v_proj, self.o_proj = nn.Linear(C, NKV * HD, bias=False), nn.Linear(NH * HD, C, bias=False)
                self.gate_proj, self.up_proj = nn.Linear(C, FF, bias=False), nn.Linear(C, FF, bias=False)
                self.down_proj = nn.Linear(FF, C, bias=False)

        def forward(self, x):
            B, T, _ = x.shape
            h = self.ln_1(x)
            if gpt2:
                q, k, v = self.c_attn(h).split(C, dim=2)
                q, k, v = (t.view(B, T, NH, HD).transpose(1, 2) for t in (q, k, v))
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                x = x + self.attn_proj(y.transpose(1, 2).reshape(B, T, C))
                return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))
            q = rope(self.q_proj(h).view(B, T, NH, HD).transpose(1, 2))
            k = rope(self.k_proj(h).view(B, T, NKV, HD).transpose(1, 2))
            v = self.v_proj(h).view(B, T, NKV, HD).transpose(1, 2)
            k, v = k.repeat_interleave(NH // NKV, dim=1), v.repeat_interleave(NH // NKV, dim=1)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.o_proj(y.transpose(1, 2).reshape(B, T, NH * HD))
            h = self.ln_2(x)
            return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(V, C)
            self.wpe = nn.Embedding(seq_len, C) if gpt2 else None
            self.blocks = nn.ModuleList(Block() for _ in range(L))
            self.ln_f = nn.LayerNorm(C) if gpt2 else RMSNorm(C)
            self.lm_head = nn.Linear(C, V, bias=False)
            if case["tied"]:
                self.lm_head.weight = self.wte.weight
            # dtrain's init: matrices N(0, 0.02), residual projections N(0, 0.02/sqrt(2L)),
            # norms 1, biases 0.
            for name, p in self.named_parameters():
                if p.dim() == 2:
                    resid = name.endswith(("attn_proj.weight", "mlp_proj.weight", "o_proj.weight", "down_proj.weight"))
                    nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * L) if resid else 0.02)
                elif name.endswith("bias"):
                    nn.init.zeros_(p)

        def forward(self, idx, targets):
            x = self.wte(idx)
            if self.wpe is not None:
                x = x + self.wpe(torch.arange(idx.shape[1], device=idx.device))
            for b in self.blocks:
                # dtrain's recompute: each block's activations rebuilt in its backward
                x = checkpoint(b, x, use_reentrant=False) if case["recompute"] else b(x)
            logits = self.lm_head(self.ln_f(x))
            return F.cross_entropy(logits.float().reshape(-1, V), targets.reshape(-1), ignore_index=-100)

    model = Model()
    if case["lora_r"]:
        for p in model.parameters():
            p.requires_grad_(False)
        for b in model.blocks:
            for t in LORA_TARGETS:
                setattr(b, t, LoraLinear(getattr(b, t), case["lora_r"], case["lora_alpha"]))
    return model


def run_torch(torch, args, name, case, micro, seq_len):
    dev = torch.device("cuda")
    torch.manual_seed(1234)
    torch.backends.cuda.matmul.allow_tf32 = False  # dtrain's GEMMs: fp32 compute, no TF32
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    model = build_torch_model(torch, case, seq_len).to(dev)
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": case["wd"]}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=case["lr"], betas=case["betas"], eps=1e-8, fused=True)
    step_model = model if args.no_compile else torch.compile(model)
    n_params = sum(p.numel() for p in model.parameters())
    n_train = sum(p.numel() for p in params)
    batches = [torch.randint(0, case["vocab"], (micro, seq_len + 1), device=dev) for _ in range(4)]

    def step(i):
        data = batches[i % len(batches)]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_model(data[:, :-1], data[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    print(f"[{name}] torch: {n_params / 1e6:.1f}M params ({n_train / 1e6:.2f}M trainable), "
          f"{'eager' if args.no_compile else 'torch.compile'}, warming up", flush=True)
    for i in range(args.warmup):
        step(i)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(args.steps):
        loss = step(args.warmup + i)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    res = dict(step_ms=1e3 * dt / args.steps, tokens_per_s=micro * seq_len * args.steps / dt,
               peak_memory_bytes=torch.cuda.max_memory_allocated(), reserved_bytes=torch.cuda.max_memory_reserved(),
               final_loss=float(loss), params=n_params, recompute=case["recompute"],
               compile=not args.no_compile)
    # Which SDPA kernel ran: one more step, untimed, under the profiler.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from race8b import sdpa_backend
    res["sdpa"] = sdpa_backend(torch, lambda: step(args.warmup + args.steps))
    print(f"[{name}] torch: SDPA backend {res['sdpa']['backend']}", flush=True)
    del model, step_model, opt, batches, params, decay, no_decay
    torch.cuda.empty_cache()
    return res


# ----------------------------------------------------------------------------
def main():
    args = parse_args()
    if args.parity:
        return parity(args)
    try:
        import torch
    except ImportError:
        print("compare_pytorch.py needs PyTorch (pip install torch) on a machine with a CUDA GPU; "
              "torch is not installed here", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("compare_pytorch.py: PyTorch sees no CUDA device; run it on a GPU machine", file=sys.stderr)
        return 2
    if not args.skip_dtrain and not os.access(args.dtrain, os.X_OK):
        print(f"compare_pytorch.py: no dtrain binary at {args.dtrain} (build it, or pass --dtrain PATH)",
              file=sys.stderr)
        return 2
    names = [n.strip() for n in args.cases.split(",") if n.strip()]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        print(f"compare_pytorch.py: unknown case(s) {unknown}; choose from {list(CASES)}", file=sys.stderr)
        return 2

    gpu = torch.cuda.get_device_name(0)
    rows = []
    for name in names:
        case = CASES[name]
        micro = args.gpt2_micro_batch if case["arch"] == "gpt2" else args.llama_micro_batch
        seq_len = case["seq_len"] if case["arch"] == "gpt2" else args.llama_seq_len
        d = None if args.skip_dtrain else run_dtrain(args, name, case, micro, seq_len)
        t = run_torch(torch, args, name, case, micro, seq_len)
        rows.append((name, micro, seq_len, d, t))

    gib = lambda b: f"{b / 2**30:.2f}" if b is not None else "-"
    print(f"\n{gpu}, torch {torch.__version__}, {args.warmup} warm-up + {args.steps} timed steps, bf16")
    print(f"{'case':<11} {'B x T':>10} {'impl':<8} {'tokens/s':>12} {'step ms':>10} {'peak GiB':>9} {'MFU':>7}  note")
    for name, micro, seq_len, d, t in rows:
        if d is not None:
            mfu = f"{100 * d['mfu']:.1f}%" if d.get("mfu") is not None else "N/A"
            print(f"{name:<11} {f'{micro} x {seq_len}':>10} {'dtrain':<8} {d['tokens_per_s']:>12.0f} {d['step_ms']:>10.1f} "
                  f"{gib(d.get('peak_memory_bytes')):>9} {mfu:>7}  arena+workspace; device in use "
                  f"{gib(d.get('device_used_bytes'))} GiB")
        else:
            print(f"{name:<11} {f'{micro} x {seq_len}':>10} {'dtrain':<8} {'-':>12} {'-':>10} {'-':>9} {'-':>7}  "
                  "not run / failed (see above)")
        flops = d["flops_per_token"] if d is not None else None
        peak = d.get("peak_tflops") if d is not None else None
        mfu = f"{100 * flops * t['tokens_per_s'] / (peak * 1e12):.1f}%" if flops and peak else "N/A"
        print(f"{'':<11} {'':>10} {'torch':<8} {t['tokens_per_s']:>12.0f} {t['step_ms']:>10.1f} "
              f"{gib(t['peak_memory_bytes']):>9} {mfu:>7}  max_memory_allocated; reserved {gib(t['reserved_bytes'])} GiB")
        if d is not None:
            print(f"{'':<11} {'':>10} {'ratio':<8} {d['tokens_per_s'] / t['tokens_per_s']:>11.2f}x")
    if args.json:
        doc = dict(gpu=gpu, torch=torch.__version__, compile=not args.no_compile, warmup=args.warmup, steps=args.steps,
                   cases=[dict(case=name, micro_batch=micro, seq_len=seq_len, dtrain=d, torch=t,
                               ratio=(d["tokens_per_s"] / t["tokens_per_s"]) if d is not None else None)
                          for name, micro, seq_len, d, t in rows])
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
