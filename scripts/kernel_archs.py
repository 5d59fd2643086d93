#!/usr/bin/env python3
"""Which GPU code the kernels library carries (ctest kernels_archs_test).

Lists, for every kernels/*.cu object in libdtrain_kernels.a, the machine code (SASS, in
ELF cubins) and the PTX embedded in its .nv_fatbin section, as `cuobjdump --list-elf` /
`--list-ptx` would, and fails unless every object carries exactly what the tree was
configured for (--archs, CMake's CUDA_ARCHITECTURES syntax: "90" = sm_90 SASS + compute_90
PTX, "90-real" = SASS only, "90-virtual" = PTX only). The objects named by --sm90a-objects
(the files kernels/CMakeLists.txt builds for sm_90a: wgmma is an sm_90a feature) carry
sm_90a SASS where the others carry sm_90 ("90": sm_90a + compute_90; "90-real": sm_90a).
Where cuobjdump is installed its listing is compared with this one too.

The fat binary layout (NVIDIA does not document it; it is stable since CUDA 4 and matches
cuobjdump's reading): a container is a 16-byte header (u32 magic 0xBA55ED50, u16 version
1, u16 header size 16, u64 size of the entries that follow), then entries, each a header
(u16 kind: 1 PTX, 2 ELF; u16 version; u32 header size; u64 payload size; ...; u32 arch at
byte 28, e.g. 90; u64 flags at byte 40, where 0x100000 marks an arch-specific target, sm_90a
or compute_90a, as nvcc 13.0 writes it) followed by its payload.

  kernel_archs.py --library BUILD/kernels/libdtrain_kernels.a --archs "80;90"
"""
import argparse
import pathlib
import re
import shutil
import struct
import subprocess
import sys
import tempfile

FATBIN_MAGIC = 0xBA55ED50
KIND = {1: "ptx", 2: "elf"}
ARCH_SPECIFIC = 0x100000  # entry flags: the "a" of sm_90a / compute_90a


def ar_members(data):
    """[(name, bytes)] of a System V / GNU ar archive."""
    if not data.startswith(b"!<arch>\n"):
        raise ValueError("not an ar archive")
    members, names, off = [], b"", 8
    while off + 60 <= len(data):
        hdr = data[off:off + 60]
        name = hdr[:16].decode().strip()
        size = int(hdr[48:58].decode().strip())
        body = data[off + 60:off + 60 + size]
        if name == "//":
            names = body
        elif name.startswith("/") and name[1:].isdigit():
            end = names.index(b"/\n", int(name[1:]))
            members.append((names[int(name[1:]):end].decode(), body))
        elif name not in ("/", "/SYM64/"):
            members.append((name.rstrip("/"), body))
        off += 60 + size + (size & 1)
    return members


def fatbin_entries(blob):
    """{("elf"|"ptx", arch)} of every fat binary container in an object file; arch "90" or "90a"."""
    found = set()
    off = 0
    while True:
        off = blob.find(struct.pack("<I", FATBIN_MAGIC), off)
        if off < 0 or off + 16 > len(blob):
            return found
        _, version, hsize, size = struct.unpack_from("<IHHQ", blob, off)
        if version != 1 or hsize != 16 or off + 16 + size > len(blob):
            off += 4
            continue
        e, end = off + 16, off + 16 + size
        while e + 32 <= end:
            kind, _, ehsize, psize = struct.unpack_from("<HHIQ", blob, e)
            arch = str(struct.unpack_from("<I", blob, e + 28)[0])
            if kind not in KIND or ehsize < 48 or e + ehsize + psize > end:
                raise ValueError(f"malformed fat binary entry at byte {e}")
            if struct.unpack_from("<Q", blob, e + 40)[0] & ARCH_SPECIFIC:
                arch += "a"
            found.add((KIND[kind], arch))
            e += ehsize + psize
        off = end


def expected(archs, sm90a=False):
    """The entries CMake's CUDA_ARCHITECTURES `archs` give an object; sm90a: 90's SASS as sm_90a."""
    want = set()
    for a in re.split(r"[;, ]+", archs.strip()):
        m = re.fullmatch(r"(\d+)([a-z]?)(-real|-virtual)?", a)
        if not m:
            raise ValueError(f"cannot read CUDA architecture '{a}' in '{archs}'")
        n = m.group(1) + m.group(2)
        if m.group(3) != "-virtual":
            want.add(("elf", n + "a" if sm90a and n == "90" else n))
        if m.group(3) != "-real":
            want.add(("ptx", n))
    return want


def fmt(entries):
    return " ".join(sorted(f"sm_{a}" if k == "elf" else f"compute_{a}" for k, a in entries)) or "(none)"


def cuobjdump_listing(members):
    """{member: {(kind, arch)}} from cuobjdump --list-elf / --list-ptx of each object; None without cuobjdump."""
    tool = shutil.which("cuobjdump") or (
        "/usr/local/cuda/bin/cuobjdump" if pathlib.Path("/usr/local/cuda/bin/cuobjdump").exists() else None)
    if not tool:
        return None
    found = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, blob in members:
            obj = pathlib.Path(tmp) / name
            obj.write_bytes(blob)
            got = found.setdefault(name, set())
            for kind in ("elf", "ptx"):
                out = subprocess.run([tool, f"--list-{kind}", str(obj)], capture_output=True, text=True).stdout
                # "ELF file    1: <name>.sm_90.cubin", "PTX file    1: <name>.sm_90.ptx"
                for m in re.finditer(r"\.sm_(\d+[a-z]?)\.(cubin|ptx)\b", out):
                    got.add(("elf" if m.group(2) == "cubin" else "ptx", m.group(1)))
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--library", required=True, help="libdtrain_kernels.a")
    ap.add_argument("--archs", required=True, help="CMAKE_CUDA_ARCHITECTURES the tree was configured with")
    ap.add_argument("--sm90a-objects", default="",
                    help="objects (e.g. 'attention_hopper.cu.o;hopper_check.cu.o') built with sm_90a for sm_90")
    a = ap.parse_args()
    want = expected(a.archs)
    sm90a = {n for n in re.split(r"[;, ]+", a.sm90a_objects.strip()) if n}
    lib = pathlib.Path(a.library)
    members = [(n, b) for n, b in ar_members(lib.read_bytes()) if n.endswith(".cu.o")]
    if not members:
        print(f"kernel_archs: no kernels/*.cu objects in {lib}", file=sys.stderr)
        return 2
    failures = []
    listing = {}
    print(f"kernel_archs: configured '{a.archs}': expecting {fmt(want)} in every object of {lib}")
    if sm90a:
        print(f"kernel_archs: {', '.join(sorted(sm90a))}: expecting {fmt(expected(a.archs, True))}")
    for n in sorted(sm90a - {name for name, _ in members}):
        failures.append(f"{n}: named by --sm90a-objects, not in {lib}")
    for name, blob in members:
        got = fatbin_entries(blob)
        listing[name] = got
        print(f"  {name:<22} {fmt(got)}")
        want = expected(a.archs, name in sm90a)
        if got != want:
            miss, extra = want - got, got - want
            failures.append(f"{name}: missing {fmt(miss)}" + (f", not configured {fmt(extra)}" if extra else "")
                            if miss else f"{name}: not configured {fmt(extra)}")
    dumped = cuobjdump_listing(members)
    if dumped is None:
        print("kernel_archs: no cuobjdump installed; the listing above is this script's own reading")
    else:
        for name, got in listing.items():
            if dumped.get(name, set()) != got:
                failures.append(f"{name}: cuobjdump lists {fmt(dumped.get(name, set()))}, this script {fmt(got)}")
        if not any("cuobjdump lists" in f for f in failures):
            print("kernel_archs: cuobjdump --list-elf/--list-ptx of each object agrees")
    for f in failures:
        print(f"FAIL {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
