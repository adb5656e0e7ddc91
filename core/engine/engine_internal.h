/*
 * core/engine/engine_internal.h — the engine's private state: requests,
 * sequences, plugin instances and per-step buffers. Only the files in core/engine
 * include this.
 */
#ifndef LOOM_CORE_ENGINE_INTERNAL_H
#define LOOM_CORE_ENGINE_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "loom/backend.h"
#include "loom/cache.h"
#include "loom/engine.h"
#include "loom/quant.h"
#include "loom/sampler.h"
#include "loom/scheduler.h"
#include "loom/seq.h"
#include "loom/spec.h"
#include "model/model.h"
#include "pipeline/pipeline.h"
#include "tokenizer/tokenizer.h"

typedef struct loom_req loom_req;

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
};

/* Inbox entry posted by [any]-thread calls. */
typedef struct loom_inbox_item {
    loom_req *req;             /* an add, or NULL for an abort               */
    int64_t abort_id;
    struct loom_inbox_item *next;
} loom_inbox_item;

struct loom_engine {
    loom_pipeline *pipe;
    const loom_host *host;
    loom_model *model;
    const loom_model_view *view;
    const loom_model_config *mcfg;
    loom_tokenizer *tok;       /* NULL for dummy weights                     */
    loom_chat_format chat_format;
    bool chat_none;            /* model.chat_template: none                  */

    loom_kind be_kind;              /* BACKEND or EXECUTOR                   */
    void **inner;                   /* executor's backend instances (ranks)   */
    int32_t num_inner;
    const loom_backend_ops *be;     void *be_self;
    const loom_scheduler_ops *sch;  void *sch_self;
    const loom_cache_ops *cache;    void *cache_self;
    const loom_sampler_ops *smp;    void *smp_self;
    const loom_quant_ops *quant;    void *quant_self;
    const loom_spec_ops *spec;      void *spec_self;
    bool spec_batch;                /* spec has propose_batch (ABI 1.4)       */
    loom_quant_binding quant_binding;

    loom_kv_layout layout;
    bool device_sampling;      /* engine.device_sampling and the backend has forward_topk */
    int32_t max_model_len;
    int32_t vocab;
    uint64_t seed;

    /* Requests and sequences (engine thread only); seqs sorted by id. */
    loom_req **reqs;           int32_t num_reqs, cap_reqs;
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
    int32_t top_cap;           /* rows the four arrays above hold            */
    float *scratch;            /* (vocab * k) rows for want_probs / verification */
    size_t scratch_cap;
    loom_block_op *ops;
    int32_t *pairs;
    /* propose_batch's argument arrays, spec_cap entries each (one block). */
    void *spec_buf;
    int32_t spec_cap;

    loom_engine_stats stats;
};

/* engine.c */
loom_seq *loom_engine_find_seq(loom_engine *e, loom_seq_id id);
void loom_engine_seq_free(loom_seq *s);
void loom_engine_req_free(loom_req *rq);

#endif
