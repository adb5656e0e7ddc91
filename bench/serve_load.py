#!/usr/bin/env python3
"""bench/serve_load.py — online-serving benchmark against `loom serve` (or any
OpenAI-compatible server): requests arrive as a Poisson process at --rate per
second (or all at once), each streamed, and the script reports what a user
of the server sees — time to first token (TTFT), time per output token
(TPOT), end-to-end latency (percentiles) and throughput — like vLLM's
benchmark_serving.py. Python standard library only, so it runs anywhere
python3 does (the GPU machine included).

Prompts are token ids (the /v1/completions token form) of --input-len random
ids, generating exactly --output-len tokens each (ignore_eos), so two servers
or two pipelines see the same work; --text sends words instead, for servers
whose models have no token ids in common.

  loom serve configs/default.yaml --port 8000 &
  python3 bench/serve_load.py --url http://127.0.0.1:8000 --num-requests 64 --rate 4 \\
      --input-len 128 --output-len 64 --json out.json
"""
import argparse
import http.client
import json
import math
import random
import sys
import threading
import time
import urllib.parse


def percentile(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def one_request(url, body, headers, timeout):
    """POST a streamed completion; returns (ttft, e2e, completion_tokens, error)."""
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=timeout)
    t0 = time.perf_counter()
    ttft = None
    tokens = None
    try:
        conn.request("POST", "/v1/completions", body=json.dumps(body), headers=headers)
        resp = conn.getresponse()
        if resp.status != 200:
            return None, None, 0, f"HTTP {resp.status}: {resp.read()[:300].decode(errors='replace')}"
        for raw in resp:
            line = raw.strip()
            if not line.startswith(b"data: "):
                continue
            data = line[6:]
            if data == b"[DONE]":
                break
            ev = json.loads(data)
            if "error" in ev:
                return None, None, 0, ev["error"].get("message", "error")
            if ev.get("choices") and ttft is None:
                ttft = time.perf_counter() - t0
            if ev.get("usage"):
                tokens = ev["usage"]["completion_tokens"]
        e2e = time.perf_counter() - t0
        if tokens is None:
            return None, None, 0, "the stream ended without a usage chunk"
        return ttft, e2e, tokens, None
    except (OSError, http.client.HTTPException, ValueError) as e:
        return None, None, 0, f"{type(e).__name__}: {e}"
    finally:
        conn.close()


def main():
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--url", default="http://127.0.0.1:8000", help="server base URL (default %(default)s)")
    ap.add_argument("--num-requests", type=int, default=64, help="requests to send (default %(default)s)")
    ap.add_argument("--rate", type=float, default=math.inf,
                    help="mean arrivals per second, Poisson; inf = all at once (default)")
    ap.add_argument("--max-concurrency", type=int, default=0, help="requests in flight at most (0 = no limit)")
    ap.add_argument("--input-len", type=int, default=128, help="prompt tokens (default %(default)s)")
    ap.add_argument("--output-len", type=int, default=64, help="generated tokens (default %(default)s)")
    ap.add_argument("--vocab-lo", type=int, default=1000, help="random prompt ids from [lo, hi) (default 1000)")
    ap.add_argument("--vocab-hi", type=int, default=30000, help="(default 30000: inside Llama / Qwen / SmolLM vocabularies)")
    ap.add_argument("--text", action="store_true", help="send random words instead of token ids")
    ap.add_argument("--temperature", type=float, default=0.0, help="(default 0: greedy)")
    ap.add_argument("--seed", type=int, default=0, help="prompts and arrival times (default 0)")
    ap.add_argument("--model", default=None, help="the 'model' field (default: what GET /v1/models lists)")
    ap.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer KEY'")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per request (default %(default)s)")
    ap.add_argument("--slo-ttft-ms", type=float, default=1000.0,
                    help="goodput: a request counts when its TTFT is at most this (default %(default)s)")
    ap.add_argument("--slo-tpot-ms", type=float, default=50.0,
                    help="... and its TPOT at most this (default %(default)s)")
    ap.add_argument("--json", metavar="FILE", help="write the results as JSON")
    ap.add_argument("--no-progress", action="store_true", help="no progress line on stderr (shown on a terminal)")
    a = ap.parse_args()
    if a.num_requests < 1 or a.input_len < 1 or a.output_len < 1 or not (a.rate > 0):
        ap.error("--num-requests, --input-len, --output-len and --rate must be positive")

    headers = {"Content-Type": "application/json"}
    if a.api_key:
        headers["Authorization"] = f"Bearer {a.api_key}"
    u = urllib.parse.urlparse(a.url)
    model = a.model
    try:
        c = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=30)
        c.request("GET", "/v1/models", headers=headers)
        r = c.getresponse()
        listing = json.loads(r.read())
        if r.status != 200:
            sys.exit(f"serve_load: GET /v1/models: HTTP {r.status}: {listing}")
        model = model or listing["data"][0]["id"]
        max_len = listing["data"][0].get("max_model_len")
    except (OSError, ValueError, KeyError, IndexError) as e:
        sys.exit(f"serve_load: cannot reach {a.url} ({e}): is `loom serve` running there?")
    if max_len and a.input_len + a.output_len > max_len:
        sys.exit(f"serve_load: --input-len {a.input_len} + --output-len {a.output_len} exceeds the "
                 f"model's context {max_len}")

    rng = random.Random(a.seed)
    words = ["the", "of", "and", "a", "to", "in", "is", "you", "that", "it", "he", "was", "for", "on", "are",
             "as", "with", "his", "they", "at", "be", "this", "have", "from", "or", "one", "had", "by", "word"]
    bodies = []
    for _ in range(a.num_requests):
        prompt = (" ".join(rng.choice(words) for _ in range(a.input_len)) if a.text
                  else [rng.randrange(a.vocab_lo, a.vocab_hi) for _ in range(a.input_len)])
        bodies.append({"model": model, "prompt": prompt, "max_tokens": a.output_len, "ignore_eos": True,
                       "temperature": a.temperature, "stream": True,
                       "stream_options": {"include_usage": True}})
    gaps = [0.0 if math.isinf(a.rate) else rng.expovariate(a.rate) for _ in range(a.num_requests)]

    results = [None] * a.num_requests
    done = [0]
    lock = threading.Lock()
    sem = threading.Semaphore(a.max_concurrency) if a.max_concurrency > 0 else None

    def worker(i):
        try:
            results[i] = one_request(a.url, bodies[i], headers, a.timeout)
        finally:
            if sem:
                sem.release()
            with lock:
                done[0] += 1
                if progress:
                    print(f"\rserve_load: {done[0]}/{a.num_requests} done", end="", file=sys.stderr, flush=True)

    progress = not a.no_progress and sys.stderr.isatty()
    t_start = time.perf_counter()
    threads = []
    for i in range(a.num_requests):
        time.sleep(gaps[i])
        if sem:
            sem.acquire()
        t = threading.Thread(target=worker, args=(i,), daemon=True)
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    wall = time.perf_counter() - t_start
    if progress:
        print(file=sys.stderr)

    ok = [r for r in results if r and r[3] is None]
    errors = [r[3] for r in results if r and r[3] is not None]
    ttft = [r[0] for r in ok if r[0] is not None]
    e2e = [r[1] for r in ok]
    tpot = [(r[1] - r[0]) / (r[2] - 1) for r in ok if r[0] is not None and r[2] > 1]
    out_tokens = sum(r[2] for r in ok)
    # goodput (DistServe): requests per second that met both latency objectives
    good = sum(1 for r in ok if r[0] is not None and r[0] <= a.slo_ttft_ms / 1e3 and
               (r[2] <= 1 or (r[1] - r[0]) / (r[2] - 1) <= a.slo_tpot_ms / 1e3))
    res = {
        "url": a.url, "model": model, "num_requests": a.num_requests, "completed": len(ok), "failed": len(errors),
        "rate": None if math.isinf(a.rate) else a.rate, "max_concurrency": a.max_concurrency or None,
        "input_len": a.input_len, "output_len": a.output_len, "prompt_form": "text" if a.text else "token ids",
        "wall_s": wall, "request_throughput": len(ok) / wall, "output_throughput": out_tokens / wall,
        "input_throughput": len(ok) * a.input_len / wall,
        "goodput": good / wall, "good_requests": good,
        "slo": {"ttft_ms": a.slo_ttft_ms, "tpot_ms": a.slo_tpot_ms},
    }
    for name, xs in (("ttft_ms", ttft), ("tpot_ms", tpot), ("e2e_ms", e2e)):
        res[name] = {"mean": 1e3 * sum(xs) / len(xs) if xs else float("nan"),
                     **{f"p{p}": 1e3 * percentile(xs, p) for p in (50, 90, 99)}}
    if errors:
        res["first_error"] = errors[0]

    print(f"requests        {len(ok)}/{a.num_requests} completed in {wall:.2f} s"
          + (f" ({len(errors)} failed: {errors[0]})" if errors else ""))
    print(f"throughput      {res['request_throughput']:.2f} req/s, {res['output_throughput']:.1f} output tok/s, "
          f"{res['input_throughput']:.1f} input tok/s")
    print(f"goodput         {res['goodput']:.2f} req/s ({good} requests met TTFT <= {a.slo_ttft_ms:g} ms and "
          f"TPOT <= {a.slo_tpot_ms:g} ms)")
    for name, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("e2e_ms", "latency")):
        m = res[name]
        print(f"{label:<15} mean {m['mean']:.1f} ms, p50 {m['p50']:.1f}, p90 {m['p90']:.1f}, p99 {m['p99']:.1f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=2)
            f.write("\n")
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
