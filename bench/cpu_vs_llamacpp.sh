#!/usr/bin/env bash
# bench/cpu_vs_llamacpp.sh [BUILD_DIR] — loom's cpu backend and llama.cpp on
# the same GGUF file side by side: $LOOM_BENCH_MODEL (smollm2, the default,
# or gemma3-270m: scripts/fetch-model.sh's names; its pipeline is
# configs/default.yaml or configs/gemma3-270m.yaml; or qwen3-moe-cut: a
# mixture of experts at Qwen3-30B-A3B's widths cut to 4 layers, Q4_K blocks
# with random values, written once by bench/make_moe_gguf.py), or the file
# $LOOM_TEST_MODEL on the default pipeline (not for qwen3-moe-cut): batch-1
# decode (llama-bench tg64; loom: 64 tokens after a 16-token prompt,
# 1 / TPOT p50) and prefill (llama-bench pp512; loom: a
# 512-token prompt, 512 / TTFT), at 1 thread and at all cores, the two
# engines interleaved in every repeat ($REPEATS, default 3; medians), next
# to the byte roofline of the file's own weights (linear weights + LM head
# as stored, read once a token — of stacked experts the share a token
# chooses — over memcpy bandwidth measured in the same run). Writes
# bench/results/cpu-$LOOM_BENCH_MODEL-vs-llamacpp.json (bench/record.py;
# $LOOM_RESULTS moves it).
#
# llama.cpp: the copy vendored in the llama-cpp-python sdist
# ($LLAMACPP_PY_VERSION, default 0.3.36), fetched with `pip download
# --no-binary :all:` and built once (CPU only, GGML_NATIVE, just
# llama-bench) under $LOOM_LLAMACPP_DIR (default ~/.cache/loom/llamacpp).
# Then decode at long context, all cores: llama-bench tg64 at depth D
# (-d: D tokens in the cache first) against loom's 64 tokens after a
# D-token prompt, for D in $DEPTHS (default 3000 7000). Both keep the KV
# cache in f16 (their defaults).
# Other work on the machine skews both engines alike: compare the ratios
# (per repeat, the two engines back to back: *_paired, and their median).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
B=${1:-$root/build}
name=${LOOM_BENCH_MODEL:-smollm2}
case $name in
  smollm2) cfg=$root/configs/default.yaml ;;
  gemma3-270m) cfg=$root/configs/gemma3-270m.yaml ;;
  qwen3-moe-cut) cfg=$root/configs/default.yaml ;;
  *) echo "cpu_vs_llamacpp.sh: LOOM_BENCH_MODEL=$name: smollm2, gemma3-270m or qwen3-moe-cut" >&2; exit 2 ;;
esac
ver=${LLAMACPP_PY_VERSION:-0.3.36}
dir=${LOOM_LLAMACPP_DIR:-${LOOM_CACHE:-$HOME/.cache/loom}/llamacpp}
reps=${REPEATS:-3}
depths=${DEPTHS:-3000 7000}
all=$(nproc)
# llama.cpp's AMX matmul (ggml_backend_amx_mul_mat, compiled in by
# GGML_NATIVE where the CPU has AMX) dies on its first ldtilecfg on the
# Sapphire Rapids machines here (a general protection fault, permission
# granted or not): build it without AMX there, so its AVX-512 kernels run
amx=""
grep -qw amx_tile /proc/cpuinfo && amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
bdir=$dir/build-$ver${amx:+-noamx}
lb=$bdir/bin/llama-bench

# the table at the end reads the file with gguf-py and measures memcpy
# bandwidth with numpy: say so now, not after minutes of benchmarks
python3 -c 'import numpy' 2>/dev/null || {
  echo "cpu_vs_llamacpp.sh: python3 has no numpy (pip install numpy)" >&2
  exit 1
}

if [ ! -x "$lb" ]; then
  mkdir -p "$dir"
  sdist=$dir/llama_cpp_python-$ver.tar.gz
  [ -f "$sdist" ] || pip download --no-binary :all: --no-deps "llama-cpp-python==$ver" -d "$dir"
  tar -xzf "$sdist" -C "$dir"
  src=$dir/llama_cpp_python-$ver/vendor/llama.cpp
  cmake -S "$src" -B "$bdir" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DCMAKE_C_FLAGS="$amx" -DCMAKE_CXX_FLAGS="$amx" \
    -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=OFF >/dev/null
  cmake --build "$bdir" --target llama-bench -j "$all"
fi
gguf_py=$dir/llama_cpp_python-$ver/vendor/llama.cpp/gguf-py
if [ "$name" = qwen3-moe-cut ]; then
  # always the generated file (not $LOOM_TEST_MODEL, which names the default
  # model in test runs); its writer needs llama.cpp's gguf-py, fetched above
  model=${LOOM_CACHE:-$HOME/.cache/loom}/models/random-qwen3moe-4l-q4_k.gguf
  if [ ! -f "$model" ]; then
    tok=$("$root/scripts/fetch-model.sh" smollm2)
    PYTHONPATH=$gguf_py python3 "$root/bench/make_moe_gguf.py" "$model.part" --tokenizer "$tok" \
      --layers 4 --type q4_k
    mv "$model.part" "$model"
  fi
else
  model=${LOOM_TEST_MODEL:-$("$root/scripts/fetch-model.sh" "$name")}
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
loom=$B/cli/loom

for r in $(seq 1 "$reps"); do
  for t in 1 "$all"; do
    echo "repeat $r, $t thread(s)" >&2
    "$lb" -m "$model" -t "$t" -p 512 -n 64 -r 1 -o json >"$tmp/llama-$t-$r.json"
    "$loom" bench "$cfg" --set "model.path=$model" --set engine.threads="$t" --num-requests 1 \
      --input-len 16 --output-len 64 --warmup 1 --no-progress --json "$tmp/loom-tg-$t-$r.json" >/dev/null
    "$loom" bench "$cfg" --set "model.path=$model" --set engine.threads="$t" --num-requests 1 \
      --input-len 512 --output-len 1 --warmup 1 --no-progress --json "$tmp/loom-pp-$t-$r.json" >/dev/null
  done
  for d in $depths; do
    echo "repeat $r, depth $d" >&2
    "$lb" -m "$model" -t "$all" -p 0 -n 64 -d "$d" -r 1 -o json >"$tmp/llama-d$d-$r.json"
    "$loom" bench "$cfg" --set "model.path=$model" --set engine.threads="$all" --num-requests 1 \
      --input-len "$d" --output-len 64 --no-progress --json "$tmp/loom-d$d-$r.json" >/dev/null
  done
done

# the roofline's two figures: bytes a decode step streams, and memcpy bandwidth
python3 - "$model" "$tmp" "$reps" "$all" "$gguf_py" "$depths" \
  >"$tmp/table.json" <<'EOF'
import json, statistics, sys, threading, time
model, tmp, reps, nall, gguf_py = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
depths = [int(d) for d in sys.argv[6].split()]
sys.path.insert(0, gguf_py)
import gguf
import numpy as np

# every 2-D weight of the file as stored, except the embedding table (one
# row a token) unless it is also the LM head (tied: no output.weight), and
# of the stacked experts (3-D) the share a token uses: expert_used_count of
# expert_count
reader = gguf.GGUFReader(model)
tensors = reader.tensors
names = {t.name for t in tensors}
arch = reader.fields["general.architecture"].contents()
meta = lambda k: reader.fields[f"{arch}.{k}"].contents() if f"{arch}.{k}" in reader.fields else None
used = (meta("expert_used_count") or 0) / (meta("expert_count") or 1)
step = sum(int(t.n_bytes) for t in tensors
           if len(t.shape) == 2 and (t.name != "token_embd.weight" or "output.weight" not in names))
step += round(used * sum(int(t.n_bytes) for t in tensors if len(t.shape) == 3 and "_exps" in t.name))

def copy_bw(threads, mib=512):
    a, b = np.ones(mib << 18, np.float32), np.empty(mib << 18, np.float32)
    parts = [(a[i::threads], b[i::threads]) for i in range(threads)] if threads > 1 else [(a, b)]
    best = 0.0
    for _ in range(5):
        t0 = time.perf_counter()
        th = [threading.Thread(target=np.copyto, args=(d, s)) for s, d in parts]
        [x.start() for x in th]
        [x.join() for x in th]
        best = max(best, 2 * a.nbytes / (time.perf_counter() - t0))
    return best

bw = max(copy_bw(1), copy_bw(nall))
roof = bw / step
out = {"bytes_per_token": step, "copy_bw_GB_s": round(bw / 1e9, 2), "roofline_tok_s": round(roof, 1)}
for t in sorted({1, nall}):
    row = {}
    for eng in ("llama", "loom"):
        tg, pp = [], []
        for r in range(1, reps + 1):
            if eng == "llama":
                for e in json.load(open(f"{tmp}/llama-{t}-{r}.json")):
                    (tg if e["n_gen"] > 0 else pp).append(e["avg_ts"])
            else:
                a = json.load(open(f"{tmp}/loom-tg-{t}-{r}.json"))["a_results"]
                tg.append(1000.0 / a["TPOT_p50_ms"])
                a = json.load(open(f"{tmp}/loom-pp-{t}-{r}.json"))["a_results"]
                pp.append(512 * 1000.0 / a["TTFT_p50_ms"])
        row[eng] = {"decode_tok_s": round(statistics.median(tg), 1),
                    "prefill512_tok_s": round(statistics.median(pp), 1),
                    "decode_share_of_roofline": round(statistics.median(tg) / roof, 3),
                    "decode_runs": [round(v, 1) for v in tg], "prefill_runs": [round(v, 1) for v in pp]}
    row["loom_over_llama_decode"] = round(row["loom"]["decode_tok_s"] / row["llama"]["decode_tok_s"], 3)
    row["loom_over_llama_prefill"] = round(row["loom"]["prefill512_tok_s"] / row["llama"]["prefill512_tok_s"], 3)
    # each repeat's two engines ran back to back: their ratio shares that
    # moment's load, so the median of the paired ratios is the steadier figure
    for what, key in (("decode", "decode_runs"), ("prefill", "prefill_runs")):
        pr = [lo / ll for lo, ll in zip(row["loom"][key], row["llama"][key])]
        row[f"loom_over_llama_{what}_paired"] = [round(v, 3) for v in pr]
        row[f"loom_over_llama_{what}_paired_median"] = round(statistics.median(pr), 3)
    out[f"threads_{t}"] = row
for d in depths:
    ll = [json.load(open(f"{tmp}/llama-d{d}-{r}.json"))[0]["avg_ts"] for r in range(1, reps + 1)]
    lo = [1000.0 / json.load(open(f"{tmp}/loom-d{d}-{r}.json"))["a_results"]["TPOT_p50_ms"]
          for r in range(1, reps + 1)]
    pr = [a / b for a, b in zip(lo, ll)]
    out[f"depth_{d}_threads_{nall}"] = {
        "llama_decode_tok_s": round(statistics.median(ll), 1), "loom_decode_tok_s": round(statistics.median(lo), 1),
        "llama_runs": [round(v, 1) for v in ll], "loom_runs": [round(v, 1) for v in lo],
        "loom_over_llama_decode_paired": [round(v, 3) for v in pr],
        "loom_over_llama_decode_paired_median": round(statistics.median(pr), 3)}
json.dump(out, sys.stdout, indent=1)
EOF
cat "$tmp/table.json"
llama_commit=$(sed -n 's/.*"build_commit": "\([^"]*\)".*/\1/p' "$tmp/llama-1-1.json" | head -1)
python3 "$root/bench/record.py" "cpu-$name-vs-llamacpp" --cpu \
  --what "loom cpu backend ($(basename "$cfg"): GGUF blocks as stored, q8 activations) vs llama.cpp (llama-cpp-python $ver sdist, commit ${llama_commit:-?}, llama-bench, CPU build) on $(basename "$model"): batch-1 decode (tg64 / 64 tokens after 16) and prefill (pp512), 1 and $all threads, and decode at depths $depths ($all threads: tg64 -d D / 64 tokens after a D-token prompt), interleaved, medians of $reps; roofline = memcpy bandwidth / bytes of the file's linear weights + LM head (experts: the used share)" \
  --command "LOOM_BENCH_MODEL=$name bench/cpu_vs_llamacpp.sh" --json table="$tmp/table.json" \
  --value load_average_before="$load_before" --value load_average_after="$(cut -d' ' -f1-3 /proc/loadavg)"
