/*
 * loom/engine.h — the embedding API: build an engine from a YAML pipeline,
 * submit requests, step, stream tokens, read stats.
 *
 * Threads: loom_engine_add_request and loom_engine_abort are [any] (they
 * post to an inbox the step loop drains), and so are the tokenizer calls
 * (tokenize, prompt_tokens, detokenize, token_piece: they only read the
 * immutable tokenizer); everything else is [engine]: one thread drives
 * loom_engine_step. Callbacks run on the stepping thread.
 */
#ifndef LOOM_ENGINE_H
#define LOOM_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom/plugin.h"
#include "loom/sampler.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct loom_engine loom_engine;

typedef enum loom_finish_reason {
    LOOM_FINISH_NONE = 0,      /* still running                              */
    LOOM_FINISH_EOS = 1,       /* end-of-generation token                    */
    LOOM_FINISH_STOP = 2,      /* a stop string matched                      */
    LOOM_FINISH_LENGTH = 3,    /* max_tokens or the context length reached   */
    LOOM_FINISH_ABORT = 4,     /* loom_engine_abort                          */
    LOOM_FINISH_ERROR = 5,     /* the request could not run (message given)  */
} loom_finish_reason;

/* One event per generated token (and a final one with finish != NONE).
 * Pointers are valid for the call only. The engine fills it; a callback
 * built against an older header reads only what it knows, one built
 * against a newer one checks struct_size (LOOM_HAS_FIELD) before reading
 * a later field. Grows only at its end. */
typedef struct loom_token_event {
    uint32_t struct_size;
    int64_t request_id;
    int32_t sample_index;      /* 0..n-1                                     */
    int32_t token;             /* -1 on a final event without a token        */
    const char *text;          /* newly complete UTF-8 text (may be "")      */
    float logprob;             /* of the token, when the request set
                                  params.logprobs > 0; else 0            */
    int32_t num_top;           /* alternatives in top_ids/top_logprobs       */
    const int32_t *top_ids;
    const float *top_logprobs;
    loom_finish_reason finish;
    const char *error;         /* finish == ERROR: why                       */
    const float *probs;        /* (vocab) distribution the token was drawn
                                  from, when the request set want_probs; else NULL */
    int32_t vocab;             /* entries in probs                           */
    int32_t prompt_tokens;     /* the request's prompt, in tokens (after the
                                  chat template) — for usage accounting   */
    /* since ABI 2.2 (read it only when LOOM_HAS_FIELD(ev, loom_token_event,
     * text_len)) — add new members below this line only */
    size_t text_len;           /* bytes of text: the text may hold NUL
                                  characters (a model can generate byte
                                  0), so pass it on by length, not strlen */
    /* since ABI 2.3 (read them only when LOOM_HAS_FIELD(ev, loom_token_event,
     * prompt_top_logprobs)) — add new members below this line only.
     * Every event of a request carries them, borrowed for the call. */
    int32_t cached_prompt_tokens; /* of prompt_tokens, how many the prefix
                                  cache served (the first time the request
                                  was scheduled; 0 before that, or without
                                  prefix caching)                          */
    const int32_t *prompt_token_ids; /* (prompt_tokens) the prompt as the
                                  model read it, when the request set
                                  prompt_logprobs; else NULL             */
    const float *prompt_logprobs; /* (prompt_tokens) log p(prompt[i] |
                                  prompt[0..i)) under the model's raw
                                  distribution; [0] is NAN (nothing comes
                                  before it); NULL unless prompt_logprobs */
    int32_t prompt_num_top;    /* alternatives per prompt token (the
                                  request's params.logprobs)             */
    const int32_t *prompt_top_ids;   /* (prompt_tokens, prompt_num_top), most
                                  likely first; row 0 unset              */
    const float *prompt_top_logprobs; /* (prompt_tokens, prompt_num_top)  */
} loom_token_event;

typedef void (*loom_token_cb)(void *user, const loom_token_event *ev);

/* One turn of a conversation (loom_request.messages). An array element:
 * frozen for the major version. */
typedef struct loom_chat_message {
    const char *role;          /* "system", "user" or "assistant"; with the
                                  llama3 template also "ipython" (a tool's
                                  result, as Llama 3.1 reads it; since 2.3);
                                  with the mistral one "available_tools",
                                  "tool_calls", "tool_results" (their JSON
                                  between Mistral's control tokens) */
    const char *content;       /* UTF-8 text                                 */
} loom_chat_message;

struct loom_kv_export;

/* Grows only at its end. */
typedef struct loom_request {
    uint32_t struct_size;
    const char *prompt;        /* UTF-8 text, or NULL when tokens are given  */
    const int32_t *tokens;     /* prompt token ids (num_tokens) when prompt is NULL */
    int32_t num_tokens;
    bool chat;                 /* wrap prompt as one user turn in the model's chat template */
    const char *system;        /* chat system prompt, NULL = template default */
    loom_sampling_params params;
    int32_t max_tokens;        /* new tokens; <= 0 = up to the context length */
    int32_t n;                 /* samples; 0 or 1 = one                      */
    int32_t priority;          /* lower is served first                      */
    const char *const *stop;   /* NULL-terminated stop strings, or NULL      */
    bool ignore_eos;           /* benchmarks: generate exactly max_tokens    */
    loom_token_cb on_token;    /* nullable                                   */
    void *user;
    bool want_probs;           /* events carry the sampling distribution (draft models) */
    /* A whole conversation rendered through the model's chat template, ending
     * with the assistant's turn to speak (an OpenAI chat request). Used when
     * num_messages > 0; prompt, tokens, chat and system must then be unset. */
    const loom_chat_message *messages;
    int32_t num_messages;
    /* max_tokens > 0 that does not fit the context after the prompt is
     * refused (the OpenAI API's rule) instead of cut to what fits */
    bool strict_max_tokens;
    /* OpenAI `logit_bias`: added to the logits of these tokens before
     * sampling (penalties, temperature and the filters act on the biased
     * logits; reported logprobs stay the model's raw ones). Distinct tokens
     * inside the vocabulary, at most LOOM_MAX_LOGIT_BIAS entries, each
     * finite with |bias| <= LOOM_LOGIT_BIAS_MAX; anything else is refused
     * at loom_engine_add_request. Copied there: borrowed for the call. */
    const loom_logit_bias *logit_bias; /* (num_logit_bias), or NULL         */
    int32_t num_logit_bias;
    /* Special-token markers (<|im_end|>, <|eot_id|>, ...) inside the prompt
     * text and the messages' content are the tokens they name, as
     * transformers' apply_chat_template + encode and vLLM read them. Off
     * (the default): they are ordinary text, so a user's content cannot end
     * its turn and forge another; only the chat template's own markers are
     * special. Token-id prompts are unaffected. */
    bool parse_special;
    /* since ABI 2.3 — add new members below this line only */
    /* Compute the prompt's own logprobs (each token's under the model given
     * the tokens before it, with params.logprobs alternatives) when the
     * request is admitted: one forward over the prompt outside the batch.
     * With prefix caching on (cache.paged's default), its full KV blocks
     * then serve the request's prefill (not counted in cached_prompt_tokens,
     * which counts only what the cache held before); without it the prefill
     * computes the prompt again. A prompt the cache has no room for while
     * other requests run waits for them (it stays queued; loom_engine_abort
     * ends it). Delivered on every event (loom_token_event.prompt_logprobs):
     * the OpenAI completions API's echo with logprobs. */
    bool prompt_logprobs;
    /* Generate nothing: the prompt is read (and scored, with
     * prompt_logprobs), then every sample ends with one final event,
     * finish LENGTH and no token; max_tokens is ignored. The "score a
     * text" idiom: echo with max_tokens 0. */
    bool prompt_only;
    /* A decoding constraint (structured outputs,
     * loom/constraint.h): the generated text is kept inside language
     * `constraint_lang` ("json_schema", "json_object", "gbnf"; NULL = no
     * constraint) described by `constraint` (NUL-terminated; NULL or "" for
     * a language that needs no text). Compiled by the pipeline's constraint
     * plugin at loom_engine_add_request, which refuses a text it cannot
     * enforce, naming the problem. Borrowed for the call. A sample whose
     * constraint allows no further token ends with LOOM_FINISH_ERROR. */
    const char *constraint_lang;
    const char *constraint;
    /* since ABI 2.4 — add new members below this line only.
     * Prefill/decode disaggregation (docs/disaggregation.md). A request
     * may set at most one of the two; n must be 1, and prompt_logprobs,
     * prompt_only and a constraint are refused with either. */
    /* Prefill side: when sample 0 finishes (not by abort or error), called
     * once on the engine thread with the prompt's KV, before its blocks
     * are released; `user` is the request's user. What the callback
     * returns is logged, never fatal: the request's final event follows
     * either way. NULL = an ordinary request. */
    loom_status (*on_kv_export)(void *user, const struct loom_kv_export *x);
    /* Decode side: the KV of all but the prompt's last token comes from
     * another engine through loom_engine_kv_deliver (or the request ends
     * with loom_engine_kv_fail's error). Until then the request waits
     * outside the scheduler and does not count as active for
     * loom_engine_step. The engine computes the last prompt token itself
     * and samples every output token, so sampling, seeds, logprobs and
     * stop rules are exactly the colocated ones. */
    bool kv_remote;
} loom_request;

/* The prompt's KV as the prefill engine hands it out (on_kv_export);
 * everything borrowed for the callback. Grows only at its end. */
typedef struct loom_kv_export {
    uint32_t struct_size;
    int64_t request_id;
    int32_t num_tokens;        /* tokens whose KV the blocks hold           */
    const int32_t *tokens;     /* (num_tokens) those tokens                 */
    int32_t block_size;        /* tokens per block                          */
    int32_t num_blocks;        /* ceil(num_tokens / block_size)             */
    size_t block_bytes;        /* bytes of one block image (loom/backend.h) */
    /* [engine, during the callback only] Copy blocks [first, first + n) of
     * the sequence as block images into dst (exactly n * block_bytes
     * bytes): host memory, or since ABI 2.6 device memory of the CUDA
     * ordinal loom_kv_info.image_device names (one gather kernel, no host
     * copy). */
    loom_status (*read)(void *ctx, int32_t first, int32_t n, void *dst, size_t len, loom_error *err);
    void *ctx;
} loom_kv_export;

/* A prefill's KV handed to a kv_remote request (loom_engine_kv_deliver).
 * Borrowed for the call (the engine copies it) unless `done` is set (since
 * ABI 2.6): then the engine reads `blocks` in place on its thread and the
 * caller keeps them valid until done() — what a transport whose payload is
 * device memory needs, and what spares the copy of a mapped one. Grows
 * only at its end. */
typedef struct loom_kv_handoff {
    uint32_t struct_size;
    int32_t num_tokens;        /* the request's prompt length - 1           */
    const int32_t *tokens;     /* (num_tokens) must equal the prompt's first
                                  num_tokens tokens                         */
    int32_t block_size;        /* must equal this engine's                  */
    int32_t num_blocks;        /* ceil(num_tokens / block_size)             */
    size_t block_bytes;        /* must equal this engine's                  */
    const void *blocks;        /* (num_blocks * block_bytes) block images   */
    /* since ABI 2.6 (LOOM_HAS_FIELD: a shorter struct is host memory the
     * engine copies) */
    bool blocks_on_device;     /* false: host memory. true: device memory of
                                  CUDA ordinal blocks_device, which must be
                                  the engine's loom_kv_info.image_device;
                                  needs `done`                              */
    int32_t blocks_device;
    /* NULL: the engine copies `blocks` before returning. Set: [engine
     * thread] called exactly once when loom_engine_kv_deliver returned
     * LOOM_OK (never after an error return), after which it never touches
     * `blocks` again: LOOM_OK — written into the request's blocks;
     * LOOM_ERR_NO_SPACE — not taken, the cache has no room now: the request
     * still waits, deliver again (e.g. a host copy, which waits for room);
     * LOOM_ERR_NOT_FOUND — not needed: the request no longer waits
     * (aborted, or already given its KV), nothing to do; any other status
     * — dropped, the request ended with an error naming why (the handoff
     * did not fit it), or the engine was destroyed first. Never deliver
     * with `done` from the engine thread itself and then wait for it
     * there. Device blocks must be 16-byte aligned. */
    void (*done)(void *ctx, loom_status st);
    void *done_ctx;
} loom_kv_handoff;

/* What two engines must agree on to hand KV over. Grows only at its end. */
typedef struct loom_kv_info {
    uint32_t struct_size;
    int32_t block_size;        /* tokens per block                          */
    size_t block_bytes;        /* bytes of one block image, all layers      */
    loom_dtype kv_dtype;       /* the pools' element type                   */
    int32_t num_layers;
    int32_t vocab;
    int32_t max_model_len;
    /* since ABI 2.6: the CUDA ordinal whose device memory this engine's
     * block images may also live in (loom_kv_export.read's dst, a
     * handoff's blocks_device); -1 when only host memory */
    int32_t image_device;
} loom_kv_info;

/* A request with every field at its default: struct_size set, greedy
 * sampling params (loom_sampling_params_default), n = 1. */
loom_request loom_request_default(void);
/* Neutral sampling parameters (greedy; every filter and penalty off). */
loom_sampling_params loom_sampling_params_default(void);

/* What a step computed: prompt tokens only, prompt tokens beside
 * sequences past their prompt, or only sequences past their prompt (one
 * token each, or a draft's verification rows). */
typedef enum loom_step_kind {
    LOOM_STEP_PREFILL = 0,
    LOOM_STEP_MIXED = 1,
    LOOM_STEP_DECODE = 2,
    LOOM_STEP_KINDS = 3
} loom_step_kind;

/* Grows only at its end. */
typedef struct loom_engine_stats {
    uint32_t struct_size;
    int64_t steps;
    int64_t prompt_tokens;         /* prompt tokens admitted                 */
    int64_t prefill_tokens;        /* prompt tokens actually computed        */
    int64_t cached_prompt_tokens;  /* prompt tokens served by prefix cache   */
    int64_t generated_tokens;
    double prefill_seconds;        /* wall time in steps doing only prefill  */
    double decode_seconds;         /* wall time in the other steps           */
    int32_t running, waiting, swapped;
    int64_t preemptions;
    int32_t kv_blocks_total, kv_blocks_used, kv_blocks_peak;
    int32_t block_size;
    int64_t prefix_queries, prefix_hits, evictions, swaps_out, swaps_in;
    int64_t spec_proposed, spec_accepted;
    int32_t max_running;           /* most sequences in one step             */
    int64_t device_sampled_rows;   /* tokens sampled from forward_topk candidates */
    /* wall time inside the backend's forward (a GPU backend returns when its
     * step is done): the rest of prefill_seconds + decode_seconds is the
     * engine's own work per step — scheduling, batch building, sampling,
     * detokenizing — which no backend overlaps today */
    double backend_seconds;
    /* The same split by kind of step (index loom_step_kind): how many
     * steps, the tokens they computed, their wall time and the part of it
     * inside the backend's forward. */
    int64_t kind_steps[LOOM_STEP_KINDS];
    int64_t kind_tokens[LOOM_STEP_KINDS];
    double kind_seconds[LOOM_STEP_KINDS];
    double kind_backend_seconds[LOOM_STEP_KINDS];
    /* since ABI 2.4 */
    int32_t kv_waiting;            /* kv_remote requests waiting for their KV */
    int64_t kv_exported_blocks;    /* blocks read out through on_kv_export   */
    int64_t kv_imported_blocks;    /* blocks written in by loom_engine_kv_deliver */
    /* KV memory (loom_cache_stats): bytes one block id takes (0 when the
     * cache manager cannot say), block tables per sequence, and the most
     * blocks one sequence held at once (all its tables). Peak KV bytes are
     * kv_blocks_peak * kv_block_bytes. */
    int64_t kv_block_bytes;
    int32_t kv_groups;
    int32_t kv_peak_seq_blocks;
    /* Decoding constraints: wall time computing the step's masks (inside
     * the backend's forward, while the GPU runs: a step waits for them only
     * when they take longer than the GPU) and how many — masks of rows the
     * backend returns as candidates (forward_topk's fill_masks) only, not
     * those the sampler computes for whole rows — and the engine's own
     * time handing the chosen tokens to the matchers (a matcher is advanced
     * past its token just before its next mask: on the mask workers, inside
     * constraint_mask_seconds, for candidate rows; for whole rows, with
     * their mask, in neither). */
    double constraint_mask_seconds;
    int64_t constraint_masks;
    double constraint_accept_seconds;
} loom_engine_stats;

/* Build an engine from a pipeline file with "a.b=value" overrides. */
loom_status loom_engine_create(const char *pipeline_path, const char *const *overrides,
                               int32_t num_overrides, loom_engine **out, loom_error *err);
void loom_engine_destroy(loom_engine *e);

/* [any] Queue a request; returns its id (>= 0) or -1 and fills err (e.g.
 * prompt longer than the context). */
int64_t loom_engine_add_request(loom_engine *e, const loom_request *req, loom_error *err);
/* [any] Abort; a final event with LOOM_FINISH_ABORT follows. */
loom_status loom_engine_abort(loom_engine *e, int64_t request_id);
/* [engine] Run one step. *active = requests not yet finished. */
loom_status loom_engine_step(loom_engine *e, int32_t *active, loom_error *err);
/* [engine] Step until no request is active. */
loom_status loom_engine_run(loom_engine *e, loom_error *err);
/* [engine] The counters, into the caller's struct of `size` bytes
 * (sizeof as the caller's header declares it): the engine writes the
 * fields that fit and sets out->struct_size to what it wrote, so a program
 * built against an older, shorter loom_engine_stats is never overrun. */
void loom_engine_get_stats(loom_engine *e, loom_engine_stats *out, size_t size);

/* [any] What a KV hand-over must match (since ABI 2.4). The caller sets
 * out->struct_size (its header's sizeof); the engine writes the fields that
 * fit and sets struct_size to what it wrote (an ABI 2.4 caller's struct
 * ends before image_device). LOOM_ERR_UNSUPPORTED, naming the runner, when
 * its KV cannot leave it (an executor, a backend without kv_read_blocks /
 * kv_write_blocks, block tables in groups), or when neither the quantizer
 * nor the backend names the pools' element type (a backend without
 * kv_default_dtype, ABI 2.8): kv_dtype is always a concrete type. */
loom_status loom_engine_kv_info(const loom_engine *e, loom_kv_info *out, loom_error *err);
/* [any] Hand a kv_remote request its prompt's KV (since ABI 2.4): the
 * engine copies h (its blocks too unless h->done is set: then they are
 * read in place, loom_kv_handoff) and queues it for the step loop, which
 * drops it when
 * request `request_id` no longer waits (aborted meanwhile). A handoff that
 * does not fit the request (tokens, sizes) ends the request there with an
 * error naming the mismatch. LOOM_ERR_INVALID for a malformed h,
 * LOOM_ERR_NOMEM when it cannot be copied (nothing queued then). */
loom_status loom_engine_kv_deliver(loom_engine *e, int64_t request_id, const loom_kv_handoff *h, loom_error *err);
/* [any] End a kv_remote request that waits for its KV with an error event
 * carrying `why` (since ABI 2.4); a request no longer waiting is left
 * alone. */
loom_status loom_engine_kv_fail(loom_engine *e, int64_t request_id, const char *why);

/* [engine] Teacher-forced scoring (perplexity): logprobs[i] = log p(tokens[i]
 * | tokens[0..i)) under the model's raw distribution for i >= 1;
 * logprobs[0] = 0. The engine must be idle (no active requests); n must fit
 * the context and the KV cache. */
loom_status loom_engine_score(loom_engine *e, const int32_t *tokens, int32_t n, float *logprobs,
                              loom_error *err);

/* [engine] Install an activation observer on the engine's backend (see
 * loom_act_observer in loom/backend.h), or remove it with obs == NULL.
 * LOOM_ERR_UNSUPPORTED, naming the backend, when it cannot record (no
 * set_observer, or an executor). Used by `loom calibrate`. */
struct loom_act_observer;
loom_status loom_engine_set_observer(loom_engine *e, const struct loom_act_observer *obs,
                                     loom_error *err);

/* Tokenizer access. *ids / *text malloc'd, caller frees. */
loom_status loom_engine_tokenize(loom_engine *e, const char *text, bool add_bos, int32_t **ids,
                                 int32_t *n, loom_error *err);
loom_status loom_engine_detokenize(loom_engine *e, const int32_t *ids, int32_t n, char **text,
                                   loom_error *err);
/* [any] The prompt tokens loom_engine_add_request reads for req: its text
 * (parse_special honoured), its token ids (checked against the
 * vocabulary), or its messages through the chat template, ending with the
 * assistant's turn to speak. add_special false leaves out the special
 * tokens the tokenizer adds around text (a BOS); a chat template's own
 * markers stay. Sampling fields are not read. *ids malloc'd (*n of them),
 * caller frees. Since ABI 2.3. */
loom_status loom_engine_prompt_tokens(loom_engine *e, const loom_request *req, bool add_special, int32_t **ids,
                                      int32_t *n, loom_error *err);
/* The same with the text's length in *len (since ABI 2.2): decoded text may
 * hold NUL characters, which loom_engine_detokenize's C string cuts off. */
loom_status loom_engine_detokenize_bytes(loom_engine *e, const int32_t *ids, int32_t n, char **text,
                                         size_t *len, loom_error *err);
/* The bytes token `id` stands for on its own, as a vocabulary entry: a
 * SentencePiece word piece keeps its leading space ("▁Paris" -> " Paris",
 * which decoding it alone drops), a byte-level token may be part of a UTF-8
 * character, a control token is its text ("<|im_end|>"). Not NUL-terminated;
 * *len its length. NULL (and *len 0) without a tokenizer or for an id out of
 * range. Owned by the engine. What OpenAI-style logprobs report per token. */
const char *loom_engine_token_piece(const loom_engine *e, int32_t id, size_t *len);
int32_t loom_engine_vocab_size(const loom_engine *e);
int32_t loom_engine_max_context(const loom_engine *e);
/* [any] The chat template family messages are rendered with: "chatml"
 * (SmolLM2, Qwen, Hermes), "llama3", "llama2", "mistral" (Llama 2's [INST]
 * variant without <<SYS>>) or "gemma";
 * NULL without a tokenizer or with model.chat_template: none. A caller that
 * writes a family's own conventions into messages (tool calls) asks this.
 * Since ABI 2.3. */
const char *loom_engine_chat_template(const loom_engine *e);
const char *loom_engine_model_name(const loom_engine *e);

/* The engine API as a table, for plugins (which never link libloom) that
 * run an engine of their own, e.g. a draft model. Grows only at its end. */
typedef struct loom_engine_api {
    uint32_t struct_size;
    loom_status (*create)(const char *pipeline_path, const char *const *overrides, int32_t num_overrides,
                          loom_engine **out, loom_error *err);
    void (*destroy)(loom_engine *e);
    int64_t (*add_request)(loom_engine *e, const loom_request *req, loom_error *err);
    loom_status (*abort)(loom_engine *e, int64_t request_id);
    loom_status (*step)(loom_engine *e, int32_t *active, loom_error *err);
    int32_t (*vocab_size)(const loom_engine *e);
    int32_t (*max_context)(const loom_engine *e);
    loom_request (*request_default)(void);
    /* since ABI 2.0 — add new members below this line only */
} loom_engine_api;

/* The table above, filled with this library's functions. */
const loom_engine_api *loom_engine_api_get(void);

#ifdef __cplusplus
}
#endif
#endif /* LOOM_ENGINE_H */
