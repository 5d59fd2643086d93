#!/usr/bin/env python3
"""The CPU race: dtrain's training step (build/bench_cpu_step) against the same model in
PyTorch, side by side. For each shape it alternates dtrain and PyTorch runs (each run a
fresh process, so peak RSS is per run) and prints ms/step, tokens/s, CPU time per step
(user + system over all threads: what a step costs when other load shares the machine)
and peak RSS, the median over the runs.

The PyTorch side builds the same GPT-2 / Llama as dtrain's model (same shapes, parameter
count, tied or untied embeddings, the init rule of Model::init_weights: N(0, 0.02), the
residual-output projections N(0, 0.02/sqrt(2L)), zero biases, unit norm weights), trains
on the same synthetic batch layout (random tokens, next-token targets) with AdamW, and is
threaded fairly: OMP_WAIT_POLICY=PASSIVE (no spinning OpenMP workers) and
torch.set_num_threads equal to dtrain's DTRAIN_NUM_THREADS. Both sides run fp32.

    scripts/setup.sh --compare            # installs python3-torch (Debian), opt-in
    python3 scripts/compare_cpu.py [--build build] [--threads 2] [--runs 3] [--steps 5]
                                   [--shapes all|gpt2-124m,d256-v50304,d256-v512,...]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name: (arch, d_model, n_layer, n_head, n_kv_head, vocab, batch, seq)
SHAPES = {
    "gpt2-124m": ("gpt2", 768, 12, 12, 12, 50304, 4, 64),
    "d256-v50304": ("gpt2", 256, 4, 4, 4, 50304, 8, 128),
    "d256-v512": ("gpt2", 256, 4, 4, 4, 512, 8, 128),
    "llama-d256-v50304": ("llama", 256, 4, 4, 2, 50304, 8, 128),
    "llama-d256-v512": ("llama", 256, 4, 4, 2, 512, 8, 128),
}
DEFAULT_SHAPES = ["gpt2-124m", "d256-v50304", "d256-v512", "llama-d256-v512"]


def llama_d_ff(d):  # lib/config/validate.cpp: 8d/3 rounded up to a multiple of 256
    return 256 * ((8 * d // 3 + 255) // 256)


# ---------------------------------------------------------------------------
# PyTorch side (runs in a child process: python3 compare_cpu.py --torch-run SHAPE ...)
def torch_run(shape, threads, steps, warmup):
    import math
    import resource
    import time

    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    torch.manual_seed(1)
    arch, d, L, nh, nkv, V, B, T = SHAPES[shape]
    hd = d // nh
    d_ff = 4 * d if arch == "gpt2" else llama_d_ff(d)
    std_resid = 0.02 / math.sqrt(2 * L)

    class RMSNorm(nn.Module):  # HF LlamaRMSNorm
        def __init__(self, n, eps=1e-5):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(n))
            self.eps = eps

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight

    def rope(x, cos, sin):  # HF rotate_half over [B, H, T, hd]
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            bias = arch == "gpt2"
            Norm = (lambda n: nn.LayerNorm(n, eps=1e-5)) if arch == "gpt2" else RMSNorm
            self.ln1, self.ln2 = Norm(d), Norm(d)
            self.q = nn.Linear(d, nh * hd, bias=bias)
            self.k = nn.Linear(d, nkv * hd, bias=bias)
            self.v = nn.Linear(d, nkv * hd, bias=bias)
            self.o = nn.Linear(nh * hd, d, bias=bias)
            self.fc = nn.Linear(d, d_ff, bias=bias)
            self.up = nn.Linear(d, d_ff, bias=False) if arch == "llama" else None
            self.down = nn.Linear(d_ff, d, bias=bias)

        def forward(self, x, mask, cos, sin):
            b, t, _ = x.shape
            h = self.ln1(x)
            q = self.q(h).view(b, t, nh, hd).transpose(1, 2)
            k = self.k(h).view(b, t, nkv, hd).transpose(1, 2)
            v = self.v(h).view(b, t, nkv, hd).transpose(1, 2)
            if arch == "llama":
                q, k = rope(q, cos, sin), rope(k, cos, sin)
                if nkv != nh:
                    k = k.repeat_interleave(nh // nkv, dim=1)
                    v = v.repeat_interleave(nh // nkv, dim=1)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
            att = att.masked_fill(mask[:, :, :t, :t] == 0, float("-inf"))
            y = F.softmax(att, dim=-1) @ v
            x = x + self.o(y.transpose(1, 2).contiguous().view(b, t, nh * hd))
            h = self.ln2(x)
            if arch == "gpt2":
                m = F.gelu(self.fc(h), approximate="tanh")
            else:
                m = F.silu(self.fc(h)) * self.up(h)
            return x + self.down(m)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(V, d)
            self.wpe = nn.Embedding(T, d) if arch == "gpt2" else None
            self.blocks = nn.ModuleList([Block() for _ in range(L)])
            self.lnf = nn.LayerNorm(d, eps=1e-5) if arch == "gpt2" else RMSNorm(d)
            self.lm = None if arch == "gpt2" else nn.Linear(d, V, bias=False)  # tied for GPT-2
            self.register_buffer("mask", torch.tril(torch.ones(T, T)).view(1, 1, T, T))
            inv = 1.0 / (10000.0 ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
            ang = torch.outer(torch.arange(T, dtype=torch.float64), inv)
            ang = torch.cat((ang, ang), dim=-1)
            self.register_buffer("cos", ang.cos().float())
            self.register_buffer("sin", ang.sin().float())
            for name, p in self.named_parameters():  # Model::init_weights
                if p.dim() >= 2:
                    resid = name.endswith("o.weight") or name.endswith("down.weight")
                    nn.init.normal_(p, 0.0, std_resid if resid else 0.02)
                elif name.endswith("bias"):
                    nn.init.zeros_(p)
                else:
                    nn.init.ones_(p)

        def forward(self, idx, targets):
            x = self.wte(idx)
            if self.wpe is not None:
                x = x + self.wpe(torch.arange(idx.shape[1]))
            for blk in self.blocks:
                x = blk(x, self.mask, self.cos, self.sin)
            x = self.lnf(x)
            logits = x @ self.wte.weight.t() if self.lm is None else self.lm(x)
            return F.cross_entropy(logits.view(-1, V), targets.view(-1))

    model = Model()
    params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-4)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, V, (B * T,), generator=g)
    targets = torch.roll(tokens, -1).view(B, T)
    tokens = tokens.view(B, T)
    total = 0.0
    cpu0 = 0.0
    for s in range(warmup + steps):
        if s == warmup:
            cpu0 = time.process_time()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        loss = model(tokens, targets)
        loss.backward()
        opt.step()
        if s >= warmup:
            total += time.perf_counter() - t0
    ms = 1e3 * total / steps
    cpu_ms = 1e3 * (time.process_time() - cpu0) / steps
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(f"RESULT ms={ms:.3f} cpu={cpu_ms:.3f} tokps={B * T / (ms / 1e3):.1f} rss={rss:.1f} params={params} "
          f"torch={torch.__version__} threads={torch.get_num_threads()}")


# ---------------------------------------------------------------------------
# dtrain side: bench_cpu_step with --set overrides on configs/tiny-cpu.yaml
def dtrain_cmd(build, shape, steps, warmup):
    arch, d, L, nh, nkv, V, B, T = SHAPES[shape]
    sets = {
        "model.architecture": arch, "model.vocab_size": V, "model.n_layer": L, "model.n_head": nh,
        "model.d_model": d, "model.max_seq_len": T, "data.seq_len": T,
        "train_micro_batch_size_per_gpu": B, "gradient_accumulation_steps": 1,
    }
    if arch == "llama":
        sets["model.n_kv_head"] = nkv
    cmd = [os.path.join(build, "bench_cpu_step"), os.path.join(ROOT, "configs", "tiny-cpu.yaml"),
           "--steps", str(steps), "--warmup", str(warmup)]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    return cmd


def parse_dtrain(out):
    ms = float(re.search(r"step time\s+([\d.]+) ms", out).group(1))
    tok = float(re.search(r"tokens/s\s+(\d+)", out).group(1))
    rss = float(re.search(r"peak RSS\s+(\d+) MiB", out).group(1))
    cpu = float(re.search(r"CPU time\s+([\d.]+) ms/step", out).group(1))
    gemm = re.search(r"GEMM\s+([\d.]+)%", out).group(1)
    params = re.search(r"\(\w+, (\d+) params", out).group(1)
    return {"ms": ms, "cpu": cpu, "tokps": tok, "rss": rss, "gemm": float(gemm), "params": int(params)}


def parse_torch(out):
    m = re.search(r"RESULT ms=([\d.]+) cpu=([\d.]+) tokps=([\d.]+) rss=([\d.]+) params=(\d+) torch=(\S+) "
                  r"threads=(\d+)", out)
    if not m:
        raise RuntimeError("PyTorch run printed no result:\n" + out)
    return {"ms": float(m.group(1)), "cpu": float(m.group(2)), "tokps": float(m.group(3)), "rss": float(m.group(4)),
            "params": int(m.group(5)), "version": m.group(6), "threads": int(m.group(7))}


def run(cmd, env, timeout):
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:2])} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"), help="build tree holding bench_cpu_step")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--runs", type=int, default=3, help="runs per side per shape, alternating")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--shapes", default=",".join(DEFAULT_SHAPES), help="comma list, or 'all': " + ", ".join(SHAPES))
    ap.add_argument("--timeout", type=float, default=900, help="seconds per run before it counts as failed")
    ap.add_argument("--torch-run", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.torch_run:
        torch_run(a.torch_run, a.threads, a.steps, a.warmup)
        return 0
    shapes = list(SHAPES) if a.shapes == "all" else a.shapes.split(",")
    for s in shapes:
        if s not in SHAPES:
            print(f"compare_cpu.py: unknown shape '{s}' (known: {', '.join(SHAPES)})", file=sys.stderr)
            return 2
    bench = os.path.join(a.build, "bench_cpu_step")
    if not os.access(bench, os.X_OK):
        print(f"compare_cpu.py: {bench} not found: build it (cmake --build {a.build} --target bench_cpu_step)",
              file=sys.stderr)
        return 2
    try:
        import torch  # noqa: F401
    except ImportError:
        # Debian's python3-torch lives in the system interpreter; a pyenv/venv python3
        # first on PATH does not see it.
        system = "/usr/bin/python3"
        if os.path.realpath(sys.executable) != os.path.realpath(system) and os.access(system, os.X_OK):
            os.execv(system, [system, os.path.abspath(__file__)] + sys.argv[1:])
        print("compare_cpu.py: PyTorch is not installed: run scripts/setup.sh --compare (Debian python3-torch)",
              file=sys.stderr)
        return 2
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", OMP_NUM_THREADS=str(a.threads),
               DTRAIN_NUM_THREADS=str(a.threads))
    print(f"threads {a.threads} per side, OMP_WAIT_POLICY=PASSIVE, fp32, {a.runs} alternating runs per side, "
          f"{a.steps} timed steps after {a.warmup} warm-up, medians; OPENBLAS_CORETYPE="
          f"{os.environ.get('OPENBLAS_CORETYPE', 'unset (detected)')}")
    rows = []
    for s in shapes:
        dt, pt = [], []
        for _ in range(a.runs):
            dt.append(parse_dtrain(run(dtrain_cmd(a.build, s, a.steps, a.warmup), env, a.timeout)))
            pt.append(parse_torch(run([sys.executable, os.path.abspath(__file__), "--torch-run", s, "--threads",
                                       str(a.threads), "--steps", str(a.steps), "--warmup", str(a.warmup)],
                                      env, a.timeout)))
        med = lambda xs, k: statistics.median(x[k] for x in xs)  # noqa: E731
        if dt[0]["params"] != pt[0]["params"]:
            print(f"compare_cpu.py: warning: {s}: dtrain has {dt[0]['params']} parameters, PyTorch "
                  f"{pt[0]['params']}", file=sys.stderr)
        rows.append((s, dt[0]["params"], med(dt, "ms"), med(pt, "ms"), med(dt, "tokps"), med(pt, "tokps"),
                     med(dt, "rss"), med(pt, "rss"), med(dt, "gemm"), med(dt, "cpu"), med(pt, "cpu"),
                     pt[0]["version"]))
    print()
    print("| shape | params | dtrain ms/step | PyTorch ms/step | dtrain tok/s | PyTorch tok/s | speed-up "
          "| dtrain CPU ms/step | PyTorch CPU ms/step | dtrain peak RSS MiB | PyTorch peak RSS MiB "
          "| dtrain GEMM share |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for s, n, dms, pms, dtok, ptok, drss, prss, gemm, dcpu, pcpu, _ in rows:
        print(f"| {s} | {n / 1e6:.1f}M | {dms:.1f} | {pms:.1f} | {dtok:.0f} | {ptok:.0f} | {dtok / ptok:.2f}x "
              f"| {dcpu:.0f} | {pcpu:.0f} | {drss:.0f} | {prss:.0f} | {gemm:.1f}% |")
    print(f"\nload average while measuring: {os.getloadavg()[0]:.1f} (1 min) on {os.cpu_count()} CPUs")
    print(f"\nPyTorch {rows[0][-1]}" if rows else "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
