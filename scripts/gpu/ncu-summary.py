#!/usr/bin/env python3
"""scripts/gpu/ncu-summary.py NCU.csv [--step-kernel NAME] — per-kernel GPU time of
one decode step from an `ncu --csv --metrics gpu__time_duration.sum` capture
(scripts/gpu/gpu-check.sh profile).

A step is cut at each launch of the step's last kernel (default: the logits
top-k, tk_*), so whole steps are averaged and partial ones at the ends are
dropped. Prints, per kernel name: launches per step, microseconds per step and
the share; then the sum — which, set against the step's wall time measured
without the profiler, says how much of a step is kernels and how much is the
gaps between them."""
import csv
import re
import sys
from collections import defaultdict

UNIT = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3,
        "second": 1e6, "s": 1e6}


def rows(path):
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # drop ncu's ==PROF== chatter
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        v = float(r["Metric Value"].replace(",", ""))
        yield r["Kernel Name"], v * UNIT.get(r.get("Metric Unit", "nsecond"), 1e-3)


def short(name):
    # "void lc_gemv_kernel<__nv_bfloat16, 1, 1, false, false>(...)" -> lc_gemv_kernel<__nv_bfloat16, 1, ...>
    name = re.sub(r"^void ", "", name)
    name = re.sub(r"\(.*$", "", name)
    return name[:70]


def main():
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if len(sys.argv) > 1 else 2
    marker = sys.argv[sys.argv.index("--step-kernel") + 1] if "--step-kernel" in sys.argv else "tk_"
    ks = list(rows(sys.argv[1]))
    if not ks:
        print(f"ncu-summary: no gpu__time_duration rows in {sys.argv[1]}")
        return 1
    cuts = [i for i, (n, _) in enumerate(ks) if marker in n]
    # a step's top-k may be several launches in a row: keep the last of each run
    ends = [c for j, c in enumerate(cuts) if j + 1 == len(cuts) or cuts[j + 1] != c + 1]
    if len(ends) < 2:
        print(f"ncu-summary: fewer than two '{marker}' launches: summing all {len(ks)} kernels as one step")
        steps = [ks]
    else:
        steps = [ks[a + 1:b + 1] for a, b in zip(ends, ends[1:])]
    per = defaultdict(lambda: [0, 0.0])
    for s in steps:
        for n, us in s:
            per[short(n)][0] += 1
            per[short(n)][1] += us
    ns = len(steps)
    total = sum(v[1] for v in per.values()) / ns
    print(f"{ns} whole steps, {sum(len(s) for s in steps) / ns:.0f} kernels per step, "
          f"{total:.1f} us of kernel time per step")
    print(f"{'kernel':72} {'/step':>6} {'us/step':>9} {'us each':>8} {'share':>6}")
    for n, (c, us) in sorted(per.items(), key=lambda kv: -kv[1][1]):
        print(f"{n:72} {c / ns:6.1f} {us / ns:9.1f} {us / c:8.2f} {100 * us / ns / total:5.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
