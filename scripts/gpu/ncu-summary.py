#!/usr/bin/env python3
"""scripts/gpu/ncu-summary.py NCU.csv [--step-kernel NAME] [--by-grid] [--by-kind] — per-kernel
GPU time of one decode step from an `ncu --csv --metrics gpu__time_duration.sum` capture
(scripts/gpu/gpu-check.sh profile, qprofile, tprofile). --by-grid keeps a kernel's grids apart
(the GEMMs of one template: QKV, O, gate|up, down); with dram__bytes_read.sum
captured too, each line adds the DRAM bytes a launch reads and their rate.

A step is cut at each launch of the step's last kernel (default: the logits
top-k, tk_*), so whole steps are averaged and partial ones at the ends are
dropped, as are steps whose kernels differ from the last whole step's (a
prefill or another batch size in the window); --by-kind keeps every whole step and prints a
table per kind of step instead (the steps that ran the same kernels in the same order, the kind
of most steps first, with the positions of its first and last step among the whole steps: the
mixed and the decode steps of a throughput run apart).
Prints, per kernel name: launches per step, microseconds per step and
the share; then the sum — which, set against the step's wall time measured
without the profiler, says how much of a step is kernels and how much is the
gaps between them.

scripts/gpu/ncu-summary.py --raw RAW.csv — one line per kernel and grid of an
`ncu --set full` report exported with `ncu -i REP --page raw --csv`
(gpu-check.sh kprofile): launches, mean duration, the speed-of-light shares
(SM, memory, DRAM, L2, L1/shared), achieved occupancy, registers a thread,
dynamic shared memory, the tensor pipes' activity and the largest warp stall
reasons (cycles a warp spends stalled per issued instruction, by reason).
Metrics are found by name patterns, so one this ncu version lacks is left out
of the line rather than failing the summary.

scripts/gpu/ncu-summary.py --grid NCU.csv [REGEX] — one line per kernel and
grid of an `ncu --csv --metrics ...` capture (gpu-check.sh kprofile's warm
timings), kernels whose name matches REGEX only: launches, mean duration and
the mean of each speed-of-light share captured (SM, DRAM, L2), in launch
order; launches of one kernel and grid group while they alternate with at
most one other (a GEMM and its reduce, timed twice)."""
import csv
import re
import sys
from collections import defaultdict

UNIT = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3,
        "second": 1e6, "s": 1e6}


BYTES = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9}


def launches(path, pattern=""):
    """An `ncu --csv --metrics` capture's launches whose kernel matches pattern, in
    launch order: (kernel, grid, {metric: value}), durations in microseconds and
    byte counts in bytes; None when the file is not such a capture."""
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # drop ncu's ==PROF== chatter
    out = {}
    for r in csv.DictReader(lines):
        if "ID" not in r or "Metric Name" not in r:
            return None
        if not re.search(pattern, r.get("Kernel Name", "")):
            continue
        k = out.setdefault(r["ID"], (r["Kernel Name"], r.get("Grid Size", ""), {}))
        name, unit, v = r["Metric Name"], r.get("Metric Unit", ""), num(r.get("Metric Value"))
        if v is None:  # "n/a": the launch keeps what it has
            continue
        if name == "gpu__time_duration.sum":
            v *= UNIT.get(unit or "nsecond", 1e-3)
        elif name.startswith("dram__bytes"):
            if unit not in BYTES:
                raise SystemExit(f"ncu-summary: unknown byte unit '{unit}' in {path}")
            v *= BYTES[unit]
        k[2][name] = v
    return list(out.values())


def rows(path):
    """(kernel, grid, microseconds, DRAM bytes read or None) a launch, in launch order"""
    return [(n, grid, m["gpu__time_duration.sum"], m.get("dram__bytes_read.sum"))
            for n, grid, m in launches(path) or [] if "gpu__time_duration.sum" in m]


def short(name):
    # "void lc_gemv_kernel<__nv_bfloat16, 1, 1, false, false>(...)" -> lc_gemv_kernel<__nv_bfloat16, 1, ...>
    name = re.sub(r"^void ", "", name)
    name = re.sub(r"\(.*$", "", name)
    return name[:70]


SOL = [  # (label, exact metric names tried in order)
    ("SM%", ["sm__throughput.avg.pct_of_peak_sustained_elapsed"]),
    ("mem%", ["gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"]),
    ("dram%", ["dram__throughput.avg.pct_of_peak_sustained_elapsed",
               "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"]),
    ("L2%", ["lts__throughput.avg.pct_of_peak_sustained_elapsed"]),
    ("L1%", ["l1tex__throughput.avg.pct_of_peak_sustained_active"]),
    ("occ%", ["sm__warps_active.avg.pct_of_peak_sustained_active"]),
    ("issue%", ["smsp__issue_active.avg.pct_of_peak_sustained_active"]),
    ("Minst", ["smsp__inst_executed.sum"]),  # warp instructions, millions (scaled below)
    ("regs", ["launch__registers_per_thread"]),
    ("smem", ["launch__shared_mem_per_block_dynamic"]),
]
# cycles stalled per issued instruction: the older ncu's name, then the
# one ncu 2025 writes (smsp__average_warps_issue_stalled_X_per_issue_active)
STALL = re.compile(r"^smsp__average_warp(?:_latency|s)_issue_stalled_(\w+?)(?:_per_issue_active)?\.ratio$")
STALL_PCT = re.compile(r"^smsp__warp_issue_stalled_(\w+)_per_warp_active\.pct$")
TENSOR = re.compile(r"pipe_tensor.*(pct_of_peak_sustained_active|pct_of_peak_sustained_elapsed)$")


def num(v):
    try:
        return float(v.replace(",", ""))
    except (ValueError, AttributeError):
        return None


def raw_summary(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(l for l in f if l.startswith('"')))
    if len(rows) < 3:
        print(f"ncu-summary: no launches in {path}")
        return 1
    head, units, data = rows[0], rows[1], rows[2:]
    col = {h: i for i, h in enumerate(head)}
    get = lambda r, name: num(r[col[name]]) if name in col and col[name] < len(r) else None
    dur_unit = units[col["gpu__time_duration.sum"]] if "gpu__time_duration.sum" in col else "ns"
    scale = UNIT.get(dur_unit, 1e-3)
    groups = defaultdict(list)
    for r in data:
        name = r[col["Kernel Name"]] if "Kernel Name" in col else "?"
        grid = r[col["Grid Size"]] if "Grid Size" in col else ""
        groups[(short(name), grid)].append(r)
    for (name, grid), rs in groups.items():
        def mean(m):
            vs = [v for v in (get(r, m) for r in rs) if v is not None]
            return sum(vs) / len(vs) if vs else None

        d = mean("gpu__time_duration.sum")
        parts = [f"{name} grid {grid}: {len(rs)} launches", f"{d * scale:.1f} us" if d is not None else "? us"]
        for label, names in SOL:
            n = next((n for n in names if n in col), None)
            v = mean(n) if n else None
            if v is not None:
                unit = units[col[n]] if label == "smem" and col[n] < len(units) else ""
                val = f"{v / 1e6:.2f}" if label == "Minst" else f"{v:.0f}"
                parts.append(f"{label} {val}{' ' + unit if unit else ''}")
        tens = [(h, mean(h)) for h in head if TENSOR.search(h)]
        tens = [(h, v) for h, v in tens if v]
        if tens:
            parts.append("tensor " + ", ".join(f"{h.split('__')[1].split('.')[0]} {v:.0f}%" for h, v in tens[:3]))
        stalls = [(m.group(1), mean(h)) for h in head for m in [STALL.match(h)] if m]
        if not stalls:
            stalls = [(m.group(1), mean(h)) for h in head for m in [STALL_PCT.match(h)] if m]
        # "selected" is the cycle a warp issues, not a stall
        stalls = sorted(((k, v) for k, v in stalls if v and k != "selected"), key=lambda kv: -kv[1])[:6]
        if stalls:
            parts.append("stalls " + ", ".join(f"{k} {v:.1f}" for k, v in stalls))
        print("; ".join(parts))
    return 0


GRID_SOL = [("SM%", "sm__throughput.avg.pct_of_peak_sustained_elapsed"),
            ("dram%", "dram__throughput.avg.pct_of_peak_sustained_elapsed"),
            ("L2%", "lts__throughput.avg.pct_of_peak_sustained_elapsed")]


def grid_summary(path, pattern):
    ls = launches(path, pattern)
    if ls is None:
        print(f"ncu-summary: {path} is not an `ncu --csv --metrics` capture (no ID / Metric Name column)")
        return 1
    if not ls:
        print(f"ncu-summary: no launches matching '{pattern}' in {path}")
        return 1
    # a launch joins the group of its kernel and grid among the last two
    # groups (GEMM, reduce, GEMM, reduce: one shape), else starts one, so
    # two shapes of the same grid (O and down) stay apart
    groups = []
    for name, grid, m in ls:
        name = short(name)
        g = next((g for g in groups[-2:] if g[0] == (name, grid)), None)
        if g is None:
            g = ((name, grid), [])
            groups.append(g)
        g[1].append(m)
    for (name, grid), ms in groups:
        def mean(key):
            vs = [m[key] for m in ms if key in m]
            return sum(vs) / len(vs) if vs else None

        d = mean("gpu__time_duration.sum")
        parts = [f"{name} grid {grid}: {len(ms)} launches", f"{d:.1f} us" if d is not None else "? us"]
        parts += [f"{label} {v:.0f}" for label, key in GRID_SOL for v in [mean(key)] if v is not None]
        print("; ".join(parts))
    return 0


def cut_steps(ks, marker):
    """The whole steps of a capture, each ending at a run of the marker's launches;
    None where fewer than two such runs leave no whole step."""
    cuts = [i for i, k in enumerate(ks) if marker in k[0]]
    # a step's top-k may be several launches in a row: keep the last of each run
    ends = [c for j, c in enumerate(cuts) if j + 1 == len(cuts) or cuts[j + 1] != c + 1]
    if len(ends) < 2:
        print(f"ncu-summary: fewer than two '{marker}' launches: summing all {len(ks)} kernels as one step")
        return None
    return [ks[a + 1:b + 1] for a, b in zip(ends, ends[1:])]


def kernels_of(step):
    """What makes two steps of a kind: the kernels they ran, in order."""
    return tuple(short(k[0]) for k in step)


def kinds(steps):
    """Steps grouped by the kernels they ran (decode, mixed, a batch size's
    own kernels), the group of most steps first."""
    groups = defaultdict(list)
    for i, s in enumerate(steps):
        groups[kernels_of(s)].append((i, s))
    return sorted(groups.values(), key=lambda g: -len(g))


def print_steps(steps, by_grid):
    per = defaultdict(lambda: [0, 0.0, 0.0])  # launches, us, DRAM bytes
    for s in steps:
        for n, grid, us, by in s:
            p = per[(short(n), grid if by_grid else "")]
            p[0] += 1
            p[1] += us
            p[2] += by or 0.0
    ns = len(steps)
    total = sum(v[1] for v in per.values()) / ns
    has_bytes = any(k[3] is not None for s in steps for k in s)
    tot_by = sum(v[2] for v in per.values()) / ns
    print(f"{ns} whole steps, {sum(len(s) for s in steps) / ns:.0f} kernels per step, "
          f"{total:.1f} us of kernel time per step" +
          (f", {tot_by / 1e6:.1f} MB read from DRAM ({tot_by / total / 1e3:.0f} GB/s over the kernels' time)"
           if has_bytes else ""))
    w = 72 + (16 if by_grid else 0)
    print(f"{'kernel':{w}} {'/step':>6} {'us/step':>9} {'us each':>8} {'share':>6}" +
          (f" {'MB each':>8} {'GB/s':>6}" if has_bytes else ""))
    for (n, grid), (c, us, by) in sorted(per.items(), key=lambda kv: -kv[1][1]):
        name = f"{n} {grid}" if by_grid else n
        line = f"{name:{w}} {c / ns:6.1f} {us / ns:9.1f} {us / c:8.2f} {100 * us / ns / total:5.1f}%"
        if has_bytes:
            line += f" {by / c / 1e6:8.2f} {by / us / 1e3:6.0f}"
        print(line)


def main():
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if len(sys.argv) > 1 else 2
    if sys.argv[1] == "--raw":
        return raw_summary(sys.argv[2]) if len(sys.argv) > 2 else 2
    if sys.argv[1] == "--grid":
        return grid_summary(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "") if len(sys.argv) > 2 else 2
    marker = sys.argv[sys.argv.index("--step-kernel") + 1] if "--step-kernel" in sys.argv else "tk_"
    by_grid = "--by-grid" in sys.argv
    ks = rows(sys.argv[1])
    if not ks:
        print(f"ncu-summary: no gpu__time_duration rows in {sys.argv[1]}")
        return 1
    steps = cut_steps(ks, marker)
    if "--by-kind" in sys.argv:
        if steps is None:  # no whole step to tell kinds apart
            return 1
        for j, group in enumerate(kinds(steps)):
            first, last = group[0][0] + 1, group[-1][0] + 1
            print(("\n" if j else "") + f"kind {j + 1} (steps {first}..{last} of {len(steps)}): ", end="")
            print_steps([s for _, s in group], by_grid)
        return 0
    if steps is None:
        print_steps([ks], by_grid)
        return 0
    # only steps of the last one's kernels: a prefill or a step of another
    # batch size in the window would skew the average
    like = kernels_of(steps[-1])
    kept = [s for s in steps if kernels_of(s) == like]
    if len(kept) < len(steps):
        print(f"ncu-summary: {len(steps) - len(kept)} of {len(steps)} whole steps ran other kernels "
              f"than the last one (a prefill, another batch size): left out")
    print_steps(kept, by_grid)
    return 0


if __name__ == "__main__":
    sys.exit(main())
