#!/usr/bin/env bash
# scripts/bench-cpu-ab.sh — the CPU A/B comparisons of docs/performance.md:
# continuous vs static batching, paged vs contiguous KV cache in the same
# memory, prefix caching on vs off on a shared-system-prompt workload.
# Writes the current figures bench/results/cpu-ab-*.json (bench/record.py;
# $LOOM_RESULTS moves them). Usage: scripts/bench-cpu-ab.sh [BUILD_DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
B=${1:-$root/build}
L="$B/cli/loom"
R=$(mktemp -d)
trap 'rm -rf "$R"' EXIT
cd "$root"
rec() { # NAME WHAT: the compare just written to $R/NAME.json
  python3 bench/record.py "$1" --cpu --what "$2" --command "scripts/bench-cpu-ab.sh" --bench "compare=$R/$1.json"
}
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
rec cpu-ab-continuous-vs-static "SmolLM2 on the cpu backend, 48 requests all at once: continuous (a) vs static (b) batching"
rec cpu-ab-continuous-vs-static-poisson "SmolLM2 on the cpu backend, 48 requests at 4 req/s (Poisson): continuous (a) vs static (b) batching"
rec cpu-ab-paged-vs-contiguous "SmolLM2 on the cpu backend, 48 requests: paged (a) vs contiguous (b) KV cache in the same 0.25 GiB"
rec cpu-ab-prefix-cache "SmolLM2 on the cpu backend, 32 requests sharing a 256-token prefix at 4 req/s: prefix caching on (a) vs off (b)"
