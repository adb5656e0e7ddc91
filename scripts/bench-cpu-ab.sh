#!/usr/bin/env bash
# scripts/bench-cpu-ab.sh — the CPU A/B comparisons of docs/performance.md:
# continuous vs static batching, paged vs contiguous KV cache in the same
# memory, prefix caching on vs off on a shared-system-prompt workload.
# Writes bench/results/cpu-ab-*.json. Usage: scripts/bench-cpu-ab.sh [BUILD_DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
B=${1:-$root/build}
L="$B/cli/loom"
R="$root/bench/results"
cd "$root"
mkdir -p "$R"
echo "== continuous vs static (mixed lengths)" >&2
"$L" bench --compare configs/ab/cpu-base.yaml configs/ab/static.yaml \
  --num-requests 48 --input-len 16:160 --output-len 4:96 --seed 1 --json "$R/cpu-ab-continuous-vs-static.json"
echo "== continuous vs static (Poisson arrivals, 4 req/s)" >&2
"$L" bench --compare configs/ab/cpu-base.yaml configs/ab/static.yaml \
  --num-requests 48 --input-len 16:160 --output-len 4:96 --rate 4 --seed 1 \
  --json "$R/cpu-ab-continuous-vs-static-poisson.json"
echo "== paged vs contiguous (same 0.25 GiB KV budget)" >&2
"$L" bench --compare configs/ab/cpu-base.yaml configs/ab/contiguous.yaml \
  --num-requests 48 --input-len 16:96 --output-len 16:64 --seed 2 --json "$R/cpu-ab-paged-vs-contiguous.json"
echo "== prefix caching on vs off (256-token shared system prompt)" >&2
"$L" bench --compare configs/ab/cpu-base.yaml configs/ab/no-prefix-cache.yaml \
  --num-requests 32 --input-len 288:320 --output-len 8 --shared-prefix-ratio 1 --prefix-len 256 \
  --rate 4 --seed 3 --json "$R/cpu-ab-prefix-cache.json"
