/*
 * tests/backend/test_backend_check.c — loom/backend_check.h's model-config
 * check, which the cpu and cuda backends both run before their own limits:
 * a valid Llama (Qwen2, Gemma 3, Qwen2-MoE) config passes, and each way a
 * config can be unusable (experts included) is
 * refused with its status and a message naming the number at fault; the
 * batch check (host->check_batch) reads no token before query_start and
 * the pool shape are known good; host->logits_topk_row outside k 1..vocab.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "plugin/host_rules.h"

static loom_model_config good(void) {
    loom_model_config c = {.struct_size = sizeof c, .arch = LOOM_ARCH_LLAMA, .vocab_size = 97,
                           .hidden_size = 64, .intermediate_size = 128, .num_layers = 2, .num_heads = 4,
                           .num_kv_heads = 2, .head_dim = 16, .max_context = 1024, .rope_theta = 10000.f,
                           .rms_norm_eps = 1e-5f};
    snprintf(c.name, sizeof c.name, "tiny");
    return c;
}

static void refused(const loom_model_config *c, loom_status want, const char *needle) {
    char why[384] = "";
    loom_status st = loom_check_model_config(c, why, sizeof why);
    cr_assert_eq(st, want, "status %d, want %d (%s)", (int)st, (int)want, why);
    cr_assert(strstr(why, needle), "message '%s' lacks '%s'", why, needle);
    cr_assert(strstr(why, "'tiny'"), "message '%s' does not name the model", why);
}

Test(backend_check, valid_configs_pass) {
    char why[384] = "";
    loom_model_config c = good();
    cr_assert_eq(loom_check_model_config(&c, why, sizeof why), LOOM_OK, "%s", why);
    c.arch = LOOM_ARCH_QWEN2, c.rope_scaling = LOOM_ROPE_SCALING_LINEAR, c.rope_factor = 2;
    cr_assert_eq(loom_check_model_config(&c, why, sizeof why), LOOM_OK, "%s", why);
    c.rope_scaling = LOOM_ROPE_SCALING_LLAMA3, c.rope_factor = 8, c.rope_low_freq_factor = 1,
    c.rope_high_freq_factor = 4, c.rope_original_context = 8192;
    cr_assert_eq(loom_check_model_config(&c, why, sizeof why), LOOM_OK, "%s", why);
    c = good(), c.arch = LOOM_ARCH_GEMMA3, c.ffn_act = LOOM_FFN_GELU_TANH, c.qk_norm = c.post_norms = true,
    c.sliding_window = 512, c.global_every = 6, c.rope_theta_local = 10000, c.attn_scale = 0.25f,
    c.embed_scale = 8;
    cr_assert_eq(loom_check_model_config(&c, why, sizeof why), LOOM_OK, "%s", why);
    c = good(), c.arch = LOOM_ARCH_QWEN2_MOE, c.num_experts = 8, c.num_experts_used = 2,
    c.expert_intermediate_size = 32, c.shared_expert_intermediate_size = 48;
    cr_assert_eq(loom_check_model_config(&c, why, sizeof why), LOOM_OK, "%s", why);
}

Test(backend_check, bad_expert_configs_are_refused) {
    loom_model_config c = good();
    c.arch = LOOM_ARCH_MIXTRAL; /* a mixture-of-experts architecture without experts */
    refused(&c, LOOM_ERR_FORMAT, "0 experts");
    c.num_experts = 8, c.num_experts_used = 9, c.expert_intermediate_size = 32;
    refused(&c, LOOM_ERR_FORMAT, "8 experts, 9 per token");
    c.num_experts_used = 2, c.expert_intermediate_size = 0;
    refused(&c, LOOM_ERR_FORMAT, "expert width 0");
    c.expert_intermediate_size = 32, c.shared_expert_intermediate_size = -1;
    refused(&c, LOOM_ERR_FORMAT, "shared expert width -1");
}

Test(backend_check, each_bad_config_is_refused_by_name) {
    loom_model_config c = good();
    c.arch = (loom_arch)7;
    refused(&c, LOOM_ERR_UNSUPPORTED, "architecture 7");
    c = good(), c.num_kv_heads = 3;
    refused(&c, LOOM_ERR_UNSUPPORTED, "heads 4 a multiple of kv heads 3");
    c = good(), c.vocab_size = 0;
    refused(&c, LOOM_ERR_UNSUPPORTED, "vocab 0");
    c = good(), c.head_dim = 0;
    refused(&c, LOOM_ERR_UNSUPPORTED, "head_dim 0");
    c = good(), c.rope_theta = 0;
    refused(&c, LOOM_ERR_UNSUPPORTED, "rope_theta 0");
    c = good(), c.rms_norm_eps = -1;
    refused(&c, LOOM_ERR_UNSUPPORTED, "rms_norm_eps -1");
    c = good(), c.rope_scaling = LOOM_ROPE_SCALING_LINEAR, c.rope_factor = 0;
    refused(&c, LOOM_ERR_FORMAT, "linear RoPE scaling with factor 0");
    c = good(), c.rope_scaling = LOOM_ROPE_SCALING_LLAMA3, c.rope_factor = 8, c.rope_low_freq_factor = 4,
    c.rope_high_freq_factor = 1, c.rope_original_context = 8192;
    refused(&c, LOOM_ERR_FORMAT, "low/high freq factors 4/1");
    c = good(), c.sliding_window = 512, c.rope_theta_local = 10000; /* no global_every */
    refused(&c, LOOM_ERR_FORMAT, "needs global_every 0 > 0");
    c = good(), c.sliding_window = 512, c.global_every = 6;
    refused(&c, LOOM_ERR_FORMAT, "local RoPE base 0 > 0");
    c = good(), c.ffn_act = (loom_ffn_act)9;
    refused(&c, LOOM_ERR_FORMAT, "ffn activation 9");
    c = good(), c.attn_scale = NAN;
    refused(&c, LOOM_ERR_FORMAT, "attention scale nan");
}

/* load()'s preamble, shared by the cpu and cuda backends: each refusal
 * with its status and a message that says what to do or what was wrong. */
static const loom_tensor *no_tensor(void *ctx, const char *name) {
    (void)ctx, (void)name;
    return NULL;
}

static loom_status comm_noop_sum(void *ctx, int32_t rank, void *buf, int64_t count, loom_dtype dt, void *stream,
                                 loom_error *err) {
    (void)ctx, (void)rank, (void)buf, (void)count, (void)dt, (void)stream, (void)err;
    return LOOM_OK;
}

static loom_status comm_noop_gather(void *ctx, int32_t rank, const void *send, void *recv, int64_t count,
                                    loom_dtype dt, void *stream, loom_error *err) {
    (void)ctx, (void)rank, (void)send, (void)recv, (void)count, (void)dt, (void)stream, (void)err;
    return LOOM_OK;
}

Test(backend_check, load_preamble_refuses_each_bad_call) {
    char why[384] = "";
    loom_model_config c = good();
    loom_model_view m = {.config = &c, .get = no_tensor};
    cr_assert_eq(loom_check_load(false, &m, NULL, why, sizeof why), LOOM_OK, "%s", why);
    cr_assert_eq(loom_check_load(true, &m, NULL, why, sizeof why), LOOM_ERR_INVALID);
    cr_assert(strstr(why, "create a new instance per model"), "%s", why);
    cr_assert_eq(loom_check_load(false, NULL, NULL, why, sizeof why), LOOM_ERR_INVALID);
    loom_model_view nog = {.config = &c};
    cr_assert_eq(loom_check_load(false, &nog, NULL, why, sizeof why), LOOM_ERR_INVALID);
    cr_assert(strstr(why, "model view"), "%s", why);
    loom_comm short_comm = {.struct_size = 8};
    cr_assert_eq(loom_check_load(false, &m, &short_comm, why, sizeof why), LOOM_ERR_ABI);
    cr_assert(strstr(why, "struct_size 8"), "%s", why);
    loom_comm half = {.struct_size = sizeof half, .all_reduce_sum = comm_noop_sum};
    cr_assert_eq(loom_check_load(false, &m, &half, why, sizeof why), LOOM_ERR_ABI, "%s", why);
    loom_comm full = {.struct_size = sizeof full, .all_reduce_sum = comm_noop_sum,
                      .all_gather = comm_noop_gather};
    cr_assert_eq(loom_check_load(false, &m, &full, why, sizeof why), LOOM_OK, "%s", why);
    c.post_norms = true; /* Gemma 3: no tensor parallelism */
    cr_assert_eq(loom_check_load(false, &m, &full, why, sizeof why), LOOM_ERR_UNSUPPORTED);
    cr_assert(strstr(why, "post-norms") && strstr(why, "one rank"), "%s", why);
    cr_assert_eq(loom_check_load(false, &m, NULL, why, sizeof why), LOOM_OK, "%s", why);
    c.post_norms = false;
    c.num_kv_heads = 3; /* the config check runs last */
    cr_assert_eq(loom_check_load(false, &m, NULL, why, sizeof why), LOOM_ERR_UNSUPPORTED);
    cr_assert(strstr(why, "kv heads 3"), "%s", why);
}

/* ------------------------------------------------- host->check_batch */

/* n bytes that end right before an unreadable page: reading past them
 * crashes the test instead of going unnoticed. */
static void *guarded(size_t n) {
    const size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    size_t pages = (n + pg - 1) / pg + 1;
    char *p = mmap(NULL, pages * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(p, MAP_FAILED);
    cr_assert_eq(mprotect(p + (pages - 1) * pg, pg, PROT_NONE), 0);
    return p + (pages - 1) * pg - n;
}

/* Two sequences of two tokens each, blocks of 4 tokens, 8 blocks, each
 * token array exactly num_tokens long (guarded). */
typedef struct cb_batch {
    loom_batch b;
    int32_t qs[3], ctx[2], bt[4], li[2];
    float logits[2];
} cb_batch;

static void cb_make(cb_batch *c) {
    int32_t *ids = guarded(4 * sizeof(int32_t)), *pos = guarded(4 * sizeof(int32_t));
    int64_t *slots = guarded(4 * sizeof(int64_t));
    const int32_t ids0[4] = {5, 6, 7, 8}, pos0[4] = {0, 1, 0, 1};
    const int64_t slots0[4] = {0, 1, 4, 5};
    memcpy(ids, ids0, sizeof ids0), memcpy(pos, pos0, sizeof pos0), memcpy(slots, slots0, sizeof slots0);
    *c = (cb_batch){.qs = {0, 2, 4}, .ctx = {2, 2}, .bt = {0, -1, 1, -1}, .li = {1, 3}};
    c->b = (loom_batch){.struct_size = sizeof c->b, .num_seqs = 2, .num_tokens = 4, .token_ids = ids,
                        .positions = pos, .query_start = c->qs, .context_len = c->ctx, .block_table = c->bt,
                        .block_table_stride = 2, .slot_mapping = slots, .num_logits = 2, .logits_index = c->li};
}

static void cb_refused(const cb_batch *c, int32_t bs, int32_t nblk, const char *needle) {
    char why[384] = "";
    loom_status st = loom_check_batch(&c->b, c->logits, false, bs, nblk, 97, 0, why, sizeof why);
    cr_assert_eq(st, LOOM_ERR_INVALID, "status %d (%s), want INVALID for '%s'", (int)st, why, needle);
    cr_assert(strstr(why, needle), "message '%s' lacks '%s'", why, needle);
}

Test(backend_check, batch_valid_passes) {
    cb_batch c;
    cb_make(&c);
    char why[384] = "";
    cr_assert_eq(loom_check_batch(&c.b, c.logits, false, 4, 8, 97, 0, why, sizeof why), LOOM_OK, "%s", why);
}

/* query_start is checked whole before any token is read: an inner offset
 * past num_tokens must not walk the token arrays (they are guarded). */
Test(backend_check, batch_query_start_checked_before_tokens) {
    cb_batch c;
    cb_make(&c);
    c.qs[1] = 100; /* {0, 100, 4}: decreases at sequence 1, past T at 0 */
    cb_refused(&c, 4, 8, "query_start[1] = 100");
    c.qs[1] = 5; /* {0, 5, 4} */
    cb_refused(&c, 4, 8, "query_start[1] = 5");
    c.qs[1] = -1; /* {0, -1, 4} */
    cb_refused(&c, 4, 8, "query_start[1] = -1");
}

Test(backend_check, batch_bad_pool_shape_refused) {
    cb_batch c;
    cb_make(&c);
    cb_refused(&c, 0, 8, "block_size 0");
    cb_refused(&c, -4, 8, "block_size -4");
    cb_refused(&c, 4, -1, "num_blocks -1");
}

/* Block-table groups (ABI 2.4): one sequence decoding position 11 (12
 * tokens of context, blocks of 4) with a global group 0 and a group 1 of
 * window 5, which reads positions 7..11: its block 0 may be released (-1),
 * block 1 may not; group 0 keeps every block; every group's slot checked. */
Test(backend_check, batch_groups_allow_released_blocks_only_before_the_window) {
    int32_t ids[1] = {5}, pos[1] = {11}, qs[2] = {0, 1}, ctx[1] = {12}, li[1] = {0}, win[2] = {0, 5};
    int32_t bt[2 * 3] = {0, 1, 2, /* group 1 */ -1, 3, 4};
    int64_t slots[2] = {2 * 4 + 3, 4 * 4 + 3};
    float logits[1] = {0};
    loom_batch b = {.struct_size = sizeof b, .num_seqs = 1, .num_tokens = 1, .token_ids = ids, .positions = pos,
                    .query_start = qs, .context_len = ctx, .block_table = bt, .block_table_stride = 3,
                    .slot_mapping = slots, .num_logits = 1, .logits_index = li, .num_groups = 2,
                    .group_window = win};
    char why[384] = "";
    cr_assert_eq(loom_check_batch(&b, logits, false, 4, 8, 97, 0, why, sizeof why), LOOM_OK, "%s", why);
    bt[3] = 3, bt[4] = -1; /* group 1's block 1 holds positions 4..7: 7 is in the window */
    cr_assert_eq(loom_check_batch(&b, logits, false, 4, 8, 97, 0, why, sizeof why), LOOM_ERR_INVALID);
    cr_assert(strstr(why, "block_table[1] of group 1 = -1"), "%s", why);
    bt[3] = -1, bt[4] = 3, bt[0] = -1; /* group 0 has no window */
    cr_assert_eq(loom_check_batch(&b, logits, false, 4, 8, 97, 0, why, sizeof why), LOOM_ERR_INVALID);
    cr_assert(strstr(why, "block_table[0] of group 0 = -1"), "%s", why);
    bt[0] = 0, slots[1] = 8 * 4; /* group 1's slot past the pool */
    cr_assert_eq(loom_check_batch(&b, logits, false, 4, 8, 97, 0, why, sizeof why), LOOM_ERR_INVALID);
    cr_assert(strstr(why, "in group 1 outside"), "%s", why);
    slots[1] = 19, b.group_window = NULL; /* no windows: nothing may be released */
    cr_assert_eq(loom_check_batch(&b, logits, false, 4, 8, 97, 0, why, sizeof why), LOOM_ERR_INVALID);
    b.group_window = win, b.num_groups = LOOM_KV_GROUPS_MAX + 1;
    cr_assert_eq(loom_check_batch(&b, logits, false, 4, 8, 97, 0, why, sizeof why), LOOM_ERR_INVALID);
}

/* ---------------------------------------------- host->logits_topk_row */

/* k <= 0 writes nothing (not even *lse); k > vocab pads the tail with
 * id -1 and -inf. The arrays sit one element into sentinel-filled buffers. */
Test(backend_check, topk_row_k_outside_1_to_vocab) {
    const float row[3] = {0.5f, 2.0f, 1.0f};
    int32_t ids[8];
    float vals[8], lse = 42.0f;
    for (int32_t k = -1; k <= 0; k++) {
        for (int i = 0; i < 8; i++) ids[i] = 77, vals[i] = -1e30f;
        loom_logits_topk_row(row, 3, k, ids + 1, vals + 1, &lse);
        for (int i = 0; i < 8; i++) {
            cr_assert_eq(ids[i], 77, "k %d wrote ids[%d] = %d", k, i - 1, ids[i]);
            cr_assert_eq(vals[i], -1e30f, "k %d wrote vals[%d] = %g", k, i - 1, (double)vals[i]);
        }
        cr_assert_eq(lse, 42.0f, "k %d wrote lse", k);
    }
    for (int i = 0; i < 8; i++) ids[i] = 77, vals[i] = 12345.0f;
    loom_logits_topk_row(row, 3, 5, ids + 1, vals + 1, &lse);
    const int32_t want_ids[5] = {1, 2, 0, -1, -1};
    const float want_vals[5] = {2.0f, 1.0f, 0.5f, -INFINITY, -INFINITY};
    for (int i = 0; i < 5; i++) {
        cr_assert_eq(ids[i + 1], want_ids[i], "ids[%d] = %d, want %d", i, ids[i + 1], want_ids[i]);
        cr_assert_eq(vals[i + 1], want_vals[i], "vals[%d] = %g, want %g", i, (double)vals[i + 1],
                     (double)want_vals[i]);
    }
    cr_assert_eq(ids[0], 77);
    cr_assert_eq(ids[6], 77);
    cr_assert_float_eq(lse, (float)log(exp(0.5) + exp(2.0) + exp(1.0)), 1e-5);
}
