#!/usr/bin/env python3
"""Gemma 3 270M through loom against transformers' reference
(tests/engine/data/gemma3_reference.json: Gemma3ForCausalLM in float32 on
the GGUF's dequantized weights, tests/engine/gen_gemma3_reference.py) — the
check tests/engine/test_engine_gemma3.c makes on the cpu backend, for any
pipeline (the cuda backend on the GPU machine: scripts/gpu/gpu-check.sh
gemma).

    check_gemma3_reference.py inputs REF.json DIR
        writes DIR/prompts.txt (each case's prompt ids, one line each) and
        DIR/tokens.txt (prompt + the reference's greedy ids)
    check_gemma3_reference.py check REF.json GREEDY.txt SCORE.txt WHAT [--tol T]
        GREEDY.txt: `engine_tool greedy-file PIPELINE 12 DIR/prompts.txt`;
        SCORE.txt:  `engine_tool score-file PIPELINE DIR/tokens.txt`.

Teacher-forced: the log-prob loom gives each of the reference's greedy
tokens after the reference's own prefix, every one within T. Greedy: each
case's tokens must be the reference's, the log-prob of each within T, up to
a near-tie where the rest is not compared (the texts diverge): at the first
token that differs, loom's log-prob of transformers' token (from the
teacher-forced run: the same prefix) within T of loom's own choice, and
transformers' top two within T of each other (its log-prob of loom's token
is known only when that is its runner-up: then that one within T). At
least half of all greedy tokens must be compared. One line, PASS or FAIL,
with the counts and the largest and mean differences; exit status 1 on
FAIL.
"""
import argparse
import json
import os
import sys


def load(path):
    with open(path) as f:
        return json.load(f)["cases"]


def inputs(ref, out):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "prompts.txt"), "w") as p, open(os.path.join(out, "tokens.txt"), "w") as t:
        for c in load(ref):
            p.write(" ".join(map(str, c["prompt_ids"])) + "\n")
            t.write(" ".join(map(str, c["prompt_ids"] + c["greedy_ids"])) + "\n")


def lines(path):
    with open(path) as f:
        return [ln.split() for ln in f if ln.strip()]


def check(ref, greedy_path, score_path, what, tol):
    try:
        cases = load(ref)
        greedy, score = lines(greedy_path), lines(score_path)
    except (OSError, ValueError, KeyError) as e:
        print(f"FAIL {what}: {e}")
        return 1
    problems = []
    if len(greedy) != len(cases) or len(score) != len(cases):
        problems.append(f"{len(greedy)} greedy and {len(score)} score lines for {len(cases)} cases")
    steps = sum(len(c["greedy_ids"]) for c in cases)
    compared, ties, g_diffs, t_diffs = 0, 0, [], []
    for i, c in enumerate(cases):
        n0 = len(c["prompt_ids"])
        forced = None  # loom's teacher-forced log-probs of the reference's greedy tokens
        if i < len(score):
            sc = [float(x) for x in score[i]]
            if len(sc) != n0 + len(c["greedy_ids"]):
                problems.append(f"case {i}: {len(sc)} scored tokens, want {n0 + len(c['greedy_ids'])}")
            else:
                forced = sc[n0:]
                for k, rlp in enumerate(c["greedy_logprobs"]):
                    d = abs(forced[k] - rlp)
                    t_diffs.append(d)
                    if d > tol:
                        problems.append(f"case {i} teacher-forced token {k}: log-prob {forced[k]:.5f}, "
                                        f"transformers {rlp:.5f}")
        if i < len(greedy):
            g = greedy[i]
            if len(g) % 4:
                problems.append(f"case {i}: greedy line of {len(g)} fields")
                g = []
            got = [(int(g[k]), float(g[k + 1]), int(g[k + 2]), float(g[k + 3])) for k in range(0, len(g), 4)]
            if len(got) != len(c["greedy_ids"]):
                problems.append(f"case {i}: {len(got)} greedy tokens, the reference {len(c['greedy_ids'])}")
            for k, (tok, lp, alt, alt_lp) in enumerate(got[: len(c["greedy_ids"])]):
                rt, rlp, ralt, ralt_lp = c["greedy_ids"][k], c["greedy_logprobs"][k], c["alt_ids"][k], c["alt_logprobs"][k]
                if tok == rt:
                    d = abs(lp - rlp)
                    g_diffs.append(d)
                    compared += 1
                    if d > tol:
                        problems.append(f"case {i} token {k} (id {tok}): log-prob {lp:.5f}, transformers {rlp:.5f}")
                    continue
                loom_rt = forced[k] if forced else float("-inf")  # loom's log-prob of transformers' token
                tie = lp - loom_rt <= tol and rlp - ralt_lp <= tol
                if tie:
                    ties += 1
                    print(f"INFO {what}: case {i} near-tie at token {k}: loom {tok} (lp {lp:.5f}; transformers' "
                          f"{rt} {loom_rt:.5f} there), transformers {rt} (lp {rlp:.5f}, runner-up {ralt} "
                          f"{ralt_lp:.5f}); rest not compared")
                else:
                    problems.append(f"case {i} token {k}: loom {tok} (lp {lp:.5f}, runner-up {alt} {alt_lp:.5f}; "
                                    f"transformers' {rt} {loom_rt:.5f}) vs transformers {rt} (lp {rlp:.5f}, "
                                    f"runner-up {ralt} {ralt_lp:.5f}): not a near-tie")
                break
    if compared < steps / 2:
        problems.append(f"only {compared} of {steps} greedy tokens compared")
    ok = not problems

    def stat(d):
        return f"max {max(d):.4f} mean {sum(d) / len(d):.4f}" if d else "none"

    print(f"{'PASS' if ok else 'FAIL'} {what}: greedy {compared}/{steps} tokens as transformers' ({ties} near-ties), "
          f"|logprob diff| {stat(g_diffs)}; teacher-forced {len(t_diffs)}/{steps}, |diff| {stat(t_diffs)}; tolerance {tol}")
    for p in problems[:10]:
        print(f"  {what}: {p}")
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("inputs")
    a.add_argument("ref")
    a.add_argument("dir")
    b = sub.add_parser("check")
    b.add_argument("ref")
    b.add_argument("greedy")
    b.add_argument("score")
    b.add_argument("what")
    b.add_argument("--tol", type=float, default=0.3)
    args = ap.parse_args()
    if args.cmd == "inputs":
        inputs(args.ref, args.dir)
        return 0
    return check(args.ref, args.greedy, args.score, args.what, args.tol)


if __name__ == "__main__":
    sys.exit(main())
