#!/usr/bin/env bash
# tests/serve/serve_load_test.sh LOOM_CLI SOURCE_DIR — bench/serve_load.py
# against `loom serve` on the tiny dummy pipeline: 12 streamed requests
# arriving at 100/s all complete, and the report's numbers hang together
# (TTFT <= latency, output throughput = completed x output-len / wall).
set -euo pipefail
cli=$1 src=$2
cd "$src"
tmp=$(mktemp -d)
trap 'kill $pid 2>/dev/null || true; rm -rf "$tmp"' EXIT
"$cli" serve tests/engine/data/tiny.yaml --port 0 > "$tmp/out" 2> "$tmp/err" &
pid=$!
for _ in $(seq 600); do grep -q listening "$tmp/out" 2>/dev/null && break; sleep 0.1; done
port=$(grep -o '[0-9]*$' "$tmp/out") || { echo "loom serve did not start:"; cat "$tmp/err"; exit 1; }
python3 bench/serve_load.py --url "http://127.0.0.1:$port" --num-requests 12 --rate 100 --input-len 16 \
  --output-len 24 --vocab-lo 1 --vocab-hi 256 --json "$tmp/r.json"
python3 - "$tmp/r.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["completed"] == 12 and r["failed"] == 0, r
assert 0 < r["ttft_ms"]["p50"] <= r["e2e_ms"]["p50"], r
assert r["tpot_ms"]["mean"] > 0, r
assert abs(r["output_throughput"] * r["wall_s"] - 12 * 24) < 1e-6, r
print("serve_load report consistent:", r["completed"], "requests,", round(r["output_throughput"]), "tok/s")
PY
kill -TERM $pid
wait $pid  # loom serve exits 0 on SIGTERM
