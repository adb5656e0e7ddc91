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
 * Batch mode (--batch): SEQS requests of one schema decoding together, as
 * a decode step of the engine sees them: every step fills the masks of all
 * SEQS matchers (one thread, one shared mask cache of CACHE entries, the
 * plugin's default 256), then each matcher takes the lowest allowed token
 * (a stand-in for a greedy model: sequences mostly agree) or, one time in
 * ten, a uniformly drawn one (so they drift apart). Prints the batch's mask
 * time per step (mean, p50, p90, worst), the cache's hit rate, and the
 * same for the first and second half of the steps.
 *
 * Usage: constraint_mask PIPELINE.yaml [STEPS] [--no-cache]
 *        constraint_mask PIPELINE.yaml --batch SCHEMA.json SEQS STEPS [CACHE]
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

static int cmp_dbl(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) s = (free(s), NULL);
    if (s) s[*len = (size_t)n] = 0;
    fclose(f);
    return s;
}

/* One step's pick for a matcher: the lowest allowed token, or one time in
 * ten a uniform one; -1 when nothing but the end is allowed. */
static int32_t pick_token(const uint32_t *mask, int32_t vocab, int32_t eog, uint64_t *rng) {
    int32_t allowed = 0, low = -1, pick = -1;
    *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
    bool uniform = (*rng >> 33) % 10 == 0;
    for (int32_t id = 0; id < vocab; id++) {
        if (id == eog || !((mask[id >> 5] >> (id & 31)) & 1u)) continue;
        if (low < 0) low = id;
        if (!uniform) break;
        allowed++;
        *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
        if ((*rng >> 33) % (uint64_t)allowed == 0) pick = id;
    }
    return uniform ? pick : low;
}

static void report(const char *what, double *t, int n, int64_t hits, int64_t misses) {
    if (n <= 0) return;
    double sum = 0;
    for (int i = 0; i < n; i++) sum += t[i];
    qsort(t, (size_t)n, sizeof *t, cmp_dbl);
    printf("%s: %d steps, batch mask time per step mean %.3f ms, p50 %.3f, p90 %.3f, worst %.3f; cache hits %.1f%% "
           "(%lld of %lld)\n", what, n, sum / n * 1e3, t[n / 2] * 1e3, t[n * 9 / 10] * 1e3, t[n - 1] * 1e3,
           hits + misses ? 100.0 * hits / (hits + misses) : 0, (long long)hits, (long long)(hits + misses));
}

/* --batch: SEQS matchers of one schema, every step all their masks. */
static int batch(const loom_vocab_view *v, int32_t eog, const char *path, int seqs, int steps, int entries) {
    size_t len;
    char *schema = slurp(path, &len), why[512], *gbnf = NULL;
    if (!schema) return fprintf(stderr, "cannot read %s\n", path), 1;
    gram_limits lim = {1 << 20, 1000000, 64, 512, 256, 1000};
    gram_compiled c = {.vocab = v, .lim = lim};
    vtrie *trie;
    if (vtrie_build(v, &trie, why, sizeof why) != LOOM_OK ||
        gram_schema_to_gbnf(schema, len, &lim, &gbnf, why, sizeof why) != LOOM_OK ||
        gram_parse(gbnf, strlen(gbnf), &lim, &c.g, why, sizeof why) != LOOM_OK)
        return fprintf(stderr, "%s\n", why), 1;
    c.trie = trie;
    c.cache = entries > 0 ? mask_cache_new(entries, v->size) : NULL;
    gmatch **m = calloc((size_t)seqs, sizeof *m);
    uint64_t *rng = calloc((size_t)seqs, sizeof *rng);
    double *t = calloc((size_t)steps, sizeof *t);
    uint32_t *mask = malloc(LOOM_MASK_WORDS(v->size) * 4);
    for (int i = 0; i < seqs; i++) {
        rng[i] = 1000003u * (uint64_t)(i + 1);
        if (gmatch_new(&c, &m[i], why, sizeof why) != LOOM_OK) return fprintf(stderr, "%s\n", why), 1;
    }
    int n = 0, live = seqs;
    double accept = 0;
    int64_t h0 = 0, m0 = 0, h1 = 0, m1 = 0;
    for (; n < steps && live > 0; n++) {
        if (n == steps / 2 && c.cache) mask_cache_stats(c.cache, &h0, &m0);
        double step = 0;
        live = 0;
        for (int i = 0; i < seqs; i++) {
            if (gmatch_terminated(m[i]) || gmatch_can_end(m[i])) continue;
            double t0 = now();
            if (gmatch_fill_mask(m[i], mask, why, sizeof why) != LOOM_OK) return fprintf(stderr, "%s\n", why), 1;
            step += now() - t0;
            int32_t tok = pick_token(mask, v->size, eog, &rng[i]);
            t0 = now();
            bool ok = tok >= 0 && gmatch_accept_token(m[i], tok);
            accept += now() - t0;
            live += ok;
        }
        t[n] = step;
    }
    if (c.cache) mask_cache_stats(c.cache, &h1, &m1);
    printf("%d sequences, people-style schema %s, mask cache %d entries\n", seqs, path, entries);
    report("first half", t, n / 2, h0, m0);
    report("second half", t + n / 2, n - n / 2, h1 - h0, m1 - m0);
    report("all", t, n, h1, m1);
    printf("accepting the sampled tokens: %.3f ms per step (all sequences)\n", n ? accept / n * 1e3 : 0);
    for (int i = 0; i < seqs; i++) gmatch_free(m[i]);
    free(m), free(rng), free(t), free(mask), free(schema), free(gbnf);
    gram_free(&c.g);
    mask_cache_free(c.cache);
    vtrie_free(trie);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) return fprintf(stderr, "usage: %s PIPELINE.yaml [STEPS]\n", argv[0]), 2;
    int steps = argc > 2 ? atoi(argv[2]) : 200;
    loom_engine *e;
    loom_error err = {0};
    if (loom_engine_create(argv[1], NULL, 0, &e, &err) != LOOM_OK) return fprintf(stderr, "%s\n", err.message), 1;
    int32_t eog = 2; /* SmolLM2's <|im_end|> */
    loom_vocab_view v = {sizeof v, loom_engine_vocab_size(e), e, piece, &eog, 1};
    if (argc > 5 && !strcmp(argv[2], "--batch")) {
        int rc = batch(&v, eog, argv[3], atoi(argv[4]), atoi(argv[5]), argc > 6 ? atoi(argv[6]) : 256);
        loom_engine_destroy(e);
        return rc;
    }
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
