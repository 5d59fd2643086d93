#!/usr/bin/env python3
"""The race8b stage's PyTorch side (scripts/gpu_check.py, docs/gpu.md "Checking on a real GPU"):
transformers + PEFT LoRA SFT of a random-weight model of a published config.json's exact shape
(tests/data/hf_configs/), on one GPU, on dtrain's own bench batches, timed as `dtrain bench
train` times its step.

  - the model: AutoModelForCausalLM.from_config(config, dtype=bfloat16, attn_implementation="sdpa")
    built on the GPU (random init), or from_pretrained(--init-from DIR); --save-to DIR first
    writes the random weights as a Hugging Face checkpoint (dtrain then loads the same weights);
  - LoRA through peft (r, alpha, dropout 0, the seven projections; the adapters in fp32, peft's
    default), recompute (gradient_checkpointing_enable, non-reentrant) on or off as dtrain's;
  - the step: bf16 autocast forward, cross-entropy over every target in fp32, backward,
    clip_grad_norm_(1.0), torch.optim.AdamW(fused=True); the loss read back every step (so the
    host clock sees each step, as dtrain's bench reads its loss back);
  - the batches: dtrain's bench batches (lib/train/step_setup.cpp synthetic_batch: xoshiro256**
    seeded through splitmix64 from training.seed and the batch index, 4 batches cycled),
    regenerated here bit for bit, so the two sides train on the same tokens;
  - modes: eager, then compile (each decoder layer compiled: torch.compile's regional
    compilation, one compiled layer reused by all), on the same model and optimizer;
  - the SDPA backend torch picked: the aten op the profiler saw in one extra (untimed) step
    (_scaled_dot_product_flash_attention / _efficient_attention / _cudnn_attention / math).

Writes --json after each mode (a run cut off keeps the modes that finished). Exit 0; 77 when
torch, transformers or peft is missing or no GPU is visible (the JSON says which); 1 on an error.

  python3 scripts/race8b.py --config-dir tests/data/hf_configs/llama3.1-8b --micro-batch 2 \
      --seq-len 2048 --seed 1234 --json /tmp/peer.json
"""
import argparse
import json
import math
import os
import sys
import time

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
M64 = (1 << 64) - 1


# ----------------------------------------------------------------------------
# dtrain's bench batches (lib/core/rng.cpp, lib/train/step_setup.cpp), standard library only
def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


class Xoshiro:
    """dtrain::Rng: xoshiro256** with splitmix64 seeding (Rng::seed_reset)."""

    def __init__(self, seed):
        self.s, x = [], seed & M64
        for _ in range(4):
            x = (x + 0x9E3779B97F4A7C15) & M64
            z = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
            z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
            self.s.append(z ^ (z >> 31))

    def next_u64(self):
        s = self.s
        rotl = lambda v, k: ((v << k) | (v >> (64 - k))) & M64
        result = (rotl((s[1] * 5) & M64, 7) * 9) & M64
        t = (s[1] << 17) & M64
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = rotl(s[3], 45)
        return result


def bench_tokens(seed, index, vocab, micro, seq_len):
    """synthetic_batch(setup, index) with accumulation 1: (inputs, targets), each micro rows of seq_len."""
    n = micro * seq_len
    rng = Xoshiro(splitmix64(seed ^ splitmix64(index + 1)))
    stream = [rng.next_u64() % vocab for _ in range(n + 1)]
    rows = lambda off: [stream[off + r * seq_len: off + (r + 1) * seq_len] for r in range(micro)]
    return rows(0), rows(1)


# ----------------------------------------------------------------------------
def sdpa_backend(torch, step):
    """Which SDPA kernel torch ran in step(): the aten op the profiler recorded (and, failing
    that, the CUDA kernels' names), with the enabled-backend flags beside it."""
    flags = {}
    for name in ("flash_sdp_enabled", "mem_efficient_sdp_enabled", "cudnn_sdp_enabled", "math_sdp_enabled"):
        fn = getattr(torch.backends.cuda, name, None)
        if fn is not None:
            flags[name.replace("_sdp_enabled", "")] = bool(fn())
    seen = set()
    try:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize()
        names = [e.key for e in prof.key_averages()]
    except Exception as e:  # noqa: BLE001 - the profiler is a nicety; say why it gave nothing
        return dict(backend=f"unknown (profiler: {type(e).__name__}: {e})"[:200], flags=flags, ops=[])
    ops = sorted({n for n in names if "scaled_dot_product" in n})
    for n in ops:
        low = n.lower()
        for key, label in (("cudnn", "cudnn"), ("flash", "flash"), ("efficient", "efficient"), ("math", "math")):
            if key in low:
                seen.add(label)
    if not seen:  # no dispatch op recorded: the kernels' names
        for n in names:
            low = n.lower()
            if "cudnn" in low and ("sdpa" in low or "attention" in low or "fmha" in low):
                seen.add("cudnn")
            elif "flash" in low and ("fwd" in low or "bwd" in low):
                seen.add("flash")
            elif "fmha_cutlass" in low or "efficient_attention" in low or "mem_eff" in low:
                seen.add("efficient")
    backend = ", ".join(sorted(seen)) if seen else "math (no fused attention op or kernel seen)"
    return dict(backend=backend, flags=flags, ops=ops)


def arguments():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--config-dir", help="a directory with config.json: random init of that shape")
    src.add_argument("--init-from", help="a Hugging Face checkpoint directory to load")
    p.add_argument("--save-to", help="with --config-dir: write the random weights here first (safetensors)")
    p.add_argument("--config-json", help="with --save-to: the config.json to put beside the weights "
                                         "(default: the one save_pretrained writes)")
    p.add_argument("--micro-batch", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--seed", type=int, default=1234, help="dtrain's training.seed (the bench batches)")
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--lora-alpha", type=float, default=32.0)
    p.add_argument("--recompute", action="store_true", help="gradient checkpointing (dtrain: every layer)")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first (compile happens here)")
    p.add_argument("--steps", type=int, default=5, help="timed steps")
    p.add_argument("--modes", default="eager,compile", help="comma list: eager, compile")
    p.add_argument("--deadline", type=float, default=600, help="seconds: a mode that would start later "
                                                               "than this minus --mode-reserve is not run")
    p.add_argument("--mode-reserve", type=float, default=90, help="seconds a compile mode needs at least")
    p.add_argument("--json", required=True)
    return p.parse_args()


def write(path, doc):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, path)


def main():
    a = arguments()
    t_start = time.monotonic()
    doc = dict(case=os.path.basename((a.config_dir or a.init_from).rstrip("/")), micro_batch=a.micro_batch,
               seq_len=a.seq_len, lora=dict(r=a.lora_r, alpha=a.lora_alpha, dropout=0.0, targets=LORA_TARGETS),
               recompute=a.recompute, warmup=a.warmup, steps=a.steps, modes={})
    try:
        import torch
    except ImportError:
        doc["skipped"] = "PyTorch is not installed for " + sys.executable
        write(a.json, doc)
        return 77
    missing = []
    for mod in ("transformers", "peft"):
        try:
            __import__(mod)
        except ImportError:
            missing.append(mod)
    if missing or not torch.cuda.is_available():
        doc["skipped"] = (f"{', '.join(missing)} not installed for {sys.executable}" if missing
                          else f"torch {torch.__version__} sees no CUDA device")
        write(a.json, doc)
        return 77
    import peft
    import transformers
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    dev = torch.device("cuda")
    doc.update(gpu=torch.cuda.get_device_name(0), torch=torch.__version__, transformers=transformers.__version__,
               peft=peft.__version__, cuda=torch.version.cuda)
    torch.backends.cuda.matmul.allow_tf32 = False  # dtrain's fp32 GEMMs (the fp32 adapters) use no TF32
    torch.manual_seed(a.seed)
    t0 = time.monotonic()
    if a.config_dir:
        cfg = AutoConfig.from_pretrained(a.config_dir)
        cfg.use_cache = False
        with torch.device(dev):  # random init on the GPU, in bf16
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa")
    else:
        model = AutoModelForCausalLM.from_pretrained(a.init_from, dtype=torch.bfloat16, attn_implementation="sdpa",
                                                     device_map={"": 0})
        model.config.use_cache = False
    model = model.to(torch.bfloat16)  # whatever the config's dtype said
    doc["build_s"] = round(time.monotonic() - t0, 2)
    doc["attn_implementation"] = getattr(model.config, "_attn_implementation", None)
    vocab = model.config.vocab_size
    if a.save_to:
        t0 = time.monotonic()
        model.save_pretrained(a.save_to, max_shard_size="5GB")
        if a.config_json:  # the published file, which dtrain reads as it reads any checkpoint's
            with open(a.config_json) as f, open(os.path.join(a.save_to, "config.json"), "w") as g:
                g.write(f.read())
        doc["save_s"] = round(time.monotonic() - t0, 2)
        doc["saved_to"] = a.save_to
    base_params = sum(p.numel() for p in model.parameters())
    if a.recompute:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = get_peft_model(model, LoraConfig(r=a.lora_r, lora_alpha=a.lora_alpha, lora_dropout=0.0, bias="none",
                                             target_modules=LORA_TARGETS, task_type="CAUSAL_LM"))
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0, fused=True)
    c = model.config
    doc.update(params=base_params, trainable_params=sum(p.numel() for p in params), n_layer=c.num_hidden_layers,
               d_model=c.hidden_size, vocab=vocab, adapter_dtype=str(params[0].dtype),
               # the model FLOPs per token dtrain's bench counts under LoRA: 4N + 12 L T d_model
               flops_per_token=4.0 * base_params + 12.0 * c.num_hidden_layers * a.seq_len * c.hidden_size)
    batches = []
    for k in range(4):
        x, y = bench_tokens(a.seed, k, vocab, a.micro_batch, a.seq_len)
        batches.append((torch.tensor(x, device=dev), torch.tensor(y, device=dev)))

    def step(i):
        x, y = batches[i % len(batches)]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss)  # the read-back: the host waits for the step

    done = 0
    for mode in [m.strip() for m in a.modes.split(",") if m.strip()]:
        left = a.deadline - (time.monotonic() - t_start)
        if mode == "compile" and left < a.mode_reserve:
            doc["modes"][mode] = dict(error=f"not run: {left:.0f} s left of the deadline, under {a.mode_reserve:.0f}")
            write(a.json, doc)
            continue
        r = dict()
        try:
            if mode == "compile":
                layers = [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]
                for m in layers:
                    m.compile()
                r["compiled"] = f"{len(layers)} decoder layers ({type(layers[0]).__name__}), torch.compile regional"
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            times, losses = [], []
            for i in range(a.warmup + a.steps):
                t0 = time.perf_counter()
                losses.append(step(done + i))
                times.append(1e3 * (time.perf_counter() - t0))
            done += a.warmup + a.steps
            timed = times[a.warmup:]
            r.update(step_ms=sum(timed) / len(timed), first_step_ms=times[0], step_ms_each=times, losses=losses,
                     tokens_per_s=a.micro_batch * a.seq_len * 1e3 / (sum(timed) / len(timed)),
                     peak_memory_bytes=torch.cuda.max_memory_allocated(),
                     reserved_bytes=torch.cuda.max_memory_reserved())
            if mode == "eager":
                doc["sdpa"] = sdpa_backend(torch, lambda: step(done))
                done += 1
        except torch.cuda.OutOfMemoryError as e:
            r["error"] = "OOM: " + str(e).splitlines()[0][:200]
            torch.cuda.empty_cache()
        except Exception as e:  # noqa: BLE001 - one mode failing is a row, not the end of the peer
            r["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        doc["modes"][mode] = r
        write(a.json, doc)
        print(f"race8b peer {doc['case']} {mode}: " + (r["error"] if "error" in r else
              f"{r['tokens_per_s']:.0f} tok/s, step {r['step_ms']:.1f} ms, first {r['first_step_ms']:.0f} ms, "
              f"peak {r['peak_memory_bytes'] / 2**30:.2f} GiB, losses {[round(l, 4) for l in r['losses'][:3]]}"),
              flush=True)
        if r.get("error", "").startswith("OOM"):
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
