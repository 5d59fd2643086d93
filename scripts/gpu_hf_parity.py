#!/usr/bin/env python3
"""The GPU check's hf stage: dtrain's Hugging Face import against transformers and peft.

For each architecture dtrain imports (GPT-2 with tied embeddings, Llama with GQA, Llama
with MHA, and the families: Llama 3 RoPE scaling with an explicit head_dim and tied
embeddings, Llama with linear RoPE and attention/MLP biases, Qwen2, Qwen3, Mistral with a
sliding window shorter than the sequence) transformers builds a tiny random model (every
parameter perturbed, so zero-initialised biases and unit norms matter) and saves it; dtrain's
importer loads it and runs it on the GPU (apps/hf_logits, fp32 and bf16) on random tokens;
the logits and the mean next-token loss are compared with transformers' on the same GPU.
Then dtrain fine-tunes the Llama one with LoRA for a few steps (`dtrain launch` with
model.init_from), exports it (`dtrain export`), and peft loads the adapter onto the
transformers model: the logits must agree, and differ from the base model's (so the
adapter is not ignored on either side).

--rehearse (no transformers here): the same plumbing against dtrain itself. The base model
is a dtrain export of two CPU training steps, the reference is apps/hf_logits on the CPU,
and the compared side runs on the CUDA device (the CPU execution engine in the EMU tree).
The families are not rehearsed here: the EMU tree's hf_family_parity_test runs them on the
CPU and on the CUDA device under the engine against scripts/hf_reference.py.

Writes --json FILE; exit 0 when every case matches, 1 when one does not, 3 (with
{"skipped": why}) when transformers or a GPU is missing outside a rehearsal.
"""
import argparse
import array
import json
import math
import os
import random
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
B, T, V = 2, 64, 512
# The rehearsal's model (the CPU execution engine runs a kernel thread by thread): the
# default job's data and tokenizer on a one-layer Llama, short sequences. gpu_check.py's
# rehearsal runs its job and bench stages on the same shape.
TINY_SETS = ["model.n_layer=1", "model.d_model=32", "model.n_head=2", "model.n_kv_head=1", "model.d_ff=64",
             "model.max_seq_len=64", "data.seq_len=64", "train_micro_batch_size_per_gpu=2"]
TINY_T = 16
# The default job's model shape (configs/tiny-sft.yaml), so `dtrain launch` can start from it.
LLAMA_GQA = dict(vocab_size=V, hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5, rope_theta=10000.0,
                 tie_word_embeddings=False, attention_bias=False, mlp_bias=False)
LLAMA_MHA = dict(LLAMA_GQA, num_hidden_layers=2, num_key_value_heads=4, intermediate_size=256)
GPT2 = dict(vocab_size=V, n_positions=128, n_embd=128, n_layer=2, n_head=4, activation_function="gelu_new",
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=True)
# The HF families (class names in transformers, config.json fields). T = 64 is past the
# mistral window and past the llama3 case's original context (its three frequency bands).
FAMILIES = [
    ("llama3 tied head_dim", "LlamaConfig", "LlamaForCausalLM",
     dict(LLAMA_GQA, num_hidden_layers=2, head_dim=64, tie_word_embeddings=True, rope_theta=500000.0,
          rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                            original_max_position_embeddings=32))),
    ("llama linear bias", "LlamaConfig", "LlamaForCausalLM",
     dict(LLAMA_GQA, num_hidden_layers=2, attention_bias=True, mlp_bias=True,
          rope_scaling=dict(rope_type="linear", factor=2.0))),
    ("qwen2 tied", "Qwen2Config", "Qwen2ForCausalLM",
     dict(LLAMA_GQA, num_hidden_layers=2, tie_word_embeddings=True, rope_theta=1000000.0, use_sliding_window=False)),
    ("qwen3 head_dim", "Qwen3Config", "Qwen3ForCausalLM",
     dict(LLAMA_GQA, num_hidden_layers=2, head_dim=48, tie_word_embeddings=True, use_sliding_window=False)),
    ("mistral window", "MistralConfig", "MistralForCausalLM", dict(LLAMA_GQA, num_hidden_layers=2, sliding_window=16)),
]
TOL = {"f32": 1e-3, "bf16": 5e-2}  # max |logit difference| / max |logit|
LOSS_TOL = {"f32": 1e-3, "bf16": 2e-2}  # relative difference of the mean loss
# LoRA fine-tune: a large learning rate from the first step (the default job's WarmupDecayLR
# with no warm-up to speak of), so that three steps move the adapter well past the
# comparison's tolerance.
LORA_SETS = ["lora.r=8", "lora.alpha=16", "training.max_steps=3", "training.save_steps=3", "training.eval_steps=3",
             "optimizer.params.lr=0.05", "scheduler.params.warmup_min_lr=0.05", "scheduler.params.warmup_max_lr=0.05",
             "scheduler.params.warmup_num_steps=1"]


def sh(cmd, timeout=120):
    p = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stdout[-3000:]}")
    return p.stdout


def write_tokens(path, seed, T=T):
    rnd = random.Random(seed)
    ids = [rnd.randrange(V) for _ in range(B * (T + 1))]
    array.array("i", ids).tofile(open(path, "wb"))
    return ids


def dtrain_logits(args, model_dir, tokens, device, dtype, work, tag, T=T):
    out = os.path.join(work, f"logits-{tag}-{device}-{dtype}.f32")
    line = sh([args.hf_logits, "--model", model_dir, "--tokens", tokens, "--batch", str(B), "--seq", str(T),
               "--device", device, "--dtype", dtype, "--out", out])
    meta = json.loads(line.strip().splitlines()[-1])
    vals = array.array("f")
    with open(out, "rb") as f:
        vals.frombytes(f.read())
    return list(vals), meta["loss"]


def rel_err(got, ref):
    m = max(abs(x) for x in ref) or 1.0
    e = 0.0
    for g, r in zip(got, ref):
        if not math.isfinite(g):
            return math.inf
        e = max(e, abs(g - r))
    return e / m if len(got) == len(ref) else math.inf


def mean_ce(logits, ids, T=T):
    tot = 0.0
    for b in range(B):
        for t in range(T):
            row = logits[(b * T + t) * V:(b * T + t + 1) * V]
            mx = max(row)
            lse = mx + math.log(sum(math.exp(x - mx) for x in row))
            tot += lse - row[ids[b * (T + 1) + t + 1]]
    return tot / (B * T)


def case_row(name, reference, dtype, got, loss_d, ref, loss_r, note=""):
    err = rel_err(got, ref)
    ok = err <= TOL[dtype] and abs(loss_d - loss_r) <= LOSS_TOL[dtype] * max(1.0, abs(loss_r))
    return dict(case=name, reference=reference, dtype=dtype, ok=bool(ok), logits_rel_err=err, loss_dtrain=loss_d,
                loss_ref=loss_r, note=note)


def lora_run(args, base_dir, work, device, model_sets=()):
    run_dir = os.path.join(work, "lora-run")
    exp = os.path.join(work, "lora-export")
    shutil.rmtree(run_dir, ignore_errors=True)
    shutil.rmtree(exp, ignore_errors=True)
    cmd = [args.dtrain, "launch", "--output-dir", run_dir, "--nproc-per-node", "1", "--master-port", "0",
           "--set", f"model.init_from={base_dir}",
           "--set", f"training.device={device}"]
    for s in list(model_sets) + LORA_SETS:
        cmd += ["--set", s]
    sh(cmd, 300)
    sh([args.dtrain, "export", run_dir, "-o", exp, "--dtype", "fp32"], 120)  # fp32: compared with fp32 references
    for f in ("adapter_config.json", "adapter_model.safetensors"):
        if not os.path.exists(os.path.join(exp, f)):
            raise RuntimeError(f"dtrain export wrote no {f} in {exp}")
    return exp


# ----------------------------------------------------------------------------
def rehearse(args, work):
    """Self-parity: dtrain's export, the CPU as the reference, the CUDA device compared."""
    cases = []
    base_run = os.path.join(work, "base-run")
    base = os.path.join(work, "base")
    shutil.rmtree(base_run, ignore_errors=True)
    shutil.rmtree(base, ignore_errors=True)
    cmd = [args.dtrain, "launch", "--output-dir", base_run, "--nproc-per-node", "1", "--master-port", "0",
           "--set", "training.device=cpu"]
    for s in TINY_SETS + ["training.max_steps=2", "training.save_steps=2", "training.eval_steps=2"]:
        cmd += ["--set", s]
    sh(cmd, 300)
    sh([args.dtrain, "export", base_run, "-o", base, "--dtype", "fp32"], 120)
    tokens = os.path.join(work, "tokens.i32")
    t = TINY_T
    ids = write_tokens(tokens, 7, t)
    ref, loss_r = dtrain_logits(args, base, tokens, "cpu", "f32", work, "base", t)
    # the loss hf_logits prints is the mean next-token cross-entropy of its logits
    if abs(mean_ce(ref, ids, t) - loss_r) > 1e-3 * max(1.0, abs(loss_r)):
        raise RuntimeError(f"hf_logits' loss {loss_r} is not the cross-entropy of its logits {mean_ce(ref, ids, t)}")
    for dt in ("f32", "bf16"):
        got, loss_d = dtrain_logits(args, base, tokens, "cuda", dt, work, "base", t)
        cases.append(case_row("llama (dtrain export)", "dtrain on the CPU", dt, got, loss_d, ref, loss_r))
    exp = lora_run(args, base, work, "cuda", TINY_SETS)
    ref_l, loss_rl = dtrain_logits(args, exp, tokens, "cpu", "f32", work, "lora", t)
    got_l, loss_dl = dtrain_logits(args, exp, tokens, "cuda", "f32", work, "lora", t)
    moved = rel_err(ref_l, ref)
    row = case_row("llama + LoRA (dtrain export)", "dtrain on the CPU", "f32", got_l, loss_dl, ref_l, loss_rl,
                   f"adapter moves the logits by {moved:.2e} of their range")
    if moved <= 10 * TOL["f32"]:
        row["ok"] = False
        row["note"] += ": too little to tell an ignored adapter from a loaded one"
    cases.append(row)
    return dict(reference="self: dtrain on the CPU (rehearsal, transformers absent)", cases=cases)


def against_transformers(args, work, torch, transformers):
    import torch.nn.functional as F
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda")
    tokens = os.path.join(work, "tokens.i32")
    ids = write_tokens(tokens, 7)
    inp = torch.tensor(ids, dtype=torch.long, device=dev).view(B, T + 1)

    def hf_logits(model):
        model.to(dev).eval()
        with torch.no_grad():
            lg = model(input_ids=inp[:, :T]).logits.float()
        loss = F.cross_entropy(lg.reshape(-1, V), inp[:, 1:].reshape(-1)).item()
        return lg.reshape(-1).cpu().tolist(), loss

    cases = []
    specs = [("gpt2 (tied)", transformers.GPT2Config, transformers.GPT2LMHeadModel, GPT2),
             ("llama GQA", transformers.LlamaConfig, transformers.LlamaForCausalLM, LLAMA_GQA),
             ("llama MHA", transformers.LlamaConfig, transformers.LlamaForCausalLM, LLAMA_MHA)]
    dirs = {}
    for name, cfg_cls, model_cls, kw in specs:
        torch.manual_seed(1234)
        model = model_cls(cfg_cls(**kw))
        d = os.path.join(work, name.split()[0] + "-" + name.split()[1].strip("()").lower())
        shutil.rmtree(d, ignore_errors=True)
        model.save_pretrained(d)  # safetensors, the default since transformers 4.35
        dirs[name] = (d, model_cls)
        ref, loss_r = hf_logits(model)
        for dt in ("f32", "bf16"):
            try:
                got, loss_d = dtrain_logits(args, d, tokens, "cuda", dt, work, name.split()[0])
                cases.append(case_row(name, "transformers", dt, got, loss_d, ref, loss_r))
            except RuntimeError as e:
                cases.append(dict(case=name, reference="transformers", dtype=dt, ok=False, logits_rel_err=math.inf,
                                  loss_dtrain=math.nan, loss_ref=loss_r, note=str(e)[-300:]))
    # The families: a class this transformers lacks (Qwen3 before 4.51) is reported, not failed.
    for name, cfg_name, model_name, kw in FAMILIES:
        cfg_cls, model_cls = getattr(transformers, cfg_name, None), getattr(transformers, model_name, None)
        if cfg_cls is None or model_cls is None:
            cases.append(dict(case=name, reference="transformers", dtype="-", ok=True, skipped=True,
                              logits_rel_err=math.nan, loss_dtrain=math.nan, loss_ref=math.nan,
                              note=f"transformers {transformers.__version__} has no {model_name}: not checked"))
            continue
        torch.manual_seed(4321)
        model = model_cls(cfg_cls(**kw, attn_implementation="eager"))
        with torch.no_grad():  # biases start at 0 and norms at 1: perturb every parameter so each matters
            for prm in model.parameters():
                prm.add_(0.02 * torch.randn_like(prm))
        d = os.path.join(work, "family-" + name.replace(" ", "-"))
        shutil.rmtree(d, ignore_errors=True)
        model.save_pretrained(d)
        ref, loss_r = hf_logits(model)
        for dt in ("f32", "bf16"):
            try:
                got, loss_d = dtrain_logits(args, d, tokens, "cuda", dt, work, "family")
                cases.append(case_row(name, "transformers", dt, got, loss_d, ref, loss_r))
            except RuntimeError as e:
                cases.append(dict(case=name, reference="transformers", dtype=dt, ok=False, logits_rel_err=math.inf,
                                  loss_dtrain=math.nan, loss_ref=loss_r, note=str(e)[-300:]))
    # LoRA: dtrain trains and exports the adapter, peft applies it to transformers' model
    try:
        import peft
        base_dir, model_cls = dirs["llama GQA"]
        exp = lora_run(args, base_dir, work, "cuda")
        base_model = model_cls.from_pretrained(base_dir)
        ref_base, _ = hf_logits(base_model)
        pm = peft.PeftModel.from_pretrained(model_cls.from_pretrained(base_dir), exp)
        ref, loss_r = hf_logits(pm)
        got, loss_d = dtrain_logits(args, exp, tokens, "cuda", "f32", work, "lora")
        moved = rel_err(ref, ref_base)
        row = case_row("llama GQA + LoRA", f"peft {peft.__version__}", "f32", got, loss_d, ref, loss_r,
                       f"adapter moves the logits by {moved:.2e} of their range")
        if moved <= 10 * TOL["f32"]:
            row["ok"] = False
            row["note"] += ": too little to tell an ignored adapter from a loaded one"
        cases.append(row)
    except Exception as e:  # noqa: BLE001 - reported as a failed case with its message
        cases.append(dict(case="llama GQA + LoRA", reference="peft", dtype="f32", ok=False, logits_rel_err=math.inf,
                          loss_dtrain=math.nan, loss_ref=math.nan, note=f"{type(e).__name__}: {str(e)[-300:]}"))
    return dict(reference=f"transformers {transformers.__version__}, torch {torch.__version__}", cases=cases)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtrain", required=True)
    ap.add_argument("--hf-logits", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--rehearse", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    if args.rehearse:
        try:
            doc = rehearse(args, args.work)
        except (RuntimeError, OSError, ValueError, subprocess.TimeoutExpired) as e:
            print(f"gpu_hf_parity: {e}", file=sys.stderr)
            return 1
    else:
        try:
            import torch
            import transformers
        except ImportError as e:
            doc = dict(skipped=f"transformers / torch not importable by {sys.executable}: {e}")
            json.dump(doc, open(args.json, "w"))
            return 3
        if not torch.cuda.is_available():
            json.dump(dict(skipped="torch sees no CUDA device"), open(args.json, "w"))
            return 3
        try:
            doc = against_transformers(args, args.work, torch, transformers)
        except Exception as e:  # noqa: BLE001 - a model transformers could not build or save
            print(f"gpu_hf_parity: {type(e).__name__}: {e}", file=sys.stderr)
            return 1
    with open(args.json, "w") as f:
        json.dump(doc, f, indent=1, default=str)
    for c in doc["cases"]:
        status = "SKIPPED" if c.get("skipped") else "ok" if c["ok"] else "MISMATCH"
        print(f"{c['case']:<30} {c['dtype']:<5} {status}  logits {c['logits_rel_err']:.2e}  "
              f"loss {c['loss_dtrain']:.5f} / {c['loss_ref']:.5f}  {c.get('note', '')}")
    return 0 if all(c["ok"] for c in doc["cases"]) else 1


if __name__ == "__main__":
    sys.exit(main())
