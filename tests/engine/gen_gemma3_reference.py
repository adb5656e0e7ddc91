#!/usr/bin/env python3
"""Reference greedy tokens and log-probabilities of Gemma 3 270M (Q4_K_M
GGUF, scripts/fetch-model.sh gemma3-270m) from Hugging Face transformers,
for tests/engine/test_engine_gemma3.c.

transformers reads the GGUF itself (gguf_file=...: every weight dequantized
to float32, its Gemma3TensorProcessor taking back the +1 llama.cpp's
converter added to the norm weights) and runs its own Gemma3ForCausalLM in
float32 on the CPU: an implementation independent of loom's loader and
kernels. For each prompt it writes the prompt's ids (transformers'
tokenizer built from the same GGUF, BOS first), then N greedy steps: the
argmax token and its log-probability log_softmax(logits)[token], and the
runner-up with its log-probability. One prompt
is longer than the 512-token sliding window, so the local layers' window
decides its answer.

    pip install torch transformers accelerate gguf sentencepiece
    python3 tests/engine/gen_gemma3_reference.py $(scripts/fetch-model.sh gemma3-270m)

Writes tests/engine/data/gemma3_reference.json. Deterministic (greedy,
float32, one thread).
"""
import json
import os
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "gemma3_reference.json")
STEPS = 12

LONG = ("The river rises in the hills north of the town and runs south through fields of wheat and barley. "
        "Every spring the snow melts and the water climbs the stone banks. ") * 18 + "In the summer the river"

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "Once upon a time, in a small village by the sea,",
    "1, 2, 3, 5, 8, 13,",
    LONG,
]


def main():
    path = sys.argv[1]
    torch.set_num_threads(1)
    d, f = os.path.dirname(path), os.path.basename(path)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).eval()
    cases = []
    for text in PROMPTS:
        ids = tok(text).input_ids
        seq = list(ids)
        greedy, logprobs, alt, alt_logprobs = [], [], [], []
        with torch.no_grad():
            for _ in range(STEPS):
                logits = model(torch.tensor([seq])).logits[0, -1].double()
                lp = torch.log_softmax(logits, -1)
                top2 = torch.topk(lp, 2)
                t = int(top2.indices[0])
                greedy.append(t)
                logprobs.append(float(lp[t]))
                # the runner-up: a test can tell a near-tie from a wrong token
                alt.append(int(top2.indices[1]))
                alt_logprobs.append(float(top2.values[1]))
                seq.append(t)
                print(f"{len(ids)} prompt tokens, step {len(greedy)}: {t} {lp[t]:.5f} "
                      f"margin {logprobs[-1] - alt_logprobs[-1]:.4f}", file=sys.stderr)
        cases.append({"prompt": text, "prompt_ids": ids, "greedy_ids": greedy, "greedy_logprobs": logprobs,
                      "alt_ids": alt, "alt_logprobs": alt_logprobs})
    with open(OUT, "w") as fh:
        json.dump({"model": "gemma-3-270m-q4_k_m.gguf", "reference": "transformers Gemma3ForCausalLM, float32",
                   "cases": cases}, fh, indent=1)
        fh.write("\n")


if __name__ == "__main__":
    main()
