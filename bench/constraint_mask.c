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
 * ten, a uniformly drawn one (so they drift apart). Runs twice in lockstep,
 * caching by whole parse states only (before cut keys) and with cut keys,
 * the masks compared (exit 1 when they differ). With --docs each sequence
 * instead writes its own document of the people schema's shape (random
 * names, ages, cities, tags; compact or indented), token by token as the
 * tokenizer splits it: sequences at different places, as a model's
 * greedy answers to different prompts are. Prints each one's mask time
 * per step (mean, p50, p90, worst), its cache's hit rate, and the same for
 * the first and second half of the steps.
 *
 * Usage: constraint_mask PIPELINE.yaml [STEPS] [--no-cache]
 *        constraint_mask PIPELINE.yaml --batch SCHEMA.json SEQS STEPS [CACHE] [--docs]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../plugins/constraint/grammar/gram.h"
#include "loom/engine.h"

/* The thread's CPU time: other processes of a shared machine do not count. */
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
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

static int steps_over(const double *t, int n, double limit) {
    int c = 0;
    for (int i = 0; i < n; i++) c += t[i] > limit;
    return c;
}

static double excess(const double *t, int n, double limit) {
    double x = 0;
    for (int i = 0; i < n; i++) x += t[i] > limit ? t[i] - limit : 0;
    return x;
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

/* A step's masks as the engine's mask workers would share them: 15
 * workers and the step's own thread, each taking the next row when free
 * (the simulation assumes a mask takes as long as it did here alone). */
#define MASK_WORKERS 16

static void report_plain(const char *what, double *t, int n) {
    if (n <= 0) return;
    double sum = 0;
    for (int i = 0; i < n; i++) sum += t[i];
    qsort(t, (size_t)n, sizeof *t, cmp_dbl);
    printf("%s: mean %.3f ms, p50 %.3f, p90 %.3f, worst %.3f; steps over 1 ms: %d, their excess over 1 ms %.1f ms "
           "in all\n", what, sum / n * 1e3, t[n / 2] * 1e3, t[n * 9 / 10] * 1e3, t[n - 1] * 1e3,
           steps_over(t, n, 1e-3), excess(t, n, 1e-3) * 1e3);
}

/* --docs: a document of bench/data/people-schema.json's shape for sequence
 * `seq`, as a model might write it: 60 people with names, ages, cities
 * and tags drawn at random, compact or indented (by seq), tokenized by
 * the model's tokenizer. */
static int next_int(uint64_t *r, int k) {
    *r = *r * 6364136223846793005ull + 1442695040888963407ull;
    return (int)((*r >> 33) % (uint64_t)k);
}

static int32_t *people_doc(loom_engine *e, int seq, int32_t *n) {
    static const char *const first[] = {"Ada", "Alan", "Grace", "Linus", "Marie", "Niels", "Emmy", "Kurt", "Rosalind",
                                        "Sofia", "Jean", "Hedy", "Claude", "Barbara", "Tim", "Katherine"};
    static const char *const last[] = {"Lovelace", "Turing", "Hopper", "Curie", "Bohr", "Noether", "Godel", "Franklin",
                                       "Kovalevskaya", "Lamarr", "Shannon", "Liskov", "Lee", "Johnson"};
    static const char *const city[] = {"Paris", "Rome", "Oslo", "Lima"};
    static const char *const tag[] = {"math", "poetry", "physics", "chess", "music", "code", "art", "history",
                                      "biology", "film", "travel", "cooking"};
    uint64_t r = 0x9E3779B97F4A7C15ull * (uint64_t)(seq + 1);
    const bool pretty = seq % 2;
    const char *nl = pretty ? "\n  " : "", *nl2 = pretty ? "\n    " : "", *sep = pretty ? "," : ", ";
    char *doc = malloc(1 << 16);
    size_t at = 0;
    int f, l, age, c;
    at += (size_t)sprintf(doc + at, "[");
    for (int p = 0; p < 60; p++) {
        char name[64];
        f = next_int(&r, 16), l = next_int(&r, 14), age = 18 + next_int(&r, 80), c = next_int(&r, 4);
        snprintf(name, sizeof name, "%s %s", first[f], last[l]);
        name[16] = 0; /* maxLength 16 */
        at += (size_t)sprintf(doc + at, "%s%s{%s\"name\": \"%s\"%s%s\"age\": %d%s%s\"city\": \"%s\"%s%s\"tags\": [",
                              p ? sep : "", nl, nl2, name, sep, nl2, age, sep, nl2, city[c], sep, nl2);
        for (int t = 0, nt = next_int(&r, 4); t < nt; t++)
            at += (size_t)sprintf(doc + at, "%s\"%s\"", t ? ", " : "", tag[next_int(&r, 12)]);
        at += (size_t)sprintf(doc + at, "]%s}", pretty ? "\n  " : "");
    }
    sprintf(doc + at, "%s]", pretty ? "\n" : "");
    int32_t *ids = NULL;
    loom_error err = {0};
    if (loom_engine_tokenize(e, doc, false, &ids, n, &err) != LOOM_OK) *n = 0;
    free(doc);
    return ids;
}

#define MODES 3

/* --batch: SEQS matchers of one schema, every step all their masks, twice
 * in lockstep: with whole parse states as cache keys only (`plain`, the
 * path before cut keys) and with cut keys (`cut`), each with its own cache
 * and matchers, the two masks compared bit for bit. */
static int batch(loom_engine *e, const loom_vocab_view *v, int32_t eog, const char *path, int seqs, int steps, int entries,
                 bool docs) {
    size_t len;
    char *schema = slurp(path, &len), why[512], *gbnf = NULL;
    if (!schema) return fprintf(stderr, "cannot read %s\n", path), 1;
    gram_limits lim = {1 << 20, 1000000, 64, 512, 256, 1000, 20000000};
    gram_compiled c[MODES] = {{.vocab = v, .lim = lim, .plain_keys = true, .ref_walk = true},
                              {.vocab = v, .lim = lim, .ref_walk = true},
                              {.vocab = v, .lim = lim}};
    static const char *const mode[MODES] = {"plain keys, reference walk", "cut keys, reference walk",
                                            "cut keys, dense rows + uniform subtrees (the plugin's)"};
    vtrie *trie;
    if (vtrie_build(v, &trie, why, sizeof why) != LOOM_OK ||
        gram_schema_to_gbnf(schema, len, &lim, &gbnf, why, sizeof why) != LOOM_OK ||
        gram_parse(gbnf, strlen(gbnf), &lim, &c[0].g, why, sizeof why) != LOOM_OK)
        return fprintf(stderr, "%s\n", why), 1;
    for (int k = 1; k < MODES; k++) c[k].g = c[0].g;
    gmatch **m[MODES];
    double *t[MODES], *t1[MODES], *tw[MODES], *load[MODES];
    int64_t h0[MODES] = {0}, m0[MODES] = {0}, h1[MODES] = {0}, m1[MODES] = {0};
    for (int k = 0; k < MODES; k++) {
        c[k].trie = trie;
        c[k].cache = entries > 0 ? mask_cache_new(entries, v->size) : NULL;
        m[k] = calloc((size_t)seqs, sizeof *m[k]);
        t[k] = calloc((size_t)steps, sizeof *t[k]);
        t1[k] = calloc((size_t)steps, sizeof *t1[k]);
        tw[k] = calloc((size_t)steps, sizeof *tw[k]);
        load[k] = calloc(MASK_WORKERS, sizeof *load[k]);
        for (int i = 0; i < seqs; i++)
            if (gmatch_new(&c[k], &m[k][i], why, sizeof why) != LOOM_OK) return fprintf(stderr, "%s\n", why), 1;
    }
    uint64_t *rng = calloc((size_t)seqs, sizeof *rng);
    const size_t words = LOOM_MASK_WORDS(v->size);
    uint32_t *mask = malloc(words * 4), *other = malloc(words * 4), *ref = malloc(words * 4);
    for (int i = 0; i < seqs; i++) rng[i] = 1000003u * (uint64_t)(i + 1);
    int32_t **doc = calloc((size_t)seqs, sizeof *doc), *doc_n = calloc((size_t)seqs, sizeof *doc_n);
    for (int i = 0; docs && i < seqs; i++)
        if (!(doc[i] = people_doc(e, i, &doc_n[i]))) return fprintf(stderr, "cannot tokenize a document\n"), 1;
    long refused = 0;
    int n = 0, live = seqs;
    long differ = 0;
    double accept = 0;
    for (; n < steps && live > 0; n++) {
        for (int k = 0; k < MODES; k++)
            if (n == steps / 2 && c[k].cache) mask_cache_stats(c[k].cache, &h0[k], &m0[k]);
        live = 0;
        for (int k = 0; k < MODES; k++) memset(load[k], 0, MASK_WORKERS * sizeof *load[k]);
        for (int i = 0; i < seqs; i++) {
            if (gmatch_terminated(m[0][i]) || gmatch_can_end(m[0][i])) continue;
            for (int kk = 0; kk < MODES; kk++) { /* the order alternates: the first warms the CPU's caches */
                const int k = n % 2 ? kk : MODES - 1 - kk;
                double t0 = now();
                if (gmatch_fill_mask(m[k][i], k == 2 ? mask : k ? ref : other, why, sizeof why) != LOOM_OK)
                    return fprintf(stderr, "%s\n", why), 1;
                const double dt = now() - t0;
                t[k][n] += dt;
                if (dt > t1[k][n]) t1[k][n] = dt;
                int w = 0; /* the engine's workers claim rows in order: the least loaded takes the next */
                for (int j = 1; j < MASK_WORKERS; j++)
                    if (load[k][j] < load[k][w]) w = j;
                load[k][w] += dt;
                if (load[k][w] > tw[k][n]) tw[k][n] = load[k][w];
            }
            differ += memcmp(mask, other, words * 4) != 0 || memcmp(mask, ref, words * 4) != 0;
            int32_t tok = docs ? (n < doc_n[i] ? doc[i][n] : -1) : pick_token(mask, v->size, eog, &rng[i]);
            if (docs && tok >= 0 && !((mask[tok >> 5] >> (tok & 31)) & 1u)) refused++, tok = -1;
            double t0 = now();
            bool ok = tok >= 0 && gmatch_accept_token(m[2][i], tok);
            accept += now() - t0;
            ok = ok && gmatch_accept_token(m[1][i], tok) && gmatch_accept_token(m[0][i], tok);
            live += ok;
        }
    }
    printf("%d sequences, people-style schema %s, %s, mask cache %d entries; masks differing between the modes: %ld\n",
           seqs, path, docs ? "each writing its own document (--docs)" : "lowest allowed token, 1 in 10 uniform", entries,
           differ);
    if (refused) printf("REFUSED: %ld document tokens not in their mask\n", refused);
    for (int i = 0; i < seqs; i++) free(doc[i]);
    free(doc), free(doc_n);
    for (int k = 0; k < MODES; k++) {
        char what[128];
        if (c[k].cache) mask_cache_stats(c[k].cache, &h1[k], &m1[k]);
        snprintf(what, sizeof what, "%s, first half", mode[k]);
        report(what, t[k], n / 2, h0[k], m0[k]);
        snprintf(what, sizeof what, "%s, second half", mode[k]);
        report(what, t[k] + n / 2, n - n / 2, h1[k] - h0[k], m1[k] - m0[k]);
        snprintf(what, sizeof what, "%s, all", mode[k]);
        report(what, t[k], n, h1[k], m1[k]);
        snprintf(what, sizeof what, "%s, slowest single mask of a step", mode[k]);
        report_plain(what, t1[k], n);
        snprintf(what, sizeof what, "%s, the step on %d workers", mode[k], MASK_WORKERS);
        report_plain(what, tw[k], n);
    }
    printf("accepting the sampled tokens: %.3f ms per step (all sequences)\n", n ? accept / n * 1e3 : 0);
    for (int k = 0; k < MODES; k++) {
        for (int i = 0; i < seqs; i++) gmatch_free(m[k][i]);
        free(m[k]), free(t[k]), free(t1[k]), free(tw[k]), free(load[k]);
        mask_cache_free(c[k].cache);
    }
    free(rng), free(mask), free(other), free(ref), free(schema), free(gbnf);
    gram_free(&c[0].g);
    vtrie_free(trie);
    return differ != 0 || refused != 0;
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
        bool docs = !strcmp(argv[argc - 1], "--docs");
        int rc = batch(e, &v, eog, argv[3], atoi(argv[4]), atoi(argv[5]), argc > 6 + docs ? atoi(argv[6]) : 256, docs);
        loom_engine_destroy(e);
        return rc;
    }
    const char *schema = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":"
                         "\"integer\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}}},"
                         "\"required\":[\"name\",\"age\",\"tags\"],\"additionalProperties\":false}";
    gram_limits lim = {1 << 20, 1000000, 64, 512, 256, 1000, 20000000};
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
