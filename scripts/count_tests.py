#!/usr/bin/env python3
"""Count individual test cases across meson test logs.

Criterion programs print "Synthesis: Tested: T | Passing: P | Failing: F |
Crashing: C"; those give per-case counts. Any other test (scripts, a
Criterion program that died before its synthesis) counts as one case by its
meson result. Prints exactly one line: "N passed, N failed" (", N skipped"
when some were skipped) and exits 1 when anything failed. A first argument
--failed N adds N failures found outside the logs (test.sh's setup steps).
"""
import json
import re
import sys

SYN = re.compile(r"Synthesis: Tested: (\d+) \| Passing: (\d+) \| Failing: (\d+) \| Crashing: (\d+)")
SKIP = re.compile(r"Skipped: (\d+)")

passed = failed = skipped = 0
builds = sys.argv[1:]
if builds[:1] == ["--failed"]:
    failed, builds = int(builds[1]), builds[2:]
for build in builds:
    try:
        lines = open(f"{build}/meson-logs/testlog.json").read().splitlines()
    except OSError:
        print(f"count_tests: no test log in {build}", file=sys.stderr)
        failed += 1
        continue
    for line in lines:
        t = json.loads(line)
        out = (t.get("stdout") or "") + (t.get("stderr") or "")
        m = SYN.findall(re.sub(r"\x1b\[[0-9;]*m", "", out))
        result = t.get("result", "")
        if m and result in ("OK", "FAIL", "EXPECTEDFAIL"):
            tested, p, f, c = map(int, m[-1])
            passed += p
            failed += f + c
            if result == "FAIL" and f + c == 0:
                failed += 1  # e.g. leaks reported after all cases passed
        elif result == "SKIP":
            skipped += 1
        elif result in ("OK", "EXPECTEDFAIL"):
            passed += 1
        else:
            failed += 1
line = f"{passed} passed, {failed} failed"
if skipped:
    line += f", {skipped} skipped"
print(line)
sys.exit(1 if failed else 0)
