#!/usr/bin/env python3
"""Independent reference for loom's mixture-of-experts and Qwen3 models:
tiny random checkpoints built by Hugging Face transformers, written as
safetensors directories under the Hub's tensor names, and transformers' own
teacher-forced log-probabilities and greedy tokens for them (float32, CPU).

    pip install torch transformers safetensors
    gen_moe_reference.py OUT_DIR [--seed S]

For each model below it writes OUT_DIR/<name>/config.json,
OUT_DIR/<name>/model.safetensors (float32) and OUT_DIR/<name>/reference.json:
  tokens           T random token ids
  logprobs         line i = log p(tokens[i] | tokens[<i]) (0 for i = 0)
  argmax           the argmax token after each prefix tokens[<=i]
  prompt, greedy   GREEDY greedy tokens after the first PROMPT tokens, with
                   greedy_logprobs and greedy_margins (top-1 minus top-2
                   log-probability: a test can tell a near-tie from a wrong
                   token)
  router_min_gap   the smallest gap, over every layer and token of the
                   teacher-forced pass, between the k-th and (k+1)-th router
                   logit: how far the expert choice is from a tie. A seed is
                   taken only when it is above MIN_GAP, so float32 rounding
                   cannot flip an expert between implementations.

The models:
  qwen3      Qwen3ForCausalLM: QK-norm, head_dim 24 (q width != hidden), tied
  qwen3_moe  Qwen3MoeForCausalLM: 16 experts, top-4, norm_topk_prob, tied
  qwen2_moe  Qwen2MoeForCausalLM: 8 experts, top-2, no renormalisation, a
             shared expert behind its sigmoid gate, QKV bias, untied
  mixtral    MixtralForCausalLM: 8 experts, top-2 (softmax, renormalised)

transformers may hold experts fused as 3-D parameters (gate_up_proj (E, 2I,
H), down_proj (E, H, I)); the checkpoint is always written with the Hub's
per-expert names (mlp.experts.E.{gate,up,down}_proj.weight, Mixtral's
block_sparse_moe.experts.E.w1/w2/w3.weight), and the reference is computed
by the model that from_pretrained() reads back from that directory, after
checking it gives the same logits as the model that wrote it.
"""
import argparse
import json
import os
import re
import sys

import torch
import transformers
from safetensors.torch import save_file

VOCAB, HIDDEN, LAYERS = 256, 64, 2
T, PROMPT, GREEDY = 32, 8, 16
MIN_GAP = 2e-3

COMMON = dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, rms_norm_eps=1e-6,
              max_position_embeddings=512, rope_theta=10000.0, bos_token_id=1, eos_token_id=2)

MODELS = {
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM",
              dict(intermediate_size=96, num_attention_heads=4, num_key_value_heads=1, head_dim=24,
                   attention_bias=False, tie_word_embeddings=True, use_sliding_window=False)),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  dict(intermediate_size=96, moe_intermediate_size=16, num_experts=16,
                       num_experts_per_tok=4, norm_topk_prob=True, decoder_sparse_step=1,
                       mlp_only_layers=[], num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                       attention_bias=False, tie_word_embeddings=True, use_sliding_window=False)),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                  dict(intermediate_size=96, moe_intermediate_size=16, shared_expert_intermediate_size=32,
                       num_experts=8, num_experts_per_tok=2, norm_topk_prob=False, decoder_sparse_step=1,
                       mlp_only_layers=[], num_attention_heads=4, num_key_value_heads=2,
                       tie_word_embeddings=False, use_sliding_window=False)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM",
                dict(intermediate_size=24, num_local_experts=8, num_experts_per_tok=2,
                     num_attention_heads=4, num_key_value_heads=2, sliding_window=None,
                     tie_word_embeddings=False)),
}


def randomize(model, gen):
    """Default init gives near-uniform logits and routers; scale up so the
    comparison means something. Norm weights and biases are randomized too,
    so a loader that drops one is caught."""
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() >= 2:
                fan_in = p.shape[-1]
                std = 0.5 if ("embed" in n or "lm_head" in n) else fan_in ** -0.5
                p.copy_(torch.randn(p.shape, generator=gen) * std)
            elif n.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
            else:  # RMSNorm weights
                p.copy_(torch.rand(p.shape, generator=gen) + 0.5)


def split_fused(name, t, n_inter, gate_first, hidden=HIDDEN):
    """transformers' fused expert parameters -> the Hub's per-expert names
    (gate_up_proj holds gate then up when gate_first)."""
    base = name[: -len(".gate_up_proj")] if name.endswith(".gate_up_proj") else name[: -len(".down_proj")]
    out = {}
    E = t.shape[0]
    if name.endswith(".gate_up_proj"):
        if t.shape[1:] == (hidden, 2 * n_inter):
            t = t.transpose(1, 2)
        assert t.shape[1:] == (2 * n_inter, hidden), f"{name}: unexpected shape {tuple(t.shape)}"
        g, u = (slice(0, n_inter), slice(n_inter, None)) if gate_first else (slice(n_inter, None), slice(0, n_inter))
        for e in range(E):
            out[f"{base}.{e}.gate_proj.weight"] = t[e, g]
            out[f"{base}.{e}.up_proj.weight"] = t[e, u]
    else:
        if t.shape[1:] == (n_inter, hidden):
            t = t.transpose(1, 2)
        assert t.shape[1:] == (hidden, n_inter), f"{name}: unexpected shape {tuple(t.shape)}"
        for e in range(E):
            out[f"{base}.{e}.down_proj.weight"] = t[e]
    return out


MIXTRAL_NAMES = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}


def hub_state(model, name, cfg, gate_first):
    """The state dict under the names published checkpoints use, and whether
    transformers held any expert fused."""
    n_inter = getattr(cfg, "moe_intermediate_size", None) or cfg.intermediate_size
    out, fused = {}, False
    for k, v in model.state_dict().items():
        if cfg.tie_word_embeddings and k == "lm_head.weight":
            continue
        if k.endswith("experts.gate_up_proj") or k.endswith("experts.down_proj"):
            out.update(split_fused(k, v, n_inter, gate_first, cfg.hidden_size))
            fused = True
        else:
            out[k] = v
    if name == "mixtral":
        renamed = {}
        for k, v in out.items():
            k = k.replace(".mlp.", ".block_sparse_moe.")
            m = re.match(r"(.*\.experts\.\d+)\.(gate_proj|up_proj|down_proj)\.weight$", k)
            if m:
                k = f"{m.group(1)}.{MIXTRAL_NAMES[m.group(2)]}.weight"
            renamed[k] = v
        out = renamed
    return {k: v.detach().float().contiguous().clone() for k, v in out.items()}, fused


def router_gates(model):
    """The router linears (mlp.gate / block_sparse_moe.gate) with their top-k."""
    gates = []
    for n, mod in model.named_modules():
        if re.search(r"\.(mlp|block_sparse_moe)\.gate$", n) and hasattr(mod, "weight"):
            gates.append(mod)
    return gates


def min_router_gap(model, cfg, ids):
    """Smallest k-th minus (k+1)-th router logit over layers and tokens."""
    k = cfg.num_experts_per_tok
    gaps = []

    def hook(mod, args, kwargs):
        x = args[0] if args else next(iter(kwargs.values()))
        x = x.reshape(-1, x.shape[-1]).float()
        logits = x @ mod.weight.float().t()
        top = torch.topk(logits, k + 1, dim=-1).values
        gaps.append(float((top[:, k - 1] - top[:, k]).min()))

    hs = [g.register_forward_pre_hook(hook, with_kwargs=True) for g in router_gates(model)]
    with torch.no_grad():
        model(ids)
    for h in hs:
        h.remove()
    assert len(gaps) == cfg.num_hidden_layers, f"found {len(gaps)} routers for {cfg.num_hidden_layers} layers"
    return min(gaps)


def build(name, seed):
    cfg_cls, model_cls, extra = MODELS[name]
    cfg = getattr(transformers, cfg_cls)(**COMMON, **extra, attn_implementation="eager")
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(cfg).float().eval()
    randomize(model, torch.Generator().manual_seed(seed))
    return cfg, model


def write_config(cfg, d, name):
    """config.json as this transformers writes it, with the architecture
    named (a bare config does not know its model class)."""
    cfg.save_pretrained(d)
    p = os.path.join(d, "config.json")
    with open(p) as f:
        c = json.load(f)
    c["architectures"] = [MODELS[name][1]]
    c.pop("_attn_implementation", None)
    c.pop("_attn_implementation_autoset", None)
    with open(p, "w") as f:
        json.dump(c, f, indent=2, sort_keys=True)
        f.write("\n")


def load_back(d):
    try:
        return transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32,
                                                                 attn_implementation="eager").eval()
    except TypeError:  # transformers before dtype= (4.x)
        return transformers.AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32,
                                                                 attn_implementation="eager").eval()


def teacher_forced(model, ids):
    with torch.no_grad():
        logits = model(ids).logits[0].double()
    lp = torch.log_softmax(logits, -1)
    ref = [0.0] + [float(lp[i, ids[0, i + 1]]) for i in range(ids.shape[1] - 1)]
    return logits, ref, [int(t) for t in logits.argmax(-1)]


def greedy(model, prompt):
    seq = list(prompt)
    toks, lps, margins = [], [], []
    with torch.no_grad():
        for _ in range(GREEDY):
            lp = torch.log_softmax(model(torch.tensor([seq])).logits[0, -1].double(), -1)
            top = torch.topk(lp, 2)
            t = int(top.indices[0])
            toks.append(t)
            lps.append(float(top.values[0]))
            margins.append(float(top.values[0] - top.values[1]))
            seq.append(t)
    return toks, lps, margins


def make(name, out, seed0):
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    moe = name != "qwen3"
    for seed in range(seed0, seed0 + 50):
        cfg, model = build(name, seed)
        g = torch.Generator().manual_seed(seed + 1)
        ids = torch.randint(0, VOCAB, (1, T), generator=g)
        gap = min_router_gap(model, cfg, ids) if moe else None
        if gap is None or gap >= MIN_GAP:
            break
        print(f"{name}: seed {seed} has a router gap of {gap:.2e}; trying the next", file=sys.stderr)
    else:
        raise SystemExit(f"{name}: no seed in [{seed0}, {seed0 + 50}) keeps the router gap above {MIN_GAP}")
    for gate_first in (True, False):
        state, fused = hub_state(model, name, cfg, gate_first)
        save_file(state, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
        write_config(cfg, d, name)
        back = load_back(d)
        with torch.no_grad():
            diff = float((back(ids).logits - model(ids).logits).abs().max())
        if diff <= 1e-5 or not fused:
            break
        print(f"{name}: fused gate_up_proj read as {'gate, up' if gate_first else 'up, gate'} "
              f"misses by {diff}; trying the other order", file=sys.stderr)
    assert diff <= 1e-5, f"{name}: the checkpoint read back gives logits {diff} away from the model that wrote it"
    _, ref, argmax = teacher_forced(back, ids)
    prompt = [int(t) for t in ids[0, :PROMPT]]
    toks, lps, margins = greedy(back, prompt)
    doc = {"model": name, "class": MODELS[name][1], "transformers": transformers.__version__,
           "torch": torch.__version__, "seed": seed, "dtype": "float32", "device": "cpu",
           "tokens": [int(t) for t in ids[0]], "logprobs": ref, "argmax": argmax,
           "prompt": prompt, "greedy": toks, "greedy_logprobs": lps, "greedy_margins": margins,
           "router_min_gap": gap, "readback_max_diff": diff}
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
    print(f"{name}: seed {seed}, {size / 1024:.0f} KiB, router gap {gap}, greedy margin min "
          f"{min(margins):.4f}", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--only", choices=sorted(MODELS), action="append")
    a = ap.parse_args()
    torch.set_num_threads(1)
    failed = []
    for name in a.only or MODELS:
        try:  # one model's failure (an option this transformers lacks) leaves the others written
            make(name, a.out, a.seed)
        except Exception as e:  # noqa: BLE001 — reported and counted below
            print(f"{name}: FAILED: {type(e).__name__}: {e}", file=sys.stderr)
            failed.append(name)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}: "
          f"{len(a.only or MODELS) - len(failed)} written, failed: {failed or 'none'}", file=sys.stderr)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
