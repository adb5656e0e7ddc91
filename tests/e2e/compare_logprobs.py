#!/usr/bin/env python3
"""compare_logprobs.py REF LOOM [--mean M] [--max X] — compare teacher-forced
log-probabilities (one per line) from an independent reference and from loom.
Prints the statistics and PASS/FAIL; exit 1 on FAIL."""
import sys

ref = [float(x) for x in open(sys.argv[1]).read().split()]
got = [float(x) for x in open(sys.argv[2]).read().split()]
mean_tol = float(sys.argv[sys.argv.index("--mean") + 1]) if "--mean" in sys.argv else 0.05
max_tol = float(sys.argv[sys.argv.index("--max") + 1]) if "--max" in sys.argv else 0.5
if len(ref) != len(got) or not ref:
    print(f"FAIL lengths differ: reference {len(ref)}, loom {len(got)}")
    sys.exit(1)
d = [abs(a - b) for a, b in zip(ref[1:], got[1:])]
mean, mx = sum(d) / len(d), max(d)
ok = mean < mean_tol and mx < max_tol and all(g == g for g in got)
print(f"{'PASS' if ok else 'FAIL'} logprobs vs reference: {len(d)} positions, mean |diff| {mean:.4f} "
      f"(< {mean_tol}), max |diff| {mx:.4f} (< {max_tol}), reference mean logprob {sum(ref[1:])/len(d):.3f}")
sys.exit(0 if ok else 1)
