#!/usr/bin/env python3
"""The preference objectives' correctness check: dtrain (apps/hf_logits --pref, which runs the
trainer's own lib/train/preference and Model::backward_rows) against PyTorch, on tiny random
HF checkpoints (scripts/compare_pytorch.py's parity cases), for each objective as published:

  DPO    Rafailov et al. 2023, eq. 7, with conservative label smoothing (Mitchell 2023):
         -(1-e) log s(b h) - e log s(-b h), h = (log pi(c) - log ref(c)) - (log pi(r) - log ref(r))
  ORPO   Hong et al. 2024: -mean log p(c) - b log s(log odds(c) - log odds(r)),
         odds over the per-token mean log-probabilities, odds(p) = p / (1 - p)
  SimPO  Meng et al. 2024: -log s(b (mean log p(c) - mean log p(r)) - gamma)
  ftx    + f * (-mean log p(c)), as LLaMA-Factory's pref_ftx

The reference is written here from the formulas (float64 logits from scripts/hf_reference.py),
not from dtrain's code. DPO's reference model is the base under a LoRA adapter (hf_logits
--ref adapters_off), or given sums (a file). Compares the mean pair loss and every gradient
(max |dtrain - ref| / max |ref| per tensor); exits 1 above --tol, 77 without PyTorch.

  /usr/bin/python3 scripts/pref_parity.py --hf-logits build/hf_logits [--devices cpu,cuda]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hf-logits", default=os.path.join(os.path.dirname(HERE), "build", "hf_logits"))
    p.add_argument("--devices", default="cpu", help="comma list of hf_logits devices (cpu, cuda)")
    p.add_argument("--tol", type=float, default=1e-5, help="max relative difference allowed")
    args = p.parse_args()
    try:
        import torch
    except ImportError:
        print("pref_parity.py needs PyTorch (Debian: apt-get install python3-torch); skipped", file=sys.stderr)
        return 77
    sys.path.insert(0, HERE)
    from compare_pytorch import parity_cases, parity_model_dir, rel_diff
    from hf_reference import forward, safetensors_read
    F = torch.nn.functional

    if not os.access(args.hf_logits, os.X_OK):
        print(f"pref_parity.py: no hf_logits binary at {args.hf_logits} (build the hf_logits target)", file=sys.stderr)
        return 2
    fam = parity_cases()
    # (name, family case, objective, options, reference)
    cases = [
        ("dpo-lora-adapters-off", "qwen2-lora", "sigmoid", dict(beta=0.3, ls=0.1, ftx=0.5, gamma=0.0), "adapters_off"),
        ("dpo-full-given-ref", "llama-linear-bias", "sigmoid", dict(beta=0.1, ls=0.0, ftx=0.0, gamma=0.0), "file"),
        ("orpo", "llama3-tied-headdim", "orpo", dict(beta=0.25, ls=0.0, ftx=0.0, gamma=0.0), None),
        ("simpo-ftx", "qwen3", "simpo", dict(beta=2.0, ls=0.0, ftx=0.3, gamma=0.7), None),
    ]
    devices = [d for d in args.devices.split(",") if d]
    P, T, K = 2, 16, 5  # pairs, sequence length, prompt tokens (masked)
    B = 2 * P
    failed, worst = [], 0.0
    with tempfile.TemporaryDirectory(prefix="dtrain_pref_parity_") as tmp:
        for ci, (name, fname, loss_type, o, ref_kind) in enumerate(cases):
            cfg, acfg = fam[fname]
            gen = torch.Generator().manual_seed(2000 + ci)
            d = os.path.join(tmp, name)
            W, A = parity_model_dir(torch, d, cfg, acfg, gen)
            # P pairs: chosen rows then rejected rows, each pair sharing its K prompt tokens
            V = cfg["vocab_size"]
            prompt = torch.randint(0, V, (P, K), generator=gen)
            chosen = torch.cat([prompt, torch.randint(0, V, (P, T + 1 - K), generator=gen)], 1)
            rejected = torch.cat([prompt, torch.randint(0, V, (P, T + 1 - K), generator=gen)], 1)
            rows = torch.cat([chosen, rejected], 0).to(torch.int32)
            tok_path = os.path.join(d, "tokens.i32")
            with open(tok_path, "wb") as f:
                f.write(rows.numpy().tobytes())
            inputs, targets = rows[:, :T].long(), rows[:, 1:].long()
            mask = (torch.arange(T)[None, :] + 1 >= K).expand(B, T)  # target t (token t+1) trained past the prompt

            def row_sums(logits):
                lp = torch.log_softmax(logits, -1).gather(-1, targets[..., None])[..., 0]
                return (lp * mask).sum(-1), mask.sum(-1).double()

            # the reference's sums: the base model without the adapter, or a file of values
            ref = None
            if ref_kind == "adapters_off":
                with torch.no_grad():
                    ref, _ = row_sums(forward(cfg, {k: v.double() for k, v in W.items()}, inputs, None))
            elif ref_kind == "file":
                ref = -torch.rand(B, generator=gen, dtype=torch.float64) * 20 - 40
            Wd = {k: v.double().requires_grad_(A is None) for k, v in W.items()}
            Ad = {k: v.double().requires_grad_(True) for k, v in A.items()} if A else None
            logits = forward(cfg, Wd, inputs, (acfg, Ad) if A else None)
            s, n = row_sums(logits)
            sc, sr, nc, nr = s[:P], s[P:], n[:P], n[P:]
            b = o["beta"]
            if loss_type == "sigmoid":
                h = (sc - ref[:P]) - (sr - ref[P:])
                losses = -(1 - o["ls"]) * F.logsigmoid(b * h) - o["ls"] * F.logsigmoid(-b * h)
            elif loss_type == "orpo":
                mc, mr = sc / nc, sr / nr
                log_odds = (mc - mr) - (torch.log1p(-torch.exp(mc)) - torch.log1p(-torch.exp(mr)))
                losses = -mc - b * F.logsigmoid(log_odds)
            else:
                losses = -F.logsigmoid(b * (sc / nc - sr / nr) - o["gamma"])
            losses = losses + o["ftx"] * (-sc / nc)
            loss = losses.mean()
            loss.backward()
            ref_grads = {k: v.grad for k, v in (Ad or Wd).items()}
            for dev in devices:
                gpath = os.path.join(d, f"grads.{dev}.safetensors")
                cmd = [args.hf_logits, "--model", d, "--tokens", tok_path, "--batch", str(B), "--seq", str(T),
                       "--device", dev, "--out", os.path.join(d, "logits.f32"), "--grads", gpath,
                       "--pref", loss_type, "--prompt-len", str(K), "--beta", repr(b), "--ftx", repr(o["ftx"]),
                       "--label-smoothing", repr(o["ls"]), "--gamma", repr(o["gamma"])]
                if ref_kind == "adapters_off":
                    cmd += ["--ref", "adapters_off"]
                elif ref_kind == "file":
                    rpath = os.path.join(d, "ref.f64")
                    with open(rpath, "wb") as f:
                        f.write(ref.numpy().tobytes())
                    cmd += ["--ref", rpath]
                pr = subprocess.run(cmd, capture_output=True, text=True)
                if pr.returncode != 0:
                    print(f"[{name}/{dev}] hf_logits failed (exit {pr.returncode}): {pr.stderr.strip()}", flush=True)
                    failed.append(f"{name}/{dev}")
                    continue
                out = json.loads(pr.stdout.strip().splitlines()[-1])
                grads = safetensors_read(gpath)
                if sorted(grads) != sorted(ref_grads):
                    print(f"[{name}/{dev}] gradient names differ from the reference's", flush=True)
                    failed.append(f"{name}/{dev}")
                    continue
                e_grads = {k: rel_diff(grads[k], ref_grads[k]) for k in ref_grads}
                gk = max(e_grads, key=e_grads.get)
                e_loss = abs(out["loss"] - loss.item()) / max(abs(loss.item()), 1e-30)
                e = max(e_grads[gk], e_loss)
                worst = max(worst, e)
                ok = e <= args.tol
                if not ok:
                    failed.append(f"{name}/{dev}")
                print(f"[{name}/{dev}] {'ok' if ok else 'FAIL'}: loss {out['loss']:.6f} vs {loss.item():.6f} "
                      f"({e_loss:.2e}), {len(e_grads)} gradients max {e_grads[gk]:.2e} ({gk})", flush=True)
    print(json.dumps(dict(parity="preference", cases=[c[0] for c in cases], devices=devices, tol=args.tol,
                          max_rel_diff=worst, failed=failed)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
