#!/usr/bin/env python3
"""torch's scaled_dot_product_attention at the shapes `dtrain bench attention` times: causal,
bf16, forward and backward timed apart, once per SDPA backend torch can run at the shape
(flash, efficient, cudnn; math only when none of them runs), and once with torch's own
choice, whose backend the profiler names. Rates use FlashAttention's FLOP count, as dtrain's
bench does (forward 4 B NH T^2 HD / 2 causal, backward 2.5x). Grouped KV heads (NKV < NH)
go through enable_gqa=True.

  python3 scripts/attention_peer.py --shape 16,1024,12,12,64 --shape 4,2048,32,8,128 --json out.json

Exit 0; 77 when PyTorch or a CUDA device is missing (the JSON says which); 1 on an error.
"""
import argparse
import json
import os
import sys
import time


def parse_shape(text):
    parts = text.split(",")
    if len(parts) != 5 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise SystemExit(f"attention_peer: --shape {text!r}: give B,T,NH,NKV,HD (positive integers)")
    b, t, nh, nkv, hd = (int(p) for p in parts)
    if nh % nkv:
        raise SystemExit(f"attention_peer: --shape {text!r}: NH {nh} is not a multiple of NKV {nkv}")
    return dict(B=b, T=t, NH=nh, NKV=nkv, HD=hd)


def fwd_flops(s):
    return 4.0 * s["B"] * s["NH"] * s["T"] * s["T"] * s["HD"] / 2.0


def timed(torch, fn, warmup, iters):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return 1e3 * (time.perf_counter() - t0) / iters


def one_shape(torch, s, backend, warmup, iters):
    """Forward and backward ms of SDPA at shape s under `backend` (an SDPBackend, or None for
    torch's own choice); a dict with an error string when that backend cannot run it."""
    from torch.nn.attention import sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa
    dev, dt = torch.device("cuda"), torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(1234)
    q = torch.randn(s["B"], s["NH"], s["T"], s["HD"], device=dev, dtype=dt, generator=g, requires_grad=True)
    k = torch.randn(s["B"], s["NKV"], s["T"], s["HD"], device=dev, dtype=dt, generator=g, requires_grad=True)
    v = torch.randn(s["B"], s["NKV"], s["T"], s["HD"], device=dev, dtype=dt, generator=g, requires_grad=True)
    dout = torch.randn(s["B"], s["NH"], s["T"], s["HD"], device=dev, dtype=dt, generator=g)
    gqa = s["NKV"] != s["NH"]

    def fwd():
        return sdpa(q, k, v, is_causal=True, enable_gqa=gqa)

    ctx = sdpa_kernel(backend) if backend is not None else None
    try:
        if ctx is not None:
            ctx.__enter__()
        out = fwd()
        fwd_ms = timed(torch, fwd, warmup, iters)
        out = fwd()

        def bwd():
            torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)

        bwd_ms = timed(torch, bwd, warmup, iters)
        used = None
        if backend is None:  # torch's choice: the aten op the profiler saw
            from torch.profiler import ProfilerActivity, profile
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                fwd()
            ops = [e.key for e in prof.key_averages() if "scaled_dot_product" in e.key or "attention" in e.key]
            used = ", ".join(sorted(set(ops))) or "unknown"
        return dict(fwd_ms=fwd_ms, bwd_ms=bwd_ms, op=used)
    except RuntimeError as e:  # this backend does not support the shape / dtype / GQA
        return dict(error=str(e).splitlines()[0][:200])
    finally:
        if ctx is not None:
            ctx.__exit__(None, None, None)
        torch.cuda.empty_cache()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", action="append", required=True, help="B,T,NH,NKV,HD (repeatable)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--json", required=True)
    a = p.parse_args()
    shapes = [parse_shape(x) for x in a.shape]
    doc = dict(shapes=[], flops="FlashAttention's count: forward 4 B NH T^2 HD / 2 (causal), backward 2.5x")
    try:
        import torch
    except ImportError:
        doc["skipped"] = "PyTorch is not installed for " + sys.executable
        json.dump(doc, open(a.json, "w"), indent=1)
        return 77
    if not torch.cuda.is_available():
        doc["skipped"] = f"torch {torch.__version__} sees no CUDA device"
        json.dump(doc, open(a.json, "w"), indent=1)
        return 77
    from torch.nn.attention import SDPBackend
    doc.update(gpu=torch.cuda.get_device_name(0), torch=torch.__version__, cuda=torch.version.cuda)
    backends = [("flash", SDPBackend.FLASH_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION)]
    if hasattr(SDPBackend, "CUDNN_ATTENTION"):
        backends.append(("cudnn", SDPBackend.CUDNN_ATTENTION))
    for s in shapes:
        row = dict(shape=s, backends={})
        for name, be in backends + [("default", None)]:
            r = one_shape(torch, s, be, a.warmup, a.iters)
            if "fwd_ms" in r:
                f = fwd_flops(s)
                r.update(fwd_tflops=f / (r["fwd_ms"] * 1e-3) / 1e12, bwd_tflops=2.5 * f / (r["bwd_ms"] * 1e-3) / 1e12,
                         total_ms=r["fwd_ms"] + r["bwd_ms"])
            row["backends"][name] = r
            print(f"attention_peer {s} {name}: " + (r["error"] if "error" in r else
                  f"fwd {r['fwd_ms']:.3f} ms ({r['fwd_tflops']:.0f} TFLOP/s), bwd {r['bwd_ms']:.3f} ms "
                  f"({r['bwd_tflops']:.0f} TFLOP/s)"), flush=True)
        ran = {n: r for n, r in row["backends"].items() if "total_ms" in r and n != "default"}
        if ran:
            best = min(ran, key=lambda n: ran[n]["total_ms"])
            row["fastest"] = dict(backend=best, **{k: ran[best][k] for k in ("fwd_ms", "bwd_ms", "total_ms")})
        doc["shapes"].append(row)
        tmp = a.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
