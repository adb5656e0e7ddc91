#!/usr/bin/env python3
"""scripts/plot-pd.py OUT.png LABEL=RESULT.json... [--ttft MS --tpot MS] — draw and
tabulate bench/gpu/pd_onegpu runs (colocated vs disaggregated inside one GPU):
per offered request rate, TTFT and TPOT at p50 and p90, and goodput — requests
per second meeting both TTFT <= MS and TPOT <= MS (DistServe's metric; the
objectives default to the ones the runs were made with; per-request times are
in the JSON, so other objectives are recomputed here). The x axis is the
arrival rate the seeded Poisson sample realised (arrived_per_s), else the offered one. Prints a Markdown table
and, per run, DistServe's per-GPU goodput: the highest measured rate at which
at least 90% of the requests meet both objectives. A RESULT.json may also be a
bench/record.py file holding pd_onegpu JSONs, FILE.json:KEY naming the entry
(bench/results/h200-pd-onegpu-llama3-8b.json:colocated).
Needs matplotlib for the plot (OUT.png '-' prints the table only)."""
import json
import math
import sys


def pct(v, p):
    v = sorted(v)
    if not v:
        return math.nan
    k = p / 100 * (len(v) - 1)
    i = int(k)
    return v[i] + (k - i) * (v[i + 1] - v[i]) if i + 1 < len(v) else v[-1]


def load(path):
    key = None
    if ".json:" in path:  # a bench/record.py file and the entry to read
        path, key = path.split(".json:", 1)
        path += ".json"
    text = open(path).read()
    try:
        d = json.loads(text)
    except json.JSONDecodeError:  # a run cut short: the rates it finished
        d = json.loads(text.rstrip().rstrip(",") + "\n]}")
    if "runs" in d:
        return d
    # a bench/record.py file: the entry named, else its first pd_onegpu JSON
    for k, v in d.get("results", {}).items():
        if key is not None and k != key:
            continue
        r = v.get("data", v)
        if isinstance(r, dict) and "runs" in r:
            return r
    sys.exit(f"plot-pd: {path} holds no pd_onegpu runs")


def rows(d, ttft, tpot):
    out = []
    for r in d["runs"]:
        rate = math.inf if r["rate"] == "inf" else r["rate"]
        ok = sum(1 for a, b in zip(r["ttft_ms"], r["tpot_ms"]) if a <= ttft and b <= tpot)
        arrived = r.get("arrived_per_s") or rate
        out.append(dict(rate=rate, arrived=arrived, seconds=r["seconds"], n=r["requests"], achieved=r["req_per_s"],
                        goodput=ok / r["seconds"], attain=ok / r["requests"],
                        ttft50=pct(r["ttft_ms"], 50), ttft90=pct(r["ttft_ms"], 90),
                        tpot50=pct(r["tpot_ms"], 50), tpot90=pct(r["tpot_ms"], 90),
                        kv_ms=r.get("kv_ms_mean", 0), kv_mb=r.get("kv_mb_mean", 0)))
    return sorted(out, key=lambda x: x["rate"])


def main():
    args = sys.argv[1:]
    ttft = tpot = None
    if "--ttft" in args:
        i = args.index("--ttft")
        ttft = float(args[i + 1])
        del args[i:i + 2]
    if "--tpot" in args:
        i = args.index("--tpot")
        tpot = float(args[i + 1])
        del args[i:i + 2]
    if len(args) < 2 or any("=" not in a for a in args[1:]):
        sys.exit(__doc__)
    out, runs = args[0], []
    for a in args[1:]:
        label, path = a.split("=", 1)
        d = load(path)
        t1 = ttft if ttft is not None else d["ttft_slo_ms"]
        t2 = tpot if tpot is not None else d["tpot_slo_ms"]
        runs.append((label, rows(d, t1, t2), t1, t2))
    t1, t2 = runs[0][2], runs[0][3]
    print(f"objectives: TTFT <= {t1:g} ms, TPOT <= {t2:g} ms\n")
    print("| run | offered req/s | arrived req/s | achieved | goodput req/s | within both | TTFT p50 / p90 ms "
          "| TPOT p50 / p90 ms |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for label, rs, _, _ in runs:
        for r in rs:
            print(f"| {label} | {r['rate']:g} | {r['arrived']:.2f} | {r['achieved']:.2f} | {r['goodput']:.2f} | {100 * r['attain']:.0f}% | "
                  f"{r['ttft50']:.0f} / {r['ttft90']:.0f} | {r['tpot50']:.1f} / {r['tpot90']:.1f} |")
    print()
    for label, rs, _, _ in runs:
        ok = [r["arrived"] for r in rs if r["attain"] >= 0.9 and math.isfinite(r["arrived"])]
        best = max((r["goodput"] for r in rs), default=0)
        print(f"{label}: highest arrival rate with >= 90% within both: {max(ok) if ok else 0:.2f} req/s; "
              f"best goodput {best:.2f} req/s" +
              (f"; KV hand-over {rs[0]['kv_ms']:.1f} ms / {rs[0]['kv_mb']:.0f} MB a request" if rs[0]["kv_mb"] else ""))
    if out == "-":
        return
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(1, 3, figsize=(15, 4.2))
    for label, rs, _, _ in runs:
        rs = sorted(rs, key=lambda r: r["arrived"])
        x = [r["arrived"] for r in rs]
        ax[0].plot(x, [r["goodput"] for r in rs], "o-", label=label)
        p = ax[1].plot(x, [r["ttft90"] for r in rs], "o-", label=f"{label} p90")
        ax[1].plot(x, [r["ttft50"] for r in rs], "s--", color=p[0].get_color(), alpha=0.6, label=f"{label} p50")
        p = ax[2].plot(x, [r["tpot90"] for r in rs], "o-", label=f"{label} p90")
        ax[2].plot(x, [r["tpot50"] for r in rs], "s--", color=p[0].get_color(), alpha=0.6, label=f"{label} p50")
    ax[0].set_title(f"goodput (TTFT <= {t1:g} ms, TPOT <= {t2:g} ms)")
    ax[0].set_ylabel("requests/s")
    ax[1].set_title("time to first token")
    ax[1].set_ylabel("ms")
    ax[1].axhline(t1, color="grey", lw=0.8, ls=":")
    ax[1].set_yscale("log")
    ax[2].set_title("time per output token")
    ax[2].set_ylabel("ms")
    ax[2].axhline(t2, color="grey", lw=0.8, ls=":")
    for a in ax:
        a.set_xlabel("arrival rate, requests/s (Poisson, as realised)")
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
