#!/usr/bin/env python3
"""Independent reference for Gemma 3 on any backend: a tiny random-weight
Gemma 3 built by Hugging Face transformers (Gemma3ForCausalLM), written as
the GGUF file llama.cpp's converter would make of it (loom reads Gemma 3
from GGUF only), with transformers' own teacher-forced log-probabilities
and greedy tokens.

    hf_gemma3_reference.py OUT_DIR [--layers 6] [--window 32] [--tokens 128]
                           [--greedy 32] [--device cuda]
    hf_gemma3_reference.py OUT_DIR --gguf-only     (numpy weights, no torch:
                                                    checks the file format)

Writes OUT_DIR/model.gguf (float32 tensors; norm weights stored as 1 + w,
as the converter stores Gemma's), OUT_DIR/tokens.txt,
OUT_DIR/ref_logprobs.txt (the float32 model; line i = log p(token_i |
tokens_<i), line 0 = 0), OUT_DIR/prompt.txt (the first 48 tokens: past the
window) and OUT_DIR/ref_greedy.txt (N greedy tokens after them).

The model: hidden 256, 4 query heads over 1 KV head of head_dim 256 (Gemma
3 270M's attention), FFN 512, vocabulary 1000, every 6th layer global (RoPE
base 1e6), the others local over --window tokens (base 10000), QK-norm,
post-norms, tanh GeGLU, embeddings times sqrt(hidden), tied LM head. The
tokenizer in the file is a placeholder SentencePiece vocabulary ("t<i>"
pieces): the checks feed and compare token ids.
"""
import argparse
import os
import struct

import numpy as np

V, H, FFN, HEADS, KVH, HD = 1000, 256, 512, 4, 1, 256
PATTERN = 6  # every 6th layer global: Gemma 3's sliding_window_pattern

# GGUF v3 (the subset this file writes)
T_U32, T_I32, T_F32, T_BOOL, T_STR, T_ARR = 4, 5, 6, 7, 8, 9
GGML_F32 = 0
ALIGN = 32


def _str(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def _kv(key, typ, val):
    out = _str(key) + struct.pack("<I", typ)
    if typ == T_ARR:
        et, items = val
        out += struct.pack("<IQ", et, len(items))
        for it in items:
            out += _str(it) if et == T_STR else struct.pack({T_F32: "<f", T_I32: "<i"}[et], it)
        return out
    if typ == T_STR:
        return out + _str(val)
    return out + struct.pack({T_U32: "<I", T_I32: "<i", T_F32: "<f", T_BOOL: "<?"}[typ], val)


def write_gguf(path, layers, window, tensors):
    """tensors: list of (name, float32 ndarray of shape (rows, cols) or (n,))."""
    a = "gemma3."
    kvs = [
        _kv("general.architecture", T_STR, "gemma3"),
        _kv("general.name", T_STR, "tiny random Gemma 3"),
        _kv(a + "context_length", T_U32, 2048),
        _kv(a + "embedding_length", T_U32, H),
        _kv(a + "block_count", T_U32, layers),
        _kv(a + "feed_forward_length", T_U32, FFN),
        _kv(a + "attention.head_count", T_U32, HEADS),
        _kv(a + "attention.head_count_kv", T_U32, KVH),
        _kv(a + "attention.key_length", T_U32, HD),
        _kv(a + "attention.value_length", T_U32, HD),
        _kv(a + "attention.layer_norm_rms_epsilon", T_F32, 1e-6),
        _kv(a + "rope.freq_base", T_F32, 1000000.0),
        _kv(a + "rope.freq_base_swa", T_F32, 10000.0),
        _kv(a + "attention.sliding_window", T_U32, window),
        _kv(a + "attention.sliding_window_pattern", T_U32, PATTERN),
        _kv("tokenizer.ggml.model", T_STR, "llama"),
        _kv("tokenizer.ggml.tokens", T_ARR, (T_STR, ["<pad>", "<eos>", "<bos>", "<unk>"] +
                                                   [f"t{i}" for i in range(4, V)])),
        _kv("tokenizer.ggml.scores", T_ARR, (T_F32, [0.0] * 4 + [-float(i) for i in range(4, V)])),
        _kv("tokenizer.ggml.token_type", T_ARR, (T_I32, [3, 3, 3, 2] + [1] * (V - 4))),
        _kv("tokenizer.ggml.bos_token_id", T_U32, 2),
        _kv("tokenizer.ggml.eos_token_id", T_U32, 1),
        _kv("tokenizer.ggml.unknown_token_id", T_U32, 3),
        _kv("tokenizer.ggml.padding_token_id", T_U32, 0),
        _kv("tokenizer.ggml.add_bos_token", T_BOOL, False),
    ]
    infos, blobs, off = b"", [], 0
    for name, t in tensors:
        t = np.ascontiguousarray(t, dtype=np.float32)
        ne = list(reversed(t.shape))  # GGUF: innermost dimension first
        infos += _str(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", n) for n in ne)
        infos += struct.pack("<IQ", GGML_F32, off)
        blob = t.tobytes()
        pad = (-len(blob)) % ALIGN
        blobs.append(blob + b"\0" * pad)
        off += len(blob) + pad
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)) + b"".join(kvs) + infos
    head += b"\0" * ((-len(head)) % ALIGN)
    with open(path, "wb") as f:
        f.write(head)
        for b in blobs:
            f.write(b)


def gguf_tensors(sd, layers):
    """Hugging Face Gemma3ForCausalLM state dict (numpy float32) -> GGUF names;
    every RMSNorm weight as 1 + w (Gemma multiplies by 1 + w)."""
    one = lambda w: 1.0 + w  # noqa: E731
    out = [("token_embd.weight", sd["model.embed_tokens.weight"]),
           ("output_norm.weight", one(sd["model.norm.weight"]))]
    names = {
        "input_layernorm": ("attn_norm", True), "self_attn.q_proj": ("attn_q", False),
        "self_attn.k_proj": ("attn_k", False), "self_attn.v_proj": ("attn_v", False),
        "self_attn.o_proj": ("attn_output", False), "self_attn.q_norm": ("attn_q_norm", True),
        "self_attn.k_norm": ("attn_k_norm", True), "post_attention_layernorm": ("post_attention_norm", True),
        "pre_feedforward_layernorm": ("ffn_norm", True), "mlp.gate_proj": ("ffn_gate", False),
        "mlp.up_proj": ("ffn_up", False), "mlp.down_proj": ("ffn_down", False),
        "post_feedforward_layernorm": ("post_ffw_norm", True),
    }
    for l in range(layers):
        for hf, (gg, norm) in names.items():
            w = sd[f"model.layers.{l}.{hf}.weight"]
            out.append((f"blk.{l}.{gg}.weight", one(w) if norm else w))
    return out


def random_state_dict(layers, rng):
    """numpy weights of the same names and shapes (the --gguf-only check)."""
    sd = {"model.embed_tokens.weight": rng.normal(0, 0.02, (V, H)), "model.norm.weight": rng.uniform(-.5, .5, H)}
    shapes = {"input_layernorm": (H,), "self_attn.q_proj": (HEADS * HD, H), "self_attn.k_proj": (KVH * HD, H),
              "self_attn.v_proj": (KVH * HD, H), "self_attn.o_proj": (H, HEADS * HD), "self_attn.q_norm": (HD,),
              "self_attn.k_norm": (HD,), "post_attention_layernorm": (H,), "pre_feedforward_layernorm": (H,),
              "mlp.gate_proj": (FFN, H), "mlp.up_proj": (FFN, H), "mlp.down_proj": (H, FFN),
              "post_feedforward_layernorm": (H,)}
    for l in range(layers):
        for n, s in shapes.items():
            sd[f"model.layers.{l}.{n}.weight"] = (rng.uniform(-.5, .5, s) if len(s) == 1
                                                 else rng.normal(0, 1.0 / np.sqrt(s[1]), s))
    return sd


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--window", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--greedy", type=int, default=32)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--gguf-only", action="store_true")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    if a.gguf_only:
        sd = random_state_dict(a.layers, np.random.default_rng(a.seed))
        write_gguf(os.path.join(a.out, "model.gguf"), a.layers, a.window, gguf_tensors(sd, a.layers))
        print(f"wrote {a.out}/model.gguf (numpy weights, no reference)")
        return

    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig
    from hf_reference_io import write_greedy, write_teacher_forced

    torch.manual_seed(a.seed)
    cfg = Gemma3TextConfig(vocab_size=V, hidden_size=H, intermediate_size=FFN, num_hidden_layers=a.layers,
                           num_attention_heads=HEADS, num_key_value_heads=KVH, head_dim=HD,
                           query_pre_attn_scalar=HD, sliding_window=a.window, sliding_window_pattern=PATTERN,
                           rope_theta=1000000.0, rope_local_base_freq=10000.0, rope_scaling=None,
                           max_position_embeddings=2048, rms_norm_eps=1e-6, final_logit_softcapping=None,
                           attn_logit_softcapping=None, hidden_activation="gelu_pytorch_tanh",
                           tie_word_embeddings=True, attn_implementation="eager")
    lt = getattr(cfg, "layer_types", None)  # newer transformers: the pattern as a list
    want = ["full_attention" if (l + 1) % PATTERN == 0 else "sliding_attention" for l in range(a.layers)]
    if lt is not None and list(lt) != want:
        raise SystemExit(f"transformers made layer types {lt}, not every {PATTERN}th global: {want}")
    dev = a.device
    with torch.device(dev):
        model = Gemma3ForCausalLM(cfg).float().eval()
        with torch.no_grad():
            for n, p in model.named_parameters():
                if p.dim() == 2:
                    p.normal_(0.0, 0.02 if "embed" in n else 1.0 / p.shape[1] ** 0.5)
                else:  # Gemma's norms multiply by 1 + w: spread w so a wrong one shows
                    p.uniform_(-0.5, 0.5)
    sd = {k: v.detach().float().cpu().numpy() for k, v in model.state_dict().items()}
    write_gguf(os.path.join(a.out, "model.gguf"), a.layers, a.window, gguf_tensors(sd, a.layers))

    g = torch.Generator().manual_seed(a.seed + 1)
    ids = torch.randint(4, V, (1, a.tokens), generator=g)
    write_teacher_forced(model, ids, a.out, dev)
    if a.greedy:
        write_greedy(model, ids, 48, a.greedy, a.out, dev)
    print(f"wrote {a.out}: gemma3 x {a.layers} layers (window {a.window}), {a.tokens} tokens")


if __name__ == "__main__":
    main()
