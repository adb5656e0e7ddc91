#!/usr/bin/env python3
"""Independent reference for the CUDA backend: a random-weight Llama built by
Hugging Face transformers, saved as a safetensors checkpoint that loom loads,
and transformers' own teacher-forced log-probabilities for a token sequence.

    hf_llama_reference.py OUT_DIR [--layers N] [--shape llama3-8b|tiny|qwen3-tiny] [--tokens N]
                          [--quant awq|gptq|gptq_v2 [--group G] [--greedy N]] [--device D]

--shape qwen3-tiny: a Qwen3 (Qwen3ForCausalLM: QK-norm, head_dim 128 apart
from hidden / heads) instead of a Llama; everything else alike.

Writes OUT_DIR/model/ (config.json + model.safetensors, bf16),
OUT_DIR/tokens.txt and OUT_DIR/ref_logprobs.txt (float32 from the bf16
model on the GPU; line i = log p(token_i | tokens_<i), line 0 = 0) and
OUT_DIR/ref_argmax.txt (the argmax at each position).

--quant: the decoder's seven linears of every layer are quantized to 4 bits
(asymmetric, groups of G inputs, f16 scales, AutoAWQ's zero-point formula)
and written packed as the named method stores them — AutoAWQ GEMM
(qweight (in, out/8), nibble order [0,2,4,6,1,3,5,7]), AutoGPTQ
(qweight (in/8, out), qzeros storing zero - 1, g_idx) or GPTQ v2 (the zero
itself) — with transformers' quantization_config in config.json. The
packers here are written from the formats' descriptions (a third
implementation, beside loom's awq_gptq.c and the C test's). The reference
is the same transformers model with the dequantized weights, in float32.
--greedy N: also OUT_DIR/prompt.txt (the first 16 tokens) and
OUT_DIR/ref_greedy.txt (the reference's N greedy tokens after them).
"""
import argparse
import json
import os

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from hf_reference_io import write_greedy, write_teacher_forced

SHAPES = {
    # Llama-3-8B widths; depth set by --layers to keep the run short.
    "llama3-8b": dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                      num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0,
                      max_position_embeddings=8192, rms_norm_eps=1e-5),
    "tiny": dict(hidden_size=256, intermediate_size=512, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=1000, rope_theta=10000.0,
                 max_position_embeddings=2048, rms_norm_eps=1e-5),
    # Qwen3: 4 x 128 query dims over a 256-wide residual, GQA 2
    "qwen3-tiny": dict(hidden_size=256, intermediate_size=768, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=128, vocab_size=1000, rope_theta=1000000.0,
                       max_position_embeddings=2048, rms_norm_eps=1e-6),
}

PROJS = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
         "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # AutoAWQ GEMM: nibble j of a word holds output 8i + AWQ_ORDER[j]


def quantize4(w, group):
    """w (out, in) float32 -> codes (out, in) int 0..15, zeros (out, in/g) int,
    scales (out, in/g) f16; AutoAWQ's asymmetric formula: scale = (max - min) / 15,
    zero = clamp(round(-min / scale), 0, 15), q = clamp(round(w / scale) + zero, 0, 15)."""
    n, k = w.shape
    wg = w.reshape(n, k // group, group)
    lo, hi = wg.amin(-1), wg.amax(-1)
    scale = ((hi - lo).clamp(min=1e-5) / 15).half()
    s = scale.float()
    zero = (-lo / s).round().clamp(0, 15)
    q = ((wg / s[..., None]).round() + zero[..., None]).clamp(0, 15)
    return q.reshape(n, k).to(torch.int64), zero.to(torch.int64), scale


def pack_words(nib):
    """(..., 8) nibbles -> (...) int32 words, nibble j at bits 4j."""
    w = torch.zeros(nib.shape[:-1], dtype=torch.int64, device=nib.device)
    for j in range(8):
        w |= (nib[..., j] & 15) << (4 * j)
    return (w - ((w >> 31) << 32)).to(torch.int32)  # two's complement of bit 31


def pack_linear(q, zero, scale, method, group):
    """The tensors AutoAWQ / AutoGPTQ store for one (out n, in k) linear."""
    n, k = q.shape
    if method == "awq":
        # qweight (k, n/8) and qzeros (k/g, n/8): outputs in groups of 8, interleaved
        qt = q.t().reshape(k, n // 8, 8)[..., AWQ_ORDER]
        zt = zero.t().reshape(k // group, n // 8, 8)[..., AWQ_ORDER]
        return {"qweight": pack_words(qt), "qzeros": pack_words(zt), "scales": scale.t().contiguous()}
    # GPTQ: qweight (k/8, n), inputs 8i..8i+7 of output c in word [i, c]
    qw = pack_words(q.t().reshape(k // 8, 8, n).permute(0, 2, 1))
    zs = zero.t() - (1 if method == "gptq" else 0)  # v1 stores zero - 1 (wrapping 0 to 15)
    qz = pack_words(zs.reshape(k // group, n // 8, 8))
    gidx = (torch.arange(k, device=q.device) // group).to(torch.int32)
    return {"qweight": qw, "qzeros": qz, "scales": scale.t().contiguous(), "g_idx": gidx}


def write_quantized(model, cfg, out, method, group):
    """Quantize the decoder's linears in place (the model keeps the dequantized
    weights) and write the packed checkpoint to out/."""
    from safetensors.torch import save_file

    tensors = {}
    with torch.no_grad():
        for name, p in model.state_dict().items():
            if not any(name.endswith(pr + ".weight") for pr in PROJS):
                tensors[name] = p.detach().to(torch.bfloat16).cpu().contiguous()
        for li, layer in enumerate(model.model.layers):
            for pr in PROJS:
                lin = layer.get_submodule(pr)
                q, zero, scale = quantize4(lin.weight.float(), group)
                g = torch.arange(q.shape[1], device=q.device) // group
                deq = (q - zero[:, g]).float() * scale.float()[:, g]
                lin.weight.data = deq.to(lin.weight.device)  # float32 kept for the reference
                for suffix, t in pack_linear(q, zero, scale, method, group).items():
                    tensors[f"model.layers.{li}.{pr}.{suffix}"] = t.cpu().contiguous()
    os.makedirs(out, exist_ok=True)
    save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    c = cfg.to_dict()
    c["torch_dtype"] = "bfloat16"
    if method == "awq":
        c["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": group,
                                    "version": "gemm", "zero_point": True}
    else:
        c["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": group,
                                    "desc_act": False, "sym": False, "checkpoint_format": method}
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(c, f, indent=2)


ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("--layers", type=int, default=4)
ap.add_argument("--shape", default="llama3-8b", choices=sorted(SHAPES))
ap.add_argument("--tokens", type=int, default=96)
ap.add_argument("--seed", type=int, default=1234)
ap.add_argument("--quant", choices=["awq", "gptq", "gptq_v2"])
ap.add_argument("--group", type=int, default=128)
ap.add_argument("--greedy", type=int, default=0)
ap.add_argument("--device", default="cuda")
a = ap.parse_args()
dev = a.device

torch.manual_seed(a.seed)
qwen3 = a.shape.startswith("qwen3")
Config, Model = (Qwen3Config, Qwen3ForCausalLM) if qwen3 else (LlamaConfig, LlamaForCausalLM)
cfg = Config(num_hidden_layers=a.layers, tie_word_embeddings=False, torch_dtype="bfloat16", **SHAPES[a.shape])
with torch.device(dev):
    model = Model(cfg).to(torch.bfloat16).eval()
    # Default init gives near-uniform logits; scale up so the test means something.
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.02 if "embed" in n else 1.0 / p.shape[1] ** 0.5)
            elif qwen3 and "norm" in n:  # QK-norm / RMSNorm weights away from 1: a wrong one shows
                p.uniform_(0.5, 1.5)
os.makedirs(a.out, exist_ok=True)
if a.quant:
    write_quantized(model, cfg, os.path.join(a.out, "model"), a.quant, a.group)
    model = model.float()  # the reference: dequantized weights, float32 arithmetic
else:
    model.save_pretrained(os.path.join(a.out, "model"), safe_serialization=True)

g = torch.Generator().manual_seed(a.seed + 1)
ids = torch.randint(100, cfg.vocab_size, (1, a.tokens), generator=g)
logits = write_teacher_forced(model, ids, a.out, dev)
with open(os.path.join(a.out, "ref_argmax.txt"), "w") as f:
    f.write(" ".join(str(int(t)) for t in logits.argmax(-1)) + "\n")
if a.greedy:
    write_greedy(model, ids, 16, a.greedy, a.out, dev)
print(f"wrote {a.out}: {a.shape} x {a.layers} layers, {a.tokens} tokens"
      + (f", {a.quant} group {a.group}" if a.quant else ""))
