/*
 * embed.c — a program that embeds libloom: build an engine from a pipeline
 * file, submit one request, stream its tokens, print the stats. Built
 * outside loom's tree against the installed library (`pkg-config --cflags
 * --libs loom`).
 *
 * What it demonstrates:
 *   - loom_engine_create() with command-line overrides ("a.b=value"), and
 *     the error it returns naming the file, line and key;
 *   - a request from loom_request_default(), with a text prompt or token
 *     ids, sampling parameters and a token callback;
 *   - the step loop (loom_engine_step until nothing is active), the final
 *     event carrying the finish reason, loom_engine_get_stats().
 *
 *   embed PIPELINE [--prompt TEXT | --tokens 1,2,3] [--max-tokens N]
 *         [--temperature T] [--top-k K] [--seed S] [--set KEY=VALUE]...
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/engine.h"

static void on_token(void *user, const loom_token_event *ev) {
    int *finished = user;
    if (ev->token >= 0) printf("%s", ev->text[0] ? ev->text : "");
    if (ev->token >= 0 && !ev->text[0]) printf("[%d]", ev->token); /* no tokenizer: ids */
    if (ev->finish != LOOM_FINISH_NONE) {
        static const char *const why[] = {"", "eos", "stop", "length", "abort", "error"};
        printf("\n[finish: %s%s%s]\n", why[ev->finish], ev->error ? ": " : "", ev->error ? ev->error : "");
        *finished = ev->finish == LOOM_FINISH_ERROR ? 2 : 1;
    }
    fflush(stdout);
}

/* "1,2,3" -> ids; returns how many (at most cap), -1 on a bad list. */
static int parse_ids(const char *s, int32_t *ids, int cap) {
    int n = 0;
    for (char *end; *s && n < cap; s = *end == ',' ? end + 1 : end) {
        long v = strtol(s, &end, 10);
        if (end == s || v < 0 || v > 0x7fffffff) return -1;
        ids[n++] = (int32_t)v;
    }
    return n;
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        fprintf(stderr, "usage: %s PIPELINE [--prompt TEXT | --tokens 1,2,3] [--max-tokens N] "
                        "[--temperature T] [--top-k K] [--seed S] [--set KEY=VALUE]...\n", argv[0]);
        return 2;
    }
    loom_request req = loom_request_default();
    req.max_tokens = 16;
    const char *sets[32];
    int nsets = 0;
    int32_t ids[256];
    for (int i = 2; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--prompt")) req.prompt = v;
        else if (!strcmp(k, "--tokens") && (req.num_tokens = parse_ids(v, ids, 256)) > 0) req.tokens = ids;
        else if (!strcmp(k, "--max-tokens")) req.max_tokens = atoi(v);
        else if (!strcmp(k, "--temperature")) req.params.temperature = (float)atof(v);
        else if (!strcmp(k, "--top-k")) req.params.top_k = atoi(v);
        else if (!strcmp(k, "--seed")) req.params.seed = strtoull(v, NULL, 10), req.params.has_seed = true;
        else if (!strcmp(k, "--set") && nsets < 32) sets[nsets++] = v;
        else {
            fprintf(stderr, "embed: bad option '%s %s'\n", k, v);
            return 2;
        }
    }
    loom_error err = {0};
    loom_engine *e = NULL;
    if (loom_engine_create(argv[1], sets, nsets, &e, &err) != LOOM_OK) {
        fprintf(stderr, "embed: %s\n", err.message);
        return 1;
    }
    int finished = 0;
    req.on_token = on_token;
    req.user = &finished;
    int32_t active = 0;
    loom_status st = loom_engine_add_request(e, &req, &err) < 0 ? err.code : LOOM_OK;
    while (st == LOOM_OK && (st = loom_engine_step(e, &active, &err)) == LOOM_OK && active > 0) {}
    if (st != LOOM_OK) fprintf(stderr, "embed: %s\n", err.message);
    loom_engine_stats s = {.struct_size = sizeof s};
    loom_engine_get_stats(e, &s, sizeof s);
    printf("steps %lld, prompt tokens %lld, generated %lld\n", (long long)s.steps, (long long)s.prompt_tokens,
           (long long)s.generated_tokens);
    loom_engine_destroy(e);
    return st != LOOM_OK || finished != 1;
}
