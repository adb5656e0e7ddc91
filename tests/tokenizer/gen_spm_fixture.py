#!/usr/bin/env python3
"""
tests/tokenizer/gen_spm_fixture.py — a tiny SentencePiece BPE model (Llama-2
style: identity normalisation, dummy prefix, byte fallback, split digits)
trained on a few paragraphs, exported as plain arrays plus the encodings
SentencePiece itself produces. The C test rebuilds the vocabulary with
loom_tokenizer_from_arrays() and must match every encoding. Not run by CI:

    pip install sentencepiece
    python3 tests/tokenizer/gen_spm_fixture.py

Writes tests/tokenizer/data/spm_tiny.json.
"""
import json
import os
import tempfile

import sentencepiece as spm

HERE = os.path.dirname(os.path.abspath(__file__))

CORPUS = """
The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step.
It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of foolishness.
To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer the slings and arrows.
All happy families are alike; each unhappy family is unhappy in its own way.
In the beginning the Universe was created. This has made a lot of people very angry.
Call me Ishmael. Some years ago - never mind how long precisely - having little or no money in my purse.
def main():
    for i in range(10):
        print(i, "hello world")
    return 0
The tokenizer splits text into pieces; the model sees numbers like 1234 and 2024 digit by digit.
Hello there! How are you today? I am fine, thank you. What about you?
Streaming output must never cut a character in half: café, naïve, résumé.
""" * 20


TEXTS = [
    "Hello world",
    "Hello there! How are you today?",
    " leading space",
    "two  spaces and   three",
    "trailing space ",
    "The quick brown fox jumps over the lazy dog.",
    "numbers 1234 and 2024",
    "def main():\n    return 0\n",
    "café naïve résumé",
    "unseen chars: 日本語 and emoji 😀",
    "Zebra XYZ qqq",
    "tab\tseparated",
    "",
    "a",
    "   ",
]


def main():
    with tempfile.TemporaryDirectory() as d:
        corpus = os.path.join(d, "corpus.txt")
        with open(corpus, "w", encoding="utf-8") as f:
            f.write(CORPUS)
        prefix = os.path.join(d, "tiny")
        spm.SentencePieceTrainer.train(
            input=corpus, model_prefix=prefix, model_type="bpe", vocab_size=420,
            byte_fallback=True, split_digits=True, normalization_rule_name="identity",
            remove_extra_whitespaces=False, add_dummy_prefix=True,
            allow_whitespace_only_pieces=True, character_coverage=1.0,
            bos_id=1, eos_id=2, unk_id=0, pad_id=-1, minloglevel=2)
        sp = spm.SentencePieceProcessor(model_file=prefix + ".model")
    n = sp.get_piece_size()
    tokens = [sp.id_to_piece(i) for i in range(n)]
    scores = [sp.get_score(i) for i in range(n)]
    types = []
    for i in range(n):
        if sp.is_unknown(i): types.append(2)
        elif sp.is_control(i): types.append(3)
        elif sp.is_byte(i): types.append(6)
        elif sp.is_unused(i): types.append(5)
        else: types.append(1)
    goldens = [{"text": t, "ids": sp.encode(t)} for t in TEXTS]
    out = {"tokens": tokens, "scores": scores, "types": types, "bos": 1, "eos": 2, "unk": 0,
           "goldens": goldens}
    path = os.path.join(HERE, "data", "spm_tiny.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, separators=(",", ":"))
    print(f"{n} pieces, {len(goldens)} goldens -> {path}")


if __name__ == "__main__":
    main()
