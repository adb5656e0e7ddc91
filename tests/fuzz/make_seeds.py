#!/usr/bin/env python3
"""tests/fuzz/make_seeds.py — writes the binary seed files of corpus/gguf
and corpus/safetensors: tiny Llama models (hidden 4, one layer, 8 tokens),
a tiny Gemma 3 (Q5_0 weights) and tiny mixtures of experts (a Qwen2-MoE
safetensors with per-expert tensors and a shared expert, a qwen3moe GGUF
with stacked experts) that load, so the fuzzers start from inputs that reach the config and
tensor checks, not only the header. Text seeds are written by hand.
Run from anywhere; rewrites its own seeds (seed-*.bin) in place."""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
H, I, NH, NKV, V = 4, 8, 2, 1, 8
HD = H // NH
TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "a", "b", "\u0120", "ab", "\u0120a"]
MERGES = ["a b", "\u0120 a"]


def gstr(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def kv(key, t, val):
    out = gstr(key) + struct.pack("<I", t)
    if t == 4:
        out += struct.pack("<I", val)
    elif t == 6:
        out += struct.pack("<f", val)
    elif t == 8:
        out += gstr(val)
    elif t == 9:  # (elem type, list)
        et, items = val
        out += struct.pack("<IQ", et, len(items))
        for x in items:
            out += gstr(x) if et == 8 else struct.pack("<i", x)
    return out


def tensors():
    """(name, ne in GGML order, f32 values) of a tied tiny Llama."""
    ts = [("token_embd.weight", [H, V]), ("output_norm.weight", [H])]
    for n, ne in [("attn_norm.weight", [H]), ("attn_q.weight", [H, NH * HD]), ("attn_k.weight", [H, NKV * HD]),
                  ("attn_v.weight", [H, NKV * HD]), ("attn_output.weight", [NH * HD, H]),
                  ("ffn_norm.weight", [H]), ("ffn_gate.weight", [H, I]), ("ffn_up.weight", [H, I]),
                  ("ffn_down.weight", [I, H])]:
        ts.append(("blk.0." + n, ne))
    return ts


def gguf(with_tokenizer=True, align=32):
    kvs = [kv("general.architecture", 8, "llama"), kv("general.name", 8, "fuzz seed"),
           kv("llama.block_count", 4, 1), kv("llama.embedding_length", 4, H),
           kv("llama.feed_forward_length", 4, I), kv("llama.attention.head_count", 4, NH),
           kv("llama.attention.head_count_kv", 4, NKV), kv("llama.context_length", 4, 32),
           kv("llama.rope.freq_base", 6, 10000.0), kv("llama.attention.layer_norm_rms_epsilon", 6, 1e-5)]
    if align != 32:
        kvs.append(kv("general.alignment", 4, align))
    if not with_tokenizer:
        kvs.append(kv("llama.vocab_size", 4, V))
    if with_tokenizer:
        kvs += [kv("tokenizer.ggml.model", 8, "gpt2"), kv("tokenizer.ggml.pre", 8, "smollm"),
                kv("tokenizer.ggml.tokens", 9, (8, TOKENS)),
                kv("tokenizer.ggml.token_type", 9, (5, [3, 3, 3, 1, 1, 1, 1, 1])),
                kv("tokenizer.ggml.merges", 9, (8, MERGES)),
                kv("tokenizer.ggml.bos_token_id", 4, 0), kv("tokenizer.ggml.eos_token_id", 4, 2),
                kv("tokenizer.chat_template", 8, "{% for m in messages %}<|im_start|>{{ m.role }}{% endfor %}")]
    infos, data = b"", b""
    for name, ne in tensors():
        n = 1
        for d in ne:
            n *= d
        while len(data) % align:
            data += b"\0"
        infos += gstr(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        infos += struct.pack("<IQ", 0, len(data))  # type 0 = F32
        data += struct.pack("<%df" % n, *[0.01 * (i % 7) for i in range(n)])
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors()), len(kvs)) + b"".join(kvs) + infos
    while len(head) % align:
        head += b"\0"
    return head + data


def gemma3():
    """A tiny Gemma 3 (hidden 32, 2 heads of 16, one layer, window 4, SentencePiece vocabulary):
    its extra keys and norms, Q5_0 matrices (kept as stored), a Q8_0 embedding."""
    gh, gi, ghd = 32, 32, 16
    kvs = [kv("general.architecture", 8, "gemma3"), kv("gemma3.block_count", 4, 1),
           kv("gemma3.embedding_length", 4, gh), kv("gemma3.feed_forward_length", 4, gi),
           kv("gemma3.attention.head_count", 4, NH), kv("gemma3.attention.head_count_kv", 4, NKV),
           kv("gemma3.attention.key_length", 4, ghd), kv("gemma3.attention.value_length", 4, ghd),
           kv("gemma3.context_length", 4, 32), kv("gemma3.rope.freq_base", 6, 1e6),
           kv("gemma3.attention.layer_norm_rms_epsilon", 6, 1e-6), kv("gemma3.attention.sliding_window", 4, 4),
           kv("tokenizer.ggml.model", 8, "llama"),
           kv("tokenizer.ggml.tokens", 9, (8, ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "\u2581", "a", "\n"])),
           kv("tokenizer.ggml.token_type", 9, (5, [3, 3, 3, 2, 3, 1, 1, 1])),
           kv("tokenizer.ggml.bos_token_id", 4, 2), kv("tokenizer.ggml.eos_token_id", 4, 1)]
    ts = [("token_embd.weight", [gh, V], 8), ("output_norm.weight", [gh], 0)]
    for n, ne, t in [("attn_norm.weight", [gh], 0), ("attn_q.weight", [gh, NH * ghd], 6),
                     ("attn_k.weight", [gh, NKV * ghd], 6), ("attn_v.weight", [gh, NKV * ghd], 6),
                     ("attn_output.weight", [NH * ghd, gh], 6), ("attn_q_norm.weight", [ghd], 0),
                     ("attn_k_norm.weight", [ghd], 0), ("post_attention_norm.weight", [gh], 0),
                     ("ffn_norm.weight", [gh], 0), ("ffn_gate.weight", [gh, gi], 6), ("ffn_up.weight", [gh, gi], 6),
                     ("ffn_down.weight", [gi, gh], 6), ("post_ffw_norm.weight", [gh], 0)]:
        ts.append(("blk.0." + n, ne, t))
    infos, data = b"", b""
    for name, ne, t in ts:
        rows = ne[1] if len(ne) > 1 else 1
        while len(data) % 32:
            data += b"\0"
        infos += gstr(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        infos += struct.pack("<IQ", t, len(data))
        if t == 0:
            data += struct.pack("<%df" % ne[0], *[1.0 + 0.01 * (i % 7) for i in range(ne[0])])
            continue
        for r in range(rows * ne[0] // 32):  # blocks: f16 d = 0.0625, then codes
            data += struct.pack("<H", 0x2C00)
            data += bytes((r * 7 + j * 13) % 256 for j in range(4 + 16 if t == 6 else 32))
    head = b"GGUF" + struct.pack("<IQQ", 3, len(ts), len(kvs)) + b"".join(kvs) + infos
    while len(head) % 32:
        head += b"\0"
    return head + data


CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": V, "hidden_size": H,
          "intermediate_size": I, "num_hidden_layers": 1, "num_attention_heads": NH, "num_key_value_heads": NKV,
          "max_position_embeddings": 32, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": True}


def safetensors(dtype="F32"):
    hf = {"model.embed_tokens.weight": [V, H], "model.norm.weight": [H],
          "model.layers.0.input_layernorm.weight": [H], "model.layers.0.post_attention_layernorm.weight": [H],
          "model.layers.0.self_attn.q_proj.weight": [NH * HD, H],
          "model.layers.0.self_attn.k_proj.weight": [NKV * HD, H],
          "model.layers.0.self_attn.v_proj.weight": [NKV * HD, H],
          "model.layers.0.self_attn.o_proj.weight": [H, NH * HD],
          "model.layers.0.mlp.gate_proj.weight": [I, H], "model.layers.0.mlp.up_proj.weight": [I, H],
          "model.layers.0.mlp.down_proj.weight": [H, I]}
    esz = {"F32": 4, "BF16": 2, "F16": 2}[dtype]
    header, data = {"__metadata__": {"format": "pt"}}, b""
    for name, shape in hf.items():
        n = 1
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + n * esz]}
        data += bytes((i * 37) % 251 for i in range(n * esz))
    hj = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(hj)) + hj + data


E, K, EI, SI = 2, 1, 4, 4  # experts, per token, expert width, shared expert width

MOE_CONFIG = dict(CONFIG, architectures=["Qwen2MoeForCausalLM"], model_type="qwen2_moe", num_experts=E,
                  num_experts_per_tok=K, moe_intermediate_size=EI, shared_expert_intermediate_size=SI,
                  norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[])


def safetensors_moe():
    """Qwen2-MoE under the Hub's names: QKV bias, router, per-expert matrices, shared expert and gate."""
    hf = {"model.embed_tokens.weight": [V, H], "model.norm.weight": [H],
          "model.layers.0.input_layernorm.weight": [H], "model.layers.0.post_attention_layernorm.weight": [H],
          "model.layers.0.self_attn.o_proj.weight": [H, NH * HD], "model.layers.0.mlp.gate.weight": [E, H],
          "model.layers.0.mlp.shared_expert.gate_proj.weight": [SI, H],
          "model.layers.0.mlp.shared_expert.up_proj.weight": [SI, H],
          "model.layers.0.mlp.shared_expert.down_proj.weight": [H, SI],
          "model.layers.0.mlp.shared_expert_gate.weight": [1, H]}
    for p, rows in (("q", NH * HD), ("k", NKV * HD), ("v", NKV * HD)):
        hf["model.layers.0.self_attn.%s_proj.weight" % p] = [rows, H]
        hf["model.layers.0.self_attn.%s_proj.bias" % p] = [rows]
    for e in range(E):
        for proj, shape in (("gate_proj", [EI, H]), ("up_proj", [EI, H]), ("down_proj", [H, EI])):
            hf["model.layers.0.mlp.experts.%d.%s.weight" % (e, proj)] = shape
    header, data = {"__metadata__": {"format": "pt"}}, b""
    for name, shape in hf.items():
        n = 1
        for d in shape:
            n *= d
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [len(data), len(data) + n * 4]}
        data += struct.pack("<%df" % n, *[0.01 * ((i * 37) % 23 - 11) for i in range(n)])
    hj = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(hj)) + hj + data


def gguf_moe():
    """A qwen3moe GGUF: QK-norms, router, stacked f32 experts (ne: H, EI, E)."""
    a = "qwen3moe"
    kvs = [kv("general.architecture", 8, a), kv(a + ".block_count", 4, 1), kv(a + ".embedding_length", 4, H),
           kv(a + ".feed_forward_length", 4, I), kv(a + ".attention.head_count", 4, NH),
           kv(a + ".attention.head_count_kv", 4, NKV), kv(a + ".context_length", 4, 32),
           kv(a + ".rope.freq_base", 6, 10000.0), kv(a + ".attention.layer_norm_rms_epsilon", 6, 1e-6),
           kv(a + ".vocab_size", 4, V), kv(a + ".expert_count", 4, E), kv(a + ".expert_used_count", 4, K),
           kv(a + ".expert_feed_forward_length", 4, EI)]
    ts = [("token_embd.weight", [H, V]), ("output_norm.weight", [H])]
    for n, ne in [("attn_norm.weight", [H]), ("attn_q.weight", [H, NH * HD]), ("attn_k.weight", [H, NKV * HD]),
                  ("attn_v.weight", [H, NKV * HD]), ("attn_output.weight", [NH * HD, H]),
                  ("attn_q_norm.weight", [HD]), ("attn_k_norm.weight", [HD]), ("ffn_norm.weight", [H]),
                  ("ffn_gate_inp.weight", [H, E]), ("ffn_gate_exps.weight", [H, EI, E]),
                  ("ffn_up_exps.weight", [H, EI, E]), ("ffn_down_exps.weight", [EI, H, E])]:
        ts.append(("blk.0." + n, ne))
    infos, data = b"", b""
    for name, ne in ts:
        n = 1
        for d in ne:
            n *= d
        while len(data) % 32:
            data += b"\0"
        infos += gstr(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        infos += struct.pack("<IQ", 0, len(data))
        data += struct.pack("<%df" % n, *[0.01 * ((i * 37) % 23 - 11) for i in range(n)])
    head = b"GGUF" + struct.pack("<IQQ", 3, len(ts), len(kvs)) + b"".join(kvs) + infos
    while len(head) % 32:
        head += b"\0"
    return head + data


def write(path, b):
    with open(os.path.join(HERE, path), "wb") as f:
        f.write(b)


write("corpus/gguf/seed-tiny-llama.bin", gguf())
write("corpus/gguf/seed-no-tokenizer.bin", gguf(with_tokenizer=False))
write("corpus/gguf/seed-align1.bin", gguf(align=1))
write("corpus/gguf/seed-tiny-gemma3.bin", gemma3())
cfg = json.dumps(CONFIG).encode()
write("corpus/safetensors/seed-f32.bin", struct.pack("<I", len(cfg)) + cfg + safetensors("F32"))
write("corpus/safetensors/seed-bf16-default-config.bin", struct.pack("<I", 0) + safetensors("BF16"))
write("corpus/gguf/seed-tiny-qwen3moe.bin", gguf_moe())
moe_cfg = json.dumps(MOE_CONFIG).encode()
write("corpus/safetensors/seed-qwen2moe.bin", struct.pack("<I", len(moe_cfg)) + moe_cfg + safetensors_moe())
