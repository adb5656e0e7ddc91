#!/usr/bin/env python3
"""scripts/gpu/ncu-summary.py's step mode on a synthetic ncu capture: steps cut
at the top-k, a partial first step and a prefill step left out, the metrics of
one launch joined by ID, grids kept apart with --by-grid, DRAM bytes and rates;
--by-kind's table per kind of step."""
import csv
import io
import os
import subprocess
import sys
import tempfile

SCRIPT = os.path.join(os.environ.get("LOOM_SOURCE_DIR", "."), "scripts", "gpu", "ncu-summary.py")
STEP = [("void lc_gemv<1>(const int*)", "(48, 1, 6)", 10.0, 25.0),
        ("void lc_gemv<1>(const int*)", "(224, 1, 1)", 30.0, 117.0),
        ("void lc_tk_topk(int)", "(1, 1, 1)", 2.0, 0.5)]


def capture(launches):
    out = io.StringIO()
    w = csv.writer(out, quoting=csv.QUOTE_ALL)
    w.writerow(["ID", "Kernel Name", "Grid Size", "Metric Name", "Metric Unit", "Metric Value"])
    for i, (name, grid, us, mb) in enumerate(launches):
        w.writerow([i, name, grid, "dram__bytes_read.sum", "Mbyte", f"{mb:,.2f}"])
        w.writerow([i, name, grid, "gpu__time_duration.sum", "usecond", f"{us:.2f}"])
    return "==PROF== Connected to process\n" + out.getvalue()


def run(text, *args):
    with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
        f.write(text)
    try:
        r = subprocess.run([sys.executable, SCRIPT, f.name, *args], capture_output=True, text=True)
    finally:
        os.unlink(f.name)
    if r.returncode != 0:
        raise SystemExit(f"FAIL ncu-summary exited {r.returncode}: {r.stderr}")
    return r.stdout


def check(cond, what, out):
    if not cond:
        print(f"FAIL {what}\n{out}")
        sys.exit(1)
    print(f"PASS {what}")


# a partial step, a prefill step (another kernel), then three decode steps
prefill = [("void lc_gemm_prefill(int)", "(96, 8, 1)", 500.0, 200.0), STEP[2]]
launches = STEP[1:] + prefill + STEP * 3
out = run(capture(launches), "--by-grid")
check("3 whole steps, 3 kernels per step, 42.0 us" in out, "whole decode steps only, partial and prefill left out", out)
check("1 of 4 whole steps ran other kernels" in out, "the prefill step is reported as left out", out)
check("142.5 MB read from DRAM (3393 GB/s" in out, "DRAM bytes a step and their rate over the kernel time", out)
line = next((l for l in out.splitlines() if "(224, 1, 1)" in l), "")
check(line.split()[-2:] == ["117.00", "3900"], "a grid's own line: MB a launch and GB/s", out)
out = run(capture(launches))
line = next((l for l in out.splitlines() if l.startswith("lc_gemv<1>")), "")
check(line.split()[1:3] == ["2.0", "40.0"], "without --by-grid the grids of one kernel are summed", out)
no_bytes = capture(launches).replace("dram__bytes_read.sum", "sm__cycles_elapsed.avg")
out = run(no_bytes)
check("MB" not in out and "42.0 us of kernel time per step" in out, "a duration-only capture prints no byte columns", out)
out = run(capture(launches + prefill), "--by-kind")
heads = [l for l in out.splitlines() if l.startswith("kind ")]
check(len(heads) == 2 and heads[0].startswith("kind 1 (steps 2..4 of 5): 3 whole steps, 3 kernels per step, 42.0 us")
      and heads[1].startswith("kind 2 (steps 1..5 of 5): 2 whole steps, 2 kernels per step, 502.0 us"),
      "--by-kind: a table per kind of step, every whole step kept", out)
r = subprocess.run([sys.executable, SCRIPT, "/dev/stdin", "--by-kind"], input=capture(STEP), capture_output=True, text=True)
check(r.returncode == 1 and "fewer than two" in r.stdout, "--by-kind refuses a capture of less than two whole steps", r.stdout)
