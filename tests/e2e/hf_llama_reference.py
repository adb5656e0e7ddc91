#!/usr/bin/env python3
"""Independent reference for the CUDA backend: a random-weight Llama built by
Hugging Face transformers, saved as a safetensors checkpoint that loom loads,
and transformers' own teacher-forced log-probabilities for a token sequence.

    hf_llama_reference.py OUT_DIR [--layers N] [--shape llama3-8b|tiny] [--tokens N]

Writes OUT_DIR/model/ (config.json + model.safetensors, bf16),
OUT_DIR/tokens.txt and OUT_DIR/ref_logprobs.txt (float32 from the bf16
model on the GPU; line i = log p(token_i | tokens_<i), line 0 = 0) and
OUT_DIR/ref_argmax.txt (the argmax at each position).
"""
import argparse
import os

import torch
from transformers import LlamaConfig, LlamaForCausalLM

SHAPES = {
    # Llama-3-8B widths; depth set by --layers to keep the run short.
    "llama3-8b": dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                      num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0,
                      max_position_embeddings=8192, rms_norm_eps=1e-5),
    "tiny": dict(hidden_size=256, intermediate_size=512, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=1000, rope_theta=10000.0,
                 max_position_embeddings=2048, rms_norm_eps=1e-5),
}

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("--layers", type=int, default=4)
ap.add_argument("--shape", default="llama3-8b", choices=sorted(SHAPES))
ap.add_argument("--tokens", type=int, default=96)
ap.add_argument("--seed", type=int, default=1234)
a = ap.parse_args()

torch.manual_seed(a.seed)
cfg = LlamaConfig(num_hidden_layers=a.layers, tie_word_embeddings=False, torch_dtype="bfloat16",
                  **SHAPES[a.shape])
with torch.device("cuda"):
    model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    # Default init gives near-uniform logits; scale up so the test means something.
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.02 if "embed" in n else 1.0 / p.shape[1] ** 0.5)
os.makedirs(a.out, exist_ok=True)
model.save_pretrained(os.path.join(a.out, "model"), safe_serialization=True)

g = torch.Generator().manual_seed(a.seed + 1)
ids = torch.randint(100, cfg.vocab_size, (1, a.tokens), generator=g)
with torch.no_grad():
    logits = model(ids.cuda()).logits.float()[0]
lp = torch.log_softmax(logits, dim=-1)
ref = [0.0] + [lp[i, ids[0, i + 1]].item() for i in range(a.tokens - 1)]
with open(os.path.join(a.out, "tokens.txt"), "w") as f:
    f.write(" ".join(str(int(t)) for t in ids[0]) + "\n")
with open(os.path.join(a.out, "ref_logprobs.txt"), "w") as f:
    f.write("\n".join(f"{v:.6f}" for v in ref) + "\n")
with open(os.path.join(a.out, "ref_argmax.txt"), "w") as f:
    f.write(" ".join(str(int(t)) for t in logits.argmax(-1)) + "\n")
print(f"wrote {a.out}: {a.shape} x {a.layers} layers, {a.tokens} tokens")
