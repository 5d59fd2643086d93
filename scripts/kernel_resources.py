#!/usr/bin/env python3
"""Resource gate over the CUDA kernels, no GPU needed (ctest kernels_resources_test).

Reads the ptxas report (-Xptxas -v) that scripts/nvcc_resource_log.sh keeps beside each
kernels/*.cu object, prints one row per kernel and architecture (registers, stack, spill
stores/loads, static shared memory) and fails, naming the kernel and architecture, when
  - a kernel spills (spill stores or loads > 0) beyond its KNOWN_SPILLS entry (none for
    a kernel not listed there),
  - a kernel uses more registers per thread than its entry in REG_TARGETS,
  - a kernel's static shared memory exceeds what every card accepts (48 KiB static per
    block on every architecture; dynamic shared memory is checked at launch, by the
    engine's device profiles and by the runtime),
  - an architecture the tree was configured for (--archs) has no report (sm_90a, which
    kernels/CMakeLists.txt builds the wgmma files for in place of sm_90, counts as sm_90).

  kernel_resources.py --objects BUILD/kernels/CMakeFiles/dtrain_kernels.dir --archs "80;90"

The registers of the tensor-core attention kernels (the hopper forward's too) also feed the
`--plan` budget's blocks per SM (lib/plan/plan_occupancy.cpp): --plan-table FILE writes them into
lib/plan/plan_kernel_resources.inc (replacing the rows of this build's architectures, keeping the
other architectures' rows), and --check-plan-table FILE fails when the committed table no longer
matches this build's reports (for the architectures the build has).
"""
import argparse
import pathlib
import re
import subprocess
import sys

# Registers per thread each kernel must stay within (first matching pattern wins, matched
# against the demangled name). A target is the count above which the kernel loses the
# blocks per SM it is designed for: 64 K registers per SM on every architecture built here
# (CUDA C Programming Guide, "Technical Specifications per Compute Capability"), allocated
# per thread in steps of 8, at most 255 per thread.
#   - tensor-core attention (128 threads a block): forward at head dims 32 and 64 keeps 4
#     blocks per SM (65536 / (4 * 128) = 128; sm_100/sm_120 take 142: 3); at 128 the two
#     stages' 87 KB of shared memory allow 2 blocks, so registers up to 255 cost nothing
#     (173-187 today). Backward: dK/dV at 32 keeps 4 (128) and at 64 keeps 3 (168; both held there
#     by __launch_bounds__ since the GQA group moved into the block), dQ at 32 and 64 keeps 3
#     (168); everything at 128 and 256 sits at 2 blocks, and there the spill gate below is the
#     one that binds.
#   - the scalar fp32 attention and the row kernels (norm, the column reductions): 128, at
#     least 2 blocks of 256 threads per SM.
#   - everything else: 64, the most a 1024-thread block can have at all (65536 / 1024;
#     loss_mean_kernel launches 1024 threads, the grid-stride kernels up to 1024), and half
#     occupancy for these memory-bound kernels.
REG_TARGETS = [
    # (pattern over "kernel @arch", target)
    # The fa2 variant's 128-row forward and dQ tiles (WM = 2, kernels/attention_mma_tiles.cuh): two
    # slices' accumulators take what ptxas has, 2 blocks per SM by registers at head dim 64
    # (shared memory: 3-4), as FlashAttention-2's own 128-row kernels; what binds is the spill gate.
    (r"attn_(fwd_mma|bwd_dq)_kernel<[^,<>]+, \d+, \d+, 2>", 255),
    (r"attn_fwd_mma_kernel<[^,<>]+, (32|64)\b.* @sm_1[02]0", 144),
    (r"attn_fwd_mma_kernel<[^,<>]+, (32|64)\b", 128),
    (r"attn_bwd_dkdv_kernel<[^,<>]+, 32\b", 128),
    (r"attn_bwd_dkdv_kernel<[^,<>]+, 64\b", 168),
    (r"attn_bwd_dq_kernel<[^,<>]+, (32|64)\b", 168),
    (r"attn_(fwd_mma|bwd_dkdv|bwd_dq)_kernel<", 255),
    # The hopper forward (kernels/attention_hopper.cu): 288 threads, one block per SM by design
    # (its ~100 KB of shared memory at head dim 128), so 65536 / 288 = 227, allocated by 8: 224.
    (r"attn_fwd_hopper_kernel<", 224),
    # The sm_90 tile-GEMM check (kernels/hopper_check.cu, one 128-thread block, a test): N / 2
    # accumulators a thread (128 at N = 256) since it is built for sm_90a.
    (r"hopper_tile_gemm_kernel<", 255),
    (r"attn_\w+_kernel<float, 4\b.* @sm_1[02]0", 144),
    (r"attn_", 128),
    (r"norm_|column_", 128),
    (r"", 64),
]

# Spills known when this gate was written (issue 29), as a ratchet: each entry allows at
# most the spill bytes measured then, on every architecture, so any new spill or a larger
# one fails. Everything not listed must not spill at all: the hot kernels (the tensor-core
# attention forward at head dims 32, 64 and 128 (the fa2 variant's 128-row tiles too) and
# backward at 32, 64 and 128 (dK/dV at 128 since it writes through shared memory), norm,
# cross-entropy, AdamW, the pointwise, cast, embedding, reduction and RoPE kernels). Delete an entry once
# its kernel stops spilling; the report prints "STALE" for an entry that no longer needs it.
#   (pattern, max spill store bytes, max spill load bytes, why)
KNOWN_SPILLS = [
    # dK/dV at head dim 128: since it writes dK and dV through shared memory only sm_90's one-stage
    # variant spills (8/8 bytes; never launched on a 227 KB card), none on sm_80/86/89 nor sm_90's
    # two stages (were 8/16 bytes: per-element stores' addresses beside 128 accumulators);
    # sm_100/sm_120 not measured since.
    (r"attn_bwd_dkdv_kernel<[^,<>]+, 128\b", 16, 32,
     "dK/dV, head dim 128: dK, dV accumulators of 16 keys x 128 per warp at 255 registers (sm_90 one stage)"),
    # dK/dV at head dim 256 (next entry), one stage: sm_120's ptxas spills 12 bytes more than
    # the next entry allows since the packed-documents mask (its spill moves by a few dozen bytes
    # with any change to the loop); its 135.7 KB of shared memory never fits sm_120's 99 KB
    # opt-in, so it never runs there. sm_80/86/89/90/100 measure at most 1680/1924.
    (r"attn_bwd_dkdv_kernel<[^,<>]+, 256, 1>", 1852, 2096,
     "dK/dV, head dim 256, one stage: as below; sm_120 measures 1852/2096 (never launched there)"),
    (r"attn_bwd_dkdv_kernel<[^,<>]+, 256\b", 1840, 2096,
     "dK/dV, head dim 256: dK, dV of 16 keys x 256 per warp do not fit in registers (smaller tiles needed)"),
    (r"attn_bwd_dq_kernel<[^,<>]+, 256\b", 108, 112, "dQ, head dim 256 (sm_100/sm_120 spill most)"),
    # The scalar fp32 attention (kernels/attention.cu; runs only for fp32 activations, a
    # reference path, not the bf16/fp16 training path); DPL = head dim / 32. With its warps
    # staging their probabilities in shared memory (no longer held for shuffles), dQ at head
    # dim 128 and the forward at 64 spill nothing on sm_80/sm_90 (their entries are gone);
    # sm_100/sm_120 not measured since.
    (r"attn_fwd_kernel<float, 4>", 48, 96, "scalar fp32 attention forward, head dim 128 (sm_100/sm_120 only)"),
    # Its 16-row backward on bf16/fp16 rows: runs only where the tensor-core backward does not
    # fit (head dims 129-256 on 99 KB cards); ptxas stops at 64 registers on sm_120.
    (r"attn_dq_kernel<(__half|__nv_bfloat16), 8, true>", 8, 8,
     "scalar attention dQ on bf16/fp16 rows, head dim 256, 16-row tiles (sm_120 only)"),
]

# The kernels whose occupancy the --plan budget models (bf16 instantiations; fp16's are the
# same code): name, padded head dim, stages.
# The forward and dQ kernels' last template argument is their 16-row slices per warp: the plan
# models the default (legacy) variant's 64-row tiles, WM = 1.
PLAN_KERNEL = re.compile(
    r"^(attn_fwd_mma_kernel|attn_bwd_dkdv_kernel|attn_bwd_dq_kernel)<__nv_bfloat16, (\d+), (\d+)(?:, 1)?>$")
# And the hopper variant's forward (kernels/attention_hopper.cu; head dim, its two-stage K/V
# ring), from its sm_90a image only: on the other architectures its object holds only a __trap() body,
# never launched. Its row's sm is 90.
PLAN_HOPPER = re.compile(r"^(attn_fwd_hopper_kernel)<__nv_bfloat16, (\d+)>$")
PLAN_HOPPER_STAGES = 2
PLAN_TABLE_HEAD = (
    "// Generated by scripts/kernel_resources.py --plan-table from ptxas -v (the build's\n"
    "// kernels/*.cu.o.ptxas): registers per thread of the tensor-core attention kernels, per padded\n"
    "// head dim, stages and architecture. kernels_plan_resources_test fails when it is stale.\n"
    "// {kernel, head dim padded, stages, sm, registers}\n")

STATIC_SMEM_LIMIT = 48 * 1024  # bytes of static __shared__ per block, every architecture

ENTRY = re.compile(r"ptxas info\s*: Compiling entry function '([^']+)' for '(sm_\d+[a-z]?)'")
PROPS = re.compile(r"ptxas info\s*: Function properties for (\S+)")
FRAME = re.compile(r"^\s*(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
USED = re.compile(r"ptxas info\s*: Used (\d+) registers")
SMEM = re.compile(r"(\d+) bytes smem")


def parse(path):
    """[(mangled, arch, regs, stack, spill_st, spill_ld, smem)] from one ptxas report."""
    rows = []
    entry = arch = props_for = None
    frame = (0, 0, 0)
    for line in path.read_text().splitlines():
        m = ENTRY.search(line)
        if m:
            entry, arch = m.group(1), m.group(2)
            frame = (0, 0, 0)
            continue
        m = PROPS.search(line)
        if m:
            props_for = m.group(1)
            continue
        m = FRAME.search(line)
        if m:
            if props_for == entry:
                frame = tuple(int(g) for g in m.groups())
            continue
        m = USED.search(line)
        if m and entry:
            s = SMEM.search(line)
            rows.append((entry, arch, int(m.group(1)), *frame, int(s.group(1)) if s else 0))
            entry = None
    return rows


def demangle(names):
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True)
    return dict(zip(names, out.stdout.splitlines()))


def short(name):
    """The demangled name without namespaces and parameter list, for the table."""
    name = re.sub(r"^void ", "", name).replace("(anonymous namespace)::", "")
    depth, cut = 0, len(name)
    for i, c in enumerate(name):  # drop the trailing (parameters)
        if c == "<":
            depth += 1
        elif c == ">":
            depth -= 1
        elif c == "(" and depth == 0:
            cut = i
            break
    name = name[:cut]
    name = re.sub(r"\b(dtrain::kernels::detail::|dtrain::kernels::)", "", name)
    return name


def first(table, name):
    for pat, value in table:
        if re.search(pat, name):
            return value
    return None


def plan_rows(rows, names):
    """{(kernel, hdp, stages, sm): registers} of the kernels the --plan budget models."""
    out = {}
    for _file, mangled, arch, regs, *_ in rows:
        m = PLAN_KERNEL.match(short(names[mangled]))
        if m:
            out[(m.group(1), int(m.group(2)), int(m.group(3)), int(arch.removeprefix("sm_").rstrip("a")))] = regs
        m = PLAN_HOPPER.match(short(names[mangled]))
        if m and arch == "sm_90a":
            out[(m.group(1), int(m.group(2)), PLAN_HOPPER_STAGES, 90)] = regs
    return out


def read_plan_table(path):
    """{(kernel, hdp, stages, sm): registers} of a committed --plan table."""
    out = {}
    for line in path.read_text().splitlines():
        m = re.match(r'\s*\{"(\w+)", (\d+), (\d+), (\d+), (\d+)\},', line)
        if m:
            out[(m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4)))] = int(m.group(5))
    return out


def plan_table(rows, names, write, check):
    table = plan_rows(rows, names)
    if not table:
        print("kernel_resources: no tensor-core attention kernels in the reports", file=sys.stderr)
        return 2
    built_sms = {key[3] for key in table}
    if write:
        # One build has only its own architectures: the rows of the others (from builds for
        # them) are kept, this build's replace its architectures' rows.
        path = pathlib.Path(write)
        kept = {k: r for k, r in (read_plan_table(path) if path.exists() else {}).items() if k[3] not in built_sms}
        merged = {**kept, **table}
        lines = [f'    {{"{k}", {h}, {st}, {sm}, {r}}},' for (k, h, st, sm), r in sorted(merged.items())]
        path.write_text(PLAN_TABLE_HEAD + "\n".join(lines) + "\n")
        print(f"kernel_resources: {len(lines)} rows written to {write} ({len(table)} from this build's "
              f"sm {sorted(built_sms)}, {len(kept)} kept for the other architectures)")
        return 0
    committed = read_plan_table(pathlib.Path(check))
    failures = []
    for key, regs in sorted(table.items()):
        if committed.get(key) != regs:
            failures.append(f"{key[0]}<bf16, {key[1]}, {key[2]}> @sm_{key[3]}: {regs} registers in this build, "
                            f"{committed.get(key, 'none')} in {check}")
    for key in sorted(set(committed) - set(table)):
        if key[3] in built_sms:
            failures.append(f"{key[0]}<bf16, {key[1]}, {key[2]}> @sm_{key[3]}: in {check}, not in this build")
    for f in failures:
        print(f"FAIL {f}")
    if failures:
        print(f"the --plan budget's register table is stale: regenerate it with scripts/kernel_resources.py "
              f"--objects ... --plan-table {check}")
        return 1
    print(f"kernel_resources: {check} matches this build ({len(table)} rows, sm {sorted(built_sms)})")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--objects", required=True, nargs="+",
                    help="dtrain_kernels' object directories (its own, and its sm_90a object library's)")
    ap.add_argument("--archs", default="", help="CMAKE_CUDA_ARCHITECTURES the tree was configured with")
    ap.add_argument("--plan-table", help="write the attention kernels' registers for the --plan budget here")
    ap.add_argument("--check-plan-table", help="fail when this committed --plan table differs from the reports")
    a = ap.parse_args()

    objdir = " ".join(a.objects)
    objects = sorted((o for d in a.objects for o in pathlib.Path(d).glob("*.cu.o")), key=lambda o: o.name)
    if not objects:
        print(f"kernel_resources: no kernels/*.cu objects in {objdir}: build dtrain_kernels first", file=sys.stderr)
        return 2
    missing = [o.name for o in objects if not pathlib.Path(str(o) + ".ptxas").exists()]
    if missing:
        print(f"kernel_resources: no ptxas report beside {', '.join(missing)} in {objdir}: the objects predate "
              "scripts/nvcc_resource_log.sh; rebuild dtrain_kernels (cmake --build BUILD --target dtrain_kernels)",
              file=sys.stderr)
        return 2

    rows = []
    for o in objects:
        for r in parse(pathlib.Path(str(o) + ".ptxas")):
            rows.append((o.name.removesuffix(".cu.o"), *r))
    names = demangle(sorted({r[1] for r in rows}))
    if a.plan_table or a.check_plan_table:
        return plan_table(rows, names, a.plan_table, a.check_plan_table)

    failures = []
    used_known, spilling_known = set(), set()
    wanted = set()
    for arch in re.split(r"[;, ]+", a.archs.strip()):
        m = re.match(r"(\d+)", arch)
        if m and not arch.endswith("-virtual"):
            wanted.add("sm_" + m.group(1))
    seen_archs = {r[2].rstrip("a") for r in rows}
    for arch in sorted(wanted - seen_archs):
        failures.append(f"no kernel compiled for {arch} (configured: {a.archs})")

    print(f"{'file':<14} {'arch':<6} {'regs':>4} {'target':>6} {'stack':>5} {'spill st':>8} {'spill ld':>8} "
          f"{'smem':>6}  kernel")
    for file, mangled, arch, regs, stack, st, ld, smem in sorted(rows, key=lambda r: (r[0], short(names[r[1]]), r[2])):
        full = names[mangled]
        target = first(REG_TARGETS, f"{full} @{arch}")
        print(f"{file:<14} {arch:<6} {regs:>4} {target:>6} {stack:>5} {st:>8} {ld:>8} {smem:>6}  {short(full)}")
        who = f"{short(full)} [{arch}, kernels/{file}.cu]"
        known = next((k for k in KNOWN_SPILLS if re.search(k[0], full)), None)
        if known:
            used_known.add(known[0])
            if st or ld:
                spilling_known.add(known[0])
        if (st or ld) and (known is None or st > known[1] or ld > known[2]):
            allowed = f"; KNOWN_SPILLS allows {known[1]}/{known[2]}" if known else ""
            failures.append(f"{who}: spills ({st} bytes spill stores, {ld} bytes spill loads{allowed})")
        if regs > target:
            failures.append(f"{who}: {regs} registers per thread, target {target} (REG_TARGETS in {__file__})")
        if smem > STATIC_SMEM_LIMIT:
            failures.append(f"{who}: {smem} bytes static shared memory, limit {STATIC_SMEM_LIMIT}")
    print(f"kernel_resources: {len(rows)} kernel x architecture entries from {len(objects)} objects, "
          f"architectures {' '.join(sorted(seen_archs))}")
    for pat, st, ld, why in KNOWN_SPILLS:
        if pat in used_known and pat not in spilling_known:
            print(f"STALE KNOWN_SPILLS entry '{pat}': no longer spills on any architecture; delete it ({why})")
        elif pat in spilling_known:
            print(f"known spill (allowed up to {st}/{ld} bytes): {why}")
    for f in failures:
        print(f"FAIL {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
