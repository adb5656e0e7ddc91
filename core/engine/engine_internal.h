/*
 * core/engine/engine_internal.h — the engine's private state (requests,
 * sequences, plugin instances, per-step buffers) and the functions its
 * files share. Only the files in core/engine include this:
 *   engine_create.c  build and tear down an engine; accessors
 *   requests.c       requests in: checks, tokenizing, the inbox, admission
 *   sequence.c       one sample's life: tokens, events, text, stop, finish
 *   step.c           the step: schedule -> batch -> forward -> sample -> update
 *   batch.c          step buffers, block copies/swaps, the flattened batch
 *   sample.c         rows to tokens through the sampler; forks
 *   speculate.c      drafts before the step, verification after it
 *   spec_verify.c    the rejection-sampling rule itself
 *   score.c          teacher-forced scoring (perplexity)
 *   kv_transfer.c    disaggregation: a prefill's KV out, a remote one in
 */
#ifndef LOOM_CORE_ENGINE_INTERNAL_H
#define LOOM_CORE_ENGINE_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "loom/backend.h"
#include "loom/cache.h"
#include "loom/constraint.h"
#include "loom/engine.h"
#include "loom/executor.h"
#include "loom/quant.h"
#include "loom/sampler.h"
#include "loom/scheduler.h"
#include "loom/seq.h"
#include "loom/spec.h"
#include "model/model.h"
#include "pipeline/pipeline.h"
#include "tokenizer/tokenizer.h"

typedef struct loom_req loom_req;

/* One chosen token with what its event reports. Arrays borrowed. */
typedef struct engine_token {
    int32_t id;
    float logprob;             /* when the request asked for logprobs, else 0 */
    int32_t num_top;           /* alternatives in top_ids / top_logprobs     */
    const int32_t *top_ids;
    const float *top_logprobs;
} engine_token;

/* Room for one token's alternatives. */
typedef struct engine_top {
    int32_t ids[LOOM_MAX_LOGPROBS];
    float lps[LOOM_MAX_LOGPROBS];
} engine_top;

/* One sample of one request. info.tokens points at tokens[]. */
typedef struct loom_seq {
    loom_seq_info info;
    int32_t *tokens;           /* (cap) prompt + generated (+ drafts)        */
    int32_t cap;
    loom_req *req;
    int32_t sample_index;
    uint64_t rng[4];
    loom_detok detok;
    char *text;                /* generated text so far (stop strings)       */
    size_t text_len, text_cap;
    size_t text_emitted;       /* bytes of text already streamed             */
    int32_t num_generated;
    bool prefix_counted;       /* cached prompt tokens counted (first schedule) */
    bool finished;
    /* Speculation: info.num_draft drafts sit at the end of tokens[]. */
    float *spec_q;             /* (num_draft, vocab) draft distributions    */
    size_t spec_q_cap;         /* floats allocated                           */
    bool spec_q_valid;         /* false: drafts are deterministic (one-hot) */
    const float *cur_probs;    /* distribution of the token being emitted    */
    /* Decoding constraint (the request has one): this sample's matcher and
     * the mask of its next token. */
    const loom_constraint_ops *con; void *con_self; /* to free the matcher  */
    void *matcher;
    uint32_t *mask;            /* (LOOM_MASK_WORDS(vocab))                   */
    bool mask_live;            /* mask filled this step and not all zero     */
    bool mask_ready;           /* filled during this step's forward (the
                                  runner masks its candidates): sampling
                                  uses it as it is                          */
    char *con_error;           /* the constraint failed (its message): the
                                  sample ends with it at its next token     */
    int32_t con_pending;       /* the chosen token not yet fed to the matcher:
                                  fed just before the next mask, so on the
                                  mask workers beside the GPU when the runner
                                  masks candidates                          */
    bool con_has_pending;
} loom_seq;

struct loom_req {
    int64_t id;
    loom_request r;            /* copy; r.system owned, r.prompt/tokens/stop cleared */
    char **stop;               /* NULL-terminated owned copy of the stop strings */
    int32_t max_stop_len;
    int32_t *prompt;           /* (prompt_len) token ids                     */
    int32_t prompt_len;
    int32_t max_new;           /* resolved max new tokens                    */
    int32_t n;                 /* samples                                    */
    int32_t live;              /* samples not finished                       */
    bool forked;               /* samples 1..n-1 exist (or n == 1)           */
    loom_seq **seqs;           /* (n)                                        */
    bool aborted;
    double arrival;
    int32_t cached_prompt_tokens; /* served by the prefix cache, at sample 0's first schedule */
    /* r.prompt_logprobs: the prompt scored at admission (score.c) */
    bool prompt_scored;        /* the arrays below are filled (events carry them) */
    int32_t cached_before_score; /* prompt tokens the prefix cache held before scoring */
    float *prompt_lp;          /* (prompt_len); [0] NAN                      */
    int32_t prompt_num_top;    /* alternatives per position                  */
    int32_t *prompt_top_ids;   /* (prompt_len, prompt_num_top)               */
    float *prompt_top_lps;     /* (prompt_len, prompt_num_top)               */
    void *grammar;             /* compiled constraint, or NULL (freed with the request) */
    const loom_constraint_ops *con; void *con_self;
};

/* The model runner the engine drives: a backend, or an executor over
 * several backends; the same methods either way (loom/executor.h). */
typedef struct loom_runner {
    loom_kind kind;            /* LOOM_KIND_BACKEND or LOOM_KIND_EXECUTOR     */
    void *self;
    const char *name;          /* component name, for messages               */
    loom_load_fn *load;
    loom_kv_block_bytes_fn *kv_block_bytes;
    loom_memory_fn *memory;
    loom_kv_alloc_fn *kv_alloc;
    loom_forward_fn *forward;
    loom_copy_blocks_fn *copy_blocks;
    loom_forward_topk_fn *forward_topk;     /* NULL: none                     */
    loom_swap_blocks_fn *swap_blocks;       /* NULL: none                     */
    loom_status (*set_observer)(void *self, const loom_act_observer *obs,
                                loom_error *err); /* NULL: none               */
    /* block images in and out (disaggregation); NULL: none */
    loom_status (*kv_read_blocks)(void *self, const int32_t *blocks, int32_t n, void *buf, size_t len,
                                  loom_error *err);
    loom_status (*kv_write_blocks)(void *self, const int32_t *blocks, int32_t n, const void *buf, size_t len,
                                   loom_error *err);
    loom_status (*kv_groups)(void *self, loom_kv_groups *out,
                             loom_error *err);    /* NULL: one table (executors) */
    int32_t (*kv_image_device)(void *self);      /* NULL: host images only  */
    loom_dtype (*kv_default_dtype)(void *self);  /* NULL: cannot name it    */
} loom_runner;

/* A copy of a loom_kv_handoff the engine owns (kv_transfer.c). */
typedef struct engine_handoff {
    loom_kv_handoff h;         /* tokens and blocks point into the allocations
                                  below, or blocks is the caller's (h.done) */
    int32_t *tokens;
    void *blocks;              /* the copy; NULL for blocks read in place   */
    bool written;              /* engine_kv_import wrote the blocks in      */
} engine_handoff;

/* Inbox entry posted by [any]-thread calls. */
typedef struct loom_inbox_item {
    loom_req *req;             /* an add, or NULL for an abort or a KV item  */
    int64_t abort_id;          /* the request an abort or a KV item is for   */
    engine_handoff *kv;        /* a delivery (owned), or NULL               */
    char *kv_fail;             /* a transfer failure's message (owned), or NULL */
    struct loom_inbox_item *next;
} loom_inbox_item;

/* Phases of loom_engine_step (step.c). */
enum {
    ENGINE_PH_INBOX = 0,   /* new requests, aborts, deferred retries     */
    ENGINE_PH_PROPOSE = 1, /* the speculator's drafts                    */
    ENGINE_PH_SCHEDULE = 2,/* the scheduler (with the cache's allocation) */
    ENGINE_PH_BATCH = 3,   /* block copies / swaps, the flattened batch  */
    ENGINE_PH_ROWS = 4,    /* which rows come back as candidates          */
    ENGINE_PH_FORWARD = 5, /* inside the runner's forward                 */
    ENGINE_PH_SAMPLE = 6,  /* sampling, tokens appended / streamed        */
    ENGINE_PH_REAP = 7,    /* finished requests freed                     */
    ENGINE_PHASES = 8
};

struct loom_engine {
    loom_pipeline *pipe;
    const loom_host *host;
    loom_model *model;
    const loom_model_view *view;
    const loom_model_config *mcfg;
    loom_tokenizer *tok;       /* NULL for dummy weights                     */
    loom_chat_format chat_format;
    bool chat_none;            /* model.chat_template: none                  */

    loom_runner run;                /* the backend, or the executor           */
    void **inner;                   /* executor's backend instances (ranks)   */
    int32_t num_inner;
    const loom_scheduler_ops *sch;  void *sch_self;
    const loom_cache_ops *cache;    void *cache_self;
    const loom_sampler_ops *smp;    void *smp_self;
    const loom_quant_ops *quant;    void *quant_self;
    const loom_spec_ops *spec;      void *spec_self;
    const loom_constraint_ops *con; void *con_self; /* NULL: no constraint slot */
    loom_vocab_view vocab_view;     /* the tokenizer as constraints see it   */
    int32_t *eog_ids;               /* (vocab_view.num_eog)                  */
    loom_quant_binding quant_binding;

    loom_kv_layout layout;
    int32_t bt_stride;         /* block-table entries per sequence: max_model_len in blocks */
    int32_t step_stride;       /* the batch being built: its widest row (<= bt_stride) */
    int32_t bt_width_metric;   /* the width "engine.block_table_width" last reported */
    int32_t find_hint;         /* index of the last loom_engine_find_seq hit */
    int32_t finished_unreaped; /* sequences finished since engine_reap last ran */
    int32_t num_groups;        /* block tables per sequence (>= 1): layout.num_groups */
    loom_kv_groups kv_groups;  /* the runner's proposal, as the cache took it */
    const int32_t *group_window; /* kv_groups.window when the cache took the
                                  proposal and a group has a window, else NULL */
    bool device_sampling;      /* engine.device_sampling, the runner has forward_topk
                                  and the sampler declares candidates()      */
    bool device_masks;         /* and the runner masks constrained candidate
                                  rows (its plugins are ABI >= 2.4)          */
    int32_t max_model_len;
    int32_t vocab;
    uint64_t seed;
    loom_log_level log_level;  /* engine.log_level, held while the engine lives */
    bool log_held;

    /* Requests and sequences (engine thread only); seqs sorted by id. */
    loom_req **reqs;           int32_t num_reqs, cap_reqs;
    /* Requests whose prompt logprobs wait for KV room to be scored (the
     * cache is full of running sequences), oldest first; retried at every
     * drain of the inbox. */
    loom_req **deferred;       int32_t num_deferred, cap_deferred;
    /* kv_remote requests waiting for their KV, oldest first, each with the
     * handoff delivered for it (NULL until then; one that found no room in
     * the cache stays here and is tried again at every drain). */
    loom_req **parked;         int32_t num_parked, cap_parked;
    engine_handoff **parked_kv;
    loom_seq **seqs;           int32_t num_seqs, cap_seqs;
    int64_t next_seq_id;

    /* Inbox ([any] threads). */
    pthread_mutex_t inbox_mu;
    loom_inbox_item *inbox_head, *inbox_tail;
    int64_t next_req_id;
    int32_t active;            /* requests queued or running (inbox_mu)      */

    /* Step buffers, grown as needed. */
    loom_sched_entry *sched_entries;
    loom_seq_id *preempted;
    loom_preempt_mode *preempt_modes;
    int32_t sched_cap;
    int32_t *tok_ids, *positions, *query_start, *context_len, *block_table, *logits_index;
    int64_t *slots;
    int32_t tok_cap, seq_cap, bt_cap;
    float *logits;
    size_t logits_cap;
    loom_seq **logit_seqs;     /* (num_logits) the sequence of each row      */
    int32_t *top_ids;          /* (num_logits, topk) forward_topk candidates */
    float *top_vals;
    float *top_lse;            /* (num_logits)                               */
    uint8_t *want_full;        /* (num_logits)                               */
    loom_seq **top_seqs;       /* (num_logits) the sequence of each candidate row */
    const uint32_t **row_allowed; /* (num_logits) forward_topk's masks       */
    int32_t top_cap;           /* rows the arrays above hold                 */
    bool masks_filled;         /* this step's fill_masks ran                 */
    int32_t step_logits;       /* logits rows of the step in forward_topk    */
    struct loom_workers *mask_workers; /* fill_masks' pool, made on first use */
    int32_t *mask_rows;        /* (top_cap) rows fill_masks computes         */
    loom_status *mask_status;  /* (top_cap) each one's outcome               */
    float *scratch;            /* (vocab * k) rows for want_probs / verification */
    size_t scratch_cap;
    loom_block_op *ops;
    int32_t *pairs;
    /* propose_batch's argument arrays, spec_cap entries each (one block). */
    void *spec_buf;
    int32_t spec_cap;

    loom_engine_stats stats;
    /* the engine's own host work by phase (ENGINE_PH_*, step.c), logged at
     * destroy beside the backend's split */
    double phase_seconds[ENGINE_PHASES];
    int64_t phase_steps;
};

/* sequence.c */
loom_status engine_grow(void **p, int32_t *cap, int32_t need, size_t elem);
loom_status engine_seq_reserve(loom_seq *s, int32_t need);
loom_seq *engine_seq_new(loom_engine *e, loom_req *rq, int32_t sample_index);
loom_status engine_track_seq(loom_engine *e, loom_seq *s);
loom_seq *loom_engine_find_seq(loom_engine *e, loom_seq_id id);
const loom_seq_info *engine_env_get_seq(void *ctx, loom_seq_id id);
void loom_engine_seq_free(loom_seq *s);
void loom_engine_req_free(loom_req *rq);
void engine_accept_token(loom_engine *e, loom_seq *s, const engine_token *t);
void engine_seq_finish(loom_engine *e, loom_seq *s, loom_finish_reason why, const char *error);
void engine_end_unstarted(const loom_req *rq, int32_t from, loom_finish_reason why, const char *error);
void engine_reap(loom_engine *e);
void engine_event_prompt(loom_token_event *ev, const loom_req *rq);

/* requests.c */
void engine_drain_inbox(loom_engine *e, loom_error *err);
void engine_inbox_post(loom_engine *e, loom_inbox_item *it, loom_req *rq);
void engine_fail_unadmitted(loom_engine *e, loom_req *rq, const char *why);
void engine_admit(loom_engine *e, loom_req *rq, engine_handoff *kv, loom_error *err);

/* batch.c */
loom_status engine_step_buffers(loom_engine *e, int32_t nseq, int32_t ntok, int32_t bt_stride);
loom_status engine_table_rows(loom_engine *e, loom_seq_id id, int32_t i, int32_t S, int32_t end, loom_error *err);
loom_status engine_fill_slots(loom_engine *e, int32_t i, int32_t S, int32_t T, int32_t t, int32_t from, int32_t end,
                              loom_error *err);
loom_status engine_logits_room(loom_engine *e, int32_t rows, loom_error *err);
float *engine_scratch_rows(loom_engine *e, int32_t rows);
loom_status engine_run_block_ops(loom_engine *e, loom_error *err);
loom_status engine_build_batch(loom_engine *e, const loom_sched_output *out, loom_batch *batch, loom_step_kind *kind,
                               loom_error *err);

/* sample.c */
loom_sample_row engine_sample_row(loom_seq *s, int32_t upto);
int32_t engine_row_candidates(const loom_engine *e, const loom_seq *s, int32_t kmax);
loom_status engine_sample_one(loom_engine *e, loom_seq *s, float *x, engine_top *top, engine_token *t,
                              loom_error *err);
loom_status engine_sample_rows(loom_engine *e, float *logits, int32_t width, loom_seq **seqs, int32_t n,
                               const int32_t *cand, const float *lse, loom_error *err);
loom_status engine_sampler_check(loom_engine *e, loom_seq *s, loom_error *err);
loom_status engine_check_token(const loom_engine *e, int32_t tok, loom_error *err);
float engine_raw_logprob(const float *row, int32_t vocab, int32_t tok);
int32_t engine_raw_top(const float *row, int32_t vocab, int32_t n, int32_t *ids, float *lps);

/* kv_transfer.c */
loom_status engine_kv_check_request(const loom_request *full, loom_error *err);
void engine_kv_park(loom_engine *e, loom_req *rq);
bool engine_kv_abort_parked(loom_engine *e, int64_t id);
void engine_kv_inbox_item(loom_engine *e, loom_inbox_item *it);
void engine_kv_retry(loom_engine *e);
void engine_kv_export(loom_engine *e, loom_seq *s, loom_finish_reason why);
void engine_kv_fini(loom_engine *e);
void engine_handoff_free(engine_handoff *k);
/* Parked kv_remote requests whose KV has not been delivered yet. */
int32_t engine_kv_undelivered(const loom_engine *e);
loom_status engine_kv_import(loom_engine *e, loom_seq *s, engine_handoff *kv, loom_error *err);

/* score.c */
loom_status engine_score_prompt(loom_engine *e, loom_req *rq, loom_error *err);
/* constrain.c */
loom_status engine_constraint_init(loom_engine *e, loom_error *err);
void engine_constraint_fini(loom_engine *e);
loom_status engine_constraint_compile(loom_engine *e, const loom_request *full, loom_req *rq, loom_error *err);
void engine_constraint_req_free(loom_req *rq);
loom_status engine_constraint_seq_init(loom_seq *s);
void engine_constraint_seq_free(loom_seq *s);
loom_status engine_constraint_fill(loom_engine *e, loom_seq *s, loom_error *err);
/* s->mask, allocated on first use (NULL when out of memory). */
uint32_t *engine_constraint_mask_buffer(const loom_engine *e, loom_seq *s);
const char *engine_constraint_check_token(const loom_seq *s, int32_t tok);
const char *engine_constraint_accept(loom_seq *s, int32_t tok);

/* speculate.c */
loom_status engine_spec_propose(loom_engine *e, loom_error *err);
void engine_spec_drop(loom_engine *e, loom_seq *s);
loom_status engine_spec_accept(loom_engine *e, loom_seq *s, const float *rows, loom_error *err);
void engine_spec_accept_greedy(loom_engine *e, loom_seq *s, const int32_t *ids, const float *vals, const float *lse,
                               int32_t k);

#endif
