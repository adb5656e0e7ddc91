#!/usr/bin/env bash
# scripts/gpu-check.sh STAGE — end-to-end checks and benchmarks of the cuda
# backend on the GPU machine, through the whole engine (the kernel-level
# tests are tests/gpu/run_on_device.sh). Results go to $OUT.
#   stage1: a tiny random model through the engine; a random-weight
#           Llama-3-8B-shaped checkpoint written by transformers vs its own
#           logprobs; offline throughput (1000 requests) and batch-1 decode
#           on the Llama-3-8B shape.
#   stage2: SmolLM2 (GGUF carried in two parts) greedy ids vs the CPU
#           backend's (tests/e2e/data/smollm2_greedy_cpu.txt), and its
#           batch-1 decode speed.
set -u
. scripts/gpu-env.sh
O=${OUT:-/tmp/out}; mkdir -p "$O"
fails=0
step() { echo; echo "=== $*"; }
case "${1:-}" in
stage1)
  step "device"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee "$O/device.txt"
  step "tiny random model through the engine"
  timeout 120 loom bench configs/gpu/tiny-dummy.yaml --num-requests 16 --input-len 20:60 --output-len 8:24 \
    --no-progress 2>&1 | tail -6 || fails=$((fails + 1))
  step "transformers reference: Llama-3-8B shape, 4 layers, random bf16 weights"
  timeout 240 python3 tests/e2e/hf_llama_reference.py /tmp/hfref --layers 4 --tokens 128 2>&1 | tail -2
  LOOM_HF_REF=/tmp/hfref/model timeout 120 "$LB/tests/e2e/engine_tool" score configs/gpu/hf-reference.yaml \
    /tmp/hfref/tokens.txt > "$O/hf_loom_logprobs.txt" 2> "$O/hf_loom.err" || { tail -3 "$O/hf_loom.err"; }
  cp /tmp/hfref/ref_logprobs.txt "$O/hf_ref_logprobs.txt" 2>/dev/null
  python3 tests/e2e/compare_logprobs.py /tmp/hfref/ref_logprobs.txt "$O/hf_loom_logprobs.txt" | tee "$O/hf_compare.txt" \
    || fails=$((fails + 1))
  rm -rf /tmp/hfref
  step "Llama-3-8B shape (dummy bf16): batch-1 decode, 128-token prompt, 256 new tokens"
  timeout 200 loom bench configs/gpu/llama3-8b-dummy.yaml --num-requests 4 --input-len 128 --output-len 256 \
    --set scheduler.max_num_seqs=1 --no-progress --json "$O/llama3-8b-batch1.json" 2>&1 | grep -E "TPOT p50|output tokens|wall" \
    || fails=$((fails + 1))
  step "Llama-3-8B shape: offline throughput, 1000 requests (~512 in / ~256 out)"
  timeout 300 loom bench configs/gpu/llama3-8b-dummy.yaml --num-requests 1000 --input-len 384:640 \
    --output-len 128:384 --seed 7 --no-progress --json "$O/llama3-8b-offline-1000.json" 2>&1 | tail -18 \
    || fails=$((fails + 1))
  ;;
stage2)
  step "SmolLM2: greedy on cuda vs the CPU backend"
  cat /tmp/smollm2.part.aa .devmodel/smollm2.part.ab > /tmp/smollm2.gguf 2>/dev/null
  sha256sum /tmp/smollm2.gguf | grep -q b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 \
    || { echo "FAIL model checksum"; exit 1; }
  mkdir -p /tmp/lc/models && ln -sf /tmp/smollm2.gguf /tmp/lc/models/SmolLM2-135M-Instruct.Q4_1.gguf
  export LOOM_CACHE=/tmp/lc
  i=0
  while IFS= read -r p; do
    i=$((i + 1))
    ref=$(sed -n "${i}p" tests/e2e/data/smollm2_greedy_cpu.txt)
    got=$(timeout 60 "$LB/tests/e2e/engine_tool" greedy configs/gpu/smollm2.yaml 48 "$p" 2>>"$O/smollm2.err")
    echo "$got" >> "$O/smollm2_greedy_cuda.txt"
    python3 - "$ref" "$got" "$p" <<'PY' || fails=$((fails + 1))
import sys
r, g, p = sys.argv[1].split(), sys.argv[2].split(), sys.argv[3]
k = next((i for i, (a, b) in enumerate(zip(r, g)) if a != b), min(len(r), len(g)))
same = r == g
print(f"{'PASS' if same else 'DIFF'} '{p}': {len(g)} tokens, identical for the first {k} of {len(r)} (CPU)")
sys.exit(0 if same or k >= 16 else 1)
PY
  done < tests/e2e/data/smollm2_prompts.txt
  step "SmolLM2 batch-1 decode through the engine (256 new tokens)"
  timeout 120 loom bench configs/gpu/smollm2.yaml --num-requests 4 --input-len 64 --output-len 256 \
    --set scheduler.max_num_seqs=1 --no-progress --json "$O/smollm2-batch1.json" 2>&1 | grep -E "TPOT p50|output tokens"
  ;;
*) echo "usage: scripts/gpu-check.sh stage1|stage2" >&2; exit 2 ;;
esac
echo; echo "stage ${1}: $fails failed"
exit $fails
