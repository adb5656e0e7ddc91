/*
 * bench/constraint_mask.c — per-step cost of a grammar constraint's token
 * mask on a real vocabulary: the pipeline's tokenizer (from its model) as a
 * vocab view, a JSON schema compiled once (the trie build timed apart),
 * then (1) one document sampled token by token from the masks (mostly
 * long strings: the mask cache's best case) and (2) a realistic document,
 * tokenized as the model would write it, fed through a fresh matcher (a
 * new request: every state new to the cache), timing every fill_mask.
 * Prints the mean and worst mask time per step of each.
 *
 * Usage: constraint_mask PIPELINE.yaml [STEPS] [--no-cache]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../plugins/constraint/grammar/gram.h"
#include "loom/engine.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static const char *piece(const void *ctx, int32_t id, size_t *len) {
    const char *p = loom_engine_token_piece(ctx, id, len);
    if (p && *len >= 2 && p[0] == '<' && p[*len - 1] == '>' && memchr(p, '|', *len)) return NULL; /* control */
    return p;
}

/* A document as SmolLM2 would spell it, through a fresh matcher. */
static void realistic(loom_engine *e, const gram_compiled *shared, uint32_t *mask) {
    gram_compiled fresh = *shared, *c = &fresh; /* a new request's grammar: an empty mask cache */
    if (shared->cache) fresh.cache = mask_cache_new(64, shared->vocab->size);
    const char *doc = "{\"name\": \"Ada Lovelace\", \"age\": 36, \"tags\": [\"mathematics\", \"poetry\", "
                      "\"analytical engine\"]}";
    int32_t *ids = NULL, n = 0;
    loom_error err = {0};
    char why[256];
    gmatch *m;
    if (loom_engine_tokenize(e, doc, false, &ids, &n, &err) != LOOM_OK || gmatch_new(c, &m, why, sizeof why)) return;
    double total = 0, worst = 0;
    int32_t i = 0;
    for (; i < n; i++) {
        double t0 = now();
        gmatch_fill_mask(m, mask, why, sizeof why);
        double dt = now() - t0;
        total += dt;
        if (dt > worst) worst = dt;
        if (!((mask[ids[i] >> 5] >> (ids[i] & 31)) & 1u) || !gmatch_accept_token(m, ids[i])) break;
    }
    printf("realistic document, %d tokens (%s): mean %.2f ms, worst %.2f ms per step\n", n,
           i == n && gmatch_can_end(m) ? "all allowed, complete" : "REFUSED", i ? total / i * 1e3 : 0, worst * 1e3);
    gmatch_free(m);
    mask_cache_free(fresh.cache);
    free(ids);
}

int main(int argc, char **argv) {
    if (argc < 2) return fprintf(stderr, "usage: %s PIPELINE.yaml [STEPS]\n", argv[0]), 2;
    int steps = argc > 2 ? atoi(argv[2]) : 200;
    loom_engine *e;
    loom_error err = {0};
    if (loom_engine_create(argv[1], NULL, 0, &e, &err) != LOOM_OK) return fprintf(stderr, "%s\n", err.message), 1;
    int32_t eog = 2; /* SmolLM2's <|im_end|> */
    loom_vocab_view v = {sizeof v, loom_engine_vocab_size(e), e, piece, &eog, 1};
    const char *schema = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":"
                         "\"integer\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}}},"
                         "\"required\":[\"name\",\"age\",\"tags\"],\"additionalProperties\":false}";
    gram_limits lim = {1 << 20, 1000000, 64, 512, 256, 1000};
    char why[512], *gbnf;
    gram_compiled c = {.vocab = &v, .lim = lim};
    vtrie *trie;
    double t0 = now();
    if (vtrie_build(&v, &trie, why, sizeof why) != LOOM_OK) return fprintf(stderr, "%s\n", why), 1;
    double t_trie = now() - t0;
    if (gram_schema_to_gbnf(schema, strlen(schema), &lim, &gbnf, why, sizeof why) != LOOM_OK ||
        gram_parse(gbnf, strlen(gbnf), &lim, &c.g, why, sizeof why) != LOOM_OK)
        return fprintf(stderr, "%s\n", why), 1;
    c.trie = trie;
    c.cache = argc > 3 && !strcmp(argv[3], "--no-cache") ? NULL : mask_cache_new(64, v.size);
    gmatch *m;
    gmatch_new(&c, &m, why, sizeof why);
    uint32_t *mask = malloc(LOOM_MASK_WORDS(v.size) * 4);
    double total = 0, worst = 0;
    int n = 0;
    uint64_t rng = 42;
    for (; n < steps; n++) {
        t0 = now();
        gmatch_fill_mask(m, mask, why, sizeof why);
        double dt = now() - t0;
        total += dt;
        if (dt > worst) worst = dt;
        int32_t allowed = 0, pick = -1;
        for (int32_t id = 0; id < v.size; id++)
            if ((mask[id >> 5] >> (id & 31)) & 1u) {
                allowed++;
                rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                if ((rng >> 33) % (uint64_t)allowed == 0) pick = id; /* reservoir: uniform over allowed */
            }
        if (pick < 0 || pick == eog || !gmatch_accept_token(m, pick)) break;
    }
    printf("vocab %d, trie built in %.1f ms; %d mask steps: mean %.2f ms, worst %.2f ms per step\n", v.size,
           t_trie * 1e3, n, n ? total / n * 1e3 : 0, worst * 1e3);
    gmatch_free(m);
    realistic(e, &c, mask);
    gram_free(&c.g);
    mask_cache_free(c.cache);
    vtrie_free(trie);
    free(gbnf);
    free(mask);
    loom_engine_destroy(e);
    return 0;
}
