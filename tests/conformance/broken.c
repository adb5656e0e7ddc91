/*
 * tests/conformance/broken.c — deliberately broken plugins, one per
 * -DBROKEN_<WHAT> flag, each a shipped plugin with one contract broken.
 * `loom plugin-test` must refuse every one, with a message naming the
 * rule (tests/conformance/meson.build lists the expected words):
 *
 *   BROKEN_LEAKY       cache "leaky" (paged): free() forgets every third
 *                      sequence's blocks                -> a reference leaked
 *   BROKEN_GREEDY      scheduler "greedy" (continuous): schedules up to
 *                      twice its declared max_batched_tokens
 *   BROKEN_WRONGDIST   sampler "wrongdist" (standard): sample() draws at
 *                      1.5 x the temperature probs() uses
 *   BROKEN_OUTOFRANGE  sampler "outofrange" (standard): every fifth call's
 *                      first token is `vocab`
 *   BROKEN_CRASH       sampler "crash" (standard): a batch of two rows
 *                      dereferences NULL                -> crashed in <check>
 *   BROKEN_HANG        sampler "hang" (standard): a batch of three rows
 *                      never returns                    -> timed out
 *   BROKEN_HOSTLEAK    sampler "hostleak" (standard): create() allocates
 *                      16 bytes destroy() never frees
 *   BROKEN_SLOPPY      quantizer "sloppy" (int8): scales written 1.25x too
 *                      large                            -> beyond half a step
 *   BROKEN_WILD        speculator "wild" (ngram): drafts token `vocab`
 *   BROKEN_LENIENT     constraint "lenient" (grammar): accept() takes a
 *                      token its own mask forbids
 *
 * The shipped plugin's source is included (its entry point renamed where
 * the file has one), so each broken plugin is the real one plus the few
 * lines below, with the real one's parameters.
 */
#include <stdint.h>
#include <string.h>

#define loom_plugin_entry broken_inner_entry
#if defined(BROKEN_LEAKY)
#include "paged.c"
#define BROKEN_PARAMS loom_paged_params
#define BROKEN_CONFIG_SIZE sizeof(loom_paged_config)
#elif defined(BROKEN_GREEDY)
#include "continuous.c"
#define BROKEN_PARAMS cont_params
#define BROKEN_CONFIG_SIZE sizeof(cont_config)
#elif defined(BROKEN_WRONGDIST) || defined(BROKEN_OUTOFRANGE) || defined(BROKEN_CRASH) || defined(BROKEN_HANG) || \
    defined(BROKEN_HOSTLEAK)
#include "standard.c"
#define BROKEN_PARAMS std_params
#define BROKEN_CONFIG_SIZE sizeof(std_config)
#elif defined(BROKEN_SLOPPY)
#include "int8.c"
#define BROKEN_PARAMS int8_params
#define BROKEN_CONFIG_SIZE sizeof(int8_config)
#elif defined(BROKEN_WILD)
#include "ngram.c"
#define BROKEN_PARAMS loom_ngram_params
#define BROKEN_CONFIG_SIZE sizeof(loom_ngram_config)
#elif defined(BROKEN_LENIENT)
#include "grammar.c"
#define BROKEN_PARAMS gr_params
#define BROKEN_CONFIG_SIZE sizeof(gr_config)
#endif
#undef loom_plugin_entry

/* ------------------------------------------------------------------ cache */
#if defined(BROKEN_LEAKY)
#define BROKEN_NAME "leaky"
#define BROKEN_KIND LOOM_KIND_CACHE

static void leaky_free(void *self, loom_seq_id seq) {
    static unsigned calls;
    if (++calls % 3 == 0 && paged_block_table(self, seq, NULL, 0) > 0) return; /* the bug */
    paged_free(self, seq);
}

static const loom_cache_ops broken_ops = {
    .struct_size = sizeof(loom_cache_ops), .create = paged_create, .destroy = paged_destroy, .init = paged_init,
    .acquire_prefix = paged_acquire_prefix, .allocate = paged_allocate, .truncate = paged_truncate,
    .free = leaky_free, .fork = paged_fork, .swap_out = paged_swap_out, .swap_in = paged_swap_in,
    .block_table = paged_block_table, .take_block_ops = paged_take_block_ops,
    .num_free_blocks = paged_num_free_blocks, .stats = paged_stats};

/* -------------------------------------------------------------- scheduler */
#elif defined(BROKEN_GREEDY)
#define BROKEN_NAME "greedy"
#define BROKEN_KIND LOOM_KIND_SCHEDULER

static loom_status greedy_create(const loom_host *host, const void *config, void **self, loom_error *err) {
    cont_config c = *(const cont_config *)config;
    c.max_batched_tokens *= 2; /* the bug: the declared budget is not the one used */
    return cont_create(host, &c, self, err);
}

static const loom_scheduler_ops broken_ops = {
    .struct_size = sizeof(loom_scheduler_ops), .create = greedy_create, .destroy = cont_destroy, .add = cont_add,
    .remove = cont_remove, .schedule = cont_schedule, .stats = cont_stats};

/* --------------------------------------------------------------- samplers */
#elif defined(BROKEN_WRONGDIST) || defined(BROKEN_OUTOFRANGE) || defined(BROKEN_CRASH) || defined(BROKEN_HANG) || \
    defined(BROKEN_HOSTLEAK)
#define BROKEN_KIND LOOM_KIND_SAMPLER

#if defined(BROKEN_WRONGDIST)
#define BROKEN_NAME "wrongdist"
/* Rows are resampled at 1.5 x their temperature; probs() is left alone. */
static loom_status broken_sample(void *self, const loom_sample_batch *b, loom_sample_out *out, loom_error *err) {
    loom_sampling_params p[64];
    loom_sample_row rows[64];
    const loom_sample_row *ptrs[64];
    if (!b || b->n > 64 || b->n < 0) return std_sample(self, b, out, err);
    for (int32_t r = 0; r < b->n; r++) {
        rows[r] = *b->rows[r];
        p[r] = *rows[r].params;
        p[r].temperature *= 1.5f; /* the bug */
        rows[r].params = &p[r];
        ptrs[r] = &rows[r];
    }
    loom_sample_batch c = *b;
    c.rows = ptrs;
    return std_sample(self, &c, out, err);
}
#elif defined(BROKEN_OUTOFRANGE)
#define BROKEN_NAME "outofrange"
static loom_status broken_sample(void *self, const loom_sample_batch *b, loom_sample_out *out, loom_error *err) {
    static unsigned calls;
    loom_status st = std_sample(self, b, out, err);
    if (st == LOOM_OK && b->n > 0 && ++calls % 5 == 0) out->tokens[0] = b->vocab; /* the bug */
    return st;
}
#elif defined(BROKEN_CRASH)
#define BROKEN_NAME "crash"
static loom_status broken_sample(void *self, const loom_sample_batch *b, loom_sample_out *out, loom_error *err) {
    if (b && b->n == 2) {
        volatile int32_t *nowhere = NULL;
        *nowhere = 1; /* the bug */
    }
    return std_sample(self, b, out, err);
}
#elif defined(BROKEN_HANG)
#define BROKEN_NAME "hang"
static loom_status broken_sample(void *self, const loom_sample_batch *b, loom_sample_out *out, loom_error *err) {
    for (volatile int spin = 1; b && b->n == 3 && spin;) { /* the bug: never returns */
    }
    return std_sample(self, b, out, err);
}
#else
#define BROKEN_NAME "hostleak"
static loom_status broken_create(const loom_host *host, const void *config, void **self, loom_error *err) {
    loom_status st = std_create(host, config, self, err);
    if (st == LOOM_OK) (void)host->alloc(host->ctx, 16); /* the bug: never freed */
    return st;
}
#endif

#if !defined(BROKEN_HOSTLEAK)
#define broken_create std_create
#else
#define broken_sample std_sample
#endif

static const loom_sampler_ops broken_ops = {
    .struct_size = sizeof(loom_sampler_ops), .create = broken_create, .destroy = std_destroy,
    .sample = broken_sample, .probs = std_probs, .candidates = std_candidates};

/* -------------------------------------------------------------- quantizer */
#elif defined(BROKEN_SLOPPY)
#define BROKEN_NAME "sloppy"
#define BROKEN_KIND LOOM_KIND_QUANTIZER

static loom_status sloppy_quantize(void *self, const loom_model_view *model, const loom_tensor *w,
                                   const loom_quant_plan *plan, loom_qtensor *out, loom_error *err) {
    loom_status st = int8_quantize(self, model, w, plan, out, err);
    float *s = out->scales.data;
    for (int64_t i = 0; st == LOOM_OK && s && i < out->rows; i++) s[i] *= 1.25f; /* the bug */
    return st;
}

static const loom_quant_ops broken_ops = {
    .struct_size = sizeof(loom_quant_ops), .create = int8_create, .destroy = int8_destroy, .plan = int8_plan,
    .quantize = sloppy_quantize, .release = int8_release, .kv_dtype = int8_kv_dtype};

/* ------------------------------------------------------------- speculator */
#elif defined(BROKEN_WILD)
#define BROKEN_NAME "wild"
#define BROKEN_KIND LOOM_KIND_SPECULATOR

static int32_t wild_vocab;

static loom_status wild_init(void *self, const loom_spec_init *init, loom_error *err) {
    wild_vocab = init ? init->vocab_size : 0;
    return ngram_init(self, init, err);
}

static int32_t wild_propose(void *self, const loom_seq_info *seq, const loom_sampling_params *params, int32_t max_k,
                            int32_t *draft, float *q, int32_t *q_valid) {
    int32_t k = ngram_propose(self, seq, params, max_k, draft, q, q_valid);
    if (k > 0) draft[k - 1] = wild_vocab; /* the bug */
    return k;
}

static const loom_spec_ops broken_ops = {
    .struct_size = sizeof(loom_spec_ops), .create = ngram_create, .destroy = ngram_destroy, .init = wild_init,
    .plan = ngram_plan, .propose = wild_propose, .observe = ngram_observe, .release = ngram_release,
    .stats = ngram_stats};

/* ------------------------------------------------------------- constraint */
#elif defined(BROKEN_LENIENT)
#define BROKEN_NAME "lenient"
#define BROKEN_KIND LOOM_KIND_CONSTRAINT

static loom_status lenient_accept(void *self, void *matcher, int32_t token, loom_error *err) {
    (void)gr_accept(self, matcher, token, err);
    return LOOM_OK; /* the bug: a refused token reported as taken */
}

static const loom_constraint_ops broken_ops = {
    .struct_size = sizeof(loom_constraint_ops), .create = gr_create, .destroy = gr_destroy, .compile = gr_compile,
    .grammar_free = gr_grammar_free, .matcher_new = gr_matcher_new, .matcher_free = gr_matcher_free,
    .fill_mask = gr_fill_mask, .accept = lenient_accept, .can_end = gr_can_end};
#else
#error "build with one of -DBROKEN_LEAKY, -DBROKEN_GREEDY, ... (see the comment at the top)"
#endif

/* ------------------------------------------------------------- descriptor */

static const loom_component broken_components[] = {{
    .struct_size = sizeof(loom_component),
    .kind = BROKEN_KIND,
    .name = BROKEN_NAME,
    .summary = "deliberately broken (tests/conformance/broken.c)",
    .ops = &broken_ops,
    .params = BROKEN_PARAMS,
    .config_size = BROKEN_CONFIG_SIZE,
}};

static const loom_plugin_desc broken_desc = {
    LOOM_PLUGIN_DESC_HEADER,
    .name = "loom-broken-" BROKEN_NAME,
    .version = "0.0.0",
    .num_components = 1,
    .components = broken_components,
};

LOOM_EXPORT const loom_plugin_desc *loom_plugin_entry(void) { return &broken_desc; }
