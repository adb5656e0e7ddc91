/*
 * loom/model.h — what a backend sees of a loaded model: the architecture's
 * hyper-parameters and read-only access to named weight tensors.
 *
 * The core's loaders (GGUF, safetensors, dummy) all present tensors under the
 * canonical GGUF names and in one layout, so backends never care where
 * weights came from:
 *   token_embd.weight            (vocab, hidden)
 *   output_norm.weight           (hidden)
 *   output.weight                (vocab, hidden)  absent when embeddings are tied
 *   blk.N.attn_norm.weight       (hidden)
 *   blk.N.attn_q.weight          (n_heads*head_dim, hidden)
 *   blk.N.attn_k.weight          (n_kv_heads*head_dim, hidden)
 *   blk.N.attn_v.weight          (n_kv_heads*head_dim, hidden)
 *   blk.N.attn_q.bias / attn_k.bias / attn_v.bias   (Qwen2 only)
 *   blk.N.attn_output.weight     (hidden, n_heads*head_dim)
 *   blk.N.ffn_norm.weight        (hidden)
 *   blk.N.ffn_gate.weight        (intermediate, hidden)
 *   blk.N.ffn_up.weight          (intermediate, hidden)
 *   blk.N.ffn_down.weight        (hidden, intermediate)
 * A mixture-of-experts model (num_experts > 0, since ABI 2.4) has, in every
 * layer, instead of ffn_gate / ffn_up / ffn_down (llama.cpp's names and
 * layout; expert e's matrix is row block e of the stacked tensor):
 *   blk.N.ffn_gate_inp.weight    (experts, hidden)            the router
 *   blk.N.ffn_gate_exps.weight   (experts, expert_inter, hidden)
 *   blk.N.ffn_up_exps.weight     (experts, expert_inter, hidden)
 *   blk.N.ffn_down_exps.weight   (experts, hidden, expert_inter)
 * and with a shared expert (shared_expert_intermediate_size > 0):
 *   blk.N.ffn_gate_shexp.weight / ffn_up_shexp.weight (shared_inter, hidden)
 *   blk.N.ffn_down_shexp.weight  (hidden, shared_inter)
 *   blk.N.ffn_gate_inp_shexp.weight (hidden)   its sigmoid gate's weights
 * Qwen3 adds blk.N.attn_q_norm / attn_k_norm (head_dim) as Gemma 3 does.
 * A 4-bit AWQ/GPTQ safetensors checkpoint adds, per packed linear,
 * `<name>.qweight / .qzeros / .scales [/ .g_idx]` and makes `<name>.weight` a
 * shape-only descriptor (out, in): data NULL, nbytes 0, dtype that of the
 * scales; only a quantizer that accepts the model's packing
 * (loom_model_view.packing, loom_quant_ops.accepts_packing) can turn it into
 * something to compute with (host->packed_qweight, docs/quantization.md).
 * Q and K rows are in Hugging Face order (RoPE rotates dims i and
 * i + head_dim/2, "NeoX" style); the GGUF loader undoes llama.cpp's
 * interleaving permutation at load.
 */
#ifndef LOOM_MODEL_H
#define LOOM_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "loom/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum loom_arch {
    LOOM_ARCH_LLAMA = 0, /* Llama 2/3, SmolLM2, Mistral (no sliding window) */
    LOOM_ARCH_QWEN2 = 1, /* Llama + QKV bias                               */
    LOOM_ARCH_GEMMA3 = 2,/* the loom_model_config fields since ABI 2.3     */
    /* since ABI 2.4 */
    LOOM_ARCH_QWEN3 = 3,     /* Llama + QK-norm (qk_norm), explicit head_dim */
    LOOM_ARCH_QWEN3_MOE = 4, /* Qwen3 with routed experts                   */
    LOOM_ARCH_QWEN2_MOE = 5, /* Qwen2 (QKV bias) with routed + shared experts */
    LOOM_ARCH_MIXTRAL = 6,   /* Llama with 8 routed SwiGLU experts           */
} loom_arch;

/* The FFN's gated activation: act(gate) * up. */
typedef enum loom_ffn_act {
    LOOM_FFN_SILU = 0,      /* SwiGLU (Llama, Qwen2)                        */
    LOOM_FFN_GELU_TANH = 1, /* GeGLU with tanh-approximated GELU (Gemma)    */
} loom_ffn_act;

typedef enum loom_rope_scaling {
    LOOM_ROPE_SCALING_NONE = 0,
    LOOM_ROPE_SCALING_LLAMA3 = 1, /* Llama 3.1 frequency-dependent scaling */
    LOOM_ROPE_SCALING_LINEAR = 2, /* positions divided by factor           */
} loom_rope_scaling;

/* Grows only at its end. */
typedef struct loom_model_config {
    uint32_t struct_size;
    loom_arch arch;
    int32_t vocab_size;
    int32_t hidden_size;          /* d_model                                 */
    int32_t intermediate_size;    /* FFN width                               */
    int32_t num_layers;
    int32_t num_heads;            /* query heads                             */
    int32_t num_kv_heads;         /* K/V heads (GQA when < num_heads)        */
    int32_t head_dim;             /* per head, usually hidden/num_heads      */
    int32_t max_context;          /* trained context length, tokens          */
    float rope_theta;             /* base frequency                          */
    float rms_norm_eps;
    loom_rope_scaling rope_scaling;
    float rope_factor;            /* LLAMA3 / LINEAR                         */
    float rope_low_freq_factor;   /* LLAMA3                                  */
    float rope_high_freq_factor;  /* LLAMA3                                  */
    int32_t rope_original_context;/* LLAMA3: original_max_position_embeddings */
    bool tie_embeddings;          /* output.weight absent: reuse token_embd  */
    bool qkv_bias;                /* attn_{q,k,v}.bias present               */
    int32_t bos_token_id;         /* -1 when none                            */
    int32_t eos_token_id;         /* -1 when none                            */
    char name[128];               /* human-readable model name               */
    /* --- since ABI 2.3: what sets Gemma 3 apart from Llama. Zero (what a
     * config written before 2.3 holds) is Llama's behaviour in each. */
    loom_ffn_act ffn_act;         /* SILU for Llama / Qwen2                  */
    float embed_scale;            /* token embeddings times this; 0: 1       */
    float attn_scale;             /* scores = q.k * this; 0: 1/sqrt(head_dim) */
    bool qk_norm;                 /* RMSNorm of each q and k head before RoPE
                                     (blk.N.attn_q_norm / attn_k_norm, (head_dim)) */
    bool post_norms;              /* RMSNorm of the attention and FFN outputs
                                     before the residual add (blk.N.
                                     post_attention_norm / post_ffw_norm)    */
    int32_t sliding_window;       /* tokens a local layer sees, itself
                                     included; 0: no local layers            */
    int32_t global_every;         /* with a window: layer l is global (whole
                                     context, rope_theta and rope_scaling)
                                     when (l + 1) % global_every == 0, local
                                     (window, rope_theta_local, no scaling)
                                     otherwise                               */
    float rope_theta_local;       /* RoPE base of local layers               */
    /* --- since ABI 2.4: mixture of experts. num_experts 0 (what a config
     * written before 2.4 holds): a dense FFN in every layer. Otherwise
     * every layer's FFN is routed (the tensors above): router logits
     * r = xn Wr^T (experts); p = softmax(r) over all experts in float32;
     * the num_experts_used largest p (ties to the lower index) are kept,
     * divided by their sum when moe_norm_topk; the FFN output is the sum
     * over the kept experts of p_e * down_e(silu(gate_e xn) * up_e xn),
     * plus, with a shared expert, sigmoid(xn . w_shgate) times the shared
     * SwiGLU FFN of xn. (Mixtral's softmax over the top-k logits is the
     * renormalised form.) */
    int32_t num_experts;          /* routed experts per layer; 0: dense      */
    int32_t num_experts_used;     /* experts each token is sent to (top-k)   */
    int32_t expert_intermediate_size; /* each routed expert's FFN width      */
    int32_t shared_expert_intermediate_size; /* 0: no shared expert          */
    bool moe_norm_topk;           /* renormalise the kept weights to sum 1   */
} loom_model_config;


/* How a pre-quantized checkpoint packs its linear weights (AWQ / GPTQ
 * safetensors). Grows only at its end. */
typedef struct loom_model_packing {
    uint32_t struct_size;
    const char *method;        /* "awq", "gptq" (zeros stored minus 1) or "gptq_v2" */
    int32_t bits;              /* 4                                           */
    int32_t group_size;        /* input elements per (scale, zero) group      */
    bool desc_act;             /* GPTQ act-order (g_idx may be permuted)      */
    const char *source;        /* the file that said so, for messages         */
} loom_model_packing;

/* Read-only view of a loaded model. Valid while the engine lives; tensors
 * are host memory (often mmap'd) and must not be written. Grows only at its
 * end. */
typedef struct loom_model_view {
    uint32_t struct_size;
    const loom_model_config *config;
    void *ctx;
    /* [any] Tensor by canonical name, or NULL when absent. */
    const loom_tensor *(*get)(void *ctx, const char *name);
    /* [any] Number of tensors and the i-th one (for iteration). */
    int32_t (*count)(void *ctx);
    const loom_tensor *(*at)(void *ctx, int32_t i);
    /* NULL for an ordinary model; set when its linear weights exist only
     * packed (AWQ / GPTQ), which only a quantizer accepting this packing
     * can load (the engine checks before any backend sees the model). */
    const loom_model_packing *packing;
} loom_model_view;

#ifdef __cplusplus
}
#endif
#endif /* LOOM_MODEL_H */
