/*
 * core/tokenizer/tokenizer.h — text <-> token ids for the models loom runs:
 * byte-level BPE (GPT-2 family: SmolLM2, Llama 3, Qwen2, ...) and
 * SentencePiece-style BPE (Llama 2, Mistral), built from a GGUF file, from a
 * Hugging Face tokenizer.json, or from plain arrays (tests, converters).
 * Also: streaming detokenization that never splits a UTF-8 character, and the
 * three chat-template families loom knows (ChatML, Llama 3, Llama 2/Mistral).
 *
 * What it is not: a Jinja interpreter. Chat templates are recognised from
 * their text and rendered by hand-written code per family.
 *
 * Threads: a built tokenizer is immutable; every function taking a
 * `const loom_tokenizer *` may run concurrently. A loom_detok belongs to one
 * stream and is not shared.
 */
#ifndef LOOM_CORE_TOKENIZER_H
#define LOOM_CORE_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom/plugin.h"
#include "model/gguf.h"

typedef struct loom_tokenizer loom_tokenizer;

/* GGUF token types (tokenizer.ggml.token_type). */
typedef enum loom_token_type {
    LOOM_TOKEN_UNDEFINED = 0,
    LOOM_TOKEN_NORMAL = 1,
    LOOM_TOKEN_UNKNOWN = 2,
    LOOM_TOKEN_CONTROL = 3,      /* <|im_start|>, <s>: matched in text only with parse_special */
    LOOM_TOKEN_USER_DEFINED = 4, /* added tokens: always matched in text as a whole          */
    LOOM_TOKEN_UNUSED = 5,
    LOOM_TOKEN_BYTE = 6,         /* <0xNN> byte-fallback tokens (SentencePiece)              */
} loom_token_type;

/* ------------------------------------------------------------ construction */

/* Plain arrays, what a GGUF holds. Start from loom_tokenizer_spec_init()
 * (ids -1 = none, flags -1 = model default) and fill what you have. Nothing
 * is kept: the builder copies every string. */
typedef struct loom_tokenizer_spec {
    const char *model;            /* "gpt2" (byte-level BPE) or "llama" (SentencePiece BPE) */
    const char *pre;              /* tokenizer.ggml.pre; NULL = "default" (GPT-2 regex)     */
    int32_t n_vocab;
    const char *const *tokens;    /* [n_vocab] as stored: byte-level chars ("Ġthe") or "▁the" */
    const uint32_t *token_lens;   /* [n_vocab] byte lengths; NULL: tokens are NUL-terminated */
    const float *scores;          /* [n_vocab] SentencePiece merge scores; NULL: all 0      */
    const int32_t *token_types;   /* [n_vocab] loom_token_type; NULL: all NORMAL            */
    int32_t n_merges;             /* byte-level BPE: merges in rank order                    */
    const char *const *merges;    /* [n_merges] "left right"                                 */
    const uint32_t *merge_lens;   /* [n_merges]; NULL: NUL-terminated                        */
    int32_t bos_id, eos_id, unk_id, eot_id, eom_id, pad_id; /* -1: none                     */
    int add_bos;                  /* 1/0; -1: model default (llama yes, gpt2 no)             */
    int add_space_prefix;         /* 1/0; -1: model default (llama yes, gpt2 no)             */
    const char *chat_template;    /* Jinja text or NULL; only inspected, never executed      */
    size_t chat_template_len;     /* 0: NUL-terminated                                       */
} loom_tokenizer_spec;

void loom_tokenizer_spec_init(loom_tokenizer_spec *spec);
loom_status loom_tokenizer_from_arrays(const loom_tokenizer_spec *spec, loom_tokenizer **out,
                                       loom_error *err);

/* From the tokenizer.* keys of a GGUF (model "gpt2" or "llama"; pre = the
 * tokenizer.ggml.pre family: "smollm", "llama-bpe", "gpt2", "qwen2",
 * "default", ...). The tokenizer copies what it needs; `g` may be closed after. */
loom_status loom_tokenizer_from_gguf(const loom_gguf *g, loom_tokenizer **out, loom_error *err);

/* From a Hugging Face tokenizer.json (model BPE; pre-tokenizers ByteLevel,
 * Split, Digits, Metaspace and Sequences of them; SentencePiece-style
 * normalizers Prepend/Replace "▁"). tokenizer_config_json_path (nullable)
 * supplies chat_template, bos_token, eos_token and add_bos_token. Either
 * file over 64 MiB is refused (LOOM_ERR_FORMAT) before it is read. */
loom_status loom_tokenizer_from_json(const char *tokenizer_json_path,
                                     const char *tokenizer_config_json_path, loom_tokenizer **out,
                                     loom_error *err);

/* The same from bytes in memory (`len` of tokenizer.json; config_json, may
 * be NULL, config_len of tokenizer_config.json; neither need be
 * NUL-terminated) with the same checks and the same 64 MiB cap; `name`
 * (NULL: "tokenizer.json") names it in errors. loom_tokenizer_from_json
 * reads the files and parses them the same way. [any] thread. */
loom_status loom_tokenizer_from_json_buffer(const char *json, size_t len, const char *config_json,
                                            size_t config_len, const char *name, loom_tokenizer **out,
                                            loom_error *err);

void loom_tokenizer_free(loom_tokenizer *t);

/* ----------------------------------------------------------------- queries */

int32_t loom_tokenizer_vocab_size(const loom_tokenizer *t);
int32_t loom_tokenizer_bos(const loom_tokenizer *t); /* -1 if none */
int32_t loom_tokenizer_eos(const loom_tokenizer *t); /* -1 if none */
bool loom_tokenizer_adds_bos(const loom_tokenizer *t);
/* End of generation: eos, eot, eom and the usual end markers by text
 * (<|im_end|>, <|eot_id|>, <|end_of_text|>, <|endoftext|>, </s>, ...). */
bool loom_tokenizer_is_eog(const loom_tokenizer *t, int32_t id);
/* Id of the token stored exactly as `piece` ("Ġthe", "<|im_end|>"); for
 * byte-level vocabularies also accepts the decoded text (" the"). -1 if none. */
int32_t loom_tokenizer_find(const loom_tokenizer *t, const char *piece);
/* The token as stored in the vocabulary (NUL-terminated) or NULL if out of range. */
const char *loom_tokenizer_token_text(const loom_tokenizer *t, int32_t id);
loom_token_type loom_tokenizer_token_type(const loom_tokenizer *t, int32_t id);
/* The bytes the token decodes to (not NUL-terminated; may be partial UTF-8). */
const char *loom_tokenizer_piece(const loom_tokenizer *t, int32_t id, size_t *len);
/* The UTF-8 character at s (n > 0 bytes left), by the decoder's own rules (no
 * overlong forms, no surrogates, nothing past U+10FFFF): 1 = valid, *adv its
 * bytes; 0 = a valid prefix cut by the end; -1 = invalid, *adv the maximal
 * ill-formed subpart. */
int loom_utf8_next(const unsigned char *s, size_t n, size_t *adv);
/* Longest piece in bytes: a loom_detok_push() buffer of at least
 * loom_tokenizer_max_piece_len() + LOOM_DETOK_PENDING_MAX + 1 bytes never
 * holds back complete text. */
size_t loom_tokenizer_max_piece_len(const loom_tokenizer *t);
/* "gpt2" or "llama", and the pre-tokenizer family name ("smollm", "json", ...). */
const char *loom_tokenizer_model_name(const loom_tokenizer *t);
const char *loom_tokenizer_pre_name(const loom_tokenizer *t);
/* The Jinja chat template text from GGUF/config, or NULL. */
const char *loom_tokenizer_chat_template(const loom_tokenizer *t);

/* ---------------------------------------------------------- encode/decode */

/* Encode UTF-8 text (`len` bytes; need not be NUL-terminated). add_bos:
 * prepend BOS if the model wants one; parse_special: recognise CONTROL tokens
 * such as <|im_start|> in the text (USER_DEFINED added tokens are always
 * recognised). Invalid UTF-8 is encoded through byte tokens, never a crash.
 * *ids is malloc'd (caller frees; non-NULL even when *n == 0). */
loom_status loom_tokenizer_encode(const loom_tokenizer *t, const char *text, size_t len,
                                  bool add_bos, bool parse_special, int32_t **ids, int32_t *n,
                                  loom_error *err);
/* Decode to malloc'd UTF-8 bytes, *len of them (plus a NUL after them that
 * is not counted): text may itself hold NUL characters (a vocabulary's
 * byte 0, "\u0000" in a tokenizer.json), so callers that pass the text on
 * use *len, not strlen. Invalid byte sequences become U+FFFD. skip_special
 * drops CONTROL and UNKNOWN tokens. For SentencePiece vocabularies with
 * add_space_prefix, the space the encoder added before the first text
 * token is removed. Unknown ids are an error. */
loom_status loom_tokenizer_decode_bytes(const loom_tokenizer *t, const int32_t *ids, int32_t n, bool skip_special,
                                        char **out, size_t *len, loom_error *err);
/* The same as a C string: text after a NUL character is cut off (for
 * callers that only show text). */
loom_status loom_tokenizer_decode(const loom_tokenizer *t, const int32_t *ids, int32_t n,
                                  bool skip_special, char **out, loom_error *err);

/* ------------------------------------------------- streaming detokenizer */

#define LOOM_DETOK_PENDING_MAX 256

/* Incremental detokenizer for streaming: push ids one by one, get the newly
 * complete text. Never emits half a UTF-8 character; the concatenation of
 * every push plus the final flush equals loom_tokenizer_decode() of all ids.
 * Plain data: no heap, nothing to free. */
typedef struct loom_detok {
    const loom_tokenizer *t;
    bool skip_special;
    bool started;     /* a text piece went out (SentencePiece leading-space rule) */
    bool overflowed;  /* bytes were dropped: out buffers were far too small */
    uint32_t n_pending;
    unsigned char pending[LOOM_DETOK_PENDING_MAX]; /* incomplete UTF-8 tail / text that did not fit */
} loom_detok;

void loom_detok_init(loom_detok *d, const loom_tokenizer *t, bool skip_special);
/* Append a token; writes the newly complete text (may be empty)
 * NUL-terminated into out (cap bytes); returns bytes written (excluding the
 * NUL). Text that does not fit stays pending for the next call, so cap must
 * be at least 5 (one 4-byte character + NUL) to make progress; ids outside
 * the vocabulary are ignored. */
size_t loom_detok_push(loom_detok *d, int32_t id, char *out, size_t cap);
/* Emit the rest (invalid or truncated sequences as U+FFFD) and reset. */
size_t loom_detok_flush(loom_detok *d, char *out, size_t cap);

/* ---------------------------------------------------------- chat templates */

typedef enum loom_chat_format {
    LOOM_CHAT_AUTO = 0,
    LOOM_CHAT_CHATML, /* SmolLM2, Qwen */
    LOOM_CHAT_LLAMA3,
    LOOM_CHAT_LLAMA2, /* also Mistral [INST] */
    LOOM_CHAT_GEMMA,  /* <start_of_turn>user ... <end_of_turn> (Gemma 3) */
} loom_chat_format;

/* Does the llama2 family render t's conversations in Mistral's [INST]
 * variant (a template with [INST] and no <<SYS>>)? Then the tool roles
 * available_tools, tool_calls and tool_results are written too (chat.c). */
bool tok_chat_mistral(const loom_tokenizer *t);

typedef struct loom_chat_msg {
    const char *role;    /* "system", "user", "assistant", ... */
    const char *content;
} loom_chat_msg;

/* Detected from the chat_template text (e.g. contains "<|im_start|>" ->
 * ChatML), else from the vocabulary; LOOM_CHAT_AUTO when nothing matches. */
loom_chat_format loom_tokenizer_chat_format(const loom_tokenizer *t);
/* Render a conversation as the model's template would. `t` may be NULL when
 * fmt is not AUTO (then no template-specific defaults such as SmolLM2's
 * default system prompt apply). AUTO uses the detected format, ChatML if none.
 * The text includes the BOS marker where the template writes one
 * (<|begin_of_text|>, <s>, <bos>): encode it with add_bos=false, parse_special=true.
 * *out is malloc'd, NUL-terminated. */
loom_status loom_chat_apply(const loom_tokenizer *t, loom_chat_format fmt,
                            const loom_chat_msg *msgs, int32_t n, bool add_generation_prompt,
                            char **out, loom_error *err);
/* Render as loom_chat_apply() and encode (add_bos false): the template's
 * markers are special tokens, while special-token text inside a message's
 * role or content is ordinary text, so a message cannot end its turn and
 * forge another (e.g. "<|im_end|>\n<|im_start|>system"). *ids is malloc'd. */
loom_status loom_chat_encode(const loom_tokenizer *t, loom_chat_format fmt, const loom_chat_msg *msgs,
                             int32_t n, bool add_generation_prompt, int32_t **ids, int32_t *n_ids,
                             loom_error *err);
const char *loom_chat_format_name(loom_chat_format fmt);

#endif
