#!/usr/bin/env bash
# scripts/bench-cpu-ab.sh — the CPU A/B comparisons of docs/performance.md:
# continuous vs static batching, paged vs contiguous KV cache in the same
# memory, prefix caching on vs off on a shared-system-prompt workload, the
# KV cache in f32 vs f16 at batch-1 decode and long contexts.
# Writes the current figures bench/results/cpu-ab-*.json (bench/record.py;
# $LOOM_RESULTS moves them).
# Usage: scripts/bench-cpu-ab.sh [BUILD_DIR] [PAIR...]
#   PAIR: static, static-poisson, contiguous, prefix, kv, kv-ppl (default: all)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
B=$root/build
if [ $# -gt 0 ] && [ -d "$1" ]; then B=$1; shift; fi
pairs=${*:-static static-poisson contiguous prefix kv kv-ppl}
L="$B/cli/loom"
R=$(mktemp -d)
trap 'rm -rf "$R"' EXIT
cd "$root"
rec() { # NAME WHAT KEY...: the compares just written to $R/NAME-KEY.json
  local name=$1 what=$2 args=() k
  shift 2
  for k in "$@"; do args+=(--bench "$k=$R/$name-$k.json"); done
  python3 bench/record.py "$name" --cpu --what "$what" --command "scripts/bench-cpu-ab.sh $pairs" "${args[@]}"
}
for p in $pairs; do
  case $p in
  static)
    echo "== continuous vs static (mixed lengths)" >&2
    "$L" bench --compare configs/ab/cpu-base.yaml configs/ab/static.yaml \
      --num-requests 48 --input-len 16:160 --output-len 4:96 --seed 1 --json "$R/cpu-ab-continuous-vs-static-compare.json"
    rec cpu-ab-continuous-vs-static "SmolLM2 on the cpu backend, 48 requests all at once: continuous (a) vs static (b) batching" compare
    ;;
  static-poisson)
    echo "== continuous vs static (Poisson arrivals, 4 req/s)" >&2
    "$L" bench --compare configs/ab/cpu-base.yaml configs/ab/static.yaml \
      --num-requests 48 --input-len 16:160 --output-len 4:96 --rate 4 --seed 1 \
      --json "$R/cpu-ab-continuous-vs-static-poisson-compare.json"
    rec cpu-ab-continuous-vs-static-poisson "SmolLM2 on the cpu backend, 48 requests at 4 req/s (Poisson): continuous (a) vs static (b) batching" compare
    ;;
  contiguous)
    echo "== paged vs contiguous (same 0.25 GiB KV budget)" >&2
    "$L" bench --compare configs/ab/cpu-base.yaml configs/ab/contiguous.yaml \
      --num-requests 48 --input-len 16:96 --output-len 16:64 --seed 2 --json "$R/cpu-ab-paged-vs-contiguous-compare.json"
    rec cpu-ab-paged-vs-contiguous "SmolLM2 on the cpu backend, 48 requests: paged (a) vs contiguous (b) KV cache in the same 0.25 GiB" compare
    ;;
  prefix)
    echo "== prefix caching on vs off (256-token shared system prompt)" >&2
    "$L" bench --compare configs/ab/cpu-base.yaml configs/ab/no-prefix-cache.yaml \
      --num-requests 32 --input-len 288:320 --output-len 8 --shared-prefix-ratio 1 --prefix-len 256 \
      --rate 4 --seed 3 --json "$R/cpu-ab-prefix-cache-compare.json"
    rec cpu-ab-prefix-cache "SmolLM2 on the cpu backend, 32 requests sharing a 256-token prefix at 4 req/s: prefix caching on (a) vs off (b)" compare
    ;;
  kv)
    for ctx in 500 3000 7000; do
      echo "== KV cache f32 vs f16: one request, $ctx prompt tokens, 64 new" >&2
      "$L" bench --compare configs/ab/cpu-base.yaml configs/ab/cpu-kv-f16.yaml \
        --num-requests 1 --input-len $ctx --output-len 64 --repeat 3 --seed 4 \
        --set engine.max_model_len=8192 --set cache.memory_gib=1 --set scheduler.max_batched_tokens=2048 \
        --json "$R/cpu-ab-kv-f32-vs-f16-ctx$ctx.json"
    done
    rec cpu-ab-kv-f32-vs-f16 "SmolLM2 on the cpu backend, batch-1 decode after a 500 / 3000 / 7000-token prompt (64 new tokens, 3 interleaved runs a side, medians): KV cache f32 (a) vs f16 (b)" ctx500 ctx3000 ctx7000
    ;;
  kv-ppl)
    echo "== KV cache f32 vs f16: SmolLM2 perplexity on data/text/us-founding-documents.txt" >&2
    for kv in f32 f16; do
      "$L" perplexity configs/default.yaml data/text/us-founding-documents.txt --set backend.kv_dtype=$kv \
        | grep -E "^perplexity:" > "$R/ppl-$kv.txt"
    done
    python3 bench/record.py cpu-ab-kv-f32-vs-f16 --merge --cpu --command "scripts/bench-cpu-ab.sh $pairs" \
      --what "SmolLM2 on the cpu backend, KV cache f32 (a) vs f16 (b): batch-1 decode after a 500 / 3000 / 7000-token prompt (64 new tokens, 3 interleaved runs a side, medians); perplexity on data/text/us-founding-documents.txt" \
      --text perplexity_f32="$R/ppl-f32.txt" --text perplexity_f16="$R/ppl-f16.txt"
    ;;
  *) echo "bench-cpu-ab.sh: unknown pair '$p' (static, static-poisson, contiguous, prefix, kv, kv-ppl)" >&2; exit 2 ;;
  esac
done
