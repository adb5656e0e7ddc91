/*
 * tests/pp/test_pp_engine.c — the pp executor through the whole engine
 * (suite 'pp'): pipelines under tests/pp/data with an `executor: {plugin:
 * pp}` section over cpu backends joined by the threads links, against the
 * same pipeline without an executor.
 *
 *   tiny dummy Llama with 6 layers (4 heads, 2 KV heads, FFN 128, vocab
 *   256): 1, 2, 3 and 6 stages, even and uneven splits, give teacher-forced
 *   log-probs bit-identical to one backend — a stage runs the very kernels
 *   on the very rows one backend runs, only on another thread, so nothing
 *   may differ; a batched, chunked request set gives identical greedy ids,
 *   and log-probs and sampling distributions bit-identical with one
 *   micro-batch, within 1e-5 with 2..4 (a micro-batch's GEMMs have fewer
 *   rows, and OpenBLAS picks other kernels — another summation order — for
 *   another row count: last-bit differences, observed <= 1e-6), and within
 *   the tp suite's 1e-4 with tp 2 inside the stages (row-parallel sums in
 *   another order); the same for the 6-layer Qwen2-MoE dummy (3 stages
 *   bit-identical; tp 2, expert parallel, inside each stage within 1e-4);
 *   composition: swap preemption, n > 1 forks (copy-on-write) and the
 *   prefix cache, with block ids shared by every stage's own pools;
 *   errors: more stages than layers, a layer list that does not sum to the
 *   model's, or has the wrong count, a tp_size the heads do not divide;
 *   SmolLM2-135M (LOOM_TEST_MODEL; skipped when unset): 3 stages give one
 *   backend's greedy text and bit-identical log-probs (one sequence at a
 *   time, so one micro-batch); three requests at once, cut into 2
 *   micro-batches, the same three texts (log-probs observed identical);
 *   tp 3 x pp 2 (float32 weights) its text and
 *   log-probs within
 *   2.5e-4 (the tp suite's bound for 30 layers of reordered sums).
 *
 * Not a mock: each stage is a real cpu backend holding only its layers and
 * their KV pools, and the residual stream really crosses between threads.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eng_util.h"

#define VOCAB 256
/* micro-batches > 1: other GEMM row counts, other OpenBLAS kernels */
#define MB_TOL 1e-5

/* ------------------------------------------------------------- helpers */

static loom_engine *pp_open(const char *pipe, const char *const *ov) { return eng_open_in("pp", pipe, ov); }

/* A pp configuration as overrides, plus `base`. */
typedef struct pp_ov {
    char pp[40], tp[40], mb[40], layers[80];
    const char *list[16];
} pp_ov;

/* noinline: inlined at a call site, GCC -O3 unrolls the copy loop past
 * base's NULL and warns -Warray-bounds about reads the loop never makes. */
__attribute__((noinline)) static const char *const *
pp_with(pp_ov *o, int pp, int tp, int mb, const char *layers, const char *const *base) {
    int n = 0;
    snprintf(o->pp, sizeof o->pp, "executor.pp_size=%d", pp);
    snprintf(o->tp, sizeof o->tp, "executor.tp_size=%d", tp);
    snprintf(o->mb, sizeof o->mb, "executor.micro_batches=%d", mb);
    snprintf(o->layers, sizeof o->layers, "executor.layers=%s", layers ? layers : "");
    o->list[n++] = o->pp;
    o->list[n++] = o->tp;
    o->list[n++] = o->mb;
    o->list[n++] = o->layers;
    for (int i = 0; base && base[i] && n < 15; i++) o->list[n++] = base[i];
    o->list[n] = NULL;
    return o->list;
}

static void pp_expect_error(const char *const *ov, const char *const *needles) {
    loom_engine *e = NULL;
    loom_error err = {0};
    loom_status st = eng_try_open_in("pp", "tiny_pp.yaml", ov, &e, &err);
    if (e) loom_engine_destroy(e);
    cr_assert_neq(st, LOOM_OK, "engine created with %s, an error was expected", ov[0]);
    for (int i = 0; needles[i]; i++)
        cr_assert(strstr(err.message, needles[i]), "error lacks \"%s\": %s", needles[i], err.message);
}

static double max_diff(const float *a, const float *b, size_t n) {
    double worst = 0;
    for (size_t i = 0; i < n; i++) worst = fmax(worst, fabs((double)a[i] - b[i]));
    return worst;
}

/* --------------------------------------------------- tiny: the splits */

/* Teacher-forced log-probs of 200 tokens (one sequence's prefill: every
 * position's logits) through 1, 2, 3 and 6 stages, even and uneven. */
Test(pp, tiny_score_bit_identical_over_stage_splits) {
    enum { N = 200 };
    int32_t tok[N];
    eng_prompt(tok, N, 5, VOCAB);
    loom_engine *ref = pp_open("tiny.yaml", NULL);
    float *want = eng_score(ref, tok, N);
    loom_engine_destroy(ref);
    static const struct {
        int pp;
        const char *layers;
    } splits[] = {{1, NULL}, {2, NULL}, {3, NULL}, {6, NULL}, {2, "1,5"}, {3, "3,2,1"}, {3, "1,1,4"}};
    for (size_t s = 0; s < sizeof splits / sizeof splits[0]; s++) {
        pp_ov o;
        loom_engine *e = pp_open("tiny_pp.yaml", pp_with(&o, splits[s].pp, 1, 1, splits[s].layers, NULL));
        float *got = eng_score(e, tok, N);
        cr_assert(!memcmp(got, want, sizeof want[0] * N),
                  "pp %d (layers %s): log-probs differ from one backend by up to %g; a stage runs the "
                  "same arithmetic, so they must be bit-identical",
                  splits[s].pp, splits[s].layers ? splits[s].layers : "even", max_diff(got, want, N));
        free(got);
        loom_engine_destroy(e);
    }
    free(want);
}

/* Five requests batched with chunked prefill, split into micro-batches. */
Test(pp, tiny_greedy_identical_with_micro_batches) {
    const char *ov[] = {"scheduler.max_batched_tokens=24", NULL};
    eng_set_rec ref[ENG_SET_N], got[ENG_SET_N];
    eng_set_run("pp", VOCAB, "tiny.yaml", ov, ref, NULL);
    static const struct {
        int pp, tp, mb;
        const char *layers;
    } cfg[] = {{2, 1, 1, NULL}, {2, 1, 2, NULL}, {3, 1, 3, "1,3,2"}, {6, 1, 4, NULL}};
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        pp_ov o;
        loom_engine_stats st;
        eng_set_run("pp", VOCAB, "tiny_pp.yaml", pp_with(&o, cfg[c].pp, cfg[c].tp, cfg[c].mb, cfg[c].layers, ov),
                    got, &st);
        cr_assert_geq(st.max_running, 3, "the batch never ran more than %d sequences together", st.max_running);
        char what[96];
        snprintf(what, sizeof what, "pp %d, micro_batches %d, layers %s", cfg[c].pp, cfg[c].mb,
                 cfg[c].layers ? cfg[c].layers : "even");
        eng_set_same(ref, got, cfg[c].mb == 1 ? 0.0 : MB_TOL, what);
        eng_set_free(got);
    }
    eng_set_free(ref);
}

/* tp 2 inside each of 3 stages (6 ranks), with micro-batches. */
Test(pp, tiny_tp2_x_pp3_matches_one_backend) {
    const char *ov[] = {"scheduler.max_batched_tokens=24", NULL};
    eng_set_rec ref[ENG_SET_N], got[ENG_SET_N];
    eng_set_run("pp", VOCAB, "tiny.yaml", ov, ref, NULL);
    pp_ov o;
    eng_set_run("pp", VOCAB, "tiny_pp.yaml", pp_with(&o, 3, 2, 2, NULL, ov), got, NULL);
    eng_set_same(ref, got, 1e-4, "tp 2 x pp 3, micro_batches 2");
    eng_set_free(got);
    eng_set_free(ref);
}

/* A mixture of experts (the Qwen2-MoE dummy, 6 layers, shared expert):
 * stages bit-identical to one backend, and tp 2 (expert parallel) inside
 * each of 3 stages with micro-batches equal to it. */
Test(pp, moe_stages_and_expert_parallel_match_one_backend) {
    enum { N = 120 };
    const char *ov[] = {"model.shape=qwen2-moe-tiny", "scheduler.max_batched_tokens=24", NULL};
    int32_t tok[N];
    eng_prompt(tok, N, 5, VOCAB);
    loom_engine *ref = pp_open("tiny.yaml", ov);
    float *want = eng_score(ref, tok, N);
    loom_engine_destroy(ref);
    pp_ov o;
    loom_engine *e = pp_open("tiny_pp.yaml", pp_with(&o, 3, 1, 1, NULL, ov));
    float *got = eng_score(e, tok, N);
    loom_engine_destroy(e);
    cr_assert(!memcmp(got, want, sizeof want[0] * N), "MoE pp 3: log-probs differ by up to %g",
              max_diff(got, want, N));
    free(got);
    free(want);
    eng_set_rec rref[ENG_SET_N], rgot[ENG_SET_N];
    eng_set_run("pp", VOCAB, "tiny.yaml", ov, rref, NULL);
    eng_set_run("pp", VOCAB, "tiny_pp.yaml", pp_with(&o, 3, 2, 2, NULL, ov), rgot, NULL);
    eng_set_same(rref, rgot, 1e-4, "MoE tp 2 x pp 3, micro_batches 2");
    eng_set_free(rgot);
    eng_set_free(rref);
}

/* ------------------------------------------------------- composition */

/* Paged cache under pressure with swap preemption (swap_blocks on every
 * stage), then the same prompt twice (prefix cache hit) and n = 2 sampled
 * continuations (fork + copy-on-write: copy_blocks on every stage). */
Test(pp, composes_with_swap_preemption_forks_and_prefix_cache) {
    const char *ov_small[] = {"engine.max_model_len=96", "cache.num_blocks=8", "cache.num_cpu_blocks=64",
                              "scheduler.preemption=swap", NULL};
    const char *ov_big[] = {"engine.max_model_len=96", NULL};
    eng_set_rec ref[ENG_SET_N], got[ENG_SET_N];
    eng_set_run("pp", VOCAB, "tiny.yaml", ov_big, ref, NULL);
    pp_ov o;
    loom_engine_stats st;
    eng_set_run("pp", VOCAB, "tiny_pp.yaml", pp_with(&o, 3, 1, 2, NULL, ov_small), got, &st);
    cr_assert_gt(st.swaps_out, 0, "a pool of 8 blocks with swap should swap out (preemptions %lld)",
                 (long long)st.preemptions);
    cr_assert_eq(st.swaps_in, st.swaps_out);
    cr_assert_eq(st.kv_blocks_used, 0);
    eng_set_same(ref, got, MB_TOL, "swap preemption at pp 3 vs unconstrained one backend");
    eng_set_free(ref);
    eng_set_free(got);

    int32_t p[40];
    eng_prompt(p, 40, 9, VOCAB);
    eng_rec a[2], b[2];
    for (int run = 0; run < 2; run++) {
        eng_rec *r = run == 0 ? a : b;
        loom_engine *e = run == 0 ? pp_open("tiny.yaml", NULL) : pp_open("tiny_pp.yaml", pp_with(&o, 3, 1, 2, NULL, NULL));
        eng_rec_init(&r[0], 1);
        eng_add(e, eng_req_tokens(p, 40, 8), &r[0]);
        eng_run(e, 1000);
        loom_request rq = eng_req_tokens(p, 40, 12);
        rq.n = 2;
        rq.params.temperature = 0.9f;
        rq.params.seed = 1234;
        eng_rec_init(&r[1], 2);
        eng_add(e, rq, &r[1]);
        eng_run(e, 1000);
        eng_rec_check_done(&r[1]);
        loom_engine_get_stats(e, &st, sizeof st);
        cr_assert_gt(st.cached_prompt_tokens, 0, "run %d: the repeated prompt missed the prefix cache", run);
        loom_engine_destroy(e);
    }
    for (int k = 0; k < 2; k++)
        for (int s = 0; s < a[k].n; s++) {
            cr_assert_eq(a[k].s[s].ntok, b[k].s[s].ntok);
            cr_assert(!memcmp(a[k].s[s].tokens, b[k].s[s].tokens, (size_t)a[k].s[s].ntok * sizeof(int32_t)),
                      "request %d sample %d: pp 3 drew other tokens than one backend", k, s);
        }
    for (int k = 0; k < 2; k++) {
        eng_rec_free(&a[k]);
        eng_rec_free(&b[k]);
    }
}

/* ------------------------------------------------------------- errors */

Test(pp, error_more_stages_than_layers) {
    pp_ov o;
    pp_expect_error(pp_with(&o, 7, 1, 1, NULL, NULL),
                    (const char *const[]){"pp_size 7", "6 layers", "pp_size <= 6", NULL});
}

Test(pp, error_layers_do_not_sum) {
    pp_ov o;
    pp_expect_error(pp_with(&o, 2, 1, 1, "2,2", NULL),
                    (const char *const[]){"layers \"2,2\"", "4 layers", "summing to 6", NULL});
}

Test(pp, error_layers_count_not_pp_size) {
    pp_ov o;
    pp_expect_error(pp_with(&o, 3, 1, 1, "3,3", NULL),
                    (const char *const[]){"layers \"3,3\"", "2 stage(s)", "pp_size is 3", NULL});
    pp_expect_error(pp_with(&o, 2, 1, 1, "3,x", NULL), (const char *const[]){"comma-separated", NULL});
    pp_expect_error(pp_with(&o, 2, 1, 1, "6,0", NULL), (const char *const[]){">= 1", NULL});
}

Test(pp, error_tp_size_does_not_split_heads) {
    pp_ov o;
    pp_expect_error(pp_with(&o, 2, 3, 1, NULL, NULL),
                    (const char *const[]){"tp_size 3", "4 heads", NULL});
}

Test(pp, error_pp_size_out_of_range) {
    const char *ov[] = {"executor.pp_size=0", NULL};
    pp_expect_error(ov, (const char *const[]){"executor.pp_size", "out of range", NULL});
}

/* ------------------------------------------------------------ SmolLM2 */

static const char k_smol_text[] =
    "The quick brown fox jumps over the lazy dog. Pipeline parallelism gives each device a "
    "contiguous range of a transformer's layers; the hidden states travel from one stage to "
    "the next, and micro-batches keep every stage busy.";

/* One backend vs `ov` on smol_pp.yaml (eng_smol_compare). */
static void smol_compare(const char *const *ref_ov, const char *const *ov, double tol, const char *what) {
    eng_smol_compare("pp", "smol_pp.yaml", ref_ov, ov, k_smol_text, tol, what);
}

/* 30 layers over 3 stages of 10, GGUF weights as stored: the same
 * arithmetic as one backend, so bit-identical. */
Test(pp, smollm2_pp3_matches_one_backend, .timeout = 240) {
    eng_need_model();
    smol_compare(NULL, NULL, 0.0, "pp 3");
}

/* Three chat requests at once through pp 3 with micro_batches 2 (so a step
 * of three sequences is cut in two) against one backend: the same three
 * texts, generated log-probs within SMOL_MB_TOL. */
/* GGUF weights run on integer q8 kernels, row by row, so the row count
 * should not matter (observed: 0); the bound allows a float path that
 * depends on it, as the tiny model's OpenBLAS GEMMs do (MB_TOL), over 30
 * layers. */
#define SMOL_MB_TOL 1e-4
Test(pp, smollm2_pp3_micro_batches_batched_requests, .timeout = 240) {
    eng_need_model();
    static const char *const prompts[3] = {"Name three colours.", "What is 7 times 8?",
                                           "Write one sentence about the sea."};
    eng_rec rec[2][3];
    for (int run = 0; run < 2; run++) {
        loom_engine *e = pp_open(run == 0 ? "smol.yaml" : "smol_pp.yaml", NULL);
        for (int i = 0; i < 3; i++) {
            loom_request rq = loom_request_default();
            rq.prompt = prompts[i];
            rq.chat = true;
            rq.max_tokens = 24;
            rq.params.logprobs = 2;
            eng_rec_init(&rec[run][i], 1);
            eng_add(e, rq, &rec[run][i]);
        }
        eng_run(e, 1000);
        loom_engine_stats st;
        loom_engine_get_stats(e, &st, sizeof st);
        cr_assert_geq(st.max_running, 3, "run %d: the three requests never ran together", run);
        loom_engine_destroy(e);
    }
    double worst = 0;
    for (int i = 0; i < 3; i++) {
        const eng_sample *a = &rec[0][i].s[0], *b = &rec[1][i].s[0];
        cr_assert(a->text && b->text, "request %d: no text", i);
        cr_assert_str_eq(a->text, b->text, "request %d: pp 3 with micro-batches wrote other text", i);
        worst = fmax(worst, max_diff(a->lps, b->lps, (size_t)a->ntok));
        eng_rec_free(&rec[0][i]);
        eng_rec_free(&rec[1][i]);
    }
    cr_log_info("SmolLM2 pp 3, 2 micro-batches, 3 requests: max |log-prob difference| %.3g", worst);
    cr_assert(worst <= SMOL_MB_TOL, "log-probs differ by up to %g (tolerance %g)", worst, SMOL_MB_TOL);
}

/* 9 heads / 3 KV heads / FFN 1536 over tp 3, 30 layers over pp 2 (uneven:
 * 14 + 16), float32 weights as the tp suite's SmolLM2 test. */
Test(pp, smollm2_tp3_x_pp2_matches_one_backend, .timeout = 240) {
    eng_need_model();
    const char *ref_ov[] = {"backend.weight_dtype=f32", NULL};
    const char *ov[] = {"backend.weight_dtype=f32", "executor.pp_size=2", "executor.tp_size=3",
                        "executor.layers=14,16", NULL};
    smol_compare(ref_ov, ov, 2.5e-4, "tp 3 x pp 2");
}

Test(pp, error_nccl_without_cuda_or_gpus) {
    const char *ov[] = {"executor.comm=nccl", "executor.pp_size=6", "executor.tp_size=4", NULL};
#ifdef PP_TEST_HAVE_NCCL
    /* built with NCCL: this machine has fewer than 24 GPUs (or none) */
    pp_expect_error(ov, (const char *const[]){"GPU", NULL});
#else
    pp_expect_error(ov, (const char *const[]){"comm nccl", "without CUDA and NCCL", "comm: threads", NULL});
#endif
}
