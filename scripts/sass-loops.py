#!/usr/bin/env python3
"""scripts/sass-loops.py OBJ KERNEL [--loop N] — the SASS of one kernel of a
CUDA object (a build's kernels/cuda/libloom_cuda_kernels.a.p/*.cu.o), on a
machine without a GPU: its registers, static shared memory and local (spill)
bytes, then every loop (a backward branch) with its static instruction count
and mix by opcode; --loop N prints loop N's instructions.

Counting a loop's instructions is how a kernel change is sized before device
time is spent on it (the E4M3 decode attention's key loop: 873 -> 618
instructions, docs/performance.md). A count is static: both sides of a
branch inside the loop are in it, and an outer loop's count includes its
inner loops once.

KERNEL: a substring of the mangled name, e.g.
lc_qtiled_kernelI13__nv_bfloat16Li4ELi2ELb0ELb1 (INT4, 16 tokens, raw).
cuobjdump and nvdisasm come from the CUDA toolkit, or else from PyPI's
nvidia-cuda-cuobjdump / nvidia-cuda-nvdisasm wheels, fetched once into
${LOOM_CACHE:-~/.cache/loom}/cuda-tools (the toolkit in this project's
setup has nvcc and ptxas but not these two)."""
import argparse
import collections
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile

CACHE = os.path.join(os.environ.get("LOOM_CACHE") or os.path.expanduser("~/.cache/loom"), "cuda-tools")
# the wheels' version (any recent cuobjdump reads sm_90a cubins)
WHEEL = "13.5.37"


def run(cmd, **kw):
    """subprocess.run, or exit naming the command and its error."""
    try:
        return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)
    except (OSError, subprocess.CalledProcessError) as e:
        err = getattr(e, "stderr", "") or str(e)
        sys.exit(f"sass-loops: {' '.join(cmd)}: {err.strip()}")


def tool(name):
    """Path of a CUDA binary tool, fetching its wheel from PyPI if needed."""
    found = shutil.which(name)
    if found:
        return found
    hits = glob.glob(os.path.join(CACHE, "**", "bin", name), recursive=True)
    if not hits:
        os.makedirs(CACHE, exist_ok=True)
        pkg = {"cuobjdump": "nvidia-cuda-cuobjdump", "nvdisasm": "nvidia-cuda-nvdisasm"}[name]
        run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", CACHE, f"{pkg}=={WHEEL}"])
        for whl in glob.glob(os.path.join(CACHE, pkg.replace("-", "_") + "-*.whl")):
            zipfile.ZipFile(whl).extractall(CACHE)
        hits = glob.glob(os.path.join(CACHE, "**", "bin", name), recursive=True)
        if not hits:
            sys.exit(f"sass-loops: no {name} in {pkg}'s wheel")
    os.chmod(hits[0], 0o755)
    return hits[0]


def sass(obj):
    """(cuobjdump -sass text, -res-usage text) of the object's cubins."""
    cuobjdump = tool("cuobjdump")
    env = dict(os.environ, PATH=os.path.dirname(tool("nvdisasm")) + os.pathsep + os.environ.get("PATH", ""))
    with tempfile.TemporaryDirectory() as d:
        run([cuobjdump, "-xelf", "all", os.path.abspath(obj)], cwd=d)
        cubins = sorted(glob.glob(os.path.join(d, "*.cubin")))
        if not cubins:
            sys.exit(f"sass-loops: no sm_XX code in {obj}")
        text = "".join(run([cuobjdump, "-sass", c], env=env).stdout for c in cubins)
        res = "".join(run([cuobjdump, "-res-usage", c], env=env).stdout for c in cubins)
    return text, res


def functions(text):
    """{mangled name: [(offset, instruction text)]}"""
    out, cur = {}, None
    for line in text.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            cur = out.setdefault(m.group(1), [])
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m and cur is not None:
            cur.append((int(m.group(1), 16), m.group(2).strip()))
    return out


def opcode(ins):
    ins = re.sub(r"^@!?U?P\w+\s+", "", ins)  # predicate
    return ins.split()[0].split(".")[0] if ins else "?"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("obj", metavar="OBJ")
    ap.add_argument("kernel", metavar="KERNEL")
    ap.add_argument("--loop", type=int, metavar="N", help="print loop N's instructions")
    a = ap.parse_args()
    obj, want, show = a.obj, a.kernel, a.loop
    text, res = sass(obj)
    fns = {k: v for k, v in functions(text).items() if want in k}
    if not fns:
        sys.exit(f"sass-loops: no kernel matching '{want}' in {obj}")
    for name, ins in fns.items():
        usage = re.search(re.escape(name) + r".*?\n\s*(REG:.*)", res)
        print(f"{name}: {len(ins)} instructions; {usage.group(1).strip() if usage else ''}")
        loops = []
        for off, t in ins:  # BRA, BRA.U.ANY, @P0 BRA !P1, 0x...: the target is the last address
            targets = re.findall(r"0x([0-9a-f]+)", t)
            if opcode(t) == "BRA" and targets and int(targets[-1], 16) < off:
                loops.append((int(targets[-1], 16), off))
        for n, (lo, hi) in enumerate(loops):
            body = [t for off, t in ins if lo <= off <= hi]
            mix = collections.Counter(opcode(t) for t in body)
            top = ", ".join(f"{k} {v}" for k, v in mix.most_common(14))
            print(f"  loop {n}: {lo:#x}..{hi:#x}, {len(body)} instructions: {top}")
            if show == n:
                for off, t in ins:
                    if lo <= off <= hi:
                        print(f"    {off:#06x}  {t}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
