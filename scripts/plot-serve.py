#!/usr/bin/env python3
"""scripts/plot-serve.py RESULT.json OUT.png — draw a bench/serve_sweep.sh
result (bench/results/<hw>-serve-*.json): per offered request rate, the
achieved and good request rates (goodput: requests meeting the sweep's TTFT and
TPOT objectives), output tokens/s, and TTFT / TPOT at p50 and p99. The rate
'inf' (every request at once) is drawn at the rate it achieved, hollow.
Needs matplotlib (pip install matplotlib)."""
import json
import math
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def points(path):
    d = json.load(open(path))
    rows = []
    for v in d["results"].values():
        r = v.get("data", v)
        offered = r["rate"] if r.get("rate") is not None else math.inf
        rows.append((offered, r))
    rows.sort(key=lambda x: x[0])
    return d, rows


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    d, rows = points(sys.argv[1])
    x = [o if math.isfinite(o) else r["request_throughput"] for o, r in rows]
    hollow = [not math.isfinite(o) for o, _ in rows]
    slo = rows[0][1].get("slo", {"ttft_ms": 1000, "tpot_ms": 50})
    fig, ax = plt.subplots(1, 3, figsize=(15, 4.2))

    def series(a, ys, label, style):
        a.plot(x, ys, style, label=label)
        for xi, yi, h in zip(x, ys, hollow):
            if h:
                a.plot([xi], [yi], "o", mfc="white", mec="black", ms=9)

    series(ax[0], [r["request_throughput"] for _, r in rows], "achieved req/s", "o-")
    series(ax[0], [r.get("goodput", float("nan")) for _, r in rows],
           f"goodput (TTFT <= {slo['ttft_ms']:g} ms, TPOT <= {slo['tpot_ms']:g} ms)", "s--")
    a2 = ax[0].twinx()
    a2.plot(x, [r["output_throughput"] for _, r in rows], "^:", color="gray", label="output tok/s")
    a2.set_ylabel("output tokens/s")
    ax[0].set_ylabel("requests/s")
    ax[0].legend(loc="upper left", fontsize=8)
    for a, key, name in ((ax[1], "ttft_ms", "TTFT"), (ax[2], "tpot_ms", "TPOT")):
        for p, style in (("p50", "o-"), ("p99", "s--")):
            series(a, [r[key][p] for _, r in rows], f"{name} {p}", style)
        a.axhline(slo[key], color="red", lw=0.8, ls=":", label=f"objective {slo[key]:g} ms")
        a.set_ylabel("ms")
        a.set_yscale("log")
        a.legend(fontsize=8)
    for a in ax:
        a.set_xlabel("request rate offered (hollow: all at once, at the rate achieved)")
        a.grid(alpha=0.3)
    fig.suptitle(f"{d.get('what', 'loom serve')}\n{d.get('hardware', '')}, commit {d.get('commit', '?')}",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)


if __name__ == "__main__":
    main()
