/*
 * tests/e2e/engine_tool.c — end-to-end checks of a whole engine against an
 * independent reference, through the public API only. Used on the GPU
 * machine (scripts/gpu/gpu-check.sh) and on the CPU, so both backends answer
 * the same questions:
 *
 *   engine_tool score  PIPELINE TOKENS.txt [--set k=v]...
 *       teacher-forced log p(token_i | tokens_<i) for the whitespace-
 *       separated ids in TOKENS.txt, one per line on stdout (first line 0).
 *   engine_tool greedy PIPELINE MAX_NEW PROMPT [--set k=v]...
 *       greedy token ids of a chat-templated PROMPT, space-separated.
 *   engine_tool greedy-file PIPELINE MAX_NEW PROMPTS.txt [--set k=v]...
 *       one greedy request per line of PROMPTS.txt (token ids), all run
 *       together; per request, in order, one line of MAX_NEW groups
 *       "id logprob runner_up runner_up_logprob".
 *   engine_tool score-file PIPELINE TOKENS.txt [--set k=v]...
 *       score's log-probs of each line's ids, one line each.
 *
 * It refuses to be a benchmark: no timing.
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/engine.h"

static int usage(void) {
    fprintf(stderr, "usage: engine_tool score PIPELINE TOKENS.txt [--set k=v]...\n"
                    "       engine_tool greedy PIPELINE MAX_NEW PROMPT [--set k=v]...\n"
                    "       engine_tool greedy-ids PIPELINE MAX_NEW \"ID ID ...\" [--set k=v]...\n"
                    "       engine_tool greedy-file PIPELINE MAX_NEW PROMPTS.txt [--set k=v]...\n"
                    "       engine_tool score-file PIPELINE TOKENS.txt [--set k=v]...\n"
                    "         (greedy: PROMPT as one chat turn; greedy-ids: prompt token ids, for\n"
                    "          models without a tokenizer such as dummy weights)\n");
    return 2;
}

typedef struct collect {
    int32_t *ids, *alt;
    float *lp, *alt_lp; /* the token's and the runner-up's log-probs */
    int32_t n, cap;
    char err[512];
} collect;

static void on_token(void *user, const loom_token_event *ev) {
    collect *c = user;
    if (ev->finish == LOOM_FINISH_ERROR && ev->error) snprintf(c->err, sizeof c->err, "%s", ev->error);
    if (ev->token < 0) return;
    if (c->n == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 64;
        c->ids = realloc(c->ids, (size_t)c->cap * sizeof(int32_t));
        c->alt = realloc(c->alt, (size_t)c->cap * sizeof(int32_t));
        c->lp = realloc(c->lp, (size_t)c->cap * sizeof(float));
        c->alt_lp = realloc(c->alt_lp, (size_t)c->cap * sizeof(float));
        if (!c->ids || !c->alt || !c->lp || !c->alt_lp) exit(1);
    }
    c->ids[c->n] = ev->token, c->lp[c->n] = ev->logprob;
    c->alt[c->n] = -1, c->alt_lp[c->n] = -INFINITY;
    for (int32_t k = 0; k < ev->num_top; k++) /* the best token that is not this one */
        if (ev->top_ids[k] != ev->token) {
            c->alt[c->n] = ev->top_ids[k], c->alt_lp[c->n] = ev->top_logprobs[k];
            break;
        }
    c->n++;
}

static void collect_free(collect *c) {
    free(c->ids), free(c->alt), free(c->lp), free(c->alt_lp);
}

/* The lines of file `path`, each parsed as whitespace-separated ids:
 * returns the number of non-empty lines (at most max; -1 when unreadable),
 * ids[i] (malloc'd) and n[i] per line. */
static int read_id_lines(const char *path, int32_t **ids, int32_t *n, int max) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char *line = NULL;
    size_t cap = 0;
    int lines = 0;
    while (lines < max && getline(&line, &cap, f) > 0) {
        int32_t *v = NULL, nv = 0, vcap = 0;
        for (char *p = line, *end;; p = end) {
            long x = strtol(p, &end, 10);
            if (end == p) break;
            if (nv == vcap) {
                vcap = vcap ? 2 * vcap : 256;
                if (!(v = realloc(v, (size_t)vcap * sizeof *v))) exit(1);
            }
            v[nv++] = (int32_t)x;
        }
        if (nv == 0) {
            free(v);
            continue;
        }
        ids[lines] = v, n[lines++] = nv;
    }
    free(line);
    fclose(f);
    return lines;
}

#define MAX_LINES 64

int main(int argc, char **argv) {
    if (argc < 4) return usage();
    const char *mode = argv[1], *pipeline = argv[2];
    int first_opt = !strcmp(mode, "greedy") || !strcmp(mode, "greedy-ids") || !strcmp(mode, "greedy-file") ? 5 : 4;
    if (argc < first_opt) return usage();
    const char *sets[64];
    int nsets = 0;
    for (int i = first_opt; i < argc; i++) {
        if (!strcmp(argv[i], "--set") && i + 1 < argc && nsets < 64) sets[nsets++] = argv[++i];
        else return usage();
    }
    loom_error err = {0};
    loom_engine *e = NULL;
    if (loom_engine_create(pipeline, sets, nsets, &e, &err) != LOOM_OK) {
        fprintf(stderr, "engine_tool: %s\n", err.message);
        return 1;
    }
    int rc = 1;
    if (!strcmp(mode, "score")) {
        FILE *f = fopen(argv[3], "r");
        if (!f) {
            fprintf(stderr, "engine_tool: cannot open %s\n", argv[3]);
            goto out;
        }
        int32_t *ids = NULL, n = 0, cap = 0, v;
        while (fscanf(f, "%d", &v) == 1) {
            if (n == cap) {
                cap = cap ? 2 * cap : 256;
                ids = realloc(ids, (size_t)cap * sizeof(int32_t));
                if (!ids) return 1;
            }
            ids[n++] = v;
        }
        fclose(f);
        float *lp = malloc((size_t)(n ? n : 1) * sizeof(float));
        if (lp && loom_engine_score(e, ids, n, lp, &err) == LOOM_OK) {
            for (int32_t i = 0; i < n; i++) printf("%.6f\n", lp[i]);
            rc = 0;
        } else {
            fprintf(stderr, "engine_tool: %s\n", err.message);
        }
        free(lp);
        free(ids);
    } else if (!strcmp(mode, "greedy") || !strcmp(mode, "greedy-ids")) {
        collect c = {0};
        loom_request rq = loom_request_default();
        int32_t ids[4096], nids = 0;
        if (!strcmp(mode, "greedy")) {
            rq.prompt = argv[4];
            rq.chat = true;
        } else {
            for (char *p = argv[4], *end; *p && nids < 4096; p = end) {
                long v = strtol(p, &end, 10);
                if (end == p) break;
                ids[nids++] = (int32_t)v;
            }
            rq.tokens = ids;
            rq.num_tokens = nids;
            rq.ignore_eos = true;
        }
        rq.max_tokens = atoi(argv[3]);
        rq.on_token = on_token;
        rq.user = &c;
        if (loom_engine_add_request(e, &rq, &err) < 0 || loom_engine_run(e, &err) != LOOM_OK) {
            fprintf(stderr, "engine_tool: %s\n", err.message);
        } else if (c.err[0]) {
            fprintf(stderr, "engine_tool: %s\n", c.err);
        } else {
            for (int32_t i = 0; i < c.n; i++) printf("%d%s", c.ids[i], i + 1 < c.n ? " " : "\n");
            rc = 0;
        }
        collect_free(&c);
    } else if (!strcmp(mode, "greedy-file") || !strcmp(mode, "score-file")) {
        const bool greedy = !strcmp(mode, "greedy-file");
        int32_t *ids[MAX_LINES], n[MAX_LINES];
        const int lines = read_id_lines(argv[greedy ? 4 : 3], ids, n, MAX_LINES);
        if (lines <= 0) {
            fprintf(stderr, "engine_tool: %s: %s\n", argv[greedy ? 4 : 3],
                    lines < 0 ? "cannot open it" : "no line of token ids");
            goto out;
        }
        collect c[MAX_LINES] = {0};
        rc = 0;
        if (greedy) { /* every request in one run: they share steps */
            for (int i = 0; i < lines && rc == 0; i++) {
                loom_request rq = loom_request_default();
                rq.tokens = ids[i], rq.num_tokens = n[i], rq.ignore_eos = true;
                rq.max_tokens = atoi(argv[3]);
                rq.params.logprobs = 2;
                rq.on_token = on_token, rq.user = &c[i];
                if (loom_engine_add_request(e, &rq, &err) < 0) rc = 1;
            }
            if (rc == 0 && loom_engine_run(e, &err) != LOOM_OK) rc = 1;
            if (rc) fprintf(stderr, "engine_tool: %s\n", err.message);
            for (int i = 0; i < lines && rc == 0; i++)
                if (c[i].err[0]) fprintf(stderr, "engine_tool: request %d: %s\n", i, c[i].err), rc = 1;
            for (int i = 0; i < lines && rc == 0; i++)
                for (int32_t k = 0; k < c[i].n; k++)
                    printf("%d %.6f %d %.6f%s", c[i].ids[k], c[i].lp[k], c[i].alt[k], c[i].alt_lp[k],
                           k + 1 < c[i].n ? " " : "\n");
        } else {
            for (int i = 0; i < lines && rc == 0; i++) {
                float *lp = malloc((size_t)n[i] * sizeof(float));
                if (!lp || loom_engine_score(e, ids[i], n[i], lp, &err) != LOOM_OK) {
                    fprintf(stderr, "engine_tool: line %d: %s\n", i + 1, lp ? err.message : "out of memory");
                    rc = 1;
                } else {
                    for (int32_t k = 0; k < n[i]; k++) printf("%.6f%s", lp[k], k + 1 < n[i] ? " " : "\n");
                }
                free(lp);
            }
        }
        for (int i = 0; i < lines; i++) free(ids[i]), collect_free(&c[i]);
    } else {
        rc = usage();
    }
out:
    loom_engine_destroy(e);
    return rc;
}
