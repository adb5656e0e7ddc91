#!/usr/bin/env python3
"""scripts/logprob-diff.py — compare two `loom perplexity --logprobs FILE` outputs
token by token (same text, window and --max-tokens; the positions and token ids
must match).

    loom perplexity configs/default.yaml TEXT --logprobs ref.lp
    loom perplexity configs/quant/int8-w8a8.yaml TEXT --logprobs q.lp
    scripts/logprob-diff.py ref.lp q.lp [--json]

Prints, over the scored tokens, with d = log p(B) - log p(A):
  mean_nll_delta  -mean(d): B's mean NLL minus A's (log of the perplexity ratio;
                  per-token errors of both signs cancel in it)
  mean_abs        mean |d|: how far B moves each token's log-probability; it does
                  not cancel, so it ranks perturbations of the model more stably
                  than a perplexity difference on a few thousand tokens
  rms             sqrt(mean d^2)
"""
import json
import math
import sys


def read(path):
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            parts = line.split("\t")
            if len(parts) != 3:
                sys.exit(f"logprob-diff: {path}:{n}: expected 'position<TAB>token<TAB>log p'")
            rows.append((int(parts[0]), int(parts[1]), float(parts[2])))
    if not rows:
        sys.exit(f"logprob-diff: {path}: no scored tokens")
    return rows


def main(argv):
    args = [a for a in argv if a != "--json"]
    if len(args) != 2 or any(a in ("-h", "--help") for a in argv):
        print(__doc__.strip())
        return 0 if any(a in ("-h", "--help") for a in argv) else 2
    a, b = read(args[0]), read(args[1])
    if len(a) != len(b):
        sys.exit(f"logprob-diff: {args[0]} has {len(a)} tokens, {args[1]} {len(b)}: "
                 "score the same text with the same --window and --max-tokens")
    s = sa = s2 = 0.0
    for (pa, ta, la), (pb, tb, lb) in zip(a, b):
        if (pa, ta) != (pb, tb):
            sys.exit(f"logprob-diff: position {pa} token {ta} vs position {pb} token {tb}: "
                     "not the same text / tokenizer")
        d = lb - la
        s += d
        sa += abs(d)
        s2 += d * d
    n = len(a)
    out = {"tokens": n, "mean_nll_delta": -s / n, "mean_abs": sa / n, "rms": math.sqrt(s2 / n),
           "ppl_ratio": math.exp(-s / n)}
    if "--json" in argv:
        print(json.dumps(out))
    else:
        print(f"tokens {n}  mean NLL delta {out['mean_nll_delta']:+.5f} (ppl x{out['ppl_ratio']:.4f})"
              f"  mean |d| {out['mean_abs']:.5f}  rms {out['rms']:.5f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
