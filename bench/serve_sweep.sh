#!/usr/bin/env bash
# bench/serve_sweep.sh CONFIG OUTDIR [RATE...] — start `loom serve CONFIG` on a
# free port and run bench/serve_load.py at each request rate (default: 1 2 4 8
# inf), one JSON per rate in OUTDIR plus summary.txt; stops the server after.
# The sweep is then the current figure bench/results/<hw>-serve-<config>.json
# (bench/record.py; SERVE_RESULT names it instead, SERVE_RESULT=none skips it;
# $LOOM_RESULTS moves bench/results).
# Workload: SERVE_N requests (default 64) of SERVE_IN prompt ids (128) and
# SERVE_OUT generated tokens (128); SERVE_SET adds --set overrides and
# SERVE_LOAD_ARGS serve_load.py options (e.g. "--vocab-hi 256"), e.g.
#   SERVE_SET="scheduler.max_num_seqs=64" bench/serve_sweep.sh configs/gpu/llama3-8b-dummy.yaml out 2 8 inf
set -euo pipefail
if [ $# -lt 2 ] || [ "$1" = -h ] || [ "$1" = --help ]; then
  awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; exit $([ $# -lt 2 ] && [ "${1:-}" != -h ] && [ "${1:-}" != --help ] && echo 2 || echo 0)
fi
root=$(cd "$(dirname "$0")/.." && pwd)
cfg=$1 out=$2; shift 2
rates=("$@"); [ ${#rates[@]} -gt 0 ] || rates=(1 2 4 8 inf)
loom=${LOOM:-$(command -v loom || echo "$root/build/cli/loom")}
mkdir -p "$out"
sets=(); for s in ${SERVE_SET:-}; do sets+=(--set "$s"); done
"$loom" serve "$cfg" --port 0 "${sets[@]}" > "$out/serve.out" 2> "$out/serve.log" &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
for _ in $(seq 1800); do grep -q listening "$out/serve.out" 2>/dev/null && break
  kill -0 $pid 2>/dev/null || { echo "serve_sweep: loom serve exited:"; tail -5 "$out/serve.log"; exit 1; }; sleep 0.2; done
port=$(grep -o '[0-9]*$' "$out/serve.out")
echo "serve_sweep: $cfg on port $port" | tee "$out/summary.txt"
for r in "${rates[@]}"; do
  echo "== rate $r req/s" | tee -a "$out/summary.txt"
  python3 "$root/bench/serve_load.py" --url "http://127.0.0.1:$port" --num-requests "${SERVE_N:-64}" \
    --rate "$r" --input-len "${SERVE_IN:-128}" --output-len "${SERVE_OUT:-128}" --no-progress \
    ${SERVE_LOAD_ARGS:-} --json "$out/rate-$r.json" | tee -a "$out/summary.txt" || echo "rate $r: requests failed" | tee -a "$out/summary.txt"
done
kill -TERM $pid; wait $pid
trap - EXIT
name=${SERVE_RESULT:-"{hw}-serve-$(basename "$cfg" .yaml)"}
if [ "$name" != none ]; then
  cpu=(); [ "$("$loom" check "$cfg" "${sets[@]}" 2>/dev/null | awk '/^backend:/ {getline; print $2; exit}')" = cpu ] && cpu=(--cpu)
  env=""; for v in SERVE_N SERVE_IN SERVE_OUT SERVE_SET SERVE_LOAD_ARGS; do [ -n "${!v:-}" ] && env+="$v=\"${!v}\" "; done
  python3 "$root/bench/record.py" "$name" "${cpu[@]}" \
    --what "loom serve $cfg: bench/serve_load.py at each request rate (${SERVE_N:-64} requests of ${SERVE_IN:-128} + ${SERVE_OUT:-128} tokens)" \
    --command "${env}bench/serve_sweep.sh $cfg OUTDIR ${rates[*]}" \
    $(for r in "${rates[@]}"; do [ -s "$out/rate-$r.json" ] && echo "--json rate-$r=$out/rate-$r.json"; done)
fi
