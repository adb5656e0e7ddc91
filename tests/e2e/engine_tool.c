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
 *
 * It refuses to be a benchmark: no timing.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/engine.h"

static int usage(void) {
    fprintf(stderr, "usage: engine_tool score PIPELINE TOKENS.txt [--set k=v]...\n"
                    "       engine_tool greedy PIPELINE MAX_NEW PROMPT [--set k=v]...\n"
                    "       engine_tool greedy-ids PIPELINE MAX_NEW \"ID ID ...\" [--set k=v]...\n"
                    "         (greedy: PROMPT as one chat turn; greedy-ids: prompt token ids, for\n"
                    "          models without a tokenizer such as dummy weights)\n");
    return 2;
}

typedef struct collect {
    int32_t *ids;
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
        if (!c->ids) exit(1);
    }
    c->ids[c->n++] = ev->token;
}

int main(int argc, char **argv) {
    if (argc < 4) return usage();
    const char *mode = argv[1], *pipeline = argv[2];
    int first_opt = !strcmp(mode, "greedy") || !strcmp(mode, "greedy-ids") ? 5 : 4;
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
        free(c.ids);
    } else {
        rc = usage();
    }
out:
    loom_engine_destroy(e);
    return rc;
}
