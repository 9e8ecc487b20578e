#!/usr/bin/env python3
"""Registers, spills and shared memory of the GPU kernels, as the compilers report them.

    python3 scripts/kernel_resources.py [--arch sm_90|gfx90a|gfx940|gfx1030 ...] [--opt -O3]
                                        [--filter SUBSTRING] [--sass] [FILE.cu ...]

Compiles each kernel file (default: backends/gpu/kernels/flash_attention_tc.cu and gemm_tc.cu)
for each target: nvcc -Xptxas -v for sm_XX (registers, spill stores/loads, static shared
memory), hipcc -Rpass-analysis=kernel-resource-usage for gfxXXX (VGPRs, AGPRs, scratch bytes a
lane, LDS). One line a kernel and target, names demangled. Kernels whose body a target does not
compile (CT_ONLY_ON_ITS_WARP: the other wavefront size) show 0 registers. Nothing here runs a
kernel: this is what the compilers planned, not a speed. --sass (sm_XX, needs cuobjdump): the
instructions of each kernel's main loop in the machine code (the loop with the most HMMA), by
kind -- how many instructions surround each matrix instruction.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_FILES = ["backends/gpu/kernels/flash_attention_tc.cu", "backends/gpu/kernels/gemm_tc.cu"]


def demangle(names):
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout
    short = []
    for n in out.splitlines():
        n = re.sub(r"ct::gpu::\(anonymous namespace\)::|ct::gpu::|void ", "", n)
        short.append(re.sub(r"\(.*\)$", "", n))
    return short


def nvcc(path, arch, opt):
    exe = os.environ.get("NVCC", "/usr/local/cuda/bin/nvcc")
    cmd = [exe, "-std=c++20", opt, f"-arch={arch}", f"-I{ROOT}", "-c", path, "-o", os.devnull,
           "-Xptxas", "-v"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if r.returncode:
        sys.exit(f"kernel_resources: {' '.join(cmd)} failed:\n{r.stderr}")
    rows, cur, spill = [], None, (0, 0)
    for line in r.stderr.splitlines():
        m = re.search(r"Compiling entry function '(\S+)'", line)
        if m:
            cur = m.group(1)
            continue
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            spill = (int(m.group(1)), int(m.group(2)))
        m = re.search(r"Used (\d+) registers", line)
        if m and cur:
            smem = re.search(r"(\d+) bytes smem", line)
            rows.append((cur, f"{m.group(1):>4} regs  spill st/ld {spill[0]:>4}/{spill[1]:<4} "
                              f"smem {smem.group(1) if smem else 0:>6}"))
            cur, spill = None, (0, 0)
    return rows


def hipcc(path, arch, opt):
    exe = os.environ.get("HIPCC", "hipcc")
    cmd = [exe, "-std=c++20", "-fPIC", opt, "-ffp-contract=off", f"--offload-arch={arch}",
           f"-I{ROOT}", "-c", path, "-o", os.devnull, "-Rpass-analysis=kernel-resource-usage"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if r.returncode:
        sys.exit(f"kernel_resources: {' '.join(cmd)} failed:\n{r.stderr}")
    rows, cur, vals = [], None, {}

    def flush():
        if cur:
            rows.append((cur, f"v{vals.get('VGPRs', 0):>4} a{vals.get('AGPRs', 0):>4}  scratch "
                              f"{vals.get('ScratchSize', 0):>5} B/lane  lds {vals.get('LDS', 0):>6}"))

    for line in r.stderr.splitlines():
        m = re.search(r"Function Name: (\S+)", line)
        if m:
            flush()
            cur, vals = m.group(1), {}
            continue
        for key in ("VGPRs", "AGPRs", "ScratchSize", "LDS"):
            m = re.search(key + r"[^:]*: (\d+)", line)
            if m and cur and key not in vals:
                vals[key] = int(m.group(1))
    flush()
    return rows


def sass_loops(path, arch, opt):
    """Per kernel, the SASS of its innermost-heaviest loop: the backward branch whose body holds
    the most matrix instructions (HMMA), then the most instructions; its instruction count and
    the counts of a few kinds. Needs cuobjdump (CUDA's, or PyPI's nvidia-cuda-cuobjdump wheel
    unpacked, on PATH or in $CUOBJDUMP)."""
    exe = os.environ.get("NVCC", "/usr/local/cuda/bin/nvcc")
    obj = os.environ.get("CUOBJDUMP", "cuobjdump")
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "k.cubin")
        cmd = [exe, "-std=c++20", opt, f"-arch={arch}", f"-I{ROOT}", "-cubin", path, "-o", cubin]
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        if r.returncode:
            sys.exit(f"kernel_resources: {' '.join(cmd)} failed:\n{r.stderr}")
        try:
            sass = subprocess.run([obj, "-sass", cubin], capture_output=True, text=True).stdout
        except FileNotFoundError:
            sys.exit("kernel_resources: --sass needs cuobjdump (set CUOBJDUMP; PyPI: "
                     "pip download --no-deps nvidia-cuda-cuobjdump, unzip, bin/cuobjdump)")
    rows = []
    kinds = ["HMMA", "LDSM", "MUFU", "F2FP", "BRA", "LDL", "STL"]
    for func in re.split(r"\n\s+Function : ", sass)[1:]:
        name = func.split("\n")[0].strip()
        ins = []
        for line in func.split("\n"):
            m = re.search(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)[.\w]*\s*(.*?);", line)
            if m:
                ins.append((int(m.group(1), 16), m.group(2), m.group(3)))
        best = None  # (matrix instructions, length, start, end)
        for at, op, args in ins:
            t = re.search(r"0x([0-9a-f]+)", args) if op == "BRA" else None
            if t and int(t.group(1), 16) < at:
                lo = int(t.group(1), 16)
                body = [o for a, o, _ in ins if lo <= a <= at]
                key = (body.count("HMMA"), len(body), lo, at)
                best = max(best, key) if best else key
        if not best:
            rows.append((name, "no loop"))
            continue
        body = [o for a, o, _ in ins if best[2] <= a <= best[3]]
        rows.append((name, f"loop {len(body):>5} instr  " +
                     " ".join(f"{k} {body.count(k)}" for k in kinds if body.count(k))))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="*", default=DEFAULT_FILES)
    ap.add_argument("--arch", action="append", help="sm_XX or gfxXXX (repeatable; default sm_90)")
    ap.add_argument("--opt", default="-O3")
    ap.add_argument("--filter", default="", help="only kernels whose name contains this")
    ap.add_argument("--sass", action="store_true",
                    help="sm_XX: the SASS instructions of each kernel's main loop (cuobjdump)")
    a = ap.parse_args()
    for path in a.files:
        for arch in a.arch or ["sm_90"]:
            if a.sass and arch.startswith("sm_"):
                rows = sass_loops(path, arch, a.opt)
            else:
                rows = (nvcc if arch.startswith("sm_") else hipcc)(path, arch, a.opt)
            names = demangle([n for n, _ in rows])
            print(f"# {os.path.relpath(os.path.join(ROOT, path), ROOT)} {arch} {a.opt}")
            for name, (_, text) in sorted(zip(names, rows)):
                if a.filter in name:
                    print(f"{text}  {name}")


if __name__ == "__main__":
    main()
