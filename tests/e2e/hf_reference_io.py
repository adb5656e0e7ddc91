"""tests/e2e/hf_reference_io.py — what the transformers reference writers
(hf_llama_reference.py, hf_gemma3_reference.py) write alike: the token ids,
transformers' teacher-forced log-probabilities of them, and optionally its
greedy continuation of their first tokens. Imported from beside them."""
import os

import torch


def write_teacher_forced(model, ids, out, dev):
    """tokens.txt and ref_logprobs.txt (0 for the first token); returns the
    float32 logits (tokens, vocab)."""
    with torch.no_grad():
        logits = model(ids.to(dev)).logits.float()[0]
    lp = torch.log_softmax(logits, dim=-1)
    ref = [0.0] + [lp[i, ids[0, i + 1]].item() for i in range(ids.shape[1] - 1)]
    with open(os.path.join(out, "tokens.txt"), "w") as f:
        f.write(" ".join(str(int(t)) for t in ids[0]) + "\n")
    with open(os.path.join(out, "ref_logprobs.txt"), "w") as f:
        f.write("\n".join(f"{v:.6f}" for v in ref) + "\n")
    return logits


def write_greedy(model, ids, prompt_len, new_tokens, out, dev):
    """prompt.txt (the first prompt_len ids), ref_greedy.txt (new_tokens
    greedy tokens after it, EOS ignored) and ref_margins.txt (at each of
    them, the chosen token's logit minus the best other one's: a small gap
    is a near-tie another arithmetic may flip)."""
    prompt = ids[:, :prompt_len].to(dev)
    with torch.no_grad():
        gen = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=False, num_beams=1, eos_token_id=None,
                             pad_token_id=0, output_logits=True, return_dict_in_generate=True)
    margins = []
    for i, step in enumerate(gen.logits):  # raw logits, one row a generated token
        row = step[0].double()
        chosen = int(gen.sequences[0, prompt_len + i])
        others = torch.cat([row[:chosen], row[chosen + 1:]])
        margins.append(float(row[chosen] - others.max()))
    with open(os.path.join(out, "prompt.txt"), "w") as f:
        f.write(" ".join(str(int(t)) for t in prompt[0]) + "\n")
    with open(os.path.join(out, "ref_greedy.txt"), "w") as f:
        f.write(" ".join(str(int(t)) for t in gen.sequences[0, prompt_len:]) + "\n")
    with open(os.path.join(out, "ref_margins.txt"), "w") as f:
        f.write(" ".join("%.6g" % m for m in margins) + "\n")
