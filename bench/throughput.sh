#!/usr/bin/env bash
# bench/throughput.sh [CASE...] — offline throughput in trtllm-bench's shape:
# every request the same input and output length, EOS ignored (loom bench
# always ignores it), all requests queued at once, on the Llama-3-8B shape
# with bf16 weights and with FP8 weights + FP8 KV cache. One JSON table,
# $LOOM_RESULTS/<hw>-throughput-llama3-8b.json (bench/record.py), with
# TensorRT-LLM's published H200 figure (Llama-3.1-8B FP8, its perf-overview
# table) and the ratio beside each FP8 row, and where each case's step time
# went by kind of step (prefill only, mixed, decode only).
#
#   CASE      DTYPE:IN:OUT:REQUESTS, DTYPE bf16, fp8 or a pipeline's .yaml
#             (its name without .yaml labels the row: another weight format,
#             e.g. configs/gpu/llama3-8b-int4-head-tiled.yaml against bf16
#             for the quantized kernels' offline target) (default: both dtypes
#             at 128/128 x 3000, 128/2048 x 512, 1000/1000 x 512 and
#             2048/2048 x 512 — fewer requests than trtllm-bench's 30000 /
#             3000 / 3000 / 1500, so a case fits the GPU machine's minutes,
#             but at least 512: with fewer, a case runs below the
#             concurrency the cache holds (on an H100 FP8
#             128/2048 gave 1.08x at 512 requests against 256); the JSON
#             keeps each case's count)
# Environment:
#   LB          build directory (default build)
#   MAX_SEQS    scheduler.max_num_seqs and backend.max_graph_batch (1024:
#               on one H100 FP8 128/128 x 3000 gave 1.05x and bf16 1.04x
#               the output tok/s of 512 a step, TPOT p50 1.9x; the other
#               cases' 512 requests never fill it)
#   BF16_CONFIG, FP8_CONFIG  the pipelines (configs/gpu/llama3-8b-dummy.yaml,
#               configs/gpu/llama3-8b-fp8.yaml with quantizer.kv_cache=fp8);
#               a CPU smoke run points both at a tiny CPU pipeline and sets
#               NO_GPU_SETS=1 (no cuda backend keys)
#   OUT         raw per-case JSON and logs (default /tmp/out/throughput)
#   RESULT, LABEL  the results file ({hw}-RESULT.json, default
#               throughput-llama3-8b) and the model named in its 'what'
#               (default "Llama-3-8B shape"): a mixture-of-experts run sets
#               BF16_CONFIG=configs/gpu/qwen3-30b-a3b-dummy.yaml,
#               RESULT=throughput-qwen3-30b-a3b and LABEL
#   EXTRA_SETS  more `--set k=v` for every case, e.g. "model.layers=8"
#               (space-separated k=v)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
LB=${LB:-build}
MAX_SEQS=${MAX_SEQS:-1024}
BF16_CONFIG=${BF16_CONFIG:-configs/gpu/llama3-8b-dummy.yaml}
FP8_CONFIG=${FP8_CONFIG:-configs/gpu/llama3-8b-fp8.yaml}
O=${OUT:-/tmp/out}/throughput
export RESULT=${RESULT:-throughput-llama3-8b}
LABEL=${LABEL:-Llama-3-8B shape}
mkdir -p "$O"
cases=("$@")
[ ${#cases[@]} -gt 0 ] || for d in bf16 fp8; do
  cases+=("$d:128:128:3000" "$d:128:2048:512" "$d:1000:1000:512" "$d:2048:2048:512")
done

rows=()
failed=0
for c in "${cases[@]}"; do
  IFS=: read -r dtype in out n <<< "$c"
  case "$dtype" in
    bf16) cfg=$BF16_CONFIG; sets=() ;;
    fp8) cfg=$FP8_CONFIG; sets=(--set quantizer.kv_cache=fp8) ;;
    *.yaml) [ -f "$dtype" ] || { echo "bench/throughput.sh: case '$c': no pipeline $dtype" >&2; exit 2; }
            cfg=$dtype; sets=(); dtype=$(basename "$dtype" .yaml) ;;
    *) echo "bench/throughput.sh: case '$c': dtype must be bf16, fp8 or a pipeline's .yaml" >&2; exit 2 ;;
  esac
  sets+=(--set "scheduler.max_num_seqs=$MAX_SEQS" --set scheduler.max_batched_tokens=8192)
  [ -n "${NO_GPU_SETS:-}" ] || sets+=(--set "backend.max_graph_batch=$MAX_SEQS" --set cache.memory_fraction=0.9)
  for kv in ${EXTRA_SETS:-}; do sets+=(--set "$kv"); done
  name="$dtype-$in-$out"
  echo "=== $name: $n requests, $MAX_SEQS sequences a step ($cfg)"
  if "$LB/cli/loom" bench "$cfg" "${sets[@]}" --num-requests "$n" --input-len "$in" --output-len "$out" \
       --warmup 64 --no-progress --json "$O/$name.json" > "$O/$name.log" 2>&1; then
    grep -E 'output tokens/s|TPOT p50|steps|prefill |mixed |decode |outside' "$O/$name.log" || true
    rows+=("$dtype:$in:$out:$n:$O/$name.json:$c") # the case as given last: it holds colons
  else # the other cases still run and are recorded
    echo "bench/throughput.sh: case $name failed:"; tail -3 "$O/$name.log"; failed=$((failed + 1))
  fi
done

[ ${#rows[@]} -gt 0 ] || { echo "bench/throughput.sh: no case ran"; exit 1; }
python3 - "$O" "$MAX_SEQS" "${rows[@]}" <<'PY'
import json, os, sys
# TensorRT-LLM's perf-overview table, Llama-3.1-8B FP8 on one H200 (output tok/s)
trt = {(128, 128): 27911, (128, 2048): 26221, (1000, 1000): 17744, (2048, 2048): 12194}
out, max_seqs = sys.argv[1], int(sys.argv[2])
print("| dtype | in / out | requests | output tok/s | TensorRT-LLM H200 FP8 | ratio | TPOT p50 ms | prefill / mixed / decode / outside s |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for spec in sys.argv[3:]:
    dtype, i, o, n, f, case = spec.split(":", 5)
    r = json.load(open(f))["a_results"]
    row = {"dtype": dtype, "input_len": int(i), "output_len": int(o), "requests": int(n),
           "max_num_seqs": max_seqs, "output_tok_s": round(r["output_tokens_s_tok_s"], 1),
           "tpot_p50_ms": round(r["TPOT_p50_ms"], 3), "wall_s": round(r["wall_time_s"], 3),
           "outside_steps_s": round(r["wall_time_s"] - r["step_seconds"], 3),
           "preemptions": r.get("preemptions"), "max_sequences_a_step": r.get("max_running"),
           "case": case, "steps_by_kind": r.get("steps_by_kind", {})}
    llama = os.environ["RESULT"] == "throughput-llama3-8b"  # TensorRT-LLM's figure is of that model
    ref = trt.get((int(i), int(o))) if dtype == "fp8" and llama else None
    if ref:
        row["trtllm_h200_fp8_output_tok_s"] = ref
        row["ratio_to_trtllm"] = round(r["output_tokens_s_tok_s"] / ref, 3)
    json.dump(row, open("%s/%s-%s-%s.row.json" % (out, dtype, i, o), "w"), indent=1)
    k = row["steps_by_kind"]
    split = " / ".join("%.1f" % k.get(x, {}).get("seconds", 0) for x in ("prefill", "mixed", "decode"))
    print("| %s | %s / %s | %s | %.0f | %s | %s | %.2f | %s / %.1f |" % (
        dtype, i, o, n, row["output_tok_s"], row.get("trtllm_h200_fp8_output_tok_s", "-"),
        row.get("ratio_to_trtllm", "-"), row["tpot_p50_ms"], split, row["outside_steps_s"]))
PY
# one entry per case (--merge keeps the other cases' entries and their commits),
# the command with the cases of this run
base="bench/throughput.sh"
[ "$MAX_SEQS" = 1024 ] || base="MAX_SEQS=$MAX_SEQS $base"
[ "$RESULT" = throughput-llama3-8b ] || base="RESULT=$RESULT LABEL='$LABEL' BF16_CONFIG=$BF16_CONFIG $base"
[ -z "${EXTRA_SETS:-}" ] || base="EXTRA_SETS='$EXTRA_SETS' $base"
cmd="$base ${cases[*]}"
args=()
for r in "${rows[@]}"; do
  IFS=: read -r dtype in out n _ _ <<< "$r"
  args+=(--json "$dtype-$in-$out=$O/$dtype-$in-$out.row.json")
done
python3 bench/record.py "{hw}-$RESULT" --merge \
  --what "offline throughput, trtllm-bench shape (fixed lengths, EOS ignored, all at once), $LABEL dummy weights, bf16, FP8 weights + FP8 KV or a pipeline named by its file, vs TensorRT-LLM's H200 table (Llama-3.1-8B FP8); one entry per DTYPE-IN-OUT case, measured by '$base DTYPE:IN:OUT:REQUESTS' (each entry: its case and the run's command)" \
  --command "$cmd" "${args[@]}"
[ $failed = 0 ]
