/*
 * plugins/backend/common/weight_walk.h — the weights a Llama-family model
 * gives a backend, walked once for every backend: which tensors there are
 * (names, shapes from the config, the optional Q/K/V biases, Gemma 3's
 * QK-norms and post-norms, a tied LM head, the routed and shared experts of
 * a mixture-of-experts model), how they fuse (Q|K|V and gate|up), which part of each a
 * tensor-parallel rank keeps (host->shard_plan's loom_shard: Q, K, V, gate
 * and up by rows, O and down by input columns, the embedding and LM head
 * by vocabulary rows), and the quantizer's plan for each linear weight,
 * packed AWQ/GPTQ weights refused when nothing can read them.
 *
 * It checks and describes; it loads nothing. A backend's load() calls
 * loom_ww_begin(), its own checks of the model and the rank's shape, then
 * loom_ww_collect(), and reads the returned list to size, dequantize and
 * upload as it likes. Errors are the host's (host->error) with the
 * backend's prefix ("backend cpu: ..."), so both backends say the same
 * thing about the same model.
 *
 * A static library compiled into each backend plugin; public headers and
 * the host table only (no libloom, no kernels). Not an installed header.
 */
#ifndef LOOM_BACKEND_WEIGHT_WALK_H
#define LOOM_BACKEND_WEIGHT_WALK_H

#include <stdbool.h>
#include <stdint.h>

#include "loom/backend.h"
#include "loom/model.h"
#include "loom/plugin.h"
#include "loom/quant.h"

/* A layer's linear weights, in this order; canonical names loom_ww_lin_name. */
enum { LOOM_WW_Q, LOOM_WW_K, LOOM_WW_V, LOOM_WW_O, LOOM_WW_GATE, LOOM_WW_UP, LOOM_WW_DOWN,
       LOOM_WW_NLIN };
/* The fused matrices a layer multiplies by: Q|K|V, O, gate|up, down. */
enum { LOOM_WW_G_QKV, LOOM_WW_G_O, LOOM_WW_G_GU, LOOM_WW_G_DOWN, LOOM_WW_NGROUPS };

/* One tensor and the window of it this rank keeps: rows [r0, r0 + nr) x
 * columns [c0, c0 + nc) of its (rows, cols) matrix; a 1-D tensor is one
 * row. The whole tensor is (0, rows, 0, cols). */
typedef struct loom_ww_part {
    const loom_tensor *t;       /* the model's (checked); NULL: absent optional */
    char name[96];              /* canonical name, "blk.3.attn_q.weight"       */
    int64_t r0, nr, c0, nc;     /* the window kept                            */
} loom_ww_part;

/* One linear weight: its window, the quantizer's plan, and where it lands
 * in its layer's fused matrix. */
typedef struct loom_ww_lin {
    loom_ww_part w;
    loom_quant_plan plan;       /* format NONE: keep it as floats             */
    int group;                  /* LOOM_WW_G_*                                */
    int64_t group_row;          /* first row of its window in the fused matrix */
} loom_ww_lin;

typedef struct loom_ww_layer {
    loom_ww_lin lin[LOOM_WW_NLIN];
    loom_ww_part attn_norm;     /* (hidden), whole                            */
    loom_ww_part ffn_norm;      /* (hidden), whole                            */
    loom_ww_part bias[3];       /* Q, K, V biases sliced like their rows; t NULL
                                   unless the walk's `bias`                    */
    /* Gemma 3 (config qk_norm / post_norms; t NULL otherwise), whole */
    loom_ww_part q_norm, k_norm;           /* (head_dim): every q / k head    */
    loom_ww_part post_attn_norm, post_ffn_norm; /* (hidden)                   */
    /* Mixture of experts (config num_experts > 0; t NULL otherwise). The
     * dense lin[GATE..DOWN] are then absent (t NULL, empty window, plan
     * NONE). Expert parallelism: a rank keeps experts [expert0, expert0 +
     * experts) of the walk, and its slice of the shared expert's width
     * (gate and up by rows, down by columns, as a dense FFN). */
    loom_ww_part router;        /* ffn_gate_inp (experts, hidden), whole     */
    loom_ww_part exps[3];       /* ffn_gate_exps, ffn_up_exps (experts, expert_inter,
                                   hidden), ffn_down_exps (experts, hidden,
                                   expert_inter); window = this rank's experts'
                                   rows                                      */
    loom_quant_plan exps_plan[3]; /* the quantizer's plan for each expert's
                                   matrix of that kind (asked once, for
                                   expert 0's view: loom_ww_expert_view)     */
    loom_ww_lin shexp[3];       /* shared expert gate, up, down; t NULL: none */
    loom_ww_part shexp_gate;    /* ffn_gate_inp_shexp (hidden)               */
} loom_ww_layer;

/* A fused matrix: parts [first, end) of lin[], this rank's rows n (the
 * parts' windows stacked) and input columns k. */
typedef struct loom_ww_group {
    int first, end;
    int64_t n, k;
} loom_ww_group;

typedef struct loom_ww {
    const loom_host *host;      /* borrowed                                   */
    const char *who;            /* message prefix, "backend cpu"              */
    const char *log_who;        /* log tag, "backend.cpu"                     */
    const loom_model_config *config; /* borrowed                              */
    loom_shard shard;           /* this rank's part; rank 0 of 1 for a whole model */
    /* whole-model sizes (the tensors' shapes) */
    int64_t hidden, vocab, inter, q_dim, kv_dim;
    int32_t layers;
    /* this rank's: rows of Q, of K (and V), of Q|K|V, FFN columns, and the
     * first row (column) of each in the whole tensors */
    int64_t q_rows, kv_rows, qkv_rows, inter_rows;
    int64_t q0, k0, i0;
    loom_ww_group group[LOOM_WW_NGROUPS];
    /* mixture of experts, this rank's: experts [expert0, expert0 + experts)
     * (all of them on one rank) and shared-expert columns [shexp0, shexp0 +
     * shexp_rows) */
    int32_t expert0, experts;
    int64_t shexp0, shexp_rows;
    /* after loom_ww_collect */
    loom_ww_part embed;         /* token_embd: this rank's vocabulary rows    */
    loom_ww_part out_norm;      /* output_norm, whole                         */
    loom_ww_part out;           /* output.weight's vocabulary rows; t NULL: the
                                   LM head is the embedding                   */
    loom_quant_plan out_plan;   /* NONE when out.t is NULL                    */
    bool bias;                  /* Q/K/V biases (config.qkv_bias or present)  */
    loom_ww_layer *layer;       /* (layers), host->calloc'd; loom_ww_free     */
} loom_ww;

/* What the backend adds to the walk's checks of a quantizer's plan. */
typedef struct loom_ww_hooks {
    void *ctx;                  /* passed back                                */
    /* Can this backend run `plan` (format != NONE) for tensor t? LOOM_OK,
     * or an error made with host->error naming tensor and format. NULL:
     * every format. The walk then requires quantize()/release() of the
     * quantizer for every format but GGUF (blocks used as stored). */
    loom_status (*runnable)(void *ctx, const loom_quant_binding *q, const loom_tensor *t,
                            const char *name, const loom_quant_plan *plan, loom_error *err);
} loom_ww_hooks;

/* "attn_q", "attn_k", ... for LOOM_WW_Q .. LOOM_WW_DOWN. */
const char *loom_ww_lin_name(int k);
/* Name of a quantized format for messages ("int8_w8a16", "gguf", ...). */
const char *loom_ww_qformat_name(loom_qformat f);

/* Start a walk in load() or load_shard(): host->check_load (the instance
 * not `loaded` yet, a usable view and communicator, the model's config),
 * then the host's shard plan for rank comm->rank of comm->size (a whole
 * model without comm) and the sizes it implies. Nothing allocated. `who`,
 * `log_who` and m are borrowed for the walk's life. */
loom_status loom_ww_begin(loom_ww *w, const loom_host *host, const char *who, const char *log_who,
                          bool loaded, const loom_model_view *m, const loom_comm *comm,
                          loom_error *err);

/* Check every tensor the model needs (shape and data, host->model_tensor)
 * and ask `q` (NULL: no quantizer) for each linear weight's plan, in
 * model order: embedding, output norm, LM head, then layer by layer. On
 * LOOM_OK w->layer holds the list (free it with loom_ww_free); on failure
 * nothing is left allocated. Warns once (rank 0) about an untied model
 * without output.weight. */
loom_status loom_ww_collect(loom_ww *w, const loom_model_view *m, const loom_quant_binding *q,
                            const loom_ww_hooks *hooks, loom_error *err);

/* Expert e's matrix of a stacked (experts, rows, cols) tensor t as a 2-D
 * tensor `out` (rows, cols) viewing t's data (borrowed; same name). */
void loom_ww_expert_view(const loom_ww *w, const loom_tensor *t, int32_t e, loom_tensor *out);

/* Does any linear weight (or the LM head) have a quantized plan? */
bool loom_ww_any_quant(const loom_ww *w);

/* load_stage()'s checks on `stage` for model m (`who`: "backend cpu"):
 * a stage of ABI 2.3 or later whose layers fit the model (the first stage
 * starts at layer 0, the last ends at its last layer, only they do) and
 * that has the links it needs. LOOM_ERR_INVALID naming what does not. */
loom_status loom_ww_check_stage(const loom_host *host, const char *who, const loom_model_view *m,
                                const loom_stage *stage, loom_error *err);

/* Copy `stage` into *out, whatever ABI the executor was built against
 * (members it lacks read 0), or zero *out when stage is NULL. */
void loom_ww_copy_stage(loom_stage *out, const loom_stage *stage);

/* Free what loom_ww_collect allocated; idempotent. */
void loom_ww_free(loom_ww *w);

#endif
