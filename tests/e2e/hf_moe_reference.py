#!/usr/bin/env python3
"""Independent reference for the cuda backend's mixture-of-experts layer at
a real model's widths: a random-weight Qwen3-MoE with Qwen3-30B-A3B's
dimensions (hidden 2048, 128 experts of 768, top-8 renormalised, 32 query
heads and 4 KV heads of 128, QK-norm) but few layers and a small vocabulary,
built by Hugging Face transformers on the GPU machine, and transformers'
log-probabilities and greedy tokens for it.

    hf_moe_reference.py write OUT_DIR [--layers 2] [--vocab 2048] [--tokens 128]
                        [--greedy 32] [--seed 1234] [--device cuda]
    hf_moe_reference.py compare OUT_DIR LOOM_LOGPROBS LOOM_GREEDY [--mean 0.05] [--max 0.5]
                        [--near-tie 0.1]

write: OUT_DIR/model/ (config.json, model.safetensors in bf16 under the Hub's
per-expert names, tests/e2e/gen_moe_reference.py's hub_state), and
  tokens.txt           random token ids (a prompt for engine_tool score)
  ref_logprobs.txt     transformers' teacher-forced log-probs, float32
                       arithmetic (TF32 off) on the bf16 weights: the truth
                       a bf16 engine is measured against
  ref_bf16_logprobs.txt the same from transformers' model in bf16: what
                       bf16 arithmetic costs transformers itself
  prompt.txt, ref_greedy.txt  the first 16 tokens and GREEDY greedy tokens
                       after them (float32)
  reference.json       the above with each greedy step's top-1 minus top-2
                       log-prob (margin), transformers bf16's greedy tokens,
                       and the router's top-k gap (k-th minus (k+1)-th
                       router logit, smallest over layers) at every position:
                       where bf16 rounding can choose another expert
The weights are rounded to bf16 before anything is computed, so the file
loom loads and the float32 reference hold the same numbers.

compare: loom's teacher-forced log-probs (engine_tool score, one a line) and
greedy ids (engine_tool greedy-ids, one line) against the reference. PASS
when the mean |difference| < --mean and the largest < --max, and the greedy
tokens equal transformers' or first differ where transformers' own margin
was below --near-tie (two tokens about equally likely). Exit 1 on FAIL.
"""
import argparse
import json
import os
import sys

SHAPE = dict(hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_experts=128,
             num_experts_per_tok=8, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
             num_attention_heads=32, num_key_value_heads=4, head_dim=128, rms_norm_eps=1e-6,
             rope_theta=1000000.0, max_position_embeddings=4096, attention_bias=False,
             tie_word_embeddings=False, use_sliding_window=False, bos_token_id=1, eos_token_id=2)
PROMPT = 16


def randomize(model, seed, dev):
    """Matrices N(0, 1/fan_in), the embeddings N(0, 0.5), the LM head
    N(0, 4/fan_in) (logits of standard deviation ~2: peaked enough for
    greedy margins to mean something), norms U(0.5, 1.5), drawn on the
    device, then rounded to bf16."""
    import torch
    g = torch.Generator(device=dev).manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() >= 2:
                std = 0.5 if "embed" in n else (2.0 if "lm_head" in n else 1.0) * p.shape[-1] ** -0.5
                p.copy_(torch.randn(p.shape, generator=g, device=dev) * std)
            elif n.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=g, device=dev) * 0.1)
            else:
                p.copy_(torch.rand(p.shape, generator=g, device=dev) + 0.5)
            p.copy_(p.to(torch.bfloat16).float())


def router_gaps(model, ids, k):
    """Per position, the smallest (over layers) k-th minus (k+1)-th router logit."""
    import torch
    from gen_moe_reference import router_gates
    gaps = []

    def hook(mod, args, kwargs):
        x = args[0] if args else next(iter(kwargs.values()))
        x = x.reshape(-1, x.shape[-1]).float()
        top = torch.topk(x @ mod.weight.float().t(), k + 1, dim=-1).values
        gaps.append((top[:, k - 1] - top[:, k]).cpu())

    hs = [g.register_forward_pre_hook(hook, with_kwargs=True) for g in router_gates(model)]
    with torch.no_grad():
        model(ids)
    for h in hs:
        h.remove()
    return torch.stack(gaps).min(0).values.tolist(), len(gaps)


def teacher_forced(model, ids):
    import torch
    with torch.no_grad():
        lp = torch.log_softmax(model(ids).logits[0].double(), -1)
    return [0.0] + [float(lp[i, ids[0, i + 1]]) for i in range(ids.shape[1] - 1)]


def greedy(model, prompt, n):
    import torch
    seq = prompt.clone()
    toks, margins = [], []
    with torch.no_grad():
        for _ in range(n):
            lp = torch.log_softmax(model(seq).logits[0, -1].double(), -1)
            top = torch.topk(lp, 2)
            toks.append(int(top.indices[0]))
            margins.append(float(top.values[0] - top.values[1]))
            seq = torch.cat([seq, top.indices[:1].view(1, 1).to(seq.dtype)], 1)
    return toks, margins


def write(a):
    import torch
    import transformers
    from safetensors.torch import save_file
    from gen_moe_reference import hub_state, load_back, write_config
    dev = a.device
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    cfg = transformers.Qwen3MoeConfig(vocab_size=a.vocab, num_hidden_layers=a.layers, **SHAPE,
                                      attn_implementation="eager")
    torch.manual_seed(a.seed)
    with torch.device(dev):
        model = transformers.Qwen3MoeForCausalLM(cfg).float().eval()
    randomize(model, a.seed, dev)
    d = os.path.join(a.out, "model")
    os.makedirs(d, exist_ok=True)
    g = torch.Generator().manual_seed(a.seed + 1)
    ids = torch.randint(3, a.vocab, (1, a.tokens), generator=g).to(dev)
    with torch.no_grad():
        want = model(ids).logits
    for gate_first in (True, False):  # transformers' fused gate_up_proj order (gen_moe_reference)
        state, fused = hub_state(model, "qwen3_moe", cfg, gate_first)
        save_file({k: v.to(torch.bfloat16).cpu() for k, v in state.items()}, os.path.join(d, "model.safetensors"),
                  metadata={"format": "pt"})
        del state
        write_config(cfg, d, "qwen3_moe")
        back = load_back(d).to(dev)
        with torch.no_grad():
            diff = float((back(ids).logits - want).abs().max())
        if diff <= 1e-4 or not fused:
            break
        print(f"fused gate_up_proj read as {'gate, up' if gate_first else 'up, gate'} misses by {diff}; "
              "trying the other order", file=sys.stderr)
        del back
    assert diff <= 1e-4, f"the checkpoint read back gives logits {diff} away from the model that wrote it"
    del model
    ref = teacher_forced(back, ids)
    gaps, nrouters = router_gaps(back, ids, cfg.num_experts_per_tok)
    assert nrouters == a.layers, f"found {nrouters} routers for {a.layers} layers"
    prompt = ids[:, :PROMPT]
    toks, margins = greedy(back, prompt, a.greedy)
    back = back.to(torch.bfloat16)
    ref16 = teacher_forced(back, ids)
    toks16, _ = greedy(back, prompt, a.greedy)

    def lines(name, vals, fmt="%.6f"):
        with open(os.path.join(a.out, name), "w") as f:
            f.write("\n".join(fmt % v for v in vals) + "\n")
    tokens = [int(t) for t in ids[0]]
    lines("tokens.txt", tokens, "%d")
    lines("ref_logprobs.txt", ref)
    lines("ref_bf16_logprobs.txt", ref16)
    with open(os.path.join(a.out, "prompt.txt"), "w") as f:
        f.write(" ".join(str(t) for t in tokens[:PROMPT]) + "\n")
    with open(os.path.join(a.out, "ref_greedy.txt"), "w") as f:
        f.write(" ".join(str(t) for t in toks) + "\n")
    doc = {"class": "Qwen3MoeForCausalLM", "shape": "Qwen3-30B-A3B widths", "layers": a.layers,
           "vocab": a.vocab, "transformers": transformers.__version__, "torch": torch.__version__,
           "device": torch.cuda.get_device_name() if dev.startswith("cuda") else dev, "seed": a.seed,
           "weights": "bf16 (reference arithmetic float32, TF32 off)", "readback_max_diff": diff,
           "tokens": tokens, "logprobs": ref, "logprobs_bf16": ref16, "prompt": tokens[:PROMPT],
           "greedy": toks, "greedy_margins": margins, "greedy_bf16": toks16, "router_gaps": gaps}
    with open(os.path.join(a.out, "reference.json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"wrote {a.out}: Qwen3-MoE at Qwen3-30B-A3B widths, {a.layers} layers, vocab {a.vocab}, "
          f"{a.tokens} tokens; router gap min {min(gaps):.2e}, greedy margin min {min(margins):.3f}; "
          f"transformers {transformers.__version__}", file=sys.stderr)


def first_diff(x, y):
    return next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), None if len(x) == len(y) else min(len(x), len(y)))


def compare(a):
    ref = json.load(open(os.path.join(a.out, "reference.json")))
    got = [float(x) for x in open(a.logprobs).read().split()]
    lp, lp16, gaps = ref["logprobs"], ref["logprobs_bf16"], ref["router_gaps"]
    if len(got) != len(lp) or any(g != g for g in got):
        print(f"FAIL loom gave {len(got)} log-probs (NaN: {any(g != g for g in got)}) for {len(lp)} tokens")
        return 1
    d = [abs(x - y) for x, y in zip(got[1:], lp[1:])]
    d16 = [abs(x - y) for x, y in zip(lp16[1:], lp[1:])]
    mean, mx, mean16, mx16 = sum(d) / len(d), max(d), sum(d16) / len(d16), max(d16)
    ok_lp = mean < a.mean and mx < a.max
    print(f"{'PASS' if ok_lp else 'FAIL'} teacher-forced log-probs, loom cuda bf16 vs transformers float32: "
          f"{len(d)} positions, mean |diff| {mean:.4f} (< {a.mean}), max {mx:.4f} (< {a.max}); "
          f"transformers' own bf16: mean {mean16:.4f}, max {mx16:.4f}")
    worst = sorted(range(len(d)), key=lambda i: -d[i])[:5]
    # log-prob i + 1 is computed at position i, whose router gaps are gaps[i]
    print("  largest: " + ", ".join(f"pos {i + 1} |d| {d[i]:.3f} (router gap {gaps[i]:.1e})" for i in worst)
          + f"; router gap median {sorted(gaps)[len(gaps) // 2]:.1e}, min {min(gaps):.1e}")
    g = [int(x) for x in open(a.greedy).read().split()]
    want, margins, g16 = ref["greedy"], ref["greedy_margins"], ref["greedy_bf16"]
    k, k16 = first_diff(g, want), first_diff(g16, want)
    if k is None:
        ok_g, why = True, "identical"
    elif k < len(margins) and margins[k] < a.near_tie:
        ok_g, why = True, f"first differ at step {k} of {len(want)}, a near-tie (transformers' margin {margins[k]:.3f} < {a.near_tie})"
    else:
        ok_g = False
        why = f"first differ at step {k} of {len(want)} (transformers' margin {margins[k] if k < len(margins) else float('nan'):.3f})"
    print(f"{'PASS' if ok_g else 'FAIL'} greedy tokens after a {len(ref['prompt'])}-token prompt, {len(want)} steps: {why}; "
          f"transformers' own bf16: {'identical' if k16 is None else f'differs at step {k16}'}; smallest margin "
          f"{min(margins):.3f}")
    return 0 if ok_lp and ok_g else 1


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write")
    w.add_argument("out")
    w.add_argument("--layers", type=int, default=2)
    w.add_argument("--vocab", type=int, default=2048)
    w.add_argument("--tokens", type=int, default=128)
    w.add_argument("--greedy", type=int, default=32)
    w.add_argument("--seed", type=int, default=1234)
    w.add_argument("--device", default="cuda")
    c = sub.add_parser("compare")
    c.add_argument("out")
    c.add_argument("logprobs")
    c.add_argument("greedy")
    c.add_argument("--mean", type=float, default=0.05)
    c.add_argument("--max", type=float, default=0.5)
    c.add_argument("--near-tie", type=float, default=0.1)
    a = ap.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.exit(write(a) or 0 if a.cmd == "write" else compare(a))


if __name__ == "__main__":
    main()
