#!/usr/bin/env bash
# bench/constraint_cost.sh [CONFIG] — what a decoding constraint costs a
# decode step: N requests (default 64) decoding together, OUT_LEN tokens each
# (default 1024: a run of 256 steps lasts ~0.4 s on an H200, where one
# stall of the host moves TPOT by a few percent),
# with no constraint (EOS ignored), held to bench/data/people-schema.json
# (60 people: longer than OUT_LEN tokens, so every request runs its OUT_LEN tokens
# and the batch stays whole), the same with masks cached by whole parse states
# only (plain: constraint.mask_cut_keys=false, the path before cut keys), and
# held to it with whole rows to the host (engine.device_sampling=false: the
# mask applied by the sampler, the pre-2.4 path). Greedy. Runs interleaved,
# REPEAT rounds; one JSON,
# $LOOM_RESULTS/<hw>-constraint-cost-smollm2.json (bench/record.py).
#
#   CONFIG    a SmolLM2 pipeline (default configs/gpu/smollm2.yaml: the real
#             tokenizer is needed; the grammar constraint is added with --set)
# Prints each constrained run's TPOT p50 and mean decode step over those of
# the unconstrained run before it in the same round; a run whose batch did
# not stay whole (a document ended early) is an error.
# Environment: LB (build dir, default build), N (64), IN (128), OUT_LEN (1024),
#   REPEAT (2), MODES (default "free masked plain host"), OUT_DIR (raw JSON
#   and logs, default /tmp/out/constraint).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
LB=${LB:-build}
CFG=${1:-configs/gpu/smollm2.yaml}
N=${N:-64}; IN=${IN:-128}; OUT_LEN=${OUT_LEN:-1024}; REPEAT=${REPEAT:-2}
MODES=${MODES:-free masked plain host}
O=${OUT_DIR:-/tmp/out/constraint}
mkdir -p "$O"
common=(--num-requests "$N" --input-len "$IN" --output-len "$OUT_LEN" --warmup 8 --no-progress
        --set constraint.plugin=grammar --set "scheduler.max_num_seqs=$N" --set engine.log_level=info)
schema=(--constraint json_schema --constraint-text @bench/data/people-schema.json)
declare -A args=([free]="" [masked]="${schema[*]}" [plain]="${schema[*]} --set constraint.mask_cut_keys=false"
                 [host]="${schema[*]} --set engine.device_sampling=false")
for k in $MODES; do [ -n "${args[$k]+x}" ] || { echo "constraint_cost: unknown mode '$k' (free masked plain host)"; exit 2; }; done
for r in $(seq 1 "$REPEAT"); do
  for k in $MODES; do
    # shellcheck disable=SC2086
    "$LB/cli/loom" bench "$CFG" "${common[@]}" ${args[$k]} --json "$O/$k-$r.json" > "$O/$k-$r.log" 2>&1 \
      || { echo "constraint_cost: $k run $r failed:"; tail -5 "$O/$k-$r.log"; exit 1; }
    echo "$k run $r: $(grep -E 'TPOT p50' "$O/$k-$r.log")  $(grep -E 'output tokens/s' "$O/$k-$r.log")"
    # where a masked step's time goes: the masks beside the GPU, the matchers
    # after it, and (cuda) how many steps found the GPU done before the masks
    grep -E 'constraint:|decode  |waiting for the GPU|constraint masks in' "$O/$k-$r.log" | sed 's/^ */    /' || true
  done
  python3 - "$O" "$r" "$N" "$OUT_LEN" $MODES <<'PY'
import json, sys
out, r, n, out_len, modes = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5:]
def load(k):
    a = json.load(open(f"{out}/{k}-{r}.json"))["a_results"]
    if a["output_tokens"] != n * out_len:
        sys.exit(f"constraint_cost: {k} run {r} wrote {a['output_tokens']} tokens, not {n} x {out_len}: "
                 "the batch did not stay whole, the comparison is void")
    d = a["steps_by_kind"]["decode"]
    return a["TPOT_p50_ms"], d["seconds"] / d["steps"] * 1e3
if "free" in modes:
    tf, df = load("free")
    for k in modes:
        if k != "free":
            t, d = load(k)
            print(f"round {r}: {k} / free  TPOT p50 {t:.3f} / {tf:.3f} ms = {t / tf:.3f}x, "
                  f"decode step {d:.3f} / {df:.3f} ms = {d / df:.3f}x")
PY
done
recs=()
for k in $MODES; do for r in $(seq 1 "$REPEAT"); do recs+=(--bench "$k-$r=$O/$k-$r.json"); done; done
python3 bench/record.py '{hw}-constraint-cost-smollm2' "${recs[@]}" \
  --what "decode with a JSON-schema constraint vs none: $N requests x $IN in / $OUT_LEN out, greedy; free = no constraint, masked = masks computed while the GPU runs and applied in the device top-k (cut keys), plain = the same with masks cached by whole parse states only (constraint.mask_cut_keys=false), host = whole rows masked by the sampler" \
  --command "bench/constraint_cost.sh $CFG (N=$N IN=$IN OUT_LEN=$OUT_LEN REPEAT=$REPEAT MODES='$MODES')"
