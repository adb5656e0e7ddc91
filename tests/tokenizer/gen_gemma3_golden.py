#!/usr/bin/env python3
"""
tests/tokenizer/gen_gemma3_golden.py — the reference encodings of Gemma 3's
SentencePiece tokenizer that test_tokenizer.c compares loom's against. Not
run by CI; rerun by hand when the strings or the model change:

    pip install transformers gguf sentencepiece
    python3 tests/tokenizer/gen_gemma3_golden.py $(scripts/fetch-model.sh gemma3-270m)

The reference is transformers' GemmaTokenizer built from the GGUF itself
(AutoTokenizer.from_pretrained(..., gguf_file=...)): a Hugging Face
`tokenizers` BPE with byte fallback, spaces normalised to U+2581 and no
prefix space, its merges rebuilt from the vocabulary in file order, the
control and user-defined pieces split out first. Ids include the BOS the
file asks for (tokenizer.ggml.add_bos_token) and parse special tokens.
The strings are gen_golden.py's (unicode, spaces, newlines, digits, emoji,
code) plus Gemma's own turn markers and whitespace runs.

Writes tests/tokenizer/data/gemma3_golden.jsonl, one {"text", "ids"} a line
(plus "decoded" where transformers' decode of the ids is not the text), and
gemma3_chat_golden.jsonl: conversations rendered by Gemma 3's chat template
(written out below: the GGUF has none) through transformers' Jinja, with
their ids.
"""
import json
import os
import sys

from transformers import AutoTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from gen_golden import TEXTS  # noqa: E402  (the shared strings)

GEMMA_TEXTS = [
    "<start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n<start_of_turn>model\n",
    "<bos>text after a literal bos",
    "two  spaces, three   spaces, eight        spaces",
    "\n\n\n\n\n\n\n\n\n\n",
    "\t\t\ttabs and\t\ttabs",
    "    indented code\n        more indented\n",
    "<start_of_image> not text",
    "<unused0> <mask> <pad>",
    "a\u2581b (a literal U+2581)",
    "trailing newline\n",
]


# Gemma 3's published chat template (google/gemma-3-*'s tokenizer_config.json),
# its text-only parts: the GGUF carries none, so it is written out here.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_user_prefix = \"\" -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif -%}"
    "{%- if (message['role'] == 'assistant') -%}{%- set role = \"model\" -%}"
    "{%- else -%}{%- set role = message['role'] -%}{%- endif -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}"
    "{{ message['content'] | trim }}"
    "{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{'<start_of_turn>model\n'}}{%- endif -%}"
)

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "  Hi!  \n"}],
    [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
     {"role": "user", "content": "And 3+3?"}],
    [{"role": "user", "content": "say <end_of_turn> literally"}],
]


def write_chat(tok):
    tok.chat_template = CHAT_TEMPLATE
    out = os.path.join(HERE, "data", "gemma3_chat_golden.jsonl")
    with open(out, "w", encoding="utf-8") as f:
        for msgs in CONVERSATIONS:
            text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
            row = {"messages": msgs, "text": text}
            if "<end_of_turn> literally" not in text:
                # special-token text inside a message is ordinary text in loom (it
                # cannot forge a turn) but a special token to transformers: no ids
                row["ids"] = tok(text, add_special_tokens=False).input_ids
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"{len(CONVERSATIONS)} chat goldens written to {out}")


def main():
    path = sys.argv[1]
    tok = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    out = os.path.join(HERE, "data", "gemma3_golden.jsonl")
    with open(out, "w", encoding="utf-8") as f:
        for text in TEXTS + GEMMA_TEXTS:
            ids = tok(text).input_ids
            row = {"text": text, "ids": ids}
            # SentencePiece cannot give back a literal U+2581: say what it decodes to
            back = tok.decode(ids[1:] if ids[:1] == [tok.bos_token_id] else ids, skip_special_tokens=False)
            if back != text:
                row["decoded"] = back
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"{len(TEXTS) + len(GEMMA_TEXTS)} goldens written to {out}")
    write_chat(tok)


if __name__ == "__main__":
    main()
