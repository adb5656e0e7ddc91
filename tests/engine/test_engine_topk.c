/*
 * tests/engine/test_engine_topk.c — the engine's candidate path
 * (engine.device_sampling, loom/backend.h forward_topk): the host reference
 * summary of a logits row (loom/logits_topk.h) against a sort, and the same
 * mixed workload with device_sampling on and off giving identical tokens
 * and log-probs within 1e-4 (a backend's log-sum-exp may round differently
 * from the host's: the cpu backend's sums float exps), with the candidate
 * path really taken for exactly the rows it can serve.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "eng_util.h"
#include "plugin/host_rules.h"

#define VOCAB 256

typedef struct {
    float v;
    int32_t id;
} cand;

static int cand_cmp(const void *pa, const void *pb) {
    const cand *a = pa, *b = pb;
    if (a->v != b->v) return a->v > b->v ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

static uint64_t rng = 0x1234567;
static uint32_t next_u32(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

/* Rows with many ties, NaNs, -inf; k from 1 to vocab. */
Test(topk, row_reference_matches_a_sort) {
    const int32_t vocabs[] = {1, 5, 64, 100, 3000};
    for (int vi = 0; vi < 5; vi++) {
        const int32_t V = vocabs[vi];
        float *row = malloc((size_t)V * sizeof *row);
        cand *c = malloc((size_t)V * sizeof *c);
        int32_t ids[64];
        float vals[64], lse;
        for (int trial = 0; trial < 40; trial++) {
            for (int32_t v = 0; v < V; v++) {
                uint32_t u = next_u32();
                row[v] = (float)((int)(u % 41) - 20) * 0.25f; /* coarse: ties */
                if (u % 97 == 0) row[v] = NAN;
                if (u % 89 == 1) row[v] = -INFINITY;
                if (trial == 0) row[v] = -INFINITY; /* nothing finite */
            }
            double mx = -INFINITY, z = 0;
            for (int32_t v = 0; v < V; v++) {
                c[v] = (cand){row[v] == row[v] ? row[v] : -INFINITY, v};
                if (c[v].v > mx) mx = c[v].v;
            }
            qsort(c, (size_t)V, sizeof *c, cand_cmp);
            for (int32_t v = 0; v < V && mx > -INFINITY; v++)
                if (row[v] == row[v]) z += exp(row[v] - mx);
            const double want_lse = mx > -INFINITY ? mx + log(z) : -INFINITY;
            const int32_t ks[] = {1, 2, 7, 64};
            for (int ki = 0; ki < 4; ki++) {
                int32_t k = ks[ki] < V ? ks[ki] : V;
                loom_logits_topk_row(row, V, k, ids, vals, &lse);
                for (int32_t j = 0; j < k; j++) {
                    cr_assert(vals[j] == c[j].v, "V %d k %d trial %d: rank %d value %g, want %g", V, k, trial,
                              j, (double)vals[j], (double)c[j].v);
                    cr_assert_eq(ids[j], c[j].id, "V %d k %d trial %d: rank %d id %d, want %d", V, k, trial, j,
                                 ids[j], c[j].id);
                }
                if (want_lse == -INFINITY) cr_assert(lse == -INFINITY);
                else cr_assert(fabs(lse - want_lse) < 1e-5, "lse %g, want %g", (double)lse, want_lse);
            }
        }
        free(row);
        free(c);
    }
}

/* One engine run of a mixed workload; returns the records. */
#define NREQ 6
static void run_mix(bool device_sampling, eng_rec *rec, loom_engine_stats *stats) {
    const char *ov[] = {device_sampling ? "engine.device_sampling=true" : "engine.device_sampling=false",
                        NULL};
    loom_engine *e = eng_open("tiny.yaml", ov);
    static int32_t p[NREQ][24];
    for (int i = 0; i < NREQ; i++) {
        eng_prompt(p[i], 24, 100 + (uint32_t)i, VOCAB);
        eng_rec_init(&rec[i], i == 4 ? 2 : 1);
        loom_request r = eng_req_tokens(p[i], 24, 20);
        r.params.logprobs = 3;
        r.params.seed = 77 + (uint64_t)i;
        r.params.has_seed = true;
        switch (i) {
        case 0: break;                                                    /* greedy: candidates */
        case 1: r.params.temperature = 0.9f, r.params.top_k = 40; break;  /* candidates */
        case 2: r.params.temperature = 0.7f, r.params.top_p = 0.9f; break; /* whole rows */
        case 3: r.params.repetition_penalty = 1.3f; break;                /* whole rows */
        case 4: r.n = 2, r.params.temperature = 1.0f, r.params.top_k = 8; break; /* first row whole */
        case 5: r.params.temperature = 1.2f, r.params.top_k = 64, r.params.min_p = 0.05f; break;
        }
        eng_add(e, r, &rec[i]);
    }
    eng_run(e, 10000);
    loom_engine_get_stats(e, stats, sizeof *stats);
    loom_engine_destroy(e);
}

Test(topk, device_sampling_changes_nothing_but_the_path) {
    eng_rec on[NREQ], off[NREQ];
    loom_engine_stats son, soff;
    run_mix(true, on, &son);
    run_mix(false, off, &soff);
    cr_assert_eq(soff.device_sampled_rows, 0);
    /* candidate rows: every token of requests 0, 1, 5 and all but the
     * first token of request 4's two samples (both come from the one whole
     * prompt row, sampled before the fork) */
    const int64_t want = 3 * 20 + 2 * 19;
    cr_assert_eq(son.device_sampled_rows, want, "device-sampled rows %lld, want %lld",
                 (long long)son.device_sampled_rows, (long long)want);
    for (int i = 0; i < NREQ; i++) {
        eng_rec_check_done(&on[i]);
        for (int s = 0; s < on[i].n; s++) {
            const eng_sample *a = &on[i].s[s], *b = &off[i].s[s];
            cr_assert_eq(a->ntok, b->ntok);
            for (int32_t t = 0; t < a->ntok; t++) {
                cr_assert_eq(a->tokens[t], b->tokens[t], "request %d sample %d token %d: %d vs %d", i, s, t,
                             a->tokens[t], b->tokens[t]);
                cr_assert(fabsf(a->lps[t] - b->lps[t]) < 1e-4f, "request %d token %d logprob %g vs %g", i, t,
                          (double)a->lps[t], (double)b->lps[t]);
                cr_assert_eq(a->alt[t], b->alt[t], "request %d token %d: best alternative %d vs %d", i, t,
                             a->alt[t], b->alt[t]);
                if (a->alt[t] >= 0)
                    cr_assert(fabsf(a->alt_lp[t] - b->alt_lp[t]) < 1e-4f);
            }
        }
        eng_rec_free(&on[i]);
        eng_rec_free(&off[i]);
    }
}
