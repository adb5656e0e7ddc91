#!/usr/bin/env bash
# call 3: the second half, SmolLM2 assembled; constraint cost and masked == host answers on cuda
set -u
mkdir -p /tmp/o4/results
exec > >(tee /tmp/o4/log.txt) 2>&1
cp .devmodel/smollm2.part.01 /tmp/ && cat /tmp/smollm2.part.00 /tmp/smollm2.part.01 > /tmp/smollm2.gguf
sha256sum /tmp/smollm2.gguf
mkdir -p /tmp/lc/models && ln -sf /tmp/smollm2.gguf /tmp/lc/models/SmolLM2-135M-Instruct.Q4_1.gguf
export LOOM_CACHE=/tmp/lc
. scripts/gpu/gpu-env.sh
echo "== masked candidates vs whole rows, greedy answers through loom serve"
for mode in true false; do
  "$LB/cli/loom" serve configs/gpu/smollm2.yaml --port 0 --set constraint.plugin=grammar \
     --set engine.device_sampling=$mode > /tmp/o4/serve-$mode.out 2> /tmp/o4/serve-$mode.err &
  pid=$!
  for i in $(seq 1 60); do grep -q "listening on" /tmp/o4/serve-$mode.out && break; sleep 1; done
  base=$(grep -o "http://[^ ]*" /tmp/o4/serve-$mode.out | head -1)
  timeout 300 python3 devrun/serve_same.py "$base" bench/data/people-schema.json > /tmp/o4/answers-$mode.jsonl
  echo "device_sampling=$mode rc=$? $(wc -l < /tmp/o4/answers-$mode.jsonl) answers"
  curl -s "$base/metrics" | grep -E "device_sampled|loom_requests" | head -5
  kill $pid; wait $pid
done
python3 - <<'PY'
import json
a=[json.loads(l) for l in open('/tmp/o4/answers-true.jsonl')]; b=[json.loads(l) for l in open('/tmp/o4/answers-false.jsonl')]
same=sum(x['text']==y['text'] for x,y in zip(a,b))
d=max((abs(p-q) for x,y in zip(a,b) if x['text']==y['text'] for p,q in zip(x['lps'],y['lps'])), default=0)
print(f"masked vs whole: {same}/{len(a)} identical texts, max |dlogprob| {d:.2e}; finishes {[x['finish'] for x in a]}")
print(a[0]['text'][:200])
PY
echo "== constraint cost"
LB=$LB LOOM_RESULTS=/tmp/o4/results OUT_DIR=/tmp/o4/cc timeout 400 bench/constraint_cost.sh configs/gpu/smollm2.yaml
cd /tmp/o4 && tar czf $OUT/all.tgz . && ls -la $OUT
