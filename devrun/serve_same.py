# Greedy json_schema answers from a running loom serve: one line of JSON per prompt.
import json, sys, urllib.request, concurrent.futures as cf
base, schema_path = sys.argv[1], sys.argv[2]
schema = json.load(open(schema_path))
prompts = [f"List people {i}: write them as JSON." for i in range(12)]
def ask(p):
    body = {"messages": [{"role": "user", "content": p}], "max_tokens": 120, "temperature": 0,
            "logprobs": True, "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}}
    req = urllib.request.Request(base + "/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    r = json.load(urllib.request.urlopen(req, timeout=300))
    c = r["choices"][0]
    return {"text": c["message"]["content"], "finish": c["finish_reason"],
            "lps": [t["logprob"] for t in c["logprobs"]["content"]]}
with cf.ThreadPoolExecutor(12) as ex:
    for out in ex.map(ask, prompts): print(json.dumps(out))
