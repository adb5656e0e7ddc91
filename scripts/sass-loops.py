#!/usr/bin/env python3
"""scripts/sass-loops.py OBJ KERNEL [--loop N] — the SASS of one kernel of a
CUDA object (a build's kernels/cuda/libloom_cuda_kernels.a.p/*.cu.o), on a
machine without a GPU: its registers, shared memory and spills, then every
loop (a backward branch) with its static instruction count and mix by
opcode; --loop N prints loop N's instructions.

Counting a loop's instructions is how a kernel change is sized before device
time is spent on it (docs/performance.md quotes such counts: the E4M3
attention key loop, the tiled kernels' ~4 instructions a weight). A count
is static: both sides of a branch inside the loop are in it.

KERNEL: a substring of the mangled name, e.g.
lc_qtiled_kernelI13__nv_bfloat16Li4ELi2ELb0ELb1 (INT4, 16 tokens, raw).
cuobjdump and nvdisasm come from the CUDA toolkit, or else from PyPI's
nvidia-cuda-cuobjdump / nvidia-cuda-nvdisasm wheels, fetched once into
${LOOM_CACHE:-~/.cache/loom}/cuda-tools (the toolkit in this project's
setup has nvcc and ptxas but not these two)."""
import collections
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile

CACHE = os.path.join(os.environ.get("LOOM_CACHE", os.path.expanduser("~/.cache/loom")), "cuda-tools")


def tool(name):
    """Path of a CUDA binary tool, fetching its wheel from PyPI if needed."""
    found = shutil.which(name)
    if found:
        return found
    hits = glob.glob(os.path.join(CACHE, "**", "bin", name), recursive=True)
    if not hits:
        os.makedirs(CACHE, exist_ok=True)
        pkg = {"cuobjdump": "nvidia-cuda-cuobjdump", "nvdisasm": "nvidia-cuda-nvdisasm"}[name]
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", CACHE, pkg], check=True)
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
        subprocess.run([cuobjdump, "-xelf", "all", os.path.abspath(obj)], cwd=d, check=True,
                       capture_output=True)
        cubins = sorted(glob.glob(os.path.join(d, "*.cubin")))
        if not cubins:
            sys.exit(f"sass-loops: no sm_XX code in {obj}")
        text = "".join(subprocess.run([cuobjdump, "-sass", c], env=env, check=True, capture_output=True,
                                      text=True).stdout for c in cubins)
        res = "".join(subprocess.run([cuobjdump, "-res-usage", c], env=env, check=True, capture_output=True,
                                     text=True).stdout for c in cubins)
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
    args = sys.argv[1:]
    if len(args) < 2 or args[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if args and args[0] in ("-h", "--help") else 2
    show = None
    if "--loop" in args:
        i = args.index("--loop")
        show = int(args[i + 1])
        del args[i:i + 2]
    obj, want = args[0], args[1]
    text, res = sass(obj)
    fns = {k: v for k, v in functions(text).items() if want in k}
    if not fns:
        sys.exit(f"sass-loops: no kernel matching '{want}' in {obj}")
    for name, ins in fns.items():
        usage = re.search(re.escape(name) + r".*?\n\s*(REG:.*)", res)
        print(f"{name}: {len(ins)} instructions; {usage.group(1).strip() if usage else ''}")
        loops = []
        for off, t in ins:
            m = re.search(r"BRA\s+(?:`\()?(?:0x)?([0-9a-f]+)", t)
            if m and "BRA" in opcode(t) and int(m.group(1), 16) < off:
                loops.append((int(m.group(1), 16), off))
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
