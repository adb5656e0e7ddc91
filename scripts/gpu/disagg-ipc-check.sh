#!/usr/bin/env bash
# scripts/gpu/disagg-ipc-check.sh [--cfg CFG] [--out DIR] [--connectors "cuda-ipc shm"] [--lens L]
#                                 [--set KEY=VALUE]...
# Disaggregated serving on one GPU against a colocated server (docs/disaggregation.md):
#   1. `loom plugin-test cuda-ipc` (one process: the connector's contract);
#   2. a colocated `loom serve CFG`, and per connector a `--role prefill` and a `--role decode`
#      server with `kv_connector.plugin` set to it, all started at once on the one device;
#   3. scripts/gpu/disagg_compare.py: greedy token-id prompts of varied lengths (one block, a block
#      boundary, several blocks, longer than a prefill chunk), sent concurrently, plus a seeded
#      sample: the decode server's text and logprobs must equal the colocated server's; blocks
#      back at 0 on both sides; hand-over counts and times from /metrics;
#   4. failures: a prompt the prefill server refuses (its max_model_len is set below the decode
#      server's) and a killed prefill server: the client gets HTTP 500 "remote prefill failed: ..."
#      and the decode server keeps serving.
# Everything goes to DIR (default $OUT, else /tmp/disagg-ipc-check): summary.txt, one JSON per
# connector (<connector>.json), the server logs (servers.log). Exit 0 when all of it passed.
# Run from the repository root with `loom` on PATH (. scripts/gpu/gpu-env.sh on the GPU machine).
# On a machine without a GPU: --cfg a cpu pipeline --connectors shm checks the script itself.
set -uo pipefail
cfg=configs/gpu/disagg-cuda-ipc.yaml
out=${OUT:-/tmp/disagg-ipc-check}
conns="cuda-ipc shm"
lens=""
sets=()
while [ $# -gt 0 ]; do
  case $1 in
    --cfg) cfg=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --connectors) conns=$2; shift 2 ;;
    --lens) lens=$2; shift 2 ;;
    --set) sets+=(--set "$2"); shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "disagg-ipc-check: unknown argument $1" >&2; exit 2 ;;
  esac
done
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
summary=$out/summary.txt
: > "$summary"
say() { echo "$*" | tee -a "$summary"; }
fail=0
pids=()
logs=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  for l in "${logs[@]}"; do { echo "===== $l"; tail -n 60 "$l"; } >> "$out/servers.log"; rm -f "$l"; done
  logs=()
  pids=()
}
trap cleanup EXIT
# http URL [BODY]: the response body, then its status on a line of its own (000: no answer); python3,
# not curl, which the GPU image may lack
http() {
  python3 -c '
import sys, urllib.request, urllib.error
url, body = sys.argv[1], (sys.argv[2].encode() if len(sys.argv) > 2 else None)
req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
try:
    with urllib.request.urlopen(req, timeout=60) as r: code, raw = r.status, r.read()
except urllib.error.HTTPError as e: code, raw = e.code, e.read()
except Exception as e: code, raw = 0, str(e).encode()
sys.stdout.write(raw.decode("utf-8", "replace") + "\n%03d\n" % code)' "$@"
}
base_port=$((18400 + RANDOM % 400))
next_port=$base_port
# start NAME ARGS...: a server on the next port; sets $PORT and $PID
start() {
  local name=$1; shift
  PORT=$next_port; next_port=$((next_port + 1))
  local log; log=$(mktemp "/tmp/disagg-$name.XXXXXX.log")
  loom serve "$cfg" --port "$PORT" "${sets[@]}" "$@" > "$log" 2>&1 &
  PID=$!
  pids+=("$PID"); logs+=("$log")
  eval "port_$name=$PORT pid_$name=$PID log_$name=$log"
}
# healthy NAME...: wait (<= ~150 s) until each answers /health
healthy() {
  local n p pid t
  for n in "$@"; do
    eval "p=\$port_$n pid=\$pid_$n"
    for ((t = 0; t < 600; t++)); do
      [ "$(http "http://127.0.0.1:$p/health" | tail -n 1)" = 200 ] && break
      if ! kill -0 "$pid" 2>/dev/null; then
        say "FAIL: server $n exited during start-up:"; eval "tail -n 20 \$log_$n" | tee -a "$summary"; return 1
      fi
      sleep 0.2
    done
    [ $t -lt 600 ] || { say "FAIL: server $n not healthy after 150 s"; return 1; }
    say "server $n healthy on port $p"
  done
}

t_all=$(date +%s.%N)
# --------------------------------------------------------------- 1. contract
if [[ " $conns " == *" cuda-ipc "* ]]; then
  sock=/tmp/loom-kv-pt-$$.sock
  if loom plugin-test cuda-ipc --set path=$sock > "$out/plugin-test.txt" 2>&1; then
    say "ok: loom plugin-test cuda-ipc"
  else
    say "FAIL: loom plugin-test cuda-ipc:"; tail -n 15 "$out/plugin-test.txt" | tee -a "$summary"; fail=1
  fi
fi

# ------------------------------------------------- 2. servers, all at once
t0=$(date +%s.%N)
start colo
names=(colo)
for c in $conns; do
  k=${c//-/_}
  sockset="kv_connector.path=/tmp/loom-kv-check-$k-$$.sock"
  # the shm pair's prefill server holds a shorter context than its decode server: step 4's
  # refused prompt (the decode server accepts it, the prefill engine refuses it)
  extra=()
  [ "$c" = shm ] && extra=(--set engine.max_model_len=3072)
  start "p_$k" --role prefill --set "kv_connector.plugin=$c" --set "$sockset" "${extra[@]}"
  start "d_$k" --role decode --set "kv_connector.plugin=$c" --set "$sockset"
  names+=("p_$k" "d_$k")
done
healthy "${names[@]}" || { say "RESULT: FAIL (start-up)"; exit 1; }
say "all servers healthy in $(python3 -c "import time; print(round(time.time() - $t0, 1))") s"

# --------------------------------------------------------------- 3. compare
for c in $conns; do
  k=${c//-/_}
  eval "pp=\$port_p_$k dp=\$port_d_$k"
  largs=()
  [ -n "$lens" ] && largs=(--lens "$lens")
  [ "$c" = cuda-ipc ] && largs+=(--device-to-device)
  if python3 "$here/disagg_compare.py" --decode "$dp" --prefill "$pp" --colo "$port_colo" --label "$c" \
       "${largs[@]}" --json "$out/$c.json" > "$out/$c.txt" 2>&1; then
    say "ok: $c decode == colocated: $(python3 -c "import json; d = json.load(open('$out/$c.json')); print(f\"{d['matched']}/{d['requests']} requests, max |dlogprob| {d['max_logprob_diff']:.3g}, {d['handovers_prefill']:g} hand-overs, send {d['send_ms_per_handover']} ms + deliver {d['deliver_ms_per_handover']} ms a hand-over ({d['handover_bytes']:g} bytes in all, through host memory {d['host_staged_bytes_prefill']:g} prefill side / {d['host_staged_bytes_decode']:g} decode side), wall {d['wall_s_decode']} s vs colocated {d['wall_s_colo']} s\")")"
    say "   $c hand-overs one at a time: $(python3 -c "import json; d = json.load(open('$out/$c.json')); print('; '.join(f\"{t['prompt_tokens']} tokens {t['mb_per_handover']} MB: send {t['send_ms']} ms ({t['send_gb_per_s']} GB/s) + deliver {t['deliver_ms']} ms\" for t in d['timing_sequential']))")"
  else
    say "FAIL: $c decode != colocated:"; head -n 40 "$out/$c.txt" | tee -a "$summary"; fail=1
  fi
done

# -------------------------------------------------------------- 4. failures
# expect_error PORT BODY WHAT: HTTP 500 naming "remote prefill failed"
expect_error() {
  local r
  r=$(http "http://127.0.0.1:$1/v1/completions" "$2")
  local code=${r##*$'\n'} body=${r%$'\n'*}
  if [ "$code" = 500 ] && [[ $body == *"remote prefill failed"* ]]; then
    say "ok: $3: HTTP $code: $(echo "$body" | python3 -c 'import json,sys; print(json.load(sys.stdin)["error"]["message"])' 2>/dev/null || echo "$body")"
  else
    say "FAIL: $3: HTTP $code, body ${body:0:300}"; fail=1
  fi
}
# still_serving PORT WHAT: /health 200 and a short prompt answered (colocated: a 1-token prompt)
still_serving() {
  local code
  code=$(http "http://127.0.0.1:$1/v1/completions" '{"prompt":[17],"max_tokens":2,"temperature":0}' | tail -n 1)
  if [ "$code" = 200 ]; then say "ok: $2 keeps serving"; else say "FAIL: $2: HTTP $code after the failure"; fail=1; fi
}
long_prompt=$(python3 -c 'import random; r = random.Random(5); print([r.randrange(1, 49000) for _ in range(3500)])')
if [[ " $conns " == *" shm "* ]]; then
  expect_error "$port_d_shm" "{\"prompt\":$long_prompt,\"max_tokens\":4,\"temperature\":0}" \
    "shm: a prompt the prefill engine refuses"
  still_serving "$port_d_shm" "shm decode server"
fi
if [[ " $conns " == *" cuda-ipc "* ]]; then
  kill -9 "$pid_p_cuda_ipc" 2>/dev/null; wait "$pid_p_cuda_ipc" 2>/dev/null
  expect_error "$port_d_cuda_ipc" '{"prompt":[5,6,7,8,9,10,11,12],"max_tokens":4,"temperature":0}' \
    "cuda-ipc: the prefill server killed"
  still_serving "$port_d_cuda_ipc" "cuda-ipc decode server"
fi
for c in $conns; do
  k=${c//-/_}
  eval "dp=\$port_d_$k"
  used=$(http "http://127.0.0.1:$dp/metrics" | awk '$1 == "loom_kv_blocks_used" {print $2}')
  [ "$used" = 0 ] && say "ok: $c decode server holds no block after the failures" ||
    { say "FAIL: $c decode server holds $used blocks after the failures"; fail=1; }
done
cleanup
trap - EXIT
rm -f /tmp/loom-kv-check-*-$$.sock
say "total $(python3 -c "import time; print(round(time.time() - $t_all, 1))") s"
[ $fail = 0 ] && say "RESULT: PASS" || say "RESULT: FAIL"
exit $fail
