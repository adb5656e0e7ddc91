#!/usr/bin/env python3
"""Write a GGUF of a mixture-of-experts shape with random weights, as
llama.cpp lays one out (general.architecture qwen3moe: QK-norm, experts
stacked in ffn_{gate,up,down}_exps), so loom and llama.cpp can be timed on
the same file (bench/cpu_vs_llamacpp.sh, LOOM_BENCH_MODEL=qwen3-moe-cut).

    make_moe_gguf.py OUT.gguf --tokenizer FROM.gguf [--layers N] [--type q8_0|q4_k] [--seed S]

The widths are Qwen3-30B-A3B's (hidden 2048, 128 experts of 768, top 8,
32 query / 4 KV heads of 128, untied LM head); --layers cuts the depth so the
file fits a small machine (4 layers: ~2.9 GB at q8_0, ~1.5 GB at q4_k). The
vocabulary and tokenizer are copied from FROM.gguf (the default model's), so
both engines load a real tokenizer. Linear weights are random blocks of the
chosen type (q4_k: the LM head q6_k, as a Q4_K_M file keeps it) with small
block scales, so activations stay finite; norms are ones and the router
float32, as converted checkpoints keep them. Timing only: the text such a
model writes means nothing.
"""
import argparse
import sys

import numpy as np

HIDDEN, EXPERTS, EXPERT_WIDTH, USED = 2048, 128, 768, 8
HEADS, KV_HEADS, HEAD_DIM = 32, 4, 128

# bytes and weights per block of each type, and where its f16 scales sit
BLOCKS = {  # type: (weights a block, bytes a block, offsets of f16 scale fields)
    "q8_0": (32, 34, (0,)),
    "q4_k": (256, 144, (0, 2)),
    "q6_k": (256, 210, (208,)),
}


def random_blocks(rng, kind, rows, cols, scale):
    """(rows, cols) weights of `kind` as random bytes, every f16 scale set to
    `scale` (a q4_k block's dmin too) so the weights stay small."""
    per, nbytes, f16_at = BLOCKS[kind]
    assert cols % per == 0, (kind, cols)
    nb = rows * cols // per
    b = rng.integers(0, 256, size=(nb, nbytes), dtype=np.uint8)
    s = np.frombuffer(np.float16(scale).tobytes(), dtype=np.uint8)
    for off in f16_at:
        b[:, off:off + 2] = s
    return b.reshape(rows, cols // per * nbytes)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--tokenizer", required=True, help="a GGUF whose tokenizer.* keys are copied")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--type", choices=("q8_0", "q4_k"), default="q8_0")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.layers < 1 or a.layers > 48:
        sys.exit("make_moe_gguf.py: --layers must be 1..48")
    try:
        import gguf
    except ImportError:
        sys.exit("make_moe_gguf.py: needs gguf-py on PYTHONPATH (llama.cpp's gguf-py folder)")
    T = gguf.GGMLQuantizationType
    qtype = {"q8_0": T.Q8_0, "q4_k": T.Q4_K, "q6_k": T.Q6_K}
    head_kind = "q6_k" if a.type == "q4_k" else a.type
    # block scales small enough that activations stay finite through the
    # layers: a weight is at most ~0.03 (q8_0: 127 d), ~0.02 (q4_k: 63 * 15
    # d) and ~0.8 (q6_k: 127 * 32 d); the values only feed the timing
    wscale = {"q8_0": 2e-4, "q4_k": 2e-5, "q6_k": 2e-4}

    src = gguf.GGUFReader(a.tokenizer)
    tok = {f.name: f for f in src.fields.values() if f.name.startswith("tokenizer.")}
    if "tokenizer.ggml.tokens" not in tok:
        sys.exit(f"make_moe_gguf.py: {a.tokenizer} has no tokenizer.ggml.tokens")
    vocab = len(tok["tokenizer.ggml.tokens"].contents())

    w = gguf.GGUFWriter(a.out, "qwen3moe")
    w.add_name(f"random qwen3moe, Qwen3-30B-A3B widths, {a.layers} layers, {a.type}")
    w.add_block_count(a.layers)
    w.add_context_length(40960)  # Qwen3-30B-A3B's
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(6144)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_expert_count(EXPERTS)
    w.add_expert_used_count(USED)
    w.add_expert_feed_forward_length(EXPERT_WIDTH)
    w.add_file_type(7 if a.type == "q8_0" else 15)  # MOSTLY_Q8_0 / MOSTLY_Q4_K_M
    for name, f in tok.items():
        vt = f.types[0]
        if vt == gguf.GGUFValueType.ARRAY:
            w.add_key_value(name, f.contents(), vt, f.types[-1])
        else:
            w.add_key_value(name, f.contents(), vt)

    rng = np.random.default_rng(a.seed)
    ones = np.ones(HIDDEN, np.float32)

    def lin(name, rows, cols, kind=a.type):
        w.add_tensor(name, random_blocks(rng, kind, rows, cols, wscale[kind]), raw_dtype=qtype[kind])

    lin("token_embd.weight", vocab, HIDDEN)
    w.add_tensor("output_norm.weight", ones)
    lin("output.weight", vocab, HIDDEN, head_kind)
    for l in range(a.layers):
        p = f"blk.{l}."
        w.add_tensor(p + "attn_norm.weight", ones)
        lin(p + "attn_q.weight", HEADS * HEAD_DIM, HIDDEN)
        lin(p + "attn_k.weight", KV_HEADS * HEAD_DIM, HIDDEN)
        lin(p + "attn_v.weight", KV_HEADS * HEAD_DIM, HIDDEN)
        lin(p + "attn_output.weight", HIDDEN, HEADS * HEAD_DIM)
        w.add_tensor(p + "attn_q_norm.weight", np.ones(HEAD_DIM, np.float32))
        w.add_tensor(p + "attn_k_norm.weight", np.ones(HEAD_DIM, np.float32))
        w.add_tensor(p + "ffn_norm.weight", ones)
        w.add_tensor(p + "ffn_gate_inp.weight",
                     (rng.standard_normal((EXPERTS, HIDDEN)) * 0.02).astype(np.float32))
        # stacked experts: (experts, rows, cols) as llama.cpp stores them
        for kind, rows, cols in (("gate", EXPERT_WIDTH, HIDDEN), ("up", EXPERT_WIDTH, HIDDEN),
                                 ("down", HIDDEN, EXPERT_WIDTH)):
            b = random_blocks(rng, a.type, EXPERTS * rows, cols, wscale[a.type])
            w.add_tensor(p + f"ffn_{kind}_exps.weight", b.reshape(EXPERTS, rows, -1), raw_dtype=qtype[a.type])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
