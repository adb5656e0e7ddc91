#!/usr/bin/env python3
"""bench/record.py NAME [options] — write bench/results/NAME.json, the current
figure of one benchmark: what was measured, the command that measures it
again, the commit, the date and the hardware, then the numbers.

A re-measurement overwrites the file (git keeps the history). With --merge the
file's other entries stay and each entry replaced carries its own commit and
date, so a stage that measures part of a table (QUANT_SCHEMES=fp8, say)
updates only its rows. NAME may contain {hw}: the hardware's short name
(h200, h200x2 for two of them, cpu; $LOOM_HW overrides).

  --what TEXT          one line: what is measured
  --command CMD        the command that produces this file again
  --bench KEY=FILE     a `loom bench [--compare]` JSON, kept whole; a compare
                       also gets b_over_a (output and total tok/s, TPOT p50)
  --json KEY=FILE      any other JSON (gpu_bench, serve_load.py, tp_comm_bench)
  --text KEY=FILE      a text result, its non-empty lines
  --value KEY=VALUE    a number (if it parses as one) or a string
  --merge              keep the entries this call does not name
  --cpu                describe the CPU as the hardware even where a GPU is present
  --dir DIR            where (default: $LOOM_RESULTS, else bench/results of this repository)
  --commit REV, --date YYYY-MM-DD, --hardware TEXT: instead of what is detected
                       (commit: $LOOM_COMMIT, .devpack/commit.txt, git HEAD)
  --hw                 print the hardware's short name and exit
"""
import argparse
import datetime
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def gpus():
    """[(name, MiB, driver)] of every GPU, or [] without nvidia-smi."""
    out = run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
               "--format=csv,noheader,nounits"])
    return [tuple(f.strip() for f in line.split(",")) for line in out.splitlines() if line.count(",") == 2]


def hardware(cpu_only):
    g = [] if cpu_only else gpus()
    if g:
        cuda = re.search(r"CUDA Version:\s*([0-9.]+)", run(["nvidia-smi"]))
        return (f"{len(g)}x {g[0][0]} ({g[0][1]} MiB), driver {g[0][2]}"
                + (f", CUDA {cuda.group(1)}" if cuda else "") + f", {os.cpu_count()} CPU cores")
    model = re.search(r"^Model name:\s*(.+)$", run(["lscpu"]), re.M)
    return f"{model.group(1).strip() if model else 'CPU'}, {os.cpu_count()} cores, no GPU used"


def hw_slug(cpu_only):
    if os.environ.get("LOOM_HW"):
        return os.environ["LOOM_HW"]
    g = [] if cpu_only else gpus()
    if not g:
        return "cpu"
    # the model's token ("NVIDIA H100 80GB HBM3" -> h100), not the last
    # word, which names the memory on some cards
    m = re.search(r"\b(G?[A-Z]{1,2}\d{2,4}[A-Z]?)\b", g[0][0])
    name = (m.group(1) if m else g[0][0].split()[-1]).lower()
    return name if len(g) == 1 else f"{name}x{len(g)}"


def commit(cpu=False):
    if os.environ.get("LOOM_COMMIT"):
        return os.environ["LOOM_COMMIT"]
    # a GPU run's binaries come from the pack, which says what it was built
    # from (pack-gpu.sh); a CPU run's from this checkout, whatever pack lies
    # about from an earlier GPU session
    for d in () if cpu else (os.getcwd(), ROOT):
        p = os.path.join(d, ".devpack", "commit.txt")
        if os.path.isfile(p):
            return open(p).read().strip()
    rev = run(["git", "-C", ROOT, "rev-parse", "--short=12", "HEAD"]) or "unknown"
    dirty = run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"])
    return rev + ("-dirty" if dirty else "")


def number(s):
    try:
        return int(s)
    except ValueError:
        try:
            return float(s)
        except ValueError:
            return s


def bench(path):
    d = json.load(open(path))
    a, b = d.get("a_results"), d.get("b_results")
    if isinstance(a, dict) and isinstance(b, dict):
        ratio = {}
        for k in ("output_tokens_s_tok_s", "total_tokens_s_tok_s", "TPOT_p50_ms"):
            if a.get(k) and b.get(k) is not None:
                ratio[k] = round(b[k] / a[k], 4)
        d["b_over_a"] = ratio
    return d


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("name", nargs="?")
    ap.add_argument("--what", default="")
    ap.add_argument("--command", default="")
    for k in ("bench", "json", "text", "value"):
        ap.add_argument("--" + k, action="append", default=[], metavar="KEY=" + ("VALUE" if k == "value" else "FILE"))
    ap.add_argument("--merge", action="store_true")
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--dir", default=os.environ.get("LOOM_RESULTS") or os.path.join(ROOT, "bench", "results"))
    ap.add_argument("--commit")
    ap.add_argument("--date")
    ap.add_argument("--hardware")
    ap.add_argument("--hw", action="store_true")
    a = ap.parse_args()
    if a.hw:
        print(hw_slug(a.cpu))
        return 0
    if not a.name:
        ap.error("NAME is required")
    name = a.name.replace("{hw}", hw_slug(a.cpu))
    prov = {"commit": a.commit or commit(a.cpu),
            "date": a.date or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
            "hardware": a.hardware or hardware(a.cpu)}
    entries = {}
    try:
        for kind in ("bench", "json", "text", "value"):
            for item in getattr(a, kind):
                key, sep, arg = item.partition("=")
                if not sep or not key:
                    ap.error(f"--{kind} wants KEY=..., got '{item}'")
                if kind == "bench":
                    entries[key] = bench(arg)
                elif kind == "json":
                    entries[key] = json.load(open(arg))
                elif kind == "text":
                    entries[key] = [line.rstrip() for line in open(arg, errors="replace") if line.strip()]
                else:
                    entries[key] = number(arg)
    except (OSError, ValueError) as e:
        print(f"record.py: {name}: {e}", file=sys.stderr)
        return 1
    path = os.path.join(a.dir, name + ".json")
    prov["command"] = a.command
    doc = {"what": a.what, "command": a.command, "commit": prov["commit"], "date": prov["date"],
           "hardware": prov["hardware"], "results": {}}
    if a.merge:   # every entry says when it was measured
        def stamp(v, p):
            return {"commit": p["commit"], "date": p["date"], "command": p.get("command", ""), "data": v}
        if os.path.isfile(path):
            old = json.load(open(path))
            doc["what"] = a.what or old.get("what", "")
            doc["command"] = a.command or old.get("command", "")
            for k, v in old.get("results", {}).items():
                stamped = isinstance(v, dict) and {"commit", "date", "data"} <= set(v)
                doc["results"][k] = v if stamped else stamp(v, old)
        entries = {k: stamp(v, prov) for k, v in entries.items()}
    doc["results"].update(entries)
    os.makedirs(a.dir, exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=False)
        f.write("\n")
    rel = os.path.relpath(path)
    print(f"record.py: wrote {path if rel.startswith('..') else rel}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
