#!/usr/bin/env bash
# scripts/gpu/gpu-check.sh STAGE — end-to-end checks and benchmarks of the cuda
# backend on the GPU machine, through the whole engine (the kernel-level
# tests are scripts/gpu/run_on_device.sh). Each stage writes the current
# figure of what it measures to $LOOM_RESULTS/<hw>-<thing>.json (default
# bench/results; bench/record.py, bench/results/README.md), overwriting the
# last one; its raw logs and per-run JSON go to $OUT (default /tmp/out).
# On the device machine: LOOM_RESULTS=$OUT/results, then copy what comes
# back into bench/results/ and commit it.
#   stage1: a tiny random model through the engine; a random-weight
#           Llama-3-8B-shaped checkpoint written by transformers vs its own
#           logprobs; offline throughput (1000 requests) and batch-1 decode
#           on the Llama-3-8B shape.
#   stage2: SmolLM2 (GGUF carried in two parts) greedy ids vs the CPU
#           backend's (tests/e2e/data/smollm2_greedy_cpu.txt), its batch-1
#           decode speed, the same two with the GGUF q4_1 blocks kept as
#           stored on the GPU (configs/gpu/smollm2-gguf-native.yaml), every
#           scheduler/cache pipeline with backend cuda (configs/gpu/ab/),
#           and speculation on/off (configs/gpu/spec-*), greedy ids also
#           with backend.batch_invariant=true.
#   invariant: only the spec-vs-plain greedy comparison with
#           backend.batch_invariant=true (graphs on and off), the ordinary
#           mode for contrast, and the mode's batch-1 cost (needs SmolLM2).
#   quant:  each quantizer scheme vs bf16 on the Llama-3-8B shape, each a
#           `loom bench --compare`: batch-1 decode, batch-64 decode,
#           2048-token prefill (QUANT_SCHEMES / QUANT_RUNS narrow it;
#           QUANT_RUNS may name b16 / b256, batch-16 / batch-256 decode, and
#           sweep: b1, b16, b64 and b256 as the levels of one closed-loop
#           `loom bench --concurrency` on one load of each pipeline, recorded
#           under the same names; the SmolLM2 perplexities are the ppl stage).
#   offline: the 1000-request offline run at 256 and 512 sequences a step.
#   spec2:  draft-model speculation (SmolLM2 drafted by its int4 self) and
#           the cost side of ngram on the Llama-3-8B shape (needs SmolLM2).
#   tp:     tensor parallel size 2 vs 1 on the Llama-3-8B shape (two GPUs):
#           per-token logprobs, greedy ids, batch-1 and offline speed.
#   profile: SmolLM2 batch-1 decode per-kernel GPU time (ncu) against the
#           step's wall time, graphs on and off (needs SmolLM2).
#   qprofile: batch-1 decode of the Llama-3-8B shape cut to 8 layers with
#           its LM head, bf16 and each of QPROFILE_SCHEMES (default
#           int4-head-tiled int8-w8a16-head-tiled): each kernel's GPU time in
#           a step and the DRAM bytes it reads (ncu, warm caches, graphs off:
#           kernels unchanged, one launch each, serialized), a line per
#           kernel and grid; then each pipeline's step wall time unprofiled.
#   tiled:  the tiled W8A16 / INT4 layout: its kernel tests (every path),
#           one Llama-3-8B layer's linears per format and row count
#           (gpu_bench --quant: *_tiled, *_tiled_cpa / _tma / _wide / _mma;
#           chained at M <= 8), and INT4 with its LM head, row-major vs
#           tiled, batch-1 decode on the Llama-3-8B shape cut to 8 layers
#           (quantizing the whole shape twice takes ~4.5 minutes). Its
#           limits add up to 530 s, one device call.
#   layout: the whole Llama-3-8B shape with its LM head quantized, batch-1
#           decode, quant_layout rows vs tiled, INT4 then W8A16
#           (LAYOUT_SCHEMES narrows it; INT4's pair took ~250 s on an H100,
#           both loads quantizing the shape on the host, W8A16's ~110 s with
#           LAYOUT_REPEAT=2: limits of 290 s a scheme, one call together).
#   ep:     expert parallelism and tensor parallelism on one GPU: the MoE
#           kernel tests (routing as a rank, grouping with other ranks'
#           pairs, the all-to-all packing, every expert path as rank r of
#           2 or 4, dt and quantized) and gpu_tp_test (pp stages, then tp
#           1/2/4 over the threads communicator on GPU 0, MoE dummies with
#           both moe_dispatch forms; two GPUs add the NCCL runs).
#   tprofile: the throughput shape's steps by kind: TPROFILE_SEQS (512,
#           bench/throughput.sh runs 1024; at most 1024) requests of 128
#           prompt + 64 new tokens at as many sequences a step on the
#           Llama-3-8B shape cut to 8 layers, for each of
#           TPROFILE_PIPELINES (fp8: FP8 weights + FP8 KV; dummy: bf16):
#           each kernel's GPU time and DRAM bytes per kind of step,
#           the mixed and the decode steps apart (ncu, warm caches, graphs
#           off, one pass; ncu-summary.py --by-kind).
#   kprofile: kernels under ncu where a target waits on a profile: the
#           tiled W8A16 / INT4 kernels (mma.sync, wgmma with cp.async, TMA
#           and wide TMA copies, and the K-split reduce kernels — the
#           row-major kernels' too; --set full, then their durations again
#           with warm caches) on one Llama-3-8B layer's linears at KPROFILE_M
#           (default 16 64 256), and each kernel of a Qwen3-30B-A3B-shape
#           (4 layers) batch-1 decode step inside its CUDA graph, warm
#           caches, against the step's wall time (KPROFILE_M=none: only
#           the latter).
#   param-ab: backend.$PARAM_AB_KEY (a boolean) true vs false as pdl-order
#           runs its cases, on PARAM_AB_CASES (default: tiled INT4 with its
#           LM head on 8 Llama-3-8B layers, batch 1); printed, not recorded.
#   pdl-order: backend.trigger_first true vs false (the launch order of
#           every kernel) in one `loom bench --compare` per case, two
#           rounds interleaved: batch-1 decode of tiled INT4 with its LM
#           head on 8 Llama-3-8B layers, the Llama-3-8B shape in bf16 at
#           batch 1 and 8, Qwen3-30B-A3B and the SmolLM2 shape at batch 1
#           (PDL_CASES="CONFIG[@BATCH][:KEY=VALUE...]" narrows it: each case
#           loads its pipeline five times, Qwen3-30B-A3B 61 GB each, so the
#           five may not fit one 10-minute call).
#   backend-ab: this tree's CUDA backend against older commits' (each packed
#           by scripts/gpu/pack-old-backend.sh REV [NAME] into .devpack/),
#           new and the old ones alternated in one machine: batch-1 decode
#           of each config in AB_CONFIGS (default: Llama-3-8B bf16, W8A16
#           with its LM head quantized, fp8; an entry CONFIG[:key=value...]
#           adds --sets, e.g. llama3-8b-int4-head:model.layers=8), AB_REPEATS
#           rounds (default 1); AB_BATCH=N decodes N at a time instead (2 N
#           + 1 requests). AB_THROUGHPUT="CASE..." (bench/throughput.sh's
#           DTYPE:IN:OUT:REQUESTS) times those offline cases instead,
#           AB_REPEATS rounds (default 2 there), the sides' order reversed
#           every other round (new old, old new, ...); a case and side may
#           take minutes, so few fit one 10-minute call.
#   awq:    AWQ / GPTQ / GPTQ-v2 4-bit checkpoints written by
#           tests/e2e/hf_llama_reference.py --quant (a tiny Llama and the
#           Llama-3-8B shape with 2 layers, group 128) through the int4
#           quantizer on cuda, row-major and tiled (quant_layout), and the
#           tiny one on cpu: teacher-forced
#           logprobs and 32 greedy tokens vs transformers on the dequantized
#           weights.
#   throughput: gpu_backend_test (graph buckets), continuous vs static
#           batching and eager vs piecewise-graph mixed steps on dummy
#           weights (configs/gpu/ab, SmolLM2 and Llama-3-8B shapes), and bench/throughput.sh for the cases in
#           THROUGHPUT_CASES (default: its FP8 cases).
#   serve:  loom serve on the Llama-3-8B shape under bench/serve_sweep.sh at
#           rising request rates (SERVE_RATES): throughput, TTFT / TPOT
#           percentiles and goodput; scripts/plot-serve.py draws the PNG.
#   kvfp8:  the FP8 E4M3 KV cache (kv_cache: fp8, bf16 weights) vs bf16 KV
#           on the Llama-3-8B shape: per-token logprobs, batch-1 decode at a
#           long context, offline throughput; SmolLM2 perplexity with both
#           (needs SmolLM2 for that part).
#   gemma:  Gemma 3 and Qwen3 on cuda: gpu_backend_test's Gemma-3-like and
#           Qwen3-like shapes (grouped layouts of 3 and 4 groups included);
#           the real Gemma 3 270M (its GGUF assembled at /tmp/gemma3-270m.gguf)
#           against transformers' float32 run of it
#           (tests/engine/data/gemma3_reference.json;
#           tests/e2e/check_gemma3_reference.py), with one block table and
#           with backend.kv_groups=true; Gemma 3 270M's shape (dummy bf16):
#           batch-1 decode and 2048-token prefill; the window-aware cache vs
#           whole history at 8k, 16k and 32k contexts, prefill-bound and
#           decode-bound (the gemma-ab stage alone; configs/ab/gemma3-dummy-cuda-*.yaml;
#           GEMMA_AB_CASES / GEMMA_AB_DECODE_CASES="CTX:N ...");
#           a tiny random Gemma 3 written by transformers as GGUF
#           (tests/e2e/hf_gemma3_reference.py) and a tiny Qwen3
#           (hf_llama_reference.py --shape qwen3-tiny): teacher-forced
#           logprobs and 32 greedy tokens vs transformers on cuda (Gemma also
#           with backend.kv_groups=true) and cpu.
set -u
. scripts/gpu/gpu-env.sh
O=${OUT:-/tmp/out}; mkdir -p "$O"
RESULTS=${LOOM_RESULTS:-bench/results}
fails=0
step() { echo; echo "=== [${SECONDS}s] $*"; }
find_ncu() { command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1; }
# rec NAME --what TEXT [record.py options]: the stage's current figure; the
# command recorded is this stage with the variables that narrowed it
CMD="scripts/gpu/gpu-check.sh ${1:-}"
for v in PDL_CASES TPROFILE_SEQS TPROFILE_PIPELINES QUANT_SCHEMES QUANT_RUNS AWQ_SHAPES KPROFILE_M THROUGHPUT_CASES GEMMA_AB_CASES GEMMA_AB_DECODE_CASES SKIP_AB SERVE_RATES SERVE_N SERVE_IN SERVE_OUT; do [ -n "${!v:-}" ] && CMD="$v=\"${!v}\" $CMD"; done
rec() { python3 bench/record.py "$@" --dir "$RESULTS" --command "$CMD" || fails=$((fails + 1)); }
# The SmolLM2 GGUF, carried in parts (split -b 33M; docs/gpu.md) across
# back-to-back calls: each call copies the part it carries to /tmp, the
# last one assembles them.
for f in .devmodel/smollm2.part.*; do [ -e "$f" ] && cp "$f" /tmp/; done
smollm2_model() {
  [ -s /tmp/smollm2.gguf ] || cat /tmp/smollm2.part.* > /tmp/smollm2.gguf 2>/dev/null
  sha256sum /tmp/smollm2.gguf | grep -q b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 \
    || { echo "FAIL model checksum (carry .devmodel parts: docs/gpu.md)"; rm -f /tmp/smollm2.gguf; return 1; }
  mkdir -p /tmp/lc/models && ln -sf /tmp/smollm2.gguf /tmp/lc/models/SmolLM2-135M-Instruct.Q4_1.gguf
  export LOOM_CACHE=/tmp/lc
}
# The real Gemma 3 270M GGUF (253 MB, scripts/fetch-model.sh gemma3-270m),
# carried in parts like SmolLM2's and assembled at /tmp/gemma3-270m.gguf
# (docs/gpu.md): checks its sha256.
for f in .devmodel/gemma3-270m.part.*; do [ -e "$f" ] && cp "$f" /tmp/; done
gemma3_model() {
  [ -s /tmp/gemma3-270m.gguf ] || cat /tmp/gemma3-270m.part.* > /tmp/gemma3-270m.gguf 2>/dev/null
  sha256sum /tmp/gemma3-270m.gguf | grep -q a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818 \
    || { echo "FAIL Gemma 3 270M checksum (assemble /tmp/gemma3-270m.gguf: docs/gpu.md)"; rm -f /tmp/gemma3-270m.gguf; return 1; }
}
# Greedy text of each SmolLM2 prompt with ngram speculation vs without, on
# cuda: spec_vs_plain MAX_NEW [engine_tool --set options]. A DIFF counts as
# a failure.
spec_vs_plain() {
  local n=$1; shift
  while IFS= read -r p; do
    a=$(timeout 120 "$LB/tests/e2e/engine_tool" greedy configs/gpu/smollm2.yaml "$n" "$p" "$@" 2>>"$O/smollm2.err")
    b=$(timeout 120 "$LB/tests/e2e/engine_tool" greedy configs/gpu/spec-ngram.yaml "$n" "$p" "$@" 2>>"$O/smollm2.err")
    line=$(python3 - "$a" "$b" "$p" "$*" <<'PY'
import sys
a, b, p, opts = sys.argv[1].split(), sys.argv[2].split(), sys.argv[3], sys.argv[4]
k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
print(f"{'PASS' if a == b and a else 'DIFF'} spec vs plain{' (' + opts + ')' if opts else ''} '{p}': {len(b)} tokens, identical for the first {k} of {len(a)}")
sys.exit(0 if a == b and a else 1)
PY
) || fails=$((fails + 1))
    echo "$line" | tee -a "$O/spec_vs_plain.txt"
  done < tests/e2e/data/smollm2_prompts.txt
}
# The window-aware cache (a, configs/ab/gemma3-dummy-cuda-windows.yaml) vs
# every layer's whole history (b) on Gemma 3 270M's shape, a KV budget of
# 1.25 sequences of the context without windows (bf16: 18 KiB a token), so
# (b) holds one sequence at a time: gemma_ab OUTPUT_LEN "CTX:REQUESTS ..." KEY
# — prompts of CTX - OUTPUT_LEN random ids; results under KEY<CTX>.
G3_AB_WHAT="Gemma 3 270M shape (dummy bf16) on cuda at long contexts, KV budget 1.25 sequences without windows: window-aware cache (a, backend.kv_groups) vs every layer's history (b); ctxN: prompts of N - 16 tokens and 16 output tokens (prefill-bound), decode-ctxN: N - 512 and 512"
# Backend boolean KEY true (a) vs false (b), one `loom bench --compare` a
# case CONFIG[@N][:key=value...] (batch N, default 1), two rounds
# interleaved: files $O/TAG-*, each case's TPOT line into $O/TAG.txt, its
# JSON into the array bargs (as --bench NAME=FILE for rec).
bool_ab() {
  local key=$1 tag=$2 cs cb sets c bs name v kv sargs
  shift 2
  : > "$O/$tag.txt"
  bargs=()
  for cs in "$@"; do
    IFS=: read -r cb sets <<< "$cs"
    c=${cb%@*} bs=1; [ "$c" != "$cb" ] && bs=${cb#*@}
    [ -f "configs/gpu/$c.yaml" ] || { echo "FAIL case '$c': no configs/gpu/$c.yaml"; fails=$((fails + 1)); continue; }
    sargs=(); for kv in ${sets//:/ }; do sargs+=(--set "$kv"); done
    name=$(echo "$cs" | sed 's/backend\.//g; s/model\.//g; s/@/_b/' | tr ':=' '_-')
    for v in true false; do
      printf 'include: %s\nbackend:\n  %s: %s\n' "$PWD/configs/gpu/$c.yaml" "$key" $v > "$O/$tag-$name-$v.yaml"
    done
    step "backend.$key true (a) vs false (b): $cs, batch $bs"
    timeout 400 loom bench --compare "$O/$tag-$name-true.yaml" "$O/$tag-$name-false.yaml" --repeat 2 --num-requests $((bs * 2 + 1)) \
      --input-len 128 --output-len 256 --set scheduler.max_num_seqs=$bs "${sargs[@]}" --no-progress \
      --json "$O/$tag-$name.json" > "$O/$tag-$name.txt" 2>&1 || { fails=$((fails + 1)); tail -3 "$O/$tag-$name.txt"; continue; }
    echo "$cs batch $bs: $(grep -E 'TPOT p50' "$O/$tag-$name.txt" | tr -s ' ')" | tee -a "$O/$tag.txt"
    bargs+=(--bench "$name=$O/$tag-$name.json")
  done
}

gemma_ab() {
  local out=$1 cases=$2 key=$3 c ctx n gib
  for c in $cases; do
    ctx=${c%%:*} n=${c##*:}
    gib=$(python3 -c "print(round($ctx * 18432 * 1.25 / 2**30, 4))")
    timeout 150 loom bench --compare configs/ab/gemma3-dummy-cuda-windows.yaml configs/ab/gemma3-dummy-cuda-no-windows.yaml \
      --num-requests $n --input-len $((ctx - out)) --output-len $out --seed 5 --no-progress \
      --set engine.max_model_len=$ctx --set cache.memory_gib=$gib --json "$O/gemma3-ab-$key$ctx.json" > "$O/gemma3-ab-$key$ctx.txt" 2>&1 \
      || { fails=$((fails + 1)); echo "FAIL A/B $key$ctx: $(tail -1 "$O/gemma3-ab-$key$ctx.txt")"; continue; }
    echo "$key$ctx: $n requests of $((ctx - out)) + $out tokens, KV budget $gib GiB"
    grep -E "KV per seq|peak KV|total tok|output tok|TPOT p50|counts" "$O/gemma3-ab-$key$ctx.txt" | head -10
    rec '{hw}-ab-gemma3-windows' --merge --what "$G3_AB_WHAT" \
      --bench "$key$ctx=$O/gemma3-ab-$key$ctx.json" --value "$key${ctx}_kv_budget_gib=$gib"
  done
}
gemma_ab_both() {
  step "window-aware cache vs whole history, prefill-bound (16 output tokens)"
  gemma_ab 16 "${GEMMA_AB_CASES:-8192:16 16384:10 32768:6}" ctx
  step "window-aware cache vs whole history, decode-bound (512 output tokens)"
  gemma_ab 512 "${GEMMA_AB_DECODE_CASES:-8192:16 16384:12 32768:8}" decode-ctx
}
case "${1:-}" in
throughput)
  step "gpu_backend_test: every graph bucket against eager"
  LOOM_QUANTIZER_DIR=$LB/plugins/quantizer timeout 300 "$LB/tests/gpu/gpu_backend_test" \
    "$LB/plugins/backend/cuda/loom-backend-cuda.so" "$LB/plugins/backend/cpu/loom-backend-cpu.so" \
    > "$O/backend_test.log" 2>&1 || fails=$((fails + 1))
  grep -E '^FAIL' "$O/backend_test.log" | head; tail -1 "$O/backend_test.log"
  # two interleaved runs a side (medians): one engine's first run in a
  # process is the noisier
  W="--num-requests 200 --input-len 64:512 --output-len 32:256 --seed 3 --warmup 64 --repeat ${AB_REPEAT:-2}"
  [ -n "${SKIP_AB:-}" ] || for shape in smollm2-135m llama3-8b; do
    step "continuous (a) vs static (b) batching, dummy $shape weights"
    timeout 240 loom bench --compare configs/gpu/ab/base.yaml configs/gpu/ab/static.yaml $W --no-progress \
      --set model.format=dummy --set model.shape=$shape --set model.dtype=bf16 --set cache.memory_gib=32 \
      --json "$O/ab-static-$shape.json" > "$O/ab-static-$shape.txt" 2>&1 || { fails=$((fails + 1)); echo "FAIL ab $shape"; }
    grep -E 'output tokens/s|TPOT p50|TTFT p50|steps|prefill |mixed |decode |outside' "$O/ab-static-$shape.txt"
    step "eager (a) vs piecewise-graph (b) prefill and mixed steps, continuous, dummy $shape weights"
    timeout 240 loom bench --compare configs/gpu/ab/eager-mixed.yaml configs/gpu/ab/base.yaml $W --no-progress \
      --set model.format=dummy --set model.shape=$shape --set model.dtype=bf16 --set cache.memory_gib=32 \
      --json "$O/ab-piecewise-$shape.json" > "$O/ab-piecewise-$shape.txt" 2>&1 || { fails=$((fails + 1)); echo "FAIL piecewise $shape"; }
    grep -E 'output tokens/s|TPOT p50|TTFT p50|steps|prefill |mixed |decode |outside' "$O/ab-piecewise-$shape.txt"
  done
  [ -n "${SKIP_AB:-}" ] || rec '{hw}-continuous-vs-static-dummy' --what "continuous (a) vs static (b) batching on cuda, dummy weights, 200 requests of 64-512 in / 32-256 out (configs/gpu/ab, cache.memory_gib=32)" \
    --bench smollm2-135m="$O/ab-static-smollm2-135m.json" --bench llama3-8b="$O/ab-static-llama3-8b.json"
  [ -n "${SKIP_AB:-}" ] || rec '{hw}-piecewise-graphs-dummy' --what "prefill and mixed steps eager (a) vs through piecewise CUDA graphs (b), continuous batching on cuda, dummy weights, 200 requests of 64-512 in / 32-256 out (configs/gpu/ab/eager-mixed.yaml vs base.yaml, cache.memory_gib=32)" \
    --bench smollm2-135m="$O/ab-piecewise-smollm2-135m.json" --bench llama3-8b="$O/ab-piecewise-llama3-8b.json"
  step "throughput table (bench/throughput.sh ${THROUGHPUT_CASES:-fp8 cases})"
  cases=${THROUGHPUT_CASES:-"fp8:128:128:3000 fp8:128:2048:256 fp8:1000:1000:512 fp8:2048:2048:256"}
  OUT=$O LB=$LB bench/throughput.sh $cases || fails=$((fails + 1))
  ;;
serve)
  step "continuous (a) vs static (b) batching, dummy llama3-8b weights, Poisson arrivals at 16 requests/s"
  timeout 240 loom bench --compare configs/gpu/ab/base.yaml configs/gpu/ab/static.yaml --no-progress \
    --num-requests 200 --input-len 64:512 --output-len 32:256 --seed 3 --warmup 64 --rate 16 \
    --set model.format=dummy --set model.shape=llama3-8b --set model.dtype=bf16 --set cache.memory_gib=32 \
    --json "$O/ab-static-poisson.json" > "$O/ab-static-poisson.txt" 2>&1 || { fails=$((fails + 1)); echo "FAIL ab poisson"; }
  grep -E 'output tokens/s|TPOT p50|TTFT p50|steps|prefill |mixed |decode |outside' "$O/ab-static-poisson.txt"
  rec '{hw}-continuous-vs-static-poisson-llama3-8b' --what "continuous (a) vs static (b) batching on cuda, dummy Llama-3-8B weights, 200 requests of 64-512 in / 32-256 out arriving at 16/s (Poisson)" \
    --bench poisson16="$O/ab-static-poisson.json"
  step "loom serve, Llama-3-8B shape (dummy bf16), rising request rates"
  SERVE_N=${SERVE_N:-200} SERVE_IN=${SERVE_IN:-512} SERVE_OUT=${SERVE_OUT:-128} \
    SERVE_SET="scheduler.max_num_seqs=256 engine.max_model_len=2048" SERVE_RESULT='{hw}-serve-sweep-llama3-8b' \
    LOOM=$(command -v loom) bench/serve_sweep.sh configs/gpu/llama3-8b-dummy.yaml "$O/serve" ${SERVE_RATES:-8 16 32 64 inf} \
    || fails=$((fails + 1))
  ;;
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
    --output-len 128:384 --seed 7 --set engine.log_level=info --set backend.step_split=true --no-progress --json "$O/llama3-8b-offline-1000.json" > "$O/offline-1000.txt" 2>&1 \
    || fails=$((fails + 1))
  grep -v 'INFO\|info' "$O/offline-1000.txt" | tail -19; grep 'waiting for the GPU' "$O/offline-1000.txt" | tail -1
  grep -E "waiting for the GPU|engine's own work|ms a step: prep|ms a step: inbox|cuBLASLt plans" "$O/offline-1000.txt" > "$O/offline-1000-split.txt"
  rec '{hw}-hf-reference-llama3-8b' --what "teacher-forced logprobs vs transformers, random-weight Llama-3-8B shape (4 layers)" \
    --text compare="$O/hf_compare.txt"
  rec '{hw}-llama3-8b-bf16-decode-batch1' --what "Llama-3-8B shape, bf16, batch-1 decode (4 requests of 128 + 256 tokens)" \
    --bench batch1="$O/llama3-8b-batch1.json"
  rec '{hw}-llama3-8b-offline-1000' --merge --what "Llama-3-8B shape, bf16, offline 1000 requests (~512 in / ~256 out)" \
    --bench default="$O/llama3-8b-offline-1000.json" --text default_step_split="$O/offline-1000-split.txt"
  ;;
stage2)
  smollm2_model || exit 1
  greedy_vs_cpu() { # config, output file: each prompt's 48 greedy ids on cuda vs the CPU's
    local cfg=$1 out=$2 i=0 p ref got line
    : > "$out.cmp"
    while IFS= read -r p; do
      i=$((i + 1))
      ref=$(sed -n "${i}p" tests/e2e/data/smollm2_greedy_cpu.txt)
      got=$(timeout 60 "$LB/tests/e2e/engine_tool" greedy "$cfg" 48 "$p" 2>>"$O/smollm2.err")
      echo "$got" >> "$out"
      line=$(python3 - "$ref" "$got" "$p" <<'PY'
import sys
r, g, p = sys.argv[1].split(), sys.argv[2].split(), sys.argv[3]
k = next((i for i, (a, b) in enumerate(zip(r, g)) if a != b), min(len(r), len(g)))
same = r == g
print(f"{'PASS' if same else 'DIFF'} '{p}': {len(g)} tokens, identical for the first {k} of {len(r)} (CPU)")
sys.exit(0 if same or k >= 16 else 1)
PY
) || fails=$((fails + 1))
      echo "$line" | tee -a "$out.cmp"
    done < tests/e2e/data/smollm2_prompts.txt
  }
  step "SmolLM2: greedy on cuda vs the CPU backend"
  greedy_vs_cpu configs/gpu/smollm2.yaml "$O/smollm2_greedy_cuda.txt"
  step "SmolLM2 batch-1 decode through the engine (256 new tokens)"
  timeout 120 loom bench configs/gpu/smollm2.yaml --num-requests 4 --input-len 64 --output-len 256 \
    --set scheduler.max_num_seqs=1 --set engine.log_level=info --no-progress --json "$O/smollm2-batch1.json" 2>&1 \
    | grep -E "TPOT p50|output tokens|engine's own work|waiting for the GPU"
  # the same weights as stored: the cuda GGUF kernels read the q4_1 blocks
  step "SmolLM2, GGUF q4_1 blocks as stored on cuda: greedy vs the CPU backend"
  greedy_vs_cpu configs/gpu/smollm2-gguf-native.yaml "$O/smollm2_greedy_cuda_gguf_native.txt"
  step "SmolLM2 batch-1 decode: bf16 vs GGUF blocks as stored (256 new tokens)"
  timeout 150 loom bench --compare configs/gpu/smollm2.yaml configs/gpu/smollm2-gguf-native.yaml \
    --num-requests 4 --input-len 64 --output-len 256 --set scheduler.max_num_seqs=1 --no-progress \
    --json "$O/smollm2-gguf-native-batch1.json" > "$O/smollm2-gguf-native-batch1.txt" 2>&1 \
    || { fails=$((fails + 1)); echo "FAIL bench gguf-native"; }
  tail -16 "$O/smollm2-gguf-native-batch1.txt"
  ab() { # name, B config, extra bench args: A = configs/gpu/ab/base.yaml
    local name=$1 cfg=$2; shift 2
    step "pipeline A/B ($name): base vs $cfg"
    timeout 150 loom bench --compare configs/gpu/ab/base.yaml "$cfg" --no-progress --seed 3 --warmup 64 "$@" \
      --json "$O/ab-$name.json" > "$O/ab-$name.txt" 2>&1 || { fails=$((fails + 1)); echo "FAIL ab $name"; }
    tail -22 "$O/ab-$name.txt"
  }
  W="--num-requests 200 --input-len 64:512 --output-len 32:256"
  ab static configs/gpu/ab/static.yaml $W
  ab contiguous configs/gpu/ab/contiguous.yaml $W
  ab prefix configs/gpu/ab/no-prefix-cache.yaml $W --shared-prefix-ratio 0.9 --prefix-len 384
  ab tight-recompute configs/gpu/ab/tight.yaml --num-requests 64 --input-len 200:400 --output-len 64:128
  ab tight-swap configs/gpu/ab/tight-swap.yaml --num-requests 64 --input-len 200:400 --output-len 64:128
  step "speculation: greedy ids with ngram drafts vs without, on cuda"
  rm -f "$O/spec_vs_plain.txt"; spec_vs_plain 64
  step "speculation with backend.batch_invariant=true: greedy ids with ngram drafts vs without (must be identical)"
  spec_vs_plain 128 --set backend.batch_invariant=true
  step "speculation: SmolLM2 with and without ngram, grounded and chat, batch 1 / 8 / 32"
  for wl in grounded chat; do
    for i in 1 2 3 4; do cat configs/spec/$wl.jsonl; done > /tmp/$wl-32.jsonl
    for bs in 1 8 32; do
      timeout 150 loom bench --compare configs/gpu/smollm2.yaml configs/gpu/spec-ngram.yaml \
        --workload /tmp/$wl-32.jsonl --set scheduler.max_num_seqs=$bs --no-progress --warmup 32 \
        --json "$O/spec-ngram-$wl-b$bs.json" > "$O/spec-$wl-b$bs.txt" 2>&1 \
        || { fails=$((fails + 1)); echo "FAIL spec $wl b$bs"; }
      echo "--- $wl batch $bs"; grep -iE "output tok/s|TPOT p50|accept|proposed" "$O/spec-$wl-b$bs.txt"
    done
  done
  rec '{hw}-smollm2-greedy' --what "SmolLM2 greedy ids on cuda: vs the CPU backend (bf16 and GGUF blocks as stored), with vs without ngram drafts" \
    --text cuda_vs_cpu="$O/smollm2_greedy_cuda.txt.cmp" --text gguf_native_vs_cpu="$O/smollm2_greedy_cuda_gguf_native.txt.cmp" \
    --text spec_vs_plain="$O/spec_vs_plain.txt"
  rec '{hw}-smollm2-decode-batch1' --what "SmolLM2-135M (GGUF, bf16 on cuda), batch-1 decode (4 requests of 64 + 256 tokens)" \
    --bench batch1="$O/smollm2-batch1.json"
  rec '{hw}-smollm2-gguf-native-vs-bf16' --what "SmolLM2 batch-1 decode: bf16 (a) vs the GGUF q4_1 blocks as stored (b)" \
    --bench batch1="$O/smollm2-gguf-native-batch1.json"
  rec '{hw}-pipelines-ab-smollm2' --what "SmolLM2 on cuda: configs/gpu/ab/base.yaml (a) vs each scheduler/cache variant (b)" \
    $(for n in static contiguous prefix tight-recompute tight-swap; do echo "--bench $n=$O/ab-$n.json"; done)
  rec '{hw}-spec-ngram-smollm2' --what "SmolLM2 without (a) and with (b) ngram speculation, grounded and chat workloads, batch 1 / 8 / 32" \
    $(for wl in grounded chat; do for bs in 1 8 32; do echo "--bench $wl-b$bs=$O/spec-ngram-$wl-b$bs.json"; done; done)
  ;;
quant)
  # One load per pipeline (quantizing the 8B shape runs on the host at
  # load); the layer-level speed-ups at M = 1 / 64 / 2048 are gpu_bench's.
  # bf16 (A) vs each scheme (B) in one `loom bench --compare` each: the
  # ratio the quantization issue asks for; int4 quantizes 7B weights on the
  # host at load (~135 s on 16 threads)
  # QUANT_SCHEMES / QUANT_RUNS narrow it (one device call is 10 minutes):
  #   QUANT_SCHEMES="fp8 int4" QUANT_RUNS="b64 prefill" scripts/gpu/gpu-check.sh quant
  for c in ${QUANT_SCHEMES:-int8-w8a16 fp8 int8-w8a8 int4}; do
    for r in ${QUANT_RUNS:-b1 b64 prefill}; do
      case $r in
      b1) what="batch-1 decode (128 in, 256 out)"
          args="--num-requests 3 --input-len 128 --output-len 256 --set scheduler.max_num_seqs=1" ;;
      b16) what="batch-16 decode (32 requests of 128 in, 256 out)"
          args="--num-requests 32 --input-len 128 --output-len 256 --set scheduler.max_num_seqs=16 --warmup 2" ;;
      b64) what="batch-64 decode (128 requests of 128 in, 256 out)"
          args="--num-requests 128 --input-len 128 --output-len 256 --set scheduler.max_num_seqs=64 --warmup 2" ;;
      b256) what="batch-256 decode (512 requests of 128 in, 256 out)"
          args="--num-requests 512 --input-len 128 --output-len 256 --set scheduler.max_num_seqs=256 --warmup 2" ;;
      prefill) what="2048-token prefill (8 prompts one at a time, 1 token out: total tokens/s, TTFT)"
          args="--num-requests 8 --input-len 2048 --output-len 1 --set scheduler.max_num_seqs=1 --warmup 1" ;;
      sweep) what="decode at 1, 16, 64 and 256 requests in flight (3, 32, 128, 512 requests of 128 in, 256 out), one load"
          args="--concurrency 1,16,64,256 --num-requests 3,32,128,512 --input-len 128 --output-len 256
                --set scheduler.max_num_seqs=256 --warmup 2" ;;
      *) echo "FAIL QUANT_RUNS has '$r'; the runs are b1, b16, b64, b256, sweep, prefill"; fails=$((fails + 1)); continue ;;
      esac
      [ -f "configs/gpu/llama3-8b-$c.yaml" ] || { echo "FAIL QUANT_SCHEMES has '$c': no configs/gpu/llama3-8b-$c.yaml"; fails=$((fails + 1)); break; }
      step "Llama-3-8B shape, bf16 vs $c: $what"
      f=$O/quant-$c-$r
      [ $r = b1 ] && f=$O/quant-$c   # the names of earlier runs
      rm -f "$f.json" "$f"-b*.json # a reused OUT: a failed run must not leave an older result to record
      # shellcheck disable=SC2086
      timeout 400 loom bench --compare configs/gpu/llama3-8b-dummy.yaml configs/gpu/llama3-8b-$c.yaml \
        $args --no-progress --json "$f.json" > "$f.txt" 2>&1 || { fails=$((fails + 1)); tail -3 "$f.txt"; }
      grep -E "in flight|output tokens/s|total tokens/s|TPOT p50|TTFT p50|wall" "$f.txt"
      [ -s "$f.json" ] || continue # the failure is counted above; nothing to record
      bargs=(--bench "$c $r=$f.json")
      if [ $r = sweep ]; then # one document per level, named as the separate runs
        bargs=()
        for lv in 1:b1 16:b16 64:b64 256:b256; do
          if python3 -c 'import json, sys
d = json.load(open(sys.argv[1])); c = int(sys.argv[2])
l = next(x for x in d["levels"] if x["concurrency"] == c)
json.dump({"num_requests": l["num_requests"], "concurrency": c, "repeat": d["repeat"], "a": d["a"], "b": d["b"],
           "a_results": l["a_results"], "b_results": l["b_results"]}, open(sys.argv[3], "w"), indent=1)' \
            "$f.json" "${lv%%:*}" "$f-${lv#*:}.json"; then
            bargs+=(--bench "$c ${lv#*:}=$f-${lv#*:}.json")
          else
            echo "FAIL $f.json has no level ${lv%%:*}"; fails=$((fails + 1))
          fi
        done
        [ ${#bargs[@]} -gt 0 ] || continue
      fi
      rec '{hw}-quant-schemes-vs-bf16' --merge \
        --what "Llama-3-8B shape: bf16 (a) vs each quantization scheme (b); b1 = batch-1 decode, b16 / b64 / b256 = batch-16 / 64 / 256 decode (scheduler.max_num_seqs, or a level of one closed-loop run on one load where the entry has a concurrency), prefill = 2048-token prompts" \
        "${bargs[@]}"
    done
  done
  ;;
ppl)
  smollm2_model || exit 1
  step "SmolLM2 perplexity on cuda per scheme (data/text/us-founding-documents.txt)"
  : > "$O/ppl-summary.txt"
  # (SmolLM2's K = 576 does not tile: its layers keep the row layout under
  # either quant_layout)
  for c in smollm2 smollm2-int8-w8a16 smollm2-int8-w8a8 smollm2-fp8 smollm2-int4 smollm2-gguf-native; do
    timeout 120 loom perplexity configs/gpu/$c.yaml data/text/us-founding-documents.txt > "$O/ppl-$c.txt" 2>&1 \
      || { fails=$((fails + 1)); tail -2 "$O/ppl-$c.txt"; }
    echo "$c: $(grep -i perplexity "$O/ppl-$c.txt" | tail -1)"
    echo "$c $(grep -i '^perplexity' "$O/ppl-$c.txt" | tail -1)" >> "$O/ppl-summary.txt"
  done
  rec '{hw}-smollm2-perplexity' --what "SmolLM2 perplexity on cuda per scheme, data/text/us-founding-documents.txt" \
    --text perplexity="$O/ppl-summary.txt"
  ;;
invariant)
  smollm2_model || exit 1
  step "backend.batch_invariant=true: SmolLM2 greedy with ngram drafts vs without (must be identical)"
  rm -f "$O/spec_vs_plain.txt"; spec_vs_plain 128 --set backend.batch_invariant=true
  step "the same with CUDA graphs off (eager verify and decode steps)"
  spec_vs_plain 128 --set backend.batch_invariant=true --set backend.cuda_graphs=false
  step "for contrast, the ordinary mode (a DIFF here is issue 7, not counted)"
  f0=$fails; spec_vs_plain 128; fails=$f0
  step "SmolLM2 batch-1 decode, batch_invariant off vs on (the mode's cost)"
  timeout 150 loom bench --compare configs/gpu/smollm2.yaml configs/gpu/smollm2-invariant.yaml \
    --num-requests 4 --input-len 512 --output-len 128 --set scheduler.max_num_seqs=1 --no-progress \
    --json "$O/invariant-batch1.json" 2>&1 | grep -E "TPOT p50|TTFT p50|output tokens/s" || true
  rec '{hw}-batch-invariant-smollm2' --what "backend.batch_invariant: SmolLM2 greedy with vs without ngram drafts (graphs on, off; the ordinary mode last), and its batch-1 cost: off (a) vs on (b)" \
    --text greedy="$O/spec_vs_plain.txt" --bench cost_batch1="$O/invariant-batch1.json"
  ;;
offline)
  for n in 256 512; do
    step "Llama-3-8B shape: offline 1000 requests, max_num_seqs $n"
    timeout 280 loom bench configs/gpu/llama3-8b-dummy.yaml --num-requests 1000 --input-len 384:640 \
      --output-len 128:384 --seed 7 --no-progress --set scheduler.max_num_seqs=$n \
      --set scheduler.max_batched_tokens=16384 --set backend.max_batched_tokens=16384 \
      --json "$O/llama3-8b-offline-1000-seqs$n.json" 2>&1 | grep -E "output tokens/s|total tokens/s|TPOT p50|wall|counts" \
      || fails=$((fails + 1))
  done
  rec '{hw}-llama3-8b-offline-1000' --merge --what "Llama-3-8B shape, bf16, offline 1000 requests (~512 in / ~256 out)" \
    --bench seqs256="$O/llama3-8b-offline-1000-seqs256.json" --bench seqs512="$O/llama3-8b-offline-1000-seqs512.json"
  ;;
spec2)
  smollm2_model || exit 1
  for i in 1 2 3 4; do cat configs/spec/grounded.jsonl; done > /tmp/grounded-32.jsonl
  for bs in 1 8; do
    step "draft-model (int4 self-draft) vs off, grounded, batch $bs"
    timeout 150 loom bench --compare configs/gpu/smollm2.yaml configs/gpu/spec-draft-int4.yaml \
      --workload /tmp/grounded-32.jsonl --set scheduler.max_num_seqs=$bs --no-progress --warmup 32 \
      --json "$O/spec-draft-int4-grounded-b$bs.json" > "$O/spec-draft-b$bs.txt" 2>&1 || fails=$((fails + 1))
    grep -E "output tokens/s|TPOT p50|speculation" "$O/spec-draft-b$bs.txt"
  done
  for bs in 1 32; do
    step "Llama-3-8B shape: ngram vs off (random-weight text: the cost side), batch $bs"
    timeout 200 loom bench --compare configs/gpu/llama3-8b-dummy.yaml configs/gpu/llama3-8b-ngram.yaml \
      --num-requests $((bs == 1 ? 4 : 64)) --input-len 128 --output-len 128 --set scheduler.max_num_seqs=$bs \
      --no-progress --warmup 8 --json "$O/spec-ngram-llama3-8b-b$bs.json" > "$O/spec-llama-b$bs.txt" 2>&1 \
      || fails=$((fails + 1))
    grep -E "output tokens/s|TPOT p50|speculation" "$O/spec-llama-b$bs.txt"
  done
  rec '{hw}-spec-draft-model-smollm2' --what "SmolLM2 without (a) and with (b) draft-model speculation (its int4 self), grounded workload" \
    --bench b1="$O/spec-draft-int4-grounded-b1.json" --bench b8="$O/spec-draft-int4-grounded-b8.json"
  rec '{hw}-spec-ngram-llama3-8b' --what "Llama-3-8B shape (random weights) without (a) and with (b) ngram speculation: the cost side" \
    --bench b1="$O/spec-ngram-llama3-8b-b1.json" --bench b32="$O/spec-ngram-llama3-8b-b32.json"
  ;;
tp)
  step "devices"
  nvidia-smi --query-gpu=index,name,memory.total --format=csv
  nvidia-smi topo -m 2>/dev/null | head -5
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  python3 -c 'import random; random.seed(5); print(" ".join(str(random.randrange(100, 128000)) for _ in range(200)))' \
    > /tmp/tp_tokens.txt
  step "one collective: NCCL vs peer-to-peer kernels (eager and graph), 8 KB .. 8 MB per rank"
  timeout 120 "$LB/bench/gpu/tp_comm_bench" "$O/tp_comm.json" || fails=$((fails + 1))
  step "one Llama-3-8B layer's kernels at batch 1: the whole model vs one rank of tp 2"
  timeout 180 "$LB/bench/gpu/gpu_bench" "$O/components.json" "$LB/plugins/backend/cuda/loom-backend-cuda.so" \
    --components 2>&1 | awk '/T=1 \(decode\)|one rank of/{p=1} p{print} /per layer/{p=0}' | head -60
  step "Llama-3-8B shape: per-token logprobs, tp size 2 vs 1"
  timeout 200 "$LB/tests/e2e/engine_tool" score configs/gpu/llama3-8b-dummy.yaml /tmp/tp_tokens.txt \
    > "$O/tp1_logprobs.txt" 2> "$O/tp1.err" || tail -3 "$O/tp1.err"
  timeout 200 "$LB/tests/e2e/engine_tool" score configs/tp/cuda-tp2-llama3-8b.yaml /tmp/tp_tokens.txt \
    > "$O/tp2_logprobs.txt" 2> "$O/tp2.err" || tail -3 "$O/tp2.err"
  python3 tests/e2e/compare_logprobs.py "$O/tp1_logprobs.txt" "$O/tp2_logprobs.txt" | tee "$O/tp_compare.txt" \
    || fails=$((fails + 1))
  step "Llama-3-8B shape: greedy ids, tp size 2 (NCCL; peer-to-peer + graphs) vs 1"
  P=$(head -c 400 /tmp/tp_tokens.txt | cut -d' ' -f1-40)
  g1=$(timeout 200 "$LB/tests/e2e/engine_tool" greedy-ids configs/gpu/llama3-8b-dummy.yaml 64 "$P" 2>>"$O/tp1.err")
  g2=$(timeout 200 "$LB/tests/e2e/engine_tool" greedy-ids configs/tp/cuda-tp2-llama3-8b.yaml 64 "$P" 2>>"$O/tp2.err")
  g3=$(timeout 200 "$LB/tests/e2e/engine_tool" greedy-ids configs/tp/cuda-tp2-llama3-8b-p2p.yaml 64 "$P" 2>>"$O/tp2p.err")
  echo "$g1" > "$O/tp1_greedy.txt"; echo "$g2" > "$O/tp2_greedy.txt"; echo "$g3" > "$O/tp2p_greedy.txt"
  python3 - "$g2" "$g3" <<'PY' || fails=$((fails + 1))
import sys
a, b = sys.argv[1].split(), sys.argv[2].split()
print(f"{'PASS' if a == b and a else 'FAIL'} greedy tp2 peer-to-peer+graphs == tp2 NCCL eager ({len(b)} tokens)")
sys.exit(0 if a == b and a else 1)
PY
  if ! python3 - "$g1" "$g2" <<'PY'
import sys
a, b = sys.argv[1].split(), sys.argv[2].split()
k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
print(f"{'PASS' if a == b and a else 'DIFF'} greedy tp2 vs tp1: {len(b)} tokens, identical for the first {k} of {len(a)}")
sys.exit(0 if a == b and a else 1)
PY
  then
    # Where they part: both tokens' log-probabilities under tp 1 at that
    # position. A gap within bf16 noise (~0.01) is a near-tie that the
    # all-reduce's different rounding flipped, not a sharding error.
    python3 - "$P" "$g1" "$g2" <<'PY'
import sys
p, a, b = sys.argv[1].split(), sys.argv[2].split(), sys.argv[3].split()
k = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
open("/tmp/tp_div_a.txt", "w").write(" ".join(p + a[:k + 1]))
open("/tmp/tp_div_b.txt", "w").write(" ".join(p + b[:k + 1]))
PY
    la=$(timeout 200 "$LB/tests/e2e/engine_tool" score configs/gpu/llama3-8b-dummy.yaml /tmp/tp_div_a.txt 2>>"$O/tp1.err" | tail -1)
    lb=$(timeout 200 "$LB/tests/e2e/engine_tool" score configs/gpu/llama3-8b-dummy.yaml /tmp/tp_div_b.txt 2>>"$O/tp1.err" | tail -1)
    echo "at the first difference, under tp 1: log p(tp1's token) = $la, log p(tp2's token) = $lb" \
      | tee "$O/tp_greedy_divergence.txt"
    python3 -c "import sys; g = abs(float('$la') - float('$lb')); print(f'gap {g:.4f}: ' + ('near-tie (< 0.02), bf16 rounding' if g < 0.02 else 'NOT a near-tie')); sys.exit(0 if g < 0.02 else 1)" \
      | tee -a "$O/tp_greedy_divergence.txt" || fails=$((fails + 1))
  fi
  step "Llama-3-8B shape: batch-1 decode, tp 1 vs tp 2 (peer-to-peer + graphs), and tp 2 NCCL eager"
  timeout 240 loom bench --compare configs/gpu/llama3-8b-dummy.yaml configs/tp/cuda-tp2-llama3-8b-p2p.yaml \
    --num-requests 4 --input-len 128 --output-len 256 --set scheduler.max_num_seqs=1 --no-progress \
    --json "$O/tp-batch1.json" 2>&1 | tail -16 || fails=$((fails + 1))
  timeout 120 loom bench configs/tp/cuda-tp2-llama3-8b.yaml --num-requests 4 --input-len 128 --output-len 256 \
    --set scheduler.max_num_seqs=1 --no-progress --json "$O/tp-batch1-nccl.json" 2>&1 | grep -E 'output tokens/s|TPOT p50' \
    || fails=$((fails + 1))
  step "Llama-3-8B shape: offline 500 requests (~512 in / ~256 out), tp 1 vs 2"
  timeout 300 loom bench --compare configs/gpu/llama3-8b-dummy.yaml configs/tp/cuda-tp2-llama3-8b-p2p.yaml \
    --num-requests 500 --input-len 384:640 --output-len 128:384 --seed 7 --no-progress \
    --json "$O/tp-offline-500.json" 2>&1 | tail -16 || fails=$((fails + 1))
  step "Llama-3-8B shape, fp8 quantizer: batch-1 decode and logprobs, tp 1 vs 2 (peer-to-peer + graphs)"
  timeout 300 loom bench --compare configs/gpu/llama3-8b-fp8.yaml configs/tp/cuda-tp2-llama3-8b-fp8.yaml \
    --num-requests 4 --input-len 128 --output-len 256 --set scheduler.max_num_seqs=1 --no-progress \
    --json "$O/tp-fp8-batch1.json" 2>&1 | tail -16 || fails=$((fails + 1))
  # row-parallel layers (O, down) quantize each rank's slice of the
  # activation with its own per-token scale, so fp8 tp 2 is not tp 1's
  # arithmetic split in two: expect a larger (still small) difference
  timeout 200 "$LB/tests/e2e/engine_tool" score configs/gpu/llama3-8b-fp8.yaml /tmp/tp_tokens.txt \
    > "$O/tp1_fp8_logprobs.txt" 2>> "$O/tp1.err"
  timeout 200 "$LB/tests/e2e/engine_tool" score configs/tp/cuda-tp2-llama3-8b-fp8.yaml /tmp/tp_tokens.txt \
    > "$O/tp2_fp8_logprobs.txt" 2>> "$O/tp2.err"
  python3 tests/e2e/compare_logprobs.py "$O/tp1_fp8_logprobs.txt" "$O/tp2_fp8_logprobs.txt" \
    | tee "$O/tp_fp8_compare.txt" || fails=$((fails + 1))
  { echo "tp1: $g1"; echo "tp2 nccl: $g2"; echo "tp2 p2p+graphs: $g3"; cat "$O/tp_greedy_divergence.txt" 2>/dev/null; } > "$O/tp_greedy.txt"
  rec '{hw}-tp2-vs-tp1-llama3-8b' --what "tensor parallel size 2 vs 1 on the Llama-3-8B shape (dummy weights): speed (a = tp 1, b = tp 2), logprobs, greedy ids, one collective" \
    --bench batch1_p2p_graphs="$O/tp-batch1.json" --bench batch1_nccl_eager="$O/tp-batch1-nccl.json" \
    --bench offline_500="$O/tp-offline-500.json" --bench fp8_batch1="$O/tp-fp8-batch1.json" \
    --text logprobs_bf16="$O/tp_compare.txt" --text logprobs_fp8="$O/tp_fp8_compare.txt" --text greedy="$O/tp_greedy.txt" \
    --json collective="$O/tp_comm.json" --json components="$O/components.json"
  ;;
kvfp8)
  python3 -c 'import random; random.seed(5); print(" ".join(str(random.randrange(100, 128000)) for _ in range(200)))' \
    > /tmp/kv_tokens.txt
  step "Llama-3-8B shape: per-token logprobs, fp8 KV vs bf16 KV (random weights: the size of the change)"
  timeout 200 "$LB/tests/e2e/engine_tool" score configs/gpu/llama3-8b-dummy.yaml /tmp/kv_tokens.txt \
    > "$O/kv_bf16_logprobs.txt" 2> "$O/kvfp8.err" || tail -3 "$O/kvfp8.err"
  timeout 200 "$LB/tests/e2e/engine_tool" score configs/gpu/llama3-8b-kvfp8.yaml /tmp/kv_tokens.txt \
    > "$O/kv_fp8_logprobs.txt" 2>> "$O/kvfp8.err" || { fails=$((fails + 1)); tail -3 "$O/kvfp8.err"; }
  python3 tests/e2e/compare_logprobs.py "$O/kv_bf16_logprobs.txt" "$O/kv_fp8_logprobs.txt" --mean 0.2 --max 2 \
    | tee "$O/kvfp8_compare.txt" || fails=$((fails + 1))
  step "Llama-3-8B shape: batch-1 decode at ~3900 tokens of context, bf16 KV vs fp8 KV"
  timeout 300 loom bench --compare configs/gpu/llama3-8b-dummy.yaml configs/gpu/llama3-8b-kvfp8.yaml \
    --num-requests 3 --input-len 3840 --output-len 128 --set scheduler.max_num_seqs=1 --no-progress \
    --json "$O/kvfp8-batch1.json" > "$O/kvfp8-batch1.txt" 2>&1 || { fails=$((fails + 1)); tail -3 "$O/kvfp8-batch1.txt"; }
  grep -E "TPOT p50|output tokens/s" "$O/kvfp8-batch1.txt"
  step "Llama-3-8B shape: offline 1000 requests (~512 in / ~256 out), bf16 KV vs fp8 KV (twice the blocks)"
  timeout 500 loom bench --compare configs/gpu/llama3-8b-dummy.yaml configs/gpu/llama3-8b-kvfp8.yaml \
    --num-requests 1000 --input-len 384:640 --output-len 128:384 --seed 7 --no-progress \
    --set scheduler.max_num_seqs=512 --set engine.log_level=info --json "$O/kvfp8-offline.json" > "$O/kvfp8-offline.txt" 2>&1 \
    || { fails=$((fails + 1)); tail -3 "$O/kvfp8-offline.txt"; }
  grep -E "output tokens/s|TPOT p50|wall|engine's own work|waiting for the GPU" "$O/kvfp8-offline.txt"
  : > "$O/ppl-kv.txt"
  if smollm2_model; then
    step "SmolLM2 perplexity on cuda, bf16 KV vs fp8 KV (cpu: fp8 KV moves log-probs by ~0.18 nats)"
    for c in smollm2 smollm2-kvfp8; do
      timeout 120 loom perplexity configs/gpu/$c.yaml data/text/us-founding-documents.txt > "$O/ppl-$c.txt" 2>&1 \
        || { fails=$((fails + 1)); tail -2 "$O/ppl-$c.txt"; }
      echo "$c: $(grep -i perplexity "$O/ppl-$c.txt" | tail -1)"
      echo "$c $(grep -i '^perplexity' "$O/ppl-$c.txt" | tail -1)" >> "$O/ppl-kv.txt"
    done
  fi
  rec '{hw}-kv-fp8-vs-bf16' --what "FP8 E4M3 KV cache vs bf16 KV: logprobs on the Llama-3-8B shape, batch 1 at ~3.9k context and offline 1000 (a = bf16 KV, b = fp8 KV), SmolLM2 perplexity" \
    --text logprobs="$O/kvfp8_compare.txt" --bench batch1_ctx3900="$O/kvfp8-batch1.json" \
    --bench offline_1000="$O/kvfp8-offline.json" $([ -s "$O/ppl-kv.txt" ] && echo "--text smollm2_perplexity=$O/ppl-kv.txt")
  ;;
profile)
  smollm2_model || exit 1
  NCU=$(find_ncu)
  step "SmolLM2 batch-1 decode: each kernel's GPU time in a step (ncu; graphs off, kernels unchanged)"
  if [ -n "$NCU" ]; then
    timeout 240 "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv --launch-skip 1500 \
      --launch-count 900 "$LB/tests/e2e/engine_tool" greedy configs/gpu/smollm2.yaml 40 \
      "Write a short story about a cat." --set backend.cuda_graphs=false > "$O/ncu-smollm2.csv" 2> "$O/ncu.err" \
      || { tail -3 "$O/ncu.err"; fails=$((fails + 1)); }
    python3 scripts/gpu/ncu-summary.py "$O/ncu-smollm2.csv" | tee "$O/ncu-smollm2-summary.txt" | head -30
  else
    echo "no ncu on this machine"; fails=$((fails + 1))
  fi
  step "SmolLM2 batch-1 decode wall time: graphs on / off (the step the kernels above add up to)"
  for g in true false; do
    echo "cuda_graphs=$g: $(timeout 120 loom bench configs/gpu/smollm2.yaml --num-requests 4 --input-len 64 \
      --output-len 256 --set scheduler.max_num_seqs=1 --set backend.cuda_graphs=$g --no-progress 2>&1 \
      | grep -E 'TPOT p50' | tr -s ' ')"
  done | tee "$O/step-wall.txt"
  rec '{hw}-smollm2-decode-profile' --what "SmolLM2 batch-1 decode: each kernel's GPU time in a step (ncu, graphs off) and the step's wall time" \
    --text kernels="$O/ncu-smollm2-summary.txt" --text step_wall="$O/step-wall.txt"
  ;;
tprofile)
  NCU=$(find_ncu)
  [ -n "$NCU" ] || { echo "FAIL no ncu on this machine"; exit 1; }
  n=${TPROFILE_SEQS:-512}
  pipes=${TPROFILE_PIPELINES:-fp8 dummy}
  targs=()
  for c in $pipes; do
    step "llama3-8b-$c, 8 layers, $n requests of 128 prompt + 64 new tokens at $n sequences a step: each kernel's GPU time per kind of step (ncu, graphs off)"
    kv=(); [ "$c" = fp8 ] && kv=(--set quantizer.kv_cache=fp8)
    # max_graph_batch sizes the logits buffer: below n a decode step runs its
    # LM head and top-k in two parts, and the summary would cut it in two.
    # One metric pass (no replay); ~9 mixed steps, then the decode steps.
    timeout 220 "$NCU" --clock-control none --cache-control none --csv \
      --metrics gpu__time_duration.sum,dram__bytes_read.sum --launch-count 4000 \
      loom bench "configs/gpu/llama3-8b-$c.yaml" "${kv[@]}" --set model.layers=8 --set backend.cuda_graphs=false \
      --set scheduler.max_num_seqs=$n --set scheduler.max_batched_tokens=8192 --set backend.max_graph_batch=$n \
      --num-requests $n --input-len 128 --output-len 64 --warmup 0 --no-progress \
      > "$O/tprofile-$c.csv" 2> "$O/tprofile-$c.err" || { tail -3 "$O/tprofile-$c.err"; fails=$((fails + 1)); continue; }
    if python3 scripts/gpu/ncu-summary.py "$O/tprofile-$c.csv" --by-kind > "$O/tprofile-$c.txt"; then
      targs+=(--text "kernels_$c=$O/tprofile-$c.txt")
    else fails=$((fails + 1)); fi
    grep -E '^(kind|ncu-summary)' "$O/tprofile-$c.txt"
  done
  [ ${#targs[@]} -gt 0 ] && rec '{hw}-throughput-step-profile' --what "Llama-3-8B shape cut to 8 layers with its LM head, $n requests of 128 prompt + 64 new tokens at $n sequences a step (max_batched_tokens 8192), pipelines $pipes (fp8: FP8 weights + FP8 KV; dummy: bf16): each kernel's GPU time and DRAM bytes per kind of step (the steps that ran the same kernels; the mixed prefill + decode steps and the decode steps apart; ncu, warm caches, graphs off)" \
    "${targs[@]}"
  ;;
qprofile)
  NCU=$(find_ncu)
  [ -n "$NCU" ] || { echo "FAIL no ncu on this machine"; exit 1; }
  qp_args=(--set model.layers=8 --num-requests 1 --input-len 128 --set scheduler.max_num_seqs=1 --no-progress)
  : > "$O/qprofile-wall.txt"
  qargs=()
  for c in dummy ${QPROFILE_SCHEMES:-int4-head-tiled int8-w8a16-head-tiled}; do
    step "llama3-8b-$c, 8 layers, batch-1 decode: each kernel's GPU time and DRAM bytes in a step (ncu, graphs off)"
    # past the load and the prefill (a few thousand launches at most), 800
    # launches of the ~90-launch decode steps
    timeout 200 "$NCU" --clock-control none --cache-control none --csv \
      --metrics gpu__time_duration.sum,dram__bytes_read.sum --launch-skip 3000 --launch-count 800 \
      loom bench "configs/gpu/llama3-8b-$c.yaml" "${qp_args[@]}" --output-len 600 --set backend.cuda_graphs=false \
      > "$O/qprofile-$c.csv" 2> "$O/qprofile-$c.err" || { tail -3 "$O/qprofile-$c.err"; fails=$((fails + 1)); }
    if python3 scripts/gpu/ncu-summary.py "$O/qprofile-$c.csv" --by-grid > "$O/qprofile-$c.txt"; then
      qargs+=(--text "kernels_$c=$O/qprofile-$c.txt")
    else fails=$((fails + 1)); fi
    head -24 "$O/qprofile-$c.txt"
    echo "llama3-8b-$c (8 layers), graphs on: $(timeout 120 loom bench "configs/gpu/llama3-8b-$c.yaml" "${qp_args[@]}" \
      --output-len 256 2>&1 | grep -E 'TPOT p50' | tr -s ' ')" | tee -a "$O/qprofile-wall.txt"
  done
  rec '{hw}-quant-decode-profile' --what "Llama-3-8B shape cut to 8 layers with its LM head, batch-1 decode, bf16 (dummy) and quantized pipelines: each kernel's GPU time and DRAM bytes read in a step (ncu, warm caches, graphs off, a line per kernel and grid) and the step's wall time unprofiled (graphs on)" \
    "${qargs[@]}" --text step_wall="$O/qprofile-wall.txt"
  ;;
tiled)
  step "kernel tests: the tiled layout"
  LOOM_GPU_KERNEL_TESTS=tiled timeout 150 "$LB/tests/gpu/gpu_kernel_tests" > "$O/kernels-tiled.log" 2>&1 \
    || fails=$((fails + 1))
  grep -E '^FAIL' "$O/kernels-tiled.log" | head -20; tail -1 "$O/kernels-tiled.log"
  step "one Llama-3-8B layer's linears per format and row count (gpu_bench --quant)"
  timeout 180 "$LB/bench/gpu/gpu_bench" "$O/quant-linears.json" "$LB/plugins/backend/cuda/loom-backend-cuda.so" \
    --quant > "$O/quant-linears.log" 2>&1 || fails=$((fails + 1))
  grep -E 'x vs bf16' "$O/quant-linears.log" | grep -E 'bf16 |int4|w8a16'
  rec '{hw}-quant-linears' --what "one Llama-3-8B layer's four linears (QKV, O, gate|up, down) per format and row count, us, each GEMM timed alone (chained: M <= 8 in a CUDA graph); *_tiled: quant_layout tiled as dispatched at the entry's commit (the default tiled bound: 256 before commit 92aeb4c, 512 from it); *_tiled_cpa / *_tiled_tma / *_tiled_wide: the wgmma path with cp.async copies, TMA (128-row CTAs), the wide TMA kernel (256-row CTAs) forced; *_tiled_mma: the mma.sync path; *_tiled_deq: dequantized + cuBLASLt; *_tiled_chunks (above the default tiled bound): the kernel in 256-row chunks; 'tiled dequantize': the tiled layout's dequantize alone on the gate|up weight" \
    --json gpu_bench="$O/quant-linears.json"
  step "INT4 with its LM head: row-major (a) vs tiled (b), batch-1 decode, 8 layers"
  timeout 200 loom bench --compare configs/gpu/llama3-8b-int4-head-rows.yaml configs/gpu/llama3-8b-int4-head-tiled.yaml \
    --set model.layers=8 --num-requests 3 --input-len 128 --output-len 256 --set scheduler.max_num_seqs=1 \
    --no-progress --json "$O/int4-tiled-b1.json" > "$O/int4-tiled-b1.txt" 2>&1 || fails=$((fails + 1))
  grep -E "output tokens/s|TPOT p50|TTFT p50" "$O/int4-tiled-b1.txt"
  rec '{hw}-quant-int4-tiled-vs-rows' --what "Llama-3-8B shape cut to 8 layers, INT4 with its LM head: the row-major layout (a) vs quant_layout tiled (b), batch-1 decode" \
    --bench b1_8layers="$O/int4-tiled-b1.json"
  ;;
layout)
  # the whole shape at batch 1, rows (a) vs tiled (b), per format; INT4
  # quantizes the 8B shape on the host at load, twice (~2 minutes each side)
  for s in ${LAYOUT_SCHEMES:-int4-head int8-w8a16-head}; do
    step "Llama-3-8B shape, $s: quant_layout rows (a) vs tiled (b), batch-1 decode"
    timeout 290 loom bench --compare configs/gpu/llama3-8b-$s-rows.yaml configs/gpu/llama3-8b-$s-tiled.yaml \
      --repeat ${LAYOUT_REPEAT:-1} --num-requests 3 --input-len 128 --output-len 256 --set scheduler.max_num_seqs=1 \
      --no-progress --json "$O/layout-$s.json" > "$O/layout-$s.txt" 2>&1 || { fails=$((fails + 1)); tail -3 "$O/layout-$s.txt"; continue; }
    grep -E "output tokens/s|TPOT p50" "$O/layout-$s.txt"
    rec '{hw}-quant-layout-b1' --merge --what "Llama-3-8B shape with its LM head quantized: quant_layout rows (a) vs tiled (b), batch-1 decode (3 requests of 128 in, 256 out)" \
      --bench "$s=$O/layout-$s.json"
  done
  ;;
ep)
  step "kernel tests: mixtures of experts (expert-parallel ranks included)"
  LOOM_GPU_KERNEL_TESTS=moe timeout 240 "$LB/tests/gpu/gpu_kernel_tests" > "$O/kernels-moe.log" 2>&1 \
    || fails=$((fails + 1))
  grep -E '^FAIL' "$O/kernels-moe.log" | head -20; grep -E 'rank [0-9]/|packing|of a rank' "$O/kernels-moe.log" | head -60
  tail -1 "$O/kernels-moe.log"
  step "gpu_tp_test: pp stages and tp over threads on one GPU (MoE: both forms)"
  timeout 300 "$LB/tests/gpu/gpu_tp_test" "$LB/plugins/backend/cuda/loom-backend-cuda.so" \
    "$LB/plugins/executor/tp/loom-executor-tp.so" "$LB/plugins/executor/pp/loom-executor-pp.so" \
    > "$O/tp-test.log" 2>&1 || fails=$((fails + 1))
  grep -E '^FAIL|^SKIP|threads, one GPU' "$O/tp-test.log" | head -60; tail -1 "$O/tp-test.log"
  rec '{hw}-ep-tests' --what "expert parallelism on cuda and tp over the threads communicator on one GPU: the MoE kernel tests (LOOM_GPU_KERNEL_TESTS=moe gpu_kernel_tests) and gpu_tp_test, their logs' last lines" \
    --text kernels_moe="$O/kernels-moe.log" --text gpu_tp_test="$O/tp-test.log"
  ;;
kprofile)
  NCU=$(find_ncu)
  [ -n "$NCU" ] || { echo "FAIL no ncu on this machine"; exit 1; }
  CUDA_SO=$LB/plugins/backend/cuda/loom-backend-cuda.so
  qargs=()
  kre='lc_qtiled_(wg_|tma_)?kernel|lc_ksplit'
  for M in ${KPROFILE_M:-16 64 256}; do
    [ "$M" = none ] && break
    step "tiled W8A16 / INT4 kernels (mma.sync, wgmma) and their K-split reduce at M = $M (ncu --set full, one timed launch a variant and shape)"
    # LOOM_BENCH_REPS=1: one warm-up and one timed launch of each GEMM
    LOOM_BENCH_REPS=1 timeout 420 "$NCU" --set full --import-source no -k regex:"$kre" -f -o "/tmp/qtiled-m$M" \
      "$LB/bench/gpu/gpu_bench" "/tmp/kprof-m$M.json" "$CUDA_SO" --quant-m "$M" > "$O/kprofile-m$M.log" 2>&1 \
      || { fails=$((fails + 1)); tail -3 "$O/kprofile-m$M.log"; }
    "$NCU" -i "/tmp/qtiled-m$M.ncu-rep" --page raw --csv > "$O/qtiled-m$M-raw.csv" 2>> "$O/kprofile-m$M.log" \
      && python3 scripts/gpu/ncu-summary.py --raw "$O/qtiled-m$M-raw.csv" > "$O/qtiled-m$M-summary.txt" \
      && cat "$O/qtiled-m$M-summary.txt" && qargs+=(--text "tiled_m$M=$O/qtiled-m$M-summary.txt") \
      || fails=$((fails + 1))
    step "the same kernels' times as the timing loop sees them (ncu, warm caches, clocks as they run) at M = $M"
    LOOM_BENCH_REPS=1 timeout 240 "$NCU" --clock-control none --cache-control none --csv -k regex:"$kre" \
      --metrics gpu__time_duration.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__throughput.avg.pct_of_peak_sustained_elapsed \
      "$LB/bench/gpu/gpu_bench" "/tmp/kprof-w$M.json" "$CUDA_SO" --quant-m "$M" > "$O/qtiled-warm-m$M.csv" 2>> "$O/kprofile-m$M.log" \
      && python3 scripts/gpu/ncu-summary.py --grid "$O/qtiled-warm-m$M.csv" "$kre" > "$O/qtiled-warm-m$M.txt" \
      && cat "$O/qtiled-warm-m$M.txt" && qargs+=(--text "tiled_times_m$M=$O/qtiled-warm-m$M.txt") \
      || fails=$((fails + 1))
  done
  step "Qwen3-30B-A3B shape (4 layers), batch-1 decode: each kernel's time inside its graph (ncu, warm caches)"
  # batch 1 only (--moe-batch1): the context's prefill, then ~30 decode
  # steps; ncu-summary.py keeps the steps whose kernels are the last one's
  timeout 300 "$NCU" --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv \
    --launch-count 1500 "$LB/bench/gpu/gpu_bench" /tmp/kprof-moe.json "$CUDA_SO" --moe 4 --moe-batch1 \
    --moe-shape qwen3-30b-a3b > "$O/ncu-moe.csv" 2> "$O/ncu-moe.err" || { fails=$((fails + 1)); tail -3 "$O/ncu-moe.err"; }
  python3 scripts/gpu/ncu-summary.py "$O/ncu-moe.csv" --step-kernel lc_embedding_kernel > "$O/ncu-moe-summary.txt" \
    || fails=$((fails + 1))
  head -30 "$O/ncu-moe-summary.txt"
  step "the same step's wall time without the profiler (gpu_bench --moe 4)"
  timeout 200 "$LB/bench/gpu/gpu_bench" "$O/moe-wall.json" "$CUDA_SO" --moe 4 --moe-shape qwen3-30b-a3b 2>&1 \
    | grep -E "decode batch 1 |loaded" | tee "$O/moe-wall.txt"
  tiled_what="the tiled W8A16 / INT4 kernels and the K-split reduce per launch (--set full, each launch alone with flushed caches: duration, speed-of-light shares, occupancy, issue activity, instructions, tensor pipes, stall reasons; tiled_times_m*: durations with warm caches and running clocks, a line per shape in launch order) on one Llama-3-8B layer's linears; "
  [ "${KPROFILE_M:-}" = none ] && tiled_what=""
  rec '{hw}-kernel-profiles' --what "kernels under ncu: ${tiled_what}each kernel of a Qwen3-30B-A3B-shape (4 layers) batch-1 decode step inside its CUDA graph (warm caches) and the step's wall time unprofiled" \
    "${qargs[@]}" --text moe_kernels="$O/ncu-moe-summary.txt" --text moe_wall="$O/moe-wall.txt"
  ;;
pdl-order)
  bool_ab trigger_first pdl ${PDL_CASES:-llama3-8b-int4-head-tiled:model.layers=8 llama3-8b-dummy llama3-8b-dummy@8 \
                                          qwen3-30b-a3b-dummy smollm2-dummy}
  [ ${#bargs[@]} -gt 0 ] && rec '{hw}-pdl-order' --what "backend.trigger_first: every kernel lets the next launch before (a, true) or after (b, false) its griddepcontrol.wait; batch-N decode (N x 2 + 1 requests of 128 in, 256 out, max_num_seqs N), two runs each interleaved, medians; a case is CONFIG[@N][:--set ...]" \
    --text summary="$O/pdl.txt" "${bargs[@]}"
  ;;
param-ab)
  # a default's decision: printed, not recorded (its numbers go into the
  # commit that sets the default, as backend-ab's)
  [ -n "${PARAM_AB_KEY:-}" ] || { echo "FAIL param-ab needs PARAM_AB_KEY (a boolean backend parameter)"; exit 1; }
  bool_ab "$PARAM_AB_KEY" param ${PARAM_AB_CASES:-llama3-8b-int4-head-tiled:model.layers=8}
  ;;
backend-ab)
  # The rest of the build (core, CLI, other plugins) is this tree's for
  # every side. An A/B of one change: its numbers belong in that change's
  # commit message, so nothing is recorded under bench/results.
  olds=$(ls .devpack/old-*-cuda.so.xz 2>/dev/null | sed 's#.*/old-\(.*\)-cuda\.so\.xz#\1#')
  [ -n "$olds" ] || { echo "FAIL no .devpack/old-NAME-cuda.so.xz (scripts/gpu/pack-old-backend.sh REV [NAME])"; exit 1; }
  for n in $olds; do # each old plugin swapped into its own copy of the plugin directory
    rm -rf "/tmp/loom-old-$n"; mkdir -p "/tmp/loom-old-$n" && cp -a "$LB/plugins/." "/tmp/loom-old-$n/"
    xz -dc ".devpack/old-$n-cuda.so.xz" > "/tmp/loom-old-$n/backend/cuda/loom-backend-cuda.so" \
      || { echo "FAIL cannot unpack .devpack/old-$n-cuda.so.xz"; exit 1; }
    echo "old $n: $(cat ".devpack/old-$n.rev" 2>/dev/null || echo '?')"
  done
  if [ -n "${AB_THROUGHPUT:-}" ]; then
    step "bench/throughput.sh $AB_THROUGHPUT, this tree's cuda backend (new) vs $(echo $olds), alternated"
    for r in $(seq 1 "${AB_REPEATS:-2}"); do
      sides="new $olds"; [ $((r % 2)) = 0 ] && sides=$(printf '%s\n' new $olds | tac | xargs)
      for c in $AB_THROUGHPUT; do
        for side in $sides; do
          dir="$LB/plugins"; [ $side != new ] && dir=/tmp/loom-old-$side
          f="$O/abt-$(echo "$c" | tr ':/' '__')-$side-$r"
          LOOM_PLUGIN_PATH=$dir LB=$LB OUT=$f LOOM_RESULTS=$f/results timeout 400 bench/throughput.sh "$c" \
            > "$f.txt" 2>&1 || { fails=$((fails + 1)); tail -3 "$f.txt"; }
          echo "$c $side (round $r): $(grep -E '^\| [^ -]' "$f.txt" | tail -1 | tr -s ' ')"
        done
      done
    done
  else
    bs=${AB_BATCH:-1} # decode batch: 2 bs + 1 requests, bs at a time
    step "batch-$bs decode, this tree's cuda backend (new) vs $(echo $olds), alternated"
    for r in $(seq 1 "${AB_REPEATS:-1}"); do
      for cs in ${AB_CONFIGS:-llama3-8b-dummy llama3-8b-int8-w8a16-head llama3-8b-fp8}; do
        IFS=: read -ra parts <<< "$cs" # CONFIG[:key=value...], e.g. llama3-8b-int4-head:model.layers=8
        c=${parts[0]}
        [ -f "configs/gpu/$c.yaml" ] || { echo "FAIL AB_CONFIGS has '$c': no configs/gpu/$c.yaml"; fails=$((fails + 1)); continue; }
        sargs=(); for kv in "${parts[@]:1}"; do [ -n "$kv" ] && sargs+=(--set "$kv"); done
        name=$(echo "$cs" | tr ':/ =' '___-')
        for side in new $olds; do
          dir="$LB/plugins"; [ $side != new ] && dir=/tmp/loom-old-$side
          f="$O/ab-$name-$side-$r"
          LOOM_PLUGIN_PATH=$dir timeout 200 loom bench configs/gpu/$c.yaml --num-requests $((2 * bs + 1)) --input-len 128 \
            --output-len 256 --set scheduler.max_num_seqs=$bs "${sargs[@]}" --no-progress --json "$f.json" > "$f.txt" 2>&1 \
            || { fails=$((fails + 1)); tail -3 "$f.txt"; }
          echo "$cs $side (round $r): $(grep -E 'TPOT p50' "$f.txt" | tr -s ' ')"
        done
      done
    done
  fi
  ;;
awq)
  # tolerances as stage1's bf16 reference (compare_logprobs.py defaults);
  # greedy: identical, or the first difference at token 16 or later and at
  # a near-tie: the reference's top two logits there within 0.1 (the cuda
  # runs part at gaps of 0.006 and 0.011 on the H100; bf16 arithmetic moves
  # these log-probs by up to ~0.05)
  greedy_cmp() { # reference file, loom's ids, label, summary file
    local line
    line=$(python3 - "$(cat "$1" 2>/dev/null)" "$2" "$3" "$(cat "$(dirname "$1")/ref_margins.txt" 2>/dev/null)" <<'PY'
import sys
r, g, what = sys.argv[1].split(), sys.argv[2].split(), sys.argv[3]
margins = sys.argv[4].split()
k = next((i for i, (a, b) in enumerate(zip(r, g)) if a != b), min(len(r), len(g)))
def gap(i):  # the reference's margin at i, None where missing or not a number
    try:
        return float(margins[i])
    except (IndexError, ValueError):
        return None
tie = gap(k) is not None and 0 <= gap(k) < 0.1  # no margin there: not a near-tie
ok = bool(r) and (r == g or (len(g) == len(r) and k >= 16 and tie))  # no reference: a failure
# where they part: both tokens, and how near a tie the reference had there
part = f" (reference {r[k]}, loom {g[k]}; the reference's logit gap to the next token there {margins[k]})" \
    if k < min(len(r), len(g)) and k < len(margins) else ""
print(f"{'PASS' if ok else 'FAIL'} greedy {what}: {len(g)} tokens, identical for the first {k} of {len(r)}{part}")
sys.exit(0 if ok else 1)
PY
) || fails=$((fails + 1))
    echo "$line" | tee -a "$4"
  }
  # AWQ_SHAPES narrows it (default: tiny llama3-8b)
  for shape in ${AWQ_SHAPES:-tiny llama3-8b}; do
    sum="$O/awq-summary-$shape.txt"; : > "$sum"
    for m in awq gptq gptq_v2; do
      d=/tmp/q-$shape-$m
      step "$m checkpoint, $shape shape (2 layers): transformers reference"
      if ! timeout 300 python3 tests/e2e/hf_llama_reference.py $d --shape $shape --layers 2 --tokens 96 --quant $m \
        --greedy 32 > "$O/$m-$shape-ref.log" 2>&1; then
        echo "FAIL the $m $shape reference: $(tail -1 "$O/$m-$shape-ref.log")" | tee -a "$sum"; fails=$((fails + 1)); continue
      fi
      tail -1 "$O/$m-$shape-ref.log"
      # cuda twice: the tiled layout (the default) and the row-major kernels
      backends="cuda cuda-rows"; [ $shape = tiny ] && backends="cuda cuda-rows cpu"
      for be in $backends; do
        set_q="--set quantizer.plugin=int4 --set quantizer.source=$m --set quantizer.group_size=128"
        [ $be = cuda-rows ] && set_q="$set_q --set backend.quant_layout=rows"
        cfg=configs/gpu/hf-reference.yaml; [ $be = cpu ] && cfg=configs/gpu/hf-reference-cpu.yaml
        LOOM_HF_REF=$d/model timeout 200 "$LB/tests/e2e/engine_tool" score $cfg $d/tokens.txt \
          $set_q > "$O/$m-$shape-$be-logprobs.txt" 2> "$O/$m-$shape-$be.err" || { tail -3 "$O/$m-$shape-$be.err"; }
        line=$(python3 tests/e2e/compare_logprobs.py $d/ref_logprobs.txt "$O/$m-$shape-$be-logprobs.txt") \
          || fails=$((fails + 1))
        echo "$m $shape $be: $line" | tee -a "$sum"
        got=$(LOOM_HF_REF=$d/model timeout 200 "$LB/tests/e2e/engine_tool" greedy-ids $cfg 32 \
          "$(cat $d/prompt.txt)" $set_q 2>> "$O/$m-$shape-$be.err")
        greedy_cmp $d/ref_greedy.txt "$got" "$m $shape $be" "$sum"
      done
      cp $d/ref_logprobs.txt "$O/$m-$shape-ref-logprobs.txt"
      rm -rf $d
    done
  done
  rec '{hw}-awq-gptq-vs-transformers' --merge --what "AWQ / GPTQ / GPTQ-v2 checkpoints through int4: teacher-forced logprobs and 32 greedy tokens vs transformers on the dequantized weights" \
    $(for shape in ${AWQ_SHAPES:-tiny llama3-8b}; do echo "--text $shape=$O/awq-summary-$shape.txt"; done)
  ;;
gemma)
  G3_WHAT="Gemma 3 on cuda against transformers: the real Gemma 3 270M GGUF (bf16 on cuda vs float32 on its dequantized weights; 5 prompts batched, one past the 512-token window, 12 greedy tokens each and their teacher-forced log-probs; one block table and the window-aware cache's 6 groups), a tiny random Gemma 3 and Qwen3 (teacher-forced log-probs, 32 greedy tokens)"
  step "gpu_backend_test: the Gemma 3 / Qwen3 shapes (grouped: 3 and 4 block-table groups)"
  LOOM_GPU_BACKEND_TESTS=gemma timeout 150 "$LB/tests/gpu/gpu_backend_test" "$LB/plugins/backend/cuda/loom-backend-cuda.so" \
    "$LB/plugins/backend/cpu/loom-backend-cpu.so" > "$O/gemma-backend.txt" 2>&1 || fails=$((fails + 1))
  grep -E "^FAIL|kv_groups\(\)" "$O/gemma-backend.txt" | head -20; tail -1 "$O/gemma-backend.txt"
  : > "$O/gemma-summary.txt"
  # the real Gemma 3 270M against transformers' float32 run of it
  # (tests/engine/data/gemma3_reference.json, as test_engine_gemma3.c on the
  # cpu): five prompts batched, one past the 512-token window; 12 greedy
  # tokens each and their teacher-forced log-probs; with one block table and
  # with the window-aware cache's groups
  step "Gemma 3 270M (GGUF at /tmp/gemma3-270m.gguf) vs transformers"
  sum="$O/gemma3-270m-summary.txt"; : > "$sum"
  if gemma3_model; then
    g3=tests/engine/data/gemma3_reference.json
    python3 tests/e2e/check_gemma3_reference.py inputs $g3 /tmp/g3real
    for v in cuda:false cuda-groups:true; do
      what=gemma3-270m-${v%%:*} grouped=${v#*:}
      sets=(--set engine.log_level=info --set backend.kv_groups=$grouped)
      LOOM_GEMMA_MODEL=/tmp/gemma3-270m.gguf timeout 90 "$LB/tests/e2e/engine_tool" greedy-file configs/gpu/gemma3-270m.yaml 12 \
        /tmp/g3real/prompts.txt "${sets[@]}" > "$O/$what-greedy.txt" 2> "$O/$what.err" || tail -3 "$O/$what.err"
      LOOM_GEMMA_MODEL=/tmp/gemma3-270m.gguf timeout 90 "$LB/tests/e2e/engine_tool" score-file configs/gpu/gemma3-270m.yaml \
        /tmp/g3real/tokens.txt "${sets[@]}" > "$O/$what-score.txt" 2>> "$O/$what.err" || tail -3 "$O/$what.err"
      python3 tests/e2e/check_gemma3_reference.py check $g3 "$O/$what-greedy.txt" "$O/$what-score.txt" "$what" \
        | tee -a "$sum"; [ "${PIPESTATUS[0]}" = 0 ] || fails=$((fails + 1))
      # the cuda backend's KV pools line says how many groups the cache took
      groups=$(grep "KV pools" "$O/$what.err" | grep -o "[0-9]* block-table groups\?" | head -1)
      want="1 block-table group"; [ $grouped = true ] && want="6 block-table groups"
      if [ "$groups" = "$want" ]; then echo "PASS $what: the KV layout has $groups" | tee -a "$sum"
      else echo "FAIL $what: the KV layout has '${groups:-no KV pools line}', want $want" | tee -a "$sum"; fails=$((fails + 1)); fi
    done
    rm -rf /tmp/g3real
  else
    echo "FAIL Gemma 3 270M: no model at /tmp/gemma3-270m.gguf (docs/gpu.md, 'Running on a GPU machine')" | tee -a "$sum"
    fails=$((fails + 1))
  fi
  rec '{hw}-gemma3-vs-transformers' --merge --what "$G3_WHAT" --text gemma3-270m="$sum"
  step "Gemma 3 270M shape (dummy bf16): batch-1 decode, 2048-token prefill"
  timeout 100 loom bench configs/gpu/gemma3-270m-dummy.yaml --num-requests 4 --input-len 128 --output-len 256 \
    --set scheduler.max_num_seqs=1 --no-progress --json "$O/gemma3-270m-batch1.json" 2>&1 | grep -E "TPOT p50|output tok" \
    || fails=$((fails + 1))
  timeout 100 loom bench configs/gpu/gemma3-270m-dummy.yaml --num-requests 8 --input-len 2048 --output-len 1 \
    --set scheduler.max_num_seqs=1 --no-progress --json "$O/gemma3-270m-prefill2048.json" 2>&1 | grep -E "TTFT p50|total tok" \
    || fails=$((fails + 1))
  rec '{hw}-gemma3-270m-speed' --what "Gemma 3 270M shape, dummy bf16 on cuda: batch-1 decode (4 requests of 128 + 256 tokens) and 2048-token prefill (8 prompts one at a time)" \
    --bench batch1="$O/gemma3-270m-batch1.json" --bench prefill2048="$O/gemma3-270m-prefill2048.json"
  gemma_ab_both
  # ref DIR TOKENS_CFG WHAT SETS...: score + 32 greedy ids vs DIR's reference
  ref_check() {
    local d=$1 cfg=$2 what=$3; shift 3
    LOOM_HF_REF=$d/model${GGUF_SUFFIX:-} timeout 120 "$LB/tests/e2e/engine_tool" score "$cfg" $d/tokens.txt "$@" \
      > "$O/$what-logprobs.txt" 2> "$O/$what.err" || tail -3 "$O/$what.err"
    python3 tests/e2e/compare_logprobs.py $d/ref_logprobs.txt "$O/$what-logprobs.txt" | sed "s/^/$what: /" \
      | tee -a "$O/gemma-summary.txt"; [ "${PIPESTATUS[0]}" = 0 ] || fails=$((fails + 1))
    LOOM_HF_REF=$d/model${GGUF_SUFFIX:-} timeout 120 "$LB/tests/e2e/engine_tool" greedy-ids "$cfg" 32 \
      "$(cat $d/prompt.txt)" "$@" > "$O/$what-greedy.txt" 2>> "$O/$what.err"
    python3 - $d/ref_greedy.txt "$O/$what-greedy.txt" "$what" <<'PY' | tee -a "$O/gemma-summary.txt"
import sys
r, g = open(sys.argv[1]).read().split(), open(sys.argv[2]).read().split()
k = next((i for i, (a, b) in enumerate(zip(r, g)) if a != b), min(len(r), len(g)))
print(f"{'PASS' if r and r == g else 'INFO'} {sys.argv[3]} greedy: {len(g)} tokens, identical for the first {k} of {len(r)}")
PY
  }
  sed 's/plugin: cuda/plugin: cpu/; /cuda_graphs/d' configs/gpu/hf-gemma3-reference.yaml > /tmp/g3cpu.yaml
  sed 's/plugin: cuda/plugin: cpu/; /cuda_graphs/d' configs/gpu/hf-reference.yaml > /tmp/hfcpu.yaml
  step "transformers: tiny random Gemma 3 (6 layers, window 32) as GGUF"
  if timeout 120 python3 tests/e2e/hf_gemma3_reference.py /tmp/g3ref --layers 6 --window 32 --tokens 128 --greedy 32 \
    > "$O/gemma3-ref.log" 2>&1; then
    tail -1 "$O/gemma3-ref.log"
    GGUF_SUFFIX=.gguf ref_check /tmp/g3ref configs/gpu/hf-gemma3-reference.yaml gemma3-cuda
    GGUF_SUFFIX=.gguf ref_check /tmp/g3ref configs/gpu/hf-gemma3-reference.yaml gemma3-cuda-groups --set backend.kv_groups=true
    GGUF_SUFFIX=.gguf ref_check /tmp/g3ref /tmp/g3cpu.yaml gemma3-cpu
  else
    echo "FAIL the Gemma 3 reference: $(tail -1 "$O/gemma3-ref.log")" | tee -a "$O/gemma-summary.txt"; fails=$((fails + 1))
  fi
  step "transformers: tiny random Qwen3 (4 layers)"
  if timeout 120 python3 tests/e2e/hf_llama_reference.py /tmp/q3ref --shape qwen3-tiny --layers 4 --tokens 128 \
    --greedy 32 > "$O/qwen3-ref.log" 2>&1; then
    ref_check /tmp/q3ref configs/gpu/hf-reference.yaml qwen3-cuda
    ref_check /tmp/q3ref /tmp/hfcpu.yaml qwen3-cpu
  else
    echo "FAIL the Qwen3 reference: $(tail -1 "$O/qwen3-ref.log")" | tee -a "$O/gemma-summary.txt"; fails=$((fails + 1))
  fi
  rm -rf /tmp/g3ref /tmp/q3ref
  rec '{hw}-gemma3-vs-transformers' --merge --what "$G3_WHAT" --text tiny-gemma3-qwen3="$O/gemma-summary.txt"
  ;;
gemma-ab) gemma_ab_both ;;
*) echo "usage: scripts/gpu/gpu-check.sh stage1|stage2|invariant|quant|ppl|offline|spec2|tp|ep|pdl-order|param-ab|backend-ab|awq|kvfp8|profile|qprofile|tprofile|kprofile|throughput|serve|gemma|gemma-ab|tiled|layout" >&2; exit 2 ;;
esac
echo; echo "stage ${1}: $fails failed"
exit $fails
