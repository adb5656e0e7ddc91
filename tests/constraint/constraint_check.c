/*
 * tests/constraint/constraint_check.c — the C side of the schema reference
 * test (check_schemas.py): reads one JSON request per line on stdin,
 *   {"lang": "json_schema", "text": "...", "seed": N, "samples": K, "docs": ["...", ...]}
 * compiles it with the grammar plugin's code against the synthetic
 * vocabulary (constraint_util.h), and prints one JSON line:
 *   {"ok": true, "samples": ["hex", ...], "unfinished": U, "accepts": [true, ...]}
 * or {"ok": false, "error": "..."}. Samples are drawn token by token from
 * the masks (seeded), every chosen token checked against the mask and fed
 * back through accept(); "accepts" says whether each given document is
 * accepted whole (every byte, then the end). Python judges both with the
 * jsonschema package.
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../plugins/constraint/grammar/gram.h"
#include "../common/rng.h"
#include "constraint_util.h"

#define MAX_TOKENS 3000

static const gram_limits k_lim = {1 << 20, 1000000, 64, 512, 256, 1000, 20000000};

/* A token from the mask: the end when allowed (mostly), else closing
 * characters more often the longer the text grows, else uniform. */
static int32_t pick(const cu_vocab *v, const uint32_t *mask, int32_t step, test_rng *r) {
    int32_t allowed[600], closing[600], n = 0, nc = 0;
    for (int32_t id = 0; id < v->view.size; id++) {
        if (!cu_allowed(mask, id)) continue;
        allowed[n++] = id;
        const char *p = v->pieces[id];
        if (p && v->lens[id] == 1 && strchr("\"]}", p[0])) closing[nc++] = id;
    }
    if (n == 0) return -1;
    if (cu_allowed(mask, v->eog[0]) && rng_unif(r) < 0.7) return v->eog[0];
    double pc = step / 60.0 > 0.9 ? 0.9 : step / 60.0;
    if (nc > 0 && rng_unif(r) < pc) return closing[rng_int(r, nc)];
    return allowed[rng_int(r, n)];
}

/* One sampled document as hex (it may hold NUL bytes), or NULL when unfinished. */
static char *sample_doc(const gram_compiled *c, const cu_vocab *v, test_rng *r, bool *bad) {
    gmatch *m;
    char why[256];
    if (gmatch_new(c, &m, why, sizeof why) != LOOM_OK) return NULL;
    uint32_t mask[LOOM_MASK_WORDS(512)];
    char *text = calloc(MAX_TOKENS * 16 + 1, 1);
    size_t len = 0;
    bool done = false;
    for (int32_t step = 0; step < MAX_TOKENS && !done; step++) {
        if (gmatch_fill_mask(m, mask, why, sizeof why) != LOOM_OK) break;
        int32_t t = pick(v, mask, step, r);
        if (t < 0) {
            *bad = true; /* a dead end: the mask allowed nothing */
            break;
        }
        if (!gmatch_accept_token(m, t)) {
            *bad = true; /* the mask allowed a token accept refused */
            break;
        }
        if (t == v->eog[0]) done = true;
        else {
            memcpy(text + len, v->pieces[t], v->lens[t]);
            len += v->lens[t];
        }
    }
    gmatch_free(m);
    char *hex = done ? malloc(2 * len + 1) : NULL;
    for (size_t i = 0; hex && i < len; i++) sprintf(hex + 2 * i, "%02x", (unsigned char)text[i]);
    if (hex) hex[2 * len] = '\0';
    free(text);
    return hex;
}

static bool accepts(const gram_compiled *c, const char *doc) {
    gmatch *m;
    char why[256];
    if (gmatch_new(c, &m, why, sizeof why) != LOOM_OK) return false;
    bool ok = gmatch_accept_bytes(m, (const uint8_t *)doc, strlen(doc)) && gmatch_can_end(m);
    gmatch_free(m);
    return ok;
}

static cJSON *run_one(const cJSON *req, const cu_vocab *v, vtrie *trie) {
    cJSON *out = cJSON_CreateObject();
    const char *lang = cJSON_GetStringValue(cJSON_GetObjectItem(req, "lang"));
    const char *text = cJSON_GetStringValue(cJSON_GetObjectItem(req, "text"));
    char why[512] = "";
    gram_compiled c = {.trie = trie, .vocab = &v->view, .lim = k_lim, .cache = mask_cache_new(8, v->view.size)};
    loom_status st = gram_compile_lang(lang ? lang : "", text, text ? strlen(text) : 0, &k_lim, &c.g, why, sizeof why);
    if (st != LOOM_OK) {
        cJSON_AddBoolToObject(out, "ok", false);
        cJSON_AddStringToObject(out, "error", why);
        cJSON_AddNumberToObject(out, "status", st);
        mask_cache_free(c.cache);
        return out;
    }
    test_rng r = {.s = (uint64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(req, "seed"))};
    int k = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(req, "samples"));
    cJSON *samples = cJSON_AddArrayToObject(out, "samples");
    int unfinished = 0, bad = 0;
    for (int i = 0; i < k; i++) {
        bool b = false;
        char *d = sample_doc(&c, v, &r, &b);
        bad += b;
        if (d) cJSON_AddItemToArray(samples, cJSON_CreateString(d));
        else unfinished++;
        free(d);
    }
    cJSON *acc = cJSON_AddArrayToObject(out, "accepts");
    const cJSON *d;
    cJSON_ArrayForEach(d, cJSON_GetObjectItem(req, "docs")) cJSON_AddItemToArray(acc, cJSON_CreateBool(accepts(&c, d->valuestring)));
    cJSON_AddBoolToObject(out, "ok", true);
    cJSON_AddNumberToObject(out, "unfinished", unfinished);
    cJSON_AddNumberToObject(out, "bad", bad);
    gram_free(&c.g);
    mask_cache_free(c.cache);
    return out;
}

int main(void) {
    static cu_vocab v;
    cu_vocab_init(&v);
    vtrie *trie;
    char why[256];
    if (vtrie_build(&v.view, &trie, why, sizeof why) != LOOM_OK) {
        fprintf(stderr, "%s\n", why);
        return 1;
    }
    size_t cap = 1 << 20;
    char *line = malloc(cap);
    ssize_t n;
    while ((n = getline(&line, &cap, stdin)) > 0) {
        cJSON *req = cJSON_Parse(line);
        if (!req) {
            fprintf(stderr, "bad request line\n");
            return 1;
        }
        cJSON *out = run_one(req, &v, trie);
        char *s = cJSON_PrintUnformatted(out);
        printf("%s\n", s);
        fflush(stdout);
        free(s);
        cJSON_Delete(out);
        cJSON_Delete(req);
    }
    free(line);
    vtrie_free(trie);
    return 0;
}
