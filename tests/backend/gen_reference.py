#!/usr/bin/env python3
"""
tests/backend/gen_reference.py — the independent golden reference for the cpu
backend's real-model test: a float64 numpy Llama forward over SmolLM2's GGUF
weights, written from the architecture's definition, sharing no code with
loom. Not run by the tests (no Python there); rerun by hand when the prompts
or the model change, and commit its output:

    pip install gguf numpy
    python3 tests/backend/gen_reference.py /root/.cache/loom/models/SmolLM2-135M-Instruct.Q4_1.gguf

What it does:
  * reads hyper-parameters and tensors with the `gguf` package and
    dequantizes every tensor with gguf.quants (Q4_1 / Q8_0 / F32 here),
    then works in float64;
  * undoes llama.cpp's converter permutation of attn_q / attn_k rows (it
    interleaved each head's two rotary halves), so Hugging Face's
    rotate_half ("NeoX") RoPE applies — and, as a self-check, also runs the
    forward on the raw permuted rows with interleaved-pair RoPE (llama.cpp's
    own convention) and asserts both agree to ~1e-9;
  * for each fixed prompt (token ids looked up in tokenizer.ggml.tokens,
    spelled out below) records the last position's top-20 logits and some
    whole-vector statistics;
  * greedy-decodes 16 tokens from the chat prompt (full recompute each step)
    and records the tokens and each step's top-1 minus top-2 margin.

Output: tests/backend/data/smollm2_reference.json (small).
"""
import hashlib
import json
import os
import sys

import numpy as np
from gguf import GGUFReader
from gguf import quants

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "data", "smollm2_reference.json")

# The chat prompt is SmolLM2's template around "What is the capital of
# France?" (ids match tests/tokenizer/data/smollm2_golden.jsonl); the others
# are plain word sequences, each word one vocabulary entry.
CHAT_IDS = ([1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28,
             7018, 411, 407, 19712, 8182, 2, 198]          # system turn
            + [1, 4093, 198])                              # <|im_start|>user\n
PROMPT_WORDS = {
    "story": ["Once", "Ġupon", "Ġa", "Ġtime", "Ġthere", "Ġwas", "Ġa", "Ġlittle", "Ġgirl",
              "Ġwho", "Ġlived", "Ġin", "Ġa", "Ġvillage", "Ġnear", "Ġthe", "Ġforest", "."],
    "fox": ["The", "Ġquick", "Ġbrown", "Ġfox", "Ġjumps", "Ġover", "Ġthe", "Ġlazy", "Ġdog"],
}
QUESTION_WORDS = ["What", "Ġis", "Ġthe", "Ġcapital", "Ġof", "ĠFrance", "?"]
GREEDY_STEPS = 16
TOP_K = 20


def field(r, key):
    f = r.fields[key]
    return f.contents() if hasattr(f, "contents") else f.parts[f.data[0]][0]


def load(path):
    r = GGUFReader(path)
    arch = field(r, "general.architecture")
    cfg = {
        "layers": int(field(r, f"{arch}.block_count")),
        "hidden": int(field(r, f"{arch}.embedding_length")),
        "ffn": int(field(r, f"{arch}.feed_forward_length")),
        "heads": int(field(r, f"{arch}.attention.head_count")),
        "kv_heads": int(field(r, f"{arch}.attention.head_count_kv")),
        "theta": float(field(r, f"{arch}.rope.freq_base")),
        "eps": float(field(r, f"{arch}.attention.layer_norm_rms_epsilon")),
    }
    cfg["head_dim"] = cfg["hidden"] // cfg["heads"]
    if f"{arch}.rope.scaling.type" in r.fields:
        raise SystemExit("this reference implements no RoPE scaling; the model asks for some")
    w = {}
    for t in r.tensors:
        a = quants.dequantize(t.data, t.tensor_type).astype(np.float64)
        # gguf lists dims contiguous-first; numpy shape is (rows, cols)
        w[t.name] = a.reshape([int(d) for d in reversed(t.shape)]) if a.ndim != len(t.shape) else a
    toks = r.fields["tokenizer.ggml.tokens"]
    vocab = [bytes(toks.parts[i]).decode("utf-8") for i in toks.data]
    return cfg, w, vocab


def unpermute(m, n_head):
    """Inverse of llama.cpp convert_hf_to_gguf.py `permute` (HF -> GGUF)."""
    rows = m.shape[0]
    # GGUF row h*d + 2j + i holds HF row h*d + i*d/2 + j (i in {0, 1})
    return m.reshape(n_head, rows // n_head // 2, 2, *m.shape[1:]).swapaxes(1, 2).reshape(m.shape)


def rms(x, g, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * g


def rope_neox(x, pos, inv):
    # x (n, h, d): rotate (i, i + d/2)
    ang = pos[:, None] * inv[None, :]                 # (n, d/2)
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    h = x.shape[-1] // 2
    a, b = x[..., :h], x[..., h:]
    return np.concatenate([a * c - b * s, b * c + a * s], axis=-1)


def rope_interleaved(x, pos, inv):
    # x (n, h, d): rotate (2i, 2i + 1) — llama.cpp's "normal" rope on GGUF rows
    ang = pos[:, None] * inv[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = a * c - b * s
    out[..., 1::2] = b * c + a * s
    return out


def forward(cfg, w, ids, neox=True):
    """Logits (n, vocab) for every position of `ids`, full causal recompute."""
    n, H, D = len(ids), cfg["hidden"], cfg["head_dim"]
    NH, NKV = cfg["heads"], cfg["kv_heads"]
    pos = np.arange(n, dtype=np.float64)
    inv = 1.0 / cfg["theta"] ** (np.arange(0, D, 2, dtype=np.float64) / D)
    rope = rope_neox if neox else rope_interleaved
    emb = w["token_embd.weight"]
    x = emb[np.array(ids)]
    mask = np.triu(np.full((n, n), -np.inf), 1)
    for l in range(cfg["layers"]):
        p = f"blk.{l}."
        wq, wk = w[p + "attn_q.weight"], w[p + "attn_k.weight"]
        if neox:
            wq, wk = unpermute(wq, NH), unpermute(wk, NKV)
        xn = rms(x, w[p + "attn_norm.weight"], cfg["eps"])
        q = rope((xn @ wq.T).reshape(n, NH, D), pos, inv)
        k = rope((xn @ wk.T).reshape(n, NKV, D), pos, inv)
        v = (xn @ w[p + "attn_v.weight"].T).reshape(n, NKV, D)
        g = NH // NKV
        k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)   # head h reads kv head h // g
        sc = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(D) + mask
        sc = np.exp(sc - sc.max(axis=-1, keepdims=True))
        sc /= sc.sum(axis=-1, keepdims=True)
        att = np.einsum("hqk,khd->qhd", sc, v).reshape(n, NH * D)
        x = x + att @ w[p + "attn_output.weight"].T
        xn = rms(x, w[p + "ffn_norm.weight"], cfg["eps"])
        gate, up = xn @ w[p + "ffn_gate.weight"].T, xn @ w[p + "ffn_up.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ w[p + "ffn_down.weight"].T
    head = w.get("output.weight", emb)
    return rms(x, w["output_norm.weight"], cfg["eps"]) @ head.T


def summary(lg):
    top = np.argsort(-lg, kind="stable")[:TOP_K]
    m = lg.max()
    return {
        "top_ids": [int(i) for i in top],
        "top_values": [float(lg[i]) for i in top],
        "argmax": int(top[0]),
        "mean": float(lg.mean()),
        "std": float(lg.std()),
        "min": float(lg.min()),
        "max": float(m),
        "logsumexp": float(m + np.log(np.exp(lg - m).sum())),
    }


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.expanduser(
        "~/.cache/loom/models/SmolLM2-135M-Instruct.Q4_1.gguf")
    cfg, w, vocab = load(path)
    ix = {t: i for i, t in enumerate(vocab)}
    look = lambda words: [ix[t] for t in words]  # KeyError = a word that is not one token
    prompts = {
        "chat": CHAT_IDS + look(QUESTION_WORDS) + [2, 198, 1, 520, 9531, 198],
        "story": look(PROMPT_WORDS["story"]),
        "fox": look(PROMPT_WORDS["fox"]),
    }
    out_prompts = []
    for name, ids in prompts.items():
        lg = forward(cfg, w, ids)
        lg_il = forward(cfg, w, ids, neox=False)
        diff = float(np.abs(lg - lg_il).max())
        assert diff < 1e-8, f"NeoX on unpermuted rows and interleaved on raw rows differ by {diff}"
        s = summary(lg[-1])
        out_prompts.append({"name": name, "ids": ids, "last": s,
                            "neox_vs_interleaved_max_diff": diff})
        print(f"{name}: {len(ids)} tokens, argmax {s['argmax']} ({vocab[s['argmax']]!r}), "
              f"self-check diff {diff:.2e}")
    ids = list(prompts["chat"])
    greedy, margins = [], []
    for _ in range(GREEDY_STEPS):
        lg = forward(cfg, w, ids)[-1]
        top2 = np.argsort(-lg, kind="stable")[:2]
        greedy.append(int(top2[0]))
        margins.append(float(lg[top2[0]] - lg[top2[1]]))
        ids.append(int(top2[0]))
    text = "".join(vocab[t] for t in greedy).replace("Ġ", " ").replace("Ċ", "\\n")
    print(f"greedy: {greedy} -> {text!r}")
    with open(path, "rb") as f:
        head = hashlib.sha256(f.read(1 << 20)).hexdigest()
    doc = {
        "generator": "tests/backend/gen_reference.py (float64 numpy, gguf.quants dequantization)",
        "model": {"file": os.path.basename(path), "size": os.path.getsize(path),
                  "sha256_first_mib": head},
        "config": cfg,
        "prompts": out_prompts,
        "greedy": {"prompt": "chat", "steps": GREEDY_STEPS, "tokens": greedy,
                   "margins": margins, "text": text},
    }
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
