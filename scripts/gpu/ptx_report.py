#!/usr/bin/env python3
"""Registers, spills, shared memory and occupancy of every CubeCL kernel on an H100/H200 (sm_90),
measured without a GPU: `titan-rs ptx` (a CUDA build) compiles each kernel to PTX through
cubecl-cuda's own compiler, and NVIDIA's `ptxas` (from PyPI's nvidia-cuda-nvcc-cu12 wheel,
fetched into ~/.cache/titan-rs/nvcc, with the libdevice the compiler links; $PTXAS and $CUDA_PATH
override them) assembles it for sm_90 and reports
what the kernel costs the SM. Occupancy follows from those numbers and Hopper's per-SM limits.

  scripts/gpu/ptx_report.py --titan target/release/titan-rs [--out docs/gpu/ptx-sm90.md]
  scripts/gpu/ptx_report.py --toolkit       (only fetch ptxas and libdevice; prints their folder)

The CUDA build: scripts/gpu/cuda_llvm.sh, then `cargo build --release -p titan-rs --features cuda`
(or the binary of scripts/gpu/package.sh --cuda, unpacked). Exits non-zero when a kernel does not
compile or assemble.
"""
import argparse
import datetime
import glob
import os
import re
import subprocess
import sys
import tempfile
import zipfile

NVCC_WHEEL = "nvidia-cuda-nvcc-cu12==12.9.86"
# Hopper's per-SM limits (CUDA occupancy calculator): registers, shared memory, threads, blocks;
# registers are allocated per warp in units of 256, and each block reserves 1 KiB of shared memory.
SM_REGS, SM_SMEM, SM_THREADS, SM_BLOCKS, SM_WARPS = 65536, 233472, 2048, 32, 64
REG_UNIT, BLOCK_SMEM_RESERVED = 256, 1024


def nvcc_wheel():
    """The folder of PyPI's nvcc wheel holding `bin/ptxas` and `nvvm/libdevice/libdevice.10.bc`
    (cubecl-cuda's LLVM back end links libdevice for exp, log, tanh, …), fetched once."""
    root = os.path.expanduser("~/.cache/titan-rs/nvcc")
    toolkit = f"{root}/nvidia/cuda_nvcc"
    wanted = ("bin/ptxas", "nvvm/libdevice/libdevice.10.bc")
    if all(os.path.isfile(f"{toolkit}/{w}") for w in wanted):
        return toolkit
    os.makedirs(root, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                        "--only-binary=:all:", "-d", tmp, NVCC_WHEEL], check=True)
        for whl in glob.glob(f"{tmp}/*.whl"):
            with zipfile.ZipFile(whl) as z:
                for w in wanted:
                    z.extract(f"nvidia/cuda_nvcc/{w}", root)
    os.chmod(f"{toolkit}/bin/ptxas", 0o755)
    return toolkit


def assemble(ptxas, sm, path):
    """ptxas -v on one file: (registers, stack bytes, spill stores, spill loads, static shared) or an error."""
    # The architecture the PTX names (`sm_90a` where cubecl-cuda targets Hopper's own features).
    with open(path) as f:
        m = re.search(r"^\.target\s+(sm_\w+)", f.read(), re.M)
    arch = m.group(1) if m else f"sm_{sm}"
    r = subprocess.run([ptxas, f"-arch={arch}", "-v", "-o", os.devnull, path], capture_output=True, text=True)
    if r.returncode != 0:
        return None, (r.stderr or r.stdout).strip().splitlines()[-1:]
    text = r.stderr + r.stdout
    num = lambda pat: int(m.group(1)) if (m := re.search(pat, text)) else 0
    return (num(r"Used (\d+) registers"), num(r"(\d+) bytes stack frame"), num(r"(\d+) bytes spill stores"),
            num(r"(\d+) bytes spill loads"), num(r"(\d+) bytes smem")), None


def occupancy(threads, regs, smem):
    """(blocks a SM holds, share of its 64 warps) for blocks of `threads` threads."""
    warps = -(-threads // 32)
    per_warp = -(-max(regs, 1) * 32 // REG_UNIT) * REG_UNIT
    by_regs = SM_REGS // (per_warp * warps)
    by_smem = SM_SMEM // (smem + BLOCK_SMEM_RESERVED)
    blocks = min(by_regs, by_smem, SM_THREADS // threads, SM_BLOCKS)
    return blocks, blocks * warps / SM_WARPS


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--titan", help="a titan-rs built with --features cuda")
    ap.add_argument("--toolkit", action="store_true",
                    help="only fetch the wheel's ptxas and libdevice and print their folder (package.sh --cuda)")
    ap.add_argument("--out", default="docs/gpu/ptx-sm90.md")
    ap.add_argument("--sm", type=int, default=90)
    a = ap.parse_args()
    toolkit = nvcc_wheel()
    if a.toolkit:
        print(toolkit)
        return 0
    if not a.titan:
        ap.error("--titan BIN is required (a titan-rs built with --features cuda)")
    ptxas = os.environ.get("PTXAS") or f"{toolkit}/bin/ptxas"
    env = dict(os.environ)
    env.setdefault("CUDA_PATH", toolkit)
    version = subprocess.run([ptxas, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
    rows, failures = [], []
    with tempfile.TemporaryDirectory() as tmp:
        r = subprocess.run([a.titan, "ptx", "--out", tmp, "--sm", str(a.sm)], capture_output=True, text=True, env=env)
        sys.stderr.write(r.stdout + r.stderr)
        with open(f"{tmp}/kernels.tsv") as f:
            lines = f.read().splitlines()[1:]
        for line in lines:
            name, entry, threads, shared, file, status = line.split("\t")
            if status != "ok":
                failures.append(f"{name}: did not compile: {status}")
                continue
            stats, err = assemble(ptxas, a.sm, f"{tmp}/{file}")
            if stats is None:
                failures.append(f"{name}: ptxas: {' '.join(err)}")
                continue
            regs, stack, spill_st, spill_ld, smem_static = stats
            smem = int(shared) + smem_static
            blocks, occ = occupancy(int(threads), regs, smem)
            rows.append((name, int(threads), regs, stack, spill_st, spill_ld, smem, blocks, occ))
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    out = [f"# The CubeCL kernels on sm_{a.sm}, measured without a GPU", "",
           f"{date}: `scripts/gpu/ptx_report.py` — `titan-rs ptx` (cubecl-cuda's LLVM back end, the one the CUDA",
           f"bundle runs) compiled every kernel to PTX; `ptxas -v` ({version}) for the architecture the PTX names assembled it.",
           "Shared memory is what a launch reserves (dynamic) plus any static; blocks/SM and occupancy",
           "(active warps of 64) follow from registers, shared memory and block size with Hopper's limits",
           "(64 Ki registers, 228 KiB shared memory, 2 048 threads, 32 blocks a SM). No kernel ran.", "",
           "| kernel | threads | registers | stack B | spill stores B | spill loads B | shared KiB | blocks/SM | occupancy |",
           "|---|---|---|---|---|---|---|---|---|"]
    for name, threads, regs, stack, sst, sld, smem, blocks, occ in rows:
        out.append(f"| {name} | {threads} | {regs} | {stack} | {sst} | {sld} | {smem / 1024:.1f} | {blocks} | {occ:.0%} |")
    out += ["", "Failures:", ""] + ([f"- {x}" for x in failures] or ["none"])
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        f.write("\n".join(out) + "\n")
    print(f"{len(rows)} kernels assembled, {len(failures)} failures: {a.out}")
    return 1 if failures or r.returncode != 0 else 0


if __name__ == "__main__":
    sys.exit(main())
