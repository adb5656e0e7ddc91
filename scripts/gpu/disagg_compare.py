#!/usr/bin/env python3
"""scripts/gpu/disagg_compare.py — send one set of greedy requests (token-id
prompts, so dummy weights work) to a disaggregated decode server and to a
colocated server and check that the answers agree: same text, same tokens,
logprobs within --tol. Used by scripts/gpu/disagg-ipc-check.sh.

  disagg_compare.py --decode PORT --colo PORT [--prefill PORT] [--label NAME]
                    [--lens 2,3,17,...] [--max-tokens N] [--concurrency C]
                    [--vocab V] [--tol T] [--json OUT]

The prompts: one per --lens entry (random ids below --vocab, seeded), sent
--concurrency at a time to the decode server and then to the colocated one,
plus a seeded sample (temperature 0.9). With --prefill the prefill server's
/metrics are read too: hand-over counts and times, blocks left in use.
Exit status 0 when every answer agrees and no block is left in use.
"""
import argparse
import concurrent.futures as cf
import json
import random
import re
import sys
import time
import urllib.error
import urllib.request


def post(port, path, body, timeout=120):
    data = json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data,
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    except (urllib.error.URLError, OSError) as e:
        return 0, {"error": {"message": f"connection failed: {e}"}}, time.perf_counter() - t0
    dt = time.perf_counter() - t0
    try:
        return status, json.loads(raw), dt
    except ValueError:
        return status, {"error": {"message": raw[:300].decode("utf-8", "replace")}}, dt


def metrics(port):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
    except (urllib.error.URLError, OSError):
        return {}
    out = {}
    for line in text.splitlines():
        m = re.match(r"^(loom_[a-z_]+) ([0-9.eE+-]+)$", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def wait_idle(port, seconds=30):
    """blocks in use back at 0 (and nothing waiting for KV) within seconds"""
    m = {}
    for _ in range(int(seconds * 10)):
        m = metrics(port)
        if m.get("loom_kv_blocks_used", 1) == 0 and m.get("loom_kv_waiting", 0) == 0 \
                and m.get("loom_requests_running", 0) == 0:
            return True, m
        time.sleep(0.1)
    return False, m


def answer(js):
    ch = (js.get("choices") or [{}])[0]
    lp = ch.get("logprobs") or {}
    return ch.get("text"), lp.get("tokens") or [], lp.get("token_logprobs") or [], lp.get("top_logprobs") or []


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--decode", type=int, required=True)
    ap.add_argument("--colo", type=int, required=True)
    ap.add_argument("--prefill", type=int)
    ap.add_argument("--label", default="disagg")
    ap.add_argument("--lens", default="2,3,15,16,17,31,33,64,100,255,257,511,600,1000,1500,2000")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=49000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tol", type=float, default=2e-3)
    ap.add_argument("--timing-lens", default="256,1024,2000",
                    help="after the comparison, 4 requests of each length one at a time: hand-over times alone")
    ap.add_argument("--device-to-device", action="store_true",
                    help="fail unless both servers staged 0 KV bytes in host memory (cuda-ipc, cuda backends)")
    ap.add_argument("--json")
    a = ap.parse_args()

    rng = random.Random(a.seed)
    lens = [int(x) for x in a.lens.split(",") if x]
    bodies = [{"prompt": [rng.randrange(1, a.vocab) for _ in range(n)], "max_tokens": a.max_tokens,
               "temperature": 0, "logprobs": 2} for n in lens]
    bodies.append({"prompt": [rng.randrange(1, a.vocab) for _ in range(40)], "max_tokens": a.max_tokens,
                   "temperature": 0.9, "seed": 7, "logprobs": 1})
    lens.append(40)

    def run_all(port):
        with cf.ThreadPoolExecutor(a.concurrency) as ex:
            return list(ex.map(lambda b: post(port, "/v1/completions", b), bodies))

    t0 = time.perf_counter()
    dres = run_all(a.decode)
    t_dec = time.perf_counter() - t0
    t0 = time.perf_counter()
    cres = run_all(a.colo)
    t_colo = time.perf_counter() - t0

    fails, rows, max_diff = [], [], 0.0
    for i, (n, (ds, dj, dt), (cs, cj, ct)) in enumerate(zip(lens, dres, cres)):
        row = {"prompt_tokens": n, "decode_status": ds, "colo_status": cs,
               "decode_s": round(dt, 4), "colo_s": round(ct, 4)}
        if ds != 200 or cs != 200:
            fails.append(f"request {i} ({n} tokens): HTTP {ds} disaggregated "
                         f"({(dj.get('error') or {}).get('message')}), {cs} colocated "
                         f"({(cj.get('error') or {}).get('message')})")
            rows.append(row)
            continue
        dtext, dtok, dlp, dtop = answer(dj)
        ctext, ctok, clp, ctop = answer(cj)
        diff = max((abs(x - y) for x, y in zip(dlp, clp) if x is not None and y is not None), default=0.0)
        max_diff = max(max_diff, diff)
        row.update({"same_text": dtext == ctext, "same_tokens": dtok == ctok, "max_logprob_diff": diff,
                    "completion_tokens": (dj.get("usage") or {}).get("completion_tokens")})
        if dtext != ctext or dtok != ctok:
            fails.append(f"request {i} ({n} tokens): text differs: disaggregated {dtext!r}, colocated {ctext!r}")
        elif len(dlp) != len(clp) or diff > a.tol:
            fails.append(f"request {i} ({n} tokens): logprobs differ by {diff:g} (> {a.tol:g}) "
                         f"or in count ({len(dlp)} vs {len(clp)})")
        rows.append(row)

    # the concurrent pass's hand-overs (all answered, so all counted)
    mp_c = metrics(a.prefill) if a.prefill else {}
    md_c = metrics(a.decode)
    # one at a time: each hand-over alone (no other prefill on the GPU), timed by /metrics deltas
    timing = []
    if a.prefill and a.timing_lens:
        for n in [int(x) for x in a.timing_lens.split(",") if x]:
            p0, d0 = metrics(a.prefill), metrics(a.decode)
            reps = 4
            for _ in range(reps):
                post(a.decode, "/v1/completions", {"prompt": [rng.randrange(1, a.vocab) for _ in range(n)],
                                                   "max_tokens": 1, "temperature": 0})
            p1, d1 = metrics(a.prefill), metrics(a.decode)
            k = p1.get("loom_kv_transfers_total", 0) - p0.get("loom_kv_transfers_total", 0)
            by = d1.get("loom_kv_transfer_bytes_total", 0) - d0.get("loom_kv_transfer_bytes_total", 0)
            sd = p1.get("loom_kv_send_seconds_total", 0) - p0.get("loom_kv_send_seconds_total", 0)
            dd = d1.get("loom_kv_deliver_seconds_total", 0) - d0.get("loom_kv_deliver_seconds_total", 0)
            if k:
                timing.append({"prompt_tokens": n, "handovers": k, "mb_per_handover": round(by / k / 1e6, 3),
                               "send_ms": round(1e3 * sd / k, 3), "deliver_ms": round(1e3 * dd / k, 3),
                               "send_gb_per_s": round(by / sd / 1e9, 2) if sd else None})

    ok_d, md = wait_idle(a.decode)
    ok_p, mp = wait_idle(a.prefill) if a.prefill else (True, {})
    if not ok_d:
        fails.append(f"decode server: blocks still in use ({md.get('loom_kv_blocks_used')}) or requests waiting")
    if not ok_p:
        fails.append(f"prefill server: blocks still in use ({mp.get('loom_kv_blocks_used')})")
    n_xfer = mp_c.get("loom_kv_transfers_total", 0)
    n_recv = md_c.get("loom_kv_transfers_total", 0)
    summary = {
        "label": a.label,
        "requests": len(bodies),
        "matched": sum(1 for r in rows if r.get("same_tokens") and r.get("same_text")
                       and r.get("max_logprob_diff", 1) <= a.tol),
        "failures": fails,
        "max_logprob_diff": max_diff,
        "tol": a.tol,
        "wall_s_decode": round(t_dec, 3),
        "wall_s_colo": round(t_colo, 3),
        "handovers_prefill": n_xfer,
        "handovers_decode": n_recv,
        "handover_bytes": md_c.get("loom_kv_transfer_bytes_total"),
        "host_staged_bytes_prefill": mp_c.get("loom_kv_host_staged_bytes_total"),
        "host_staged_bytes_decode": md_c.get("loom_kv_host_staged_bytes_total"),
        "transfer_failures_decode": md.get("loom_kv_transfer_failures_total"),
        "send_ms_per_handover": round(1e3 * mp_c.get("loom_kv_send_seconds_total", 0) / n_xfer, 3) if n_xfer else None,
        "deliver_ms_per_handover": round(1e3 * md_c.get("loom_kv_deliver_seconds_total", 0) / n_recv, 3)
        if n_recv else None,
        "exported_blocks": mp.get("loom_kv_exported_blocks_total"),
        "imported_blocks": md.get("loom_kv_imported_blocks_total"),
        "timing_sequential": timing,
        "rows": rows,
    }
    if a.prefill and n_recv and mp.get("loom_kv_exported_blocks_total") != md.get("loom_kv_imported_blocks_total"):
        fails.append("exported and imported block counts differ")
    # --device-to-device (cuda-ipc between cuda backends): no block image byte through host memory
    if a.device_to_device and a.prefill:
        for side, m in (("prefill", mp_c), ("decode", md_c)):
            if m.get("loom_kv_host_staged_bytes_total", -1) != 0:
                fails.append(f"{side} server staged {m.get('loom_kv_host_staged_bytes_total')} bytes in host memory "
                             f"(want 0 device to device)")
    # a hand-over per request with >= 2 prompt tokens (the 1-token prompts run colocated)
    want = sum(1 for n in lens if n >= 2)
    if a.prefill and n_recv < want:
        fails.append(f"only {n_recv:g} hand-overs for {want} requests with >= 2 prompt tokens")
    summary["ok"] = not fails
    print(json.dumps({k: v for k, v in summary.items() if k != "rows"}, indent=1))
    for r in rows:
        print("  ", json.dumps(r))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=1)
    return 0 if not fails else 1


if __name__ == "__main__":
    sys.exit(main())
