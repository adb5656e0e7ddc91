#!/usr/bin/env python3
"""
tests/tokenizer/gen_golden.py — build the reference encodings the tokenizer
tests compare against. Not run by CI (no Python in tests); rerun by hand when
the strings or the model change:

    pip install gguf tokenizers
    python3 tests/tokenizer/gen_golden.py /root/.cache/loom/models/SmolLM2-135M-Instruct.Q4_1.gguf

It reads vocab, merges and token types from the GGUF with the `gguf` package,
builds a Hugging Face `tokenizers` BPE with the pre-tokenizer SmolLM2's own
tokenizer.json declares (Sequence[Digits(individual_digits), ByteLevel(use_regex)]),
and writes, under tests/tokenizer/data/:
  smollm2_golden.jsonl          one {"text", "ids"} per line (added tokens parsed)
  smollm2-tokenizer.json        the same tokenizer serialised by HF (from_json test)
  smollm2-tokenizer_config.json chat template, bos/eos, add_bos_token
"""
import json
import os
import sys

from gguf import GGUFReader
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "data")

TEXTS = [
    "Hello world",
    "Hello, world!",
    " Hello world",
    "  leading spaces",
    "trailing spaces   ",
    "The quick brown fox jumps over the lazy dog.",
    "What's the time? It's 5 o'clock, isn't it? We'll see, they've said I'd go.",
    "I'M SHOUTING AND DON'T CARE",
    "12345",
    "3.14159265358979",
    "Call 555-0123 or +1 (800) 123-4567 by 2024-12-31.",
    "1,000,000 dollars and 0.5%",
    "x = 42\ny = x ** 2 + 3",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "#include <stdio.h>\nint main(void) { printf(\"hi\\n\"); return 0; }\n",
    "for (int i = 0; i < 10; ++i) {\n\tsum += a[i];\n}",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    "<html><body><p class=\"x\">Hi</p></body></html>",
    "{\"key\": [1, 2, 3], \"nested\": {\"a\": null}}",
    "https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct?x=1&y=2",
    "email: someone@example.com",
    "Emoji: 😀😃😄 👍🏽 ❤️ 🇫🇷",
    "👨‍👩‍👧‍👦 family",
    "日本語のテキストです。",
    "中文测试：你好，世界！",
    "한국어 문장입니다.",
    "Ελληνικά κείμενα",
    "Русский текст, ёлки-палки.",
    "العربية نص",
    "עברית",
    "हिन्दी पाठ",
    "café naïve résumé coöperate façade",
    "Ångström Øresund Æsir ß",
    "ñandú pingüino",
    "tabs\tand\ttabs",
    "many     spaces     here",
    "line1\nline2\n\nline4\n\n\n",
    "windows\r\nline\r\nendings",
    "\n\n\n",
    " ",
    "   ",
    "\t",
    "a",
    "",
    "mixed123abc456def",
    "version v1.2.3-beta+build.45",
    "!!!???...,,,;;;",
    "--- *** ___ ~~~ ```",
    "¡Hola! ¿Qué tal?",
    "non\u00a0breaking\u00a0space",
    "zero\u200bwidth",
    "math: ∑ᵢ xᵢ² ≤ ∞, α β γ, √2 ≈ 1.414",
    "superscripts ² ³ ¼ ½ and digits ١٢٣ ５６",
    "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n",
    "text <|endoftext|> more text",
    "<|im_end|><|im_end|>",
    "not special: <|im_start without end and <im_start>",
    "<filename>main.py<file_sep>print(1)",
    "A" * 300,
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "Don't stop believin'",
    "'s 't 're 've 'm 'll 'd",
    "under_score camelCase PascalCase kebab-case SCREAMING_CASE",
    "The year 1999 and the year 2000 were 1 year apart.",
]


def gguf_vocab(path):
    r = GGUFReader(path)

    def strs(key):
        f = r.fields[key]
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    def scalar(key, default=None):
        f = r.fields.get(key)
        if f is None:
            return default
        v = f.parts[f.data[0]]
        if f.types[0].name == "STRING":
            return bytes(v).decode("utf-8")
        return v.tolist()[0]

    tokens = strs("tokenizer.ggml.tokens")
    merges = strs("tokenizer.ggml.merges")
    tt = r.fields["tokenizer.ggml.token_type"]
    types = [int(tt.parts[i][0]) for i in tt.data]
    assert scalar("tokenizer.ggml.model") == "gpt2"
    assert scalar("tokenizer.ggml.pre") == "smollm", scalar("tokenizer.ggml.pre")
    return dict(tokens=tokens, merges=merges, types=types,
                bos=scalar("tokenizer.ggml.bos_token_id"),
                eos=scalar("tokenizer.ggml.eos_token_id"),
                add_bos=bool(scalar("tokenizer.ggml.add_bos_token", False)),
                template=scalar("tokenizer.chat_template"))


def build(v):
    vocab = {t: i for i, t in enumerate(v["tokens"])}
    merges = [tuple(m.split(" ", 1)) for m in v["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(v["tokens"], v["types"]) if ty == 3])
    return tok


def main():
    model = sys.argv[1] if len(sys.argv) > 1 else os.path.expanduser(
        "~/.cache/loom/models/SmolLM2-135M-Instruct.Q4_1.gguf")
    v = gguf_vocab(model)
    tok = build(v)
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "smollm2_golden.jsonl"), "w", encoding="utf-8") as f:
        for text in TEXTS:
            ids = tok.encode(text, add_special_tokens=False).ids
            assert tok.decode(ids, skip_special_tokens=False) == text, text
            f.write(json.dumps({"text": text, "ids": ids}, ensure_ascii=False) + "\n")
    # Compact serialisation keeps the fixture small enough to commit.
    js = json.loads(tok.to_str())
    with open(os.path.join(OUT, "smollm2-tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(js, f, ensure_ascii=False, separators=(",", ":"))
    cfg = {"add_bos_token": v["add_bos"], "bos_token": v["tokens"][v["bos"]],
           "eos_token": v["tokens"][v["eos"]], "chat_template": v["template"]}
    with open(os.path.join(OUT, "smollm2-tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=1)
    print(f"{len(TEXTS)} goldens written to {OUT}")


if __name__ == "__main__":
    main()
